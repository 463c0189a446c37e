/*
 * The registration cache (framework/regcache.c) and the unmap reports it rests on
 * (framework/unmapq.c): what a transport whose device must register memory (verbs, gdr) uses
 * to find a registration again by address and length, the way UCX's rcache and libfabric's
 * MR cache serve their transports. Included by engine.h.
 *
 * A lookup hits only when one cached region covers the whole [addr, addr + length); a buffer
 * that runs past a region's end is a miss, and a miss registers (page-aligned, merged with the
 * cached regions it overlaps). The cache is bounded by entries and by registered bytes; past
 * either bound, entries nobody holds are evicted least recently used first. Entries in use
 * (held by an operation in flight) are never evicted or deregistered under it.
 *
 * Invalidation: every entry overlapping memory the process unmaps is dropped before the next
 * lookup (libucm reports the unmapping, below), and xfer_regcache_invalidate() drops every
 * entry that overlaps a range the user deregistered. Entries still held are taken out of the
 * lookup at once and deregistered when their last holder puts them.
 *
 * Without unmap reports the cache caches nothing (every get registers, every put
 * deregisters): xfer_regcache_uncached_why() says why.
 *
 * Not thread-safe: the transport is serialised by the framework.
 */
#ifndef XFER_REGCACHE_H
#define XFER_REGCACHE_H

#ifndef XFER_ENGINE_H
#error "include <xfer/component.h>, which includes this"
#endif

typedef struct xfer_regcache xfer_regcache_t;

/* How the transport registers: reg pins [start, end) for its device and returns the
 * registration in *handle_p - 0, or the errno that refused it (EFAULT or EINVAL: the range
 * is not mapped or not accessible as asked; anything else: a lack of resources); dereg
 * releases one (0, or an errno for the log). what names them in log lines ("ibv_reg_mr with
 * access 0x7"). */
typedef struct xfer_regcache_params {
    int         (*reg)(void *arg, uintptr_t start, uintptr_t end, void **handle_p);
    int         (*dereg)(void *arg, void *handle);
    void        *arg;
    const char  *what;
    uint64_t    max_entries;    /* 0 = caching off: every get registers, every put frees */
    uint64_t    max_bytes;      /* registered bytes kept, held entries excluded */
} xfer_regcache_params_t;

/* One cached registration: the transport's handle, valid while held. */
typedef struct xfer_regcache_entry {
    void      *handle;
    uintptr_t start, end;       /* registered range, [start, end) */
} xfer_regcache_entry_t;

typedef struct xfer_regcache_stats {
    uint64_t hits, misses, evictions;
    uint64_t invalidations;     /* entries dropped by unmap reports or invalidate() */
    uint64_t unmaps;            /* unmapped ranges taken from the reports */
    uint64_t flushes;           /* the reports overflowed: every entry was dropped */
    uint64_t entries, bytes;    /* now cached (held or not) */
} xfer_regcache_stats_t;

/* A cache that cannot have unmap reports is still created, caching nothing. */
XFER_API xfer_status_t xfer_regcache_create(const xfer_regcache_params_t *params,
                                            xfer_regcache_t **rc_p);
/* NULL when the cache caches; else why every get registers and every put deregisters. */
XFER_API const char *xfer_regcache_uncached_why(const xfer_regcache_t *rc);
/* Deregisters everything; entries still held are reported with a warning and freed. */
XFER_API void xfer_regcache_destroy(xfer_regcache_t *rc);
/* Find or register a region covering [addr, addr + length) and hold it. length 0 is refused
 * (XFER_ERR_INVALID_PARAM). Registration failures return XFER_ERR_NO_RESOURCE (or
 * XFER_ERR_INVALID_PARAM for memory that is not mapped) with a log line saying why. */
XFER_API xfer_status_t xfer_regcache_get(xfer_regcache_t *rc, const void *addr, size_t length,
                                         xfer_regcache_entry_t **entry_p);
/* Release a hold from get(). */
XFER_API void xfer_regcache_put(xfer_regcache_t *rc, xfer_regcache_entry_t *entry);
/* Drop every entry overlapping [addr, addr + length); returns how many were dropped. */
XFER_API unsigned xfer_regcache_invalidate(xfer_regcache_t *rc, const void *addr,
                                           size_t length);
XFER_API void xfer_regcache_stats(const xfer_regcache_t *rc, xfer_regcache_stats_t *stats);

/*
 * The address ranges this process unmaps, as libucm (UCX's memory hooks) reports them, queued
 * for the cache: a cached registration of a range that was unmapped pins pages the program no
 * longer owns, and memory mapped anew at that address must not be served by it.
 *
 * libucm calls the handler in whichever thread unmaps (munmap, mremap, madvise releasing
 * pages, shmdt, a shrinking brk, mmap MAP_FIXED over a mapping), before the memory goes. The
 * handler only records the range, under a spinlock, in a bounded queue; when the queue is full
 * it records that ranges were lost. The owner takes what was recorded under its own
 * serialisation and does the invalidation (device calls, frees) itself.
 */
#define XFER_UNMAPQ_LEN 1024    /* ranges recorded between two takes */

typedef struct xfer_unmapq xfer_unmapq_t;

typedef struct xfer_unmap_range {
    uintptr_t start, end;       /* [start, end) */
} xfer_unmap_range_t;

/* Whether unmap reports can cover every unmapping in this process; why says why not. They
 * cannot under a memory checker whose allocator serves malloc() (AddressSanitizer and the
 * other sanitizers with an allocator, valgrind): it returns heap memory to the system with
 * raw system calls that libucm does not see, and hands the addresses out again. */
XFER_API int xfer_unmapq_complete(char *why, size_t why_size);
/* Subscribe to libucm's unmap reports. XFER_ERR_UNSUPPORTED, with why filled, when they
 * cannot be had: built without libucm, UCX_MEM_EVENTS=no, or hooks libucm cannot install. */
XFER_API xfer_status_t xfer_unmapq_create(xfer_unmapq_t **q_p, char *why, size_t why_size);
/* Unsubscribe; when it returns, no report runs or will run into q. */
XFER_API void xfer_unmapq_destroy(xfer_unmapq_t *q);
/*
 * The ranges reported since the last take, oldest first, in *ranges_p (valid until the next
 * take), and in *lost_p whether more were reported than the queue holds (then the ranges are
 * not all there is: treat everything as unmapped). Adjacent and overlapping reports may be
 * merged. Not thread-safe against itself: one owner takes.
 */
XFER_API unsigned xfer_unmapq_take(xfer_unmapq_t *q, const xfer_unmap_range_t **ranges_p,
                                   int *lost_p);

#endif
