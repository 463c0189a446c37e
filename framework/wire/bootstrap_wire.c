/*
 * Packing and validating parsing of the bootstrap frames described in bootstrap_wire.h.
 */
#include "bootstrap_wire.h"
#include "../names.h"

#include <xfer/component.h>

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

/* A bounded cursor over a buffer: reads fail instead of running past the end. */
typedef struct cursor {
    const uint8_t *p;
    size_t        left;
} cursor_t;

static int take(cursor_t *c, void *dst, size_t n)
{
    if (c->left < n) {
        return 0;
    }
    memcpy(dst, c->p, n);
    c->p    += n;
    c->left -= n;
    return 1;
}

static int take_u8(cursor_t *c, uint8_t *v)
{
    return take(c, v, 1);
}

static int take_u16(cursor_t *c, uint16_t *v)
{
    uint16_t be;

    if (!take(c, &be, sizeof(be))) {
        return 0;
    }
    *v = ntohs(be);
    return 1;
}

static int take_u64(cursor_t *c, uint64_t *v)
{
    uint8_t b[8];

    if (!take(c, b, sizeof(b))) {
        return 0;
    }
    *v = 0;
    for (int i = 0; i < 8; i++) {
        *v = (*v << 8) | b[i];
    }
    return 1;
}

/* Writer counterpart: fails instead of overflowing. */
typedef struct writer {
    uint8_t *p;
    size_t  left;
    size_t  len;
} writer_t;

static int put(writer_t *w, const void *src, size_t n)
{
    if (w->left < n) {
        return 0;
    }
    memcpy(w->p, src, n);
    w->p    += n;
    w->left -= n;
    w->len  += n;
    return 1;
}

static int put_u8(writer_t *w, uint8_t v)
{
    return put(w, &v, 1);
}

static int put_u16(writer_t *w, uint16_t v)
{
    uint16_t be = htons(v);
    return put(w, &be, sizeof(be));
}

static int put_u32(writer_t *w, uint32_t v)
{
    uint32_t be = htonl(v);
    return put(w, &be, sizeof(be));
}

static int put_u64(writer_t *w, uint64_t v)
{
    uint8_t b[8];

    for (int i = 7; i >= 0; i--, v >>= 8) {
        b[i] = (uint8_t)v;
    }
    return put(w, b, sizeof(b));
}

/* Write the header with body_len patched in once the body is written. */
static xfer_status_t frame_begin(writer_t *w, void *buf, size_t size, xfer_wire_type_t type)
{
    w->p    = buf;
    w->left = size;
    w->len  = 0;
    if (!put_u32(w, XFER_WIRE_MAGIC) || !put_u16(w, XFER_WIRE_VERSION) ||
        !put_u16(w, (uint16_t)type) || !put_u32(w, 0)) {
        return XFER_ERR_NO_RESOURCE;
    }
    return XFER_OK;
}

static xfer_status_t frame_end(writer_t *w, void *buf, size_t *len_p)
{
    uint32_t body_len = (uint32_t)(w->len - XFER_WIRE_HEADER_LEN);
    uint32_t be       = htonl(body_len);

    if (body_len > XFER_WIRE_MAX_BODY) {
        return XFER_ERR_OUT_OF_RANGE;
    }
    memcpy((uint8_t*)buf + 8, &be, sizeof(be));
    *len_p = w->len;
    return XFER_OK;
}

xfer_status_t xfer_wire_pack_hello(const xfer_wire_hello_t *hello, void *buf, size_t *len_p)
{
    xfer_status_t status;
    writer_t w;

    if (hello->num > XFER_WIRE_MAX_TRANSPORTS) {
        return XFER_ERR_OUT_OF_RANGE;
    }
    status = frame_begin(&w, buf, *len_p, XFER_WIRE_HELLO);
    if (status != XFER_OK) {
        return status;
    }
    if (!put_u16(&w, hello->num)) {
        return XFER_ERR_NO_RESOURCE;
    }
    for (uint16_t i = 0; i < hello->num; i++) {
        const xfer_wire_transport_t *t = &hello->transports[i];
        size_t name_len                = strnlen(t->name, sizeof(t->name));

        if (!xfer_name_is_valid(t->name, name_len, XFER_WIRE_MAX_NAME) ||
            (t->addr_len > XFER_WIRE_MAX_ADDR)) {
            return XFER_ERR_INVALID_PARAM;
        }
        if (!put_u8(&w, (uint8_t)name_len) || !put(&w, t->name, name_len) ||
            !put_u16(&w, t->addr_len) || !put(&w, t->addr, t->addr_len)) {
            return XFER_ERR_NO_RESOURCE;
        }
    }
    return frame_end(&w, buf, len_p);
}

xfer_status_t xfer_wire_pack_accept(const char *name, void *buf, size_t *len_p)
{
    size_t name_len = strlen(name);
    xfer_status_t status;
    writer_t w;

    if (!xfer_name_is_valid(name, name_len, XFER_WIRE_MAX_NAME)) {
        return XFER_ERR_INVALID_PARAM;
    }
    status = frame_begin(&w, buf, *len_p, XFER_WIRE_ACCEPT);
    if (status != XFER_OK) {
        return status;
    }
    if (!put_u8(&w, (uint8_t)name_len) || !put(&w, name, name_len)) {
        return XFER_ERR_NO_RESOURCE;
    }
    return frame_end(&w, buf, len_p);
}

xfer_status_t xfer_wire_pack_reject(xfer_status_t status, const char *reason, void *buf,
                                    size_t *len_p)
{
    size_t reason_len = strnlen(reason, XFER_WIRE_MAX_REASON);
    xfer_status_t ret;
    writer_t w;

    ret = frame_begin(&w, buf, *len_p, XFER_WIRE_REJECT);
    if (ret != XFER_OK) {
        return ret;
    }
    if (!put_u16(&w, (uint16_t)(int16_t)status) || !put_u16(&w, (uint16_t)reason_len) ||
        !put(&w, reason, reason_len)) {
        return XFER_ERR_NO_RESOURCE;
    }
    return frame_end(&w, buf, len_p);
}

xfer_status_t xfer_wire_pack_auth(xfer_wire_type_t type, const uint8_t *data, void *buf,
                                  size_t *len_p)
{
    xfer_status_t status;
    writer_t w;

    if ((type != XFER_WIRE_AUTH_NONCE) && (type != XFER_WIRE_AUTH_MAC)) {
        return XFER_ERR_INVALID_PARAM;
    }
    status = frame_begin(&w, buf, *len_p, type);
    if (status != XFER_OK) {
        return status;
    }
    if (!put(&w, data, XFER_WIRE_AUTH_LEN)) {
        return XFER_ERR_NO_RESOURCE;
    }
    return frame_end(&w, buf, len_p);
}

xfer_status_t xfer_wire_parse_auth(const void *body, size_t body_len, uint8_t *data,
                                   char *why, size_t why_size)
{
    if (body_len != XFER_WIRE_AUTH_LEN) {
        snprintf(why, why_size, "an authentication frame of %zu bytes (%u expected)", body_len,
                 XFER_WIRE_AUTH_LEN);
        return XFER_ERR_PROTOCOL;
    }
    memcpy(data, body, XFER_WIRE_AUTH_LEN);
    return XFER_OK;
}

xfer_status_t xfer_wire_parse_header(const void *buf, size_t len, xfer_wire_header_t *hdr,
                                     char *why, size_t why_size)
{
    uint32_t be32;
    uint16_t be16;
    const uint8_t *p = buf;

    if (len < XFER_WIRE_HEADER_LEN) {
        snprintf(why, why_size, "frame header truncated: %zu of %u bytes", len,
                 XFER_WIRE_HEADER_LEN);
        return XFER_ERR_TRUNCATED;
    }
    memcpy(&be32, p, 4);
    hdr->magic = ntohl(be32);
    memcpy(&be16, p + 4, 2);
    hdr->version = ntohs(be16);
    memcpy(&be16, p + 6, 2);
    hdr->type = ntohs(be16);
    memcpy(&be32, p + 8, 4);
    hdr->body_len = ntohl(be32);

    if (hdr->magic != XFER_WIRE_MAGIC) {
        snprintf(why, why_size, "wrong magic 0x%08x (expected 0x%08x): not an xfer peer",
                 hdr->magic, XFER_WIRE_MAGIC);
        return XFER_ERR_PROTOCOL;
    }
    if (hdr->version != XFER_WIRE_VERSION) {
        snprintf(why, why_size, "peer speaks bootstrap protocol version %u, this library "
                 "speaks %u", hdr->version, XFER_WIRE_VERSION);
        return XFER_ERR_PROTOCOL;
    }
    if ((hdr->type < XFER_WIRE_HELLO) || (hdr->type > XFER_WIRE_AUTH_MAC)) {
        snprintf(why, why_size, "unknown frame type %u", hdr->type);
        return XFER_ERR_PROTOCOL;
    }
    if (hdr->body_len > XFER_WIRE_MAX_BODY) {
        snprintf(why, why_size, "frame body of %u bytes exceeds the limit of %u",
                 hdr->body_len, XFER_WIRE_MAX_BODY);
        return XFER_ERR_PROTOCOL;
    }
    return XFER_OK;
}

xfer_status_t xfer_wire_parse_hello(const void *body, size_t body_len, xfer_wire_hello_t *hello,
                                    char *why, size_t why_size)
{
    cursor_t c = {body, body_len};

    memset(hello, 0, sizeof(*hello));
    if (!take_u16(&c, &hello->num)) {
        snprintf(why, why_size, "HELLO truncated before the transport count");
        return XFER_ERR_PROTOCOL;
    }
    if (hello->num > XFER_WIRE_MAX_TRANSPORTS) {
        snprintf(why, why_size, "HELLO lists %u transports, the limit is %u", hello->num,
                 XFER_WIRE_MAX_TRANSPORTS);
        return XFER_ERR_PROTOCOL;
    }
    for (uint16_t i = 0; i < hello->num; i++) {
        xfer_wire_transport_t *t = &hello->transports[i];
        uint8_t name_len;

        if (!take_u8(&c, &name_len) || (name_len == 0) || (name_len > XFER_WIRE_MAX_NAME) ||
            !take(&c, t->name, name_len)) {
            snprintf(why, why_size, "HELLO transport %u: bad or truncated name", i);
            return XFER_ERR_PROTOCOL;
        }
        t->name[name_len] = '\0';
        if (!xfer_name_is_valid(t->name, name_len, XFER_WIRE_MAX_NAME)) {
            snprintf(why, why_size, "HELLO transport %u: name has characters outside "
                     "[a-z0-9_]", i);
            return XFER_ERR_PROTOCOL;
        }
        if (!take_u16(&c, &t->addr_len) || (t->addr_len > XFER_WIRE_MAX_ADDR) ||
            !take(&c, t->addr, t->addr_len)) {
            snprintf(why, why_size, "HELLO transport '%s': address length %u is truncated or "
                     "over the limit of %u", t->name, t->addr_len, XFER_WIRE_MAX_ADDR);
            return XFER_ERR_PROTOCOL;
        }
        for (uint16_t j = 0; j < i; j++) {
            if (strcmp(hello->transports[j].name, t->name) == 0) {
                snprintf(why, why_size, "HELLO lists transport '%s' twice", t->name);
                return XFER_ERR_PROTOCOL;
            }
        }
    }
    if (c.left != 0) {
        snprintf(why, why_size, "HELLO has %zu trailing bytes", c.left);
        return XFER_ERR_PROTOCOL;
    }
    return XFER_OK;
}

xfer_status_t xfer_wire_pack_connect(const xfer_wire_connect_t *conn, void *buf, size_t *len_p)
{
    xfer_status_t status;
    writer_t w;

    if (conn->addr_len > XFER_WIRE_MAX_ADDR) {
        return XFER_ERR_INVALID_PARAM;
    }
    status = frame_begin(&w, buf, *len_p, XFER_WIRE_CONNECT);
    if (status != XFER_OK) {
        return status;
    }
    if (!put_u64(&w, conn->context_id) || !put_u16(&w, conn->addr_len) ||
        !put(&w, conn->addr, conn->addr_len)) {
        return XFER_ERR_NO_RESOURCE;
    }
    return frame_end(&w, buf, len_p);
}

xfer_status_t xfer_wire_parse_connect(const void *body, size_t body_len,
                                      xfer_wire_connect_t *conn, char *why, size_t why_size)
{
    cursor_t c = {body, body_len};

    memset(conn, 0, sizeof(*conn));
    if (!take_u64(&c, &conn->context_id) || !take_u16(&c, &conn->addr_len) ||
        (conn->addr_len > XFER_WIRE_MAX_ADDR) || !take(&c, conn->addr, conn->addr_len) ||
        (c.left != 0)) {
        snprintf(why, why_size, "CONNECT frame is malformed (%zu bytes)", body_len);
        return XFER_ERR_PROTOCOL;
    }
    return XFER_OK;
}

xfer_status_t xfer_wire_parse_accept(const void *body, size_t body_len, char *name,
                                     char *why, size_t why_size)
{
    cursor_t c = {body, body_len};
    uint8_t name_len;

    if (!take_u8(&c, &name_len) || (name_len == 0) || (name_len > XFER_WIRE_MAX_NAME) ||
        !take(&c, name, name_len) || (c.left != 0)) {
        snprintf(why, why_size, "ACCEPT frame is malformed (%zu bytes)", body_len);
        return XFER_ERR_PROTOCOL;
    }
    name[name_len] = '\0';
    if (!xfer_name_is_valid(name, name_len, XFER_WIRE_MAX_NAME)) {
        snprintf(why, why_size, "ACCEPT names an invalid transport");
        return XFER_ERR_PROTOCOL;
    }
    return XFER_OK;
}

xfer_status_t xfer_wire_parse_reject(const void *body, size_t body_len,
                                     xfer_wire_reject_t *reject, char *why, size_t why_size)
{
    cursor_t c = {body, body_len};
    uint16_t status, reason_len;

    memset(reject, 0, sizeof(*reject));
    if (!take_u16(&c, &status) || !take_u16(&c, &reason_len) ||
        (reason_len > XFER_WIRE_MAX_REASON) || !take(&c, reject->reason, reason_len) ||
        (c.left != 0)) {
        snprintf(why, why_size, "REJECT frame is malformed (%zu bytes)", body_len);
        return XFER_ERR_PROTOCOL;
    }
    reject->status = (int16_t)status;
    /* the reason is printed: keep it to printable text (in place) */
    xfer_reason_copy(reject->reason, (size_t)reason_len + 1, reject->reason, reason_len);
    return XFER_OK;
}

static void offer_list(const xfer_wire_hello_t *h, char *buf, size_t size)
{
    size_t off = 0;

    buf[0] = '\0';
    for (uint16_t i = 0; (i < h->num) && (off < size); i++) {
        int n = snprintf(buf + off, size - off, "%s%s", i ? "," : "", h->transports[i].name);
        if (n < 0) {
            break;
        }
        off += (size_t)n;
    }
    if (h->num == 0) {
        snprintf(buf, size, "nothing");
    }
}

static int server_offers(const xfer_wire_hello_t *server, const char *name)
{
    for (uint16_t j = 0; j < server->num; j++) {
        if (strcmp(server->transports[j].name, name) == 0) {
            return 1;
        }
    }
    return 0;
}

int xfer_wire_negotiate_reachable(const xfer_wire_hello_t *client,
                                  const xfer_wire_hello_t *server,
                                  xfer_wire_reachable_func_t reachable, void *arg, char *why,
                                  size_t why_size)
{
    char offered_c[256], offered_s[256], skipped[XFER_WIRE_MAX_REASON + 1], one[256];
    size_t off = 0;
    int n;

    skipped[0] = '\0';
    for (uint16_t i = 0; i < client->num; i++) {
        const xfer_wire_transport_t *t = &client->transports[i];

        if (!server_offers(server, t->name)) {
            continue;
        }
        if (reachable == NULL) {
            return i;
        }
        one[0] = '\0';
        if (reachable(arg, t->name, t->addr, t->addr_len, one, sizeof(one))) {
            return i;
        }
        one[sizeof(one) - 1] = '\0';
        if (off < sizeof(skipped)) {
            n = snprintf(skipped + off, sizeof(skipped) - off, "; %s unreachable: %s", t->name,
                         one[0] ? one : "no reason given");
            off += (n > 0) ? (size_t)n : 0;
        }
    }
    offer_list(client, offered_c, sizeof(offered_c));
    offer_list(server, offered_s, sizeof(offered_s));
    snprintf(why, why_size, "no shared transport%s: client offered %s; server offered %s%s",
             skipped[0] ? " reaches the client" : "", offered_c, offered_s, skipped);
    return -1;
}

int xfer_wire_negotiate(const xfer_wire_hello_t *client, const xfer_wire_hello_t *server,
                        char *why, size_t why_size)
{
    return xfer_wire_negotiate_reachable(client, server, NULL, NULL, why, why_size);
}
