/*
 * The listener's concurrent handshakes, over real loopback sockets: silent clients (more than
 * XFER_BOOTSTRAP_MAX_PENDING of them), a client sending its HELLO one byte per xfer_accept()
 * call, one closing halfway, must delay no good client; the listener's descriptor drives a
 * poll loop; no descriptor leaks. Some of these play the client by hand in the test process
 * (raw_*), one step at a time, so that the order of events is the test's and not the
 * scheduler's. Also: handshakes that complete while the server only progresses, connecting
 * to a name that resolves to several addresses, and xfer_perf's server outliving bad
 * clients.
 */
#include "bootstrap_fixture.h"
#include "test_util.h"
#include "../framework/sock.h"
#include "../framework/wire/bootstrap_wire.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <errno.h>
#include <netdb.h>
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

TestSuite(listener, .init = bootstrap_setup, .fini = bootstrap_teardown, .timeout = 60);

static double now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* A client played by hand in this process: a blocking socket connected to the listener (the
 * kernel completes the connection; the listener takes it at its next xfer_accept). */
static int raw_connect(const listener_ctx_t *s)
{
    struct sockaddr_in sa = {0};
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

    cr_assert_geq(fd, 0);
    sa.sin_family      = AF_INET;
    sa.sin_port        = htons(xfer_listener_port(s->listener));
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr*)&sa, sizeof(sa)), 0, "connect: %s",
                 strerror(errno));
    return fd;
}

static uint16_t raw_local_port(int fd)
{
    struct sockaddr_in sa;
    socklen_t len = sizeof(sa);

    cr_assert_eq(getsockname(fd, (struct sockaddr*)&sa, &len), 0);
    return ntohs(sa.sin_port);
}

/* A HELLO offering one transport, with the address the test plug-ins expect ("name\0"). */
static size_t raw_hello(const char *transport, uint8_t *frame, size_t size)
{
    xfer_wire_hello_t *hello = calloc(1, sizeof(*hello));
    size_t len = size;

    cr_assert_not_null(hello);
    hello->num = 1;
    snprintf(hello->transports[0].name, sizeof(hello->transports[0].name), "%s", transport);
    memcpy(hello->transports[0].addr, transport, strlen(transport) + 1);
    hello->transports[0].addr_len = (uint16_t)(strlen(transport) + 1);
    cr_assert_eq(xfer_wire_pack_hello(hello, frame, &len), XFER_OK);
    free(hello);
    return len;
}

/* Read exactly len bytes within 5 s. */
static void raw_read(int fd, void *buf, size_t len)
{
    struct pollfd pfd = {fd, POLLIN, 0};
    size_t got        = 0;

    while (got < len) {
        ssize_t n;

        cr_assert_eq(poll(&pfd, 1, 5000), 1, "nothing to read within 5 s");
        n = read(fd, (uint8_t*)buf + got, len - got);
        cr_assert_gt(n, 0, "read: %s", (n == 0) ? "closed" : strerror(errno));
        got += (size_t)n;
    }
}

/* Read one frame of the given type; its body goes to body (at most size bytes). */
static size_t raw_read_frame(int fd, uint16_t type, uint8_t *body, size_t size)
{
    uint8_t head[XFER_WIRE_HEADER_LEN];
    xfer_wire_header_t hdr;
    char why[256];

    raw_read(fd, head, sizeof(head));
    cr_assert_eq(xfer_wire_parse_header(head, sizeof(head), &hdr, why, sizeof(why)), XFER_OK,
                 "%s", why);
    cr_assert_eq(hdr.type, type, "frame type %u, expected %u", hdr.type, type);
    cr_assert_leq(hdr.body_len, size);
    raw_read(fd, body, hdr.body_len);
    return hdr.body_len;
}

/* The rest of a hand-played handshake after our HELLO: the server's HELLO, ACCEPT naming
 * transport and CONNECT, then our CONNECT. */
static void raw_finish(int fd, const char *transport)
{
    static uint8_t body[XFER_WIRE_MAX_BODY];
    uint8_t frame[XFER_WIRE_CONNECT_FRAME_MAX];
    xfer_wire_connect_t conn = {0};
    char name[XFER_WIRE_MAX_NAME + 1], why[256];
    size_t len;

    raw_read_frame(fd, XFER_WIRE_HELLO, body, sizeof(body));
    len = raw_read_frame(fd, XFER_WIRE_ACCEPT, body, sizeof(body));
    cr_assert_eq(xfer_wire_parse_accept(body, len, name, why, sizeof(why)), XFER_OK, "%s", why);
    cr_assert_str_eq(name, transport);
    raw_read_frame(fd, XFER_WIRE_CONNECT, body, sizeof(body));
    conn.context_id = 0x5eed0000u + (uint64_t)getpid();
    len             = sizeof(frame);
    cr_assert_eq(xfer_wire_pack_connect(&conn, frame, &len), XFER_OK);
    cr_assert_eq(write(fd, frame, len), (ssize_t)len);
}

/* Call xfer_accept until it returns an endpoint, at most ms; the calls in between may only
 * report a handshake that another client failed. */
static xfer_endpoint_t *accept_within(xfer_listener_t *l, double ms)
{
    double end          = now_ms() + ms;
    xfer_endpoint_t *ep = NULL;

    while (ep == NULL) {
        xfer_status_t st = xfer_accept(l, 100, &ep);

        cr_assert((st == XFER_OK) || (st == XFER_ERR_TIMEOUT) || (st == XFER_ERR_NO_RESOURCE) ||
                  (st == XFER_ERR_CONNECTION), "xfer_accept: %s", xfer_status_string(st));
        cr_assert_lt(now_ms(), end, "no endpoint within %.0f ms", ms);
    }
    return ep;
}

/* Has the server closed its side of fd (EOF), without waiting? */
static int raw_closed_by_server(int fd)
{
    struct pollfd pfd = {fd, POLLIN, 0};
    char c;

    return (poll(&pfd, 1, 0) == 1) && (recv(fd, &c, 1, MSG_DONTWAIT) == 0);
}

Test(listener, silent_client_does_not_delay_a_good_one)
{
    listener_ctx_t s;
    xfer_endpoint_t *ep = NULL;
    double t0, took;
    pid_t good;
    int silent;

    setenv("XFER_BOOTSTRAP_TIMEOUT", "5s", 1);
    server_start(&s);
    silent = raw_connect(&s);   /* connected first: the listener takes it first */
    good   = client_spawn(s.address, "talpha", "talpha", XFER_OK);
    t0     = now_ms();
    ep     = accept_within(s.listener, 4000);
    took = now_ms() - t0;
    cr_expect_lt(took, 1000, "the good client waited %.0f ms behind a silent one", took);
    cr_expect_str_eq(xfer_endpoint_transport(ep), "talpha");
    cr_expect_eq(child_exit(good), 0);
    cr_expect_not(raw_closed_by_server(silent), "the silent client's time is not up yet");
    xfer_endpoint_close(ep);
    server_stop(&s);
    cr_expect(raw_closed_by_server(silent), "closing the listener closes its handshakes");
    close(silent);
}

#define PROGRESSING 3

/* A server busy elsewhere in xfer (progress, waits) still takes connections and moves their
 * handshakes: clients connect while it never calls xfer_accept, which then returns each at
 * once. */
Test(listener, handshakes_complete_while_the_server_only_progresses)
{
    listener_ctx_t s;
    pid_t clients[PROGRESSING];
    int left = PROGRESSING, st;
    double end;

    server_start(&s);
    for (int i = 0; i < PROGRESSING; i++) {
        clients[i] = client_spawn(s.address, "talpha", "talpha", XFER_OK);
    }
    for (end = now_ms() + 4000; (left > 0) && (now_ms() < end); ) {
        (void)xfer_progress(s.ctx);
        for (int i = 0; i < PROGRESSING; i++) {
            if ((clients[i] > 0) && (waitpid(clients[i], &st, WNOHANG) == clients[i])) {
                cr_expect(WIFEXITED(st) && (WEXITSTATUS(st) == 0), "client %d failed", i);
                clients[i] = 0;
                left--;
            }
        }
    }
    cr_assert_eq(left, 0, "%d clients did not connect while the server progressed", left);
    for (int i = 0; i < PROGRESSING; i++) {
        xfer_endpoint_t *ep = NULL;

        cr_assert_eq(xfer_accept(s.listener, 0, &ep), XFER_OK, "endpoint %d was not ready", i);
        cr_expect_str_eq(xfer_endpoint_transport(ep), "talpha");
        xfer_endpoint_close(ep);
    }
    server_stop(&s);
}

#define SILENT   10
#define BOUND    4

/* At the bound a new connection closes the oldest handshake: of SILENT silent clients, the
 * first SILENT - BOUND make room for the later ones, the next for the good client, which is
 * served at once; BOUND - 1 are still held when it is, and the listener's close ends them. */
Test(listener, more_silent_clients_than_the_bound, .init = cr_redirect_stderr)
{
    listener_ctx_t s;
    xfer_endpoint_t *ep = NULL;
    int silent[SILENT], before, closed = 0;
    const char *p;
    double t0, took;
    char *log;
    pid_t good;

    setenv("XFER_BOOTSTRAP_TIMEOUT", "5s", 1);
    setenv("XFER_BOOTSTRAP_MAX_PENDING", "4", 1);
    before = tu_fd_count();
    server_start(&s);
    for (int i = 0; i < SILENT; i++) {
        silent[i] = raw_connect(&s);
    }
    t0   = now_ms();
    good = client_spawn(s.address, "talpha", "talpha", XFER_OK);
    ep   = accept_within(s.listener, 4000);
    took = now_ms() - t0;
    cr_expect_lt(took, 1000, "the good client waited %.0f ms behind %d silent ones", took,
                 SILENT);
    cr_expect_str_eq(xfer_endpoint_transport(ep), "talpha");
    cr_expect_eq(child_exit(good), 0);
    for (int i = 0; i < SILENT; i++) {
        int c = raw_closed_by_server(silent[i]);

        cr_expect_eq(c, i <= SILENT - BOUND, "silent client %d: %s", i,
                     c ? "closed" : "still held");
        closed += c;
    }
    cr_expect_eq(closed, SILENT - BOUND + 1);
    xfer_endpoint_close(ep);
    server_stop(&s);
    for (int i = 0; i < SILENT; i++) {
        cr_expect(raw_closed_by_server(silent[i]), "silent client %d outlived the listener", i);
        close(silent[i]);
    }
    cr_expect_eq(tu_fd_count(), before, "%d descriptors open, %d before", tu_fd_count(), before);
    log = tu_read_redirected_stderr();
    closed = 0;
    for (p = log; (p = strstr(p, "XFER_BOOTSTRAP_MAX_PENDING allows")) != NULL; p++) {
        closed++;
    }
    cr_expect_eq(closed, SILENT - BOUND + 1, "%d log lines for the closed ones:\n%s", closed,
                 log);
    free(log);
}

Test(listener, hello_byte_by_byte_while_another_client_is_served)
{
    uint8_t frame[256];
    listener_ctx_t s;
    xfer_endpoint_t *ep = NULL, *slow_ep;
    char port[16];
    size_t len;
    pid_t good;
    int fd;

    server_start(&s);
    fd  = raw_connect(&s);
    len = raw_hello("tbeta", frame, sizeof(frame));
    for (size_t i = 0; i < len / 2; i++) {
        cr_assert_eq(write(fd, frame + i, 1), 1);
        cr_assert_eq(xfer_accept(s.listener, 20, &ep), XFER_ERR_TIMEOUT, "byte %zu", i);
    }
    /* halfway through the slow HELLO, a good client comes and goes first */
    good = client_spawn(s.address, "talpha", "talpha", XFER_OK);
    ep   = accept_within(s.listener, 4000);
    cr_expect_str_eq(xfer_endpoint_transport(ep), "talpha");
    cr_expect_eq(child_exit(good), 0);
    xfer_endpoint_close(ep);
    ep = NULL;
    for (size_t i = len / 2; i < len; i++) {
        cr_assert_eq(write(fd, frame + i, 1), 1);
        cr_assert_eq(xfer_accept(s.listener, 20, &ep), XFER_ERR_TIMEOUT, "byte %zu", i);
    }
    raw_finish(fd, "tbeta");
    slow_ep = accept_within(s.listener, 4000);
    cr_expect_str_eq(xfer_endpoint_transport(slow_ep), "tbeta");
    snprintf(port, sizeof(port), ":%u", raw_local_port(fd));
    cr_expect(strstr(xfer_endpoint_peer(slow_ep), port) != NULL, "%s is not the slow client",
              xfer_endpoint_peer(slow_ep));
    xfer_endpoint_close(slow_ep);
    close(fd);
    server_stop(&s);
}

/* A client that reads our reply (the tcp endpoint is created by then, holding a descriptor)
 * and closes instead of sending its CONNECT: the handshake fails, logged, and nothing of it
 * is left. */
Test(listener, client_closing_mid_handshake, .init = cr_redirect_stderr)
{
    uint8_t frame[256], body[XFER_WIRE_HELLO_FRAME_MAX];
    size_t len = raw_hello("tcp", frame, sizeof(frame));
    xfer_endpoint_t *ep = NULL;
    listener_ctx_t s;
    int fd, before;
    char *log;
    pid_t good;

    unsetenv("XFER_TCP_IFACE");
    before = tu_fd_count();
    server_start(&s);
    fd = raw_connect(&s);
    cr_assert_eq(write(fd, frame, len), (ssize_t)len);
    cr_assert_eq(xfer_accept(s.listener, 100, &ep), XFER_ERR_TIMEOUT);
    raw_read_frame(fd, XFER_WIRE_HELLO, body, sizeof(body));
    raw_read_frame(fd, XFER_WIRE_ACCEPT, body, sizeof(body));
    raw_read_frame(fd, XFER_WIRE_CONNECT, body, sizeof(body));
    close(fd);      /* all read: a clean close, not a reset */
    cr_expect_eq(xfer_accept(s.listener, 4000, &ep), XFER_ERR_CONNECTION);
    cr_expect_null(ep);
    good = client_spawn(s.address, "talpha", "talpha", XFER_OK);
    ep   = accept_within(s.listener, 4000);
    cr_expect_eq(child_exit(good), 0);
    xfer_endpoint_close(ep);
    server_stop(&s);
    cr_expect_eq(tu_fd_count(), before, "%d descriptors open, %d before", tu_fd_count(), before);
    log = tu_read_redirected_stderr();
    expect_closed_logged(log, XFER_ERR_CONNECTION);
    cr_expect(strstr(log, "peer closed the connection") != NULL, "%s", log);
    free(log);
}

/* The listener's descriptor in a poll loop: readable when a connection waits, when a
 * handshake's bytes arrive and when a deadline passes; quiet otherwise. */
Test(listener, poll_loop_on_the_listener_fd, .init = cr_redirect_stderr)
{
    uint8_t frame[256];
    size_t len = raw_hello("talpha", frame, sizeof(frame));
    xfer_endpoint_t *ep = NULL;
    listener_ctx_t s;
    struct pollfd pfd;
    double t0, took;
    int fd, silent;
    char *log;

    server_start(&s);   /* XFER_BOOTSTRAP_TIMEOUT=2s */
    pfd.fd     = xfer_listener_fd(s.listener);
    pfd.events = POLLIN;
    cr_assert_geq(pfd.fd, 0);
    cr_expect_eq(poll(&pfd, 1, 100), 0, "readable with nobody there");

    fd = raw_connect(&s);
    cr_assert_eq(poll(&pfd, 1, 5000), 1, "not readable with a connection waiting");
    cr_expect_eq(xfer_accept(s.listener, 0, &ep), XFER_ERR_TIMEOUT);
    cr_expect_eq(poll(&pfd, 1, 100), 0, "readable with nothing to do");
    cr_assert_eq(write(fd, frame, len), (ssize_t)len);
    cr_assert_eq(poll(&pfd, 1, 5000), 1, "not readable with a HELLO waiting");
    cr_expect_eq(xfer_accept(s.listener, 0, &ep), XFER_ERR_TIMEOUT);
    cr_expect_eq(poll(&pfd, 1, 100), 0, "readable while the client has not answered");
    raw_finish(fd, "talpha");
    cr_assert_eq(poll(&pfd, 1, 5000), 1, "not readable with a CONNECT waiting");
    cr_assert_eq(xfer_accept(s.listener, 0, &ep), XFER_OK);
    cr_expect_str_eq(xfer_endpoint_transport(ep), "talpha");
    xfer_endpoint_close(ep);
    ep = NULL;

    /* a silent client: the descriptor becomes readable at its deadline, 2 s after its accept */
    silent = raw_connect(&s);
    cr_assert_eq(poll(&pfd, 1, 5000), 1);
    cr_expect_eq(xfer_accept(s.listener, 0, &ep), XFER_ERR_TIMEOUT);
    t0 = now_ms();
    cr_assert_eq(poll(&pfd, 1, 5000), 1, "not readable at the silent client's deadline");
    took = now_ms() - t0;
    cr_expect(took > 1500 && took < 4500, "readable after %.0f ms, the deadline is 2 s", took);
    cr_expect_eq(xfer_accept(s.listener, 0, &ep), XFER_ERR_TIMEOUT);
    cr_expect(raw_closed_by_server(silent), "the silent client is still held");
    cr_expect_eq(poll(&pfd, 1, 100), 0, "readable after the deadline was handled");
    close(silent);
    close(fd);
    server_stop(&s);
    log = tu_read_redirected_stderr();
    cr_expect(strstr(log, "no handshake within XFER_BOOTSTRAP_TIMEOUT=2s, still waiting for "
                     "its HELLO (timed out)") != NULL, "%s", log);
    free(log);
}

/* ---- where a listener listens ------------------------------------------------------------- */

/* The listening sockets of this process: all loopback, and how many. */
static int listening_loopback_only(int *count_p)
{
    struct sockaddr_storage ss[16];
    int n = tu_listening_sockets(ss, 16);

    *count_p = n;
    for (int i = 0; i < n; i++) {
        if (!tu_is_loopback(&ss[i])) {
            return 0;
        }
    }
    return 1;
}

static void listen_at(listener_ctx_t *s, const char *address)
{
    memset(s, 0, sizeof(*s));
    cr_assert_eq(tu_context(0, &s->ctx), XFER_OK);
    cr_assert_eq(xfer_listen(s->ctx, address, &s->listener), XFER_OK, "%s: %s", address,
                 xfer_last_error());
}

/* An xfer client at host:port is accepted. */
static void reaches(listener_ctx_t *s, const char *host)
{
    char addr[96];
    xfer_endpoint_t *ep;
    pid_t pid;

    snprintf(addr, sizeof(addr), strchr(host, ':') ? "[%s]:%u" : "%s:%u", host,
             xfer_listener_port(s->listener));
    pid = client_spawn(addr, "talpha", "talpha", XFER_OK);
    ep  = accept_within(s->listener, 4000);
    cr_expect_not_null(ep, "no endpoint from %s", addr);
    cr_expect_eq(child_exit(pid), 0, "the client at %s failed", addr);
    xfer_endpoint_close(ep);
}

/* ":port" is this host's loopback, in both families where the host has them: one socket
 * each, nothing else, and the host's outward address is refused. */
Test(listener, colon_port_listens_on_loopback_in_both_families)
{
    int v6 = tu_host_has_ipv6_loopback(), count;
    char outward[INET6_ADDRSTRLEN];
    listener_ctx_t s;

    listen_at(&s, ":0");
    cr_expect(listening_loopback_only(&count), "a listening socket off loopback");
    cr_expect_eq(count, 1 + v6, "%d listening sockets for ':0'", count);
    reaches(&s, "127.0.0.1");
    if (v6) {
        reaches(&s, "::1");
    }
    if (tu_outward_ipv4(outward, sizeof(outward))) {
        cr_expect_eq(tu_tcp_connect(outward, xfer_listener_port(s.listener)), ECONNREFUSED,
                     "%s reached a loopback listener", outward);
    }
    server_stop(&s);
}

/* "*:port" is every interface, IPv4 and IPv6, on one port. */
Test(listener, star_port_listens_on_every_interface)
{
    char outward[INET6_ADDRSTRLEN];
    listener_ctx_t s;

    listen_at(&s, "*:0");
    reaches(&s, "127.0.0.1");
    if (tu_host_has_ipv6_loopback()) {
        reaches(&s, "::1");
    }
    if (tu_outward_ipv4(outward, sizeof(outward))) {
        reaches(&s, outward);
    }
    server_stop(&s);
    cr_expect_eq(xfer_sock_resolve("*:80", 0, NULL, (char[128]){0}, 128),
                 XFER_ERR_INVALID_PARAM, "'*' is not a host to connect to");
}

/* An IPv6 address is IPv6 only, an IPv4 address IPv4 only. */
Test(listener, an_address_of_one_family_listens_in_that_family_only)
{
    listener_ctx_t s;
    int count;

    listen_at(&s, "127.0.0.1:0");
    cr_expect(listening_loopback_only(&count) && (count == 1), "%d sockets", count);
    if (tu_host_has_ipv6_loopback()) {
        cr_expect_eq(tu_tcp_connect("::1", xfer_listener_port(s.listener)), ECONNREFUSED);
    }
    server_stop(&s);
    if (!tu_host_has_ipv6_loopback()) {
        cr_skip_test("this host has no ::1: the IPv6 half was not checked");
    }
    listen_at(&s, "[::1]:0");
    cr_expect_eq(tu_tcp_connect("127.0.0.1", xfer_listener_port(s.listener)), ECONNREFUSED);
    reaches(&s, "::1");
    server_stop(&s);
}

/* ---- a flood ------------------------------------------------------------------------------- */

/* 200 connections that send junk instead of a HELLO: each is closed and counted, at most 10
 * lines are logged, and a good client is still served. */
Test(listener, a_flood_of_bad_hellos_leaves_a_bounded_log, .init = cr_redirect_stderr)
{
    enum { JUNK = 200 };
    static const char junk[] = "GET / HTTP/1.0\r\n\r\n";
    xfer_endpoint_t *ep = NULL;
    listener_ctx_t s;
    int fds[JUNK], lines;
    char *log;
    pid_t good;

    server_start(&s);
    for (int i = 0; i < JUNK; i++) {
        fds[i] = raw_connect(&s);
        cr_assert_eq(write(fds[i], junk, sizeof(junk) - 1), (ssize_t)(sizeof(junk) - 1));
        if (i % 16 == 15) {
            (void)xfer_accept(s.listener, 0, &ep);
            cr_assert_null(ep);
        }
    }
    for (double end = now_ms() + 10000;
         (tu_ctx_counter(s.ctx, "peer_handshake_refused") < JUNK) && (now_ms() < end);) {
        (void)xfer_accept(s.listener, 10, &ep);
        cr_assert_null(ep);
    }
    cr_expect_eq(tu_ctx_counter(s.ctx, "peer_handshake_refused"), JUNK);
    cr_expect_eq(tu_ctx_counter(s.ctx, "peer_handshake_refused_unlogged"), JUNK - 10);
    good = client_spawn(s.address, "talpha", "talpha", XFER_OK);
    ep   = accept_within(s.listener, 4000);
    cr_expect_not_null(ep, "the good client after the flood");
    cr_expect_eq(child_exit(good), 0);
    xfer_endpoint_close(ep);
    server_stop(&s);
    for (int i = 0; i < JUNK; i++) {
        close(fds[i]);
    }
    log   = tu_read_redirected_stderr();
    lines = tu_count_in(log, "closing connection from");
    cr_expect_eq(lines, 10, "%d lines for %d junk connections:\n%s", lines, JUNK, log);
    cr_expect_eq(tu_count_in(log, "are held back and counted"), 1, "%s", log);
    free(log);
}

/* ---- connecting to every address of a name --------------------------------------------------- */

Test(listener, localhost_reaches_a_server_on_ipv4_only)
{
    struct addrinfo hints = {0}, *res = NULL;
    xfer_endpoint_t *ep = NULL;
    listener_ctx_t s;
    char addr[64];
    pid_t good;

    server_start(&s);   /* 127.0.0.1 only */
    snprintf(addr, sizeof(addr), "localhost:%u", xfer_listener_port(s.listener));
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo("localhost", NULL, &hints, &res) == 0) {
        /* where localhost is ::1 first, the client's first attempt is refused */
        cr_log_info("localhost resolves to %s first", (res->ai_family == AF_INET6) ? "::1" :
                    "127.0.0.1");
        freeaddrinfo(res);
    }
    good = client_spawn(addr, "talpha", "talpha", XFER_OK);
    ep   = accept_within(s.listener, 4000);
    cr_expect_eq(child_exit(good), 0);
    xfer_endpoint_close(ep);
    server_stop(&s);
}

/* The loop itself, on a list made by hand: a refused address, then the listener's. This host
 * may resolve no name to several addresses, so the test does not depend on one. */
Test(listener, connect_tries_each_address_in_turn)
{
    struct sockaddr_in refused = {0}, good = {0}, peer;
    struct addrinfo second = {0}, first = {0};
    socklen_t len = sizeof(peer);
    listener_ctx_t s, gone;
    char why[512];
    int fd = -1;

    server_start(&gone);
    refused.sin_family      = AF_INET;
    refused.sin_port        = htons(xfer_listener_port(gone.listener));
    refused.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    server_stop(&gone);     /* nobody listens there now */
    server_start(&s);
    good                    = refused;
    good.sin_port           = htons(xfer_listener_port(s.listener));

    first.ai_family   = second.ai_family = AF_INET;
    first.ai_socktype = second.ai_socktype = SOCK_STREAM;
    first.ai_addrlen  = second.ai_addrlen = sizeof(struct sockaddr_in);
    first.ai_addr     = (struct sockaddr*)&refused;
    second.ai_addr    = (struct sockaddr*)&good;
    first.ai_next     = &second;
    cr_assert_eq(xfer_sock_connect_any(&first, (int64_t)now_ms() + 5000, &fd, why, sizeof(why)),
                 XFER_OK, "%s", why);
    cr_assert_eq(getpeername(fd, (struct sockaddr*)&peer, &len), 0);
    cr_expect_eq(ntohs(peer.sin_port), xfer_listener_port(s.listener));
    close(fd);

    /* both refused: the error names the last address and how many were tried */
    second.ai_addr = (struct sockaddr*)&refused;
    cr_expect_eq(xfer_sock_connect_any(&first, (int64_t)now_ms() + 5000, &fd, why, sizeof(why)),
                 XFER_ERR_CONNECTION);
    cr_expect(strstr(why, "(the last of 2 addresses tried)") != NULL, "%s", why);
    cr_expect(strstr(why, "127.0.0.1:") == why, "%s", why);
    server_stop(&s);
}

/* ---- xfer_perf's server ---------------------------------------------------------------------- */

#define PERF_TAG_CTRL 0x7866706300000000ull     /* xfer_perf's control messages (perf.h) */

static int count_in(const char *text, const char *what)
{
    int n = 0;

    for (const char *p = text; (p = strstr(p, what)) != NULL; p++) {
        n++;
    }
    return n;
}

/* A port scanner, a peer speaking HTTP, an xfer client that goes away before its parameters
 * and one that sends a garbage control message: the server logs each and serves the real
 * client that comes next. Every process runs under timeout(1). */
Test(listener, perf_server_outlives_bad_clients)
{
    static const char http[] = "GET / HTTP/1.0\r\n\r\n";
    char cmd[1024], line[256], errpath[512], address[64], *out = NULL, *err;
    xfer_endpoint_t *ep = NULL;
    xfer_request_t *req = NULL;
    const char *build = getenv("XFERTEST_BUILD_DIR");
    xfer_context_t *ctx;
    unsigned port = 0;
    FILE *server, *f;
    double end;
    int fd, rc, done = 0;

    cr_assert_not_null(build, "XFERTEST_BUILD_DIR is not set: run the tests with 'make check'");
    unsetenv("XFER_TCP_IFACE");
    setenv("XFER_TRANSPORTS", "tcp", 1);
    snprintf(errpath, sizeof(errpath), "%s/perf_server.err", bootstrap_dir);
    snprintf(cmd, sizeof(cmd), "timeout 50 %s/contrib/xfer_perf -x tcp -p 0 2>%s", build,
             errpath);
    server = popen(cmd, "r");
    cr_assert_not_null(server);
    cr_assert_not_null(fgets(line, sizeof(line), server), "the server printed nothing");
    cr_assert_eq(sscanf(line, "# xfer_perf server: listening on port %u", &port), 1, "%s",
                 line);
    snprintf(address, sizeof(address), "127.0.0.1:%u", port);

    /* connect and close; connect and speak HTTP */
    {
        struct sockaddr_in sa = {0};

        sa.sin_family      = AF_INET;
        sa.sin_port        = htons((uint16_t)port);
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        for (int i = 0; i < 2; i++) {
            fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
            cr_assert_eq(connect(fd, (struct sockaddr*)&sa, sizeof(sa)), 0);
            if (i == 1) {
                cr_assert_eq(write(fd, http, sizeof(http) - 1), (ssize_t)sizeof(http) - 1);
            }
            close(fd);
        }
    }
    /* an xfer client that leaves before sending its parameters */
    cr_assert_eq(tu_context(0, &ctx), XFER_OK);
    cr_assert_eq(xfer_connect(ctx, address, &ep), XFER_OK);
    xfer_endpoint_close(ep);
    /* one that sends garbage on the control tag and waits for the server to drop it */
    cr_assert_eq(xfer_connect(ctx, address, &ep), XFER_OK);
    rc = xfer_tag_send(ep, PERF_TAG_CTRL, "garbage!", 8, NULL, NULL, NULL, &req);
    cr_assert((rc == XFER_OK) || (rc == XFER_INPROGRESS), "%s", xfer_status_string(rc));
    cr_assert_eq(xfer_request_wait(req, 10000), XFER_OK);
    xfer_request_release(req);
    for (end = now_ms() + 10000; xfer_endpoint_status(ep) == XFER_OK;) {
        cr_assert_lt(now_ms(), end, "the server kept a client that sent garbage");
        xfer_progress(ctx);
        usleep(1000);
    }
    xfer_endpoint_close(ep);
    xfer_context_destroy(ctx);

    /* the real client is served, and the server exits after it, content */
    snprintf(cmd, sizeof(cmd), "timeout 40 %s/contrib/xfer_perf -x tcp -t tag_lat -s 8 -n 100 "
             "-p %u 127.0.0.1", build, port);
    rc = tu_run(cmd, 1, &out);
    cr_expect_eq(rc, 0, "the client failed:\n%s", out);
    cr_expect(strstr(out, "tag_lat") != NULL, "%s", out);
    free(out);
    /* read its output to the end: a pipe closed early would kill it with SIGPIPE */
    while (fgets(line, sizeof(line), server) != NULL) {
        done |= (strncmp(line, "# done", 6) == 0);
    }
    rc = pclose(server);
    f  = fopen(errpath, "r");
    cr_assert_not_null(f);
    err = calloc(1, 65536);
    cr_assert_not_null(err);
    (void)!fread(err, 1, 65535, f);
    fclose(f);
    cr_expect_eq(rc, 0, "the server did not end well (%d):\n%s", rc, err);
    cr_expect(done, "the server did not say '# done'");
    /* one xfer_accept call may meet both failures: the library logs each */
    cr_expect_eq(count_in(err, "closing connection from 127.0.0.1:"), 2, "%s", err);
    cr_expect_geq(count_in(err, "failed its handshake"), 1, "%s", err);
    cr_expect_eq(count_in(err, "sent no valid parameters"), 2, "%s", err);
    cr_expect(strstr(err, "not an xfer_perf v") != NULL, "%s", err);
    cr_expect(strstr(err, " control message (") != NULL, "%s", err);
    free(err);
}
