/*
 * Tagged messages over verbs, with the tcp component's semantics: a message matches a
 * receive when (msg_tag & mask) == (tag & mask) and the receive is for any peer or for the
 * message's channel; arriving messages meet posted receives in posting order, new receives
 * meet unexpected messages in arrival order; one channel delivers in order, so matching
 * keeps per-peer order. A message longer than the receive completes it with
 * XFER_ERR_TRUNCATED and the full length, after the part that fits.
 *
 * Small messages go eagerly through the message slots (copied, or inline). Larger ones go by
 * rendezvous: RTS {id, tag, size, address, rkey}, the receiver RDMA-READs straight into its
 * buffer (zero copies when both buffers are registered; through the MR cache otherwise),
 * then answers FIN {id, status} and the sender completes.
 *
 * Unexpected eager messages are copied out so that their slot is reposted at once. Past
 * MAX_UNEXPECTED bytes the copy is still kept but its credit is held back until a receive
 * takes it, so a sender nobody receives from slows down instead of growing the queue without
 * bound (control messages keep their own credits; see verbs_tx.c).
 */
#include "verbs.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int tag_matches(uint64_t msg_tag, uint64_t tag, uint64_t mask)
{
    return ((msg_tag ^ tag) & mask) == 0;
}

static size_t eager_max(const xfer_iface_h iface)
{
    return iface->cfg->seg_size - XFER_VERBS_WIRE_TAG_HDR_LEN;
}

/* Whether a send goes eagerly: small enough, and not from GPU memory, which the CPU cannot
 * copy into a message slot (it goes by rendezvous: the receiver reads it). */
static int eager_send(const xfer_iface_h iface, size_t length, xfer_memh_h memh)
{
    return (length <= eager_max(iface)) && ((length == 0) || !xfer_verbs_memh_on_gpu(memh));
}

/* A buffer without a registration may be copied by the CPU (eager) or registered through the
 * MR cache: where the component moves GPU memory (iface->devmem), it checks first that the
 * buffer is host memory. */
static xfer_status_t unregistered_check(xfer_iface_h iface, const void *buf, size_t length,
                                        xfer_memh_h memh)
{
    if ((memh != NULL) || (iface->devmem == NULL) || (length == 0)) {
        return XFER_OK;
    }
    return iface->devmem->unregistered(iface, buf, length);
}

xfer_status_t xfer_verbs_tag_send(xfer_ep_h ch, uint64_t tag, const void *buf, size_t length,
                                  xfer_memh_h memh, xfer_comp_t *comp)
{
    xfer_verbs_wire_hdr_t hdr = {.type = XFER_VERBS_MSG_TAG, .tag = tag, .size = length};
    xfer_status_t status      = xfer_verbs_ch_check(ch);
    xfer_verbs_op_t *op;

    if ((status != XFER_OK) && (status != XFER_ERR_BUSY)) {
        return status;
    }
    if ((comp == NULL) || ((buf == NULL) && (length > 0))) {
        return XFER_ERR_INVALID_PARAM;
    }
    status = unregistered_check(ch->iface, buf, length, memh);
    if (status != XFER_OK) {
        return status;
    }
    if (length > ch->max_msg_size) {
        xfer_log(XFER_LOG_ERROR, XFER_VERBS_SUBSYS, "tag send of %zu bytes exceeds the message "
                 "limit of %" PRIu64 " bytes (XFER_VERBS_MAX_MSG_SIZE, here or at the peer)",
                 length, ch->max_msg_size);
        return XFER_ERR_OUT_OF_RANGE;
    }
    if (eager_send(ch->iface, length, memh)) {
        uint8_t msg[XFER_VERBS_WIRE_TAG_HDR_LEN];
        int posted;

        /* the common case: posted now, no operation to track (a TAG header carries no
         * length: the receive completion gives it) */
        posted = xfer_verbs_ch_send_now(ch, msg, xfer_verbs_wire_pack_hdr(&hdr, msg), buf,
                                        length);
        if (posted != 0) {
            return (posted > 0) ? XFER_OK : ch->fail_status;
        }
    }
    op = xfer_verbs_op_new(ch->iface, ch, XFER_VERBS_OP_SEND, comp);
    if (op == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    op->buf = (void*)buf;
    op->len = length;
    if (eager_send(ch->iface, length, memh)) {
        op->payload     = buf;
        op->payload_len = length;
    } else {
        xfer_verbs_wire_rts_t rts = {.addr = (uintptr_t)buf};

        status = xfer_verbs_op_lkey(op, memh);
        if (status == XFER_OK) {
            status = xfer_verbs_slot_alloc(ch, XFER_VERBS_SLOT_SEND, op, &hdr.id);
        }
        if (status != XFER_OK) {
            if (op->mr != NULL) {
                xfer_verbs_mrc_put(ch->iface->mrc, op->mr);
            }
            xfer_verbs_op_free(op);
            return status;
        }
        rts.rkey    = (memh != NULL) ? memh->mr->rkey : op->mr->mr->rkey;
        hdr.type    = XFER_VERBS_MSG_RTS;
        hdr.length  = XFER_VERBS_WIRE_RTS_LEN;
        xfer_verbs_wire_pack_rts(&rts, op->msg + XFER_VERBS_WIRE_HDR_LEN);
    }
    op->msg_len = xfer_verbs_wire_pack_hdr(&hdr, op->msg) +
                  ((hdr.type == XFER_VERBS_MSG_RTS) ? XFER_VERBS_WIRE_RTS_LEN : 0);
    op->post    = XFER_VERBS_POST_MSG;
    xfer_verbs_ch_submit(ch, op);
    return XFER_INPROGRESS;
}

/* ---- receiving ------------------------------------------------------------------------------ */

static void fin_send(xfer_ep_h ch, uint64_t id, xfer_status_t status)
{
    xfer_verbs_wire_hdr_t hdr = {.type = XFER_VERBS_MSG_FIN, .id = id, .status = status};

    if (ch->state != XFER_VERBS_CH_FAILED) {
        xfer_verbs_ch_send_ctrl(ch, &hdr, NULL, 0, NULL, 0);
    }
}

/* A receive takes an eager message's data. */
static void recv_deliver(xfer_verbs_op_t *op, xfer_ep_h ch, uint64_t tag, const void *data,
                         size_t length)
{
    size_t n             = (length < op->len) ? length : op->len;
    xfer_status_t status = (length > op->len) ? XFER_ERR_TRUNCATED : XFER_OK;

    if ((n > 0) && xfer_verbs_memh_on_gpu(op->memh)) {
        xfer_status_t copied = op->iface->devmem->copy_in(op->iface, op->memh, op->buf, data,
                                                          n);

        status = (copied != XFER_OK) ? copied : status;
    } else if (n > 0) {
        memcpy(op->buf, data, n);
    }
    op->ch = ch;
    xfer_verbs_op_complete(op, status, length, tag);
}

/* A receive met a rendezvous: read what fits from the sender's buffer. */
static void recv_read(xfer_verbs_op_t *op, xfer_ep_h ch, uint64_t tag, uint64_t size,
                      uint64_t sender_id, uint64_t addr, uint32_t rkey)
{
    size_t n = (size < op->len) ? (size_t)size : op->len;
    xfer_status_t status;

    op->ch      = ch;
    op->tag     = tag;
    op->length  = (size_t)size;
    op->peer_id = sender_id;
    if (ch->state == XFER_VERBS_CH_FAILED) {
        xfer_verbs_op_complete(op, ch->fail_status, 0, tag);
        return;
    }
    if (n == 0) {
        fin_send(ch, sender_id, XFER_OK);
        xfer_verbs_op_complete(op, (size > op->len) ? XFER_ERR_TRUNCATED : XFER_OK,
                               (size_t)size, tag);
        return;
    }
    op->len = n;
    status  = xfer_verbs_op_lkey(op, op->memh);
    if (status != XFER_OK) {
        fin_send(ch, sender_id, status);
        xfer_verbs_op_complete(op, status, 0, tag);
        return;
    }
    op->opcode   = IBV_WR_RDMA_READ;
    op->raddr    = addr;
    op->rkey     = rkey;
    op->rdma_len = n;
    op->busy     = 1;
    op->post     = XFER_VERBS_POST_RDMA;
    ucs_list_add_tail(&op->iface->busy, &op->busy_link);
    xfer_verbs_ch_submit(ch, op);
}

void xfer_verbs_recv_read_done(xfer_verbs_op_t *op, xfer_status_t status)
{
    ucs_list_del(&op->busy_link);
    fin_send(op->ch, op->peer_id, status);
    if ((status == XFER_OK) && (op->rdma_len > 0) && xfer_verbs_memh_on_gpu(op->memh)) {
        status = op->iface->devmem->landed(op->iface, op->memh, op->buf, op->rdma_len);
    }
    if ((status == XFER_OK) && (op->length > op->len)) {
        status = XFER_ERR_TRUNCATED;
    }
    xfer_verbs_op_complete(op, status, op->length, op->tag);
}

/* What an unexpected message counts against MAX_UNEXPECTED(_EP): its data (none for a
 * rendezvous announcement) and its bookkeeping, so that the count is bounded too. */
static uint64_t unexp_cost(const xfer_verbs_unexp_t *ue)
{
    return sizeof(*ue) + (ue->rndv ? 0 : ue->length);
}

static void unexp_release(xfer_iface_h iface, xfer_verbs_unexp_t *ue)
{
    ucs_list_del(&ue->list);
    iface->unexp_bytes  -= unexp_cost(ue);
    ue->ch->unexp_bytes -= unexp_cost(ue);
    if (ue->held_credit) {
        xfer_verbs_ch_credit_release(ue->ch);
    }
    free(ue);
}

void xfer_verbs_unexp_drop_ch(xfer_iface_h iface, xfer_ep_h ch, int all)
{
    xfer_verbs_unexp_t *ue, *tmp;

    ucs_list_for_each_safe(ue, tmp, &iface->unexp, list) {
        if (((ch == NULL) || (ue->ch == ch)) && (all || ue->rndv)) {
            ue->held_credit = 0;    /* the channel is going away */
            unexp_release(iface, ue);
        }
    }
}

/* A receive for any peer may be posted on other transports too: it is ours only if the
 * framework says so (tag_claim), else it completes cancelled and matching goes on. */
static int recv_claim(xfer_iface_h iface, xfer_verbs_op_t *op)
{
    const xfer_iface_params_t *p = &iface->params;

    if ((p->size < offsetof(xfer_iface_params_t, tag_claim) + sizeof(p->tag_claim)) ||
        (p->tag_claim == NULL) || p->tag_claim(p->fw_arg, op->comp)) {
        return 1;
    }
    xfer_verbs_op_complete(op, XFER_ERR_CANCELED, 0, 0);
    return 0;
}

xfer_status_t xfer_verbs_tag_recv(xfer_iface_h iface, xfer_ep_h ch, uint64_t tag,
                                  uint64_t tag_mask, void *buf, size_t length, xfer_memh_h memh,
                                  xfer_comp_t *comp)
{
    xfer_verbs_unexp_t *ue;
    xfer_verbs_op_t *op;

    if ((comp == NULL) || ((buf == NULL) && (length > 0))) {
        return XFER_ERR_INVALID_PARAM;
    }
    if (unregistered_check(iface, buf, length, memh) != XFER_OK) {
        return XFER_ERR_INVALID_PARAM;
    }
    op = xfer_verbs_op_new(iface, ch, XFER_VERBS_OP_RECV, comp);
    if (op == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    op->buf   = buf;
    op->len   = length;
    op->memh  = memh;
    op->rtag  = tag;
    op->rmask = tag_mask;
    ucs_list_for_each(ue, &iface->unexp, list) {
        if (((ch != NULL) && (ue->ch != ch)) || !tag_matches(ue->tag, tag, tag_mask)) {
            continue;
        }
        if ((ch == NULL) && !recv_claim(iface, op)) {
            return XFER_INPROGRESS;     /* another transport's: completed cancelled */
        }
        if (ue->rndv) {
            recv_read(op, ue->ch, ue->tag, ue->length, ue->sender_id, ue->addr, ue->rkey);
        } else {
            recv_deliver(op, ue->ch, ue->tag, ue->data, ue->length);
        }
        unexp_release(iface, ue);
        return XFER_INPROGRESS;
    }
    if ((ch != NULL) && (ch->state == XFER_VERBS_CH_FAILED)) {
        xfer_status_t status = ch->fail_status;

        xfer_verbs_op_free(op);
        return status;
    }
    ucs_list_add_tail(&iface->posted, &op->list);
    return XFER_INPROGRESS;
}

xfer_status_t xfer_verbs_tag_cancel(xfer_iface_h iface, xfer_comp_t *comp,
                                    xfer_status_t status)
{
    xfer_verbs_op_t *op;

    ucs_list_for_each(op, &iface->posted, list) {
        if (op->comp == comp) {
            ucs_list_del(&op->list);
            xfer_verbs_op_complete(op, status, 0, 0);
            return XFER_OK;
        }
    }
    ucs_list_for_each(op, &iface->busy, busy_link) {
        if ((op->comp == comp) && (op->kind == XFER_VERBS_OP_RECV)) {
            return XFER_ERR_BUSY;
        }
    }
    return XFER_ERR_NOT_FOUND;
}

static xfer_verbs_op_t *posted_match(xfer_iface_h iface, xfer_ep_h ch, uint64_t tag)
{
    xfer_verbs_op_t *op, *tmp;

    ucs_list_for_each_safe(op, tmp, &iface->posted, list) {
        if (((op->ch == NULL) || (op->ch == ch)) && tag_matches(tag, op->rtag, op->rmask)) {
            ucs_list_del(&op->list);
            if ((op->ch == NULL) && !recv_claim(iface, op)) {
                continue;
            }
            return op;
        }
    }
    return NULL;
}

static xfer_status_t unexp_add(xfer_ep_h ch, const xfer_verbs_wire_hdr_t *hdr,
                               const uint8_t *data, const xfer_verbs_wire_rts_t *rts)
{
    xfer_iface_h iface     = ch->iface;
    size_t copy            = (rts == NULL) ? hdr->length : 0;
    xfer_verbs_unexp_t *ue = malloc(sizeof(*ue) + copy);

    if (ue == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    ue->ch          = ch;
    ue->tag         = hdr->tag;
    ue->rndv        = (rts != NULL);
    ue->length      = (rts != NULL) ? (size_t)hdr->size : copy;
    ue->sender_id   = hdr->id;
    ue->addr        = (rts != NULL) ? rts->addr : 0;
    ue->rkey        = (rts != NULL) ? rts->rkey : 0;
    /* over either bound the sender is slowed: the credit of this message's slot goes back
     * only when it is received */
    ue->held_credit = (iface->unexp_bytes + unexp_cost(ue) > iface->cfg->max_unexpected) ||
                      (ch->unexp_bytes + unexp_cost(ue) > iface->cfg->max_unexpected_ep);
    if (copy > 0) {
        memcpy(ue->data, data, copy);
    }
    iface->unexp_bytes += unexp_cost(ue);
    ch->unexp_bytes    += unexp_cost(ue);
    ucs_list_add_tail(&iface->unexp, &ue->list);
    return ue->held_credit ? XFER_INPROGRESS : XFER_OK;
}

xfer_status_t xfer_verbs_tag_rx(xfer_ep_h ch, const xfer_verbs_wire_hdr_t *hdr,
                                const uint8_t *ext, char *why, size_t why_size)
{
    xfer_verbs_wire_rts_t rts;
    xfer_verbs_slot_t *slot;
    xfer_verbs_op_t *op;

    switch (hdr->type) {
    case XFER_VERBS_MSG_TAG:
        /* its length is what arrived (xfer_verbs_wire_unpack_hdr): nothing to check */
        op = posted_match(ch->iface, ch, hdr->tag);
        if (op != NULL) {
            recv_deliver(op, ch, hdr->tag, ext, hdr->length);
            return XFER_OK;
        }
        return unexp_add(ch, hdr, ext, NULL);
    case XFER_VERBS_MSG_RTS:
        if (hdr->size > ch->max_msg_size) {
            snprintf(why, why_size, "RTS of %" PRIu64 " bytes exceeds the agreed limit of %"
                     PRIu64, hdr->size, ch->max_msg_size);
            return XFER_ERR_PROTOCOL;
        }
        xfer_verbs_wire_unpack_rts(ext, &rts);
        op = posted_match(ch->iface, ch, hdr->tag);
        if (op != NULL) {
            recv_read(op, ch, hdr->tag, hdr->size, hdr->id, rts.addr, rts.rkey);
            return XFER_OK;
        }
        return unexp_add(ch, hdr, NULL, &rts);
    case XFER_VERBS_MSG_FIN:
        slot = xfer_verbs_slot_find(ch, hdr->id);
        if ((slot == NULL) || (slot->kind != XFER_VERBS_SLOT_SEND)) {
            snprintf(why, why_size, "FIN for unknown send id 0x%016" PRIx64, hdr->id);
            return XFER_ERR_PROTOCOL;
        }
        op = slot->obj;
        xfer_verbs_slot_free(ch, op->slot);
        op->slot = UINT32_MAX;
        xfer_verbs_op_complete(op, (hdr->status == XFER_OK) ? XFER_OK : XFER_ERR_IO,
                               op->len, 0);
        return XFER_OK;
    default:
        snprintf(why, why_size, "%s is not a tag message", xfer_verbs_msg_name(hdr->type));
        return XFER_ERR_PROTOCOL;
    }
}
