/*
 * The receive state machine of a tcp endpoint: it reads frames, validates their headers and
 * hands each to its type's handler (tcp_tag.c, tcp_rma.c, tcp_tensor.c); and the epoll events
 * of the endpoint, which start it.
 *
 * Receiving: header -> extension -> payload. Headers and extensions are parsed from a staging
 * buffer; payloads are copied out of it and, once it is empty, read with readv() straight into
 * their destination (a matched receive, a put target, a get or fetch buffer), the staging
 * buffer catching whatever follows. Every header is validated before its length is used.
 * A striped frame's payload is share 0 here, the other shares being read by its lanes
 * (tcp_lane.c); the frame is done once all are in.
 */
#include "tcp.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>

static const xfer_tcp_rx_handler_t *rx_handler(unsigned type)
{
    switch (type) {
    case XFER_TCP_WIRE_TAG:           return &xfer_tcp_rx_tag;
    case XFER_TCP_WIRE_PUT_REQ:       return &xfer_tcp_rx_put_req;
    case XFER_TCP_WIRE_PUT_ACK:       return &xfer_tcp_rx_put_ack;
    case XFER_TCP_WIRE_GET_REQ:       return &xfer_tcp_rx_get_req;
    case XFER_TCP_WIRE_GET_RESP:      return &xfer_tcp_rx_get_resp;
    case XFER_TCP_WIRE_TENSOR_REQ:    return &xfer_tcp_rx_tensor_req;
    case XFER_TCP_WIRE_TENSOR_RESP:   return &xfer_tcp_rx_tensor_resp;
    case XFER_TCP_WIRE_TENSOR_CANCEL: return &xfer_tcp_rx_tensor_cancel;
    case XFER_TCP_WIRE_PUT:           return &xfer_tcp_rx_put;
    case XFER_TCP_WIRE_PUT_FAIL:      return &xfer_tcp_rx_put_fail;
    case XFER_TCP_WIRE_FLUSH_REQ:     return &xfer_tcp_rx_flush_req;
    case XFER_TCP_WIRE_FLUSH_ACK:     return &xfer_tcp_rx_flush_ack;
    case XFER_TCP_WIRE_BATCH_END:     return &xfer_tcp_rx_batch_end;
    case XFER_TCP_WIRE_BATCH_ACK:     return &xfer_tcp_rx_batch_ack;
    case XFER_TCP_WIRE_PUTV:          return &xfer_tcp_rx_putv;
    case XFER_TCP_WIRE_BYE:           return &xfer_tcp_rx_bye;
    default:                          return NULL;
    }
}

void xfer_tcp_rx_expect(xfer_ep_h ep, void *dest, size_t want, uint64_t drain)
{
    ep->rx.dest  = dest;
    ep->rx.want  = want;
    ep->rx.got   = 0;
    ep->rx.drain = drain;
}

void xfer_tcp_rx_expect_device(xfer_ep_h ep, void *dest, size_t want, uint64_t drain)
{
    xfer_tcp_rx_expect(ep, dest, want, drain);
    ep->rx.dev     = 1;
    ep->rx.dslot   = UINT_MAX;
    ep->rx.dfill   = 0;
    ep->rx.dcopies = 0;
}

static void rx_reset(xfer_ep_h ep)
{
    if (ep->putv_rx != NULL) {
        free(ep->putv_rx);      /* a PUTV's table: a frame's, not the endpoint's */
        ep->putv_rx = NULL;
    }
    memset(&ep->rx, 0, sizeof(ep->rx));
    ep->rx.state = XFER_TCP_RX_HDR;
}

void xfer_tcp_ep_rx_abort(xfer_ep_h ep, xfer_status_t status)
{
    xfer_tcp_rx_t *rx = &ep->rx;

    if (rx->dev) {
        xfer_tcp_cuda_rx_quiesce(ep);   /* before the destination is reported free */
    }
    /* a GET or FETCH op is completed with the outstanding requests; a message's receive
     * (or the framework's buffer for it) hears that it will not be whole */
    if (rx->tag_handle != NULL) {
        xfer_tag_done(rx->tag_handle, status);
    }
    xfer_tframes_rx_abort(&ep->tf);     /* a request whose key was arriving */
    if (rx->hdr.striped) {
        xfer_tcp_lanes_rx_reset(ep);
    }
    rx_reset(ep);
}

/* After a read of 0 or -1: 0 to wait for more input, -1 when the ep failed. */
static int rx_read_error(xfer_ep_h ep, ssize_t ret)
{
    if (ret == 0) {
        /* the peer's end came in order (a FIN: its kernel had nothing of ours unread), so
         * what it acknowledged before is what a flush asked for: those flushes succeed */
        xfer_tcp_ep_flushes_check(ep);
        if ((ep->rx.state == XFER_TCP_RX_HDR) && (ep->rlen == ep->roff)) {
            ep->clean_close = 1;
            xfer_tcp_ep_fail(ep, XFER_ERR_CONNECTION, "peer closed the connection");
        } else {
            xfer_tcp_ep_fail(ep, XFER_ERR_CONNECTION, "peer closed the connection in the "
                             "middle of a frame");
        }
        return -1;
    }
    if ((errno == EAGAIN) || (errno == EWOULDBLOCK)) {
        return 0;
    }
    xfer_tcp_ep_fail(ep, XFER_ERR_CONNECTION, "recv: %s", strerror(errno));
    return -1;
}

int xfer_tcp_ep_rx_read(xfer_ep_h ep, struct iovec *iov, int iovcnt, size_t *n_p)
{
    uint64_t slice = XFER_IFACE_FAIR_SLICE(&ep->iface->params);
    size_t space   = 0, left, cut_len = 0;
    int cnt        = 0;
    ssize_t ret;

    if (ep->rx_drained) {
        return 0;
    }
    if (ep->rx_round >= slice) {
        /* this peer had its slice of the round: the rest in the next, in turn with others */
        xfer_tcp_iface_rx_kick(ep->iface, ep);
        return 0;
    }
    /* one read takes at most what is left of the slice: the socket's queue can hold far
     * more (tcp_rmem's maximum, tens of MiB), all of it copied in a single readv otherwise */
    left = (size_t)(slice - ep->rx_round);
    while ((cnt < iovcnt) && (space < left)) {
        space += iov[cnt++].iov_len;
    }
    if (space > left) {
        cut_len                = iov[cnt - 1].iov_len;
        iov[cnt - 1].iov_len  -= space - left;
        space                  = left;
    }
    do {
        ret = readv(ep->fd, iov, cnt);
    } while ((ret < 0) && (errno == EINTR));
    if (cut_len != 0) {
        iov[cnt - 1].iov_len = cut_len;     /* the caller's iovec as it was */
    }
    if (ret <= 0) {
        return rx_read_error(ep, ret);
    }
    ep->rx_drained = ((size_t)ret < space);
    ep->rx_round  += (uint64_t)ret;
    ep->rx_bytes  += (uint64_t)ret;
    *n_p           = (size_t)ret;
    return 1;
}

/* Make n contiguous unparsed bytes available in the staging buffer. 1 = there, 0 = wait.
 * While large payloads flow (a frame of the staging buffer's size or more was read straight
 * into place, and fewer than XFER_TCP_RX_PEEK_FRAMES frames came wholly out of the buffer
 * since), a read takes what is needed or XFER_TCP_RX_PEEK_LEN: a full buffer would catch the
 * start of the next large payload, copied a second time out of it (measured on streams of
 * 512 KiB puts and of 128 x 4 KiB batches: 12% of the bytes took that way, under 1% with the
 * short reads). */
static int rx_fill(xfer_ep_h ep, size_t n)
{
    while (ep->rlen - ep->roff < n) {
        struct iovec iov;
        size_t got;
        int ret;

        if (ep->roff == ep->rlen) {
            ep->roff = ep->rlen = 0;
        } else if (XFER_TCP_RX_BUF_LEN - ep->roff < n) {
            memmove(ep->rbuf, ep->rbuf + ep->roff, ep->rlen - ep->roff);
            ep->rlen -= ep->roff;
            ep->roff  = 0;
        }
        iov.iov_base = ep->rbuf + ep->rlen;
        iov.iov_len  = XFER_TCP_RX_BUF_LEN - ep->rlen;
        if (ep->rx_staged < XFER_TCP_RX_PEEK_FRAMES) {
            size_t need = n - (ep->rlen - ep->roff);
            size_t peek = (need > XFER_TCP_RX_PEEK_LEN) ? need : XFER_TCP_RX_PEEK_LEN;

            iov.iov_len = (peek < iov.iov_len) ? peek : iov.iov_len;
        }
        ret = xfer_tcp_ep_rx_read(ep, &iov, 1, &got);
        if (ret <= 0) {
            return ret;
        }
        ep->rlen += got;
    }
    return 1;
}

/* How much of what follows a payload its last read catches in the staging buffer: after a
 * large payload, likely the next one's start, which would be copied once more. */
static size_t rx_tail_len(xfer_ep_h ep)
{
    return ep->rx.direct ? XFER_TCP_RX_PEEK_LEN : XFER_TCP_RX_BUF_LEN;
}

/* A PUTV's payload into its blocks viov[vidx..vcnt), rx->got bytes of the current one in:
 * staged bytes are copied, then one readv() fills as many blocks as the socket has data
 * for, the staging buffer catching what follows. Into CUDA memory, block by block through
 * tcp_cuda.c. 1 = all in, 0 = wait, -1 = the ep failed. */
static int rx_blocks(xfer_ep_h ep)
{
    xfer_tcp_rx_t *rx = &ep->rx;
    struct iovec iov[XFER_TCP_RX_IOV_MAX];
    int cnt, ret;
    size_t n;

    while (rx->vidx < rx->vcnt) {
        const struct iovec *b = &rx->viov[rx->vidx];
        size_t avail          = ep->rlen - ep->roff;

        if (rx->memh->cuda) {
            if (!rx->dev) {
                xfer_tcp_rx_expect_device(ep, b->iov_base, b->iov_len, 0);
            }
            ret = xfer_tcp_cuda_rx_data(ep);
            if (ret <= 0) {
                return ret;
            }
            rx->dev = 0;
            rx->vidx++;
            continue;
        }
        if (rx->got == b->iov_len) {
            rx->vidx++;
            rx->got = 0;
            continue;
        }
        if (avail > 0) {
            n = (avail < b->iov_len - rx->got) ? avail : b->iov_len - rx->got;
            memcpy((uint8_t*)b->iov_base + rx->got, ep->rbuf + ep->roff, n);
            ep->roff += n;
            rx->got  += n;
            continue;
        }
        ep->roff = ep->rlen = 0;
        iov[0].iov_base = (uint8_t*)b->iov_base + rx->got;
        iov[0].iov_len  = b->iov_len - rx->got;
        cnt = 1;
        for (uint32_t i = rx->vidx + 1; (i < rx->vcnt) && (cnt < XFER_TCP_RX_IOV_MAX - 1); i++) {
            iov[cnt++] = rx->viov[i];
        }
        rx->direct        = (rx->hdr.length >= XFER_TCP_RX_BUF_LEN);
        iov[cnt].iov_base = ep->rbuf;
        iov[cnt].iov_len  = rx_tail_len(ep);
        ret = xfer_tcp_ep_rx_read(ep, iov, cnt + 1, &n);
        if (ret <= 0) {
            return ret;
        }
        for (int i = 0; (i < cnt) && (n > 0); i++) {
            size_t take = (n < iov[i].iov_len) ? n : iov[i].iov_len;

            n       -= take;
            rx->got += take;
            if (rx->got == rx->viov[rx->vidx].iov_len) {
                rx->vidx++;
                rx->got = 0;
            }
        }
        ep->rlen = n;   /* what follows the payload, for the next frame */
    }
    return 1;
}

/* Move the payload to its destination, then discard what is to be drained. */
static int rx_data(xfer_ep_h ep)
{
    xfer_tcp_rx_t *rx = &ep->rx;
    struct iovec iov[2];
    size_t n;
    int ret;

    if (rx->viov != NULL) {
        ret = rx_blocks(ep);
        if (ret <= 0) {
            return ret;
        }
    } else if (rx->dev) {
        ret = xfer_tcp_cuda_rx_data(ep);
        if (ret <= 0) {
            return ret;
        }
    }
    while (rx->got < rx->want) {
        size_t avail = ep->rlen - ep->roff;

        if (avail > 0) {
            n = (avail < rx->want - rx->got) ? avail : rx->want - rx->got;
            memcpy(rx->dest + rx->got, ep->rbuf + ep->roff, n);
            ep->roff += n;
            rx->got  += n;
            continue;
        }
        ep->roff = ep->rlen = 0;
        iov[0].iov_base = rx->dest + rx->got;
        iov[0].iov_len  = rx->want - rx->got;
        rx->direct      = (rx->hdr.length >= XFER_TCP_RX_BUF_LEN);
        iov[1].iov_base = ep->rbuf;
        iov[1].iov_len  = rx_tail_len(ep);
        ret = xfer_tcp_ep_rx_read(ep, iov, 2, &n);
        if (ret <= 0) {
            return ret;
        }
        if (n <= iov[0].iov_len) {
            rx->got += n;
        } else {
            ep->rlen = n - iov[0].iov_len;
            rx->got  = rx->want;
        }
    }
    while (rx->drain > 0) {
        size_t avail = ep->rlen - ep->roff;

        if (avail > 0) {
            n = (avail < rx->drain) ? avail : (size_t)rx->drain;
            ep->roff  += n;
            rx->drain -= n;
            continue;
        }
        ep->roff = ep->rlen = 0;
        iov[0].iov_base = ep->rbuf;
        iov[0].iov_len  = XFER_TCP_RX_BUF_LEN;
        ret = xfer_tcp_ep_rx_read(ep, iov, 1, &ep->rlen);
        if (ret <= 0) {
            return ret;
        }
    }
    if (!rx->hdr.striped) {
        return 1;
    }
    ret = xfer_tcp_lanes_rx_poll(ep);
    if ((ret == 0) && !rx->lanes_wait) {
        /* lane 0 holds the next frame: do not hear of it again until the lanes are done */
        rx->lanes_wait = 1;
        xfer_tcp_ep_update_events(ep);
    }
    return ret;
}

/* Advance the receive state machine by at most one frame: 1 = a frame was handled,
 * 0 = waiting for input (or paused), -1 = the ep failed. */
static int rx_step(xfer_ep_h ep)
{
    xfer_tcp_rx_t *rx = &ep->rx;
    char why[XFER_REASON_MAX] = "";
    xfer_status_t status;
    int ret, rearm;

    for (;;) {
        switch (rx->state) {
        case XFER_TCP_RX_HDR:
            if (((ep->answers.held > ep->iface->cfg->max_backlog) ||
                 !xfer_budget_queue_within(ep->fail.fw_ep, XFER_BUDGET_ANSWERS, &ep->answers)) &&
                !ep->peer_closed) {
                /* the peer does not read what we answer, or the process holds all the
                 * answers it may (XFER_ANSWERS_BUDGET): read no more of its requests until
                 * half of them have gone and the rest fit (tx_done resumes) */
                if (!ep->rx_blocked) {
                    ep->rx_blocked = 1;
                    xfer_tcp_ep_update_events(ep);
                    xfer_log_at(XFER_LOG_DEBUG, XFER_TCP_SUBSYS, "ep %p pauses its input: "
                                "%llu bytes of answers wait to be written", (void*)ep,
                                (unsigned long long)ep->answers.held);
                }
                return 0;
            }
            ret = rx_fill(ep, XFER_TCP_WIRE_HDR_LEN);
            if (ret <= 0) {
                return ret;
            }
            status = xfer_tcp_wire_unpack_hdr(ep->rbuf + ep->roff, &ep->iface->limits,
                                              &rx->hdr, why, sizeof(why));
            if (status != XFER_OK) {
                xfer_tcp_ep_fail(ep, status, "%s", why);
                return -1;
            }
            if (rx->hdr.striped > ep->nlanes) {
                xfer_tcp_ep_fail(ep, XFER_ERR_PROTOCOL, "%s frame striped over %u lanes, the "
                                 "connection has %u", xfer_tcp_wire_type_name(rx->hdr.type),
                                 rx->hdr.striped, ep->nlanes);
                return -1;
            }
            ep->roff   += XFER_TCP_WIRE_HDR_LEN;
            rx->handler = rx_handler(rx->hdr.type);
            if (rx->handler == NULL) {  /* the parser knows every type; stay safe anyway */
                xfer_tcp_ep_fail(ep, XFER_ERR_PROTOCOL, "no handler for frame type %u",
                                 rx->hdr.type);
                return -1;
            }
            rx->ext_len = rx->handler->ext_len;
            rx->state   = XFER_TCP_RX_EXT;
            break;
        case XFER_TCP_RX_EXT:
        case XFER_TCP_RX_PAUSED:
            if (rx->ext_len > 0) {
                ret = rx_fill(ep, rx->ext_len);
                if (ret <= 0) {
                    return ret;
                }
            }
            status = rx->handler->on_ext(ep, ep->rbuf + ep->roff, why, sizeof(why));
            if (status == XFER_INPROGRESS) {
                continue;   /* the handler raised ext_len */
            }
            if (status == XFER_ERR_BUSY) {
                if (rx->state != XFER_TCP_RX_PAUSED) {
                    rx->state = XFER_TCP_RX_PAUSED;
                    xfer_tcp_ep_update_events(ep);
                    xfer_log_at(XFER_LOG_DEBUG, XFER_TCP_SUBSYS, "ep %p pauses its input: "
                                "its messages nobody received reach the bounds", (void*)ep);
                }
                return 0;
            }
            if (status != XFER_OK) {
                xfer_tcp_ep_fail(ep, status, "%s", why);
                return -1;
            }
            ep->roff += rx->ext_len;
            if (rx->hdr.striped) {
                status = xfer_tcp_lanes_rx_start(ep, why, sizeof(why));
                if (status != XFER_OK) {
                    xfer_tcp_ep_fail(ep, status, "%s", why);
                    return -1;
                }
            }
            if (rx->state == XFER_TCP_RX_PAUSED) {
                rx->state = XFER_TCP_RX_DATA;
                xfer_tcp_ep_update_events(ep);  /* input is watched again */
            }
            rx->state = XFER_TCP_RX_DATA;
            break;
        case XFER_TCP_RX_DATA:
            ret = rx_data(ep);
            if (ret <= 0) {
                return ret;
            }
            rearm  = rx->lanes_wait;
            if (rx->direct) {
                ep->rx_staged = 0;
            } else if (ep->rx_staged < XFER_TCP_RX_PEEK_FRAMES) {
                ep->rx_staged++;
            }
            status = (rx->handler->on_done != NULL) ? rx->handler->on_done(ep, why, sizeof(why)) :
                                                      XFER_OK;
            rx_reset(ep);
            if (rearm) {
                xfer_tcp_ep_update_events(ep);
            }
            if (status != XFER_OK) {
                xfer_tcp_ep_fail(ep, status, "%s", why);
                return -1;
            }
            return 1;
        }
    }
}

unsigned xfer_tcp_ep_rx_progress(xfer_ep_h ep)
{
    unsigned frames = 0;

    ep->rx_drained = 0;     /* called on an event, or with input buffered: read again */
    if (ep->rx_gen != ep->iface->rx_gen) {
        ep->rx_gen   = ep->iface->rx_gen;
        ep->rx_round = 0;   /* its first look in this progress(): a new slice */
    }
    while (ep->fail.state == XFER_EP_CONNECTED) {
        if (frames >= XFER_TCP_RX_BUDGET) {
            xfer_tcp_iface_rx_kick(ep->iface, ep);   /* more may be buffered: next time */
            break;
        }
        if (rx_step(ep) <= 0) {
            break;
        }
        frames++;
    }
    xfer_tcp_ep_tx_post(ep);    /* responses the frames asked for */
    return frames;
}

uint64_t xfer_tcp_ep_rx_available(xfer_ep_h ep)
{
    int queued = 0;

    if ((ep->fd < 0) || (ioctl(ep->fd, FIONREAD, &queued) != 0) || (queued < 0)) {
        queued = 0;
    }
    return (uint64_t)(ep->rlen - ep->roff) + (uint64_t)queued +
           ((ep->nlanes > 1) ? xfer_tcp_lanes_rx_available(ep) : 0);
}

unsigned xfer_tcp_ep_handle_events(xfer_ep_h ep, uint32_t events)
{
    if (ep->fail.state != XFER_EP_CONNECTED) {
        return 0;   /* failed earlier in this progress() */
    }
    if (events & EPOLLOUT) {
        xfer_tcp_ep_tx_write(ep);
    }
    if ((events & EPOLLRDHUP) && !ep->peer_closed) {
        /* the peer sends nothing more: what is left of its input is bounded by the socket's
         * buffer, so input that waited for room may be read now, and its end seen */
        ep->peer_closed = 1;
        ep->rx_blocked  = 0;
    }
    if (((ep->rx.state == XFER_TCP_RX_PAUSED) || ep->rx_blocked) &&
        (events & (EPOLLERR | EPOLLHUP))) {
        int err = 0;
        socklen_t len = sizeof(err);

        getsockopt(ep->fd, SOL_SOCKET, SO_ERROR, &err, &len);
        xfer_tcp_ep_fail(ep, XFER_ERR_CONNECTION, "connection lost while input was paused%s%s",
                         err ? ": " : "", err ? strerror(err) : "");
        return 1;
    }
    if ((ep->fail.state == XFER_EP_CONNECTED) &&
        (events & (EPOLLIN | EPOLLERR | EPOLLHUP | EPOLLRDHUP))) {
        return xfer_tcp_ep_rx_progress(ep) + 1;
    }
    return 1;
}
