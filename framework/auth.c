/* Who may connect: the shared key and the bootstrap's proofs (auth.h). */
#include "auth.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define KEY_MIN 16u
#define KEY_MAX 4096u

/* The MACs of the two sides differ by label, so that one side's MAC is never the other's,
 * and the endpoint's secret by another. */
static const char label_client[]   = "xfer-auth-v1 client";
static const char label_server[]   = "xfer-auth-v1 server";
static const char label_endpoint[] = "xfer-auth-v1 endpoint";

struct xfer_auth {
    const uint8_t *key;
    size_t        key_len;
    int           is_server;
    EVP_MD_CTX    *transcript;  /* SHA-256 of every frame so far, both directions */
};

/* ---- the key ------------------------------------------------------------------------------- */

static xfer_status_t key_set(xfer_context_t *ctx, const void *key, size_t len, const char *from,
                             char *why, size_t why_size)
{
    if ((len < KEY_MIN) || (len > KEY_MAX)) {
        snprintf(why, why_size, "%s: a key of %zu bytes (%u to %u)", from, len, KEY_MIN,
                 KEY_MAX);
        return XFER_ERR_INVALID_PARAM;
    }
    ctx->auth_key = malloc(len);
    if (ctx->auth_key == NULL) {
        snprintf(why, why_size, "%s: out of memory", from);
        return XFER_ERR_NO_MEMORY;
    }
    memcpy(ctx->auth_key, key, len);
    ctx->auth_key_len = len;
    return XFER_OK;
}

xfer_status_t xfer_auth_key_load(xfer_context_t *ctx, const xfer_context_params_t *params,
                                 char *why, size_t why_size)
{
    const char *path = ctx->fw_config.auth_key_file;
    uint8_t buf[KEY_MAX + 1];
    xfer_status_t status;
    struct stat st;
    ssize_t n;
    size_t got = 0;
    int fd;

    if ((params != NULL) &&
        (params->size >= offsetof(xfer_context_params_t, auth_key_len) +
                         sizeof(params->auth_key_len)) && (params->auth_key != NULL)) {
        return key_set(ctx, params->auth_key, params->auth_key_len,
                       "xfer_context_params_t.auth_key", why, why_size);
    }
    if ((path == NULL) || (*path == '\0')) {
        return XFER_OK;
    }
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        snprintf(why, why_size, "XFER_AUTH_KEY_FILE=%s: %s", path, strerror(errno));
        return XFER_ERR_INVALID_PARAM;
    }
    if ((fstat(fd, &st) != 0) || !S_ISREG(st.st_mode)) {
        snprintf(why, why_size, "XFER_AUTH_KEY_FILE=%s: not a regular file", path);
        close(fd);
        return XFER_ERR_INVALID_PARAM;
    }
    if (st.st_mode & (S_IRWXG | S_IRWXO)) {
        snprintf(why, why_size, "XFER_AUTH_KEY_FILE=%s: others may read or change it (mode "
                 "%03o); a key only its owner reads is a secret (chmod 600)", path,
                 (unsigned)(st.st_mode & 0777));
        close(fd);
        return XFER_ERR_INVALID_PARAM;
    }
    while (got < sizeof(buf)) {
        n = read(fd, buf + got, sizeof(buf) - got);
        if ((n < 0) && (errno == EINTR)) {
            continue;
        }
        if (n <= 0) {
            break;
        }
        got += (size_t)n;
    }
    close(fd);
    status = key_set(ctx, buf, got, "XFER_AUTH_KEY_FILE", why, why_size);
    OPENSSL_cleanse(buf, sizeof(buf));
    return status;
}

void xfer_auth_key_free(xfer_context_t *ctx)
{
    if (ctx->auth_key != NULL) {
        OPENSSL_cleanse(ctx->auth_key, ctx->auth_key_len);
        free(ctx->auth_key);
    }
    ctx->auth_key     = NULL;
    ctx->auth_key_len = 0;
}

/* ---- one handshake ------------------------------------------------------------------------- */

xfer_status_t xfer_auth_start(const xfer_context_t *ctx, int is_server, xfer_auth_t **a_p)
{
    xfer_auth_t *a;

    *a_p = NULL;
    if (!xfer_auth_enabled(ctx)) {
        return XFER_OK;
    }
    a = calloc(1, sizeof(*a));
    if (a == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    a->key        = ctx->auth_key;
    a->key_len    = ctx->auth_key_len;
    a->is_server  = is_server;
    a->transcript = EVP_MD_CTX_new();
    if ((a->transcript == NULL) ||
        (EVP_DigestInit_ex(a->transcript, EVP_sha256(), NULL) != 1)) {
        xfer_auth_free(a);
        return XFER_ERR_NO_MEMORY;
    }
    *a_p = a;
    return XFER_OK;
}

void xfer_auth_free(xfer_auth_t *a)
{
    if (a != NULL) {
        EVP_MD_CTX_free(a->transcript);
        free(a);
    }
}

void xfer_auth_absorb(xfer_auth_t *a, const void *buf, size_t len)
{
    (void)EVP_DigestUpdate(a->transcript, buf, len);
}

void xfer_auth_absorb_rx(xfer_auth_t *a, const xfer_boot_rx_t *rx)
{
    xfer_auth_absorb(a, rx->head, XFER_WIRE_HEADER_LEN);
    if (rx->hdr.body_len > 0) {
        xfer_auth_absorb(a, rx->body, rx->hdr.body_len);
    }
}

/* HMAC-SHA256(key, label || SHA-256(transcript so far)). */
static int mac_of(xfer_auth_t *a, const char *label, uint8_t *mac)
{
    size_t label_len  = strlen(label);
    uint8_t msg[64 + EVP_MAX_MD_SIZE];
    unsigned digest_len = 0, mac_len = 0;
    EVP_MD_CTX *copy = EVP_MD_CTX_new();
    int ok;

    ok = (copy != NULL) && (EVP_MD_CTX_copy_ex(copy, a->transcript) == 1) &&
         (EVP_DigestFinal_ex(copy, msg + label_len, &digest_len) == 1);
    EVP_MD_CTX_free(copy);
    if (!ok) {
        return 0;
    }
    memcpy(msg, label, label_len);
    return (HMAC(EVP_sha256(), a->key, (int)a->key_len, msg, label_len + digest_len, mac,
                 &mac_len) != NULL) && (mac_len == XFER_WIRE_AUTH_LEN);
}

static xfer_status_t frame(xfer_auth_t *a, xfer_wire_type_t type, const uint8_t *data,
                           uint8_t *buf)
{
    size_t len = XFER_WIRE_AUTH_FRAME_LEN;
    xfer_status_t status = xfer_wire_pack_auth(type, data, buf, &len);

    if (status == XFER_OK) {
        xfer_auth_absorb(a, buf, len);
    }
    return status;
}

xfer_status_t xfer_auth_nonce_frame(xfer_auth_t *a, uint8_t *buf)
{
    uint8_t nonce[XFER_WIRE_AUTH_LEN];

    if (RAND_bytes(nonce, sizeof(nonce)) != 1) {
        return XFER_ERR_IO;
    }
    return frame(a, XFER_WIRE_AUTH_NONCE, nonce, buf);
}

xfer_status_t xfer_auth_nonce_take(xfer_auth_t *a, const xfer_boot_rx_t *rx, char *why,
                                   size_t why_size)
{
    uint8_t nonce[XFER_WIRE_AUTH_LEN];
    xfer_status_t status;

    if (rx->hdr.type != XFER_WIRE_AUTH_NONCE) {
        snprintf(why, why_size, "expected AUTH_NONCE, got frame type %u", rx->hdr.type);
        return XFER_ERR_PROTOCOL;
    }
    status = xfer_wire_parse_auth(rx->body, rx->hdr.body_len, nonce, why, why_size);
    if (status == XFER_OK) {
        xfer_auth_absorb_rx(a, rx);
    }
    return status;
}

xfer_status_t xfer_auth_mac_frame(xfer_auth_t *a, uint8_t *buf)
{
    uint8_t mac[XFER_WIRE_AUTH_LEN];

    if (!mac_of(a, a->is_server ? label_server : label_client, mac)) {
        return XFER_ERR_NO_MEMORY;
    }
    return frame(a, XFER_WIRE_AUTH_MAC, mac, buf);
}

xfer_status_t xfer_auth_mac_check(xfer_auth_t *a, const xfer_boot_rx_t *rx, char *why,
                                  size_t why_size)
{
    uint8_t want[XFER_WIRE_AUTH_LEN], got[XFER_WIRE_AUTH_LEN];
    xfer_status_t status;

    if (rx->hdr.type != XFER_WIRE_AUTH_MAC) {
        snprintf(why, why_size, "expected AUTH_MAC, got frame type %u: the peer does not "
                 "authenticate", rx->hdr.type);
        return XFER_ERR_DENIED;
    }
    status = xfer_wire_parse_auth(rx->body, rx->hdr.body_len, got, why, why_size);
    if (status != XFER_OK) {
        return status;
    }
    if (!mac_of(a, a->is_server ? label_client : label_server, want)) {
        snprintf(why, why_size, "out of memory for a MAC");
        return XFER_ERR_NO_MEMORY;
    }
    if (CRYPTO_memcmp(want, got, sizeof(want)) != 0) {
        snprintf(why, why_size, "the peer's proof does not match: it holds another key, or "
                 "what was exchanged was changed, replayed or spliced");
        return XFER_ERR_DENIED;
    }
    xfer_auth_absorb_rx(a, rx);
    return XFER_OK;
}

xfer_status_t xfer_auth_ep_secret(xfer_auth_t *a, uint8_t *secret)
{
    return mac_of(a, label_endpoint, secret) ? XFER_OK : XFER_ERR_NO_MEMORY;
}

/* ---- what components prove with it --------------------------------------------------------- */

int xfer_ep_secret_tag(const uint8_t *secret, const void *msg, size_t len, uint8_t *tag)
{
    unsigned tag_len = 0;

    return (HMAC(EVP_sha256(), secret, XFER_EP_SECRET_LEN, msg, len, tag, &tag_len) != NULL) &&
           (tag_len == XFER_EP_SECRET_LEN);
}

int xfer_ep_secret_tag_equal(const uint8_t *a, const uint8_t *b)
{
    return CRYPTO_memcmp(a, b, XFER_EP_SECRET_LEN) == 0;
}
