/*
 * Tagged messages over verbs: sending, and handing arriving ones to the framework's matching
 * (framework/tag_match.c), which says where each one's data goes. One channel delivers in
 * order, so a peer's messages match in the order it sent them.
 *
 * Small messages go eagerly through the message slots (copied, or inline). Larger ones go by
 * rendezvous: RTS {id, tag, size, address, rkey}, the receiver RDMA-READs straight into its
 * buffer (zero copies when both buffers are registered; through the MR cache otherwise),
 * then answers FIN {id, status} and the sender completes.
 *
 * A message nobody receives yet is copied out (an eager one's data; a rendezvous one's
 * address) so that its slot is reposted at once. Past the framework's bounds it is still
 * kept - an eager one in its receive slot, not copied (XFER_TAG_ARRIVE_INPLACE) - and its
 * credit is not returned until a receive takes it (tag_pull) or it is dropped
 * (tag_released), so a sender nobody receives from slows down instead of growing the queue:
 * what it makes this process hold past the bounds is its slots, allocated already (control
 * messages keep their own credits; see verbs_tx.c).
 */
#include "verbs.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    status = unregistered_check(ch->iface, buf, length, memh);
    if (status != XFER_OK) {
        return status;
    }
    if (length > ch->max_msg_size) {
        return xfer_op_too_long(XFER_VERBS_SUBSYS, "tag send", length, ch->max_msg_size,
                                "XFER_VERBS_MAX_MSG_SIZE");
    }
    if (eager_send(ch->iface, length, memh)) {
        uint8_t msg[XFER_VERBS_WIRE_TAG_HDR_LEN];
        int posted;

        /* the common case: posted now, no operation to track (a TAG header carries no
         * length: the receive completion gives it) */
        posted = xfer_verbs_ch_send_now(ch, msg, xfer_verbs_wire_pack_hdr(&hdr, msg), buf,
                                        length);
        if (posted != 0) {
            return (posted > 0) ? XFER_OK : ch->fail.status;
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
            status = xfer_slot_alloc(&ch->slots, XFER_VERBS_SLOT_SEND, op, &hdr.id, &op->slot);
        }
        if (status != XFER_OK) {
            if (op->mr != NULL) {
                xfer_regcache_put(ch->iface->mrc, op->mr);
            }
            xfer_verbs_op_free(op);
            return status;
        }
        rts.rkey    = (memh != NULL) ? memh->mr->rkey : xfer_verbs_mr(op->mr)->rkey;
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

/* What the framework keeps of a message until a receive takes it: a rendezvous one's RTS, or
 * where an eager one kept in place lies (its receive slot). */
typedef struct tag_priv {
    uint64_t size, sender_id, addr;
    uint32_t rkey;
    uint32_t slot;
    int      inplace;
} tag_priv_t;

_Static_assert(sizeof(tag_priv_t) <= XFER_TAG_PRIV_MAX, "a message's description fits what "
               "the framework keeps");

static void fin_send(xfer_ep_h ch, uint64_t id, xfer_status_t status)
{
    xfer_verbs_wire_hdr_t hdr = {.type = XFER_VERBS_MSG_FIN, .id = id, .status = status};

    if (ch->state != XFER_VERBS_CH_FAILED) {
        xfer_verbs_ch_send_ctrl(ch, &hdr, NULL, 0, NULL, 0);
    }
}

xfer_status_t xfer_verbs_tag_copy(xfer_ep_h ch, void *dst, xfer_memh_h memh, const void *src,
                                  size_t len)
{
    if (len == 0) {
        return XFER_OK;
    }
    if (xfer_verbs_memh_on_gpu(memh)) {
        return ch->iface->devmem->copy_in(ch->iface, memh, dst, src, len);
    }
    if (unregistered_check(ch->iface, dst, len, memh) != XFER_OK) {
        return XFER_ERR_INVALID_PARAM;  /* device memory without a registration */
    }
    memcpy(dst, src, len);
    return XFER_OK;
}

static const uint8_t *inplace_data(xfer_ep_h ch, const tag_priv_t *r)
{
    return ch->rx_slab + (size_t)r->slot * ch->iface->cfg->seg_size +
           XFER_VERBS_WIRE_TAG_HDR_LEN;
}

void xfer_verbs_tag_released(xfer_ep_h ch, const void *priv, size_t priv_len, int received)
{
    tag_priv_t r;

    memset(&r, 0, sizeof(r));
    if (priv_len == sizeof(r)) {
        memcpy(&r, priv, sizeof(r));
    }
    if (r.inplace) {
        if (!received) {
            xfer_verbs_ch_slot_return(ch, r.slot);  /* dropped: tag_pull did not return it */
        }
    } else {
        xfer_verbs_ch_credit_release(ch);       /* kept past the bounds, its credit held */
    }
}

/* A receive met a rendezvous (handle: the framework's): read what fits from the sender's
 * buffer, then xfer_tag_done(). XFER_INPROGRESS, or an error (done is not called). */
static xfer_status_t recv_read(xfer_ep_h ch, void *handle, void *buf, size_t capacity,
                               xfer_memh_h memh, const tag_priv_t *r)
{
    size_t n = (r->size < capacity) ? (size_t)r->size : capacity;
    xfer_verbs_op_t *op;
    xfer_status_t status;

    if (ch->state == XFER_VERBS_CH_FAILED) {
        return ch->fail.status;
    }
    if (n == 0) {
        fin_send(ch, r->sender_id, XFER_OK);
        xfer_tag_done(handle, XFER_OK);
        return XFER_INPROGRESS;
    }
    if (unregistered_check(ch->iface, buf, n, memh) != XFER_OK) {
        fin_send(ch, r->sender_id, XFER_ERR_INVALID_PARAM);
        return XFER_ERR_INVALID_PARAM;  /* device memory without a registration */
    }
    op = xfer_verbs_op_new(ch->iface, ch, XFER_VERBS_OP_RECV, NULL);
    if (op == NULL) {
        fin_send(ch, r->sender_id, XFER_ERR_NO_MEMORY);
        return XFER_ERR_NO_MEMORY;
    }
    op->base.tag_handle = handle;
    op->buf        = buf;
    op->len        = n;
    op->memh       = memh;
    op->peer_id    = r->sender_id;
    status         = xfer_verbs_op_lkey(op, memh);
    if (status != XFER_OK) {
        fin_send(ch, r->sender_id, status);
        xfer_verbs_op_free(op);
        return status;
    }
    op->opcode   = IBV_WR_RDMA_READ;
    op->raddr    = r->addr;
    op->rkey     = r->rkey;
    op->rdma_len = n;
    op->busy     = 1;
    op->post     = XFER_VERBS_POST_RDMA;
    ucs_list_add_tail(&op->iface->busy, &op->busy_link);
    xfer_verbs_ch_submit(ch, op);
    return XFER_INPROGRESS;
}

void xfer_verbs_recv_read_done(xfer_verbs_op_t *op, xfer_status_t status)
{
    ucs_list_del(&op->busy_link);
    fin_send(op->ch, op->peer_id, status);
    if ((status == XFER_OK) && (op->rdma_len > 0) && xfer_verbs_memh_on_gpu(op->memh)) {
        status = op->iface->devmem->landed(op->iface, op->memh, op->buf, op->rdma_len);
    }
    xfer_verbs_op_complete(op, status, op->len, 0);     /* hands the framework its status */
}

xfer_status_t xfer_verbs_tag_pull(xfer_ep_h ch, const void *priv, size_t priv_len,
                                  uint64_t length, void *buf, size_t capacity, xfer_memh_h memh,
                                  void *handle)
{
    tag_priv_t r;

    (void)length;
    if (priv_len != sizeof(r)) {
        return XFER_ERR_INTERNAL;
    }
    memcpy(&r, priv, sizeof(r));
    if (r.inplace) {
        /* an eager message kept in its slot: copied out, and the slot goes back */
        size_t n             = (r.size < capacity) ? (size_t)r.size : capacity;
        xfer_status_t status = xfer_verbs_tag_copy(ch, buf, memh, inplace_data(ch, &r), n);

        xfer_verbs_ch_slot_return(ch, r.slot);
        xfer_tag_done(handle, status);
        return XFER_INPROGRESS;
    }
    return recv_read(ch, handle, buf, capacity, memh, &r);
}

/* A message arrived (an eager one in receive slot slot): its data goes where the framework
 * says. It is kept whatever the bounds (its data is here, or its sender waits for it); past
 * them its credit is held back, which the return value says (XFER_INPROGRESS), and an eager
 * one stays in its slot (ch->rx_slot_kept). */
static xfer_status_t tag_arrive(xfer_ep_h ch, const xfer_verbs_wire_hdr_t *hdr,
                                const uint8_t *data, const tag_priv_t *rts, uint32_t slot,
                                char *why, size_t why_size)
{
    const xfer_iface_params_t *p = &ch->iface->params;
    unsigned flags = XFER_TAG_ARRIVE_FORCE | XFER_TAG_ARRIVE_NOTIFY |
                     ((rts != NULL) ? XFER_TAG_ARRIVE_RNDV : XFER_TAG_ARRIVE_INPLACE);
    uint64_t len   = (rts != NULL) ? rts->size : hdr->length;
    tag_priv_t here;
    xfer_tag_dest_t dest;
    xfer_status_t status;
    size_t n;

    if (rts == NULL) {
        memset(&here, 0, sizeof(here));
        here.size    = len;
        here.slot    = slot;
        here.inplace = 1;
    }
    switch (xfer_tag_arrive(p->fw_arg, ch->fail.fw_ep, hdr->tag, len, flags,
                            (rts != NULL) ? rts : &here, sizeof(here), &dest)) {
    case XFER_TAG_MATCHED:
        if (rts != NULL) {
            status = recv_read(ch, dest.handle, dest.buf, dest.capacity, dest.memh, rts);
            if (status != XFER_INPROGRESS) {
                xfer_tag_done(dest.handle, status);
            }
            return XFER_OK;
        }
        n = (len < dest.capacity) ? (size_t)len : dest.capacity;
        xfer_tag_done(dest.handle, xfer_verbs_tag_copy(ch, dest.buf, dest.memh, data, n));
        return XFER_OK;
    case XFER_TAG_UNEXPECTED:
        if ((rts == NULL) && (dest.buf == NULL)) {
            ch->rx_slot_kept = 1;   /* past the bounds: it stays in its slot */
            return XFER_OK;
        }
        if (rts == NULL) {
            if (len > 0) {
                memcpy(dest.buf, data, (size_t)len);
            }
            xfer_tag_done(dest.handle, XFER_OK);
        }
        return dest.over ? XFER_INPROGRESS : XFER_OK;
    default:
        snprintf(why, why_size, "out of memory for a %llu-byte message nobody received yet",
                 (unsigned long long)len);
        return XFER_ERR_NO_MEMORY;
    }
}

xfer_status_t xfer_verbs_tag_rx(xfer_ep_h ch, const xfer_verbs_wire_hdr_t *hdr,
                                const uint8_t *ext, uint32_t rx_slot, char *why,
                                size_t why_size)
{
    xfer_verbs_wire_rts_t rts;
    xfer_verbs_op_t *op;
    tag_priv_t r;

    switch (hdr->type) {
    case XFER_VERBS_MSG_TAG:
        /* its length is what arrived (xfer_verbs_wire_unpack_hdr): nothing to check */
        return tag_arrive(ch, hdr, ext, NULL, rx_slot, why, why_size);
    case XFER_VERBS_MSG_RTS:
        if (hdr->size > ch->max_msg_size) {
            snprintf(why, why_size, "RTS of %" PRIu64 " bytes exceeds the agreed limit of %"
                     PRIu64, hdr->size, ch->max_msg_size);
            return XFER_ERR_PROTOCOL;
        }
        xfer_verbs_wire_unpack_rts(ext, &rts);
        memset(&r, 0, sizeof(r));
        r.size      = hdr->size;
        r.sender_id = hdr->id;
        r.addr      = rts.addr;
        r.rkey      = rts.rkey;
        return tag_arrive(ch, hdr, NULL, &r, rx_slot, why, why_size);
    case XFER_VERBS_MSG_FIN:
        op = xfer_slot_answered(&ch->slots, hdr->id, XFER_VERBS_SLOT_SEND, "FIN", why, why_size);
        if (op == NULL) {
            return XFER_ERR_PROTOCOL;
        }
        xfer_slot_free(&ch->slots, op->slot);
        op->slot = UINT32_MAX;
        xfer_verbs_op_complete(op, (hdr->status == XFER_OK) ? XFER_OK : XFER_ERR_IO,
                               op->len, 0);
        return XFER_OK;
    default:
        snprintf(why, why_size, "%s is not a tag message", xfer_verbs_msg_name(hdr->type));
        return XFER_ERR_PROTOCOL;
    }
}
