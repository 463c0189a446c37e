/*
 * Batches inside libxfer: a prepared list (batch_list.c), which its posts (batch.c) use until
 * the last of them ended.
 */
#ifndef XFER_BATCH_H
#define XFER_BATCH_H

#include "xfer_int.h"

#define BATCH_SUBSYS "batch"

/* A prepared list: its descriptors in absolute addresses, the memory registration (busy) and
 * the remote key (busy), until destroyed and no post uses it any more. */
struct xfer_batch {
    xfer_context_t      *ctx;
    xfer_endpoint_t     *ep;            /* NULL once the endpoint closed */
    ucs_list_link_t     ep_link;        /* ep->batches */
    ucs_list_link_t     ctx_link;       /* ctx->batches */
    int                 is_put;
    xfer_mem_t          *mem;
    xfer_rkey_t         *rkey;
    xfer_fw_iface_t     *fw_iface;
    unsigned            posts;          /* ops still using iov */
    int                 destroyed;      /* xfer_batch_destroy came; freed after the last op */
    int                 staged;         /* no memh on this transport: through staging.c */
    size_t              count;
    uint64_t            bytes;
    xfer_batch_iov_t    iov[];
};

/* Free batch: its memory and key are let go, it leaves its endpoint's and context's lists. */
void xfer_batch_free(xfer_batch_t *batch);
/* A post of batch ended: freed when it was the last one and the batch was destroyed. */
void xfer_batch_unpost(xfer_batch_t *batch);

#endif
