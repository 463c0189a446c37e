/*
 * The same address, other memory: a buffer is unmapped and mapped again at the same address
 * (munmap then mmap, or mmap MAP_FIXED over it) with other contents between two transfers,
 * and the peer must see the new memory every time. A transport that remembers what it did
 * with a buffer by its address (verbs caches the registrations it makes for buffers the
 * caller did not register) would otherwise move the old pages. Covered: the source of tag
 * sends (eager and rendezvous sizes) and the destination of their receives, the source of a
 * tensor published without XFER_PUBLISH_COPY, the destination of a fetch without a
 * registration, and a large block that malloc hands out again at the address it just freed.
 */
#include "test_peer.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static void setup(void)
{
    tp_env();
}

TestSuite(remap, .init = setup, .timeout = 150);

#define ROUNDS    4
#define EAGER_LEN 3000u             /* an eager message on every transport */
#define RNDV_LEN  (256u << 10)      /* a rendezvous on verbs (SEG_SIZE 8k) */
#define TENSOR_LEN (256u << 10)
#define KEY       "remapped"

/* ---- mappings (both sides) ------------------------------------------------------------------- */

static size_t pages_of(size_t len)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);

    return (len + page - 1) / page * page;
}

/* A fresh private anonymous mapping of len bytes anywhere, or MAP_FAILED. */
static void *map_new(size_t len)
{
    return mmap(NULL, pages_of(len), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
                0);
}

/*
 * Replace the mapping at addr by a new one at the same address: on even rounds munmap() and
 * mmap(MAP_FIXED_NOREPLACE) into the hole, on odd ones mmap(MAP_FIXED) over the old mapping
 * (the kernel unmaps it first). Returns 0, or -1 with why filled.
 */
static int remap(void *addr, size_t len, int round, char *why, size_t why_size)
{
    size_t size = pages_of(len);
    void *p;

    if ((round % 2) == 0) {
        if (munmap(addr, size) != 0) {
            snprintf(why, why_size, "munmap(%p, %zu): %s", addr, size, strerror(errno));
            return -1;
        }
        p = mmap(addr, size, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    } else {
        p = mmap(addr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
                 -1, 0);
    }
    if (p == MAP_FAILED) {
        snprintf(why, why_size, "mmap at %p (%s): %s", addr,
                 ((round % 2) == 0) ? "MAP_FIXED_NOREPLACE, right after munmap" : "MAP_FIXED",
                 strerror(errno));
        return -1;
    }
    if (p != addr) {
        snprintf(why, why_size, "the kernel mapped %p instead of %p (a kernel older than 4.17 "
                 "takes MAP_FIXED_NOREPLACE as a hint)", p, addr);
        munmap(p, size);
        return -1;
    }
    return 0;
}

static void child_remap(void *addr, size_t len, int round)
{
    char why[256];

    TP_CHECK(remap(addr, len, round, why, sizeof(why)) == 0, "%s", why);
}

static void parent_remap(void *addr, size_t len, int round)
{
    char why[256];

    cr_assert_eq(remap(addr, len, round, why, sizeof(why)), 0, "round %d: %s", round, why);
}

static uint64_t child_word(tp_side_t *s)
{
    uint64_t v;

    TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS) == 0, "no word from the parent");
    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
    return v;
}

/* ---- tag messages ---------------------------------------------------------------------------- */

/*
 * The receiver: on each word len (0 ends), then a seed, a message of tag seed and len bytes
 * is received into a buffer at a fixed address - remapped before every receive but the first
 * when arg is non-NULL, else malloc'ed and freed around each receive - and checked against
 * pattern(seed). Answers 1, or the first bad offset + 2.
 */
static int srv_receiver(tp_side_t *s)
{
    char *buf  = NULL;
    size_t cap = 0;
    int round  = 0;

    for (;;) {
        uint64_t len = child_word(s), seed;
        xfer_request_t *req = NULL;
        xfer_status_t st;
        ssize_t bad;
        char *dst;

        if (len == 0) {
            break;
        }
        seed = child_word(s);
        if (s->arg != NULL) {
            if (len > cap) {
                TP_CHECK(buf == NULL, "the receive buffer only grows once");
                buf = map_new(len);
                TP_CHECK(buf != MAP_FAILED, "mmap: %s", strerror(errno));
                cap = len;
            } else {
                child_remap(buf, cap, round);
            }
            dst = buf;
        } else {
            dst = malloc(len);
            TP_CHECK(dst != NULL, "malloc");
        }
        memset(dst, 0, len);
        st = xfer_tag_recv(s->ctx, s->ep, seed, ~0ull, dst, len, NULL, NULL, NULL, &req);
        TP_CHECK(TP_POSTED(st), "tag_recv: %s", xfer_status_string(st));
        TP_CHECK_STATUS(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
        TP_CHECK(xfer_request_length(req) == len, "received %zu bytes of %llu",
                 xfer_request_length(req), (unsigned long long)len);
        xfer_request_release(req);
        bad = tp_check_pattern(dst, len, seed);
        TP_CHECK(tp_ctl_send_u64(s->ctl, (bad < 0) ? 1 : (uint64_t)bad + 2) == 0, "ctl");
        if (s->arg == NULL) {
            free(dst);
        }
        round++;
    }
    if (buf != NULL) {
        munmap(buf, pages_of(cap));
    }
    return 0;
}

/* Send len bytes of pattern(seed) from buf under tag seed; assert the receiver saw them. */
static void send_checked(tp_peer_t *p, void *buf, size_t len, uint64_t seed, const char *what)
{
    xfer_request_t *req = NULL;
    xfer_status_t s;
    uint64_t verdict;

    tp_fill_pattern(buf, len, seed);
    tp_send(p, len);
    tp_send(p, seed);
    s = xfer_tag_send(p->ep, seed, buf, len, NULL, NULL, NULL, &req);
    cr_assert(TP_POSTED(s), "%s: tag_send: %s", what, xfer_status_string(s));
    s = xfer_request_wait(req, TP_WAIT_MS);
    cr_assert_eq(s, XFER_OK, "%s: send: %s", what, xfer_status_string(s));
    xfer_request_release(req);
    verdict = tp_recv(p);
    cr_assert_eq(verdict, 1, "%s: the receiver found byte %lld wrong: %s", what,
                 (long long)verdict - 2,
                 "it got memory the sender or the receiver had unmapped");
}

static void tag_remapped(size_t len)
{
    tp_peer_t p;
    char *buf;

    tp_start(&p, srv_receiver, (void *)1);
    buf = map_new(len);
    cr_assert_neq(buf, MAP_FAILED, "mmap: %s", strerror(errno));
    for (int r = 0; r < ROUNDS; r++) {
        char what[96];

        if (r > 0) {
            parent_remap(buf, len, r);
        }
        snprintf(what, sizeof(what), "%zu bytes, round %d of %d (%s)", len, r + 1, ROUNDS,
                 (r == 0) ? "first mapping" : ((r % 2) ? "MAP_FIXED over the old mapping" :
                                                "munmap, then mmap at the same address"));
        send_checked(&p, buf, len, 1000 * len + (uint64_t)r, what);
    }
    tp_send(&p, 0);
    tp_finish(&p);
    munmap(buf, pages_of(len));
}

Test(remap, tag_eager_source_and_destination)
{
    tag_remapped(EAGER_LEN);
}

Test(remap, tag_rendezvous_source_and_destination)
{
    tag_remapped(RNDV_LEN);
}

/*
 * malloc() serves a block over the mmap threshold with a mapping of its own and free() unmaps
 * it, so the next block of that size usually comes back at the same address. The threshold is
 * pinned so that glibc does not raise it after the first free.
 */
Test(remap, tag_rendezvous_malloc_free_same_address)
{
    void *seen[ROUNDS];
    int reused = 0;
    tp_peer_t p;

    if (!tu_malloc_is_checkers()) {    /* a memory checker's malloc has no threshold */
        cr_assert_eq(mallopt(M_MMAP_THRESHOLD, 128 << 10), 1, "mallopt(M_MMAP_THRESHOLD)");
    }
    tp_start(&p, srv_receiver, NULL);
    for (int r = 0; r < ROUNDS; r++) {
        char *buf = malloc(RNDV_LEN);
        char what[96];

        cr_assert_not_null(buf);
        for (int i = 0; i < r; i++) {
            reused += (seen[i] == buf);
        }
        seen[r] = buf;
        snprintf(what, sizeof(what), "malloc'ed block %d of %d at %p", r + 1, ROUNDS,
                 (void *)buf);
        send_checked(&p, buf, RNDV_LEN, 7000 + (uint64_t)r, what);
        free(buf);
    }
    tp_send(&p, 0);
    tp_finish(&p);
    if (!tu_malloc_is_checkers()) {
        cr_expect_gt(reused, 0, "glibc's malloc never handed the freed block's address out "
                     "again: this run did not test what it is for");
    } else {
        cr_log_info("malloc() is a memory checker's here; its address came back %d time(s)",
                    reused);
    }
}

/* ---- tensors --------------------------------------------------------------------------------- */

/*
 * The producer: on each word round + 1 (0 ends), publishes TENSOR_LEN bytes of
 * pattern(7100 + round) as (round + 1, KEY) without XFER_PUBLISH_COPY from a source at a
 * fixed address - remapped before every publish but the first when arg is non-NULL - and
 * answers the publish request's final status.
 */
static int srv_publisher(tp_side_t *s)
{
    char *src = map_new(TENSOR_LEN);

    TP_CHECK(src != MAP_FAILED, "mmap: %s", strerror(errno));
    for (;;) {
        uint64_t w = child_word(s);
        int round  = (int)w - 1;
        xfer_tensor_t t = {XFER_DTYPE_UINT8, 1, {TENSOR_LEN}, TENSOR_LEN, src, 0};
        xfer_request_t *req = NULL;
        xfer_status_t st;

        if (w == 0) {
            break;
        }
        if ((round > 0) && (s->arg != NULL)) {
            child_remap(src, TENSOR_LEN, round);
        }
        tp_fill_pattern(src, TENSOR_LEN, 7100 + (uint64_t)round);
        st = xfer_tensor_publish(s->ctx, (uint64_t)round + 1, KEY, &t, 0, NULL, NULL, &req);
        TP_CHECK(TP_POSTED(st), "publish: %s", xfer_status_string(st));
        st = xfer_request_wait(req, TP_WAIT_MS);
        xfer_request_release(req);
        TP_CHECK(tp_ctl_send_u64(s->ctl, (uint64_t)(int64_t)st) == 0, "ctl");
    }
    munmap(src, pages_of(TENSOR_LEN));
    return 0;
}

/* Fetch round's tensor into dst (no registration) and check it. */
static void fetch_checked(tp_peer_t *p, char *dst, int round, const char *what)
{
    xfer_fetch_params_t fp = {sizeof(fp), dst, TENSOR_LEN, NULL, NULL, NULL};
    xfer_request_t *req = NULL;
    xfer_status_t s;
    ssize_t bad;

    memset(dst, 0, TENSOR_LEN);
    tp_send(p, (uint64_t)round + 1);
    s = xfer_tensor_fetch(p->ep, (uint64_t)round + 1, KEY, &fp, NULL, NULL, &req);
    cr_assert(TP_POSTED(s), "%s: fetch: %s", what, xfer_status_string(s));
    s = xfer_request_wait(req, TP_WAIT_MS);
    cr_assert_eq(s, XFER_OK, "%s: fetch: %s", what, xfer_status_string(s));
    cr_assert_eq(xfer_request_tensor(req)->size, TENSOR_LEN);
    xfer_request_release(req);
    bad = tp_check_pattern(dst, TENSOR_LEN, 7100 + (uint64_t)round);
    cr_assert_eq(bad, -1, "%s: byte %zd of the fetched tensor is wrong: it came from or went "
                 "to memory that had been unmapped", what, bad);
    s = (xfer_status_t)(int64_t)tp_recv(p);
    cr_assert_eq(s, XFER_OK, "%s: the publish completed with %s", what, xfer_status_string(s));
}

static void tensor_remapped(int remap_source)
{
    tp_peer_t p;
    char *dst = map_new(TENSOR_LEN);

    cr_assert_neq(dst, MAP_FAILED, "mmap: %s", strerror(errno));
    tp_start(&p, srv_publisher, remap_source ? (void *)1 : NULL);
    for (int r = 0; r < ROUNDS; r++) {
        char what[96];

        if ((r > 0) && !remap_source) {
            parent_remap(dst, TENSOR_LEN, r);
        }
        snprintf(what, sizeof(what), "%s, round %d of %d", remap_source ?
                 "source remapped" : "destination remapped", r + 1, ROUNDS);
        fetch_checked(&p, dst, r, what);
    }
    tp_send(&p, 0);
    tp_finish(&p);
    munmap(dst, pages_of(TENSOR_LEN));
}

Test(remap, tensor_published_without_copy)
{
    tensor_remapped(1);
}

Test(remap, tensor_fetch_destination)
{
    tensor_remapped(0);
}
