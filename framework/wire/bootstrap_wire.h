/*
 * The bootstrap protocol: the first bytes two xfer processes exchange on a new connection.
 * Declared once here, with explicit widths and network byte order; packed and parsed only by
 * bootstrap_wire.c, whose parser checks every length against the buffer and the limits below
 * before using it. Nothing read from the wire is trusted.
 *
 *   frame  := magic:u32 version:u16 type:u16 body_len:u32 body[body_len]
 *   HELLO  := num:u16 { name_len:u8 name[name_len] addr_len:u16 addr[addr_len] } * num
 *   ACCEPT := name_len:u8 name[name_len]                  (the transport the server chose)
 *   REJECT := status:i16 reason_len:u16 reason[reason_len] (why no transport was chosen)
 *   CONNECT:= context_id:u64 addr_len:u16 addr[addr_len]   (this side's endpoint address)
 *   AUTH_NONCE := nonce[32]                               (authentication, auth.c)
 *   AUTH_MAC   := mac[32]
 *
 * The client sends HELLO with the transports it allows, best first; the server answers with
 * its own HELLO and then ACCEPT or REJECT. After ACCEPT each side creates its endpoint of the
 * chosen transport and sends CONNECT (its context id, which remote keys carry, and the
 * endpoint's address); each reads the other's CONNECT, and from then on the connection
 * belongs to the transport. A peer with another magic or version is refused.
 */
#ifndef XFER_BOOTSTRAP_WIRE_H
#define XFER_BOOTSTRAP_WIRE_H

#include <xfer/xfer.h>

#include <stddef.h>
#include <stdint.h>

#define XFER_WIRE_MAGIC          0x58464552u  /* "XFER" */
#define XFER_WIRE_VERSION        1u
#define XFER_WIRE_HEADER_LEN     12u
#define XFER_WIRE_MAX_BODY       (64u * 1024u)
#define XFER_WIRE_MAX_TRANSPORTS 16u
#define XFER_WIRE_MAX_NAME       31u
#define XFER_WIRE_MAX_ADDR       1024u
#define XFER_WIRE_MAX_REASON     1024u

/* The longest frame of each type, header included. */
#define XFER_WIRE_HELLO_FRAME_MAX   (XFER_WIRE_HEADER_LEN + 2u + XFER_WIRE_MAX_TRANSPORTS * \
                                     (1u + XFER_WIRE_MAX_NAME + 2u + XFER_WIRE_MAX_ADDR))
#define XFER_WIRE_ACCEPT_FRAME_MAX  (XFER_WIRE_HEADER_LEN + 1u + XFER_WIRE_MAX_NAME)
#define XFER_WIRE_REJECT_FRAME_MAX  (XFER_WIRE_HEADER_LEN + 4u + XFER_WIRE_MAX_REASON)
#define XFER_WIRE_CONNECT_FRAME_MAX (XFER_WIRE_HEADER_LEN + 10u + XFER_WIRE_MAX_ADDR)

typedef enum {
    XFER_WIRE_HELLO  = 1,
    XFER_WIRE_ACCEPT = 2,
    XFER_WIRE_REJECT = 3,
    XFER_WIRE_CONNECT = 4,
    XFER_WIRE_AUTH_NONCE = 5,
    XFER_WIRE_AUTH_MAC   = 6,
} xfer_wire_type_t;

/* The body of an AUTH_NONCE or AUTH_MAC frame, and the whole frame. */
#define XFER_WIRE_AUTH_LEN       32u
#define XFER_WIRE_AUTH_FRAME_LEN (XFER_WIRE_HEADER_LEN + XFER_WIRE_AUTH_LEN)

typedef struct xfer_wire_header {
    uint32_t magic;
    uint16_t version;
    uint16_t type;
    uint32_t body_len;
} xfer_wire_header_t;

typedef struct xfer_wire_transport {
    char     name[XFER_WIRE_MAX_NAME + 1];
    uint16_t addr_len;
    uint8_t  addr[XFER_WIRE_MAX_ADDR];
} xfer_wire_transport_t;

typedef struct xfer_wire_hello {
    uint16_t              num;
    xfer_wire_transport_t transports[XFER_WIRE_MAX_TRANSPORTS];
} xfer_wire_hello_t;

typedef struct xfer_wire_reject {
    int16_t status;                             /* an xfer_status_t */
    char    reason[XFER_WIRE_MAX_REASON + 1];
} xfer_wire_reject_t;

typedef struct xfer_wire_connect {
    uint64_t context_id;
    uint16_t addr_len;
    uint8_t  addr[XFER_WIRE_MAX_ADDR];
} xfer_wire_connect_t;

/* Pack a frame; *len_p is the buffer size in, the frame length out. */
xfer_status_t xfer_wire_pack_hello(const xfer_wire_hello_t *hello, void *buf, size_t *len_p);
xfer_status_t xfer_wire_pack_accept(const char *name, void *buf, size_t *len_p);
xfer_status_t xfer_wire_pack_reject(xfer_status_t status, const char *reason, void *buf,
                                    size_t *len_p);
xfer_status_t xfer_wire_pack_connect(const xfer_wire_connect_t *conn, void *buf, size_t *len_p);
/* An AUTH_NONCE or AUTH_MAC frame carrying data (XFER_WIRE_AUTH_LEN bytes). */
xfer_status_t xfer_wire_pack_auth(xfer_wire_type_t type, const uint8_t *data, void *buf,
                                  size_t *len_p);

/*
 * Parse the fixed header. XFER_ERR_PROTOCOL (with why) for a wrong magic, version, type or a
 * body longer than XFER_WIRE_MAX_BODY; XFER_ERR_TRUNCATED when len < XFER_WIRE_HEADER_LEN.
 */
xfer_status_t xfer_wire_parse_header(const void *buf, size_t len, xfer_wire_header_t *hdr,
                                     char *why, size_t why_size);
/* Parse a body of the given type; every length is checked against body_len first. */
xfer_status_t xfer_wire_parse_hello(const void *body, size_t body_len, xfer_wire_hello_t *hello,
                                    char *why, size_t why_size);
xfer_status_t xfer_wire_parse_accept(const void *body, size_t body_len, char *name,
                                     char *why, size_t why_size);
xfer_status_t xfer_wire_parse_reject(const void *body, size_t body_len,
                                     xfer_wire_reject_t *reject, char *why, size_t why_size);
xfer_status_t xfer_wire_parse_connect(const void *body, size_t body_len,
                                      xfer_wire_connect_t *conn, char *why, size_t why_size);
/* An AUTH_NONCE's or AUTH_MAC's body: exactly XFER_WIRE_AUTH_LEN bytes, copied to data. */
xfer_status_t xfer_wire_parse_auth(const void *body, size_t body_len, uint8_t *data,
                                   char *why, size_t why_size);

/*
 * Whether this side's transport name reaches the peer whose address for it (from the peer's
 * HELLO) is addr: 1, or 0 with why filled (one line).
 */
typedef int (*xfer_wire_reachable_func_t)(void *arg, const char *name, const void *addr,
                                          size_t addr_len, char *why, size_t why_size);

/*
 * The server's choice: the first of the client's transports (client order = client
 * preference) that the server also offers and, when reachable is given, that reachable says
 * reaches the client (it is asked with the client's address for that transport, in client
 * order, until one does). Returns its index in client->transports, or -1 with why naming what
 * each side offered and each transport skipped as unreachable, with its reason. Pure: all it
 * learns of the host is what reachable says.
 */
int xfer_wire_negotiate_reachable(const xfer_wire_hello_t *client,
                                  const xfer_wire_hello_t *server,
                                  xfer_wire_reachable_func_t reachable, void *arg, char *why,
                                  size_t why_size);
/* The same by name only: every shared transport reaches the client. */
int xfer_wire_negotiate(const xfer_wire_hello_t *client, const xfer_wire_hello_t *server,
                        char *why, size_t why_size);

#endif
