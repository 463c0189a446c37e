/*
 * scale_probe: what many endpoints cost one process (bench_scale.sh runs it).
 *
 *   scale_probe -p PORT -n N [-x TRANSPORTS]            server: accept N endpoints, echo on
 *                                                       the first until told to stop
 *   scale_probe -p PORT -n N [-x TRANSPORTS] HOST       client: connect N endpoints, measure
 *
 * The client connects N endpoints in one burst, then measures with N - 1 of them idle: the
 * connect time per endpoint; resident memory and descriptors per endpoint (before and after,
 * over N); an empty xfer_progress() (the mean of many calls, after the idle endpoints had
 * time to go quiet); how many endpoints lack a lane they agreed on (tcp's lanes_up counter);
 * and the 8-byte round trip of the first endpoint, polled (both sides
 * spin on xfer_request_test), polled with the answers received from any peer, and sleeping (both sides in xfer_request_wait, asleep on the
 * transports' fds): the median of its iterations. One JSON object on stdout.
 *
 * The tag of each ping tells the server how to wait for the next one (1 poll, 2 sleep), so
 * that both sides wait alike. A tool, not a test.
 */
#include <xfer/xfer.h>

#include <dirent.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#define TAG_POLL  1ull
#define TAG_SLEEP 2ull
#define TAG_STOP  3ull
#define WAIT_MS   60000

static double now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static long rss_kib(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kib = -1;

    if (f == NULL) {
        return -1;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        if (sscanf(line, "VmRSS: %ld kB", &kib) == 1) {
            break;
        }
    }
    fclose(f);
    return kib;
}

static long fds_open(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    long n = 0;

    if (d == NULL) {
        return -1;
    }
    while ((e = readdir(d)) != NULL) {
        n += (e->d_name[0] != '.');
    }
    closedir(d);
    return n - 1;   /* the directory's own */
}

static void raise_nofile(void)
{
    struct rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rl.rlim_cur = rl.rlim_max;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
    }
}

/* Endpoints of eps[0, n) with fewer lanes up than they agreed on (their "lanes" and
 * "lanes_up" counters; 0 where the transport has no lanes). */
static int lanes_missing(xfer_endpoint_t **eps, int n)
{
    int missing = 0;

    for (int i = 0; i < n; i++) {
        xfer_counter_t c[64];
        size_t count = 64;
        int64_t want = -1, up = -1;

        if (xfer_endpoint_counters(eps[i], c, &count) != XFER_OK) {
            continue;
        }
        for (size_t k = 0; (k < count) && (k < 64); k++) {
            if (strcmp(c[k].name, "lanes") == 0) {
                want = (int64_t)c[k].value;
            } else if (strcmp(c[k].name, "lanes_up") == 0) {
                up = (int64_t)c[k].value;
            }
        }
        missing += (want >= 0) && (up != want);
    }
    return missing;
}

/* Wait for req: spinning on xfer_request_test, or asleep in xfer_request_wait. */
static xfer_status_t wait_req(xfer_context_t *ctx, xfer_request_t *req, int sleep)
{
    xfer_status_t status;

    if (sleep) {
        return xfer_request_wait(req, WAIT_MS);
    }
    while ((status = xfer_request_test(req)) == XFER_INPROGRESS) {
        (void)xfer_progress(ctx);
    }
    return status;
}

static int die(const char *what, xfer_status_t status)
{
    fprintf(stderr, "scale_probe: %s: %s\n", what, xfer_status_string(status));
    return 1;
}

static int serve(xfer_context_t *ctx, const char *port, int n)
{
    char addr[64];
    xfer_listener_t *l;
    xfer_endpoint_t **eps = calloc((size_t)n, sizeof(*eps));
    uint64_t buf = 0, tag = TAG_POLL;
    xfer_status_t status;

    snprintf(addr, sizeof(addr), "127.0.0.1:%s", port);
    status = (eps == NULL) ? XFER_ERR_NO_MEMORY : xfer_listen(ctx, addr, &l);
    if (status != XFER_OK) {
        return die("listen", status);
    }
    for (int i = 0; i < n; i++) {
        status = xfer_accept(l, WAIT_MS, &eps[i]);
        if (status != XFER_OK) {
            return die("accept", status);
        }
    }
    for (;;) {
        xfer_request_t *rreq = NULL, *sreq = NULL;
        int sleep = (tag == TAG_SLEEP);
        size_t len;

        status = xfer_tag_recv(ctx, eps[0], 0, 0, &buf, sizeof(buf), NULL, NULL, NULL, &rreq);
        if (status == XFER_OK) {
            status = wait_req(ctx, rreq, sleep);
        }
        if (status != XFER_OK) {
            return die("receive", status);
        }
        tag = xfer_request_tag(rreq);
        len = xfer_request_length(rreq);
        xfer_request_release(rreq);
        if (tag == TAG_STOP) {
            break;
        }
        status = xfer_tag_send(eps[0], tag, &buf, len, NULL, NULL, NULL, &sreq);
        if (status == XFER_OK) {
            status = wait_req(ctx, sreq, sleep);
            xfer_request_release(sreq);
        }
        if (status != XFER_OK) {
            return die("send", status);
        }
    }
    for (int i = 0; i < n; i++) {
        xfer_endpoint_close(eps[i]);
    }
    xfer_listener_close(l);
    free(eps);
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double*)a, y = *(const double*)b;

    return (x > y) - (x < y);
}

/* The median round trip of iters pings on ep tagged tag, in microseconds; the answers are
 * received from any peer when any is set. */
static double round_trips(xfer_context_t *ctx, xfer_endpoint_t *ep, uint64_t tag, int iters,
                          int any, xfer_status_t *status_p)
{
    double *t = malloc((size_t)iters * sizeof(*t)), median;
    uint64_t out = 42, in = 0;

    *status_p = (t == NULL) ? XFER_ERR_NO_MEMORY : XFER_OK;
    for (int i = 0; (i < iters) && (*status_p == XFER_OK); i++) {
        xfer_request_t *rreq = NULL, *sreq = NULL;
        double t0 = now_ns();

        *status_p = xfer_tag_recv(ctx, any ? NULL : ep, 0, 0, &in, sizeof(in), NULL, NULL,
                                  NULL, &rreq);
        if (*status_p != XFER_OK) {
            break;
        }
        *status_p = xfer_tag_send(ep, tag, &out, sizeof(out), NULL, NULL, NULL, &sreq);
        if (*status_p == XFER_OK) {
            *status_p = wait_req(ctx, sreq, tag == TAG_SLEEP);
            xfer_request_release(sreq);
        }
        if (*status_p == XFER_OK) {
            *status_p = wait_req(ctx, rreq, tag == TAG_SLEEP);
        }
        xfer_request_release(rreq);
        t[i] = (now_ns() - t0) / 1e3;
    }
    if (*status_p != XFER_OK) {
        free(t);
        return 0;
    }
    qsort(t, (size_t)iters, sizeof(*t), cmp_double);
    median = t[iters / 2];
    free(t);
    return median;
}

static int probe(xfer_context_t *ctx, const char *host, const char *port, int n)
{
    xfer_endpoint_t **eps = calloc((size_t)n, sizeof(*eps));
    double t0, connect_s, progress_ns, rt_poll, rt_any, rt_sleep;
    long rss0 = rss_kib(), fds0 = fds_open(), rss1, fds1;
    const int calls = 200000;
    char addr[300];
    xfer_request_t *req = NULL;
    xfer_status_t status;
    uint64_t stop = 0;
    int missing;

    snprintf(addr, sizeof(addr), "%s:%s", host, port);
    if (eps == NULL) {
        return die("calloc", XFER_ERR_NO_MEMORY);
    }
    t0 = now_ns();
    for (int i = 0; i < n; i++) {
        status = xfer_connect(ctx, addr, &eps[i]);
        if (status != XFER_OK) {
            fprintf(stderr, "scale_probe: endpoint %d of %d: ", i, n);
            return die("connect", status);
        }
    }
    connect_s = (now_ns() - t0) / 1e9;
    rss1      = rss_kib();
    fds1      = fds_open();
    /* the idle endpoints settle (a transport may watch a new one for a while) */
    for (int i = 0; i < 5000; i++) {
        (void)xfer_progress(ctx);
    }
    t0 = now_ns();
    for (int i = 0; i < calls; i++) {
        (void)xfer_progress(ctx);
    }
    progress_ns = (now_ns() - t0) / calls;
    missing     = lanes_missing(eps, n);
    rt_poll     = round_trips(ctx, eps[0], TAG_POLL, 20000, 0, &status);
    if (status != XFER_OK) {
        return die("polled round trips", status);
    }
    rt_any = round_trips(ctx, eps[0], TAG_POLL, 20000, 1, &status);
    if (status != XFER_OK) {
        return die("polled round trips, answers from any peer", status);
    }
    rt_sleep = round_trips(ctx, eps[0], TAG_SLEEP, 2000, 0, &status);
    if (status != XFER_OK) {
        return die("sleeping round trips", status);
    }
    status = xfer_tag_send(eps[0], TAG_STOP, &stop, sizeof(stop), NULL, NULL, NULL, &req);
    if (status == XFER_OK) {
        status = xfer_request_wait(req, WAIT_MS);
        xfer_request_release(req);
    }
    printf("{\"transport\":\"%s\",\"endpoints\":%d,\"connect_s\":%.4f,"
           "\"connect_us_per_ep\":%.1f,\"rss_kib_per_ep\":%.2f,\"fds_per_ep\":%.2f,"
           "\"lanes_missing\":%d,\"progress_ns\":%.1f,\"rt_poll_us\":%.3f,"
           "\"rt_any_us\":%.3f,\"rt_sleep_us\":%.3f}\n",
           xfer_endpoint_transport(eps[0]), n, connect_s, connect_s * 1e6 / n,
           (double)(rss1 - rss0) / n, (double)(fds1 - fds0) / n, missing, progress_ns,
           rt_poll, rt_any, rt_sleep);
    for (int i = 0; i < n; i++) {
        xfer_endpoint_close(eps[i]);
    }
    free(eps);
    return (status == XFER_OK) ? 0 : die("stop", status);
}

int main(int argc, char **argv)
{
    xfer_context_params_t params = {.size  = sizeof(params),
                                    .flags = XFER_CONTEXT_FLAG_SERIALIZED};
    const char *port = "19900";
    xfer_context_t *ctx;
    xfer_status_t status;
    int n = 1, c, rc;

    while ((c = getopt(argc, argv, "p:n:x:h")) != -1) {
        switch (c) {
        case 'p': port = optarg; break;
        case 'n': n = atoi(optarg); break;
        case 'x': setenv("XFER_TRANSPORTS", optarg, 1); break;
        default:
            fprintf(stderr, "usage: scale_probe -p PORT -n N [-x TRANSPORTS] [HOST]\n");
            return (c == 'h') ? 0 : 2;
        }
    }
    if ((n < 1) || (n > 100000)) {
        fprintf(stderr, "scale_probe: -n %d: 1 to 100000 endpoints\n", n);
        return 2;
    }
    raise_nofile();
    status = xfer_context_create(&params, &ctx);
    if (status != XFER_OK) {
        return die("context", status);
    }
    rc = (optind < argc) ? probe(ctx, argv[optind], port, n) : serve(ctx, port, n);
    xfer_context_destroy(ctx);
    return rc;
}
