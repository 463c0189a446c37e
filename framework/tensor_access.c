/*
 * Who may fetch what this context publishes (xfer.h, xfer_tensor_access_set): the producer's
 * callback, asked by tensor.c wherever a peer's request could get a published tensor. A
 * refused request stays as if the tensor did not exist, so the engine's bounds and deadlines
 * (XFER_TENSOR_MAX_REQUESTS, XFER_TENSOR_BUDGET, XFER_TENSOR_REQUEST_TIMEOUT) are its only
 * answer, on every transport alike.
 */
#include "xfer_int.h"

#define ACCESS_SUBSYS "tensor"

xfer_status_t xfer_tensor_access_set(xfer_context_t *ctx, xfer_tensor_access_cb_t cb, void *arg)
{
    if (ctx == NULL) {
        xfer_refuse(ACCESS_SUBSYS, "xfer_tensor_access_set: the context is NULL");
        return XFER_ERR_INVALID_PARAM;
    }
    xfer_ctx_lock(ctx);
    ctx->access_cb  = cb;
    ctx->access_arg = arg;
    xfer_ctx_unlock(ctx);
    return XFER_OK;
}

int xfer_tensor_access_allows(xfer_context_t *ctx, xfer_endpoint_t *ep, uint64_t step,
                              const char *key, size_t key_len)
{
    int allowed;

    if (ctx->access_cb == NULL) {
        return 1;
    }
    /* it may not call xfer: every call is refused, as from an allocation callback */
    xfer_in_callback++;
    xfer_in_engine_cb = "a tensor access callback, which runs inside the tensor engine";
    allowed = ctx->access_cb(ep, step, key, key_len, ctx->access_arg);
    xfer_in_engine_cb = NULL;
    xfer_in_callback--;
    if (!allowed) {
        xfer_log_at(XFER_LOG_DEBUG, ACCESS_SUBSYS, "step %llu '%.*s' is not for %s",
                    (unsigned long long)step, (int)key_len, key, ep->peer);
    }
    return allowed != 0;
}
