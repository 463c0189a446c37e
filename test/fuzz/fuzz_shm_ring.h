/*
 * The input format of fuzz_shm_ring.c, shared with gen_corpus_shm.c, which writes its seeds:
 *
 *   flags:u8 ncells:u8 cell:u8 seg:i8 image_len:u16   (little-endian)
 *   image: image_len bytes, the start of a segment (control block, tail, armed, cells)
 *   script: the rest, operations of one byte each (op % SHM_OP_COUNT) and their operands
 *
 * ncells and cell pick a valid geometry (SHM_FUZZ_NCELLS, SHM_FUZZ_CELL). The segment the
 * producer attaches to is seg_len(geometry) + seg bytes long, or seg & 0xff bytes (less than
 * the control block) with SHM_FIX_SHORT; SHM_FIX_* put the right magic, version, token or
 * geometry into it over the image's.
 */
#ifndef XFER_FUZZ_SHM_RING_H
#define XFER_FUZZ_SHM_RING_H

#include "../../components/shm/shm_ring.h"

#define SHM_FUZZ_TOKEN      0x786665722d73686dull   /* the token attach expects */
#define SHM_FUZZ_HDR_LEN    6u

#define SHM_FIX_MAGIC       0x01u
#define SHM_FIX_VERSION     0x02u
#define SHM_FIX_TOKEN       0x04u
#define SHM_FIX_GEOMETRY    0x08u
#define SHM_FIX_ALL         0x0fu
#define SHM_FIX_SHORT       0x10u   /* a segment shorter than the control block */

/* the control block's layout, as shm_ring.h documents it */
#define SHM_OFF_MAGIC       0u
#define SHM_OFF_VERSION     4u
#define SHM_OFF_NCELLS      8u
#define SHM_OFF_CELLSIZE    12u
#define SHM_OFF_TOKEN       16u
#define SHM_OFF_TAIL        128u
#define SHM_OFF_ARMED       192u
#define SHM_OFF_PWAIT       196u
#define SHM_OFF_COOP        256u    /* slots of 16 bytes: claim, done */

/* Small rings: 4 to 16 cells of 256 to 512 bytes, so that a segment fits an input. */
static inline uint32_t shm_fuzz_ncells(uint8_t sel)
{
    return XFER_SHM_CELLS_MIN + sel % 13u;
}

static inline uint32_t shm_fuzz_cell(uint8_t sel)
{
    return XFER_SHM_CELL_MIN + 64u * (sel % 5u);
}

/* Script operations. C: the consumer's run, P: the producer's, both: each on its segment. */
enum {
    SHM_OP_STAMP_REL,       /* C: i8 d; the cell at our position gets the stamp of our
                             * position + d (0: ready) */
    SHM_OP_STAMP_RAW,       /* C: u64 v; cell (v >> 32) gets the stamp (uint32_t)v */
    SHM_OP_HDR,             /* C: u8 cell, u8 type, u16 len: a header (type & 0x3f and len
                             * taken modulo just past their valid range); type's bit 7 sets
                             * FL_INLINE, bit 6 FL_RNDV */
    SHM_OP_RAW,             /* both: u16 offset, u8 n, n bytes written at offset % seg_len */
    SHM_OP_PEEK,            /* C */
    SHM_OP_PEEK_CONSUME,    /* C: peek, and consume what it returned */
    SHM_OP_ARM,             /* C */
    SHM_OP_READY,           /* C */
    SHM_OP_TAIL_REL,        /* P: i8 d; tail = our head + d */
    SHM_OP_TAIL_RAW,        /* P: u64 tail */
    SHM_OP_CLAIM_PUBLISH,   /* P: u8 len: claim, fill, publish */
    SHM_OP_CLAIM,           /* P: claim only */
    SHM_OP_ARMED,           /* P: u8: what the consumer's armed word says */
    SHM_OP_USED,            /* P */
    SHM_OP_WAIT_ROOM,       /* P: about to sleep on a full ring */
    SHM_OP_ROOM_NOTIFY,     /* C: after consuming, does the producer wait? */
    SHM_OP_PWAIT,           /* C: u8: what the producer's pwait word says */
    SHM_OP_COOP_OPEN,       /* P: u8 slot, u8 parts - 1: open a shared put's slot */
    SHM_OP_COOP_TAKE,       /* P: u8 slot, u8 how (1: from the back, 2: a stale generation) */
    SHM_OP_COOP_WORD,       /* P: u8 slot, u8 which (1: done), u64: the peer writes it */
    SHM_OP_COOP_DONE,       /* P: u8 slot, u8 failed: one of the target's parts is done */
    SHM_OP_COOP_CHECK,      /* P: u8 slot: the target's parts, and how many are done */
    SHM_OP_COUNT
};

#endif
