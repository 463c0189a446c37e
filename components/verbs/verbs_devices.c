/*
 * RDMA device and port description for query(): state, MTU, link layer, GIDs (with their
 * RoCE type) and the NUMA node the host's topology (xfer/topo.h) places the device on.
 */
#include "config.h"

#include "verbs_devices.h"

#include <xfer/topo.h>

#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>

/* Per-lane signalling rates in Gb/s (ibv_port_attr.active_speed), and widths in lanes. */
static double port_gbps(const struct ibv_port_attr *pa)
{
    double lane;
    int lanes;

    switch (pa->active_speed) {
    case 1:   lane = 2.5;   break;  /* SDR */
    case 2:   lane = 5.0;   break;  /* DDR */
    case 4:   lane = 10.0;  break;  /* QDR */
    case 8:   lane = 10.3;  break;  /* FDR10 */
    case 16:  lane = 14.0;  break;  /* FDR */
    case 32:  lane = 25.0;  break;  /* EDR */
    case 64:  lane = 50.0;  break;  /* HDR */
    case 128: lane = 100.0; break;  /* NDR */
    default:  lane = 2.5;   break;
    }
    switch (pa->active_width) {
    case 1:  lanes = 1;  break;
    case 2:  lanes = 4;  break;
    case 4:  lanes = 8;  break;
    case 8:  lanes = 12; break;
    case 16: lanes = 2;  break;
    default: lanes = 1;  break;
    }
    return lane * lanes;
}

int xfer_verbs_port_matches(const char *filter, const char *dev, unsigned port)
{
    char full[80];

    if ((filter == NULL) || (*filter == '\0')) {
        return 1;
    }
    snprintf(full, sizeof(full), "%s:%u", dev, port);
    return (strcmp(filter, dev) == 0) || (strcmp(filter, full) == 0);
}

static void add_gids(xfer_device_attr_t *dev, struct ibv_context *ctx, unsigned port,
                     int gid_tbl_len)
{
    static const char *const types[] = {"IB", "RoCEv1", "RoCEv2"};

    for (int i = 0; i < gid_tbl_len; i++) {
        struct ibv_gid_entry entry;
        char key[24], text[INET6_ADDRSTRLEN];
        static const uint8_t zero[16];

        if ((ibv_query_gid_ex(ctx, port, (uint32_t)i, &entry, 0) != 0) ||
            (memcmp(entry.gid.raw, zero, sizeof(zero)) == 0)) {
            continue;
        }
        inet_ntop(AF_INET6, entry.gid.raw, text, sizeof(text));
        snprintf(key, sizeof(key), "gid[%d]", i);
        xfer_device_attr_add(dev, key, "%s %s", text,
                             (entry.gid_type < 3) ? types[entry.gid_type] : "?");
    }
}

xfer_status_t xfer_verbs_describe_ports(const char *filter, const xfer_topo_t *topo,
                                        xfer_component_attr_t *attr, unsigned *num_found,
                                        unsigned *num_active, double *best_mbs)
{
    struct ibv_device **list;
    xfer_topo_t *own = NULL;
    int num_devs = 0;

    *num_found  = 0;
    *num_active = 0;
    *best_mbs   = 0;
    list        = ibv_get_device_list(&num_devs);
    if ((list == NULL) || (num_devs == 0)) {
        if (list != NULL) {
            ibv_free_device_list(list);
        }
        return XFER_OK;
    }

    /* the NUMA node of each device; none when the tree cannot be read */
    if ((topo == NULL) && (xfer_topo_open(NULL, &own) == XFER_OK)) {
        topo = own;
    }
    for (int d = 0; d < num_devs; d++) {
        const char *name = ibv_get_device_name(list[d]);
        struct ibv_device_attr dattr;
        struct ibv_context *ctx;
        int numa = xfer_topo_rdma_numa(topo, name);

        ctx = ibv_open_device(list[d]);
        if (ctx == NULL) {
            xfer_log(XFER_LOG_WARN, "verbs", "cannot open %s: %m", name);
            continue;
        }
        if (ibv_query_device(ctx, &dattr) != 0) {
            xfer_log(XFER_LOG_WARN, "verbs", "ibv_query_device(%s) failed: %m", name);
            ibv_close_device(ctx);
            continue;
        }
        for (unsigned p = 1; p <= dattr.phys_port_cnt; p++) {
            struct ibv_port_attr pa;
            xfer_device_attr_t *dev;

            if (ibv_query_port(ctx, (uint8_t)p, &pa) != 0) {
                continue;
            }
            (*num_found)++;
            if (!xfer_verbs_port_matches(filter, name, p) ||
                (attr->num_devices >= XFER_DEVICE_MAX)) {
                continue;
            }
            dev = &attr->devices[attr->num_devices++];
            memset(dev, 0, sizeof(*dev));
            snprintf(dev->name, sizeof(dev->name), "%s:%u", name, p);
            snprintf(dev->kind, sizeof(dev->kind), "rdma");
            dev->numa_node = numa;
            xfer_device_attr_add(dev, "state", "%s", ibv_port_state_str(pa.state));
            xfer_device_attr_add(dev, "link_layer", "%s",
                                 (pa.link_layer == IBV_LINK_LAYER_ETHERNET) ? "Ethernet" :
                                 (pa.link_layer == IBV_LINK_LAYER_INFINIBAND) ? "InfiniBand" :
                                 "unspecified");
            xfer_device_attr_add(dev, "active_mtu", "%d", 128 << pa.active_mtu);
            xfer_device_attr_add(dev, "max_mtu", "%d", 128 << pa.max_mtu);
            xfer_device_attr_add(dev, "speed", "%.1f Gb/s", port_gbps(&pa));
            if (pa.link_layer != IBV_LINK_LAYER_ETHERNET) {
                xfer_device_attr_add(dev, "lid", "%u", pa.lid);
            }
            xfer_device_attr_add(dev, "max_qp", "%d", dattr.max_qp);
            xfer_device_attr_add(dev, "max_mr_size", "%llu",
                                 (unsigned long long)dattr.max_mr_size);
            add_gids(dev, ctx, p, pa.gid_tbl_len);
            if (pa.state == IBV_PORT_ACTIVE) {
                double mbs = port_gbps(&pa) * 1000.0 / 8.0;
                (*num_active)++;
                if (mbs > *best_mbs) {
                    *best_mbs = mbs;
                }
            }
        }
        ibv_close_device(ctx);
    }

    xfer_topo_close(own);
    ibv_free_device_list(list);
    return XFER_OK;
}
