/*
 * Scenarios that press on what is particular to the verbs component, between two real
 * processes: credits (thousands of eager messages before any receive, with and without a cap
 * on the unexpected queue), every size around the eager limit (SEG_SIZE 8192 less a 16-byte
 * TAG header = 8176) and rendezvous by RDMA READ, registered and unregistered buffers (the MR
 * cache), rendezvous truncation, a peer killed in the middle of 64 MiB transfers, a link that
 * goes down under traffic (RC retries and keepalive probes, not the bootstrap socket, must
 * notice), transport selection, and thousands of puts and gets in flight. Every payload is a
 * pattern checked byte for byte.
 *
 * Runs only over verbs with an RDMA device present, i.e. inside the Soft-RoCE guest (else
 * every test is skipped, saying why); test/verbs_suites.sh gives Criterion the tmpfs /tmp it
 * needs there:
 *   XFERTEST_TRANSPORT=verbs contrib/rxe_guest -- test/verbs_suites.sh build verbs
 *   XFERTEST_TRANSPORT=verbs contrib/rxe_guest --two-hosts -- \
 *       test/verbs_suites.sh build verbs:link_down
 * link_down needs the second form (two RDMA devices on the two ends of a veth pair).
 * Sizes are chosen for TCG emulation (tens of MB/s of RDMA): each test takes seconds there.
 */
#include "test_peer.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ALL      (~0ull)
#define CANARY   16
#define FAIL_MS  10000          /* a dead peer must be noticed within this */

static void setup(void)
{
    tp_env();
    if (strcmp(tp_transport(), "verbs") != 0) {
        cr_skip_test("verbs suites run over XFERTEST_TRANSPORT=verbs (now '%s') in the "
                     "Soft-RoCE guest: contrib/rxe_guest", tp_transport());
    }
    if (!tu_host_has_rdma()) {
        cr_skip_test("no RDMA device: verbs suites run in the Soft-RoCE guest: "
                     "contrib/rxe_guest");
    }
}

TestSuite(verbs, .init = setup, .timeout = 150);

/* ---- helpers for both sides ------------------------------------------------------------------ */

static uint64_t child_word(tp_side_t *s)
{
    uint64_t v;

    TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS) == 0, "no word from the parent");
    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
    return v;
}

static void child_say(tp_side_t *s, uint64_t v)
{
    TP_CHECK(tp_ctl_send_u64(s->ctl, v) == 0, "ctl");
}

static void *xmalloc(size_t len)
{
    void *p = malloc(len ? len : 1);

    if (p == NULL) {
        fprintf(stderr, "malloc(%zu) failed\n", len);
        _exit(3);
    }
    return p;
}

/* Wait for req: its final status, or XFER_INPROGRESS when it is still pending after
 * timeout_ms (XFER_ERR_TIMEOUT is a status an operation may end with, e.g. on a dead link). */
static xfer_status_t req_wait(xfer_request_t *req, int timeout_ms)
{
    xfer_status_t s = xfer_request_wait(req, timeout_ms);

    return (s == XFER_ERR_TIMEOUT) ? xfer_request_test(req) : s;
}

/* req_wait(), then release the request; length and tag through the pointers. */
static xfer_status_t req_done(xfer_request_t *req, int timeout_ms, size_t *len_p, uint64_t *tag_p)
{
    xfer_status_t s = req_wait(req, timeout_ms);

    if (len_p != NULL) {
        *len_p = xfer_request_length(req);
    }
    if (tag_p != NULL) {
        *tag_p = xfer_request_tag(req);
    }
    xfer_request_release(req);      /* a pending one goes when it completes */
    return s;
}

/* =============================================================================================
 * 1. credit exhaustion: 5000 eager messages posted before the receiver posts anything
 * ============================================================================================= */

#define NCREDIT   5000
#define CREDIT_SZ 64

/* Posts NCREDIT sends (tag i, pattern 10000 + i) at once, says so, then waits for all. */
static int srv_credit(tp_side_t *s)
{
    char *buf = xmalloc((size_t)NCREDIT * CREDIT_SZ);
    xfer_request_t **reqs = xmalloc(NCREDIT * sizeof(*reqs));

    child_word(s);
    for (int i = 0; i < NCREDIT; i++) {
        xfer_status_t st;

        tp_fill_pattern(buf + (size_t)i * CREDIT_SZ, CREDIT_SZ, 10000 + i);
        reqs[i] = NULL;
        st = xfer_tag_send(s->ep, (uint64_t)i, buf + (size_t)i * CREDIT_SZ, CREDIT_SZ, NULL,
                           NULL, NULL, &reqs[i]);
        TP_CHECK(TP_POSTED(st), "send %d of %d: %s", i, NCREDIT, xfer_status_string(st));
    }
    child_say(s, 1);                    /* all posted: the parent may start receiving */
    for (int i = 0; i < NCREDIT; i++) {
        xfer_status_t st = req_done(reqs[i], TP_WAIT_MS, NULL, NULL);
        TP_CHECK(st == XFER_OK, "send %d of %d completed with %s", i, NCREDIT,
                 xfer_status_string(st));
    }
    child_say(s, 2);                    /* every send completed OK */
    child_word(s);
    free(reqs);
    free(buf);
    return 0;
}

static void credit_run(void)
{
    char *buf = calloc(NCREDIT, 2 * CREDIT_SZ);
    xfer_request_t **reqs = calloc(NCREDIT, sizeof(*reqs));
    tp_peer_t p;

    cr_assert(buf && reqs);
    tp_start(&p, srv_credit, NULL);
    tp_send(&p, 1);
    cr_assert_eq(tp_recv(&p), 1, "the peer did not post its sends");
    /* let the first credits' worth land unexpected, and the peer run out */
    tp_progress_for(p.ctx, 300);
    /* any tag, in order: message i must be the i-th to match */
    for (int i = 0; i < NCREDIT; i++) {
        xfer_status_t s = xfer_tag_recv(p.ctx, p.ep, 0, 0, buf + (size_t)i * 2 * CREDIT_SZ,
                                        2 * CREDIT_SZ, NULL, NULL, NULL, &reqs[i]);
        cr_assert(TP_POSTED(s), "recv %d: %s", i, xfer_status_string(s));
    }
    for (int i = 0; i < NCREDIT; i++) {
        size_t len;
        uint64_t tag;
        xfer_status_t s = req_done(reqs[i], TP_WAIT_MS, &len, &tag);
        ssize_t bad;

        cr_assert_eq(s, XFER_OK, "receive %d of %d: %s", i, NCREDIT, xfer_status_string(s));
        cr_assert_eq(tag, (uint64_t)i, "receive %d got message %llu: order broken", i,
                     (unsigned long long)tag);
        cr_assert_eq(len, CREDIT_SZ, "receive %d: %zu bytes", i, len);
        bad = tp_check_pattern(buf + (size_t)i * 2 * CREDIT_SZ, CREDIT_SZ, 10000 + i);
        cr_assert_eq(bad, -1, "message %d: byte %zd is wrong", i, bad);
    }
    cr_assert_eq(tp_recv(&p), 2, "the peer's sends did not all complete OK");
    tp_send(&p, 0);
    tp_finish(&p);
    free(reqs);
    free(buf);
}

Test(verbs, credit_exhaustion)
{
    credit_run();
}

/* The same with the receiver's unexpected queue capped far below what arrives: it holds
 * credits back, the sender stalls, and everything must still flow once receives are posted. */
Test(verbs, credit_exhaustion_with_a_capped_unexpected_queue)
{
    setenv("XFER_VERBS_MAX_UNEXPECTED", "4k", 1);
    credit_run();
}

/* The same with the fewest slots allowed (16): receives are reposted two at a time, and a
 * credit goes back only once its slot is posted again. */
Test(verbs, credit_exhaustion_with_the_fewest_slots)
{
    setenv("XFER_VERBS_RX_QUEUE_LEN", "16", 1);
    setenv("XFER_VERBS_MAX_UNEXPECTED", "4k", 1);
    credit_run();
}

/* The same with the shortest send queue allowed (16) and the default signal interval (32):
 * sends are signalled often enough that the queue never fills with unsignalled ones nothing
 * would complete (it did: the sender stalled for good after 15). */
Test(verbs, credit_exhaustion_with_the_shortest_send_queue)
{
    setenv("XFER_VERBS_TX_QUEUE_LEN", "16", 1);
    unsetenv("XFER_VERBS_SIGNAL_INTERVAL");
    credit_run();
}

/* =============================================================================================
 * 2. mixed sizes around the eager limit, registered and not, receives before and after
 * ============================================================================================= */

#define MX_BATCH   100          /* messages per round: ten times the size cycle */
#define MX_ROUNDS  20
#define MX_TAGS    3
#define MX_NSIZES  10

static const size_t mx_sizes[MX_NSIZES] = {
    0, 1, 63, 64, 4000, 8176, 8177, 65536, 300000, 1u << 20
};

static size_t mx_size(int i)
{
    return mx_sizes[i % MX_NSIZES];
}

static uint64_t mx_seed(int i)
{
    return 7000000 + (uint64_t)i;
}

/* The sender registers every other cycle of ten, the receiver every other twenty: all four
 * combinations meet every size. Nothing registers an empty buffer. */
static int mx_sender_registers(int i)
{
    return ((i / MX_NSIZES) % 2 == 0) && (mx_size(i) > 0);
}

static int mx_receiver_registers(int i)
{
    return ((i / (2 * MX_NSIZES)) % 2 == 0) && (mx_size(i) > 0);
}

/* One registered and one unregistered buffer per position of a round. */
typedef struct mx_pool {
    char       *reg[MX_BATCH];
    xfer_mem_t *mem[MX_BATCH];
    char       *unreg[MX_BATCH];
} mx_pool_t;

static int mx_pool_init(xfer_context_t *ctx, mx_pool_t *pool)
{
    for (int j = 0; j < MX_BATCH; j++) {
        size_t len    = mx_size(j) + CANARY;
        pool->reg[j]   = malloc(len);
        pool->unreg[j] = malloc(len);
        pool->mem[j]   = NULL;
        if ((pool->reg[j] == NULL) || (pool->unreg[j] == NULL)) {
            return -1;
        }
        memset(pool->reg[j], 0, len);
        memset(pool->unreg[j], 0, len);
        if ((mx_size(j) > 0) &&
            (xfer_mem_register(ctx, pool->reg[j], mx_size(j), XFER_MEM_HOST, &pool->mem[j]) !=
             XFER_OK)) {
            return -1;
        }
    }
    return 0;
}

static void mx_pool_fini(mx_pool_t *pool)
{
    for (int j = 0; j < MX_BATCH; j++) {
        if (pool->mem[j] != NULL) {
            xfer_mem_deregister(pool->mem[j]);
        }
        free(pool->reg[j]);
        free(pool->unreg[j]);
    }
}

/* On each "go" (round number + 1): send the round's MX_BATCH messages, say "sent", wait for
 * all of them and say how many completed OK. "go" 0 ends. */
static int srv_mixed(tp_side_t *s)
{
    static mx_pool_t pool;
    xfer_request_t *reqs[MX_BATCH];

    TP_CHECK(mx_pool_init(s->ctx, &pool) == 0, "cannot allocate or register the buffers");
    for (;;) {
        uint64_t go = child_word(s);
        int ok      = 0;

        if (go == 0) {
            break;
        }
        for (int j = 0; j < MX_BATCH; j++) {
            int i      = (int)(go - 1) * MX_BATCH + j;
            int reg    = mx_sender_registers(i);
            char *buf  = reg ? pool.reg[j] : pool.unreg[j];
            xfer_status_t st;

            tp_fill_pattern(buf, mx_size(i), mx_seed(i));
            reqs[j] = NULL;
            st = xfer_tag_send(s->ep, (uint64_t)(i % MX_TAGS), buf, mx_size(i),
                               reg ? pool.mem[j] : NULL, NULL, NULL, &reqs[j]);
            TP_CHECK(TP_POSTED(st), "send %d (%zu bytes, %s): %s", i, mx_size(i),
                     reg ? "registered" : "unregistered", xfer_status_string(st));
        }
        child_say(s, 1);
        for (int j = 0; j < MX_BATCH; j++) {
            int i           = (int)(go - 1) * MX_BATCH + j;
            xfer_status_t st = req_done(reqs[j], TP_WAIT_MS, NULL, NULL);

            if (st == XFER_OK) {
                ok++;
            } else {
                fprintf(stderr, "send %d (%zu bytes, %s) completed with %s\n", i, mx_size(i),
                        mx_sender_registers(i) ? "registered" : "unregistered",
                        xfer_status_string(st));
                TP_CHECK(st != XFER_INPROGRESS, "send %d never completed", i);
            }
        }
        child_say(s, (uint64_t)ok);
    }
    mx_pool_fini(&pool);
    return 0;
}

static void mx_recv_post(tp_peer_t *p, mx_pool_t *pool, int i, xfer_request_t **req_p)
{
    int j     = i % MX_BATCH;
    int reg   = mx_receiver_registers(i);
    char *buf = reg ? pool->reg[j] : pool->unreg[j];
    xfer_status_t s;

    memset(buf + mx_size(i), 0xA5, CANARY);
    *req_p = NULL;
    s = xfer_tag_recv(p->ctx, p->ep, (uint64_t)(i % MX_TAGS), ALL, buf, mx_size(i),
                      reg ? pool->mem[j] : NULL, NULL, NULL, req_p);
    cr_assert(TP_POSTED(s), "recv %d: %s", i, xfer_status_string(s));
}

static void mx_recv_check(mx_pool_t *pool, int i, xfer_request_t *req, const char *when)
{
    int j     = i % MX_BATCH;
    int reg   = mx_receiver_registers(i);
    char *buf = reg ? pool->reg[j] : pool->unreg[j];
    size_t len;
    uint64_t tag;
    xfer_status_t s = req_done(req, TP_WAIT_MS, &len, &tag);
    ssize_t bad;

    cr_assert_eq(s, XFER_OK, "message %d (%zu bytes, sender %s, receiver %s, receive posted "
                 "%s): %s", i, mx_size(i), mx_sender_registers(i) ? "registered" : "unregistered",
                 reg ? "registered" : "unregistered", when, xfer_status_string(s));
    cr_assert_eq(tag, (uint64_t)(i % MX_TAGS));
    cr_assert_eq(len, mx_size(i), "message %d: %zu bytes, expected %zu (order broken?)", i, len,
                 mx_size(i));
    bad = tp_check_pattern(buf, len, mx_seed(i));
    cr_assert_eq(bad, -1, "message %d (%zu bytes, sender %s, receiver %s, receive posted %s): "
                 "byte %zd is wrong", i, len, mx_sender_registers(i) ? "registered" :
                 "unregistered", reg ? "registered" : "unregistered", when, bad);
    for (int k = 0; k < CANARY; k++) {
        cr_assert_eq((uint8_t)buf[len + k], 0xA5, "message %d: written past its %zu bytes", i,
                     len);
    }
}

Test(verbs, mixed_sizes)
{
    static mx_pool_t pool;
    xfer_request_t *reqs[MX_BATCH];
    tp_peer_t p;

    tp_start(&p, srv_mixed, NULL);
    cr_assert_eq(mx_pool_init(p.ctx, &pool), 0);
    for (int r = 0; r < MX_ROUNDS; r++) {
        int base = r * MX_BATCH;

        /* the first half of the round's receives before the messages (a prefix of every
         * tag's stream, so each receive matches its own message), the rest after */
        for (int j = 0; j < MX_BATCH / 2; j++) {
            mx_recv_post(&p, &pool, base + j, &reqs[j]);
        }
        tp_send(&p, (uint64_t)r + 1);
        cr_assert_eq(tp_recv(&p), 1);
        tp_progress_for(p.ctx, 50);
        for (int j = MX_BATCH / 2; j < MX_BATCH; j++) {
            mx_recv_post(&p, &pool, base + j, &reqs[j]);
        }
        for (int j = 0; j < MX_BATCH; j++) {
            mx_recv_check(&pool, base + j, reqs[j], (j < MX_BATCH / 2) ? "before" : "after");
        }
        cr_assert_eq(tp_recv(&p), MX_BATCH, "round %d: not every send completed OK", r);
    }
    tp_send(&p, 0);
    mx_pool_fini(&pool);
    tp_finish(&p);
}

/* =============================================================================================
 * 3. 16 MiB from unregistered memory into unregistered memory, three times (MR cache)
 * ============================================================================================= */

#define UNREG_LEN (16u << 20)
#define UNREG_N   3

static int srv_unreg(tp_side_t *s)
{
    char *buf = xmalloc(UNREG_LEN);

    for (int k = 0; k < UNREG_N; k++) {
        xfer_request_t *req = NULL;
        xfer_status_t st;

        tp_fill_pattern(buf, UNREG_LEN, 300 + k);
        child_word(s);
        st = xfer_tag_send(s->ep, 30 + (uint64_t)k, buf, UNREG_LEN, NULL, NULL, NULL, &req);
        TP_CHECK(TP_POSTED(st), "send %d: %s", k, xfer_status_string(st));
        st = req_done(req, TP_WAIT_MS, NULL, NULL);
        child_say(s, (uint64_t)(int64_t)st);
    }
    child_word(s);
    free(buf);
    return 0;
}

Test(verbs, unregistered_rendezvous)
{
    char *buf = malloc(UNREG_LEN + CANARY);
    tp_peer_t p;

    cr_assert_not_null(buf);
    tp_start(&p, srv_unreg, NULL);
    for (int k = 0; k < UNREG_N; k++) {
        xfer_request_t *req = NULL;
        xfer_status_t s;
        size_t len;
        ssize_t bad;

        memset(buf, 0, UNREG_LEN);
        memset(buf + UNREG_LEN, 0xA5, CANARY);
        s = xfer_tag_recv(p.ctx, p.ep, 30 + (uint64_t)k, ALL, buf, UNREG_LEN, NULL, NULL, NULL,
                          &req);
        cr_assert(TP_POSTED(s), "recv %d: %s", k, xfer_status_string(s));
        tp_send(&p, 1);
        s = req_done(req, TP_WAIT_MS, &len, NULL);
        cr_assert_eq(s, XFER_OK, "16 MiB transfer %d of %d: %s", k + 1, UNREG_N,
                     xfer_status_string(s));
        cr_assert_eq(len, UNREG_LEN);
        bad = tp_check_pattern(buf, UNREG_LEN, 300 + k);
        cr_assert_eq(bad, -1, "16 MiB transfer %d of %d (same buffers again): byte %zd is wrong",
                     k + 1, UNREG_N, bad);
        for (int c = 0; c < CANARY; c++) {
            cr_assert_eq((uint8_t)buf[UNREG_LEN + c], 0xA5, "written past the buffer");
        }
        s = (xfer_status_t)(int64_t)tp_recv(&p);
        cr_assert_eq(s, XFER_OK, "the sender of transfer %d completed with %s", k + 1,
                     xfer_status_string(s));
    }
    tp_send(&p, 0);
    tp_finish(&p);
    free(buf);
}

/* =============================================================================================
 * 4. a rendezvous message truncated by a small receive
 * ============================================================================================= */

#define TR_LEN  (1u << 20)
#define TR_CAP  4096u

/* On each word: one TR_LEN message of tag 40 + n, pattern 400 + n; answers the send's
 * status. Word 0 ends. */
static int srv_trunc(tp_side_t *s)
{
    char *buf = xmalloc(TR_LEN);

    for (;;) {
        uint64_t n = child_word(s);
        xfer_request_t *req = NULL;
        xfer_status_t st;

        if (n == 0) {
            break;
        }
        tp_fill_pattern(buf, TR_LEN, 400 + n);
        st = xfer_tag_send(s->ep, 40 + n, buf, TR_LEN, NULL, NULL, NULL, &req);
        TP_CHECK(TP_POSTED(st), "send: %s", xfer_status_string(st));
        child_say(s, 1);
        st = req_done(req, TP_WAIT_MS, NULL, NULL);
        child_say(s, (uint64_t)(int64_t)st);
    }
    free(buf);
    return 0;
}

/* Receive message n into cap bytes: posted before the message or, with late, after it has
 * arrived. */
static xfer_status_t trunc_recv(tp_peer_t *p, uint64_t n, size_t cap, int late, char *buf,
                                size_t *len_p)
{
    xfer_request_t *req = NULL;
    uint64_t tag;
    xfer_status_t s, sender;

    memset(buf, 0, cap);
    memset(buf + cap, 0xA5, CANARY);
    if (!late) {
        cr_assert(TP_POSTED(xfer_tag_recv(p->ctx, p->ep, 40 + n, ALL, buf, cap, NULL, NULL,
                                          NULL, &req)));
    }
    tp_send(p, n);
    cr_assert_eq(tp_recv(p), 1);
    if (late) {
        tp_progress_for(p->ctx, 100);
        cr_assert(TP_POSTED(xfer_tag_recv(p->ctx, p->ep, 40 + n, ALL, buf, cap, NULL, NULL,
                                          NULL, &req)));
    }
    s = req_done(req, TP_WAIT_MS, len_p, &tag);
    cr_assert_eq(tag, 40 + n);
    for (int c = 0; c < CANARY; c++) {
        cr_assert_eq((uint8_t)buf[cap + c], 0xA5, "a %zu-byte receive wrote past its end", cap);
    }
    sender = (xfer_status_t)(int64_t)tp_recv(p);
    cr_assert_eq(sender, XFER_OK, "the sender of a %s message completed with %s",
                 (*len_p > cap) ? "truncated" : "whole", xfer_status_string(sender));
    return s;
}

Test(verbs, truncation_rendezvous)
{
    char *buf = malloc(TR_LEN + CANARY);
    tp_peer_t p;
    size_t len;
    xfer_status_t s;
    ssize_t bad;

    cr_assert_not_null(buf);
    tp_start(&p, srv_trunc, NULL);
    for (int late = 0; late < 2; late++) {
        uint64_t n = 1 + 2 * (uint64_t)late;
        const char *when = late ? "posted after the RTS arrived" : "posted before";

        s = trunc_recv(&p, n, TR_CAP, late, buf, &len);
        cr_assert_eq(s, XFER_ERR_TRUNCATED, "1 MiB into 4 KiB (%s): %s", when,
                     xfer_status_string(s));
        cr_assert_eq(len, TR_LEN, "a truncated receive (%s) reports %zu bytes, not the "
                     "message's %u", when, len, TR_LEN);
        bad = tp_check_pattern(buf, TR_CAP, 400 + n);
        cr_assert_eq(bad, -1, "the 4 KiB that fit (%s): byte %zd is wrong", when, bad);
        /* the channel goes on: the next message whole */
        s = trunc_recv(&p, n + 1, TR_LEN, late, buf, &len);
        cr_assert_eq(s, XFER_OK, "the message after a truncation: %s", xfer_status_string(s));
        cr_assert_eq(len, TR_LEN);
        bad = tp_check_pattern(buf, TR_LEN, 400 + n + 1);
        cr_assert_eq(bad, -1, "the message after a truncation: byte %zd is wrong", bad);
    }
    tp_send(&p, 0);
    tp_finish(&p);
    free(buf);
}

/* =============================================================================================
 * 5. a peer killed in the middle of 64 MiB transfers
 * ============================================================================================= */

#define KILL_LEN (64u << 20)

typedef struct slot {
    int           calls;
    xfer_status_t status;
} slot_t;

static void slot_cb(xfer_request_t *req, xfer_status_t status, void *arg)
{
    slot_t *s = arg;

    (void)req;
    s->calls++;
    s->status = status;
}

/* A receive for the parent's 64 MiB (tag 2), then streams 64 MiB messages (tag 1) one after
 * the other until killed. */
static int srv_stream(tp_side_t *s)
{
    char *out = xmalloc(KILL_LEN), *in = xmalloc(KILL_LEN);
    xfer_request_t *rreq = NULL;

    memset(in, 0, KILL_LEN);
    tp_fill_pattern(out, KILL_LEN, 500);
    TP_CHECK(TP_POSTED(xfer_tag_recv(s->ctx, s->ep, 2, ALL, in, KILL_LEN, NULL, NULL, NULL,
                                     &rreq)), "recv");
    child_say(s, 1);
    for (int n = 0; n < 50; n++) {
        xfer_request_t *req = NULL;
        xfer_status_t st = xfer_tag_send(s->ep, 1, out, KILL_LEN, NULL, NULL, NULL, &req);

        TP_CHECK(TP_POSTED(st), "send %d: %s", n, xfer_status_string(st));
        TP_CHECK_STATUS(req_done(req, TP_WAIT_MS * 2, NULL, NULL), XFER_OK);
    }
    TP_CHECK(0, "streamed 50 x 64 MiB without being killed");
    return 1;
}

/* A request pending on a dead peer ends with an error, within FAIL_MS. */
static xfer_status_t expect_failure(xfer_request_t *req, double t_kill, int fail_ms,
                                    const char *what)
{
    xfer_status_t s = req_wait(req, fail_ms + 5000);
    double dt       = tp_now_ms() - t_kill;

    cr_expect_neq(s, XFER_INPROGRESS, "%s: still pending %.0f ms after the failure", what, dt);
    cr_expect((s < 0) || (s == XFER_INPROGRESS), "%s: completed with %s although the peer is "
              "gone", what, xfer_status_string(s));
    cr_expect_lt(dt, fail_ms, "%s: took %.0f ms to fail", what, dt);
    cr_log_info("%s: ended with '%s' after %.0f ms", what, xfer_status_string(s), dt);
    return s;
}

Test(verbs, peer_killed_midtransfer)
{
    char *in = malloc(KILL_LEN), *out = malloc(KILL_LEN);
    xfer_request_t *first = NULL, *recv = NULL, *send = NULL, *any = NULL, *late = NULL;
    xfer_request_t *pending = NULL;
    volatile uint64_t *mark = (volatile uint64_t *)(void *)(in + KILL_LEN / 8);
    volatile uint64_t *tail = (volatile uint64_t *)(void *)(in + KILL_LEN - 8);
    slot_t recv_slot = {0}, send_slot = {0};
    tp_peer_t p;
    xfer_status_t s;
    size_t len;
    double t0, t_kill;
    char tiny[64];
    ssize_t bad;

    cr_assert(in && out);
    tp_fill_pattern(out, KILL_LEN, 600);
    tp_start(&p, srv_stream, NULL);
    cr_assert_eq(tp_recv(&p), 1);
    /* the stream works: one whole 64 MiB message */
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 1, ALL, in, KILL_LEN, NULL, NULL, NULL,
                                      &first)));
    s = req_done(first, TP_WAIT_MS * 2, &len, NULL);
    cr_assert_eq(s, XFER_OK, "the first 64 MiB message: %s", xfer_status_string(s));
    bad = tp_check_pattern(in, KILL_LEN, 500);
    cr_assert_eq(bad, -1, "the first 64 MiB message: byte %zd is wrong", bad);
    memset(in, 0, KILL_LEN);

    /* the next one arriving, a receive from any peer and one nothing will be sent for */
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 1, ALL, in, KILL_LEN, NULL, slot_cb,
                                      &recv_slot, &recv)));
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, NULL, 3, ALL, tiny, sizeof(tiny), NULL, NULL, NULL,
                                      &any)));
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 5, ALL, tiny, sizeof(tiny), NULL, NULL, NULL,
                                      &pending)));
    /* Kill once an eighth of the message is in our buffer: watched in memory, since a wall
     * clock says nothing here (under TCG the kernel's RDMA work can keep this process off
     * the CPU for seconds, and on real hardware 64 MiB takes milliseconds). */
    t0 = tp_now_ms();
    while ((*mark == 0) && (xfer_request_test(recv) == XFER_INPROGRESS) &&
           (tp_now_ms() - t0 < TP_WAIT_MS)) {
        xfer_progress(p.ctx);
    }
    cr_assert_neq(*mark, 0, "no data of the second 64 MiB message arrived within %.0f ms (%s)",
                  tp_now_ms() - t0, xfer_status_string(xfer_request_test(recv)));
    cr_assert(*tail == 0 && xfer_request_test(recv) == XFER_INPROGRESS,
              "the whole 64 MiB arrived before the kill (%s): not mid-transfer",
              xfer_status_string(xfer_request_test(recv)));
    cr_log_info("kill %.0f ms after posting, an eighth of the 64 MiB in", tp_now_ms() - t0);
    /* and ours just leaving: the peer has our RTS, or is reading (rxe tends to run one
     * direction's READ before the other's, so no wait would find both mid-way) */
    cr_assert(TP_POSTED(xfer_tag_send(p.ep, 2, out, KILL_LEN, NULL, slot_cb, &send_slot,
                                      &send)));
    s = xfer_request_test(send);
    cr_assert_eq(s, XFER_INPROGRESS, "a 64 MiB send ended as soon as it was posted: %s",
                 xfer_status_string(s));

    cr_assert_eq(kill(p.pid, SIGKILL), 0);
    t_kill = tp_now_ms();
    cr_assert_eq(tp_child_wait(&p, 10), 128 + SIGKILL);
    close(p.ctl);
    p.ctl = -1;

    /* The RDMA READ of a message the peer had fully posted may still finish while the kernel
     * tears the dead process down (its QP and pinned pages outlive it by seconds under TCG):
     * then the whole message is here and OK is right, provided every byte is. Otherwise the
     * receive fails like everything else. */
    s = req_wait(recv, FAIL_MS + 5000);
    if (s == XFER_OK) {
        cr_log_info("the 64 MiB receive from the killed peer: OK after %.0f ms",
                    tp_now_ms() - t_kill);
        bad = tp_check_pattern(in, KILL_LEN, 500);
        cr_expect_eq(bad, -1, "the 64 MiB receive from the killed peer completed OK, but byte "
                     "%zd is wrong", bad);
    } else {
        expect_failure(recv, t_kill, FAIL_MS, "the 64 MiB receive from the killed peer");
    }
    cr_expect_eq(recv_slot.calls, 1, "receive callback called %d times", recv_slot.calls);
    cr_expect_eq(recv_slot.status, s);
    expect_failure(pending, t_kill, FAIL_MS, "a receive on the endpoint nothing was sent for");
    s = expect_failure(send, t_kill, FAIL_MS, "the 64 MiB send to the killed peer");
    cr_expect_eq(send_slot.calls, 1, "send callback called %d times", send_slot.calls);
    cr_expect_eq(send_slot.status, s);
    cr_expect_neq(xfer_endpoint_status(p.ep), XFER_OK, "the endpoint must report the failure");
    cr_expect_eq(xfer_request_test(any), XFER_INPROGRESS,
                 "a receive from any peer outlives one peer");
    s = xfer_tag_send(p.ep, 4, tiny, sizeof(tiny), NULL, NULL, NULL, &late);
    if (TP_POSTED(s)) {
        expect_failure(late, tp_now_ms(), FAIL_MS, "a send posted after the peer died");
        xfer_request_release(late);
    }
    xfer_request_release(recv);
    xfer_request_release(send);
    xfer_request_release(pending);

    /* the same context reaches a fresh peer */
    tp_another_peer_works(p.ctx, (const size_t[]){100, 300000, 0});
    cr_expect_eq(xfer_request_cancel(any), XFER_OK);
    cr_expect_eq(xfer_request_wait(any, TP_WAIT_MS), XFER_ERR_CANCELED);
    xfer_request_release(any);
    xfer_endpoint_close(p.ep);
    xfer_context_destroy(p.ctx);
    /* and so does a new context */
    p.ctx = tp_context(0);
    tp_another_peer_works(p.ctx, (const size_t[]){100, 300000, 0});
    xfer_context_destroy(p.ctx);
    free(in);
    free(out);
}

/* =============================================================================================
 * 6. the link goes down under traffic (contrib/rxe_guest --two-hosts)
 * ============================================================================================= */

#define LINK_FAIL_MS 15000
#define LINK_MSG     (1u << 20)
#define LINK_BIG     (64u << 20)

static const char *netdev_b(void)
{
    const char *d = getenv("RXE_GUEST_NETDEV_B");

    return ((d != NULL) && (*d != '\0')) ? d : NULL;
}

/* The n-th (0-based) word of RXE_GUEST_DEVICES, in buf; NULL when there is none. */
static const char *guest_device(int n, char *buf, size_t size)
{
    const char *list = getenv("RXE_GUEST_DEVICES");
    char tmp[256], *save = NULL, *tok;

    if (list == NULL) {
        return NULL;
    }
    snprintf(tmp, sizeof(tmp), "%s", list);
    tok = strtok_r(tmp, " \t,", &save);
    for (int i = 0; (tok != NULL) && (i < n); i++) {
        tok = strtok_r(NULL, " \t,", &save);
    }
    if (tok == NULL) {
        return NULL;
    }
    snprintf(buf, size, "%s", tok);
    return buf;
}

/* Is port 1 of the RDMA device ACTIVE? */
static int port_active(const char *dev)
{
    char path[256], state[64] = "";
    FILE *f;

    snprintf(path, sizeof(path), "/sys/class/infiniband/%s/ports/1/state", dev);
    f = fopen(path, "r");
    if (f == NULL) {
        return 0;
    }
    if (fgets(state, sizeof(state), f) == NULL) {
        state[0] = '\0';
    }
    fclose(f);
    return strstr(state, "ACTIVE") != NULL;
}

static int set_link(const char *netdev, const char *updown)
{
    char cmd[256];

    snprintf(cmd, sizeof(cmd), "ip link set dev %s %s", netdev, updown);
    return system(cmd);
}

/* A word the peer sends after a wait of its own that may be long. */
static uint64_t recv_within(tp_peer_t *p, int ms, const char *what)
{
    uint64_t v = 0;

    cr_assert_eq(tp_ctl_recv_u64(p->ctl, &v, ms), 0, "the peer did not send %s within %d ms",
                 what, ms);
    return v;
}

/* Bring netdev B up (a failed run may have left it down) and wait for its device's port. */
static void link_restore(void)
{
    char dev[64];
    double end = tp_now_ms() + 10000;

    if (netdev_b() == NULL) {
        return;
    }
    if (set_link(netdev_b(), "up") != 0) {
        cr_log_error("ip link set dev %s up failed", netdev_b());
    }
    if (guest_device(1, dev, sizeof(dev)) != NULL) {
        while (!port_active(dev) && (tp_now_ms() < end)) {
            usleep(20000);
        }
        if (!port_active(dev)) {
            cr_log_error("%s's port is not ACTIVE 10 s after %s came up", dev, netdev_b());
        }
    }
}

static void link_setup(void)
{
    char a[64], b[64];

    setup();
    if (netdev_b() == NULL) {
        cr_skip_test("link_down needs two RDMA devices on two netdevs: run it under "
                     "contrib/rxe_guest --two-hosts (RXE_GUEST_NETDEV_B is not set)");
    }
    if ((guest_device(0, a, sizeof(a)) == NULL) || (guest_device(1, b, sizeof(b)) == NULL)) {
        cr_skip_test("RXE_GUEST_DEVICES='%s' does not name two devices",
                     getenv("RXE_GUEST_DEVICES") ? getenv("RXE_GUEST_DEVICES") : "");
    }
    link_restore();
}

/* Rounds of one LINK_MSG each way (tag 11 to the parent, 12 from it), each verified, until
 * the parent says "big": then a LINK_BIG message each way (tag 13 to the parent, 14 from it),
 * which the link failure interrupts. Reports the big operations' statuses and how long they
 * took to fail after the parent's "down" word, then waits for the end. */
static int srv_link(tp_side_t *s)
{
    char *out = xmalloc(LINK_BIG), *in = xmalloc(LINK_BIG);
    xfer_request_t *sreq = NULL, *rreq = NULL;
    xfer_status_t st_s, st_r;
    double t_down, ms_s, ms_r;
    uint64_t v;

    memset(out, 0x5a, LINK_BIG);           /* the big message: any non-zero bytes */
    tp_fill_pattern(out, LINK_MSG, 700);
    for (int n = 0;; n++) {
        v = child_word(s);
        if (v != 1) {
            break;
        }
        memset(in, 0, LINK_MSG);
        TP_CHECK(TP_POSTED(xfer_tag_recv(s->ctx, s->ep, 12, ALL, in, LINK_MSG, NULL, NULL, NULL,
                                         &rreq)), "recv");
        TP_CHECK(TP_POSTED(xfer_tag_send(s->ep, 11, out, LINK_MSG, NULL, NULL, NULL, &sreq)),
                 "send");
        TP_CHECK_STATUS(req_done(sreq, TP_WAIT_MS, NULL, NULL), XFER_OK);
        TP_CHECK_STATUS(req_done(rreq, TP_WAIT_MS, NULL, NULL), XFER_OK);
        TP_CHECK(tp_check_pattern(in, LINK_MSG, 800 + n) == -1, "round %d: corrupt", n);
        child_say(s, 1);
    }
    TP_CHECK(v == 2, "unexpected word %llu", (unsigned long long)v);
    TP_CHECK(TP_POSTED(xfer_tag_recv(s->ctx, s->ep, 14, ALL, in, LINK_BIG, NULL, NULL, NULL,
                                     &rreq)), "recv");
    TP_CHECK(TP_POSTED(xfer_tag_send(s->ep, 13, out, LINK_BIG, NULL, NULL, NULL, &sreq)),
             "send");
    child_say(s, 2);
    TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS) == 0, "no 'down' word");
    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0 && v == 3, "ctl");
    t_down = tp_now_ms();
    st_s   = req_done(sreq, LINK_FAIL_MS, NULL, NULL);
    ms_s   = tp_now_ms() - t_down;
    st_r   = req_done(rreq, (int)(t_down + LINK_FAIL_MS - tp_now_ms()) + 1, NULL, NULL);
    ms_r   = tp_now_ms() - t_down;
    child_say(s, (uint64_t)(int64_t)st_s);
    child_say(s, (uint64_t)ms_s);
    child_say(s, (uint64_t)(int64_t)st_r);
    child_say(s, (uint64_t)ms_r);
    child_say(s, (uint64_t)(int64_t)xfer_endpoint_status(s->ep));
    child_word(s);
    free(out);
    free(in);
    return 0;
}

Test(verbs, link_down, .init = link_setup, .fini = link_restore)
{
    char dev_a[64], dev_b[64];
    char *out = malloc(LINK_BIG), *in = malloc(LINK_BIG), tiny[64];
    xfer_request_t *sreq = NULL, *rreq = NULL, *never = NULL;
    volatile uint64_t *mark = (volatile uint64_t *)(void *)(in + LINK_BIG / 8);
    volatile uint64_t *tail = (volatile uint64_t *)(void *)(in + LINK_BIG - 8);
    xfer_status_t s, cs;
    tp_peer_t p;
    double t_down;
    uint64_t ms;

    cr_assert(in && out);
    guest_device(0, dev_a, sizeof(dev_a));
    guest_device(1, dev_b, sizeof(dev_b));
    cr_assert(port_active(dev_a), "%s's port is not ACTIVE", dev_a);
    cr_assert(port_active(dev_b), "%s's port is not ACTIVE", dev_b);
    /* fail fast: RC gives up after 50 ms x 4, idle channels are probed every 200 ms */
    setenv("XFER_VERBS_TIMEOUT", "50ms", 1);
    setenv("XFER_VERBS_RETRY_COUNT", "3", 1);
    setenv("XFER_VERBS_KEEPALIVE", "200ms", 1);
    /* the child on device B, we on device A; the bootstrap stays on 127.0.0.1 */
    setenv("XFER_VERBS_DEVICE", dev_b, 1);
    tp_server_spawn(&p, srv_link, NULL, NULL);
    setenv("XFER_VERBS_DEVICE", dev_a, 1);
    p.ctx = tp_context(0);
    p.ep  = tp_connect(p.ctx, &p);

    for (int n = 0; n < 3; n++) {
        tp_fill_pattern(out, LINK_MSG, 800 + n);
        memset(in, 0, LINK_MSG);
        cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 11, ALL, in, LINK_MSG, NULL, NULL, NULL,
                                          &rreq)));
        cr_assert(TP_POSTED(xfer_tag_send(p.ep, 12, out, LINK_MSG, NULL, NULL, NULL, &sreq)));
        tp_send(&p, 1);
        s = req_done(sreq, TP_WAIT_MS, NULL, NULL);
        cr_assert_eq(s, XFER_OK, "round %d: send %s -> %s: %s", n, dev_a, dev_b,
                     xfer_status_string(s));
        s = req_done(rreq, TP_WAIT_MS, NULL, NULL);
        cr_assert_eq(s, XFER_OK, "round %d: receive %s <- %s: %s", n, dev_a, dev_b,
                     xfer_status_string(s));
        cr_assert_eq(tp_check_pattern(in, LINK_MSG, 700), -1, "round %d: corrupt", n);
        cr_assert_eq(tp_recv(&p), 1);
    }

    /* the peer's 64 MiB on its way, ours leaving, and a receive nothing will satisfy; the
     * link goes down once an eighth of the peer's message is here (watched in memory: a
     * wall clock says nothing under TCG, see peer_killed_midtransfer) */
    memset(in, 0, LINK_BIG);
    memset(out, 0x3c, LINK_BIG);
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 13, ALL, in, LINK_BIG, NULL, NULL, NULL,
                                      &rreq)));
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 99, ALL, tiny, sizeof(tiny), NULL, NULL,
                                      NULL, &never)));
    tp_send(&p, 2);
    cr_assert_eq(tp_recv(&p), 2);
    t_down = tp_now_ms();
    while ((*mark == 0) && (xfer_request_test(rreq) == XFER_INPROGRESS) &&
           (tp_now_ms() - t_down < TP_WAIT_MS)) {
        xfer_progress(p.ctx);
    }
    cr_assert_neq(*mark, 0, "no data of the peer's 64 MiB message arrived within %.0f ms (%s)",
                  tp_now_ms() - t_down, xfer_status_string(xfer_request_test(rreq)));
    cr_assert(*tail == 0 && xfer_request_test(rreq) == XFER_INPROGRESS,
              "the peer's whole 64 MiB arrived before the link went down (%s)",
              xfer_status_string(xfer_request_test(rreq)));
    cr_assert(TP_POSTED(xfer_tag_send(p.ep, 14, out, LINK_BIG, NULL, NULL, NULL, &sreq)));
    s = xfer_request_test(sreq);
    cr_assert_eq(s, XFER_INPROGRESS, "a 64 MiB send ended as soon as it was posted: %s",
                 xfer_status_string(s));

    cr_assert_eq(set_link(netdev_b(), "down"), 0, "ip link set dev %s down failed",
                 netdev_b());
    t_down = tp_now_ms();
    tp_send(&p, 3);
    expect_failure(sreq, t_down, LINK_FAIL_MS, "our 64 MiB send when the link went down");
    expect_failure(rreq, t_down, LINK_FAIL_MS, "our 64 MiB receive when the link went down");
    expect_failure(never, t_down, LINK_FAIL_MS, "a pending receive on the endpoint");
    cr_expect_neq(xfer_endpoint_status(p.ep), XFER_OK,
                  "the endpoint must report the failed link");
    cr_log_info("endpoint status after the link failure: %s",
                xfer_status_string(xfer_endpoint_status(p.ep)));

    /* The peer is alive and waits for our word, so its bootstrap socket (127.0.0.1) stayed
     * up: what failed our side is the RDMA path. The peer's own port went down: rxe (kernel
     * 6.1) may stall a QP whose own port died without completing anything, so what fails the
     * peer's operations is the port's asynchronous event (IBV_EVENT_PORT_ERR). */
    cs = (xfer_status_t)(int64_t)recv_within(&p, LINK_FAIL_MS + 10000, "its results");
    ms = recv_within(&p, TP_WAIT_MS, "its results");
    cr_log_info("the peer's 64 MiB send (its link went down): ended with '%s' after %llu ms",
                xfer_status_string(cs), (unsigned long long)ms);
    cr_expect(cs < 0, "the peer's send did not fail within %d ms of its own link going down",
              LINK_FAIL_MS);
    cs = (xfer_status_t)(int64_t)recv_within(&p, TP_WAIT_MS, "its results");
    ms = recv_within(&p, TP_WAIT_MS, "its results");
    cr_log_info("the peer's 64 MiB receive (its link went down): ended with '%s' after %llu ms",
                xfer_status_string(cs), (unsigned long long)ms);
    cr_expect(cs < 0, "the peer's receive did not fail within %d ms of its own link going "
              "down", LINK_FAIL_MS);
    cs = (xfer_status_t)(int64_t)recv_within(&p, TP_WAIT_MS, "its results");
    cr_log_info("the peer's endpoint status: %s", xfer_status_string(cs));
    cr_expect(cs < 0, "the peer's endpoint must report its failed port");
    tp_send(&p, 0);
    xfer_request_release(sreq);
    xfer_request_release(rreq);
    xfer_request_release(never);
    free(in);
    free(out);
    tp_finish(&p);
}

/* =============================================================================================
 * 7. selection: all transports allowed -> shm (the two processes share a host), verbs once shm
 *    is excluded; XFER_TRANSPORTS=tcp -> tcp
 * ============================================================================================= */

/* Accept one connection, report its transport, then echo on it. */
static int srv_select(tp_side_t *s)
{
    const char *t;

    TP_CHECK_STATUS(xfer_accept(s->listener, TP_WAIT_MS, &s->ep), XFER_OK);
    t = xfer_endpoint_transport(s->ep);
    TP_CHECK(tp_ctl_send(s->ctl, t, strlen(t) + 1) == 0, "ctl");
    return tp_echo_server(s);
}

/* Both processes under XFER_TRANSPORTS=transports (NULL: unset) agree on want. */
static void select_check(const char *transports, const char *want)
{
    tp_opts_t o = {.accepts = -1};
    xfer_endpoint_t *ep = NULL;
    xfer_context_t *ctx;
    xfer_status_t s;
    tp_peer_t p;
    char *theirs;
    size_t len;

    if (transports == NULL) {
        unsetenv("XFER_TRANSPORTS");
    } else {
        setenv("XFER_TRANSPORTS", transports, 1);
    }
    tp_server_spawn(&p, srv_select, NULL, &o);
    ctx = tp_context(0);
    s   = xfer_connect(ctx, p.address, &ep);
    cr_assert_eq(s, XFER_OK, "connect under XFER_TRANSPORTS=%s: %s",
                 transports ? transports : "(unset)", xfer_status_string(s));
    theirs = tp_recv_blob(&p, &len);
    cr_assert_str_eq(xfer_endpoint_transport(ep), want, "client under XFER_TRANSPORTS=%s "
                     "chose '%s', expected '%s'", transports ? transports : "(unset)",
                     xfer_endpoint_transport(ep), want);
    cr_assert_str_eq(theirs, want, "server under XFER_TRANSPORTS=%s chose '%s', expected '%s'",
                     transports ? transports : "(unset)", theirs, want);
    free(theirs);
    tp_echo_ping(ctx, ep, 1, 100);
    tp_echo_ping(ctx, ep, 2, 200000);
    tp_echo_stop(ep);
    tp_child_expect_ok(&p, 30);
    xfer_endpoint_close(ep);
    xfer_context_destroy(ctx);
}

Test(verbs, selection)
{
    select_check(NULL, "shm");
    select_check("", "shm");
    select_check("^shm", "verbs");
    select_check("tcp", "tcp");
    select_check("tcp,verbs", "tcp");
    select_check("verbs,tcp", "verbs");
    setenv("XFER_TRANSPORTS", tp_transport(), 1);
}

/* =============================================================================================
 * 8. 4096 puts, then 4096 gets, all outstanding at once
 * ============================================================================================= */

#define RMA_LEN    (1u << 20)
#define RMA_N      4096
#define RMA_STRIDE (RMA_LEN / RMA_N)    /* 256: one 8-byte slot per stride */
#define RMA_SZ     8
#define SEED_TARGET 1111
#define SEED_PUT    2222

/* Offset of put k (start of its stride) and of get k: every other get reads back a put, the
 * others bytes no put touched. */
static size_t put_off(int k)
{
    return (size_t)k * RMA_STRIDE;
}

static size_t get_off(int k)
{
    return (size_t)k * RMA_STRIDE + ((k % 2) ? 0 : RMA_STRIDE / 2);
}

/* The target's region after the puts. */
static void rma_expected(char *img)
{
    char *src = malloc(RMA_LEN);

    tp_fill_pattern(img, RMA_LEN, SEED_TARGET);
    tp_fill_pattern(src, RMA_LEN, SEED_PUT);
    for (int k = 0; k < RMA_N; k++) {
        memcpy(img + put_off(k), src + put_off(k), RMA_SZ);
    }
    free(src);
}

/* Registers RMA_LEN (pattern SEED_TARGET), hands over address and key, progresses; on word 1
 * checks the region holds what the puts wrote (answers the first bad offset + 2, or 1). */
static int srv_rma_target(tp_side_t *s)
{
    char *buf = xmalloc(RMA_LEN), *img = xmalloc(RMA_LEN);
    xfer_mem_t *mem;
    void *blob;
    size_t len;

    tp_fill_pattern(buf, RMA_LEN, SEED_TARGET);
    TP_CHECK_STATUS(xfer_mem_register(s->ctx, buf, RMA_LEN, XFER_MEM_HOST, &mem), XFER_OK);
    TP_CHECK_STATUS(xfer_rkey_pack(mem, &blob, &len), XFER_OK);
    child_say(s, (uintptr_t)buf);
    TP_CHECK(tp_ctl_send(s->ctl, blob, len) == 0, "ctl");
    xfer_rkey_blob_free(blob);
    for (;;) {
        uint64_t v = child_word(s);
        ssize_t bad = -1;

        if (v == 0) {
            break;
        }
        rma_expected(img);
        for (size_t i = 0; (i < RMA_LEN) && (bad < 0); i++) {
            if (buf[i] != img[i]) {
                bad = (ssize_t)i;
            }
        }
        child_say(s, (bad < 0) ? 1 : (uint64_t)bad + 2);
    }
    TP_CHECK_STATUS(xfer_mem_deregister(mem), XFER_OK);
    free(img);
    free(buf);
    return 0;
}

Test(verbs, many_outstanding_puts_gets)
{
    static xfer_request_t *reqs[RMA_N];
    char *src = malloc(RMA_LEN), *dst = calloc(1, RMA_LEN), *img = malloc(RMA_LEN);
    xfer_mem_t *smem, *dmem;
    xfer_rkey_t *rkey;
    tp_peer_t p;
    uint64_t base, v;
    void *blob;
    size_t len;
    double t0;

    cr_assert(src && dst && img);
    tp_start(&p, srv_rma_target, NULL);
    base = tp_recv(&p);
    blob = tp_recv_blob(&p, &len);
    cr_assert_eq(xfer_rkey_unpack(p.ep, blob, len, &rkey), XFER_OK);
    free(blob);
    tp_fill_pattern(src, RMA_LEN, SEED_PUT);
    cr_assert_eq(xfer_mem_register(p.ctx, src, RMA_LEN, XFER_MEM_HOST, &smem), XFER_OK);
    cr_assert_eq(xfer_mem_register(p.ctx, dst, RMA_LEN, XFER_MEM_HOST, &dmem), XFER_OK);

    t0 = tp_now_ms();
    for (int k = 0; k < RMA_N; k++) {
        xfer_status_t s = xfer_put(p.ep, src + put_off(k), RMA_SZ, smem, base + put_off(k),
                                   rkey, NULL, NULL, &reqs[k]);
        cr_assert(TP_POSTED(s), "put %d of %d: %s", k, RMA_N, xfer_status_string(s));
    }
    for (int k = 0; k < RMA_N; k++) {
        xfer_status_t s = req_done(reqs[k], TP_WAIT_MS, NULL, NULL);
        cr_assert_eq(s, XFER_OK, "put %d of %d: %s", k, RMA_N, xfer_status_string(s));
    }
    cr_log_info("%d puts of %d bytes in %.0f ms", RMA_N, RMA_SZ, tp_now_ms() - t0);
    tp_send(&p, 1);
    v = tp_recv(&p);
    cr_assert_eq(v, 1, "after %d puts the target's byte %lld is wrong", RMA_N, (long long)v - 2);

    t0 = tp_now_ms();
    for (int k = 0; k < RMA_N; k++) {
        xfer_status_t s = xfer_get(p.ep, dst + get_off(k), RMA_SZ, dmem, base + get_off(k),
                                   rkey, NULL, NULL, &reqs[k]);
        cr_assert(TP_POSTED(s), "get %d of %d: %s", k, RMA_N, xfer_status_string(s));
    }
    for (int k = 0; k < RMA_N; k++) {
        xfer_status_t s = req_done(reqs[k], TP_WAIT_MS, NULL, NULL);
        cr_assert_eq(s, XFER_OK, "get %d of %d: %s", k, RMA_N, xfer_status_string(s));
    }
    cr_log_info("%d gets of %d bytes in %.0f ms", RMA_N, RMA_SZ, tp_now_ms() - t0);
    rma_expected(img);
    for (int k = 0; k < RMA_N; k++) {
        size_t o = get_off(k);
        cr_assert_eq(memcmp(dst + o, img + o, RMA_SZ), 0, "get %d (offset %zu, %s): wrong "
                     "bytes", k, o, (k % 2) ? "a put's" : "untouched");
    }
    for (size_t i = 0; i < RMA_LEN; i++) {
        int k = (int)(i / RMA_STRIDE);
        size_t o = get_off(k);
        if ((i < o) || (i >= o + RMA_SZ)) {
            cr_assert_eq(dst[i], 0, "a get wrote at offset %zu, outside every range", i);
        }
    }

    tp_send(&p, 0);
    xfer_rkey_destroy(rkey);
    cr_expect_eq(xfer_mem_deregister(smem), XFER_OK);
    cr_expect_eq(xfer_mem_deregister(dmem), XFER_OK);
    tp_finish(&p);
    free(src);
    free(dst);
    free(img);
}
