/*
 * The contract (docs/contract.md), requests and completion (C1-C6) and the ordering of puts,
 * gets and messages (C9): what a post that is refused leaves behind, when and how often a
 * callback runs, what local and remote completion let the caller assume, what a callback may
 * do, and what release and cancel do to a request. The target is ct_target, driven over the
 * control channel.
 */
#include "contract.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#define TAG      0x5e9dull
#define ALL      (~0ull)
#define SRC_LEN  (4u << 20)

/* Register a source/sink buffer of len bytes in the parent. */
static uint8_t *local_buffer(xfer_context_t *ctx, size_t len, xfer_mem_t **mem_p)
{
    uint8_t *buf = malloc(len);

    cr_assert_not_null(buf);
    cr_assert_eq(xfer_mem_register(ctx, buf, len, XFER_MEM_HOST, mem_p), XFER_OK);
    return buf;
}

static void local_buffer_free(uint8_t *buf, xfer_mem_t *mem)
{
    cr_assert_eq(xfer_mem_deregister(mem), XFER_OK);
    free(buf);
}

static void stop(tp_peer_t *p, xfer_rkey_t *rkey)
{
    xfer_rkey_destroy(rkey);
    cr_assert_eq(ct_do(p, CT_STOP, 0, 0, 0), 0);
    tp_finish(p);
}

/* Progress until *calls is set (at most TP_WAIT_MS). */
static void progress_until(xfer_context_t *ctx, const int *calls)
{
    double until = tp_now_ms() + TP_WAIT_MS;

    while ((*calls == 0) && (tp_now_ms() < until)) {
        (void)xfer_progress(ctx);
    }
    cr_assert_eq(*calls, 1);
}

/* A refused post must not have left a request behind or a callback to run later. */
static void expect_refused(tp_peer_t *p, xfer_status_t s, xfer_status_t want,
                           xfer_request_t *req, const tp_calls_t *calls, const char *what)
{
    cr_assert_eq(s, want, "%s: %s, expected %s", what, xfer_status_string(s),
                 xfer_status_string(want));
    cr_assert_null(req, "%s: a refused post created a request", what);
    tp_progress_for(p->ctx, 20);
    cr_assert_eq(calls->calls, 0, "%s: a refused post called its callback", what);
}

/* C1: a post returns XFER_OK and a request, or an error, no request and no callback ever. */
Test(contract, a_refused_post_creates_no_request_and_never_calls_back)
{
    /* XFER_NOTIFY_MAX_LEN's default, 4 KiB, and one byte more */
    static const uint8_t notify[4096 + 1];
    xfer_batch_desc_t desc = {.local_offset = 0, .remote_offset = 0, .length = 4096};
    tp_calls_t calls       = {0};
    xfer_request_t *req    = NULL;
    xfer_batch_t *batch;
    xfer_rkey_t *rkey;
    xfer_mem_t *mem;
    uint64_t base;
    uint8_t *src;
    tp_peer_t p;

    rkey = ct_start(&p);
    src  = local_buffer(p.ctx, SRC_LEN, &mem);
    base = xfer_rkey_address(rkey);

    expect_refused(&p, xfer_put(p.ep, src, 4096, mem, base + CT_REGION - 4095, rkey,
                                tp_calls_cb, &calls, &req), XFER_ERR_OUT_OF_RANGE, req,
                   &calls, "a put past the end of the target's region");
    expect_refused(&p, xfer_get(p.ep, src, 4096, mem, base - 1, rkey, tp_calls_cb, &calls, &req),
                   XFER_ERR_OUT_OF_RANGE, req, &calls, "a get before its start");
    expect_refused(&p, xfer_put(p.ep, src + SRC_LEN - 100, 4096, mem, base, rkey, tp_calls_cb,
                                &calls, &req), XFER_ERR_OUT_OF_RANGE, req, &calls,
                   "a put from past the end of the local registration");
    expect_refused(&p, xfer_tag_send(p.ep, TAG, NULL, 64, NULL, tp_calls_cb, &calls, &req),
                   XFER_ERR_INVALID_PARAM, req, &calls, "a send of 64 bytes at NULL");
    expect_refused(&p, xfer_tag_recv(p.ctx, p.ep, TAG, ALL, NULL, 64, NULL, tp_calls_cb, &calls,
                                     &req), XFER_ERR_INVALID_PARAM, req, &calls,
                   "a receive of 64 bytes into NULL");
    cr_assert_eq(xfer_batch_create(p.ep, XFER_BATCH_PUT, mem, rkey, &desc, 1, &batch), XFER_OK);
    expect_refused(&p, xfer_batch_post(batch, notify, sizeof(notify), XFER_BATCH_NO_TIMEOUT,
                                       tp_calls_cb, &calls, &req), XFER_ERR_INVALID_PARAM, req,
                   &calls, "a notification longer than XFER_NOTIFY_MAX_LEN");
    desc.remote_offset = CT_REGION - 4095;
    cr_assert_eq(xfer_batch_destroy(batch), XFER_OK);
    batch = NULL;
    cr_assert_eq(xfer_batch_create(p.ep, XFER_BATCH_PUT, mem, rkey, &desc, 1, &batch),
                 XFER_ERR_OUT_OF_RANGE, "a batch descriptor past the target's region");
    cr_assert_null(batch);

    /* and one that is accepted: XFER_OK, a request, its callback once */
    tp_fill_pattern(src, 4096, 11);
    cr_assert_eq(xfer_put(p.ep, src, 4096, mem, base + CT_REGION - 4096, rkey, tp_calls_cb,
                          &calls, &req), XFER_OK);
    cr_assert_not_null(req);
    cr_assert_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
    cr_assert_eq(calls.calls, 1);
    xfer_request_release(req);
    cr_assert_eq(tp_flush(p.ep, TP_WAIT_MS), XFER_OK);
    cr_assert_eq(ct_do(&p, CT_CHECK, CT_REGION - 4096, 4096, 11), 0);
    local_buffer_free(src, mem);
    stop(&p, rkey);
}

/* C2: what test() says of each request, checked after every round of progress. */
typedef struct watched {
    xfer_request_t *req;
    tp_calls_t     calls;
    const char     *what;
} watched_t;

/* Progress until every request completed; after each round, xfer_request_test() must say
 * XFER_INPROGRESS exactly while the request's callback has not run, and the final status the
 * callback was given once it ran. */
static void watch(xfer_context_t *ctx, watched_t *w, int n)
{
    double until = tp_now_ms() + TP_WAIT_MS;
    int done;

    do {
        cr_assert_lt(tp_now_ms(), until, "requests still pending");
        (void)xfer_progress(ctx);
        done = 0;
        for (int i = 0; i < n; i++) {
            int ran           = w[i].calls.calls;
            xfer_status_t now = xfer_request_test(w[i].req);

            cr_assert_leq(w[i].calls.calls, 1, "%s: its callback ran twice", w[i].what);
            if (ran == 0) {
                /* test() progresses: the callback may have run inside it, then it says so */
                cr_assert((now == XFER_INPROGRESS) == (w[i].calls.calls == 0),
                          "%s: test says %s while its callback ran %d times", w[i].what,
                          xfer_status_string(now), w[i].calls.calls);
            } else {
                cr_assert_eq(now, w[i].calls.status, "%s: test says %s, its callback saw %s",
                             w[i].what, xfer_status_string(now),
                             xfer_status_string(w[i].calls.status));
            }
            done += (w[i].calls.calls == 1);
        }
    } while (done < n);
}

/* C2: every request completes once, its callback from progress and never inside the post; the
 * request says XFER_INPROGRESS until the callback ran. Sends, receives, puts, gets and a flush
 * of several sizes, some of which a transport could finish inside the post. */
Test(contract, every_request_completes_once_from_progress_never_inside_its_post)
{
    static const size_t lens[] = {0, 8, 65536, (1u << 20) + 3};
    enum { N = 4 };
    watched_t w[5 * N + 1];
    uint8_t *src, *dst[N], *out[N];
    xfer_rkey_t *rkey;
    xfer_mem_t *mem;
    uint64_t base;
    tp_peer_t p;
    int n = 0;

    memset(w, 0, sizeof(w));
    rkey = ct_start(&p);
    src  = local_buffer(p.ctx, SRC_LEN, &mem);
    base = xfer_rkey_address(rkey);
    tp_fill_pattern(src, SRC_LEN, 21);
    cr_assert_eq(ct_do(&p, CT_FILL, 0, CT_REGION, 22), 0);
    for (int i = 0; i < N; i++) {
        dst[i] = malloc(lens[i] + 1);
        out[i] = malloc(lens[i] + 1);
        cr_assert_not_null(dst[i]);
        cr_assert_not_null(out[i]);
        tp_fill_pattern(out[i], lens[i], 40 + i);
        /* the target's messages are on their way while this side posts */
        ct_ask(&p, CT_SEND, TAG + 1 + i, lens[i], 30 + i);
    }
    for (int i = 0; i < N; i++) {
        ct_ask(&p, CT_RECV, TAG, lens[i], 40 + i);
    }
    for (int i = 0; i < N; i++) {
        w[n].what = "a send";
        cr_assert_eq(xfer_tag_send(p.ep, TAG, out[i], lens[i], NULL, tp_calls_cb, &w[n].calls,
                                   &w[n].req), XFER_OK);
        cr_assert_eq(w[n++].calls.calls, 0, "a send called back inside its post");
        w[n].what = "a receive";
        cr_assert_eq(xfer_tag_recv(p.ctx, p.ep, TAG + 1 + i, ALL, dst[i], lens[i] + 1, NULL,
                                   tp_calls_cb, &w[n].calls, &w[n].req), XFER_OK);
        cr_assert_eq(w[n++].calls.calls, 0, "a receive called back inside its post");
        if (lens[i] == 0) {
            continue;
        }
        w[n].what = "a put";
        cr_assert_eq(xfer_put(p.ep, src, lens[i], mem, base + CT_REGION / 2, rkey, tp_calls_cb,
                              &w[n].calls, &w[n].req), XFER_OK);
        cr_assert_eq(w[n++].calls.calls, 0, "a put called back inside its post");
        w[n].what = "a get";
        cr_assert_eq(xfer_get(p.ep, src + SRC_LEN / 2, lens[i], mem, base, rkey, tp_calls_cb,
                              &w[n].calls, &w[n].req), XFER_OK);
        cr_assert_eq(w[n++].calls.calls, 0, "a get called back inside its post");
    }
    w[n].what = "a flush";
    cr_assert_eq(xfer_endpoint_flush(p.ep, tp_calls_cb, &w[n].calls, &w[n].req), XFER_OK);
    cr_assert_eq(w[n++].calls.calls, 0, "a flush called back inside its post");
    watch(p.ctx, w, n);
    for (int i = 0; i < n; i++) {
        cr_assert_eq(w[i].calls.status, XFER_OK, "%s: %s", w[i].what,
                     xfer_status_string(w[i].calls.status));
    }
    for (int i = 0; i < 2 * N; i++) {
        cr_assert_eq(ct_answer(&p), 0, "the target's %s %d", (i < N) ? "send" : "receive", i % N);
    }
    /* nothing runs twice afterwards */
    tp_progress_for(p.ctx, 20);
    for (int i = 0; i < n; i++) {
        cr_assert_eq(w[i].calls.calls, 1, "%s", w[i].what);
        xfer_request_release(w[i].req);
    }
    for (int i = 0; i < N; i++) {
        cr_assert_lt(tp_check_pattern(dst[i], lens[i], 30 + i), 0);
        free(dst[i]);
        free(out[i]);
    }
    cr_assert_lt(tp_check_pattern(src + SRC_LEN / 2, lens[N - 1], 22), 0, "what the gets read");
    cr_assert_eq(ct_do(&p, CT_CHECK, CT_REGION / 2, lens[N - 1], 21), 0, "what the puts wrote");
    local_buffer_free(src, mem);
    stop(&p, rkey);
}

/* What the callbacks of C3 saw of the buffers they were given. */
typedef struct reuse {
    uint8_t *buf;
    size_t  len;
    uint64_t seed;      /* receive and get: the pattern the buffer must hold */
    int     calls;
    ssize_t bad;        /* receive and get: first bad offset in the callback, -1 none */
} reuse_t;

/* A send's or put's callback: the buffer is ours again, scribble over it. */
static void scribble_cb(xfer_request_t *req, xfer_status_t status, void *arg)
{
    reuse_t *r = arg;

    (void)req;
    cr_assert_eq(status, XFER_OK);
    memset(r->buf, 0xee, r->len);
    r->calls++;
}

/* A receive's or get's callback: the data is there when it runs. */
static void holds_cb(xfer_request_t *req, xfer_status_t status, void *arg)
{
    reuse_t *r = arg;

    (void)req;
    cr_assert_eq(status, XFER_OK);
    r->bad = tp_check_pattern(r->buf, r->len, r->seed);
    r->calls++;
}

/* C3: at local completion a send's or put's buffer may be reused (a scribble in its callback
 * does not reach the target), and a receive's or get's holds the data. Small and large. */
Test(contract, a_buffer_is_the_caller_s_again_at_local_completion)
{
    static const size_t lens[] = {8, 65536, 3u << 20};
    xfer_rkey_t *rkey;
    xfer_mem_t *mem;
    uint64_t base;
    uint8_t *src;
    tp_peer_t p;

    rkey = ct_start(&p);
    src  = local_buffer(p.ctx, SRC_LEN, &mem);
    base = xfer_rkey_address(rkey);
    for (unsigned i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        size_t len = lens[i];
        reuse_t send = {.buf = malloc(len), .len = len}, put = {.buf = src, .len = len};
        reuse_t recv = {.buf = malloc(len), .len = len, .seed = 60 + i};
        reuse_t get  = {.buf = src, .len = len, .seed = 70 + i};

        cr_assert_not_null(send.buf);
        cr_assert_not_null(recv.buf);
        tp_fill_pattern(send.buf, len, 50 + i);
        ct_ask(&p, CT_RECV, TAG, len, 50 + i);
        cr_assert_eq(xfer_tag_send(p.ep, TAG, send.buf, len, NULL, scribble_cb, &send, NULL),
                     XFER_OK);
        cr_assert_eq(ct_answer(&p), 0, "the target received what was sent (%zu bytes)", len);
        progress_until(p.ctx, &send.calls);

        tp_fill_pattern(src, len, 80 + i);
        cr_assert_eq(xfer_put(p.ep, src, len, mem, base, rkey, scribble_cb, &put, NULL), XFER_OK);
        cr_assert_eq(tp_flush(p.ep, TP_WAIT_MS), XFER_OK);
        cr_assert_eq(put.calls, 1);
        cr_assert_eq(ct_do(&p, CT_CHECK, 0, len, 80 + i), 0, "the put's data (%zu bytes)", len);

        cr_assert_eq(ct_do(&p, CT_SEND, TAG + 1, len, 60 + i), 0);
        cr_assert_eq(xfer_tag_recv(p.ctx, p.ep, TAG + 1, ALL, recv.buf, len, NULL, holds_cb,
                                   &recv, NULL), XFER_OK);
        cr_assert_eq(ct_do(&p, CT_FILL, 0, len, 70 + i), 0);
        cr_assert_eq(xfer_get(p.ep, src, len, mem, base, rkey, holds_cb, &get, NULL), XFER_OK);
        progress_until(p.ctx, &recv.calls);
        progress_until(p.ctx, &get.calls);
        cr_assert_eq(recv.bad, -1, "a receive's buffer in its callback, offset %zd", recv.bad);
        cr_assert_eq(get.bad, -1, "a get's buffer in its callback, offset %zd", get.bad);
        free(send.buf);
        free(recv.buf);
    }
    local_buffer_free(src, mem);
    stop(&p, rkey);
}

/* C4, C19: a put is in the target's memory once a flush posted after it completes - the
 * target looks without progressing; a flush covers the sends posted before it, a large one
 * that the receiver must take first too; and a message is in the target's transport once
 * such a flush completed: the endpoint closed by force right after, the target still
 * receives it whole. */
Test(contract, a_flush_puts_what_was_sent_before_it_in_the_target)
{
    static const size_t lens[] = {8, 65536, 1u << 20}, msgs[] = {0, 8, 1000};
    xfer_request_t *creq = NULL, *sreq = NULL;
    tp_calls_t sent = {0};
    xfer_rkey_t *rkey;
    xfer_mem_t *mem;
    uint64_t base;
    uint8_t *src;
    tp_peer_t p;

    rkey = ct_start(&p);
    src  = local_buffer(p.ctx, SRC_LEN, &mem);
    base = xfer_rkey_address(rkey);
    for (unsigned i = 0; i < 8; i++) {
        size_t len = lens[i % 3], off = (i * 65599u) % (CT_REGION - len);

        tp_fill_pattern(src, len, 90 + i);
        cr_assert_eq(ct_put(p.ep, src, len, mem, base + off, rkey), XFER_OK);
        cr_assert_eq(tp_flush(p.ep, TP_WAIT_MS), XFER_OK);
        cr_assert_eq(ct_do(&p, CT_CHECK, off, len, 90 + i), 0, "round %u", i);
    }
    /* a large send and a flush at once: the flush ends after the send */
    ct_ask(&p, CT_RECV, TAG + 9, 3u << 20, 99);
    tp_fill_pattern(src, 3u << 20, 99);
    cr_assert_eq(xfer_tag_send(p.ep, TAG + 9, src, 3u << 20, mem, tp_calls_cb, &sent, &sreq),
                 XFER_OK);
    cr_assert_eq(tp_flush(p.ep, TP_WAIT_MS), XFER_OK);
    cr_assert_eq(xfer_request_test(sreq), XFER_OK, "a flush completed before the send "
                 "posted before it");
    xfer_request_release(sreq);
    cr_assert_eq(ct_answer(&p), 0);
    for (unsigned i = 0; i < 3; i++) {
        tp_fill_pattern(src + i * 4096, msgs[i], 100 + i);
        cr_assert_eq(ct_send(p.ep, TAG + i, src + i * 4096, msgs[i]), XFER_OK);
    }
    cr_assert_eq(tp_flush(p.ep, TP_WAIT_MS), XFER_OK);
    xfer_rkey_destroy(rkey);
    cr_assert_eq(xfer_endpoint_close_nb(p.ep, XFER_CLOSE_FLAG_FORCE, NULL, NULL, &creq),
                 XFER_OK);
    cr_assert_eq(xfer_request_wait(creq, TP_WAIT_MS), XFER_OK);
    xfer_request_release(creq);
    p.ep = NULL;
    for (unsigned i = 0; i < 3; i++) {
        cr_assert_eq(ct_do(&p, CT_RECV, TAG + i, msgs[i], 100 + i), 0,
                     "the message of %zu bytes flushed before the forced close", msgs[i]);
    }
    cr_assert_eq(ct_do(&p, CT_FAILED, 0, 0, 0), (uint64_t)(int64_t)XFER_ERR_CONNECTION,
                 "the target sees a forced close as a broken connection");
    local_buffer_free(src, mem);
    cr_assert_eq(ct_do(&p, CT_STOP, 0, 0, 0), 0);
    tp_finish(&p);
}

/* C5: what the callbacks of eight receives saw, and what the first one did from inside. */
typedef struct order {
    xfer_context_t *ctx;
    xfer_endpoint_t *ep;
    int            seen[8];
    int            n;
    uint8_t        buf[8][64];
    xfer_request_t *posted, *cancelled;
    tp_calls_t     posted_calls, cancelled_calls;
    uint64_t       posted_msg, cancelled_msg;
    xfer_status_t  post_s, cancel_s, wait_s;
    int            released;
} order_t;

typedef struct order_arg {
    order_t *o;
    int     i;
} order_arg_t;

static void order_cb(xfer_request_t *req, xfer_status_t status, void *arg)
{
    order_arg_t *a = arg;
    order_t *o     = a->o;

    cr_assert_eq(status, XFER_OK);
    cr_assert_lt(o->n, 8);
    o->seen[o->n++] = a->i;
    if (a->i != 0) {
        return;
    }
    /* a callback may post, cancel, progress and release its own request, not wait */
    o->post_s   = xfer_tag_recv(o->ctx, o->ep, TAG + 2, ALL, &o->posted_msg, sizeof(uint64_t),
                                NULL, tp_calls_cb, &o->posted_calls, &o->posted);
    o->cancel_s = xfer_tag_recv(o->ctx, o->ep, TAG + 3, ALL, &o->cancelled_msg,
                                sizeof(uint64_t), NULL, tp_calls_cb, &o->cancelled_calls,
                                &o->cancelled);
    if (o->cancel_s == XFER_OK) {
        o->cancel_s = xfer_request_cancel(o->cancelled);
    }
    (void)xfer_progress(o->ctx);
    o->wait_s = (o->posted != NULL) ? xfer_request_wait(o->posted, 0) : XFER_ERR_INTERNAL;
    xfer_request_release(req);
    o->released = 1;
}

/* C5: receives complete, and their callbacks run, in the order their messages arrived; a
 * callback may post, cancel, progress and release its own request; waiting from it is
 * refused with XFER_ERR_BUSY. */
Test(contract, callbacks_run_in_completion_order_and_may_post_cancel_progress_and_release)
{
    static order_t o;
    order_arg_t args[8];
    xfer_request_t *req[8];
    xfer_rkey_t *rkey;
    tp_peer_t p;

    rkey  = ct_start(&p);
    o.ctx = p.ctx;
    o.ep  = p.ep;
    for (int i = 0; i < 8; i++) {
        args[i] = (order_arg_t){.o = &o, .i = i};
        cr_assert_eq(xfer_tag_recv(p.ctx, p.ep, TAG, ALL, o.buf[i], sizeof(o.buf[i]), NULL,
                                   order_cb, &args[i], &req[i]), XFER_OK);
    }
    for (int i = 0; i < 8; i++) {
        ct_ask(&p, CT_SEND, TAG, 8 * (i + 1), 120 + i);
    }
    for (double until = tp_now_ms() + TP_WAIT_MS; (o.n < 8) && (tp_now_ms() < until);) {
        (void)xfer_progress(p.ctx);
    }
    cr_assert_eq(o.n, 8);
    for (int i = 0; i < 8; i++) {
        cr_assert_eq(ct_answer(&p), 0);
        cr_assert_eq(o.seen[i], i, "callback %d ran for receive %d", i, o.seen[i]);
        cr_assert_lt(tp_check_pattern(o.buf[i], 8 * (i + 1), 120 + i), 0);
        if (i > 0) {
            cr_assert_eq(xfer_request_length(req[i]), 8 * (i + 1));
            xfer_request_release(req[i]);
        }
    }
    cr_assert(o.released);
    cr_assert_eq(o.post_s, XFER_OK, "a receive posted from a callback: %s",
                 xfer_status_string(o.post_s));
    cr_assert_eq(o.cancel_s, XFER_OK, "a receive cancelled from a callback: %s",
                 xfer_status_string(o.cancel_s));
    cr_assert_eq(o.wait_s, XFER_ERR_BUSY, "a wait from a callback: %s",
                 xfer_status_string(o.wait_s));
    cr_assert_eq(xfer_request_wait(o.cancelled, TP_WAIT_MS), XFER_ERR_CANCELED);
    cr_assert_eq(o.cancelled_calls.calls, 1);
    cr_assert_eq(ct_do(&p, CT_SEND, TAG + 2, 8, 130), 0);
    cr_assert_eq(xfer_request_wait(o.posted, TP_WAIT_MS), XFER_OK);
    cr_assert_eq(o.posted_calls.calls, 1);
    cr_assert_lt(tp_check_pattern(&o.posted_msg, 8, 130), 0);
    xfer_request_release(o.posted);
    xfer_request_release(o.cancelled);
    stop(&p, rkey);
}

/* C6: a request released while pending completes (its callback runs once) and is freed then;
 * cancelling a completed request returns XFER_OK and changes nothing. */
Test(contract, a_released_request_still_completes_and_a_late_cancel_changes_nothing)
{
    tp_calls_t early = {0}, never = {0}, sent = {0}, got = {0};
    xfer_request_t *req = NULL;
    uint8_t *buf        = malloc(65536);
    xfer_rkey_t *rkey;
    uint64_t msg;
    tp_peer_t p;

    cr_assert_not_null(buf);
    tp_fill_pattern(&msg, sizeof(msg), 142);
    rkey = ct_start(&p);
    cr_assert_eq(xfer_tag_recv(p.ctx, p.ep, TAG, ALL, buf, 65536, NULL, tp_calls_cb, &early,
                               &req), XFER_OK);
    xfer_request_release(req);
    cr_assert_eq(ct_do(&p, CT_SEND, TAG, 65536, 140), 0);
    progress_until(p.ctx, &early.calls);
    cr_assert_eq(early.status, XFER_OK);
    cr_assert_lt(tp_check_pattern(buf, 65536, 140), 0);

    ct_ask(&p, CT_RECV, TAG, sizeof(msg), 142);
    cr_assert_eq(xfer_tag_send(p.ep, TAG, &msg, sizeof(msg), NULL, tp_calls_cb, &sent, &req),
                 XFER_OK);
    cr_assert_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
    cr_assert_eq(xfer_request_cancel(req), XFER_OK, "cancelling a completed send");
    cr_assert_eq(xfer_request_test(req), XFER_OK);
    cr_assert_eq(sent.calls, 1);
    xfer_request_release(req);
    cr_assert_eq(ct_answer(&p), 0);

    cr_assert_eq(xfer_tag_recv(p.ctx, p.ep, TAG + 1, ALL, buf, 65536, NULL, tp_calls_cb, &got,
                               &req), XFER_OK);
    cr_assert_eq(ct_do(&p, CT_SEND, TAG + 1, 4096, 141), 0);
    cr_assert_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
    cr_assert_eq(xfer_request_cancel(req), XFER_OK, "cancelling a completed receive");
    tp_progress_for(p.ctx, 20);
    cr_assert_eq(xfer_request_test(req), XFER_OK);
    cr_assert_eq(xfer_request_length(req), 4096);
    cr_assert_eq(got.calls, 1);
    cr_assert_lt(tp_check_pattern(buf, 4096, 141), 0);
    xfer_request_release(req);

    /* released while nothing can match it: the endpoint's close completes and frees it */
    cr_assert_eq(xfer_tag_recv(p.ctx, p.ep, TAG + 9, ALL, buf, 64, NULL, tp_calls_cb, &never,
                               &req), XFER_OK);
    xfer_request_release(req);
    stop(&p, rkey);
    cr_assert_eq(never.calls, 1, "a released receive pending at close: %d calls", never.calls);
    cr_assert_neq(never.status, XFER_OK);
    free(buf);
}

/* C9: a flush orders puts and gets - a get posted after a flush reads what the puts before
 * it wrote, and a put posted after one does not reach into what an earlier get read. */
Test(contract, a_flush_orders_puts_and_gets)
{
    xfer_rkey_t *rkey;
    xfer_mem_t *mem;
    uint64_t base;
    uint8_t *src;
    tp_peer_t p;

    rkey = ct_start(&p);
    src  = local_buffer(p.ctx, SRC_LEN, &mem);
    base = xfer_rkey_address(rkey);
    for (unsigned i = 0; i < 6; i++) {
        size_t len = (i % 2) ? (1u << 20) : 4096, off = i * 4096;
        xfer_request_t *put = NULL, *get = NULL;

        tp_fill_pattern(src, len, 150 + i);
        memset(src + SRC_LEN / 2, 0, len);
        cr_assert_eq(xfer_put(p.ep, src, len, mem, base + off, rkey, NULL, NULL, &put), XFER_OK);
        cr_assert_eq(tp_flush(p.ep, TP_WAIT_MS), XFER_OK);
        cr_assert_eq(xfer_get(p.ep, src + SRC_LEN / 2, len, mem, base + off, rkey, NULL, NULL,
                              &get), XFER_OK);
        tp_fill_pattern(src, len, 160 + i);
        cr_assert_eq(tp_op_result(XFER_OK, put, TP_WAIT_MS), XFER_OK);
        cr_assert_eq(tp_flush(p.ep, TP_WAIT_MS), XFER_OK);
        cr_assert_eq(ct_put(p.ep, src, len, mem, base + off, rkey), XFER_OK);
        cr_assert_eq(tp_op_result(XFER_OK, get, TP_WAIT_MS), XFER_OK);
        cr_assert_lt(tp_check_pattern(src + SRC_LEN / 2, len, 150 + i), 0,
                     "round %u: the get after the flush", i);
        cr_assert_eq(tp_flush(p.ep, TP_WAIT_MS), XFER_OK);
        cr_assert_eq(ct_do(&p, CT_CHECK, off, len, 160 + i), 0, "round %u: the last put", i);
    }
    local_buffer_free(src, mem);
    stop(&p, rkey);
}
