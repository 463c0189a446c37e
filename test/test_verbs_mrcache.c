/*
 * The verbs memory-region cache (components/verbs/verbs_mrcache.c) against a real RDMA device:
 * hits and misses by address and length, merging, LRU eviction by entries and by bytes, held
 * entries surviving eviction and invalidation, caching off, and refused or failing requests;
 * and libucm's reports of unmapped memory (verbs_unmapq.c): entries over memory unmapped and
 * mapped again are dropped (held ones at their last put), a queue that overflowed drops
 * everything, several caches each get every report and stop getting them when destroyed, and
 * a cache that cannot have reports (UCX_MEM_EVENTS=no) caches nothing; and the component's
 * mr_cache attribute (xfer_info) under XFER_VERBS_MR_CACHE=auto and off.
 *
 * Needs an RDMA device; without one every test is skipped. make check runs it in a Soft-RoCE
 * guest (test/verbs_guest.sh); by hand, from the build directory:
 *   XFERTEST_TRANSPORT=verbs ../contrib/rxe_guest -- ../test/verbs_suites.sh . verbs_mrcache
 * (verbs_suites.sh gives Criterion the private /tmp it needs for its socket in the guest).
 *
 * Buffers are page-aligned anonymous mappings so that which pages a registration covers is
 * known exactly; entries the tests want kept apart are a page or more apart (touching regions
 * are not merged, overlapping ones are).
 *
 * This file defines ibv_dereg_mr, which wins over libibverbs' for the cache compiled into this
 * executable and forwards to the real one: the tests can then see exactly when (and which)
 * registration is released, which the stats (cached entries only) do not show for held or
 * uncached entries.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE   /* RTLD_NEXT */
#endif
#include "config.h"

#include "../components/verbs/verbs_mrcache.h"
#include "../components/verbs/verbs_unmapq.h"
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

#define ACCESS  (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)
#define NPAGES  32

static struct ibv_context *ctx;
static struct ibv_pd      *pd;
static xfer_verbs_mrc_t   *mrc;
static char               *buf;    /* NPAGES pages */
static size_t             page;

static unsigned num_dereg;         /* ibv_dereg_mr calls seen */
static uint32_t last_dereg_lkey;

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

/* ---- fixture -------------------------------------------------------------------------------- */

static void open_device(void)
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

static void cache_open(uint64_t max_entries, uint64_t max_bytes)
{
    xfer_verbs_mrc_params_t params;

    open_device();
    params = (xfer_verbs_mrc_params_t){
        .pd          = pd,
        .access      = ACCESS,
        .max_entries = max_entries,
        .max_bytes   = max_bytes,
    };
    cr_assert_eq(xfer_verbs_mrc_create(&params, &mrc), XFER_OK);
    if ((max_entries > 0) && (xfer_verbs_mrc_uncached_why(mrc) != NULL)) {
        cr_skip_test("the cache caches only with libucm's unmap reports: %s",
                     xfer_verbs_mrc_uncached_why(mrc));
    }
}

/* Before the test body, which sizes bounds in pages. */
static void setup(void)
{
    page = (size_t)sysconf(_SC_PAGESIZE);
}

static void teardown(void)
{
    xfer_verbs_mrc_destroy(mrc);
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

static xfer_verbs_mrc_stats_t stats(void)
{
    xfer_verbs_mrc_stats_t st;

    memset(&st, 0xff, sizeof(st));
    xfer_verbs_mrc_stats(mrc, &st);
    return st;
}

/* Page p of the test buffer. */
static char *pg(unsigned p)
{
    return buf + (size_t)p * page;
}

static xfer_verbs_mr_t *get_ok(const void *addr, size_t length)
{
    xfer_verbs_mr_t *mr = NULL;
    xfer_status_t status = xfer_verbs_mrc_get(mrc, addr, length, &mr);

    cr_assert_eq(status, XFER_OK, "get(%p, %zu): %s", addr, length, xfer_status_string(status));
    cr_assert_not_null(mr);
    cr_assert_not_null(mr->mr);
    cr_assert_leq(mr->start, (uintptr_t)addr, "region starts after the buffer");
    cr_assert_geq(mr->end, (uintptr_t)addr + length, "region ends before the buffer");
    return mr;
}

/* get + put, and whether it hit. */
static int touch(const void *addr, size_t length)
{
    uint64_t hits = stats().hits;
    xfer_verbs_mr_t *mr = get_ok(addr, length);

    xfer_verbs_mrc_put(mrc, mr);
    return stats().hits == hits + 1;
}

/*
 * Copy len bytes from src (lkey) to dst (rkey) with an RDMA WRITE on a queue pair connected to
 * itself, and wait for its completion: proof that the registrations are alive in the device.
 */
static int rdma_write(const void *src, uint32_t lkey, void *dst, uint32_t rkey, uint32_t len)
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

TestSuite(verbs_mrcache, .init = setup, .fini = teardown);

/* ---- lookup --------------------------------------------------------------------------------- */

Test(verbs_mrcache, same_buffer_twice_registers_once)
{
    xfer_verbs_mr_t *a, *b;
    xfer_verbs_mrc_stats_t st;

    cache_open(16, 1 << 20);
    a = get_ok(pg(0) + 100, 200);
    b = get_ok(pg(0) + 100, 200);
    st = stats();
    cr_expect_eq(st.misses, 1);
    cr_expect_eq(st.hits, 1);
    cr_expect_eq(st.entries, 1);
    cr_expect_eq(st.bytes, page, "one page registered, got %llu bytes",
                 (unsigned long long)st.bytes);
    cr_expect_eq(a, b, "the hit returned another entry");
    cr_expect_eq(a->mr->lkey, b->mr->lkey);
    cr_expect_eq(a->start, (uintptr_t)pg(0), "registration not page aligned");
    cr_expect_eq(a->end, (uintptr_t)pg(1));
    xfer_verbs_mrc_put(mrc, a);
    xfer_verbs_mrc_put(mrc, b);
    cr_expect_eq(stats().entries, 1, "an unheld entry within bounds was dropped");
    cr_expect_eq(num_dereg, 0u);
    cr_expect(touch(pg(0) + 100, 200), "the entry is no longer found after put");
}

Test(verbs_mrcache, sub_range_hits)
{
    xfer_verbs_mr_t *whole, *part;

    cache_open(16, 1 << 20);
    whole = get_ok(pg(0), 3 * page);
    part  = get_ok(pg(1) + 10, 100);
    cr_expect_eq(stats().hits, 1);
    cr_expect_eq(part, whole);
    cr_expect(touch(pg(2) + page - 1, 1), "the last byte of the region missed");
    cr_expect(touch(pg(0), 3 * page), "the exact region missed");
    cr_expect_eq(stats().misses, 1);
    xfer_verbs_mrc_put(mrc, part);
    xfer_verbs_mrc_put(mrc, whole);
}

Test(verbs_mrcache, past_the_end_misses_and_merges)
{
    xfer_verbs_mr_t *first, *merged;
    xfer_verbs_mrc_stats_t st;
    uint32_t first_lkey;

    cache_open(16, 1 << 20);
    first = get_ok(pg(0), page);
    first_lkey = first->mr->lkey;
    xfer_verbs_mrc_put(mrc, first);

    /* Starts inside the cached page, ends one byte into the next: a miss. */
    merged = get_ok(pg(0) + page - 10, 11);
    st = stats();
    cr_expect_eq(st.hits, 0, "a buffer running past the region's end hit");
    cr_expect_eq(st.misses, 2);
    cr_expect_eq(merged->start, (uintptr_t)pg(0), "the merge lost the old region");
    cr_expect_eq(merged->end, (uintptr_t)pg(2));
    cr_expect_eq(st.entries, 1, "the overlapped entry was not retired");
    cr_expect_eq(st.bytes, 2 * page);
    cr_expect_eq(num_dereg, 1u, "the unheld overlapped entry was not deregistered");
    cr_expect_eq(last_dereg_lkey, first_lkey);
    memcpy(pg(0), "merged", 7);
    cr_expect(rdma_write(pg(0), merged->mr->lkey, pg(1) + 100, merged->mr->rkey, 7),
              "the merged registration does not cover both pages");
    cr_expect_str_eq(pg(1) + 100, "merged");
    xfer_verbs_mrc_put(mrc, merged);

    cr_expect(touch(pg(0), 10), "the merged entry does not serve the old buffer");
    cr_expect(touch(pg(1) + 5, 10), "the merged entry does not serve the new buffer");
}

Test(verbs_mrcache, merge_spanning_two_entries_keeps_held_one_alive)
{
    xfer_verbs_mr_t *a, *b, *merged;
    uint32_t a_lkey;

    cache_open(16, 1 << 20);
    a = get_ok(pg(0), page);            /* stays held across the merge */
    a_lkey = a->mr->lkey;
    b = get_ok(pg(2), page);
    xfer_verbs_mrc_put(mrc, b);
    cr_assert_eq(stats().entries, 2);

    merged = get_ok(pg(0) + 10, 2 * page);
    cr_expect_eq(merged->start, (uintptr_t)pg(0));
    cr_expect_eq(merged->end, (uintptr_t)pg(3), "the union of both entries was not registered");
    cr_expect_eq(stats().entries, 1);
    cr_expect_eq(num_dereg, 1u, "only the unheld entry may be deregistered by the merge");
    cr_expect_eq(a->mr->lkey, a_lkey);

    xfer_verbs_mrc_put(mrc, a);
    cr_expect_eq(num_dereg, 2u, "the retired entry was not deregistered at its last put");
    cr_expect_eq(last_dereg_lkey, a_lkey);
    cr_expect_eq(stats().entries, 1);
    xfer_verbs_mrc_put(mrc, merged);
}

/* ---- eviction ------------------------------------------------------------------------------- */

Test(verbs_mrcache, evicts_lru_by_entries)
{
    xfer_verbs_mrc_stats_t st;

    cache_open(2, 1 << 20);
    touch(pg(0), 10);                    /* A */
    touch(pg(2), 10);                    /* B */
    cr_assert(touch(pg(0), 10));         /* A is now the most recently used */
    touch(pg(4), 10);                    /* C: over the bound, B goes */
    st = stats();
    cr_expect_eq(st.entries, 2);
    cr_expect_eq(st.evictions, 1);
    cr_expect_eq(num_dereg, 1u);
    cr_expect(touch(pg(0), 10), "A (recently used) was evicted");
    cr_expect(touch(pg(4), 10), "C (just added) was evicted");
    cr_expect(!touch(pg(2), 10), "B (least recently used) was kept");
}

Test(verbs_mrcache, evicts_lru_by_bytes)
{
    xfer_verbs_mr_t *c;
    xfer_verbs_mrc_stats_t st;

    cache_open(100, 2 * page);
    touch(pg(0), 10);                    /* A */
    touch(pg(2), 10);                    /* B */
    cr_assert(touch(pg(0), 10));         /* A is now the most recently used */
    c = get_ok(pg(4), 10);
    cr_expect_eq(stats().evictions, 0, "held bytes counted against max_bytes");
    xfer_verbs_mrc_put(mrc, c);          /* three unheld pages > two: B goes */
    st = stats();
    cr_expect_eq(st.evictions, 1);
    cr_expect_eq(st.entries, 2);
    cr_expect_eq(st.bytes, 2 * page);
    cr_expect(touch(pg(0), 10), "A (recently used) was evicted");
    cr_expect(touch(pg(4), 10), "C was evicted");
    cr_expect(!touch(pg(2), 10), "B (least recently used) was kept");
}

Test(verbs_mrcache, held_entries_are_never_evicted)
{
    xfer_verbs_mr_t *mr[4];
    uint32_t lkey[4];
    xfer_verbs_mrc_stats_t st;
    unsigned i;

    cache_open(2, 1 << 20);
    for (i = 0; i < 4; i++) {
        mr[i] = get_ok(pg(2 * i), 10);
        lkey[i] = mr[i]->mr->lkey;
    }
    st = stats();
    cr_expect_eq(st.entries, 4, "held entries must stay cached past the bound");
    cr_expect_eq(st.evictions, 0);
    cr_expect_eq(num_dereg, 0u);
    for (i = 0; i < 4; i++) {
        cr_expect_eq(mr[i]->mr->lkey, lkey[i]);
    }

    for (i = 0; i < 4; i++) {
        xfer_verbs_mrc_put(mrc, mr[i]);
    }
    st = stats();
    cr_expect_eq(st.entries, 2, "the bound was not restored once the entries were put");
    cr_expect_eq(st.evictions, 2);
    cr_expect_eq(num_dereg, 2u);
    cr_expect(touch(pg(4), 10), "the third entry (put after the first two) was evicted");
    cr_expect(touch(pg(6), 10), "the last entry put was evicted");
    cr_expect(!touch(pg(0), 10), "the first entry put was kept");
}

/* ---- invalidation --------------------------------------------------------------------------- */

Test(verbs_mrcache, invalidate_unheld_deregisters)
{
    xfer_verbs_mr_t *a;
    uint32_t a_lkey;
    xfer_verbs_mrc_stats_t st;

    cache_open(16, 1 << 20);
    a = get_ok(pg(0), page);
    a_lkey = a->mr->lkey;
    xfer_verbs_mrc_put(mrc, a);
    touch(pg(2), page);
    touch(pg(4), page);
    cr_assert_eq(stats().entries, 3);

    cr_expect_eq(xfer_verbs_mrc_invalidate(mrc, pg(0) + 100, 1), 1u);
    st = stats();
    cr_expect_eq(st.entries, 2);
    cr_expect_eq(st.invalidations, 1);
    cr_expect_eq(num_dereg, 1u);
    cr_expect_eq(last_dereg_lkey, a_lkey);
    cr_expect(!touch(pg(0), 10), "an invalidated entry was found");
    cr_expect(touch(pg(2), 10), "an entry outside the range was dropped");

    /* A range over two entries (A again, and B), and one over none. */
    cr_expect_eq(xfer_verbs_mrc_invalidate(mrc, pg(0) + 1, 3 * page), 2u);
    cr_expect_eq(xfer_verbs_mrc_invalidate(mrc, pg(7), page), 0u);
    cr_expect_eq(xfer_verbs_mrc_invalidate(mrc, pg(4), 0), 0u, "length 0 dropped something");
    st = stats();
    cr_expect_eq(st.entries, 1);
    cr_expect_eq(st.invalidations, 3);
    cr_expect(touch(pg(4), 10), "the entry a length-0 range names was dropped");
}

Test(verbs_mrcache, invalidate_held_defers_deregistration)
{
    xfer_verbs_mr_t *old, *fresh;
    struct ibv_mr *old_mr;
    uint32_t old_lkey;
    xfer_verbs_mrc_stats_t st;

    cache_open(16, 1 << 20);
    old = get_ok(pg(0), page);
    old_mr = old->mr;
    old_lkey = old_mr->lkey;

    cr_expect_eq(xfer_verbs_mrc_invalidate(mrc, pg(0), page), 1u);
    st = stats();
    cr_expect_eq(st.entries, 0, "the held entry is still in the lookup");
    cr_expect_eq(num_dereg, 0u, "a held registration was deregistered under its holder");
    cr_expect_eq(old->mr, old_mr);
    cr_expect_eq(old->mr->lkey, old_lkey);
    memcpy(pg(0), "held", 5);
    cr_expect(rdma_write(pg(0), old->mr->lkey, pg(0) + 2048, old->mr->rkey, 5),
              "the invalidated but held registration no longer works");
    cr_expect_str_eq(pg(0) + 2048, "held");

    fresh = get_ok(pg(0), page);
    st = stats();
    cr_expect_eq(st.misses, 2, "the invalidated range hit");
    cr_expect_eq(st.hits, 0);
    cr_expect_neq(fresh, old);
    cr_expect_neq(fresh->mr->lkey, old_lkey, "not a new registration");

    xfer_verbs_mrc_put(mrc, old);
    cr_expect_eq(num_dereg, 1u, "the invalidated entry was not freed by its last put");
    cr_expect_eq(last_dereg_lkey, old_lkey);
    xfer_verbs_mrc_put(mrc, fresh);
    cr_expect_eq(num_dereg, 1u, "the new entry should stay cached");
    cr_expect(touch(pg(0), 10));
}

/* ---- caching off, refused and failing requests, destroy ------------------------------------- */

/* The cache caches nothing: two gets of one buffer register twice, each put deregisters. */
static void expect_uncached(void)
{
    xfer_verbs_mr_t *a = get_ok(pg(0), 100);
    xfer_verbs_mr_t *b = get_ok(pg(0), 100);
    xfer_verbs_mrc_stats_t st = stats();

    cr_expect_eq(st.misses, 2);
    cr_expect_eq(st.hits, 0);
    cr_expect_eq(st.entries, 0);
    cr_expect_eq(st.bytes, 0);
    cr_expect_neq(a->mr->lkey, b->mr->lkey);
    xfer_verbs_mrc_put(mrc, a);
    cr_expect_eq(num_dereg, 1u, "put did not free the uncached registration");
    xfer_verbs_mrc_put(mrc, b);
    cr_expect_eq(num_dereg, 2u);
}

Test(verbs_mrcache, caching_off_registers_every_time)
{
    cache_open(0, 1 << 20);
    expect_uncached();
    cr_expect_eq(xfer_verbs_mrc_invalidate(mrc, pg(0), page), 0u);
}

Test(verbs_mrcache, refuses_bad_requests)
{
    xfer_verbs_mr_t *mr = (xfer_verbs_mr_t *)0x1;
    xfer_verbs_mrc_params_t params = { .pd = NULL, .access = ACCESS, .max_entries = 1 };
    xfer_verbs_mrc_t *other = (xfer_verbs_mrc_t *)0x1;

    cache_open(16, 1 << 20);
    cr_expect_eq(xfer_verbs_mrc_get(mrc, pg(0), 0, &mr), XFER_ERR_INVALID_PARAM);
    cr_expect_eq(mr, (xfer_verbs_mr_t *)0x1, "output set on failure");
    cr_expect_eq(xfer_verbs_mrc_get(mrc, NULL, 10, &mr), XFER_ERR_INVALID_PARAM);
    cr_expect_eq(xfer_verbs_mrc_get(mrc, pg(0), SIZE_MAX, &mr), XFER_ERR_INVALID_PARAM,
                 "a wrapping range was accepted");
    cr_expect_eq(xfer_verbs_mrc_get(mrc, pg(0), 10, NULL), XFER_ERR_INVALID_PARAM);
    cr_expect_eq(xfer_verbs_mrc_create(&params, &other), XFER_ERR_INVALID_PARAM);
    cr_expect_eq(other, (xfer_verbs_mrc_t *)0x1);
    cr_expect_eq(stats().misses, 0);
    cr_expect_eq(stats().entries, 0);
}

Test(verbs_mrcache, unmapped_memory_fails_cleanly)
{
    xfer_verbs_mr_t *mr = NULL;
    xfer_status_t status;
    char *hole;

    cache_open(16, 1 << 20);
    hole = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(hole, MAP_FAILED);
    cr_assert_eq(munmap(hole, page), 0);

    status = xfer_verbs_mrc_get(mrc, hole, 100, &mr);
    cr_expect_eq(status, XFER_ERR_INVALID_PARAM, "got %s", xfer_status_string(status));
    cr_expect_null(mr);
    cr_expect_eq(stats().entries, 0);
    cr_expect(!touch(pg(0), 10), "the cache does not work after a failed registration");
    cr_expect_eq(stats().entries, 1);
}

Test(verbs_mrcache, destroy_with_entries_held)
{
    cache_open(16, 1 << 20);
    get_ok(pg(0), 10);
    get_ok(pg(0), 20);                   /* the same entry, held twice */
    get_ok(pg(2), 10);
    touch(pg(4), 10);                    /* unheld */
    cr_assert_eq(xfer_verbs_mrc_invalidate(mrc, pg(2), 1), 1u);   /* held and detached */
    cr_assert_eq(num_dereg, 0u);

    xfer_verbs_mrc_destroy(mrc);
    mrc = NULL;
    cr_expect_eq(num_dereg, 3u, "destroy left registrations behind");
}

/* ---- unmap reports -------------------------------------------------------------------------- */

/* A fresh mapping of n pages at addr exactly (NULL: anywhere). */
static char *map_pages(void *addr, size_t n)
{
    char *p = mmap(addr, n * page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | ((addr != NULL) ? MAP_FIXED_NOREPLACE : 0), -1, 0);

    cr_assert_neq(p, MAP_FAILED, "mmap of %zu pages at %p: %s", n, addr, strerror(errno));
    cr_assert((addr == NULL) || (p == addr), "the kernel mapped %p instead of %p", (void *)p,
              addr);
    return p;
}

/* Copy "fresh" within m through mr with an RDMA WRITE: it lands in the pages mapped at m now
 * only if mr registered those pages. */
static void expect_registers_current_pages(char *m, xfer_verbs_mr_t *mr, const char *what)
{
    memset(m, 0, 2 * 64);
    memcpy(m, "fresh", 6);
    cr_expect(rdma_write(m, mr->mr->lkey, m + 64, mr->mr->rkey, 6), "%s: RDMA write failed",
              what);
    cr_expect_str_eq(m + 64, "fresh", "%s: the registration is of pages no longer mapped", what);
}

Test(verbs_mrcache, unmapped_and_mapped_again_misses)
{
    xfer_verbs_mr_t *mr;
    xfer_verbs_mrc_stats_t st;
    uint32_t old_lkey;
    char *m;

    cache_open(16, 1 << 20);
    m = map_pages(NULL, 4);
    mr = get_ok(m, 10);
    old_lkey = mr->mr->lkey;
    xfer_verbs_mrc_put(mrc, mr);
    cr_assert(touch(m + 5, 10));

    /* munmap, then new memory at the same address */
    cr_assert_eq(munmap(m, 4 * page), 0);
    cr_expect_eq(num_dereg, 0u, "deregistered inside munmap: the report must only be queued");
    map_pages(m, 4);
    mr = get_ok(m, 10);
    st = stats();
    cr_expect_eq(st.misses, 2, "the stale entry was found");
    cr_expect_geq(st.unmaps, 1);
    cr_expect_eq(st.invalidations, 1);
    cr_expect_eq(num_dereg, 1u);
    cr_expect_eq(last_dereg_lkey, old_lkey, "not the stale registration that went");
    expect_registers_current_pages(m, mr, "after munmap + mmap");
    old_lkey = mr->mr->lkey;
    xfer_verbs_mrc_put(mrc, mr);

    /* mmap MAP_FIXED over the entry's page: the kernel unmaps it first, and so must we */
    cr_assert_eq(mmap(m, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
                      -1, 0), (void *)m);
    mr = get_ok(m, 10);
    cr_expect_eq(stats().misses, 3, "the entry over the replaced page was found");
    cr_expect_eq(last_dereg_lkey, old_lkey);
    expect_registers_current_pages(m, mr, "after mmap MAP_FIXED over its page");
    xfer_verbs_mrc_put(mrc, mr);
    cr_expect(touch(m, 10), "the fresh entry is not found again");
    munmap(m, 4 * page);
}

Test(verbs_mrcache, unmap_of_a_held_entry_defers_its_deregistration)
{
    xfer_verbs_mr_t *old, *fresh;
    uint32_t old_lkey;
    char *m;

    cache_open(16, 1 << 20);
    m = map_pages(NULL, 2);
    old = get_ok(m, 2 * page);
    old_lkey = old->mr->lkey;
    cr_assert_eq(munmap(m, 2 * page), 0);
    map_pages(m, 2);

    fresh = get_ok(m, 100);
    cr_expect_neq(fresh, old, "the held stale entry was handed out again");
    cr_expect_eq(stats().invalidations, 1);
    cr_expect_eq(num_dereg, 0u, "a held registration was deregistered under its holder");
    cr_expect_eq(old->mr->lkey, old_lkey);
    expect_registers_current_pages(m, fresh, "the new entry");

    xfer_verbs_mrc_put(mrc, old);
    cr_expect_eq(num_dereg, 1u, "the invalidated entry was not freed by its last put");
    cr_expect_eq(last_dereg_lkey, old_lkey);
    xfer_verbs_mrc_put(mrc, fresh);
    cr_expect_eq(num_dereg, 1u);
    cr_expect(touch(m, 10), "the new entry is not cached");
    munmap(m, 2 * page);
}

/* More separate unmapped ranges between two looks than the queue holds: every entry goes. */
Test(verbs_mrcache, lost_reports_drop_every_entry)
{
    const size_t n = XFER_VERBS_UNMAPQ_LEN + 8;
    xfer_verbs_mr_t *held, *mr;
    xfer_verbs_mrc_stats_t st;
    uint32_t held_lkey;
    char *holes;

    cache_open(16, 1 << 20);
    held = get_ok(pg(0), 10);
    held_lkey = held->mr->lkey;
    touch(pg(2), 10);
    touch(pg(4), 10);
    cr_assert_eq(stats().entries, 3);

    /* every other page of a fresh mapping: n ranges that cannot merge */
    holes = map_pages(NULL, 2 * n);
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(munmap(holes + 2 * i * page, page), 0);
    }
    mr = get_ok(pg(6), 10);
    st = stats();
    cr_expect_eq(st.flushes, 1, "the overflow was not noticed");
    cr_expect_eq(st.entries, 1, "entries survived lost reports");
    cr_expect_eq(num_dereg, 2u, "the unheld entries were not deregistered");
    cr_expect_eq(held->mr->lkey, held_lkey);
    xfer_verbs_mrc_put(mrc, held);
    cr_expect_eq(num_dereg, 3u, "the held entry was not deregistered at its put");
    xfer_verbs_mrc_put(mrc, mr);

    /* and the cache goes on */
    cr_expect(!touch(pg(0), 10), "a dropped entry was found");
    cr_expect(touch(pg(0), 10));
    cr_expect(touch(pg(6), 10), "the entry made after the overflow was dropped");
    for (size_t i = 0; i < n; i++) {
        munmap(holes + (2 * i + 1) * page, page);
    }
}

/* Two caches (two ifaces) in one process: each gets every report; a destroyed one none. */
Test(verbs_mrcache, every_cache_gets_the_reports_until_destroyed)
{
    xfer_verbs_mrc_params_t params = { .access = ACCESS, .max_entries = 16, .max_bytes = 1 << 20 };
    xfer_verbs_mrc_t *other;
    xfer_verbs_mrc_stats_t st;
    xfer_verbs_mr_t *mr;
    char *m;

    cache_open(16, 1 << 20);
    params.pd = pd;
    cr_assert_eq(xfer_verbs_mrc_create(&params, &other), XFER_OK);
    m = map_pages(NULL, 1);
    cr_assert(!touch(m, 10));
    cr_assert_eq(xfer_verbs_mrc_get(other, m, 10, &mr), XFER_OK);
    xfer_verbs_mrc_put(other, mr);
    cr_assert_eq(munmap(m, page), 0);
    map_pages(m, 1);

    cr_expect(!touch(m, 10), "the first cache kept its stale entry");
    cr_assert_eq(xfer_verbs_mrc_get(other, m, 10, &mr), XFER_OK);
    xfer_verbs_mrc_stats(other, &st);
    cr_expect_eq(st.misses, 2, "the second cache kept its stale entry");
    cr_expect_eq(st.invalidations, 1);
    xfer_verbs_mrc_put(other, mr);

    /* destroyed: unmapping must not run into the freed cache (ASan and valgrind would say) */
    xfer_verbs_mrc_destroy(other);
    cr_assert_eq(munmap(m, page), 0);
    cr_expect(!touch(map_pages(m, 1), 10), "the remaining cache missed the report");
    munmap(m, page);
}

Test(verbs_mrcache, no_reports_with_memory_events_off_caches_nothing)
{
#ifdef HAVE_UCM
    ucm_global_config_t saved = ucm_global_opts, off = ucm_global_opts;
    xfer_verbs_mrc_params_t params;

    open_device();
    off.enable_events = 0;              /* what UCX_MEM_EVENTS=no sets */
    ucm_set_global_opts(&off);
    params = (xfer_verbs_mrc_params_t){ .pd = pd, .access = ACCESS, .max_entries = 16,
                                        .max_bytes = 1 << 20 };
    cr_assert_eq(xfer_verbs_mrc_create(&params, &mrc), XFER_OK);
    ucm_set_global_opts(&saved);
    cr_assert_not_null(xfer_verbs_mrc_uncached_why(mrc), "a cache without reports caches");
    cr_expect(strstr(xfer_verbs_mrc_uncached_why(mrc), "UCX_MEM_EVENTS=no") != NULL,
              "the reason does not name the cause: %s", xfer_verbs_mrc_uncached_why(mrc));
    expect_uncached();
#else
    cr_skip_test("built without libucm");
#endif
}

/* Under a memory checker's allocator the reports miss the heap, and the component is told. */
Test(verbs_mrcache, reports_are_incomplete_under_a_memory_checker)
{
    char why[XFER_REASON_MAX] = "";
    int complete = xfer_verbs_unmapq_complete(why, sizeof(why));

    if (tu_malloc_is_checkers()) {
        cr_expect(!complete, "a memory checker's malloc() went unnoticed");
        cr_expect(strstr(why, "malloc()") != NULL, "reason: %s", why);
    } else {
        cr_expect(complete, "the reports were called incomplete: %s", why);
    }
}

/* ---- what the component says ---------------------------------------------------------------- */

/* The verbs ports' mr_cache attribute (xfer_info), under the current environment. */
static char *mr_cache_attr(void)
{
    xfer_component_info_t info;
    xfer_context_t *xctx = NULL;
    const char *value;
    char *copy;

    cr_assert_eq(tu_context(0, &xctx), XFER_OK);
    cr_assert(tu_component(xctx, "verbs", NULL, &info), "no verbs component");
    cr_assert_eq(info.state, XFER_COMPONENT_AVAILABLE, "verbs: %s", info.reason);
    value = tu_device_attr(&info, "mr_cache");
    cr_assert_not_null(value, "the verbs port has no mr_cache attribute");
    copy = strdup(value);
    xfer_context_destroy(xctx);
    return copy;
}

Test(verbs_mrcache, xfer_info_says_whether_the_component_caches)
{
    char *auto_value, *off_value;

    open_device();                      /* skips without an RDMA device */
    unsetenv("XFER_VERBS_MR_CACHE");
    auto_value = mr_cache_attr();
    if (tu_malloc_is_checkers()) {
        cr_expect(strstr(auto_value, "off") == auto_value, "auto: %s", auto_value);
        cr_expect(strstr(auto_value, "malloc()") != NULL, "auto: %s", auto_value);
    } else {
        cr_expect(strstr(auto_value, "on") == auto_value, "auto: %s", auto_value);
    }
    setenv("XFER_VERBS_MR_CACHE", "off", 1);
    off_value = mr_cache_attr();
    cr_expect_str_eq(off_value, "off (registered per operation): XFER_VERBS_MR_CACHE=off");
    unsetenv("XFER_VERBS_MR_CACHE");
#ifdef HAVE_UCM
    {
        ucm_global_config_t saved = ucm_global_opts, off = ucm_global_opts;
        char *no_events;

        off.enable_events = 0;
        ucm_set_global_opts(&off);
        no_events = mr_cache_attr();
        ucm_set_global_opts(&saved);
        if (!tu_malloc_is_checkers()) {
            cr_expect(strstr(no_events, "UCX_MEM_EVENTS=no") != NULL, "%s", no_events);
        }
        free(no_events);
    }
#endif
    free(auto_value);
    free(off_value);
}
