/*
 * The contract (docs/contract.md), tensors: a fetch and a publish are operations like any
 * other - they end with the endpoint (C22, C24) - and a request of a peer that went away
 * never takes a tensor published after it.
 */
#include "contract.h"

#include <criterion/criterion.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#define STEP 7
#define TLEN 4096

/* A fetch of tensor key from p's target into buf; the request in *req_p. */
static void fetch_from_target(tp_peer_t *p, uint64_t key, void *buf, xfer_request_t **req_p)
{
    xfer_fetch_params_t params = {.size = sizeof(params), .buffer = buf, .capacity = TLEN};
    char name[CT_KEY_MAX];

    cr_assert(TP_POSTED(xfer_tensor_fetch(p->ep, STEP, ct_key(name, key), &params, NULL, NULL,
                                          req_p)));
}

/* C22, C24: a fetch waiting for a tensor the producer has not published ends when the
 * producer's endpoint does: XFER_ERR_PEER_CLOSED when it closes in order, XFER_ERR_CONNECTION
 * when it dies. */
Test(contract, a_fetch_waiting_for_its_producer_ends_with_the_producer_s_endpoint)
{
    static uint8_t buf[TLEN];

    for (int dies = 0; dies < 2; dies++) {
        xfer_request_t *req = NULL;
        xfer_status_t status;
        tp_peer_t p;

        xfer_rkey_destroy(ct_start(&p));
        fetch_from_target(&p, 1, buf, &req);
        tp_progress_for(p.ctx, 50);
        cr_assert_eq(xfer_request_test(req), XFER_INPROGRESS, "nothing was published");
        if (dies) {
            cr_assert_eq(kill(p.pid, SIGKILL), 0);
            cr_assert_eq(tp_child_wait(&p, 30), 128 + SIGKILL);
        } else {
            ct_ask(&p, CT_STOP, 0, 0, 0);
        }
        status = xfer_request_wait(req, TP_WAIT_MS);
        cr_assert_eq(status, dies ? XFER_ERR_CONNECTION : XFER_ERR_PEER_CLOSED,
                     "the fetch, the producer %s: %s", dies ? "dead" : "closed in order",
                     xfer_status_string(status));
        xfer_request_release(req);
        if (!dies) {
            cr_assert_eq(ct_answer(&p), 0);
            tp_child_expect_ok(&p, 60);
        }
        xfer_endpoint_close(p.ep);
        xfer_context_destroy(p.ctx);
    }
}

/* C22, C24, C29: a peer's fetch that waits here for a tensor not yet published goes with the
 * peer's endpoint - closed in order, or dead: a publish afterwards is taken by nobody (its
 * request stays pending, and the key stays published: publishing it again is
 * XFER_ERR_EXISTS) until the step is aborted. */
Test(contract, a_request_of_a_peer_that_went_never_takes_a_later_publish)
{
    static uint8_t data[TLEN];
    const int64_t dims[1] = {TLEN};

    for (int dies = 0; dies < 2; dies++) {
        xfer_tensor_t t = {.dtype = XFER_DTYPE_UINT8, .rank = 1, .size = TLEN, .data = data};
        xfer_request_t *pub = NULL, *again = NULL;
        char name[CT_KEY_MAX];
        xfer_status_t status;
        tp_peer_t p;

        memcpy(t.dims, dims, sizeof(dims));
        xfer_rkey_destroy(ct_start(&p));
        cr_assert_eq(ct_do(&p, CT_FETCH, STEP, 2, TLEN), 0);
        tp_progress_for(p.ctx, 100);   /* the request arrives and waits here */
        if (dies) {
            cr_assert_eq(kill(p.pid, SIGKILL), 0);
            cr_assert_eq(tp_child_wait(&p, 30), 128 + SIGKILL);
        } else {
            cr_assert_eq(ct_do(&p, CT_STOP, 0, 0, 0), 0);
            tp_child_expect_ok(&p, 60);
        }
        status = ct_status_change(p.ctx, p.ep, TP_WAIT_MS);
        cr_assert_eq(status, dies ? XFER_ERR_CONNECTION : XFER_ERR_PEER_CLOSED, "%s",
                     xfer_status_string(status));
        tp_fill_pattern(data, TLEN, 2);
        cr_assert(TP_POSTED(xfer_tensor_publish(p.ctx, STEP, ct_key(name, 2), &t, 0, NULL,
                                                NULL, &pub)));
        tp_progress_for(p.ctx, 200);
        cr_assert_eq(xfer_request_test(pub), XFER_INPROGRESS, "the publish was taken by the "
                     "request of a peer that %s", dies ? "died" : "closed");
        cr_assert_eq(xfer_tensor_publish(p.ctx, STEP, name, &t, 0, NULL, NULL, &again),
                     XFER_ERR_EXISTS);
        cr_assert_null(again);
        cr_assert_eq(xfer_tensor_abort(p.ctx, STEP, XFER_ERR_CANCELED), XFER_OK);
        cr_assert_eq(xfer_request_wait(pub, TP_WAIT_MS), XFER_ERR_CANCELED);
        xfer_request_release(pub);
        xfer_endpoint_close(p.ep);
        xfer_context_destroy(p.ctx);
    }
}

/* C21, C29: the producer closes in order while the consumer's fetch of a published 8 MiB
 * tensor is on its way - at a different point each round: not yet read here, answered, its
 * data being written or read from the producer's memory. No tensor is lost and the two sides
 * agree: a tensor on its way is delivered before the close ends (fetch and publish
 * XFER_OK), a request read after the close began fails XFER_ERR_PEER_CLOSED and the tensor
 * stays published. */
Test(contract, a_producer_closing_in_order_while_its_tensor_moves_agrees_with_the_consumer)
{
    const size_t len  = 8u << 20;
    uint8_t *data     = malloc(len);
    const int rounds  = 8;

    cr_assert_not_null(data);
    ct_close_timeout_scaled();
    tp_fill_pattern(data, len, 3);
    for (int r = 0; r < rounds; r++) {
        xfer_tensor_t t = {.dtype = XFER_DTYPE_UINT8, .rank = 1, .size = len, .data = data};
        xfer_request_t *pub = NULL, *creq = NULL;
        xfer_status_t pub_status, fetch_status;
        char name[CT_KEY_MAX];
        tp_peer_t p;

        t.dims[0] = (int64_t)len;
        xfer_rkey_destroy(ct_start(&p));
        cr_assert(TP_POSTED(xfer_tensor_publish(p.ctx, STEP, ct_key(name, 3), &t, 0, NULL,
                                                NULL, &pub)));
        cr_assert_eq(ct_do(&p, CT_FETCH, STEP, 3, len), 0);
        tp_progress_for(p.ctx, r);
        cr_assert_eq(xfer_endpoint_close_nb(p.ep, 0, NULL, NULL, &creq), XFER_OK);
        p.ep = NULL;
        cr_assert_eq(xfer_request_wait(creq, TP_WAIT_MS), XFER_OK, "round %d: the close", r);
        fetch_status = (xfer_status_t)(int64_t)ct_do(&p, CT_FETCHED, 0, 0, 0);
        pub_status   = xfer_request_test(pub);
        if (fetch_status != XFER_OK) {
            cr_assert_eq(fetch_status, XFER_ERR_PEER_CLOSED, "round %d: the fetch: %s", r,
                         xfer_status_string(fetch_status));
            cr_assert_eq(pub_status, XFER_INPROGRESS, "round %d: the fetch failed, the "
                         "publish: %s", r, xfer_status_string(pub_status));
            cr_assert_eq(xfer_tensor_abort(p.ctx, STEP, XFER_ERR_CANCELED), XFER_OK);
            pub_status = xfer_request_wait(pub, TP_WAIT_MS);
            cr_assert_eq(pub_status, XFER_ERR_CANCELED);
        } else {
            cr_assert_eq(pub_status, XFER_OK, "round %d: the fetch succeeded, the publish: %s",
                         r, xfer_status_string(pub_status));
        }
        xfer_request_release(creq);
        xfer_request_release(pub);
        cr_assert_eq(ct_do(&p, CT_STOP, 0, 0, 0), 0);
        tp_child_expect_ok(&p, 60);
        xfer_context_destroy(p.ctx);
    }
    free(data);
}
