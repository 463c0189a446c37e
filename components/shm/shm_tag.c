/*
 * Tagged messages: sending, matching and the unexpected queue.
 *
 * A message matches a receive when (msg_tag & mask) == (tag & mask) and the receive is for any
 * peer or for the message's endpoint; arriving messages meet posted receives in posting
 * order, new receives meet unexpected messages in arrival order, so each peer's messages
 * match in the order it sent them.
 *
 * Up to RNDV_THRESH (or at any size without CMA) a message is copied into the ring and the
 * send completes once it is there - at once for a message that fits the caller's copy. From
 * RNDV_THRESH with CMA only a descriptor goes (RNDV: the source address); the receiver reads
 * the data straight from the sender's buffer into its own once a receive matches, and answers
 * TAG_FIN, which completes the send; from memory the sender allocated with xfer_mem_alloc()
 * the descriptor also names its memfd, and the receiver copies from its mapping of it
 * (shm_map.c) instead. Unexpected messages are buffered up to MAX_UNEXPECTED
 * bytes per interface and MAX_UNEXPECTED_EP per endpoint (a descriptor costs only its
 * bookkeeping); beyond that the endpoint's ring is not read until receives drain the queue.
 */
#include "shm.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int tag_matches(uint64_t msg_tag, uint64_t tag, uint64_t mask)
{
    return ((msg_tag ^ tag) & mask) == 0;
}

/* A receive for any peer may be posted on other transports too: it is ours only if the
 * framework says so (tag_claim), else it completes cancelled and matching goes on. */
static int recv_claim(xfer_iface_h iface, xfer_shm_op_t *op)
{
    const xfer_iface_params_t *p = &iface->params;

    if ((p->tag_claim == NULL) || p->tag_claim(p->fw_arg, op->comp)) {
        return 1;
    }
    xfer_shm_op_complete(op, XFER_ERR_CANCELED, 0, 0);
    return 0;
}

static uint64_t unexp_cost(const xfer_shm_unexp_t *ue)
{
    return (ue->rndv ? 0 : ue->length) + XFER_SHM_ENTRY_OVERHEAD;
}

void xfer_shm_unexp_release(xfer_iface_h iface, xfer_shm_unexp_t *ue)
{
    ucs_list_del(&ue->list);
    iface->unexp_bytes  -= unexp_cost(ue);
    ue->ep->unexp_bytes -= unexp_cost(ue);
    free(ue);
}

/* May cost more bytes of unexpected messages be buffered? An endpoint that waits for answers
 * to its requests may go to twice the bounds, so that those answers are not held behind a
 * message nobody receives yet; past that it pauses anyway and memory stays bounded. */
static int unexp_room(xfer_ep_h ep, uint64_t cost)
{
    const xfer_shm_config_t *cfg = ep->iface->cfg;
    uint64_t iface_after         = ep->iface->unexp_bytes + cost;
    uint64_t ep_after            = ep->unexp_bytes + cost;

    if ((iface_after <= cfg->max_unexpected) && (ep_after <= cfg->max_unexpected_ep)) {
        return 1;
    }
    if (ep->peer_gone && (cost <= ep->in.seg_len)) {
        /* the peer wrote its last: what is left of it is in our ring, which bounds it, and
         * its end (a BYE or not) is known only once it is read */
        return 1;
    }
    return (ep->busy_slots > 0) && (iface_after <= 2 * cfg->max_unexpected) &&
           (ep_after <= 2 * cfg->max_unexpected_ep);
}

/* Read a RNDV message's data from the sender into receive op's buffer (n bytes of its length)
 * - from the sender's memfd mapped here when mem names one that maps (the copy shared with
 * the sender when large, shm_coop.c), else by CMA - tell the sender it may reuse its buffer,
 * and complete op: with done (and length and tag) if the data is in, else with the read's
 * failure; a shared copy completes op once the sender's parts are in. */
static void rndv_pull(xfer_ep_h ep, xfer_shm_op_t *op, uint64_t n, uint64_t src,
                      const xfer_shm_rndv_mem_t *mem, uint64_t send_id, xfer_status_t done,
                      uint64_t length, uint64_t tag)
{
    const uint8_t *mapped = ((mem != NULL) && (n > 0)) ? xfer_shm_peer_mem(ep, mem, 0) : NULL;
    char why[XFER_REASON_MAX];
    xfer_status_t status = XFER_OK;
    int later            = 0;

    if (mapped != NULL) {
        status = xfer_shm_coop_recv(ep, op, n, mapped, send_id, done, length, tag);
        later  = (status == XFER_INPROGRESS);
        if (status == XFER_ERR_UNSUPPORTED) {
            xfer_shm_copy(ep->iface, op->buf, mapped, n);
        }
        if ((status == XFER_INPROGRESS) || (status == XFER_ERR_UNSUPPORTED)) {
            status = XFER_OK;
        } else if (status != XFER_OK) {
            snprintf(why, sizeof(why), "the copy shared with the sender failed");
        }
    } else if (n > 0) {
        status = xfer_shm_cma(ep, op->buf, src, n, 0, why, sizeof(why));
    }
    if (status != XFER_OK) {
        xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "a %llu-byte message cannot be read from "
                 "the sender: %s", (unsigned long long)n, why);
    }
    if (ep->state == XFER_SHM_EP_CONNECTED) {
        if (xfer_shm_tx_ctrl(ep, XFER_SHM_F_TAG_FIN, status, send_id, 1) != XFER_OK) {
            xfer_shm_ep_fail_later(ep, XFER_ERR_NO_MEMORY, "out of memory for a message's "
                                   "completion notice");
        } else if (status == XFER_ERR_CONNECTION) {
            xfer_shm_ep_fail_later(ep, status, "%s", why);
        }
    }
    if (!later) {
        xfer_shm_op_complete(op, (status != XFER_OK) ? status : done, length, tag);
    }
}

/* A complete unexpected message meets its receive. */
static void unexp_deliver(xfer_iface_h iface, xfer_shm_unexp_t *ue, xfer_shm_op_t *op)
{
    uint64_t n           = (ue->length < op->len) ? ue->length : op->len;
    xfer_status_t status = (ue->length > op->len) ? XFER_ERR_TRUNCATED : XFER_OK;

    op->ep = ue->ep;
    if (ue->rndv) {
        rndv_pull(ue->ep, op, n, ue->src, ue->mapped ? &ue->mem : NULL, ue->send_id, status,
                  ue->length, ue->tag);
    } else {
        if (n > 0) {
            memcpy(op->buf, ue->data, n);
        }
        xfer_shm_op_complete(op, status, ue->length, ue->tag);
    }
    xfer_shm_unexp_release(iface, ue);
}

/* Did ep send a message, complete before it failed, that this receive would take? */
static int unexp_has(xfer_iface_h iface, xfer_ep_h ep, uint64_t tag, uint64_t tag_mask)
{
    xfer_shm_unexp_t *ue;

    ucs_list_for_each(ue, &iface->unexp, list) {
        if ((ue->ep == ep) && ue->complete && !ue->rndv && (ue->recv == NULL) &&
            tag_matches(ue->tag, tag, tag_mask)) {
            return 1;
        }
    }
    return 0;
}

xfer_status_t xfer_shm_tag_send(xfer_ep_h ep, uint64_t tag, const void *buf, size_t length,
                                xfer_memh_h memh, xfer_comp_t *comp)
{
    const xfer_shm_config_t *cfg;
    xfer_shm_rndv_mem_t mem;
    xfer_shm_frame_t hdr;
    xfer_status_t status;
    xfer_shm_op_t *op;
    size_t mem_len;
    uint64_t id;

    status = xfer_shm_ep_check(ep);
    if (status != XFER_OK) {
        return status;
    }
    if ((comp == NULL) || ((buf == NULL) && (length > 0))) {
        return XFER_ERR_INVALID_PARAM;
    }
    if (length > ep->max_msg) {
        xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "tag send of %zu bytes exceeds the message "
                 "limit of %llu bytes (XFER_SHM_MAX_MSG_SIZE, here or at the peer)", length,
                 (unsigned long long)ep->max_msg);
        return XFER_ERR_OUT_OF_RANGE;
    }
    cfg = ep->iface->cfg;
    if ((length <= cfg->rndv_thresh) && xfer_shm_tx_inline(ep, XFER_SHM_F_TAG, tag, length, buf,
                                                         (uint32_t)length)) {
        return XFER_OK;     /* copied into the ring: the caller may reuse its buffer */
    }
    if (ep->state != XFER_SHM_EP_CONNECTED) {
        return XFER_OK;     /* failing: the ep fails at the next progress(), with the message */
    }
    memset(&hdr, 0, sizeof(hdr));
    hdr.type = XFER_SHM_F_TAG;
    hdr.id   = tag;
    hdr.a    = length;
    if (!ep->cma || (length < cfg->rndv_thresh)) {
        if (length <= cfg->rndv_thresh) {
            /* copied: done, the caller may reuse its buffer now */
            status = xfer_shm_tx_queue(ep, NULL, &hdr, buf, length, 1, 0);
            if ((status == XFER_OK) && !ucs_list_is_empty(&ep->txq)) {
                xfer_shm_tx_write(ep);
            }
            return status;
        }
        /* without CMA, large data is written from the caller's buffer as cells free up */
        op = xfer_shm_op_new(ep->iface, ep, XFER_SHM_OP_SEND, comp, 0);
        if (op == NULL) {
            return XFER_ERR_NO_MEMORY;
        }
        op->buf      = (void*)buf;
        op->len      = length;
        op->on_write = 1;
        xfer_shm_tx_queue(ep, &op->tx, &hdr, buf, length, 0, 0);
        xfer_shm_tx_write(ep);
        return XFER_INPROGRESS;
    }
    /* from memory in a memfd (xfer_mem_alloc) the receiver may map it and copy by memcpy */
    mem_len = ((memh != NULL) && (memh->fd >= 0) && cfg->map) ? sizeof(mem) : 0;
    op      = xfer_shm_op_new(ep->iface, ep, XFER_SHM_OP_SEND, comp, mem_len);
    if (op == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    status = xfer_shm_slot_alloc(ep, op, &id);
    if (status != XFER_OK) {
        xfer_shm_op_free(op);
        return status;
    }
    op->buf    = (void*)buf;
    op->len    = length;
    op->tag    = tag;
    hdr.flags  = XFER_SHM_FL_RNDV;
    hdr.b      = (uint64_t)(uintptr_t)buf;
    hdr.c      = id;
    if (mem_len > 0) {
        memset(&mem, 0, sizeof(mem));
        mem.fd         = (uint32_t)memh->fd;
        mem.ino        = memh->ino;
        mem.offset     = memh->fd_offset;
        mem.length     = memh->length;
        mem.msg_offset = (uint64_t)((const uint8_t*)buf - memh->addr);
        memcpy(op->key, &mem, sizeof(mem));
        hdr.flags |= XFER_SHM_FL_MAPPED;
    }
    xfer_shm_tx_queue(ep, &op->tx, &hdr, (const uint8_t*)op->key, mem_len, 0, 0);
    xfer_shm_tx_write(ep);
    return XFER_INPROGRESS;
}

xfer_status_t xfer_shm_tag_recv(xfer_iface_h iface, xfer_ep_h ep, uint64_t tag,
                                uint64_t tag_mask, void *buf, size_t length, xfer_memh_h memh,
                                xfer_comp_t *comp)
{
    xfer_shm_unexp_t *ue;
    xfer_status_t status;
    xfer_shm_op_t *op;

    if ((iface == NULL) || (comp == NULL) || ((buf == NULL) && (length > 0)) ||
        ((ep != NULL) && (ep->iface != iface))) {
        return XFER_ERR_INVALID_PARAM;
    }
    if (ep != NULL) {
        status = xfer_shm_ep_check(ep);
        if ((status != XFER_OK) && !unexp_has(iface, ep, tag, tag_mask)) {
            return status;  /* nothing it sent before failing matches */
        }
    }
    op = xfer_shm_op_new(iface, ep, XFER_SHM_OP_RECV, comp, 0);
    if (op == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    op->buf   = buf;
    op->len   = length;
    op->memh  = memh;
    op->rtag  = tag;
    op->rmask = tag_mask;

    ucs_list_for_each(ue, &iface->unexp, list) {
        if ((ue->recv != NULL) || ((ep != NULL) && (ue->ep != ep)) ||
            !tag_matches(ue->tag, tag, tag_mask)) {
            continue;
        }
        if ((ep == NULL) && !recv_claim(iface, op)) {
            return XFER_INPROGRESS;     /* another transport's: completed cancelled */
        }
        if (ue->complete) {
            unexp_deliver(iface, ue, op);
        } else {
            ue->recv = op;      /* completes when the rest has arrived */
            op->ep   = ue->ep;
            op->busy = 1;
        }
        return XFER_INPROGRESS;
    }
    ucs_list_add_tail(&iface->posted, &op->list);
    return XFER_INPROGRESS;
}

xfer_status_t xfer_shm_tag_cancel(xfer_iface_h iface, xfer_comp_t *comp, xfer_status_t status)
{
    xfer_shm_unexp_t *ue;
    xfer_shm_op_t *op;
    xfer_ep_h ep;

    ucs_list_for_each(op, &iface->posted, list) {
        if (op->comp == comp) {
            ucs_list_del(&op->list);
            xfer_shm_op_complete(op, status, 0, 0);
            return XFER_OK;
        }
    }
    ucs_list_for_each(ue, &iface->unexp, list) {
        if ((ue->recv != NULL) && (ue->recv->comp == comp)) {
            return XFER_ERR_BUSY;
        }
    }
    ucs_list_for_each(ep, &iface->eps, list) {
        if (((ep->rx.kind == XFER_SHM_RX_TAG) && (ep->rx.op != NULL) &&
             (ep->rx.op->comp == comp)) || xfer_shm_coop_holds(ep, comp)) {
            return XFER_ERR_BUSY;   /* its data is arriving */
        }
    }
    return XFER_ERR_NOT_FOUND;
}

/* The first frame of a message: find its receive, or buffer it, or pause. */
xfer_status_t xfer_shm_rx_tag(xfer_ep_h ep, const xfer_shm_frame_t *hdr, const uint8_t *payload,
                              char *why, size_t why_size)
{
    xfer_iface_h iface = ep->iface;
    int rndv           = (hdr->flags & XFER_SHM_FL_RNDV) != 0;
    int mapped         = (hdr->flags & XFER_SHM_FL_MAPPED) != 0;
    uint64_t len       = hdr->a;
    xfer_shm_rndv_mem_t mem;
    xfer_shm_op_t *op, *tmp;
    xfer_shm_unexp_t *ue;

    if (len > iface->cfg->max_msg_size) {
        snprintf(why, why_size, "a %llu-byte message exceeds XFER_SHM_MAX_MSG_SIZE (%llu)",
                 (unsigned long long)len, (unsigned long long)iface->cfg->max_msg_size);
        return XFER_ERR_PROTOCOL;
    }
    if (rndv ? (!ep->cma || (hdr->len != (mapped ? sizeof(mem) : 0))) :
               (mapped || (hdr->len > len))) {
        snprintf(why, why_size, "a %s%s message of %llu bytes with %u in its first frame%s",
                 rndv ? "rendezvous" : "copied", mapped ? " mapped" : "",
                 (unsigned long long)len, hdr->len,
                 (rndv && !ep->cma) ? " on an endpoint without CMA" : "");
        return XFER_ERR_PROTOCOL;
    }
    if (mapped) {
        memcpy(&mem, payload, sizeof(mem));
        if ((mem.msg_offset > mem.length) || (len > mem.length - mem.msg_offset)) {
            snprintf(why, why_size, "a rendezvous message of %llu bytes at %llu of a %llu-byte "
                     "range of the sender's memfd", (unsigned long long)len,
                     (unsigned long long)mem.msg_offset, (unsigned long long)mem.length);
            return XFER_ERR_PROTOCOL;
        }
    }
    ucs_list_for_each_safe(op, tmp, &iface->posted, list) {
        uint64_t want;

        if (((op->ep != NULL) && (op->ep != ep)) || !tag_matches(hdr->id, op->rtag, op->rmask)) {
            continue;
        }
        ucs_list_del(&op->list);
        if ((op->ep == NULL) && !recv_claim(iface, op)) {
            continue;
        }
        op->ep = ep;
        want   = (len < op->len) ? len : op->len;
        if (!rndv && (hdr->len == len)) {
            /* the whole message is in this frame: no receive state to keep */
            if (want > 0) {
                memcpy(op->buf, payload, want);
            }
            xfer_shm_op_complete(op, (len > op->len) ? XFER_ERR_TRUNCATED : XFER_OK, len,
                                 hdr->id);
            return XFER_OK;
        }
        if (rndv) {
            rndv_pull(ep, op, want, hdr->b, mapped ? &mem : NULL, hdr->c,
                      (len > op->len) ? XFER_ERR_TRUNCATED : XFER_OK, len, hdr->id);
            return XFER_OK;
        }
        op->busy      = 1;
        ep->rx.op     = op;
        ep->rx.tag    = hdr->id;
        xfer_shm_rx_expect(ep, XFER_SHM_RX_TAG, op->buf, op->len, len);
        ep->rx.status = (len > op->len) ? XFER_ERR_TRUNCATED : XFER_OK;
        xfer_shm_rx_feed(ep, payload, hdr->len);
        return XFER_OK;
    }
    if (!unexp_room(ep, (rndv ? 0 : len) + XFER_SHM_ENTRY_OVERHEAD)) {
        return XFER_ERR_BUSY;
    }
    ue = malloc(sizeof(*ue) + (rndv ? 0 : len));
    if (ue == NULL) {
        snprintf(why, why_size, "out of memory for a %llu-byte unexpected message",
                 (unsigned long long)len);
        return XFER_ERR_NO_MEMORY;
    }
    ue->ep       = ep;
    ue->tag      = hdr->id;
    ue->length   = len;
    ue->rndv     = rndv;
    ue->src      = hdr->b;
    ue->send_id  = hdr->c;
    ue->mapped   = mapped;
    if (mapped) {
        ue->mem = mem;
    }
    ue->complete = rndv;
    ue->recv     = NULL;
    ucs_list_add_tail(&iface->unexp, &ue->list);
    iface->unexp_bytes += unexp_cost(ue);
    ep->unexp_bytes    += unexp_cost(ue);
    if (!rndv) {
        ep->rx.ue  = ue;
        ep->rx.tag = hdr->id;
        xfer_shm_rx_expect(ep, XFER_SHM_RX_TAG, ue->data, len, len);
        xfer_shm_rx_feed(ep, payload, hdr->len);
    }
    return XFER_OK;
}

xfer_status_t xfer_shm_rx_tag_done(xfer_ep_h ep, char *why, size_t why_size)
{
    xfer_shm_unexp_t *ue = ep->rx.ue;

    (void)why;
    (void)why_size;
    if (ep->rx.op != NULL) {
        xfer_shm_op_complete(ep->rx.op, ep->rx.status, ep->rx.total, ep->rx.tag);
        return XFER_OK;
    }
    ue->complete = 1;
    if (ue->recv != NULL) {
        xfer_shm_op_t *op = ue->recv;

        ue->recv = NULL;
        unexp_deliver(ep->iface, ue, op);
    }
    return XFER_OK;
}

xfer_status_t xfer_shm_rx_tag_fin(xfer_ep_h ep, const xfer_shm_frame_t *hdr,
                                  const uint8_t *payload, char *why, size_t why_size)
{
    xfer_shm_slot_t *slot = xfer_shm_slot_find(ep, hdr->id);
    xfer_shm_op_t *op;

    (void)payload;
    if ((slot == NULL) || (slot->op == NULL) || (slot->op->kind != XFER_SHM_OP_SEND)) {
        snprintf(why, why_size, "a completion notice for message %llx, which is not one of "
                 "ours in flight", (unsigned long long)hdr->id);
        return XFER_ERR_PROTOCOL;
    }
    op = slot->op;
    xfer_shm_slot_free(ep, op->slot);
    xfer_shm_op_complete(op, xfer_shm_status_from_peer(hdr->status), op->len, 0);
    return XFER_OK;
}
