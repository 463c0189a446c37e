/*
 * Requests: one per non-blocking operation. The component completes the embedded xfer_comp_t
 * from progress(); the request records the outcome, runs the user's callback once, wakes the
 * threads waiting for it, and frees itself when the user has already released it.
 */
#include "xfer_int.h"
#include "sock.h"

#include <limits.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define REQUEST_SUBSYS "request"
#define REQUEST_ALIGN  64     /* a cache line */
#define REQUEST_CHUNK  128    /* requests per allocation of the pool */

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
                                 xfer_fw_iface_t *fw_iface, xfer_request_cb_t cb,
                                 void *user_data)
{
    xfer_request_t *req = ucs_mpool_get(&ctx->req_mp);

    if (req == NULL) {
        return NULL;
    }
    /* a fetch's part is large (the tensor) and only a fetch reads it */
    memset(req, 0, (kind == XFER_REQ_FETCH) ? sizeof(*req) : offsetof(xfer_request_t, step));
    req->comp.cb   = request_comp_cb;
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

static void request_free(xfer_request_t *req)
{
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

void xfer_request_posted_done(xfer_request_t *req, size_t length, xfer_request_t **req_p)
{
    if (req->cb != NULL) {
        /* callbacks run from progress, never inside the call that posts: a caller may not be
         * ready for one before the call has returned */
        req->length = length;
        ucs_list_add_tail(&req->ctx->ready, &req->ready_link);
        xfer_request_posted(req, req_p);
        return;
    }
    req->status = XFER_OK;
    req->length = length;
    request_mem_release(req);
    if (req_p != NULL) {
        *req_p = req;
    } else {
        request_free(req);
    }
}

unsigned xfer_requests_ready(xfer_context_t *ctx)
{
    unsigned count = 0;

    while (!ucs_list_is_empty(&ctx->ready)) {
        xfer_request_t *req = ucs_list_extract_head(&ctx->ready, xfer_request_t, ready_link);

        xfer_request_complete(req, XFER_OK, req->length, 0);
        count++;
    }
    return count;
}

void xfer_request_complete(xfer_request_t *req, xfer_status_t status, size_t length,
                           uint64_t tag)
{
    xfer_context_t *ctx = req->ctx;

    if (req->status != XFER_INPROGRESS) {
        xfer_log(XFER_LOG_ERROR, REQUEST_SUBSYS, "request %p completed twice (%s, then %s); "
                 "second completion ignored", (void*)req, xfer_status_string(req->status),
                 xfer_status_string(status));
        return;
    }
    req->status = (status == XFER_INPROGRESS) ? XFER_ERR_INTERNAL : status;
    req->length = length;
    req->tag    = tag;
    request_mem_release(req);
    if (req->kind == XFER_REQ_FETCH) {
        xfer_tensor_fetch_done(req);
    }
    if (req->cb != NULL) {
        req->in_callback = 1;
        xfer_in_callback++;
        req->cb(req, req->status, req->user_data);
        xfer_in_callback--;
        req->in_callback = 0;
    }
    pthread_cond_broadcast(&ctx->cond);
    xfer_wake_locked(ctx);
    if (req->released) {
        request_free(req);
    }
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
}

xfer_status_t xfer_request_test(xfer_request_t *req)
{
    xfer_status_t status;

    if (req == NULL) {
        return XFER_ERR_INVALID_PARAM;
    }
    xfer_ctx_lock(req->ctx);
    if (req->status == XFER_INPROGRESS) {
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
    if (req->status != XFER_INPROGRESS) {
        status = XFER_OK;
    } else if ((req->kind != XFER_REQ_RECV) && (req->kind != XFER_REQ_FETCH)) {
        status = XFER_ERR_UNSUPPORTED;
    } else if (req->fw_iface->comp->cancel == NULL) {
        status = XFER_ERR_UNSUPPORTED;
    } else {
        status = req->fw_iface->comp->cancel(req->fw_iface->iface, &req->comp,
                                             XFER_ERR_CANCELED);
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
