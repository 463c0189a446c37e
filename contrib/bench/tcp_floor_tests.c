/*
 * tcp_floor's timed data paths (see tcp_floor.c for the tool): bw's senders and receivers, one
 * thread per connection, with MSG_ZEROCOPY's completions reaped from the error queue, and
 * lat's ping-pong with its three ways of waiting for the peer's message.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <linux/errqueue.h>      /* after <time.h>: it uses struct timespec */

#include "tcp_floor.h"
#include "../perf/scatter.h"

double floor_now_sec(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Record the first failure of a stream; always -1. */
static int stream_fail(stream_t *s, const char *fmt, ...)
{
    va_list ap;

    if (s->err[0] == '\0') {
        va_start(ap, fmt);
        vsnprintf(s->err, sizeof(s->err), fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* ---- zero-copy completions --------------------------------------------------------------- */

/* Take the zero-copy completions queued on the socket's error queue. With wait, return only
 * once every send has its completion (or after FLOOR_TIMEOUT_S without one). */
static int zc_reap(stream_t *s, int wait)
{
    for (;;) {
        char control[256];
        struct msghdr msg = {.msg_control = control, .msg_controllen = sizeof(control)};
        struct cmsghdr *cm;
        ssize_t n = recvmsg(s->fd, &msg, MSG_ERRQUEUE | MSG_DONTWAIT);

        if (n < 0) {
            struct pollfd pfd = {.fd = s->fd, .events = 0};

            if ((errno != EAGAIN) && (errno != EWOULDBLOCK) && (errno != EINTR)) {
                return stream_fail(s, "recvmsg(MSG_ERRQUEUE): %s", strerror(errno));
            }
            if (!wait || (s->zc_done == s->zc_sent)) {
                return 0;
            }
            /* an error-queue entry shows as POLLERR */
            if (poll(&pfd, 1, FLOOR_TIMEOUT_S * 1000) == 0) {
                return stream_fail(s, "no zero-copy completion for %d s", FLOOR_TIMEOUT_S);
            }
            continue;
        }
        for (cm = CMSG_FIRSTHDR(&msg); cm != NULL; cm = CMSG_NXTHDR(&msg, cm)) {
            const struct sock_extended_err *ee = (const void *)CMSG_DATA(cm);

            if (!(((cm->cmsg_level == SOL_IP) && (cm->cmsg_type == IP_RECVERR)) ||
                  ((cm->cmsg_level == SOL_IPV6) && (cm->cmsg_type == IPV6_RECVERR)))) {
                continue;
            }
            if ((ee->ee_origin != SO_EE_ORIGIN_ZEROCOPY) || (ee->ee_errno != 0)) {
                return stream_fail(s, "error queue: origin %u errno %u", ee->ee_origin,
                                   ee->ee_errno);
            }
            /* one completion covers the sends numbered ee_info..ee_data */
            s->zc_done += (uint64_t)(ee->ee_data - ee->ee_info) + 1;
            if (ee->ee_code & SO_EE_CODE_ZEROCOPY_COPIED) {
                s->zc_copied += (uint64_t)(ee->ee_data - ee->ee_info) + 1;
            }
        }
    }
}

/* ---- waiting and moving whole messages ------------------------------------------------------ */

/* --wait epoll: the stream's own epoll set, created in the thread that waits on it. */
static int wait_open(stream_t *s)
{
    struct epoll_event ev = {.events = EPOLLIN};

    s->ep = -1;
    if (s->p->wait != WAIT_EPOLL) {
        return 0;
    }
    if (((s->ep = epoll_create1(0)) < 0) || (epoll_ctl(s->ep, EPOLL_CTL_ADD, s->fd, &ev) != 0)) {
        return stream_fail(s, "epoll: %s", strerror(errno));
    }
    s->ep_events = EPOLLIN;
    return 0;
}

static void wait_close(stream_t *s)
{
    if (s->ep >= 0) {
        close(s->ep);
        s->ep = -1;
    }
}

/* Sleep in epoll_wait until the socket is ready for events (EPOLLIN or EPOLLOUT). */
static int epoll_for(stream_t *s, uint32_t events)
{
    struct epoll_event ev = {.events = events};
    int r;

    if ((s->ep_events != events) && (epoll_ctl(s->ep, EPOLL_CTL_MOD, s->fd, &ev) != 0)) {
        return stream_fail(s, "epoll_ctl: %s", strerror(errno));
    }
    s->ep_events = events;
    do {
        r = epoll_wait(s->ep, &ev, 1, FLOOR_TIMEOUT_S * 1000);
    } while ((r < 0) && (errno == EINTR));
    if (r < 0) {
        return stream_fail(s, "epoll_wait: %s", strerror(errno));
    }
    return (r == 0) ? stream_fail(s, "the peer moved nothing for %d s", FLOOR_TIMEOUT_S) : 0;
}

/* --scatter: receive the rest of a message, done bytes of it in, into its blocks. */
static ssize_t recv_blocks(stream_t *s, size_t done, int flags)
{
    size_t b            = (size_t)s->p->scatter;
    size_t first        = done / b;
    struct iovec saved  = s->blocks[first];
    struct msghdr msg   = {.msg_iov = &s->blocks[first], .msg_iovlen = s->nblocks - first};
    ssize_t n;

    s->blocks[first].iov_base = (uint8_t *)saved.iov_base + done % b;
    s->blocks[first].iov_len  = saved.iov_len - done % b;
    n = recvmsg(s->fd, &msg, flags);
    s->blocks[first] = saved;
    return n;
}

/* --scatter: a message's blocks lie where xfer_perf's batch puts them (scatter.h). */
static int blocks_build(stream_t *s)
{
    size_t n      = (size_t)(s->p->size / s->p->scatter);
    size_t stride = (size_t)scatter_stride(n);

    s->blocks = calloc(n, sizeof(*s->blocks));
    if (s->blocks == NULL) {
        return stream_fail(s, "no memory for %zu blocks", n);
    }
    for (size_t i = 0; i < n; i++) {
        s->blocks[i].iov_base = s->buf + (i * stride % n) * s->p->scatter;
        s->blocks[i].iov_len  = (size_t)s->p->scatter;
    }
    s->nblocks = n;
    return 0;
}

/* Send (out) or receive len bytes of the stream's buffer, whole, waiting for the socket as
 * --wait says: block in the call (a receive with MSG_WAITALL), spin on MSG_DONTWAIT calls, or
 * sleep in epoll_wait (before each receive; after a send that found the socket full). With
 * --zerocopy, completions are reaped as they come, and one is waited for when the socket has no
 * option memory left for another send (ENOBUFS). Returns 0; 1 when a receive finds the stream
 * closed before the message's first byte; -1 on failure. */
static int move_all(stream_t *s, int out, size_t len)
{
    wait_t wait = (wait_t)s->p->wait;
    int flags = (wait != WAIT_BLOCK) ? MSG_DONTWAIT : out ? 0 : MSG_WAITALL;
    const char *call = out ? "send" : "recv";
    size_t done = 0;
    unsigned spins = 0;
    double deadline = 0;

    flags |= out ? (MSG_NOSIGNAL | (s->p->zerocopy ? MSG_ZEROCOPY : 0)) : 0;
    while (done < len) {
        ssize_t n;

        if (!out && (wait == WAIT_EPOLL) && (epoll_for(s, EPOLLIN) != 0)) {
            return -1;
        }
        n = out                 ? send(s->fd, s->buf + done, len - done, flags) :
            (s->blocks != NULL) ? recv_blocks(s, done, flags) :
                                  recv(s->fd, s->buf + done, len - done, flags);
        if (n > 0) {
            done     += (size_t)n;
            s->bytes += (uint64_t)n;
            spins     = 0;
            deadline  = 0;
            if (out && s->p->zerocopy) {
                s->zc_sent++;
                if (zc_reap(s, 0) != 0) {
                    return -1;
                }
            }
            continue;
        }
        if (n == 0) {
            return (done == 0) ? 1 : stream_fail(s, "the stream ended inside a message "
                                                 "(%zu of %zu bytes)", done, len);
        }
        if (errno == EINTR) {
            continue;
        }
        if (out && (errno == ENOBUFS) && s->p->zerocopy) {
            struct pollfd pfd = {.fd = s->fd, .events = 0};    /* the error queue: POLLERR */

            if (poll(&pfd, 1, FLOOR_TIMEOUT_S * 1000) == 0) {
                return stream_fail(s, "send: ENOBUFS and no zero-copy completion for %d s",
                                   FLOOR_TIMEOUT_S);
            }
            continue;
        }
        if ((errno != EAGAIN) && (errno != EWOULDBLOCK)) {
            return stream_fail(s, "%s: %s", call, strerror(errno));
        }
        if (wait == WAIT_BLOCK) {       /* SO_RCVTIMEO / SO_SNDTIMEO ran out */
            return stream_fail(s, "%s: the peer moved nothing for %d s", call, FLOOR_TIMEOUT_S);
        }
        if ((wait == WAIT_EPOLL) && out && (epoll_for(s, EPOLLOUT) != 0)) {
            return -1;
        }
        /* poll: spin, looking at the clock only now and then */
        if ((wait == WAIT_POLL) && ((++spins & 0xfffu) == 0)) {
            if (deadline == 0) {
                deadline = floor_now_sec() + FLOOR_TIMEOUT_S;
            } else if (floor_now_sec() > deadline) {
                return stream_fail(s, "%s: the peer moved nothing for %d s", call,
                                   FLOOR_TIMEOUT_S);
            }
        }
    }
    return 0;
}

/* ---- bw ------------------------------------------------------------------------------------ */

void *floor_bw_sender(void *arg)
{
    stream_t *s = arg;
    size_t len = (size_t)s->p->size;

    pthread_barrier_wait(s->start);
    if (wait_open(s) != 0) {
        return NULL;
    }
    for (uint64_t i = 0; (s->p->secs > 0) ? (floor_now_sec() < s->deadline) : (i < s->msgs);
         i++) {
        if (move_all(s, 1, len) != 0) {
            goto out;
        }
    }
    if (s->p->zerocopy && (zc_reap(s, 1) != 0)) {
        goto out;
    }
    /* the receiver reads until this end of the stream */
    if (shutdown(s->fd, SHUT_WR) != 0) {
        stream_fail(s, "shutdown: %s", strerror(errno));
    }
out:
    wait_close(s);
    return NULL;
}

/* Receive whole messages into one buffer (or its scattered blocks) until the sender closes
 * its end. */
void *floor_bw_receiver(void *arg)
{
    stream_t *s = arg;
    size_t len = (size_t)s->p->size;

    pthread_barrier_wait(s->start);
    if ((wait_open(s) == 0) && ((s->p->scatter == 0) || (blocks_build(s) == 0))) {
        while (move_all(s, 0, len) == 0) {
        }
    }
    wait_close(s);
    free(s->blocks);
    s->blocks = NULL;
    return NULL;
}

/* Run one thread per stream; the caller's part of the start barrier is returned through
 * t0_p (the time the threads were let go). */
int floor_run_streams(stream_t *st, unsigned n, void *(*fn)(void *), double *t0_p)
{
    pthread_t tid[FLOOR_MAX_STREAMS];
    pthread_barrier_t start;
    unsigned started = 0;
    int ret = 0;

    pthread_barrier_init(&start, NULL, n + 1);
    for (; started < n; started++) {
        st[started].start = &start;
        if (pthread_create(&tid[started], NULL, fn, &st[started]) != 0) {
            fprintf(stderr, "tcp_floor: pthread_create failed\n");
            /* the threads already started wait at the barrier: they cannot be let go short */
            exit(1);
        }
    }
    *t0_p = floor_now_sec();
    pthread_barrier_wait(&start);
    for (unsigned i = 0; i < n; i++) {
        pthread_join(tid[i], NULL);
        if (st[i].err[0] != '\0') {
            fprintf(stderr, "tcp_floor: stream %u: %s\n", i, st[i].err);
            ret = -1;
        }
    }
    pthread_barrier_destroy(&start);
    return ret;
}

/* ---- lat ----------------------------------------------------------------------------------- */

/* The ping-pong; the client (with rtt) times each round trip after the warm-up. */
int floor_lat_run(stream_t *s, double *rtt)
{
    uint64_t total = s->p->warmup + s->p->iters;
    size_t len = (size_t)s->p->size;
    int ret = -1, r;

    if (wait_open(s) != 0) {
        goto out;
    }
    for (uint64_t i = 0; i < total; i++) {
        double t0 = floor_now_sec();

        if ((rtt != NULL) && (move_all(s, 1, len) != 0)) {
            goto out;
        }
        r = move_all(s, 0, len);
        if (r != 0) {
            if (r == 1) {
                stream_fail(s, "the peer closed the connection");
            }
            goto out;
        }
        if (rtt == NULL) {
            if (move_all(s, 1, len) != 0) {
                goto out;
            }
        } else if (i >= s->p->warmup) {
            rtt[i - s->p->warmup] = floor_now_sec() - t0;
        }
    }
    ret = 0;
out:
    wait_close(s);
    if (s->err[0] != '\0') {
        fprintf(stderr, "tcp_floor: %s\n", s->err);
    }
    return ret;
}
