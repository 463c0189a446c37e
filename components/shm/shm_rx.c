/*
 * Receiving: frames are taken from this side's ring in order. A message's first frame goes to
 * its type's handler, which decides where the data goes (xfer_shm_rx_expect); the DATA
 * frames that follow are copied there, and the message's done function runs once the last
 * byte is in. Every header is copied out of the ring and checked (shm_ring.c) before a
 * handler sees it; a DATA frame must belong to a message and may not carry more than the
 * message has left.
 *
 * A handler that cannot take its frame now (no room for an unexpected message) leaves it in
 * the ring: the endpoint's input pauses there and is tried again at each progress(). So does
 * a peer's request while the answers to its earlier requests are MAX_ANSWERS deep, or hold
 * more than the process's XFER_ANSWERS_BUDGET grants (its fair share of it).
 */
#include "shm.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>

static const xfer_shm_rx_fn_t handlers[XFER_SHM_F_TYPE_MAX] = {
    [XFER_SHM_F_TAG]      = xfer_shm_rx_tag,
    [XFER_SHM_F_TAG_FIN]  = xfer_shm_rx_tag_fin,
    [XFER_SHM_F_PUT]      = xfer_shm_rx_put,
    [XFER_SHM_F_PUT_ACK]  = xfer_shm_rx_put_ack,
    [XFER_SHM_F_GET]      = xfer_shm_rx_get,
    [XFER_SHM_F_GET_RESP] = xfer_shm_rx_get_resp,
    [XFER_SHM_F_FETCH]    = xfer_shm_rx_fetch,
    [XFER_SHM_F_TRESP]    = xfer_shm_rx_tresp,
    [XFER_SHM_F_TDONE]    = xfer_shm_rx_tdone,
    [XFER_SHM_F_TCANCEL]  = xfer_shm_rx_tcancel,
    [XFER_SHM_F_BATCH]    = xfer_shm_rx_batch,
    [XFER_SHM_F_BATCH_ACK] = xfer_shm_rx_batch_ack,
    [XFER_SHM_F_NOTIFY]   = xfer_shm_rx_notify,
    [XFER_SHM_F_SHARE]    = xfer_shm_rx_share,
    [XFER_SHM_F_BYE]      = xfer_shm_rx_bye,
};

static xfer_status_t rx_discard_done(xfer_ep_h ep, char *why, size_t why_size)
{
    (void)ep;
    (void)why;
    (void)why_size;
    return XFER_OK;
}

static const xfer_shm_rx_done_fn_t done_fns[] = {
    [XFER_SHM_RX_IDLE]      = NULL,
    [XFER_SHM_RX_TAG]       = xfer_shm_rx_tag_done,
    [XFER_SHM_RX_PUT]       = xfer_shm_rx_put_done,
    [XFER_SHM_RX_GET_RESP]  = xfer_shm_rx_get_resp_done,
    [XFER_SHM_RX_FETCH_KEY] = xfer_shm_rx_fetch_done,
    [XFER_SHM_RX_TRESP]     = xfer_shm_rx_tresp_done,
    [XFER_SHM_RX_NOTIFY]    = xfer_shm_rx_notify_done,
    [XFER_SHM_RX_DISCARD]   = rx_discard_done,
};

xfer_status_t xfer_shm_status_from_peer(int32_t status)
{
    if ((status > XFER_OK) || (status < XFER_ERR_LOWEST)) {
        return XFER_ERR_PROTOCOL;
    }
    return (xfer_status_t)status;
}

void xfer_shm_rx_expect(xfer_ep_h ep, xfer_shm_rx_kind_t kind, void *dest, uint64_t cap,
                        uint64_t total)
{
    ep->rx.kind  = kind;
    ep->rx.dest  = dest;
    ep->rx.cap   = (dest != NULL) ? cap : 0;
    ep->rx.total = total;
    ep->rx.got   = 0;
}

void xfer_shm_rx_feed(xfer_ep_h ep, const uint8_t *p, uint64_t n)
{
    xfer_shm_rx_t *rx = &ep->rx;

    if (n > rx->total - rx->got) {
        n = rx->total - rx->got;    /* callers check; never past the message */
    }
    if ((rx->dest != NULL) && (rx->got < rx->cap)) {
        uint64_t room = rx->cap - rx->got;

        memcpy(rx->dest + rx->got, p, (n < room) ? n : room);
    }
    rx->got += n;
    ep->rx_bytes += n;
}

/* What ep->rx holds between messages. Assigned from a constant, which GCC copies with a few
 * vector stores, where a memset of this size became a rep stos on every message. */
static const xfer_shm_rx_t rx_idle;

/* The message is whole: its done function, then the next message. */
static xfer_status_t rx_finish(xfer_ep_h ep, char *why, size_t why_size)
{
    xfer_shm_rx_done_fn_t done = done_fns[ep->rx.kind];
    xfer_status_t status       = (done != NULL) ? done(ep, why, why_size) : XFER_OK;

    ep->rx = rx_idle;
    return status;
}

void xfer_shm_rx_abort(xfer_ep_h ep, xfer_status_t status)
{
    xfer_shm_rx_t *rx = &ep->rx;

    switch (rx->kind) {
    case XFER_SHM_RX_TAG:
        /* the message will not be whole: its receive, or the framework's buffer, hears it */
        if (rx->tag_handle != NULL) {
            xfer_tag_done(rx->tag_handle, status);
        }
        break;
    case XFER_SHM_RX_FETCH_KEY:
        /* the request is not the framework's yet: it only goes with the ep */
        xfer_tframes_rx_abort(&ep->tf);
        break;
    default:
        /* GET_RESP and TRESP ops hold slots, which the teardown fails */
        break;
    }
    memset(rx, 0, sizeof(*rx));
    xfer_shm_batch_rx_abort(ep);
    ep->move_active = 0;
}

/* Is hdr a request whose answer would go into the peer's ring? */
static int is_request(const xfer_shm_frame_t *hdr)
{
    return (hdr->type == XFER_SHM_F_PUT) || (hdr->type == XFER_SHM_F_GET) ||
           (hdr->type == XFER_SHM_F_BATCH) ||
           (hdr->type == XFER_SHM_F_FETCH) ||
           ((hdr->type == XFER_SHM_F_TAG) && (hdr->flags & XFER_SHM_FL_RNDV));
}

/* One frame of input; 1 when it was taken, 0 to pause, -1 when the ep failed. */
static int rx_frame(xfer_ep_h ep, const xfer_shm_frame_t *hdr, const uint8_t *payload)
{
    char why[XFER_REASON_MAX];
    xfer_status_t status;

    why[0] = '\0';     /* not the whole array: this runs for every frame */

    if (ep->rx.kind != XFER_SHM_RX_IDLE) {
        if (hdr->type != XFER_SHM_F_DATA) {
            snprintf(why, sizeof(why), "a frame of type %u in the middle of a message (%llu "
                     "of %llu bytes in)", hdr->type, (unsigned long long)ep->rx.got,
                     (unsigned long long)ep->rx.total);
            goto fail_proto;
        }
        if ((hdr->len == 0) || (hdr->len > ep->rx.total - ep->rx.got)) {
            snprintf(why, sizeof(why), "a DATA frame of %u bytes where the message has %llu "
                     "left", hdr->len, (unsigned long long)(ep->rx.total - ep->rx.got));
            goto fail_proto;
        }
        xfer_shm_rx_feed(ep, payload, hdr->len);
        xfer_shm_ring_consume(&ep->in);
    } else {
        if (hdr->type == XFER_SHM_F_DATA) {
            snprintf(why, sizeof(why), "a DATA frame outside a message");
            goto fail_proto;
        }
        if (is_request(hdr) &&
            ((ep->answers >= ep->iface->cfg->max_answers) ||
             !xfer_budget_queue_within(ep->fail.fw_ep, XFER_BUDGET_ANSWERS, &ep->answer_bytes))) {
            return 0;   /* the answers the peer has not taken yet go first */
        }
        status = handlers[hdr->type](ep, hdr, payload, why, sizeof(why));
        if (status == XFER_ERR_BUSY) {
            return 0;
        }
        if (status != XFER_OK) {
            xfer_shm_ep_fail(ep, status, "%s", why);
            return -1;
        }
        xfer_shm_ring_consume(&ep->in);
    }
    if ((ep->rx.kind != XFER_SHM_RX_IDLE) && (ep->rx.got == ep->rx.total)) {
        status = rx_finish(ep, why, sizeof(why));
        if (status != XFER_OK) {
            xfer_shm_ep_fail(ep, status, "%s", why);
            return -1;
        }
    }
    return 1;

fail_proto:
    xfer_shm_ep_fail(ep, XFER_ERR_PROTOCOL, "%s", why);
    return -1;
}

unsigned xfer_shm_ep_rx_progress(xfer_ep_h ep)
{
    char why[XFER_REASON_MAX];
    xfer_shm_frame_t hdr;
    const uint8_t *payload;
    unsigned count = 0;
    int r;

    ep->rx_paused = 0;
    ep->rx_copied = 0;
    ep->rx_yield  = 0;
    ep->rx_more   = 0;
    ep->in_rx     = 1;     /* tensor answers queue; they are written below */
    while ((count < XFER_SHM_RX_BUDGET) && (ep->rx_copied < XFER_SHM_RX_BYTES_BUDGET) &&
           !ep->rx_yield && (ep->fail.state == XFER_EP_CONNECTED)) {
        r = xfer_shm_ring_peek(&ep->in, &hdr, &payload, why, sizeof(why));
        if (r == 0) {
            break;
        }
        if (r < 0) {
            xfer_shm_ep_fail(ep, XFER_ERR_PROTOCOL, "%s", why);
            break;
        }
        r = rx_frame(ep, &hdr, payload);
        if (r <= 0) {
            ep->rx_paused = (r == 0);
            break;
        }
        count++;
    }
    if ((count > 0) && (ep->fail.state == XFER_EP_CONNECTED) &&
        xfer_shm_ring_room_notify(&ep->in)) {
        xfer_shm_doorbell_ring(ep);
    }
    ep->in_rx = 0;
    /* answers queued by the handlers go out now */
    if ((ep->fail.state == XFER_EP_CONNECTED) && !ucs_list_is_empty(&ep->txq)) {
        xfer_shm_tx_write(ep);
    }
    return count;
}

void xfer_shm_ep_doorbell(xfer_ep_h ep)
{
    uint8_t buf[256];
    ssize_t n;

    if ((ep->fail.state != XFER_EP_CONNECTED) || (ep->fd < 0)) {
        return;
    }
    xfer_shm_ep_watch(ep);      /* a peer that rings has written something */
    for (;;) {
        n = recv(ep->fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n > 0) {
            continue;
        }
        if ((n < 0) && ((errno == EAGAIN) || (errno == EWOULDBLOCK) || (errno == EINTR))) {
            return;
        }
        break;
    }
    /* the connection ended: the peer closed its endpoint or its process is gone. What it
     * wrote into our ring before is delivered first - messages nobody receives yet beyond
     * the bounds too, as the ring bounds them - up to its BYE, if it closed in order. */
    ep->peer_gone = 1;
    while ((ep->fail.state == XFER_EP_CONNECTED) && (xfer_shm_ep_rx_progress(ep) > 0)) {
    }
    if (ep->fail.state == XFER_EP_CONNECTED) {
        if ((ep->rx.kind != XFER_SHM_RX_IDLE) || ep->rx_paused) {
            ep->peer_gone = 0;  /* worth a warning: something was cut short */
        }
        xfer_shm_ep_fail(ep, XFER_ERR_CONNECTION, "the peer closed the connection (its "
                         "endpoint closed or its process ended)%s",
                         (ep->rx.kind != XFER_SHM_RX_IDLE) ? " in the middle of a message" :
                         ep->rx_paused ? " with messages nobody received yet" : "");
    }
}
