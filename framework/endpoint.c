/*
 * Endpoints and the operations posted on them. Each call checks what it can check here
 * (arguments, local and remote bounds, that the memory and the remote key belong to this
 * endpoint's context, peer and transport), takes the context lock, and hands the operation to
 * the endpoint's transport with a new request.
 */
#include "xfer_int.h"
#include "staging.h"
#include "wire/bootstrap_wire.h"

#include <inttypes.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EP_SUBSYS "endpoint"

xfer_fw_iface_t *xfer_fw_iface_find(xfer_context_t *ctx, const char *name)
{
    for (unsigned i = 0; i < ctx->num_ifaces; i++) {
        if (strcmp(ctx->ifaces[i].entry->name, name) == 0) {
            return &ctx->ifaces[i];
        }
    }
    return NULL;
}

int xfer_endpoint_reachable(xfer_context_t *ctx, const char *transport, const void *peer_addr,
                            size_t peer_addr_len, char *why, size_t why_size)
{
    xfer_iface_reachable_func_t reachable;
    xfer_fw_iface_t *fi;
    int ret = 1;

    xfer_ctx_lock(ctx);
    fi = xfer_fw_iface_find(ctx, transport);
    reachable = (fi != NULL) ? xfer_component_iface_reachable(fi->comp) : NULL;
    if ((reachable != NULL) && (why_size > 0)) {
        why[0] = '\0';
        ret    = reachable(fi->iface, peer_addr, peer_addr_len, why, why_size);
        why[why_size - 1] = '\0';
        if ((ret == 0) && (why[0] == '\0')) {
            snprintf(why, why_size, "%s gave no reason", transport);
        }
        ret = (ret != 0);
    }
    xfer_ctx_unlock(ctx);
    return ret;
}

xfer_status_t xfer_endpoint_prepare(xfer_context_t *ctx, int fd, const uint8_t *secret,
                                    const char *transport,
                                    const void *peer_addr, size_t peer_addr_len, int is_server,
                                    const char *peer, xfer_wire_connect_t *mine,
                                    xfer_endpoint_t **ep_p, char *why, size_t why_size)
{
    xfer_endpoint_t *ep = NULL;
    xfer_ep_params_t params;
    xfer_fw_iface_t *fi;
    xfer_status_t status;
    size_t addr_len;

    xfer_ctx_lock(ctx);
    fi = xfer_fw_iface_find(ctx, transport);
    if (fi == NULL) {
        snprintf(why, why_size, "transport '%s' is not open in this context", transport);
        status = XFER_ERR_INTERNAL;
        goto out;
    }
    ep = calloc(1, sizeof(*ep));
    if (ep == NULL) {
        snprintf(why, why_size, "out of memory");
        status = XFER_ERR_NO_MEMORY;
        goto out;
    }
    ep->ctx      = ctx;
    ep->fw_iface = fi;
    ep->status   = XFER_OK;
    snprintf(ep->transport, sizeof(ep->transport), "%s", transport);
    snprintf(ep->peer, sizeof(ep->peer), "%s", peer);
    ucs_list_head_init(&ep->batches);
    ucs_list_head_init(&ep->notify_late);
    ucs_list_head_init(&ep->notifies);
    ucs_list_head_init(&ep->tensor_answers);
    xfer_ep_sends_init(ep);

    memset(&params, 0, sizeof(params));
    params.size                = sizeof(params);
    params.fw_ep               = ep;
    params.peer_iface_addr     = peer_addr;
    params.peer_iface_addr_len = peer_addr_len;
    params.sock_fd             = fd;
    params.is_server           = is_server;
    params.secret              = secret;
    status = fi->comp->ep_create(fi->iface, &params, &ep->ep);
    if (status != XFER_OK) {
        snprintf(why, why_size, "%s could not create an endpoint: %s", transport,
                 xfer_status_string(status));
        goto out;
    }
    memset(mine, 0, sizeof(*mine));
    addr_len = sizeof(mine->addr);
    if (fi->comp->ep_address == NULL) {
        addr_len = 0;
    } else {
        status = fi->comp->ep_address(ep->ep, mine->addr, &addr_len);
        if ((status != XFER_OK) || (addr_len > XFER_WIRE_MAX_ADDR)) {
            snprintf(why, why_size, "%s could not give its endpoint address: %s", transport,
                     xfer_status_string(status));
            status = (status == XFER_OK) ? XFER_ERR_INTERNAL : status;
            fi->comp->ep_destroy(ep->ep);
            goto out;
        }
    }
    mine->context_id = ctx->id;
    mine->addr_len   = (uint16_t)addr_len;
    *ep_p = ep;
    ep    = NULL;

out:
    xfer_ctx_unlock(ctx);
    free(ep);
    return status;
}

xfer_status_t xfer_endpoint_complete(xfer_endpoint_t *ep, const xfer_wire_connect_t *theirs,
                                     char *why, size_t why_size)
{
    xfer_context_t *ctx = ep->ctx;
    xfer_fw_iface_t *fi = ep->fw_iface;
    xfer_status_t status = XFER_OK;

    xfer_ctx_lock(ctx);
    if ((theirs->context_id == 0) || (theirs->context_id == ctx->id)) {
        snprintf(why, why_size, "peer context id %016llx is invalid or equals ours",
                 (unsigned long long)theirs->context_id);
        status = XFER_ERR_PROTOCOL;
        goto out;
    }
    ep->peer_id = theirs->context_id;
    if (fi->comp->ep_connect != NULL) {
        status = fi->comp->ep_connect(ep->ep, theirs->addr, theirs->addr_len);
        if (status != XFER_OK) {
            snprintf(why, why_size, "%s could not connect the endpoint: %s", ep->transport,
                     xfer_status_string(status));
            goto out;
        }
    }
    ucs_list_add_tail(&ctx->endpoints, &ep->list);
    xfer_wake_locked(ctx);
out:
    xfer_ctx_unlock(ctx);
    return status;
}

void xfer_endpoint_discard(xfer_endpoint_t *ep)
{
    xfer_context_t *ctx = ep->ctx;

    xfer_ctx_lock(ctx);
    ep->fw_iface->comp->ep_destroy(ep->ep);
    xfer_budget_ep_release(ep);
    xfer_ctx_unlock(ctx);
    free(ep);
}

#define op_begin xfer_endpoint_op_begin
static xfer_status_t op_finish(xfer_context_t *ctx, xfer_request_t *req, xfer_status_t status,
                               size_t length, xfer_request_t **req_p);

/* The transport's endpoint goes (what is still pending on it completes with
 * XFER_ERR_CANCELED), then ours. */
static void endpoint_destroy(xfer_endpoint_t *ep)
{
    xfer_endpoint_stats_print(ep);
    ucs_list_del(&ep->list);
    ep->destroying = 1;
    if (ep->staged_ops > 0) {
        xfer_staging_ep_destroy(ep);
    }
    xfer_ep_sends_gone(ep);
    ep->fw_iface->comp->ep_destroy(ep->ep);
    xfer_ep_send_flushes_gone(ep);
    xfer_tensor_ep_gone(ep);
    xfer_batch_ep_gone(ep);
    xfer_tm_ep_gone(ep);
    xfer_notify_ep_cleanup(ep);
    xfer_budget_ep_release(ep);
    free(ep);
}

const char *xfer_endpoint_transport(const xfer_endpoint_t *ep)
{
    return ep ? ep->transport : NULL;
}

const char *xfer_endpoint_peer(const xfer_endpoint_t *ep)
{
    return ep ? ep->peer : NULL;
}

xfer_status_t xfer_endpoint_status(const xfer_endpoint_t *ep)
{
    return ep ? ep->status : XFER_ERR_INVALID_PARAM;
}

/* ---- flush and close ----
 *
 * A close moves the endpoint from ctx->endpoints to ctx->closing and asks its transport to
 * flush, then - the flush having succeeded - to shut the endpoint down in order (ep_shutdown:
 * the peer hears that everything before came, and its endpoint says XFER_ERR_PEER_CLOSED).
 * Each step completes from inside the transport's progress, where the endpoint cannot be
 * destroyed (the transport is walking its structures): the completion only marks it, and
 * closing_progress() - a progress hook while some close, after the transports' progress -
 * takes the next step, and at the end destroys the endpoint. The close request completes in
 * the round of progress after that, once the transport has delivered the operations the
 * destroy cancelled: a close's callback comes after theirs (they completed first), so that
 * it may free what they use. A close whose steps do not end by its deadline is forced: what
 * is left is cancelled, and the peer sees the connection end. */

static void close_step_cb(xfer_comp_t *self, xfer_status_t status, size_t length,
                          uint64_t tag)
{
    xfer_endpoint_t *ep = ucs_container_of(self, xfer_endpoint_t, flush_comp);

    (void)length;
    (void)tag;
    ep->flush_done   = 1;
    ep->flush_status = status;
    xfer_wake_locked(ep->ctx);
}

static void close_finish(xfer_endpoint_t *ep, xfer_status_t status)
{
    xfer_context_t *ctx = ep->ctx;
    xfer_request_t *req = ep->close_req;

    endpoint_destroy(ep);
    if (req != NULL) {
        req->result = status;   /* its outcome, delivered by closing_progress next round */
        ucs_list_add_tail(&ctx->closed, &req->ord_link);
        xfer_wake_locked(ctx);
    }
}

/* Start a step (ep_flush, then ep_shutdown); the close finishes when the last has ended. */
static void close_step(xfer_endpoint_t *ep, int shutdown)
{
    xfer_ep_shutdown_func_t fn = xfer_component_ep_shutdown(ep->fw_iface->comp);
    xfer_status_t status;

    ep->flush_deferred = 0;
    ep->flush_done     = 0;
    ep->shutting_down  = shutdown;
    ep->flush_comp.cb  = close_step_cb;
    status = shutdown ? fn(ep->ep, &ep->flush_comp) : xfer_ep_flush_start(ep, &ep->flush_comp);
    if (status != XFER_INPROGRESS) {
        close_step_cb(&ep->flush_comp, status, 0, 0);
    }
}

/* A step ended with status: take the next one, or finish. The peer hears of an orderly close
 * only after a flush that succeeded while it was still there. */
static void close_step_done(xfer_endpoint_t *ep, xfer_status_t status)
{
    if (!ep->shutting_down && (status == XFER_OK) && (ep->status == XFER_OK) &&
        (xfer_component_ep_shutdown(ep->fw_iface->comp) != NULL)) {
        close_step(ep, 1);
        return;
    }
    close_finish(ep, status);
}

static unsigned closing_progress(xfer_context_t *ctx);

/* What an orderly close flushes only after: staged puts and gets that post their chunks
 * still, batches their descriptors as their window opens, sends that wait for the peer,
 * tensors whose data the peer may still read. */
static int close_waits(xfer_endpoint_t *ep)
{
    return (ep->staged_ops > 0) || (ep->batch_ops > 0) || xfer_ep_sends_pending(ep) ||
           !ucs_list_is_empty(&ep->tensor_answers);
}

static void close_start(xfer_endpoint_t *ep, uint32_t flags, xfer_request_t *req)
{
    xfer_context_t *ctx             = ep->ctx;
    const xfer_component_v1_t *comp = ep->fw_iface->comp;

    ep->closing   = 1;
    ep->close_req = req;
    xfer_batch_ep_closing(ep);
    xfer_notify_ep_cleanup(ep);     /* the handle is gone: nobody can take them */
    ucs_list_del(&ep->list);
    ucs_list_add_tail(&ctx->closing, &ep->list);
    xfer_progress_hook_add(ctx, &ctx->closing_hook, closing_progress,
                           xfer_endpoints_closing_timeout, NULL);
    if ((ep->status != XFER_OK) && (ep->status != XFER_ERR_PEER_CLOSED)) {
        close_finish(ep, ep->status);   /* failed: nothing more can be delivered */
        return;
    }
    if ((flags & XFER_CLOSE_FLAG_FORCE) || (comp->ep_flush == NULL) ||
        (ctx->fw_config.close_timeout <= 0)) {
        close_finish(ep, XFER_OK);
        return;
    }
    /* after the peer's orderly close the flush still says whether it had everything */
    ep->close_deadline = xfer_now_ms() + (int64_t)(ctx->fw_config.close_timeout * 1000.0);
    if (close_waits(ep)) {
        ep->flush_deferred = 1;
    } else {
        close_step(ep, 0);
    }
    xfer_wake_locked(ctx);
}

/* The closing endpoints' steps and deadlines (a progress hook while some close). */
static unsigned closing_progress(xfer_context_t *ctx)
{
    xfer_endpoint_t *ep, *tmp;
    ucs_list_link_t done;
    int64_t now = -1;
    unsigned count = 0;

    /* the closes finished before this round: their transports have delivered since */
    ucs_list_head_init(&done);
    ucs_list_splice_tail(&done, &ctx->closed);
    ucs_list_head_init(&ctx->closed);
    while (!ucs_list_is_empty(&done)) {
        xfer_request_t *req = ucs_list_extract_head(&done, xfer_request_t, ord_link);

        xfer_request_complete(req, req->result, 0, 0);
        count++;
    }
    ucs_list_for_each_safe(ep, tmp, &ctx->closing, list) {
        if (ep->flush_done) {
            close_step_done(ep, ep->flush_status);
        } else if (ep->flush_deferred && !close_waits(ep) &&
                   ((ep->status == XFER_OK) || (ep->status == XFER_ERR_PEER_CLOSED))) {
            /* after the peer's orderly close the flush still says whether it had everything */
            close_step(ep, 0);
        } else if ((ep->status != XFER_OK) && (ep->status != XFER_ERR_PEER_CLOSED)) {
            close_finish(ep, ep->status);
        } else {
            if (now < 0) {
                now = xfer_now_ms();
            }
            if (now >= ep->close_deadline) {
                /* what the close still waited for, so that a stall says where it was */
                xfer_log(XFER_LOG_WARN, EP_SUBSYS, "closing the endpoint to %s over %s: %s "
                         "within XFER_CLOSE_TIMEOUT=%gs (waiting for %s: %u batch(es), %u "
                         "staged operation(s), %s, %s); closing anyway, the rest is "
                         "cancelled", ep->peer, ep->transport, ep->shutting_down ?
                         "the peer did not take the notice of the close" :
                         "what was sent did not reach the peer", ctx->fw_config.close_timeout,
                         ep->flush_deferred ? "the operations before the flush" :
                         ep->shutting_down ? "the transport's shutdown" :
                         "the transport's flush", ep->batch_ops, ep->staged_ops,
                         xfer_ep_sends_pending(ep) ? "sends the peer has not taken" :
                         "no send", ucs_list_is_empty(&ep->tensor_answers) ?
                         "no tensor answer" : "tensor answers");
                close_finish(ep, XFER_ERR_TIMEOUT);
            }
        }
    }
    if (ucs_list_is_empty(&ctx->closing) && ucs_list_is_empty(&ctx->closed)) {
        xfer_progress_hook_del(ctx, &ctx->closing_hook);
    }
    return count;
}

int xfer_endpoints_closing_timeout(xfer_context_t *ctx)
{
    int64_t first = INT64_MAX, now;
    xfer_endpoint_t *ep;

    if (!ucs_list_is_empty(&ctx->closed)) {
        return 0;       /* close requests to complete */
    }
    if (ucs_list_is_empty(&ctx->closing)) {
        return -1;
    }
    ucs_list_for_each(ep, &ctx->closing, list) {
        if (ep->close_deadline < first) {
            first = ep->close_deadline;
        }
    }
    now = xfer_now_ms();
    return (first <= now) ? 0 : (first - now > INT32_MAX) ? INT32_MAX : (int)(first - now);
}

void xfer_endpoints_close_all(xfer_context_t *ctx)
{
    xfer_endpoint_t *ep, *tmp;

    ucs_list_for_each_safe(ep, tmp, &ctx->endpoints, list) {
        close_start(ep, 0, NULL);
    }
    while (!ucs_list_is_empty(&ctx->closing) || !ucs_list_is_empty(&ctx->closed)) {
        if (xfer_progress_locked(ctx) == 0) {
            int ms = xfer_endpoints_closing_timeout(ctx);

            xfer_sleep_locked(ctx, ((ms < 0) || (ms > 100)) ? 100 : (ms ? ms : 1));
        }
    }
}

xfer_status_t xfer_endpoint_close_nb(xfer_endpoint_t *ep, uint32_t flags, xfer_request_cb_t cb,
                                     void *user_data, xfer_request_t **req_p)
{
    xfer_context_t *ctx;
    xfer_request_t *req;
    xfer_status_t status;

    if ((ep == NULL) || (flags & ~(uint32_t)XFER_CLOSE_FLAG_FORCE)) {
        xfer_refuse(EP_SUBSYS, "xfer_endpoint_close_nb: %s",
                    (ep == NULL) ? "endpoint is NULL" : "unknown flags");
        return XFER_ERR_INVALID_PARAM;
    }
    ctx = ep->ctx;
    xfer_ctx_lock(ctx);
    status = xfer_api_check(ctx, "xfer_endpoint_close_nb", 0);
    if (status != XFER_OK) {
        goto out;
    }
    if (ep->closing) {
        xfer_refuse(EP_SUBSYS, "the endpoint to %s is already closing", ep->peer);
        status = XFER_ERR_INVALID_PARAM;
        goto out;
    }
    req = xfer_request_new(ctx, XFER_REQ_CLOSE, NULL, NULL, cb, user_data);
    if (req == NULL) {
        status = XFER_ERR_NO_MEMORY;
        goto out;
    }
    xfer_request_posted(req, req_p);
    close_start(ep, flags, req);
out:
    xfer_ctx_unlock(ctx);
    return status;
}

void xfer_endpoint_close(xfer_endpoint_t *ep)
{
    xfer_request_t *req = NULL;

    if (ep == NULL) {
        return;
    }
    if (xfer_in_callback) {
        /* a callback must not wait: the close goes on in progress */
        (void)xfer_endpoint_close_nb(ep, 0, NULL, NULL, NULL);
        return;
    }
    if (xfer_endpoint_close_nb(ep, 0, NULL, NULL, &req) == XFER_OK) {
        (void)xfer_request_wait(req, -1);   /* bounded by the close's deadline */
        xfer_request_release(req);
    }
}

xfer_status_t xfer_endpoint_flush(xfer_endpoint_t *ep, xfer_request_cb_t cb, void *user_data,
                                  xfer_request_t **req_p)
{
    xfer_request_t *req;
    xfer_status_t status;

    /* after the peer's orderly close a flush still says whether everything sent before it
     * reached the peer: the transport answers */
    status = xfer_endpoint_op_begin_closed(ep, "xfer_endpoint_flush",
                                           (void*)xfer_endpoint_flush, 1);
    if (status != XFER_OK) {
        return status;
    }
    req = xfer_request_new(ep->ctx, XFER_REQ_FLUSH, ep->fw_iface, NULL, cb, user_data);
    if (req == NULL) {
        xfer_ctx_unlock(ep->ctx);
        return XFER_ERR_NO_MEMORY;
    }
    status = xfer_ep_flush_post(ep, req);
    return op_finish(ep->ctx, req, status, 0, req_p);
}

/* ---- operations ---- */

/* Common entry checks; on success returns with the lock held. */
xfer_status_t xfer_endpoint_op_begin(xfer_endpoint_t *ep, const char *op, void *fn)
{
    return xfer_endpoint_op_begin_closed(ep, op, fn, 0);
}

xfer_status_t xfer_endpoint_op_begin_closed(xfer_endpoint_t *ep, const char *op, void *fn,
                                            int peer_closed_ok)
{
    xfer_status_t status;

    if (ep == NULL) {
        xfer_refuse(EP_SUBSYS, "%s: endpoint is NULL", op);
        return XFER_ERR_INVALID_PARAM;
    }
    xfer_ctx_lock(ep->ctx);
    status = xfer_api_check(ep->ctx, op, 1);
    if (status != XFER_OK) {
        xfer_ctx_unlock(ep->ctx);
        return status;
    }
    if (ep->closing) {
        xfer_refuse(EP_SUBSYS, "%s on an endpoint that was closed", op);
        xfer_ctx_unlock(ep->ctx);
        return XFER_ERR_INVALID_PARAM;
    }
    if ((ep->status != XFER_OK) &&
        !(peer_closed_ok && (ep->status == XFER_ERR_PEER_CLOSED))) {
        xfer_log(XFER_LOG_DEBUG, EP_SUBSYS, "%s on a failed endpoint to %s: %s", op, ep->peer,
                 xfer_status_string(ep->status));
        xfer_ctx_unlock(ep->ctx);
        return ep->status;
    }
    if (fn == NULL) {
        xfer_refuse(EP_SUBSYS, "%s is not supported by transport %s", op,
                    ep->transport);
        xfer_ctx_unlock(ep->ctx);
        return XFER_ERR_UNSUPPORTED;
    }
    return XFER_OK;
}

/* Translate the component's answer to a posted request: done at once (XFER_OK, length bytes
 * moved), pending (XFER_INPROGRESS), or refused (an error: no request, no callback). */
static xfer_status_t op_finish(xfer_context_t *ctx, xfer_request_t *req, xfer_status_t status,
                               size_t length, xfer_request_t **req_p)
{
    if (status == XFER_OK) {
        xfer_request_posted_done(req, length, req_p);
    } else if (status == XFER_INPROGRESS) {
        xfer_request_posted(req, req_p);
        status = XFER_OK;
    } else {
        xfer_request_discard(req);
    }
    xfer_ctx_unlock(ctx);
    return status;
}

static xfer_status_t rma_check(xfer_endpoint_t *ep, const char *op, const void *buf,
                               size_t length, xfer_mem_t *mem, uint64_t remote_addr,
                               xfer_rkey_t *rkey)
{
    if ((buf == NULL) && (length > 0)) {
        xfer_refuse(EP_SUBSYS, "%s: buffer is NULL", op);
        return XFER_ERR_INVALID_PARAM;
    }
    if (mem == NULL) {
        xfer_refuse(EP_SUBSYS, "%s needs a registered local buffer "
                    "(xfer_mem_register); got none", op);
        return XFER_ERR_INVALID_PARAM;
    }
    if ((mem->ctx != ep->ctx) ||
        ((mem->memh[ep->fw_iface->index] == NULL) && !mem->staged)) {
        xfer_refuse(EP_SUBSYS, "%s: the memory was registered with another "
                    "context or is not registered with %s", op, ep->transport);
        return XFER_ERR_INVALID_PARAM;
    }
    if (!xfer_mem_covers(mem, buf, length)) {
        xfer_refuse(EP_SUBSYS, "%s: local range %p+%zu is outside the registered "
                    "buffer %p+%zu", op, buf, length, mem->addr, mem->length);
        return XFER_ERR_OUT_OF_RANGE;
    }
    if (rkey == NULL) {
        xfer_refuse(EP_SUBSYS, "%s: remote key is NULL", op);
        return XFER_ERR_INVALID_PARAM;
    }
    if ((rkey->ctx != ep->ctx) || (rkey->fw_iface != ep->fw_iface) ||
        (rkey->owner_id != ep->peer_id)) {
        xfer_refuse(EP_SUBSYS, "%s: the remote key was not unpacked for this "
                    "endpoint's peer and transport (%s, %s)", op, ep->peer, ep->transport);
        return XFER_ERR_INVALID_PARAM;
    }
    if ((remote_addr < rkey->addr) || (remote_addr - rkey->addr > rkey->length) ||
        (length > rkey->length - (remote_addr - rkey->addr))) {
        xfer_refuse(EP_SUBSYS, "%s: remote range 0x%llx+%zu is outside the "
                    "remote buffer 0x%llx+%llu", op, (unsigned long long)remote_addr, length,
                    (unsigned long long)rkey->addr, (unsigned long long)rkey->length);
        return XFER_ERR_OUT_OF_RANGE;
    }
    return XFER_OK;
}

static xfer_status_t rma(xfer_endpoint_t *ep, int is_put, void *buf, size_t length,
                         xfer_mem_t *mem, uint64_t remote_addr, xfer_rkey_t *rkey,
                         xfer_request_cb_t cb, void *user_data, xfer_request_t **req_p)
{
    const char *op = is_put ? "xfer_put" : "xfer_get";
    const xfer_component_v1_t *comp;
    xfer_request_t *req;
    xfer_status_t status;

    status = op_begin(ep, op, ep ? (is_put ? (void*)ep->fw_iface->comp->put :
                                             (void*)ep->fw_iface->comp->get) : NULL);
    if (status != XFER_OK) {
        return status;
    }
    status = rma_check(ep, op, buf, length, mem, remote_addr, rkey);
    if (status != XFER_OK) {
        xfer_ctx_unlock(ep->ctx);
        return status;
    }
    req = xfer_request_new(ep->ctx, is_put ? XFER_REQ_PUT : XFER_REQ_GET, ep->fw_iface, NULL,
                           cb, user_data);
    if (req == NULL) {
        xfer_ctx_unlock(ep->ctx);
        return XFER_ERR_NO_MEMORY;
    }
    req->mem = mem;
    mem->busy++;
    if (__builtin_expect(mem->memh[ep->fw_iface->index] == NULL, 0)) {
        /* memory this transport cannot touch (rma_check let only staged memory through) */
        status = xfer_staging_rma(ep, &req->comp, is_put, buf, length, mem, remote_addr, rkey);
        return op_finish(ep->ctx, req, status, length, req_p);
    }
    comp   = ep->fw_iface->comp;
    status = is_put ? comp->put(ep->ep, buf, length, mem->memh[ep->fw_iface->index],
                                remote_addr, rkey->rkey, &req->comp) :
                      comp->get(ep->ep, buf, length, mem->memh[ep->fw_iface->index],
                                remote_addr, rkey->rkey, &req->comp);
    if ((status == XFER_ERR_UNSUPPORTED) && mem->staged &&
        !(ep->fw_iface->entry->attr.caps & XFER_CAP_MEM_CUDA)) {
        /* a transport that put and get CUDA memory by IPC (RMA_CUDA) only where the remote
         * side lets it declined this one before moving anything: staged as without it */
        status = xfer_staging_rma(ep, &req->comp, is_put, buf, length, mem, remote_addr, rkey);
    }
    return op_finish(ep->ctx, req, status, length, req_p);
}

xfer_status_t xfer_put(xfer_endpoint_t *ep, const void *buf, size_t length, xfer_mem_t *mem,
                       uint64_t remote_addr, xfer_rkey_t *rkey, xfer_request_cb_t cb,
                       void *user_data, xfer_request_t **req_p)
{
    return rma(ep, 1, (void*)buf, length, mem, remote_addr, rkey, cb, user_data, req_p);
}

xfer_status_t xfer_get(xfer_endpoint_t *ep, void *buf, size_t length, xfer_mem_t *mem,
                       uint64_t remote_addr, xfer_rkey_t *rkey, xfer_request_cb_t cb,
                       void *user_data, xfer_request_t **req_p)
{
    return rma(ep, 0, buf, length, mem, remote_addr, rkey, cb, user_data, req_p);
}

/* Optional registration of a tag buffer: must cover it and belong to the context. */
static xfer_status_t tag_mem_check(xfer_context_t *ctx, const char *op, const void *buf,
                                   size_t length, xfer_mem_t *mem)
{
    if ((buf == NULL) && (length > 0)) {
        xfer_refuse(EP_SUBSYS, "%s: buffer is NULL", op);
        return XFER_ERR_INVALID_PARAM;
    }
    if (mem == NULL) {
        return XFER_OK;
    }
    if (mem->ctx != ctx) {
        xfer_refuse(EP_SUBSYS, "%s: the memory belongs to another context", op);
        return XFER_ERR_INVALID_PARAM;
    }
    if (!xfer_mem_covers(mem, buf, length)) {
        xfer_refuse(EP_SUBSYS, "%s: buffer %p+%zu is outside its registration "
                    "%p+%zu", op, buf, length, mem->addr, mem->length);
        return XFER_ERR_OUT_OF_RANGE;
    }
    return XFER_OK;
}

/* Whether a message of mem goes through host memory (staging_msg.c): transport fi, or one of
 * ctx's tag transports when fi is NULL (a receive from any peer), cannot touch it. */
static int tag_mem_staged(const xfer_context_t *ctx, const xfer_mem_t *mem,
                          const xfer_fw_iface_t *fi)
{
    if ((mem == NULL) || !mem->staged) {
        return 0;
    }
    if (fi != NULL) {
        return xfer_msg_staged(mem, fi);
    }
    for (unsigned i = 0; i < ctx->num_ifaces; i++) {
        if ((ctx->ifaces[i].comp->tag_send != NULL) && xfer_msg_staged(mem, &ctx->ifaces[i])) {
            return 1;
        }
    }
    return 0;
}

xfer_status_t xfer_tag_send(xfer_endpoint_t *ep, uint64_t tag, const void *buf, size_t length,
                            xfer_mem_t *mem, xfer_request_cb_t cb, void *user_data,
                            xfer_request_t **req_p)
{
    xfer_request_t *req;
    xfer_status_t status;
    xfer_memh_h memh;
    void *host;
    int staged;

    status = op_begin(ep, "xfer_tag_send", ep ? (void*)ep->fw_iface->comp->tag_send : NULL);
    if (status != XFER_OK) {
        return status;
    }
    status = tag_mem_check(ep->ctx, "xfer_tag_send", buf, length, mem);
    if (status != XFER_OK) {
        xfer_ctx_unlock(ep->ctx);
        return status;
    }
    req = xfer_request_new(ep->ctx, XFER_REQ_SEND, ep->fw_iface, NULL, cb, user_data);
    if (req == NULL) {
        xfer_ctx_unlock(ep->ctx);
        return XFER_ERR_NO_MEMORY;
    }
    memh = (mem != NULL) ? mem->memh[ep->fw_iface->index] : NULL;
    staged = tag_mem_staged(ep->ctx, mem, ep->fw_iface);
    if (staged) {
        /* the transport cannot touch it: it sends a host copy. Tracked first: the stage
         * keeps the ops its request had. */
        xfer_ep_send_track(ep, req);
        status = xfer_msg_stage_send(req, buf, length, mem, &host);
        if (status != XFER_OK) {
            xfer_ep_send_untrack(req);
            xfer_request_discard(req);
            xfer_ctx_unlock(ep->ctx);
            return status;
        }
        buf  = host;
        memh = NULL;    /* the copy is not the registered memory (shm holds one of CUDA
                         * memory for put and get only) */
    }
    if (mem != NULL) {
        req->mem = mem;
        mem->busy++;
    }
    status = ep->fw_iface->comp->tag_send(ep->ep, tag, buf, length, memh, &req->comp);
    if (staged && (status != XFER_INPROGRESS)) {
        xfer_ep_send_untrack(req);     /* finished while posted, or refused */
    } else if (!staged && (status == XFER_INPROGRESS) && (req->status == XFER_INPROGRESS) &&
               !req->queued) {
        xfer_ep_send_track(ep, req);   /* a later flush waits for it */
    }
    return op_finish(ep->ctx, req, status, length, req_p);
}

xfer_status_t xfer_tag_recv(xfer_context_t *ctx, xfer_endpoint_t *ep, uint64_t tag,
                            uint64_t tag_mask, void *buf, size_t length, xfer_mem_t *mem,
                            xfer_request_cb_t cb, void *user_data, xfer_request_t **req_p)
{
    xfer_request_t *req;
    xfer_status_t status;
    xfer_mem_t *post = mem;     /* the registration the transports are given */
    void *host;

    if ((ctx == NULL) || ((ep != NULL) && (ep->ctx != ctx))) {
        xfer_refuse(EP_SUBSYS, "xfer_tag_recv: %s", ctx ? "endpoint belongs to "
                    "another context" : "context is NULL");
        return XFER_ERR_INVALID_PARAM;
    }
    /* No endpoint status check: a failed endpoint may still hold messages that arrived
     * before it failed; the matching takes those and refuses the rest. */
    xfer_ctx_lock(ctx);
    status = xfer_api_check(ctx, "xfer_tag_recv", 1);
    if (status == XFER_OK) {
        status = tag_mem_check(ctx, "xfer_tag_recv", buf, length, mem);
    }
    if ((status == XFER_OK) && (ep != NULL) && ep->closing) {
        xfer_refuse(EP_SUBSYS, "xfer_tag_recv on an endpoint that was closed");
        status = XFER_ERR_INVALID_PARAM;
    }
    if (status != XFER_OK) {
        xfer_ctx_unlock(ctx);
        return status;
    }
    req = xfer_request_new(ctx, XFER_REQ_RECV, NULL, &xfer_tm_recv_ops, cb, user_data);
    if (req == NULL) {
        xfer_ctx_unlock(ctx);
        return XFER_ERR_NO_MEMORY;
    }
    if (tag_mem_staged(ctx, mem, (ep != NULL) ? ep->fw_iface : NULL)) {
        /* a transport cannot touch it: received into host memory, then copied up */
        status = xfer_msg_stage_recv(req, buf, length, mem, &host);
        if (status != XFER_OK) {
            xfer_request_discard(req);
            xfer_ctx_unlock(ctx);
            return status;
        }
        buf  = host;
        post = NULL;
    }
    if (mem != NULL) {
        req->mem = mem;
        mem->busy++;
    }
    status = xfer_tm_post(ctx, ep, req, tag, tag_mask, buf, length, post);
    return op_finish(ctx, req, status, length, req_p);
}

xfer_status_t xfer_endpoint_fetch_post(xfer_endpoint_t *ep, xfer_request_t *req,
                                       const xfer_fetch_args_t *args)
{
    return ep->fw_iface->comp->tensor_fetch(ep->ep, args, &req->comp);
}
