/*
 * Bootstrap: what the two sides share, and the client's side. Each side sends a HELLO (the
 * transports it allows, best first, with their addresses); the server picks the first of the
 * client's transports that it also offers and whose iface reaches the client's address for it
 * (iface_reachable: shm reaches peers on its own host only), and answers ACCEPT, or REJECT
 * saying why there is none (naming what each side offered, and each transport skipped as
 * unreachable with its reason). The client asks its own iface about the server's address of
 * the transport chosen too, and fails the connect rather than create an endpoint that cannot
 * work. Then each side creates its endpoint of that transport and they exchange CONNECT
 * frames (wire/bootstrap_wire.h). A peer that sends anything else - another magic or version,
 * a truncated or oversized frame, random bytes - has its connection closed with a logged
 * reason.
 *
 * xfer_connect() runs the client's side blocking, every step bounded by XFER_BOOTSTRAP_TIMEOUT
 * so that a silent server cannot hang the caller; the server's side is listener.c.
 */
#include "bootstrap.h"
#include "auth.h"
#include "sock.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void xfer_boot_offer_build(xfer_context_t *ctx, xfer_wire_hello_t *hello)
{
    /* ctx->ifaces was opened in the selection's rank order, XFER_TRANSPORTS honoured */
    memset(hello, 0, sizeof(*hello));
    xfer_ctx_lock(ctx);
    for (unsigned i = 0; (i < ctx->num_ifaces) && (hello->num < XFER_WIRE_MAX_TRANSPORTS); i++) {
        const xfer_fw_iface_t *fi = &ctx->ifaces[i];

        if (fi->addr_len > XFER_WIRE_MAX_ADDR) {
            continue;
        }
        snprintf(hello->transports[hello->num].name, XFER_WIRE_MAX_NAME + 1, "%s",
                 fi->entry->name);
        memcpy(hello->transports[hello->num].addr, fi->addr, fi->addr_len);
        hello->transports[hello->num].addr_len = (uint16_t)fi->addr_len;
        hello->num++;
    }
    xfer_ctx_unlock(ctx);
}

const void *xfer_boot_peer_addr(const char *name, const xfer_wire_hello_t *theirs,
                                size_t *len_p)
{
    for (uint16_t i = 0; i < theirs->num; i++) {
        if (strcmp(theirs->transports[i].name, name) == 0) {
            *len_p = theirs->transports[i].addr_len;
            return theirs->transports[i].addr;
        }
    }
    *len_p = 0;
    return NULL;
}

/* ---- receiving a frame ------------------------------------------------------------------- */

void xfer_boot_rx_init(xfer_boot_rx_t *rx)
{
    memset(rx, 0, sizeof(*rx));
}

void xfer_boot_rx_cleanup(xfer_boot_rx_t *rx)
{
    free(rx->body);
    rx->body = NULL;
}

/* why gets where in the frame the receive failed. */
static xfer_status_t rx_failed(const xfer_boot_rx_t *rx, xfer_status_t status, char *why,
                               size_t why_size)
{
    char cause[256];

    snprintf(cause, sizeof(cause), "%s", why);
    if (rx->got < XFER_WIRE_HEADER_LEN) {
        snprintf(why, why_size, "%s after %zu of the %u bytes of a frame header", cause,
                 rx->got, XFER_WIRE_HEADER_LEN);
    } else {
        snprintf(why, why_size, "%s after %zu bytes of a %zu-byte frame", cause, rx->got,
                 (size_t)XFER_WIRE_HEADER_LEN + rx->hdr.body_len);
    }
    return status;
}

xfer_status_t xfer_boot_rx_progress(int fd, xfer_boot_rx_t *rx, char *why, size_t why_size)
{
    xfer_status_t status;
    size_t n, want;

    for (;;) {
        if (rx->got < XFER_WIRE_HEADER_LEN) {
            status = xfer_sock_recv_some(fd, rx->head + rx->got, XFER_WIRE_HEADER_LEN - rx->got,
                                         &n, why, why_size);
            if (status != XFER_OK) {
                return rx_failed(rx, status, why, why_size);
            }
            if (n == 0) {
                return XFER_INPROGRESS;
            }
            rx->got += n;
            if (rx->got < XFER_WIRE_HEADER_LEN) {
                continue;
            }
            status = xfer_wire_parse_header(rx->head, XFER_WIRE_HEADER_LEN, &rx->hdr, why,
                                            why_size);
            if (status != XFER_OK) {
                return status;
            }
            /* at most XFER_WIRE_MAX_BODY: the header parser checked it */
            rx->body = malloc(rx->hdr.body_len ? rx->hdr.body_len : 1);
            if (rx->body == NULL) {
                snprintf(why, why_size, "out of memory for a %u-byte frame", rx->hdr.body_len);
                return XFER_ERR_NO_MEMORY;
            }
        }
        want = XFER_WIRE_HEADER_LEN + (size_t)rx->hdr.body_len;
        if (rx->got == want) {
            return XFER_OK;
        }
        status = xfer_sock_recv_some(fd, rx->body + (rx->got - XFER_WIRE_HEADER_LEN),
                                     want - rx->got, &n, why, why_size);
        if (status != XFER_OK) {
            return rx_failed(rx, status, why, why_size);
        }
        if (n == 0) {
            return XFER_INPROGRESS;
        }
        rx->got += n;
    }
}

xfer_status_t xfer_boot_rx_wait(int fd, int64_t until, xfer_boot_rx_t *rx, char *why,
                                size_t why_size)
{
    xfer_status_t status;

    for (;;) {
        status = xfer_boot_rx_progress(fd, rx, why, why_size);
        if (status != XFER_INPROGRESS) {
            return status;
        }
        status = xfer_sock_wait(fd, POLLIN, until, "receive", why, why_size);
        if (status != XFER_OK) {
            return status;
        }
    }
}

/* ---- the client's side ------------------------------------------------------------------- */

/* What one xfer_connect() holds: ~40 KiB, so off the stack. */
typedef struct client {
    xfer_wire_hello_t   mine;
    xfer_wire_hello_t   theirs;
    xfer_wire_connect_t conn_mine;
    xfer_wire_connect_t conn_theirs;
    uint8_t             frame[XFER_WIRE_HELLO_FRAME_MAX + XFER_WIRE_AUTH_FRAME_LEN];
    xfer_boot_rx_t      rx;
    xfer_auth_t         *auth;      /* NULL: no key */
    uint8_t             secret[XFER_EP_SECRET_LEN];     /* with a key: the endpoint's */
} client_t;

/* Receive the next frame, which must be of type or alt (0: no alternative), named by what. */
static xfer_status_t client_recv(int fd, int64_t until, client_t *c, uint16_t type,
                                 uint16_t alt, const char *what, char *why, size_t why_size)
{
    xfer_status_t status;

    xfer_boot_rx_cleanup(&c->rx);
    xfer_boot_rx_init(&c->rx);
    status = xfer_boot_rx_wait(fd, until, &c->rx, why, why_size);
    if ((status == XFER_OK) && (c->rx.hdr.type != type) &&
        ((alt == 0) || (c->rx.hdr.type != alt))) {
        snprintf(why, why_size, "expected %s, got frame type %u", what, c->rx.hdr.type);
        status = XFER_ERR_PROTOCOL;
    }
    if ((status == XFER_OK) && (c->auth != NULL) && (type != XFER_WIRE_AUTH_NONCE) &&
        (type != XFER_WIRE_AUTH_MAC)) {
        xfer_auth_absorb_rx(c->auth, &c->rx);
    }
    return status;
}

/* With a key: the server's AUTH_MAC ends its flight; it must prove the key over it all. */
static xfer_status_t client_flight_end(int fd, int64_t until, client_t *c, char *why,
                                       size_t why_size)
{
    xfer_status_t status;

    if (c->auth == NULL) {
        return XFER_OK;
    }
    status = client_recv(fd, until, c, XFER_WIRE_AUTH_MAC, 0, "AUTH_MAC", why, why_size);
    if (status == XFER_ERR_PROTOCOL) {
        status = XFER_ERR_DENIED;   /* an unauthenticated frame where the proof belongs */
    }
    return (status == XFER_OK) ? xfer_auth_mac_check(c->auth, &c->rx, why, why_size) : status;
}

/* With a key: send our nonce, take the server's and its proof that it holds the key. A
 * server without one refuses our AUTH_NONCE with a REJECT, which says so. */
static xfer_status_t client_auth(int fd, int64_t until, client_t *c, char *why,
                                 size_t why_size)
{
    uint8_t nonce[XFER_WIRE_AUTH_FRAME_LEN];
    xfer_wire_reject_t rej;
    xfer_status_t status;

    status = xfer_auth_nonce_frame(c->auth, nonce);
    if (status == XFER_OK) {
        status = xfer_sock_send_all(fd, nonce, sizeof(nonce), until, why, why_size);
    }
    if (status == XFER_OK) {
        status = client_recv(fd, until, c, XFER_WIRE_AUTH_NONCE, XFER_WIRE_REJECT,
                             "AUTH_NONCE", why, why_size);
    }
    if ((status == XFER_ERR_CONNECTION) || (status == XFER_ERR_PROTOCOL)) {
        snprintf(why + strlen(why), why_size - strlen(why), " (does the server hold the same "
                 "XFER_AUTH_KEY_FILE?)");
        return XFER_ERR_DENIED;
    }
    if (status != XFER_OK) {
        return status;
    }
    if (c->rx.hdr.type == XFER_WIRE_REJECT) {
        status = xfer_wire_parse_reject(c->rx.body, c->rx.hdr.body_len, &rej, why, why_size);
        if (status == XFER_OK) {
            snprintf(why, why_size, "server refused: %s", rej.reason);
        }
        return XFER_ERR_DENIED;
    }
    status = xfer_auth_nonce_take(c->auth, &c->rx, why, why_size);
    return (status == XFER_OK) ? client_flight_end(fd, until, c, why, why_size) : status;
}

/* Send frame (len bytes at c->frame), with our AUTH_MAC after it when we have a key. */
static xfer_status_t client_send_flight(int fd, int64_t until, client_t *c, size_t len,
                                        char *why, size_t why_size)
{
    xfer_status_t status;

    if (c->auth != NULL) {
        xfer_auth_absorb(c->auth, c->frame, len);
        status = xfer_auth_mac_frame(c->auth, c->frame + len);
        if (status != XFER_OK) {
            snprintf(why, why_size, "cannot make our proof: %s", xfer_status_string(status));
            return status;
        }
        len += XFER_WIRE_AUTH_FRAME_LEN;
    }
    return xfer_sock_send_all(fd, c->frame, len, until, why, why_size);
}

/* The server's answer to our HELLO: the transport it chose (ACCEPT), which must be one we
 * offered, or its refusal (REJECT) as the status and why. */
static xfer_status_t client_answer(int fd, int64_t until, client_t *c, char *name, char *why,
                                   size_t why_size)
{
    xfer_wire_reject_t rej;
    xfer_status_t status;
    int offered = 0;

    /* a server that refuses a client before negotiating (one without the key it requires)
     * sends its REJECT without a HELLO */
    status = client_recv(fd, until, c, XFER_WIRE_HELLO, XFER_WIRE_REJECT, "HELLO", why,
                         why_size);
    if ((status == XFER_OK) && (c->rx.hdr.type == XFER_WIRE_HELLO)) {
        status = xfer_wire_parse_hello(c->rx.body, c->rx.hdr.body_len, &c->theirs, why,
                                       why_size);
    }
    if ((status == XFER_OK) && (c->rx.hdr.type == XFER_WIRE_HELLO)) {
        status = client_recv(fd, until, c, XFER_WIRE_ACCEPT, XFER_WIRE_REJECT,
                             "ACCEPT or REJECT", why, why_size);
    }
    if (status != XFER_OK) {
        return status;
    }
    if (c->rx.hdr.type == XFER_WIRE_REJECT) {
        status = xfer_wire_parse_reject(c->rx.body, c->rx.hdr.body_len, &rej, why, why_size);
        if (status == XFER_OK) {
            status = client_flight_end(fd, until, c, why, why_size);
        }
        if (status == XFER_OK) {
            snprintf(why, why_size, "server refused: %s", rej.reason);
            status = (rej.status < 0) ? (xfer_status_t)rej.status : XFER_ERR_PROTOCOL;
        }
        return status;
    }
    status = xfer_wire_parse_accept(c->rx.body, c->rx.hdr.body_len, name, why, why_size);
    if (status != XFER_OK) {
        return status;
    }
    for (uint16_t i = 0; i < c->mine.num; i++) {
        offered |= (strcmp(c->mine.transports[i].name, name) == 0);
    }
    if (!offered) {
        snprintf(why, why_size, "server chose '%s', which this side did not offer", name);
        return XFER_ERR_PROTOCOL;
    }
    return XFER_OK;
}

/* The server's CONNECT, and with a key the proof that ends its flight. */
static xfer_status_t client_server_connect(int fd, int64_t until, client_t *c, char *why,
                                           size_t why_size)
{
    xfer_status_t status;

    status = client_recv(fd, until, c, XFER_WIRE_CONNECT, 0, "CONNECT", why, why_size);
    if (status == XFER_OK) {
        status = xfer_wire_parse_connect(c->rx.body, c->rx.hdr.body_len, &c->conn_theirs, why,
                                         why_size);
    }
    return (status == XFER_OK) ? client_flight_end(fd, until, c, why, why_size) : status;
}

/* Create our endpoint of the chosen transport, exchange CONNECT frames, connect it. */
static xfer_status_t client_establish(xfer_context_t *ctx, int fd, int64_t until, client_t *c,
                                      const char *name, const char *address,
                                      xfer_endpoint_t **ep_p, char *why, size_t why_size)
{
    size_t len = sizeof(c->frame), addr_len;
    const void *peer_addr = xfer_boot_peer_addr(name, &c->theirs, &addr_len);
    xfer_endpoint_t *ep;
    xfer_status_t status;
    char reason[XFER_REASON_MAX];

    if (!xfer_endpoint_reachable(ctx, name, peer_addr, addr_len, reason, sizeof(reason))) {
        snprintf(why, why_size, "the server chose %s, which does not reach the server from "
                 "this side: %s", name, reason);
        return XFER_ERR_UNREACHABLE;
    }
    /* with a key, the server's CONNECT (sent with its ACCEPT) and its proof over its whole
     * flight are checked before this side creates anything, and each side's transcript has
     * the server's flight before the client's */
    if (c->auth != NULL) {
        status = client_server_connect(fd, until, c, why, why_size);
        if (status != XFER_OK) {
            return status;
        }
    }
    status = xfer_endpoint_prepare(ctx, fd, c->auth ? c->secret : NULL, name, peer_addr,
                                   addr_len, 0, address, &c->conn_mine, &ep, why, why_size);
    if (status != XFER_OK) {
        return status;
    }
    status = xfer_wire_pack_connect(&c->conn_mine, c->frame, &len);
    if (status != XFER_OK) {
        snprintf(why, why_size, "cannot pack CONNECT: %s", xfer_status_string(status));
        goto err_discard;
    }
    /* without a key ours goes first: a server may wait for it before it sends its own */
    status = client_send_flight(fd, until, c, len, why, why_size);
    if ((status == XFER_OK) && (c->auth == NULL)) {
        status = client_server_connect(fd, until, c, why, why_size);
    }
    if (status == XFER_OK) {
        status = xfer_endpoint_complete(ep, &c->conn_theirs, why, why_size);
    }
    if (status != XFER_OK) {
        goto err_discard;
    }
    *ep_p = ep;
    return XFER_OK;

err_discard:
    xfer_endpoint_discard(ep);
    return status;
}

xfer_status_t xfer_connect(xfer_context_t *ctx, const char *address, xfer_endpoint_t **ep_p)
{
    char why[1200], name[XFER_WIRE_MAX_NAME + 1];
    struct addrinfo *addrs = NULL;
    client_t *c            = NULL;
    xfer_status_t status;
    size_t len;
    int64_t until;
    int fd = -1;

    if ((ctx == NULL) || (ep_p == NULL)) {
        return XFER_ERR_INVALID_PARAM;
    }
    if (xfer_in_callback) {
        xfer_refuse(XFER_BOOT_SUBSYS, "xfer_connect from a callback, which must "
                    "not wait: refused");
        return XFER_ERR_BUSY;
    }
    xfer_ctx_lock(ctx);
    status = xfer_api_check(ctx, "xfer_connect", 1);
    xfer_ctx_unlock(ctx);
    if (status != XFER_OK) {
        return status;
    }
    status = xfer_sock_resolve(address, 0, &addrs, why, sizeof(why));
    if (status != XFER_OK) {
        xfer_refuse(XFER_BOOT_SUBSYS, "connect: %s", why);
        return status;
    }
    until = xfer_now_ms() + (int64_t)(ctx->fw_config.bootstrap_timeout * 1000.0);
    c     = malloc(sizeof(*c));
    if (c == NULL) {
        status = XFER_ERR_NO_MEMORY;
        snprintf(why, sizeof(why), "out of memory");
        goto err;
    }
    xfer_boot_rx_init(&c->rx);
    xfer_boot_offer_build(ctx, &c->mine);
    status = xfer_auth_start(ctx, 0, &c->auth);
    if (status != XFER_OK) {
        snprintf(why, sizeof(why), "out of memory");
        goto err;
    }
    status = xfer_sock_connect_any(addrs, until, &fd, why, sizeof(why));
    if ((status == XFER_OK) && (c->auth != NULL)) {
        status = client_auth(fd, until, c, why, sizeof(why));
    }
    if (status != XFER_OK) {
        goto err;
    }
    len    = sizeof(c->frame) - XFER_WIRE_AUTH_FRAME_LEN;
    status = xfer_wire_pack_hello(&c->mine, c->frame, &len);
    if (status != XFER_OK) {
        snprintf(why, sizeof(why), "cannot pack HELLO: %s", xfer_status_string(status));
        goto err;
    }
    status = client_send_flight(fd, until, c, len, why, sizeof(why));
    if ((status == XFER_OK) && (c->auth != NULL)) {
        status = xfer_auth_ep_secret(c->auth, c->secret);   /* where the server takes it too */
    }
    if (status == XFER_OK) {
        status = client_answer(fd, until, c, name, why, sizeof(why));
    }
    if (status == XFER_OK) {
        status = client_establish(ctx, fd, until, c, name, address, ep_p, why, sizeof(why));
    }
    if (status != XFER_OK) {
        goto err;
    }
    xfer_log(XFER_LOG_INFO, XFER_BOOT_SUBSYS, "connected to %s over %s", address, name);
    close(fd);      /* the transport keeps its own descriptor if it wants the connection */
    xfer_boot_rx_cleanup(&c->rx);
    xfer_auth_free(c->auth);
    free(c);
    freeaddrinfo(addrs);
    return XFER_OK;

err:
    xfer_refuse(XFER_BOOT_SUBSYS, "connect to %s: %s (%s)", address, why,
                xfer_status_string(status));
    if (fd >= 0) {
        close(fd);
    }
    if (c != NULL) {
        xfer_boot_rx_cleanup(&c->rx);
        xfer_auth_free(c->auth);
        free(c);
    }
    freeaddrinfo(addrs);
    return status;
}
