/*
 * A channel's receiving and its completions: the receive work requests of its message
 * slots, their batched reposts, and handle_wc(), which takes every completion of the
 * channel: a message (its credits taken, then handed by type to verbs_tag.c,
 * tensor_request.c, tensor_response.c or verbs_batch.c), a tensor write's immediate, credits
 * the peer returned alone, or a signalled send, which frees the send queue entries and copy
 * buffers of everything posted before it (RC completes in order). A completion with an error
 * fails the channel (verbs_channel.c). What the channel sends is posted by verbs_tx.c.
 *
 * Receives. Consumed slots are reposted in batches (an eighth of the slots, at most
 * XFER_VERBS_RX_BATCH_MAX, per ibv_post_recv). A slot's credit is owed back to the peer
 * only once the slot is posted again, and verbs_tx.c returns what is owed; a message kept
 * past the unexpected queue's cap holds its credit until it is received.
 */
#include "verbs.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

/* ---- receives ---------------------------------------------------------------------------- */

/* The receive work request of slot idx, its one scatter entry in sge. */
static void rx_wr_fill(xfer_ep_h ch, uint32_t idx, struct ibv_recv_wr *wr, struct ibv_sge *sge)
{
    sge->addr   = (uintptr_t)(ch->rx_slab + (size_t)idx * ch->iface->cfg->seg_size);
    sge->length = (uint32_t)ch->iface->cfg->seg_size;
    sge->lkey   = ch->rx_mr->lkey;
    wr->wr_id   = xfer_verbs_wr_id(ch, XFER_VERBS_WR_RECV | idx);
    wr->sg_list = sge;
    wr->num_sge = 1;
    wr->next    = NULL;
}

xfer_status_t xfer_verbs_ch_rx_post(xfer_ep_h ch, uint32_t idx)
{
    struct ibv_recv_wr wr, *bad;
    struct ibv_sge sge;

    rx_wr_fill(ch, idx, &wr, &sge);
    return (ibv_post_recv(ch->qp, &wr, &bad) == 0) ? XFER_OK : XFER_ERR_NO_RESOURCE;
}

/* Consumed slots are reposted in batches: one ibv_post_recv for rx_batch of them. A slot's
 * credit becomes owed (returnable) only once it is posted again, so the peer never sends
 * into a slot that is not there; rx_due_owed counts the credits that wait on the post. */
int xfer_verbs_ch_rx_flush(xfer_ep_h ch)
{
    struct ibv_recv_wr wrs[XFER_VERBS_RX_BATCH_MAX], *bad;
    struct ibv_sge sges[XFER_VERBS_RX_BATCH_MAX];

    if (ch->rx_due == 0) {
        return 0;
    }
    for (uint32_t i = 0; i < ch->rx_due; i++) {
        rx_wr_fill(ch, ch->rx_due_idx[i], &wrs[i], &sges[i]);
        if (i > 0) {
            wrs[i - 1].next = &wrs[i];
        }
    }
    if (ibv_post_recv(ch->qp, wrs, &bad) != 0) {
        xfer_verbs_ch_fail(ch, XFER_ERR_IO, "ibv_post_recv of %u receives: %s", ch->rx_due,
                           strerror(errno));
        return -1;
    }
    ch->credits_owed += ch->rx_due_owed;
    ch->rx_due        = 0;
    ch->rx_due_owed   = 0;
    return 0;
}

/* Slot idx was consumed: repost it (with the next batch). owed: its credit goes back to
 * the peer once it is posted; else it is held (see credits_held). */
static int rx_repost(xfer_ep_h ch, uint32_t idx, int owed)
{
    ch->rx_due_idx[ch->rx_due++] = idx;
    if (owed) {
        ch->rx_due_owed++;
    } else {
        ch->credits_held++;
    }
    return (ch->rx_due >= ch->rx_batch) ? xfer_verbs_ch_rx_flush(ch) : 0;
}

void xfer_verbs_ch_slot_return(xfer_ep_h ch, uint32_t idx)
{
    if (ch->state != XFER_VERBS_CH_FAILED) {
        (void)rx_repost(ch, idx, 1);
    }
}

/* ---- completions ------------------------------------------------------------------------- */

/* A message this side does not speak (another version, an unknown type): say so to the
 * peer, naming the message's id, and go on - the rest of the channel is sound. */
static void rx_unsupported(xfer_ep_h ch, const xfer_verbs_wire_hdr_t *hdr, const char *why)
{
    xfer_log(XFER_LOG_WARN, XFER_VERBS_SUBSYS, "QP 0x%x: refused a message from the peer: %s",
             ch->qp->qp_num, why);
    ch->stats.rejected++;
    xfer_verbs_tensor_error_send(ch, (uint32_t)hdr->id, XFER_TENSOR_ERR_TO_CONSUMER,
                                 XFER_ERR_UNSUPPORTED, why);
}

static void rx_message(xfer_ep_h ch, uint32_t idx, uint32_t byte_len)
{
    const uint8_t *buf = ch->rx_slab + (size_t)idx * ch->iface->cfg->seg_size;
    char why[XFER_REASON_MAX];
    xfer_verbs_wire_hdr_t hdr;
    xfer_status_t status;
    const uint8_t *ext;

    XFER_VERBS_DEVICE_WROTE(buf, (byte_len < ch->iface->cfg->seg_size) ? byte_len :
                                 ch->iface->cfg->seg_size);
    status = xfer_verbs_wire_unpack_hdr(buf, byte_len, &hdr, why, sizeof(why));
    xfer_log_at(XFER_LOG_TRACE, XFER_VERBS_SUBSYS, "QP 0x%x: received %s, %u bytes in slot %u",
                ch->qp->qp_num, (status == XFER_OK) ? xfer_verbs_msg_name(hdr.type) : "garbage",
                byte_len, idx);
    if (status == XFER_ERR_UNSUPPORTED) {
        if (hdr.version == XFER_VERBS_WIRE_VERSION) {
            ch->credits += hdr.credits;     /* an unknown type: the header is still ours */
        }
        rx_unsupported(ch, &hdr, why);
        status = XFER_OK;
    } else if (status == XFER_OK) {
        ext          = buf + xfer_verbs_wire_hdr_len(hdr.type);
        ch->credits += hdr.credits;
        ch->stats.rx_msgs[hdr.type]++;
        if (ch->credits > ch->peer.rx_slots) {
            snprintf(why, sizeof(why), "the peer returned more credits (%u) than it has slots "
                     "(%u)", ch->credits, ch->peer.rx_slots);
            status = XFER_ERR_PROTOCOL;
        } else if ((hdr.type == XFER_VERBS_MSG_TAG) || (hdr.type == XFER_VERBS_MSG_RTS) ||
                   (hdr.type == XFER_VERBS_MSG_FIN)) {
            ch->rx_slot_kept = 0;
            status = xfer_verbs_tag_rx(ch, &hdr, ext, idx, why, sizeof(why));
            if (ch->rx_slot_kept) {
                ch->rx_slot_kept = 0;
                return;     /* the message stays in its slot until it is received */
            }
        } else if ((hdr.type == XFER_VERBS_MSG_META_DATA_UPDATE) ||
                   ((hdr.type == XFER_VERBS_MSG_ERROR_STATUS) &&
                    (hdr.tag == XFER_TENSOR_ERR_TO_CONSUMER))) {
            status = xfer_verbs_treq_rx(ch, &hdr, ext, why, sizeof(why));
        } else if (hdr.type == XFER_VERBS_MSG_NOTIFY) {
            status = xfer_verbs_notify_rx(ch, &hdr, ext, why, sizeof(why));
        } else if (hdr.type == XFER_VERBS_MSG_BYE) {
            xfer_verbs_ch_bye_rx(ch, hdr.tag);
            return;     /* the channel ended */
        } else {
            status = xfer_verbs_rsp_rx(ch, &hdr, ext, why, sizeof(why));
        }
    }
    if ((status != XFER_OK) && (status != XFER_INPROGRESS)) {
        xfer_verbs_ch_fail(ch, status, "bad message from the peer: %s", why);
        return;
    }
    if (ch->state == XFER_VERBS_CH_FAILED) {
        return;     /* an answer it sent failed the channel */
    }
    /* an unexpected message kept past the cap holds its credit until it is received */
    rx_repost(ch, idx, status != XFER_INPROGRESS);
}

static void send_completed(xfer_ep_h ch, const struct ibv_wc *wc)
{
    uint32_t idx = (uint32_t)wc->wr_id;
    struct xfer_verbs_wr *e;
    xfer_verbs_op_t *op;
    uint64_t mark, bytes;

    if (idx >= ch->sq_len) {
        return;     /* unsignaled: only errors come here, handled by the caller */
    }
    e            = &ch->wrs[idx];
    op           = e->op;
    mark         = e->mark;
    bytes        = e->bytes;
    e->op        = NULL;
    ch->sq_done  = e->seq;
    ch->sq_free  = ch->sq_len - (uint32_t)(ch->sq_posted - ch->sq_done);
    ch->tx_tail  = e->tx_head;
    ch->wr_tail++;
    if (!ucs_list_is_empty(&ch->flushes)) {
        xfer_verbs_ch_flushes_check(ch);
    }
    if (op == NULL) {
        ch->ka_pending = 0;
        return;
    }
    if (op->kind == XFER_VERBS_OP_BATCH) {
        xfer_verbs_batch_wr_done(op, mark, bytes);
        return;
    }
    if (--op->rdma_inflight == 0) {
        if ((op->rdma_posted == op->rdma_len) && !op->imm_pending) {
            xfer_verbs_rdma_done(op, XFER_OK);
        }
    }
}

void xfer_verbs_ch_handle_wc(xfer_ep_h ch, const struct ibv_wc *wc)
{
    uint32_t low = (uint32_t)wc->wr_id;

    if (ch->state == XFER_VERBS_CH_FAILED) {
        return;     /* flushed work requests of a channel that already failed */
    }
    ch->active = 1;     /* no clock read per completion: the timer dates it */
    if (wc->status != IBV_WC_SUCCESS) {
        /* a remote access error: the peer's NIC knows no such key (a region deregistered
         * there) - the range was checked against the key on this side - as tcp and shm
         * refuse it (xfer_region_reach) */
        xfer_status_t st = (wc->status == IBV_WC_RETRY_EXC_ERR) ? XFER_ERR_TIMEOUT :
                           (wc->status == IBV_WC_REM_ACCESS_ERR) ? XFER_ERR_NOT_FOUND :
                           XFER_ERR_CONNECTION;

        xfer_verbs_ch_fail(ch, st, "%s completion on QP 0x%x: %s (vendor error 0x%x)",
                           (low & XFER_VERBS_WR_RECV) ? "receive" : "send", ch->qp->qp_num,
                           ibv_wc_status_str(wc->status), wc->vendor_err);
        return;
    }
    if (low & XFER_VERBS_WR_RECV) {
        uint32_t idx = low & ~XFER_VERBS_WR_RECV;

        if (idx >= ch->rx_slots) {
            return;
        }
        ch->rx_msgs++;
        if ((wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM) &&
            (ntohl(wc->imm_data) & XFER_TENSOR_IMM_FLAG)) {
            /* a tensor write: repost first, the completion may post an answer */
            if (rx_repost(ch, idx, 1) != 0) {
                return;
            }
            ch->stats.rx_writes++;  /* its bytes count once it is checked: the completion
                                     * reports only the last chunk */
            xfer_verbs_treq_write_arrived(ch, ntohl(wc->imm_data) & ~XFER_TENSOR_IMM_FLAG,
                                          wc->byte_len);
        } else if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
            uint32_t n = ntohl(wc->imm_data);

            if ((uint64_t)ch->credits + n > ch->peer.rx_slots) {
                xfer_verbs_ch_fail(ch, XFER_ERR_PROTOCOL, "the peer returned %u credits, "
                                   "more than its %u slots", n, ch->peer.rx_slots);
                return;
            }
            ch->credits += n;
            if (rx_repost(ch, idx, 1) != 0) {
                return;
            }
        } else {
            rx_message(ch, idx, wc->byte_len);
        }
    } else {
        send_completed(ch, wc);
    }
    if (ch->state != XFER_VERBS_CH_FAILED) {
        xfer_verbs_ch_progress_pending(ch);
    }
}
