/*
 * tcp endpoints: the connection (a dup of the bootstrap socket), its send queue, its receive
 * state machine, its outstanding requests, and what happens when it fails.
 *
 * Sending: small frames are copied into coalescing buffers at the tail of the queue; large
 * data is queued as a reference to the caller's memory (header + data, written with one
 * sendmsg). flush() writes as much as the socket takes and watches EPOLLOUT only while
 * something is left.
 *
 * Receiving: header -> extension -> payload. Headers and extensions are parsed from a staging
 * buffer; payloads are copied out of it and, once it is empty, read with readv() straight into
 * their destination (a matched receive, a put target, a get or fetch buffer), the staging
 * buffer catching whatever follows. Every header is validated before its length is used.
 *
 * Failing: everything pending on the endpoint completes with the failure status, tensors it
 * held are withdrawn or released, and the framework hears of it through ep_failed. Failures
 * noticed outside progress() (a send error inside a posting call, or inside a tensor's
 * ready()) are only recorded there and handled by the next progress().
 */
#include "tcp.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define SLOT_NONE UINT32_MAX

/* ---- creation and connection ---------------------------------------------------------------- */

xfer_status_t xfer_tcp_ep_create(xfer_iface_h iface, const xfer_ep_params_t *params,
                                 xfer_ep_h *ep_p)
{
    xfer_ep_h ep;
    xfer_status_t status;

    if ((iface == NULL) || (params == NULL) || (ep_p == NULL) ||
        (params->size < offsetof(xfer_ep_params_t, is_server) + sizeof(int))) {
        return XFER_ERR_INVALID_PARAM;
    }
    if (params->sock_fd < 0) {
        xfer_log(XFER_LOG_ERROR, XFER_TCP_SUBSYS, "ep_create: no connected socket given");
        return XFER_ERR_INVALID_PARAM;
    }
    ep = calloc(1, sizeof(*ep));
    if (ep == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    ep->rbuf = malloc(XFER_TCP_RX_BUF_LEN);
    if (ep->rbuf == NULL) {
        status = XFER_ERR_NO_MEMORY;
        goto err_free_ep;
    }
    ep->fd = fcntl(params->sock_fd, F_DUPFD_CLOEXEC, 0);
    if (ep->fd < 0) {
        xfer_log(XFER_LOG_ERROR, XFER_TCP_SUBSYS, "ep_create: dup of socket %d: %s",
                 params->sock_fd, strerror(errno));
        status = XFER_ERR_NO_RESOURCE;
        goto err_free_rbuf;
    }
    ep->iface     = iface;
    ep->fw_ep     = params->fw_ep;
    ep->is_server = params->is_server;
    ep->state     = XFER_TCP_EP_CREATED;
    ep->limits    = iface->limits;
    ep->free_slot = SLOT_NONE;
    ep->rx.state  = XFER_TCP_RX_HDR;
    ucs_list_head_init(&ep->txq);
    ucs_list_head_init(&ep->preqs);
    ucs_list_add_tail(&iface->eps, &ep->list);
    *ep_p = ep;
    return XFER_OK;

err_free_rbuf:
    free(ep->rbuf);
err_free_ep:
    free(ep);
    return status;
}

xfer_status_t xfer_tcp_ep_address(xfer_ep_h ep, void *buf, size_t *len_p)
{
    if ((ep == NULL) || (len_p == NULL)) {
        return XFER_ERR_INVALID_PARAM;
    }
    if ((buf == NULL) || (*len_p < XFER_TCP_WIRE_EP_ADDR_LEN)) {
        *len_p = XFER_TCP_WIRE_EP_ADDR_LEN;
        return XFER_ERR_NO_RESOURCE;
    }
    xfer_tcp_wire_pack_ep_addr(&ep->iface->limits, buf);
    *len_p = XFER_TCP_WIRE_EP_ADDR_LEN;
    return XFER_OK;
}

/* Socket options are best effort: a failure is logged, not fatal (a Unix socket in tests
 * has no TCP options at all). */
static void sockopt(xfer_ep_h ep, int level, int name, int value, const char *what)
{
    if (setsockopt(ep->fd, level, name, &value, sizeof(value)) != 0) {
        xfer_log_at(XFER_LOG_DEBUG, XFER_TCP_SUBSYS, "setsockopt(%s=%d) on fd %d: %s", what,
                    value, ep->fd, strerror(errno));
    }
}

static int seconds(double s)
{
    return (s < 1.0) ? 1 : (s > 32767.0) ? 32767 : (int)(s + 0.5);
}

static void ep_tune(xfer_ep_h ep)
{
    const xfer_tcp_config_t *cfg = ep->iface->cfg;

    sockopt(ep, IPPROTO_TCP, TCP_NODELAY, 1, "TCP_NODELAY");
    if (cfg->sndbuf > 0) {
        sockopt(ep, SOL_SOCKET, SO_SNDBUF, (int)cfg->sndbuf, "SO_SNDBUF");
    }
    if (cfg->rcvbuf > 0) {
        sockopt(ep, SOL_SOCKET, SO_RCVBUF, (int)cfg->rcvbuf, "SO_RCVBUF");
    }
    sockopt(ep, SOL_SOCKET, SO_KEEPALIVE, cfg->keepalive ? 1 : 0, "SO_KEEPALIVE");
    if (cfg->keepalive) {
        sockopt(ep, IPPROTO_TCP, TCP_KEEPIDLE, seconds(cfg->keepidle), "TCP_KEEPIDLE");
        sockopt(ep, IPPROTO_TCP, TCP_KEEPINTVL, seconds(cfg->keepintvl), "TCP_KEEPINTVL");
        sockopt(ep, IPPROTO_TCP, TCP_KEEPCNT, (int)cfg->keepcnt, "TCP_KEEPCNT");
    }
    if (cfg->user_timeout > 0) {
        sockopt(ep, IPPROTO_TCP, TCP_USER_TIMEOUT, (int)(cfg->user_timeout * 1000.0 + 0.5),
                "TCP_USER_TIMEOUT");
    }
}

xfer_status_t xfer_tcp_ep_connect(xfer_ep_h ep, const void *peer_ep_addr, size_t addr_len)
{
    xfer_tcp_wire_limits_t peer = ep->iface->limits;
    struct epoll_event ev = {0};
    int flags;

    if (ep->state != XFER_TCP_EP_CREATED) {
        return XFER_ERR_INVALID_PARAM;
    }
    if (xfer_tcp_wire_unpack_ep_addr(peer_ep_addr, addr_len, &peer) != XFER_OK) {
        xfer_log(XFER_LOG_WARN, XFER_TCP_SUBSYS, "peer endpoint address of %zu bytes is not "
                 "a tcp v%u address", addr_len, XFER_TCP_WIRE_VERSION);
        return XFER_ERR_PROTOCOL;
    }
    if (peer.max_msg_size < ep->limits.max_msg_size) {
        ep->limits.max_msg_size = peer.max_msg_size;
    }
    if (peer.max_key_len < ep->limits.max_key_len) {
        ep->limits.max_key_len = peer.max_key_len;
    }

    flags = fcntl(ep->fd, F_GETFL);
    if ((flags < 0) || (fcntl(ep->fd, F_SETFL, flags | O_NONBLOCK) != 0)) {
        xfer_log(XFER_LOG_ERROR, XFER_TCP_SUBSYS, "fcntl(O_NONBLOCK): %s", strerror(errno));
        return XFER_ERR_IO;
    }
    ep_tune(ep);
    ev.events   = EPOLLIN;
    ev.data.ptr = ep;
    if (epoll_ctl(ep->iface->epfd, EPOLL_CTL_ADD, ep->fd, &ev) != 0) {
        xfer_log(XFER_LOG_ERROR, XFER_TCP_SUBSYS, "epoll_ctl(ADD %d): %s", ep->fd,
                 strerror(errno));
        return XFER_ERR_NO_RESOURCE;
    }
    ep->events = EPOLLIN;
    ep->state  = XFER_TCP_EP_CONNECTED;
    xfer_log_at(XFER_LOG_DEBUG, XFER_TCP_SUBSYS, "ep %p connected on fd %d (%s side, peer "
                "limits: %llu-byte messages, %u-byte keys)", (void*)ep, ep->fd,
                ep->is_server ? "server" : "client",
                (unsigned long long)ep->limits.max_msg_size, ep->limits.max_key_len);
    xfer_tcp_ep_flush(ep);     /* anything posted between create and connect */
    return XFER_OK;
}

xfer_status_t xfer_tcp_ep_check(xfer_ep_h ep)
{
    if (ep == NULL) {
        return XFER_ERR_INVALID_PARAM;
    }
    if ((ep->state == XFER_TCP_EP_FAILING) || (ep->state == XFER_TCP_EP_FAILED)) {
        return ep->fail_status;
    }
    return XFER_OK;
}

/* ---- outstanding-request slots --------------------------------------------------------------- */

xfer_status_t xfer_tcp_slot_alloc(xfer_ep_h ep, xfer_tcp_slot_kind_t kind, xfer_tcp_op_t *op,
                                  uint64_t *id_p)
{
    xfer_tcp_slot_t *slot;
    uint32_t idx;

    if (ep->free_slot == SLOT_NONE) {
        uint32_t num = ep->num_slots ? ep->num_slots * 2 : 16;
        xfer_tcp_slot_t *slots;

        if (ep->num_slots >= (1u << 30)) {
            return XFER_ERR_NO_RESOURCE;
        }
        slots = realloc(ep->slots, num * sizeof(*slots));
        if (slots == NULL) {
            return XFER_ERR_NO_MEMORY;
        }
        for (uint32_t i = ep->num_slots; i < num; i++) {
            slots[i].gen       = 1;
            slots[i].kind      = XFER_TCP_SLOT_FREE;
            slots[i].op        = NULL;
            slots[i].next_free = (i + 1 < num) ? i + 1 : SLOT_NONE;
        }
        ep->free_slot = ep->num_slots;
        ep->slots     = slots;
        ep->num_slots = num;
    }
    idx           = ep->free_slot;
    slot          = &ep->slots[idx];
    ep->free_slot = slot->next_free;
    slot->kind    = kind;
    slot->op      = op;
    ep->busy_slots++;
    if (op != NULL) {
        op->slot = idx;
    }
    *id_p = ((uint64_t)slot->gen << 32) | idx;
    return XFER_OK;
}

xfer_tcp_slot_t *xfer_tcp_slot_find(xfer_ep_h ep, uint64_t id)
{
    uint32_t idx = (uint32_t)id;
    xfer_tcp_slot_t *slot;

    if (idx >= ep->num_slots) {
        return NULL;
    }
    slot = &ep->slots[idx];
    if ((slot->kind == XFER_TCP_SLOT_FREE) || (slot->gen != (uint32_t)(id >> 32))) {
        return NULL;
    }
    return slot;
}

void xfer_tcp_slot_free(xfer_ep_h ep, uint32_t idx)
{
    xfer_tcp_slot_t *slot = &ep->slots[idx];

    slot->kind = XFER_TCP_SLOT_FREE;
    slot->op   = NULL;
    if (++slot->gen == 0) {
        slot->gen = 1;
    }
    slot->next_free = ep->free_slot;
    ep->free_slot   = idx;
    ep->busy_slots--;
}

/* ---- send queue ----------------------------------------------------------------------------- */

static size_t tx_length(const xfer_tcp_tx_t *tx)
{
    return tx->iov[0].iov_len + tx->iov[1].iov_len;
}

uint8_t *xfer_tcp_ep_tx_reserve(xfer_ep_h ep, size_t len)
{
    xfer_tcp_tx_t *tx;
    uint8_t *p;
    size_t cap;

    if (!ucs_list_is_empty(&ep->txq)) {
        tx = ucs_list_tail(&ep->txq, xfer_tcp_tx_t, list);
        if ((tx->kind == XFER_TCP_TX_BUF) && (tx->cap - tx->iov[0].iov_len >= len)) {
            p = (uint8_t*)tx->iov[0].iov_base + tx->iov[0].iov_len;
            tx->iov[0].iov_len += len;
            return p;
        }
    }
    cap = (len > XFER_TCP_TX_BUF_LEN) ? len : XFER_TCP_TX_BUF_LEN;
    tx  = malloc(sizeof(*tx) + cap);
    if (tx == NULL) {
        return NULL;
    }
    memset(tx, 0, sizeof(*tx));
    tx->kind           = XFER_TCP_TX_BUF;
    tx->cap            = cap;
    tx->iov[0].iov_base = tx + 1;
    tx->iov[0].iov_len  = len;
    ucs_list_add_tail(&ep->txq, &tx->list);
    return (uint8_t*)(tx + 1);
}

void xfer_tcp_ep_tx_push(xfer_ep_h ep, xfer_tcp_tx_t *tx)
{
    tx->sent = 0;
    ucs_list_add_tail(&ep->txq, &tx->list);
}

/* A queue entry was written completely. */
static void tx_done(xfer_ep_h ep, xfer_tcp_tx_t *tx)
{
    xfer_tcp_op_t *op;

    switch (tx->kind) {
    case XFER_TCP_TX_OP:
        op = ucs_container_of(tx, xfer_tcp_op_t, tx);
        op->tx_pending = 0;
        if (op->kind == XFER_TCP_OP_SEND) {
            xfer_tcp_op_complete(op, XFER_OK, op->len, 0);
        }
        break;      /* a put completes with its PUT_ACK */
    case XFER_TCP_TX_PREQ:
        /* released by the next progress(): never from inside a tensor's ready() */
        ucs_list_add_tail(&ep->iface->releases,
                          &ucs_container_of(tx, xfer_tcp_preq_t, tx)->list);
        break;
    case XFER_TCP_TX_GET_RESP:
        free(tx->owned);
        free(tx);
        break;
    default:
        free(tx);
        break;
    }
}

/* A queue entry that will never be written (the ep failed or closes). */
static void tx_drop(xfer_ep_h ep, xfer_tcp_tx_t *tx, xfer_status_t status)
{
    xfer_iface_h iface = ep->iface;
    xfer_tcp_preq_t *preq;
    xfer_tcp_op_t *op;

    switch (tx->kind) {
    case XFER_TCP_TX_OP:
        op = ucs_container_of(tx, xfer_tcp_op_t, tx);
        op->tx_pending = 0;
        if (op->kind == XFER_TCP_OP_SEND) {
            xfer_tcp_op_complete(op, status, 0, 0);
        }
        break;      /* a put is completed with the ep's outstanding requests */
    case XFER_TCP_TX_PREQ:
        preq = ucs_container_of(tx, xfer_tcp_preq_t, tx);
        if ((preq->handle != NULL) && (iface->params.tensor_release != NULL)) {
            iface->params.tensor_release(iface->params.fw_arg, preq->handle, status);
        }
        xfer_tcp_preq_free(preq);
        break;
    case XFER_TCP_TX_GET_RESP:
        free(tx->owned);
        free(tx);
        break;
    default:
        free(tx);
        break;
    }
}

static void tx_advance(xfer_ep_h ep, size_t n)
{
    while (n > 0) {
        xfer_tcp_tx_t *tx = ucs_list_head(&ep->txq, xfer_tcp_tx_t, list);
        size_t left       = tx_length(tx) - tx->sent;

        if (n < left) {
            tx->sent += n;
            return;
        }
        n -= left;
        ucs_list_del(&tx->list);
        tx_done(ep, tx);
    }
}

void xfer_tcp_ep_flush(xfer_ep_h ep)
{
    struct iovec iov[XFER_TCP_IOV_MAX];

    if (ep->state != XFER_TCP_EP_CONNECTED) {
        return;
    }
    while (!ucs_list_is_empty(&ep->txq)) {
        struct msghdr msg = {0};
        size_t total      = 0;
        xfer_tcp_tx_t *tx;
        int cnt = 0;
        ssize_t n;

        ucs_list_for_each(tx, &ep->txq, list) {
            size_t skip = tx->sent;

            for (int i = 0; (i < 2) && (cnt < XFER_TCP_IOV_MAX); i++) {
                if (skip >= tx->iov[i].iov_len) {
                    skip -= tx->iov[i].iov_len;
                    continue;
                }
                iov[cnt].iov_base = (uint8_t*)tx->iov[i].iov_base + skip;
                iov[cnt].iov_len  = tx->iov[i].iov_len - skip;
                total            += iov[cnt].iov_len;
                skip              = 0;
                cnt++;
            }
            if (cnt >= XFER_TCP_IOV_MAX) {
                break;
            }
        }
        msg.msg_iov    = iov;
        msg.msg_iovlen = (size_t)cnt;
        n = sendmsg(ep->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            if ((errno == EAGAIN) || (errno == EWOULDBLOCK)) {
                break;
            }
            xfer_tcp_ep_fail_later(ep, XFER_ERR_CONNECTION, "send: %s", strerror(errno));
            return;
        }
        tx_advance(ep, (size_t)n);
        if ((size_t)n < total) {
            break;  /* the socket is full */
        }
    }
    xfer_tcp_ep_update_events(ep);
}

void xfer_tcp_ep_tx_post(xfer_ep_h ep)
{
    if (!(ep->events & EPOLLOUT)) {
        xfer_tcp_ep_flush(ep);
    }
}

void xfer_tcp_ep_update_events(xfer_ep_h ep)
{
    struct epoll_event ev = {0};
    uint32_t events       = 0;

    if (ep->state != XFER_TCP_EP_CONNECTED) {
        return;
    }
    if (ep->rx.state != XFER_TCP_RX_PAUSED) {
        events |= EPOLLIN;
    }
    if (!ucs_list_is_empty(&ep->txq)) {
        events |= EPOLLOUT;
    }
    if (events == ep->events) {
        return;
    }
    ev.events   = events;
    ev.data.ptr = ep;
    if (epoll_ctl(ep->iface->epfd, EPOLL_CTL_MOD, ep->fd, &ev) != 0) {
        xfer_tcp_ep_fail_later(ep, XFER_ERR_NO_RESOURCE, "epoll_ctl: %s", strerror(errno));
        return;
    }
    ep->events = events;
}

/* ---- failure -------------------------------------------------------------------------------- */

static void rx_reset(xfer_ep_h ep)
{
    memset(&ep->rx, 0, sizeof(ep->rx));
    ep->rx.state = XFER_TCP_RX_HDR;
}

/* Whatever the frame being received was doing ends with status. */
static void rx_abort(xfer_ep_h ep, xfer_status_t status)
{
    xfer_tcp_rx_t *rx = &ep->rx;

    if ((rx->op != NULL) && (rx->op->kind == XFER_TCP_OP_RECV)) {
        xfer_tcp_op_complete(rx->op, status, 0, 0);
    }   /* a GET or FETCH op is completed with the outstanding requests */
    if (rx->unexp != NULL) {
        xfer_tcp_unexp_t *ue = rx->unexp;

        if (ue->recv != NULL) {
            xfer_tcp_op_complete(ue->recv, status, 0, 0);
            ue->recv = NULL;
        }
        xfer_tcp_unexp_release(ep->iface, ue);
    }
    free(rx->preq);
    rx_reset(ep);
}

/* Close the connection and end everything pending on ep with status. */
static void ep_teardown(xfer_ep_h ep, xfer_status_t status)
{
    xfer_iface_h iface = ep->iface;
    xfer_tcp_op_t *op, *tmp;

    if (ep->fd >= 0) {
        if (ep->state != XFER_TCP_EP_CREATED) {
            epoll_ctl(iface->epfd, EPOLL_CTL_DEL, ep->fd, NULL);
        }
        close(ep->fd);
        ep->fd = -1;
    }
    ep->state = XFER_TCP_EP_FAILED;
    while (!ucs_list_is_empty(&ep->txq)) {
        tx_drop(ep, ucs_list_extract_head(&ep->txq, xfer_tcp_tx_t, list), status);
    }
    rx_abort(ep, status);
    for (uint32_t i = 0; i < ep->num_slots; i++) {
        if (ep->slots[i].kind == XFER_TCP_SLOT_FREE) {
            continue;
        }
        op = ep->slots[i].op;
        xfer_tcp_slot_free(ep, i);
        if (op != NULL) {
            xfer_tcp_op_complete(op, status, 0, 0);
        }
    }
    ucs_list_for_each_safe(op, tmp, &iface->posted, list) {
        if (op->ep == ep) {
            ucs_list_del(&op->list);
            xfer_tcp_op_complete(op, status, 0, 0);
        }
    }
    xfer_tcp_preq_withdraw_all(ep);
}

static void ep_fail_now(xfer_ep_h ep)
{
    /* a peer that closes between frames just left; everything else is worth a warning */
    xfer_log_at(ep->clean_close ? XFER_LOG_INFO : XFER_LOG_WARN, XFER_TCP_SUBSYS,
                "connection to the %s failed: %s (%s)", ep->is_server ? "client" : "server",
                ep->fail_reason, xfer_status_string(ep->fail_status));
    ep_teardown(ep, ep->fail_status);
    if (!ep->in_notify) {
        ep->in_notify = 1;
        ucs_list_add_tail(&ep->iface->notify, &ep->notify_link);
    }
}

static void ep_fail_record(xfer_ep_h ep, xfer_status_t status, const char *fmt, va_list ap)
{
    ep->fail_status = status;
    vsnprintf(ep->fail_reason, sizeof(ep->fail_reason), fmt, ap);
}

void xfer_tcp_ep_fail(xfer_ep_h ep, xfer_status_t status, const char *fmt, ...)
{
    va_list ap;

    if (ep->state == XFER_TCP_EP_FAILED) {
        return;
    }
    if (ep->state != XFER_TCP_EP_FAILING) {
        va_start(ap, fmt);
        ep_fail_record(ep, status, fmt, ap);
        va_end(ap);
    }
    if (ep->in_failing) {
        ucs_list_del(&ep->failing_link);
        ep->in_failing = 0;
    }
    ep_fail_now(ep);
}

void xfer_tcp_ep_fail_later(xfer_ep_h ep, xfer_status_t status, const char *fmt, ...)
{
    va_list ap;

    if ((ep->state == XFER_TCP_EP_FAILED) || (ep->state == XFER_TCP_EP_FAILING)) {
        return;
    }
    va_start(ap, fmt);
    ep_fail_record(ep, status, fmt, ap);
    va_end(ap);
    ep->state      = XFER_TCP_EP_FAILING;
    ep->in_failing = 1;
    ucs_list_add_tail(&ep->iface->failing, &ep->failing_link);
}

void xfer_tcp_ep_fail_deferred(xfer_ep_h ep)
{
    if (ep->state == XFER_TCP_EP_FAILING) {
        ep_fail_now(ep);
    }
}

void xfer_tcp_ep_destroy(xfer_ep_h ep)
{
    xfer_iface_h iface;
    xfer_tcp_unexp_t *ue, *tmp;

    if (ep == NULL) {
        return;
    }
    iface = ep->iface;
    if (ep->state == XFER_TCP_EP_CONNECTED) {
        xfer_tcp_ep_flush(ep);  /* best effort for what was already reported as sent */
    }
    if (ep->state != XFER_TCP_EP_FAILED) {
        ep_teardown(ep, XFER_ERR_CANCELED);
    }
    if (ep->in_ready) {
        ucs_list_del(&ep->ready_link);
    }
    if (ep->in_failing) {
        ucs_list_del(&ep->failing_link);
    }
    if (ep->in_notify) {
        ucs_list_del(&ep->notify_link);
    }
    ep->in_ready = ep->in_failing = ep->in_notify = 0;
    /* messages of this peer that nobody received go with it */
    ucs_list_for_each_safe(ue, tmp, &iface->unexp, list) {
        if (ue->ep == ep) {
            xfer_tcp_unexp_release(iface, ue);
        }
    }
    xfer_tcp_iface_deliver_ep(iface, ep);
    ucs_list_del(&ep->list);
    free(ep->slots);
    free(ep->rbuf);
    free(ep);
}

/* ---- receiving ------------------------------------------------------------------------------ */

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

void xfer_tcp_ep_forget_region(xfer_ep_h ep, xfer_memh_h memh)
{
    xfer_tcp_rx_t *rx = &ep->rx;
    xfer_tcp_tx_t *tx;

    if (rx->memh == memh) {
        /* a put is arriving into it: the rest is drained and the put refused */
        rx->drain += rx->want - rx->got;
        rx->want   = rx->got;
        rx->memh   = NULL;
        rx->status = XFER_ERR_INVALID_PARAM;
    }
    ucs_list_for_each(tx, &ep->txq, list) {
        void *copy;

        if ((tx->kind != XFER_TCP_TX_GET_RESP) || (tx->memh != memh)) {
            continue;
        }
        /* a get response still reads from it: keep a private copy */
        copy = malloc(tx->iov[1].iov_len);
        if (copy == NULL) {
            xfer_tcp_ep_fail_later(ep, XFER_ERR_NO_MEMORY, "out of memory keeping a %zu-byte "
                                   "get response of a deregistered region",
                                   tx->iov[1].iov_len);
            return;
        }
        memcpy(copy, tx->iov[1].iov_base, tx->iov[1].iov_len);
        tx->iov[1].iov_base = copy;
        tx->owned           = copy;
        tx->memh            = NULL;
    }
}

/* After a read of 0 or -1: 0 to wait for more input, -1 when the ep failed. */
static int rx_read_error(xfer_ep_h ep, ssize_t ret)
{
    if (ret == 0) {
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

/* One read into iov: 1 with *n_p bytes, 0 to wait (nothing there, or a read this round came
 * back short so the socket is empty), -1 when the ep failed. */
static int rx_read(xfer_ep_h ep, struct iovec *iov, int iovcnt, size_t *n_p)
{
    size_t space = 0;
    ssize_t ret;

    if (ep->rx_drained) {
        return 0;
    }
    for (int i = 0; i < iovcnt; i++) {
        space += iov[i].iov_len;
    }
    do {
        ret = readv(ep->fd, iov, iovcnt);
    } while ((ret < 0) && (errno == EINTR));
    if (ret <= 0) {
        return rx_read_error(ep, ret);
    }
    ep->rx_drained = ((size_t)ret < space);
    *n_p           = (size_t)ret;
    return 1;
}

/* Make n contiguous unparsed bytes available in the staging buffer. 1 = there, 0 = wait. */
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
        ret          = rx_read(ep, &iov, 1, &got);
        if (ret <= 0) {
            return ret;
        }
        ep->rlen += got;
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
        iov[1].iov_base = ep->rbuf;
        iov[1].iov_len  = XFER_TCP_RX_BUF_LEN;
        ret = rx_read(ep, iov, 2, &n);
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
        ret = rx_read(ep, iov, 1, &ep->rlen);
        if (ret <= 0) {
            return ret;
        }
    }
    return 1;
}

/* Advance the receive state machine by at most one frame: 1 = a frame was handled,
 * 0 = waiting for input (or paused), -1 = the ep failed. */
static int rx_step(xfer_ep_h ep)
{
    xfer_tcp_rx_t *rx = &ep->rx;
    char why[XFER_REASON_MAX] = "";
    xfer_status_t status;
    int ret;

    for (;;) {
        switch (rx->state) {
        case XFER_TCP_RX_HDR:
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
                                "%llu bytes of unexpected messages are buffered", (void*)ep,
                                (unsigned long long)ep->iface->unexp_bytes);
                }
                return 0;
            }
            if (status != XFER_OK) {
                xfer_tcp_ep_fail(ep, status, "%s", why);
                return -1;
            }
            ep->roff += rx->ext_len;
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
            status = rx->handler->on_done(ep, why, sizeof(why));
            rx_reset(ep);
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
    while (ep->state == XFER_TCP_EP_CONNECTED) {
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

unsigned xfer_tcp_ep_handle_events(xfer_ep_h ep, uint32_t events)
{
    if (ep->state != XFER_TCP_EP_CONNECTED) {
        return 0;   /* failed earlier in this progress() */
    }
    if (events & EPOLLOUT) {
        xfer_tcp_ep_flush(ep);
    }
    if ((ep->rx.state == XFER_TCP_RX_PAUSED) && (events & (EPOLLERR | EPOLLHUP))) {
        int err = 0;
        socklen_t len = sizeof(err);

        getsockopt(ep->fd, SOL_SOCKET, SO_ERROR, &err, &len);
        xfer_tcp_ep_fail(ep, XFER_ERR_CONNECTION, "connection lost while input was paused%s%s",
                         err ? ": " : "", err ? strerror(err) : "");
        return 1;
    }
    if ((ep->state == XFER_TCP_EP_CONNECTED) && (events & (EPOLLIN | EPOLLERR | EPOLLHUP))) {
        return xfer_tcp_ep_rx_progress(ep) + 1;
    }
    return 1;
}
