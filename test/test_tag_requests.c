/*
 * The tag suite's request contract: every callback is called exactly once, with its own
 * request, length and tag; requests posted without req_p release themselves; a callback may
 * post the next receive; a request released while pending still completes and calls back;
 * zero-length messages need no buffer; invalid arguments create no request. The suite itself
 * and the helpers used here live in test_tag.c (declared in test_tag.h).
 */
#include "test_tag.h"
#include "test_peer.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#define SENTINEL ((void*)0x5e47)

/* ---- the request contract -------------------------------------------------------------------- */

#define NCB 100

/* Sends NCB messages (tag i, 100 + i bytes), then receives NCB from the parent and echoes a
 * count of the good ones. */
static int srv_hundred(tp_side_t *s)
{
    static msg_t m[NCB];
    int good = 0;

    for (int i = 0; i < NCB; i++) {
        tt_child_send(s, (uint64_t)i, 100 + (size_t)i, 500 + i, &m[i]);
    }
    tt_child_wait_sends(m, NCB);
    for (int i = 0; i < NCB; i++) {
        TP_CHECK(TP_POSTED(tt_recv_post(s->ctx, s->ep, 1000 + (uint64_t)i, ALL, 4096, &m[i])),
                 "recv");
    }
    for (int i = 0; i < NCB; i++) {
        if ((xfer_request_wait(m[i].req, TP_WAIT_MS) == XFER_OK) &&
            (xfer_request_length(m[i].req) == 10 + (size_t)i) &&
            (tp_check_pattern(m[i].buf, 10 + (size_t)i, 900 + i) == -1)) {
            good++;
        }
        tt_msg_wait(&m[i], 0);
    }
    TP_CHECK(tp_ctl_send_u64(s->ctl, (uint64_t)good) == 0, "ctl");
    tt_child_await_word(s);
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
                                        tt_slot_cb, &slots[i], &reqs[i]);
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
                                          NULL, tt_slot_cb, &slots[i], &reqs[i])));
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
                                          tt_slot_cb, &slots[i], NULL)));
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
                                          NULL, (i % 2) ? tt_slot_cb : NULL, &slots[i], NULL)));
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

    tp_start(&p, tt_srv_on_demand, NULL);
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 11, ALL, buf, 256, NULL, tt_slot_cb, &slot,
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
    tt_child_await_word(s);
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

    tp_start(&p, tt_srv_on_demand, NULL);
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
