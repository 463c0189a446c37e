/*
 * Describe the RDMA devices and ports libibverbs reports (shared by the verbs and gdr
 * components, each of which compiles its own copy).
 */
#ifndef XFER_VERBS_DEVICES_H
#define XFER_VERBS_DEVICES_H

#include <xfer/component.h>
#include <xfer/topo.h>

/*
 * Append one xfer_device_attr_t per port matching 'filter' ("" = all; "dev" or "dev:port") to
 * attr, each with the NUMA node topo places it on (NULL: the host's tree is read for this
 * call, once there are devices to describe). Sets *num_found to the number of ports seen
 * (before filtering), *num_active to the matching ports in state ACTIVE, and *best_mbs to the
 * fastest active port's bandwidth.
 */
xfer_status_t xfer_verbs_describe_ports(const char *filter, const xfer_topo_t *topo,
                                        xfer_component_attr_t *attr, unsigned *num_found,
                                        unsigned *num_active, double *best_mbs)
    __attribute__((visibility("hidden")));

/* Whether port of device dev is one that filter (XFER_VERBS_DEVICE: "" = all, "dev" or
 * "dev:port") allows. */
int xfer_verbs_port_matches(const char *filter, const char *dev, unsigned port)
    __attribute__((visibility("hidden")));

#endif
