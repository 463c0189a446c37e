/*
 * The verbs component: RDMA verbs (InfiniBand, RoCE, Soft-RoCE) through libibverbs. This file
 * holds the descriptor, the parameter table, what XFER_VERBS_MR_CACHE allows, and query();
 * verbs.h lists where the rest lives.
 */
#include "config.h"

#include "verbs.h"
#include "verbs_devices.h"
#include "verbs_unmapq.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

static const char *const mtu_values[] = {"auto", "256", "512", "1024", "2048", "4096", NULL};
static const char *const mr_cache_values[] = {"auto", "off", NULL};

#define CFG(_f) offsetof(xfer_verbs_config_t, _f)

static const xfer_param_desc_t verbs_params[] = {
    {"DEVICE", XFER_PARAM_STRING, "",
     "RDMA device and port to use, as 'dev' or 'dev:port' (e.g. 'rxe0:1'); empty means the "
     "first active port.", CFG(device), 0, 0, NULL},
    {"GID_INDEX", XFER_PARAM_INT, "-1",
     "GID table index for RoCE; -1 picks the RoCE v2 GID of the interface's IPv4 address.",
     CFG(gid_index), -1, 255, NULL},
    {"TX_QUEUE_LEN", XFER_PARAM_UINT, "256",
     "Send queue entries per channel.", CFG(tx_queue_len), 16, 16384, NULL},
    {"RX_QUEUE_LEN", XFER_PARAM_UINT, "128",
     "Message slots (posted receives) per channel: the credits a peer starts with.",
     CFG(rx_queue_len), 16, 16384, NULL},
    {"SEG_SIZE", XFER_PARAM_SIZE, "8k",
     "Bytes of one message slot; tag messages up to this (less a 16-byte header) go eagerly, "
     "larger ones by rendezvous (RDMA READ).", CFG(seg_size), 512, 1024 * 1024, NULL},
    {"MAX_INLINE", XFER_PARAM_SIZE, "128",
     "Messages and RDMA writes up to this many bytes are sent inline (the device may lower "
     "it).",
     CFG(max_inline), 0, 1024, NULL},
    {"SIGNAL_INTERVAL", XFER_PARAM_UINT, "32",
     "Ask for a send completion every this many sends (RDMA operations always); at most a "
     "quarter of TX_QUEUE_LEN, to which a larger value is lowered.",
     CFG(signal_interval), 1, 1024, NULL},
    {"CQ_SIZE", XFER_PARAM_UINT, "1024",
     "Initial completion queue entries; it grows as channels are added.",
     CFG(cq_size), 64, 4194304, NULL},
    {"MTU", XFER_PARAM_ENUM, "auto",
     "Path MTU: auto uses the smaller of both ports' active MTUs.", CFG(mtu), 0, 0, mtu_values},
    {"TIMEOUT", XFER_PARAM_TIME, "100ms",
     "Acknowledgement timeout of one RC retry (rounded up to 4.096 us x 2^n).",
     CFG(timeout), 1e-5, 8000.0, NULL},
    {"RETRY_COUNT", XFER_PARAM_UINT, "6",
     "RC retries before a channel fails (dead peer or link). 7 means 'retry forever' to "
     "Soft-RoCE (rdma_rxe), so a dead link would stall instead of failing.",
     CFG(retry_count), 0, 7, NULL},
    {"RNR_RETRY", XFER_PARAM_UINT, "7",
     "Receiver-not-ready retries (7 = without limit).", CFG(rnr_retry), 0, 7, NULL},
    {"MAX_RD_ATOMIC", XFER_PARAM_UINT, "16",
     "RDMA READs in flight per channel (capped by the device).", CFG(max_rd_atomic), 1, 255,
     NULL},
    {"KEEPALIVE", XFER_PARAM_TIME, "1s",
     "Probe a channel idle this long; a dead peer is found within this plus TIMEOUT x "
     "(RETRY_COUNT + 1). 0 turns probes off.", CFG(keepalive), 0, 3600.0, NULL},
    {"MAX_MSG_SIZE", XFER_PARAM_SIZE, "2g",
     "Largest tag message, put, get or tensor.", CFG(max_msg_size), 1,
     1024.0 * 1024.0 * 1024.0 * 1024.0, NULL},
    {"RDMA_CHUNK", XFER_PARAM_SIZE, "1g",
     "Bytes of one RDMA WRITE or READ work request: longer puts, gets, rendezvous reads and "
     "tensor writes are split into chunks of this size (lowered to the port's largest "
     "message). The endpoint address tells the peer, which checks a tensor's last chunk by "
     "it.", CFG(rdma_chunk), 4096, 2048.0 * 1024.0 * 1024.0, NULL},
    {"MAX_UNEXPECTED", XFER_PARAM_SIZE, "64m",
     "Bytes of unexpected messages kept before senders are slowed (credits held back), "
     "each message or rendezvous announcement counting its bookkeeping too.",
     CFG(max_unexpected), 0, 1024.0 * 1024.0 * 1024.0 * 64.0, NULL},
    {"MAX_UNEXPECTED_EP", XFER_PARAM_SIZE, "16m",
     "The same bound for one peer's messages, so that a peer that floods messages nobody "
     "receives is slowed alone.",
     CFG(max_unexpected_ep), 0, 1024.0 * 1024.0 * 1024.0 * 64.0, NULL},
    {"MR_CACHE", XFER_PARAM_ENUM, "auto",
     "Registrations of buffers the user did not register (tag messages, published tensors, "
     "fetch destinations given without xfer_mem_register): auto keeps them for reuse while "
     "libucm (UCX) reports every unmapping in the process, so that memory mapped again at an "
     "old address never meets an old registration; where it cannot (UCX_MEM_EVENTS=no, hooks "
     "libucm cannot install, a memory checker's malloc), and with off, each such buffer is "
     "registered for its operation and deregistered at its completion, which costs an "
     "ibv_reg_mr and an ibv_dereg_mr per operation. xfer_info shows the outcome as each "
     "port's mr_cache.",
     CFG(mr_cache), 0, 0, mr_cache_values},
    {"MR_CACHE_MAX_ENTRIES", XFER_PARAM_UINT, "1024",
     "Registrations of unregistered user buffers kept for reuse; 0 turns the cache off.",
     CFG(mrc_max_entries), 0, 1048576, NULL},
    {"MR_CACHE_MAX_BYTES", XFER_PARAM_SIZE, "4g",
     "Bytes of such registrations kept (least recently used unused ones go first).",
     CFG(mrc_max_bytes), 0, 1024.0 * 1024.0 * 1024.0 * 1024.0, NULL},
    {"TENSOR_META_CACHE", XFER_PARAM_UINT, "4096",
     "Tensor metadata kept per channel, by key: a fetch whose tensor is as last time takes "
     "one message and one write; 0 turns the cache off (every fetch asks first).",
     CFG(meta_cache), 0, 1048576, NULL},
    {NULL}
};

int xfer_verbs_mr_cache_allowed(const xfer_verbs_config_t *cfg, char *why, size_t why_size)
{
    if (cfg->mr_cache == XFER_VERBS_MR_CACHE_OFF) {
        xfer_reason_set(why, why_size, "XFER_VERBS_MR_CACHE=off");
        return 0;
    }
    if (cfg->mrc_max_entries == 0) {
        xfer_reason_set(why, why_size, "XFER_VERBS_MR_CACHE_MAX_ENTRIES=0");
        return 0;
    }
    return xfer_verbs_unmapq_complete(why, why_size);
}

/* What an iface opened now would do with unregistered buffers: subscribes to libucm's unmap
 * reports for a moment to find out. */
static void mr_cache_describe(const xfer_verbs_config_t *cfg, char *text, size_t size)
{
    char why[XFER_REASON_MAX];
    xfer_verbs_unmapq_t *q;

    if (xfer_verbs_mr_cache_allowed(cfg, why, sizeof(why)) &&
        (xfer_verbs_unmapq_create(&q, why, sizeof(why)) == XFER_OK)) {
        xfer_verbs_unmapq_destroy(q);
        snprintf(text, size, "on: libucm reports unmapped memory");
    } else {
        xfer_reason_set(text, size, "off (registered per operation): %s", why);
    }
}

/* Put key = value among dev's attributes before its GIDs, which may fill the table (the last
 * GID then makes room). */
static void attr_insert_before_gids(xfer_device_attr_t *dev, const char *key,
                                    const char *value)
{
    uint32_t at = 0;

    while ((at < dev->num_attrs) && (strncmp(dev->attrs[at].key, "gid[", 4) != 0)) {
        at++;
    }
    if (at >= XFER_DEVICE_ATTR_MAX) {
        return;
    }
    if (dev->num_attrs == XFER_DEVICE_ATTR_MAX) {
        dev->num_attrs--;
    }
    memmove(&dev->attrs[at + 1], &dev->attrs[at], (dev->num_attrs - at) * sizeof(dev->attrs[0]));
    snprintf(dev->attrs[at].key, sizeof(dev->attrs[at].key), "%s", key);
    snprintf(dev->attrs[at].value, sizeof(dev->attrs[at].value), "%s", value);
    dev->num_attrs++;
}

static xfer_status_t verbs_query(const void *config, xfer_component_attr_t *attr)
{
    const xfer_verbs_config_t *cfg = config;
    unsigned found, active;
    double best_mbs;
    xfer_status_t status;

    status = xfer_verbs_describe_ports(cfg->device, attr, &found, &active, &best_mbs);
    if (status != XFER_OK) {
        return status;
    }
    if (attr->num_devices > 0) {
        char text[sizeof(attr->devices[0].attrs[0].value)];

        mr_cache_describe(cfg, text, sizeof(text));
        for (uint32_t d = 0; d < attr->num_devices; d++) {
            attr_insert_before_gids(&attr->devices[d], "mr_cache", text);
        }
    }
    if (found == 0) {
        xfer_reason_set(attr->reason, sizeof(attr->reason), "no RDMA devices found");
    } else if (attr->num_devices == 0) {
        xfer_reason_set(attr->reason, sizeof(attr->reason), "no RDMA port matches "
                        "XFER_VERBS_DEVICE=%s (%u ports found)", cfg->device, found);
    } else if (active == 0) {
        xfer_reason_set(attr->reason, sizeof(attr->reason), "no RDMA port is ACTIVE (%s is %s)",
                        attr->devices[0].name, attr->devices[0].attrs[0].value);
    } else {
        attr->available             = 1;
        attr->caps                  = XFER_CAP_PUT | XFER_CAP_GET | XFER_CAP_TAG |
                                      XFER_CAP_TENSOR | XFER_CAP_MEM_HOST |
                                      XFER_CAP_INTER_HOST;
        attr->limits.max_msg_size   = cfg->max_msg_size;
        attr->limits.max_eager_size = cfg->seg_size - XFER_VERBS_WIRE_TAG_HDR_LEN;
        attr->latency_us            = 3.0;
        attr->bandwidth_mbs         = best_mbs;
    }
    return XFER_OK;
}

XFER_COMPONENT_EXPORT const xfer_component_v1_t xfer_component_v1 = {
    .abi_version   = XFER_COMPONENT_ABI_V1,
    .size          = sizeof(xfer_component_v1_t),
    .name          = "verbs",
    .version       = PACKAGE_VERSION,
    .description   = "RDMA verbs (InfiniBand, RoCE, Soft-RoCE) through libibverbs",
    .params        = verbs_params,
    .config_size   = sizeof(xfer_verbs_config_t),
    .query         = verbs_query,
    .iface_open    = xfer_verbs_iface_open,
    .iface_close   = xfer_verbs_iface_close,
    .iface_address = xfer_verbs_iface_address,
    .ep_create     = xfer_verbs_ep_create,
    .ep_address    = xfer_verbs_ep_address,
    .ep_connect    = xfer_verbs_ep_connect,
    .ep_destroy    = xfer_verbs_ep_destroy,
    .mem_reg       = xfer_verbs_mem_reg,
    .mem_dereg     = xfer_verbs_mem_dereg,
    .rkey_pack     = xfer_verbs_rkey_pack,
    .rkey_unpack   = xfer_verbs_rkey_unpack,
    .rkey_release  = xfer_verbs_rkey_release,
    .put           = xfer_verbs_put,
    .get           = xfer_verbs_get,
    .tag_send      = xfer_verbs_tag_send,
    .tag_recv      = xfer_verbs_tag_recv,
    .tensor_fetch  = xfer_verbs_tensor_fetch,
    .cancel        = xfer_verbs_cancel,
    .progress      = xfer_verbs_iface_progress,
    .event_fd      = xfer_verbs_iface_event_fd,
    .event_arm     = xfer_verbs_iface_event_arm,
    .ep_flush      = xfer_verbs_ep_flush,
};

XFER_COMPONENT_EXPORT const xfer_component_stats_v1_t xfer_component_stats_v1 = {
    .size        = sizeof(xfer_component_stats_v1_t),
    .ep_counters = xfer_verbs_ep_counters,
};
