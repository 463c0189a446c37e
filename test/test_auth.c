/*
 * Who may connect: a server with a key (framework/auth.h) admits only peers that prove it,
 * over the real transport of the run. Peers without the key, with a wrong key, a replayed
 * handshake (a real client's bytes, recorded and sent again), a handshake changed on its way
 * between two real peers (a relay that alters the client's HELLO after the proofs) and a
 * downgrade (a client with a key facing a server that does not prove it) are all refused; the
 * server gives none of them a transport resource - no descriptor, no lane port - and logs
 * each; an honest client beside them connects and moves a message. The key comes from
 * XFER_AUTH_KEY_FILE in the clients and from the context parameters in the server.
 *
 * The relay (tp_relay_spawn) and the replaying client are raw sockets in child processes.
 */
#include "test_peer.h"
#include "test_util.h"
#include "../components/tcp/tcp_wire.h"
#include "../framework/wire/bootstrap_wire.h"

#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define TAG 0x61757468u

static const char key_a[] = "the shared key of this test: 0123456789";
static const char key_b[] = "another key, which the server does not hold";
static char key_file_a[64], key_file_b[64];

static void write_key(char *path, const char *key, const char *name)
{
    int fd;

    snprintf(path, 64, "/tmp/xfertest_auth_%s.%d", name, (int)getpid());
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, key, strlen(key)), (ssize_t)strlen(key));
    close(fd);
}

static void setup(void)
{
    tp_env();
    write_key(key_file_a, key_a, "a");
    write_key(key_file_b, key_b, "b");
}

static void teardown(void)
{
    unlink(key_file_a);
    unlink(key_file_b);
}

TestSuite(auth, .init = setup, .fini = teardown, .timeout = 120);

/* ---- the server: this process ---------------------------------------------------------------- */

typedef struct server {
    xfer_context_t  *ctx;
    xfer_listener_t *listener;
    uint16_t        port;
} server_t;

static void server_start(server_t *s, const char *key)
{
    xfer_context_params_t params = {.size = sizeof(params)};

    params.auth_key     = key;
    params.auth_key_len = key ? strlen(key) : 0;
    cr_assert_eq(xfer_context_create(&params, &s->ctx), XFER_OK, "%s", xfer_last_error());
    cr_assert_eq(xfer_listen(s->ctx, "127.0.0.1:0", &s->listener), XFER_OK);
    s->port = xfer_listener_port(s->listener);
}

static void server_stop(server_t *s)
{
    xfer_listener_close(s->listener);
    xfer_context_destroy(s->ctx);
}

/* ---- the honest client (a child: tp_hi_client_spawn) ---------------------------------------- */

/* The honest client's whole session: connected, its message received. */
static void honest_client_is_served(server_t *s)
{
    pid_t pid = tp_hi_client_spawn(s->port, "XFER_AUTH_KEY_FILE", key_file_a);
    xfer_endpoint_t *ep;
    xfer_request_t *req = NULL;
    char buf[8] = "";

    cr_assert_eq(tp_accept_next(s->listener, &ep), XFER_OK, "the honest client was not "
                 "admitted: %s", xfer_last_error());
    cr_assert_eq(xfer_tag_recv(s->ctx, ep, TP_TAG_HI, UINT64_MAX, buf, sizeof(buf), NULL, NULL,
                               NULL, &req), XFER_OK);
    cr_expect_eq(tp_op_result(XFER_OK, req, TP_WAIT_MS), XFER_OK);
    cr_expect_str_eq(buf, "hi");
    cr_expect_eq(tp_exit_code(pid), 0);
    xfer_endpoint_close(ep);
}

/* ---- a replay ------------------------------------------------------------------------------- */

/* Send the bytes of path to port at once, then wait for the server to close. */
static pid_t replay_spawn(const char *path, uint16_t port)
{
    pid_t pid = fork();

    cr_assert_geq(pid, 0);
    if (pid == 0) {
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
        int fd = socket(AF_INET, SOCK_STREAM, 0), in = open(path, O_RDONLY);
        char buf[65536], sink[4096];
        ssize_t n;

        alarm(TP_CHILD_ALARM_S);
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if ((fd < 0) || (in < 0) || (connect(fd, (struct sockaddr*)&sa, sizeof(sa)) != 0)) {
            _exit(40);
        }
        n = read(in, buf, sizeof(buf));
        if ((n <= 0) || (send(fd, buf, (size_t)n, MSG_NOSIGNAL) != n)) {
            _exit(41);
        }
        while (read(fd, sink, sizeof(sink)) > 0) {
        }
        _exit(0);
    }
    return pid;
}

/* No descriptor and no listening socket more than before: nothing was given to the peer. */
typedef struct baseline {
    int fds, listening;
} baseline_t;

static void baseline_take(baseline_t *b)
{
    struct sockaddr_storage ss[16];

    b->fds       = tu_fd_count();
    b->listening = tu_listening_sockets(ss, 16);
}

static void expect_nothing_given(const baseline_t *b, const char *who)
{
    struct sockaddr_storage ss[16];

    cr_expect_eq(tu_fd_count(), b->fds, "%s: %d descriptors open, %d before", who,
                 tu_fd_count(), b->fds);
    cr_expect_eq(tu_listening_sockets(ss, 16), b->listening, "%s: a transport opened a "
                 "listening socket for it", who);
}

/* ---- the tests ------------------------------------------------------------------------------- */

/* No key, a wrong key: refused before anything is created for them, each logged with its
 * address; the honest client next is served. */
Test(auth, peers_without_the_key_or_with_another_are_refused, .init = cr_redirect_stderr)
{
    xfer_endpoint_t *ep;
    baseline_t b;
    server_t s;
    pid_t pid;
    char *log;

    server_start(&s, key_a);
    baseline_take(&b);
    pid = tp_hi_client_spawn(s.port, "XFER_AUTH_KEY_FILE", NULL);
    cr_expect_eq(tp_accept_next(s.listener, &ep), XFER_ERR_DENIED);
    cr_expect_eq(tp_exit_code(pid), 20 - XFER_ERR_DENIED, "a client without the key");
    expect_nothing_given(&b, "a client without the key");
    pid = tp_hi_client_spawn(s.port, "XFER_AUTH_KEY_FILE", key_file_b);
    cr_expect_neq(tp_accept_next(s.listener, &ep), XFER_OK);
    cr_expect_null(ep);
    cr_expect_eq(tp_exit_code(pid), 20 - XFER_ERR_DENIED, "a client with another key");
    expect_nothing_given(&b, "a client with another key");
    honest_client_is_served(&s);
    server_stop(&s);
    log = tu_read_redirected_stderr();
    cr_expect(strstr(log, "closing connection from 127.0.0.1:") != NULL, "%s", log);
    cr_expect(strstr(log, "prove its key") != NULL, "%s", log);
    free(log);
}

/* A real client's handshake through a relay that records it; its bytes sent again on a new
 * connection are refused: the server's nonce is new, so the recorded proof fits nothing. */
Test(auth, a_replayed_handshake_is_refused)
{
    char record[64];
    xfer_endpoint_t *ep;
    uint16_t relay_port;
    pid_t relay, client, replay;
    baseline_t b;
    server_t s;

    snprintf(record, sizeof(record), "/tmp/xfertest_auth_rec.%d", (int)getpid());
    server_start(&s, key_a);
    relay  = tp_relay_spawn(s.port, record, -1, &relay_port);
    client = tp_hi_client_spawn(relay_port, "XFER_AUTH_KEY_FILE", key_file_a);
    cr_assert_eq(tp_accept_next(s.listener, &ep), XFER_OK, "through the relay: %s",
                 xfer_last_error());
    cr_expect_eq(tp_exit_code(client), 0);
    xfer_endpoint_close(ep);
    (void)tp_exit_code(relay);
    baseline_take(&b);
    replay = replay_spawn(record, s.port);
    cr_expect_eq(tp_accept_next(s.listener, &ep), XFER_ERR_DENIED, "the replay was not denied");
    cr_expect_null(ep);
    cr_expect_eq(tp_exit_code(replay), 0);
    expect_nothing_given(&b, "a replayed handshake");
    honest_client_is_served(&s);
    server_stop(&s);
    unlink(record);
}

/* Between two real peers with the key, a relay changes one byte of the client's HELLO after
 * the proofs (a transport name it offers): the server refuses the changed HELLO before it
 * creates anything, and the client fails too. */
Test(auth, a_handshake_changed_between_two_real_peers_is_refused)
{
    xfer_endpoint_t *ep;
    uint16_t relay_port;
    pid_t relay, client;
    baseline_t b;
    server_t s;

    server_start(&s, key_a);
    baseline_take(&b);
    /* the client's AUTH_NONCE is 44 bytes; its HELLO starts there: 12 of header, 2 of count,
     * 1 of name length, then the first transport's name */
    relay  = tp_relay_spawn(s.port, NULL, 44 + 12 + 2 + 1, &relay_port);
    client = tp_hi_client_spawn(relay_port, "XFER_AUTH_KEY_FILE", key_file_a);
    cr_expect_eq(tp_accept_next(s.listener, &ep), XFER_ERR_DENIED);
    cr_expect_null(ep);
    cr_expect_neq(tp_exit_code(client), 0, "the client connected through a changed handshake");
    (void)tp_exit_code(relay);
    expect_nothing_given(&b, "a changed handshake");
    honest_client_is_served(&s);
    server_stop(&s);
}

/* A downgrade: a client with the key facing a server without one (which refuses to prove
 * anything), or a fake one that answers with a plain HELLO, fails with XFER_ERR_DENIED; it
 * never talks to a server that did not prove the key. */
Test(auth, a_client_with_the_key_never_connects_without_proof)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t len = sizeof(sa);
    xfer_endpoint_t *ep;
    uint8_t frame[64];
    server_t s;
    pid_t pid;
    int fd, c;

    server_start(&s, NULL);     /* no key */
    pid = tp_hi_client_spawn(s.port, "XFER_AUTH_KEY_FILE", key_file_a);
    cr_expect_eq(tp_accept_next(s.listener, &ep), XFER_ERR_DENIED);
    cr_expect_eq(tp_exit_code(pid), 20 - XFER_ERR_DENIED);
    server_stop(&s);

    /* a fake server: whatever the client sends, the answer is a bare HELLO (no transports) */
    fd = socket(AF_INET, SOCK_STREAM, 0);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert((bind(fd, (struct sockaddr*)&sa, sizeof(sa)) == 0) && (listen(fd, 1) == 0) &&
              (getsockname(fd, (struct sockaddr*)&sa, &len) == 0));
    pid = tp_hi_client_spawn(ntohs(sa.sin_port), "XFER_AUTH_KEY_FILE", key_file_a);
    c   = accept(fd, NULL, NULL);
    cr_assert_geq(c, 0);
    memcpy(frame, "\x58\x46\x45\x52\x00\x01\x00\x01\x00\x00\x00\x02\x00\x00", 14);
    cr_assert_eq(send(c, frame, 14, MSG_NOSIGNAL), 14);
    cr_expect_eq(tp_exit_code(pid), 20 - XFER_ERR_DENIED, "the client went on without proof");
    close(c);
    close(fd);
}

/* A key file that others may read is refused at context creation, saying why. */
Test(auth, a_key_file_others_may_read_is_refused, .init = cr_redirect_stderr)
{
    xfer_context_t *ctx = NULL;
    char *log;

    cr_assert_eq(chmod(key_file_a, 0644), 0);
    setenv("XFER_AUTH_KEY_FILE", key_file_a, 1);
    cr_expect_eq(xfer_context_create(NULL, &ctx), XFER_ERR_INVALID_PARAM);
    setenv("XFER_AUTH_KEY_FILE", "/nonexistent/key", 1);
    cr_expect_eq(xfer_context_create(NULL, &ctx), XFER_ERR_INVALID_PARAM);
    unsetenv("XFER_AUTH_KEY_FILE");
    log = tu_read_redirected_stderr();
    cr_expect(strstr(log, "others may read or change it (mode 644)") != NULL, "%s", log);
    cr_expect(strstr(log, "/nonexistent/key: No such file or directory") != NULL, "%s", log);
    free(log);
}

/* ---- who may fetch --------------------------------------------------------------------------- */

static xfer_endpoint_t *insider;

static int only_insider_gets_secrets(xfer_endpoint_t *ep, uint64_t step, const char *key,
                                     size_t key_len, void *arg)
{
    (void)step;
    (void)arg;
    return (ep == insider) || (key_len != 6) || (memcmp(key, "secret", 6) != 0);
}

/* A fetcher child: fetch each of keys (at steps) in turn; exit code: bit i set when fetch i
 * ended with want[i]. */
static pid_t fetcher_spawn(uint16_t port, const char *const *keys, const uint64_t *steps,
                           const xfer_status_t *want, int n)
{
    pid_t pid = fork();

    cr_assert_geq(pid, 0);
    if (pid == 0) {
        xfer_endpoint_t *ep = NULL;
        xfer_context_t *ctx;
        char addr[64], buf[64];
        int bits = 0;

        alarm(TP_CHILD_ALARM_S);
        snprintf(addr, sizeof(addr), "127.0.0.1:%u", port);
        if ((xfer_context_create(NULL, &ctx) != XFER_OK) ||
            (xfer_connect(ctx, addr, &ep) != XFER_OK)) {
            _exit(99);
        }
        for (int i = 0; i < n; i++) {
            xfer_fetch_params_t fp = {.size = sizeof(fp), .buffer = buf,
                                      .capacity = sizeof(buf)};
            xfer_request_t *req = NULL;
            xfer_status_t st = xfer_tensor_fetch(ep, steps[i], keys[i], &fp, NULL, NULL, &req);

            st = tp_op_result(st, req, TP_WAIT_MS);
            bits |= (st == want[i]) << i;
        }
        xfer_endpoint_close(ep);
        xfer_context_destroy(ctx);
        _exit(bits);
    }
    return pid;
}

/* The producer keeps "secret" for one peer: the other's fetch of it ends exactly as its fetch
 * of a key nobody published (XFER_ERR_TIMEOUT, after XFER_TENSOR_REQUEST_TIMEOUT), so it
 * cannot tell the secret exists; the insider gets it, and both get "public". */
Test(auth, a_tensor_outside_a_peers_scope_is_not_fetched_nor_revealed)
{
    static const char *const outsider_keys[] = {"secret", "nothere", "public"};
    static const uint64_t outsider_steps[]   = {1, 1, 2};
    static const xfer_status_t outsider_want[] = {XFER_ERR_TIMEOUT, XFER_ERR_TIMEOUT, XFER_OK};
    static const char *const insider_keys[] = {"public", "secret"};
    static const uint64_t insider_steps[]   = {1, 1};
    static const xfer_status_t insider_want[] = {XFER_OK, XFER_OK};
    xfer_request_t *pub[3] = {NULL, NULL, NULL};
    uint8_t data[3][16];
    xfer_endpoint_t *outsider;
    pid_t a, b;
    int done_a = 0, done_b = 0, st;
    server_t s;

    setenv("XFER_TENSOR_REQUEST_TIMEOUT", "1s", 1);
    server_start(&s, NULL);
    cr_assert_eq(xfer_tensor_access_set(s.ctx, only_insider_gets_secrets, NULL), XFER_OK);
    for (int i = 0; i < 3; i++) {
        xfer_tensor_t t = {.dtype = XFER_DTYPE_UINT8, .rank = 1, .size = sizeof(data[i]),
                           .data = data[i]};

        t.dims[0] = sizeof(data[i]);
        memset(data[i], i + 1, sizeof(data[i]));
        cr_assert_eq(xfer_tensor_publish(s.ctx, (i == 2) ? 2 : 1, (i == 0) ? "secret" : "public",
                                         &t, 0, NULL, NULL, &pub[i]), XFER_OK);
    }
    /* the outsider connects first and asks for the secret before the insider can take it */
    b = fetcher_spawn(s.port, outsider_keys, outsider_steps, outsider_want, 3);
    cr_assert_eq(tp_accept_next(s.listener, &outsider), XFER_OK);
    a = fetcher_spawn(s.port, insider_keys, insider_steps, insider_want, 2);
    cr_assert_eq(tp_accept_next(s.listener, &insider), XFER_OK);
    for (double end = tp_now_ms() + 4 * TP_WAIT_MS; !(done_a && done_b) && (tp_now_ms() < end);) {
        (void)xfer_progress(s.ctx);
        if (!done_a && (waitpid(a, &st, WNOHANG) == a)) {
            done_a = 1;
            cr_expect(WIFEXITED(st) && (WEXITSTATUS(st) == 3), "the insider's fetches: %#x",
                      WEXITSTATUS(st));
        }
        if (!done_b && (waitpid(b, &st, WNOHANG) == b)) {
            done_b = 1;
            cr_expect(WIFEXITED(st) && (WEXITSTATUS(st) == 7), "the outsider's fetches "
                      "(bit 0: the secret looked absent, 1: as absent as a missing key, 2: "
                      "public): %#x", WEXITSTATUS(st));
        }
    }
    cr_assert(done_a && done_b, "a fetcher did not finish");
    for (int i = 0; i < 3; i++) {
        cr_expect_eq(tp_op_result(XFER_OK, pub[i], TP_WAIT_MS), XFER_OK, "publish %d", i);
    }
    xfer_endpoint_close(outsider);
    xfer_endpoint_close(insider);
    server_stop(&s);
    unsetenv("XFER_TENSOR_REQUEST_TIMEOUT");
}

/* The access callback runs inside the tensor engine, which walks the asking endpoint's
 * requests: every call from it into xfer is refused, closing that endpoint included, and the
 * request goes on as the callback's answer says. */
typedef struct access_probe {
    xfer_context_t *ctx;
    int            calls;
    unsigned       progressed;
    xfer_status_t  close_status, send_status, publish_status, abort_status;
} access_probe_t;

static int probing_access(xfer_endpoint_t *ep, uint64_t step, const char *key, size_t key_len,
                          void *arg)
{
    access_probe_t *a = arg;
    xfer_tensor_t t   = {.dtype = XFER_DTYPE_UINT8, .rank = 1, .size = 1, .data = "x"};
    xfer_request_t *req = NULL;

    (void)step;
    (void)key;
    (void)key_len;
    t.dims[0]         = 1;
    a->calls++;
    a->progressed     = xfer_progress(a->ctx);
    a->close_status   = xfer_endpoint_close_nb(ep, 0, NULL, NULL, &req);
    a->send_status    = xfer_tag_send(ep, TAG, "no", 3, NULL, NULL, NULL, NULL);
    a->publish_status = xfer_tensor_publish(a->ctx, 9, "other", &t, XFER_PUBLISH_COPY, NULL,
                                            NULL, NULL);
    a->abort_status   = xfer_tensor_abort(a->ctx, 1, XFER_ERR_ABORTED);
    xfer_endpoint_close(ep);
    return 1;
}

Test(auth, the_access_callback_cannot_call_into_xfer, .init = cr_redirect_stderr)
{
    static const char *const keys[]   = {"public", "public"};
    static const uint64_t steps[]     = {1, 2};
    static const xfer_status_t want[] = {XFER_OK, XFER_OK};
    xfer_request_t *pub[2] = {NULL, NULL};
    access_probe_t a = {0};
    uint8_t data[16];
    xfer_endpoint_t *ep;
    int st = -1, done = 0;
    server_t s;
    pid_t pid;

    server_start(&s, NULL);
    a.ctx = s.ctx;
    cr_assert_eq(xfer_tensor_access_set(s.ctx, probing_access, &a), XFER_OK);
    memset(data, 7, sizeof(data));
    for (int i = 0; i < 2; i++) {
        xfer_tensor_t t = {.dtype = XFER_DTYPE_UINT8, .rank = 1, .size = sizeof(data),
                           .data = data};

        t.dims[0] = sizeof(data);
        cr_assert_eq(xfer_tensor_publish(s.ctx, steps[i], keys[i], &t, 0, NULL, NULL, &pub[i]),
                     XFER_OK);
    }
    pid = fetcher_spawn(s.port, keys, steps, want, 2);
    cr_assert_eq(tp_accept_next(s.listener, &ep), XFER_OK);
    for (double end = tp_now_ms() + 2 * TP_WAIT_MS; !done && (tp_now_ms() < end);) {
        (void)xfer_progress(s.ctx);
        done = (waitpid(pid, &st, WNOHANG) == pid);
    }
    cr_assert(done, "the fetcher did not finish");
    cr_expect(WIFEXITED(st) && (WEXITSTATUS(st) == 3), "its fetches (bit i: fetch i got the "
              "tensor): %#x", WEXITSTATUS(st));
    cr_expect_eq(a.calls, 2, "the callback ran %d times", a.calls);
    cr_expect_eq(a.progressed, 0u);
    cr_expect_eq(a.close_status, XFER_ERR_BUSY, "close_nb: %s",
                 xfer_status_string(a.close_status));
    cr_expect_eq(a.send_status, XFER_ERR_BUSY);
    cr_expect_eq(a.publish_status, XFER_ERR_BUSY);
    cr_expect_eq(a.abort_status, XFER_ERR_BUSY);
    for (int i = 0; i < 2; i++) {
        cr_expect_eq(tp_op_result(XFER_OK, pub[i], TP_WAIT_MS), XFER_OK, "publish %d", i);
    }
    xfer_endpoint_close(ep);
    server_stop(&s);
}

/* ---- lanes ----------------------------------------------------------------------------------- */

/* From the server's bytes of a keyed handshake (path): its tcp endpoint address, found in its
 * CONNECT - what anyone on the path reads. 1 when found. */
static int sniff_ep_addr(const char *path, xfer_tcp_wire_ep_addr_t *addr)
{
    static uint8_t bytes[1 << 16];
    int fd = open(path, O_RDONLY);
    ssize_t n = (fd >= 0) ? read(fd, bytes, sizeof(bytes)) : -1;
    size_t at = 0;

    if (fd >= 0) {
        close(fd);
    }
    while ((n > 0) && (at + XFER_WIRE_HEADER_LEN <= (size_t)n)) {
        xfer_wire_header_t hdr;
        xfer_wire_connect_t conn;
        char why[256];

        if ((xfer_wire_parse_header(bytes + at, (size_t)n - at, &hdr, why, sizeof(why)) !=
             XFER_OK) || (at + XFER_WIRE_HEADER_LEN + hdr.body_len > (size_t)n)) {
            return 0;
        }
        if ((hdr.type == XFER_WIRE_CONNECT) &&
            (xfer_wire_parse_connect(bytes + at + XFER_WIRE_HEADER_LEN, hdr.body_len, &conn,
                                     why, sizeof(why)) == XFER_OK)) {
            return xfer_tcp_wire_unpack_ep_addr(conn.addr, conn.addr_len, addr) == XFER_OK;
        }
        at += XFER_WIRE_HEADER_LEN + hdr.body_len;
    }
    return 0;
}

/* Offer hello (len bytes) on a new connection to the lane port; 1 when the server closed it
 * (progressing the server meanwhile), 0 when it took it. */
static int lane_refused(server_t *s, uint16_t port, const uint8_t *hello, size_t len)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    int fd = socket(AF_INET, SOCK_STREAM, 0), closed = 0;

    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert((fd >= 0) && (connect(fd, (struct sockaddr*)&sa, sizeof(sa)) == 0));
    cr_assert_eq(send(fd, hello, len, MSG_NOSIGNAL), (ssize_t)len);
    for (double end = tp_now_ms() + 3000; !closed && (tp_now_ms() < end);) {
        struct pollfd pfd = {fd, POLLIN, 0};
        char c;

        (void)xfer_progress(s->ctx);
        closed = (poll(&pfd, 1, 1) == 1) && (recv(fd, &c, 1, MSG_DONTWAIT) <= 0);
    }
    close(fd);
    return closed;
}

/* With a key, the token in the endpoint's address - which anyone on the path reads - is not
 * enough to add a lane to it: a hello for a lane it has free (the server takes 4, the client 2)
 * is refused without the endpoint's proof, plain or with a forged one; the real lanes carry on. */
Test(auth, a_lane_without_the_endpoints_proof_is_refused, .init = cr_redirect_stderr)
{
    xfer_tcp_wire_lane_hello_t h = {.lane = 3};
    xfer_tcp_wire_ep_addr_t addr;
    uint8_t hello[XFER_TCP_WIRE_LANE_HELLO_MAX];
    xfer_endpoint_t *ep;
    xfer_request_t *req = NULL;
    char record[64], back[80], buf[8] = "";
    uint16_t relay_port;
    pid_t relay, client;
    server_t s;
    char *log;
    int st;

    if (strcmp(tp_transport(), "tcp") != 0) {
        cr_skip_test("lanes are the tcp transport's; this run is over %s", tp_transport());
    }
    snprintf(record, sizeof(record), "/tmp/xfertest_auth_lane.%d", (int)getpid());
    snprintf(back, sizeof(back), "%s.back", record);
    setenv("XFER_TCP_LANES", "4", 1);
    server_start(&s, key_a);
    setenv("XFER_TCP_LANES", "2", 1);       /* the client's: lanes 2 and 3 stay free */
    relay  = tp_relay_spawn(s.port, record, -1, &relay_port);
    client = fork();
    cr_assert_geq(client, 0);
    if (client == 0) {
        /* connect, then wait for the parent's word (its tag 2) before the message */
        xfer_context_t *ctx;
        xfer_endpoint_t *cep = NULL;
        xfer_request_t *r = NULL;
        char a[64], w[2];
        xfer_status_t rc;

        alarm(TP_CHILD_ALARM_S);
        setenv("XFER_AUTH_KEY_FILE", key_file_a, 1);
        snprintf(a, sizeof(a), "127.0.0.1:%u", relay_port);
        if ((xfer_context_create(NULL, &ctx) != XFER_OK) ||
            (xfer_connect(ctx, a, &cep) != XFER_OK) ||
            (xfer_tag_recv(ctx, cep, 2, UINT64_MAX, w, sizeof(w), NULL, NULL, NULL, &r) !=
             XFER_OK) || (tp_op_result(XFER_OK, r, TP_WAIT_MS) != XFER_OK)) {
            _exit(50);
        }
        r  = NULL;
        rc = xfer_tag_send(cep, TAG, "hi", 3, NULL, NULL, NULL, &r);
        rc = tp_op_result(rc, r, TP_WAIT_MS);
        _exit((rc == XFER_OK) ? 0 : 60 - rc);
    }
    cr_assert_eq(tp_accept_next(s.listener, &ep), XFER_OK, "%s", xfer_last_error());
    cr_assert(sniff_ep_addr(back, &addr), "no tcp endpoint address in the server's bytes");
    cr_assert_gt(addr.lane_port, 0);
    h.token = addr.token;
    xfer_tcp_wire_pack_lane_hello(&h, hello);
    cr_expect(lane_refused(&s, addr.lane_port, hello, XFER_TCP_WIRE_LANE_HELLO_LEN),
              "a plain hello with the sniffed token was taken as lane 3");
    h.proven = 1;
    xfer_tcp_wire_pack_lane_hello(&h, hello);
    memset(hello + XFER_TCP_WIRE_LANE_HELLO_LEN, 0x5a, XFER_TCP_WIRE_LANE_PROOF_LEN);
    cr_expect(lane_refused(&s, addr.lane_port, hello, sizeof(hello)),
              "a hello with a forged proof was taken as lane 3");
    /* the endpoint and its real lanes carry on */
    cr_assert_eq(xfer_tag_send(ep, 2, "g", 2, NULL, NULL, NULL, &req), XFER_OK);
    cr_expect_eq(tp_op_result(XFER_OK, req, TP_WAIT_MS), XFER_OK);
    req = NULL;
    cr_assert_eq(xfer_tag_recv(s.ctx, ep, TAG, UINT64_MAX, buf, sizeof(buf), NULL, NULL, NULL,
                               &req), XFER_OK);
    cr_expect_eq(tp_op_result(XFER_OK, req, TP_WAIT_MS), XFER_OK);
    cr_expect_str_eq(buf, "hi");
    st = tp_exit_code(client);
    cr_expect_eq(st, 0, "the client failed (%d)", st);
    xfer_endpoint_close(ep);
    (void)tp_exit_code(relay);
    server_stop(&s);
    unsetenv("XFER_TCP_LANES");
    unlink(record);
    unlink(back);
    log = tu_read_redirected_stderr();
    cr_expect_eq(tu_count_in(log, "lane 3 does not prove its endpoint's secret"), 2, "%s", log);
    free(log);
}
