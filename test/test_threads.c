/*
 * One context shared by several threads: four threads ping-pong on their own tag ranges while
 * a fifth only calls xfer_progress(); the same with the library's progress thread
 * (XFER_PROGRESS_THREAD=y, and the context flag) where the threads only sleep on condition
 * variables their callbacks signal; several threads in xfer_request_wait() at once, on
 * different requests and on the same one; and callbacks serialised by the context's lock.
 * Every byte is verified; the suite's timeout turns a deadlock into a failure.
 */
#include "test_peer.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void setup(void)
{
    tp_env();
}

TestSuite(threads, .init = setup, .timeout = 180);

#define ALL      (~0ull)
#define NTHREADS 4
#define ITER     200

static size_t msg_size(int t, int i)
{
    return (i % 50 == 49) ? (256u << 10) : 1 + ((size_t)i * 131 + (size_t)t * 17) % 8192;
}

static uint64_t msg_tag(int t, int i)
{
    return ((uint64_t)(t + 1) << 32) | (uint64_t)i;
}

typedef struct worker {
    pthread_t       thread;
    int             index;
    xfer_context_t  *ctx;
    xfer_endpoint_t *ep;
    int             cond_wait;      /* wait on a condition variable, not with xfer calls */
    int             done;           /* round trips completed and verified */
    char            error[256];
    /* cond_wait mode */
    pthread_mutex_t lock;
    pthread_cond_t  cond;
    int             completions;
    xfer_status_t   last_status;
} worker_t;

static void worker_cb(xfer_request_t *req, xfer_status_t status, void *arg)
{
    worker_t *w = arg;

    pthread_mutex_lock(&w->lock);
    w->completions++;
    if (status != XFER_OK) {
        w->last_status = status;
    }
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->lock);
}

/* Wait until the worker's callbacks have counted `want` completions (cond_wait mode). */
static int worker_await(worker_t *w, int want)
{
    struct timespec ts;
    int rc = 0;

    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += TP_WAIT_MS / 1000;
    pthread_mutex_lock(&w->lock);
    while ((w->completions < want) && (rc == 0)) {
        rc = pthread_cond_timedwait(&w->cond, &w->lock, &ts);
    }
    pthread_mutex_unlock(&w->lock);
    return (w->completions >= want) ? 0 : -1;
}

static void *worker_main(void *arg)
{
    worker_t *w = arg;
    char *out   = malloc(256u << 10), *in = malloc(256u << 10);

    for (int i = 0; i < ITER; i++) {
        uint64_t tag  = msg_tag(w->index, i);
        size_t len    = msg_size(w->index, i);
        xfer_request_t *rreq = NULL, *sreq = NULL;
        xfer_status_t s;

        tp_fill_pattern(out, len, tag);
        memset(in, 0, len);
        s = xfer_tag_recv(w->ctx, w->ep, tag, ALL, in, len, NULL, worker_cb, w, &rreq);
        if (!TP_POSTED(s)) {
            snprintf(w->error, sizeof(w->error), "round %d: recv: %s", i, xfer_status_string(s));
            break;
        }
        s = xfer_tag_send(w->ep, tag, out, len, NULL, worker_cb, w, &sreq);
        if (!TP_POSTED(s)) {
            snprintf(w->error, sizeof(w->error), "round %d: send: %s", i, xfer_status_string(s));
            break;
        }
        if (w->cond_wait) {
            if (worker_await(w, 2 * (i + 1)) != 0) {
                snprintf(w->error, sizeof(w->error), "round %d: no completion in %d ms with "
                         "only the progress thread progressing", i, TP_WAIT_MS);
                break;
            }
            s = (w->last_status != XFER_OK) ? w->last_status : xfer_request_test(rreq);
        } else {
            s = xfer_request_wait(sreq, TP_WAIT_MS);
            if (s == XFER_OK) {
                s = xfer_request_wait(rreq, TP_WAIT_MS);
            }
        }
        if (s != XFER_OK) {
            snprintf(w->error, sizeof(w->error), "round %d (tag %#llx): %s", i,
                     (unsigned long long)tag, xfer_status_string(s));
            break;
        }
        if ((xfer_request_length(rreq) != len) || (xfer_request_tag(rreq) != tag) ||
            (tp_check_pattern(in, len, tag) != -1)) {
            snprintf(w->error, sizeof(w->error), "round %d: the echo of tag %#llx is wrong "
                     "(length %zu of %zu, tag %#llx)", i, (unsigned long long)tag,
                     xfer_request_length(rreq), len,
                     (unsigned long long)xfer_request_tag(rreq));
            break;
        }
        xfer_request_release(sreq);
        xfer_request_release(rreq);
        w->done++;
    }
    free(out);
    free(in);
    return NULL;
}

static volatile int progress_stop;

static void *progress_main(void *arg)
{
    unsigned long events = 0;

    while (!progress_stop) {
        events += xfer_progress(arg);
    }
    return (void*)events;
}

static void run_workers(uint32_t ctx_flags, int cond_wait, int progress_caller)
{
    static worker_t w[NTHREADS];
    pthread_t progress;
    tp_peer_t p;

    tp_start_opts(&p, tp_echo_server, NULL, NULL, ctx_flags);
    progress_stop = 0;
    if (progress_caller) {
        cr_assert_eq(pthread_create(&progress, NULL, progress_main, p.ctx), 0);
    }
    memset(w, 0, sizeof(w));
    for (int t = 0; t < NTHREADS; t++) {
        w[t].index     = t;
        w[t].ctx       = p.ctx;
        w[t].ep        = p.ep;
        w[t].cond_wait = cond_wait;
        pthread_mutex_init(&w[t].lock, NULL);
        pthread_cond_init(&w[t].cond, NULL);
        cr_assert_eq(pthread_create(&w[t].thread, NULL, worker_main, &w[t]), 0);
    }
    for (int t = 0; t < NTHREADS; t++) {
        pthread_join(w[t].thread, NULL);
    }
    progress_stop = 1;
    if (progress_caller) {
        pthread_join(progress, NULL);
    }
    for (int t = 0; t < NTHREADS; t++) {
        cr_expect_eq(w[t].error[0], '\0', "thread %d: %s", t, w[t].error);
        cr_expect_eq(w[t].done, ITER, "thread %d finished %d of %d round trips", t, w[t].done,
                     ITER);
    }
    tp_echo_stop(p.ep);
    tp_finish(&p);
}

Test(threads, four_threads_ping_pong_while_a_fifth_progresses)
{
    run_workers(0, 0, 1);
}

Test(threads, threads_only_sleep_with_xfer_progress_thread_env)
{
    setenv("XFER_PROGRESS_THREAD", "y", 1);
    run_workers(0, 1, 0);
}

Test(threads, threads_only_sleep_with_the_progress_thread_flag)
{
    run_workers(XFER_CONTEXT_FLAG_PROGRESS_THREAD, 1, 0);
}

Test(threads, waits_also_work_beside_the_progress_thread)
{
    run_workers(XFER_CONTEXT_FLAG_PROGRESS_THREAD, 0, 1);
}

/* ---- several waiters ------------------------------------------------------------------------- */

#define NWAIT 8

/* On word: send tags 1..NWAIT, 1000 * tag bytes each. */
static int srv_send_on_word(tp_side_t *s)
{
    xfer_request_t *reqs[NWAIT];
    char *bufs[NWAIT];
    uint64_t v;

    TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS) == 0, "no word");
    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
    for (int i = 0; i < NWAIT; i++) {
        size_t len = 1000 * (size_t)(i + 1);
        bufs[i] = malloc(len);
        tp_fill_pattern(bufs[i], len, (uint64_t)i + 1);
        reqs[i] = NULL;
        TP_CHECK(TP_POSTED(xfer_tag_send(s->ep, (uint64_t)i + 1, bufs[i], len, NULL, NULL, NULL,
                                         &reqs[i])), "send");
    }
    for (int i = 0; i < NWAIT; i++) {
        TP_CHECK_STATUS(xfer_request_wait(reqs[i], TP_WAIT_MS), XFER_OK);
        xfer_request_release(reqs[i]);
        free(bufs[i]);
    }
    TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS) == 0, "no word");
    return 0;
}

typedef struct waiter {
    pthread_t      thread;
    xfer_request_t *req;
    xfer_status_t  status;
    double         ms;
} waiter_t;

static void *waiter_main(void *arg)
{
    waiter_t *w = arg;
    double t0   = tp_now_ms();

    w->status = xfer_request_wait(w->req, TP_WAIT_MS);
    w->ms     = tp_now_ms() - t0;
    return NULL;
}

/* How many of this process's threads are called name (/proc/self/task/<tid>/comm); the last
 * one's id in *tid_p. */
static int threads_named(const char *name, long *tid_p)
{
    char           path[300], comm[32];
    int            n = 0;
    DIR           *dir = opendir("/proc/self/task");
    struct dirent *d;

    cr_assert_not_null(dir, "/proc/self/task: %s", strerror(errno));
    while ((d = readdir(dir)) != NULL) {
        if (d->d_name[0] == '.') {
            continue;
        }
        snprintf(path, sizeof(path), "/proc/self/task/%s/comm", d->d_name);
        FILE *f = fopen(path, "r");
        if (f == NULL) {
            continue;       /* the thread ended meanwhile */
        }
        if ((fgets(comm, sizeof(comm), f) != NULL) && (strcspn(comm, "\n") == strlen(name)) &&
            (strncmp(comm, name, strlen(name)) == 0)) {
            n++;
            *tid_p = strtol(d->d_name, NULL, 10);
        }
        fclose(f);
    }
    closedir(dir);
    return n;
}

/* The thread is told by its id, taken while it is the only one of that name. pthread_join()
 * returns once the thread has exited, a moment before the kernel removes its task entry (a
 * window that a slow guest stretches): the entry is given 5 s to go. */
Test(threads, the_progress_thread_is_named_and_ends_with_its_context)
{
    char path[64];
    long tid = 0;

    xfer_context_t *plain = tp_context(0);
    cr_assert_eq(threads_named("xfer-progress", &tid), 0,
                 "a context without the flag has no thread");
    xfer_context_t *ctx = tp_context(XFER_CONTEXT_FLAG_PROGRESS_THREAD);
    cr_assert_eq(threads_named("xfer-progress", &tid), 1);
    snprintf(path, sizeof(path), "/proc/self/task/%ld", tid);
    cr_assert_eq(access(path, F_OK), 0);
    xfer_context_destroy(ctx);
    for (int i = 0; (i < 500) && (access(path, F_OK) == 0); i++) {
        usleep(10000);
    }
    cr_assert_neq(access(path, F_OK), 0, "destroy joins the thread (%s is still there 5 s "
                  "later)", path);
    xfer_context_destroy(plain);
}

Test(threads, several_threads_wait_at_once)
{
    static char bufs[NWAIT][NWAIT * 1000];
    xfer_request_t *reqs[NWAIT];
    waiter_t w[NWAIT + 3];
    tp_peer_t p;

    tp_start(&p, srv_send_on_word, NULL);
    for (int i = 0; i < NWAIT; i++) {
        cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, (uint64_t)i + 1, ALL, bufs[i],
                                          sizeof(bufs[i]), NULL, NULL, NULL, &reqs[i])));
    }
    /* one waiter per request, and three more on the first one */
    for (int i = 0; i < NWAIT + 3; i++) {
        w[i].req = reqs[(i < NWAIT) ? i : 0];
        cr_assert_eq(pthread_create(&w[i].thread, NULL, waiter_main, &w[i]), 0);
    }
    usleep(200000);
    tp_send(&p, 1);
    for (int i = 0; i < NWAIT + 3; i++) {
        pthread_join(w[i].thread, NULL);
        cr_expect_eq(w[i].status, XFER_OK, "waiter %d: %s after %.0f ms", i,
                     xfer_status_string(w[i].status), w[i].ms);
    }
    for (int i = 0; i < NWAIT; i++) {
        cr_expect_eq(xfer_request_length(reqs[i]), 1000 * (size_t)(i + 1));
        cr_expect_eq(tp_check_pattern(bufs[i], 1000 * (size_t)(i + 1), (uint64_t)i + 1), -1,
                     "message %d", i + 1);
        xfer_request_release(reqs[i]);
    }
    tp_send(&p, 0);
    tp_finish(&p);
}

/* ---- callbacks are serialised ---------------------------------------------------------------- */

#define NSER 1000

static int srv_burst(tp_side_t *s)
{
    static xfer_request_t *reqs[NSER];
    uint64_t payload[4];
    uint64_t v;

    TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS) == 0, "no word");
    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
    memset(payload, 0x3c, sizeof(payload));
    for (int i = 0; i < NSER; i++) {
        reqs[i] = NULL;
        TP_CHECK(TP_POSTED(xfer_tag_send(s->ep, 500, payload, sizeof(payload), NULL, NULL, NULL,
                                         &reqs[i])), "send");
    }
    for (int i = 0; i < NSER; i++) {
        TP_CHECK_STATUS(xfer_request_wait(reqs[i], TP_WAIT_MS), XFER_OK);
        xfer_request_release(reqs[i]);
    }
    TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS) == 0, "no word");
    return 0;
}

static int plain_counter;           /* deliberately not atomic: the context's lock guards it */
static int inside_cb;
static int overlaps;

static void serial_cb(xfer_request_t *req, xfer_status_t status, void *arg)
{
    if (inside_cb++) {
        overlaps++;
    }
    for (volatile int spin = 0; spin < 200; spin++) {
    }
    plain_counter += (status == XFER_OK);
    inside_cb--;
}

Test(threads, callbacks_run_one_at_a_time_under_the_context_lock)
{
    static uint64_t bufs[NSER][4];
    pthread_t progress[NTHREADS];
    tp_peer_t p;
    double end;

    tp_start(&p, srv_burst, NULL);
    plain_counter = inside_cb = overlaps = 0;
    for (int i = 0; i < NSER; i++) {
        cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 500, ALL, bufs[i], sizeof(bufs[i]), NULL,
                                          serial_cb, NULL, NULL)));
    }
    progress_stop = 0;
    for (int t = 0; t < NTHREADS; t++) {
        cr_assert_eq(pthread_create(&progress[t], NULL, progress_main, p.ctx), 0);
    }
    tp_send(&p, 1);
    end = tp_now_ms() + TP_WAIT_MS;
    while ((__atomic_load_n(&plain_counter, __ATOMIC_RELAXED) < NSER) && (tp_now_ms() < end)) {
        usleep(1000);
    }
    usleep(50000);
    progress_stop = 1;
    for (int t = 0; t < NTHREADS; t++) {
        pthread_join(progress[t], NULL);
    }
    cr_expect_eq(overlaps, 0, "%d callbacks ran while another was running", overlaps);
    cr_expect_eq(plain_counter, NSER, "%d of %d completions counted", plain_counter, NSER);
    for (int i = 0; i < NSER; i++) {
        for (int j = 0; j < 4; j++) {
            cr_assert_eq(bufs[i][j], 0x3c3c3c3c3c3c3c3cull, "message %d", i);
        }
    }
    tp_send(&p, 0);
    tp_finish(&p);
}
