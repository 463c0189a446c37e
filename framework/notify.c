/*
 * Batch notifications at the target. A transport hands each one over (xfer_notify_deliver,
 * which drops one whose batch had a put refused, then xfer_notify_upcall) once its batch's
 * data is visible here; the framework copies it into the endpoint's queue, oldest
 * first, bounded by XFER_NOTIFY_MAX_QUEUED per endpoint and by the process's XFER_NOTIFY_BUDGET
 * (each peer a fair share of it, budget.c) so that peers cannot make this process hold without
 * limit - the transport fails an endpoint whose peer goes past either. The application takes them
 * by polling the endpoint, or the context's handler gets them from progress, after every
 * transport has returned (like completion callbacks, so that it may close or post).
 */
#include "xfer_int.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NOTIFY_SUBSYS "notify"

typedef struct notify_msg {
    ucs_list_link_t list;       /* ep->notifies */
    size_t          length;
    uint8_t         data[];
} notify_msg_t;

/* What a kept notification counts against the budget: its bytes and its bookkeeping. */
#define NOTIFY_COST(_len) ((uint64_t)(_len) + 64u)

static void notify_list(xfer_endpoint_t *ep)
{
    if (!ep->notify_listed) {
        ucs_list_add_tail(&ep->ctx->notify_ready, &ep->notify_link);
        ep->notify_listed = 1;
        xfer_progress_hook_add(ep->ctx, &ep->ctx->notify_hook, xfer_notify_dispatch, NULL,
                               NULL);
    }
}

static void notify_unlist(xfer_endpoint_t *ep)
{
    if (ep->notify_listed) {
        ucs_list_del(&ep->notify_link);
        ep->notify_listed = 0;
    }
}

int xfer_notify_upcall(void *fw_arg, void *fw_ep, const void *msg, size_t length)
{
    xfer_context_t *ctx = fw_arg;
    xfer_endpoint_t *ep = fw_ep;
    notify_msg_t *m;

    if (length > ctx->fw_config.notify_max_len) {
        xfer_log(XFER_LOG_ERROR, NOTIFY_SUBSYS, "endpoint to %s: a notification of %zu bytes "
                 "is longer than XFER_NOTIFY_MAX_LEN=%" PRIu64, ep->peer, length,
                 ctx->fw_config.notify_max_len);
        return -1;
    }
    if (ep->closing) {
        /* nobody can take it any more */
        xfer_log(XFER_LOG_DEBUG, NOTIFY_SUBSYS, "endpoint to %s is closing: a notification of "
                 "%zu bytes is dropped", ep->peer, length);
        return 0;
    }
    if (ep->num_notifies >= ctx->fw_config.notify_max_queued) {
        xfer_log(XFER_LOG_ERROR, NOTIFY_SUBSYS, "endpoint to %s: the peer sent more than "
                 "XFER_NOTIFY_MAX_QUEUED=%" PRIu64 " notifications that were not taken; the "
                 "endpoint fails", ep->peer, ctx->fw_config.notify_max_queued);
        return -1;
    }
    if (!xfer_budget_take(ep, XFER_BUDGET_NOTIFY, NOTIFY_COST(length))) {
        xfer_log(XFER_LOG_ERROR, NOTIFY_SUBSYS, "endpoint to %s: the peer's notifications not "
                 "taken reach its share of XFER_NOTIFY_BUDGET=%" PRIu64 " bytes, which all "
                 "peers of this process share; the endpoint fails", ep->peer,
                 ctx->fw_config.notify_budget);
        return -1;
    }
    m = malloc(sizeof(*m) + length);
    if (m == NULL) {
        xfer_budget_give(ep, XFER_BUDGET_NOTIFY, NOTIFY_COST(length));
        xfer_log(XFER_LOG_ERROR, NOTIFY_SUBSYS, "endpoint to %s: out of memory keeping a "
                 "notification of %zu bytes", ep->peer, length);
        return -1;
    }
    m->length = length;
    if (length > 0) {
        memcpy(m->data, msg, length);
    }
    ucs_list_add_tail(&ep->notifies, &m->list);
    ep->num_notifies++;
    if (ctx->notify_cb != NULL) {
        notify_list(ep);
    }
    xfer_wake_locked(ctx);
    return 0;
}

xfer_status_t xfer_notify_deliver(const xfer_iface_params_t *params, void *fw_ep,
                                  const xfer_batch_rx_t *r, uint64_t puts, const void *msg,
                                  size_t len, const char *subsys, char *why, size_t why_size)
{
    xfer_status_t refused = (r != NULL) ? xfer_batch_rx_end(r, puts) : XFER_OK;

    if ((params->size < offsetof(xfer_iface_params_t, max_notify_len) +
                        sizeof(params->max_notify_len)) || (params->notify == NULL)) {
        snprintf(why, why_size, "a notification of %zu bytes, and this side takes none", len);
        return XFER_ERR_PROTOCOL;
    }
    if (len > params->max_notify_len) {
        snprintf(why, why_size, "a notification of %zu bytes is longer than "
                 "XFER_NOTIFY_MAX_LEN=%" PRIu32, len, params->max_notify_len);
        return XFER_ERR_PROTOCOL;
    }
    if (refused != XFER_OK) {
        xfer_log_peer("notify_dropped", XFER_LOG_WARN, subsys, "a batch notification is "
                      "dropped: a put of its batch was refused (%s)",
                      xfer_status_string(refused));
        return XFER_OK;
    }
    if (params->notify(params->fw_arg, fw_ep, msg, len) != 0) {
        snprintf(why, why_size, "the peer's notification of %zu bytes was refused here: the "
                 "endpoint keeps no more until the application takes them "
                 "(XFER_NOTIFY_MAX_QUEUED, XFER_NOTIFY_BUDGET)", len);
        return XFER_ERR_NO_RESOURCE;
    }
    return XFER_OK;
}

xfer_status_t xfer_notify_rx_begin(void *fw_ep, xfer_notify_rx_t *n, size_t len, char *why,
                                   size_t why_size)
{
    if (n->buf != NULL) {
        snprintf(why, why_size, "a notification of %zu bytes while one of %zu is arriving",
                 len, n->len);
        return XFER_ERR_PROTOCOL;
    }
    if (!xfer_budget_take(fw_ep, XFER_BUDGET_NOTIFY, NOTIFY_COST(len))) {
        snprintf(why, why_size, "the peer's notifications, queued and arriving, reach its "
                 "share of XFER_NOTIFY_BUDGET, which all peers of this process share (one of "
                 "%zu bytes begins)", len);
        return XFER_ERR_NO_RESOURCE;
    }
    n->buf = malloc((len > 0) ? len : 1);
    if (n->buf == NULL) {
        xfer_budget_give(fw_ep, XFER_BUDGET_NOTIFY, NOTIFY_COST(len));
        snprintf(why, why_size, "out of memory for a notification of %zu bytes", len);
        return XFER_ERR_NO_MEMORY;
    }
    n->len = len;
    return XFER_OK;
}

void xfer_notify_rx_end(void *fw_ep, xfer_notify_rx_t *n)
{
    if (n->buf != NULL) {
        xfer_budget_give(fw_ep, XFER_BUDGET_NOTIFY, NOTIFY_COST(n->len));
        free(n->buf);
        n->buf = NULL;
        n->len = 0;
    }
}

xfer_status_t xfer_notify_rx_deliver(const xfer_iface_params_t *params, void *fw_ep,
                                     xfer_notify_rx_t *n, const xfer_batch_rx_t *r,
                                     uint64_t puts, const char *subsys, char *why,
                                     size_t why_size)
{
    xfer_notify_rx_t whole = *n;
    xfer_status_t status;

    /* its charge moves to the queued copy: given back first, so that a peer at its share
     * is not refused for holding one notification twice */
    if (whole.buf != NULL) {
        xfer_budget_give(fw_ep, XFER_BUDGET_NOTIFY, NOTIFY_COST(whole.len));
    }
    n->buf = NULL;
    n->len = 0;
    status = xfer_notify_deliver(params, fw_ep, r, puts, whole.buf, whole.len, subsys, why,
                                 why_size);
    free(whole.buf);
    return status;
}

static notify_msg_t *notify_take(xfer_endpoint_t *ep)
{
    notify_msg_t *m = ucs_list_extract_head(&ep->notifies, notify_msg_t, list);

    xfer_budget_give(ep, XFER_BUDGET_NOTIFY, NOTIFY_COST(m->length));
    ep->num_notifies--;
    if (ep->num_notifies == 0) {
        notify_unlist(ep);
    }
    return m;
}

unsigned xfer_notify_dispatch(xfer_context_t *ctx)
{
    unsigned count = 0;

    /* bounded: a handler that posts batches to itself cannot keep this call going */
    while ((ctx->notify_cb != NULL) && !ucs_list_is_empty(&ctx->notify_ready) &&
           (count < 4096)) {
        xfer_endpoint_t *ep = ucs_list_head(&ctx->notify_ready, xfer_endpoint_t, notify_link);
        notify_msg_t *m     = notify_take(ep);

        /* the handler may close ep or progress: nothing of ep is held across it */
        xfer_in_callback++;
        ctx->notify_cb(ep, m->data, m->length, ctx->notify_arg);
        xfer_in_callback--;
        free(m);
        count++;
    }
    if ((ctx->notify_cb == NULL) || ucs_list_is_empty(&ctx->notify_ready)) {
        xfer_progress_hook_del(ctx, &ctx->notify_hook);    /* nothing for a handler */
    }
    return count;
}

void xfer_notify_ep_cleanup(xfer_endpoint_t *ep)
{
    while (!ucs_list_is_empty(&ep->notifies)) {
        free(notify_take(ep));
    }
    notify_unlist(ep);
}

xfer_status_t xfer_notify_handler_set(xfer_context_t *ctx, xfer_notify_cb_t cb,
                                      void *user_data)
{
    xfer_endpoint_t *ep;

    if (ctx == NULL) {
        xfer_refuse(NOTIFY_SUBSYS, "xfer_notify_handler_set: context is NULL");
        return XFER_ERR_INVALID_PARAM;
    }
    xfer_ctx_lock(ctx);
    ctx->notify_cb  = cb;
    ctx->notify_arg = user_data;
    ucs_list_for_each(ep, &ctx->endpoints, list) {
        if ((cb != NULL) && (ep->num_notifies > 0)) {
            notify_list(ep);
        } else {
            notify_unlist(ep);
        }
    }
    if (cb != NULL) {
        xfer_wake_locked(ctx);
    }
    xfer_ctx_unlock(ctx);
    return XFER_OK;
}

xfer_status_t xfer_notify_poll(xfer_endpoint_t *ep, void *buf, size_t capacity,
                               size_t *length_p)
{
    xfer_context_t *ctx;
    xfer_status_t status;
    notify_msg_t *m;

    if ((ep == NULL) || (length_p == NULL) || ((buf == NULL) && (capacity > 0))) {
        xfer_refuse(NOTIFY_SUBSYS, "xfer_notify_poll: NULL argument");
        return XFER_ERR_INVALID_PARAM;
    }
    ctx = ep->ctx;
    xfer_ctx_lock(ctx);
    status = xfer_api_check(ctx, "xfer_notify_poll", 0);
    if (status != XFER_OK) {
        goto out;
    }
    if (ep->closing) {
        xfer_refuse(NOTIFY_SUBSYS, "xfer_notify_poll on an endpoint that was "
                    "closed");
        status = XFER_ERR_INVALID_PARAM;
        goto out;
    }
    if (ucs_list_is_empty(&ep->notifies)) {
        xfer_progress_locked(ctx);
    }
    if (ucs_list_is_empty(&ep->notifies)) {
        status = XFER_ERR_NOT_FOUND;
        goto out;
    }
    m         = ucs_list_head(&ep->notifies, notify_msg_t, list);
    *length_p = m->length;
    if (m->length > capacity) {
        status = XFER_ERR_TRUNCATED;
        goto out;
    }
    if (m->length > 0) {
        memcpy(buf, m->data, m->length);
    }
    free(notify_take(ep));
out:
    xfer_ctx_unlock(ctx);
    return status;
}
