/*
 * The contract (docs/contract.md), fairness: while one peer's largest legal batch moves, the
 * process's other endpoints keep their round trips short (each peer's work moves a slice at a
 * time, XFER_FAIR_SLICE), and the batch's deadline stops the work on both sides.
 *
 * This process is the target: peer A posts XFER_BATCH_MAX_DESCS descriptors of 4 MiB each
 * (256 GiB, over the same 64 MiB of our memory) with a 2 s deadline; peer B pings us the
 * whole time and reports its round trips.
 */
#include "contract.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REGION    (64u << 20)
#define BLOCK     (4u << 20)
#define NDESC     65536u
#define DEADLINE  2000
#define PINGS_MS  3000
#define TAG_PING  0x9151ull
#define TAG_STOP  0x9152ull
#define SAMPLES   100000

/* A: the batch; reports its status and how long it took (ms). */
static int cli_batch(tp_side_t *s)
{
    xfer_batch_desc_t *d = calloc(NDESC, sizeof(*d));
    uint8_t *src         = malloc(BLOCK);
    xfer_request_t *req  = NULL;
    xfer_status_t st;
    xfer_rkey_t *rkey;
    xfer_batch_t *b;
    xfer_mem_t *mem;
    void *blob;
    size_t len;
    double t0;

    TP_CHECK((d != NULL) && (src != NULL), "malloc");
    memset(src, 7, BLOCK);
    TP_CHECK(tp_ctl_recv_alloc(s->ctl, &blob, &len, TP_WAIT_MS) == 0, "ctl");
    TP_CHECK_STATUS(xfer_rkey_unpack(s->ep, blob, len, &rkey), XFER_OK);
    free(blob);
    TP_CHECK_STATUS(xfer_mem_register(s->ctx, src, BLOCK, XFER_MEM_HOST, &mem), XFER_OK);
    for (uint32_t i = 0; i < NDESC; i++) {
        d[i] = (xfer_batch_desc_t){0, (uint64_t)(i % (REGION / BLOCK)) * BLOCK, BLOCK};
    }
    TP_CHECK_STATUS(xfer_batch_create(s->ep, XFER_BATCH_PUT, mem, rkey, d, NDESC, &b),
                    XFER_OK);
    t0 = tp_now_ms();
    TP_CHECK_STATUS(xfer_batch_post(b, "x", 1, DEADLINE, NULL, NULL, &req), XFER_OK);
    st = xfer_request_wait(req, TP_WAIT_MS);
    TP_CHECK(tp_ctl_send_u64(s->ctl, (uint64_t)(int64_t)st) == 0, "ctl");
    TP_CHECK(tp_ctl_send_u64(s->ctl, (uint64_t)(tp_now_ms() - t0)) == 0, "ctl");
    xfer_request_release(req);
    TP_CHECK_STATUS(xfer_batch_destroy(b), XFER_OK);
    xfer_rkey_destroy(rkey);
    /* what ended early may still be on its way: the flush waits for the transport */
    TP_CHECK_STATUS(tp_flush(s->ep, TP_WAIT_MS), XFER_OK);
    TP_CHECK_STATUS(xfer_mem_deregister(mem), XFER_OK);
    free(src);
    free(d);
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double*)a, y = *(const double*)b;

    return (x > y) - (x < y);
}

/* B: pings for PINGS_MS, then reports its round trips' p99 and largest (microseconds). */
static int cli_ping(tp_side_t *s)
{
    double *rtt = malloc(SAMPLES * sizeof(*rtt)), end;
    uint64_t msg = 0, n = 0, back;

    TP_CHECK(rtt != NULL, "malloc");
    end = tp_now_ms() + PINGS_MS;
    while ((tp_now_ms() < end) && (n < SAMPLES)) {
        xfer_request_t *r = NULL;
        double t0         = tp_now_ms();

        TP_CHECK(TP_POSTED(xfer_tag_recv(s->ctx, s->ep, TAG_PING, ~0ull, &back, sizeof(back),
                                         NULL, NULL, NULL, &r)), "recv");
        TP_CHECK_STATUS(ct_send(s->ep, TAG_PING, &msg, sizeof(msg)), XFER_OK);
        TP_CHECK_STATUS(xfer_request_wait(r, TP_WAIT_MS), XFER_OK);
        xfer_request_release(r);
        rtt[n++] = (tp_now_ms() - t0) * 1000.0;
        msg++;
    }
    TP_CHECK_STATUS(ct_send(s->ep, TAG_STOP, &msg, sizeof(msg)), XFER_OK);
    qsort(rtt, n, sizeof(*rtt), cmp_double);
    TP_CHECK(tp_ctl_send_u64(s->ctl, n) == 0, "ctl");
    TP_CHECK(tp_ctl_send_u64(s->ctl, (uint64_t)rtt[(n * 99) / 100]) == 0, "ctl");
    TP_CHECK(tp_ctl_send_u64(s->ctl, (uint64_t)rtt[n - 1]) == 0, "ctl");
    free(rtt);
    return 0;
}

Test(contract, one_peer_s_largest_batch_does_not_hold_another_endpoint_and_stops_at_its_deadline)
{
    static uint8_t region[REGION];
    xfer_endpoint_t *a_ep, *b_ep;
    xfer_context_t *ctx = tp_context(0);
    uint64_t st, ms, n, p99, max, got, msg;
    xfer_listener_t *l;
    xfer_request_t *r = NULL;
    xfer_mem_t *mem;
    tp_peer_t a, b;
    char addr[64];
    void *blob;
    size_t len;

    cr_assert_eq(xfer_listen(ctx, "127.0.0.1:0", &l), XFER_OK);
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", xfer_listener_port(l));
    cr_assert_eq(xfer_mem_register(ctx, region, sizeof(region), XFER_MEM_HOST, &mem), XFER_OK);
    cr_assert_eq(xfer_rkey_pack(mem, &blob, &len), XFER_OK);
    tp_client_spawn(&a, addr, cli_batch, NULL, NULL);
    cr_assert_eq(xfer_accept(l, TP_WAIT_MS, &a_ep), XFER_OK);
    tp_send_blob(&a, blob, len);
    xfer_rkey_blob_free(blob);
    tp_client_spawn(&b, addr, cli_ping, NULL, NULL);
    cr_assert_eq(xfer_accept(l, TP_WAIT_MS, &b_ep), XFER_OK);
    /* echo B's pings until it stops; A's batch moves meanwhile */
    for (;;) {
        cr_assert(TP_POSTED(xfer_tag_recv(ctx, b_ep, 0, 0, &msg, sizeof(msg), NULL, NULL, NULL,
                                          &r)));
        cr_assert_eq(xfer_request_wait(r, TP_WAIT_MS * 2), XFER_OK);
        got = xfer_request_tag(r);
        xfer_request_release(r);
        r = NULL;
        if (got == TAG_STOP) {
            break;
        }
        cr_assert_eq(xfer_tag_send(b_ep, TAG_PING, &msg, sizeof(msg), NULL, NULL, NULL, NULL),
                     XFER_OK);
    }
    n   = tp_recv(&b);
    p99 = tp_recv(&b);
    max = tp_recv(&b);
    /* A's batch ends by its deadline; what it reports waits behind our progress */
    while (!tp_ctl_ready(a.ctl, 0)) {
        xfer_progress(ctx);
    }
    st = tp_recv(&a);
    ms = tp_recv(&a);
    cr_log_info("over %s: %llu round trips while a 256 GiB batch moved, p99 %llu us, max %llu "
                "us; the batch ended with %s after %llu ms", tp_transport(),
                (unsigned long long)n, (unsigned long long)p99, (unsigned long long)max,
                xfer_status_string((xfer_status_t)(int64_t)st), (unsigned long long)ms);
    cr_expect_gt(n, 100, "the other endpoint was held: %llu round trips in %d ms",
                 (unsigned long long)n, PINGS_MS);
    cr_expect_lt(p99, 100000u * tp_slowdown(), "p99 round trip %llu us",
                 (unsigned long long)p99);
    cr_expect_eq((xfer_status_t)(int64_t)st, XFER_ERR_TIMEOUT, "the batch ended with %s",
                 xfer_status_string((xfer_status_t)(int64_t)st));
    cr_expect_lt(ms, (DEADLINE + 1000) * tp_slowdown(), "the batch ended after %llu ms",
                 (unsigned long long)ms);
    /* A flushes behind what was on its way, then closes: serve it until it has */
    cr_expect_eq(ct_status_change(ctx, a_ep, TP_WAIT_MS * 2), XFER_ERR_PEER_CLOSED);
    tp_child_expect_ok(&b, 30);
    xfer_endpoint_close(b_ep);
    xfer_endpoint_close(a_ep);
    tp_child_expect_ok(&a, 60);
    cr_assert_eq(xfer_mem_deregister(mem), XFER_OK);
    xfer_listener_close(l);
    xfer_context_destroy(ctx);
}
