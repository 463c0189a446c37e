/*
 * tcp_floor's shared types and the functions its two parts give each other:
 *   tcp_floor.c        the command line, the control connection, the server and the client,
 *                      what is printed
 *   tcp_floor_tests.c  the data paths that are timed: bw's senders and receivers (and the
 *                      zero-copy completions), lat's ping-pong and its ways of waiting
 */
#ifndef TCP_FLOOR_H
#define TCP_FLOOR_H

#include <pthread.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/uio.h>

#ifndef SO_ZEROCOPY
#define SO_ZEROCOPY 60
#endif
#ifndef MSG_ZEROCOPY
#define MSG_ZEROCOPY 0x4000000
#endif

#define FLOOR_MAGIC       0x7463666cu           /* "tcfl" */
#define FLOOR_VERSION     2u
#define FLOOR_PORT        "18700"
#define FLOOR_TIMEOUT_S   10                    /* without progress from the peer */
#define FLOOR_MAX_SIZE    (1ull << 30)
#define FLOOR_MAX_STREAMS 64u
#define FLOOR_MAX_ITERS   1000000000ull
#define FLOOR_MAX_SECS    3600u
#define FLOOR_MAX_SOCKBUF (1ull << 30)
#define FLOOR_MAX_BLOCKS  1024u                /* --scatter: blocks of a message (IOV_MAX) */

typedef enum { TEST_BW = 1, TEST_LAT = 2 } test_t;
typedef enum { WAIT_BLOCK = 1, WAIT_POLL = 2, WAIT_EPOLL = 3 } wait_t;

/* What the client asks for; sent in big-endian 64-bit fields. */
typedef struct {
    uint64_t magic;                 /* FLOOR_MAGIC << 32 | FLOOR_VERSION */
    uint64_t test, wait, streams, zerocopy, size, iters, warmup, secs, sndbuf, rcvbuf;
    uint64_t scatter;               /* bw: the receiver's block size; 0: one buffer */
} params_t;

/* What the server answers: all zeroes once it is ready for the data connections, then, when
 * it is done, what it received, its first data socket's buffer sizes, and the CPU time its
 * process took over how long its part lasted (microseconds). On a failure it closes the
 * control connection instead. */
typedef struct {
    uint64_t bytes, rcvbuf, sndbuf, cpu_usec, wall_usec;
} result_t;

/* One data connection and the thread that moves its share. */
typedef struct {
    int               fd;
    uint8_t           *buf;
    const params_t    *p;
    uint64_t          msgs;         /* bw sender with -n: messages to send */
    double            deadline;     /* bw sender with -t: CLOCK_MONOTONIC seconds */
    pthread_barrier_t *start;
    int               ep;           /* --wait epoll: this stream's epoll set */
    uint32_t          ep_events;    /* what it waits for: EPOLLIN or EPOLLOUT */
    uint64_t          bytes;
    uint64_t          zc_sent;      /* sends with MSG_ZEROCOPY that moved bytes */
    uint64_t          zc_done;      /* of those, completions reaped */
    uint64_t          zc_copied;    /* of those, completions flagged ZEROCOPY_COPIED */
    struct iovec      *blocks;      /* --scatter: a message's blocks in buf, out of order */
    size_t            nblocks;
    char              err[160];
} stream_t;

double floor_now_sec(void);
int    floor_run_streams(stream_t *st, unsigned n, void *(*fn)(void *), double *t0_p);
void   *floor_bw_sender(void *arg);
void   *floor_bw_receiver(void *arg);
int    floor_lat_run(stream_t *s, double *rtt);

#endif
