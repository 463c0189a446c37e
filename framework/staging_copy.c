/*
 * The staging pipeline's copy engines (staging.h): CUDA and host memcpy.
 *
 * CUDA: one non-blocking stream of xfer's own in the context of the memory being staged (so
 * that no copy waits behind the application's work on the legacy default stream), one event
 * per bounce slot recorded after the slot's copy and asked with cuEventQuery - never a
 * synchronisation on the data path. The bounce buffers are cuMemHostAlloc'd (portable: pinned
 * for every context) so that cuMemcpy*Async really is asynchronous and the NIC can register
 * them. Every call runs in the engine's context and gives the caller's back.
 *
 * Host memcpy: the same contract over host memory, for the suites on machines without a GPU.
 * A copy is only noted at start and done at the poll that lands it (after a chosen number of
 * polls), so that a pipeline which sent a bounce buffer before its copy landed, or completed
 * before the last copy, moves wrong bytes that the suites see.
 */
#include "staging.h"

#include <stdlib.h>
#include <string.h>

#define CU_STREAM_NON_BLOCKING    0x1
#define CU_EVENT_DISABLE_TIMING   0x2
#define CU_MEMHOSTALLOC_PORTABLE  0x1
#define CUDA_SUCCESS              0
#define CUDA_ERROR_NOT_READY      600

/* ---- CUDA ---- */

static int cu_enter(const xfer_copier_t *c, void **saved_p)
{
    int res = c->cu->ctx_get_current(saved_p);

    if ((res == CUDA_SUCCESS) && (*saved_p != c->cu_ctx)) {
        res = c->cu->ctx_set_current(c->cu_ctx);
    }
    return res;
}

static void cu_leave(const xfer_copier_t *c, void *saved)
{
    if (saved != c->cu_ctx) {
        (void)c->cu->ctx_set_current(saved);
    }
}

static xfer_status_t cu_fail(const xfer_copier_t *c, const char *call, int res, char *why,
                             size_t why_size)
{
    char text[128];

    xfer_reason_set(why, why_size, "%s: %s", call,
                    xfer_cuda_result_string(res, text, sizeof(text)));
    (void)c;
    return XFER_ERR_IO;
}

static xfer_status_t cuda_host_alloc(xfer_copier_t *c, size_t size, void **ptr_p, char *why,
                                     size_t why_size)
{
    void *saved, *ptr = NULL;
    int res = cu_enter(c, &saved);

    if (res != CUDA_SUCCESS) {
        return cu_fail(c, "cuCtxSetCurrent", res, why, why_size);
    }
    res = c->cu->mem_host_alloc(&ptr, size, CU_MEMHOSTALLOC_PORTABLE);
    cu_leave(c, saved);
    if (res != CUDA_SUCCESS) {
        return cu_fail(c, "cuMemHostAlloc", res, why, why_size);
    }
    *ptr_p = ptr;
    return XFER_OK;
}

static void cuda_host_free(xfer_copier_t *c, void *ptr)
{
    void *saved;

    if (cu_enter(c, &saved) == CUDA_SUCCESS) {
        (void)c->cu->mem_free_host(ptr);
        cu_leave(c, saved);
    }
}

/* Queue a copy of len bytes on the engine's stream (in its context); *call_p names the call
 * that failed. */
static int cu_copy_async(xfer_copier_t *c, void *dst, const void *src, size_t len,
                         xfer_staging_dir_t dir, const char **call_p)
{
    if (dir == XFER_STAGING_TO_HOST) {
        *call_p = "cuMemcpyDtoHAsync";
        return c->cu->memcpy_dtoh_async(dst, (xfer_cu_ptr_t)(uintptr_t)src, len, c->stream);
    }
    *call_p = "cuMemcpyHtoDAsync";
    return c->cu->memcpy_htod_async((xfer_cu_ptr_t)(uintptr_t)dst, src, len, c->stream);
}

static xfer_status_t cuda_start(xfer_copier_t *c, unsigned slot, void *dst, const void *src,
                                size_t len, xfer_staging_dir_t dir, char *why, size_t why_size)
{
    const char *call = "cuCtxSetCurrent";
    void *saved;
    int res = cu_enter(c, &saved);

    if (res == CUDA_SUCCESS) {
        res = cu_copy_async(c, dst, src, len, dir, &call);
        if (res == CUDA_SUCCESS) {
            call = "cuEventRecord";
            res  = c->cu->event_record(c->events[slot], c->stream);
        }
        cu_leave(c, saved);
    }
    return (res == CUDA_SUCCESS) ? XFER_OK : cu_fail(c, call, res, why, why_size);
}

static xfer_status_t cuda_poll(xfer_copier_t *c, unsigned slot, char *why, size_t why_size)
{
    void *saved;
    int res = cu_enter(c, &saved);

    if (res != CUDA_SUCCESS) {
        return cu_fail(c, "cuCtxSetCurrent", res, why, why_size);
    }
    res = c->cu->event_query(c->events[slot]);
    cu_leave(c, saved);
    if (res == CUDA_ERROR_NOT_READY) {
        return XFER_INPROGRESS;
    }
    return (res == CUDA_SUCCESS) ? XFER_OK : cu_fail(c, "cuEventQuery", res, why, why_size);
}

static void cuda_close(xfer_copier_t *c)
{
    void *saved;

    if (cu_enter(c, &saved) != CUDA_SUCCESS) {
        xfer_log(XFER_LOG_WARN, "staging", "cannot enter the staging stream's CUDA context "
                 "to release it");
        goto out;
    }
    if (c->stream != NULL) {
        (void)c->cu->stream_synchronize(c->stream);
    }
    for (unsigned i = 0; (c->events != NULL) && (i < c->num_slots); i++) {
        if (c->events[i] != NULL) {
            (void)c->cu->event_destroy(c->events[i]);
        }
    }
    if (c->stream != NULL) {
        (void)c->cu->stream_destroy(c->stream);
    }
    cu_leave(c, saved);
out:
    free(c->events);
    c->events = NULL;
    c->stream = NULL;
    if (c->primary_device >= 0) {
        (void)c->cu->device_primary_ctx_release(c->primary_device);
        c->primary_device = -1;
    }
}

xfer_status_t xfer_copier_sync_cuda(xfer_copier_t *c, void *dst, const void *src, size_t len,
                                    xfer_staging_dir_t dir, char *why, size_t why_size)
{
    const char *call = "cuCtxSetCurrent";
    void *saved;
    int res = cu_enter(c, &saved);

    /* On the engine's stream, waited for: after every copy started before it. A copy on
     * the legacy stream (cuMemcpyHtoD) would not wait for those - the stream is non-blocking -
     * so a later, smaller write to the same device bytes could land first and be overwritten
     * by an earlier one, and a reader polling the last byte could see it before the rest. */
    if (res == CUDA_SUCCESS) {
        res = cu_copy_async(c, dst, src, len, dir, &call);
        if (res == CUDA_SUCCESS) {
            call = "cuStreamSynchronize";
            res  = c->cu->stream_synchronize(c->stream);
        }
        cu_leave(c, saved);
    }
    return (res == CUDA_SUCCESS) ? XFER_OK : cu_fail(c, call, res, why, why_size);
}

static const xfer_copier_ops_t cuda_ops = {
    .name       = "cuda",
    .host_alloc = cuda_host_alloc,
    .host_free  = cuda_host_free,
    .start      = cuda_start,
    .poll       = cuda_poll,
    .close      = cuda_close,
};

xfer_status_t xfer_copier_open_cuda(xfer_copier_t *c, unsigned num_slots, void *cu_ctx,
                                    int device, char *why, size_t why_size)
{
    const xfer_cuda_driver_t *cu = xfer_cuda_driver(why, why_size);
    const char *call             = "cuCtxSetCurrent";
    void *saved;
    int res;

    if (cu == NULL) {
        return XFER_ERR_UNAVAILABLE;
    }
    memset(c, 0, sizeof(*c));
    c->ops            = &cuda_ops;
    c->num_slots      = num_slots;
    c->cu             = cu;
    c->cu_ctx         = cu_ctx;
    c->primary_device = -1;
    c->events         = calloc(num_slots, sizeof(*c->events));
    if (c->events == NULL) {
        xfer_reason_set(why, why_size, "out of memory");
        return XFER_ERR_NO_MEMORY;
    }
    if (cu_ctx == NULL) {
        res = cu->device_primary_ctx_retain(&c->cu_ctx, device);
        if (res != CUDA_SUCCESS) {
            free(c->events);
            return cu_fail(c, "cuDevicePrimaryCtxRetain", res, why, why_size);
        }
        c->primary_device = device;
    }
    res = cu_enter(c, &saved);
    if (res != CUDA_SUCCESS) {
        cu_fail(c, call, res, why, why_size);
        cuda_close(c);
        return XFER_ERR_IO;
    }
    call = "cuStreamCreate";
    res  = cu->stream_create(&c->stream, CU_STREAM_NON_BLOCKING);
    for (unsigned i = 0; (res == CUDA_SUCCESS) && (i < num_slots); i++) {
        call = "cuEventCreate";
        res  = cu->event_create(&c->events[i], CU_EVENT_DISABLE_TIMING);
    }
    cu_leave(c, saved);
    if (res != CUDA_SUCCESS) {
        cu_fail(c, call, res, why, why_size);
        cuda_close(c);
        return XFER_ERR_IO;
    }
    return XFER_OK;
}

/* ---- host memcpy ---- */

struct host_copy {
    void        *dst;
    const void  *src;
    size_t      len;
    unsigned    polls_left;
    int         pending;
};

static xfer_status_t host_alloc(xfer_copier_t *c, size_t size, void **ptr_p, char *why,
                                size_t why_size)
{
    void *ptr = NULL;

    (void)c;
    if (posix_memalign(&ptr, 4096, size) != 0) {
        xfer_reason_set(why, why_size, "cannot allocate %zu bytes", size);
        return XFER_ERR_NO_MEMORY;
    }
    *ptr_p = ptr;
    return XFER_OK;
}

static void host_free(xfer_copier_t *c, void *ptr)
{
    (void)c;
    free(ptr);
}

static xfer_status_t host_start(xfer_copier_t *c, unsigned slot, void *dst, const void *src,
                                size_t len, xfer_staging_dir_t dir, char *why, size_t why_size)
{
    struct host_copy *hc = &c->host[slot];

    (void)dir;
    if (hc->pending) {
        xfer_reason_set(why, why_size, "slot %u already copying", slot);
        return XFER_ERR_INTERNAL;
    }
    hc->dst        = dst;
    hc->src        = src;
    hc->len        = len;
    hc->polls_left = c->host_delay;
    hc->pending    = 1;
    return XFER_OK;
}

static xfer_status_t host_poll(xfer_copier_t *c, unsigned slot, char *why, size_t why_size)
{
    struct host_copy *hc = &c->host[slot];

    (void)why;
    (void)why_size;
    if (!hc->pending) {
        return XFER_OK;
    }
    if (hc->polls_left > 0) {
        hc->polls_left--;
        return XFER_INPROGRESS;
    }
    memcpy(hc->dst, hc->src, hc->len);
    hc->pending = 0;
    return XFER_OK;
}

static void host_close(xfer_copier_t *c)
{
    free(c->host);
    c->host = NULL;
}

static const xfer_copier_ops_t host_ops = {
    .name       = "host",
    .host_alloc = host_alloc,
    .host_free  = host_free,
    .start      = host_start,
    .poll       = host_poll,
    .close      = host_close,
};

xfer_status_t xfer_copier_open_host(xfer_copier_t *c, unsigned num_slots, unsigned delay,
                                    char *why, size_t why_size)
{
    memset(c, 0, sizeof(*c));
    c->ops        = &host_ops;
    c->num_slots  = num_slots;
    c->host_delay = delay;
    c->host       = calloc(num_slots, sizeof(*c->host));
    if (c->host == NULL) {
        xfer_reason_set(why, why_size, "out of memory");
        return XFER_ERR_NO_MEMORY;
    }
    return XFER_OK;
}
