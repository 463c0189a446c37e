/*
 * Reads of a peer's memory by cross-memory attach larger than a slice (XFER_FAIR_SLICE): the
 * data of a rendezvous message, of a fetched tensor. The first slice is read when the pull
 * starts; the rest a slice per round of progress, in turn with every other pull and with the
 * other endpoints' frames, so that one peer's gigabyte message costs another endpoint a slice,
 * not the message (docs/contract.md, C27). The owner hears once, through the pull's callback:
 * when every byte is in, when a read fails, or when the endpoint goes.
 */
#include "shm.h"

#include <stdio.h>

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
    return (p->done == p->len) ? XFER_OK : XFER_INPROGRESS;
}

xfer_status_t xfer_shm_pull_start(xfer_ep_h ep, xfer_shm_pull_t *p, void *dst, uint64_t src,
                                  uint64_t len)
{
    xfer_status_t status;

    p->ep     = ep;
    p->dst    = dst;
    p->src    = src;
    p->len    = len;
    p->done   = 0;
    p->why[0] = '\0';
    status    = (len == 0) ? XFER_OK : pull_slice(p);
    if (status == XFER_INPROGRESS) {
        ucs_list_add_tail(&ep->iface->pulls, &p->list);
    }
    return status;
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
        }
    }
}
