/*
 * The registration cache (framework/regcache.c), registering MRs as verbs does, against a real
 * RDMA device: hits and misses by address and length, merging, LRU eviction by entries and by
 * bytes, held entries surviving eviction and invalidation, caching off, and refused or failing
 * requests.
 * Its unmap reports are test_verbs_unmap.c's; the fixture is mrcache_fixture.h's.
 *
 * Needs an RDMA device; without one every test is skipped. make check runs it in a Soft-RoCE
 * guest (test/verbs_guest.sh); by hand, from the build directory:
 *   XFERTEST_TRANSPORT=verbs ../contrib/rxe_guest -- ../test/verbs_suites.sh . verbs_mrcache
 * (verbs_suites.sh gives Criterion the private /tmp it needs for its socket in the guest).
 */
#include "config.h"

#include "mrcache_fixture.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

TestSuite(verbs_mrcache, .init = mrc_setup, .fini = mrc_teardown);

/* ---- lookup --------------------------------------------------------------------------------- */

Test(verbs_mrcache, same_buffer_twice_registers_once)
{
    xfer_regcache_entry_t *a, *b;
    xfer_regcache_stats_t st;

    cache_open(16, 1 << 20);
    a = get_ok(pg(0) + 100, 200);
    b = get_ok(pg(0) + 100, 200);
    st = mrc_stats();
    cr_expect_eq(st.misses, 1);
    cr_expect_eq(st.hits, 1);
    cr_expect_eq(st.entries, 1);
    cr_expect_eq(st.bytes, page, "one page registered, got %llu bytes",
                 (unsigned long long)st.bytes);
    cr_expect_eq(a, b, "the hit returned another entry");
    cr_expect_eq(MR(a)->lkey, MR(b)->lkey);
    cr_expect_eq(a->start, (uintptr_t)pg(0), "registration not page aligned");
    cr_expect_eq(a->end, (uintptr_t)pg(1));
    xfer_regcache_put(mrc, a);
    xfer_regcache_put(mrc, b);
    cr_expect_eq(mrc_stats().entries, 1, "an unheld entry within bounds was dropped");
    cr_expect_eq(num_dereg, 0u);
    cr_expect(touch(pg(0) + 100, 200), "the entry is no longer found after put");
}

Test(verbs_mrcache, sub_range_hits)
{
    xfer_regcache_entry_t *whole, *part;

    cache_open(16, 1 << 20);
    whole = get_ok(pg(0), 3 * page);
    part  = get_ok(pg(1) + 10, 100);
    cr_expect_eq(mrc_stats().hits, 1);
    cr_expect_eq(part, whole);
    cr_expect(touch(pg(2) + page - 1, 1), "the last byte of the region missed");
    cr_expect(touch(pg(0), 3 * page), "the exact region missed");
    cr_expect_eq(mrc_stats().misses, 1);
    xfer_regcache_put(mrc, part);
    xfer_regcache_put(mrc, whole);
}

Test(verbs_mrcache, past_the_end_misses_and_merges)
{
    xfer_regcache_entry_t *first, *merged;
    xfer_regcache_stats_t st;
    uint32_t first_lkey;

    cache_open(16, 1 << 20);
    first = get_ok(pg(0), page);
    first_lkey = MR(first)->lkey;
    xfer_regcache_put(mrc, first);

    /* Starts inside the cached page, ends one byte into the next: a miss. */
    merged = get_ok(pg(0) + page - 10, 11);
    st = mrc_stats();
    cr_expect_eq(st.hits, 0, "a buffer running past the region's end hit");
    cr_expect_eq(st.misses, 2);
    cr_expect_eq(merged->start, (uintptr_t)pg(0), "the merge lost the old region");
    cr_expect_eq(merged->end, (uintptr_t)pg(2));
    cr_expect_eq(st.entries, 1, "the overlapped entry was not retired");
    cr_expect_eq(st.bytes, 2 * page);
    cr_expect_eq(num_dereg, 1u, "the unheld overlapped entry was not deregistered");
    cr_expect_eq(last_dereg_lkey, first_lkey);
    memcpy(pg(0), "merged", 7);
    cr_expect(rdma_write(pg(0), MR(merged)->lkey, pg(1) + 100, MR(merged)->rkey, 7),
              "the merged registration does not cover both pages");
    cr_expect_str_eq(pg(1) + 100, "merged");
    xfer_regcache_put(mrc, merged);

    cr_expect(touch(pg(0), 10), "the merged entry does not serve the old buffer");
    cr_expect(touch(pg(1) + 5, 10), "the merged entry does not serve the new buffer");
}

Test(verbs_mrcache, merge_spanning_two_entries_keeps_held_one_alive)
{
    xfer_regcache_entry_t *a, *b, *merged;
    uint32_t a_lkey;

    cache_open(16, 1 << 20);
    a = get_ok(pg(0), page);            /* stays held across the merge */
    a_lkey = MR(a)->lkey;
    b = get_ok(pg(2), page);
    xfer_regcache_put(mrc, b);
    cr_assert_eq(mrc_stats().entries, 2);

    merged = get_ok(pg(0) + 10, 2 * page);
    cr_expect_eq(merged->start, (uintptr_t)pg(0));
    cr_expect_eq(merged->end, (uintptr_t)pg(3), "the union of both entries was not registered");
    cr_expect_eq(mrc_stats().entries, 1);
    cr_expect_eq(num_dereg, 1u, "only the unheld entry may be deregistered by the merge");
    cr_expect_eq(MR(a)->lkey, a_lkey);

    xfer_regcache_put(mrc, a);
    cr_expect_eq(num_dereg, 2u, "the retired entry was not deregistered at its last put");
    cr_expect_eq(last_dereg_lkey, a_lkey);
    cr_expect_eq(mrc_stats().entries, 1);
    xfer_regcache_put(mrc, merged);
}

/* ---- eviction ------------------------------------------------------------------------------- */

Test(verbs_mrcache, evicts_lru_by_entries)
{
    xfer_regcache_stats_t st;

    cache_open(2, 1 << 20);
    touch(pg(0), 10);                    /* A */
    touch(pg(2), 10);                    /* B */
    cr_assert(touch(pg(0), 10));         /* A is now the most recently used */
    touch(pg(4), 10);                    /* C: over the bound, B goes */
    st = mrc_stats();
    cr_expect_eq(st.entries, 2);
    cr_expect_eq(st.evictions, 1);
    cr_expect_eq(num_dereg, 1u);
    cr_expect(touch(pg(0), 10), "A (recently used) was evicted");
    cr_expect(touch(pg(4), 10), "C (just added) was evicted");
    cr_expect(!touch(pg(2), 10), "B (least recently used) was kept");
}

Test(verbs_mrcache, evicts_lru_by_bytes)
{
    xfer_regcache_entry_t *c;
    xfer_regcache_stats_t st;

    cache_open(100, 2 * page);
    touch(pg(0), 10);                    /* A */
    touch(pg(2), 10);                    /* B */
    cr_assert(touch(pg(0), 10));         /* A is now the most recently used */
    c = get_ok(pg(4), 10);
    cr_expect_eq(mrc_stats().evictions, 0, "held bytes counted against max_bytes");
    xfer_regcache_put(mrc, c);          /* three unheld pages > two: B goes */
    st = mrc_stats();
    cr_expect_eq(st.evictions, 1);
    cr_expect_eq(st.entries, 2);
    cr_expect_eq(st.bytes, 2 * page);
    cr_expect(touch(pg(0), 10), "A (recently used) was evicted");
    cr_expect(touch(pg(4), 10), "C was evicted");
    cr_expect(!touch(pg(2), 10), "B (least recently used) was kept");
}

Test(verbs_mrcache, held_entries_are_never_evicted)
{
    xfer_regcache_entry_t *mr[4];
    uint32_t lkey[4];
    xfer_regcache_stats_t st;
    unsigned i;

    cache_open(2, 1 << 20);
    for (i = 0; i < 4; i++) {
        mr[i] = get_ok(pg(2 * i), 10);
        lkey[i] = MR(mr[i])->lkey;
    }
    st = mrc_stats();
    cr_expect_eq(st.entries, 4, "held entries must stay cached past the bound");
    cr_expect_eq(st.evictions, 0);
    cr_expect_eq(num_dereg, 0u);
    for (i = 0; i < 4; i++) {
        cr_expect_eq(MR(mr[i])->lkey, lkey[i]);
    }

    for (i = 0; i < 4; i++) {
        xfer_regcache_put(mrc, mr[i]);
    }
    st = mrc_stats();
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
    xfer_regcache_entry_t *a;
    uint32_t a_lkey;
    xfer_regcache_stats_t st;

    cache_open(16, 1 << 20);
    a = get_ok(pg(0), page);
    a_lkey = MR(a)->lkey;
    xfer_regcache_put(mrc, a);
    touch(pg(2), page);
    touch(pg(4), page);
    cr_assert_eq(mrc_stats().entries, 3);

    cr_expect_eq(xfer_regcache_invalidate(mrc, pg(0) + 100, 1), 1u);
    st = mrc_stats();
    cr_expect_eq(st.entries, 2);
    cr_expect_eq(st.invalidations, 1);
    cr_expect_eq(num_dereg, 1u);
    cr_expect_eq(last_dereg_lkey, a_lkey);
    cr_expect(!touch(pg(0), 10), "an invalidated entry was found");
    cr_expect(touch(pg(2), 10), "an entry outside the range was dropped");

    /* A range over two entries (A again, and B), and one over none. */
    cr_expect_eq(xfer_regcache_invalidate(mrc, pg(0) + 1, 3 * page), 2u);
    cr_expect_eq(xfer_regcache_invalidate(mrc, pg(7), page), 0u);
    cr_expect_eq(xfer_regcache_invalidate(mrc, pg(4), 0), 0u, "length 0 dropped something");
    st = mrc_stats();
    cr_expect_eq(st.entries, 1);
    cr_expect_eq(st.invalidations, 3);
    cr_expect(touch(pg(4), 10), "the entry a length-0 range names was dropped");
}

Test(verbs_mrcache, invalidate_held_defers_deregistration)
{
    xfer_regcache_entry_t *old, *fresh;
    struct ibv_mr *old_mr;
    uint32_t old_lkey;
    xfer_regcache_stats_t st;

    cache_open(16, 1 << 20);
    old = get_ok(pg(0), page);
    old_mr = MR(old);
    old_lkey = old_mr->lkey;

    cr_expect_eq(xfer_regcache_invalidate(mrc, pg(0), page), 1u);
    st = mrc_stats();
    cr_expect_eq(st.entries, 0, "the held entry is still in the lookup");
    cr_expect_eq(num_dereg, 0u, "a held registration was deregistered under its holder");
    cr_expect_eq(MR(old), old_mr);
    cr_expect_eq(MR(old)->lkey, old_lkey);
    memcpy(pg(0), "held", 5);
    cr_expect(rdma_write(pg(0), MR(old)->lkey, pg(0) + 2048, MR(old)->rkey, 5),
              "the invalidated but held registration no longer works");
    cr_expect_str_eq(pg(0) + 2048, "held");

    fresh = get_ok(pg(0), page);
    st = mrc_stats();
    cr_expect_eq(st.misses, 2, "the invalidated range hit");
    cr_expect_eq(st.hits, 0);
    cr_expect_neq(fresh, old);
    cr_expect_neq(MR(fresh)->lkey, old_lkey, "not a new registration");

    xfer_regcache_put(mrc, old);
    cr_expect_eq(num_dereg, 1u, "the invalidated entry was not freed by its last put");
    cr_expect_eq(last_dereg_lkey, old_lkey);
    xfer_regcache_put(mrc, fresh);
    cr_expect_eq(num_dereg, 1u, "the new entry should stay cached");
    cr_expect(touch(pg(0), 10));
}

/* ---- caching off, refused and failing requests, destroy ------------------------------------- */

Test(verbs_mrcache, caching_off_registers_every_time)
{
    cache_open(0, 1 << 20);
    expect_uncached();
    cr_expect_eq(xfer_regcache_invalidate(mrc, pg(0), page), 0u);
}

Test(verbs_mrcache, refuses_bad_requests)
{
    xfer_regcache_entry_t *mr = (xfer_regcache_entry_t *)0x1;
    xfer_regcache_params_t params = { .reg = NULL, .max_entries = 1 };
    xfer_regcache_t *other = (xfer_regcache_t *)0x1;

    cache_open(16, 1 << 20);
    cr_expect_eq(xfer_regcache_get(mrc, pg(0), 0, &mr), XFER_ERR_INVALID_PARAM);
    cr_expect_eq(mr, (xfer_regcache_entry_t *)0x1, "output set on failure");
    cr_expect_eq(xfer_regcache_get(mrc, NULL, 10, &mr), XFER_ERR_INVALID_PARAM);
    cr_expect_eq(xfer_regcache_get(mrc, pg(0), SIZE_MAX, &mr), XFER_ERR_INVALID_PARAM,
                 "a wrapping range was accepted");
    cr_expect_eq(xfer_regcache_get(mrc, pg(0), 10, NULL), XFER_ERR_INVALID_PARAM);
    cr_expect_eq(xfer_regcache_create(&params, &other), XFER_ERR_INVALID_PARAM);
    cr_expect_eq(other, (xfer_regcache_t *)0x1);
    cr_expect_eq(mrc_stats().misses, 0);
    cr_expect_eq(mrc_stats().entries, 0);
}

Test(verbs_mrcache, unmapped_memory_fails_cleanly)
{
    xfer_regcache_entry_t *mr = NULL;
    xfer_status_t status;
    char *hole;

    cache_open(16, 1 << 20);
    hole = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(hole, MAP_FAILED);
    cr_assert_eq(munmap(hole, page), 0);

    status = xfer_regcache_get(mrc, hole, 100, &mr);
    cr_expect_eq(status, XFER_ERR_INVALID_PARAM, "got %s", xfer_status_string(status));
    cr_expect_null(mr);
    cr_expect_eq(mrc_stats().entries, 0);
    cr_expect(!touch(pg(0), 10), "the cache does not work after a failed registration");
    cr_expect_eq(mrc_stats().entries, 1);
}

Test(verbs_mrcache, destroy_with_entries_held)
{
    cache_open(16, 1 << 20);
    get_ok(pg(0), 10);
    get_ok(pg(0), 20);                   /* the same entry, held twice */
    get_ok(pg(2), 10);
    touch(pg(4), 10);                    /* unheld */
    cr_assert_eq(xfer_regcache_invalidate(mrc, pg(2), 1), 1u);   /* held and detached */
    cr_assert_eq(num_dereg, 0u);

    xfer_regcache_destroy(mrc);
    mrc = NULL;
    cr_expect_eq(num_dereg, 3u, "destroy left registrations behind");
}
