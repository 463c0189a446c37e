/*
 * Batches over tcp.
 *
 * A put batch is its descriptors' frames, queued at once - runs of blocks smaller than a
 * striped frame as PUTV frames (a table, then the blocks gathered from the caller's memory
 * and read by the target straight into place), larger ones as PUT frames striped over the
 * lanes - then a BATCH_END frame carrying the notification. The target handles frames in
 * order and a striped frame only once all its shares are in, so when it reads BATCH_END every
 * put before it is in its memory: it delivers the notification - unless one of the batch's
 * puts (BATCH_END names how many precede it) was refused - and answers BATCH_ACK with the
 * status and the count landed, which completes the batch.
 *
 * A get batch is its descriptors' GET_REQs; once every response is in, BATCH_END (of a get,
 * unanswered) carries the notification, so the target hears of it after the reads.
 *
 * Everything of a put batch is queued when it is posted: a cancel ends the request (the
 * framework's side) but what is queued still goes, notification included. A get batch
 * cancelled before its reads are done sends no notification.
 */
#include "tcp.h"

#include <xfer/byteorder.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BATCH_FL_NOTIFY 1u
#define BATCH_FL_GET    2u
#define BATCH_FL_VOID   4u      /* ended early: deliver nothing, answer what landed */

/* Bytes of a batch written to the socket inside xfer_batch_post(); progress writes the rest. */
#define XFER_TCP_BATCH_INLINE (64u << 10)

typedef struct tcp_batch {
    ucs_list_link_t     list;       /* iface->batches */
    ucs_list_link_t     fill_link;  /* ep->batch_fill while frames of it are to be queued */
    int                 filling;
    xfer_ep_h           ep;         /* NULL once the ep is gone */
    xfer_comp_t         *comp;
    xfer_cancel_hook_t  hook;       /* on comp until it completes */
    xfer_batch_args_t   *args;
    xfer_batch_walk_t   walk;       /* its descriptors, queued as the window opens */
    uint64_t            puts_before;    /* ep->batch_puts_sent before its first frame */
    xfer_tcp_op_t       *ack;       /* a put batch's BATCH_ACK, in a slot from the post on */
    xfer_comp_t         ack_comp;
    int                 end_queued;
    int                 end_notify; /* ... and carried the notification */
    uint64_t            end_pos;    /* ep->tx_queued where its BATCH_END starts */
    uint8_t             *end_flags; /* ... and its flags in the send queue, until written */
} tcp_batch_t;

/* Queue BATCH_END: id (0 for a get batch: no answer), the puts before it, the notification
 * when flags carry NOTIFY. Its position is kept, so that an early end can still void it. */
static xfer_status_t batch_end_queue(tcp_batch_t *b, uint64_t id, unsigned flags, uint64_t puts)
{
    xfer_ep_h ep            = b->ep;
    size_t nlen             = (flags & BATCH_FL_NOTIFY) ? b->args->notify_len : 0;
    xfer_tcp_wire_hdr_t hdr = {XFER_TCP_WIRE_MAGIC, XFER_TCP_WIRE_VERSION,
                               XFER_TCP_WIRE_BATCH_END, 0, id,
                               XFER_TCP_WIRE_BATCH_EXT_LEN + (uint64_t)nlen, 0};
    uint64_t pos            = ep->tx_queued;
    uint8_t *p = xfer_tcp_ep_tx_reserve(ep, XFER_TCP_WIRE_HDR_LEN + XFER_TCP_WIRE_BATCH_EXT_LEN +
                                        nlen, 0);

    if (p == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    xfer_tcp_wire_pack_hdr(&hdr, p);
    p += XFER_TCP_WIRE_HDR_LEN;
    xfer_put_le32(p, flags);
    xfer_put_le32(p + 4, 0);
    xfer_put_le64(p + 8, puts);
    if (nlen > 0) {
        memcpy(p + XFER_TCP_WIRE_BATCH_EXT_LEN, b->args->notify, nlen);
    }
    b->end_queued = 1;
    b->end_notify = (flags & BATCH_FL_NOTIFY) != 0;
    b->end_pos    = pos;
    b->end_flags  = p;
    return XFER_OK;
}

/* Whether BATCH_END may still be changed: queued, and not a byte of it written. */
static int end_unwritten(const tcp_batch_t *b)
{
    return b->end_queued && (b->ep != NULL) && (b->ep->fail.state == XFER_EP_CONNECTED) &&
           (b->ep->tx_written <= b->end_pos);
}

/* How many descriptors from first go in one PUTV: a run of puts from host memory, each
 * smaller than a striped frame (larger ones go as PUTs, cut over the lanes), at most
 * XFER_TCP_WIRE_PUTV_MAX of them and the peer's message limit in all. 0: none. */
static size_t putv_run(xfer_ep_h ep, const xfer_batch_args_t *args, size_t first)
{
    uint64_t bytes = 0;
    size_t n       = 0;

    if (!args->is_put || (args->memh == NULL) || args->memh->cuda) {
        return 0;
    }
    while ((first + n < args->count) && (n < XFER_TCP_WIRE_PUTV_MAX)) {
        uint64_t len = args->iov[first + n].length;

        if ((len >= ep->iface->cfg->lane_min) ||
            (len > ep->limits.max_msg_size - bytes)) {
            break;
        }
        bytes += len;
        n++;
    }
    return n;
}

/* Queue descriptors [first, first + n) as one PUTV: the header, extension and table in the
 * entry's own buffer, the blocks gathered from the batch's memory (which the framework keeps
 * until the batch completes, after its BATCH_ACK). */
static xfer_status_t putv_queue(xfer_ep_h ep, const xfer_batch_args_t *args, size_t first,
                                size_t n)
{
    size_t head = XFER_TCP_WIRE_HDR_LEN + XFER_TCP_WIRE_PUTV_EXT_LEN +
                  n * XFER_TCP_WIRE_PUTV_DESC_LEN;
    xfer_tcp_wire_hdr_t hdr = {XFER_TCP_WIRE_MAGIC, XFER_TCP_WIRE_VERSION,
                               XFER_TCP_WIRE_PUTV, 0, ep->puts_sent + 1,
                               head - XFER_TCP_WIRE_HDR_LEN, 0};
    xfer_tcp_wire_putv_t putv = {args->rkey->wire.id, args->rkey->wire.key, (uint32_t)n};
    const xfer_region_key_t *r = &args->rkey->wire;
    xfer_status_t status = xfer_tcp_ep_check(ep);
    struct iovec *data;
    xfer_tcp_tx_t *tx;
    uint8_t *p;

    if (status != XFER_OK) {
        return status;
    }
    /* each block within tcp's own part of the key (the framework checked the key's common
     * bounds), inline: a call per block was a third of a small-put batch's posting; their sum
     * is within the peer's message limit (putv_run) */
    for (size_t i = first; i < first + n; i++) {
        const xfer_batch_iov_t *v = &args->iov[i];

        if (!xfer_range_within(r->addr, r->length, v->remote, v->length)) {
            return XFER_ERR_OUT_OF_RANGE;
        }
        hdr.length += v->length;
    }
    tx = malloc(sizeof(*tx) + n * sizeof(*data) + head);
    if (tx == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    memset(tx, 0, sizeof(*tx));
    data = (struct iovec*)(void*)(tx + 1);
    p    = (uint8_t*)(data + n);
    xfer_tcp_wire_pack_hdr(&hdr, p);
    xfer_tcp_wire_pack_putv_ext(&putv, p + XFER_TCP_WIRE_HDR_LEN);
    for (size_t i = 0; i < n; i++) {
        const xfer_batch_iov_t *v = &args->iov[first + i];

        xfer_tcp_wire_pack_putv_desc(p + XFER_TCP_WIRE_HDR_LEN + XFER_TCP_WIRE_PUTV_EXT_LEN,
                                     (uint32_t)i, v->remote, v->length);
        /* one vector per block: the gather (xfer_tcp_ep_tx_write_some) joins those that
         * follow each other here and cuts the post's share at its budget */
        data[i].iov_base = (void*)(uintptr_t)v->local;
        data[i].iov_len  = (size_t)v->length;
    }
    tx->kind            = XFER_TCP_TX_PUTV;
    tx->iov[0].iov_base = p;
    tx->iov[0].iov_len  = head;
    tx->xiov            = data;
    tx->xiovcnt         = (unsigned)n;
    tx->xlen            = hdr.length - (head - XFER_TCP_WIRE_HDR_LEN);
    tx->splice          = ep->iface->cfg->splice && !ep->no_pipe;
    xfer_tcp_ep_tx_push(ep, tx);
    ep->puts_sent++;
    ep->batch_puts_sent += n;
    ep->tx_putv_frames++;
    ep->tx_putv_blocks += n;
    return XFER_OK;
}

/* Every hold of the batch ended (its descriptors, its answer, the posting): a get batch's
 * notification goes now that every read has its data; the batch completes. */
static void batch_end(xfer_batch_walk_t *w)
{
    tcp_batch_t *b = ucs_container_of(w, tcp_batch_t, walk);

    if (!b->args->is_put && (b->args->notify != NULL) && (w->status == XFER_OK) && !w->stopped &&
        (b->ep != NULL) && (b->ep->fail.state == XFER_EP_CONNECTED)) {
        /* every get has its data: the target may know */
        if (batch_end_queue(b, 0, BATCH_FL_NOTIFY | BATCH_FL_GET, 0) != XFER_OK) {
            xfer_batch_walk_stop(w, XFER_ERR_NO_MEMORY);
        } else {
            xfer_tcp_ep_tx_post(b->ep);
        }
    }
    if (b->filling) {
        ucs_list_del(&b->fill_link);
    }
    ucs_list_del(&b->list);
    xfer_batch_walk_complete(w, b->comp);
    free(b);
}

static void batch_ack_cb(xfer_comp_t *self, xfer_status_t status, size_t length, uint64_t tag)
{
    tcp_batch_t *b = ucs_container_of(self, tcp_batch_t, ack_comp);

    (void)length;
    (void)tag;
    b->ack = NULL;
    if ((status == XFER_OK) || (status == XFER_ERR_CANCELED)) {
        /* BATCH_ACK: every put before it landed - all of them, or those of a batch that
         * ended early */
        b->walk.landed = b->walk.next;
    }
    if (status != XFER_OK) {
        xfer_batch_walk_stop(&b->walk, status);
    }
    xfer_batch_walk_release(&b->walk);
}

/* Whether b may queue more now: a put batch while its frames are at most the window ahead of
 * the socket, a get batch while at most the window of its bytes are asked for. */
static int batch_room(xfer_batch_walk_t *w)
{
    tcp_batch_t *b     = ucs_container_of(w, tcp_batch_t, walk);
    const xfer_ep_h ep = b->ep;

    return b->args->is_put ? (ep->tx_queued - ep->tx_written < XFER_BATCH_WINDOW) :
                             (w->inflight < XFER_BATCH_WINDOW);
}

/* A descriptor completed: a get batch's window opened, more reads go. */
static void batch_more(xfer_batch_walk_t *w)
{
    tcp_batch_t *b = ucs_container_of(w, tcp_batch_t, walk);

    if (!b->args->is_put && b->filling && (b->ep != NULL) && xfer_tcp_batch_fill(b->ep)) {
        xfer_tcp_ep_tx_post(b->ep);
    }
}

/* b has queued its last frame (or ended early): off the fill list; a put batch's BATCH_END
 * goes behind its frames - with the notification, or void after an early end, so that the
 * target still answers and the slot is freed. */
static void fill_done(tcp_batch_t *b)
{
    xfer_ep_h ep = b->ep;
    xfer_status_t status;
    unsigned flags;

    ucs_list_del(&b->fill_link);
    b->filling = 0;
    if (!b->args->is_put || (b->ack == NULL)) {
        return;
    }
    flags = !xfer_batch_walk_all_posted(&b->walk) ? BATCH_FL_VOID :
            (b->args->notify != NULL) ? BATCH_FL_NOTIFY : 0;
    b->ack->mark_put = ep->puts_sent;   /* BATCH_ACK proves these landed */
    b->ack->len      = ep->batch_puts_sent - b->puts_before;
    status = batch_end_queue(b, b->ack->slot | ((uint64_t)ep->slots.s[b->ack->slot].gen << 32),
                             flags, ep->batch_puts_sent - b->puts_before);
    if (status != XFER_OK) {
        /* nothing will answer: the slot goes, and the batch with it */
        xfer_tcp_op_t *ack = b->ack;

        xfer_slot_free(&ep->slots, ack->slot);
        xfer_batch_walk_stop(&b->walk, status);
        xfer_tcp_op_complete(ack, status, 0, 0);
    }
}

/* Queue descriptor i of b, with those after it when they go in one PUTV: a PUTV, or one put
 * or get. */
static xfer_status_t batch_post(xfer_batch_walk_t *w, size_t i, xfer_comp_t *comp,
                                size_t *n_p)
{
    tcp_batch_t *b                = ucs_container_of(w, tcp_batch_t, walk);
    const xfer_batch_args_t *args = b->args;
    const xfer_batch_iov_t *v     = &args->iov[i];
    xfer_ep_h ep                  = b->ep;
    size_t n                      = putv_run(ep, args, i);
    xfer_status_t status;

    if (n > 0) {
        status = putv_queue(ep, args, i, n);
        *n_p   = n;
        return status;
    }
    return args->is_put ?
           xfer_tcp_put(ep, (void*)(uintptr_t)v->local, v->length, args->memh, v->remote,
                        args->rkey, comp) :
           xfer_tcp_get(ep, (void*)(uintptr_t)v->local, v->length, args->memh, v->remote,
                        args->rkey, comp);
}

static const xfer_batch_walk_ops_t batch_ops = {
    .post = batch_post,
    .room = batch_room,
    .more = batch_more,
    .done = batch_end,
};

int xfer_tcp_batch_fill(xfer_ep_h ep)
{
    int queued = 0;

    /* what is queued here is written by the caller, not by each put or get as it is queued:
     * writing from inside would fill again, one level deeper per descriptor */
    ep->tx_corked++;
    while (!ucs_list_is_empty(&ep->batch_fill) && (ep->fail.state == XFER_EP_CONNECTED)) {
        tcp_batch_t *b = ucs_list_head(&ep->batch_fill, tcp_batch_t, fill_link);

        queued |= xfer_batch_walk_fill(&b->walk);
        if (!b->walk.stopped && (b->walk.next < b->args->count)) {
            break;      /* the window is full: the rest as it opens */
        }
        fill_done(b);
        queued = 1;
    }
    ep->tx_corked--;
    return queued;
}

/* Cancel a batch: nothing more of it is queued, its BATCH_END voided while unwritten; it
 * completes when its answers are in. */
static xfer_status_t batch_cancel(xfer_cancel_hook_t *hook, xfer_status_t status)
{
    tcp_batch_t *b = ucs_container_of(hook, tcp_batch_t, hook);

    (void)status;
    if (b->end_notify && !end_unwritten(b)) {
        return XFER_ERR_BUSY;   /* the target has, or will have, its notification */
    }
    xfer_batch_walk_stop(&b->walk, XFER_OK);
    if (end_unwritten(b)) {
        /* nothing of the BATCH_END left: the target hears that the batch ended */
        xfer_put_le32(b->end_flags, (xfer_get_le32(b->end_flags) & ~BATCH_FL_NOTIFY) |
                                    BATCH_FL_VOID);
        b->end_notify = 0;
    }
    if (b->filling && (b->ep != NULL)) {
        xfer_tcp_batch_fill(b->ep);    /* its end goes behind what was queued */
        xfer_tcp_ep_tx_post(b->ep);
    }
    return XFER_OK;
}

xfer_status_t xfer_tcp_batch(xfer_ep_h ep, xfer_batch_args_t *args, xfer_comp_t *comp)
{
    xfer_status_t status = xfer_tcp_ep_check(ep);
    tcp_batch_t *b;
    uint64_t id;

    if (status != XFER_OK) {
        return status;
    }
    if ((args->count == 0) && (args->notify == NULL)) {
        return XFER_ERR_INVALID_PARAM;
    }
    /* a batch whose first descriptor cannot go is refused whole, nothing of it sent; a later
     * one that cannot ends it there (none at all: a notification alone, behind what went) */
    status = (args->count == 0) ? XFER_OK :
             xfer_tcp_rma_check(ep, args->is_put ? "batch put" : "batch get",
                                (size_t)args->iov[0].length, args->iov[0].remote, args->rkey);
    if (status != XFER_OK) {
        return status;
    }
    b = calloc(1, sizeof(*b));
    if (b == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    xfer_batch_walk_init(&b->walk, &batch_ops, args, 0);
    b->ep          = ep;
    b->comp        = comp;
    b->args        = args;
    b->puts_before = ep->batch_puts_sent;
    if (args->is_put) {
        /* the answer to BATCH_END says that the puts before it are in the peer's memory; its
         * slot is taken now, so that a flush posted after the batch waits for it */
        b->ack = xfer_tcp_op_new(ep->iface, ep, XFER_TCP_OP_BATCH, &b->ack_comp);
        status = (b->ack == NULL) ? XFER_ERR_NO_MEMORY :
                 xfer_slot_alloc(&ep->slots, XFER_TCP_SLOT_BATCH, b->ack, &id, &b->ack->slot);
        if (status != XFER_OK) {
            if (b->ack != NULL) {
                xfer_tcp_op_free(b->ack);
            }
            free(b);
            return status;
        }
        b->ack->len     = args->count;
        b->ack->serial  = xfer_flushes_posted(&ep->flushes);
        b->ack_comp.cb  = batch_ack_cb;
        xfer_batch_walk_hold(&b->walk);
    }
    xfer_comp_hook(comp, &b->hook, batch_cancel);      /* off again in batch_end() */
    ucs_list_add_tail(&ep->iface->batches, &b->list);
    ucs_list_add_tail(&ep->batch_fill, &b->fill_link);
    b->filling = 1;
    xfer_tcp_batch_fill(ep);
    /* the first frames leave now, so that a small batch goes at once; a large one does not
     * hold its caller for the copy of all its bytes into the socket - progress writes on */
    xfer_tcp_ep_tx_post_some(ep, XFER_TCP_BATCH_INLINE);
    /* the posting's own hold: the rest end only from progress */
    xfer_batch_walk_release(&b->walk);
    return XFER_INPROGRESS;
}

/* ---- target --------------------------------------------------------------------------------- */

xfer_status_t xfer_tcp_rx_batch_end_ext(xfer_ep_h ep, const uint8_t *ext, char *why,
                                        size_t why_size)
{
    uint64_t nlen = ep->rx.hdr.length - XFER_TCP_WIRE_BATCH_EXT_LEN;
    uint32_t flags = xfer_get_le32(ext);
    uint64_t puts  = xfer_get_le64(ext + 8);

    if ((flags & ~(BATCH_FL_NOTIFY | BATCH_FL_GET | BATCH_FL_VOID)) ||
        (nlen > ep->iface->params.max_notify_len) ||
        (!(flags & (BATCH_FL_NOTIFY | BATCH_FL_VOID)) && (nlen > 0)) ||
        (puts > ep->batch_puts.puts) ||
        ((flags & BATCH_FL_VOID) && (flags & BATCH_FL_NOTIFY)) ||
        ((flags & BATCH_FL_GET) && ((ep->rx.hdr.id != 0) || (puts != 0)))) {
        snprintf(why, why_size, "BATCH_END with flags 0x%x, %" PRIu64 " bytes of notification "
                 "and %" PRIu64 " puts (%" PRIu64 " came)", flags, nlen, puts,
                 ep->batch_puts.puts);
        return XFER_ERR_PROTOCOL;
    }
    if (nlen > 0) {
        xfer_status_t status = xfer_notify_rx_begin(ep->fail.fw_ep, &ep->batch_notify,
                                                    (size_t)nlen, why, why_size);

        if (status != XFER_OK) {
            return status;
        }
    }
    ep->rx.batch_flags = flags;
    ep->rx.batch_puts  = puts;
    xfer_tcp_rx_expect(ep, ep->batch_notify.buf, (size_t)nlen, 0);
    return XFER_OK;
}

xfer_status_t xfer_tcp_rx_batch_end_done(xfer_ep_h ep, char *why, size_t why_size)
{
    uint64_t puts        = ep->rx.batch_puts;
    xfer_status_t status = xfer_batch_rx_end(&ep->batch_puts, puts);
    xfer_tcp_wire_hdr_t hdr = {XFER_TCP_WIRE_MAGIC, XFER_TCP_WIRE_VERSION,
                               XFER_TCP_WIRE_BATCH_ACK, (int32_t)status, ep->rx.hdr.id,
                               XFER_TCP_WIRE_BATCH_ACK_LEN, 0};
    xfer_status_t delivered;
    uint8_t *p;

    if (ep->rx.batch_flags & BATCH_FL_NOTIFY) {
        delivered = xfer_notify_rx_deliver(&ep->iface->params, ep->fail.fw_ep,
                                           &ep->batch_notify, &ep->batch_puts, puts,
                                           XFER_TCP_SUBSYS, why, why_size);
        if (delivered != XFER_OK) {
            return delivered;
        }
    }
    xfer_notify_rx_end(ep->fail.fw_ep, &ep->batch_notify);     /* a voided one's bytes */
    if (ep->rx.batch_flags & BATCH_FL_GET) {
        return XFER_OK;
    }
    if ((status == XFER_OK) && (ep->rx.batch_flags & BATCH_FL_VOID)) {
        hdr.status = XFER_ERR_CANCELED;     /* every put landed; the notification was voided */
    }
    p = xfer_tcp_ep_tx_reserve(ep, XFER_TCP_WIRE_HDR_LEN + XFER_TCP_WIRE_BATCH_ACK_LEN, 1);
    if (p == NULL) {
        snprintf(why, why_size, "out of memory for an answer");
        return XFER_ERR_NO_MEMORY;
    }
    xfer_tcp_wire_pack_hdr(&hdr, p);
    xfer_put_le64(p + XFER_TCP_WIRE_HDR_LEN, (status == XFER_OK) ? puts : 0);
    xfer_tcp_ep_tx_post(ep);
    return XFER_OK;
}

xfer_status_t xfer_tcp_rx_batch_ack_ext(xfer_ep_h ep, const uint8_t *ext, char *why,
                                        size_t why_size)
{
    xfer_tcp_op_t *op    = xfer_slot_answered(&ep->slots, ep->rx.hdr.id, XFER_TCP_SLOT_BATCH,
                                              "BATCH_ACK", why, why_size);
    uint64_t landed      = xfer_get_le64(ext);
    xfer_status_t status = ep->rx.hdr.status;

    if (op == NULL) {
        return XFER_ERR_PROTOCOL;
    }
    if ((landed > op->len) ||
        (((status == XFER_OK) || (status == XFER_ERR_CANCELED)) && (landed != op->len))) {
        snprintf(why, why_size, "BATCH_ACK says %" PRIu64 " of %zu puts landed (%s)", landed,
                 op->len, xfer_status_string(status));
        return XFER_ERR_PROTOCOL;
    }
    if (((status == XFER_OK) || (status == XFER_ERR_CANCELED)) &&
        (op->mark_put > ep->fence_put)) {
        /* the target handles frames in order: every put queued before this BATCH_END has
         * landed, so a flush (or a close) need not fence them again */
        ep->fence_put = op->mark_put;
    }
    xfer_slot_free(&ep->slots, op->slot);
    xfer_tcp_op_complete(op, status, (size_t)landed, 0);
    xfer_tcp_rx_expect(ep, NULL, 0, 0);
    return XFER_OK;
}

/* What a PUTV's table unpacks into, and the blocks the payload is read into: as many of each
 * as the frame has blocks, held while its payload is read (tcp_rx.c frees it after). */
struct xfer_tcp_putv_rx {
    uint64_t     *addr, *len;
    struct iovec iov[];
};

/* A PUTV: first its fixed extension (the count), then, ext_len raised, its table. Every block
 * is checked against the region before any is written; a refused PUTV is drained. */
static xfer_status_t rx_putv_ext(xfer_ep_h ep, const uint8_t *ext, char *why, size_t why_size)
{
    xfer_tcp_rx_t *rx = &ep->rx;
    xfer_tcp_putv_rx_t *v;
    xfer_tcp_wire_putv_t putv;
    xfer_tcp_wire_rma_t rma;
    xfer_memh_h memh = NULL;
    xfer_status_t status;
    uint32_t nvec = 0;

    status = xfer_tcp_wire_unpack_putv_ext(ext, &rx->hdr, &putv, why, why_size);
    if (status != XFER_OK) {
        return status;
    }
    if (rx->ext_len == XFER_TCP_WIRE_PUTV_EXT_LEN) {
        if (rx->hdr.id != ep->puts_rcvd + 1) {
            snprintf(why, why_size, "PUTV carries id %" PRIu64 ", expected %" PRIu64,
                     rx->hdr.id, ep->puts_rcvd + 1);
            return XFER_ERR_PROTOCOL;
        }
        rx->ext_len += (size_t)putv.count * XFER_TCP_WIRE_PUTV_DESC_LEN;
        return XFER_INPROGRESS;
    }
    v = malloc(sizeof(*v) + putv.count * (sizeof(v->iov[0]) + 2 * sizeof(uint64_t)));
    if (v == NULL) {
        snprintf(why, why_size, "out of memory for a PUTV's table");
        return XFER_ERR_NO_MEMORY;
    }
    v->addr     = (uint64_t*)(void*)(v->iov + putv.count);
    v->len      = v->addr + putv.count;
    ep->putv_rx = v;
    status = xfer_tcp_wire_unpack_putv_table(ext + XFER_TCP_WIRE_PUTV_EXT_LEN, &rx->hdr,
                                             putv.count, v->addr, v->len, why, why_size);
    if (status != XFER_OK) {
        return status;
    }
    ep->puts_rcvd++;
    xfer_batch_rx_put(&ep->batch_puts, putv.count);
    ep->rx_putv_frames++;
    ep->rx_putv_blocks += putv.count;
    rma.region = putv.region;
    rma.cookie = putv.cookie;
    /* one region for the whole table: looked up once, each block checked inside it; blocks
     * that follow each other there are read as one (the kernel's cost is per vector) */
    for (uint32_t i = 0; i < putv.count; i++) {
        uint8_t *dest;

        rma.addr = v->addr[i];
        rma.len  = v->len[i];
        dest     = (i == 0) ? xfer_tcp_region_check(ep, &rma, &memh, &status, why, why_size) :
                              xfer_region_at(&memh->region, rma.addr, rma.len, why, why_size);
        if (dest == NULL) {
            status = (i == 0) ? status : XFER_ERR_OUT_OF_RANGE;
            break;
        }
        if ((nvec > 0) && ((uint8_t*)v->iov[nvec - 1].iov_base + v->iov[nvec - 1].iov_len ==
                           dest)) {
            v->iov[nvec - 1].iov_len += (size_t)rma.len;
        } else {
            v->iov[nvec].iov_base = dest;
            v->iov[nvec].iov_len  = (size_t)rma.len;
            nvec++;
        }
    }
    rx->status = status;
    if (status != XFER_OK) {
        xfer_log_peer("rma_refused", XFER_LOG_WARN, XFER_TCP_SUBSYS,
                      "refusing a batch's %" PRIu32 " puts: %s", putv.count, why);
        xfer_tcp_rx_expect(ep, NULL, 0, rx->hdr.length - rx->ext_len);
        return XFER_OK;
    }
    xfer_tcp_rx_expect(ep, NULL, 0, 0);
    rx->memh = memh;
    rx->viov = v->iov;
    rx->vcnt = nvec;
    rx->vidx = 0;
    return XFER_OK;
}

/* A refused put (either kind) is remembered for the batch whose BATCH_END follows it. */
void xfer_tcp_batch_put_done(xfer_ep_h ep)
{
    if (ep->rx.status != XFER_OK) {
        xfer_batch_rx_refused(&ep->batch_puts, ep->rx.status);
    }
}

/* ---- cancel and teardown -------------------------------------------------------------------- */

void xfer_tcp_batch_ep_gone(xfer_ep_h ep)
{
    tcp_batch_t *b;

    ucs_list_for_each(b, &ep->iface->batches, list) {
        if (b->ep == ep) {
            if (b->filling) {
                ucs_list_del(&b->fill_link);
                b->filling = 0;
            }
            b->ep = NULL;
        }
    }
}

const xfer_tcp_rx_handler_t xfer_tcp_rx_batch_end = {XFER_TCP_WIRE_BATCH_EXT_LEN,
                                                     xfer_tcp_rx_batch_end_ext,
                                                     xfer_tcp_rx_batch_end_done};
const xfer_tcp_rx_handler_t xfer_tcp_rx_batch_ack = {XFER_TCP_WIRE_BATCH_ACK_LEN,
                                                     xfer_tcp_rx_batch_ack_ext,
                                                     NULL};
/* answered as a PUT: only when refused */
const xfer_tcp_rx_handler_t xfer_tcp_rx_putv      = {XFER_TCP_WIRE_PUTV_EXT_LEN, rx_putv_ext,
                                                     xfer_tcp_rx_put_done};
