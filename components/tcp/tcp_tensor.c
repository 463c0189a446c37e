/*
 * Tensor fetches over tcp, both sides.
 *
 * Consumer: tensor_fetch() sends TENSOR_REQ {id, step, key}; the TENSOR_RESP fills the
 * result and its data lands in the caller's buffer or in one the alloc callback returns.
 * Cancelling a fetch whose response has not started to arrive sends TENSOR_CANCEL, completes
 * the fetch, and leaves a tombstone in its slot so that the response, which always comes, is
 * drained and dropped.
 *
 * Producer: a TENSOR_REQ goes to the framework's engine (xfer_tanswer_*, engine.h), which
 * keeps it until the tensor is published and calls xfer_tcp_tensor_answer - at once or much
 * later, from outside any call into this component - to queue the TENSOR_RESP, the data
 * written straight from the published tensor; the engine releases the tensor once it is
 * written. A TENSOR_CANCEL answers a request still waiting with XFER_ERR_CANCELED; one whose
 * answer is already on its way is left alone.
 */
#include "tcp.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- consumer ------------------------------------------------------------------------------- */

/* A fetch whose response has not started to arrive ends now; its slot keeps a tombstone that
 * drops the response, which always comes. */
static xfer_status_t fetch_cancel(xfer_cancel_hook_t *hook, xfer_status_t status)
{
    xfer_tcp_op_t *op = ucs_container_of(hook, xfer_tcp_op_t, hook);
    xfer_ep_h ep      = op->ep;
    uint64_t id       = xfer_slot_id(&ep->slots, op->slot);

    if (op->busy) {
        return XFER_ERR_BUSY;   /* its response is arriving */
    }
    ep->slots.s[op->slot].kind = XFER_TCP_SLOT_TOMBSTONE;
    ep->slots.s[op->slot].obj  = NULL;
    xfer_tcp_op_complete(op, status, 0, 0);
    if ((ep->state == XFER_TCP_EP_CONNECTED) || (ep->state == XFER_TCP_EP_CREATED)) {
        if (xfer_tcp_ep_tx_hdr(ep, XFER_TCP_WIRE_TENSOR_CANCEL, XFER_OK, id, 0) != XFER_OK) {
            xfer_tcp_ep_fail_later(ep, XFER_ERR_NO_MEMORY, "out of memory for a "
                                   "TENSOR_CANCEL");
            return XFER_OK;
        }
        xfer_tcp_ep_tx_post(ep);
    }
    return XFER_OK;
}

xfer_status_t xfer_tcp_tensor_fetch(xfer_ep_h ep, const xfer_fetch_args_t *args,
                                    xfer_comp_t *comp)
{
    xfer_tcp_wire_hdr_t hdr = {XFER_TCP_WIRE_MAGIC, XFER_TCP_WIRE_VERSION,
                               XFER_TCP_WIRE_TENSOR_REQ, 0, 0, 0, 0};
    xfer_tcp_wire_tensor_req_t req;
    xfer_fetch_dest_t dest;
    xfer_status_t status;
    xfer_tcp_op_t *op;
    uint8_t *p;

    status = xfer_tcp_ep_check(ep);
    if (status == XFER_OK) {
        status = xfer_fetch_start(args, comp, ep->limits.max_key_len, XFER_TCP_SUBSYS, &dest);
    }
    if (status != XFER_OK) {
        return status;
    }
    op = xfer_tcp_op_new(ep->iface, ep, XFER_TCP_OP_FETCH, comp);
    if (op == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    op->fetch = dest;
    if (args->buffer != NULL) {
        char why[XFER_REASON_MAX] = "";
        int cuda = xfer_tcp_buf_is_cuda(ep->iface, args->buffer, args->capacity, args->memh,
                                        why, sizeof(why));

        if (cuda < 0) {
            xfer_log(XFER_LOG_ERROR, XFER_TCP_SUBSYS, "tensor fetch: %s", why);
            xfer_tcp_op_free(op);
            return XFER_ERR_INVALID_PARAM;
        }
        op->cuda = cuda;
    }
    status = xfer_slot_alloc(&ep->slots, XFER_TCP_SLOT_FETCH, op, &hdr.id, &op->slot);
    if (status != XFER_OK) {
        xfer_tcp_op_free(op);
        return status;
    }
    hdr.length = XFER_TCP_WIRE_TREQ_EXT_LEN + args->key_len;
    p = xfer_tcp_ep_tx_reserve(ep, XFER_TCP_WIRE_HDR_LEN + hdr.length, 0);
    if (p == NULL) {
        xfer_slot_free(&ep->slots, op->slot);
        xfer_tcp_op_free(op);
        return XFER_ERR_NO_MEMORY;
    }
    xfer_comp_hook(comp, &op->hook, fetch_cancel);     /* off again at its completion */
    req.step    = args->step;
    req.key_len = (uint32_t)args->key_len;
    xfer_tcp_wire_pack_hdr(&hdr, p);
    xfer_tcp_wire_pack_tensor_req_ext(&req, p + XFER_TCP_WIRE_HDR_LEN);
    memcpy(p + XFER_TCP_WIRE_HDR_LEN + XFER_TCP_WIRE_TREQ_EXT_LEN, args->key, args->key_len);
    xfer_tcp_ep_tx_post(ep);
    if (ep->rx.state == XFER_TCP_RX_PAUSED) {
        xfer_tcp_iface_rx_kick(ep->iface, ep);  /* its response must get through */
    }
    return XFER_INPROGRESS;
}

static xfer_status_t rx_tensor_resp_ext(xfer_ep_h ep, const uint8_t *ext, char *why,
                                        size_t why_size)
{
    xfer_tcp_rx_t *rx     = &ep->rx;
    xfer_slot_t *slot = xfer_slot_find(&ep->slots, rx->hdr.id);
    xfer_tcp_wire_tensor_resp_t resp;
    xfer_status_t status;
    uint64_t data_len;
    xfer_tensor_t meta;
    size_t need;
    void *dest;
    int dev;
    xfer_tcp_op_t *op;

    if ((slot == NULL) ||
        ((slot->kind != XFER_TCP_SLOT_FETCH) && (slot->kind != XFER_TCP_SLOT_TOMBSTONE))) {
        snprintf(why, why_size, "TENSOR_RESP for unknown request id 0x%016" PRIx64,
                 rx->hdr.id);
        return XFER_ERR_PROTOCOL;
    }
    status = xfer_tcp_wire_unpack_tensor_resp_ext(ext, rx->ext_len, &rx->hdr,
                                                  &ep->iface->limits, &resp, &need, why,
                                                  why_size);
    if (status == XFER_INPROGRESS) {
        rx->ext_len = need;     /* read the dims and the reason too, then come back */
        return XFER_INPROGRESS;
    }
    if (status != XFER_OK) {
        return status;
    }
    data_len = xfer_tensor_wire_data_len(&resp.meta);
    op       = slot->obj;
    rx->op   = op;
    rx->size = resp.meta.size;
    if (op == NULL) {   /* cancelled: drop the answer */
        xfer_tcp_rx_expect(ep, NULL, 0, data_len);
        return XFER_OK;
    }
    op->busy = 1;
    if (rx->hdr.status != XFER_OK) {
        char reason[XFER_TCP_WIRE_MAX_REASON + 1];

        xfer_reason_copy(reason, sizeof(reason), ext + rx->ext_len - resp.reason_len,
                         resp.reason_len);
        xfer_log_at(XFER_LOG_DEBUG, XFER_TCP_SUBSYS, "tensor fetch failed at the producer: %s "
                    "(%s)", reason, xfer_status_string((xfer_status_t)rx->hdr.status));
        rx->status = rx->hdr.status;
        xfer_tcp_rx_expect(ep, NULL, 0, 0);
        return XFER_OK;
    }
    xfer_tensor_wire_meta_to(&resp.meta, &meta);
    rx->status = xfer_fetch_land(&op->fetch, &meta, data_len, &dest);
    dev        = op->cuda;
    if ((dest != NULL) && (dest != op->fetch.buf)) {
        /* the alloc callback's buffer: found out what it is */
        dev = xfer_tcp_cuda_detect(ep->iface, dest, (size_t)data_len, why, why_size);
        if (dev < 0) {
            xfer_log(XFER_LOG_ERROR, XFER_TCP_SUBSYS, "tensor fetch into an allocated buffer: "
                     "%s", why);
            rx->status = XFER_ERR_INVALID_PARAM;
            dest       = NULL;
        }
    }
    if (dest == NULL) {
        xfer_tcp_rx_expect(ep, NULL, 0, data_len);     /* none, or dropped */
    } else if (dev) {
        xfer_tcp_rx_expect_device(ep, dest, (size_t)data_len, 0);
    } else {
        xfer_tcp_rx_expect(ep, dest, (size_t)data_len, 0);
    }
    return XFER_OK;
}

static xfer_status_t rx_tensor_resp_done(xfer_ep_h ep, char *why, size_t why_size)
{
    xfer_tcp_op_t *op = ep->rx.op;

    (void)why;
    (void)why_size;
    xfer_slot_free(&ep->slots, (uint32_t)ep->rx.hdr.id);
    if (op != NULL) {
        xfer_tcp_op_complete(op, ep->rx.status,
                             (ep->rx.hdr.status == XFER_OK) ? (size_t)ep->rx.size : 0, 0);
    }
    return XFER_OK;
}

/* ---- producer: the framework's engine keeps the requests, tcp sends the answers --------- */

void xfer_tcp_tensor_answer(xfer_tanswer_t *a, xfer_status_t status, const xfer_tensor_t *tensor,
                            const char *reason)
{
    xfer_tcp_answer_t *ans  = a->priv;
    xfer_ep_h ep            = a->ep;
    xfer_tcp_wire_hdr_t hdr = {XFER_TCP_WIRE_MAGIC, XFER_TCP_WIRE_VERSION,
                               XFER_TCP_WIRE_TENSOR_RESP, 0, a->id, 0, 0};
    xfer_tcp_wire_tensor_resp_t resp;
    char why[XFER_REASON_MAX] = "";
    const void *data          = NULL;
    uint64_t data_len         = 0;
    size_t hdr_len, ext_len;
    int dev = 0;

    if (ep->state != XFER_TCP_EP_CONNECTED) {
        xfer_tanswer_done(a, ep->fail.status);  /* the connection is failing: nothing goes */
        return;
    }
    if ((status == XFER_OK) && !tensor->is_dead &&
        ((dev = xfer_tcp_cuda_detect(ep->iface, tensor->data, tensor->size, why,
                                     sizeof(why))) < 0)) {
        xfer_log(XFER_LOG_WARN, XFER_TCP_SUBSYS, "cannot send a tensor: %s", why);
        status            = XFER_ERR_INVALID_PARAM;
        reason            = why;
        dev               = 0;
        a->release_status = status;     /* the publish hears that it was not sent */
    }
    xfer_tensor_wire_meta_from(&resp.meta, (status == XFER_OK) ? tensor : NULL);
    resp.reason_len = (status == XFER_OK) ? 0 :
                      (uint32_t)strnlen(reason, XFER_TCP_WIRE_MAX_REASON);
    if (status == XFER_OK) {
        data     = tensor->data;
        data_len = xfer_tensor_wire_data_len(&resp.meta);
    }
    ans->a     = a;
    hdr.status = status;
    ext_len    = xfer_tcp_wire_pack_tensor_resp_ext(&resp, ans->hdr + XFER_TCP_WIRE_HDR_LEN);
    hdr.length = ext_len + resp.reason_len + data_len;
    hdr_len    = XFER_TCP_WIRE_HDR_LEN + ext_len + resp.reason_len;
    xfer_tcp_wire_pack_hdr(&hdr, ans->hdr);
    if (resp.reason_len > 0) {
        memcpy(ans->hdr + XFER_TCP_WIRE_HDR_LEN + ext_len, reason, resp.reason_len);
    }
    ans->tx.kind            = XFER_TCP_TX_ANSWER;
    ans->tx.resp            = XFER_TCP_ANSWER_COST(hdr_len + data_len);
    ans->tx.iov[0].iov_base = ans->hdr;
    ans->tx.iov[0].iov_len  = hdr_len;
    ans->tx.iov[1].iov_base = (void*)data;
    ans->tx.iov[1].iov_len  = (size_t)data_len;
    ans->tx.dev             = dev && (data_len > 0);
    xfer_tcp_ep_tx_push(ep, &ans->tx);
    xfer_tcp_ep_tx_post(ep);
}

static xfer_status_t rx_tensor_req_ext(xfer_ep_h ep, const uint8_t *ext, char *why,
                                       size_t why_size)
{
    xfer_tcp_wire_tensor_req_t req;
    xfer_status_t status;

    status = xfer_tcp_wire_unpack_tensor_req_ext(ext, &ep->rx.hdr, &ep->iface->limits, &req,
                                                 why, why_size);
    if (status != XFER_OK) {
        return status;
    }
    ep->rx.treq = xfer_tanswer_new(ep->iface->tanswers, &ep->treqs, ep, ep->fail.fw_ep,
                                   ep->rx.hdr.id, req.step, req.key_len,
                                   ep->limits.max_msg_size, &status, why, why_size);
    if (ep->rx.treq == NULL) {
        return status;
    }
    xfer_tcp_rx_expect(ep, ep->rx.treq->key, req.key_len, 0);
    return XFER_OK;
}

static xfer_status_t rx_tensor_req_done(xfer_ep_h ep, char *why, size_t why_size)
{
    xfer_tanswer_t *a = ep->rx.treq;

    (void)why;
    (void)why_size;
    ep->rx.treq = NULL;
    /* answered maybe before this returns; the tensor is released only by progress() */
    xfer_tanswer_start(a);
    return XFER_OK;
}

static xfer_status_t rx_tensor_cancel_ext(xfer_ep_h ep, const uint8_t *ext, char *why,
                                          size_t why_size)
{
    (void)ext;
    (void)why;
    (void)why_size;
    xfer_tcp_rx_expect(ep, NULL, 0, 0);
    if (!xfer_tanswer_cancel(ep->iface->tanswers, &ep->treqs, ep->rx.hdr.id)) {
        xfer_log_at(XFER_LOG_DEBUG, XFER_TCP_SUBSYS, "TENSOR_CANCEL for id 0x%016" PRIx64
                    " that is no longer waiting", ep->rx.hdr.id);
    }
    return XFER_OK;
}

const xfer_tcp_rx_handler_t xfer_tcp_rx_tensor_req    = {XFER_TCP_WIRE_TREQ_EXT_LEN,
                                                         rx_tensor_req_ext, rx_tensor_req_done};
const xfer_tcp_rx_handler_t xfer_tcp_rx_tensor_resp   = {XFER_TCP_WIRE_TRESP_EXT_LEN,
                                                         rx_tensor_resp_ext,
                                                         rx_tensor_resp_done};
const xfer_tcp_rx_handler_t xfer_tcp_rx_tensor_cancel = {0, rx_tensor_cancel_ext,
                                                         NULL};
