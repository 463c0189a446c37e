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
#include "clock.h"
#include "sock.h"
#include "wire/bootstrap_wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BOOT_SUBSYS "bootstrap"

struct xfer_listener {
    xfer_context_t  *ctx;
    ucs_list_link_t list;       /* ctx->listeners: closed at context destroy */
    int             fd;
    uint16_t        port;
};

/* The two HELLOs of one handshake; ~17 KiB each, so off the stack. */
typedef struct handshake {
    xfer_wire_hello_t mine;
    xfer_wire_hello_t theirs;
} handshake_t;

/* What this side offers: the open transports, best first (ctx->ifaces was opened in the
 * selection's rank order, XFER_TRANSPORTS honoured), each with its interface address. */
static xfer_status_t build_offer(xfer_context_t *ctx, xfer_wire_hello_t *hello)
{
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
    return XFER_OK;
}

/* The peer's address for transport name, from its HELLO (NULL and 0 when it sent none). */
static const void *peer_addr_of(const char *name, const xfer_wire_hello_t *theirs,
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

static int64_t deadline(const xfer_context_t *ctx)
{
    return xfer_now_ms() + (int64_t)(ctx->fw_config.bootstrap_timeout * 1000.0);
}

/* Receive one frame: header, validated, then exactly body_len bytes into a new buffer. */
xfer_status_t xfer_boot_recv_frame(int fd, int64_t until, xfer_wire_header_t *hdr,
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

    status = xfer_boot_recv_frame(fd, until, &hdr, &body, why, why_size);
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
    uint8_t frame[XFER_WIRE_HEADER_LEN + 2 +
                  XFER_WIRE_MAX_TRANSPORTS * (3 + XFER_WIRE_MAX_NAME + XFER_WIRE_MAX_ADDR)];
    size_t len = sizeof(frame);
    xfer_status_t status;

    status = xfer_wire_pack_hello(hello, frame, &len);
    if (status != XFER_OK) {
        snprintf(why, why_size, "cannot pack HELLO: %s", xfer_status_string(status));
        return status;
    }
    return xfer_sock_send_all(fd, frame, len, until, why, why_size);
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
    xfer_ctx_lock(ctx);
    ucs_list_add_tail(&ctx->listeners, &l->list);
    xfer_ctx_unlock(ctx);
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
    xfer_context_t *ctx;

    if (listener != NULL) {
        ctx = listener->ctx;
        xfer_ctx_lock(ctx);
        ucs_list_del(&listener->list);
        xfer_ctx_unlock(ctx);
        close(listener->fd);
        free(listener);
    }
}

void xfer_listeners_close_all(xfer_context_t *ctx)
{
    xfer_listener_t *l, *tmp;

    ucs_list_for_each_safe(l, tmp, &ctx->listeners, list) {
        ucs_list_del(&l->list);
        close(l->fd);
        free(l);
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
    const void *peer_addr;
    size_t addr_len = 0;

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
    peer_addr = peer_addr_of(hs->theirs.transports[idx].name, &hs->theirs, &addr_len);
    status    = xfer_endpoint_establish(listener->ctx, fd, hs->theirs.transports[idx].name,
                                        peer_addr, addr_len, 1, peer, until, ep_p, why,
                                        sizeof(why));
    if (status != XFER_OK) {
        goto err_close;
    }
    xfer_log(XFER_LOG_INFO, BOOT_SUBSYS, "accepted %s over %s", peer,
             xfer_endpoint_transport(*ep_p));
    close(fd);      /* the transport keeps its own descriptor if it wants the connection */
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
    const void *peer_addr;
    size_t addr_len = 0;

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
    status = xfer_boot_recv_frame(fd, until, &hdr, &body, why, sizeof(why));
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
    peer_addr = peer_addr_of(name, &hs->theirs, &addr_len);
    status    = xfer_endpoint_establish(ctx, fd, name, peer_addr, addr_len, 0, address, until,
                                        ep_p, why, sizeof(why));
    if (status != XFER_OK) {
        goto err;
    }
    xfer_log(XFER_LOG_INFO, BOOT_SUBSYS, "connected to %s over %s", address, name);
    close(fd);
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
