/*
 * Tensor fetches over tcp, both sides.
 *
 * The framework's engine (xfer_tframes_*, engine.h) keeps the fetches of both sides; tcp
 * carries its frames. Consumer: a fetch sends TENSOR_REQ {id, step, key}; the TENSOR_RESP's
 * data is read straight into the place the engine says (device memory through the bounce
 * buffers, tcp_cuda.c), or drained when the fetch was cancelled (TENSOR_CANCEL) or the
 * data has nowhere to go.
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

/* ---- consumer: the framework's engine keeps the fetches, tcp carries their frames ---------- */

static xfer_status_t tf_op_new(xfer_ep_h ep, const xfer_fetch_args_t *args, xfer_comp_t *comp,
                               void **op_p)
{
    xfer_tcp_op_t *op         = xfer_tcp_op_new(ep->iface, ep, XFER_TCP_OP_FETCH, comp);
    char why[XFER_REASON_MAX] = "";

    if (op == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    if (args->buffer != NULL) {
        op->cuda = xfer_tcp_buf_is_cuda(ep->iface, args->buffer, args->capacity, args->memh,
                                        why, sizeof(why));
        if (op->cuda < 0) {
            xfer_log(XFER_LOG_ERROR, XFER_TCP_SUBSYS, "tensor fetch: %s", why);
            xfer_tcp_op_free(op);
            return XFER_ERR_INVALID_PARAM;
        }
    }
    *op_p = op;
    return XFER_OK;
}

static xfer_status_t tf_send_req(xfer_ep_h ep, uint64_t id, const xfer_fetch_args_t *args)
{
    xfer_tcp_wire_hdr_t hdr        = {XFER_TCP_WIRE_MAGIC, XFER_TCP_WIRE_VERSION,
                                      XFER_TCP_WIRE_TENSOR_REQ, 0, id,
                                      XFER_TCP_WIRE_TREQ_EXT_LEN + args->key_len, 0};
    xfer_tcp_wire_tensor_req_t req = {args->step, (uint32_t)args->key_len};
    uint8_t *p                     = xfer_tcp_ep_tx_reserve(ep, XFER_TCP_WIRE_HDR_LEN +
                                                            hdr.length, 0);

    if (p == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    xfer_tcp_wire_pack_hdr(&hdr, p);
    xfer_tcp_wire_pack_tensor_req_ext(&req, p + XFER_TCP_WIRE_HDR_LEN);
    memcpy(p + XFER_TCP_WIRE_HDR_LEN + XFER_TCP_WIRE_TREQ_EXT_LEN, args->key, args->key_len);
    return XFER_OK;
}

static int tf_send(xfer_ep_h ep)
{
    xfer_tcp_ep_tx_post(ep);
    if (ep->rx.state == XFER_TCP_RX_PAUSED) {
        xfer_tcp_iface_rx_kick(ep->iface, ep);  /* its response must get through */
    }
    return 0;
}

static void tf_send_cancel(xfer_ep_h ep, uint64_t id)
{
    if ((ep->fail.state != XFER_EP_CONNECTED) && (ep->fail.state != XFER_EP_CREATED)) {
        return;
    }
    if (xfer_tcp_ep_tx_hdr(ep, XFER_TCP_WIRE_TENSOR_CANCEL, XFER_OK, id, 0) != XFER_OK) {
        xfer_tcp_ep_fail_later(ep, XFER_ERR_NO_MEMORY, "out of memory for a TENSOR_CANCEL");
        return;
    }
    xfer_tcp_ep_tx_post(ep);
}

const xfer_tframes_ops_t xfer_tcp_tframes_ops = {
    XFER_TCP_SUBSYS, XFER_TCP_SLOT_FETCH, XFER_TCP_SLOT_TOMBSTONE, offsetof(xfer_tcp_op_t, tf),
    xfer_tcp_ep_check, tf_op_new, tf_send_req, tf_send, tf_send_cancel,
};

xfer_status_t xfer_tcp_tensor_fetch(xfer_ep_h ep, const xfer_fetch_args_t *args,
                                    xfer_comp_t *comp)
{
    return xfer_tframes_fetch(&ep->tf, args, comp, ep->limits.max_key_len);
}

static xfer_status_t rx_tensor_resp_ext(xfer_ep_h ep, const uint8_t *ext, char *why,
                                        size_t why_size)
{
    xfer_tcp_rx_t *rx = &ep->rx;
    xfer_tcp_wire_tensor_resp_t resp;
    xfer_status_t status;
    uint64_t data_len;
    size_t need;
    void *dest;
    int dev = 0;

    status = xfer_tcp_wire_unpack_tensor_resp_ext(ext, rx->ext_len, &rx->hdr,
                                                  &ep->iface->limits, &resp, &need, why,
                                                  why_size);
    if (status == XFER_INPROGRESS) {
        rx->ext_len = need;     /* read the dims and the reason too, then come back */
        return XFER_INPROGRESS;
    }
    if (status == XFER_OK) {
        status = xfer_tframes_resp(&ep->tf, rx->hdr.id, rx->hdr.status, &resp.meta,
                                   ext + rx->ext_len - resp.reason_len, resp.reason_len, &dest,
                                   why, why_size);
    }
    if (status != XFER_OK) {
        return status;
    }
    data_len = xfer_tensor_wire_data_len(&resp.meta);
    if (dest != NULL) {
        xfer_tfetch_t *f = ep->tf.rx_fetch;

        dev = ucs_container_of(f, xfer_tcp_op_t, tf)->cuda;
        if (dest != f->dest.buf) {
            /* the alloc callback's buffer: find out what it is */
            dev = xfer_tcp_cuda_detect(ep->iface, dest, (size_t)data_len, why, why_size);
            if (dev < 0) {
                xfer_log(XFER_LOG_ERROR, XFER_TCP_SUBSYS, "tensor fetch into an allocated "
                         "buffer: %s", why);
                ep->tf.rx_status = XFER_ERR_INVALID_PARAM;
                dest             = NULL;
            }
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
    (void)why;
    (void)why_size;
    xfer_tframes_resp_done(&ep->tf);
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

    if (ep->fail.state != XFER_EP_CONNECTED) {
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
    uint32_t room;
    void *key;

    status = xfer_tcp_wire_unpack_tensor_req_ext(ext, &ep->rx.hdr, &ep->iface->limits, &req,
                                                 why, why_size);
    if (status == XFER_OK) {
        status = xfer_tframes_req(&ep->tf, ep->rx.hdr.id, req.step, req.key_len,
                                  ep->limits.max_msg_size, &key, &room, why, why_size);
    }
    if (status == XFER_OK) {
        xfer_tcp_rx_expect(ep, key, room, req.key_len - room);
    }
    return status;
}

static xfer_status_t rx_tensor_req_done(xfer_ep_h ep, char *why, size_t why_size)
{
    (void)why;
    (void)why_size;
    xfer_tframes_req_done(&ep->tf);
    return XFER_OK;
}

static xfer_status_t rx_tensor_cancel_ext(xfer_ep_h ep, const uint8_t *ext, char *why,
                                          size_t why_size)
{
    (void)ext;
    (void)why;
    (void)why_size;
    xfer_tcp_rx_expect(ep, NULL, 0, 0);
    xfer_tframes_cancel_rx(&ep->tf, ep->rx.hdr.id);
    return XFER_OK;
}

const xfer_tcp_rx_handler_t xfer_tcp_rx_tensor_req    = {XFER_TCP_WIRE_TREQ_EXT_LEN,
                                                         rx_tensor_req_ext, rx_tensor_req_done};
const xfer_tcp_rx_handler_t xfer_tcp_rx_tensor_resp   = {XFER_TCP_WIRE_TRESP_EXT_LEN,
                                                         rx_tensor_resp_ext,
                                                         rx_tensor_resp_done};
const xfer_tcp_rx_handler_t xfer_tcp_rx_tensor_cancel = {0, rx_tensor_cancel_ext,
                                                         NULL};
