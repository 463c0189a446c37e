/*
 * Tagged messages and tensors of memory the transport cannot touch, staged whole through a
 * host buffer of their own size (framework/staging_msg.c), between two processes over the
 * real transport. As in test_staging.c the initiator's host memory is staged on purpose
 * (xfer_staging_test_host) and copied by memcpy, the stand-in for the GPU's copy engine; the
 * same path on CUDA memory (the stand-in driver's PROT_NONE device memory, over verbs) is
 * test_cuda_transport's.
 */
#include "staging_fixture.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

TestSuite(staging_msg, .init = stg_setup, .timeout = 120);

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
Test(staging_msg, tagged_sends_of_staged_memory_go_through_host_memory)
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
Test(staging_msg, tagged_receives_into_staged_memory_go_through_host_memory)
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
Test(staging_msg, a_staged_receive_truncated_or_cancelled_writes_nothing)
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
Test(staging_msg, tensor_fetches_into_staged_memory_go_through_host_memory)
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
Test(staging_msg, remote_keys_of_staged_memory_are_refused)
{
    void *blob = NULL;
    size_t len = 0;
    stg_t t;

    stg_start(&t, 2, 0);
    cr_expect_eq(xfer_rkey_pack(t.mem, &blob, &len), XFER_ERR_UNSUPPORTED);
    cr_expect_null(blob);
    stg_finish(&t);
}
