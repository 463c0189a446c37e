/*
 * The shared segment of one direction of an shm endpoint, and the ring in it.
 *
 * Each side of an endpoint owns the segment its peer writes into: an anonymous memfd (in no
 * mount, so nothing can be left behind by a process that dies) that the peer opens through
 * /proc/<pid>/fd. The segment is a control block and a ring of fixed-size cells; the owner
 * consumes, the peer produces (single producer, single consumer):
 *
 *   0     magic:u32 version:u32 ncells:u32 cell_size:u32 token:u64     (set by the owner)
 *   64    watched:u32  the owner polls this ring at every progress     (written by the owner)
 *   128   tail:u64   cells the owner has consumed, ever                (written by the owner)
 *   192   armed:u32  the owner sleeps on its doorbell: ring it         (both)
 *   196   pwait:u32  the peer waits for room in the ring: ring its bell   (both)
 *   200   gone:u32   the peer's endpoint ends: memory its frames named for reading (a
 *                    rendezvous message, a tensor) may be reused from now on  (the peer)
 *   256   shared puts, XFER_SHM_COOP_SLOTS x (claim:u64 done:u64)      (both; shm_coop.c)
 *   512   cells[ncells], each cell_size bytes: a 64-byte frame header and its payload
 *
 * A cell holds one frame: a header (xfer_shm_frame_t) and up to cell_size - 64 payload
 * bytes; a message longer than that continues in DATA frames, written as room frees up, so
 * that large data is pipelined through the ring. The producer publishes a cell by its stamp:
 * the header's seq word, written last, holds xfer_shm_stamp() of the cell's ring position,
 * and that is the consumer's ready test. There is no head index: the consumer reads only the
 * cell it takes next, so a small message costs it one cache line, not the index's and then
 * the cell's. A frame of up to XFER_SHM_INLINE_MAX bytes of a type that uses no more than id
 * and a carries its payload in the header's last 32 bytes (FL_INLINE): one line too. Tail
 * and the two flags (armed, pwait) sit on cache lines of their own.
 *
 * Every frame is copied out of the cell before its header is checked, and every value either
 * side reads from the other's writes - a stamp, the tail, the header's lengths, type and
 * flags - is checked like a wire header before it is used.
 *
 * The owner's activity map. An owner with many endpoints polls only the rings that have had
 * work lately (watched set); the others it learns of from its interface's activity map, one
 * more memfd that every peer maps:
 *
 *   0     magic:u32 version:u32                                        (set by the owner)
 *   64    summary:u64  bit w: word w has bits set                      (both)
 *   128   armed:u32    the owner sleeps: ring the doorbell of a set bit   (both)
 *   192   words[XFER_SHM_ACT_WORDS]:u64, bit k of word w: endpoint 64w+k (both)
 *
 * A producer that publishes into a ring that is not watched sets its endpoint's bit and the
 * word's summary bit (unless the bit is set); the owner takes the summary, then the words it
 * names, each by exchanging it with zero, and looks at those endpoints only. Bits are hints:
 * a spurious one costs a look, and the owner looks at every endpoint now and then, so a bit
 * that a peer clears cannot hide another peer for long.
 */
#ifndef XFER_SHM_RING_H
#define XFER_SHM_RING_H

#include <xfer/xfer.h>

#include <stddef.h>
#include <stdint.h>

#define XFER_SHM_SEG_MAGIC    0x58534d31u  /* "XSM1" */
#define XFER_SHM_SEG_VERSION  9u
#define XFER_SHM_SEG_CTRL     512u
#define XFER_SHM_SEG_COOP     256u         /* ... of the shared puts' slots */
#define XFER_SHM_COOP_SLOTS   4u
#define XFER_SHM_FRAME_HDR    64u
#define XFER_SHM_FRAME_SEQ    12u          /* offset of the stamp in a frame header */
#define XFER_SHM_INLINE_OFF   32u          /* ... of an inline payload (words b..e) */
#define XFER_SHM_INLINE_MAX   32u
#define XFER_SHM_CELL_MIN     256u
#define XFER_SHM_CELL_MAX     (1u << 20)
#define XFER_SHM_CELLS_MIN    4u
#define XFER_SHM_CELLS_MAX    (1u << 16)
#define XFER_SHM_ACT_MAGIC    0x58534131u  /* "XSA1" */
#define XFER_SHM_ACT_VERSION  1u
#define XFER_SHM_ACT_WORDS    64u
#define XFER_SHM_ACT_MAX      (64u * XFER_SHM_ACT_WORDS)   /* endpoints with a bit */
#define XFER_SHM_ACT_NONE     0xffffffffu  /* an endpoint without one: always watched */
#define XFER_SHM_ACT_LEN      4096u        /* bytes of the map's memfd */
#define XFER_SHM_ACT_SUMMARY  64u
#define XFER_SHM_ACT_ARMED    128u
#define XFER_SHM_ACT_BITS     192u

/* Frame types. */
enum {
    XFER_SHM_F_DATA = 1,    /* continuation of the message before it */
    XFER_SHM_F_TAG,         /* id: tag; a: length; RNDV: b source address, c send id;
                             * RNDV|MAPPED: payload names the source's memfd
                             * (xfer_shm_rndv_mem_t) */
    XFER_SHM_F_TAG_FIN,     /* id: send id; status: the receiver has read it (or failed) */
    XFER_SHM_F_PUT,         /* id: request; a: region; b: address; c: length; RNDV: d source */
    XFER_SHM_F_PUT_ACK,     /* id: request; status */
    XFER_SHM_F_GET,         /* id: request; a: region; b: address; c: length; RNDV: d dest */
    XFER_SHM_F_GET_RESP,    /* id: request; status; a: length; inline data unless RNDV */
    XFER_SHM_F_FETCH,       /* id: request; a: step; b: key length; payload: the key */
    XFER_SHM_F_TRESP,       /* id: request; status; payload: the tensor's description
                             * (xfer_tensor_wire_meta_t), then the data - or, failed, the
                             * reason; RNDV: c source address (the consumer reads it, then
                             * TDONE) */
    XFER_SHM_F_TDONE,       /* id: request; status: the consumer has read the tensor */
    XFER_SHM_F_TCANCEL,     /* id: request; the consumer cancelled its fetch */
    XFER_SHM_F_BATCH,       /* id: request; a: region; e: its key; b: address of the
                             * initiator's descriptor array; c: descriptors; d: address of
                             * the initiator's stop word (a deadline, 0 none, 1 cancelled);
                             * GET: a get batch; NOTIFY: payload is the notification (CMA
                             * only) */
    XFER_SHM_F_BATCH_ACK,   /* id: request; status; a: descriptors landed */
    XFER_SHM_F_NOTIFY,      /* a batch's notification, after the batch's data: payload: the
                             * notification; b: its whole length when it goes on in DATA
                             * frames, else 0; a: reserved (0) */
    XFER_SHM_F_SHARE,       /* id: slot | generation << 32; a: region; e: its key;
                             * b: address; c: length; d: source; MAPPED: payload names the
                             * source's memfd (xfer_shm_rndv_mem_t) - take parts of the put;
                             * RECV: take parts of a receive of c bytes of send a */
    XFER_SHM_F_BYE,         /* the sender's endpoint closes in order: everything it wrote
                             * before is delivered; nothing follows */
    XFER_SHM_F_TYPE_MAX
};

#define XFER_SHM_FL_RNDV   1u   /* the data does not follow: it is read or written by CMA */
#define XFER_SHM_FL_GET    2u   /* BATCH: of gets */
#define XFER_SHM_FL_NOTIFY 4u   /* BATCH: carries a notification */
#define XFER_SHM_FL_VOID   8u   /* BATCH, NOTIFY: cancelled before it was written */
#define XFER_SHM_FL_MAPPED 16u  /* TAG RNDV, SHARE: the source lies in a memfd the receiver
                                 * may map */
#define XFER_SHM_FL_RECV   32u  /* SHARE: of a receive - a: the send's id; payload names the
                                 * receive buffer's memfd, into which the sender copies */
#define XFER_SHM_FL_INLINE 64u  /* the payload, at most INLINE_MAX bytes, is in the header at
                                 * INLINE_OFF instead of words b..e (which read as zero) */

/* The payload of a TAG frame with RNDV|MAPPED: the sender's registered range of a memfd
 * (memory from xfer_mem_alloc) and where the message starts in it. */
typedef struct xfer_shm_rndv_mem {
    uint32_t fd;            /* the descriptor's number in the sender */
    uint32_t reserved;
    uint64_t ino;           /* its inode */
    uint64_t offset;        /* the registered range: offset in the file ... */
    uint64_t length;        /* ... and bytes */
    uint64_t msg_offset;    /* the message, from the range's start */
} xfer_shm_rndv_mem_t;

typedef struct xfer_shm_frame {
    uint32_t len;           /* payload bytes in this cell */
    uint16_t type;
    uint16_t flags;
    int32_t  status;
    uint32_t seq;           /* the stamp: xfer_shm_stamp(position) once the frame is there */
    uint64_t id;
    uint64_t a, b, c, d, e;
} xfer_shm_frame_t;

_Static_assert(sizeof(xfer_shm_frame_t) == XFER_SHM_FRAME_HDR, "a frame header is 64 bytes");
_Static_assert(offsetof(xfer_shm_frame_t, seq) == XFER_SHM_FRAME_SEQ, "the stamp's offset");
_Static_assert(offsetof(xfer_shm_frame_t, b) == XFER_SHM_INLINE_OFF,
               "an inline payload takes words b..e");

/* One side's view of one ring. Values that matter are kept here, never re-read from the
 * segment: the peer may change the segment at any time. */
typedef struct xfer_shm_ring {
    uint8_t  *base;         /* the mapped segment */
    size_t   seg_len;
    uint32_t ncells;
    uint32_t cell_size;
    uint64_t pos;           /* producer: cells published; consumer: consumed (our count) */
    uint64_t limit;         /* producer: tail last read + ncells */
    uint8_t  *cur;          /* the cell at pos */
    /* producer: the consumer's activity map and this ring's bit in it; act_word NULL: none
     * (the consumer always watches the ring) */
    uint64_t *act_word;
    uint64_t *act_summary;
    uint32_t *act_armed;
    uint64_t act_bit;
    uint64_t act_sbit;
} xfer_shm_ring_t;

/* The stamp of ring position pos: never 0 (what a zeroed header holds), and different from
 * the stamp of the same cell a lap before, so a cell being written never reads as ready. */
static inline uint32_t xfer_shm_stamp(uint64_t pos)
{
    return (uint32_t)(pos % 0xffffffffu) + 1;
}

/* Bytes of a segment of ncells cells of cell_size bytes. */
size_t xfer_shm_seg_len(uint32_t ncells, uint32_t cell_size);
/* The producer's endpoint ends: set gone in the ring it produces into, before anything of
 * it reports a send ended or lets a tensor go. */
void xfer_shm_ring_gone_set(xfer_shm_ring_t *ring);
/* The consumer, after reading memory that the producer's frames named: 1 when the producer
 * had said gone by then (what was read may mix old and new bytes), else 0. */
int xfer_shm_ring_gone(const xfer_shm_ring_t *ring);
/* Are ncells and cell_size a valid geometry? XFER_ERR_INVALID_PARAM with why when not. */
xfer_status_t xfer_shm_geometry_check(uint64_t ncells, uint64_t cell_size, char *why,
                                      size_t why_size);
/* Write the control block of a new segment (ours: we consume) and set up ring. */
void xfer_shm_seg_init(xfer_shm_ring_t *ring, void *base, uint32_t ncells, uint32_t cell_size,
                       uint64_t token);
/* Attach to the peer's segment of seg_len mapped bytes, whose owner announced token: check
 * its control block (magic, version, geometry within seg_len, token). */
xfer_status_t xfer_shm_seg_attach(xfer_shm_ring_t *ring, void *base, size_t seg_len,
                                  uint64_t token, char *why, size_t why_size);

/* Producer: the next free cell, or NULL when the ring is full; XFER_ERR_PROTOCOL in
 * *status_p when the consumer's tail is impossible (why says how). The header written into
 * it must hold seq 0 (any header built from zero does): publish sets the stamp. */
uint8_t *xfer_shm_ring_claim(xfer_shm_ring_t *ring, xfer_status_t *status_p, char *why,
                             size_t why_size);
/* Producer: publish the claimed cell (its stamp, after everything written into it); 1 when
 * the consumer sleeps and must be woken. */
int xfer_shm_ring_publish(xfer_shm_ring_t *ring);
/* Producer, after writing something the consumer looks for when it arms (a published cell,
 * a shared put's count): sets the ring's bit in the consumer's activity map when the consumer
 * does not watch the ring; 1 when the consumer sleeps and must be woken. */
int xfer_shm_ring_wake_needed(xfer_shm_ring_t *ring);
/* Producer: signal into the consumer's activity map of base (XFER_SHM_ACT_LEN bytes, mapped
 * here; checked: magic, version) at bit idx (below XFER_SHM_ACT_MAX). */
xfer_status_t xfer_shm_ring_act_attach(xfer_shm_ring_t *ring, void *base, uint32_t idx,
                                       char *why, size_t why_size);
/* Producer: the ring is full and this side is about to sleep. 1 when it is still full and
 * the consumer will ring the doorbell once it frees a cell; 0 when there is room now. */
int xfer_shm_ring_wait_room(xfer_shm_ring_t *ring);
/* Producer: has the consumer taken every cell published before pos (a ring position this
 * side's pos passed)? Read now; a tail the peer made impossible reads as no. */
int xfer_shm_ring_consumed(const xfer_shm_ring_t *ring, uint64_t pos);
/* Producer: cells published and not yet consumed, as far as this side knows. */
uint64_t xfer_shm_ring_used(const xfer_shm_ring_t *ring);

/* Consumer: the oldest unconsumed frame, its header copied into *hdr and checked (a known
 * type, len within the cell, or within INLINE_MAX for an inline frame of a type that may be
 * one) and its payload at *payload_p: 1; 0 when the ring is empty; -1 with why when the
 * producer wrote an impossible header. */
int xfer_shm_ring_peek(xfer_shm_ring_t *ring, xfer_shm_frame_t *hdr, const uint8_t **payload_p,
                       char *why, size_t why_size);
/* Consumer: done with the frame peek returned. */
void xfer_shm_ring_consume(xfer_shm_ring_t *ring);
/* Consumer: after consuming, 1 when the producer waits for room and must be woken. */
int xfer_shm_ring_room_notify(xfer_shm_ring_t *ring);
/* Consumer: about to sleep. 1 when the ring is empty and the producer will ring the
 * doorbell for the next frame; 0 when frames are there (do not sleep). */
int xfer_shm_ring_arm(xfer_shm_ring_t *ring);
/* Consumer: poll this ring at every progress from now on (the producer stops signalling). */
void xfer_shm_ring_watch(xfer_shm_ring_t *ring);
/* Consumer: stop polling it. 1 when the ring is empty and the producer will signal the next
 * frame in the activity map; 0 when a frame is there (the ring stays watched). */
int xfer_shm_ring_unwatch(xfer_shm_ring_t *ring);
/* Consumer: is a frame there? Inline: progress asks it of every endpoint at every call. */
static inline int xfer_shm_ring_ready(const xfer_shm_ring_t *ring)
{
    return __atomic_load_n((const uint32_t*)(const void*)(ring->cur + XFER_SHM_FRAME_SEQ),
                           __ATOMIC_ACQUIRE) == xfer_shm_stamp(ring->pos);
}

/* ---- the slots of shared puts (shm_coop.c) ---------------------------------------------------
 * A slot is two words in the segment of the ring its SHARE frame goes through:
 *   claim: gen:32 front:16 back:16  of the parts but the last (n of them), [0, front) are
 *                                    the announcer's, [back, n) the peer's; both take parts
 *                                    until front meets back
 *   done:  gen:32 failed:1 count:31  parts either side finished, and whether one failed; the
 *                                    side that counts the last but one copies the last
 * A new generation per use, so that a SHARE frame read late finds nothing left to take. */
#define XFER_SHM_COOP_PARTS_MAX 256u

/* Initiator: open slot of base for a put of nparts parts (1..COOP_PARTS_MAX). */
void xfer_shm_coop_open(uint8_t *base, unsigned slot, uint32_t gen, uint32_t nparts);
/* Take the next part of slot's put: from the front (the initiator) or the back (the target).
 * The part's index, below nparts; -1 when every part is taken, or when the claim word is of
 * another generation or impossible (front past back, back past nparts) - a peer that wrote
 * it takes nothing from us. */
int xfer_shm_coop_take(uint8_t *base, unsigned slot, uint32_t gen, uint32_t nparts, int back);
/* Initiator, once take() found nothing left: the parts the target took, or -1 when the claim
 * word is not a finished one of gen (front == back <= nparts). */
int xfer_shm_coop_theirs(uint8_t *base, unsigned slot, uint32_t gen, uint32_t nparts);
/* Either side: one more part is finished (failed: it could not be copied). The parts counted
 * now, this one included (as the word holds them: a peer may have written it). */
uint32_t xfer_shm_coop_done_add(uint8_t *base, unsigned slot, int failed);
/* Initiator: the parts the target finished, with *failed; -1 when the done word is of
 * another generation. */
int64_t xfer_shm_coop_done(uint8_t *base, unsigned slot, uint32_t gen, int *failed);

/* May a frame of this type carry its payload inline? Those whose header uses no more than id
 * and a: messages (not rendezvous ones) and notifications. */
static inline int xfer_shm_inline_type(unsigned type)
{
    return (type == XFER_SHM_F_TAG) || (type == XFER_SHM_F_NOTIFY);
}

/* The payload a cell of ring holds. */
static inline size_t xfer_shm_cell_payload(const xfer_shm_ring_t *ring)
{
    return ring->cell_size - XFER_SHM_FRAME_HDR;
}

#endif
