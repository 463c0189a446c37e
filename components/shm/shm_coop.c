/*
 * Large copies between memory both sides map, done by both: puts into a peer's
 * xfer_mem_alloc memory, and messages from such memory into a receive buffer of such memory.
 *
 * Either is a memcpy by one side (the put's initiator, shm_rma.c; the message's receiver,
 * shm_tag.c): one core's copy, which on most machines reaches about half of what two cores
 * get from memory, while the other side is often in progress() waiting for it. From
 * XFER_SHM_COOP_MIN bytes on, the side that copies cuts the copy into parts and announces it
 * with a SHARE frame; then both take parts through a claim word in the peer's segment
 * (shm_ring.h): the announcer from the front, at once, the peer from the back while it
 * handles the frame, until they meet. Both count finished parts in a done word; the last
 * part is not taken but copied by the side whose count completes the others, so that the
 * transfer's last bytes land after all the rest (a reader may poll them for its arrival).
 * The announcer's operation completes once every part is counted, from progress() when the
 * peer's parts were still being copied at the end of the post. A peer that does
 * not progress takes nothing and the announcer copies it all, as without; after one SHARE
 * frame that the peer has not read yet, nothing more is announced to it.
 *
 * The target of a put moves data into its own memory only after checking the region as for
 * any put (a deregistered region is never written), and reads the initiator's memfd, mapped
 * read only (shm_map.c's cache), or by CMA. The sender of a message copies from the buffer of
 * a send still in flight (its completion notice comes after the SHARE frame in the ring) into
 * the receive buffer's memfd, mapped for writing, within the range the receiver named.
 * Whatever the claim word says, each side copies only parts below the count both derive from
 * the length, and the peer at most that many; a done word of another generation, or one
 * counting more parts than the peer took, fails the endpoint. A peer that lies about its
 * parts only spoils memory of its own or memory it sends into; a peer that never finishes a
 * part it took leaves the operation waiting, as a target that never answers a put does on
 * any transport - until the endpoint fails or is closed.
 *
 * A slot stays the announcer's until the peer's parts are counted, so the peer never counts
 * into a slot that a later copy opened; a SHARE frame read after its copy is done finds a
 * claim word of another generation, or nothing left, and takes nothing.
 */
#include "shm.h"

#include <stdio.h>
#include <string.h>

#define COOP_PART_MIN (256u * 1024u)

/* The parts of a copy of len bytes (len > 0): both sides derive them, the peer's word is
 * never needed for it. */
static uint64_t coop_part(uint64_t len)
{
    uint64_t part = (len + XFER_SHM_COOP_PARTS_MAX - 1) / XFER_SHM_COOP_PARTS_MAX;

    part = (part + 4095) & ~(uint64_t)4095;
    return (part < COOP_PART_MIN) ? COOP_PART_MIN : part;
}

static uint32_t coop_nparts(uint64_t len)
{
    uint64_t part = coop_part(len);

    return (uint32_t)((len + part - 1) / part);
}

/* ---- the side that announces --------------------------------------------------------------- */

static const char *coop_what(const xfer_shm_frame_t *hdr)
{
    return (hdr->flags & XFER_SHM_FL_RECV) ? "receive" : "put";
}

static const char *coop_op_what(const xfer_shm_op_t *op)
{
    return (op->kind == XFER_SHM_OP_PUT) ? "put" : "receive";
}

static xfer_status_t coop_failed(xfer_ep_h ep, const char *what, size_t length)
{
    xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "a %s of %zu bytes with pid %d: the peer could "
             "not copy its part (its log says why)", what, length, (int)ep->peer_pid);
    return XFER_ERR_IO;
}

static int coop_slot_free(xfer_ep_h ep)
{
    for (unsigned i = 0; i < XFER_SHM_COOP_SLOTS; i++) {
        if (ep->coop[i].op == NULL) {
            return (int)i;
        }
    }
    return -1;
}

/* Is buf..+length inside memh, memory in a memfd that a peer may map? */
static int coop_memfd(xfer_ep_h ep, xfer_memh_h memh, const uint8_t *buf, size_t length)
{
    return (memh != NULL) && (memh->fd >= 0) && ep->iface->cfg->map &&
           xfer_range_within((uintptr_t)memh->region.addr, memh->region.length,
                             (uintptr_t)buf, length);
}

static void coop_memfd_describe(xfer_memh_h memh, const uint8_t *buf, xfer_shm_rndv_mem_t *mem)
{
    memset(mem, 0, sizeof(*mem));
    mem->fd         = (uint32_t)memh->fd;
    mem->ino        = memh->ino;
    mem->offset     = memh->fd_offset;
    mem->length     = memh->region.length;
    mem->msg_offset = (uint64_t)(buf - memh->region.addr);
}

/* One shared copy as one side does it: length bytes into dst, from src mapped here or (src
 * NULL) by CMA from the peer's address cma_src, in nparts parts of part bytes. The parts but
 * the last are taken through the slot's claim word; the last is copied by the side whose
 * count of finished parts reaches nparts - 1, so after every other part: its bytes land
 * last, and a reader that polls the transfer's last byte for its arrival (xfer_perf put_lat,
 * as ib_write_lat and ucx_perftest do) finds the rest there. */
typedef struct coop_copy {
    xfer_ep_h     ep;
    uint8_t       *base;    /* the segment that holds the slot */
    unsigned      slot;
    uint32_t      gen;
    uint8_t       *dst;
    const uint8_t *src;
    uint64_t      cma_src;
    uint64_t      length, part;
    uint32_t      nparts;
} coop_copy_t;

static xfer_status_t coop_copy_one(const coop_copy_t *c, uint32_t i)
{
    uint64_t off = (uint64_t)i * c->part;
    uint64_t n   = ((c->length - off) < c->part) ? (c->length - off) : c->part;
    char why[XFER_REASON_MAX];
    xfer_status_t status;

    if (c->src != NULL) {
        xfer_shm_copy_part(c->ep->iface, c->dst + off, c->src + off, (size_t)n,
                           (size_t)c->length);
        return XFER_OK;
    }
    status = xfer_shm_cma(c->ep, c->dst + off, c->cma_src + off, n, 0, why, sizeof(why));
    if (status != XFER_OK) {
        xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "a peer's shared put: %s", why);
        if (status == XFER_ERR_CONNECTION) {
            xfer_shm_ep_fail_later(c->ep, status, "%s", why);
        }
    }
    return status;
}

/* Take parts from the front or the back until none is left (or one fails), copying and
 * counting each, and the last part when this side's count completes the others. How many
 * parts this side took. */
static uint32_t coop_take_parts(const coop_copy_t *c, int back)
{
    uint32_t nclaim = c->nparts - 1, took = 0;
    xfer_status_t status = XFER_OK;

    while ((took < nclaim) && (status == XFER_OK)) {
        int i = xfer_shm_coop_take(c->base, c->slot, c->gen, nclaim, back);

        if (i < 0) {
            break;
        }
        took++;
        status = coop_copy_one(c, (uint32_t)i);
        if (xfer_shm_coop_done_add(c->base, c->slot, status != XFER_OK) == nclaim) {
            status = coop_copy_one(c, nclaim);
            xfer_shm_coop_done_add(c->base, c->slot, status != XFER_OK);
        }
    }
    return took;
}

/* Share a copy of length bytes from src to dst (both mapped here) with the peer: announce it
 * by hdr (its id is filled in here; payload, plen bytes, goes with it; the caller checked
 * that length reaches XFER_SHM_COOP_MIN) and take parts from the front until they meet the
 * peer's. XFER_ERR_UNSUPPORTED: nothing was announced or copied; XFER_OK: all is copied
 * (XFER_ERR_IO: a part of the peer's failed); XFER_INPROGRESS: the peer still copies - op
 * waits in the slot for every part to be counted, to complete with status, comp_length and
 * tag;
 * XFER_ERR_PROTOCOL: the peer spoiled the slot (the ep fails). */
static xfer_status_t coop_run(xfer_ep_h ep, xfer_shm_frame_t *hdr, const void *payload,
                              size_t plen, uint8_t *dst, const uint8_t *src, size_t length,
                              xfer_shm_op_t *op, xfer_status_t status, uint64_t comp_length,
                              uint64_t tag)
{
    coop_copy_t c = {.ep = ep, .base = ep->out.base, .dst = dst, .src = src,
                     .length = length, .part = coop_part(length), .nparts = coop_nparts(length)};
    int slot, theirs, failed;
    int64_t done;

    /* one part is not worth sharing: the last part is never taken through the slot */
    if ((c.nparts < 2) || (ep->fail.state != XFER_EP_CONNECTED) ||
        !ucs_list_is_empty(&ep->txq)) {
        return XFER_ERR_UNSUPPORTED;
    }
    /* a peer that has not read the last SHARE frame is not progressing: no more frames for
     * it to skip later, nor to fill its ring (and hold up flushes) meanwhile */
    if ((ep->coop_frame_end != 0) &&
        !xfer_shm_ring_consumed(&ep->out, ep->coop_frame_end)) {
        return XFER_ERR_UNSUPPORTED;
    }
    slot = coop_slot_free(ep);
    if (slot < 0) {
        return XFER_ERR_UNSUPPORTED;
    }
    c.slot = (unsigned)slot;
    c.gen  = ++ep->coop_gen;
    if (c.gen == 0) {
        c.gen = ++ep->coop_gen;     /* 0 is what a slot never opened holds */
    }
    hdr->id = (uint64_t)slot | ((uint64_t)c.gen << 32);
    xfer_shm_coop_open(c.base, c.slot, c.gen, c.nparts - 1);
    /* the ring is idle: the frame goes out now, and the peer may start while we copy */
    if (xfer_shm_tx_queue(ep, NULL, hdr, payload, plen, 1, 0) != XFER_OK) {
        return XFER_ERR_UNSUPPORTED;
    }
    xfer_shm_tx_write(ep);
    ep->coop_frame_end = ucs_list_is_empty(&ep->txq) ? ep->out.pos : 0;
    coop_take_parts(&c, 0);
    theirs = xfer_shm_coop_theirs(c.base, c.slot, c.gen, c.nparts - 1);
    done   = xfer_shm_coop_done(c.base, c.slot, c.gen, &failed);
    if ((theirs < 0) || (done < 0) || (done > c.nparts)) {
        xfer_shm_ep_fail_later(ep, XFER_ERR_PROTOCOL, "the peer rewrote the words of a shared "
                               "%s (slot %d, generation %u): parts taken %d, counted %lld of "
                               "%u", coop_what(hdr), slot, c.gen, theirs, (long long)done,
                               c.nparts);
        return XFER_ERR_PROTOCOL;
    }
    xfer_log(XFER_LOG_DEBUG, XFER_SHM_SUBSYS, "%s of %zu bytes with pid %d: the peer copied %d "
             "of its %u parts", coop_what(hdr), length, (int)ep->peer_pid, theirs, c.nparts);
    if (done == c.nparts) {
        return failed ? coop_failed(ep, coop_what(hdr), length) : XFER_OK;
    }
    ep->coop[slot].op     = op;
    ep->coop[slot].gen    = c.gen;
    ep->coop[slot].nparts = c.nparts;
    ep->coop[slot].status = status;
    ep->coop[slot].length = comp_length;
    ep->coop[slot].tag    = tag;
    /* receives are not what flushes wait for */
    ep->coop[slot].seq    = (op->kind == XFER_SHM_OP_PUT) ? ++ep->coop_posted : UINT64_MAX;
    ep->coop_busy++;
    xfer_shm_ep_watch(ep);  /* progress checks the target's parts */
    return XFER_INPROGRESS;
}

xfer_status_t xfer_shm_coop_put(xfer_ep_h ep, const void *buf, size_t length,
                                xfer_memh_h memh, uint8_t *remote, uint64_t remote_addr,
                                xfer_rkey_h rkey, xfer_comp_t *comp)
{
    xfer_shm_rndv_mem_t mem;
    xfer_shm_frame_t hdr;
    xfer_shm_op_t *op;
    xfer_status_t status;
    int mapped;

    /* every put into mapped memory comes here: the size first */
    if (length < ep->iface->cfg->coop_min) {
        return XFER_ERR_UNSUPPORTED;
    }
    mapped = coop_memfd(ep, memh, buf, length);
    if (!mapped && !ep->cma) {
        return XFER_ERR_UNSUPPORTED;
    }
    memset(&hdr, 0, sizeof(hdr));
    hdr.type  = XFER_SHM_F_SHARE;
    hdr.flags = mapped ? XFER_SHM_FL_MAPPED : 0;
    hdr.a     = rkey->k.id;
    hdr.b     = remote_addr;
    hdr.c     = length;
    hdr.d     = (uint64_t)(uintptr_t)buf;
    hdr.e     = rkey->k.key;
    if (mapped) {
        coop_memfd_describe(memh, buf, &mem);
    }
    op = xfer_shm_op_new(ep->iface, ep, XFER_SHM_OP_PUT, comp, 0);
    if (op == NULL) {
        return XFER_ERR_UNSUPPORTED;
    }
    status = coop_run(ep, &hdr, &mem, mapped ? sizeof(mem) : 0, remote, buf, length, op,
                      XFER_OK, length, 0);
    if (status != XFER_INPROGRESS) {
        xfer_shm_op_free(op);
    }
    return status;
}

xfer_status_t xfer_shm_coop_recv(xfer_ep_h ep, xfer_shm_op_t *op, uint64_t n,
                                 const uint8_t *src, uint64_t send_id, xfer_status_t status,
                                 uint64_t length, uint64_t tag)
{
    xfer_shm_rndv_mem_t mem;
    xfer_shm_frame_t hdr;

    if ((n < ep->iface->cfg->coop_min) || !coop_memfd(ep, op->memh, op->buf, n)) {
        return XFER_ERR_UNSUPPORTED;
    }
    memset(&hdr, 0, sizeof(hdr));
    hdr.type  = XFER_SHM_F_SHARE;
    hdr.flags = XFER_SHM_FL_MAPPED | XFER_SHM_FL_RECV;
    hdr.a     = send_id;
    hdr.c     = n;
    coop_memfd_describe(op->memh, op->buf, &mem);
    return coop_run(ep, &hdr, &mem, sizeof(mem), op->buf, src, n, op, status, length, tag);
}

static void coop_complete(xfer_ep_h ep, unsigned slot, xfer_status_t status)
{
    xfer_shm_op_t *op = ep->coop[slot].op;

    ep->coop[slot].op = NULL;
    ep->coop_busy--;
    if (status == XFER_OK) {
        xfer_shm_op_complete(op, ep->coop[slot].status, ep->coop[slot].length,
                             ep->coop[slot].tag);
    } else {
        xfer_shm_op_complete(op, status, 0, 0);
    }
}

unsigned xfer_shm_coop_check(xfer_ep_h ep)
{
    unsigned count = 0;

    for (unsigned i = 0; (i < XFER_SHM_COOP_SLOTS) && (ep->coop_busy > 0); i++) {
        xfer_shm_coop_t *c = &ep->coop[i];
        int failed;
        int64_t done;

        if (c->op == NULL) {
            continue;
        }
        done = xfer_shm_coop_done(ep->out.base, i, c->gen, &failed);
        if ((done < 0) || (done > c->nparts)) {
            xfer_shm_ep_fail(ep, XFER_ERR_PROTOCOL, "the peer counts %lld parts done of a "
                             "shared %s of %u parts (slot %u, generation %u)",
                             (long long)done, coop_op_what(c->op), c->nparts, i, c->gen);
            return count;
        }
        if (done < c->nparts) {
            continue;
        }
        coop_complete(ep, i, failed ? coop_failed(ep, coop_op_what(c->op), c->length) :
                                      XFER_OK);
        count++;
    }
    if ((count > 0) && (ep->fail.state == XFER_EP_CONNECTED)) {
        xfer_shm_ep_flushes_check(ep);
    }
    return count;
}

int xfer_shm_coop_ready(xfer_ep_h ep)
{
    for (unsigned i = 0; i < XFER_SHM_COOP_SLOTS; i++) {
        int failed;
        int64_t done;

        if (ep->coop[i].op == NULL) {
            continue;
        }
        /* all in, or a count that xfer_shm_coop_check() fails the endpoint for */
        done = xfer_shm_coop_done(ep->out.base, i, ep->coop[i].gen, &failed);
        if ((done < 0) || (done >= ep->coop[i].nparts)) {
            return 1;
        }
    }
    return 0;
}

int xfer_shm_coop_waits(xfer_ep_h ep, uint64_t mark)
{
    for (unsigned i = 0; (i < XFER_SHM_COOP_SLOTS) && (ep->coop_busy > 0); i++) {
        if ((ep->coop[i].op != NULL) && (ep->coop[i].seq <= mark)) {
            return 1;
        }
    }
    return 0;
}

void xfer_shm_coop_ep_gone(xfer_ep_h ep, xfer_status_t status)
{
    for (unsigned i = 0; (i < XFER_SHM_COOP_SLOTS) && (ep->coop_busy > 0); i++) {
        if (ep->coop[i].op != NULL) {
            coop_complete(ep, i, status);
        }
    }
}

/* ---- the peer ------------------------------------------------------------------------------ */

/* The sender's side of a shared receive: in *send_p the send it names, or NULL when that is
 * no longer in flight (cancelled); XFER_ERR_PROTOCOL with why when the receive claims more
 * than the message. */
static xfer_status_t share_send(xfer_ep_h ep, const xfer_shm_frame_t *hdr,
                                xfer_shm_op_t **send_p, char *why, size_t why_size)
{
    xfer_slot_t *s    = xfer_slot_find(&ep->slots, hdr->a);
    xfer_shm_op_t *op = ((s != NULL) && (s->kind == XFER_SHM_SLOT_SEND)) ? s->obj : NULL;

    *send_p = NULL;
    if ((op != NULL) && (hdr->c > op->len)) {
        snprintf(why, why_size, "a shared receive of %llu bytes of a %zu-byte message",
                 (unsigned long long)hdr->c, op->len);
        return XFER_ERR_PROTOCOL;
    }
    *send_p = op;
    return XFER_OK;
}

/* The peer's side of a shared copy: take parts from the back, each from src (NULL: by CMA
 * from the peer's address in hdr->d) into dest, and wake the peer if it sleeps. */
static void share_take(xfer_ep_h ep, const xfer_shm_frame_t *hdr, uint8_t *dest,
                       const uint8_t *src)
{
    coop_copy_t c = {.ep = ep, .base = ep->in.base, .slot = (unsigned)(hdr->id & 0xffffffffu),
                     .gen = (uint32_t)(hdr->id >> 32), .dst = dest, .src = src,
                     .cma_src = hdr->d, .length = hdr->c, .part = coop_part(hdr->c),
                     .nparts = coop_nparts(hdr->c)};

    if ((c.nparts < 2) || (coop_take_parts(&c, 1) == 0)) {
        return;
    }
    ep->rx_copied += hdr->c;    /* a large copy ends this round of input */
    /* the peer may sleep waiting for these parts: its armed flag is in the ring we write
     * into */
    if (xfer_shm_ring_wake_needed(&ep->out)) {
        xfer_shm_doorbell_ring(ep);
    }
}

xfer_status_t xfer_shm_rx_share(xfer_ep_h ep, const xfer_shm_frame_t *hdr,
                                const uint8_t *payload, char *why, size_t why_size)
{
    int mapped     = (hdr->flags & XFER_SHM_FL_MAPPED) != 0;
    int recv       = (hdr->flags & XFER_SHM_FL_RECV) != 0;
    unsigned slot  = (unsigned)(hdr->id & 0xffffffffu);
    const char *what = recv ? "receive" : "put";
    xfer_shm_rndv_mem_t mem;
    xfer_shm_op_t *send;
    xfer_status_t status;
    uint8_t *dest, *peer = NULL;

    if ((hdr->len != (mapped ? sizeof(mem) : 0)) || (slot >= XFER_SHM_COOP_SLOTS) ||
        (hdr->c == 0) || (hdr->c > ep->iface->cfg->max_msg_size) || (recv && !mapped)) {
        snprintf(why, why_size, "a shared %s of %llu bytes in slot %u (of %u) with %u bytes "
                 "of payload (%zu expected)", what, (unsigned long long)hdr->c, slot,
                 XFER_SHM_COOP_SLOTS, hdr->len, (mapped || recv) ? sizeof(mem) : (size_t)0);
        return XFER_ERR_PROTOCOL;
    }
    if (mapped) {
        memcpy(&mem, payload, sizeof(mem));
        if ((mem.msg_offset > mem.length) || (hdr->c > mem.length - mem.msg_offset)) {
            snprintf(why, why_size, "a shared %s of %llu bytes at %llu of a %llu-byte range "
                     "of the peer's memfd", what, (unsigned long long)hdr->c,
                     (unsigned long long)mem.msg_offset, (unsigned long long)mem.length);
            return XFER_ERR_PROTOCOL;
        }
    }
    if (recv) {
        /* we sent the message: copy parts of it from our buffer into the receiver's */
        status = share_send(ep, hdr, &send, why, why_size);
        if (status != XFER_OK) {
            return status;
        }
        peer = (send != NULL) ? xfer_shm_peer_mem(ep, &mem, 1) : NULL;
        if (peer != NULL) {
            share_take(ep, hdr, peer, send->buf);
        }
        return XFER_OK;     /* else the receiver copies it all */
    }
    if (mapped) {
        peer = xfer_shm_peer_mem(ep, &mem, 0);
    }
    dest = xfer_shm_region_check(ep, hdr, 0, &status);
    if ((dest != NULL) && ((peer != NULL) || ep->cma)) {
        share_take(ep, hdr, dest, peer);
    }
    return XFER_OK;         /* else the initiator copies it all */
}
