/*
 * A channel's sending: messages through the peer's slots (inline or through a copy buffer),
 * RDMA WRITE and READ chunks, credits spent and returned, and the channel's queue of what
 * cannot be posted yet. The channel itself is made and torn down in verbs_channel.c; its
 * receives and completions are handled in verbs_rx.c.
 *
 * Credits. A sender holds one credit per receive the peer has posted for it and spends one
 * per message. Receivers repost consumed slots in batches (an eighth of the slots, at most
 * XFER_VERBS_RX_BATCH_MAX, per ibv_post_recv) and owe a credit back once its slot is posted
 * again: piggybacked on the next message (which also posts the batch early once a quarter
 * of the slots are unreturned), or, when half the slots are unreturned and no queued message
 * can carry them, by a zero-length RDMA WRITE WITH IMMEDIATE (the immediate is the count).
 * Data messages leave XFER_VERBS_CTRL_CREDITS credits for answers (FIN, the tensor messages
 * and writes), so answers always pass even when a receiver holds credits back for its
 * unexpected queue.
 *
 * Send queue. Sends are signalled every SIGNAL_INTERVAL work requests (and RDMA operations
 * always): RC completes in order, so one completion frees the send queue entries and copy
 * buffers of everything posted before it. Whatever cannot be posted (no credit, no room)
 * waits in the channel's queue, in order. A batch posts its own chains of work requests and
 * signals them itself (verbs_batch.c); its NOTIFY goes through the credits here.
 */
#include "verbs.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Post one work request. Signal it when asked to, or when enough went unsignalled that the
 * send queue or the copy buffers could run out before the next completion. */
int xfer_verbs_ch_post_send(xfer_ep_h ch, struct ibv_send_wr *wr, xfer_verbs_op_t *op,
                            int signal)
{
    struct ibv_send_wr *bad;
    uint32_t idx = XFER_VERBS_WR_NONE;

    if (!signal && (++ch->unsignaled >= ch->signal_interval)) {
        signal = 1;
    }
    if (signal) {
        struct xfer_verbs_wr *e;

        idx            = ch->wr_head % ch->sq_len;
        e              = &ch->wrs[idx];
        e->seq         = ch->sq_posted + 1;
        e->tx_head     = ch->tx_head;
        e->op          = op;
        e->mark        = 0;
        wr->send_flags |= IBV_SEND_SIGNALED;
    }
    wr->wr_id = xfer_verbs_wr_id(ch, idx);
    if (ibv_post_send(ch->qp, wr, &bad) != 0) {
        xfer_verbs_ch_fail(ch, XFER_ERR_IO, "ibv_post_send (%s): %s",
                           (wr->opcode == IBV_WR_SEND) ? "send" : "RDMA", strerror(errno));
        return -1;
    }
    xfer_verbs_cq_touch(ch->iface, ch->cq_idx);
    if (signal) {
        ch->wr_head++;
        ch->unsignaled = 0;
    }
    ch->sq_posted++;
    ch->sq_free--;
    if ((wr->opcode == IBV_WR_SEND) || (wr->opcode == IBV_WR_SEND_WITH_IMM) ||
        (wr->opcode == IBV_WR_RDMA_WRITE_WITH_IMM)) {
        ch->tx_msgs++;
    }
    return 0;
}

/* Whether a message can be posted now: a credit (a data message leaves the control
 * reserve) and send queue room (one entry stays free for credit returns). */
static int msg_postable(const xfer_ep_h ch, int ctrl)
{
    return (ctrl ? (ch->credits >= 1) : (ch->credits > XFER_VERBS_CTRL_CREDITS)) &&
           (ch->sq_free > 1);
}

static uint16_t credits_take(xfer_ep_h ch)
{
    uint32_t n = (ch->credits_owed > 0xffff) ? 0xffff : ch->credits_owed;

    ch->credits_owed -= n;
    return (uint16_t)n;
}

/* XFER_VERBS_TEST_CORRUPT: damage this message (once) as the tests asked. */
static size_t corrupt(xfer_ep_h ch, uint8_t *msg, size_t msg_len)
{
    xfer_iface_h iface = ch->iface;
    const char *how    = iface->corrupt_how;

    iface->corrupt_type = 0;
    xfer_log(XFER_LOG_WARN, XFER_VERBS_SUBSYS, "damaging a %s (%s) on purpose",
             xfer_verbs_msg_name(msg[3]), how);
    if (strcmp(how, "bye_taken") == 0) {
        (void)xfer_verbs_ch_say_bye_taken(ch);
    } else if (strcmp(how, "type") == 0) {
        msg[3] = 0x7f;
    } else if (strcmp(how, "version") == 0) {
        msg[2] = 0x7f;
    } else if ((strcmp(how, "short") == 0) && (msg_len > XFER_VERBS_WIRE_HDR_LEN)) {
        return msg_len - 1;     /* a 40-byte header still claims the byte; a TENSOR_REQUEST's
                                 * key length does */
    } else if (strcmp(how, "field") == 0) {
        size_t hdr_len = xfer_verbs_wire_hdr_len(msg[3]);

        /* TENSOR_REQUEST: its key_len; META_DATA_UPDATE: its rank */
        if (msg_len >= hdr_len + 16) {
            msg[hdr_len + ((msg[3] == XFER_VERBS_MSG_TENSOR_REQUEST) ? 12 : 9)] = 0xff;
        }
    }
    return msg_len;
}

/* Post a message, msg (header and extension, its credits field filled here) then payload:
 * inline when it fits, else copied into the next copy buffer. With op, the send is signalled
 * and its completion goes to op. */
static int post_msg(xfer_ep_h ch, uint8_t *msg, size_t msg_len, const void *payload,
                    size_t payload_len, xfer_verbs_op_t *op)
{
    size_t total = msg_len + payload_len;
    struct ibv_send_wr wr;
    struct ibv_sge sge[2];
    uint16_t credits;

    /* once a quarter of the slots are unreturned, the ones waiting for their repost go too:
     * the peer must not starve for credits this message could have carried */
    if ((ch->rx_due_owed > 0) && (ch->credits_owed + ch->rx_due_owed >= ch->rx_slots / 4) &&
        (xfer_verbs_ch_rx_flush(ch) != 0)) {
        return -1;
    }
    credits = credits_take(ch);
    if (ch->iface->corrupt_type == msg[3]) {
        msg_len = corrupt(ch, msg, msg_len);
        total   = msg_len + payload_len;
    }

    msg[4] = (uint8_t)credits;      /* the header's credits field, little-endian */
    msg[5] = (uint8_t)(credits >> 8);
    memset(&wr, 0, sizeof(wr));
    wr.opcode  = IBV_WR_SEND;
    wr.sg_list = sge;
    if (total <= ch->iface->max_inline) {
        sge[0].addr   = (uintptr_t)msg;
        sge[0].length = (uint32_t)msg_len;
        sge[0].lkey   = 0;
        sge[1].addr   = (uintptr_t)payload;
        sge[1].length = (uint32_t)payload_len;
        sge[1].lkey   = 0;
        wr.num_sge    = (payload_len > 0) ? 2 : 1;
        wr.send_flags = IBV_SEND_INLINE;
    } else {
        uint8_t *buf = ch->tx_slab + (ch->tx_head % ch->tx_slots) * ch->iface->cfg->seg_size;

        memcpy(buf, msg, msg_len);
        if (payload_len > 0) {
            memcpy(buf + msg_len, payload, payload_len);
        }
        ch->tx_head++;
        sge[0].addr   = (uintptr_t)buf;
        sge[0].length = (uint32_t)total;
        sge[0].lkey   = ch->tx_mr->lkey;
        wr.num_sge    = 1;
    }
    ch->credits--;
    ch->stats.tx_msgs[(msg[3] < XFER_VERBS_MSG_LAST) ? msg[3] : 0]++;
    xfer_log_at(XFER_LOG_TRACE, XFER_VERBS_SUBSYS, "QP 0x%x: send %s, %zu bytes (%s), %u "
                "credits left, %u returned", ch->qp->qp_num, xfer_verbs_msg_name(msg[3]),
                total, (wr.send_flags & IBV_SEND_INLINE) ? "inline" : "copied", ch->credits,
                credits);
    if (xfer_verbs_ch_post_send(ch, &wr, op, op != NULL) != 0) {
        return -1;
    }
    ch->data_seq  = ch->sq_posted;
    ch->data_msgs = ch->tx_msgs;
    return 0;
}

/* Post RDMA chunks of op (XFER_VERBS_RDMA_CHUNK bytes each, the last one the rest) while
 * the send queue has room; 1 when all are posted. A tensor write's last chunk (maybe of 0
 * bytes) carries its immediate: it consumes a receive at the peer, so it waits for a credit
 * like a message. The peer checks that chunk's length against the chunk size our endpoint
 * address told it (xfer_verbs_wire_last_chunk). */
static int post_rdma(xfer_ep_h ch, xfer_verbs_op_t *op)
{
    size_t chunk = ch->iface->rdma_chunk;

    while ((op->rdma_posted < op->rdma_len) || op->imm_pending) {
        size_t len = op->rdma_len - op->rdma_posted;
        struct ibv_sge sge;
        struct ibv_send_wr wr;

        if (ch->sq_free <= 1) {     /* one stays free for credit returns */
            return 0;
        }
        if (len > chunk) {
            len = chunk;
        }
        sge.addr   = (uintptr_t)op->buf + op->rdma_posted;
        sge.length = (uint32_t)len;
        sge.lkey   = op->lkey;
        memset(&wr, 0, sizeof(wr));
        wr.opcode              = (enum ibv_wr_opcode)op->opcode;
        wr.sg_list             = &sge;
        wr.num_sge             = (len > 0) ? 1 : 0;
        wr.wr.rdma.remote_addr = op->raddr + op->rdma_posted;
        wr.wr.rdma.rkey        = op->rkey;
        if ((op->opcode == IBV_WR_RDMA_WRITE) && (len > 0) && (len <= ch->iface->max_inline) &&
            !xfer_verbs_memh_on_gpu(op->memh)) {
            /* a small write goes inside the work request, as ib_write_lat's does: the
             * device need not fetch it through the key (the CPU copies it: not from GPU
             * memory) */
            wr.send_flags = IBV_SEND_INLINE;
        }
        if (op->imm_pending && (op->rdma_posted + len == op->rdma_len)) {
            /* unlike a message it carries no credits back, so it leaves the last credit
             * for a credit return: two sides that both spent theirs would wait forever */
            if ((ch->credits < 2) || !msg_postable(ch, 1)) {
                ch->stats.credit_stalls++;
                return 0;
            }
            wr.opcode   = IBV_WR_RDMA_WRITE_WITH_IMM;
            wr.imm_data = htonl(op->imm);
            ch->credits--;
            op->imm_pending = 0;
            ch->stats.tx_writes++;
            ch->stats.tx_write_bytes += op->rdma_len;
        }
        if (xfer_verbs_ch_post_send(ch, &wr, op, 1) != 0) {
            return -1;
        }
        op->rdma_posted += len;
        op->rdma_inflight++;
        ch->data_seq = ch->sq_posted;
        /* a plain write or read is known there once a later message is */
        ch->data_msgs = ch->tx_msgs + (wr.opcode != IBV_WR_RDMA_WRITE_WITH_IMM);
    }
    return 1;
}

/* Whether the first queued message can go now (and carry the owed credits). */
static int pendq_head_ready(xfer_ep_h ch)
{
    const xfer_verbs_op_t *op;

    if (ucs_list_is_empty(&ch->pendq)) {
        return 0;
    }
    op = ucs_list_head(&ch->pendq, xfer_verbs_op_t, list);
    return (op->post == XFER_VERBS_POST_MSG) && msg_postable(ch, op->ctrl);
}

/* Return owed credits alone when half the slots are owed and no message will carry them -
 * none is queued, or the first is stuck (waiting for credits the peer may be waiting on us
 * to return). */
static void credits_return(xfer_ep_h ch)
{
    struct ibv_send_wr wr;

    /* half of the slots not held for unexpected messages: with many held, the few left
     * (at least the control credits) must still come back */
    uint32_t threshold = (ch->rx_slots - ch->credits_held) / 2;

    if ((ch->state != XFER_VERBS_CH_CONNECTED) ||
        (ch->credits_owed + ch->rx_due_owed == 0) ||
        (ch->credits_owed + ch->rx_due_owed < threshold) || pendq_head_ready(ch) ||
        (ch->credits < 1) || (ch->sq_free < 1)) {
        return;
    }
    if (xfer_verbs_ch_rx_flush(ch) != 0) {
        return;
    }
    memset(&wr, 0, sizeof(wr));
    wr.opcode              = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.imm_data            = htonl(credits_take(ch));
    wr.num_sge             = 0;
    wr.wr.rdma.remote_addr = ch->peer.ka_addr;
    wr.wr.rdma.rkey        = ch->peer.ka_rkey;
    ch->credits--;
    xfer_verbs_ch_post_send(ch, &wr, NULL, 0);
}

int xfer_verbs_ch_post_probe(xfer_ep_h ch)
{
    struct ibv_send_wr wr;
    struct ibv_sge sge;

    if (ch->sq_free < 2) {      /* one stays free for credit returns */
        return 1;
    }
    sge.addr   = (uintptr_t)ch->ka_word;
    sge.length = 8;
    sge.lkey   = ch->ka_mr->lkey;
    memset(&wr, 0, sizeof(wr));
    wr.opcode              = IBV_WR_RDMA_WRITE;
    wr.sg_list             = &sge;
    wr.num_sge             = 1;
    wr.wr.rdma.remote_addr = ch->peer.ka_addr + 8;
    wr.wr.rdma.rkey        = ch->peer.ka_rkey;
    return xfer_verbs_ch_post_send(ch, &wr, NULL, 1);
}

/* ---- flush ---------------------------------------------------------------------------------
 *
 * A flush takes its place in the channel's queue, so that everything queued before it is
 * posted first. When it reaches the head it notes how many work requests have been posted
 * (sq_posted) and waits for the completions to get there: RC completes in order, and a
 * send's completion means the peer's device acknowledged it - the message is in one of the
 * peer's receive buffers, the write in its memory. When the last sends went unsignalled, a
 * probe (a signalled 8-byte write to the peer's keepalive word) is posted so that a
 * completion covers them. A batch posted before the flush may still owe its NOTIFY (a get's
 * goes once its reads are done, and notifications go in posting order): the flush also waits
 * until every batch posted before it has ended. */

xfer_status_t xfer_verbs_ep_flush(xfer_ep_h ch, xfer_comp_t *comp)
{
    xfer_verbs_op_t *op;

    if (ch->state == XFER_VERBS_CH_FAILED) {
        return xfer_ep_flush_ended(&ch->fail);
    }
    if (ucs_list_is_empty(&ch->pendq) && ucs_list_is_empty(&ch->flushes) &&
        ucs_list_is_empty(&ch->batches) && (ch->sq_done == ch->sq_posted)) {
        return XFER_OK;
    }
    op = xfer_verbs_op_new(ch->iface, ch, XFER_VERBS_OP_FLUSH, comp);
    if (op == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    op->post        = XFER_VERBS_POST_FLUSH;
    op->flush_batch = ch->batch_seq;   /* the batches posted before it */
    xfer_verbs_ch_submit(ch, op);
    return XFER_INPROGRESS;
}

/* The flush at the head of the queue: 1 when it moved on to wait for completions, 0 when
 * the probe it needs has no room yet, -1 when the channel failed. */
static int flush_reached(xfer_ep_h ch, xfer_verbs_op_t *op)
{
    if ((ch->unsignaled > 0) && (ch->sq_done != ch->sq_posted)) {
        int ret = xfer_verbs_ch_post_probe(ch);

        if (ret != 0) {
            return (ret > 0) ? 0 : -1;
        }
    }
    op->flush_seq = ch->sq_posted;
    ucs_list_del(&op->list);
    op->post = XFER_VERBS_POST_NONE;
    ucs_list_add_tail(&ch->flushes, &op->list);
    xfer_verbs_ch_flushes_check(ch);
    return 1;
}

void xfer_verbs_ch_flushes_check(xfer_ep_h ch)
{
    while (!ucs_list_is_empty(&ch->flushes)) {
        xfer_verbs_op_t *op = ucs_list_head(&ch->flushes, xfer_verbs_op_t, list);

        if ((ch->sq_done < op->flush_seq) || xfer_verbs_batch_before(ch, op->flush_batch)) {
            return;     /* the later ones wait for more */
        }
        ucs_list_del(&op->list);
        xfer_verbs_op_complete(op, XFER_OK, 0, 0);
    }
}

void xfer_verbs_ch_flushes_fail(xfer_ep_h ch, xfer_status_t status)
{
    while (!ucs_list_is_empty(&ch->flushes)) {
        xfer_verbs_op_complete(ucs_list_extract_head(&ch->flushes, xfer_verbs_op_t, list),
                               status, 0, 0);
    }
}

void xfer_verbs_ch_progress_pending(xfer_ep_h ch)
{
    while ((ch->state == XFER_VERBS_CH_CONNECTED) && !ucs_list_is_empty(&ch->pendq)) {
        xfer_verbs_op_t *op = ucs_list_head(&ch->pendq, xfer_verbs_op_t, list);
        int done;

        if (op->post == XFER_VERBS_POST_FLUSH) {
            if (flush_reached(ch, op) <= 0) {
                break;
            }
            continue;   /* it left the queue by itself */
        }
        if (op->post == XFER_VERBS_POST_MSG) {
            if (!msg_postable(ch, op->ctrl)) {
                ch->stats.credit_stalls += (ch->sq_free > 1);
                break;
            }
            done = (post_msg(ch, op->msg, op->msg_len, op->payload, op->payload_len,
                             NULL) == 0) ? 1 : -1;
        } else if (op->post == XFER_VERBS_POST_BATCH) {
            done = xfer_verbs_batch_post(ch, op);
        } else {
            done = post_rdma(ch, op);
        }
        if (done <= 0) {
            break;      /* no room (0), or the channel failed (-1) and flushed the queue */
        }
        ucs_list_del(&op->list);
        op->post = XFER_VERBS_POST_NONE;
        if ((op->kind == XFER_VERBS_OP_CTRL) ||
            ((op->kind == XFER_VERBS_OP_SEND) && (op->slot == UINT32_MAX))) {
            /* copied or inline: the caller's buffer is free (eager sends complete now) */
            xfer_verbs_op_complete(op, XFER_OK, op->payload_len, 0);
        }
    }
    credits_return(ch);
}

int xfer_verbs_ch_send_now(xfer_ep_h ch, uint8_t *msg, size_t msg_len, const void *payload,
                           size_t payload_len)
{
    if ((ch->state != XFER_VERBS_CH_CONNECTED) || !ucs_list_is_empty(&ch->pendq) ||
        !msg_postable(ch, 0)) {
        return 0;
    }
    if (post_msg(ch, msg, msg_len, payload, payload_len, NULL) != 0) {
        return -1;
    }
    credits_return(ch);
    return 1;
}

int xfer_verbs_ch_post_msg_op(xfer_ep_h ch, xfer_verbs_op_t *op)
{
    if (!msg_postable(ch, op->ctrl)) {
        ch->stats.credit_stalls += (ch->sq_free > 1);
        return 0;
    }
    return (post_msg(ch, op->msg, op->msg_len, NULL, 0, op) == 0) ? 1 : -1;
}

void xfer_verbs_ch_submit(xfer_ep_h ch, xfer_verbs_op_t *op)
{
    ucs_list_add_tail(&ch->pendq, &op->list);
    xfer_verbs_ch_progress_pending(ch);
}

xfer_status_t xfer_verbs_ch_send_ctrl(xfer_ep_h ch, const xfer_verbs_wire_hdr_t *hdr,
                                      const void *ext, size_t ext_len, const void *payload,
                                      size_t payload_len)
{
    xfer_verbs_op_t *op;
    xfer_verbs_wire_hdr_t h = *hdr;
    size_t hdr_len;

    if (ch->state == XFER_VERBS_CH_FAILED) {
        return ch->fail.status;
    }
    op = xfer_verbs_op_new(ch->iface, ch, XFER_VERBS_OP_CTRL, NULL);
    if (op == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    op->msg_len = xfer_verbs_wire_hdr_len(h.type) + ext_len + payload_len;
    if (op->msg_len > sizeof(op->msg_buf)) {
        op->msg = malloc(op->msg_len);
        if (op->msg == NULL) {
            op->msg = op->msg_buf;
            xfer_verbs_op_free(op);
            return XFER_ERR_NO_MEMORY;
        }
    }
    h.length = (uint32_t)(ext_len + payload_len);
    hdr_len  = xfer_verbs_wire_pack_hdr(&h, op->msg);
    if (ext_len > 0) {
        memcpy(op->msg + hdr_len, ext, ext_len);
    }
    if (payload_len > 0) {
        memcpy(op->msg + hdr_len + ext_len, payload, payload_len);
    }
    op->ctrl = 1;
    op->post = XFER_VERBS_POST_MSG;
    xfer_verbs_ch_submit(ch, op);
    return XFER_OK;
}

/* What a channel that is destroyed still had queued or waiting, and the credits and send
 * queue it waited on: an orderly close that ran out of time says why here. A keepalive probe
 * unanswered for longer than one ack timeout says that the peer's device acknowledged nothing
 * (its completion would have covered every work request before it): a warning then, since no
 * close of ours waits for that. */
void xfer_verbs_ch_log_unsent(xfer_ep_h ch)
{
    /* by xfer_verbs_post_t */
    static const char *const post_names[] = {"none", "message", "RDMA", "flush", "batch"};
    unsigned long queued  = ucs_list_length(&ch->pendq);
    unsigned long flushes = ucs_list_length(&ch->flushes);
    unsigned long batches = ucs_list_length(&ch->batches);
    char unanswered[128]  = "";
    const xfer_verbs_op_t *head;
    double silent;
    int stalled;

    if ((queued == 0) && (flushes == 0) && (batches == 0)) {
        return;
    }
    silent  = xfer_now_sec() - ch->last_activity;
    stalled = ch->ka_pending && !ch->active && (silent > ch->iface->cfg->timeout);
    if (stalled) {
        snprintf(unanswered, sizeof(unanswered), "; the peer's device acknowledged none of "
                 "them for %.1f s (XFER_VERBS_TIMEOUT=%gs a try)", silent,
                 ch->iface->cfg->timeout);
    }
    head = (queued > 0) ? ucs_list_head(&ch->pendq, xfer_verbs_op_t, list) : NULL;
    xfer_log(stalled ? XFER_LOG_WARN : XFER_LOG_INFO, XFER_VERBS_SUBSYS, "channel of QP 0x%x "
             "destroyed with %lu queued (first: %s), %lu flushes and %lu batches waiting; "
             "credits %u (owed %u, due %u, held %u), send queue %u free, %llu of %llu work "
             "requests complete%s", ch->qp->qp_num, queued,
             (head == NULL) ? "-" : post_names[head->post], flushes, batches, ch->credits,
             ch->credits_owed, ch->rx_due_owed, ch->credits_held, ch->sq_free,
             (unsigned long long)ch->sq_done, (unsigned long long)ch->sq_posted, unanswered);
}

void xfer_verbs_ch_credit_release(xfer_ep_h ch)
{
    if (ch->credits_held > 0) {
        /* its slot may still wait for a repost: post first, then the credit may go back */
        if (xfer_verbs_ch_rx_flush(ch) != 0) {
            return;
        }
        ch->credits_held--;
        ch->credits_owed++;
        credits_return(ch);
    }
}
