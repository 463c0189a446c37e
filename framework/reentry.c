/*
 * Re-entry: which calls the API refuses from where. Completion callbacks run from the
 * context's ready list, outside every transport, and may call almost anything (request.c);
 * a fetch's allocation callback runs inside a transport's receive path, where only an
 * allocation is safe, and the producer's access callback inside the tensor engine, where
 * only its answer is; and while a context is destroyed nothing new is posted to it.
 */
#include "xfer_int.h"

#define REENTRY_SUBSYS "api"

XFER_TLS int xfer_in_callback;
XFER_TLS const char *xfer_in_engine_cb;

xfer_status_t xfer_api_refuse(const xfer_context_t *ctx, const char *fn, int posting)
{
    if (xfer_in_engine_cb != NULL) {
        xfer_log(XFER_LOG_ERROR, REENTRY_SUBSYS, "%s called from %s: refused (the callback "
                 "may only answer)", fn, xfer_in_engine_cb);
        return XFER_ERR_BUSY;
    }
    if (posting && ctx->destroying) {
        xfer_log(XFER_LOG_ERROR, REENTRY_SUBSYS, "%s while the context is being destroyed: "
                 "refused", fn);
        return XFER_ERR_CANCELED;
    }
    return XFER_OK;
}
