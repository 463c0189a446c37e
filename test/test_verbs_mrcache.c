/*
 * The verbs memory-region cache (components/verbs/verbs_mrcache.c) against a real RDMA device:
 * hits and misses by address and length, merging, LRU eviction by entries and by bytes, held
 * entries surviving eviction and invalidation, caching off, and refused or failing requests.
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
#include "../components/verbs/verbs_mrcache.h"

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

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

Test(verbs_mrcache, caching_off_registers_every_time)
{
    xfer_verbs_mr_t *a, *b;
    xfer_verbs_mrc_stats_t st;

    cache_open(0, 1 << 20);
    a = get_ok(pg(0), 100);
    b = get_ok(pg(0), 100);
    st = stats();
    cr_expect_eq(st.misses, 2);
    cr_expect_eq(st.hits, 0);
    cr_expect_eq(st.entries, 0);
    cr_expect_eq(st.bytes, 0);
    cr_expect_neq(a->mr->lkey, b->mr->lkey);
    xfer_verbs_mrc_put(mrc, a);
    cr_expect_eq(num_dereg, 1u, "put did not free the uncached registration");
    xfer_verbs_mrc_put(mrc, b);
    cr_expect_eq(num_dereg, 2u);
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
