/*
 * Counters: an endpoint's, as its transport keeps them (xfer_endpoint_counters, and printed
 * when it goes with XFER_STATS=y), and the process's counts of what peers caused
 * (xfer_context_counters, kept by log.c's xfer_log_peer).
 */
#include "xfer_int.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#define COUNTERS_SUBSYS "endpoint"

#define EP_COUNTERS_MAX 128

/* XFER_STATS=y: the endpoint's counters, one line each, before it goes. */
void xfer_endpoint_stats_print(xfer_endpoint_t *ep)
{
    const xfer_component_stats_v1_t *st = ep->fw_iface->entry->stats;
    xfer_counter_t c[EP_COUNTERS_MAX];
    size_t n = EP_COUNTERS_MAX;

    if (!ep->ctx->fw_config.stats || (st == NULL)) {
        return;
    }
    st->ep_counters(ep->ep, c, &n);
    if (n > EP_COUNTERS_MAX) {
        n = EP_COUNTERS_MAX;
    }
    fprintf(stderr, "[xfer stats] endpoint to %s (%s), %zu counters:\n", ep->peer,
            ep->transport, n);
    for (size_t i = 0; i < n; i++) {
        fprintf(stderr, "[xfer stats]   %-28s %" PRIu64 "\n", c[i].name, c[i].value);
    }
}

xfer_status_t xfer_endpoint_counters(xfer_endpoint_t *ep, xfer_counter_t *counters,
                                     size_t *count_p)
{
    const xfer_component_stats_v1_t *st;

    if ((ep == NULL) || (count_p == NULL) || ((counters == NULL) && (*count_p > 0))) {
        xfer_refuse(COUNTERS_SUBSYS, "xfer_endpoint_counters: %s is NULL",
                    (ep == NULL) ? "the endpoint" : (count_p == NULL) ? "count_p" : "counters");
        return XFER_ERR_INVALID_PARAM;
    }
    if (*count_p > 0) {
        /* whole entries, name tails included: callers copy them around as they are */
        memset(counters, 0, *count_p * sizeof(*counters));
    }
    xfer_ctx_lock(ep->ctx);
    st = ep->fw_iface->entry->stats;
    if (st == NULL) {
        *count_p = 0;
    } else {
        st->ep_counters(ep->ep, counters, count_p);
    }
    xfer_ctx_unlock(ep->ctx);
    return XFER_OK;
}

xfer_status_t xfer_context_counters(xfer_context_t *ctx, xfer_counter_t *counters,
                                    size_t *count_p)
{
    if ((ctx == NULL) || (count_p == NULL) || ((counters == NULL) && (*count_p > 0))) {
        xfer_refuse(COUNTERS_SUBSYS, "xfer_context_counters: %s is NULL",
                    (ctx == NULL) ? "the context" : (count_p == NULL) ? "count_p" : "counters");
        return XFER_ERR_INVALID_PARAM;
    }
    if (*count_p > 0) {
        memset(counters, 0, *count_p * sizeof(*counters));
    }
    *count_p = xfer_log_peer_counters(counters, *count_p);
    return XFER_OK;
}

void xfer_counter_put(xfer_counter_t *counters, size_t max, size_t *n, const char *prefix,
                      const char *name, uint64_t value)
{
    if (*n < max) {
        snprintf(counters[*n].name, sizeof(counters[*n].name), "%s%s", prefix, name);
        counters[*n].value = value;
    }
    (*n)++;
}

void xfer_counter_put_table(xfer_counter_t *counters, size_t max, size_t *n, const void *base,
                            const xfer_counter_field_t *table, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        uint64_t value;

        memcpy(&value, (const char*)base + table[i].offset, sizeof(value));
        xfer_counter_put(counters, max, n, "", table[i].name, value);
    }
}
