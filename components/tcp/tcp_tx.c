/*
 * The send queue of a tcp endpoint and the epoll events it watches: every frame the endpoint
 * sends - a posting call's, or a response a received frame asked for - goes through it.
 *
 * Sending: small frames are copied into coalescing buffers at the tail of the queue; large
 * data is queued as a reference to the caller's memory (header + data, written with one
 * sendmsg). flush() writes as much as the socket takes and watches EPOLLOUT only while
 * something is left. Large data may be cut over the endpoint's lanes (tcp_lane.c): the entry
 * then holds lane 0's share, and is done once every lane wrote its share. A batch's blocks
 * (PUTV entries) leave by reference instead: vmsplice puts their pages in a pipe and splice
 * moves them into the socket, the sender's copy saved (see tx_splice).
 */
#include "tcp.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

static size_t tx_length(const xfer_tcp_tx_t *tx)
{
    return tx->iov[0].iov_len + tx->iov[1].iov_len + tx->xlen;
}

/* Add [base, base + len) to the *cnt vectors of iov: to the last one when it ends at base, else
 * as a new one if fewer than max. -1: no room. */
static int iov_append(struct iovec *iov, int *cnt, int max, uint8_t *base, size_t len)
{
    if ((*cnt > 0) && ((uint8_t*)iov[*cnt - 1].iov_base + iov[*cnt - 1].iov_len == base)) {
        iov[*cnt - 1].iov_len += len;
        return 0;
    }
    if (*cnt >= max) {
        return -1;
    }
    iov[*cnt].iov_base = base;
    iov[*cnt].iov_len  = len;
    (*cnt)++;
    return 0;
}

/* The i-th piece of what the entry writes: iov[0], then iov[1] or the xiov list. */
static const struct iovec *tx_piece(const xfer_tcp_tx_t *tx, unsigned i)
{
    if (i == 0) {
        return &tx->iov[0];
    }
    if (tx->xiovcnt == 0) {
        return (i == 1) ? &tx->iov[1] : NULL;
    }
    return (i <= tx->xiovcnt) ? &tx->xiov[i - 1] : NULL;
}

uint8_t *xfer_tcp_ep_tx_reserve(xfer_ep_h ep, size_t len, int answer)
{
    uint64_t cost = answer ? XFER_TCP_ANSWER_COST(len) : 0;
    xfer_tcp_tx_t *tx;
    uint8_t *p;
    size_t cap;
    int pooled;

    if (!ucs_list_is_empty(&ep->txq)) {
        tx = ucs_list_tail(&ep->txq, xfer_tcp_tx_t, list);
        if ((tx->kind == XFER_TCP_TX_BUF) && (tx->cap - tx->iov[0].iov_len >= len)) {
            p = (uint8_t*)tx->iov[0].iov_base + tx->iov[0].iov_len;
            tx->iov[0].iov_len += len;
            tx->resp           += cost;
            ep->tx_queued      += len;
            if (cost > 0) {
                xfer_budget_queue_add(ep->fail.fw_ep, XFER_BUDGET_ANSWERS, &ep->answers, cost);
            }
            return p;
        }
    }
    cap = (len > XFER_TCP_TX_BUF_LEN) ? len : XFER_TCP_TX_BUF_LEN;
    tx     = (cap == XFER_TCP_TX_BUF_LEN) ? ucs_mpool_get(&ep->iface->tx_mp) : NULL;
    pooled = (tx != NULL);
    if (!pooled) {
        tx = malloc(sizeof(*tx) + cap);     /* larger, or the pool is at its bound */
        if (tx == NULL) {
            return NULL;
        }
    }
    memset(tx, 0, sizeof(*tx));
    tx->pooled         = pooled;
    tx->kind           = XFER_TCP_TX_BUF;
    tx->cap            = cap;
    tx->iov[0].iov_base = tx + 1;
    tx->iov[0].iov_len  = len;
    tx->resp            = cost;
    ucs_list_add_tail(&ep->txq, &tx->list);
    ep->tx_queued += len;
    if (cost > 0) {
        xfer_budget_queue_add(ep->fail.fw_ep, XFER_BUDGET_ANSWERS, &ep->answers, cost);
    }
    return (uint8_t*)(tx + 1);
}

xfer_status_t xfer_tcp_ep_tx_hdr(xfer_ep_h ep, unsigned type, xfer_status_t status, uint64_t id,
                                 int answer)
{
    xfer_tcp_wire_hdr_t hdr = {XFER_TCP_WIRE_MAGIC, XFER_TCP_WIRE_VERSION, (uint8_t)type,
                               status, id, 0, 0};
    uint8_t *p = xfer_tcp_ep_tx_reserve(ep, XFER_TCP_WIRE_HDR_LEN, answer);

    if (p == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    xfer_tcp_wire_pack_hdr(&hdr, p);
    return XFER_OK;
}

xfer_status_t xfer_tcp_ep_answer(xfer_ep_h ep, unsigned type, xfer_status_t status, char *why,
                                 size_t why_size)
{
    if (xfer_tcp_ep_tx_hdr(ep, type, status, ep->rx.hdr.id, 1) != XFER_OK) {
        snprintf(why, why_size, "out of memory for a %s", xfer_tcp_wire_type_name(type));
        return XFER_ERR_NO_MEMORY;
    }
    return XFER_OK;
}

void xfer_tcp_ep_tx_push(xfer_ep_h ep, xfer_tcp_tx_t *tx)
{
    tx->sent       = 0;
    tx->lanes_left = 0;
    xfer_tcp_lanes_tx_stripe(ep, tx);   /* large data: iov[1] becomes lane 0's share */
    ucs_list_add_tail(&ep->txq, &tx->list);
    ep->tx_queued += tx_length(tx);
    if (tx->resp > 0) {
        xfer_budget_queue_add(ep->fail.fw_ep, XFER_BUDGET_ANSWERS, &ep->answers, tx->resp);
    }
    if (tx->dev) {
        /* device data: its first chunks start copying now, while what is before it goes */
        tx->ring_head = tx->ring_count = 0;
        tx->first     = tx->next = 0;
        tx->spill     = NULL;
        tx->spill_len = 0;
        xfer_tcp_cuda_tx_fill(ep, tx);
    }
}

void xfer_tcp_tx_free(xfer_tcp_tx_t *tx)
{
    if (tx->pooled) {
        ucs_mpool_put(tx);
    } else {
        free(tx);
    }
}

void xfer_tcp_ep_tx_end(xfer_ep_h ep, xfer_tcp_tx_t *tx, xfer_status_t status)
{
    xfer_tcp_op_t *op;

    if (tx->resp > 0) {
        xfer_budget_queue_remove(ep->fail.fw_ep, XFER_BUDGET_ANSWERS, &ep->answers, tx->resp);
    }
    if ((status == XFER_OK) && ep->rx_blocked &&
        (ep->answers.held <= ep->iface->cfg->max_backlog / 2) &&
        xfer_budget_queue_within(ep->fail.fw_ep, XFER_BUDGET_ANSWERS, &ep->answers)) {
        /* the peer reads its answers again: read its requests again. Here, where the backlog
         * shrinks, whichever connection wrote an answer's last bytes (lane 0 or a lane). */
        ep->rx_blocked = 0;
        xfer_tcp_iface_rx_kick(ep->iface, ep);
        xfer_tcp_ep_update_events(ep);
    }
    if (tx->dev) {
        xfer_tcp_cuda_tx_release(ep, tx);
    }
    switch (tx->kind) {
    case XFER_TCP_TX_OP:
        op = ucs_container_of(tx, xfer_tcp_op_t, tx);
        op->tx_pending = 0;
        if (op->on_write) {
            xfer_tcp_op_complete(op, status, (status == XFER_OK) ? op->len : 0, 0);
        }
        break;      /* an acknowledged put completes with its PUT_ACK, or with the ep */
    case XFER_TCP_TX_ANSWER:
        /* released by the next progress(): never from inside a tensor's ready() */
        xfer_tanswer_done(ucs_container_of(tx, xfer_tcp_answer_t, tx)->a, status);
        break;
    case XFER_TCP_TX_GET_RESP:
    case XFER_TCP_TX_PUTV:      /* its batch completes with the BATCH_ACK behind it */
        free(tx->owned);
        free(tx);
        break;
    default:
        xfer_tcp_tx_free(tx);
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
            if (tx->dev) {
                xfer_tcp_cuda_tx_advance(ep, tx);
            }
            return;
        }
        n -= left;
        ucs_list_del(&tx->list);
        if (xfer_tcp_lanes_tx_lane0_done(ep, tx)) {
            xfer_tcp_ep_tx_end(ep, tx, XFER_OK);
        }
    }
}

/* ---- blocks by reference -------------------------------------------------------------------- */

/* The least pipe worth using: a user past fs.pipe-user-pages-soft gets pipes of two pages, and
 * two system calls per 8 KiB cost more than the copy they save. */
#define TX_PIPE_MIN  (64u * 1024u)
/* Vectors of one vmsplice: the blocks not end to end in the caller's memory */
#define TX_SPLICE_IOV_MAX 128

static int tx_pipe_open(xfer_ep_h ep)
{
    int fds[2];
    int cap;

    if (pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0) {
        xfer_log(XFER_LOG_INFO, XFER_TCP_SUBSYS, "no pipe for batch blocks (%s): they are "
                 "copied into the socket", strerror(errno));
        return -1;
    }
    /* XFER_TCP_SPLICE_PIPE; fs.pipe-max-size may refuse it, the default (64 KiB) stays */
    (void)fcntl(fds[1], F_SETPIPE_SZ, (int)ep->iface->cfg->splice_pipe);
    cap = fcntl(fds[1], F_GETPIPE_SZ);
    if (cap < (int)TX_PIPE_MIN) {
        xfer_log(XFER_LOG_INFO, XFER_TCP_SUBSYS, "the pipe for batch blocks holds %d bytes "
                 "(fs.pipe-user-pages-soft reached?): they are copied into the socket", cap);
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    ep->pipe[0]  = fds[0];
    ep->pipe[1]  = fds[1];
    ep->pipe_cap = (size_t)cap;
    ep->pipe_len = 0;
    return 0;
}

void xfer_tcp_ep_pipe_close(xfer_ep_h ep)
{
    if (ep->pipe[0] >= 0) {
        close(ep->pipe[0]);
        close(ep->pipe[1]);
    }
    ep->pipe[0]  = ep->pipe[1] = -1;
    ep->pipe_len = 0;
}

/* Put the next blocks of tx, after those already in the pipe, into it by reference, as many
 * as it takes. 0: some (or the pipe is full); -1: none can go so (errno). */
static int tx_pipe_fill(xfer_ep_h ep, xfer_tcp_tx_t *tx)
{
    struct iovec iov[TX_SPLICE_IOV_MAX];
    size_t skip = tx->sent - tx->iov[0].iov_len + ep->pipe_len;
    size_t room = ep->pipe_cap - ep->pipe_len;
    size_t total = 0;
    int cnt      = 0;
    ssize_t n;

    for (unsigned i = 0; (i < tx->xiovcnt) && (total < room); i++) {
        uint8_t *base;
        size_t len;

        if (skip >= tx->xiov[i].iov_len) {
            skip -= tx->xiov[i].iov_len;
            continue;
        }
        base = (uint8_t*)tx->xiov[i].iov_base + skip;
        len  = tx->xiov[i].iov_len - skip;
        skip = 0;
        if (iov_append(iov, &cnt, TX_SPLICE_IOV_MAX, base, len) != 0) {
            break;
        }
        total += len;
    }
    if (cnt == 0) {
        return 0;       /* every block is in the pipe already */
    }
    if (total > room) {
        iov[cnt - 1].iov_len -= total - room;
    }
    do {
        n = vmsplice(ep->pipe[1], iov, (unsigned long)cnt, SPLICE_F_NONBLOCK);
    } while ((n < 0) && (errno == EINTR));
    if (n < 0) {
        return ((errno == EAGAIN) && (ep->pipe_len > 0)) ? 0 : -1;
    }
    ep->pipe_len += (size_t)n;
    return 0;
}

/* splice() into a socket takes no MSG_NOSIGNAL: it raises SIGPIPE, whose default action would
 * end the application, whenever it fails with EPIPE - as it does once a peer that closed its
 * end (FIN) resets the connection when our next bytes reach it (the kernel's error for a
 * reset in CLOSE_WAIT), before this side has read the end. The signal is blocked for the
 * splices of one write round - a system call each way, not three per splice (measured: a
 * 128 x 4 KiB batch lost 3.5 % to them) - and one that a splice raised is taken back before
 * the mask is restored, so that the failure is only the EPIPE it returns. Where the
 * application blocks SIGPIPE itself, one it had pending before is left alone. */
typedef struct pipe_guard {
    sigset_t old;
    int      on;
    int      was_pending;   /* blocked by the application, and pending already */
    int      raised;        /* a splice returned EPIPE */
} pipe_guard_t;

static void pipe_guard_on(pipe_guard_t *g)
{
    sigset_t set, pending;

    if (g->on) {
        return;
    }
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &set, &g->old);
    g->was_pending = sigismember(&g->old, SIGPIPE) && (sigpending(&pending) == 0) &&
                     sigismember(&pending, SIGPIPE);
    g->on          = 1;
}

static void pipe_guard_off(pipe_guard_t *g)
{
    struct timespec none = {0, 0};
    sigset_t set;

    if (!g->on) {
        return;
    }
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    if (g->raised && !g->was_pending) {
        while ((sigtimedwait(&set, NULL, &none) < 0) && (errno == EINTR)) {
        }
    }
    if (!sigismember(&g->old, SIGPIPE)) {
        pthread_sigmask(SIG_SETMASK, &g->old, NULL);
    }
    g->on = 0;
}

static ssize_t splice_nosignal(pipe_guard_t *g, int in, int out, size_t len)
{
    ssize_t n;

    pipe_guard_on(g);
    do {
        n = splice(in, NULL, out, NULL, len, SPLICE_F_NONBLOCK);
    } while ((n < 0) && (errno == EINTR));
    if ((n < 0) && (errno == EPIPE)) {
        g->raised = 1;
    }
    return n;
}

/* tx, the head entry with its header written, writes its blocks through the pipe: into it as
 * many as it holds, out of it into the socket as much as the socket and budget take. The pages
 * stay the caller's, referred to by the socket until the peer's host acknowledges them - which
 * is before the BATCH_ACK that completes the batch, and only then may the caller reuse them.
 * Returns 0 with *n written, 1 when the socket is full, 2 when tx's blocks are to be copied
 * after all (nothing of them in the pipe), -1 when the endpoint failed. */
static int tx_splice(xfer_ep_h ep, xfer_tcp_tx_t *tx, size_t budget, pipe_guard_t *guard,
                     size_t *n_p)
{
    size_t left = tx_length(tx) - tx->sent;
    ssize_t n;

    if ((ep->pipe[0] < 0) && (tx_pipe_open(ep) != 0)) {
        ep->no_pipe = 1;
        tx->splice  = 0;
        return 2;
    }
    if ((ep->pipe_len < left) && (tx_pipe_fill(ep, tx) != 0) && (ep->pipe_len == 0)) {
        /* pages vmsplice cannot refer to (a device's mapping, say) */
        xfer_log(XFER_LOG_DEBUG, XFER_TCP_SUBSYS, "vmsplice of a batch's blocks: %s; they "
                 "are copied", strerror(errno));
    }
    if (ep->pipe_len == 0) {
        tx->splice = 0;     /* nothing went in: the gather copies the rest */
        return 2;
    }
    n = splice_nosignal(guard, ep->pipe[0], ep->fd,
                        (ep->pipe_len < budget) ? ep->pipe_len : budget);
    if (n < 0) {
        if ((errno == EAGAIN) || (errno == EWOULDBLOCK)) {
            return 1;
        }
        xfer_tcp_ep_fail_later(ep, XFER_ERR_CONNECTION, "splice: %s", strerror(errno));
        return -1;
    }
    ep->pipe_len   -= (size_t)n;
    ep->tx_written += (size_t)n;
    ep->tx_spliced += (size_t)n;
    *n_p            = (size_t)n;
    tx_advance(ep, (size_t)n);
    return (n == 0) ? 1 : 0;
}

void xfer_tcp_ep_tx_write(xfer_ep_h ep)
{
    xfer_tcp_ep_tx_write_some(ep, SIZE_MAX);
}

/* Whether anything is queued to write, batches' next frames queued first (as far as their
 * windows allow): the socket takes a large batch as fast as it drains, no faster. */
static int tx_more(xfer_ep_h ep)
{
    if (!ucs_list_is_empty(&ep->batch_fill)) {
        xfer_tcp_batch_fill(ep);
    }
    return !ucs_list_is_empty(&ep->txq);
}

static void tx_write_round(xfer_ep_h ep, size_t budget, pipe_guard_t *guard)
{
    struct iovec iov[XFER_TCP_IOV_MAX];
    size_t written = 0;
    int stopped    = 0;     /* by a full socket or a copy from device memory */

    if (ep->fail.state != XFER_EP_CONNECTED) {
        return;
    }
    while ((written < budget) && tx_more(ep)) {
        struct msghdr msg = {0};
        size_t total      = 0;
        int waiting       = 0;  /* device data not copied yet: nothing after it goes */
        xfer_tcp_tx_t *tx;
        int cnt = 0;
        ssize_t n;

        tx = ucs_list_head(&ep->txq, xfer_tcp_tx_t, list);
        if (tx->splice && (tx->sent >= tx->iov[0].iov_len)) {
            size_t spliced = 0;
            int ret        = tx_splice(ep, tx, budget - written, guard, &spliced);

            if (ret < 0) {
                return;
            }
            written += spliced;
            if (ret == 1) {
                stopped = 1;
                break;
            }
            if (ret == 0) {
                continue;
            }
        }
        ucs_list_for_each(tx, &ep->txq, list) {
            size_t skip = tx->sent;

            if (tx->dev) {
                int ret;

                if (skip < tx->iov[0].iov_len) {
                    iov[cnt].iov_base = (uint8_t*)tx->iov[0].iov_base + skip;
                    iov[cnt].iov_len  = tx->iov[0].iov_len - skip;
                    total            += iov[cnt].iov_len;
                    cnt++;
                    skip = 0;
                } else {
                    skip -= tx->iov[0].iov_len;
                }
                ret     = xfer_tcp_cuda_tx_gather(ep, tx, skip, iov, XFER_TCP_IOV_MAX, &cnt,
                                                  &total);
                waiting = (ret == 1);
                if ((ret != 0) || (cnt >= XFER_TCP_IOV_MAX)) {
                    break;
                }
                continue;
            }
            /* an entry whose blocks go through the pipe gives its header alone, and ends the
             * gather: its blocks are next, by splice */
            for (unsigned i = 0; (tx_piece(tx, i) != NULL) && (total < budget - written) &&
                                 ((i == 0) || !tx->splice); i++) {
                const struct iovec *piece = tx_piece(tx, i);
                uint8_t *base;
                size_t len;

                if (skip >= piece->iov_len) {
                    skip -= piece->iov_len;
                    continue;
                }
                base = (uint8_t*)piece->iov_base + skip;
                len  = piece->iov_len - skip;
                skip = 0;
                /* a piece that starts where the last one ends (a batch's blocks end to end
                 * in the initiator's buffer) extends it: the kernel's cost is per vector
                 * (measured on loopback: 128 x 4 KiB one vector each cost the sender about
                 * 25 usec more per 512 KiB than one vector) */
                if (iov_append(iov, &cnt, XFER_TCP_IOV_MAX, base, len) != 0) {
                    break;
                }
                total += len;
            }
            if (total > budget - written) {
                /* a posting call writes no more than its budget, however long the last
                 * vector grew: progress writes the rest */
                iov[cnt - 1].iov_len -= total - (budget - written);
                total                 = budget - written;
            }
            if ((cnt >= XFER_TCP_IOV_MAX) || (total >= budget - written) || tx->splice) {
                break;
            }
        }
        if (cnt == 0) {
            stopped = 1;    /* waiting for a copy from device memory */
            break;
        }
        msg.msg_iov    = iov;
        msg.msg_iovlen = (size_t)cnt;
        n = sendmsg(ep->fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            if ((errno == EAGAIN) || (errno == EWOULDBLOCK)) {
                stopped = 1;
                break;
            }
            xfer_tcp_ep_fail_later(ep, XFER_ERR_CONNECTION, "send: %s", strerror(errno));
            return;
        }
        ep->tx_written += (size_t)n;
        written        += (size_t)n;
        tx_advance(ep, (size_t)n);
        if (((size_t)n < total) || waiting) {
            stopped = 1;    /* the socket is full, or what follows waits for a copy */
            break;
        }
    }
    /* the budget ran out, not the socket: the next round writes what is queued - and what a
     * batch queues now that its window opened, which no event would ask for when the budget
     * ran out just as the queue emptied */
    if (!stopped && tx_more(ep)) {
        xfer_tcp_iface_tx_kick(ep->iface, ep);
    }
    xfer_tcp_ep_update_events(ep);
    if (ep->nlanes > 1) {
        xfer_tcp_lanes_tx_write(ep);
    }
}

void xfer_tcp_ep_tx_write_some(xfer_ep_h ep, size_t budget)
{
    pipe_guard_t guard = {.on = 0};

    tx_write_round(ep, budget, &guard);
    pipe_guard_off(&guard);
}

uint64_t xfer_tcp_sock_acked(int fd, uint64_t written)
{
    int outq = 0;

    /* SIOCOUTQ: bytes in the socket's send queue not yet acknowledged by the peer's host (on
     * a Unix socket: not yet read by the peer) */
    if ((fd < 0) || (ioctl(fd, SIOCOUTQ, &outq) != 0) || (outq < 0)) {
        outq = 0;
    }
    return ((uint64_t)outq > written) ? 0 : written - (uint64_t)outq;
}

uint64_t xfer_tcp_ep_tx_acked(xfer_ep_h ep)
{
    return xfer_tcp_sock_acked(ep->fd, ep->tx_written);
}

void xfer_tcp_ep_tx_post(xfer_ep_h ep)
{
    xfer_tcp_ep_tx_post_some(ep, SIZE_MAX);
}

void xfer_tcp_ep_tx_post_some(xfer_ep_h ep, size_t budget)
{
    if (!(ep->events & EPOLLOUT) && (ep->tx_corked == 0)) {
        xfer_tcp_ep_tx_write_some(ep, budget);
    }
}

void xfer_tcp_ep_update_events(xfer_ep_h ep)
{
    struct epoll_event ev = {0};
    uint32_t events       = EPOLLRDHUP;     /* the peer's end, even while input waits */

    if (ep->fail.state != XFER_EP_CONNECTED) {
        return;
    }
    if ((ep->rx.state != XFER_TCP_RX_PAUSED) && !ep->rx_blocked && !ep->rx.lanes_wait) {
        events |= EPOLLIN;
    }
    if (!ucs_list_is_empty(&ep->txq) && !ep->in_tx_ready) {
        events |= EPOLLOUT;
    }
    if (events == ep->events) {
        return;
    }
    ev.events   = events;
    ev.data.ptr = ep;
    if (epoll_ctl(ep->iface->base.epfd, EPOLL_CTL_MOD, ep->fd, &ev) != 0) {
        xfer_tcp_ep_fail_later(ep, XFER_ERR_NO_RESOURCE, "epoll_ctl: %s", strerror(errno));
        return;
    }
    ep->events = events;
}
