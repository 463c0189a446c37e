/*
 * Tagged messages over shm: sending, and handing arriving ones to the framework's matching
 * (framework/tag_match.c), which says where each one's data goes.
 *
 * Up to RNDV_THRESH (or at any size without CMA) a message is copied into the ring and the
 * send completes once it is there - at once for a message that fits the caller's copy. From
 * RNDV_THRESH with CMA only a descriptor goes (RNDV: the source address); the receiver reads
 * the data straight from the sender's buffer into its own once a receive takes it (at once,
 * or when the framework asks, tag_pull), a slice per round of progress (shm_pull.c), and
 * answers TAG_FIN, which completes the send; from
 * memory the sender allocated with xfer_mem_alloc() the descriptor also names its memfd, and
 * the receiver copies from its mapping of it (shm_map.c) instead. A message nobody receives
 * past the bounds leaves the ring unread (the endpoint's input pauses there) until the
 * framework has room; one whose peer is gone is kept past them, the ring bounding what is
 * left, so that its end is seen.
 */
#include "shm.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What the framework keeps of a rendezvous message until a receive takes it. */
typedef struct rndv_priv {
    uint64_t            src, send_id;
    uint32_t            mapped;
    xfer_shm_rndv_mem_t mem;
} rndv_priv_t;

_Static_assert(sizeof(rndv_priv_t) <= XFER_TAG_PRIV_MAX, "a rendezvous message's description "
               "fits what the framework keeps");

/* A RNDV message's data is in receive op's buffer (n bytes), or could not be read (status,
 * why): tell the sender it may reuse its buffer, and complete op - which hands the
 * framework's receive its status when delivered. */
static void rndv_finish(xfer_ep_h ep, xfer_shm_op_t *op, uint64_t n, uint64_t send_id,
                        xfer_status_t status, const char *why)
{
    if (status != XFER_OK) {
        xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "a %llu-byte message cannot be read from "
                 "the sender: %s", (unsigned long long)n, why);
    }
    if (ep->fail.state == XFER_EP_CONNECTED) {
        if (xfer_shm_tx_ctrl(ep, XFER_SHM_F_TAG_FIN, status, send_id, 1) != XFER_OK) {
            xfer_shm_ep_fail_later(ep, XFER_ERR_NO_MEMORY, "out of memory for a message's "
                                   "completion notice");
        } else if (status == XFER_ERR_CONNECTION) {
            xfer_shm_ep_fail_later(ep, status, "%s", why);
        }
    }
    xfer_shm_op_complete(op, status, n, 0);
}

static void rndv_pull_done(xfer_shm_pull_t *p, xfer_status_t status)
{
    rndv_finish(p->ep, p->op, p->len, p->id, status, p->why);
}

/* Read a RNDV message's data from the sender into receive op's buffer (n bytes of its length)
 * - from the sender's memfd mapped here when mem names one that maps (the copy shared with
 * the sender when large, shm_coop.c), else by CMA, a slice per round of progress when larger
 * than one (shm_pull.c) - then rndv_finish(); a shared copy completes op once the sender's
 * parts are in. */
static void rndv_pull(xfer_ep_h ep, xfer_shm_op_t *op, uint64_t n, uint64_t src,
                      const xfer_shm_rndv_mem_t *mem, uint64_t send_id)
{
    const uint8_t *mapped = ((mem != NULL) && (n > 0)) ? xfer_shm_peer_mem(ep, mem, 0) : NULL;
    char why[XFER_REASON_MAX] = "";
    xfer_status_t status = XFER_OK;

    if (mapped != NULL) {
        status = xfer_shm_coop_recv(ep, op, n, mapped, send_id, XFER_OK, n, 0);
        if (status == XFER_INPROGRESS) {
            status = XFER_OK;
            if (ep->fail.state == XFER_EP_CONNECTED) {
                /* the sender learns of it now; the op completes once its parts are in */
                if (xfer_shm_tx_ctrl(ep, XFER_SHM_F_TAG_FIN, status, send_id, 1) != XFER_OK) {
                    xfer_shm_ep_fail_later(ep, XFER_ERR_NO_MEMORY, "out of memory for a "
                                           "message's completion notice");
                }
            }
            return;
        }
        if (status == XFER_ERR_UNSUPPORTED) {
            xfer_shm_copy(ep->iface, op->buf, mapped, n);
            status = xfer_shm_read_end(ep, why, sizeof(why));
        } else if (status != XFER_OK) {
            snprintf(why, sizeof(why), "the copy shared with the sender failed");
        }
    } else if (n > 0) {
        status = xfer_shm_pull(ep, op->buf, src, n, rndv_pull_done, op, send_id, why,
                               sizeof(why));
        if (status == XFER_INPROGRESS) {
            return;     /* the rest from progress */
        }
    }
    rndv_finish(ep, op, n, send_id, status, why);
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
    if (length > ep->max_msg) {
        return xfer_op_too_long(XFER_SHM_SUBSYS, "tag send", length, ep->max_msg,
                                "XFER_SHM_MAX_MSG_SIZE");
    }
    cfg = ep->iface->cfg;
    if ((length <= cfg->rndv_thresh) && xfer_shm_tx_inline(ep, XFER_SHM_F_TAG, tag, length, buf,
                                                         (uint32_t)length)) {
        return XFER_OK;     /* copied into the ring: the caller may reuse its buffer */
    }
    if (ep->fail.state != XFER_EP_CONNECTED) {
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
    status = xfer_slot_alloc(&ep->slots, XFER_SHM_SLOT_SEND, op, &id, &op->slot);
    if (status != XFER_OK) {
        xfer_shm_op_free(op);
        return status;
    }
    op->buf    = (void*)buf;
    op->len    = length;
    op->base.tag = tag;
    hdr.flags  = XFER_SHM_FL_RNDV;
    hdr.b      = (uint64_t)(uintptr_t)buf;
    hdr.c      = id;
    if (mem_len > 0) {
        memset(&mem, 0, sizeof(mem));
        mem.fd         = (uint32_t)memh->fd;
        mem.ino        = memh->ino;
        mem.offset     = memh->fd_offset;
        mem.length     = memh->region.length;
        mem.msg_offset = (uint64_t)((const uint8_t*)buf - memh->region.addr);
        memcpy(op->key, &mem, sizeof(mem));
        hdr.flags |= XFER_SHM_FL_MAPPED;
    }
    xfer_shm_tx_queue(ep, &op->tx, &hdr, (const uint8_t*)op->key, mem_len, 0, 0);
    xfer_shm_tx_write(ep);
    return XFER_INPROGRESS;
}

/* A receive's op for a rendezvous message: its data lands in buf (capacity bytes) by
 * rndv_pull, and its completion hands the framework's handle its status (deliver_one). */
static xfer_status_t rndv_start(xfer_ep_h ep, void *handle, void *buf, size_t capacity,
                                xfer_memh_h memh, uint64_t length, const rndv_priv_t *r)
{
    xfer_shm_op_t *op = xfer_shm_op_new(ep->iface, ep, XFER_SHM_OP_RECV, NULL, 0);
    uint64_t n        = (length < capacity) ? length : capacity;

    if (op == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    op->buf        = buf;
    op->len        = capacity;
    op->memh       = memh;
    op->base.tag_handle = handle;
    rndv_pull(ep, op, n, r->src, r->mapped ? &r->mem : NULL, r->send_id);
    return XFER_INPROGRESS;
}

xfer_status_t xfer_shm_tag_pull(xfer_ep_h ep, const void *priv, size_t priv_len,
                                uint64_t length, void *buf, size_t capacity, xfer_memh_h memh,
                                void *handle)
{
    rndv_priv_t r;

    if ((priv_len != sizeof(r)) || (ep->fail.state != XFER_EP_CONNECTED)) {
        return (ep->fail.state != XFER_EP_CONNECTED) ? xfer_shm_ep_check(ep) :
               XFER_ERR_INTERNAL;
    }
    memcpy(&r, priv, sizeof(r));
    return rndv_start(ep, handle, buf, capacity, memh, length, &r);
}

/* The first frame of a message: its data goes where the framework says, or the endpoint's
 * input pauses on it. */
xfer_status_t xfer_shm_rx_tag(xfer_ep_h ep, const xfer_shm_frame_t *hdr, const uint8_t *payload,
                              char *why, size_t why_size)
{
    const xfer_iface_params_t *p = &ep->iface->params;
    int rndv                     = (hdr->flags & XFER_SHM_FL_RNDV) != 0;
    int mapped                   = (hdr->flags & XFER_SHM_FL_MAPPED) != 0;
    uint64_t len                 = hdr->a;
    unsigned flags               = rndv ? XFER_TAG_ARRIVE_RNDV : 0;
    rndv_priv_t r;
    xfer_tag_dest_t dest;
    xfer_status_t status;

    if (len > ep->iface->cfg->max_msg_size) {
        snprintf(why, why_size, "a %llu-byte message exceeds XFER_SHM_MAX_MSG_SIZE (%llu)",
                 (unsigned long long)len, (unsigned long long)ep->iface->cfg->max_msg_size);
        return XFER_ERR_PROTOCOL;
    }
    if (rndv ? (!ep->cma || (hdr->len != (mapped ? sizeof(r.mem) : 0))) :
               (mapped || (hdr->len > len))) {
        snprintf(why, why_size, "a %s%s message of %llu bytes with %u in its first frame%s",
                 rndv ? "rendezvous" : "copied", mapped ? " mapped" : "",
                 (unsigned long long)len, hdr->len,
                 (rndv && !ep->cma) ? " on an endpoint without CMA" : "");
        return XFER_ERR_PROTOCOL;
    }
    if (rndv) {     /* what the framework keeps of it until a receive takes it */
        memset(&r, 0, sizeof(r));
        r.src     = hdr->b;
        r.send_id = hdr->c;
        r.mapped  = mapped;
    }
    if (mapped) {   /* rndv too, checked above */
        memcpy(&r.mem, payload, sizeof(r.mem));
        if ((r.mem.msg_offset > r.mem.length) || (len > r.mem.length - r.mem.msg_offset)) {
            snprintf(why, why_size, "a rendezvous message of %llu bytes at %llu of a %llu-byte "
                     "range of the sender's memfd", (unsigned long long)len,
                     (unsigned long long)r.mem.msg_offset, (unsigned long long)r.mem.length);
            return XFER_ERR_PROTOCOL;
        }
    }
    if (ep->slots.busy > 0) {
        flags |= XFER_TAG_ARRIVE_URGENT;    /* our answers wait behind it */
    }
    if (ep->peer_gone) {
        flags |= XFER_TAG_ARRIVE_FORCE;     /* what is left of the peer is in the ring */
    }
    switch (xfer_tag_arrive(p->fw_arg, ep->fail.fw_ep, hdr->id, len, flags, rndv ? &r : NULL,
                            rndv ? sizeof(r) : 0, &dest)) {
    case XFER_TAG_MATCHED:
        if (rndv) {
            status = rndv_start(ep, dest.handle, dest.buf, dest.capacity, dest.memh, len, &r);
            if (status != XFER_INPROGRESS) {
                xfer_tag_done(dest.handle, status);
            }
            return XFER_OK;
        }
        if (hdr->len == len) {
            /* the whole message is in this frame: no receive state to keep */
            uint64_t n = (len < dest.capacity) ? len : dest.capacity;

            if (n > 0) {
                memcpy(dest.buf, payload, n);
            }
            xfer_tag_done(dest.handle, XFER_OK);
            return XFER_OK;
        }
        ep->rx.tag_handle = dest.handle;
        xfer_shm_rx_expect(ep, XFER_SHM_RX_TAG, dest.buf, dest.capacity, len);
        xfer_shm_rx_feed(ep, payload, hdr->len);
        return XFER_OK;
    case XFER_TAG_UNEXPECTED:
        if (!rndv) {
            ep->rx.tag_handle = dest.handle;
            xfer_shm_rx_expect(ep, XFER_SHM_RX_TAG, dest.buf, len, len);
            xfer_shm_rx_feed(ep, payload, hdr->len);
        }
        return XFER_OK;
    case XFER_TAG_PAUSE:
        return XFER_ERR_BUSY;
    default:
        snprintf(why, why_size, "out of memory for a %llu-byte message nobody received yet",
                 (unsigned long long)len);
        return XFER_ERR_NO_MEMORY;
    }
}

xfer_status_t xfer_shm_rx_tag_done(xfer_ep_h ep, char *why, size_t why_size)
{
    void *handle = ep->rx.tag_handle;

    (void)why;
    (void)why_size;
    ep->rx.tag_handle = NULL;
    xfer_tag_done(handle, XFER_OK);
    return XFER_OK;
}

xfer_status_t xfer_shm_rx_tag_fin(xfer_ep_h ep, const xfer_shm_frame_t *hdr,
                                  const uint8_t *payload, char *why, size_t why_size)
{
    xfer_shm_op_t *op = xfer_slot_answered(&ep->slots, hdr->id, XFER_SHM_SLOT_SEND,
                                           "a message's completion notice", why, why_size);

    (void)payload;
    if (op == NULL) {
        return XFER_ERR_PROTOCOL;
    }
    xfer_slot_free(&ep->slots, op->slot);
    xfer_shm_op_complete(op, xfer_shm_status_from_peer(hdr->status), op->len, 0);
    return XFER_OK;
}
