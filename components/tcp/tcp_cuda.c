/*
 * CUDA device memory over tcp: a socket cannot read from or write into device memory, so
 * every byte of it passes a pinned bounce buffer of the iface (the framework's copy service,
 * xfer_devcopy_*: an own stream, an event per buffer), with the copies overlapping the socket.
 *
 * Receiving (a tag message, a put into a registered region, a get's data, a fetched tensor):
 * the payload is read into a bounce buffer; once it holds CUDA_CHUNK bytes or the payload's
 * end, its copy to the destination starts and the next bytes go into another buffer, so the
 * copy of chunk k runs while chunk k + 1 arrives. The frame is done - its handler runs, a put
 * is acknowledged, a receive completes - only once every copy of it landed: what is reported
 * there is in device memory. With every receive buffer busy the endpoint stops reading until
 * a copy lands (the socket's own flow control holds the peer).
 *
 * Sending (a send, a put, a get's answer, a published tensor): the data's first chunks are
 * copied into bounce buffers as soon as the frame is queued, and the frame is written from
 * them in order as they land; each buffer written is refilled with the next chunk. Nothing
 * queued after the frame is written before it, so the wire order is kept.
 *
 * The two directions have their own buffers: a send that waits for a peer to read never
 * takes the buffers a receive needs to drain the socket. A frame never waits for a buffer
 * another endpoint holds: those may be held until that endpoint's peer reads or sends more,
 * which may itself wait for this frame. A frame that finds every buffer taken moves one
 * chunk at a time through a buffer of its own endpoint with synchronous copies ("spill"),
 * slower but bounded by one chunk per such frame. A copy in flight has no file descriptor,
 * so while one is the iface tells the framework not to sleep (event_arm).
 * Small data - an eager message, an unexpected message matched into device memory, a
 * deregistered region's answer - is copied at once (xfer_tcp_cuda_copy).
 */
#include "tcp.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

#define DSLOT_NONE  UINT_MAX
#define DSLOT_SPILL (UINT_MAX - 1)    /* the endpoint's own buffer, ep->rx_spill */

void xfer_tcp_cuda_init(xfer_iface_h iface)
{
    xfer_tcp_cuda_t *cu = &iface->cuda;

    memset(cu, 0, sizeof(*cu));
    cu->chunk = iface->cfg->cuda_chunk;
    cu->depth = (unsigned)iface->cfg->cuda_depth;
    ucs_list_head_init(&cu->waiting);
}

void xfer_tcp_cuda_cleanup(xfer_iface_h iface)
{
    xfer_devcopy_close(iface->cuda.dc);     /* waits for the copies in flight */
    iface->cuda.dc = NULL;
}

xfer_status_t xfer_tcp_cuda_accept(xfer_iface_h iface, const xfer_mem_attr_t *attr, char *why,
                                   size_t why_size)
{
    xfer_tcp_cuda_t *cu = &iface->cuda;

    if (cu->dc == NULL) {
        return xfer_devcopy_open(attr, 2 * cu->depth, cu->chunk, &cu->dc, why, why_size);
    }
    if (!xfer_devcopy_serves(cu->dc, attr)) {
        xfer_reason_set(why, why_size, "the tcp iface moves CUDA memory of one context, and "
                        "this memory (device %d) belongs to another", attr->cuda_device);
        return XFER_ERR_UNSUPPORTED;
    }
    return XFER_OK;
}

int xfer_tcp_cuda_detect(xfer_iface_h iface, const void *p, size_t len, char *why,
                         size_t why_size)
{
    xfer_mem_attr_t attr;

    if (len == 0) {
        return 0;
    }
    if (xfer_mem_detect(p, len, &attr, why, why_size) != XFER_OK) {
        return -1;
    }
    if (attr.type != XFER_MEM_CUDA) {
        return 0;
    }
    return (xfer_tcp_cuda_accept(iface, &attr, why, why_size) == XFER_OK) ? 1 : -1;
}

int xfer_tcp_buf_is_cuda(xfer_iface_h iface, const void *p, size_t len, xfer_memh_h memh,
                         char *why, size_t why_size)
{
    if (memh != NULL) {
        return memh->cuda;
    }
    return xfer_tcp_cuda_detect(iface, p, len, why, why_size);
}

xfer_status_t xfer_tcp_cuda_copy_small(xfer_iface_h iface, const void *src, size_t len,
                                       void **copy_p, char *why, size_t why_size)
{
    void *copy = malloc(len);
    xfer_status_t status;

    if (copy == NULL) {
        xfer_reason_set(why, why_size, "out of memory for %zu bytes of CUDA memory", len);
        return XFER_ERR_NO_MEMORY;
    }
    status = xfer_tcp_cuda_copy(iface, copy, src, len, 0, why, why_size);
    if (status != XFER_OK) {
        free(copy);
        return status;
    }
    *copy_p = copy;
    return XFER_OK;
}

xfer_status_t xfer_tcp_cuda_copy(xfer_iface_h iface, void *dst, const void *src, size_t len,
                                 int to_device, char *why, size_t why_size)
{
    if (iface->cuda.dc == NULL) {
        xfer_reason_set(why, why_size, "no CUDA memory was registered with this iface");
        return XFER_ERR_INVALID_PARAM;
    }
    return xfer_devcopy_sync(iface->cuda.dc, dst, src, len, to_device, why, why_size);
}

/* ---- slots ---------------------------------------------------------------------------------- */

static void wait_for_copies(xfer_ep_h ep)
{
    if (!ep->in_devwait) {
        ep->in_devwait = 1;
        ucs_list_add_tail(&ep->iface->cuda.waiting, &ep->devwait_link);
    }
}

void xfer_tcp_cuda_ep_forget(xfer_ep_h ep)
{
    if (ep->in_devwait) {
        ucs_list_del(&ep->devwait_link);
        ep->in_devwait = 0;
    }
    free(ep->rx_spill);
    ep->rx_spill = NULL;
}

/* A slot whose copy is in flight: wait until it has landed (or failed). */
static void slot_wait(xfer_tcp_cuda_t *cu, unsigned slot)
{
    char why[XFER_REASON_MAX];

    if (cu->state[slot] != XFER_TCP_DSLOT_COPY) {
        return;
    }
    while (xfer_devcopy_poll(cu->dc, slot, why, sizeof(why)) == XFER_INPROGRESS) {
    }
}

static int is_rx_slot(const xfer_tcp_cuda_t *cu, unsigned slot)
{
    return slot < cu->depth;
}

/* Ask about the copy of slot; 1 when it landed (or failed: the ep it served fails). */
static int slot_land(xfer_iface_h iface, unsigned slot)
{
    xfer_tcp_cuda_t *cu = &iface->cuda;
    char why[XFER_REASON_MAX] = "";
    xfer_status_t status;
    xfer_ep_h ep = cu->owner[slot];

    status = xfer_devcopy_poll(cu->dc, slot, why, sizeof(why));
    if (status == XFER_INPROGRESS) {
        return 0;
    }
    if (is_rx_slot(cu, slot)) {
        cu->state[slot] = XFER_TCP_DSLOT_FREE;
        cu->owner[slot] = NULL;
        if (ep != NULL) {
            ep->rx.dcopies--;
        }
    } else {
        cu->state[slot] = XFER_TCP_DSLOT_READY;
    }
    if ((status != XFER_OK) && (ep != NULL)) {
        xfer_tcp_ep_fail_later(ep, XFER_ERR_IO, "copy %s CUDA memory: %s",
                               is_rx_slot(cu, slot) ? "into" : "from", why);
    }
    return 1;
}

static unsigned land_all(xfer_iface_h iface)
{
    xfer_tcp_cuda_t *cu = &iface->cuda;
    unsigned landed     = 0;

    for (unsigned s = 0; s < 2 * cu->depth; s++) {
        if (cu->state[s] == XFER_TCP_DSLOT_COPY) {
            landed += slot_land(iface, s);
        }
    }
    return landed;
}

static unsigned slot_find_free(xfer_iface_h iface, unsigned from, unsigned to)
{
    for (unsigned pass = 0; pass < 2; pass++) {
        for (unsigned s = from; s < to; s++) {
            if (iface->cuda.state[s] == XFER_TCP_DSLOT_FREE) {
                return s;
            }
        }
        if (land_all(iface) == 0) {
            break;
        }
    }
    return DSLOT_NONE;
}

unsigned xfer_tcp_cuda_progress(xfer_iface_h iface)
{
    xfer_tcp_cuda_t *cu = &iface->cuda;
    unsigned landed;

    if (cu->dc == NULL) {
        return 0;
    }
    landed = land_all(iface);
    if ((landed > 0) || cu->changed) {
        ucs_list_link_t woken;

        /* the endpoints waiting now: one that has to wait again goes on the list anew */
        cu->changed = 0;
        ucs_list_head_init(&woken);
        ucs_list_splice_tail(&woken, &cu->waiting);
        ucs_list_head_init(&cu->waiting);
        while (!ucs_list_is_empty(&woken)) {
            xfer_ep_h ep = ucs_list_extract_head(&woken, struct xfer_ep, devwait_link);

            ep->in_devwait = 0;
            xfer_tcp_iface_rx_kick(iface, ep);
            xfer_tcp_ep_tx_write(ep);
        }
    }
    return landed;
}

int xfer_tcp_cuda_busy(xfer_iface_h iface)
{
    const xfer_tcp_cuda_t *cu = &iface->cuda;

    if (cu->dc == NULL) {
        return 0;
    }
    if (cu->changed) {
        return 1;
    }
    for (unsigned s = 0; s < 2 * cu->depth; s++) {
        if (cu->state[s] == XFER_TCP_DSLOT_COPY) {
            return 1;
        }
    }
    return 0;
}

/* ---- receiving ------------------------------------------------------------------------------ */

/* The bounce buffer being filled is complete: copy it to its place in the destination. */
static int rx_slot_flush(xfer_ep_h ep)
{
    xfer_tcp_cuda_t *cu = &ep->iface->cuda;
    xfer_tcp_rx_t *rx   = &ep->rx;
    char why[XFER_REASON_MAX] = "";
    unsigned slot       = rx->dslot;
    xfer_status_t status;

    rx->dslot = DSLOT_NONE;
    if (slot == DSLOT_SPILL) {
        status = xfer_devcopy_sync(cu->dc, rx->dest + rx->dbase, ep->rx_spill, rx->dfill, 1,
                                   why, sizeof(why));
        if (status != XFER_OK) {
            xfer_tcp_ep_fail(ep, XFER_ERR_IO, "copy into CUDA memory: %s", why);
            return -1;
        }
        return 1;
    }
    status = xfer_devcopy_start(cu->dc, slot, rx->dest + rx->dbase, rx->dfill, 1, why,
                                sizeof(why));
    if (status != XFER_OK) {
        cu->state[slot] = XFER_TCP_DSLOT_FREE;
        cu->owner[slot] = NULL;
        xfer_tcp_ep_fail(ep, XFER_ERR_IO, "copy into CUDA memory: %s", why);
        return -1;
    }
    cu->state[slot] = XFER_TCP_DSLOT_COPY;
    rx->dcopies++;
    return 1;
}

int xfer_tcp_cuda_rx_data(xfer_ep_h ep)
{
    xfer_tcp_cuda_t *cu = &ep->iface->cuda;
    xfer_tcp_rx_t *rx   = &ep->rx;

    while (rx->got < rx->want) {
        size_t avail = ep->rlen - ep->roff;
        size_t room, n;
        uint8_t *buf;

        if (rx->dslot == DSLOT_NONE) {
            unsigned slot = slot_find_free(ep->iface, 0, cu->depth);

            if ((slot == DSLOT_NONE) && (ep->rx_spill == NULL)) {
                ep->rx_spill = malloc(cu->chunk);
                if (ep->rx_spill == NULL) {
                    xfer_tcp_ep_fail(ep, XFER_ERR_NO_MEMORY, "out of memory for a %zu-byte "
                                     "buffer receiving into CUDA memory", cu->chunk);
                    return -1;
                }
            }
            if (slot == DSLOT_NONE) {
                slot = DSLOT_SPILL;     /* every receive buffer is taken: not waited for */
            } else {
                cu->state[slot] = XFER_TCP_DSLOT_FILL;
                cu->owner[slot] = ep;
            }
            rx->dslot = slot;
            rx->dfill = 0;
            rx->dbase = rx->got;
        }
        buf  = ((rx->dslot == DSLOT_SPILL) ? ep->rx_spill :
                (uint8_t*)xfer_devcopy_buf(cu->dc, rx->dslot)) + rx->dfill;
        room = cu->chunk - rx->dfill;
        if (room > rx->want - rx->got) {
            room = rx->want - rx->got;
        }
        if (avail > 0) {
            n = (avail < room) ? avail : room;
            memcpy(buf, ep->rbuf + ep->roff, n);
            ep->roff += n;
        } else {
            struct iovec iov[2];
            int ret;

            ep->roff = ep->rlen = 0;
            iov[0].iov_base = buf;
            iov[0].iov_len  = room;
            iov[1].iov_base = ep->rbuf;
            iov[1].iov_len  = XFER_TCP_RX_BUF_LEN;
            ret = xfer_tcp_ep_rx_read(ep, iov, 2, &n);
            if (ret <= 0) {
                return ret;
            }
            if (n > room) {
                ep->rlen = n - room;    /* what follows the payload, for the next frame */
                n        = room;
            }
        }
        rx->got   += n;
        rx->dfill += n;
        if ((rx->dfill == cu->chunk) || (rx->got == rx->want)) {
            if (rx_slot_flush(ep) < 0) {
                return -1;
            }
        }
    }
    if (rx->dcopies > 0) {
        land_all(ep->iface);
        if (rx->dcopies > 0) {
            wait_for_copies(ep);
            return 0;
        }
    }
    return 1;
}

void xfer_tcp_cuda_rx_quiesce(xfer_ep_h ep)
{
    xfer_tcp_cuda_t *cu = &ep->iface->cuda;

    if (cu->dc == NULL) {
        return;
    }
    for (unsigned s = 0; s < cu->depth; s++) {
        if (cu->owner[s] != ep) {
            continue;
        }
        /* a copy takes microseconds; it must land before its memory is reported free */
        slot_wait(cu, s);
        cu->state[s] = XFER_TCP_DSLOT_FREE;
        cu->owner[s] = NULL;
        cu->changed  = 1;
    }
    ep->rx.dslot   = DSLOT_NONE;
    ep->rx.dcopies = 0;
}

void xfer_tcp_cuda_rx_forget(xfer_ep_h ep)
{
    xfer_tcp_cuda_t *cu = &ep->iface->cuda;
    xfer_tcp_rx_t *rx   = &ep->rx;

    if ((rx->dslot != DSLOT_NONE) && (rx->dslot != DSLOT_SPILL)) {
        cu->state[rx->dslot] = XFER_TCP_DSLOT_FREE;
        cu->owner[rx->dslot] = NULL;
        cu->changed          = 1;
    }
    rx->dslot = DSLOT_NONE;
    rx->dfill = 0;
}

/* ---- sending -------------------------------------------------------------------------------- */

static size_t tx_data_len(const xfer_tcp_tx_t *tx)
{
    return tx->iov[1].iov_len;
}

void xfer_tcp_cuda_tx_fill(xfer_ep_h ep, xfer_tcp_tx_t *tx)
{
    xfer_tcp_cuda_t *cu = &ep->iface->cuda;

    while ((tx->ring_count < cu->depth) && (tx->next < tx_data_len(tx))) {
        char why[XFER_REASON_MAX] = "";
        size_t n  = tx_data_len(tx) - tx->next;
        unsigned slot;

        slot = slot_find_free(ep->iface, cu->depth, 2 * cu->depth);
        if (slot == DSLOT_NONE) {
            return;
        }
        if (n > cu->chunk) {
            n = cu->chunk;
        }
        if (xfer_devcopy_start(cu->dc, slot, (uint8_t*)tx->iov[1].iov_base + tx->next, n, 0,
                               why, sizeof(why)) != XFER_OK) {
            xfer_tcp_ep_fail_later(ep, XFER_ERR_IO, "copy from CUDA memory: %s", why);
            return;
        }
        cu->state[slot] = XFER_TCP_DSLOT_COPY;
        cu->owner[slot] = ep;
        tx->ring[(tx->ring_head + tx->ring_count) % XFER_TCP_CUDA_DEPTH_MAX] = slot;
        tx->ring_count++;
        tx->next += n;
    }
}

int xfer_tcp_cuda_tx_gather(xfer_ep_h ep, xfer_tcp_tx_t *tx, size_t skip, struct iovec *iov,
                            int max, int *cnt_p, size_t *total_p)
{
    xfer_tcp_cuda_t *cu = &ep->iface->cuda;
    size_t len          = tx_data_len(tx);
    size_t off          = tx->first;

    xfer_tcp_cuda_tx_fill(ep, tx);
    if ((tx->ring_count == 0) && (tx->spill_len == 0) && (tx->next < len)) {
        /* every send buffer is taken by other frames: one chunk through a buffer of its own
         * rather than waiting for them */
        char why[XFER_REASON_MAX] = "";
        size_t n = (len - tx->next < cu->chunk) ? len - tx->next : cu->chunk;

        if ((tx->spill == NULL) && ((tx->spill = malloc(cu->chunk)) == NULL)) {
            xfer_tcp_ep_fail_later(ep, XFER_ERR_NO_MEMORY, "out of memory for a %zu-byte "
                                   "buffer sending from CUDA memory", cu->chunk);
            return 1;
        }
        if (xfer_devcopy_sync(cu->dc, tx->spill, (uint8_t*)tx->iov[1].iov_base + tx->next, n, 0,
                              why, sizeof(why)) != XFER_OK) {
            xfer_tcp_ep_fail_later(ep, XFER_ERR_IO, "copy from CUDA memory: %s", why);
            return 1;
        }
        tx->spill_len = n;
        tx->next     += n;
    }
    if (tx->spill_len > 0) {
        if (skip < off + tx->spill_len) {
            size_t from = (skip > off) ? skip - off : 0;

            if (*cnt_p >= max) {
                return 2;
            }
            iov[*cnt_p].iov_base = tx->spill + from;
            iov[*cnt_p].iov_len  = tx->spill_len - from;
            *total_p            += tx->spill_len - from;
            (*cnt_p)++;
        }
        off += tx->spill_len;
    }
    for (unsigned i = 0; i < tx->ring_count; i++) {
        unsigned slot = tx->ring[(tx->ring_head + i) % XFER_TCP_CUDA_DEPTH_MAX];
        size_t clen   = (len - off < cu->chunk) ? len - off : cu->chunk;
        size_t from;

        if ((cu->state[slot] == XFER_TCP_DSLOT_COPY) && !slot_land(ep->iface, slot)) {
            wait_for_copies(ep);
            return 1;
        }
        if (cu->state[slot] != XFER_TCP_DSLOT_READY) {
            return 1;   /* the copy failed: the ep fails */
        }
        if (skip < off + clen) {
            if (*cnt_p >= max) {
                return 2;
            }
            from = (skip > off) ? skip - off : 0;
            iov[*cnt_p].iov_base = (uint8_t*)xfer_devcopy_buf(cu->dc, slot) + from;
            iov[*cnt_p].iov_len  = clen - from;
            *total_p            += clen - from;
            (*cnt_p)++;
        }
        off += clen;
    }
    if (tx->next < len) {
        wait_for_copies(ep);    /* for a free bounce buffer */
        return 1;
    }
    return 0;
}

void xfer_tcp_cuda_tx_advance(xfer_ep_h ep, xfer_tcp_tx_t *tx)
{
    xfer_tcp_cuda_t *cu = &ep->iface->cuda;
    size_t hdr          = tx->iov[0].iov_len;
    size_t done         = (tx->sent > hdr) ? tx->sent - hdr : 0;
    size_t len          = tx_data_len(tx);

    if ((tx->spill_len > 0) && (done >= tx->first + tx->spill_len)) {
        tx->first    += tx->spill_len;
        tx->spill_len = 0;
    }
    while ((tx->spill_len == 0) && (tx->ring_count > 0)) {
        unsigned slot = tx->ring[tx->ring_head];
        size_t clen   = (len - tx->first < cu->chunk) ? len - tx->first : cu->chunk;

        if (done < tx->first + clen) {
            break;
        }
        cu->state[slot] = XFER_TCP_DSLOT_FREE;
        cu->owner[slot] = NULL;
        cu->changed     = 1;
        tx->ring_head   = (tx->ring_head + 1) % XFER_TCP_CUDA_DEPTH_MAX;
        tx->ring_count--;
        tx->first      += clen;
    }
    xfer_tcp_cuda_tx_fill(ep, tx);
}

void xfer_tcp_cuda_tx_release(xfer_ep_h ep, xfer_tcp_tx_t *tx)
{
    xfer_tcp_cuda_t *cu = &ep->iface->cuda;

    while (tx->ring_count > 0) {
        unsigned slot = tx->ring[tx->ring_head];

        /* the copy reads the sender's device memory, which is the caller's again once the
         * send is reported done (or failed): it lands first (microseconds) */
        slot_wait(cu, slot);
        cu->state[slot] = XFER_TCP_DSLOT_FREE;
        cu->owner[slot] = NULL;
        tx->ring_head   = (tx->ring_head + 1) % XFER_TCP_CUDA_DEPTH_MAX;
        tx->ring_count--;
    }
    cu->changed = 1;
    tx->dev     = 0;
    free(tx->spill);
    tx->spill     = NULL;
    tx->spill_len = 0;
}
