/*
 * Tensor fetches over a component's own frames, both sides (engine.h), for the transports
 * that frame their messages themselves (tcp, shm). The component carries REQ, RESP and CANCEL
 * frames; this file keeps the fetches and the peer's requests.
 *
 * Consumer: a fetch is the component's op with a slot of its endpoint, whose id names the REQ.
 * Cancelling a fetch whose RESP has not begun to arrive completes it at once, sends CANCEL
 * and leaves a tombstone in its slot, so that the RESP - which always comes - is recognised
 * and its data dropped. Once the RESP begins to arrive the fetch is busy: a cancel is too
 * late, and the fetch completes with the RESP.
 *
 * Producer: a REQ becomes a request of the producer's engine (tensor_answer.c) once its key
 * is in; a CANCEL withdraws it while it still waits.
 */
#include "xfer_int.h"

#include <inttypes.h>
#include <stdio.h>

void xfer_tframes_init(xfer_tframes_t *tf, const xfer_tframes_ops_t *ops, xfer_ep_h ep,
                       xfer_op_pool_t *pool, xfer_slots_t *slots, xfer_tanswers_t *tanswers,
                       void *fw_ep)
{
    memset(tf, 0, sizeof(*tf));
    tf->ops      = ops;
    tf->ep       = ep;
    tf->pool     = pool;
    tf->slots    = slots;
    tf->tanswers = tanswers;
    tf->fw_ep    = fw_ep;
}

/* ---- consumer ------------------------------------------------------------------------------- */

static void *op_of(const xfer_tframes_t *tf, xfer_tfetch_t *f)
{
    return (char*)f - tf->ops->fetch_offset;
}

/* A fetch whose answer has not begun to arrive ends now; its slot keeps a tombstone that
 * drops the answer. */
static xfer_status_t fetch_cancel(xfer_cancel_hook_t *hook, xfer_status_t status)
{
    xfer_tfetch_t *f   = ucs_container_of(hook, xfer_tfetch_t, hook);
    xfer_tframes_t *tf = f->tf;
    uint64_t id        = xfer_slot_id(tf->slots, f->slot);

    if (f->busy) {
        return XFER_ERR_BUSY;
    }
    tf->slots->s[f->slot].kind = tf->ops->tomb_kind;
    tf->slots->s[f->slot].obj  = NULL;
    xfer_op_complete(tf->pool, op_of(tf, f), status, 0, 0);
    tf->ops->send_cancel(tf->ep, id);
    return XFER_OK;
}

xfer_status_t xfer_tframes_fetch(xfer_tframes_t *tf, const xfer_fetch_args_t *args,
                                 xfer_comp_t *comp, uint32_t max_key_len)
{
    const xfer_tframes_ops_t *ops = tf->ops;
    xfer_fetch_dest_t dest;
    xfer_status_t status;
    xfer_tfetch_t *f;
    void *op = NULL;
    uint64_t id;

    status = ops->check(tf->ep);
    if (status == XFER_OK) {
        status = xfer_fetch_start(args, comp, max_key_len, ops->subsys, &dest);
    }
    if (status == XFER_OK) {
        status = ops->op_new(tf->ep, args, comp, &op);
    }
    if (status != XFER_OK) {
        return status;
    }
    f       = xfer_tframes_fetch_of(tf, op);
    f->dest = dest;
    f->tf   = tf;
    status  = xfer_slot_alloc(tf->slots, ops->slot_kind, op, &id, &f->slot);
    if (status == XFER_OK) {
        status = ops->send_req(tf->ep, id, args);
        if (status != XFER_OK) {
            xfer_slot_free(tf->slots, f->slot);
        }
    }
    if (status != XFER_OK) {
        xfer_op_put(tf->pool, op);
        return status;
    }
    xfer_comp_hook(comp, &f->hook, fetch_cancel);      /* off again at its completion */
    ops->send(tf->ep);
    return XFER_INPROGRESS;
}

xfer_status_t xfer_tframes_resp(xfer_tframes_t *tf, uint64_t id, xfer_status_t status,
                                const xfer_tensor_wire_meta_t *meta, const void *reason,
                                size_t reason_len, void **dest_p, char *why, size_t why_size)
{
    xfer_slot_t *slot = xfer_slot_find(tf->slots, id);
    xfer_tfetch_t *f;
    xfer_tensor_t t;

    *dest_p = NULL;
    if ((slot == NULL) ||
        ((slot->kind != tf->ops->slot_kind) && (slot->kind != tf->ops->tomb_kind))) {
        snprintf(why, why_size, "tensor answer for unknown request id 0x%016" PRIx64, id);
        return XFER_ERR_PROTOCOL;
    }
    f             = xfer_tframes_fetch_of(tf, (slot->kind == tf->ops->slot_kind) ? slot->obj :
                                              NULL);
    tf->rx_fetch  = f;
    tf->rx_id     = id;
    tf->rx_status = status;
    if (f == NULL) {
        return XFER_OK;         /* cancelled: the data is dropped */
    }
    f->busy = 1;
    if (status != XFER_OK) {
        char text[XFER_REASON_MAX];

        xfer_reason_copy(text, sizeof(text), reason, reason_len);
        xfer_log_at(XFER_LOG_DEBUG, tf->ops->subsys, "tensor fetch failed at the producer: %s "
                    "(%s)", text, xfer_status_string(status));
        return XFER_OK;
    }
    xfer_tensor_wire_meta_to(meta, &t);
    f->size       = meta->size;
    tf->rx_status = xfer_fetch_land(&f->dest, &t, xfer_tensor_wire_data_len(meta), dest_p);
    return XFER_OK;
}

void xfer_tframes_resp_done(xfer_tframes_t *tf)
{
    xfer_tfetch_t *f = tf->rx_fetch;

    tf->rx_fetch = NULL;
    xfer_slot_free(tf->slots, (uint32_t)tf->rx_id);
    if (f != NULL) {
        xfer_op_complete(tf->pool, op_of(tf, f), tf->rx_status, (size_t)f->size, 0);
    }
}

/* ---- producer ------------------------------------------------------------------------------- */

xfer_status_t xfer_tframes_req(xfer_tframes_t *tf, uint64_t id, uint64_t step, uint32_t key_len,
                               uint64_t max_size, void **key_p, uint32_t *room_p, char *why,
                               size_t why_size)
{
    xfer_status_t status;
    xfer_tanswer_t *a;

    a = xfer_tanswer_new(tf->tanswers, &tf->treqs, tf->ep, tf->fw_ep, id, step, key_len,
                         max_size, &status, why, why_size);
    if (a == NULL) {
        return status;
    }
    tf->rx_treq = a;
    *room_p     = xfer_tanswer_key_room(a);
    *key_p      = (*room_p > 0) ? a->key : NULL;
    return XFER_OK;
}

void xfer_tframes_req_done(xfer_tframes_t *tf)
{
    xfer_tanswer_t *a = tf->rx_treq;

    tf->rx_treq = NULL;
    /* answered maybe before this returns; the tensor is released only by progress() */
    xfer_tanswer_start(a);
}

void xfer_tframes_cancel_rx(xfer_tframes_t *tf, uint64_t id)
{
    if (!xfer_tanswer_cancel(tf->tanswers, &tf->treqs, id)) {
        xfer_log_at(XFER_LOG_DEBUG, tf->ops->subsys, "tensor cancel for id 0x%016" PRIx64
                    " that is no longer waiting", id);
    }
}

void xfer_tframes_rx_abort(xfer_tframes_t *tf)
{
    if (tf->rx_treq != NULL) {
        xfer_tanswer_discard(tf->rx_treq);      /* its key was arriving */
        tf->rx_treq = NULL;
    }
    tf->rx_fetch = NULL;        /* it ends with its slot */
}

void xfer_tframes_ep_gone(xfer_tframes_t *tf, xfer_status_t status)
{
    xfer_tframes_rx_abort(tf);
    xfer_tanswers_ep_gone(&tf->treqs, status);
}
