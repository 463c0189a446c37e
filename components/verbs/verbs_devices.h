/*
 * Describe the RDMA devices and ports libibverbs reports (shared by the verbs and gdr
 * components, each of which compiles its own copy).
 */
#ifndef XFER_VERBS_DEVICES_H
#define XFER_VERBS_DEVICES_H

#include <xfer/component.h>

/*
 * Append one xfer_device_attr_t per port matching 'filter' ("" = all; "dev" or "dev:port") to
 * attr. Sets *num_found to the number of ports seen (before filtering), *num_active to the
 * matching ports in state ACTIVE, and *best_mbs to the fastest active port's bandwidth.
 */
xfer_status_t xfer_verbs_describe_ports(const char *filter, xfer_component_attr_t *attr,
                                        unsigned *num_found, unsigned *num_active,
                                        double *best_mbs)
    __attribute__((visibility("hidden")));

#ifdef HAVE_HWLOC
#include <hwloc.h>

/*
 * Keep hwloc's discovery components that would load a GPU runtime (CUDA, NVML, OpenCL, ROCm
 * SMI, Level Zero) or open an X display out of topology t, before it is loaded: a query must
 * not initialise CUDA, and the PCI tree alone says where devices are. 0, or -1 when this
 * hwloc (older than 2.1) cannot keep them out.
 */
int xfer_verbs_hwloc_without_gpu_runtimes(hwloc_topology_t t)
    __attribute__((visibility("hidden")));
#endif

#endif
