/*
 * tcp lanes that cannot be had at first are tried again, not given up. A hand-made server (a
 * forked child speaking the bootstrap and tcp's endpoint address by hand) offers two lanes
 * and names as its lane port a socket that is bound but does not listen yet: the client's
 * first lane connect is refused for real (ECONNREFUSED). Once xfer_connect() has returned, the
 * server listens there; the client's retry from progress connects, says LANE_HELLO with lane
 * 1 and the server's token, and the endpoint's counters show both lanes up.
 */
#include "raw_peer.h"
#include "test_util.h"
#include "../framework/wire/bootstrap_wire.h"
#include "../components/tcp/tcp_wire.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TOKEN      0x1a2e5eed7e57c0deull
#define LISTEN_MS  50       /* after xfer_connect() returned: past the first retries */

static void setup(void)
{
    setenv("XFER_TRANSPORTS", "tcp", 1);
    setenv("XFER_BOOTSTRAP_TIMEOUT", "5s", 1);
    setenv("XFER_TCP_LANES", "2", 1);
    unsetenv("XFER_COMPONENT_PATH");
    unsetenv("XFER_PROGRESS_THREAD");
}

TestSuite(lane_retry, .init = setup, .timeout = 60);

/* A socket on 127.0.0.1 at an ephemeral port; listening or only bound. Its port in *port_p. */
static int loopback_socket(int do_listen, uint16_t *port_p)
{
    struct sockaddr_in sa = {0};
    socklen_t len         = sizeof(sa);
    int fd                = socket(AF_INET, SOCK_STREAM, 0);

    sa.sin_family      = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if ((fd < 0) || (bind(fd, (struct sockaddr*)&sa, sizeof(sa)) != 0) ||
        (do_listen && (listen(fd, 8) != 0)) ||
        (getsockname(fd, (struct sockaddr*)&sa, &len) != 0)) {
        _exit(60);
    }
    *port_p = ntohs(sa.sin_port);
    return fd;
}

/* The server half of the bootstrap, by hand: tcp accepted, and an endpoint address of two
 * lanes whose lane port is lane_port. */
static void raw_serve_bootstrap(int fd, uint16_t lane_port)
{
    static uint8_t frame[XFER_WIRE_HEADER_LEN + XFER_WIRE_MAX_BODY];
    static xfer_wire_hello_t hello;
    xfer_tcp_wire_ep_addr_t addr = {{1u << 20, 64}, 2, lane_port, TOKEN, 0};
    xfer_wire_connect_t conn;
    size_t len;

    raw_boot_read(fd, XFER_WIRE_HELLO, frame, sizeof(frame), 61);
    memset(&hello, 0, sizeof(hello));
    hello.num = 1;
    snprintf(hello.transports[0].name, sizeof(hello.transports[0].name), "tcp");
    len = sizeof(frame);
    if (xfer_wire_pack_hello(&hello, frame, &len) != XFER_OK) {
        _exit(64);
    }
    raw_write(fd, frame, len, 65);
    len = sizeof(frame);
    if (xfer_wire_pack_accept("tcp", frame, &len) != XFER_OK) {
        _exit(66);
    }
    raw_write(fd, frame, len, 67);
    raw_boot_read(fd, XFER_WIRE_CONNECT, frame, sizeof(frame), 68);
    memset(&conn, 0, sizeof(conn));
    conn.context_id = 0x7e57c0de5eed0002ull;
    conn.addr_len   = XFER_TCP_WIRE_EP_ADDR_LEN;
    xfer_tcp_wire_pack_ep_addr(&addr, conn.addr);
    len = sizeof(frame);
    if (xfer_wire_pack_connect(&conn, frame, &len) != XFER_OK) {
        _exit(71);
    }
    raw_write(fd, frame, len, 72);
}

/* The child: tells the parent its port, serves the bootstrap, listens on the lane port when
 * told, and checks the lane that comes. Stays until the parent is done. */
static void raw_server(int ctl)
{
    uint8_t buf[XFER_TCP_WIRE_LANE_HELLO_LEN];
    xfer_tcp_wire_lane_hello_t lh;
    uint16_t port, lane_port;
    int lfd, lane_fd, fd, lane;
    struct pollfd pfd;
    char c, why[256];

    alarm(50);
    lfd     = loopback_socket(1, &port);
    lane_fd = loopback_socket(0, &lane_port);      /* bound: a connect is refused */
    raw_write(ctl, &port, sizeof(port), 73);
    fd = accept(lfd, NULL, NULL);
    if (fd < 0) {
        _exit(74);
    }
    raw_serve_bootstrap(fd, lane_port);
    raw_read(ctl, &c, 1, 75);                       /* xfer_connect() returned */
    usleep(LISTEN_MS * 1000);
    if (listen(lane_fd, 8) != 0) {
        _exit(76);
    }
    pfd = (struct pollfd){lane_fd, POLLIN, 0};
    if (poll(&pfd, 1, RAW_WAIT_MS) != 1) {
        _exit(77);                                  /* no lane came: it was given up */
    }
    lane = accept(lane_fd, NULL, NULL);
    raw_read(lane, buf, sizeof(buf), 78);
    if ((xfer_tcp_wire_unpack_lane_hello(buf, &lh, why, sizeof(why)) != XFER_OK) ||
        (lh.lane != 1) || (lh.token != TOKEN)) {
        _exit(79);
    }
    raw_write(ctl, "k", 1, 80);
    raw_read(ctl, &c, 1, 81);                       /* the parent is done */
    _exit(0);
}

static double now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

Test(lane_retry, a_refused_lane_is_tried_again_and_comes_up)
{
    xfer_context_t *ctx;
    xfer_endpoint_t *ep;
    char address[64], c;
    uint16_t port;
    int sv[2], status;
    pid_t pid;

    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(sv[0]);
        raw_server(sv[1]);
    }
    close(sv[1]);
    cr_assert_eq(read(sv[0], &port, sizeof(port)), (ssize_t)sizeof(port));
    snprintf(address, sizeof(address), "127.0.0.1:%u", port);
    cr_assert_eq(tu_context(0, &ctx), XFER_OK);
    cr_assert_eq(xfer_connect(ctx, address, &ep), XFER_OK);
    cr_expect_eq(tu_ep_counter(ep, "lanes"), 2, "the lanes agreed on");
    cr_expect_eq(tu_ep_counter(ep, "lanes_up"), 1, "a lane up before its port listened");
    cr_assert_eq(write(sv[0], "g", 1), 1);
    for (double end = now_ms() + RAW_WAIT_MS; tu_ep_counter(ep, "lanes_up") < 2;) {
        cr_assert_lt(now_ms(), end, "lane 1 never came up: it was not tried again");
        xfer_progress(ctx);
    }
    {
        struct pollfd pfd = {sv[0], POLLIN, 0};

        cr_assert_eq(poll(&pfd, 1, RAW_WAIT_MS), 1, "the server saw no lane");
        cr_assert_eq(read(sv[0], &c, 1), 1);
        cr_expect_eq(c, 'k', "the lane's hello");
    }
    cr_assert_eq(write(sv[0], "d", 1), 1);
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_expect(WIFEXITED(status) && (WEXITSTATUS(status) == 0), "the hand-made server: exit %d",
              WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    xfer_endpoint_close(ep);
    xfer_context_destroy(ctx);
    close(sv[0]);
}
