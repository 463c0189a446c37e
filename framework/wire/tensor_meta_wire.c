/*
 * A tensor's description on the wire (component.h), packed and parsed once for every
 * transport: pure functions of their arguments, so that the fuzzers and the tests build and
 * parse hostile descriptions with them. Nothing read is trusted: the rank is checked before a
 * dimension is read, every length against the bytes there.
 */
#include <xfer/byteorder.h>
#include <xfer/component.h>

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#define META_KNOWN_FLAGS (XFER_TENSOR_META_DEAD | XFER_TENSOR_META_NONE)

void xfer_tensor_wire_meta_from(xfer_tensor_wire_meta_t *m, const xfer_tensor_t *t)
{
    memset(m, 0, sizeof(*m));
    if (t == NULL) {
        m->flags = XFER_TENSOR_META_NONE;
        return;
    }
    m->dtype = (uint32_t)t->dtype;
    m->rank  = t->rank;
    m->flags = t->is_dead ? XFER_TENSOR_META_DEAD : 0;
    m->size  = t->is_dead ? 0 : t->size;
    for (uint32_t i = 0; (i < t->rank) && (i < XFER_TENSOR_MAX_RANK); i++) {
        m->dims[i] = t->dims[i];
    }
}

void xfer_tensor_wire_meta_to(const xfer_tensor_wire_meta_t *m, xfer_tensor_t *t)
{
    memset(t, 0, sizeof(*t));
    t->dtype   = (xfer_dtype_t)m->dtype;
    t->rank    = m->rank;
    t->size    = m->size;
    t->is_dead = (m->flags & XFER_TENSOR_META_DEAD) ? 1 : 0;
    for (uint32_t i = 0; (i < m->rank) && (i < XFER_TENSOR_MAX_RANK); i++) {
        t->dims[i] = m->dims[i];
    }
}

size_t xfer_tensor_wire_pack_meta(const xfer_tensor_wire_meta_t *m, uint8_t *buf)
{
    /* dtype, rank and flags of a description built here or checked all fit a byte */
    xfer_put_le64(buf, m->size);
    buf[8]  = (uint8_t)m->dtype;
    buf[9]  = (uint8_t)m->rank;
    buf[10] = (uint8_t)m->flags;
    buf[11] = 0;
    for (uint32_t i = 0; i < m->rank; i++) {
        xfer_put_le64(buf + XFER_TENSOR_WIRE_META_FIXED + 8 * i, (uint64_t)m->dims[i]);
    }
    return xfer_tensor_wire_meta_len(m);
}

xfer_status_t xfer_tensor_wire_parse_meta(const uint8_t *buf, size_t len,
                                          xfer_tensor_wire_meta_t *m, size_t *used_p,
                                          char *why, size_t why_size)
{
    size_t need;

    memset(m, 0, sizeof(*m));
    if (len < XFER_TENSOR_WIRE_META_FIXED) {
        snprintf(why, why_size, "tensor metadata of %zu bytes is shorter than its fixed part "
                 "(%u)", len, XFER_TENSOR_WIRE_META_FIXED);
        return XFER_ERR_PROTOCOL;
    }
    m->size  = xfer_get_le64(buf);
    m->dtype = buf[8];
    m->rank  = buf[9];
    m->flags = buf[10];
    if (buf[11] != 0) {
        snprintf(why, why_size, "tensor metadata: reserved byte is 0x%02x", buf[11]);
        return XFER_ERR_PROTOCOL;
    }
    if (m->flags & ~META_KNOWN_FLAGS) {
        snprintf(why, why_size, "tensor metadata: unknown flags 0x%" PRIx32, m->flags);
        return XFER_ERR_PROTOCOL;
    }
    if (m->rank > XFER_TENSOR_MAX_RANK) {
        snprintf(why, why_size, "tensor metadata: rank %" PRIu32 " exceeds %u", m->rank,
                 XFER_TENSOR_MAX_RANK);
        return XFER_ERR_PROTOCOL;
    }
    need = xfer_tensor_wire_meta_len(m);
    if (len < need) {
        snprintf(why, why_size, "tensor metadata of rank %" PRIu32 " needs %zu bytes, %zu "
                 "arrived", m->rank, need, len);
        return XFER_ERR_PROTOCOL;
    }
    for (uint32_t i = 0; i < m->rank; i++) {
        m->dims[i] = (int64_t)xfer_get_le64(buf + XFER_TENSOR_WIRE_META_FIXED + 8 * i);
    }
    if (m->flags & XFER_TENSOR_META_NONE) {
        /* "no tensor": nothing else may be said */
        if ((m->flags != XFER_TENSOR_META_NONE) || (m->dtype != 0) || (m->rank != 0) ||
            (m->size != 0)) {
            snprintf(why, why_size, "tensor metadata marked none carries dtype %" PRIu32
                     ", rank %" PRIu32 ", size %" PRIu64 ", flags 0x%" PRIx32, m->dtype,
                     m->rank, m->size, m->flags);
            return XFER_ERR_PROTOCOL;
        }
    } else if (xfer_tensor_meta_check(m->dtype, m->rank, m->dims, m->size,
                                      (m->flags & XFER_TENSOR_META_DEAD) != 0, why,
                                      why_size) != XFER_OK) {
        return XFER_ERR_PROTOCOL;
    }
    *used_p = need;
    return XFER_OK;
}

int xfer_tensor_wire_meta_equal(const xfer_tensor_wire_meta_t *a,
                                const xfer_tensor_wire_meta_t *b)
{
    if ((a->flags != b->flags) || (a->dtype != b->dtype) || (a->rank != b->rank) ||
        (a->size != b->size)) {
        return 0;
    }
    for (uint32_t i = 0; i < a->rank; i++) {
        if (a->dims[i] != b->dims[i]) {
            return 0;
        }
    }
    return 1;
}
