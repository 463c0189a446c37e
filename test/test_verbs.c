/*
 * Scenarios that press on what is particular to the verbs component's data path, between two
 * real processes: credits (thousands of eager messages before any receive, with and without a
 * cap on the unexpected queue), every size around the eager limit (SEG_SIZE 8192 less a 16-byte
 * TAG header = 8176) and rendezvous by RDMA READ, registered and unregistered buffers (the MR
 * cache), rendezvous truncation, transport selection, and thousands of puts and gets in flight.
 * Every payload is a pattern checked byte for byte. test_verbs_faults.c holds the same suite's
 * fault tests (a peer killed mid-transfer, a link that goes down); test_verbs.h what the two
 * files share.
 *
 * Runs only over verbs with an RDMA device present, i.e. inside the Soft-RoCE guest (else
 * every test is skipped, saying why); test/verbs_suites.sh gives Criterion the tmpfs /tmp it
 * needs there:
 *   XFERTEST_TRANSPORT=verbs contrib/rxe_guest -- test/verbs_suites.sh build verbs
 * Sizes are chosen for TCG emulation (tens of MB/s of RDMA): each test takes seconds there.
 */
#include "test_verbs.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define CANARY   16

void tv_setup(void)
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

TestSuite(verbs, .init = tv_setup, .timeout = 150);

/* ---- helpers for both sides ------------------------------------------------------------------ */

uint64_t tv_child_word(tp_side_t *s)
{
    uint64_t v;

    TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS) == 0, "no word from the parent");
    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
    return v;
}

void tv_child_say(tp_side_t *s, uint64_t v)
{
    TP_CHECK(tp_ctl_send_u64(s->ctl, v) == 0, "ctl");
}

void *tv_xmalloc(size_t len)
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
xfer_status_t tv_req_wait(xfer_request_t *req, int timeout_ms)
{
    xfer_status_t s = xfer_request_wait(req, timeout_ms);

    return (s == XFER_ERR_TIMEOUT) ? xfer_request_test(req) : s;
}

/* tv_req_wait(), then release the request; length and tag through the pointers. */
xfer_status_t tv_req_done(xfer_request_t *req, int timeout_ms, size_t *len_p, uint64_t *tag_p)
{
    xfer_status_t s = tv_req_wait(req, timeout_ms);

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
    char *buf = tv_xmalloc((size_t)NCREDIT * CREDIT_SZ);
    xfer_request_t **reqs = tv_xmalloc(NCREDIT * sizeof(*reqs));

    tv_child_word(s);
    for (int i = 0; i < NCREDIT; i++) {
        xfer_status_t st;

        tp_fill_pattern(buf + (size_t)i * CREDIT_SZ, CREDIT_SZ, 10000 + i);
        reqs[i] = NULL;
        st = xfer_tag_send(s->ep, (uint64_t)i, buf + (size_t)i * CREDIT_SZ, CREDIT_SZ, NULL,
                           NULL, NULL, &reqs[i]);
        TP_CHECK(TP_POSTED(st), "send %d of %d: %s", i, NCREDIT, xfer_status_string(st));
    }
    tv_child_say(s, 1);                    /* all posted: the parent may start receiving */
    for (int i = 0; i < NCREDIT; i++) {
        xfer_status_t st = tv_req_done(reqs[i], TP_WAIT_MS, NULL, NULL);
        TP_CHECK(st == XFER_OK, "send %d of %d completed with %s", i, NCREDIT,
                 xfer_status_string(st));
    }
    tv_child_say(s, 2);                    /* every send completed OK */
    tv_child_word(s);
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
        xfer_status_t s = tv_req_done(reqs[i], TP_WAIT_MS, &len, &tag);
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
    setenv("XFER_UNEXPECTED_EP", "4k", 1);
    credit_run();
}

/* The same with the fewest slots allowed (16): receives are reposted two at a time, and a
 * credit goes back only once its slot is posted again. */
Test(verbs, credit_exhaustion_with_the_fewest_slots)
{
    setenv("XFER_VERBS_RX_QUEUE_LEN", "16", 1);
    setenv("XFER_UNEXPECTED_EP", "4k", 1);
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
        uint64_t go = tv_child_word(s);
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
        tv_child_say(s, 1);
        for (int j = 0; j < MX_BATCH; j++) {
            int i           = (int)(go - 1) * MX_BATCH + j;
            xfer_status_t st = tv_req_done(reqs[j], TP_WAIT_MS, NULL, NULL);

            if (st == XFER_OK) {
                ok++;
            } else {
                fprintf(stderr, "send %d (%zu bytes, %s) completed with %s\n", i, mx_size(i),
                        mx_sender_registers(i) ? "registered" : "unregistered",
                        xfer_status_string(st));
                TP_CHECK(st != XFER_INPROGRESS, "send %d never completed", i);
            }
        }
        tv_child_say(s, (uint64_t)ok);
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
    xfer_status_t s = tv_req_done(req, TP_WAIT_MS, &len, &tag);
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
    char *buf = tv_xmalloc(UNREG_LEN);

    for (int k = 0; k < UNREG_N; k++) {
        xfer_request_t *req = NULL;
        xfer_status_t st;

        tp_fill_pattern(buf, UNREG_LEN, 300 + k);
        tv_child_word(s);
        st = xfer_tag_send(s->ep, 30 + (uint64_t)k, buf, UNREG_LEN, NULL, NULL, NULL, &req);
        TP_CHECK(TP_POSTED(st), "send %d: %s", k, xfer_status_string(st));
        st = tv_req_done(req, TP_WAIT_MS, NULL, NULL);
        tv_child_say(s, (uint64_t)(int64_t)st);
    }
    tv_child_word(s);
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
        s = tv_req_done(req, TP_WAIT_MS, &len, NULL);
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
    char *buf = tv_xmalloc(TR_LEN);

    for (;;) {
        uint64_t n = tv_child_word(s);
        xfer_request_t *req = NULL;
        xfer_status_t st;

        if (n == 0) {
            break;
        }
        tp_fill_pattern(buf, TR_LEN, 400 + n);
        st = xfer_tag_send(s->ep, 40 + n, buf, TR_LEN, NULL, NULL, NULL, &req);
        TP_CHECK(TP_POSTED(st), "send: %s", xfer_status_string(st));
        tv_child_say(s, 1);
        st = tv_req_done(req, TP_WAIT_MS, NULL, NULL);
        tv_child_say(s, (uint64_t)(int64_t)st);
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
    s = tv_req_done(req, TP_WAIT_MS, len_p, &tag);
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
 * 5. selection: all transports allowed -> shm (the two processes share a host), verbs once shm
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
 * 6. 4096 puts, then 4096 gets, all outstanding at once
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
    char *buf = tv_xmalloc(RMA_LEN), *img = tv_xmalloc(RMA_LEN);
    xfer_mem_t *mem;
    void *blob;
    size_t len;

    tp_fill_pattern(buf, RMA_LEN, SEED_TARGET);
    TP_CHECK_STATUS(xfer_mem_register(s->ctx, buf, RMA_LEN, XFER_MEM_HOST, &mem), XFER_OK);
    TP_CHECK_STATUS(xfer_rkey_pack(mem, &blob, &len), XFER_OK);
    tv_child_say(s, (uintptr_t)buf);
    TP_CHECK(tp_ctl_send(s->ctl, blob, len) == 0, "ctl");
    xfer_rkey_blob_free(blob);
    for (;;) {
        uint64_t v = tv_child_word(s);
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
        tv_child_say(s, (bad < 0) ? 1 : (uint64_t)bad + 2);
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
        xfer_status_t s = tv_req_done(reqs[k], TP_WAIT_MS, NULL, NULL);
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
        xfer_status_t s = tv_req_done(reqs[k], TP_WAIT_MS, NULL, NULL);
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
