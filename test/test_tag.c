/*
 * Tagged messages between real processes: exact and masked matching, receives posted before
 * and after the message (the unexpected queue), one endpoint versus any, per-peer order over
 * 1000 messages of mixed sizes, truncation, zero-length and 32 MiB messages, the sender's tag,
 * cancellation, and the request contract (callbacks exactly once, self-releasing requests,
 * callbacks that post). Every payload is a pattern checked byte for byte.
 */
#include "test_peer.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void setup(void)
{
    tp_env();
}

TestSuite(tag, .init = setup, .timeout = 120);

#define ALL      (~0ull)
#define SENTINEL ((void*)0x5e47)

/* ---- helpers for both sides ------------------------------------------------------------------ */

typedef struct msg {
    xfer_request_t *req;
    char           *buf;
    size_t         len;
} msg_t;

/* Post a send of len bytes of pattern(seed). Returns the posting status. */
static xfer_status_t send_post(xfer_endpoint_t *ep, uint64_t tag, size_t len, uint64_t seed,
                               xfer_mem_t *mem, msg_t *m)
{
    m->req = NULL;
    m->len = len;
    m->buf = malloc(len ? len : 1);
    tp_fill_pattern(m->buf, len, seed);
    return xfer_tag_send(ep, tag, m->buf, len, mem, NULL, NULL, &m->req);
}

static xfer_status_t msg_wait(msg_t *m, int timeout_ms)
{
    xfer_status_t s = xfer_request_wait(m->req, timeout_ms);

    xfer_request_release(m->req);
    free(m->buf);
    m->req = NULL;
    m->buf = NULL;
    return s;
}

static xfer_status_t recv_post(xfer_context_t *ctx, xfer_endpoint_t *ep, uint64_t tag,
                               uint64_t mask, size_t cap, msg_t *m)
{
    m->req = NULL;
    m->len = cap;
    m->buf = calloc(1, cap ? cap : 1);
    return xfer_tag_recv(ctx, ep, tag, mask, m->buf, cap, NULL, NULL, NULL, &m->req);
}

/* ---- the child's side ------------------------------------------------------------------------ */

static void child_send(tp_side_t *s, uint64_t tag, size_t len, uint64_t seed, msg_t *m)
{
    xfer_status_t st = send_post(s->ep, tag, len, seed, NULL, m);

    TP_CHECK(TP_POSTED(st), "tag_send(tag %#llx, %zu bytes): %s", (unsigned long long)tag, len,
             xfer_status_string(st));
}

static void child_wait_sends(msg_t *m, int n)
{
    for (int i = 0; i < n; i++) {
        TP_CHECK_STATUS(msg_wait(&m[i], TP_WAIT_MS), XFER_OK);
    }
}

static void child_await_word(tp_side_t *s)
{
    uint64_t v;

    TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS) == 0, "no word from the parent");
    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
}

/* ---- the parent's side ----------------------------------------------------------------------- */

/* Receive on ep (NULL: any) and check status, length, sender's tag and pattern. */
static void expect_msg(tp_peer_t *p, xfer_endpoint_t *ep, uint64_t tag, uint64_t mask,
                       size_t cap, xfer_status_t want, size_t want_len, uint64_t want_tag,
                       uint64_t seed)
{
    msg_t m;
    xfer_status_t s = recv_post(p->ctx, ep, tag, mask, cap, &m);

    cr_assert(TP_POSTED(s), "tag_recv: %s", xfer_status_string(s));
    s = xfer_request_wait(m.req, TP_WAIT_MS);
    cr_assert_eq(s, want, "receive of tag %#llx/%#llx: %s, expected %s", (unsigned long long)tag,
                 (unsigned long long)mask, xfer_status_string(s), xfer_status_string(want));
    cr_assert_eq(xfer_request_length(m.req), want_len, "length %zu, expected %zu",
                 xfer_request_length(m.req), want_len);
    cr_assert_eq(xfer_request_tag(m.req), want_tag, "sender's tag %#llx, expected %#llx",
                 (unsigned long long)xfer_request_tag(m.req), (unsigned long long)want_tag);
    if (want == XFER_OK) {
        ssize_t bad = tp_check_pattern(m.buf, want_len, seed);
        cr_assert_eq(bad, -1, "%zu-byte message: byte %zd is wrong", want_len, bad);
    }
    xfer_request_release(m.req);
    free(m.buf);
}

/* ---- matching -------------------------------------------------------------------------------- */

static int srv_exact(tp_side_t *s)
{
    msg_t m[2];

    child_send(s, 0x1235, 32, 2, &m[0]);
    child_send(s, 0x1234, 64, 1, &m[1]);
    child_wait_sends(m, 2);
    child_await_word(s);
    return 0;
}

Test(tag, exact_match_takes_the_right_message)
{
    tp_peer_t p;

    tp_start(&p, srv_exact, NULL);
    expect_msg(&p, p.ep, 0x1234, ALL, 256, XFER_OK, 64, 0x1234, 1);
    expect_msg(&p, p.ep, 0x1235, ALL, 256, XFER_OK, 32, 0x1235, 2);
    tp_send(&p, 0);
    tp_finish(&p);
}

static int srv_mask(tp_side_t *s)
{
    msg_t m[3];

    child_send(s, 0xAB01, 100, 1, &m[0]);
    child_send(s, 0xCD02, 100, 2, &m[1]);
    child_send(s, 0xEF03, 100, 3, &m[2]);
    child_wait_sends(m, 3);
    child_await_word(s);
    return 0;
}

Test(tag, mask_selects_the_bits_that_must_match)
{
    tp_peer_t p;

    tp_start(&p, srv_mask, NULL);
    /* bits of the receive's tag outside the mask do not matter */
    expect_msg(&p, p.ep, 0x7702, 0xFF, 256, XFER_OK, 100, 0xCD02, 2);
    expect_msg(&p, p.ep, 0xAB00, 0xFF00, 256, XFER_OK, 100, 0xAB01, 1);
    /* mask 0 matches anything */
    expect_msg(&p, p.ep, 0x1, 0, 256, XFER_OK, 100, 0xEF03, 3);
    tp_send(&p, 0);
    tp_finish(&p);
}

static int srv_full_tags(tp_side_t *s)
{
    msg_t m[2];

    child_send(s, 0xFEDCBA9876543210ull, 10, 1, &m[0]);
    child_send(s, 0x0123456789ABCDEFull, 20, 2, &m[1]);
    child_wait_sends(m, 2);
    child_await_word(s);
    return 0;
}

Test(tag, request_tag_is_the_senders_full_64_bit_tag)
{
    tp_peer_t p;

    tp_start(&p, srv_full_tags, NULL);
    expect_msg(&p, p.ep, 0, 0, 64, XFER_OK, 10, 0xFEDCBA9876543210ull, 1);
    expect_msg(&p, NULL, 0x0123456789ABCDEFull, ALL, 64, XFER_OK, 20, 0x0123456789ABCDEFull, 2);
    tp_send(&p, 0);
    tp_finish(&p);
}

/* ---- expected and unexpected ----------------------------------------------------------------- */

#define BIG (4u << 20)

/* On "go": a small and a large message; then "sent" once both are posted. */
static int srv_on_go(tp_side_t *s)
{
    msg_t m[2];

    child_await_word(s);
    child_send(s, 5, 64, 51, &m[0]);
    child_send(s, 6, BIG, 52, &m[1]);
    TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
    child_wait_sends(m, 2);
    child_await_word(s);
    return 0;
}

Test(tag, receive_posted_before_the_message)
{
    tp_peer_t p;
    msg_t small, big;

    tp_start(&p, srv_on_go, NULL);
    cr_assert(TP_POSTED(recv_post(p.ctx, p.ep, 6, ALL, BIG, &big)));
    cr_assert(TP_POSTED(recv_post(p.ctx, p.ep, 5, ALL, 64, &small)));
    cr_assert_eq(xfer_request_wait(small.req, 200), XFER_ERR_TIMEOUT);
    cr_assert_eq(xfer_request_test(big.req), XFER_INPROGRESS);
    tp_send(&p, 1);
    cr_assert_eq(tp_recv(&p), 1);
    cr_assert_eq(xfer_request_wait(small.req, TP_WAIT_MS), XFER_OK);
    cr_assert_eq(xfer_request_wait(big.req, TP_WAIT_MS), XFER_OK);
    cr_assert_eq(tp_check_pattern(small.buf, 64, 51), -1);
    cr_assert_eq(tp_check_pattern(big.buf, BIG, 52), -1);
    cr_assert_eq(xfer_request_length(big.req), BIG);
    msg_wait(&small, 0);
    msg_wait(&big, 0);
    tp_send(&p, 0);
    tp_finish(&p);
}

Test(tag, message_before_the_receive_waits_in_the_unexpected_queue)
{
    tp_peer_t p;

    tp_start(&p, srv_on_go, NULL);
    tp_send(&p, 1);
    cr_assert_eq(tp_recv(&p), 1);
    /* let both arrive with nothing posted */
    tp_progress_for(p.ctx, 300);
    expect_msg(&p, p.ep, 6, ALL, BIG, XFER_OK, BIG, 6, 52);
    expect_msg(&p, NULL, 5, ALL, 64, XFER_OK, 64, 5, 51);
    tp_send(&p, 0);
    tp_finish(&p);
}

/* Two server processes; each sends tag 7 with pattern (index * 10 + n) for the n-th "go". */
static int srv_two(tp_side_t *s)
{
    for (int n = 1;; n++) {
        uint64_t v;
        msg_t m;

        TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS) == 0, "no word from the parent");
        TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
        if (v == 0) {
            return 0;
        }
        child_send(s, 7, 64, (uint64_t)s->index * 10 + n, &m);
        TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
        child_wait_sends(&m, 1);
    }
}

Test(tag, receive_from_one_endpoint_or_from_any)
{
    tp_opts_t oa = {.index = 1}, ob = {.index = 2};
    tp_peer_t a, b;
    xfer_endpoint_t *ep_b;
    msg_t only_a;

    tp_start_opts(&a, srv_two, NULL, &oa, 0);
    tp_server_spawn(&b, srv_two, NULL, &ob);
    ep_b = tp_connect(a.ctx, &b);

    /* A's message arrives first, then B's; both wait unexpected */
    tp_send(&a, 1);
    cr_assert_eq(tp_recv(&a), 1);
    tp_progress_for(a.ctx, 200);
    tp_send(&b, 1);
    cr_assert_eq(tp_recv(&b), 1);
    tp_progress_for(a.ctx, 200);
    expect_msg(&a, ep_b, 7, ALL, 64, XFER_OK, 64, 7, 21);   /* from B only, though A's is older */
    expect_msg(&a, NULL, 7, ALL, 64, XFER_OK, 64, 7, 11);   /* any: what is left, A's */

    /* a receive for A does not take B's next message; one for any does */
    cr_assert(TP_POSTED(recv_post(a.ctx, a.ep, 7, ALL, 64, &only_a)));
    tp_send(&b, 1);
    cr_assert_eq(tp_recv(&b), 1);
    tp_progress_for(a.ctx, 200);
    cr_assert_eq(xfer_request_test(only_a.req), XFER_INPROGRESS,
                 "a receive for A's endpoint matched B's message");
    expect_msg(&a, NULL, 7, ALL, 64, XFER_OK, 64, 7, 22);
    /* and A's next message goes to the receive for A */
    tp_send(&a, 1);
    cr_assert_eq(tp_recv(&a), 1);
    cr_assert_eq(xfer_request_wait(only_a.req, TP_WAIT_MS), XFER_OK);
    cr_assert_eq(tp_check_pattern(only_a.buf, 64, 12), -1);
    msg_wait(&only_a, 0);

    tp_send(&a, 0);
    tp_send(&b, 0);
    xfer_endpoint_close(ep_b);
    tp_child_expect_ok(&b, 30);
    tp_finish(&a);
}

/* ---- order ----------------------------------------------------------------------------------- */

#define NORDER 1000

static size_t order_size(int i)
{
    return (i % 10 == 0) ? 65536 + (size_t)i : 8 + ((size_t)i * 37) % 3000;
}

static int srv_order(tp_side_t *s)
{
    static msg_t m[NORDER];

    for (int i = 0; i < NORDER; i++) {
        child_send(s, 42, order_size(i), 1000 + i, &m[i]);
    }
    child_wait_sends(m, NORDER);
    child_await_word(s);
    return 0;
}

Test(tag, messages_from_one_peer_match_in_send_order)
{
    static msg_t m[NORDER];
    tp_peer_t p;

    tp_start(&p, srv_order, NULL);
    /* half posted ahead (racing the arrivals), the rest after they wait unexpected */
    for (int i = 0; i < NORDER / 2; i++) {
        cr_assert(TP_POSTED(recv_post(p.ctx, p.ep, 42, ALL, order_size(i), &m[i])));
    }
    for (int i = 0; i < NORDER / 2; i++) {
        cr_assert_eq(xfer_request_wait(m[i].req, TP_WAIT_MS), XFER_OK, "message %d: %s", i,
                     xfer_status_string(xfer_request_test(m[i].req)));
    }
    tp_progress_for(p.ctx, 300);
    for (int i = NORDER / 2; i < NORDER; i++) {
        cr_assert(TP_POSTED(recv_post(p.ctx, p.ep, 42, ALL, order_size(i), &m[i])));
    }
    for (int i = 0; i < NORDER; i++) {
        xfer_status_t s = xfer_request_wait(m[i].req, TP_WAIT_MS);
        ssize_t bad;

        cr_assert_eq(s, XFER_OK, "message %d (%zu bytes): %s", i, order_size(i),
                     xfer_status_string(s));
        cr_assert_eq(xfer_request_length(m[i].req), order_size(i), "message %d", i);
        bad = tp_check_pattern(m[i].buf, order_size(i), 1000 + i);
        cr_assert_eq(bad, -1, "receive %d got another message (byte %zd differs)", i, bad);
        msg_wait(&m[i], 0);
    }
    tp_send(&p, 0);
    tp_finish(&p);
}

static int srv_interleaved(tp_side_t *s)
{
    msg_t m[4];

    child_send(s, 1, 50, 1, &m[0]);
    child_send(s, 2, 60, 2, &m[1]);
    child_send(s, 1, 70, 3, &m[2]);
    child_send(s, 2, 80, 4, &m[3]);
    TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
    child_wait_sends(m, 4);
    child_await_word(s);
    return 0;
}

Test(tag, the_oldest_matching_unexpected_message_wins)
{
    tp_peer_t p;

    tp_start(&p, srv_interleaved, NULL);
    cr_assert_eq(tp_recv(&p), 1);
    tp_progress_for(p.ctx, 200);
    expect_msg(&p, p.ep, 2, ALL, 256, XFER_OK, 60, 2, 2);
    expect_msg(&p, p.ep, 0, 0, 256, XFER_OK, 50, 1, 1);
    expect_msg(&p, NULL, 0, 0, 256, XFER_OK, 70, 1, 3);
    expect_msg(&p, p.ep, 2, ALL, 256, XFER_OK, 80, 2, 4);
    tp_send(&p, 0);
    tp_finish(&p);
}

/* ---- truncation, zero length, large ---------------------------------------------------------- */

static int srv_truncation(tp_side_t *s)
{
    msg_t m[4];

    child_send(s, 5, 1000, 1, &m[0]);
    child_send(s, 5, 100, 2, &m[1]);
    child_send(s, 6, BIG, 3, &m[2]);
    child_send(s, 6, 1 << 20, 4, &m[3]);
    /* the sends complete (the status of a truncated one is the receiver's business) */
    for (int i = 0; i < 4; i++) {
        xfer_status_t st = msg_wait(&m[i], TP_WAIT_MS);
        TP_CHECK(st != XFER_ERR_TIMEOUT, "send %d never completed", i);
        TP_CHECK((i % 2 == 0) || (st == XFER_OK), "send %d: %s", i, xfer_status_string(st));
    }
    child_await_word(s);
    return 0;
}

static void expect_truncated(tp_peer_t *p, uint64_t tag, size_t cap, size_t msg_len)
{
    size_t canary = 4096;
    char *buf     = malloc(cap + canary);
    xfer_request_t *req = NULL;
    xfer_status_t s;

    memset(buf, 0xA5, cap + canary);
    s = xfer_tag_recv(p->ctx, p->ep, tag, ALL, buf, cap, NULL, NULL, NULL, &req);
    cr_assert(TP_POSTED(s));
    s = xfer_request_wait(req, TP_WAIT_MS);
    cr_assert_eq(s, XFER_ERR_TRUNCATED, "%zu bytes into %zu: %s", msg_len, cap,
                 xfer_status_string(s));
    cr_assert_eq(xfer_request_length(req), msg_len,
                 "xfer_request_length gives the message's length (%zu), not %zu", msg_len,
                 xfer_request_length(req));
    cr_assert_eq(xfer_request_tag(req), tag);
    for (size_t i = cap; i < cap + canary; i++) {
        cr_assert_eq((uint8_t)buf[i], 0xA5, "a truncated receive wrote past its buffer (at +%zu)",
                     i - cap);
    }
    xfer_request_release(req);
    free(buf);
}

Test(tag, truncation_reports_the_message_length_and_spares_the_next)
{
    tp_peer_t p;

    tp_start(&p, srv_truncation, NULL);
    expect_truncated(&p, 5, 500, 1000);
    expect_msg(&p, p.ep, 5, ALL, 2000, XFER_OK, 100, 5, 2);
    expect_truncated(&p, 6, 1 << 20, BIG);
    expect_msg(&p, p.ep, 6, ALL, 2 << 20, XFER_OK, 1 << 20, 6, 4);
    tp_send(&p, 0);
    tp_finish(&p);
}

static int srv_zero(tp_side_t *s)
{
    msg_t m[3];

    child_send(s, 9, 0, 0, &m[0]);
    child_send(s, 9, 0, 0, &m[1]);
    child_send(s, 10, 16, 3, &m[2]);
    child_wait_sends(m, 3);
    child_await_word(s);
    return 0;
}

Test(tag, zero_length_messages)
{
    tp_peer_t p;

    tp_start(&p, srv_zero, NULL);
    expect_msg(&p, p.ep, 9, ALL, 64, XFER_OK, 0, 9, 0);
    expect_msg(&p, p.ep, 9, ALL, 0, XFER_OK, 0, 9, 0);      /* into a zero-length buffer */
    expect_msg(&p, p.ep, 10, ALL, 16, XFER_OK, 16, 10, 3);  /* the next one is intact */
    tp_send(&p, 0);
    tp_finish(&p);
}

#define HUGE (32u << 20)

static int srv_large(tp_side_t *s)
{
    xfer_mem_t *mem;
    msg_t m[2];

    child_send(s, 1, HUGE, 77, &m[0]);
    child_wait_sends(m, 1);
    /* the same with a registered buffer */
    m[1].buf = malloc(HUGE);
    tp_fill_pattern(m[1].buf, HUGE, 78);
    TP_CHECK_STATUS(xfer_mem_register(s->ctx, m[1].buf, HUGE, XFER_MEM_HOST, &mem), XFER_OK);
    m[1].req = NULL;
    TP_CHECK(TP_POSTED(xfer_tag_send(s->ep, 2, m[1].buf, HUGE, mem, NULL, NULL, &m[1].req)),
             "send");
    TP_CHECK_STATUS(xfer_request_wait(m[1].req, TP_WAIT_MS), XFER_OK);
    xfer_request_release(m[1].req);
    TP_CHECK_STATUS(xfer_mem_deregister(mem), XFER_OK);
    free(m[1].buf);
    child_await_word(s);
    return 0;
}

Test(tag, large_32_mib_messages_with_and_without_registration)
{
    tp_peer_t p;
    char *buf = malloc(HUGE);
    xfer_request_t *req = NULL;
    xfer_mem_t *mem;

    tp_start(&p, srv_large, NULL);
    expect_msg(&p, p.ep, 1, ALL, HUGE, XFER_OK, HUGE, 1, 77);
    cr_assert_eq(xfer_mem_register(p.ctx, buf, HUGE, XFER_MEM_HOST, &mem), XFER_OK);
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 2, ALL, buf, HUGE, mem, NULL, NULL, &req)));
    cr_assert_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
    cr_assert_eq(xfer_request_length(req), HUGE);
    cr_assert_eq(tp_check_pattern(buf, HUGE, 78), -1);
    xfer_request_release(req);
    cr_assert_eq(xfer_mem_deregister(mem), XFER_OK);
    free(buf);
    tp_send(&p, 0);
    tp_finish(&p);
}

/* ---- cancel ---------------------------------------------------------------------------------- */

typedef struct slot {
    int            calls;
    xfer_status_t  status;
    xfer_request_t *req;
    size_t         length;
    uint64_t       tag;
} slot_t;

static void slot_cb(xfer_request_t *req, xfer_status_t status, void *arg)
{
    slot_t *s = arg;

    s->calls++;
    s->status = status;
    s->req    = req;
    s->length = xfer_request_length(req);
    s->tag    = xfer_request_tag(req);
}

/* On each "go" with value n > 0: one message of tag 11 and pattern n. */
static int srv_on_demand(tp_side_t *s)
{
    for (;;) {
        uint64_t v;
        msg_t m;

        TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS) == 0, "no word from the parent");
        TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
        if (v == 0) {
            return 0;
        }
        child_send(s, 11, 256, v, &m);
        TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
        child_wait_sends(&m, 1);
    }
}

Test(tag, cancel_of_a_posted_receive_loses_no_message)
{
    tp_peer_t p;
    slot_t one = {0}, any = {0};
    xfer_request_t *r1 = NULL, *r2 = NULL;
    char buf[256];

    tp_start(&p, srv_on_demand, NULL);
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 11, ALL, buf, sizeof(buf), NULL, slot_cb,
                                      &one, &r1)));
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, NULL, 11, ALL, buf, sizeof(buf), NULL, slot_cb,
                                      &any, &r2)));
    cr_assert_eq(xfer_request_test(r1), XFER_INPROGRESS);
    cr_expect_eq(xfer_request_cancel(r1), XFER_OK);
    cr_expect_eq(xfer_request_cancel(r2), XFER_OK);
    cr_assert_eq(xfer_request_wait(r1, TP_WAIT_MS), XFER_ERR_CANCELED);
    cr_assert_eq(xfer_request_wait(r2, TP_WAIT_MS), XFER_ERR_CANCELED);
    tp_progress_for(p.ctx, 20);
    cr_expect_eq(one.calls, 1, "the callback of a cancelled receive is called once");
    cr_expect_eq(one.status, XFER_ERR_CANCELED);
    cr_expect_eq(any.calls, 1);
    /* cancelling a completed request leaves it as it is */
    xfer_request_cancel(r1);
    cr_expect_eq(xfer_request_test(r1), XFER_ERR_CANCELED);
    tp_progress_for(p.ctx, 20);
    cr_expect_eq(one.calls, 1);
    xfer_request_release(r1);
    xfer_request_release(r2);

    /* the message sent afterwards reaches the next receive */
    tp_send(&p, 5);
    cr_assert_eq(tp_recv(&p), 1);
    tp_progress_for(p.ctx, 100);
    expect_msg(&p, p.ep, 11, ALL, 256, XFER_OK, 256, 11, 5);

    /* a completed receive is left as it is by a cancel */
    memset(&one, 0, sizeof(one));
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 11, ALL, buf, sizeof(buf), NULL, slot_cb,
                                      &one, &r1)));
    tp_send(&p, 6);
    cr_assert_eq(tp_recv(&p), 1);
    cr_assert_eq(xfer_request_wait(r1, TP_WAIT_MS), XFER_OK);
    xfer_request_cancel(r1);
    cr_expect_eq(xfer_request_test(r1), XFER_OK);
    cr_expect_eq(xfer_request_length(r1), 256);
    cr_expect_eq(tp_check_pattern(buf, 256, 6), -1);
    cr_expect_eq(one.calls, 1);
    xfer_request_release(r1);
    tp_send(&p, 0);
    tp_finish(&p);
}

/* Receives one HUGE message on "go", after staying deaf until then. */
static int srv_deaf_then_recv(tp_side_t *s)
{
    uint64_t v;
    msg_t m;

    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");     /* no progress */
    TP_CHECK(TP_POSTED(recv_post(s->ctx, s->ep, 3, ALL, HUGE, &m)), "recv");
    TP_CHECK_STATUS(xfer_request_wait(m.req, TP_WAIT_MS), XFER_OK);
    TP_CHECK(tp_check_pattern(m.buf, HUGE, 3) == -1, "the message is corrupt");
    msg_wait(&m, 0);
    TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
    child_await_word(s);
    return 0;
}

Test(tag, cancel_of_a_send_is_unsupported)
{
    tp_peer_t p;
    msg_t m;

    tp_start(&p, srv_deaf_then_recv, NULL);
    cr_assert(TP_POSTED(send_post(p.ep, 3, HUGE, 3, NULL, &m)));
    tp_progress_for(p.ctx, 200);
    if (xfer_request_test(m.req) == XFER_INPROGRESS) {
        cr_expect_eq(xfer_request_cancel(m.req), XFER_ERR_UNSUPPORTED);
    } else {
        cr_log_warn("a 32 MiB send to a peer that does not progress completed at once");
    }
    tp_send(&p, 1);
    cr_assert_eq(msg_wait(&m, TP_WAIT_MS), XFER_OK, "the send survives the cancel attempt");
    cr_assert_eq(tp_recv(&p), 1);
    tp_send(&p, 0);
    tp_finish(&p);
}

/* ---- the request contract -------------------------------------------------------------------- */

#define NCB 100

/* Sends NCB messages (tag i, 100 + i bytes), then receives NCB from the parent and echoes a
 * count of the good ones. */
static int srv_hundred(tp_side_t *s)
{
    static msg_t m[NCB];
    int good = 0;

    for (int i = 0; i < NCB; i++) {
        child_send(s, (uint64_t)i, 100 + (size_t)i, 500 + i, &m[i]);
    }
    child_wait_sends(m, NCB);
    for (int i = 0; i < NCB; i++) {
        TP_CHECK(TP_POSTED(recv_post(s->ctx, s->ep, 1000 + (uint64_t)i, ALL, 4096, &m[i])), "recv");
    }
    for (int i = 0; i < NCB; i++) {
        if ((xfer_request_wait(m[i].req, TP_WAIT_MS) == XFER_OK) &&
            (xfer_request_length(m[i].req) == 10 + (size_t)i) &&
            (tp_check_pattern(m[i].buf, 10 + (size_t)i, 900 + i) == -1)) {
            good++;
        }
        msg_wait(&m[i], 0);
    }
    TP_CHECK(tp_ctl_send_u64(s->ctl, (uint64_t)good) == 0, "ctl");
    child_await_word(s);
    return 0;
}

Test(tag, callbacks_are_called_exactly_once)
{
    static slot_t slots[NCB];
    static char bufs[NCB][256];
    xfer_request_t *reqs[NCB];
    tp_peer_t p;

    tp_start(&p, srv_hundred, NULL);
    memset(slots, 0, sizeof(slots));
    for (int i = NCB - 1; i >= 0; i--) {
        xfer_status_t s = xfer_tag_recv(p.ctx, p.ep, (uint64_t)i, ALL, bufs[i], 256, NULL,
                                        slot_cb, &slots[i], &reqs[i]);
        cr_assert(TP_POSTED(s), "recv %d: %s", i, xfer_status_string(s));
    }
    for (int i = 0; i < NCB; i++) {
        cr_assert_eq(xfer_request_wait(reqs[i], TP_WAIT_MS), XFER_OK, "recv %d", i);
    }
    tp_progress_for(p.ctx, 50);
    for (int i = 0; i < NCB; i++) {
        cr_assert_eq(slots[i].calls, 1, "recv %d: callback called %d times", i, slots[i].calls);
        cr_assert_eq(slots[i].status, XFER_OK);
        cr_assert_eq(slots[i].req, reqs[i], "the callback gets its own request");
        cr_assert_eq(slots[i].length, 100 + (size_t)i, "length inside the callback");
        cr_assert_eq(slots[i].tag, (uint64_t)i, "tag inside the callback");
        cr_assert_eq(tp_check_pattern(bufs[i], 100 + (size_t)i, 500 + i), -1);
        xfer_request_release(reqs[i]);
    }

    /* and the other way: sends with callbacks */
    memset(slots, 0, sizeof(slots));
    for (int i = 0; i < NCB; i++) {
        tp_fill_pattern(bufs[i], 10 + (size_t)i, 900 + i);
        cr_assert(TP_POSTED(xfer_tag_send(p.ep, 1000 + (uint64_t)i, bufs[i], 10 + (size_t)i,
                                          NULL, slot_cb, &slots[i], &reqs[i])));
        /* even a send that is done at once (copied) calls back from progress, after the
         * call that posted it has returned its request */
        cr_assert_eq(slots[i].calls, 0, "send %d: callback ran inside xfer_tag_send", i);
    }
    for (int i = 0; i < NCB; i++) {
        cr_assert_eq(xfer_request_wait(reqs[i], TP_WAIT_MS), XFER_OK, "send %d", i);
        cr_assert_eq(xfer_request_length(reqs[i]), 10 + (size_t)i, "send %d: bytes moved", i);
    }
    /* a send completes once its buffer may be reused (copied); what did not fit the ring yet
     * still needs this side's progress to reach the peer */
    cr_assert_eq(tp_flush(p.ep, TP_WAIT_MS), XFER_OK);
    cr_assert_eq(tp_recv(&p), NCB, "the peer got every message intact");
    tp_progress_for(p.ctx, 50);
    for (int i = 0; i < NCB; i++) {
        cr_assert_eq(slots[i].calls, 1, "send %d: callback called %d times", i, slots[i].calls);
        cr_assert_eq(slots[i].status, XFER_OK);
        cr_assert_eq(slots[i].req, reqs[i], "send %d: the callback gets its own request", i);
        cr_assert_eq(slots[i].length, 10 + (size_t)i, "send %d: length inside the callback", i);
        xfer_request_release(reqs[i]);
    }
    tp_send(&p, 0);
    tp_finish(&p);
}

static int count_calls(const slot_t *slots, int n)
{
    int c = 0;

    for (int i = 0; i < n; i++) {
        c += slots[i].calls;
    }
    return c;
}

Test(tag, requests_without_req_p_release_themselves)
{
    static slot_t slots[NCB];
    static char bufs[NCB][256];
    tp_peer_t p;
    double end;

    tp_start(&p, srv_hundred, NULL);
    memset(slots, 0, sizeof(slots));
    for (int i = 0; i < NCB; i++) {
        cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, (uint64_t)i, ALL, bufs[i], 256, NULL,
                                          slot_cb, &slots[i], NULL)));
    }
    end = tp_now_ms() + TP_WAIT_MS;
    while ((count_calls(slots, NCB) < NCB) && (tp_now_ms() < end)) {
        xfer_progress(p.ctx);
    }
    tp_progress_for(p.ctx, 50);
    for (int i = 0; i < NCB; i++) {
        cr_assert_eq(slots[i].calls, 1, "recv %d: callback called %d times", i, slots[i].calls);
        cr_assert_eq(slots[i].status, XFER_OK);
        cr_assert_eq(slots[i].length, 100 + (size_t)i);
        cr_assert_eq(tp_check_pattern(bufs[i], 100 + (size_t)i, 500 + i), -1);
    }
    /* sends: half with a callback, half with none at all */
    memset(slots, 0, sizeof(slots));
    for (int i = 0; i < NCB; i++) {
        tp_fill_pattern(bufs[i], 10 + (size_t)i, 900 + i);
        cr_assert(TP_POSTED(xfer_tag_send(p.ep, 1000 + (uint64_t)i, bufs[i], 10 + (size_t)i,
                                          NULL, (i % 2) ? slot_cb : NULL, &slots[i], NULL)));
    }
    end = tp_now_ms() + TP_WAIT_MS;
    while ((count_calls(slots, NCB) < NCB / 2) && (tp_now_ms() < end)) {
        xfer_progress(p.ctx);
    }
    for (int i = 1; i < NCB; i += 2) {
        cr_assert_eq(slots[i].calls, 1, "send %d: callback called %d times", i, slots[i].calls);
    }
    /* the peer's receives need our progress for nothing more, but keep it going */
    end = tp_now_ms() + TP_WAIT_MS;
    while (!tp_ctl_ready(p.ctl, 0) && (tp_now_ms() < end)) {
        xfer_progress(p.ctx);
    }
    cr_assert_eq(tp_recv(&p), NCB, "the peer got every message intact");
    tp_send(&p, 0);
    tp_finish(&p);
}

/* A receive whose callback posts the next one, releasing nothing it does not own. */
typedef struct chain {
    xfer_context_t  *ctx;
    xfer_endpoint_t *ep;
    char            bufs[NCB][256];
    int             done;
    int             bad;
} chain_t;

static void chain_cb(xfer_request_t *req, xfer_status_t status, void *arg)
{
    chain_t *c = arg;
    int i      = c->done;

    if ((status != XFER_OK) || (xfer_request_tag(req) != (uint64_t)i) ||
        (tp_check_pattern(c->bufs[i], 100 + (size_t)i, 500 + i) != -1)) {
        c->bad++;
    }
    c->done++;
    if (c->done < NCB) {
        xfer_status_t s = xfer_tag_recv(c->ctx, c->ep, (uint64_t)c->done, ALL,
                                        c->bufs[c->done], 256, NULL, chain_cb, c, NULL);
        c->bad += !TP_POSTED(s);
    }
}

Test(tag, callbacks_may_post_the_next_receive)
{
    static chain_t c;
    tp_peer_t p;
    double end;

    tp_start(&p, srv_hundred, NULL);
    memset(&c, 0, sizeof(c));
    c.ctx = p.ctx;
    c.ep  = p.ep;
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 0, ALL, c.bufs[0], 256, NULL, chain_cb, &c,
                                      NULL)));
    end = tp_now_ms() + TP_WAIT_MS;
    while ((c.done < NCB) && (tp_now_ms() < end)) {
        xfer_progress(p.ctx);
    }
    cr_assert_eq(c.done, NCB);
    cr_assert_eq(c.bad, 0, "%d receives of the chain went wrong", c.bad);
    /* let the peer finish its half */
    for (int i = 0; i < NCB; i++) {
        tp_fill_pattern(c.bufs[i], 10 + (size_t)i, 900 + i);
        cr_assert(TP_POSTED(xfer_tag_send(p.ep, 1000 + (uint64_t)i, c.bufs[i], 10 + (size_t)i,
                                          NULL, NULL, NULL, NULL)));
    }
    end = tp_now_ms() + TP_WAIT_MS;
    while (!tp_ctl_ready(p.ctl, 0) && (tp_now_ms() < end)) {
        xfer_progress(p.ctx);
    }
    cr_assert_eq(tp_recv(&p), NCB);
    tp_send(&p, 0);
    tp_finish(&p);
}

Test(tag, a_pending_request_released_early_still_completes_and_calls_back)
{
    tp_peer_t p;
    slot_t slot = {0};
    xfer_request_t *req = NULL;
    char *buf = calloc(1, 256);
    double end;

    tp_start(&p, srv_on_demand, NULL);
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 11, ALL, buf, 256, NULL, slot_cb, &slot,
                                      &req)));
    xfer_request_release(req);          /* pending: freed once it completes */
    tp_send(&p, 8);
    cr_assert_eq(tp_recv(&p), 1);
    end = tp_now_ms() + TP_WAIT_MS;
    while ((slot.calls == 0) && (tp_now_ms() < end)) {
        xfer_progress(p.ctx);
    }
    tp_progress_for(p.ctx, 50);
    cr_assert_eq(slot.calls, 1, "callback of a released request called %d times", slot.calls);
    cr_assert_eq(slot.status, XFER_OK);
    cr_assert_eq(tp_check_pattern(buf, 256, 8), -1, "the message still lands in the buffer");
    free(buf);
    tp_send(&p, 0);
    tp_finish(&p);
}

static int srv_zero_null(tp_side_t *s)
{
    xfer_request_t *req = NULL;
    xfer_status_t st    = xfer_tag_send(s->ep, 13, NULL, 0, NULL, NULL, NULL, &req);

    TP_CHECK(TP_POSTED(st), "a zero-length send with a NULL buffer: %s", xfer_status_string(st));
    TP_CHECK_STATUS(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
    xfer_request_release(req);
    child_await_word(s);
    return 0;
}

Test(tag, zero_length_messages_need_no_buffer)
{
    tp_peer_t p;
    xfer_request_t *req = NULL;
    xfer_status_t s;

    tp_start(&p, srv_zero_null, NULL);
    s = xfer_tag_recv(p.ctx, p.ep, 13, ALL, NULL, 0, NULL, NULL, NULL, &req);
    cr_assert(TP_POSTED(s), "a zero-length receive with a NULL buffer: %s",
              xfer_status_string(s));
    cr_assert_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
    cr_assert_eq(xfer_request_length(req), 0);
    cr_assert_eq(xfer_request_tag(req), 13);
    xfer_request_release(req);
    tp_send(&p, 0);
    tp_finish(&p);
}

Test(tag, invalid_arguments_create_no_request)
{
    tp_peer_t p;
    xfer_request_t *req = SENTINEL;
    char buf[64];

    tp_start(&p, srv_on_demand, NULL);
    cr_expect_eq(xfer_tag_send(NULL, 1, buf, sizeof(buf), NULL, NULL, NULL, &req),
                 XFER_ERR_INVALID_PARAM);
    cr_expect_eq(xfer_tag_send(p.ep, 1, NULL, sizeof(buf), NULL, NULL, NULL, &req),
                 XFER_ERR_INVALID_PARAM);
    cr_expect_eq(xfer_tag_recv(NULL, p.ep, 1, ALL, buf, sizeof(buf), NULL, NULL, NULL, &req),
                 XFER_ERR_INVALID_PARAM);
    cr_expect_eq(xfer_tag_recv(p.ctx, p.ep, 1, ALL, NULL, sizeof(buf), NULL, NULL, NULL, &req),
                 XFER_ERR_INVALID_PARAM);
    cr_expect_eq(req, SENTINEL);
    cr_expect_eq(xfer_endpoint_status(p.ep), XFER_OK);
    tp_send(&p, 0);
    tp_finish(&p);
}
