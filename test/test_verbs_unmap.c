/*
 * The registration cache and libucm's reports of unmapped memory (framework/unmapq.c)
 * against a real RDMA device: entries over memory unmapped and mapped again are dropped (held
 * ones at their last put), a queue that overflowed drops everything, several caches each get
 * every report and stop getting them when destroyed, a cache that cannot have reports
 * (UCX_MEM_EVENTS=no) caches nothing; and the component's mr_cache attribute (xfer_info) under
 * XFER_VERBS_MR_CACHE=auto and off. The fixture is mrcache_fixture.h's.
 *
 * Needs an RDMA device; without one every test is skipped. make check runs it in the
 * Soft-RoCE guest (test/verbs_guest.sh); by hand, from the build directory:
 *   XFERTEST_TRANSPORT=verbs ../contrib/rxe_guest -- ../test/verbs_suites.sh . verbs_unmap
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "config.h"

#include "mrcache_fixture.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifdef HAVE_UCM
#include <ucm/api/ucm.h>
#endif

TestSuite(verbs_unmap, .init = mrc_setup, .fini = mrc_teardown);

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
static void expect_registers_current_pages(char *m, xfer_regcache_entry_t *mr, const char *what)
{
    memset(m, 0, 2 * 64);
    memcpy(m, "fresh", 6);
    cr_expect(rdma_write(m, MR(mr)->lkey, m + 64, MR(mr)->rkey, 6), "%s: RDMA write failed",
              what);
    cr_expect_str_eq(m + 64, "fresh", "%s: the registration is of pages no longer mapped", what);
}

Test(verbs_unmap, unmapped_and_mapped_again_misses)
{
    xfer_regcache_entry_t *mr;
    xfer_regcache_stats_t st;
    uint32_t old_lkey;
    char *m;

    cache_open(16, 1 << 20);
    m = map_pages(NULL, 4);
    mr = get_ok(m, 10);
    old_lkey = MR(mr)->lkey;
    xfer_regcache_put(mrc, mr);
    cr_assert(touch(m + 5, 10));

    /* munmap, then new memory at the same address */
    cr_assert_eq(munmap(m, 4 * page), 0);
    cr_expect_eq(num_dereg, 0u, "deregistered inside munmap: the report must only be queued");
    map_pages(m, 4);
    mr = get_ok(m, 10);
    st = mrc_stats();
    cr_expect_eq(st.misses, 2, "the stale entry was found");
    cr_expect_geq(st.unmaps, 1);
    cr_expect_eq(st.invalidations, 1);
    cr_expect_eq(num_dereg, 1u);
    cr_expect_eq(last_dereg_lkey, old_lkey, "not the stale registration that went");
    expect_registers_current_pages(m, mr, "after munmap + mmap");
    old_lkey = MR(mr)->lkey;
    xfer_regcache_put(mrc, mr);

    /* mmap MAP_FIXED over the entry's page: the kernel unmaps it first, and so must we */
    cr_assert_eq(mmap(m, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
                      -1, 0), (void *)m);
    mr = get_ok(m, 10);
    cr_expect_eq(mrc_stats().misses, 3, "the entry over the replaced page was found");
    cr_expect_eq(last_dereg_lkey, old_lkey);
    expect_registers_current_pages(m, mr, "after mmap MAP_FIXED over its page");
    xfer_regcache_put(mrc, mr);
    cr_expect(touch(m, 10), "the fresh entry is not found again");
    munmap(m, 4 * page);
}

Test(verbs_unmap, unmap_of_a_held_entry_defers_its_deregistration)
{
    xfer_regcache_entry_t *old, *fresh;
    uint32_t old_lkey;
    char *m;

    cache_open(16, 1 << 20);
    m = map_pages(NULL, 2);
    old = get_ok(m, 2 * page);
    old_lkey = MR(old)->lkey;
    cr_assert_eq(munmap(m, 2 * page), 0);
    map_pages(m, 2);

    fresh = get_ok(m, 100);
    cr_expect_neq(fresh, old, "the held stale entry was handed out again");
    cr_expect_eq(mrc_stats().invalidations, 1);
    cr_expect_eq(num_dereg, 0u, "a held registration was deregistered under its holder");
    cr_expect_eq(MR(old)->lkey, old_lkey);
    expect_registers_current_pages(m, fresh, "the new entry");

    xfer_regcache_put(mrc, old);
    cr_expect_eq(num_dereg, 1u, "the invalidated entry was not freed by its last put");
    cr_expect_eq(last_dereg_lkey, old_lkey);
    xfer_regcache_put(mrc, fresh);
    cr_expect_eq(num_dereg, 1u);
    cr_expect(touch(m, 10), "the new entry is not cached");
    munmap(m, 2 * page);
}

/* More separate unmapped ranges between two looks than the queue holds: every entry goes. */
Test(verbs_unmap, lost_reports_drop_every_entry)
{
    const size_t n = XFER_UNMAPQ_LEN + 8;
    xfer_regcache_entry_t *held, *mr;
    xfer_regcache_stats_t st;
    uint32_t held_lkey;
    char *holes;

    cache_open(16, 1 << 20);
    held = get_ok(pg(0), 10);
    held_lkey = MR(held)->lkey;
    touch(pg(2), 10);
    touch(pg(4), 10);
    cr_assert_eq(mrc_stats().entries, 3);

    /* every other page of a fresh mapping: n ranges that cannot merge */
    holes = map_pages(NULL, 2 * n);
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(munmap(holes + 2 * i * page, page), 0);
    }
    mr = get_ok(pg(6), 10);
    st = mrc_stats();
    cr_expect_eq(st.flushes, 1, "the overflow was not noticed");
    cr_expect_eq(st.entries, 1, "entries survived lost reports");
    cr_expect_eq(num_dereg, 2u, "the unheld entries were not deregistered");
    cr_expect_eq(MR(held)->lkey, held_lkey);
    xfer_regcache_put(mrc, held);
    cr_expect_eq(num_dereg, 3u, "the held entry was not deregistered at its put");
    xfer_regcache_put(mrc, mr);

    /* and the cache goes on */
    cr_expect(!touch(pg(0), 10), "a dropped entry was found");
    cr_expect(touch(pg(0), 10));
    cr_expect(touch(pg(6), 10), "the entry made after the overflow was dropped");
    for (size_t i = 0; i < n; i++) {
        munmap(holes + (2 * i + 1) * page, page);
    }
}

/* Two caches (two ifaces) in one process: each gets every report; a destroyed one none. */
Test(verbs_unmap, every_cache_gets_the_reports_until_destroyed)
{
    xfer_regcache_params_t params = cache_params(16, 1 << 20);
    xfer_regcache_t *other;
    xfer_regcache_stats_t st;
    xfer_regcache_entry_t *mr;
    char *m;

    cache_open(16, 1 << 20);
    cr_assert_eq(xfer_regcache_create(&params, &other), XFER_OK);
    m = map_pages(NULL, 1);
    cr_assert(!touch(m, 10));
    cr_assert_eq(xfer_regcache_get(other, m, 10, &mr), XFER_OK);
    xfer_regcache_put(other, mr);
    cr_assert_eq(munmap(m, page), 0);
    map_pages(m, 1);

    cr_expect(!touch(m, 10), "the first cache kept its stale entry");
    cr_assert_eq(xfer_regcache_get(other, m, 10, &mr), XFER_OK);
    xfer_regcache_stats(other, &st);
    cr_expect_eq(st.misses, 2, "the second cache kept its stale entry");
    cr_expect_eq(st.invalidations, 1);
    xfer_regcache_put(other, mr);

    /* destroyed: unmapping must not run into the freed cache (ASan and valgrind would say) */
    xfer_regcache_destroy(other);
    cr_assert_eq(munmap(m, page), 0);
    cr_expect(!touch(map_pages(m, 1), 10), "the remaining cache missed the report");
    munmap(m, page);
}

Test(verbs_unmap, no_reports_with_memory_events_off_caches_nothing)
{
#ifdef HAVE_UCM
    ucm_global_config_t saved = ucm_global_opts, off = ucm_global_opts;
    xfer_regcache_params_t params;

    open_device();
    off.enable_events = 0;              /* what UCX_MEM_EVENTS=no sets */
    ucm_set_global_opts(&off);
    params = cache_params(16, 1 << 20);
    cr_assert_eq(xfer_regcache_create(&params, &mrc), XFER_OK);
    ucm_set_global_opts(&saved);
    cr_assert_not_null(xfer_regcache_uncached_why(mrc), "a cache without reports caches");
    cr_expect(strstr(xfer_regcache_uncached_why(mrc), "UCX_MEM_EVENTS=no") != NULL,
              "the reason does not name the cause: %s", xfer_regcache_uncached_why(mrc));
    expect_uncached();
#else
    cr_skip_test("built without libucm");
#endif
}

/* Under a memory checker's allocator the reports miss the heap, and the component is told. */
Test(verbs_unmap, reports_are_incomplete_under_a_memory_checker)
{
    char why[XFER_REASON_MAX] = "";
    int complete = xfer_unmapq_complete(why, sizeof(why));

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

Test(verbs_unmap, xfer_info_says_whether_the_component_caches)
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
