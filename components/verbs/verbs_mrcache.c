/*
 * The verbs memory-region cache (contract in verbs_mrcache.h).
 *
 * Design. Cached registrations are page-aligned, non-overlapping ranges kept in libucs's page
 * table (ucs_pgtable: a radix tree over addresses), so a lookup is one descent for the address
 * of the buffer and a hit is "the region holding the first byte also holds the last one". A
 * miss that overlaps cached regions registers their union with the request (as UCX's rcache
 * merges) and retires the overlapped regions: the page table cannot hold overlapping ranges,
 * and the union serves every buffer the old regions served.
 *
 * Every entry sits on exactly one list: lru (cached, nobody holds it; the head is the least
 * recently put), inuse (cached and held) or detached (held but out of the lookup: invalidated
 * or merged away while in use, or registered with caching off). A detached entry is
 * deregistered when its last holder puts it; only lru entries are ever evicted, so a region is
 * never deregistered under an operation in flight.
 *
 * Why not ucs_rcache (UCX 1.13): ucs_rcache_create() always registers a libucm event handler
 * (libucm then patches mmap/munmap in the process), it learns about freed memory only through
 * those hooks and offers no "invalidate this address range" call (only one region at a time),
 * its byte bound counts held regions too, and its optional PFN check ends in ucs_fatal(). The
 * contract here needs exact range invalidation driven by the user, a byte bound on unheld
 * entries only, no hooks in the process and no abort; its page table alone fits.
 *
 * ucs_pgtable calls ucs_fatal() if its directory allocator returns NULL. A library must not
 * abort, so directories come from a reserve that is topped up (with a failure we can report)
 * before each insertion, and holds enough for the worst case of one insertion.
 */
#include "config.h"

#include "verbs_mrcache.h"

#include <xfer/component.h>

#include <ucs/datastruct/list.h>
#include <ucs/datastruct/pgtable.h>

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MRC_SUBSYS "verbs"

/*
 * Directories one insertion can need: a contiguous range partly covers at most two aligned
 * blocks per level of the tree, and the tree has (address bits - 4) / 4 levels.
 */
#define MRC_PGT_LEVELS     ((UCS_PGT_ADDR_ORDER - UCS_PGT_ADDR_SHIFT) / UCS_PGT_ENTRY_SHIFT)
#define MRC_DIR_RESERVE    (2 * MRC_PGT_LEVELS + 2)
#define MRC_DIR_SPARE_MAX  (4 * MRC_DIR_RESERVE)   /* released directories kept for reuse */

typedef struct mrc_entry {
    ucs_pgt_region_t region;     /* the page table's key: [start, end), page aligned */
    xfer_verbs_mr_t  pub;        /* what get() hands out */
    ucs_list_link_t  link;       /* on mrc->lru, mrc->inuse or mrc->detached */
    ucs_list_link_t  scratch;    /* on a list built by collect() */
    unsigned         holders;
    int              cached;     /* in the page table */
} mrc_entry_t;

/* A spare page-table directory, linked through its own storage. */
typedef struct mrc_spare_dir {
    struct mrc_spare_dir *next;
} mrc_spare_dir_t;

struct xfer_verbs_mrc {
    ucs_pgtable_t           pgtable;
    xfer_verbs_mrc_params_t params;
    uintptr_t               page_size;
    ucs_list_link_t         lru;
    ucs_list_link_t         inuse;
    ucs_list_link_t         detached;
    uint64_t                unheld_bytes;   /* bytes of the lru entries */
    xfer_verbs_mrc_stats_t  stats;
    mrc_spare_dir_t         *spare;
    unsigned                num_spare;
};

static xfer_verbs_mrc_t *mrc_of_pgtable(const ucs_pgtable_t *pgtable)
{
    return ucs_container_of(pgtable, xfer_verbs_mrc_t, pgtable);
}

/* ---- page-table directories ----------------------------------------------------------------- */

static ucs_pgt_dir_t *dir_alloc(const ucs_pgtable_t *pgtable)
{
    xfer_verbs_mrc_t *mrc = mrc_of_pgtable(pgtable);
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
    xfer_verbs_mrc_t *mrc = mrc_of_pgtable(pgtable);
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
static int dirs_reserve(xfer_verbs_mrc_t *mrc)
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

static void dirs_free(xfer_verbs_mrc_t *mrc)
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

static void entry_free(mrc_entry_t *entry)
{
    if (ibv_dereg_mr(entry->pub.mr) != 0) {
        /* The memory may stay pinned, but the entry is gone either way: nothing can retry. */
        xfer_log(XFER_LOG_WARN, MRC_SUBSYS, "ibv_dereg_mr of [0x%" PRIxPTR ", 0x%" PRIxPTR
                 "): %s", entry->pub.start, entry->pub.end, strerror(errno));
    }
    free(entry);
}

/* Take a cached entry out of the lookup; deregister it now unless someone holds it. */
static void entry_uncache(xfer_verbs_mrc_t *mrc, mrc_entry_t *entry)
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
        entry_free(entry);
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
static void collect(xfer_verbs_mrc_t *mrc, uintptr_t start, uintptr_t end,
                    ucs_list_link_t *found)
{
    ucs_list_head_init(found);
    ucs_pgtable_search_range(&mrc->pgtable, start, end - 1, collect_cb, found);
}

/* Evict least recently used unheld entries while over either bound. */
static void trim(xfer_verbs_mrc_t *mrc)
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

/* ---- registration --------------------------------------------------------------------------- */

/* EFAULT: the range is not mapped (or not accessible as asked); the rest is lack of resources
 * (pinned-memory limit, device tables) or a provider failure. */
static xfer_status_t status_of_errno(int err)
{
    return ((err == EFAULT) || (err == EINVAL)) ? XFER_ERR_INVALID_PARAM : XFER_ERR_NO_RESOURCE;
}

/* Returns 0 or the errno of the failed ibv_reg_mr. */
static int register_range(xfer_verbs_mrc_t *mrc, uintptr_t start, uintptr_t end,
                          struct ibv_mr **mr_p)
{
    struct ibv_mr *mr;

    errno = 0;
    mr = ibv_reg_mr(mrc->params.pd, (void *)start, end - start, mrc->params.access);
    if (mr == NULL) {
        return (errno != 0) ? errno : EIO;   /* a provider that forgot to set errno */
    }
    *mr_p = mr;
    return 0;
}

/*
 * Register [start, end) grown to pages and to every cached region it overlaps. If the union
 * cannot be registered (an overlapped region's memory may have been unmapped without being
 * invalidated), fall back to the request's own pages.
 */
static xfer_status_t register_miss(xfer_verbs_mrc_t *mrc, uintptr_t start, uintptr_t end,
                                   int cacheable, ucs_list_link_t *found, mrc_entry_t *entry)
{
    uintptr_t mask  = mrc->page_size - 1;
    uintptr_t first = start & ~mask;
    uintptr_t last  = (end + mask) & ~mask;
    uintptr_t mfirst = first, mlast = last;
    mrc_entry_t *old;
    struct ibv_mr *mr = NULL;
    int err;

    ucs_list_head_init(found);
    if (cacheable) {
        collect(mrc, first, last, found);
        ucs_list_for_each(old, found, scratch) {
            mfirst = (old->region.start < mfirst) ? old->region.start : mfirst;
            mlast  = (old->region.end > mlast) ? old->region.end : mlast;
        }
    }

    err = register_range(mrc, mfirst, mlast, &mr);
    if ((err != 0) && ((mfirst != first) || (mlast != last))) {
        xfer_log_at(XFER_LOG_DEBUG, MRC_SUBSYS, "registering merged range [0x%" PRIxPTR
                    ", 0x%" PRIxPTR "): %s; registering the request alone", mfirst, mlast,
                    strerror(err));
        mfirst = first;
        mlast  = last;
        err    = register_range(mrc, mfirst, mlast, &mr);
    }
    if (err != 0) {
        xfer_log(XFER_LOG_ERROR, MRC_SUBSYS, "ibv_reg_mr of [0x%" PRIxPTR ", 0x%" PRIxPTR
                 ") (buffer [0x%" PRIxPTR ", 0x%" PRIxPTR "), access 0x%x): %s", mfirst, mlast,
                 start, end, (unsigned)mrc->params.access, strerror(err));
        return status_of_errno(err);
    }

    entry->region.start = mfirst;
    entry->region.end   = mlast;
    entry->pub.mr       = mr;
    entry->pub.start    = mfirst;
    entry->pub.end      = mlast;
    entry->holders      = 1;
    return XFER_OK;
}

/* Put a new, held entry into the lookup, or keep it detached when it cannot be cached. */
static void entry_add(xfer_verbs_mrc_t *mrc, mrc_entry_t *entry, int cacheable)
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

xfer_status_t xfer_verbs_mrc_create(const xfer_verbs_mrc_params_t *params,
                                    xfer_verbs_mrc_t **mrc_p)
{
    xfer_verbs_mrc_t *mrc;
    long page_size;
    ucs_status_t status;

    if ((params == NULL) || (params->pd == NULL) || (mrc_p == NULL)) {
        xfer_log(XFER_LOG_ERROR, MRC_SUBSYS, "mrc_create: no parameters or no protection "
                 "domain given");
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
        xfer_log(XFER_LOG_ERROR, MRC_SUBSYS, "mrc_create: page table: %s",
                 ucs_status_string(status));
        free(mrc);
        return XFER_ERR_NO_MEMORY;
    }
    *mrc_p = mrc;
    return XFER_OK;
}

static unsigned free_list(xfer_verbs_mrc_t *mrc, ucs_list_link_t *list)
{
    mrc_entry_t *entry, *tmp;
    unsigned n = 0;

    ucs_list_for_each_safe(entry, tmp, list, link) {
        if (entry->cached) {
            ucs_pgtable_remove(&mrc->pgtable, &entry->region);
        }
        ucs_list_del(&entry->link);
        entry_free(entry);
        n++;
    }
    return n;
}

void xfer_verbs_mrc_destroy(xfer_verbs_mrc_t *mrc)
{
    unsigned held;

    if (mrc == NULL) {
        return;
    }
    held = free_list(mrc, &mrc->inuse) + free_list(mrc, &mrc->detached);
    if (held > 0) {
        xfer_log(XFER_LOG_WARN, MRC_SUBSYS, "mrc_destroy: %u memory region(s) still held; "
                 "deregistered anyway", held);
    }
    free_list(mrc, &mrc->lru);
    ucs_pgtable_cleanup(&mrc->pgtable);
    dirs_free(mrc);
    free(mrc);
}

xfer_status_t xfer_verbs_mrc_get(xfer_verbs_mrc_t *mrc, const void *addr, size_t length,
                                 xfer_verbs_mr_t **mr_p)
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
        xfer_log(XFER_LOG_ERROR, MRC_SUBSYS, "mrc_get: invalid buffer %p length %zu", addr,
                 length);
        return XFER_ERR_INVALID_PARAM;
    }
    end       = start + length;
    cacheable = (mrc->params.max_entries > 0);

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
        xfer_log(XFER_LOG_WARN, MRC_SUBSYS, "mrc_get: out of memory for the lookup; "
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

void xfer_verbs_mrc_put(xfer_verbs_mrc_t *mrc, xfer_verbs_mr_t *mr)
{
    mrc_entry_t *entry;

    if ((mrc == NULL) || (mr == NULL)) {
        return;
    }
    entry = ucs_container_of(mr, mrc_entry_t, pub);
    if (entry->holders == 0) {
        xfer_log(XFER_LOG_ERROR, MRC_SUBSYS, "mrc_put: region [0x%" PRIxPTR ", 0x%" PRIxPTR
                 ") is not held", mr->start, mr->end);
        return;
    }
    if (--entry->holders > 0) {
        return;
    }

    ucs_list_del(&entry->link);
    if (!entry->cached) {
        entry_free(entry);
        return;
    }
    ucs_list_add_tail(&mrc->lru, &entry->link);
    mrc->unheld_bytes += entry_bytes(entry);
    trim(mrc);
}

unsigned xfer_verbs_mrc_invalidate(xfer_verbs_mrc_t *mrc, const void *addr, size_t length)
{
    uintptr_t start = (uintptr_t)addr;
    uintptr_t end;
    ucs_list_link_t found;
    mrc_entry_t *entry, *tmp;
    unsigned n = 0;

    if ((mrc == NULL) || (length == 0)) {
        return 0;
    }
    end = (length > UINTPTR_MAX - start) ? UINTPTR_MAX : start + length;

    collect(mrc, start, end, &found);
    ucs_list_for_each_safe(entry, tmp, &found, scratch) {
        xfer_log_at(XFER_LOG_DEBUG, MRC_SUBSYS, "invalidate [0x%" PRIxPTR ", 0x%" PRIxPTR
                    ")%s", entry->pub.start, entry->pub.end,
                    (entry->holders > 0) ? " (held: deregistered at its last put)" : "");
        entry_uncache(mrc, entry);
        mrc->stats.invalidations++;
        n++;
    }
    return n;
}

void xfer_verbs_mrc_stats(const xfer_verbs_mrc_t *mrc, xfer_verbs_mrc_stats_t *stats)
{
    if ((mrc == NULL) || (stats == NULL)) {
        return;
    }
    *stats = mrc->stats;
}
