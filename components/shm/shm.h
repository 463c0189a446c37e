/*
 * The shm component's internals, shared by its files: configuration, interface, endpoints,
 * operations, and the producer side of tensor fetches. Not installed; everything is hidden.
 *
 * An endpoint is two rings (shm_ring.h), one per direction, each in a memfd of its consumer,
 * and the bootstrap's TCP connection, kept as the doorbell (a byte wakes a sleeping peer) and
 * as the sign of the peer's death (the kernel closes it when the process goes, however it
 * goes). Messages and answers go through the rings; data above RNDV_THRESH moves with one
 * copy by cross-memory attach (process_vm_readv/writev) - always done by the side whose
 * memory is written into the other's read, or by the target after it checked the region -
 * and through the ring, pipelined, where the kernel does not allow it.
 *
 * Threading: none. The framework serialises every call, and the component calls back into the
 * framework only from inside those calls. Completions are queued and delivered by progress().
 */
#ifndef XFER_SHM_H
#define XFER_SHM_H

#include "shm_ring.h"

#include <xfer/component.h>

#include <ucs/datastruct/list.h>
#include <ucs/datastruct/mpool.h>

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define XFER_SHM_SUBSYS  "shm"
#define XFER_SHM_RX_BUDGET 256      /* frames per endpoint per progress() */
/* looks at an endpoint without work before progress() stops watching it (shm_act.c) */
#define XFER_SHM_IDLE_ROUNDS 256u
/* progress() calls between two looks at every endpoint (shm_act.c) */
#define XFER_SHM_ACT_SWEEP   16384u
/* bytes copied by CMA while handling input, per endpoint per progress(): a frame that moves a
 * large put or a whole batch ends the round, so that completions and notifications of what
 * was moved are delivered before more input is taken */
#define XFER_SHM_RX_BYTES_BUDGET (256u * 1024u)

enum { XFER_SHM_CMA_AUTO, XFER_SHM_CMA_ON, XFER_SHM_CMA_OFF };

/* The parameter table is in shm_component.c. */
typedef struct xfer_shm_config {
    uint64_t cells;             /* CELLS: cells of each ring */
    uint64_t cell_size;         /* CELL_SIZE: bytes of a cell, its 64-byte header included */
    uint64_t rndv_thresh;       /* RNDV_THRESH: data from this size moves by CMA */
    int      cma;               /* CMA: auto | on | off */
    int      map;               /* MAP: map peers' xfer_mem_alloc memory, put/get by memcpy */
    uint64_t nt_copy_min;       /* NT_COPY_MIN: mapped copies from this size bypass the cache */
    uint64_t coop_min;          /* COOP_MIN: mapped puts from this size share the copy with
                                 * the target (shm_coop.c) */
    uint64_t max_msg_size;      /* MAX_MSG_SIZE */
    uint64_t max_answers;       /* MAX_ANSWERS: answers queued for a peer before its input
                                 * pauses */
    int      cuda_ipc;          /* CUDA_IPC: put/get/batches of CUDA memory by IPC handles */
    int      cuda_batch_copy;   /* CUDA_BATCH_COPY: a batch's copies by cuMemcpyBatchAsync */
    int      cuda_gather;       /* CUDA_GATHER: device-to-device batches by a kernel */
    uint64_t cuda_gather_descs; /* CUDA_GATHER_DESCS: entries of the kernel's table */
} xfer_shm_config_t;

/* Who this process is, as the iface address carries it (little-endian, fixed layout). */
#define XFER_SHM_ADDR_MAGIC 0x58534d41u    /* "XSMA" */
typedef struct xfer_shm_host_id {
    uint8_t  boot_id[16];       /* /proc/sys/kernel/random/boot_id */
    uint64_t pid_ns;            /* inode of /proc/self/ns/pid: pids mean the same */
    uint64_t mnt_ns;            /* ... of /proc/self/ns/mnt: /proc is the same */
    uint32_t uid;
    uint32_t pid;
    uint32_t cma;               /* 1: this side allows and uses CMA */
} xfer_shm_host_id_t;

typedef struct xfer_shm_op  xfer_shm_op_t;
typedef struct xfer_shm_batch_rx xfer_shm_batch_rx_t;
typedef struct xfer_shm_answer xfer_shm_answer_t;

/* ---- send queue ------------------------------------------------------------------------------ */

/* A message on its way into the peer's ring: its first frame's header, then data written in
 * cells as the ring has room. */
typedef struct xfer_shm_tx {
    ucs_list_link_t     list;       /* ep->txq */
    xfer_shm_frame_t    hdr;
    const uint8_t       *head;      /* payload of the first frame before the data (a
                                     * tensor's description), head_len bytes */
    size_t              head_len;
    const uint8_t       *data;
    uint64_t            len;        /* data bytes */
    uint64_t            sent;       /* of them written */
    int                 started;    /* the first frame is in the ring */
    int                 answer;     /* it answers the peer (counts in ep->answers) */
    void                *owned;     /* freed with the entry (a copy of small data) */
    xfer_shm_op_t       *op;        /* completes once written (when on_write) */
    xfer_shm_answer_t   *answer_of; /* a tensor answer: released once written */
    int                 embedded;   /* part of an op or answer: not freed on its own */
} xfer_shm_tx_t;

/* What a queued answer of len data bytes counts against XFER_ANSWERS_BUDGET. */
#define XFER_SHM_ANSWER_COST(_len) ((uint64_t)(_len) + sizeof(xfer_shm_tx_t))

/* ---- operations ------------------------------------------------------------------------------ */

typedef enum {
    XFER_SHM_OP_SEND,
    XFER_SHM_OP_RECV,           /* a rendezvous message read for the framework's receive */
    XFER_SHM_OP_PUT,
    XFER_SHM_OP_GET,
    XFER_SHM_OP_FETCH,
    XFER_SHM_OP_FLUSH,
    XFER_SHM_OP_BATCH,          /* one BATCH frame, answered by BATCH_ACK (shm_batch.c) */
} xfer_shm_op_kind_t;

#define XFER_SHM_OP_POOL_EXTRA 64u  /* payload bytes of a pooled op (shm_iface.c) */

#define XFER_SHM_BATCH_MAX 65536u   /* descriptors of one BATCH frame: a target reads
                                     * 24 bytes each */
#define XFER_SHM_BATCH_STOP 1u      /* a BATCH's stop word once it was cancelled */

struct xfer_shm_op {
    xfer_op_t           base;       /* the framework's: comp (or a receive's tag_handle), and
                                     * the result once complete */
    xfer_shm_op_kind_t  kind;
    xfer_iface_h        iface;
    xfer_ep_h           ep;         /* RECV: the source */
    int                 on_write;   /* complete once its frames are written */
    uint32_t            slot;       /* outstanding request: index in ep->slots */
    void                *buf;
    size_t              len;
    uint64_t            serial;     /* PUT/GET/BATCH: its serial among ep->flushes' */
    xfer_flush_t        flush;      /* FLUSH: its place among ep->flushes ... */
    uint64_t            mark_tx;    /* ... and the entries queued before it */
    uint64_t            mark_coop;  /* FLUSH: shared puts posted before it */
    uint64_t            stop_ns;    /* BATCH: its deadline (0: none), XFER_SHM_BATCH_STOP
                                     * once cancelled; the target reads it every slice */
    xfer_memh_h         memh;       /* RECV: the buffer's registration, or NULL */
    xfer_shm_tx_t       tx;         /* the frames of a SEND, PUT or GET */
    xfer_cancel_hook_t  hook;       /* BATCH: on its comp until it completes */
    xfer_tfetch_t       tf;         /* FETCH: the engine's part (shm_tensor.c) */
    char                key[];      /* its first frame's payload, kept with it: a batch's
                                     * notification, a rendezvous message's memfd range */
};

/* The kinds of ep->slots (the framework's slot table): requests awaiting the peer's answer. */
typedef enum {
    XFER_SHM_SLOT_FREE = XFER_SLOT_FREE,
    XFER_SHM_SLOT_SEND,         /* a rendezvous send waits for TAG_FIN */
    XFER_SHM_SLOT_PUT,          /* ... a put for PUT_ACK */
    XFER_SHM_SLOT_GET,          /* ... a get for GET_RESP */
    XFER_SHM_SLOT_BATCH,        /* ... a BATCH frame for BATCH_ACK */
    XFER_SHM_SLOT_FETCH,        /* a fetch's op waits for its TRESP */
    XFER_SHM_SLOT_TOMBSTONE,    /* a cancelled fetch whose answer is still to come */
} xfer_shm_slot_kind_t;

/* ---- producer side of a tensor fetch --------------------------------------------------------- */

/* What shm keeps of a peer's tensor request (the engine's xfer_tanswer_t.priv): the TRESP
 * that answers it, with the tensor's dims or the reason it failed. */
struct xfer_shm_answer {
    xfer_tanswer_t       *a;        /* set once answered */
    int                  rndv;      /* the consumer reads the data: wait for TDONE */
    xfer_shm_tx_t        tx;
    uint8_t              meta[XFER_TENSOR_WIRE_META_MAX];   /* the description sent */
    char                 reason[XFER_REASON_MAX];
};

/* ---- the peer's memory, mapped to read rendezvous messages (shm_map.c) ------------------------ */

#define XFER_SHM_PEER_MAPS 8    /* per endpoint; the least recently used one is replaced */

typedef struct xfer_shm_map {
    void     *base;         /* the mapping, page-aligned; NULL when none */
    size_t   map_len;
    uint8_t  *data;         /* where the announced range starts in it */
} xfer_shm_map_t;

typedef struct xfer_shm_peer_mem {
    uint64_t       used;    /* ep->peer_mem_clock at its last use; 0: the entry is free */
    uint32_t       fd;
    uint64_t       ino, offset, length;
    int            refused; /* the checks failed: its messages are read by CMA */
    int            writable;    /* mapped for writing too (a receive buffer) */
    xfer_shm_map_t map;
} xfer_shm_peer_mem_t;

/* ---- shared puts (shm_coop.c) ---------------------------------------------------------------- */

/* The initiator's side of a slot (shm_ring.h) whose put waits for the target's parts. */
typedef struct xfer_shm_coop {
    xfer_shm_op_t *op;          /* NULL: the slot is free */
    uint32_t      gen;
    uint32_t      nparts;       /* parts of the copy: op waits until all are counted */
    uint64_t      seq;          /* rank among the ep's shared puts (flushes wait for it) */
    xfer_status_t status;       /* what op completes with once the parts are in */
    uint64_t      length;
    uint64_t      tag;
} xfer_shm_coop_t;

/* ---- endpoint ------------------------------------------------------------------------------- */

/* What the frames being received go into. */
typedef enum {
    XFER_SHM_RX_IDLE,
    XFER_SHM_RX_TAG,            /* where the framework said (rx.tag_handle) */
    XFER_SHM_RX_PUT,            /* into a checked region */
    XFER_SHM_RX_GET_RESP,       /* into rx.op's buffer */
    XFER_SHM_RX_FETCH_KEY,      /* into rx.treq's key */
    XFER_SHM_RX_TRESP,          /* into rx.op's destination */
    XFER_SHM_RX_NOTIFY,         /* a notification longer than its first cell, into
                                 * ep->notify_rx (rx.status: not XFER_OK when it is void) */
    XFER_SHM_RX_DISCARD,        /* nowhere */
} xfer_shm_rx_kind_t;

typedef struct xfer_shm_rx {
    xfer_shm_rx_kind_t  kind;
    uint8_t             *dest;      /* NULL: bytes are dropped */
    uint64_t            cap;        /* bytes of dest */
    uint64_t            total;      /* bytes the message carries */
    uint64_t            got;
    xfer_status_t       status;
    uint64_t            id, tag;
    xfer_shm_op_t       *op;
    void                *tag_handle;    /* a message's, from the framework's matching */
} xfer_shm_rx_t;

struct xfer_ep {
    xfer_iface_h        iface;
    ucs_list_link_t     list;           /* iface->eps */
    int                 fd;             /* the bootstrap connection: doorbell and liveness */
    int                 is_server;
    xfer_ep_fail_t      fail;       /* its state, its failure told once, and fw_ep */
    int                 peer_gone;      /* its connection ended: what it wrote is all */
    int                 cma;            /* both sides allow CMA */
    uint32_t            bad_keys;       /* peer requests whose key fit no region */
    pid_t               peer_pid;
    uint64_t            token;          /* names our segment to the peer */
    int                 memfd;          /* our segment's, until the peer mapped it */
    uint64_t            memfd_ino;      /* its inode, for the peer to check */
    xfer_shm_ring_t     in;             /* ours: the peer produces, we consume */
    xfer_shm_ring_t     out;            /* the peer's: we produce */
    uint64_t            max_msg;        /* min(ours, the peer's) */

    ucs_list_link_t     txq;            /* xfer_shm_tx_t, in ring order */
    uint64_t            tx_queued;      /* entries ever queued */
    uint64_t            tx_done;        /* ... and ever written whole */
    uint64_t            answers;        /* answers to the peer queued now */
    xfer_budget_queue_t answer_bytes;   /* ... their bytes, charged to XFER_ANSWERS_BUDGET */
    int                 rx_paused;      /* input waits (unexpected bounds, answers) */
    uint64_t            rx_copied;      /* CMA bytes this progress round (RX_BYTES_BUDGET) */
    uint64_t            rx_bytes;       /* ever taken in: ring payload and CMA reads (counter) */
    int                 rx_yield;       /* a notification was delivered: end the round */
    int                 rx_more;        /* a frame's work goes on in the next round */
    int                 move_active;    /* the frame at move_pos of our ring moves in slices */
    uint64_t            move_pos;
    uint64_t            move_done;      /* ... bytes of it moved */
    xfer_shm_batch_rx_t *batch_rx;      /* a peer's batch being moved (shm_batch.c) */
    xfer_shm_rx_t       rx;

    xfer_notify_rx_t    notify_rx;      /* a notification arriving over several cells */
    xfer_flushes_t      flushes;        /* XFER_SHM_OP_FLUSH, and what they wait for */

    xfer_shm_coop_t     coop[XFER_SHM_COOP_SLOTS];
    unsigned            coop_busy;      /* slots whose put waits for the target */
    uint32_t            coop_gen;       /* the last generation given to a slot */
    uint64_t            coop_posted;    /* shared puts that waited, ever */
    uint64_t            coop_frame_end; /* our ring's position after the last SHARE frame;
                                         * 0: none, or not known */

    xfer_slots_t        slots;          /* requests awaiting the peer's answer */

    xfer_shm_peer_mem_t peer_mem[XFER_SHM_PEER_MAPS];
    uint64_t            peer_mem_clock;
    unsigned            peer_mem_refused;   /* ranges that did not map; at PEER_MAPS: stop */

    int                 in_rx;          /* its input is being handled: answers wait */


    uint32_t            act_idx;        /* its bit in the iface's activity map, or ACT_NONE */
    int                 watched;        /* on iface->act.watched: progress looks at it */
    unsigned            idle;           /* looks in a row that found no work */
    ucs_list_link_t     watch_link;
    xfer_shm_map_t      act_map;        /* the peer iface's activity map, mapped here */
    xfer_tframes_t      tf;             /* tensor fetches, both ways (the engine's) */
};

/* ---- interface ------------------------------------------------------------------------------ */


/* CUDA IPC state of an iface (shm_cuda.c), set up at its first use. */
typedef struct xfer_shm_cuda_open xfer_shm_cuda_open_t;

/* An entry of the gather kernel's table (shm_cuda_gather.cu reads the same layout). */
typedef struct xfer_shm_gather_desc {
    uint64_t dst, src, len;
} xfer_shm_gather_desc_t;
typedef struct xfer_shm_cuda {
    int             state;          /* 0: not set up, 1: ready, -1: cannot be (why) */
    const xfer_cuda_driver_t *drv;  /* the driver, with its IPC entries (ready) */
    void            *ctx;           /* the CUDA context of the stream and opened handles */
    int             primary;        /* the device whose primary context is retained, or -1 */
    void            *stream;
    int             batch_refused;  /* the driver refused cuMemcpyBatchAsync: copies one by one */
    int             gather_state;   /* the gather kernel: 0 not loaded yet, 1 loaded, -1 cannot be */
    void            *gather_module;
    void            *gather_func;
    xfer_shm_gather_desc_t *gather_table;   /* pinned host memory, cfg->cuda_gather_descs */
    unsigned        gather_n;       /* entries filled and not launched */
    ucs_list_link_t opened;         /* xfer_shm_cuda_open_t: peers' allocations opened */
    char            why[XFER_REASON_MAX];
} xfer_shm_cuda_t;

/* The activity map of an iface, the owner's side (shm_act.c). */
typedef struct xfer_shm_act {
    int             fd;         /* the map's memfd, open while the iface lives; -1: none */
    uint64_t        ino;
    uint8_t         *base;      /* NULL: no map, every endpoint is watched */
    xfer_ep_h       *eps;       /* XFER_SHM_ACT_MAX: the endpoint of each bit */
    uint32_t        *free;      /* the free bits, a stack */
    uint32_t        nfree;
    ucs_list_link_t watched;    /* struct xfer_ep by watch_link: progress looks at these */
    unsigned        sweep;      /* progress() calls since every endpoint was watched */
} xfer_shm_act_t;

struct xfer_iface {
    const xfer_shm_config_t  *cfg;
    xfer_iface_params_t      params;
    xfer_shm_host_id_t       me;
    xfer_iface_base_t        base;          /* regions: xfer_memh_h; ops: xfer_shm_op_t
                                             * with up to OP_POOL_EXTRA key */
    ucs_list_link_t          eps;
    ucs_list_link_t          batches;       /* batches through the ring (shm_batch.c) */
    ucs_list_link_t          batch_work;    /* ... and mapped ones with copies left */
    ucs_list_link_t          pulls;         /* xfer_shm_pull_t with slices left */
    unsigned                 polls;         /* progress() calls since epoll was last asked */
    int                      slept;         /* armed for sleep since: ask epoll at once */
    xfer_shm_cuda_t          cuda;
    xfer_shm_act_t           act;
};

/* A range of a peer's memfd, as the peer announced it (shm_map.c). */
typedef struct xfer_shm_peer_fd {
    pid_t    pid;
    uint32_t fd;            /* the descriptor's number in the peer */
    uint64_t ino;           /* its inode (0: not checked) */
    uint64_t offset, length;
    int      exact;         /* the file must end where the range ends */
    int      read_only;     /* map it for reading only */
} xfer_shm_peer_fd_t;

struct xfer_memh {
    xfer_region_t region;   /* id, key, memory: what peers' requests are checked against */
    int      fd;            /* memfd holding it (xfer_mem_alloc), -1: none; not ours */
    uint64_t fd_offset, ino;
    /* CUDA memory (shm_cuda.c): moved by the peer through its IPC handle, never by us */
    int                    cuda;
    void                   *cu_ctx;
    uint64_t               alloc_base, alloc_len;
    char                   bus_id[16];
    xfer_cuda_ipc_handle_t handle;
};

/* The remote key: the region's key (xfer_region_key_pack), the owner's pid (byte 32) and,
 * for memory in a memfd (xfer_mem_alloc), the descriptor, its inode and the range's offset;
 * byte 56 says whether CUDA IPC fields follow (XFER_SHM_RKEY_CUDA_LEN in all). */
#define XFER_SHM_RKEY_LEN       64u
#define XFER_SHM_RKEY_CUDA_LEN  (XFER_SHM_RKEY_LEN + 32u + XFER_CUDA_IPC_HANDLE_SIZE)
#define XFER_SHM_RKEY_NO_FD     UINT32_MAX
struct xfer_rkey {
    xfer_region_key_t k;        /* the region: its id, key and bounds */
    uint32_t       pid;
    uint32_t       fd;
    uint64_t       ino, fd_offset;
    int            map_state;   /* 0: not tried, 1: mapped, -1: refused (puts go by frames) */
    xfer_shm_map_t map;
    /* CUDA memory: its allocation, GPU and IPC handle; opened here at its first use */
    int                    cuda;
    uint64_t               alloc_base, alloc_len;
    char                   bus_id[16];
    xfer_cuda_ipc_handle_t handle;
    xfer_shm_cuda_open_t   *opened;
};

/* ---- shm_map.c ------------------------------------------------------------------------------ */
/* The inode of fd, 0 if fstat fails. */
uint64_t xfer_shm_fd_ino(int fd);
/* Map a range of a peer's memfd, checked first: a regular file, the announced inode, sealed
 * against shrinking, large enough. XFER_ERR_CONNECTION when the descriptor is gone,
 * XFER_ERR_UNAVAILABLE when the kernel refuses, XFER_ERR_PROTOCOL when a check fails. */
xfer_status_t xfer_shm_peer_map(const xfer_shm_peer_fd_t *pf, xfer_shm_map_t *map, char *why,
                                size_t why_size);
void xfer_shm_peer_unmap(xfer_shm_map_t *map);
/* Where the message that m announces is mapped here for reading, or for writing too (mapping
 * the peer's range first, or taking it from the endpoint's cache); NULL when the range cannot
 * be mapped (its failure was logged once) and the message is read by CMA. m was checked: the
 * message lies in the range. */
uint8_t *xfer_shm_peer_mem(xfer_ep_h ep, const xfer_shm_rndv_mem_t *m, int writable);
/* Unmap every range in the endpoint's cache. */
void xfer_shm_peer_mem_release(xfer_ep_h ep);

/* ---- shm_copy.c ----------------------------------------------------------------------------- */
/* Copy n bytes to or from a mapping of a peer's memory: memcpy, an AVX2 loop for blocks of
 * 256 B to 64 KiB at the same offset within 32 bytes on both sides, or from
 * XFER_SHM_NT_COPY_MIN bytes on non-temporal stores, ordered before anything this side writes
 * after it. */
void xfer_shm_copy(xfer_iface_h iface, void *dst, const void *src, size_t n);
/* The same for n bytes of a transfer of whole bytes: the stores are chosen by whole. */
void xfer_shm_copy_part(xfer_iface_h iface, void *dst, const void *src, size_t n, size_t whole);

/* ---- shm_cuda.c ----------------------------------------------------------------------------- */
/* Take an IPC handle for CUDA memory being registered (memh filled); XFER_ERR_UNSUPPORTED
 * (logged) when there is none: the framework stages puts and gets of it. */
xfer_status_t xfer_shm_cuda_reg(xfer_iface_h iface, const xfer_mem_reg_params_t *params,
                                xfer_memh_h memh);
/* The CUDA fields of a remote key, at byte XFER_SHM_RKEY_LEN of it. */
void xfer_shm_cuda_rkey_pack(xfer_memh_h memh, uint8_t *b);
/* Read them into rkey (its host fields read first) and check the region lies inside the
 * allocation named; XFER_ERR_INVALID_PARAM (logged) if not. */
xfer_status_t xfer_shm_cuda_rkey_unpack(xfer_rkey_h rkey, const uint8_t *b);
void xfer_shm_cuda_rkey_release(xfer_iface_h iface, xfer_rkey_h rkey);
/* Whether a put, get or batch of memh (NULL: unregistered) to rkey is copied by the CUDA
 * driver here. */
static inline int xfer_shm_cuda_moves(xfer_memh_h memh, xfer_rkey_h rkey)
{
    return rkey->cuda || ((memh != NULL) && memh->cuda);
}
/* A put or get copied by the driver, done when it returns: XFER_OK or an error. The range
 * was checked against the key, and a key of host memory is mapped here. */
xfer_status_t xfer_shm_cuda_rma(xfer_ep_h ep, int is_put, void *buf, size_t length,
                                xfer_memh_h memh, uint64_t remote_addr, xfer_rkey_h rkey);
/* Every descriptor of a batch (checked against the key, mapped if host memory) copied the
 * same way. */
xfer_status_t xfer_shm_cuda_batch(xfer_ep_h ep, xfer_batch_args_t *args);
/* Close the peers' allocations opened here, the stream and the context retained. */
void xfer_shm_cuda_cleanup(xfer_iface_h iface);

/* ---- shm_cuda_gather.c ---------------------------------------------------------------------- */
/* Device-to-device batches by the copy kernel; all in the iface's CUDA context, entered. */
/* 1 when the kernel is loaded (at the first call; the reason logged once where it cannot be). */
int xfer_shm_gather_ready(xfer_iface_h iface);
/* A copy of len bytes into the table, launching a full table first: 0 or the driver's error. */
int xfer_shm_gather_add(xfer_iface_h iface, xfer_cu_ptr_t dst, xfer_cu_ptr_t src,
                        uint64_t len);
/* End a batch's adds: res 0 launches what the table holds, else it is dropped; the result. */
int xfer_shm_gather_end(xfer_iface_h iface, int res);
/* Free the table and unload the module (the stream waited for). */
void xfer_shm_gather_cleanup(xfer_iface_h iface);

/* ---- shm_coop.c ----------------------------------------------------------------------------- */
/* A put of length bytes from buf (registered as memh, or NULL) to remote, where the
 * initiator maps the target's memory, copied by both sides when the target progresses.
 * XFER_OK: all copied here; XFER_INPROGRESS: the op completes once the target's parts are
 * in; XFER_ERR_UNSUPPORTED: not shared (too small, no free slot, the ring busy, neither a
 * mapped source nor CMA) - the caller copies it all. */
xfer_status_t xfer_shm_coop_put(xfer_ep_h ep, const void *buf, size_t length,
                                xfer_memh_h memh, uint8_t *remote, uint64_t remote_addr,
                                xfer_rkey_h rkey, xfer_comp_t *comp);
/* A rendezvous message of n bytes, whose sender's memory is mapped here at src, into receive
 * op's buffer: shared with the sender when op's buffer lies in a memfd it may map (the
 * sender copies parts into it from its send buffer, send_id). Returns as xfer_shm_coop_put();
 * XFER_INPROGRESS: op completes with status, length and tag once the sender's parts are in. */
xfer_status_t xfer_shm_coop_recv(xfer_ep_h ep, xfer_shm_op_t *op, uint64_t n,
                                 const uint8_t *src, uint64_t send_id, xfer_status_t status,
                                 uint64_t length, uint64_t tag);
/* Complete ep's shared puts whose target finished its parts: how many. */
unsigned xfer_shm_coop_check(xfer_ep_h ep);
/* Has the target finished its parts of one of ep's waiting shared puts? */
int xfer_shm_coop_ready(xfer_ep_h ep);
/* Does a shared put posted as one of the first mark still wait? (flushes) */
int xfer_shm_coop_waits(xfer_ep_h ep, uint64_t mark);
/* The ep ends: its waiting shared puts complete with status. */
void xfer_shm_coop_ep_gone(xfer_ep_h ep, xfer_status_t status);
xfer_status_t xfer_shm_rx_share(xfer_ep_h ep, const xfer_shm_frame_t *hdr,
                                const uint8_t *payload, char *why, size_t why_size);

/* ---- shm_component.c ------------------------------------------------------------------------ */
/* This process's identity for the iface address; why when it cannot be read. */
xfer_status_t xfer_shm_host_id(xfer_shm_host_id_t *id, int cma, char *why, size_t why_size);
/* Can this side's CMA be used (the CMA parameter, and a probe of the kernel)? why if not. */
int xfer_shm_cma_allowed(const xfer_shm_config_t *cfg, char *why, size_t why_size);
void xfer_shm_host_id_pack(const xfer_shm_host_id_t *id, uint8_t *buf);  /* 48 bytes */
xfer_status_t xfer_shm_host_id_unpack(const void *buf, size_t len, xfer_shm_host_id_t *id,
                                      char *why, size_t why_size);
#define XFER_SHM_IFACE_ADDR_LEN 52u

/* ---- shm_iface.c ---------------------------------------------------------------------------- */
XFER_COMPONENT_CORE_DECLARE(shm);

/* ---- the activity map (shm_act.c) -------------------------------------------------------- */

/* Create the iface's map; without one (logged), every endpoint is watched. */
void xfer_shm_act_open(xfer_iface_h iface);
void xfer_shm_act_close(xfer_iface_h iface);
/* Give a new endpoint its bit (ACT_NONE when none is left); take it back. */
void xfer_shm_act_bind(xfer_ep_h ep);
void xfer_shm_act_unbind(xfer_ep_h ep);
/* progress() looks at ep from now on (until it has been idle for IDLE_ROUNDS looks). */
void xfer_shm_ep_watch(xfer_ep_h ep);
/* A look found no work at ep: 1 when it is no longer watched (off the list). */
int xfer_shm_ep_idle(xfer_ep_h ep);
/* Watch the endpoints whose bits are set (and, now and then, every endpoint). */
void xfer_shm_act_collect(xfer_iface_h iface);
/* About to sleep: 1 when no bit is set, and a producer that sets one rings the doorbell. */
int xfer_shm_act_arm(xfer_iface_h iface);
void xfer_shm_act_disarm(xfer_iface_h iface);
int xfer_shm_iface_reachable(xfer_iface_h iface, const void *peer_addr, size_t len, char *why,
                             size_t why_size);
/* The same, for an address already unpacked: 1, or 0 with why. */
int xfer_shm_host_reachable(xfer_iface_h iface, const xfer_shm_host_id_t *peer, char *why,
                            size_t why_size);
xfer_shm_op_t *xfer_shm_op_new(xfer_iface_h iface, xfer_ep_h ep, xfer_shm_op_kind_t kind,
                               xfer_comp_t *comp, size_t extra);
/* Queue a completion; progress() delivers it. */
void xfer_shm_op_complete(xfer_shm_op_t *op, xfer_status_t status, size_t length, uint64_t tag);
/* An op that was never completed (its post failed) goes back to the pool. */
static inline void xfer_shm_op_free(xfer_shm_op_t *op)
{
    xfer_op_put(op->iface->base.ops, op);
}

/* ---- shm_ep.c ------------------------------------------------------------------------------- */
/* The peer's BYE: the endpoint ends with XFER_ERR_PEER_CLOSED. */
xfer_status_t xfer_shm_rx_bye(xfer_ep_h ep, const xfer_shm_frame_t *hdr,
                              const uint8_t *payload, char *why, size_t why_size);
/* Can ops be posted? XFER_OK or the status the ep failed with. */
xfer_status_t xfer_shm_ep_check(xfer_ep_h ep);
/* Fail ep: from progress() now, from anywhere else at the next progress() (comp_base.c). */
extern const xfer_ep_fail_ops_t xfer_shm_ep_fail_ops;
#define xfer_shm_ep_fail(ep, status, ...) \
    xfer_ep_fail(&(ep)->iface->base.failq, &(ep)->fail, status, __VA_ARGS__)
#define xfer_shm_ep_fail_later(ep, status, ...) \
    xfer_ep_fail_later(&(ep)->iface->base.failq, &(ep)->fail, status, __VA_ARGS__)
/* Flushes whose conditions now hold complete. */
unsigned xfer_shm_ep_flushes_check(xfer_ep_h ep);
/* Cross-memory attach between this process and the peer: move len bytes between local and
 * the peer's remote address (to_peer: write into the peer). XFER_OK, or an error with why. */
xfer_status_t xfer_shm_cma(xfer_ep_h ep, void *local, uint64_t remote, uint64_t len, int to_peer,
                           char *why, size_t why_size);

/* ---- shm_tx.c ------------------------------------------------------------------------------- */
/* Queue a message: hdr's first frame, then len bytes of data (copied into cells as the ring
 * has room). tx is the caller's (embedded) or NULL: one is allocated, with copy = 1 copying
 * data so the caller may reuse it. XFER_OK or XFER_ERR_NO_MEMORY. */
xfer_status_t xfer_shm_tx_queue(xfer_ep_h ep, xfer_shm_tx_t *tx, const xfer_shm_frame_t *hdr,
                                const void *data, uint64_t len, int copy, int answer);
/* A frame of type with id, a and len bytes of payload that fits one cell, into an idle ring
 * with room (a small tag message, a notification): the header is written field by field
 * into the cell (no frame built on the stack and copied, which stalls on the copy's loads)
 * and published; up to XFER_SHM_INLINE_MAX bytes of a TAG or NOTIFY go into the header's line
 * (FL_INLINE). 0 when it was not written: queue it instead. */
int xfer_shm_tx_inline(xfer_ep_h ep, unsigned type, uint64_t id, uint64_t a, const void *data,
                       uint32_t len);
/* A frame with no payload (an answer: TAG_FIN, PUT_ACK, TDONE...). */
xfer_status_t xfer_shm_tx_ctrl(xfer_ep_h ep, unsigned type, xfer_status_t status, uint64_t id,
                               int answer);
/* Write what the ring has room for: the frames written, or -1 when the ep failed. Rings the
 * doorbell when the peer sleeps. */
int xfer_shm_tx_write(xfer_ep_h ep);
/* Wake the peer, which sleeps on its end of the bootstrap connection (a byte; a full socket
 * means it has bytes to wake it already). */
void xfer_shm_doorbell_ring(xfer_ep_h ep);
/* Queue entries that will never be written (the ep failed or closes). */
void xfer_shm_tx_drop_all(xfer_ep_h ep, xfer_status_t status);

/* ---- shm_rx.c ------------------------------------------------------------------------------- */
/* Process input frames, up to XFER_SHM_RX_BUDGET; returns how many. */
unsigned xfer_shm_ep_rx_progress(xfer_ep_h ep);
/* The message being received continues in DATA frames into dest (cap bytes of room, the rest
 * dropped). */
void xfer_shm_rx_expect(xfer_ep_h ep, xfer_shm_rx_kind_t kind, void *dest, uint64_t cap,
                        uint64_t total);
/* Bytes of the message being received, in order: into dest within cap, the rest dropped. */
void xfer_shm_rx_feed(xfer_ep_h ep, const uint8_t *p, uint64_t n);
/* A status the peer reports, as one of ours: unknown values become XFER_ERR_PROTOCOL. */
xfer_status_t xfer_shm_status_from_peer(int32_t status);
/* Receiving ends with the ep: whatever the frame being received was filling ends. */
void xfer_shm_rx_abort(xfer_ep_h ep, xfer_status_t status);
/* The doorbell connection has something: bytes (drained) or its end. */
void xfer_shm_ep_doorbell(xfer_ep_h ep);

/* Per-type handlers, called with the frame's header and its payload (hdr->len bytes). They
 * return XFER_OK, XFER_ERR_BUSY (leave the frame in the ring and pause) or an error that fails
 * the ep (why says what). */
typedef xfer_status_t (*xfer_shm_rx_fn_t)(xfer_ep_h ep, const xfer_shm_frame_t *hdr,
                                          const uint8_t *payload, char *why, size_t why_size);
/* The message being received is whole. */
typedef xfer_status_t (*xfer_shm_rx_done_fn_t)(xfer_ep_h ep, char *why, size_t why_size);

/* ---- shm_tag.c ------------------------------------------------------------------------------ */
/* tag_pull: a rendezvous message the framework kept, read for its receive. */
xfer_status_t xfer_shm_tag_pull(xfer_ep_h ep, const void *priv, size_t priv_len,
                                uint64_t length, void *buf, size_t capacity, xfer_memh_h memh,
                                void *handle);
xfer_status_t xfer_shm_rx_tag(xfer_ep_h ep, const xfer_shm_frame_t *hdr, const uint8_t *payload,
                              char *why, size_t why_size);
xfer_status_t xfer_shm_rx_tag_fin(xfer_ep_h ep, const xfer_shm_frame_t *hdr,
                                  const uint8_t *payload, char *why, size_t why_size);
xfer_status_t xfer_shm_rx_tag_done(xfer_ep_h ep, char *why, size_t why_size);

/* ---- shm_rma.c ------------------------------------------------------------------------------ */
xfer_status_t xfer_shm_mem_reg_params(xfer_iface_h iface, const xfer_mem_reg_params_t *params,
                                      xfer_memh_h *memh_p);
/* Whether rkey's memory is mapped here (mapped at its first use when it can be). */
int xfer_shm_rkey_mapped(xfer_ep_h ep, xfer_rkey_h rkey);
/* Whether shm_cuda.c's copies reach rkey from here: the peer's device memory, or
 * its host memory mapped here (device memory here cannot reach the peer's malloc'd memory: no
 * CMA, no ring copy of device memory). */
int xfer_shm_cuda_reaches(xfer_ep_h ep, xfer_rkey_h rkey);
xfer_status_t xfer_shm_rx_put(xfer_ep_h ep, const xfer_shm_frame_t *hdr, const uint8_t *payload,
                              char *why, size_t why_size);
xfer_status_t xfer_shm_rx_put_done(xfer_ep_h ep, char *why, size_t why_size);
/* A put or get of ours (put, get, a batch's descriptor): a copy here into mapped memory -
 * shared with the target when large (memh: the local registration; NULL never shares: a
 * batch's notification follows its descriptors' copies) - else a PUT or GET frame. */
xfer_status_t xfer_shm_rma_post(xfer_ep_h ep, xfer_shm_op_kind_t kind, void *buf, size_t length,
                                xfer_memh_h memh, uint64_t remote_addr, xfer_rkey_h rkey,
                                xfer_comp_t *comp);
/* Where a peer's put or get of hdr (a: region, e: its key, b: address, c: length) lands in
 * this side's live registrations (xfer_region_reach), or NULL with the status to answer -
 * also XFER_ERR_UNSUPPORTED for CUDA memory, which nothing here touches; a peer scanning for
 * keys fails ep. again: the frame's region was found before (it moves in slices), and a miss
 * now is a deregistration here, which does not count against the peer. */
uint8_t *xfer_shm_region_check(xfer_ep_h ep, const xfer_shm_frame_t *hdr, int again,
                               xfer_status_t *status_p);
/* Whether the frame at the head of ep's ring is a put or get moving in slices. */
int xfer_shm_move_resuming(const xfer_ep_h ep);
/* The host region a peer's batch names (xfer_region_named), or NULL with the status to answer. */
xfer_region_t *xfer_shm_region_named(xfer_ep_h ep, uint64_t id, uint64_t key, int again,
                                     xfer_status_t *status_p);

/* ---- shm_batch.c ---------------------------------------------------------------------------- */
void xfer_shm_batch_ep_gone(xfer_ep_h ep);
/* A slice of each mapped batch with copies left (progress). */
unsigned xfer_shm_batch_work(xfer_iface_h iface);

/* ---- shm_pull.c: reads of a peer's memory a slice per round --------------------------------- */
typedef struct xfer_shm_pull xfer_shm_pull_t;
/* A read that went on from progress ended: XFER_OK (every byte in), the read's error (p->why
 * says more), or the status the endpoint went with. p is freed after it returns. */
typedef void (*xfer_shm_pull_cb_t)(xfer_shm_pull_t *p, xfer_status_t status);
struct xfer_shm_pull {
    ucs_list_link_t    list;        /* iface->pulls */
    xfer_ep_h          ep;
    uint8_t            *dst;
    uint64_t           src, len, done;
    xfer_shm_pull_cb_t cb;
    xfer_shm_op_t      *op;         /* the caller's */
    uint64_t           id;          /* the caller's */
    char               why[XFER_REASON_MAX];
};
/* After every byte of the peer's memory was read (by CMA, or copied from its memfd mapped
 * here): XFER_OK when the read holds, XFER_ERR_CONNECTION (why) when the peer's endpoint had
 * ended by then - its memory may have been reused, the read may mix old and new bytes. */
xfer_status_t xfer_shm_read_end(xfer_ep_h ep, char *why, size_t why_size);
/* Read len bytes at the peer's address src into dst, the first slice (XFER_FAIR_SLICE) now.
 * XFER_OK: every byte is in; an error: a read failed, or no memory for the rest (why); cb is
 * not called for either. XFER_INPROGRESS: the rest comes a slice per round of progress, then
 * cb once, with op and id. A read within one slice allocates nothing. */
xfer_status_t xfer_shm_pull(xfer_ep_h ep, void *dst, uint64_t src, uint64_t len,
                            xfer_shm_pull_cb_t cb, xfer_shm_op_t *op, uint64_t id, char *why,
                            size_t why_size);
/* A slice of every pull in progress; how many. */
unsigned xfer_shm_pulls_progress(xfer_iface_h iface);
/* ep goes: each of its pulls ends with status. */
void xfer_shm_pulls_ep_gone(xfer_ep_h ep, xfer_status_t status);
/* The ep's input ends: a peer's batch being moved is dropped (unanswered). */
void xfer_shm_batch_rx_abort(xfer_ep_h ep);
xfer_status_t xfer_shm_rx_batch(xfer_ep_h ep, const xfer_shm_frame_t *hdr,
                                const uint8_t *payload, char *why, size_t why_size);
xfer_status_t xfer_shm_rx_batch_ack(xfer_ep_h ep, const xfer_shm_frame_t *hdr,
                                    const uint8_t *payload, char *why, size_t why_size);
xfer_status_t xfer_shm_rx_notify(xfer_ep_h ep, const xfer_shm_frame_t *hdr,
                                 const uint8_t *payload, char *why, size_t why_size);
xfer_status_t xfer_shm_rx_put_ack(xfer_ep_h ep, const xfer_shm_frame_t *hdr,
                                  const uint8_t *payload, char *why, size_t why_size);
xfer_status_t xfer_shm_rx_get(xfer_ep_h ep, const xfer_shm_frame_t *hdr, const uint8_t *payload,
                              char *why, size_t why_size);
xfer_status_t xfer_shm_rx_get_resp(xfer_ep_h ep, const xfer_shm_frame_t *hdr,
                                   const uint8_t *payload, char *why, size_t why_size);
xfer_status_t xfer_shm_rx_get_resp_done(xfer_ep_h ep, char *why, size_t why_size);

/* ---- shm_tensor.c --------------------------------------------------------------------------- */
xfer_status_t xfer_shm_rx_fetch(xfer_ep_h ep, const xfer_shm_frame_t *hdr,
                                const uint8_t *payload, char *why, size_t why_size);
xfer_status_t xfer_shm_rx_fetch_done(xfer_ep_h ep, char *why, size_t why_size);
xfer_status_t xfer_shm_rx_tresp(xfer_ep_h ep, const xfer_shm_frame_t *hdr,
                                const uint8_t *payload, char *why, size_t why_size);
xfer_status_t xfer_shm_rx_tresp_done(xfer_ep_h ep, char *why, size_t why_size);
xfer_status_t xfer_shm_rx_notify_done(xfer_ep_h ep, char *why, size_t why_size);
xfer_status_t xfer_shm_rx_tdone(xfer_ep_h ep, const xfer_shm_frame_t *hdr,
                                const uint8_t *payload, char *why, size_t why_size);
xfer_status_t xfer_shm_rx_tcancel(xfer_ep_h ep, const xfer_shm_frame_t *hdr,
                                  const uint8_t *payload, char *why, size_t why_size);
extern const xfer_tframes_ops_t xfer_shm_tframes_ops;
/* The engine's primitive: queue the TRESP that answers a. */
void xfer_shm_tensor_answer(xfer_tanswer_t *a, xfer_status_t status, const xfer_tensor_t *tensor,
                            const char *reason);
/* A tensor answer was written into the ring (inline data: its tensor may go). */
void xfer_shm_answer_sent(xfer_shm_answer_t *ans);
/* ep goes: its requests are withdrawn, the tensors it answered with released with status. */
void xfer_shm_treqs_gone(xfer_ep_h ep, xfer_status_t status);

#endif
