/*
 * The verbs component: RDMA verbs (InfiniBand, RoCE, Soft-RoCE) through libibverbs. This file
 * holds the descriptor, the parameter table and query(); the data path (adapter, channels,
 * MR cache) arrives with the verbs issue, so no capability bit is claimed yet.
 */
#include "config.h"

#include "verbs_devices.h"

#include <stddef.h>
#include <stdio.h>

typedef struct xfer_verbs_config {
    char    *device;        /* "rxe0" or "rxe0:1"; "" = first active port */
    int64_t gid_index;      /* -1 = pick the RoCE v2 GID of the interface's address */
} xfer_verbs_config_t;

static const xfer_param_desc_t verbs_params[] = {
    {"DEVICE", XFER_PARAM_STRING, "",
     "RDMA device and port to use, as 'dev' or 'dev:port' (e.g. 'rxe0:1'); empty means the "
     "first active port.",
     offsetof(xfer_verbs_config_t, device), 0, 0, NULL},
    {"GID_INDEX", XFER_PARAM_INT, "-1",
     "GID table index for RoCE; -1 picks the RoCE v2 GID of the interface's IP address.",
     offsetof(xfer_verbs_config_t, gid_index), -1, 255, NULL},
    {NULL}
};

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
    if (found == 0) {
        xfer_reason_set(attr->reason, sizeof(attr->reason), "no RDMA devices found");
    } else if (attr->num_devices == 0) {
        xfer_reason_set(attr->reason, sizeof(attr->reason), "no RDMA port matches "
                        "XFER_VERBS_DEVICE=%s (%u ports found)", cfg->device, found);
    } else if (active == 0) {
        xfer_reason_set(attr->reason, sizeof(attr->reason), "no RDMA port is ACTIVE (%s is %s)",
                        attr->devices[0].name, attr->devices[0].attrs[0].value);
    } else {
        attr->available     = 1;
        attr->caps          = 0; /* the data path arrives with the verbs issue */
        attr->latency_us    = 3.0;
        attr->bandwidth_mbs = best_mbs;
    }
    return XFER_OK;
}

XFER_COMPONENT_EXPORT const xfer_component_v1_t xfer_component_v1 = {
    .abi_version = XFER_COMPONENT_ABI_V1,
    .size        = sizeof(xfer_component_v1_t),
    .name        = "verbs",
    .version     = PACKAGE_VERSION,
    .description = "RDMA verbs (InfiniBand, RoCE, Soft-RoCE) through libibverbs",
    .params      = verbs_params,
    .config_size = sizeof(xfer_verbs_config_t),
    .query       = verbs_query,
};
