/*
 * The tcp component's internals, shared by its files: the configuration, the interface
 * (epoll, queues), endpoints (send queue, receive state machine, outstanding requests),
 * operations and the producer side of tensor fetches. Not installed; everything is hidden.
 *
 * Threading: none. The framework serialises every call, and the component calls back into the
 * framework only from inside those calls. Completions are queued and delivered by progress().
 */
#ifndef XFER_TCP_H
#define XFER_TCP_H

#include "tcp_wire.h"

#include <xfer/component.h>

#include <ucs/datastruct/list.h>
#include <ucs/datastruct/mpool.h>

#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/uio.h>

#define XFER_TCP_SUBSYS          "tcp"
#define XFER_TCP_IFACE_ADDR_MAX  1024
#define XFER_TCP_RX_BUF_LEN      (64u * 1024u)  /* staging buffer for headers and small data */
/* How much one read into the staging buffer takes while large payloads flow (tcp_rx.c). */
#define XFER_TCP_RX_PEEK_LEN     (4u * 1024u)
#define XFER_TCP_RX_PEEK_FRAMES  16
#define XFER_TCP_TX_BUF_LEN      (64u * 1024u)  /* one coalescing send buffer */
#define XFER_TCP_RX_BUDGET       64             /* frames per endpoint per progress() */
#define XFER_TCP_IOV_MAX         64
/* Blocks of a PUTV one readv() fills: 256 x 16 bytes of vectors the kernel copies in per call,
 * and a batch of 128 blocks read in one call where the socket holds them. */
#define XFER_TCP_RX_IOV_MAX      256

/* The parameter table is in tcp_component.c. */
typedef struct xfer_tcp_config {
    char     *iface;            /* IFACE: comma-separated interface names; "" = all */
    uint64_t eager_threshold;   /* EAGER_THRESHOLD: copied into the send buffer up to this */
    uint64_t max_msg_size;      /* MAX_MSG_SIZE: largest message, put/get or tensor */
    uint64_t sndbuf;            /* SNDBUF: SO_SNDBUF, 0 = system default */
    uint64_t rcvbuf;            /* RCVBUF: SO_RCVBUF, 0 = system default */
    int      keepalive;         /* KEEPALIVE: SO_KEEPALIVE */
    double   keepidle;          /* KEEPIDLE: seconds idle before the first probe */
    double   keepintvl;         /* KEEPINTVL: seconds between probes */
    uint64_t keepcnt;           /* KEEPCNT: unanswered probes before the peer is dead */
    double   user_timeout;      /* USER_TIMEOUT: TCP_USER_TIMEOUT, seconds; 0 = system */
    uint64_t max_backlog;       /* MAX_RESPONSE_BACKLOG: queued answers before input pauses */
    uint64_t cuda_chunk;        /* CUDA_CHUNK: bytes of one bounce buffer for device memory */
    uint64_t cuda_depth;        /* CUDA_DEPTH: bounce buffers for each direction */
    int      put_ack;           /* PUT_ACK: a put completes when the target acknowledged it */
    int      busy_poll;         /* BUSY_POLL: read sockets directly, never let a wait sleep */
    uint64_t lanes;             /* LANES: connections per endpoint; 0 = by the core count */
    uint64_t lane_min;          /* LANE_MIN_SIZE: data striped over the lanes from this size */
    double   lane_wait;         /* LANE_WAIT: seconds ep_connect waits for the lanes */
    int      splice;            /* SPLICE: a batch's blocks leave by vmsplice, not a copy */
    uint64_t splice_pipe;       /* SPLICE_PIPE: bytes of the pipe they go through */
    int      tls;               /* TLS: every connection sealed by kernel TLS (tcp_tls.c) */
    double   tls_timeout;       /* TLS_TIMEOUT: seconds lane 0's TLS handshake may take */
} xfer_tcp_config_t;

#define XFER_TCP_CUDA_DEPTH_MAX 16

/* What one buffered unexpected message or one queued answer costs beyond its bytes (its
 * bookkeeping), so that the bounds also bound how many there are. */
#define XFER_TCP_ENTRY_OVERHEAD 64

typedef struct xfer_tcp_op  xfer_tcp_op_t;
typedef struct xfer_tcp_answer xfer_tcp_answer_t;
typedef struct xfer_tcp_putv_rx xfer_tcp_putv_rx_t;
typedef struct xfer_tcp_lane_port xfer_tcp_lane_port_t;

/* ---- send queue entries ---------------------------------------------------------------------- */

typedef enum {
    XFER_TCP_TX_BUF,        /* coalesced small frames in a buffer owned by the entry */
    XFER_TCP_TX_OP,         /* header + user data of a large send or put (in xfer_tcp_op_t) */
    XFER_TCP_TX_ANSWER,     /* a tensor response (in xfer_tcp_answer_t) */
    XFER_TCP_TX_GET_RESP,   /* header + registered memory a peer reads */
    XFER_TCP_TX_PUTV,       /* a PUTV: header and table, then blocks of a batch's memory
                             * (xiov); the entry is freed once written or dropped */
} xfer_tcp_tx_kind_t;

typedef struct xfer_tcp_tx {
    ucs_list_link_t     list;       /* ep->txq */
    xfer_tcp_tx_kind_t  kind;
    struct iovec        iov[2];     /* what to write: [0] header or buffer, [1] data */
    const struct iovec  *xiov;      /* PUTV: the data after iov[0] instead of iov[1] */
    unsigned            xiovcnt;
    size_t              xlen;       /* ... its bytes */
    size_t              sent;       /* bytes of iov[0] + iov[1] (or xiov) already written */
    size_t              cap;        /* TX_BUF: room of iov[0] */
    xfer_memh_h         memh;       /* GET_RESP: the region iov[1] points into, or NULL */
    void                *owned;     /* GET_RESP: a private copy of iov[1] (after dereg) */
    uint64_t            resp;       /* what it counts in ep->answers (answers to the peer's
                                     * requests) */
    /* iov[1] is CUDA memory: it is written from bounce buffers (tcp_cuda.c) holding the
     * chunks [first, next) in order, one per entry of ring */
    int                 dev;
    unsigned            ring[XFER_TCP_CUDA_DEPTH_MAX];
    unsigned            ring_head, ring_count;
    size_t              first, next;
    /* with every send buffer taken by other frames: one chunk copied into a buffer of its
     * own, [first, first + spill_len), before the ring's */
    uint8_t             *spill;
    size_t              spill_len;
    /* a striped frame (tcp_stripe.c): iov[1] is share 0; the shares of the other lanes not yet
     * written. Once its own part is written the entry waits on ep->tx_wait for them. */
    unsigned            lanes_left;
    int                 lane0_done;
    int                 pooled;     /* TX_BUF from iface->tx_mp (else malloc) */
    int                 splice;     /* PUTV: its blocks leave through ep->pipe (tcp_tx.c) */
} xfer_tcp_tx_t;

/* ---- operations ------------------------------------------------------------------------------ */

typedef enum {
    XFER_TCP_OP_SEND,
    XFER_TCP_OP_PUT,
    XFER_TCP_OP_GET,
    XFER_TCP_OP_FETCH,
    XFER_TCP_OP_FLUSH,
    XFER_TCP_OP_BATCH,          /* waits for a put batch's BATCH_ACK (tcp_batch.c) */
} xfer_tcp_op_kind_t;

#define XFER_TCP_OP_HDR_MAX (XFER_TCP_WIRE_HDR_LEN + XFER_TCP_WIRE_PUT_EXT_LEN)

struct xfer_tcp_op {
    xfer_op_t           base;       /* the framework's: comp, and the result once complete */
    xfer_tcp_op_kind_t  kind;
    xfer_iface_h        iface;
    xfer_ep_h           ep;         /* the ep it runs on */
    int                 tx_pending; /* its zero-copy frame is still in the send queue */
    int                 on_write;   /* SEND, unacknowledged PUT: complete once written */
    int                 cuda;       /* buf is CUDA memory (tcp_cuda.c moves it) */
    uint32_t            slot;       /* PUT/GET/FETCH: index in ep->slots */
    void                *buf;       /* SEND/RECV/PUT/GET buffer */
    size_t              len;        /* its length */
    uint64_t            serial;     /* PUT/GET/BATCH: its serial among ep->flushes' */
    /* FLUSH: done once the bytes queued before it are acknowledged, the answered operations
     * posted before it have completed (flush) and, after PUT frames, the FLUSH_REQ
     * mark_fence is answered; a refused PUT up to mark_put fails it */
    xfer_flush_t        flush;
    uint64_t            mark_tx;
    uint64_t            mark_fence;
    uint64_t            mark_put;
    uint64_t            mark_lane[XFER_TCP_WIRE_LANES_MAX];   /* and of each lane */
    xfer_tcp_tx_t       tx;         /* zero-copy frame of a large SEND or PUT */
    uint8_t             hdr[XFER_TCP_OP_HDR_MAX];
    xfer_tfetch_t       tf;         /* FETCH: the engine's part (tcp_tensor.c) */
};

/* An outstanding request of this side, found again by the id in its response (ep->slots, the
 * framework's slot table: the op is the slot's obj). */
typedef enum {
    XFER_TCP_SLOT_FREE = XFER_SLOT_FREE,
    XFER_TCP_SLOT_PUT,
    XFER_TCP_SLOT_GET,
    XFER_TCP_SLOT_FETCH,
    XFER_TCP_SLOT_BATCH,
    XFER_TCP_SLOT_TOMBSTONE,    /* a cancelled fetch whose response is still to come */
} xfer_tcp_slot_kind_t;

/* ---- producer side of a tensor fetch --------------------------------------------------------- */

#define XFER_TCP_PREQ_HDR_MAX \
    (XFER_TCP_WIRE_HDR_LEN + XFER_TCP_WIRE_TRESP_EXT_MAX + XFER_TCP_WIRE_MAX_REASON)

/* What tcp keeps of a peer's tensor request (the engine's xfer_tanswer_t.priv): the frame
 * that answers it, its header (and reason) here, the tensor's data written from where the
 * framework keeps it. */
struct xfer_tcp_answer {
    xfer_tanswer_t *a;
    xfer_tcp_tx_t  tx;
    uint8_t        hdr[XFER_TCP_PREQ_HDR_MAX];
};

/* ---- endpoint ------------------------------------------------------------------------------- */

typedef enum {
    XFER_TCP_RX_HDR,        /* reading a header */
    XFER_TCP_RX_EXT,        /* reading the type's extension (and reason) into the staging */
    XFER_TCP_RX_DATA,       /* payload into rx.dest, then rx.drain bytes discarded */
    XFER_TCP_RX_PAUSED,     /* a TAG header waits for room in the unexpected queue */
} xfer_tcp_rx_state_t;

typedef struct xfer_tcp_rx_handler xfer_tcp_rx_handler_t;

typedef struct xfer_tcp_rx {
    xfer_tcp_rx_state_t state;
    xfer_tcp_wire_hdr_t hdr;
    const xfer_tcp_rx_handler_t *handler;
    size_t              ext_len;    /* staging bytes the extension needs */
    uint8_t             *dest;
    size_t              want, got;  /* payload bytes for dest */
    uint64_t            drain;      /* then bytes to discard */
    uint32_t            batch_flags;    /* BATCH_END being received */
    uint64_t            batch_puts;
    xfer_status_t       status;     /* the frame's result (TRUNCATED, target-side errors) */
    xfer_tcp_op_t       *op;        /* GET the payload belongs to */
    void                *tag_handle;    /* a message's, from the framework's matching */
    xfer_memh_h         memh;       /* PUT target region */
    /* PUTV: the payload goes to blocks viov[vidx..vcnt) (dest, want, got: the current one) */
    struct iovec        *viov;
    uint32_t            vcnt, vidx;
    /* dest is CUDA memory: the payload is read into bounce buffers, each copied to
     * dest + dbase once full (tcp_cuda.c); the frame is done once every copy landed */
    int                 dev;
    unsigned            dslot;      /* the bounce buffer being filled, or UINT_MAX */
    size_t              dfill;      /* its bytes */
    size_t              dbase;      /* where in dest they go */
    unsigned            dcopies;    /* copies of this frame in flight */
    int                 lanes_wait; /* striped: share 0 is in, the other lanes' are not */
    int                 direct;     /* a frame of XFER_TCP_RX_BUF_LEN or more, its payload read
                                     * straight into place */
} xfer_tcp_rx_t;

/* ---- lanes (tcp_lane.c) --------------------------------------------------------------------- */

/* What a lane writes: one share of a striped frame, from the frame's own memory. */
typedef struct xfer_tcp_seg {
    ucs_list_link_t     list;       /* lane->txq */
    xfer_tcp_tx_t       *tx;        /* the frame (on lane 0) it belongs to */
    const uint8_t       *p;
    size_t              len, sent;
} xfer_tcp_seg_t;

/* An extra connection of an endpoint. It carries only shares of striped frames, in the order
 * of their frames on lane 0; it reads one while lane 0 is in that frame's payload. */
typedef struct xfer_tcp_lane {
    xfer_ep_h           ep;
    unsigned            idx;        /* 1 .. ep->nlanes - 1 */
    int                 fd;         /* -1 until connected (client) or accepted (server) */
    uint32_t            events;     /* registered with epoll */
    int                 peer_closed;
    int                 drained;    /* a read this round came back short */
    uint64_t            rx_round;   /* bytes read this round (at most XFER_FAIR_SLICE) */
    uint64_t            rx_gen;     /* the round (iface->rx_gen) rx_round counts */
    ucs_list_link_t     txq;        /* xfer_tcp_seg_t */
    uint64_t            tx_queued, tx_written;
    /* the share being received: want bytes into dest (CUDA memory when dev), then drain */
    int                 rx_active;
    int                 rx_dev;
    uint8_t             *rx_dest;
    size_t              rx_want, rx_got;
    uint64_t            rx_drain;
    /* client: its connect() goes on from progress (nothing is striped over it yet), or waits
     * on iface->lane_retry to be tried again */
    int                 connecting;
    unsigned            tries;
    int                 in_retry;
    int64_t             retry_at;   /* CLOCK_MONOTONIC, ms */
    ucs_list_link_t     retry_link;
} xfer_tcp_lane_t;

/* epoll data of lanes and of connections still to say which lane they are: tagged pointers,
 * told apart from endpoints by their low bits */
#define XFER_TCP_EV_LANE   1u
#define XFER_TCP_EV_ACCEPT 2u
#define XFER_TCP_EV_LPORT  3u
#define XFER_TCP_EV_MASK   3u

struct xfer_ep {
    xfer_iface_h        iface;
    ucs_list_link_t     list;           /* iface->eps */
    int                 fd;
    int                 is_server;
    xfer_ep_fail_t      fail;       /* its state, its failure told once, and fw_ep */
    int                 clean_close;    /* the peer closed between two frames */
    uint32_t            events;         /* registered with epoll */
    xfer_tcp_wire_limits_t limits;      /* what may be sent: min(ours, the peer's) */

    ucs_list_link_t     txq;            /* xfer_tcp_tx_t, in wire order */
    /* bytes of queued answers to the peer's requests, charged to the process's
     * XFER_ANSWERS_BUDGET */
    xfer_budget_queue_t answers;
    int                 rx_blocked;     /* input not read while answers are past the bounds */
    int                 peer_closed;    /* EPOLLRDHUP: the peer sends nothing more, so what is
                                         * left of its input is in the socket already */
    uint64_t            tx_queued;      /* bytes ever queued on txq */
    uint64_t            tx_written;     /* ... and ever handed to the socket */
    /* The pipe a PUTV's blocks go through, by reference (tcp_tx.c): made on the first, -1
     * until then; pipe_len bytes of the head entry's blocks are in it, not yet in the socket */
    int                 pipe[2];
    size_t              pipe_len, pipe_cap;
    int                 no_pipe;        /* none could be had: blocks are copied */
    uint64_t            tx_spliced;     /* bytes of tx_written that went through it */
    /* Unacknowledged puts (PUT frames) complete once written; a flush after them sends a
     * FLUSH_REQ and waits for its FLUSH_ACK, by which their data is in the peer's memory. */
    uint64_t            puts_sent;      /* PUT frames ever queued: the id of the last one */
    uint64_t            fence_put;      /* puts_sent when the last FLUSH_REQ was queued */
    uint64_t            fences_sent;    /* FLUSH_REQs ever queued: the id of the last one */
    uint64_t            fences_acked;   /* FLUSH_ACKs received */
    uint64_t            put_failed;     /* id of the earliest PUT the peer refused that no
                                         * flush reported yet; 0 = none */
    xfer_status_t       put_fail_status;
    uint64_t            put_fail_last;  /* id of the last PUT_FAIL: they come in order */
    uint64_t            puts_rcvd;      /* the peer's PUT frames and FLUSH_REQs received: */
    uint64_t            fences_rcvd;    /* their ids must count up from 1 */
    /* batches (tcp_batch.c): put frames of either kind, counted on both sides, so that a
     * BATCH_END can name the puts of its batch */
    uint64_t            batch_puts_sent;
    unsigned            tx_corked;  /* > 0: frames queue without writing (a batch posting) */
    xfer_batch_rx_t     batch_puts; /* received, and the last refused one */
    /* counters (xfer_endpoint_counter): frames by kind, each side */
    uint64_t            tx_put_frames, tx_putv_frames, tx_putv_blocks, tx_get_reqs;
    uint64_t            rx_put_frames, rx_putv_frames, rx_putv_blocks, rx_get_reqs;
    uint64_t            rx_bytes;       /* ever read from the peer's sockets, lanes included */
    xfer_notify_rx_t    batch_notify;   /* a notification being received */
    ucs_list_link_t     batch_fill;     /* batches with frames still to queue, oldest first */
    xfer_tcp_putv_rx_t  *putv_rx;       /* the table of the PUTV being read (tcp_batch.c) */
    xfer_flushes_t      flushes;        /* XFER_TCP_OP_FLUSH, and what they wait for */
    uint64_t            flush_acked;    /* xfer_tcp_ep_tx_acked() as the flushes are looked
                                         * at: asked once per look, not once per flush */
    int                 in_flushing;    /* on iface->flushing */
    ucs_list_link_t     flushing_link;

    xfer_tcp_rx_t       rx;
    uint8_t             *rbuf;          /* staging: [roff, rlen) is unparsed input */
    size_t              roff, rlen;
    unsigned            rx_staged;      /* frames handled from rbuf alone since a payload was
                                         * read straight into place */

    xfer_slots_t        slots;          /* requests awaiting the peer's answer */

    int                 in_ready;       /* on iface->rx_ready */
    int                 in_tx_ready;    /* on iface->tx_ready */
    ucs_list_link_t     tx_ready_link;
    uint64_t            rx_round;       /* bytes read this round (XFER_FAIR_SLICE bounds it) */
    uint64_t            rx_gen;         /* the round (iface->rx_gen) rx_round counts */
    int                 rx_drained;     /* a read this round came back short: the socket is
                                         * empty, do not pay for a read that says EAGAIN */
    ucs_list_link_t     ready_link;
    int                 in_devwait;     /* on iface->cuda.waiting */
    ucs_list_link_t     devwait_link;
    uint8_t             *rx_spill;      /* receive: a chunk of its own when every receive
                                         * buffer of the iface is taken (tcp_cuda.c) */

    /* lanes (tcp_lane.c): lanes[1 .. nlanes - 1]; lane 0 is fd above */
    unsigned            nlanes;         /* in use: min(ours, the peer's); 1 before connect */
    unsigned            lanes_max;      /* what this side offered */
    uint32_t            bad_keys;       /* peer requests whose key fit no region */
    int                 has_secret;     /* authenticated bootstrap: lanes prove secret */
    uint8_t             secret[XFER_EP_SECRET_LEN];
    uint8_t             tls_lanes[32];  /* XFER_TCP_TLS: lane 0's exported secret, whence the
                                         * lanes' keys */
    uint64_t            token;          /* a lane's LANE_HELLO names this endpoint by it */
    xfer_tcp_lane_port_t *lport;        /* server: where its lanes come; NULL: one lane */
    xfer_tcp_lane_t     *lanes;
    ucs_list_link_t     tx_wait;        /* xfer_tcp_tx_t written on lane 0, not on all lanes */
    int                 hot;            /* on iface->hot: busy polling reads it directly */
    unsigned            cold_looks;     /* ... looks in a row that found nothing */
    ucs_list_link_t     hot_link;
    struct sockaddr_storage lane_addr;  /* client: the server's lane port */
    socklen_t           lane_addr_len;
    uint64_t            peer_token;     /* client: what its lanes' hellos carry */
    unsigned            lanes_awaited;  /* server: lanes not attached yet */
    xfer_tframes_t      tf;             /* tensor fetches, both ways (the engine's) */
};

/* ---- interface ------------------------------------------------------------------------------ */


/* The bounce buffers through which CUDA memory moves (tcp_cuda.c): slots [0, depth) receive,
 * [depth, 2 * depth) send, so that a send waiting for the socket never holds up receiving. */
typedef enum {
    XFER_TCP_DSLOT_FREE,
    XFER_TCP_DSLOT_FILL,        /* receive: being filled from the socket */
    XFER_TCP_DSLOT_COPY,        /* a copy in flight (to the device, or from it) */
    XFER_TCP_DSLOT_READY,       /* send: the chunk landed, to be written */
} xfer_tcp_dslot_state_t;

typedef struct xfer_tcp_cuda {
    xfer_devcopy_t          *dc;        /* opened on the first registration of CUDA memory */
    size_t                  chunk;
    unsigned                depth;
    xfer_tcp_dslot_state_t  state[2 * XFER_TCP_CUDA_DEPTH_MAX];
    xfer_ep_h               owner[2 * XFER_TCP_CUDA_DEPTH_MAX];  /* receive: whose frame */
    ucs_list_link_t         waiting;    /* eps waiting for a bounce buffer or a copy */
    int                     changed;    /* a buffer was freed: wake the waiting eps */
} xfer_tcp_cuda_t;

struct xfer_iface {
    /* send buffers of XFER_TCP_TX_BUF_LEN come from a pool: malloc and free of 64 KiB per
     * buffer gave the memory back to the kernel and faulted it in again on every batch */
    ucs_mpool_t              tx_mp;
    int                      tx_mp_ready;
    const xfer_tcp_config_t  *cfg;
    xfer_iface_params_t      params;
    xfer_tcp_wire_limits_t   limits;
    xfer_iface_base_t        base;          /* regions: xfer_memh_h; ops: xfer_tcp_op_t */
    ucs_list_link_t          eps;
    ucs_list_link_t          batches;       /* tcp_batch.c: batches in flight */
    ucs_list_link_t          rx_ready;      /* eps with parseable buffered input */
    ucs_list_link_t          tx_ready;      /* eps whose socket takes more of their queue */
    ucs_list_link_t          flushing;      /* eps with flushes waiting */
    xfer_tcp_cuda_t          cuda;
    /* lanes: the port they connect to, and the connections that did not say which yet */
    unsigned                 lanes;         /* what endpoints offer */
    ucs_list_link_t          lane_ports;    /* xfer_tcp_lane_port_t, one per local address */
    unsigned                 num_lane_ports;
    ucs_list_link_t          accepts;       /* struct xfer_tcp_accept, oldest first */
    unsigned                 num_accepts;
    unsigned                 lanes_awaited; /* lanes our server endpoints still wait for */
    ucs_list_link_t          lane_retry;    /* client lanes to connect again (retry_at) */
    ucs_list_link_t          hot;           /* busy poll: the eps read directly */
    int64_t                  epoll_at_ns;   /* busy poll: when epoll was last asked */
    uint64_t                 rx_gen;        /* progress() calls: a round of reading is one call,
                                             * however many times it reaches an endpoint */
    unsigned                 busy_polls;    /* progress() calls since epoll was last asked
                                             * (busy poll, or no endpoint) */
    uint8_t                  *scratch;      /* XFER_TCP_RX_BUF_LEN: drained bytes, and shares
                                             * on their way into CUDA memory */
    char                     address[XFER_TCP_IFACE_ADDR_MAX];
    size_t                   address_len;
};

struct xfer_memh {
    xfer_region_t region;   /* id, key, memory: what peers' requests are checked against */
    int           cuda;     /* CUDA memory, moved through iface->cuda */
};

struct xfer_rkey {
    xfer_region_key_t wire;
};

/* ---- tcp_component.c ------------------------------------------------------------------------ */
int xfer_tcp_iface_selected(const xfer_tcp_config_t *cfg, const char *name);
/* The host part of an IPv4 or IPv6 socket address as text: 1, or 0 with "?" in buf. */
int xfer_tcp_host_text(const struct sockaddr *sa, char *buf, size_t size);
struct ifaddrs;
/* ifa's address as text, when it is an IP address of an interface that is up and selected
 * (XFER_TCP_IFACE): 1, else 0. */
int xfer_tcp_ifaddr_text(const xfer_tcp_config_t *cfg, const struct ifaddrs *ifa, char *buf,
                         size_t size);

/* ---- tcp_iface.c ---------------------------------------------------------------------------- */
XFER_COMPONENT_CORE_DECLARE(tcp);
/* Queue a completion; progress() delivers it. */
void xfer_tcp_op_complete(xfer_tcp_op_t *op, xfer_status_t status, size_t length,
                          uint64_t tag);
xfer_tcp_op_t *xfer_tcp_op_new(xfer_iface_h iface, xfer_ep_h ep, xfer_tcp_op_kind_t kind,
                               xfer_comp_t *comp);
/* An op that was never posted goes back to the pool. */
static inline void xfer_tcp_op_free(xfer_tcp_op_t *op)
{
    xfer_op_put(op->iface->base.ops, op);
}
/* Ask progress() to look at ep's input again (it was paused, or budget ran out). */
void xfer_tcp_iface_rx_kick(xfer_iface_h iface, xfer_ep_h ep);
/* Ask progress() to write on ep's send queue: a posting call wrote its budget of it. */
void xfer_tcp_iface_tx_kick(xfer_iface_h iface, xfer_ep_h ep);
/* ep has flushes that progress() must look at until they end. */
void xfer_tcp_iface_flushing_add(xfer_iface_h iface, xfer_ep_h ep);

/* ---- tcp_ep.c ------------------------------------------------------------------------------- */
/* ep_flush's frames: a request behind what was sent, and the peer's acknowledgement. */
extern const xfer_tcp_rx_handler_t xfer_tcp_rx_flush_req, xfer_tcp_rx_flush_ack;
/* An orderly close (ep_shutdown): a BYE behind everything sent, and a flush behind it. */
extern const xfer_tcp_rx_handler_t xfer_tcp_rx_bye;

/* ---- tcp_batch.c ---------------------------------------------------------------------------- */
/* Queue more frames of ep's batches, as far as their window allows; 1 when some were. */
int xfer_tcp_batch_fill(xfer_ep_h ep);
void xfer_tcp_batch_ep_gone(xfer_ep_h ep);
/* A put frame was received whole (or drained): remember a refusal for its batch. */
void xfer_tcp_batch_put_done(xfer_ep_h ep);
xfer_status_t xfer_tcp_rx_batch_end_ext(xfer_ep_h ep, const uint8_t *ext, char *why,
                                        size_t why_size);
xfer_status_t xfer_tcp_rx_batch_end_done(xfer_ep_h ep, char *why, size_t why_size);
xfer_status_t xfer_tcp_rx_batch_ack_ext(xfer_ep_h ep, const uint8_t *ext, char *why,
                                        size_t why_size);
extern const xfer_tcp_rx_handler_t xfer_tcp_rx_batch_end, xfer_tcp_rx_batch_ack,
                                   xfer_tcp_rx_putv;
/* Complete the flushes of ep whose conditions now hold; how many. */
unsigned xfer_tcp_ep_flushes_check(xfer_ep_h ep);
/* End every flush of ep with status (it failed or closes). */
void xfer_tcp_ep_flushes_fail(xfer_ep_h ep, xfer_status_t status);
/* Can ops be posted? XFER_OK or the status the ep failed with. */
xfer_status_t xfer_tcp_ep_check(xfer_ep_h ep);
/* Fail ep: from progress() now, from anywhere else at the next progress() (comp_base.c). */
extern const xfer_ep_fail_ops_t xfer_tcp_ep_fail_ops;
#define xfer_tcp_ep_fail(ep, status, ...) \
    xfer_ep_fail(&(ep)->iface->base.failq, &(ep)->fail, status, __VA_ARGS__)
#define xfer_tcp_ep_fail_later(ep, status, ...) \
    xfer_ep_fail_later(&(ep)->iface->base.failq, &(ep)->fail, status, __VA_ARGS__)
/* Stop writing into a region that is being deregistered. */
void xfer_tcp_ep_forget_region(xfer_ep_h ep, xfer_memh_h memh);
/* The socket options of the configuration (TCP_NODELAY, buffers, keepalive, timeouts). */
void xfer_tcp_sock_tune(xfer_iface_h iface, int fd);

/* ---- tcp_tx.c ------------------------------------------------------------------------------- */
/* Room for a len-byte frame at the end of the send queue (copied data); NULL: no memory.
 * answer: it answers a request of the peer (it counts in ep->answers). */
uint8_t *xfer_tcp_ep_tx_reserve(xfer_ep_h ep, size_t len, int answer);
/* Queue a frame that is only a header (type, status, id); answer as for tx_reserve. */
xfer_status_t xfer_tcp_ep_tx_hdr(xfer_ep_h ep, unsigned type, xfer_status_t status, uint64_t id,
                                 int answer);
/* Queue a header-only answer (type, status) to the frame being received, with its id. */
xfer_status_t xfer_tcp_ep_answer(xfer_ep_h ep, unsigned type, xfer_status_t status, char *why,
                                 size_t why_size);
/* Queue an entry whose memory the caller owns (zero-copy frames); tx->resp says what it
 * counts in ep->answers. */
void xfer_tcp_ep_tx_push(xfer_ep_h ep, xfer_tcp_tx_t *tx);
/* Bytes an answer of len frame bytes counts in ep->answers. */
#define XFER_TCP_ANSWER_COST(_len) ((uint64_t)(_len) + XFER_TCP_ENTRY_OVERHEAD)
/* A queue entry ends: written completely, on every lane (XFER_OK), or never to be (the ep
 * failed or closes: its status). */
void xfer_tcp_ep_tx_end(xfer_ep_h ep, xfer_tcp_tx_t *tx, xfer_status_t status);
/* Write what the socket takes now; never calls back into the framework. */
void xfer_tcp_ep_tx_write(xfer_ep_h ep);
/* The same, up to about budget bytes: the rest waits for progress (EPOLLOUT armed). */
void xfer_tcp_ep_tx_write_some(xfer_ep_h ep, size_t budget);
/* xfer_endpoint_counters' list for a tcp endpoint. */
void xfer_tcp_ep_counters(xfer_ep_h ep, xfer_counter_t *counters, size_t *count_p);
/* Close ep's pipe (its page references go); blocks are copied from then on. */
void xfer_tcp_ep_pipe_close(xfer_ep_h ep);
/* Of written bytes ever written to socket fd, those the peer's host has acknowledged. */
uint64_t xfer_tcp_sock_acked(int fd, uint64_t written);
/* Bytes of ep's send queue that the peer's host has acknowledged, ever. */
uint64_t xfer_tcp_ep_tx_acked(xfer_ep_h ep);
/* After queueing from a posting call: write now unless the socket is known to be full
 * (then EPOLLOUT is armed and progress() writes everything queued by then at once). */
void xfer_tcp_ep_tx_post(xfer_ep_h ep);
/* xfer_tcp_ep_tx_post writing at most budget bytes: a posting call that queued much (a batch)
 * returns after the first budget bytes left, and progress writes the rest. */
void xfer_tcp_ep_tx_post_some(xfer_ep_h ep, size_t budget);
/* Free a TX_BUF entry (to the pool it came from) or another kind's malloc'd entry. */
void xfer_tcp_tx_free(xfer_tcp_tx_t *tx);
void xfer_tcp_ep_update_events(xfer_ep_h ep);

/* ---- tcp_rx.c ------------------------------------------------------------------------------- */
/* Set up the payload phase of the frame being received. */
void xfer_tcp_rx_expect(xfer_ep_h ep, void *dest, size_t want, uint64_t drain);
/* The same, dest being CUDA memory (tcp_cuda.c reads it through bounce buffers). */
void xfer_tcp_rx_expect_device(xfer_ep_h ep, void *dest, size_t want, uint64_t drain);
/* One read into iov: 1 with *n_p bytes, 0 to wait (nothing there, or a read this round came
 * back short so the socket is empty), -1 when the ep failed. */
int xfer_tcp_ep_rx_read(xfer_ep_h ep, struct iovec *iov, int iovcnt, size_t *n_p);
/* Whatever the frame being received was doing ends with status. */
void xfer_tcp_ep_rx_abort(xfer_ep_h ep, xfer_status_t status);
/* Process input: up to XFER_TCP_RX_BUDGET frames; returns frames handled. */
unsigned xfer_tcp_ep_rx_progress(xfer_ep_h ep);
/* Bytes of ep's input that can be read now: staged and in the socket. */
uint64_t xfer_tcp_ep_rx_available(xfer_ep_h ep);
/* epoll reported events for ep. */
unsigned xfer_tcp_ep_handle_events(xfer_ep_h ep, uint32_t events);

/* Per-type receive handlers, called with a validated header in ep->rx.hdr. on_ext gets the
 * extension (ext_len bytes in the staging buffer) and sets up the payload with
 * xfer_tcp_rx_expect(); it returns XFER_OK, XFER_INPROGRESS (ext_len was raised: call again
 * with more bytes), XFER_ERR_BUSY (pause) or an error that fails the ep (why says what).
 * on_done, when there is one, runs once the payload is in. */
struct xfer_tcp_rx_handler {
    size_t        ext_len;
    xfer_status_t (*on_ext)(xfer_ep_h ep, const uint8_t *ext, char *why, size_t why_size);
    xfer_status_t (*on_done)(xfer_ep_h ep, char *why, size_t why_size);
};

/* ---- tcp_tag.c ------------------------------------------------------------------------------ */
extern const xfer_tcp_rx_handler_t xfer_tcp_rx_tag;
/* tag_copy: a message the framework kept into a receive's buffer (device memory too). */
xfer_status_t xfer_tcp_tag_copy(xfer_ep_h ep, void *dst, xfer_memh_h memh, const void *src,
                                size_t len);
/* tag_resume: endpoints paused at the bounds on messages nobody received read again. */
void xfer_tcp_tag_resume(xfer_iface_h iface);

/* ---- tcp_rma.c ------------------------------------------------------------------------------ */
extern const xfer_tcp_rx_handler_t xfer_tcp_rx_put_req, xfer_tcp_rx_put_ack,
                                   xfer_tcp_rx_put, xfer_tcp_rx_put_fail,
                                   xfer_tcp_rx_get_req, xfer_tcp_rx_get_resp;
/* A PUT (or a PUTV) is received: answered only when it was refused (PUT_FAIL). */
xfer_status_t xfer_tcp_rx_put_done(xfer_ep_h ep, char *why, size_t why_size);
/* Can this side put or get length bytes at remote_addr through rkey? (the key's bounds, the
 * message limit) */
xfer_status_t xfer_tcp_rma_check(xfer_ep_h ep, const char *what, size_t length,
                                 uint64_t remote_addr, xfer_rkey_h rkey);
/* Where a peer may read or write rma's range (xfer_region_reach): the region's memory there
 * and *memh_p, or NULL and *status_p; a peer scanning for keys fails ep. */
uint8_t *xfer_tcp_region_check(xfer_ep_h ep, const xfer_tcp_wire_rma_t *rma, xfer_memh_h *memh_p,
                               xfer_status_t *status_p, char *why, size_t why_size);
/* CUDA memory is taken (moved through tcp_cuda.c); host memory as mem_reg. */
xfer_status_t xfer_tcp_mem_reg_params(xfer_iface_h iface, const xfer_mem_reg_params_t *params,
                                      xfer_memh_h *memh_p);

/* ---- tcp_tensor.c --------------------------------------------------------------------------- */
extern const xfer_tcp_rx_handler_t xfer_tcp_rx_tensor_req, xfer_tcp_rx_tensor_resp,
                                   xfer_tcp_rx_tensor_cancel;
extern const xfer_tframes_ops_t xfer_tcp_tframes_ops;
/* The engine's primitive: queue the TENSOR_RESP that answers a. */
void xfer_tcp_tensor_answer(xfer_tanswer_t *a, xfer_status_t status, const xfer_tensor_t *tensor,
                            const char *reason);

/* ---- tcp_lane_port.c ------------------------------------------------------------------------ */
/* Lane ports an iface opens at most: one per local address that server endpoints came in at;
 * past it, endpoints at another address use one connection. */
#define XFER_TCP_LANE_PORTS_MAX 16

/* A listening socket for lanes, bound to one local address (tcp_lane_port.c). */
struct xfer_tcp_lane_port {
    ucs_list_link_t list;       /* iface->lane_ports */
    int             fd;
    uint16_t        port;
    int             family;
    struct in6_addr host;       /* the address it binds (IPv4 as IPv4-mapped) */
};

/* Connections accepted on the lane port that have not sent their LANE_HELLO yet, beyond the
 * lanes our endpoints wait for; past this the oldest is closed, so that idle connections
 * cannot take descriptors without bound. */
#define XFER_TCP_ACCEPT_MAX 32
struct xfer_tcp_accept;

/* The lane port at the local address of ep's connection, opened by the first server endpoint
 * there; NULL: none (ep takes one lane). */
xfer_tcp_lane_port_t *xfer_tcp_lane_port_get(xfer_ep_h ep);
/* Close the oldest silent connections beyond the bound (it falls as lanes attach). */
void xfer_tcp_lanes_trim(xfer_iface_h iface);
/* A server endpoint now waits for n lanes to come to the port. */
void xfer_tcp_lanes_awaited(xfer_ep_h ep, unsigned n);
/* An accepted connection's socket has something (its hello, or its end). */
unsigned xfer_tcp_lane_port_event(xfer_iface_h iface, struct xfer_tcp_accept *acc,
                                  uint32_t events);

/* ---- tcp_tls.c ------------------------------------------------------------------------------ */
/* the kernel's TLS socket options, where the C library's headers lack them */
#ifndef SOL_TLS
#define SOL_TLS 282
#endif
#ifndef TCP_ULP
#define TCP_ULP 31
#endif
/* The record key and IV of a TLS 1.3 traffic secret (32 bytes) for TLS_AES_128_GCM_SHA256,
 * as RFC 8446 7.3 derives them. 1 on success. */
#define XFER_TCP_TLS_KEY_LEN 16u
#define XFER_TCP_TLS_IV_LEN  12u
int xfer_tcp_tls_record_keys(const uint8_t *secret, uint8_t *key, uint8_t *iv);
/* Whether this kernel seals TCP in TLS (the "tls" ULP): XFER_ERR_UNSUPPORTED with why if not. */
xfer_status_t xfer_tcp_tls_probe(char *why, size_t why_size);
/* Lane 0's TLS 1.3 handshake (ep->fd non-blocking, keyed by ep->secret), its record keys handed
 * to the kernel, the lanes' secret kept in ep->tls_lanes. */
xfer_status_t xfer_tcp_tls_ep_start(xfer_ep_h ep, char *why, size_t why_size);
/* Seal lane idx (fd, its hello sent or read) with keys from ep->tls_lanes. */
xfer_status_t xfer_tcp_tls_lane(xfer_ep_h ep, unsigned idx, int fd, char *why, size_t why_size);

/* ---- tcp_lane.c ----------------------------------------------------------------------------- */
/* Take fd as lane: non-blocking, tuned, in the epoll set (added: it is already there). */
xfer_status_t xfer_tcp_lane_attach(xfer_tcp_lane_t *lane, int fd, int added);

/* How many lanes the iface's endpoints offer; the lane port opens with the first server-side
 * endpoint. */
void xfer_tcp_lanes_iface_open(xfer_iface_h iface);
void xfer_tcp_lanes_iface_close(xfer_iface_h iface);
/* ep_create: the lanes ep may take; ep_address: what goes into its address. */
xfer_status_t xfer_tcp_lanes_ep_init(xfer_ep_h ep);
void xfer_tcp_lanes_ep_addr(xfer_ep_h ep, xfer_tcp_wire_ep_addr_t *addr);
/* ep_connect, once the peer's address is known: the client opens the lanes. */
xfer_status_t xfer_tcp_lanes_ep_connect(xfer_ep_h ep, const xfer_tcp_wire_ep_addr_t *peer);
/* Close the lanes; their unwritten shares go with their frames (teardown). */
void xfer_tcp_lanes_ep_close(xfer_ep_h ep, int abort_unacked);
/* The epoll events a lane wants now: input while it owes a share, output while shares wait. */
void xfer_tcp_lane_update_events(xfer_tcp_lane_t *lane);
/* epoll said something of a tagged pointer (a lane or an accepted connection). */
unsigned xfer_tcp_lanes_handle_event(xfer_iface_h iface, void *tagged, uint32_t events);
/* The lane port has connections to accept. */
unsigned xfer_tcp_lanes_accept(xfer_iface_h iface, xfer_tcp_lane_port_t *lp);
/* XFER_TCP_BUSY_POLL: what epoll would have said of ep's lanes. */
unsigned xfer_tcp_lanes_busy_poll(xfer_ep_h ep);
/* Connect again the client lanes whose retry is due. */
unsigned xfer_tcp_lanes_retry(xfer_iface_h iface);
/* Lanes up (lane 0 included: connected and, on the client, hello sent). */
unsigned xfer_tcp_lanes_up(xfer_ep_h ep);
/* Busy polling: read ep directly at every progress() until it has been quiet a while. */
void xfer_tcp_ep_hot(xfer_ep_h ep);
/* The iface's timer ticks while flushes wait or lanes are to be connected again. */
void xfer_tcp_iface_timer_update(xfer_iface_h iface);

/* ---- tcp_stripe.c --------------------------------------------------------------------------- */
/* Write what lane's socket takes of its queued shares. */
void xfer_tcp_lane_write(xfer_tcp_lane_t *lane);
/* Read lane's share: 1 = in, 0 = wait, -1 = the ep failed. */
int xfer_tcp_lane_rx(xfer_tcp_lane_t *lane);
/* tx_push: cut tx's data over the lanes when it is worth it. */
void xfer_tcp_lanes_tx_stripe(xfer_ep_h ep, xfer_tcp_tx_t *tx);
/* Lane 0's part of tx was written; 1 when tx is done (no share left on other lanes). */
int xfer_tcp_lanes_tx_lane0_done(xfer_ep_h ep, xfer_tcp_tx_t *tx);
/* Write what each lane's socket takes. */
void xfer_tcp_lanes_tx_write(xfer_ep_h ep);
/* The flush marks: bytes queued on each lane; 1 when every lane's peer host acknowledged
 * its bytes up to mark (NULL: all bytes queued). */
void xfer_tcp_lanes_mark(xfer_ep_h ep, uint64_t *mark);
int xfer_tcp_lanes_acked(xfer_ep_h ep, const uint64_t *mark);
/* Lane 0 enters the payload of a striped frame: its rx.want/rx.drain become share 0, the
 * other lanes take theirs. XFER_OK, or an error with why. */
xfer_status_t xfer_tcp_lanes_rx_start(xfer_ep_h ep, char *why, size_t why_size);
/* Read the other lanes' shares: 1 = all in, 0 = wait, -1 = the ep failed. */
int xfer_tcp_lanes_rx_poll(xfer_ep_h ep);
/* The frame's destination is gone (region deregistered, ep failing): shares drain. */
void xfer_tcp_lanes_rx_forget(xfer_ep_h ep);
void xfer_tcp_lanes_rx_reset(xfer_ep_h ep);
/* Bytes waiting in the lanes' sockets. */
uint64_t xfer_tcp_lanes_rx_available(xfer_ep_h ep);

/* ---- tcp_cuda.c ----------------------------------------------------------------------------- */
void xfer_tcp_cuda_init(xfer_iface_h iface);
void xfer_tcp_cuda_cleanup(xfer_iface_h iface);
/* Accept CUDA memory of attr: open the copy engine, or check that it serves attr's context. */
xfer_status_t xfer_tcp_cuda_accept(xfer_iface_h iface, const xfer_mem_attr_t *attr, char *why,
                                   size_t why_size);
/* What [p, p + len) is, for buffers that come without a registration (a tensor's data, a
 * fetch's allocation): 1 CUDA memory (accepted), 0 host memory, -1 an error with why. */
int xfer_tcp_cuda_detect(xfer_iface_h iface, const void *p, size_t len, char *why,
                         size_t why_size);
/* Whether an operation's buffer is CUDA memory: its registration says, else detection. */
int xfer_tcp_buf_is_cuda(xfer_iface_h iface, const void *p, size_t len, xfer_memh_h memh,
                         char *why, size_t why_size);
/* A copy between CUDA and host memory that has landed when it returns. */
xfer_status_t xfer_tcp_cuda_copy(xfer_iface_h iface, void *dst, const void *src, size_t len,
                                 int to_device, char *why, size_t why_size);
/* Small data out of CUDA memory, into a malloc'd copy (free it) before it is queued, so that
 * a failed copy leaves nothing half-queued. */
xfer_status_t xfer_tcp_cuda_copy_small(xfer_iface_h iface, const void *src, size_t len,
                                       void **copy_p, char *why, size_t why_size);
/* Receive: the payload into rx.dest through bounce buffers: 1 = every byte landed, 0 = wait,
 * -1 = the ep failed. */
int xfer_tcp_cuda_rx_data(xfer_ep_h ep);
/* The receive side of ep ends: the bounce buffer it fills is freed, copies in flight are
 * waited for (they write into the caller's memory, which is reported free after this). */
void xfer_tcp_cuda_rx_quiesce(xfer_ep_h ep);
/* The region of a put arriving at ep is deregistered: nothing more is copied into it. */
void xfer_tcp_cuda_rx_forget(xfer_ep_h ep);
/* Send: start copying tx's next chunks into free bounce buffers. */
void xfer_tcp_cuda_tx_fill(xfer_ep_h ep, xfer_tcp_tx_t *tx);
/* Add to iov the landed part of tx's data from data offset skip on; 1 when more of it is not
 * there yet (nothing after it may be written), 0 when all of it was added. */
int xfer_tcp_cuda_tx_gather(xfer_ep_h ep, xfer_tcp_tx_t *tx, size_t skip, struct iovec *iov,
                            int max, int *cnt_p, size_t *total_p);
/* tx->sent advanced: free the bounce buffers written, copy the next chunks. */
void xfer_tcp_cuda_tx_advance(xfer_ep_h ep, xfer_tcp_tx_t *tx);
/* tx leaves the queue: its bounce buffers are free. */
void xfer_tcp_cuda_tx_release(xfer_ep_h ep, xfer_tcp_tx_t *tx);
/* Land copies, wake the endpoints waiting for them; how many landed. */
unsigned xfer_tcp_cuda_progress(xfer_iface_h iface);
/* 1 when a copy is in flight: the iface must not sleep on its fd. */
int xfer_tcp_cuda_busy(xfer_iface_h iface);
/* ep goes: off the waiting list. */
void xfer_tcp_cuda_ep_forget(xfer_ep_h ep);

#endif
