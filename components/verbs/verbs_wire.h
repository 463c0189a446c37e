/*
 * The verbs component's wire format: the messages that travel through the message slots
 * (RDMA SENDs into the peer's posted receives), and the addresses exchanged through the
 * bootstrap. Every field has an explicit width and is little-endian; one unpack function
 * per message checks every length against what arrived before anything is used.
 *
 * A message is a header, a type-specific extension, then a payload. Every header starts
 * with the same 8 bytes:
 *
 *   0  u16 magic 0x5856 ("XV")   2 u8 version   3 u8 type
 *   4  u16 credits returned      6 u16 reserved (0)
 *
 * An eager TAG message - the small-message latency path - has a 16-byte header; its payload
 * is the rest of what arrived (the receive completion's length):
 *
 *   8  u64 tag
 *
 * A TENSOR_REQUEST - one per tensor fetch - has a 24-byte header; its extension is the rest
 * of what arrived:
 *
 *   8  u64 step                 16 u64 request index (where the 40-byte layout has its id)
 *
 * Every other type has a 40-byte header:
 *
 *   8  i32 status               12 u32 length: bytes after the header (extension + payload)
 *  16  u64 id                   24 u64 tag (RTS)
 *  32  u64 size (RTS: message length; TENSOR_RE_REQUEST: the destination's capacity)
 *
 * Every header that is not a TAG's keeps its id at offset 16, so that a side that cannot
 * read a message (another version, an unknown type) still names it in its answer.
 *
 * (TAG messages had the 40-byte header too up to version 2, TENSOR_REQUESTs up to version
 * 3. Their length, status and size said nothing that the completion, the extension or the
 * expected metadata does not, and each byte of a small message costs: on Soft-RoCE the 24
 * bytes fewer took xfer_perf -t tag_lat's median from 12.34 to 11.92 usec, 16 alternating
 * runs each in one guest boot; see tensor_wire.h for the request.)
 *
 * A NOTIFY (a batch's notification, verbs_batch.c) has the 40-byte header; its extension is
 * the notification (0 bytes or more, at most the receiver's XFER_NOTIFY_MAX_LEN).
 *
 * A BYE is the last message of an endpoint that closes in order, after its flush: a 40-byte
 * header whose tag is how many of the receiver's work requests that take a receive (sends,
 * writes with immediate) the sender's receives took before it, and whose status, length, id
 * and size are 0. RC executes in order, so everything the receiver posted before the last of
 * those is in the sender's memory: the receiver's flush may succeed on it.
 *
 * The tensor messages' extensions are in tensor_wire.h. A message of another version or of
 * an unknown type is refused with XFER_ERR_UNSUPPORTED (the header's fields are still read,
 * so that the receiver can name the message in an ERROR_STATUS back to the sender); one
 * whose lengths do not hold is XFER_ERR_PROTOCOL.
 *
 * Credits also come back alone, as a zero-length RDMA WRITE WITH IMMEDIATE whose immediate
 * (network order) is the count: it needs no message buffer on either side.
 */
#ifndef XFER_VERBS_WIRE_H
#define XFER_VERBS_WIRE_H

#include <xfer/xfer.h>

#include <stddef.h>
#include <stdint.h>

#define XFER_VERBS_WIRE_MAGIC    0x5856u
#define XFER_VERBS_WIRE_VERSION  7u     /* 2: the seeds' tensor messages replaced TREQ/TRESP;
                                         * 3: a 16-byte header for eager TAG messages;
                                         * 4: a 24-byte header and compact metadata for
                                         *    TENSOR_REQUEST;
                                         * 5: the endpoint address carries magic, version
                                         *    and the RDMA chunk size;
                                         * 6: NOTIFY, a batch's notification;
                                         * 7: BYE, an orderly close */
#define XFER_VERBS_WIRE_HDR_LEN  40u     /* the header of every type but TAG, TENSOR_REQUEST */
#define XFER_VERBS_WIRE_TAG_HDR_LEN 16u  /* an eager TAG message's header */
#define XFER_VERBS_WIRE_TREQ_HDR_LEN 24u /* a TENSOR_REQUEST's header */
#define XFER_VERBS_WIRE_HDR_COMMON  8u   /* what every header starts with */
#define XFER_VERBS_WIRE_RTS_LEN  16u      /* addr u64, rkey u32, reserved u32 */

typedef enum {
    XFER_VERBS_MSG_TAG     = 1,   /* eager tagged message: payload is the data */
    XFER_VERBS_MSG_RTS     = 2,   /* rendezvous: the receiver reads size bytes at addr/rkey */
    XFER_VERBS_MSG_FIN     = 3,   /* the read of RTS id is done (status) */
    XFER_VERBS_MSG_TENSOR_REQUEST    = 4, /* consumer: key, destination, expected metadata */
    XFER_VERBS_MSG_META_DATA_UPDATE  = 5, /* producer: the tensor is not what was expected */
    XFER_VERBS_MSG_TENSOR_RE_REQUEST = 6, /* consumer: a new destination, write there */
    XFER_VERBS_MSG_ERROR_STATUS      = 7, /* either side: request id failed (or withdrawn) */
    XFER_VERBS_MSG_NOTIFY            = 8, /* a batch's notification: its bytes are the
                                           * extension; id: the batch's number (for logs) */
    XFER_VERBS_MSG_BYE               = 9, /* the sender's endpoint closes in order: what it
                                           * sent before is delivered; tag: the receiver's
                                           * messages it took, every other field 0 */
    XFER_VERBS_MSG_LAST
} xfer_verbs_msg_type_t;

typedef struct xfer_verbs_wire_hdr {
    uint8_t  version;
    uint8_t  type;
    uint16_t credits;
    int32_t  status;
    uint32_t length;
    uint64_t id;
    uint64_t tag;
    uint64_t size;
} xfer_verbs_wire_hdr_t;

typedef struct xfer_verbs_wire_rts {
    uint64_t addr;
    uint32_t rkey;
} xfer_verbs_wire_rts_t;

/* What each side learns from the other's iface address (from HELLO) and endpoint address
 * (from CONNECT).
 *
 * The endpoint address (56 bytes) starts with the magic and the wire version, so that a peer
 * of another version is refused when the endpoints connect, before any message:
 *
 *   0  u16 magic 0x5856   2 u8 version   3 u8 reserved (0)
 *   4  u32 qpn            8 u32 psn     12 u32 rx_slots      16 u32 seg_size
 *  20  u32 max_key_len   24 u64 max_msg_size                 32 u32 max_rd_atomic
 *  36  u32 ka_rkey       40 u64 ka_addr
 *  48  u32 rdma_chunk    52 u32 reserved (0)
 *
 * rdma_chunk is the length of every RDMA WRITE this side posts but a transfer's last: a
 * tensor's write with immediate rides on that last chunk, whose length - all the consumer's
 * completion reports - follows from the tensor's size (xfer_verbs_wire_last_chunk). (Up to
 * version 4 the address was 48 bytes, without magic, version or chunk size.) */
#define XFER_VERBS_WIRE_IFACE_ADDR_LEN 32u
#define XFER_VERBS_WIRE_EP_ADDR_LEN    56u
#define XFER_VERBS_WIRE_EP_ADDR_V4_LEN 48u  /* a peer of version 4 or earlier */

typedef struct xfer_verbs_wire_iface_addr {
    uint8_t  gid[16];
    uint16_t lid;
    uint8_t  port;
    uint8_t  link_layer;     /* IBV_LINK_LAYER_* */
    uint8_t  active_mtu;     /* enum ibv_mtu */
    uint8_t  gid_index;      /* informational */
    uint16_t reserved;
    uint64_t subnet_prefix;  /* informational: the GID's upper half */
} xfer_verbs_wire_iface_addr_t;

typedef struct xfer_verbs_wire_ep_addr {
    uint32_t qpn;
    uint32_t psn;
    uint32_t rx_slots;       /* receives posted: the sender's initial credits */
    uint32_t seg_size;       /* largest message a slot takes */
    uint64_t max_msg_size;
    uint32_t max_key_len;
    uint32_t max_rd_atomic;  /* reads the responder serves at once */
    uint64_t ka_addr;        /* keepalive word: a peer RDMA-writes it to probe the channel */
    uint32_t ka_rkey;
    uint32_t rdma_chunk;     /* bytes of each RDMA WRITE but a transfer's last (not 0) */
} xfer_verbs_wire_ep_addr_t;

/* The length of the last of the RDMA WRITEs that carry len bytes in chunks of chunk bytes
 * (chunk > 0): the rest after the full chunks, a full chunk when nothing is left, and 0 for
 * len 0 (a write of only the immediate). The length a tensor write's completion must report. */
static inline uint64_t xfer_verbs_wire_last_chunk(uint64_t len, uint32_t chunk)
{
    return (len == 0) ? 0 : ((len - 1) % chunk) + 1;
}

/* The header's length for a message of this type. */
static inline size_t xfer_verbs_wire_hdr_len(unsigned type)
{
    return (type == XFER_VERBS_MSG_TAG) ? XFER_VERBS_WIRE_TAG_HDR_LEN :
           (type == XFER_VERBS_MSG_TENSOR_REQUEST) ? XFER_VERBS_WIRE_TREQ_HDR_LEN :
           XFER_VERBS_WIRE_HDR_LEN;
}

/* Pack hdr for its type (a TAG message: the type, credits and tag; a TENSOR_REQUEST: those,
 * the tag (the step) and the id; hdr->length is not on the wire of either); return the
 * header's length. */
size_t xfer_verbs_wire_pack_hdr(const xfer_verbs_wire_hdr_t *hdr, uint8_t *buf);
/* Parse and check a header of a message of msg_len bytes (what the receive completion
 * said): magic, version, known type, the type's header fits, length == msg_len - header
 * (a TAG message's and a TENSOR_REQUEST's length is msg_len - header, their status 0; a TAG
 * message's size is its length, its id 0), the type's minimum extension. XFER_ERR_PROTOCOL
 * with why filled otherwise; XFER_ERR_UNSUPPORTED for another version or an unknown type,
 * with what could be read (the 40-byte layout's fields when that many bytes arrived) filled
 * in, so that the message can be named. */
xfer_status_t xfer_verbs_wire_unpack_hdr(const uint8_t *buf, size_t msg_len,
                                         xfer_verbs_wire_hdr_t *hdr, char *why,
                                         size_t why_size);

void xfer_verbs_wire_pack_rts(const xfer_verbs_wire_rts_t *rts, uint8_t *buf);
void xfer_verbs_wire_unpack_rts(const uint8_t *buf, xfer_verbs_wire_rts_t *rts);

void xfer_verbs_wire_pack_iface_addr(const xfer_verbs_wire_iface_addr_t *a, uint8_t *buf);
xfer_status_t xfer_verbs_wire_unpack_iface_addr(const uint8_t *buf, size_t len,
                                                xfer_verbs_wire_iface_addr_t *a);
void xfer_verbs_wire_pack_ep_addr(const xfer_verbs_wire_ep_addr_t *a, uint8_t *buf);
/* XFER_ERR_UNSUPPORTED (why says so) for a peer of another wire version - one whose address
 * has this magic and another version, or the 48 bytes of version 4 and earlier;
 * XFER_ERR_PROTOCOL for anything else that does not hold. */
xfer_status_t xfer_verbs_wire_unpack_ep_addr(const uint8_t *buf, size_t len,
                                             xfer_verbs_wire_ep_addr_t *a, char *why,
                                             size_t why_size);

/* A remote key: magic "XVRK", rkey, base address, length (24 bytes). */
#define XFER_VERBS_WIRE_RKEY_LEN 24u

typedef struct xfer_verbs_wire_rkey {
    uint32_t rkey;
    uint64_t addr;
    uint64_t length;
} xfer_verbs_wire_rkey_t;

void xfer_verbs_wire_pack_rkey(const xfer_verbs_wire_rkey_t *k, uint8_t *buf);
/* Checks the length, the magic and that addr + length does not wrap. */
xfer_status_t xfer_verbs_wire_unpack_rkey(const uint8_t *buf, size_t len,
                                          xfer_verbs_wire_rkey_t *k);

const char *xfer_verbs_msg_name(unsigned type);

#endif
