/*
 * The contract (docs/contract.md), tagged messages: matching in the order sent (C7), masks,
 * the earliest posted receive and the earliest arrived message, any-peer receives (C10),
 * truncation (C11) and cancelling a receive (C12). The senders are ct_target children.
 */
#include "contract.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#define ALL  (~0ull)
#define BIG  (4u << 20)

/* Post a receive of cap bytes into buf: the request. */
static xfer_request_t *recv_post(tp_peer_t *p, xfer_endpoint_t *ep, uint64_t tag, uint64_t mask,
                                 void *buf, size_t cap)
{
    xfer_request_t *req = NULL;

    cr_assert_eq(xfer_tag_recv(p->ctx, ep, tag, mask, buf, cap, NULL, NULL, NULL, &req), XFER_OK);
    return req;
}

/* Wait for a receive: it completed with want, its message was len bytes of seed's pattern
 * under tag (what the buffer holds: at most cap of them). Releases it. */
static void recv_expect(xfer_request_t *req, xfer_status_t want, const void *buf, size_t cap,
                        uint64_t tag, size_t len, uint64_t seed, const char *what)
{
    xfer_status_t s = xfer_request_wait(req, TP_WAIT_MS);
    ssize_t bad;

    cr_assert_eq(s, want, "%s: %s, expected %s", what, xfer_status_string(s),
                 xfer_status_string(want));
    cr_assert_eq(xfer_request_length(req), len, "%s: length %zu, expected %zu", what,
                 xfer_request_length(req), len);
    cr_assert_eq(xfer_request_tag(req), tag, "%s: tag %#llx, expected %#llx", what,
                 (unsigned long long)xfer_request_tag(req), (unsigned long long)tag);
    bad = tp_check_pattern(buf, (len < cap) ? len : cap, seed);
    cr_assert_lt(bad, 0, "%s: byte %zd differs", what, bad);
    xfer_request_release(req);
}

static void stop(tp_peer_t *p)
{
    cr_assert_eq(ct_do(p, CT_STOP, 0, 0, 0), 0);
    tp_finish(p);
}

/* C7: messages of one endpoint under one tag, of every size class, match receives in the
 * order they were sent - received when they had all arrived, and posted before any did. */
Test(contract, messages_of_one_endpoint_match_in_the_order_they_were_sent)
{
    static const size_t lens[] = {8, 65536, (1u << 20) + 3, 0, 8, 3u << 20, 100};
    enum { N = sizeof(lens) / sizeof(lens[0]) };
    xfer_request_t *req[N];
    uint8_t *buf[N];
    tp_peer_t p;

    xfer_rkey_destroy(ct_start(&p));
    for (int i = 0; i < N; i++) {
        buf[i] = malloc(BIG);
        cr_assert_not_null(buf[i]);
    }
    for (int round = 0; round < 2; round++) {
        const int expected = (round == 1);

        if (expected) {
            for (int i = 0; i < N; i++) {
                req[i] = recv_post(&p, p.ep, 0x77, ALL, buf[i], BIG);
            }
        }
        for (int i = 0; i < N; i++) {
            cr_assert_eq(ct_do(&p, CT_SEND, 0x77, lens[i], 200 + 10 * round + i), 0);
        }
        if (!expected) {
            tp_progress_for(p.ctx, 50);
            for (int i = 0; i < N; i++) {
                req[i] = recv_post(&p, p.ep, 0x77, ALL, buf[i], BIG);
            }
        }
        for (int i = 0; i < N; i++) {
            recv_expect(req[i], XFER_OK, buf[i], BIG, 0x77, lens[i], 200 + 10 * round + i,
                        expected ? "posted first" : "posted after");
        }
    }
    for (int i = 0; i < N; i++) {
        free(buf[i]);
    }
    stop(&p);
}

/* C10: the mask selects; an arriving message goes to the earliest posted receive it matches,
 * a new receive takes the earliest arrived message it matches. */
Test(contract, a_message_goes_to_the_earliest_receive_its_tag_matches_under_the_mask)
{
    uint64_t m[3];
    xfer_request_t *r[3];
    tp_peer_t p;

    xfer_rkey_destroy(ct_start(&p));
    /* expected: 0x1ab matches r0 and r2, 0x100 matches r1 and r2, 0x1cc only r2 */
    r[0] = recv_post(&p, p.ep, 0x100, 0xf00, &m[0], 8);
    r[1] = recv_post(&p, p.ep, 0x100, ALL, &m[1], 8);
    r[2] = recv_post(&p, p.ep, 0x1ff, 0xf00, &m[2], 8);
    cr_assert_eq(ct_do(&p, CT_SEND, 0x1ab, 8, 210), 0);
    cr_assert_eq(ct_do(&p, CT_SEND, 0x100, 8, 211), 0);
    cr_assert_eq(ct_do(&p, CT_SEND, 0x1cc, 8, 212), 0);
    recv_expect(r[0], XFER_OK, &m[0], 8, 0x1ab, 8, 210, "the earliest posted of two");
    recv_expect(r[1], XFER_OK, &m[1], 8, 0x100, 8, 211, "the exact tag, posted before a mask");
    recv_expect(r[2], XFER_OK, &m[2], 8, 0x1cc, 8, 212, "the last receive");

    /* unexpected: 0x200, 0x2aa, 0x300 arrive before the receives (or, on a slow host, after
     * them: the same receives get the same messages either way) */
    cr_assert_eq(ct_do(&p, CT_SEND, 0x200, 8, 213), 0);
    cr_assert_eq(ct_do(&p, CT_SEND, 0x2aa, 8, 214), 0);
    cr_assert_eq(ct_do(&p, CT_SEND, 0x300, 8, 215), 0);
    tp_progress_for(p.ctx, 50);
    r[0] = recv_post(&p, p.ep, 0x2ff, 0xf00, &m[0], 8);
    r[1] = recv_post(&p, p.ep, 0x300, ALL, &m[1], 8);
    r[2] = recv_post(&p, p.ep, 0, 0, &m[2], 8);
    recv_expect(r[0], XFER_OK, &m[0], 8, 0x200, 8, 213, "the earliest arrived of two");
    recv_expect(r[1], XFER_OK, &m[1], 8, 0x300, 8, 215, "the exact tag");
    recv_expect(r[2], XFER_OK, &m[2], 8, 0x2aa, 8, 214, "the mask of 0");
    stop(&p);
}

/* C10: a receive with ep == NULL takes a message from any endpoint, in arrival order; one
 * bound to an endpoint takes only that endpoint's. */
Test(contract, a_receive_of_any_endpoint_takes_from_every_peer_a_bound_one_from_its_own)
{
    uint64_t m[4];
    xfer_request_t *r[4];
    tp_peer_t p, q;
    size_t len;

    xfer_rkey_destroy(ct_start(&p));
    tp_server_spawn(&q, ct_target, NULL, NULL);
    q.ep  = tp_connect(p.ctx, &q);
    q.ctx = p.ctx;
    free(tp_recv_blob(&q, &len));

    /* expected, any endpoint: q's message first, then p's */
    r[0] = recv_post(&p, NULL, 0x400, ALL, &m[0], 8);
    r[1] = recv_post(&p, NULL, 0x400, ALL, &m[1], 8);
    cr_assert_eq(ct_do(&q, CT_SEND, 0x400, 8, 220), 0);
    recv_expect(r[0], XFER_OK, &m[0], 8, 0x400, 8, 220, "any endpoint: the first peer");
    cr_assert_eq(ct_do(&p, CT_SEND, 0x400, 8, 221), 0);
    recv_expect(r[1], XFER_OK, &m[1], 8, 0x400, 8, 221, "any endpoint: the second peer");

    /* unexpected, any endpoint */
    cr_assert_eq(ct_do(&p, CT_SEND, 0x500, 8, 222), 0);
    tp_progress_for(p.ctx, 50);
    r[0] = recv_post(&p, NULL, 0x500, ALL, &m[0], 8);
    recv_expect(r[0], XFER_OK, &m[0], 8, 0x500, 8, 222, "any endpoint, arrived before");

    /* bound: q's receive does not take p's message, p's does */
    r[2] = recv_post(&p, q.ep, 0x600, ALL, &m[2], 8);
    cr_assert_eq(ct_do(&p, CT_SEND, 0x600, 8, 223), 0);
    tp_progress_for(p.ctx, 50);
    cr_assert_eq(xfer_request_test(r[2]), XFER_INPROGRESS, "a receive bound to one endpoint "
                 "took another's message");
    cr_assert_eq(ct_do(&q, CT_SEND, 0x600, 8, 224), 0);
    recv_expect(r[2], XFER_OK, &m[2], 8, 0x600, 8, 224, "bound to the second peer");
    r[3] = recv_post(&p, p.ep, 0x600, ALL, &m[3], 8);
    recv_expect(r[3], XFER_OK, &m[3], 8, 0x600, 8, 223, "bound to the first peer");

    cr_assert_eq(ct_do(&q, CT_STOP, 0, 0, 0), 0);
    xfer_endpoint_close(q.ep);
    tp_child_expect_ok(&q, 60);
    stop(&p);
}

/* C11: a message longer than the buffer fills the buffer and no byte more, completes the
 * receive XFER_ERR_TRUNCATED with the message's length; the next message is whole. Posted
 * before and after the message arrived, of every size class; zero-length messages too. */
Test(contract, a_longer_message_fills_the_buffer_and_completes_truncated)
{
    static const size_t lens[] = {100, 65536 + 7, (2u << 20) + 5};
    enum { GUARD = 64 };
    uint8_t *buf = malloc((1u << 20) + 8 + GUARD);
    uint64_t next, seed = 230;
    xfer_request_t *req;
    tp_peer_t p;

    cr_assert_not_null(buf);
    xfer_rkey_destroy(ct_start(&p));
    for (int expected = 0; expected < 2; expected++) {
        for (unsigned i = 0; i < sizeof(lens) / sizeof(lens[0]); i++, seed++) {
            size_t len = lens[i], cap = len / 2;

            memset(buf, 0xa5, cap + GUARD);
            req = expected ? recv_post(&p, p.ep, 0x800, ALL, buf, cap) : NULL;
            cr_assert_eq(ct_do(&p, CT_SEND, 0x800, len, seed), 0);
            if (!expected) {
                tp_progress_for(p.ctx, 20);
                req = recv_post(&p, p.ep, 0x800, ALL, buf, cap);
            }
            recv_expect(req, XFER_ERR_TRUNCATED, buf, cap, 0x800, len, seed,
                        expected ? "truncated, posted first" : "truncated, posted after");
            for (size_t g = cap; g < cap + GUARD; g++) {
                cr_assert_eq(buf[g], 0xa5, "byte %zu past a buffer of %zu was written", g, cap);
            }
            cr_assert_eq(ct_do(&p, CT_SEND, 0x801, 8, seed + 100), 0);
            req = recv_post(&p, p.ep, 0x801, ALL, &next, sizeof(next));
            recv_expect(req, XFER_OK, &next, 8, 0x801, 8, seed + 100, "the message after");
        }
    }
    /* zero-length: into no buffer, and into one */
    req = recv_post(&p, p.ep, 0x802, ALL, buf, 0);
    cr_assert_eq(ct_do(&p, CT_SEND, 0x802, 0, 0), 0);
    recv_expect(req, XFER_OK, buf, 0, 0x802, 0, 0, "zero bytes into zero");
    cr_assert_eq(ct_do(&p, CT_SEND, 0x802, 0, 0), 0);
    req = recv_post(&p, p.ep, 0x802, ALL, buf, 64);
    recv_expect(req, XFER_OK, buf, 64, 0x802, 0, 0, "zero bytes into 64");
    buf[0] = 0xa5;
    req    = recv_post(&p, p.ep, 0x802, ALL, buf, 0);
    cr_assert_eq(ct_do(&p, CT_SEND, 0x802, 8, 240), 0);
    recv_expect(req, XFER_ERR_TRUNCATED, buf, 0, 0x802, 8, 240, "8 bytes into zero");
    cr_assert_eq(buf[0], 0xa5, "a receive of zero bytes wrote into its buffer");
    free(buf);
    stop(&p);
}

/* C12: a receive cancelled before anything matched it completes XFER_ERR_CANCELED and the
 * message that comes later goes to the next receive. */
Test(contract, a_cancelled_receive_completes_canceled_and_takes_nothing)
{
    tp_calls_t calls    = {0};
    xfer_request_t *req = NULL;
    uint64_t m;
    tp_peer_t p;

    xfer_rkey_destroy(ct_start(&p));
    cr_assert_eq(xfer_tag_recv(p.ctx, p.ep, 0x900, ALL, &m, 8, NULL, tp_calls_cb, &calls, &req),
                 XFER_OK);
    tp_progress_for(p.ctx, 10);
    cr_assert_eq(xfer_request_cancel(req), XFER_OK);
    cr_assert_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_ERR_CANCELED);
    cr_assert_eq(calls.calls, 1);
    cr_assert_eq(calls.status, XFER_ERR_CANCELED);
    xfer_request_release(req);
    cr_assert_eq(ct_do(&p, CT_SEND, 0x900, 8, 250), 0);
    req = recv_post(&p, p.ep, 0x900, ALL, &m, 8);
    recv_expect(req, XFER_OK, &m, 8, 0x900, 8, 250, "the message after the cancel");
    cr_assert_eq(calls.calls, 1);
    stop(&p);
}

/* C12: a cancel racing the message it could match either wins - XFER_OK, the receive
 * XFER_ERR_CANCELED, and the message goes whole to the next receive - or loses - the
 * receive completes XFER_OK with the whole message. The message is delivered exactly once
 * either way, whatever its size; one that had already arrived is always matched. */
Test(contract, a_cancel_racing_its_message_either_wins_or_the_message_arrives_whole)
{
    static const size_t lens[] = {8, 1u << 20, 16u << 20};
    uint8_t *buf = malloc(16u << 20);
    xfer_request_t *req;
    uint64_t marker, m;
    tp_peer_t p;

    cr_assert_not_null(buf);
    xfer_rkey_destroy(ct_start(&p));
    for (unsigned r = 0; r < 9; r++) {
        size_t len = lens[r % 3];
        xfer_status_t c, f;

        memset(buf, 0, len);
        cr_assert_eq(ct_do(&p, CT_SEND, 0xa00, len, 260 + r), 0);
        tp_progress_for(p.ctx, (int)(r / 3) * 2);
        req = recv_post(&p, p.ep, 0xa00, ALL, buf, len);
        c   = xfer_request_cancel(req);
        f   = xfer_request_wait(req, TP_WAIT_MS);
        cr_assert((c == XFER_OK) || (c == XFER_ERR_BUSY), "round %u: cancel %s", r,
                  xfer_status_string(c));
        if (c == XFER_ERR_BUSY) {
            cr_assert_eq(f, XFER_OK, "round %u: a cancel that lost, then %s", r,
                         xfer_status_string(f));
        }
        if (f == XFER_OK) {
            recv_expect(req, XFER_OK, buf, len, 0xa00, len, 260 + r, "the cancel lost");
        } else {
            cr_assert_eq(f, XFER_ERR_CANCELED, "round %u: %s", r, xfer_status_string(f));
            xfer_request_release(req);
            req = recv_post(&p, p.ep, 0xa00, ALL, buf, len);
            recv_expect(req, XFER_OK, buf, len, 0xa00, len, 260 + r, "after a cancel that won");
        }
        /* nothing of it is left to match twice */
        cr_assert_eq(ct_do(&p, CT_SEND, 0xa00, 8, 270 + r), 0);
        req = recv_post(&p, p.ep, 0xa00, ALL, &marker, 8);
        recv_expect(req, XFER_OK, &marker, 8, 0xa00, 8, 270 + r, "the message after");
    }
    /* one that had arrived (a later message of this endpoint was received) is matched at
     * once: the receive completes with it whatever the cancel returns */
    cr_assert_eq(ct_do(&p, CT_SEND, 0xb00, 64, 280), 0);
    cr_assert_eq(ct_do(&p, CT_SEND, 0xb01, 8, 281), 0);
    req = recv_post(&p, p.ep, 0xb01, ALL, &m, 8);
    recv_expect(req, XFER_OK, &m, 8, 0xb01, 8, 281, "the later message");
    req = recv_post(&p, p.ep, 0xb00, ALL, buf, 64);
    cr_assert_neq(xfer_request_cancel(req), XFER_ERR_UNSUPPORTED);
    recv_expect(req, XFER_OK, buf, 64, 0xb00, 64, 280, "a message that had arrived");
    free(buf);
    stop(&p);
}
