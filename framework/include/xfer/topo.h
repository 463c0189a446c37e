/*
 * Where devices sit in this host (framework/topo.c): hwloc's tree of I/O objects, read once
 * per query, the way UCX's ucs/sys/topo serves its transports. A transport asks it for the
 * NUMA node of an RDMA device (verbs describes its ports with it) and for the PCIe distance
 * between a GPU and an RDMA device (gdr chooses a NIC per GPU with it), classified as NCCL
 * does. hwloc's CUDA, NVML, OpenCL, ROCm SMI, Level Zero and GL discovery is kept off, so
 * that reading the tree never initialises a GPU runtime: every context queries every
 * component, and an initialised CUDA driver makes fork() unsafe.
 */
#ifndef XFER_TOPO_H
#define XFER_TOPO_H

#include <xfer/xfer.h>

#include <stddef.h>

/* The PCIe distance between a GPU and a NIC as NCCL names it (PATH_*), in the order a NIC is
 * preferred: nearest first, then one with no PCI path, then one whose place is unknown. */
typedef enum xfer_topo_path {
    XFER_TOPO_PIX,      /* under one PCIe switch: at most one bridge on each side */
    XFER_TOPO_PXB,      /* through several PCIe switches, not the host bridge */
    XFER_TOPO_PHB,      /* through a host bridge, within one CPU package / NUMA node */
    XFER_TOPO_SYS,      /* across the interconnect between CPU packages / NUMA nodes */
    XFER_TOPO_NONE,     /* the RDMA device has no PCI location (rxe, siw) */
    XFER_TOPO_UNKNOWN,  /* no topology, or a device missing from it */
} xfer_topo_path_t;

/* "PIX", "PXB", "PHB", "SYS", NULL: indexed by the first four of the enum. */
XFER_API extern const char *const xfer_topo_path_names[];

/* The tree of this host (or of an XML file), or the reason there is none. */
typedef struct xfer_topo xfer_topo_t;

/*
 * Load the tree: from xml_path when given, else the host's own (hwloc honours its
 * HWLOC_XMLFILE). Returns a handle unless memory runs out (XFER_ERR_NO_MEMORY); without
 * hwloc, with an hwloc older than 2.1 on a real host (it could initialise CUDA), or when
 * loading fails the handle carries the reason and every answer is "unknown".
 */
XFER_API xfer_status_t xfer_topo_open(const char *xml_path, xfer_topo_t **topo_p);
XFER_API void xfer_topo_close(xfer_topo_t *topo);

/* Where the tree comes from ("hwloc 2.9.0, this host's PCI tree"), or why there is none
 * ("distance unknown (built without hwloc)"). */
XFER_API const char *xfer_topo_source(const xfer_topo_t *topo);

/* The NUMA node nearest the RDMA device named rdma_dev ("mlx5_0"); -1 when the tree does not
 * place it (a software device such as rxe has no PCI location) or there is no tree. */
XFER_API int xfer_topo_rdma_numa(const xfer_topo_t *topo, const char *rdma_dev);

/* The distance between the GPU at PCI address gpu_pci ("0000:3b:00.0") and the RDMA device
 * rdma_dev, with what it means, or why it is NONE or UNKNOWN, in why. */
XFER_API xfer_topo_path_t xfer_topo_path(const xfer_topo_t *topo, const char *gpu_pci,
                                         const char *rdma_dev, char *why, size_t why_size);

#endif
