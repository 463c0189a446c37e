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
 * Producer: a FETCH becomes a waiter handed to the framework (tensor_request). ready() may
 * come at once or much later, from outside any call of this component; it queues the TRESP.
 * A preq stays on ep->preqs from its request until its tensor may go - an inline answer once
 * written into the ring, an RNDV one once TDONE came - and then waits on iface->releases for
 * progress() to release the tensor. A TCANCEL withdraws a waiter still waiting and answers it
 * with XFER_ERR_CANCELED; one whose answer is already on its way is left alone.
 */
#include "shm.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* preq->rndv: where an answer whose data the consumer reads stands */
enum {
    PREQ_INLINE,        /* the data goes with the answer (or there is none) */
    PREQ_RNDV_QUEUED,   /* the consumer will read the data; the answer is not written yet */
    PREQ_RNDV_SENT,     /* the answer is in the ring: the tensor stays until TDONE */
};

/* preq->dims and a result's dims hold the same ranks */
_Static_assert(XFER_SHM_TENSOR_RANK_MAX == XFER_TENSOR_MAX_RANK, "tensor ranks differ");

/* TRESP b: dtype | rank << 8 | is_dead << 16 */
#define TRESP_META(_dtype, _rank, _dead) \
    ((uint64_t)(_dtype) | ((uint64_t)(_rank) << 8) | ((uint64_t)(_dead) << 16))

/* ---- consumer ------------------------------------------------------------------------------- */

xfer_status_t xfer_shm_tensor_fetch(xfer_ep_h ep, const xfer_fetch_args_t *args,
                                    xfer_comp_t *comp)
{
    xfer_shm_frame_t hdr;
    xfer_status_t status;
    xfer_shm_op_t *op;
    uint64_t id;

    status = xfer_shm_ep_check(ep);
    if (status != XFER_OK) {
        return status;
    }
    if ((args == NULL) || (comp == NULL) || (args->result == NULL) || (args->key == NULL) ||
        (args->key_len == 0) || ((args->buffer == NULL) && (args->alloc == NULL))) {
        return XFER_ERR_INVALID_PARAM;
    }
    if (args->key_len > ep->iface->params.max_key_len) {
        xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "tensor key of %zu bytes exceeds the limit "
                 "of %u bytes", args->key_len, ep->iface->params.max_key_len);
        return XFER_ERR_OUT_OF_RANGE;
    }
    op = xfer_shm_op_new(ep->iface, ep, XFER_SHM_OP_FETCH, comp, 0);
    if (op == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    op->buf       = args->buffer;
    op->len       = (args->buffer != NULL) ? args->capacity : 0;
    op->alloc     = args->alloc;
    op->alloc_arg = args->alloc_arg;
    op->result    = args->result;
    op->on_write  = 0;      /* completes with its answer */
    status        = xfer_slot_alloc(&ep->slots, XFER_SHM_SLOT_OP, op, &id, &op->slot);
    if (status != XFER_OK) {
        xfer_shm_op_free(op);
        return status;
    }
    op->rtag = id;          /* the request id, for a TCANCEL */
    memset(&hdr, 0, sizeof(hdr));
    hdr.type = XFER_SHM_F_FETCH;
    hdr.id   = id;
    hdr.a    = args->step;
    hdr.b    = args->key_len;
    /* The request is a copy, owned by its queue entry: a fetch cancelled before the request
     * was written completes (and its op goes) while the entry still waits for the ring. */
    status = xfer_shm_tx_queue(ep, NULL, &hdr, args->key, args->key_len, 1, 0);
    if (status != XFER_OK) {
        xfer_slot_free(&ep->slots, (uint32_t)id);
        xfer_shm_op_free(op);
        return status;
    }
    xfer_shm_tx_write(ep);  /* a failure fails the ep, which completes the fetch */
    return XFER_INPROGRESS;
}

xfer_status_t xfer_shm_tensor_cancel(xfer_iface_h iface, xfer_comp_t *comp,
                                     xfer_status_t status)
{
    xfer_shm_tx_t *tx;
    xfer_ep_h ep;

    ucs_list_for_each(ep, &iface->eps, list) {
        for (uint32_t i = 0; i < ep->slots.num; i++) {
            xfer_slot_t *slot = &ep->slots.s[i];
            xfer_shm_op_t *op     = slot->obj;
            uint64_t id;

            if ((slot->kind != XFER_SHM_SLOT_OP) || (op == NULL) ||
                (op->kind != XFER_SHM_OP_FETCH) || (op->base.comp != comp)) {
                continue;
            }
            if (op->busy) {
                return XFER_ERR_BUSY;   /* its answer is arriving */
            }
            id         = op->rtag;
            slot->kind = XFER_SHM_SLOT_TOMBSTONE;
            slot->obj  = NULL;
            xfer_shm_op_complete(op, status, 0, 0);
            if ((ep->state != XFER_SHM_EP_CONNECTED) && (ep->state != XFER_SHM_EP_CREATED)) {
                return XFER_OK;         /* failing: the tombstone goes with the ep's slots */
            }
            if (xfer_shm_tx_ctrl(ep, XFER_SHM_F_TCANCEL, XFER_OK, id, 0) != XFER_OK) {
                xfer_shm_ep_fail_later(ep, XFER_ERR_NO_MEMORY, "out of memory for a TCANCEL");
            }
            return XFER_OK;
        }
        ucs_list_for_each(tx, &ep->txq, list) {
            if ((tx->op != NULL) && (tx->op->kind == XFER_SHM_OP_FETCH) &&
                (tx->op->base.comp == comp)) {
                return XFER_ERR_BUSY;   /* it has its data and completes with its TDONE */
            }
        }
    }
    return XFER_ERR_NOT_FOUND;
}

/* A TRESP with an error: it describes no tensor, and its payload is the reason. */
static xfer_status_t rx_tresp_failed(xfer_ep_h ep, const xfer_shm_frame_t *hdr,
                                     const uint8_t *payload, xfer_shm_op_t *op, char *why,
                                     size_t why_size)
{
    if ((hdr->a != 0) || (hdr->b != 0) || (hdr->flags & XFER_SHM_FL_RNDV)) {
        snprintf(why, why_size, "failed TRESP (status %" PRId32 ") describes a tensor (%"
                 PRIu64 " bytes, metadata 0x%" PRIx64 ", flags 0x%x)", hdr->status, hdr->a,
                 hdr->b, hdr->flags);
        return XFER_ERR_PROTOCOL;
    }
    ep->rx.status = xfer_shm_status_from_peer(hdr->status);
    if (op != NULL) {
        char reason[XFER_REASON_MAX];

        xfer_reason_copy(reason, sizeof(reason), payload, hdr->len);
        xfer_log_at(XFER_LOG_DEBUG, XFER_SHM_SUBSYS, "tensor fetch failed at the producer: %s "
                    "(%s)", reason, xfer_status_string(ep->rx.status));
        op->busy   = 1;
        op->base.length = 0;
    }
    xfer_shm_rx_expect(ep, XFER_SHM_RX_TRESP, NULL, 0, 0);
    return XFER_OK;
}

xfer_status_t xfer_shm_rx_tresp(xfer_ep_h ep, const xfer_shm_frame_t *hdr,
                                const uint8_t *payload, char *why, size_t why_size)
{
    xfer_slot_t *slot = xfer_slot_find(&ep->slots, hdr->id);
    int64_t dims[XFER_TENSOR_MAX_RANK] = {0};
    int rndv = (hdr->flags & XFER_SHM_FL_RNDV) != 0;
    unsigned dtype, rank, is_dead;
    uint64_t head_len, data_len;
    xfer_status_t status;
    xfer_shm_op_t *op;
    uint8_t *dest = NULL;

    if ((slot == NULL) ||
        ((slot->kind != XFER_SHM_SLOT_TOMBSTONE) &&
         ((slot->kind != XFER_SHM_SLOT_OP) || (slot->obj == NULL) ||
          (((xfer_shm_op_t*)slot->obj)->kind != XFER_SHM_OP_FETCH)))) {
        snprintf(why, why_size, "TRESP for unknown request id 0x%016" PRIx64, hdr->id);
        return XFER_ERR_PROTOCOL;
    }
    if (hdr->flags & ~XFER_SHM_FL_RNDV) {
        snprintf(why, why_size, "TRESP with unknown flags 0x%x", hdr->flags);
        return XFER_ERR_PROTOCOL;
    }
    op         = (slot->kind == XFER_SHM_SLOT_OP) ? slot->obj : NULL;
    ep->rx.op  = op;
    ep->rx.id  = hdr->id;
    if (hdr->status != XFER_OK) {
        return rx_tresp_failed(ep, hdr, payload, op, why, why_size);
    }

    dtype   = (unsigned)(hdr->b & 0xff);
    rank    = (unsigned)((hdr->b >> 8) & 0xff);
    is_dead = (unsigned)((hdr->b >> 16) & 0xff);
    if (((hdr->b >> 24) != 0) || (is_dead > 1) || (rank > XFER_SHM_TENSOR_RANK_MAX)) {
        snprintf(why, why_size, "TRESP metadata 0x%" PRIx64 " is not dtype | rank << 8 | "
                 "dead << 16", hdr->b);
        return XFER_ERR_PROTOCOL;
    }
    head_len = (uint64_t)rank * sizeof(int64_t);
    if (hdr->len < head_len) {
        snprintf(why, why_size, "TRESP of rank %u carries %" PRIu32 " bytes, less than its "
                 "dimensions", rank, hdr->len);
        return XFER_ERR_PROTOCOL;
    }
    memcpy(dims, payload, head_len);
    status = xfer_tensor_meta_check(dtype, rank, dims, hdr->a, (int)is_dead, why, why_size);
    if (status != XFER_OK) {
        return status;
    }
    data_len = is_dead ? 0 : hdr->a;
    if (data_len > ep->max_msg) {
        snprintf(why, why_size, "TRESP of %" PRIu64 " bytes exceeds the limit of %" PRIu64,
                 data_len, ep->max_msg);
        return XFER_ERR_PROTOCOL;
    }
    if (rndv ? (!ep->cma || (hdr->len != head_len) || (data_len == 0)) :
               (hdr->len - head_len > data_len)) {
        snprintf(why, why_size, "%sTRESP of %" PRIu64 " bytes carries %" PRIu64 " of them%s",
                 rndv ? "RNDV " : "", data_len, hdr->len - head_len,
                 (rndv && !ep->cma) ? " on an endpoint without cross-memory attach" : "");
        return XFER_ERR_PROTOCOL;
    }

    ep->rx.status = XFER_OK;
    if (op != NULL) {       /* not cancelled: fill the result, find room for the data */
        xfer_tensor_t *t = op->result;

        op->busy   = 1;
        op->base.length = (size_t)hdr->a;
        memset(t, 0, sizeof(*t));
        t->dtype   = (xfer_dtype_t)dtype;
        t->rank    = rank;
        t->size    = hdr->a;
        t->is_dead = (int)is_dead;
        t->data    = op->buf;
        memcpy(t->dims, dims, sizeof(t->dims));
        if (data_len == 0) {
            /* nothing to put anywhere */
        } else if (op->buf != NULL) {
            if (data_len > op->len) {
                ep->rx.status = XFER_ERR_TRUNCATED;
            } else {
                dest = op->buf;
            }
        } else {
            xfer_tensor_t meta = *t;

            meta.data = NULL;
            t->data   = op->alloc(op->alloc_arg, &meta);
            if (t->data == NULL) {
                ep->rx.status = XFER_ERR_NO_MEMORY;
            } else {
                dest = t->data;
            }
        }
    }
    if (rndv) {
        xfer_status_t read = XFER_OK;

        if (dest != NULL) {
            char cwhy[XFER_REASON_MAX] = "";

            read = xfer_shm_cma(ep, dest, hdr->c, data_len, 0, cwhy, sizeof(cwhy));
            if (read != XFER_OK) {
                xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "tensor fetch: reading %" PRIu64
                         " bytes from the producer: %s", data_len, cwhy);
                ep->rx.status = read;
            }
        }
        /* The producer holds the tensor until TDONE. A fetch that got its data completes
         * once its TDONE is in the producer's ring, so that the release there does not
         * wait for this side's next progress(). */
        xfer_shm_rx_expect(ep, XFER_SHM_RX_TRESP, NULL, 0, 0);
        if ((op != NULL) && (ep->rx.status == XFER_OK)) {
            xfer_shm_frame_t tdone;

            memset(&tdone, 0, sizeof(tdone));
            tdone.type   = XFER_SHM_F_TDONE;
            tdone.id     = hdr->id;
            op->len      = (size_t)hdr->a;     /* what completing on write reports */
            op->on_write = 1;
            op->tx.op    = op;
            ep->rx.op    = NULL;                /* tresp_done frees only the slot */
            status = xfer_shm_tx_queue(ep, &op->tx, &tdone, NULL, 0, 0, 0);
        } else {
            status = xfer_shm_tx_ctrl(ep, XFER_SHM_F_TDONE, read, hdr->id, 0);
        }
        if (status != XFER_OK) {
            snprintf(why, why_size, "out of memory for a TDONE");
            return XFER_ERR_NO_MEMORY;
        }
        return XFER_OK;
    }
    xfer_shm_rx_expect(ep, XFER_SHM_RX_TRESP, dest, (dest != NULL) ? data_len : 0, data_len);
    xfer_shm_rx_feed(ep, payload + head_len, hdr->len - head_len);
    return XFER_OK;
}

xfer_status_t xfer_shm_rx_tresp_done(xfer_ep_h ep, char *why, size_t why_size)
{
    xfer_shm_op_t *op = ep->rx.op;

    (void)why;
    (void)why_size;
    xfer_slot_free(&ep->slots, (uint32_t)ep->rx.id);
    ep->rx.op = NULL;
    if (op != NULL) {
        xfer_shm_op_complete(op, ep->rx.status, op->base.length, 0);
    }
    return XFER_OK;
}

/* ---- producer ------------------------------------------------------------------------------- */

void xfer_shm_preq_free(xfer_shm_preq_t *preq)
{
    free(preq);
}

/* What a tensor held for a peer that is going is released with. */
static xfer_status_t ep_gone_status(xfer_ep_h ep)
{
    return (ep->fail_status != XFER_OK) ? ep->fail_status : XFER_ERR_CANCELED;
}

/* preq (on ep->preqs) is done with: progress() releases its tensor with status. */
static void preq_finish(xfer_shm_preq_t *preq, xfer_status_t status)
{
    ucs_list_del(&preq->list);
    preq->release_status = status;
    ucs_list_add_tail(&preq->ep->iface->releases, &preq->list);
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

/* Check what the framework handed over for sending; XFER_OK or why not. */
static xfer_status_t tensor_check(xfer_ep_h ep, const xfer_tensor_t *tensor, char *why,
                                  size_t why_size)
{
    int is_dead;

    if (tensor == NULL) {
        snprintf(why, why_size, "producer handed over no tensor");
        return XFER_ERR_INTERNAL;
    }
    is_dead = tensor->is_dead;
    if (xfer_tensor_meta_check((unsigned)tensor->dtype, tensor->rank, tensor->dims,
                               is_dead ? 0 : tensor->size, is_dead, why, why_size) != XFER_OK) {
        return XFER_ERR_INVALID_PARAM;
    }
    if (!is_dead && (tensor->size > ep->max_msg)) {
        snprintf(why, why_size, "tensor of %" PRIu64 " bytes exceeds the message limit of %"
                 PRIu64 " bytes", tensor->size, ep->max_msg);
        return XFER_ERR_OUT_OF_RANGE;
    }
    if (!is_dead && (tensor->size > 0) && (tensor->data == NULL)) {
        snprintf(why, why_size, "tensor of %" PRIu64 " bytes has no data", tensor->size);
        return XFER_ERR_INVALID_PARAM;
    }
    return XFER_OK;
}

/* Queue the TRESP answering preq (on ep->preqs, no longer waiting). write: write it into the
 * ring now; not from inside input handling, after which progress() writes what is queued. */
static void preq_respond(xfer_shm_preq_t *preq, xfer_status_t status,
                         const xfer_tensor_t *tensor, void *handle, const char *reason,
                         int write)
{
    xfer_ep_h ep       = preq->ep;
    xfer_iface_h iface = ep->iface;
    char why[XFER_REASON_MAX];
    xfer_shm_frame_t hdr;
    const void *data   = NULL;
    uint64_t data_len  = 0;

    memset(&hdr, 0, sizeof(hdr));
    snprintf(why, sizeof(why), "%s", reason ? reason : xfer_status_string(status));
    preq->handle         = handle;
    preq->release_status = XFER_OK;
    preq->rndv           = PREQ_INLINE;
    preq->tx.head        = NULL;
    preq->tx.head_len    = 0;
    if (status == XFER_OK) {
        status = tensor_check(ep, tensor, why, sizeof(why));
        if (status == XFER_OK) {
            int is_dead = tensor->is_dead;

            hdr.a = is_dead ? 0 : tensor->size;
            hdr.b = TRESP_META(tensor->dtype, tensor->rank, is_dead ? 1 : 0);
            memcpy(preq->dims, tensor->dims, tensor->rank * sizeof(int64_t));
            preq->tx.head     = (const uint8_t*)preq->dims;
            preq->tx.head_len = tensor->rank * sizeof(int64_t);
            data              = tensor->data;
            data_len          = hdr.a;
            if (ep->cma && (data_len > 0) && (data_len >= iface->cfg->rndv_thresh)) {
                /* the consumer reads it out of this process, then says TDONE */
                hdr.flags  = XFER_SHM_FL_RNDV;
                hdr.c      = (uint64_t)(uintptr_t)data;
                data       = NULL;
                data_len   = 0;
                preq->rndv = PREQ_RNDV_QUEUED;
            }
        } else {
            char key[65];

            xfer_reason_copy(key, sizeof(key), preq->key, preq->key_len);
            xfer_log(XFER_LOG_WARN, XFER_SHM_SUBSYS, "cannot send tensor of step %" PRIu64
                     " '%s': %s", preq->step, key, why);
            preq->release_status = status;
        }
    }
    if (status != XFER_OK) {
        size_t n = strnlen(why, sizeof(why) - 1);

        /* the reason fits the first frame: a failed TRESP is one frame */
        if (n > xfer_shm_cell_payload(&ep->out)) {
            n = xfer_shm_cell_payload(&ep->out);
        }
        memcpy(preq->reason, why, n);
        data     = preq->reason;
        data_len = n;
    }
    hdr.type      = XFER_SHM_F_TRESP;
    hdr.id        = preq->id;
    hdr.status    = status;
    preq->tx.preq = preq;
    if (xfer_shm_tx_queue(ep, &preq->tx, &hdr, data, data_len, 0, 1) != XFER_OK) {
        preq_finish(preq, XFER_ERR_NO_MEMORY);
        xfer_shm_ep_fail_later(ep, XFER_ERR_NO_MEMORY, "out of memory for a tensor answer");
        return;
    }
    if (write) {
        xfer_shm_tx_write(ep);
    }
}

/* The framework's answer to tensor_request(); may come from inside it, or later from outside
 * any call of this component. */
static void preq_ready(xfer_tensor_waiter_t *waiter, xfer_status_t status,
                       const xfer_tensor_t *tensor, void *handle)
{
    xfer_shm_preq_t *preq = ucs_container_of(waiter, xfer_shm_preq_t, waiter);
    xfer_ep_h ep          = preq->ep;

    preq->waiting = 0;
    ep->num_preqs--;
    if (status != XFER_OK) {
        handle = NULL;
    }
    if (ep->state == XFER_SHM_EP_CONNECTED) {
        /* ep->rx.preq is preq while tensor_request() runs from the input handler */
        preq_respond(preq, status, tensor, handle, NULL, ep->rx.preq != preq);
        return;
    }
    /* the ep is failing: the tensor goes back from the next progress() */
    preq->handle = handle;
    preq_finish(preq, ep_gone_status(ep));
}

/* How many of one peer's requests may wait for a publish (the framework's bound). */
static uint32_t max_waiting(xfer_iface_h iface)
{
    const xfer_iface_params_t *p = &iface->params;

    if ((p->size < offsetof(xfer_iface_params_t, max_tensor_requests) + sizeof(uint32_t)) ||
        (p->max_tensor_requests == 0)) {
        return UINT32_MAX;
    }
    return p->max_tensor_requests;
}

xfer_status_t xfer_shm_rx_fetch(xfer_ep_h ep, const xfer_shm_frame_t *hdr,
                                const uint8_t *payload, char *why, size_t why_size)
{
    uint64_t key_len = hdr->b;
    xfer_shm_preq_t *preq;
    uint64_t keep;

    if ((key_len == 0) || (key_len > ep->max_msg) || (key_len > UINT32_MAX) ||
        (hdr->len > key_len)) {
        snprintf(why, why_size, "FETCH of a %" PRIu64 "-byte key carrying %" PRIu32 " bytes "
                 "(message limit %" PRIu64 ")", key_len, hdr->len, ep->max_msg);
        return XFER_ERR_PROTOCOL;
    }
    ucs_list_for_each(preq, &ep->preqs, list) {
        if (preq->id == hdr->id) {
            snprintf(why, why_size, "FETCH reuses the id 0x%016" PRIx64 " of a request still "
                     "pending", preq->id);
            return XFER_ERR_PROTOCOL;
        }
    }
    /* a key over this side's limit is dropped as it arrives and answered with an error */
    keep = (key_len <= ep->iface->params.max_key_len) ? key_len : 0;
    preq = calloc(1, sizeof(*preq) + keep + 1);
    if (preq == NULL) {
        snprintf(why, why_size, "out of memory for a tensor request");
        return XFER_ERR_NO_MEMORY;
    }
    preq->waiter.ready = preq_ready;
    preq->ep           = ep;
    preq->id           = hdr->id;
    preq->step         = hdr->a;
    preq->key_len      = (uint32_t)key_len;
    ep->rx.preq        = preq;
    ep->rx.id          = hdr->id;
    xfer_shm_rx_expect(ep, XFER_SHM_RX_FETCH_KEY, (keep > 0) ? preq->key : NULL, keep,
                       key_len);
    xfer_shm_rx_feed(ep, payload, hdr->len);
    return XFER_OK;
}

xfer_status_t xfer_shm_rx_fetch_done(xfer_ep_h ep, char *why, size_t why_size)
{
    xfer_iface_h iface    = ep->iface;
    xfer_shm_preq_t *preq = ep->rx.preq;
    xfer_status_t refuse  = XFER_OK;
    char reason[XFER_REASON_MAX];

    (void)why;
    (void)why_size;
    ucs_list_add_tail(&ep->preqs, &preq->list);
    if (preq->key_len > iface->params.max_key_len) {
        refuse = XFER_ERR_OUT_OF_RANGE;
        snprintf(reason, sizeof(reason), "tensor key of %" PRIu32 " bytes exceeds the "
                 "producer's limit of %" PRIu32 " bytes (XFER_MAX_KEY_LEN)", preq->key_len,
                 iface->params.max_key_len);
        xfer_log(XFER_LOG_WARN, XFER_SHM_SUBSYS, "refusing a tensor request: %s", reason);
    } else if (iface->params.tensor_request == NULL) {
        refuse = XFER_ERR_UNSUPPORTED;
        snprintf(reason, sizeof(reason), "this side serves no tensors");
    } else if (ep->num_preqs >= max_waiting(iface)) {
        refuse = XFER_ERR_NO_RESOURCE;
        snprintf(reason, sizeof(reason), "%u of this peer's tensor requests already wait for "
                 "a publish (XFER_TENSOR_MAX_REQUESTS)", ep->num_preqs);
        xfer_log_at(XFER_LOG_DEBUG, XFER_SHM_SUBSYS, "refusing a tensor request: %s", reason);
    }
    if (refuse != XFER_OK) {
        ep->rx.preq = NULL;
        preq_respond(preq, refuse, NULL, NULL, reason, 0);
        return XFER_OK;
    }
    preq->key_got            = preq->key_len;
    preq->key[preq->key_len] = '\0';
    preq->waiting            = 1;
    ep->num_preqs++;
    /* ready() may come before this returns; it queues the answer and leaves the writing to
     * progress(), which is running. preq is freed only by progress() (iface->releases). */
    iface->params.tensor_request(iface->params.fw_arg, ep->fw_ep, preq->step, preq->key,
                                 preq->key_len, &preq->waiter);
    ep->rx.preq = NULL;
    return XFER_OK;
}

xfer_status_t xfer_shm_rx_tdone(xfer_ep_h ep, const xfer_shm_frame_t *hdr,
                                const uint8_t *payload, char *why, size_t why_size)
{
    xfer_shm_preq_t *preq;

    (void)payload;
    (void)why;
    (void)why_size;
    ucs_list_for_each(preq, &ep->preqs, list) {
        if (preq->id != hdr->id) {
            continue;
        }
        if (preq->waiting || (preq->rndv != PREQ_RNDV_SENT)) {
            break;
        }
        preq_finish(preq, xfer_shm_status_from_peer(hdr->status));
        return XFER_OK;
    }
    xfer_log_at(XFER_LOG_DEBUG, XFER_SHM_SUBSYS, "TDONE for id 0x%016" PRIx64 " that waits "
                "for none", hdr->id);
    return XFER_OK;
}

xfer_status_t xfer_shm_rx_tcancel(xfer_ep_h ep, const xfer_shm_frame_t *hdr,
                                  const uint8_t *payload, char *why, size_t why_size)
{
    xfer_iface_h iface = ep->iface;
    xfer_shm_preq_t *preq;

    (void)payload;
    (void)why;
    (void)why_size;
    ucs_list_for_each(preq, &ep->preqs, list) {
        if (preq->id != hdr->id) {
            continue;
        }
        if (!preq->waiting) {
            break;      /* answered already: the consumer's tombstone takes that answer */
        }
        preq->waiting = 0;
        ep->num_preqs--;
        if (iface->params.tensor_withdraw != NULL) {
            iface->params.tensor_withdraw(iface->params.fw_arg, &preq->waiter);
        }
        preq_respond(preq, XFER_ERR_CANCELED, NULL, NULL, "cancelled by the consumer", 0);
        return XFER_OK;
    }
    xfer_log_at(XFER_LOG_DEBUG, XFER_SHM_SUBSYS, "TCANCEL for id 0x%016" PRIx64 " that is no "
                "longer waiting", hdr->id);
    return XFER_OK;
}

void xfer_shm_preq_sent(xfer_shm_preq_t *preq)
{
    xfer_ep_h ep = preq->ep;

    if (ep->state != XFER_SHM_EP_CONNECTED) {
        preq_finish(preq, ep_gone_status(ep));  /* dropped with the ep's queue */
    } else if (preq->rndv == PREQ_RNDV_QUEUED) {
        preq->rndv = PREQ_RNDV_SENT;            /* the data is read from here: keep it */
    } else {
        preq_finish(preq, preq->release_status);
    }
}

void xfer_shm_preq_withdraw_all(xfer_ep_h ep, xfer_status_t status)
{
    xfer_iface_h iface = ep->iface;
    xfer_shm_preq_t *preq, *tmp;

    if ((ep->rx.kind == XFER_SHM_RX_FETCH_KEY) && (ep->rx.preq != NULL)) {
        xfer_shm_preq_free(ep->rx.preq);        /* its key was arriving: on no list */
        ep->rx.preq = NULL;
    }
    ucs_list_for_each_safe(preq, tmp, &ep->preqs, list) {
        ucs_list_del(&preq->list);
        if (preq->waiting) {
            ep->num_preqs--;
            if (iface->params.tensor_withdraw != NULL) {
                iface->params.tensor_withdraw(iface->params.fw_arg, &preq->waiter);
            }
        } else {
            if (preq->rndv != PREQ_RNDV_SENT) {
                tx_unqueue(ep, &preq->tx);      /* its answer may still wait for the ring */
            }
            if ((preq->handle != NULL) && (iface->params.tensor_release != NULL)) {
                iface->params.tensor_release(iface->params.fw_arg, preq->handle, status);
            }
        }
        xfer_shm_preq_free(preq);
    }
}
