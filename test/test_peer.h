/*
 * Two (or more) real processes for the data-path suites. The parent forks a child that runs a
 * scenario function against its own context - as the server (it listens, hands its port back
 * and accepts) or as a client (it connects to an address the parent gives). The child reports
 * pass/fail through its exit status and says why on stderr; alarm() and PR_SET_PDEATHSIG make
 * sure it never outlives a broken test. A socketpair (the "control channel") lets the two
 * scenarios exchange what xfer itself is not under test for: rkey blobs, barriers, commands.
 *
 * Every suite runs over the transport named by XFERTEST_TRANSPORT (default "tcp"): tp_env()
 * puts it in XFER_TRANSPORTS before any context is created, and every connection made here
 * asserts that it is the transport the two sides agreed on. Nothing in a scenario may depend
 * on which transport that is.
 */
#ifndef XFER_TEST_PEER_H
#define XFER_TEST_PEER_H

#include <xfer/xfer.h>

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Upper bound for any single wait in a scenario: a bug fails the test instead of hanging.
 * Under valgrind (XFERTEST_VALGRIND set) every step runs tens of times slower, and in the
 * emulated guest a step that takes a few seconds can pass 20 s: there the bound is tripled. */
#define TP_WAIT_MS    (20000 * tp_slowdown())
int tp_slowdown(void);
/* Seconds a child may live before SIGALRM kills it. */
#define TP_CHILD_ALARM_S (90 * tp_slowdown())

/* XFERTEST_TRANSPORT, or "tcp". */
const char *tp_transport(void);
/* XFER_TRANSPORTS=<tp_transport()>, a short bootstrap timeout, no inherited component path.
 * Call it from every suite's .init (the children inherit it). */
void tp_env(void);
/* A context under the current environment; flags are XFER_CONTEXT_FLAG_*. Asserts success.
 * Under XFERTEST_SERIALIZED=1 it (and every child's context) is XFER_CONTEXT_FLAG_SERIALIZED
 * unless it has a progress thread. */
xfer_context_t *tp_context(uint32_t flags);

/* ---- the child's side ------------------------------------------------------------------------ */

typedef struct tp_side {
    xfer_context_t  *ctx;
    xfer_listener_t *listener;      /* server only */
    xfer_endpoint_t *ep;            /* the first connection (NULL when opts.accepts == 0) */
    int             ctl;            /* control channel to the parent */
    int             index;          /* which child this is (tp_opts_t.index) */
    void            *arg;
} tp_side_t;

/* Return 0 for success. Failing checks (TP_CHECK) _exit(1) directly. */
typedef int (*tp_scenario_t)(tp_side_t *side);

typedef struct tp_opts {
    const char *transports;         /* XFER_TRANSPORTS in the child; NULL: as the parent */
    const char *component_path;     /* XFER_COMPONENT_PATH in the child; NULL: unchanged */
    uint32_t   ctx_flags;           /* XFER_CONTEXT_FLAG_* for the child's context */
    int        accepts;             /* server: connections accepted first; 0: one, -1: none */
    int        index;
    int        expect_connect;      /* client: the status its connect must return (0 = OK) */
} tp_opts_t;

void tp_child_fail(const char *file, int line, const char *what, const char *fmt, ...)
    __attribute__((format(printf, 4, 5), noreturn));

#define TP_CHECK(_cond, ...) \
    do { \
        if (!(_cond)) { \
            tp_child_fail(__FILE__, __LINE__, #_cond, __VA_ARGS__); \
        } \
    } while (0)

/* Check a status against the expected one, naming both on failure. */
#define TP_CHECK_STATUS(_expr, _want) \
    do { \
        xfer_status_t _s = (_expr), _w = (_want); \
        if (_s != _w) { \
            tp_child_fail(__FILE__, __LINE__, #_expr, "returned %s (%d), expected %s", \
                          xfer_status_string(_s), (int)_s, xfer_status_string(_w)); \
        } \
    } while (0)

/* Posting succeeded: XFER_OK or XFER_INPROGRESS. */
#define TP_POSTED(_s) (((_s) == XFER_OK) || ((_s) == XFER_INPROGRESS))

/* Progress the child's context until a control message arrives (or timeout_ms). Used by
 * targets of one-sided operations, which must progress without a request of their own. */
int tp_progress_until_ctl(tp_side_t *side, int timeout_ms);
/* Progress the context for ms milliseconds. */
void tp_progress_for(xfer_context_t *ctx, int ms);

/* ---- the parent's side ----------------------------------------------------------------------- */

typedef struct tp_peer {
    pid_t           pid;
    int             ctl;            /* control channel to the child */
    char            address[64];    /* server children: where they listen */
    xfer_context_t  *ctx;           /* tp_start(): the parent's context */
    xfer_endpoint_t *ep;            /* tp_start(): the parent's connection to the child */
} tp_peer_t;

/* Fork a server child; returns once it listens (peer->address set). opts may be NULL. */
void tp_server_spawn(tp_peer_t *peer, tp_scenario_t fn, void *arg, const tp_opts_t *opts);
/* Fork a client child that connects to address, then runs fn. opts may be NULL. */
void tp_client_spawn(tp_peer_t *peer, const char *address, tp_scenario_t fn, void *arg,
                     const tp_opts_t *opts);
/* Connect ctx to a server child and assert the negotiated transport. */
xfer_endpoint_t *tp_connect(xfer_context_t *ctx, const tp_peer_t *peer);
/* The usual case: a fresh context in the parent, a server child, one connection. */
void tp_start(tp_peer_t *peer, tp_scenario_t fn, void *arg);
void tp_start_opts(tp_peer_t *peer, tp_scenario_t fn, void *arg, const tp_opts_t *opts,
                   uint32_t ctx_flags);
/* Wait up to timeout_s for the child; returns its exit code, 128 + signal, or -1 when it had
 * to be killed. */
int tp_child_wait(tp_peer_t *peer, int timeout_s);
/* Assert that the child exited 0 within timeout_s. */
void tp_child_expect_ok(tp_peer_t *peer, int timeout_s);
/* Close peer->ep and peer->ctx (when set), then tp_child_expect_ok(). */
void tp_finish(tp_peer_t *peer);

/* ---- control channel (both sides) ------------------------------------------------------------ */

/* Length-prefixed messages. Return 0 on success, -1 on error, EOF or timeout. */
int tp_ctl_send(int fd, const void *buf, size_t len);
int tp_ctl_recv(int fd, void *buf, size_t cap, size_t *len_p, int timeout_ms);
/* A malloc'd message of any length. */
int tp_ctl_recv_alloc(int fd, void **buf_p, size_t *len_p, int timeout_ms);
int tp_ctl_send_u64(int fd, uint64_t v);
int tp_ctl_recv_u64(int fd, uint64_t *v_p, int timeout_ms);
/* Is a control message waiting (or the other side gone)? */
int tp_ctl_ready(int fd, int timeout_ms);

/* Parent-side versions that assert, and name the child's fate when it went away. */
void tp_send(tp_peer_t *peer, uint64_t v);
uint64_t tp_recv(tp_peer_t *peer);
/* tp_recv() for a peer whose answer may take longer than TP_WAIT_MS. */
uint64_t tp_recv_within(tp_peer_t *peer, int timeout_ms);
void tp_send_blob(tp_peer_t *peer, const void *buf, size_t len);
void *tp_recv_blob(tp_peer_t *peer, size_t *len_p);

/* ---- requests -------------------------------------------------------------------------------- */

/* The status of an operation that was posted with status s and request req: the error when
 * posting failed (req must then be untouched: NULL), else the request's final status within
 * timeout_ms. The request is released. */
xfer_status_t tp_op_result(xfer_status_t s, xfer_request_t *req, int timeout_ms);
/* What a request's callback saw: how often it ran, and the status it was last given. */
typedef struct tp_calls {
    int           calls;
    xfer_status_t status;
} tp_calls_t;
/* A request callback that counts its calls into the tp_calls_t at arg. */
void tp_calls_cb(xfer_request_t *req, xfer_status_t status, void *arg);
/* Flush ep and wait: XFER_OK once every put posted before is in the peer's memory. */
xfer_status_t tp_flush(xfer_endpoint_t *ep, int timeout_ms);

/* ---- a shared scenario ----------------------------------------------------------------------- */

#define TP_ECHO_MAX  (1u << 20)             /* largest message the echo server takes */
#define TP_TAG_STOP  0xFFFFFFFFFFFFFFF0ull  /* ends tp_echo_server */

/* Receive from any tag (on the first endpoint) and send each message back with its tag,
 * until a message tagged TP_TAG_STOP. */
int tp_echo_server(tp_side_t *side);
/* One round trip through an echo server: len bytes under tag; asserts the data came back. */
void tp_echo_ping(xfer_context_t *ctx, xfer_endpoint_t *ep, uint64_t tag, size_t len);
/* Tell an echo server to stop (does not wait for the process). */
void tp_echo_stop(xfer_endpoint_t *ep);
/* The process still works after a fault: a new echo peer answers a ping of each length in
 * lens (0-terminated); asserts it. */
void tp_another_peer_works(xfer_context_t *ctx, const size_t *lens);

/* ---- connections made by hand (peer_conn.c) -------------------------------------------------- */

/* A child relaying one connection to 127.0.0.1:server_port, every byte both ways, until either
 * side closes; *port_p is where the client reaches it. The client's bytes are written to
 * record (when not NULL), the server's to record.back, and the client's byte at offset tamper
 * (>= 0) is flipped on the way. */
pid_t tp_relay_spawn(uint16_t server_port, const char *record, long tamper, uint16_t *port_p);

/* A client child with env_name=env_value (NULL: unset) that connects to 127.0.0.1:port and
 * sends "hi" (3 bytes) under TP_TAG_HI; its exit code is 0, or 20 - the status it got. */
#define TP_TAG_HI 0x6869ull
pid_t tp_hi_client_spawn(uint16_t port, const char *env_name, const char *env_value);
/* The outcome of l's next handshake within TP_WAIT_MS: XFER_OK with *ep_p, or its failure. */
xfer_status_t tp_accept_next(xfer_listener_t *l, xfer_endpoint_t **ep_p);
/* Wait for a child: its exit code, or 128 + the signal that ended it. */
int tp_exit_code(pid_t pid);

/* ---- data ------------------------------------------------------------------------------------ */

/* A reproducible, non-periodic byte pattern; tp_check_pattern returns the first bad offset
 * or -1. */
void tp_fill_pattern(void *buf, size_t len, uint64_t seed);
ssize_t tp_check_pattern(const void *buf, size_t len, uint64_t seed);
/* The same for bytes [off, off + len) of a pattern that starts at buf (the bytes a transfer
 * that starts at buf puts there), so that parts of a buffer can be filled and checked alone. */
void tp_fill_pattern_at(void *buf, size_t off, size_t len, uint64_t seed);
ssize_t tp_check_pattern_at(const void *buf, size_t off, size_t len, uint64_t seed);
/* Milliseconds on a monotonic clock. */
double tp_now_ms(void);

#endif
