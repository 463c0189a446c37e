/*
 * One-sided operations over shm: registered regions, remote keys, put and get.
 *
 * A region is known to peers by {id, its own random key, address, length, pid}. Every
 * put and get is carried out by the target, after it checked the request against its live
 * registrations (the id is registered, the key is that region's, the range lies inside): so
 * a deregistered region is never written, whatever a peer holds. With CMA the target reads a
 * put's data from the initiator's buffer straight into the region, and writes a get's data
 * from the region straight into the initiator's buffer - one copy; otherwise the data goes
 * through the ring. A put completes when its PUT_ACK says the data is in the target's memory,
 * a get when its data is in the local buffer.
 *
 * Memory the target allocated with xfer_mem_alloc() lives in a sealed memfd, whose descriptor
 * and inode come in the key. At the first put or get with such a key the initiator maps that
 * range (shm_map.c checks it) and from then on moves the data itself with memcpy: the put or
 * get is complete when posted. What a deregistration means changes with it: the target frees
 * the memory from its own address space, and a peer still mapping it writes pages that no
 * longer belong to anything of the target's - never other memory of the target's.
 */
#include "shm.h"


#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A region of [addr, addr + length): host memory unless params says CUDA. */
static xfer_status_t region_add(xfer_iface_h iface, void *addr, size_t length,
                                const xfer_mem_reg_params_t *params, xfer_memh_h *memh_p)
{
    xfer_status_t status;
    xfer_memh_h memh;

    status = xfer_region_new(iface->base.regions, sizeof(*memh), addr, length, &memh);
    if (status != XFER_OK) {
        return status;
    }
    memh->fd = -1;      /* no memfd: the key says so, and names no inode */
    status   = ((params != NULL) && (params->attr->type == XFER_MEM_CUDA)) ?
               xfer_shm_cuda_reg(iface, params, memh) : XFER_OK;
    if (status != XFER_OK) {
        xfer_region_remove(iface->base.regions, memh->region.id, memh, XFER_SHM_SUBSYS);
        free(memh);
        return status;
    }
    *memh_p = memh;
    return XFER_OK;
}

xfer_status_t xfer_shm_mem_reg(xfer_iface_h iface, void *addr, size_t length,
                               xfer_mem_type_t mem_type, xfer_memh_h *memh_p)
{
    if (mem_type != XFER_MEM_HOST) {
        return XFER_ERR_UNSUPPORTED;    /* CUDA memory comes with its attributes (below) */
    }
    return region_add(iface, addr, length, NULL, memh_p);
}

xfer_status_t xfer_shm_mem_reg_params(xfer_iface_h iface, const xfer_mem_reg_params_t *params,
                                      xfer_memh_h *memh_p)
{
    xfer_status_t status;

    if ((params->attr->type != XFER_MEM_HOST) && (params->attr->type != XFER_MEM_CUDA)) {
        return XFER_ERR_INVALID_PARAM;
    }
    status = region_add(iface, params->addr, params->length, params, memh_p);
    if ((status == XFER_OK) && XFER_MEM_REG_PARAMS_HAS_FD(params) && (params->fd >= 0)) {
        (*memh_p)->fd        = params->fd;
        (*memh_p)->fd_offset = params->fd_offset;
        (*memh_p)->ino       = xfer_shm_fd_ino(params->fd);
    }
    return status;
}

static int in_region(xfer_memh_h memh, const void *p)
{
    const xfer_region_t *r = &memh->region;

    return ((const uint8_t*)p >= r->addr) && ((const uint8_t*)p < r->addr + r->length);
}

void xfer_shm_mem_dereg(xfer_iface_h iface, xfer_memh_h memh)
{
    xfer_shm_tx_t *tx;
    xfer_ep_h ep;

    if (!xfer_region_remove(iface->base.regions, memh->region.id, memh, XFER_SHM_SUBSYS)) {
        return;
    }
    ucs_list_for_each(ep, &iface->eps, list) {
        /* a put arriving into it goes nowhere, and fails */
        if ((ep->rx.kind == XFER_SHM_RX_PUT) && (ep->rx.dest != NULL) &&
            in_region(memh, ep->rx.dest)) {
            ep->rx.dest   = NULL;
            ep->rx.cap    = 0;
            ep->rx.status = XFER_ERR_NOT_FOUND;
        }
        /* get answers still to be written from it take a copy of what they send */
        ucs_list_for_each(tx, &ep->txq, list) {
            if ((tx->hdr.type == XFER_SHM_F_GET_RESP) && (tx->owned == NULL) &&
                (tx->len > 0) && in_region(memh, tx->data)) {
                tx->owned = malloc(tx->len);
                if (tx->owned == NULL) {
                    xfer_shm_ep_fail_later(ep, XFER_ERR_NO_MEMORY, "out of memory to keep "
                                           "a get's answer from a region being deregistered");
                    break;
                }
                memcpy(tx->owned, tx->data, tx->len);
                tx->data = tx->owned;
            }
        }
    }
    free(memh);
}

xfer_status_t xfer_shm_rkey_pack(xfer_iface_h iface, xfer_memh_h memh, void *buf,
                                 size_t *len_p)
{
    uint8_t *b = buf;
    uint32_t pid;

    (void)iface;
    if (!xfer_out_room(buf, len_p, memh->cuda ? XFER_SHM_RKEY_CUDA_LEN : XFER_SHM_RKEY_LEN)) {
        return XFER_ERR_NO_RESOURCE;
    }
    xfer_region_key_pack(&memh->region, b);
    pid = (uint32_t)getpid();
    memcpy(b + 32, &pid, 4);
    pid = (memh->fd >= 0) ? (uint32_t)memh->fd : XFER_SHM_RKEY_NO_FD;
    memcpy(b + 36, &pid, 4);
    memcpy(b + 40, &memh->ino, 8);
    memcpy(b + 48, &memh->fd_offset, 8);
    memset(b + 56, 0, XFER_SHM_RKEY_LEN - 56);
    b[56] = (uint8_t)memh->cuda;
    if (memh->cuda) {
        xfer_shm_cuda_rkey_pack(memh, b + XFER_SHM_RKEY_LEN);
    }
    return XFER_OK;
}

xfer_status_t xfer_shm_rkey_unpack(xfer_iface_h iface, const void *buf, size_t len,
                                   xfer_rkey_h *rkey_p)
{
    const uint8_t *b = buf;
    xfer_region_key_t k;
    xfer_rkey_h rkey;

    if ((len < XFER_SHM_RKEY_LEN) || (b[56] > 1) ||
        (len != (b[56] ? XFER_SHM_RKEY_CUDA_LEN : XFER_SHM_RKEY_LEN)) ||
        (xfer_region_key_unpack(b, &k) != XFER_OK)) {
        xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "remote key of %zu bytes is not an shm key "
                 "(%u bytes, %u of CUDA memory, bounds that do not wrap)", len,
                 XFER_SHM_RKEY_LEN, XFER_SHM_RKEY_CUDA_LEN);
        return XFER_ERR_INVALID_PARAM;
    }
    rkey = calloc(1, sizeof(*rkey));
    if (rkey == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    rkey->k = k;
    memcpy(&rkey->pid, b + 32, 4);
    memcpy(&rkey->fd, b + 36, 4);
    memcpy(&rkey->ino, b + 40, 8);
    memcpy(&rkey->fd_offset, b + 48, 8);
    if (b[56] && (xfer_shm_cuda_rkey_unpack(rkey, b + XFER_SHM_RKEY_LEN) != XFER_OK)) {
        free(rkey);
        return XFER_ERR_INVALID_PARAM;
    }
    /* nothing is mapped here until it is used; no fd, or XFER_SHM_MAP=n: never */
    rkey->map_state = ((rkey->fd == XFER_SHM_RKEY_NO_FD) || !iface->cfg->map) ? -1 : 0;
    *rkey_p = rkey;
    return XFER_OK;
}

void xfer_shm_rkey_release(xfer_iface_h iface, xfer_rkey_h rkey)
{
    if (rkey != NULL) {
        xfer_shm_peer_unmap(&rkey->map);
        xfer_shm_cuda_rkey_release(iface, rkey);
    }
    free(rkey);
}

int xfer_shm_cuda_reaches(xfer_ep_h ep, xfer_rkey_h rkey)
{
    return rkey->cuda || xfer_shm_rkey_mapped(ep, rkey);
}

int xfer_shm_rkey_mapped(xfer_ep_h ep, xfer_rkey_h rkey)
{
    xfer_shm_peer_fd_t pf = {0};
    char why[XFER_REASON_MAX];
    xfer_status_t status;

    if (rkey->map_state != 0) {
        return rkey->map_state > 0;
    }
    pf.pid    = ep->peer_pid;
    pf.fd     = rkey->fd;
    pf.ino    = rkey->ino;
    pf.offset = rkey->fd_offset;
    pf.length = rkey->k.length;
    status    = xfer_shm_peer_map(&pf, &rkey->map, why, sizeof(why));
    if (status != XFER_OK) {
        /* the peer carries out this key's puts and gets instead, checking each */
        xfer_log((status == XFER_ERR_PROTOCOL) ? XFER_LOG_WARN : XFER_LOG_INFO,
                 XFER_SHM_SUBSYS, "puts and gets to %llu bytes at 0x%llx of pid %d go through "
                 "the peer: %s", (unsigned long long)rkey->k.length,
                 (unsigned long long)rkey->k.addr, (int)ep->peer_pid, why);
        rkey->map_state = -1;
        return 0;
    }
    xfer_log(XFER_LOG_DEBUG, XFER_SHM_SUBSYS, "mapped %llu bytes at 0x%llx of pid %d: puts "
             "and gets to them are a memcpy here", (unsigned long long)rkey->k.length,
             (unsigned long long)rkey->k.addr, (int)ep->peer_pid);
    rkey->map_state = 1;
    return 1;
}

/* ---- initiator ------------------------------------------------------------------------------ */

xfer_status_t xfer_shm_rma_post(xfer_ep_h ep, xfer_shm_op_kind_t kind, void *buf, size_t length,
                                xfer_memh_h memh, uint64_t remote_addr, xfer_rkey_h rkey,
                                xfer_comp_t *comp)
{
    const char *what     = (kind == XFER_SHM_OP_PUT) ? "put" : "get";
    xfer_status_t status = xfer_shm_ep_check(ep);
    xfer_shm_frame_t hdr;
    xfer_shm_op_t *op;
    uint64_t id;
    int rndv;

    if (status != XFER_OK) {
        return status;
    }
    if (!xfer_range_within(rkey->k.addr, rkey->k.length, remote_addr, length)) {
        return XFER_ERR_OUT_OF_RANGE;
    }
    if (rkey->pid != (uint32_t)ep->peer_pid) {
        xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "%s with a key of pid %u on an endpoint to "
                 "pid %d", what, rkey->pid, (int)ep->peer_pid);
        return XFER_ERR_INVALID_PARAM;
    }
    if (xfer_shm_cuda_moves(memh, rkey)) {
        /* the driver copies here: the peer's device memory opened by its IPC handle, or
         * device memory here to or from the peer's mapped memory; else declined before
         * anything moved, and the framework stages it */
        return xfer_shm_cuda_reaches(ep, rkey) ?
               xfer_shm_cuda_rma(ep, kind == XFER_SHM_OP_PUT, buf, length, memh, remote_addr,
                                 rkey) : XFER_ERR_UNSUPPORTED;
    }
    if (xfer_shm_rkey_mapped(ep, rkey)) {
        uint8_t *remote = rkey->map.data + (remote_addr - rkey->k.addr);

        if (length == 0) {
            return XFER_OK;
        }
        if ((kind == XFER_SHM_OP_PUT) && (memh != NULL)) {
            status = xfer_shm_coop_put(ep, buf, length, memh, remote, remote_addr, rkey, comp);
            if (status != XFER_ERR_UNSUPPORTED) {
                return status;
            }
        }
        if (kind == XFER_SHM_OP_PUT) {
            xfer_shm_copy(ep->iface, remote, buf, length);
        } else {
            xfer_shm_copy(ep->iface, buf, remote, length);
        }
        return XFER_OK;
    }
    if (length > ep->max_msg) {
        return xfer_op_too_long(XFER_SHM_SUBSYS, what, length, ep->max_msg,
                                "XFER_SHM_MAX_MSG_SIZE");
    }
    op = xfer_shm_op_new(ep->iface, ep, kind, comp, 0);
    if (op == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    status = xfer_slot_alloc(&ep->slots, (kind == XFER_SHM_OP_PUT) ? XFER_SHM_SLOT_PUT :
                             XFER_SHM_SLOT_GET, op, &id, &op->slot);
    if (status != XFER_OK) {
        xfer_shm_op_free(op);
        return status;
    }
    rndv       = ep->cma && (length >= ep->iface->cfg->rndv_thresh);
    op->buf    = buf;
    op->len    = length;
    op->serial = xfer_flushes_posted(&ep->flushes);
    memset(&hdr, 0, sizeof(hdr));
    hdr.type  = (kind == XFER_SHM_OP_PUT) ? XFER_SHM_F_PUT : XFER_SHM_F_GET;
    hdr.flags = rndv ? XFER_SHM_FL_RNDV : 0;
    hdr.id    = id;
    hdr.a     = rkey->k.id;
    hdr.b     = remote_addr;
    hdr.c     = length;
    hdr.d     = rndv ? (uint64_t)(uintptr_t)buf : 0;
    hdr.e     = rkey->k.key;
    if ((kind == XFER_SHM_OP_PUT) && !rndv) {
        xfer_shm_tx_queue(ep, &op->tx, &hdr, buf, length, 0, 0);
    } else {
        xfer_shm_tx_queue(ep, &op->tx, &hdr, NULL, 0, 0, 0);
    }
    xfer_shm_tx_write(ep);
    return XFER_INPROGRESS;
}

xfer_status_t xfer_shm_put(xfer_ep_h ep, const void *buf, size_t length, xfer_memh_h memh,
                           uint64_t remote_addr, xfer_rkey_h rkey, xfer_comp_t *comp)
{
    return xfer_shm_rma_post(ep, XFER_SHM_OP_PUT, (void*)buf, length, memh, remote_addr, rkey,
                             comp);
}

xfer_status_t xfer_shm_get(xfer_ep_h ep, void *buf, size_t length, xfer_memh_h memh,
                           uint64_t remote_addr, xfer_rkey_h rkey, xfer_comp_t *comp)
{
    return xfer_shm_rma_post(ep, XFER_SHM_OP_GET, buf, length, memh, remote_addr, rkey, comp);
}

xfer_status_t xfer_shm_rx_put_ack(xfer_ep_h ep, const xfer_shm_frame_t *hdr,
                                  const uint8_t *payload, char *why, size_t why_size)
{
    xfer_shm_op_t *op = xfer_slot_answered(&ep->slots, hdr->id, XFER_SHM_SLOT_PUT,
                                           "a put acknowledgement", why, why_size);
    xfer_status_t status;

    (void)payload;
    if (op == NULL) {
        return XFER_ERR_PROTOCOL;
    }
    status = xfer_shm_status_from_peer(hdr->status);
    xfer_slot_free(&ep->slots, op->slot);
    xfer_shm_op_complete(op, status, (status == XFER_OK) ? op->len : 0, 0);
    return XFER_OK;
}

xfer_status_t xfer_shm_rx_get_resp(xfer_ep_h ep, const xfer_shm_frame_t *hdr,
                                   const uint8_t *payload, char *why, size_t why_size)
{
    xfer_shm_op_t *op = xfer_slot_answered(&ep->slots, hdr->id, XFER_SHM_SLOT_GET, "get data",
                                           why, why_size);
    xfer_status_t status;

    if (op == NULL) {
        return XFER_ERR_PROTOCOL;
    }
    status = xfer_shm_status_from_peer(hdr->status);
    if ((status != XFER_OK) || (hdr->flags & XFER_SHM_FL_RNDV)) {
        if (hdr->len != 0) {
            snprintf(why, why_size, "get data with %u bytes in a frame that carries none",
                     hdr->len);
            return XFER_ERR_PROTOCOL;
        }
        xfer_slot_free(&ep->slots, op->slot);
        xfer_shm_op_complete(op, status, (status == XFER_OK) ? op->len : 0, 0);
        return XFER_OK;
    }
    if ((hdr->a != op->len) || (hdr->len > hdr->a)) {
        snprintf(why, why_size, "get data of %llu bytes (%u in its first frame) for a get of "
                 "%zu", (unsigned long long)hdr->a, hdr->len, op->len);
        return XFER_ERR_PROTOCOL;
    }
    ep->rx.op = op;
    xfer_shm_rx_expect(ep, XFER_SHM_RX_GET_RESP, op->buf, op->len, hdr->a);
    xfer_shm_rx_feed(ep, payload, hdr->len);
    return XFER_OK;
}

xfer_status_t xfer_shm_rx_get_resp_done(xfer_ep_h ep, char *why, size_t why_size)
{
    xfer_shm_op_t *op = ep->rx.op;

    (void)why;
    (void)why_size;
    xfer_slot_free(&ep->slots, op->slot);
    xfer_shm_op_complete(op, XFER_OK, op->len, 0);
    return XFER_OK;
}

/* ---- target --------------------------------------------------------------------------------- */

xfer_region_t *xfer_shm_region_named(xfer_ep_h ep, uint64_t id, uint64_t key, int again,
                                     xfer_status_t *status_p)
{
    char why[XFER_REASON_MAX];
    xfer_region_t *r = xfer_region_named(ep->iface->base.regions, id, key, &ep->iface->base.failq,
                                         &ep->fail, again ? NULL : &ep->bad_keys, status_p,
                                         why, sizeof(why));

    if ((r != NULL) && ucs_container_of(r, struct xfer_memh, region)->cuda) {
        /* the initiator copies CUDA memory itself (shm_cuda.c); a frame naming it is not
         * carried out here, where nothing may touch device memory */
        xfer_log(XFER_LOG_WARN, XFER_SHM_SUBSYS, "refusing a put, get or batch of pid %d into "
                 "CUDA memory by frames", (int)ep->peer_pid);
        *status_p = XFER_ERR_UNSUPPORTED;
        return NULL;
    }
    return r;
}

uint8_t *xfer_shm_region_check(xfer_ep_h ep, const xfer_shm_frame_t *hdr, int again,
                               xfer_status_t *status_p)
{
    xfer_region_t *r = xfer_shm_region_named(ep, hdr->a, hdr->e, again, status_p);
    char why[XFER_REASON_MAX];
    uint8_t *at;

    if (r == NULL) {
        return NULL;
    }
    at = xfer_region_at(r, hdr->b, hdr->c, why, sizeof(why));
    *status_p = (at != NULL) ? XFER_OK : XFER_ERR_OUT_OF_RANGE;
    return at;
}

static xfer_status_t answer(xfer_ep_h ep, unsigned type, xfer_status_t status, uint64_t id,
                            char *why, size_t why_size)
{
    if (xfer_shm_tx_ctrl(ep, type, status, id, 1) != XFER_OK) {
        snprintf(why, why_size, "out of memory for an answer");
        return XFER_ERR_NO_MEMORY;
    }
    return XFER_OK;
}

/* A peer's request moved data by CMA: a failure of the peer's process fails the ep too. */
static xfer_status_t rndv_move(xfer_ep_h ep, void *local, uint64_t remote, uint64_t len,
                               int to_peer)
{
    char why[XFER_REASON_MAX];
    xfer_status_t status = xfer_shm_cma(ep, local, remote, len, to_peer, why, sizeof(why));

    if (status != XFER_OK) {
        xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "a peer's %s: %s", to_peer ? "get" : "put",
                 why);
        if (status == XFER_ERR_CONNECTION) {
            xfer_shm_ep_fail_later(ep, status, "%s", why);
        }
    }
    return status;
}

/* A peer's rendezvous put or get of len bytes, moved a slice (XFER_FAIR_SLICE) per round of
 * progress: its frame stays at the head of our ring until the last slice, so that another
 * endpoint waits a slice, not the whole transfer. XFER_OK when every byte moved,
 * XFER_INPROGRESS when the rest waits for the next round, or the error. */
static xfer_status_t rndv_move_sliced(xfer_ep_h ep, uint8_t *local, uint64_t remote,
                                      uint64_t len, int to_peer)
{
    uint64_t slice = XFER_IFACE_FAIR_SLICE(&ep->iface->params);
    uint64_t done  = xfer_shm_move_resuming(ep) ? ep->move_done : 0;
    uint64_t n     = (len - done < slice) ? len - done : slice;
    xfer_status_t status;

    ep->move_active = 0;
    status = rndv_move(ep, local + done, remote + done, n, to_peer);
    if ((status != XFER_OK) || (done + n == len)) {
        return status;
    }
    ep->move_active = 1;
    ep->move_pos    = ep->in.pos;
    ep->move_done   = done + n;
    ep->rx_more     = 1;
    return XFER_INPROGRESS;
}

int xfer_shm_move_resuming(const xfer_ep_h ep)
{
    return ep->move_active && (ep->move_pos == ep->in.pos);
}

xfer_status_t xfer_shm_rx_put(xfer_ep_h ep, const xfer_shm_frame_t *hdr, const uint8_t *payload,
                              char *why, size_t why_size)
{
    int rndv     = (hdr->flags & XFER_SHM_FL_RNDV) != 0;
    int resuming = xfer_shm_move_resuming(ep);
    xfer_status_t status;
    uint8_t *dest;

    if ((hdr->c > ep->iface->cfg->max_msg_size) ||
        (rndv ? (!ep->cma || (hdr->len != 0)) : (hdr->len > hdr->c))) {
        snprintf(why, why_size, "a %sput of %llu bytes with %u in its first frame%s",
                 rndv ? "rendezvous " : "", (unsigned long long)hdr->c, hdr->len,
                 (hdr->c > ep->iface->cfg->max_msg_size) ? ", over XFER_SHM_MAX_MSG_SIZE" : "");
        return XFER_ERR_PROTOCOL;
    }
    dest = xfer_shm_region_check(ep, hdr, resuming, &status);
    if (rndv) {
        if ((dest != NULL) && (hdr->c > 0)) {
            status = rndv_move_sliced(ep, dest, hdr->d, hdr->c, 0);
            if (status == XFER_INPROGRESS) {
                return XFER_ERR_BUSY;   /* the frame stays: the rest in the next round */
            }
        }
        ep->move_active = 0;
        return answer(ep, XFER_SHM_F_PUT_ACK, status, hdr->id, why, why_size);
    }
    /* copied data follows in the ring: answered once it is all in (or dropped) */
    ep->rx.id     = hdr->id;
    xfer_shm_rx_expect(ep, XFER_SHM_RX_PUT, dest, hdr->c, hdr->c);
    ep->rx.status = status;
    xfer_shm_rx_feed(ep, payload, hdr->len);
    return XFER_OK;
}

xfer_status_t xfer_shm_rx_put_done(xfer_ep_h ep, char *why, size_t why_size)
{
    return answer(ep, XFER_SHM_F_PUT_ACK, ep->rx.status, ep->rx.id, why, why_size);
}

xfer_status_t xfer_shm_rx_get(xfer_ep_h ep, const xfer_shm_frame_t *hdr, const uint8_t *payload,
                              char *why, size_t why_size)
{
    int rndv = (hdr->flags & XFER_SHM_FL_RNDV) != 0;
    xfer_shm_frame_t resp;
    xfer_status_t status;
    uint8_t *src;

    (void)payload;
    if ((hdr->len != 0) || (hdr->c > ep->iface->cfg->max_msg_size) || (rndv && !ep->cma)) {
        snprintf(why, why_size, "a %sget of %llu bytes with %u bytes of payload%s",
                 rndv ? "rendezvous " : "", (unsigned long long)hdr->c, hdr->len,
                 (rndv && !ep->cma) ? " on an endpoint without CMA" : "");
        return XFER_ERR_PROTOCOL;
    }
    src = xfer_shm_region_check(ep, hdr, xfer_shm_move_resuming(ep), &status);
    memset(&resp, 0, sizeof(resp));
    resp.type = XFER_SHM_F_GET_RESP;
    resp.id   = hdr->id;
    if ((src != NULL) && rndv) {
        if (hdr->c > 0) {
            status = rndv_move_sliced(ep, src, hdr->d, hdr->c, 1);
            if (status == XFER_INPROGRESS) {
                return XFER_ERR_BUSY;   /* the frame stays: the rest in the next round */
            }
        }
        resp.flags = XFER_SHM_FL_RNDV;
    }
    ep->move_active = 0;
    resp.status = (int32_t)status;
    /* copied data follows in the ring from the region itself; otherwise the frame is all */
    resp.a = ((src != NULL) && !rndv && (status == XFER_OK)) ? hdr->c : 0;
    if (xfer_shm_tx_queue(ep, NULL, &resp, (resp.a > 0) ? src : NULL, resp.a, 0, 1) !=
        XFER_OK) {
        snprintf(why, why_size, "out of memory for an answer");
        return XFER_ERR_NO_MEMORY;
    }
    xfer_shm_tx_write(ep);
    return XFER_OK;
}
