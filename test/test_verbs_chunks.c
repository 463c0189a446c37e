/*
 * RDMA transfers split into chunks (XFER_VERBS_RDMA_CHUNK), between two real processes over
 * verbs: with 4 KiB chunks, tensors, puts, gets and rendezvous tag messages of a chunk less a
 * byte, a chunk, a chunk and a byte, several chunks and a byte more, and a tensor of a
 * thousand chunks and one byte - each checked byte for byte, with nothing written past its
 * end. A tensor write's immediate rides on its last chunk and the consumer's completion
 * reports only that chunk: the consumer must know the producer's chunk size (its endpoint
 * address), which is why the two sides also chunk differently here, both ways round.
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
