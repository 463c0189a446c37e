/*
 * What a completion callback may do, between real processes: close its own endpoint, close
 * another endpoint (while that one is being torn down with a tensor half sent), progress and
 * test other requests, release its request and post the next one, and close an endpoint whose
 * peer died. Every callback must run exactly once, after the transport has finished with its
 * own structures; ASan and valgrind runs of this suite catch a callback that runs inside a
 * walk it breaks. A fetch's allocation callback, which does run inside the transport's
 * receive path, is refused every call that could reach the transport.
 */
#include "test_peer.h"
#include "tensor_peer.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void setup(void)
{
    tp_env();
}

static void setup_log(void)
{
    tp_env();
    cr_redirect_stderr();
}

TestSuite(callbacks, .init = setup, .timeout = 180);

#define ALL     (~0ull)
#define BIG     (64u << 20)     /* stays in the send path of a peer that does not progress */
#define PENDING 8

typedef struct call {
    int           calls;
    xfer_status_t status;
    int           order;        /* when it ran, among the calls of a test */
} call_t;

static int call_clock;

static void call_record(call_t *c, xfer_status_t status)
{
    c->calls++;
    c->status = status;
    c->order  = ++call_clock;
}

static void record_cb(xfer_request_t *req, xfer_status_t status, void *arg)
{
    (void)req;
    call_record(arg, status);
}

/* Progress ctx until *flag is set or timeout_ms passes; returns the flag. */
static int progress_until(xfer_context_t *ctx, const int *flag, int timeout_ms)
{
    double end = tp_now_ms() + timeout_ms;

    while (!*flag && (tp_now_ms() < end)) {
        xfer_progress(ctx);
    }
    return *flag;
}

static int all_called(const call_t *c, int n)
{
    for (int i = 0; i < n; i++) {
        if (c[i].calls == 0) {
            return 0;
        }
    }
    return 1;
}

static void progress_until_all_called(xfer_context_t *ctx, const call_t *c, int n)
{
    double end = tp_now_ms() + TP_WAIT_MS;

    while (!all_called(c, n) && (tp_now_ms() < end)) {
        xfer_progress(ctx);
    }
    for (int i = 0; i < n; i++) {
        cr_assert_eq(c[i].calls, 1, "callback %d ran %d times", i, c[i].calls);
    }
}

/* ---- children -------------------------------------------------------------------------------- */

/* On a word from the parent: send one 64-byte message with that tag; then stop progressing
 * until the next word (what the parent sends meanwhile stays on its way). */
static int srv_send_on_word(tp_side_t *s)
{
    char buf[64];
    xfer_request_t *req = NULL;
    uint64_t tag;

    memset(buf, 0x5a, sizeof(buf));
    TP_CHECK(tp_ctl_recv_u64(s->ctl, &tag, TP_WAIT_MS) == 0, "ctl");
    TP_CHECK(TP_POSTED(xfer_tag_send(s->ep, tag, buf, sizeof(buf), NULL, NULL, NULL, &req)),
             "send");
    TP_CHECK_STATUS(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
    xfer_request_release(req);
    TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
    tp_ctl_recv_u64(s->ctl, &tag, TP_WAIT_MS * 3);
    return 0;
}

/* Fetch the parent's BIG tensor, progress long enough for the request to leave, then stop
 * progressing until a word: the parent's answer stays half sent. */
static int cli_fetch_and_stall(tp_side_t *s)
{
    char *buf = malloc(BIG);
    xfer_fetch_params_t fp = {.size = sizeof(fp), .buffer = buf, .capacity = BIG};
    xfer_request_t *req = NULL;
    uint64_t v;

    TP_CHECK(TP_POSTED(xfer_tensor_fetch(s->ep, 1, "big", &fp, NULL, NULL, &req)), "fetch");
    tp_progress_for(s->ctx, 300);
    TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
    tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS * 3);
    return 0;       /* the fetch ends with the context, in whatever state */
}

/* Say it is ready, then wait for a word, doing nothing with xfer. */
static int srv_idle(tp_side_t *s)
{
    uint64_t v;

    TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
    tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS * 3);
    return 0;
}

/* ---- a callback that closes its own endpoint -------------------------------------------------- */

typedef struct self_close {
    xfer_endpoint_t *ep;
    call_t          call;
    int             closed;
} self_close_t;

static void close_own_ep_cb(xfer_request_t *req, xfer_status_t status, void *arg)
{
    self_close_t *sc = arg;

    (void)req;
    call_record(&sc->call, status);
    /* forced: the send the peer does not take would keep a graceful close waiting */
    (void)xfer_endpoint_close_nb(sc->ep, XFER_CLOSE_FLAG_FORCE, NULL, NULL, NULL);
    sc->closed = 1;
}

Test(callbacks, a_callback_closes_its_own_endpoint_with_operations_pending)
{
    call_t pend[PENDING + 1];
    self_close_t sc = {0};
    char *big = malloc(BIG), small[PENDING][64], first[64];
    tp_peer_t p;

    memset(pend, 0, sizeof(pend));
    tp_fill_pattern(big, BIG, 3);
    tp_start(&p, srv_send_on_word, NULL);
    sc.ep = p.ep;
    for (int i = 0; i < PENDING; i++) {
        cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 2, ALL, small[i], sizeof(small[i]), NULL,
                                          record_cb, &pend[i], NULL)));
    }
    cr_assert(TP_POSTED(xfer_tag_send(p.ep, 9, big, BIG, NULL, record_cb, &pend[PENDING],
                                      NULL)));
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 1, ALL, first, sizeof(first), NULL,
                                      close_own_ep_cb, &sc, NULL)));
    tp_send(&p, 1);
    cr_assert(progress_until(p.ctx, &sc.closed, TP_WAIT_MS), "the message never came");
    cr_expect_eq(sc.call.calls, 1);
    cr_expect_eq(sc.call.status, XFER_OK);
    p.ep = NULL;
    progress_until_all_called(p.ctx, pend, PENDING + 1);
    for (int i = 0; i < PENDING; i++) {
        cr_expect_eq(pend[i].status, XFER_ERR_CANCELED, "receive %d: %s", i,
                     xfer_status_string(pend[i].status));
        cr_expect_gt(pend[i].order, sc.call.order, "a cancelled receive's callback ran inside "
                     "the callback that closed its endpoint");
    }
    cr_expect(pend[PENDING].status != XFER_OK || !strcmp(tp_transport(), "verbs"),
              "a 64 MiB send to a peer that stopped progressing cannot have completed");
    tp_recv(&p);
    tp_send(&p, 0);
    tp_another_peer_works(p.ctx, (const size_t[]){100000, 0});
    tp_finish(&p);
    free(big);
}

/* Send two MID-byte messages (tags 1 and 2, patterns 1 and 2) at once, then report each
 * send's final status; the parent closes its endpoint from the first one's callback. */
#define MID (16u << 20)

static int srv_send_two_large(tp_side_t *s)
{
    char *buf[2] = {malloc(MID), malloc(MID)};
    xfer_request_t *req[2] = {NULL, NULL};

    TP_CHECK((buf[0] != NULL) && (buf[1] != NULL), "malloc");
    for (int i = 0; i < 2; i++) {
        tp_fill_pattern(buf[i], MID, 1 + i);
        TP_CHECK(TP_POSTED(xfer_tag_send(s->ep, 1 + i, buf[i], MID, NULL, NULL, NULL,
                                         &req[i])), "send");
    }
    for (int i = 0; i < 2; i++) {
        TP_CHECK(tp_ctl_send_u64(s->ctl, (uint64_t)(int64_t)xfer_request_wait(req[i],
                                                                           TP_WAIT_MS)) == 0,
                 "ctl");
        xfer_request_release(req[i]);
        free(buf[i]);
    }
    return 0;
}

/* Two large messages are read a slice at a time, in turn (XFER_FAIR_SLICE), so the second is
 * in the middle of its way when the first completes; the first's callback force-closes the
 * endpoint. The second ends exactly once: whole, or cancelled by the close (C23), never
 * half-filled and reported received; the peer's sends end rather than hang. */
Test(callbacks, a_callback_closes_its_endpoint_while_another_large_message_is_read)
{
    char *buf[2] = {calloc(1, MID), calloc(1, MID)};
    call_t second = {0};
    self_close_t sc = {0};
    xfer_status_t sent[2];
    tp_peer_t p;

    cr_assert((buf[0] != NULL) && (buf[1] != NULL));
    setenv("XFER_FAIR_SLICE", "64k", 0);
    tp_start(&p, srv_send_two_large, NULL);
    sc.ep = p.ep;
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 1, ALL, buf[0], MID, NULL, close_own_ep_cb,
                                      &sc, NULL)));
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 2, ALL, buf[1], MID, NULL, record_cb,
                                      &second, NULL)));
    cr_assert(progress_until(p.ctx, &sc.closed, TP_WAIT_MS), "the first message never came");
    p.ep = NULL;
    cr_expect_eq(sc.call.calls, 1);
    cr_expect_eq(sc.call.status, XFER_OK);
    cr_expect_eq(tp_check_pattern(buf[0], MID, 1), -1, "the first message is not whole");
    progress_until_all_called(p.ctx, &second, 1);
    cr_expect(second.status == XFER_OK || second.status == XFER_ERR_CANCELED,
              "the second receive ended %s", xfer_status_string(second.status));
    if (second.status == XFER_OK) {
        cr_expect_eq(tp_check_pattern(buf[1], MID, 2), -1,
                     "the second message was reported received but is not whole");
    }
    cr_log_info("second receive: %s", xfer_status_string(second.status));
    for (int i = 0; i < 2; i++) {
        sent[i] = (xfer_status_t)(int64_t)tp_recv(&p);
        cr_expect_neq(sent[i], XFER_ERR_TIMEOUT, "send %d still pending after the close", i);
    }
    /* sent[0] may be an error although the message arrived: a forced close drops the
     * receipt that a rendezvous send waits for when it was not out yet (C23) */
    cr_log_info("the peer's sends ended %s, %s", xfer_status_string(sent[0]),
                xfer_status_string(sent[1]));
    tp_child_expect_ok(&p, 30);
    tp_another_peer_works(p.ctx, (const size_t[]){100000, 0});
    xfer_context_destroy(p.ctx);
    free(buf[0]);
    free(buf[1]);
}

/* ---- callbacks that close endpoints while one is torn down in the middle of a batch ---------- */

typedef struct cross {
    xfer_endpoint_t *victims[2];
    call_t          call;
    int             closed;
} cross_t;

static void close_victims_cb(xfer_request_t *req, xfer_status_t status, void *arg)
{
    cross_t *c = arg;

    (void)req;
    call_record(&c->call, status);
    for (int i = 0; i < 2; i++) {
        if (c->victims[i] != NULL) {
            xfer_endpoint_close(c->victims[i]);
            c->victims[i] = NULL;
        }
    }
    c->closed = 1;
}

/* The consumer dies while our answer to its fetch is half sent; another peer's message waits
 * on its connection at the same time, so one round of progress sees both. The publish ends
 * with the dead endpoint's teardown, and its callback closes that very endpoint and the other
 * one, whose input the same round was about to read. */
Test(callbacks, a_publish_callback_closes_endpoints_in_the_middle_of_a_teardown)
{
    tp_peer_t consumer, sender;
    char *data = malloc(BIG), small[PENDING][64];
    xfer_tensor_t t = {.dtype = XFER_DTYPE_UINT8, .rank = 1, .dims = {BIG}, .size = BIG};
    cross_t on_publish = {0};
    call_t sender_recvs[PENDING];
    xfer_endpoint_t *ep_consumer, *ep_sender;
    xfer_listener_t *l;
    xfer_context_t *ctx;
    char addr[64];

    memset(sender_recvs, 0, sizeof(sender_recvs));
    tp_fill_pattern(data, BIG, 5);
    t.data = data;
    ctx = tp_context(0);
    tp_server_spawn(&sender, srv_send_on_word, NULL, NULL);
    ep_sender = tp_connect(ctx, &sender);
    /* the consumer connects to us */
    cr_assert_eq(xfer_listen(ctx, "127.0.0.1:0", &l), XFER_OK);
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", xfer_listener_port(l));
    tp_client_spawn(&consumer, addr, cli_fetch_and_stall, NULL, NULL);
    cr_assert_eq(xfer_accept(l, TP_WAIT_MS, &ep_consumer), XFER_OK);
    xfer_listener_close(l);
    for (int i = 0; i < PENDING; i++) {
        cr_assert(TP_POSTED(xfer_tag_recv(ctx, ep_sender, 2, ALL, small[i], sizeof(small[i]),
                                          NULL, record_cb, &sender_recvs[i], NULL)));
    }
    on_publish.victims[0] = ep_consumer;
    on_publish.victims[1] = ep_sender;
    cr_assert_eq(xfer_tensor_publish(ctx, 1, "big", &t, 0, close_victims_cb, &on_publish,
                                     NULL), XFER_OK);
    cr_assert_eq(tp_recv(&consumer), 1);    /* its fetch has left */
    tp_progress_for(ctx, 300);              /* our answer starts, and stalls */
    /* no progress from here until both events wait: the death first, then the message */
    cr_assert_eq(kill(consumer.pid, SIGKILL), 0);
    cr_assert_eq(tp_child_wait(&consumer, 10), 128 + SIGKILL);
    usleep(100000);
    tp_send(&sender, 1);
    cr_assert_eq(tp_recv(&sender), 1);
    usleep(100000);
    cr_assert(progress_until(ctx, &on_publish.closed, TP_WAIT_MS), "the publish never ended");
    cr_expect_eq(on_publish.call.calls, 1);
    progress_until_all_called(ctx, sender_recvs, PENDING);
    for (int i = 0; i < PENDING; i++) {
        cr_expect_eq(sender_recvs[i].status, XFER_ERR_CANCELED);
    }
    tp_another_peer_works(ctx, (const size_t[]){100000, 0});
    xfer_context_destroy(ctx);
    tp_send(&sender, 0);
    tp_child_expect_ok(&sender, 30);
    free(data);
}

/* ---- the callbacks of a closing endpoint's operations progress -------------------------------- */

typedef struct closing {
    xfer_context_t *ctx;
    xfer_request_t *other;
    call_t         calls[PENDING];
    int            index[PENDING];
    unsigned       progressed;
} closing_t;

static closing_t *the_closing;

static void progress_on_cancel_cb(xfer_request_t *req, xfer_status_t status, void *arg)
{
    closing_t *c = the_closing;

    (void)req;
    call_record(&c->calls[*(int*)arg], status);
    c->progressed += xfer_progress(c->ctx);
    (void)xfer_request_test(c->other);
}

/* A transport that ran their callbacks while it walked its completions would see the walk's
 * next element freed by the progress a callback makes, and complete it twice. */
Test(callbacks, callbacks_of_cancelled_operations_progress_while_their_endpoint_closes,
     .init = setup_log)
{
    char *log;
    closing_t *c = calloc(1, sizeof(*c));
    char small[PENDING][64], other[64];
    char *big = malloc(BIG);
    call_t send_call = {0};
    tp_peer_t p;

    the_closing = c;
    tp_fill_pattern(big, BIG, 9);
    tp_start(&p, srv_idle, NULL);
    cr_assert_eq(tp_recv(&p), 1);
    c->ctx = p.ctx;
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, NULL, 3, ALL, other, sizeof(other), NULL, NULL,
                                      NULL, &c->other)));
    for (int i = 0; i < PENDING; i++) {
        c->index[i] = i;
        cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 2, ALL, small[i], sizeof(small[i]), NULL,
                                          progress_on_cancel_cb, &c->index[i], NULL)));
    }
    cr_assert(TP_POSTED(xfer_tag_send(p.ep, 9, big, BIG, NULL, record_cb, &send_call, NULL)));
    tp_progress_for(p.ctx, 100);
    cr_assert_eq(xfer_endpoint_close_nb(p.ep, XFER_CLOSE_FLAG_FORCE, NULL, NULL, NULL),
                 XFER_OK);
    p.ep = NULL;
    progress_until_all_called(p.ctx, c->calls, PENDING);
    progress_until_all_called(p.ctx, &send_call, 1);
    for (int i = 0; i < PENDING; i++) {
        cr_expect_eq(c->calls[i].status, XFER_ERR_CANCELED);
    }
    cr_assert_eq(xfer_request_cancel(c->other), XFER_OK);
    cr_expect_eq(xfer_request_wait(c->other, TP_WAIT_MS), XFER_ERR_CANCELED);
    xfer_request_release(c->other);
    tp_send(&p, 0);
    tp_finish(&p);
    log = tu_read_redirected_stderr();
    cr_expect_null(strstr(log, "completed twice"), "a completion was delivered twice:\n%s",
                   log);
    free(log);
    free(big);
    free(c);
}

/* ---- callbacks that progress and test other requests ------------------------------------------ */

#define CHAIN 200

static int srv_send_numbered(tp_side_t *s)
{
    uint64_t n, v;

    TP_CHECK(tp_ctl_recv_u64(s->ctl, &n, TP_WAIT_MS) == 0, "ctl");
    for (uint64_t i = 0; i < n; i++) {
        uint8_t buf[256];
        size_t len = 1 + (i * 37) % sizeof(buf);
        xfer_request_t *req = NULL;

        tp_fill_pattern(buf, len, i);
        TP_CHECK(TP_POSTED(xfer_tag_send(s->ep, 100 + (i % 3), buf, len, NULL, NULL, NULL,
                                         &req)), "send %llu", (unsigned long long)i);
        TP_CHECK_STATUS(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
        xfer_request_release(req);
    }
    TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS) == 0, "no word");
    tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS);
    return 0;
}

typedef struct chain {
    xfer_context_t *ctx;
    xfer_endpoint_t *ep;
    xfer_request_t *reqs[CHAIN];
    uint8_t        bufs[CHAIN][256];
    call_t         calls[CHAIN];
    int            index[CHAIN];
    int            tests_inprogress;
    unsigned       progressed;
} chain_t;

static chain_t *the_chain;

static void progress_and_test_cb(xfer_request_t *req, xfer_status_t status, void *arg)
{
    chain_t *c = the_chain;
    int i      = *(int*)arg;

    (void)req;
    call_record(&c->calls[i], status);
    c->progressed += xfer_progress(c->ctx);
    if (i + 1 < CHAIN) {
        /* another request, maybe completing inside this very call */
        if (xfer_request_test(c->reqs[i + 1]) == XFER_INPROGRESS) {
            c->tests_inprogress++;
        }
    }
}

Test(callbacks, callbacks_that_progress_and_test_keep_per_peer_order)
{
    chain_t *c = calloc(1, sizeof(*c));
    tp_peer_t p;

    the_chain = c;
    tp_start(&p, srv_send_numbered, NULL);
    c->ctx = p.ctx;
    c->ep  = p.ep;
    for (int i = 0; i < CHAIN; i++) {
        c->index[i] = i;
        /* the tags repeat every 3 messages: matching is by arrival order within a tag */
        cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 100 + (i % 3), ALL, c->bufs[i], 256, NULL,
                                          progress_and_test_cb, &c->index[i], &c->reqs[i])));
    }
    call_clock = 0;
    tp_send(&p, CHAIN);
    progress_until_all_called(p.ctx, c->calls, CHAIN);
    for (int i = 0; i < CHAIN; i++) {
        size_t len = 1 + ((size_t)i * 37) % 256;

        cr_assert_eq(c->calls[i].status, XFER_OK, "message %d: %s", i,
                     xfer_status_string(c->calls[i].status));
        cr_assert_eq(xfer_request_length(c->reqs[i]), len);
        cr_assert_eq(tp_check_pattern(c->bufs[i], len, (uint64_t)i), -1, "message %d", i);
        cr_assert_eq(c->calls[i].order, i + 1, "callback of message %d ran %d-th", i,
                     c->calls[i].order);
        xfer_request_release(c->reqs[i]);
    }
    tp_send(&p, 0);
    tp_finish(&p);
    free(c);
}

/* ---- a callback that releases its request and posts the next one ------------------------------ */

#define REPOST 1000

static int srv_send_many(tp_side_t *s)
{
    uint64_t v;
    static uint8_t buf[300000];

    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
    for (uint64_t i = 0; i < REPOST; i++) {
        /* every 50th is large: the paths of big messages (rendezvous, zero copy) too */
        size_t len = (i % 50 == 49) ? sizeof(buf) : 8 + i % 512;
        xfer_request_t *req = NULL;

        tp_fill_pattern(buf, len, 1000 + i);
        TP_CHECK(TP_POSTED(xfer_tag_send(s->ep, 7, buf, len, NULL, NULL, NULL, &req)), "send");
        TP_CHECK_STATUS(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
        xfer_request_release(req);
    }
    TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS) == 0, "no word");
    tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS);
    return 0;
}

typedef struct repost {
    xfer_context_t *ctx;
    xfer_endpoint_t *ep;
    uint8_t        buf[300000];
    int            received, bad, failed;
} repost_t;

static void release_and_repost_cb(xfer_request_t *req, xfer_status_t status, void *arg)
{
    repost_t *r = arg;
    size_t len  = xfer_request_length(req);
    xfer_status_t s;

    if ((status != XFER_OK) || (tp_check_pattern(r->buf, len, 1000 + r->received) != -1)) {
        r->bad++;
    }
    r->received++;
    xfer_request_release(req);      /* inside its own callback: freed when this returns */
    if (r->received < REPOST) {
        s = xfer_tag_recv(r->ctx, r->ep, 7, ALL, r->buf, sizeof(r->buf), NULL,
                          release_and_repost_cb, r, NULL);
        r->failed += !TP_POSTED(s);
    }
}

Test(callbacks, a_callback_releases_its_request_and_posts_the_next)
{
    repost_t *r = calloc(1, sizeof(*r));
    double end;
    tp_peer_t p;

    tp_start(&p, srv_send_many, NULL);
    r->ctx = p.ctx;
    r->ep  = p.ep;
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 7, ALL, r->buf, sizeof(r->buf), NULL,
                                      release_and_repost_cb, r, NULL)));
    tp_send(&p, 1);
    end = tp_now_ms() + 3 * TP_WAIT_MS;
    while ((r->received < REPOST) && (tp_now_ms() < end)) {
        xfer_progress(p.ctx);
    }
    cr_assert_eq(r->received, REPOST, "%d messages received", r->received);
    cr_expect_eq(r->bad, 0, "%d messages wrong", r->bad);
    cr_expect_eq(r->failed, 0, "%d re-posts refused", r->failed);
    tp_send(&p, 0);
    tp_finish(&p);
    free(r);
}

/* ---- callbacks that close an endpoint whose peer died ---------------------------------------- */

typedef struct dead {
    xfer_endpoint_t *ep;
    call_t          calls[PENDING];
    int             closes;
} dead_t;

static dead_t *the_dead;

static void close_once_cb(xfer_request_t *req, xfer_status_t status, void *arg)
{
    dead_t *d = the_dead;

    (void)req;
    call_record(arg, status);
    if (d->ep != NULL) {
        xfer_endpoint_close(d->ep);     /* the first of the failing receives closes it */
        d->ep = NULL;
        d->closes++;
    }
}

Test(callbacks, callbacks_of_a_dead_peer_close_its_endpoint)
{
    dead_t *d = calloc(1, sizeof(*d));
    char small[PENDING][64];
    tp_peer_t p;

    the_dead = d;
    tp_start(&p, srv_idle, NULL);
    d->ep = p.ep;
    for (int i = 0; i < PENDING; i++) {
        cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 2, ALL, small[i], sizeof(small[i]), NULL,
                                          close_once_cb, &d->calls[i], NULL)));
    }
    cr_assert_eq(tp_recv(&p), 1);
    cr_assert_eq(kill(p.pid, SIGKILL), 0);
    cr_assert_eq(tp_child_wait(&p, 10), 128 + SIGKILL);
    p.ep = NULL;
    progress_until_all_called(p.ctx, d->calls, PENDING);
    cr_expect_eq(d->closes, 1);
    for (int i = 0; i < PENDING; i++) {
        cr_expect(d->calls[i].status < 0, "receive %d: %s", i,
                  xfer_status_string(d->calls[i].status));
    }
    tp_another_peer_works(p.ctx, (const size_t[]){100000, 0});
    xfer_context_destroy(p.ctx);
    free(d);
}

/* ---- the allocation callback runs inside the receive path ------------------------------------ */

typedef struct alloc_probe {
    xfer_context_t  *ctx;
    xfer_endpoint_t *ep;
    xfer_request_t  *other;
    unsigned        progressed;
    xfer_status_t   test_status, cancel_status, abort_status, send_status;
    void            *buf;
} alloc_probe_t;

static void *probing_alloc(const xfer_tensor_t *meta, void *arg)
{
    alloc_probe_t *a = arg;
    char byte = 1;

    a->progressed    = xfer_progress(a->ctx);
    a->test_status   = xfer_request_test(a->other);
    a->cancel_status = xfer_request_cancel(a->other);
    a->abort_status  = xfer_tensor_abort(a->ctx, 99, XFER_ERR_ABORTED);
    a->send_status   = xfer_tag_send(a->ep, 1, &byte, 1, NULL, NULL, NULL, NULL);
    xfer_endpoint_close(a->ep);     /* refused: the endpoint must still work afterwards */
    a->buf = malloc(meta->size ? meta->size : 1);
    return a->buf;
}

Test(callbacks, the_allocation_callback_cannot_reach_into_the_transport)
{
    int64_t dims[1] = {1000};
    spec_t sp = spec_make(1, "w", XFER_DTYPE_FLOAT32, 1, dims, 21);
    alloc_probe_t a = {0};
    xfer_fetch_params_t fp = {.size = sizeof(fp), .alloc = probing_alloc, .alloc_arg = &a};
    xfer_request_t *req = NULL;
    char small[8];
    tp_peer_t p;

    tp_start(&p, srv_producer, NULL);
    a.ctx = p.ctx;
    a.ep  = p.ep;
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 5, ALL, small, sizeof(small), NULL, NULL,
                                      NULL, &a.other)));
    publish_ok(&p, &sp);
    cr_assert_eq(xfer_tensor_fetch(p.ep, 1, "w", &fp, NULL, NULL, &req), XFER_OK);
    cr_assert_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
    cr_expect_eq(a.progressed, 0u);
    cr_expect_eq(a.test_status, XFER_INPROGRESS, "test: %s", xfer_status_string(a.test_status));
    cr_expect_eq(a.cancel_status, XFER_ERR_BUSY);
    cr_expect_eq(a.abort_status, XFER_ERR_BUSY);
    cr_expect_eq(a.send_status, XFER_ERR_BUSY);
    cr_expect_eq(xfer_request_tensor(req)->size, sp.t.size);
    cr_expect_eq(tp_check_pattern(xfer_request_tensor(req)->data, sp.t.size, sp.seed), -1);
    xfer_request_release(req);
    free(a.buf);
    cr_expect_eq(xfer_endpoint_status(p.ep), XFER_OK);
    cr_assert_eq(xfer_request_cancel(a.other), XFER_OK);
    cr_expect_eq(xfer_request_wait(a.other, TP_WAIT_MS), XFER_ERR_CANCELED);
    xfer_request_release(a.other);
    producer_done(&p);
}

/* ---- destroy delivers every pending callback once -------------------------------------------- */

Test(callbacks, destroy_delivers_each_pending_callback_once)
{
    call_t any[PENDING], own[PENDING];
    char small[2 * PENDING][64];
    tp_peer_t p;

    memset(any, 0, sizeof(any));
    memset(own, 0, sizeof(own));
    tp_start(&p, srv_idle, NULL);
    for (int i = 0; i < PENDING; i++) {
        cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, NULL, 2, ALL, small[i], 64, NULL, record_cb,
                                          &any[i], NULL)));
        cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 3, ALL, small[PENDING + i], 64, NULL,
                                          record_cb, &own[i], NULL)));
    }
    cr_assert_eq(tp_recv(&p), 1);
    xfer_context_destroy(p.ctx);
    p.ctx = NULL;
    p.ep  = NULL;
    for (int i = 0; i < PENDING; i++) {
        cr_expect_eq(any[i].calls, 1, "any-peer receive %d: %d calls", i, any[i].calls);
        cr_expect_eq(own[i].calls, 1, "receive %d: %d calls", i, own[i].calls);
        cr_expect_eq(any[i].status, XFER_ERR_CANCELED);
        cr_expect_eq(own[i].status, XFER_ERR_CANCELED);
    }
    tp_send(&p, 0);
    tp_finish(&p);
}
