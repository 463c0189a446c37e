/*
 * Tensors by (step, key) between a producer process and a consumer. The producer is a server
 * child driven over the control channel (publish this spec, wait for my publishes, abort this
 * step); the consumer - the test itself - fetches and checks metadata and data. Covers both
 * orders of publish and fetch, every fixed-size dtype at ranks 0..8, dead and variable-size
 * tensors, too-small buffers, the allocation callback, duplicate and invalid keys, one key
 * in many steps, XFER_PUBLISH_COPY, aborts on either side, cancellation and 1000 fetches in
 * flight.
 */
#include "tensor_peer.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <xfer/component.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void setup(void)
{
    tp_env();
}

TestSuite(tensor, .init = setup, .timeout = 120);

static const int64_t d34[] = {3, 4};

/* ---- basics ---------------------------------------------------------------------------------- */

Test(tensor, publish_then_fetch)
{
    tp_peer_t p;
    spec_t sp = spec_make(1, "weights", XFER_DTYPE_FLOAT32, 2, d34, 11);

    tp_start(&p, srv_producer, NULL);
    publish_ok(&p, &sp);
    fetch_expect(&p, &sp);
    publishes_expect(&p, 1, XFER_OK);
    producer_done(&p);
}

Test(tensor, fetch_into_a_registered_buffer)
{
    static const int64_t mib[] = {1 << 18};
    tp_peer_t p;
    spec_t sp = spec_make(1, "registered", XFER_DTYPE_FLOAT32, 1, mib, 15);
    size_t cap = (1 << 20) + 4096;
    char *buf  = malloc(cap);
    xfer_fetch_params_t fp = {sizeof(fp), buf, cap, NULL, NULL, NULL};
    xfer_request_t *req = NULL;
    xfer_mem_t *mem;

    tp_start(&p, srv_producer, NULL);
    cr_assert_eq(xfer_mem_register(p.ctx, buf, cap, XFER_MEM_HOST, &mem), XFER_OK);
    fp.mem = mem;
    publish_ok(&p, &sp);
    cr_assert(TP_POSTED(xfer_tensor_fetch(p.ep, 1, "registered", &fp, NULL, NULL, &req)));
    cr_assert_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
    cr_assert_eq(xfer_request_tensor(req)->size, 1u << 20);
    cr_assert_eq(tp_check_pattern(buf, 1 << 20, 15), -1);
    xfer_request_release(req);
    cr_assert_eq(xfer_mem_deregister(mem), XFER_OK);
    free(buf);
    publishes_expect(&p, 1, XFER_OK);
    producer_done(&p);
}

Test(tensor, fetch_before_publish_waits_for_it)
{
    tp_peer_t p;
    spec_t sp = spec_make(1, "late", XFER_DTYPE_INT64, 2, d34, 12);
    fetch_t f;

    tp_start(&p, srv_producer, NULL);
    cr_assert(TP_POSTED(fetch_post(&p, 1, "late", 4096, &f)));
    cr_assert_eq(xfer_request_wait(f.req, 300), XFER_ERR_TIMEOUT, "nothing is published yet");
    publish_ok(&p, &sp);
    cr_assert_eq(xfer_request_wait(f.req, TP_WAIT_MS), XFER_OK);
    check_fetched(&f, &sp);
    cr_assert_eq(f.calls, 1);
    fetch_release(&f);
    publishes_expect(&p, 1, XFER_OK);
    producer_done(&p);
}

Test(tensor, one_publish_satisfies_one_fetch)
{
    tp_peer_t p;
    spec_t a = spec_make(1, "once", XFER_DTYPE_UINT8, 2, d34, 13);
    spec_t b = spec_make(1, "once", XFER_DTYPE_UINT8, 2, d34, 14);
    fetch_t f1, f2;

    tp_start(&p, srv_producer, NULL);
    publish_ok(&p, &a);
    cr_assert(TP_POSTED(fetch_post(&p, 1, "once", 64, &f1)));
    cr_assert_eq(xfer_request_wait(f1.req, TP_WAIT_MS), XFER_OK);
    check_fetched(&f1, &a);
    cr_assert(TP_POSTED(fetch_post(&p, 1, "once", 64, &f2)));
    cr_assert_eq(xfer_request_wait(f2.req, 300), XFER_ERR_TIMEOUT,
                 "a second fetch of a tensor fetched once waits for a new publish");
    publishes_expect(&p, 1, XFER_OK);
    /* now (1, "once") is no longer pending: publishing it again is allowed */
    publish_ok(&p, &b);
    cr_assert_eq(xfer_request_wait(f2.req, TP_WAIT_MS), XFER_OK);
    check_fetched(&f2, &b);
    fetch_release(&f1);
    fetch_release(&f2);
    publishes_expect(&p, 1, XFER_OK);
    producer_done(&p);
}

/* (step, key) is the whole name: the same key in another step - also one that differs only
 * in its high bits - and keys that are prefixes of each other are other tensors. Fetched in
 * the opposite order to their publishes, each gets its own data. */
Test(tensor, same_key_in_other_steps_and_prefix_keys_are_other_tensors)
{
    static const char *const keys[]  = {"w", "ww", "w:", "www"};
    static const uint64_t    steps[] = {1, 2, (1ull << 40) | 1};
    spec_t sp[3 * 4];
    tp_peer_t p;
    size_t n = 0;

    tp_start(&p, srv_producer, NULL);
    for (size_t s = 0; s < 3; s++) {
        for (size_t k = 0; k < 4; k++, n++) {
            sp[n] = spec_make(steps[s], keys[k], XFER_DTYPE_UINT8, 2, d34, 100 + n);
            publish_ok(&p, &sp[n]);
        }
    }
    while (n-- > 0) {
        fetch_expect(&p, &sp[n]);
    }
    publishes_expect(&p, 3 * 4, XFER_OK);
    producer_done(&p);
}

Test(tensor, every_dtype_at_ranks_0_1_3_8)
{
    static const uint32_t ranks[] = {0, 1, 3, 8};
    static const int64_t dims[4][8] = {{0}, {7}, {4, 5, 6}, {2, 1, 3, 1, 2, 1, 1, 2}};
    static spec_t specs[XFER_DTYPE_LAST * 4];
    tp_peer_t p;
    size_t n = 0;

    tp_start(&p, srv_producer, NULL);
    for (int d = XFER_DTYPE_FLOAT16; d <= XFER_DTYPE_BOOL; d++) {
        for (int r = 0; r < 4; r++) {
            char key[32];
            snprintf(key, sizeof(key), "d%d/r%u", d, ranks[r]);
            specs[n] = spec_make(2, key, (xfer_dtype_t)d, ranks[r], dims[r], 100 + n);
            publish_ok(&p, &specs[n]);
            n++;
        }
    }
    /* fetched in another order than published */
    for (size_t i = n; i-- > 0;) {
        fetch_expect(&p, &specs[i]);
    }
    publishes_expect(&p, n, XFER_OK);
    producer_done(&p);
}

Test(tensor, dead_tensor_carries_metadata_but_no_data)
{
    tp_peer_t p;
    spec_t sp = spec_make(3, "dead", XFER_DTYPE_FLOAT32, 2, d34, 0);

    sp.t.is_dead = 1;
    sp.t.size    = 0;
    tp_start(&p, srv_producer, NULL);
    publish_ok(&p, &sp);
    fetch_expect(&p, &sp);
    publishes_expect(&p, 1, XFER_OK);
    producer_done(&p);
}

Test(tensor, bytes_dtype_size_is_authoritative)
{
    static const int64_t three[] = {3};
    tp_peer_t p;
    spec_t a = spec_make(4, "str", XFER_DTYPE_BYTES, 1, three, 21);
    spec_t b = spec_make(4, "empty", XFER_DTYPE_BYTES, 1, three, 22);
    spec_t c = spec_make(4, "scalar", XFER_DTYPE_BYTES, 0, NULL, 23);

    a.t.size = 17;
    b.t.size = 0;
    c.t.size = 1000;
    tp_start(&p, srv_producer, NULL);
    publish_ok(&p, &a);
    publish_ok(&p, &b);
    publish_ok(&p, &c);
    fetch_expect(&p, &a);
    fetch_expect(&p, &b);
    fetch_expect(&p, &c);
    publishes_expect(&p, 3, XFER_OK);
    producer_done(&p);
}

Test(tensor, buffer_too_small_is_truncated)
{
    static const int64_t thousand[] = {1000};
    tp_peer_t p;
    spec_t sp = spec_make(5, "big", XFER_DTYPE_UINT8, 1, thousand, 31);
    fetch_t f;
    xfer_status_t s;

    tp_start(&p, srv_producer, NULL);
    publish_ok(&p, &sp);
    cr_assert(TP_POSTED(fetch_post(&p, 5, "big", 999, &f)));
    s = xfer_request_wait(f.req, TP_WAIT_MS);
    cr_assert_eq(s, XFER_ERR_TRUNCATED, "1000 bytes into 999: %s", xfer_status_string(s));
    cr_expect_eq(f.calls, 1);
    for (size_t i = 999; i < 999 + 64; i++) {
        cr_assert_eq((uint8_t)f.buf[i], 0xA5, "a truncated fetch wrote past its buffer");
    }
    fetch_release(&f);
    cr_expect_eq(xfer_endpoint_status(p.ep), XFER_OK);
    producer_done(&p);
}

typedef struct alloc_rec {
    int           calls;
    xfer_tensor_t meta;
    void          *arg;
    void          *ret;
    int           fail;
} alloc_rec_t;

static void *alloc_cb(const xfer_tensor_t *meta, void *arg)
{
    alloc_rec_t *a = arg;

    a->calls++;
    a->meta = *meta;
    a->arg  = arg;
    a->ret  = a->fail ? NULL : malloc(meta->size + 1);
    return a->ret;
}

Test(tensor, allocation_callback_gets_the_metadata)
{
    tp_peer_t p;
    spec_t sp = spec_make(6, "alloc", XFER_DTYPE_FLOAT64, 2, d34, 41);
    xfer_fetch_params_t fp = {sizeof(fp), NULL, 0, NULL, alloc_cb, NULL};
    alloc_rec_t rec = {0};
    xfer_request_t *req = NULL;
    fetch_t f = {0};
    xfer_status_t s;

    fp.alloc_arg = &rec;
    tp_start(&p, srv_producer, NULL);
    publish_ok(&p, &sp);
    cr_assert(TP_POSTED(xfer_tensor_fetch(p.ep, 6, "alloc", &fp, NULL, NULL, &req)));
    s = xfer_request_wait(req, TP_WAIT_MS);
    cr_assert_eq(s, XFER_OK, "%s", xfer_status_string(s));
    cr_assert_eq(rec.calls, 1, "alloc called %d times", rec.calls);
    cr_expect_eq(rec.arg, &rec);
    cr_expect_eq(rec.meta.dtype, XFER_DTYPE_FLOAT64);
    cr_expect_eq(rec.meta.rank, 2);
    cr_expect_eq(rec.meta.dims[0], 3);
    cr_expect_eq(rec.meta.dims[1], 4);
    cr_expect_eq(rec.meta.size, 96);
    f.req = req;
    check_fetched(&f, &sp);
    cr_expect_eq(xfer_request_tensor(req)->data, rec.ret, "the data lands in the allocated "
                 "buffer");
    cr_assert_eq(tp_check_pattern(rec.ret, 96, 41), -1);
    xfer_request_release(req);
    free(rec.ret);
    publishes_expect(&p, 1, XFER_OK);
    producer_done(&p);
}

Test(tensor, allocation_callback_returning_null_fails_with_no_memory)
{
    tp_peer_t p;
    spec_t sp = spec_make(6, "nomem", XFER_DTYPE_FLOAT64, 2, d34, 42);
    xfer_fetch_params_t fp = {sizeof(fp), NULL, 0, NULL, alloc_cb, NULL};
    alloc_rec_t rec = {0};
    xfer_request_t *req = NULL;
    xfer_status_t s;

    rec.fail     = 1;
    fp.alloc_arg = &rec;
    tp_start(&p, srv_producer, NULL);
    publish_ok(&p, &sp);
    cr_assert(TP_POSTED(xfer_tensor_fetch(p.ep, 6, "nomem", &fp, NULL, NULL, &req)));
    s = xfer_request_wait(req, TP_WAIT_MS);
    cr_assert_eq(s, XFER_ERR_NO_MEMORY, "%s", xfer_status_string(s));
    cr_expect_eq(rec.calls, 1);
    xfer_request_release(req);
    cr_expect_eq(xfer_endpoint_status(p.ep), XFER_OK, "a local failure keeps the endpoint");
    producer_done(&p);
}

/* ---- keys and publish rules ------------------------------------------------------------------ */

Test(tensor, duplicate_publish_of_a_pending_key_is_refused)
{
    tp_peer_t p;
    spec_t a = spec_make(7, "dup", XFER_DTYPE_INT32, 2, d34, 51);
    spec_t b = spec_make(7, "dup", XFER_DTYPE_INT32, 2, d34, 52);
    spec_t other_step = spec_make(8, "dup", XFER_DTYPE_INT32, 2, d34, 53);

    tp_start(&p, srv_producer, NULL);
    publish_ok(&p, &a);
    cr_assert_eq(publish(&p, &b), XFER_ERR_EXISTS);
    publish_ok(&p, &other_step);                    /* the same key in another step is fine */
    fetch_expect(&p, &a);                           /* the first one is what is fetched */
    fetch_expect(&p, &other_step);
    publishes_expect(&p, 2, XFER_OK);
    publish_ok(&p, &b);                             /* fetched: the key is free again */
    fetch_expect(&p, &b);
    publishes_expect(&p, 1, XFER_OK);
    producer_done(&p);
}

/* The framework's key length limit, from its parameter table (XFER_*KEY_LEN*). */
static size_t max_key_len(xfer_context_t *ctx)
{
    for (size_t i = 0; i < xfer_param_count(ctx); i++) {
        xfer_param_info_t info;
        cr_assert_eq(xfer_param_get(ctx, i, &info), XFER_OK);
        if ((info.component == NULL) && (strstr(info.env_name, "KEY_LEN") != NULL)) {
            return (size_t)strtoull(info.value, NULL, 0);
        }
    }
    cr_assert_fail("no framework parameter XFER_..._KEY_LEN (xfer.h: keys are at most "
                   "XFER_MAX_KEY_LEN bytes)");
    return 0;
}

Test(tensor, key_length_limits)
{
    tp_peer_t p;
    xfer_context_t *ctx;
    size_t max;
    char *key;
    uint8_t data[48] = {0};
    xfer_tensor_t t  = {XFER_DTYPE_FLOAT32, 2, {3, 4}, 48, data, 0};
    xfer_request_t *req = SENTINEL;
    spec_t sp = spec_make(9, "", XFER_DTYPE_FLOAT32, 2, d34, 61);
    xfer_status_t s;

    tp_start(&p, srv_producer, NULL);
    ctx = p.ctx;
    max = max_key_len(ctx);
    cr_assert_gt(max, 0);
    cr_assert_lt(max, 1 << 20);
    key = malloc(max + 2);
    memset(key, 'k', max + 1);
    key[max + 1] = '\0';
    /* one byte too long: refused (with an error of the library's choosing), no request */
    s = xfer_tensor_publish(ctx, 1, key, &t, 0, NULL, NULL, &req);
    cr_expect(!TP_POSTED(s), "a %zu-byte key (limit %zu) was published: %s", max + 1, max,
              xfer_status_string(s));
    cr_expect_eq(req, SENTINEL);
    s = fetch_status(&p, 1, key, 64);
    cr_expect(!TP_POSTED(s) && (s != XFER_ERR_TIMEOUT), "a fetch with a %zu-byte key: %s",
              max + 1, xfer_status_string(s));
    cr_expect_eq(xfer_tensor_publish(ctx, 1, "", &t, 0, NULL, NULL, &req),
                 XFER_ERR_INVALID_PARAM, "empty key");
    cr_expect_eq(xfer_tensor_publish(ctx, 1, NULL, &t, 0, NULL, NULL, &req),
                 XFER_ERR_INVALID_PARAM, "NULL key");
    cr_expect_eq(fetch_status(&p, 1, "", 64), XFER_ERR_INVALID_PARAM, "fetch of an empty key");
    cr_expect_eq(req, SENTINEL);
    /* exactly the limit: works end to end */
    key[max] = '\0';
    if (max < sizeof(sp.key)) {
        snprintf(sp.key, sizeof(sp.key), "%s", key);
        publish_ok(&p, &sp);
        fetch_expect(&p, &sp);
        publishes_expect(&p, 1, XFER_OK);
    }
    cr_expect(TP_POSTED(xfer_tensor_publish(ctx, 1, key, &t, XFER_PUBLISH_COPY, NULL, NULL,
                                            &req)), "a %zu-byte key is at the limit", max);
    if (req != SENTINEL) {
        xfer_request_release(req);
    }
    free(key);
    producer_done(&p);
}

Test(tensor, invalid_tensors_and_fetch_params_are_refused)
{
    tp_peer_t p;
    uint8_t data[48] = {0};
    xfer_tensor_t ok = {XFER_DTYPE_FLOAT32, 2, {3, 4}, 48, data, 0}, t;
    xfer_fetch_params_t fp = {sizeof(fp), NULL, 0, NULL, NULL, NULL};
    xfer_request_t *req = SENTINEL;

    tp_start(&p, srv_producer, NULL);
    cr_expect_eq(xfer_tensor_publish(p.ctx, 1, "k", NULL, 0, NULL, NULL, &req),
                 XFER_ERR_INVALID_PARAM, "NULL tensor");
    t = ok;
    t.rank = XFER_TENSOR_MAX_RANK + 1;
    cr_expect_eq(xfer_tensor_publish(p.ctx, 1, "k", &t, 0, NULL, NULL, &req),
                 XFER_ERR_INVALID_PARAM, "rank 9");
    t = ok;
    t.dtype = XFER_DTYPE_INVALID;
    cr_expect_eq(xfer_tensor_publish(p.ctx, 1, "k", &t, 0, NULL, NULL, &req),
                 XFER_ERR_INVALID_PARAM, "XFER_DTYPE_INVALID");
    t.dtype = XFER_DTYPE_LAST;
    cr_expect_eq(xfer_tensor_publish(p.ctx, 1, "k", &t, 0, NULL, NULL, &req),
                 XFER_ERR_INVALID_PARAM, "XFER_DTYPE_LAST");
    t = ok;
    t.data = NULL;
    cr_expect_eq(xfer_tensor_publish(p.ctx, 1, "k", &t, 0, NULL, NULL, &req),
                 XFER_ERR_INVALID_PARAM, "live tensor of 48 bytes without data");
    cr_expect_eq(xfer_tensor_publish(NULL, 1, "k", &ok, 0, NULL, NULL, &req),
                 XFER_ERR_INVALID_PARAM, "NULL context");
    cr_expect_eq(xfer_tensor_fetch(p.ep, 1, "k", &fp, NULL, NULL, &req), XFER_ERR_INVALID_PARAM,
                 "neither a buffer nor an allocation callback");
    cr_expect_eq(xfer_tensor_fetch(NULL, 1, "k", &fp, NULL, NULL, &req), XFER_ERR_INVALID_PARAM);
    cr_expect_eq(req, SENTINEL);
    producer_done(&p);
}

Test(tensor, publish_copy_lets_the_caller_reuse_its_buffer_at_once)
{
    tp_peer_t p;
    spec_t sp = spec_make(10, "copied", XFER_DTYPE_UINT32, 2, d34, 71);
    spec_t big;
    static const int64_t mib[] = {1 << 20};

    sp.flags   = XFER_PUBLISH_COPY;
    sp.clobber = 1;
    big        = spec_make(10, "copied-big", XFER_DTYPE_UINT8, 1, mib, 72);
    big.flags   = XFER_PUBLISH_COPY;
    big.clobber = 1;
    tp_start(&p, srv_producer, NULL);
    publish_ok(&p, &sp);
    publish_ok(&p, &big);
    fetch_expect(&p, &sp);
    fetch_expect(&p, &big);
    publishes_expect(&p, 2, XFER_OK);
    producer_done(&p);
}

/* ---- abort and cancel ------------------------------------------------------------------------ */

Test(tensor, abort_on_the_producer_fails_waiting_fetches_and_publishes_with_its_status)
{
    tp_peer_t p;
    spec_t b     = spec_make(5, "b", XFER_DTYPE_INT8, 2, d34, 81);
    spec_t c     = spec_make(5, "c", XFER_DTYPE_INT8, 2, d34, 82);
    spec_t other = spec_make(6, "a", XFER_DTYPE_INT8, 2, d34, 83);
    fetch_t f;
    xfer_status_t s;

    tp_start(&p, srv_producer, NULL);
    cr_assert(TP_POSTED(fetch_post(&p, 5, "a", 64, &f)));
    cr_assert_eq(xfer_request_wait(f.req, 200), XFER_ERR_TIMEOUT);
    publish_ok(&p, &b);                                     /* never fetched */
    cr_assert_eq(remote_abort(&p, 5, XFER_ERR_IO), XFER_OK);
    s = xfer_request_wait(f.req, TP_WAIT_MS);
    cr_assert_eq(s, XFER_ERR_IO, "the waiting fetch completed with %s, expected the abort "
                 "status %s", xfer_status_string(s), xfer_status_string(XFER_ERR_IO));
    cr_expect_eq(f.calls, 1);
    cr_expect_eq(f.cb_status, XFER_ERR_IO);
    fetch_release(&f);
    publishes_expect(&p, 1, XFER_ERR_IO);
    /* the step stays aborted: publishes refused, later fetches fail with the status */
    s = publish(&p, &c);
    cr_expect_eq(s, XFER_ERR_ABORTED, "publish in a step aborted with %s: %s, expected "
                 "XFER_ERR_ABORTED", xfer_status_string(XFER_ERR_IO), xfer_status_string(s));
    s = fetch_status(&p, 5, "d", 64);
    cr_expect_eq(s, XFER_ERR_IO, "a fetch arriving after the abort: %s", xfer_status_string(s));
    /* other steps are not affected */
    publish_ok(&p, &other);
    fetch_expect(&p, &other);
    publishes_expect(&p, 1, XFER_OK);
    cr_expect_eq(xfer_endpoint_status(p.ep), XFER_OK);
    producer_done(&p);
}

Test(tensor, fetch_of_a_step_aborted_earlier_fails)
{
    tp_peer_t p;
    xfer_status_t s;

    tp_start(&p, srv_producer, NULL);
    cr_assert_eq(remote_abort(&p, 9, XFER_ERR_ABORTED), XFER_OK);
    s = fetch_status(&p, 9, "x", 64);
    cr_assert_eq(s, XFER_ERR_ABORTED, "%s", xfer_status_string(s));
    producer_done(&p);
}

Test(tensor, abort_of_every_step)
{
    tp_peer_t p;
    fetch_t f[3];
    spec_t pub = spec_make(2, "p", XFER_DTYPE_INT8, 2, d34, 91);

    tp_start(&p, srv_producer, NULL);
    for (int i = 0; i < 3; i++) {
        cr_assert(TP_POSTED(fetch_post(&p, 100 + (uint64_t)i * 1000000, "w", 64, &f[i])));
    }
    publish_ok(&p, &pub);
    cr_assert_eq(xfer_request_wait(f[0].req, 200), XFER_ERR_TIMEOUT);
    cr_assert_eq(remote_abort(&p, XFER_STEP_ALL, XFER_ERR_ABORTED), XFER_OK);
    for (int i = 0; i < 3; i++) {
        xfer_status_t s = xfer_request_wait(f[i].req, TP_WAIT_MS);
        cr_expect_eq(s, XFER_ERR_ABORTED, "fetch %d: %s", i, xfer_status_string(s));
        fetch_release(&f[i]);
    }
    publishes_expect(&p, 1, XFER_ERR_ABORTED);
    /* every step, later ones too */
    pub.step = 123456789;
    cr_expect_eq(publish(&p, &pub), XFER_ERR_ABORTED, "publish after XFER_STEP_ALL");
    cr_expect_eq(fetch_status(&p, 987654321, "w", 64), XFER_ERR_ABORTED,
                 "fetch after XFER_STEP_ALL");
    producer_done(&p);
}

Test(tensor, abort_on_the_consumer_fails_its_own_pending_fetches)
{
    tp_peer_t p;
    fetch_t a, b, c;
    spec_t later = spec_make(8, "a", XFER_DTYPE_INT16, 2, d34, 101);

    tp_start(&p, srv_producer, NULL);
    cr_assert(TP_POSTED(fetch_post(&p, 7, "a", 64, &a)));
    cr_assert(TP_POSTED(fetch_post(&p, 7, "b", 64, &b)));
    cr_assert(TP_POSTED(fetch_post(&p, 8, "a", 64, &c)));
    cr_assert_eq(xfer_request_wait(a.req, 200), XFER_ERR_TIMEOUT);
    cr_assert_eq(xfer_tensor_abort(p.ctx, 7, XFER_ERR_ABORTED), XFER_OK);
    cr_expect_eq(xfer_request_wait(a.req, TP_WAIT_MS), XFER_ERR_ABORTED);
    cr_expect_eq(xfer_request_wait(b.req, TP_WAIT_MS), XFER_ERR_ABORTED);
    cr_expect_eq(a.calls, 1);
    cr_expect_eq(xfer_request_test(c.req), XFER_INPROGRESS, "step 8 is not aborted");
    publish_ok(&p, &later);
    cr_assert_eq(xfer_request_wait(c.req, TP_WAIT_MS), XFER_OK);
    check_fetched(&c, &later);
    fetch_release(&a);
    fetch_release(&b);
    fetch_release(&c);
    publishes_expect(&p, 1, XFER_OK);
    cr_expect_eq(xfer_tensor_abort(p.ctx, 7, XFER_OK), XFER_ERR_INVALID_PARAM,
                 "the abort status must be an error");
    producer_done(&p);
}

Test(tensor, cancel_of_a_pending_fetch_loses_no_tensor)
{
    tp_peer_t p;
    spec_t sp = spec_make(4, "k", XFER_DTYPE_FLOAT16, 2, d34, 111);
    fetch_t f;

    tp_start(&p, srv_producer, NULL);
    cr_assert(TP_POSTED(fetch_post(&p, 4, "k", 64, &f)));
    cr_assert_eq(xfer_request_wait(f.req, 200), XFER_ERR_TIMEOUT);
    cr_assert_eq(xfer_request_cancel(f.req), XFER_OK);
    cr_assert_eq(xfer_request_wait(f.req, TP_WAIT_MS), XFER_ERR_CANCELED);
    cr_expect_eq(f.calls, 1);
    cr_expect_eq(f.cb_status, XFER_ERR_CANCELED);
    fetch_release(&f);
    /* let the producer hear of the cancel, then publish: the next fetch gets it */
    tp_progress_for(p.ctx, 50);
    tp_send(&p, CMD_PROGRESS);
    tp_send(&p, 300);
    cr_assert_eq(tp_recv(&p), 1);
    publish_ok(&p, &sp);
    fetch_expect(&p, &sp);
    publishes_expect(&p, 1, XFER_OK);
    producer_done(&p);
}

#define NFETCH 1000

Test(tensor, a_thousand_fetches_in_flight_on_one_endpoint)
{
    static fetch_t f[NFETCH];
    tp_peer_t p;
    spec_t many = spec_make(3, "k", XFER_DTYPE_UINT64, 0, NULL, 5000);

    many.count = NFETCH;
    tp_start(&p, srv_producer, NULL);
    /* half the fetches wait for their publish, half find it there */
    for (int i = 0; i < NFETCH / 2; i++) {
        char key[16];
        snprintf(key, sizeof(key), "k%d", i);
        cr_assert(TP_POSTED(fetch_post(&p, 3, key, 64 * 8, &f[i])), "fetch %d", i);
    }
    publish_ok(&p, &many);
    for (int i = NFETCH / 2; i < NFETCH; i++) {
        char key[16];
        snprintf(key, sizeof(key), "k%d", i);
        cr_assert(TP_POSTED(fetch_post(&p, 3, key, 64 * 8, &f[i])), "fetch %d", i);
    }
    for (int i = NFETCH - 1; i >= 0; i--) {
        spec_t one;
        xfer_status_t s = xfer_request_wait(f[i].req, TP_WAIT_MS);

        cr_assert_eq(s, XFER_OK, "fetch %d: %s", i, xfer_status_string(s));
        spec_nth(&many, (uint32_t)i, &one);
        check_fetched(&f[i], &one);
        cr_assert_eq(f[i].calls, 1);
        fetch_release(&f[i]);
    }
    publishes_expect(&p, NFETCH, XFER_OK);
    producer_done(&p);
}

/* ---- the consumer's metadata cache (framework/tensor_meta.c) -------------------------------- */

/* What verbs keeps per key, with the real entry type's shape: a value of the caller's size. */
typedef struct meta_value {
    uint64_t size;
    uint32_t dims[4];
} meta_value_t;

Test(tensor, the_metadata_cache_keeps_the_most_recently_used_keys_up_to_its_bound)
{
    xfer_meta_cache_t *c = xfer_meta_cache_create(2, sizeof(meta_value_t));
    meta_value_t a = {100, {1, 2, 3, 4}}, b = {200, {5}}, v;

    cr_assert_not_null(c);
    cr_assert_eq(xfer_meta_cache_find(c, "a", &v), 0, "an empty cache found a key");
    xfer_meta_cache_store(c, "a", &a);
    xfer_meta_cache_store(c, "b", &b);
    cr_assert_eq(xfer_meta_cache_find(c, "a", &v), 1);     /* "a" is now the most recent */
    cr_assert(memcmp(&v, &a, sizeof(v)) == 0, "the value of a key came back changed");
    b.size = 300;
    xfer_meta_cache_store(c, "c", &b);                      /* evicts "b", the least recent */
    cr_assert_eq(xfer_meta_cache_find(c, "b", &v), 0, "the least recently used key stayed");
    cr_assert_eq(xfer_meta_cache_find(c, "a", &v), 1);
    cr_assert_eq(xfer_meta_cache_find(c, "c", &v), 1);
    cr_assert_eq(v.size, 300u);
    a.size = 7;
    xfer_meta_cache_store(c, "c", &a);                      /* a stored key takes the new value */
    cr_assert_eq(xfer_meta_cache_find(c, "c", &v), 1);
    cr_assert_eq(v.size, 7u);
    cr_assert_eq(xfer_meta_cache_find(c, "a", &v), 1, "storing a known key evicted another");
    xfer_meta_cache_destroy(c);

    c = xfer_meta_cache_create(0, sizeof(meta_value_t));   /* keeps nothing */
    cr_assert_not_null(c);
    xfer_meta_cache_store(c, "a", &a);
    cr_assert_eq(xfer_meta_cache_find(c, "a", &v), 0, "a cache of 0 keys kept one");
    xfer_meta_cache_destroy(c);
    xfer_meta_cache_destroy(NULL);
}
