/*
 * The stand-in CUDA driver's streams (fake_cuda.c describes the whole): copies, synchronous
 * and queued on a stream to land late, memsets, the one kernel it runs (shm's gather) with
 * the module entry points, cuMemcpyBatchAsync, streams and events, and the counters the
 * suites read (fake_cuda_kernel_launches, fake_cuda_batch_calls).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fake_cuda.h"

#define MAX_QUEUED  1024

typedef struct copy {
    void       *dst;
    const void *src;
    size_t     len;
    uint64_t   seq;
    int        gather;             /* a launch of xfer_shm_gather: src its table, len its count */
} copy_t;

typedef struct stream {
    copy_t     queue[MAX_QUEUED];
    unsigned   head, tail;         /* queue[head..tail) are pending */
    uint64_t   submitted, done;    /* copies ever queued, ever run */
    int        error;              /* a kernel touched what is not device memory: sticky */
} stream_t;

typedef struct event {
    stream_t   *stream;
    uint64_t   seq;                /* done when stream->done reaches it */
} event_t;

static unsigned query_count;    /* cuEventQuery calls, guarded by fc_lock */

/* Copy len bytes into what fc_real() gives. FAKE_CUDA_LAST_BYTE_FIRST=1: a copy into device
 * memory lands its last byte first and the rest 2 ms later, as a copy spread over several
 * engines may - a reader polling the last byte then sees it before the bytes ahead of it. */
static void land(void *dst, const void *src, size_t len)
{
    const char *lbf = getenv("FAKE_CUDA_LAST_BYTE_FIRST");
    char *d = fc_real(dst);

    if ((lbf != NULL) && (strcmp(lbf, "1") == 0) && (d != dst) && (len > 1)) {
        d[len - 1] = ((const char*)fc_real(src))[len - 1];
        usleep(2000);
        len--;
    }
    memcpy(d, fc_real(src), len);
}

static int copy_now(void *dst, const void *src, size_t len)
{
    pthread_mutex_lock(&fc_lock);
    land(dst, src, len);
    pthread_mutex_unlock(&fc_lock);
    return SUCCESS;
}

EXPORT int cuMemsetD8_v2(cu_ptr_t dst, unsigned char value, size_t len)
{
    pthread_mutex_lock(&fc_lock);
    memset(fc_real((void*)(uintptr_t)dst), value, len);
    pthread_mutex_unlock(&fc_lock);
    return SUCCESS;
}

/* Synchronous copies and memsets land before they return: nothing is left to wait for. */
EXPORT int cuCtxSynchronize(void)
{
    return (fc_current == NULL) ? INVALID_CONTEXT : SUCCESS;
}

EXPORT int cuMemcpyHtoD_v2(cu_ptr_t dst, const void *src, size_t len)
{
    return copy_now((void*)(uintptr_t)dst, src, len);
}

EXPORT int cuMemcpyDtoH_v2(void *dst, cu_ptr_t src, size_t len)
{
    return copy_now(dst, (const void*)(uintptr_t)src, len);
}

/* What xfer_shm_gather does, when the launch's turn comes (its table read then, as the GPU
 * reads it): each entry {dst, src, len} copied; an entry outside device memory fails the
 * stream with CUDA_ERROR_ILLEGAL_ADDRESS and moves nothing, as the kernel would fault.
 * FAKE_CUDA_GATHER_WRONG=1: each entry's last byte is not copied - a kernel the driver
 * compiled wrong, which no GPU here can be made to produce. */
typedef struct gather_desc {
    unsigned long long dst, src, len;
} gather_desc_t;

static void gather_run(stream_t *s, const gather_desc_t *table, size_t count)
{
    const char *w = getenv("FAKE_CUDA_GATHER_WRONG");
    int wrong     = (w != NULL) && (strcmp(w, "1") == 0);

    for (size_t k = 0; k < count; k++) {
        const void *dst = (const void*)(uintptr_t)table[k].dst;
        const void *src = (const void*)(uintptr_t)table[k].src;

        if (!fc_device_range(dst, table[k].len) || !fc_device_range(src, table[k].len)) {
            fprintf(stderr, "fake_cuda: xfer_shm_gather entry %zu: %llu bytes from %p to %p "
                    "not in device memory\n", k, table[k].len, src, dst);
            s->error = ILLEGAL_ADDRESS;
            return;
        }
    }
    for (size_t k = 0; k < count; k++) {
        land((void*)(uintptr_t)table[k].dst, (const void*)(uintptr_t)table[k].src,
             table[k].len - (wrong && (table[k].len > 0)));
    }
}

/* Run the oldest queued copy of s; 0 when none was queued. */
static int stream_step(stream_t *s)
{
    copy_t *c;

    if (s->head == s->tail) {
        return 0;
    }
    c = &s->queue[s->head % MAX_QUEUED];
    if (c->gather) {
        gather_run(s, c->src, c->len);
    } else {
        land(c->dst, c->src, c->len);
    }
    s->head++;
    s->done++;
    return 1;
}

static int enqueue_op(void *stream, void *dst, const void *src, size_t len, int gather)
{
    stream_t *s = stream;
    int res     = SUCCESS;

    if ((s == NULL) || (fc_current == NULL)) {
        return (s == NULL) ? INVALID_HANDLE : INVALID_CONTEXT;
    }
    pthread_mutex_lock(&fc_lock);
    if (s->tail - s->head >= MAX_QUEUED) {
        res = NOT_SUPPORTED;
    } else {
        s->queue[s->tail % MAX_QUEUED] = (copy_t){dst, src, len, ++s->submitted, gather};
        s->tail++;
    }
    pthread_mutex_unlock(&fc_lock);
    return res;
}

static int enqueue(void *stream, void *dst, const void *src, size_t len)
{
    return enqueue_op(stream, dst, src, len, 0);
}

/* Modules: the one kernel the stand-in runs is shm's xfer_shm_gather, found by its name in
 * the PTX it is given, run by gather_run in stream order. FAKE_CUDA_MODULE_REFUSE=1: every
 * image is refused (CUDA_ERROR_UNSUPPORTED_PTX_VERSION), as by a driver older than the PTX. */
static int module_token, gather_token;
static unsigned long kernel_launches;

EXPORT unsigned long fake_cuda_kernel_launches(void)
{
    return __atomic_load_n(&kernel_launches, __ATOMIC_RELAXED);
}

EXPORT int cuModuleLoadData(void **module, const void *image)
{
    const char *refuse = getenv("FAKE_CUDA_MODULE_REFUSE");

    if (fc_current == NULL) {
        return INVALID_CONTEXT;
    }
    if ((refuse != NULL) && (strcmp(refuse, "1") == 0)) {
        return UNSUPPORTED_PTX_VERSION;
    }
    if (strstr(image, ".entry xfer_shm_gather(") == NULL) {
        return INVALID_PTX;
    }
    *module = &module_token;
    return SUCCESS;
}

EXPORT int cuModuleGetFunction(void **function, void *module, const char *name)
{
    if ((module != &module_token) || (strcmp(name, "xfer_shm_gather") != 0)) {
        return NOT_FOUND;
    }
    *function = &gather_token;
    return SUCCESS;
}

EXPORT int cuModuleUnload(void *module)
{
    return (module == &module_token) ? SUCCESS : INVALID_HANDLE;
}

/* xfer_shm_gather(const desc *table, unsigned count): its parameters as the driver takes
 * them, an array of pointers to each. The table must be host memory the GPU reads (pinned:
 * cuMemHostAlloc) and hold count entries, else the launch is refused. */
EXPORT int cuLaunchKernel(void *function, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                          unsigned by, unsigned bz, unsigned shared, void *stream,
                          void **params, void **extra)
{
    unsigned long long table;
    unsigned count;
    alloc_t *a;

    if ((function != &gather_token) || (params == NULL) || (extra != NULL) || (gx == 0) ||
        (gy != 1) || (gz != 1) || (bx == 0) || (bx > 1024) || (by != 1) || (bz != 1) ||
        (shared != 0)) {
        return INVALID_VALUE;
    }
    memcpy(&table, params[0], sizeof(table));
    memcpy(&count, params[1], sizeof(count));
    pthread_mutex_lock(&fc_lock);
    a = fc_find((void*)(uintptr_t)table);
    if ((a == NULL) || !a->host ||
        ((size_t)count * sizeof(gather_desc_t) >
         a->size - (size_t)((char*)(uintptr_t)table - a->base))) {
        pthread_mutex_unlock(&fc_lock);
        return INVALID_VALUE;
    }
    pthread_mutex_unlock(&fc_lock);
    __atomic_add_fetch(&kernel_launches, 1, __ATOMIC_RELAXED);
    return enqueue_op(stream, NULL, (void*)(uintptr_t)table, count, 1);
}

EXPORT int cuMemcpyAsync(cu_ptr_t dst, cu_ptr_t src, size_t len, void *stream)
{
    return enqueue(stream, (void*)(uintptr_t)dst, (const void*)(uintptr_t)src, len);
}

/* cuMemcpyBatchAsync, CUDA 12.8's form (with failIdx): the driver's checks of its arguments
 * (a stream, attributes whose first index is 0 and whose indices rise below count, a valid
 * source access order), then each copy queued as cuMemcpyAsync queues it. Calls are counted
 * for the suites (fake_cuda_batch_calls). FAKE_CUDA_BATCH_REFUSE=n: the call queues its
 * first n copies and then fails with CUDA_ERROR_NOT_SUPPORTED at copy n - a driver that
 * takes part of a batch before it refuses one of its copies, a fault no real GPU here can be
 * made to produce. */
typedef struct memcpy_attr {
    int      src_access_order;
    int      src_loc[2], dst_loc[2];
    unsigned flags;
} memcpy_attr_t;

static unsigned long batch_calls;

EXPORT unsigned long fake_cuda_batch_calls(void)
{
    return __atomic_load_n(&batch_calls, __ATOMIC_RELAXED);
}

EXPORT int cuMemcpyBatchAsync(cu_ptr_t *dsts, cu_ptr_t *srcs, size_t *sizes, size_t count,
                              const memcpy_attr_t *attrs, const size_t *attr_idxs,
                              size_t num_attrs, size_t *fail_idx, void *stream)
{
    const char *refuse = getenv("FAKE_CUDA_BATCH_REFUSE");
    size_t limit = (refuse != NULL) ? strtoul(refuse, NULL, 10) : SIZE_MAX;
    int res;

    __atomic_add_fetch(&batch_calls, 1, __ATOMIC_RELAXED);
    *fail_idx = SIZE_MAX;
    if ((stream == NULL) || (count == 0) || (num_attrs == 0) || (num_attrs > count) ||
        (attr_idxs[0] != 0)) {
        return INVALID_VALUE;
    }
    for (size_t k = 0; k < num_attrs; k++) {
        if (((k > 0) && (attr_idxs[k] <= attr_idxs[k - 1])) || (attr_idxs[k] >= count) ||
            (attrs[k].src_access_order < 1) || (attrs[k].src_access_order > 3)) {
            return INVALID_VALUE;
        }
    }
    for (size_t i = 0; i < count; i++) {
        if (i >= limit) {
            *fail_idx = i;
            return NOT_SUPPORTED;
        }
        res = enqueue(stream, (void*)(uintptr_t)dsts[i], (const void*)(uintptr_t)srcs[i],
                      sizes[i]);
        if (res != SUCCESS) {
            *fail_idx = i;
            return res;
        }
    }
    return SUCCESS;
}

EXPORT int cuMemcpyHtoDAsync_v2(cu_ptr_t dst, const void *src, size_t len, void *stream)
{
    return enqueue(stream, (void*)(uintptr_t)dst, src, len);
}

EXPORT int cuMemcpyDtoHAsync_v2(void *dst, cu_ptr_t src, size_t len, void *stream)
{
    return enqueue(stream, dst, (const void*)(uintptr_t)src, len);
}

EXPORT int cuStreamCreate(void **stream, unsigned flags)
{
    (void)flags;
    if (fc_current == NULL) {
        return INVALID_CONTEXT;
    }
    *stream = calloc(1, sizeof(stream_t));
    return (*stream != NULL) ? SUCCESS : INVALID_VALUE;
}

EXPORT int cuStreamSynchronize(void *stream)
{
    int res;

    pthread_mutex_lock(&fc_lock);
    while (stream_step(stream)) {
    }
    res = ((stream_t*)stream)->error;
    pthread_mutex_unlock(&fc_lock);
    return res;
}

EXPORT int cuStreamDestroy_v2(void *stream)
{
    cuStreamSynchronize(stream);
    free(stream);
    return SUCCESS;
}

EXPORT int cuEventCreate(void **event, unsigned flags)
{
    (void)flags;
    if (fc_current == NULL) {
        return INVALID_CONTEXT;
    }
    *event = calloc(1, sizeof(event_t));
    return (*event != NULL) ? SUCCESS : INVALID_VALUE;
}

EXPORT int cuEventRecord(void *event, void *stream)
{
    event_t *e = event;

    if ((e == NULL) || (stream == NULL)) {
        return INVALID_HANDLE;
    }
    pthread_mutex_lock(&fc_lock);
    e->stream = stream;
    e->seq    = e->stream->submitted;
    pthread_mutex_unlock(&fc_lock);
    return SUCCESS;
}

EXPORT int cuEventQuery(void *event)
{
    event_t *e = event;
    int res;

    if (fc_current == NULL) {
        return INVALID_CONTEXT;
    }
    pthread_mutex_lock(&fc_lock);
    if ((e->stream != NULL) && (e->stream->done < e->seq) && ((++query_count % 3) == 0)) {
        stream_step(e->stream);     /* the copy engine moves one copy per three looks */
    }
    res = ((e->stream == NULL) || (e->stream->done >= e->seq)) ? SUCCESS : NOT_READY;
    pthread_mutex_unlock(&fc_lock);
    return res;
}

EXPORT int cuEventDestroy_v2(void *event)
{
    free(event);
    return SUCCESS;
}
