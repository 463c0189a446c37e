/*
 * Registered memory, remote keys, and put/get as RDMA WRITE/READ into the peer's memory.
 *
 * A user registration is its own memory region with exactly the user's bounds (its rkey goes
 * to peers, so it must not reach further, as a merged cache entry could). Deregistering it
 * also drops the cache entries over the same memory: the user may free it next.
 *
 * The rkey travels in the form verbs_wire.h declares.
 * Transfers longer than the port's largest message are split into chunks.
 */
#include "verbs.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


xfer_status_t xfer_verbs_mem_reg(xfer_iface_h iface, void *addr, size_t length,
                                 xfer_mem_type_t mem_type, xfer_memh_h *memh_p)
{
    xfer_memh_h memh;

    if (mem_type != XFER_MEM_HOST) {
        return XFER_ERR_UNSUPPORTED;
    }
    memh = calloc(1, sizeof(*memh));
    if (memh == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    memh->mr = ibv_reg_mr(iface->pd, addr, length, IBV_ACCESS_LOCAL_WRITE |
                          IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    if (memh->mr == NULL) {
        int err = errno;

        xfer_log(XFER_LOG_ERROR, XFER_VERBS_SUBSYS, "cannot register %zu bytes at %p on %s: "
                 "%s%s", length, addr, iface->dev_name, strerror(err),
                 (err == ENOMEM) ? " (is the locked-memory limit, ulimit -l, too low?)" : "");
        free(memh);
        return (err == EFAULT) ? XFER_ERR_INVALID_PARAM : XFER_ERR_NO_RESOURCE;
    }
    *memh_p = memh;
    return XFER_OK;
}

void xfer_verbs_mem_dereg(xfer_iface_h iface, xfer_memh_h memh)
{
    xfer_regcache_invalidate(iface->mrc, memh->mr->addr, memh->mr->length);
    if (ibv_dereg_mr(memh->mr) != 0) {
        xfer_log(XFER_LOG_WARN, XFER_VERBS_SUBSYS, "ibv_dereg_mr: %s", strerror(errno));
    }
    free(memh);
}

xfer_status_t xfer_verbs_rkey_pack(xfer_iface_h iface, xfer_memh_h memh, void *buf,
                                   size_t *len_p)
{
    xfer_verbs_wire_rkey_t w = {.rkey = memh->mr->rkey, .addr = (uintptr_t)memh->mr->addr,
                                .length = memh->mr->length};

    (void)iface;
    if (!xfer_out_room(buf, len_p, XFER_VERBS_WIRE_RKEY_LEN)) {
        return XFER_ERR_NO_RESOURCE;
    }
    xfer_verbs_wire_pack_rkey(&w, buf);
    return XFER_OK;
}

xfer_status_t xfer_verbs_rkey_unpack(xfer_iface_h iface, const void *buf, size_t len,
                                     xfer_rkey_h *rkey_p)
{
    xfer_verbs_wire_rkey_t w;
    xfer_rkey_h rkey;

    (void)iface;
    if (xfer_verbs_wire_unpack_rkey(buf, len, &w) != XFER_OK) {
        xfer_log(XFER_LOG_ERROR, XFER_VERBS_SUBSYS, "not a verbs remote key (%zu bytes)", len);
        return XFER_ERR_INVALID_PARAM;
    }
    rkey = calloc(1, sizeof(*rkey));
    if (rkey == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    rkey->rkey   = w.rkey;
    rkey->addr   = w.addr;
    rkey->length = w.length;
    *rkey_p = rkey;
    return XFER_OK;
}

void xfer_verbs_rkey_release(xfer_iface_h iface, xfer_rkey_h rkey)
{
    (void)iface;
    free(rkey);
}

static xfer_status_t rma(xfer_ep_h ch, xfer_verbs_op_kind_t kind, int opcode, void *buf,
                         size_t length, xfer_memh_h memh, uint64_t remote_addr,
                         xfer_rkey_h rkey, xfer_comp_t *comp)
{
    xfer_status_t status = xfer_verbs_ch_check(ch);
    xfer_verbs_op_t *op;

    if ((status != XFER_OK) && (status != XFER_ERR_BUSY)) {
        return status;
    }
    if (length > ch->iface->cfg->max_msg_size) {
        return xfer_op_too_long(XFER_VERBS_SUBSYS, (kind == XFER_VERBS_OP_PUT) ? "put" : "get",
                                length, ch->iface->cfg->max_msg_size, "XFER_VERBS_MAX_MSG_SIZE");
    }
    if (!xfer_range_within(rkey->addr, rkey->length, remote_addr, length)) {
        return XFER_ERR_OUT_OF_RANGE;
    }
    op = xfer_verbs_op_new(ch->iface, ch, kind, comp);
    if (op == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    op->buf      = buf;
    op->len      = length;
    op->opcode   = opcode;
    op->raddr    = remote_addr;
    op->rkey     = rkey->rkey;
    op->rdma_len = length;
    op->memh     = memh;
    status       = xfer_verbs_op_lkey(op, memh);
    if (status != XFER_OK) {
        xfer_verbs_op_free(op);
        return status;
    }
    if (length == 0) {
        xfer_verbs_op_complete(op, XFER_OK, 0, 0);
        return XFER_INPROGRESS;
    }
    op->post = XFER_VERBS_POST_RDMA;
    op->busy = 1;
    xfer_verbs_ch_submit(ch, op);
    return XFER_INPROGRESS;
}

xfer_status_t xfer_verbs_put(xfer_ep_h ep, const void *buf, size_t length, xfer_memh_h memh,
                             uint64_t remote_addr, xfer_rkey_h rkey, xfer_comp_t *comp)
{
    return rma(ep, XFER_VERBS_OP_PUT, IBV_WR_RDMA_WRITE, (void*)buf, length, memh,
               remote_addr, rkey, comp);
}

xfer_status_t xfer_verbs_get(xfer_ep_h ep, void *buf, size_t length, xfer_memh_h memh,
                             uint64_t remote_addr, xfer_rkey_h rkey, xfer_comp_t *comp)
{
    return rma(ep, XFER_VERBS_OP_GET, IBV_WR_RDMA_READ, buf, length, memh, remote_addr, rkey,
               comp);
}

void xfer_verbs_rdma_done(xfer_verbs_op_t *op, xfer_status_t status)
{
    if ((status == XFER_OK) && (op->opcode == IBV_WR_RDMA_READ)) {
        XFER_VERBS_DEVICE_WROTE(op->buf, op->rdma_len);
    }
    switch (op->kind) {
    case XFER_VERBS_OP_RECV:
        xfer_verbs_recv_read_done(op, status);
        break;
    case XFER_VERBS_OP_TWRITE:
        xfer_verbs_rsp_write_done(op, status);
        break;
    default:
        if ((status == XFER_OK) && (op->opcode == IBV_WR_RDMA_READ) &&
            xfer_verbs_memh_on_gpu(op->memh)) {
            status = op->iface->devmem->landed(op->iface, op->memh, op->buf, op->rdma_len);
        }
        xfer_verbs_op_complete(op, status, (status == XFER_OK) ? op->rdma_len : 0, 0);
        break;
    }
}
