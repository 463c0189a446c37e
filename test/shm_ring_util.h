/*
 * What the shm ring suites (test_shm_ring.c, test_shm_ring_wake.c, test_shm_ring_coop.c)
 * share: one segment in a memfd mapped twice - the owner consumes through one mapping, the
 * peer produces through the other, as two processes would - its control block's layout as
 * shm_ring.h documents it, and frames written and checked whole.
 */
#ifndef XFER_TEST_SHM_RING_UTIL_H
#define XFER_TEST_SHM_RING_UTIL_H

#include "../components/shm/shm_ring.h"

#include <stddef.h>
#include <stdint.h>

#define TOKEN      0x0123456789abcdefull
/* the control block's layout, as shm_ring.h documents it */
#define OFF_MAGIC    0u
#define OFF_VERSION  4u
#define OFF_NCELLS   8u
#define OFF_CELLSIZE 12u
#define OFF_TOKEN    16u
#define OFF_TAIL     128u
#define OFF_ARMED    192u
#define OFF_PWAIT    196u
#define OFF_COOP     256u      /* slots: claim, done (u64 each) */

#define NCELLS     4u
#define CELL       256u
#define PAYLOAD    (CELL - XFER_SHM_FRAME_HDR)

/* One segment, mapped twice. */
typedef struct seg {
    int             fd;
    size_t          len;
    uint8_t         *own;   /* the owner's mapping: it consumes */
    uint8_t         *peer;  /* the peer's mapping: it produces */
    xfer_shm_ring_t in;     /* the owner's ring */
    xfer_shm_ring_t out;    /* the peer's ring */
} seg_t;

/* the last reason a call of the ring gave */
extern char why[256];

/* A MAP_SHARED mapping of len bytes of fd (asserted). */
uint8_t *map_seg(int fd, size_t len);
/* A new segment of ncells cells of cell_size bytes, initialised by its owner and attached to
 * by its peer. */
void seg_open(seg_t *s, uint32_t ncells, uint32_t cell_size);
/* Both rings as if pos frames had gone through already (the tail says so too). */
void seg_jump(seg_t *s, uint64_t pos);
void seg_close(seg_t *s);

/* Words of a mapping, read and written as the other side does (acquire, release). */
uint64_t rd64(const uint8_t *base, size_t off);
void wr64(uint8_t *base, size_t off, uint64_t v);
uint32_t rd32(const uint8_t *base, size_t off);
void wr32(uint8_t *base, size_t off, uint32_t v);

/* Cell i of a segment, through a given mapping. */
uint8_t *cell_at(uint8_t *base, uint32_t cell_size, uint64_t i, uint32_t ncells);
/* Byte j of frame seq's payload, and frame seq's type. */
uint8_t pattern(uint64_t seq, size_t j);
unsigned frame_type(uint64_t seq);
/* The stamp in a cell's header. */
uint32_t stamp_of(const uint8_t *c);
/* Write frame seq (its type, len, ids and payload pattern) into a cell; its flags vary with
 * seq, all but INLINE (whose frames are tested on their own). */
void frame_fill(uint8_t *c, uint64_t seq, uint16_t type, uint32_t len);
/* The peer claims, fills and publishes frame seq; returns what publish said. */
int produce(seg_t *s, uint64_t seq, uint32_t len);
/* The owner peeks frame seq, checks all of it, and consumes it. */
void consume(seg_t *s, uint64_t seq, uint32_t len);
/* The owner finds the ring empty. */
void assert_empty(seg_t *s);

#endif
