/*
 * Little-endian loads and stores at any alignment, for wire formats: every xfer wire format
 * has explicit widths and little-endian byte order, never a memory image of a struct. On a
 * little-endian host each is one move.
 */
#ifndef XFER_BYTEORDER_H
#define XFER_BYTEORDER_H

#include <endian.h>
#include <stdint.h>
#include <string.h>

static inline void xfer_put_le16(uint8_t *p, uint16_t v)
{
    v = htole16(v);
    memcpy(p, &v, sizeof(v));
}

static inline void xfer_put_le32(uint8_t *p, uint32_t v)
{
    v = htole32(v);
    memcpy(p, &v, sizeof(v));
}

static inline void xfer_put_le64(uint8_t *p, uint64_t v)
{
    v = htole64(v);
    memcpy(p, &v, sizeof(v));
}

static inline uint16_t xfer_get_le16(const uint8_t *p)
{
    uint16_t v;

    memcpy(&v, p, sizeof(v));
    return le16toh(v);
}

static inline uint32_t xfer_get_le32(const uint8_t *p)
{
    uint32_t v;

    memcpy(&v, p, sizeof(v));
    return le32toh(v);
}

static inline uint64_t xfer_get_le64(const uint8_t *p)
{
    uint64_t v;

    memcpy(&v, p, sizeof(v));
    return le64toh(v);
}

#endif
