/*
 * tcp_floor: what TCP itself gives on this host, with plain sockets and nothing else, so that
 * tcp_why.sh can tell xfer's (and UCX's) cost from the kernel's. Every socket has TCP_NODELAY,
 * as every RDMA-style library sets it.
 *
 *   tcp_floor [-p PORT]                     server: serves one client, then exits
 *   tcp_floor [options] HOST                client: runs one test against the server on HOST
 *
 *   bw    the client streams messages of -s bytes (default 1 MiB), the server receives each
 *         into one buffer - or, with --scatter B, into blocks of B bytes scattered over it
 *         (block i at i * stride mod n, the stride about 0.618 n and prime to n, as xfer_perf's
 *         batch places its blocks), with one recvmsg over all of them, so that the kernel's
 *         cost of many destinations shows beside one. -P N spreads them over N connections,
 *         each with its own sender and receiver thread. The time runs from the start of the
 *         sends until the server has received every byte.
 *   lat   ping-pong of -s bytes (default 8); half the round trip, median and average.
 *
 * --wait says how each side waits for its socket: block (blocking send and recv, the receive
 * with MSG_WAITALL; the default), poll (MSG_DONTWAIT calls in a spin loop, as a library that
 * polls its progress engine) or epoll (epoll_wait, sleeping, then the call, as a library
 * waiting for events). Only the client's options matter: it sends them to the server on a
 * control connection, and the server sets --sndbuf/--rcvbuf on its listening socket before the
 * data connections arrive, so that the window scale is chosen with them. --zerocopy sends with
 * MSG_ZEROCOPY and reaps the completions from the error queue; the kernel says in each whether
 * it copied the data after all (it does when the receiver is on the same host).
 *
 * One line per run (or --json), e.g.
 *   bw size 1048576 streams 1 wait block msgs 4000 secs 1.171 MBps 3582.1 sndbuf 4194304 \
 *      rcvbuf 33554432 cpu_client 0.45 cpu_server 0.27
 *   lat size 8 wait block iters 20000 half_rtt_median_usec 6.02 half_rtt_avg_usec 6.43 \
 *      cpu_client 0.61 cpu_server 0.58
 * MB = 10^6 bytes; sndbuf and rcvbuf are what the kernel reports at the end (autotuned or
 * doubled from the request); cpu_client and cpu_server are the CPU time (user and system) each
 * process took over the time its part lasted: the cores it kept busy. On loopback the kernel's
 * receive processing mostly runs, and is counted, in the sender's system calls. A side gives up
 * after 10 s without progress from the other.
 *
 * Exit status: 0; 1 when something fails (the message says what); 2 on a usage error.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <endian.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tcp_floor.h"

/* CPU time of the whole process (every thread), user and system, in seconds. */
static double cpu_sec(void)
{
    struct rusage ru;

    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

static int sockopt_int(int fd, int level, int name, int value, const char *what)
{
    if (setsockopt(fd, level, name, &value, sizeof(value)) != 0) {
        fprintf(stderr, "tcp_floor: setsockopt(%s=%d): %s\n", what, value, strerror(errno));
        return -1;
    }
    return 0;
}

static int getsockopt_int(int fd, int name)
{
    int value = 0;
    socklen_t len = sizeof(value);

    return (getsockopt(fd, SOL_SOCKET, name, &value, &len) == 0) ? value : -1;
}

/* The buffer sizes (0: leave them to the kernel's autotuning), done before connect or listen. */
static int set_bufs(int fd, const params_t *p)
{
    if ((p->sndbuf > 0) && (sockopt_int(fd, SOL_SOCKET, SO_SNDBUF, (int)p->sndbuf,
                                        "SO_SNDBUF") != 0)) {
        return -1;
    }
    if ((p->rcvbuf > 0) && (sockopt_int(fd, SOL_SOCKET, SO_RCVBUF, (int)p->rcvbuf,
                                        "SO_RCVBUF") != 0)) {
        return -1;
    }
    return 0;
}

/* TCP_NODELAY and the timeouts that keep a side from waiting forever on a dead peer. */
static int set_data_opts(int fd)
{
    struct timeval tv = {.tv_sec = FLOOR_TIMEOUT_S};

    if (sockopt_int(fd, IPPROTO_TCP, TCP_NODELAY, 1, "TCP_NODELAY") != 0) {
        return -1;
    }
    if ((setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0) ||
        (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0)) {
        fprintf(stderr, "tcp_floor: setsockopt(SO_RCVTIMEO/SO_SNDTIMEO): %s\n", strerror(errno));
        return -1;
    }
    return 0;
}

/* Blocking exchange of fixed-size records on the control connection. */
static int ctl_io(int fd, void *buf, size_t len, int out)
{
    size_t done = 0;

    while (done < len) {
        ssize_t n = out ? send(fd, (uint8_t *)buf + done, len - done, MSG_NOSIGNAL) :
                          recv(fd, (uint8_t *)buf + done, len - done, 0);

        if (n > 0) {
            done += (size_t)n;
        } else if ((n < 0) && (errno == EINTR)) {
            continue;
        } else {
            fprintf(stderr, "tcp_floor: control connection: %s\n",
                    (n == 0) ? "closed by the peer" :
                    ((errno == EAGAIN) || (errno == EWOULDBLOCK)) ? "peer silent for 10 s" :
                    strerror(errno));
            return -1;
        }
    }
    return 0;
}

/* params_t and result_t are arrays of 64-bit fields: big-endian on the wire. */
static void u64s_swap(void *rec, size_t len, int to_wire)
{
    uint8_t *b = rec;

    for (size_t off = 0; off + sizeof(uint64_t) <= len; off += sizeof(uint64_t)) {
        uint64_t v;

        memcpy(&v, b + off, sizeof(v));
        v = to_wire ? htobe64(v) : be64toh(v);
        memcpy(b + off, &v, sizeof(v));
    }
}

/* The checks both sides make: the client on its command line, the server on what arrived. */
static const char *params_check(const params_t *p)
{
    if ((p->test != TEST_BW) && (p->test != TEST_LAT)) {
        return "unknown test";
    }
    if ((p->size == 0) || (p->size > FLOOR_MAX_SIZE)) {
        return "-s must be 1 byte to 1 GiB";
    }
    if ((p->streams == 0) || (p->streams > FLOOR_MAX_STREAMS)) {
        return "-P must be 1 to 64";
    }
    if ((p->iters > FLOOR_MAX_ITERS) || (p->warmup > FLOOR_MAX_ITERS) ||
        (p->secs > FLOOR_MAX_SECS) || ((p->iters == 0) == (p->secs == 0))) {
        return "give -n 1..1e9 or (bw only) -t 1..3600 seconds, not both";
    }
    if ((p->sndbuf > FLOOR_MAX_SOCKBUF) || (p->rcvbuf > FLOOR_MAX_SOCKBUF)) {
        return "--sndbuf/--rcvbuf must be 0 (autotuning) to 1 GiB";
    }
    if ((p->test == TEST_BW) && (p->iters > 0) && (p->iters < p->streams)) {
        return "-n must give every stream at least one message";
    }
    if ((p->test == TEST_LAT) && ((p->streams != 1) || p->zerocopy || (p->secs > 0))) {
        return "lat takes neither -P, --zerocopy nor -t";
    }
    if ((p->wait != WAIT_BLOCK) && (p->wait != WAIT_POLL) && (p->wait != WAIT_EPOLL)) {
        return "unknown --wait mode";
    }
    if ((p->test == TEST_BW) && (p->warmup > 0)) {
        return "bw takes no -w: it times every message";
    }
    if ((p->scatter > 0) && ((p->test != TEST_BW) || (p->size % p->scatter != 0) ||
                             (p->size / p->scatter > FLOOR_MAX_BLOCKS))) {
        return "--scatter (bw only) must cut -s into whole blocks, 1024 at most";
    }
    return NULL;
}

/* ---- connections --------------------------------------------------------------------------- */

static struct addrinfo *resolve(const char *host, const char *port)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    int r;

    hints.ai_flags = (host == NULL) ? AI_PASSIVE : 0;
    r = getaddrinfo(host, port, &hints, &ai);
    if (r != 0) {
        fprintf(stderr, "tcp_floor: %s port %s: %s\n", host ? host : "(any)", port,
                gai_strerror(r));
        return NULL;
    }
    return ai;
}

/* A connection to HOST:PORT with the buffer sizes set before the SYN (p NULL: defaults). */
static int dial(const char *host, const char *port, const params_t *p)
{
    struct addrinfo *ai = resolve(host, port), *a;
    int fd = -1, err = 0;

    for (a = ai; a != NULL; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) {
            err = errno;
            continue;
        }
        if (((p != NULL) && (set_bufs(fd, p) != 0)) || (set_data_opts(fd) != 0)) {
            close(fd);
            freeaddrinfo(ai);
            return -1;
        }
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
            break;
        }
        err = errno;
        close(fd);
        fd = -1;
    }
    if ((ai != NULL) && (fd < 0)) {
        fprintf(stderr, "tcp_floor: connect to %s port %s: %s\n", host, port, strerror(err));
    }
    freeaddrinfo(ai);
    return fd;
}

/* The next data connection, with its options; the client dials it within the timeout. */
static int take(int lfd)
{
    struct pollfd pfd = {.fd = lfd, .events = POLLIN};
    int fd;

    if (poll(&pfd, 1, FLOOR_TIMEOUT_S * 1000) != 1) {
        fprintf(stderr, "tcp_floor: no data connection from the client for %d s\n",
                FLOOR_TIMEOUT_S);
        return -1;
    }
    fd = accept(lfd, NULL, NULL);
    if (fd < 0) {
        fprintf(stderr, "tcp_floor: accept: %s\n", strerror(errno));
        return -1;
    }
    if (set_data_opts(fd) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static int alloc_streams(stream_t *st, const params_t *p)
{
    for (uint64_t i = 0; i < p->streams; i++) {
        memset(&st[i], 0, sizeof(st[i]));
        st[i].fd = -1;
        st[i].p  = p;
    }
    for (uint64_t i = 0; i < p->streams; i++) {
        /* every page touched before the clock starts */
        st[i].buf = aligned_alloc(4096, (p->size + 4095) & ~4095ull);
        if (st[i].buf == NULL) {
            fprintf(stderr, "tcp_floor: no memory for %" PRIu64 " buffers of %" PRIu64
                    " bytes\n", p->streams, p->size);
            return -1;
        }
        memset(st[i].buf, 0xa5, (size_t)p->size);
    }
    return 0;
}

static void free_streams(stream_t *st, const params_t *p)
{
    for (uint64_t i = 0; i < p->streams; i++) {
        if (st[i].fd >= 0) {
            close(st[i].fd);
        }
        free(st[i].buf);
    }
}

/* ---- server -------------------------------------------------------------------------------- */

static int listen_on(const char *port)
{
    struct addrinfo *ai = resolve(NULL, port), *a;
    int fd = -1, one = 1;

    for (a = ai; a != NULL; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if ((fd >= 0) && (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0) &&
            (bind(fd, a->ai_addr, a->ai_addrlen) == 0) && (listen(fd, 128) == 0)) {
            break;
        }
        if (fd >= 0) {
            close(fd);
            fd = -1;
        }
    }
    if ((ai != NULL) && (fd < 0)) {
        fprintf(stderr, "tcp_floor: listen on port %s: %s\n", port, strerror(errno));
    }
    freeaddrinfo(ai);
    return fd;
}

static int serve(const char *port)
{
    stream_t st[FLOOR_MAX_STREAMS];
    params_t p;
    result_t res = {0};
    struct timeval tv = {.tv_sec = FLOOR_TIMEOUT_S};
    const char *why;
    double t0, cpu0;
    int lfd, cfd, ret = 1;

    lfd = listen_on(port);
    if (lfd < 0) {
        return 1;
    }
    cfd = accept(lfd, NULL, NULL);      /* a server waits for its client as long as it takes */
    if (cfd < 0) {
        fprintf(stderr, "tcp_floor: accept: %s\n", strerror(errno));
        goto out_close_listen;
    }
    if ((setsockopt(cfd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0) ||
        (ctl_io(cfd, &p, sizeof(p), 0) != 0)) {
        goto out_close_ctl;
    }
    u64s_swap(&p, sizeof(p), 0);
    if (p.magic != (((uint64_t)FLOOR_MAGIC << 32) | FLOOR_VERSION)) {
        fprintf(stderr, "tcp_floor: the client is not a tcp_floor of version %u\n",
                FLOOR_VERSION);
        goto out_close_ctl;
    }
    why = params_check(&p);
    if (why != NULL) {
        fprintf(stderr, "tcp_floor: the client asked for something invalid: %s\n", why);
        goto out_close_ctl;
    }
    /* accepted sockets take the listening socket's buffer sizes */
    if (set_bufs(lfd, &p) != 0) {
        goto out_close_ctl;
    }
    if (alloc_streams(st, &p) != 0) {
        goto out_free_streams;
    }
    if (ctl_io(cfd, &res, sizeof(res), 1) != 0) {     /* all zeroes: ready */
        goto out_free_streams;
    }
    for (uint64_t i = 0; i < p.streams; i++) {
        if ((st[i].fd = take(lfd)) < 0) {
            goto out_free_streams;
        }
    }
    cpu0 = cpu_sec();
    t0   = floor_now_sec();
    if (p.test == TEST_BW) {
        if (floor_run_streams(st, (unsigned)p.streams, floor_bw_receiver, &t0) != 0) {
            goto out_free_streams;
        }
        for (uint64_t i = 0; i < p.streams; i++) {
            res.bytes += st[i].bytes;
        }
    } else if (floor_lat_run(&st[0], NULL) != 0) {
        goto out_free_streams;
    }
    res.cpu_usec  = (uint64_t)((cpu_sec() - cpu0) * 1e6);
    res.wall_usec = (uint64_t)((floor_now_sec() - t0) * 1e6);
    res.rcvbuf = (uint64_t)getsockopt_int(st[0].fd, SO_RCVBUF);
    res.sndbuf = (uint64_t)getsockopt_int(st[0].fd, SO_SNDBUF);
    u64s_swap(&res, sizeof(res), 1);
    if (ctl_io(cfd, &res, sizeof(res), 1) == 0) {
        ret = 0;
    }
out_free_streams:
    free_streams(st, &p);
out_close_ctl:
    close(cfd);
out_close_listen:
    close(lfd);
    return ret;
}

/* ---- client -------------------------------------------------------------------------------- */

static const char *wait_name(uint64_t w)
{
    return (w == WAIT_POLL) ? "poll" : (w == WAIT_EPOLL) ? "epoll" : "block";
}

/* CPU seconds per second of the side's part: how many cores it kept busy on average. */
static double busy(double cpu, double wall)
{
    return (wall > 0) ? cpu / wall : 0;
}

static void bw_report(const params_t *p, const stream_t *st, const result_t *res, double secs,
                      double cpu, int json)
{
    uint64_t zc_sent = 0, zc_copied = 0;
    double mbps = (double)res->bytes / secs / 1e6;
    double cpu_c = busy(cpu, secs), cpu_s = busy((double)res->cpu_usec, (double)res->wall_usec);
    int sndbuf = getsockopt_int(st[0].fd, SO_SNDBUF);

    for (uint64_t i = 0; i < p->streams; i++) {
        zc_sent   += st[i].zc_sent;
        zc_copied += st[i].zc_copied;
    }
    if (json) {
        printf("{\"test\":\"bw\",\"size\":%" PRIu64 ",\"streams\":%" PRIu64 ",\"wait\":\"%s\","
               "\"messages\":%" PRIu64 ",\"seconds\":%.6f,\"mbps\":%.1f,\"sndbuf\":%d,"
               "\"rcvbuf\":%" PRIu64 ",\"cpu_client\":%.2f,\"cpu_server\":%.2f,"
               "\"zerocopy\":%s,\"zerocopy_sends\":%" PRIu64 ",\"zerocopy_copied\":%" PRIu64
               ",\"scatter\":%" PRIu64 "}\n", p->size, p->streams, wait_name(p->wait),
               res->bytes / p->size, secs, mbps, sndbuf, res->rcvbuf, cpu_c, cpu_s,
               p->zerocopy ? "true" : "false", zc_sent, zc_copied, p->scatter);
        return;
    }
    printf("bw size %" PRIu64 " streams %" PRIu64 " wait %s msgs %" PRIu64 " secs %.3f MBps %.1f "
           "sndbuf %d rcvbuf %" PRIu64 " cpu_client %.2f cpu_server %.2f", p->size, p->streams,
           wait_name(p->wait), res->bytes / p->size, secs, mbps, sndbuf, res->rcvbuf, cpu_c,
           cpu_s);
    if (p->zerocopy) {
        printf(" zerocopy_sends %" PRIu64 " copied %" PRIu64, zc_sent, zc_copied);
    }
    if (p->scatter > 0) {
        printf(" scatter %" PRIu64, p->scatter);
    }
    printf("\n");
}

static void lat_report(const params_t *p, double *rtt, const result_t *res, double secs,
                       double cpu, int json)
{
    double sum = 0, median, avg;
    double cpu_c = busy(cpu, secs), cpu_s = busy((double)res->cpu_usec, (double)res->wall_usec);

    qsort(rtt, (size_t)p->iters, sizeof(*rtt), cmp_double);
    for (uint64_t i = 0; i < p->iters; i++) {
        sum += rtt[i];
    }
    median = rtt[p->iters / 2] / 2 * 1e6;
    avg    = sum / (double)p->iters / 2 * 1e6;
    if (json) {
        printf("{\"test\":\"lat\",\"size\":%" PRIu64 ",\"wait\":\"%s\",\"iters\":%" PRIu64
               ",\"half_rtt_median_usec\":%.3f,\"half_rtt_avg_usec\":%.3f,\"cpu_client\":%.2f,"
               "\"cpu_server\":%.2f}\n", p->size, wait_name(p->wait), p->iters, median, avg,
               cpu_c, cpu_s);
        return;
    }
    printf("lat size %" PRIu64 " wait %s iters %" PRIu64 " half_rtt_median_usec %.2f "
           "half_rtt_avg_usec %.2f cpu_client %.2f cpu_server %.2f\n", p->size,
           wait_name(p->wait), p->iters, median, avg, cpu_c, cpu_s);
}

static int client(const char *host, const char *port, const params_t *p, int json)
{
    stream_t st[FLOOR_MAX_STREAMS];
    params_t wire = *p;
    result_t res;
    double t0, cpu0, secs, *rtt = NULL;
    uint64_t sent = 0;
    int cfd, ret = 1;

    cfd = dial(host, port, NULL);
    if (cfd < 0) {
        return 1;
    }
    u64s_swap(&wire, sizeof(wire), 1);
    if ((ctl_io(cfd, &wire, sizeof(wire), 1) != 0) || (ctl_io(cfd, &res, sizeof(res), 0) != 0)) {
        fprintf(stderr, "tcp_floor: the server refused the test (its message says why)\n");
        goto out_close_ctl;
    }
    if (alloc_streams(st, p) != 0) {
        goto out_free_streams;
    }
    for (uint64_t i = 0; i < p->streams; i++) {
        if ((st[i].fd = dial(host, port, p)) < 0) {
            goto out_free_streams;
        }
        if (p->zerocopy && (sockopt_int(st[i].fd, SOL_SOCKET, SO_ZEROCOPY, 1,
                                        "SO_ZEROCOPY") != 0)) {
            goto out_free_streams;
        }
        /* -n: the first streams take the remainder; -t: all stop at the same time */
        st[i].msgs     = p->iters / p->streams + ((i < p->iters % p->streams) ? 1 : 0);
        st[i].deadline = floor_now_sec() + (double)p->secs;
    }
    if ((p->test == TEST_LAT) && ((rtt = calloc((size_t)p->iters, sizeof(*rtt))) == NULL)) {
        fprintf(stderr, "tcp_floor: no memory for %" PRIu64 " timings\n", p->iters);
        goto out_free_streams;
    }
    cpu0 = cpu_sec();
    t0   = floor_now_sec();
    if (p->test == TEST_LAT) {
        if (floor_lat_run(&st[0], rtt) != 0) {
            goto out_free_rtt;
        }
    } else if (floor_run_streams(st, (unsigned)p->streams, floor_bw_sender, &t0) != 0) {
        goto out_free_streams;
    }
    /* the server answers once it has received everything */
    if (ctl_io(cfd, &res, sizeof(res), 0) != 0) {
        goto out_free_rtt;
    }
    secs = floor_now_sec() - t0;
    cpu0 = cpu_sec() - cpu0;
    u64s_swap(&res, sizeof(res), 0);
    if (p->test == TEST_LAT) {
        lat_report(p, rtt, &res, secs, cpu0, json);
        ret = 0;
        goto out_free_rtt;
    }
    for (uint64_t i = 0; i < p->streams; i++) {
        sent += st[i].bytes;
    }
    if (res.bytes != sent) {
        fprintf(stderr, "tcp_floor: sent %" PRIu64 " bytes, the server received %" PRIu64 "\n",
                sent, res.bytes);
        goto out_free_streams;
    }
    bw_report(p, st, &res, secs, cpu0, json);
    ret = 0;
out_free_rtt:
    free(rtt);
out_free_streams:
    free_streams(st, p);
out_close_ctl:
    close(cfd);
    return ret;
}

/* ---- command line -------------------------------------------------------------------------- */

static void usage(FILE *out)
{
    fprintf(out,
            "usage: tcp_floor [-p PORT]                  server (serves one client)\n"
            "       tcp_floor [options] HOST             client\n"
            "The TCP floor of this host with plain sockets (TCP_NODELAY), without xfer.\n"
            "  -p, --port PORT     server's port (default " FLOOR_PORT ")\n"
            "  -T, --test TEST     bw (default) or lat\n"
            "  -s, --size BYTES    message size; k, m, g are powers of 1024\n"
            "                      (default 1m for bw, 8 for lat)\n"
            "  -n, --iters N       messages (bw, default 2000) or round trips (lat, 20000)\n"
            "  -t, --time SECS     bw: send for SECS seconds instead of -n messages\n"
            "  -w, --warmup N      lat: untimed round trips first (default 1000)\n"
            "  -P, --streams N     bw: N connections, N sender and N receiver threads (1)\n"
            "      --sndbuf BYTES  SO_SNDBUF on every data socket (0: autotuning, default)\n"
            "      --rcvbuf BYTES  SO_RCVBUF on every data socket (0: autotuning, default)\n"
            "      --zerocopy      bw: send with MSG_ZEROCOPY; reports how many of the sends\n"
            "                      the kernel said it copied after all\n"
            "      --scatter B     bw: the server receives each message into blocks of B\n"
            "                      bytes scattered over its buffer, with one recvmsg\n"
            "      --wait MODE     how each side waits for its socket: block (blocking calls,\n"
            "                      the default), poll (MSG_DONTWAIT calls in a spin loop) or\n"
            "                      epoll (epoll_wait, then the call)\n"
            "  -j, --json          one JSON object instead of the result line\n"
            "  -h, --help          this text\n"
            "Only the client's options matter: it sends them to the server. MB = 10^6 bytes;\n"
            "lat reports half the round trip. A side gives up after %d s without progress.\n",
            FLOOR_TIMEOUT_S);
}

/* A decimal number, with a k/m/g suffix (powers of 1024) where suffix is allowed. */
static int parse_u64(const char *s, int suffix, uint64_t max, uint64_t *out)
{
    char *end;
    unsigned long long v;
    unsigned shift = 0;

    errno = 0;
    if ((s[0] < '0') || (s[0] > '9')) {
        return -1;
    }
    v = strtoull(s, &end, 10);
    if (errno != 0) {
        return -1;
    }
    if (suffix && (*end != '\0') && (end[1] == '\0')) {
        switch (*end | 0x20) {
        case 'k': shift = 10; end++; break;
        case 'm': shift = 20; end++; break;
        case 'g': shift = 30; end++; break;
        default:  return -1;
        }
    }
    if ((*end != '\0') || (v > (max >> shift))) {
        return -1;
    }
    *out = (uint64_t)v << shift;
    return 0;
}

static int bad_arg(const char *opt, const char *val, const char *want)
{
    fprintf(stderr, "tcp_floor: %s '%s': %s\n", opt, val, want);
    return 2;
}

int main(int argc, char **argv)
{
    enum { OPT_SNDBUF = 256, OPT_RCVBUF, OPT_ZEROCOPY, OPT_WAIT, OPT_SCATTER };
    static const struct option longopts[] = {
        {"port", required_argument, NULL, 'p'},     {"test", required_argument, NULL, 'T'},
        {"size", required_argument, NULL, 's'},     {"iters", required_argument, NULL, 'n'},
        {"time", required_argument, NULL, 't'},     {"warmup", required_argument, NULL, 'w'},
        {"streams", required_argument, NULL, 'P'},  {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {"sndbuf", required_argument, NULL, OPT_SNDBUF},
        {"rcvbuf", required_argument, NULL, OPT_RCVBUF},
        {"zerocopy", no_argument, NULL, OPT_ZEROCOPY},
        {"wait", required_argument, NULL, OPT_WAIT},
        {"scatter", required_argument, NULL, OPT_SCATTER},
        {NULL, 0, NULL, 0},
    };
    params_t p = {.test = TEST_BW, .wait = WAIT_BLOCK, .streams = 1};
    const char *port = FLOOR_PORT, *why;
    int opt, json = 0, has_size = 0, has_iters = 0, has_warmup = 0, client_opt = 0;
    uint64_t port_num;

    while ((opt = getopt_long(argc, argv, "p:T:s:n:t:w:P:jh", longopts, NULL)) != -1) {
        if ((opt != 'p') && (opt != 'h') && (opt != '?')) {
            client_opt = 1;
        }
        switch (opt) {
        case 'p':
            if ((parse_u64(optarg, 0, 65535, &port_num) != 0) || (port_num == 0)) {
                return bad_arg("-p", optarg, "a port, 1 to 65535");
            }
            port = optarg;
            break;
        case 'T':
            if (strcmp(optarg, "bw") == 0) {
                p.test = TEST_BW;
            } else if (strcmp(optarg, "lat") == 0) {
                p.test = TEST_LAT;
            } else {
                return bad_arg("-T", optarg, "bw or lat");
            }
            break;
        case 's':
            if (parse_u64(optarg, 1, FLOOR_MAX_SIZE, &p.size) != 0) {
                return bad_arg("-s", optarg, "bytes, up to 1g");
            }
            has_size = 1;
            break;
        case 'n':
            if (parse_u64(optarg, 0, FLOOR_MAX_ITERS, &p.iters) != 0) {
                return bad_arg("-n", optarg, "a count, up to 1000000000");
            }
            has_iters = 1;
            break;
        case 't':
            if ((parse_u64(optarg, 0, FLOOR_MAX_SECS, &p.secs) != 0) || (p.secs == 0)) {
                return bad_arg("-t", optarg, "whole seconds, 1 to 3600");
            }
            break;
        case 'w':
            if (parse_u64(optarg, 0, FLOOR_MAX_ITERS, &p.warmup) != 0) {
                return bad_arg("-w", optarg, "a count, up to 1000000000");
            }
            has_warmup = 1;
            break;
        case 'P':
            if (parse_u64(optarg, 0, FLOOR_MAX_STREAMS, &p.streams) != 0) {
                return bad_arg("-P", optarg, "1 to 64 streams");
            }
            break;
        case OPT_SNDBUF:
        case OPT_RCVBUF:
            if (parse_u64(optarg, 1, FLOOR_MAX_SOCKBUF,
                          (opt == OPT_SNDBUF) ? &p.sndbuf : &p.rcvbuf) != 0) {
                return bad_arg((opt == OPT_SNDBUF) ? "--sndbuf" : "--rcvbuf", optarg,
                               "bytes, 0 (autotuning) to 1g");
            }
            break;
        case OPT_ZEROCOPY:
            p.zerocopy = 1;
            break;
        case OPT_SCATTER:
            if ((parse_u64(optarg, 1, FLOOR_MAX_SIZE, &p.scatter) != 0) || (p.scatter == 0)) {
                return bad_arg("--scatter", optarg, "bytes, 1 to 1g");
            }
            break;
        case OPT_WAIT:
            if (strcmp(optarg, "block") == 0) {
                p.wait = WAIT_BLOCK;
            } else if (strcmp(optarg, "poll") == 0) {
                p.wait = WAIT_POLL;
            } else if (strcmp(optarg, "epoll") == 0) {
                p.wait = WAIT_EPOLL;
            } else {
                return bad_arg("--wait", optarg, "block, poll or epoll");
            }
            break;
        case 'j':
            json = 1;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (argc - optind > 1) {
        fprintf(stderr, "tcp_floor: one HOST at most (got '%s' after '%s')\n",
                argv[optind + 1], argv[optind]);
        return 2;
    }
    if (optind == argc) {
        if (client_opt) {
            fprintf(stderr, "tcp_floor: no HOST: a server, which takes only -p (the client "
                    "sends it the test's options)\n");
            return 2;
        }
        return serve(port);
    }
    p.magic = ((uint64_t)FLOOR_MAGIC << 32) | FLOOR_VERSION;
    if (!has_size) {
        p.size = (p.test == TEST_BW) ? (1u << 20) : 8;
    }
    if (!has_iters && (p.secs == 0)) {
        p.iters = (p.test == TEST_BW) ? 2000 : 20000;
    }
    if (!has_warmup && (p.test == TEST_LAT)) {
        p.warmup = 1000;
    }
    why = params_check(&p);
    if (why != NULL) {
        fprintf(stderr, "tcp_floor: %s\n", why);
        return 2;
    }
    return client(argv[optind], port, &p, json);
}
