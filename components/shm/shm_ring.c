/*
 * The shared segment's control block and its single-producer, single-consumer ring
 * (shm_ring.h). Plain loads and stores of the shared words go through the compiler's
 * __atomic builtins: a cell's stamp and the tail with acquire/release (a cell is written
 * before its stamp says so, and read before the tail releases it), the sleep handshake with
 * full fences.
 */
#include "shm_ring.h"

#include <stdio.h>
#include <string.h>

#define OFF_MAGIC    0u
#define OFF_VERSION  4u
#define OFF_NCELLS   8u
#define OFF_CELLSIZE 12u
#define OFF_TOKEN    16u
#define OFF_WATCHED  64u
#define OFF_TAIL     128u
#define OFF_ARMED    192u
#define OFF_PWAIT    196u
#define OFF_GONE     200u

static uint64_t *word64(uint8_t *base, size_t off)
{
    return (uint64_t*)(void*)(base + off);
}

static uint32_t *word32(uint8_t *base, size_t off)
{
    return (uint32_t*)(void*)(base + off);
}

size_t xfer_shm_seg_len(uint32_t ncells, uint32_t cell_size)
{
    return XFER_SHM_SEG_CTRL + (size_t)ncells * cell_size;
}

/* Full fences on both sides: the producer's word is visible before any later write of its
 * user to the memory, and the consumer's reads of that memory happen before its look. */
void xfer_shm_ring_gone_set(xfer_shm_ring_t *ring)
{
    __atomic_store_n(word32(ring->base, OFF_GONE), 1, __ATOMIC_SEQ_CST);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

int xfer_shm_ring_gone(const xfer_shm_ring_t *ring)
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    return __atomic_load_n(word32(ring->base, OFF_GONE), __ATOMIC_SEQ_CST) != 0;
}

xfer_status_t xfer_shm_geometry_check(uint64_t ncells, uint64_t cell_size, char *why,
                                      size_t why_size)
{
    if ((ncells < XFER_SHM_CELLS_MIN) || (ncells > XFER_SHM_CELLS_MAX)) {
        snprintf(why, why_size, "%llu cells: a ring has %u to %u", (unsigned long long)ncells,
                 XFER_SHM_CELLS_MIN, XFER_SHM_CELLS_MAX);
        return XFER_ERR_INVALID_PARAM;
    }
    if ((cell_size < XFER_SHM_CELL_MIN) || (cell_size > XFER_SHM_CELL_MAX) ||
        (cell_size % 64) != 0) {
        snprintf(why, why_size, "a cell of %llu bytes: cells are multiples of 64 bytes from "
                 "%u to %u", (unsigned long long)cell_size, XFER_SHM_CELL_MIN,
                 XFER_SHM_CELL_MAX);
        return XFER_ERR_INVALID_PARAM;
    }
    return XFER_OK;
}

void xfer_shm_seg_init(xfer_shm_ring_t *ring, void *base, uint32_t ncells, uint32_t cell_size,
                       uint64_t token)
{
    uint8_t *b = base;

    memset(b, 0, XFER_SHM_SEG_CTRL);
    *word32(b, OFF_MAGIC)    = XFER_SHM_SEG_MAGIC;
    *word32(b, OFF_VERSION)  = XFER_SHM_SEG_VERSION;
    *word32(b, OFF_NCELLS)   = ncells;
    *word32(b, OFF_CELLSIZE) = cell_size;
    memcpy(b + OFF_TOKEN, &token, sizeof(token));
    *word32(b, OFF_WATCHED)  = 1;      /* a new endpoint is looked at until it is idle */
    ring->base      = b;
    ring->seg_len   = xfer_shm_seg_len(ncells, cell_size);
    ring->ncells    = ncells;
    ring->cell_size = cell_size;
    ring->pos       = 0;
    ring->limit     = 0;
    ring->cur       = b + XFER_SHM_SEG_CTRL;
    ring->act_word  = NULL;
}

xfer_status_t xfer_shm_seg_attach(xfer_shm_ring_t *ring, void *base, size_t seg_len,
                                  uint64_t token, char *why, size_t why_size)
{
    uint8_t ctrl[32];
    uint32_t magic, version, ncells, cell_size;
    uint64_t seg_token;

    if (seg_len < XFER_SHM_SEG_CTRL) {
        snprintf(why, why_size, "the peer's segment has %zu bytes, less than its control block",
                 seg_len);
        return XFER_ERR_PROTOCOL;
    }
    memcpy(ctrl, base, sizeof(ctrl));   /* read once: the peer may change it */
    memcpy(&magic, ctrl + OFF_MAGIC, 4);
    memcpy(&version, ctrl + OFF_VERSION, 4);
    memcpy(&ncells, ctrl + OFF_NCELLS, 4);
    memcpy(&cell_size, ctrl + OFF_CELLSIZE, 4);
    memcpy(&seg_token, ctrl + OFF_TOKEN, 8);
    if ((magic != XFER_SHM_SEG_MAGIC) || (version != XFER_SHM_SEG_VERSION)) {
        snprintf(why, why_size, "the peer's segment is not an xfer shm ring of version %u "
                 "(magic 0x%08x, version %u)", XFER_SHM_SEG_VERSION, magic, version);
        return XFER_ERR_PROTOCOL;
    }
    if (seg_token != token) {
        snprintf(why, why_size, "the peer's segment belongs to another endpoint (token "
                 "mismatch)");
        return XFER_ERR_PROTOCOL;
    }
    if (xfer_shm_geometry_check(ncells, cell_size, why, why_size) != XFER_OK) {
        return XFER_ERR_PROTOCOL;
    }
    if (xfer_shm_seg_len(ncells, cell_size) > seg_len) {
        snprintf(why, why_size, "the peer's ring of %u cells of %u bytes does not fit its "
                 "%zu-byte segment", ncells, cell_size, seg_len);
        return XFER_ERR_PROTOCOL;
    }
    ring->base      = base;
    ring->seg_len   = seg_len;
    ring->ncells    = ncells;
    ring->cell_size = cell_size;
    ring->pos       = 0;
    ring->limit     = ncells;
    ring->cur       = (uint8_t*)base + XFER_SHM_SEG_CTRL;
    ring->act_word  = NULL;     /* until xfer_shm_ring_act_attach() */
    return XFER_OK;
}

/* Step to the next cell: pos and the cell at it move together (no division per frame). */
static void ring_advance(xfer_shm_ring_t *ring)
{
    ring->pos++;
    ring->cur += ring->cell_size;
    if (ring->cur == ring->base + XFER_SHM_SEG_CTRL + (size_t)ring->ncells * ring->cell_size) {
        ring->cur = ring->base + XFER_SHM_SEG_CTRL;
    }
}

uint8_t *xfer_shm_ring_claim(xfer_shm_ring_t *ring, xfer_status_t *status_p, char *why,
                             size_t why_size)
{
    *status_p = XFER_OK;
    if (ring->pos == ring->limit) {
        uint64_t tail = __atomic_load_n(word64(ring->base, OFF_TAIL), __ATOMIC_ACQUIRE);

        /* the consumer can only have consumed what was published */
        if ((tail > ring->pos) || (ring->pos - tail > ring->ncells)) {
            snprintf(why, why_size, "the peer's ring reports %llu cells consumed of %llu "
                     "published", (unsigned long long)tail, (unsigned long long)ring->pos);
            *status_p = XFER_ERR_PROTOCOL;
            return NULL;
        }
        ring->limit = tail + ring->ncells;
        if (ring->pos == ring->limit) {
            return NULL;
        }
    }
    return ring->cur;
}

int xfer_shm_ring_publish(xfer_shm_ring_t *ring)
{
    __atomic_store_n((uint32_t*)(void*)(ring->cur + XFER_SHM_FRAME_SEQ),
                     xfer_shm_stamp(ring->pos), __ATOMIC_RELEASE);
    ring_advance(ring);
    return xfer_shm_ring_wake_needed(ring);
}

int xfer_shm_ring_wake_needed(xfer_shm_ring_t *ring)
{
    uint32_t *armed = word32(ring->base, OFF_ARMED);

    /* pairs with the fences in xfer_shm_ring_arm() and xfer_shm_ring_unwatch(): either the
     * consumer sees what this side wrote before, or this side sees armed set, or watched
     * clear */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if ((ring->act_word != NULL) &&
        (__atomic_load_n(word32(ring->base, OFF_WATCHED), __ATOMIC_RELAXED) == 0)) {
        /* the consumer polls its activity map, not this ring: the bit, then the summary (a
         * bit that is set was, or is about to be, summarised by whoever set it) */
        if ((__atomic_load_n(ring->act_word, __ATOMIC_RELAXED) & ring->act_bit) == 0) {
            __atomic_fetch_or(ring->act_word, ring->act_bit, __ATOMIC_SEQ_CST);
            __atomic_fetch_or(ring->act_summary, ring->act_sbit, __ATOMIC_SEQ_CST);
        }
        /* pairs with the fence in xfer_shm_act_arm() */
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        if (__atomic_load_n(ring->act_armed, __ATOMIC_RELAXED) != 0) {
            __atomic_store_n(ring->act_armed, 0, __ATOMIC_RELAXED);
            return 1;
        }
    }
    if (__atomic_load_n(armed, __ATOMIC_RELAXED) != 0) {
        __atomic_store_n(armed, 0, __ATOMIC_RELAXED);
        return 1;
    }
    return 0;
}

int xfer_shm_ring_consumed(const xfer_shm_ring_t *ring, uint64_t pos)
{
    uint64_t tail = __atomic_load_n(word64(ring->base, OFF_TAIL), __ATOMIC_ACQUIRE);

    return (tail >= pos) && (tail <= ring->pos);
}

uint64_t xfer_shm_ring_used(const xfer_shm_ring_t *ring)
{
    return ring->pos - (ring->limit - ring->ncells);
}

int xfer_shm_ring_peek(xfer_shm_ring_t *ring, xfer_shm_frame_t *hdr, const uint8_t **payload_p,
                       char *why, size_t why_size)
{
    const uint8_t *c = ring->cur;

    if (!xfer_shm_ring_ready(ring)) {
        return 0;
    }
    memcpy(hdr, c, sizeof(*hdr));       /* checked and used from this copy only */
    if ((hdr->type < XFER_SHM_F_DATA) || (hdr->type >= XFER_SHM_F_TYPE_MAX)) {
        snprintf(why, why_size, "frame %llu has unknown type %u",
                 (unsigned long long)ring->pos, hdr->type);
        return -1;
    }
    if (hdr->flags & XFER_SHM_FL_INLINE) {
        if (!xfer_shm_inline_type(hdr->type) || (hdr->flags & XFER_SHM_FL_RNDV) ||
            (hdr->len > XFER_SHM_INLINE_MAX)) {
            snprintf(why, why_size, "frame %llu (type %u, flags 0x%x) claims %u inline payload "
                     "bytes: only a message or a notification of up to %u may",
                     (unsigned long long)ring->pos, hdr->type, hdr->flags, hdr->len,
                     XFER_SHM_INLINE_MAX);
            return -1;
        }
        /* the words the payload took read as zero, as in any frame that leaves them unset */
        hdr->b = hdr->c = hdr->d = hdr->e = 0;
        *payload_p = c + XFER_SHM_INLINE_OFF;
        return 1;
    }
    if (hdr->len > xfer_shm_cell_payload(ring)) {
        snprintf(why, why_size, "frame %llu (type %u) claims %u payload bytes in a cell that "
                 "holds %zu", (unsigned long long)ring->pos, hdr->type, hdr->len,
                 xfer_shm_cell_payload(ring));
        return -1;
    }
    *payload_p = c + XFER_SHM_FRAME_HDR;
    return 1;
}

void xfer_shm_ring_consume(xfer_shm_ring_t *ring)
{
    ring_advance(ring);
    __atomic_store_n(word64(ring->base, OFF_TAIL), ring->pos, __ATOMIC_RELEASE);
}

int xfer_shm_ring_arm(xfer_shm_ring_t *ring)
{
    __atomic_store_n(word32(ring->base, OFF_ARMED), 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    return !xfer_shm_ring_ready(ring);
}

void xfer_shm_ring_watch(xfer_shm_ring_t *ring)
{
    __atomic_store_n(word32(ring->base, OFF_WATCHED), 1, __ATOMIC_RELAXED);
}

int xfer_shm_ring_unwatch(xfer_shm_ring_t *ring)
{
    __atomic_store_n(word32(ring->base, OFF_WATCHED), 0, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (xfer_shm_ring_ready(ring)) {
        xfer_shm_ring_watch(ring);
        return 0;
    }
    return 1;
}

xfer_status_t xfer_shm_ring_act_attach(xfer_shm_ring_t *ring, void *base, uint32_t idx,
                                       char *why, size_t why_size)
{
    uint8_t *b = base;
    uint32_t magic, version;

    memcpy(&magic, b, 4);
    memcpy(&version, b + 4, 4);
    if ((magic != XFER_SHM_ACT_MAGIC) || (version != XFER_SHM_ACT_VERSION)) {
        snprintf(why, why_size, "the peer's activity map is not one of version %u (magic "
                 "0x%08x, version %u)", XFER_SHM_ACT_VERSION, magic, version);
        return XFER_ERR_PROTOCOL;
    }
    if (idx >= XFER_SHM_ACT_MAX) {
        snprintf(why, why_size, "bit %u of the peer's activity map, which has %u", idx,
                 XFER_SHM_ACT_MAX);
        return XFER_ERR_PROTOCOL;
    }
    ring->act_word    = word64(b, XFER_SHM_ACT_BITS + (size_t)(idx / 64) * 8);
    ring->act_summary = word64(b, XFER_SHM_ACT_SUMMARY);
    ring->act_armed   = word32(b, XFER_SHM_ACT_ARMED);
    ring->act_bit     = 1ull << (idx % 64);
    ring->act_sbit    = 1ull << (idx / 64);
    return XFER_OK;
}

int xfer_shm_ring_wait_room(xfer_shm_ring_t *ring)
{
    xfer_status_t status;
    char why[128];      /* unused: the next claim reports an impossible tail */

    __atomic_store_n(word32(ring->base, OFF_PWAIT), 1, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    /* an impossible tail is found by the next claim: do not sleep on it */
    return (xfer_shm_ring_claim(ring, &status, why, sizeof(why)) == NULL) &&
           (status == XFER_OK);
}

int xfer_shm_ring_room_notify(xfer_shm_ring_t *ring)
{
    uint32_t *pwait = word32(ring->base, OFF_PWAIT);

    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    if (__atomic_load_n(pwait, __ATOMIC_RELAXED) != 0) {
        __atomic_store_n(pwait, 0, __ATOMIC_RELAXED);
        return 1;
    }
    return 0;
}

/* ---- the slots of shared puts ---------------------------------------------------------------- */

#define COOP_CLAIM(gen, front, back) (((uint64_t)(gen) << 32) | ((uint64_t)(front) << 16) | (back))
#define COOP_FAILED (1u << 31)

static uint64_t *coop_word(uint8_t *base, unsigned slot, int done)
{
    return word64(base, XFER_SHM_SEG_COOP + (size_t)slot * 16 + (done ? 8 : 0));
}

void xfer_shm_coop_open(uint8_t *base, unsigned slot, uint32_t gen, uint32_t nparts)
{
    /* done first: a target that sees the new claim word counts from zero */
    __atomic_store_n(coop_word(base, slot, 1), (uint64_t)gen << 32, __ATOMIC_RELAXED);
    __atomic_store_n(coop_word(base, slot, 0), COOP_CLAIM(gen, 0, nparts), __ATOMIC_RELEASE);
}

int xfer_shm_coop_take(uint8_t *base, unsigned slot, uint32_t gen, uint32_t nparts, int back)
{
    uint64_t *claim = coop_word(base, slot, 0);
    uint64_t w      = __atomic_load_n(claim, __ATOMIC_ACQUIRE);

    for (;;) {
        uint32_t f = (uint32_t)(w >> 16) & 0xffffu;
        uint32_t b = (uint32_t)w & 0xffffu;
        uint64_t next;

        if (((uint32_t)(w >> 32) != gen) || (f >= b) || (b > nparts)) {
            return -1;
        }
        next = back ? COOP_CLAIM(gen, f, b - 1) : COOP_CLAIM(gen, f + 1, b);
        if (__atomic_compare_exchange_n(claim, &w, next, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
            return back ? (int)(b - 1) : (int)f;
        }
    }
}

int xfer_shm_coop_theirs(uint8_t *base, unsigned slot, uint32_t gen, uint32_t nparts)
{
    uint64_t w = __atomic_load_n(coop_word(base, slot, 0), __ATOMIC_ACQUIRE);
    uint32_t f = (uint32_t)(w >> 16) & 0xffffu;
    uint32_t b = (uint32_t)w & 0xffffu;

    if (((uint32_t)(w >> 32) != gen) || (f != b) || (b > nparts)) {
        return -1;
    }
    return (int)(nparts - b);
}

uint32_t xfer_shm_coop_done_add(uint8_t *base, unsigned slot, int failed)
{
    uint64_t *done = coop_word(base, slot, 1);

    /* release: the part's bytes are written before the other side counts them; acquire: the
     * side that counts the last but one part sees every other part's bytes */
    if (failed) {
        __atomic_fetch_or(done, COOP_FAILED, __ATOMIC_RELEASE);
    }
    return ((uint32_t)__atomic_add_fetch(done, 1, __ATOMIC_ACQ_REL)) & ~COOP_FAILED;
}

int64_t xfer_shm_coop_done(uint8_t *base, unsigned slot, uint32_t gen, int *failed)
{
    uint64_t w = __atomic_load_n(coop_word(base, slot, 1), __ATOMIC_ACQUIRE);

    if ((uint32_t)(w >> 32) != gen) {
        return -1;
    }
    *failed = ((uint32_t)w & COOP_FAILED) != 0;
    return (int64_t)((uint32_t)w & ~COOP_FAILED);
}
