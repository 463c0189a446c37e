/*
 * Requests: one per non-blocking operation.
 *
 * Every callback reaches the user from one place, the context's ready list. A transport
 * completes the embedded xfer_comp_t from inside its own progress (or while it tears down an
 * endpoint); xfer_request_complete() then only records the outcome and queues the request.
 * xfer_requests_dispatch(), which progress runs after every transport has returned, makes
 * the outcome visible, runs the user's callback, wakes the threads waiting for it and frees
 * a request the user already released. So a callback never runs inside a walk of a
 * transport's structures: whatever it does - close this or another endpoint, progress, post,
 * release - the transport is not in the middle of anything. A request with no callback that
 * the user still holds has nothing to run and nothing to free: its outcome is visible at
 * once, without the queue.
 */
#include "xfer_int.h"

#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define REQUEST_SUBSYS "request"
#define REQUEST_ALIGN  64     /* a cache line */
#define REQUEST_CHUNK  128    /* requests per allocation of the pool */

static const xfer_request_t request_zero;

static void request_comp_cb(xfer_comp_t *self, xfer_status_t status, size_t length,
                            uint64_t tag)
{
    xfer_request_complete(ucs_container_of(self, xfer_request_t, comp), status, length, tag);
}

/* Requests come from a memory pool: one per operation, so malloc and free would be on the
 * data path. The pool is guarded by the context's lock, as every request is. */
static ucs_mpool_ops_t request_mp_ops = {
    .chunk_alloc   = ucs_mpool_chunk_malloc,
    .chunk_release = ucs_mpool_chunk_free,
};

xfer_status_t xfer_request_pool_init(xfer_context_t *ctx)
{
    if (ucs_mpool_init(&ctx->req_mp, 0, sizeof(xfer_request_t), 0, REQUEST_ALIGN,
                       REQUEST_CHUNK, UINT_MAX, &request_mp_ops, "xfer_requests") != UCS_OK) {
        xfer_log(XFER_LOG_ERROR, REQUEST_SUBSYS, "cannot create the request pool");
        return XFER_ERR_NO_MEMORY;
    }
    ctx->req_mp_ready = 1;
    return XFER_OK;
}

void xfer_request_pool_cleanup(xfer_context_t *ctx)
{
    if (ctx->req_mp_ready) {
        ucs_mpool_cleanup(&ctx->req_mp, 1);
        ctx->req_mp_ready = 0;
    }
}

xfer_request_t *xfer_request_new(xfer_context_t *ctx, xfer_req_kind_t kind,
                                 xfer_fw_iface_t *fw_iface, const xfer_req_ops_t *ops,
                                 xfer_request_cb_t cb, void *user_data)
{
    xfer_request_t *req = ucs_mpool_get(&ctx->req_mp);

    if (req == NULL) {
        return NULL;
    }
    /* a fetch's part is large (the tensor) and only a fetch reads it. The head is copied
     * from a zero request: GCC turns that into a few vector stores, where a memset of it
     * becomes a rep stos that costs more than the rest of the post. */
    if (kind == XFER_REQ_FETCH) {
        memset(req, 0, sizeof(*req));
    } else {
        memcpy(req, &request_zero, offsetof(xfer_request_t, step));
    }
    req->comp.cb   = request_comp_cb;
    req->ops       = ops;
    req->ctx       = ctx;
    req->kind      = kind;
    req->fw_iface  = fw_iface;
    req->status    = XFER_INPROGRESS;
    req->cb        = cb;
    req->user_data = user_data;
    ucs_list_head_init(&req->fetch_list);
    ucs_list_add_tail(&ctx->requests, &req->list);
    return req;
}

/* What the owner hung on the request goes. */
static void request_owner_release(xfer_request_t *req)
{
    if ((req->ops != NULL) && (req->ops->release != NULL)) {
        req->ops->release(req);
    }
}

static void request_free(xfer_request_t *req)
{
    request_owner_release(req);
    ucs_list_del(&req->list);
    ucs_mpool_put(req);
}

/* The operation no longer uses its registered memory: deregistering it is allowed again. */
static void request_mem_release(xfer_request_t *req)
{
    if (req->mem != NULL) {
        req->mem->busy--;
        req->mem = NULL;
    }
}

void xfer_request_discard(xfer_request_t *req)
{
    request_mem_release(req);
    request_free(req);
}

void xfer_request_posted(xfer_request_t *req, xfer_request_t **req_p)
{
    if (req_p != NULL) {
        *req_p = req;
    } else {
        req->released = 1;
    }
    /* a thread sleeping in poll must see the new work */
    xfer_wake_locked(req->ctx);
}

/* Record the outcome and queue the request for dispatch. Its status stays XFER_INPROGRESS
 * until then, so that nobody frees it (xfer_request_release) or reads its result before the
 * callback has run. */
static void request_queue(xfer_request_t *req, xfer_status_t status, size_t length,
                          uint64_t tag)
{
    xfer_context_t *ctx = req->ctx;

    req->result = (status == XFER_INPROGRESS) ? XFER_ERR_INTERNAL : status;
    req->length = length;
    req->tag    = tag;
    req->queued = 1;
    ucs_list_add_tail(&ctx->ready, &req->ready_link);
    ctx->num_ready++;
    xfer_wake_locked(ctx);
}

void xfer_request_posted_done(xfer_request_t *req, size_t length, xfer_request_t **req_p)
{
    if (req->cb != NULL) {
        /* callbacks run from progress, never inside the call that posts: a caller may not be
         * ready for one before the call has returned */
        request_queue(req, XFER_OK, length, 0);
        xfer_request_posted(req, req_p);
        return;
    }
    /* no callback: nothing of the user's runs, so the request is complete at once and
     * xfer_request_test() answers without progress */
    req->status = XFER_OK;
    req->length = length;
    request_owner_release(req);     /* a send's host copy: the transport is done with it */
    request_mem_release(req);
    if (req_p != NULL) {
        *req_p = req;
    } else {
        request_free(req);
    }
}

void xfer_request_complete(xfer_request_t *req, xfer_status_t status, size_t length,
                           uint64_t tag)
{
    if ((req->status != XFER_INPROGRESS) || req->queued) {
        xfer_log(XFER_LOG_ERROR, REQUEST_SUBSYS, "request %p completed twice (%s, then %s); "
                 "second completion ignored", (void*)req,
                 xfer_status_string(req->queued ? req->result : req->status),
                 xfer_status_string(status));
        return;
    }
    if ((req->ops != NULL) && (req->ops->end != NULL)) {
        req->ops->end(req, &status, &length);
    }
    if ((req->cb == NULL) && !req->released) {
        /* nothing of the user's runs and nothing is freed: the outcome is visible at once,
         * as for an operation that completes while posted (xfer_request_posted_done), and
         * the request skips the ready list */
        req->status = (status == XFER_INPROGRESS) ? XFER_ERR_INTERNAL : status;
        req->length = length;
        req->tag    = tag;
        request_mem_release(req);
        if (!req->ctx->serialized) {
            pthread_cond_broadcast(&req->ctx->cond);
        }
        xfer_wake_locked(req->ctx);
        return;
    }
    request_queue(req, status, length, tag);
}

/* The outcome becomes visible, the callback runs, waiters wake, a released request goes. */
static void request_deliver(xfer_request_t *req)
{
    xfer_context_t *ctx = req->ctx;

    req->status = req->result;
    request_mem_release(req);
    if (req->cb != NULL) {
        req->in_callback = 1;
        xfer_in_callback++;
        req->cb(req, req->status, req->user_data);
        xfer_in_callback--;
        req->in_callback = 0;
    }
    pthread_cond_broadcast(&ctx->cond);
    if (req->released) {
        request_free(req);
    }
}

unsigned xfer_requests_dispatch(xfer_context_t *ctx)
{
    /* Only what is queued now: a callback that posts and completes at once waits for the
     * next progress, so a chain of them cannot keep this call going. A callback may itself
     * progress and dispatch (nested): both take from the head of the one list, so requests
     * are still delivered in the order they completed. */
    unsigned n = ctx->num_ready, count = 0;

    while ((count < n) && !ucs_list_is_empty(&ctx->ready)) {
        xfer_request_t *req = ucs_list_extract_head(&ctx->ready, xfer_request_t, ready_link);

        ctx->num_ready--;
        req->queued = 0;
        request_deliver(req);
        count++;
    }
    return count;
}

void xfer_requests_free_all(xfer_context_t *ctx)
{
    xfer_request_t *req, *tmp;

    ucs_list_for_each_safe(req, tmp, &ctx->requests, list) {
        if (req->status == XFER_INPROGRESS) {
            xfer_log(XFER_LOG_DEBUG, REQUEST_SUBSYS, "freeing a request still pending at "
                     "context destroy");
        }
        ucs_list_del(&req->fetch_list);
        request_free(req);
    }
    ucs_list_head_init(&ctx->ready);
    ctx->num_ready = 0;
}

xfer_status_t xfer_request_test(xfer_request_t *req)
{
    xfer_status_t status;

    if (req == NULL) {
        return XFER_ERR_INVALID_PARAM;
    }
    xfer_ctx_lock(req->ctx);
    if ((req->status == XFER_INPROGRESS) &&
        (xfer_api_check(req->ctx, "xfer_request_test", 0) == XFER_OK)) {
        xfer_progress_locked(req->ctx);
    }
    status = req->status;
    xfer_ctx_unlock(req->ctx);
    return status;
}

xfer_status_t xfer_request_wait(xfer_request_t *req, int timeout_ms)
{
    xfer_context_t *ctx;
    xfer_status_t status;
    int64_t until;

    if (req == NULL) {
        return XFER_ERR_INVALID_PARAM;
    }
    ctx = req->ctx;
    if (xfer_in_callback) {
        xfer_log(XFER_LOG_ERROR, REQUEST_SUBSYS, "xfer_request_wait called from a completion "
                 "callback; callbacks must not wait");
        return XFER_ERR_BUSY;
    }
    until = (timeout_ms < 0) ? INT64_MAX : xfer_now_ms() + timeout_ms;
    xfer_ctx_lock(ctx);
    while (req->status == XFER_INPROGRESS) {
        int64_t now;

        if (xfer_progress_locked(ctx) > 0) {
            continue;
        }
        if (req->status != XFER_INPROGRESS) {
            break;
        }
        now = xfer_now_ms();
        if (now >= until) {
            break;
        }
        xfer_sleep_locked(ctx, (until - now > 1000) ? 1000 : (int)(until - now));
    }
    status = (req->status == XFER_INPROGRESS) ? XFER_ERR_TIMEOUT : req->status;
    xfer_ctx_unlock(ctx);
    return status;
}

xfer_status_t xfer_request_cancel(xfer_request_t *req)
{
    xfer_status_t status;

    if (req == NULL) {
        return XFER_ERR_INVALID_PARAM;
    }
    xfer_ctx_lock(req->ctx);
    if (xfer_api_check(req->ctx, "xfer_request_cancel", 0) != XFER_OK) {
        status = XFER_ERR_BUSY;
    } else if ((req->status != XFER_INPROGRESS) || req->queued) {
        status = XFER_OK;       /* complete, or its completion is being delivered */
    } else if ((req->ops == NULL) || (req->ops->cancel == NULL)) {
        status = XFER_ERR_UNSUPPORTED;
    } else {
        status = req->ops->cancel(req, XFER_ERR_CANCELED);
        if (status == XFER_OK) {
            xfer_wake_locked(req->ctx);
        }
    }
    xfer_ctx_unlock(req->ctx);
    return status;
}

size_t xfer_request_length(const xfer_request_t *req)
{
    return req ? req->length : 0;
}

size_t xfer_request_landed(const xfer_request_t *req)
{
    return req ? req->landed : 0;
}

uint64_t xfer_request_tag(const xfer_request_t *req)
{
    return req ? req->tag : 0;
}

const xfer_tensor_t *xfer_request_tensor(const xfer_request_t *req)
{
    if ((req == NULL) || (req->kind != XFER_REQ_FETCH) || (req->status == XFER_INPROGRESS)) {
        return NULL;
    }
    /* a failed fetch still shows a buffer its allocation callback gave, for the caller to
     * free */
    if ((req->status != XFER_OK) && ((req->alloc == NULL) || (req->tensor.data == NULL))) {
        return NULL;
    }
    return &req->tensor;
}

void xfer_request_release(xfer_request_t *req)
{
    xfer_context_t *ctx;

    if (req == NULL) {
        return;
    }
    ctx = req->ctx;
    xfer_ctx_lock(ctx);
    if ((req->status == XFER_INPROGRESS) || req->in_callback) {
        req->released = 1;      /* freed when it completes / its callback returns */
    } else {
        request_free(req);
    }
    xfer_ctx_unlock(ctx);
}
