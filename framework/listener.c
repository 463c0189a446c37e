/*
 * The listener: its listening sockets and the server's side of the handshakes in progress on
 * them (each a state machine over its own non-blocking socket, handshake.c, with its own
 * deadline: XFER_BOOTSTRAP_TIMEOUT from its accept).
 *
 * xfer_accept() takes the connections that wait, moves every handshake whose socket is ready,
 * and returns the first endpoint that completes; the others go on in later calls, so that a
 * silent or slow client delays nobody. Each of its passes progresses the transports too
 * (their completions wait for the next xfer_progress(); no callback runs in xfer_accept()),
 * so that what they listen on - tcp's lane port - is drained while a server accepts a burst.
 * A handshake that fails or passes its deadline is closed with one log line naming the peer
 * and the reason, and the listener goes on.
 *
 * xfer_listener_fd() is an epoll set holding the listening socket, every handshake's socket
 * (watched for what its state waits for) and a timerfd armed at the nearest deadline: it is
 * readable whenever xfer_accept() has something to do.
 *
 * Everything here runs under the context lock and nothing blocks; xfer_accept() sleeps on the
 * epoll set without it.
 */
#include "listener.h"
#include "sock.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>

/* Events taken from the epoll set in one pass; the rest wait for the next (level-triggered). */
#define PASS_EVENTS 64
/* fds xfer_accept() sleeps on: the listener's set and the transports' */
#define ACCEPT_FDS  16
/* Outside xfer_accept() the listeners get a pass at most once a millisecond, the clock read
 * every DRAIN_EVERY progress calls: a pass costs system calls, which a loop that spins on a
 * transport without them (verbs, shm) must not pay every few round trips (over verbs in the
 * guest, one pass per 64 calls made an 8-byte tag round trip 1.18x slower), and the kernel's
 * backlog, SOMAXCONN, holds what comes meanwhile. */
#define DRAIN_EVERY 64
/* ms a sleeping context wakes after, to move handshakes in progress outside xfer_accept() */
#define DRAIN_SLEEP_MS 50

/* ---- the listener's pass --------------------------------------------------------------------- */

/* Keep the first failure of a pass: it is what xfer_accept() returns if nothing completes. */
static void first_failure(xfer_status_t *result, xfer_status_t status)
{
    if ((*result == XFER_INPROGRESS) && (status != XFER_OK) && (status != XFER_INPROGRESS)) {
        *result = status;
    }
}

/*
 * Take the connections that wait. At the bound, a new connection closes the oldest handshake
 * in progress. The other choices are worse: not accepting leaves a good client in the kernel's
 * backlog behind MAX_PENDING silent ones for a whole XFER_BOOTSTRAP_TIMEOUT, long enough for its
 * own handshake to time out; closing the newest refuses every client while the flood lasts.
 * Closing the oldest keeps what is held bounded and lets a new client in: to push it out
 * again, a flood must open MAX_PENDING connections within the round trips of its handshake.
 */
static xfer_status_t accept_waiting(xfer_listener_t *l, int64_t now, int drain)
{
    xfer_status_t result = XFER_INPROGRESS, status;
    char why[256], peer[80];
    handshake_t *oldest;
    int fd;

    /* at most a bound's worth per pass, so that a flood cannot hold the pass here; outside
     * xfer_accept() (drain) only while there is room: the kernel's backlog holds the rest */
    for (unsigned i = 0; i < l->max_pending; i++) {
        if (drain && (l->num_pending >= l->max_pending)) {
            break;
        }
        status = XFER_INPROGRESS;
        for (unsigned k = 0; (k < l->num_fds) && (status == XFER_INPROGRESS); k++) {
            /* the sockets take turns being asked first, so that none waits behind another */
            unsigned s = (l->next_fd + k) % l->num_fds;

            status = xfer_sock_accept(l->fds[s], &fd, peer, sizeof(peer), why, sizeof(why));
            if (status != XFER_INPROGRESS) {
                l->next_fd = (s + 1) % l->num_fds;
            }
        }
        if (status == XFER_INPROGRESS) {
            break;
        }
        if (status != XFER_OK) {
            xfer_log(XFER_LOG_WARN, XFER_BOOT_SUBSYS, "accept on port %u: %s", l->port, why);
            first_failure(&result, status);
            break;
        }
        if (l->num_pending >= l->max_pending) {
            oldest = ucs_list_head(&l->pending, handshake_t, list);
            snprintf(why, sizeof(why), "%u handshakes in progress, the most "
                     "XFER_BOOTSTRAP_MAX_PENDING allows; the oldest (%s after %lld ms) makes "
                     "room for a new one from %s", l->num_pending,
                     hs_waiting_for[oldest->state],
                     (long long)(now - (oldest->deadline - l->timeout_ms)), peer);
            hs_fail(l, oldest, XFER_ERR_NO_RESOURCE, why, XFER_LOG_WARN);
            first_failure(&result, XFER_ERR_NO_RESOURCE);
        }
        first_failure(&result, hs_start(l, fd, peer, now));
    }
    return result;
}

/* Close the handshakes past their deadline: the oldest ones, since all have the same time. */
static void expire(xfer_listener_t *l, int64_t now, xfer_status_t *result)
{
    handshake_t *hs, *tmp;
    char why[256];

    ucs_list_for_each_safe(hs, tmp, &l->pending, list) {
        if (hs->deadline > now) {
            break;
        }
        snprintf(why, sizeof(why), "no handshake within XFER_BOOTSTRAP_TIMEOUT=%gs, still %s",
                 (double)l->timeout_ms / 1000.0, hs_waiting_for[hs->state]);
        hs_fail(l, hs, XFER_ERR_TIMEOUT, why, XFER_LOG_WARN);
        first_failure(result, XFER_ERR_TIMEOUT);
    }
}

/* Arm the timer at the nearest deadline (or disarm it), so that the epoll set becomes
 * readable when a handshake is due to be closed. */
static void timer_arm(xfer_listener_t *l)
{
    struct itimerspec its = {{0, 0}, {0, 0}};
    int64_t at = 0;

    if (!ucs_list_is_empty(&l->pending)) {
        at = ucs_list_head(&l->pending, handshake_t, list)->deadline;
    }
    if (at == l->timer_at) {
        return;
    }
    if (at != 0) {
        its.it_value.tv_sec  = at / 1000;
        its.it_value.tv_nsec = (long)(at % 1000) * 1000000L;
    }
    if (timerfd_settime(l->timer_fd, TFD_TIMER_ABSTIME, &its, NULL) != 0) {
        xfer_log(XFER_LOG_WARN, XFER_BOOT_SUBSYS, "listener on port %u: timerfd_settime: %s; "
                 "deadlines are checked only when xfer_accept() is called", l->port,
                 strerror(errno));
        return;
    }
    l->timer_at = at;
}

/* One pass: accept, move every handshake whose socket is ready, close the expired ones.
 * XFER_OK with *ep_p, XFER_INPROGRESS when nothing finished, or the first failure. A pass
 * from progress (drain) keeps what completes in l->done and stops when that is full. */
static xfer_status_t listener_pass(xfer_listener_t *l, xfer_endpoint_t **ep_p, int drain)
{
    struct epoll_event ev[PASS_EVENTS];
    xfer_status_t result, status;
    uint64_t ticks;
    int n;

    if (!drain && (l->num_done > 0)) {
        *ep_p = l->done[--l->num_done];
        return XFER_OK;
    }
    result = accept_waiting(l, xfer_now_ms(), drain);
    n      = epoll_wait(l->epfd, ev, PASS_EVENTS, 0);
    for (int i = 0; i < n; i++) {
        if (ev[i].data.ptr == NULL) {
            continue;               /* the listening socket: accept_waiting() took them */
        }
        if (ev[i].data.ptr == &l->timer_fd) {
            (void)!read(l->timer_fd, &ticks, sizeof(ticks));
            l->timer_at = 0;        /* fired: arm it again below */
            continue;
        }
        if (drain && (l->num_done >= l->max_pending)) {
            break;                  /* the rest wait for xfer_accept() */
        }
        status = hs_progress(l, ev[i].data.ptr, ep_p);
        if ((status == XFER_OK) && drain) {
            l->done[l->num_done++] = *ep_p;
            continue;
        }
        if (status == XFER_OK) {
            result = XFER_OK;
            break;                  /* the other events stay pending for the next call */
        }
        first_failure(&result, status);
    }
    expire(l, xfer_now_ms(), &result);
    timer_arm(l);
    return result;
}

/* The listeners' hook: a pass of each once a millisecond (DRAIN_EVERY), so that handshakes
 * move and the listening socket drains while the application is anywhere in xfer. */
static unsigned listeners_drain(xfer_context_t *ctx)
{
    xfer_listener_t *l;
    xfer_endpoint_t *ep;
    unsigned count = 0;
    int64_t now;

    if (++ctx->listen_polls < DRAIN_EVERY) {
        return 0;
    }
    ctx->listen_polls = 0;
    now               = xfer_now_ms();
    if (now == ctx->listen_pass_ms) {
        return 0;
    }
    ctx->listen_pass_ms = now;
    ucs_list_for_each(l, &ctx->listeners, list) {
        unsigned before = l->num_done + l->num_pending;

        (void)listener_pass(l, &ep, 1);
        count += (l->num_done + l->num_pending != before);
    }
    return count;
}

/* A sleeping context wakes now and then while handshakes are in progress. */
static int listeners_timeout(xfer_context_t *ctx)
{
    xfer_listener_t *l;

    ucs_list_for_each(l, &ctx->listeners, list) {
        if (l->num_pending > 0) {
            return DRAIN_SLEEP_MS;
        }
    }
    return -1;
}

/* ---- the API --------------------------------------------------------------------------------- */

static xfer_status_t watch(int epfd, int fd, void *ptr, char *why, size_t why_size)
{
    struct epoll_event ev = {0};

    ev.events   = EPOLLIN;
    ev.data.ptr = ptr;
    if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        snprintf(why, why_size, "epoll_ctl(ADD): %s", strerror(errno));
        return XFER_ERR_NO_RESOURCE;
    }
    return XFER_OK;
}

static void listener_free(xfer_listener_t *l)
{
    handshake_t *hs, *tmp;

    ucs_list_for_each_safe(hs, tmp, &l->pending, list) {
        hs_fail(l, hs, XFER_ERR_CANCELED, "the listener closes", XFER_LOG_DEBUG);
    }
    /* completed, never returned: the peers see their endpoints closed */
    while (l->num_done > 0) {
        (void)xfer_endpoint_close_nb(l->done[--l->num_done], XFER_CLOSE_FLAG_FORCE, NULL, NULL,
                                     NULL);
    }
    free(l->done);
    if (l->timer_fd >= 0) {
        close(l->timer_fd);
    }
    if (l->epfd >= 0) {
        close(l->epfd);
    }
    while (l->num_fds > 0) {
        close(l->fds[--l->num_fds]);
    }
    free(l->offer);
    free(l->hello);
    free(l);
}

/* A socket of l that other hosts may reach: bound off loopback. */
static int reaches_other_hosts(const xfer_listener_t *l)
{
    for (unsigned i = 0; i < l->num_fds; i++) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof(ss);

        if (getsockname(l->fds[i], (struct sockaddr*)&ss, &len) != 0) {
            continue;
        }
        if ((ss.ss_family == AF_INET) &&
            ((ntohl(((struct sockaddr_in*)&ss)->sin_addr.s_addr) >> 24) != 127)) {
            return 1;
        }
        if ((ss.ss_family == AF_INET6) &&
            !IN6_IS_ADDR_LOOPBACK(&((struct sockaddr_in6*)&ss)->sin6_addr)) {
            return 1;
        }
    }
    return 0;
}

/* A listener other hosts reach, in a process without a key, says so - once per process. */
static void unauthenticated_say_once(const xfer_listener_t *l, const char *address)
{
    static int said;

    if (xfer_auth_enabled(l->ctx) || !reaches_other_hosts(l) ||
        __atomic_exchange_n(&said, 1, __ATOMIC_RELAXED)) {
        return;
    }
    xfer_log(XFER_LOG_WARN, XFER_BOOT_SUBSYS, "listening on %s, which other hosts reach, "
             "without a key: any peer that reaches it may connect, fetch what this process "
             "publishes and use the keys it hands out (XFER_AUTH_KEY_FILE sets a key)",
             address);
}

/* A name that resolves to several addresses is listened on at each (XFER_LISTEN_SOCKS_MAX
 * at most), on one port: ":port" is loopback and "*:port" every interface, in both
 * families where the host has them. */
xfer_status_t xfer_listen(xfer_context_t *ctx, const char *address, xfer_listener_t **listener_p)
{
    xfer_listener_t *l;
    xfer_status_t status;
    char why[256];

    if ((ctx == NULL) || (listener_p == NULL)) {
        return XFER_ERR_INVALID_PARAM;
    }
    l = calloc(1, sizeof(*l));
    if (l == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    l->ctx         = ctx;
    l->epfd        = -1;
    l->timer_fd    = -1;
    l->max_pending = (unsigned)ctx->fw_config.bootstrap_max_pending;
    l->timeout_ms  = (int64_t)(ctx->fw_config.bootstrap_timeout * 1000.0);
    ucs_list_head_init(&l->pending);
    status = xfer_sock_listen_at(address, l->fds, XFER_LISTEN_SOCKS_MAX, &l->num_fds, &l->port,
                                 why, sizeof(why));
    if (status != XFER_OK) {
        goto err_free;
    }
    l->done      = calloc(l->max_pending ? l->max_pending : 1, sizeof(*l->done));
    l->offer     = malloc(sizeof(*l->offer));
    l->hello     = malloc(XFER_WIRE_HELLO_FRAME_MAX);
    l->hello_len = XFER_WIRE_HELLO_FRAME_MAX;
    if ((l->offer == NULL) || (l->hello == NULL) || (l->done == NULL)) {
        snprintf(why, sizeof(why), "out of memory");
        status = XFER_ERR_NO_MEMORY;
        goto err_free;
    }
    xfer_boot_offer_build(ctx, l->offer);
    status = xfer_wire_pack_hello(l->offer, l->hello, &l->hello_len);
    if (status != XFER_OK) {
        snprintf(why, sizeof(why), "cannot pack HELLO: %s", xfer_status_string(status));
        goto err_free;
    }
    l->epfd     = epoll_create1(EPOLL_CLOEXEC);
    l->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if ((l->epfd < 0) || (l->timer_fd < 0)) {
        snprintf(why, sizeof(why), "%s: %s", (l->epfd < 0) ? "epoll_create1" : "timerfd_create",
                 strerror(errno));
        status = XFER_ERR_NO_RESOURCE;
        goto err_free;
    }
    status = XFER_OK;
    for (unsigned i = 0; (i < l->num_fds) && (status == XFER_OK); i++) {
        status = watch(l->epfd, l->fds[i], NULL, why, sizeof(why));
    }
    if (status == XFER_OK) {
        status = watch(l->epfd, l->timer_fd, &l->timer_fd, why, sizeof(why));
    }
    if (status != XFER_OK) {
        goto err_free;
    }
    xfer_ctx_lock(ctx);
    ucs_list_add_tail(&ctx->listeners, &l->list);
    xfer_progress_hook_add(ctx, &ctx->listen_hook, listeners_drain, listeners_timeout, NULL);
    xfer_ctx_unlock(ctx);
    xfer_log(XFER_LOG_DEBUG, XFER_BOOT_SUBSYS, "listening on %s (port %u, %u socket%s)",
             address, l->port, l->num_fds, (l->num_fds == 1) ? "" : "s");
    unauthenticated_say_once(l, address);
    *listener_p = l;
    return XFER_OK;

err_free:
    xfer_refuse(XFER_BOOT_SUBSYS, "listen on %s: %s", address, why);
    listener_free(l);
    return status;
}

uint16_t xfer_listener_port(const xfer_listener_t *listener)
{
    return listener ? listener->port : 0;
}

int xfer_listener_fd(const xfer_listener_t *listener)
{
    return listener ? listener->epfd : -1;
}

void xfer_listener_close(xfer_listener_t *listener)
{
    xfer_context_t *ctx;

    if (listener != NULL) {
        ctx = listener->ctx;
        xfer_ctx_lock(ctx);
        ucs_list_del(&listener->list);
        if (ucs_list_is_empty(&ctx->listeners)) {
            xfer_progress_hook_del(ctx, &ctx->listen_hook);
        }
        listener_free(listener);
        xfer_ctx_unlock(ctx);
    }
}

void xfer_listeners_close_all(xfer_context_t *ctx)
{
    xfer_listener_t *l, *tmp;

    xfer_progress_hook_del(ctx, &ctx->listen_hook);
    ucs_list_for_each_safe(l, tmp, &ctx->listeners, list) {
        ucs_list_del(&l->list);
        listener_free(l);
    }
}

xfer_status_t xfer_accept(xfer_listener_t *listener, int timeout_ms, xfer_endpoint_t **ep_p)
{
    struct pollfd pfd[ACCEPT_FDS];
    xfer_context_t *ctx;
    xfer_status_t status;
    int64_t until, left;
    int n;

    if ((listener == NULL) || (ep_p == NULL)) {
        return XFER_ERR_INVALID_PARAM;
    }
    ctx = listener->ctx;
    if (xfer_in_callback && (timeout_ms != 0)) {
        xfer_log(XFER_LOG_ERROR, XFER_BOOT_SUBSYS, "xfer_accept with a timeout from a "
                 "callback, which must not wait; use a timeout of 0");
        return XFER_ERR_BUSY;
    }
    until = (timeout_ms < 0) ? INT64_MAX : xfer_now_ms() + timeout_ms;
    xfer_ctx_lock(ctx);
    status = xfer_api_check(ctx, "xfer_accept", 1);
    if (status != XFER_OK) {
        xfer_ctx_unlock(ctx);
        return status;
    }
    for (;;) {
        /* the transports' own listening sockets too (tcp's lane port): the peers accepted
         * before connect their lanes while this side is still here */
        (void)xfer_progress_transports_locked(ctx);
        status = listener_pass(listener, ep_p, 0);
        if (status != XFER_INPROGRESS) {
            break;
        }
        left = until - xfer_now_ms();
        if (left <= 0) {
            status = XFER_ERR_TIMEOUT;
            break;
        }
        /* sleep on the set and the transports' fds, without the lock: the other threads use
         * the context meanwhile. A transport with work now: a look again within a ms. */
        pfd[0].fd      = listener->epfd;
        pfd[0].events  = POLLIN;
        pfd[0].revents = 0;
        n = xfer_transports_wait_fds(ctx, pfd + 1, ACCEPT_FDS - 1);
        if ((n < 0) && (left > 1)) {
            left = 1;
        }
        xfer_ctx_unlock(ctx);
        (void)poll(pfd, (nfds_t)((n > 0) ? n + 1 : 1), (int)((left > 1000000) ? 1000000 : left));
        xfer_ctx_lock(ctx);
    }
    xfer_ctx_unlock(ctx);
    return status;
}
