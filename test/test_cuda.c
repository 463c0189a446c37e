/*
 * CUDA memory at registration: the driver is loaded in one place, only when device memory is
 * registered, and memory types are checked. Without a GPU (most hosts): XFER_MEM_CUDA is
 * refused naming the driver library and why (missing file, a library that is not a CUDA
 * driver); XFER_MEM_AUTO on malloc'd and mmap'd memory registers host memory that moves over
 * a real put and tagged send between two processes; a process that registers host memory and
 * transfers never maps libcuda; gdr's query finds GPUs in sysfs without the driver. With a
 * GPU (driver API through libxfer's own table): device memory found as such, wrong types
 * refused, ranges past an allocation refused, a re-allocated buffer told apart by its buffer
 * id, pinned host memory is host memory. The GPU tests skip with a one-line reason elsewhere.
 */
#include "gpu_fixture.h"
#include "test_peer.h"
#include "test_util.h"

#include <xfer/component.h>

#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define BUF_LEN     (256u * 1024)
#define MSG_TAG     0x5eedull

static void setup(void)
{
    tp_env();
    unsetenv("XFER_CUDA_LIB");
}

TestSuite(cuda, .init = setup, .timeout = 120);

/* 1 when a mapping of this process names libcuda. */
static int libcuda_mapped(void)
{
    char line[1024];
    int found = 0;
    FILE *f   = fopen("/proc/self/maps", "r");

    cr_assert_not_null(f, "cannot read /proc/self/maps");
    while (!found && (fgets(line, sizeof(line), f) != NULL)) {
        found = (strstr(line, "libcuda") != NULL);
    }
    fclose(f);
    return found;
}

/* ---- no driver ------------------------------------------------------------------------------- */

Test(cuda, cuda_memory_is_refused_naming_a_missing_driver, .init = cr_redirect_stderr)
{
    xfer_context_t *ctx;
    xfer_mem_t *mem = NULL;
    char buf[64], why[XFER_REASON_MAX] = "", *log;

    setup();
    setenv("XFER_CUDA_LIB", "/nonexistent/libcuda-test.so.1", 1);
    ctx = tp_context(0);
    xfer_last_error_clear();
    cr_expect_eq(xfer_mem_register(ctx, buf, sizeof(buf), XFER_MEM_CUDA, &mem),
                 XFER_ERR_UNAVAILABLE);
    cr_expect_null(mem, "outputs are set only on success");
    cr_expect(strstr(xfer_last_error(), "as XFER_MEM_CUDA: /nonexistent/libcuda-test.so.1 not "
                     "found") != NULL, "the reason: %s", xfer_last_error());
    cr_expect_eq(xfer_cuda_init(why, sizeof(why)), XFER_ERR_UNAVAILABLE);
    cr_expect(strstr(why, "/nonexistent/libcuda-test.so.1 not found") != NULL, "why: %s", why);
    cr_expect_null(xfer_cuda_driver(NULL, 0));
    log = tu_read_redirected_stderr();
    cr_expect(strstr(log, "ERROR") == NULL, "a refusal the caller is told of is not shouted: %s",
              log);
    free(log);
    /* host memory still registers: nothing needed the driver */
    cr_expect_eq(xfer_mem_register(ctx, buf, sizeof(buf), XFER_MEM_AUTO, &mem), XFER_OK);
    cr_expect_eq(xfer_mem_type(mem), XFER_MEM_HOST);
    cr_expect_eq(xfer_mem_deregister(mem), XFER_OK);
    xfer_context_destroy(ctx);
}

Test(cuda, a_library_that_is_not_a_cuda_driver_is_named)
{
    xfer_context_t *ctx;
    xfer_mem_t *mem = NULL;
    char buf[64], why[XFER_REASON_MAX] = "";

    setenv("XFER_CUDA_LIB", "libm.so.6", 1);
    ctx = tp_context(0);
    cr_expect_eq(xfer_mem_register(ctx, buf, sizeof(buf), XFER_MEM_CUDA, &mem),
                 XFER_ERR_UNAVAILABLE);
    cr_expect_eq(xfer_cuda_init(why, sizeof(why)), XFER_ERR_UNAVAILABLE);
    cr_expect(strstr(why, "libm.so.6 is not a usable CUDA driver: it lacks cuInit") != NULL,
              "why: %s", why);
    xfer_cuda_describe(why, sizeof(why));
    cr_expect(strstr(why, "lacks cuInit") != NULL, "describe: %s", why);
    xfer_context_destroy(ctx);
}

Test(cuda, unknown_types_and_empty_ranges_are_refused)
{
    xfer_context_t *ctx = tp_context(0);
    xfer_mem_attr_t attr;
    xfer_mem_t *mem = NULL;
    char buf[64], why[XFER_REASON_MAX];

    cr_expect_eq(xfer_mem_register(ctx, buf, sizeof(buf), (xfer_mem_type_t)7, &mem),
                 XFER_ERR_INVALID_PARAM);
    cr_expect_eq(xfer_mem_detect(buf, 0, &attr, why, sizeof(why)), XFER_ERR_INVALID_PARAM);
    cr_expect_eq(xfer_mem_detect((void*)(uintptr_t)-16, 64, &attr, why, sizeof(why)),
                 XFER_ERR_INVALID_PARAM, "a wrapping range");
    cr_expect_eq(xfer_mem_type(NULL), XFER_MEM_HOST);
    xfer_context_destroy(ctx);
}

/* ---- host memory with AUTO, between two processes ---------------------------------------- */

/* The child: an mmap'd buffer registered as AUTO, its key to the parent, then a tagged
 * receive into a malloc'd AUTO buffer; answers whether both hold what the parent sent. */
static int srv_auto(tp_side_t *s)
{
    void *region = mmap(NULL, BUF_LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                        -1, 0);
    char *msg    = malloc(BUF_LEN);
    xfer_mem_t *rmem, *mmem;
    xfer_request_t *req;
    uint64_t cmd;
    void *blob;
    size_t len;

    TP_CHECK((region != MAP_FAILED) && (msg != NULL), "allocation");
    TP_CHECK_STATUS(xfer_mem_register(s->ctx, region, BUF_LEN, XFER_MEM_AUTO, &rmem), XFER_OK);
    TP_CHECK_STATUS(xfer_mem_register(s->ctx, msg, BUF_LEN, XFER_MEM_AUTO, &mmem), XFER_OK);
    TP_CHECK(xfer_mem_type(rmem) == XFER_MEM_HOST, "mmap'd memory is host memory");
    TP_CHECK(xfer_mem_type(mmem) == XFER_MEM_HOST, "malloc'd memory is host memory");
    TP_CHECK_STATUS(xfer_rkey_pack(rmem, &blob, &len), XFER_OK);
    TP_CHECK(tp_ctl_send_u64(s->ctl, (uintptr_t)region) == 0, "ctl");
    TP_CHECK(tp_ctl_send(s->ctl, blob, len) == 0, "ctl");
    xfer_rkey_blob_free(blob);
    TP_CHECK(TP_POSTED(xfer_tag_recv(s->ctx, s->ep, MSG_TAG, ~0ull, msg, BUF_LEN, mmem, NULL,
                                     NULL, &req)), "tag_recv");
    TP_CHECK_STATUS(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
    xfer_request_release(req);
    TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS) == 0, "no command from the parent");
    TP_CHECK(tp_ctl_recv_u64(s->ctl, &cmd, TP_WAIT_MS) == 0, "ctl");
    TP_CHECK(tp_ctl_send_u64(s->ctl, (tp_check_pattern(region, BUF_LEN, 11) < 0) &&
                                     (tp_check_pattern(msg, BUF_LEN, 12) < 0)) == 0, "ctl");
    TP_CHECK(tp_ctl_recv_u64(s->ctl, &cmd, TP_WAIT_MS) == 0, "ctl");
    TP_CHECK_STATUS(xfer_mem_deregister(rmem), XFER_OK);
    TP_CHECK_STATUS(xfer_mem_deregister(mmem), XFER_OK);
    munmap(region, BUF_LEN);
    free(msg);
    return 0;
}

Test(cuda, auto_host_memory_moves_by_put_and_tag_without_loading_the_driver)
{
    char *src, *msg, how[XFER_REASON_MAX];
    xfer_mem_t *smem, *mmem, *hmem;
    xfer_rkey_t *rkey;
    xfer_request_t *req;
    xfer_mem_attr_t attr;
    tp_peer_t peer;
    uint64_t remote;
    size_t blob_len;
    void *blob;

    tp_start(&peer, srv_auto, NULL);
    /* allocated after the fork, so that the child does not inherit (and leak) them */
    src = malloc(BUF_LEN);
    msg = malloc(BUF_LEN);
    cr_assert((src != NULL) && (msg != NULL));
    tp_fill_pattern(src, BUF_LEN, 11);
    tp_fill_pattern(msg, BUF_LEN, 12);
    cr_assert_eq(xfer_mem_register(peer.ctx, src, BUF_LEN, XFER_MEM_AUTO, &smem), XFER_OK);
    cr_assert_eq(xfer_mem_register(peer.ctx, msg, BUF_LEN, XFER_MEM_AUTO, &mmem), XFER_OK);
    cr_assert_eq(xfer_mem_register(peer.ctx, msg, BUF_LEN, XFER_MEM_HOST, &hmem), XFER_OK);
    cr_expect_eq(xfer_mem_type(smem), XFER_MEM_HOST);
    cr_expect_eq(xfer_mem_type(hmem), XFER_MEM_HOST);
    cr_assert_eq(xfer_mem_detect(src, BUF_LEN, &attr, how, sizeof(how)), XFER_OK);
    cr_expect_eq(attr.type, XFER_MEM_HOST);
    cr_expect_eq(attr.cuda_device, -1);
    cr_expect(strstr(attr.how, "not loaded") != NULL, "how: %s", attr.how);

    remote = tp_recv(&peer);
    blob   = tp_recv_blob(&peer, &blob_len);
    cr_assert_eq(xfer_rkey_unpack(peer.ep, blob, blob_len, &rkey), XFER_OK);
    free(blob);
    cr_assert(TP_POSTED(xfer_put(peer.ep, src, BUF_LEN, smem, remote, rkey, NULL, NULL, &req)));
    cr_assert_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
    xfer_request_release(req);
    cr_assert(TP_POSTED(xfer_tag_send(peer.ep, MSG_TAG, msg, BUF_LEN, mmem, NULL, NULL, &req)));
    cr_assert_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
    xfer_request_release(req);
    tp_send(&peer, 1);
    cr_expect_eq(tp_recv(&peer), 1, "the child's buffers hold what was put and sent");
    tp_send(&peer, 2);
    xfer_rkey_destroy(rkey);
    cr_expect_eq(xfer_mem_deregister(smem), XFER_OK);
    cr_expect_eq(xfer_mem_deregister(mmem), XFER_OK);
    cr_expect_eq(xfer_mem_deregister(hmem), XFER_OK);

    cr_expect_not(libcuda_mapped(), "a process that registered only host memory mapped "
                  "libcuda");
    xfer_cuda_describe(how, sizeof(how));
    cr_expect(strstr(how, "not loaded") != NULL, "driver: %s", how);
    tp_finish(&peer);
    free(src);
    free(msg);
}

Test(cuda, gdr_finds_gpus_in_sysfs_without_the_driver)
{
    xfer_context_t *ctx;
    xfer_component_info_t info;
    const char *found_by;

    cr_assert_eq(tu_context(1, &ctx), XFER_OK);
    if (!tu_component(ctx, "gdr", NULL, &info)) {
        xfer_context_destroy(ctx);
        fprintf(stderr, "test_cuda: skipped: the gdr component is not built here\n");
        cr_skip_test("the gdr component is not built here");
    }
    cr_expect_neq(info.state, XFER_COMPONENT_FAILED, "gdr failed to load: %s", info.reason);
    found_by = tu_device_attr(&info, "found_by");
    if (found_by == NULL) {
        cr_expect(strstr(info.reason, "no NVIDIA GPU on the PCI bus") != NULL, "reason: %s",
                  info.reason);
        cr_expect(strstr(info.reason, "without the CUDA driver") != NULL, "reason: %s",
                  info.reason);
    } else {
        cr_expect(strstr(found_by, "sysfs") != NULL, "found_by: %s", found_by);
        cr_expect_str_eq(tu_device_attr(&info, "dmabuf"), "unknown until first use (needs "
                         "cuInit)");
    }
    cr_expect_not(libcuda_mapped(), "gdr's query mapped libcuda");
    xfer_context_destroy(ctx);
}

/* ---- with a GPU ------------------------------------------------------------------------------ */

typedef struct gpu {
    const xfer_cuda_driver_t *drv;
    xfer_context_t           *ctx;
    int                      device;
    void                     *cu_ctx;
} gpu_t;

/* CUDA on device 0 (or the test skips), and a context. */
static void gpu_open(gpu_t *g)
{
    tg_gpu_t d;

    memset(g, 0, sizeof(*g));
    tg_gpu_open(&d, "test_cuda");
    g->drv    = d.drv;
    g->device = d.device;
    g->cu_ctx = d.cu_ctx;
    g->ctx    = tp_context(0);
}

static void gpu_close(gpu_t *g)
{
    xfer_context_destroy(g->ctx);
    g->drv->device_primary_ctx_release(g->device);
}

static xfer_cu_ptr_t gpu_alloc(gpu_t *g, size_t len)
{
    xfer_cu_ptr_t p = 0;

    cr_assert_eq(g->drv->mem_alloc(&p, len), 0, "cuMemAlloc(%zu)", len);
    return p;
}

/* A registration of device memory either succeeds as CUDA memory (moved by a transport, or
 * staged through host memory by put and get), or - when no open transport moves or stages
 * it - is refused for that reason alone. */
static void expect_cuda_registration(gpu_t *g, void *p, size_t len, xfer_mem_type_t type)
{
    xfer_mem_t *mem = NULL;
    xfer_status_t status = xfer_mem_register(g->ctx, p, len, type, &mem);

    if (status == XFER_OK) {
        cr_expect_eq(xfer_mem_type(mem), XFER_MEM_CUDA);
        cr_expect_eq(xfer_mem_deregister(mem), XFER_OK);
    } else {
        cr_expect_eq(status, XFER_ERR_UNSUPPORTED, "status %s", xfer_status_string(status));
    }
}

Test(cuda, device_memory_is_found_and_checked)
{
    char why[XFER_REASON_MAX], host[4096];
    xfer_mem_attr_t attr;
    xfer_mem_t *mem = NULL;
    xfer_cu_ptr_t dptr;
    gpu_t g;

    gpu_open(&g);
    dptr = gpu_alloc(&g, BUF_LEN);
    memset(host, 0x5a, sizeof(host));
    cr_assert_eq(g.drv->memcpy_htod(dptr, host, sizeof(host)), 0);
    cr_assert_eq(xfer_mem_detect((void*)(uintptr_t)dptr, BUF_LEN, &attr, why, sizeof(why)),
                 XFER_OK, "%s", why);
    cr_expect_eq(attr.type, XFER_MEM_CUDA, "how: %s", attr.how);
    cr_expect_eq(attr.cuda_device, 0);
    cr_expect_eq(attr.cuda_context, g.cu_ctx);
    cr_expect_neq(attr.cuda_buffer_id, 0);
    cr_expect_leq(attr.alloc_base, dptr);
    cr_expect_geq(attr.alloc_base + attr.alloc_length, dptr + BUF_LEN);

    expect_cuda_registration(&g, (void*)(uintptr_t)dptr, BUF_LEN, XFER_MEM_CUDA);
    expect_cuda_registration(&g, (void*)(uintptr_t)(dptr + 100), 1000, XFER_MEM_AUTO);
    cr_expect_eq(xfer_mem_register(g.ctx, (void*)(uintptr_t)dptr, BUF_LEN, XFER_MEM_HOST, &mem),
                 XFER_ERR_INVALID_PARAM, "device memory registered as host memory");
    cr_expect_eq(xfer_mem_register(g.ctx, host, sizeof(host), XFER_MEM_CUDA, &mem),
                 XFER_ERR_INVALID_PARAM, "host memory registered as CUDA memory");
    cr_expect_null(mem);
    /* with CUDA initialised, host memory is still host memory */
    cr_assert_eq(xfer_mem_register(g.ctx, host, sizeof(host), XFER_MEM_AUTO, &mem), XFER_OK);
    cr_expect_eq(xfer_mem_type(mem), XFER_MEM_HOST);
    cr_expect_eq(xfer_mem_deregister(mem), XFER_OK);
    /* the data is still there after registration set SYNC_MEMOPS */
    memset(host, 0, sizeof(host));
    cr_assert_eq(g.drv->memcpy_dtoh(host, dptr, sizeof(host)), 0);
    cr_expect_eq(host[0], 0x5a);
    cr_expect_eq(host[sizeof(host) - 1], 0x5a);
    g.drv->mem_free(dptr);
    gpu_close(&g);
}

Test(cuda, a_range_past_its_allocation_is_refused)
{
    char why[XFER_REASON_MAX];
    xfer_mem_attr_t attr;
    xfer_mem_t *mem = NULL;
    xfer_cu_ptr_t dptr, base = 0;
    size_t size = 0;
    gpu_t g;

    gpu_open(&g);
    dptr = gpu_alloc(&g, BUF_LEN);
    cr_assert_eq(g.drv->mem_get_address_range(&base, &size, dptr), 0);
    cr_expect_eq(xfer_mem_detect((void*)(uintptr_t)base, size + 1, &attr, why, sizeof(why)),
                 XFER_ERR_INVALID_PARAM, "one byte past the allocation");
    cr_expect_eq(xfer_mem_register(g.ctx, (void*)(uintptr_t)base, size + 4096, XFER_MEM_AUTO,
                                   &mem), XFER_ERR_INVALID_PARAM);
    g.drv->mem_free(dptr);
    gpu_close(&g);
}

Test(cuda, a_reallocated_buffer_has_another_buffer_id)
{
    char why[XFER_REASON_MAX];
    xfer_mem_attr_t first, again;
    xfer_cu_ptr_t dptr, dptr2 = 0;
    gpu_t g;

    gpu_open(&g);
    dptr = gpu_alloc(&g, BUF_LEN);
    cr_assert_eq(xfer_mem_detect((void*)(uintptr_t)dptr, BUF_LEN, &first, why, sizeof(why)),
                 XFER_OK, "%s", why);
    g.drv->mem_free(dptr);
    /* the allocator usually hands the same address back at once */
    for (int i = 0; (i < 8) && (dptr2 != dptr); i++) {
        if (dptr2 != 0) {
            g.drv->mem_free(dptr2);
        }
        dptr2 = gpu_alloc(&g, BUF_LEN);
    }
    cr_assert_eq(xfer_mem_detect((void*)(uintptr_t)dptr2, BUF_LEN, &again, why, sizeof(why)),
                 XFER_OK, "%s", why);
    cr_expect_eq(again.type, XFER_MEM_CUDA);
    cr_expect_neq(again.cuda_buffer_id, first.cuda_buffer_id, "%s address, same buffer id %llu",
                  (dptr2 == dptr) ? "same" : "another",
                  (unsigned long long)first.cuda_buffer_id);
    g.drv->mem_free(dptr2);
    gpu_close(&g);
}

Test(cuda, pinned_host_memory_is_host_memory)
{
    char why[XFER_REASON_MAX];
    xfer_mem_attr_t attr;
    xfer_mem_t *mem = NULL;
    void *pinned = NULL;
    gpu_t g;

    gpu_open(&g);
    cr_assert_eq(g.drv->mem_host_alloc(&pinned, BUF_LEN, 0), 0);
    cr_assert_eq(xfer_mem_detect(pinned, BUF_LEN, &attr, why, sizeof(why)), XFER_OK, "%s", why);
    cr_expect_eq(attr.type, XFER_MEM_HOST);
    cr_expect(strstr(attr.how, "pinned") != NULL, "how: %s", attr.how);
    cr_assert_eq(xfer_mem_register(g.ctx, pinned, BUF_LEN, XFER_MEM_AUTO, &mem), XFER_OK);
    cr_expect_eq(xfer_mem_type(mem), XFER_MEM_HOST);
    cr_expect_eq(xfer_mem_deregister(mem), XFER_OK);
    g.drv->mem_free_host(pinned);
    gpu_close(&g);
}

Test(cuda, a_loaded_but_uninitialised_driver_means_host_memory)
{
    char why[XFER_REASON_MAX], buf[64];
    xfer_mem_attr_t attr;

    if (xfer_cuda_driver(why, sizeof(why)) == NULL) {
        fprintf(stderr, "test_cuda: skipped: %s\n", why);
        cr_skip_test("%s", why);
    }
    cr_assert_eq(xfer_mem_detect(buf, sizeof(buf), &attr, why, sizeof(why)), XFER_OK, "%s", why);
    cr_expect_eq(attr.type, XFER_MEM_HOST);
    cr_expect(strstr(attr.how, "not initialised") != NULL, "how: %s", attr.how);
}
