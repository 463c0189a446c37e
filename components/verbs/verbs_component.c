/*
 * The verbs component: RDMA verbs (InfiniBand, RoCE, Soft-RoCE) through libibverbs. This file
 * holds the descriptor and query(); the parameters are in verbs_params.h, and verbs.h lists
 * where the rest lives.
 */
#include "config.h"

#include "verbs.h"
#include "verbs_devices.h"
#include "verbs_params.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

static const xfer_param_desc_t verbs_params[] = {
    XFER_VERBS_PARAM_ENTRIES
    {NULL}
};

/* What an iface opened now would do with unregistered buffers: subscribes to libucm's unmap
 * reports for a moment to find out. */
static void mr_cache_describe(const xfer_verbs_config_t *cfg, char *text, size_t size)
{
    char why[XFER_REASON_MAX];
    xfer_unmapq_t *q;

    if (xfer_verbs_mr_cache_allowed(cfg, why, sizeof(why)) &&
        (xfer_unmapq_create(&q, why, sizeof(why)) == XFER_OK)) {
        xfer_unmapq_destroy(q);
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

    status = xfer_verbs_describe_ports(cfg->device, NULL, attr, &found, &active, &best_mbs);
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
    XFER_COMPONENT_V1_HEAD("verbs",
                           "RDMA verbs (InfiniBand, RoCE, Soft-RoCE) through libibverbs",
                           verbs_params, xfer_verbs_config_t),
    .query         = verbs_query,
    .iface_open    = xfer_verbs_iface_open,
    .iface_close   = xfer_verbs_iface_close,
    .mem_dereg     = xfer_verbs_mem_dereg,
    .batch         = xfer_verbs_batch,
    XFER_VERBS_COMPONENT_OPS,
};

XFER_VERBS_STATS_EXPORT;
