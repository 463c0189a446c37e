/*
 * The address ranges this process unmaps, as libucm (UCX's memory hooks) reports them, queued
 * for the verbs MR cache: a cached registration of a range that was unmapped pins pages the
 * program no longer owns, and memory mapped anew at that address must not be served by it.
 *
 * libucm calls the handler in whichever thread unmaps (munmap, mremap, madvise releasing
 * pages, shmdt, a shrinking brk, mmap MAP_FIXED over a mapping), before the memory goes. The
 * handler only records the range, under a spinlock, in a bounded queue; when the queue is full
 * it records that ranges were lost. The owner takes what was recorded under its own
 * serialisation and does the invalidation (verbs calls, frees) itself.
 */
#ifndef XFER_VERBS_UNMAPQ_H
#define XFER_VERBS_UNMAPQ_H

#include <xfer/xfer.h>

#include <stddef.h>
#include <stdint.h>

#define XFER_VERBS_UNMAPQ_LEN 1024   /* ranges recorded between two takes */

typedef struct xfer_verbs_unmapq xfer_verbs_unmapq_t;

typedef struct xfer_verbs_range {
    uintptr_t start, end;            /* [start, end) */
} xfer_verbs_range_t;

/* Whether unmap reports can cover every unmapping in this process; why says why not. They
 * cannot under a memory checker whose allocator serves malloc() (AddressSanitizer and the
 * other sanitizers with an allocator, valgrind): it returns heap memory to the system with
 * raw system calls that libucm does not see, and hands the addresses out again. */
int xfer_verbs_unmapq_complete(char *why, size_t why_size);

/* Subscribe to libucm's unmap reports. XFER_ERR_UNSUPPORTED, with why filled, when they
 * cannot be had: built without libucm, UCX_MEM_EVENTS=no, or hooks libucm cannot install. */
xfer_status_t xfer_verbs_unmapq_create(xfer_verbs_unmapq_t **q_p, char *why, size_t why_size);
/* Unsubscribe; when it returns, no report runs or will run into q. */
void xfer_verbs_unmapq_destroy(xfer_verbs_unmapq_t *q);
/*
 * The ranges reported since the last take, oldest first, in *ranges_p (valid until the next
 * take), and in *lost_p whether more were reported than the queue holds (then the ranges are
 * not all there is: treat everything as unmapped). Adjacent and overlapping reports may be
 * merged. Not thread-safe against itself: one owner takes.
 */
unsigned xfer_verbs_unmapq_take(xfer_verbs_unmapq_t *q, const xfer_verbs_range_t **ranges_p,
                                int *lost_p);

#endif
