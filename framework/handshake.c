/*
 * One handshake: the server's side of the bootstrap over one accepted, non-blocking socket,
 * with its own deadline (XFER_BOOTSTRAP_TIMEOUT from its accept; listener.c enforces it):
 *
 *   AUTH_IN      with a key: read the client's AUTH_NONCE; the reply (REPLY_OUT, then
 *                HELLO_IN) is our AUTH_NONCE and our proof (auth.h)
 *   HELLO_IN     read the client's HELLO (with a key, and its proof, checked before anything
 *                else happens), from as many reads as it takes
 *   REPLY_OUT    send our HELLO and either ACCEPT and our CONNECT (the chosen transport's
 *                endpoint is created on the socket first) or REJECT saying why, with our
 *                proof after them when we have a key
 *   CONNECT_IN   read the client's CONNECT (and proof) and connect the endpoint: done
 */
#include "listener.h"
#include "sock.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

const char *const hs_waiting_for[] = {
    [HS_AUTH_IN]    = "waiting for its AUTH_NONCE",
    [HS_HELLO_IN]   = "waiting for its HELLO",
    [HS_REPLY_OUT]  = "waiting for it to read our reply",
    [HS_CONNECT_IN] = "waiting for its CONNECT",
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
    xfer_boot_rx_cleanup(&hs->held);
    xfer_auth_free(hs->auth);
    free(hs->out);
    free(hs->refusal);
    ucs_list_del(&hs->list);
    l->num_pending--;
    free(hs);
}

void hs_fail(xfer_listener_t *l, handshake_t *hs, xfer_status_t status, const char *why,
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

/* Our reply: our HELLO (unless the client has not proven the key yet: it learns nothing of
 * us then) followed by the frames in [frames, frames + len), and with a key our proof over
 * everything so far. */
static xfer_status_t hs_reply_set(xfer_listener_t *l, handshake_t *hs, const uint8_t *frames,
                                  size_t len, char *why, size_t why_size)
{
    size_t hello = (hs->state == HS_AUTH_IN) ? 0 : l->hello_len;
    int prove    = (hs->auth != NULL) && (hs->state != HS_AUTH_IN);
    size_t total = hello + len + (prove ? XFER_WIRE_AUTH_FRAME_LEN : 0);
    xfer_status_t status;

    hs->out = malloc(total);
    if (hs->out == NULL) {
        snprintf(why, why_size, "out of memory for a %zu-byte reply", total);
        return XFER_ERR_NO_MEMORY;
    }
    memcpy(hs->out, l->hello, hello);
    memcpy(hs->out + hello, frames, len);
    if (prove) {
        xfer_auth_absorb(hs->auth, hs->out, hello + len);
        status = xfer_auth_mac_frame(hs->auth, hs->out + hello + len);
        if (status != XFER_OK) {
            snprintf(why, why_size, "cannot make our proof: %s", xfer_status_string(status));
            return status;
        }
    }
    hs->out_len  = total;
    hs->out_sent = 0;
    hs->next     = HS_CONNECT_IN;
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

/* With a key, the client's first frame: its AUTH_NONCE, answered with ours and our proof.
 * A HELLO here comes from a peer that does not authenticate: refused, and told why. */
static xfer_status_t hs_auth_received(xfer_listener_t *l, handshake_t *hs, char *why,
                                      size_t why_size)
{
    uint8_t frames[2 * XFER_WIRE_AUTH_FRAME_LEN];
    xfer_status_t status;

    if (hs->rx.hdr.type == XFER_WIRE_HELLO) {
        return hs_refuse(l, hs, XFER_ERR_DENIED, "this listener admits only peers that prove "
                         "its key: set XFER_AUTH_KEY_FILE to the same key on both sides", why,
                         why_size);
    }
    status = xfer_auth_nonce_take(hs->auth, &hs->rx, why, why_size);
    xfer_boot_rx_cleanup(&hs->rx);
    xfer_boot_rx_init(&hs->rx);
    if (status == XFER_OK) {
        status = xfer_auth_nonce_frame(hs->auth, frames);
    }
    if (status == XFER_OK) {
        status = xfer_auth_mac_frame(hs->auth, frames + XFER_WIRE_AUTH_FRAME_LEN);
    }
    if (status != XFER_OK) {
        return status;
    }
    status = hs_reply_set(l, hs, frames, sizeof(frames), why, why_size);
    hs->next = HS_HELLO_IN;
    return status;
}

/* Does the frame just read (a HELLO or CONNECT of type, or the proof after one) go through
 * hs_proven() first? Only with a key. */
static int hs_holds(const handshake_t *hs, uint16_t type)
{
    return (hs->auth != NULL) && (hs->holding || (hs->rx.hdr.type == type));
}

/* With a key (hs_holds() said so), a HELLO or CONNECT is held until the AUTH_MAC after it
 * checks: 1 when hs->rx holds a frame that may be acted on now, 0 when more must be read
 * (status XFER_OK), or 0 with the failure in *status_p. */
static int hs_proven(handshake_t *hs, xfer_status_t *status_p, char *why, size_t why_size)
{
    *status_p = XFER_OK;
    if (!hs->holding) {
        xfer_auth_absorb_rx(hs->auth, &hs->rx);
        hs->held    = hs->rx;       /* the body moves with it */
        hs->holding = 1;
        xfer_boot_rx_init(&hs->rx);
        return 0;
    }
    *status_p = xfer_auth_mac_check(hs->auth, &hs->rx, why, why_size);
    xfer_boot_rx_cleanup(&hs->rx);
    hs->rx      = hs->held;
    hs->holding = 0;
    xfer_boot_rx_init(&hs->held);
    return *status_p == XFER_OK;
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

    if ((hs->rx.hdr.type == XFER_WIRE_AUTH_NONCE) && (hs->auth == NULL)) {
        return hs_refuse(l, hs, XFER_ERR_DENIED, "this listener has no key to authenticate "
                         "with: set XFER_AUTH_KEY_FILE to the same key on both sides", why,
                         why_size);
    }
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
    status    = xfer_endpoint_prepare(l->ctx, hs->fd, hs->auth ? hs->secret : NULL, name,
                                      peer_addr, addr_len, 1, hs->peer, &conn, &hs->ep, reason,
                                      sizeof(reason));
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
xfer_status_t hs_progress(xfer_listener_t *l, handshake_t *hs, xfer_endpoint_t **ep_p)
{
    xfer_status_t status;
    char why[1200];
    size_t n;

    for (;;) {
        switch (hs->state) {
        case HS_AUTH_IN:
            status = xfer_boot_rx_progress(hs->fd, &hs->rx, why, sizeof(why));
            if (status == XFER_OK) {
                status = hs_auth_received(l, hs, why, sizeof(why));
            }
            break;
        case HS_HELLO_IN:
            status = xfer_boot_rx_progress(hs->fd, &hs->rx, why, sizeof(why));
            if ((status == XFER_OK) && hs_holds(hs, XFER_WIRE_HELLO)) {
                if (!hs_proven(hs, &status, why, sizeof(why))) {
                    break;
                }
                status = xfer_auth_ep_secret(hs->auth, hs->secret);  /* as the client does */
            }
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
                hs->state = hs->next;
            }
            break;
        case HS_CONNECT_IN:
        default:
            status = xfer_boot_rx_progress(hs->fd, &hs->rx, why, sizeof(why));
            if ((status == XFER_OK) && hs_holds(hs, XFER_WIRE_CONNECT) &&
                !hs_proven(hs, &status, why, sizeof(why))) {
                break;
            }
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

xfer_status_t hs_start(xfer_listener_t *l, int fd, const char *peer, int64_t now)
{
    struct epoll_event ev = {0};
    handshake_t *hs;

    hs = calloc(1, sizeof(*hs));
    if (hs == NULL) {
        xfer_log_peer("handshake_refused", XFER_LOG_WARN, XFER_BOOT_SUBSYS,
                      "closing connection from %s: out of memory", peer);
        close(fd);
        return XFER_ERR_NO_MEMORY;
    }
    if (xfer_auth_start(l->ctx, 1, &hs->auth) != XFER_OK) {
        xfer_log_peer("handshake_refused", XFER_LOG_WARN, XFER_BOOT_SUBSYS,
                      "closing connection from %s: out of memory", peer);
        close(fd);
        free(hs);
        return XFER_ERR_NO_MEMORY;
    }
    hs->fd       = fd;
    hs->state    = (hs->auth != NULL) ? HS_AUTH_IN : HS_HELLO_IN;
    hs->events   = EPOLLIN;
    hs->deadline = now + l->timeout_ms;
    hs->refused  = XFER_OK;
    snprintf(hs->peer, sizeof(hs->peer), "%s", peer);
    xfer_boot_rx_init(&hs->rx);
    ev.events   = EPOLLIN;
    ev.data.ptr = hs;
    if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        xfer_log_peer("handshake_refused", XFER_LOG_WARN, XFER_BOOT_SUBSYS,
                      "closing connection from %s: epoll_ctl(ADD): %s", peer, strerror(errno));
        close(fd);
        xfer_auth_free(hs->auth);
        free(hs);
        return XFER_ERR_NO_RESOURCE;
    }
    ucs_list_add_tail(&l->pending, &hs->list);
    l->num_pending++;
    return XFER_OK;
}
