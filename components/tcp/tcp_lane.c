/*
 * Lanes: extra TCP connections of an endpoint, over which the data of large frames is cut in
 * shares, so that several sockets (and, where the kernel spreads their work, several cores)
 * move one message - what NCCL's socket transport does with its several sockets per peer and
 * UCX with multi-rail rendezvous.
 *
 * Frames stay on lane 0 (the bootstrap's socket), so tag order and every protocol rule are
 * those of one connection. A TAG, PUT_REQ, PUT or TENSOR_RESP from XFER_TCP_LANE_MIN_SIZE on
 * has STRIPED set: its data is cut by xfer_tcp_wire_stripe(), share 0 following the frame on
 * lane 0, share i being the next bytes of lane i. A lane carries nothing but shares, in the
 * order of their frames on lane 0, so the receiver knows where each byte goes from the frame
 * alone: while lane 0 is in a striped frame's payload every lane reads its share straight
 * into the destination, and the frame is done once every share is in.
 *
 * Setting up: the server's iface listens on a port of its own (any address, opened with its
 * first server-side endpoint) and puts it, the number of lanes it takes and a random token
 * per endpoint in the endpoint address. The client connects lanes 1..n-1 to the address lane
 * 0 reached, sends a LANE_HELLO on each (lane number and token), and may stripe at once over
 * those that connected (each frame says over how many lanes, so a lane that could not
 * connect costs speed, not the connection); the server attaches a connection to the
 * endpoint whose token, lane and peer host match, and closes any other. Until a lane is
 * attached, what it should carry waits. Any lane's failure fails the endpoint.
 *
 * This file: an endpoint's lanes (set up - the client's connects, waited for up to
 * XFER_TCP_LANE_WAIT, then from progress, retried when they fail - and close), the lanes'
 * epoll events; tcp_lane_port.c the server's lane port and the hellos; tcp_stripe.c moves
 * the shares.
 */
#include "tcp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* A lane whose connect fails is tried again this many times, after 10 ms, 20 ms, 40 ms ... */
#define LANE_TRIES      6
#define LANE_RETRY_MS   10

/* ---- an endpoint's lanes -------------------------------------------------------------------- */

xfer_status_t xfer_tcp_lanes_ep_init(xfer_ep_h ep)
{
    xfer_iface_h iface = ep->iface;

    ucs_list_head_init(&ep->tx_wait);
    ep->nlanes    = 1;
    ep->lanes_max = iface->lanes;
    if (ep->is_server && (iface->lanes > 1)) {
        ep->lport = xfer_tcp_lane_port_get(ep);
        if (ep->lport == NULL) {
            ep->lanes_max = 1;
        }
    }
    ep->token     = xfer_random64();
    if (ep->lanes_max < 2) {
        return XFER_OK;
    }
    ep->lanes = calloc(ep->lanes_max, sizeof(*ep->lanes));
    if (ep->lanes == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    for (unsigned i = 1; i < ep->lanes_max; i++) {
        ep->lanes[i].ep  = ep;
        ep->lanes[i].idx = i;
        ep->lanes[i].fd  = -1;
        ucs_list_head_init(&ep->lanes[i].txq);
    }
    return XFER_OK;
}

void xfer_tcp_lanes_ep_addr(xfer_ep_h ep, xfer_tcp_wire_ep_addr_t *addr)
{
    addr->lanes     = (uint8_t)ep->lanes_max;
    addr->lane_port = ((ep->lanes_max > 1) && (ep->lport != NULL)) ? ep->lport->port : 0;
    addr->token     = ep->token;
}

void xfer_tcp_lane_update_events(xfer_tcp_lane_t *lane)
{
    struct epoll_event ev = {0};
    uint32_t events = 0;

    if ((lane->fd < 0) || lane->connecting) {
        return;     /* a connecting lane waits for EPOLLOUT alone (lane_connect_events) */
    }
    if (lane->rx_active) {
        events |= EPOLLIN;
    }
    if (!lane->peer_closed) {
        events |= EPOLLRDHUP;
    }
    if (!ucs_list_is_empty(&lane->txq)) {
        events |= EPOLLOUT;
    }
    if (events == lane->events) {
        return;
    }
    ev.events = events;
    ev.data.u64 = (uintptr_t)lane | XFER_TCP_EV_LANE;
    if (epoll_ctl(lane->ep->iface->base.epfd, EPOLL_CTL_MOD, lane->fd, &ev) != 0) {
        xfer_tcp_ep_fail_later(lane->ep, XFER_ERR_NO_RESOURCE, "lane %u: epoll_ctl: %s",
                               lane->idx, strerror(errno));
        return;
    }
    lane->events = events;
}

xfer_status_t xfer_tcp_lane_attach(xfer_tcp_lane_t *lane, int fd, int added)
{
    xfer_iface_h iface = lane->ep->iface;
    struct epoll_event ev = {.events = 0, .data.u64 = (uintptr_t)lane | XFER_TCP_EV_LANE};

    /* the hello was the lane's last byte in the clear */
    if (lane->ep->iface->cfg->tls) {
        char why[XFER_REASON_MAX];
        xfer_status_t status = xfer_tcp_tls_lane(lane->ep, lane->idx, fd, why, sizeof(why));

        if (status != XFER_OK) {
            xfer_log(XFER_LOG_WARN, XFER_TCP_SUBSYS, "lane %u: %s", lane->idx, why);
            return status;
        }
    }
    xfer_tcp_sock_tune(iface, fd);
    if (epoll_ctl(iface->base.epfd, added ? EPOLL_CTL_MOD : EPOLL_CTL_ADD, fd, &ev) != 0) {
        return XFER_ERR_NO_RESOURCE;
    }
    lane->fd     = fd;
    lane->events = 0;
    xfer_tcp_lane_update_events(lane);
    return XFER_OK;
}

/* Where lane 0's peer is, with port instead of its own; 0 when it is no IP socket. */
static int lane_peer(int fd, uint16_t port, struct sockaddr_storage *ss, socklen_t *len_p)
{
    *len_p = sizeof(*ss);
    if (getpeername(fd, (struct sockaddr*)ss, len_p) != 0) {
        return 0;
    }
    if (ss->ss_family == AF_INET) {
        ((struct sockaddr_in*)ss)->sin_port = htons(port);
        return 1;
    }
    if (ss->ss_family == AF_INET6) {
        ((struct sockaddr_in6*)ss)->sin6_port = htons(port);
        return 1;
    }
    return 0;
}

/* Start lane's connect (non-blocking): 0, or the errno that refused it at once. */
static int lane_start(xfer_ep_h ep, xfer_tcp_lane_t *lane)
{
    int fd = socket(ep->lane_addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

    if (fd < 0) {
        return errno;
    }
    if ((connect(fd, (const struct sockaddr*)&ep->lane_addr, ep->lane_addr_len) != 0) &&
        (errno != EINPROGRESS)) {
        int err = errno;

        close(fd);
        return err;
    }
    lane->fd         = fd;
    lane->connecting = 1;
    lane->tries++;
    return 0;
}

/* lane's connect is done: its hello goes, and it carries shares from now on. 0, or why not. */
static int lane_established(xfer_tcp_lane_t *lane, int added)
{
    xfer_tcp_wire_lane_hello_t hello = {(uint8_t)lane->idx, lane->ep->peer_token,
                                        lane->ep->has_secret};
    uint8_t buf[XFER_TCP_WIRE_LANE_HELLO_MAX];
    size_t len     = XFER_TCP_WIRE_LANE_HELLO_LEN;
    socklen_t elen = sizeof(int);
    int err        = 0;

    if ((getsockopt(lane->fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0) || (err != 0)) {
        return err ? err : errno;
    }
    xfer_tcp_wire_pack_lane_hello(&hello, buf);
    if (hello.proven) {
        if (!xfer_ep_secret_tag(lane->ep->secret, buf, len, buf + len)) {
            return ENOMEM;
        }
        len += XFER_TCP_WIRE_LANE_PROOF_LEN;
    }
    /* at most 48 bytes on a new connection: the socket takes them at once */
    if (send(lane->fd, buf, len, MSG_NOSIGNAL) != (ssize_t)len) {
        return errno ? errno : EIO;
    }
    lane->connecting = 0;
    if (xfer_tcp_lane_attach(lane, lane->fd, added) != XFER_OK) {
        lane->connecting = 1;   /* lane_failed() closes it */
        return errno ? errno : EPROTO;
    }
    return 0;
}

/* lane's connect failed (err): closed, and tried again later - or, after LANE_TRIES, given up:
 * the endpoint goes on with the lanes it has (frames say how many carry them). */
static void lane_failed(xfer_tcp_lane_t *lane, int err)
{
    xfer_ep_h ep       = lane->ep;
    xfer_iface_h iface = ep->iface;

    if (lane->fd >= 0) {
        epoll_ctl(iface->base.epfd, EPOLL_CTL_DEL, lane->fd, NULL);
        close(lane->fd);
        lane->fd = -1;
    }
    lane->connecting = 0;
    if (lane->tries >= LANE_TRIES) {
        xfer_log(XFER_LOG_WARN, XFER_TCP_SUBSYS, "lane %u of %u to the server's lane port: %s "
                 "(%u tries); the endpoint goes on without it (XFER_TCP_LANES=1 does not "
                 "try)", lane->idx, ep->nlanes, strerror(err), lane->tries);
        lane->peer_closed = 1;
        return;
    }
    xfer_log_at(XFER_LOG_DEBUG, XFER_TCP_SUBSYS, "lane %u: %s; tried again in %d ms",
                lane->idx, strerror(err), LANE_RETRY_MS << (lane->tries - 1));
    lane->retry_at = xfer_now_ms() + (LANE_RETRY_MS << (lane->tries - 1));
    lane->in_retry = 1;
    ucs_list_add_tail(&iface->lane_retry, &lane->retry_link);
    xfer_tcp_iface_timer_update(iface);
}

/* A connecting lane's socket said something: connected, or failed. */
static unsigned lane_connect_events(xfer_tcp_lane_t *lane, uint32_t events)
{
    int err;

    if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
        return 0;
    }
    err = lane_established(lane, 1);
    if (err != 0) {
        lane_failed(lane, err);
    } else {
        xfer_log_at(XFER_LOG_DEBUG, XFER_TCP_SUBSYS, "ep %p: lane %u connected from progress",
                    (void*)lane->ep, lane->idx);
        xfer_tcp_lane_write(lane);
    }
    return 1;
}

/* Watch a connecting lane for the end of its connect. */
static int lane_watch_connect(xfer_tcp_lane_t *lane)
{
    struct epoll_event ev = {.events = EPOLLOUT,
                             .data.u64 = (uintptr_t)lane | XFER_TCP_EV_LANE};

    return (epoll_ctl(lane->ep->iface->base.epfd, EPOLL_CTL_ADD, lane->fd, &ev) == 0) ? 0 :
                                                                                    errno;
}

unsigned xfer_tcp_lanes_retry(xfer_iface_h iface)
{
    int64_t now    = xfer_now_ms();
    unsigned count = 0;
    xfer_tcp_lane_t *lane, *tmp;

    ucs_list_for_each_safe(lane, tmp, &iface->lane_retry, retry_link) {
        int err;

        if (lane->retry_at > now) {
            continue;
        }
        ucs_list_del(&lane->retry_link);
        lane->in_retry = 0;
        count++;
        err = lane_start(lane->ep, lane);
        if (err == 0) {
            err = lane_watch_connect(lane);
        }
        if (err != 0) {
            lane_failed(lane, err);
        }
    }
    xfer_tcp_iface_timer_update(iface);
    return count;
}

unsigned xfer_tcp_lanes_up(xfer_ep_h ep)
{
    unsigned n = 1;

    for (unsigned i = 1; (ep->lanes != NULL) && (i < ep->nlanes); i++) {
        n += (ep->lanes[i].fd >= 0) && !ep->lanes[i].connecting && !ep->lanes[i].peer_closed;
    }
    return n;
}

/* The client's lanes: every connect started at once and waited for together, up to
 * XFER_TCP_LANE_WAIT; the slow ones go on from progress (and stripe from when they are up),
 * the failed ones are tried again. */
static void lanes_connect(xfer_ep_h ep, unsigned n)
{
    struct pollfd pfd[XFER_TCP_WIRE_LANES_MAX];
    int64_t until = xfer_now_ms() + (int64_t)(ep->iface->cfg->lane_wait * 1000.0);
    unsigned waiting;

    for (unsigned i = 1; i < n; i++) {
        int err = lane_start(ep, &ep->lanes[i]);

        if (err != 0) {
            lane_failed(&ep->lanes[i], err);
        }
    }
    for (;;) {
        int64_t left = until - xfer_now_ms();

        waiting = 0;
        for (unsigned i = 1; i < n; i++) {
            if (ep->lanes[i].connecting) {
                pfd[waiting].fd      = ep->lanes[i].fd;
                pfd[waiting].events  = POLLOUT;
                pfd[waiting].revents = 0;
                waiting++;
            }
        }
        if ((waiting == 0) || (left <= 0) || (poll(pfd, waiting, (int)left) <= 0)) {
            break;
        }
        for (unsigned i = 1, k = 0; i < n; i++) {
            xfer_tcp_lane_t *lane = &ep->lanes[i];
            int err;

            if (!lane->connecting) {
                continue;
            }
            if (pfd[k++].revents == 0) {
                continue;
            }
            err = lane_established(lane, 0);
            if (err != 0) {
                lane_failed(lane, err);
            }
        }
    }
    for (unsigned i = 1; i < n; i++) {
        xfer_tcp_lane_t *lane = &ep->lanes[i];

        if (lane->connecting) {
            int err = lane_watch_connect(lane);

            if (err != 0) {
                lane_failed(lane, err);
            }
        }
    }
}

xfer_status_t xfer_tcp_lanes_ep_connect(xfer_ep_h ep, const xfer_tcp_wire_ep_addr_t *peer)
{
    unsigned n = (peer->lanes < ep->lanes_max) ? peer->lanes : ep->lanes_max;

    /* both sides see the same kind of socket, so both come to the same count */
    if ((n < 2) || (!ep->is_server && (peer->lane_port == 0)) ||
        !lane_peer(ep->fd, peer->lane_port, &ep->lane_addr, &ep->lane_addr_len)) {
        ep->nlanes = 1;
        return XFER_OK;
    }
    ep->nlanes = n;
    if (ep->is_server) {
        unsigned attached = 0;

        /* the client's lanes come to the lane port - some may have come already: the client
         * connects them as soon as its own connect returns, which can be before this side
         * handles its CONNECT */
        for (unsigned i = 1; i < n; i++) {
            attached += (ep->lanes[i].fd >= 0);
        }
        xfer_tcp_lanes_awaited(ep, n - 1 - attached);
        return XFER_OK;
    }
    ep->peer_token = peer->token;
    lanes_connect(ep, n);
    xfer_log_at(XFER_LOG_DEBUG, XFER_TCP_SUBSYS, "ep %p: %u of %u lanes connected", (void*)ep,
                xfer_tcp_lanes_up(ep), n);
    return XFER_OK;
}

void xfer_tcp_lanes_ep_close(xfer_ep_h ep, int abort_unacked)
{
    xfer_tcp_lanes_awaited(ep, 0);
    for (unsigned i = 1; (ep->lanes != NULL) && (i < ep->lanes_max); i++) {
        xfer_tcp_lane_t *lane = &ep->lanes[i];

        if (lane->in_retry) {
            ucs_list_del(&lane->retry_link);
            lane->in_retry = 0;
        }
        lane->connecting = 0;
        if (lane->fd >= 0) {
            if (abort_unacked &&
                (xfer_tcp_sock_acked(lane->fd, lane->tx_written) < lane->tx_queued)) {
                struct linger abort_now = {.l_onoff = 1, .l_linger = 0};

                (void)setsockopt(lane->fd, SOL_SOCKET, SO_LINGER, &abort_now,
                                 sizeof(abort_now));
            }
            epoll_ctl(ep->iface->base.epfd, EPOLL_CTL_DEL, lane->fd, NULL);
            close(lane->fd);
            lane->fd = -1;
        }
        lane->peer_closed = 1;
        lane->rx_active   = 0;
        /* the frames these shares belong to are dropped with lane 0's queue */
        while (!ucs_list_is_empty(&lane->txq)) {
            free(ucs_list_extract_head(&lane->txq, xfer_tcp_seg_t, list));
        }
    }
}

/* ---- events --------------------------------------------------------------------------------- */

static unsigned lane_events(xfer_tcp_lane_t *lane, uint32_t events)
{
    xfer_ep_h ep = lane->ep;

    if ((ep->fail.state != XFER_EP_CONNECTED) && (ep->fail.state != XFER_EP_CREATED)) {
        return 0;
    }
    if (lane->connecting) {
        return lane_connect_events(lane, events);
    }
    if (events & (EPOLLERR | EPOLLHUP)) {
        int err = 0;
        socklen_t len = sizeof(err);

        getsockopt(lane->fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if ((ep->fail.state == XFER_EP_CREATED) ||
            (!lane->rx_active && ucs_list_is_empty(&lane->txq))) {
            /* not connected yet, or owing and owed nothing: only the lane goes. Lane 0 says
             * whether the peer left in order (a BYE) or not; a frame that needs this lane
             * fails its endpoint when it comes */
            epoll_ctl(ep->iface->base.epfd, EPOLL_CTL_DEL, lane->fd, NULL);
            close(lane->fd);
            lane->fd          = -1;
            lane->peer_closed = 1;
            return 1;
        }
        xfer_tcp_ep_fail(ep, XFER_ERR_CONNECTION, "lane %u lost%s%s", lane->idx,
                         err ? ": " : "", err ? strerror(err) : "");
        return 1;
    }
    if (events & EPOLLOUT) {
        xfer_tcp_lane_write(lane);
    }
    if ((events & EPOLLRDHUP) && !lane->rx_active && !lane->peer_closed) {
        /* the peer closes: lane 0 tells whether that was between frames; a share this lane
         * still owes fails its frame when it is read */
        lane->peer_closed = 1;
        xfer_tcp_lane_update_events(lane);
    }
    if ((events & (EPOLLIN | EPOLLRDHUP)) && lane->rx_active && (ep->fail.state ==
                                                                 XFER_EP_CONNECTED)) {
        lane->drained = 0;
        if (lane->rx_gen != ep->iface->rx_gen) {
            lane->rx_gen   = ep->iface->rx_gen;
            lane->rx_round = 0;     /* its first event in this progress(): a new slice */
        }
        if ((xfer_tcp_lane_rx(lane) == 1) && (ep->rx.state == XFER_TCP_RX_DATA)) {
            return xfer_tcp_ep_rx_progress(ep) + 1;     /* the frame may be complete */
        }
    }
    return 1;
}

unsigned xfer_tcp_lanes_handle_event(xfer_iface_h iface, void *tagged, uint32_t events)
{
    uintptr_t p = (uintptr_t)tagged, ptr = p & ~(uintptr_t)XFER_TCP_EV_MASK;
    unsigned count;

    if ((p & XFER_TCP_EV_MASK) == XFER_TCP_EV_LANE) {
        return lane_events((xfer_tcp_lane_t*)ptr, events);
    }
    count = xfer_tcp_lane_port_event(iface, (struct xfer_tcp_accept*)ptr, events);
    xfer_tcp_lanes_trim(iface);     /* a lane attached: the bound on the silent ones fell */
    return count;
}

unsigned xfer_tcp_lanes_busy_poll(xfer_ep_h ep)
{
    unsigned count = 0;

    for (unsigned i = 1; (i < ep->nlanes) && (ep->fail.state == XFER_EP_CONNECTED); i++) {
        xfer_tcp_lane_t *lane = &ep->lanes[i];
        uint32_t events = (lane->rx_active ? EPOLLIN : 0) |
                          (!ucs_list_is_empty(&lane->txq) ? EPOLLOUT : 0);

        if ((events != 0) && (lane->fd >= 0)) {
            unsigned n = lane_events(lane, events);

            count += (n > 0) ? n - 1 : 0;
        }
    }
    return count;
}
