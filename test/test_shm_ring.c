/*
 * The shm component's segment and ring (components/shm/shm_ring.c) on their own, compiled
 * in, in a memfd mapped twice (shm_ring_util.h). Geometry bounds; attach refusing a foreign,
 * mismatched or truncated segment without touching it; frames in order through wrap-around;
 * a full ring; a cell taken only once its stamp is the one of its position, also across the
 * stamp's wrap at 2^32 - 1; the producer catching an impossible tail and the consumer a bad
 * header (inline payloads included), with a reason; the header checked and used from one
 * copy, also while the peer rewrites it.
 */
#include "shm_ring_util.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

TestSuite(shm_ring, .timeout = 120);

/* ---- geometry --------------------------------------------------------------------------- */

Test(shm_ring, geometry_bounds)
{
    static const struct {
        uint64_t ncells, cell_size;
        int      ok;
    } cases[] = {
        {4, 256, 1}, {65536, 1u << 20, 1}, {5, 320, 1}, {4, 1024, 1}, {4096, 4096, 1},
        {0, 256, 0}, {3, 256, 0}, {65537, 256, 0}, {(1ull << 32) + 4, 256, 0},
        {UINT64_MAX, 256, 0},
        {4, 0, 0}, {4, 64, 0}, {4, 192, 0}, {4, 255, 0}, {4, 257, 0}, {4, 300, 0},
        {4, 1000, 0}, {4, (1u << 20) + 64, 0}, {4, (1ull << 32) + 256, 0},
        {4, UINT64_MAX - 63, 0},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        xfer_status_t st;

        why[0] = '\0';
        st = xfer_shm_geometry_check(cases[i].ncells, cases[i].cell_size, why, sizeof(why));
        if (cases[i].ok) {
            cr_assert_eq(st, XFER_OK, "%llu x %llu: %s", (unsigned long long)cases[i].ncells,
                         (unsigned long long)cases[i].cell_size, why);
        } else {
            cr_assert_eq(st, XFER_ERR_INVALID_PARAM, "%llu cells of %llu bytes accepted",
                         (unsigned long long)cases[i].ncells,
                         (unsigned long long)cases[i].cell_size);
            cr_assert_neq(why[0], '\0', "refused without a reason");
        }
    }
    cr_assert_eq(xfer_shm_seg_len(4, 256), 512 + 4 * 256);
    cr_assert_eq(xfer_shm_seg_len(XFER_SHM_CELLS_MAX, XFER_SHM_CELL_MAX),
                 512 + (1ull << 36), "the largest segment overflows");
    cr_assert_eq(sizeof(xfer_shm_frame_t), XFER_SHM_FRAME_HDR, "the header fills its 64 bytes");
}

/* ---- attach ------------------------------------------------------------------------------ */

/* Attach to base; on failure the reason must contain expect and ring must be untouched. */
static void attach_refused(void *base, size_t seg_len, uint64_t token, const char *expect)
{
    xfer_shm_ring_t ring, before;
    xfer_status_t st;

    memset(&ring, 0x5a, sizeof(ring));
    before = ring;
    why[0] = '\0';
    st = xfer_shm_seg_attach(&ring, base, seg_len, token, why, sizeof(why));
    cr_assert_eq(st, XFER_ERR_PROTOCOL, "attach (%zu bytes) gave %d, expected a refusal for "
                 "'%s'", seg_len, st, expect);
    cr_assert(strstr(why, expect) != NULL, "why: '%s', expected '%s'", why, expect);
    cr_assert_eq(memcmp(&ring, &before, sizeof(ring)), 0, "a refused attach set the ring");
}

Test(shm_ring, attach_checks_the_control_block)
{
    const size_t len = xfer_shm_seg_len(NCELLS, CELL);
    xfer_shm_ring_t owner, ring;
    uint8_t *good, *bad, *guard;
    long page = sysconf(_SC_PAGESIZE);

    good = calloc(1, len);
    bad  = malloc(len);
    cr_assert(good && bad);
    xfer_shm_seg_init(&owner, good, NCELLS, CELL, TOKEN);
    cr_assert_eq(rd32(good, OFF_MAGIC), XFER_SHM_SEG_MAGIC);
    cr_assert_eq(rd32(good, OFF_VERSION), XFER_SHM_SEG_VERSION);
    cr_assert_eq(rd32(good, OFF_NCELLS), NCELLS);
    cr_assert_eq(rd32(good, OFF_CELLSIZE), CELL);
    cr_assert_eq(rd64(good, OFF_TOKEN), TOKEN);
    cr_assert_eq(owner.seg_len, len);

    /* a good one, also in a larger mapping */
    for (size_t extra = 0; extra <= 4096; extra += 4096) {
        memset(&ring, 0, sizeof(ring));
        cr_assert_eq(xfer_shm_seg_attach(&ring, good, len + extra, TOKEN, why, sizeof(why)),
                     XFER_OK, "%s", why);
        cr_assert_eq(ring.base, good);
        cr_assert_eq(ring.seg_len, len + extra);
        cr_assert_eq(ring.ncells, NCELLS);
        cr_assert_eq(ring.cell_size, CELL);
        cr_assert_eq(ring.pos, 0);
        cr_assert_eq(xfer_shm_ring_used(&ring), 0);
    }

    memcpy(bad, good, len);
    wr32(bad, OFF_MAGIC, XFER_SHM_SEG_MAGIC ^ 0x100);
    attach_refused(bad, len, TOKEN, "magic 0x58534c31");
    memcpy(bad, good, len);
    wr32(bad, OFF_VERSION, XFER_SHM_SEG_VERSION + 1);
    {
        char expect[32];

        snprintf(expect, sizeof(expect), "version %u", XFER_SHM_SEG_VERSION + 1);
        attach_refused(bad, len, TOKEN, expect);
    }
    memcpy(bad, good, len);
    wr32(bad, OFF_VERSION, 0);
    attach_refused(bad, len, TOKEN, "version 0");
    attach_refused(good, len, TOKEN + 1, "token");
    attach_refused(good, len, 0, "token");

    /* geometry that is invalid, or valid but larger than the mapping */
    memcpy(bad, good, len);
    wr32(bad, OFF_NCELLS, 3);
    attach_refused(bad, len, TOKEN, "3 cells");
    memcpy(bad, good, len);
    wr32(bad, OFF_NCELLS, 0);
    attach_refused(bad, len, TOKEN, "0 cells");
    memcpy(bad, good, len);
    wr32(bad, OFF_CELLSIZE, 300);
    attach_refused(bad, len, TOKEN, "300 bytes");
    memcpy(bad, good, len);
    wr32(bad, OFF_CELLSIZE, 0);
    attach_refused(bad, len, TOKEN, "0 bytes");
    memcpy(bad, good, len);
    wr32(bad, OFF_NCELLS, NCELLS + 1);
    attach_refused(bad, len, TOKEN, "does not fit");
    memcpy(bad, good, len);
    wr32(bad, OFF_CELLSIZE, CELL + 64);
    attach_refused(bad, len, TOKEN, "does not fit");
    memcpy(bad, good, len);
    wr32(bad, OFF_NCELLS, XFER_SHM_CELLS_MAX);
    wr32(bad, OFF_CELLSIZE, XFER_SHM_CELL_MAX);
    attach_refused(bad, len, TOKEN, "does not fit");
    attach_refused(good, len - 1, TOKEN, "does not fit");
    attach_refused(good, XFER_SHM_SEG_CTRL, TOKEN, "does not fit");

    /* shorter than the control block: refused before a byte is read (these would fault) */
    guard = mmap(NULL, (size_t)page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(guard, MAP_FAILED);
    attach_refused(guard, XFER_SHM_SEG_CTRL - 1, TOKEN, "less than its control block");
    attach_refused(guard, 1, TOKEN, "less than its control block");
    attach_refused(NULL, 0, TOKEN, "less than its control block");
    munmap(guard, (size_t)page);
    free(bad);
    free(good);
}

/* ---- the ring ---------------------------------------------------------------------------- */

Test(shm_ring, frames_in_order_through_wraparound)
{
    const uint64_t total = NCELLS * 25 + 3;
    uint64_t sent = 0, got = 0;
    seg_t s;

    seg_open(&s, NCELLS, CELL);
    assert_empty(&s);
    while (got < total) {
        /* batches of 1 to NCELLS frames, so that the wrap falls everywhere in a batch */
        uint64_t batch = 1 + (sent * 7 / 3) % NCELLS;

        for (uint64_t k = 0; (k < batch) && (sent < total); k++, sent++) {
            produce(&s, sent, (uint32_t)((sent * 37) % (PAYLOAD + 1)));
            cr_assert_eq(stamp_of(cell_at(s.own, CELL, sent, NCELLS)), sent + 1,
                         "the stamp the owner sees on frame %llu", (unsigned long long)sent);
        }
        cr_assert_eq(xfer_shm_ring_used(&s.out) <= NCELLS, 1);
        while (got < sent) {
            /* peek is repeatable: the same frame until it is consumed */
            const uint8_t *p1 = NULL, *p2 = NULL;
            xfer_shm_frame_t h1, h2;

            cr_assert_eq(xfer_shm_ring_peek(&s.in, &h1, &p1, why, sizeof(why)), 1, "%s", why);
            cr_assert_eq(xfer_shm_ring_peek(&s.in, &h2, &p2, why, sizeof(why)), 1, "%s", why);
            cr_assert(p1 == p2 && h1.id == got && h2.id == got, "a second peek moved on");
            consume(&s, got, (uint32_t)((got * 37) % (PAYLOAD + 1)));
            got++;
        }
        assert_empty(&s);
    }
    cr_assert_eq(rd64(s.own, OFF_TAIL), total);
    seg_close(&s);
}

Test(shm_ring, full_ring_claims_nothing)
{
    xfer_status_t st = XFER_ERR_NO_MEMORY;
    seg_t s;

    seg_open(&s, NCELLS, CELL);
    for (uint64_t i = 0; i < NCELLS; i++) {
        produce(&s, i, PAYLOAD);    /* whole cells: a write past one would show below */
    }
    cr_assert_eq(xfer_shm_ring_used(&s.out), NCELLS);
    for (int again = 0; again < 3; again++) {
        cr_assert_null(xfer_shm_ring_claim(&s.out, &st, why, sizeof(why)), "a full ring");
        cr_assert_eq(st, XFER_OK, "a full ring is not an error: %s", why);
    }
    cr_assert_eq(s.out.pos, NCELLS, "a refused claim moved the producer");
    cr_assert_eq(stamp_of(cell_at(s.own, CELL, 0, NCELLS)), 1, "a refused claim restamped");
    cr_assert_eq(xfer_shm_ring_used(&s.out), NCELLS);

    /* one consumed: the producer gets the first cell again, and the others are intact */
    consume(&s, 0, PAYLOAD);
    produce(&s, NCELLS, PAYLOAD);
    cr_assert_null(xfer_shm_ring_claim(&s.out, &st, why, sizeof(why)), "full again");
    cr_assert_eq(st, XFER_OK);
    for (uint64_t i = 1; i <= NCELLS; i++) {
        consume(&s, i, PAYLOAD);
    }
    assert_empty(&s);
    cr_assert_not_null(xfer_shm_ring_claim(&s.out, &st, why, sizeof(why)), "room again");
    cr_assert_eq(st, XFER_OK);
    seg_close(&s);
}

Test(shm_ring, producer_refuses_an_impossible_tail)
{
    static const struct {
        uint64_t   tail;
        int        error;   /* else: a full ring, or room (then last) */
        const char *expect;
    } cases[] = {
        {9, 1, "9 cells consumed of 8 published"},          /* tail > head */
        {UINT64_MAX, 1, "18446744073709551615 cells consumed of 8"},
        {3, 1, "3 cells consumed of 8 published"},          /* head - tail = 5 > 4 */
        {0, 1, "0 cells consumed of 8 published"},
        {4, 0, NULL},                                       /* head - tail = 4: full */
        {5, 0, NULL},                                       /* room for one */
    };
    xfer_status_t st;
    seg_t s;

    seg_open(&s, NCELLS, CELL);
    /* 8 published, 4 consumed, the producer's view of the tail at 4: its next claim reads */
    for (uint64_t i = 0; i < NCELLS; i++) {
        produce(&s, i, 1);
    }
    for (uint64_t i = 0; i < NCELLS; i++) {
        consume(&s, i, 1);
    }
    for (uint64_t i = NCELLS; i < 2 * NCELLS; i++) {
        produce(&s, i, 1);
    }
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint8_t *c;

        wr64(s.own, OFF_TAIL, cases[i].tail);
        why[0] = '\0';
        st = XFER_ERR_NO_MEMORY;
        c = xfer_shm_ring_claim(&s.out, &st, why, sizeof(why));
        if (cases[i].error) {
            cr_assert_null(c, "tail %llu: a cell claimed", (unsigned long long)cases[i].tail);
            cr_assert_eq(st, XFER_ERR_PROTOCOL, "tail %llu accepted",
                         (unsigned long long)cases[i].tail);
            cr_assert(strstr(why, cases[i].expect) != NULL, "why: '%s'", why);
        } else if (cases[i].tail == 4) {
            cr_assert_null(c, "a full ring gave a cell");
            cr_assert_eq(st, XFER_OK, "a full ring is no error: %s", why);
        } else {
            cr_assert_eq(c, cell_at(s.peer, CELL, 2 * NCELLS, NCELLS), "tail 5: cell 0");
            cr_assert_eq(st, XFER_OK, "%s", why);
        }
        cr_assert_eq(s.out.pos, 2 * NCELLS, "the producer moved");
    }
    seg_close(&s);
}

Test(shm_ring, stamps_never_zero_nor_a_lap_apart)
{
    /* around 0 and the wrap at 2^32 - 1, for rings of the smallest, odd and largest sizes */
    static const uint64_t at[] = {0, 1, 0xfffffffdull, 0xfffffffeull, 0xffffffffull,
                                  0x100000000ull, 0x1fffffffdull, 0x1fffffffeull,
                                  UINT64_MAX - 4 * XFER_SHM_CELLS_MAX};
    static const uint64_t laps[] = {XFER_SHM_CELLS_MIN, 5, 4096, XFER_SHM_CELLS_MAX - 1,
                                    XFER_SHM_CELLS_MAX};

    for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++) {
        for (uint64_t pos = at[i]; pos < at[i] + 2 * XFER_SHM_CELLS_MAX; pos++) {
            uint32_t st = xfer_shm_stamp(pos);

            if (st == 0) {
                cr_assert_fail("position %llu has stamp 0", (unsigned long long)pos);
            }
            for (size_t l = 0; l < sizeof(laps) / sizeof(laps[0]); l++) {
                if ((pos >= laps[l]) && (st == xfer_shm_stamp(pos - laps[l]))) {
                    cr_assert_fail("position %llu has the stamp of %llu cells before",
                                   (unsigned long long)pos, (unsigned long long)laps[l]);
                }
            }
        }
    }
    cr_assert_eq(xfer_shm_stamp(0), 1);
    cr_assert_eq(xfer_shm_stamp(0xfffffffdull), 0xfffffffeu);
    cr_assert_eq(xfer_shm_stamp(0xfffffffeull), 0xffffffffu);
    cr_assert_eq(xfer_shm_stamp(0xffffffffull), 1, "after 2^32 - 1 the stamps start again");
}

Test(shm_ring, frames_in_order_across_the_stamps_wrap)
{
    uint64_t start = 0xffffffffull - 2 * NCELLS - 1, end = start + 8 * NCELLS + 3;
    seg_t s;

    seg_open(&s, NCELLS, CELL);
    seg_jump(&s, start);
    assert_empty(&s);
    for (uint64_t seq = start; seq < end; seq++) {
        produce(&s, seq, (uint32_t)(seq % (PAYLOAD + 1)));
        cr_assert_eq(stamp_of(cell_at(s.own, CELL, seq, NCELLS)), xfer_shm_stamp(seq));
        consume(&s, seq, (uint32_t)(seq % (PAYLOAD + 1)));
        assert_empty(&s);
    }
    cr_assert_eq(rd64(s.own, OFF_TAIL), end);
    seg_close(&s);
}

Test(shm_ring, consumer_takes_only_a_cell_stamped_for_its_position)
{
    seg_t s;

    seg_open(&s, NCELLS, CELL);
    produce(&s, 0, 5);
    produce(&s, 1, 5);
    consume(&s, 0, 5);
    consume(&s, 1, 5);
    /* valid frames 2..5 in every cell, stamped as the peer likes */
    for (uint64_t i = 2; i < 2 + NCELLS; i++) {
        frame_fill(cell_at(s.peer, CELL, i, NCELLS), i, (uint16_t)frame_type(i), 5);
    }
    {
        /* position 2's cell: the stamp of a lap before or after, zero, garbage */
        const uint32_t wrong[] = {xfer_shm_stamp(2 - 2), xfer_shm_stamp(2 + NCELLS), 0,
                                  xfer_shm_stamp(3), UINT32_MAX, 0x5a5a5a5au};
        uint8_t *c2 = cell_at(s.peer, CELL, 2, NCELLS);

        /* the cells after it stamped right: they wait, in order, behind it */
        for (uint64_t i = 3; i < 2 + NCELLS; i++) {
            wr32(cell_at(s.peer, CELL, i, NCELLS), XFER_SHM_FRAME_SEQ, xfer_shm_stamp(i));
        }
        for (size_t i = 0; i < sizeof(wrong) / sizeof(wrong[0]); i++) {
            wr32(c2, XFER_SHM_FRAME_SEQ, wrong[i]);
            cr_assert_eq(xfer_shm_ring_ready(&s.in), 0, "stamp 0x%x read as ready", wrong[i]);
            assert_empty(&s);
            cr_assert_eq(xfer_shm_ring_arm(&s.in), 1, "stamp 0x%x: may sleep", wrong[i]);
            cr_assert_eq(rd64(s.own, OFF_TAIL), 2, "the tail moved");
        }
        wr32(c2, XFER_SHM_FRAME_SEQ, xfer_shm_stamp(2));
    }
    cr_assert_eq(xfer_shm_ring_ready(&s.in), 1);
    for (uint64_t i = 2; i < 2 + NCELLS; i++) {
        consume(&s, i, 5);
    }
    assert_empty(&s);
    seg_close(&s);
}

Test(shm_ring, consumer_refuses_a_bad_header)
{
    static const struct {
        uint32_t type, len, flags;
        int      ok;
        const char *why;
    } cases[] = {
        {0, 0, 0, 0, "unknown type %u"},
        {XFER_SHM_F_TYPE_MAX, 0, 0, 0, "unknown type %u"},
        {0xffff, 0, 0, 0, "unknown type %u"},
        {XFER_SHM_F_TAG, PAYLOAD + 1, 0, 0, "claims 193 payload bytes in a cell that holds 192"},
        {XFER_SHM_F_TAG, 0x80000000u, 0, 0, "claims 2147483648 payload bytes"},
        {XFER_SHM_F_DATA, UINT32_MAX, 0, 0, "claims 4294967295 payload bytes"},
        {XFER_SHM_F_DATA, 0, 0, 1, NULL},
        {XFER_SHM_F_TYPE_MAX - 1, PAYLOAD, 0, 1, NULL},
        {XFER_SHM_F_TAG, PAYLOAD, 0, 1, NULL},
        /* inline payloads: a message's or a notification's, within the header's 32 bytes */
        {XFER_SHM_F_TAG, 0, XFER_SHM_FL_INLINE, 1, NULL},
        {XFER_SHM_F_TAG, XFER_SHM_INLINE_MAX, XFER_SHM_FL_INLINE, 1, NULL},
        {XFER_SHM_F_NOTIFY, 8, XFER_SHM_FL_INLINE, 1, NULL},
        {XFER_SHM_F_TAG, XFER_SHM_INLINE_MAX + 1, XFER_SHM_FL_INLINE, 0, "claims 33 inline"},
        {XFER_SHM_F_TAG, UINT32_MAX, XFER_SHM_FL_INLINE, 0, "claims 4294967295 inline"},
        {XFER_SHM_F_PUT, 8, XFER_SHM_FL_INLINE, 0, "claims 8 inline"},
        {XFER_SHM_F_DATA, 8, XFER_SHM_FL_INLINE, 0, "claims 8 inline"},
        {XFER_SHM_F_SHARE, 0, XFER_SHM_FL_INLINE, 0, "claims 0 inline"},
        {XFER_SHM_F_TAG, 8, XFER_SHM_FL_INLINE | XFER_SHM_FL_RNDV, 0, "claims 8 inline"},
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const uint8_t *payload = (const uint8_t*)"untouched";
        xfer_status_t st;
        xfer_shm_frame_t h;
        uint8_t *c;
        seg_t s;
        int ret;

        seg_open(&s, NCELLS, CELL);
        c = xfer_shm_ring_claim(&s.out, &st, why, sizeof(why));
        cr_assert_not_null(c);
        frame_fill(c, 0, (uint16_t)cases[i].type, 0);
        memcpy(c, &cases[i].len, sizeof(cases[i].len));    /* len, past the cell or not */
        memcpy(c + 6, &(uint16_t){(uint16_t)cases[i].flags}, 2);
        xfer_shm_ring_publish(&s.out);
        why[0] = '\0';
        ret = xfer_shm_ring_peek(&s.in, &h, &payload, why, sizeof(why));
        if (cases[i].ok) {
            cr_assert_eq(ret, 1, "type %u, len %u refused: %s", cases[i].type, cases[i].len,
                         why);
            cr_assert_eq(h.type, cases[i].type);
            cr_assert_eq(h.len, cases[i].len);
            if (cases[i].flags & XFER_SHM_FL_INLINE) {
                /* in the header's line; the words it took read as zero, not as the peer's
                 * bytes (frame_fill wrote b..e non-zero) */
                cr_assert_eq(payload, s.own + XFER_SHM_SEG_CTRL + XFER_SHM_INLINE_OFF);
                cr_assert(h.b == 0 && h.c == 0 && h.d == 0 && h.e == 0,
                          "an inline frame's b..e read as the payload");
            } else {
                cr_assert_eq(payload, s.own + XFER_SHM_SEG_CTRL + XFER_SHM_FRAME_HDR);
            }
        } else {
            cr_assert_eq(ret, -1, "type %u, len %u accepted", cases[i].type, cases[i].len);
            char expected[96];

            /* the type cases name the refused type, whatever the current maximum is */
            snprintf(expected, sizeof(expected), cases[i].why, cases[i].type);
            cr_assert(strstr(why, expected) != NULL, "why: '%s', expected '%s'", why, expected);
            cr_assert_str_eq((const char*)payload, "untouched", "payload set on a refusal");
            /* and it stays refused: the frame is not skipped */
            cr_assert_eq(xfer_shm_ring_peek(&s.in, &h, &payload, why, sizeof(why)), -1);
        }
        cr_assert_eq(rd64(s.own, OFF_TAIL), 0, "the tail moved");
        seg_close(&s);
    }
}

Test(shm_ring, header_is_copied_once)
{
    const uint8_t *payload = NULL;
    xfer_shm_frame_t h;
    uint8_t *c;
    seg_t s;

    seg_open(&s, NCELLS, CELL);
    produce(&s, 0, 10);
    cr_assert_eq(xfer_shm_ring_peek(&s.in, &h, &payload, why, sizeof(why)), 1, "%s", why);

    /* the peer rewrites the cell after the check: the copy the consumer holds stays */
    c = cell_at(s.peer, CELL, 0, NCELLS);
    memset(c, 0x5a, XFER_SHM_FRAME_HDR);
    wr32(c, XFER_SHM_FRAME_SEQ, xfer_shm_stamp(0));    /* still stamped: still there */
    cr_assert(h.id == 0 && h.len == 10 && h.type == frame_type(0) && h.a == ~0ull &&
              h.e == 0, "the header changed with the cell");
    /* the rewrite reached the consumer's mapping: peeking again sees it, and refuses it */
    cr_assert_eq(xfer_shm_ring_peek(&s.in, &h, &payload, why, sizeof(why)), -1);
    cr_assert(strstr(why, "unknown type 23130") != NULL, "why: '%s'", why);
    frame_fill(c, 0, (uint16_t)frame_type(0), 10);
    wr32(c, XFER_SHM_FRAME_SEQ, xfer_shm_stamp(0));
    consume(&s, 0, 10);
    seg_close(&s);
}

/* The peer flips a frame's first 8 bytes (len, type, flags) between good and bad values. */
typedef struct flipper {
    uint64_t *word;
    uint64_t good, bad;
    int      stop;
} flipper_t;

static void *flip(void *arg)
{
    flipper_t *f = arg;

    /* each value visible (a full barrier) and held for a while, so that the reader sees both
     * often; now and then the bad one across a yield, for valgrind, which runs one thread at
     * a time and lets the other in mostly at system calls */
    for (unsigned k = 0; !__atomic_load_n(&f->stop, __ATOMIC_ACQUIRE); k++) {
        __atomic_store_n(f->word, f->bad, __ATOMIC_SEQ_CST);
        if ((k % 1024) == 0) {
            sched_yield();
        }
        for (int i = 0; (i < 8) && !__atomic_load_n(&f->stop, __ATOMIC_RELAXED); i++) {
        }
        __atomic_store_n(f->word, f->good, __ATOMIC_SEQ_CST);
        for (int i = 0; (i < 8) && !__atomic_load_n(&f->stop, __ATOMIC_RELAXED); i++) {
        }
    }
    return NULL;
}

Test(shm_ring, header_checked_from_its_copy_while_the_peer_rewrites_it)
{
    xfer_shm_frame_t good = {.len = 10, .type = XFER_SHM_F_TAG};
    xfer_shm_frame_t bad  = {.len = UINT32_MAX, .type = 0xffff};
    unsigned long ok = 0, refused = 0;
    struct timespec t0, t;
    flipper_t f;
    pthread_t thread;
    seg_t s;

    seg_open(&s, NCELLS, CELL);
    produce(&s, 0, 10);
    f.word = (uint64_t*)(void*)cell_at(s.peer, CELL, 0, NCELLS);
    memcpy(&f.good, &good, 8);
    memcpy(&f.bad, &bad, 8);
    f.stop = 0;
    cr_assert_eq(pthread_create(&thread, NULL, flip, &f), 0);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    /* for 1 s, and on until both answers were seen (10 s at most) */
    for (unsigned long n = 0; ; n++) {
        const uint8_t *payload = NULL;
        xfer_shm_frame_t h;
        int ret = xfer_shm_ring_peek(&s.in, &h, &payload, why, sizeof(why));

        if (ret == 1) {
            /* whatever the cell holds now, what was returned is what was checked */
            if ((h.len > PAYLOAD) || (h.type < XFER_SHM_F_DATA) ||
                (h.type >= XFER_SHM_F_TYPE_MAX)) {
                __atomic_store_n(&f.stop, 1, __ATOMIC_RELEASE);
                pthread_join(thread, NULL);
                cr_assert_fail("peek returned a header it should have refused: len %u, "
                               "type %u", h.len, h.type);
            }
            ok++;
        } else {
            cr_assert_eq(ret, -1);
            refused++;
        }
        if ((n % 1024) == 0) {
            long ms;

            clock_gettime(CLOCK_MONOTONIC, &t);
            ms = (t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000;
            if (((ms >= 1000) && (ok > 0) && (refused > 0)) || (ms > 10000)) {
                break;
            }
        }
    }
    __atomic_store_n(&f.stop, 1, __ATOMIC_RELEASE);
    pthread_join(thread, NULL);
    cr_log_info("header race: %lu accepted, %lu refused", ok, refused);
    cr_assert(ok > 0 && refused > 0, "the race never happened: %lu accepted, %lu refused", ok,
              refused);
    seg_close(&s);
}

