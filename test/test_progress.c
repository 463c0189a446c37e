/*
 * Waiting and progress: xfer_request_wait() sleeps on the transports' descriptors instead of
 * spinning (process CPU time well below the wall time, both while nothing comes and while it
 * waits for something that comes late), wakes up promptly, returns XFER_ERR_TIMEOUT with the
 * request still pending and completable later, and refuses to wait from inside a callback.
 * A serialized context (no lock) does the same, and refuses a progress thread. The context's
 * event fd lets an application's own loop sleep the same way: readable for input, for work
 * another thread posted, quiet otherwise; arm says busy while a completion waits.
 */
#include "test_peer.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <pthread.h>
#include <sys/resource.h>
#include <unistd.h>

static void setup(void)
{
    tp_env();
}

TestSuite(progress, .init = setup, .timeout = 60);

#define ALL (~0ull)

/* The CPU time a sleeping wait may use out of wall ms; a spinning one uses all of it. Under
 * valgrind its translation of code run for the first time and its own scheduler add a share
 * that is not xfer's (a quarter to a third of the wall time in the emulated guest). */
static double sleep_cpu_bound(double wall, double share)
{
    return wall * ((getenv("XFERTEST_VALGRIND") != NULL) ? 0.6 : share);
}

static double cpu_ms(void)
{
    struct rusage ru;

    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3;
}

/* For each word v > 0: sleep v ms without progressing, then send tag 99 (4 KiB, pattern v). */
static int srv_late_sender(tp_side_t *s)
{
    for (;;) {
        xfer_request_t *req = NULL;
        char buf[4096];
        uint64_t v;

        TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS) == 0, "no word");
        TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
        if (v == 0) {
            return 0;
        }
        usleep((useconds_t)v * 1000);
        tp_fill_pattern(buf, sizeof(buf), v);
        TP_CHECK(TP_POSTED(xfer_tag_send(s->ep, 99, buf, sizeof(buf), NULL, NULL, NULL, &req)),
                 "send");
        TP_CHECK_STATUS(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
        xfer_request_release(req);
    }
}

Test(progress, wait_sleeps_and_a_timed_out_request_stays_completable)
{
    tp_peer_t p;
    char buf[4096];
    xfer_request_t *req = NULL;
    double t0, c0, wall, cpu;
    xfer_status_t s;

    tp_start(&p, srv_late_sender, NULL);
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 99, ALL, buf, sizeof(buf), NULL, NULL, NULL,
                                      &req)));
    c0 = cpu_ms();
    t0 = tp_now_ms();
    s  = xfer_request_wait(req, 500);
    wall = tp_now_ms() - t0;
    cpu  = cpu_ms() - c0;
    cr_assert_eq(s, XFER_ERR_TIMEOUT, "%s", xfer_status_string(s));
    cr_expect_geq(wall, 480, "returned after %.0f ms of a 500 ms timeout", wall);
    cr_expect_lt(wall, 2500, "returned after %.0f ms of a 500 ms timeout", wall);
    cr_expect_lt(cpu, sleep_cpu_bound(wall, 0.2), "a 500 ms wait for nothing used %.0f ms of CPU in %.0f ms: it "
                 "spins instead of sleeping", cpu, wall);
    cr_assert_eq(xfer_request_test(req), XFER_INPROGRESS, "the timed-out request is pending");

    /* zero: an immediate answer */
    t0 = tp_now_ms();
    cr_assert_eq(xfer_request_wait(req, 0), XFER_ERR_TIMEOUT);
    cr_expect_lt(tp_now_ms() - t0, 100);

    /* and it completes later */
    tp_send(&p, 1);
    s = xfer_request_wait(req, TP_WAIT_MS);
    cr_assert_eq(s, XFER_OK, "%s", xfer_status_string(s));
    cr_assert_eq(xfer_request_length(req), sizeof(buf));
    cr_assert_eq(tp_check_pattern(buf, sizeof(buf), 1), -1);
    xfer_request_release(req);
    tp_send(&p, 0);
    tp_finish(&p);
}

Test(progress, wait_wakes_promptly_when_the_message_comes)
{
    tp_peer_t p;
    char buf[4096];
    xfer_request_t *req = NULL;
    double t0, c0, wall, cpu;
    xfer_status_t s;

    tp_start(&p, srv_late_sender, NULL);
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 99, ALL, buf, sizeof(buf), NULL, NULL, NULL,
                                      &req)));
    tp_send(&p, 400);
    c0   = cpu_ms();
    t0   = tp_now_ms();
    s    = xfer_request_wait(req, 10000);
    wall = tp_now_ms() - t0;
    cpu  = cpu_ms() - c0;
    cr_assert_eq(s, XFER_OK, "%s", xfer_status_string(s));
    cr_expect_geq(wall, 350, "completed after %.0f ms, before the peer sent", wall);
    cr_expect_lt(wall, 2000, "took %.0f ms to notice a message sent after 400 ms", wall);
    cr_expect_lt(cpu, sleep_cpu_bound(wall, 0.25), "%.0f ms of CPU in a %.0f ms wait", cpu, wall);
    cr_assert_eq(tp_check_pattern(buf, sizeof(buf), 400), -1);
    xfer_request_release(req);

    /* -1: no limit */
    req = NULL;
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 99, ALL, buf, sizeof(buf), NULL, NULL, NULL,
                                      &req)));
    tp_send(&p, 100);
    cr_assert_eq(xfer_request_wait(req, -1), XFER_OK);
    cr_assert_eq(tp_check_pattern(buf, sizeof(buf), 100), -1);
    xfer_request_release(req);
    tp_send(&p, 0);
    tp_finish(&p);
}

static void flag_cb(xfer_request_t *req, xfer_status_t status, void *arg)
{
    *(int*)arg += 1;
}

Test(progress, test_and_progress_drive_a_request_to_completion)
{
    tp_peer_t p;
    char buf[4096];
    xfer_request_t *req = NULL;
    unsigned long events = 0;
    int done = 0;
    double end;
    xfer_status_t s;

    tp_start(&p, srv_late_sender, NULL);
    /* xfer_request_test alone */
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 99, ALL, buf, sizeof(buf), NULL, NULL, NULL,
                                      &req)));
    cr_assert_eq(xfer_request_test(req), XFER_INPROGRESS);
    tp_send(&p, 10);
    end = tp_now_ms() + TP_WAIT_MS;
    do {
        s = xfer_request_test(req);
    } while ((s == XFER_INPROGRESS) && (tp_now_ms() < end));
    cr_assert_eq(s, XFER_OK, "%s", xfer_status_string(s));
    cr_expect_eq(xfer_request_test(req), XFER_OK, "a final status does not change");
    cr_assert_eq(tp_check_pattern(buf, sizeof(buf), 10), -1);
    xfer_request_release(req);

    /* xfer_progress alone, counting its events */
    req = NULL;
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 99, ALL, buf, sizeof(buf), NULL, flag_cb,
                                      &done, &req)));
    tp_send(&p, 11);
    end = tp_now_ms() + TP_WAIT_MS;
    while (!done && (tp_now_ms() < end)) {
        events += xfer_progress(p.ctx);
    }
    cr_assert_eq(done, 1);
    cr_expect_gt(events, 0, "xfer_progress completed a receive but reported no event");
    cr_assert_eq(xfer_request_test(req), XFER_OK);
    cr_assert_eq(tp_check_pattern(buf, sizeof(buf), 11), -1);
    xfer_request_release(req);
    tp_send(&p, 0);
    tp_finish(&p);
}

typedef struct reentry {
    xfer_request_t *other;
    xfer_status_t  wait_status;
    int            calls;
} reentry_t;

static void waiting_cb(xfer_request_t *req, xfer_status_t status, void *arg)
{
    reentry_t *r = arg;

    r->calls++;
    r->wait_status = xfer_request_wait(r->other, 10);
}

Test(progress, wait_from_a_callback_is_busy)
{
    tp_peer_t p;
    char buf[4096], other_buf[16];
    xfer_request_t *req = NULL;
    reentry_t r = {0};

    tp_start(&p, srv_late_sender, NULL);
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 12345, ALL, other_buf, sizeof(other_buf),
                                      NULL, NULL, NULL, &r.other)));
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 99, ALL, buf, sizeof(buf), NULL, waiting_cb,
                                      &r, &req)));
    tp_send(&p, 1);
    cr_assert_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
    cr_assert_eq(r.calls, 1);
    cr_expect_eq(r.wait_status, XFER_ERR_BUSY, "xfer_request_wait inside a callback: %s",
                 xfer_status_string(r.wait_status));
    cr_expect_eq(xfer_request_cancel(r.other), XFER_OK);
    cr_expect_eq(xfer_request_wait(r.other, TP_WAIT_MS), XFER_ERR_CANCELED);
    xfer_request_release(r.other);
    xfer_request_release(req);
    tp_send(&p, 0);
    tp_finish(&p);
}

/* XFER_CONTEXT_FLAG_SERIALIZED is the application's promise of one thread at a time; a
 * progress thread would break it, so both together are refused, whichever way it is asked. */
Test(progress, a_serialized_context_refuses_a_progress_thread, .init = cr_redirect_stderr)
{
    xfer_context_params_t both = {.size  = sizeof(both),
                                  .flags = XFER_CONTEXT_FLAG_SERIALIZED |
                                           XFER_CONTEXT_FLAG_PROGRESS_THREAD};
    xfer_context_params_t ser  = {.size = sizeof(ser), .flags = XFER_CONTEXT_FLAG_SERIALIZED};
    xfer_context_t *ctx = NULL;
    char *text;

    cr_expect_eq(xfer_context_create(&both, &ctx), XFER_ERR_INVALID_PARAM);
    cr_expect_null(ctx);
    setenv("XFER_PROGRESS_THREAD", "y", 1);
    cr_expect_eq(xfer_context_create(&ser, &ctx), XFER_ERR_INVALID_PARAM);
    cr_expect_null(ctx);
    unsetenv("XFER_PROGRESS_THREAD");
    cr_assert_eq(xfer_context_create(&ser, &ctx), XFER_OK);
    xfer_context_destroy(ctx);
    text = tu_read_redirected_stderr();
    cr_expect(strstr(text, "XFER_CONTEXT_FLAG_SERIALIZED with a progress thread "
                           "(XFER_CONTEXT_FLAG_PROGRESS_THREAD)") != NULL, "stderr: %s", text);
    cr_expect(strstr(text, "XFER_CONTEXT_FLAG_SERIALIZED with a progress thread "
                           "(XFER_PROGRESS_THREAD=y)") != NULL, "stderr: %s", text);
    free(text);
}

typedef struct repost {
    xfer_context_t  *ctx;
    xfer_endpoint_t *ep;
    char            buf[4096];
    xfer_request_t  *next;
    xfer_status_t   post_status;
    int             calls;
} repost_t;

static void repost_cb(xfer_request_t *req, xfer_status_t status, void *arg)
{
    repost_t *r = arg;

    r->calls++;
    r->post_status = xfer_tag_recv(r->ctx, r->ep, 99, ALL, r->buf, sizeof(r->buf), NULL, NULL,
                                   NULL, &r->next);
}

/* Without the lock (both sides serialized) a wait still sleeps rather than spins, wakes for
 * the message, and a callback may post the next operation from inside progress. */
Test(progress, a_serialized_context_sleeps_wakes_and_reposts_from_a_callback)
{
    tp_opts_t opts = {.ctx_flags = XFER_CONTEXT_FLAG_SERIALIZED};
    tp_peer_t p;
    char buf[4096];
    xfer_request_t *req = NULL;
    repost_t *r = calloc(1, sizeof(*r));
    double t0, c0, wall, cpu;

    cr_assert_not_null(r);
    tp_start_opts(&p, srv_late_sender, NULL, &opts, XFER_CONTEXT_FLAG_SERIALIZED);
    r->ctx = p.ctx;
    r->ep  = p.ep;
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 99, ALL, buf, sizeof(buf), NULL, repost_cb,
                                      r, &req)));
    c0 = cpu_ms();
    t0 = tp_now_ms();
    cr_assert_eq(xfer_request_wait(req, 300), XFER_ERR_TIMEOUT);
    wall = tp_now_ms() - t0;
    cpu  = cpu_ms() - c0;
    cr_expect_geq(wall, 280, "returned after %.0f ms of a 300 ms timeout", wall);
    cr_expect_lt(cpu, sleep_cpu_bound(wall, 0.2), "%.0f ms of CPU in a %.0f ms wait: it spins", cpu, wall);

    tp_send(&p, 200);
    cr_assert_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
    cr_assert_eq(tp_check_pattern(buf, sizeof(buf), 200), -1);
    cr_assert_eq(r->calls, 1);
    cr_assert(TP_POSTED(r->post_status), "a receive posted from the callback: %s",
              xfer_status_string(r->post_status));
    xfer_request_release(req);

    tp_send(&p, 3);
    cr_assert_eq(xfer_request_wait(r->next, TP_WAIT_MS), XFER_OK);
    cr_assert_eq(xfer_request_length(r->next), sizeof(r->buf));
    cr_assert_eq(tp_check_pattern(r->buf, sizeof(r->buf), 3), -1);
    xfer_request_release(r->next);
    tp_send(&p, 0);
    tp_finish(&p);
    free(r);
}

Test(progress, progress_on_an_idle_context_returns_quickly)
{
    xfer_context_t *ctx = tp_context(0);
    double t0           = tp_now_ms();
    unsigned events     = 0;

    for (int i = 0; i < 10000; i++) {
        events += xfer_progress(ctx);
    }
    cr_expect_eq(events, 0, "an idle context reported %u events", events);
    cr_expect_lt(tp_now_ms() - t0, 2000, "xfer_progress blocks on an idle context");
    xfer_context_destroy(ctx);
}

/* The client stays (progressing) until the server has accepted it: a client that left at
 * once could be gone before the server's side of the handshake looks at it (shm reads the
 * peer's memory to check cross-memory attach). */
static int client_stays(tp_side_t *s)
{
    uint64_t v;

    TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS) == 0, "no word from the server");
    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
    return 0;
}

Test(progress, listener_fd_is_readable_when_a_client_waits)
{
    xfer_context_t *ctx = tp_context(0);
    xfer_listener_t *l;
    xfer_endpoint_t *ep = NULL;
    struct pollfd pfd;
    char addr[64];
    tp_peer_t c;

    cr_assert_eq(xfer_listen(ctx, "127.0.0.1:0", &l), XFER_OK);
    pfd.fd     = xfer_listener_fd(l);
    pfd.events = POLLIN;
    cr_assert_geq(pfd.fd, 0);
    cr_expect_eq(poll(&pfd, 1, 100), 0, "readable with nobody connecting");
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", xfer_listener_port(l));
    tp_client_spawn(&c, addr, client_stays, NULL, NULL);
    cr_assert_eq(poll(&pfd, 1, TP_WAIT_MS), 1, "not readable with a client waiting");
    /* the handshake takes round trips: a poll loop moves it, one readable step at a time */
    for (double end = tp_now_ms() + TP_WAIT_MS; ep == NULL;) {
        xfer_status_t s = xfer_accept(l, 0, &ep);

        cr_assert(((s == XFER_OK) && (ep != NULL)) || (s == XFER_ERR_TIMEOUT), "%s",
                  xfer_status_string(s));
        cr_assert_lt(tp_now_ms(), end, "the handshake did not finish");
        if (ep == NULL) {
            cr_assert_eq(poll(&pfd, 1, TP_WAIT_MS), 1, "not readable while the client answers");
        }
    }
    cr_expect_str_eq(xfer_endpoint_transport(ep), tp_transport());
    tp_send(&c, 1);
    tp_child_expect_ok(&c, 30);
    xfer_endpoint_close(ep);
    xfer_listener_close(l);
    xfer_context_destroy(ctx);
}

Test(progress, destroy_stops_the_progress_thread_promptly)
{
    xfer_context_t *ctx = tp_context(XFER_CONTEXT_FLAG_PROGRESS_THREAD);
    double t0, cpu0;

    cpu0 = cpu_ms();
    usleep(300000);
    cr_expect_lt(cpu_ms() - cpu0, sleep_cpu_bound(300, 0.2), "an idle progress thread used %.0f ms of CPU in 300 ms",
                 cpu_ms() - cpu0);
    t0 = tp_now_ms();
    xfer_context_destroy(ctx);
    cr_expect_lt(tp_now_ms() - t0, 1000, "destroy took %.0f ms", tp_now_ms() - t0);
}

/* ---- the context's event fd ------------------------------------------------------------------ */

/* Progress until arm says nothing is pending (a transport may have events of its own to take
 * first: verbs' connection set-up completions); its last status. */
static xfer_status_t arm_when_idle(xfer_context_t *ctx)
{
    xfer_status_t st = XFER_ERR_BUSY;

    for (int i = 0; (i < 200) && (st == XFER_ERR_BUSY); i++) {
        xfer_progress(ctx);
        st = xfer_context_arm(ctx);
        if (st == XFER_ERR_BUSY) {
            usleep(1000);
        }
    }
    return st;
}

/* An application's loop: progress, arm, and poll the fd only when arm says nothing is pending.
 * Returns the polls that slept (found the fd readable after waiting) until req completed. */
static int event_loop_until(xfer_context_t *ctx, xfer_request_t *req, int timeout_ms)
{
    struct pollfd pfd = {xfer_context_event_fd(ctx), POLLIN, 0};
    double end = tp_now_ms() + timeout_ms;
    int slept = 0;

    cr_assert_geq(pfd.fd, 0);
    while (xfer_request_test(req) == XFER_INPROGRESS) {
        xfer_status_t st;

        cr_assert_lt(tp_now_ms(), end, "the request did not complete in %d ms", timeout_ms);
        xfer_progress(ctx);
        st = xfer_context_arm(ctx);
        cr_assert(st == XFER_OK || st == XFER_ERR_BUSY, "arm: %s", xfer_status_string(st));
        if (st == XFER_OK) {
            int n = poll(&pfd, 1, (int)(end - tp_now_ms()));

            cr_assert_eq(n, 1, "the fd never became readable (poll %d)", n);
            slept++;
        }
    }
    return slept;
}

Test(progress, the_event_fd_wakes_a_loop_for_input_and_stays_quiet_without)
{
    struct pollfd pfd;
    xfer_request_t *req = NULL;
    char buf[4096];
    double c0, t0, wall;
    tp_peer_t p;
    int slept;

    /* verbs and gdr probe idle channels: their timer wakes the fd every half keepalive (1 s
     * by default), by design; a quiet window of 300 ms must not meet one by chance */
    setenv("XFER_VERBS_KEEPALIVE", "10s", 1);
    setenv("XFER_GDR_KEEPALIVE", "10s", 1);
    tp_start(&p, srv_late_sender, NULL);
    cr_assert_eq(xfer_context_arm(p.ctx), XFER_ERR_INVALID_PARAM, "arm before the fd exists");
    pfd = (struct pollfd){xfer_context_event_fd(p.ctx), POLLIN, 0};
    cr_assert_geq(pfd.fd, 0);
    cr_assert_eq(xfer_context_event_fd(p.ctx), pfd.fd, "one fd per context");

    /* nothing posted, nothing coming: armed, the fd stays quiet and the loop sleeps */
    cr_assert_eq(arm_when_idle(p.ctx), XFER_OK);
    c0 = cpu_ms();
    t0 = tp_now_ms();
    cr_assert_eq(poll(&pfd, 1, 300), 0, "the fd is readable with nothing to do");
    wall = tp_now_ms() - t0;
    cr_expect_lt(cpu_ms() - c0, sleep_cpu_bound(wall, 0.2));

    /* a message sent 300 ms later wakes it, and the loop completes the receive */
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 99, ALL, buf, sizeof(buf), NULL, NULL, NULL,
                                      &req)));
    tp_send(&p, 300);
    t0    = tp_now_ms();
    slept = event_loop_until(p.ctx, req, TP_WAIT_MS);
    cr_assert_geq(slept, 1, "the loop never slept on the fd");
    cr_expect_geq(tp_now_ms() - t0, 250, "completed before the peer sent");
    cr_assert_eq(xfer_request_test(req), XFER_OK);
    cr_assert_eq(tp_check_pattern(buf, sizeof(buf), 300), -1);
    xfer_request_release(req);
    tp_send(&p, 0);
    tp_finish(&p);
}

/* Completions that need no fd event make arm say busy, so that the loop does not sleep on them:
 * a send completed in software (its callback not yet run), and work posted by another thread
 * while this one sleeps on the fd. */
static void *post_later(void *arg)
{
    tp_peer_t *p = arg;
    static char byte = 'x';

    usleep(200 * 1000);
    cr_assert(TP_POSTED(xfer_tag_send(p->ep, 5, &byte, 1, NULL, NULL, NULL, NULL)));
    return NULL;
}

static int srv_echo_one(tp_side_t *s)
{
    xfer_request_t *req = NULL;
    char c;

    TP_CHECK(TP_POSTED(xfer_tag_recv(s->ctx, s->ep, 5, ALL, &c, 1, NULL, NULL, NULL, &req)),
             "recv");
    TP_CHECK_STATUS(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
    xfer_request_release(req);
    req = NULL;
    for (int i = 0; i < 2; i++) {
        uint64_t v;

        req = NULL;
        TP_CHECK(TP_POSTED(xfer_tag_send(s->ep, 6, &c, 1, NULL, NULL, NULL, &req)), "send");
        TP_CHECK_STATUS(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
        xfer_request_release(req);
        TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS) == 0, "no word");
        TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
    }
    return 0;
}

Test(progress, arm_is_busy_while_work_is_pending_and_another_thread_wakes_the_fd)
{
    struct pollfd pfd;
    xfer_request_t *req = NULL;
    pthread_t th;
    char c = 0;
    int flag = 0;
    tp_peer_t p;

    tp_start(&p, srv_echo_one, NULL);
    pfd = (struct pollfd){xfer_context_event_fd(p.ctx), POLLIN, 0};
    /* a completion waiting for its callback: busy until progress delivers it */
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 6, ALL, &c, 1, NULL, flag_cb, &flag, &req)));
    cr_assert_eq(arm_when_idle(p.ctx), XFER_OK, "armed with nothing pending");
    /* another thread posts the send the child answers; the fd wakes this one */
    cr_assert_eq(pthread_create(&th, NULL, post_later, &p), 0);
    cr_assert_eq(poll(&pfd, 1, TP_WAIT_MS), 1, "a send posted by another thread did not wake "
                 "the fd");
    pthread_join(th, NULL);
    cr_assert_eq(event_loop_until(p.ctx, req, TP_WAIT_MS) >= 0, 1);
    cr_assert_eq(flag, 1, "the receive's callback ran %d times", flag);
    cr_assert_eq(c, 'x');
    xfer_request_release(req);

    /* the child sends again; once that message waits unexpected here, a receive posted for it
     * completes at once, its callback due at the next progress: arm says busy until then */
    tp_send(&p, 1);
    for (int i = 0; i < 10; i++) {
        usleep(50 * 1000 * (useconds_t)tp_slowdown());
        xfer_progress(p.ctx);
    }
    req = NULL;
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 6, ALL, &c, 1, NULL, flag_cb, &flag, &req)));
    cr_assert_eq(xfer_context_arm(p.ctx), XFER_ERR_BUSY, "armed with a callback due");
    xfer_progress(p.ctx);
    cr_assert_eq(flag, 2, "the callback did not run at the next progress");
    cr_assert_eq(arm_when_idle(p.ctx), XFER_OK);
    xfer_request_release(req);
    tp_send(&p, 0);
    tp_finish(&p);
}
