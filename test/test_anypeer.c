/*
 * Receives from any peer with two transports open: a tcp peer and a verbs peer send to one
 * context that has both, and receives posted for any peer must take every message exactly
 * once, each peer's in the order it sent them, whichever transport carries it - posted
 * before the messages come, after they wait unexpected on both transports, mixed with
 * cancellations, and with sizes on both sides of verbs' eager limit (so that rendezvous
 * reads claim receives too).
 *
 * Needs an RDMA device (the Soft-RoCE guest, like test_verbs.c); elsewhere every test is
 * skipped, saying why:
 *   XFERTEST_TRANSPORT=verbs contrib/rxe_guest -- test/verbs_suites.sh build anypeer
 */
#include "test_peer.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ALL     (~0ull)
#define PER     60          /* messages from each peer */
#define MAXLEN  (20u << 10) /* verbs' eager limit is 8176 bytes: some go by rendezvous */
#define TAG     0x77

static void setup(void)
{
    tp_env();
    if (strcmp(tp_transport(), "verbs") != 0) {
        cr_skip_test("any-peer receives across transports need verbs beside tcp: run with "
                     "XFERTEST_TRANSPORT=verbs in the Soft-RoCE guest (now '%s')",
                     tp_transport());
    }
    if (!tu_host_has_rdma()) {
        cr_skip_test("no RDMA device: run in the Soft-RoCE guest (contrib/rxe_guest)");
    }
    /* this side opens both; each child allows one */
    setenv("XFER_TRANSPORTS", "verbs,tcp", 1);
}

TestSuite(anypeer, .init = setup, .timeout = 240);

/* Message i of peer p: its length and its pattern's seed. */
static size_t msg_len(int p, int i)
{
    return 1 + (size_t)((i * 2654435761u + (unsigned)p * 40503u) % MAXLEN);
}

static uint64_t msg_seed(int p, int i)
{
    return 1000u * (uint64_t)(p + 1) + (uint64_t)i;
}

/* On a word: send PER messages tagged TAG, each beginning with the peer's index and the
 * message's number, then wait for a word. */
static int srv_sender(tp_side_t *s)
{
    static uint8_t bufs[PER][MAXLEN];
    xfer_request_t *reqs[PER];
    uint64_t v;

    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
    if (v == 0) {
        return 0;       /* told to go without sending */
    }
    for (int i = 0; i < PER; i++) {
        size_t len = msg_len(s->index, i);

        tp_fill_pattern(bufs[i], len, msg_seed(s->index, i));
        reqs[i] = NULL;
        TP_CHECK(TP_POSTED(xfer_tag_send(s->ep, TAG, bufs[i], len, NULL, NULL, NULL, &reqs[i])),
                 "send %d", i);
    }
    for (int i = 0; i < PER; i++) {
        TP_CHECK_STATUS(xfer_request_wait(reqs[i], TP_WAIT_MS), XFER_OK);
        xfer_request_release(reqs[i]);
    }
    TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
    TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS * 2) == 0, "no word");
    tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS);
    return 0;
}

typedef struct two {
    tp_peer_t       peer[2];        /* [0] over tcp, [1] over verbs */
    xfer_endpoint_t *ep[2];
    xfer_context_t  *ctx;
} two_t;

static void two_start(two_t *t)
{
    static const char *const names[2] = {"tcp", "verbs"};

    t->ctx = tp_context(0);
    for (int p = 0; p < 2; p++) {
        tp_opts_t o = {.transports = names[p], .index = p};
        char addr[64];

        tp_server_spawn(&t->peer[p], srv_sender, NULL, &o);
        snprintf(addr, sizeof(addr), "%s", t->peer[p].address);
        cr_assert_eq(xfer_connect(t->ctx, addr, &t->ep[p]), XFER_OK);
        cr_assert_str_eq(xfer_endpoint_transport(t->ep[p]), names[p]);
    }
}

static void two_finish(two_t *t)
{
    for (int p = 0; p < 2; p++) {
        tp_send(&t->peer[p], 0);
    }
    for (int p = 0; p < 2; p++) {
        xfer_endpoint_close(t->ep[p]);
    }
    xfer_context_destroy(t->ctx);
    for (int p = 0; p < 2; p++) {
        tp_child_expect_ok(&t->peer[p], 30);
    }
}

typedef struct slot {
    xfer_request_t *req;
    uint8_t        buf[MAXLEN];
} slot_t;

/* Check the completed receives (slots[idx[0..n)], in posting order): every message of both
 * peers exactly once, each peer's in the order of the receives that took them. */
static void check_taken(slot_t *all, const int *idx, int n)
{
    int next[2] = {0, 0};

    for (int j = 0; j < n; j++) {
        slot_t *slot = &all[idx[j]];
        size_t len   = xfer_request_length(slot->req);
        int found    = 0;

        cr_assert_eq(xfer_request_test(slot->req), XFER_OK, "receive %d: %s", idx[j],
                     xfer_status_string(xfer_request_test(slot->req)));
        for (int p = 0; (p < 2) && !found; p++) {
            int i = next[p];

            if ((i < PER) && (len == msg_len(p, i)) &&
                (tp_check_pattern(slot->buf, len, msg_seed(p, i)) == -1)) {
                next[p]++;
                found = 1;
            }
        }
        cr_assert(found, "receive %d (%zu bytes) holds no peer's next message (next: tcp %d, "
                  "verbs %d): lost, duplicated or out of order", idx[j], len, next[0], next[1]);
    }
    cr_expect_eq(next[0], PER, "%d of the tcp peer's %d messages", next[0], PER);
    cr_expect_eq(next[1], PER, "%d of the verbs peer's %d messages", next[1], PER);
}

static void wait_all(xfer_context_t *ctx, slot_t *all, const int *idx, int n)
{
    double end = tp_now_ms() + 4 * TP_WAIT_MS;

    for (int j = 0; j < n; j++) {
        while ((xfer_request_test(all[idx[j]].req) == XFER_INPROGRESS) && (tp_now_ms() < end)) {
            xfer_progress(ctx);
        }
    }
}

static int *iota(int n)
{
    int *idx = calloc((size_t)n, sizeof(*idx));

    for (int i = 0; i < n; i++) {
        idx[i] = i;
    }
    return idx;
}

Test(anypeer, receives_posted_first_take_both_peers_messages_once_and_in_order)
{
    slot_t *slots = calloc(2 * PER, sizeof(*slots));
    int *idx      = iota(2 * PER);
    two_t t;

    two_start(&t);
    for (int k = 0; k < 2 * PER; k++) {
        cr_assert(TP_POSTED(xfer_tag_recv(t.ctx, NULL, TAG, ALL, slots[k].buf, MAXLEN, NULL,
                                          NULL, NULL, &slots[k].req)));
    }
    tp_send(&t.peer[0], 1);
    tp_send(&t.peer[1], 1);
    wait_all(t.ctx, slots, idx, 2 * PER);
    check_taken(slots, idx, 2 * PER);
    for (int k = 0; k < 2 * PER; k++) {
        xfer_request_release(slots[k].req);
    }
    cr_assert_eq(tp_recv(&t.peer[0]), 1);
    cr_assert_eq(tp_recv(&t.peer[1]), 1);
    two_finish(&t);
    free(slots);
    free(idx);
}

Test(anypeer, receives_posted_late_take_what_waits_on_both_transports)
{
    slot_t *slots = calloc(2 * PER, sizeof(*slots));
    int *idx      = iota(2 * PER);
    double end;
    two_t t;

    two_start(&t);
    tp_send(&t.peer[0], 1);
    tp_send(&t.peer[1], 1);
    /* both peers' messages arrive and wait unexpected (rendezvous ones as announcements) */
    end = tp_now_ms() + 3000;
    while (tp_now_ms() < end) {
        xfer_progress(t.ctx);
    }
    for (int k = 0; k < 2 * PER; k++) {
        cr_assert(TP_POSTED(xfer_tag_recv(t.ctx, NULL, TAG, ALL, slots[k].buf, MAXLEN, NULL,
                                          NULL, NULL, &slots[k].req)));
    }
    wait_all(t.ctx, slots, idx, 2 * PER);
    check_taken(slots, idx, 2 * PER);
    for (int k = 0; k < 2 * PER; k++) {
        xfer_request_release(slots[k].req);
    }
    cr_assert_eq(tp_recv(&t.peer[0]), 1);
    cr_assert_eq(tp_recv(&t.peer[1]), 1);
    two_finish(&t);
    free(slots);
    free(idx);
}

Test(anypeer, cancelled_receives_take_nothing_and_the_rest_take_everything)
{
    slot_t *slots = calloc(3 * PER, sizeof(*slots));
    int kept[2 * PER], nkept = 0;
    two_t t;

    two_start(&t);
    /* every third receive is cancelled before anything arrives */
    for (int k = 0; k < 3 * PER; k++) {
        cr_assert(TP_POSTED(xfer_tag_recv(t.ctx, NULL, TAG, ALL, slots[k].buf, MAXLEN, NULL,
                                          NULL, NULL, &slots[k].req)));
        if (k % 3 == 1) {
            cr_assert_eq(xfer_request_cancel(slots[k].req), XFER_OK);
            cr_assert_eq(xfer_request_wait(slots[k].req, TP_WAIT_MS), XFER_ERR_CANCELED);
        } else {
            kept[nkept++] = k;
        }
    }
    tp_send(&t.peer[0], 1);
    tp_send(&t.peer[1], 1);
    wait_all(t.ctx, slots, kept, nkept);
    check_taken(slots, kept, nkept);
    for (int k = 0; k < 3 * PER; k++) {
        xfer_request_release(slots[k].req);
    }
    cr_assert_eq(tp_recv(&t.peer[0]), 1);
    cr_assert_eq(tp_recv(&t.peer[1]), 1);
    two_finish(&t);
    free(slots);
}

Test(anypeer, receives_from_any_peer_still_pending_end_once_at_destroy)
{
    slot_t *slots = calloc(8, sizeof(*slots));
    two_t t;

    two_start(&t);
    for (int k = 0; k < 8; k++) {
        cr_assert(TP_POSTED(xfer_tag_recv(t.ctx, NULL, TAG + 1, ALL, slots[k].buf, MAXLEN,
                                          NULL, NULL, NULL, &slots[k].req)));
    }
    xfer_progress(t.ctx);
    for (int k = 0; k < 8; k++) {
        cr_assert_eq(xfer_request_test(slots[k].req), XFER_INPROGRESS);
        xfer_request_release(slots[k].req);     /* freed when they end, at destroy */
    }
    two_finish(&t);
    free(slots);
}
