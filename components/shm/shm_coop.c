/*
 * Large puts into memory the initiator maps, copied by both sides.
 *
 * A put into a peer's xfer_mem_alloc memory is a memcpy by the initiator (shm_rma.c): one
 * core's copy, which on most machines reaches about half of what two cores get from memory.
 * The target of a large put is often in progress() at that moment, waiting for it. From
 * XFER_SHM_COOP_MIN bytes on, the initiator cuts the put into parts and announces it with a
 * SHARE frame; then both take parts through a claim word in the target's segment
 * (shm_ring.h): the initiator from the front inside the post, the target from the back while
 * it handles the frame, until they meet. The target counts its finished parts in a done word;
 * the initiator completes the put, from progress(), once they are all in. A target that does
 * not progress takes nothing, and the initiator copies the whole put at post, as without.
 *
 * The target moves data into its own memory only after checking the region as for any put
 * (a deregistered region is never written), and reads the source from the initiator's memfd,
 * mapped read only (shm_map.c's cache), or by CMA. Whatever the claim word says, each side
 * copies only parts below the count both derive from the length, and the target at most that
 * many; a done word of another generation, or one counting more parts than the target took,
 * fails the endpoint. A target that lies about its parts only spoils its own memory; a
 * target that never finishes a part it took leaves the put waiting, as a target that never
 * answers a put does on any transport - until the endpoint fails or is closed.
 *
 * A slot stays the initiator's until the target's parts are counted, so the target never
 * counts into a slot that a later put opened; a SHARE frame read after its put is done finds
 * a claim word of another generation, or nothing left, and takes nothing.
 */
#include "shm.h"

#include <stdio.h>
#include <string.h>

#define COOP_PART_MIN (256u * 1024u)

/* The parts of a put of len bytes (len > 0): both sides derive them, the peer's word is
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

/* ---- initiator ------------------------------------------------------------------------------ */

static void coop_log(xfer_ep_h ep, size_t length, int theirs, uint32_t nparts)
{
    xfer_log(XFER_LOG_DEBUG, XFER_SHM_SUBSYS, "put of %zu bytes to pid %d: the target copied "
             "%d of its %u parts", length, (int)ep->peer_pid, theirs, nparts);
}

static xfer_status_t coop_failed(xfer_ep_h ep, size_t length)
{
    xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "a put of %zu bytes to pid %d: the target could "
             "not read its part of the source (its log says why)", length, (int)ep->peer_pid);
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

xfer_status_t xfer_shm_coop_put(xfer_ep_h ep, const void *buf, size_t length,
                                xfer_memh_h memh, uint8_t *remote, uint64_t remote_addr,
                                xfer_rkey_h rkey, xfer_comp_t *comp)
{
    const uint8_t *src = buf;
    xfer_shm_rndv_mem_t mem;
    xfer_shm_frame_t hdr;
    xfer_shm_op_t *op;
    uint32_t gen, nparts, mine = 0;
    uint64_t part;
    int slot, theirs, mapped, failed;
    int64_t done;

    mapped = (memh != NULL) && (memh->fd >= 0) && ep->iface->cfg->map &&
             (src >= memh->addr) && ((size_t)(src - memh->addr) <= memh->length) &&
             (length <= memh->length - (size_t)(src - memh->addr));
    if ((length < ep->iface->cfg->coop_min) || (ep->state != XFER_SHM_EP_CONNECTED) ||
        !(mapped || ep->cma) || !ucs_list_is_empty(&ep->txq)) {
        return XFER_ERR_UNSUPPORTED;
    }
    slot = coop_slot_free(ep);
    if (slot < 0) {
        return XFER_ERR_UNSUPPORTED;
    }
    part   = coop_part(length);
    nparts = coop_nparts(length);
    gen    = ++ep->coop_gen;
    if (gen == 0) {
        gen = ++ep->coop_gen;   /* 0 is what a slot never opened holds */
    }
    memset(&hdr, 0, sizeof(hdr));
    hdr.type  = XFER_SHM_F_SHARE;
    hdr.flags = mapped ? XFER_SHM_FL_MAPPED : 0;
    hdr.id    = (uint64_t)slot | ((uint64_t)gen << 32);
    hdr.a     = rkey->id;
    hdr.b     = remote_addr;
    hdr.c     = length;
    hdr.d     = (uint64_t)(uintptr_t)buf;
    hdr.e     = rkey->cookie;
    if (mapped) {
        memset(&mem, 0, sizeof(mem));
        mem.fd         = (uint32_t)memh->fd;
        mem.ino        = memh->ino;
        mem.offset     = memh->fd_offset;
        mem.length     = memh->length;
        mem.msg_offset = (uint64_t)(src - memh->addr);
    }
    op = xfer_shm_op_new(ep->iface, ep, XFER_SHM_OP_PUT, comp, 0);
    if (op == NULL) {
        return XFER_ERR_UNSUPPORTED;
    }
    xfer_shm_coop_open(ep->out.base, (unsigned)slot, gen, nparts);
    /* the ring is idle: the frame goes out now, and the target may start while we copy */
    if (xfer_shm_tx_queue(ep, NULL, &hdr, &mem, mapped ? sizeof(mem) : 0, 1, 0) != XFER_OK) {
        xfer_shm_op_free(op);
        return XFER_ERR_UNSUPPORTED;
    }
    xfer_shm_tx_write(ep);
    for (;;) {
        int i = xfer_shm_coop_take(ep->out.base, (unsigned)slot, gen, nparts, 0);
        uint64_t off;

        if ((i < 0) || (mine == nparts)) {
            break;
        }
        off = (uint64_t)i * part;
        xfer_shm_copy_part(ep->iface, remote + off, src + off,
                           (size_t)(((length - off) < part) ? (length - off) : part), length);
        mine++;
    }
    theirs = xfer_shm_coop_theirs(ep->out.base, (unsigned)slot, gen, nparts);
    if (theirs < 0) {
        xfer_shm_op_free(op);
        xfer_shm_ep_fail_later(ep, XFER_ERR_PROTOCOL, "the peer rewrote the claim word of a "
                               "shared put (slot %d): it is not a finished one of generation "
                               "%u", slot, gen);
        return XFER_ERR_PROTOCOL;
    }
    coop_log(ep, length, theirs, nparts);
    done = xfer_shm_coop_done(ep->out.base, (unsigned)slot, gen, &failed);
    if ((theirs == 0) || (done == theirs)) {
        xfer_shm_op_free(op);
        return ((theirs > 0) && failed) ? coop_failed(ep, length) : XFER_OK;
    }
    op->len               = length;
    ep->coop[slot].op     = op;
    ep->coop[slot].gen    = gen;
    ep->coop[slot].theirs = (uint32_t)theirs;
    ep->coop[slot].seq    = ++ep->coop_posted;
    ep->coop_busy++;
    return XFER_INPROGRESS;
}

static void coop_complete(xfer_ep_h ep, unsigned slot, xfer_status_t status)
{
    xfer_shm_op_t *op = ep->coop[slot].op;

    ep->coop[slot].op = NULL;
    ep->coop_busy--;
    xfer_shm_op_complete(op, status, (status == XFER_OK) ? op->len : 0, 0);
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
        if ((done < 0) || (done > c->theirs)) {
            xfer_shm_ep_fail(ep, XFER_ERR_PROTOCOL, "the peer counts %lld parts done of a "
                             "shared put in which it took %u (slot %u, generation %u)",
                             (long long)done, c->theirs, i, c->gen);
            return count;
        }
        if (done < c->theirs) {
            continue;
        }
        coop_complete(ep, i, failed ? coop_failed(ep, c->op->len) : XFER_OK);
        count++;
    }
    if ((count > 0) && (ep->state == XFER_SHM_EP_CONNECTED)) {
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
        if ((done < 0) || (done >= ep->coop[i].theirs)) {
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

/* ---- target --------------------------------------------------------------------------------- */

xfer_status_t xfer_shm_rx_share(xfer_ep_h ep, const xfer_shm_frame_t *hdr,
                                const uint8_t *payload, char *why, size_t why_size)
{
    int mapped        = (hdr->flags & XFER_SHM_FL_MAPPED) != 0;
    unsigned slot     = (unsigned)(hdr->id & 0xffffffffu);
    uint32_t gen      = (uint32_t)(hdr->id >> 32);
    const uint8_t *src = NULL;
    xfer_shm_rndv_mem_t mem;
    xfer_status_t status;
    uint32_t nparts, took = 0;
    uint8_t *dest;
    uint64_t part;

    if ((hdr->len != (mapped ? sizeof(mem) : 0)) || (slot >= XFER_SHM_COOP_SLOTS) ||
        (hdr->c == 0) || (hdr->c > ep->iface->cfg->max_msg_size)) {
        snprintf(why, why_size, "a shared put of %llu bytes in slot %u (of %u) with %u bytes "
                 "of payload (%zu expected)", (unsigned long long)hdr->c, slot,
                 XFER_SHM_COOP_SLOTS, hdr->len, mapped ? sizeof(mem) : (size_t)0);
        return XFER_ERR_PROTOCOL;
    }
    if (mapped) {
        memcpy(&mem, payload, sizeof(mem));
        if ((mem.msg_offset > mem.length) || (hdr->c > mem.length - mem.msg_offset)) {
            snprintf(why, why_size, "a shared put of %llu bytes at %llu of a %llu-byte range "
                     "of the initiator's memfd", (unsigned long long)hdr->c,
                     (unsigned long long)mem.msg_offset, (unsigned long long)mem.length);
            return XFER_ERR_PROTOCOL;
        }
        src = xfer_shm_peer_mem(ep, &mem);
    }
    dest = xfer_shm_region_check(ep, hdr, &status);
    if ((dest == NULL) || ((src == NULL) && !ep->cma)) {
        return XFER_OK;     /* the initiator copies it all */
    }
    part   = coop_part(hdr->c);
    nparts = coop_nparts(hdr->c);
    for (uint32_t k = 0; k < nparts; k++) {
        int i = xfer_shm_coop_take(ep->in.base, slot, gen, nparts, 1);
        uint64_t off, n;

        if (i < 0) {
            break;
        }
        off = (uint64_t)i * part;
        n   = ((hdr->c - off) < part) ? (hdr->c - off) : part;
        if (src != NULL) {
            xfer_shm_copy_part(ep->iface, dest + off, src + off, (size_t)n, (size_t)hdr->c);
            ep->rx_copied += n;
            status = XFER_OK;
        } else {
            char cwhy[XFER_REASON_MAX];

            status = xfer_shm_cma(ep, dest + off, hdr->d + off, n, 0, cwhy, sizeof(cwhy));
            if (status != XFER_OK) {
                xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "a peer's shared put: %s", cwhy);
                if (status == XFER_ERR_CONNECTION) {
                    xfer_shm_ep_fail_later(ep, status, "%s", cwhy);
                }
            }
        }
        xfer_shm_coop_done_add(ep->in.base, slot, status != XFER_OK);
        took++;
        if (status != XFER_OK) {
            break;
        }
    }
    /* the initiator may sleep waiting for these parts: its armed flag is in the ring we
     * write into */
    if ((took > 0) && xfer_shm_ring_wake_needed(&ep->out)) {
        xfer_shm_doorbell_ring(ep);
    }
    return XFER_OK;
}
