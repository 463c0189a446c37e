/*
 * The shm ring suites' segment and frames (shm_ring_util.h).
 */
#include "shm_ring_util.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

char why[256];

uint8_t *map_seg(int fd, size_t len)
{
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);

    cr_assert_neq(p, MAP_FAILED, "mmap: %s", strerror(errno));
    return p;
}

void seg_open(seg_t *s, uint32_t ncells, uint32_t cell_size)
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
void seg_jump(seg_t *s, uint64_t pos)
{
    s->in.pos   = pos;
    s->in.cur   = s->own + XFER_SHM_SEG_CTRL + (size_t)(pos % s->in.ncells) * s->in.cell_size;
    s->out.pos  = pos;
    s->out.limit = pos + s->out.ncells;
    s->out.cur  = s->peer + XFER_SHM_SEG_CTRL + (size_t)(pos % s->out.ncells) * s->out.cell_size;
    __atomic_store_n((uint64_t*)(void*)(s->own + 128), pos, __ATOMIC_RELEASE);
}

void seg_close(seg_t *s)
{
    munmap(s->own, s->len);
    munmap(s->peer, s->len);
    close(s->fd);
}

uint64_t rd64(const uint8_t *base, size_t off)
{
    return __atomic_load_n((const uint64_t*)(const void*)(base + off), __ATOMIC_ACQUIRE);
}

void wr64(uint8_t *base, size_t off, uint64_t v)
{
    __atomic_store_n((uint64_t*)(void*)(base + off), v, __ATOMIC_RELEASE);
}

uint32_t rd32(const uint8_t *base, size_t off)
{
    return __atomic_load_n((const uint32_t*)(const void*)(base + off), __ATOMIC_ACQUIRE);
}

void wr32(uint8_t *base, size_t off, uint32_t v)
{
    __atomic_store_n((uint32_t*)(void*)(base + off), v, __ATOMIC_RELEASE);
}

/* Cell i of a segment, through a given mapping. */
uint8_t *cell_at(uint8_t *base, uint32_t cell_size, uint64_t i, uint32_t ncells)
{
    return base + XFER_SHM_SEG_CTRL + (size_t)(i % ncells) * cell_size;
}

uint8_t pattern(uint64_t seq, size_t j)
{
    return (uint8_t)(seq * 31u + j * 7u + 1u);
}

unsigned frame_type(uint64_t seq)
{
    return XFER_SHM_F_DATA + (unsigned)(seq % (XFER_SHM_F_TYPE_MAX - XFER_SHM_F_DATA));
}

/* The stamp in a cell's header. */
uint32_t stamp_of(const uint8_t *c)
{
    return rd32(c, XFER_SHM_FRAME_SEQ);
}

/* Write frame seq (its type, len, ids and payload pattern) into a cell; its flags vary with
 * seq, all but INLINE (whose frames are tested on their own). */
void frame_fill(uint8_t *c, uint64_t seq, uint16_t type, uint32_t len)
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
int produce(seg_t *s, uint64_t seq, uint32_t len)
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
void consume(seg_t *s, uint64_t seq, uint32_t len)
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

void assert_empty(seg_t *s)
{
    const uint8_t *payload = NULL;
    xfer_shm_frame_t h;

    cr_assert_eq(xfer_shm_ring_peek(&s->in, &h, &payload, why, sizeof(why)), 0,
                 "an empty ring: %s", why);
    cr_assert_null(payload);
}