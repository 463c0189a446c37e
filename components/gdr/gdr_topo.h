/*
 * Where a GPU's memory meets the network: the RDMA port closest to each GPU in the PCIe tree
 * hwloc reports, the distance in NCCL's vocabulary (PIX, PXB, PHB, SYS), and the plan that
 * follows for GPU memory (DMA-BUF, nvidia-peermem or staging through host memory), said with
 * its reason. Everything here is known without the CUDA driver.
 */
#ifndef XFER_GDR_TOPO_H
#define XFER_GDR_TOPO_H

#include <xfer/component.h>

/* The PCIe distance between a GPU and a NIC as NCCL names it (PATH_*), in the order a NIC is
 * preferred: nearest first, then one with no PCI path, then one whose place is unknown. */
typedef enum xfer_gdr_path {
    XFER_GDR_PATH_PIX,      /* under one PCIe switch: at most one bridge on each side */
    XFER_GDR_PATH_PXB,      /* through several PCIe switches, not the host bridge */
    XFER_GDR_PATH_PHB,      /* through a host bridge, within one CPU package / NUMA node */
    XFER_GDR_PATH_SYS,      /* across the interconnect between CPU packages / NUMA nodes */
    XFER_GDR_PATH_NONE,     /* the RDMA device has no PCI location (rxe, siw) */
    XFER_GDR_PATH_UNKNOWN,  /* no topology, or a device missing from it */
} xfer_gdr_path_t;

/* "PIX", "PXB", "PHB", "SYS", NULL: the values of XFER_GDR_LEVEL, indexed by the enum. */
extern const char *const xfer_gdr_level_names[] __attribute__((visibility("hidden")));

/* The PCI tree of this host (or of the XML file given), or the reason there is none. */
typedef struct xfer_gdr_topo xfer_gdr_topo_t;

/* What this host's kernel says about registering GPU memory with a NIC, known without the
 * CUDA driver. */
typedef struct xfer_gdr_reg_facts {
    int        peermem;         /* a peer-memory client (nvidia_peermem) is loaded */
    int        open_module;     /* NVIDIA kernel module: 1 open, 0 proprietary, -1 unknown */
    int        driver_major;    /* its major version (550), -1 unknown */
    int        linux_major;     /* the running kernel's version (6, 1); 0 unknown */
    int        linux_minor;
} xfer_gdr_reg_facts_t;

/*
 * Load the PCI tree: from xml_path when given, else the host's own (hwloc honours its
 * HWLOC_XMLFILE). hwloc's CUDA, NVML and OpenCL discovery is kept off, so that loading never
 * initialises a GPU driver. Always returns a handle unless memory runs out; without hwloc or
 * when loading fails the handle carries the reason and every distance is UNKNOWN.
 */
xfer_status_t xfer_gdr_topo_open(const char *xml_path, xfer_gdr_topo_t **topo_p)
    __attribute__((visibility("hidden")));
void xfer_gdr_topo_close(xfer_gdr_topo_t *topo) __attribute__((visibility("hidden")));

/* Where the distances come from ("hwloc 2.9.0, this host's PCI tree"), or why they are
 * unknown ("distance unknown (built without hwloc)"). */
const char *xfer_gdr_topo_source(const xfer_gdr_topo_t *topo)
    __attribute__((visibility("hidden")));

/*
 * The distance between the GPU at PCI address gpu_pci ("0000:3b:00.0") and the RDMA device
 * rdma_dev ("mlx5_0"), with what it means or why it is NONE/UNKNOWN in why.
 */
xfer_gdr_path_t xfer_gdr_topo_path(const xfer_gdr_topo_t *topo, const char *gpu_pci,
                                   const char *rdma_dev, char *why, size_t why_size)
    __attribute__((visibility("hidden")));

/* The NIC chosen for one GPU. */
typedef struct xfer_gdr_choice {
    int             port;                   /* index into attr->devices, -1 when none */
    xfer_gdr_path_t path;
    int             within_level;           /* path <= XFER_GDR_LEVEL */
    char            why[XFER_REASON_MAX];   /* the distance explained, or why there is none */
} xfer_gdr_choice_t;

/*
 * Choose among the active RDMA ports in attr->devices (kind "rdma", named "dev:port", state
 * as ibv_port_state_str() words it: verbs_devices.c describes them so) the one closest to gpu_pci; ties go to the first in device
 * order. level is XFER_GDR_LEVEL (PIX..SYS).
 */
void xfer_gdr_topo_choose(const xfer_gdr_topo_t *topo, const char *gpu_pci,
                          const xfer_component_attr_t *attr, xfer_gdr_path_t level,
                          xfer_gdr_choice_t *choice_p) __attribute__((visibility("hidden")));

/*
 * Add to the GPU device gpu (its "pci" attribute names it, "kernel_driver" the driver bound
 * to it) what xfer_info shows: "nic", the
 * port chosen and its distance, and "gdr_plan", how its memory would reach that port
 * (dmabuf, peermem or staging) and why.
 */
void xfer_gdr_topo_describe_gpu(const xfer_gdr_topo_t *topo, xfer_gdr_path_t level,
                                const xfer_gdr_reg_facts_t *facts,
                                const xfer_component_attr_t *attr, xfer_device_attr_t *gpu)
    __attribute__((visibility("hidden")));

#endif
