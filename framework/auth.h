/*
 * Who may connect (auth.c): the shared key every peer must prove it holds, and the proofs
 * the bootstrap exchanges.
 *
 * With a key (XFER_AUTH_KEY_FILE, or xfer_context_params_t.auth_key) both sides of a
 * handshake prove they hold it before anything else is negotiated, with nonces from both,
 * and every flight of frames after that ends in a MAC over everything exchanged so far
 * (HMAC-SHA256, OpenSSL's libcrypto, keyed with the shared key, over a SHA-256 of the
 * transcript): a peer without the key, with a wrong key, a replayed handshake, a frame spliced
 * in from another handshake or a frame changed on the way fails the check where it is made,
 * and the server checks the client's proof before it creates any transport resource for it.
 *
 *   client                                    server
 *   AUTH_NONCE(nc)                 ->
 *                                  <-         AUTH_NONCE(ns) AUTH_MAC(server)
 *   HELLO AUTH_MAC(client)         ->         (checked, then the transport is chosen)
 *                                  <-         HELLO ACCEPT CONNECT AUTH_MAC(server)
 *   CONNECT AUTH_MAC(client)       ->
 *
 * A side with a key never talks to one without: a server with a key refuses a HELLO that
 * comes first, a server without one refuses an AUTH_NONCE, and a client with a key fails
 * unless the server proves it.
 */
#ifndef XFER_AUTH_H
#define XFER_AUTH_H

#include "bootstrap.h"

typedef struct xfer_auth xfer_auth_t;

/* The context's key: from params (when given) or XFER_AUTH_KEY_FILE, which must be a regular
 * file of 16 to 4096 bytes that only its owner may read. XFER_ERR_INVALID_PARAM with why. */
xfer_status_t xfer_auth_key_load(xfer_context_t *ctx, const xfer_context_params_t *params,
                                 char *why, size_t why_size);
void xfer_auth_key_free(xfer_context_t *ctx);
static inline int xfer_auth_enabled(const xfer_context_t *ctx)
{
    return ctx->auth_key_len > 0;
}

/* One handshake's state: NULL in *a_p when the context has no key. */
xfer_status_t xfer_auth_start(const xfer_context_t *ctx, int is_server, xfer_auth_t **a_p);
void xfer_auth_free(xfer_auth_t *a);

/* Bytes sent or received that the proofs cover, in the order they went over the wire. */
void xfer_auth_absorb(xfer_auth_t *a, const void *buf, size_t len);
void xfer_auth_absorb_rx(xfer_auth_t *a, const xfer_boot_rx_t *rx);

/* This side's AUTH_NONCE frame (XFER_WIRE_AUTH_FRAME_LEN bytes into buf), absorbed. */
xfer_status_t xfer_auth_nonce_frame(xfer_auth_t *a, uint8_t *buf);
/* The peer's AUTH_NONCE (rx holds it), absorbed. */
xfer_status_t xfer_auth_nonce_take(xfer_auth_t *a, const xfer_boot_rx_t *rx, char *why,
                                   size_t why_size);
/* This side's AUTH_MAC over everything so far (XFER_WIRE_AUTH_FRAME_LEN bytes), absorbed. */
xfer_status_t xfer_auth_mac_frame(xfer_auth_t *a, uint8_t *buf);
/* The endpoint's secret (XFER_EP_SECRET_LEN bytes): the key's HMAC over everything so far,
 * taken on both sides at the same point - after the client's HELLO and its proof - so that
 * both hold it and nobody else does. */
xfer_status_t xfer_auth_ep_secret(xfer_auth_t *a, uint8_t *secret);
/* The peer's AUTH_MAC (rx): XFER_OK when it proves the key over everything so far, else
 * XFER_ERR_DENIED with why; absorbed. */
xfer_status_t xfer_auth_mac_check(xfer_auth_t *a, const xfer_boot_rx_t *rx, char *why,
                                  size_t why_size);

#endif
