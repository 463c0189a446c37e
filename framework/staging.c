/*
 * The staging pipeline: put and get of memory a transport cannot touch (CUDA device memory
 * on verbs without GPUDirect, or with host memory of a peer's that shm does not map),
 * through a pool of pinned, registered host buffers. A staged batch (batch.c) is its
 * descriptors as staged puts or gets, each completing its own xfer_comp_t.
 *
 * Where it lives. In the framework, above the components - as UCX's protocol layer
 * (rndv/mtype pipelines) sits above its transports: every transport without
 * XFER_CAP_MEM_CUDA gets it, and the components stay host-only. A registration of CUDA
 * memory is accepted when some open transport moves CUDA memory or can stage it (puts and
 * gets); its memh is NULL on the transports without the cap, which is what sends an
 * operation here (endpoint.c, one test of xfer_mem_t.staged on the put/get path; host memory
 * never takes it).
 *
 * The pool. XFER_STAGING_DEPTH bounce buffers ("slots") of XFER_STAGING_CHUNK bytes, one
 * pinned allocation (cuMemHostAlloc, portable) registered once with every open transport
 * through its normal mem_reg, made on the context's first staged operation and released at
 * context destroy. Slots are the only bound: at most DEPTH chunks are in flight in the whole
 * context; operations take free slots in the order they were posted.
 *
 * One operation. Chunks are XFER_STAGING_CHUNK bytes, or the transport's largest message
 * when that is smaller. Chunk k of a put: copy device -> slot (cuMemcpyDtoHAsync on xfer's own
 * stream, an event recorded after it), and once cuEventQuery says it landed, a host put of
 * the slot to remote_addr + k * CHUNK; the slot is free when that put completes. Chunk k of
 * a get: a host get of remote_addr + k * CHUNK into a slot, then copy slot -> device
 * (cuMemcpyHtoDAsync + event). With DEPTH slots the copy of chunk k + 1 overlaps the
 * transfer of chunk k. The request completes after the last copy and the last transfer; the
 * first error (a copy, a transfer, the endpoint failing or closing) stops new chunks, waits
 * for the ones in flight (a slot is not reused while a copy or a transfer may still touch
 * it) and completes the request once with that error.
 *
 * Never blocking, never re-entering. A transfer's completion arrives inside the transport's
 * progress and only marks its slot; xfer_staging_progress, which progress runs after every
 * transport, lands copies, posts the next transfers and queues finished requests on the
 * ready list (request.c), so user callbacks run from xfer_requests_dispatch as any other. A
 * copy in flight has no file descriptor: while one is, sleeping (progress.c) does not wait.
 *
 * The remote side. A put or get whose REMOTE buffer is CUDA memory on a transport without
 * the cap is not staged: that memory has no part for the transport in its remote key
 * (memory.c registers it only with transports that move it), so xfer_rkey_unpack refuses it
 * and says why; with no such transport open at all, xfer_rkey_pack already refuses. Staging
 * the target side needs the target's framework to act on arrival - a host shadow registered
 * in its place, landed data copied to the device before a flush or a notification says it
 * is there - which one-sided operations do not give it.
 *
 * Tagged messages and tensors of device memory on such transports move whole through a host
 * buffer of their own size (staging_msg.c), not through this pipeline. Pipelining them would
 * take more than the framework: the receiver neither knows the length before the match nor
 * may it split a message the sender sent whole, so a receive into device memory needs a
 * component hook - a "destination callback" that the transport asks for where the next piece
 * of a matched message lands (a bounce slot), and tells when it landed (then copied up). tcp
 * already reads a message in pieces into its destination, verbs' rendezvous reads it in RDMA
 * chunks, so both fit it; the send side would take a "source callback" the same way.
 *
 * CUDA contexts. The stream and events live in the context of the first staged memory (its
 * device's primary context for stream-ordered allocations, which have none); an operation
 * on memory of another context is refused (a stream per context is the way to lift it).
 */
#include "staging.h"
#include "cuda_driver.h"

#include <stdlib.h>
#include <string.h>

#define STAGING_SUBSYS "staging"

typedef enum {
    SLOT_FREE,
    SLOT_COPY,          /* a copy in flight */
    SLOT_XFER,          /* a transfer posted, its completion not seen */
    SLOT_XFER_DONE,     /* the transfer completed (xfer_status) */
} slot_state_t;

struct staging_op;

typedef struct staging_slot {
    struct xfer_staging *st;
    unsigned            index;
    char                *buf;
    slot_state_t        state;
    struct staging_op   *op;
    size_t              offset;     /* of the chunk in its operation */
    size_t              length;
    xfer_comp_t         comp;       /* the transfer's completion */
    xfer_status_t       xfer_status;
} staging_slot_t;

typedef struct staging_op {
    ucs_list_link_t     list;       /* st->ops, in posting order */
    xfer_comp_t         *comp;      /* told once, when the op ends */
    xfer_endpoint_t     *ep;        /* NULL once the endpoint went */
    xfer_rkey_t         *rkey;      /* held (busy) until the op ends */
    int                 is_put;
    char                *local;
    uint64_t            remote;
    size_t              length;
    size_t              chunk;      /* bytes per chunk: the pool's, or less */
    size_t              next;       /* offset of the next chunk to start */
    size_t              done;       /* bytes of chunks whose both stages finished */
    unsigned            active;     /* slots it holds */
    xfer_status_t       status;     /* the first error, XFER_OK until then */
} staging_op_t;

struct xfer_staging {
    xfer_context_t          *ctx;
    int                     ready;          /* the pool and the engine exist */
    int                     test_host;      /* xfer_staging_test_host() */
    unsigned                test_delay;
    size_t                  chunk;
    unsigned                depth;
    xfer_copier_t           copier;
    void                    *cu_ctx;        /* the CUDA context of the memory it serves */
    char                    *pool;
    xfer_mem_t              *pool_mem;      /* its registrations */
    staging_slot_t          *slots;
    unsigned                num_free;
    unsigned                num_copying;
    ucs_list_link_t         ops;
    xfer_staging_stats_t    stats;
};

/* A copy lands without an fd event: progress polls while one is in flight. */
static int staging_busy(xfer_context_t *ctx)
{
    return xfer_staging_copying(ctx);
}

static xfer_staging_t *staging_get(xfer_context_t *ctx)
{
    xfer_staging_t *st = ctx->staging;

    if (st == NULL) {
        st = calloc(1, sizeof(*st));
        if (st == NULL) {
            return NULL;
        }
        st->ctx   = ctx;
        st->chunk = ctx->fw_config.staging_chunk;
        st->depth = (unsigned)ctx->fw_config.staging_depth;
        st->stats.chunk_size = st->chunk;
        ucs_list_head_init(&st->ops);
        ctx->staging = st;
        xfer_progress_hook_add(ctx, &ctx->staging_hook, xfer_staging_progress, NULL,
                               staging_busy);
    }
    return st;
}

/* The pool and the copy engine, on the first staged operation. */
static xfer_status_t pool_create(xfer_staging_t *st, const xfer_mem_t *mem)
{
    char why[XFER_REASON_MAX] = "";
    xfer_status_t status;
    size_t size = st->chunk * st->depth;

    status = st->test_host ?
             xfer_copier_open_host(&st->copier, st->depth, st->test_delay, why, sizeof(why)) :
             xfer_copier_open_cuda(&st->copier, st->depth, mem->attr.cuda_context,
                                   mem->attr.cuda_device, why, sizeof(why));
    if (status != XFER_OK) {
        goto err;
    }
    status = st->copier.ops->host_alloc(&st->copier, size, (void**)&st->pool, why,
                                        sizeof(why));
    if (status != XFER_OK) {
        goto err_close_copier;
    }
    st->slots = calloc(st->depth, sizeof(*st->slots));
    if (st->slots == NULL) {
        status = XFER_ERR_NO_MEMORY;
        xfer_reason_set(why, sizeof(why), "out of memory");
        goto err_free_pool;
    }
    status = xfer_mem_register_internal(st->ctx, st->pool, size, &st->pool_mem);
    if (status != XFER_OK) {
        xfer_reason_set(why, sizeof(why), "the transports cannot register it: %s",
                        xfer_status_string(status));
        goto err_free_slots;
    }
    for (unsigned i = 0; i < st->depth; i++) {
        st->slots[i].st    = st;
        st->slots[i].index = i;
        st->slots[i].buf   = st->pool + (size_t)i * st->chunk;
        st->slots[i].state = SLOT_FREE;
    }
    st->cu_ctx           = mem->attr.cuda_context;
    st->num_free         = st->depth;
    st->stats.pool_slots = st->depth;
    st->ready            = 1;
    xfer_log(XFER_LOG_DEBUG, STAGING_SUBSYS, "pool of %u x %zu bytes, %s copies", st->depth,
             st->chunk, st->copier.ops->name);
    return XFER_OK;

err_free_slots:
    free(st->slots);
    st->slots = NULL;
err_free_pool:
    st->copier.ops->host_free(&st->copier, st->pool);
    st->pool = NULL;
err_close_copier:
    st->copier.ops->close(&st->copier);
err:
    xfer_log(XFER_LOG_ERROR, STAGING_SUBSYS, "cannot create the staging pool (%u x %zu "
             "bytes, XFER_STAGING_DEPTH x XFER_STAGING_CHUNK): %s", st->depth, st->chunk, why);
    return status;
}

static void slot_xfer_cb(xfer_comp_t *self, xfer_status_t status, size_t length, uint64_t tag)
{
    staging_slot_t *slot = ucs_container_of(self, staging_slot_t, comp);

    (void)length;
    (void)tag;
    slot->xfer_status = status;
    slot->state       = SLOT_XFER_DONE;
    xfer_wake_locked(slot->st->ctx);
}

static void op_fail(staging_op_t *op, xfer_status_t status)
{
    if (op->status == XFER_OK) {
        op->status = status;
    }
}

static void slot_release(staging_slot_t *slot)
{
    xfer_staging_t *st = slot->st;

    slot->op->active--;
    slot->op    = NULL;
    slot->state = SLOT_FREE;
    st->num_free++;
    st->stats.in_flight--;
}

static void slot_copy_start(staging_slot_t *slot)
{
    xfer_staging_t *st = slot->st;
    staging_op_t *op   = slot->op;
    char why[XFER_REASON_MAX] = "";
    xfer_status_t status;

    if (op->is_put) {
        status = st->copier.ops->start(&st->copier, slot->index, slot->buf,
                                       op->local + slot->offset, slot->length,
                                       XFER_STAGING_TO_HOST, why, sizeof(why));
    } else {
        status = st->copier.ops->start(&st->copier, slot->index, op->local + slot->offset,
                                       slot->buf, slot->length, XFER_STAGING_FROM_HOST, why,
                                       sizeof(why));
    }
    if (status != XFER_OK) {
        xfer_log(XFER_LOG_ERROR, STAGING_SUBSYS, "copy of %zu bytes at offset %zu of a "
                 "staged %s failed to start: %s", slot->length, slot->offset,
                 op->is_put ? "put" : "get", why);
        op_fail(op, status);
        slot_release(slot);
        return;
    }
    slot->state = SLOT_COPY;
    st->num_copying++;
}

static void slot_xfer_start(staging_slot_t *slot)
{
    xfer_staging_t *st = slot->st;
    staging_op_t *op   = slot->op;
    xfer_endpoint_t *ep = op->ep;
    const xfer_component_v1_t *comp;
    xfer_memh_h memh;
    xfer_status_t status;

    if (ep == NULL) {
        op_fail(op, XFER_ERR_CANCELED);
        slot_release(slot);
        return;
    }
    if (ep->status != XFER_OK) {
        op_fail(op, ep->status);
        slot_release(slot);
        return;
    }
    comp          = ep->fw_iface->comp;
    memh          = st->pool_mem->memh[ep->fw_iface->index];
    slot->comp.cb = slot_xfer_cb;
    slot->state   = SLOT_XFER;
    status = op->is_put ?
             comp->put(ep->ep, slot->buf, slot->length, memh, op->remote + slot->offset,
                       op->rkey->rkey, &slot->comp) :
             comp->get(ep->ep, slot->buf, slot->length, memh, op->remote + slot->offset,
                       op->rkey->rkey, &slot->comp);
    if (status == XFER_INPROGRESS) {
        return;
    }
    /* done while posted, or refused: either way no completion will come */
    slot->xfer_status = status;
    slot->state       = SLOT_XFER_DONE;
}

/* A chunk both of whose stages finished. */
static void slot_chunk_done(staging_slot_t *slot)
{
    xfer_staging_t *st = slot->st;

    slot->op->done += slot->length;
    st->stats.chunks++;
    slot_release(slot);
}

/* Take free slots for op's next chunks; 1 when it started any. */
static int op_start_chunks(xfer_staging_t *st, staging_op_t *op)
{
    int started = 0;

    for (unsigned i = 0; (i < st->depth) && (st->num_free > 0); i++) {
        staging_slot_t *slot = &st->slots[i];

        if ((op->status != XFER_OK) || (op->next >= op->length)) {
            break;
        }
        if (slot->state != SLOT_FREE) {
            continue;
        }
        slot->op     = op;
        slot->offset = op->next;
        slot->length = (op->length - op->next < op->chunk) ? op->length - op->next : op->chunk;
        op->next    += slot->length;
        op->active++;
        st->num_free--;
        if (++st->stats.in_flight > st->stats.max_in_flight) {
            st->stats.max_in_flight = st->stats.in_flight;
        }
        if (op->is_put) {
            slot_copy_start(slot);
        } else {
            slot_xfer_start(slot);
        }
        started = 1;
    }
    return started;
}

/* Advance one slot; 1 when it moved. */
static int slot_progress(xfer_staging_t *st, staging_slot_t *slot)
{
    char why[XFER_REASON_MAX] = "";
    staging_op_t *op = slot->op;
    xfer_status_t status;

    switch (slot->state) {
    case SLOT_COPY:
        status = st->copier.ops->poll(&st->copier, slot->index, why, sizeof(why));
        if (status == XFER_INPROGRESS) {
            return 0;
        }
        st->num_copying--;
        if (status != XFER_OK) {
            xfer_log(XFER_LOG_ERROR, STAGING_SUBSYS, "copy of %zu bytes at offset %zu of a "
                     "staged %s failed: %s", slot->length, slot->offset,
                     op->is_put ? "put" : "get", why);
            op_fail(op, status);
            slot_release(slot);
            return 1;
        }
        st->stats.copies++;
        if (!op->is_put) {
            slot_chunk_done(slot);
        } else if (op->status != XFER_OK) {
            slot_release(slot);
        } else {
            slot_xfer_start(slot);
        }
        return 1;
    case SLOT_XFER_DONE:
        if (slot->xfer_status != XFER_OK) {
            xfer_log(XFER_LOG_DEBUG, STAGING_SUBSYS, "transfer of %zu bytes at offset %zu of "
                     "a staged %s failed: %s", slot->length, slot->offset,
                     op->is_put ? "put" : "get", xfer_status_string(slot->xfer_status));
            op_fail(op, slot->xfer_status);
            slot_release(slot);
            return 1;
        }
        st->stats.transfers++;
        if (op->is_put) {
            slot_chunk_done(slot);
        } else if (op->status != XFER_OK) {
            slot_release(slot);
        } else {
            slot_copy_start(slot);
        }
        return 1;
    default:
        return 0;
    }
}

/* The operation is over: every slot back, and all its bytes moved or an error seen. */
static int op_finished(const staging_op_t *op)
{
    return (op->active == 0) && ((op->status != XFER_OK) || (op->done == op->length));
}

static void op_complete(xfer_staging_t *st, staging_op_t *op)
{
    ucs_list_del(&op->list);
    if (op->ep != NULL) {
        op->ep->staged_ops--;
    }
    xfer_rkey_put(op->rkey);
    if (op->status != XFER_OK) {
        st->stats.ops_failed++;
    }
    op->comp->cb(op->comp, op->status, (op->status == XFER_OK) ? op->length : 0, 0);
    free(op);
}

unsigned xfer_staging_progress(xfer_context_t *ctx)
{
    xfer_staging_t *st = ctx->staging;
    staging_op_t *op, *tmp;
    unsigned count = 0;

    if ((st == NULL) || !st->ready) {
        return 0;
    }
    for (unsigned i = 0; i < st->depth; i++) {
        count += slot_progress(st, &st->slots[i]);
    }
    ucs_list_for_each_safe(op, tmp, &st->ops, list) {
        count += op_start_chunks(st, op);
        if (op_finished(op)) {
            op_complete(st, op);
            count++;
        }
    }
    return count;
}

int xfer_staging_copying(const xfer_context_t *ctx)
{
    const xfer_staging_t *st = ctx->staging;

    if ((st == NULL) || !st->ready) {
        return 0;
    }
    if (st->num_copying > 0) {
        return 1;
    }
    /* a transfer that completed while posted has no event behind it either */
    for (unsigned i = 0; i < st->depth; i++) {
        if (st->slots[i].state == SLOT_XFER_DONE) {
            return 1;
        }
    }
    return 0;
}

xfer_status_t xfer_staging_rma(xfer_endpoint_t *ep, xfer_comp_t *comp, int is_put,
                               void *buf, size_t length, xfer_mem_t *mem, uint64_t remote_addr,
                               xfer_rkey_t *rkey)
{
    const char *op_name = is_put ? "xfer_put" : "xfer_get";
    xfer_context_t *ctx = ep->ctx;
    xfer_staging_t *st  = staging_get(ctx);
    xfer_status_t status;
    staging_op_t *op;
    uint64_t limit;

    if (st == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    if (!(ep->fw_iface->entry->attr.caps & (is_put ? XFER_CAP_PUT : XFER_CAP_GET))) {
        xfer_log(XFER_LOG_ERROR, STAGING_SUBSYS, "%s of %s memory over %s: the transport "
                 "has no %s to stage it with", op_name,
                 (mem->attr.type == XFER_MEM_CUDA) ? "CUDA" : "staged", ep->transport,
                 is_put ? "put" : "get");
        return XFER_ERR_UNSUPPORTED;
    }
    if (!st->ready) {
        status = pool_create(st, mem);
        if (status != XFER_OK) {
            return status;
        }
    }
    if (!st->test_host && (mem->attr.cuda_context != st->cu_ctx)) {
        xfer_log(XFER_LOG_ERROR, STAGING_SUBSYS, "%s of CUDA memory over %s: the memory "
                 "belongs to CUDA context %p, the staging stream to the memory of %p; "
                 "staging serves one CUDA context per xfer context", op_name, ep->transport,
                 mem->attr.cuda_context, st->cu_ctx);
        return XFER_ERR_UNSUPPORTED;
    }
    op = calloc(1, sizeof(*op));
    if (op == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    op->comp   = comp;
    op->ep     = ep;
    op->rkey   = rkey;
    op->is_put = is_put;
    op->local  = buf;
    op->remote = remote_addr;
    op->length = length;
    op->status = XFER_OK;
    /* a transport that moves less at once than a bounce buffer holds gets smaller chunks */
    limit      = ep->fw_iface->entry->attr.limits.max_msg_size;
    op->chunk  = ((limit > 0) && (limit < st->chunk)) ? (size_t)limit : st->chunk;
    rkey->busy++;
    ep->staged_ops++;
    ucs_list_add_tail(&st->ops, &op->list);
    st->stats.ops++;
    if (length == 0) {
        return XFER_INPROGRESS;     /* completes at the next progress, as a chunk would */
    }
    (void)op_start_chunks(st, op);
    return XFER_INPROGRESS;
}

void xfer_staging_ep_destroy(xfer_endpoint_t *ep)
{
    xfer_staging_t *st = ep->ctx->staging;
    staging_op_t *op;

    if (st == NULL) {
        return;
    }
    ucs_list_for_each(op, &st->ops, list) {
        if (op->ep == ep) {
            op_fail(op, XFER_ERR_CANCELED);
            op->ep = NULL;
            ep->staged_ops--;
        }
    }
}

void xfer_staging_destroy(xfer_context_t *ctx)
{
    xfer_staging_t *st = ctx->staging;
    staging_op_t *op, *tmp;

    if (st == NULL) {
        return;
    }
    if (st->ready) {
        /* whatever is posted ended with its endpoint: land the copies, then fail the rest */
        (void)xfer_staging_progress(ctx);
        ucs_list_for_each(op, &st->ops, list) {
            op_fail(op, XFER_ERR_CANCELED);
        }
        for (unsigned i = 0; i < st->depth; i++) {
            if (st->slots[i].state != SLOT_FREE) {
                slot_release(&st->slots[i]);
            }
        }
        ucs_list_for_each_safe(op, tmp, &st->ops, list) {
            op_complete(st, op);
        }
        st->copier.ops->close(&st->copier);
        xfer_mem_deregister_internal(st->pool_mem);
        st->copier.ops->host_free(&st->copier, st->pool);
        free(st->slots);
    }
    free(st);
    ctx->staging = NULL;
    xfer_progress_hook_del(ctx, &ctx->staging_hook);
}

/* ---- test hooks (staging_test.h) ---- */

xfer_status_t xfer_staging_test_host(xfer_context_t *ctx, unsigned delay_polls)
{
    xfer_staging_t *st;

    if (ctx == NULL) {
        return XFER_ERR_INVALID_PARAM;
    }
    xfer_ctx_lock(ctx);
    st = staging_get(ctx);
    if ((st == NULL) || st->ready) {
        xfer_ctx_unlock(ctx);
        return (st == NULL) ? XFER_ERR_NO_MEMORY : XFER_ERR_BUSY;
    }
    st->test_host     = 1;
    st->test_delay    = delay_polls;
    ctx->staging_host = 1;
    xfer_ctx_unlock(ctx);
    return XFER_OK;
}

void xfer_staging_test_stats(xfer_context_t *ctx, xfer_staging_stats_t *stats_p)
{
    xfer_ctx_lock(ctx);
    memset(stats_p, 0, sizeof(*stats_p));
    if (ctx->staging != NULL) {
        *stats_p = ctx->staging->stats;
    } else {
        stats_p->chunk_size = ctx->fw_config.staging_chunk;
    }
    stats_p->msgs       = ctx->msg_staged;
    stats_p->msg_copies = ctx->msg_copies;
    xfer_ctx_unlock(ctx);
}
