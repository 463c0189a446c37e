/*
 * The staging pipeline (framework/staging.c): put and get of memory the transport cannot
 * touch, chunk by chunk through a pool of registered host buffers, between two processes over
 * the real transport.
 *
 * Hosts without a GPU have no device memory to stage, so most tests run the pipeline over
 * host memory with the memcpy copy engine (xfer_staging_test_host). That engine is a test
 * double for the one thing absent here, the GPU's copy engine: the chunking, the slots, the
 * ordering of copies and transfers, the transfers themselves, failures and teardown are the
 * library's own code over real sockets. Its copies land only some polls after they start, so
 * a pipeline that sent a bounce buffer before its copy landed, or completed before its last
 * copy, moves wrong bytes and fails the byte-for-byte checks (guards included).
 *
 * Put and get of CUDA memory (XFER_MEM_CUDA, the CUDA copy engine) run twice: over the GPU's
 * driver where there is one (they skip with the reason elsewhere), and over
 * test/plugins/fake_cuda.c, a stand-in for the driver library and the GPU behind it - the
 * other test double here, for the same absent GPU - whose device memory no CPU access can
 * reach and whose copies land late.
 */
#include "gpu_fixture.h"
#include "test_peer.h"
#include "test_util.h"
#include "staging_test.h"

#include <xfer/component.h>
#include <xfer/info.h>

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CHUNK   4096u
#define RLEN    (1u << 20)          /* the target's registered region */
#define SLACK   (16u << 10)         /* unregistered guard bytes on each side */
#define ALEN    (RLEN + 2 * SLACK)
#define ROFF    4099u               /* where in the target's region transfers go */

static void setup(void)
{
    char chunk[32];

    tp_env();
    snprintf(chunk, sizeof(chunk), "%u", CHUNK);
    setenv("XFER_STAGING_CHUNK", chunk, 1);
    unsetenv("XFER_STAGING_DEPTH");
    unsetenv("XFER_CUDA_LIB");
}

TestSuite(staging, .init = setup, .timeout = 120);

enum {
    CMD_DONE = 1,
    CMD_FILL,       /* seed: fill the whole allocation */
    CMD_CHECK,      /* off, len, seed_in, seed_fill: [off, off+len) of the region holds
                     * pattern(seed_in) at its place, every other byte pattern(seed_fill) */
    CMD_RANGE,      /* off, len, seed: [off, off+len) of the region holds pattern(seed) */
    CMD_RECV,       /* len, tag: receive into the region's start; answers 1 once posted, then
                     * 2 + the length received */
    CMD_SEND,       /* len, tag, seed: the region's start filled with pattern(seed), sent;
                     * answers 1 once posted (the send completes while waiting for more) */
    CMD_PUBLISH,    /* step, len, seed: the region's start filled and published as "t";
                     * answers 1 */
};

/* ---- the target ------------------------------------------------------------------------------ */

static uint64_t ctl_u64(tp_side_t *s)
{
    uint64_t v;

    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
    return v;
}

static int srv_target(tp_side_t *s)
{
    char *alloc = malloc(ALEN), *expect = malloc(ALEN), *base;
    xfer_request_t *sending = NULL;     /* CMD_SEND's */
    xfer_mem_t *mem;
    void *blob;
    size_t len;

    TP_CHECK(alloc && expect, "malloc");
    base = alloc + SLACK;
    tp_fill_pattern(alloc, ALEN, 1);
    TP_CHECK_STATUS(xfer_mem_register(s->ctx, base, RLEN, XFER_MEM_HOST, &mem), XFER_OK);
    TP_CHECK_STATUS(xfer_rkey_pack(mem, &blob, &len), XFER_OK);
    TP_CHECK(tp_ctl_send_u64(s->ctl, (uintptr_t)base) == 0, "ctl");
    TP_CHECK(tp_ctl_send(s->ctl, blob, len) == 0, "ctl");
    xfer_rkey_blob_free(blob);
    for (;;) {
        uint64_t cmd, off, n, seed_in, seed_fill;
        ssize_t bad = -1;

        TP_CHECK(tp_progress_until_ctl(s, 60000) == 0, "no command from the parent");
        cmd = ctl_u64(s);
        if (sending != NULL) {
            /* the parent has the message: the send completes (or has) */
            TP_CHECK_STATUS(xfer_request_wait(sending, TP_WAIT_MS), XFER_OK);
            xfer_request_release(sending);
            sending = NULL;
        }
        if (cmd == CMD_DONE) {
            break;
        }
        if (cmd == CMD_FILL) {
            tp_fill_pattern(alloc, ALEN, ctl_u64(s));
            TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
            continue;
        }
        if (cmd == CMD_RECV) {
            xfer_request_t *req = NULL;

            n   = ctl_u64(s);
            off = ctl_u64(s);     /* the tag */
            TP_CHECK(TP_POSTED(xfer_tag_recv(s->ctx, s->ep, off, UINT64_MAX, base, n, mem,
                                             NULL, NULL, &req)), "tag recv");
            TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
            TP_CHECK_STATUS(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
            TP_CHECK(tp_ctl_send_u64(s->ctl, 2 + xfer_request_length(req)) == 0, "ctl");
            xfer_request_release(req);
            continue;
        }
        if (cmd == CMD_SEND || cmd == CMD_PUBLISH) {
            xfer_tensor_t tensor = {XFER_DTYPE_UINT8, 1, {0}, 0, base, 0};
            uint64_t a = ctl_u64(s);

            n = ctl_u64(s);
            tp_fill_pattern(base, n, ctl_u64(s));
            if (cmd == CMD_SEND) {
                TP_CHECK(TP_POSTED(xfer_tag_send(s->ep, a, base, n, mem, NULL, NULL,
                                                 &sending)), "tag send");
            } else {
                tensor.dims[0] = (int64_t)n;
                tensor.size    = n;
                TP_CHECK(TP_POSTED(xfer_tensor_publish(s->ctx, a, "t", &tensor, 0, NULL, NULL,
                                                       NULL)), "publish");
            }
            TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
            continue;
        }
        if (cmd == CMD_RANGE) {
            off = ctl_u64(s);
            n   = ctl_u64(s);
            bad = tp_check_pattern(base + off, n, ctl_u64(s));
            TP_CHECK(tp_ctl_send_u64(s->ctl, (bad < 0) ? 1 : (uint64_t)bad + 2) == 0, "ctl");
            continue;
        }
        TP_CHECK(cmd == CMD_CHECK, "unknown command %llu", (unsigned long long)cmd);
        off       = ctl_u64(s);
        n         = ctl_u64(s);
        seed_in   = ctl_u64(s);
        seed_fill = ctl_u64(s);
        tp_fill_pattern(expect, ALEN, seed_fill);
        tp_fill_pattern(expect + SLACK + off, n, seed_in);
        if (memcmp(alloc, expect, ALEN) != 0) {
            for (size_t j = 0; (j < ALEN) && (bad < 0); j++) {
                bad = (alloc[j] != expect[j]) ? (ssize_t)j : -1;
            }
            fprintf(stderr, "target: byte %zd of the allocation is wrong\n", bad);
        }
        TP_CHECK(tp_ctl_send_u64(s->ctl, (bad < 0) ? 1 : (uint64_t)bad + 2) == 0, "ctl");
    }
    TP_CHECK_STATUS(xfer_mem_deregister(mem), XFER_OK);
    free(alloc);
    free(expect);
    return 0;
}

/* ---- the initiator --------------------------------------------------------------------------- */

typedef struct stg {
    tp_peer_t   peer;
    uint64_t    base;           /* the target's region */
    xfer_rkey_t *rkey;
    char        *local;         /* ALEN bytes; [SLACK, SLACK + RLEN) registered */
    xfer_mem_t  *mem;
} stg_t;

/* A target child and a parent context whose host memory is staged, depth bounce buffers of
 * CHUNK bytes, copies landing after delay polls. */
static void stg_start(stg_t *t, unsigned depth, unsigned delay)
{
    xfer_staging_stats_t st;
    char val[16];
    void *blob;
    size_t len;

    snprintf(val, sizeof(val), "%u", depth);
    setenv("XFER_STAGING_DEPTH", val, 1);
    tp_start(&t->peer, srv_target, NULL);
    cr_assert_eq(xfer_staging_test_host(t->peer.ctx, delay), XFER_OK);
    t->base = tp_recv(&t->peer);
    blob    = tp_recv_blob(&t->peer, &len);
    cr_assert_eq(xfer_rkey_unpack(t->peer.ep, blob, len, &t->rkey), XFER_OK);
    free(blob);
    t->local = malloc(ALEN);
    cr_assert_not_null(t->local);
    cr_assert_eq(xfer_mem_register(t->peer.ctx, t->local + SLACK, RLEN, XFER_MEM_HOST,
                                   &t->mem), XFER_OK);
    xfer_staging_test_stats(t->peer.ctx, &st);
    cr_assert_eq(st.chunk_size, CHUNK);
    cr_assert_eq(st.pool_slots, 0, "the pool exists before the first staged operation");
}

static void stg_finish(stg_t *t)
{
    tp_send(&t->peer, CMD_DONE);
    xfer_rkey_destroy(t->rkey);
    cr_expect_eq(xfer_mem_deregister(t->mem), XFER_OK);
    free(t->local);
    tp_finish(&t->peer);
}

static void remote_fill(stg_t *t, uint64_t seed)
{
    tp_send(&t->peer, CMD_FILL);
    tp_send(&t->peer, seed);
    cr_assert_eq(tp_recv(&t->peer), 1);
}

static void remote_check(stg_t *t, uint64_t off, uint64_t len, uint64_t seed_in,
                         uint64_t seed_fill, const char *what)
{
    uint64_t v;

    tp_send(&t->peer, CMD_CHECK);
    tp_send(&t->peer, off);
    tp_send(&t->peer, len);
    tp_send(&t->peer, seed_in);
    tp_send(&t->peer, seed_fill);
    v = tp_recv(&t->peer);
    cr_assert_eq(v, 1, "%s: the target's byte %lld is wrong", what, (long long)v - 2);
}

/* The local allocation holds pattern(seed_fill) everywhere but [SLACK + off, +len), which
 * holds the target's pattern(seed_remote) of its region at roff. */
static void local_check(stg_t *t, size_t off, size_t len, uint64_t seed_remote, uint64_t roff,
                        uint64_t seed_fill, const char *what)
{
    char *expect = malloc(ALEN), *remote = malloc(ALEN);
    ssize_t bad = -1;

    cr_assert(expect && remote);
    tp_fill_pattern(expect, ALEN, seed_fill);
    tp_fill_pattern(remote, ALEN, seed_remote);
    memcpy(expect + SLACK + off, remote + SLACK + roff, len);
    for (size_t i = 0; (i < ALEN) && (bad < 0); i++) {
        bad = (t->local[i] != expect[i]) ? (ssize_t)i : -1;
    }
    free(expect);
    free(remote);
    cr_assert_eq(bad, -1, "%s: local byte %zd (allocation offset) is wrong", what, bad);
}

static size_t chunks_of(size_t len)
{
    return (len + CHUNK - 1) / CHUNK;
}

/* Put then get each size through the pipeline; data and guards checked byte for byte on the
 * side that did not initiate, the counters say every chunk went through a bounce buffer. */
static void sizes_at_depth(unsigned depth)
{
    static const size_t sizes[] = {1, CHUNK - 1, CHUNK, CHUNK + 1, 10 * CHUNK + 1};
    xfer_staging_stats_t before, after;
    char what[96];
    stg_t t;

    stg_start(&t, depth, 2);
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        size_t len = sizes[i], loff = 7 + i;    /* odd offsets on both sides */
        uint64_t seed = 100 + i;
        xfer_request_t *req = NULL;

        /* put */
        remote_fill(&t, 50 + i);
        tp_fill_pattern(t.local, ALEN, seed + 500);
        tp_fill_pattern(t.local + SLACK + loff, len, seed);
        xfer_staging_test_stats(t.peer.ctx, &before);
        cr_assert_eq(xfer_put(t.peer.ep, t.local + SLACK + loff, len, t.mem,
                              t.base + ROFF, t.rkey, NULL, NULL, &req), XFER_OK);
        cr_assert_eq(tp_op_result(XFER_OK, req, TP_WAIT_MS), XFER_OK, "put of %zu", len);
        xfer_staging_test_stats(t.peer.ctx, &after);
        snprintf(what, sizeof(what), "put of %zu bytes at depth %u", len, depth);
        remote_check(&t, ROFF, len, seed, 50 + i, what);
        cr_expect_eq(after.ops - before.ops, 1, "%s", what);
        cr_expect_eq(after.chunks - before.chunks, chunks_of(len), "%s", what);
        cr_expect_eq(after.copies - before.copies, chunks_of(len), "%s", what);
        cr_expect_eq(after.transfers - before.transfers, chunks_of(len), "%s", what);
        cr_expect_eq(after.in_flight, 0, "%s", what);

        /* get */
        remote_fill(&t, 70 + i);
        tp_fill_pattern(t.local, ALEN, seed + 1000);
        xfer_staging_test_stats(t.peer.ctx, &before);
        req = NULL;
        cr_assert_eq(xfer_get(t.peer.ep, t.local + SLACK + loff, len, t.mem,
                              t.base + ROFF, t.rkey, NULL, NULL, &req), XFER_OK);
        cr_assert_eq(tp_op_result(XFER_OK, req, TP_WAIT_MS), XFER_OK, "get of %zu", len);
        xfer_staging_test_stats(t.peer.ctx, &after);
        snprintf(what, sizeof(what), "get of %zu bytes at depth %u", len, depth);
        local_check(&t, loff, len, 70 + i, ROFF, seed + 1000, what);
        cr_expect_eq(after.chunks - before.chunks, chunks_of(len), "%s", what);
        cr_expect_eq(after.copies - before.copies, chunks_of(len), "%s", what);
        cr_expect_eq(after.transfers - before.transfers, chunks_of(len), "%s", what);
        cr_expect_eq(after.in_flight, 0, "%s", what);
    }
    xfer_staging_test_stats(t.peer.ctx, &after);
    cr_expect_eq(after.pool_slots, depth);
    cr_expect_eq(after.max_in_flight, depth, "11 chunks at depth %u held %u bounce buffers "
                 "at most", depth, after.max_in_flight);
    stg_finish(&t);
}

Test(staging, sizes_at_depth_1) { sizes_at_depth(1); }
Test(staging, sizes_at_depth_2) { sizes_at_depth(2); }
Test(staging, sizes_at_depth_4) { sizes_at_depth(4); }

/* ---- ordering -------------------------------------------------------------------------------- */

typedef struct seen {
    xfer_context_t       *ctx;
    int                  calls;
    xfer_status_t        status;
    xfer_staging_stats_t stats;         /* when the callback ran */
    int                  data_ok;       /* get: the destination held the data by then */
    const char           *dst;
    const char           *want;
    size_t               len;
} seen_t;

static void seen_cb(xfer_request_t *req, xfer_status_t status, void *arg)
{
    seen_t *s = arg;

    (void)req;
    s->calls++;
    s->status = status;
    if (s->ctx != NULL) {
        xfer_staging_test_stats(s->ctx, &s->stats);
    }
    s->data_ok = (s->dst == NULL) || (memcmp(s->dst, s->want, s->len) == 0);
}

static void progress_until_calls(xfer_context_t *ctx, const seen_t *s, int calls)
{
    double end = tp_now_ms() + TP_WAIT_MS;

    while ((s->calls < calls) && (tp_now_ms() < end)) {
        xfer_progress(ctx);
    }
    cr_assert_eq(s->calls, calls, "callback ran %d times, expected %d", s->calls, calls);
}

/* The request completes only after the last copy and the last transfer: when its callback
 * runs, every chunk's copy and transfer are counted, no bounce buffer is held, and a get's
 * destination already holds the data (its last copy, from a bounce buffer, landed). */
Test(staging, completion_comes_after_the_last_copy_and_transfer)
{
    const size_t len = 10 * CHUNK + 1;
    char *want = malloc(ALEN);
    xfer_staging_stats_t before;
    seen_t s;
    stg_t t;

    cr_assert_not_null(want);
    stg_start(&t, 2, 5);
    for (int is_put = 1; is_put >= 0; is_put--) {
        memset(&s, 0, sizeof(s));
        s.ctx = t.peer.ctx;
        remote_fill(&t, 3);
        tp_fill_pattern(t.local + SLACK, RLEN, 4);
        if (!is_put) {
            tp_fill_pattern(want, ALEN, 3);
            s.dst  = t.local + SLACK;
            s.want = want + SLACK + ROFF;
            s.len  = len;
        }
        xfer_staging_test_stats(t.peer.ctx, &before);
        cr_assert_eq(is_put ? xfer_put(t.peer.ep, t.local + SLACK, len, t.mem, t.base + ROFF,
                                       t.rkey, seen_cb, &s, NULL) :
                              xfer_get(t.peer.ep, t.local + SLACK, len, t.mem, t.base + ROFF,
                                       t.rkey, seen_cb, &s, NULL), XFER_OK);
        cr_expect_eq(s.calls, 0, "the callback ran inside the call that posted");
        progress_until_calls(t.peer.ctx, &s, 1);
        cr_expect_eq(s.status, XFER_OK);
        cr_expect_eq(s.stats.copies - before.copies, chunks_of(len));
        cr_expect_eq(s.stats.transfers - before.transfers, chunks_of(len));
        cr_expect_eq(s.stats.chunks - before.chunks, chunks_of(len));
        cr_expect_eq(s.stats.in_flight, 0, "bounce buffers held at completion");
        cr_expect(s.data_ok, "%s: the destination lacked the data at completion",
                  is_put ? "put" : "get");
        if (is_put) {
            remote_check(&t, ROFF, len, 4, 3, "put");
        }
        tp_progress_for(t.peer.ctx, 20);
        cr_expect_eq(s.calls, 1, "completed more than once");
    }
    free(want);
    stg_finish(&t);
}

/* Several operations share the pool: at most depth chunks in flight in the context, each
 * operation's data intact. */
Test(staging, operations_share_the_bounded_pool)
{
    enum { NOPS = 6 };
    const size_t len = 5 * CHUNK + 3;
    xfer_request_t *req[NOPS];
    xfer_staging_stats_t st;
    stg_t t;

    stg_start(&t, 3, 3);
    remote_fill(&t, 9);
    tp_fill_pattern(t.local, ALEN, 10);
    for (int i = 0; i < NOPS; i++) {
        tp_fill_pattern(t.local + SLACK + (size_t)i * len, len, 20 + (uint64_t)i);
        req[i] = NULL;
        cr_assert_eq(xfer_put(t.peer.ep, t.local + SLACK + (size_t)i * len, len, t.mem,
                              t.base + ROFF + (uint64_t)i * len, t.rkey, NULL, NULL, &req[i]),
                     XFER_OK);
    }
    for (int i = 0; i < NOPS; i++) {
        cr_assert_eq(tp_op_result(XFER_OK, req[i], TP_WAIT_MS), XFER_OK, "put %d", i);
    }
    xfer_staging_test_stats(t.peer.ctx, &st);
    cr_expect_eq(st.max_in_flight, 3);
    cr_expect_eq(st.in_flight, 0);
    cr_expect_eq(st.ops, NOPS);
    for (int i = 0; i < NOPS; i++) {
        char what[32];

        snprintf(what, sizeof(what), "put %d", i);
        tp_send(&t.peer, CMD_RANGE);
        tp_send(&t.peer, ROFF + (uint64_t)i * len);
        tp_send(&t.peer, len);
        tp_send(&t.peer, 20 + (uint64_t)i);
        cr_expect_eq(tp_recv(&t.peer), 1, "%s: its range at the target is wrong", what);
    }
    stg_finish(&t);
}

/* ---- failures -------------------------------------------------------------------------------- */

/* The peer dies (SIGKILL) with a put in the middle of its chunks: the request fails once,
 * every bounce buffer comes back, the registration is free again, the endpoint is failed. */
Test(staging, a_peer_dying_mid_pipeline_fails_the_request_once)
{
    const size_t len = RLEN;    /* 256 chunks */
    xfer_staging_stats_t st;
    double end;
    seen_t s;
    stg_t t;

    memset(&s, 0, sizeof(s));
    stg_start(&t, 2, 50);
    s.ctx = t.peer.ctx;
    tp_fill_pattern(t.local, ALEN, 5);
    cr_assert_eq(xfer_put(t.peer.ep, t.local + SLACK, len, t.mem, t.base, t.rkey, seen_cb, &s,
                          NULL), XFER_OK);
    end = tp_now_ms() + TP_WAIT_MS;
    do {
        xfer_progress(t.peer.ctx);
        xfer_staging_test_stats(t.peer.ctx, &st);
    } while ((st.chunks < 4) && (tp_now_ms() < end));
    cr_assert_geq(st.chunks, 4, "the pipeline did not move");
    cr_assert_lt(st.chunks, chunks_of(len), "the pipeline ended before the peer was killed");
    kill(t.peer.pid, SIGKILL);
    cr_expect_eq(tp_child_wait(&t.peer, 10), 128 + SIGKILL);
    progress_until_calls(t.peer.ctx, &s, 1);
    cr_expect_neq(s.status, XFER_OK, "the put succeeded to a dead peer");
    tp_progress_for(t.peer.ctx, 50);
    cr_expect_eq(s.calls, 1, "the request completed more than once");
    xfer_staging_test_stats(t.peer.ctx, &st);
    cr_expect_eq(st.in_flight, 0, "bounce buffers held after the failure");
    cr_expect_eq(st.ops_failed, 1);
    cr_expect_neq(xfer_endpoint_status(t.peer.ep), XFER_OK);
    cr_expect_neq(xfer_put(t.peer.ep, t.local + SLACK, 1, t.mem, t.base, t.rkey, NULL, NULL,
                           NULL), XFER_OK, "a put on the failed endpoint was accepted");
    xfer_rkey_destroy(t.rkey);
    cr_expect_eq(xfer_mem_deregister(t.mem), XFER_OK, "the failed put still holds the memory");
    free(t.local);
    xfer_endpoint_close(t.peer.ep);
    xfer_context_destroy(t.peer.ctx);
    close(t.peer.ctl);
}

/* Destroying the context with a put in the middle of its chunks finishes it as it would a
 * plain put (the close waits for what was posted): the callback runs once, with success,
 * and the target holds every byte. */
Test(staging, context_destroy_with_a_pipeline_in_flight)
{
    const size_t len = 64 * CHUNK + 5;
    xfer_staging_stats_t st;
    double end;
    seen_t s;
    stg_t t;

    memset(&s, 0, sizeof(s));
    stg_start(&t, 2, 20);
    s.ctx = t.peer.ctx;
    remote_fill(&t, 6);
    tp_fill_pattern(t.local + SLACK, RLEN, 7);
    cr_assert_eq(xfer_put(t.peer.ep, t.local + SLACK, len, t.mem, t.base, t.rkey, seen_cb, &s,
                          NULL), XFER_OK);
    end = tp_now_ms() + TP_WAIT_MS;
    do {
        xfer_progress(t.peer.ctx);
        xfer_staging_test_stats(t.peer.ctx, &st);
    } while ((st.chunks < 2) && (tp_now_ms() < end));
    cr_assert_lt(st.chunks, chunks_of(len), "the pipeline ended before the destroy");
    s.ctx = NULL;               /* the callback runs inside destroy: no stats then */
    xfer_context_destroy(t.peer.ctx);
    cr_expect_eq(s.calls, 1, "callback ran %d times", s.calls);
    cr_expect_eq(s.status, XFER_OK, "status %s", xfer_status_string(s.status));
    remote_check(&t, 0, len, 7, 6, "put finished by the destroy");
    tp_send(&t.peer, CMD_DONE);
    free(t.local);
    tp_child_expect_ok(&t.peer, 20);
}

/* A forced close in the middle of a get cancels it: its callback runs once with
 * XFER_ERR_CANCELED, no bounce buffer stays held, the memory can be deregistered, and the
 * pool serves a new endpoint. */
Test(staging, a_forced_close_mid_pipeline_cancels_once)
{
    const size_t len = 128 * CHUNK;
    xfer_staging_stats_t st;
    xfer_request_t *req = NULL;
    double end;
    seen_t s;
    stg_t t;

    memset(&s, 0, sizeof(s));
    stg_start(&t, 4, 30);
    s.ctx = t.peer.ctx;
    cr_assert_eq(xfer_get(t.peer.ep, t.local + SLACK, len, t.mem, t.base, t.rkey, seen_cb, &s,
                          NULL), XFER_OK);
    end = tp_now_ms() + TP_WAIT_MS;
    do {
        xfer_progress(t.peer.ctx);
        xfer_staging_test_stats(t.peer.ctx, &st);
    } while ((st.chunks < 2) && (tp_now_ms() < end));
    cr_assert_lt(st.chunks, chunks_of(len), "the pipeline ended before the close");
    cr_assert_eq(xfer_endpoint_close_nb(t.peer.ep, XFER_CLOSE_FLAG_FORCE, NULL, NULL, &req),
                 XFER_OK);
    cr_expect_eq(tp_op_result(XFER_OK, req, TP_WAIT_MS), XFER_OK);
    progress_until_calls(t.peer.ctx, &s, 1);
    cr_expect_eq(s.status, XFER_ERR_CANCELED, "status %s", xfer_status_string(s.status));
    tp_progress_for(t.peer.ctx, 20);
    cr_expect_eq(s.calls, 1);
    xfer_staging_test_stats(t.peer.ctx, &st);
    cr_expect_eq(st.in_flight, 0, "bounce buffers held after the close");
    cr_expect_eq(st.ops_failed, 1);
    xfer_rkey_destroy(t.rkey);
    cr_expect_eq(xfer_mem_deregister(t.mem), XFER_OK, "the cancelled get holds the memory");
    tp_send(&t.peer, CMD_DONE);
    cr_expect_eq(tp_child_wait(&t.peer, 20), 0);
    free(t.local);
    xfer_context_destroy(t.peer.ctx);
    close(t.peer.ctl);
}

/* A put or get of no bytes through the pipeline completes at once, moving nothing. */
Test(staging, zero_bytes)
{
    xfer_staging_stats_t before, after;
    xfer_request_t *req = NULL;
    stg_t t;

    stg_start(&t, 2, 1);
    remote_fill(&t, 13);
    xfer_staging_test_stats(t.peer.ctx, &before);
    cr_assert_eq(xfer_put(t.peer.ep, t.local + SLACK, 0, t.mem, t.base, t.rkey, NULL, NULL,
                          &req), XFER_OK);
    cr_expect_eq(tp_op_result(XFER_OK, req, TP_WAIT_MS), XFER_OK);
    req = NULL;
    cr_assert_eq(xfer_get(t.peer.ep, t.local + SLACK, 0, t.mem, t.base, t.rkey, NULL, NULL,
                          &req), XFER_OK);
    cr_expect_eq(tp_op_result(XFER_OK, req, TP_WAIT_MS), XFER_OK);
    xfer_staging_test_stats(t.peer.ctx, &after);
    cr_expect_eq(after.ops - before.ops, 2);
    cr_expect_eq(after.chunks, before.chunks);
    remote_check(&t, 0, 0, 0, 13, "nothing moved");
    stg_finish(&t);
}

/* A transport whose largest message is smaller than a bounce buffer gets chunks of its
 * size: every byte arrives, in more chunks. */
Test(staging, chunks_shrink_to_the_transports_largest_message)
{
    const size_t len = 3 * CHUNK + 100, small = CHUNK / 4;
    xfer_staging_stats_t before, after;
    xfer_request_t *req = NULL;
    char env[64];
    stg_t t;

    if (strcmp(tp_transport(), "tcp") != 0) {
        cr_skip_test("sets the tcp transport's XFER_TCP_MAX_MSG_SIZE");
    }
    snprintf(env, sizeof(env), "%zu", small);
    setenv("XFER_TCP_MAX_MSG_SIZE", env, 1);
    stg_start(&t, 2, 1);
    remote_fill(&t, 14);
    tp_fill_pattern(t.local + SLACK, RLEN, 15);
    xfer_staging_test_stats(t.peer.ctx, &before);
    cr_assert_eq(xfer_put(t.peer.ep, t.local + SLACK, len, t.mem, t.base, t.rkey, NULL, NULL,
                          &req), XFER_OK);
    cr_assert_eq(tp_op_result(XFER_OK, req, TP_WAIT_MS), XFER_OK);
    xfer_staging_test_stats(t.peer.ctx, &after);
    cr_expect_eq(after.chunks - before.chunks, (len + small - 1) / small);
    remote_check(&t, 0, len, 15, 14, "put in the transport's chunks");
    stg_finish(&t);
}

/* The remote key may be destroyed while a staged operation still posts with it. */
Test(staging, the_remote_key_outlives_its_destroy_while_in_use)
{
    const size_t len = 8 * CHUNK;
    xfer_request_t *req = NULL;
    stg_t t;

    stg_start(&t, 1, 3);
    remote_fill(&t, 11);
    tp_fill_pattern(t.local + SLACK, RLEN, 12);
    cr_assert_eq(xfer_put(t.peer.ep, t.local + SLACK, len, t.mem, t.base, t.rkey, NULL, NULL,
                          &req), XFER_OK);
    xfer_rkey_destroy(t.rkey);
    cr_assert_eq(tp_op_result(XFER_OK, req, TP_WAIT_MS), XFER_OK);
    remote_check(&t, 0, len, 12, 11, "put after its key was destroyed");
    tp_send(&t.peer, CMD_DONE);
    cr_expect_eq(xfer_mem_deregister(t.mem), XFER_OK);
    free(t.local);
    tp_finish(&t.peer);
}

/* ---- tagged messages and tensors, staged whole (staging_msg.c) ------------------------------- */

#define MSG_SOFF 3u                 /* where in the local region messages are sent from */
#define MSG_DOFF (RLEN / 2 + 5)     /* where in it they are received */

static const size_t msg_sizes[] = {1, 100, CHUNK - 1, CHUNK + 1, 65537, 300001};

/* The local allocation holds pattern(fill) but [off, +len) of the region: pattern(seed). */
static void local_expect(stg_t *t, uint64_t fill, size_t off, size_t len, uint64_t seed,
                         const char *what)
{
    char *expect = malloc(ALEN);
    ssize_t bad = -1;

    cr_assert_not_null(expect);
    tp_fill_pattern(expect, ALEN, fill);
    tp_fill_pattern(expect + SLACK + off, len, seed);
    for (size_t i = 0; (i < ALEN) && (bad < 0); i++) {
        bad = (t->local[i] != expect[i]) ? (ssize_t)i : -1;
    }
    free(expect);
    cr_assert_eq(bad, -1, "%s: local byte %zd (allocation offset) is wrong", what, bad);
}

/* Sends from memory the transport cannot touch: the peer receives the bytes, expected and
 * unexpected, and each went through a host copy. */
Test(staging, tagged_sends_of_staged_memory_go_through_host_memory)
{
    xfer_staging_stats_t before, after;
    stg_t t;

    stg_start(&t, 2, 3);
    for (size_t i = 0; i < sizeof(msg_sizes) / sizeof(msg_sizes[0]); i++) {
        for (int unexpected = 0; unexpected < 2; unexpected++) {
            size_t len = msg_sizes[i];
            uint64_t tag = 100 + 2 * i + unexpected, seed = 40 + 2 * i + unexpected;
            xfer_request_t *req = NULL;

            tp_fill_pattern(t.local, ALEN, 7);
            tp_fill_pattern(t.local + SLACK + MSG_SOFF, len, seed);
            xfer_staging_test_stats(t.peer.ctx, &before);
            if (unexpected) {
                cr_assert(TP_POSTED(xfer_tag_send(t.peer.ep, tag, t.local + SLACK + MSG_SOFF,
                                                  len, t.mem, NULL, NULL, &req)));
                /* the host copy is the peer's now: the source may change at once */
                tp_fill_pattern(t.local + SLACK + MSG_SOFF, len, 99);
                tp_progress_for(t.peer.ctx, 20);
            }
            tp_send(&t.peer, CMD_RECV);
            tp_send(&t.peer, len);
            tp_send(&t.peer, tag);
            cr_assert_eq(tp_recv(&t.peer), 1);
            if (!unexpected) {
                cr_assert(TP_POSTED(xfer_tag_send(t.peer.ep, tag, t.local + SLACK + MSG_SOFF,
                                                  len, t.mem, NULL, NULL, &req)));
                tp_fill_pattern(t.local + SLACK + MSG_SOFF, len, 99);
            }
            cr_assert_eq(tp_op_result(XFER_INPROGRESS, req, TP_WAIT_MS), XFER_OK,
                         "send of %zu bytes", len);
            cr_assert_eq(tp_recv(&t.peer), 2 + len);
            tp_send(&t.peer, CMD_RANGE);
            tp_send(&t.peer, 0);
            tp_send(&t.peer, len);
            tp_send(&t.peer, seed);
            cr_expect_eq(tp_recv(&t.peer), 1, "%s send of %zu bytes from staged memory came "
                         "wrong", unexpected ? "an unexpected" : "a", len);
            xfer_staging_test_stats(t.peer.ctx, &after);
            cr_expect_eq(after.msgs, before.msgs + 1);
            cr_expect_eq(after.msg_copies, before.msg_copies + 1);
        }
    }
    xfer_staging_test_stats(t.peer.ctx, &after);
    cr_expect_eq(after.ops, 0, "a tagged message went through the put/get pipeline");
    stg_finish(&t);
}

/* Receives into memory the transport cannot touch, from one peer and from any peer, posted
 * before and after the message came: the bytes land where they belong, nowhere else, and
 * only once the request reports them. */
Test(staging, tagged_receives_into_staged_memory_go_through_host_memory)
{
    xfer_staging_stats_t before, after;
    stg_t t;

    stg_start(&t, 2, 3);
    for (size_t i = 0; i < sizeof(msg_sizes) / sizeof(msg_sizes[0]); i++) {
        for (int mode = 0; mode < 3; mode++) {     /* expected, unexpected, from any peer */
            size_t len = msg_sizes[i];
            uint64_t tag = 200 + 3 * i + mode, seed = 60 + 3 * i + mode;
            xfer_endpoint_t *from = (mode == 2) ? NULL : t.peer.ep;
            xfer_request_t *req = NULL;
            char what[64];

            snprintf(what, sizeof(what), "receive %d of %zu bytes", mode, len);
            tp_fill_pattern(t.local, ALEN, 8);
            xfer_staging_test_stats(t.peer.ctx, &before);
            if (mode != 1) {
                cr_assert(TP_POSTED(xfer_tag_recv(t.peer.ctx, from, tag, UINT64_MAX,
                                                  t.local + SLACK + MSG_DOFF, len, t.mem, NULL,
                                                  NULL, &req)));
            }
            tp_send(&t.peer, CMD_SEND);
            tp_send(&t.peer, tag);
            tp_send(&t.peer, len);
            tp_send(&t.peer, seed);
            cr_assert_eq(tp_recv(&t.peer), 1);
            if (mode == 1) {
                tp_progress_for(t.peer.ctx, 20);
                cr_assert(TP_POSTED(xfer_tag_recv(t.peer.ctx, from, tag, UINT64_MAX,
                                                  t.local + SLACK + MSG_DOFF, len, t.mem, NULL,
                                                  NULL, &req)));
            }
            cr_assert_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_OK, "%s", what);
            cr_expect_eq(xfer_request_length(req), len, "%s", what);
            cr_expect_eq(xfer_request_tag(req), tag, "%s", what);
            xfer_request_release(req);
            local_expect(&t, 8, MSG_DOFF, len, seed, what);
            xfer_staging_test_stats(t.peer.ctx, &after);
            cr_expect_eq(after.msgs, before.msgs + 1, "%s", what);
            cr_expect_eq(after.msg_copies, before.msg_copies + 1, "%s", what);
        }
    }
    stg_finish(&t);
}

/* A message longer than the staged receive fails it XFER_ERR_TRUNCATED and writes nothing
 * into the receive's memory; a cancelled staged receive writes nothing either. */
Test(staging, a_staged_receive_truncated_or_cancelled_writes_nothing)
{
    xfer_request_t *req = NULL;
    xfer_status_t s;
    stg_t t;

    stg_start(&t, 2, 0);
    tp_fill_pattern(t.local, ALEN, 9);
    cr_assert(TP_POSTED(xfer_tag_recv(t.peer.ctx, t.peer.ep, 300, UINT64_MAX,
                                      t.local + SLACK + MSG_DOFF, 100, t.mem, NULL, NULL,
                                      &req)));
    tp_send(&t.peer, CMD_SEND);
    tp_send(&t.peer, 300);
    tp_send(&t.peer, 5000);
    tp_send(&t.peer, 61);
    cr_assert_eq(tp_recv(&t.peer), 1);
    s = tp_op_result(XFER_INPROGRESS, req, TP_WAIT_MS);
    cr_expect_eq(s, XFER_ERR_TRUNCATED, "%s", xfer_status_string(s));
    local_expect(&t, 9, 0, 0, 0, "a truncated receive");

    req = NULL;
    cr_assert(TP_POSTED(xfer_tag_recv(t.peer.ctx, t.peer.ep, 301, UINT64_MAX,
                                      t.local + SLACK + MSG_DOFF, 100, t.mem, NULL, NULL,
                                      &req)));
    cr_expect_eq(xfer_request_cancel(req), XFER_OK);
    cr_expect_eq(tp_op_result(XFER_INPROGRESS, req, TP_WAIT_MS), XFER_ERR_CANCELED);
    local_expect(&t, 9, 0, 0, 0, "a cancelled receive");
    cr_expect_eq(xfer_mem_deregister(t.mem), XFER_OK, "a staged receive still holds it");
    t.mem = NULL;
    cr_expect_eq(xfer_mem_register(t.peer.ctx, t.local + SLACK, RLEN, XFER_MEM_HOST, &t.mem),
                 XFER_OK);
    stg_finish(&t);
}

/* A tensor fetched into memory the transport cannot touch: through a host buffer of the
 * tensor's size, the data copied into the caller's buffer before the fetch completes; one
 * larger than the caller's capacity fails XFER_ERR_TRUNCATED before anything is allocated
 * for it. */
Test(staging, tensor_fetches_into_staged_memory_go_through_host_memory)
{
    xfer_staging_stats_t before, after;
    uint64_t step = 1;
    stg_t t;

    stg_start(&t, 2, 0);
    for (size_t i = 0; i < sizeof(msg_sizes) / sizeof(msg_sizes[0]); i++, step++) {
        xfer_fetch_params_t fp = {sizeof(fp), t.local + SLACK + MSG_DOFF, msg_sizes[i], t.mem,
                                  NULL, NULL};
        size_t len = msg_sizes[i];
        const xfer_tensor_t *got;
        xfer_request_t *req = NULL;
        char what[64];

        snprintf(what, sizeof(what), "fetch of %zu bytes", len);
        tp_fill_pattern(t.local, ALEN, 10);
        xfer_staging_test_stats(t.peer.ctx, &before);
        tp_send(&t.peer, CMD_PUBLISH);
        tp_send(&t.peer, step);
        tp_send(&t.peer, len);
        tp_send(&t.peer, 80 + i);
        cr_assert_eq(tp_recv(&t.peer), 1);
        cr_assert_eq(xfer_tensor_fetch(t.peer.ep, step, "t", &fp, NULL, NULL, &req), XFER_OK);
        cr_assert_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_OK, "%s", what);
        got = xfer_request_tensor(req);
        cr_assert_not_null(got);
        cr_expect_eq(got->size, len, "%s", what);
        cr_expect_eq(got->data, t.local + SLACK + MSG_DOFF, "%s: the data is not the caller's "
                     "buffer", what);
        xfer_request_release(req);
        local_expect(&t, 10, MSG_DOFF, len, 80 + i, what);
        xfer_staging_test_stats(t.peer.ctx, &after);
        cr_expect_eq(after.msgs, before.msgs + 1, "%s", what);
    }

    /* too large for the caller's buffer */
    {
        xfer_fetch_params_t fp = {sizeof(fp), t.local + SLACK + MSG_DOFF, 1000, t.mem, NULL,
                                  NULL};
        xfer_request_t *req = NULL;

        tp_fill_pattern(t.local, ALEN, 11);
        xfer_staging_test_stats(t.peer.ctx, &before);
        tp_send(&t.peer, CMD_PUBLISH);
        tp_send(&t.peer, step);
        tp_send(&t.peer, 1001);
        tp_send(&t.peer, 90);
        cr_assert_eq(tp_recv(&t.peer), 1);
        cr_assert_eq(xfer_tensor_fetch(t.peer.ep, step, "t", &fp, NULL, NULL, &req), XFER_OK);
        cr_expect_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_ERR_TRUNCATED);
        cr_expect_null(xfer_request_tensor(req));
        xfer_request_release(req);
        local_expect(&t, 11, 0, 0, 0, "a fetch too large for its buffer");
        xfer_staging_test_stats(t.peer.ctx, &after);
        cr_expect_eq(after.msgs, before.msgs, "a host buffer was made for a tensor that does "
                     "not fit");
    }
    stg_finish(&t);
}

/* A remote key for memory the transport cannot touch is refused: only the local side of a put
 * or get is staged. */
Test(staging, remote_keys_of_staged_memory_are_refused)
{
    void *blob = NULL;
    size_t len = 0;
    stg_t t;

    stg_start(&t, 2, 0);
    cr_expect_eq(xfer_rkey_pack(t.mem, &blob, &len), XFER_ERR_UNSUPPORTED);
    cr_expect_null(blob);
    stg_finish(&t);
}

/* ---- CUDA memory ---------------------------------------------------------------------------- */

typedef tg_gpu_t gpu_t;

/* CUDA on device 0, or the test skips. Call it after the peer is forked (gpu_fixture.h). */
static void gpu_open(gpu_t *g)
{
    tg_gpu_open(g, "test_staging");
}

/* Put from and get into device memory, sizes around the chunk, from an odd offset of the
 * allocation; the whole allocation (guards included) is read back through the driver after
 * each get. A transport without MEM_CUDA moves it through the staging pipeline, DEPTH chunks
 * at once; one with it moves it itself, and the pipeline stays unused. */
static void cuda_put_get(unsigned depth)
{
    static const size_t sizes[] = {1, CHUNK - 1, CHUNK, CHUNK + 1, 10 * CHUNK + 1};
    const size_t dlen = 16 * CHUNK, doff = 5;
    char *host = malloc(dlen), *back = malloc(dlen), *want = malloc(ALEN), val[16];
    xfer_staging_stats_t st;
    xfer_cu_ptr_t dptr = 0;
    xfer_mem_t *dmem;
    void *blob;
    size_t blen;
    gpu_t g;
    stg_t t;

    cr_assert(host && back && want);
    snprintf(val, sizeof(val), "%u", depth);
    setenv("XFER_STAGING_DEPTH", val, 1);
    tp_start(&t.peer, srv_target, NULL);
    gpu_open(&g);
    t.base = tp_recv(&t.peer);
    blob   = tp_recv_blob(&t.peer, &blen);
    cr_assert_eq(xfer_rkey_unpack(t.peer.ep, blob, blen, &t.rkey), XFER_OK);
    free(blob);
    cr_assert_eq(g.drv->mem_alloc(&dptr, dlen), 0);
    cr_assert_eq(xfer_mem_register(t.peer.ctx, (void*)(uintptr_t)dptr, dlen, XFER_MEM_CUDA,
                                   &dmem), XFER_OK);
    cr_assert_eq(xfer_mem_type(dmem), XFER_MEM_CUDA);
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        size_t len = sizes[i];
        xfer_request_t *req = NULL;

        tp_fill_pattern(host, dlen, 30 + i);
        tp_fill_pattern(host + doff, len, 40 + i);
        cr_assert_eq(g.drv->memcpy_htod(dptr, host, dlen), 0);
        remote_fill(&t, 31);
        cr_assert_eq(xfer_put(t.peer.ep, (void*)(uintptr_t)(dptr + doff), len, dmem,
                              t.base + ROFF, t.rkey, NULL, NULL, &req), XFER_OK);
        cr_assert_eq(tp_op_result(XFER_OK, req, TP_WAIT_MS), XFER_OK);
        remote_check(&t, ROFF, len, 40 + i, 31, "put from device memory");

        remote_fill(&t, 32);
        req = NULL;
        cr_assert_eq(xfer_get(t.peer.ep, (void*)(uintptr_t)(dptr + doff), len, dmem,
                              t.base + ROFF, t.rkey, NULL, NULL, &req), XFER_OK);
        cr_assert_eq(tp_op_result(XFER_OK, req, TP_WAIT_MS), XFER_OK);
        cr_assert_eq(g.drv->memcpy_dtoh(back, dptr, dlen), 0);
        tp_fill_pattern(want, ALEN, 32);
        memcpy(host + doff, want + SLACK + ROFF, len);
        cr_expect(memcmp(back, host, dlen) == 0, "get of %zu bytes into device memory at "
                  "depth %u", len, depth);
    }
    xfer_staging_test_stats(t.peer.ctx, &st);
    if (tg_transport_moves_cuda(t.peer.ctx, t.peer.ep)) {
        cr_expect_eq(st.pool_slots, 0, "%s moves CUDA memory itself, yet the staging pool "
                     "was made", xfer_endpoint_transport(t.peer.ep));
    } else {
        cr_expect_eq(st.pool_slots, depth);
        cr_expect_eq(st.max_in_flight, depth);
    }
    cr_expect_eq(st.in_flight, 0);
    cr_expect_eq(xfer_mem_deregister(dmem), XFER_OK);
    cr_assert_eq(g.drv->mem_free(dptr), 0);
    tp_send(&t.peer, CMD_DONE);
    xfer_rkey_destroy(t.rkey);
    tp_finish(&t.peer);
    g.drv->device_primary_ctx_release(g.device);
    free(host);
    free(back);
    free(want);
}

/* Over the GPU's own driver; skips where there is none. */
Test(staging, put_and_get_of_cuda_memory_depth_1) { cuda_put_get(1); }
Test(staging, put_and_get_of_cuda_memory_depth_4) { cuda_put_get(4); }

/*
 * The same through test/plugins/fake_cuda.c, a stand-in for the GPU's driver that is the only
 * test double here: registration of XFER_MEM_CUDA, detection, and the staging pipeline's
 * CUDA copy engine (its stream, events polled until ready, context switches) run as they do
 * on a GPU. Its device memory is not CPU-addressable (PROT_NONE), so a transport handed it
 * instead of a bounce buffer would fault.
 */
static void fake_driver(void)
{
    tg_use_stand_in_driver();
}

Test(staging, put_and_get_through_the_cuda_copy_engine_depth_1)
{
    fake_driver();
    cuda_put_get(1);
}

Test(staging, put_and_get_through_the_cuda_copy_engine_depth_3)
{
    fake_driver();
    cuda_put_get(3);
}
