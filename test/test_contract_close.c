/*
 * The contract (docs/contract.md), flush and close: what a flush reports depends on what the
 * peer acknowledged, never on when it closed; an orderly close by the peer is told apart from a
 * broken connection; what the peer sent before it closed can still be received.
 */
#include "contract.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ROUNDS   12
#define PUT_LEN  65536
#define TAG_LAST 0x1a57ull
#define ALL      (~0ull)

/* Servers that accept each round's client themselves. */
static const tp_opts_t accept_none = {.accepts = -1};

/* Accept a client and receive its one message (tagged TAG_LAST) on the new endpoint. */
static xfer_endpoint_t *accept_last_message(tp_side_t *s)
{
    xfer_endpoint_t *ep = NULL;
    xfer_request_t *req = NULL;
    uint64_t msg;

    TP_CHECK_STATUS(xfer_accept(s->listener, TP_WAIT_MS, &ep), XFER_OK);
    TP_CHECK(TP_POSTED(xfer_tag_recv(s->ctx, ep, TAG_LAST, ALL, &msg, sizeof(msg), NULL, NULL,
                                     NULL, &req)), "recv");
    TP_CHECK_STATUS(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
    xfer_request_release(req);
    return ep;
}

/* Accept ROUNDS clients; from each receive one message and close at once, in order. */
static int srv_close_on_last_message(tp_side_t *s)
{
    static uint8_t region[PUT_LEN];
    xfer_mem_t *mem = ct_offer(s, region, sizeof(region));

    for (int r = 0; r < ROUNDS; r++) {
        xfer_endpoint_close(accept_last_message(s));
    }
    TP_CHECK_STATUS(xfer_mem_deregister(mem), XFER_OK);
    return 0;
}

/* A client puts, flushes, sends its last message and flushes again; the server closes its
 * endpoint in order the moment that message arrives. The message reached the peer, so the
 * second flush succeeds as the first did - on every transport, every time - and the endpoint
 * then says that the peer closed in order. */
Test(contract, a_flush_succeeds_when_the_peer_received_everything_before_closing)
{
    static uint8_t src[PUT_LEN];
    xfer_context_t *ctx;
    xfer_mem_t *mem;
    void *blob;
    size_t len;
    tp_peer_t p;

    tp_server_spawn(&p, srv_close_on_last_message, NULL, &accept_none);
    ctx  = tp_context(0);
    blob = tp_recv_blob(&p, &len);
    cr_assert_eq(xfer_mem_register(ctx, src, sizeof(src), XFER_MEM_HOST, &mem), XFER_OK);
    for (int r = 0; r < ROUNDS; r++) {
        xfer_endpoint_t *ep = tp_connect(ctx, &p);
        uint64_t last       = r;
        xfer_rkey_t *rkey;

        cr_assert_eq(xfer_rkey_unpack(ep, blob, len, &rkey), XFER_OK);
        tp_fill_pattern(src, sizeof(src), r);
        cr_assert_eq(ct_put(ep, src, sizeof(src), mem, xfer_rkey_address(rkey), rkey), XFER_OK);
        cr_assert_eq(tp_flush(ep, TP_WAIT_MS), XFER_OK, "round %d: the first flush", r);
        cr_assert_eq(ct_send(ep, TAG_LAST, &last, sizeof(last)), XFER_OK);
        cr_assert_eq(tp_flush(ep, TP_WAIT_MS), XFER_OK, "round %d: the flush after the last "
                     "message", r);
        cr_assert_eq(ct_status_change(ctx, ep, TP_WAIT_MS), XFER_ERR_PEER_CLOSED, "round %d", r);
        xfer_rkey_destroy(rkey);
        xfer_endpoint_close(ep);
    }
    free(blob);
    cr_assert_eq(xfer_mem_deregister(mem), XFER_OK);
    xfer_context_destroy(ctx);
    tp_child_expect_ok(&p, 60);
}

/* Accept ROUNDS clients; from each receive one message, then (the client closes in order right
 * after sending it) flush: nothing this side sent is outstanding, so the flush succeeds. */
static int srv_flush_after_peer_close(tp_side_t *s)
{
    for (int r = 0; r < ROUNDS; r++) {
        xfer_endpoint_t *ep = accept_last_message(s);

        /* let the peer's close arrive (or not): the answer must not depend on it */
        tp_progress_for(s->ctx, (r % 3) * 5);
        TP_CHECK_STATUS(tp_flush(ep, TP_WAIT_MS), XFER_OK);
        TP_CHECK_STATUS(ct_status_change(s->ctx, ep, TP_WAIT_MS), XFER_ERR_PEER_CLOSED);
        TP_CHECK_STATUS(tp_flush(ep, TP_WAIT_MS), XFER_OK);
        xfer_endpoint_close(ep);
    }
    return 0;
}

Test(contract, a_flush_with_nothing_outstanding_succeeds_after_the_peer_closed)
{
    xfer_context_t *ctx;
    tp_peer_t p;

    tp_server_spawn(&p, srv_flush_after_peer_close, NULL, &accept_none);
    ctx = tp_context(0);
    for (int r = 0; r < ROUNDS; r++) {
        xfer_endpoint_t *ep = tp_connect(ctx, &p);
        uint64_t last       = r;

        cr_assert_eq(ct_send(ep, TAG_LAST, &last, sizeof(last)), XFER_OK);
        xfer_endpoint_close(ep);
    }
    xfer_context_destroy(ctx);
    tp_child_expect_ok(&p, 60);
}

/* The server sends MANY messages and closes its endpoint in order; the client, which posted
 * one receive on a tag nobody sends, still receives every message after the close, sees that
 * receive fail with XFER_ERR_PEER_CLOSED, and its posts fail with it too. */
#define MANY 64
static int srv_send_many_and_close(tp_side_t *s)
{
    static uint64_t vals[MANY];     /* a send's buffer is the sender's until it completes:
                                     * each its own, kept until the close has flushed them */
    uint64_t v;

    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
    for (uint64_t i = 0; i < MANY; i++) {
        vals[i] = i;
        TP_CHECK_STATUS(xfer_tag_send(s->ep, 10 + i, &vals[i], sizeof(vals[i]), NULL, NULL,
                                      NULL, NULL), XFER_OK);
    }
    xfer_endpoint_close(s->ep);
    s->ep = NULL;
    return 0;
}

Test(contract, what_the_peer_sent_before_an_orderly_close_is_received_and_the_rest_fails)
{
    xfer_request_t *never = NULL;
    xfer_status_t st;
    uint64_t v;
    tp_peer_t p;

    tp_start(&p, srv_send_many_and_close, NULL);
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 5, ALL, &v, sizeof(v), NULL, NULL, NULL,
                                      &never)));
    tp_send(&p, 1);
    cr_assert_eq(ct_status_change(p.ctx, p.ep, TP_WAIT_MS), XFER_ERR_PEER_CLOSED);
    tp_child_expect_ok(&p, 30);
    for (uint64_t i = 0; i < MANY; i++) {
        xfer_request_t *req = NULL;

        st = xfer_tag_recv(p.ctx, p.ep, 10 + i, ALL, &v, sizeof(v), NULL, NULL, NULL, &req);
        cr_assert(TP_POSTED(st), "message %llu: %s", (unsigned long long)i,
                  xfer_status_string(st));
        cr_assert_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
        cr_assert_eq(v, i);
        xfer_request_release(req);
    }
    cr_assert_eq(xfer_request_wait(never, TP_WAIT_MS), XFER_ERR_PEER_CLOSED);
    xfer_request_release(never);
    cr_assert_eq(xfer_tag_send(p.ep, 1, &v, sizeof(v), NULL, NULL, NULL, NULL),
                 XFER_ERR_PEER_CLOSED);
    st = xfer_tag_recv(p.ctx, p.ep, 999, ALL, &v, sizeof(v), NULL, NULL, NULL, &never);
    cr_assert_eq(st, XFER_ERR_PEER_CLOSED, "%s", xfer_status_string(st));
    xfer_endpoint_close(p.ep);
    xfer_context_destroy(p.ctx);
}

/* A peer that dies is not an orderly close: the endpoint fails with XFER_ERR_CONNECTION. */
static int srv_die(tp_side_t *s)
{
    uint64_t v;

    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
    raise(SIGKILL);
    return 1;
}

Test(contract, a_peer_that_dies_fails_the_endpoint_with_a_connection_error)
{
    xfer_request_t *never = NULL;
    uint64_t v;
    tp_peer_t p;

    tp_start(&p, srv_die, NULL);
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 5, ALL, &v, sizeof(v), NULL, NULL, NULL,
                                      &never)));
    tp_send(&p, 1);
    cr_assert_eq(tp_child_wait(&p, 30), 128 + SIGKILL);
    cr_assert_eq(xfer_request_wait(never, TP_WAIT_MS), XFER_ERR_CONNECTION);
    xfer_request_release(never);
    cr_assert_eq(xfer_endpoint_status(p.ep), XFER_ERR_CONNECTION);
    xfer_endpoint_close(p.ep);
    xfer_context_destroy(p.ctx);
}

/* Post a BIG-byte message (pattern 7), say so, then progress until killed. */
#define BIG (64u << 20)

static int srv_send_big_until_killed(tp_side_t *s)
{
    char *buf = malloc(BIG);
    xfer_request_t *req = NULL;

    TP_CHECK(buf != NULL, "malloc");
    tp_fill_pattern(buf, BIG, 7);
    TP_CHECK(TP_POSTED(xfer_tag_send(s->ep, 1, buf, BIG, NULL, NULL, NULL, &req)), "send");
    TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
    tp_progress_until_ctl(s, TP_WAIT_MS * 3);     /* killed before this returns */
    return 1;
}

/* The sender dies while this side reads its message a slice at a time (XFER_FAIR_SLICE): the
 * receive ends with the endpoint's error, in bounded time, or - where the transport had
 * already moved every byte - whole; never half-filled and reported received; and the
 * endpoint fails with a connection error (C24). */
Test(contract, a_peer_that_dies_in_the_middle_of_a_large_message_fails_the_receive)
{
    char *buf = calloc(1, BIG);
    xfer_request_t *req = NULL;
    xfer_status_t st;
    double t0;
    tp_peer_t p;

    cr_assert(buf != NULL);
    setenv("XFER_FAIR_SLICE", "64k", 0);
    tp_start(&p, srv_send_big_until_killed, NULL);
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 1, ALL, buf, BIG, NULL, NULL, NULL, &req)));
    tp_recv(&p);
    for (int i = 0; i < 4; i++) {
        xfer_progress(p.ctx);
    }
    cr_assert_eq(xfer_request_test(req), XFER_INPROGRESS,
                 "64 MiB cannot have been read in four slices of 64 KiB");
    cr_assert_eq(kill(p.pid, SIGKILL), 0);
    cr_assert_eq(tp_child_wait(&p, 10), 128 + SIGKILL);
    t0 = tp_now_ms();
    st = xfer_request_wait(req, TP_WAIT_MS);
    cr_log_info("the receive ended %s after %.0f ms", xfer_status_string(st),
                tp_now_ms() - t0);
    cr_assert_neq(st, XFER_ERR_TIMEOUT, "the receive still pending after the sender died");
    if (st == XFER_OK) {
        cr_assert_eq(tp_check_pattern(buf, BIG, 7), -1,
                     "a message reported received is not whole");
    } else {
        cr_assert_eq(st, XFER_ERR_CONNECTION, "%s", xfer_status_string(st));
    }
    cr_assert_eq(ct_status_change(p.ctx, p.ep, TP_WAIT_MS), XFER_ERR_CONNECTION);
    xfer_request_release(req);
    xfer_endpoint_close(p.ep);
    tp_another_peer_works(p.ctx, (const size_t[]){100000, 0});
    xfer_context_destroy(p.ctx);
    free(buf);
}

/* The target of the test below: it registers a buffer, sends its key and progresses without
 * taking the notifications that come; at the initiator's word it answers its endpoint's
 * status. */
static int srv_keep_notifications(tp_side_t *s)
{
    static uint8_t region[4096];
    xfer_mem_t *mem = ct_offer(s, region, sizeof(region));
    uint64_t v;

    TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS * 3) == 0, "no word");
    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
    TP_CHECK(tp_ctl_send_u64(s->ctl, (uint64_t)(int64_t)xfer_endpoint_status(s->ep)) == 0,
             "ctl");
    xfer_endpoint_close(s->ep);
    s->ep = NULL;
    TP_CHECK_STATUS(xfer_mem_deregister(mem), XFER_OK);
    return 0;
}

/* An endpoint that fails is closed to its peer at once (C24). The target keeps one
 * notification; the second fails its endpoint (XFER_ERR_NO_RESOURCE, C25). This side, which
 * posts nothing more, hears of it from the closed connection: its endpoint, and the receive
 * pending on it, fail with XFER_ERR_CONNECTION within seconds - not when a timeout of the
 * transport runs out (verbs: its RC retries, made a minute long here). */
Test(contract, an_endpoint_that_fails_is_closed_to_its_peer_at_once)
{
    const double bound_ms = 5000.0 * tp_slowdown();
    uint64_t src = 7, v = 0;
    xfer_batch_desc_t d = {0, 0, sizeof(src)};
    xfer_request_t *never = NULL, *reqs[2] = {NULL, NULL};
    xfer_status_t st;
    xfer_batch_t *b;
    xfer_rkey_t *rkey;
    xfer_mem_t *mem;
    void *blob;
    size_t len;
    double t0;
    tp_peer_t p;

    setenv("XFER_NOTIFY_MAX_QUEUED", "1", 1);
    setenv("XFER_VERBS_TIMEOUT", "8s", 1);
    tp_start(&p, srv_keep_notifications, NULL);
    blob = tp_recv_blob(&p, &len);
    cr_assert_eq(xfer_rkey_unpack(p.ep, blob, len, &rkey), XFER_OK);
    free(blob);
    cr_assert_eq(xfer_mem_register(p.ctx, &src, sizeof(src), XFER_MEM_HOST, &mem), XFER_OK);
    cr_assert_eq(xfer_batch_create(p.ep, XFER_BATCH_PUT, mem, rkey, &d, 1, &b), XFER_OK);
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 5, ALL, &v, sizeof(v), NULL, NULL, NULL,
                                      &never)));
    for (uint32_t i = 0; i < 2; i++) {
        cr_assert_eq(xfer_batch_post(b, &i, sizeof(i), 0, NULL, NULL, &reqs[i]), XFER_OK,
                     "post %u", i);
    }
    t0 = tp_now_ms();
    st = ct_status_change(p.ctx, p.ep, TP_WAIT_MS * 3);
    cr_log_info("this side's endpoint ended %s %.0f ms after the posts",
                xfer_status_string(st), tp_now_ms() - t0);
    cr_assert_eq(st, XFER_ERR_CONNECTION, "%s", xfer_status_string(st));
    cr_assert_lt(tp_now_ms() - t0, bound_ms, "the peer's failed endpoint was not closed to "
                 "this side: it was found only %.0f ms later", tp_now_ms() - t0);
    cr_assert_eq(xfer_request_wait(never, TP_WAIT_MS), XFER_ERR_CONNECTION);
    tp_send(&p, 1);
    cr_assert_eq((xfer_status_t)(int64_t)tp_recv(&p), XFER_ERR_NO_RESOURCE,
                 "the target's endpoint did not fail at its notification bound");
    for (int i = 0; i < 2; i++) {
        (void)xfer_request_wait(reqs[i], TP_WAIT_MS);
        xfer_request_release(reqs[i]);
    }
    xfer_request_release(never);
    cr_assert_eq(xfer_batch_destroy(b), XFER_OK);
    xfer_rkey_destroy(rkey);
    xfer_endpoint_close(p.ep);
    cr_assert_eq(xfer_mem_deregister(mem), XFER_OK);
    tp_another_peer_works(p.ctx, (const size_t[]){100000, 0});
    xfer_context_destroy(p.ctx);
    tp_child_expect_ok(&p, 60);
}

/* C21: an orderly close waits for what is in flight - sends the peer has yet to take, a put
 * not yet acknowledged - delivers it, completes XFER_OK, and the peer then sees the close. */
Test(contract, an_orderly_close_delivers_what_was_in_flight_and_completes_ok)
{
    static const size_t lens[] = {8, 65536, (1u << 20) + 3, 0};
    enum { N = sizeof(lens) / sizeof(lens[0]) };
    tp_calls_t sent[N] = {{0}}, closed = {0};
    xfer_request_t *req = NULL;
    uint8_t *msg[N], *src = malloc(1u << 20);
    xfer_rkey_t *rkey;
    xfer_mem_t *mem;
    tp_peer_t p;

    cr_assert_not_null(src);
    rkey = ct_start(&p);
    cr_assert_eq(xfer_mem_register(p.ctx, src, 1u << 20, XFER_MEM_HOST, &mem), XFER_OK);
    tp_fill_pattern(src, 1u << 20, 500);
    cr_assert_eq(ct_put(p.ep, src, 1u << 20, mem, xfer_rkey_address(rkey) + 4096, rkey),
                 XFER_OK);
    for (int i = 0; i < N; i++) {
        msg[i] = malloc(lens[i] + 1);
        cr_assert_not_null(msg[i]);
        tp_fill_pattern(msg[i], lens[i], 510 + i);
        cr_assert_eq(xfer_tag_send(p.ep, 0xc00 + i, msg[i], lens[i], NULL, tp_calls_cb,
                                   &sent[i], NULL), XFER_OK);
    }
    xfer_rkey_destroy(rkey);
    cr_assert_eq(xfer_endpoint_close_nb(p.ep, 0, tp_calls_cb, &closed, &req), XFER_OK);
    p.ep = NULL;
    /* the peer takes the messages while the close waits for them */
    for (int i = N - 1; i >= 0; i--) {
        cr_assert_eq(ct_do(&p, CT_RECV, 0xc00 + i, lens[i], 510 + i), 0, "message %d", i);
    }
    cr_assert_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
    cr_assert_eq(closed.calls, 1);
    xfer_request_release(req);
    for (int i = 0; i < N; i++) {
        cr_assert_eq(sent[i].calls, 1);
        cr_assert_eq(sent[i].status, XFER_OK, "send %d: %s", i,
                     xfer_status_string(sent[i].status));
        free(msg[i]);
    }
    cr_assert_eq(ct_do(&p, CT_CHECK, 4096, 1u << 20, 500), 0, "the put before the close");
    cr_assert_eq(ct_do(&p, CT_FAILED, 0, 0, 0), (uint64_t)(int64_t)XFER_ERR_PEER_CLOSED);
    cr_assert_eq(xfer_mem_deregister(mem), XFER_OK);
    free(src);
    cr_assert_eq(ct_do(&p, CT_STOP, 0, 0, 0), 0);
    tp_finish(&p);
}

/* Post a send of len bytes to a stopped peer - one it cannot take - and a receive nothing
 * will match; close with flags: how long the close took, its status, theirs. */
static double close_with_stopped_peer(tp_peer_t *p, uint32_t flags, size_t len,
                                      xfer_status_t *close_p, tp_calls_t *send_p,
                                      tp_calls_t *recv_p)
{
    uint8_t *big = calloc(1, len);
    tp_calls_t closed = {0};
    xfer_request_t *req = NULL;
    uint64_t never;
    double t0;

    cr_assert_not_null(big);
    cr_assert_eq(kill(p->pid, SIGSTOP), 0);
    cr_assert_eq(xfer_tag_recv(p->ctx, p->ep, 0xd00, ALL, &never, sizeof(never), NULL,
                               tp_calls_cb, recv_p, NULL), XFER_OK);
    cr_assert_eq(xfer_tag_send(p->ep, 0xd01, big, len, NULL, tp_calls_cb, send_p, NULL),
                 XFER_OK);
    tp_progress_for(p->ctx, 50);
    t0 = tp_now_ms();
    cr_assert_eq(xfer_endpoint_close_nb(p->ep, flags, tp_calls_cb, &closed, &req), XFER_OK);
    p->ep    = NULL;
    *close_p = xfer_request_wait(req, TP_WAIT_MS);
    t0       = tp_now_ms() - t0;
    xfer_request_release(req);
    cr_assert_eq(closed.calls, 1);
    cr_assert_eq(kill(p->pid, SIGCONT), 0);
    free(big);
    return t0;
}

/* After close_with_stopped_peer() cut the close short: the send and the receive completed
 * XFER_ERR_CANCELED, the peer (running again) sees a broken connection and never receives
 * the message of the cancelled send. Ends the peer. */
static void expect_cut_short(tp_peer_t *p, const tp_calls_t *send, const tp_calls_t *recv)
{
    cr_assert_eq(send->calls, 1);
    cr_assert_eq(send->status, XFER_ERR_CANCELED, "%s", xfer_status_string(send->status));
    cr_assert_eq(recv->calls, 1);
    cr_assert_eq(recv->status, XFER_ERR_CANCELED, "%s", xfer_status_string(recv->status));
    cr_assert_eq(ct_do(p, CT_FAILED, 0, 0, 0), (uint64_t)(int64_t)XFER_ERR_CONNECTION);
    cr_assert_eq(ct_do(p, CT_RECV, 0xd01, 64u << 20, 0), 1);
    cr_assert_eq(ct_do(p, CT_STOP, 0, 0, 0), 0);
    tp_finish(p);
}

/* C21, C22: an orderly close that cannot flush (the peer is stopped, a large send waits for
 * it) ends at XFER_CLOSE_TIMEOUT with XFER_ERR_TIMEOUT, what it cut short completes
 * XFER_ERR_CANCELED, and the peer sees a broken connection, not an orderly close. */
Test(contract, an_orderly_close_that_cannot_flush_ends_at_its_timeout)
{
    tp_calls_t send = {0}, recv = {0};
    xfer_status_t s;
    double ms;
    tp_peer_t p;

    cr_assert_eq(setenv("XFER_CLOSE_TIMEOUT", "1s", 1), 0);
    xfer_rkey_destroy(ct_start(&p));
    ms = close_with_stopped_peer(&p, 0, 64u << 20, &s, &send, &recv);
    cr_assert_eq(s, XFER_ERR_TIMEOUT, "the close: %s", xfer_status_string(s));
    cr_assert(ms >= 900, "the close ended after %.0f ms, before its timeout", ms);
    cr_assert(ms < 1000 + 2000 * tp_slowdown(), "the close took %.0f ms", ms);
    expect_cut_short(&p, &send, &recv);
}

/* C23, C22: a forced close completes at once, whatever is in flight; its pending operations
 * complete XFER_ERR_CANCELED and the peer sees a broken connection. */
Test(contract, a_forced_close_completes_at_once_and_cancels_what_is_pending)
{
    tp_calls_t send = {0}, recv = {0};
    xfer_status_t s;
    double ms;
    tp_peer_t p;

    xfer_rkey_destroy(ct_start(&p));
    ms = close_with_stopped_peer(&p, XFER_CLOSE_FLAG_FORCE, 64u << 20, &s, &send, &recv);
    cr_assert_eq(s, XFER_OK, "the forced close: %s", xfer_status_string(s));
    cr_assert(ms < 200 * tp_slowdown(), "the forced close took %.0f ms", ms);
    expect_cut_short(&p, &send, &recv);
}

/* C21: closing an endpoint that had failed completes with its error. */
Test(contract, closing_a_failed_endpoint_completes_with_its_error)
{
    xfer_request_t *req = NULL;
    tp_peer_t p;

    xfer_rkey_destroy(ct_start(&p));
    cr_assert_eq(kill(p.pid, SIGKILL), 0);
    cr_assert_eq(tp_child_wait(&p, 30), 128 + SIGKILL);
    cr_assert_eq(ct_status_change(p.ctx, p.ep, TP_WAIT_MS), XFER_ERR_CONNECTION);
    cr_assert_eq(xfer_endpoint_close_nb(p.ep, 0, NULL, NULL, &req), XFER_OK);
    cr_assert_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_ERR_CONNECTION);
    xfer_request_release(req);
    xfer_context_destroy(p.ctx);
}

/* C21, C22: an orderly close that waits for the peer to take a large send ends when the peer
 * closes in order instead, long before XFER_CLOSE_TIMEOUT (10 s here): XFER_OK when the send
 * had finished (its bytes in the transport), else the peer's orderly close for both. */
Test(contract, an_orderly_close_waiting_for_the_peer_ends_when_the_peer_closes)
{
    const size_t len = 4u << 20;
    uint8_t *big     = calloc(1, len);
    tp_calls_t send  = {0}, closed = {0};
    xfer_request_t *req = NULL;
    double t0, ms;
    tp_peer_t p;

    cr_assert_not_null(big);
    xfer_rkey_destroy(ct_start(&p));
    cr_assert_eq(xfer_tag_send(p.ep, 0xe00, big, len, NULL, tp_calls_cb, &send, NULL), XFER_OK);
    tp_progress_for(p.ctx, 20);
    t0 = tp_now_ms();
    cr_assert_eq(xfer_endpoint_close_nb(p.ep, 0, tp_calls_cb, &closed, &req), XFER_OK);
    p.ep = NULL;
    cr_assert_eq(ct_do(&p, CT_STOP, 0, 0, 0), 0);    /* the peer closes in order */
    tp_child_expect_ok(&p, 60);
    (void)xfer_request_wait(req, TP_WAIT_MS);
    ms = tp_now_ms() - t0;
    cr_assert(ms < 5000, "the close ended after %.0f ms, not when the peer closed", ms);
    cr_assert_eq(closed.calls, 1);
    cr_assert_eq(send.calls, 1);
    if (send.status == XFER_OK) {
        cr_assert_eq(closed.status, XFER_OK, "%s", xfer_status_string(closed.status));
    } else {
        cr_assert_eq(send.status, XFER_ERR_PEER_CLOSED, "the send: %s",
                     xfer_status_string(send.status));
        cr_assert_eq(closed.status, XFER_ERR_PEER_CLOSED, "the close: %s",
                     xfer_status_string(closed.status));
    }
    xfer_request_release(req);
    xfer_context_destroy(p.ctx);
    free(big);
}

/* C23: a send that a forced close cancelled gives its buffer back - the caller writes over
 * it at once - and the peer, which may be reading that message right then, receives it
 * whole as it was, or not at all: never with what the buffer held after the cancel. The
 * close comes at a different point of the peer's reading in each round; every other round
 * sends from memory of xfer_mem_alloc(), which a peer on the same host may map and copy. */
Test(contract, a_send_a_forced_close_cancelled_never_arrives_with_what_its_buffer_held_later)
{
    const size_t len = 64u << 20;
    uint8_t *heap    = malloc(len);

    cr_assert_not_null(heap);
    for (unsigned r = 0; r < 8; r++) {
        xfer_request_t *creq = NULL;
        tp_calls_t send      = {0};
        xfer_mem_t *mem      = NULL;
        uint8_t *big         = heap;
        uint64_t answer;
        tp_peer_t p;

        xfer_rkey_destroy(ct_start(&p));
        if (r % 2) {
            cr_assert_eq(xfer_mem_alloc(p.ctx, len, XFER_MEM_HOST, &mem), XFER_OK);
            big = xfer_mem_address(mem);
        }
        tp_fill_pattern(big, len, 600 + r);
        ct_ask(&p, CT_RECV, 0xf00, len, 600 + r);
        cr_assert_eq(xfer_tag_send(p.ep, 0xf00, big, len, mem, tp_calls_cb, &send, NULL),
                     XFER_OK);
        tp_progress_for(p.ctx, (int)r / 2);
        cr_assert_eq(xfer_endpoint_close_nb(p.ep, XFER_CLOSE_FLAG_FORCE, NULL, NULL, &creq),
                     XFER_OK);
        p.ep = NULL;
        cr_assert_eq(xfer_request_wait(creq, TP_WAIT_MS), XFER_OK);
        xfer_request_release(creq);
        cr_assert_eq(send.calls, 1);
        if (send.status != XFER_OK) {
            cr_assert_eq(send.status, XFER_ERR_CANCELED, "%s", xfer_status_string(send.status));
            memset(big, 0xee, len);     /* the buffer is ours again */
        }
        answer = ct_answer(&p);
        cr_assert((answer == 0) || ((answer == 1) && (send.status != XFER_OK)),
                  "round %u: the send %s, the peer's receive %s", r,
                  xfer_status_string(send.status), (answer == 1) ? "failed" : (answer == 2) ?
                  "had another length" : "had other data");
        cr_assert_eq(ct_do(&p, CT_STOP, 0, 0, 0), 0);
        if (mem != NULL) {
            cr_assert_eq(xfer_mem_deregister(mem), XFER_OK);
        }
        tp_finish(&p);
    }
    free(heap);
}

/* ---- a close from a callback while a flush waits for the sends before it ------------------- */

#define ORDER_MAX 8

/* The callbacks that ran, in order: 'r' the receive, 's' the send, 'f' the flush, 'c' the
 * close; and the close the receive's callback posted. */
typedef struct close_order {
    xfer_endpoint_t *ep;
    uint32_t        flags;
    xfer_status_t   close_posted;
    xfer_request_t  *close_req;
    int             n;
    char            seen[ORDER_MAX + 1];
    xfer_status_t   status[ORDER_MAX];
} close_order_t;

static void order_add(close_order_t *o, char what, xfer_status_t status)
{
    if (o->n < ORDER_MAX) {
        o->seen[o->n]   = what;
        o->status[o->n] = status;
    }
    o->n++;
}

static void send_cb(xfer_request_t *req, xfer_status_t status, void *arg)
{
    order_add(arg, 's', status);
}

static void flush_cb(xfer_request_t *req, xfer_status_t status, void *arg)
{
    order_add(arg, 'f', status);
}

static void close_cb(xfer_request_t *req, xfer_status_t status, void *arg)
{
    order_add(arg, 'c', status);
}

/* The receive's callback closes the endpoint, inside progress, while the flush waits. */
static void recv_then_close_cb(xfer_request_t *req, xfer_status_t status, void *arg)
{
    close_order_t *o = arg;

    order_add(o, 'r', status);
    o->close_posted = xfer_endpoint_close_nb(o->ep, o->flags, close_cb, o, &o->close_req);
}

static xfer_status_t order_status(const close_order_t *o, char what)
{
    for (int i = 0; (i < o->n) && (i < ORDER_MAX); i++) {
        if (o->seen[i] == what) {
            return o->status[i];
        }
    }
    return XFER_ERR_INTERNAL;
}

/* A 64 MiB send the peer has not taken, a flush behind it, and a receive whose callback
 * closes the endpoint with flags once the peer's message arrives; with take, the peer then
 * receives the send. Returns the callbacks' order; the peer's receive's answer in *took. */
static void close_from_a_callback(uint32_t flags, int take, close_order_t *o, uint64_t *took)
{
    const size_t len    = 64u << 20;
    uint8_t *big        = malloc(len);
    xfer_request_t *sreq = NULL, *freq = NULL, *rreq = NULL;
    uint64_t msg[8];
    tp_peer_t p;

    cr_assert_not_null(big);
    memset(o, 0, sizeof(*o));
    o->flags = flags;
    xfer_rkey_destroy(ct_start(&p));
    o->ep = p.ep;
    tp_fill_pattern(big, len, 0xc10);
    cr_assert(TP_POSTED(xfer_tag_send(p.ep, 0xf10, big, len, NULL, send_cb, o, &sreq)));
    tp_progress_for(p.ctx, 20);
    cr_assert(TP_POSTED(xfer_endpoint_flush(p.ep, flush_cb, o, &freq)));
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 0xa11, ALL, msg, sizeof(msg), NULL,
                                      recv_then_close_cb, o, &rreq)));
    tp_progress_for(p.ctx, 20);
    cr_assert_eq(o->n, 0, "the send or the flush ended before the peer took the send (%s)",
                 o->seen);
    cr_assert_eq(ct_do(&p, CT_SEND, 0xa11, sizeof(msg), 1), 0);
    for (double t0 = tp_now_ms(); (o->close_req == NULL) && (tp_now_ms() - t0 < TP_WAIT_MS);) {
        xfer_progress(p.ctx);
    }
    cr_assert_eq(o->close_posted, XFER_OK, "the close from the callback: %s",
                 xfer_status_string(o->close_posted));
    cr_assert_not_null(o->close_req);
    p.ep = NULL;
    if (take) {
        ct_ask(&p, CT_RECV, 0xf10, len, 0xc10);
    }
    (void)xfer_request_wait(o->close_req, TP_WAIT_MS);
    *took = take ? ct_answer(&p) : 0;
    cr_assert_eq(ct_do(&p, CT_STOP, 0, 0, 0), 0);
    tp_child_expect_ok(&p, 60);
    xfer_request_release(o->close_req);
    xfer_request_release(rreq);
    xfer_request_release(freq);
    xfer_request_release(sreq);
    xfer_context_destroy(p.ctx);
    free(big);
}

/* C19, C23: a forced close from a callback, while a flush waits for a send the peer has not
 * taken, cancels both, and their callbacks run before the close's - the send's before the
 * flush's, which covers it. */
Test(contract, a_forced_close_from_a_callback_cancels_a_waiting_flush_and_its_send_first)
{
    close_order_t o;
    uint64_t took;

    close_from_a_callback(XFER_CLOSE_FLAG_FORCE, 0, &o, &took);
    cr_assert_eq(o.n, 4, "callbacks %s", o.seen);
    cr_assert_str_eq(o.seen, "rsfc");
    cr_assert_eq(order_status(&o, 'r'), XFER_OK);
    cr_assert_eq(order_status(&o, 's'), XFER_ERR_CANCELED, "the send: %s",
                 xfer_status_string(order_status(&o, 's')));
    cr_assert_eq(order_status(&o, 'f'), XFER_ERR_CANCELED, "the flush: %s",
                 xfer_status_string(order_status(&o, 'f')));
    cr_assert_eq(order_status(&o, 'c'), XFER_OK, "the close: %s",
                 xfer_status_string(order_status(&o, 'c')));
}

/* C19, C21: an orderly close from a callback, while a flush waits for a send the peer has not
 * taken, waits too; once the peer takes the send, the send, the flush and then the close
 * complete XFER_OK, and the peer has the message whole. */
Test(contract, an_orderly_close_from_a_callback_waits_for_the_flush_that_waits_for_a_send)
{
    close_order_t o;
    uint64_t took;

    close_from_a_callback(0, 1, &o, &took);
    cr_assert_eq(took, 0, "the peer's receive of the send: %llu", (unsigned long long)took);
    cr_assert_eq(o.n, 4, "callbacks %s", o.seen);
    cr_assert_str_eq(o.seen, "rsfc");
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(o.status[i], XFER_OK, "callback %c: %s", o.seen[i],
                     xfer_status_string(o.status[i]));
    }
}

/* C19, C24: a flush waiting for a send the peer has not taken fails with the endpoint when
 * the peer dies - after the send, which it covers. */
Test(contract, a_flush_waiting_for_a_send_fails_after_it_when_the_peer_dies)
{
    const size_t len     = 64u << 20;
    uint8_t *big         = calloc(1, len);
    xfer_request_t *sreq = NULL, *freq = NULL;
    close_order_t o;
    tp_peer_t p;

    cr_assert_not_null(big);
    memset(&o, 0, sizeof(o));
    xfer_rkey_destroy(ct_start(&p));
    cr_assert(TP_POSTED(xfer_tag_send(p.ep, 0xf10, big, len, NULL, send_cb, &o, &sreq)));
    tp_progress_for(p.ctx, 20);
    cr_assert(TP_POSTED(xfer_endpoint_flush(p.ep, flush_cb, &o, &freq)));
    tp_progress_for(p.ctx, 20);
    cr_assert_eq(o.n, 0, "the send or the flush ended before the peer died (%s)", o.seen);
    cr_assert_eq(kill(p.pid, SIGKILL), 0);
    cr_assert_eq(tp_child_wait(&p, 30), 128 + SIGKILL);
    for (double t0 = tp_now_ms(); (o.n < 2) && (tp_now_ms() - t0 < TP_WAIT_MS);) {
        xfer_progress(p.ctx);
    }
    cr_assert_str_eq(o.seen, "sf");
    cr_assert_eq(o.status[0], XFER_ERR_CONNECTION, "the send: %s",
                 xfer_status_string(o.status[0]));
    cr_assert_eq(o.status[1], XFER_ERR_CONNECTION, "the flush: %s",
                 xfer_status_string(o.status[1]));
    xfer_request_release(freq);
    xfer_request_release(sreq);
    xfer_endpoint_close(p.ep);
    xfer_context_destroy(p.ctx);
    free(big);
}
