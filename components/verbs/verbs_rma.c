/*
 * Registered memory, remote keys, and put/get as RDMA WRITE/READ into the peer's memory.
 *
 * A user registration is its own memory region with exactly the user's bounds (its rkey goes
 * to peers, so it must not reach further, as a merged cache entry could). Deregistering it
 * also drops the cache entries over the same memory: the user may free it next.
 *
 * The rkey travels as 24 bytes: magic "XVRK", rkey, base address, length (little-endian).
 * Transfers longer than the port's largest message are split into chunks.
 */
#include "verbs.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RKEY_MAGIC 0x4b525658u    /* "XVRK" */
#define RKEY_LEN   24u

xfer_status_t xfer_verbs_mem_reg(xfer_iface_h iface, void *addr, size_t length,
                                 xfer_mem_type_t mem_type, xfer_memh_h *memh_p)
{
    xfer_memh_h memh;

    if (mem_type != XFER_MEM_HOST) {
        return XFER_ERR_UNSUPPORTED;
    }
    if ((addr == NULL) || (length == 0)) {
        return XFER_ERR_INVALID_PARAM;
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
    if (memh == NULL) {
        return;
    }
    xfer_verbs_mrc_invalidate(iface->mrc, memh->mr->addr, memh->mr->length);
    if (ibv_dereg_mr(memh->mr) != 0) {
        xfer_log(XFER_LOG_WARN, XFER_VERBS_SUBSYS, "ibv_dereg_mr: %s", strerror(errno));
    }
    free(memh);
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++, v >>= 8) {
        p[i] = (uint8_t)v;
    }
}

static void put_u64(uint8_t *p, uint64_t v)
{
    put_u32(p, (uint32_t)v);
    put_u32(p + 4, (uint32_t)(v >> 32));
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

static uint64_t get_u64(const uint8_t *p)
{
    return (uint64_t)get_u32(p) | ((uint64_t)get_u32(p + 4) << 32);
}

xfer_status_t xfer_verbs_rkey_pack(xfer_iface_h iface, xfer_memh_h memh, void *buf,
                                   size_t *len_p)
{
    uint8_t *p = buf;

    (void)iface;
    if (*len_p < RKEY_LEN) {
        *len_p = RKEY_LEN;
        return XFER_ERR_NO_RESOURCE;
    }
    put_u32(p, RKEY_MAGIC);
    put_u32(p + 4, memh->mr->rkey);
    put_u64(p + 8, (uintptr_t)memh->mr->addr);
    put_u64(p + 16, memh->mr->length);
    *len_p = RKEY_LEN;
    return XFER_OK;
}

xfer_status_t xfer_verbs_rkey_unpack(xfer_iface_h iface, const void *buf, size_t len,
                                     xfer_rkey_h *rkey_p)
{
    const uint8_t *p = buf;
    xfer_rkey_h rkey;

    (void)iface;
    if ((len != RKEY_LEN) || (get_u32(p) != RKEY_MAGIC)) {
        xfer_log(XFER_LOG_ERROR, XFER_VERBS_SUBSYS, "not a verbs remote key (%zu bytes)", len);
        return XFER_ERR_INVALID_PARAM;
    }
    rkey = calloc(1, sizeof(*rkey));
    if (rkey == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    rkey->rkey   = get_u32(p + 4);
    rkey->addr   = get_u64(p + 8);
    rkey->length = get_u64(p + 16);
    if (rkey->addr + rkey->length < rkey->addr) {
        free(rkey);
        return XFER_ERR_INVALID_PARAM;
    }
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
    if ((comp == NULL) || (rkey == NULL) || ((buf == NULL) && (length > 0))) {
        return XFER_ERR_INVALID_PARAM;
    }
    if (length > ch->iface->cfg->max_msg_size) {
        xfer_log(XFER_LOG_ERROR, XFER_VERBS_SUBSYS, "%s of %zu bytes exceeds "
                 "XFER_VERBS_MAX_MSG_SIZE (%llu)", (kind == XFER_VERBS_OP_PUT) ? "put" : "get",
                 length, (unsigned long long)ch->iface->cfg->max_msg_size);
        return XFER_ERR_OUT_OF_RANGE;
    }
    if ((remote_addr < rkey->addr) || (length > rkey->length) ||
        (remote_addr - rkey->addr > rkey->length - length)) {
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
    status       = xfer_verbs_op_lkey(op, memh);
    if (status != XFER_OK) {
        free(op);
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
    switch (op->kind) {
    case XFER_VERBS_OP_RECV:
        xfer_verbs_recv_read_done(op, status);
        break;
    case XFER_VERBS_OP_FETCH:
        xfer_verbs_fetch_read_done(op, status);
        break;
    default:
        xfer_verbs_op_complete(op, status, (status == XFER_OK) ? op->rdma_len : 0, 0);
        break;
    }
}
