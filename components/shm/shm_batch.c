/*
 * Batches over shm.
 *
 * With cross-memory attach the whole batch is one BATCH frame: it names the initiator's
 * descriptor array (the framework's, valid until the batch completes), its length and the
 * target region, and carries the notification. The target reads the array by CMA, checks
 * every descriptor against its live registration before it moves a byte (a batch with one
 * bad descriptor moves nothing), moves the data with process_vm_readv/writev over iovec
 * arrays - one system call for up to IOV_MAX descriptors - hands the notification to the
 * framework, and answers BATCH_ACK with the count that landed.
 *
 * Without CMA every descriptor is an ordinary PUT or GET through the ring; a put batch's
 * NOTIFY frame follows its PUT frames in the ring, which the target works through in order, so
 * it is read after every one of them was copied into place; it names how many PUTs precede
 * it in its batch, and the target drops it when one of those was refused. A get batch's
 * NOTIFY goes once every get has its data.
 *
 * To memory the peer allocated with xfer_mem_alloc() and this side mapped (shm_rma.c), every
 * descriptor is a memcpy done before the post returns; the NOTIFY frame (after no PUT frame)
 * is written into the ring after the last copy, so the target reads it after the data. When
 * it could be written at once (or there is none) the batch is complete when the post returns.
 * CUDA memory on either side goes the same way, each descriptor copied by the CUDA driver
 * (shm_cuda.c) and all of them landed before the NOTIFY frame is written.
 *
 * Cancel: a BATCH or NOTIFY frame not yet written into the ring is voided (the target answers
 * or ignores it without touching memory); what the target already has runs to its end, and
 * the batch completes when its answers are in.
 */
#include "shm.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>

#define BATCH_IOV_CHUNK  1024   /* iovecs per process_vm_readv/writev (IOV_MAX on Linux) */

/* A batch through the ring, descriptor by descriptor. */
typedef struct shm_batch_sub {
    xfer_comp_t         comp;
    struct shm_batch    *b;
} shm_batch_sub_t;

typedef struct shm_batch {
    ucs_list_link_t     list;       /* iface->batches */
    xfer_ep_h           ep;         /* NULL once the ep is gone */
    xfer_comp_t         *comp;
    xfer_batch_args_t   *args;
    size_t              pending;    /* subs not completed, plus one while posting */
    size_t              landed;
    xfer_status_t       status;
    int                 stopped;
    int                 has_notify;
    xfer_comp_t         notify_comp;    /* the NOTIFY frame was written (or dropped) */
    xfer_shm_op_t       *notify_op;     /* carries the frame until then; NULL after */
    size_t              notify_len;
    shm_batch_sub_t     *subs;
    uint8_t             notify[];
} shm_batch_t;

static int notify_fits(xfer_ep_h ep, const xfer_batch_args_t *args)
{
    return (args->notify == NULL) || (args->notify_len <= xfer_shm_cell_payload(&ep->out));
}

/* ---- to mapped memory ----------------------------------------------------------------------- */

/* Every descriptor of args (checked) by memcpy into or out of the peer's memory mapped here. */
static void batch_copy_mapped(xfer_ep_h ep, const xfer_batch_args_t *args)
{
    xfer_rkey_h rkey = args->rkey;

    for (size_t i = 0; i < args->count; i++) {
        const xfer_batch_iov_t *v = &args->iov[i];
        uint8_t *remote           = rkey->map.data + (v->remote - rkey->addr);
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

        if (!xfer_shm_rkey_covers(rkey, v->remote, v->length)) {
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
    op->serial = ++ep->rma_posted;
    memcpy(op->key, args->notify, nlen);
    op->on_write = 1;
    memset(&hdr, 0, sizeof(hdr));
    hdr.type = XFER_SHM_F_NOTIFY;
    hdr.a    = 0;       /* no PUT frame precedes it */
    xfer_shm_tx_queue(ep, &op->tx, &hdr, op->key, nlen, 0, 0);
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
    status = xfer_shm_slot_alloc(ep, op, &id);
    if (status != XFER_OK) {
        xfer_shm_op_free(op);
        return status;
    }
    if (nlen > 0) {
        memcpy(op->key, args->notify, nlen);
    }
    op->len    = args->count;
    op->serial = ++ep->rma_posted;
    memset(&hdr, 0, sizeof(hdr));
    hdr.type  = XFER_SHM_F_BATCH;
    hdr.flags = (args->is_put ? 0 : XFER_SHM_FL_GET) |
                ((args->notify != NULL) ? XFER_SHM_FL_NOTIFY : 0);
    hdr.id    = id;
    hdr.a     = args->rkey->id;
    hdr.b     = (uint64_t)(uintptr_t)args->iov;
    hdr.c     = args->count;
    hdr.e     = args->rkey->cookie;
    xfer_shm_tx_queue(ep, &op->tx, &hdr, op->key, nlen, 0, 0);
    xfer_shm_tx_write(ep);
    return XFER_INPROGRESS;
}

xfer_status_t xfer_shm_rx_batch_ack(xfer_ep_h ep, const xfer_shm_frame_t *hdr,
                                    const uint8_t *payload, char *why, size_t why_size)
{
    xfer_shm_slot_t *slot = xfer_shm_slot_find(ep, hdr->id);
    xfer_shm_op_t *op     = (slot != NULL) ? slot->op : NULL;
    xfer_status_t status;

    (void)payload;
    if ((op == NULL) || (op->kind != XFER_SHM_OP_BATCH) || (hdr->len != 0) ||
        (hdr->a > op->len)) {
        snprintf(why, why_size, "a batch answer for request %llx (%llu landed), which is not "
                 "one of our batches in flight or not of its size", (unsigned long long)hdr->id,
                 (unsigned long long)hdr->a);
        return XFER_ERR_PROTOCOL;
    }
    status = xfer_shm_status_from_peer(hdr->status);
    if ((status == XFER_OK) && (hdr->a != op->len)) {
        snprintf(why, why_size, "a batch answered done with %llu of %zu descriptors",
                 (unsigned long long)hdr->a, op->len);
        return XFER_ERR_PROTOCOL;
    }
    xfer_shm_slot_free(ep, op->slot);
    xfer_shm_op_complete(op, status, hdr->a, 0);
    return XFER_OK;
}

/*
 * The iovecs of up to n descriptors from iov[0] (its first skip bytes already moved): ours
 * (the descriptors' remote side) in liov, the initiator's in riov, each merged where one
 * range ends at the next one's start - process_vm_readv/writev take the two lists as two
 * streams, so a side that is contiguous costs the kernel one range however scattered the
 * other is. Returns the bytes.
 */
static size_t batch_iov_build(const xfer_batch_iov_t *iov, uint64_t n, uint64_t skip,
                              struct iovec *liov, size_t *nl_p, struct iovec *riov,
                              size_t *nr_p)
{
    size_t nl = 0, nr = 0, want = 0;

    for (uint64_t k = 0; k < n; k++) {
        uint64_t o    = (k == 0) ? skip : 0;
        uint8_t *ours = (uint8_t*)(uintptr_t)(iov[k].remote + o);
        uint8_t *peer = (uint8_t*)(uintptr_t)(iov[k].local + o);
        size_t len    = iov[k].length - o;

        if (len == 0) {
            continue;
        }
        if ((nl > 0) && ((uint8_t*)liov[nl - 1].iov_base + liov[nl - 1].iov_len == ours)) {
            liov[nl - 1].iov_len += len;
        } else {
            liov[nl++] = (struct iovec){ours, len};
        }
        if ((nr > 0) && ((uint8_t*)riov[nr - 1].iov_base + riov[nr - 1].iov_len == peer)) {
            riov[nr - 1].iov_len += len;
        } else {
            riov[nr++] = (struct iovec){peer, len};
        }
        want += len;
    }
    *nl_p = nl;
    *nr_p = nr;
    return want;
}

/* The target: check every descriptor, then move them all. Returns the status to answer;
 * *landed_p the descriptors whose bytes all moved. */
static xfer_status_t batch_move(xfer_ep_h ep, const xfer_shm_frame_t *hdr, uint64_t *landed_p)
{
    int get               = (hdr->flags & XFER_SHM_FL_GET) != 0;
    uint64_t count        = hdr->c, done = 0, skip = 0;
    xfer_batch_iov_t *iov = NULL;
    struct iovec *liov = NULL, *riov = NULL;
    char why[XFER_REASON_MAX];
    xfer_status_t status;
    uint8_t *base;
    size_t rlen;

    *landed_p = 0;
    base = xfer_shm_region_find(ep->iface, hdr->a, hdr->e, &rlen);
    if (base == NULL) {
        xfer_log(XFER_LOG_WARN, XFER_SHM_SUBSYS, "refusing a batch: region %llu is not "
                 "registered here", (unsigned long long)hdr->a);
        return XFER_ERR_NOT_FOUND;
    }
    iov  = malloc(count * sizeof(*iov));
    liov = malloc(BATCH_IOV_CHUNK * sizeof(*liov));
    riov = malloc(BATCH_IOV_CHUNK * sizeof(*riov));
    if ((iov == NULL) || (liov == NULL) || (riov == NULL)) {
        status = XFER_ERR_NO_MEMORY;
        goto out;
    }
    status = xfer_shm_cma(ep, iov, hdr->b, count * sizeof(*iov), 0, why, sizeof(why));
    if (status != XFER_OK) {
        xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "a peer's batch: reading its descriptors: "
                 "%s", why);
        goto out;
    }
    for (uint64_t i = 0; i < count; i++) {
        uint64_t off = iov[i].remote - (uintptr_t)base;

        if ((iov[i].remote < (uintptr_t)base) || (off > rlen) || (iov[i].length > rlen - off) ||
            (iov[i].length > SSIZE_MAX)) {
            xfer_log(XFER_LOG_WARN, XFER_SHM_SUBSYS, "refusing a batch: descriptor %llu "
                     "(0x%llx+%llu) is outside region %llu", (unsigned long long)i,
                     (unsigned long long)iov[i].remote, (unsigned long long)iov[i].length,
                     (unsigned long long)hdr->a);
            status = XFER_ERR_OUT_OF_RANGE;
            goto out;
        }
    }
    /* chunks of descriptors, each side's ranges merged where they touch; a short transfer
     * goes on from where it stopped */
    for (;;) {
        uint64_t skip_left;
        size_t nl, nr, want;
        ssize_t got;

        while ((done < count) && (iov[done].length == skip)) {
            done++;             /* finished, or empty */
            skip      = 0;
            *landed_p = done;
        }
        if (done == count) {
            break;
        }
        want = batch_iov_build(iov + done, (count - done < BATCH_IOV_CHUNK) ?
                               count - done : BATCH_IOV_CHUNK, skip, liov, &nl, riov, &nr);
        got = get ? process_vm_writev(ep->peer_pid, liov, nl, riov, nr, 0) :
                    process_vm_readv(ep->peer_pid, liov, nl, riov, nr, 0);
        if (got <= 0) {
            xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "a peer's batch: %s of %zu bytes "
                     "in pid %d failed: %s", get ? "process_vm_writev" : "process_vm_readv",
                     want, (int)ep->peer_pid, (got == 0) ? "no progress" : strerror(errno));
            status = ((got < 0) && (errno == ESRCH)) ? XFER_ERR_CONNECTION : XFER_ERR_IO;
            goto out;
        }
        ep->rx_copied += (uint64_t)got;
        /* past the descriptors the transfer finished */
        for (skip_left = (uint64_t)got; skip_left > 0;) {
            uint64_t left = iov[done].length - skip;

            if (skip_left < left) {
                skip     += skip_left;
                break;
            }
            skip_left -= left;
            skip       = 0;
            done++;
            *landed_p  = done;
        }
    }
    status = XFER_OK;
out:
    free(iov);
    free(liov);
    free(riov);
    return status;
}

xfer_status_t xfer_shm_rx_batch(xfer_ep_h ep, const xfer_shm_frame_t *hdr,
                                const uint8_t *payload, char *why, size_t why_size)
{
    const xfer_iface_params_t *params = &ep->iface->params;
    xfer_shm_frame_t ack;
    xfer_status_t status;
    uint64_t landed = 0;

    if (!ep->cma || (hdr->c == 0) || (hdr->c > XFER_SHM_BATCH_MAX) ||
        (hdr->len > params->max_notify_len) ||
        (!(hdr->flags & XFER_SHM_FL_NOTIFY) && (hdr->len != 0))) {
        snprintf(why, why_size, "a batch of %llu descriptors with %u bytes of notification%s",
                 (unsigned long long)hdr->c, hdr->len,
                 ep->cma ? "" : " on an endpoint without CMA");
        return XFER_ERR_PROTOCOL;
    }
    if (hdr->flags & XFER_SHM_FL_VOID) {
        status = XFER_ERR_CANCELED;     /* cancelled before it was written */
    } else {
        status = batch_move(ep, hdr, &landed);
    }
    if ((status == XFER_OK) && (hdr->flags & XFER_SHM_FL_NOTIFY) &&
        (xfer_shm_notify_deliver(ep, payload, hdr->len) != XFER_OK)) {
        return XFER_OK;     /* the ep failed */
    }
    if (status == XFER_ERR_CONNECTION) {
        xfer_shm_ep_fail_later(ep, status, "the peer's process went away during its batch");
    }
    memset(&ack, 0, sizeof(ack));
    ack.type   = XFER_SHM_F_BATCH_ACK;
    ack.id     = hdr->id;
    ack.status = (int32_t)status;
    ack.a      = landed;
    if (xfer_shm_tx_queue(ep, NULL, &ack, NULL, 0, 0, 1) != XFER_OK) {
        snprintf(why, why_size, "out of memory for an answer");
        return XFER_ERR_NO_MEMORY;
    }
    xfer_shm_tx_write(ep);
    return XFER_OK;
}

/* ---- descriptor by descriptor, through the ring --------------------------------------------- */

/* One of the batch's holds ended (a descriptor, the NOTIFY frame, the posting). */
static void batch_ring_release(shm_batch_t *b);

static void batch_notify_cb(xfer_comp_t *self, xfer_status_t status, size_t length,
                            uint64_t tag)
{
    shm_batch_t *b = ucs_container_of(self, shm_batch_t, notify_comp);

    (void)status;
    (void)length;
    (void)tag;
    b->notify_op = NULL;
    batch_ring_release(b);
}

/* The NOTIFY frame goes through an op of its own that completes once the frame is written,
 * so that the batch outlives it and a cancel can still void it. */
static void batch_notify_queue(shm_batch_t *b, uint64_t puts)
{
    xfer_shm_frame_t hdr;
    xfer_shm_op_t *op;

    op = xfer_shm_op_new(b->ep->iface, b->ep, XFER_SHM_OP_SEND, &b->notify_comp, b->notify_len);
    if (op == NULL) {
        xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "out of memory for a batch notification");
        if (b->status == XFER_OK) {
            b->status = XFER_ERR_NO_MEMORY;
        }
        return;
    }
    memcpy(op->key, b->notify, b->notify_len);
    op->on_write      = 1;
    b->notify_comp.cb = batch_notify_cb;
    b->notify_op      = op;
    b->pending++;
    memset(&hdr, 0, sizeof(hdr));
    hdr.type = XFER_SHM_F_NOTIFY;
    hdr.a    = puts;
    xfer_shm_tx_queue(b->ep, &op->tx, &hdr, op->key, b->notify_len, 0, 0);
    xfer_shm_tx_write(b->ep);
}

static void batch_ring_release(shm_batch_t *b)
{
    if (--b->pending > 0) {
        return;
    }
    if (!b->args->is_put && b->has_notify && (b->status == XFER_OK) && !b->stopped &&
        (b->ep != NULL) && (b->notify_comp.cb == NULL)) {
        batch_notify_queue(b, 0);   /* every get has its data: the target may know */
        if (b->pending > 0) {
            return;
        }
    }
    ucs_list_del(&b->list);
    b->comp->cb(b->comp, b->status, b->landed, 0);
    free(b->subs);
    free(b);
}

static void batch_sub_cb(xfer_comp_t *self, xfer_status_t status, size_t length, uint64_t tag)
{
    shm_batch_sub_t *sub = ucs_container_of(self, shm_batch_sub_t, comp);
    shm_batch_t *b       = sub->b;

    (void)length;
    (void)tag;
    if (status == XFER_OK) {
        b->landed++;
        b->args->landed = b->landed;
    } else if (b->status == XFER_OK) {
        b->status = status;
    }
    batch_ring_release(b);
}

static xfer_status_t batch_post_ring(xfer_ep_h ep, xfer_batch_args_t *args, xfer_comp_t *comp)
{
    size_t nlen = (args->notify != NULL) ? args->notify_len : 0;
    shm_batch_t *b = calloc(1, sizeof(*b) + nlen);
    size_t posted  = 0;

    if (b == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    b->subs = calloc(args->count, sizeof(*b->subs));
    if (b->subs == NULL) {
        free(b);
        return XFER_ERR_NO_MEMORY;
    }
    b->ep         = ep;
    b->comp       = comp;
    b->args       = args;
    b->status     = XFER_OK;
    b->has_notify = (args->notify != NULL);
    b->notify_len = nlen;
    if (nlen > 0) {
        memcpy(b->notify, args->notify, nlen);
    }
    b->pending = 1;
    ucs_list_add_tail(&ep->iface->batches, &b->list);
    for (size_t i = 0; i < args->count; i++) {
        const xfer_batch_iov_t *v = &args->iov[i];
        xfer_status_t status;

        b->subs[i].comp.cb = batch_sub_cb;
        b->subs[i].b       = b;
        status = xfer_shm_rma_post(ep, args->is_put ? XFER_SHM_OP_PUT : XFER_SHM_OP_GET,
                                   (void*)(uintptr_t)v->local, v->length, NULL, v->remote,
                                   args->rkey, &b->subs[i].comp);
        if (status != XFER_INPROGRESS) {
            if (i == 0) {
                ucs_list_del(&b->list);
                free(b->subs);
                free(b);
                return status;
            }
            b->status = status;
            break;
        }
        b->pending++;
        posted++;
    }
    if (args->is_put && b->has_notify && (b->status == XFER_OK)) {
        batch_notify_queue(b, posted);  /* behind every PUT frame of the batch */
    }
    b->pending--;   /* the posting's own hold; the others end only from progress */
    return XFER_INPROGRESS;
}

xfer_status_t xfer_shm_rx_notify(xfer_ep_h ep, const xfer_shm_frame_t *hdr,
                                 const uint8_t *payload, char *why, size_t why_size)
{
    if ((hdr->len > ep->iface->params.max_notify_len) || (hdr->a > ep->puts_rx)) {
        snprintf(why, why_size, "a notification of %u bytes after %llu puts (%llu came)",
                 hdr->len, (unsigned long long)hdr->a, (unsigned long long)ep->puts_rx);
        return XFER_ERR_PROTOCOL;
    }
    if (hdr->flags & XFER_SHM_FL_VOID) {
        return XFER_OK;
    }
    if ((ep->put_refused_at != 0) && (ep->put_refused_at > ep->puts_rx - hdr->a)) {
        xfer_log(XFER_LOG_WARN, XFER_SHM_SUBSYS, "a batch notification is dropped: a put of "
                 "its batch was refused");
        return XFER_OK;
    }
    (void)xfer_shm_notify_deliver(ep, payload, hdr->len);
    return XFER_OK;
}

/* ---- entry points --------------------------------------------------------------------------- */

xfer_status_t xfer_shm_notify_deliver(xfer_ep_h ep, const void *msg, size_t len)
{
    const xfer_iface_params_t *params = &ep->iface->params;

    if ((params->notify == NULL) ||
        (params->notify(params->fw_arg, ep->fw_ep, msg, len) != 0)) {
        xfer_shm_ep_fail_later(ep, XFER_ERR_NO_RESOURCE, "a batch notification of the peer "
                               "was refused (too many not taken)");
        return XFER_ERR_NO_RESOURCE;
    }
    ep->rx_yield = 1;   /* the application hears of it at the end of this round, not 256
                         * frames later */
    return XFER_OK;
}

xfer_status_t xfer_shm_batch(xfer_ep_h ep, xfer_batch_args_t *args, xfer_comp_t *comp)
{
    xfer_status_t status = xfer_shm_ep_check(ep);

    if (status != XFER_OK) {
        return status;
    }
    if ((args == NULL) || (comp == NULL) || (args->count == 0)) {
        return XFER_ERR_INVALID_PARAM;
    }
    if (args->rkey->pid != (uint32_t)ep->peer_pid) {
        xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "batch with a key of pid %u on an endpoint "
                 "to pid %d", args->rkey->pid, (int)ep->peer_pid);
        return XFER_ERR_INVALID_PARAM;
    }
    if (!notify_fits(ep, args)) {
        xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "a notification of %zu bytes does not fit "
                 "a cell of the peer's ring (%zu bytes of payload, XFER_SHM_CELL_SIZE)",
                 args->notify_len, xfer_shm_cell_payload(&ep->out));
        return XFER_ERR_UNSUPPORTED;
    }
    if (xfer_shm_cuda_moves(args->memh, args->rkey)) {
        if (!xfer_shm_cuda_reaches(ep, args->rkey)) {
            xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "a batch of CUDA memory to pid %d: the "
                     "target's region is host memory not mapped here (only memory from "
                     "xfer_mem_alloc is), and batches are not staged", (int)ep->peer_pid);
            return XFER_ERR_UNSUPPORTED;
        }
        return batch_post_mapped(ep, args, comp);
    }
    if (xfer_shm_rkey_mapped(ep, args->rkey)) {
        return batch_post_mapped(ep, args, comp);
    }
    if (ep->cma && (args->count <= XFER_SHM_BATCH_MAX)) {
        return batch_post_cma(ep, args, comp);
    }
    return batch_post_ring(ep, args, comp);
}

/* Cancel a batch: void its frame when it is not written yet; either way it completes when
 * its answers are in. */
xfer_status_t xfer_shm_batch_cancel(xfer_iface_h iface, xfer_comp_t *comp, xfer_status_t status)
{
    shm_batch_t *b;
    xfer_ep_h ep;

    (void)status;
    ucs_list_for_each(b, &iface->batches, list) {
        if (b->comp == comp) {
            b->stopped = 1;
            if ((b->notify_op != NULL) && !b->notify_op->tx.started) {
                b->notify_op->tx.hdr.flags |= XFER_SHM_FL_VOID;
            }
            return XFER_OK;
        }
    }
    ucs_list_for_each(ep, &iface->eps, list) {
        for (uint32_t i = 0; i < ep->num_slots; i++) {
            xfer_shm_op_t *op = ep->slots[i].op;

            if ((ep->slots[i].kind == XFER_SHM_SLOT_OP) && (op != NULL) &&
                (op->kind == XFER_SHM_OP_BATCH) && (op->comp == comp)) {
                if (!op->tx.started) {
                    op->tx.hdr.flags |= XFER_SHM_FL_VOID;
                }
                return XFER_OK;
            }
        }
    }
    return XFER_ERR_NOT_FOUND;
}

/* The ep goes: ring batches lose it (their subs complete through the ep's teardown). */
void xfer_shm_batch_ep_gone(xfer_ep_h ep)
{
    shm_batch_t *b;

    ucs_list_for_each(b, &ep->iface->batches, list) {
        if (b->ep == ep) {
            b->ep = NULL;
        }
    }
}
