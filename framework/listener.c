/*
 * The listener: a listening socket and the server's side of the handshakes in progress on
 * it. Each handshake is a state machine over its own non-blocking socket, with its own
 * deadline (XFER_BOOTSTRAP_TIMEOUT from its accept):
 *
 *   HELLO_IN     read the client's HELLO, from as many reads as it takes
 *   REPLY_OUT    send our HELLO and either ACCEPT and our CONNECT (the chosen transport's
 *                endpoint is created on the socket first) or REJECT saying why
 *   CONNECT_IN   read the client's CONNECT and connect the endpoint: done
 *
 * xfer_accept() takes the connections that wait, moves every handshake whose socket is ready,
 * and returns the first endpoint that completes; the others go on in later calls, so that a
 * silent or slow client delays nobody. Each of its passes progresses the transports too
 * (their completions wait for the next xfer_progress(); no callback runs in xfer_accept()),
 * so that what they listen on - tcp's lane port - is drained while a server accepts a burst. A handshake that fails or passes its deadline is closed
 * with one log line naming the peer and the reason, and the listener goes on.
 *
 * xfer_listener_fd() is an epoll set holding the listening socket, every handshake's socket
 * (watched for what its state waits for) and a timerfd armed at the nearest deadline: it is
 * readable whenever xfer_accept() has something to do.
 *
 * Everything here runs under the context lock and nothing blocks; xfer_accept() sleeps on the
 * epoll set without it.
 */
#include "bootstrap.h"
#include "clock.h"
#include "sock.h"

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

/* A listen takes at most this many sockets: both families of loopback or of every interface,
 * or the first addresses a name resolves to. */
#define XFER_LISTEN_SOCKS_MAX 4

typedef enum { HS_HELLO_IN, HS_REPLY_OUT, HS_CONNECT_IN } hs_state_t;

static const char *const hs_waiting_for[] = {
    [HS_HELLO_IN]   = "waiting for its HELLO",
    [HS_REPLY_OUT]  = "waiting for it to read our reply",
    [HS_CONNECT_IN] = "waiting for its CONNECT",
};

typedef struct handshake {
    ucs_list_link_t list;       /* listener->pending: oldest, so nearest deadline, first */
    int             fd;
    hs_state_t      state;
    uint32_t        events;     /* what the epoll set watches on fd */
    int64_t         deadline;   /* xfer_now_ms() */
    char            peer[80];
    xfer_boot_rx_t  rx;
    uint8_t         *out;       /* our reply: out_len bytes, out_sent of them sent */
    size_t          out_len;
    size_t          out_sent;
    xfer_status_t   refused;    /* the reply ends in a REJECT: the status it carries */
    char            *refusal;   /* and its reason */
    xfer_endpoint_t *ep;        /* prepared, waiting for the client's CONNECT */
} handshake_t;

struct xfer_listener {
    xfer_context_t    *ctx;
    ucs_list_link_t   list;         /* ctx->listeners: closed at context destroy */
    int               fds[XFER_LISTEN_SOCKS_MAX];  /* the listening sockets, one per address */
    unsigned          num_fds;
    unsigned          next_fd;      /* the socket accept_waiting() asks first */
    int               epfd;         /* xfer_listener_fd() */
    int               timer_fd;     /* fires at the nearest handshake deadline */
    int64_t           timer_at;     /* the deadline it is armed for; 0: disarmed */
    uint16_t          port;
    ucs_list_link_t   pending;      /* handshake_t */
    unsigned          num_pending;
    unsigned          max_pending;  /* XFER_BOOTSTRAP_MAX_PENDING */
    int64_t           timeout_ms;   /* XFER_BOOTSTRAP_TIMEOUT */
    xfer_endpoint_t   **done;       /* completed outside xfer_accept(), for it to return */
    unsigned          num_done;     /* at most max_pending */
    xfer_wire_hello_t *offer;       /* what we offer, the same to every client */
    uint8_t           *hello;       /* ... packed as our HELLO frame */
    size_t            hello_len;
};

/* ---- one handshake --------------------------------------------------------------------------- */

static void hs_free(xfer_listener_t *l, handshake_t *hs)
{
    /* a transport may hold a dup of fd: the epoll set would keep watching it after close */
    epoll_ctl(l->epfd, EPOLL_CTL_DEL, hs->fd, NULL);
    if (hs->ep != NULL) {
        xfer_endpoint_discard(hs->ep);
    }
    close(hs->fd);
    xfer_boot_rx_cleanup(&hs->rx);
    free(hs->out);
    free(hs->refusal);
    ucs_list_del(&hs->list);
    l->num_pending--;
    free(hs);
}

static void hs_fail(xfer_listener_t *l, handshake_t *hs, xfer_status_t status, const char *why,
                    xfer_log_level_t level)
{
    if (level <= XFER_LOG_WARN) {       /* the peer's doing: a flood is logged at a bound */
        xfer_log_peer("handshake_refused", level, XFER_BOOT_SUBSYS, "closing connection from "
                      "%s: %s (%s)", hs->peer, why, xfer_status_string(status));
    } else {
        xfer_log(level, XFER_BOOT_SUBSYS, "closing connection from %s: %s (%s)", hs->peer, why,
                 xfer_status_string(status));
    }
    hs_free(l, hs);
}

/* Watch fd for what the state waits for: room to send the reply, or bytes to read. */
static xfer_status_t hs_watch(xfer_listener_t *l, handshake_t *hs, char *why, size_t why_size)
{
    struct epoll_event ev = {0};

    ev.events   = (hs->state == HS_REPLY_OUT) ? EPOLLOUT : EPOLLIN;
    ev.data.ptr = hs;
    if (ev.events == hs->events) {
        return XFER_OK;
    }
    if (epoll_ctl(l->epfd, EPOLL_CTL_MOD, hs->fd, &ev) != 0) {
        snprintf(why, why_size, "epoll_ctl(MOD): %s", strerror(errno));
        return XFER_ERR_IO;
    }
    hs->events = ev.events;
    return XFER_OK;
}

/* Our reply: our HELLO followed by the frames in [frames, frames + len). */
static xfer_status_t hs_reply_set(xfer_listener_t *l, handshake_t *hs, const uint8_t *frames,
                                  size_t len, char *why, size_t why_size)
{
    hs->out = malloc(l->hello_len + len);
    if (hs->out == NULL) {
        snprintf(why, why_size, "out of memory for a %zu-byte reply", l->hello_len + len);
        return XFER_ERR_NO_MEMORY;
    }
    memcpy(hs->out, l->hello, l->hello_len);
    memcpy(hs->out + l->hello_len, frames, len);
    hs->out_len  = l->hello_len + len;
    hs->out_sent = 0;
    hs->state    = HS_REPLY_OUT;
    return XFER_OK;
}

/* No endpoint for this client: the reply ends in a REJECT with the status and reason, and the
 * handshake fails with them once it is sent. */
static xfer_status_t hs_refuse(xfer_listener_t *l, handshake_t *hs, xfer_status_t status,
                               const char *reason, char *why, size_t why_size)
{
    uint8_t frame[XFER_WIRE_REJECT_FRAME_MAX];
    size_t len = sizeof(frame);
    xfer_status_t ret;

    ret = xfer_wire_pack_reject(status, reason, frame, &len);
    if (ret != XFER_OK) {
        snprintf(why, why_size, "%s (and REJECT cannot be packed: %s)", reason,
                 xfer_status_string(ret));
        return status;
    }
    hs->refusal = xfer_strdup_printf("%s", reason);
    if (hs->refusal == NULL) {
        snprintf(why, why_size, "%s (and out of memory to say so)", reason);
        return status;
    }
    hs->refused = status;
    return hs_reply_set(l, hs, frame, len, why, why_size);
}

/* What the negotiation's reachability check needs: whose iface, and which client. */
typedef struct hs_reach {
    xfer_context_t  *ctx;
    const char      *peer;
} hs_reach_t;

/* Does our iface of name reach the client at addr (its address in the HELLO)? A transport
 * skipped is logged at INFO, so that "why tcp and not shm" has its answer there even when
 * another transport serves the client. */
static int hs_reachable(void *arg, const char *name, const void *addr, size_t addr_len,
                        char *why, size_t why_size)
{
    const hs_reach_t *r = arg;

    if (xfer_endpoint_reachable(r->ctx, name, addr, addr_len, why, why_size)) {
        return 1;
    }
    xfer_log(XFER_LOG_INFO, XFER_BOOT_SUBSYS, "client %s: skipping %s, which does not reach "
             "it: %s", r->peer, name, why);
    return 0;
}

/* The client's HELLO is whole: choose a transport, prepare its endpoint, build the reply. */
static xfer_status_t hs_hello_received(xfer_listener_t *l, handshake_t *hs, char *why,
                                       size_t why_size)
{
    uint8_t frames[XFER_WIRE_ACCEPT_FRAME_MAX + XFER_WIRE_CONNECT_FRAME_MAX];
    size_t len = XFER_WIRE_ACCEPT_FRAME_MAX, len2 = XFER_WIRE_CONNECT_FRAME_MAX, addr_len;
    xfer_wire_connect_t conn;
    xfer_wire_hello_t *theirs;
    hs_reach_t reach;
    const void *peer_addr;
    const char *name;
    xfer_status_t status;
    char reason[XFER_WIRE_MAX_REASON + 1];
    int idx;

    if (hs->rx.hdr.type != XFER_WIRE_HELLO) {
        snprintf(why, why_size, "expected HELLO, got frame type %u", hs->rx.hdr.type);
        return XFER_ERR_PROTOCOL;
    }
    theirs = malloc(sizeof(*theirs));
    if (theirs == NULL) {
        snprintf(why, why_size, "out of memory");
        return XFER_ERR_NO_MEMORY;
    }
    status = xfer_wire_parse_hello(hs->rx.body, hs->rx.hdr.body_len, theirs, why, why_size);
    xfer_boot_rx_cleanup(&hs->rx);
    xfer_boot_rx_init(&hs->rx);
    if (status != XFER_OK) {
        goto out;
    }
    reach.ctx  = l->ctx;
    reach.peer = hs->peer;
    idx = xfer_wire_negotiate_reachable(theirs, l->offer, hs_reachable, &reach, reason,
                                        sizeof(reason));
    if (idx < 0) {
        status = hs_refuse(l, hs, XFER_ERR_UNREACHABLE, reason, why, why_size);
        goto out;
    }
    name      = theirs->transports[idx].name;
    peer_addr = xfer_boot_peer_addr(name, theirs, &addr_len);
    status    = xfer_endpoint_prepare(l->ctx, hs->fd, name, peer_addr, addr_len, 1, hs->peer,
                                      &conn, &hs->ep, reason, sizeof(reason));
    if (status != XFER_OK) {
        /* the client learns why instead of a closed connection */
        status = hs_refuse(l, hs, status, reason, why, why_size);
        goto out;
    }
    status = xfer_wire_pack_accept(name, frames, &len);
    if (status == XFER_OK) {
        status = xfer_wire_pack_connect(&conn, frames + len, &len2);
    }
    if (status != XFER_OK) {
        snprintf(why, why_size, "cannot pack ACCEPT and CONNECT: %s",
                 xfer_status_string(status));
        goto out;
    }
    status = hs_reply_set(l, hs, frames, len + len2, why, why_size);
out:
    free(theirs);
    return status;
}

/* The client's CONNECT is whole: connect the endpoint. */
static xfer_status_t hs_connect_received(handshake_t *hs, char *why, size_t why_size)
{
    xfer_wire_connect_t conn;
    xfer_status_t status;

    if (hs->rx.hdr.type != XFER_WIRE_CONNECT) {
        snprintf(why, why_size, "expected CONNECT, got frame type %u", hs->rx.hdr.type);
        return XFER_ERR_PROTOCOL;
    }
    status = xfer_wire_parse_connect(hs->rx.body, hs->rx.hdr.body_len, &conn, why, why_size);
    if (status == XFER_OK) {
        status = xfer_endpoint_complete(hs->ep, &conn, why, why_size);
    }
    return status;
}

/* Move hs as far as its socket allows now. XFER_OK: done, the endpoint in *ep_p and hs gone;
 * XFER_INPROGRESS: waiting, watched for what it waits for; else it failed and is gone. */
static xfer_status_t hs_progress(xfer_listener_t *l, handshake_t *hs, xfer_endpoint_t **ep_p)
{
    xfer_status_t status;
    char why[1200];
    size_t n;

    for (;;) {
        switch (hs->state) {
        case HS_HELLO_IN:
            status = xfer_boot_rx_progress(hs->fd, &hs->rx, why, sizeof(why));
            if (status == XFER_OK) {
                status = hs_hello_received(l, hs, why, sizeof(why));
            }
            break;
        case HS_REPLY_OUT:
            status = xfer_sock_send_some(hs->fd, hs->out + hs->out_sent,
                                         hs->out_len - hs->out_sent, &n, why, sizeof(why));
            if (status != XFER_OK) {
                break;
            }
            hs->out_sent += n;
            if (hs->out_sent < hs->out_len) {
                status = XFER_INPROGRESS;
            } else if (hs->refused != XFER_OK) {
                snprintf(why, sizeof(why), "%s", hs->refusal);
                status = hs->refused;
            } else {
                free(hs->out);
                hs->out   = NULL;
                hs->state = HS_CONNECT_IN;
            }
            break;
        case HS_CONNECT_IN:
        default:
            status = xfer_boot_rx_progress(hs->fd, &hs->rx, why, sizeof(why));
            if (status == XFER_OK) {
                status = hs_connect_received(hs, why, sizeof(why));
            }
            if (status == XFER_OK) {
                *ep_p  = hs->ep;
                hs->ep = NULL;
                xfer_log(XFER_LOG_INFO, XFER_BOOT_SUBSYS, "accepted %s over %s", hs->peer,
                         xfer_endpoint_transport(*ep_p));
                hs_free(l, hs);     /* the transport keeps its own descriptor if it wants one */
                return XFER_OK;
            }
            break;
        }
        if (status == XFER_INPROGRESS) {
            status = hs_watch(l, hs, why, sizeof(why));
            if (status == XFER_OK) {
                return XFER_INPROGRESS;
            }
        }
        if (status != XFER_OK) {
            hs_fail(l, hs, status, why, XFER_LOG_WARN);
            return status;
        }
    }
}

static xfer_status_t hs_start(xfer_listener_t *l, int fd, const char *peer, int64_t now)
{
    struct epoll_event ev = {0};
    handshake_t *hs;

    hs = calloc(1, sizeof(*hs));
    if (hs == NULL) {
        xfer_log_peer("handshake_refused", XFER_LOG_WARN, XFER_BOOT_SUBSYS, "closing connection from %s: out of memory",
                 peer);
        close(fd);
        return XFER_ERR_NO_MEMORY;
    }
    hs->fd       = fd;
    hs->state    = HS_HELLO_IN;
    hs->events   = EPOLLIN;
    hs->deadline = now + l->timeout_ms;
    hs->refused  = XFER_OK;
    snprintf(hs->peer, sizeof(hs->peer), "%s", peer);
    xfer_boot_rx_init(&hs->rx);
    ev.events   = EPOLLIN;
    ev.data.ptr = hs;
    if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        xfer_log_peer("handshake_refused", XFER_LOG_WARN, XFER_BOOT_SUBSYS, "closing connection from %s: "
                 "epoll_ctl(ADD): %s", peer, strerror(errno));
        close(fd);
        free(hs);
        return XFER_ERR_NO_RESOURCE;
    }
    ucs_list_add_tail(&l->pending, &hs->list);
    l->num_pending++;
    return XFER_OK;
}

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
