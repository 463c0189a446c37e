/*
 * The verbs suite's fault tests, between two real processes: a peer killed in the middle of
 * 64 MiB transfers (what was pending on it fails within FAIL_MS, a receive from any peer
 * outlives it, and the same context, then a new one, reach a fresh peer), and a link that goes
 * down under traffic (RC retries and keepalive probes, not the bootstrap socket, must notice,
 * on both ends), and a peer whose device stops answering while its port stays up (an orderly
 * close ends at its timeout and says why). test_verbs.c holds the suite's setup and its
 * data-path tests.
 *
 * peer_killed_midtransfer runs with the rest of the suite in the Soft-RoCE guest (see
 * test_verbs.c). link_down and the silent device need two RDMA devices on the two ends of a
 * veth pair, which only the guest's --two-hosts form sets up (elsewhere they are skipped,
 * saying why):
 *   XFERTEST_TRANSPORT=verbs contrib/rxe_guest --two-hosts -- \
 *       test/verbs_suites.sh build "verbs:@(link_down|a_close_to_a_silent_device*)"
 */
#include "test_verbs.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FAIL_MS  10000          /* a dead peer must be noticed within this */

/* =============================================================================================
 * 1. a peer killed in the middle of 64 MiB transfers
 * ============================================================================================= */

#define KILL_LEN (64u << 20)

/* A receive for the parent's 64 MiB (tag 2), then streams 64 MiB messages (tag 1) one after
 * the other until killed. */
static int srv_stream(tp_side_t *s)
{
    char *out = tv_xmalloc(KILL_LEN), *in = tv_xmalloc(KILL_LEN);
    xfer_request_t *rreq = NULL;

    memset(in, 0, KILL_LEN);
    tp_fill_pattern(out, KILL_LEN, 500);
    TP_CHECK(TP_POSTED(xfer_tag_recv(s->ctx, s->ep, 2, ALL, in, KILL_LEN, NULL, NULL, NULL,
                                     &rreq)), "recv");
    tv_child_say(s, 1);
    for (int n = 0; n < 50; n++) {
        xfer_request_t *req = NULL;
        xfer_status_t st = xfer_tag_send(s->ep, 1, out, KILL_LEN, NULL, NULL, NULL, &req);

        TP_CHECK(TP_POSTED(st), "send %d: %s", n, xfer_status_string(st));
        TP_CHECK_STATUS(tv_req_done(req, TP_WAIT_MS * 2, NULL, NULL), XFER_OK);
    }
    TP_CHECK(0, "streamed 50 x 64 MiB without being killed");
    return 1;
}

/* A request pending on a dead peer ends with an error, within FAIL_MS. */
static xfer_status_t expect_failure(xfer_request_t *req, double t_kill, int fail_ms,
                                    const char *what)
{
    xfer_status_t s = tv_req_wait(req, fail_ms + 5000);
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
    tp_calls_t recv_slot = {0}, send_slot = {0};
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
    s = tv_req_done(first, TP_WAIT_MS * 2, &len, NULL);
    cr_assert_eq(s, XFER_OK, "the first 64 MiB message: %s", xfer_status_string(s));
    bad = tp_check_pattern(in, KILL_LEN, 500);
    cr_assert_eq(bad, -1, "the first 64 MiB message: byte %zd is wrong", bad);
    memset(in, 0, KILL_LEN);

    /* the next one arriving, a receive from any peer and one nothing will be sent for */
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 1, ALL, in, KILL_LEN, NULL, tp_calls_cb,
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
    cr_assert(TP_POSTED(xfer_tag_send(p.ep, 2, out, KILL_LEN, NULL, tp_calls_cb, &send_slot,
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
    s = tv_req_wait(recv, FAIL_MS + 5000);
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
 * 2. the link goes down under traffic (contrib/rxe_guest --two-hosts)
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

    tv_setup();
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

/* fn as the peer on device B, this side on device A; the bootstrap stays on 127.0.0.1. */
static void start_across(tp_peer_t *p, tp_scenario_t fn)
{
    char dev_a[64], dev_b[64];

    guest_device(0, dev_a, sizeof(dev_a));
    guest_device(1, dev_b, sizeof(dev_b));
    cr_assert(port_active(dev_a), "%s's port is not ACTIVE", dev_a);
    cr_assert(port_active(dev_b), "%s's port is not ACTIVE", dev_b);
    setenv("XFER_VERBS_DEVICE", dev_b, 1);
    tp_server_spawn(p, fn, NULL, NULL);
    setenv("XFER_VERBS_DEVICE", dev_a, 1);
    p->ctx = tp_context(0);
    p->ep  = tp_connect(p->ctx, p);
}

/* Rounds of one LINK_MSG each way (tag 11 to the parent, 12 from it), each verified, until
 * the parent says "big": then a LINK_BIG message each way (tag 13 to the parent, 14 from it),
 * which the link failure interrupts. Reports the big operations' statuses and how long they
 * took to fail after the parent's "down" word, then waits for the end. */
static int srv_link(tp_side_t *s)
{
    char *out = tv_xmalloc(LINK_BIG), *in = tv_xmalloc(LINK_BIG);
    xfer_request_t *sreq = NULL, *rreq = NULL;
    xfer_status_t st_s, st_r;
    double t_down, ms_s, ms_r;
    uint64_t v;

    memset(out, 0x5a, LINK_BIG);           /* the big message: any non-zero bytes */
    tp_fill_pattern(out, LINK_MSG, 700);
    for (int n = 0;; n++) {
        v = tv_child_word(s);
        if (v != 1) {
            break;
        }
        memset(in, 0, LINK_MSG);
        TP_CHECK(TP_POSTED(xfer_tag_recv(s->ctx, s->ep, 12, ALL, in, LINK_MSG, NULL, NULL, NULL,
                                         &rreq)), "recv");
        TP_CHECK(TP_POSTED(xfer_tag_send(s->ep, 11, out, LINK_MSG, NULL, NULL, NULL, &sreq)),
                 "send");
        TP_CHECK_STATUS(tv_req_done(sreq, TP_WAIT_MS, NULL, NULL), XFER_OK);
        TP_CHECK_STATUS(tv_req_done(rreq, TP_WAIT_MS, NULL, NULL), XFER_OK);
        TP_CHECK(tp_check_pattern(in, LINK_MSG, 800 + n) == -1, "round %d: corrupt", n);
        tv_child_say(s, 1);
    }
    TP_CHECK(v == 2, "unexpected word %llu", (unsigned long long)v);
    TP_CHECK(TP_POSTED(xfer_tag_recv(s->ctx, s->ep, 14, ALL, in, LINK_BIG, NULL, NULL, NULL,
                                     &rreq)), "recv");
    TP_CHECK(TP_POSTED(xfer_tag_send(s->ep, 13, out, LINK_BIG, NULL, NULL, NULL, &sreq)),
             "send");
    tv_child_say(s, 2);
    TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS) == 0, "no 'down' word");
    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0 && v == 3, "ctl");
    t_down = tp_now_ms();
    st_s   = tv_req_done(sreq, LINK_FAIL_MS, NULL, NULL);
    ms_s   = tp_now_ms() - t_down;
    st_r   = tv_req_done(rreq, (int)(t_down + LINK_FAIL_MS - tp_now_ms()) + 1, NULL, NULL);
    ms_r   = tp_now_ms() - t_down;
    tv_child_say(s, (uint64_t)(int64_t)st_s);
    tv_child_say(s, (uint64_t)ms_s);
    tv_child_say(s, (uint64_t)(int64_t)st_r);
    tv_child_say(s, (uint64_t)ms_r);
    tv_child_say(s, (uint64_t)(int64_t)xfer_endpoint_status(s->ep));
    tv_child_word(s);
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
    /* fail fast: RC gives up after 50 ms x 4, idle channels are probed every 200 ms */
    setenv("XFER_VERBS_TIMEOUT", "50ms", 1);
    setenv("XFER_VERBS_RETRY_COUNT", "3", 1);
    setenv("XFER_VERBS_KEEPALIVE", "200ms", 1);
    start_across(&p, srv_link);
    guest_device(0, dev_a, sizeof(dev_a));
    guest_device(1, dev_b, sizeof(dev_b));

    for (int n = 0; n < 3; n++) {
        tp_fill_pattern(out, LINK_MSG, 800 + n);
        memset(in, 0, LINK_MSG);
        cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 11, ALL, in, LINK_MSG, NULL, NULL, NULL,
                                          &rreq)));
        cr_assert(TP_POSTED(xfer_tag_send(p.ep, 12, out, LINK_MSG, NULL, NULL, NULL, &sreq)));
        tp_send(&p, 1);
        s = tv_req_done(sreq, TP_WAIT_MS, NULL, NULL);
        cr_assert_eq(s, XFER_OK, "round %d: send %s -> %s: %s", n, dev_a, dev_b,
                     xfer_status_string(s));
        s = tv_req_done(rreq, TP_WAIT_MS, NULL, NULL);
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
 * 3. a peer whose device stops answering
 * ============================================================================================= */

/* Take one message, say so, then wait for the end (its channel may fail meanwhile). */
static int srv_silent(tp_side_t *s)
{
    xfer_request_t *req = NULL;
    char buf[64];

    TP_CHECK(TP_POSTED(xfer_tag_recv(s->ctx, s->ep, 21, ALL, buf, sizeof(buf), NULL, NULL, NULL,
                                     &req)), "recv");
    TP_CHECK_STATUS(tv_req_done(req, TP_WAIT_MS, NULL, NULL), XFER_OK);
    tv_child_say(s, 1);
    (void)tv_child_word(s);
    return 0;
}

/* netem on netdev B: every packet device B sends is dropped (none, when off). The guest's
 * kernel cannot load the module by itself (its helper looks outside the chroot). */
static int silence_b(int on)
{
    char cmd[256];

    snprintf(cmd, sizeof(cmd), on ? "modprobe sch_netem && tc qdisc add dev %s root netem "
             "loss 100%%" : "tc qdisc del dev %s root 2>/dev/null", netdev_b());
    return system(cmd);
}

/* The two-host setup, and stderr kept for the test to read (tu_read_redirected_stderr). */
static void silent_setup(void)
{
    link_setup();
    cr_redirect_stderr();
}

static void silent_restore(void)
{
    if (netdev_b() != NULL) {
        (void)silence_b(0);
    }
    link_restore();
}

/* An orderly close whose peer's device stops acknowledging - its port up, every packet it
 * sends lost, so that RC retries but neither side's port fails - ends at XFER_CLOSE_TIMEOUT
 * with XFER_ERR_TIMEOUT, and the channel's last line is a warning that names the silence:
 * its keepalive probe unanswered longer than an ack timeout. */
Test(verbs, a_close_to_a_silent_device_says_the_device_did_not_answer, .init = silent_setup,
     .fini = silent_restore)
{
    xfer_request_t *req = NULL, *creq = NULL;
    char msg[64] = "one", *log;
    xfer_status_t s;
    tp_peer_t p;

    /* RC retries for about 8 s (1.07 s x 8), longer than the close waits; idle channels are
     * probed every 200 ms */
    setenv("XFER_VERBS_TIMEOUT", "1s", 1);
    setenv("XFER_VERBS_KEEPALIVE", "200ms", 1);
    setenv("XFER_CLOSE_TIMEOUT", "3s", 1);
    setenv("XFER_LOG_LEVEL", "warn", 1);     /* what is logged is a warning, or more */
    start_across(&p, srv_silent);
    cr_assert(TP_POSTED(xfer_tag_send(p.ep, 21, msg, sizeof(msg), NULL, NULL, NULL, &req)));
    cr_assert_eq(tv_req_done(req, TP_WAIT_MS, NULL, NULL), XFER_OK);
    cr_assert_eq(tp_recv(&p), 1);

    cr_assert_eq(silence_b(1), 0, "modprobe sch_netem, then tc qdisc add dev %s root netem "
                 "loss 100%% failed", netdev_b());
    cr_assert(TP_POSTED(xfer_tag_send(p.ep, 22, msg, sizeof(msg), NULL, NULL, NULL, &req)));
    xfer_request_release(req);
    s    = xfer_endpoint_close_nb(p.ep, 0, NULL, NULL, &creq);
    p.ep = NULL;
    if (s == XFER_OK) {
        s = xfer_request_wait(creq, TP_WAIT_MS);
        xfer_request_release(creq);
    }
    log = tu_read_redirected_stderr();
    cr_assert_eq(s, XFER_ERR_TIMEOUT, "the close: %s; the log:\n%.4000s",
                 xfer_status_string(s), log);
    cr_assert_geq(tu_count_in(log, "the peer's device acknowledged none of them for"), 1,
                  "no warning said that the peer's device acknowledged nothing; the log:\n"
                  "%.4000s", log);
    free(log);
    cr_assert_eq(silence_b(0), 0);
    tp_send(&p, 0);
    tp_finish(&p);
}
