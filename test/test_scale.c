/*
 * Many peers at once: one process connects a burst of endpoints to one server, which accepts
 * them in a loop - the pattern of a parameter server whose workers all start together. Every
 * endpoint must connect (over tcp with every lane it agreed on: the server drains its lane
 * port while it sits in xfer_accept) and carry a message each way, checked byte for byte.
 *
 * Runs over the transport the suite runs over (XFERTEST_TRANSPORT); lanes are tcp's, and
 * are checked where the endpoint reports them (its "lanes" and "lanes_up" counters).
 * bench_scale.sh (contrib/bench) measures what this only checks: connect time, memory and
 * descriptors per endpoint, and what progress costs as the count grows.
 */
#include "test_peer.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#define BURST   512
#define MSG     (128u << 10)    /* over XFER_TCP_LANE_MIN_SIZE below: striped over the lanes */
#define TAG_ALL (~0ull)

static void setup(void)
{
    struct rlimit rl;

    tp_env();
    /* two descriptors an endpoint or more, each side: above the usual soft limit of 1024 */
    if ((getrlimit(RLIMIT_NOFILE, &rl) == 0) && (rl.rlim_cur < 8192)) {
        rl.rlim_cur = (rl.rlim_max < 8192) ? rl.rlim_max : 8192;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
    }
    setenv("XFER_TCP_LANE_MIN_SIZE", "64k", 1);
}

TestSuite(scale, .init = setup, .timeout = 300);

/* How many of eps[0, n) have fewer lanes up than they agreed on (0 without lanes). */
static int lanes_missing(xfer_endpoint_t **eps, int n)
{
    int missing = 0;

    for (int i = 0; i < n; i++) {
        int64_t want = tu_ep_counter(eps[i], "lanes"), up = tu_ep_counter(eps[i], "lanes_up");

        missing += (want >= 0) && (up != want);
    }
    return missing;
}

/* Wait for every request of reqs[0, n); its status, or the first failure. */
static xfer_status_t wait_all(xfer_context_t *ctx, xfer_request_t **reqs, int n, int ms)
{
    xfer_status_t status = XFER_OK;

    for (int i = 0; i < n; i++) {
        xfer_status_t s = xfer_request_wait(reqs[i], ms);

        if ((s != XFER_OK) && (status == XFER_OK)) {
            status = s;
        }
        xfer_request_release(reqs[i]);
    }
    (void)ctx;
    return status;
}

/* Accept BURST endpoints, then on a word receive a message on each, check it and send it
 * back; report how many endpoints lack lanes; close on a word. */
static int srv_burst(tp_side_t *s)
{
    static xfer_endpoint_t *eps[BURST];
    static xfer_request_t *reqs[BURST];
    uint8_t *bufs = malloc((size_t)BURST * MSG);
    uint64_t v;

    TP_CHECK(bufs != NULL, "malloc");
    for (int i = 0; i < BURST; i++) {
        TP_CHECK_STATUS(xfer_accept(s->listener, TP_WAIT_MS, &eps[i]), XFER_OK);
    }
    for (int i = 0; i < BURST; i++) {
        TP_CHECK(TP_POSTED(xfer_tag_recv(s->ctx, eps[i], 0, 0, bufs + (size_t)i * MSG, MSG,
                                         NULL, NULL, NULL, &reqs[i])), "recv %d", i);
    }
    TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
    TP_CHECK_STATUS(wait_all(s->ctx, reqs, BURST, TP_WAIT_MS), XFER_OK);
    /* whichever endpoint a message came on, it says which of the client's it was: the
     * pattern's seed is its index, sent back as it came */
    for (int i = 0; i < BURST; i++) {
        TP_CHECK(TP_POSTED(xfer_tag_send(eps[i], 1, bufs + (size_t)i * MSG, MSG, NULL,
                                         NULL, NULL, &reqs[i])), "send %d", i);
    }
    TP_CHECK_STATUS(wait_all(s->ctx, reqs, BURST, TP_WAIT_MS), XFER_OK);
    TP_CHECK(tp_ctl_send_u64(s->ctl, (uint64_t)lanes_missing(eps, BURST)) == 0, "ctl");
    TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS) == 0, "ctl");
    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
    for (int i = 0; i < BURST; i++) {
        xfer_endpoint_close(eps[i]);
    }
    free(bufs);
    return 0;
}

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

Test(scale, a_burst_of_512_endpoints_connects_with_every_lane_and_each_carries_traffic)
{
    static xfer_endpoint_t *eps[BURST];
    static xfer_request_t *reqs[BURST];
    tp_opts_t opts = {.accepts = -1};
    uint8_t *out   = malloc((size_t)BURST * MSG);
    uint8_t *in    = malloc((size_t)BURST * MSG);
    xfer_context_t *ctx;
    double t0, took;
    int missing = -1;
    tp_peer_t p;

    cr_assert((out != NULL) && (in != NULL));
    tp_server_spawn(&p, srv_burst, NULL, &opts);
    ctx = tp_context(0);
    t0  = now_s();
    for (int i = 0; i < BURST; i++) {
        eps[i] = tp_connect(ctx, &p);
    }
    took = now_s() - t0;
    cr_log_info("%d endpoints over %s connected in %.3f s", BURST, tp_transport(), took);
    /* a lane whose connect did not finish inside xfer_connect goes on from progress */
    for (t0 = now_s(); (now_s() - t0) * 1000.0 < TP_WAIT_MS; ) {
        missing = lanes_missing(eps, BURST);
        if (missing == 0) {
            break;
        }
        (void)xfer_progress(ctx);
    }
    cr_assert_eq(missing, 0, "%d of %d endpoints lack lanes they agreed on", missing, BURST);

    for (int i = 0; i < BURST; i++) {
        tp_fill_pattern(out + (size_t)i * MSG, MSG, (uint64_t)i + 1);
        cr_assert(TP_POSTED(xfer_tag_recv(ctx, eps[i], 1, TAG_ALL, in + (size_t)i * MSG, MSG,
                                          NULL, NULL, NULL, &reqs[i])));
    }
    cr_assert_eq(tp_recv(&p), 1);
    for (int i = 0; i < BURST; i++) {
        xfer_request_t *req = NULL;

        cr_assert(TP_POSTED(xfer_tag_send(eps[i], 0, out + (size_t)i * MSG, MSG, NULL,
                                          NULL, NULL, &req)));
        xfer_request_release(req);
    }
    cr_assert_eq(wait_all(ctx, reqs, BURST, TP_WAIT_MS), XFER_OK);
    for (int i = 0; i < BURST; i++) {
        ssize_t bad = tp_check_pattern(in + (size_t)i * MSG, MSG, (uint64_t)i + 1);

        cr_assert_eq(bad, -1, "endpoint %d: the message came back wrong at byte %zd", i, bad);
    }
    cr_assert_eq(tp_recv(&p), 0, "endpoints of the server lack lanes they agreed on");
    tp_send(&p, 1);
    for (int i = 0; i < BURST; i++) {
        xfer_endpoint_close(eps[i]);
    }
    xfer_context_destroy(ctx);
    tp_child_expect_ok(&p, 60);
    free(out);
    free(in);
}
