/*
 * Descriptor-list batches (component.h: batch) and their notifications, both sides.
 *
 * Posting. A batch is one op (XFER_VERBS_OP_BATCH) in the channel's queue. At the head of the
 * queue it posts as many work requests as the send queue has room for (one entry stays free
 * for credit returns, as everywhere), while fewer than XFER_BATCH_WINDOW bytes of it are in
 * flight (engine.h: a batch that ends early stops within that much), as one chain linked by
 * next, with one ibv_post_send: each descriptor is one RDMA WRITE (put) or READ (get), or
 * several when it is longer than XFER_VERBS_RDMA_CHUNK (at most the port's largest message) or
 * than the window has room for. Only every 64th work request of a batch is signalled (every
 * quarter of the send queue when that is fewer, so that completions free room while the rest
 * waits), one after every quarter of the window (so that the window opens while the rest is
 * in flight), and the last of every chain. RC completes in order: a signalled completion
 * says that every work request before it completed too, so its ring entry carries how many
 * descriptors and bytes were then wholly posted: args->landed rises to the first, and the
 * window opens by the second. What does not fit waits at the head of the queue - nothing
 * queued behind the batch overtakes it - and goes as completions free room. Since every chain
 * ends signalled, the last work request a batch posted is always signalled: a batch stopped
 * between two chains still learns when what it posted has completed.
 *
 * Notifications. The NOTIFY message (verbs_wire.h) goes through the peer's message slots with
 * a credit, like any data message, and signalled: the batch completes at its completion, so
 * a batch that completed has its notification in the peer's receive buffers. A put's NOTIFY
 * is posted on the same QP after the last of its writes. RC executes a QP's requests in
 * order at the responder, and the receive completion of a SEND is generated only after the
 * data of every RDMA WRITE before it has been placed (InfiniBand's ordering rules for RC,
 * which RoCE and Soft-RoCE keep): when the target polls the NOTIFY, the batch's bytes are in
 * its memory. A get's NOTIFY is posted once its reads have completed here: the target's
 * memory has been read: the batch leaves the channel's queue once its reads are posted and is
 * queued again, for its NOTIFY, when they complete. Notifications keep the order in which
 * their batches were posted without a queue of their own here: the framework gives a
 * transport no notification behind one that leaves late (a get's), it sends it alone once
 * that one has gone (batch.c), and the channel's queue keeps the order of the rest.
 *
 * Ending. A batch completes once: XFER_OK and length = count when the last of its work
 * requests (its NOTIFY when it has one) completed; the failure status (XFER_ERR_CANCELED when
 * the endpoint is destroyed) and what is known landed when the channel ends first. cancel()
 * stops it: what was not posted is dropped, its NOTIFY too when it has not gone, and it
 * completes with the cancel's status once what was posted has completed - unless its NOTIFY
 * was posted already: then the cancel is too late (XFER_ERR_BUSY) and the batch completes
 * as it would have. A flush waits for the batches posted before it (verbs_tx.c).
 *
 * At the target a NOTIFY goes to the framework (the iface's notify upcall) as it arrives. One
 * longer than max_notify_len is a protocol error; the framework's refusal (its queue for the
 * endpoint is full) fails the channel with XFER_ERR_NO_RESOURCE.
 */
#include "verbs.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BATCH_SIGNAL_EVERY 64u     /* work requests of a batch per signalled one */

typedef struct xfer_verbs_batch {
    xfer_verbs_op_t        *op;
    ucs_list_link_t        list;         /* ch->batches */
    xfer_batch_args_t      *args;        /* the framework's: landed is raised there */
    uint64_t               seq;          /* its number on the channel (ch->batch_seq) */
    size_t                 next;         /* the first descriptor not wholly posted */
    uint64_t               offset;       /* bytes of it posted */
    size_t                 end;          /* one past the last descriptor that has bytes */
    uint64_t               wrs_posted;
    uint64_t               bytes_posted;
    uint64_t               bytes_done;   /* of them completed (a signalled one's mark) */
    uint64_t               bytes_signal; /* bytes_posted at the last signalled one */
    unsigned               inflight;     /* signalled work requests not completed */
    int                    notify_wait;  /* its NOTIFY has not gone */
    int                    notify_ready; /* a put's writes are posted, a get's reads done */
    int                    stopped;      /* cancelled: nothing more goes */
    xfer_status_t          stop_status;
    xfer_cancel_hook_t     hook;         /* on its op's comp until it ends */
    size_t                 msg_len;
    uint8_t                msg[];        /* the NOTIFY: header and notification */
} xfer_verbs_batch_t;

static uint32_t signal_every(xfer_ep_h ch)
{
    uint32_t quarter = (ch->sq_len / 4 > 0) ? ch->sq_len / 4 : 1;

    return (quarter < BATCH_SIGNAL_EVERY) ? quarter : BATCH_SIGNAL_EVERY;
}

/* The landed count rises to n: the reads' destinations were written by the device. */
static void landed_raise(xfer_verbs_batch_t *b, size_t n)
{
    xfer_batch_args_t *args = b->args;

    if (n <= args->landed) {
        return;
    }
    if (!args->is_put) {
        for (size_t i = args->landed; i < n; i++) {
            XFER_VERBS_DEVICE_WROTE((void*)(uintptr_t)args->iov[i].local,
                                    args->iov[i].length);
        }
    }
    args->landed = n;
}

/* b is done with: its op completes with status (XFER_OK: every descriptor landed). live: the
 * channel goes on (a flush may be done). */
static void batch_end(xfer_verbs_batch_t *b, xfer_status_t status, int live)
{
    xfer_verbs_op_t *op = b->op;
    xfer_ep_h ch        = op->ch;
    size_t length;

    if (status == XFER_OK) {
        landed_raise(b, b->args->count);
    }
    length = b->args->landed;
    ucs_list_del(&b->list);
    if (op->post != XFER_VERBS_POST_NONE) {
        ucs_list_del(&op->list);
        op->post = XFER_VERBS_POST_NONE;
    }
    op->owner = NULL;
    free(b);
    xfer_verbs_op_complete(op, status, length, 0);
    if (live && !ucs_list_is_empty(&ch->flushes)) {
        xfer_verbs_ch_flushes_check(ch);
    }
}

/* Cancel: nothing more of the batch goes - its unposted work requests and NOTIFY are
 * dropped - unless its NOTIFY is on its way (the target will have it). */
static xfer_status_t batch_cancel(xfer_cancel_hook_t *hook, xfer_status_t status)
{
    xfer_verbs_batch_t *b = ucs_container_of(hook, xfer_verbs_batch_t, hook);
    xfer_verbs_op_t *op   = b->op;
    xfer_ep_h ch          = op->ch;

    if (b->stopped) {
        return XFER_OK;
    }
    if ((b->msg_len > 0) && !b->notify_wait) {
        return XFER_ERR_BUSY;
    }
    b->stopped     = 1;
    b->stop_status = status;
    if (op->post != XFER_VERBS_POST_NONE) {
        ucs_list_del(&op->list);
        op->post = XFER_VERBS_POST_NONE;
    }
    if (b->inflight == 0) {
        batch_end(b, status, 1);
    }   /* else it ends when its last posted work request (signalled) completes */
    xfer_verbs_ch_progress_pending(ch);    /* what waited behind it */
    return XFER_OK;
}

/* ---- posting -------------------------------------------------------------------------------- */

/* Bytes b may still post before XFER_BATCH_WINDOW of it are in flight. */
static uint64_t window_open(const xfer_verbs_batch_t *b)
{
    return XFER_BATCH_WINDOW - (b->bytes_posted - b->bytes_done);
}

/* Post the next chain of b's work requests, as many as the send queue has room for. 0 (posted,
 * or no room), -1 the channel failed. */
static int post_chain(xfer_ep_h ch, xfer_verbs_batch_t *b)
{
    xfer_iface_h iface          = ch->iface;
    xfer_verbs_op_t *op         = b->op;
    const xfer_batch_iov_t *iov = b->args->iov;
    struct ibv_send_wr *wrs     = iface->chain_wrs;
    struct ibv_sge *sges        = iface->chain_sges;
    uint32_t every              = signal_every(ch);
    uint32_t room, n = 0, signalled = 0;
    struct ibv_send_wr *bad;
    int ret;

    if (ch->sq_free <= 1) {     /* one stays free for credit returns */
        return 0;
    }
    room = ch->sq_free - 1;
    while ((n < room) && (b->next < b->end) && (window_open(b) > 0)) {
        const xfer_batch_iov_t *v = &iov[b->next];
        struct ibv_send_wr *wr    = &wrs[n];
        uint64_t len              = v->length - b->offset;

        if (v->length == 0) {
            b->next++;
            continue;
        }
        if (len > iface->rdma_chunk) {
            len = iface->rdma_chunk;
        }
        if (len > window_open(b)) {
            len = window_open(b);
        }
        sges[n].addr   = v->local + b->offset;
        sges[n].length = (uint32_t)len;
        sges[n].lkey   = op->lkey;
        memset(wr, 0, sizeof(*wr));
        wr->opcode              = (enum ibv_wr_opcode)op->opcode;
        wr->sg_list             = &sges[n];
        wr->num_sge             = 1;
        wr->wr.rdma.remote_addr = v->remote + b->offset;
        wr->wr.rdma.rkey        = op->rkey;
        wr->wr_id               = xfer_verbs_wr_id(ch, XFER_VERBS_WR_NONE);
        if ((op->opcode == IBV_WR_RDMA_WRITE) && (len <= iface->max_inline)) {
            wr->send_flags = IBV_SEND_INLINE;   /* host memory only: see xfer_verbs_batch */
        }
        b->offset += len;
        if (b->offset == v->length) {
            b->offset = 0;
            do {
                b->next++;
            } while ((b->next < b->end) && (iov[b->next].length == 0));
        }
        b->wrs_posted++;
        b->bytes_posted += len;
        if ((b->next >= b->end) || (n + 1 == room) || (b->wrs_posted % every == 0) ||
            (b->bytes_posted - b->bytes_signal >= XFER_BATCH_WINDOW / 4) ||
            (window_open(b) == 0)) {
            uint32_t idx            = ch->wr_head % ch->sq_len;
            struct xfer_verbs_wr *e = &ch->wrs[idx];

            e->seq          = ch->sq_posted + n + 1;
            e->tx_head      = ch->tx_head;
            e->op           = op;
            e->mark         = b->next;
            e->bytes        = b->bytes_posted;
            b->bytes_signal = b->bytes_posted;
            wr->send_flags |= IBV_SEND_SIGNALED;
            wr->wr_id       = xfer_verbs_wr_id(ch, idx);
            ch->wr_head++;
            signalled++;
        }
        if (n > 0) {
            wrs[n - 1].next = wr;
        }
        n++;
    }
    if (n == 0) {
        return 0;
    }
    b->inflight += signalled;
    ret = ibv_post_send(ch->qp, wrs, &bad);
    if (ret != 0) {
        xfer_verbs_ch_fail(ch, XFER_ERR_IO, "ibv_post_send of a batch's chain of %u RDMA %s: "
                           "%s", n, (op->opcode == IBV_WR_RDMA_WRITE) ? "WRITEs" : "READs",
                           strerror(ret));
        return -1;
    }
    xfer_verbs_cq_touch(iface, ch->cq_idx);
    ch->sq_posted  += n;
    ch->data_seq    = ch->sq_posted;
    ch->data_msgs   = ch->tx_msgs + 1;     /* known there once a later message is */
    ch->sq_free    -= n;
    ch->unsignaled  = 0;    /* the chain ends signalled */
    return 0;
}

/* b's NOTIFY, at the head of the channel's queue. */
static int post_notify(xfer_ep_h ch, xfer_verbs_batch_t *b)
{
    xfer_verbs_op_t *op = b->op;
    int ret;

    op->msg     = b->msg;       /* posting copies it (or sends it inline) */
    op->msg_len = b->msg_len;
    ret         = xfer_verbs_ch_post_msg_op(ch, op);
    op->msg     = op->msg_buf;
    if (ret == 1) {
        b->inflight++;
        b->notify_wait = 0;
    }
    return ret;
}

int xfer_verbs_batch_post(xfer_ep_h ch, xfer_verbs_op_t *op)
{
    xfer_verbs_batch_t *b = op->owner;

    if (b->next < b->end) {
        if (post_chain(ch, b) != 0) {
            return -1;
        }
        if (b->next < b->end) {
            return 0;           /* the rest as room frees and the window opens */
        }
        b->notify_ready |= b->args->is_put;
    }
    if (!b->notify_wait || !b->notify_ready) {
        return 1;               /* a get's NOTIFY: queued again when its reads are done */
    }
    return post_notify(ch, b);
}

void xfer_verbs_batch_wr_done(xfer_verbs_op_t *op, uint64_t mark, uint64_t bytes)
{
    xfer_verbs_batch_t *b = op->owner;

    b->inflight--;
    b->bytes_done = bytes;  /* RC completes in order: every byte posted before it too */
    landed_raise(b, (size_t)mark);
    if (b->inflight > 0) {
        return;
    }
    if (b->stopped) {
        batch_end(b, b->stop_status, 1);
        return;
    }
    if (b->next < b->end) {
        return;                 /* it waits in the queue for room */
    }
    /* every work request of it completed, in order: every descriptor landed */
    landed_raise(b, b->args->count);
    if (!b->notify_wait) {
        batch_end(b, XFER_OK, 1);
    } else if (!b->notify_ready && (op->post == XFER_VERBS_POST_NONE)) {
        b->notify_ready = 1;    /* a get's reads are done: its NOTIFY goes */
        op->post        = XFER_VERBS_POST_BATCH;
        ucs_list_add_tail(&op->ch->pendq, &op->list);
    }
}

/* ---- the entry points ----------------------------------------------------------------------- */

/* Every descriptor's length, and its remote range against the key once more (the framework
 * checked them; this is what the NIC will be told). XFER_OK, or an error and a log line. */
static xfer_status_t iov_check(xfer_ep_h ch, const xfer_batch_args_t *args, size_t *end_p)
{
    const xfer_rkey_h rkey = args->rkey;
    uint64_t max_msg       = ch->iface->cfg->max_msg_size;
    size_t end             = 0;

    for (size_t i = 0; i < args->count; i++) {
        const xfer_batch_iov_t *v = &args->iov[i];

        if (v->length > max_msg) {
            xfer_log(XFER_LOG_ERROR, XFER_VERBS_SUBSYS, "batch descriptor %zu: %" PRIu64
                     " bytes exceed XFER_VERBS_MAX_MSG_SIZE (%" PRIu64 ")", i, v->length,
                     max_msg);
            return XFER_ERR_OUT_OF_RANGE;
        }
        if (!xfer_range_within(rkey->addr, rkey->length, v->remote, v->length) ||
            (v->local + v->length < v->local)) {
            xfer_log(XFER_LOG_ERROR, XFER_VERBS_SUBSYS, "batch descriptor %zu: %" PRIu64
                     " bytes at 0x%" PRIx64 " are outside the remote key's %" PRIu64
                     " bytes at 0x%" PRIx64, i, v->length, v->remote, rkey->length,
                     rkey->addr);
            return XFER_ERR_OUT_OF_RANGE;
        }
        if (v->length > 0) {
            end = i + 1;
        }
    }
    *end_p = end;
    return XFER_OK;
}

/* The chain's work requests and scatter entries, for the longest chain a channel can post. */
static xfer_status_t chain_alloc(xfer_iface_h iface)
{
    size_t len = iface->cfg->tx_queue_len;

    if (iface->chain_wrs != NULL) {
        return XFER_OK;
    }
    iface->chain_wrs  = calloc(len, sizeof(*iface->chain_wrs));
    iface->chain_sges = calloc(len, sizeof(*iface->chain_sges));
    if ((iface->chain_wrs == NULL) || (iface->chain_sges == NULL)) {
        xfer_verbs_batch_iface_cleanup(iface);
        return XFER_ERR_NO_MEMORY;
    }
    return XFER_OK;
}

void xfer_verbs_batch_iface_cleanup(xfer_iface_h iface)
{
    free(iface->chain_wrs);
    free(iface->chain_sges);
    iface->chain_wrs  = NULL;
    iface->chain_sges = NULL;
}

xfer_status_t xfer_verbs_batch(xfer_ep_h ch, xfer_batch_args_t *args, xfer_comp_t *comp)
{
    xfer_status_t status = xfer_verbs_ch_check(ch);
    xfer_iface_h iface   = ch->iface;
    size_t msg_len       = 0, end;
    xfer_verbs_wire_hdr_t hdr;
    xfer_verbs_batch_t *b;
    xfer_verbs_op_t *op;

    if ((status != XFER_OK) && (status != XFER_ERR_BUSY)) {
        return status;
    }
    if ((args->size < offsetof(xfer_batch_args_t, landed) + sizeof(args->landed)) ||
        ((args->count == 0) && (args->notify == NULL))) {
        return XFER_ERR_INVALID_PARAM;
    }
    if (xfer_verbs_memh_on_gpu(args->memh)) {
        /* a get would need the GPU flush per descriptor, a put no inline writes: declined,
         * and the framework posts it descriptor by descriptor through put and get */
        return XFER_ERR_UNSUPPORTED;
    }
    if (args->notify != NULL) {
        msg_len = XFER_VERBS_WIRE_HDR_LEN + args->notify_len;
        if (msg_len > iface->cfg->seg_size) {
            xfer_log(XFER_LOG_ERROR, XFER_VERBS_SUBSYS, "a notification of %zu bytes does "
                     "not fit a message slot of XFER_VERBS_SEG_SIZE=%" PRIu64 " bytes (less "
                     "a %u-byte header)", args->notify_len, iface->cfg->seg_size,
                     XFER_VERBS_WIRE_HDR_LEN);
            return XFER_ERR_OUT_OF_RANGE;
        }
    }
    status = iov_check(ch, args, &end);
    if (status != XFER_OK) {
        return status;
    }
    status = chain_alloc(iface);
    if (status != XFER_OK) {
        return status;
    }
    b  = calloc(1, sizeof(*b) + msg_len);
    op = (b == NULL) ? NULL : xfer_verbs_op_new(iface, ch, XFER_VERBS_OP_BATCH, comp);
    if (op == NULL) {
        free(b);
        return XFER_ERR_NO_MEMORY;
    }
    op->owner  = b;
    op->busy   = 1;
    op->memh   = args->memh;
    op->lkey   = (args->memh != NULL) ? args->memh->mr->lkey : 0;   /* none: a notification alone */
    op->rkey   = args->rkey->rkey;
    op->opcode = args->is_put ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_READ;
    b->op      = op;
    b->args    = args;
    b->seq     = ch->batch_seq++;
    b->end     = end;
    ucs_list_add_tail(&ch->batches, &b->list);
    xfer_comp_hook(comp, &b->hook, batch_cancel);      /* off again at its completion */
    if (args->notify != NULL) {
        memset(&hdr, 0, sizeof(hdr));
        hdr.type   = XFER_VERBS_MSG_NOTIFY;
        hdr.length = (uint32_t)args->notify_len;
        hdr.id     = b->seq;
        xfer_verbs_wire_pack_hdr(&hdr, b->msg);
        if (args->notify_len > 0) {
            memcpy(b->msg + XFER_VERBS_WIRE_HDR_LEN, args->notify, args->notify_len);
        }
        b->msg_len      = msg_len;
        b->notify_wait  = 1;
        b->notify_ready = (end == 0);   /* nothing to move: it goes in its turn */
    } else if (end == 0) {
        batch_end(b, XFER_OK, 1);       /* nothing to move; reported from progress */
        return XFER_INPROGRESS;
    }
    op->post = XFER_VERBS_POST_BATCH;
    xfer_verbs_ch_submit(ch, op);
    return XFER_INPROGRESS;
}

int xfer_verbs_batch_before(xfer_ep_h ch, uint64_t seq)
{
    return !ucs_list_is_empty(&ch->batches) &&
           (ucs_list_head(&ch->batches, xfer_verbs_batch_t, list)->seq < seq);
}

void xfer_verbs_batch_ch_fail(xfer_ep_h ch, xfer_status_t status)
{
    /* the send queue's ring lets go of them: they end here, not at a flushed completion */
    for (uint32_t i = 0; i < ch->sq_len; i++) {
        if ((ch->wrs != NULL) && (ch->wrs[i].op != NULL) &&
            (ch->wrs[i].op->kind == XFER_VERBS_OP_BATCH)) {
            ch->wrs[i].op = NULL;
        }
    }
    while (!ucs_list_is_empty(&ch->batches)) {
        batch_end(ucs_list_head(&ch->batches, xfer_verbs_batch_t, list), status, 0);
    }
}

/* ---- the target ----------------------------------------------------------------------------- */

xfer_status_t xfer_verbs_notify_rx(xfer_ep_h ch, const xfer_verbs_wire_hdr_t *hdr,
                                   const uint8_t *ext, char *why, size_t why_size)
{
    /* its batch's data is in our memory (a put: RC placed the writes before this SEND), or
     * was read from it (a get: the peer sent it after its reads completed) */
    xfer_status_t status = xfer_notify_deliver(&ch->iface->params, ch->fail.fw_ep, NULL, 0, ext,
                                               hdr->length, XFER_VERBS_SUBSYS, why, why_size);

    if (status == XFER_ERR_NO_RESOURCE) {
        xfer_verbs_ch_fail(ch, status, "%s", why);
        return XFER_OK;
    }
    return status;
}
