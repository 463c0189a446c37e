/*
 * xfer_perf: bandwidth and latency between two processes over xfer, like ib_write_bw /
 * ib_write_lat and ucx_perftest.
 *
 *   xfer_perf [-p PORT] [-x TRANSPORTS]       server: serves one client, then exits
 *   xfer_perf [options] HOST                  client: runs the test and prints the table
 *
 * Before each message size the client sends the test parameters to the server in a tag
 * message, so the server needs no options but -p (and -x to restrict what it offers).
 *
 * What the columns mean (MB = 10^6 bytes; BW average = bytes * iterations / time, MsgRate =
 * iterations / time):
 *   put_bw, get_bw, tag_bw, tensor_bw   WINDOW operations are kept in flight; the clock runs on
 *       the client from the first timed operation until the server has acknowledged the end
 *       (a final tag handshake), so it covers completion at the peer. t_typical and t_99% are
 *       the median and 99th percentile of the time between consecutive completions; t_avg is
 *       the whole time divided by the iterations.
 *   tag_lat      ping-pong of tagged messages; t_* is half the round trip.
 *   put_lat      ping-pong of puts, like ib_write_lat: each side puts into the other's buffer and
 *       waits - calling xfer_progress() - for the last byte of its own buffer to change;
 *       t_* is half the round trip. (It relies on the last byte landing last, as ib_write_lat
 *       does; -V checks the rest of the buffer once the last byte has changed.)
 *   tensor_lat   the server keeps (step i, "perf") published ahead; t_* is one whole fetch on
 *       the client - request to the producer and data back into a registered buffer - not
 *       halved.
 *   For latency tests BW average = bytes / t_avg and MsgRate = 1 / t_avg.
 *
 * -V fills every buffer with a pattern that depends on the iteration and the offset and checks
 * it where it lands; figures taken with -V include that work.
 *
 * Exit status: 0; 1 on an error or a verification failure (the message says which); 2 on a
 * usage error.
 */
#include <xfer/byteorder.h>
#include <xfer/xfer.h>

#include <endian.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DEFAULT_PORT      18515
#define DEFAULT_WINDOW    16
#define MAX_WINDOW        1024
#define MAX_SIZE          (1ull << 30)
#define SWEEP_MAX         (8ull << 20)
#define WINDOW_BYTES_MAX  (256ull << 20)    /* per side: the window shrinks for large sizes */
#define TIMEOUT_MS        60000             /* the longest wait for one operation or message */
#define TENSOR_LAT_DEPTH  2                 /* tensor_lat: publishes the server keeps ahead */
#define MAX_ROWS          64
#define PERF_KEY          "perf"

/* Tags: control messages on one tag (so they match in order), data on their own. */
#define TAG_CTRL   0x7866706300000000ull    /* "xfpc" */
#define TAG_DATA   0x7866706400000000ull    /* "xfpd" | iteration (tag_bw) */
#define TAG_PING   0x7866706900000000ull
#define TAG_PONG   0x7866706f00000000ull
#define TAG_FULL   UINT64_MAX

/* Pattern seeds: who wrote the data. */
#define SEED_CLIENT 1
#define SEED_SERVER 2

typedef enum {
    TEST_PUT_BW, TEST_GET_BW, TEST_TAG_BW, TEST_TENSOR_BW,
    TEST_PUT_LAT, TEST_TAG_LAT, TEST_TENSOR_LAT,
    TEST_LAST
} test_t;

static const struct {
    const char *name;
    int        bw;          /* WINDOW operations in flight; else a ping-pong */
    int        server_rkey; /* the server sends the client an rkey of its buffer */
} tests[TEST_LAST] = {
    [TEST_PUT_BW]     = {"put_bw",     1, 1},
    [TEST_GET_BW]     = {"get_bw",     1, 1},
    [TEST_TAG_BW]     = {"tag_bw",     1, 0},
    [TEST_TENSOR_BW]  = {"tensor_bw",  1, 0},
    [TEST_PUT_LAT]    = {"put_lat",    0, 1},
    [TEST_TAG_LAT]    = {"tag_lat",    0, 0},
    [TEST_TENSOR_LAT] = {"tensor_lat", 0, 0},
};

typedef struct options {
    const char *host;       /* NULL: server */
    unsigned   port;
    test_t     test;
    size_t     size;
    int        sweep;
    uint64_t   iters;       /* 0: a default for the size */
    int64_t    warmup;      /* -1: a default for the iterations */
    unsigned   window;
    const char *transports;
    int        verify;
    int        json;
    int        verbose;
    int        multi;       /* -T multi: the context's lock, as a threaded application has */
} options_t;

/* ---- control messages ------------------------------------------------------------------------
 * Every control message, little-endian:
 *   magic u32 | version u16 | kind u16 | status i32 (an xfer_status_t) | length u32 | payload
 * PARAMS payload (client -> server, before each size):
 *   test u32 | flags u32 | window u32 | reserved u32 | size u64 | iterations u64 | warmup u64 |
 *   step_base u64
 * READY (server -> client): an rkey blob for put/get tests, or on error a message.
 * RKEY  (client -> server, put_lat): the client's rkey blob.
 * FIN   (client -> server, end of a size) and ACK (the reply: on a verification failure the
 *   status is an error and the payload says what); BYE ends the session and is ACKed too.
 */
#define MSG_MAGIC    0x78667066u
#define MSG_VERSION  1
#define MSG_HDR_LEN  16
#define MSG_MAX      4096
#define PARAMS_LEN   48
#define PARAM_VERIFY (1u << 0)

typedef enum { MSG_PARAMS = 1, MSG_READY, MSG_RKEY, MSG_FIN, MSG_ACK, MSG_BYE } msg_kind_t;

static const char *msg_names[] = {"?", "PARAMS", "READY", "RKEY", "FIN", "ACK", "BYE"};

typedef struct perf_params {
    uint32_t test;
    uint32_t flags;
    uint32_t window;
    uint64_t size;
    uint64_t iters;
    uint64_t warmup;
    uint64_t step_base;     /* tensor tests: first step of this size */
} perf_params_t;

/* One operation in flight. */
typedef struct op_slot {
    xfer_request_t *req;
    xfer_status_t  status;
    int            done;
    uint64_t       t_done;  /* ns, set by the completion callback; 0 until known */
} op_slot_t;

typedef struct result {
    uint64_t bytes;
    uint64_t iters;
    unsigned window;
    double   bw_mbps;
    double   mpps;
    double   t_typical;
    double   t_avg;
    double   t_99;
} result_t;

typedef struct perf {
    options_t       opts;
    xfer_context_t  *ctx;
    xfer_listener_t *listener;
    xfer_endpoint_t *ep;
    perf_params_t   p;              /* the size being run */
    /* resources of one size; run_release() undoes them */
    uint8_t         *buf;           /* slots of p.size bytes */
    size_t          nslots;
    xfer_mem_t      *mem;
    xfer_rkey_t     *rkey;          /* the peer's buffer */
    op_slot_t       *ops;
    double          *samples;       /* client: one per timed iteration, usec */
    char            verify_error[256];
    uint8_t         ctrl_buf[MSG_MAX];  /* the next control message lands here */
    xfer_request_t  *ctrl_req;          /* its receive, when posted ahead */
    result_t        rows[MAX_ROWS];
    unsigned        nrows;
} perf_t;

/* ---- small helpers --------------------------------------------------------------------------- */

static uint64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int fail(const char *what, xfer_status_t status)
{
    fprintf(stderr, "xfer_perf: %s: %s\n", what, xfer_status_string(status));
    return -1;
}

static uint8_t *slot_buf(perf_t *perf, size_t slot)
{
    return perf->buf + slot * perf->p.size;
}

static uint64_t rkey_slot_addr(perf_t *perf, size_t slot)
{
    return xfer_rkey_address(perf->rkey) + slot * perf->p.size;
}

/* The first verification failure wins; the run goes on so both sides finish cleanly. */
static void verify_fail(perf_t *perf, const char *fmt, ...)
{
    va_list ap;

    if (perf->verify_error[0] != '\0') {
        return;
    }
    va_start(ap, fmt);
    vsnprintf(perf->verify_error, sizeof(perf->verify_error), fmt, ap);
    va_end(ap);
}

/* ---- data pattern ---------------------------------------------------------------------------- */

static uint64_t pattern_word(uint64_t seed, uint64_t iter, uint64_t word)
{
    uint64_t x = (seed << 60) ^ (iter << 28) ^ word ^ 0x9e3779b97f4a7c15ull;

    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return htole64(x);
}

static void pattern_fill(uint8_t *p, size_t len, uint64_t seed, uint64_t iter)
{
    size_t off;
    uint64_t w;

    for (off = 0; off + 8 <= len; off += 8) {
        w = pattern_word(seed, iter, off / 8);
        memcpy(p + off, &w, 8);
    }
    if (off < len) {
        w = pattern_word(seed, iter, off / 8);
        memcpy(p + off, &w, len - off);
    }
}

static void pattern_check(perf_t *perf, const uint8_t *p, size_t len, uint64_t seed,
                          uint64_t iter, const char *what)
{
    uint8_t expect[8];
    size_t off, n, i;
    uint64_t w;

    for (off = 0; off < len; off += 8) {
        n = (len - off < 8) ? len - off : 8;
        w = pattern_word(seed, iter, off / 8);
        memcpy(expect, &w, 8);
        if (memcmp(p + off, expect, n) == 0) {
            continue;
        }
        for (i = 0; p[off + i] == expect[i]; i++) {
        }
        verify_fail(perf, "%s: iteration %" PRIu64 ", %" PRIu64 " bytes: byte %zu is 0x%02x, "
                    "expected 0x%02x", what, iter, perf->p.size, off + i, p[off + i], expect[i]);
        return;
    }
}

/* ---- control messages ------------------------------------------------------------------------ */

static xfer_status_t wait_req(xfer_request_t *req)
{
    xfer_status_t status = xfer_request_wait(req, TIMEOUT_MS);

    if (status == XFER_ERR_TIMEOUT) {
        fprintf(stderr, "xfer_perf: no progress in %d s\n", TIMEOUT_MS / 1000);
    }
    return status;
}

static int ctrl_send(perf_t *perf, msg_kind_t kind, xfer_status_t status, const void *payload,
                     size_t len)
{
    uint8_t msg[MSG_MAX];
    xfer_request_t *req = NULL;
    xfer_status_t st;
    char what[64];

    snprintf(what, sizeof(what), "sending %s", msg_names[kind]);
    if (len > MSG_MAX - MSG_HDR_LEN) {
        return fail(what, XFER_ERR_OUT_OF_RANGE);
    }
    xfer_put_le32(msg, MSG_MAGIC);
    xfer_put_le32(msg + 4, MSG_VERSION | ((uint32_t)kind << 16));
    xfer_put_le32(msg + 8, (uint32_t)status);
    xfer_put_le32(msg + 12, (uint32_t)len);
    if (len > 0) {
        memcpy(msg + MSG_HDR_LEN, payload, len);
    }
    st = xfer_tag_send(perf->ep, TAG_CTRL, msg, MSG_HDR_LEN + len, NULL, NULL, NULL, &req);
    if (st != XFER_OK && st != XFER_INPROGRESS) {
        return fail(what, st);
    }
    if (req != NULL) {
        st = wait_req(req);
        xfer_request_release(req);
        if (st != XFER_OK) {
            return fail(what, st);
        }
    }
    return 0;
}

/*
 * Post the receive of the next control message ahead, before sending what it answers: a
 * request/response pair should not depend on the unexpected queue.
 */
static int ctrl_post(perf_t *perf)
{
    xfer_status_t st;

    st = xfer_tag_recv(perf->ctx, perf->ep, TAG_CTRL, TAG_FULL, perf->ctrl_buf,
                       sizeof(perf->ctrl_buf), NULL, NULL, NULL, &perf->ctrl_req);
    if (st != XFER_OK && st != XFER_INPROGRESS) {
        perf->ctrl_req = NULL;
        return fail("posting the receive of a control message", st);
    }
    return 0;
}

/*
 * Receive the next control message (posting its receive unless ctrl_post() did), which must
 * be of kind `kind` (or BYE when bye_ok). The payload is copied to payload (up to MSG_MAX
 * bytes) and NUL-terminated.
 */
static int ctrl_recv(perf_t *perf, msg_kind_t kind, int bye_ok, msg_kind_t *kind_p,
                     xfer_status_t *status_p, uint8_t *payload, size_t *len_p)
{
    const uint8_t *msg = perf->ctrl_buf;
    xfer_request_t *req;
    xfer_status_t st;
    uint32_t got_kind, len;
    size_t n;
    char what[64];

    snprintf(what, sizeof(what), "waiting for %s from the peer", msg_names[kind]);
    if (perf->ctrl_req == NULL && ctrl_post(perf) != 0) {
        return -1;
    }
    req = perf->ctrl_req;
    perf->ctrl_req = NULL;
    st = wait_req(req);
    n = xfer_request_length(req);
    if (st == XFER_ERR_TIMEOUT) {
        xfer_request_cancel(req);
    }
    xfer_request_release(req);
    if (st != XFER_OK) {
        return fail(what, st);
    }
    if (n < MSG_HDR_LEN || xfer_get_le32(msg) != MSG_MAGIC ||
        (xfer_get_le32(msg + 4) & 0xffff) != MSG_VERSION) {
        fprintf(stderr, "xfer_perf: %s: not an xfer_perf v%d control message (%zu bytes)\n",
                what, MSG_VERSION, n);
        return -1;
    }
    got_kind = xfer_get_le32(msg + 4) >> 16;
    len = xfer_get_le32(msg + 12);
    if (len != n - MSG_HDR_LEN ||
        (got_kind != (uint32_t)kind && !(bye_ok && got_kind == MSG_BYE))) {
        fprintf(stderr, "xfer_perf: %s: protocol error: got %s with %u payload bytes in a "
                "%zu-byte message\n", what,
                got_kind < sizeof(msg_names) / sizeof(msg_names[0]) ? msg_names[got_kind] : "?",
                len, n);
        return -1;
    }
    memcpy(payload, msg + MSG_HDR_LEN, len);
    payload[len] = '\0';
    *kind_p = (msg_kind_t)got_kind;
    *status_p = (xfer_status_t)(int32_t)xfer_get_le32(msg + 8);
    *len_p = len;
    return 0;
}

static void params_encode(const perf_params_t *p, uint8_t *out)
{
    xfer_put_le32(out, p->test);
    xfer_put_le32(out + 4, p->flags);
    xfer_put_le32(out + 8, p->window);
    xfer_put_le32(out + 12, 0);
    xfer_put_le64(out + 16, p->size);
    xfer_put_le64(out + 24, p->iters);
    xfer_put_le64(out + 32, p->warmup);
    xfer_put_le64(out + 40, p->step_base);
}

/* NULL when the parameters are usable, else why not. */
static const char *params_decode(const uint8_t *in, size_t len, perf_params_t *p)
{
    if (len != PARAMS_LEN) {
        return "PARAMS has the wrong length";
    }
    p->test = xfer_get_le32(in);
    p->flags = xfer_get_le32(in + 4);
    p->window = xfer_get_le32(in + 8);
    p->size = xfer_get_le64(in + 16);
    p->iters = xfer_get_le64(in + 24);
    p->warmup = xfer_get_le64(in + 32);
    p->step_base = xfer_get_le64(in + 40);
    if (p->test >= TEST_LAST) {
        return "unknown test";
    }
    if (p->size == 0 || p->size > MAX_SIZE) {
        return "size out of range";
    }
    if (p->window == 0 || p->window > MAX_WINDOW ||
        (uint64_t)p->window * p->size > WINDOW_BYTES_MAX + MAX_SIZE) {
        return "window out of range";
    }
    if (p->iters == 0 || p->iters > (1ull << 32) || p->warmup > (1ull << 32)) {
        return "iterations out of range";
    }
    return NULL;
}

/* ---- the resources of one size ------------------------------------------------------------- */

static int run_setup(perf_t *perf, int client)
{
    const perf_params_t *p = &perf->p;
    xfer_status_t st;
    void *buf;

    if (tests[p->test].bw) {
        perf->nslots = p->window;
    } else if (p->test == TEST_TENSOR_LAT) {
        perf->nslots = client ? 1 : TENSOR_LAT_DEPTH;
    } else {
        perf->nslots = 2;   /* ping-pong: [0] the peer writes here, [1] we send from here */
    }
    if (posix_memalign(&buf, 4096, perf->nslots * p->size) != 0) {
        return fail("allocating the buffers", XFER_ERR_NO_MEMORY);
    }
    memset(buf, 0, perf->nslots * p->size);    /* fault the pages in before the clock runs */
    perf->buf = buf;
    perf->ops = calloc(perf->nslots, sizeof(*perf->ops));
    if (perf->ops == NULL) {
        return fail("allocating the requests", XFER_ERR_NO_MEMORY);
    }
    if (client) {
        perf->samples = calloc(p->iters, sizeof(*perf->samples));
        if (perf->samples == NULL) {
            return fail("allocating the samples", XFER_ERR_NO_MEMORY);
        }
    }
    st = xfer_mem_register(perf->ctx, perf->buf, perf->nslots * p->size, XFER_MEM_HOST,
                           &perf->mem);
    if (st != XFER_OK) {
        return fail("xfer_mem_register", st);
    }
    return 0;
}

/* Give back what xfer holds; after an error the endpoint is closed first (see main). */
static void run_release(perf_t *perf)
{
    xfer_status_t st;

    for (size_t i = 0; perf->ops != NULL && i < perf->nslots; i++) {
        if (perf->ops[i].req != NULL) {
            xfer_request_release(perf->ops[i].req);
            perf->ops[i].req = NULL;
        }
    }
    if (perf->rkey != NULL) {
        xfer_rkey_destroy(perf->rkey);
        perf->rkey = NULL;
    }
    if (perf->mem != NULL) {
        st = xfer_mem_deregister(perf->mem);
        if (st != XFER_OK) {
            fail("xfer_mem_deregister", st);
        }
        perf->mem = NULL;
    }
}

static void run_free(perf_t *perf)
{
    free(perf->samples);
    free(perf->ops);
    free(perf->buf);
    perf->samples = NULL;
    perf->ops = NULL;
    perf->buf = NULL;
}

/* Unpack the peer's rkey blob and check that it covers nslots slots. */
static int rkey_take(perf_t *perf, const uint8_t *blob, size_t len, size_t nslots)
{
    xfer_status_t st = xfer_rkey_unpack(perf->ep, blob, len, &perf->rkey);

    if (st != XFER_OK) {
        return fail("xfer_rkey_unpack", st);
    }
    if (xfer_rkey_length(perf->rkey) < nslots * perf->p.size) {
        fprintf(stderr, "xfer_perf: the peer's rkey covers %zu bytes, expected %" PRIu64 "\n",
                xfer_rkey_length(perf->rkey), nslots * perf->p.size);
        return -1;
    }
    return 0;
}

/* ---- waiting --------------------------------------------------------------------------------- */

static void op_cb(xfer_request_t *req, xfer_status_t status, void *arg)
{
    op_slot_t *op = arg;

    op->t_done = now_ns();
    op->status = status;
    op->done = 1;
}

/* Latency loops spin; a deadline is checked now and then so a dead peer cannot hang us. */
static xfer_status_t spin_test(xfer_request_t *req)
{
    uint64_t deadline = 0;
    unsigned n = 0;
    xfer_status_t st;

    while ((st = xfer_request_test(req)) == XFER_INPROGRESS) {
        if ((++n & 0xfff) == 0) {
            if (deadline == 0) {
                deadline = now_ns() + TIMEOUT_MS * 1000000ull;
            } else if (now_ns() > deadline) {
                fprintf(stderr, "xfer_perf: no progress in %d s\n", TIMEOUT_MS / 1000);
                return XFER_ERR_TIMEOUT;
            }
        }
    }
    return st;
}

/* After posting into op: a post that returned XFER_OK without a request completed at once. */
static int op_posted(op_slot_t *op, xfer_status_t st, const char *what)
{
    if (st != XFER_OK && st != XFER_INPROGRESS) {
        return fail(what, st);
    }
    if (op->req == NULL && !op->done) {
        op->t_done = now_ns();
        op->status = XFER_OK;
        op->done = 1;
    }
    return 0;
}

static void op_reset(op_slot_t *op)
{
    op->req = NULL;
    op->done = 0;
    op->status = XFER_INPROGRESS;
    op->t_done = 0;
}

/* Wait (sleeping, or spinning) for op; its request stays for the caller to release. */
static xfer_status_t op_wait(op_slot_t *op, int spin)
{
    xfer_status_t st;

    if (!op->done && op->req != NULL) {
        st = spin ? spin_test(op->req) : wait_req(op->req);
        if (st == XFER_ERR_TIMEOUT) {
            return st;
        }
        if (!op->done) {    /* no callback: the window engine takes the time if it needs it */
            op->status = st;
            op->done = 1;
        }
    }
    return op->status;
}

static void op_release(op_slot_t *op)
{
    if (op->req != NULL) {
        xfer_request_release(op->req);
        op->req = NULL;
    }
}

/* ---- the window engine (bandwidth tests, tensor_lat's server) ------------------------------- */

typedef xfer_status_t (*post_fn_t)(perf_t *perf, size_t slot, uint64_t iter, op_slot_t *op);
typedef void (*done_fn_t)(perf_t *perf, size_t slot, uint64_t iter, op_slot_t *op);

/*
 * Run iterations [first, first + count) with up to `window` in flight: post into the free
 * slot, wait for the oldest, check it, post the next. With samples, samples[k] gets the time
 * between completion k and the one before it (the first one: since *t_prev).
 */
static int window_run(perf_t *perf, uint64_t first, uint64_t count, size_t window, int spin,
                      post_fn_t post, done_fn_t done, const char *what, uint64_t *t_prev,
                      double *samples)
{
    uint64_t next = first, oldest = first, end = first + count;
    xfer_status_t st;
    op_slot_t *op;

    while (oldest < end) {
        while (next < end && next - oldest < window) {
            op = &perf->ops[next % window];
            op_reset(op);
            if (op_posted(op, post(perf, next % window, next, op), what) != 0) {
                return -1;
            }
            next++;
        }
        op = &perf->ops[oldest % window];
        st = op_wait(op, spin);
        if ((samples != NULL) && (op->t_done == 0)) {
            op->t_done = now_ns();  /* completed without a callback */
        }
        if (st != XFER_OK) {
            fprintf(stderr, "xfer_perf: %s, iteration %" PRIu64 ": %s\n", what, oldest,
                    xfer_status_string(st));
            return -1;
        }
        if (done != NULL) {
            done(perf, oldest % window, oldest, op);
        }
        op_release(op);
        if (samples != NULL) {
            /* completions are taken in order; one that came early counts as back to back */
            uint64_t t = (op->t_done > *t_prev) ? op->t_done : *t_prev;

            samples[oldest - first] = (double)(t - *t_prev) / 1e3;
            *t_prev = t;
        }
        oldest++;
    }
    return 0;
}

/* put_bw, get_bw: the client's side */
static xfer_status_t put_post(perf_t *perf, size_t slot, uint64_t iter, op_slot_t *op)
{
    uint8_t *buf = slot_buf(perf, slot);

    if (perf->p.flags & PARAM_VERIFY) {
        pattern_fill(buf, perf->p.size, SEED_CLIENT, iter);
    }
    return xfer_put(perf->ep, buf, perf->p.size, perf->mem, rkey_slot_addr(perf, slot),
                    perf->rkey, op_cb, op, &op->req);
}

static xfer_status_t get_post(perf_t *perf, size_t slot, uint64_t iter, op_slot_t *op)
{
    uint8_t *buf = slot_buf(perf, slot);

    if (perf->p.flags & PARAM_VERIFY) {
        memset(buf, 0, perf->p.size);
    }
    return xfer_get(perf->ep, buf, perf->p.size, perf->mem, rkey_slot_addr(perf, slot),
                    perf->rkey, op_cb, op, &op->req);
}

static void get_done(perf_t *perf, size_t slot, uint64_t iter, op_slot_t *op)
{
    if (perf->p.flags & PARAM_VERIFY) {
        /* the server's buffer never changes: slot s holds the pattern of "iteration" s */
        pattern_check(perf, slot_buf(perf, slot), perf->p.size, SEED_SERVER, slot, "get_bw");
    }
}

/* tag_bw: the client sends, the server receives; each iteration has its own tag */
static xfer_status_t tag_send_post(perf_t *perf, size_t slot, uint64_t iter, op_slot_t *op)
{
    uint8_t *buf = slot_buf(perf, slot);

    if (perf->p.flags & PARAM_VERIFY) {
        pattern_fill(buf, perf->p.size, SEED_CLIENT, iter);
    }
    return xfer_tag_send(perf->ep, TAG_DATA | (iter & 0xffffffffu), buf, perf->p.size,
                         perf->mem, op_cb, op, &op->req);
}

static xfer_status_t tag_recv_post(perf_t *perf, size_t slot, uint64_t iter, op_slot_t *op)
{
    return xfer_tag_recv(perf->ctx, perf->ep, TAG_DATA | (iter & 0xffffffffu), TAG_FULL,
                         slot_buf(perf, slot), perf->p.size, perf->mem, op_cb, op, &op->req);
}

static void tag_recv_done(perf_t *perf, size_t slot, uint64_t iter, op_slot_t *op)
{
    if (op->req != NULL && xfer_request_length(op->req) != perf->p.size) {
        verify_fail(perf, "tag_bw: iteration %" PRIu64 ": received %zu bytes, expected %" PRIu64,
                    iter, xfer_request_length(op->req), perf->p.size);
    } else if (perf->p.flags & PARAM_VERIFY) {
        pattern_check(perf, slot_buf(perf, slot), perf->p.size, SEED_CLIENT, iter, "tag_bw");
    }
}

/* tensor_bw, tensor_lat: the server publishes (step, "perf"), the client fetches */
static xfer_status_t publish_post(perf_t *perf, size_t slot, uint64_t iter, op_slot_t *op)
{
    xfer_tensor_t t = {.dtype = XFER_DTYPE_UINT8, .rank = 1, .dims = {(int64_t)perf->p.size},
                       .size = perf->p.size, .data = slot_buf(perf, slot)};

    if (perf->p.flags & PARAM_VERIFY) {
        pattern_fill(t.data, perf->p.size, SEED_SERVER, iter);
    }
    return xfer_tensor_publish(perf->ctx, perf->p.step_base + iter, PERF_KEY, &t, 0, op_cb, op,
                               &op->req);
}

static xfer_status_t fetch_post(perf_t *perf, size_t slot, uint64_t iter, op_slot_t *op)
{
    xfer_fetch_params_t fp = {.size = sizeof(fp), .buffer = slot_buf(perf, slot),
                              .capacity = perf->p.size, .mem = perf->mem};

    return xfer_tensor_fetch(perf->ep, perf->p.step_base + iter, PERF_KEY, &fp, op_cb, op,
                             &op->req);
}

static void fetch_done(perf_t *perf, size_t slot, uint64_t iter, op_slot_t *op)
{
    const char *name = tests[perf->p.test].name;
    const xfer_tensor_t *t = (op->req != NULL) ? xfer_request_tensor(op->req) : NULL;

    if (t == NULL) {
        verify_fail(perf, "%s: step %" PRIu64 ": the fetch completed without a tensor", name,
                    perf->p.step_base + iter);
    } else if (t->dtype != XFER_DTYPE_UINT8 || t->rank != 1 || t->is_dead ||
               t->dims[0] != (int64_t)perf->p.size || t->size != perf->p.size) {
        verify_fail(perf, "%s: step %" PRIu64 ": got dtype %d rank %u dims[0] %" PRId64
                    " size %" PRIu64 " dead %d, published uint8 [%" PRIu64 "]", name,
                    perf->p.step_base + iter, (int)t->dtype, t->rank, t->dims[0], t->size,
                    t->is_dead, perf->p.size);
    } else if (t->data != slot_buf(perf, slot)) {
        verify_fail(perf, "%s: step %" PRIu64 ": the data is at %p, not in the caller buffer %p",
                    name, perf->p.step_base + iter, t->data, (void *)slot_buf(perf, slot));
    } else if (perf->p.flags & PARAM_VERIFY) {
        pattern_check(perf, t->data, perf->p.size, SEED_SERVER, iter, name);
    }
}

/* ---- ping-pong loops ------------------------------------------------------------------------- */

/* tag_lat. The client times from its send to the reply and halves it. */
static int tag_lat_run(perf_t *perf, int client)
{
    const perf_params_t *p = &perf->p;
    uint64_t total = p->warmup + p->iters, t0, t1;
    uint8_t *rbuf = slot_buf(perf, 0), *sbuf = slot_buf(perf, 1);
    uint64_t rtag = client ? TAG_PONG : TAG_PING, stag = client ? TAG_PING : TAG_PONG;
    uint64_t sseed = client ? SEED_CLIENT : SEED_SERVER, rseed = client ? SEED_SERVER : SEED_CLIENT;
    op_slot_t *r = &perf->ops[0], *s = &perf->ops[1];
    xfer_status_t st;

    for (uint64_t i = 0; i < total; i++) {
        /* the server's receive for i was posted right after its reply to i - 1 */
        if (client || i == 0) {
            op_reset(r);
            st = xfer_tag_recv(perf->ctx, perf->ep, rtag, TAG_FULL, rbuf, p->size, perf->mem,
                               NULL, NULL, &r->req);
            if (op_posted(r, st, "xfer_tag_recv") != 0) {
                return -1;
            }
        }
        if (client && (p->flags & PARAM_VERIFY)) {
            pattern_fill(sbuf, p->size, sseed, i);
        }
        t0 = now_ns();
        if (client) {
            op_reset(s);
            st = xfer_tag_send(perf->ep, stag, sbuf, p->size, perf->mem, NULL, NULL, &s->req);
            if (op_posted(s, st, "xfer_tag_send") != 0) {
                return -1;
            }
        }
        st = op_wait(r, 1);
        t1 = now_ns();
        if (st != XFER_OK) {
            fprintf(stderr, "xfer_perf: tag_lat: receive %" PRIu64 ": %s\n", i,
                    xfer_status_string(st));
            return -1;
        }
        if (r->req != NULL && xfer_request_length(r->req) != p->size) {
            verify_fail(perf, "tag_lat: iteration %" PRIu64 ": received %zu bytes, expected %"
                        PRIu64, i, xfer_request_length(r->req), p->size);
        }
        op_release(r);
        if (p->flags & PARAM_VERIFY) {
            pattern_check(perf, rbuf, p->size, rseed, i, "tag_lat");
        }
        if (!client) {
            /* the reply first: the next ping cannot come back sooner than a round trip, and
             * the receive is posted by then (or the ping waits, unexpected, for it) */
            if (p->flags & PARAM_VERIFY) {
                pattern_fill(sbuf, p->size, sseed, i);
            }
            op_reset(s);
            st = xfer_tag_send(perf->ep, stag, sbuf, p->size, perf->mem, NULL, NULL, &s->req);
            if (op_posted(s, st, "xfer_tag_send") != 0) {
                return -1;
            }
            if (i + 1 < total) {
                op_reset(r);
                st = xfer_tag_recv(perf->ctx, perf->ep, rtag, TAG_FULL, rbuf, p->size, perf->mem,
                                   NULL, NULL, &r->req);
                if (op_posted(r, st, "xfer_tag_recv") != 0) {
                    return -1;
                }
            }
        }
        st = op_wait(s, 1);
        op_release(s);
        if (st != XFER_OK) {
            return fail("tag_lat: send", st);
        }
        if (client && i >= p->warmup) {
            perf->samples[i - p->warmup] = (double)(t1 - t0) / 2e3;
        }
    }
    return 0;
}

static uint8_t put_lat_marker(uint64_t iter)
{
    return (uint8_t)(iter % 255 + 1);   /* never 0, the initial value; changes every iteration */
}

/* Progress until the last byte of our buffer reads m. */
static int put_lat_wait(perf_t *perf, uint8_t m, uint64_t iter)
{
    volatile uint8_t *last = slot_buf(perf, 0) + perf->p.size - 1;
    uint64_t deadline = 0;
    unsigned n = 0;

    while (*last != m) {
        xfer_progress(perf->ctx);
        if ((++n & 0xfff) == 0) {
            if (xfer_endpoint_status(perf->ep) != XFER_OK) {
                return fail("put_lat: the connection", xfer_endpoint_status(perf->ep));
            }
            if (deadline == 0) {
                deadline = now_ns() + TIMEOUT_MS * 1000000ull;
            } else if (now_ns() > deadline) {
                fprintf(stderr, "xfer_perf: put_lat: iteration %" PRIu64 ": the peer's put did "
                        "not arrive in %d s\n", iter, TIMEOUT_MS / 1000);
                return -1;
            }
        }
    }
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    return 0;
}

/* put_lat, like ib_write_lat: the client puts first, the server answers each put with one.
 * Each side, as ib_write_lat does, waits for its put's completion right after posting it -
 * while the answer is on its way - so the source buffer is free again by the next iteration. */
static int put_lat_run(perf_t *perf, int client)
{
    const perf_params_t *p = &perf->p;
    uint64_t total = p->warmup + p->iters, t0 = 0, t1;
    uint8_t *sbuf = slot_buf(perf, 1);
    uint64_t sseed = client ? SEED_CLIENT : SEED_SERVER, rseed = client ? SEED_SERVER : SEED_CLIENT;
    op_slot_t *s = &perf->ops[1];
    xfer_status_t st;

    for (uint64_t i = 0; i < total; i++) {
        if (!client) {
            if (put_lat_wait(perf, put_lat_marker(i), i) != 0) {
                return -1;
            }
            if (p->flags & PARAM_VERIFY) {
                pattern_check(perf, slot_buf(perf, 0), p->size - 1, rseed, i, "put_lat");
            }
        }
        if (p->flags & PARAM_VERIFY) {
            pattern_fill(sbuf, p->size - 1, sseed, i);
        }
        sbuf[p->size - 1] = put_lat_marker(i);
        if (client) {
            t0 = now_ns();
        }
        op_reset(s);
        st = xfer_put(perf->ep, sbuf, p->size, perf->mem, rkey_slot_addr(perf, 0), perf->rkey,
                      NULL, NULL, &s->req);
        if (op_posted(s, st, "put_lat: xfer_put") != 0) {
            return -1;
        }
        st = op_wait(s, 1);
        op_release(s);
        if (st != XFER_OK) {
            return fail("put_lat: put", st);
        }
        if (client) {
            if (put_lat_wait(perf, put_lat_marker(i), i) != 0) {
                return -1;
            }
            t1 = now_ns();
            if (p->flags & PARAM_VERIFY) {
                pattern_check(perf, slot_buf(perf, 0), p->size - 1, rseed, i, "put_lat");
            }
            if (i >= p->warmup) {
                perf->samples[i - p->warmup] = (double)(t1 - t0) / 2e3;
            }
        }
    }
    return 0;
}

/* tensor_lat's client: one fetch at a time, each timed whole. */
static int tensor_lat_run(perf_t *perf)
{
    const perf_params_t *p = &perf->p;
    op_slot_t *op = &perf->ops[0];
    uint64_t t0;
    xfer_status_t st;

    for (uint64_t i = 0; i < p->warmup + p->iters; i++) {
        op_reset(op);
        t0 = now_ns();
        if (op_posted(op, fetch_post(perf, 0, i, op), "xfer_tensor_fetch") != 0) {
            return -1;
        }
        st = op_wait(op, 1);
        if (st != XFER_OK) {
            op_release(op);
            fprintf(stderr, "xfer_perf: tensor_lat: fetch of step %" PRIu64 ": %s\n",
                    p->step_base + i, xfer_status_string(st));
            return -1;
        }
        if (i >= p->warmup) {
            perf->samples[i - p->warmup] = (double)(now_ns() - t0) / 1e3;
        }
        fetch_done(perf, 0, i, op);
        op_release(op);
    }
    return 0;
}

/* ---- results --------------------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

static void result_compute(perf_t *perf, uint64_t elapsed_ns, result_t *r)
{
    const perf_params_t *p = &perf->p;
    size_t n = p->iters, i99;
    double sum = 0;

    qsort(perf->samples, n, sizeof(double), cmp_double);
    for (size_t i = 0; i < n; i++) {
        sum += perf->samples[i];
    }
    i99 = (size_t)ceil(0.99 * (double)n);
    r->bytes = p->size;
    r->iters = n;
    r->window = tests[p->test].bw ? p->window : 1;
    r->t_typical = perf->samples[n / 2];
    r->t_99 = perf->samples[(i99 > 0) ? i99 - 1 : 0];
    /* bandwidth tests: the whole time, handshake included; latency tests: the samples */
    r->t_avg = tests[p->test].bw ? (double)elapsed_ns / 1e3 / (double)n : sum / (double)n;
    r->bw_mbps = (r->t_avg > 0) ? (double)p->size / r->t_avg : 0;    /* bytes/usec == MB/s */
    r->mpps = (r->t_avg > 0) ? 1.0 / r->t_avg : 0;
}

static void print_header(perf_t *perf, const char *addr)
{
    const options_t *o = &perf->opts;
    test_t t = o->test;

    printf("# xfer_perf %s: %s, transport %s, thread mode %s\n", tests[t].name, addr,
           xfer_endpoint_transport(perf->ep), o->multi ? "multi" : "serialized");
    if (tests[t].bw) {
        printf("# window %u (at most %llu MiB in flight), verify %s; t_* = time between "
               "completions, t_avg = total / iterations (MB = 10^6 bytes)\n", o->window,
               WINDOW_BYTES_MAX >> 20, o->verify ? "on" : "off");
    } else {
        printf("# verify %s; t_* = %s (MB = 10^6 bytes)\n", o->verify ? "on" : "off",
               (t == TEST_TENSOR_LAT) ? "one whole fetch" : "half a round trip");
    }
    printf("%-10s %-13s %-18s %-15s %-17s %-13s %s\n", "#bytes", "#iterations",
           "BW average[MB/s]", "MsgRate[Mpps]", "t_typical[usec]", "t_avg[usec]", "t_99%[usec]");
    fflush(stdout);
}

static void print_row(const result_t *r)
{
    printf("%-10" PRIu64 " %-13" PRIu64 " %-18.2f %-15.6f %-17.2f %-13.2f %.2f\n", r->bytes,
           r->iters, r->bw_mbps, r->mpps, r->t_typical, r->t_avg, r->t_99);
    fflush(stdout);
}

static void json_string(const char *s)
{
    putchar('"');
    for (; *s != '\0'; s++) {
        if (*s == '"' || *s == '\\') {
            printf("\\%c", *s);
        } else if ((unsigned char)*s < 0x20) {
            printf("\\u%04x", *s);
        } else {
            putchar(*s);
        }
    }
    putchar('"');
}

static void print_json(perf_t *perf, const char *addr)
{
    printf("{\"test\":\"%s\",\"peer\":", tests[perf->opts.test].name);
    json_string(addr);
    printf(",\"transport\":");
    json_string(xfer_endpoint_transport(perf->ep));
    printf(",\"thread_mode\":\"%s\"", perf->opts.multi ? "multi" : "serialized");
    printf(",\"verify\":%s,\"mb\":1000000,\"results\":[", perf->opts.verify ? "true" : "false");
    for (unsigned i = 0; i < perf->nrows; i++) {
        const result_t *r = &perf->rows[i];

        printf("%s{\"bytes\":%" PRIu64 ",\"iterations\":%" PRIu64 ",\"window\":%u,"
               "\"bw_average_mbps\":%.3f,\"msg_rate_mpps\":%.6f,\"t_typical_usec\":%.3f,"
               "\"t_avg_usec\":%.3f,\"t_99_usec\":%.3f}", i ? "," : "", r->bytes, r->iters,
               r->window, r->bw_mbps, r->mpps, r->t_typical, r->t_avg, r->t_99);
    }
    printf("]}\n");
}

/* ---- client ---------------------------------------------------------------------------------- */

static uint64_t default_iters(test_t t, size_t size)
{
    uint64_t n = (tests[t].bw ? (1ull << 30) : (256ull << 20)) / size;
    uint64_t lo = tests[t].bw ? 200 : 100, hi = tests[t].bw ? 100000 : 20000;

    return (n < lo) ? lo : (n > hi) ? hi : n;
}

/* One size, the client's side; appends a row to perf->rows. 1: the data did not verify. */
static int client_run_size(perf_t *perf, size_t size, uint64_t *step)
{
    const options_t *o = &perf->opts;
    perf_params_t *p = &perf->p;
    uint8_t payload[MSG_MAX + 1];
    uint64_t t_start, t_prev, elapsed;
    xfer_status_t st;
    msg_kind_t kind;
    size_t len;
    void *blob;
    int ret = -1;

    memset(p, 0, sizeof(*p));
    p->test = o->test;
    p->flags = o->verify ? PARAM_VERIFY : 0;
    p->size = size;
    p->window = o->window;
    if (tests[o->test].bw && (uint64_t)p->window * size > WINDOW_BYTES_MAX) {
        p->window = (size >= WINDOW_BYTES_MAX) ? 1 : (uint32_t)(WINDOW_BYTES_MAX / size);
    }
    p->iters = o->iters ? o->iters : default_iters(o->test, size);
    p->warmup = (o->warmup >= 0) ? (uint64_t)o->warmup :
                (p->iters / 10 > 1000) ? 1000 : (p->iters / 10 ? p->iters / 10 : 1);
    p->step_base = *step;
    *step += p->warmup + p->iters;
    if (o->verbose) {
        fprintf(stderr, "# %s %zu bytes: %" PRIu64 " iterations after %" PRIu64 " warm-up, "
                "window %u\n", tests[p->test].name, size, p->iters, p->warmup, p->window);
    }

    params_encode(p, payload);
    if (ctrl_post(perf) != 0 ||
        ctrl_send(perf, MSG_PARAMS, XFER_OK, payload, PARAMS_LEN) != 0 ||
        run_setup(perf, 1) != 0 ||
        ctrl_recv(perf, MSG_READY, 0, &kind, &st, payload, &len) != 0) {
        return -1;
    }
    if (st != XFER_OK) {
        fprintf(stderr, "xfer_perf: the server cannot run %s with %zu bytes: %s (%s)\n",
                tests[p->test].name, size, (char *)payload, xfer_status_string(st));
        return -1;
    }
    if (tests[p->test].server_rkey &&
        rkey_take(perf, payload, len, tests[p->test].bw ? p->window : 1) != 0) {
        return -1;
    }
    if (p->test == TEST_PUT_LAT) {
        st = xfer_rkey_pack(perf->mem, &blob, &len);
        if (st != XFER_OK) {
            return fail("xfer_rkey_pack", st);
        }
        ret = ctrl_send(perf, MSG_RKEY, XFER_OK, blob, len);
        xfer_rkey_blob_free(blob);
        if (ret != 0) {
            return -1;
        }
    }

    switch (p->test) {
    case TEST_PUT_BW:
    case TEST_GET_BW:
    case TEST_TAG_BW:
    case TEST_TENSOR_BW: {
        static const struct { post_fn_t post; done_fn_t done; const char *what; } bw[] = {
            [TEST_PUT_BW]    = {put_post,      NULL,       "xfer_put"},
            [TEST_GET_BW]    = {get_post,      get_done,   "xfer_get"},
            [TEST_TAG_BW]    = {tag_send_post, NULL,       "xfer_tag_send"},
            [TEST_TENSOR_BW] = {fetch_post,    fetch_done, "xfer_tensor_fetch"},
        };

        t_prev = now_ns();
        if (window_run(perf, 0, p->warmup, p->window, 0, bw[p->test].post, bw[p->test].done,
                       bw[p->test].what, &t_prev, NULL) != 0) {
            return -1;
        }
        t_start = t_prev = now_ns();
        ret = window_run(perf, p->warmup, p->iters, p->window, 0, bw[p->test].post,
                         bw[p->test].done, bw[p->test].what, &t_prev, perf->samples);
        break;
    }
    case TEST_PUT_LAT:
        t_start = now_ns();
        ret = put_lat_run(perf, 1);
        break;
    case TEST_TAG_LAT:
        t_start = now_ns();
        ret = tag_lat_run(perf, 1);
        break;
    default:
        t_start = now_ns();
        ret = tensor_lat_run(perf);
        break;
    }
    if (ret != 0) {
        return -1;
    }

    /* the final handshake: the clock stops when the server has seen everything */
    if (ctrl_post(perf) != 0 || ctrl_send(perf, MSG_FIN, XFER_OK, NULL, 0) != 0 ||
        ctrl_recv(perf, MSG_ACK, 0, &kind, &st, payload, &len) != 0) {
        return -1;
    }
    elapsed = now_ns() - t_start;
    if (st != XFER_OK) {
        fprintf(stderr, "xfer_perf: the server reports: %s\n", (char *)payload);
        return 1;
    }
    if (perf->verify_error[0] != '\0') {
        fprintf(stderr, "xfer_perf: verification failed: %s\n", perf->verify_error);
        return 1;
    }
    result_compute(perf, elapsed, &perf->rows[perf->nrows]);
    if (!o->json) {
        print_row(&perf->rows[perf->nrows]);
    }
    perf->nrows++;
    return 0;
}

/* -v: the endpoint's transport counters (those that moved), after the run. */
static void counters_print(perf_t *perf)
{
    xfer_counter_t c[128];
    size_t n = 128;

    if (!perf->opts.verbose || (perf->ep == NULL) ||
        (xfer_endpoint_counters(perf->ep, c, &n) != XFER_OK)) {
        return;
    }
    printf("# %s counters of the endpoint to %s (those not 0):\n",
           xfer_endpoint_transport(perf->ep), xfer_endpoint_peer(perf->ep));
    for (size_t i = 0; (i < n) && (i < 128); i++) {
        if (c[i].value != 0) {
            printf("#   %-28s %" PRIu64 "\n", c[i].name, c[i].value);
        }
    }
    fflush(stdout);
}

static int client_run(perf_t *perf)
{
    const options_t *o = &perf->opts;
    char addr[300];
    uint8_t payload[MSG_MAX + 1];
    uint64_t step = 0;
    xfer_status_t st;
    msg_kind_t kind;
    size_t len;
    int failed = 0;

    snprintf(addr, sizeof(addr), strchr(o->host, ':') ? "[%s]:%u" : "%s:%u", o->host, o->port);
    st = xfer_connect(perf->ctx, addr, &perf->ep);
    if (st != XFER_OK) {
        fprintf(stderr, "xfer_perf: cannot connect to %s: %s\n", addr, xfer_status_string(st));
        return -1;
    }
    if (!o->json) {
        print_header(perf, addr);
    }
    for (size_t size = o->sweep ? 1 : o->size; size <= (o->sweep ? SWEEP_MAX : o->size);
         size *= 2) {
        /* after an error operations may be pending: main() closes the endpoint first */
        failed = client_run_size(perf, size, &step);
        if (failed < 0) {
            return -1;
        }
        run_release(perf);
        run_free(perf);
        if (failed) {
            break;
        }
    }
    if (ctrl_post(perf) != 0 || ctrl_send(perf, MSG_BYE, XFER_OK, NULL, 0) != 0 ||
        ctrl_recv(perf, MSG_ACK, 0, &kind, &st, payload, &len) != 0) {
        return -1;
    }
    if (o->json && !failed) {
        print_json(perf, addr);
    }
    counters_print(perf);
    return failed ? -1 : 0;
}

/* ---- server ---------------------------------------------------------------------------------- */

/* One size, the server's side, after PARAMS. 1: the data did not verify (the client knows). */
static int server_run_size(perf_t *perf)
{
    const perf_params_t *p = &perf->p;
    uint64_t total = p->warmup + p->iters;
    uint8_t payload[MSG_MAX + 1];
    xfer_status_t st;
    msg_kind_t kind;
    void *blob = NULL;
    size_t len = 0;
    int ret = 0;

    if (perf->opts.verbose) {
        printf("# %s, %" PRIu64 " bytes, %" PRIu64 " + %" PRIu64 " iterations, window %u%s\n",
               tests[p->test].name, p->size, p->warmup, p->iters, p->window,
               (p->flags & PARAM_VERIFY) ? ", verify" : "");
        fflush(stdout);
    }
    if (run_setup(perf, 0) != 0) {
        const char *why = "cannot allocate or register the buffers";

        ctrl_send(perf, MSG_READY, XFER_ERR_NO_MEMORY, why, strlen(why));
        return -1;
    }
    if (p->test == TEST_GET_BW) {
        /* a fixed source: slot s holds the pattern of "iteration" s */
        for (size_t s = 0; s < perf->nslots; s++) {
            pattern_fill(slot_buf(perf, s), p->size, SEED_SERVER, s);
        }
    }
    if (tests[p->test].server_rkey) {
        st = xfer_rkey_pack(perf->mem, &blob, &len);
        if (st != XFER_OK) {
            ctrl_send(perf, MSG_READY, st, "xfer_rkey_pack failed", 21);
            return fail("xfer_rkey_pack", st);
        }
    }
    ret = ctrl_send(perf, MSG_READY, XFER_OK, blob, len);
    if (blob != NULL) {
        xfer_rkey_blob_free(blob);
    }
    if (ret != 0) {
        return -1;
    }
    if (p->test == TEST_PUT_LAT &&
        (ctrl_recv(perf, MSG_RKEY, 0, &kind, &st, payload, &len) != 0 ||
         rkey_take(perf, payload, len, 1) != 0)) {
        return -1;
    }

    switch (p->test) {
    case TEST_TAG_BW:
        ret = window_run(perf, 0, total, p->window, 0, tag_recv_post, tag_recv_done,
                         "xfer_tag_recv", NULL, NULL);
        break;
    case TEST_TENSOR_BW:
        ret = window_run(perf, 0, total, p->window, 0, publish_post, NULL,
                         "xfer_tensor_publish", NULL, NULL);
        break;
    case TEST_TENSOR_LAT:
        ret = window_run(perf, 0, total, TENSOR_LAT_DEPTH, 1, publish_post, NULL,
                         "xfer_tensor_publish", NULL, NULL);
        break;
    case TEST_PUT_LAT:
        ret = put_lat_run(perf, 0);
        break;
    case TEST_TAG_LAT:
        ret = tag_lat_run(perf, 0);
        break;
    default:
        break;  /* put_bw, get_bw: one-sided; waiting for FIN progresses them */
    }
    if (ret != 0 || ctrl_recv(perf, MSG_FIN, 0, &kind, &st, payload, &len) != 0) {
        return -1;
    }
    if (p->test == TEST_PUT_BW && (p->flags & PARAM_VERIFY)) {
        /* each slot holds the last iteration that was put into it */
        for (uint64_t s = 0; s < perf->nslots && s < total; s++) {
            pattern_check(perf, slot_buf(perf, s), p->size, SEED_CLIENT,
                          s + (total - 1 - s) / p->window * p->window, "put_bw");
        }
    }
    if (perf->verify_error[0] != '\0') {
        fprintf(stderr, "xfer_perf: verification failed: %s\n", perf->verify_error);
        return ctrl_send(perf, MSG_ACK, XFER_ERR_PROTOCOL, perf->verify_error,
                         strlen(perf->verify_error)) == 0 ? 1 : -1;
    }
    return ctrl_send(perf, MSG_ACK, XFER_OK, NULL, 0);
}

static int server_run(perf_t *perf)
{
    const options_t *o = &perf->opts;
    uint8_t payload[MSG_MAX + 1];
    char addr[32];
    xfer_status_t st;
    msg_kind_t kind;
    const char *why;
    size_t len;
    int ret, failed = 0;

    snprintf(addr, sizeof(addr), ":%u", o->port);
    st = xfer_listen(perf->ctx, addr, &perf->listener);
    if (st != XFER_OK) {
        fprintf(stderr, "xfer_perf: cannot listen on port %u: %s\n", o->port,
                xfer_status_string(st));
        return -1;
    }
    printf("# xfer_perf server: listening on port %u\n", xfer_listener_port(perf->listener));
    fflush(stdout);
    st = xfer_accept(perf->listener, -1, &perf->ep);
    if (st != XFER_OK) {
        return fail("xfer_accept", st);
    }
    printf("# client %s connected, transport %s\n", xfer_endpoint_peer(perf->ep),
           xfer_endpoint_transport(perf->ep));
    fflush(stdout);

    for (;;) {
        if (ctrl_recv(perf, MSG_PARAMS, 1, &kind, &st, payload, &len) != 0) {
            return -1;
        }
        if (kind == MSG_BYE) {
            break;
        }
        why = params_decode(payload, len, &perf->p);
        if (why != NULL) {
            fprintf(stderr, "xfer_perf: the client's parameters: %s\n", why);
            ctrl_send(perf, MSG_READY, XFER_ERR_INVALID_PARAM, why, strlen(why));
            return -1;
        }
        ret = server_run_size(perf);
        if (ret < 0) {
            return -1;  /* operations may be pending: main() closes the endpoint first */
        }
        failed |= ret;
        run_release(perf);
        run_free(perf);
    }
    if (ctrl_send(perf, MSG_ACK, XFER_OK, NULL, 0) != 0) {
        return -1;
    }
    printf("# done%s\n", failed ? ", the data did not verify" : "");
    counters_print(perf);
    return failed ? -1 : 0;
}

/* ---- main ------------------------------------------------------------------------------------ */

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: xfer_perf [options]         run the server (serves one client)\n"
            "       xfer_perf [options] HOST    run a test against the server on HOST\n"
            "Bandwidth and latency of xfer between two processes, like ib_write_bw and "
            "ucx_perftest.\n"
            "\n"
            "  -p, --port PORT        TCP port of the server (default %d)\n"
            "  -t, --test TEST        put_bw, get_bw, tag_bw (default), tensor_bw,\n"
            "                         put_lat, tag_lat, tensor_lat\n"
            "  -s, --size BYTES       message size; k, m, g suffixes are powers of 1024 "
            "(default 65536)\n"
            "  -a, --all              sweep the sizes 1, 2, 4, ... 8m\n"
            "  -n, --iters N          timed iterations (default: depends on test and size)\n"
            "      --warmup N         untimed iterations first (default: a tenth, at most 1000)\n"
            "  -w, --window N         operations in flight in bandwidth tests (default %d; the\n"
            "                         window shrinks so that it holds at most 256 MiB)\n"
            "  -x, --transports LIST  set XFER_TRANSPORTS=LIST in this process (e.g. tcp)\n"
            "  -T, --thread-mode MODE serialized (default: one thread, the context takes no\n"
            "                         lock, as ucx_perftest's default) or multi (the lock a\n"
            "                         threaded application pays; needed with\n"
            "                         XFER_PROGRESS_THREAD=y)\n"
            "  -V, --verify           fill buffers with a pattern and check it where it lands\n"
            "  -j, --json             print the results as one JSON object\n"
            "  -v, --verbose          say more, and print the endpoint's counters at the end\n"
            "  -h, --help             this text\n"
            "\n"
            "Columns: BW average[MB/s] (MB = 10^6 bytes), MsgRate[Mpps], t_typical (median),\n"
            "t_avg and t_99%% in usec: bandwidth tests time completions with WINDOW in flight;\n"
            "tag_lat and put_lat report half a round trip, tensor_lat one whole fetch.\n"
            "Only the client's -t -s -a -n -w -V matter: it sends them to the server.\n",
            DEFAULT_PORT, DEFAULT_WINDOW);
}

static int parse_u64(const char *s, uint64_t max, int suffix, uint64_t *v_p)
{
    char *end;
    unsigned long long v;
    uint64_t mul = 1;

    if (*s == '\0' || *s == '-') {
        return -1;
    }
    v = strtoull(s, &end, 10);
    if (suffix && *end != '\0' && end[1] == '\0') {
        switch (*end) {
        case 'k': case 'K': mul = 1ull << 10; end++; break;
        case 'm': case 'M': mul = 1ull << 20; end++; break;
        case 'g': case 'G': mul = 1ull << 30; end++; break;
        default: break;
        }
    }
    if (end == s || *end != '\0' || v > max / mul) {
        return -1;
    }
    *v_p = v * mul;
    return 0;
}

static int parse_options(int argc, char **argv, options_t *o)
{
    static const struct option long_opts[] = {
        {"port",       required_argument, NULL, 'p'},
        {"test",       required_argument, NULL, 't'},
        {"size",       required_argument, NULL, 's'},
        {"all",        no_argument,       NULL, 'a'},
        {"iters",      required_argument, NULL, 'n'},
        {"warmup",     required_argument, NULL, 'W'},
        {"window",     required_argument, NULL, 'w'},
        {"transports", required_argument, NULL, 'x'},
        {"thread-mode", required_argument, NULL, 'T'},
        {"verify",     no_argument,       NULL, 'V'},
        {"json",       no_argument,       NULL, 'j'},
        {"verbose",    no_argument,       NULL, 'v'},
        {"help",       no_argument,       NULL, 'h'},
        {NULL, 0, NULL, 0}
    };
    uint64_t v;
    int c, size_given = 0;

    *o = (options_t){.port = DEFAULT_PORT, .test = TEST_TAG_BW, .size = 65536, .warmup = -1,
                     .window = DEFAULT_WINDOW};
    while ((c = getopt_long(argc, argv, "p:t:s:an:w:x:T:Vjvh", long_opts, NULL)) != -1) {
        switch (c) {
        case 'p':
            if (parse_u64(optarg, 65535, 0, &v) != 0) {
                fprintf(stderr, "xfer_perf: -p: '%s' is not a port number\n", optarg);
                return 2;
            }
            o->port = (unsigned)v;
            break;
        case 't':
            for (o->test = 0; o->test < TEST_LAST; o->test++) {
                if (strcmp(optarg, tests[o->test].name) == 0) {
                    break;
                }
            }
            if (o->test == TEST_LAST) {
                fprintf(stderr, "xfer_perf: -t: unknown test '%s' (put_bw, get_bw, tag_bw, "
                        "tensor_bw, put_lat, tag_lat, tensor_lat)\n", optarg);
                return 2;
            }
            break;
        case 's':
            if (parse_u64(optarg, MAX_SIZE, 1, &v) != 0 || v == 0) {
                fprintf(stderr, "xfer_perf: -s: '%s' is not a size from 1 to 1g\n", optarg);
                return 2;
            }
            o->size = v;
            size_given = 1;
            break;
        case 'a': o->sweep = 1; break;
        case 'n':
            if (parse_u64(optarg, 1ull << 32, 0, &v) != 0 || v == 0) {
                fprintf(stderr, "xfer_perf: -n: '%s' is not a count from 1 to 2^32\n", optarg);
                return 2;
            }
            o->iters = v;
            break;
        case 'W':
            if (parse_u64(optarg, 1ull << 32, 0, &v) != 0) {
                fprintf(stderr, "xfer_perf: --warmup: '%s' is not a count\n", optarg);
                return 2;
            }
            o->warmup = (int64_t)v;
            break;
        case 'w':
            if (parse_u64(optarg, MAX_WINDOW, 0, &v) != 0 || v == 0) {
                fprintf(stderr, "xfer_perf: -w: '%s' is not a window from 1 to %d\n", optarg,
                        MAX_WINDOW);
                return 2;
            }
            o->window = (unsigned)v;
            break;
        case 'x': o->transports = optarg; break;
        case 'T':
            if ((strcmp(optarg, "serialized") != 0) && (strcmp(optarg, "multi") != 0)) {
                fprintf(stderr, "xfer_perf: -T: '%s' is not serialized or multi\n", optarg);
                return 2;
            }
            o->multi = (strcmp(optarg, "multi") == 0);
            break;
        case 'V': o->verify = 1; break;
        case 'j': o->json = 1; break;
        case 'v': o->verbose = 1; break;
        case 'h': usage(stdout); exit(0);
        default:  usage(stderr); return 2;
        }
    }
    if (optind + 1 < argc) {
        fprintf(stderr, "xfer_perf: unexpected argument '%s'\n", argv[optind + 1]);
        return 2;
    }
    if (o->sweep && size_given) {
        fprintf(stderr, "xfer_perf: -a and -s exclude each other\n");
        return 2;
    }
    o->host = (optind < argc) ? argv[optind] : NULL;
    return 0;
}

int main(int argc, char **argv)
{
    static perf_t perf;     /* large (the result rows): not on the stack */
    xfer_status_t st;
    int ret;

    ret = parse_options(argc, argv, &perf.opts);
    if (ret != 0) {
        return ret;
    }
    /* the client's offer restricts the negotiation; the server's what it accepts */
    if (perf.opts.transports != NULL && setenv("XFER_TRANSPORTS", perf.opts.transports, 1) != 0) {
        perror("xfer_perf: setenv");
        return 1;
    }
    {
        xfer_context_params_t params = {sizeof(params),
                                         perf.opts.multi ? 0 : XFER_CONTEXT_FLAG_SERIALIZED};

        st = xfer_context_create(&params, &perf.ctx);
    }
    if (st != XFER_OK) {
        fprintf(stderr, "xfer_perf: cannot create a context: %s%s\n", xfer_status_string(st),
                (st == XFER_ERR_INVALID_PARAM) ? " (check the XFER_* environment and -x; with "
                "XFER_PROGRESS_THREAD=y use -T multi)" : "");
        return 1;
    }

    ret = (perf.opts.host != NULL) ? client_run(&perf) : server_run(&perf);

    /* after an error requests may be pending: closing the endpoint cancels them first */
    for (size_t i = 0; perf.ops != NULL && i < perf.nslots; i++) {
        op_release(&perf.ops[i]);
    }
    if (perf.ctrl_req != NULL) {
        xfer_request_release(perf.ctrl_req);
    }
    if (perf.ep != NULL) {
        xfer_endpoint_close(perf.ep);
    }
    run_release(&perf);
    if (perf.listener != NULL) {
        xfer_listener_close(perf.listener);
    }
    xfer_context_destroy(perf.ctx);
    run_free(&perf);
    return (ret == 0) ? 0 : 1;
}
