/*
 * The contract (docs/contract.md), bounds: an endpoint whose input is paused at the bound on
 * messages nobody received yet still learns that its peer closed or went away, and what the
 * peer sent before is still received.
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
