/*
 * Bootstrap over real loopback sockets between two processes: negotiation (shared transport,
 * none shared, order; a transport whose iface does not reach the peer, skipped by the server
 * or refused by the client), and peers that lie or stall - wrong magic, wrong version,
 * truncated and oversized frames, random bytes, silence, a refused port. The listener must
 * keep working after each bad peer, and nothing may wait longer than XFER_BOOTSTRAP_TIMEOUT.
 * test_listener.c has the handshakes that run side by side.
 */
#include "bootstrap_fixture.h"
#include "test_util.h"
#include "../framework/wire/bootstrap_wire.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

TestSuite(bootstrap, .init = bootstrap_setup, .fini = bootstrap_teardown, .timeout = 60);

/* A raw TCP client that sends the given bytes, optionally stays silent, then closes. */
static pid_t raw_client_spawn(const char *address, const void *bytes, size_t len, int linger_s)
{
    pid_t pid = fork();

    cr_assert_geq(pid, 0);
    if (pid == 0) {
        struct sockaddr_in sa = {0};
        int fd = socket(AF_INET, SOCK_STREAM, 0);

        sa.sin_family      = AF_INET;
        sa.sin_port        = htons((uint16_t)atoi(strchr(address, ':') + 1));
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (connect(fd, (struct sockaddr*)&sa, sizeof(sa)) != 0) {
            _exit(1);
        }
        if ((len > 0) && (write(fd, bytes, len) != (ssize_t)len)) {
            _exit(2);
        }
        sleep((unsigned)linger_s);
        close(fd);
        _exit(0);
    }
    return pid;
}

Test(bootstrap, shared_transport_is_chosen_on_both_sides)
{
    listener_ctx_t s;
    xfer_endpoint_t *ep;
    pid_t child;

    setenv("XFER_TBETA_BANDWIDTH", "50000", 1);  /* tbeta outranks tcp and talpha */
    server_start(&s);
    child = client_spawn(s.address, NULL, "tbeta", XFER_OK);
    cr_assert_eq(xfer_accept(s.listener, 10000, &ep), XFER_OK);
    cr_expect_str_eq(xfer_endpoint_transport(ep), "tbeta");
    cr_expect(strncmp(xfer_endpoint_peer(ep), "127.0.0.1:", 10) == 0, "%s",
              xfer_endpoint_peer(ep));
    cr_expect_eq(child_exit(child), 0);
    xfer_endpoint_close(ep);
    server_stop(&s);
}

Test(bootstrap, client_preference_order_decides)
{
    listener_ctx_t s;
    xfer_endpoint_t *ep;
    pid_t child;

    setenv("XFER_TBETA_BANDWIDTH", "50000", 1);
    server_start(&s);
    /* the client restricts and orders; the server offers everything */
    child = client_spawn(s.address, "talpha,tbeta", "talpha", XFER_OK);
    cr_assert_eq(xfer_accept(s.listener, 10000, &ep), XFER_OK);
    cr_expect_str_eq(xfer_endpoint_transport(ep), "talpha");
    cr_expect_eq(child_exit(child), 0);
    xfer_endpoint_close(ep);
    server_stop(&s);
}

Test(bootstrap, no_shared_transport_fails_on_both_sides, .init = cr_redirect_stderr)
{
    listener_ctx_t s;
    xfer_endpoint_t *ep = NULL;
    char buf[8192] = "";
    pid_t child;
    size_t n;

    setenv("XFER_TRANSPORTS", "talpha", 1);
    server_start(&s);
    child = client_spawn(s.address, "tbeta", "", XFER_ERR_UNREACHABLE);
    cr_expect_eq(xfer_accept(s.listener, 10000, &ep), XFER_ERR_UNREACHABLE);
    cr_expect_null(ep);
    cr_expect_eq(child_exit(child), 0, "the client must fail with XFER_ERR_UNREACHABLE");
    server_stop(&s);
    fflush(stderr);
    n      = fread(buf, 1, sizeof(buf) - 1, cr_get_redirected_stderr());
    buf[n] = '\0';
    cr_expect(strstr(buf, "no shared transport: client offered tbeta; server offered talpha") !=
              NULL, "%s", buf);
}

#define expect_logged(_log, _part) \
    cr_expect(strstr((_log), (_part)) != NULL, "the log lacks '%s':\n%s", (_part), (_log))

/* The server's iface of tbeta says the client is out of reach (XFER_TBETA_UNREACHABLE, as
 * shm's would for a peer on another host): tbeta, which the client prefers, is skipped and
 * talpha chosen on both sides; the server says why at INFO. */
Test(bootstrap, unreachable_transport_is_skipped_for_the_next, .init = cr_redirect_stderr)
{
    listener_ctx_t s;
    xfer_endpoint_t *ep;
    pid_t child;
    char *log;

    setenv("XFER_TBETA_BANDWIDTH", "50000", 1);  /* tbeta first in both offers */
    setenv("XFER_TBETA_UNREACHABLE", "y", 1);
    setenv("XFER_LOG_LEVEL", "info", 1);
    server_start(&s);
    child = client_spawn(s.address, NULL, "talpha", XFER_OK);
    cr_assert_eq(xfer_accept(s.listener, 10000, &ep), XFER_OK);
    cr_expect_str_eq(xfer_endpoint_transport(ep), "talpha");
    cr_expect_eq(child_exit(child), 0, "the client must be connected over talpha");
    xfer_endpoint_close(ep);
    server_stop(&s);
    log = tu_read_redirected_stderr();
    expect_logged(log, ": skipping tbeta, which does not reach it: refused by "
                       "XFER_TBETA_UNREACHABLE\n");
    expect_logged(log, "over talpha\n");
    free(log);
}

/* talpha lacks INTER_HOST, as shm does, and is faster; tbeta reaches other hosts: the offer
 * puts talpha first, since which peers a transport reaches is decided per peer at connect,
 * not ranked. */
Test(bootstrap, reaching_other_hosts_does_not_rank_the_offer)
{
    listener_ctx_t s;
    xfer_endpoint_t *ep;
    pid_t child;

    setenv("XFER_TALPHA_BANDWIDTH", "50000", 1);
    setenv("XFER_TBETA_CAPS", "TAG,MEM_HOST,INTER_HOST", 1);
    server_start(&s);
    child = client_spawn(s.address, NULL, "talpha", XFER_OK);
    cr_assert_eq(xfer_accept(s.listener, 10000, &ep), XFER_OK);
    cr_expect_str_eq(xfer_endpoint_transport(ep), "talpha");
    cr_expect_eq(child_exit(child), 0, "the client must be connected over talpha");
    xfer_endpoint_close(ep);
    server_stop(&s);
}

/* No shared transport reaches the client: both sides fail with XFER_ERR_UNREACHABLE, and the
 * client's error names each transport skipped and why. */
Test(bootstrap, no_reachable_transport_fails_naming_each, .init = cr_redirect_stderr)
{
    listener_ctx_t s;
    xfer_endpoint_t *ep = NULL;
    pid_t child;
    char *log;

    setenv("XFER_TALPHA_UNREACHABLE", "y", 1);
    setenv("XFER_TBETA_UNREACHABLE", "y", 1);
    setenv("XFER_LOG_LEVEL", "info", 1);    /* a refused connect says why at INFO */
    server_start(&s);
    child = client_spawn(s.address, "talpha,tbeta", "", XFER_ERR_UNREACHABLE);
    cr_expect_eq(xfer_accept(s.listener, 10000, &ep), XFER_ERR_UNREACHABLE);
    cr_expect_null(ep);
    cr_expect_eq(child_exit(child), 0, "the client must fail with XFER_ERR_UNREACHABLE");
    server_stop(&s);
    log = tu_read_redirected_stderr();
    expect_logged(log, ": server refused: no shared transport reaches the client: client "
                       "offered talpha,tbeta; server offered talpha,tbeta; talpha unreachable: "
                       "refused by XFER_TALPHA_UNREACHABLE; tbeta unreachable: refused by "
                       "XFER_TBETA_UNREACHABLE (");
    expect_closed_logged(log, XFER_ERR_UNREACHABLE);
    free(log);
}

/* The server reaches the client over talpha, but the client's own iface of talpha says the
 * server is out of reach: the client fails the connect rather than make an endpoint that
 * cannot work, and the server's handshake ends. */
Test(bootstrap, client_refuses_a_transport_it_cannot_reach, .init = cr_redirect_stderr)
{
    listener_ctx_t s;
    xfer_endpoint_t *ep = NULL;
    pid_t child;
    char *log;

    server_start(&s);
    setenv("XFER_TALPHA_UNREACHABLE", "y", 1);  /* the client's alone */
    setenv("XFER_LOG_LEVEL", "info", 1);        /* a refused connect says why at INFO */
    child = client_spawn(s.address, "talpha", "", XFER_ERR_UNREACHABLE);
    cr_expect_neq(xfer_accept(s.listener, 10000, &ep), XFER_OK);
    cr_expect_null(ep);
    cr_expect_eq(child_exit(child), 0, "the client must fail with XFER_ERR_UNREACHABLE");
    server_stop(&s);
    log = tu_read_redirected_stderr();
    expect_logged(log, ": the server chose talpha, which does not reach the server from this "
                       "side: refused by XFER_TALPHA_UNREACHABLE (");
    free(log);
}

/* Run with .init = cr_redirect_stderr: the listener's log line is checked. */
static void expect_bad_peer(const void *bytes, size_t len, int linger_s, xfer_status_t want)
{
    listener_ctx_t s;
    xfer_endpoint_t *ep = NULL;
    pid_t raw, good;
    char *log;

    server_start(&s);
    raw = raw_client_spawn(s.address, bytes, len, linger_s);
    cr_expect_eq(xfer_accept(s.listener, 10000, &ep), want);
    cr_expect_null(ep);
    child_exit(raw);
    /* the listener still serves a good client afterwards */
    good = client_spawn(s.address, "talpha", "talpha", XFER_OK);
    cr_expect_eq(xfer_accept(s.listener, 10000, &ep), XFER_OK);
    cr_expect_eq(child_exit(good), 0);
    xfer_endpoint_close(ep);
    server_stop(&s);
    fflush(stderr);
    log = tu_read_redirected_stderr();
    expect_closed_logged(log, want);
    free(log);
}

Test(bootstrap, http_request_is_refused, .init = cr_redirect_stderr)
{
    static const char http[] = "GET / HTTP/1.0\r\n\r\n";
    expect_bad_peer(http, sizeof(http) - 1, 0, XFER_ERR_PROTOCOL);
}

Test(bootstrap, wrong_version_is_refused, .init = cr_redirect_stderr)
{
    uint8_t frame[64];
    size_t len = sizeof(frame);
    xfer_wire_hello_t hello = {0};

    cr_assert_eq(xfer_wire_pack_hello(&hello, frame, &len), XFER_OK);
    frame[5] = 9;   /* version 9 */
    expect_bad_peer(frame, len, 0, XFER_ERR_PROTOCOL);
}

Test(bootstrap, oversized_frame_is_refused_without_reading_it, .init = cr_redirect_stderr)
{
    uint8_t frame[12] = {'X', 'F', 'E', 'R', 0, 1, 0, 1, 0x7f, 0xff, 0xff, 0xff};
    expect_bad_peer(frame, sizeof(frame), 0, XFER_ERR_PROTOCOL);
}

Test(bootstrap, truncated_frame_fails_fast, .init = cr_redirect_stderr)
{
    uint8_t frame[64];
    size_t len = sizeof(frame);
    xfer_wire_hello_t hello = {0};
    time_t t0 = time(NULL);

    cr_assert_eq(xfer_wire_pack_hello(&hello, frame, &len), XFER_OK);
    expect_bad_peer(frame, len - 1, 0, XFER_ERR_CONNECTION);
    cr_expect_lt(time(NULL) - t0, 5, "a peer that closes must not cost the full timeout");
}

Test(bootstrap, malformed_hello_body_is_refused, .init = cr_redirect_stderr)
{
    /* a valid header announcing 4 bytes of body that claim 200 transports */
    uint8_t frame[16] = {'X', 'F', 'E', 'R', 0, 1, 0, 1, 0, 0, 0, 4, 0, 200, 0, 0};
    expect_bad_peer(frame, sizeof(frame), 0, XFER_ERR_PROTOCOL);
}

Test(bootstrap, random_bytes_are_refused, .init = cr_redirect_stderr)
{
    uint8_t junk[300];
    unsigned seed = 7;

    for (size_t i = 0; i < sizeof(junk); i++) {
        junk[i] = (uint8_t)rand_r(&seed);
    }
    expect_bad_peer(junk, sizeof(junk), 0, XFER_ERR_PROTOCOL);
}

Test(bootstrap, silent_peer_times_out_within_bound, .init = cr_redirect_stderr)
{
    time_t t0 = time(NULL);

    setenv("XFER_BOOTSTRAP_TIMEOUT", "1s", 1);
    expect_bad_peer(NULL, 0, 4, XFER_ERR_TIMEOUT);
    cr_expect_lt(time(NULL) - t0, 4 + 3, "the handshake must give up after about 1 s");
}

Test(bootstrap, accept_times_out_when_nobody_comes)
{
    listener_ctx_t s;
    xfer_endpoint_t *ep = NULL;

    server_start(&s);
    cr_expect_eq(xfer_accept(s.listener, 100, &ep), XFER_ERR_TIMEOUT);
    cr_expect_null(ep);
    server_stop(&s);
}

Test(bootstrap, refused_port_and_bad_addresses)
{
    static const char *const bad[] = {"", "nohostport", "127.0.0.1:", "127.0.0.1:99999",
                                      "127.0.0.1:12ab", "127.0.0.1:0", "[::1:80"};
    listener_ctx_t s;
    xfer_endpoint_t *ep = NULL;
    char addr[64];

    server_start(&s);
    snprintf(addr, sizeof(addr), "%s", s.address);
    xfer_listener_close(s.listener);    /* now nobody listens on that port */
    cr_expect_eq(xfer_connect(s.ctx, addr, &ep), XFER_ERR_CONNECTION);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        cr_expect_eq(xfer_connect(s.ctx, bad[i], &ep), XFER_ERR_INVALID_PARAM, "'%s'", bad[i]);
    }
    cr_expect_eq(xfer_listen(s.ctx, "127.0.0.1:70000", &s.listener), XFER_ERR_INVALID_PARAM);
    cr_expect_null(ep);
    xfer_context_destroy(s.ctx);
}

/* A name that does not resolve, and an address this host does not have, each get a status
 * and a reason that say so - not "invalid parameter" or "input/output error". */
Test(bootstrap, an_unknown_name_and_an_address_not_here_say_what_happened)
{
    xfer_listener_t *l = NULL;
    xfer_endpoint_t *ep = NULL;
    xfer_context_t *ctx;
    xfer_status_t st;

    cr_assert_eq(tu_context(0, &ctx), XFER_OK);
    xfer_last_error_clear();
    st = xfer_connect(ctx, "no.such.host.invalid:80", &ep);
    /* NOT_FOUND from a resolver that answers; UNAVAILABLE where none can be reached */
    cr_expect(st == XFER_ERR_NOT_FOUND || st == XFER_ERR_UNAVAILABLE, "%s",
              xfer_status_string(st));
    cr_expect(strstr(xfer_last_error(), "cannot resolve 'no.such.host.invalid'") != NULL,
              "the reason is '%s'", xfer_last_error());
    cr_expect_null(ep);
    xfer_last_error_clear();
    st = xfer_listen(ctx, "192.0.2.1:0", &l);          /* TEST-NET-1: nobody's address */
    cr_expect_eq(st, XFER_ERR_UNAVAILABLE, "%s", xfer_status_string(st));
    cr_expect(strstr(xfer_last_error(), "192.0.2.1:0: this host has no such address") != NULL,
              "the reason is '%s'", xfer_last_error());
    cr_expect_null(l);
    xfer_context_destroy(ctx);
}

Test(bootstrap, ipv6_loopback)
{
    xfer_context_t *ctx;
    xfer_listener_t *l;
    xfer_endpoint_t *ep;
    char addr[64];
    pid_t child;

    unsetenv("XFER_TCP_IFACE");
    cr_assert_eq(tu_context(0, &ctx), XFER_OK);
    if (xfer_listen(ctx, "[::1]:0", &l) != XFER_OK) {
        xfer_context_destroy(ctx);
        cr_skip_test("no IPv6 loopback on this host");
    }
    snprintf(addr, sizeof(addr), "[::1]:%u", xfer_listener_port(l));
    child = client_spawn(addr, "tcp", "tcp", XFER_OK);
    cr_assert_eq(xfer_accept(l, 10000, &ep), XFER_OK);
    cr_expect_eq(child_exit(child), 0);
    cr_expect(strncmp(xfer_endpoint_peer(ep), "[::1]:", 6) == 0, "%s", xfer_endpoint_peer(ep));
    xfer_endpoint_close(ep);
    xfer_listener_close(l);
    xfer_context_destroy(ctx);
}
