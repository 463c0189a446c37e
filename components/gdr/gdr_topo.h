/*
 * Where a GPU's memory meets the network: the RDMA port closest to each GPU (the distances
 * come from the framework's topology, xfer/topo.h), and the plan that follows for GPU memory
 * (DMA-BUF, nvidia-peermem or staging through host memory), said with its reason. Everything
 * here is known without the CUDA driver.
 */
#ifndef XFER_GDR_TOPO_H
#define XFER_GDR_TOPO_H

#include <xfer/component.h>
#include <xfer/topo.h>

/* What this host's kernel says about registering GPU memory with a NIC, known without the
 * CUDA driver. */
typedef struct xfer_gdr_reg_facts {
    int        peermem;         /* a peer-memory client (nvidia_peermem) is loaded */
    int        open_module;     /* NVIDIA kernel module: 1 open, 0 proprietary, -1 unknown */
    int        driver_major;    /* its major version (550), -1 unknown */
    int        linux_major;     /* the running kernel's version (6, 1); 0 unknown */
    int        linux_minor;
} xfer_gdr_reg_facts_t;

/* The NIC chosen for one GPU. */
typedef struct xfer_gdr_choice {
    int              port;                  /* index into attr->devices, -1 when none */
    xfer_topo_path_t path;
    int              within_level;          /* path <= XFER_GDR_LEVEL */
    char             why[XFER_REASON_MAX];  /* the distance explained, or why there is none */
} xfer_gdr_choice_t;

/*
 * Choose among the active RDMA ports in attr->devices (kind "rdma", named "dev:port", state
 * as ibv_port_state_str() words it: verbs_devices.c describes them so) the one closest to
 * gpu_pci; ties go to the first in device order. level is XFER_GDR_LEVEL (PIX..SYS).
 */
void xfer_gdr_topo_choose(const xfer_topo_t *topo, const char *gpu_pci,
                          const xfer_component_attr_t *attr, xfer_topo_path_t level,
                          xfer_gdr_choice_t *choice_p) __attribute__((visibility("hidden")));

/*
 * Add to the GPU device gpu (its "pci" attribute names it, "kernel_driver" the driver bound
 * to it) what xfer_info shows: "nic", the port chosen and its distance, and "gdr_plan", how
 * its memory would reach that port (dmabuf, peermem or staging) and why.
 */
void xfer_gdr_topo_describe_gpu(const xfer_topo_t *topo, xfer_topo_path_t level,
                                const xfer_gdr_reg_facts_t *facts,
                                const xfer_component_attr_t *attr, xfer_device_attr_t *gpu)
    __attribute__((visibility("hidden")));

#endif
