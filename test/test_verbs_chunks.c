/*
 * RDMA transfers split into chunks (XFER_VERBS_RDMA_CHUNK), between two real processes over
 * verbs: with 4 KiB chunks, tensors, puts, gets and rendezvous tag messages of a chunk less a
 * byte, a chunk, a chunk and a byte, several chunks and a byte more, and a tensor of a
 * thousand chunks and one byte - each checked byte for byte, with nothing written past its
 * end. A tensor write's immediate rides on its last chunk and the consumer's completion
 * reports only that chunk: the consumer must know the producer's chunk size (its endpoint
 * address), which is why the two sides also chunk differently here, both ways round.
 * Batches of descriptors that straddle chunks, through a send queue of 64 entries, take
 * chains of work requests many times longer than it: they land whole, each notification
 * after its data and in posting order, and a batch cancelled before it could post most of
 * them posts no more and notifies nobody; a notification longer than the target takes fails
 * the target's endpoint.
 *
 * The message slots are 1 KiB (XFER_VERBS_SEG_SIZE), so that every tag message here goes by
 * rendezvous (RDMA READ in chunks) rather than eagerly.
 *
 * Runs only over verbs with an RDMA device present, i.e. inside the Soft-RoCE guest:
 *   XFERTEST_TRANSPORT=verbs contrib/rxe_guest -- test/verbs_suites.sh build verbs_chunks
 */
#include "tensor_peer.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK     4096u
#define BIG_CHUNK 65536u
#define GUARD     64u

static void setup(void)
{
    tp_env();
    if (strcmp(tp_transport(), "verbs") != 0) {
        cr_skip_test("verbs suites run over XFERTEST_TRANSPORT=verbs (now '%s') in the "
                     "Soft-RoCE guest: contrib/rxe_guest", tp_transport());
    }
    if (!tu_host_has_rdma()) {
        cr_skip_test("no RDMA device: verbs suites run in the Soft-RoCE guest: "
                     "contrib/rxe_guest");
    }
    setenv("XFER_VERBS_RDMA_CHUNK", "4096", 1);     /* the children inherit both */
    setenv("XFER_VERBS_SEG_SIZE", "1024", 1);
}

TestSuite(verbs_chunks, .init = setup, .timeout = 150);

static const uint64_t sizes[] = {
    CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK - 1, 3 * CHUNK, 3 * CHUNK + 1, 1000 * CHUNK + 1,
};
#define NUM_SIZES (sizeof(sizes) / sizeof(sizes[0]))
#define MAX_SIZE  (1000 * CHUNK + 1)
#define ALL       (~0ull)

static uint64_t seed_of(uint64_t len)
{
    return len * 13 + 5;
}

static uint64_t child_word(tp_side_t *s)
{
    uint64_t v;

    TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS) == 0, "no word from the parent");
    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
    return v;
}

/* buf[0, len) holds pattern(seed) and the GUARD bytes after it are still 0xA5. */
static ssize_t data_check(const char *buf, uint64_t len, uint64_t seed)
{
    ssize_t bad = tp_check_pattern(buf, (size_t)len, seed);

    for (size_t i = 0; (bad < 0) && (i < GUARD); i++) {
        bad = ((uint8_t)buf[len + i] != 0xA5) ? (ssize_t)(len + i) : -1;
    }
    return bad;
}

/* ---- tensors --------------------------------------------------------------------------------- */

typedef struct writes {
    uint64_t count, bytes;
} writes_t;

static writes_t writes_now(xfer_endpoint_t *ep)
{
    xfer_counter_t c[128];
    size_t n = ep_counters(ep, c, 128);
    writes_t w = {counter_of(c, n, "rx_tensor_writes"), counter_of(c, n, "rx_tensor_write_bytes")};

    return w;
}

/* Each size as a uint8 vector, twice: the first fetch of its key learns the metadata (the
 * write follows the re-request), the second is the steady state (the write answers the
 * request). One completion per tensor, whatever its chunks. */
static void tensors_fetch_all(tp_peer_t *p, const char *tag)
{
    for (size_t i = 0; i < NUM_SIZES; i++) {
        int64_t dims[1] = {(int64_t)sizes[i]};
        char key[64];

        snprintf(key, sizeof(key), "%s%llu", tag, (unsigned long long)sizes[i]);
        for (uint64_t round = 0; round < 2; round++) {
            spec_t sp = spec_make(2 * i + round, key, XFER_DTYPE_UINT8, 1, dims,
                                  seed_of(sizes[i]) + round);
            writes_t before = writes_now(p->ep), after;

            publish_ok(p, &sp);
            fetch_expect(p, &sp);
            after = writes_now(p->ep);
            cr_assert_eq(after.count - before.count, 1, "%s: one write completion",
                         key);
            cr_assert_eq(after.bytes - before.bytes, sizes[i], "%s: the write's bytes", key);
        }
    }
}

Test(verbs_chunks, tensors_straddling_chunk_boundaries)
{
    tp_peer_t p;

    tp_start(&p, srv_producer, NULL);
    tensors_fetch_all(&p, "t");
    producer_done(&p);
}

/* The producer chunks by producer_chunk, the consumer (this side) by consumer_chunk: the
 * consumer checks the write's last chunk by the producer's. */
static void chunks_differ(const char *producer_chunk, const char *consumer_chunk)
{
    tp_peer_t p;

    setenv("XFER_VERBS_RDMA_CHUNK", producer_chunk, 1);
    tp_server_spawn(&p, srv_producer, NULL, NULL);
    setenv("XFER_VERBS_RDMA_CHUNK", consumer_chunk, 1);     /* this side only: forked */
    p.ctx = tp_context(0);
    p.ep  = tp_connect(p.ctx, &p);
    tensors_fetch_all(&p, producer_chunk);
    producer_done(&p);
}

Test(verbs_chunks, a_producer_with_smaller_chunks_than_its_consumer)
{
    chunks_differ("4096", "65536");
}

Test(verbs_chunks, a_producer_with_larger_chunks_than_its_consumer)
{
    chunks_differ("65536", "4096");
}

/* ---- put and get ----------------------------------------------------------------------------- */

enum {
    CMD_END,
    CMD_FILL,       /* len, seed: buf[0, len) = pattern(seed), the guard after it 0xA5 */
    CMD_CHECK,      /* len, seed: reply 1, or the first bad offset + 2 */
};

/* Registers MAX_SIZE + GUARD bytes, hands over address and key; then commands. */
static int srv_target(tp_side_t *s)
{
    char *buf = malloc(MAX_SIZE + GUARD);
    xfer_mem_t *mem;
    void *blob;
    size_t len;

    TP_CHECK(buf != NULL, "malloc");
    memset(buf, 0xA5, MAX_SIZE + GUARD);
    TP_CHECK_STATUS(xfer_mem_register(s->ctx, buf, MAX_SIZE + GUARD, XFER_MEM_HOST, &mem),
                    XFER_OK);
    TP_CHECK_STATUS(xfer_rkey_pack(mem, &blob, &len), XFER_OK);
    TP_CHECK(tp_ctl_send_u64(s->ctl, (uintptr_t)buf) == 0, "ctl");
    TP_CHECK(tp_ctl_send(s->ctl, blob, len) == 0, "ctl");
    xfer_rkey_blob_free(blob);
    for (;;) {
        uint64_t cmd = child_word(s), n, seed, reply = 1;
        ssize_t bad;

        if (cmd == CMD_END) {
            break;
        }
        n    = child_word(s);
        seed = child_word(s);
        if (cmd == CMD_FILL) {
            memset(buf, 0xA5, MAX_SIZE + GUARD);
            tp_fill_pattern(buf, (size_t)n, seed);
        } else {
            bad   = data_check(buf, n, seed);
            reply = (bad < 0) ? 1 : (uint64_t)bad + 2;
            memset(buf, 0xA5, MAX_SIZE + GUARD);
        }
        TP_CHECK(tp_ctl_send_u64(s->ctl, reply) == 0, "ctl");
    }
    TP_CHECK_STATUS(xfer_mem_deregister(mem), XFER_OK);
    free(buf);
    return 0;
}

static void target_cmd(tp_peer_t *p, uint64_t cmd, uint64_t len, uint64_t seed)
{
    uint64_t reply;

    tp_send(p, cmd);
    tp_send(p, len);
    tp_send(p, seed);
    reply = tp_recv(p);
    cr_assert_eq(reply, 1, "%llu bytes at the target: byte %llu is wrong",
                 (unsigned long long)len, (unsigned long long)(reply - 2));
}

Test(verbs_chunks, puts_and_gets_straddling_chunk_boundaries)
{
    char *local = malloc(MAX_SIZE + GUARD);
    xfer_rkey_t *rkey;
    xfer_mem_t *mem;
    tp_peer_t p;
    uint64_t base;
    void *blob;
    size_t len;

    cr_assert_not_null(local);
    tp_start(&p, srv_target, NULL);
    base = tp_recv(&p);
    blob = tp_recv_blob(&p, &len);
    cr_assert_eq(xfer_rkey_unpack(p.ep, blob, len, &rkey), XFER_OK);
    free(blob);
    cr_assert_eq(xfer_mem_register(p.ctx, local, MAX_SIZE + GUARD, XFER_MEM_HOST, &mem),
                 XFER_OK);
    for (size_t i = 0; i < NUM_SIZES; i++) {
        uint64_t n = sizes[i];
        xfer_request_t *req = NULL;
        ssize_t bad;

        /* put: ours to the target's, checked there */
        tp_fill_pattern(local, (size_t)n, seed_of(n));
        cr_assert(TP_POSTED(xfer_put(p.ep, local, (size_t)n, mem, base, rkey, NULL, NULL,
                                     &req)));
        cr_assert_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_OK, "put of %llu bytes",
                     (unsigned long long)n);
        cr_assert_eq(xfer_request_length(req), n);
        xfer_request_release(req);
        target_cmd(&p, CMD_CHECK, n, seed_of(n));

        /* get: the target's into ours, checked here */
        target_cmd(&p, CMD_FILL, n, seed_of(n) + 1);
        memset(local, 0xA5, MAX_SIZE + GUARD);
        cr_assert(TP_POSTED(xfer_get(p.ep, local, (size_t)n, mem, base, rkey, NULL, NULL,
                                     &req)));
        cr_assert_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_OK, "get of %llu bytes",
                     (unsigned long long)n);
        cr_assert_eq(xfer_request_length(req), n);
        xfer_request_release(req);
        bad = data_check(local, n, seed_of(n) + 1);
        cr_assert_eq(bad, -1, "get of %llu bytes: byte %zd is wrong", (unsigned long long)n,
                     bad);
    }
    tp_send(&p, CMD_END);
    xfer_rkey_destroy(rkey);
    cr_assert_eq(xfer_mem_deregister(mem), XFER_OK);
    tp_finish(&p);
    free(local);
}

/* ---- rendezvous tag messages ----------------------------------------------------------------- */

/* Sends each size (tag = size) from an unregistered buffer, one at a time, on the parent's
 * word. */
static int srv_sender(tp_side_t *s)
{
    char *buf = malloc(MAX_SIZE);

    TP_CHECK(buf != NULL, "malloc");
    for (size_t i = 0; i < NUM_SIZES; i++) {
        xfer_request_t *req = NULL;

        child_word(s);
        tp_fill_pattern(buf, (size_t)sizes[i], seed_of(sizes[i]));
        TP_CHECK(TP_POSTED(xfer_tag_send(s->ep, sizes[i], buf, (size_t)sizes[i], NULL, NULL,
                                         NULL, &req)), "tag_send");
        TP_CHECK_STATUS(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
        xfer_request_release(req);
    }
    child_word(s);
    free(buf);
    return 0;
}

Test(verbs_chunks, rendezvous_messages_straddling_chunk_boundaries)
{
    char *buf = malloc(MAX_SIZE + GUARD);
    tp_peer_t p;

    cr_assert_not_null(buf);
    tp_start(&p, srv_sender, NULL);
    for (size_t i = 0; i < NUM_SIZES; i++) {
        xfer_request_t *req = NULL;
        ssize_t bad;

        memset(buf, 0xA5, MAX_SIZE + GUARD);
        cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, sizes[i], ALL, buf, MAX_SIZE, NULL,
                                          NULL, NULL, &req)));
        tp_send(&p, 1);
        cr_assert_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_OK, "message of %llu bytes",
                     (unsigned long long)sizes[i]);
        cr_assert_eq(xfer_request_length(req), sizes[i]);
        xfer_request_release(req);
        bad = data_check(buf, sizes[i], seed_of(sizes[i]));
        cr_assert_eq(bad, -1, "message of %llu bytes: byte %zd is wrong",
                     (unsigned long long)sizes[i], bad);
    }
    tp_send(&p, 0);
    tp_finish(&p);
    free(buf);
}

/* ---- batches --------------------------------------------------------------------------------- */

/* A batch of 1216 work requests through a send queue of 64: B_DESCS descriptors, most of them
 * one chunk, every 16th three chunks and a byte (four work requests), every 16th + 1 a byte,
 * every 16th + 2 empty. The local ranges follow one another; the remote ones are scrambled,
 * each followed by B_GAP bytes that no descriptor touches. Round r of the puts goes to the
 * r-th region of the target's buffer. */
#define B_DESCS   1024u
#define B_GAP     64u
#define B_ROUNDS  3u
#define B_SEED    77u
#define B_SQ      "64"

enum {
    BCMD_END,
    BCMD_TAKE,      /* n: take n notifications; reply how many came in order, each a put's
                     * with all its round's data already there (or a get's) */
    BCMD_QUIET,     /* progress 500 ms; reply the notifications queued, then 1 when region
                     * 0's last descriptor is untouched */
    BCMD_STATUS,    /* progress 500 ms; reply the endpoint's status */
};

static uint64_t b_len(unsigned i)
{
    switch (i % 16) {
    case 0:  return 3 * CHUNK + 1;
    case 1:  return 1;
    case 2:  return 0;
    default: return CHUNK;
    }
}

/* Fill d (B_DESCS) for region r; *local_p: the local bytes, returns a region's length. */
static uint64_t b_list(xfer_batch_desc_t *d, unsigned r, uint64_t *local_p)
{
    uint64_t local = 0, remote = 0;

    for (unsigned i = 0; i < B_DESCS; i++) {
        d[i].local_offset = local;
        d[i].length       = b_len(i);
        local            += d[i].length;
    }
    for (unsigned j = 0; j < B_DESCS; j++) {
        unsigned i = (j * 389) % B_DESCS;

        d[i].remote_offset = remote;
        remote            += d[i].length + B_GAP;
    }
    for (unsigned i = 0; i < B_DESCS; i++) {
        d[i].remote_offset += r * remote;
    }
    *local_p = local;
    return remote;
}

/* Region r holds every descriptor's bytes from image, and every gap is still 0xA5. */
static int b_region_ok(const uint8_t *dst, const uint8_t *image, unsigned r)
{
    static xfer_batch_desc_t d[B_DESCS];
    uint64_t local;

    b_list(d, r, &local);
    for (unsigned i = 0; i < B_DESCS; i++) {
        if (memcmp(dst + d[i].remote_offset, image + d[i].local_offset, d[i].length) != 0) {
            return 0;
        }
        for (unsigned g = 0; g < B_GAP; g++) {
            if (dst[d[i].remote_offset + d[i].length + g] != 0xA5) {
                return 0;
            }
        }
    }
    return 1;
}

static int srv_batch_target(tp_side_t *s)
{
    static xfer_batch_desc_t d[B_DESCS];
    uint64_t local, span = b_list(d, 0, &local);
    uint8_t *dst = malloc(B_ROUNDS * span), *image = malloc(local);
    xfer_mem_t *mem;
    void *blob;
    size_t len;

    TP_CHECK((dst != NULL) && (image != NULL), "malloc");
    memset(dst, 0xA5, B_ROUNDS * span);
    tp_fill_pattern(image, local, B_SEED);
    TP_CHECK_STATUS(xfer_mem_register(s->ctx, dst, B_ROUNDS * span, XFER_MEM_HOST, &mem),
                    XFER_OK);
    TP_CHECK_STATUS(xfer_rkey_pack(mem, &blob, &len), XFER_OK);
    TP_CHECK(tp_ctl_send(s->ctl, blob, len) == 0, "ctl");
    xfer_rkey_blob_free(blob);
    for (;;) {
        uint64_t cmd = child_word(s), n, good = 0, seen = 0;
        uint32_t v;

        if (cmd == BCMD_END) {
            break;
        }
        if (cmd == BCMD_STATUS) {
            tp_progress_for(s->ctx, 500);
            TP_CHECK(tp_ctl_send_u64(s->ctl, (uint64_t)(int64_t)xfer_endpoint_status(s->ep))
                     == 0, "ctl");
            continue;
        }
        if (cmd == BCMD_QUIET) {
            tp_progress_for(s->ctx, 500);
            while (xfer_notify_poll(s->ep, &v, sizeof(v), &len) == XFER_OK) {
                seen++;
            }
            TP_CHECK(tp_ctl_send_u64(s->ctl, seen) == 0, "ctl");
            TP_CHECK(tp_ctl_send_u64(s->ctl, dst[d[B_DESCS - 1].remote_offset] == 0xA5) == 0,
                     "ctl");
            continue;
        }
        n = child_word(s);
        for (double end = tp_now_ms() + TP_WAIT_MS; (seen < n) && (tp_now_ms() < end);) {
            xfer_status_t st = xfer_notify_poll(s->ep, &v, sizeof(v), &len);

            if (st == XFER_ERR_NOT_FOUND) {
                continue;
            }
            TP_CHECK_STATUS(st, XFER_OK);
            /* a put's round is checked the moment its notification is here */
            good += (len == sizeof(v)) && (v == seen) &&
                    ((v >= B_ROUNDS) || b_region_ok(dst, image, v));
            seen++;
        }
        TP_CHECK(tp_ctl_send_u64(s->ctl, good) == 0, "ctl");
    }
    TP_CHECK_STATUS(xfer_mem_deregister(mem), XFER_OK);
    free(dst);
    free(image);
    return 0;
}

typedef struct b_init {
    tp_peer_t   p;
    uint8_t     *src;
    uint64_t    local;
    xfer_mem_t  *mem;
    xfer_rkey_t *rkey;
} b_init_t;

/* target_notify_max: the target's XFER_NOTIFY_MAX_LEN, or NULL: as ours. */
static void b_start(b_init_t *in, const char *target_notify_max)
{
    static xfer_batch_desc_t d[B_DESCS];
    void *blob;
    size_t len;

    setenv("XFER_VERBS_TX_QUEUE_LEN", B_SQ, 1);     /* both sides */
    if (target_notify_max != NULL) {
        setenv("XFER_NOTIFY_MAX_LEN", target_notify_max, 1);
    }
    tp_server_spawn(&in->p, srv_batch_target, NULL, NULL);
    unsetenv("XFER_NOTIFY_MAX_LEN");
    in->p.ctx = tp_context(0);
    in->p.ep  = tp_connect(in->p.ctx, &in->p);
    b_list(d, 0, &in->local);
    in->src = malloc(in->local);
    cr_assert_not_null(in->src);
    tp_fill_pattern(in->src, in->local, B_SEED);
    cr_assert_eq(xfer_mem_register(in->p.ctx, in->src, in->local, XFER_MEM_HOST, &in->mem),
                 XFER_OK);
    blob = tp_recv_blob(&in->p, &len);
    cr_assert_eq(xfer_rkey_unpack(in->p.ep, blob, len, &in->rkey), XFER_OK);
    free(blob);
}

static void b_finish(b_init_t *in)
{
    tp_send(&in->p, BCMD_END);
    xfer_rkey_destroy(in->rkey);
    cr_assert_eq(xfer_mem_deregister(in->mem), XFER_OK, "the transport let go of the memory");
    free(in->src);
    tp_finish(&in->p);
    unsetenv("XFER_VERBS_TX_QUEUE_LEN");
}

/* The parent's progress while it waits for the target's word (the target may need it). */
static uint64_t b_recv(b_init_t *in)
{
    for (double end = tp_now_ms() + TP_WAIT_MS; !tp_ctl_ready(in->p.ctl, 0) &&
         (tp_now_ms() < end);) {
        xfer_progress(in->p.ctx);
    }
    return tp_recv(&in->p);
}

/* Three put batches posted at once, then a get batch of the first round's region into another
 * buffer, each with a notification numbered in posting order: each completes whole, the
 * target finds each put's data there when its notification arrives, the get's notification
 * comes after the puts' (it waits for its reads), and the get reads back what the first put
 * wrote. */
Test(verbs_chunks, batches_longer_than_the_send_queue_land_before_their_notifications)
{
    static xfer_batch_desc_t d[B_DESCS];
    xfer_request_t *reqs[B_ROUNDS + 1];
    xfer_batch_t *b[B_ROUNDS + 1];
    xfer_mem_t *back_mem;
    uint8_t *back;
    uint64_t local;
    b_init_t in;

    b_start(&in, NULL);
    back = calloc(1, in.local);
    cr_assert_not_null(back);
    cr_assert_eq(xfer_mem_register(in.p.ctx, back, in.local, XFER_MEM_HOST, &back_mem),
                 XFER_OK);
    for (uint32_t r = 0; r <= B_ROUNDS; r++) {
        int get = (r == B_ROUNDS);

        b_list(d, get ? 0 : r, &local);
        cr_assert_eq(xfer_batch_create(in.p.ep, get ? XFER_BATCH_GET : XFER_BATCH_PUT,
                                       get ? back_mem : in.mem, in.rkey, d, B_DESCS, &b[r]),
                     XFER_OK);
        cr_assert_eq(xfer_batch_post(b[r], &r, sizeof(r), XFER_BATCH_NO_TIMEOUT, NULL, NULL,
                                     &reqs[r]), XFER_OK);
    }
    for (unsigned r = 0; r <= B_ROUNDS; r++) {
        cr_assert_eq(xfer_request_wait(reqs[r], TP_WAIT_MS), XFER_OK, "batch %u", r);
        cr_expect_eq(xfer_request_landed(reqs[r]), B_DESCS);
        cr_expect_eq(xfer_request_length(reqs[r]), local);
        xfer_request_release(reqs[r]);
        cr_assert_eq(xfer_batch_destroy(b[r]), XFER_OK);
    }
    for (uint64_t i = 0; i < local; i++) {
        cr_assert_eq(back[i], in.src[i], "the get read byte %llu wrong",
                     (unsigned long long)i);
    }
    tp_send(&in.p, BCMD_TAKE);
    tp_send(&in.p, B_ROUNDS + 1);
    cr_expect_eq(b_recv(&in), B_ROUNDS + 1, "notifications in posting order, each put's "
                 "after all its data");
    cr_assert_eq(xfer_mem_deregister(back_mem), XFER_OK);
    free(back);
    b_finish(&in);
}

/* Cancelled before any progress, a batch has posted what the send queue took (63 work
 * requests at most): the rest never goes - the target's last descriptor stays untouched -
 * nor does its notification; a flush completes once what went has completed, and the memory
 * can be deregistered. */
Test(verbs_chunks, a_batch_cancelled_at_once_posts_no_more_and_notifies_nobody)
{
    static xfer_batch_desc_t d[B_DESCS];
    xfer_request_t *req = NULL;
    uint32_t seven = 7;
    xfer_batch_t *b;
    uint64_t local;
    b_init_t in;

    b_start(&in, NULL);
    b_list(d, 0, &local);
    cr_assert_eq(xfer_batch_create(in.p.ep, XFER_BATCH_PUT, in.mem, in.rkey, d, B_DESCS, &b),
                 XFER_OK);
    cr_assert_eq(xfer_batch_post(b, &seven, sizeof(seven), XFER_BATCH_NO_TIMEOUT, NULL, NULL,
                                 &req), XFER_OK);
    cr_assert_eq(xfer_request_cancel(req), XFER_OK);
    cr_assert_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_ERR_CANCELED);
    cr_expect_lt(xfer_request_landed(req), B_DESCS);
    xfer_request_release(req);
    cr_assert_eq(xfer_batch_destroy(b), XFER_OK);
    cr_assert_eq(tp_flush(in.p.ep, TP_WAIT_MS), XFER_OK);
    tp_progress_for(in.p.ctx, 50);
    tp_send(&in.p, BCMD_QUIET);
    cr_expect_eq(b_recv(&in), 0, "the cancelled batch's notification arrived");
    cr_expect_eq(tp_recv(&in.p), 1, "a descriptor past what the send queue took was written");
    b_finish(&in);
}

/* A notification that does not fit a message slot (1 KiB here, less the 40-byte header) is
 * refused where it is posted; one longer than the target's XFER_NOTIFY_MAX_LEN (64 there) is a
 * protocol error that fails the target's endpoint, and is not delivered. */
Test(verbs_chunks, a_notification_longer_than_the_target_takes_fails_its_endpoint)
{
    xfer_batch_desc_t d = {0, 0, 4096};
    uint8_t note[1024] = {0};
    xfer_request_t *req = NULL;
    xfer_batch_t *b;
    b_init_t in;

    b_start(&in, "64");
    cr_assert_eq(xfer_batch_create(in.p.ep, XFER_BATCH_PUT, in.mem, in.rkey, &d, 1, &b),
                 XFER_OK);
    cr_expect_eq(xfer_batch_post(b, note, 1024 - 40 + 1, 0, NULL, NULL, &req),
                 XFER_ERR_OUT_OF_RANGE, "a notification longer than a message slot");
    cr_assert_eq(xfer_batch_post(b, note, 100, 0, NULL, NULL, &req), XFER_OK);
    (void)xfer_request_wait(req, TP_WAIT_MS);   /* the target's NIC took it either way */
    xfer_request_release(req);
    cr_assert_eq(xfer_batch_destroy(b), XFER_OK);
    tp_send(&in.p, BCMD_STATUS);
    cr_expect_eq((xfer_status_t)(int64_t)b_recv(&in), XFER_ERR_PROTOCOL);
    b_finish(&in);
}
