#include "test_peer.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int tp_slowdown(void)
{
    /* valgrind, or the emulated Soft-RoCE guest (contrib/rxe_guest exports RXE_GUEST) */
    return ((getenv("XFERTEST_VALGRIND") != NULL) || (getenv("RXE_GUEST") != NULL)) ? 3 : 1;
}

const char *tp_transport(void)
{
    const char *t = getenv("XFERTEST_TRANSPORT");

    return ((t != NULL) && (*t != '\0')) ? t : "tcp";
}

void tp_env(void)
{
    setenv("XFER_TRANSPORTS", tp_transport(), 1);
    setenv("XFER_BOOTSTRAP_TIMEOUT", "5s", 1);
    /* the build's components, unless a suite names its own (XFERTEST_COMPONENT_PATH) */
    if (getenv("XFERTEST_COMPONENT_PATH") != NULL) {
        setenv("XFER_COMPONENT_PATH", getenv("XFERTEST_COMPONENT_PATH"), 1);
    } else {
        unsetenv("XFER_COMPONENT_PATH");
    }
    unsetenv("XFER_PROGRESS_THREAD");
}

/* XFERTEST_SERIALIZED=1 (test/serialized.sh): every context a scenario makes without a
 * progress thread is a serialized one, without the lock, so the single-threaded suites run the
 * data path in both thread modes. */
static xfer_status_t context_create(uint32_t flags, xfer_context_t **ctx_p)
{
    const char *serialized = getenv("XFERTEST_SERIALIZED");
    xfer_context_params_t params;

    if ((serialized != NULL) && (strcmp(serialized, "1") == 0) &&
        !(flags & XFER_CONTEXT_FLAG_PROGRESS_THREAD) && (getenv("XFER_PROGRESS_THREAD") == NULL)) {
        flags |= XFER_CONTEXT_FLAG_SERIALIZED;
    }
    params = (xfer_context_params_t){.size = sizeof(params), .flags = flags};

    return xfer_context_create(&params, ctx_p);
}

xfer_context_t *tp_context(uint32_t flags)
{
    xfer_context_t *ctx = NULL;
    xfer_status_t status;

    status = context_create(flags, &ctx);
    cr_assert_eq(status, XFER_OK, "xfer_context_create under XFER_TRANSPORTS=%s: %s",
                 tp_transport(), xfer_status_string(status));
    return ctx;
}

double tp_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- control channel ------------------------------------------------------------------------- */

int tp_ctl_ready(int fd, int timeout_ms)
{
    struct pollfd pfd = {fd, POLLIN, 0};
    int n;

    do {
        n = poll(&pfd, 1, timeout_ms);
    } while ((n < 0) && (errno == EINTR));
    return n > 0;
}

static int write_all(int fd, const void *buf, size_t len)
{
    const char *p = buf;

    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            return -1;
        }
        p   += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Read len bytes by deadline; on failure say why on stderr when waited was non-zero (a zero
 * timeout is a poll whose failure is expected). */
static int read_all(int fd, void *buf, size_t len, double deadline, int waited)
{
    char *p = buf;

    while (len > 0) {
        int left = (int)(deadline - tp_now_ms());
        ssize_t n;

        if ((left <= 0) || !tp_ctl_ready(fd, left)) {
            if (waited > 0) {
                fprintf(stderr, "[process %d] control channel: nothing came within %d ms\n",
                        (int)getpid(), waited);
            }
            return -1;
        }
        n = read(fd, p, len);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            fprintf(stderr, "[process %d] control channel: read: %s\n", (int)getpid(),
                    strerror(errno));
            return -1;
        }
        if (n == 0) {
            if (waited > 0) {
                fprintf(stderr, "[process %d] control channel: the other side closed it\n",
                        (int)getpid());
            }
            return -1;
        }
        p   += n;
        len -= (size_t)n;
    }
    return 0;
}

/* One send for header and body: a peer that exits as soon as it sees the header must not
 * turn the rest of our write into EPIPE. */
int tp_ctl_send(int fd, const void *buf, size_t len)
{
    uint64_t hdr = len;
    char *msg    = malloc(sizeof(hdr) + len);
    int rc;

    if (msg == NULL) {
        return -1;
    }
    memcpy(msg, &hdr, sizeof(hdr));
    if (len > 0) {
        memcpy(msg + sizeof(hdr), buf, len);
    }
    rc = write_all(fd, msg, sizeof(hdr) + len);
    free(msg);
    return rc;
}

int tp_ctl_recv_alloc(int fd, void **buf_p, size_t *len_p, int timeout_ms)
{
    double deadline = tp_now_ms() + timeout_ms;
    uint64_t hdr;
    void *buf;

    if ((read_all(fd, &hdr, sizeof(hdr), deadline, timeout_ms) != 0) || (hdr > (1ull << 32))) {
        return -1;
    }
    buf = malloc(hdr + 1);
    if ((buf == NULL) || ((hdr > 0) && (read_all(fd, buf, hdr, deadline, timeout_ms) != 0))) {
        free(buf);
        return -1;
    }
    *buf_p = buf;
    *len_p = hdr;
    return 0;
}

int tp_ctl_recv(int fd, void *buf, size_t cap, size_t *len_p, int timeout_ms)
{
    void *msg;
    size_t len;

    if (tp_ctl_recv_alloc(fd, &msg, &len, timeout_ms) != 0) {
        return -1;
    }
    if (len > cap) {
        free(msg);
        return -1;
    }
    memcpy(buf, msg, len);
    free(msg);
    if (len_p != NULL) {
        *len_p = len;
    }
    return 0;
}

int tp_ctl_send_u64(int fd, uint64_t v)
{
    return tp_ctl_send(fd, &v, sizeof(v));
}

int tp_ctl_recv_u64(int fd, uint64_t *v_p, int timeout_ms)
{
    size_t len;

    if ((tp_ctl_recv(fd, v_p, sizeof(*v_p), &len, timeout_ms) != 0) || (len != sizeof(*v_p))) {
        return -1;
    }
    return 0;
}

/* ---- the child ------------------------------------------------------------------------------- */

/* When this process began as a peer (tp_now_ms), for the time its failure line gives. */
static double child_began_ms;

void tp_child_fail(const char *file, int line, const char *what, const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "[peer process %d, %.1f s in] %s:%d: %s: ", (int)getpid(),
            (tp_now_ms() - child_began_ms) / 1000.0, file, line, what);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    fflush(stderr);
    _exit(1);
}

void tp_progress_for(xfer_context_t *ctx, int ms)
{
    double end = tp_now_ms() + ms;

    while (tp_now_ms() < end) {
        if (xfer_progress(ctx) == 0) {
            usleep(200);
        }
    }
}

int tp_progress_until_ctl(tp_side_t *side, int timeout_ms)
{
    double end    = tp_now_ms() + timeout_ms;
    unsigned idle = 0;

    while (tp_now_ms() < end) {
        if (tp_ctl_ready(side->ctl, (idle > 64) ? 1 : 0)) {
            return 0;
        }
        idle = (xfer_progress(side->ctx) == 0) ? idle + 1 : 0;
    }
    return -1;
}

/* Keep only stdio and the control channel: descriptors inherited from the parent (its xfer
 * sockets, Criterion's pipes) must not keep the parent's connections alive in the child. */
static int child_isolate(int ctl)
{
    if (ctl != 3) {
        if (dup2(ctl, 3) < 0) {
            return -1;
        }
    }
    if (close_range(4, ~0u, 0) != 0) {
        for (int fd = 4; fd < 4096; fd++) {
            close(fd);
        }
    }
    return 3;
}

/* The transport a child's connection must agree on: the one it is allowed, when its options
 * name one; else the suite's. */
static const char *child_transport(const tp_opts_t *o)
{
    const char *t = o->transports;

    if ((t != NULL) && (*t != '\0') && (*t != '^') && (strchr(t, ',') == NULL) &&
        (strcmp(t, "all") != 0)) {
        return t;
    }
    return tp_transport();
}

static void child_main(int ctl, int is_server, const char *address, tp_scenario_t fn, void *arg,
                       const tp_opts_t *opts)
{
    tp_opts_t o      = {0};
    tp_side_t side   = {0};
    xfer_status_t status;
    int rc, accepts;

    if (opts != NULL) {
        o = *opts;
    }
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    alarm(TP_CHILD_ALARM_S);
    side.ctl   = child_isolate(ctl);
    side.index = o.index;
    side.arg   = arg;
    TP_CHECK(side.ctl >= 0, "cannot set up the control channel");
    if (o.transports != NULL) {
        setenv("XFER_TRANSPORTS", o.transports, 1);
    }
    if (o.component_path != NULL) {
        setenv("XFER_COMPONENT_PATH", o.component_path, 1);
    }
    TP_CHECK_STATUS(context_create(o.ctx_flags, &side.ctx), XFER_OK);

    if (is_server) {
        TP_CHECK_STATUS(xfer_listen(side.ctx, "127.0.0.1:0", &side.listener), XFER_OK);
        TP_CHECK(tp_ctl_send_u64(side.ctl, xfer_listener_port(side.listener)) == 0, "port");
        accepts = (o.accepts == 0) ? 1 : ((o.accepts < 0) ? 0 : o.accepts);
        for (int i = 0; i < accepts; i++) {
            xfer_endpoint_t *ep = NULL;
            TP_CHECK_STATUS(xfer_accept(side.listener, TP_WAIT_MS, &ep), XFER_OK);
            TP_CHECK(strcmp(xfer_endpoint_transport(ep), child_transport(&o)) == 0,
                     "server negotiated '%s', expected '%s'", xfer_endpoint_transport(ep),
                     child_transport(&o));
            if (side.ep == NULL) {
                side.ep = ep;
            }
        }
    } else {
        status = xfer_connect(side.ctx, address, &side.ep);
        TP_CHECK(status == (xfer_status_t)o.expect_connect, "connect returned %s, expected %s",
                 xfer_status_string(status), xfer_status_string(o.expect_connect));
        if (status == XFER_OK) {
            TP_CHECK(strcmp(xfer_endpoint_transport(side.ep), child_transport(&o)) == 0,
                     "client negotiated '%s', expected '%s'",
                     xfer_endpoint_transport(side.ep), child_transport(&o));
        }
    }

    rc = (fn != NULL) ? fn(&side) : 0;
    if (side.ep != NULL) {
        xfer_endpoint_close(side.ep);
    }
    if (side.listener != NULL) {
        xfer_listener_close(side.listener);
    }
    if (side.ctx != NULL) {
        xfer_context_destroy(side.ctx);
    }
    _exit(rc);
}

/* ---- the parent ------------------------------------------------------------------------------ */

static pid_t spawn(tp_peer_t *peer, int is_server, const char *address, tp_scenario_t fn,
                   void *arg, const tp_opts_t *opts)
{
    int sv[2];
    pid_t pid;

    memset(peer, 0, sizeof(*peer));
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        child_began_ms = tp_now_ms();
        close(sv[0]);
        child_main(sv[1], is_server, address, fn, arg, opts);
    }
    close(sv[1]);
    peer->pid = pid;
    peer->ctl = sv[0];
    return pid;
}

void tp_server_spawn(tp_peer_t *peer, tp_scenario_t fn, void *arg, const tp_opts_t *opts)
{
    uint64_t port;

    spawn(peer, 1, NULL, fn, arg, opts);
    port = tp_recv(peer);
    cr_assert(port > 0 && port < 65536, "server child sent port %llu", (unsigned long long)port);
    snprintf(peer->address, sizeof(peer->address), "127.0.0.1:%u", (unsigned)port);
}

void tp_client_spawn(tp_peer_t *peer, const char *address, tp_scenario_t fn, void *arg,
                     const tp_opts_t *opts)
{
    spawn(peer, 0, address, fn, arg, opts);
    snprintf(peer->address, sizeof(peer->address), "%s", address);
}

xfer_endpoint_t *tp_connect(xfer_context_t *ctx, const tp_peer_t *peer)
{
    xfer_endpoint_t *ep = NULL;
    xfer_status_t status;

    status = xfer_connect(ctx, peer->address, &ep);
    cr_assert_eq(status, XFER_OK, "xfer_connect(%s): %s", peer->address,
                 xfer_status_string(status));
    cr_assert_not_null(ep);
    cr_assert_str_eq(xfer_endpoint_transport(ep), tp_transport(),
                     "negotiated '%s' under XFER_TRANSPORTS=%s", xfer_endpoint_transport(ep),
                     tp_transport());
    cr_assert_eq(xfer_endpoint_status(ep), XFER_OK);
    return ep;
}

void tp_start_opts(tp_peer_t *peer, tp_scenario_t fn, void *arg, const tp_opts_t *opts,
                   uint32_t ctx_flags)
{
    tp_server_spawn(peer, fn, arg, opts);
    peer->ctx = tp_context(ctx_flags);
    peer->ep  = tp_connect(peer->ctx, peer);
}

void tp_start(tp_peer_t *peer, tp_scenario_t fn, void *arg)
{
    tp_start_opts(peer, fn, arg, NULL, 0);
}

int tp_child_wait(tp_peer_t *peer, int timeout_s)
{
    double end = tp_now_ms() + timeout_s * 1000.0;
    int st;

    if (peer->pid <= 0) {
        return -2;
    }
    for (;;) {
        pid_t r = waitpid(peer->pid, &st, WNOHANG);
        if (r == peer->pid) {
            break;
        }
        if ((r < 0) && (errno != EINTR)) {
            return -2;
        }
        if (tp_now_ms() > end) {
            kill(peer->pid, SIGKILL);
            waitpid(peer->pid, &st, 0);
            peer->pid = 0;
            return -1;
        }
        usleep(5000);
    }
    peer->pid = 0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static const char *fate(int rc, char *buf, size_t size)
{
    if (rc == -1) {
        snprintf(buf, size, "did not exit in time and was killed");
    } else if (rc == 128 + SIGALRM) {
        snprintf(buf, size, "hung and was killed by its alarm");
    } else if (rc > 128) {
        snprintf(buf, size, "died of signal %d (%s)", rc - 128, strsignal(rc - 128));
    } else {
        snprintf(buf, size, "exited with %d (its reason is on stderr)", rc);
    }
    return buf;
}

void tp_child_expect_ok(tp_peer_t *peer, int timeout_s)
{
    char buf[128];
    int rc = tp_child_wait(peer, timeout_s);

    if (peer->ctl > 0) {
        close(peer->ctl);
        peer->ctl = -1;
    }
    cr_assert_eq(rc, 0, "the peer process %s", fate(rc, buf, sizeof(buf)));
}

void tp_finish(tp_peer_t *peer)
{
    if (peer->ep != NULL) {
        xfer_endpoint_close(peer->ep);
        peer->ep = NULL;
    }
    if (peer->ctx != NULL) {
        xfer_context_destroy(peer->ctx);
        peer->ctx = NULL;
    }
    tp_child_expect_ok(peer, 30);
}

static void ctl_failed(tp_peer_t *peer, const char *what)
{
    char buf[128];
    int rc = tp_child_wait(peer, 2);

    cr_assert_fail("control channel: %s failed; the peer process %s", what,
                   (rc == -1) ? "is stuck" : fate(rc, buf, sizeof(buf)));
}

void tp_send(tp_peer_t *peer, uint64_t v)
{
    if (tp_ctl_send_u64(peer->ctl, v) != 0) {
        ctl_failed(peer, "send");
    }
}

uint64_t tp_recv(tp_peer_t *peer)
{
    return tp_recv_within(peer, TP_WAIT_MS);
}

uint64_t tp_recv_within(tp_peer_t *peer, int timeout_ms)
{
    uint64_t v = 0;

    if (tp_ctl_recv_u64(peer->ctl, &v, timeout_ms) != 0) {
        ctl_failed(peer, "receive");
    }
    return v;
}

void tp_send_blob(tp_peer_t *peer, const void *buf, size_t len)
{
    if (tp_ctl_send(peer->ctl, buf, len) != 0) {
        ctl_failed(peer, "send");
    }
}

void *tp_recv_blob(tp_peer_t *peer, size_t *len_p)
{
    void *buf = NULL;

    if (tp_ctl_recv_alloc(peer->ctl, &buf, len_p, TP_WAIT_MS) != 0) {
        ctl_failed(peer, "receive");
    }
    return buf;
}

/* ---- requests -------------------------------------------------------------------------------- */

void tp_calls_cb(xfer_request_t *req, xfer_status_t status, void *arg)
{
    tp_calls_t *c = arg;

    (void)req;
    c->calls++;
    c->status = status;
}

xfer_status_t tp_op_result(xfer_status_t s, xfer_request_t *req, int timeout_ms)
{
    xfer_status_t w;

    if (!TP_POSTED(s)) {
        return s;
    }
    if (req == NULL) {
        return XFER_ERR_INTERNAL;   /* posted, but no request came back */
    }
    w = xfer_request_wait(req, timeout_ms);
    xfer_request_release(req);
    return w;
}

xfer_status_t tp_flush(xfer_endpoint_t *ep, int timeout_ms)
{
    xfer_request_t *req = NULL;
    xfer_status_t s     = xfer_endpoint_flush(ep, NULL, NULL, &req);

    return tp_op_result(s, req, timeout_ms);
}

/* ---- the echo server ------------------------------------------------------------------------- */

int tp_echo_server(tp_side_t *side)
{
    char *buf = malloc(TP_ECHO_MAX);

    TP_CHECK(buf != NULL, "malloc");
    for (;;) {
        xfer_request_t *req = NULL;
        xfer_status_t s;
        uint64_t tag;
        size_t len;

        s = xfer_tag_recv(side->ctx, side->ep, 0, 0, buf, TP_ECHO_MAX, NULL, NULL, NULL, &req);
        TP_CHECK(TP_POSTED(s), "echo: tag_recv: %s", xfer_status_string(s));
        TP_CHECK_STATUS(xfer_request_wait(req, TP_WAIT_MS * 3), XFER_OK);
        tag = xfer_request_tag(req);
        len = xfer_request_length(req);
        xfer_request_release(req);
        if (tag == TP_TAG_STOP) {
            break;
        }
        req = NULL;
        s   = xfer_tag_send(side->ep, tag, buf, len, NULL, NULL, NULL, &req);
        TP_CHECK(TP_POSTED(s), "echo: tag_send: %s", xfer_status_string(s));
        TP_CHECK_STATUS(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
        xfer_request_release(req);
    }
    free(buf);
    return 0;
}

void tp_echo_ping(xfer_context_t *ctx, xfer_endpoint_t *ep, uint64_t tag, size_t len)
{
    char *out = malloc(len + 1), *in = calloc(1, len + 1);
    xfer_request_t *rreq = NULL, *sreq = NULL;
    xfer_status_t s;

    tp_fill_pattern(out, len, tag);
    s = xfer_tag_recv(ctx, ep, tag, ~0ull, in, len, NULL, NULL, NULL, &rreq);
    cr_assert(TP_POSTED(s), "ping: tag_recv: %s", xfer_status_string(s));
    s = xfer_tag_send(ep, tag, out, len, NULL, NULL, NULL, &sreq);
    cr_assert(TP_POSTED(s), "ping: tag_send: %s", xfer_status_string(s));
    s = xfer_request_wait(sreq, TP_WAIT_MS);
    cr_assert_eq(s, XFER_OK, "ping: send: %s", xfer_status_string(s));
    s = xfer_request_wait(rreq, TP_WAIT_MS);
    cr_assert_eq(s, XFER_OK, "ping: echo: %s", xfer_status_string(s));
    cr_assert_eq(xfer_request_length(rreq), len);
    cr_assert_eq(tp_check_pattern(in, len, tag), -1, "ping: the echo differs");
    xfer_request_release(sreq);
    xfer_request_release(rreq);
    free(out);
    free(in);
}

void tp_echo_stop(xfer_endpoint_t *ep)
{
    xfer_request_t *req = NULL;
    xfer_status_t s     = xfer_tag_send(ep, TP_TAG_STOP, "", 0, NULL, NULL, NULL, &req);

    cr_assert(TP_POSTED(s), "stop: %s", xfer_status_string(s));
    cr_assert_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
    xfer_request_release(req);
}

void tp_another_peer_works(xfer_context_t *ctx, const size_t *lens)
{
    xfer_endpoint_t *ep;
    tp_peer_t q;

    tp_server_spawn(&q, tp_echo_server, NULL, NULL);
    ep = tp_connect(ctx, &q);
    for (uint64_t i = 0; lens[i] != 0; i++) {
        tp_echo_ping(ctx, ep, 77 + i, lens[i]);
    }
    tp_echo_stop(ep);
    tp_child_expect_ok(&q, 30);
    xfer_endpoint_close(ep);
}

/* ---- data ------------------------------------------------------------------------------------ */

static uint64_t mix(uint64_t seed, uint64_t w)
{
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + w * 0xBF58476D1CE4E5B9ull + 0x94D049BB133111EBull;

    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

void tp_fill_pattern_at(void *buf, size_t off, size_t len, uint64_t seed)
{
    uint8_t *p = buf;

    for (size_t i = off; i < off + len;) {
        uint64_t v = mix(seed, i / 8);
        size_t n   = ((off + len - i) < 8 - i % 8) ? (off + len - i) : 8 - i % 8;

        memcpy(p + i, (const uint8_t*)&v + i % 8, n);
        i += n;
    }
}

ssize_t tp_check_pattern_at(const void *buf, size_t off, size_t len, uint64_t seed)
{
    const uint8_t *p = buf;

    for (size_t i = off; i < off + len;) {
        uint64_t v = mix(seed, i / 8);
        size_t n   = ((off + len - i) < 8 - i % 8) ? (off + len - i) : 8 - i % 8;

        if (memcmp(p + i, (const uint8_t*)&v + i % 8, n) != 0) {
            for (size_t j = 0; j < n; j++) {
                if (p[i + j] != ((const uint8_t*)&v)[i % 8 + j]) {
                    return (ssize_t)(i + j);
                }
            }
        }
        i += n;
    }
    return -1;
}

void tp_fill_pattern(void *buf, size_t len, uint64_t seed)
{
    tp_fill_pattern_at(buf, 0, len, seed);
}

ssize_t tp_check_pattern(const void *buf, size_t len, uint64_t seed)
{
    return tp_check_pattern_at(buf, 0, len, seed);
}
