/*
 * The staging suites' target and initiator (staging_fixture.h).
 */
#include "staging_fixture.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void stg_setup(void)
{
    char chunk[32];

    tp_env();
    snprintf(chunk, sizeof(chunk), "%u", CHUNK);
    setenv("XFER_STAGING_CHUNK", chunk, 1);
    unsetenv("XFER_STAGING_DEPTH");
    unsetenv("XFER_CUDA_LIB");
}

/* ---- the target ------------------------------------------------------------------------------ */

static uint64_t ctl_u64(tp_side_t *s)
{
    uint64_t v;

    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
    return v;
}

int srv_target(tp_side_t *s)
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


/* A target child and a parent context whose host memory is staged, depth bounce buffers of
 * CHUNK bytes, copies landing after delay polls. */
void stg_start(stg_t *t, unsigned depth, unsigned delay)
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

void stg_finish(stg_t *t)
{
    tp_send(&t->peer, CMD_DONE);
    xfer_rkey_destroy(t->rkey);
    cr_expect_eq(xfer_mem_deregister(t->mem), XFER_OK);
    free(t->local);
    tp_finish(&t->peer);
}

void remote_fill(stg_t *t, uint64_t seed)
{
    tp_send(&t->peer, CMD_FILL);
    tp_send(&t->peer, seed);
    cr_assert_eq(tp_recv(&t->peer), 1);
}

void remote_check(stg_t *t, uint64_t off, uint64_t len, uint64_t seed_in,
                         uint64_t seed_fill, const char *what)
{
    uint64_t v;

    /* what puts wrote is in the target's memory once a flush completed (or the endpoint
     * closed: ep NULL) */
    if (t->peer.ep != NULL) {
        cr_assert_eq(tp_flush(t->peer.ep, TP_WAIT_MS), XFER_OK, "%s: flush", what);
    }
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
void local_check(stg_t *t, size_t off, size_t len, uint64_t seed_remote, uint64_t roff,
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

size_t chunks_of(size_t len)
{
    return (len + CHUNK - 1) / CHUNK;
}
