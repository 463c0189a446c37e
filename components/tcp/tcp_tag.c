/*
 * Tagged messages: sending, matching and the unexpected queue.
 *
 * A message matches a receive when (msg_tag & mask) == (tag & mask) and the receive is for any
 * peer or for the message's endpoint. An arriving message is matched against the posted
 * receives in posting order; a new receive against the unexpected messages in arrival order -
 * including ones still arriving, which it then claims. Messages from one endpoint arrive in
 * order on one stream, so matching keeps per-peer order.
 *
 * Messages that arrived whole before their endpoint failed can still be received (a peer
 * may send its last word and close at once).
 *
 * Unexpected messages are buffered up to MAX_UNEXPECTED bytes per interface and
 * MAX_UNEXPECTED_EP per endpoint (each message counting its bookkeeping too); beyond that an
 * endpoint stops reading (at a message boundary) until receives drain the queue. One that
 * waits for answers to its puts, gets or fetches - answers that must not be held behind a
 * message nobody receives yet - may go on to twice the bounds; past that it pauses as well,
 * so that a peer can never make this side buffer without bound, and says so in the log.
 */
#include "tcp.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int tag_matches(uint64_t msg_tag, uint64_t tag, uint64_t mask)
{
    return ((msg_tag ^ tag) & mask) == 0;
}

/* A receive for any peer may be posted on other transports too: it is ours only if the
 * framework says so (tag_claim), else it completes cancelled and matching goes on. */
static int recv_claim(xfer_iface_h iface, xfer_tcp_op_t *op)
{
    const xfer_iface_params_t *p = &iface->params;

    if ((p->size < offsetof(xfer_iface_params_t, tag_claim) + sizeof(p->tag_claim)) ||
        (p->tag_claim == NULL) || p->tag_claim(p->fw_arg, op->comp)) {
        return 1;
    }
    xfer_tcp_op_complete(op, XFER_ERR_CANCELED, 0, 0);
    return 0;
}

/* Room was made in the unexpected queue, or a receive was posted: paused eps may go on. */
static void resume_paused(xfer_iface_h iface)
{
    xfer_ep_h ep;

    ucs_list_for_each(ep, &iface->eps, list) {
        if (ep->rx.state == XFER_TCP_RX_PAUSED) {
            xfer_tcp_iface_rx_kick(iface, ep);
        }
    }
}

/* What a buffered unexpected message counts against MAX_UNEXPECTED(_EP). */
static uint64_t unexp_cost(uint64_t length)
{
    return length + XFER_TCP_ENTRY_OVERHEAD;
}

/*
 * Buffers of unexpected messages from XFER_TCP_UNEXP_KEEP_MIN bytes on are kept when freed,
 * the most recent first, up to MAX_UNEXPECTED_EP bytes in all, and taken again by a message
 * they fit without wasting more than a quarter. A receiver that falls behind a stream of
 * large messages takes every one as unexpected; glibc gives a buffer that large back to the
 * kernel when it is freed (munmap, or trimming the heap), so each new one faulted in every
 * page as the socket was read into it, the receiver fell further behind and stayed there:
 * xfer_perf tag_bw 1 MiB over two lanes ran at 2-3 GB/s in 5 runs of 8 (20000 messages)
 * instead of 8-9, page faults a quarter of the receiver's time. With the buffers kept, 10 of
 * 10 ran at 7.7-8.5 GB/s.
 */
#define XFER_TCP_UNEXP_KEEP_MIN (64u << 10)

static xfer_tcp_unexp_t *unexp_alloc(xfer_iface_h iface, uint64_t len)
{
    xfer_tcp_unexp_t *ue, *best = NULL;
    size_t cap = (size_t)len;

    if (len >= XFER_TCP_UNEXP_KEEP_MIN) {
        ucs_list_for_each(ue, &iface->unexp_kept, list) {
            if ((ue->capacity >= len) && (ue->capacity - len <= len / 4) &&
                ((best == NULL) || (ue->capacity < best->capacity))) {
                best = ue;
            }
        }
        if (best != NULL) {
            ucs_list_del(&best->list);
            iface->unexp_kept_bytes -= best->capacity;
            return best;
        }
        cap = (size_t)((len + 4095) & ~(uint64_t)4095);
    }
    ue = malloc(sizeof(*ue) + cap);
    if (ue != NULL) {
        ue->capacity = cap;
    }
    return ue;
}

static void unexp_free(xfer_iface_h iface, xfer_tcp_unexp_t *ue)
{
    uint64_t keep = iface->cfg->max_unexpected_ep;

    if ((ue->capacity < XFER_TCP_UNEXP_KEEP_MIN) || (ue->capacity > keep)) {
        free(ue);
        return;
    }
    ucs_list_add_head(&iface->unexp_kept, &ue->list);
    iface->unexp_kept_bytes += ue->capacity;
    while (iface->unexp_kept_bytes > keep) {
        xfer_tcp_unexp_t *old = ucs_list_tail(&iface->unexp_kept, xfer_tcp_unexp_t, list);

        ucs_list_del(&old->list);
        iface->unexp_kept_bytes -= old->capacity;
        free(old);
    }
}

void xfer_tcp_unexp_kept_cleanup(xfer_iface_h iface)
{
    xfer_tcp_unexp_t *ue, *tmp;

    ucs_list_for_each_safe(ue, tmp, &iface->unexp_kept, list) {
        ucs_list_del(&ue->list);
        free(ue);
    }
    iface->unexp_kept_bytes = 0;
}

void xfer_tcp_unexp_release(xfer_iface_h iface, xfer_tcp_unexp_t *ue)
{
    ucs_list_del(&ue->list);
    iface->unexp_bytes  -= unexp_cost(ue->length);
    ue->ep->unexp_bytes -= unexp_cost(ue->length);
    unexp_free(iface, ue);
    resume_paused(iface);
}

/* May a len-byte message that nothing receives yet be buffered? Within both bounds, yes. An
 * endpoint that waits for answers to its puts, gets or fetches may go on to twice them:
 * pausing its input would hold those answers behind a message nobody receives. Beyond that
 * it pauses anyway - memory stays bounded - and the log says why its answers stall. */
static int unexp_room(xfer_ep_h ep, uint64_t len)
{
    const xfer_tcp_config_t *cfg = ep->iface->cfg;
    uint64_t iface_after         = ep->iface->unexp_bytes + unexp_cost(len);
    uint64_t ep_after            = ep->unexp_bytes + unexp_cost(len);

    if ((iface_after <= cfg->max_unexpected) && (ep_after <= cfg->max_unexpected_ep)) {
        return 1;
    }
    return (ep->busy_slots > 0) && (iface_after <= 2 * cfg->max_unexpected) &&
           (ep_after <= 2 * cfg->max_unexpected_ep);
}

/* A complete unexpected message meets its receive. */
static void unexp_deliver(xfer_iface_h iface, xfer_tcp_unexp_t *ue, xfer_tcp_op_t *op)
{
    size_t n             = (ue->length < op->len) ? ue->length : op->len;
    xfer_status_t status = (ue->length > op->len) ? XFER_ERR_TRUNCATED : XFER_OK;
    char why[XFER_REASON_MAX] = "";

    if ((n > 0) && op->cuda) {
        if (xfer_tcp_cuda_copy(iface, op->buf, ue->data, n, 1, why, sizeof(why)) != XFER_OK) {
            xfer_log(XFER_LOG_ERROR, XFER_TCP_SUBSYS, "a %zu-byte message for a receive into "
                     "CUDA memory is lost: %s", n, why);
            status = XFER_ERR_IO;
        }
    } else if (n > 0) {
        memcpy(op->buf, ue->data, n);
    }
    op->ep = ue->ep;
    xfer_tcp_op_complete(op, status, ue->length, ue->tag);
    xfer_tcp_unexp_release(iface, ue);
}

/* Did ep send a message, complete before it failed, that this receive would take? */
static int unexp_has(xfer_iface_h iface, xfer_ep_h ep, uint64_t tag, uint64_t tag_mask)
{
    xfer_tcp_unexp_t *ue;

    ucs_list_for_each(ue, &iface->unexp, list) {
        if ((ue->ep == ep) && ue->complete && (ue->recv == NULL) &&
            tag_matches(ue->tag, tag, tag_mask)) {
            return 1;
        }
    }
    return 0;
}

xfer_status_t xfer_tcp_tag_send(xfer_ep_h ep, uint64_t tag, const void *buf, size_t length,
                                xfer_memh_h memh, xfer_comp_t *comp)
{
    xfer_tcp_wire_hdr_t hdr = {XFER_TCP_WIRE_MAGIC, XFER_TCP_WIRE_VERSION, XFER_TCP_WIRE_TAG,
                               0, tag, length, 0};
    char why[XFER_REASON_MAX] = "";
    xfer_status_t status;
    xfer_tcp_op_t *op;
    int cuda;
    uint8_t *p;

    status = xfer_tcp_ep_check(ep);
    if (status != XFER_OK) {
        return status;
    }
    if ((comp == NULL) || ((buf == NULL) && (length > 0))) {
        return XFER_ERR_INVALID_PARAM;
    }
    cuda = xfer_tcp_buf_is_cuda(ep->iface, buf, length, memh, why, sizeof(why));
    if (cuda < 0) {
        xfer_log(XFER_LOG_ERROR, XFER_TCP_SUBSYS, "tag send: %s", why);
        return XFER_ERR_INVALID_PARAM;
    }
    if (length > ep->limits.max_msg_size) {
        xfer_log(XFER_LOG_ERROR, XFER_TCP_SUBSYS, "tag send of %zu bytes exceeds the message "
                 "limit of %llu bytes (XFER_TCP_MAX_MSG_SIZE, here or at the peer)", length,
                 (unsigned long long)ep->limits.max_msg_size);
        return XFER_ERR_OUT_OF_RANGE;
    }
    if (length <= ep->iface->cfg->eager_threshold) {
        /* copied into the send buffer: done, the caller may reuse its buffer now */
        void *bounce = NULL;

        if (cuda && (length > 0)) {
            status = xfer_tcp_cuda_copy_small(ep->iface, buf, length, &bounce, why,
                                              sizeof(why));
            if (status != XFER_OK) {
                xfer_log(XFER_LOG_ERROR, XFER_TCP_SUBSYS, "tag send from CUDA memory: %s", why);
                return status;
            }
            buf = bounce;
        }
        p = xfer_tcp_ep_tx_reserve(ep, XFER_TCP_WIRE_HDR_LEN + length, 0);
        if (p == NULL) {
            free(bounce);
            return XFER_ERR_NO_MEMORY;
        }
        xfer_tcp_wire_pack_hdr(&hdr, p);
        if (length > 0) {
            memcpy(p + XFER_TCP_WIRE_HDR_LEN, buf, length);
        }
        free(bounce);
        xfer_tcp_ep_tx_post(ep);
        return XFER_OK;
    }
    op = xfer_tcp_op_new(ep->iface, ep, XFER_TCP_OP_SEND, comp);
    if (op == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    op->buf      = (void*)buf;
    op->len      = length;
    op->on_write = 1;
    xfer_tcp_wire_pack_hdr(&hdr, op->hdr);
    op->tx.kind            = XFER_TCP_TX_OP;
    op->tx.iov[0].iov_base = op->hdr;
    op->tx.iov[0].iov_len  = XFER_TCP_WIRE_HDR_LEN;
    op->tx.iov[1].iov_base = (void*)buf;
    op->tx.iov[1].iov_len  = length;
    op->tx.dev             = cuda;
    op->cuda               = cuda;
    op->tx_pending         = 1;
    xfer_tcp_ep_tx_push(ep, &op->tx);
    xfer_tcp_ep_tx_post(ep);
    return XFER_INPROGRESS;
}

xfer_status_t xfer_tcp_tag_recv(xfer_iface_h iface, xfer_ep_h ep, uint64_t tag,
                                uint64_t tag_mask, void *buf, size_t length, xfer_memh_h memh,
                                xfer_comp_t *comp)
{
    char why[XFER_REASON_MAX] = "";
    xfer_tcp_unexp_t *ue;
    xfer_status_t status;
    xfer_tcp_op_t *op;
    int cuda;

    if ((iface == NULL) || (comp == NULL) || ((buf == NULL) && (length > 0)) ||
        ((ep != NULL) && (ep->iface != iface))) {
        return XFER_ERR_INVALID_PARAM;
    }
    cuda = xfer_tcp_buf_is_cuda(iface, buf, length, memh, why, sizeof(why));
    if (cuda < 0) {
        xfer_log(XFER_LOG_ERROR, XFER_TCP_SUBSYS, "tag receive: %s", why);
        return XFER_ERR_INVALID_PARAM;
    }
    if (ep != NULL) {
        status = xfer_tcp_ep_check(ep);
        if ((status != XFER_OK) && !unexp_has(iface, ep, tag, tag_mask)) {
            return status;  /* nothing it sent before failing matches */
        }
    }
    op = xfer_tcp_op_new(iface, ep, XFER_TCP_OP_RECV, comp);
    if (op == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    op->buf   = buf;
    op->len   = length;
    op->cuda  = cuda;
    op->rtag  = tag;
    op->rmask = tag_mask;

    ucs_list_for_each(ue, &iface->unexp, list) {
        if ((ue->recv != NULL) || ((ep != NULL) && (ue->ep != ep)) ||
            !tag_matches(ue->tag, tag, tag_mask)) {
            continue;
        }
        if ((ep == NULL) && !recv_claim(iface, op)) {
            return XFER_INPROGRESS;     /* another transport's: completed cancelled */
        }
        if (ue->complete) {
            unexp_deliver(iface, ue, op);
        } else {
            ue->recv = op;      /* completes when the rest has arrived */
            op->ep   = ue->ep;
            op->busy = 1;
        }
        return XFER_INPROGRESS;
    }
    ucs_list_add_tail(&iface->posted, &op->list);
    resume_paused(iface);   /* a paused message may match it */
    return XFER_INPROGRESS;
}

xfer_status_t xfer_tcp_tag_cancel(xfer_iface_h iface, xfer_comp_t *comp, xfer_status_t status)
{
    xfer_tcp_unexp_t *ue;
    xfer_tcp_op_t *op;
    xfer_ep_h ep;

    ucs_list_for_each(op, &iface->posted, list) {
        if (op->comp == comp) {
            ucs_list_del(&op->list);
            xfer_tcp_op_complete(op, status, 0, 0);
            return XFER_OK;
        }
    }
    ucs_list_for_each(ue, &iface->unexp, list) {
        if ((ue->recv != NULL) && (ue->recv->comp == comp)) {
            return XFER_ERR_BUSY;
        }
    }
    ucs_list_for_each(ep, &iface->eps, list) {
        if ((ep->rx.op != NULL) && (ep->rx.op->kind == XFER_TCP_OP_RECV) &&
            (ep->rx.op->comp == comp)) {
            return XFER_ERR_BUSY;
        }
    }
    return XFER_ERR_NOT_FOUND;
}

/* A TAG header arrived: find its receive, or buffer it, or pause. */
static xfer_status_t rx_tag_ext(xfer_ep_h ep, const uint8_t *ext, char *why, size_t why_size)
{
    xfer_iface_h iface = ep->iface;
    uint64_t len       = ep->rx.hdr.length;
    uint64_t tag       = ep->rx.hdr.id;
    xfer_tcp_op_t *op, *tmp;
    xfer_tcp_unexp_t *ue;

    (void)ext;
    ucs_list_for_each_safe(op, tmp, &iface->posted, list) {
        size_t want;

        if (((op->ep != NULL) && (op->ep != ep)) || !tag_matches(tag, op->rtag, op->rmask)) {
            continue;
        }
        ucs_list_del(&op->list);
        if ((op->ep == NULL) && !recv_claim(iface, op)) {
            continue;
        }
        op->ep        = ep;
        op->busy      = 1;
        ep->rx.op     = op;
        want          = (len < op->len) ? (size_t)len : op->len;
        ep->rx.status = (len > op->len) ? XFER_ERR_TRUNCATED : XFER_OK;
        if (op->cuda) {
            xfer_tcp_rx_expect_device(ep, op->buf, want, len - want);
        } else {
            xfer_tcp_rx_expect(ep, op->buf, want, len - want);
        }
        return XFER_OK;
    }
    if (!unexp_room(ep, len) && ep->peer_closed) {
        /* the peer sends nothing more: the rest of this message is in the socket already,
         * or it never comes */
        if (len > ep->rx.got + xfer_tcp_ep_rx_available(ep)) {
            snprintf(why, why_size, "the peer closed the connection in the middle of a "
                     "%llu-byte message", (unsigned long long)len);
            return XFER_ERR_CONNECTION;
        }
    } else if (!unexp_room(ep, len)) {
        if ((ep->rx.state != XFER_TCP_RX_PAUSED) && (ep->busy_slots > 0)) {
            xfer_log(XFER_LOG_WARN, XFER_TCP_SUBSYS, "input from the %s pauses: %llu bytes of "
                     "its messages (%llu in all) wait for receives (XFER_TCP_MAX_UNEXPECTED_EP, "
                     "XFER_TCP_MAX_UNEXPECTED), and the answers to %u request(s) of ours are "
                     "behind them until receives are posted", ep->is_server ? "client" :
                     "server", (unsigned long long)ep->unexp_bytes,
                     (unsigned long long)iface->unexp_bytes, ep->busy_slots);
        }
        return XFER_ERR_BUSY;
    }
    ue = unexp_alloc(iface, len);
    if (ue == NULL) {
        snprintf(why, why_size, "out of memory for a %llu-byte unexpected message",
                 (unsigned long long)len);
        return XFER_ERR_NO_MEMORY;
    }
    ue->ep       = ep;
    ue->tag      = tag;
    ue->length   = len;
    ue->complete = 0;
    ue->recv     = NULL;
    ucs_list_add_tail(&iface->unexp, &ue->list);
    iface->unexp_bytes += unexp_cost(len);
    ep->unexp_bytes    += unexp_cost(len);
    ep->rx.unexp        = ue;
    xfer_tcp_rx_expect(ep, ue->data, len, 0);
    return XFER_OK;
}

static xfer_status_t rx_tag_done(xfer_ep_h ep, char *why, size_t why_size)
{
    xfer_tcp_unexp_t *ue = ep->rx.unexp;

    (void)why;
    (void)why_size;
    if (ep->rx.op != NULL) {
        xfer_tcp_op_complete(ep->rx.op, ep->rx.status, ep->rx.hdr.length, ep->rx.hdr.id);
        return XFER_OK;
    }
    ue->complete = 1;
    if (ue->recv != NULL) {
        xfer_tcp_op_t *op = ue->recv;

        ue->recv = NULL;
        unexp_deliver(ep->iface, ue, op);
    }
    return XFER_OK;
}

const xfer_tcp_rx_handler_t xfer_tcp_rx_tag = {0, rx_tag_ext, rx_tag_done};
