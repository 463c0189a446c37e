/*
 * The copy service components use to move CUDA memory through host buffers of their own
 * (component.h, xfer_devcopy_*): the staging pipeline's CUDA copy engine (staging_copy.c) with
 * a pool of pinned bounce buffers, one per slot. The component keeps which slot is free and
 * what each carries; this file only owns the memory, the stream and the events.
 */
#include "staging.h"

#include <stdlib.h>
#include <string.h>

struct xfer_devcopy {
    xfer_copier_t copier;
    size_t        slot_size;
    uint8_t       *pool;        /* num_slots * slot_size pinned bytes */
    int           device;       /* the memory's device, for a primary context */
    void          *cu_ctx;      /* the memory's context as the driver gave it (NULL: primary) */
};

xfer_status_t xfer_devcopy_open(const xfer_mem_attr_t *attr, unsigned num_slots,
                                size_t slot_size, xfer_devcopy_t **dc_p, char *why,
                                size_t why_size)
{
    xfer_devcopy_t *dc;
    xfer_status_t status;

    if ((attr == NULL) || (attr->type != XFER_MEM_CUDA) || (num_slots == 0) ||
        (slot_size == 0) || (dc_p == NULL) || (slot_size > SIZE_MAX / num_slots)) {
        xfer_reason_set(why, why_size, "xfer_devcopy_open: %s",
                        ((attr != NULL) && (attr->type != XFER_MEM_CUDA)) ?
                        "the memory is not CUDA memory" : "invalid argument");
        return XFER_ERR_INVALID_PARAM;
    }
    dc = calloc(1, sizeof(*dc));
    if (dc == NULL) {
        xfer_reason_set(why, why_size, "out of memory");
        return XFER_ERR_NO_MEMORY;
    }
    dc->slot_size = slot_size;
    dc->device    = attr->cuda_device;
    dc->cu_ctx    = attr->cuda_context;
    status = xfer_copier_open_cuda(&dc->copier, num_slots, attr->cuda_context,
                                   attr->cuda_device, why, why_size);
    if (status != XFER_OK) {
        goto err_free;
    }
    status = dc->copier.ops->host_alloc(&dc->copier, slot_size * num_slots, (void**)&dc->pool,
                                        why, why_size);
    if (status != XFER_OK) {
        goto err_close_copier;
    }
    *dc_p = dc;
    return XFER_OK;

err_close_copier:
    dc->copier.ops->close(&dc->copier);
err_free:
    free(dc);
    return status;
}

void xfer_devcopy_close(xfer_devcopy_t *dc)
{
    if (dc == NULL) {
        return;
    }
    dc->copier.ops->close(&dc->copier);     /* waits for the copies in flight */
    dc->copier.ops->host_free(&dc->copier, dc->pool);
    free(dc);
}

int xfer_devcopy_serves(const xfer_devcopy_t *dc, const xfer_mem_attr_t *attr)
{
    if ((dc == NULL) || (attr == NULL) || (attr->type != XFER_MEM_CUDA)) {
        return 0;
    }
    if ((dc->cu_ctx == NULL) || (attr->cuda_context == NULL)) {
        /* stream-ordered memory has no context of its own: its device's primary one */
        return (dc->cu_ctx == attr->cuda_context) && (dc->device == attr->cuda_device);
    }
    return dc->cu_ctx == attr->cuda_context;
}

void *xfer_devcopy_buf(xfer_devcopy_t *dc, unsigned slot)
{
    return dc->pool + (size_t)slot * dc->slot_size;
}

xfer_status_t xfer_devcopy_start(xfer_devcopy_t *dc, unsigned slot, void *dev, size_t len,
                                 int to_device, char *why, size_t why_size)
{
    void *buf = xfer_devcopy_buf(dc, slot);

    if ((slot >= dc->copier.num_slots) || (len > dc->slot_size)) {
        xfer_reason_set(why, why_size, "xfer_devcopy_start: slot %u or length %zu out of range",
                        slot, len);
        return XFER_ERR_INVALID_PARAM;
    }
    return to_device ?
           dc->copier.ops->start(&dc->copier, slot, dev, buf, len, XFER_STAGING_FROM_HOST, why,
                                 why_size) :
           dc->copier.ops->start(&dc->copier, slot, buf, dev, len, XFER_STAGING_TO_HOST, why,
                                 why_size);
}

xfer_status_t xfer_devcopy_poll(xfer_devcopy_t *dc, unsigned slot, char *why, size_t why_size)
{
    if (slot >= dc->copier.num_slots) {
        xfer_reason_set(why, why_size, "xfer_devcopy_poll: slot %u out of range", slot);
        return XFER_ERR_INVALID_PARAM;
    }
    return dc->copier.ops->poll(&dc->copier, slot, why, why_size);
}

xfer_status_t xfer_devcopy_sync(xfer_devcopy_t *dc, void *dst, const void *src, size_t len,
                                int to_device, char *why, size_t why_size)
{
    if (len == 0) {
        return XFER_OK;
    }
    return xfer_copier_sync_cuda(&dc->copier, dst, src, len,
                                 to_device ? XFER_STAGING_FROM_HOST : XFER_STAGING_TO_HOST, why,
                                 why_size);
}
