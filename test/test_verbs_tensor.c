/*
 * The verbs tensor protocol's own cases (the seeds' TENSOR_REQUEST / META_DATA_UPDATE /
 * TENSOR_RE_REQUEST / ERROR_STATUS and the write with immediate), in the Soft-RoCE guest. The
 * message counts are read from the endpoints' counters, on both sides: a first fetch takes
 * three control messages, the steady state exactly one message and one write.
 *
 * The MR cache, read from the same counters: a fetch destination used again is a hit, one
 * unmapped and mapped again at the same address a miss; with XFER_VERBS_MR_CACHE=off (and
 * under a memory checker, where the cache is off too) every fetch registers.
 *
 * Corrupted messages: RC's CRCs stop corruption on the wire, so the damage is done on
 * purpose by the sender just before posting (XFER_VERBS_TEST_CORRUPT, set in the consumer's
 * environment only after the producer child was forked) - a test double for a fault that
 * cannot be produced for real; the receiving side under test is the real one.
 */
#include "tensor_peer.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static void setup(void)
{
    tp_env();
    unsetenv("XFER_VERBS_TEST_CORRUPT");
}

TestSuite(verbs_tensor, .init = setup, .timeout = 120);

#define NC 128

/* The consumer's message and write counts, as deltas between two snapshots. */
typedef struct counts {
    uint64_t req, meta, rereq, err_in, err_out, writes, write_bytes, hits, misses;
} counts_t;

static counts_t counts_now(xfer_endpoint_t *ep)
{
    xfer_counter_t c[NC];
    size_t n = ep_counters(ep, c, NC);
    counts_t k;

    k.req         = counter_of(c, n, "tx_TENSOR_REQUEST");
    k.meta        = counter_of(c, n, "rx_META_DATA_UPDATE");
    k.rereq       = counter_of(c, n, "tx_TENSOR_RE_REQUEST");
    k.err_in      = counter_of(c, n, "rx_ERROR_STATUS");
    k.err_out     = counter_of(c, n, "tx_ERROR_STATUS");
    k.writes      = counter_of(c, n, "rx_tensor_writes");
    k.write_bytes = counter_of(c, n, "rx_tensor_write_bytes");
    k.hits        = counter_of(c, n, "meta_cache_hits");
    k.misses      = counter_of(c, n, "meta_cache_misses");
    return k;
}

static counts_t counts_delta(const counts_t *a, const counts_t *b)
{
    counts_t d = {b->req - a->req, b->meta - a->meta, b->rereq - a->rereq,
                  b->err_in - a->err_in, b->err_out - a->err_out, b->writes - a->writes,
                  b->write_bytes - a->write_bytes, b->hits - a->hits, b->misses - a->misses};
    return d;
}

/* Publish sp (or not: the fetch goes first when fetch_first), fetch it into a buffer of
 * cap bytes, check it, and return the consumer's message counts for that one fetch. */
static counts_t fetch_counted(tp_peer_t *p, const spec_t *sp, size_t cap, int fetch_first)
{
    counts_t before = counts_now(p->ep), after;
    fetch_t f;
    xfer_status_t s;

    if (!fetch_first) {
        publish_ok(p, sp);
    }
    cr_assert(TP_POSTED(fetch_post(p, sp->step, sp->key, cap, &f)));
    if (fetch_first) {
        cr_assert_eq(xfer_request_wait(f.req, 100), XFER_ERR_TIMEOUT, "nothing published yet");
        publish_ok(p, sp);
    }
    s = xfer_request_wait(f.req, TP_WAIT_MS);
    cr_assert_eq(s, XFER_OK, "fetch (%llu, %s): %s", (unsigned long long)sp->step, sp->key,
                 xfer_status_string(s));
    check_fetched(&f, sp);
    fetch_release(&f);
    after = counts_now(p->ep);
    return counts_delta(&before, &after);
}

static void expect_first(const counts_t *d, const char *what)
{
    cr_expect_eq(d->req, 1, "%s: %llu TENSOR_REQUESTs", what, (unsigned long long)d->req);
    cr_expect_eq(d->meta, 1, "%s: %llu META_DATA_UPDATEs", what, (unsigned long long)d->meta);
    cr_expect_eq(d->rereq, 1, "%s: %llu RE_REQUESTs", what, (unsigned long long)d->rereq);
    cr_expect_eq(d->writes, 1, "%s: %llu writes", what, (unsigned long long)d->writes);
}

static void expect_steady(const counts_t *d, const char *what)
{
    cr_expect_eq(d->req, 1, "%s: %llu TENSOR_REQUESTs", what, (unsigned long long)d->req);
    cr_expect_eq(d->meta, 0, "%s: %llu META_DATA_UPDATEs", what, (unsigned long long)d->meta);
    cr_expect_eq(d->rereq, 0, "%s: %llu RE_REQUESTs", what, (unsigned long long)d->rereq);
    cr_expect_eq(d->err_in + d->err_out, 0, "%s: error messages", what);
    cr_expect_eq(d->writes, 1, "%s: %llu writes", what, (unsigned long long)d->writes);
    cr_expect_eq(d->hits, 1, "%s: the metadata came from the cache", what);
}

static const int64_t d34[] = {3, 4};
static const int64_t d43[] = {4, 3};
static const int64_t d256[] = {256, 256};

Test(verbs_tensor, first_fetch_takes_three_control_messages_then_one)
{
    tp_peer_t p;
    spec_t sp = spec_make(1, "w", XFER_DTYPE_FLOAT32, 2, d256, 11);
    counts_t d;
    xfer_counter_t c[NC];
    size_t n;

    tp_start(&p, srv_producer, NULL);
    d = fetch_counted(&p, &sp, sp.t.size, 0);
    expect_first(&d, "first fetch");
    cr_expect_eq(d.misses, 1);
    cr_expect_eq(d.write_bytes, sp.t.size, "the write carried the tensor");
    for (uint64_t step = 2; step < 12; step++) {
        sp.step = step;
        sp.seed = 100 + step;
        d = fetch_counted(&p, &sp, sp.t.size, step & 1);
        expect_steady(&d, "steady state");
        cr_expect_eq(d.write_bytes, sp.t.size);
    }
    /* the producer's side of the same: 11 requests in, 1 META_DATA_UPDATE, 11 writes out */
    n = producer_counters(&p, c, NC);
    cr_expect_eq(counter_of(c, n, "rx_TENSOR_REQUEST"), 11);
    cr_expect_eq(counter_of(c, n, "tx_META_DATA_UPDATE"), 1);
    cr_expect_eq(counter_of(c, n, "rx_TENSOR_RE_REQUEST"), 1);
    cr_expect_eq(counter_of(c, n, "tx_tensor_writes"), 11);
    cr_expect_eq(counter_of(c, n, "tx_tensor_write_bytes"), 11 * sp.t.size);
    cr_expect_eq(counter_of(c, n, "rejected"), 0);
    publishes_expect(&p, 11, XFER_OK);
    producer_done(&p);
}

Test(verbs_tensor, shape_change_takes_the_update_round_once)
{
    tp_peer_t p;
    spec_t a = spec_make(1, "s", XFER_DTYPE_INT16, 2, d34, 21);
    spec_t b = spec_make(3, "s", XFER_DTYPE_INT16, 2, d43, 22);   /* same size, other shape */
    counts_t d;

    tp_start(&p, srv_producer, NULL);
    d = fetch_counted(&p, &a, 64, 0);
    expect_first(&d, "first");
    a.step = 2;
    d = fetch_counted(&p, &a, 64, 0);
    expect_steady(&d, "same shape");
    d = fetch_counted(&p, &b, 64, 0);
    expect_first(&d, "new shape");
    b.step = 4;
    d = fetch_counted(&p, &b, 64, 1);
    expect_steady(&d, "new shape again");
    publishes_expect(&p, 4, XFER_OK);
    producer_done(&p);
}

Test(verbs_tensor, dtype_change_of_the_same_size_is_an_update)
{
    tp_peer_t p;
    spec_t a = spec_make(1, "t", XFER_DTYPE_FLOAT32, 2, d34, 31);
    spec_t b = spec_make(2, "t", XFER_DTYPE_INT32, 2, d34, 32);
    counts_t d;

    tp_start(&p, srv_producer, NULL);
    d = fetch_counted(&p, &a, 48, 0);
    expect_first(&d, "float32");
    d = fetch_counted(&p, &b, 48, 0);
    expect_first(&d, "int32 of the same bytes");
    b.step = 3;
    d = fetch_counted(&p, &b, 48, 0);
    expect_steady(&d, "int32 again");
    publishes_expect(&p, 3, XFER_OK);
    producer_done(&p);
}

Test(verbs_tensor, variable_size_tensors)
{
    static const uint64_t sizes[] = {5, 5, 4096, 1, 0, 0, 70000, 70000};
    tp_peer_t p;

    tp_start(&p, srv_producer, NULL);
    for (unsigned i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        int64_t dim = (int64_t)sizes[i];
        spec_t sp   = spec_make(i + 1, "bytes", XFER_DTYPE_BYTES, 1, &dim, 40 + i);
        counts_t d;

        sp.t.size = sizes[i];
        d = fetch_counted(&p, &sp, 70000, i & 1);
        if ((i > 0) && (sizes[i] == sizes[i - 1])) {
            expect_steady(&d, "same size again");
        } else {
            expect_first(&d, "a new size");
        }
        cr_expect_eq(d.write_bytes, sizes[i]);
    }
    publishes_expect(&p, 8, XFER_OK);
    producer_done(&p);
}

Test(verbs_tensor, dead_tensor_is_a_zero_byte_write)
{
    tp_peer_t p;
    spec_t sp = spec_make(1, "dead", XFER_DTYPE_FLOAT64, 2, d34, 51);
    counts_t d;

    sp.t.is_dead = 1;
    sp.t.size    = 0;
    tp_start(&p, srv_producer, NULL);
    d = fetch_counted(&p, &sp, 16, 0);
    expect_first(&d, "dead, first");
    cr_expect_eq(d.write_bytes, 0);
    sp.step = 2;
    d = fetch_counted(&p, &sp, 0, 1);
    expect_steady(&d, "dead again, into no buffer at all");
    cr_expect_eq(d.write_bytes, 0);
    publishes_expect(&p, 2, XFER_OK);
    producer_done(&p);
}

Test(verbs_tensor, request_before_and_after_publish_and_a_duplicate_publish)
{
    tp_peer_t p;
    spec_t sp = spec_make(1, "o", XFER_DTYPE_UINT8, 2, d256, 61);
    counts_t d;

    tp_start(&p, srv_producer, NULL);
    d = fetch_counted(&p, &sp, sp.t.size, 1);      /* request before publish */
    expect_first(&d, "request first");
    sp.step = 2;
    d = fetch_counted(&p, &sp, sp.t.size, 0);      /* publish before request */
    expect_steady(&d, "publish first");
    sp.step = 3;
    publish_ok(&p, &sp);
    cr_expect_eq(publish(&p, &sp), XFER_ERR_EXISTS, "a second publish of a pending key");
    fetch_expect(&p, &sp);
    {
        /* one publish satisfies one fetch: the next waits, until it is cancelled - with a
         * destination the producer knows, so only the producer's answer completes it */
        fetch_t f;

        cr_assert(TP_POSTED(fetch_post(&p, 3, "o", sp.t.size, &f)));
        cr_expect_eq(xfer_request_wait(f.req, 200), XFER_ERR_TIMEOUT);
        cr_assert_eq(xfer_request_cancel(f.req), XFER_OK);
        cr_expect_eq(xfer_request_wait(f.req, TP_WAIT_MS), XFER_ERR_CANCELED);
        cr_expect_eq(f.calls, 1);
        fetch_release(&f);
    }
    publishes_expect(&p, 3, XFER_OK);
    producer_done(&p);
}

Test(verbs_tensor, buffer_too_small_after_a_change_is_truncated_and_withdrawn)
{
    tp_peer_t p;
    spec_t small = spec_make(1, "g", XFER_DTYPE_UINT8, 2, d34, 71);
    spec_t big   = spec_make(2, "g", XFER_DTYPE_UINT8, 2, d256, 72);
    xfer_counter_t c[NC];
    size_t n;

    tp_start(&p, srv_producer, NULL);
    fetch_counted(&p, &small, 64, 0);
    publish_ok(&p, &big);
    cr_expect_eq(fetch_status(&p, 2, "g", 64), XFER_ERR_TRUNCATED);
    /* the fetch completed at once (nothing was to be written); let the withdrawal land */
    tp_send(&p, CMD_PROGRESS);
    tp_send(&p, 200);
    cr_assert_eq(tp_recv(&p), 1);
    n = producer_counters(&p, c, NC);
    cr_expect_eq(counter_of(c, n, "rx_ERROR_STATUS"), 1, "the consumer withdrew its request");
    cr_expect_eq(counter_of(c, n, "tx_tensor_writes"), 1, "nothing was written for it");
    small.step = 3;
    fetch_counted(&p, &small, 64, 0);   /* the channel goes on */
    {
        int64_t res[4];

        cr_assert_eq(publishes_wait(&p, res, 4), 3);
        cr_expect_eq(res[0], XFER_OK);
        cr_expect_eq(res[1], XFER_ERR_TRUNCATED, "the refused tensor's publish says why: %s",
                     xfer_status_string((xfer_status_t)res[1]));
        cr_expect_eq(res[2], XFER_OK);
    }
    producer_done(&p);
}

/* A source in a read-only mapping cannot be registered for RDMA: the producer copies it once
 * into a registered bounce buffer instead of posting with a key that does not cover it. */
Test(verbs_tensor, unregistrable_source_goes_through_a_bounce_buffer)
{
    tp_peer_t p;
    spec_t sp = spec_make(1, "ro", XFER_DTYPE_FLOAT32, 2, d256, 81);
    xfer_counter_t c[NC];
    size_t n;

    sp.readonly = 1;
    tp_start(&p, srv_producer, NULL);
    fetch_counted(&p, &sp, sp.t.size, 0);
    n = producer_counters(&p, c, NC);
    cr_expect_eq(counter_of(c, n, "bounced"), 1);
    cr_expect_geq(counter_of(c, n, "mr_cache_misses"), 1);
    publishes_expect(&p, 1, XFER_OK);
    producer_done(&p);
}

/* ---- aborts, many fetches, failures ---------------------------------------------------------- */

Test(verbs_tensor, abort_cancels_pending_fetches_on_both_sides)
{
    tp_peer_t p;
    fetch_t f[6];
    spec_t later = spec_make(9, "x", XFER_DTYPE_UINT8, 2, d34, 91);
    xfer_counter_t c[NC];
    size_t n;

    tp_start(&p, srv_producer, NULL);
    /* warm the cache so the requests carry a destination the producer could write to */
    fetch_counted(&p, &later, 64, 0);
    for (int i = 0; i < 3; i++) {
        cr_assert(TP_POSTED(fetch_post(&p, 7, "x", 64, &f[i])));         /* consumer aborts */
        cr_assert(TP_POSTED(fetch_post(&p, 8, "x", 64, &f[3 + i])));     /* producer aborts */
    }
    cr_assert_eq(xfer_request_wait(f[0].req, 100), XFER_ERR_TIMEOUT);
    cr_assert_eq(xfer_tensor_abort(p.ctx, 7, XFER_ERR_ABORTED), XFER_OK);
    cr_assert_eq(remote_abort(&p, 8, XFER_ERR_IO), XFER_OK);
    for (int i = 0; i < 6; i++) {
        xfer_status_t s = xfer_request_wait(f[i].req, TP_WAIT_MS);

        cr_expect_eq(s, (i < 3) ? XFER_ERR_ABORTED : XFER_ERR_IO, "fetch %d: %s", i,
                     xfer_status_string(s));
        cr_expect_eq(f[i].calls, 1);
        for (size_t b = 0; b < 64; b++) {
            cr_assert_eq((uint8_t)f[i].buf[b], 0xA5, "fetch %d: its buffer was written", i);
        }
        fetch_release(&f[i]);
    }
    /* the producer withdrew the three it was waiting on and answered each */
    n = producer_counters(&p, c, NC);
    cr_expect_eq(counter_of(c, n, "rx_ERROR_STATUS"), 3);
    cr_expect_eq(counter_of(c, n, "tx_ERROR_STATUS"), 6);
    later.step = 10;
    fetch_counted(&p, &later, 64, 0);
    publishes_expect(&p, 2, XFER_OK);
    producer_done(&p);
}

#define NMANY 2000

Test(verbs_tensor, two_thousand_concurrent_fetches_on_one_channel_with_few_slots)
{
    static fetch_t f[NMANY];
    tp_peer_t p;
    tp_opts_t opts = {0};
    spec_t many = spec_make(3, "m", XFER_DTYPE_UINT64, 0, NULL, 5000);
    xfer_counter_t c[NC];
    size_t n;

    setenv("XFER_VERBS_RX_QUEUE_LEN", "16", 1);     /* both sides: credits run out often */
    many.count = NMANY;
    tp_start_opts(&p, srv_producer, NULL, &opts, 0);
    for (int i = 0; i < NMANY / 2; i++) {
        char key[16];
        snprintf(key, sizeof(key), "m%d", i);
        cr_assert(TP_POSTED(fetch_post(&p, 3, key, 64 * 8, &f[i])), "fetch %d", i);
    }
    publish_ok(&p, &many);
    for (int i = NMANY / 2; i < NMANY; i++) {
        char key[16];
        snprintf(key, sizeof(key), "m%d", i);
        cr_assert(TP_POSTED(fetch_post(&p, 3, key, 64 * 8, &f[i])), "fetch %d", i);
    }
    for (int i = 0; i < NMANY; i++) {
        spec_t one;
        xfer_status_t s = xfer_request_wait(f[i].req, TP_WAIT_MS);

        cr_assert_eq(s, XFER_OK, "fetch %d: %s", i, xfer_status_string(s));
        spec_nth(&many, (uint32_t)i, &one);
        check_fetched(&f[i], &one);
        fetch_release(&f[i]);
    }
    n = producer_counters(&p, c, NC);
    cr_expect_eq(counter_of(c, n, "tx_tensor_writes"), NMANY);
    cr_expect_gt(counter_of(c, n, "credit_stalls"), 0, "16 slots cannot take 2000 at once");
    publishes_expect(&p, NMANY, XFER_OK);
    producer_done(&p);
    unsetenv("XFER_VERBS_RX_QUEUE_LEN");
}

/* A producer child, and this side connected to it with spec in XFER_VERBS_TEST_CORRUPT (this
 * side only: the child is forked before); sp published there. */
static void corrupt_start(tp_peer_t *p, const char *spec, const spec_t *sp)
{
    tp_server_spawn(p, srv_producer, NULL, NULL);
    setenv("XFER_VERBS_TEST_CORRUPT", spec, 1);
    /* a channel the damage fails at the producer is closed to this side at once: with 8 s
     * a retry here, waiting for this side's RC retries to run out would take a minute, far
     * past the bounds of the tests */
    setenv("XFER_VERBS_TIMEOUT", "8s", 1);
    p->ctx = tp_context(0);
    p->ep  = tp_connect(p->ctx, p);
    unsetenv("XFER_VERBS_TEST_CORRUPT");
    publish_ok(p, sp);
}

/* A damaged message: refused with an ERROR_STATUS back to its sender (which fails the one
 * request it named) or with a channel error - never a crash, never a misapplied answer. */
static void corrupt_case(const char *spec, xfer_status_t want, int channel_survives)
{
    tp_peer_t p;
    spec_t sp = spec_make(1, "c", XFER_DTYPE_INT8, 2, d34, 101);
    xfer_status_t s;
    double t0;

    corrupt_start(&p, spec, &sp);
    t0 = tp_now_ms();
    s  = fetch_status(&p, 1, "c", 64);
    if (channel_survives) {
        cr_expect_eq(s, want, "%s: the fetch ended with %s, expected %s", spec,
                     xfer_status_string(s), xfer_status_string(want));
    } else {
        cr_expect(s < 0, "%s: the fetch ended with %s", spec, xfer_status_string(s));
        cr_expect_lt(tp_now_ms() - t0, 15000.0, "%s: the producer's failed channel was not "
                     "closed to this side: found only when the RC retries ran out", spec);
    }
    if (channel_survives) {
        sp.step = 2;
        publish_ok(&p, &sp);
        fetch_expect(&p, &sp);
        sp.step = 1;
        fetch_expect(&p, &sp);  /* the tensor of the refused request is still there */
        producer_done(&p);
    } else {
        cr_expect_eq(xfer_endpoint_status(p.ep), XFER_ERR_CONNECTION, "%s: the channel "
                     "ended with %s", spec, xfer_status_string(xfer_endpoint_status(p.ep)));
        tp_send(&p, CMD_DONE);
        tp_finish(&p);
    }
}

Test(verbs_tensor, request_of_an_unknown_type_is_refused_with_error_status)
{
    corrupt_case("TENSOR_REQUEST:type", XFER_ERR_UNSUPPORTED, 1);
}

Test(verbs_tensor, request_of_another_wire_version_is_refused_with_error_status)
{
    corrupt_case("TENSOR_REQUEST:version", XFER_ERR_UNSUPPORTED, 1);
}

Test(verbs_tensor, request_with_a_lying_key_length_is_refused_with_error_status)
{
    corrupt_case("TENSOR_REQUEST:field", XFER_ERR_PROTOCOL, 1);
}

/* A first request for a 1-byte key is the shortest there is (no metadata expected): a byte
 * less is below any request, which the header check takes for a lying peer */
Test(verbs_tensor, short_request_fails_the_channel)
{
    corrupt_case("TENSOR_REQUEST:short", XFER_OK, 0);
}

/* A 40-byte header that claims a byte which did not arrive */
Test(verbs_tensor, short_re_request_fails_the_channel)
{
    corrupt_case("TENSOR_RE_REQUEST:short", XFER_OK, 0);
}

/* The peer's word that it took our BYE, from a peer to which we sent none (a lying peer's
 * byte on the bootstrap connection, beside a TENSOR_REQUEST): the producer fails the channel
 * as a protocol error and closes it, which this side sees at once - it neither takes the byte
 * for an orderly close nor waits for its RC retries to run out. */
Test(verbs_tensor, a_bye_taken_byte_without_a_bye_fails_the_channel)
{
    tp_peer_t p;
    spec_t sp = spec_make(1, "c", XFER_DTYPE_INT8, 2, d34, 101);
    xfer_status_t s, ep_st;
    double t0;

    corrupt_start(&p, "TENSOR_REQUEST:bye_taken", &sp);
    t0 = tp_now_ms();
    s  = fetch_status(&p, 1, "c", 64);     /* answered or not: the byte may be read first */
    while (((ep_st = xfer_endpoint_status(p.ep)) == XFER_OK) && (tp_now_ms() - t0 < 15000.0)) {
        xfer_progress(p.ctx);
    }
    cr_expect_eq(ep_st, XFER_ERR_CONNECTION, "the endpoint: %s (the fetch: %s)",
                 xfer_status_string(ep_st), xfer_status_string(s));
    cr_expect_lt(tp_now_ms() - t0, 15000.0, "the producer's failed channel was not closed "
                 "to this side");
    tp_send(&p, CMD_DONE);
    tp_finish(&p);
}

Test(verbs_tensor, peer_killed_mid_fetch)
{
    static const int64_t big[] = {64 << 20};
    tp_peer_t p;
    spec_t sp = spec_make(1, "k", XFER_DTYPE_UINT8, 1, big, 111);
    fetch_t waiting, moving;
    xfer_status_t s;
    double t0;

    tp_start(&p, srv_producer, NULL);
    cr_assert(TP_POSTED(fetch_post(&p, 2, "never", 64, &waiting)));
    publish_ok(&p, &sp);
    cr_assert(TP_POSTED(fetch_post(&p, 1, "k", (size_t)sp.t.size, &moving)));
    usleep(20000);
    kill(p.pid, SIGKILL);
    t0 = tp_now_ms();
    s = xfer_request_wait(waiting.req, TP_WAIT_MS);
    cr_expect(s < 0 && s != XFER_ERR_TIMEOUT, "the waiting fetch: %s", xfer_status_string(s));
    s = xfer_request_wait(moving.req, TP_WAIT_MS);
    cr_expect(s == XFER_OK || (s < 0 && s != XFER_ERR_TIMEOUT), "the moving fetch: %s",
              xfer_status_string(s));
    cr_expect_lt(tp_now_ms() - t0, 10000.0, "the failure was seen in bounded time");
    fetch_release(&waiting);
    fetch_release(&moving);
    xfer_endpoint_close(p.ep);
    xfer_context_destroy(p.ctx);
    cr_expect_eq(tp_child_wait(&p, 10), 128 + SIGKILL);
}

/* ---- the MR cache and a fetch destination ------------------------------------------------- */

#define DEST_LEN (64u << 10)

/* Four fetches into one destination at a fixed address, the third after it was unmapped and
 * mapped again; want_misses[i] is the cache misses fetch i may cost. */
static void fetches_into_one_destination(const uint64_t *want_misses)
{
    static const int64_t dims[] = {DEST_LEN};
    xfer_counter_t c[NC];
    tp_peer_t p;
    char *dst = mmap(NULL, DEST_LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

    cr_assert_neq(dst, MAP_FAILED, "mmap: %s", strerror(errno));
    tp_start(&p, srv_producer, NULL);
    for (int i = 0; i < 4; i++) {
        spec_t sp = spec_make(1 + (uint64_t)i, "dest", XFER_DTYPE_UINT8, 1, dims, 60 + i);
        xfer_fetch_params_t fp = {sizeof(fp), dst, DEST_LEN, NULL, NULL, NULL};
        xfer_request_t *req = NULL;
        uint64_t hits, misses;
        size_t n;

        if (i == 2) {
            cr_assert_eq(munmap(dst, DEST_LEN), 0);
            cr_assert_eq(mmap(dst, DEST_LEN, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0),
                         (void *)dst, "no new mapping at the old address");
        }
        n      = ep_counters(p.ep, c, NC);
        hits   = counter_of(c, n, "mr_cache_hits");
        misses = counter_of(c, n, "mr_cache_misses");
        publish_ok(&p, &sp);
        cr_assert(TP_POSTED(xfer_tensor_fetch(p.ep, sp.step, sp.key, &fp, NULL, NULL, &req)));
        cr_assert_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_OK, "fetch %d", i + 1);
        xfer_request_release(req);
        cr_expect_eq(tp_check_pattern(dst, DEST_LEN, sp.seed), -1, "fetch %d: wrong data",
                     i + 1);
        n = ep_counters(p.ep, c, NC);
        cr_expect_eq(counter_of(c, n, "mr_cache_misses") - misses, want_misses[i],
                     "fetch %d: %llu cache misses, expected %llu", i + 1,
                     (unsigned long long)(counter_of(c, n, "mr_cache_misses") - misses),
                     (unsigned long long)want_misses[i]);
        cr_expect_eq(counter_of(c, n, "mr_cache_hits") - hits, 1 - want_misses[i],
                     "fetch %d: hits", i + 1);
    }
    publishes_expect(&p, 4, XFER_OK);
    producer_done(&p);
    munmap(dst, DEST_LEN);
}

Test(verbs_tensor, mr_cache_serves_a_destination_until_it_is_unmapped)
{
    static const uint64_t cached[]   = {1, 0, 1, 0};
    static const uint64_t uncached[] = {1, 1, 1, 1};

    unsetenv("XFER_VERBS_MR_CACHE");
    fetches_into_one_destination(tu_malloc_is_checkers() ? uncached : cached);
}

Test(verbs_tensor, mr_cache_off_registers_every_destination)
{
    static const uint64_t uncached[] = {1, 1, 1, 1};

    setenv("XFER_VERBS_MR_CACHE", "off", 1);
    fetches_into_one_destination(uncached);
}
