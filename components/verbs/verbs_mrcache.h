/*
 * The verbs memory-region cache: ibv_reg_mr results found again by address and length.
 *
 * A lookup hits only when one cached region covers the whole [addr, addr + length) with the
 * access rights asked for; a buffer that runs past a region's end is a miss, and a miss
 * registers (page-aligned). The cache is bounded by entries and by registered bytes; past
 * either bound, entries nobody holds are evicted least recently used first. Entries in use
 * (held by an operation in flight) are never evicted or deregistered under it.
 *
 * Invalidation: every entry overlapping memory the process unmaps is dropped before the next
 * lookup (libucm reports the unmapping, verbs_unmapq.h), and xfer_verbs_mrc_invalidate() drops
 * every entry that overlaps a range the user deregistered. Entries still held are taken out of
 * the lookup at once and deregistered when their last holder puts them.
 *
 * Without unmap reports the cache caches nothing (every get registers, every put
 * deregisters): xfer_verbs_mrc_uncached_why() says why.
 *
 * Not thread-safe: the component is serialised by the framework.
 */
#ifndef XFER_VERBS_MRCACHE_H
#define XFER_VERBS_MRCACHE_H

#include <xfer/xfer.h>

#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdint.h>

typedef struct xfer_verbs_mrc xfer_verbs_mrc_t;

typedef struct xfer_verbs_mrc_params {
    struct ibv_pd *pd;
    int           access;        /* ibv access flags every registration gets */
    uint64_t      max_entries;   /* 0 = caching off: every get registers, every put frees */
    uint64_t      max_bytes;     /* registered bytes kept, held entries excluded */
} xfer_verbs_mrc_params_t;

/* One cached registration. mr is valid while held. */
typedef struct xfer_verbs_mr {
    struct ibv_mr *mr;
    uintptr_t     start, end;    /* registered range, [start, end) */
} xfer_verbs_mr_t;

typedef struct xfer_verbs_mrc_stats {
    uint64_t hits, misses, evictions;
    uint64_t invalidations;      /* entries dropped by unmap reports or invalidate() */
    uint64_t unmaps;             /* unmapped ranges taken from the reports */
    uint64_t flushes;            /* the reports overflowed: every entry was dropped */
    uint64_t entries, bytes;     /* now cached (held or not) */
} xfer_verbs_mrc_stats_t;

/* A cache that cannot have unmap reports is still created, caching nothing. */
xfer_status_t xfer_verbs_mrc_create(const xfer_verbs_mrc_params_t *params,
                                    xfer_verbs_mrc_t **mrc_p);
/* NULL when the cache caches; else why every get registers and every put deregisters. */
const char *xfer_verbs_mrc_uncached_why(const xfer_verbs_mrc_t *mrc);
/* Deregisters everything; entries still held are reported with a warning and freed. */
void xfer_verbs_mrc_destroy(xfer_verbs_mrc_t *mrc);
/* Find or register a region covering [addr, addr + length) and hold it. length 0 is refused
 * (XFER_ERR_INVALID_PARAM). Registration failures return XFER_ERR_NO_RESOURCE (or
 * XFER_ERR_INVALID_PARAM for memory that is not mapped) with a log line saying why. */
xfer_status_t xfer_verbs_mrc_get(xfer_verbs_mrc_t *mrc, const void *addr, size_t length,
                                 xfer_verbs_mr_t **mr_p);
/* Release a hold from get(). */
void xfer_verbs_mrc_put(xfer_verbs_mrc_t *mrc, xfer_verbs_mr_t *mr);
/* Drop every entry overlapping [addr, addr + length); returns how many were dropped. */
unsigned xfer_verbs_mrc_invalidate(xfer_verbs_mrc_t *mrc, const void *addr, size_t length);
void xfer_verbs_mrc_stats(const xfer_verbs_mrc_t *mrc, xfer_verbs_mrc_stats_t *stats);

#endif
