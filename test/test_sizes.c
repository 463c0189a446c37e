/*
 * Transfers on both sides of 2^32 bytes between real processes, over XFERTEST_TRANSPORT: a
 * tagged message (its receive posted first, and one that arrives before its receive, past the
 * unexpected queue's bound), a put, a get and a tensor fetch of 2^32 - 1, 2^32 and 2^32 + 1
 * bytes, and a fetch of 2^32 + 1 bytes into an allocation. A length, a size or an offset kept in 32 bits anywhere on the way - a frame, a
 * header, a work request, a cast - shows as a wrong length, a misplaced probe or a lost tail.
 *
 * The buffers are big_buffers.h's: the sender's bytes are all there but only its probes are
 * ever touched, so one test needs the receiver's 4 GiB and little more. Each test takes a lock
 * (one such test at a time on the machine) and skips, saying why, under valgrind or when
 * MemAvailable is short. Each reports its transfers' times (--verbose).
 */
#include "big_buffers.h"
#include "test_peer.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void setup(void)
{
    tp_env();
}

TestSuite(sizes, .init = setup, .timeout = 1800);

static const uint64_t sizes[] = TP_BIG_SIZES;
#define NUM_SIZES (sizeof(sizes) / sizeof(sizes[0]))
#define ALL       (~0ull)
#define UNEXPECTED (1ull << 63)     /* tag test: the receive is posted after the message */
#define KEY       "big"

enum {
    CMD_DONE = 1,
    CMD_SPOIL,      /* len: tp_big_spoil; reply 1 */
    CMD_FILL,       /* len, seed: tp_big_fill; reply 1 */
    CMD_CHECK,      /* len, seed: tp_big_check; reply 1, or the bad offset + 2 */
    CMD_PUBLISH,    /* len, seed, step: publish it; reply the posting status, then the
                     * publish's final status */
};

static uint64_t seed_of(uint64_t len)
{
    return len * 31 + 7;
}

static uint64_t ctl_u64(tp_side_t *s)
{
    uint64_t v;

    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_BIG_WAIT_MS) == 0, "ctl");
    return v;
}

static void *child_map(void)
{
    void *buf = tp_big_map();

    TP_CHECK(buf != NULL, "no room for %zu bytes", (size_t)TP_BIG_MAP);
    alarm(TP_BIG_ALARM_S);
    return buf;
}

/* The parent's side of a finished transfer: its time, and the probes. */
static void parent_check(const char *what, const void *buf, uint64_t len, double t0)
{
    ssize_t bad = tp_big_check(buf, (size_t)len, seed_of(len));

    cr_log_info("%s of %llu bytes: %.2f s", what, (unsigned long long)len,
                (tp_now_ms() - t0) / 1e3);
    cr_assert_eq(bad, -1, "%s of %llu bytes: byte %zd is wrong", what, (unsigned long long)len,
                 bad);
}

/* A word from the peer, who may be busy with 4 GiB (registering it takes long somewhere). */
static uint64_t big_recv(tp_peer_t *p)
{
    return tp_recv_within(p, TP_BIG_WAIT_MS);
}

/* tp_finish(), with the time a peer may need to let go of 4 GiB. */
static void big_finish(tp_peer_t *p)
{
    xfer_endpoint_close(p->ep);
    xfer_context_destroy(p->ctx);
    p->ep  = NULL;
    p->ctx = NULL;
    tp_child_expect_ok(p, TP_BIG_WAIT_MS / 1000);
}

/* The parent's start: its big buffer and a peer running fn. */
static char *big_start(tp_peer_t *p, tp_scenario_t fn)
{
    char *buf;

    tp_big_prepare();
    buf = tp_big_map();
    cr_assert_not_null(buf, "no room for %zu bytes", (size_t)TP_BIG_MAP);
    tp_start(p, fn, NULL);
    return buf;
}

/* ---- tagged messages ------------------------------------------------------------------------- */

/* For each length the parent names: send it, tag = length; reply 1 once posted, then the
 * send's status. */
static int srv_sender(tp_side_t *s)
{
    char *buf = child_map();

    for (;;) {
        xfer_request_t *req = NULL;
        xfer_status_t st;
        uint64_t len;

        TP_CHECK(tp_progress_until_ctl(s, TP_BIG_WAIT_MS) == 0, "no word from the parent");
        len = ctl_u64(s) & ~UNEXPECTED;
        if (len == 0) {
            break;
        }
        tp_big_fill(buf, (size_t)len, seed_of(len));
        st = xfer_tag_send(s->ep, len, buf, (size_t)len, NULL, NULL, NULL, &req);
        TP_CHECK(TP_POSTED(st), "tag_send of %llu bytes: %s", (unsigned long long)len,
                 xfer_status_string(st));
        TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
        st = xfer_request_wait(req, TP_BIG_WAIT_MS);
        xfer_request_release(req);
        TP_CHECK(tp_ctl_send_u64(s->ctl, (uint64_t)(int64_t)st) == 0, "ctl");
    }
    tp_big_unmap(buf);
    return 0;
}

/* One message of len bytes into buf, whose receive takes up to TP_BIG_MAX: posted before the
 * message, or (UNEXPECTED) once the message's header had time to arrive and find none. */
static void tag_one(tp_peer_t *p, char *buf, uint64_t len, int unexpected)
{
    xfer_request_t *req = NULL;
    xfer_status_t st;
    double t0;

    tp_big_spoil(buf, (size_t)len);
    t0 = tp_now_ms();
    if (!unexpected) {
        st = xfer_tag_recv(p->ctx, p->ep, len, ALL, buf, (size_t)TP_BIG_MAX, NULL, NULL, NULL,
                           &req);
        cr_assert(TP_POSTED(st), "tag_recv: %s", xfer_status_string(st));
    }
    tp_send(p, len | (unexpected ? UNEXPECTED : 0));
    cr_assert_eq(big_recv(p), 1, "the peer did not post its send");
    if (unexpected) {
        /* the header arrives with no receive and more bytes than the unexpected queue
         * holds: the input waits for this receive */
        tp_progress_for(p->ctx, 300);
        st = xfer_tag_recv(p->ctx, p->ep, len, ALL, buf, (size_t)TP_BIG_MAX, NULL, NULL, NULL,
                           &req);
        cr_assert(TP_POSTED(st), "tag_recv: %s", xfer_status_string(st));
    }
    st = xfer_request_wait(req, TP_BIG_WAIT_MS);
    cr_assert_eq(st, XFER_OK, "receive of %llu bytes: %s", (unsigned long long)len,
                 xfer_status_string(st));
    cr_assert_eq(xfer_request_length(req), len, "length %zu of a %llu-byte message",
                 xfer_request_length(req), (unsigned long long)len);
    cr_assert_eq(xfer_request_tag(req), len);
    xfer_request_release(req);
    parent_check(unexpected ? "unexpected tag message" : "tag message", buf, len, t0);
    cr_assert_eq((int64_t)big_recv(p), XFER_OK, "the peer's send failed");
}

Test(sizes, tag_messages_on_both_sides_of_4_gib)
{
    tp_peer_t p;
    char *buf = big_start(&p, srv_sender);

    for (size_t i = 0; i < NUM_SIZES; i++) {
        tag_one(&p, buf, sizes[i], 0);
    }
    tag_one(&p, buf, TP_BIG_MAX, 1);
    tp_send(&p, 0);
    big_finish(&p);
    tp_big_unmap(buf);
}

/* ---- put and get ----------------------------------------------------------------------------- */

/* A target: the whole mapping registered, its address and key handed over; then commands. */
static int srv_target(tp_side_t *s)
{
    char *buf = child_map();
    xfer_mem_t *mem;
    void *blob;
    size_t blob_len;

    TP_CHECK_STATUS(xfer_mem_register(s->ctx, buf, TP_BIG_MAP, XFER_MEM_HOST, &mem), XFER_OK);
    TP_CHECK_STATUS(xfer_rkey_pack(mem, &blob, &blob_len), XFER_OK);
    TP_CHECK(tp_ctl_send_u64(s->ctl, (uintptr_t)buf) == 0, "ctl");
    TP_CHECK(tp_ctl_send(s->ctl, blob, blob_len) == 0, "ctl");
    xfer_rkey_blob_free(blob);
    for (;;) {
        uint64_t cmd, len, reply = 1;
        ssize_t bad;

        TP_CHECK(tp_progress_until_ctl(s, TP_BIG_WAIT_MS) == 0, "no command from the parent");
        cmd = ctl_u64(s);
        if (cmd == CMD_DONE) {
            break;
        }
        len = ctl_u64(s);
        if (cmd == CMD_SPOIL) {
            tp_big_spoil(buf, (size_t)len);
        } else if (cmd == CMD_FILL) {
            tp_big_fill(buf, (size_t)len, ctl_u64(s));
        } else {
            TP_CHECK(cmd == CMD_CHECK, "unknown command %llu", (unsigned long long)cmd);
            bad = tp_big_check(buf, (size_t)len, ctl_u64(s));
            reply = (bad < 0) ? 1 : (uint64_t)bad + 2;
        }
        TP_CHECK(tp_ctl_send_u64(s->ctl, reply) == 0, "ctl");
    }
    TP_CHECK_STATUS(xfer_mem_deregister(mem), XFER_OK);
    tp_big_unmap(buf);
    return 0;
}

typedef struct rma {
    tp_peer_t   peer;
    uint64_t    base;
    xfer_rkey_t *rkey;
    char        *local;
    xfer_mem_t  *mem;
} rma_t;

static void rma_start(rma_t *r)
{
    void *blob;
    size_t len;

    r->local = big_start(&r->peer, srv_target);
    r->base  = big_recv(&r->peer);
    blob     = tp_recv_blob(&r->peer, &len);
    cr_assert_eq(xfer_rkey_unpack(r->peer.ep, blob, len, &r->rkey), XFER_OK);
    free(blob);
    cr_assert_eq(xfer_rkey_length(r->rkey), TP_BIG_MAP, "the key's length keeps 64 bits");
    cr_assert_eq(xfer_mem_register(r->peer.ctx, r->local, TP_BIG_MAP, XFER_MEM_HOST, &r->mem),
                 XFER_OK);
}

static void rma_finish(rma_t *r)
{
    cr_assert_eq(xfer_mem_deregister(r->mem), XFER_OK);
    xfer_rkey_destroy(r->rkey);
    tp_send(&r->peer, CMD_DONE);
    big_finish(&r->peer);
    tp_big_unmap(r->local);
}

static void target_cmd(rma_t *r, uint64_t cmd, uint64_t len, int with_seed)
{
    uint64_t reply;

    tp_send(&r->peer, cmd);
    tp_send(&r->peer, len);
    if (with_seed) {
        tp_send(&r->peer, seed_of(len));
    }
    reply = big_recv(&r->peer);
    cr_assert_eq(reply, 1, "the target's %llu bytes: byte %llu is wrong",
                 (unsigned long long)len, (unsigned long long)(reply - 2));
}

static void rma_one(rma_t *r, int is_put, uint64_t len)
{
    xfer_request_t *req = NULL;
    xfer_status_t st;
    double t0;

    if (is_put) {
        tp_big_fill(r->local, (size_t)len, seed_of(len));
        target_cmd(r, CMD_SPOIL, len, 0);
    } else {
        target_cmd(r, CMD_FILL, len, 1);
        tp_big_spoil(r->local, (size_t)len);
    }
    t0 = tp_now_ms();
    st = is_put ? xfer_put(r->peer.ep, r->local, (size_t)len, r->mem, r->base, r->rkey, NULL,
                           NULL, &req) :
                  xfer_get(r->peer.ep, r->local, (size_t)len, r->mem, r->base, r->rkey, NULL,
                           NULL, &req);
    cr_assert(TP_POSTED(st), "%s of %llu bytes: %s", is_put ? "put" : "get",
              (unsigned long long)len, xfer_status_string(st));
    st = xfer_request_wait(req, TP_BIG_WAIT_MS);
    cr_assert_eq(st, XFER_OK, "%s of %llu bytes: %s", is_put ? "put" : "get",
                 (unsigned long long)len, xfer_status_string(st));
    cr_assert_eq(xfer_request_length(req), len);
    xfer_request_release(req);
    if (is_put) {
        cr_log_info("put of %llu bytes: %.2f s", (unsigned long long)len,
                    (tp_now_ms() - t0) / 1e3);
        cr_assert_eq(tp_flush(r->peer.ep, TP_BIG_WAIT_MS), XFER_OK, "flush after the put");
        target_cmd(r, CMD_CHECK, len, 1);
    } else {
        parent_check("get", r->local, len, t0);
    }
}

Test(sizes, puts_on_both_sides_of_4_gib)
{
    rma_t r;

    rma_start(&r);
    for (size_t i = 0; i < NUM_SIZES; i++) {
        rma_one(&r, 1, sizes[i]);
    }
    rma_finish(&r);
}

Test(sizes, gets_on_both_sides_of_4_gib)
{
    rma_t r;

    rma_start(&r);
    for (size_t i = 0; i < NUM_SIZES; i++) {
        rma_one(&r, 0, sizes[i]);
    }
    rma_finish(&r);
}

/* ---- tensor fetch ---------------------------------------------------------------------------- */

/* A producer of uint8 vectors of the lengths the parent names, straight from the mapping. */
static int srv_producer(tp_side_t *s)
{
    char *buf = child_map();

    for (;;) {
        xfer_tensor_t t = {.dtype = XFER_DTYPE_UINT8, .rank = 1, .data = buf};
        xfer_request_t *req = NULL;
        uint64_t cmd, seed, step;
        xfer_status_t st;

        TP_CHECK(tp_progress_until_ctl(s, TP_BIG_WAIT_MS) == 0, "no command from the parent");
        cmd = ctl_u64(s);
        if (cmd == CMD_DONE) {
            break;
        }
        TP_CHECK(cmd == CMD_PUBLISH, "unknown command %llu", (unsigned long long)cmd);
        t.size    = ctl_u64(s);
        t.dims[0] = (int64_t)t.size;
        seed      = ctl_u64(s);
        step      = ctl_u64(s);
        tp_big_fill(buf, (size_t)t.size, seed);
        st = xfer_tensor_publish(s->ctx, step, KEY, &t, 0, NULL, NULL, &req);
        TP_CHECK(tp_ctl_send_u64(s->ctl, (uint64_t)(int64_t)st) == 0, "ctl");
        if (TP_POSTED(st)) {
            st = xfer_request_wait(req, TP_BIG_WAIT_MS);
            xfer_request_release(req);
            TP_CHECK(tp_ctl_send_u64(s->ctl, (uint64_t)(int64_t)st) == 0, "ctl");
        }
    }
    tp_big_unmap(buf);
    return 0;
}

typedef struct alloc_arg {
    char   *buf;
    int    calls;
    size_t size;
} alloc_arg_t;

static void *big_alloc(const xfer_tensor_t *meta, void *arg)
{
    alloc_arg_t *a = arg;

    a->calls++;
    a->size = meta->size;
    return (meta->size <= TP_BIG_MAX) ? a->buf : NULL;
}

/* Fetch step's len-byte tensor into buf (or, alloc, into what the callback returns: buf). */
static void fetch_one(tp_peer_t *p, char *buf, uint64_t len, uint64_t step, int alloc)
{
    alloc_arg_t a = {.buf = buf};
    xfer_fetch_params_t params = {.size = sizeof(params)};
    xfer_request_t *req = NULL;
    const xfer_tensor_t *t;
    xfer_status_t st;
    double t0;

    if (alloc) {
        params.alloc     = big_alloc;
        params.alloc_arg = &a;
    } else {
        params.buffer   = buf;
        params.capacity = (size_t)TP_BIG_MAX;
    }
    tp_big_spoil(buf, (size_t)len);
    tp_send(p, CMD_PUBLISH);
    tp_send(p, len);
    tp_send(p, seed_of(len));
    tp_send(p, step);
    st = (xfer_status_t)(int64_t)big_recv(p);
    cr_assert(TP_POSTED(st), "publish of %llu bytes: %s", (unsigned long long)len,
              xfer_status_string(st));
    t0 = tp_now_ms();
    st = xfer_tensor_fetch(p->ep, step, KEY, &params, NULL, NULL, &req);
    cr_assert(TP_POSTED(st), "fetch of %llu bytes: %s", (unsigned long long)len,
              xfer_status_string(st));
    st = xfer_request_wait(req, TP_BIG_WAIT_MS);
    cr_assert_eq(st, XFER_OK, "fetch of %llu bytes: %s", (unsigned long long)len,
                 xfer_status_string(st));
    t = xfer_request_tensor(req);
    cr_assert_not_null(t);
    cr_assert(t->dtype == XFER_DTYPE_UINT8 && t->rank == 1 && (uint64_t)t->dims[0] == len &&
              t->size == len && !t->is_dead && t->data == buf,
              "fetched dtype %d rank %u dims[0] %lld size %llu data %p", (int)t->dtype,
              t->rank, (long long)t->dims[0], (unsigned long long)t->size, t->data);
    cr_assert_eq(xfer_request_length(req), len);
    xfer_request_release(req);
    if (alloc) {
        cr_assert(a.calls == 1 && a.size == len, "the allocation callback: %d calls, %zu "
                  "bytes", a.calls, a.size);
    }
    parent_check(alloc ? "fetch into an allocation" : "fetch", buf, len, t0);
    cr_assert_eq((int64_t)big_recv(p), XFER_OK, "the publish did not end with the fetch");
}

Test(sizes, tensor_fetches_on_both_sides_of_4_gib)
{
    tp_peer_t p;
    char *buf = big_start(&p, srv_producer);

    for (size_t i = 0; i < NUM_SIZES; i++) {
        fetch_one(&p, buf, sizes[i], i, 0);
    }
    tp_send(&p, CMD_DONE);
    big_finish(&p);
    tp_big_unmap(buf);
}

/* One transfer alone, so that it is cheap enough for the Soft-RoCE guest (verbs_guest.sh):
 * the consumer learns the size first (over verbs: META_DATA_UPDATE, then a TENSOR_RE_REQUEST
 * whose capacity is a u64), and the write ends with a 1-byte chunk. */
Test(sizes, a_tensor_of_4_gib_and_a_byte_into_an_allocation)
{
    tp_peer_t p;
    char *buf = big_start(&p, srv_producer);

    fetch_one(&p, buf, TP_BIG_MAX, 0, 1);
    tp_send(&p, CMD_DONE);
    big_finish(&p);
    tp_big_unmap(buf);
}
