/*
 * The verbs component's wire format: the messages that travel through the message slots
 * (RDMA SENDs into the peer's posted receives), and the addresses exchanged through the
 * bootstrap. Every field has an explicit width and is little-endian; one unpack function
 * per message checks every length against what arrived before anything is used.
 *
 * A message is a 40-byte header, a type-specific extension, then a payload:
 *
 *   0  u16 magic 0x5856 ("XV")   2 u8 version   3 u8 type
 *   4  u16 credits returned      6 u16 reserved (0)
 *   8  i32 status               12 u32 length: bytes after the header (extension + payload)
 *  16  u64 id                   24 u64 tag (TAG, RTS) or step (TREQ)
 *  32  u64 size (RTS: message length; TRESP: tensor size)
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
#define XFER_VERBS_WIRE_VERSION  1u
#define XFER_VERBS_WIRE_HDR_LEN  40u
#define XFER_VERBS_WIRE_RTS_LEN  16u      /* addr u64, rkey u32, reserved u32 */
#define XFER_VERBS_WIRE_TREQ_LEN 8u       /* key_len u32, reserved u32; then the key */
#define XFER_VERBS_WIRE_TRESP_LEN 96u     /* see xfer_verbs_wire_tresp_t */
#define XFER_VERBS_WIRE_MAX_REASON 200u
#define XFER_VERBS_WIRE_MAX_RANK  8u

typedef enum {
    XFER_VERBS_MSG_TAG     = 1,   /* eager tagged message: payload is the data */
    XFER_VERBS_MSG_RTS     = 2,   /* rendezvous: the receiver reads size bytes at addr/rkey */
    XFER_VERBS_MSG_FIN     = 3,   /* the read of RTS id is done (status) */
    XFER_VERBS_MSG_TREQ    = 4,   /* tensor request: id, step, key */
    XFER_VERBS_MSG_TRESP   = 5,   /* tensor response: metadata, then data or addr/rkey */
    XFER_VERBS_MSG_TDONE   = 6,   /* the consumer finished reading response id */
    XFER_VERBS_MSG_TCANCEL = 7,   /* the consumer gave request id up */
    XFER_VERBS_MSG_LAST
} xfer_verbs_msg_type_t;

typedef struct xfer_verbs_wire_hdr {
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

/* TRESP extension: mode 0 = data follows, 1 = read it at addr/rkey, 2 = error (a reason
 * of reason_len bytes follows). */
enum { XFER_VERBS_TRESP_INLINE = 0, XFER_VERBS_TRESP_READ = 1, XFER_VERBS_TRESP_ERROR = 2 };

typedef struct xfer_verbs_wire_tresp {
    uint32_t mode;
    uint32_t dtype;
    uint32_t rank;
    uint32_t is_dead;
    uint64_t dims[XFER_VERBS_WIRE_MAX_RANK];
    uint64_t addr;
    uint32_t rkey;
    uint32_t reason_len;
} xfer_verbs_wire_tresp_t;

/* What each side learns from the other's iface address (from HELLO) and endpoint address
 * (from CONNECT). */
#define XFER_VERBS_WIRE_IFACE_ADDR_LEN 32u
#define XFER_VERBS_WIRE_EP_ADDR_LEN    48u

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
    uint32_t reserved;
} xfer_verbs_wire_ep_addr_t;

void xfer_verbs_wire_pack_hdr(const xfer_verbs_wire_hdr_t *hdr, uint8_t *buf);
/* Parse and check a header of a message of msg_len bytes (what the receive completion
 * said): magic, version, known type, length == msg_len - header, the type's minimum
 * extension. XFER_ERR_PROTOCOL with why filled otherwise. */
xfer_status_t xfer_verbs_wire_unpack_hdr(const uint8_t *buf, size_t msg_len,
                                         xfer_verbs_wire_hdr_t *hdr, char *why,
                                         size_t why_size);

void xfer_verbs_wire_pack_rts(const xfer_verbs_wire_rts_t *rts, uint8_t *buf);
void xfer_verbs_wire_unpack_rts(const uint8_t *buf, xfer_verbs_wire_rts_t *rts);

void xfer_verbs_wire_pack_tresp(const xfer_verbs_wire_tresp_t *t, uint8_t *buf);
/* Checks mode, rank, dims against size and the remaining length of the message. */
xfer_status_t xfer_verbs_wire_unpack_tresp(const uint8_t *buf, const xfer_verbs_wire_hdr_t *hdr,
                                           xfer_verbs_wire_tresp_t *t, char *why,
                                           size_t why_size);

void xfer_verbs_wire_pack_iface_addr(const xfer_verbs_wire_iface_addr_t *a, uint8_t *buf);
xfer_status_t xfer_verbs_wire_unpack_iface_addr(const uint8_t *buf, size_t len,
                                                xfer_verbs_wire_iface_addr_t *a);
void xfer_verbs_wire_pack_ep_addr(const xfer_verbs_wire_ep_addr_t *a, uint8_t *buf);
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
