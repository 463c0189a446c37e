/*
 * The registration cache (contract in xfer/regcache.h).
 *
 * What is at stake. A transport such as verbs registers buffers the user never registered: the
 * source of a tag send or of a tensor published without a copy, the destination of a receive
 * or of a fetch. A registration pins the pages mapped at its addresses when it is made. If the
 * program unmaps them (munmap, or free() of a block malloc() had mapped on its own) and later
 * gets other memory at the same address, an entry found by address would make the device move
 * the old pages: data from or into memory the program no longer owns. So entries are kept only
 * while libucm reports every unmapping in the process (unmapq.c), and every get() and
 * put() first drops the entries that overlap the ranges reported since the last look. Without
 * those reports the cache caches nothing: each get registers, each put deregisters.
 *
 * Why a report always comes first. libucm runs the handler inside munmap() (and its kin)
 * before the system call, and the range is in the queue when the handler returns. Other memory
 * can be mapped at that address only after the system call, and a buffer in it can reach get()
 * only after it was mapped; so the get() that looks that buffer up takes the range from the
 * queue first and drops the stale entry before the lookup. A range reported while a get() is
 * registering (another thread unmapping a buffer still in use, a bug of the program) is taken
 * by the next get() or put() and drops what was registered, as it should.
 *
 * Structure. Cached registrations are page-aligned, non-overlapping ranges kept in libucs's
 * page table (ucs_pgtable: a radix tree over addresses), so a lookup is one descent for the
 * address of the buffer and a hit is "the region holding the first byte also holds the last
 * one". A miss that overlaps cached regions registers their union with the request (as UCX's
 * rcache merges) and retires the overlapped regions: the page table cannot hold overlapping
 * ranges, and the union serves every buffer the old regions served.
 *
 * Every entry sits on exactly one list: lru (cached, nobody holds it; the head is the least
 * recently put), inuse (cached and held) or detached (held but out of the lookup: invalidated
 * or merged away while in use, or registered uncached). A detached entry is deregistered when
 * its last holder puts it; only lru entries are ever evicted, so a region is never
 * deregistered under an operation in flight.
 *
 * Why not ucs_rcache (UCX 1.13), which also learns of unmaps from libucm: ucs_rcache_create()
 * fails when the reports cannot be had, where this cache must keep working uncached; it offers
 * no "invalidate this address range" call for the user's deregistrations (only one region at
 * a time); its byte bound counts held regions too; and its optional PFN check ends in
 * ucs_fatal(). Its page table alone fits.
 *
 * ucs_pgtable calls ucs_fatal() if its directory allocator returns NULL. A library must not
 * abort, so directories come from a reserve that is topped up (with a failure we can report)
 * before each insertion, and holds enough for the worst case of one insertion.
 */
#include "config.h"

#include "xfer_int.h"

#include <ucs/datastruct/list.h>
#include <ucs/datastruct/pgtable.h>

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MRC_SUBSYS "regcache"

/*
 * Directories one insertion can need: a contiguous range partly covers at most two aligned
 * blocks per level of the tree, and the tree has (address bits - 4) / 4 levels.
 */
#define MRC_PGT_LEVELS     ((UCS_PGT_ADDR_ORDER - UCS_PGT_ADDR_SHIFT) / UCS_PGT_ENTRY_SHIFT)
#define MRC_DIR_RESERVE    (2 * MRC_PGT_LEVELS + 2)
#define MRC_DIR_SPARE_MAX  (4 * MRC_DIR_RESERVE)   /* released directories kept for reuse */

typedef struct mrc_entry {
    ucs_pgt_region_t region;     /* the page table's key: [start, end), page aligned */
    xfer_regcache_entry_t pub;        /* what get() hands out */
    ucs_list_link_t  link;       /* on mrc->lru, mrc->inuse or mrc->detached */
    ucs_list_link_t  scratch;    /* on a list built by collect() */
    unsigned         holders;
    int              cached;     /* in the page table */
} mrc_entry_t;

/* A spare page-table directory, linked through its own storage. */
typedef struct mrc_spare_dir {
    struct mrc_spare_dir *next;
} mrc_spare_dir_t;

struct xfer_regcache {
    ucs_pgtable_t          pgtable;
    xfer_regcache_params_t params;
    uintptr_t              page_size;
    ucs_list_link_t        lru;
    ucs_list_link_t        inuse;
    ucs_list_link_t        detached;
    uint64_t               unheld_bytes;   /* bytes of the lru entries */
    xfer_regcache_stats_t  stats;
    mrc_spare_dir_t        *spare;
    unsigned               num_spare;
    xfer_unmapq_t          *unmapq;        /* NULL: caching nothing */
    char                   uncached_why[XFER_REASON_MAX];
    char                   what[64];       /* params.what, for the log */
};

static xfer_regcache_t *mrc_of_pgtable(const ucs_pgtable_t *pgtable)
{
    return ucs_container_of(pgtable, xfer_regcache_t, pgtable);
}

/* ---- page-table directories ----------------------------------------------------------------- */

static ucs_pgt_dir_t *dir_alloc(const ucs_pgtable_t *pgtable)
{
    xfer_regcache_t *mrc = mrc_of_pgtable(pgtable);
    mrc_spare_dir_t *spare = mrc->spare;
    void *dir;

    if (spare != NULL) {
        mrc->spare = spare->next;
        mrc->num_spare--;
        return (ucs_pgt_dir_t *)spare;
    }
    /* Not reached when the reserve bound holds; still better than NULL (ucs_fatal). */
    if (posix_memalign(&dir, 16, sizeof(ucs_pgt_dir_t)) != 0) {
        return NULL;
    }
    return dir;
}

static void dir_release(const ucs_pgtable_t *pgtable, ucs_pgt_dir_t *dir)
{
    xfer_regcache_t *mrc = mrc_of_pgtable(pgtable);
    mrc_spare_dir_t *spare = (mrc_spare_dir_t *)dir;

    if (mrc->num_spare >= MRC_DIR_SPARE_MAX) {
        free(dir);
        return;
    }
    spare->next = mrc->spare;
    mrc->spare  = spare;
    mrc->num_spare++;
}

/* Make sure the next insertion cannot run out of directories. */
static int dirs_reserve(xfer_regcache_t *mrc)
{
    mrc_spare_dir_t *spare;
    void *dir;

    while (mrc->num_spare < MRC_DIR_RESERVE) {
        if (posix_memalign(&dir, 16, sizeof(ucs_pgt_dir_t)) != 0) {
            return 0;
        }
        spare       = dir;
        spare->next = mrc->spare;
        mrc->spare  = spare;
        mrc->num_spare++;
    }
    return 1;
}

static void dirs_free(xfer_regcache_t *mrc)
{
    mrc_spare_dir_t *spare;

    while ((spare = mrc->spare) != NULL) {
        mrc->spare = spare->next;
        free(spare);
    }
    mrc->num_spare = 0;
}

/* ---- entries -------------------------------------------------------------------------------- */

static uint64_t entry_bytes(const mrc_entry_t *entry)
{
    return entry->region.end - entry->region.start;
}

static void entry_free(xfer_regcache_t *mrc, mrc_entry_t *entry)
{
    int err = mrc->params.dereg(mrc->params.arg, entry->pub.handle);

    if (err != 0) {
        /* The memory may stay pinned, but the entry is gone either way: nothing can retry. */
        xfer_log(XFER_LOG_WARN, MRC_SUBSYS, "releasing %s of [0x%" PRIxPTR ", 0x%" PRIxPTR
                 "): %s", mrc->what, entry->pub.start, entry->pub.end, strerror(err));
    }
    free(entry);
}

/* Take a cached entry out of the lookup; deregister it now unless someone holds it. */
static void entry_uncache(xfer_regcache_t *mrc, mrc_entry_t *entry)
{
    if (ucs_pgtable_remove(&mrc->pgtable, &entry->region) != UCS_OK) {
        xfer_log(XFER_LOG_WARN, MRC_SUBSYS, "cached region [0x%" PRIxPTR ", 0x%" PRIxPTR
                 ") was missing from the page table", entry->pub.start, entry->pub.end);
    }
    entry->cached = 0;
    mrc->stats.entries--;
    mrc->stats.bytes -= entry_bytes(entry);
    ucs_list_del(&entry->link);
    if (entry->holders == 0) {
        mrc->unheld_bytes -= entry_bytes(entry);
        entry_free(mrc, entry);
    } else {
        ucs_list_add_tail(&mrc->detached, &entry->link);
    }
}

static void collect_cb(const ucs_pgtable_t *pgtable, ucs_pgt_region_t *region, void *arg)
{
    mrc_entry_t *entry = ucs_container_of(region, mrc_entry_t, region);

    (void)pgtable;
    ucs_list_add_tail((ucs_list_link_t *)arg, &entry->scratch);
}

/* Gather the cached entries overlapping [start, end) on 'found' (end > start). */
static void collect(xfer_regcache_t *mrc, uintptr_t start, uintptr_t end,
                    ucs_list_link_t *found)
{
    ucs_list_head_init(found);
    ucs_pgtable_search_range(&mrc->pgtable, start, end - 1, collect_cb, found);
}

/* Evict least recently used unheld entries while over either bound. */
static void trim(xfer_regcache_t *mrc)
{
    mrc_entry_t *victim;

    while (!ucs_list_is_empty(&mrc->lru) &&
           ((mrc->stats.entries > mrc->params.max_entries) ||
            (mrc->unheld_bytes > mrc->params.max_bytes))) {
        victim = ucs_list_head(&mrc->lru, mrc_entry_t, link);
        xfer_log_at(XFER_LOG_DEBUG, MRC_SUBSYS, "evict [0x%" PRIxPTR ", 0x%" PRIxPTR ")",
                    victim->pub.start, victim->pub.end);
        entry_uncache(mrc, victim);
        mrc->stats.evictions++;
    }
}

/* Drop the cached entries overlapping [start, end) (end > start); returns how many. */
static unsigned invalidate_range(xfer_regcache_t *mrc, uintptr_t start, uintptr_t end,
                                 const char *why)
{
    ucs_list_link_t found;
    mrc_entry_t *entry, *tmp;
    unsigned n = 0;

    collect(mrc, start, end, &found);
    ucs_list_for_each_safe(entry, tmp, &found, scratch) {
        xfer_log_at(XFER_LOG_DEBUG, MRC_SUBSYS, "invalidate [0x%" PRIxPTR ", 0x%" PRIxPTR
                    ") (%s)%s", entry->pub.start, entry->pub.end, why,
                    (entry->holders > 0) ? ", held: deregistered at its last put" : "");
        entry_uncache(mrc, entry);
        mrc->stats.invalidations++;
        n++;
    }
    return n;
}

/* Take every entry out of the lookup. */
static void uncache_all(xfer_regcache_t *mrc)
{
    mrc_entry_t *entry, *tmp;

    ucs_list_for_each_safe(entry, tmp, &mrc->lru, link) {
        entry_uncache(mrc, entry);
        mrc->stats.invalidations++;
    }
    ucs_list_for_each_safe(entry, tmp, &mrc->inuse, link) {
        entry_uncache(mrc, entry);
        mrc->stats.invalidations++;
    }
}

/*
 * Drop the entries over memory unmapped since the last look (why this is in time: the top of
 * this file). Whatever this frees or deregisters may unmap in turn; those reports are queued
 * apart from the ranges being read here and are taken the next time.
 */
static void unmaps_apply(xfer_regcache_t *mrc)
{
    const xfer_unmap_range_t *ranges;
    unsigned n;
    int lost;

    if (mrc->unmapq == NULL) {
        return;
    }
    n = xfer_unmapq_take(mrc->unmapq, &ranges, &lost);
    mrc->stats.unmaps += n;
    if (lost) {
        xfer_log_at(XFER_LOG_DEBUG, MRC_SUBSYS, "more than %u unmapped ranges since the last "
                    "look: dropping all %" PRIu64 " cached registrations",
                    XFER_UNMAPQ_LEN, mrc->stats.entries);
        uncache_all(mrc);
        mrc->stats.flushes++;
        return;
    }
    for (unsigned i = 0; i < n; i++) {
        invalidate_range(mrc, ranges[i].start, ranges[i].end, "unmapped");
    }
}

/* ---- registration --------------------------------------------------------------------------- */

/* EFAULT: the range is not mapped (or not accessible as asked); the rest is lack of resources
 * (pinned-memory limit, device tables) or a provider failure. */
static xfer_status_t status_of_errno(int err)
{
    return ((err == EFAULT) || (err == EINVAL)) ? XFER_ERR_INVALID_PARAM : XFER_ERR_NO_RESOURCE;
}

/* Returns 0 or the errno of the failed registration. */
static int register_range(xfer_regcache_t *mrc, uintptr_t start, uintptr_t end,
                          void **handle_p)
{
    int err = mrc->params.reg(mrc->params.arg, start, end, handle_p);

    return ((err == 0) && (*handle_p == NULL)) ? EIO : err;
}

/*
 * Register [start, end) grown to pages and to every cached region it overlaps. If the union
 * cannot be registered (an overlapped region's memory may have been unmapped since the
 * reports were last taken), fall back to the request's own pages.
 */
static xfer_status_t register_miss(xfer_regcache_t *mrc, uintptr_t start, uintptr_t end,
                                   int cacheable, ucs_list_link_t *found, mrc_entry_t *entry)
{
    uintptr_t mask  = mrc->page_size - 1;
    uintptr_t first = start & ~mask;
    uintptr_t last  = (end + mask) & ~mask;
    uintptr_t mfirst = first, mlast = last;
    mrc_entry_t *old;
    void *handle = NULL;
    int err;

    ucs_list_head_init(found);
    if (cacheable) {
        collect(mrc, first, last, found);
        ucs_list_for_each(old, found, scratch) {
            mfirst = (old->region.start < mfirst) ? old->region.start : mfirst;
            mlast  = (old->region.end > mlast) ? old->region.end : mlast;
        }
    }

    err = register_range(mrc, mfirst, mlast, &handle);
    if ((err != 0) && ((mfirst != first) || (mlast != last))) {
        xfer_log_at(XFER_LOG_DEBUG, MRC_SUBSYS, "registering merged range [0x%" PRIxPTR
                    ", 0x%" PRIxPTR "): %s; registering the request alone", mfirst, mlast,
                    strerror(err));
        mfirst = first;
        mlast  = last;
        err    = register_range(mrc, mfirst, mlast, &handle);
    }
    if (err != 0) {
        xfer_log(XFER_LOG_ERROR, MRC_SUBSYS, "%s of [0x%" PRIxPTR ", 0x%" PRIxPTR ") (buffer "
                 "[0x%" PRIxPTR ", 0x%" PRIxPTR ")): %s", mrc->what, mfirst, mlast,
                 start, end, strerror(err));
        return status_of_errno(err);
    }

    entry->region.start = mfirst;
    entry->region.end   = mlast;
    entry->pub.handle   = handle;
    entry->pub.start    = mfirst;
    entry->pub.end      = mlast;
    entry->holders      = 1;
    return XFER_OK;
}

/* Put a new, held entry into the lookup, or keep it detached when it cannot be cached. */
static void entry_add(xfer_regcache_t *mrc, mrc_entry_t *entry, int cacheable)
{
    ucs_status_t status;

    if (cacheable) {
        status = ucs_pgtable_insert(&mrc->pgtable, &entry->region);
        if (status == UCS_OK) {
            entry->cached = 1;
            mrc->stats.entries++;
            mrc->stats.bytes += entry_bytes(entry);
            ucs_list_add_tail(&mrc->inuse, &entry->link);
            return;
        }
        xfer_log(XFER_LOG_WARN, MRC_SUBSYS, "caching [0x%" PRIxPTR ", 0x%" PRIxPTR "): %s; "
                 "it will be deregistered when put", entry->pub.start, entry->pub.end,
                 ucs_status_string(status));
    }
    entry->cached = 0;
    ucs_list_add_tail(&mrc->detached, &entry->link);
}

/* ---- API ------------------------------------------------------------------------------------ */

xfer_status_t xfer_regcache_create(const xfer_regcache_params_t *params,
                                    xfer_regcache_t **mrc_p)
{
    xfer_regcache_t *mrc;
    long page_size;
    ucs_status_t status;

    if ((params == NULL) || (params->reg == NULL) || (params->dereg == NULL) ||
        (mrc_p == NULL)) {
        xfer_log(XFER_LOG_ERROR, MRC_SUBSYS, "regcache_create: no parameters or no "
                 "registration calls given");
        return XFER_ERR_INVALID_PARAM;
    }
    page_size = sysconf(_SC_PAGESIZE);
    if ((page_size < (long)UCS_PGT_ADDR_ALIGN) || ((page_size & (page_size - 1)) != 0)) {
        page_size = 4096;   /* the page table needs 16-byte-aligned, power-of-two bounds */
    }

    mrc = calloc(1, sizeof(*mrc));
    if (mrc == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    mrc->params    = *params;
    mrc->page_size = (uintptr_t)page_size;
    ucs_list_head_init(&mrc->lru);
    ucs_list_head_init(&mrc->inuse);
    ucs_list_head_init(&mrc->detached);
    status = ucs_pgtable_init(&mrc->pgtable, dir_alloc, dir_release);
    if (status != UCS_OK) {
        xfer_log(XFER_LOG_ERROR, MRC_SUBSYS, "regcache_create: page table: %s",
                 ucs_status_string(status));
        free(mrc);
        return XFER_ERR_NO_MEMORY;
    }
    snprintf(mrc->what, sizeof(mrc->what), "%s", (params->what != NULL) ? params->what :
             "registration");
    if (params->max_entries == 0) {
        xfer_reason_set(mrc->uncached_why, sizeof(mrc->uncached_why), "max_entries is 0");
    } else if (xfer_unmapq_create(&mrc->unmapq, mrc->uncached_why,
                                        sizeof(mrc->uncached_why)) != XFER_OK) {
        mrc->unmapq = NULL;
    }
    *mrc_p = mrc;
    return XFER_OK;
}

static unsigned free_list(xfer_regcache_t *mrc, ucs_list_link_t *list)
{
    mrc_entry_t *entry, *tmp;
    unsigned n = 0;

    ucs_list_for_each_safe(entry, tmp, list, link) {
        if (entry->cached) {
            ucs_pgtable_remove(&mrc->pgtable, &entry->region);
        }
        ucs_list_del(&entry->link);
        entry_free(mrc, entry);
        n++;
    }
    return n;
}

void xfer_regcache_destroy(xfer_regcache_t *mrc)
{
    unsigned held;

    if (mrc == NULL) {
        return;
    }
    /* First: what is freed below may unmap, and no report may run into a freed cache. */
    xfer_unmapq_destroy(mrc->unmapq);
    mrc->unmapq = NULL;
    held = free_list(mrc, &mrc->inuse) + free_list(mrc, &mrc->detached);
    if (held > 0) {
        xfer_log(XFER_LOG_WARN, MRC_SUBSYS, "regcache_destroy: %u memory region(s) still held; "
                 "deregistered anyway", held);
    }
    free_list(mrc, &mrc->lru);
    ucs_pgtable_cleanup(&mrc->pgtable);
    dirs_free(mrc);
    free(mrc);
}

xfer_status_t xfer_regcache_get(xfer_regcache_t *mrc, const void *addr, size_t length,
                                 xfer_regcache_entry_t **mr_p)
{
    uintptr_t start = (uintptr_t)addr;
    uintptr_t end;
    ucs_pgt_region_t *region;
    ucs_list_link_t found;
    mrc_entry_t *entry, *old, *tmp;
    xfer_status_t status;
    int cacheable;

    /* The range, rounded up to pages, must not wrap around the address space. */
    if ((mrc == NULL) || (mr_p == NULL) || (addr == NULL) || (length == 0) ||
        (start > UINTPTR_MAX - mrc->page_size) ||
        (length > UINTPTR_MAX - mrc->page_size - start)) {
        xfer_log(XFER_LOG_ERROR, MRC_SUBSYS, "regcache_get: invalid buffer %p length %zu", addr,
                 length);
        return XFER_ERR_INVALID_PARAM;
    }
    end       = start + length;
    cacheable = (mrc->unmapq != NULL);
    unmaps_apply(mrc);

    if (cacheable) {
        region = ucs_pgtable_lookup(&mrc->pgtable, start);
        if ((region != NULL) && (region->end >= end)) {
            entry = ucs_container_of(region, mrc_entry_t, region);
            if (entry->holders++ == 0) {
                ucs_list_del(&entry->link);
                ucs_list_add_tail(&mrc->inuse, &entry->link);
                mrc->unheld_bytes -= entry_bytes(entry);
            }
            mrc->stats.hits++;
            *mr_p = &entry->pub;
            return XFER_OK;
        }
    }
    mrc->stats.misses++;

    entry = calloc(1, sizeof(*entry));
    if (entry == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    /* Without spare directories the insertion could abort inside libucs: register uncached. */
    if (cacheable && !dirs_reserve(mrc)) {
        xfer_log(XFER_LOG_WARN, MRC_SUBSYS, "regcache_get: out of memory for the lookup; "
                 "registering [0x%" PRIxPTR ", 0x%" PRIxPTR ") uncached", start, end);
        cacheable = 0;
    }

    status = register_miss(mrc, start, end, cacheable, &found, entry);
    if (status != XFER_OK) {
        free(entry);
        return status;
    }
    ucs_list_for_each_safe(old, tmp, &found, scratch) {
        entry_uncache(mrc, old);
    }
    entry_add(mrc, entry, cacheable);
    trim(mrc);
    *mr_p = &entry->pub;
    return XFER_OK;
}

void xfer_regcache_put(xfer_regcache_t *mrc, xfer_regcache_entry_t *mr)
{
    mrc_entry_t *entry;

    if ((mrc == NULL) || (mr == NULL)) {
        return;
    }
    entry = ucs_container_of(mr, mrc_entry_t, pub);
    if (entry->holders == 0) {
        xfer_log(XFER_LOG_ERROR, MRC_SUBSYS, "regcache_put: region [0x%" PRIxPTR ", 0x%" PRIxPTR
                 ") is not held", mr->start, mr->end);
        return;
    }
    unmaps_apply(mrc);      /* unpins unmapped pages early; may detach this very entry */
    if (--entry->holders > 0) {
        return;
    }

    ucs_list_del(&entry->link);
    if (!entry->cached) {
        entry_free(mrc, entry);
        return;
    }
    ucs_list_add_tail(&mrc->lru, &entry->link);
    mrc->unheld_bytes += entry_bytes(entry);
    trim(mrc);
}

unsigned xfer_regcache_invalidate(xfer_regcache_t *mrc, const void *addr, size_t length)
{
    uintptr_t start = (uintptr_t)addr;
    uintptr_t end;

    if ((mrc == NULL) || (length == 0)) {
        return 0;
    }
    end = (length > UINTPTR_MAX - start) ? UINTPTR_MAX : start + length;
    return invalidate_range(mrc, start, end, "deregistered");
}

const char *xfer_regcache_uncached_why(const xfer_regcache_t *mrc)
{
    return ((mrc == NULL) || (mrc->unmapq != NULL)) ? NULL : mrc->uncached_why;
}

void xfer_regcache_stats(const xfer_regcache_t *mrc, xfer_regcache_stats_t *stats)
{
    if ((mrc == NULL) || (stats == NULL)) {
        return;
    }
    *stats = mrc->stats;
}
