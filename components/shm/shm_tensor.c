/*
 * Tensor fetches over shm, both sides.
 *
 * Consumer: tensor_fetch() queues FETCH {id, step, key}; the TRESP answering it fills the
 * result, and its data - inline through the ring, or read out of the producer by cross-memory
 * attach (RNDV, then TDONE lets the producer release the tensor) - lands in the caller's
 * buffer or in one the alloc callback returns. Cancelling a fetch whose answer has not
 * started to arrive completes it, sends TCANCEL and leaves a tombstone in its slot, so that
 * the answer, which always comes, is dropped (and an RNDV one still acknowledged).
 *
 * Producer: a FETCH goes to the framework's engine (xfer_tanswer_*, engine.h), which keeps it
 * until the tensor is published and calls xfer_shm_tensor_answer - at once or much later,
 * from outside any call of this component - to queue the TRESP. The engine holds the request
 * until its tensor may go - an inline answer once written into the ring, an RNDV one once
 * TDONE came - and progress() releases the tensor then. A TCANCEL answers a request still
 * waiting with XFER_ERR_CANCELED; one whose answer is already on its way is left alone.
 */
#include "shm.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* xfer_shm_answer_t.rndv: where an answer whose data the consumer reads stands */
enum {
    PREQ_INLINE,        /* the data goes with the answer (or there is none) */
    PREQ_RNDV_QUEUED,   /* the consumer will read the data; the answer is not written yet */
    PREQ_RNDV_SENT,     /* the answer is in the ring: the tensor stays until TDONE */
};

/* a TRESP's description goes in its first cell, whatever the ring's cells */
_Static_assert(XFER_SHM_CELL_MIN - XFER_SHM_FRAME_HDR >= XFER_TENSOR_WIRE_META_MAX,
               "the smallest cell cannot carry a tensor's description");

/* ---- consumer: the framework's engine keeps the fetches, shm carries their frames ---------- */

static xfer_status_t tf_op_new(xfer_ep_h ep, const xfer_fetch_args_t *args, xfer_comp_t *comp,
                               void **op_p)
{
    (void)args;
    *op_p = xfer_shm_op_new(ep->iface, ep, XFER_SHM_OP_FETCH, comp, 0);
    return (*op_p != NULL) ? XFER_OK : XFER_ERR_NO_MEMORY;     /* completes with its answer */
}

static xfer_status_t tf_send_req(xfer_ep_h ep, uint64_t id, const xfer_fetch_args_t *args)
{
    xfer_shm_frame_t hdr;

    memset(&hdr, 0, sizeof(hdr));
    hdr.type = XFER_SHM_F_FETCH;
    hdr.id   = id;
    hdr.a    = args->step;
    hdr.b    = args->key_len;
    /* The request is a copy, owned by its queue entry: a fetch cancelled before the request
     * was written completes (and its op goes) while the entry still waits for the ring. */
    return xfer_shm_tx_queue(ep, NULL, &hdr, args->key, args->key_len, 1, 0);
}

static void tf_send_cancel(xfer_ep_h ep, uint64_t id)
{
    if ((ep->fail.state != XFER_EP_CONNECTED) && (ep->fail.state != XFER_EP_CREATED)) {
        return;         /* failing: the tombstone goes with the ep's slots */
    }
    if (xfer_shm_tx_ctrl(ep, XFER_SHM_F_TCANCEL, XFER_OK, id, 0) != XFER_OK) {
        xfer_shm_ep_fail_later(ep, XFER_ERR_NO_MEMORY, "out of memory for a TCANCEL");
    }
}

const xfer_tframes_ops_t xfer_shm_tframes_ops = {
    XFER_SHM_SUBSYS, XFER_SHM_SLOT_FETCH, XFER_SHM_SLOT_TOMBSTONE, offsetof(xfer_shm_op_t, tf),
    xfer_shm_ep_check, tf_op_new, tf_send_req, xfer_shm_tx_write, tf_send_cancel,
};

xfer_status_t xfer_shm_tensor_fetch(xfer_ep_h ep, const xfer_fetch_args_t *args,
                                    xfer_comp_t *comp)
{
    return xfer_tframes_fetch(&ep->tf, args, comp, ep->iface->params.max_key_len);
}

/*
 * A fetched tensor's data was read from the producer (status XFER_OK), or could not be. The
 * producer holds the tensor until TDONE. A fetch that got its data completes once its TDONE is
 * in the producer's ring, so that the release there does not wait for this side's next
 * progress(); one that did not completes now.
 */
static void tresp_read_done(xfer_ep_h ep, xfer_shm_op_t *op, uint64_t id, uint64_t len,
                            xfer_status_t status, const char *why)
{
    xfer_shm_frame_t tdone;

    if (status != XFER_OK) {
        xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "tensor fetch: reading %" PRIu64 " bytes "
                 "from the producer: %s", len, why);
    }
    if (ep->fail.state != XFER_EP_CONNECTED) {
        if (status == XFER_OK) {
            status = (ep->fail.status != XFER_OK) ? ep->fail.status : XFER_ERR_CANCELED;
        }
    } else if (status == XFER_OK) {
        memset(&tdone, 0, sizeof(tdone));
        tdone.type   = XFER_SHM_F_TDONE;
        tdone.id     = id;
        op->len      = (size_t)op->tf.size;     /* what completing on write reports */
        op->on_write = 1;
        op->tx.op    = op;
        if (xfer_shm_tx_queue(ep, &op->tx, &tdone, NULL, 0, 0, 0) == XFER_OK) {
            xfer_shm_tx_write(ep);
            return;
        }
        status = XFER_ERR_NO_MEMORY;
        xfer_shm_ep_fail_later(ep, status, "out of memory for a TDONE");
    } else if (xfer_shm_tx_ctrl(ep, XFER_SHM_F_TDONE, status, id, 0) != XFER_OK) {
        xfer_shm_ep_fail_later(ep, XFER_ERR_NO_MEMORY, "out of memory for a TDONE");
    }
    xfer_shm_op_complete(op, status, (size_t)op->tf.size, 0);
}

static void tresp_pull_done(xfer_shm_pull_t *p, xfer_status_t status)
{
    tresp_read_done(p->ep, p->op, p->id, p->len, status, p->why);
}

xfer_status_t xfer_shm_rx_tresp(xfer_ep_h ep, const xfer_shm_frame_t *hdr,
                                const uint8_t *payload, char *why, size_t why_size)
{
    xfer_status_t status = xfer_shm_status_from_peer(hdr->status);
    int rndv             = (hdr->flags & XFER_SHM_FL_RNDV) != 0;
    xfer_tensor_wire_meta_t meta;
    size_t head_len   = hdr->len;   /* failed: the payload is the reason */
    uint64_t data_len = 0;
    xfer_shm_op_t *op;
    void *dest;

    if ((hdr->flags & ~XFER_SHM_FL_RNDV) || ((hdr->a | hdr->b) != 0) ||
        ((status != XFER_OK) && rndv)) {
        snprintf(why, why_size, "TRESP of status %" PRId32 " with flags 0x%x or reserved words "
                 "set", hdr->status, hdr->flags);
        return XFER_ERR_PROTOCOL;
    }
    if (status == XFER_OK) {
        /* the description is whole in the first cell (the assertion above) */
        if (xfer_tensor_wire_parse_meta(payload, hdr->len, &meta, &head_len, why, why_size) !=
            XFER_OK) {
            return XFER_ERR_PROTOCOL;
        }
        data_len = xfer_tensor_wire_data_len(&meta);
        if ((meta.flags & XFER_TENSOR_META_NONE) || (data_len > ep->max_msg) ||
            (rndv ? (!ep->cma || (hdr->len != head_len) || (data_len == 0)) :
                    (hdr->len - head_len > data_len))) {
            snprintf(why, why_size, "%sTRESP of %" PRIu64 " bytes (limit %" PRIu64 ") carries %"
                     PRIu64 " of them%s%s", rndv ? "RNDV " : "", data_len, ep->max_msg,
                     (uint64_t)(hdr->len - head_len),
                     (meta.flags & XFER_TENSOR_META_NONE) ? ", describing no tensor" : "",
                     (rndv && !ep->cma) ? " on an endpoint without cross-memory attach" : "");
            return XFER_ERR_PROTOCOL;
        }
    }
    status = xfer_tframes_resp(&ep->tf, hdr->id, status, &meta, payload, hdr->len, &dest, why,
                               why_size);
    if (status != XFER_OK) {
        return status;
    }
    if (!rndv) {
        xfer_shm_rx_expect(ep, XFER_SHM_RX_TRESP, dest, (dest != NULL) ? data_len : 0,
                           data_len);
        xfer_shm_rx_feed(ep, payload + head_len, hdr->len - head_len);
        return XFER_OK;
    }
    xfer_shm_rx_expect(ep, XFER_SHM_RX_TRESP, NULL, 0, 0);
    if (dest != NULL) {
        char rwhy[XFER_REASON_MAX] = "";
        xfer_status_t read;

        /* the fetch is the read's until it ends: rx_tresp_done frees only the slot */
        op              = ucs_container_of(ep->tf.rx_fetch, xfer_shm_op_t, tf);
        ep->tf.rx_fetch = NULL;
        read = xfer_shm_pull(ep, dest, hdr->c, data_len, tresp_pull_done, op, hdr->id, rwhy,
                             sizeof(rwhy));
        if (read != XFER_INPROGRESS) {
            tresp_read_done(ep, op, hdr->id, data_len, read, rwhy);
        }
    } else if (xfer_shm_tx_ctrl(ep, XFER_SHM_F_TDONE, XFER_OK, hdr->id, 0) != XFER_OK) {
        snprintf(why, why_size, "out of memory for a TDONE");
        return XFER_ERR_NO_MEMORY;
    }
    return XFER_OK;
}

xfer_status_t xfer_shm_rx_tresp_done(xfer_ep_h ep, char *why, size_t why_size)
{
    (void)why;
    (void)why_size;
    xfer_tframes_resp_done(&ep->tf);
    return XFER_OK;
}

/* ---- producer ------------------------------------------------------------------------------- */

/* What a tensor held for a peer that is going is released with. */
static xfer_status_t ep_gone_status(xfer_ep_h ep)
{
    return (ep->fail.status != XFER_OK) ? ep->fail.status : XFER_ERR_CANCELED;
}

/* Take tx out of ep's send queue if it is still there. */
static void tx_unqueue(xfer_ep_h ep, xfer_shm_tx_t *tx)
{
    xfer_shm_tx_t *it;

    ucs_list_for_each(it, &ep->txq, list) {
        if (it == tx) {
            ucs_list_del(&tx->list);
            return;
        }
    }
}

/* The engine's primitive: queue the TRESP answering a. Into the ring at once, except from
 * inside input handling, after which progress() writes what is queued. */
void xfer_shm_tensor_answer(xfer_tanswer_t *a, xfer_status_t status, const xfer_tensor_t *tensor,
                            const char *reason)
{
    xfer_shm_answer_t *ans = a->priv;
    xfer_ep_h ep           = a->ep;
    xfer_iface_h iface     = ep->iface;
    const void *data       = NULL;
    uint64_t data_len      = 0;
    xfer_shm_frame_t hdr;

    if (ep->fail.state != XFER_EP_CONNECTED) {
        xfer_tanswer_done(a, ep_gone_status(ep));   /* the ep is failing: nothing goes */
        return;
    }
    memset(&hdr, 0, sizeof(hdr));
    ans->a           = a;
    ans->rndv        = PREQ_INLINE;
    ans->tx.head     = NULL;
    ans->tx.head_len = 0;
    if (status == XFER_OK) {
        xfer_tensor_wire_meta_t meta;

        xfer_tensor_wire_meta_from(&meta, tensor);
        ans->tx.head     = ans->meta;
        ans->tx.head_len = xfer_tensor_wire_pack_meta(&meta, ans->meta);
        data             = tensor->data;
        data_len         = xfer_tensor_wire_data_len(&meta);
        if (ep->cma && (data_len > 0) && (data_len >= iface->cfg->rndv_thresh)) {
            /* the consumer reads it out of this process, then says TDONE */
            hdr.flags = XFER_SHM_FL_RNDV;
            hdr.c     = (uint64_t)(uintptr_t)data;
            data      = NULL;
            data_len  = 0;
            ans->rndv = PREQ_RNDV_QUEUED;
        }
    } else {
        /* the reason fits the first frame: a failed TRESP is one frame */
        data_len = strnlen(reason, sizeof(ans->reason) - 1);
        if (data_len > xfer_shm_cell_payload(&ep->out)) {
            data_len = xfer_shm_cell_payload(&ep->out);
        }
        memcpy(ans->reason, reason, data_len);
        data = ans->reason;
    }
    hdr.type     = XFER_SHM_F_TRESP;
    hdr.id       = a->id;
    hdr.status   = status;
    ans->tx.answer_of = ans;
    if (xfer_shm_tx_queue(ep, &ans->tx, &hdr, data, data_len, 0, 1) != XFER_OK) {
        xfer_tanswer_done(a, XFER_ERR_NO_MEMORY);
        xfer_shm_ep_fail_later(ep, XFER_ERR_NO_MEMORY, "out of memory for a tensor answer");
        return;
    }
    if (!ep->in_rx) {
        xfer_shm_tx_write(ep);
    }
}

xfer_status_t xfer_shm_rx_fetch(xfer_ep_h ep, const xfer_shm_frame_t *hdr,
                                const uint8_t *payload, char *why, size_t why_size)
{
    uint64_t key_len = hdr->b;
    xfer_status_t status;
    uint32_t room;
    void *key;

    if ((key_len == 0) || (key_len > ep->max_msg) || (key_len > UINT32_MAX) ||
        (hdr->len > key_len)) {
        snprintf(why, why_size, "FETCH of a %" PRIu64 "-byte key carrying %" PRIu32 " bytes "
                 "(message limit %" PRIu64 ")", key_len, hdr->len, ep->max_msg);
        return XFER_ERR_PROTOCOL;
    }
    status = xfer_tframes_req(&ep->tf, hdr->id, hdr->a, (uint32_t)key_len, ep->max_msg, &key,
                              &room, why, why_size);
    if (status != XFER_OK) {
        return status;
    }
    /* a key over this side's limit is dropped as it arrives and answered with an error */
    xfer_shm_rx_expect(ep, XFER_SHM_RX_FETCH_KEY, key, room, key_len);
    xfer_shm_rx_feed(ep, payload, hdr->len);
    return XFER_OK;
}

xfer_status_t xfer_shm_rx_fetch_done(xfer_ep_h ep, char *why, size_t why_size)
{
    (void)why;
    (void)why_size;
    xfer_tframes_req_done(&ep->tf);
    return XFER_OK;
}

xfer_status_t xfer_shm_rx_tdone(xfer_ep_h ep, const xfer_shm_frame_t *hdr,
                                const uint8_t *payload, char *why, size_t why_size)
{
    xfer_tanswer_t *a = xfer_tanswer_find(ep->iface->base.tanswers, &ep->tf.treqs, hdr->id);

    (void)payload;
    (void)why;
    (void)why_size;
    if ((a != NULL) && (((xfer_shm_answer_t*)a->priv)->rndv == PREQ_RNDV_SENT)) {
        xfer_tanswer_done(a, xfer_shm_status_from_peer(hdr->status));
        return XFER_OK;
    }
    xfer_log_at(XFER_LOG_DEBUG, XFER_SHM_SUBSYS, "TDONE for id 0x%016" PRIx64 " that waits "
                "for none", hdr->id);
    return XFER_OK;
}

xfer_status_t xfer_shm_rx_tcancel(xfer_ep_h ep, const xfer_shm_frame_t *hdr,
                                  const uint8_t *payload, char *why, size_t why_size)
{
    (void)payload;
    (void)why;
    (void)why_size;
    xfer_tframes_cancel_rx(&ep->tf, hdr->id);
    return XFER_OK;
}

void xfer_shm_answer_sent(xfer_shm_answer_t *ans)
{
    xfer_ep_h ep = ans->a->ep;

    if (ep->fail.state != XFER_EP_CONNECTED) {
        xfer_tanswer_done(ans->a, ep_gone_status(ep));  /* dropped with the ep's queue */
    } else if (ans->rndv == PREQ_RNDV_QUEUED) {
        ans->rndv = PREQ_RNDV_SENT;                     /* the data is read from here: keep it */
    } else {
        xfer_tanswer_done(ans->a, XFER_OK);
    }
}

void xfer_shm_treqs_gone(xfer_ep_h ep, xfer_status_t status)
{
    xfer_tanswer_t *a;

    /* an answer still waiting for the ring leaves it before its tensor goes */
    for (a = ep->tf.treqs.first; a != NULL; a = a->next) {
        xfer_shm_answer_t *ans = a->priv;

        if ((ans->a == a) && (ans->rndv != PREQ_RNDV_SENT)) {
            tx_unqueue(ep, &ans->tx);
        }
    }
    xfer_tframes_ep_gone(&ep->tf, status);
}
