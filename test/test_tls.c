/*
 * tcp's encryption (XFER_TCP_TLS=y, components/tcp/tcp_tls.c) over real sockets and the
 * kernel's real TLS: every connection of an endpoint, lanes included, is sealed by the kernel
 * with TLS 1.3 keys; the bytes between the two processes, recorded by a relay, do not hold
 * the data they carry (and, with TLS off, the same recording does: the check can fail); a
 * peer that does not run TLS is refused; a context without a key, or a kernel without TLS,
 * does not open tcp and says why, rather than send in the clear.
 *
 * The kernel's TLS is a module (tls.ko) that this host's kernel may lack: the tests that
 * need it skip here, saying so, and run in the Soft-RoCE guest (test/verbs_guest.sh), whose
 * Debian kernel has it; the test of the refusal without it runs where it is missing.
 */
#include "test_peer.h"
#include "test_util.h"
#include "../components/tcp/tcp.h"

#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/tls.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define TAG     0x715ull
#define CANARY  "xfer-canary-0123456789abcdef"

static char key_file[64];

static void setup(void)
{
    static const char key[] = "the key of the tls suite: 0123456789abcdef";
    int fd;

    tp_env();
    snprintf(key_file, sizeof(key_file), "/tmp/xfertest_tls_key.%d", (int)getpid());
    fd = open(key_file, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, key, strlen(key)), (ssize_t)strlen(key));
    close(fd);
    setenv("XFER_AUTH_KEY_FILE", key_file, 1);
    setenv("XFER_TCP_TLS", "y", 1);
    setenv("XFER_TCP_LANES", "1", 1);
    /* the handshake's ECDHE under an emulated CPU, and valgrind, takes longer than the 2 s
     * default allows a real one */
    setenv("XFER_TCP_TLS_TIMEOUT", (tp_slowdown() > 1) ? "60s" : "20s", 1);
}

static void teardown(void)
{
    unlink(key_file);
}

TestSuite(tls, .init = setup, .fini = teardown, .timeout = 180);

/* Does this kernel seal TCP in TLS? The component's own probe (tcp_tls.c). */
static int kernel_has_tls(void)
{
    char why[256];

    return xfer_tcp_tls_probe(why, sizeof(why)) == XFER_OK;
}

static void need_tcp(void)
{
    if (strcmp(tp_transport(), "tcp") != 0) {
        cr_skip_test("XFER_TCP_TLS is the tcp transport's; this run is over %s",
                     tp_transport());
    }
}

static void need_kernel_tls(void)
{
    need_tcp();
    if (!kernel_has_tls()) {
        cr_skip_test("this kernel has no TLS (its tls module): test/verbs_guest.sh runs this "
                     "in a guest whose kernel has it");
    }
}

/* ---- a server in this process, clients in children ------------------------------------------- */

static xfer_listener_t *server_listen(xfer_context_t *ctx, uint16_t *port_p)
{
    xfer_listener_t *l;

    cr_assert_eq(xfer_listen(ctx, "127.0.0.1:0", &l), XFER_OK, "%s", xfer_last_error());
    *port_p = xfer_listener_port(l);
    return l;
}

/* A context created under the suite's environment that must not have opened tcp: what it
 * logged says why, and a client of the same kind cannot connect to it. */
static void tcp_not_opened(const char *why)
{
    xfer_listener_t *l;
    xfer_endpoint_t *ep;
    xfer_context_t *ctx;
    uint16_t port;
    pid_t pid;
    char *err;

    if (xfer_context_create(NULL, &ctx) == XFER_OK) {
        l   = server_listen(ctx, &port);
        pid = tp_hi_client_spawn(port, "XFER_TCP_TLS", "y");
        cr_expect_neq(tp_accept_next(l, &ep), XFER_OK, "a client connected over no transport");
        cr_expect_neq(tp_exit_code(pid), 0, "the client connected and sent");
        xfer_listener_close(l);
        xfer_context_destroy(ctx);
    }
    err = tu_read_redirected_stderr();
    cr_expect(strstr(err, why) != NULL, "the log does not say \"%s\":\n%s", why, err);
    free(err);
}

Test(tls, a_context_without_a_key_does_not_open_tcp, .init = cr_redirect_stderr)
{
    need_tcp();
    unsetenv("XFER_AUTH_KEY_FILE");
    tcp_not_opened("XFER_TCP_TLS=y takes its keys from the authenticated bootstrap");
}

Test(tls, without_the_kernels_tls_tcp_is_not_opened_and_says_why, .init = cr_redirect_stderr)
{
    need_tcp();
    if (kernel_has_tls()) {
        cr_skip_test("this kernel has TLS; the refusal is for kernels without it");
    }
    tcp_not_opened("this kernel has no TLS");
}

Test(tls, a_peer_without_tls_is_refused_and_one_with_it_served)
{
    xfer_request_t *req = NULL;
    xfer_listener_t *l;
    xfer_endpoint_t *ep;
    xfer_context_t *ctx;
    uint16_t port;
    char buf[8] = "";
    pid_t pid;

    need_kernel_tls();
    ctx = tp_context(0);
    l   = server_listen(ctx, &port);
    pid = tp_hi_client_spawn(port, "XFER_TCP_TLS", "n");
    cr_expect_neq(tp_accept_next(l, &ep), XFER_OK, "a client without TLS was admitted");
    cr_expect_neq(tp_exit_code(pid), 0, "the client without TLS connected and sent");

    pid = tp_hi_client_spawn(port, "XFER_TCP_TLS", "y");
    cr_assert_eq(tp_accept_next(l, &ep), XFER_OK, "the client with TLS was refused: %s",
                 xfer_last_error());
    cr_assert_eq(xfer_tag_recv(ctx, ep, TP_TAG_HI, UINT64_MAX, buf, sizeof(buf), NULL, NULL,
                               NULL, &req), XFER_OK);
    cr_expect_eq(tp_op_result(XFER_OK, req, TP_WAIT_MS), XFER_OK);
    cr_expect_str_eq(buf, "hi");
    cr_expect_eq(tp_exit_code(pid), 0);
    xfer_endpoint_close(ep);
    xfer_listener_close(l);
    xfer_context_destroy(ctx);
}

/* ---- every connection sealed ----------------------------------------------------------------- */

/* This process's connected TCP sockets: how many the kernel seals with TLS 1.3 and
 * AES-128-GCM in both directions, and how many it does not. */
static void sealed_sockets(int *sealed_p, int *clear_p)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *e;

    cr_assert_not_null(d);
    *sealed_p = *clear_p = 0;
    while ((e = readdir(d)) != NULL) {
        struct sockaddr_storage ss;
        socklen_t len = sizeof(ss);
        int fd = atoi(e->d_name), type = 0, dir_ok = 1;
        socklen_t tlen = sizeof(type);
        char ulp[16] = "";
        socklen_t ulen = sizeof(ulp);

        if ((e->d_name[0] == '.') || (fd == dirfd(d)) ||
            (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tlen) != 0) ||
            (type != SOCK_STREAM) || (getpeername(fd, (struct sockaddr*)&ss, &len) != 0) ||
            ((ss.ss_family != AF_INET) && (ss.ss_family != AF_INET6))) {
            continue;
        }
        for (int dir = TLS_TX; dir <= TLS_RX; dir++) {
            struct tls12_crypto_info_aes_gcm_128 ci;
            socklen_t clen = sizeof(ci);

            memset(&ci, 0, sizeof(ci));
            dir_ok = dir_ok && (getsockopt(fd, SOL_TLS, dir, &ci, &clen) == 0) &&
                     (ci.info.version == TLS_1_3_VERSION) &&
                     (ci.info.cipher_type == TLS_CIPHER_AES_GCM_128);
        }
        if ((getsockopt(fd, SOL_TCP, TCP_ULP, ulp, &ulen) == 0) && (strcmp(ulp, "tls") == 0) &&
            dir_ok) {
            (*sealed_p)++;
        } else {
            (*clear_p)++;
        }
    }
    closedir(d);
}

Test(tls, every_connection_of_an_endpoint_lanes_included_is_sealed)
{
    static const size_t lens[] = {1, 4096, 200 * 1024, TP_ECHO_MAX};
    tp_peer_t peer;
    int sealed, clear;

    need_kernel_tls();
    setenv("XFER_TCP_LANES", "4", 1);
    setenv("XFER_TCP_LANE_MIN_SIZE", "64k", 1);
    tp_start(&peer, tp_echo_server, NULL);
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        tp_echo_ping(peer.ctx, peer.ep, 7 + i, lens[i]);
    }
    cr_expect_eq(tu_ep_counter(peer.ep, "lanes_up"), 4, "lanes up: %lld",
                 (long long)tu_ep_counter(peer.ep, "lanes_up"));
    sealed_sockets(&sealed, &clear);
    cr_expect_geq(sealed, 4, "%d connections sealed by the kernel, 4 expected", sealed);
    cr_expect_eq(clear, 0, "%d connections of this process are not sealed", clear);
    tp_echo_stop(peer.ep);
    tp_finish(&peer);
}

/* ---- the bytes on the wire ------------------------------------------------------------------- */

static int file_holds(const char *path, const char *what)
{
    FILE *f = fopen(path, "rb");
    size_t cap = 8u << 20, n;
    char *buf = malloc(cap + 1);
    int found;

    cr_assert_not_null(f, "%s: %s", path, strerror(errno));
    cr_assert_not_null(buf);
    n = fread(buf, 1, cap, f);
    fclose(f);
    found = (memmem(buf, n, what, strlen(what)) != NULL);
    cr_assert_gt(n, 0, "%s is empty: the relay recorded nothing", path);
    free(buf);
    return found;
}

/* What a relay saw of a 256 KiB echo of CANARY, and what came back. */
typedef struct wire {
    xfer_status_t echo;         /* the echo's receive */
    int           intact;       /* ... and it is what was sent */
    int           sent_shows;   /* the recording of the client's bytes holds the canary */
    int           echo_shows;   /* ... of the server's bytes */
} wire_t;

/* 256 KiB of CANARY sent to an echo server through a relay that records both directions and,
 * when tamper >= 0, flips the client's byte at that offset - inside the message's data, past
 * every handshake. */
static void echo_through_relay(const char *tls, long tamper, wire_t *w)
{
    size_t len = 256 * 1024, clen = strlen(CANARY);
    char *out = malloc(len), *in = calloc(1, len), record[64], back[80], addr[64];
    xfer_request_t *req = NULL, *sreq = NULL;
    xfer_context_t *ctx;
    xfer_endpoint_t *ep;
    uint16_t port, rport;
    xfer_status_t st;
    tp_peer_t peer;
    pid_t relay;

    cr_assert((out != NULL) && (in != NULL));
    for (size_t i = 0; i < len; i++) {
        out[i] = CANARY[i % clen];
    }
    setenv("XFER_TCP_TLS", tls, 1);
    snprintf(record, sizeof(record), "/tmp/xfertest_tls_wire.%d", (int)getpid());
    snprintf(back, sizeof(back), "%s.back", record);
    tp_server_spawn(&peer, tp_echo_server, NULL, NULL);
    port  = (uint16_t)atoi(strrchr(peer.address, ':') + 1);
    relay = tp_relay_spawn(port, record, tamper, &rport);
    ctx   = tp_context(0);
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", rport);
    cr_assert_eq(xfer_connect(ctx, addr, &ep), XFER_OK, "%s", xfer_last_error());
    cr_assert_eq(xfer_tag_recv(ctx, ep, TAG, UINT64_MAX, in, len, NULL, NULL, NULL, &req),
                 XFER_OK);
    st = xfer_tag_send(ep, TAG, out, len, NULL, NULL, NULL, &sreq);
    (void)tp_op_result(st, sreq, TP_WAIT_MS);     /* written whole, or not: the echo tells */
    w->echo   = tp_op_result(XFER_OK, req, TP_WAIT_MS);
    w->intact = (memcmp(in, out, len) == 0);
    if (w->echo == XFER_OK) {
        tp_echo_stop(ep);
    }
    xfer_endpoint_close(ep);
    xfer_context_destroy(ctx);
    if (tamper < 0) {
        tp_child_expect_ok(&peer, 30);
    } else {
        (void)tp_child_wait(&peer, 30);    /* an echo server whose peer broke fails */
    }
    (void)tp_exit_code(relay);
    w->sent_shows = file_holds(record, CANARY);
    w->echo_shows = file_holds(back, CANARY);
    unlink(record);
    unlink(back);
    free(out);
    free(in);
}

Test(tls, the_bytes_on_the_wire_do_not_show_the_data)
{
    wire_t w;

    need_kernel_tls();
    echo_through_relay("y", -1, &w);
    cr_assert_eq(w.echo, XFER_OK);
    cr_expect(w.intact, "the echo differs from what was sent");
    cr_expect(!w.sent_shows, "the client's data went over the wire in the clear");
    cr_expect(!w.echo_shows, "the server's data went over the wire in the clear");
}

/* The same recording without TLS shows the data: the check above can fail. */
Test(tls, without_tls_the_same_recording_shows_the_data)
{
    wire_t w;

    need_tcp();
    echo_through_relay("n", -1, &w);
    cr_assert_eq(w.echo, XFER_OK);
    cr_expect(w.intact, "the echo differs from what was sent");
    cr_expect(w.sent_shows, "the recording of the client's bytes misses the data it carried");
    cr_expect(w.echo_shows, "the recording of the server's bytes misses the data it carried");
}

/* One bit of a record changed on its way: the receiver's kernel finds the record does not
 * authenticate, its endpoint fails, and nothing of the message is delivered - the echo never
 * comes. */
Test(tls, a_record_changed_on_the_wire_is_never_delivered)
{
    wire_t w;

    need_kernel_tls();
    echo_through_relay("y", 100000, &w);
    cr_expect_neq(w.echo, XFER_OK, "a message whose record was changed was delivered");
    cr_expect(!w.intact);
}

/* Without TLS the same change arrives as data: the check above can fail. */
Test(tls, without_tls_a_changed_byte_is_delivered_as_data)
{
    wire_t w;

    need_tcp();
    echo_through_relay("n", 100000, &w);
    cr_assert_eq(w.echo, XFER_OK);
    cr_expect(!w.intact, "the relay did not change the message");
}

/* ---- lane 0's record keys are TLS 1.3's ------------------------------------------------------ */

/* A TLS 1.3 connection between two OpenSSL endpoints in memory (no kernel TLS needed): the
 * record the server writes is opened with the key and IV that xfer derives from the server's
 * traffic secret - the ones it hands the kernel - so lane 0 is standard TLS 1.3, readable by
 * any TLS 1.3 stack holding the secrets. */
typedef struct {
    uint8_t secret[32];
    int     have;
} keylog_t;

static keylog_t server_secret;

static void keylog(const SSL *ssl, const char *line)
{
    const char *hex = strrchr(line, ' ');

    (void)ssl;
    if ((strncmp(line, "SERVER_TRAFFIC_SECRET_0 ", 24) == 0) && (hex != NULL) &&
        (strlen(hex + 1) == 64)) {
        for (int i = 0; i < 32; i++) {
            unsigned v;

            cr_assert_eq(sscanf(hex + 1 + 2 * i, "%2x", &v), 1);
            server_secret.secret[i] = (uint8_t)v;
        }
        server_secret.have = 1;
    }
}

static SSL_SESSION *psk_session(SSL *ssl)
{
    static const unsigned char aes128gcm[] = {0x13, 0x01};
    SSL_SESSION *sess = SSL_SESSION_new();

    cr_assert(sess != NULL && SSL_SESSION_set1_master_key(sess, (const unsigned char*)CANARY, 28) &&
              SSL_SESSION_set_cipher(sess, SSL_CIPHER_find(ssl, aes128gcm)) &&
              SSL_SESSION_set_protocol_version(sess, TLS1_3_VERSION));
    return sess;
}

static int psk_use(SSL *ssl, const EVP_MD *md, const unsigned char **id, size_t *id_len,
                   SSL_SESSION **sess)
{
    (void)md;
    *sess   = psk_session(ssl);
    *id     = (const unsigned char*)"id";
    *id_len = 2;
    return 1;
}

static int psk_find(SSL *ssl, const unsigned char *id, size_t id_len, SSL_SESSION **sess)
{
    (void)id;
    (void)id_len;
    *sess = psk_session(ssl);
    return 1;
}

static SSL *tls_end(int is_server)
{
    SSL_CTX *c = SSL_CTX_new(is_server ? TLS_server_method() : TLS_client_method());
    SSL *ssl;

    cr_assert(c != NULL && SSL_CTX_set_min_proto_version(c, TLS1_3_VERSION) &&
              SSL_CTX_set_ciphersuites(c, "TLS_AES_128_GCM_SHA256") &&
              SSL_CTX_set_num_tickets(c, 0));
    SSL_CTX_set_keylog_callback(c, keylog);
    if (is_server) {
        SSL_CTX_set_psk_find_session_callback(c, psk_find);
    } else {
        SSL_CTX_set_psk_use_session_callback(c, psk_use);
    }
    ssl = SSL_new(c);
    SSL_CTX_free(c);    /* the SSL holds its own reference */
    cr_assert_not_null(ssl);
    return ssl;
}

Test(tls, lane_0s_record_keys_are_the_ones_tls_1_3_derives)
{
    static const char msg[] = "a record of lane 0";
    SSL *client = tls_end(0), *server = tls_end(1);
    BIO *cb, *sb;
    uint8_t rec[256], key[XFER_TCP_TLS_KEY_LEN], iv[XFER_TCP_TLS_IV_LEN], out[256];
    EVP_CIPHER_CTX *aead = EVP_CIPHER_CTX_new();
    int n, len, fin;

    cr_assert(BIO_new_bio_pair(&cb, 0, &sb, 0));
    SSL_set_bio(client, cb, cb);
    SSL_set_bio(server, sb, sb);
    SSL_set_connect_state(client);
    SSL_set_accept_state(server);
    for (int i = 0, c = 0, s = 0; (i < 16) && !((c == 1) && (s == 1)); i++) {
        c = SSL_do_handshake(client);
        s = SSL_do_handshake(server);
    }
    cr_assert(SSL_is_init_finished(client) && SSL_is_init_finished(server) &&
              SSL_session_reused(server), "the in-memory TLS 1.3 handshake did not finish");
    cr_assert(server_secret.have, "OpenSSL logged no server traffic secret");
    cr_assert_eq(SSL_write(server, msg, sizeof(msg)), (int)sizeof(msg));
    n = BIO_read(cb, rec, sizeof(rec));     /* the record on its way to the client */
    cr_assert_eq(n, 5 + (int)sizeof(msg) + 1 + 16, "one record of %d bytes", n);

    cr_assert(xfer_tcp_tls_record_keys(server_secret.secret, key, iv));
    /* the first record of the epoch: its nonce is the IV itself (sequence 0); the header is
     * the additional data; the plaintext ends in its content type, application data */
    cr_assert(aead != NULL &&
              EVP_DecryptInit_ex(aead, EVP_aes_128_gcm(), NULL, key, iv) &&
              EVP_DecryptUpdate(aead, NULL, &len, rec, 5) &&
              EVP_DecryptUpdate(aead, out, &len, rec + 5, n - 5 - 16) &&
              EVP_CIPHER_CTX_ctrl(aead, EVP_CTRL_GCM_SET_TAG, 16, rec + n - 16));
    fin = EVP_DecryptFinal_ex(aead, out + len, &len);
    cr_expect(fin, "the record does not open with xfer's key and IV: they are not TLS 1.3's");
    cr_expect_eq(memcmp(out, msg, sizeof(msg)), 0);
    cr_expect_eq(out[sizeof(msg)], 23, "content type %u", out[sizeof(msg)]);
    EVP_CIPHER_CTX_free(aead);
    SSL_free(client);
    SSL_free(server);
}
