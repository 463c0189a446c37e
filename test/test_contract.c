/*
 * The conformance suite's declaration and its helpers (contract.h). Its tests are in the files
 * named after the sections of docs/contract.md they prove.
 */
#include "contract.h"

#include <criterion/criterion.h>
#include <unistd.h>

static void setup(void)
{
    tp_env();
}

TestSuite(contract, .init = setup, .timeout = 240);

xfer_status_t ct_send(xfer_endpoint_t *ep, uint64_t tag, const void *buf, size_t len)
{
    xfer_request_t *req = NULL;
    xfer_status_t s     = xfer_tag_send(ep, tag, buf, len, NULL, NULL, NULL, &req);

    return tp_op_result(s, req, TP_WAIT_MS);
}

xfer_status_t ct_put(xfer_endpoint_t *ep, const void *buf, size_t len, xfer_mem_t *mem,
                     uint64_t remote_addr, xfer_rkey_t *rkey)
{
    xfer_request_t *req = NULL;
    xfer_status_t s     = xfer_put(ep, buf, len, mem, remote_addr, rkey, NULL, NULL, &req);

    return tp_op_result(s, req, TP_WAIT_MS);
}

xfer_status_t ct_status_change(xfer_context_t *ctx, xfer_endpoint_t *ep, int timeout_ms)
{
    double until = tp_now_ms() + timeout_ms;

    while ((xfer_endpoint_status(ep) == XFER_OK) && (tp_now_ms() < until)) {
        xfer_progress(ctx);
        usleep(200);
    }
    return xfer_endpoint_status(ep);
}

xfer_mem_t *ct_offer(tp_side_t *s, void *buf, size_t len)
{
    xfer_mem_t *mem;
    size_t blob_len;
    void *blob;

    TP_CHECK_STATUS((buf != NULL) ? xfer_mem_register(s->ctx, buf, len, XFER_MEM_HOST, &mem) :
                    xfer_mem_alloc(s->ctx, len, XFER_MEM_HOST, &mem), XFER_OK);
    TP_CHECK_STATUS(xfer_rkey_pack(mem, &blob, &blob_len), XFER_OK);
    TP_CHECK(tp_ctl_send(s->ctl, blob, blob_len) == 0, "ctl");
    xfer_rkey_blob_free(blob);
    return mem;
}
