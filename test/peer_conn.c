/*
 * Connections made by hand for the suites that watch the bootstrap and the wire: a relay that
 * records (or alters) what passes, and one-message clients in children. See test_peer.h.
 */
#include "test_peer.h"

#include <criterion/criterion.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

/* ---- a relay --------------------------------------------------------------------------------- */

/* tp_relay_spawn's child: one connection from listen_fd relayed to port. */
static void relay_run(int listen_fd, uint16_t port, const char *record, long tamper)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    int c = accept(listen_fd, NULL, NULL), srv = socket(AF_INET, SOCK_STREAM, 0);
    int rec = record ? open(record, O_WRONLY | O_CREAT | O_TRUNC, 0600) : -1;
    int back = -1;
    char back_path[80];

    if (record != NULL) {
        snprintf(back_path, sizeof(back_path), "%s.back", record);
        back = open(back_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    }
    long from_client = 0;
    char buf[65536];

    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if ((c < 0) || (srv < 0) || (connect(srv, (struct sockaddr*)&sa, sizeof(sa)) != 0)) {
        _exit(30);
    }
    for (;;) {
        struct pollfd pfd[2] = {{c, POLLIN, 0}, {srv, POLLIN, 0}};
        ssize_t n;

        if (poll(pfd, 2, TP_WAIT_MS) <= 0) {
            _exit(31);
        }
        if (pfd[0].revents) {
            n = read(c, buf, sizeof(buf));
            if (n <= 0) {
                _exit(0);
            }
            if ((tamper >= from_client) && (tamper < from_client + n)) {
                buf[tamper - from_client] ^= 0x01;
            }
            from_client += n;
            if ((rec >= 0) && (write(rec, buf, (size_t)n) != n)) {
                _exit(32);
            }
            if (send(srv, buf, (size_t)n, MSG_NOSIGNAL) != n) {
                _exit(0);
            }
        }
        if (pfd[1].revents) {
            n = read(srv, buf, sizeof(buf));
            if ((n <= 0) || (send(c, buf, (size_t)n, MSG_NOSIGNAL) != n)) {
                _exit(0);
            }
            if ((back >= 0) && (write(back, buf, (size_t)n) != n)) {
                _exit(33);
            }
        }
    }
}

pid_t tp_relay_spawn(uint16_t server_port, const char *record, long tamper, uint16_t *port_p)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t len = sizeof(sa);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    pid_t pid;

    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert((fd >= 0) && (bind(fd, (struct sockaddr*)&sa, sizeof(sa)) == 0) &&
              (listen(fd, 4) == 0) && (getsockname(fd, (struct sockaddr*)&sa, &len) == 0));
    *port_p = ntohs(sa.sin_port);
    pid     = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        alarm(TP_CHILD_ALARM_S);
        relay_run(fd, server_port, record, tamper);
    }
    close(fd);
    return pid;
}

/* ---- one-message clients --------------------------------------------------------------------- */

pid_t tp_hi_client_spawn(uint16_t port, const char *env_name, const char *env_value)
{
    pid_t pid = fork();

    cr_assert_geq(pid, 0);
    if (pid == 0) {
        xfer_endpoint_t *ep = NULL;
        xfer_request_t *req = NULL;
        xfer_context_t *ctx;
        xfer_status_t st;
        char addr[64];

        alarm(TP_CHILD_ALARM_S);
        if (env_value != NULL) {
            setenv(env_name, env_value, 1);
        } else {
            unsetenv(env_name);
        }
        if (xfer_context_create(NULL, &ctx) != XFER_OK) {
            _exit(99);
        }
        snprintf(addr, sizeof(addr), "127.0.0.1:%u", port);
        st = xfer_connect(ctx, addr, &ep);
        if (st == XFER_OK) {
            st = xfer_tag_send(ep, TP_TAG_HI, "hi", 3, NULL, NULL, NULL, &req);
            st = tp_op_result(st, req, TP_WAIT_MS);
            xfer_endpoint_close(ep);
        }
        xfer_context_destroy(ctx);
        _exit((st == XFER_OK) ? 0 : 20 - st);
    }
    return pid;
}

xfer_status_t tp_accept_next(xfer_listener_t *l, xfer_endpoint_t **ep_p)
{
    double end = tp_now_ms() + TP_WAIT_MS;
    xfer_status_t st;

    *ep_p = NULL;
    do {
        st = xfer_accept(l, 100, ep_p);
    } while ((st == XFER_ERR_TIMEOUT) && (tp_now_ms() < end));
    return st;
}

int tp_exit_code(pid_t pid)
{
    int st;

    cr_assert_eq(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}
