/*
 * Failures between real processes: a peer SIGKILLed in the middle of a 64 MiB message or of
 * many puts, a peer that closes its endpoint under our pending receives, our own close with
 * operations pending, and two sides that share no transport. Pending requests must fail
 * within a bounded time rather than hang, the endpoint must say it is broken, and the process
 * must keep working with other peers.
 */
#include "test_peer.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void setup(void)
{
    tp_env();
}

TestSuite(faults, .init = setup, .timeout = 120);

#define ALL       (~0ull)
#define BIG       (64u << 20)
#define FAIL_MS   10000         /* how long a dead peer may take to be noticed */

static void kill_peer(tp_peer_t *p)
{
    cr_assert_eq(kill(p->pid, SIGKILL), 0);
    cr_assert_eq(tp_child_wait(p, 10), 128 + SIGKILL);
    close(p->ctl);
    p->ctl = -1;
}

/* A request pending on a dead peer ends with an error, within FAIL_MS. */
static xfer_status_t expect_failure(xfer_request_t *req, const char *what)
{
    double t0       = tp_now_ms();
    xfer_status_t s = xfer_request_wait(req, FAIL_MS + 5000);
    double dt       = tp_now_ms() - t0;

    cr_expect_neq(s, XFER_ERR_TIMEOUT, "%s: still pending %.0f ms after the peer died", what,
                  dt);
    cr_expect(s < 0, "%s: completed with %s although the peer died", what,
              xfer_status_string(s));
    cr_expect_lt(dt, FAIL_MS, "%s: took %.0f ms to fail", what, dt);
    return s;
}

/* Post a receive for a 64 MiB message and never progress it: whatever the transport, the
 * message stays in the middle of its way until the kill. */
static int srv_stall_receiving(tp_side_t *s)
{
    char *buf = malloc(BIG);
    xfer_request_t *req = NULL;
    uint64_t v;

    TP_CHECK(TP_POSTED(xfer_tag_recv(s->ctx, s->ep, 1, ALL, buf, BIG, NULL, NULL, NULL, &req)),
             "recv");
    TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
    tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS * 3);    /* killed before this returns */
    return 1;
}

Test(faults, peer_killed_in_the_middle_of_a_64_mib_message)
{
    tp_peer_t p;
    char *buf = malloc(BIG), tiny[64];
    xfer_request_t *send = NULL, *recv_ep = NULL, *recv_any = NULL, *late = NULL;
    tp_calls_t send_slot = {0}, recv_slot = {0};
    xfer_status_t s;

    tp_fill_pattern(buf, BIG, 1);
    tp_start(&p, srv_stall_receiving, NULL);
    cr_assert(TP_POSTED(xfer_tag_send(p.ep, 1, buf, BIG, NULL, tp_calls_cb, &send_slot, &send)));
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 2, ALL, tiny, sizeof(tiny), NULL, tp_calls_cb,
                                      &recv_slot, &recv_ep)));
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, NULL, 3, ALL, tiny, sizeof(tiny), NULL, NULL, NULL,
                                      &recv_any)));
    cr_assert_eq(tp_recv(&p), 1);
    tp_progress_for(p.ctx, 200);
    cr_assert_eq(xfer_request_test(send), XFER_INPROGRESS,
                 "64 MiB cannot have reached a peer that stopped progressing");
    kill_peer(&p);

    s = expect_failure(send, "the 64 MiB send");
    cr_expect_eq(send_slot.calls, 1, "send callback called %d times", send_slot.calls);
    cr_expect_eq(send_slot.status, s);
    expect_failure(recv_ep, "a receive on the dead endpoint");
    cr_expect_eq(recv_slot.calls, 1);
    cr_expect_neq(xfer_endpoint_status(p.ep), XFER_OK, "the endpoint must report the failure");
    cr_expect_eq(xfer_request_test(recv_any), XFER_INPROGRESS,
                 "a receive from any peer outlives one peer");

    /* new operations on the dead endpoint fail too, at once or soon */
    s = xfer_tag_send(p.ep, 4, tiny, sizeof(tiny), NULL, NULL, NULL, &late);
    if (TP_POSTED(s)) {
        expect_failure(late, "a send posted after the peer died");
        xfer_request_release(late);
    }
    xfer_request_release(send);
    xfer_request_release(recv_ep);

    tp_another_peer_works(p.ctx, (const size_t[]){100000, 0});
    cr_expect_eq(xfer_request_cancel(recv_any), XFER_OK);
    cr_expect_eq(xfer_request_wait(recv_any, TP_WAIT_MS), XFER_ERR_CANCELED);
    xfer_request_release(recv_any);
    xfer_endpoint_close(p.ep);
    xfer_context_destroy(p.ctx);
    free(buf);
}

/* Register 64 MiB, hand over its key, then stop progressing until killed. */
static int srv_stall_target(tp_side_t *s)
{
    char *buf = malloc(BIG);
    xfer_mem_t *mem;
    void *blob;
    size_t len;
    uint64_t v;

    TP_CHECK_STATUS(xfer_mem_register(s->ctx, buf, BIG, XFER_MEM_HOST, &mem), XFER_OK);
    TP_CHECK_STATUS(xfer_rkey_pack(mem, &blob, &len), XFER_OK);
    TP_CHECK(tp_ctl_send_u64(s->ctl, (uintptr_t)buf) == 0, "ctl");
    TP_CHECK(tp_ctl_send(s->ctl, blob, len) == 0, "ctl");
    tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS * 3);
    return 1;
}

#define NPUTS 256

Test(faults, peer_killed_with_many_puts_in_flight)
{
    static tp_calls_t slots[NPUTS];
    xfer_request_t *reqs[NPUTS], *late = NULL;
    int pending_at_kill[NPUTS];
    char *buf = calloc(1, BIG);     /* initialised: valgrind checks what is sent */
    tp_peer_t p;
    uint64_t base;
    xfer_rkey_t *rkey;
    xfer_mem_t *mem;
    void *blob;
    size_t len, chunk = BIG / NPUTS;
    int pending = 0, failed_after_kill = 0;
    xfer_status_t s;

    tp_start(&p, srv_stall_target, NULL);
    base = tp_recv(&p);
    blob = tp_recv_blob(&p, &len);
    cr_assert_eq(xfer_rkey_unpack(p.ep, blob, len, &rkey), XFER_OK);
    free(blob);
    cr_assert_eq(xfer_mem_register(p.ctx, buf, BIG, XFER_MEM_HOST, &mem), XFER_OK);
    memset(slots, 0, sizeof(slots));
    for (int i = 0; i < NPUTS; i++) {
        s = xfer_put(p.ep, buf + i * chunk, chunk, mem, base + i * chunk, rkey, tp_calls_cb,
                     &slots[i], &reqs[i]);
        cr_assert(TP_POSTED(s), "put %d: %s", i, xfer_status_string(s));
    }
    tp_progress_for(p.ctx, 100);
    /* what this side knows at the kill: no progress between this look and the kill */
    for (int i = 0; i < NPUTS; i++) {
        pending_at_kill[i] = (slots[i].calls == 0);
        pending += pending_at_kill[i];
    }
    kill_peer(&p);
    for (int i = 0; i < NPUTS; i++) {
        s = xfer_request_wait(reqs[i], FAIL_MS);
        cr_assert_neq(s, XFER_ERR_TIMEOUT, "put %d still pending after the peer died", i);
        /* a put whose data reached the peer before it died may still complete with success
         * (an RDMA write's completion does not need the peer's process); the rest fail */
        failed_after_kill += pending_at_kill[i] && (s < 0);
        cr_assert_eq(slots[i].calls, 1, "put %d: callback called %d times", i, slots[i].calls);
        xfer_request_release(reqs[i]);
    }
    cr_log_info("%d of %d puts were pending at the kill, %d of them failed", pending, NPUTS,
                failed_after_kill);
    cr_expect((pending == 0) || (failed_after_kill > 0), "%d puts were pending when the peer "
              "died and every one of them completed with success", pending);
    /* a put posted now fails: the endpoint is broken */
    s = xfer_put(p.ep, buf, chunk, mem, base, rkey, NULL, NULL, &late);
    if (TP_POSTED(s)) {
        expect_failure(late, "a put posted after the peer died");
        xfer_request_release(late);
    }
    cr_expect_neq(xfer_endpoint_status(p.ep), XFER_OK);
    xfer_rkey_destroy(rkey);
    cr_expect_eq(xfer_mem_deregister(mem), XFER_OK, "nothing uses the buffer any more");
    tp_another_peer_works(p.ctx, (const size_t[]){100000, 0});
    xfer_endpoint_close(p.ep);
    xfer_context_destroy(p.ctx);
    free(buf);
}

/* On word: close our endpoint (its pending receive must be cancelled), say so; then accept
 * a new connection and echo on it. */
static int srv_close_then_serve(tp_side_t *s)
{
    char buf[64];
    xfer_request_t *req = NULL;
    uint64_t v;

    TP_CHECK(TP_POSTED(xfer_tag_recv(s->ctx, s->ep, 9, ALL, buf, sizeof(buf), NULL, NULL, NULL,
                                     &req)), "recv");
    TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS) == 0, "no word");
    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
    xfer_endpoint_close(s->ep);
    s->ep = NULL;
    TP_CHECK_STATUS(xfer_request_wait(req, 1000), XFER_ERR_CANCELED);
    xfer_request_release(req);
    TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
    TP_CHECK_STATUS(xfer_accept(s->listener, TP_WAIT_MS, &s->ep), XFER_OK);
    return tp_echo_server(s);
}

Test(faults, peer_closes_its_endpoint_under_our_pending_receives)
{
    tp_peer_t p;
    char a[64], b[64];
    xfer_request_t *on_ep = NULL, *any = NULL;
    xfer_endpoint_t *again;

    tp_start(&p, srv_close_then_serve, NULL);
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 5, ALL, a, sizeof(a), NULL, NULL, NULL,
                                      &on_ep)));
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, NULL, 6, ALL, b, sizeof(b), NULL, NULL, NULL,
                                      &any)));
    cr_assert_eq(xfer_request_wait(on_ep, 100), XFER_ERR_TIMEOUT);
    tp_send(&p, 1);
    cr_assert_eq(tp_recv(&p), 1, "the peer's own pending receive was cancelled");
    expect_failure(on_ep, "a receive on an endpoint the peer closed");
    cr_expect_neq(xfer_endpoint_status(p.ep), XFER_OK);
    cr_expect_eq(xfer_request_test(any), XFER_INPROGRESS);
    xfer_request_release(on_ep);

    /* both processes keep working: a new connection to the same peer */
    again = tp_connect(p.ctx, &p);
    tp_echo_ping(p.ctx, again, 3, 1000);
    tp_echo_stop(again);
    tp_child_expect_ok(&p, 30);
    cr_expect_eq(xfer_request_cancel(any), XFER_OK);
    cr_expect_eq(xfer_request_wait(any, TP_WAIT_MS), XFER_ERR_CANCELED);
    xfer_request_release(any);
    xfer_endpoint_close(again);
    xfer_endpoint_close(p.ep);
    xfer_context_destroy(p.ctx);
}

/* Deaf until told to finish: nothing we send is taken. */
static int srv_deaf(tp_side_t *s)
{
    uint64_t v;

    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS * 3) == 0, "ctl");
    return 0;
}

Test(faults, closing_an_endpoint_cancels_its_pending_operations)
{
    tp_peer_t p;
    char *big = malloc(BIG), small[64], any_buf[64], fbuf[64];
    xfer_request_t *send = NULL, *recv = NULL, *fetch = NULL, *any = NULL;
    tp_calls_t send_slot = {0}, recv_slot = {0}, fetch_slot = {0};
    xfer_fetch_params_t fp = {sizeof(fp), fbuf, sizeof(fbuf), NULL, NULL, NULL};

    tp_fill_pattern(big, BIG, 3);
    tp_start(&p, srv_deaf, NULL);
    cr_assert(TP_POSTED(xfer_tag_send(p.ep, 1, big, BIG, NULL, tp_calls_cb, &send_slot, &send)));
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 2, ALL, small, sizeof(small), NULL, tp_calls_cb,
                                      &recv_slot, &recv)));
    cr_assert(TP_POSTED(xfer_tensor_fetch(p.ep, 1, "never", &fp, tp_calls_cb, &fetch_slot,
                                          &fetch)));
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, NULL, 2, ALL, any_buf, sizeof(any_buf), NULL, NULL,
                                      NULL, &any)));
    tp_progress_for(p.ctx, 100);
    cr_assert_eq(xfer_request_test(send), XFER_INPROGRESS);
    cr_assert_eq(xfer_request_test(recv), XFER_INPROGRESS);
    cr_assert_eq(xfer_request_test(fetch), XFER_INPROGRESS);

    /* forced: the deaf peer would keep a graceful close waiting for XFER_CLOSE_TIMEOUT
     * (test_close.c tests that) */
    cr_assert_eq(xfer_endpoint_close_nb(p.ep, XFER_CLOSE_FLAG_FORCE, NULL, NULL, NULL),
                 XFER_OK);
    p.ep = NULL;
    cr_expect_eq(xfer_request_wait(send, 1000), XFER_ERR_CANCELED, "send");
    cr_expect_eq(xfer_request_wait(recv, 1000), XFER_ERR_CANCELED, "receive");
    cr_expect_eq(xfer_request_wait(fetch, 1000), XFER_ERR_CANCELED, "fetch");
    tp_progress_for(p.ctx, 20);
    cr_expect_eq(send_slot.calls, 1);
    cr_expect_eq(send_slot.status, XFER_ERR_CANCELED);
    cr_expect_eq(recv_slot.calls, 1);
    cr_expect_eq(fetch_slot.calls, 1);
    cr_expect_eq(xfer_request_test(any), XFER_INPROGRESS,
                 "a receive from any peer is not the endpoint's");
    cr_expect_eq(xfer_request_cancel(any), XFER_OK);
    cr_expect_eq(xfer_request_wait(any, TP_WAIT_MS), XFER_ERR_CANCELED);
    xfer_request_release(send);
    xfer_request_release(recv);
    xfer_request_release(fetch);
    xfer_request_release(any);
    tp_send(&p, 0);
    tp_finish(&p);
    free(big);
}

/* ---- no shared transport --------------------------------------------------------------------- */

static int srv_expect_unreachable(tp_side_t *s)
{
    xfer_endpoint_t *ep = NULL;
    xfer_status_t st    = xfer_accept(s->listener, TP_WAIT_MS, &ep);

    TP_CHECK(ep == NULL, "an endpoint came back from a failed accept");
    TP_CHECK(tp_ctl_send_u64(s->ctl, (uint64_t)(int64_t)st) == 0, "ctl");
    return 0;
}

Test(faults, server_excluding_our_transport_is_unreachable_from_both_sides)
{
    static char exclude[64];
    tp_opts_t o = {.transports = exclude, .accepts = -1};
    xfer_endpoint_t *ep = NULL;
    xfer_context_t *ctx;
    tp_peer_t p;
    xfer_status_t s;

    snprintf(exclude, sizeof(exclude), "^%s", tp_transport());
    tp_server_spawn(&p, srv_expect_unreachable, NULL, &o);
    ctx = tp_context(0);
    s   = xfer_connect(ctx, p.address, &ep);
    cr_expect_eq(s, XFER_ERR_UNREACHABLE, "client (%s) to a server with XFER_TRANSPORTS=%s: %s",
                 tp_transport(), exclude, xfer_status_string(s));
    cr_expect_null(ep);
    s = (xfer_status_t)(int64_t)tp_recv(&p);
    cr_expect_eq(s, XFER_ERR_UNREACHABLE, "the server's accept: %s", xfer_status_string(s));
    tp_child_expect_ok(&p, 30);
    tp_another_peer_works(ctx, (const size_t[]){100000, 0});
    xfer_context_destroy(ctx);
}

Test(faults, client_allowing_only_what_we_lack_is_unreachable_from_both_sides)
{
    char *dir = tu_plugin_dir((const char *[]){"talpha", NULL});
    tp_opts_t bad = {.transports = "talpha", .component_path = dir,
                     .expect_connect = XFER_ERR_UNREACHABLE};
    xfer_context_t *ctx = tp_context(0);
    xfer_listener_t *l;
    xfer_endpoint_t *ep = NULL;
    tp_peer_t c, good;
    char addr[64];
    xfer_status_t s;

    cr_assert_eq(xfer_listen(ctx, "127.0.0.1:0", &l), XFER_OK);
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", xfer_listener_port(l));
    tp_client_spawn(&c, addr, NULL, NULL, &bad);
    s = xfer_accept(l, TP_WAIT_MS, &ep);
    cr_expect_eq(s, XFER_ERR_UNREACHABLE, "accept from a talpha-only client: %s",
                 xfer_status_string(s));
    cr_expect_null(ep);
    tp_child_expect_ok(&c, 30);
    /* the listener still serves a client that shares our transport */
    tp_client_spawn(&good, addr, tp_echo_server, NULL, NULL);
    cr_assert_eq(xfer_accept(l, TP_WAIT_MS, &ep), XFER_OK);
    cr_assert_str_eq(xfer_endpoint_transport(ep), tp_transport());
    tp_echo_ping(ctx, ep, 5, 5000);
    tp_echo_stop(ep);
    tp_child_expect_ok(&good, 30);
    xfer_endpoint_close(ep);
    xfer_listener_close(l);
    xfer_context_destroy(ctx);
    tu_dir_remove(dir);
}

/* ---- teardown with everything open ----------------------------------------------------------- */

/* Our endpoint must fail once the parent destroys its context without closing anything. */
static int srv_expect_ep_failure(tp_side_t *s)
{
    char buf[64];
    xfer_request_t *req = NULL;
    xfer_status_t st;

    TP_CHECK(TP_POSTED(xfer_tag_recv(s->ctx, s->ep, 1, ALL, buf, sizeof(buf), NULL, NULL, NULL,
                                     &req)), "recv");
    TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
    st = xfer_request_wait(req, FAIL_MS);
    TP_CHECK((st < 0) && (st != XFER_ERR_TIMEOUT), "the receive on the endpoint whose peer "
             "destroyed its context ended with %s", xfer_status_string(st));
    TP_CHECK(xfer_endpoint_status(s->ep) != XFER_OK, "the endpoint still reports XFER_OK");
    xfer_request_release(req);
    return 0;
}

Test(faults, context_destroy_with_everything_still_open)
{
    static tp_calls_t slots[4];
    char *big = calloc(1, BIG), small[64] = "", fbuf[64];
    uint8_t tdata[48] = {0};
    xfer_tensor_t t   = {XFER_DTYPE_FLOAT32, 2, {3, 4}, 48, tdata, 0};
    xfer_fetch_params_t fp = {sizeof(fp), fbuf, sizeof(fbuf), NULL, NULL, NULL};
    xfer_listener_t *l;
    xfer_mem_t *mem;
    tp_peer_t p;
    double t0;

    /* the 64 MiB send to a peer that receives none of it cannot be delivered: destroy's
     * graceful close waits this long for it, then forces */
    setenv("XFER_CLOSE_TIMEOUT", "1s", 1);
    tp_start(&p, srv_expect_ep_failure, NULL);
    cr_assert_eq(tp_recv(&p), 1);
    memset(slots, 0, sizeof(slots));
    cr_assert_eq(xfer_listen(p.ctx, "127.0.0.1:0", &l), XFER_OK);
    cr_assert_eq(xfer_mem_register(p.ctx, big, BIG, XFER_MEM_HOST, &mem), XFER_OK);
    cr_assert(TP_POSTED(xfer_tag_send(p.ep, 1 << 20, big, BIG, mem, tp_calls_cb, &slots[0], NULL)));
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 2, ALL, small, sizeof(small), NULL, tp_calls_cb,
                                      &slots[1], NULL)));
    cr_assert(TP_POSTED(xfer_tensor_fetch(p.ep, 1, "never", &fp, tp_calls_cb, &slots[2], NULL)));
    cr_assert(TP_POSTED(xfer_tensor_publish(p.ctx, 1, "unfetched", &t, XFER_PUBLISH_COPY,
                                            tp_calls_cb, &slots[3], NULL)));
    tp_progress_for(p.ctx, 50);
    t0 = tp_now_ms();
    xfer_context_destroy(p.ctx);
    cr_expect_lt(tp_now_ms() - t0, 5000, "xfer_context_destroy took %.0f ms",
                 tp_now_ms() - t0);
    for (int i = 0; i < 4; i++) {
        cr_expect_leq(slots[i].calls, 1, "callback %d called %d times", i, slots[i].calls);
    }
    p.ctx = NULL;
    p.ep  = NULL;
    tp_finish(&p);
    free(big);
}

#define CHURN 40

/* Accept CHURN connections one after the other; echo one message on each, then close it. */
static int srv_churn(tp_side_t *s)
{
    char buf[4096];

    for (int i = 0; i < CHURN; i++) {
        xfer_request_t *req = NULL;
        xfer_endpoint_t *ep = NULL;
        size_t len;

        TP_CHECK_STATUS(xfer_accept(s->listener, TP_WAIT_MS, &ep), XFER_OK);
        TP_CHECK(TP_POSTED(xfer_tag_recv(s->ctx, ep, 0, 0, buf, sizeof(buf), NULL, NULL, NULL,
                                         &req)), "recv");
        TP_CHECK_STATUS(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
        len = xfer_request_length(req);
        xfer_request_release(req);
        req = NULL;
        TP_CHECK(TP_POSTED(xfer_tag_send(ep, (uint64_t)i, buf, len, NULL, NULL, NULL, &req)),
                 "send");
        TP_CHECK_STATUS(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
        xfer_request_release(req);
        xfer_endpoint_close(ep);
    }
    return 0;
}

Test(faults, connection_churn_leaks_no_descriptors)
{
    tp_opts_t o = {.accepts = -1};
    xfer_context_t *ctx;
    tp_peer_t p;
    int before = 0;

    tp_server_spawn(&p, srv_churn, NULL, &o);
    ctx = tp_context(0);
    for (int i = 0; i < CHURN; i++) {
        xfer_endpoint_t *ep;

        if (i == 5) {
            before = tu_fd_count();   /* after any lazily opened descriptors */
        }
        ep = tp_connect(ctx, &p);
        tp_echo_ping(ctx, ep, (uint64_t)i, 1000 + (size_t)i);
        xfer_endpoint_close(ep);
    }
    cr_expect_eq(tu_fd_count(), before, "%d descriptors open after %d more connections, %d "
                 "before", tu_fd_count(), CHURN - 5, before);
    tp_child_expect_ok(&p, 30);
    xfer_context_destroy(ctx);
}
