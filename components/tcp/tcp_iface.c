/*
 * The tcp interface: one epoll set over its endpoints' sockets, the queues progress() works
 * through (deferred failures, endpoints with buffered input, completions, tensor releases),
 * and the event fd the framework sleeps on. epoll is level-triggered: an endpoint is watched
 * for input unless it paused, and for output only while it has something queued.
 */
#include "tcp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#define EPOLL_BATCH   64
#define FLUSH_TICK_NS 1000000     /* 1 ms */
#define BUSY_POLL_EPOLL 64        /* busy poll: progress() calls between two epoll_waits */
#define BUSY_POLL_COLD  256       /* busy poll: quiet looks before an ep is left to epoll */
#define BUSY_POLL_GAP_NS 100000   /* busy poll: epoll at least this often, however long a
                                   * progress() call takes (a peer's large transfer) */
#define IDLE_EPOLL      64        /* the same, with no endpoint */
#define TX_MP_ALIGN   64          /* send buffers: a cache line */
#define TX_MP_CHUNK   4           /* buffers per allocation of the pool */
#define TX_MP_MAX     128         /* at most 8 MiB kept per iface; beyond, malloc */

/* The pool is guarded by the context's lock, like everything of the iface. */
static ucs_mpool_ops_t tx_mp_ops = {
    .chunk_alloc   = ucs_mpool_chunk_malloc,
    .chunk_release = ucs_mpool_chunk_free,
};

/* "eth0=10.0.0.2,lo=127.0.0.1": informational, so a peer's logs can say where we are. */
static void address_build(xfer_iface_h iface)
{
    struct ifaddrs *ifa_list, *ifa;
    size_t off = 0;

    iface->address_len = 0;
    if (getifaddrs(&ifa_list) != 0) {
        return;
    }
    for (ifa = ifa_list; ifa != NULL; ifa = ifa->ifa_next) {
        char addr[INET6_ADDRSTRLEN];
        int n;

        if (!xfer_tcp_ifaddr_text(iface->cfg, ifa, addr, sizeof(addr))) {
            continue;
        }
        n = snprintf(iface->address + off, sizeof(iface->address) - off, "%s%s=%s",
                     off ? "," : "", ifa->ifa_name, addr);
        if ((n < 0) || ((size_t)n >= sizeof(iface->address) - off)) {
            iface->address[off] = '\0';     /* drop what does not fit whole */
            break;
        }
        off += (size_t)n;
    }
    freeifaddrs(ifa_list);
    iface->address_len = off;
}

/* The iface's timer: acknowledgements from the peer's host raise no event, so while flushes
 * wait for them (or lanes for a retry) progress() looks again every FLUSH_TICK_NS. */
void xfer_tcp_iface_timer_update(xfer_iface_h iface)
{
    (void)xfer_iface_base_timer(&iface->base, (!ucs_list_is_empty(&iface->flushing) ||
                                               !ucs_list_is_empty(&iface->lane_retry)) ?
                                              FLUSH_TICK_NS : 0);
}

void xfer_tcp_iface_flushing_add(xfer_iface_h iface, xfer_ep_h ep)
{
    if (!ep->in_flushing) {
        ep->in_flushing = 1;
        ucs_list_add_tail(&iface->flushing, &ep->flushing_link);
        (void)xfer_iface_base_timer(&iface->base, FLUSH_TICK_NS);
    }
}

/* Complete the flushes whose conditions hold; stop looking at eps that have none left. */
static unsigned flushing_progress(xfer_iface_h iface)
{
    unsigned count = 0;
    xfer_ep_h ep, tmp;

    ucs_list_for_each_safe(ep, tmp, &iface->flushing, flushing_link) {
        count += xfer_tcp_ep_flushes_check(ep);
        if (ucs_list_is_empty(&ep->flushes.waiting)) {
            ucs_list_del(&ep->flushing_link);
            ep->in_flushing = 0;
        }
    }
    if (ucs_list_is_empty(&iface->flushing)) {
        xfer_tcp_iface_timer_update(iface);
    }
    return count;
}

/* XFER_TCP_TLS=y: refuse to open, saying why, where the data could not be sealed. */
static xfer_status_t tls_check(xfer_iface_h iface)
{
    char why[XFER_REASON_MAX];
    xfer_status_t status;

    if (!iface->params.authenticated) {
        xfer_log(XFER_LOG_ERROR, XFER_TCP_SUBSYS, "XFER_TCP_TLS=y takes its keys from the "
                 "authenticated bootstrap, and this context has no key: set "
                 "XFER_AUTH_KEY_FILE (or xfer_context_params_t.auth_key) on both sides");
        return XFER_ERR_INVALID_PARAM;
    }
    status = xfer_tcp_tls_probe(why, sizeof(why));
    if (status != XFER_OK) {
        xfer_log(XFER_LOG_ERROR, XFER_TCP_SUBSYS, "XFER_TCP_TLS=y: %s", why);
    }
    return status;
}

static const xfer_iface_base_desc_t base_desc = {
    .subsys       = XFER_TCP_SUBSYS,
    .fail_ops     = &xfer_tcp_ep_fail_ops,
    .op_size      = sizeof(xfer_tcp_op_t),
    .op_pool_name = "xfer_tcp_ops",
    .answer_size  = sizeof(xfer_tcp_answer_t),
    .answer       = xfer_tcp_tensor_answer,
    .regions      = 1,
    .timer        = 1,
};

xfer_status_t xfer_tcp_iface_open(const void *config, const xfer_iface_params_t *params,
                                  xfer_iface_h *iface_p)
{
    xfer_iface_h iface;
    xfer_status_t status;

    status = XFER_IFACE_ALLOC(config, params, iface_p, iface);
    if (status != XFER_OK) {
        return status;
    }
    if (iface->cfg->tls) {
        status = tls_check(iface);
        if (status != XFER_OK) {
            goto err_free;
        }
    }
    iface->limits.max_msg_size = iface->cfg->max_msg_size;
    iface->limits.max_key_len  = params->max_key_len;
    ucs_list_head_init(&iface->eps);
    ucs_list_head_init(&iface->batches);
    ucs_list_head_init(&iface->rx_ready);
    ucs_list_head_init(&iface->lane_retry);
    ucs_list_head_init(&iface->hot);
    ucs_list_head_init(&iface->tx_ready);
    ucs_list_head_init(&iface->flushing);
    xfer_tcp_cuda_init(iface);
    status = xfer_iface_base_open(&iface->base, &base_desc, params);
    if (status != XFER_OK) {
        goto err_free;
    }
    if (ucs_mpool_init(&iface->tx_mp, 0, sizeof(xfer_tcp_tx_t) + XFER_TCP_TX_BUF_LEN, 0,
                       TX_MP_ALIGN, TX_MP_CHUNK, TX_MP_MAX, &tx_mp_ops, "xfer_tcp_tx_bufs") !=
        UCS_OK) {
        status = XFER_ERR_NO_MEMORY;
        goto err_close_base;
    }
    iface->tx_mp_ready = 1;
    address_build(iface);
    xfer_tcp_lanes_iface_open(iface);
    xfer_log_at(XFER_LOG_DEBUG, XFER_TCP_SUBSYS, "iface opened: epoll fd %d, address '%.*s'",
                iface->base.epfd, (int)iface->address_len, iface->address);
    *iface_p = iface;
    return XFER_OK;

err_close_base:
    xfer_iface_base_close(&iface->base);
err_free:
    free(iface);
    return status;
}

void xfer_tcp_iface_close(xfer_iface_h iface)
{
    if (iface == NULL) {
        return;
    }
    while (!ucs_list_is_empty(&iface->eps)) {
        xfer_tcp_ep_destroy(ucs_list_head(&iface->eps, struct xfer_ep, list));
    }
    xfer_tcp_lanes_iface_close(iface);
    xfer_tcp_cuda_cleanup(iface);
    if (iface->tx_mp_ready) {
        ucs_mpool_cleanup(&iface->tx_mp, 1);    /* every ep is gone: every buffer is back */
    }
    xfer_iface_base_close(&iface->base);
    free(iface);
}

xfer_status_t xfer_tcp_iface_address(xfer_iface_h iface, void *buf, size_t *len_p)
{
    if (!xfer_out_room(buf, len_p, iface->address_len)) {
        return XFER_ERR_NO_RESOURCE;
    }
    if (iface->address_len > 0) {
        memcpy(buf, iface->address, iface->address_len);
    }
    return XFER_OK;
}

xfer_tcp_op_t *xfer_tcp_op_new(xfer_iface_h iface, xfer_ep_h ep, xfer_tcp_op_kind_t kind,
                               xfer_comp_t *comp)
{
    xfer_tcp_op_t *op = xfer_op_get(iface->base.ops, sizeof(xfer_tcp_op_t), 0, comp, ep);

    if (op != NULL) {
        op->kind  = kind;
        op->iface = iface;
        op->ep    = ep;
    }
    return op;
}

void xfer_tcp_op_complete(xfer_tcp_op_t *op, xfer_status_t status, size_t length, uint64_t tag)
{
    if ((op->serial != 0) && (op->ep != NULL)) {
        xfer_flushes_answered(&op->ep->flushes, op->serial);    /* flushes wait for it */
    }
    xfer_op_complete(op->iface->base.ops, op, status, length, tag);
}

void xfer_tcp_iface_rx_kick(xfer_iface_h iface, xfer_ep_h ep)
{
    if (!ep->in_ready) {
        ep->in_ready = 1;
        ucs_list_add_tail(&iface->rx_ready, &ep->ready_link);
    }
}

/* A send queue that a posting call left behind with its socket not full (the call wrote its
 * budget): the next progress() writes on, without asking epoll whether the socket has room
 * (two epoll_ctl calls and a wake-up for every batch larger than its posting budget). */
void xfer_tcp_iface_tx_kick(xfer_iface_h iface, xfer_ep_h ep)
{
    if (!ep->in_tx_ready) {
        ep->in_tx_ready = 1;
        ucs_list_add_tail(&iface->tx_ready, &ep->tx_ready_link);
    }
}

void xfer_tcp_ep_hot(xfer_ep_h ep)
{
    ep->cold_looks = 0;
    if (!ep->hot && ep->iface->cfg->busy_poll) {
        ep->hot = 1;
        ucs_list_add_tail(&ep->iface->hot, &ep->hot_link);
    }
}

/* XFER_TCP_BUSY_POLL: every hot endpoint (one epoll reported, or that had work within its
 * last BUSY_POLL_COLD looks) reads (and writes what is queued) as if
 * epoll had reported it ready; a read that finds nothing costs one system call, where
 * epoll_wait and then the read would cost two for a message. */
static unsigned busy_poll(xfer_iface_h iface)
{
    unsigned count = 0;
    xfer_ep_h ep, tmp;

    ucs_list_for_each_safe(ep, tmp, &iface->hot, hot_link) {
        uint32_t events = 0;
        unsigned before = count;

        if (ep->fail.state != XFER_EP_CONNECTED) {
            ucs_list_del(&ep->hot_link);
            ep->hot = 0;
            continue;
        }
        if ((ep->rx.state != XFER_TCP_RX_PAUSED) && !ep->rx_blocked) {
            events |= EPOLLIN;
        } else {
            /* input that is not read cannot show the peer's end: ask the socket, as epoll
             * would have told */
            struct pollfd pfd = {ep->fd, POLLRDHUP, 0};

            if ((poll(&pfd, 1, 0) == 1) && (pfd.revents & (POLLRDHUP | POLLERR | POLLHUP))) {
                events |= ((pfd.revents & POLLRDHUP) ? EPOLLRDHUP : 0) |
                          ((pfd.revents & POLLERR) ? EPOLLERR : 0) |
                          ((pfd.revents & POLLHUP) ? EPOLLHUP : 0);
            }
        }
        if (!ucs_list_is_empty(&ep->txq)) {
            events |= EPOLLOUT;
        }
        if (events != 0) {
            unsigned n = xfer_tcp_ep_handle_events(ep, events);

            count += (n > 0) ? n - 1 : 0;   /* the frames handled, not the look itself */
        }
        if (ep->nlanes > 1) {
            count += xfer_tcp_lanes_busy_poll(ep);
        }
        /* quiet for BUSY_POLL_COLD looks: epoll (every BUSY_POLL_EPOLL calls) watches it,
         * so that a thousand idle endpoints cost a busy poller nothing */
        if ((count > before) || !ucs_list_is_empty(&ep->txq) ||
            (ep->rx.state != XFER_TCP_RX_HDR) || (ep->rlen > ep->roff)) {
            ep->cold_looks = 0;
        } else if (++ep->cold_looks >= BUSY_POLL_COLD) {
            ucs_list_del(&ep->hot_link);
            ep->hot = 0;
        }
    }
    return count;
}

unsigned xfer_tcp_iface_progress(xfer_iface_h iface)
{
    struct epoll_event events[EPOLL_BATCH];
    unsigned count = 0;
    unsigned long n;
    int num;

    iface->rx_gen++;
    count += xfer_ep_failq_progress(&iface->base.failq);
    count += xfer_tcp_cuda_progress(iface);

    while (!ucs_list_is_empty(&iface->tx_ready)) {
        xfer_ep_h ep = ucs_list_extract_head(&iface->tx_ready, struct xfer_ep, tx_ready_link);

        ep->in_tx_ready = 0;
        xfer_tcp_ep_tx_write(ep);   /* arms EPOLLOUT if the socket fills */
        count++;
    }

    /* only the endpoints queued now: one that runs out of budget again waits its turn */
    for (n = ucs_list_length(&iface->rx_ready); (n > 0) && !ucs_list_is_empty(&iface->rx_ready);
         n--) {
        xfer_ep_h ep = ucs_list_extract_head(&iface->rx_ready, struct xfer_ep, ready_link);

        ep->in_ready = 0;
        count += xfer_tcp_ep_rx_progress(ep);
    }

    if (iface->cfg->busy_poll) {
        int64_t now;

        count += busy_poll(iface);
        num    = 0;
        now    = (int64_t)xfer_now_ns();
        if ((++iface->busy_polls >= BUSY_POLL_EPOLL) ||
            (now - iface->epoll_at_ns >= BUSY_POLL_GAP_NS) ||
            (ucs_list_is_empty(&iface->hot) && !ucs_list_is_empty(&iface->eps))) {
            /* now and then what only epoll tells: the lane port, a lane's end, input of the
             * endpoints not hot - at every call when none is, which costs what one direct
             * read would; every 100 us at least, so that an endpoint gone cold is not kept
             * waiting behind another's long slices */
            iface->busy_polls  = 0;
            iface->epoll_at_ns = now;
            num = epoll_wait(iface->base.epfd, events, EPOLL_BATCH, 0);
        }
    } else if (ucs_list_is_empty(&iface->eps) && (++iface->busy_polls < IDLE_EPOLL)) {
        /* no endpoint: nothing in the set is urgent, and a context whose peers are all on
         * another transport (shm) should not pay a system call in every progress() */
        num = 0;
    } else {
        iface->busy_polls = 0;
        num = epoll_wait(iface->base.epfd, events, EPOLL_BATCH, 0);
        if ((num < 0) && (errno != EINTR)) {
            xfer_log(XFER_LOG_ERROR, XFER_TCP_SUBSYS, "epoll_wait: %s", strerror(errno));
        }
    }
    for (int i = 0; i < num; i++) {
        if (events[i].data.ptr == &iface->base.timerfd) {
            uint64_t ticks;

            (void)!read(iface->base.timerfd, &ticks, sizeof(ticks));
            if (!ucs_list_is_empty(&iface->lane_retry)) {
                count += xfer_tcp_lanes_retry(iface);
            }
            continue;
        }
        if ((events[i].data.u64 & XFER_TCP_EV_MASK) == XFER_TCP_EV_LPORT) {
            count += xfer_tcp_lanes_accept(iface, (xfer_tcp_lane_port_t*)(uintptr_t)
                                           (events[i].data.u64 & ~(uint64_t)XFER_TCP_EV_MASK));
            continue;
        }
        if (events[i].data.u64 & XFER_TCP_EV_MASK) {
            count += xfer_tcp_lanes_handle_event(iface, events[i].data.ptr, events[i].events);
            continue;
        }
        if (iface->cfg->busy_poll) {
            xfer_tcp_ep_hot(events[i].data.ptr);
        }
        count += xfer_tcp_ep_handle_events(events[i].data.ptr, events[i].events);
    }
    if (!ucs_list_is_empty(&iface->flushing)) {
        count += flushing_progress(iface);
    }

    return count + xfer_iface_deliver(&iface->base, &iface->params, 0);
}

int xfer_tcp_iface_event_fd(xfer_iface_h iface)
{
    return iface ? iface->base.epfd : -1;
}

xfer_status_t xfer_tcp_iface_event_arm(xfer_iface_h iface)
{
    if (xfer_op_queued(iface->base.ops) || xfer_tanswers_pending(iface->base.tanswers) ||
        !ucs_list_is_empty(&iface->rx_ready) || !ucs_list_is_empty(&iface->tx_ready) ||
        xfer_ep_failq_busy(&iface->base.failq) || xfer_tcp_cuda_busy(iface) ||
        (iface->cfg->busy_poll && !ucs_list_is_empty(&iface->eps))) {
        return XFER_ERR_BUSY;
    }
    return XFER_OK;
}
