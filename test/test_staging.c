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
#include "staging_fixture.h"
#include "test_util.h"

#include <xfer/component.h>
#include <xfer/info.h>

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

TestSuite(staging, .init = stg_setup, .timeout = 120);

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
    cr_assert_eq(tp_flush(t.peer.ep, TP_WAIT_MS), XFER_OK);
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
    t.peer.ep = NULL;           /* closed by the destroy, which flushed it */
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
