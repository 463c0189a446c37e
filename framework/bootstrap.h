/*
 * What the two sides of the bootstrap share (bootstrap.c): this side's offer, the peer's
 * address for the chosen transport, and the receiving of one frame. The client's side
 * (xfer_connect, bootstrap.c) runs the handshake blocking, with a deadline; the listener's
 * (listener.c) runs many at once, each a state machine that never blocks.
 */
#ifndef XFER_BOOTSTRAP_H
#define XFER_BOOTSTRAP_H

#include "xfer_int.h"
#include "wire/bootstrap_wire.h"

#define XFER_BOOT_SUBSYS "bootstrap"

/*
 * One frame being received: its header, validated by the wire parser before its length is
 * used, then exactly body_len bytes, from as many reads as the socket needs. Nothing past the
 * frame is read: after the last CONNECT the connection belongs to the transport, which may
 * have sent its first bytes already.
 */
typedef struct xfer_boot_rx {
    uint8_t            head[XFER_WIRE_HEADER_LEN];
    size_t             got;     /* bytes of this frame received, header included */
    xfer_wire_header_t hdr;     /* valid once got >= XFER_WIRE_HEADER_LEN */
    uint8_t            *body;   /* hdr.body_len bytes (at most XFER_WIRE_MAX_BODY) */
} xfer_boot_rx_t;

/* An empty receiver; cleanup frees what a frame left (init again to reuse it). */
void xfer_boot_rx_init(xfer_boot_rx_t *rx);
void xfer_boot_rx_cleanup(xfer_boot_rx_t *rx);
/* Read what the socket has of the frame, without blocking: XFER_OK when the frame is whole,
 * XFER_INPROGRESS when more is to come, or the failure (why says what). */
xfer_status_t xfer_boot_rx_progress(int fd, xfer_boot_rx_t *rx, char *why, size_t why_size);
/* The same until the frame is whole or the deadline passes. */
xfer_status_t xfer_boot_rx_wait(int fd, int64_t until, xfer_boot_rx_t *rx, char *why,
                                size_t why_size);

/* What this side offers: the open transports, best first, with their interface addresses. */
void xfer_boot_offer_build(xfer_context_t *ctx, xfer_wire_hello_t *hello);
/* The peer's address for transport name, from its HELLO (NULL and 0 when it sent none). */
const void *xfer_boot_peer_addr(const char *name, const xfer_wire_hello_t *theirs,
                                size_t *len_p);

#endif
