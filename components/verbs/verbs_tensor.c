/*
 * Tensor fetches over verbs, both sides, with the tcp component's semantics.
 *
 * Consumer: TREQ {id, step, key}. The answer, TRESP {id}, carries the metadata and either
 * the data inline (small tensors, dead ones, errors with a reason) or the producer's
 * address and rkey: the consumer then RDMA-READs the data straight into the caller's buffer
 * (or the one the alloc callback returns) and answers TDONE, which lets the producer release
 * the tensor. A fetch cancelled before its answer leaves a tombstone that drops the answer
 * (and still sends TDONE for a READ answer, so the producer is not left holding the tensor).
 *
 * Producer: a TREQ becomes a waiter handed to the framework. ready() may come at once or much
 * later; it sends the TRESP. A source that is not registered goes through the MR cache.
 *
 * The fuller protocol of the seeds (RDMA WRITE with immediate into a registered destination,
 * a metadata cache, re-requests) replaces this in the next step; the messages above keep
 * the same framework contract.
 */
#include "verbs.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t inline_max(const xfer_iface_h iface)
{
    return iface->cfg->seg_size - XFER_VERBS_WIRE_HDR_LEN - XFER_VERBS_WIRE_TRESP_LEN;
}

/* ---- consumer ------------------------------------------------------------------------------ */

xfer_status_t xfer_verbs_tensor_fetch(xfer_ep_h ch, const xfer_fetch_args_t *args,
                                      xfer_comp_t *comp)
{
    xfer_verbs_wire_hdr_t hdr = {.type = XFER_VERBS_MSG_TREQ};
    xfer_status_t status      = xfer_verbs_ch_check(ch);
    xfer_verbs_op_t *op;
    uint8_t *p;

    if ((status != XFER_OK) && (status != XFER_ERR_BUSY)) {
        return status;
    }
    if ((args == NULL) || (comp == NULL) || (args->result == NULL) || (args->key == NULL) ||
        (args->key_len == 0) || ((args->buffer == NULL) && (args->alloc == NULL))) {
        return XFER_ERR_INVALID_PARAM;
    }
    if ((args->key_len > ch->max_key_len) ||
        (XFER_VERBS_WIRE_HDR_LEN + XFER_VERBS_WIRE_TREQ_LEN + args->key_len >
         ch->iface->cfg->seg_size)) {
        xfer_log(XFER_LOG_ERROR, XFER_VERBS_SUBSYS, "tensor key of %zu bytes exceeds the limit "
                 "of %u bytes (here or at the peer)", args->key_len, ch->max_key_len);
        return XFER_ERR_OUT_OF_RANGE;
    }
    op = xfer_verbs_op_new(ch->iface, ch, XFER_VERBS_OP_FETCH, comp);
    if (op == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    op->msg_len = XFER_VERBS_WIRE_HDR_LEN + XFER_VERBS_WIRE_TREQ_LEN + args->key_len;
    op->msg     = malloc(op->msg_len);
    if (op->msg == NULL) {
        xfer_verbs_op_free(op);
        return XFER_ERR_NO_MEMORY;
    }
    op->buf       = args->buffer;
    op->len       = args->buffer ? args->capacity : 0;
    op->memh      = args->buffer ? args->memh : NULL;
    op->alloc     = args->alloc;
    op->alloc_arg = args->alloc_arg;
    op->result    = args->result;
    status        = xfer_verbs_slot_alloc(ch, XFER_VERBS_SLOT_FETCH, op, &hdr.id);
    if (status != XFER_OK) {
        free(op->msg);
        xfer_verbs_op_free(op);
        return status;
    }
    hdr.tag    = args->step;
    hdr.length = (uint32_t)(XFER_VERBS_WIRE_TREQ_LEN + args->key_len);
    xfer_verbs_wire_pack_hdr(&hdr, op->msg);
    p = op->msg + XFER_VERBS_WIRE_HDR_LEN;
    for (int i = 0; i < 4; i++) {
        p[i] = (uint8_t)(args->key_len >> (8 * i));
    }
    memset(p + 4, 0, 4);
    memcpy(p + XFER_VERBS_WIRE_TREQ_LEN, args->key, args->key_len);
    op->post = XFER_VERBS_POST_MSG;
    xfer_verbs_ch_submit(ch, op);
    return XFER_INPROGRESS;
}

static void tdone_send(xfer_ep_h ch, uint64_t producer_id, xfer_status_t status)
{
    xfer_verbs_wire_hdr_t hdr = {.type = XFER_VERBS_MSG_TDONE, .id = producer_id,
                                 .status = status};

    if (ch->state != XFER_VERBS_CH_FAILED) {
        xfer_verbs_ch_send_ctrl(ch, &hdr, NULL, 0, NULL, 0);
    }
}

xfer_status_t xfer_verbs_tensor_cancel(xfer_iface_h iface, xfer_comp_t *comp,
                                       xfer_status_t status)
{
    xfer_ep_h ch;

    ucs_list_for_each(ch, &iface->channels, list) {
        for (uint32_t i = 0; i < ch->num_slots; i++) {
            xfer_verbs_slot_t *slot = &ch->slots[i];
            xfer_verbs_op_t *op     = slot->obj;
            xfer_verbs_wire_hdr_t hdr = {.type = XFER_VERBS_MSG_TCANCEL};

            if ((slot->kind != XFER_VERBS_SLOT_FETCH) || (op->comp != comp)) {
                continue;
            }
            hdr.id   = ((uint64_t)slot->gen << 32) | i;
            op->slot = UINT32_MAX;
            if (op->post != XFER_VERBS_POST_NONE) {
                /* the request never left: nothing will answer it */
                ucs_list_del(&op->list);
                op->post = XFER_VERBS_POST_NONE;
                xfer_verbs_slot_free(ch, i);
            } else {
                slot->kind = XFER_VERBS_SLOT_TOMBSTONE;
                slot->obj  = NULL;
                if (ch->state != XFER_VERBS_CH_FAILED) {
                    xfer_verbs_ch_send_ctrl(ch, &hdr, NULL, 0, NULL, 0);
                }
            }
            xfer_verbs_op_complete(op, status, 0, 0);
            return XFER_OK;
        }
    }
    {
        xfer_verbs_op_t *op;

        ucs_list_for_each(op, &iface->busy, busy_link) {
            if ((op->comp == comp) && (op->kind == XFER_VERBS_OP_FETCH)) {
                return XFER_ERR_BUSY;   /* its data is being read */
            }
        }
    }
    return XFER_ERR_NOT_FOUND;
}

/* Printable copy of a reason off the wire. */
static void reason_copy(char *dst, size_t size, const uint8_t *src, size_t len)
{
    size_t n = (len < size - 1) ? len : size - 1;

    for (size_t i = 0; i < n; i++) {
        dst[i] = ((src[i] >= 0x20) && (src[i] <= 0x7e)) ? (char)src[i] : '?';
    }
    dst[n] = '\0';
}

void xfer_verbs_fetch_read_done(xfer_verbs_op_t *op, xfer_status_t status)
{
    ucs_list_del(&op->busy_link);
    tdone_send(op->ch, op->peer_id, status);
    xfer_verbs_op_complete(op, status, (status == XFER_OK) ? op->len : 0, 0);
}

static xfer_status_t rx_tresp(xfer_ep_h ch, const xfer_verbs_wire_hdr_t *hdr,
                              const uint8_t *ext, char *why, size_t why_size)
{
    xfer_verbs_slot_t *slot = xfer_verbs_slot_find(ch, hdr->id);
    xfer_verbs_wire_tresp_t tr;
    xfer_status_t status;
    xfer_verbs_op_t *op;
    xfer_tensor_t *t;
    uint64_t data_len;

    if ((slot == NULL) ||
        ((slot->kind != XFER_VERBS_SLOT_FETCH) && (slot->kind != XFER_VERBS_SLOT_TOMBSTONE))) {
        snprintf(why, why_size, "TRESP for unknown request id 0x%016" PRIx64, hdr->id);
        return XFER_ERR_PROTOCOL;
    }
    status = xfer_verbs_wire_unpack_tresp(ext, hdr, &tr, why, why_size);
    if (status != XFER_OK) {
        return status;
    }
    op = slot->obj;
    xfer_verbs_slot_free(ch, (uint32_t)hdr->id);
    if (op == NULL) {   /* cancelled */
        if (tr.mode == XFER_VERBS_TRESP_READ) {
            tdone_send(ch, hdr->tag, XFER_ERR_CANCELED);
        }
        return XFER_OK;
    }
    op->slot = UINT32_MAX;
    if (tr.mode == XFER_VERBS_TRESP_ERROR) {
        char reason[XFER_VERBS_WIRE_MAX_REASON + 1];

        reason_copy(reason, sizeof(reason), ext + XFER_VERBS_WIRE_TRESP_LEN, tr.reason_len);
        xfer_log_at(XFER_LOG_DEBUG, XFER_VERBS_SUBSYS, "tensor fetch failed at the producer: "
                    "%s (%s)", reason, xfer_status_string((xfer_status_t)hdr->status));
        xfer_verbs_op_complete(op, (xfer_status_t)hdr->status, 0, 0);
        return XFER_OK;
    }
    t = op->result;
    memset(t, 0, sizeof(*t));
    t->dtype   = (xfer_dtype_t)tr.dtype;
    t->rank    = tr.rank;
    t->size    = hdr->size;
    t->is_dead = (int)tr.is_dead;
    for (unsigned i = 0; i < tr.rank; i++) {
        t->dims[i] = (int64_t)tr.dims[i];
    }
    data_len = tr.is_dead ? 0 : hdr->size;
    status   = XFER_OK;
    if (op->buf != NULL) {
        if (data_len > op->len) {
            status = XFER_ERR_TRUNCATED;
        }
    } else {
        xfer_tensor_t meta = *t;

        op->buf = op->alloc(op->alloc_arg, &meta);
        op->len = (size_t)data_len;
        if (op->buf == NULL) {
            status = XFER_ERR_NO_MEMORY;
        }
    }
    t->data = op->buf;
    if (status != XFER_OK) {
        if (tr.mode == XFER_VERBS_TRESP_READ) {
            tdone_send(ch, hdr->tag, status);
        }
        xfer_verbs_op_complete(op, status, (size_t)data_len, 0);
        return XFER_OK;
    }
    if ((tr.mode == XFER_VERBS_TRESP_INLINE) || (data_len == 0)) {
        if (data_len > 0) {
            memcpy(op->buf, ext + XFER_VERBS_WIRE_TRESP_LEN, (size_t)data_len);
        }
        if (tr.mode == XFER_VERBS_TRESP_READ) {
            tdone_send(ch, hdr->tag, XFER_OK);
        }
        xfer_verbs_op_complete(op, XFER_OK, (size_t)data_len, 0);
        return XFER_OK;
    }
    op->len     = (size_t)data_len;
    op->peer_id = hdr->tag;
    status      = xfer_verbs_op_lkey(op, op->memh);
    if (status != XFER_OK) {
        tdone_send(ch, hdr->tag, status);
        xfer_verbs_op_complete(op, status, 0, 0);
        return XFER_OK;
    }
    op->opcode   = IBV_WR_RDMA_READ;
    op->raddr    = tr.addr;
    op->rkey     = tr.rkey;
    op->rdma_len = op->len;
    op->busy     = 1;
    op->post     = XFER_VERBS_POST_RDMA;
    ucs_list_add_tail(&op->iface->busy, &op->busy_link);
    xfer_verbs_ch_submit(ch, op);
    return XFER_OK;
}

/* ---- producer ------------------------------------------------------------------------------ */

void xfer_verbs_preq_release(xfer_verbs_preq_t *preq)
{
    xfer_iface_h iface = preq->iface;

    if (preq->mr != NULL) {
        xfer_verbs_mrc_put(iface->mrc, preq->mr);
    }
    if (preq->handle != NULL) {
        iface->params.tensor_release(iface->params.fw_arg, preq->handle, preq->release_status);
    }
    free(preq);
}

/* Done with preq: release its tensor from the next progress(). */
static void preq_finish(xfer_verbs_preq_t *preq, xfer_status_t status)
{
    ucs_list_del(&preq->list);
    preq->release_status = status;
    ucs_list_add_tail(&preq->iface->releases, &preq->list);
}

static void tresp_error(xfer_ep_h ch, uint64_t id, xfer_status_t status, const char *reason)
{
    xfer_verbs_wire_hdr_t hdr   = {.type = XFER_VERBS_MSG_TRESP, .id = id, .status = status};
    xfer_verbs_wire_tresp_t tr  = {.mode = XFER_VERBS_TRESP_ERROR};
    uint8_t ext[XFER_VERBS_WIRE_TRESP_LEN];
    size_t len = strlen(reason);

    if (len > XFER_VERBS_WIRE_MAX_REASON) {
        len = XFER_VERBS_WIRE_MAX_REASON;
    }
    tr.reason_len = (uint32_t)len;
    xfer_verbs_wire_pack_tresp(&tr, ext);
    xfer_verbs_ch_send_ctrl(ch, &hdr, ext, sizeof(ext), reason, len);
}

static void preq_ready(xfer_tensor_waiter_t *waiter, xfer_status_t status,
                       const xfer_tensor_t *tensor, void *handle)
{
    xfer_verbs_preq_t *preq     = (xfer_verbs_preq_t*)((char*)waiter -
                                                       offsetof(xfer_verbs_preq_t, waiter));
    xfer_ep_h ch                = preq->ch;
    xfer_verbs_wire_hdr_t hdr   = {.type = XFER_VERBS_MSG_TRESP, .id = preq->id};
    xfer_verbs_wire_tresp_t tr  = {.mode = XFER_VERBS_TRESP_INLINE};
    uint8_t ext[XFER_VERBS_WIRE_TRESP_LEN];
    char why[XFER_REASON_MAX];
    uint64_t data_len;

    preq->answered = 1;
    preq->handle   = (status == XFER_OK) ? handle : NULL;
    if (status != XFER_OK) {
        tresp_error(ch, preq->id, status, xfer_status_string(status));
        preq_finish(preq, status);
        return;
    }
    if (xfer_tensor_meta_check((unsigned)tensor->dtype, tensor->rank, tensor->dims,
                               tensor->is_dead ? 0 : tensor->size, tensor->is_dead, why,
                               sizeof(why)) != XFER_OK) {
        tresp_error(ch, preq->id, XFER_ERR_INVALID_PARAM, why);
        preq_finish(preq, XFER_ERR_INVALID_PARAM);
        return;
    }
    data_len    = tensor->is_dead ? 0 : tensor->size;
    hdr.size    = data_len;
    tr.dtype    = (uint32_t)tensor->dtype;
    tr.rank     = tensor->rank;
    tr.is_dead  = tensor->is_dead ? 1 : 0;
    for (unsigned i = 0; i < tensor->rank; i++) {
        tr.dims[i] = (uint64_t)tensor->dims[i];
    }
    if (data_len <= inline_max(ch->iface)) {
        xfer_status_t st;

        xfer_verbs_wire_pack_tresp(&tr, ext);
        st = xfer_verbs_ch_send_ctrl(ch, &hdr, ext, sizeof(ext), tensor->data,
                                     (size_t)data_len);
        preq_finish(preq, st);  /* copied: the tensor may go */
        return;
    }
    if ((data_len > ch->max_msg_size) ||
        (xfer_verbs_mrc_get(ch->iface->mrc, tensor->data, (size_t)data_len, &preq->mr) !=
         XFER_OK)) {
        snprintf(why, sizeof(why), "cannot send a %" PRIu64 "-byte tensor (%s)", data_len,
                 (data_len > ch->max_msg_size) ? "over the message size limit" :
                 "its memory cannot be registered");
        tresp_error(ch, preq->id, XFER_ERR_NO_RESOURCE, why);
        preq_finish(preq, XFER_ERR_NO_RESOURCE);
        return;
    }
    if (xfer_verbs_slot_alloc(ch, XFER_VERBS_SLOT_PREQ, preq, &hdr.tag) != XFER_OK) {
        tresp_error(ch, preq->id, XFER_ERR_NO_RESOURCE, "too many tensors in flight");
        preq_finish(preq, XFER_ERR_NO_RESOURCE);
        return;
    }
    preq->in_slot = 1;
    tr.mode       = XFER_VERBS_TRESP_READ;
    tr.addr       = (uintptr_t)tensor->data;
    tr.rkey       = preq->mr->mr->rkey;
    xfer_verbs_wire_pack_tresp(&tr, ext);
    xfer_verbs_ch_send_ctrl(ch, &hdr, ext, sizeof(ext), NULL, 0);
    /* stays on ch->preqs until TDONE */
}

static xfer_status_t rx_treq(xfer_ep_h ch, const xfer_verbs_wire_hdr_t *hdr,
                             const uint8_t *ext, char *why, size_t why_size)
{
    xfer_iface_h iface = ch->iface;
    uint32_t key_len   = (uint32_t)ext[0] | ((uint32_t)ext[1] << 8) | ((uint32_t)ext[2] << 16) |
                         ((uint32_t)ext[3] << 24);
    xfer_verbs_preq_t *preq;

    if ((key_len == 0) || (key_len > iface->params.max_key_len) ||
        ((uint64_t)hdr->length != XFER_VERBS_WIRE_TREQ_LEN + (uint64_t)key_len)) {
        snprintf(why, why_size, "TREQ with a key of %" PRIu32 " bytes in %" PRIu32 " (limit %u)",
                 key_len, hdr->length, iface->params.max_key_len);
        return XFER_ERR_PROTOCOL;
    }
    preq = calloc(1, sizeof(*preq) + key_len + 1);
    if (preq == NULL) {
        tresp_error(ch, hdr->id, XFER_ERR_NO_MEMORY, "out of memory for a tensor request");
        return XFER_OK;
    }
    preq->waiter.ready = preq_ready;
    preq->iface        = iface;
    preq->ch           = ch;
    preq->id           = hdr->id;
    preq->step         = hdr->tag;
    preq->key_len      = key_len;
    memcpy(preq->key, ext + XFER_VERBS_WIRE_TREQ_LEN, key_len);
    ucs_list_add_tail(&ch->preqs, &preq->list);
    iface->params.tensor_request(iface->params.fw_arg, preq->step, preq->key, key_len,
                                 &preq->waiter);
    return XFER_OK;
}

xfer_status_t xfer_verbs_tensor_rx(xfer_ep_h ch, const xfer_verbs_wire_hdr_t *hdr,
                                   const uint8_t *ext, char *why, size_t why_size)
{
    xfer_verbs_slot_t *slot;
    xfer_verbs_preq_t *preq;

    switch (hdr->type) {
    case XFER_VERBS_MSG_TREQ:
        return rx_treq(ch, hdr, ext, why, why_size);
    case XFER_VERBS_MSG_TRESP:
        return rx_tresp(ch, hdr, ext, why, why_size);
    case XFER_VERBS_MSG_TDONE:
        slot = xfer_verbs_slot_find(ch, hdr->id);
        if ((slot == NULL) || (slot->kind != XFER_VERBS_SLOT_PREQ)) {
            snprintf(why, why_size, "TDONE for unknown response id 0x%016" PRIx64, hdr->id);
            return XFER_ERR_PROTOCOL;
        }
        preq = slot->obj;
        xfer_verbs_slot_free(ch, (uint32_t)hdr->id);
        preq->in_slot = 0;
        preq_finish(preq, (hdr->status == XFER_OK) ? XFER_OK : XFER_ERR_IO);
        return XFER_OK;
    case XFER_VERBS_MSG_TCANCEL:
        ucs_list_for_each(preq, &ch->preqs, list) {
            if ((preq->id == hdr->id) && !preq->answered) {
                ucs_list_del(&preq->list);
                ch->iface->params.tensor_withdraw(ch->iface->params.fw_arg, &preq->waiter);
                tresp_error(ch, preq->id, XFER_ERR_CANCELED, "cancelled by the consumer");
                free(preq);
                break;
            }
        }
        return XFER_OK;     /* an answer already on its way is left alone */
    default:
        snprintf(why, why_size, "%s is not a tensor message", xfer_verbs_msg_name(hdr->type));
        return XFER_ERR_PROTOCOL;
    }
}

void xfer_verbs_preq_drop_ch(xfer_ep_h ch, xfer_status_t status)
{
    xfer_verbs_preq_t *preq, *tmp;

    ucs_list_for_each_safe(preq, tmp, &ch->preqs, list) {
        if (!preq->answered) {
            ucs_list_del(&preq->list);
            ch->iface->params.tensor_withdraw(ch->iface->params.fw_arg, &preq->waiter);
            free(preq);
        } else {
            preq_finish(preq, status);
        }
    }
}
