/*
 * A peer cannot make this side allocate without bound. Each test has one peer flood a queue
 * it drives - tag messages nobody receives (also while this side waits for an answer from
 * it), gets whose answers it does not read, fetches of tensors that are never published,
 * fetches of a step aborted so long ago that it is forgotten - while this process measures
 * its own peak resident memory against the bound, and a second, well-behaved peer's traffic
 * still completes. Runs over every transport.
 */
#include "test_peer.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void setup(void)
{
    tp_env();
    /* a flood stays unsent at the flooding peer: its close gives up on it soon */
    setenv("XFER_CLOSE_TIMEOUT", "1s", 1);
}

TestSuite(bounds, .init = setup, .timeout = 240);

#define ALL      (~0ull)
#define MIB      (1024u * 1024u)
#define EAGER    8000           /* eager on every transport: the receiver holds the data */
#define FLOOD_N  20000          /* 160 MB of messages offered */
#define TAG_SPAM 0x5ba3
#define TAG_GOOD 0x600d
#define SLACK    (24u * MIB)    /* what else the process may grow by meanwhile */

/* Kilobytes of a field of /proc/self/status (VmRSS, VmHWM). */
static long status_kb(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;

    while ((f != NULL) && (fgets(line, sizeof(line), f) != NULL)) {
        if ((strncmp(line, field, strlen(field)) == 0) && (line[strlen(field)] == ':')) {
            kb = atol(line + strlen(field) + 1);
        }
    }
    if (f != NULL) {
        fclose(f);
    }
    cr_assert_geq(kb, 0, "no %s in /proc/self/status", field);
    return kb;
}

/* Why this process's resident memory says nothing about xfer's here, or NULL. */
static const char *memory_unmeasurable(void)
{
#if defined(__SANITIZE_ADDRESS__)
    return "AddressSanitizer keeps freed memory resident (its quarantine)";
#else
    if (getenv("XFERTEST_VALGRIND") != NULL) {
        return "valgrind's own memory is in it";
    }
    return NULL;
#endif
}

/* The peak resident memory grew by less than bound (bytes) since baseline_kb. The floods and
 * the other peer's traffic are checked either way. */
static void expect_peak_within(long baseline_kb, uint64_t bound, const char *what)
{
    const char *why = memory_unmeasurable();
    long grown_kb;

    if (why != NULL) {
        /* on stderr, not cr_log_warn: Criterion 2.4 exits non-zero after a warning */
        fprintf(stderr, "[note] %s: peak memory not measured: %s\n", what, why);
        return;
    }
    grown_kb = status_kb("VmHWM") - baseline_kb;
    if (grown_kb < 0) {
        /* the kernel's RSS counters are cached per thread: a baseline read a little high
         * makes a process that did not grow look a few hundred KiB smaller */
        grown_kb = 0;
    }
    cr_log_info("%s: peak memory grew by %ld KiB, the bound is %llu KiB", what, grown_kb,
                (unsigned long long)(bound / 1024));
    cr_expect_lt((uint64_t)grown_kb * 1024, bound, "%s: this process grew by %ld MiB, the "
                 "bound allows %llu MiB", what, grown_kb / 1024,
                 (unsigned long long)(bound / MIB));
}

/* ---- the well-behaved peer ------------------------------------------------------------------- */

/* On each word: send one message of that many bytes tagged TAG_GOOD and say so at once (a
 * large one completes only once the parent's receive takes it); 0 ends. */
static int srv_good(tp_side_t *s)
{
    static uint8_t buf[64 * 1024];

    for (;;) {
        uint64_t len;
        xfer_request_t *req = NULL;

        TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS * 3) == 0, "no word");
        TP_CHECK(tp_ctl_recv_u64(s->ctl, &len, TP_WAIT_MS) == 0, "ctl");
        if (len == 0) {
            return 0;
        }
        tp_fill_pattern(buf, len, len);
        TP_CHECK(TP_POSTED(xfer_tag_send(s->ep, TAG_GOOD, buf, len, NULL, NULL, NULL, &req)),
                 "send");
        TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
        TP_CHECK_STATUS(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
        xfer_request_release(req);
    }
}

/* The good peer's message of len bytes arrives - unexpected first: the receive is posted
 * only once the peer says it was sent - while the flood goes on. */
static void good_round(xfer_context_t *ctx, tp_peer_t *good, xfer_endpoint_t *ep, size_t len)
{
    static uint8_t buf[64 * 1024];
    xfer_request_t *req = NULL;
    double end = tp_now_ms() + TP_WAIT_MS;
    xfer_status_t st;

    tp_send(good, len);
    while (!tp_ctl_ready(good->ctl, 0) && (tp_now_ms() < end)) {
        xfer_progress(ctx);
    }
    cr_assert_eq(tp_recv(good), 1);
    cr_assert(TP_POSTED(xfer_tag_recv(ctx, ep, TAG_GOOD, ALL, buf, sizeof(buf), NULL, NULL, NULL,
                                      &req)));
    st = xfer_request_wait(req, TP_WAIT_MS);
    cr_assert_eq(st, XFER_OK, "the well-behaved peer's message of %zu bytes did not arrive "
                 "during the flood: %s", len, xfer_status_string(st));
    cr_assert_eq(xfer_request_length(req), len);
    cr_assert_eq(tp_check_pattern(buf, len, len), -1);
    xfer_request_release(req);
}

typedef struct flood_env {
    xfer_context_t  *ctx;
    tp_peer_t       flooder, good;
    xfer_endpoint_t *ep_flooder, *ep_good;
} flood_env_t;

static void flood_start(flood_env_t *e, tp_scenario_t flooder)
{
    e->ctx = tp_context(0);
    tp_server_spawn(&e->flooder, flooder, NULL, NULL);
    tp_server_spawn(&e->good, srv_good, NULL, NULL);
    e->ep_flooder = tp_connect(e->ctx, &e->flooder);
    e->ep_good    = tp_connect(e->ctx, &e->good);
}

static void flood_finish(flood_env_t *e)
{
    tp_send(&e->good, 0);
    tp_child_expect_ok(&e->good, 30);
    xfer_endpoint_close_nb(e->ep_flooder, XFER_CLOSE_FLAG_FORCE, NULL, NULL, NULL);
    xfer_endpoint_close(e->ep_good);
    xfer_context_destroy(e->ctx);
    tp_send(&e->flooder, 0);
    tp_child_expect_ok(&e->flooder, 30);
}

/* ---- messages nobody receives ---------------------------------------------------------------- */

/* On a word: post FLOOD_N eager messages nobody will receive, progressing all along (so that
 * whatever the receiver takes goes), for at most 4 s; then wait for the end. */
static int srv_flood_messages(tp_side_t *s)
{
    static uint8_t buf[EAGER];
    double end;
    uint64_t v;

    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
    end = tp_now_ms() + 4000;
    for (int i = 0; (i < FLOOD_N) && (tp_now_ms() < end); i++) {
        /* the same buffer each time: only the receiver's memory is under test */
        if (!TP_POSTED(xfer_tag_send(s->ep, TAG_SPAM, buf, EAGER, NULL, NULL, NULL, NULL))) {
            break;
        }
        xfer_progress(s->ctx);
    }
    while (tp_now_ms() < end) {
        xfer_progress(s->ctx);
    }
    TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
    tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS * 3);
    return 0;
}

static void flood_messages(int with_answer_pending)
{
    flood_env_t e;
    xfer_request_t *fetch = NULL;
    char fbuf[64];
    xfer_fetch_params_t fp = {.size = sizeof(fp), .buffer = fbuf, .capacity = sizeof(fbuf)};
    uint64_t bound = (uint64_t)(with_answer_pending ? 2 : 1) * 16 * MIB + SLACK;
    long base;
    double end;

    flood_start(&e, srv_flood_messages);
    if (with_answer_pending) {
        /* an answer this side waits for from the flooder: never published, it stays due */
        cr_assert(TP_POSTED(xfer_tensor_fetch(e.ep_flooder, 1, "never", &fp, NULL, NULL,
                                              &fetch)));
    }
    base = status_kb("VmRSS");
    tp_send(&e.flooder, 1);
    end = tp_now_ms() + 5000;
    for (int round = 1; !tp_ctl_ready(e.flooder.ctl, 0) && (tp_now_ms() < end); round++) {
        good_round(e.ctx, &e.good, e.ep_good, 1000 + ((size_t)round * 97) % 60000);
    }
    cr_assert_eq(tp_recv(&e.flooder), 1);
    expect_peak_within(base, bound, "messages nobody receives");
    cr_expect_eq(xfer_endpoint_status(e.ep_good), XFER_OK);
    if (fetch != NULL) {
        cr_assert_eq(xfer_request_cancel(fetch), XFER_OK);
        xfer_request_wait(fetch, TP_WAIT_MS);
        xfer_request_release(fetch);
    }
    flood_finish(&e);
}

Test(bounds, a_flood_of_messages_nobody_receives_is_held_at_the_peer)
{
    flood_messages(0);
}

Test(bounds, the_same_flood_while_this_side_waits_for_the_flooders_answer)
{
    flood_messages(1);
}

/* ---- gets whose answers are not read ---------------------------------------------------------- */

#define GET_LEN  (16u * 1024u)
#define GET_N    20000          /* 320 MB of answers asked for */

/* Post GET_N gets of the parent's region without progressing (their answers are not read),
 * say so, then progress until they are done. */
static int cli_flood_gets(tp_side_t *s)
{
    static uint8_t dst[GET_LEN];
    xfer_rkey_t *rkey = NULL;
    xfer_mem_t *mem   = NULL;
    void *blob;
    size_t len;
    uint64_t v;
    int posted = 0;

    TP_CHECK(tp_ctl_recv_alloc(s->ctl, &blob, &len, TP_WAIT_MS) == 0, "ctl");
    TP_CHECK_STATUS(xfer_rkey_unpack(s->ep, blob, len, &rkey), XFER_OK);
    free(blob);
    TP_CHECK_STATUS(xfer_mem_register(s->ctx, dst, GET_LEN, XFER_MEM_HOST, &mem), XFER_OK);
    for (int i = 0; i < GET_N; i++) {
        posted += TP_POSTED(xfer_get(s->ep, dst, GET_LEN, mem, xfer_rkey_address(rkey), rkey,
                                     NULL, NULL, NULL));
    }
    TP_CHECK(tp_ctl_send_u64(s->ctl, (uint64_t)posted) == 0, "ctl");
    TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS * 3) == 0, "no word");
    tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS);
    return 0;
}

Test(bounds, gets_whose_answers_are_not_read_stop_being_read)
{
    static uint8_t region[GET_LEN];
    xfer_context_t *ctx = tp_context(0);
    tp_peer_t flooder, good;
    xfer_endpoint_t *ep_flooder, *ep_good;
    xfer_listener_t *l;
    xfer_mem_t *mem;
    void *blob;
    size_t len;
    char addr[64];
    long base;
    double end;

    cr_assert_eq(xfer_mem_register(ctx, region, GET_LEN, XFER_MEM_HOST, &mem), XFER_OK);
    cr_assert_eq(xfer_listen(ctx, "127.0.0.1:0", &l), XFER_OK);
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", xfer_listener_port(l));
    tp_client_spawn(&flooder, addr, cli_flood_gets, NULL, NULL);
    cr_assert_eq(xfer_accept(l, TP_WAIT_MS, &ep_flooder), XFER_OK);
    xfer_listener_close(l);
    tp_server_spawn(&good, srv_good, NULL, NULL);
    ep_good = tp_connect(ctx, &good);
    cr_assert_eq(xfer_rkey_pack(mem, &blob, &len), XFER_OK);
    base = status_kb("VmRSS");
    tp_send_blob(&flooder, blob, len);
    xfer_rkey_blob_free(blob);
    /* serve the gets (as a target must) while the good peer's traffic goes on */
    end = tp_now_ms() + 4000;
    for (int round = 1; tp_now_ms() < end; round++) {
        good_round(ctx, &good, ep_good, 500 + ((size_t)round * 13) % 60000);
    }
    cr_assert_gt(tp_recv(&flooder), 0);
    /* 64 MiB of queued answers (XFER_TCP_MAX_RESPONSE_BACKLOG) at most */
    expect_peak_within(base, 64 * MIB + SLACK, "answers to gets that are not read");
    tp_send(&good, 0);
    tp_child_expect_ok(&good, 30);
    xfer_endpoint_close(ep_good);
    xfer_endpoint_close_nb(ep_flooder, XFER_CLOSE_FLAG_FORCE, NULL, NULL, NULL);
    tp_send(&flooder, 0);
    tp_child_expect_ok(&flooder, 30);
    xfer_mem_deregister(mem);
    xfer_context_destroy(ctx);
}

/* ---- fetches of tensors never published ------------------------------------------------------ */

#define FETCH_N    20000
#define PARKED_MAX 256
#define KEY_LEN    1000         /* each waiting request holds about two copies of its key */

static void key_of(char *key, int i)
{
    memset(key, 'k', KEY_LEN);
    snprintf(key, 16, "%06d", i);
    key[6]       = '-';
    key[KEY_LEN] = '\0';
}

/* Seconds a parked tensor request waits (XFER_TENSOR_REQUEST_TIMEOUT): long enough for all
 * FETCH_N requests to arrive before the first expires, so that exactly PARKED_MAX wait. That
 * takes seconds in the emulated guest, and under valgrind there more than 10. */
static int parked_timeout_s(void)
{
    return (getenv("XFERTEST_VALGRIND") != NULL) ? 90 : 10;
}

/* Post FETCH_N fetches of keys the parent never publishes; report how many ended with
 * XFER_ERR_NO_RESOURCE and how many with XFER_ERR_TIMEOUT. */
static int cli_flood_fetches(tp_side_t *s)
{
    static char key[KEY_LEN + 1], buf[64];
    static xfer_request_t *reqs[FETCH_N];
    xfer_fetch_params_t fp = {.size = sizeof(fp), .buffer = buf, .capacity = sizeof(buf)};
    uint64_t refused = 0, expired = 0, other = 0, v;

    for (int i = 0; i < FETCH_N; i++) {
        key_of(key, i);
        reqs[i] = NULL;
        TP_CHECK(TP_POSTED(xfer_tensor_fetch(s->ep, 1, key, &fp, NULL, NULL, &reqs[i])),
                 "fetch %d", i);
        if ((i % 64) == 0) {
            xfer_progress(s->ctx);
        }
    }
    TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
    for (int i = 0; i < FETCH_N; i++) {
        xfer_status_t st = xfer_request_wait(reqs[i], parked_timeout_s() * 1000 + TP_WAIT_MS);

        refused += (st == XFER_ERR_NO_RESOURCE);
        expired += (st == XFER_ERR_TIMEOUT);
        other   += (st != XFER_ERR_NO_RESOURCE) && (st != XFER_ERR_TIMEOUT);
        xfer_request_release(reqs[i]);
    }
    TP_CHECK(tp_ctl_send_u64(s->ctl, refused) == 0, "ctl");
    TP_CHECK(tp_ctl_send_u64(s->ctl, expired) == 0, "ctl");
    TP_CHECK(tp_ctl_send_u64(s->ctl, other) == 0, "ctl");
    TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS * 3) == 0, "no word");
    tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS);
    return 0;
}

/* Fetch one tensor that the parent publishes (uint8, 4096 bytes, pattern 4096). */
static int cli_good_fetch(tp_side_t *s)
{
    static uint8_t buf[4096];
    xfer_fetch_params_t fp = {.size = sizeof(fp), .buffer = buf, .capacity = sizeof(buf)};
    xfer_request_t *req = NULL;
    uint64_t v;

    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
    TP_CHECK(TP_POSTED(xfer_tensor_fetch(s->ep, 1, "good", &fp, NULL, NULL, &req)), "fetch");
    TP_CHECK_STATUS(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
    TP_CHECK(tp_check_pattern(buf, sizeof(buf), 4096) == -1, "the good tensor's data");
    xfer_request_release(req);
    TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
    TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS * 3) == 0, "no word");
    tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS);
    return 0;
}

static xfer_endpoint_t *accept_client(xfer_context_t *ctx, tp_peer_t *p, tp_scenario_t fn)
{
    xfer_endpoint_t *ep = NULL;
    xfer_listener_t *l;
    char addr[64];

    cr_assert_eq(xfer_listen(ctx, "127.0.0.1:0", &l), XFER_OK);
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", xfer_listener_port(l));
    tp_client_spawn(p, addr, fn, NULL, NULL);
    cr_assert_eq(xfer_accept(l, TP_WAIT_MS, &ep), XFER_OK);
    xfer_listener_close(l);
    return ep;
}

static void progress_until_word(xfer_context_t *ctx, tp_peer_t *p, int ms)
{
    double end = tp_now_ms() + ms;

    while (!tp_ctl_ready(p->ctl, 0) && (tp_now_ms() < end)) {
        xfer_progress(ctx);
    }
}

Test(bounds, fetches_of_tensors_never_published_are_refused_past_the_bound_then_expire)
{
    static uint8_t data[4096];
    xfer_tensor_t t = {.dtype = XFER_DTYPE_UINT8, .rank = 1, .dims = {4096}, .size = 4096,
                       .data = data};
    uint64_t refused, expired, other;
    xfer_endpoint_t *ep_flooder, *ep_good;
    tp_peer_t flooder, good;
    xfer_context_t *ctx;
    char timeout[16];
    long base;

    setenv("XFER_TENSOR_MAX_REQUESTS", "256", 1);
    snprintf(timeout, sizeof(timeout), "%ds", parked_timeout_s());
    setenv("XFER_TENSOR_REQUEST_TIMEOUT", timeout, 1);
    ctx = tp_context(0);
    tp_fill_pattern(data, sizeof(data), 4096);
    ep_flooder = accept_client(ctx, &flooder, cli_flood_fetches);
    ep_good    = accept_client(ctx, &good, cli_good_fetch);
    base = status_kb("VmRSS");
    progress_until_word(ctx, &flooder, TP_WAIT_MS * 2);
    cr_assert_eq(tp_recv(&flooder), 1);
    /* the well-behaved consumer is served meanwhile */
    cr_assert_eq(xfer_tensor_publish(ctx, 1, "good", &t, 0, NULL, NULL, NULL), XFER_OK);
    tp_send(&good, 1);
    progress_until_word(ctx, &good, TP_WAIT_MS);
    cr_assert_eq(tp_recv(&good), 1);
    /* the parked ones expire */
    progress_until_word(ctx, &flooder, parked_timeout_s() * 1000 + TP_WAIT_MS);
    refused = tp_recv(&flooder);
    expired = tp_recv(&flooder);
    other   = tp_recv(&flooder);
    cr_expect_eq(expired, PARKED_MAX, "%llu requests waited until they expired, the bound is "
                 "%u", (unsigned long long)expired, PARKED_MAX);
    cr_expect_eq(refused, FETCH_N - PARKED_MAX, "%llu requests refused",
                 (unsigned long long)refused);
    cr_expect_eq(other, 0, "%llu requests ended otherwise", (unsigned long long)other);
    /* 20000 requests with 1000-byte keys would be ~40 MB; 256 are ~0.5 MB */
    expect_peak_within(base, 8 * MIB, "tensor requests that wait for a publish");
    tp_send(&good, 0);
    tp_send(&flooder, 0);
    tp_child_expect_ok(&good, 30);
    tp_child_expect_ok(&flooder, 30);
    xfer_endpoint_close(ep_good);
    xfer_endpoint_close(ep_flooder);
    xfer_context_destroy(ctx);
}

/* ---- a step aborted so long ago that it is forgotten ----------------------------------------- */

static int cli_fetch_old_steps(tp_side_t *s)
{
    static char buf[64];
    xfer_fetch_params_t fp = {.size = sizeof(fp), .buffer = buf, .capacity = sizeof(buf)};
    xfer_request_t *forgotten = NULL, *remembered = NULL;
    double t0;
    uint64_t v;

    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
    t0 = tp_now_ms();
    TP_CHECK(TP_POSTED(xfer_tensor_fetch(s->ep, 1, "w", &fp, NULL, NULL, &forgotten)), "fetch");
    TP_CHECK(TP_POSTED(xfer_tensor_fetch(s->ep, 2000, "w", &fp, NULL, NULL, &remembered)),
             "fetch");
    TP_CHECK_STATUS(xfer_request_wait(remembered, TP_WAIT_MS), XFER_ERR_ABORTED);
    TP_CHECK_STATUS(xfer_request_wait(forgotten, TP_WAIT_MS), XFER_ERR_TIMEOUT);
    TP_CHECK(tp_now_ms() - t0 < 10000, "the forgotten step's fetch took %.0f ms",
             tp_now_ms() - t0);
    xfer_request_release(forgotten);
    xfer_request_release(remembered);
    TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
    TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS * 3) == 0, "no word");
    tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS);
    return 0;
}

Test(bounds, a_fetch_of_a_step_aborted_too_long_ago_to_remember_expires)
{
    xfer_context_t *ctx;
    xfer_endpoint_t *ep;
    tp_peer_t p;

    setenv("XFER_TENSOR_REQUEST_TIMEOUT", "1s", 1);
    ctx = tp_context(0);
    /* steps 1..2000 aborted: the oldest are no longer remembered */
    for (uint64_t step = 1; step <= 2000; step++) {
        cr_assert_eq(xfer_tensor_abort(ctx, step, XFER_ERR_ABORTED), XFER_OK);
    }
    ep = accept_client(ctx, &p, cli_fetch_old_steps);
    tp_send(&p, 1);
    progress_until_word(ctx, &p, TP_WAIT_MS);
    cr_assert_eq(tp_recv(&p), 1);
    tp_send(&p, 0);
    tp_child_expect_ok(&p, 30);
    xfer_endpoint_close(ep);
    xfer_context_destroy(ctx);
}
