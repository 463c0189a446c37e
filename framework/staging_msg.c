/*
 * Tagged messages and tensors of memory a transport cannot touch (CUDA device memory on verbs
 * without GPUDirect), staged whole through host memory.
 *
 * Puts and gets of such memory go through the chunked pipeline of staging.c. A message
 * cannot be cut into chunks above the transport: the receiver neither knows its length
 * before the match nor may split what the sender sent whole. So a message or a tensor moves
 * through one host buffer of its own size, and the transport sees only host memory:
 * - tag send: the source is copied to a host buffer before the send is posted (so messages
 *   keep their order on the endpoint), which is freed when the transport is done with it;
 * - tag receive: posted into a host buffer of the receive's length; when it completes, the
 *   bytes that arrived are copied up to the device before the request reports them;
 * - tensor fetch: the destination is given to the transport as an allocation callback that
 *   returns a host buffer of the tensor's size once it is known (for a caller's buffer, only
 *   when the tensor fits it: the peer decides the size, the caller's capacity bounds it);
 *   the data is copied up before the fetch completes;
 * - tensor publish: a tensor in device memory is copied to host memory at publish when an
 *   open transport without XFER_CAP_MEM_CUDA could be asked for it.
 * Every host buffer is as large as the caller's own buffer or the tensor that fits it: a peer
 * cannot make this side allocate more than the caller asked to receive.
 *
 * Copies are synchronous (cuMemcpyDtoH/HtoD in the memory's context, through one copy engine
 * per CUDA context, opened on first use): a receive's copy runs inside the progress call that
 * saw it complete. Overlapping them with the network needs a transport hook that hands out a
 * message piece by piece (staging.c describes it); this is the path that works on every
 * transport meanwhile. Host memory that the suites stage on purpose (xfer_staging_test_host)
 * is copied with memcpy.
 */
#include "staging.h"
#include "cuda_driver.h"

#include <stdlib.h>
#include <string.h>

#define MSG_SUBSYS "staging"

/* One copy engine per CUDA context (its stream's context); only its synchronous copies are
 * used. */
typedef struct msg_copier {
    struct msg_copier *next;
    void              *cu_ctx;
    int               device;
    xfer_copier_t     copier;
} msg_copier_t;

struct xfer_msg_stage {
    void            *host;          /* what the transport moves */
    size_t          host_len;
    void            *dev;           /* receive / fetch: where the bytes go (NULL: nowhere) */
    size_t          capacity;       /* fetch into a caller's buffer: its bytes */
    int             user_alloc;     /* fetch: dev came from the caller's allocation callback */
    xfer_mem_attr_t attr;           /* of dev (or of a send's source) */
    xfer_status_t   status;         /* a failure found inside the allocation callback */
    char            why[XFER_REASON_MAX];
    const xfer_req_ops_t *owner_ops; /* the request's owner's, called after the stage's */
};

static const xfer_req_ops_t staged_ops;

/* req's ends go through st first (staged_ops), then to its owner's ops. */
static void stage_attach(xfer_request_t *req, xfer_msg_stage_t *st)
{
    st->owner_ops = req->ops;
    req->stage    = st;
    req->ops      = &staged_ops;
}

static xfer_status_t copier_get(xfer_context_t *ctx, const xfer_mem_attr_t *attr,
                                xfer_copier_t **c_p, char *why, size_t why_size)
{
    msg_copier_t *mc;
    xfer_status_t status;

    for (mc = ctx->msg_copiers; mc != NULL; mc = mc->next) {
        if ((mc->cu_ctx == attr->cuda_context) && (mc->device == attr->cuda_device)) {
            *c_p = &mc->copier;
            return XFER_OK;
        }
    }
    mc = calloc(1, sizeof(*mc));
    if (mc == NULL) {
        xfer_reason_set(why, why_size, "out of memory");
        return XFER_ERR_NO_MEMORY;
    }
    status = xfer_copier_open_cuda(&mc->copier, 1, attr->cuda_context, attr->cuda_device, why,
                                   why_size);
    if (status != XFER_OK) {
        free(mc);
        return status;
    }
    mc->cu_ctx       = attr->cuda_context;
    mc->device       = attr->cuda_device;
    mc->next         = ctx->msg_copiers;
    ctx->msg_copiers = mc;
    *c_p             = &mc->copier;
    return XFER_OK;
}

/* Copy len bytes between a host buffer and memory of attr's kind, landed on return. */
static xfer_status_t msg_copy(xfer_context_t *ctx, const xfer_mem_attr_t *attr, void *dst,
                              const void *src, size_t len, xfer_staging_dir_t dir, char *why,
                              size_t why_size)
{
    xfer_copier_t *c;
    xfer_status_t status;

    if (len == 0) {
        return XFER_OK;
    }
    ctx->msg_copies++;
    if (attr->type != XFER_MEM_CUDA) {
        memcpy(dst, src, len);      /* host memory staged by the suites */
        return XFER_OK;
    }
    status = copier_get(ctx, attr, &c, why, why_size);
    if (status != XFER_OK) {
        return status;
    }
    return xfer_copier_sync_cuda(c, dst, src, len, dir, why, why_size);
}

void xfer_msg_stage_cleanup(xfer_context_t *ctx)
{
    while (ctx->msg_copiers != NULL) {
        msg_copier_t *mc = ctx->msg_copiers;

        ctx->msg_copiers = mc->next;
        mc->copier.ops->close(&mc->copier);
        free(mc);
    }
}

static xfer_msg_stage_t *stage_new(xfer_request_t *req, size_t host_len)
{
    xfer_msg_stage_t *st = calloc(1, sizeof(*st));

    if (st == NULL) {
        return NULL;
    }
    /* at least one byte, so that an empty message still has a buffer to name */
    st->host = malloc(host_len ? host_len : 1);
    if (st->host == NULL) {
        free(st);
        return NULL;
    }
    st->host_len = host_len;
    stage_attach(req, st);
    req->ctx->msg_staged++;
    return st;
}

void xfer_msg_stage_free(xfer_request_t *req)
{
    if (req->stage != NULL) {
        req->ops = req->stage->owner_ops;
        free(req->stage->host);
        free(req->stage);
        req->stage = NULL;
    }
}

int xfer_msg_staged(const xfer_mem_t *mem, const xfer_fw_iface_t *fi)
{
    /* a transport with RMA_CUDA alone holds a registration of CUDA memory for put and get,
     * not for messages */
    return (mem != NULL) && mem->staged &&
           ((mem->memh[fi->index] == NULL) || !(fi->entry->attr.caps & XFER_CAP_MEM_CUDA));
}

xfer_status_t xfer_msg_stage_send(xfer_request_t *req, const void *buf, size_t length,
                                  const xfer_mem_t *mem, void **host_p)
{
    char why[XFER_REASON_MAX];
    xfer_msg_stage_t *st = stage_new(req, length);
    xfer_status_t status;

    if (st == NULL) {
        xfer_log(XFER_LOG_ERROR, MSG_SUBSYS, "xfer_tag_send: no host memory for a %zu-byte "
                 "message of %s memory", length, mem->attr.how);
        return XFER_ERR_NO_MEMORY;
    }
    st->attr = mem->attr;
    status   = msg_copy(req->ctx, &st->attr, st->host, buf, length, XFER_STAGING_TO_HOST, why,
                        sizeof(why));
    if (status != XFER_OK) {
        xfer_log(XFER_LOG_ERROR, MSG_SUBSYS, "xfer_tag_send: cannot copy %zu bytes of device "
                 "memory to host memory: %s", length, why);
        xfer_msg_stage_free(req);
        return status;
    }
    *host_p = st->host;
    return XFER_OK;
}

xfer_status_t xfer_msg_stage_recv(xfer_request_t *req, void *buf, size_t length,
                                  const xfer_mem_t *mem, void **host_p)
{
    xfer_msg_stage_t *st = stage_new(req, length);

    if (st == NULL) {
        xfer_log(XFER_LOG_ERROR, MSG_SUBSYS, "xfer_tag_recv: no host memory to receive %zu "
                 "bytes for %s memory", length, mem->attr.how);
        return XFER_ERR_NO_MEMORY;
    }
    st->attr = mem->attr;
    st->dev  = buf;
    *host_p  = st->host;
    return XFER_OK;
}

/* ---- tensor fetch ---- */

/* The allocation callback the transport sees: where the tensor's bytes land on this side. */
static void *fetch_stage_alloc(void *alloc_arg, const xfer_tensor_t *meta)
{
    xfer_request_t *req  = alloc_arg;
    xfer_msg_stage_t *st = req->stage;
    char why[XFER_REASON_MAX];
    void *host;

    if ((meta->size > SIZE_MAX) || (st->host != NULL)) {
        st->status = (st->host != NULL) ? XFER_ERR_PROTOCOL : XFER_ERR_NO_MEMORY;
        xfer_reason_set(st->why, sizeof(st->why), (st->host != NULL) ?
                        "the transport asked twice where the tensor goes" :
                        "a tensor of %llu bytes does not fit this host's address space",
                        (unsigned long long)meta->size);
        return NULL;
    }
    if (st->user_alloc) {
        st->dev = xfer_tensor_fetch_alloc(req, meta);
        if (st->dev == NULL) {
            return NULL;        /* the caller's callback failed: the transport says so */
        }
        if (meta->size == 0) {
            return st->dev;
        }
        if (xfer_mem_detect(st->dev, (size_t)meta->size, &st->attr, why, sizeof(why)) !=
            XFER_OK) {
            st->status = XFER_ERR_INVALID_PARAM;
            xfer_reason_set(st->why, sizeof(st->why), "the allocation callback's buffer: %s",
                            why);
            return NULL;
        }
        if (st->attr.type != XFER_MEM_CUDA) {
            return st->dev;     /* host memory: the transport writes it itself */
        }
    } else if (meta->size > st->capacity) {
        st->status = XFER_ERR_TRUNCATED;
        xfer_reason_set(st->why, sizeof(st->why), "a %llu-byte tensor does not fit the "
                        "consumer's %zu bytes", (unsigned long long)meta->size, st->capacity);
        return NULL;
    }
    host = malloc(meta->size ? (size_t)meta->size : 1);
    if (host == NULL) {
        st->status = XFER_ERR_NO_MEMORY;
        xfer_reason_set(st->why, sizeof(st->why), "no host memory to stage a %llu-byte "
                        "tensor", (unsigned long long)meta->size);
        return NULL;
    }
    st->host     = host;
    st->host_len = (size_t)meta->size;
    req->ctx->msg_staged++;
    return host;
}

int xfer_msg_stage_fetch_needed(const xfer_endpoint_t *ep, const xfer_fetch_params_t *params)
{
    if (params->alloc != NULL) {
        /* what the callback returns is known only then: device memory is staged where the
         * transport cannot touch it */
        return !(ep->fw_iface->entry->attr.caps & XFER_CAP_MEM_CUDA);
    }
    return xfer_msg_staged(params->mem, ep->fw_iface);
}

xfer_status_t xfer_msg_stage_fetch(xfer_request_t *req, const xfer_fetch_params_t *params,
                                   xfer_fetch_args_t *args)
{
    xfer_msg_stage_t *st = calloc(1, sizeof(*st));

    if (st == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    if (params->alloc != NULL) {
        st->user_alloc = 1;
    } else {
        st->dev      = params->buffer;
        st->capacity = params->capacity;
        st->attr     = params->mem->attr;
    }
    stage_attach(req, st);
    args->buffer    = NULL;
    args->capacity  = 0;
    args->memh      = NULL;
    args->alloc     = fetch_stage_alloc;
    args->alloc_arg = req;
    return XFER_OK;
}

/* ---- completion ---- */

void xfer_msg_stage_end(xfer_request_t *req, xfer_status_t *status_p, size_t *length_p)
{
    xfer_msg_stage_t *st = req->stage;
    char why[XFER_REASON_MAX];
    xfer_status_t status;
    size_t len;

    if ((req->kind == XFER_REQ_FETCH) && (*status_p != XFER_OK) &&
        (st->status != XFER_OK)) {
        /* the transport reports what our allocation callback returned; say why it did */
        xfer_log(XFER_LOG_ERROR, MSG_SUBSYS, "tensor fetch: %s", st->why);
        *status_p = st->status;
    }
    if (req->kind == XFER_REQ_FETCH) {
        len = (st->host != NULL) ? (size_t)req->tensor.size : 0;
    } else {
        len = (req->kind == XFER_REQ_RECV) ? *length_p : 0;
    }
    if ((*status_p == XFER_OK) && (st->host != NULL) && (st->dev != NULL) && (len > 0)) {
        if (len > st->host_len) {
            /* a transport that reports more than fitted its destination: never copy it */
            xfer_log(XFER_LOG_ERROR, MSG_SUBSYS, "%zu bytes reported into a %zu-byte staging "
                     "buffer", len, st->host_len);
            *status_p = XFER_ERR_INTERNAL;
        } else {
            status = msg_copy(req->ctx, &st->attr, st->dev, st->host, len,
                              XFER_STAGING_FROM_HOST, why, sizeof(why));
            if (status != XFER_OK) {
                xfer_log(XFER_LOG_ERROR, MSG_SUBSYS, "cannot copy %zu received bytes to device "
                         "memory: %s", len, why);
                *status_p = status;
            }
        }
    }
    if ((req->kind == XFER_REQ_FETCH) && (st->user_alloc || (st->host != NULL))) {
        /* the caller's buffer, not the host one, which goes now; after a failure too, so
         * that the caller can free what its callback gave */
        req->tensor.data = st->dev;
    }
    xfer_msg_stage_free(req);
}

/* ---- tensor publish ---- */

xfer_status_t xfer_msg_stage_publish(xfer_context_t *ctx, const xfer_tensor_t *tensor,
                                     int copy_asked, void **copy_p)
{
    char why[XFER_REASON_MAX];
    int host_only = 0;      /* an open tensor transport cannot touch device memory */
    xfer_mem_attr_t attr;
    xfer_status_t status;
    void *copy;

    *copy_p = NULL;
    if (tensor->is_dead || (tensor->size == 0)) {
        return XFER_OK;
    }
    for (unsigned i = 0; !host_only && (i < ctx->num_ifaces); i++) {
        host_only = (ctx->ifaces[i].comp->tensor_fetch != NULL) &&
                    !(ctx->ifaces[i].entry->attr.caps & XFER_CAP_MEM_CUDA);
    }
    if (!copy_asked && !host_only) {
        return XFER_OK;     /* every transport takes the data where it is: nothing to find */
    }
    if (tensor->size > SIZE_MAX) {
        return XFER_ERR_NO_MEMORY;
    }
    status = xfer_mem_detect(tensor->data, (size_t)tensor->size, &attr, why, sizeof(why));
    if (status != XFER_OK) {
        xfer_log(XFER_LOG_ERROR, MSG_SUBSYS, "xfer_tensor_publish: %s", why);
        return status;
    }
    if (!copy_asked && (attr.type != XFER_MEM_CUDA)) {
        return XFER_OK;
    }
    copy = malloc((size_t)tensor->size);
    if (copy == NULL) {
        xfer_log(XFER_LOG_ERROR, MSG_SUBSYS, "xfer_tensor_publish: no host memory for a copy "
                 "of %llu bytes", (unsigned long long)tensor->size);
        return XFER_ERR_NO_MEMORY;
    }
    status = msg_copy(ctx, &attr, copy, tensor->data, (size_t)tensor->size,
                      XFER_STAGING_TO_HOST, why, sizeof(why));
    if (status != XFER_OK) {
        xfer_log(XFER_LOG_ERROR, MSG_SUBSYS, "xfer_tensor_publish: cannot copy %llu bytes of "
                 "device memory to host memory: %s", (unsigned long long)tensor->size, why);
        free(copy);
        return status;
    }
    if (!copy_asked) {
        ctx->msg_staged++;
    }
    *copy_p = copy;
    return XFER_OK;
}

/* ---- the request's ops while it is staged ---- */

static void staged_end(xfer_request_t *req, xfer_status_t *status_p, size_t *length_p)
{
    const xfer_req_ops_t *owner = req->stage->owner_ops;

    xfer_msg_stage_end(req, status_p, length_p);    /* which gives req its owner's ops back */
    if ((owner != NULL) && (owner->end != NULL)) {
        owner->end(req, status_p, length_p);
    }
}

static xfer_status_t staged_cancel(xfer_request_t *req, xfer_status_t status)
{
    const xfer_req_ops_t *owner = req->stage->owner_ops;

    return ((owner == NULL) || (owner->cancel == NULL)) ? XFER_ERR_UNSUPPORTED :
           owner->cancel(req, status);
}

static void staged_release(xfer_request_t *req)
{
    xfer_msg_stage_free(req);                       /* which gives req its owner's ops back */
    if ((req->ops != NULL) && (req->ops->release != NULL)) {
        req->ops->release(req);
    }
}

static const xfer_req_ops_t staged_ops = {staged_end, staged_cancel, staged_release};
