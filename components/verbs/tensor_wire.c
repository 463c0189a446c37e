/*
 * Packing and validating parsing of the tensor protocol's messages (tensor_wire.h). Pure
 * functions of their arguments, so that tests can build hostile messages with them.
 */
#include "tensor_wire.h"

#include <xfer/byteorder.h>
#include <xfer/component.h>

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* 1 (and why filled) when a part of len bytes is shorter than the need bytes it must have. */
static int too_short(const char *what, size_t len, size_t need, char *why, size_t why_size)
{
    if (len >= need) {
        return 0;
    }
    snprintf(why, why_size, "%s of %zu bytes is shorter than its fixed part (%zu)", what, len,
             need);
    return 1;
}

xfer_status_t xfer_tensor_wire_unpack_meta(const uint8_t *buf, size_t len,
                                           xfer_tensor_wire_meta_t *m, char *why,
                                           size_t why_size)
{
    size_t used;

    if (xfer_tensor_wire_parse_meta(buf, len, m, &used, why, why_size) != XFER_OK) {
        return XFER_ERR_PROTOCOL;
    }
    if (m->flags & XFER_TENSOR_META_NONE) {
        snprintf(why, why_size, "META_DATA_UPDATE without metadata");
        return XFER_ERR_PROTOCOL;
    }
    if (used != len) {
        snprintf(why, why_size, "META_DATA_UPDATE of rank %" PRIu32 " is %zu bytes, not %zu",
                 m->rank, len, used);
        return XFER_ERR_PROTOCOL;
    }
    return XFER_OK;
}

size_t xfer_tensor_wire_req_len(const xfer_tensor_wire_req_t *r)
{
    return XFER_TENSOR_WIRE_REQ_FIXED + xfer_tensor_wire_meta_len(&r->expect) + r->key_len;
}

size_t xfer_tensor_wire_pack_req(const xfer_tensor_wire_req_t *r, uint8_t *buf)
{
    size_t off;

    xfer_put_le64(buf, r->addr);
    xfer_put_le32(buf + 8, r->rkey);
    xfer_put_le32(buf + 12, r->key_len);
    off  = XFER_TENSOR_WIRE_REQ_FIXED;
    off += xfer_tensor_wire_pack_meta(&r->expect, buf + off);
    memcpy(buf + off, r->key, r->key_len);
    return off + r->key_len;
}

xfer_status_t xfer_tensor_wire_unpack_req(const uint8_t *buf, size_t len, uint32_t max_key_len,
                                          xfer_tensor_wire_req_t *r, char *why,
                                          size_t why_size)
{
    size_t used;

    memset(r, 0, sizeof(*r));
    if (too_short("TENSOR_REQUEST", len, XFER_TENSOR_WIRE_REQ_FIXED, why, why_size)) {
        return XFER_ERR_PROTOCOL;
    }
    r->addr    = xfer_get_le64(buf);
    r->rkey    = xfer_get_le32(buf + 8);
    r->key_len = xfer_get_le32(buf + 12);
    if (xfer_tensor_wire_parse_meta(buf + XFER_TENSOR_WIRE_REQ_FIXED,
                                    len - XFER_TENSOR_WIRE_REQ_FIXED, &r->expect, &used, why,
                                    why_size) != XFER_OK) {
        return XFER_ERR_PROTOCOL;
    }
    if ((r->key_len == 0) || (r->key_len > max_key_len)) {
        snprintf(why, why_size, "TENSOR_REQUEST key of %" PRIu32 " bytes (1 to %" PRIu32
                 " allowed)", r->key_len, max_key_len);
        return XFER_ERR_PROTOCOL;
    }
    if (len - XFER_TENSOR_WIRE_REQ_FIXED - used != r->key_len) {
        snprintf(why, why_size, "TENSOR_REQUEST says its key has %" PRIu32 " bytes, %zu "
                 "follow the metadata", r->key_len, len - XFER_TENSOR_WIRE_REQ_FIXED - used);
        return XFER_ERR_PROTOCOL;
    }
    r->key = buf + XFER_TENSOR_WIRE_REQ_FIXED + used;
    return XFER_OK;
}

size_t xfer_tensor_wire_pack_rereq(const xfer_tensor_wire_rereq_t *r, uint8_t *buf)
{
    xfer_put_le64(buf, r->addr);
    xfer_put_le32(buf + 8, r->rkey);
    xfer_put_le32(buf + 12, 0);
    return XFER_TENSOR_WIRE_REREQ_LEN;
}

xfer_status_t xfer_tensor_wire_unpack_rereq(const uint8_t *buf, size_t len,
                                            xfer_tensor_wire_rereq_t *r, char *why,
                                            size_t why_size)
{
    if (len != XFER_TENSOR_WIRE_REREQ_LEN) {
        snprintf(why, why_size, "TENSOR_RE_REQUEST of %zu bytes, not %u", len,
                 XFER_TENSOR_WIRE_REREQ_LEN);
        return XFER_ERR_PROTOCOL;
    }
    if (xfer_get_le32(buf + 12) != 0) {
        snprintf(why, why_size, "TENSOR_RE_REQUEST: reserved word is 0x%08" PRIx32,
                 xfer_get_le32(buf + 12));
        return XFER_ERR_PROTOCOL;
    }
    r->addr = xfer_get_le64(buf);
    r->rkey = xfer_get_le32(buf + 8);
    return XFER_OK;
}

size_t xfer_tensor_wire_pack_err(const char *reason, size_t reason_len, uint8_t *buf)
{
    if (reason_len > XFER_TENSOR_WIRE_MAX_REASON) {
        reason_len = XFER_TENSOR_WIRE_MAX_REASON;
    }
    xfer_put_le32(buf, (uint32_t)reason_len);
    xfer_put_le32(buf + 4, 0);
    if (reason_len > 0) {
        memcpy(buf + XFER_TENSOR_WIRE_ERR_FIXED, reason, reason_len);
    }
    return XFER_TENSOR_WIRE_ERR_FIXED + reason_len;
}

xfer_status_t xfer_tensor_wire_unpack_err(const uint8_t *buf, size_t len, int32_t status,
                                          xfer_tensor_wire_err_t *e, char *why,
                                          size_t why_size)
{
    memset(e, 0, sizeof(*e));
    if (too_short("ERROR_STATUS", len, XFER_TENSOR_WIRE_ERR_FIXED, why, why_size)) {
        return XFER_ERR_PROTOCOL;
    }
    e->reason_len = xfer_get_le32(buf);
    if ((e->reason_len > XFER_TENSOR_WIRE_MAX_REASON) ||
        (e->reason_len != len - XFER_TENSOR_WIRE_ERR_FIXED) || (xfer_get_le32(buf + 4) != 0)) {
        snprintf(why, why_size, "ERROR_STATUS says its reason has %" PRIu32 " bytes (at most "
                 "%u), %zu follow", e->reason_len, XFER_TENSOR_WIRE_MAX_REASON,
                 len - XFER_TENSOR_WIRE_ERR_FIXED);
        return XFER_ERR_PROTOCOL;
    }
    if ((status >= XFER_OK) || (status < XFER_ERR_LOWEST)) {
        snprintf(why, why_size, "ERROR_STATUS carries status %" PRId32 ", not an error this "
                 "side knows", status);
        return XFER_ERR_PROTOCOL;
    }
    e->reason = (const char*)(buf + XFER_TENSOR_WIRE_ERR_FIXED);
    return XFER_OK;
}
