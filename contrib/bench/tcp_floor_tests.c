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

/* ---- bw ------------------------------------------------------------------------------------ */

/* Send one whole message; with --zerocopy, reap completions as they come and wait for one when
 * the socket has no option memory left for another (ENOBUFS). */
static int send_msg(stream_t *s)
{
    int flags = MSG_NOSIGNAL | (s->p->zerocopy ? MSG_ZEROCOPY : 0);
    size_t done = 0, len = (size_t)s->p->size;

    while (done < len) {
        ssize_t n = send(s->fd, s->buf + done, len - done, flags);

        if (n > 0) {
            done     += (size_t)n;
            s->bytes += (uint64_t)n;
            s->zc_sent += s->p->zerocopy ? 1 : 0;
        } else if ((n < 0) && (errno == ENOBUFS) && s->p->zerocopy) {
            struct pollfd pfd = {.fd = s->fd, .events = 0};

            if (poll(&pfd, 1, FLOOR_TIMEOUT_S * 1000) == 0) {
                return stream_fail(s, "send: ENOBUFS and no zero-copy completion for %d s",
                                   FLOOR_TIMEOUT_S);
            }
        } else if ((n < 0) && (errno == EINTR)) {
            continue;
        } else {
            return stream_fail(s, "send: %s", ((n < 0) && (errno == EAGAIN)) ?
                               "peer took nothing for 10 s" : strerror(errno));
        }
        if (s->p->zerocopy && (zc_reap(s, 0) != 0)) {
            return -1;
        }
    }
    return 0;
}

void *floor_bw_sender(void *arg)
{
    stream_t *s = arg;
    uint64_t i;

    pthread_barrier_wait(s->start);
    for (i = 0; (s->p->secs > 0) ? (floor_now_sec() < s->deadline) : (i < s->msgs); i++) {
        if (send_msg(s) != 0) {
            return NULL;
        }
    }
    if (s->p->zerocopy && (zc_reap(s, 1) != 0)) {
        return NULL;
    }
    /* the receiver reads until this end of the stream */
    if (shutdown(s->fd, SHUT_WR) != 0) {
        stream_fail(s, "shutdown: %s", strerror(errno));
    }
    return NULL;
}

/* Receive whole messages into one buffer until the sender closes its end. */
void *floor_bw_receiver(void *arg)
{
    stream_t *s = arg;
    size_t len = (size_t)s->p->size;

    pthread_barrier_wait(s->start);
    for (;;) {
        ssize_t n = recv(s->fd, s->buf, len, MSG_WAITALL);

        if ((n < 0) && (errno == EINTR)) {
            continue;
        }
        if (n < 0) {
            stream_fail(s, "recv: %s", ((errno == EAGAIN) || (errno == EWOULDBLOCK)) ?
                        "nothing from the sender for 10 s" : strerror(errno));
            return NULL;
        }
        s->bytes += (uint64_t)n;
        if (n == 0) {
            return NULL;
        }
        if ((size_t)n != len) {
            stream_fail(s, "the stream ended inside a message (%zd of %zu bytes)", n, len);
            return NULL;
        }
    }
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

/* Wait for and take len bytes, as --wait says. */
static int lat_recv(stream_t *s, int ep, size_t len)
{
    size_t got = 0;
    double deadline = 0;
    unsigned spins = 0;

    while (got < len) {
        ssize_t n;

        if (s->p->wait == WAIT_EPOLL) {
            struct epoll_event ev;
            int r = epoll_wait(ep, &ev, 1, FLOOR_TIMEOUT_S * 1000);

            if ((r < 0) && (errno != EINTR)) {
                return stream_fail(s, "epoll_wait: %s", strerror(errno));
            }
            if (r == 0) {
                return stream_fail(s, "nothing from the peer for %d s", FLOOR_TIMEOUT_S);
            }
        }
        n = recv(s->fd, s->buf + got, len - got,
                 (s->p->wait == WAIT_BLOCK) ? MSG_WAITALL : MSG_DONTWAIT);
        if (n > 0) {
            got += (size_t)n;
            continue;
        }
        if (n == 0) {
            return stream_fail(s, "the peer closed the connection");
        }
        if (errno == EINTR) {
            continue;
        }
        if ((errno != EAGAIN) && (errno != EWOULDBLOCK)) {
            return stream_fail(s, "recv: %s", strerror(errno));
        }
        if (s->p->wait == WAIT_BLOCK) {
            return stream_fail(s, "nothing from the peer for %d s", FLOOR_TIMEOUT_S);
        }
        /* poll: spin; look at the clock only now and then */
        if ((s->p->wait == WAIT_POLL) && ((++spins & 0xfffu) == 0)) {
            if (deadline == 0) {
                deadline = floor_now_sec() + FLOOR_TIMEOUT_S;
            } else if (floor_now_sec() > deadline) {
                return stream_fail(s, "nothing from the peer for %d s", FLOOR_TIMEOUT_S);
            }
        }
    }
    return 0;
}

static int lat_send(stream_t *s, size_t len)
{
    size_t done = 0;

    while (done < len) {
        ssize_t n = send(s->fd, s->buf + done, len - done, MSG_NOSIGNAL);

        if (n > 0) {
            done += (size_t)n;
        } else if ((n < 0) && (errno == EINTR)) {
            continue;
        } else {
            return stream_fail(s, "send: %s", strerror(errno));
        }
    }
    return 0;
}

/* The ping-pong; the client (with rtt) times each round trip after the warm-up. */
int floor_lat_run(stream_t *s, double *rtt)
{
    uint64_t total = s->p->warmup + s->p->iters;
    size_t len = (size_t)s->p->size;
    int ep = -1, ret = -1;

    if (s->p->wait == WAIT_EPOLL) {
        struct epoll_event ev = {.events = EPOLLIN};

        if (((ep = epoll_create1(0)) < 0) || (epoll_ctl(ep, EPOLL_CTL_ADD, s->fd, &ev) != 0)) {
            stream_fail(s, "epoll: %s", strerror(errno));
            goto out;
        }
    }
    for (uint64_t i = 0; i < total; i++) {
        double t0 = floor_now_sec();

        if (rtt != NULL) {
            if ((lat_send(s, len) != 0) || (lat_recv(s, ep, len) != 0)) {
                goto out;
            }
            if (i >= s->p->warmup) {
                rtt[i - s->p->warmup] = floor_now_sec() - t0;
            }
        } else if ((lat_recv(s, ep, len) != 0) || (lat_send(s, len) != 0)) {
            goto out;
        }
    }
    ret = 0;
out:
    if (ep >= 0) {
        close(ep);
    }
    if (s->err[0] != '\0') {
        fprintf(stderr, "tcp_floor: %s\n", s->err);
    }
    return ret;
}
