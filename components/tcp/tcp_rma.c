/*
 * One-sided operations over tcp: registered regions, remote keys, put and get.
 *
 * A region is known to peers by {id, its own random key, address, length}. The target
 * checks all of it - the id is registered, the key is that region's, the range lies inside -
 * before touching memory, and answers anything else with an error status while draining the
 * data; a peer whose keys fit no region more than XFER_BAD_KEYS_MAX times is failed. A put
 * completes at the initiator once its frame is written (a flush then waits until its data is
 * in the target's memory; a refused put fails that flush), or with
 * XFER_TCP_PUT_ACK=y when its PUT_ACK arrives; a get when its data is in the local buffer.
 */
#include "tcp.h"


#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

xfer_status_t xfer_tcp_mem_reg(xfer_iface_h iface, void *addr, size_t length,
                               xfer_mem_type_t mem_type, xfer_memh_h *memh_p)
{
    if (mem_type != XFER_MEM_HOST) {
        return XFER_ERR_UNSUPPORTED;
    }
    return xfer_region_new(iface->base.regions, sizeof(**memh_p), addr, length, memh_p);
}

xfer_status_t xfer_tcp_mem_reg_params(xfer_iface_h iface, const xfer_mem_reg_params_t *params,
                                      xfer_memh_h *memh_p)
{
    char why[XFER_REASON_MAX] = "";
    xfer_status_t status;

    if (params->size < offsetof(xfer_mem_reg_params_t, attr) + sizeof(params->attr)) {
        return XFER_ERR_INVALID_PARAM;
    }
    if (params->attr->type != XFER_MEM_CUDA) {
        return xfer_tcp_mem_reg(iface, params->addr, params->length, params->attr->type,
                                memh_p);
    }
    status = xfer_tcp_cuda_accept(iface, params->attr, why, sizeof(why));
    if (status != XFER_OK) {
        xfer_log(XFER_LOG_ERROR, XFER_TCP_SUBSYS, "cannot register %zu bytes of CUDA memory: "
                 "%s", params->length, why);
        return status;
    }
    status = xfer_tcp_mem_reg(iface, params->addr, params->length, XFER_MEM_HOST, memh_p);
    if (status == XFER_OK) {
        (*memh_p)->cuda = 1;
    }
    return status;
}

void xfer_tcp_mem_dereg(xfer_iface_h iface, xfer_memh_h memh)
{
    xfer_ep_h ep;

    if (!xfer_region_remove(iface->base.regions, memh->region.id, memh, XFER_TCP_SUBSYS)) {
        return;
    }
    /* peers' puts and gets in flight must not touch it any more */
    ucs_list_for_each(ep, &iface->eps, list) {
        xfer_tcp_ep_forget_region(ep, memh);
    }
    free(memh);
}

xfer_status_t xfer_tcp_rkey_pack(xfer_iface_h iface, xfer_memh_h memh, void *buf,
                                 size_t *len_p)
{
    (void)iface;
    if (!xfer_out_room(buf, len_p, XFER_REGION_KEY_LEN)) {
        return XFER_ERR_NO_RESOURCE;
    }
    xfer_region_key_pack(&memh->region, buf);
    return XFER_OK;
}

xfer_status_t xfer_tcp_rkey_unpack(xfer_iface_h iface, const void *buf, size_t len,
                                   xfer_rkey_h *rkey_p)
{
    xfer_region_key_t wire;
    xfer_rkey_h rkey;

    (void)iface;
    if ((len != XFER_REGION_KEY_LEN) ||
        (xfer_region_key_unpack(buf, &wire) != XFER_OK)) {
        xfer_log(XFER_LOG_ERROR, XFER_TCP_SUBSYS, "remote key of %zu bytes is not a tcp key "
                 "(%u bytes, bounds that do not wrap)", len, XFER_REGION_KEY_LEN);
        return XFER_ERR_INVALID_PARAM;
    }
    rkey = malloc(sizeof(*rkey));
    if (rkey == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    rkey->wire = wire;
    *rkey_p    = rkey;
    return XFER_OK;
}

void xfer_tcp_rkey_release(xfer_iface_h iface, xfer_rkey_h rkey)
{
    (void)iface;
    free(rkey);
}

/* ---- initiator ------------------------------------------------------------------------------ */

xfer_status_t xfer_tcp_rma_check(xfer_ep_h ep, const char *what, size_t length,
                                 uint64_t remote_addr, xfer_rkey_h rkey)
{
    xfer_status_t status = xfer_tcp_ep_check(ep);
    const xfer_region_key_t *r;

    if (status != XFER_OK) {
        return status;
    }
    r = &rkey->wire;
    if (!xfer_range_within(r->addr, r->length, remote_addr, length)) {
        return XFER_ERR_OUT_OF_RANGE;
    }
    if (length > ep->limits.max_msg_size) {
        return xfer_op_too_long(XFER_TCP_SUBSYS, what, length, ep->limits.max_msg_size,
                                "XFER_TCP_MAX_MSG_SIZE");
    }
    return XFER_OK;
}

/* The ep now waits for a response: it must read even when unexpected messages pile up. */
static void rma_posted(xfer_ep_h ep)
{
    xfer_tcp_ep_tx_post(ep);
    if (ep->rx.state == XFER_TCP_RX_PAUSED) {
        xfer_tcp_iface_rx_kick(ep->iface, ep);
    }
}

/*
 * A put is a PUT frame that completes once written (its data is then the socket's), the
 * peer's memory reached by a later flush; with XFER_TCP_PUT_ACK it is a PUT_REQ that
 * completes with the target's PUT_ACK. Data up to the eager threshold is copied into the
 * send queue, so an unacknowledged put of it completes at once.
 */
xfer_status_t xfer_tcp_put(xfer_ep_h ep, const void *buf, size_t length, xfer_memh_h memh,
                           uint64_t remote_addr, xfer_rkey_h rkey, xfer_comp_t *comp)
{
    xfer_tcp_wire_hdr_t hdr = {XFER_TCP_WIRE_MAGIC, XFER_TCP_WIRE_VERSION,
                               XFER_TCP_WIRE_PUT, 0, 0,
                               XFER_TCP_WIRE_PUT_EXT_LEN + (uint64_t)length, 0};
    char why[XFER_REASON_MAX] = "";
    xfer_tcp_wire_rma_t rma;
    xfer_tcp_op_t *op = NULL;
    void *bounce      = NULL;
    xfer_status_t status;
    int cuda, acked, eager;
    uint8_t *p;

    status = xfer_tcp_rma_check(ep, "put", length, remote_addr, rkey);
    if (status != XFER_OK) {
        return status;
    }
    cuda = xfer_tcp_buf_is_cuda(ep->iface, buf, length, memh, why, sizeof(why));
    if (cuda < 0) {
        xfer_log(XFER_LOG_ERROR, XFER_TCP_SUBSYS, "put: %s", why);
        return XFER_ERR_INVALID_PARAM;
    }
    acked = ep->iface->cfg->put_ack;
    eager = (length <= ep->iface->cfg->eager_threshold);
    if (acked || !eager) {
        op = xfer_tcp_op_new(ep->iface, ep, XFER_TCP_OP_PUT, comp);
        if (op == NULL) {
            return XFER_ERR_NO_MEMORY;
        }
        op->buf      = (void*)buf;
        op->len      = length;
        op->cuda     = cuda;
        op->on_write = !acked;
    }
    if (cuda && eager) {
        status = xfer_tcp_cuda_copy_small(ep->iface, buf, length, &bounce, why, sizeof(why));
        if (status != XFER_OK) {
            xfer_log(XFER_LOG_ERROR, XFER_TCP_SUBSYS, "put from CUDA memory: %s", why);
            xfer_tcp_op_free(op);
            return status;
        }
        buf = bounce;
    }
    if (acked) {
        hdr.type = XFER_TCP_WIRE_PUT_REQ;
        status   = xfer_slot_alloc(&ep->slots, XFER_TCP_SLOT_PUT, op, &hdr.id, &op->slot);
        if (status != XFER_OK) {
            free(bounce);
            xfer_tcp_op_free(op);
            return status;
        }
    } else {
        hdr.id = ep->puts_sent + 1;     /* counted once queued */
    }
    rma.region = rkey->wire.id;
    rma.cookie = rkey->wire.key;
    rma.addr   = remote_addr;
    rma.len    = length;
    if (eager) {
        p = xfer_tcp_ep_tx_reserve(ep, XFER_TCP_OP_HDR_MAX + length, 0);
        if (p == NULL) {
            if (acked) {
                xfer_slot_free(&ep->slots, op->slot);
            }
            free(bounce);
            xfer_tcp_op_free(op);
            return XFER_ERR_NO_MEMORY;
        }
        xfer_tcp_wire_pack_hdr(&hdr, p);
        xfer_tcp_wire_pack_put_ext(&rma, p + XFER_TCP_WIRE_HDR_LEN);
        if (length > 0) {
            memcpy(p + XFER_TCP_OP_HDR_MAX, buf, length);
        }
        free(bounce);
    } else {
        xfer_tcp_wire_pack_hdr(&hdr, op->hdr);
        xfer_tcp_wire_pack_put_ext(&rma, op->hdr + XFER_TCP_WIRE_HDR_LEN);
        op->tx.kind            = XFER_TCP_TX_OP;
        op->tx.iov[0].iov_base = op->hdr;
        op->tx.iov[0].iov_len  = XFER_TCP_OP_HDR_MAX;
        op->tx.iov[1].iov_base = (void*)buf;
        op->tx.iov[1].iov_len  = length;
        op->tx.dev             = cuda;
        op->tx_pending         = 1;
        xfer_tcp_ep_tx_push(ep, &op->tx);
    }
    ep->batch_puts_sent++;
    ep->tx_put_frames++;
    if (!acked) {
        ep->puts_sent++;
        xfer_tcp_ep_tx_post(ep);
        return eager ? XFER_OK : XFER_INPROGRESS;
    }
    op->serial = xfer_flushes_posted(&ep->flushes);
    rma_posted(ep);
    return XFER_INPROGRESS;
}

xfer_status_t xfer_tcp_get(xfer_ep_h ep, void *buf, size_t length, xfer_memh_h memh,
                           uint64_t remote_addr, xfer_rkey_h rkey, xfer_comp_t *comp)
{
    xfer_tcp_wire_hdr_t hdr = {XFER_TCP_WIRE_MAGIC, XFER_TCP_WIRE_VERSION,
                               XFER_TCP_WIRE_GET_REQ, 0, 0, XFER_TCP_WIRE_GET_EXT_LEN, 0};
    char why[XFER_REASON_MAX] = "";
    xfer_tcp_wire_rma_t rma;
    xfer_status_t status;
    xfer_tcp_op_t *op;
    uint8_t *p;
    int cuda;

    status = xfer_tcp_rma_check(ep, "get", length, remote_addr, rkey);
    if (status != XFER_OK) {
        return status;
    }
    cuda = xfer_tcp_buf_is_cuda(ep->iface, buf, length, memh, why, sizeof(why));
    if (cuda < 0) {
        xfer_log(XFER_LOG_ERROR, XFER_TCP_SUBSYS, "get: %s", why);
        return XFER_ERR_INVALID_PARAM;
    }
    op = xfer_tcp_op_new(ep->iface, ep, XFER_TCP_OP_GET, comp);
    if (op == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    op->buf  = buf;
    op->len  = length;
    op->cuda = cuda;
    status  = xfer_slot_alloc(&ep->slots, XFER_TCP_SLOT_GET, op, &hdr.id, &op->slot);
    if (status != XFER_OK) {
        xfer_tcp_op_free(op);
        return status;
    }
    p = xfer_tcp_ep_tx_reserve(ep, XFER_TCP_WIRE_HDR_LEN + XFER_TCP_WIRE_GET_EXT_LEN, 0);
    if (p == NULL) {
        xfer_slot_free(&ep->slots, op->slot);
        xfer_tcp_op_free(op);
        return XFER_ERR_NO_MEMORY;
    }
    rma.region = rkey->wire.id;
    rma.cookie = rkey->wire.key;
    rma.addr   = remote_addr;
    rma.len    = length;
    xfer_tcp_wire_pack_hdr(&hdr, p);
    xfer_tcp_wire_pack_get_ext(&rma, p + XFER_TCP_WIRE_HDR_LEN);
    ep->tx_get_reqs++;
    op->serial = xfer_flushes_posted(&ep->flushes);
    rma_posted(ep);
    return XFER_INPROGRESS;
}

/* ---- target --------------------------------------------------------------------------------- */

uint8_t *xfer_tcp_region_check(xfer_ep_h ep, const xfer_tcp_wire_rma_t *rma, xfer_memh_h *memh_p,
                               xfer_status_t *status_p, char *why, size_t why_size)
{
    xfer_region_t *r = xfer_region_reach(ep->iface->base.regions, rma->region, rma->cookie,
                                         rma->addr, rma->len, &ep->iface->base.failq,
                                         &ep->fail, &ep->bad_keys, status_p, why, why_size);

    if (r == NULL) {
        return NULL;
    }
    *memh_p = ucs_container_of(r, struct xfer_memh, region);
    return r->addr + (rma->addr - (uintptr_t)r->addr);
}

static xfer_status_t rx_put_req_ext(xfer_ep_h ep, const uint8_t *ext, char *why,
                                    size_t why_size)
{
    xfer_tcp_wire_rma_t rma;
    xfer_memh_h memh = NULL;
    xfer_status_t status;
    uint8_t *dest;

    if (ep->rx.hdr.type == XFER_TCP_WIRE_PUT) {
        if (ep->rx.hdr.id != ep->puts_rcvd + 1) {
            snprintf(why, why_size, "PUT carries id %" PRIu64 ", expected %" PRIu64,
                     ep->rx.hdr.id, ep->puts_rcvd + 1);
            return XFER_ERR_PROTOCOL;
        }
        ep->puts_rcvd++;
    }
    xfer_batch_rx_put(&ep->batch_puts, 1);
    ep->rx_put_frames++;
    status = xfer_tcp_wire_unpack_put_ext(ext, &ep->rx.hdr, &rma, why, why_size);
    if (status != XFER_OK) {
        return status;
    }
    dest          = xfer_tcp_region_check(ep, &rma, &memh, &status, why, why_size);
    ep->rx.status = status;
    if (dest == NULL) {
        xfer_log_peer("rma_refused", XFER_LOG_WARN, XFER_TCP_SUBSYS, "refusing a put: %s", why);
        xfer_tcp_rx_expect(ep, NULL, 0, rma.len);
        return XFER_OK;
    }
    ep->rx.memh = memh;
    if (memh->cuda) {
        xfer_tcp_rx_expect_device(ep, dest, rma.len, 0);
    } else {
        xfer_tcp_rx_expect(ep, dest, rma.len, 0);
    }
    return XFER_OK;
}

static xfer_status_t rx_put_req_done(xfer_ep_h ep, char *why, size_t why_size)
{
    xfer_tcp_batch_put_done(ep);
    return xfer_tcp_ep_answer(ep, XFER_TCP_WIRE_PUT_ACK, ep->rx.status, why, why_size);
}

xfer_status_t xfer_tcp_rx_put_done(xfer_ep_h ep, char *why, size_t why_size)
{
    xfer_tcp_batch_put_done(ep);
    if (ep->rx.status == XFER_OK) {
        return XFER_OK;
    }
    return xfer_tcp_ep_answer(ep, XFER_TCP_WIRE_PUT_FAIL, ep->rx.status, why, why_size);
}

static xfer_status_t rx_put_ack_ext(xfer_ep_h ep, const uint8_t *ext, char *why,
                                    size_t why_size)
{
    xfer_tcp_op_t *op = xfer_slot_answered(&ep->slots, ep->rx.hdr.id, XFER_TCP_SLOT_PUT,
                                           "PUT_ACK", why, why_size);

    (void)ext;
    if (op == NULL) {
        return XFER_ERR_PROTOCOL;
    }
    if (op->tx_pending) {
        snprintf(why, why_size, "PUT_ACK for a put whose data was not sent yet");
        return XFER_ERR_PROTOCOL;
    }
    xfer_slot_free(&ep->slots, op->slot);
    xfer_tcp_op_complete(op, ep->rx.hdr.status, (ep->rx.hdr.status == XFER_OK) ? op->len : 0,
                         0);
    xfer_tcp_rx_expect(ep, NULL, 0, 0);
    return XFER_OK;
}

static xfer_status_t get_resp_error(xfer_ep_h ep, xfer_status_t status, char *why,
                                    size_t why_size)
{
    return xfer_tcp_ep_answer(ep, XFER_TCP_WIRE_GET_RESP, status, why, why_size);
}

static xfer_status_t rx_get_req_ext(xfer_ep_h ep, const uint8_t *ext, char *why,
                                    size_t why_size)
{
    xfer_tcp_wire_hdr_t hdr = {XFER_TCP_WIRE_MAGIC, XFER_TCP_WIRE_VERSION,
                               XFER_TCP_WIRE_GET_RESP, 0, ep->rx.hdr.id, 0, 0};
    xfer_tcp_wire_rma_t rma;
    xfer_status_t status;
    xfer_memh_h memh;
    const uint8_t *src;
    xfer_tcp_tx_t *tx;
    uint8_t *p;

    status = xfer_tcp_wire_unpack_get_ext(ext, &ep->rx.hdr, &ep->iface->limits, &rma, why,
                                          why_size);
    if (status != XFER_OK) {
        return status;
    }
    xfer_tcp_rx_expect(ep, NULL, 0, 0);
    ep->rx_get_reqs++;
    src = xfer_tcp_region_check(ep, &rma, &memh, &status, why, why_size);
    if (src == NULL) {
        xfer_log_peer("rma_refused", XFER_LOG_WARN, XFER_TCP_SUBSYS, "refusing a get: %s", why);
        return get_resp_error(ep, status, why, why_size);
    }
    hdr.length = rma.len;
    if (rma.len <= ep->iface->cfg->eager_threshold) {
        p = xfer_tcp_ep_tx_reserve(ep, XFER_TCP_WIRE_HDR_LEN + rma.len, 1);
        if (p == NULL) {
            return get_resp_error(ep, XFER_ERR_NO_MEMORY, why, why_size);
        }
        xfer_tcp_wire_pack_hdr(&hdr, p);
        if ((rma.len > 0) && memh->cuda) {
            /* the frame is queued: a copy that fails leaves it unsendable, so the ep fails */
            status = xfer_tcp_cuda_copy(ep->iface, p + XFER_TCP_WIRE_HDR_LEN, src, rma.len, 0,
                                        why, why_size);
            if (status != XFER_OK) {
                return status;
            }
        } else if (rma.len > 0) {
            memcpy(p + XFER_TCP_WIRE_HDR_LEN, src, rma.len);
        }
        return XFER_OK;
    }
    /* large: straight from the region, which mem_dereg() detaches from this entry */
    tx = calloc(1, sizeof(*tx) + XFER_TCP_WIRE_HDR_LEN);
    if (tx == NULL) {
        return get_resp_error(ep, XFER_ERR_NO_MEMORY, why, why_size);
    }
    tx->kind            = XFER_TCP_TX_GET_RESP;
    tx->memh            = memh;
    tx->resp            = XFER_TCP_ANSWER_COST(XFER_TCP_WIRE_HDR_LEN + rma.len);
    tx->iov[0].iov_base = tx + 1;
    tx->iov[0].iov_len  = XFER_TCP_WIRE_HDR_LEN;
    tx->iov[1].iov_base = (void*)src;
    tx->iov[1].iov_len  = rma.len;
    tx->dev             = memh->cuda;
    xfer_tcp_wire_pack_hdr(&hdr, tx + 1);
    xfer_tcp_ep_tx_push(ep, tx);
    return XFER_OK;
}

static xfer_status_t rx_get_resp_ext(xfer_ep_h ep, const uint8_t *ext, char *why,
                                     size_t why_size)
{
    xfer_tcp_op_t *op = xfer_slot_answered(&ep->slots, ep->rx.hdr.id, XFER_TCP_SLOT_GET,
                                           "GET_RESP", why, why_size);

    (void)ext;
    if (op == NULL) {
        return XFER_ERR_PROTOCOL;
    }
    if ((ep->rx.hdr.status == XFER_OK) && (ep->rx.hdr.length != op->len)) {
        snprintf(why, why_size, "GET_RESP carries %" PRIu64 " bytes, %zu were asked for",
                 ep->rx.hdr.length, op->len);
        return XFER_ERR_PROTOCOL;
    }
    ep->rx.op     = op;
    ep->rx.status = ep->rx.hdr.status;
    if (op->cuda) {
        xfer_tcp_rx_expect_device(ep, op->buf, ep->rx.hdr.length, 0);
    } else {
        xfer_tcp_rx_expect(ep, op->buf, ep->rx.hdr.length, 0);
    }
    return XFER_OK;
}

static xfer_status_t rx_get_resp_done(xfer_ep_h ep, char *why, size_t why_size)
{
    xfer_tcp_op_t *op = ep->rx.op;

    (void)why;
    (void)why_size;
    xfer_slot_free(&ep->slots, op->slot);
    xfer_tcp_op_complete(op, ep->rx.status, (ep->rx.status == XFER_OK) ? op->len : 0, 0);
    return XFER_OK;
}

/* The peer refused one of our PUTs, which completed when it was written: the caller hears of
 * it from the next flush that covers it. */
static xfer_status_t rx_put_fail_ext(xfer_ep_h ep, const uint8_t *ext, char *why,
                                     size_t why_size)
{
    uint64_t id = ep->rx.hdr.id;

    (void)ext;
    if ((id <= ep->put_fail_last) || (id > ep->puts_sent)) {
        snprintf(why, why_size, "PUT_FAIL for put %" PRIu64 ": %" PRIu64 " puts were sent and "
                 "refusals come in order, the last for put %" PRIu64, id, ep->puts_sent,
                 ep->put_fail_last);
        return XFER_ERR_PROTOCOL;
    }
    ep->put_fail_last = id;
    xfer_log(XFER_LOG_WARN, XFER_TCP_SUBSYS, "the peer refused put %" PRIu64 " of this "
             "endpoint after it completed locally (%s); the next flush reports it", id,
             xfer_status_string(ep->rx.hdr.status));
    if (ep->put_failed == 0) {
        ep->put_failed      = id;
        ep->put_fail_status = ep->rx.hdr.status;
    }
    xfer_tcp_rx_expect(ep, NULL, 0, 0);
    return XFER_OK;
}

const xfer_tcp_rx_handler_t xfer_tcp_rx_put_req  = {XFER_TCP_WIRE_PUT_EXT_LEN, rx_put_req_ext,
                                                    rx_put_req_done};
const xfer_tcp_rx_handler_t xfer_tcp_rx_put_ack  = {0, rx_put_ack_ext, NULL};
const xfer_tcp_rx_handler_t xfer_tcp_rx_put      = {XFER_TCP_WIRE_PUT_EXT_LEN, rx_put_req_ext,
                                                    xfer_tcp_rx_put_done};
const xfer_tcp_rx_handler_t xfer_tcp_rx_put_fail = {0, rx_put_fail_ext, NULL};
const xfer_tcp_rx_handler_t xfer_tcp_rx_get_req  = {XFER_TCP_WIRE_GET_EXT_LEN, rx_get_req_ext,
                                                    NULL};
const xfer_tcp_rx_handler_t xfer_tcp_rx_get_resp = {0, rx_get_resp_ext, rx_get_resp_done};
