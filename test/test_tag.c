/*
 * Tagged messages between real processes: exact and masked matching, receives posted before
 * and after the message (the unexpected queue), one endpoint versus any, per-peer order over
 * 1000 messages of mixed sizes, truncation, zero-length and 32 MiB messages, the sender's tag
 * and cancellation. test_tag_requests.c holds the request contract (callbacks exactly once,
 * self-releasing requests, callbacks that post), in the same suite and binary; the helpers
 * both use are declared in test_tag.h. Every payload is a pattern checked byte for byte.
 */
#include "test_tag.h"
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

/* ---- helpers for both sides ------------------------------------------------------------------ */

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

xfer_status_t tt_msg_wait(msg_t *m, int timeout_ms)
{
    xfer_status_t s = xfer_request_wait(m->req, timeout_ms);

    xfer_request_release(m->req);
    free(m->buf);
    m->req = NULL;
    m->buf = NULL;
    return s;
}

xfer_status_t tt_recv_post(xfer_context_t *ctx, xfer_endpoint_t *ep, uint64_t tag,
                           uint64_t mask, size_t cap, msg_t *m)
{
    m->req = NULL;
    m->len = cap;
    m->buf = calloc(1, cap ? cap : 1);
    return xfer_tag_recv(ctx, ep, tag, mask, m->buf, cap, NULL, NULL, NULL, &m->req);
}

/* ---- the child's side ------------------------------------------------------------------------ */

void tt_child_send(tp_side_t *s, uint64_t tag, size_t len, uint64_t seed, msg_t *m)
{
    xfer_status_t st = send_post(s->ep, tag, len, seed, NULL, m);

    TP_CHECK(TP_POSTED(st), "tag_send(tag %#llx, %zu bytes): %s", (unsigned long long)tag, len,
             xfer_status_string(st));
}

void tt_child_wait_sends(msg_t *m, int n)
{
    for (int i = 0; i < n; i++) {
        TP_CHECK_STATUS(tt_msg_wait(&m[i], TP_WAIT_MS), XFER_OK);
    }
}

void tt_child_await_word(tp_side_t *s)
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
    xfer_status_t s = tt_recv_post(p->ctx, ep, tag, mask, cap, &m);

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

    tt_child_send(s, 0x1235, 32, 2, &m[0]);
    tt_child_send(s, 0x1234, 64, 1, &m[1]);
    tt_child_wait_sends(m, 2);
    tt_child_await_word(s);
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

    tt_child_send(s, 0xAB01, 100, 1, &m[0]);
    tt_child_send(s, 0xCD02, 100, 2, &m[1]);
    tt_child_send(s, 0xEF03, 100, 3, &m[2]);
    tt_child_wait_sends(m, 3);
    tt_child_await_word(s);
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

    tt_child_send(s, 0xFEDCBA9876543210ull, 10, 1, &m[0]);
    tt_child_send(s, 0x0123456789ABCDEFull, 20, 2, &m[1]);
    tt_child_wait_sends(m, 2);
    tt_child_await_word(s);
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

    tt_child_await_word(s);
    tt_child_send(s, 5, 64, 51, &m[0]);
    tt_child_send(s, 6, BIG, 52, &m[1]);
    TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
    tt_child_wait_sends(m, 2);
    tt_child_await_word(s);
    return 0;
}

Test(tag, receive_posted_before_the_message)
{
    tp_peer_t p;
    msg_t small, big;

    tp_start(&p, srv_on_go, NULL);
    cr_assert(TP_POSTED(tt_recv_post(p.ctx, p.ep, 6, ALL, BIG, &big)));
    cr_assert(TP_POSTED(tt_recv_post(p.ctx, p.ep, 5, ALL, 64, &small)));
    cr_assert_eq(xfer_request_wait(small.req, 200), XFER_ERR_TIMEOUT);
    cr_assert_eq(xfer_request_test(big.req), XFER_INPROGRESS);
    tp_send(&p, 1);
    cr_assert_eq(tp_recv(&p), 1);
    cr_assert_eq(xfer_request_wait(small.req, TP_WAIT_MS), XFER_OK);
    cr_assert_eq(xfer_request_wait(big.req, TP_WAIT_MS), XFER_OK);
    cr_assert_eq(tp_check_pattern(small.buf, 64, 51), -1);
    cr_assert_eq(tp_check_pattern(big.buf, BIG, 52), -1);
    cr_assert_eq(xfer_request_length(big.req), BIG);
    tt_msg_wait(&small, 0);
    tt_msg_wait(&big, 0);
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
        tt_child_send(s, 7, 64, (uint64_t)s->index * 10 + n, &m);
        TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
        tt_child_wait_sends(&m, 1);
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
    cr_assert(TP_POSTED(tt_recv_post(a.ctx, a.ep, 7, ALL, 64, &only_a)));
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
    tt_msg_wait(&only_a, 0);

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
        tt_child_send(s, 42, order_size(i), 1000 + i, &m[i]);
    }
    tt_child_wait_sends(m, NORDER);
    tt_child_await_word(s);
    return 0;
}

Test(tag, messages_from_one_peer_match_in_send_order)
{
    static msg_t m[NORDER];
    tp_peer_t p;

    tp_start(&p, srv_order, NULL);
    /* half posted ahead (racing the arrivals), the rest after they wait unexpected */
    for (int i = 0; i < NORDER / 2; i++) {
        cr_assert(TP_POSTED(tt_recv_post(p.ctx, p.ep, 42, ALL, order_size(i), &m[i])));
    }
    for (int i = 0; i < NORDER / 2; i++) {
        cr_assert_eq(xfer_request_wait(m[i].req, TP_WAIT_MS), XFER_OK, "message %d: %s", i,
                     xfer_status_string(xfer_request_test(m[i].req)));
    }
    tp_progress_for(p.ctx, 300);
    for (int i = NORDER / 2; i < NORDER; i++) {
        cr_assert(TP_POSTED(tt_recv_post(p.ctx, p.ep, 42, ALL, order_size(i), &m[i])));
    }
    for (int i = 0; i < NORDER; i++) {
        xfer_status_t s = xfer_request_wait(m[i].req, TP_WAIT_MS);
        ssize_t bad;

        cr_assert_eq(s, XFER_OK, "message %d (%zu bytes): %s", i, order_size(i),
                     xfer_status_string(s));
        cr_assert_eq(xfer_request_length(m[i].req), order_size(i), "message %d", i);
        bad = tp_check_pattern(m[i].buf, order_size(i), 1000 + i);
        cr_assert_eq(bad, -1, "receive %d got another message (byte %zd differs)", i, bad);
        tt_msg_wait(&m[i], 0);
    }
    tp_send(&p, 0);
    tp_finish(&p);
}

static int srv_interleaved(tp_side_t *s)
{
    msg_t m[4];

    tt_child_send(s, 1, 50, 1, &m[0]);
    tt_child_send(s, 2, 60, 2, &m[1]);
    tt_child_send(s, 1, 70, 3, &m[2]);
    tt_child_send(s, 2, 80, 4, &m[3]);
    TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
    tt_child_wait_sends(m, 4);
    tt_child_await_word(s);
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

    tt_child_send(s, 5, 1000, 1, &m[0]);
    tt_child_send(s, 5, 100, 2, &m[1]);
    tt_child_send(s, 6, BIG, 3, &m[2]);
    tt_child_send(s, 6, 1 << 20, 4, &m[3]);
    /* the sends complete (the status of a truncated one is the receiver's business) */
    for (int i = 0; i < 4; i++) {
        xfer_status_t st = tt_msg_wait(&m[i], TP_WAIT_MS);
        TP_CHECK(st != XFER_ERR_TIMEOUT, "send %d never completed", i);
        TP_CHECK((i % 2 == 0) || (st == XFER_OK), "send %d: %s", i, xfer_status_string(st));
    }
    tt_child_await_word(s);
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

    tt_child_send(s, 9, 0, 0, &m[0]);
    tt_child_send(s, 9, 0, 0, &m[1]);
    tt_child_send(s, 10, 16, 3, &m[2]);
    tt_child_wait_sends(m, 3);
    tt_child_await_word(s);
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

    tt_child_send(s, 1, HUGE, 77, &m[0]);
    tt_child_wait_sends(m, 1);
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
    tt_child_await_word(s);
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

void tt_slot_cb(xfer_request_t *req, xfer_status_t status, void *arg)
{
    slot_t *s = arg;

    s->calls++;
    s->status = status;
    s->req    = req;
    s->length = xfer_request_length(req);
    s->tag    = xfer_request_tag(req);
}

/* On each "go" with value n > 0: one message of tag 11 and pattern n. */
int tt_srv_on_demand(tp_side_t *s)
{
    for (;;) {
        uint64_t v;
        msg_t m;

        TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS) == 0, "no word from the parent");
        TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
        if (v == 0) {
            return 0;
        }
        tt_child_send(s, 11, 256, v, &m);
        TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
        tt_child_wait_sends(&m, 1);
    }
}

Test(tag, cancel_of_a_posted_receive_loses_no_message)
{
    tp_peer_t p;
    slot_t one = {0}, any = {0};
    xfer_request_t *r1 = NULL, *r2 = NULL;
    char buf[256];

    tp_start(&p, tt_srv_on_demand, NULL);
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 11, ALL, buf, sizeof(buf), NULL, tt_slot_cb,
                                      &one, &r1)));
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, NULL, 11, ALL, buf, sizeof(buf), NULL, tt_slot_cb,
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
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 11, ALL, buf, sizeof(buf), NULL, tt_slot_cb,
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
    TP_CHECK(TP_POSTED(tt_recv_post(s->ctx, s->ep, 3, ALL, HUGE, &m)), "recv");
    TP_CHECK_STATUS(xfer_request_wait(m.req, TP_WAIT_MS), XFER_OK);
    TP_CHECK(tp_check_pattern(m.buf, HUGE, 3) == -1, "the message is corrupt");
    tt_msg_wait(&m, 0);
    TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
    tt_child_await_word(s);
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
    cr_assert_eq(tt_msg_wait(&m, TP_WAIT_MS), XFER_OK, "the send survives the cancel attempt");
    cr_assert_eq(tp_recv(&p), 1);
    tp_send(&p, 0);
    tp_finish(&p);
}
