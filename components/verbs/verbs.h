/*
 * The verbs component's internals, shared by its files:
 *   verbs_adapter.c  device, port and GID selection, PD, CQ, completion channel, progress
 *   verbs_channel.c  one RC QP per peer: creation, connection, liveness, failure, teardown
 *   verbs_tx.c       a channel's sending: messages, RDMA chunks, credits, its send queue
 *   verbs_rx.c       a channel's receives, their batched reposts, and its completions
 *   verbs_counters.c a channel's counters by name
 *   verbs_params.c   the parameters' enumerations (the table is verbs_params.h) and what
 *                    XFER_VERBS_MR_CACHE allows
 *   verbs_rma.c      registered memory, remote keys, put and get
 *   verbs_batch.c    descriptor-list batches (chains of RDMA work requests) and their
 *                    notifications (NOTIFY), both sides
 *   verbs_tag.c      tagged messages: eager through the slots, rendezvous by RDMA READ
 *   tensor_wire.c    the tensor messages' extensions (tensor_wire.h)
 *   tensor_request.c consumer side of a tensor fetch: request table, metadata cache
 *   tensor_response.c producer side: the response state machine, writes with immediate
 *
 * Threading: none. The framework serialises every call into the component, and completions
 * reach the framework only from progress().
 */
#ifndef XFER_VERBS_H
#define XFER_VERBS_H

#include "config.h"

#include "tensor_wire.h"
#include "verbs_wire.h"

#include <xfer/component.h>

#include <infiniband/verbs.h>
#include <ucs/datastruct/khash.h>
#include <ucs/datastruct/list.h>
#include <ucs/datastruct/mpool.h>

#include <stddef.h>
#include <stdint.h>

#ifdef HAVE_VALGRIND_MEMCHECK_H
#include <valgrind/memcheck.h>
#endif

/* Memory the device wrote (a received message, an RDMA READ's destination, a tensor written
 * to us) was stored by no instruction or system call valgrind sees, so memcheck would call
 * every use of received data uninitialised. Mark it defined where the completion says how
 * much arrived. Nothing without valgrind's headers; a few instructions outside valgrind. */
#ifdef HAVE_VALGRIND_MEMCHECK_H
#define XFER_VERBS_DEVICE_WROTE(_ptr, _len) ((void)VALGRIND_MAKE_MEM_DEFINED(_ptr, _len))
#else
#define XFER_VERBS_DEVICE_WROTE(_ptr, _len) ((void)0)
#endif

#define XFER_VERBS_SUBSYS    "verbs"
#define XFER_VERBS_CQ_BATCH  32
/* Credits kept back from data messages (TAG, RTS, TENSOR_REQUEST) so that answers (FIN,
 * META_DATA_UPDATE, TENSOR_RE_REQUEST, ERROR_STATUS, tensor writes) always get through,
 * even to a peer whose unexpected queue is full and who holds data credits back. */
#define XFER_VERBS_CTRL_CREDITS 4
#define XFER_VERBS_RX_BATCH_MAX 16    /* receives reposted with one ibv_post_recv */

typedef struct xfer_verbs_config {
    char     *device;           /* DEVICE: "rxe0" or "rxe0:1"; "" = first active port */
    int64_t  gid_index;         /* GID_INDEX: -1 = the RoCE v2 GID of an IPv4 address */
    uint64_t tx_queue_len;      /* TX_QUEUE_LEN: send queue depth per channel */
    uint64_t rx_queue_len;      /* RX_QUEUE_LEN: message slots (posted receives) per channel */
    uint64_t seg_size;          /* SEG_SIZE: bytes of one message slot */
    uint64_t max_inline;        /* MAX_INLINE: messages and writes up to this go inline */
    uint64_t signal_interval;   /* SIGNAL_INTERVAL: request a completion every N sends */
    uint64_t cq_size;           /* CQ_SIZE: initial completion queue entries */
    int      mtu;               /* MTU: index into the enum (0 = auto) */
    double   timeout;           /* TIMEOUT: ack timeout per retry, seconds */
    uint64_t retry_count;       /* RETRY_COUNT */
    uint64_t rnr_retry;         /* RNR_RETRY */
    uint64_t max_rd_atomic;     /* MAX_RD_ATOMIC: RDMA READs in flight per channel */
    double   keepalive;         /* KEEPALIVE: probe an idle channel after this long */
    uint64_t max_msg_size;      /* MAX_MSG_SIZE */
    uint64_t rdma_chunk;        /* RDMA_CHUNK: bytes of one RDMA WRITE or READ work request */
    int      mr_cache;          /* MR_CACHE: XFER_VERBS_MR_CACHE_AUTO or _OFF */
    uint64_t mrc_max_entries;   /* MR_CACHE_MAX_ENTRIES */
    uint64_t mrc_max_bytes;     /* MR_CACHE_MAX_BYTES */
    uint64_t meta_cache;        /* TENSOR_META_CACHE: tensor metadata kept per channel */
} xfer_verbs_config_t;

enum {
    XFER_VERBS_MR_CACHE_AUTO,   /* cache while libucm reports every unmapping */
    XFER_VERBS_MR_CACHE_OFF,    /* register per operation */
};

typedef struct xfer_verbs_op    xfer_verbs_op_t;
typedef struct xfer_verbs_treq  xfer_verbs_treq_t;
typedef struct xfer_verbs_rsp   xfer_verbs_rsp_t;

/* ---- operations ------------------------------------------------------------------------------ */

typedef enum {
    XFER_VERBS_OP_SEND,     /* tag send: eager (copied) or rendezvous (RTS, wait for FIN) */
    XFER_VERBS_OP_RECV,     /* tag receive; reads the data of a rendezvous */
    XFER_VERBS_OP_PUT,
    XFER_VERBS_OP_GET,
    XFER_VERBS_OP_FETCH,    /* tensor fetch: carries TENSOR_REQUEST, completes the fetch */
    XFER_VERBS_OP_CTRL,     /* an internal message waiting for credits; no user completion */
    XFER_VERBS_OP_TWRITE,   /* a tensor's RDMA WRITE WITH IMMEDIATE; no user completion */
    XFER_VERBS_OP_FLUSH,    /* ep_flush(): done once what was queued before it completed */
    XFER_VERBS_OP_BATCH,    /* a descriptor-list batch (owner: its xfer_verbs_batch_t) */
} xfer_verbs_op_kind_t;

/* What a queued op still has to post. */
typedef enum {
    XFER_VERBS_POST_NONE,
    XFER_VERBS_POST_MSG,    /* a message through the slots (needs a credit) */
    XFER_VERBS_POST_RDMA,   /* RDMA WRITE/READ chunks (needs send queue room) */
    XFER_VERBS_POST_FLUSH,  /* a flush's place in the queue: what is before it is posted */
    XFER_VERBS_POST_BATCH,  /* a batch's chains of work requests, then its NOTIFY */
} xfer_verbs_post_t;

struct xfer_verbs_op {
    xfer_op_t            base;      /* the framework's: comp (or a receive's tag_handle), and
                                     * the result once complete */
    ucs_list_link_t      list;      /* ch->pendq */
    xfer_verbs_op_kind_t kind;
    xfer_iface_h         iface;
    xfer_ep_h            ch;        /* the channel it runs on; RECV: the source */
    int                  busy;      /* data is moving: too late to cancel */
    uint32_t             slot;      /* index in ch->slots while an answer is awaited */

    ucs_list_link_t      busy_link; /* iface->busy: RECV/FETCH whose data is being read */
    void                 *buf;
    size_t               len;
    xfer_memh_h          memh;      /* the user's registration of buf, or NULL */
    uint32_t             lkey;      /* of buf (user memh or cache entry) */
    xfer_regcache_entry_t *mr;      /* cache hold on buf, put at completion */

    /* message to send */
    xfer_verbs_post_t    post;
    int                  ctrl;      /* a control message: may use the reserved credits */
    uint8_t              *msg;      /* header + extension (+ inline payload) */
    size_t               msg_len;
    const void           *payload;  /* eager data copied after msg when posting */
    size_t               payload_len;

    /* RDMA chunks */
    int                  opcode;    /* IBV_WR_RDMA_WRITE / IBV_WR_RDMA_READ */
    uint64_t             raddr;
    uint32_t             rkey;
    size_t               rdma_len;  /* bytes to move */
    size_t               rdma_posted;
    unsigned             rdma_inflight;
    uint64_t             peer_id;   /* RECV: the sender's RTS id */
    int                  imm_pending;   /* TWRITE: the last chunk carries imm (may be 0 B) */
    uint32_t             imm;
    void                 *owner;    /* TWRITE: its xfer_verbs_rsp_t; BATCH: its batch */
    uint64_t             flush_seq; /* FLUSH: done when sq_done reaches it ... */
    uint64_t             flush_batch; /* ... and every batch numbered below it has ended */
    xfer_tensor_t        *result;   /* FETCH */
    uint8_t              msg_buf[XFER_VERBS_WIRE_HDR_LEN + XFER_TENSOR_WIRE_META_MAX];
};                                  /* from iface->base.ops; all but msg_buf zeroed by op_new */

/* An outstanding exchange of this side, found again by the id in the peer's answer (ch->slots,
 * the framework's slot table; obj: xfer_verbs_op_t for SEND, xfer_verbs_treq_t for FETCH).
 * A tensor request packs its id into 31 bits (tensor_wire.h): at most 2^20 slots. */
typedef enum {
    XFER_VERBS_SLOT_FREE = XFER_SLOT_FREE,
    XFER_VERBS_SLOT_SEND,       /* RTS sent, FIN awaited */
    XFER_VERBS_SLOT_FETCH,      /* a tensor request (xfer_verbs_treq_t), until its end */
} xfer_verbs_slot_kind_t;

/* ---- tensor fetches --------------------------------------------------------------------------- */

/* Consumer: one fetch, from TENSOR_REQUEST to the write's immediate (or an ERROR_STATUS). */
typedef enum {
    XFER_VERBS_TREQ_REQUESTED,      /* TENSOR_REQUEST sent */
    XFER_VERBS_TREQ_RE_REQUESTED,   /* META_DATA_UPDATE came, TENSOR_RE_REQUEST sent */
    XFER_VERBS_TREQ_WITHDRAWN,      /* given up; the producer's last word is awaited */
    XFER_VERBS_TREQ_NUM_STATES
} xfer_verbs_treq_state_t;

struct xfer_verbs_treq {
    xfer_verbs_op_t         *op;        /* the fetch's op; NULL once it completed */
    xfer_ep_h               ch;
    xfer_verbs_treq_state_t state;
    uint32_t                slot;
    uint32_t                idx;        /* slot + generation, as on the wire */
    xfer_status_t           end_status; /* WITHDRAWN: what the fetch completes with */
    void                    *buf;       /* destination, or NULL until alloc() gave one */
    size_t                  capacity;
    uint64_t                addr;       /* as told to the producer; 0 = none */
    uint32_t                rkey;
    void                    *(*alloc)(void *alloc_arg, const xfer_tensor_t *meta);
    void                    *alloc_arg;
    xfer_memh_h             memh;
    xfer_tensor_wire_meta_t meta;       /* expected, then as the producer said */
    uint64_t                step;
    xfer_cancel_hook_t      hook;       /* on the fetch's comp until it completes */
    uint32_t                key_len;
    char                    key[];
};

/* Producer: one answer, from TENSOR_REQUEST to the write's completion. */
typedef enum {
    XFER_VERBS_RSP_WAIT_PUBLISH,    /* the engine has it: the framework holds the waiter */
    XFER_VERBS_RSP_WAIT_RE_REQUEST, /* META_DATA_UPDATE sent; the tensor is held */
    XFER_VERBS_RSP_WRITING,         /* the write is queued or on the wire */
    XFER_VERBS_RSP_NUM_STATES
} xfer_verbs_rsp_state_t;

/* What verbs keeps of a peer's tensor request (the engine's xfer_tanswer_t.priv, zeroed:
 * WAIT_PUBLISH): where the answer stands, and where the tensor goes. */
struct xfer_verbs_rsp {
    xfer_tanswer_t          *a;
    xfer_verbs_rsp_state_t  state;
    uint64_t                dst_addr;   /* the consumer's destination; 0 = none yet */
    uint32_t                dst_rkey;
    uint64_t                dst_capacity;
    xfer_tensor_wire_meta_t expect;     /* what the consumer expects */
    xfer_tensor_wire_meta_t meta;       /* the tensor as published */
    const void              *src;
    xfer_regcache_entry_t   *mr;        /* cache hold on src */
    void                    *bounce;    /* src copied here when it cannot be registered */
    struct ibv_mr           *bounce_mr;
};

/* channel id -> channel: a completion names its channel by id (wr_id's high half) */
KHASH_MAP_INIT_INT(xfer_verbs_chans, struct xfer_ep*)

/* Per-channel counters (xfer_endpoint_counters, xfer_perf -v, XFER_STATS=1). */
typedef struct xfer_verbs_ch_stats {
    uint64_t tx_msgs[XFER_VERBS_MSG_LAST];
    uint64_t rx_msgs[XFER_VERBS_MSG_LAST];
    uint64_t tx_writes, tx_write_bytes;     /* tensor writes with immediate */
    uint64_t rx_writes, rx_write_bytes;
    uint64_t rerequests;                    /* META_DATA_UPDATE answered by a re-request */
    uint64_t meta_hits, meta_misses;        /* the consumer's metadata cache */
    uint64_t mrc_hits, mrc_misses, mrc_evictions;
    uint64_t bounced;                       /* sources copied to a bounce buffer */
    uint64_t credit_stalls;                 /* a message or write waited for credits */
    uint64_t rejected;                      /* stale or duplicate request indices */
} xfer_verbs_ch_stats_t;

/* ---- channel (the component's endpoint) -------------------------------------------------------- */

typedef enum {
    XFER_VERBS_CH_CREATED,      /* QP in INIT, receives posted */
    XFER_VERBS_CH_WAIT_PEER,    /* QP in RTS; the peer's "ready" byte not seen yet */
    XFER_VERBS_CH_CONNECTED,
    XFER_VERBS_CH_FAILED,
} xfer_verbs_ch_state_t;

struct xfer_ep {
    xfer_iface_h          iface;
    ucs_list_link_t       list;         /* iface->channels */
    uint32_t              id;           /* in wr_id, to find the channel of a completion */
    unsigned              cq_idx;       /* iface->cqs[cq_idx] holds its queues' entries */
    int                   sock;         /* the bootstrap connection: readiness and liveness */
    int                   is_server;
    xfer_verbs_ch_state_t state;
    xfer_ep_fail_t        fail;         /* its failure, told once, and fw_ep */
    xfer_log_level_t      fail_level;   /* ... and the level of its log line */

    struct ibv_qp         *qp;
    uint32_t              psn;
    xfer_verbs_wire_ep_addr_t peer;     /* the peer's endpoint address */
    xfer_verbs_wire_iface_addr_t peer_iface;
    uint64_t              max_msg_size; /* min(ours, the peer's) */
    uint32_t              max_key_len;

    /* receive side: rx_slots buffers of seg_size in one registered slab */
    uint8_t               *rx_slab;
    struct ibv_mr         *rx_mr;
    uint32_t              rx_slots;
    uint32_t              credits_owed; /* consumed and reposted, not yet returned */
    uint32_t              credits_held; /* held back for unexpected messages over the cap */
    int                   rx_slot_kept; /* the message being handled stays in its slot */
    uint32_t              rx_batch;     /* reposts wait until this many are due ... */
    uint32_t              rx_due;       /* ... slots consumed, not reposted yet */
    uint32_t              rx_due_owed;  /* of those, how many become credits_owed */
    uint32_t              *rx_due_idx;  /* [rx_batch] their indices */

    /* send side */
    uint32_t              credits;      /* receives the peer has posted for us */
    uint32_t              sq_free;      /* send queue entries we may still post */
    uint32_t              sq_len;
    uint64_t              sq_posted;    /* work requests posted, ever */
    uint64_t              sq_done;      /* ... known complete */
    uint64_t              data_seq;     /* sq_posted after the last one that carried data
                                         * (a message, an RDMA read or write) */
    uint64_t              tx_msgs;      /* work requests posted that take a receive at the
                                         * peer (sends, writes with immediate), ever */
    uint64_t              data_msgs;    /* tx_msgs the peer must have taken for everything
                                         * that carried data to be there (BYE's count) */
    uint64_t              rx_msgs;      /* the peer's such work requests received here */
    int                   bye_sent;     /* our BYE is queued: the peer's word that it took it
                                         * may come on the bootstrap connection */
    int                   bye_taken;    /* ... and came: the channel waits for its destroy */
    uint32_t              unsignaled;
    uint32_t              signal_interval; /* SIGNAL_INTERVAL, at most a quarter of sq_len */
    uint8_t               *tx_slab;     /* ring of tx_slots copy buffers */
    struct ibv_mr         *tx_mr;
    uint32_t              tx_slots;
    uint64_t              tx_head;      /* buffers taken, ever */
    uint64_t              tx_tail;      /* ... released */
    /* signaled work requests: what completed with them */
    struct xfer_verbs_wr {
        uint64_t        seq;            /* sq_posted after it */
        uint64_t        tx_head;        /* tx_head after it */
        xfer_verbs_op_t *op;            /* RDMA chunk of op, or NULL */
        uint64_t        mark;           /* BATCH: its descriptors landed once it completes */
        uint64_t        bytes;          /* BATCH: its bytes completed once it completes */
    }                     *wrs;
    uint32_t              wr_head, wr_tail;   /* ring of sq_len entries */
    ucs_list_link_t       pendq;        /* xfer_verbs_op_t waiting to be posted, in order */
    ucs_list_link_t       flushes;      /* FLUSH ops past the queue, waiting on completions */
    unsigned              rd_inflight;  /* RDMA READs outstanding (max_rd_atomic) */
    ucs_list_link_t       batches;      /* xfer_verbs_batch_t not ended, in posting order */
    uint64_t              batch_seq;    /* batches posted, ever (numbers them) */

    xfer_slots_t          slots;        /* exchanges awaiting the peer's answer */
    xfer_tanswer_list_t   treqs;        /* the peer's tensor requests (the engine's) */
    xfer_meta_cache_t     *meta_cache;  /* the consumer's, of xfer_tensor_wire_meta_t */
    xfer_verbs_ch_stats_t stats;

    uint64_t              *ka_word;     /* the peer RDMA-writes here to probe us */
    struct ibv_mr         *ka_mr;
    double                last_activity; /* as of the last timer tick that saw activity */
    int                   active;        /* a completion since the last timer tick */
    int                   ka_pending;
};

/* ---- device memory ---------------------------------------------------------------------------- */

/*
 * What a component that registers GPU memory with this code (gdr) does where the verbs code
 * would touch a buffer with the CPU or complete a transfer into it. The verbs component has
 * none (iface->devmem == NULL): its memory is host memory, and every check below is false.
 */
typedef struct xfer_verbs_devmem_ops {
    /* The NIC wrote [buf, buf + len) of memh's GPU memory: make the data visible to the GPU
     * (flush) before the operation completes. XFER_OK, or why not in the log. */
    xfer_status_t (*landed)(xfer_iface_h iface, xfer_memh_h memh, void *buf, size_t len);
    /* Copy len bytes of host memory to dst in memh's GPU memory (an eager message). */
    xfer_status_t (*copy_in)(xfer_iface_h iface, xfer_memh_h memh, void *dst, const void *src,
                             size_t len);
    /* A buffer the user did not register is about to be registered through the MR cache:
     * XFER_OK for host memory, an error (and a log line) for GPU memory, which the cache,
     * keyed by address and kept fresh by unmap reports, cannot serve. */
    xfer_status_t (*unregistered)(xfer_iface_h iface, const void *buf, size_t len);
} xfer_verbs_devmem_ops_t;

/* ---- interface (the adapter) ------------------------------------------------------------------ */

#define XFER_VERBS_CQS_MAX 64

typedef struct xfer_verbs_cq {
    struct ibv_cq *cq;
    int           len;          /* entries it holds */
    int           committed;    /* entries its channels' queues could fill */
    int           armed;        /* asked to raise an event for its next completion */
    unsigned      idle;         /* polls in a row that found nothing, while hot */
} xfer_verbs_cq_t;

/* A CQ stays hot - polled by every progress() call - until this many polls in a row find it
 * empty; a cold one is polled once per num_cqs calls, in turn. */
#define XFER_VERBS_CQ_HOT_IDLE 64

struct xfer_iface {
    const xfer_verbs_config_t *cfg;
    xfer_iface_params_t       params;
    char                      dev_name[64];
    struct ibv_context        *ctx;
    struct ibv_pd             *pd;
    struct ibv_comp_channel   *comp_channel;
    /* the CQs the channels' QPs complete into: one, and more when a device's largest CQ
     * cannot hold every channel's queues (rxe: 32767 entries, 85 channels) */
    xfer_verbs_cq_t           cqs[XFER_VERBS_CQS_MAX];
    unsigned                  num_cqs;
    uint64_t                  cq_hot;       /* bit k: cqs[k] is polled by every call */
    unsigned                  cq_next;      /* the cold CQ the next call polls */
    uint8_t                   port;
    int                       gid_index;
    union ibv_gid             gid;
    struct ibv_port_attr      port_attr;
    struct ibv_device_attr    dev_attr;
    uint32_t                  max_inline;
    uint32_t                  rdma_chunk;   /* RDMA_CHUNK, at most the port's largest
                                             * message: longer transfers are split */
    xfer_regcache_t           *mrc;         /* buffers the user did not register */
    xfer_iface_base_t         base;         /* epfd: comp channel, timer, channels' sockets;
                                             * ops: xfer_verbs_op_t; no regions */
    unsigned                  progress_count;
    double                    fds_polled;   /* when progress() last looked at epfd */
    uint32_t                  next_ch_id;
    ucs_list_link_t           channels;
    khash_t(xfer_verbs_chans) chan_ids;     /* the channels by id, for each completion */
    ucs_list_link_t           busy;         /* RECV/FETCH ops reading their data */
    struct ibv_wc             backlog[XFER_VERBS_CQ_BATCH]; /* polled by event_arm */
    int                       backlog_len;
    uint8_t                   address[XFER_VERBS_WIRE_IFACE_ADDR_LEN];
    /* XFER_VERBS_TEST_CORRUPT=TYPE:HOW - the tests' stand-in for a fault RC cannot produce
     * (its CRCs catch corruption on the wire): the next message of TYPE this side sends is
     * damaged HOW (type, version, short, field) before it goes, or (bye_taken) goes after a
     * stray "BYE taken" byte (xfer_verbs_ch_say_bye_taken), as a lying peer's */
    uint8_t                   corrupt_type;
    char                      corrupt_how[16];
    const xfer_verbs_devmem_ops_t *devmem;  /* gdr's; NULL in verbs */
    void                      *devmem_arg;  /* the component's own state for devmem */
    /* a batch's chain of work requests is built here (TX_QUEUE_LEN of each, allocated with
     * the first batch): every channel has that send queue, and calls are serialised */
    struct ibv_send_wr        *chain_wrs;
    struct ibv_sge            *chain_sges;
};
_Static_assert(XFER_VERBS_CQS_MAX <= 64, "cq_hot holds a bit per CQ");

struct xfer_memh {
    struct ibv_mr *mr;
    void          *devmem;      /* GPU memory registered by gdr (its own record), or NULL:
                                 * host memory. The CPU never reads or writes GPU memory. */
};

/* Whether memh is GPU memory: the CPU must not touch it, and data the NIC wrote into it is
 * flushed before it is reported (iface->devmem). */
static inline int xfer_verbs_memh_on_gpu(const struct xfer_memh *memh)
{
    return (memh != NULL) && (memh->devmem != NULL);
}

struct xfer_rkey {
    uint64_t addr;
    uint64_t length;
    uint32_t rkey;
};

/* wr_id: channel id in the upper half; the lower half is a slot (receive) or a ring index
 * of ch->wrs (signaled send) or XFER_VERBS_WR_NONE (unsignaled). */
#define XFER_VERBS_WR_RECV   0x80000000u
#define XFER_VERBS_WR_NONE   0x7fffffffu

static inline uint64_t xfer_verbs_wr_id(xfer_ep_h ch, uint32_t low)
{
    return ((uint64_t)ch->id << 32) | low;
}

/* ---- verbs_component.c ------------------------------------------------------------------------ */
/* Whether registrations of buffers the user did not register may be cached under cfg in this
 * process: 1, or 0 with why filled (turned off, or unmap reports that cannot cover the heap).
 * Whether libucm delivers the reports is known once a cache subscribes. */
int xfer_verbs_mr_cache_allowed(const xfer_verbs_config_t *cfg, char *why, size_t why_size);

/* ---- verbs_adapter.c -------------------------------------------------------------------------- */
XFER_COMPONENT_CORE_DECLARE(verbs);
/* ---- verbs_cq.c ------------------------------------------------------------------------------- */
/* One more CQ of len entries (at most the device's), on the iface's completion channel. */
xfer_status_t xfer_verbs_cq_add(xfer_iface_h iface, int len);
void xfer_verbs_cq_destroy_all(xfer_iface_h iface);
/* Everything cqs[k] holds, up to 8 batches; 0 when it is empty. */
unsigned xfer_verbs_cq_poll_one(xfer_iface_h iface, unsigned k);
/* What arm kept back, then the hot CQs and one cold one; the completions handled. */
unsigned xfer_verbs_cq_poll_turns(xfer_iface_h iface);
/* Poll for completions; how many were handled. Inline: every progress calls it, mostly to
 * find an empty CQ, and an iface with one CQ (up to 85 channels on rxe) has no turns to keep. */
static inline unsigned xfer_verbs_cq_poll(xfer_iface_h iface)
{
    if ((iface->num_cqs == 1) && (iface->backlog_len == 0)) {
        return xfer_verbs_cq_poll_one(iface, 0);
    }
    return xfer_verbs_cq_poll_turns(iface);
}
/* Take the completion channel's events: their CQs are no longer armed, and turn hot. */
void xfer_verbs_cq_events_drain(xfer_iface_h iface);
/* Arm every CQ for sleeping: XFER_OK, or XFER_ERR_BUSY when there is work (or no event). */
xfer_status_t xfer_verbs_cq_arm(xfer_iface_h iface);
/* Make room for n more entries in one of the iface's CQs - one with room, one grown up to the
 * device's largest, or a new one - and say which in *idx_p; XFER_ERR_NO_RESOURCE if none can. */
xfer_status_t xfer_verbs_cq_reserve(xfer_iface_h iface, int n, unsigned *idx_p);
/* Give back what xfer_verbs_cq_reserve took. */
void xfer_verbs_cq_release(xfer_iface_h iface, unsigned idx, int n);
/* Work was posted to a QP of CQ idx: poll that CQ on every call until it has been idle. */
/* The MR behind an entry of the registration cache (verbs_adapter.c registers them). */
static inline struct ibv_mr *xfer_verbs_mr(const xfer_regcache_entry_t *entry)
{
    return entry->handle;
}

static inline void xfer_verbs_cq_touch(xfer_iface_h iface, unsigned idx)
{
    iface->cq_hot |= UINT64_C(1) << idx;
}
xfer_ep_h xfer_verbs_channel_find(xfer_iface_h iface, uint32_t id);

/* An op that was never completed goes back to the pool. */
static inline void xfer_verbs_op_free(xfer_verbs_op_t *op)
{
    xfer_op_put(op->iface->base.ops, op);
}
xfer_verbs_op_t *xfer_verbs_op_new(xfer_iface_h iface, xfer_ep_h ch, xfer_verbs_op_kind_t kind,
                                   xfer_comp_t *comp);
/* Queue op's completion for progress(); releases its cache hold. CTRL ops are freed. */
void xfer_verbs_op_complete(xfer_verbs_op_t *op, xfer_status_t status, size_t length,
                            uint64_t tag);
/* The lkey of [buf, buf+len): the user's registration, or a cache hold kept in op->mr. */
xfer_status_t xfer_verbs_op_lkey(xfer_verbs_op_t *op, xfer_memh_h memh);

/* ---- verbs_channel.c -------------------------------------------------------------------------- */
/* Complete the flushes that the send queue's completions (sq_done) have reached. */
void xfer_verbs_ch_flushes_check(xfer_ep_h ch);
/* End every flush of ch with status (it failed or closes). */
void xfer_verbs_ch_flushes_fail(xfer_ep_h ch, xfer_status_t status);
/* Post a signalled 8-byte RDMA WRITE to the peer's keepalive word: 0 posted, 1 no room in the
 * send queue, -1 the channel failed. Its completion covers every send posted before it. */
int xfer_verbs_ch_post_probe(xfer_ep_h ch);
xfer_status_t xfer_verbs_ch_check(xfer_ep_h ch);
extern const xfer_ep_fail_ops_t xfer_verbs_ch_fail_ops;
void xfer_verbs_ch_fail(xfer_ep_h ch, xfer_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Socket events of the bootstrap connection. */
void xfer_verbs_ch_sock_event(xfer_ep_h ch);
/* The peer's BYE, after it took peer_rx of our messages: the channel ends with
 * XFER_ERR_PEER_CLOSED. */
void xfer_verbs_ch_bye_rx(xfer_ep_h ch, uint64_t peer_rx);
/* Tell the peer on ch's bootstrap connection that its BYE arrived; 0, or -1 with errno. */
int  xfer_verbs_ch_say_bye_taken(xfer_ep_h ch);
void xfer_verbs_ch_timer(xfer_ep_h ch, double now);

/* ---- verbs_tx.c ------------------------------------------------------------------------------- */
/* Post one work request, signalled when signal is set or the interval asks for it; op is
 * the RDMA op whose chunk it is, or NULL. 0 posted, -1 the channel failed. */
int xfer_verbs_ch_post_send(xfer_ep_h ch, struct ibv_send_wr *wr, xfer_verbs_op_t *op,
                            int signal);
/* Post a data message at once when nothing is queued before it and a credit and send queue
 * room are there: 1 posted (payload copied or inline: the caller's buffer is free), 0 not
 * now (queue it as an op), -1 the channel failed. */
int  xfer_verbs_ch_send_now(xfer_ep_h ch, uint8_t *msg, size_t msg_len, const void *payload,
                            size_t payload_len);
/* Queue op (post == MSG or RDMA) behind what is already queued; posts what can go now. */
void xfer_verbs_ch_submit(xfer_ep_h ch, xfer_verbs_op_t *op);
/* Build a control message of ext_len extension bytes and payload and submit it. */
xfer_status_t xfer_verbs_ch_send_ctrl(xfer_ep_h ch, const xfer_verbs_wire_hdr_t *hdr,
                                      const void *ext, size_t ext_len, const void *payload,
                                      size_t payload_len);
void xfer_verbs_ch_progress_pending(xfer_ep_h ch);
/* Post op's message (op->msg, op->msg_len; op->ctrl: it may use the reserved credits) now,
 * signalled, its completion handed to op: 1 posted, 0 no credit or send queue room yet, -1
 * the channel failed. */
int xfer_verbs_ch_post_msg_op(xfer_ep_h ch, xfer_verbs_op_t *op);
/* A received data message was consumed later (unexpected over the cap). */
void xfer_verbs_ch_credit_release(xfer_ep_h ch);
/* A receive slot that held a message past the bounds (rx_slot_kept) is posted again, and its
 * credit goes back to the peer. */
void xfer_verbs_ch_slot_return(xfer_ep_h ch, uint32_t idx);

/* ---- verbs_rx.c ------------------------------------------------------------------------------- */
/* Post the receive of slot idx. */
xfer_status_t xfer_verbs_ch_rx_post(xfer_ep_h ch, uint32_t idx);
/* Post the slots due for a repost in one batch; their owed credits become returnable.
 * 0, or -1 the channel failed. */
int xfer_verbs_ch_rx_flush(xfer_ep_h ch);
void xfer_verbs_ch_handle_wc(xfer_ep_h ch, const struct ibv_wc *wc);


/* ---- verbs_rma.c ------------------------------------------------------------------------------ */
/* All RDMA chunks of op are done (status of the last failure, or XFER_OK). */
void xfer_verbs_rdma_done(xfer_verbs_op_t *op, xfer_status_t status);

/* ---- verbs_batch.c ---------------------------------------------------------------------------- */
/* The batch op at the head of ch's queue: post what the send queue and the credits allow.
 * 1 when it leaves the queue, 0 when it waits for room or a credit, -1 the channel failed. */
int xfer_verbs_batch_post(xfer_ep_h ch, xfer_verbs_op_t *op);
/* A signalled work request of the batch op completed; mark: what its ring entry said. */
void xfer_verbs_batch_wr_done(xfer_verbs_op_t *op, uint64_t mark, uint64_t bytes);
/* Whether a batch numbered below seq has not ended (a flush waits for it). */
int xfer_verbs_batch_before(xfer_ep_h ch, uint64_t seq);
/* ch failed or closes: every batch on it ends with status, with what is known landed. */
void xfer_verbs_batch_ch_fail(xfer_ep_h ch, xfer_status_t status);
/* An incoming NOTIFY: handed to the framework's notify upcall. */
xfer_status_t xfer_verbs_notify_rx(xfer_ep_h ch, const xfer_verbs_wire_hdr_t *hdr,
                                   const uint8_t *ext, char *why, size_t why_size);
/* Log (info) what a channel being destroyed still had queued, and what it waited on. */
void xfer_verbs_ch_log_unsent(xfer_ep_h ch);

/* Free what batches allocated on the iface (iface_close). */
void xfer_verbs_batch_iface_cleanup(xfer_iface_h iface);

/* ---- verbs_tag.c ------------------------------------------------------------------------------ */
/* The framework's tag matching: a kept message into a receive's buffer (GPU memory too), a
 * rendezvous one read for its receive, one kept past the bounds let go (its credit back). */
xfer_status_t xfer_verbs_tag_copy(xfer_ep_h ch, void *dst, xfer_memh_h memh, const void *src,
                                  size_t len);
xfer_status_t xfer_verbs_tag_pull(xfer_ep_h ch, const void *priv, size_t priv_len,
                                  uint64_t length, void *buf, size_t capacity, xfer_memh_h memh,
                                  void *handle);
void xfer_verbs_tag_released(xfer_ep_h ch, const void *priv, size_t priv_len, int received);
/* Incoming TAG / RTS / FIN; why is filled on a protocol error. */
xfer_status_t xfer_verbs_tag_rx(xfer_ep_h ch, const xfer_verbs_wire_hdr_t *hdr,
                                const uint8_t *ext, uint32_t slot, char *why, size_t why_size);
void xfer_verbs_recv_read_done(xfer_verbs_op_t *op, xfer_status_t status);

/* ---- tensor_request.c ------------------------------------------------------------------------ */
/* Consumer side of META_DATA_UPDATE and of an ERROR_STATUS about our request. */
xfer_status_t xfer_verbs_treq_rx(xfer_ep_h ch, const xfer_verbs_wire_hdr_t *hdr,
                                 const uint8_t *ext, char *why, size_t why_size);
/* A tensor write's immediate (the index, flag cleared) arrived on its last chunk, of
 * byte_len bytes. */
void xfer_verbs_treq_write_arrived(xfer_ep_h ch, uint32_t idx, uint32_t byte_len);
/* The channel failed or closes: every fetch on it completes with status. */
void xfer_verbs_treq_fail(xfer_verbs_treq_t *treq, xfer_status_t status);
/* The MR cache on behalf of ch: counts its hits, misses and evictions there. */
xfer_status_t xfer_verbs_ch_mrc_get(xfer_ep_h ch, const void *addr, size_t len,
                                    xfer_regcache_entry_t **mr_p);

/* ---- tensor_response.c ----------------------------------------------------------------------- */
/* Producer side of TENSOR_REQUEST, TENSOR_RE_REQUEST and of a withdrawal (ERROR_STATUS). */
xfer_status_t xfer_verbs_rsp_rx(xfer_ep_h ch, const xfer_verbs_wire_hdr_t *hdr,
                                const uint8_t *ext, char *why, size_t why_size);
/* The write of op (TWRITE) completed or failed. */
void xfer_verbs_rsp_write_done(xfer_verbs_op_t *op, xfer_status_t status);
/* Release what the producer side of ch holds. */
void xfer_verbs_rsp_drop_ch(xfer_ep_h ch, xfer_status_t status);
/* The engine's primitive: the framework's answer to a request (tensor_response.c). */
void xfer_verbs_tensor_answer(xfer_tanswer_t *a, xfer_status_t status,
                              const xfer_tensor_t *tensor, const char *reason);
/* An ERROR_STATUS about request idx, in the given direction (XFER_TENSOR_ERR_*). */
void xfer_verbs_tensor_error_send(xfer_ep_h ch, uint32_t idx, unsigned dir,
                                  xfer_status_t status, const char *reason);

/* ---- verbs_counters.c ------------------------------------------------------------------------- */
void xfer_verbs_ep_counters(xfer_ep_h ep, xfer_counter_t *counters, size_t *count_p);

/* The entries of the component table that gdr takes from verbs as they are: both tables list
 * them through this, each adding its own (query, iface_open and _close, registration). */
#define XFER_VERBS_COMPONENT_OPS \
    XFER_COMPONENT_CORE_OPS(verbs), \
    .tag_pull      = xfer_verbs_tag_pull, \
    .tag_copy      = xfer_verbs_tag_copy, \
    .tag_released  = xfer_verbs_tag_released

/* verbs' counters, which gdr exports as they are. */
#define XFER_VERBS_STATS_EXPORT \
    XFER_COMPONENT_EXPORT const xfer_component_stats_v1_t xfer_component_stats_v1 = { \
        .size        = sizeof(xfer_component_stats_v1_t), \
        .ep_counters = xfer_verbs_ep_counters, \
    }

#endif
