/*
 * The NCCL plug-in's data path: memory registration, isend/irecv as tagged messages on the
 * comm's endpoint, test, iflush.
 */
#include "nccl_plugin.h"

#include <stdlib.h>
#include <string.h>

/* ---- memory ------------------------------------------------------------------------------- */

ncclResult_t xn_reg_mr(void *comm, void *data, size_t size, int type, void **mhandle)
{
    xn_mr_t *mr;
    xfer_status_t st;

    (void)comm;
    *mhandle = NULL;
    if ((type != NCCL_PTR_HOST) && !((type == NCCL_PTR_CUDA) &&
                                     (xn.ptr_support & NCCL_PTR_CUDA))) {
        xn_warn("regMr: memory type %d is not one this plug-in moves", type);
        return ncclInvalidArgument;
    }
    mr = calloc(1, sizeof(*mr));
    if (mr == NULL) {
        return ncclSystemError;
    }
    if (size > 0) {
        st = xfer_mem_register(xn.ctx, data, size,
                               (type == NCCL_PTR_CUDA) ? XFER_MEM_CUDA : XFER_MEM_HOST,
                               &mr->mem);
        if (st != XFER_OK) {
            xn_warn("regMr of %zu bytes at %p: %s", size, data, xfer_status_string(st));
            free(mr);
            return xn_result(st);
        }
    }
    *mhandle = mr;
    return ncclSuccess;
}

ncclResult_t xn_reg_mr_dmabuf(void *comm, void *data, size_t size, int type,
                                     uint64_t offset, int fd, void **mhandle)
{
    (void)comm; (void)data; (void)size; (void)type; (void)offset; (void)fd;
    *mhandle = NULL;
    xn_warn("regMrDmaBuf: DMA-BUF registration is not supported (ptrSupport does not claim it)");
    return ncclInvalidUsage;
}

/* Cancel the pending receives into mr: NCCL deregisters a region only once it is done with
 * what it posted there, so what is still pending is given up. The count cancelled. */
static int cancel_receives_into(const xn_mr_t *mr)
{
    int n = 0;

    pthread_mutex_lock(&xn.lock);
    for (xn_comm_t *c = xn.comms; c != NULL; c = c->next) {
        for (int k = 0; !c->is_send && (k < NCCL_NET_MAX_REQUESTS); k++) {
            for (int i = 0; c->reqs[k].used && (i < c->reqs[k].n); i++) {
                if ((c->reqs[k].mr[i] == mr) && (c->reqs[k].r[i] != NULL) &&
                    (xfer_request_cancel(c->reqs[k].r[i]) == XFER_OK)) {
                    n++;
                }
            }
        }
    }
    pthread_mutex_unlock(&xn.lock);
    return n;
}

/*
 * Never leaks: a region that operations still use has its pending receives cancelled and its
 * sends waited for (progressing, at most XN_DEREG_WAIT_MS); if it is still in use then, the
 * registration is kept and NCCL gets the error - the handle stays valid.
 */
ncclResult_t xn_dereg_mr(void *comm, void *mhandle)
{
    xn_mr_t *mr = mhandle;
    xfer_status_t st = XFER_OK;
    void *addr = NULL;
    size_t len = 0;
    double end;
    int cancelled;

    (void)comm;
    if (mr == NULL) {
        return ncclSuccess;
    }
    if (mr->mem != NULL) {
        addr = xfer_mem_address(mr->mem);   /* for the log: gone once deregistered */
        len  = xfer_mem_length(mr->mem);
        st   = xfer_mem_deregister(mr->mem);
    }
    if (st == XFER_ERR_BUSY) {
        cancelled = cancel_receives_into(mr);
        end       = xn_now_ms() + XN_DEREG_WAIT_MS;
        while ((st == XFER_ERR_BUSY) && (xn_now_ms() < end)) {
            xfer_progress(xn.ctx);
            st = xfer_mem_deregister(mr->mem);
        }
        xn_info("deregMr of %zu bytes at %p with operations outstanding: %d receive(s) "
                "cancelled, %s", len, addr, cancelled,
                (st == XFER_OK) ? "the rest finished" : "the rest did not finish");
    }
    if (st != XFER_OK) {
        xn_warn("deregMr of %zu bytes at %p: %s (%s); the registration is kept", len, addr,
                xfer_status_string(st), xfer_last_error());
        return xn_result(st);
    }
    free(mr);
    return ncclSuccess;
}

static xfer_mem_t *mem_of(void *mhandle)
{
    return (mhandle != NULL) ? ((xn_mr_t*)mhandle)->mem : NULL;
}

/* ---- data --------------------------------------------------------------------------------- */

static xn_req_t *req_get(xn_comm_t *c)
{
    for (int i = 0; i < NCCL_NET_MAX_REQUESTS; i++) {
        if (!c->reqs[i].used) {
            memset(&c->reqs[i], 0, sizeof(c->reqs[i]));
            c->reqs[i].used = 1;
            c->reqs[i].comm = c;
            return &c->reqs[i];
        }
    }
    return NULL;
}

void xn_req_put(xn_req_t *r)
{
    for (int i = 0; i < r->n; i++) {
        if (r->r[i] != NULL) {
            xfer_request_release(r->r[i]);
            r->r[i] = NULL;
        }
    }
    r->used = 0;
}

static ncclResult_t isend_common(void *send_comm, void *data, size_t size, int tag,
                                 void *mhandle, void **request)
{
    xn_comm_t *c = send_comm;
    xn_req_t *r;
    xfer_status_t st;

    *request = NULL;
    if ((c == NULL) || !c->is_send) {
        xn_warn("isend on a comm that is not a send comm");
        return ncclInvalidArgument;
    }
    r = req_get(c);
    if (r == NULL) {
        return ncclSuccess;     /* NCCL_NET_MAX_REQUESTS in flight: NCCL tries again */
    }
    r->n     = 1;
    r->mr[0] = mhandle;
    st       = xfer_tag_send(c->ep, (uint32_t)tag, data, size, mem_of(r->mr[0]), NULL, NULL,
                             &r->r[0]);
    if ((st != XFER_OK) && (st != XFER_INPROGRESS)) {
        xn_warn("isend of %zu bytes, tag %d: %s", size, tag, xfer_status_string(st));
        xn_req_put(r);
        return xn_result(st);
    }
    *request = r;
    return ncclSuccess;
}

ncclResult_t xn_isend_v8(void *send_comm, void *data, int size, int tag, void *mhandle,
                                void **request)
{
    if (size < 0) {
        xn_warn("isend of %d bytes", size);
        return ncclInvalidArgument;
    }
    return isend_common(send_comm, data, (size_t)size, tag, mhandle, request);
}

ncclResult_t xn_isend_v9(void *send_comm, void *data, size_t size, int tag,
                                void *mhandle, void **request)
{
    return isend_common(send_comm, data, size, tag, mhandle, request);
}

/* sizes8 or sizes9: the receive buffers' sizes, as version 8 or 9 passes them. */
static ncclResult_t irecv_common(void *recv_comm, int n, void **data, const int *sizes8,
                                 const size_t *sizes9, int *tags, void **mhandles,
                                 void **request)
{
    xn_comm_t *c = recv_comm;
    xn_req_t *r;
    xfer_status_t st;

    *request = NULL;
    if ((c == NULL) || c->is_send) {
        xn_warn("irecv on a comm that is not a receive comm");
        return ncclInvalidArgument;
    }
    if ((n < 1) || (n > XN_MAX_RECVS)) {
        xn_warn("irecv of %d receives at once (1 to %d)", n, XN_MAX_RECVS);
        return ncclInvalidArgument;
    }
    r = req_get(c);
    if (r == NULL) {
        return ncclSuccess;
    }
    for (int i = 0; i < n; i++) {
        if ((sizes8 != NULL) && (sizes8[i] < 0)) {
            xn_warn("irecv into %d bytes", sizes8[i]);
            xn_req_put(r);
            return ncclInvalidArgument;
        }
        r->cap[i] = (sizes8 != NULL) ? (size_t)sizes8[i] : sizes9[i];
        r->mr[i]  = (mhandles != NULL) ? mhandles[i] : NULL;
        st        = xfer_tag_recv(xn.ctx, c->ep, (uint32_t)tags[i], UINT64_MAX, data[i],
                                  r->cap[i], mem_of(r->mr[i]), NULL, NULL, &r->r[i]);
        r->n      = i + 1;
        if ((st != XFER_OK) && (st != XFER_INPROGRESS)) {
            xn_warn("irecv %d of %d (%zu bytes, tag %d): %s", i + 1, n, r->cap[i], tags[i],
                    xfer_status_string(st));
            r->n = i;
            for (int j = 0; j < i; j++) {
                xfer_request_cancel(r->r[j]);
            }
            xn_req_put(r);
            return xn_result(st);
        }
    }
    *request = r;
    return ncclSuccess;
}

ncclResult_t xn_irecv_v8(void *recv_comm, int n, void **data, int *sizes, int *tags,
                                void **mhandles, void **request)
{
    return irecv_common(recv_comm, n, data, sizes, NULL, tags, mhandles, request);
}

ncclResult_t xn_irecv_v9(void *recv_comm, int n, void **data, size_t *sizes, int *tags,
                                void **mhandles, void **request)
{
    return irecv_common(recv_comm, n, data, NULL, sizes, tags, mhandles, request);
}

ncclResult_t xn_iflush(void *recv_comm, int n, void **data, int *sizes, void **mhandles,
                              void **request)
{
    (void)recv_comm; (void)n; (void)data; (void)sizes; (void)mhandles;
    /* a receive into CUDA memory completes after its bytes were copied in: nothing to flush */
    *request = NULL;
    return ncclSuccess;
}

ncclResult_t xn_test(void *request, int *done, int *sizes)
{
    xn_req_t *r = request;
    ncclResult_t ret = ncclSuccess;

    *done = 0;
    if ((r == NULL) || !r->used) {
        xn_warn("test of a request that is not in flight");
        return ncclInvalidArgument;
    }
    for (int i = 0; i < r->n; i++) {
        if (xfer_request_test(r->r[i]) == XFER_INPROGRESS) {
            return ncclSuccess;
        }
    }
    for (int i = 0; i < r->n; i++) {
        xfer_status_t st = xfer_request_test(r->r[i]);
        size_t len       = xfer_request_length(r->r[i]);

        if (st == XFER_ERR_TRUNCATED) {
            xn_warn("a message of %zu bytes arrived for a receive of %zu (tag %llu)", len,
                    r->cap[i], (unsigned long long)xfer_request_tag(r->r[i]));
        } else if (st != XFER_OK) {
            xn_warn("%s on %s: %s", r->comm->is_send ? "send" : "receive",
                    xfer_endpoint_peer(r->comm->ep), xfer_status_string(st));
        }
        if ((st != XFER_OK) && (ret == ncclSuccess)) {
            ret = xn_result(st);
        }
        if (sizes != NULL) {
            sizes[i] = (len > (size_t)INT32_MAX) ? INT32_MAX : (int)len;
        }
    }
    xn_req_put(r);
    *done = 1;
    return ret;
}
