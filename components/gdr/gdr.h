/*
 * The gdr component's internals. gdr is the verbs transport (components/verbs, linked in as one
 * library, not copied) with its own descriptor, parameters and query, and with a strategy for
 * GPU memory that the verbs code reaches through iface->devmem (verbs.h):
 *   gdr_component.c  descriptor, parameters, query()
 *   gdr_iface.c      iface open/close around the verbs adapter; registration of host memory
 *                    as verbs does and of CUDA memory by gdr_mem.c; the devmem hooks
 *   gdr_mem.c        registering CUDA memory with the NIC: DMA-BUF, else nvidia-peermem,
 *                    else not at all (the framework then stages it), saying why
 *   gdr_flush.c      the flush: a 1-byte RDMA READ on a loopback QP after the NIC wrote into
 *                    GPU memory, before the operation completes
 */
#ifndef XFER_GDR_H
#define XFER_GDR_H

#include "../verbs/verbs.h"

#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdint.h>

#define XFER_GDR_SUBSYS   "gdr"
#define XFER_GDR_MAX_GPUS 64

enum {
    XFER_GDR_FLUSH_AUTO,    /* unless the GPU orders GPUDirect RDMA writes for its own use */
    XFER_GDR_FLUSH_ON,
    XFER_GDR_FLUSH_OFF,
};

typedef struct xfer_gdr_config {
    xfer_verbs_config_t verbs;      /* first: the verbs code takes the struct as its own */
    int                 flush;      /* FLUSH: XFER_GDR_FLUSH_* */
    int                 dmabuf;     /* DMABUF: 0 = do not try DMA-BUF */
    int                 peermem;    /* PEERMEM: 0 = do not try nvidia-peermem */
    int                 level;      /* LEVEL: farthest xfer_topo_path_t for GPUDirect RDMA */
} xfer_gdr_config_t;

/* ---- gdr_mem.c ------------------------------------------------------------------------------ */

/* What one GPU allows, found on its first registration (needs the initialised driver). */
typedef struct xfer_gdr_gpu {
    int  known;
    int  dmabuf;                /* exports DMA-BUF: 1, or 0 with dmabuf_why */
    char dmabuf_why[128];
    int  flush;                 /* data the NIC wrote needs the flush before use */
    char flush_why[128];
    int  too_far;               /* the NIC is beyond XFER_GDR_LEVEL from it: 1 with far_why */
    char far_why[192];
} xfer_gdr_gpu_t;

/* The registration strategy on one protection domain. */
typedef struct xfer_gdr_mem {
    struct ibv_pd  *pd;
    char           dev_name[64];
    int            flush_mode;      /* XFER_GDR_FLUSH_* */
    int            level;           /* XFER_GDR_LEVEL: farthest xfer_topo_path_t registered */
    int            nic_dmabuf;      /* the RDMA device accepts DMA-BUF fds: 1, or 0: nic_why */
    char           nic_why[128];
    int            peermem;         /* a peer-memory client for NVIDIA GPUs is loaded: 1, or 0 */
    char           peermem_why[128];
    xfer_gdr_gpu_t gpus[XFER_GDR_MAX_GPUS];
} xfer_gdr_mem_t;

/* What gdr keeps of a registration of CUDA memory (memh->devmem). */
typedef struct xfer_gdr_memh {
    int        device;          /* CUDA device ordinal */
    void       *cuda_context;   /* the allocation's CUcontext; NULL: the primary one */
    uint64_t   buffer_id;       /* the allocation's identity when it was registered */
    const char *how;            /* "dma-buf" or "peermem" */
    int        flush;           /* the flush runs after the NIC wrote into it */
} xfer_gdr_memh_t;

/* A peer-memory client for NVIDIA GPUs is loaded (what ibv_reg_mr on device memory needs):
 * 1, or 0 with why filled. */
int xfer_gdr_peermem_loaded(char *why, size_t why_size);

/* Probe pd's device for DMA-BUF (ibv_reg_dmabuf_mr with no fd) and the peer-memory client;
 * config choices (cfg may be NULL: everything allowed, flush auto) rule strategies out. */
void xfer_gdr_mem_init(xfer_gdr_mem_t *gm, struct ibv_pd *pd, const char *dev_name,
                       const xfer_gdr_config_t *cfg);

/* Register CUDA memory (params->attr->type == XFER_MEM_CUDA): DMA-BUF, else peermem. On
 * success *mr_p and *info_p; XFER_ERR_UNSUPPORTED with why saying what each way lacked when
 * neither works (the framework stages the memory instead). */
xfer_status_t xfer_gdr_mem_reg(xfer_gdr_mem_t *gm, const xfer_mem_reg_params_t *params,
                               struct ibv_mr **mr_p, xfer_gdr_memh_t *info_p, char *why,
                               size_t why_size);

/* ---- gdr_iface.c ---------------------------------------------------------------------------- */

xfer_status_t xfer_gdr_iface_open(const void *config, const xfer_iface_params_t *params,
                                  xfer_iface_h *iface_p);
void xfer_gdr_iface_close(xfer_iface_h iface);
xfer_status_t xfer_gdr_mem_reg_params(xfer_iface_h iface, const xfer_mem_reg_params_t *params,
                                      xfer_memh_h *memh_p);
void xfer_gdr_mem_dereg(xfer_iface_h iface, xfer_memh_h memh);

/* ---- gdr_flush.c ---------------------------------------------------------------------------- */

typedef struct xfer_gdr_flush xfer_gdr_flush_t;

typedef struct xfer_gdr_flush_params {
    struct ibv_context         *ctx;
    struct ibv_pd              *pd;
    uint8_t                    port;
    int                        gid_index;   /* RoCE: the GID the QP talks to itself by */
    const struct ibv_port_attr *port_attr;
    double                     timeout;     /* longest one flush may take, seconds */
} xfer_gdr_flush_params_t;

/* A loopback RC QP (connected to itself) with a CQ of its own and an 8-byte landing word. */
xfer_status_t xfer_gdr_flush_create(const xfer_gdr_flush_params_t *params,
                                    xfer_gdr_flush_t **flush_p, char *why, size_t why_size);
void xfer_gdr_flush_destroy(xfer_gdr_flush_t *flush);
/* Read 1 byte at addr (rkey) through the loopback QP and wait for it: the read completes only
 * after the NIC's earlier writes to that memory did (PCIe ordering), so the GPU sees them.
 * XFER_ERR_IO with why filled when it fails or takes longer than the timeout; the QP is then
 * unusable and every later flush fails with the first reason. */
xfer_status_t xfer_gdr_flush_run(xfer_gdr_flush_t *flush, uint64_t addr, uint32_t rkey,
                                 char *why, size_t why_size);
/* Flushes run so far. */
uint64_t xfer_gdr_flush_count(const xfer_gdr_flush_t *flush);

#endif
