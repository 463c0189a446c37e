/*
 * tcp endpoints: the connection (a dup of the bootstrap socket, lane 0; more lanes are in
 * tcp_lane.c), its outstanding requests, and what happens when it fails. Its send queue is in
 * tcp_tx.c, its receive state machine in tcp_rx.c; this file owns the endpoint's life around
 * them, and what reaches into both directions at once (a region being deregistered, the teardown of a failed endpoint).
 *
 * Failing: everything pending on the endpoint completes with the failure status, tensors it
 * held are withdrawn or released, and the framework hears of it through ep_failed. Failures
 * noticed outside progress() (a send error inside a posting call, or inside a tensor's
 * ready()) are only recorded there and handled by the next progress().
 */
#include "tcp.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>


/* ---- creation and connection ---------------------------------------------------------------- */

static const xfer_flushes_ops_t flushes_ops;

xfer_status_t xfer_tcp_ep_create(xfer_iface_h iface, const xfer_ep_params_t *params,
                                 xfer_ep_h *ep_p)
{
    xfer_ep_h ep;
    xfer_status_t status;

    if (params->size < offsetof(xfer_ep_params_t, is_server) + sizeof(int)) {
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
    ep->pipe[0] = ep->pipe[1] = -1;
    ep->rbuf      = malloc(XFER_TCP_RX_BUF_LEN);
    ep->rx_staged = XFER_TCP_RX_PEEK_FRAMES;
    if (ep->rbuf == NULL) {
        status = XFER_ERR_NO_MEMORY;
        goto err_free_ep;
    }
    ep->fd = xfer_ep_sock_take(params->sock_fd, XFER_TCP_SUBSYS);
    if (ep->fd < 0) {
        status = XFER_ERR_NO_RESOURCE;
        goto err_free_rbuf;
    }
    ep->iface     = iface;
    xfer_ep_fail_init(&ep->fail, ep, params->fw_ep);
    ep->is_server = params->is_server;
    if ((params->size >= offsetof(xfer_ep_params_t, secret) + sizeof(params->secret)) &&
        (params->secret != NULL)) {
        memcpy(ep->secret, params->secret, XFER_EP_SECRET_LEN);
        ep->has_secret = 1;
    }
    if (iface->cfg->tls && !ep->has_secret) {
        xfer_log(XFER_LOG_ERROR, XFER_TCP_SUBSYS, "ep_create: XFER_TCP_TLS=y needs the "
                 "endpoint's secret from the authenticated bootstrap, and none was given");
        status = XFER_ERR_INVALID_PARAM;
        goto err_close_fd;
    }
    ep->limits    = iface->limits;
    xfer_slots_init(&ep->slots, 1u << 30);
    xfer_tframes_init(&ep->tf, &xfer_tcp_tframes_ops, ep, iface->base.ops, &ep->slots,
                      iface->base.tanswers, params->fw_ep);
    ep->rx.state  = XFER_TCP_RX_HDR;
    ucs_list_head_init(&ep->txq);
    xfer_flushes_init(&ep->flushes, &flushes_ops, ep);
    ucs_list_head_init(&ep->batch_fill);
    status = xfer_tcp_lanes_ep_init(ep);
    if (status != XFER_OK) {
        goto err_close_fd;
    }
    ucs_list_add_tail(&iface->eps, &ep->list);
    *ep_p = ep;
    return XFER_OK;

err_close_fd:
    close(ep->fd);
err_free_rbuf:
    free(ep->rbuf);
err_free_ep:
    free(ep);
    return status;
}

/* ---- counters ------------------------------------------------------------------------------- */

#define EP_STAT(_name, _field) XFER_COUNTER_FIELD(struct xfer_ep, _name, _field)

static const xfer_counter_field_t ep_stats[] = {
    /* bytes (rx_bytes: read from the peer's sockets, every lane's); then frames by kind: a
     * PUT carries one block (a put, or a batch's block sent alone), a PUTV a batch's blocks
     * gathered, a GET request one get */
    EP_STAT("tx_bytes_queued", tx_queued),       EP_STAT("tx_bytes", tx_written),
    EP_STAT("tx_bytes_spliced", tx_spliced),     EP_STAT("tx_put_frames", tx_put_frames),
    EP_STAT("tx_putv_frames", tx_putv_frames),   EP_STAT("tx_putv_blocks", tx_putv_blocks),
    EP_STAT("tx_get_requests", tx_get_reqs),     EP_STAT("rx_put_frames", rx_put_frames),
    EP_STAT("rx_putv_frames", rx_putv_frames),   EP_STAT("rx_putv_blocks", rx_putv_blocks),
    EP_STAT("rx_get_requests", rx_get_reqs),     EP_STAT("rx_bytes", rx_bytes),
};

void xfer_tcp_ep_counters(xfer_ep_h ep, xfer_counter_t *c, size_t *count_p)
{
    size_t n = 0;

    xfer_counter_put_table(c, *count_p, &n, ep, ep_stats, sizeof(ep_stats) / sizeof(ep_stats[0]));
    /* connections: those agreed on, and those up now (lane 0 included) */
    xfer_counter_put(c, *count_p, &n, "", "lanes", ep->nlanes);
    xfer_counter_put(c, *count_p, &n, "", "lanes_up", xfer_tcp_lanes_up(ep));
    *count_p = n;
}

xfer_status_t xfer_tcp_ep_address(xfer_ep_h ep, void *buf, size_t *len_p)
{
    if (!xfer_out_room(buf, len_p, XFER_TCP_WIRE_EP_ADDR_LEN)) {
        return XFER_ERR_NO_RESOURCE;
    }
    {
        xfer_tcp_wire_ep_addr_t addr = {.limits = ep->iface->limits,
                                        .flags  = ep->iface->cfg->tls ? XFER_TCP_WIRE_ADDR_TLS :
                                                  0};

        xfer_tcp_lanes_ep_addr(ep, &addr);
        xfer_tcp_wire_pack_ep_addr(&addr, buf);
    }
    return XFER_OK;
}

/* Socket options are best effort: a failure is logged, not fatal (a Unix socket in tests
 * has no TCP options at all). */
static void sockopt(int fd, int level, int name, int value, const char *what)
{
    if (setsockopt(fd, level, name, &value, sizeof(value)) != 0) {
        xfer_log_at(XFER_LOG_DEBUG, XFER_TCP_SUBSYS, "setsockopt(%s=%d) on fd %d: %s", what,
                    value, fd, strerror(errno));
    }
}

static int seconds(double s)
{
    return (s < 1.0) ? 1 : (s > 32767.0) ? 32767 : (int)(s + 0.5);
}

void xfer_tcp_sock_tune(xfer_iface_h iface, int fd)
{
    const xfer_tcp_config_t *cfg = iface->cfg;

    sockopt(fd, IPPROTO_TCP, TCP_NODELAY, 1, "TCP_NODELAY");
    if (cfg->busy_poll) {
        /* above net.core.busy_read it needs CAP_NET_ADMIN; without it the reads still poll */
        sockopt(fd, SOL_SOCKET, SO_BUSY_POLL, 50, "SO_BUSY_POLL");
    }
    if (cfg->sndbuf > 0) {
        sockopt(fd, SOL_SOCKET, SO_SNDBUF, (int)cfg->sndbuf, "SO_SNDBUF");
    }
    if (cfg->rcvbuf > 0) {
        sockopt(fd, SOL_SOCKET, SO_RCVBUF, (int)cfg->rcvbuf, "SO_RCVBUF");
    }
    sockopt(fd, SOL_SOCKET, SO_KEEPALIVE, cfg->keepalive ? 1 : 0, "SO_KEEPALIVE");
    if (cfg->keepalive) {
        sockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, seconds(cfg->keepidle), "TCP_KEEPIDLE");
        sockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, seconds(cfg->keepintvl), "TCP_KEEPINTVL");
        sockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, (int)cfg->keepcnt, "TCP_KEEPCNT");
    }
    if (cfg->user_timeout > 0) {
        sockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, (int)(cfg->user_timeout * 1000.0 + 0.5),
                "TCP_USER_TIMEOUT");
    }
}

xfer_status_t xfer_tcp_ep_connect(xfer_ep_h ep, const void *peer_ep_addr, size_t addr_len)
{
    xfer_tcp_wire_ep_addr_t peer = {.limits = ep->iface->limits, .lanes = 1};
    xfer_status_t status;
    int flags;

    if (ep->fail.state != XFER_EP_CREATED) {
        return XFER_ERR_INVALID_PARAM;
    }
    if (xfer_tcp_wire_unpack_ep_addr(peer_ep_addr, addr_len, &peer) != XFER_OK) {
        xfer_log(XFER_LOG_WARN, XFER_TCP_SUBSYS, "peer endpoint address of %zu bytes is not "
                 "a tcp v%u address", addr_len, XFER_TCP_WIRE_VERSION);
        return XFER_ERR_PROTOCOL;
    }
    if (((peer.flags & XFER_TCP_WIRE_ADDR_TLS) != 0) != ep->iface->cfg->tls) {
        xfer_log_peer("tls_refused", XFER_LOG_WARN, XFER_TCP_SUBSYS, "the %s %s XFER_TCP_TLS=y "
                      "and this side %s: both must, so the endpoint is not connected",
                      ep->is_server ? "client" : "server",
                      ep->iface->cfg->tls ? "does not set" : "sets",
                      ep->iface->cfg->tls ? "does" : "does not");
        return XFER_ERR_UNSUPPORTED;
    }
    if (peer.limits.max_msg_size < ep->limits.max_msg_size) {
        ep->limits.max_msg_size = peer.limits.max_msg_size;
    }
    if (peer.limits.max_key_len < ep->limits.max_key_len) {
        ep->limits.max_key_len = peer.limits.max_key_len;
    }
    flags = fcntl(ep->fd, F_GETFL);
    if ((flags < 0) || (fcntl(ep->fd, F_SETFL, flags | O_NONBLOCK) != 0)) {
        xfer_log(XFER_LOG_ERROR, XFER_TCP_SUBSYS, "fcntl(O_NONBLOCK): %s", strerror(errno));
        return XFER_ERR_IO;
    }
    /* before the lanes: their keys come from lane 0's TLS */
    if (ep->iface->cfg->tls) {
        char why[XFER_REASON_MAX];

        status = xfer_tcp_tls_ep_start(ep, why, sizeof(why));
        if (status != XFER_OK) {
            xfer_log_peer("tls_refused", XFER_LOG_WARN, XFER_TCP_SUBSYS, "endpoint with the "
                          "%s not connected: %s", ep->is_server ? "client" : "server", why);
            return status;
        }
    }
    status = xfer_tcp_lanes_ep_connect(ep, &peer);
    if (status != XFER_OK) {
        return status;
    }
    xfer_tcp_sock_tune(ep->iface, ep->fd);
    status = xfer_ep_sock_watch(ep->iface->base.epfd, ep->fd, ep, XFER_TCP_SUBSYS);
    if (status != XFER_OK) {
        return status;
    }
    ep->events = EPOLLIN | EPOLLRDHUP;
    ep->fail.state  = XFER_EP_CONNECTED;
    xfer_tcp_ep_hot(ep);
    xfer_log_at(XFER_LOG_DEBUG, XFER_TCP_SUBSYS, "ep %p connected on fd %d (%s side, %u "
                "lane(s), peer limits: %llu-byte messages, %u-byte keys)", (void*)ep, ep->fd,
                ep->is_server ? "server" : "client", ep->nlanes,
                (unsigned long long)ep->limits.max_msg_size, ep->limits.max_key_len);
    xfer_tcp_ep_tx_write(ep);     /* anything posted between create and connect */
    return XFER_OK;
}

/* What is posted before the endpoint connects is queued, and written once it does. */
xfer_status_t xfer_tcp_ep_check(xfer_ep_h ep)
{
    return xfer_ep_state_check(&ep->fail, XFER_OK);
}

/* ---- flush -----------------------------------------------------------------------------------
 *
 * A flush is done once the peer's host has acknowledged every byte queued before it (the
 * kernel's count of unacknowledged bytes, SIOCOUTQ, says how far that is), the acknowledged
 * puts and gets posted before it have completed, and - when PUT frames went out since the
 * last FLUSH_REQ - a FLUSH_REQ queued behind them is answered: the peer handles frames in
 * order, so its FLUSH_ACK says that their data is in its memory, and any PUT_FAIL for them
 * arrived first (the flush then fails with that put's status). Acknowledgements raise no
 * event: while flushes wait, the iface's timer looks again every millisecond. */

static xfer_status_t fence_send(xfer_ep_h ep)
{
    xfer_status_t status = xfer_tcp_ep_tx_hdr(ep, XFER_TCP_WIRE_FLUSH_REQ, XFER_OK,
                                              ep->fences_sent + 1, 0);

    if (status != XFER_OK) {
        return status;
    }
    ep->fences_sent++;
    ep->fence_put = ep->puts_sent;
    xfer_tcp_ep_tx_post(ep);
    return XFER_OK;
}

/* Nothing a flush would wait for: every byte, answer and fence acknowledged, no refusal to
 * report. */
static int all_acked(xfer_ep_h ep)
{
    return xfer_flushes_idle(&ep->flushes) && (ep->put_failed == 0) &&
           (ep->fence_put == ep->puts_sent) && (ep->fences_acked == ep->fences_sent) &&
           (xfer_tcp_ep_tx_acked(ep) >= ep->tx_queued) && xfer_tcp_lanes_acked(ep, NULL);
}

xfer_status_t xfer_tcp_ep_flush(xfer_ep_h ep, xfer_comp_t *comp)
{
    xfer_status_t status = xfer_tcp_ep_check(ep);
    xfer_tcp_op_t *op;

    if (status != XFER_OK) {
        return (ep->fail.state == XFER_EP_FAILED) ? xfer_ep_flush_ended(&ep->fail) : status;
    }
    if (all_acked(ep)) {
        return XFER_OK;
    }
    op = xfer_tcp_op_new(ep->iface, ep, XFER_TCP_OP_FLUSH, comp);
    if (op == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    if ((ep->fence_put != ep->puts_sent) && (fence_send(ep) != XFER_OK)) {
        xfer_tcp_op_free(op);
        return XFER_ERR_NO_MEMORY;
    }
    op->mark_tx    = ep->tx_queued;
    op->mark_fence = ep->fences_sent;
    op->mark_put   = ep->puts_sent;
    xfer_tcp_lanes_mark(ep, op->mark_lane);
    xfer_flushes_add(&ep->flushes, &op->flush);
    xfer_tcp_iface_flushing_add(ep->iface, ep);
    return XFER_INPROGRESS;
}

/* A flush's own conditions: the bytes before it acknowledged by the peer's host, on every
 * lane, and its fence answered; it reports the earliest refused put it covers, once. */
static int flush_reached(void *arg, xfer_flush_t *f, xfer_status_t *status_p)
{
    xfer_tcp_op_t *op = ucs_container_of(f, xfer_tcp_op_t, flush);
    xfer_ep_h ep      = arg;

    if ((ep->fences_acked < op->mark_fence) || (ep->flush_acked < op->mark_tx) ||
        !xfer_tcp_lanes_acked(ep, op->mark_lane)) {
        return 0;
    }
    if ((ep->put_failed != 0) && (ep->put_failed <= op->mark_put)) {
        *status_p      = ep->put_fail_status;   /* reported once, to this flush */
        ep->put_failed = 0;
    }
    return 1;
}

static void flush_complete(xfer_flush_t *f, xfer_status_t status)
{
    xfer_tcp_op_complete(ucs_container_of(f, xfer_tcp_op_t, flush), status, 0, 0);
}

static const xfer_flushes_ops_t flushes_ops = {flush_reached, flush_complete};

unsigned xfer_tcp_ep_flushes_check(xfer_ep_h ep)
{
    if ((ep->fail.state != XFER_EP_CONNECTED) || ucs_list_is_empty(&ep->flushes.waiting)) {
        return 0;
    }
    ep->flush_acked = xfer_tcp_ep_tx_acked(ep);
    return xfer_flushes_check(&ep->flushes);
}

/* The target side of a flush: every frame before the FLUSH_REQ is handled. */
static xfer_status_t rx_flush_req_ext(xfer_ep_h ep, const uint8_t *ext, char *why,
                                      size_t why_size)
{
    (void)ext;
    if (ep->rx.hdr.id != ep->fences_rcvd + 1) {
        snprintf(why, why_size, "FLUSH_REQ carries id %" PRIu64 ", expected %" PRIu64,
                 ep->rx.hdr.id, ep->fences_rcvd + 1);
        return XFER_ERR_PROTOCOL;
    }
    ep->fences_rcvd++;
    xfer_tcp_rx_expect(ep, NULL, 0, 0);
    return XFER_OK;
}

static xfer_status_t rx_flush_req_done(xfer_ep_h ep, char *why, size_t why_size)
{
    return xfer_tcp_ep_answer(ep, XFER_TCP_WIRE_FLUSH_ACK, XFER_OK, why, why_size);
}

static xfer_status_t rx_flush_ack_ext(xfer_ep_h ep, const uint8_t *ext, char *why,
                                      size_t why_size)
{
    (void)ext;
    if (ep->fences_acked == ep->fences_sent) {
        snprintf(why, why_size, "FLUSH_ACK %" PRIu64 " while no FLUSH_REQ waits for one",
                 ep->rx.hdr.id);
        return XFER_ERR_PROTOCOL;
    }
    if (ep->rx.hdr.id != ep->fences_acked + 1) {
        snprintf(why, why_size, "FLUSH_ACK carries id %" PRIu64 ", expected %" PRIu64,
                 ep->rx.hdr.id, ep->fences_acked + 1);
        return XFER_ERR_PROTOCOL;
    }
    ep->fences_acked++;
    xfer_tcp_rx_expect(ep, NULL, 0, 0);
    return XFER_OK;
}

static xfer_status_t rx_flush_ack_done(xfer_ep_h ep, char *why, size_t why_size)
{
    (void)why;
    (void)why_size;
    xfer_tcp_ep_flushes_check(ep);
    return XFER_OK;
}

const xfer_tcp_rx_handler_t xfer_tcp_rx_flush_req = {0, rx_flush_req_ext, rx_flush_req_done};
const xfer_tcp_rx_handler_t xfer_tcp_rx_flush_ack = {0, rx_flush_ack_ext, rx_flush_ack_done};

/* ---- orderly close ---------------------------------------------------------------------------
 *
 * The closing side has flushed; it queues BYE behind everything (a fence first, should a put
 * have gone since), and its close goes on once the BYE itself is acknowledged, so that the
 * connection then ends with a FIN that the peer reads after it, not with a reset that could
 * overtake it. The peer handles every frame before the BYE, completes the flushes that
 * everything it sent satisfies, and ends its endpoint with XFER_ERR_PEER_CLOSED. */

xfer_status_t xfer_tcp_ep_shutdown(xfer_ep_h ep, xfer_comp_t *comp)
{
    xfer_status_t status = xfer_tcp_ep_check(ep);

    if (status != XFER_OK) {
        return status;
    }
    if ((ep->fence_put != ep->puts_sent) && (fence_send(ep) != XFER_OK)) {
        return XFER_ERR_NO_MEMORY;
    }
    status = xfer_tcp_ep_tx_hdr(ep, XFER_TCP_WIRE_BYE, XFER_OK, 0, 0);
    if (status != XFER_OK) {
        return status;
    }
    xfer_tcp_ep_tx_post(ep);
    return xfer_tcp_ep_flush(ep, comp);
}

static xfer_status_t rx_bye_ext(xfer_ep_h ep, const uint8_t *ext, char *why, size_t why_size)
{
    (void)ext;
    (void)why;
    (void)why_size;
    xfer_tcp_rx_expect(ep, NULL, 0, 0);
    return XFER_OK;
}

static xfer_status_t rx_bye_done(xfer_ep_h ep, char *why, size_t why_size)
{
    xfer_tcp_ep_flushes_check(ep);
    ep->clean_close = 1;
    /* the ep ends: what waits for the peer fails with it */
    return xfer_ep_bye(&ep->fail, all_acked(ep), why, why_size);
}

const xfer_tcp_rx_handler_t xfer_tcp_rx_bye = {0, rx_bye_ext, rx_bye_done};

void xfer_tcp_ep_flushes_fail(xfer_ep_h ep, xfer_status_t status)
{
    xfer_flushes_fail(&ep->flushes, status);
    if (ep->in_flushing) {
        ucs_list_del(&ep->flushing_link);
        ep->in_flushing = 0;
    }
}

/* ---- regions being deregistered ------------------------------------------------------------- */

void xfer_tcp_ep_forget_region(xfer_ep_h ep, xfer_memh_h memh)
{
    xfer_tcp_rx_t *rx = &ep->rx;
    xfer_tcp_tx_t *tx;

    if (rx->memh == memh) {
        /* a put is arriving into it: the rest is drained and the put refused */
        if (rx->dev) {
            xfer_tcp_cuda_rx_forget(ep);
        }
        if (rx->viov != NULL) {
            /* a PUTV: its blocks not yet in, after the current one (whose rest want - got
             * is in CUDA memory; in host memory got counts into the block itself) */
            for (uint32_t i = rx->vidx; i < rx->vcnt; i++) {
                rx->drain += rx->viov[i].iov_len;
            }
            if (!rx->dev && (rx->vidx < rx->vcnt)) {
                rx->drain -= rx->got;
                rx->got    = 0;
            } else if (rx->vidx < rx->vcnt) {
                rx->drain -= rx->viov[rx->vidx].iov_len;
            }
            rx->viov = NULL;
        }
        rx->drain += rx->want - rx->got;
        rx->want   = rx->got;
        rx->memh   = NULL;
        rx->status = XFER_ERR_NOT_FOUND;     /* as for a put that named it after (C28) */
        if (rx->hdr.striped) {
            xfer_tcp_lanes_rx_forget(ep);
        }
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
        if (memh->cuda) {
            char why[XFER_REASON_MAX] = "";

            if (xfer_tcp_cuda_copy(ep->iface, copy, tx->iov[1].iov_base, tx->iov[1].iov_len,
                                   0, why, sizeof(why)) != XFER_OK) {
                free(copy);
                xfer_tcp_ep_fail_later(ep, XFER_ERR_IO, "copy of a get response from a "
                                       "deregistered CUDA region: %s", why);
                return;
            }
            xfer_tcp_cuda_tx_release(ep, tx);   /* written from the copy from now on */
        } else {
            memcpy(copy, tx->iov[1].iov_base, tx->iov[1].iov_len);
        }
        tx->iov[1].iov_base = copy;
        tx->owned           = copy;
        tx->memh            = NULL;
    }
}

/* ---- failure -------------------------------------------------------------------------------- */

/* What a slot waited for ends with its endpoint. */
static void slot_end(void *op, xfer_status_t status)
{
    xfer_tcp_op_complete(op, status, 0, 0);
}

/* Close the connection and end everything pending on ep with status. */
static void ep_teardown(void *arg, xfer_status_t status)
{
    xfer_ep_h ep = arg;

    xfer_ep_sock_close(ep->iface->base.epfd, &ep->fd);
    xfer_tcp_ep_pipe_close(ep);         /* before the entries its pages belong to */
    xfer_tcp_lanes_ep_close(ep, 0);
    xfer_tcp_ep_flushes_fail(ep, status);
    while (!ucs_list_is_empty(&ep->txq)) {
        xfer_tcp_ep_tx_end(ep, ucs_list_extract_head(&ep->txq, xfer_tcp_tx_t, list), status);
    }
    while (!ucs_list_is_empty(&ep->tx_wait)) {
        xfer_tcp_ep_tx_end(ep, ucs_list_extract_head(&ep->tx_wait, xfer_tcp_tx_t, list),
                           status);
    }
    xfer_tcp_ep_rx_abort(ep, status);
    xfer_notify_rx_end(ep->fail.fw_ep, &ep->batch_notify);    /* one part-way in */
    xfer_slots_end_all(&ep->slots, slot_end, status);
    xfer_tframes_ep_gone(&ep->tf, status);
}

static xfer_log_level_t ep_who(void *arg, char *buf, size_t size)
{
    xfer_ep_h ep = arg;

    snprintf(buf, size, "connection to the %s", ep->is_server ? "client" : "server");
    /* a peer that closes between frames just left; everything else is worth a warning */
    return ep->clean_close ? XFER_LOG_INFO : XFER_LOG_WARN;
}

const xfer_ep_fail_ops_t xfer_tcp_ep_fail_ops = {XFER_TCP_SUBSYS, ep_who, ep_teardown, NULL};

void xfer_tcp_ep_destroy(xfer_ep_h ep)
{
    xfer_iface_h iface;

    if (ep == NULL) {
        return;
    }
    iface = ep->iface;
    /* What was reported sent is delivered by the framework's flush before it gets here, or
     * the close was forced. Bytes still unsent or unacknowledged now will never be: abort
     * the connection (RST) instead of a FIN that would wait behind them - behind a peer that
     * does not read, for as long as TCP_USER_TIMEOUT - so that the peer learns at once. */
    if ((ep->fail.state == XFER_EP_CONNECTED) && ((xfer_tcp_ep_tx_acked(ep) < ep->tx_queued) ||
                                                 !xfer_tcp_lanes_acked(ep, NULL))) {
        struct linger abort_now = {.l_onoff = 1, .l_linger = 0};

        (void)setsockopt(ep->fd, SOL_SOCKET, SO_LINGER, &abort_now, sizeof(abort_now));
        xfer_tcp_lanes_ep_close(ep, 1);
    }
    xfer_ep_fail_destroy(&iface->base.failq, &ep->fail);
    if (ep->in_ready) {
        ucs_list_del(&ep->ready_link);
    }
    if (ep->in_tx_ready) {
        ucs_list_del(&ep->tx_ready_link);
    }
    xfer_tcp_cuda_ep_forget(ep);
    ep->in_ready = ep->in_tx_ready = 0;
    xfer_op_deliver_owner(iface->base.ops, ep);
    xfer_tcp_batch_ep_gone(ep);
    if (ep->hot) {
        ucs_list_del(&ep->hot_link);
    }
    ucs_list_del(&ep->list);
    free(ep->lanes);
    xfer_slots_cleanup(&ep->slots);
    free(ep->rbuf);
    free(ep);
}
