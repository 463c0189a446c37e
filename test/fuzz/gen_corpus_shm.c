/*
 * The shm ring harness's seeds (fuzz_shm_ring.c): segment images made by the real ring, then
 * scripts of operations on them, in the input format fuzz_shm_ring.h describes.
 */
#include "gen_corpus.h"
#include "fuzz_shm_ring.h"

#include <string.h>

static uint8_t shm_img[XFER_SHM_SEG_CTRL + 16 * 512];

/* A segment of ncells x cell_size into shm_img, through the real ring: produced frames
 * published (frame i: a known type, (i * 29) % (payload + 1) bytes), consumed of them
 * consumed. Returns its length. */
static size_t shm_segment(uint32_t ncells, uint32_t cell_size, unsigned produced,
                          unsigned consumed)
{
    const size_t len = xfer_shm_seg_len(ncells, cell_size);
    const size_t payload = cell_size - XFER_SHM_FRAME_HDR;
    xfer_shm_ring_t owner, peer;
    const uint8_t *data;
    xfer_shm_frame_t h;
    xfer_status_t st;
    char why[256];
    unsigned p = 0, k = 0;

    if (len > sizeof(shm_img)) {
        gc_fail("shm segment too large");
    }
    memset(shm_img, 0, sizeof(shm_img));
    xfer_shm_seg_init(&owner, shm_img, ncells, cell_size, SHM_FUZZ_TOKEN);
    if (xfer_shm_seg_attach(&peer, shm_img, len, SHM_FUZZ_TOKEN, why, sizeof(why)) != XFER_OK) {
        gc_fail(why);
    }
    while ((p < produced) || (k < consumed)) {
        uint8_t *c = (p < produced) ? xfer_shm_ring_claim(&peer, &st, why, sizeof(why)) : NULL;

        if (c != NULL) {
            memset(&h, 0, sizeof(h));
            h.type = (uint16_t)(XFER_SHM_F_DATA + p % (XFER_SHM_F_TYPE_MAX - XFER_SHM_F_DATA));
            h.len  = (uint32_t)((p * 29u) % (payload + 1));
            h.id   = p;
            h.a    = 0x1000u + p;
            memcpy(c, &h, sizeof(h));
            memset(c + XFER_SHM_FRAME_HDR, 'a' + (int)(p % 26), h.len);
            xfer_shm_ring_publish(&peer);
            p++;
        } else if ((k < consumed) &&
                   (xfer_shm_ring_peek(&owner, &h, &data, why, sizeof(why)) == 1)) {
            xfer_shm_ring_consume(&owner);
            k++;
        } else {
            gc_fail("shm ring: neither room nor a frame");
        }
    }
    return len;
}

static void shm_word32(size_t off, uint32_t v)
{
    memcpy(shm_img + off, &v, sizeof(v));
}

static void shm_word64(size_t off, uint64_t v)
{
    memcpy(shm_img + off, &v, sizeof(v));
}

/* The input's header, then the image of len bytes from shm_img. */
static void shm_input(unsigned flags, uint8_t ncells_sel, uint8_t cell_sel, int8_t seg,
                      size_t len)
{
    uint8_t h[SHM_FUZZ_HDR_LEN] = {(uint8_t)flags, ncells_sel, cell_sel, (uint8_t)seg,
                                   (uint8_t)(len & 0xff), (uint8_t)(len >> 8)};

    gc_add(h, sizeof(h));
    gc_add(shm_img, len);
}

static void shm_op(unsigned op)
{
    uint8_t b = (uint8_t)op;

    gc_add(&b, 1);
}

static void shm_op8(unsigned op, uint8_t v)
{
    shm_op(op);
    gc_add(&v, 1);
}

static void shm_op16(unsigned op, uint16_t v)
{
    uint8_t b[2] = {(uint8_t)(v & 0xff), (uint8_t)(v >> 8)};

    shm_op(op);
    gc_add(b, 2);
}

static void shm_op64(unsigned op, uint64_t v)
{
    shm_op(op);
    for (unsigned i = 0; i < 8; i++) {
        uint8_t b = (uint8_t)(v >> (8 * i));

        gc_add(&b, 1);
    }
}

/* 8 bytes of an operand, after an op written with its first operands */
static void shm_op64_raw(uint64_t v)
{
    for (unsigned i = 0; i < 8; i++) {
        uint8_t b = (uint8_t)(v >> (8 * i));

        gc_add(&b, 1);
    }
}

static void shm_ops(unsigned op, unsigned times)
{
    for (unsigned i = 0; i < times; i++) {
        shm_op(op);
    }
}

/* times claims and publishes, of varied lengths */
static void shm_publish(unsigned times)
{
    for (unsigned i = 0; i < times; i++) {
        shm_op16(SHM_OP_CLAIM_PUBLISH, (uint16_t)((i * 37u) % 200u));
    }
}

static void shm_hdr_op(uint8_t cell, uint8_t type, uint16_t len)
{
    uint8_t b[4] = {cell, type, (uint8_t)(len & 0xff), (uint8_t)(len >> 8)};

    shm_op(SHM_OP_HDR);
    gc_add(b, sizeof(b));
}

static void shm_raw_op(uint16_t off, const void *bytes, uint8_t n)
{
    uint8_t b[3] = {(uint8_t)(off & 0xff), (uint8_t)(off >> 8), n};

    shm_op(SHM_OP_RAW);
    gc_add(b, sizeof(b));
    gc_add(bytes, n);
}

void gc_gen_shm_ring(void)
{
    static const uint16_t ffff = 0xffff;
    size_t len;

    /* frames waiting; read, the consumer arms, one more comes; the producer fills the ring */
    len = shm_segment(4, 256, 3, 0);
    shm_input(SHM_FIX_ALL, 0, 0, 0, len);
    shm_op(SHM_OP_PEEK);
    shm_op(SHM_OP_READY);
    shm_ops(SHM_OP_PEEK_CONSUME, 3);
    shm_op(SHM_OP_PEEK);
    shm_op(SHM_OP_ARM);
    shm_op(SHM_OP_READY);
    shm_hdr_op(3, XFER_SHM_F_TAG, 5);
    shm_op8(SHM_OP_STAMP_REL, 0);
    shm_op(SHM_OP_ARM);
    shm_op(SHM_OP_PEEK_CONSUME);
    shm_op8(SHM_OP_ARMED, 1);
    shm_op16(SHM_OP_CLAIM_PUBLISH, 10);
    shm_op16(SHM_OP_CLAIM_PUBLISH, 192);
    shm_op(SHM_OP_USED);
    shm_op16(SHM_OP_CLAIM_PUBLISH, 0);
    shm_op16(SHM_OP_CLAIM_PUBLISH, 1);
    shm_op(SHM_OP_CLAIM);
    shm_op8(SHM_OP_TAIL_REL, 0);
    shm_op16(SHM_OP_CLAIM_PUBLISH, 100);
    shm_op(SHM_OP_USED);
    gc_save("shm_ring", "frames");

    /* three times round the ring on both sides, in a 4-cell and a 7-cell ring */
    for (unsigned big = 0; big < 2; big++) {
        uint32_t ncells = big ? 7 : 4, cell = big ? 384 : 256;

        len = shm_segment(ncells, cell, ncells + 2, 2);
        shm_input(SHM_FIX_ALL, (uint8_t)(ncells - 4), (uint8_t)((cell - 256) / 64), 0, len);
        for (unsigned round = 0; round < 3; round++) {
            for (unsigned i = 0; i < ncells; i++) {
                shm_op8(SHM_OP_STAMP_REL, 0);
                shm_op(SHM_OP_PEEK_CONSUME);
            }
            shm_publish(ncells);
            shm_op8(SHM_OP_TAIL_REL, 0);
        }
        gc_save("shm_ring", big ? "wrapped_7_cells" : "wrapped");
    }

    /* a full ring on both sides; the producer waits for room, the consumer frees some */
    len = shm_segment(4, 256, 4, 0);
    shm_input(SHM_FIX_ALL, 0, 0, 0, len);
    shm_op(SHM_OP_ROOM_NOTIFY);
    shm_op8(SHM_OP_PWAIT, 1);
    shm_op(SHM_OP_PEEK_CONSUME);
    shm_op(SHM_OP_ROOM_NOTIFY);
    shm_ops(SHM_OP_PEEK_CONSUME, 4);
    shm_op(SHM_OP_ROOM_NOTIFY);
    shm_publish(4);
    shm_op(SHM_OP_CLAIM);
    shm_op(SHM_OP_USED);
    shm_op(SHM_OP_WAIT_ROOM);
    shm_op8(SHM_OP_TAIL_REL, (uint8_t)-3);
    shm_op(SHM_OP_WAIT_ROOM);
    shm_publish(1);
    shm_op(SHM_OP_WAIT_ROOM);
    gc_save("shm_ring", "full");

    /* a shared put's slot: both sides take parts until they meet, the target's are counted;
     * a stale generation takes nothing; then the peer rewrites the words */
    len = shm_segment(4, 256, 0, 0);
    shm_input(SHM_FIX_ALL, 0, 0, 0, len);
    shm_op16(SHM_OP_COOP_OPEN, 1 | (7 << 8));          /* slot 1, 8 parts */
    for (unsigned i = 0; i < 5; i++) {
        shm_op16(SHM_OP_COOP_TAKE, 1 | ((i & 1) << 8));
    }
    shm_op16(SHM_OP_COOP_TAKE, 1 | (2 << 8));
    shm_op8(SHM_OP_COOP_CHECK, 1);
    shm_op16(SHM_OP_COOP_TAKE, 1 | (1 << 8));
    shm_op16(SHM_OP_COOP_TAKE, 1);
    shm_op16(SHM_OP_COOP_TAKE, 1);
    shm_op16(SHM_OP_COOP_TAKE, 1 | (1 << 8));
    shm_op8(SHM_OP_COOP_CHECK, 1);
    shm_op16(SHM_OP_COOP_DONE, 1);
    shm_op16(SHM_OP_COOP_DONE, 1 | (1 << 8));
    shm_op8(SHM_OP_COOP_CHECK, 1);
    shm_op16(SHM_OP_COOP_OPEN, 1 | (255 << 8));        /* the same slot anew, 256 parts */
    shm_op16(SHM_OP_COOP_TAKE, 1 | (1 << 8));
    shm_op8(SHM_OP_COOP_CHECK, 1);
    shm_op16(SHM_OP_COOP_WORD, 1);
    shm_op64_raw(((uint64_t)2 << 32) | (0xffffull << 16) | 0xffffu);
    shm_op16(SHM_OP_COOP_TAKE, 1);
    shm_op16(SHM_OP_COOP_TAKE, 1 | (1 << 8));
    shm_op8(SHM_OP_COOP_CHECK, 1);
    shm_op16(SHM_OP_COOP_WORD, 1 | (1 << 8));
    shm_op64_raw(UINT64_MAX);
    shm_op8(SHM_OP_COOP_CHECK, 1);
    gc_save("shm_ring", "coop_slot");

    /* stamps that are not the position's: a lap before and after, zero, the largest, a cell
     * ahead stamped for its own position while the one before is not */
    len = shm_segment(4, 256, 2, 0);
    shm_input(SHM_FIX_ALL, 0, 0, 0, len);
    shm_op8(SHM_OP_STAMP_REL, (uint8_t)-4);
    shm_op(SHM_OP_PEEK);
    shm_op(SHM_OP_READY);
    shm_op8(SHM_OP_STAMP_REL, 4);
    shm_op(SHM_OP_PEEK);
    shm_op(SHM_OP_ARM);
    gc_save("shm_ring", "stamp_a_lap_away");
    len = shm_segment(4, 256, 4, 0);
    shm_input(SHM_FIX_ALL, 0, 0, 0, len);
    shm_ops(SHM_OP_PEEK_CONSUME, 2);
    shm_op64(SHM_OP_STAMP_RAW, 2ull << 32);
    shm_op(SHM_OP_PEEK);
    shm_op64(SHM_OP_STAMP_RAW, (2ull << 32) | UINT32_MAX);
    shm_op(SHM_OP_PEEK);
    shm_op64(SHM_OP_STAMP_RAW, (3ull << 32) | 4);
    shm_op(SHM_OP_PEEK);
    shm_op64(SHM_OP_STAMP_RAW, (2ull << 32) | 3);
    shm_ops(SHM_OP_PEEK_CONSUME, 2);
    gc_save("shm_ring", "stamp_raw");

    /* inline payloads: a message's in its header, then ones no sender writes (too long, of
     * a PUT, of a rendezvous message) */
    len = shm_segment(4, 256, 0, 0);
    shm_input(SHM_FIX_ALL, 0, 0, 0, len);
    shm_hdr_op(0, 0x80 | XFER_SHM_F_TAG, 8);
    shm_op8(SHM_OP_STAMP_REL, 0);
    shm_op(SHM_OP_PEEK_CONSUME);
    shm_hdr_op(1, 0x80 | XFER_SHM_F_NOTIFY, XFER_SHM_INLINE_MAX);
    shm_op8(SHM_OP_STAMP_REL, 0);
    shm_op(SHM_OP_PEEK_CONSUME);
    shm_hdr_op(2, 0x80 | XFER_SHM_F_TAG, XFER_SHM_INLINE_MAX + 1);
    shm_op8(SHM_OP_STAMP_REL, 0);
    shm_op(SHM_OP_PEEK);
    gc_save("shm_ring", "inline");
    shm_input(SHM_FIX_ALL, 0, 0, 0, len);
    shm_hdr_op(0, 0x80 | XFER_SHM_F_PUT, 8);
    shm_op8(SHM_OP_STAMP_REL, 0);
    shm_op(SHM_OP_PEEK);
    gc_save("shm_ring", "inline_put");
    shm_input(SHM_FIX_ALL, 0, 0, 0, len);
    shm_hdr_op(0, 0xc0 | XFER_SHM_F_TAG, 8);
    shm_op8(SHM_OP_STAMP_REL, 0);
    shm_op(SHM_OP_PEEK);
    gc_save("shm_ring", "inline_rndv");

    /* bad headers: type 0 in the image, type 0xffff and a length past the cell by script */
    len = shm_segment(4, 256, 2, 0);
    shm_word32(XFER_SHM_SEG_CTRL + 4, 0);
    shm_input(SHM_FIX_ALL, 0, 0, 0, len);
    shm_op(SHM_OP_PEEK);
    gc_save("shm_ring", "bad_type_zero");
    len = shm_segment(4, 256, 2, 0);
    shm_input(SHM_FIX_ALL, 0, 0, 0, len);
    shm_op(SHM_OP_PEEK_CONSUME);
    shm_raw_op(XFER_SHM_SEG_CTRL + 256 + 4, &ffff, sizeof(ffff));
    shm_op(SHM_OP_PEEK);
    gc_save("shm_ring", "bad_type_ffff");
    shm_input(SHM_FIX_ALL, 0, 0, 0, len);
    shm_hdr_op(0, XFER_SHM_F_TAG, 256 - XFER_SHM_FRAME_HDR + 1);
    shm_op(SHM_OP_PEEK);
    gc_save("shm_ring", "bad_len");
    shm_input(SHM_FIX_ALL, 0, 0, 0, len);
    shm_hdr_op(0, XFER_SHM_F_TYPE_MAX, 0);
    shm_op(SHM_OP_PEEK);
    gc_save("shm_ring", "bad_type_max");
    /* the limits that hold: a frame filling its cell, the last type */
    shm_input(SHM_FIX_ALL, 0, 0, 0, len);
    shm_hdr_op(0, XFER_SHM_F_TAG, 256 - XFER_SHM_FRAME_HDR);
    shm_hdr_op(1, XFER_SHM_F_TYPE_MAX - 1, 0);
    shm_ops(SHM_OP_PEEK_CONSUME, 3);
    gc_save("shm_ring", "whole_cell_last_type");

    /* impossible tails: ahead of head, more than a ring behind */
    len = shm_segment(4, 256, 0, 0);
    shm_input(SHM_FIX_ALL, 0, 0, 0, len);
    shm_publish(4);
    shm_op8(SHM_OP_TAIL_REL, 1);
    shm_op(SHM_OP_WAIT_ROOM);
    shm_publish(1);
    gc_save("shm_ring", "tail_ahead");
    shm_input(SHM_FIX_ALL, 0, 0, 0, len);
    shm_publish(4);
    shm_op8(SHM_OP_TAIL_REL, 0);
    shm_publish(4);
    shm_op64(SHM_OP_TAIL_RAW, 3);
    shm_publish(1);
    gc_save("shm_ring", "tail_behind_ring");

    /* attach: each field wrong, a segment too short for the ring or its control block, and
     * the image's own geometry in a larger segment */
    len = shm_segment(4, 256, 1, 0);
    shm_word32(SHM_OFF_MAGIC, XFER_SHM_SEG_MAGIC + 1);
    shm_input(SHM_FIX_ALL & ~SHM_FIX_MAGIC, 0, 0, 0, len);
    gc_save("shm_ring", "attach_bad_magic");
    len = shm_segment(4, 256, 1, 0);
    shm_word32(SHM_OFF_VERSION, XFER_SHM_SEG_VERSION + 1);
    shm_input(SHM_FIX_ALL & ~SHM_FIX_VERSION, 0, 0, 0, len);
    gc_save("shm_ring", "attach_bad_version");
    len = shm_segment(4, 256, 1, 0);
    shm_word64(SHM_OFF_TOKEN, SHM_FUZZ_TOKEN + 1);
    shm_input(SHM_FIX_ALL & ~SHM_FIX_TOKEN, 0, 0, 0, len);
    gc_save("shm_ring", "attach_bad_token");
    len = shm_segment(4, 256, 1, 0);
    shm_input(SHM_FIX_ALL, 0, 0, -1, len);
    gc_save("shm_ring", "attach_one_byte_short");
    shm_input(SHM_FIX_ALL | SHM_FIX_SHORT, 0, 0, (int8_t)255, len);
    gc_save("shm_ring", "attach_below_control_block");
    shm_input(SHM_FIX_ALL | SHM_FIX_SHORT, 0, 0, 16, len);
    gc_save("shm_ring", "attach_16_bytes");
    len = shm_segment(5, 256, 1, 0);
    shm_input(SHM_FIX_ALL & ~SHM_FIX_GEOMETRY, 0, 0, 0, len);
    gc_save("shm_ring", "attach_geometry_too_large");
    /* geometry that would fit, but is no valid geometry (the segment: 4 cells of 320) */
    len = shm_segment(4, 256, 1, 0);
    shm_word32(SHM_OFF_NCELLS, 3);
    shm_input(SHM_FIX_ALL & ~SHM_FIX_GEOMETRY, 0, 1, 0, len);
    gc_save("shm_ring", "attach_3_cells");
    len = shm_segment(4, 256, 1, 0);
    shm_word32(SHM_OFF_CELLSIZE, 260);
    shm_input(SHM_FIX_ALL & ~SHM_FIX_GEOMETRY, 0, 1, 0, len);
    gc_save("shm_ring", "attach_cell_not_64");
    len = shm_segment(4, 256, 3, 1);
    shm_input(SHM_FIX_ALL & ~SHM_FIX_GEOMETRY, 2, 1, 100, len);
    shm_publish(5);
    shm_op8(SHM_OP_TAIL_REL, (uint8_t)-2);
    shm_publish(3);
    gc_save("shm_ring", "attach_larger_segment");
}
