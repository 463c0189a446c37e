/*
 * Batches: descriptor lists of puts or gets, checked once and posted many times, each post one
 * request with one completion, a deadline, and optionally a notification for the peer.
 *
 * A prepared list (xfer_batch_t, batch_list.c) holds its descriptors in absolute addresses,
 * the memory registration (busy) and the remote key (busy). A post makes a batch op: the
 * transport's side of the request - its completion, the arguments the transport reads until
 * it ends, and the count of descriptors landed that the transport raises. The request and the
 * op part when the request ends early (its deadline passes, it is cancelled): the request
 * completes at once with what is known to have landed, while the op lives on until the
 * transport has let go of the memory - which stays busy until then, so that deregistering it
 * fails rather than pull pages from under a NIC that may still write them.
 *
 * A transport without a batch entry point gets the descriptors one by one through put and get
 * (a batch walk, engine.h), then, for puts, a flush: the batch completes when its data is in
 * the peer's memory there too. Such a transport cannot carry notifications; posting one is refused.
 *
 * Memory the transport cannot touch (CUDA memory on a transport without XFER_CAP_MEM_CUDA, or
 * one that declines this batch before moving anything, as shm does between device memory and
 * a peer's host memory it has not mapped) is staged: the same walk, each descriptor a staged
 * put or get (staging.c), then for puts the flush, then the notification alone - held as
 * below, so that it leaves only once every byte is in the peer's memory, and a cancel or a
 * deadline before that sends none. A batch that a transport declines as one unit although it
 * moves the memory (verbs with GPUDirect on device memory, shm without cross-memory attach)
 * takes the same walk through its own put and get.
 *
 * Notifications from one endpoint arrive in the order their batches were posted. A put's
 * leaves behind its data at once, in the transport's order; a get's only once its reads are
 * done, later than a put posted after it would. So a batch with a notification posted while
 * an earlier one's notification is still to leave late (ep->notify_late) goes without it: once
 * its data is in and every earlier one's notification has left, its own goes alone - a batch
 * of no descriptors, behind everything - and its request completes with that. Put batches in
 * a row keep their pace; only what follows a get waits for it.
 */
#include "batch.h"
#include "staging.h"

#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* A held notification: where it stands (batch_op_t.note_state). */
enum {
    NOTE_NONE,          /* inline, or none */
    NOTE_MOVING,        /* held: the data moves */
    NOTE_READY,         /* held: the data is in, the notification waits its turn */
    NOTE_SENT,          /* held: the notification went alone (note_args) */
};

typedef struct xfer_batch_op {
    xfer_comp_t         comp;           /* what the transport completes */
    xfer_batch_args_t   args;
    xfer_batch_t        *batch;
    xfer_request_t      *req;           /* NULL once the request ended without it */
    ucs_list_link_t     list;           /* ctx->batch_ops */
    int64_t             deadline;       /* xfer_now_ms(); INT64_MAX: none */
    /* the notification's order (see above) */
    xfer_endpoint_t     *ep;
    ucs_list_link_t     late_link;      /* ep->notify_late */
    int                 late;           /* on it */
    int                 note_state;
    xfer_batch_args_t   note_args;      /* NOTE_SENT: the notification alone */
    xfer_comp_t         note_comp;
    size_t              note_len;
    /* one by one (no batch entry point, or staged) */
    int                 each;
    int                 staged;         /* each descriptor through staging.c */
    xfer_batch_walk_t   walk;
    xfer_comp_t         flush_comp;
    uint8_t             note[];         /* a held notification's copy */
} batch_op_t;

static void late_advance(xfer_endpoint_t *ep);
static void late_remove(batch_op_t *op);
static void batch_op_end(batch_op_t *op, xfer_status_t status, size_t landed);

void xfer_batch_ctx_init(xfer_context_t *ctx)
{
    ucs_list_head_init(&ctx->batch_ops);
    ucs_list_head_init(&ctx->batches);
    ctx->batch_deadline = INT64_MAX;
}

void xfer_batch_ep_gone(xfer_endpoint_t *ep)
{
    batch_op_t *op;

    /* its transport's endpoint went, and every op of it with it: what is left waited for its
     * notification's turn, which will not come */
    while (!ucs_list_is_empty(&ep->notify_late)) {
        op = ucs_list_head(&ep->notify_late, batch_op_t, late_link);
        late_remove(op);
        if (op->note_state == NOTE_READY) {
            batch_op_end(op, XFER_ERR_CANCELED, op->args.landed);
        }
    }
    if (ep->batch_ops == 0) {
        return;     /* every op of it ended: none refers to it */
    }
    /* an op still here outlives the endpoint (the transport holds it past its destroy) */
    ucs_list_for_each(op, &ep->ctx->batch_ops, list) {
        if (op->ep == ep) {
            op->ep = NULL;
        }
    }
}

/* ---- posted batches ------------------------------------------------------------------------- */

static void batch_deadline_update(xfer_context_t *ctx, int64_t deadline)
{
    if (deadline < ctx->batch_deadline) {
        ctx->batch_deadline = deadline;
    }
    xfer_progress_hook_add(ctx, &ctx->batch_hook, xfer_batch_expire, xfer_batch_timeout, NULL);
}

static void late_remove(batch_op_t *op)
{
    if (op->late) {
        ucs_list_del(&op->late_link);
        op->late = 0;
    }
}

/* The transport is done with the op: its request (if still attached) completes, and the
 * memory, the key and the list are let go. */
static void batch_op_end(batch_op_t *op, xfer_status_t status, size_t landed)
{
    xfer_batch_t *batch = op->batch;
    xfer_endpoint_t *ep = op->late ? op->ep : NULL;

    late_remove(op);
    if (op->req != NULL) {
        op->req->landed   = landed;
        op->req->batch_op = NULL;
        xfer_request_complete(op->req, status, (status == XFER_OK) ? batch->bytes : 0, 0);
    }
    ucs_list_del(&op->list);
    batch->mem->busy--;
    if (op->each) {
        xfer_batch_walk_cleanup(&op->walk);
    }
    if (op->ep != NULL) {
        op->ep->batch_ops--;        /* a close waiting for it may flush */
    }
    free(op);
    xfer_batch_unpost(batch);
    if (ep != NULL) {
        late_advance(ep);   /* the notifications held behind it may go */
    }
}

static void batch_op_comp_cb(xfer_comp_t *self, xfer_status_t status, size_t length,
                             uint64_t tag)
{
    batch_op_t *op = ucs_container_of(self, batch_op_t, comp);

    (void)tag;
    if ((status == XFER_OK) && (length != op->args.count)) {
        xfer_log(XFER_LOG_ERROR, BATCH_SUBSYS, "%s completed a batch with %zu of %zu "
                 "descriptors landed and no error", op->batch->fw_iface->entry->name, length,
                 op->args.count);
        status = XFER_ERR_INTERNAL;
    }
    if ((op->note_state == NOTE_MOVING) && (status == XFER_OK) && (op->req != NULL)) {
        /* the data is in: its notification goes at its turn, and then the request ends */
        op->args.landed = op->args.count;
        op->note_state  = NOTE_READY;
        late_advance(op->ep);
        return;
    }
    batch_op_end(op, status, (length < op->args.count) ? length : op->args.count);
}

/* ---- the notifications' order --------------------------------------------------------------- */

static void note_comp_cb(xfer_comp_t *self, xfer_status_t status, size_t length, uint64_t tag)
{
    batch_op_t *op = ucs_container_of(self, batch_op_t, note_comp);

    (void)length;
    (void)tag;
    batch_op_end(op, status, (status == XFER_OK) ? op->args.count : op->args.landed);
}

/* Send the held notification of op alone, behind everything sent before. */
static void note_send(batch_op_t *op)
{
    xfer_batch_func_t post = xfer_component_batch(op->batch->fw_iface->comp);
    xfer_status_t status;

    op->note_state           = NOTE_SENT;
    op->deadline             = INT64_MAX;   /* it left: the target's word completes it */
    op->note_args            = op->args;
    op->note_args.iov        = NULL;
    op->note_args.count      = 0;
    op->note_args.memh       = NULL;   /* a notification alone touches no memory */
    op->note_args.landed     = 0;
    op->note_args.notify     = op->note;
    op->note_args.notify_len = op->note_len;
    op->note_comp.cb         = note_comp_cb;
    status = (op->ep->status != XFER_OK) ? op->ep->status :
             post(op->ep->ep, &op->note_args, &op->note_comp);
    if (status != XFER_INPROGRESS) {
        note_comp_cb(&op->note_comp, status, 0, 0);
    }
}

/* The notifications at the head of ep's order that may go now, go: a held one whose data is
 * in, until one that still waits for its data or for its reads (a get's own, inline). */
static void late_advance(xfer_endpoint_t *ep)
{
    while (!ucs_list_is_empty(&ep->notify_late)) {
        batch_op_t *op = ucs_list_head(&ep->notify_late, batch_op_t, late_link);

        if (op->note_state != NOTE_READY) {
            return;
        }
        late_remove(op);
        note_send(op);
    }
}

/* ---- one by one, for a transport without batch ---------------------------------------------- */

static void batch_flush_cb(xfer_comp_t *self, xfer_status_t status, size_t length,
                           uint64_t tag)
{
    batch_op_t *op = ucs_container_of(self, batch_op_t, flush_comp);

    (void)length;
    (void)tag;
    if (status == XFER_OK) {
        op->args.landed = op->walk.next;
    }
    batch_op_comp_cb(&op->comp, status, op->args.landed, 0);
}

/* Every descriptor's operation completed. A get's data is here; a put's is in the peer's
 * memory once a flush behind them completes. */
static void batch_each_done(xfer_batch_walk_t *w)
{
    batch_op_t *op      = ucs_container_of(w, batch_op_t, walk);
    xfer_endpoint_t *ep = op->ep;     /* closing still flushes; only its destroy ends it */
    xfer_status_t status;

    if (!op->batch->is_put && !w->stopped) {
        /* every read has its data: a held notification may go */
        batch_op_comp_cb(&op->comp, XFER_OK, op->args.landed, 0);
        return;
    }
    if (!op->batch->is_put || w->stopped) {
        batch_op_end(op, w->status, op->args.landed);
        return;
    }
    if ((ep == NULL) || ep->destroying) {
        /* no flush can say the puts are in the peer's memory now */
        batch_op_end(op, XFER_ERR_CANCELED, op->args.landed);
        return;
    }
    if (ep->fw_iface->comp->ep_flush == NULL) {
        batch_flush_cb(&op->flush_comp, XFER_OK, 0, 0);
        return;
    }
    op->flush_comp.cb = batch_flush_cb;
    status = ep->fw_iface->comp->ep_flush(ep->ep, &op->flush_comp);
    if (status != XFER_INPROGRESS) {
        batch_flush_cb(&op->flush_comp, status, 0, 0);
    }
}

static xfer_status_t batch_each_post(xfer_batch_walk_t *w, size_t i, xfer_comp_t *comp,
                                     size_t *n_p)
{
    batch_op_t *op                  = ucs_container_of(w, batch_op_t, walk);
    const xfer_component_v1_t *cops = op->batch->fw_iface->comp;
    const xfer_batch_iov_t *v       = &op->args.iov[i];
    void *local                     = (void*)(uintptr_t)v->local;

    (void)n_p;
    if ((op->ep == NULL) || op->ep->destroying) {
        return XFER_ERR_CANCELED;   /* the endpoint goes */
    }
    if (op->staged) {
        return xfer_staging_rma(op->ep, comp, op->args.is_put, local, (size_t)v->length,
                                op->batch->mem, v->remote, op->batch->rkey);
    }
    return op->args.is_put ?
           cops->put(op->ep->ep, local, v->length, op->args.memh, v->remote, op->args.rkey,
                     comp) :
           cops->get(op->ep->ep, local, v->length, op->args.memh, v->remote, op->args.rkey,
                     comp);
}

static const xfer_batch_walk_ops_t batch_each_ops = {
    .post = batch_each_post,
    .done = batch_each_done,
};

/* Post the descriptors through put/get (or staged), XFER_BATCH_WINDOW bytes in flight at
 * most. XFER_INPROGRESS keeps the posting's hold on the walk, so that the op outlives
 * operations that complete while posted: the caller releases it once done with the op. */
static xfer_status_t batch_post_each(batch_op_t *op)
{
    xfer_status_t status;

    xfer_batch_walk_init(&op->walk, &batch_each_ops, &op->args, 0);
    op->each = 1;
    xfer_batch_walk_fill(&op->walk);
    if ((op->walk.next == 0) && (op->walk.status != XFER_OK)) {
        status = op->walk.status;   /* nothing went: refuse the post */
        xfer_batch_walk_cleanup(&op->walk);
        op->each = 0;
        return status;
    }
    return XFER_INPROGRESS;
}

/* ---- posting -------------------------------------------------------------------------------- */

static const xfer_req_ops_t batch_req_ops = {NULL, xfer_batch_cancel, NULL};

/* Hold the notification behind the batch's data: the transport is given none, and the op's
 * copy goes alone once every descriptor has landed and the notifications before it have gone
 * (late_advance). */
static void note_hold(batch_op_t *op, size_t notify_len)
{
    op->args.notify     = NULL;
    op->args.notify_len = 0;
    op->note_state      = NOTE_MOVING;
    op->note_len        = notify_len;
}

xfer_status_t xfer_batch_post(xfer_batch_t *batch, const void *notify, size_t notify_len,
                              int timeout_ms, xfer_request_cb_t cb, void *user_data,
                              xfer_request_t **req_p)
{
    xfer_batch_func_t post;
    batch_op_t *op;
    xfer_context_t *ctx;
    xfer_endpoint_t *ep;
    xfer_request_t *req;
    xfer_status_t status;
    int64_t deadline;
    double timeout;
    int late, held;

    if (batch == NULL) {
        xfer_refuse(BATCH_SUBSYS, "xfer_batch_post: batch is NULL");
        return XFER_ERR_INVALID_PARAM;
    }
    ctx = batch->ctx;
    /* batch->ep is cleared (and the endpoint may go) under the lock: read it under it too;
     * op_begin takes the lock again (it nests) and keeps it on success */
    xfer_ctx_lock(ctx);
    if (batch->ep == NULL) {
        xfer_refuse(BATCH_SUBSYS, "xfer_batch_post: the batch's endpoint was "
                    "closed");
        xfer_ctx_unlock(ctx);
        return XFER_ERR_CONNECTION;
    }
    status = xfer_endpoint_op_begin(batch->ep, "xfer_batch_post", (void*)xfer_batch_post);
    xfer_ctx_unlock(ctx);
    if (status != XFER_OK) {
        return status;
    }
    post   = xfer_component_batch(batch->fw_iface->comp);
    status = XFER_ERR_INVALID_PARAM;
    if (batch->destroyed) {
        xfer_refuse(BATCH_SUBSYS, "xfer_batch_post: the batch was destroyed");
        goto out;
    }
    if ((notify == NULL) && (notify_len > 0)) {
        xfer_refuse(BATCH_SUBSYS, "xfer_batch_post: notification is NULL");
        goto out;
    }
    if ((notify != NULL) && (notify_len > ctx->fw_config.notify_max_len)) {
        xfer_refuse(BATCH_SUBSYS, "xfer_batch_post: a notification of %zu bytes "
                    "is longer than XFER_NOTIFY_MAX_LEN=%" PRIu64, notify_len,
                    ctx->fw_config.notify_max_len);
        goto out;
    }
    if ((notify != NULL) && (post == NULL)) {
        xfer_refuse(BATCH_SUBSYS, "xfer_batch_post: transport %s cannot carry "
                    "a batch's notification", batch->ep->transport);
        status = XFER_ERR_UNSUPPORTED;
        goto out;
    }
    if ((timeout_ms < 0) && (timeout_ms != XFER_BATCH_NO_TIMEOUT)) {
        xfer_refuse(BATCH_SUBSYS, "xfer_batch_post: timeout %d ms; give > 0, 0 "
                    "(XFER_BATCH_TIMEOUT) or XFER_BATCH_NO_TIMEOUT", timeout_ms);
        goto out;
    }
    /* a notification leaves late (a get's, after its reads), or is held behind one that does
     * (the notifications' order, above), or held for a staged batch's data */
    ep   = batch->ep;
    held = (notify != NULL) && (batch->staged || !ucs_list_is_empty(&ep->notify_late));
    late = (notify != NULL) && (held || !batch->is_put);
    /* room for the notification always: a transport that declines the batch has it staged */
    op   = calloc(1, sizeof(*op) + ((notify != NULL) ? notify_len : 0));
    req  = (op == NULL) ? NULL :
           xfer_request_new(ctx, XFER_REQ_BATCH, batch->fw_iface, &batch_req_ops, cb,
                            user_data);
    if (req == NULL) {
        free(op);
        status = XFER_ERR_NO_MEMORY;
        goto out;
    }
    op->comp.cb         = batch_op_comp_cb;
    op->args.size       = sizeof(op->args);
    op->args.is_put     = batch->is_put;
    op->args.iov        = batch->iov;
    op->args.count      = batch->count;
    op->args.memh       = batch->mem->memh[batch->fw_iface->index];
    op->args.rkey       = batch->rkey->rkey;
    /* the transport reads the op's copy until the batch completes (component.h) */
    op->args.notify     = (notify != NULL) ? op->note : NULL;
    op->args.notify_len = (notify != NULL) ? notify_len : 0;
    if (notify_len > 0) {
        memcpy(op->note, notify, notify_len);
    }
    op->ep              = ep;
    op->note_state      = NOTE_NONE;
    if (held) {
        note_hold(op, notify_len);
    }
    op->batch           = batch;
    op->req             = req;
    timeout             = (timeout_ms > 0) ? timeout_ms / 1000.0 :
                          (timeout_ms == 0) ? ctx->fw_config.batch_timeout : 0;
    op->deadline        = (timeout > 0) ? xfer_now_ms() + (int64_t)(timeout * 1000.0) :
                          INT64_MAX;
    op->args.deadline_ns = (op->deadline == INT64_MAX) ? 0 :
                           (uint64_t)op->deadline * 1000000ull;
    deadline            = op->deadline;
    req->batch_op       = op;
    batch->posts++;
    batch->mem->busy++;
    ucs_list_add_tail(&ctx->batch_ops, &op->list);

    op->staged = batch->staged;
    status     = ((post != NULL) && !op->staged) ? post(batch->ep->ep, &op->args, &op->comp) :
                                                   batch_post_each(op);
    if ((status == XFER_ERR_UNSUPPORTED) && !op->staged) {
        /* a batch declined before anything moved goes descriptor by descriptor, its
         * notification held for after the data: device memory staged where the transport
         * does not move it itself (shm: device memory and host memory of the peer's it has
         * not mapped), else through the transport's own put and get (verbs posts no batch of
         * GPU memory as one unit; shm none without cross-memory attach) */
        op->staged = (batch->mem->attr.type == XFER_MEM_CUDA) &&
                     !(batch->fw_iface->entry->attr.caps & XFER_CAP_MEM_CUDA);
        if ((notify != NULL) && !held) {
            held = late = 1;
            note_hold(op, notify_len);
        }
        status = batch_post_each(op);
    }
    if ((status == XFER_OK) && held) {
        /* moved while posting: its notification waits for its turn */
        op->args.landed = batch->count;
        op->note_state  = NOTE_READY;
        status          = XFER_INPROGRESS;
    }
    if (status == XFER_INPROGRESS) {
        if (late) {
            op->late = 1;
            ucs_list_add_tail(&ep->notify_late, &op->late_link);
        }
        batch_deadline_update(ctx, deadline);
        xfer_request_posted(req, req_p);
        status = XFER_OK;
        ep->batch_ops++;        /* an orderly close of ep flushes after it */
        if (op->each) {
            /* the posting's hold: the op may end now (every operation completed while
             * posted), its notification, on the late list, going at its turn */
            xfer_batch_walk_release(&op->walk);
        }
    } else {
        ucs_list_del(&op->list);
        batch->mem->busy--;
        batch->posts--;
        free(op);
        req->batch_op = NULL;
        if (status == XFER_OK) {
            /* the transport moved every descriptor while posting (memory it maps) */
            req->landed = batch->count;
            xfer_request_posted_done(req, batch->bytes, req_p);
        } else {
            xfer_request_discard(req);
        }
    }
out:
    xfer_ctx_unlock(ctx);
    return status;
}

/* ---- ending early: deadline and cancel ------------------------------------------------------
 *
 * Decided once, by the transport: a batch whose notification has not left ends now - the
 * request completes with status and what is known to have landed, the transport posts
 * nothing more of it and never sends the notification, and the op stays until the transport
 * has let go of what was in flight. One whose notification has left goes on: its request
 * completes with the target's answer, and the cancel reports XFER_ERR_BUSY. A batch posted one
 * by one (no notification) always stops. */

/* XFER_OK: op ended early with status (its request completed); XFER_ERR_BUSY: too late. */
static xfer_status_t batch_op_end_early(batch_op_t *op, xfer_status_t status)
{
    xfer_request_t *req = op->req;
    xfer_fw_iface_t *fi = op->batch->fw_iface;
    xfer_endpoint_t *ep = op->ep;
    xfer_status_t ret;

    if (op->note_state == NOTE_SENT) {
        op->deadline = INT64_MAX;
        return XFER_ERR_BUSY;   /* its notification left: the target's word completes it */
    }
    if (op->note_state == NOTE_READY) {
        /* the data is in, the notification still here: it ends, and never goes */
        op->req = NULL;
        req->batch_op = NULL;
        req->landed   = op->args.landed;
        xfer_request_complete(req, status, 0, 0);
        batch_op_end(op, status, op->args.landed);
        xfer_wake_locked(ep->ctx);
        return XFER_OK;
    }
    if (!op->each) {
        ret = (fi->comp->cancel != NULL) ? fi->comp->cancel(fi->iface, &op->comp, status) :
                                           XFER_ERR_BUSY;
        if (req->batch_op == NULL) {
            return XFER_OK;     /* the transport ended it inside cancel() */
        }
        if (ret != XFER_OK) {
            /* its notification left (or its end is already on its way): the target's word
             * completes it, the deadline no more */
            op->deadline = INT64_MAX;
            return XFER_ERR_BUSY;
        }
    }
    op->req       = NULL;
    op->deadline  = INT64_MAX;
    if (op->each) {
        xfer_batch_walk_stop(&op->walk, XFER_OK);
    }
    req->batch_op = NULL;
    req->landed   = op->args.landed;
    xfer_request_complete(req, status, 0, 0);
    if (op->late && (op->note_state == NOTE_MOVING)) {
        /* it sends no notification: what was held behind it may go */
        late_remove(op);
        late_advance(ep);
    }
    xfer_wake_locked(req->ctx);
    return XFER_OK;
}

xfer_status_t xfer_batch_cancel(xfer_request_t *req, xfer_status_t status)
{
    if (req->batch_op == NULL) {
        return XFER_OK;     /* it ended already */
    }
    return batch_op_end_early(req->batch_op, status);
}

unsigned xfer_batch_expire(xfer_context_t *ctx)
{
    int64_t now, next;
    unsigned count = 0;
    batch_op_t *op;
    int again;

    if (ctx->batch_deadline == INT64_MAX) {
        xfer_progress_hook_del(ctx, &ctx->batch_hook);     /* no deadline to keep */
        return 0;
    }
    now = xfer_now_ms();
    if (now < ctx->batch_deadline) {
        return 0;
    }
    /* from the start again after each one that ends: its end may end others (a notification
     * held behind it goes, and may complete at once) */
    do {
        again = 0;
        next  = INT64_MAX;
        ucs_list_for_each(op, &ctx->batch_ops, list) {
            if ((op->req == NULL) || (op->deadline == INT64_MAX)) {
                continue;
            }
            if (op->deadline <= now) {
                size_t count_desc = op->args.count, landed = op->args.landed;
                const char *peer  = op->batch->ep ? op->batch->ep->peer : "a closed endpoint";
                const char *name  = op->batch->fw_iface->entry->name;
                int is_put        = op->batch->is_put;

                /* op may be gone once it ended */
                if (batch_op_end_early(op, XFER_ERR_TIMEOUT) == XFER_OK) {
                    xfer_log(XFER_LOG_INFO, BATCH_SUBSYS, "a batch of %zu %s to %s over %s "
                             "passed its deadline with %zu descriptor(s) known landed; it "
                             "completes with XFER_ERR_TIMEOUT", count_desc,
                             is_put ? "puts" : "gets", peer, name, landed);
                    count++;
                } else {
                    xfer_log_at(XFER_LOG_DEBUG, BATCH_SUBSYS, "a batch of %zu %s to %s over "
                                "%s passed its deadline after its notification left: it "
                                "completes with the target's answer", count_desc,
                                is_put ? "puts" : "gets", peer, name);
                }
                again = 1;
                break;
            }
            if (op->deadline < next) {
                next = op->deadline;
            }
        }
    } while (again);
    ctx->batch_deadline = next;
    return count;
}

int xfer_batch_timeout(xfer_context_t *ctx)
{
    int64_t now;

    if (ctx->batch_deadline == INT64_MAX) {
        return -1;
    }
    now = xfer_now_ms();
    if (ctx->batch_deadline <= now) {
        return 0;
    }
    return (ctx->batch_deadline - now > INT_MAX) ? INT_MAX : (int)(ctx->batch_deadline - now);
}

void xfer_batch_ctx_cleanup(xfer_context_t *ctx)
{
    batch_op_t *op, *otmp;
    xfer_batch_t *batch, *btmp;

    /* the endpoints are gone, and with them every transport's hold on an op */
    ucs_list_for_each_safe(op, otmp, &ctx->batch_ops, list) {
        if (op->req != NULL) {
            op->req->batch_op = NULL;
        }
        ucs_list_del(&op->list);
        op->batch->mem->busy--;
        op->batch->posts--;
        if (op->each) {
            xfer_batch_walk_cleanup(&op->walk);
        }
        free(op);
    }
    ucs_list_for_each_safe(batch, btmp, &ctx->batches, ctx_link) {
        xfer_batch_free(batch);     /* off its endpoint's list too */
    }
}
