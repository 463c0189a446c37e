/*
 * Flush and close between real processes: nothing reported complete is lost. A thousand eager
 * sends followed at once by a close (or a context destroy, or a close from a callback) all
 * reach the peer; a process that flushes and then dies at once has delivered its messages and
 * its put; a close that cannot deliver gives up after XFER_CLOSE_TIMEOUT with
 * XFER_ERR_TIMEOUT; a forced close does not wait; a flush on a broken endpoint fails.
 */
#include "test_peer.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void setup(void)
{
    tp_env();
}

TestSuite(close, .init = setup, .timeout = 180);

#define ALL      (~0ull)
#define EAGER    8000       /* eager on every transport (tcp 16 KiB, verbs 8 KiB slots) */
#define MANY     1000       /* 8 MB: more than the kernel's and the transports' buffers hold */
#define BIG      (64u << 20)
#define RMA_LEN  65536

/* Message i's buffer. Each has its own: a send without a request gives no sign of when its
 * buffer may be reused (a transport out of credits queues it, copying it only when it goes). */
static uint8_t *eager_buf(uint64_t i)
{
    static uint8_t bufs[MANY][EAGER];

    tp_fill_pattern(bufs[i], EAGER, 5000 + i);
    return bufs[i];
}

/* Fire-and-forget sends of MANY eager messages. */
static void send_many(xfer_endpoint_t *ep)
{
    for (uint64_t i = 0; i < MANY; i++) {
        xfer_status_t s = xfer_tag_send(ep, 5, eager_buf(i), EAGER, NULL, NULL, NULL, NULL);

        cr_assert_eq(s, XFER_OK, "send %llu: %s", (unsigned long long)i, xfer_status_string(s));
    }
}

/* Sleep without progressing for ms, then receive MANY messages and report how many arrived
 * whole and in order. The endpoint's closing by the parent must not lose any. */
static int srv_late_receiver(tp_side_t *s)
{
    static uint8_t buf[EAGER];
    uint64_t ms, good = 0, v;

    TP_CHECK(tp_ctl_recv_u64(s->ctl, &ms, TP_WAIT_MS) == 0, "ctl");
    usleep((useconds_t)ms * 1000);
    for (uint64_t i = 0; i < MANY; i++) {
        xfer_request_t *req = NULL;

        if (!TP_POSTED(xfer_tag_recv(s->ctx, s->ep, 5, ALL, buf, sizeof(buf), NULL, NULL, NULL,
                                     &req)) ||
            (xfer_request_wait(req, TP_WAIT_MS) != XFER_OK)) {
            xfer_request_release(req);
            break;
        }
        good += (xfer_request_length(req) == EAGER) &&
                (tp_check_pattern(buf, EAGER, 5000 + i) == -1);
        xfer_request_release(req);
    }
    TP_CHECK(tp_ctl_send_u64(s->ctl, good) == 0, "ctl");
    tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS);
    return 0;
}

static void expect_all_received(tp_peer_t *p)
{
    uint64_t good = tp_recv(p);

    cr_expect_eq(good, MANY, "the peer received %llu of %u messages reported sent",
                 (unsigned long long)good, MANY);
    tp_send(p, 0);
}

Test(close, a_thousand_eager_sends_then_close_at_once_all_arrive)
{
    tp_peer_t p;

    tp_start(&p, srv_late_receiver, NULL);
    tp_send(&p, 300);
    send_many(p.ep);
    xfer_endpoint_close(p.ep);
    p.ep = NULL;
    expect_all_received(&p);
    tp_finish(&p);
}

Test(close, a_thousand_eager_sends_then_context_destroy_all_arrive)
{
    tp_peer_t p;

    tp_start(&p, srv_late_receiver, NULL);
    tp_send(&p, 300);
    send_many(p.ep);
    xfer_context_destroy(p.ctx);
    p.ctx = NULL;
    p.ep  = NULL;
    expect_all_received(&p);
    tp_finish(&p);
}

static void close_nb_done_cb(xfer_request_t *req, xfer_status_t status, void *arg)
{
    (void)req;
    *(xfer_status_t*)arg = status;
}

Test(close, a_non_blocking_close_completes_once_everything_arrived)
{
    xfer_status_t closed = XFER_INPROGRESS;
    xfer_request_t *req = NULL;
    tp_peer_t p;

    tp_start(&p, srv_late_receiver, NULL);
    tp_send(&p, 300);
    send_many(p.ep);
    cr_assert_eq(xfer_endpoint_close_nb(p.ep, 0, close_nb_done_cb, &closed, &req), XFER_OK);
    p.ep = NULL;
    cr_expect_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
    cr_expect_eq(closed, XFER_OK, "the close's callback said %s", xfer_status_string(closed));
    xfer_request_release(req);
    expect_all_received(&p);
    tp_finish(&p);
}

/* ---- a close from a callback ------------------------------------------------------------------ */

typedef struct cb_close {
    xfer_endpoint_t *ep;
    int             done;
} cb_close_t;

static void send_many_then_close_cb(xfer_request_t *req, xfer_status_t status, void *arg)
{
    cb_close_t *c = arg;

    (void)req;
    (void)status;
    for (uint64_t i = 0; i < MANY; i++) {
        cr_assert_eq(xfer_tag_send(c->ep, 5, eager_buf(i), EAGER, NULL, NULL, NULL, NULL),
                     XFER_OK);
    }
    xfer_endpoint_close(c->ep);     /* from a callback: returns at once, goes on in progress */
    c->done = 1;
}

static int srv_ping_then_late_receiver(tp_side_t *s)
{
    char b = 1;

    TP_CHECK(TP_POSTED(xfer_tag_send(s->ep, 1, &b, 1, NULL, NULL, NULL, NULL)), "ping");
    return srv_late_receiver(s);
}

Test(close, a_close_from_a_callback_goes_on_in_progress_and_delivers)
{
    cb_close_t c = {0};
    double end;
    char b;
    tp_peer_t p;

    tp_start(&p, srv_ping_then_late_receiver, NULL);
    c.ep = p.ep;
    p.ep = NULL;
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, c.ep, 1, ALL, &b, 1, NULL, send_many_then_close_cb,
                                      &c, NULL)));
    tp_send(&p, 300);
    end = tp_now_ms() + TP_WAIT_MS;
    while (!c.done && (tp_now_ms() < end)) {
        xfer_progress(p.ctx);
    }
    cr_assert(c.done, "the ping never came");
    /* the close goes on in progress: progress until the peer has counted what arrived (a fixed
     * time is too short where the transport is slow, e.g. Soft-RoCE on a loaded machine) */
    end = tp_now_ms() + TP_WAIT_MS;
    while (!tp_ctl_ready(p.ctl, 0) && (tp_now_ms() < end)) {
        xfer_progress(p.ctx);
    }
    expect_all_received(&p);
    tp_finish(&p);
}

/* ---- flush, then die ------------------------------------------------------------------------- */

/* Send 200 messages and put RMA_LEN bytes into the parent's buffer, flush, and die at once:
 * no close, no destroy. What the flush covered must be at the parent. */
static int srv_flush_then_die(tp_side_t *s)
{
    static uint8_t bufs[200][EAGER], src[RMA_LEN];
    xfer_request_t *req = NULL;
    xfer_rkey_t *rkey = NULL;
    xfer_mem_t *mem = NULL;
    void *blob;
    size_t len;
    uint64_t v;

    TP_CHECK(tp_ctl_recv_alloc(s->ctl, &blob, &len, TP_WAIT_MS) == 0, "ctl");
    TP_CHECK_STATUS(xfer_rkey_unpack(s->ep, blob, len, &rkey), XFER_OK);
    free(blob);
    tp_fill_pattern(src, RMA_LEN, 77);
    TP_CHECK_STATUS(xfer_mem_register(s->ctx, src, RMA_LEN, XFER_MEM_HOST, &mem), XFER_OK);
    for (uint64_t i = 0; i < 200; i++) {
        size_t n = 1 + (i * 131) % EAGER;

        tp_fill_pattern(bufs[i], n, 9000 + i);
        TP_CHECK(xfer_tag_send(s->ep, 6, bufs[i], n, NULL, NULL, NULL, NULL) == XFER_OK,
                 "send");
    }
    TP_CHECK(TP_POSTED(xfer_put(s->ep, src, RMA_LEN, mem, xfer_rkey_address(rkey), rkey, NULL,
                                NULL, NULL)), "put");
    TP_CHECK(TP_POSTED(xfer_endpoint_flush(s->ep, NULL, NULL, &req)), "flush");
    TP_CHECK_STATUS(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
    TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
    (void)v;
    _exit(0);
}

Test(close, what_a_flush_covered_survives_the_sender_dying_at_once)
{
    static uint8_t dst[RMA_LEN], buf[EAGER];
    xfer_mem_t *mem;
    double end;
    void *blob;
    size_t len;
    tp_peer_t p;

    tp_start(&p, srv_flush_then_die, NULL);
    cr_assert_eq(xfer_mem_register(p.ctx, dst, RMA_LEN, XFER_MEM_HOST, &mem), XFER_OK);
    cr_assert_eq(xfer_rkey_pack(mem, &blob, &len), XFER_OK);
    tp_send_blob(&p, blob, len);
    xfer_rkey_blob_free(blob);
    /* the put's target progresses (tcp carries a put as a request and an acknowledgement) */
    end = tp_now_ms() + TP_WAIT_MS;
    while (!tp_ctl_ready(p.ctl, 0) && (tp_now_ms() < end)) {
        xfer_progress(p.ctx);
    }
    cr_assert_eq(tp_recv(&p), 1);
    cr_assert_eq(tp_child_wait(&p, 10), 0);
    cr_expect_eq(tp_check_pattern(dst, RMA_LEN, 77), -1, "the flushed put is not in memory");
    for (uint64_t i = 0; i < 200; i++) {
        xfer_request_t *req = NULL;
        size_t n = 1 + (i * 131) % EAGER;

        cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 6, ALL, buf, sizeof(buf), NULL, NULL,
                                          NULL, &req)));
        cr_assert_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_OK, "message %llu of 200 is lost",
                     (unsigned long long)i);
        cr_assert_eq(xfer_request_length(req), n);
        cr_assert_eq(tp_check_pattern(buf, n, 9000 + i), -1, "message %llu",
                     (unsigned long long)i);
        xfer_request_release(req);
    }
    xfer_endpoint_close(p.ep);
    xfer_mem_deregister(mem);
    xfer_context_destroy(p.ctx);
}

/* ---- a peer that never takes what we send ---------------------------------------------------- */

static int srv_deaf(tp_side_t *s)
{
    uint64_t v;

    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS * 3) == 0, "ctl");
    return 0;
}

Test(close, a_close_that_cannot_deliver_gives_up_after_the_close_timeout)
{
    xfer_request_t *req = NULL;
    double t0, dt;
    tp_peer_t p;

    setenv("XFER_CLOSE_TIMEOUT", "1s", 1);
    tp_start(&p, srv_deaf, NULL);
    send_many(p.ep);        /* more than the deaf peer's buffers and credits take */
    t0 = tp_now_ms();
    cr_assert_eq(xfer_endpoint_close_nb(p.ep, 0, NULL, NULL, &req), XFER_OK);
    p.ep = NULL;
    cr_expect_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_ERR_TIMEOUT);
    dt = tp_now_ms() - t0;
    cr_expect(dt >= 900 && dt < 5000, "the close took %.0f ms with XFER_CLOSE_TIMEOUT=1s", dt);
    xfer_request_release(req);
    tp_send(&p, 0);
    tp_finish(&p);
}

Test(close, a_forced_close_does_not_wait_and_cancels)
{
    char *big = malloc(BIG);
    xfer_request_t *req = NULL, *send = NULL;
    double t0, dt;
    tp_peer_t p;

    tp_fill_pattern(big, BIG, 3);
    tp_start(&p, srv_deaf, NULL);
    send_many(p.ep);
    cr_assert(TP_POSTED(xfer_tag_send(p.ep, 1, big, BIG, NULL, NULL, NULL, &send)));
    t0 = tp_now_ms();
    cr_assert_eq(xfer_endpoint_close_nb(p.ep, XFER_CLOSE_FLAG_FORCE, NULL, NULL, &req), XFER_OK);
    p.ep = NULL;
    cr_expect_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
    dt = tp_now_ms() - t0;
    cr_expect_lt(dt, 500, "a forced close took %.0f ms", dt);
    cr_expect_eq(xfer_request_wait(send, TP_WAIT_MS), XFER_ERR_CANCELED);
    xfer_request_release(send);
    xfer_request_release(req);
    cr_expect_eq(xfer_endpoint_close_nb(NULL, 0, NULL, NULL, NULL), XFER_ERR_INVALID_PARAM);
    tp_send(&p, 0);
    tp_finish(&p);
    free(big);
}

/* ---- flush requests -------------------------------------------------------------------------- */

Test(close, a_flush_with_nothing_outstanding_completes_at_once)
{
    xfer_request_t *req = NULL;
    tp_peer_t p;

    tp_start(&p, srv_deaf, NULL);
    cr_assert_eq(xfer_endpoint_flush(p.ep, NULL, NULL, &req), XFER_OK);
    cr_expect_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
    xfer_request_release(req);
    cr_expect_eq(xfer_endpoint_flush(NULL, NULL, NULL, &req), XFER_ERR_INVALID_PARAM);
    tp_send(&p, 0);
    tp_finish(&p);
}

Test(close, a_flush_waiting_on_a_peer_that_dies_fails_and_so_does_the_next)
{
    xfer_request_t *req = NULL, *next = NULL;
    double end;
    xfer_status_t s;
    tp_peer_t p;

    tp_start(&p, srv_deaf, NULL);
    send_many(p.ep);        /* the deaf peer takes only part of it */
    cr_assert_eq(xfer_endpoint_flush(p.ep, NULL, NULL, &req), XFER_OK);
    tp_progress_for(p.ctx, 100);
    cr_assert_eq(xfer_request_test(req), XFER_INPROGRESS, "a flush completed although the peer "
                 "cannot have taken 8 MB");
    cr_assert_eq(kill(p.pid, SIGKILL), 0);
    cr_assert_eq(tp_child_wait(&p, 10), 128 + SIGKILL);
    s = xfer_request_wait(req, TP_WAIT_MS);
    cr_expect(s < 0 && s != XFER_ERR_TIMEOUT, "the flush ended with %s", xfer_status_string(s));
    xfer_request_release(req);
    end = tp_now_ms() + TP_WAIT_MS;
    while ((xfer_endpoint_status(p.ep) == XFER_OK) && (tp_now_ms() < end)) {
        xfer_progress(p.ctx);
    }
    cr_expect_neq(xfer_endpoint_status(p.ep), XFER_OK);
    s = xfer_endpoint_flush(p.ep, NULL, NULL, &next);
    cr_expect_eq(s, xfer_endpoint_status(p.ep), "a flush on a failed endpoint: %s",
                 xfer_status_string(s));
    cr_expect_null(next);
    xfer_endpoint_close(p.ep);
    xfer_context_destroy(p.ctx);
}
