/*
 * Encryption of tcp (XFER_TCP_TLS=y): every connection of an endpoint carries TLS 1.3 records
 * (TLS_AES_128_GCM_SHA256), sealed and opened by the kernel (kernel TLS, the "tls" TCP ULP),
 * so that the data path stays what it is without TLS - readv straight into the caller's
 * memory, sendmsg from it, and splice of a batch's pages into the socket.
 *
 * Lane 0 runs a TLS 1.3 handshake through OpenSSL's libssl on the bootstrap's socket, once
 * the authenticated bootstrap is over: its external pre-shared key is derived from the
 * endpoint's secret (xfer_ep_params_t.secret, which only the two authenticated peers hold),
 * and the exchange is psk_dhe_ke, so that the traffic keys also come from a fresh ECDHE
 * (forward secrecy). Once it is done, each direction's application traffic secret gives the
 * record key and IV as TLS 1.3 derives them (RFC 8446 7.3, OpenSSL's TLS13-KDF), and they are
 * handed to the kernel with the record sequence at 0: lane 0 is then a standard TLS 1.3
 * connection. The server sends no session tickets, so no record of the handshake's epoch
 * follows it.
 *
 * Lanes 1.. run no handshake of their own: their keys come from lane 0's TLS exporter
 * (RFC 8446 7.5, label "EXPORTER-xfer-tcp-lanes"), one secret per lane and direction
 * (HKDF-Expand-Label of it with "c lane"/"s lane" and the lane's number), installed right
 * after the lane's hello, which is the last byte a lane carries in the clear. A key and its
 * record numbers are used by one connection only: the server attaches a lane number once per
 * endpoint (tcp_lane_port.c refuses a second), and a client tries a lane again only while its
 * connect fails, before it carried a record.
 *
 * Without kernel TLS (no "tls" module) the iface does not open, saying why, rather than
 * carry in the clear what the user asked to have encrypted. The handshake runs inside
 * ep_connect, bounded by XFER_TCP_TLS_TIMEOUT: on the server that is progress, which a peer
 * that stalls its handshake holds up to that long - only a peer that passed the bootstrap's
 * authentication (it holds the key) gets this far.
 */
#include "tcp.h"

#include <errno.h>
#include <linux/tls.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/core_names.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define TLS_SECRET_LEN  32u             /* SHA-256's: the suite's hash */

_Static_assert(sizeof(((struct tls12_crypto_info_aes_gcm_128*)0)->key) == XFER_TCP_TLS_KEY_LEN,
               "the kernel's AES-128-GCM key");
_Static_assert(sizeof(((struct tls12_crypto_info_aes_gcm_128*)0)->salt) +
               sizeof(((struct tls12_crypto_info_aes_gcm_128*)0)->iv) == XFER_TCP_TLS_IV_LEN,
               "TLS 1.3's IV is the kernel's salt and IV");
#define TLS_PSK_ID      "xfer-tcp-ep"
#define TLS_LANES_LABEL "EXPORTER-xfer-tcp-lanes"

/* What one handshake collects: its key, and the two traffic secrets as OpenSSL derives them. */
typedef struct {
    uint8_t psk[TLS_SECRET_LEN];
    uint8_t client_secret[TLS_SECRET_LEN];
    uint8_t server_secret[TLS_SECRET_LEN];
    int     have;                       /* bit 0: client's, bit 1: server's */
} tls_hs_t;

static int tls_hs_index = -1;
static pthread_once_t tls_hs_once = PTHREAD_ONCE_INIT;

static void tls_hs_index_new(void)
{
    tls_hs_index = SSL_get_ex_new_index(0, NULL, NULL, NULL, NULL);
}

/* ---- key derivation ------------------------------------------------------------------------- */

/* HKDF-Expand-Label(secret, label, context, len) of TLS 1.3 with SHA-256. 1 on success. */
static int expand_label(const uint8_t *secret, const char *label, const void *context,
                        size_t context_len, uint8_t *out, size_t len)
{
    EVP_KDF *kdf = EVP_KDF_fetch(NULL, OSSL_KDF_NAME_TLS1_3_KDF, NULL);
    EVP_KDF_CTX *kctx = (kdf != NULL) ? EVP_KDF_CTX_new(kdf) : NULL;
    int mode = EVP_KDF_HKDF_MODE_EXPAND_ONLY;
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_int(OSSL_KDF_PARAM_MODE, &mode),
        OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, (char*)"SHA256", 0),
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, (void*)secret, TLS_SECRET_LEN),
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_PREFIX, (void*)"tls13 ", 6),
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_LABEL, (void*)label, strlen(label)),
        /* an empty context is "", not NULL, to OpenSSL */
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_DATA,
                                          (void*)((context != NULL) ? context : ""),
                                          context_len),
        OSSL_PARAM_construct_end(),
    };
    int ok = (kctx != NULL) && (EVP_KDF_derive(kctx, out, len, params) == 1);

    EVP_KDF_CTX_free(kctx);
    EVP_KDF_free(kdf);
    return ok;
}

int xfer_tcp_tls_record_keys(const uint8_t *secret, uint8_t *key, uint8_t *iv)
{
    return expand_label(secret, "key", NULL, 0, key, XFER_TCP_TLS_KEY_LEN) &&
           expand_label(secret, "iv", NULL, 0, iv, XFER_TCP_TLS_IV_LEN);
}

/* Hand the record keys of a traffic secret to the kernel for one direction (TLS_TX/TLS_RX). */
static int ktls_set(int fd, int dir, const uint8_t *secret, char *why, size_t why_size)
{
    struct tls12_crypto_info_aes_gcm_128 ci;
    uint8_t iv[XFER_TCP_TLS_IV_LEN];
    int ok;

    memset(&ci, 0, sizeof(ci));
    ci.info.version     = TLS_1_3_VERSION;
    ci.info.cipher_type = TLS_CIPHER_AES_GCM_128;
    if (!xfer_tcp_tls_record_keys(secret, ci.key, iv)) {
        xfer_reason_set(why, why_size, "TLS: deriving the record keys failed");
        return 0;
    }
    /* the kernel takes TLS 1.3's 12-byte IV as a 4-byte salt and 8 bytes; records count
     * from 0 in a new epoch */
    memcpy(ci.salt, iv, sizeof(ci.salt));
    memcpy(ci.iv, iv + sizeof(ci.salt), sizeof(ci.iv));
    ok = (setsockopt(fd, SOL_TLS, dir, &ci, sizeof(ci)) == 0);
    if (!ok) {
        xfer_reason_set(why, why_size, "kernel TLS: setsockopt(%s): %s",
                        (dir == TLS_TX) ? "TLS_TX" : "TLS_RX", strerror(errno));
    }
    OPENSSL_cleanse(&ci, sizeof(ci));
    OPENSSL_cleanse(iv, sizeof(iv));
    return ok;
}

static int ktls_ulp(int fd, char *why, size_t why_size)
{
    if (setsockopt(fd, SOL_TCP, TCP_ULP, "tls", sizeof("tls")) == 0) {
        return 1;
    }
    xfer_reason_set(why, why_size, "this kernel has no TLS (setsockopt(TCP_ULP, \"tls\"): %s); "
                    "load its tls module (modprobe tls) or set XFER_TCP_TLS=n", strerror(errno));
    return 0;
}

/* Seal what fd sends with tx_secret and open what it reads with rx_secret, in the kernel. */
static xfer_status_t ktls_install(int fd, const uint8_t *tx_secret, const uint8_t *rx_secret,
                                  char *why, size_t why_size)
{
    if (!ktls_ulp(fd, why, why_size)) {
        return XFER_ERR_UNSUPPORTED;
    }
    return (ktls_set(fd, TLS_TX, tx_secret, why, why_size) &&
            ktls_set(fd, TLS_RX, rx_secret, why, why_size)) ? XFER_OK : XFER_ERR_IO;
}

/* ---- the kernel's TLS, present or not ------------------------------------------------------- */

xfer_status_t xfer_tcp_tls_probe(char *why, size_t why_size)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sin);
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int cfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int afd = -1, ok = 0;

    /* the ULP attaches to an established connection only: one over loopback, at once gone */
    if ((lfd >= 0) && (cfd >= 0) && (bind(lfd, (struct sockaddr*)&sin, sizeof(sin)) == 0) &&
        (listen(lfd, 1) == 0) && (getsockname(lfd, (struct sockaddr*)&sin, &len) == 0) &&
        (connect(cfd, (struct sockaddr*)&sin, sizeof(sin)) == 0)) {
        afd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
        ok  = ktls_ulp(cfd, why, why_size);
    } else {
        xfer_reason_set(why, why_size, "cannot probe for kernel TLS over loopback: %s",
                        strerror(errno));
    }
    for (int *fd = (int[]){lfd, cfd, afd}, i = 0; i < 3; i++) {
        if (fd[i] >= 0) {
            close(fd[i]);
        }
    }
    return ok ? XFER_OK : XFER_ERR_UNSUPPORTED;
}

/* ---- lane 0: the handshake ------------------------------------------------------------------ */

static int hex_secret(const char *hex, uint8_t *out)
{
    for (unsigned i = 0; i < TLS_SECRET_LEN; i++) {
        unsigned v;

        if (sscanf(hex + 2 * i, "%2x", &v) != 1) {
            return 0;
        }
        out[i] = (uint8_t)v;
    }
    return hex[2 * TLS_SECRET_LEN] == '\0';
}

/* OpenSSL hands each secret it derives as a key log line: "<LABEL> <client random> <secret>". */
static void keylog(const SSL *ssl, const char *line)
{
    tls_hs_t *hs = SSL_get_ex_data(ssl, tls_hs_index);
    const char *secret = strrchr(line, ' ');

    if ((hs == NULL) || (secret == NULL)) {
        return;
    }
    if ((strncmp(line, "CLIENT_TRAFFIC_SECRET_0 ", 24) == 0) &&
        hex_secret(secret + 1, hs->client_secret)) {
        hs->have |= 1;
    } else if ((strncmp(line, "SERVER_TRAFFIC_SECRET_0 ", 24) == 0) &&
               hex_secret(secret + 1, hs->server_secret)) {
        hs->have |= 2;
    }
}

static SSL_SESSION *psk_session(SSL *ssl)
{
    static const unsigned char aes128gcm[] = {0x13, 0x01};
    const SSL_CIPHER *cipher = SSL_CIPHER_find(ssl, aes128gcm);
    tls_hs_t *hs             = SSL_get_ex_data(ssl, tls_hs_index);
    SSL_SESSION *sess        = SSL_SESSION_new();

    if ((sess == NULL) || (cipher == NULL) || (hs == NULL) ||
        !SSL_SESSION_set1_master_key(sess, hs->psk, sizeof(hs->psk)) ||
        !SSL_SESSION_set_cipher(sess, cipher) ||
        !SSL_SESSION_set_protocol_version(sess, TLS1_3_VERSION)) {
        SSL_SESSION_free(sess);
        return NULL;
    }
    return sess;
}

static int psk_use(SSL *ssl, const EVP_MD *md, const unsigned char **id, size_t *id_len,
                   SSL_SESSION **sess)
{
    (void)md;
    *sess   = psk_session(ssl);
    *id     = (const unsigned char*)TLS_PSK_ID;
    *id_len = strlen(TLS_PSK_ID);
    return *sess != NULL;
}

static int psk_find(SSL *ssl, const unsigned char *id, size_t id_len, SSL_SESSION **sess)
{
    *sess = NULL;
    if ((id_len == strlen(TLS_PSK_ID)) && (memcmp(id, TLS_PSK_ID, id_len) == 0)) {
        *sess = psk_session(ssl);
        return *sess != NULL;
    }
    return 1;   /* no such key: the handshake fails, as this side has no certificate */
}

static SSL_CTX *ctx_new(int is_server)
{
    SSL_CTX *c = SSL_CTX_new(is_server ? TLS_server_method() : TLS_client_method());

    pthread_once(&tls_hs_once, tls_hs_index_new);
    if ((c == NULL) || (tls_hs_index < 0) ||
        !SSL_CTX_set_min_proto_version(c, TLS1_3_VERSION) ||
        !SSL_CTX_set_max_proto_version(c, TLS1_3_VERSION) ||
        !SSL_CTX_set_ciphersuites(c, "TLS_AES_128_GCM_SHA256") ||
        !SSL_CTX_set_num_tickets(c, 0)) {
        SSL_CTX_free(c);
        return NULL;
    }
    SSL_CTX_set_options(c, SSL_OP_NO_TICKET);
    SSL_CTX_set_keylog_callback(c, keylog);
    if (is_server) {
        SSL_CTX_set_psk_find_session_callback(c, psk_find);
    } else {
        SSL_CTX_set_psk_use_session_callback(c, psk_use);
    }
    return c;
}

/* Drive ssl's handshake on its non-blocking socket until done, failed, or until. */
static int handshake(SSL *ssl, int fd, int64_t until, char *why, size_t why_size)
{
    for (;;) {
        int ret = SSL_do_handshake(ssl);
        int err;

        if (ret == 1) {
            return 1;
        }
        err = SSL_get_error(ssl, ret);
        if ((err != SSL_ERROR_WANT_READ) && (err != SSL_ERROR_WANT_WRITE)) {
            unsigned long e = ERR_peek_last_error();
            char buf[256] = "the peer closed the connection";

            if (e != 0) {
                ERR_error_string_n(e, buf, sizeof(buf));
            } else if ((err == SSL_ERROR_SYSCALL) && (errno != 0)) {
                snprintf(buf, sizeof(buf), "%s", strerror(errno));
            }
            xfer_reason_set(why, why_size, "TLS handshake failed: %s", buf);
            return 0;
        }
        if (xfer_sock_wait(fd, (err == SSL_ERROR_WANT_READ) ? POLLIN : POLLOUT, until,
                           "finish the TLS handshake (XFER_TCP_TLS_TIMEOUT)", why,
                           why_size) != XFER_OK) {
            return 0;
        }
    }
}

xfer_status_t xfer_tcp_tls_ep_start(xfer_ep_h ep, char *why, size_t why_size)
{
    static const char psk_label[] = "xfer tcp tls 1.3 external psk";
    SSL_CTX *c = ctx_new(ep->is_server);
    SSL *ssl   = (c != NULL) ? SSL_new(c) : NULL;
    xfer_status_t status = XFER_ERR_NO_MEMORY;
    tls_hs_t hs;

    memset(&hs, 0, sizeof(hs));
    ERR_clear_error();
    if ((ssl == NULL) || !xfer_ep_secret_tag(ep->secret, psk_label, sizeof(psk_label) - 1,
                                             hs.psk) ||
        !SSL_set_ex_data(ssl, tls_hs_index, &hs) || !SSL_set_fd(ssl, ep->fd)) {
        xfer_reason_set(why, why_size, "TLS: cannot set up OpenSSL (out of memory?)");
        goto out;
    }
    status = XFER_ERR_CONNECTION;
    if (ep->is_server) {
        SSL_set_accept_state(ssl);
    } else {
        SSL_set_connect_state(ssl);
    }
    if (!handshake(ssl, ep->fd, xfer_now_ms() + (int64_t)(ep->iface->cfg->tls_timeout * 1000.0),
                   why, why_size)) {
        goto out;
    }
    if (!SSL_session_reused(ssl) || (hs.have != 3)) {
        xfer_reason_set(why, why_size, "TLS: the handshake did not use the endpoint's key");
        goto out;
    }
    if (SSL_export_keying_material(ssl, ep->tls_lanes, sizeof(ep->tls_lanes), TLS_LANES_LABEL,
                                   strlen(TLS_LANES_LABEL), NULL, 0, 0) != 1) {
        xfer_reason_set(why, why_size, "TLS: exporting the lanes' secret failed");
        goto out;
    }
    status = ep->is_server ?
             ktls_install(ep->fd, hs.server_secret, hs.client_secret, why, why_size) :
             ktls_install(ep->fd, hs.client_secret, hs.server_secret, why, why_size);
out:
    /* the socket stays open (OpenSSL's socket BIO does not own it) and sealed in the kernel */
    SSL_free(ssl);
    SSL_CTX_free(c);
    OPENSSL_cleanse(&hs, sizeof(hs));
    ERR_clear_error();
    return status;
}

/* ---- lanes ---------------------------------------------------------------------------------- */

xfer_status_t xfer_tcp_tls_lane(xfer_ep_h ep, unsigned idx, int fd, char *why, size_t why_size)
{
    uint8_t c2s[TLS_SECRET_LEN], s2c[TLS_SECRET_LEN], lane = (uint8_t)idx;
    xfer_status_t status;

    if (!expand_label(ep->tls_lanes, "c lane", &lane, 1, c2s, sizeof(c2s)) ||
        !expand_label(ep->tls_lanes, "s lane", &lane, 1, s2c, sizeof(s2c))) {
        xfer_reason_set(why, why_size, "TLS: deriving lane %u's secrets failed", idx);
        status = XFER_ERR_NO_MEMORY;
    } else {
        status = ep->is_server ? ktls_install(fd, s2c, c2s, why, why_size) :
                                 ktls_install(fd, c2s, s2c, why, why_size);
    }
    OPENSSL_cleanse(c2s, sizeof(c2s));
    OPENSSL_cleanse(s2c, sizeof(s2c));
    return status;
}
