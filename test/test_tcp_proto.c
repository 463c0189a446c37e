/*
 * The tcp transport's data-path protocol against a hostile peer. A real server (this process,
 * public API only) accepts two connections: one from a raw client that performs the bootstrap
 * by hand (HELLO "tcp", read HELLO + ACCEPT, CONNECT, read CONNECT) and then speaks tcp frames
 * built with tcp_wire.h - broken ones - and one from a well-behaved xfer client. Each broken
 * frame must fail the server's pending receive on that connection with an error (within a
 * timeout, never a hang), mark the endpoint failed, leave receives from any peer posted, and
 * leave the other connection working.
 */
#include "raw_peer.h"
#include "test_util.h"
#include "../framework/wire/bootstrap_wire.h"
#include "../components/tcp/tcp_wire.h"

#include <xfer/byteorder.h>

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define WAIT_MS       10000
#define MAX_MSG       (1u << 20)    /* XFER_TCP_MAX_MSG_SIZE of the server */
#define MAX_KEY       64u           /* XFER_MAX_KEY_LEN of the server */
#define TAG_VICTIM    1
#define TAG_PING      2
#define TAG_PONG      3
#define TAG_ANY       99

static void setup(void)
{
    setenv("XFER_TRANSPORTS", "tcp", 1);
    setenv("XFER_BOOTSTRAP_TIMEOUT", "5s", 1);
    setenv("XFER_TCP_MAX_MSG_SIZE", "1m", 1);
    setenv("XFER_MAX_KEY_LEN", "64", 1);
    unsetenv("XFER_COMPONENT_PATH");
    unsetenv("XFER_PROGRESS_THREAD");
}

TestSuite(tcp_proto, .init = setup, .timeout = 60);

/* ---- the raw client ------------------------------------------------------------------------- */

/* The client half of the bootstrap, by hand. */
static void raw_bootstrap(int fd)
{
    static xfer_wire_hello_t hello;
    static uint8_t frame[XFER_WIRE_HEADER_LEN + XFER_WIRE_MAX_BODY];
    xfer_wire_connect_t conn;
    char name[XFER_WIRE_MAX_NAME + 1], why[256];
    size_t len = sizeof(frame), body_len;

    memset(&hello, 0, sizeof(hello));
    hello.num = 1;
    snprintf(hello.transports[0].name, sizeof(hello.transports[0].name), "tcp");
    if (xfer_wire_pack_hello(&hello, frame, &len) != XFER_OK) {
        _exit(30);
    }
    raw_write(fd, frame, len, 31);
    raw_boot_read(fd, XFER_WIRE_HELLO, frame, sizeof(frame), 32);
    body_len = raw_boot_read(fd, XFER_WIRE_ACCEPT, frame, sizeof(frame), 35);
    if ((xfer_wire_parse_accept(frame, body_len, name, why, sizeof(why)) != XFER_OK) ||
        (strcmp(name, "tcp") != 0)) {
        _exit(38);
    }
    memset(&conn, 0, sizeof(conn));
    conn.context_id = 0x7e57c0de5eed0001ull;
    len = sizeof(frame);
    if (xfer_wire_pack_connect(&conn, frame, &len) != XFER_OK) {
        _exit(39);
    }
    raw_write(fd, frame, len, 40);
    raw_boot_read(fd, XFER_WIRE_CONNECT, frame, sizeof(frame), 41);
}

typedef struct raw_plan {
    const uint8_t *bytes;       /* sent after the parent says go */
    size_t        len;
    int           close_after;  /* close the connection right after */
    /* optional: expect a TENSOR_RESP with this id and this many data bytes */
    int           expect_tensor;
    uint64_t      tensor_id;
    uint64_t      tensor_size;
} raw_plan_t;

static void raw_expect_tensor(int fd, const raw_plan_t *plan)
{
    const xfer_tcp_wire_limits_t limits = {MAX_MSG, MAX_KEY};
    uint8_t head[XFER_TCP_WIRE_HDR_LEN], ext[XFER_TCP_WIRE_TRESP_EXT_MAX];
    xfer_tcp_wire_tensor_resp_t resp;
    xfer_tcp_wire_hdr_t hdr;
    size_t need = XFER_TCP_WIRE_TRESP_EXT_LEN;
    xfer_status_t st;
    uint8_t *data;
    char why[256];

    raw_read(fd, head, sizeof(head), 50);
    if ((xfer_tcp_wire_unpack_hdr(head, &limits, &hdr, why, sizeof(why)) != XFER_OK) ||
        (hdr.type != XFER_TCP_WIRE_TENSOR_RESP) || (hdr.id != plan->tensor_id) ||
        (hdr.status != XFER_OK)) {
        _exit(51);
    }
    raw_read(fd, ext, need, 52);
    st = xfer_tcp_wire_unpack_tensor_resp_ext(ext, need, &hdr, &limits, &resp, &need, why,
                                              sizeof(why));
    if ((st == XFER_INPROGRESS) && (need <= sizeof(ext))) {     /* its dims */
        raw_read(fd, ext + XFER_TCP_WIRE_TRESP_EXT_LEN, need - XFER_TCP_WIRE_TRESP_EXT_LEN, 52);
        st = xfer_tcp_wire_unpack_tensor_resp_ext(ext, need, &hdr, &limits, &resp, &need, why,
                                                  sizeof(why));
    }
    if ((st != XFER_OK) || (resp.meta.size != plan->tensor_size) ||
        (resp.meta.dtype != XFER_DTYPE_UINT8)) {
        _exit(53);
    }
    data = malloc(resp.meta.size + 1);
    raw_read(fd, data, resp.meta.size, 54);
    for (uint64_t i = 0; i < resp.meta.size; i++) {
        if (data[i] != (uint8_t)(i * 3)) {
            _exit(55);
        }
    }
    free(data);
}

/* Connect, bootstrap, wait for go on ctl, send the plan's bytes, then linger until ctl
 * closes. Exit 0 when every step worked. */
static pid_t raw_spawn(uint16_t port, const raw_plan_t *plan, int *ctl_p)
{
    int sv[2];
    pid_t pid;

    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        struct sockaddr_in sa = {0};
        struct pollfd pfd;
        char c;
        int fd;

        close(sv[0]);
        alarm(50);
        fd                 = socket(AF_INET, SOCK_STREAM, 0);
        sa.sin_family      = AF_INET;
        sa.sin_port        = htons(port);
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (connect(fd, (struct sockaddr*)&sa, sizeof(sa)) != 0) {
            _exit(20);
        }
        raw_bootstrap(fd);
        pfd = (struct pollfd){sv[1], POLLIN, 0};
        if ((poll(&pfd, 1, WAIT_MS * 2) != 1) || (read(sv[1], &c, 1) != 1)) {
            _exit(21);
        }
        if (plan->len > 0) {
            raw_write(fd, plan->bytes, plan->len, 22);
        }
        if (plan->expect_tensor) {
            raw_expect_tensor(fd, plan);
        }
        if (plan->close_after) {
            close(fd);
        }
        /* stay until the parent is done, so that only the frame can have failed things */
        pfd = (struct pollfd){sv[1], POLLIN, 0};
        poll(&pfd, 1, WAIT_MS * 3);
        _exit(0);
    }
    close(sv[1]);
    *ctl_p = sv[0];
    return pid;
}

/* ---- the well-behaved client ---------------------------------------------------------------- */

/* Sends "ping" with TAG_PING, expects "pong" with TAG_PONG. */
static pid_t good_spawn(uint16_t port)
{
    pid_t pid = fork();

    cr_assert_geq(pid, 0);
    if (pid == 0) {
        xfer_context_t *ctx;
        xfer_endpoint_t *ep;
        xfer_request_t *req = NULL;
        char address[64], buf[8] = "";
        int ok;

        alarm(50);
        snprintf(address, sizeof(address), "127.0.0.1:%u", port);
        if ((tu_context(0, &ctx) != XFER_OK) || (xfer_connect(ctx, address, &ep) != XFER_OK)) {
            _exit(10);
        }
        if ((xfer_tag_send(ep, TAG_PING, "ping", 5, NULL, NULL, NULL, &req) != XFER_OK) ||
            (xfer_request_wait(req, WAIT_MS) != XFER_OK)) {
            _exit(11);
        }
        xfer_request_release(req);
        if ((xfer_tag_recv(ctx, ep, TAG_PONG, ~0ull, buf, sizeof(buf), NULL, NULL, NULL,
                           &req) != XFER_OK) ||
            (xfer_request_wait(req, WAIT_MS) != XFER_OK)) {
            _exit(12);
        }
        ok = (strcmp(buf, "pong") == 0);
        xfer_request_release(req);
        xfer_endpoint_close(ep);
        xfer_context_destroy(ctx);
        _exit(ok ? 0 : 13);
    }
    return pid;
}

static int child_exit(pid_t pid)
{
    int st;

    cr_assert_eq(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* ---- the server ----------------------------------------------------------------------------- */

typedef struct server {
    xfer_context_t  *ctx;
    xfer_listener_t *listener;
    uint16_t        port;
} server_t;

static void server_start(server_t *s)
{
    cr_assert_eq(tu_context(0, &s->ctx), XFER_OK);
    cr_assert_eq(xfer_listen(s->ctx, "127.0.0.1:0", &s->listener), XFER_OK);
    s->port = xfer_listener_port(s->listener);
}

static void server_stop(server_t *s)
{
    xfer_listener_close(s->listener);
    xfer_context_destroy(s->ctx);
}

/* The good connection still carries a round trip. */
static void expect_good_peer_works(server_t *s, xfer_endpoint_t *good, pid_t good_pid)
{
    xfer_request_t *req = NULL;
    char buf[8] = "";

    cr_assert_eq(xfer_tag_recv(s->ctx, good, TAG_PING, ~0ull, buf, sizeof(buf), NULL, NULL,
                               NULL, &req), XFER_OK);
    cr_expect_eq(xfer_request_wait(req, WAIT_MS), XFER_OK);
    cr_expect_str_eq(buf, "ping");
    xfer_request_release(req);
    /* before the pong: after it the client leaves, which ends the connection */
    cr_expect_eq(xfer_endpoint_status(good), XFER_OK);
    cr_assert_eq(xfer_tag_send(good, TAG_PONG, "pong", 5, NULL, NULL, NULL, &req), XFER_OK);
    cr_expect_eq(xfer_request_wait(req, WAIT_MS), XFER_OK);
    xfer_request_release(req);
    cr_expect_eq(child_exit(good_pid), 0, "the well-behaved client failed");
}

/*
 * Run one hostile plan: the server waits for a message on the raw connection (and for any
 * message from anyone); the raw client sends the plan; the receive on the raw connection must
 * fail with one of the two statuses, the receive from any peer stays posted, the endpoint
 * reports its failure, and the good connection still works.
 */
static void expect_bad_frame(const raw_plan_t *plan, xfer_status_t want, xfer_status_t alt)
{
    xfer_endpoint_t *bad = NULL, *good = NULL;
    xfer_request_t *victim = NULL, *any = NULL;
    char buf[64], anybuf[8];
    pid_t raw_pid, good_pid;
    xfer_status_t status;
    server_t s;
    int ctl;

    server_start(&s);
    raw_pid = raw_spawn(s.port, plan, &ctl);
    cr_assert_eq(xfer_accept(s.listener, WAIT_MS, &bad), XFER_OK);
    cr_assert_str_eq(xfer_endpoint_transport(bad), "tcp");
    good_pid = good_spawn(s.port);
    cr_assert_eq(xfer_accept(s.listener, WAIT_MS, &good), XFER_OK);

    cr_assert_eq(xfer_tag_recv(s.ctx, bad, TAG_VICTIM, ~0ull, buf, sizeof(buf), NULL, NULL,
                               NULL, &victim), XFER_OK);
    cr_assert_eq(xfer_tag_recv(s.ctx, NULL, TAG_ANY, ~0ull, anybuf, sizeof(anybuf), NULL, NULL,
                               NULL, &any), XFER_OK);
    cr_assert_eq(write(ctl, "g", 1), 1);

    status = xfer_request_wait(victim, WAIT_MS);
    cr_expect((status == want) || (status == alt), "the receive on the hostile connection "
              "ended with %s, expected %s", xfer_status_string(status),
              xfer_status_string(want));
    cr_expect_neq(xfer_endpoint_status(bad), XFER_OK, "the endpoint must report its failure");
    xfer_request_release(victim);
    cr_expect_eq(xfer_request_test(any), XFER_INPROGRESS, "a receive from any peer must stay");

    expect_good_peer_works(&s, good, good_pid);

    cr_expect_eq(xfer_request_cancel(any), XFER_OK);
    cr_expect_eq(xfer_request_wait(any, WAIT_MS), XFER_ERR_CANCELED);
    xfer_request_release(any);
    close(ctl);
    cr_expect_eq(child_exit(raw_pid), 0, "the raw client did not complete its bootstrap");
    xfer_endpoint_close(bad);
    xfer_endpoint_close(good);
    server_stop(&s);
}

static size_t put_hdr(uint8_t *p, unsigned type, int32_t status, uint64_t id, uint64_t length)
{
    xfer_tcp_wire_hdr_t hdr = {XFER_TCP_WIRE_MAGIC, XFER_TCP_WIRE_VERSION, (uint8_t)type,
                               status, id, length, 0};

    xfer_tcp_wire_pack_hdr(&hdr, p);
    return XFER_TCP_WIRE_HDR_LEN;
}

Test(tcp_proto, hand_made_bootstrap_and_frame_work)
{
    uint8_t frame[64];
    size_t n = put_hdr(frame, XFER_TCP_WIRE_TAG, 0, TAG_VICTIM, 6);
    raw_plan_t plan = {frame, n + 6, 0, 0, 0, 0};
    xfer_endpoint_t *ep = NULL;
    xfer_request_t *req = NULL;
    char buf[16] = "";
    server_t s;
    pid_t pid;
    int ctl;

    memcpy(frame + n, "hello", 6);
    server_start(&s);
    pid = raw_spawn(s.port, &plan, &ctl);
    cr_assert_eq(xfer_accept(s.listener, WAIT_MS, &ep), XFER_OK);
    cr_assert_eq(xfer_tag_recv(s.ctx, ep, TAG_VICTIM, ~0ull, buf, sizeof(buf), NULL, NULL,
                               NULL, &req), XFER_OK);
    cr_assert_eq(write(ctl, "g", 1), 1);
    cr_expect_eq(xfer_request_wait(req, WAIT_MS), XFER_OK);
    cr_expect_eq(xfer_request_length(req), 6);
    cr_expect_eq(xfer_request_tag(req), TAG_VICTIM);
    cr_expect_str_eq(buf, "hello");
    cr_expect_eq(xfer_endpoint_status(ep), XFER_OK);
    xfer_request_release(req);
    close(ctl);
    cr_expect_eq(child_exit(pid), 0);
    xfer_endpoint_close(ep);
    server_stop(&s);
}

Test(tcp_proto, producer_answers_a_raw_tensor_request)
{
    uint8_t frame[128], data[1000];
    xfer_tcp_wire_tensor_req_t treq = {7, 3};
    xfer_tensor_t t = {XFER_DTYPE_UINT8, 1, {1000}, 1000, data, 0};
    size_t n = put_hdr(frame, XFER_TCP_WIRE_TENSOR_REQ, 0, 0x100000005ull,
                       XFER_TCP_WIRE_TREQ_EXT_LEN + 3);
    raw_plan_t plan = {frame, 0, 0, 1, 0x100000005ull, sizeof(data)};
    xfer_endpoint_t *ep = NULL;
    xfer_request_t *pub = NULL;
    server_t s;
    pid_t pid;
    int ctl;

    xfer_tcp_wire_pack_tensor_req_ext(&treq, frame + n);
    n += XFER_TCP_WIRE_TREQ_EXT_LEN;
    memcpy(frame + n, "key", 3);
    plan.len = n + 3;
    for (size_t i = 0; i < sizeof(data); i++) {
        data[i] = (uint8_t)(i * 3);
    }
    server_start(&s);
    pid = raw_spawn(s.port, &plan, &ctl);
    cr_assert_eq(xfer_accept(s.listener, WAIT_MS, &ep), XFER_OK);
    cr_assert_eq(xfer_tensor_publish(s.ctx, 7, "key", &t, 0, NULL, NULL, &pub), XFER_OK);
    cr_assert_eq(write(ctl, "g", 1), 1);
    cr_expect_eq(xfer_request_wait(pub, WAIT_MS), XFER_OK, "the publish completes once sent");
    xfer_request_release(pub);
    close(ctl);
    cr_expect_eq(child_exit(pid), 0, "the raw consumer did not get a valid TENSOR_RESP");
    xfer_endpoint_close(ep);
    server_stop(&s);
}

/* 500 tensor requests with an empty key from one peer: each is answered with an error and
 * counted, at most 10 lines are logged, and the endpoint goes on. */
Test(tcp_proto, a_flood_of_empty_key_requests_leaves_a_bounded_log, .init = cr_redirect_stderr)
{
    enum { N = 500 };
    size_t one = XFER_TCP_WIRE_HDR_LEN + XFER_TCP_WIRE_TREQ_EXT_LEN;
    uint8_t *frames = calloc(N, one);
    raw_plan_t plan = {frames, N * one, 0, 0, 0, 0};
    xfer_endpoint_t *ep = NULL;
    server_t s;
    char *log;
    pid_t pid;
    int ctl, lines;

    cr_assert_not_null(frames);
    for (int i = 0; i < N; i++) {
        xfer_tcp_wire_tensor_req_t treq = {1, 0};
        uint8_t *f = frames + (size_t)i * one;

        put_hdr(f, XFER_TCP_WIRE_TENSOR_REQ, 0, 0x100000000ull + (uint64_t)i,
                XFER_TCP_WIRE_TREQ_EXT_LEN);
        xfer_tcp_wire_pack_tensor_req_ext(&treq, f + XFER_TCP_WIRE_HDR_LEN);
    }
    server_start(&s);
    pid = raw_spawn(s.port, &plan, &ctl);
    cr_assert_eq(xfer_accept(s.listener, WAIT_MS, &ep), XFER_OK);
    cr_assert_eq(write(ctl, "g", 1), 1);
    for (int spins = 0; (tu_ctx_counter(s.ctx, "peer_tensor_request_refused") < N) &&
                        (spins < 100000); spins++) {
        (void)xfer_progress(s.ctx);
        usleep(spins % 100 ? 0 : 1000);
    }
    cr_expect_eq(tu_ctx_counter(s.ctx, "peer_tensor_request_refused"), N);
    cr_expect_eq(xfer_endpoint_status(ep), XFER_OK, "an empty key is refused, not a failure");
    close(ctl);
    cr_expect_eq(child_exit(pid), 0);
    xfer_endpoint_close(ep);
    server_stop(&s);
    free(frames);
    log   = tu_read_redirected_stderr();
    lines = tu_count_in(log, "peer asked for a key of 0 bytes");
    cr_expect_eq(lines, 10, "%d lines for %d requests:\n%.2000s", lines, N, log);
    free(log);
}

/* Reserved bytes are 0 (a later version may give them a meaning): an endpoint address or a
 * lane hello with one set is refused. */
Test(tcp_proto, reserved_bytes_set_are_refused)
{
    xfer_tcp_wire_ep_addr_t a = {.lanes = 4, .limits = {MAX_MSG, MAX_KEY}, .lane_port = 4242,
                                 .token = 77}, b;
    xfer_tcp_wire_lane_hello_t h = {.lane = 2, .token = 77}, g;
    uint8_t buf[XFER_TCP_WIRE_EP_ADDR_LEN];
    char why[256];

    xfer_tcp_wire_pack_ep_addr(&a, buf);
    cr_assert_eq(xfer_tcp_wire_unpack_ep_addr(buf, sizeof(buf), &b), XFER_OK);
    /* byte 18 is the flags, whose bit 0 says TLS; its other bits are reserved */
    buf[18] ^= XFER_TCP_WIRE_ADDR_TLS;
    cr_assert_eq(xfer_tcp_wire_unpack_ep_addr(buf, sizeof(buf), &b), XFER_OK);
    cr_expect_eq(b.flags, XFER_TCP_WIRE_ADDR_TLS);
    buf[18] ^= XFER_TCP_WIRE_ADDR_TLS;
    for (size_t at = 18; at < 24; at++) {
        buf[at] ^= 2;
        cr_expect_eq(xfer_tcp_wire_unpack_ep_addr(buf, sizeof(buf), &b), XFER_ERR_PROTOCOL,
                     "reserved bit of byte %zu of an endpoint address", at);
        buf[at] ^= 2;
    }
    xfer_tcp_wire_pack_lane_hello(&h, buf);
    cr_assert_eq(xfer_tcp_wire_unpack_lane_hello(buf, &g, why, sizeof(why)), XFER_OK, "%s", why);
    for (size_t at = 4; at < 8; at++) {
        buf[at] ^= 1;
        cr_expect_eq(xfer_tcp_wire_unpack_lane_hello(buf, &g, why, sizeof(why)),
                     XFER_ERR_PROTOCOL, "reserved byte %zu of a lane hello", at);
        buf[at] ^= 1;
    }
}

Test(tcp_proto, wrong_magic)
{
    uint8_t frame[64];
    size_t n = put_hdr(frame, XFER_TCP_WIRE_TAG, 0, TAG_VICTIM, 4);
    raw_plan_t plan = {frame, n + 4, 0, 0, 0, 0};

    frame[0] ^= 0x5a;
    memset(frame + n, 0, 4);
    expect_bad_frame(&plan, XFER_ERR_PROTOCOL, XFER_ERR_PROTOCOL);
}

Test(tcp_proto, wrong_version)
{
    uint8_t frame[64];
    size_t n = put_hdr(frame, XFER_TCP_WIRE_TAG, 0, TAG_VICTIM, 4);
    raw_plan_t plan = {frame, n + 4, 0, 0, 0, 0};

    frame[2] = XFER_TCP_WIRE_VERSION + 1;
    memset(frame + n, 0, 4);
    expect_bad_frame(&plan, XFER_ERR_PROTOCOL, XFER_ERR_PROTOCOL);
}

Test(tcp_proto, truncated_frame_then_close)
{
    uint8_t frame[64];
    size_t n = put_hdr(frame, XFER_TCP_WIRE_TAG, 0, TAG_VICTIM, 40);
    raw_plan_t plan = {frame, n + 10, 1, 0, 0, 0};

    memset(frame + n, 'x', 10);
    expect_bad_frame(&plan, XFER_ERR_CONNECTION, XFER_ERR_CONNECTION);
}

Test(tcp_proto, truncated_header_then_close)
{
    uint8_t frame[64];
    raw_plan_t plan = {frame, 10, 1, 0, 0, 0};

    put_hdr(frame, XFER_TCP_WIRE_TAG, 0, TAG_VICTIM, 40);
    expect_bad_frame(&plan, XFER_ERR_CONNECTION, XFER_ERR_CONNECTION);
}

Test(tcp_proto, length_beyond_max_msg_size)
{
    uint8_t frame[64];
    raw_plan_t plan = {frame, put_hdr(frame, XFER_TCP_WIRE_TAG, 0, TAG_VICTIM, MAX_MSG + 1),
                       0, 0, 0, 0};

    expect_bad_frame(&plan, XFER_ERR_PROTOCOL, XFER_ERR_PROTOCOL);
}

Test(tcp_proto, huge_length)
{
    uint8_t frame[64];
    raw_plan_t plan = {frame, put_hdr(frame, XFER_TCP_WIRE_PUT_REQ, 0, 1, UINT64_MAX), 0, 0, 0,
                       0};

    expect_bad_frame(&plan, XFER_ERR_PROTOCOL, XFER_ERR_PROTOCOL);
}

Test(tcp_proto, unknown_type)
{
    uint8_t frame[64];
    raw_plan_t plan = {frame, put_hdr(frame, 0x42, 0, TAG_VICTIM, 0), 0, 0, 0, 0};

    expect_bad_frame(&plan, XFER_ERR_PROTOCOL, XFER_ERR_PROTOCOL);
}

Test(tcp_proto, response_with_unknown_id)
{
    uint8_t frame[64];
    raw_plan_t plan = {frame, put_hdr(frame, XFER_TCP_WIRE_PUT_ACK, 0, 0x100000007ull, 0), 0, 0,
                       0, 0};

    expect_bad_frame(&plan, XFER_ERR_PROTOCOL, XFER_ERR_PROTOCOL);
}

/* Answers to puts and flushes this side never sent, and a PUT whose rank skips one: each
 * breaks the connection rather than being believed. */
Test(tcp_proto, put_fail_for_a_put_never_sent)
{
    uint8_t frame[64];
    raw_plan_t plan = {frame, put_hdr(frame, XFER_TCP_WIRE_PUT_FAIL, XFER_ERR_INVALID_PARAM, 1,
                                      0), 0, 0, 0, 0};

    expect_bad_frame(&plan, XFER_ERR_PROTOCOL, XFER_ERR_PROTOCOL);
}

Test(tcp_proto, flush_ack_for_a_flush_never_sent)
{
    uint8_t frame[64];
    raw_plan_t plan = {frame, put_hdr(frame, XFER_TCP_WIRE_FLUSH_ACK, 0, 1, 0), 0, 0, 0, 0};

    expect_bad_frame(&plan, XFER_ERR_PROTOCOL, XFER_ERR_PROTOCOL);
}

Test(tcp_proto, put_whose_rank_skips_one)
{
    uint8_t frame[64];
    xfer_tcp_wire_rma_t rma = {1, 2, 0x1000, 0};
    size_t n = put_hdr(frame, XFER_TCP_WIRE_PUT, 0, 2, XFER_TCP_WIRE_PUT_EXT_LEN);
    raw_plan_t plan;

    xfer_tcp_wire_pack_put_ext(&rma, frame + n);
    plan = (raw_plan_t){frame, n + XFER_TCP_WIRE_PUT_EXT_LEN, 0, 0, 0, 0};
    expect_bad_frame(&plan, XFER_ERR_PROTOCOL, XFER_ERR_PROTOCOL);
}

/* A PUTV (a batch's small puts in one frame) whose table lies: no blocks, blocks whose
 * lengths do not add up to the data it carries, a block that wraps around the address
 * space, a rank that skips one. Each breaks the connection before a byte is written. */
static size_t putv_frame(uint8_t *frame, uint64_t id, uint32_t count, const uint64_t *addr,
                         const uint64_t *len, uint64_t data)
{
    xfer_tcp_wire_putv_t putv = {1, 2, count};
    uint64_t table = (uint64_t)count * XFER_TCP_WIRE_PUTV_DESC_LEN;
    size_t n       = put_hdr(frame, XFER_TCP_WIRE_PUTV, 0, id,
                             XFER_TCP_WIRE_PUTV_EXT_LEN + table + data);

    xfer_tcp_wire_pack_putv_ext(&putv, frame + n);
    n += XFER_TCP_WIRE_PUTV_EXT_LEN;
    for (uint32_t i = 0; i < count; i++) {
        xfer_tcp_wire_pack_putv_desc(frame + n, i, addr[i], len[i]);
    }
    n += (size_t)table;
    memset(frame + n, 0x5a, (size_t)data);
    return n + (size_t)data;
}

static void expect_bad_putv(uint64_t id, uint32_t count, const uint64_t *addr,
                            const uint64_t *len, uint64_t data)
{
    uint8_t frame[512];
    raw_plan_t plan = {frame, putv_frame(frame, id, count, addr, len, data), 0, 0, 0, 0};

    expect_bad_frame(&plan, XFER_ERR_PROTOCOL, XFER_ERR_PROTOCOL);
}

Test(tcp_proto, putv_with_no_blocks)
{
    const uint64_t addr[1] = {0x1000}, len[1] = {16};
    uint8_t frame[512];
    /* a table of one entry follows, so only the count is wrong */
    size_t n = putv_frame(frame, 1, 1, addr, len, 16);
    raw_plan_t plan = {frame, n, 0, 0, 0, 0};

    xfer_put_le32(frame + XFER_TCP_WIRE_HDR_LEN + 16, 0);
    expect_bad_frame(&plan, XFER_ERR_PROTOCOL, XFER_ERR_PROTOCOL);
}

Test(tcp_proto, putv_whose_blocks_do_not_add_up)
{
    const uint64_t addr[2] = {0x1000, 0x2000}, len[2] = {16, 16};

    expect_bad_putv(1, 2, addr, len, 40);
    expect_bad_putv(1, 2, addr, len, 24);
}

Test(tcp_proto, putv_whose_block_wraps_around)
{
    const uint64_t addr[2] = {0x1000, UINT64_MAX - 7}, len[2] = {16, 16};

    expect_bad_putv(1, 2, addr, len, 32);
}

Test(tcp_proto, putv_whose_rank_skips_one)
{
    const uint64_t addr[1] = {0x1000}, len[1] = {16};

    expect_bad_putv(2, 1, addr, len, 16);
}

Test(tcp_proto, tensor_response_with_unknown_id)
{
    uint8_t frame[128];
    xfer_tcp_wire_tensor_resp_t resp = {0, {XFER_DTYPE_UINT8, 1, 0, 4, {4}}};
    size_t ext_len = XFER_TCP_WIRE_TRESP_EXT_LEN + 8;
    size_t n = put_hdr(frame, XFER_TCP_WIRE_TENSOR_RESP, 0, 0x300000002ull, ext_len + 4);
    raw_plan_t plan = {frame, n + ext_len + 4, 0, 0, 0, 0};

    cr_assert_eq(xfer_tcp_wire_pack_tensor_resp_ext(&resp, frame + n), ext_len);
    memset(frame + n + ext_len, 0, 4);
    expect_bad_frame(&plan, XFER_ERR_PROTOCOL, XFER_ERR_PROTOCOL);
}

Test(tcp_proto, tensor_request_key_beyond_limit)
{
    uint8_t frame[256];
    xfer_tcp_wire_tensor_req_t treq = {1, MAX_KEY + 1};
    size_t n = put_hdr(frame, XFER_TCP_WIRE_TENSOR_REQ, 0, 0x100000000ull,
                       XFER_TCP_WIRE_TREQ_EXT_LEN + MAX_KEY + 1);
    raw_plan_t plan = {frame, n + XFER_TCP_WIRE_TREQ_EXT_LEN + MAX_KEY + 1, 0, 0, 0, 0};

    xfer_tcp_wire_pack_tensor_req_ext(&treq, frame + n);
    memset(frame + n + XFER_TCP_WIRE_TREQ_EXT_LEN, 'k', MAX_KEY + 1);
    expect_bad_frame(&plan, XFER_ERR_PROTOCOL, XFER_ERR_PROTOCOL);
}

Test(tcp_proto, tensor_request_key_length_lies)
{
    uint8_t frame[256];
    xfer_tcp_wire_tensor_req_t treq = {1, 8};     /* says 8, the frame carries 20 */
    size_t n = put_hdr(frame, XFER_TCP_WIRE_TENSOR_REQ, 0, 0x100000000ull,
                       XFER_TCP_WIRE_TREQ_EXT_LEN + 20);
    raw_plan_t plan = {frame, n + XFER_TCP_WIRE_TREQ_EXT_LEN + 20, 0, 0, 0, 0};

    xfer_tcp_wire_pack_tensor_req_ext(&treq, frame + n);
    memset(frame + n + XFER_TCP_WIRE_TREQ_EXT_LEN, 'k', 20);
    expect_bad_frame(&plan, XFER_ERR_PROTOCOL, XFER_ERR_PROTOCOL);
}

Test(tcp_proto, status_in_a_request)
{
    uint8_t frame[64];
    raw_plan_t plan = {frame, put_hdr(frame, XFER_TCP_WIRE_TAG, XFER_ERR_IO, TAG_VICTIM, 0), 0,
                       0, 0, 0};

    expect_bad_frame(&plan, XFER_ERR_PROTOCOL, XFER_ERR_PROTOCOL);
}

Test(tcp_proto, random_bytes)
{
    uint8_t junk[512];
    raw_plan_t plan = {junk, sizeof(junk), 0, 0, 0, 0};
    unsigned seed = 11;

    for (size_t i = 0; i < sizeof(junk); i++) {
        junk[i] = (uint8_t)rand_r(&seed);
    }
    expect_bad_frame(&plan, XFER_ERR_PROTOCOL, XFER_ERR_PROTOCOL);
}

Test(tcp_proto, valid_frames_then_garbage)
{
    /* a good message for another tag first: the connection fails only at the garbage */
    uint8_t frame[128];
    size_t n = put_hdr(frame, XFER_TCP_WIRE_TAG, 0, 5, 3);
    raw_plan_t plan = {frame, 0, 0, 0, 0, 0};

    memcpy(frame + n, "abc", 3);
    n += 3;
    memset(frame + n, 0xff, 30);
    plan.len = n + 30;
    expect_bad_frame(&plan, XFER_ERR_PROTOCOL, XFER_ERR_PROTOCOL);
}

Test(tcp_proto, peer_closes_cleanly)
{
    raw_plan_t plan = {NULL, 0, 1, 0, 0, 0};

    expect_bad_frame(&plan, XFER_ERR_CONNECTION, XFER_ERR_CONNECTION);
}

/* ---- notifications arriving in pieces, held to the process's budget ------------------------- */

#define NOTE_MAX   65536u           /* XFER_NOTIFY_MAX_LEN, the largest it may be */
#define NOTE_PEERS 4u

static void progress_ms(xfer_context_t *ctx, int ms)
{
    struct timespec t0, t;

    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        xfer_progress(ctx);
        usleep(1000);
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while ((t.tv_sec - t0.tv_sec) * 1000 + (t.tv_nsec - t0.tv_nsec) / 1000000 < ms);
}

/* A BATCH_END (put, after no puts) with a notification of NOTE_MAX bytes (i * 7). */
static size_t batch_end_frame(uint8_t *frame)
{
    size_t len = put_hdr(frame, XFER_TCP_WIRE_BATCH_END, 0, 1,
                         XFER_TCP_WIRE_BATCH_EXT_LEN + NOTE_MAX);

    memset(frame + len, 0, XFER_TCP_WIRE_BATCH_EXT_LEN);
    xfer_put_le32(frame + len, 1);      /* a notification follows */
    len += XFER_TCP_WIRE_BATCH_EXT_LEN;
    for (size_t i = 0; i < NOTE_MAX; i++) {
        frame[len + i] = (uint8_t)(i * 7);
    }
    return len;
}

/*
 * A notification is charged to the process's XFER_NOTIFY_BUDGET from its first byte, not
 * only once queued: NOTE_PEERS raw peers each begin one of NOTE_MAX bytes and never send the
 * rest. The budget (256 KiB) has room for fewer than NOTE_PEERS of them, so the endpoints of
 * the peers past their share fail with XFER_ERR_NO_RESOURCE and the rest wait intact. Once
 * the peers leave, their endpoints fail - not closed by the application yet - and the whole
 * budget is free again: another peer's notification of NOTE_MAX bytes is delivered byte for
 * byte.
 */
Test(tcp_proto, notifications_part_way_in_are_held_to_the_process_budget)
{
    static uint8_t frame[XFER_TCP_WIRE_HDR_LEN + XFER_TCP_WIRE_BATCH_EXT_LEN + NOTE_MAX];
    static uint8_t note[NOTE_MAX];
    xfer_endpoint_t *eps[NOTE_PEERS], *whole_ep = NULL;
    unsigned held = 0, refused = 0;
    int ctl[NOTE_PEERS], whole_ctl;
    pid_t pid[NOTE_PEERS], whole_pid;
    raw_plan_t part, whole;
    size_t head, note_len = 0;
    xfer_status_t st = XFER_ERR_NOT_FOUND;
    server_t s;

    setenv("XFER_NOTIFY_MAX_LEN", "65536", 1);
    setenv("XFER_NOTIFY_BUDGET", "256k", 1);
    head  = batch_end_frame(frame);
    part  = (raw_plan_t){frame, head + 1024, 0, 0, 0, 0};
    whole = (raw_plan_t){frame, head + NOTE_MAX, 0, 0, 0, 0};
    server_start(&s);
    for (unsigned i = 0; i < NOTE_PEERS; i++) {
        pid[i] = raw_spawn(s.port, &part, &ctl[i]);
        cr_assert_eq(xfer_accept(s.listener, WAIT_MS, &eps[i]), XFER_OK);
        cr_assert_eq(write(ctl[i], "g", 1), 1);
        progress_ms(s.ctx, 200);
    }
    progress_ms(s.ctx, 300);
    for (unsigned i = 0; i < NOTE_PEERS; i++) {
        xfer_status_t ep_st = xfer_endpoint_status(eps[i]);

        cr_expect((ep_st == XFER_OK) || (ep_st == XFER_ERR_NO_RESOURCE), "peer %u: %s", i,
                  xfer_status_string(ep_st));
        held    += (ep_st == XFER_OK);
        refused += (ep_st == XFER_ERR_NO_RESOURCE);
    }
    cr_expect_geq(held, 1, "no peer could begin its notification");
    cr_expect_geq(refused, 1, "%u notifications of %u bytes part-way in, all kept within a "
                  "budget of 256 KiB", held, NOTE_MAX);
    cr_expect_leq(held * (uint64_t)NOTE_MAX, 256u << 10);
    /* the peers leave; their endpoints fail, and stay open here */
    for (unsigned i = 0; i < NOTE_PEERS; i++) {
        close(ctl[i]);
        cr_expect_eq(child_exit(pid[i]), 0);
    }
    progress_ms(s.ctx, 200);
    for (unsigned i = 0; i < NOTE_PEERS; i++) {
        cr_expect_neq(xfer_endpoint_status(eps[i]), XFER_OK, "peer %u left", i);
    }

    whole_pid = raw_spawn(s.port, &whole, &whole_ctl);
    cr_assert_eq(xfer_accept(s.listener, WAIT_MS, &whole_ep), XFER_OK);
    cr_assert_eq(write(whole_ctl, "g", 1), 1);
    for (int ms = 0; (st == XFER_ERR_NOT_FOUND) && (ms < WAIT_MS); ms += 10) {
        progress_ms(s.ctx, 10);
        st = xfer_notify_poll(whole_ep, note, sizeof(note), &note_len);
    }
    cr_expect_eq(st, XFER_OK, "the whole notification: %s (the endpoint: %s)",
                 xfer_status_string(st), xfer_status_string(xfer_endpoint_status(whole_ep)));
    cr_expect_eq(note_len, NOTE_MAX);
    cr_expect_eq(memcmp(note, frame + head, NOTE_MAX), 0);
    close(whole_ctl);
    cr_expect_eq(child_exit(whole_pid), 0);
    xfer_endpoint_close(whole_ep);
    for (unsigned i = 0; i < NOTE_PEERS; i++) {
        xfer_endpoint_close(eps[i]);
    }
    server_stop(&s);
}
