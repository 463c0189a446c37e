/*
 * tcp lanes: an endpoint with several connections (XFER_TCP_LANES=4, data from 64 KiB on cut
 * over them). Messages of sizes around the share boundaries keep their order and bytes, also
 * when they wait as unexpected messages or are truncated; losing one lane fails the endpoint
 * on both sides without a hang; connections to the lane port that do not name a waiting
 * endpoint are closed and harm nothing. Real sockets, real faults (shutdown() of a lane's
 * socket found in /proc/self/fd), two processes; at most 32 connections that never say which
 * lane they are wait on the lane port. An answer striped over the lanes lets its
 * responder read requests again once it has left, whichever connection wrote its last bytes.
 */
#include "test_peer.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static void setup(void)
{
    tp_env();
    setenv("XFER_TCP_LANES", "4", 1);
    setenv("XFER_TCP_LANE_MIN_SIZE", "64k", 1);
}

TestSuite(lanes, .init = setup, .timeout = 120);

#define TAG 7u

/* Progress until every lane ep agreed on is up (its counters say so): a lane may still be
 * connecting when xfer_connect returns (XFER_TCP_LANE_WAIT). */
static void lanes_wait_up(xfer_context_t *ctx, xfer_endpoint_t *ep)
{
    for (double end = tp_now_ms() + TP_WAIT_MS; tp_now_ms() < end; ) {
        int64_t want = tu_ep_counter(ep, "lanes");

        if ((want >= 0) && (tu_ep_counter(ep, "lanes_up") == want)) {
            return;
        }
        (void)xfer_progress(ctx);
    }
    cr_assert_fail("the endpoint's lanes did not all come up");
}

static void skip_unless_tcp(void)
{
    if (strcmp(tp_transport(), "tcp") != 0) {
        cr_skip_test("lanes are the tcp transport's; this run is over %s", tp_transport());
    }
}

/* around the share boundaries of 4 lanes (page-multiple shares, lane 0 the rest) */
static const size_t sizes[] = {
    8, 64u << 10, (64u << 10) + 1, 8, (1u << 20) + 4095, (3u << 20) + 7, 100,
    (256u << 10) + 3, 16383, (4u << 20), 8,
};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))
#define TRUNCATED_AT 5      /* this one is received into a buffer 5000 bytes too short */

/* ---- TCP sockets of this process ------------------------------------------------------------ */

static int sock_int(int fd, int level, int name)
{
    int v = -1;
    socklen_t len = sizeof(v);

    return (getsockopt(fd, level, name, &v, &len) == 0) ? v : -1;
}

static int sock_port(int fd, int peer)
{
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);

    if ((peer ? getpeername(fd, (struct sockaddr*)&ss, &len) :
                getsockname(fd, (struct sockaddr*)&ss, &len)) != 0) {
        return -1;
    }
    return ntohs((ss.ss_family == AF_INET6) ? ((struct sockaddr_in6*)&ss)->sin6_port :
                                              ((struct sockaddr_in*)&ss)->sin_port);
}

/* Every TCP socket of this process that listens (listening = 1) or is connected (0), with
 * its local port other than not_port and, for connected ones, its peer's not peer_not. */
static int tcp_fds(int listening, int not_port, int peer_not, int *fds, int max)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;
    int n = 0;

    if (d == NULL) {
        return 0;
    }
    while (((e = readdir(d)) != NULL) && (n < max)) {
        int fd = atoi(e->d_name), dom;

        if ((e->d_name[0] == '.') || (fd == dirfd(d))) {
            continue;
        }
        dom = sock_int(fd, SOL_SOCKET, SO_DOMAIN);
        if (((dom != AF_INET) && (dom != AF_INET6)) ||
            (sock_int(fd, SOL_SOCKET, SO_TYPE) != SOCK_STREAM) ||
            (sock_int(fd, SOL_SOCKET, SO_ACCEPTCONN) != listening) ||
            (sock_port(fd, 0) == not_port) ||
            (!listening && (sock_port(fd, 1) == peer_not))) {
            continue;
        }
        fds[n++] = fd;
    }
    closedir(d);
    return n;
}

static int address_port(const char *address)
{
    const char *colon = strrchr(address, ':');

    return colon ? atoi(colon + 1) : -1;
}

/* ---- order, sizes, unexpected, truncated ---------------------------------------------------- */

/* Send every size with tag TAG, pattern seed = its index; then wait for the parent's word. */
static int srv_send_all(tp_side_t *s)
{
    xfer_request_t *req[NSIZES];
    char *buf[NSIZES];
    uint64_t v;

    for (size_t i = 0; i < NSIZES; i++) {
        xfer_status_t st;

        buf[i] = malloc(sizes[i]);
        TP_CHECK(buf[i] != NULL, "malloc");
        tp_fill_pattern(buf[i], sizes[i], i + 1);
        req[i] = NULL;
        st     = xfer_tag_send(s->ep, TAG, buf[i], sizes[i], NULL, NULL, NULL, &req[i]);
        TP_CHECK(TP_POSTED(st), "send %zu: %s", i, xfer_status_string(st));
    }
    for (size_t i = 0; i < NSIZES; i++) {
        TP_CHECK_STATUS(xfer_request_wait(req[i], TP_WAIT_MS), XFER_OK);
        xfer_request_release(req[i]);
        free(buf[i]);
    }
    TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS) == 0, "no word from the parent");
    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
    return 0;
}

Test(lanes, striped_messages_keep_order_and_bytes_expected_unexpected_and_truncated)
{
    xfer_request_t *req[NSIZES];
    char *buf[NSIZES];
    tp_peer_t p;

    skip_unless_tcp();
    tp_start(&p, srv_send_all, NULL);
    for (size_t i = 0; i < NSIZES; i++) {
        size_t cap = sizes[i] - ((i == TRUNCATED_AT) ? 5000 : 0);

        if (i == NSIZES / 2) {
            /* the rest arrives before its receive: it waits as unexpected messages */
            tp_progress_for(p.ctx, 300);
        }
        buf[i] = calloc(1, cap);
        cr_assert_not_null(buf[i]);
        req[i] = NULL;
        cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, TAG, UINT64_MAX, buf[i], cap, NULL, NULL,
                                          NULL, &req[i])));
    }
    for (size_t i = 0; i < NSIZES; i++) {
        xfer_status_t want = (i == TRUNCATED_AT) ? XFER_ERR_TRUNCATED : XFER_OK;
        size_t cap         = sizes[i] - ((i == TRUNCATED_AT) ? 5000 : 0);

        cr_assert_eq(xfer_request_wait(req[i], TP_WAIT_MS), want, "message %zu (%zu bytes)", i,
                     sizes[i]);
        if (want == XFER_OK) {
            cr_assert_eq(xfer_request_length(req[i]), sizes[i]);
        }
        /* the bytes that fit are the sender's, in place, whichever lane carried them */
        cr_assert_eq(tp_check_pattern(buf[i], cap, i + 1), -1, "message %zu (%zu bytes)", i,
                     sizes[i]);
        xfer_request_release(req[i]);
        free(buf[i]);
    }
    tp_send(&p, 1);
    tp_finish(&p);
}

/* ---- a lane lost ---------------------------------------------------------------------------- */

/* Receive one large message; report its status (the parent breaks a lane first). */
static int srv_recv_report(tp_side_t *s)
{
    size_t len     = 2u << 20;
    char *buf      = malloc(len);
    xfer_request_t *req = NULL;
    xfer_status_t st;

    TP_CHECK(buf != NULL, "malloc");
    TP_CHECK(TP_POSTED(xfer_tag_recv(s->ctx, s->ep, TAG, UINT64_MAX, buf, len, NULL, NULL, NULL,
                                     &req)), "recv");
    TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
    st = xfer_request_wait(req, TP_WAIT_MS);
    xfer_request_release(req);
    TP_CHECK(tp_ctl_send_u64(s->ctl, (uint64_t)(int64_t)st) == 0, "ctl");
    free(buf);
    return 0;
}

Test(lanes, a_lost_lane_fails_the_endpoint_on_both_sides)
{
    size_t len = 2u << 20;
    char *buf  = malloc(len);
    xfer_request_t *req = NULL;
    xfer_status_t st;
    int64_t child_st;
    int fds[16], n;
    tp_peer_t p;

    skip_unless_tcp();
    cr_assert_not_null(buf);
    tp_fill_pattern(buf, len, 3);
    tp_start(&p, srv_recv_report, NULL);
    lanes_wait_up(p.ctx, p.ep);
    cr_assert_eq(tp_recv(&p), 1);
    /* our lanes: connected TCP sockets whose peer is not the child's bootstrap port */
    n = tcp_fds(0, -1, address_port(p.address), fds, 16);
    cr_assert_eq(n, 3, "%d lane sockets found, 4 lanes expected", n);
    cr_assert_eq(shutdown(fds[1], SHUT_RDWR), 0);

    st = xfer_tag_send(p.ep, TAG, buf, len, NULL, NULL, NULL, &req);
    if (TP_POSTED(st)) {
        st = xfer_request_wait(req, TP_WAIT_MS);
        xfer_request_release(req);
    }
    cr_assert(st < 0, "a send over a broken lane ended with %s", xfer_status_string(st));
    child_st = (int64_t)tp_recv(&p);
    cr_assert(child_st < 0, "the child's receive ended with %s",
              xfer_status_string((xfer_status_t)child_st));
    /* the endpoint is failed, not stuck: posting on it says so at once */
    req = NULL;
    st  = xfer_tag_send(p.ep, TAG, buf, 8, NULL, NULL, NULL, &req);
    if (TP_POSTED(st)) {
        st = xfer_request_wait(req, TP_WAIT_MS);
        xfer_request_release(req);
    }
    cr_assert(st < 0, "a send on the failed endpoint ended with %s", xfer_status_string(st));
    free(buf);
    tp_finish(&p);
}

/* ---- strangers on the lane port ------------------------------------------------------------- */

/* Tell the parent the lane port, then send one striped message when asked. */
static int srv_lane_port(tp_side_t *s)
{
    int fds[4], n = tcp_fds(1, xfer_listener_port(s->listener), -1, fds, 4);
    size_t len = 3u << 20;
    char *buf  = malloc(len);
    xfer_request_t *req = NULL;
    uint64_t v;

    struct sockaddr_storage at;
    socklen_t at_len = sizeof(at);

    TP_CHECK((n == 1) && (buf != NULL), "%d lane ports", n);
    /* the listener is on 127.0.0.1: so is its lane port, nowhere wider */
    TP_CHECK((getsockname(fds[0], (struct sockaddr*)&at, &at_len) == 0) && tu_is_loopback(&at),
             "the lane port of a loopback listener is bound off loopback");
    TP_CHECK(tp_ctl_send_u64(s->ctl, (uint64_t)sock_port(fds[0], 0)) == 0, "ctl");
    TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS) == 0, "no word from the parent");
    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
    tp_fill_pattern(buf, len, 9);
    TP_CHECK(TP_POSTED(xfer_tag_send(s->ep, TAG, buf, len, NULL, NULL, NULL, &req)), "send");
    TP_CHECK_STATUS(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
    xfer_request_release(req);
    free(buf);
    TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS) == 0, "no word from the parent");
    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
    return 0;
}

/* tcp only: a child serving srv_lane_port, connected in p; its lane port. */
static int lane_port_peer(tp_peer_t *p)
{
    int port;

    skip_unless_tcp();
    tp_start(p, srv_lane_port, NULL);
    port = (int)tp_recv(p);
    cr_assert_gt(port, 0);
    return port;
}

/* Connect to the lane port, send hello, and expect the child to close the connection. */
static void stranger(tp_peer_t *p, int port, const uint8_t *hello, size_t len)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct pollfd pfd;
    char c;

    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_geq(fd, 0);
    cr_assert_eq(connect(fd, (struct sockaddr*)&sin, sizeof(sin)), 0);
    cr_assert_eq(send(fd, hello, len, MSG_NOSIGNAL), (ssize_t)len);
    /* the child progresses while it waits for our word; its lane port sees this */
    pfd.fd     = fd;
    pfd.events = POLLIN;
    cr_assert_eq(poll(&pfd, 1, TP_WAIT_MS), 1, "the stranger's connection was not closed");
    cr_assert_leq(recv(fd, &c, 1, 0), 0, "the lane port answered a stranger");
    close(fd);
    (void)p;
}

/* After the strangers: srv_lane_port's striped 3 MiB message still arrives whole over the real
 * endpoint's lanes; then the child is told to end. */
static void lanes_still_carry_a_message(tp_peer_t *p)
{
    size_t len = 3u << 20;
    char *buf  = malloc(len);
    xfer_request_t *req = NULL;

    cr_assert_not_null(buf);
    cr_assert(TP_POSTED(xfer_tag_recv(p->ctx, p->ep, TAG, UINT64_MAX, buf, len, NULL, NULL,
                                      NULL, &req)));
    tp_send(p, 1);
    cr_assert_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
    cr_assert_eq(tp_check_pattern(buf, len, 9), -1);
    xfer_request_release(req);
    tp_send(p, 1);
    free(buf);
}

Test(lanes, connections_that_name_no_waiting_endpoint_are_closed)
{
    /* 'T' 'L', version 3, lane 1, reserved, a token nobody was given */
    uint8_t wrong_token[16] = {0x54, 0x4c, 3, 1, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8};
    uint8_t wrong_magic[16] = {'G', 'E', 'T', ' ', '/', ' ', 'H', 'T', 'T', 'P', '/', '1'};
    uint8_t lane_zero[16]   = {0x54, 0x4c, 3, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8};
    tp_peer_t p;
    int port;

    port = lane_port_peer(&p);
    stranger(&p, port, wrong_token, sizeof(wrong_token));
    stranger(&p, port, wrong_magic, sizeof(wrong_magic));
    stranger(&p, port, lane_zero, sizeof(lane_zero));
    lanes_still_carry_a_message(&p);   /* the real endpoint's lanes are untouched */
    tp_finish(&p);
}

/* The lane port of a listener on 127.0.0.1 binds 127.0.0.1 (srv_lane_port checks its
 * address): the host's outward address does not reach it, loopback does. */
Test(lanes, a_loopback_listeners_lane_port_is_not_reachable_from_another_address)
{
    char outward[64];
    tp_peer_t p;
    int port;

    port = lane_port_peer(&p);
    if (tu_outward_ipv4(outward, sizeof(outward))) {
        cr_expect_eq(tu_tcp_connect(outward, port), ECONNREFUSED, "%s:%d reached the lane "
                     "port of a loopback listener", outward, port);
    }
    if (tu_host_has_ipv6_loopback()) {
        cr_expect_eq(tu_tcp_connect("::1", port), ECONNREFUSED);
    }
    cr_expect_eq(tu_tcp_connect("127.0.0.1", port), 0);
    lanes_still_carry_a_message(&p);
    tp_finish(&p);
}

/* Connections to the lane port that never say which lane they are: at most 32 (tcp.h's
 * XFER_TCP_ACCEPT_MAX) are held waiting for their hello, the oldest closed beyond that, and
 * the real endpoint's lanes go on. */
Test(lanes, at_most_32_silent_connections_wait_on_the_lane_port)
{
    enum { SILENT = 40, HELD = 32 };
    struct sockaddr_in sin = {.sin_family = AF_INET};
    int fds[SILENT], closed = 0, first_closed = 0;
    tp_peer_t p;
    int port;

    port = lane_port_peer(&p);
    lanes_wait_up(p.ctx, p.ep);     /* our own lanes are not among the silent ones */
    sin.sin_port    = htons((uint16_t)port);
    sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    for (int i = 0; i < SILENT; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM, 0);
        cr_assert_geq(fds[i], 0);
        cr_assert_eq(connect(fds[i], (struct sockaddr*)&sin, sizeof(sin)), 0);
        usleep(2000);   /* in order: the child accepts them as they come */
    }
    /* the child progresses while it waits for our word: the ones it evicts get their end */
    for (double end = tp_now_ms() + TP_WAIT_MS; (closed < SILENT - HELD) && (tp_now_ms() < end);) {
        closed = 0;
        for (int i = 0; i < SILENT; i++) {
            struct pollfd pfd = {fds[i], POLLIN, 0};
            char c;

            if ((poll(&pfd, 1, 0) == 1) && (recv(fds[i], &c, 1, MSG_DONTWAIT) <= 0)) {
                closed++;
                first_closed += (i == 0);
            }
        }
        first_closed = (first_closed > 0);
        usleep(10000);
    }
    cr_assert_eq(closed, SILENT - HELD, "%d of %d silent connections closed; %d may wait",
                 closed, SILENT, HELD);
    cr_assert(first_closed, "the oldest silent connection was not the one closed");
    lanes_still_carry_a_message(&p);
    for (int i = 0; i < SILENT; i++) {
        close(fds[i]);
    }
    tp_finish(&p);
}

/* ---- striped answers past the response backlog ---------------------------------------------- */

#define ANSWER_N   128
#define ANSWER_LEN (1u << 20)

/* Publish ANSWER_N 1 MiB tensors (steps 1..ANSWER_N, pattern seed = step); wait until each
 * was fetched, then for the parent's word. */
static int srv_publish_many(tp_side_t *s)
{
    char *buf = malloc((size_t)ANSWER_N * ANSWER_LEN);
    xfer_request_t *req[ANSWER_N];
    uint64_t v;

    TP_CHECK(buf != NULL, "malloc");
    for (int i = 0; i < ANSWER_N; i++) {
        xfer_tensor_t t = {.dtype = XFER_DTYPE_UINT8, .rank = 1, .size = ANSWER_LEN,
                           .data = buf + (size_t)i * ANSWER_LEN};

        t.dims[0] = ANSWER_LEN;
        tp_fill_pattern(t.data, ANSWER_LEN, (uint64_t)i + 1);
        req[i] = NULL;
        TP_CHECK(TP_POSTED(xfer_tensor_publish(s->ctx, (uint64_t)i + 1, "answer", &t, 0, NULL,
                                               NULL, &req[i])), "publish %d", i);
    }
    for (int i = 0; i < ANSWER_N; i++) {
        TP_CHECK_STATUS(xfer_request_wait(req[i], TP_WAIT_MS), XFER_OK);
        xfer_request_release(req[i]);
    }
    TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS) == 0, "no word from the parent");
    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
    free(buf);
    return 0;
}

/* Every striped answer is bigger than the backlog the responder keeps before it stops reading
 * requests (XFER_TCP_MAX_RESPONSE_BACKLOG=4k), so it reads the next request only once the
 * previous answer is out, whichever of its connections wrote the last bytes of it. */
Test(lanes, requests_are_read_again_after_a_striped_answer_leaves)
{
    char *buf = malloc((size_t)ANSWER_N * ANSWER_LEN);
    xfer_request_t *req[ANSWER_N];
    tp_peer_t p;

    skip_unless_tcp();
    cr_assert_not_null(buf);
    setenv("XFER_TCP_MAX_RESPONSE_BACKLOG", "4k", 1);
    tp_start(&p, srv_publish_many, NULL);
    for (int i = 0; i < ANSWER_N; i++) {
        xfer_fetch_params_t fp = {.size     = sizeof(fp), .buffer = buf + (size_t)i * ANSWER_LEN,
                                  .capacity = ANSWER_LEN};

        req[i] = NULL;
        cr_assert(TP_POSTED(xfer_tensor_fetch(p.ep, (uint64_t)i + 1, "answer", &fp, NULL, NULL,
                                              &req[i])), "fetch %d", i);
    }
    for (int i = 0; i < ANSWER_N; i++) {
        cr_assert_eq(xfer_request_wait(req[i], TP_WAIT_MS), XFER_OK, "fetch %d of %d", i + 1,
                     ANSWER_N);
        cr_assert_eq(tp_check_pattern(buf + (size_t)i * ANSWER_LEN, ANSWER_LEN,
                                      (uint64_t)i + 1), -1, "fetch %d", i + 1);
        xfer_request_release(req[i]);
    }
    tp_send(&p, 1);
    free(buf);
    tp_finish(&p);
}
