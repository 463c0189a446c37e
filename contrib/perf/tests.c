/*
 * The test loops: the window engine of the bandwidth tests (and of tensor_lat's server), the
 * ping-pongs of the latency tests, what each test posts and checks, and the clock and the
 * waiting that time them. Each side runs its part of one size between READY and FIN.
 */
#include "perf.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define PERF_KEY  "perf"

/* Pattern seeds: who wrote the data. */
#define SEED_CLIENT 1
#define SEED_SERVER 2

/* ---- the clock and waiting ------------------------------------------------------------------- */

xfer_status_t perf_request_wait(xfer_request_t *req)
{
    xfer_status_t status = xfer_request_wait(req, TIMEOUT_MS);

    if (status == XFER_ERR_TIMEOUT) {
        fprintf(stderr, "xfer_perf: no progress in %d s\n", TIMEOUT_MS / 1000);
    }
    return status;
}

void perf_op_cb(xfer_request_t *req, xfer_status_t status, void *arg)
{
    op_slot_t *op = arg;

    op->t_done = perf_now_ns();
    op->status = status;
    op->done = 1;
}

/* Waits spin unless -E sleep; a deadline is checked now and then so a dead peer cannot hang
 * us. */
static xfer_status_t spin_test(xfer_request_t *req)
{
    uint64_t deadline = 0;
    unsigned n = 0;
    xfer_status_t st;

    while ((st = xfer_request_test(req)) == XFER_INPROGRESS) {
        if ((++n & 0xfff) == 0) {
            if (deadline == 0) {
                deadline = perf_now_ns() + TIMEOUT_MS * 1000000ull;
            } else if (perf_now_ns() > deadline) {
                fprintf(stderr, "xfer_perf: no progress in %d s\n", TIMEOUT_MS / 1000);
                return XFER_ERR_TIMEOUT;
            }
        }
    }
    return st;
}

/* After posting into op: a post that returned XFER_OK without a request completed at once. */
int perf_op_posted(op_slot_t *op, xfer_status_t st, const char *what)
{
    if (st != XFER_OK && st != XFER_INPROGRESS) {
        return perf_fail(what, st);
    }
    if (op->req == NULL && !op->done) {
        op->t_done = perf_now_ns();
        op->status = XFER_OK;
        op->done = 1;
    }
    return 0;
}

void perf_op_reset(op_slot_t *op)
{
    op->req = NULL;
    op->done = 0;
    op->status = XFER_INPROGRESS;
    op->t_done = 0;
    op->t_post = 0;
}

xfer_status_t perf_wait(perf_t *perf, xfer_request_t *req)
{
    return perf->opts.sleep ? perf_request_wait(req) : spin_test(req);
}

/* Wait for op as -E says; its request stays for the caller to release. */
xfer_status_t perf_op_wait(perf_t *perf, op_slot_t *op)
{
    xfer_status_t st;

    if (!op->done && op->req != NULL) {
        st = perf_wait(perf, op->req);
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

void perf_op_release(op_slot_t *op)
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
static int window_run(perf_t *perf, uint64_t first, uint64_t count, size_t window,
                      post_fn_t post, done_fn_t done, const char *what, uint64_t *t_prev,
                      double *samples)
{
    uint64_t next = first, oldest = first, end = first + count;
    xfer_status_t st;
    op_slot_t *op;

    while (oldest < end) {
        while (next < end && next - oldest < window) {
            op = &perf->ops[next % window];
            perf_op_reset(op);
            if (perf_op_posted(op, post(perf, next % window, next, op), what) != 0) {
                return -1;
            }
            next++;
        }
        op = &perf->ops[oldest % window];
        st = perf_op_wait(perf, op);
        if ((samples != NULL) && (op->t_done == 0)) {
            op->t_done = perf_now_ns();     /* completed without a callback */
        }
        if (st != XFER_OK) {
            fprintf(stderr, "xfer_perf: %s, iteration %" PRIu64 ": %s\n", what, oldest,
                    xfer_status_string(st));
            return -1;
        }
        if (done != NULL) {
            done(perf, oldest % window, oldest, op);
        }
        perf_op_release(op);
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

/* Every put before it is in the server's memory. */
int perf_remote_flush(perf_t *perf)
{
    xfer_request_t *req = NULL;
    xfer_status_t st    = xfer_endpoint_flush(perf->ep, NULL, NULL, &req);

    if (st == XFER_OK) {
        st = perf_wait(perf, req);
        xfer_request_release(req);
    }
    if (st != XFER_OK) {
        return perf_fail("flush after the puts", st);
    }
    return 0;
}

/* put_bw, get_bw: the client's side */
static xfer_status_t put_post(perf_t *perf, size_t slot, uint64_t iter, op_slot_t *op)
{
    uint8_t *buf = perf_slot_buf(perf, slot);

    if (perf->p.flags & PARAM_VERIFY) {
        perf_slot_fill(perf, slot, perf->p.size, SEED_CLIENT, iter);
    }
    return xfer_put(perf->ep, buf, perf->p.size, perf->mem, perf_rkey_slot_addr(perf, slot),
                    perf->rkey, perf_op_cb, op, &op->req);
}

static xfer_status_t get_post(perf_t *perf, size_t slot, uint64_t iter, op_slot_t *op)
{
    uint8_t *buf = perf_slot_buf(perf, slot);

    if (perf->p.flags & PARAM_VERIFY) {
        perf_slot_zero(perf, slot);
    }
    return xfer_get(perf->ep, buf, perf->p.size, perf->mem, perf_rkey_slot_addr(perf, slot),
                    perf->rkey, perf_op_cb, op, &op->req);
}

static void get_done(perf_t *perf, size_t slot, uint64_t iter, op_slot_t *op)
{
    if (perf->p.flags & PARAM_VERIFY) {
        /* the server's buffer never changes: slot s holds the pattern of "iteration" s */
        perf_slot_check(perf, slot, perf->p.size, SEED_SERVER, slot, "get_bw");
    }
}

/* tag_bw: the client sends, the server receives; each iteration has its own tag */
static xfer_status_t tag_send_post(perf_t *perf, size_t slot, uint64_t iter, op_slot_t *op)
{
    uint8_t *buf = perf_slot_buf(perf, slot);

    if (perf->p.flags & PARAM_VERIFY) {
        perf_slot_fill(perf, slot, perf->p.size, SEED_CLIENT, iter);
    }
    return xfer_tag_send(perf->ep, TAG_DATA | (iter & 0xffffffffu), buf, perf->p.size,
                         perf->mem, perf_op_cb, op, &op->req);
}

static xfer_status_t tag_recv_post(perf_t *perf, size_t slot, uint64_t iter, op_slot_t *op)
{
    return xfer_tag_recv(perf->ctx, perf->ep, TAG_DATA | (iter & 0xffffffffu), TAG_FULL,
                         perf_slot_buf(perf, slot), perf->p.size, perf->mem, perf_op_cb, op,
                         &op->req);
}

static void tag_recv_done(perf_t *perf, size_t slot, uint64_t iter, op_slot_t *op)
{
    if (op->req != NULL && xfer_request_length(op->req) != perf->p.size) {
        perf_verify_fail(perf, "tag_bw: iteration %" PRIu64 ": received %zu bytes, expected %"
                         PRIu64, iter, xfer_request_length(op->req), perf->p.size);
    } else if (perf->p.flags & PARAM_VERIFY) {
        perf_slot_check(perf, slot, perf->p.size, SEED_CLIENT, iter, "tag_bw");
    }
}

/* tensor_bw, tensor_lat: the server publishes (step, "perf"), the client fetches */
static xfer_status_t publish_post(perf_t *perf, size_t slot, uint64_t iter, op_slot_t *op)
{
    xfer_tensor_t t = {.dtype = XFER_DTYPE_UINT8, .rank = 1, .dims = {(int64_t)perf->p.size},
                       .size = perf->p.size, .data = perf_slot_buf(perf, slot)};

    if (perf->p.flags & PARAM_VERIFY) {
        perf_slot_fill(perf, slot, perf->p.size, SEED_SERVER, iter);
    }
    return xfer_tensor_publish(perf->ctx, perf->p.step_base + iter, PERF_KEY, &t, 0, perf_op_cb, op,
                               &op->req);
}

static xfer_status_t fetch_post(perf_t *perf, size_t slot, uint64_t iter, op_slot_t *op)
{
    xfer_fetch_params_t fp = {.size = sizeof(fp), .buffer = perf_slot_buf(perf, slot),
                              .capacity = perf->p.size, .mem = perf->mem};

    return xfer_tensor_fetch(perf->ep, perf->p.step_base + iter, PERF_KEY, &fp, perf_op_cb, op,
                             &op->req);
}

static void fetch_done(perf_t *perf, size_t slot, uint64_t iter, op_slot_t *op)
{
    const char *name = perf_tests[perf->p.test].name;
    const xfer_tensor_t *t = (op->req != NULL) ? xfer_request_tensor(op->req) : NULL;

    if (t == NULL) {
        perf_verify_fail(perf, "%s: step %" PRIu64 ": the fetch completed without a tensor",
                         name, perf->p.step_base + iter);
    } else if (t->dtype != XFER_DTYPE_UINT8 || t->rank != 1 || t->is_dead ||
               t->dims[0] != (int64_t)perf->p.size || t->size != perf->p.size) {
        perf_verify_fail(perf, "%s: step %" PRIu64 ": got dtype %d rank %u dims[0] %" PRId64
                         " size %" PRIu64 " dead %d, published uint8 [%" PRIu64 "]", name,
                         perf->p.step_base + iter, (int)t->dtype, t->rank, t->dims[0], t->size,
                         t->is_dead, perf->p.size);
    } else if (t->data != perf_slot_buf(perf, slot)) {
        perf_verify_fail(perf, "%s: step %" PRIu64 ": the data is at %p, not in the caller "
                         "buffer %p", name, perf->p.step_base + iter, t->data,
                         (void *)perf_slot_buf(perf, slot));
    } else if (perf->p.flags & PARAM_VERIFY) {
        perf_slot_check(perf, slot, perf->p.size, SEED_SERVER, iter, name);
    }
}

/* ---- ping-pong loops ------------------------------------------------------------------------- */

/* tag_lat. The client times from its send to the reply and halves it. */
static int tag_lat_run(perf_t *perf, int client)
{
    const perf_params_t *p = &perf->p;
    uint64_t total = p->warmup + p->iters, t0, t1;
    uint8_t *rbuf = perf_slot_buf(perf, 0), *sbuf = perf_slot_buf(perf, 1);
    uint64_t rtag = client ? TAG_PONG : TAG_PING, stag = client ? TAG_PING : TAG_PONG;
    uint64_t sseed = client ? SEED_CLIENT : SEED_SERVER, rseed = client ? SEED_SERVER : SEED_CLIENT;
    op_slot_t *r = &perf->ops[0], *s = &perf->ops[1];
    perf_lat_clock_t clk;
    xfer_status_t st;

    perf_lat_clock_start(&clk);
    for (uint64_t i = 0; i < total; i++) {
        if (i == p->warmup) {
            perf_lat_clock_timed(&clk);
        }
        /* the server's receive for i was posted right after its reply to i - 1 */
        if (client || i == 0) {
            perf_op_reset(r);
            st = xfer_tag_recv(perf->ctx, perf->ep, rtag, TAG_FULL, rbuf, p->size, perf->mem,
                               NULL, NULL, &r->req);
            if (perf_op_posted(r, st, "xfer_tag_recv") != 0) {
                return -1;
            }
        }
        if (client && (p->flags & PARAM_VERIFY)) {
            perf_slot_fill(perf, 1, p->size, sseed, i);
        }
        /* only the client times; the server's reply is not held up by a clock read */
        t0 = client ? perf_lat_clock_now(&clk) : 0;
        if (client) {
            perf_op_reset(s);
            st = xfer_tag_send(perf->ep, stag, sbuf, p->size, perf->mem, NULL, NULL, &s->req);
            if (perf_op_posted(s, st, "xfer_tag_send") != 0) {
                return -1;
            }
        }
        st = perf_op_wait(perf, r);
        t1 = client ? perf_lat_clock_now(&clk) : 0;
        if (st != XFER_OK) {
            fprintf(stderr, "xfer_perf: tag_lat: receive %" PRIu64 ": %s\n", i,
                    xfer_status_string(st));
            return -1;
        }
        if (r->req != NULL && xfer_request_length(r->req) != p->size) {
            perf_verify_fail(perf, "tag_lat: iteration %" PRIu64 ": received %zu bytes, "
                             "expected %" PRIu64, i, xfer_request_length(r->req), p->size);
        }
        if (!client) {
            /* the reply first, before anything else of this iteration: the next ping cannot
             * come back sooner than a round trip, and the receive is posted by then (or the
             * ping waits, unexpected, for it) */
            if (p->flags & PARAM_VERIFY) {
                perf_slot_fill(perf, 1, p->size, sseed, i);
            }
            perf_op_reset(s);
            st = xfer_tag_send(perf->ep, stag, sbuf, p->size, perf->mem, NULL, NULL, &s->req);
            if (perf_op_posted(s, st, "xfer_tag_send") != 0) {
                perf_op_release(r);
                return -1;
            }
        }
        perf_op_release(r);
        if (p->flags & PARAM_VERIFY) {
            perf_slot_check(perf, 0, p->size, rseed, i, "tag_lat");
        }
        if (!client) {
            if (i + 1 < total) {
                perf_op_reset(r);
                st = xfer_tag_recv(perf->ctx, perf->ep, rtag, TAG_FULL, rbuf, p->size, perf->mem,
                                   NULL, NULL, &r->req);
                if (perf_op_posted(r, st, "xfer_tag_recv") != 0) {
                    return -1;
                }
            }
        }
        st = perf_op_wait(perf, s);
        perf_op_release(s);
        if (st != XFER_OK) {
            return perf_fail("tag_lat: send", st);
        }
        if (client && i >= p->warmup) {
            perf->samples[i - p->warmup] = (double)(t1 - t0) / 2e3;
        }
    }
    if (client) {
        perf->loop_ns = perf_lat_clock_scale(&clk, perf->samples, p->iters);
    }
    return 0;
}

static uint8_t put_lat_marker(uint64_t iter)
{
    return (uint8_t)(iter % 255 + 1);   /* never 0, the initial value; changes every iteration */
}

/* Progress until the last byte of our buffer reads m (in CUDA memory: a copy per look). */
static int put_lat_wait(perf_t *perf, uint8_t m, uint64_t iter)
{
    uint64_t deadline = 0;
    unsigned n = 0;
    uint8_t last;

    for (;;) {
        if (perf_slot_byte_get(perf, 0, perf->p.size - 1, &last) != 0) {
            return -1;
        }
        if (last == m) {
            break;
        }
        xfer_progress(perf->ctx);
        if ((++n & 0xfff) == 0) {
            if (xfer_endpoint_status(perf->ep) != XFER_OK) {
                return perf_fail("put_lat: the connection", xfer_endpoint_status(perf->ep));
            }
            if (deadline == 0) {
                deadline = perf_now_ns() + TIMEOUT_MS * 1000000ull;
            } else if (perf_now_ns() > deadline) {
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
    uint8_t *sbuf = perf_slot_buf(perf, 1);
    uint64_t sseed = client ? SEED_CLIENT : SEED_SERVER, rseed = client ? SEED_SERVER : SEED_CLIENT;
    op_slot_t *s = &perf->ops[1];
    perf_lat_clock_t clk;
    xfer_status_t st;

    perf_lat_clock_start(&clk);
    for (uint64_t i = 0; i < total; i++) {
        if (i == p->warmup) {
            perf_lat_clock_timed(&clk);
        }
        if (!client) {
            if (put_lat_wait(perf, put_lat_marker(i), i) != 0) {
                return -1;
            }
            if (p->flags & PARAM_VERIFY) {
                perf_slot_check(perf, 0, p->size - 1, rseed, i, "put_lat");
            }
        }
        if (p->flags & PARAM_VERIFY) {
            perf_slot_fill(perf, 1, p->size - 1, sseed, i);
        }
        if (perf_slot_byte_set(perf, 1, p->size - 1, put_lat_marker(i)) != 0) {
            return -1;
        }
        if (client) {
            t0 = perf_lat_clock_now(&clk);
        }
        perf_op_reset(s);
        st = xfer_put(perf->ep, sbuf, p->size, perf->mem, perf_rkey_slot_addr(perf, 0),
                      perf->rkey, NULL, NULL, &s->req);
        if (perf_op_posted(s, st, "put_lat: xfer_put") != 0) {
            return -1;
        }
        st = perf_op_wait(perf, s);
        perf_op_release(s);
        if (st != XFER_OK) {
            return perf_fail("put_lat: put", st);
        }
        if (client) {
            if (put_lat_wait(perf, put_lat_marker(i), i) != 0) {
                return -1;
            }
            t1 = perf_lat_clock_now(&clk);
            if (p->flags & PARAM_VERIFY) {
                perf_slot_check(perf, 0, p->size - 1, rseed, i, "put_lat");
            }
            if (i >= p->warmup) {
                perf->samples[i - p->warmup] = (double)(t1 - t0) / 2e3;
            }
        }
    }
    if (client) {
        perf->loop_ns = perf_lat_clock_scale(&clk, perf->samples, p->iters);
    }
    /* both sides, while the other still progresses: their puts are in the peer's memory
     * before either side closes (a close would otherwise wait for a peer that left) */
    return perf_remote_flush(perf);
}

/* tensor_lat's client: one fetch at a time, each timed whole. */
static int tensor_lat_run(perf_t *perf)
{
    const perf_params_t *p = &perf->p;
    op_slot_t *op = &perf->ops[0];
    perf_lat_clock_t clk;
    uint64_t t0;
    xfer_status_t st;

    perf_lat_clock_start(&clk);
    for (uint64_t i = 0; i < p->warmup + p->iters; i++) {
        if (i == p->warmup) {
            perf_lat_clock_timed(&clk);
        }
        perf_op_reset(op);
        t0 = perf_lat_clock_now(&clk);
        if (perf_op_posted(op, fetch_post(perf, 0, i, op), "xfer_tensor_fetch") != 0) {
            return -1;
        }
        st = perf_op_wait(perf, op);
        if (st != XFER_OK) {
            perf_op_release(op);
            fprintf(stderr, "xfer_perf: tensor_lat: fetch of step %" PRIu64 ": %s\n",
                    p->step_base + i, xfer_status_string(st));
            return -1;
        }
        if (i >= p->warmup) {
            perf->samples[i - p->warmup] = (double)(perf_lat_clock_now(&clk) - t0) / 1e3;
        }
        fetch_done(perf, 0, i, op);
        perf_op_release(op);
    }
    perf->loop_ns = perf_lat_clock_scale(&clk, perf->samples, p->iters);
    return 0;
}

/* ---- each side's part of one size ------------------------------------------------------------ */

/*
 * The client's warm-up and timed iterations; samples[] gets one time per timed iteration and
 * *t_start_p the start of the clock (the caller stops it once the server has acknowledged).
 */
int perf_test_client_run(perf_t *perf, uint64_t *t_start_p)
{
    const perf_params_t *p = &perf->p;
    uint64_t t_prev;

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

        t_prev = perf_now_ns();
        if (window_run(perf, 0, p->warmup, p->window, bw[p->test].post, bw[p->test].done,
                       bw[p->test].what, &t_prev, NULL) != 0) {
            return -1;
        }
        *t_start_p = t_prev = perf_now_ns();
        if (window_run(perf, p->warmup, p->iters, p->window, bw[p->test].post,
                       bw[p->test].done, bw[p->test].what, &t_prev, perf->samples) != 0) {
            return -1;
        }
        /* a put may complete once sent (tcp): the clock stops when the data has landed, as
         * ucx_perftest's does after its flush */
        return (p->test == TEST_PUT_BW) ? perf_remote_flush(perf) : 0;
    }
    case TEST_BATCH_PUT:
    case TEST_BATCH_GET:
        return perf_batch_client_run(perf, t_start_p);
    case TEST_PUT_LAT:
        *t_start_p = perf_now_ns();
        return put_lat_run(perf, 1);
    case TEST_TAG_LAT:
        *t_start_p = perf_now_ns();
        return tag_lat_run(perf, 1);
    default:
        *t_start_p = perf_now_ns();
        return tensor_lat_run(perf);
    }
}

/* Before READY: get_bw reads a fixed source, slot s holding the pattern of "iteration" s. */
void perf_test_server_prepare(perf_t *perf)
{
    if (perf_tests[perf->p.test].batch) {
        perf_batch_server_prepare(perf);
    } else if (perf->p.test == TEST_GET_BW) {
        for (size_t s = 0; s < perf->nslots; s++) {
            perf_slot_fill(perf, s, perf->p.size, SEED_SERVER, s);
        }
    }
}

/* The server's part, between READY and FIN. */
int perf_test_server_run(perf_t *perf)
{
    const perf_params_t *p = &perf->p;
    uint64_t total = p->warmup + p->iters;

    switch (p->test) {
    case TEST_TAG_BW:
        return window_run(perf, 0, total, p->window, tag_recv_post, tag_recv_done,
                          "xfer_tag_recv", NULL, NULL);
    case TEST_TENSOR_BW:
        return window_run(perf, 0, total, p->window, publish_post, NULL,
                          "xfer_tensor_publish", NULL, NULL);
    case TEST_TENSOR_LAT:
        return window_run(perf, 0, total, TENSOR_LAT_DEPTH, publish_post, NULL,
                          "xfer_tensor_publish", NULL, NULL);
    case TEST_BATCH_PUT:
    case TEST_BATCH_GET:
        return perf_batch_server_run(perf);
    case TEST_PUT_LAT:
        return put_lat_run(perf, 0);
    case TEST_TAG_LAT:
        return tag_lat_run(perf, 0);
    default:
        return 0;   /* put_bw, get_bw: one-sided; waiting for FIN progresses them */
    }
}

/* After FIN, with -V: put_bw's slots each hold the last iteration that was put into them. */
void perf_test_server_check(perf_t *perf)
{
    const perf_params_t *p = &perf->p;
    uint64_t total = p->warmup + p->iters;

    if (p->test == TEST_PUT_BW && (p->flags & PARAM_VERIFY)) {
        for (uint64_t s = 0; s < perf->nslots && s < total; s++) {
            perf_slot_check(perf, s, p->size, SEED_CLIENT,
                            s + (total - 1 - s) / p->window * p->window, "put_bw");
        }
    }
}

