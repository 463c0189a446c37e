/*
 * The shm component's segment and ring (components/shm/shm_ring.c) on their own, compiled
 * in. A segment lives in a memfd mapped twice: the owner consumes through one mapping, the
 * peer produces through the other, as two processes would; one test forks and streams
 * checksummed frames from a child through many wrap-arounds of a 4-cell ring, each side
 * sleeping on its doorbell when it cannot go on. Geometry bounds; attach refusing a foreign,
 * mismatched or truncated segment without touching it; frames in order through wrap-around;
 * a full ring; a cell taken only once its stamp is the one of its position, also across the
 * stamp's wrap at 2^32 - 1; the producer catching an impossible tail and the consumer a bad
 * header (inline payloads included), with a reason; the header checked and used from one
 * copy, also while the peer
 * rewrites it; both sleep handshakes (the consumer's on an empty ring, the producer's on a
 * full one) ringing once. The slots of shared puts: two sides racing through one claim word
 * take every part exactly once, and a word of another generation, or one a peer made
 * impossible, gives nothing and counts nothing.
 */
#include "../components/shm/shm_ring.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

TestSuite(shm_ring, .timeout = 120);

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

static char why[256];

static uint8_t *map_seg(int fd, size_t len)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

    cr_assert_neq(p, MAP_FAILED, "mmap: %s", strerror(errno));
    return p;
}

static void seg_open(seg_t *s, uint32_t ncells, uint32_t cell_size)
{
    s->len = xfer_shm_seg_len(ncells, cell_size);
    s->fd  = memfd_create("test_shm_ring", MFD_CLOEXEC);
    cr_assert_geq(s->fd, 0, "memfd_create: %s", strerror(errno));
    cr_assert_eq(ftruncate(s->fd, (off_t)s->len), 0, "ftruncate: %s", strerror(errno));
    s->own  = map_seg(s->fd, s->len);
    s->peer = map_seg(s->fd, s->len);
    cr_assert_neq(s->own, s->peer, "two mappings, two addresses");
    xfer_shm_seg_init(&s->in, s->own, ncells, cell_size, TOKEN);
    cr_assert_eq(xfer_shm_seg_attach(&s->out, s->peer, s->len, TOKEN, why, sizeof(why)),
                 XFER_OK, "%s", why);
}

/* Both rings as if pos frames had gone through already (the tail says so too). */
static void seg_jump(seg_t *s, uint64_t pos)
{
    s->in.pos   = pos;
    s->in.cur   = s->own + XFER_SHM_SEG_CTRL + (size_t)(pos % s->in.ncells) * s->in.cell_size;
    s->out.pos  = pos;
    s->out.limit = pos + s->out.ncells;
    s->out.cur  = s->peer + XFER_SHM_SEG_CTRL + (size_t)(pos % s->out.ncells) * s->out.cell_size;
    __atomic_store_n((uint64_t*)(void*)(s->own + 128), pos, __ATOMIC_RELEASE);
}

static void seg_close(seg_t *s)
{
    munmap(s->own, s->len);
    munmap(s->peer, s->len);
    close(s->fd);
}

static uint64_t rd64(const uint8_t *base, size_t off)
{
    return __atomic_load_n((const uint64_t*)(const void*)(base + off), __ATOMIC_ACQUIRE);
}

static void wr64(uint8_t *base, size_t off, uint64_t v)
{
    __atomic_store_n((uint64_t*)(void*)(base + off), v, __ATOMIC_RELEASE);
}

static uint32_t rd32(const uint8_t *base, size_t off)
{
    return __atomic_load_n((const uint32_t*)(const void*)(base + off), __ATOMIC_ACQUIRE);
}

static void wr32(uint8_t *base, size_t off, uint32_t v)
{
    __atomic_store_n((uint32_t*)(void*)(base + off), v, __ATOMIC_RELEASE);
}

/* Cell i of a segment, through a given mapping. */
static uint8_t *cell_at(uint8_t *base, uint32_t cell_size, uint64_t i, uint32_t ncells)
{
    return base + XFER_SHM_SEG_CTRL + (size_t)(i % ncells) * cell_size;
}

static uint8_t pattern(uint64_t seq, size_t j)
{
    return (uint8_t)(seq * 31u + j * 7u + 1u);
}

static unsigned frame_type(uint64_t seq)
{
    return XFER_SHM_F_DATA + (unsigned)(seq % (XFER_SHM_F_TYPE_MAX - XFER_SHM_F_DATA));
}

/* The stamp in a cell's header. */
static uint32_t stamp_of(const uint8_t *c)
{
    return rd32(c, XFER_SHM_FRAME_SEQ);
}

/* Write frame seq (its type, len, ids and payload pattern) into a cell; its flags vary with
 * seq, all but INLINE (whose frames are tested on their own). */
static void frame_fill(uint8_t *c, uint64_t seq, uint16_t type, uint32_t len)
{
    xfer_shm_frame_t h = {.len = len, .type = type,
                          .flags = (uint16_t)(seq & ~(uint64_t)XFER_SHM_FL_INLINE), .status = -3,
                          .id = seq, .a = ~seq, .b = seq * 3, .c = seq * 5, .d = seq * 7,
                          .e = seq * 11};

    memcpy(c, &h, sizeof(h));
    for (size_t j = 0; j < len; j++) {
        c[XFER_SHM_FRAME_HDR + j] = pattern(seq, j);
    }
}

/* The peer claims, fills and publishes frame seq; returns what publish said. */
static int produce(seg_t *s, uint64_t seq, uint32_t len)
{
    xfer_status_t st = XFER_ERR_NO_MEMORY;
    uint8_t *c = xfer_shm_ring_claim(&s->out, &st, why, sizeof(why));

    cr_assert_eq(st, XFER_OK, "claim of frame %llu: %s", (unsigned long long)seq, why);
    cr_assert_not_null(c, "claim of frame %llu: the ring is full", (unsigned long long)seq);
    cr_assert_eq(c, cell_at(s->peer, s->out.cell_size, seq, s->out.ncells),
                 "frame %llu claimed cell %td", (unsigned long long)seq,
                 (c - s->peer - XFER_SHM_SEG_CTRL) / (ptrdiff_t)s->out.cell_size);
    frame_fill(c, seq, (uint16_t)frame_type(seq), len);
    return xfer_shm_ring_publish(&s->out);
}

/* The owner peeks frame seq, checks all of it, and consumes it. */
static void consume(seg_t *s, uint64_t seq, uint32_t len)
{
    const uint8_t *payload = NULL;
    xfer_shm_frame_t h;

    memset(&h, 0, sizeof(h));
    cr_assert_eq(xfer_shm_ring_peek(&s->in, &h, &payload, why, sizeof(why)), 1,
                 "frame %llu: %s", (unsigned long long)seq, why);
    cr_assert_eq(payload, cell_at(s->own, s->in.cell_size, seq, s->in.ncells) +
                 XFER_SHM_FRAME_HDR, "frame %llu's payload is not in its cell",
                 (unsigned long long)seq);
    cr_assert_eq(h.id, seq, "frame %llu came as %llu", (unsigned long long)seq,
                 (unsigned long long)h.id);
    cr_assert_eq(h.len, len);
    cr_assert_eq(h.type, frame_type(seq));
    cr_assert_eq(h.flags, (uint16_t)(seq & ~(uint64_t)XFER_SHM_FL_INLINE));
    cr_assert_eq(h.status, -3);
    cr_assert(h.a == ~seq && h.b == seq * 3 && h.c == seq * 5 && h.d == seq * 7 &&
              h.e == seq * 11, "frame %llu's header fields", (unsigned long long)seq);
    for (size_t j = 0; j < len; j++) {
        if (payload[j] != pattern(seq, j)) {
            cr_assert_fail("frame %llu byte %zu: 0x%02x, not 0x%02x", (unsigned long long)seq,
                           j, payload[j], pattern(seq, j));
        }
    }
    xfer_shm_ring_consume(&s->in);
    cr_assert_eq(rd64(s->peer, OFF_TAIL), seq + 1, "the tail the peer sees");
}

static void assert_empty(seg_t *s)
{
    const uint8_t *payload = NULL;
    xfer_shm_frame_t h;

    cr_assert_eq(xfer_shm_ring_peek(&s->in, &h, &payload, why, sizeof(why)), 0,
                 "an empty ring: %s", why);
    cr_assert_null(payload);
}

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

/* ---- the sleep handshake ----------------------------------------------------------------- */

Test(shm_ring, doorbell_rings_once_for_a_sleeper)
{
    seg_t s;

    seg_open(&s, NCELLS, CELL);
    cr_assert_eq(rd32(s.peer, OFF_ARMED), 0);
    cr_assert_eq(produce(&s, 0, 1), 0, "nobody sleeps: no doorbell");
    consume(&s, 0, 1);

    /* empty: the consumer may sleep, and the next frame, only that one, rings */
    cr_assert_eq(xfer_shm_ring_ready(&s.in), 0);
    cr_assert_eq(xfer_shm_ring_arm(&s.in), 1, "an empty ring");
    cr_assert_eq(rd32(s.peer, OFF_ARMED), 1, "the producer's view of armed");
    cr_assert_eq(produce(&s, 1, 1), 1, "the first frame after arm rings");
    cr_assert_eq(rd32(s.peer, OFF_ARMED), 0);
    cr_assert_eq(produce(&s, 2, 1), 0, "the second does not");
    cr_assert_eq(produce(&s, 3, 1), 0, "nor the third");
    consume(&s, 1, 1);
    consume(&s, 2, 1);
    consume(&s, 3, 1);

    /* drained: armed again, rung again, once */
    cr_assert_eq(xfer_shm_ring_arm(&s.in), 1, "an empty ring");
    cr_assert_eq(produce(&s, 4, 1), 1);
    cr_assert_eq(produce(&s, 5, 1), 0);

    /* frames waiting: do not sleep, whether the consumer peeked at them yet or not */
    cr_assert_eq(xfer_shm_ring_ready(&s.in), 1);
    cr_assert_eq(xfer_shm_ring_arm(&s.in), 0, "frames are waiting");
    consume(&s, 4, 1);
    cr_assert_eq(xfer_shm_ring_arm(&s.in), 0, "a frame is waiting");
    consume(&s, 5, 1);
    seg_close(&s);
}

Test(shm_ring, producer_sleeps_until_room)
{
    xfer_status_t st;
    seg_t s;

    seg_open(&s, NCELLS, CELL);
    cr_assert_eq(xfer_shm_ring_room_notify(&s.in), 0, "nobody waits");
    for (uint64_t i = 0; i < NCELLS; i++) {
        produce(&s, i, 1);
    }

    /* full: the producer may sleep, and the consumer's next cell freed, only that one, rings */
    cr_assert_eq(xfer_shm_ring_wait_room(&s.out), 1, "a full ring");
    cr_assert_eq(rd32(s.own, OFF_PWAIT), 1, "the consumer's view of pwait");
    cr_assert_eq(rd32(s.own, OFF_ARMED), 0, "pwait is not armed");
    consume(&s, 0, 1);
    cr_assert_eq(xfer_shm_ring_room_notify(&s.in), 1, "the first cell freed rings");
    cr_assert_eq(rd32(s.own, OFF_PWAIT), 0);
    consume(&s, 1, 1);
    cr_assert_eq(xfer_shm_ring_room_notify(&s.in), 0, "the second does not");
    produce(&s, 4, 1);
    produce(&s, 5, 1);

    /* freed between the producer's last claim and its wait, before pwait was set (so that
     * nobody rang): it must see the room rather than sleep */
    consume(&s, 2, 1);
    cr_assert_eq(xfer_shm_ring_room_notify(&s.in), 0, "nobody waited yet");
    cr_assert_eq(xfer_shm_ring_wait_room(&s.out), 0, "a cell was freed: do not sleep");
    produce(&s, 6, 1);
    cr_assert_eq(xfer_shm_ring_wait_room(&s.out), 1, "full again");

    /* an impossible tail: do not sleep on it; the next claim says why */
    wr64(s.own, OFF_TAIL, 8);
    cr_assert_eq(xfer_shm_ring_wait_room(&s.out), 0, "slept on an impossible tail");
    cr_assert_null(xfer_shm_ring_claim(&s.out, &st, why, sizeof(why)));
    cr_assert_eq(st, XFER_ERR_PROTOCOL);
    cr_assert(strstr(why, "8 cells consumed of 7 published") != NULL, "why: '%s'", why);
    seg_close(&s);
}

/* ---- two processes ----------------------------------------------------------------------- */

#define STREAM_FRAMES 20000u

static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static uint32_t stream_len(uint64_t seq)
{
    return (uint32_t)(mix(seq + 1) % (PAYLOAD + 1));
}

static uint8_t stream_byte(uint64_t seq, size_t j)
{
    return (uint8_t)mix((seq << 16) ^ j);
}

/* FNV-1a, carried across frames */
static uint64_t fnv(uint64_t h, const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        h = (h ^ p[i]) * 0x100000001b3ull;
    }
    return h;
}

#define FNV_INIT 0xcbf29ce484222325ull

/* The child: the peer, with its own mapping of the memfd; the exit status says how it went.
 * It rings efd when the consumer sleeps, and sleeps on room_efd when the ring is full. */
static void stream_producer(int fd, size_t len, int efd, int room_efd)
{
    uint64_t total = FNV_INIT;
    xfer_shm_ring_t out;
    uint8_t *base;

    prctl(PR_SET_PDEATHSIG, SIGKILL);
    alarm(100);
    base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if ((base == MAP_FAILED) ||
        (xfer_shm_seg_attach(&out, base, len, TOKEN, why, sizeof(why)) != XFER_OK)) {
        _exit(2);
    }
    for (uint64_t seq = 0; seq <= STREAM_FRAMES; ) {
        xfer_shm_frame_t h = {.id = seq};
        xfer_status_t st;
        uint8_t *c = xfer_shm_ring_claim(&out, &st, why, sizeof(why));

        if (c == NULL) {
            struct pollfd pfd = {.fd = room_efd, .events = POLLIN};
            uint64_t n;

            if (st != XFER_OK) {
                _exit(3);
            }
            if (xfer_shm_ring_wait_room(&out) == 0) {
                continue;
            }
            /* asleep: only the consumer's bell wakes us; a lost wake-up is a timeout */
            if ((poll(&pfd, 1, 20000) != 1) || (read(room_efd, &n, sizeof(n)) != sizeof(n))) {
                _exit(5);
            }
            continue;
        }
        if (seq < STREAM_FRAMES) {
            h.type = (uint16_t)frame_type(seq);
            h.len  = stream_len(seq);
            for (size_t j = 0; j < h.len; j++) {
                c[XFER_SHM_FRAME_HDR + j] = stream_byte(seq, j);
            }
            h.a   = fnv(FNV_INIT, c + XFER_SHM_FRAME_HDR, h.len);
            total = fnv(total, c + XFER_SHM_FRAME_HDR, h.len);
        } else {
            h.type = XFER_SHM_F_TCANCEL;    /* the end, and the checksum of everything */
            h.a    = total;
        }
        memcpy(c, &h, sizeof(h));
        if (xfer_shm_ring_publish(&out)) {
            uint64_t one = 1;

            if (write(efd, &one, sizeof(one)) != sizeof(one)) {
                _exit(4);
            }
        }
        seq++;
    }
    _exit(0);
}

Test(shm_ring, fork_streams_checksummed_frames)
{
    uint64_t total = FNV_INIT, sleeps = 0, room_bells = 0;
    xfer_shm_ring_t in;
    size_t len = xfer_shm_seg_len(NCELLS, CELL);
    uint8_t *base;
    int fd, efd, room_efd, status;
    pid_t pid;

    fd       = memfd_create("test_shm_ring_fork", MFD_CLOEXEC);
    efd      = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    room_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    cr_assert(fd >= 0 && efd >= 0 && room_efd >= 0, "%s", strerror(errno));
    cr_assert_eq(ftruncate(fd, (off_t)len), 0);
    base = map_seg(fd, len);
    xfer_shm_seg_init(&in, base, NCELLS, CELL, TOKEN);
    pid = fork();
    cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        stream_producer(fd, len, efd, room_efd);
    }

    for (uint64_t seq = 0; seq <= STREAM_FRAMES; ) {
        const uint8_t *payload = NULL;
        xfer_shm_frame_t h;
        int ret = xfer_shm_ring_peek(&in, &h, &payload, why, sizeof(why));

        if (ret == 0) {
            struct pollfd pfd = {.fd = efd, .events = POLLIN};
            uint64_t n;

            if (xfer_shm_ring_arm(&in) == 0) {
                continue;
            }
            /* asleep: only the doorbell wakes us; a lost wake-up is a timeout */
            cr_assert_eq(poll(&pfd, 1, 20000), 1, "frame %llu never rang the doorbell",
                         (unsigned long long)seq);
            cr_assert_eq(read(efd, &n, sizeof(n)), (ssize_t)sizeof(n));
            sleeps++;
            continue;
        }
        cr_assert_eq(ret, 1, "frame %llu: %s", (unsigned long long)seq, why);
        cr_assert(payload >= base + XFER_SHM_SEG_CTRL + XFER_SHM_FRAME_HDR &&
                  payload + h.len <= base + len, "frame %llu outside the segment",
                  (unsigned long long)seq);
        if (h.id != seq) {
            cr_assert_fail("frame %llu came as %llu", (unsigned long long)seq,
                           (unsigned long long)h.id);
        }
        if (seq == STREAM_FRAMES) {
            cr_assert_eq(h.type, XFER_SHM_F_TCANCEL);
            cr_assert_eq(h.a, total, "the stream's checksum: 0x%llx here, 0x%llx sent",
                         (unsigned long long)total, (unsigned long long)h.a);
        } else {
            if ((h.len != stream_len(seq)) || (h.type != frame_type(seq)) ||
                (h.a != fnv(FNV_INIT, payload, h.len))) {
                cr_assert_fail("frame %llu: len %u type %u checksum 0x%llx",
                               (unsigned long long)seq, h.len, h.type,
                               (unsigned long long)h.a);
            }
            for (size_t j = 0; j < h.len; j++) {
                if (payload[j] != stream_byte(seq, j)) {
                    cr_assert_fail("frame %llu byte %zu", (unsigned long long)seq, j);
                }
            }
            total = fnv(total, payload, h.len);
        }
        xfer_shm_ring_consume(&in);
        if (xfer_shm_ring_room_notify(&in)) {
            uint64_t one = 1;

            cr_assert_eq(write(room_efd, &one, sizeof(one)), (ssize_t)sizeof(one));
            room_bells++;
        }
        seq++;
    }
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the producer: status 0x%x "
              "(exit 3: an impossible tail, 5: never woken for room)", status);
    cr_assert_eq(rd64(base, OFF_TAIL), STREAM_FRAMES + 1);
    cr_log_info("%u frames, %u wrap-arounds, the consumer slept %llu times, the producer was "
                "woken %llu times", STREAM_FRAMES + 1, (STREAM_FRAMES + 1) / NCELLS,
                (unsigned long long)sleeps, (unsigned long long)room_bells);
    munmap(base, len);
    close(room_efd);
    close(efd);
    close(fd);
}

/* ---- shared puts' slots ----------------------------------------------------------------- */

#define COOP_PARTS   200u
#define COOP_ROUNDS  2000

typedef struct coop_side {
    uint8_t  *base;
    uint32_t gen;
    int      back;
    int      *ready;    /* both sides count in, then start together */
    uint8_t  taken[COOP_PARTS];
    unsigned count;
} coop_side_t;

static void *coop_taker(void *arg)
{
    coop_side_t *c = arg;
    int i;

    __atomic_add_fetch(c->ready, 1, __ATOMIC_ACQ_REL);
    while (__atomic_load_n(c->ready, __ATOMIC_ACQUIRE) < 2) {
        sched_yield();
    }
    while ((i = xfer_shm_coop_take(c->base, 1, c->gen, COOP_PARTS, c->back)) >= 0) {
        c->taken[i]++;
        c->count++;
        for (volatile int spin = 0; spin < 200; spin++) {
            /* a part's copy: the other side takes meanwhile */
        }
        if ((c->count % 8) == 0) {
            sched_yield();  /* valgrind runs one thread at a time: let the other one in */
        }
        if (c->back) {
            xfer_shm_coop_done_add(c->base, 1, 0);
        }
    }
    return NULL;
}

/* Each round opens slot 1 anew and lets a thread per side take parts at once (through two
 * mappings, as two processes would): every part is taken exactly once, the target's parts are
 * the top ones, and the initiator counts exactly those as the target's, all done. */
Test(shm_ring, shared_put_parts_are_taken_once_by_two_racing_sides)
{
    seg_t s;
    unsigned both = 0;

    seg_open(&s, NCELLS, CELL);
    for (uint32_t round = 1; round <= COOP_ROUNDS; round++) {
        int ready = 0;
        coop_side_t in = {.base = s.peer, .gen = round, .back = 0, .ready = &ready};
        coop_side_t tg = {.base = s.own, .gen = round, .back = 1, .ready = &ready};
        pthread_t t;
        int failed = 1, theirs;

        xfer_shm_coop_open(s.peer, 1, round, COOP_PARTS);
        cr_assert_eq(pthread_create(&t, NULL, coop_taker, &tg), 0);
        coop_taker(&in);
        pthread_join(t, NULL);
        for (unsigned i = 0; i < COOP_PARTS; i++) {
            cr_assert_eq(in.taken[i] + tg.taken[i], 1, "round %u: part %u taken %u + %u times",
                         round, i, in.taken[i], tg.taken[i]);
            cr_assert(!tg.taken[i] || (i >= in.count), "round %u: the target took part %u "
                      "below the initiator's %u", round, i, in.count);
        }
        theirs = xfer_shm_coop_theirs(s.peer, 1, round, COOP_PARTS);
        cr_assert_eq(theirs, (int)tg.count, "round %u: the target's parts", round);
        cr_assert_eq(xfer_shm_coop_done(s.peer, 1, round, &failed), (int64_t)tg.count);
        cr_assert_eq(failed, 0);
        both += (in.count > 0) && (tg.count > 0);
    }
    cr_log_info("both sides took parts in %u of %d rounds", both, COOP_ROUNDS);
    cr_assert_gt(both, 0, "the sides never raced: the test tests nothing");
    seg_close(&s);
}

static void coop_word_set(uint8_t *base, unsigned slot, int done, uint64_t v)
{
    memcpy(base + OFF_COOP + slot * 16 + (done ? 8 : 0), &v, 8);
}

/* What a hostile or confused peer leaves in a slot yields no part and no count. */
Test(shm_ring, a_claim_word_of_another_generation_or_impossible_gives_nothing)
{
    static const struct {
        uint64_t word;
        const char *what;
    } bad[] = {
        {(8ull << 32) | (0 << 16) | 10, "another generation"},
        {(7ull << 32) | (6 << 16) | 5, "front past back"},
        {(7ull << 32) | (0 << 16) | 11, "back past the parts"},
        {(7ull << 32) | (0xffffull << 16) | 0xffff, "both at their largest"},
    };
    seg_t s;
    int failed = 0;

    seg_open(&s, NCELLS, CELL);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        coop_word_set(s.own, 2, 0, bad[i].word);
        cr_assert_eq(xfer_shm_coop_take(s.peer, 2, 7, 10, 0), -1, "front, %s", bad[i].what);
        cr_assert_eq(xfer_shm_coop_take(s.own, 2, 7, 10, 1), -1, "back, %s", bad[i].what);
        cr_assert_eq(xfer_shm_coop_theirs(s.peer, 2, 7, 10), -1, "theirs, %s", bad[i].what);
    }
    /* an open slot that is not finished has no count of the target's parts yet */
    xfer_shm_coop_open(s.peer, 2, 7, 10);
    cr_assert_eq(xfer_shm_coop_theirs(s.peer, 2, 7, 10), -1);
    cr_assert_eq(xfer_shm_coop_take(s.peer, 2, 7, 10, 0), 0);
    cr_assert_eq(xfer_shm_coop_take(s.own, 2, 7, 10, 1), 9);
    /* a late frame of the slot's last use takes nothing */
    cr_assert_eq(xfer_shm_coop_take(s.own, 2, 6, 10, 1), -1);
    cr_assert_eq(xfer_shm_coop_done(s.peer, 2, 7, &failed), 0);
    cr_assert_eq(xfer_shm_coop_done_add(s.own, 2, 1), 1, "the count after a part, failed");
    cr_assert_eq(xfer_shm_coop_done(s.peer, 2, 7, &failed), 1);
    cr_assert_eq(failed, 1, "a failed part is reported");
    cr_assert_eq(xfer_shm_coop_done(s.peer, 2, 6, &failed), -1, "another generation's count");
    cr_assert_eq(xfer_shm_coop_done_add(s.peer, 2, 0), 2, "the count after one more part");
    cr_assert_eq(xfer_shm_coop_done(s.peer, 2, 7, &failed), 2);
    cr_assert_eq(failed, 1, "a failed part stays reported");
    /* slots are apart: slot 3 is untouched */
    cr_assert_eq(xfer_shm_coop_take(s.peer, 3, 7, 10, 0), -1);
    seg_close(&s);
}
