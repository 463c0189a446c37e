/*
 * The contract (docs/contract.md), bounds: an endpoint whose input is paused at the bound on
 * messages nobody received yet still learns that its peer closed or went away, and what the
 * peer sent before is still received; a put, get or batch that names memory the target no
 * longer has moves nothing and fails with XFER_ERR_NOT_FOUND.
 */
#include "contract.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SMALL     400               /* one cell of the smallest shm ring the suite runs with */
#define NSMALL    12                /* more than the bound below holds, less than any of the
                                     * transports' buffers (that ring's 16 cells) */
#define BIG       (2u << 20)
#define NBIG      8
#define BOUND     "4k"

/* The bound on messages nobody received yet, for one endpoint (the framework's, so every
 * transport's). Set before the contexts are made; the children inherit it. */
static void bound_set(void)
{
    setenv("XFER_UNEXPECTED_EP", BOUND, 1);
    setenv("XFER_CLOSE_TIMEOUT", "1s", 1);
}

/* Send n messages of len bytes (tags 100 + i, each its own pattern), without waiting, then
 * close in order. */
static int srv_send_and_close(tp_side_t *s)
{
    uint64_t n, len;
    uint8_t *buf;

    TP_CHECK(tp_ctl_recv_u64(s->ctl, &n, TP_WAIT_MS) == 0, "ctl");
    TP_CHECK(tp_ctl_recv_u64(s->ctl, &len, TP_WAIT_MS) == 0, "ctl");
    buf = malloc(n * len);
    TP_CHECK(buf != NULL, "malloc");
    for (uint64_t i = 0; i < n; i++) {
        tp_fill_pattern(buf + i * len, len, 100 + i);
        TP_CHECK_STATUS(xfer_tag_send(s->ep, 100 + i, buf + i * len, len, NULL, NULL, NULL,
                                      NULL), XFER_OK);
    }
    xfer_endpoint_close(s->ep);
    s->ep = NULL;
    free(buf);
    return 0;
}

/* The peer's messages exceed the bound, not the transport's buffers, and it closes in order
 * right after: the paused endpoint reads on to the peer's end (those buffers bound what is
 * left), says XFER_ERR_PEER_CLOSED, and every message is received, whole and in order. */
Test(contract, a_paused_endpoint_sees_its_peer_close_in_order_and_keeps_what_it_sent)
{
    uint8_t *buf = malloc(SMALL);
    tp_peer_t p;

    bound_set();
    tp_start(&p, srv_send_and_close, NULL);
    tp_send(&p, NSMALL);
    tp_send(&p, SMALL);
    cr_assert_eq(ct_status_change(p.ctx, p.ep, TP_WAIT_MS), XFER_ERR_PEER_CLOSED);
    for (uint64_t i = 0; i < NSMALL; i++) {
        xfer_request_t *req = NULL;

        cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 100 + i, ~0ull, buf, SMALL, NULL, NULL,
                                          NULL, &req)));
        cr_assert_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_OK, "message %llu",
                     (unsigned long long)i);
        cr_assert_eq(tp_check_pattern(buf, SMALL, 100 + i), -1, "message %llu differs",
                     (unsigned long long)i);
        xfer_request_release(req);
    }
    free(buf);
    tp_child_expect_ok(&p, 30);
    xfer_endpoint_close(p.ep);
    xfer_context_destroy(p.ctx);
}

/* The peer sends more than this side's transport buffers hold (16 MiB of large messages),
 * so its close cannot deliver it all and ends after its timeout: the paused endpoint still
 * learns that its peer is gone, within that timeout and a bound. */
Test(contract, a_paused_endpoint_sees_its_peer_go_away)
{
    double t0;
    xfer_status_t st;
    tp_peer_t p;

    bound_set();
    tp_start(&p, srv_send_and_close, NULL);
    tp_send(&p, NBIG);
    tp_send(&p, BIG);
    t0 = tp_now_ms();
    st = ct_status_change(p.ctx, p.ep, TP_WAIT_MS);
    cr_assert_neq(st, XFER_OK, "the endpoint never learnt that its peer went away");
    cr_expect_lt(tp_now_ms() - t0, 6000.0 * tp_slowdown(), "it took %.0f ms",
                 tp_now_ms() - t0);
    tp_child_expect_ok(&p, 30);
    xfer_endpoint_close(p.ep);
    xfer_context_destroy(p.ctx);
}

/* ---- requests for memory the target deregistered (C28) ------------------------------------- */

/* A request refused because the target's region is gone (C28): XFER_ERR_NOT_FOUND - or, where
 * the refusal ends the connection (verbs, gdr), XFER_ERR_CONNECTION when the peer's side of it
 * ended first; the endpoint has failed then. */
static int refused_not_found(xfer_status_t st, xfer_endpoint_t *ep)
{
    return (st == XFER_ERR_NOT_FOUND) ||
           ((st == XFER_ERR_CONNECTION) && (xfer_endpoint_status(ep) != XFER_OK));
}

/* Start a target child running srv, which offers a region (ct_offer); its key unpacked here,
 * and len bytes at buf registered here. */
static void dereg_test_start(tp_peer_t *p, tp_scenario_t srv, void *buf, size_t len,
                             xfer_rkey_t **rkey_p, xfer_mem_t **mem_p)
{
    size_t blob_len;
    void *blob;

    tp_start(p, srv, NULL);
    blob = tp_recv_blob(p, &blob_len);
    cr_assert_eq(xfer_rkey_unpack(p->ep, blob, blob_len, rkey_p), XFER_OK);
    free(blob);
    cr_assert_eq(xfer_mem_register(p->ctx, buf, len, XFER_MEM_HOST, mem_p), XFER_OK);
}

/* The end of a test against a target child: it passed, and what this side made is gone. */
static void dereg_test_end(tp_peer_t *p, xfer_batch_t *b, xfer_rkey_t *rkey, xfer_mem_t *mem)
{
    tp_child_expect_ok(p, 30);
    if (b != NULL) {
        xfer_batch_destroy(b);
    }
    xfer_rkey_destroy(rkey);
    cr_expect_eq(xfer_mem_deregister(mem), XFER_OK);
    xfer_endpoint_close(p->ep);
    xfer_context_destroy(p->ctx);
}

#define DEREG_LEN   (64u << 10)
#define DEREG_IO    4096u
#define DEREG_SEED  7

/* A target: offer a registered region (pattern DEREG_SEED), deregister it when the parent
 * says, serve the parent's requests until it says it is done, then check that the region was
 * not touched and that no notification came. */
static int srv_deregister(tp_side_t *s)
{
    static uint8_t region[DEREG_LEN];
    uint8_t note[64];
    size_t note_len;
    xfer_mem_t *mem;
    uint64_t v;

    tp_fill_pattern(region, sizeof(region), DEREG_SEED);
    mem = ct_offer(s, region, sizeof(region));
    (void)tp_progress_until_ctl(s, TP_WAIT_MS);     /* the parent's first get */
    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
    TP_CHECK_STATUS(xfer_mem_deregister(mem), XFER_OK);
    TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
    (void)tp_progress_until_ctl(s, TP_WAIT_MS);
    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
    TP_CHECK(tp_check_pattern(region, sizeof(region), DEREG_SEED) == -1,
             "a byte of the deregistered region changed");
    TP_CHECK(xfer_notify_poll(s->ep, note, sizeof(note), &note_len) != XFER_OK,
             "a batch into the deregistered region delivered its notification");
    return 0;
}

/* The target deregisters a region whose key this side holds, then this side puts into it,
 * gets from it and posts a batch with a notification into it: each fails with
 * XFER_ERR_NOT_FOUND (a put that completed when sent: the flush after it), the batch with
 * nothing landed, and the target's memory is untouched, its notification not delivered.
 * Whether the endpoint stays up is the transport's (docs/contract.md, C28): XFER_OK or the
 * same status. */
Test(contract, requests_for_deregistered_memory_fail_not_found_and_move_nothing)
{
    static uint8_t local[DEREG_IO];
    xfer_batch_desc_t d = {0, 0, DEREG_IO};
    xfer_request_t *req = NULL;
    xfer_status_t put, flush, get, batch, ep_st;
    xfer_batch_t *b = NULL;
    xfer_rkey_t *rkey;
    xfer_mem_t *mem;
    uint8_t note[16] = "deregistered";
    tp_peer_t p;

    dereg_test_start(&p, srv_deregister, local, sizeof(local), &rkey, &mem);
    /* the key works while the region is there */
    get = xfer_get(p.ep, local, DEREG_IO, mem, xfer_rkey_address(rkey), rkey, NULL, NULL, &req);
    cr_assert_eq(tp_op_result(get, req, TP_WAIT_MS), XFER_OK);
    cr_assert_eq(tp_check_pattern(local, DEREG_IO, DEREG_SEED), -1);
    cr_assert_eq(xfer_batch_create(p.ep, XFER_BATCH_PUT, mem, rkey, &d, 1, &b), XFER_OK);
    tp_send(&p, 1);
    cr_assert_eq(tp_recv(&p), 1, "the target deregistered its region");

    tp_fill_pattern(local, sizeof(local), DEREG_SEED + 1);
    put   = ct_put(p.ep, local, DEREG_IO, mem, xfer_rkey_address(rkey), rkey);
    flush = tp_flush(p.ep, TP_WAIT_MS);
    cr_expect(refused_not_found(put, p.ep) || ((put == XFER_OK) && refused_not_found(flush, p.ep)),
              "a put into deregistered memory: %s, the flush after it: %s",
              xfer_status_string(put), xfer_status_string(flush));
    req = NULL;
    get = xfer_get(p.ep, local, DEREG_IO, mem, xfer_rkey_address(rkey), rkey, NULL, NULL, &req);
    get = tp_op_result(get, req, TP_WAIT_MS);
    cr_expect(refused_not_found(get, p.ep), "a get from deregistered memory: %s",
                 xfer_status_string(get));
    req   = NULL;
    batch = xfer_batch_post(b, note, sizeof(note), XFER_BATCH_NO_TIMEOUT, NULL, NULL, &req);
    if (batch == XFER_OK) {
        batch = xfer_request_wait(req, TP_WAIT_MS);
        cr_expect_eq(xfer_request_landed(req), 0, "descriptors said to have landed");
        xfer_request_release(req);
    }
    cr_expect(refused_not_found(batch, p.ep), "a batch into deregistered memory: %s",
              xfer_status_string(batch));
    ep_st = xfer_endpoint_status(p.ep);
    cr_expect((ep_st == XFER_OK) || refused_not_found(ep_st, p.ep), "the endpoint: %s",
              xfer_status_string(ep_st));
    tp_send(&p, 1);
    dereg_test_end(&p, b, rkey, mem);
}

#define MOVING_BLOCK (4u << 20)
#define MOVING_DESCS 16u
#define MOVING_LEN   (MOVING_DESCS * MOVING_BLOCK)
#define MOVING_BYTE  0x5a
#define REUSED_BYTE  0xa5

/* The batch of the tests below: MOVING_DESCS blocks, each at the same offset on both sides. */
static void moving_descs(xfer_batch_desc_t *d)
{
    for (unsigned i = 0; i < MOVING_DESCS; i++) {
        d[i] = (xfer_batch_desc_t){(uint64_t)i * MOVING_BLOCK, (uint64_t)i * MOVING_BLOCK,
                                   MOVING_BLOCK};
    }
}

/* A target: offer a region, and once the parent's batch into it has begun to land (a block's
 * first byte changed), deregister it and reuse the memory (every byte REUSED_BYTE); when the
 * parent's batch is over, report how many bytes changed after the deregistration and whether
 * the batch's notification came. */
static int srv_deregister_while_moving(tp_side_t *s)
{
    uint8_t *region = calloc(1, MOVING_LEN);
    uint64_t changed = 0, v;
    uint8_t note[64];
    size_t note_len;
    xfer_mem_t *mem;
    int landing = 0;
    double end;

    TP_CHECK(region != NULL, "calloc");
    mem = ct_offer(s, region, MOVING_LEN);
    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
    for (end = tp_now_ms() + TP_WAIT_MS; !landing && (tp_now_ms() < end);) {
        xfer_progress(s->ctx);
        for (unsigned i = 0; i < MOVING_DESCS; i++) {
            landing |= (__atomic_load_n(&region[(size_t)i * MOVING_BLOCK], __ATOMIC_RELAXED) ==
                        MOVING_BYTE);
        }
    }
    TP_CHECK(landing, "the batch never began to land");
    TP_CHECK_STATUS(xfer_mem_deregister(mem), XFER_OK);
    memset(region, REUSED_BYTE, MOVING_LEN);
    (void)tp_progress_until_ctl(s, TP_WAIT_MS);
    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
    tp_progress_for(s->ctx, 100);
    for (size_t i = 0; i < MOVING_LEN; i++) {
        changed += (region[i] != REUSED_BYTE);
    }
    TP_CHECK(tp_ctl_send_u64(s->ctl, changed) == 0, "ctl");
    TP_CHECK(tp_ctl_send_u64(s->ctl, xfer_notify_poll(s->ep, note, sizeof(note), &note_len) ==
                                     XFER_OK) == 0, "ctl");
    free(region);
    return 0;
}

/* The target deregisters a region while this side's batch of 64 MiB (batch) or put of as
 * much is landing in it, and reuses the memory: not a byte lands there after
 * xfer_mem_deregister() returned; the transfer completes XFER_OK (it was all in first) or
 * fails XFER_ERR_NOT_FOUND (a put that completed when sent: its flush), and a batch's
 * notification comes only with XFER_OK. */
static void deregister_while_moving(int batch)
{
    xfer_batch_desc_t d[MOVING_DESCS];
    xfer_request_t *req = NULL;
    uint8_t note[16] = "moving";
    uint8_t *src = malloc(MOVING_LEN);
    uint64_t changed, notified;
    xfer_status_t st, flush = XFER_OK;
    xfer_batch_t *b = NULL;
    xfer_rkey_t *rkey;
    xfer_mem_t *mem;
    tp_peer_t p;

    cr_assert_not_null(src);
    memset(src, MOVING_BYTE, MOVING_LEN);
    moving_descs(d);
    dereg_test_start(&p, srv_deregister_while_moving, src, MOVING_LEN, &rkey, &mem);
    if (batch) {
        cr_assert_eq(xfer_batch_create(p.ep, XFER_BATCH_PUT, mem, rkey, d, MOVING_DESCS, &b),
                     XFER_OK);
        cr_assert_eq(xfer_batch_post(b, note, sizeof(note), XFER_BATCH_NO_TIMEOUT, NULL, NULL,
                                     &req), XFER_OK);
    } else {
        cr_assert(TP_POSTED(xfer_put(p.ep, src, MOVING_LEN, mem, xfer_rkey_address(rkey), rkey,
                                     NULL, NULL, &req)));
    }
    tp_send(&p, 1);
    st = xfer_request_wait(req, TP_WAIT_MS);
    xfer_request_release(req);
    if (!batch && (st == XFER_OK)) {
        flush = tp_flush(p.ep, TP_WAIT_MS);
    }
    tp_send(&p, 1);
    changed  = tp_recv(&p);
    notified = tp_recv(&p);
    cr_expect_eq(changed, 0, "%llu bytes landed after the region was deregistered",
                 (unsigned long long)changed);
    cr_expect(((st == XFER_OK) && ((flush == XFER_OK) || refused_not_found(flush, p.ep))) ||
              refused_not_found(st, p.ep), "the %s: %s, the flush after it: %s",
              batch ? "batch" : "put", xfer_status_string(st), xfer_status_string(flush));
    cr_expect_eq(notified, batch && (st == XFER_OK), "notified: %llu, the %s: %s",
                 (unsigned long long)notified, batch ? "batch" : "put",
                 xfer_status_string(st));
    dereg_test_end(&p, b, rkey, mem);
    free(src);
}

Test(contract, a_region_deregistered_while_a_batch_lands_receives_nothing_more)
{
    deregister_while_moving(1);
}

Test(contract, a_region_deregistered_while_a_put_lands_receives_nothing_more)
{
    deregister_while_moving(0);
}

/* A target: offer a region of MOVING_BYTE, deregister it when the parent says and reuse the
 * memory at once (every byte REUSED_BYTE), say so, and serve until the parent is done. */
static int srv_deregister_while_read(tp_side_t *s)
{
    uint8_t *region = malloc(MOVING_LEN);
    xfer_mem_t *mem;
    uint64_t v;

    TP_CHECK(region != NULL, "malloc");
    memset(region, MOVING_BYTE, MOVING_LEN);
    mem = ct_offer(s, region, MOVING_LEN);
    (void)tp_progress_until_ctl(s, TP_WAIT_MS);
    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
    TP_CHECK_STATUS(xfer_mem_deregister(mem), XFER_OK);
    memset(region, REUSED_BYTE, MOVING_LEN);
    TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
    (void)tp_progress_until_ctl(s, TP_WAIT_MS);
    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
    free(region);
    return 0;
}

/* The target deregisters a region while this side's get batch of 64 MiB reads it, and reuses
 * the memory: nothing read after the deregistration reaches this side (no byte of the reused
 * memory arrives); the batch completes XFER_OK (all read first) or fails XFER_ERR_NOT_FOUND. */
Test(contract, a_region_deregistered_while_a_batch_reads_it_gives_nothing_more)
{
    xfer_batch_desc_t d[MOVING_DESCS];
    xfer_request_t *req = NULL;
    uint8_t *dst = calloc(1, MOVING_LEN);
    uint64_t reused = 0;
    xfer_batch_t *b = NULL;
    xfer_rkey_t *rkey;
    xfer_status_t st;
    xfer_mem_t *mem;
    int reading = 0;
    tp_peer_t p;

    cr_assert_not_null(dst);
    moving_descs(d);
    dereg_test_start(&p, srv_deregister_while_read, dst, MOVING_LEN, &rkey, &mem);
    cr_assert_eq(xfer_batch_create(p.ep, XFER_BATCH_GET, mem, rkey, d, MOVING_DESCS, &b),
                 XFER_OK);
    cr_assert_eq(xfer_batch_post(b, NULL, 0, XFER_BATCH_NO_TIMEOUT, NULL, NULL, &req),
                 XFER_OK);
    for (double end = tp_now_ms() + TP_WAIT_MS; !reading && (tp_now_ms() < end);) {
        xfer_progress(p.ctx);
        for (unsigned i = 0; i < MOVING_DESCS; i++) {
            reading |= (__atomic_load_n(&dst[(size_t)i * MOVING_BLOCK], __ATOMIC_RELAXED) ==
                        MOVING_BYTE);
        }
    }
    cr_assert(reading, "the batch never began to read");
    tp_send(&p, 1);
    st = xfer_request_wait(req, TP_WAIT_MS);
    xfer_request_release(req);
    cr_assert_eq(tp_recv(&p), 1, "the target deregistered its region");
    for (size_t i = 0; i < MOVING_LEN; i++) {
        reused += (dst[i] == REUSED_BYTE);
    }
    cr_expect_eq(reused, 0, "%llu bytes read after the region was deregistered",
                 (unsigned long long)reused);
    cr_expect((st == XFER_OK) || refused_not_found(st, p.ep), "the get batch: %s",
              xfer_status_string(st));
    tp_send(&p, 1);
    dereg_test_end(&p, b, rkey, mem);
    free(dst);
}
