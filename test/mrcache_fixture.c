/*
 * The fixture of the registration-cache suites (mrcache_fixture.h): a real RDMA device and
 * protection domain, a page-aligned test buffer, a cache over it registering as verbs does,
 * and the ibv_dereg_mr this executable defines to see every release.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE   /* RTLD_NEXT */
#endif
#include "config.h"

#include "mrcache_fixture.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifdef HAVE_UCM
#include <ucm/api/ucm.h>
#endif

struct ibv_context *ctx;
struct ibv_pd      *pd;
xfer_regcache_t    *mrc;
char               *buf;    /* NPAGES pages */
size_t             page;

unsigned num_dereg;         /* ibv_dereg_mr calls seen */
uint32_t last_dereg_lkey;

int ibv_dereg_mr(struct ibv_mr *mr)
{
    static int (*real_dereg)(struct ibv_mr *);

    if (real_dereg == NULL) {
        *(void **)&real_dereg = dlsym(RTLD_NEXT, "ibv_dereg_mr");
        cr_assert_not_null(real_dereg, "real ibv_dereg_mr not found: %s", dlerror());
    }
    num_dereg++;
    last_dereg_lkey = mr->lkey;
    return real_dereg(mr);
}

/* The cache's registration calls, as the verbs component makes them. */
static int fixture_reg(void *arg, uintptr_t start, uintptr_t end, void **handle_p)
{
    (void)arg;
    errno     = 0;
    *handle_p = ibv_reg_mr(pd, (void*)start, end - start, ACCESS);
    return (*handle_p != NULL) ? 0 : (errno != 0) ? errno : EIO;
}

static int fixture_dereg(void *arg, void *handle)
{
    (void)arg;
    return ibv_dereg_mr(handle);
}

/* ---- fixture -------------------------------------------------------------------------------- */

void open_device(void)
{
    struct ibv_device **list;
    int n = 0;

    list = ibv_get_device_list(&n);
    if ((list == NULL) || (n == 0)) {
        if (list != NULL) {
            ibv_free_device_list(list);
        }
        cr_skip_test("no RDMA device: run through contrib/rxe_guest");
    }
    ctx = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    cr_assert_not_null(ctx, "ibv_open_device failed");
    pd = ibv_alloc_pd(ctx);
    cr_assert_not_null(pd, "ibv_alloc_pd failed");

    buf = mmap(NULL, NPAGES * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(buf, MAP_FAILED, "mmap failed");
    memset(buf, 0x5a, NPAGES * page);
}

xfer_regcache_params_t cache_params(uint64_t max_entries, uint64_t max_bytes)
{
    return (xfer_regcache_params_t){
        .reg         = fixture_reg,
        .dereg       = fixture_dereg,
        .what        = "ibv_reg_mr",
        .max_entries = max_entries,
        .max_bytes   = max_bytes,
    };
}

void cache_open(uint64_t max_entries, uint64_t max_bytes)
{
    xfer_regcache_params_t params = cache_params(max_entries, max_bytes);

    open_device();
    cr_assert_eq(xfer_regcache_create(&params, &mrc), XFER_OK);
    if ((max_entries > 0) && (xfer_regcache_uncached_why(mrc) != NULL)) {
        cr_skip_test("the cache caches only with libucm's unmap reports: %s",
                     xfer_regcache_uncached_why(mrc));
    }
}

/* Before the test body, which sizes bounds in pages. */
void mrc_setup(void)
{
    page = (size_t)sysconf(_SC_PAGESIZE);
}

void mrc_teardown(void)
{
    xfer_regcache_destroy(mrc);
    mrc = NULL;
    if ((buf != NULL) && (buf != MAP_FAILED)) {
        munmap(buf, NPAGES * page);
    }
    if (pd != NULL) {
        ibv_dealloc_pd(pd);
    }
    if (ctx != NULL) {
        ibv_close_device(ctx);
    }
}

xfer_regcache_stats_t mrc_stats(void)
{
    xfer_regcache_stats_t st;

    memset(&st, 0xff, sizeof(st));
    xfer_regcache_stats(mrc, &st);
    return st;
}

/* Page p of the test buffer. */
char *pg(unsigned p)
{
    return buf + (size_t)p * page;
}

xfer_regcache_entry_t *get_ok(const void *addr, size_t length)
{
    xfer_regcache_entry_t *mr = NULL;
    xfer_status_t status = xfer_regcache_get(mrc, addr, length, &mr);

    cr_assert_eq(status, XFER_OK, "get(%p, %zu): %s", addr, length, xfer_status_string(status));
    cr_assert_not_null(mr);
    cr_assert_not_null(mr->handle);
    cr_assert_leq(mr->start, (uintptr_t)addr, "region starts after the buffer");
    cr_assert_geq(mr->end, (uintptr_t)addr + length, "region ends before the buffer");
    return mr;
}

/* get + put, and whether it hit. */
int touch(const void *addr, size_t length)
{
    uint64_t hits = mrc_stats().hits;
    xfer_regcache_entry_t *mr = get_ok(addr, length);

    xfer_regcache_put(mrc, mr);
    return mrc_stats().hits == hits + 1;
}

/*
 * Copy len bytes from src (lkey) to dst (rkey) with an RDMA WRITE on a queue pair connected to
 * itself, and wait for its completion: proof that the registrations are alive in the device.
 */
int rdma_write(const void *src, uint32_t lkey, void *dst, uint32_t rkey, uint32_t len)
{
    struct ibv_qp_init_attr init = { .qp_type = IBV_QPT_RC };
    struct ibv_qp_attr attr;
    struct ibv_port_attr port;
    struct ibv_sge sge = { .addr = (uintptr_t)src, .length = len, .lkey = lkey };
    struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
                              .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED };
    struct ibv_send_wr *bad;
    union ibv_gid gid;
    struct ibv_wc wc;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    int gid_index = -1, i, n = 0, ok;

    cr_assert_eq(ibv_query_port(ctx, 1, &port), 0);
    for (i = 0; (i < port.gid_tbl_len) && (gid_index < 0); i++) {
        if ((ibv_query_gid(ctx, 1, i, &gid) == 0) &&
            ((gid.global.subnet_prefix != 0) || (gid.global.interface_id != 0))) {
            gid_index = i;
        }
    }
    cr_assert_geq(gid_index, 0, "port 1 has no GID");
    cq = ibv_create_cq(ctx, 4, NULL, NULL, 0);
    cr_assert_not_null(cq);
    init.send_cq = init.recv_cq = cq;
    init.cap = (struct ibv_qp_cap){ .max_send_wr = 2, .max_recv_wr = 1, .max_send_sge = 1,
                                    .max_recv_sge = 1 };
    qp = ibv_create_qp(pd, &init);
    cr_assert_not_null(qp);

    memset(&attr, 0, sizeof(attr));
    attr.qp_state        = IBV_QPS_INIT;
    attr.port_num        = 1;
    attr.qp_access_flags = ACCESS;
    cr_assert_eq(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                               IBV_QP_ACCESS_FLAGS), 0);
    memset(&attr, 0, sizeof(attr));
    attr.qp_state              = IBV_QPS_RTR;
    attr.path_mtu              = IBV_MTU_1024;
    attr.dest_qp_num           = qp->qp_num;
    attr.max_dest_rd_atomic    = 1;
    attr.min_rnr_timer         = 12;
    attr.ah_attr.port_num      = 1;
    attr.ah_attr.dlid          = port.lid;
    attr.ah_attr.is_global     = 1;
    attr.ah_attr.grh.dgid      = gid;
    attr.ah_attr.grh.sgid_index = (uint8_t)gid_index;
    attr.ah_attr.grh.hop_limit = 1;
    cr_assert_eq(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                               IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                               IBV_QP_MIN_RNR_TIMER), 0);
    memset(&attr, 0, sizeof(attr));
    attr.qp_state      = IBV_QPS_RTS;
    attr.timeout       = 14;
    attr.retry_cnt     = 6;           /* rxe retries 7 forever */
    attr.rnr_retry     = 7;
    attr.max_rd_atomic = 1;
    cr_assert_eq(ibv_modify_qp(qp, &attr, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                               IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC), 0);

    wr.wr.rdma.remote_addr = (uintptr_t)dst;
    wr.wr.rdma.rkey        = rkey;
    cr_assert_eq(ibv_post_send(qp, &wr, &bad), 0);
    for (i = 0; (i < 10000) && (n == 0); i++) {   /* up to 10 s: the guest is emulated */
        n = ibv_poll_cq(cq, 1, &wc);
        if (n == 0) {
            usleep(1000);
        }
    }
    cr_assert_eq(n, 1, "no completion for the RDMA write");
    ok = (wc.status == IBV_WC_SUCCESS);
    if (!ok) {
        cr_log_warn("RDMA write completed with %s", ibv_wc_status_str(wc.status));
    }
    ibv_destroy_qp(qp);
    ibv_destroy_cq(cq);
    return ok;
}

/* The cache caches nothing: two gets of one buffer register twice, each put deregisters. */
void expect_uncached(void)
{
    xfer_regcache_entry_t *a = get_ok(pg(0), 100);
    xfer_regcache_entry_t *b = get_ok(pg(0), 100);
    xfer_regcache_stats_t st = mrc_stats();

    cr_expect_eq(st.misses, 2);
    cr_expect_eq(st.hits, 0);
    cr_expect_eq(st.entries, 0);
    cr_expect_eq(st.bytes, 0);
    cr_expect_neq(MR(a)->lkey, MR(b)->lkey);
    xfer_regcache_put(mrc, a);
    cr_expect_eq(num_dereg, 1u, "put did not free the uncached registration");
    xfer_regcache_put(mrc, b);
    cr_expect_eq(num_dereg, 2u);
}
