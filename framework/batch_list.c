/*
 * Prepared batch lists (xfer_batch_create): every descriptor checked once against the local
 * registration and the remote key, kept in absolute addresses for every post (batch.c); the
 * list lives until it is destroyed and its last post ended, and is cut off its endpoint when
 * that closes.
 */
#include "batch.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

void xfer_batch_free(xfer_batch_t *batch)
{
    batch->mem->busy--;
    xfer_rkey_put(batch->rkey);
    if (batch->ep != NULL) {
        ucs_list_del(&batch->ep_link);
    }
    ucs_list_del(&batch->ctx_link);
    free(batch);
}

void xfer_batch_unpost(xfer_batch_t *batch)
{
    if ((--batch->posts == 0) && batch->destroyed) {
        xfer_batch_free(batch);
    }
}

static xfer_status_t batch_descs_check(xfer_endpoint_t *ep, xfer_mem_t *mem,
                                       xfer_rkey_t *rkey, const xfer_batch_desc_t *descs,
                                       size_t count, xfer_batch_iov_t *iov, uint64_t *bytes_p)
{
    uint64_t bytes = 0;

    for (size_t i = 0; i < count; i++) {
        const xfer_batch_desc_t *d = &descs[i];

        if ((d->local_offset > mem->length) || (d->length > mem->length - d->local_offset)) {
            xfer_refuse(BATCH_SUBSYS, "xfer_batch_create: descriptor %zu: local "
                        "range +%" PRIu64 " of %" PRIu64 " bytes is outside the registered "
                        "buffer of %zu bytes", i, d->local_offset, d->length, mem->length);
            return XFER_ERR_OUT_OF_RANGE;
        }
        if ((d->remote_offset > rkey->length) ||
            (d->length > rkey->length - d->remote_offset)) {
            xfer_refuse(BATCH_SUBSYS, "xfer_batch_create: descriptor %zu: remote "
                        "range +%" PRIu64 " of %" PRIu64 " bytes is outside the remote buffer of "
                        "%" PRIu64 " bytes (%s)", i, d->remote_offset, d->length, rkey->length,
                        ep->peer);
            return XFER_ERR_OUT_OF_RANGE;
        }
        iov[i].local  = (uintptr_t)mem->addr + d->local_offset;
        iov[i].remote = rkey->addr + d->remote_offset;
        iov[i].length = d->length;
        bytes        += d->length;
    }
    *bytes_p = bytes;
    return XFER_OK;
}

xfer_status_t xfer_batch_create(xfer_endpoint_t *ep, xfer_batch_op_t op, xfer_mem_t *mem,
                                xfer_rkey_t *rkey, const xfer_batch_desc_t *descs,
                                size_t count, xfer_batch_t **batch_p)
{
    xfer_batch_t *batch;
    xfer_context_t *ctx;
    xfer_status_t status;
    uint64_t bytes;

    status = xfer_endpoint_op_begin(ep, "xfer_batch_create", (void*)xfer_batch_create);
    if (status != XFER_OK) {
        return status;
    }
    ctx = ep->ctx;
    status = XFER_ERR_INVALID_PARAM;
    if ((batch_p == NULL) || (mem == NULL) || (rkey == NULL) || (descs == NULL) ||
        ((op != XFER_BATCH_PUT) && (op != XFER_BATCH_GET))) {
        xfer_refuse(BATCH_SUBSYS, "xfer_batch_create: %s",
                    ((op != XFER_BATCH_PUT) && (op != XFER_BATCH_GET)) ? "unknown operation" :
                    "NULL argument");
        goto out;
    }
    if ((count == 0) || (count > ctx->fw_config.batch_max_descs)) {
        xfer_refuse(BATCH_SUBSYS, "xfer_batch_create: %zu descriptors; a batch "
                    "has 1 to XFER_BATCH_MAX_DESCS=%" PRIu64, count,
                    ctx->fw_config.batch_max_descs);
        goto out;
    }
    if ((mem->ctx != ctx) || (rkey->ctx != ctx) || (rkey->fw_iface != ep->fw_iface) ||
        (rkey->owner_id != ep->peer_id)) {
        xfer_refuse(BATCH_SUBSYS, "xfer_batch_create: the memory or the remote "
                    "key belongs to another context, or the key was not unpacked for this "
                    "endpoint's peer and transport (%s, %s)", ep->peer, ep->transport);
        goto out;
    }
    if ((mem->memh[ep->fw_iface->index] == NULL) && !mem->staged) {
        xfer_refuse(BATCH_SUBSYS, "xfer_batch_create: the memory is not registered "
                    "with %s", ep->transport);
        goto out;
    }
    batch = malloc(sizeof(*batch) + count * sizeof(batch->iov[0]));
    if (batch == NULL) {
        status = XFER_ERR_NO_MEMORY;
        goto out;
    }
    status = batch_descs_check(ep, mem, rkey, descs, count, batch->iov, &bytes);
    if (status != XFER_OK) {
        free(batch);
        goto out;
    }
    batch->ctx       = ctx;
    batch->ep        = ep;
    batch->is_put    = (op == XFER_BATCH_PUT);
    batch->mem       = mem;
    batch->rkey      = rkey;
    batch->fw_iface  = ep->fw_iface;
    batch->posts     = 0;
    batch->destroyed = 0;
    batch->staged    = (mem->memh[ep->fw_iface->index] == NULL);
    batch->count     = count;
    batch->bytes     = bytes;
    mem->busy++;
    rkey->busy++;
    ucs_list_add_tail(&ep->batches, &batch->ep_link);
    ucs_list_add_tail(&ctx->batches, &batch->ctx_link);
    *batch_p = batch;
out:
    xfer_ctx_unlock(ctx);
    return status;
}

xfer_status_t xfer_batch_destroy(xfer_batch_t *batch)
{
    xfer_context_t *ctx;

    if (batch == NULL) {
        return XFER_ERR_INVALID_PARAM;
    }
    ctx = batch->ctx;
    xfer_ctx_lock(ctx);
    if (batch->destroyed) {
        xfer_refuse(BATCH_SUBSYS, "xfer_batch_destroy: the batch was destroyed "
                    "already");
        xfer_ctx_unlock(ctx);
        return XFER_ERR_INVALID_PARAM;
    }
    batch->destroyed = 1;
    if (batch->posts == 0) {
        xfer_batch_free(batch);
    }
    xfer_ctx_unlock(ctx);
    return XFER_OK;
}

void xfer_batch_ep_closing(xfer_endpoint_t *ep)
{
    xfer_batch_t *batch, *tmp;

    ucs_list_for_each_safe(batch, tmp, &ep->batches, ep_link) {
        ucs_list_del(&batch->ep_link);
        batch->ep = NULL;
    }
}
