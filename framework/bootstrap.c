/*
 * Bootstrap: listen, connect and accept over TCP, exchange HELLOs (each side's allowed
 * transports, best first, with their addresses), and let the server pick the first of the
 * client's transports that it also offers. Both sides learn the choice (ACCEPT) or why there
 * is none (REJECT, naming what each side offered). A peer that sends anything else - another
 * magic or version, a truncated or oversized frame, random bytes - has its connection closed
 * with a logged reason; the listener keeps working. Every step is bounded by
 * XFER_BOOTSTRAP_TIMEOUT, so a silent peer cannot hang the caller.
 */
#include "xfer_int.h"
#include "sock.h"
#include "wire/bootstrap_wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BOOT_SUBSYS "bootstrap"

struct xfer_listener {
    xfer_context_t *ctx;
    int            fd;
    uint16_t       port;
};

/* The two HELLOs of one handshake; ~17 KiB each, so off the stack. */
typedef struct handshake {
    xfer_wire_hello_t mine;
    xfer_wire_hello_t theirs;
} handshake_t;

struct xfer_endpoint {
    xfer_context_t *ctx;
    int            fd;
    char           transport[XFER_WIRE_MAX_NAME + 1];
    char           peer[80];
};

/* What this side offers: the transports selection ranks for host memory, best first. */
static xfer_status_t build_offer(const xfer_context_t *ctx, xfer_wire_hello_t *hello)
{
    /* No capability is required yet: until the data paths land, every available allowed
     * transport is offered. The ranking (capability, then estimate) still orders them. */
    const xfer_select_req_t req = {0, XFER_CAP_ALL};
    xfer_selection_t sel;
    xfer_status_t status;

    memset(hello, 0, sizeof(*hello));
    status = xfer_select(ctx, &req, &sel);
    if (status != XFER_OK) {
        return status;
    }
    for (size_t i = 0; (i < sel.num_entries) && (hello->num < XFER_WIRE_MAX_TRANSPORTS); i++) {
        if (sel.entries[i].rank >= 0) {
            snprintf(hello->transports[hello->num++].name, XFER_WIRE_MAX_NAME + 1, "%s",
                     sel.entries[i].name);
        }
    }
    xfer_selection_release(&sel);
    return XFER_OK;
}

static int64_t deadline(const xfer_context_t *ctx)
{
    return xfer_now_ms() + (int64_t)(ctx->fw_config.bootstrap_timeout * 1000.0);
}

/* Receive one frame: header, validated, then exactly body_len bytes into a new buffer. */
static xfer_status_t recv_frame(int fd, int64_t until, xfer_wire_header_t *hdr,
                                uint8_t **body_p, char *why, size_t why_size)
{
    uint8_t head[XFER_WIRE_HEADER_LEN];
    xfer_status_t status;
    uint8_t *body;

    status = xfer_sock_recv_all(fd, head, sizeof(head), until, why, why_size);
    if (status != XFER_OK) {
        return status;
    }
    status = xfer_wire_parse_header(head, sizeof(head), hdr, why, why_size);
    if (status != XFER_OK) {
        return status;
    }
    /* body_len is at most XFER_WIRE_MAX_BODY here: the header parser checked it */
    body = malloc(hdr->body_len ? hdr->body_len : 1);
    if (body == NULL) {
        snprintf(why, why_size, "out of memory for a %u-byte frame", hdr->body_len);
        return XFER_ERR_NO_MEMORY;
    }
    status = xfer_sock_recv_all(fd, body, hdr->body_len, until, why, why_size);
    if (status != XFER_OK) {
        free(body);
        return status;
    }
    *body_p = body;
    return XFER_OK;
}

static xfer_status_t recv_hello(int fd, int64_t until, xfer_wire_hello_t *hello, char *why,
                                size_t why_size)
{
    xfer_wire_header_t hdr;
    xfer_status_t status;
    uint8_t *body;

    status = recv_frame(fd, until, &hdr, &body, why, why_size);
    if (status != XFER_OK) {
        return status;
    }
    if (hdr.type != XFER_WIRE_HELLO) {
        snprintf(why, why_size, "expected HELLO, got frame type %u", hdr.type);
        status = XFER_ERR_PROTOCOL;
    } else {
        status = xfer_wire_parse_hello(body, hdr.body_len, hello, why, why_size);
    }
    free(body);
    return status;
}

static xfer_status_t send_hello(int fd, const xfer_wire_hello_t *hello, int64_t until,
                                char *why, size_t why_size)
{
    uint8_t frame[4096];
    size_t len = sizeof(frame);
    xfer_status_t status;

    status = xfer_wire_pack_hello(hello, frame, &len);
    if (status != XFER_OK) {
        snprintf(why, why_size, "cannot pack HELLO: %s", xfer_status_string(status));
        return status;
    }
    return xfer_sock_send_all(fd, frame, len, until, why, why_size);
}

static xfer_status_t endpoint_new(xfer_context_t *ctx, int fd, const char *transport,
                                  const char *peer, xfer_endpoint_t **ep_p)
{
    xfer_endpoint_t *ep = calloc(1, sizeof(*ep));

    if (ep == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    ep->ctx = ctx;
    ep->fd  = fd;
    snprintf(ep->transport, sizeof(ep->transport), "%s", transport);
    snprintf(ep->peer, sizeof(ep->peer), "%s", peer);
    *ep_p = ep;
    return XFER_OK;
}

xfer_status_t xfer_listen(xfer_context_t *ctx, const char *address, xfer_listener_t **listener_p)
{
    struct sockaddr_storage ss;
    xfer_listener_t *l;
    xfer_status_t status;
    socklen_t len;
    char why[256];

    if ((ctx == NULL) || (listener_p == NULL)) {
        return XFER_ERR_INVALID_PARAM;
    }
    status = xfer_sock_parse(address, 1, &ss, &len, why, sizeof(why));
    if (status != XFER_OK) {
        xfer_log(XFER_LOG_ERROR, BOOT_SUBSYS, "listen: %s", why);
        return status;
    }
    l = calloc(1, sizeof(*l));
    if (l == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    status = xfer_sock_listen(&ss, len, &l->fd, &l->port, why, sizeof(why));
    if (status != XFER_OK) {
        xfer_log(XFER_LOG_ERROR, BOOT_SUBSYS, "listen on %s: %s", address, why);
        free(l);
        return status;
    }
    l->ctx = ctx;
    xfer_log(XFER_LOG_DEBUG, BOOT_SUBSYS, "listening on %s (port %u)", address, l->port);
    *listener_p = l;
    return XFER_OK;
}

uint16_t xfer_listener_port(const xfer_listener_t *listener)
{
    return listener ? listener->port : 0;
}

int xfer_listener_fd(const xfer_listener_t *listener)
{
    return listener ? listener->fd : -1;
}

void xfer_listener_close(xfer_listener_t *listener)
{
    if (listener != NULL) {
        close(listener->fd);
        free(listener);
    }
}

xfer_status_t xfer_accept(xfer_listener_t *listener, int timeout_ms, xfer_endpoint_t **ep_p)
{
    uint8_t frame[XFER_WIRE_HEADER_LEN + XFER_WIRE_MAX_REASON + 8];
    handshake_t *hs = NULL;
    char why[512], reason[512], peer[80] = "?";
    int64_t wait_until, until;
    size_t len = sizeof(frame);
    xfer_status_t status;
    int idx, fd = -1;

    if ((listener == NULL) || (ep_p == NULL)) {
        return XFER_ERR_INVALID_PARAM;
    }
    wait_until = (timeout_ms < 0) ? INT64_MAX : xfer_now_ms() + timeout_ms;
    status     = xfer_sock_accept(listener->fd, wait_until, &fd, peer, sizeof(peer), why,
                                  sizeof(why));
    if (status != XFER_OK) {
        if (status != XFER_ERR_TIMEOUT) {
            xfer_log(XFER_LOG_ERROR, BOOT_SUBSYS, "accept: %s", why);
        }
        return status;
    }

    until = deadline(listener->ctx);
    hs    = malloc(sizeof(*hs));
    if (hs == NULL) {
        status = XFER_ERR_NO_MEMORY;
        snprintf(why, sizeof(why), "out of memory");
        goto err_close;
    }
    status = recv_hello(fd, until, &hs->theirs, why, sizeof(why));
    if (status != XFER_OK) {
        goto err_close;
    }
    status = build_offer(listener->ctx, &hs->mine);
    if (status != XFER_OK) {
        snprintf(why, sizeof(why), "cannot build the transport offer");
        goto err_close;
    }
    status = send_hello(fd, &hs->mine, until, why, sizeof(why));
    if (status != XFER_OK) {
        goto err_close;
    }

    idx = xfer_wire_negotiate(&hs->theirs, &hs->mine, reason, sizeof(reason));
    if (idx < 0) {
        xfer_wire_pack_reject(XFER_ERR_UNREACHABLE, reason, frame, &len);
        xfer_sock_send_all(fd, frame, len, until, why, sizeof(why));
        snprintf(why, sizeof(why), "%s", reason);
        status = XFER_ERR_UNREACHABLE;
        goto err_close;
    }
    status = xfer_wire_pack_accept(hs->theirs.transports[idx].name, frame, &len);
    if (status == XFER_OK) {
        status = xfer_sock_send_all(fd, frame, len, until, why, sizeof(why));
    }
    if (status != XFER_OK) {
        goto err_close;
    }
    status = endpoint_new(listener->ctx, fd, hs->theirs.transports[idx].name, peer, ep_p);
    if (status != XFER_OK) {
        snprintf(why, sizeof(why), "out of memory");
        goto err_close;
    }
    xfer_log(XFER_LOG_INFO, BOOT_SUBSYS, "accepted %s over %s", peer, (*ep_p)->transport);
    free(hs);
    return XFER_OK;

err_close:
    xfer_log(XFER_LOG_WARN, BOOT_SUBSYS, "closing connection from %s: %s (%s)", peer, why,
             xfer_status_string(status));
    close(fd);
    free(hs);
    return status;
}

xfer_status_t xfer_connect(xfer_context_t *ctx, const char *address, xfer_endpoint_t **ep_p)
{
    char why[1200], name[XFER_WIRE_MAX_NAME + 1];
    handshake_t *hs = NULL;
    struct sockaddr_storage ss;
    xfer_wire_header_t hdr;
    xfer_wire_reject_t rej;
    xfer_status_t status;
    uint8_t *body = NULL;
    socklen_t len;
    int64_t until;
    int fd = -1, offered = 0;

    if ((ctx == NULL) || (ep_p == NULL)) {
        return XFER_ERR_INVALID_PARAM;
    }
    status = xfer_sock_parse(address, 0, &ss, &len, why, sizeof(why));
    if (status != XFER_OK) {
        xfer_log(XFER_LOG_ERROR, BOOT_SUBSYS, "connect: %s", why);
        return status;
    }
    until = deadline(ctx);
    hs    = malloc(sizeof(*hs));
    if (hs == NULL) {
        status = XFER_ERR_NO_MEMORY;
        snprintf(why, sizeof(why), "out of memory");
        goto err;
    }
    status = build_offer(ctx, &hs->mine);
    if (status != XFER_OK) {
        snprintf(why, sizeof(why), "cannot build the transport offer");
        goto err;
    }
    status = xfer_sock_connect(&ss, len, until, &fd, why, sizeof(why));
    if (status != XFER_OK) {
        goto err;
    }
    status = send_hello(fd, &hs->mine, until, why, sizeof(why));
    if (status != XFER_OK) {
        goto err;
    }
    status = recv_hello(fd, until, &hs->theirs, why, sizeof(why));
    if (status != XFER_OK) {
        goto err;
    }
    status = recv_frame(fd, until, &hdr, &body, why, sizeof(why));
    if (status != XFER_OK) {
        goto err;
    }
    if (hdr.type == XFER_WIRE_REJECT) {
        status = xfer_wire_parse_reject(body, hdr.body_len, &rej, why, sizeof(why));
        if (status == XFER_OK) {
            snprintf(why, sizeof(why), "server refused: %s", rej.reason);
            status = (rej.status < 0) ? (xfer_status_t)rej.status : XFER_ERR_PROTOCOL;
        }
        goto err;
    }
    if (hdr.type != XFER_WIRE_ACCEPT) {
        snprintf(why, sizeof(why), "expected ACCEPT or REJECT, got frame type %u", hdr.type);
        status = XFER_ERR_PROTOCOL;
        goto err;
    }
    status = xfer_wire_parse_accept(body, hdr.body_len, name, why, sizeof(why));
    if (status != XFER_OK) {
        goto err;
    }
    for (uint16_t i = 0; i < hs->mine.num; i++) {
        offered |= (strcmp(hs->mine.transports[i].name, name) == 0);
    }
    if (!offered) {
        snprintf(why, sizeof(why), "server chose '%s', which this side did not offer", name);
        status = XFER_ERR_PROTOCOL;
        goto err;
    }
    status = endpoint_new(ctx, fd, name, address, ep_p);
    if (status != XFER_OK) {
        snprintf(why, sizeof(why), "out of memory");
        goto err;
    }
    xfer_log(XFER_LOG_INFO, BOOT_SUBSYS, "connected to %s over %s", address, name);
    free(body);
    free(hs);
    return XFER_OK;

err:
    xfer_log(XFER_LOG_ERROR, BOOT_SUBSYS, "connect to %s: %s (%s)", address, why,
             xfer_status_string(status));
    if (fd >= 0) {
        close(fd);
    }
    free(body);
    free(hs);
    return status;
}

const char *xfer_endpoint_transport(const xfer_endpoint_t *ep)
{
    return ep ? ep->transport : NULL;
}

const char *xfer_endpoint_peer(const xfer_endpoint_t *ep)
{
    return ep ? ep->peer : NULL;
}

void xfer_endpoint_close(xfer_endpoint_t *ep)
{
    if (ep != NULL) {
        close(ep->fd);
        free(ep);
    }
}
