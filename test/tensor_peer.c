/* The tensor suites' producer and consumer helpers: see tensor_peer.h. */
#include "tensor_peer.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>



spec_t spec_make(uint64_t step, const char *key, xfer_dtype_t dtype, uint32_t rank,
                 const int64_t *dims, uint64_t seed)
{
    spec_t s;
    uint64_t n = 1;

    memset(&s, 0, sizeof(s));
    s.step = step;
    snprintf(s.key, sizeof(s.key), "%s", key);
    s.seed    = seed;
    s.t.dtype = dtype;
    s.t.rank  = rank;
    for (uint32_t i = 0; i < rank; i++) {
        s.t.dims[i] = dims[i];
        n *= (uint64_t)dims[i];
    }
    s.t.size = n * xfer_dtype_size(dtype);
    return s;
}

void spec_nth(const spec_t *s, uint32_t i, spec_t *out)
{
    *out = *s;
    if (s->count > 1) {
        snprintf(out->key, sizeof(out->key), "%.1000s%u", s->key, i);
        out->seed       = s->seed + i;
        out->t.dtype    = XFER_DTYPE_UINT64;
        out->t.rank     = 1;
        out->t.dims[0]  = 1 + i % 64;
        out->t.size     = 8 * (uint64_t)out->t.dims[0];
    }
}

/* ---- the producer ---------------------------------------------------------------------------- */

typedef struct pub {
    xfer_request_t *req;
    void           *data;
} pub_t;

int srv_producer(tp_side_t *s)
{
    static pub_t pubs[4096];
    size_t npubs = 0;

    for (;;) {
        uint64_t cmd, v, st;
        spec_t sp;
        size_t len;

        TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS * 2) == 0, "no command from the parent");
        TP_CHECK(tp_ctl_recv_u64(s->ctl, &cmd, TP_WAIT_MS) == 0, "ctl");
        switch (cmd) {
        case CMD_DONE:
            /* pending publishes end with the context; their data only after that */
            xfer_endpoint_close(s->ep);
            xfer_listener_close(s->listener);
            xfer_context_destroy(s->ctx);
            s->ep       = NULL;
            s->listener = NULL;
            s->ctx      = NULL;
            for (size_t i = 0; i < npubs; i++) {
                free(pubs[i].data);
            }
            return 0;
        case CMD_PUBLISH:
            TP_CHECK(tp_ctl_recv(s->ctl, &sp, sizeof(sp), &len, TP_WAIT_MS) == 0, "ctl");
            st = XFER_OK;
            for (uint32_t i = 0; i < ((sp.count > 1) ? sp.count : 1); i++) {
                spec_t one;
                xfer_tensor_t t;
                void *data = NULL;
                xfer_status_t ps;

                spec_nth(&sp, i, &one);
                t = one.t;
                if (!t.is_dead && (t.size > 0) && one.readonly) {
                    data = mmap(NULL, t.size, PROT_READ | PROT_WRITE,
                                MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
                    TP_CHECK(data != MAP_FAILED, "mmap");
                    tp_fill_pattern(data, t.size, one.seed);
                    TP_CHECK(mprotect(data, t.size, PROT_READ) == 0, "mprotect");
                } else if (!t.is_dead && (t.size > 0)) {
                    data = malloc(t.size);
                    tp_fill_pattern(data, t.size, one.seed);
                }
                t.data = data;
                TP_CHECK(npubs < sizeof(pubs) / sizeof(pubs[0]), "too many publishes");
                pubs[npubs].req = NULL;
                ps = xfer_tensor_publish(s->ctx, one.step, one.key, &t, one.flags, NULL, NULL,
                                         &pubs[npubs].req);
                if (one.readonly) {
                    data = NULL;    /* the mapping stays until the child exits */
                }
                if (one.clobber && (data != NULL)) {
                    memset(data, 0xEE, t.size);
                    free(data);
                    data = NULL;
                }
                if (TP_POSTED(ps)) {
                    TP_CHECK(pubs[npubs].req != NULL, "publish posted without a request");
                    pubs[npubs++].data = data;
                } else {
                    TP_CHECK(pubs[npubs].req == NULL, "a failed publish created a request");
                    free(data);
                }
                if ((i == 0) || !TP_POSTED(ps)) {
                    st = (uint64_t)(int64_t)ps;   /* the first failure, else the first status */
                }
            }
            TP_CHECK(tp_ctl_send_u64(s->ctl, st) == 0, "ctl");
            break;
        case CMD_WAIT_ALL: {
            int64_t *res = calloc(npubs + 1, sizeof(*res));
            for (size_t i = 0; i < npubs; i++) {
                res[i] = xfer_request_wait(pubs[i].req, TP_WAIT_MS);
                if (res[i] != XFER_ERR_TIMEOUT) {
                    xfer_request_release(pubs[i].req);
                    free(pubs[i].data);
                } else {
                    xfer_request_release(pubs[i].req);  /* frees it once it completes */
                    pubs[i].data = NULL;                /* leaked on purpose: may be in use */
                }
            }
            TP_CHECK(tp_ctl_send(s->ctl, res, npubs * sizeof(*res)) == 0, "ctl");
            free(res);
            npubs = 0;
            break;
        }
        case CMD_ABORT:
            TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
            TP_CHECK(tp_ctl_recv_u64(s->ctl, &st, TP_WAIT_MS) == 0, "ctl");
            st = (uint64_t)(int64_t)xfer_tensor_abort(s->ctx, v, (xfer_status_t)(int64_t)st);
            TP_CHECK(tp_ctl_send_u64(s->ctl, st) == 0, "ctl");
            break;
        case CMD_COUNTERS: {
            xfer_counter_t c[128];
            size_t n = 128;

            TP_CHECK_STATUS(xfer_endpoint_counters(s->ep, c, &n), XFER_OK);
            TP_CHECK(tp_ctl_send(s->ctl, c, ((n < 128) ? n : 128) * sizeof(c[0])) == 0, "ctl");
            break;
        }
        case CMD_PROGRESS:
            TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
            tp_progress_for(s->ctx, (int)v);
            TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
            break;
        default:
            TP_CHECK(0, "unknown command %llu", (unsigned long long)cmd);
        }
    }
}

/* ---- the consumer ---------------------------------------------------------------------------- */

xfer_status_t publish(tp_peer_t *p, const spec_t *sp)
{
    tp_send(p, CMD_PUBLISH);
    tp_send_blob(p, sp, sizeof(*sp));
    return (xfer_status_t)(int64_t)tp_recv(p);
}

void publish_ok(tp_peer_t *p, const spec_t *sp)
{
    xfer_status_t s = publish(p, sp);

    cr_assert(TP_POSTED(s), "publish (%llu, %s): %s", (unsigned long long)sp->step, sp->key,
              xfer_status_string(s));
}

/* Wait for the producer's publish requests; returns how many there were. */
size_t publishes_wait(tp_peer_t *p, int64_t *res, size_t cap)
{
    size_t len;
    void *blob;

    tp_send(p, CMD_WAIT_ALL);
    blob = tp_recv_blob(p, &len);
    cr_assert_leq(len / sizeof(int64_t), cap);
    memcpy(res, blob, len);
    free(blob);
    return len / sizeof(int64_t);
}

void publishes_expect(tp_peer_t *p, size_t n, xfer_status_t want)
{
    static int64_t res[4096];
    size_t got = publishes_wait(p, res, 4096);

    cr_assert_eq(got, n, "the producer has %zu publish requests, expected %zu", got, n);
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(res[i], want, "publish request %zu completed with %s, expected %s", i,
                     xfer_status_string((xfer_status_t)res[i]), xfer_status_string(want));
    }
}

xfer_status_t remote_abort(tp_peer_t *p, uint64_t step, xfer_status_t status)
{
    tp_send(p, CMD_ABORT);
    tp_send(p, step);
    tp_send(p, (uint64_t)(int64_t)status);
    return (xfer_status_t)(int64_t)tp_recv(p);
}

void producer_done(tp_peer_t *p)
{
    tp_send(p, CMD_DONE);
    tp_finish(p);
}


void fetch_cb(xfer_request_t *req, xfer_status_t status, void *arg)
{
    fetch_t *f = arg;

    f->calls++;
    f->cb_status = status;
}

xfer_status_t fetch_post(tp_peer_t *p, uint64_t step, const char *key, size_t cap,
                         fetch_t *f)
{
    xfer_fetch_params_t fp = {0};

    memset(f, 0, sizeof(*f));
    f->cap      = cap;
    f->buf      = malloc(cap + 64);
    memset(f->buf, 0xA5, cap + 64);
    fp.size     = sizeof(fp);
    fp.buffer   = f->buf;
    fp.capacity = cap;
    return xfer_tensor_fetch(p->ep, step, key, &fp, fetch_cb, f, &f->req);
}

void fetch_release(fetch_t *f)
{
    xfer_request_release(f->req);
    free(f->buf);
    f->req = NULL;
    f->buf = NULL;
}

/* The fetch completed with XFER_OK and brought exactly sp's tensor. */
void check_fetched(fetch_t *f, const spec_t *sp)
{
    const xfer_tensor_t *t = xfer_request_tensor(f->req);

    cr_assert_not_null(t, "(%llu, %s): no tensor on a completed fetch",
                       (unsigned long long)sp->step, sp->key);
    cr_assert_eq(t->dtype, sp->t.dtype, "%s: dtype %d, expected %d", sp->key, t->dtype,
                 sp->t.dtype);
    cr_assert_eq(t->rank, sp->t.rank, "%s: rank %u, expected %u", sp->key, t->rank, sp->t.rank);
    for (uint32_t i = 0; i < sp->t.rank; i++) {
        cr_assert_eq(t->dims[i], sp->t.dims[i], "%s: dims[%u] = %lld, expected %lld", sp->key,
                     i, (long long)t->dims[i], (long long)sp->t.dims[i]);
    }
    cr_assert_eq(t->size, sp->t.size, "%s: size %llu, expected %llu", sp->key,
                 (unsigned long long)t->size, (unsigned long long)sp->t.size);
    cr_assert_eq(!!t->is_dead, !!sp->t.is_dead, "%s: is_dead", sp->key);
    if (sp->t.size > 0) {
        ssize_t bad;
        cr_assert_not_null(t->data);
        bad = tp_check_pattern(t->data, sp->t.size, sp->seed);
        cr_assert_eq(bad, -1, "%s: tensor data byte %zd is wrong", sp->key, bad);
        if (f->buf != NULL) {
            cr_expect_eq(t->data, f->buf, "%s: the data lands in the caller's buffer", sp->key);
            cr_assert_eq(tp_check_pattern(f->buf, sp->t.size, sp->seed), -1, "%s: buffer",
                         sp->key);
        }
        cr_expect_eq(xfer_request_length(f->req), sp->t.size, "%s: bytes moved", sp->key);
    }
    if (f->buf != NULL) {
        for (size_t i = sp->t.size; i < f->cap + 64; i++) {
            cr_assert_eq((uint8_t)f->buf[i], 0xA5, "%s: fetch wrote past the tensor (%zu)",
                         sp->key, i);
        }
    }
}

/* Fetch sp and check it; the producer must have it or get it soon. */
void fetch_expect(tp_peer_t *p, const spec_t *sp)
{
    fetch_t f;
    xfer_status_t s = fetch_post(p, sp->step, sp->key, sp->t.size + 16, &f);

    cr_assert(TP_POSTED(s), "fetch (%llu, %s): %s", (unsigned long long)sp->step, sp->key,
              xfer_status_string(s));
    s = xfer_request_wait(f.req, TP_WAIT_MS);
    cr_assert_eq(s, XFER_OK, "fetch (%llu, %s): %s", (unsigned long long)sp->step, sp->key,
                 xfer_status_string(s));
    check_fetched(&f, sp);
    cr_assert_eq(f.calls, 1, "fetch callback called %d times", f.calls);
    fetch_release(&f);
}

xfer_status_t fetch_status(tp_peer_t *p, uint64_t step, const char *key, size_t cap)
{
    fetch_t f;
    xfer_status_t s = fetch_post(p, step, key, cap, &f);

    if (!TP_POSTED(s)) {
        free(f.buf);
        return s;
    }
    s = xfer_request_wait(f.req, TP_WAIT_MS);
    fetch_release(&f);
    return s;
}

uint64_t counter_of(const xfer_counter_t *c, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++) {
        if (strcmp(c[i].name, name) == 0) {
            return c[i].value;
        }
    }
    cr_assert_fail("no counter named %s among %zu", name, n);
    return 0;
}

size_t ep_counters(xfer_endpoint_t *ep, xfer_counter_t *c, size_t max)
{
    size_t n = max;

    cr_assert_eq(xfer_endpoint_counters(ep, c, &n), XFER_OK);
    cr_assert_leq(n, max);
    return n;
}

size_t producer_counters(tp_peer_t *p, xfer_counter_t *c, size_t max)
{
    size_t len;
    void *blob;

    tp_send(p, CMD_COUNTERS);
    blob = tp_recv_blob(p, &len);
    cr_assert_leq(len, max * sizeof(*c));
    memcpy(c, blob, len);
    free(blob);
    return len / sizeof(*c);
}
