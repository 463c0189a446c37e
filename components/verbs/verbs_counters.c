/*
 * A channel's counters by name, as xfer_endpoint_counters, xfer_perf -v and XFER_STATS=1
 * list them: the messages sent and received per type ("tx_TAG", "rx_FIN", ...), then the
 * other counters of xfer_verbs_ch_stats_t.
 */
#include "verbs.h"

#include <stddef.h>

#define STAT(_name, _field) XFER_COUNTER_FIELD(xfer_verbs_ch_stats_t, _name, _field)

/* The counters besides the per-type message counts, in the order they are listed. */
static const xfer_counter_field_t scalar_counters[] = {
    STAT("tx_tensor_writes", tx_writes),          STAT("tx_tensor_write_bytes", tx_write_bytes),
    STAT("rx_tensor_writes", rx_writes),          STAT("rx_tensor_write_bytes", rx_write_bytes),
    STAT("re_requests", rerequests),              STAT("meta_cache_hits", meta_hits),
    STAT("meta_cache_misses", meta_misses),       STAT("mr_cache_hits", mrc_hits),
    STAT("mr_cache_misses", mrc_misses),          STAT("mr_cache_evictions", mrc_evictions),
    STAT("bounced", bounced),                     STAT("credit_stalls", credit_stalls),
    STAT("rejected", rejected),
};

void xfer_verbs_ep_counters(xfer_ep_h ch, xfer_counter_t *c, size_t *count_p)
{
    const xfer_verbs_ch_stats_t *st = &ch->stats;
    size_t max = *count_p;
    size_t n   = 0;

    for (unsigned t = 1; t < XFER_VERBS_MSG_LAST; t++) {
        xfer_counter_put(c, max, &n, "tx_", xfer_verbs_msg_name(t), st->tx_msgs[t]);
    }
    for (unsigned t = 1; t < XFER_VERBS_MSG_LAST; t++) {
        xfer_counter_put(c, max, &n, "rx_", xfer_verbs_msg_name(t), st->rx_msgs[t]);
    }
    xfer_counter_put_table(c, max, &n, st, scalar_counters,
                           sizeof(scalar_counters) / sizeof(scalar_counters[0]));
    *count_p = n;
}
