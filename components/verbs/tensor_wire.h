/*
 * The tensor protocol's messages on the wire (the seeds' TENSOR_REQUEST, META_DATA_UPDATE,
 * TENSOR_RE_REQUEST and ERROR_STATUS), carried in the message slots behind the channel's
 * versioned header (verbs_wire.h), every field with an explicit width, little-endian.
 *
 *   TENSOR_REQUEST     (the 24-byte header) hdr.id = request index, hdr.tag = step;
 *                      extension:
 *                        0 u64 destination address   8 u32 its rkey   12 u32 key_len
 *                       16 meta (what the consumer expects; flag NONE when it knows nothing)
 *                       .. key_len bytes of key
 *                      A destination comes with an expectation: it holds exactly the bytes
 *                      the expected metadata says, and the producer writes there only a
 *                      tensor that matches it; else it answers META_DATA_UPDATE.
 *   META_DATA_UPDATE   hdr.id = request index; extension: meta (the tensor as published)
 *   TENSOR_RE_REQUEST  hdr.id = request index, hdr.size = the new destination's capacity;
 *                      extension: 0 u64 address  8 u32 rkey  12 u32 reserved (0)
 *   ERROR_STATUS       hdr.id = request index, hdr.status = the error (never XFER_OK),
 *                      hdr.tag = its direction: TO_CONSUMER (the producer cannot answer
 *                      the request) or WITHDRAW (the consumer gives its request up);
 *                      extension: 0 u32 reason_len  4 u32 reserved (0)  8 the reason text
 *
 *   meta:  a tensor's description as every transport carries it (component.h,
 *          xfer_tensor_wire_meta_t: 12 + 8 x rank bytes); NONE in a request that knows none
 *
 * The data itself
 * arrives by RDMA WRITE WITH IMMEDIATE, the immediate being XFER_TENSOR_IMM_FLAG | request
 * index: the flag tells it from a credit return (whose immediate is a count below 2^16).
 *
 * A request index names one slot of the consumer's request table and that slot's
 * generation, so that an answer to a request that is gone (cancelled, or a duplicate) finds
 * a generation that no longer matches and is rejected, not applied to the slot's new owner.
 */
#ifndef XFER_VERBS_TENSOR_WIRE_H
#define XFER_VERBS_TENSOR_WIRE_H

#include <xfer/component.h>

#include <stddef.h>
#include <stdint.h>

#define XFER_TENSOR_WIRE_REQ_FIXED   16u   /* before the meta */
#define XFER_TENSOR_WIRE_REREQ_LEN   16u
#define XFER_TENSOR_WIRE_ERR_FIXED   8u
#define XFER_TENSOR_WIRE_MAX_REASON  200u


/* ERROR_STATUS directions (hdr.tag): both sides of a channel may be consumer and producer. */
#define XFER_TENSOR_ERR_TO_CONSUMER  0u
#define XFER_TENSOR_ERR_WITHDRAW     1u

/* Request index: slot (low bits) and generation; 31 bits, the immediate's top bit flags a
 * tensor write. */
#define XFER_TENSOR_IDX_SLOT_BITS    20u
#define XFER_TENSOR_IDX_GEN_BITS     11u
#define XFER_TENSOR_IDX_MAX_SLOTS    (1u << XFER_TENSOR_IDX_SLOT_BITS)
#define XFER_TENSOR_IMM_FLAG         0x80000000u

static inline uint32_t xfer_tensor_idx_make(uint32_t slot, uint32_t gen)
{
    return ((gen & ((1u << XFER_TENSOR_IDX_GEN_BITS) - 1)) << XFER_TENSOR_IDX_SLOT_BITS) |
           (slot & (XFER_TENSOR_IDX_MAX_SLOTS - 1));
}

static inline uint32_t xfer_tensor_idx_slot(uint32_t idx)
{
    return idx & (XFER_TENSOR_IDX_MAX_SLOTS - 1);
}

static inline uint32_t xfer_tensor_idx_gen(uint32_t idx)
{
    return (idx >> XFER_TENSOR_IDX_SLOT_BITS) & ((1u << XFER_TENSOR_IDX_GEN_BITS) - 1);
}

typedef struct xfer_tensor_wire_req {
    uint64_t addr;                  /* destination; 0 with rkey 0 when there is none yet */
    uint32_t rkey;
    xfer_tensor_wire_meta_t expect;
    const uint8_t *key;             /* points into the message */
    uint32_t key_len;
} xfer_tensor_wire_req_t;

typedef struct xfer_tensor_wire_rereq {
    uint64_t addr;
    uint32_t rkey;
} xfer_tensor_wire_rereq_t;

typedef struct xfer_tensor_wire_err {
    const char *reason;             /* points into the message; not terminated */
    uint32_t   reason_len;
} xfer_tensor_wire_err_t;

/* Pack into buf, which has room for the extension (the *_len functions say how much);
 * return the bytes written. */
size_t xfer_tensor_wire_req_len(const xfer_tensor_wire_req_t *r);
size_t xfer_tensor_wire_pack_req(const xfer_tensor_wire_req_t *r, uint8_t *buf);
size_t xfer_tensor_wire_pack_rereq(const xfer_tensor_wire_rereq_t *r, uint8_t *buf);
size_t xfer_tensor_wire_pack_err(const char *reason, size_t reason_len, uint8_t *buf);

/* Parse an extension of exactly len bytes. Every length and count is checked against len
 * before it is used, and the metadata against itself (known dtype, rank, no negative
 * dimension, size = dims x dtype size for fixed-size dtypes, dead means size 0, unused
 * bits 0); XFER_ERR_PROTOCOL with why filled otherwise. */
xfer_status_t xfer_tensor_wire_unpack_req(const uint8_t *buf, size_t len, uint32_t max_key_len,
                                          xfer_tensor_wire_req_t *r, char *why,
                                          size_t why_size);
xfer_status_t xfer_tensor_wire_unpack_meta(const uint8_t *buf, size_t len,
                                           xfer_tensor_wire_meta_t *m, char *why,
                                           size_t why_size);
xfer_status_t xfer_tensor_wire_unpack_rereq(const uint8_t *buf, size_t len,
                                            xfer_tensor_wire_rereq_t *r, char *why,
                                            size_t why_size);
xfer_status_t xfer_tensor_wire_unpack_err(const uint8_t *buf, size_t len, int32_t status,
                                          xfer_tensor_wire_err_t *e, char *why,
                                          size_t why_size);

#endif
