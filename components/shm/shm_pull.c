/*
 * Reads of a peer's memory by cross-memory attach (the data of a rendezvous message, of a
 * fetched tensor), a slice (XFER_FAIR_SLICE) at a time. The first slice is read at once, and
 * a read no larger ends there; the rest of a larger one comes a slice per round of progress,
 * in turn with every other pull and with the other endpoints' frames, so that one peer's
 * gigabyte message costs another endpoint a slice, not the message (docs/contract.md, C27).
 * The caller of such a read hears once, through its callback: when every byte is in, when a
 * read fails, or when the endpoint goes.
 */
#include "shm.h"

#include <stdio.h>
#include <stdlib.h>

/* The peer says its endpoint ends in our ring before its sends end or its tensors go. */
xfer_status_t xfer_shm_read_end(xfer_ep_h ep, char *why, size_t why_size)
{
    if (xfer_shm_ring_gone(&ep->in)) {
        snprintf(why, why_size, "the peer's endpoint ended while its memory was read");
        return XFER_ERR_CONNECTION;
    }
    return XFER_OK;
}

/* One slice of p; XFER_OK when every byte is in, XFER_INPROGRESS, or the read's error. */
static xfer_status_t pull_slice(xfer_shm_pull_t *p)
{
    uint64_t slice = XFER_IFACE_FAIR_SLICE(&p->ep->iface->params);
    uint64_t n     = (p->len - p->done < slice) ? p->len - p->done : slice;
    xfer_status_t status;

    status = xfer_shm_cma(p->ep, p->dst + p->done, p->src + p->done, n, 0, p->why,
                          sizeof(p->why));
    if (status != XFER_OK) {
        return status;
    }
    p->done += n;
    if (p->done < p->len) {
        return XFER_INPROGRESS;
    }
    return xfer_shm_read_end(p->ep, p->why, sizeof(p->why));
}

xfer_status_t xfer_shm_pull(xfer_ep_h ep, void *dst, uint64_t src, uint64_t len,
                            xfer_shm_pull_cb_t cb, xfer_shm_op_t *op, uint64_t id, char *why,
                            size_t why_size)
{
    uint64_t slice = XFER_IFACE_FAIR_SLICE(&ep->iface->params);
    uint64_t first = (len < slice) ? len : slice;
    xfer_shm_pull_t *p;
    xfer_status_t status;

    status = (first == 0) ? XFER_OK : xfer_shm_cma(ep, dst, src, first, 0, why, why_size);
    if (status != XFER_OK) {
        return status;
    }
    if (first == len) {
        return xfer_shm_read_end(ep, why, why_size);
    }
    p = malloc(sizeof(*p));
    if (p == NULL) {
        snprintf(why, why_size, "out of memory for the rest of a %llu-byte read",
                 (unsigned long long)len);
        return XFER_ERR_NO_MEMORY;
    }
    p->ep     = ep;
    p->dst    = dst;
    p->src    = src;
    p->len    = len;
    p->done   = first;
    p->cb     = cb;
    p->op     = op;
    p->id     = id;
    p->why[0] = '\0';
    ucs_list_add_tail(&ep->iface->pulls, &p->list);
    return XFER_INPROGRESS;
}

unsigned xfer_shm_pulls_progress(xfer_iface_h iface)
{
    unsigned long n;
    unsigned count = 0;

    /* one slice of each pull, in turn: those that end leave, the others go to the back */
    for (n = ucs_list_length(&iface->pulls); (n > 0) && !ucs_list_is_empty(&iface->pulls);
         n--) {
        xfer_shm_pull_t *p = ucs_list_extract_head(&iface->pulls, xfer_shm_pull_t, list);
        xfer_status_t status = pull_slice(p);

        count++;
        if (status == XFER_INPROGRESS) {
            ucs_list_add_tail(&iface->pulls, &p->list);
            continue;
        }
        p->cb(p, status);
        free(p);
    }
    return count;
}

void xfer_shm_pulls_ep_gone(xfer_ep_h ep, xfer_status_t status)
{
    xfer_shm_pull_t *p, *tmp;

    ucs_list_for_each_safe(p, tmp, &ep->iface->pulls, list) {
        if (p->ep == ep) {
            ucs_list_del(&p->list);
            snprintf(p->why, sizeof(p->why), "the endpoint went after %llu of %llu bytes",
                     (unsigned long long)p->done, (unsigned long long)p->len);
            p->cb(p, status);
            free(p);
        }
    }
}
