/*
 * The queue of unmapped ranges fed by libucm (contract in xfer/regcache.h).
 *
 * The handler runs in any thread, inside munmap() and its kin - also inside a free() a
 * transport itself makes, and while another thread holds the context lock. It therefore takes
 * no lock but the queue's spinlock, allocates nothing, logs nothing and calls nothing: it
 * appends the range (or widens the last one it touches) to the fill buffer. take() swaps the
 * fill and spare buffers under the spinlock and hands the filled one out, so the owner reads
 * it with the lock released; whatever the owner then frees or deregisters may unmap, and the
 * reports of that go to the other buffer instead of deadlocking on the spinlock.
 *
 * libucm calls handlers under its own read lock and ucm_unset_event_handler() takes that lock
 * for writing, so once destroy() has unset the handler no report is running into q and q can
 * be freed. Each queue is one handler (its argument is the queue), so several ifaces - several
 * caches - in one process each get every report.
 */
#include "config.h"

#include "xfer_int.h"

#include <xfer/component.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>

#ifdef HAVE_UCM
#include <ucm/api/ucm.h>
#endif
#ifdef HAVE_VALGRIND_MEMCHECK_H
#include <valgrind/valgrind.h>
#endif

/* Where among libucm's handlers of an event this one runs; UCX's own caches use 1000. The
 * order does not matter here: the handler only records. */
#define UNMAPQ_PRIORITY 1000

struct xfer_unmapq {
    pthread_spinlock_t lock;
    xfer_unmap_range_t *fill;       /* the handler appends here */
    xfer_unmap_range_t *spare;      /* handed out by the last take */
    unsigned           count;       /* ranges in fill */
    int                lost;        /* fill was full: ranges were dropped */
    int                pending;     /* count > 0 or lost; read without the lock by take() */
    xfer_unmap_range_t ranges[2][XFER_UNMAPQ_LEN];
};

int xfer_unmapq_complete(char *why, size_t why_size)
{
#ifdef HAVE_VALGRIND_MEMCHECK_H
    if (RUNNING_ON_VALGRIND) {
        xfer_reason_set(why, why_size, "valgrind's malloc() unmaps heap memory unseen by "
                        "libucm");
        return 0;
    }
#endif
    /* Exported by the runtime of every sanitizer that replaces malloc() (not by UBSan's). */
    if (dlsym(RTLD_DEFAULT, "__sanitizer_get_allocated_size") != NULL) {
        xfer_reason_set(why, why_size, "a sanitizer's malloc() unmaps heap memory unseen by "
                        "libucm");
        return 0;
    }
    return 1;
}

#ifdef HAVE_UCM

static void unmapped(ucm_event_type_t type, ucm_event_t *event, void *arg)
{
    xfer_unmapq_t *q = arg;
    uintptr_t start = (uintptr_t)event->vm_unmapped.address;
    size_t size     = event->vm_unmapped.size;
    uintptr_t end   = (size > UINTPTR_MAX - start) ? UINTPTR_MAX : start + size;
    xfer_unmap_range_t *last;

    if ((type != UCM_EVENT_VM_UNMAPPED) || (size == 0)) {
        return;
    }
    pthread_spin_lock(&q->lock);
    last = (q->count > 0) ? &q->fill[q->count - 1] : NULL;
    if ((last != NULL) && (start <= last->end) && (end >= last->start)) {
        last->start = (start < last->start) ? start : last->start;
        last->end   = (end > last->end) ? end : last->end;
    } else if (q->count < XFER_UNMAPQ_LEN) {
        q->fill[q->count].start = start;
        q->fill[q->count].end   = end;
        q->count++;
    } else {
        q->lost = 1;
    }
    __atomic_store_n(&q->pending, 1, __ATOMIC_RELEASE);
    pthread_spin_unlock(&q->lock);
}

xfer_status_t xfer_unmapq_create(xfer_unmapq_t **q_p, char *why, size_t why_size)
{
    xfer_unmapq_t *q;
    ucs_status_t status;

    q = calloc(1, sizeof(*q));
    if (q == NULL) {
        xfer_reason_set(why, why_size, "out of memory for the queue of unmapped ranges");
        return XFER_ERR_NO_MEMORY;
    }
    if (pthread_spin_init(&q->lock, PTHREAD_PROCESS_PRIVATE) != 0) {
        xfer_reason_set(why, why_size, "pthread_spin_init failed");
        free(q);
        return XFER_ERR_NO_RESOURCE;
    }
    q->fill  = q->ranges[0];
    q->spare = q->ranges[1];

    status = ucm_set_event_handler(UCM_EVENT_VM_UNMAPPED, UNMAPQ_PRIORITY, unmapped, q);
    if (status != UCS_OK) {
        if (!ucm_global_opts.enable_events) {
            xfer_reason_set(why, why_size, "UCX_MEM_EVENTS=no: libucm reports no unmapped "
                            "memory");
        } else {
            xfer_reason_set(why, why_size, "libucm could not install its memory hooks (%s; "
                            "UCX_MEM_LOG_LEVEL=diag says why)", ucs_status_string(status));
        }
        pthread_spin_destroy(&q->lock);
        free(q);
        return XFER_ERR_UNAVAILABLE;
    }
    *q_p = q;
    return XFER_OK;
}

void xfer_unmapq_destroy(xfer_unmapq_t *q)
{
    if (q == NULL) {
        return;
    }
    ucm_unset_event_handler(UCM_EVENT_VM_UNMAPPED, unmapped, q);
    pthread_spin_destroy(&q->lock);
    free(q);
}

unsigned xfer_unmapq_take(xfer_unmapq_t *q, const xfer_unmap_range_t **ranges_p,
                                int *lost_p)
{
    xfer_unmap_range_t *taken;
    unsigned n;
    int lost;

    if (!__atomic_load_n(&q->pending, __ATOMIC_ACQUIRE)) {
        *ranges_p = q->spare;
        *lost_p   = 0;
        return 0;
    }
    pthread_spin_lock(&q->lock);
    taken    = q->fill;
    n        = q->count;
    lost     = q->lost;
    q->fill  = q->spare;
    q->spare = taken;
    q->count = 0;
    q->lost  = 0;
    __atomic_store_n(&q->pending, 0, __ATOMIC_RELAXED);
    pthread_spin_unlock(&q->lock);

    *ranges_p = taken;
    *lost_p   = lost;
    return n;
}

#else /* !HAVE_UCM */

xfer_status_t xfer_unmapq_create(xfer_unmapq_t **q_p, char *why, size_t why_size)
{
    (void)q_p;
    xfer_reason_set(why, why_size, "xfer was built without libucm");
    return XFER_ERR_UNAVAILABLE;
}

void xfer_unmapq_destroy(xfer_unmapq_t *q)
{
    (void)q;
}

unsigned xfer_unmapq_take(xfer_unmapq_t *q, const xfer_unmap_range_t **ranges_p,
                                int *lost_p)
{
    (void)q;
    *ranges_p = NULL;
    *lost_p   = 0;
    return 0;
}

#endif
