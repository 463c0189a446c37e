/*
 * The tcp component's data-path protocol: what two tcp endpoints exchange on their connection
 * once the bootstrap handed it over. Declared once here, with explicit widths and little-endian
 * byte order; packed and parsed only by tcp_wire.c, whose parsers check every field against
 * the limits before anything uses it. Nothing read from the wire is trusted.
 *
 *   frame := header extension[ext_len] variable[...] data[...]
 *   header (24 bytes):
 *     magic:u16 = 0x5854 ("TX")  version:u8 = 6  type:u8 (bit 7: STRIPED, see lanes below)
 *     status:i32   an xfer_status_t: 0 in requests, 0 or an error in responses
 *     id:u64       TAG: the message tag; others: the request id the initiator chose
 *     length:u64   bytes after the header: ext_len + variable + data
 *
 *   type           ext (fixed)                           variable           data
 *   TAG            -                                     -                  message
 *   PUT_REQ        region:u64 cookie:u64 addr:u64        -                  bytes to write
 *   PUT_ACK        -                                     -                  -
 *   GET_REQ        region:u64 cookie:u64 addr:u64 len:u64 -                 -
 *   GET_RESP       -                                     -                  len bytes (status 0)
 *   TENSOR_REQ     step:u64 key_len:u32 reserved:u32     key[key_len]       -
 *   TENSOR_RESP    reason_len:u32 reserved:u32 (0)       reason[reason_len] its data (status 0,
 *                  meta (12 + 8 x rank bytes)                               not dead)
 *   TENSOR_CANCEL  -                                     -                  -
 *   PUT            region:u64 cookie:u64 addr:u64        -                  bytes to write
 *   PUT_FAIL       -                                     -                  - (status not 0)
 *   FLUSH_REQ      -                                     -                  -
 *   FLUSH_ACK      -                                     -                  -
 *   PUTV           region:u64 cookie:u64 count:u32       count x            the blocks, in
 *                  reserved:u32 (0)                      (addr:u64 len:u64) order, end to end
 *   BYE            -                                     -                  - (id 0)
 *
 * BYE is the last frame of an endpoint that closes in order: its sender flushed what it sent
 * before, and closes the connection once the BYE is acknowledged. The receiver handles the
 * frames before it and then ends its endpoint with XFER_ERR_PEER_CLOSED; a connection that
 * ends without one broke (XFER_ERR_CONNECTION).
 *
 * A PUTV carries a batch's small puts in one frame: the target checks every block of its
 * table against the region before it writes any, then reads the data straight into the
 * blocks (one readv for many), so neither side copies them through a staging buffer. It is
 * counted among PUTs (its id is its rank) and answered only when refused (PUT_FAIL), for all
 * of its blocks at once: a refused PUTV writes nothing.
 *
 * A PUT_REQ is answered by a PUT_ACK once its data is in the target's memory. A PUT is not
 * answered unless it fails: its id is its rank among the initiator's PUTs on the connection
 * (1, 2, ...), and a PUT the target refuses is answered by a PUT_FAIL with that id and the
 * error. A FLUSH_REQ's id is its rank among the initiator's FLUSH_REQs; the target answers it
 * with a FLUSH_ACK of the same id once every frame before it is handled (the data of every
 * PUT before it is in memory, every PUT_FAIL before it queued ahead of the FLUSH_ACK).
 * Request ids carry a generation in their upper 32 bits, so a response to a request that is no
 * longer outstanding is recognised as stale. A TENSOR_RESP answers every TENSOR_REQ exactly
 * once, also after a TENSOR_CANCEL (then with status XFER_ERR_CANCELED unless it was already
 * on its way). Its meta is the tensor's description as every transport carries it
 * (component.h, xfer_tensor_wire_meta_t): a dead tensor has size 0 and no data; a failed
 * TENSOR_RESP (status not 0) describes none (NONE) and carries its reason instead.
 *
 * Lanes: an endpoint may own extra connections ("lanes" 1..n-1 beside lane 0, the bootstrap's
 * socket). The client opens them to the server's lane port and sends on each a LANE_HELLO,
 *   magic:u16 = 0x4c54 ("TL")  version:u8  lane:u8  reserved:u32  token:u64
 * with the token of the server's endpoint address. An endpoint whose bootstrap was
 * authenticated takes only a proven hello: magic 0x5054 ("TP"), the same fields, then 32
 * bytes of proof (HMAC-SHA256 over those 16 with the endpoint's secret), so that a lane
 * proves it belongs to that endpoint - the token alone went over the wire in the clear.
 * Frames travel on lane 0 only. A TAG,
 * PUT_REQ, PUT or TENSOR_RESP with STRIPED set has its data cut in n shares, n being in its
 * status field (the frame's status is 0): the sender's lanes 0..n-1, those it has up
 * (xfer_tcp_wire_stripe). Share 0 follows the frame on lane 0, share i is the next bytes of
 * lane i, which carries nothing but shares, in the order of their frames on lane 0.
 *
 * The rkey blob is the region's key (xfer_region_key_pack: id:u64 key:u64 addr:u64
 * length:u64); the endpoint address (XFER_TCP_WIRE_EP_ADDR_LEN bytes) is magic:u16 version:u8
 * lanes:u8 max_key_len:u32 max_msg_size:u64 lane_port:u16 flags:u8 reserved:u8 reserved:u32
 * token:u64, so that each side refuses locally what the peer would reject instead of having the
 * connection closed over it, learns how many lanes the peer takes and where, and whether its
 * connections run TLS (flags bit 0; the other bits are 0).
 */
#ifndef XFER_TCP_WIRE_H
#define XFER_TCP_WIRE_H

#include <xfer/component.h>

#include <stddef.h>
#include <stdint.h>

#define XFER_TCP_WIRE_MAGIC            0x5854u  /* bytes 'T' 'X' on the wire */
#define XFER_TCP_WIRE_VERSION          6u
#define XFER_TCP_WIRE_STRIPED          0x80u    /* in the type byte */
#define XFER_TCP_WIRE_LANE_MAGIC       0x4c54u  /* bytes 'T' 'L' */
#define XFER_TCP_WIRE_LANE_HELLO_LEN   16u
/* A proven LANE_HELLO: magic 'T' 'P', the same 16 bytes, then the endpoint's proof over
 * them (HMAC-SHA256 with the endpoint's secret from the authenticated bootstrap). */
#define XFER_TCP_WIRE_LANE_PROVEN_MAGIC 0x5054u  /* bytes 'T' 'P' */
#define XFER_TCP_WIRE_LANE_PROOF_LEN   32u
#define XFER_TCP_WIRE_LANE_HELLO_MAX   (XFER_TCP_WIRE_LANE_HELLO_LEN + \
                                        XFER_TCP_WIRE_LANE_PROOF_LEN)
#define XFER_TCP_WIRE_LANES_MAX        8u
#define XFER_TCP_WIRE_HDR_LEN          24u
#define XFER_TCP_WIRE_PUT_EXT_LEN      24u
#define XFER_TCP_WIRE_GET_EXT_LEN      32u
#define XFER_TCP_WIRE_TREQ_EXT_LEN     16u
/* TENSOR_RESP: the fixed part, up to the description's dims (then the dims, the reason) */
#define XFER_TCP_WIRE_TRESP_EXT_LEN    (8u + XFER_TENSOR_WIRE_META_FIXED)
#define XFER_TCP_WIRE_TRESP_EXT_MAX    (8u + XFER_TENSOR_WIRE_META_MAX)
#define XFER_TCP_WIRE_MAX_REASON       255u
#define XFER_TCP_WIRE_BATCH_EXT_LEN    16u      /* flags u32, 0 u32, puts before it u64 */
#define XFER_TCP_WIRE_BATCH_ACK_LEN    8u       /* descriptors landed u64 */
#define XFER_TCP_WIRE_PUTV_EXT_LEN     24u
#define XFER_TCP_WIRE_PUTV_DESC_LEN    16u      /* addr u64, len u64 */
#define XFER_TCP_WIRE_PUTV_MAX         1024u    /* blocks of one PUTV */
#define XFER_TCP_WIRE_MAX_NOTIFY       65536u
#define XFER_TCP_WIRE_EP_ADDR_LEN      32u

typedef enum {
    XFER_TCP_WIRE_TAG           = 1,
    XFER_TCP_WIRE_PUT_REQ       = 2,
    XFER_TCP_WIRE_PUT_ACK       = 3,
    XFER_TCP_WIRE_GET_REQ       = 4,
    XFER_TCP_WIRE_GET_RESP      = 5,
    XFER_TCP_WIRE_TENSOR_REQ    = 6,
    XFER_TCP_WIRE_TENSOR_RESP   = 7,
    XFER_TCP_WIRE_TENSOR_CANCEL = 8,
    XFER_TCP_WIRE_PUT           = 9,
    XFER_TCP_WIRE_PUT_FAIL      = 10,
    XFER_TCP_WIRE_FLUSH_REQ     = 11,
    XFER_TCP_WIRE_FLUSH_ACK     = 12,
    XFER_TCP_WIRE_BATCH_END     = 13,   /* ext: flags, puts; payload: the notification */
    XFER_TCP_WIRE_BATCH_ACK     = 14,   /* status; ext: descriptors landed */
    XFER_TCP_WIRE_PUTV          = 15,   /* a batch's small puts, one frame */
    XFER_TCP_WIRE_BYE           = 16,   /* the sender's endpoint closes in order */
    XFER_TCP_WIRE_TYPE_LAST
} xfer_tcp_wire_type_t;

typedef struct xfer_tcp_wire_hdr {
    uint16_t magic;
    uint8_t  version;
    uint8_t  type;
    int32_t  status;
    uint64_t id;
    uint64_t length;
    uint8_t  striped;   /* 0, or the lanes (2..) the data is cut over; on the wire the
                         * STRIPED bit, and the count in the status field */
} xfer_tcp_wire_hdr_t;

/* What the receiver accepts; frames beyond these fail the connection. */
typedef struct xfer_tcp_wire_limits {
    uint64_t max_msg_size;  /* largest data part of any frame */
    uint32_t max_key_len;   /* longest tensor key */
} xfer_tcp_wire_limits_t;

/* PUT_REQ, PUT and GET_REQ extension (len only in GET_REQ). */
typedef struct xfer_tcp_wire_rma {
    uint64_t region;
    uint64_t cookie;
    uint64_t addr;
    uint64_t len;
} xfer_tcp_wire_rma_t;

typedef struct xfer_tcp_wire_tensor_req {
    uint64_t step;
    uint32_t key_len;
} xfer_tcp_wire_tensor_req_t;

typedef struct xfer_tcp_wire_tensor_resp {
    uint32_t                reason_len;
    xfer_tensor_wire_meta_t meta;       /* NONE when the status is not 0 */
} xfer_tcp_wire_tensor_resp_t;

/* An endpoint's address: its limits and its lanes. */
typedef struct xfer_tcp_wire_ep_addr {
    xfer_tcp_wire_limits_t limits;
    uint8_t                lanes;       /* connections it takes, lane 0 included (1..MAX) */
    uint16_t               lane_port;   /* where the server's lanes connect; 0 = nowhere (a
                                         * client: it connects lanes, it takes none) */
    uint64_t               token;       /* what a lane's LANE_HELLO must carry */
    uint8_t                flags;       /* XFER_TCP_WIRE_ADDR_* */
} xfer_tcp_wire_ep_addr_t;

/* The endpoint's connections run TLS (XFER_TCP_TLS=y): both sides must. */
#define XFER_TCP_WIRE_ADDR_TLS 0x01u

typedef struct xfer_tcp_wire_lane_hello {
    uint8_t  lane;
    uint64_t token;
    int      proven;    /* 'T' 'P': the proof follows the 16 bytes */
} xfer_tcp_wire_lane_hello_t;

/* A PUTV's table: where each block goes and how long it is. */
typedef struct xfer_tcp_wire_putv {
    uint64_t region;
    uint64_t cookie;
    uint32_t count;
} xfer_tcp_wire_putv_t;

/* Names for logs; "unknown" for anything else. */
const char *xfer_tcp_wire_type_name(unsigned type);

/* Fixed-size encoders: each writes exactly its *_LEN bytes. */
void xfer_tcp_wire_pack_hdr(const xfer_tcp_wire_hdr_t *hdr, void *buf);
void xfer_tcp_wire_pack_put_ext(const xfer_tcp_wire_rma_t *rma, void *buf);
void xfer_tcp_wire_pack_get_ext(const xfer_tcp_wire_rma_t *rma, void *buf);
void xfer_tcp_wire_pack_tensor_req_ext(const xfer_tcp_wire_tensor_req_t *req, void *buf);
/* A TENSOR_RESP's extension up to its reason: returns its length (8 + the description's). */
size_t xfer_tcp_wire_pack_tensor_resp_ext(const xfer_tcp_wire_tensor_resp_t *resp, void *buf);
void xfer_tcp_wire_pack_ep_addr(const xfer_tcp_wire_ep_addr_t *addr, void *buf);
void xfer_tcp_wire_pack_lane_hello(const xfer_tcp_wire_lane_hello_t *hello, void *buf);
void xfer_tcp_wire_pack_putv_ext(const xfer_tcp_wire_putv_t *putv, void *buf);
/* Entry i of a PUTV's table (XFER_TCP_WIRE_PUTV_DESC_LEN bytes each). */
void xfer_tcp_wire_pack_putv_desc(void *table, uint32_t i, uint64_t addr, uint64_t len);

/*
 * Parse and validate a header (XFER_TCP_WIRE_HDR_LEN bytes): magic, version, type, the status
 * (0 in requests, 0 or an xfer error in responses) and the length against the type's bounds
 * and the limits. XFER_ERR_PROTOCOL with why on any violation.
 */
xfer_status_t xfer_tcp_wire_unpack_hdr(const void *buf, const xfer_tcp_wire_limits_t *limits,
                                       xfer_tcp_wire_hdr_t *hdr, char *why, size_t why_size);
/* Extensions; hdr is the already validated header of the same frame. */
xfer_status_t xfer_tcp_wire_unpack_put_ext(const void *buf, const xfer_tcp_wire_hdr_t *hdr,
                                           xfer_tcp_wire_rma_t *rma, char *why,
                                           size_t why_size);
xfer_status_t xfer_tcp_wire_unpack_get_ext(const void *buf, const xfer_tcp_wire_hdr_t *hdr,
                                           const xfer_tcp_wire_limits_t *limits,
                                           xfer_tcp_wire_rma_t *rma, char *why,
                                           size_t why_size);
xfer_status_t xfer_tcp_wire_unpack_tensor_req_ext(const void *buf,
                                                  const xfer_tcp_wire_hdr_t *hdr,
                                                  const xfer_tcp_wire_limits_t *limits,
                                                  xfer_tcp_wire_tensor_req_t *req, char *why,
                                                  size_t why_size);
/* A PUTV's extension: count from 1 to XFER_TCP_WIRE_PUTV_MAX, its table within the frame. */
xfer_status_t xfer_tcp_wire_unpack_putv_ext(const void *buf, const xfer_tcp_wire_hdr_t *hdr,
                                            xfer_tcp_wire_putv_t *putv, char *why,
                                            size_t why_size);
/* Its table (count entries): block i at addr[i], len[i] bytes, none wrapping around, their
 * lengths adding up to the frame's data exactly. */
xfer_status_t xfer_tcp_wire_unpack_putv_table(const void *table, const xfer_tcp_wire_hdr_t *hdr,
                                              uint32_t count, uint64_t *addr, uint64_t *len,
                                              char *why, size_t why_size);
/* A TENSOR_RESP's extension, of which len bytes are at buf (XFER_TCP_WIRE_TRESP_EXT_LEN at
 * first): XFER_INPROGRESS with *need_p when the dims and the reason make it longer (within the
 * frame); else the description checked (NONE exactly when the status is not 0), the reason
 * within XFER_TCP_WIRE_MAX_REASON, and the frame's length that extension, its reason and its
 * data (the description's, status 0) - XFER_ERR_PROTOCOL with why otherwise. */
xfer_status_t xfer_tcp_wire_unpack_tensor_resp_ext(const void *buf, size_t len,
                                                   const xfer_tcp_wire_hdr_t *hdr,
                                                   const xfer_tcp_wire_limits_t *limits,
                                                   xfer_tcp_wire_tensor_resp_t *resp,
                                                   size_t *need_p, char *why,
                                                   size_t why_size);
/* The peer's endpoint address: 0 bytes (a minimal peer: *addr untouched) or exactly
 * XFER_TCP_WIRE_EP_ADDR_LEN with the right magic and version, and 1..LANES_MAX lanes. */
xfer_status_t xfer_tcp_wire_unpack_ep_addr(const void *buf, size_t len,
                                           xfer_tcp_wire_ep_addr_t *addr);
/* A LANE_HELLO (XFER_TCP_WIRE_LANE_HELLO_LEN bytes): magic, version, lane >= 1. */
xfer_status_t xfer_tcp_wire_unpack_lane_hello(const void *buf, xfer_tcp_wire_lane_hello_t *hello,
                                              char *why, size_t why_size);
/* Whether a frame of this type may have STRIPED set. */
int xfer_tcp_wire_type_stripes(unsigned type);
/* Share i (0 <= i < lanes) of len striped bytes: [*off_p, *off_p + *len_p). Lanes 1..n-1 get
 * equal page-multiple shares from the end, lane 0 the rest from the start. */
void xfer_tcp_wire_stripe(uint64_t len, unsigned lanes, unsigned i, uint64_t *off_p,
                          uint64_t *len_p);

#endif
