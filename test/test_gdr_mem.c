/*
 * gdr's registration strategy (components/gdr/gdr_mem.c) and its flush QP (gdr_flush.c),
 * compiled into the test.
 *
 * - The fallback chain runs everywhere against test/plugins/fake_cuda.c (XFER_CUDA_LIB), a
 *   stand-in for the absent GPU's driver that answers "not supported" to DMA-BUF (attribute
 *   0, no cuMemGetHandleForAddressRange): with no peer-memory client either, the registration
 *   is declined with XFER_ERR_UNSUPPORTED and a reason naming both ways. The RDMA device's
 *   answer is given as the probe would leave it, since no registration is reached there.
 * - The flush QP and the DMA-BUF probe need an RDMA device: they run on a real one (the
 *   Soft-RoCE guest's rxe0) and skip with one line elsewhere. The flush reads host memory
 *   there: the QP, its connection to itself and the read are the same for GPU memory.
 * - Registering real device memory needs a GPU and an RDMA device; it skips without them.
 */
#include "gpu_fixture.h"
#include "test_util.h"

#include "../components/gdr/gdr.h"
#include "../components/gdr/gdr_topo.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define expect_contains(_text, _part) \
    cr_expect(strstr((_text), (_part)) != NULL, "'%s' lacks '%s'", (_text), (_part))

/* The stand-in driver, applied by a context's creation, initialised. */
static const xfer_cuda_driver_t *fake_driver(xfer_context_t **ctx_p)
{
    const char *dir = getenv("XFERTEST_PLUGIN_DIR");
    const xfer_cuda_driver_t *drv;
    char path[4096], why[XFER_REASON_MAX];
    void *cu_ctx;

    cr_assert_not_null(dir, "XFERTEST_PLUGIN_DIR is not set");
    snprintf(path, sizeof(path), "%s/fakecuda.so", dir);
    setenv("XFER_CUDA_LIB", path, 1);
    cr_assert_eq(xfer_context_create(NULL, ctx_p), XFER_OK);
    cr_assert_eq(xfer_cuda_init(why, sizeof(why)), XFER_OK, "%s", why);
    drv = xfer_cuda_driver(why, sizeof(why));
    cr_assert_not_null(drv, "%s", why);
    cr_assert_eq(drv->device_primary_ctx_retain(&cu_ctx, 0), 0);
    cr_assert_eq(drv->ctx_set_current(cu_ctx), 0);
    return drv;
}

/* A strategy as xfer_gdr_mem_init leaves it on a device that does not take DMA-BUF, without
 * the device: the chain must decline before it would register anything. */
static void strategy_without_nic(xfer_gdr_mem_t *gm, int flush_mode)
{
    memset(gm, 0, sizeof(*gm));
    gm->flush_mode = flush_mode;
    snprintf(gm->dev_name, sizeof(gm->dev_name), "nodev");
    snprintf(gm->nic_why, sizeof(gm->nic_why), "nodev does not accept DMA-BUF");
    gm->peermem = xfer_gdr_peermem_loaded(gm->peermem_why, sizeof(gm->peermem_why));
}

Test(gdr_mem, declined_with_both_reasons_without_dmabuf_or_peermem)
{
    char why[XFER_REASON_MAX], reason[XFER_REASON_MAX];
    const xfer_cuda_driver_t *drv;
    xfer_mem_reg_params_t params;
    xfer_gdr_memh_t info;
    xfer_mem_attr_t attr;
    xfer_context_t *ctx;
    struct ibv_mr *mr = NULL;
    xfer_gdr_mem_t gm;
    xfer_cu_ptr_t dptr;

    drv = fake_driver(&ctx);
    strategy_without_nic(&gm, XFER_GDR_FLUSH_AUTO);
    if (gm.peermem) {
        cr_skip_test("a peer-memory client is loaded on this host");
    }
    cr_assert_eq(drv->mem_alloc(&dptr, 1 << 20), 0);
    cr_assert_eq(xfer_mem_detect((void*)(uintptr_t)dptr, 4096, &attr, why, sizeof(why)),
                 XFER_OK, "%s", why);
    cr_assert_eq(attr.type, XFER_MEM_CUDA);
    params.size   = sizeof(params);
    params.addr   = (void*)(uintptr_t)dptr;
    params.length = 4096;
    params.attr   = &attr;
    cr_expect_eq(xfer_gdr_mem_reg(&gm, &params, &mr, &info, reason, sizeof(reason)),
                 XFER_ERR_UNSUPPORTED);
    cr_expect_null(mr);
    /* the stand-in reports DMA_BUF_SUPPORTED 0 and has no export entry point */
    expect_contains(reason, "DMA-BUF: ");
    cr_expect(strstr(reason, "does not report DMA-BUF support") ||
              strstr(reason, "no cuMemGetHandleForAddressRange"), "%s", reason);
    expect_contains(reason, "; peermem: nvidia_peermem is not loaded");
    /* what the GPU allows was learnt once: the flush, auto, is needed (no write ordering) */
    cr_expect(gm.gpus[0].known);
    cr_expect(gm.gpus[0].flush, "%s", gm.gpus[0].flush_why);
    drv->mem_free(dptr);
    xfer_context_destroy(ctx);
}

Test(gdr_mem, the_flush_parameter_overrides_what_the_gpu_says)
{
    const xfer_cuda_driver_t *drv;
    xfer_mem_reg_params_t params;
    xfer_mem_attr_t attr;
    xfer_context_t *ctx;
    xfer_gdr_memh_t info;
    char why[XFER_REASON_MAX];
    struct ibv_mr *mr = NULL;
    xfer_gdr_mem_t gm;
    xfer_cu_ptr_t dptr;

    drv = fake_driver(&ctx);
    cr_assert_eq(drv->mem_alloc(&dptr, 1 << 16), 0);
    cr_assert_eq(xfer_mem_detect((void*)(uintptr_t)dptr, 64, &attr, why, sizeof(why)), XFER_OK);
    params.size   = sizeof(params);
    params.addr   = (void*)(uintptr_t)dptr;
    params.length = 64;
    params.attr   = &attr;
    strategy_without_nic(&gm, XFER_GDR_FLUSH_OFF);
    xfer_gdr_mem_reg(&gm, &params, &mr, &info, why, sizeof(why));
    cr_expect_not(gm.gpus[0].flush);
    expect_contains(gm.gpus[0].flush_why, "XFER_GDR_FLUSH=off");
    strategy_without_nic(&gm, XFER_GDR_FLUSH_ON);
    xfer_gdr_mem_reg(&gm, &params, &mr, &info, why, sizeof(why));
    cr_expect(gm.gpus[0].flush);
    drv->mem_free(dptr);
    xfer_context_destroy(ctx);
}

Test(gdr_mem, host_memory_is_not_taken_as_cuda)
{
    xfer_mem_reg_params_t params;
    char buf[64], why[XFER_REASON_MAX];
    xfer_mem_attr_t attr = {.type = XFER_MEM_HOST, .cuda_device = -1};
    struct ibv_mr *mr    = NULL;
    xfer_gdr_memh_t info;
    xfer_gdr_mem_t gm;

    strategy_without_nic(&gm, XFER_GDR_FLUSH_AUTO);
    params.size   = sizeof(params);
    params.addr   = buf;
    params.length = sizeof(buf);
    params.attr   = &attr;
    cr_expect_eq(xfer_gdr_mem_reg(&gm, &params, &mr, &info, why, sizeof(why)),
                 XFER_ERR_INVALID_PARAM);
    cr_expect_null(mr);
}

/* ---- on an RDMA device ----------------------------------------------------------------------- */

typedef struct rdma {
    struct ibv_device    **list;
    struct ibv_context   *ctx;
    struct ibv_pd        *pd;
    struct ibv_port_attr port_attr;
    int                  gid_index;
} rdma_t;

/* The first RDMA device's port 1 and a protection domain; or skip, saying why. */
static void rdma_open(rdma_t *r)
{
    const char *gid = getenv("RXE_GUEST_GID_INDEX_A");
    int num = 0;

    memset(r, 0, sizeof(*r));
    r->list = ibv_get_device_list(&num);
    if ((r->list == NULL) || (num == 0)) {
        fprintf(stderr, "gdr_mem: skipped: no RDMA device (run in the Soft-RoCE guest)\n");
        cr_skip_test("no RDMA device");
    }
    r->ctx = ibv_open_device(r->list[0]);
    cr_assert_not_null(r->ctx);
    r->pd = ibv_alloc_pd(r->ctx);
    cr_assert_not_null(r->pd);
    cr_assert_eq(ibv_query_port(r->ctx, 1, &r->port_attr), 0);
    if (r->port_attr.state != IBV_PORT_ACTIVE) {
        cr_skip_test("port 1 of %s is not active", ibv_get_device_name(r->list[0]));
    }
    r->gid_index = (gid != NULL) ? atoi(gid) : 0;
}

static void rdma_close(rdma_t *r)
{
    ibv_dealloc_pd(r->pd);
    ibv_close_device(r->ctx);
    ibv_free_device_list(r->list);
}

static xfer_gdr_flush_t *flush_open(rdma_t *r)
{
    xfer_gdr_flush_params_t fp = {.ctx = r->ctx, .pd = r->pd, .port = 1,
                                  .gid_index = r->gid_index, .port_attr = &r->port_attr,
                                  .timeout = 5.0};
    char why[XFER_REASON_MAX];
    xfer_gdr_flush_t *f = NULL;

    cr_assert_eq(xfer_gdr_flush_create(&fp, &f, why, sizeof(why)), XFER_OK, "%s", why);
    return f;
}

Test(gdr_mem, the_flush_reads_through_a_qp_connected_to_itself)
{
    char why[XFER_REASON_MAX];
    static uint8_t buf[4096];
    xfer_gdr_flush_t *f;
    struct ibv_mr *mr;
    rdma_t r;

    rdma_open(&r);
    mr = ibv_reg_mr(r.pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
                    IBV_ACCESS_REMOTE_WRITE);
    cr_assert_not_null(mr);
    f = flush_open(&r);
    for (int i = 0; i < 100; i++) {
        cr_assert_eq(xfer_gdr_flush_run(f, (uintptr_t)buf + (size_t)(i * 37) % sizeof(buf),
                                        mr->rkey, why, sizeof(why)), XFER_OK, "%d: %s", i, why);
    }
    cr_expect_eq(xfer_gdr_flush_count(f), 100);
    xfer_gdr_flush_destroy(f);
    ibv_dereg_mr(mr);
    rdma_close(&r);
}

Test(gdr_mem, a_failed_flush_fails_every_later_one_with_its_reason)
{
    char why[XFER_REASON_MAX], again[XFER_REASON_MAX];
    static uint8_t buf[64];
    xfer_gdr_flush_t *f;
    struct ibv_mr *mr;
    rdma_t r;

    rdma_open(&r);
    mr = ibv_reg_mr(r.pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
    cr_assert_not_null(mr);
    f = flush_open(&r);
    /* a key that grants nothing: the device refuses the read */
    cr_expect_eq(xfer_gdr_flush_run(f, (uintptr_t)buf, mr->rkey ^ 0x5a5a00, why, sizeof(why)),
                 XFER_ERR_IO);
    cr_expect(strstr(why, "flush read of") != NULL, "%s", why);
    cr_expect_eq(xfer_gdr_flush_run(f, (uintptr_t)buf, mr->rkey, again, sizeof(again)),
                 XFER_ERR_IO);
    cr_expect_str_eq(again, why);
    xfer_gdr_flush_destroy(f);
    ibv_dereg_mr(mr);
    rdma_close(&r);
}

Test(gdr_mem, the_device_is_probed_for_dmabuf_and_says_so)
{
    xfer_gdr_config_t cfg;
    xfer_gdr_mem_t gm;
    rdma_t r;

    rdma_open(&r);
    memset(&cfg, 0, sizeof(cfg));
    cfg.dmabuf  = 1;
    cfg.peermem = 1;
    xfer_gdr_mem_init(&gm, r.pd, ibv_get_device_name(r.list[0]), &cfg);
    if (strncmp(ibv_get_device_name(r.list[0]), "rxe", 3) == 0) {
        /* Soft-RoCE registers no dma-buf */
        cr_expect_not(gm.nic_dmabuf);
        expect_contains(gm.nic_why, "does not accept DMA-BUF");
    } else {
        cr_expect(gm.nic_dmabuf || (strstr(gm.nic_why, "DMA-BUF") != NULL));
    }
    cfg.dmabuf  = 0;
    cfg.peermem = 0;
    xfer_gdr_mem_init(&gm, r.pd, "x", &cfg);
    cr_expect_not(gm.nic_dmabuf);
    cr_expect_not(gm.peermem);
    cr_expect_str_eq(gm.nic_why, "XFER_GDR_DMABUF=n");
    cr_expect_str_eq(gm.peermem_why, "XFER_GDR_PEERMEM=n");
    rdma_close(&r);
}

/* On a GPU next to an RDMA device: device memory registers by DMA-BUF or peermem, or is
 * declined saying why. Skips without either. */
Test(gdr_mem, device_memory_registers_or_says_why)
{
    char why[XFER_REASON_MAX];
    xfer_mem_reg_params_t params;
    xfer_gdr_memh_t info;
    xfer_mem_attr_t attr;
    xfer_context_t *ctx;
    struct ibv_mr *mr = NULL;
    xfer_gdr_mem_t gm;
    xfer_cu_ptr_t dptr;
    xfer_status_t status;
    tg_gpu_t gpu;
    rdma_t r;

    unsetenv("XFER_CUDA_LIB");
    cr_assert_eq(xfer_context_create(NULL, &ctx), XFER_OK);
    tg_gpu_open(&gpu, "gdr_mem");
    rdma_open(&r);
    xfer_gdr_mem_init(&gm, r.pd, ibv_get_device_name(r.list[0]), NULL);
    cr_assert_eq(gpu.drv->mem_alloc(&dptr, 4 << 20), 0);
    cr_assert_eq(xfer_mem_detect((void*)(uintptr_t)dptr, 4 << 20, &attr, why, sizeof(why)),
                 XFER_OK, "%s", why);
    params.size   = sizeof(params);
    params.addr   = (void*)(uintptr_t)dptr;
    params.length = 4 << 20;
    params.attr   = &attr;
    status = xfer_gdr_mem_reg(&gm, &params, &mr, &info, why, sizeof(why));
    if (status == XFER_OK) {
        cr_expect(!strcmp(info.how, "dma-buf") || !strcmp(info.how, "peermem"));
        cr_expect_eq(info.buffer_id, attr.cuda_buffer_id);
        ibv_dereg_mr(mr);
    } else if ((strstr(why, "XFER_GDR_LEVEL") == NULL) && (strstr(why, "no PCI path") == NULL)) {
        cr_expect_eq(status, XFER_ERR_UNSUPPORTED);
        expect_contains(why, "DMA-BUF: ");
        expect_contains(why, "peermem: ");
    } else {
        cr_expect_eq(status, XFER_ERR_UNSUPPORTED, "%s", why);  /* the NIC is too far */
    }
    gpu.drv->mem_free(dptr);
    rdma_close(&r);
    xfer_context_destroy(ctx);
}

/* The NIC's distance from the GPU (test/topo/two_sockets.xml, the stand-in driver placing its
 * GPU at 0000:05:00.0, one PCIe switch from mlx5_0 and on the other socket from mlx5_1) is
 * held against XFER_GDR_LEVEL before any way of registering is tried. */
static xfer_status_t reg_at_distance(const char *nic, int level, char *why, size_t why_size)
{
    const char *src = getenv("XFERTEST_SRC_DIR");
    const xfer_cuda_driver_t *drv;
    xfer_mem_reg_params_t params;
    xfer_gdr_memh_t info;
    xfer_mem_attr_t attr;
    xfer_context_t *ctx;
    struct ibv_mr *mr = NULL;
    xfer_gdr_mem_t gm;
    xfer_cu_ptr_t dptr;
    xfer_status_t status;
    char xml[4096];

    cr_assert_not_null(src, "XFERTEST_SRC_DIR is set by make check");
    snprintf(xml, sizeof(xml), "%s/test/topo/two_sockets.xml", src);
    setenv("HWLOC_XMLFILE", xml, 1);
    setenv("FAKE_CUDA_PCI_BUS_ID", "0000:05:00.0", 1);
    drv = fake_driver(&ctx);
    strategy_without_nic(&gm, XFER_GDR_FLUSH_AUTO);
    snprintf(gm.dev_name, sizeof(gm.dev_name), "%s", nic);
    gm.level = level;
    cr_assert_eq(drv->mem_alloc(&dptr, 1 << 20), 0);
    cr_assert_eq(xfer_mem_detect((void*)(uintptr_t)dptr, 4096, &attr, why, why_size), XFER_OK);
    params.size   = sizeof(params);
    params.addr   = (void*)(uintptr_t)dptr;
    params.length = 4096;
    params.attr   = &attr;
    status = xfer_gdr_mem_reg(&gm, &params, &mr, &info, why, why_size);
    cr_expect_null(mr);
    drv->mem_free(dptr);
    xfer_context_destroy(ctx);
    unsetenv("HWLOC_XMLFILE");
    unsetenv("FAKE_CUDA_PCI_BUS_ID");
    return status;
}

Test(gdr_mem, a_nic_beyond_the_level_is_declined_with_the_distance)
{
    char why[XFER_REASON_MAX];

    /* SYS, beyond PXB: declined for the distance, before DMA-BUF or peermem is looked at */
    cr_expect_eq(reg_at_distance("mlx5_1", XFER_TOPO_PXB, why, sizeof(why)),
                 XFER_ERR_UNSUPPORTED);
    expect_contains(why, "mlx5_1 is SYS from GPU 0 (0000:05:00.0), beyond XFER_GDR_LEVEL=PXB");
    cr_expect(strstr(why, "DMA-BUF: ") == NULL, "%s", why);

    /* the same NIC with the level at SYS: the distance allows it, the ways are tried (and
     * neither works with the stand-in) */
    cr_expect_eq(reg_at_distance("mlx5_1", XFER_TOPO_SYS, why, sizeof(why)),
                 XFER_ERR_UNSUPPORTED);
    cr_expect(strstr(why, "XFER_GDR_LEVEL") == NULL, "%s", why);
    expect_contains(why, "DMA-BUF: ");

    /* PIX, within PXB */
    cr_expect_eq(reg_at_distance("mlx5_0", XFER_TOPO_PXB, why, sizeof(why)),
                 XFER_ERR_UNSUPPORTED);
    cr_expect(strstr(why, "XFER_GDR_LEVEL") == NULL, "%s", why);
    expect_contains(why, "DMA-BUF: ");
}
