/*
 * Registering CUDA memory with the NIC, in the order NCCL and UCX try:
 *
 *   1. DMA-BUF: the GPU exports the range as a dma-buf fd (cuMemGetHandleForAddressRange) and
 *      the RDMA device registers the fd (ibv_reg_dmabuf_mr). Needs a driver of CUDA 11.7 or
 *      later, a GPU that reports CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, and a kernel and
 *      provider that accept dma-buf fds (probed once per device as NCCL does: a registration
 *      with fd -1 fails with EOPNOTSUPP or EPROTONOSUPPORT when they do not, EBADF when they
 *      do). The fd is needed only during the registration. The exported range is page aligned;
 *      the registration starts at the buffer (offset = addr - aligned start, iova = addr), as
 *      UCX registers it.
 *   2. nvidia-peermem: ibv_reg_mr on the device pointer, which the kernel's peer-memory client
 *      resolves to GPU pages. Needs the module loaded.
 *   3. Neither: the component does not take the registration (XFER_ERR_UNSUPPORTED), with one
 *      line saying what each way lacked, and the framework stages the memory through host
 *      buffers, as it does on transports that cannot touch device memory.
 *
 * What a GPU allows is asked once, on its first registration: by then the framework has
 * initialised the driver (query() never does).
 */
#include "gdr.h"
#include "gdr_topo.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Driver constants used here (the driver table's types are plain C). */
#define CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING 118
#define CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED               124
#define CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER            100
#define CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD                 1

#define GDR_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

int xfer_gdr_peermem_loaded(char *why, size_t why_size)
{
    /* NCCL's and UCX's list: the upstream module, then the legacy nv_peer_mem */
    static const char *const paths[] = {
        "/sys/module/nvidia_peermem/version", "/sys/kernel/mm/memory_peers/nv_mem/version",
        "/sys/kernel/mm/memory_peers/nv_mem_nc/version", "/sys/module/nv_peer_mem/version",
    };

    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
        if (access(paths[i], F_OK) == 0) {
            return 1;
        }
    }
    xfer_reason_set(why, why_size, "nvidia_peermem is not loaded (no %s)", paths[0]);
    return 0;
}

/* NCCL's probe: with fd -1, a kernel and provider that take dma-buf fds fail with EBADF. */
static int nic_accepts_dmabuf(struct ibv_pd *pd, const char *dev_name, char *why,
                              size_t why_size)
{
    struct ibv_mr *mr;
    int err;

    errno = 0;
    mr    = ibv_reg_dmabuf_mr(pd, 0, 0, 0, -1, 0);
    err   = errno;
    if (mr != NULL) {
        ibv_dereg_mr(mr);
        return 1;
    }
    if ((err == EOPNOTSUPP) || (err == EPROTONOSUPPORT)) {
        xfer_reason_set(why, why_size, "%s does not accept DMA-BUF (ibv_reg_dmabuf_mr: %s)",
                        dev_name, strerror(err));
        return 0;
    }
    return 1;
}

void xfer_gdr_mem_init(xfer_gdr_mem_t *gm, struct ibv_pd *pd, const char *dev_name,
                       const xfer_gdr_config_t *cfg)
{
    memset(gm, 0, sizeof(*gm));
    gm->pd         = pd;
    gm->flush_mode = (cfg != NULL) ? cfg->flush : XFER_GDR_FLUSH_AUTO;
    gm->level      = (cfg != NULL) ? cfg->level : XFER_TOPO_PXB;
    snprintf(gm->dev_name, sizeof(gm->dev_name), "%s", dev_name);
    if ((cfg != NULL) && !cfg->dmabuf) {
        xfer_reason_set(gm->nic_why, sizeof(gm->nic_why), "XFER_GDR_DMABUF=n");
    } else {
        gm->nic_dmabuf = nic_accepts_dmabuf(pd, dev_name, gm->nic_why, sizeof(gm->nic_why));
    }
    if ((cfg != NULL) && !cfg->peermem) {
        xfer_reason_set(gm->peermem_why, sizeof(gm->peermem_why), "XFER_GDR_PEERMEM=n");
    } else {
        gm->peermem = xfer_gdr_peermem_loaded(gm->peermem_why, sizeof(gm->peermem_why));
    }
}

static int sysfs_has_rdma_device(const char *dev_name)
{
    char path[256];

    snprintf(path, sizeof(path), "/sys/class/infiniband/%s", dev_name);
    return access(path, F_OK) == 0;
}

/* How far the NIC is from GPU ordinal in the PCIe tree (gdr_topo.c): beyond XFER_GDR_LEVEL, or
 * with no PCI path at all (a software RDMA device), its memory is not registered with the NIC
 * but staged, as NCCL does beyond NCCL_NET_GDR_LEVEL. An unknown distance (no topology) does
 * not stop it: the registration then says whether the NIC reaches the GPU. */
static void gpu_distance(xfer_gdr_mem_t *gm, const xfer_cuda_driver_t *drv, int dev,
                         int ordinal, xfer_gdr_gpu_t *gpu)
{
    unsigned domain, bus, slot, func;
    char bus_id[32], pci[32], why[160] = "";
    xfer_topo_t *topo;
    xfer_topo_path_t path;

    if ((drv->device_get_pci_bus_id(bus_id, sizeof(bus_id), dev) != 0) ||
        (sscanf(bus_id, "%x:%x:%x.%x", &domain, &bus, &slot, &func) != 4) ||
        (xfer_topo_open(NULL, &topo) != XFER_OK)) {
        return;
    }
    snprintf(pci, sizeof(pci), "%04x:%02x:%02x.%x", domain, bus, slot, func);
    path = xfer_topo_path(topo, pci, gm->dev_name, why, sizeof(why));
    xfer_topo_close(topo);
    if ((path == XFER_TOPO_NONE) && sysfs_has_rdma_device(gm->dev_name)) {
        /* a software device the kernel lists (rxe, siw): no DMA to a GPU at all */
        gpu->too_far = 1;
        xfer_reason_set(gpu->far_why, sizeof(gpu->far_why), "%s has no PCI path to GPU %d "
                        "(%s): %s", gm->dev_name, ordinal, pci, why);
    } else if ((path <= XFER_TOPO_SYS) && ((int)path > gm->level)) {
        gpu->too_far = 1;
        xfer_reason_set(gpu->far_why, sizeof(gpu->far_why), "%s is %s from GPU %d (%s), beyond "
                        "XFER_GDR_LEVEL=%s: %s", gm->dev_name, xfer_topo_path_names[path],
                        ordinal, pci, xfer_topo_path_names[gm->level], why);
    }
}

/* Ask the driver what GPU ordinal allows: DMA-BUF export, and whether data the NIC wrote
 * needs the flush (auto: unless the GPU orders GPUDirect RDMA writes for its own consumers,
 * the attribute that tells what NCCL infers from compute capability 9.0). */
static void gpu_learn(xfer_gdr_mem_t *gm, const xfer_cuda_driver_t *drv, int ordinal,
                      xfer_gdr_gpu_t *gpu)
{
    int dev = 0, value = 0, res, ordering = 0;
    char text[96];

    memset(gpu, 0, sizeof(*gpu));
    gpu->known = 1;
    res        = drv->device_get(&dev, ordinal);
    if (res != 0) {
        xfer_reason_set(gpu->dmabuf_why, sizeof(gpu->dmabuf_why), "cuDeviceGet(%d): %s",
                        ordinal, xfer_cuda_result_string(res, text, sizeof(text)));
    } else if (!XFER_CUDA_DRIVER_HAS(drv, mem_get_handle_for_address_range)) {
        xfer_reason_set(gpu->dmabuf_why, sizeof(gpu->dmabuf_why), "the CUDA driver (%d) has "
                        "no cuMemGetHandleForAddressRange (needs CUDA 11.7)", drv->version);
    } else if (((res = drv->device_get_attribute(&value, CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
                                                 dev)) != 0) || (value != 1)) {
        xfer_reason_set(gpu->dmabuf_why, sizeof(gpu->dmabuf_why), "GPU %d does not report "
                        "DMA-BUF support (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED: %s)", ordinal,
                        (res != 0) ? xfer_cuda_result_string(res, text, sizeof(text)) : "0");
    } else {
        gpu->dmabuf = 1;
    }
    if (drv->device_get(&dev, ordinal) == 0) {
        gpu_distance(gm, drv, dev, ordinal, gpu);
    }

    switch (gm->flush_mode) {
    case XFER_GDR_FLUSH_ON:
        gpu->flush = 1;
        xfer_reason_set(gpu->flush_why, sizeof(gpu->flush_why), "XFER_GDR_FLUSH=on");
        return;
    case XFER_GDR_FLUSH_OFF:
        xfer_reason_set(gpu->flush_why, sizeof(gpu->flush_why), "XFER_GDR_FLUSH=off");
        return;
    default:
        break;
    }
    res = (drv->device_get(&dev, ordinal) != 0) ? -1 :
          drv->device_get_attribute(&ordering, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WRITES_ORDERING,
                                    dev);
    if ((res == 0) && (ordering >= CU_GPU_DIRECT_RDMA_WRITES_ORDERING_OWNER)) {
        xfer_reason_set(gpu->flush_why, sizeof(gpu->flush_why), "not needed: GPU %d orders "
                        "GPUDirect RDMA writes for its own use (WRITES_ORDERING %d)", ordinal,
                        ordering);
        return;
    }
    gpu->flush = 1;
    xfer_reason_set(gpu->flush_why, sizeof(gpu->flush_why), "GPU %d does not order GPUDirect "
                    "RDMA writes (WRITES_ORDERING %d)", ordinal, (res == 0) ? ordering : -1);
}

/* Make the allocation's context (or the device's primary one, for stream-ordered memory)
 * current for the export; *prev_p gets what was current. 1 when a primary context was
 * retained (released by ctx_restore). */
static int ctx_enter(const xfer_cuda_driver_t *drv, const xfer_mem_attr_t *attr, void **prev_p,
                     int *retained_p)
{
    void *ctx = attr->cuda_context;

    *retained_p = 0;
    if (drv->ctx_get_current(prev_p) != 0) {
        *prev_p = NULL;
    }
    if (ctx == NULL) {
        if (drv->device_primary_ctx_retain(&ctx, attr->cuda_device) != 0) {
            return 0;
        }
        *retained_p = 1;
    }
    return drv->ctx_set_current(ctx) == 0;
}

static void ctx_leave(const xfer_cuda_driver_t *drv, const xfer_mem_attr_t *attr, void *prev,
                      int retained)
{
    drv->ctx_set_current(prev);
    if (retained) {
        drv->device_primary_ctx_release(attr->cuda_device);
    }
}

static struct ibv_mr *reg_dmabuf(xfer_gdr_mem_t *gm, const xfer_cuda_driver_t *drv,
                                 const xfer_mem_reg_params_t *params, char *why,
                                 size_t why_size)
{
    uintptr_t page  = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t addr  = (uintptr_t)params->addr;
    uintptr_t start = addr & ~(page - 1);
    uintptr_t end   = (addr + params->length + page - 1) & ~(page - 1);
    int fd = -1, retained, res, err;
    struct ibv_mr *mr;
    char text[96];
    void *prev;

    if (!ctx_enter(drv, params->attr, &prev, &retained)) {
        ctx_leave(drv, params->attr, prev, retained);
        xfer_reason_set(why, why_size, "cannot make the context of GPU %d current",
                        params->attr->cuda_device);
        return NULL;
    }
    res = drv->mem_get_handle_for_address_range(&fd, (xfer_cu_ptr_t)start, end - start,
                                                 CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
    ctx_leave(drv, params->attr, prev, retained);
    if (res != 0) {
        xfer_reason_set(why, why_size, "cuMemGetHandleForAddressRange: %s",
                        xfer_cuda_result_string(res, text, sizeof(text)));
        return NULL;
    }
    mr  = ibv_reg_dmabuf_mr(gm->pd, addr - start, params->length, addr, fd, GDR_ACCESS);
    err = errno;
    close(fd);
    if (mr == NULL) {
        xfer_reason_set(why, why_size, "ibv_reg_dmabuf_mr on %s: %s", gm->dev_name,
                        strerror(err));
    }
    return mr;
}

xfer_status_t xfer_gdr_mem_reg(xfer_gdr_mem_t *gm, const xfer_mem_reg_params_t *params,
                               struct ibv_mr **mr_p, xfer_gdr_memh_t *info_p, char *why,
                               size_t why_size)
{
    const xfer_mem_attr_t *attr = params->attr;
    char dmabuf_why[160] = "", peermem_why[160] = "";
    const xfer_cuda_driver_t *drv;
    struct ibv_mr *mr = NULL;
    xfer_gdr_gpu_t *gpu;
    const char *how   = NULL;

    if ((attr == NULL) || (attr->type != XFER_MEM_CUDA) || (attr->cuda_device < 0) ||
        (attr->cuda_device >= XFER_GDR_MAX_GPUS)) {
        xfer_reason_set(why, why_size, "not CUDA memory of a device gdr can address");
        return XFER_ERR_INVALID_PARAM;
    }
    drv = xfer_cuda_driver(why, why_size);
    if (drv == NULL) {
        return XFER_ERR_UNAVAILABLE;
    }
    gpu = &gm->gpus[attr->cuda_device];
    if (!gpu->known) {
        gpu_learn(gm, drv, attr->cuda_device, gpu);
        xfer_log(XFER_LOG_INFO, XFER_GDR_SUBSYS, "GPU %d with %s: DMA-BUF %s%s%s; peermem %s%s; "
                 "flush %s", attr->cuda_device, gm->dev_name,
                 (gpu->dmabuf && gm->nic_dmabuf) ? "yes" : "no",
                 (gpu->dmabuf && gm->nic_dmabuf) ? "" : ": ",
                 !gpu->dmabuf ? gpu->dmabuf_why : (gm->nic_dmabuf ? "" : gm->nic_why),
                 gm->peermem ? "yes" : "no: ", gm->peermem ? "" : gm->peermem_why,
                 gpu->flush_why);
    }

    if (gpu->too_far) {
        xfer_reason_set(why, why_size, "%s", gpu->far_why);
        return XFER_ERR_UNSUPPORTED;
    }
    if (!gpu->dmabuf) {
        xfer_reason_set(dmabuf_why, sizeof(dmabuf_why), "%s", gpu->dmabuf_why);
    } else if (!gm->nic_dmabuf) {
        xfer_reason_set(dmabuf_why, sizeof(dmabuf_why), "%s", gm->nic_why);
    } else {
        mr  = reg_dmabuf(gm, drv, params, dmabuf_why, sizeof(dmabuf_why));
        how = "dma-buf";
    }
    if ((mr == NULL) && !gm->peermem) {
        xfer_reason_set(peermem_why, sizeof(peermem_why), "%s", gm->peermem_why);
    } else if (mr == NULL) {
        mr  = ibv_reg_mr(gm->pd, params->addr, params->length, GDR_ACCESS);
        how = "peermem";
        if (mr == NULL) {
            xfer_reason_set(peermem_why, sizeof(peermem_why), "ibv_reg_mr of the device "
                            "pointer on %s: %s", gm->dev_name, strerror(errno));
        }
    }
    if (mr == NULL) {
        xfer_reason_set(why, why_size, "DMA-BUF: %s; peermem: %s", dmabuf_why, peermem_why);
        return XFER_ERR_UNSUPPORTED;
    }
    info_p->device       = attr->cuda_device;
    info_p->cuda_context = attr->cuda_context;
    info_p->buffer_id = attr->cuda_buffer_id;
    info_p->how       = how;
    info_p->flush     = gpu->flush;
    *mr_p             = mr;
    return XFER_OK;
}
