/*
 * A flush covers the sends posted before it, on every transport (docs/contract.md, C19, C21).
 * A transport may finish a send only once the peer has taken the message - a rendezvous send
 * over shm or verbs completes when the receiver has read it - while its own flush covers what
 * it has written. So the framework keeps each endpoint's unfinished sends in posting order; a
 * flush posted while some are unfinished waits here and is handed to the transport once every
 * send posted before it has ended, and an orderly close flushes only then (endpoint.c). A
 * send that failed (the peer closed or went before taking it) fails every flush after it
 * with its status, as a put the peer never acknowledged does. The hand-over runs from a
 * progress hook, never inside a transport's own work.
 */
#include "xfer_int.h"

static void send_end(xfer_request_t *req, xfer_status_t *status_p, size_t *length_p)
{
    xfer_endpoint_t *ep = req->ord_ep;

    (void)length_p;
    if ((ep != NULL) && (*status_p != XFER_OK) && (ep->send_failed == XFER_OK)) {
        ep->send_failed = *status_p;
    }
    xfer_ep_send_untrack(req);
}

static const xfer_req_ops_t send_ops = {send_end, NULL, NULL};

void xfer_ep_sends_init(xfer_endpoint_t *ep)
{
    ucs_list_head_init(&ep->sends);
    ucs_list_head_init(&ep->send_flushes);
    ep->send_failed = XFER_OK;
}

void xfer_ep_send_track(xfer_endpoint_t *ep, xfer_request_t *req)
{
    req->ops     = &send_ops;
    req->ord_ep  = ep;
    req->ord_seq = ++ep->send_seq;
    ucs_list_add_tail(&ep->sends, &req->ord_link);
}

/* Whether the oldest waiting flush may go: no send posted before it is unfinished. */
static int flush_may_go(xfer_endpoint_t *ep)
{
    xfer_request_t *flush = ucs_list_head(&ep->send_flushes, xfer_request_t, ord_link);

    return ucs_list_is_empty(&ep->sends) ||
           (ucs_list_head(&ep->sends, xfer_request_t, ord_link)->ord_seq > flush->ord_seq);
}

static unsigned flushes_progress(xfer_context_t *ctx);

static int flushes_busy(xfer_context_t *ctx)
{
    return !ucs_list_is_empty(&ctx->flush_ready);
}

void xfer_ep_send_untrack(xfer_request_t *req)
{
    xfer_endpoint_t *ep = req->ord_ep;

    if (ep == NULL) {
        return;
    }
    ucs_list_del(&req->ord_link);
    req->ord_ep = NULL;
    if (!ucs_list_is_empty(&ep->send_flushes) && !ep->flush_listed && flush_may_go(ep)) {
        ep->flush_listed = 1;
        ucs_list_add_tail(&ep->ctx->flush_ready, &ep->flush_link);
        xfer_progress_hook_add(ep->ctx, &ep->ctx->flush_hook, flushes_progress, NULL,
                               flushes_busy);
    }
}

int xfer_ep_sends_pending(xfer_endpoint_t *ep)
{
    return !ucs_list_is_empty(&ep->sends);
}

xfer_status_t xfer_ep_flush_start(xfer_endpoint_t *ep, xfer_comp_t *comp)
{
    if (ep->send_failed != XFER_OK) {
        return ep->send_failed;
    }
    return (ep->fw_iface->comp->ep_flush == NULL) ? XFER_OK :
           ep->fw_iface->comp->ep_flush(ep->ep, comp);
}

xfer_status_t xfer_ep_flush_post(xfer_endpoint_t *ep, xfer_request_t *req)
{
    if (ucs_list_is_empty(&ep->sends) && ucs_list_is_empty(&ep->send_flushes)) {
        return xfer_ep_flush_start(ep, &req->comp);
    }
    req->ord_ep  = ep;
    req->ord_seq = ep->send_seq;
    ucs_list_add_tail(&ep->send_flushes, &req->ord_link);
    return XFER_INPROGRESS;
}

/* Hand ep's flushes that may go to its transport, oldest first. */
static unsigned flushes_go(xfer_endpoint_t *ep)
{
    unsigned count = 0;

    while (!ucs_list_is_empty(&ep->send_flushes) && flush_may_go(ep)) {
        xfer_request_t *req = ucs_list_extract_head(&ep->send_flushes, xfer_request_t, ord_link);
        xfer_status_t status;

        req->ord_ep = NULL;
        status      = xfer_ep_flush_start(ep, &req->comp);
        if (status != XFER_INPROGRESS) {
            xfer_request_complete(req, status, 0, 0);
        }
        count++;
    }
    return count;
}

static unsigned flushes_progress(xfer_context_t *ctx)
{
    unsigned count = 0;

    while (!ucs_list_is_empty(&ctx->flush_ready)) {
        xfer_endpoint_t *ep = ucs_list_extract_head(&ctx->flush_ready, xfer_endpoint_t,
                                                    flush_link);

        ep->flush_listed = 0;
        count += flushes_go(ep);
    }
    xfer_progress_hook_del(ctx, &ctx->flush_hook);
    return count;
}

void xfer_ep_sends_gone(xfer_endpoint_t *ep)
{
    while (!ucs_list_is_empty(&ep->sends)) {
        ucs_list_extract_head(&ep->sends, xfer_request_t, ord_link)->ord_ep = NULL;
    }
    if (ep->flush_listed) {
        ucs_list_del(&ep->flush_link);
        ep->flush_listed = 0;
    }
}

void xfer_ep_send_flushes_gone(xfer_endpoint_t *ep)
{
    while (!ucs_list_is_empty(&ep->send_flushes)) {
        xfer_request_t *req = ucs_list_extract_head(&ep->send_flushes, xfer_request_t, ord_link);

        req->ord_ep = NULL;
        xfer_request_complete(req, XFER_ERR_CANCELED, 0, 0);
    }
}
