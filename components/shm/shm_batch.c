/*
 * Batches over shm, the initiator's side (the target's is shm_batch_rx.c).
 *
 * With cross-memory attach the whole batch is one BATCH frame: it names the initiator's
 * descriptor array (the framework's, valid until the batch completes), its length and the
 * target region, and carries the notification. The target reads the array by CMA, a chunk
 * at a time, checks every descriptor against its live registration before it moves a byte (a
 * batch with one bad descriptor moves nothing), moves the data with process_vm_readv/writev
 * over iovec arrays - one system call for up to IOV_MAX descriptors - hands the notification
 * to the framework, and answers BATCH_ACK with the count that landed.
 *
 * Without CMA, with more descriptors than one BATCH frame names, or with a notification longer
 * than one cell of the ring carries, shm declines the batch before moving anything, and the
 * framework walks it through shm's own put and get (framework/batch.c), its notification held
 * until the data is in and then posted alone: a batch of no descriptors, one NOTIFY frame
 * behind everything in the ring. A notification of any length up to XFER_NOTIFY_MAX_LEN goes:
 * one longer than its first cell goes on in DATA frames, and the target delivers it once whole.
 *
 * To memory the peer allocated with xfer_mem_alloc() and this side mapped (shm_rma.c), every
 * descriptor is a memcpy done before the post returns; the NOTIFY frame (after no PUT frame)
 * is written into the ring after the last copy, so the target reads it after the data. When
 * it could be written at once (or there is none) the batch is complete when the post returns.
 * CUDA memory on either side goes the same way, each descriptor copied by the CUDA driver
 * (shm_cuda.c) and all of them landed before the NOTIFY frame is written.
 *
 * Cancel: a BATCH or NOTIFY frame not yet written into the ring is voided (the target answers
 * or ignores it without touching memory). A BATCH frame the target has is stopped through its
 * stop word, which the target reads (CMA) before every slice it moves - like the deadline the
 * word starts with - so that at most one more slice lands; the batch completes when its answer
 * is in. Once the frame that carries the notification is in the ring the target will deliver
 * it: the cancel is too late (XFER_ERR_BUSY).
 */
#include "shm.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A batch copied into or out of the peer's mapped memory a slice at a time, from progress (a
 * batch walk, engine.h, for its counts and holds only). */
typedef struct shm_batch {
    ucs_list_link_t     list;       /* iface->batches */
    ucs_list_link_t     work_link;  /* iface->batch_work while copies of it are left */
    int                 working;
    xfer_ep_h           ep;         /* NULL once the ep is gone */
    xfer_comp_t         *comp;
    xfer_cancel_hook_t  hook;       /* on comp until it completes */
    xfer_batch_args_t   *args;
    xfer_batch_walk_t   walk;       /* next: the first descriptor not posted or copied */
    uint64_t            offset;     /* mapped: bytes of iov[walk.next] copied */
    int                 notify_sent;    /* its NOTIFY frame is in the peer's ring */
    xfer_comp_t         notify_comp;    /* the NOTIFY frame was written (or dropped) */
    xfer_shm_op_t       *notify_op;     /* carries the frame until then; NULL after */
} shm_batch_t;

/* Whether args' notification fits the first cell of a frame (a BATCH frame carries it only
 * then; a NOTIFY frame longer than that goes on in DATA frames). */
static int notify_fits(xfer_ep_h ep, const xfer_batch_args_t *args)
{
    return (args->notify == NULL) || (args->notify_len <= xfer_shm_cell_payload(&ep->out));
}

/* A NOTIFY frame's b: the notification's whole length when it does not fit its first cell. */
static uint64_t notify_spans(xfer_ep_h ep, size_t len)
{
    return (len > xfer_shm_cell_payload(&ep->out)) ? len : 0;
}

/* ---- to mapped memory ----------------------------------------------------------------------- */

/* Every descriptor of args (checked) by memcpy into or out of the peer's memory mapped here. */
static void batch_copy_mapped(xfer_ep_h ep, const xfer_batch_args_t *args)
{
    xfer_rkey_h rkey = args->rkey;

    for (size_t i = 0; i < args->count; i++) {
        const xfer_batch_iov_t *v = &args->iov[i];
        uint8_t *remote           = rkey->map.data + (v->remote - rkey->k.addr);
        void *local               = (void*)(uintptr_t)v->local;

        if (v->length == 0) {
            continue;
        }
        if (args->is_put) {
            xfer_shm_copy(ep->iface, remote, local, v->length);
        } else {
            xfer_shm_copy(ep->iface, local, remote, v->length);
        }
    }
}

static uint64_t batch_bytes(const xfer_batch_args_t *args)
{
    uint64_t bytes = 0;

    for (size_t i = 0; i < args->count; i++) {
        bytes += args->iov[i].length;
    }
    return bytes;
}

/* Cancel a batch that goes as a frame (BATCH by CMA, or the NOTIFY behind mapped copies):
 * a frame not written yet is voided; a BATCH frame the target has is stopped at its next
 * slice, unless it carries the notification. Either way it completes with its answer. */
static xfer_status_t frame_cancel(xfer_cancel_hook_t *hook, xfer_status_t status)
{
    xfer_shm_op_t *op = ucs_container_of(hook, xfer_shm_op_t, hook);

    (void)status;
    if (!op->tx.started) {
        op->tx.hdr.flags |= XFER_SHM_FL_VOID;
    } else if ((op->tx.hdr.type == XFER_SHM_F_NOTIFY) ||
               (op->tx.hdr.flags & XFER_SHM_FL_NOTIFY)) {
        return XFER_ERR_BUSY;   /* the target has the notification */
    } else {
        op->stop_ns = XFER_SHM_BATCH_STOP;  /* the target stops at its next slice */
    }
    return XFER_OK;
}

/* Cancel a batch copied into mapped memory from progress: no more copies, its NOTIFY voided
 * while unwritten; it completes once that frame is written or dropped. */
static xfer_status_t copies_cancel(xfer_cancel_hook_t *hook, xfer_status_t status)
{
    shm_batch_t *b = ucs_container_of(hook, shm_batch_t, hook);

    (void)status;
    if (b->notify_sent || ((b->notify_op != NULL) && b->notify_op->tx.started)) {
        return XFER_ERR_BUSY;   /* the target has its notification */
    }
    xfer_batch_walk_stop(&b->walk, XFER_OK);
    if (b->notify_op != NULL) {
        b->notify_op->tx.hdr.flags |= XFER_SHM_FL_VOID;
    }
    return XFER_OK;
}

static xfer_status_t batch_post_mapped_sliced(xfer_ep_h ep, xfer_batch_args_t *args,
                                              xfer_comp_t *comp);

static xfer_status_t batch_post_mapped(xfer_ep_h ep, xfer_batch_args_t *args, xfer_comp_t *comp)
{
    size_t nlen       = (args->notify != NULL) ? args->notify_len : 0;
    xfer_rkey_h rkey  = args->rkey;
    xfer_shm_frame_t hdr;
    xfer_shm_op_t *op;
    xfer_status_t status;

    /* the framework checked the list against the key's packed bounds; the mapping covers the
     * shm part's, which the peer wrote separately */
    for (size_t i = 0; i < args->count; i++) {
        const xfer_batch_iov_t *v = &args->iov[i];

        if (!xfer_range_within(rkey->k.addr, rkey->k.length, v->remote, v->length)) {
            xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "batch descriptor %zu (%llu bytes at "
                     "0x%llx) lies outside the peer's region", i,
                     (unsigned long long)v->length, (unsigned long long)v->remote);
            return XFER_ERR_OUT_OF_RANGE;
        }
    }
    if (xfer_shm_cuda_moves(args->memh, rkey)) {
        /* all copied by the CUDA driver before the notification goes */
        status = xfer_shm_cuda_batch(ep, args);
        if (status != XFER_OK) {
            return status;
        }
    } else if (batch_bytes(args) > XFER_IFACE_FAIR_SLICE(&ep->iface->params)) {
        return batch_post_mapped_sliced(ep, args, comp);
    } else {
        batch_copy_mapped(ep, args);
    }
    args->landed = args->count;
    /* Done when the notification is in the ring, which the target reads after the data (the
     * ring's release store orders it after the copies): at once when the ring has room and
     * nothing queued before it, else once it is written. */
    if ((args->notify == NULL) ||
        xfer_shm_tx_inline(ep, XFER_SHM_F_NOTIFY, 0, 0, args->notify, (uint32_t)nlen)) {
        return XFER_OK;
    }
    op = xfer_shm_op_new(ep->iface, ep, XFER_SHM_OP_BATCH, comp, nlen);
    if (op == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    op->len    = args->count;
    op->serial = xfer_flushes_posted(&ep->flushes);
    memcpy(op->key, args->notify, nlen);
    op->on_write = 1;
    memset(&hdr, 0, sizeof(hdr));
    hdr.type = XFER_SHM_F_NOTIFY;
    hdr.a    = 0;       /* no PUT frame precedes it */
    hdr.b    = notify_spans(ep, nlen);
    xfer_shm_tx_queue(ep, &op->tx, &hdr, op->key, nlen, 0, 0);
    xfer_comp_hook(comp, &op->hook, frame_cancel);     /* off again at its completion */
    xfer_shm_tx_write(ep);
    return XFER_INPROGRESS;
}

/* ---- one frame, by CMA ---------------------------------------------------------------------- */

static xfer_status_t batch_post_cma(xfer_ep_h ep, xfer_batch_args_t *args, xfer_comp_t *comp)
{
    size_t nlen = (args->notify != NULL) ? args->notify_len : 0;
    xfer_shm_frame_t hdr;
    xfer_shm_op_t *op;
    xfer_status_t status;
    uint64_t id;

    op = xfer_shm_op_new(ep->iface, ep, XFER_SHM_OP_BATCH, comp, nlen);
    if (op == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    status = xfer_slot_alloc(&ep->slots, XFER_SHM_SLOT_BATCH, op, &id, &op->slot);
    if (status != XFER_OK) {
        xfer_shm_op_free(op);
        return status;
    }
    if (nlen > 0) {
        memcpy(op->key, args->notify, nlen);
    }
    op->len    = args->count;
    op->serial = xfer_flushes_posted(&ep->flushes);
    memset(&hdr, 0, sizeof(hdr));
    hdr.type  = XFER_SHM_F_BATCH;
    hdr.flags = (args->is_put ? 0 : XFER_SHM_FL_GET) |
                ((args->notify != NULL) ? XFER_SHM_FL_NOTIFY : 0);
    hdr.id    = id;
    hdr.a     = args->rkey->k.id;
    hdr.b     = (uint64_t)(uintptr_t)args->iov;
    hdr.c     = args->count;
    op->stop_ns = (args->size >= offsetof(xfer_batch_args_t, deadline_ns) +
                                 sizeof(args->deadline_ns)) ? args->deadline_ns : 0;
    hdr.d     = (uint64_t)(uintptr_t)&op->stop_ns;      /* the target reads it each slice */
    hdr.e     = args->rkey->k.key;
    xfer_shm_tx_queue(ep, &op->tx, &hdr, op->key, nlen, 0, 0);
    xfer_comp_hook(comp, &op->hook, frame_cancel);     /* off again at its completion */
    xfer_shm_tx_write(ep);
    return XFER_INPROGRESS;
}

xfer_status_t xfer_shm_rx_batch_ack(xfer_ep_h ep, const xfer_shm_frame_t *hdr,
                                    const uint8_t *payload, char *why, size_t why_size)
{
    xfer_shm_op_t *op = xfer_slot_answered(&ep->slots, hdr->id, XFER_SHM_SLOT_BATCH,
                                           "a batch answer", why, why_size);
    xfer_status_t status;

    (void)payload;
    if (op == NULL) {
        return XFER_ERR_PROTOCOL;
    }
    if ((hdr->len != 0) || (hdr->a > op->len)) {
        snprintf(why, why_size, "a batch answer of %u bytes says %llu of %zu descriptors "
                 "landed", hdr->len, (unsigned long long)hdr->a, op->len);
        return XFER_ERR_PROTOCOL;
    }
    status = xfer_shm_status_from_peer(hdr->status);
    if ((status == XFER_OK) && (hdr->a != op->len)) {
        snprintf(why, why_size, "a batch answered done with %llu of %zu descriptors",
                 (unsigned long long)hdr->a, op->len);
        return XFER_ERR_PROTOCOL;
    }
    xfer_slot_free(&ep->slots, op->slot);
    xfer_shm_op_complete(op, status, hdr->a, 0);
    return XFER_OK;
}

/* ---- the notification behind a mapped batch's copies --------------------------------------- */

static void batch_notify_cb(xfer_comp_t *self, xfer_status_t status, size_t length,
                            uint64_t tag)
{
    shm_batch_t *b = ucs_container_of(self, shm_batch_t, notify_comp);

    (void)length;
    (void)tag;
    b->notify_sent = (status == XFER_OK) && !b->walk.stopped;
    b->notify_op   = NULL;
    xfer_batch_walk_release(&b->walk);
}

/* The NOTIFY frame goes through an op of its own that completes once the frame is written,
 * so that the batch outlives it and a cancel can still void it. */
static void batch_notify_queue(shm_batch_t *b)
{
    size_t nlen = b->args->notify_len;
    xfer_shm_frame_t hdr;
    xfer_shm_op_t *op;

    op = xfer_shm_op_new(b->ep->iface, b->ep, XFER_SHM_OP_SEND, &b->notify_comp, nlen);
    if (op == NULL) {
        xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "out of memory for a batch notification");
        xfer_batch_walk_stop(&b->walk, XFER_ERR_NO_MEMORY);
        return;
    }
    memcpy(op->key, b->args->notify, nlen);
    op->on_write      = 1;
    b->notify_comp.cb = batch_notify_cb;
    b->notify_op      = op;
    xfer_batch_walk_hold(&b->walk);
    memset(&hdr, 0, sizeof(hdr));
    hdr.type = XFER_SHM_F_NOTIFY;
    hdr.b    = notify_spans(b->ep, nlen);
    xfer_shm_tx_queue(b->ep, &op->tx, &hdr, op->key, nlen, 0, 0);
    xfer_shm_tx_write(b->ep);
}

/* Every hold of the batch ended (its copies, the NOTIFY frame): it completes. */
static void batch_end(xfer_batch_walk_t *w)
{
    shm_batch_t *b = ucs_container_of(w, shm_batch_t, walk);

    if (b->working) {
        ucs_list_del(&b->work_link);
    }
    ucs_list_del(&b->list);
    xfer_batch_walk_complete(w, b->comp);
    free(b);
}

static const xfer_batch_walk_ops_t batch_mapped_ops = {
    .done = batch_end,
};

static shm_batch_t *batch_new(xfer_ep_h ep, xfer_batch_args_t *args, xfer_comp_t *comp)
{
    shm_batch_t *b = calloc(1, sizeof(*b));

    if (b == NULL) {
        return NULL;
    }
    xfer_batch_walk_init(&b->walk, &batch_mapped_ops, args, 1);
    b->ep         = ep;
    b->comp       = comp;
    b->args       = args;
    ucs_list_add_tail(&ep->iface->batches, &b->list);
    xfer_comp_hook(comp, &b->hook, copies_cancel);     /* off again in batch_end() */
    return b;
}

/* ---- to mapped memory, a slice at a time ---------------------------------------------------- */

/* Copy up to budget bytes of b into or out of the peer's mapped memory; 1 when all are. */
static int mapped_copy(shm_batch_t *b, uint64_t budget)
{
    const xfer_batch_args_t *args = b->args;
    uint64_t copied               = 0;

    while ((b->walk.next < args->count) && (copied < budget)) {
        const xfer_batch_iov_t *v = &args->iov[b->walk.next];
        uint8_t *remote = args->rkey->map.data + (v->remote - args->rkey->k.addr) + b->offset;
        uint8_t *local  = (uint8_t*)(uintptr_t)v->local + b->offset;
        uint64_t len    = v->length - b->offset;

        if (len > budget - copied) {
            len = budget - copied;
        }
        if (len > 0) {
            if (args->is_put) {
                xfer_shm_copy(b->ep->iface, remote, local, len);
            } else {
                xfer_shm_copy(b->ep->iface, local, remote, len);
            }
        }
        copied    += len;
        b->offset += len;
        if (b->offset == v->length) {
            b->offset = 0;
            b->walk.next++;
            b->walk.landed = b->walk.next;
            b->args->landed = b->walk.landed;
        }
    }
    return b->walk.next == args->count;
}

/* A mapped batch larger than a slice: copied from progress, a slice each round. */
static xfer_status_t batch_post_mapped_sliced(xfer_ep_h ep, xfer_batch_args_t *args,
                                              xfer_comp_t *comp)
{
    shm_batch_t *b = batch_new(ep, args, comp);

    if (b == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    b->working = 1;
    ucs_list_add_tail(&ep->iface->batch_work, &b->work_link);
    return XFER_INPROGRESS;
}

unsigned xfer_shm_batch_work(xfer_iface_h iface)
{
    uint64_t slice = XFER_IFACE_FAIR_SLICE(&iface->params);
    unsigned long n;

    /* one slice of each batch with copies left, in turn */
    for (n = ucs_list_length(&iface->batch_work);
         (n > 0) && !ucs_list_is_empty(&iface->batch_work); n--) {
        shm_batch_t *b = ucs_list_extract_head(&iface->batch_work, shm_batch_t, work_link);

        b->working = 0;
        if (!b->walk.stopped && (b->ep != NULL) && (b->ep->fail.state == XFER_EP_CONNECTED) &&
            !mapped_copy(b, slice)) {
            b->working = 1;
            ucs_list_add_tail(&iface->batch_work, &b->work_link);
            continue;
        }
        if ((b->ep == NULL) || (b->ep->fail.state != XFER_EP_CONNECTED)) {
            xfer_batch_walk_stop(&b->walk, (b->ep != NULL) ? b->ep->fail.status :
                                                             XFER_ERR_CANCELED);
        } else if (!b->walk.stopped && (b->args->notify != NULL)) {
            batch_notify_queue(b);      /* after the last copy: the target reads it after */
        }
        xfer_batch_walk_release(&b->walk);
    }
    return 0;
}

/* ---- entry points --------------------------------------------------------------------------- */

xfer_status_t xfer_shm_batch(xfer_ep_h ep, xfer_batch_args_t *args, xfer_comp_t *comp)
{
    xfer_status_t status = xfer_shm_ep_check(ep);

    if (status != XFER_OK) {
        return status;
    }
    if ((args->count == 0) && (args->notify == NULL)) {
        return XFER_ERR_INVALID_PARAM;
    }
    if (args->rkey->pid != (uint32_t)ep->peer_pid) {
        xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "batch with a key of pid %u on an endpoint "
                 "to pid %d", args->rkey->pid, (int)ep->peer_pid);
        return XFER_ERR_INVALID_PARAM;
    }
    if (args->count == 0) {
        return batch_post_mapped(ep, args, comp);  /* a notification alone, behind the ring */
    }
    if (xfer_shm_cuda_moves(args->memh, args->rkey)) {
        if (!xfer_shm_cuda_reaches(ep, args->rkey)) {
            /* host memory of the target's not mapped here: the framework stages it */
            return XFER_ERR_UNSUPPORTED;
        }
        return batch_post_mapped(ep, args, comp);
    }
    if (xfer_shm_rkey_mapped(ep, args->rkey)) {
        return batch_post_mapped(ep, args, comp);
    }
    if (ep->cma && (args->count <= XFER_SHM_BATCH_MAX) && notify_fits(ep, args)) {
        return batch_post_cma(ep, args, comp);
    }
    return XFER_ERR_UNSUPPORTED;    /* the framework walks it through put and get */
}

/* The ep goes: ring batches lose it (what they posted completes through the ep's teardown). */
void xfer_shm_batch_ep_gone(xfer_ep_h ep)
{
    shm_batch_t *b, *tmp;

    ucs_list_for_each_safe(b, tmp, &ep->iface->batches, list) {
        if (b->ep != ep) {
            continue;
        }
        b->ep = NULL;
        if (b->working) {
            /* copies left: they end with the endpoint */
            ucs_list_del(&b->work_link);
            b->working = 0;
            xfer_batch_walk_stop(&b->walk, XFER_ERR_CANCELED);
            xfer_batch_walk_release(&b->walk);
        }
    }
}
