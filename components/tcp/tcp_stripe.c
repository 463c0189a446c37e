/*
 * Striping: the data of a large frame cut in shares over an endpoint's lanes (tcp_lane.c sets
 * the lanes up). Sending: xfer_tcp_wire_stripe() gives each lane its share of the frame's own
 * memory, queued in frame order; the frame (and its send or put) is done once lane 0's part
 * and every share are written. Receiving: when lane 0 enters a striped frame's payload, each
 * lane reads its share straight into the destination (drained past a truncation, copied in
 * through the scratch buffer for CUDA memory); the frame is done once every share is in.
 */
#include "tcp.h"

#include <xfer/byteorder.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

/* ---- sending -------------------------------------------------------------------------------- */

void xfer_tcp_lanes_tx_stripe(xfer_ep_h ep, xfer_tcp_tx_t *tx)
{
    xfer_tcp_seg_t *segs[XFER_TCP_WIRE_LANES_MAX];
    uint8_t *type = (uint8_t*)tx->iov[0].iov_base + 3;  /* the header's type byte */
    size_t len    = tx->iov[1].iov_len;
    uint64_t off, share;
    unsigned n    = 1;

    if ((ep->nlanes < 2) || (len < ep->iface->cfg->lane_min) || tx->dev ||
        ((tx->kind != XFER_TCP_TX_OP) && (tx->kind != XFER_TCP_TX_ANSWER)) ||
        !xfer_tcp_wire_type_stripes(*type)) {
        return;
    }
    /* the lanes up: connected (client) or attached (server), from lane 1 on */
    while ((n < ep->nlanes) && (ep->lanes[n].fd >= 0) && !ep->lanes[n].peer_closed &&
           !ep->lanes[n].connecting) {
        n++;
    }
    if (n < 2) {
        return;
    }
    for (unsigned i = 1; i < n; i++) {
        segs[i] = malloc(sizeof(*segs[i]));
        if (segs[i] == NULL) {
            while (--i > 0) {
                free(segs[i]);
            }
            return;     /* it goes on lane 0 alone */
        }
    }
    *type |= XFER_TCP_WIRE_STRIPED;
    xfer_put_le32(type + 1, n);         /* the status field: over how many lanes */
    for (unsigned i = 1; i < n; i++) {
        xfer_tcp_lane_t *lane = &ep->lanes[i];

        xfer_tcp_wire_stripe(len, n, i, &off, &share);
        segs[i]->tx   = tx;
        segs[i]->p    = (const uint8_t*)tx->iov[1].iov_base + off;
        segs[i]->len  = (size_t)share;
        segs[i]->sent = 0;
        ucs_list_add_tail(&lane->txq, &segs[i]->list);
        lane->tx_queued += share;
    }
    xfer_tcp_wire_stripe(len, n, 0, &off, &share);
    tx->iov[1].iov_len = (size_t)share;
    tx->lanes_left     = n - 1;
    tx->lane0_done     = 0;
}

int xfer_tcp_lanes_tx_lane0_done(xfer_ep_h ep, xfer_tcp_tx_t *tx)
{
    if (tx->lanes_left == 0) {
        return 1;
    }
    tx->lane0_done = 1;
    ucs_list_add_tail(&ep->tx_wait, &tx->list);
    return 0;
}

static void seg_done(xfer_ep_h ep, xfer_tcp_seg_t *seg)
{
    xfer_tcp_tx_t *tx = seg->tx;

    ucs_list_del(&seg->list);
    free(seg);
    if ((--tx->lanes_left == 0) && tx->lane0_done) {
        ucs_list_del(&tx->list);    /* from ep->tx_wait */
        xfer_tcp_ep_tx_end(ep, tx, XFER_OK);
    }
}

void xfer_tcp_lane_write(xfer_tcp_lane_t *lane)
{
    xfer_ep_h ep = lane->ep;
    struct iovec iov[XFER_TCP_IOV_MAX];

    while ((lane->fd >= 0) && !ucs_list_is_empty(&lane->txq)) {
        struct msghdr msg = {0};
        xfer_tcp_seg_t *seg, *tmp;
        size_t total = 0;
        int cnt = 0, full = 0;
        ssize_t n;

        ucs_list_for_each(seg, &lane->txq, list) {
            iov[cnt].iov_base = (void*)(seg->p + seg->sent);
            iov[cnt].iov_len  = seg->len - seg->sent;
            total            += iov[cnt].iov_len;
            if (++cnt == XFER_TCP_IOV_MAX) {
                break;
            }
        }
        msg.msg_iov    = iov;
        msg.msg_iovlen = (size_t)cnt;
        n = sendmsg(lane->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            if ((errno != EAGAIN) && (errno != EWOULDBLOCK)) {
                xfer_tcp_ep_fail_later(ep, XFER_ERR_CONNECTION, "lane %u: send: %s", lane->idx,
                                       strerror(errno));
                return;
            }
            break;
        }
        lane->tx_written += (size_t)n;
        if ((size_t)n < total) {
            full = 1;
        }
        ucs_list_for_each_safe(seg, tmp, &lane->txq, list) {
            size_t left = seg->len - seg->sent;

            if ((size_t)n < left) {
                seg->sent += (size_t)n;
                break;
            }
            n -= (ssize_t)left;
            seg_done(ep, seg);
            if (n == 0) {
                break;
            }
        }
        if (full) {
            break;  /* the socket took less than offered */
        }
    }
    xfer_tcp_lane_update_events(lane);
}

void xfer_tcp_lanes_tx_write(xfer_ep_h ep)
{
    for (unsigned i = 1; i < ep->nlanes; i++) {
        if (!ucs_list_is_empty(&ep->lanes[i].txq)) {
            xfer_tcp_lane_write(&ep->lanes[i]);
        }
    }
}

void xfer_tcp_lanes_mark(xfer_ep_h ep, uint64_t *mark)
{
    for (unsigned i = 1; i < ep->nlanes; i++) {
        mark[i] = ep->lanes[i].tx_queued;
    }
}

int xfer_tcp_lanes_acked(xfer_ep_h ep, const uint64_t *mark)
{
    for (unsigned i = 1; i < ep->nlanes; i++) {
        xfer_tcp_lane_t *lane = &ep->lanes[i];
        uint64_t want = (mark != NULL) ? mark[i] : lane->tx_queued;

        /* a lane not attached yet has acknowledged nothing */
        if ((want > 0) && ((lane->fd < 0) ||
                           (xfer_tcp_sock_acked(lane->fd, lane->tx_written) < want))) {
            return 0;
        }
    }
    return 1;
}

/* ---- receiving ------------------------------------------------------------------------------ */

xfer_status_t xfer_tcp_lanes_rx_start(xfer_ep_h ep, char *why, size_t why_size)
{
    xfer_tcp_rx_t *rx = &ep->rx;
    uint64_t total    = (uint64_t)rx->want + rx->drain;
    unsigned n        = rx->hdr.striped;
    uint64_t off, share;

    for (unsigned i = 1; i < n; i++) {
        xfer_tcp_lane_t *lane = &ep->lanes[i];

        if (lane->peer_closed && (lane->fd < 0)) {
            snprintf(why, why_size, "a striped %s needs lane %u, which is gone",
                     xfer_tcp_wire_type_name(rx->hdr.type), i);
            return XFER_ERR_CONNECTION;
        }
        xfer_tcp_wire_stripe(total, n, i, &off, &share);
        lane->rx_dev  = rx->dev;
        lane->rx_got  = 0;
        if (off < rx->want) {
            lane->rx_dest  = rx->dest + off;
            lane->rx_want  = (share < rx->want - off) ? (size_t)share : rx->want - (size_t)off;
        } else {
            lane->rx_dest  = NULL;
            lane->rx_want  = 0;
        }
        lane->rx_drain  = share - lane->rx_want;
        lane->rx_active = (share > 0);
        lane->drained   = 0;
        xfer_tcp_lane_update_events(lane);
    }
    xfer_tcp_wire_stripe(total, n, 0, &off, &share);
    if (share < rx->want) {
        rx->want  = (size_t)share;
        rx->drain = 0;
    } else {
        rx->drain = share - rx->want;
    }
    return XFER_OK;
}

/* One read of a lane: 1 with *n_p bytes, 0 to wait, -1 when the ep failed. A lane reads at
 * most a slice (XFER_FAIR_SLICE) a round: a peer that keeps its lanes full would otherwise
 * hold the round for as long as it streams; the rest comes at the lane's next event (its
 * EPOLLIN is level-triggered while a share is due). */
static int lane_read(xfer_tcp_lane_t *lane, void *buf, size_t len, size_t *n_p)
{
    uint64_t slice = XFER_IFACE_FAIR_SLICE(&lane->ep->iface->params);
    ssize_t ret;

    if ((lane->fd < 0) || lane->drained || (lane->rx_round >= slice)) {
        return 0;   /* not attached yet (server), empty this round, or had its slice */
    }
    if (len > slice - lane->rx_round) {
        len = (size_t)(slice - lane->rx_round);
    }
    do {
        ret = recv(lane->fd, buf, len, 0);
    } while ((ret < 0) && (errno == EINTR));
    if (ret > 0) {
        lane->drained   = ((size_t)ret < len);
        lane->rx_round += (uint64_t)ret;
        lane->ep->rx_bytes += (uint64_t)ret;
        *n_p            = (size_t)ret;
        return 1;
    }
    if ((ret < 0) && ((errno == EAGAIN) || (errno == EWOULDBLOCK))) {
        lane->drained = 1;
        return 0;
    }
    xfer_tcp_ep_fail(lane->ep, XFER_ERR_CONNECTION, "lane %u: %s in the middle of a striped "
                     "frame", lane->idx, (ret == 0) ? "the peer closed it" : strerror(errno));
    return -1;
}

int xfer_tcp_lane_rx(xfer_tcp_lane_t *lane)
{
    xfer_iface_h iface = lane->ep->iface;
    size_t n;
    int ret;

    while (lane->rx_got < lane->rx_want) {
        size_t left = lane->rx_want - lane->rx_got;

        if (!lane->rx_dev) {
            ret = lane_read(lane, lane->rx_dest + lane->rx_got, left, &n);
        } else {
            char why[XFER_REASON_MAX] = "";

            /* CUDA memory: through the scratch buffer, each piece landed before the next */
            ret = lane_read(lane, iface->scratch, (left < XFER_TCP_RX_BUF_LEN) ? left :
                            XFER_TCP_RX_BUF_LEN, &n);
            if ((ret == 1) && (xfer_tcp_cuda_copy(iface, lane->rx_dest + lane->rx_got,
                                                  iface->scratch, n, 1, why,
                                                  sizeof(why)) != XFER_OK)) {
                xfer_tcp_ep_fail(lane->ep, XFER_ERR_IO, "lane %u: copy into CUDA memory: %s",
                                 lane->idx, why);
                return -1;
            }
        }
        if (ret <= 0) {
            return ret;
        }
        lane->rx_got += n;
    }
    while (lane->rx_drain > 0) {
        ret = lane_read(lane, iface->scratch, (lane->rx_drain < XFER_TCP_RX_BUF_LEN) ?
                        (size_t)lane->rx_drain : XFER_TCP_RX_BUF_LEN, &n);
        if (ret <= 0) {
            return ret;
        }
        lane->rx_drain -= n;
    }
    lane->rx_active = 0;
    xfer_tcp_lane_update_events(lane);
    return 1;
}

int xfer_tcp_lanes_rx_poll(xfer_ep_h ep)
{
    int all = 1;

    for (unsigned i = 1; i < ep->nlanes; i++) {
        xfer_tcp_lane_t *lane = &ep->lanes[i];
        int ret;

        if (!lane->rx_active) {
            continue;
        }
        lane->drained = 0;
        ret = xfer_tcp_lane_rx(lane);
        if (ret < 0) {
            return -1;
        }
        all = all && (ret == 1);
    }
    return all;
}

void xfer_tcp_lanes_rx_forget(xfer_ep_h ep)
{
    for (unsigned i = 1; i < ep->nlanes; i++) {
        xfer_tcp_lane_t *lane = &ep->lanes[i];

        if (lane->rx_active) {
            lane->rx_drain += lane->rx_want - lane->rx_got;
            lane->rx_want   = lane->rx_got;
        }
    }
}

void xfer_tcp_lanes_rx_reset(xfer_ep_h ep)
{
    for (unsigned i = 1; i < ep->nlanes; i++) {
        ep->lanes[i].rx_active = 0;
        xfer_tcp_lane_update_events(&ep->lanes[i]);
    }
}

uint64_t xfer_tcp_lanes_rx_available(xfer_ep_h ep)
{
    uint64_t sum = 0;

    for (unsigned i = 1; i < ep->nlanes; i++) {
        int queued = 0;

        if ((ep->lanes[i].fd >= 0) && (ioctl(ep->lanes[i].fd, FIONREAD, &queued) == 0) &&
            (queued > 0)) {
            sum += (uint64_t)queued;
        }
    }
    return sum;
}
