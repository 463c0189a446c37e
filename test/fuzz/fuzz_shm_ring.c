/*
 * The shm segment and ring (components/shm/shm_ring.c) against a hostile peer, which may
 * write anything anywhere in shared memory between any two calls. The input
 * (fuzz_shm_ring.h) is a geometry, the image of a segment and a script; three runs read it,
 * each on a segment allocated with exactly its length, so that ASan sees any access past it:
 *
 * - attach: the image as the peer's segment, of seg_len(geometry) + seg bytes (or fewer than
 *   its control block), magic, version, token and geometry put right or left as the image
 *   has them. Attach must succeed exactly when the control block is what shm_ring.h says
 *   and fits the segment, read nothing of a segment shorter than its control block, then
 *   describe it, and else leave the ring untouched.
 * - producer: on that segment when attach took it, else on a valid one holding the image.
 *   The script sets the consumer's tail (hostile), its armed word and raw bytes, claims and
 *   publishes, and waits for room. Every cell claimed lies within the segment, cell-aligned,
 *   and is written whole; an impossible tail is XFER_ERR_PROTOCOL with a reason; publish
 *   rings exactly when armed was set, and stamps the cell; wait_room sleeps only on a ring
 *   that is full (never on an impossible tail).
 * - consumer: our own segment (seg_init) with the image copied over all of it, control block
 *   included, since nothing there may matter to the owner once set up. The script sets
 *   stamps, headers (inline ones too), the producer's pwait word and raw bytes, peeks,
 *   consumes, arms, notifies; then peek and consume until empty or an error, which must come
 *   within 2 * ncells + 1 peeks. A frame is taken only when its cell holds the stamp of the
 *   consumer's position. Every frame returned has its payload, hdr.len bytes of it (all
 *   read), inside its cell (inside its header when inline); its header is the cell's as it
 *   was (the words an inline payload took as zero), of a known type and within the cell; an
 *   impossible header is -1 with a reason.
 *
 * Each answer is also checked against a model of shm_ring.h's contract: the producer re-reads
 * the consumer's tail only when it has used up what it last read, and each keeps its own
 * position.
 */
#include "fuzz.h"
#include "fuzz_shm_ring.h"

typedef struct op {
    unsigned      kind;
    int8_t        d;
    uint8_t       cell;
    uint8_t       type;
    uint16_t      len;
    uint16_t      off;
    uint64_t      v;
    const uint8_t *bytes;
    size_t        n;
} op_t;

typedef struct seg {
    uint8_t  *base;
    size_t   len;
    uint32_t ncells;
    uint32_t cell_size;
} seg_t;

static volatile uint8_t sink;

static int next_op(fuzz_cursor_t *c, op_t *op)
{
    if (c->left == 0) {
        return 0;
    }
    memset(op, 0, sizeof(*op));
    op->kind = (unsigned)(fuzz_take(c, 1) % SHM_OP_COUNT);
    switch (op->kind) {
    case SHM_OP_STAMP_REL:
    case SHM_OP_TAIL_REL:
        op->d = (int8_t)fuzz_take(c, 1);
        break;
    case SHM_OP_STAMP_RAW:
    case SHM_OP_TAIL_RAW:
        op->v = fuzz_take(c, 8);
        break;
    case SHM_OP_HDR:
        op->cell = (uint8_t)fuzz_take(c, 1);
        op->type = (uint8_t)fuzz_take(c, 1);
        op->len  = (uint16_t)fuzz_take(c, 2);
        break;
    case SHM_OP_RAW:
        op->off = (uint16_t)fuzz_take(c, 2);
        op->n   = (size_t)fuzz_take(c, 1);
        if (op->n > c->left) {
            op->n = c->left;
        }
        op->bytes = c->p;
        c->p     += op->n;
        c->left  -= op->n;
        break;
    case SHM_OP_CLAIM_PUBLISH:
        op->len = (uint16_t)fuzz_take(c, 2);
        break;
    case SHM_OP_ARMED:
    case SHM_OP_PWAIT:
        op->v = fuzz_take(c, 1);
        break;
    case SHM_OP_COOP_OPEN:
    case SHM_OP_COOP_TAKE:
    case SHM_OP_COOP_DONE:
        op->cell = (uint8_t)fuzz_take(c, 1);
        op->v    = fuzz_take(c, 1);
        break;
    case SHM_OP_COOP_WORD:
        op->cell = (uint8_t)fuzz_take(c, 1);
        op->type = (uint8_t)fuzz_take(c, 1);
        op->v    = fuzz_take(c, 8);
        break;
    case SHM_OP_COOP_CHECK:
        op->cell = (uint8_t)fuzz_take(c, 1);
        break;
    default:
        break;
    }
    return 1;
}

static uint64_t rd64(const seg_t *s, size_t off)
{
    uint64_t v;

    memcpy(&v, s->base + off, sizeof(v));
    return v;
}

static void wr64(seg_t *s, size_t off, uint64_t v)
{
    memcpy(s->base + off, &v, sizeof(v));
}

static uint32_t rd32(const seg_t *s, size_t off)
{
    uint32_t v;

    memcpy(&v, s->base + off, sizeof(v));
    return v;
}

static void wr32(seg_t *s, size_t off, uint32_t v)
{
    memcpy(s->base + off, &v, sizeof(v));
}

static void write_raw(seg_t *s, const op_t *op)
{
    size_t off = op->off % s->len, n = op->n;

    if (n > s->len - off) {
        n = s->len - off;
    }
    memcpy(s->base + off, op->bytes, n);
}

static uint8_t *cell_of(const seg_t *s, uint64_t pos)
{
    return s->base + XFER_SHM_SEG_CTRL + (size_t)(pos % s->ncells) * s->cell_size;
}

static void check_why(const char *why, size_t why_size, const char *what)
{
    FUZZ_CHECK((why[0] != '\0') && (strnlen(why, why_size) < why_size), "%s without a reason",
               what);
}

/* ---- attach ------------------------------------------------------------------------------ */

/* Attach to a segment of len bytes holding the image; returns it (malloc'd) when taken, and
 * leaves ring as it was when not. */
static uint8_t *run_attach(unsigned flags, uint32_t ncells, uint32_t cell_size, size_t len,
                           const uint8_t *image, size_t image_len, xfer_shm_ring_t *ring)
{
    uint8_t *b = malloc((len > 0) ? len : 1);
    seg_t s = {b, len, ncells, cell_size};
    xfer_shm_ring_t before;
    char why[FUZZ_WHY_LEN];
    int expect_ok = 0;
    xfer_status_t st;

    FUZZ_CHECK(b != NULL, "malloc");
    memset(b, 0, len);
    memcpy(b, image, (image_len < len) ? image_len : len);
    if (len >= XFER_SHM_SEG_CTRL) {
        uint32_t magic, version, n, cs;
        uint64_t token;

        if (flags & SHM_FIX_MAGIC) {
            wr32(&s, SHM_OFF_MAGIC, XFER_SHM_SEG_MAGIC);
        }
        if (flags & SHM_FIX_VERSION) {
            wr32(&s, SHM_OFF_VERSION, XFER_SHM_SEG_VERSION);
        }
        if (flags & SHM_FIX_TOKEN) {
            wr64(&s, SHM_OFF_TOKEN, SHM_FUZZ_TOKEN);
        }
        if (flags & SHM_FIX_GEOMETRY) {
            wr32(&s, SHM_OFF_NCELLS, ncells);
            wr32(&s, SHM_OFF_CELLSIZE, cell_size);
        }
        magic   = rd32(&s, SHM_OFF_MAGIC);
        version = rd32(&s, SHM_OFF_VERSION);
        n       = rd32(&s, SHM_OFF_NCELLS);
        cs      = rd32(&s, SHM_OFF_CELLSIZE);
        token   = rd64(&s, SHM_OFF_TOKEN);
        expect_ok = (magic == XFER_SHM_SEG_MAGIC) && (version == XFER_SHM_SEG_VERSION) &&
                    (token == SHM_FUZZ_TOKEN) && (n >= XFER_SHM_CELLS_MIN) &&
                    (n <= XFER_SHM_CELLS_MAX) && (cs >= XFER_SHM_CELL_MIN) &&
                    (cs <= XFER_SHM_CELL_MAX) && ((cs % 64) == 0) &&
                    (XFER_SHM_SEG_CTRL + (uint64_t)n * cs <= len);
        /* what attach reads must be checked geometry: the same answer here */
        FUZZ_CHECK((xfer_shm_geometry_check(n, cs, why, sizeof(why)) == XFER_OK) ==
                   ((n >= XFER_SHM_CELLS_MIN) && (n <= XFER_SHM_CELLS_MAX) &&
                    (cs >= XFER_SHM_CELL_MIN) && (cs <= XFER_SHM_CELL_MAX) && (cs % 64 == 0)),
                   "geometry %u x %u", n, cs);
    }
    memset(ring, 0xa5, sizeof(*ring));
    memset(&before, 0xa5, sizeof(before));
    why[0] = '\0';
    st = xfer_shm_seg_attach(ring, b, len, SHM_FUZZ_TOKEN, why, sizeof(why));
    FUZZ_CHECK((st == XFER_OK) == expect_ok, "attach to %zu bytes: %d, expected %s (%s)", len,
               st, expect_ok ? "success" : "a refusal", why);
    if (st != XFER_OK) {
        FUZZ_CHECK(st == XFER_ERR_PROTOCOL, "attach failed with %d", st);
        check_why(why, sizeof(why), "attach refused");
        FUZZ_CHECK(memcmp(ring, &before, sizeof(before)) == 0, "a refused attach set the ring");
        free(b);
        return NULL;
    }
    FUZZ_CHECK((ring->base == b) && (ring->seg_len == len) &&
               (ring->ncells == rd32(&s, SHM_OFF_NCELLS)) &&
               (ring->cell_size == rd32(&s, SHM_OFF_CELLSIZE)) &&
               (ring->pos == 0) && (xfer_shm_ring_used(ring) == 0),
               "the attached ring does not describe the segment");
    return b;
}

/* ---- producer ---------------------------------------------------------------------------- */

/* ---- shared puts' slots (on the producer's segment, where they live) ---------------------- */

/* What a slot must hold while nobody but the two sides' calls touched it since it opened. */
typedef struct coop_model {
    int      clean;         /* opened, and not written by the peer or RAW since */
    uint32_t gen, nparts, front, back;
    uint32_t done;
    int      failed;
} coop_model_t;

static void coop_op(seg_t *s, coop_model_t *slots, uint32_t *gen, const op_t *op)
{
    unsigned slot    = op->cell % XFER_SHM_COOP_SLOTS;
    coop_model_t *m  = &slots[slot];
    int failed       = 0;
    int64_t done;
    int ret;

    switch (op->kind) {
    case SHM_OP_COOP_OPEN:
        memset(m, 0, sizeof(*m));
        m->clean  = 1;
        m->gen    = ++*gen;
        m->nparts = 1 + (uint32_t)(op->v % XFER_SHM_COOP_PARTS_MAX);
        m->back   = m->nparts;
        xfer_shm_coop_open(s->base, slot, m->gen, m->nparts);
        break;
    case SHM_OP_COOP_TAKE: {
        int back      = (op->v & 1) != 0;
        uint32_t g    = (op->v & 2) ? m->gen - 1 : m->gen;
        uint32_t n    = (m->nparts != 0) ? m->nparts : 1;

        ret = xfer_shm_coop_take(s->base, slot, g, n, back);
        FUZZ_CHECK((ret == -1) || ((ret >= 0) && ((uint32_t)ret < n)), "part %d of %u", ret, n);
        if (!m->clean || (m->nparts == 0)) {
            break;
        }
        if ((g != m->gen) || (m->front == m->back)) {
            FUZZ_CHECK(ret == -1, "took part %d of a %s slot", ret,
                       (g != m->gen) ? "stale generation's" : "finished");
        } else if (back) {
            FUZZ_CHECK((uint32_t)ret == m->back - 1, "the back took %d, not %u", ret,
                       m->back - 1);
            m->back--;
        } else {
            FUZZ_CHECK((uint32_t)ret == m->front, "the front took %d, not %u", ret, m->front);
            m->front++;
        }
        break;
    }
    case SHM_OP_COOP_WORD:
        wr64(s, SHM_OFF_COOP + slot * 16u + ((op->type & 1) ? 8u : 0u), op->v);
        m->clean = 0;
        break;
    case SHM_OP_COOP_DONE: {
        uint32_t count = xfer_shm_coop_done_add(s->base, slot, (op->v & 1) != 0);

        m->done++;
        m->failed |= (op->v & 1) != 0;
        FUZZ_CHECK(count < (1u << 31), "a count of %u", count);
        if (m->clean && (m->nparts != 0) && (m->done < (1u << 31))) {
            FUZZ_CHECK(count == m->done, "count %u after a part, expected %u", count, m->done);
        }
        break;
    }
    case SHM_OP_COOP_CHECK:
        ret  = xfer_shm_coop_theirs(s->base, slot, m->gen, (m->nparts != 0) ? m->nparts : 1);
        done = xfer_shm_coop_done(s->base, slot, m->gen, &failed);
        FUZZ_CHECK(ret <= (int)XFER_SHM_COOP_PARTS_MAX, "the target took %d parts", ret);
        FUZZ_CHECK(done < (1ll << 31), "%lld parts done", (long long)done);
        if (!m->clean || (m->nparts == 0)) {
            break;
        }
        FUZZ_CHECK(ret == ((m->front == m->back) ? (int)(m->nparts - m->back) : -1),
                   "theirs %d with front %u, back %u of %u", ret, m->front, m->back,
                   m->nparts);
        if (m->done < (1u << 31)) {
            FUZZ_CHECK((done == m->done) && (failed == m->failed), "done %lld (failed %d), "
                       "expected %u (%d)", (long long)done, failed, m->done, m->failed);
        }
        break;
    default:
        break;
    }
}

static void run_producer(seg_t *s, xfer_shm_ring_t *ring, fuzz_cursor_t script)
{
    coop_model_t slots[XFER_SHM_COOP_SLOTS] = {{0}};
    uint32_t gen = 0;
    const size_t payload = s->cell_size - XFER_SHM_FRAME_HDR;
    uint64_t m_pos = 0, m_limit = s->ncells;
    char why[FUZZ_WHY_LEN];
    op_t op;

    while (next_op(&script, &op)) {
        switch (op.kind) {
        case SHM_OP_TAIL_REL:
            wr64(s, SHM_OFF_TAIL, m_pos + (uint64_t)(int64_t)op.d);
            break;
        case SHM_OP_TAIL_RAW:
            wr64(s, SHM_OFF_TAIL, op.v);
            break;
        case SHM_OP_RAW:
            write_raw(s, &op);
            for (unsigned i = 0; i < XFER_SHM_COOP_SLOTS; i++) {
                slots[i].clean = 0;     /* it may have written them */
            }
            break;
        case SHM_OP_ARMED:
            wr32(s, SHM_OFF_ARMED, (uint32_t)op.v);
            break;
        case SHM_OP_COOP_OPEN:
        case SHM_OP_COOP_TAKE:
        case SHM_OP_COOP_WORD:
        case SHM_OP_COOP_DONE:
        case SHM_OP_COOP_CHECK:
            coop_op(s, slots, &gen, &op);
            break;
        case SHM_OP_WAIT_ROOM: {
            int expect = 0, ret;

            if (m_pos == m_limit) {
                uint64_t tail = rd64(s, SHM_OFF_TAIL);

                if ((tail <= m_pos) && (m_pos - tail <= s->ncells)) {
                    m_limit = tail + s->ncells;
                    expect  = (m_pos == m_limit);
                }
            }
            ret = xfer_shm_ring_wait_room(ring);
            FUZZ_CHECK(ret == expect, "wait_room at %llu (tail %llu): %d",
                       (unsigned long long)m_pos,
                       (unsigned long long)rd64(s, SHM_OFF_TAIL), ret);
            FUZZ_CHECK(rd32(s, SHM_OFF_PWAIT) == 1, "pwait %u", rd32(s, SHM_OFF_PWAIT));
            break;
        }
        case SHM_OP_USED:
            FUZZ_CHECK((xfer_shm_ring_used(ring) == m_pos - (m_limit - s->ncells)) &&
                       (xfer_shm_ring_used(ring) <= s->ncells), "%llu used",
                       (unsigned long long)xfer_shm_ring_used(ring));
            break;
        case SHM_OP_CLAIM:
        case SHM_OP_CLAIM_PUBLISH: {
            xfer_status_t st = XFER_ERR_NO_MEMORY;
            uint8_t *want = NULL, *c;
            uint64_t tail = 0;
            int impossible = 0;

            if (m_pos == m_limit) {
                tail = rd64(s, SHM_OFF_TAIL);
                impossible = (tail > m_pos) || (m_pos - tail > s->ncells);
                if (!impossible) {
                    m_limit = tail + s->ncells;
                }
            }
            if (!impossible && (m_pos != m_limit)) {
                want = cell_of(s, m_pos);
            }
            why[0] = '\0';
            c = xfer_shm_ring_claim(ring, &st, why, sizeof(why));
            if (impossible) {
                FUZZ_CHECK((c == NULL) && (st == XFER_ERR_PROTOCOL), "tail %llu at head %llu "
                           "of %u cells taken", (unsigned long long)tail,
                           (unsigned long long)m_pos, s->ncells);
                check_why(why, sizeof(why), "an impossible tail");
                return;     /* the endpoint fails */
            }
            FUZZ_CHECK((st == XFER_OK) && (c == want), "claim at %llu: status %d, cell %p, "
                       "expected %p (%s)", (unsigned long long)m_pos, st, (void*)c,
                       (void*)want, why);
            if (c == NULL) {
                break;
            }
            FUZZ_CHECK((c >= s->base + XFER_SHM_SEG_CTRL) &&
                       ((size_t)(c - s->base) + s->cell_size <= s->len) &&
                       ((size_t)(c - s->base - XFER_SHM_SEG_CTRL) % s->cell_size == 0),
                       "cell at %td of a %zu-byte segment", c - s->base, s->len);
            memset(c, (int)(m_pos & 0xff), s->cell_size);     /* all of it: ASan */
            if (op.kind == SHM_OP_CLAIM_PUBLISH) {
                xfer_shm_frame_t h = {.len = (uint32_t)(op.len % (payload + 1)),
                                      .type = XFER_SHM_F_DATA, .id = m_pos};
                uint32_t armed = rd32(s, SHM_OFF_ARMED);
                int rang;

                memcpy(c, &h, sizeof(h));
                rang = xfer_shm_ring_publish(ring);
                FUZZ_CHECK(rang == (armed != 0), "publish with armed %u: %d", armed, rang);
                FUZZ_CHECK(rd32(s, SHM_OFF_ARMED) == (rang ? 0 : armed), "armed %u after "
                           "publish", rd32(s, SHM_OFF_ARMED));
                FUZZ_CHECK(rd32(s, (size_t)(c - s->base) + XFER_SHM_FRAME_SEQ) ==
                           xfer_shm_stamp(m_pos), "cell %llu's stamp after publish",
                           (unsigned long long)m_pos);
                m_pos++;
            }
            break;
        }
        default:
            break;  /* the consumer's */
        }
        FUZZ_CHECK(ring->pos == m_pos, "producer at %llu, expected %llu",
                   (unsigned long long)ring->pos, (unsigned long long)m_pos);
    }
}

/* ---- consumer ---------------------------------------------------------------------------- */

static uint32_t stamp_at(const seg_t *s, uint64_t pos)
{
    return rd32(s, (size_t)(cell_of(s, pos) - s->base) + XFER_SHM_FRAME_SEQ);
}

/* Peek, check the answer; returns it. */
static int check_peek(seg_t *s, xfer_shm_ring_t *ring, uint64_t m_pos)
{
    const size_t payload_max = s->cell_size - XFER_SHM_FRAME_HDR;
    const uint8_t *payload = NULL, *want_payload;
    xfer_shm_frame_t h, want;
    char why[FUZZ_WHY_LEN];
    int expect, ret, inl;
    uint8_t *c = cell_of(s, m_pos);

    expect = (stamp_at(s, m_pos) == xfer_shm_stamp(m_pos));
    memcpy(&want, c, sizeof(want));
    inl = (want.flags & XFER_SHM_FL_INLINE) != 0;
    if ((expect == 1) && ((want.type < XFER_SHM_F_DATA) || (want.type >= XFER_SHM_F_TYPE_MAX) ||
                          (inl ? (!xfer_shm_inline_type(want.type) ||
                                  (want.flags & XFER_SHM_FL_RNDV) ||
                                  (want.len > XFER_SHM_INLINE_MAX)) :
                                 (want.len > payload_max)))) {
        expect = -1;
    }
    if (inl) {
        want.b = want.c = want.d = want.e = 0;
    }
    want_payload = c + (inl ? XFER_SHM_INLINE_OFF : XFER_SHM_FRAME_HDR);
    why[0] = '\0';
    ret = xfer_shm_ring_peek(ring, &h, &payload, why, sizeof(why));
    FUZZ_CHECK(ret == expect, "peek at %llu (stamp 0x%x): %d, expected %d (%s)",
               (unsigned long long)m_pos, stamp_at(s, m_pos), ret, expect, why);
    if (ret < 0) {
        check_why(why, sizeof(why), "peek refused");
        FUZZ_CHECK(payload == NULL, "a refused frame gave a payload");
    } else if (ret == 0) {
        FUZZ_CHECK(payload == NULL, "an empty ring gave a payload");
    } else {
        FUZZ_CHECK(payload == want_payload, "frame %llu's payload at %td",
                   (unsigned long long)m_pos, payload - s->base);
        FUZZ_CHECK((h.len <= (inl ? XFER_SHM_INLINE_MAX : payload_max)) &&
                   (payload + h.len <= c + (inl ? XFER_SHM_FRAME_HDR : s->cell_size)) &&
                   ((size_t)(payload - s->base) + h.len <= s->len),
                   "payload %td + %u outside its %s", payload - s->base, h.len,
                   inl ? "header" : "cell");
        FUZZ_CHECK((h.type >= XFER_SHM_F_DATA) && (h.type < XFER_SHM_F_TYPE_MAX),
                   "type %u", h.type);
        FUZZ_CHECK(memcmp(&h, &want, sizeof(h)) == 0, "the header is not the cell's");
        for (size_t i = 0; i < h.len; i++) {
            sink ^= payload[i];
        }
    }
    FUZZ_CHECK(ring->pos == m_pos, "consumer at %llu, expected %llu",
               (unsigned long long)ring->pos, (unsigned long long)m_pos);
    return ret;
}

static void run_consumer(seg_t *s, xfer_shm_ring_t *ring, fuzz_cursor_t script)
{
    const size_t payload = s->cell_size - XFER_SHM_FRAME_HDR;
    uint64_t m_pos = 0;
    op_t op;
    int ret;

    while (next_op(&script, &op)) {
        switch (op.kind) {
        case SHM_OP_STAMP_REL:
            wr32(s, (size_t)(cell_of(s, m_pos) - s->base) + XFER_SHM_FRAME_SEQ,
                 xfer_shm_stamp(m_pos + (uint64_t)(int64_t)op.d));
            break;
        case SHM_OP_STAMP_RAW:
            wr32(s, (size_t)(cell_of(s, op.v >> 32) - s->base) + XFER_SHM_FRAME_SEQ,
                 (uint32_t)op.v);
            break;
        case SHM_OP_HDR: {
            uint8_t *c = cell_of(s, op.cell);
            uint32_t len = (uint32_t)(op.len % (payload + 2));
            uint16_t type = (uint16_t)((op.type & 0x3fu) % (XFER_SHM_F_TYPE_MAX + 1));
            uint16_t fl = (uint16_t)(((op.type & 0x80u) ? XFER_SHM_FL_INLINE : 0) |
                                     ((op.type & 0x40u) ? XFER_SHM_FL_RNDV : 0));

            memcpy(c, &len, sizeof(len));
            memcpy(c + 4, &type, sizeof(type));
            memcpy(c + 6, &fl, sizeof(fl));
            break;
        }
        case SHM_OP_RAW:
            write_raw(s, &op);
            break;
        case SHM_OP_PEEK:
        case SHM_OP_PEEK_CONSUME:
            ret = check_peek(s, ring, m_pos);
            if (ret < 0) {
                return;     /* the endpoint fails */
            }
            if ((ret == 1) && (op.kind == SHM_OP_PEEK_CONSUME)) {
                xfer_shm_ring_consume(ring);
                m_pos++;
                FUZZ_CHECK(rd64(s, SHM_OFF_TAIL) == m_pos, "tail %llu after consume %llu",
                           (unsigned long long)rd64(s, SHM_OFF_TAIL),
                           (unsigned long long)m_pos);
            }
            break;
        case SHM_OP_PWAIT:
            wr32(s, SHM_OFF_PWAIT, (uint32_t)op.v);
            break;
        case SHM_OP_ROOM_NOTIFY: {
            uint32_t pwait = rd32(s, SHM_OFF_PWAIT);

            ret = xfer_shm_ring_room_notify(ring);
            FUZZ_CHECK(ret == (pwait != 0), "room_notify with pwait %u: %d", pwait, ret);
            FUZZ_CHECK(rd32(s, SHM_OFF_PWAIT) == (ret ? 0 : pwait), "pwait %u after notify",
                       rd32(s, SHM_OFF_PWAIT));
            break;
        }
        case SHM_OP_ARM:
        case SHM_OP_READY: {
            int ready = (stamp_at(s, m_pos) == xfer_shm_stamp(m_pos));

            if (op.kind == SHM_OP_ARM) {
                ret = xfer_shm_ring_arm(ring);
                FUZZ_CHECK(ret == !ready, "arm: %d with%s frames", ret, ready ? "" : "out");
                FUZZ_CHECK(rd32(s, SHM_OFF_ARMED) == 1, "armed %u", rd32(s, SHM_OFF_ARMED));
            } else {
                FUZZ_CHECK(xfer_shm_ring_ready(ring) == ready, "ready: expected %d", ready);
            }
            break;
        }
        default:
            break;  /* the producer's */
        }
        FUZZ_CHECK(ring->pos == m_pos, "consumer at %llu, expected %llu",
                   (unsigned long long)ring->pos, (unsigned long long)m_pos);
    }
    /* drain: cells stamped for the positions they are met at; nobody stamps them again */
    for (uint32_t i = 0; ; i++) {
        FUZZ_CHECK(i <= 2 * s->ncells, "%u frames from a %u-cell ring nobody writes", i,
                   s->ncells);
        ret = check_peek(s, ring, m_pos);
        if (ret != 1) {
            break;
        }
        xfer_shm_ring_consume(ring);
        m_pos++;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_cursor_t c = {data, size};
    unsigned flags      = (unsigned)fuzz_take(&c, 1);
    uint32_t ncells     = shm_fuzz_ncells((uint8_t)fuzz_take(&c, 1));
    uint32_t cell_size  = shm_fuzz_cell((uint8_t)fuzz_take(&c, 1));
    int8_t   seg        = (int8_t)fuzz_take(&c, 1);
    size_t   image_len  = (size_t)fuzz_take(&c, 2);
    const size_t geom_len = xfer_shm_seg_len(ncells, cell_size);
    const uint8_t *image;
    xfer_shm_ring_t ring;
    char why[FUZZ_WHY_LEN];
    size_t attach_len;
    seg_t s;

    if (image_len > c.left) {
        image_len = c.left;
    }
    image   = c.p;
    c.p    += image_len;
    c.left -= image_len;

    /* attach, then the producer on what it attached to, or on a valid segment */
    attach_len = (flags & SHM_FIX_SHORT) ? (size_t)(uint8_t)seg :
                 (size_t)((int64_t)geom_len + seg);
    s.base = run_attach(flags, ncells, cell_size, attach_len, image, image_len, &ring);
    if (s.base != NULL) {
        s.len       = attach_len;
        s.ncells    = ring.ncells;
        s.cell_size = ring.cell_size;
    } else {
        xfer_shm_ring_t owner;

        s.len       = geom_len;
        s.ncells    = ncells;
        s.cell_size = cell_size;
        s.base      = calloc(1, s.len);
        FUZZ_CHECK(s.base != NULL, "calloc");
        xfer_shm_seg_init(&owner, s.base, ncells, cell_size, SHM_FUZZ_TOKEN);
        if (image_len > SHM_OFF_TOKEN + 8) {    /* the rest of the image: counters, cells */
            memcpy(s.base + SHM_OFF_TOKEN + 8, image + SHM_OFF_TOKEN + 8,
                   ((image_len < s.len) ? image_len : s.len) - (SHM_OFF_TOKEN + 8));
        }
        FUZZ_CHECK(xfer_shm_seg_attach(&ring, s.base, s.len, SHM_FUZZ_TOKEN, why,
                                       sizeof(why)) == XFER_OK, "a valid segment: %s", why);
    }
    run_producer(&s, &ring, c);
    free(s.base);

    /* the consumer: our own segment, then everything in it overwritten by the peer */
    s.len       = geom_len;
    s.ncells    = ncells;
    s.cell_size = cell_size;
    s.base      = malloc(s.len);
    FUZZ_CHECK(s.base != NULL, "malloc");
    xfer_shm_seg_init(&ring, s.base, ncells, cell_size, SHM_FUZZ_TOKEN);
    FUZZ_CHECK((ring.base == s.base) && (ring.seg_len == s.len) && (ring.ncells == ncells) &&
               (ring.cell_size == cell_size) && (ring.pos == 0), "seg_init");
    memset(s.base + XFER_SHM_SEG_CTRL, 0, s.len - XFER_SHM_SEG_CTRL);
    memcpy(s.base, image, (image_len < s.len) ? image_len : s.len);
    run_consumer(&s, &ring, c);
    free(s.base);
    return 0;
}
