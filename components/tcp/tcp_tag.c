/*
 * Tagged messages over tcp: sending, and handing arriving ones to the framework's matching
 * (framework/tag_match.c), which says where each one's data goes - a posted receive's buffer,
 * read straight from the socket into it (into device memory through bounce buffers), or a
 * buffer of the message's own until a receive comes.
 *
 * A message nobody receives past the bounds pauses the endpoint at the message's header (its
 * input is not read) until the framework makes room (tag_resume). One that waits for answers
 * to its puts, gets or fetches - answers that must not be held behind a message nobody
 * receives - may go on to twice its endpoint's bound (URGENT); past that it pauses as well,
 * and says so in the log. Once the peer has closed its side, what is left of its input is
 * bounded by the socket's buffer and is read whatever the bounds (FORCE), so that its end -
 * in order or not - is seen.
 */
#include "tcp.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

xfer_status_t xfer_tcp_tag_send(xfer_ep_h ep, uint64_t tag, const void *buf, size_t length,
                                xfer_memh_h memh, xfer_comp_t *comp)
{
    xfer_tcp_wire_hdr_t hdr = {XFER_TCP_WIRE_MAGIC, XFER_TCP_WIRE_VERSION, XFER_TCP_WIRE_TAG,
                               0, tag, length, 0};
    char why[XFER_REASON_MAX] = "";
    xfer_status_t status;
    xfer_tcp_op_t *op;
    int cuda;
    uint8_t *p;

    status = xfer_tcp_ep_check(ep);
    if (status != XFER_OK) {
        return status;
    }
    cuda = xfer_tcp_buf_is_cuda(ep->iface, buf, length, memh, why, sizeof(why));
    if (cuda < 0) {
        xfer_log(XFER_LOG_ERROR, XFER_TCP_SUBSYS, "tag send: %s", why);
        return XFER_ERR_INVALID_PARAM;
    }
    if (length > ep->limits.max_msg_size) {
        return xfer_op_too_long(XFER_TCP_SUBSYS, "tag send", length, ep->limits.max_msg_size,
                                "XFER_TCP_MAX_MSG_SIZE");
    }
    if (length <= ep->iface->cfg->eager_threshold) {
        /* copied into the send buffer: done, the caller may reuse its buffer now */
        void *bounce = NULL;

        if (cuda && (length > 0)) {
            status = xfer_tcp_cuda_copy_small(ep->iface, buf, length, &bounce, why,
                                              sizeof(why));
            if (status != XFER_OK) {
                xfer_log(XFER_LOG_ERROR, XFER_TCP_SUBSYS, "tag send from CUDA memory: %s", why);
                return status;
            }
            buf = bounce;
        }
        p = xfer_tcp_ep_tx_reserve(ep, XFER_TCP_WIRE_HDR_LEN + length, 0);
        if (p == NULL) {
            free(bounce);
            return XFER_ERR_NO_MEMORY;
        }
        xfer_tcp_wire_pack_hdr(&hdr, p);
        if (length > 0) {
            memcpy(p + XFER_TCP_WIRE_HDR_LEN, buf, length);
        }
        free(bounce);
        xfer_tcp_ep_tx_post(ep);
        return XFER_OK;
    }
    op = xfer_tcp_op_new(ep->iface, ep, XFER_TCP_OP_SEND, comp);
    if (op == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    op->buf      = (void*)buf;
    op->len      = length;
    op->on_write = 1;
    xfer_tcp_wire_pack_hdr(&hdr, op->hdr);
    op->tx.kind            = XFER_TCP_TX_OP;
    op->tx.iov[0].iov_base = op->hdr;
    op->tx.iov[0].iov_len  = XFER_TCP_WIRE_HDR_LEN;
    op->tx.iov[1].iov_base = (void*)buf;
    op->tx.iov[1].iov_len  = length;
    op->tx.dev             = cuda;
    op->cuda               = cuda;
    op->tx_pending         = 1;
    xfer_tcp_ep_tx_push(ep, &op->tx);
    xfer_tcp_ep_tx_post(ep);
    return XFER_INPROGRESS;
}

/* Room was made for messages nobody received: paused endpoints may read again. */
void xfer_tcp_tag_resume(xfer_iface_h iface)
{
    xfer_ep_h ep;

    ucs_list_for_each(ep, &iface->eps, list) {
        if (ep->rx.state == XFER_TCP_RX_PAUSED) {
            xfer_tcp_iface_rx_kick(iface, ep);
        }
    }
}

/* A kept message into a receive's buffer: through the copy engine when it is device memory. */
xfer_status_t xfer_tcp_tag_copy(xfer_ep_h ep, void *dst, xfer_memh_h memh, const void *src,
                                size_t len)
{
    char why[XFER_REASON_MAX] = "";
    int cuda = xfer_tcp_buf_is_cuda(ep->iface, dst, len, memh, why, sizeof(why));

    if ((cuda > 0) &&
        (xfer_tcp_cuda_copy(ep->iface, dst, src, len, 1, why, sizeof(why)) == XFER_OK)) {
        return XFER_OK;
    }
    if (cuda != 0) {
        xfer_log(XFER_LOG_ERROR, XFER_TCP_SUBSYS, "a %zu-byte message for a receive into "
                 "CUDA memory is lost: %s", len, why);
        return XFER_ERR_IO;
    }
    memcpy(dst, src, len);
    return XFER_OK;
}

/* A TAG header arrived: its data goes where the framework says, or the endpoint pauses. */
static xfer_status_t rx_tag_ext(xfer_ep_h ep, const uint8_t *ext, char *why, size_t why_size)
{
    const xfer_iface_params_t *p = &ep->iface->params;
    uint64_t len                 = ep->rx.hdr.length;
    unsigned flags               = (ep->slots.busy > 0) ? XFER_TAG_ARRIVE_URGENT : 0;
    char cwhy[XFER_REASON_MAX]   = "";
    xfer_tag_dest_t dest;
    size_t want;
    int cuda;

    (void)ext;
    if (ep->peer_closed) {
        /* the peer sends nothing more: the rest of this message is in the socket already,
         * or it never comes */
        if (len > ep->rx.got + xfer_tcp_ep_rx_available(ep)) {
            snprintf(why, why_size, "the peer closed the connection in the middle of a "
                     "%llu-byte message", (unsigned long long)len);
            return XFER_ERR_CONNECTION;
        }
        flags |= XFER_TAG_ARRIVE_FORCE;
    }
    switch (xfer_tag_arrive(p->fw_arg, ep->fail.fw_ep, ep->rx.hdr.id, len, flags, NULL, 0, &dest)) {
    case XFER_TAG_MATCHED:
        ep->rx.tag_handle = dest.handle;
        want              = (len < dest.capacity) ? (size_t)len : dest.capacity;
        cuda = xfer_tcp_buf_is_cuda(ep->iface, dest.buf, dest.capacity, dest.memh, cwhy,
                                    sizeof(cwhy));
        if (cuda < 0) {
            xfer_log(XFER_LOG_ERROR, XFER_TCP_SUBSYS, "a receive's buffer: %s", cwhy);
            ep->rx.status = XFER_ERR_INVALID_PARAM;
            xfer_tcp_rx_expect(ep, NULL, 0, len);
        } else if (cuda) {
            xfer_tcp_rx_expect_device(ep, dest.buf, want, len - want);
        } else {
            xfer_tcp_rx_expect(ep, dest.buf, want, len - want);
        }
        return XFER_OK;
    case XFER_TAG_UNEXPECTED:
        ep->rx.tag_handle = dest.handle;
        xfer_tcp_rx_expect(ep, dest.buf, (size_t)len, 0);
        return XFER_OK;
    case XFER_TAG_PAUSE:
        if ((ep->rx.state != XFER_TCP_RX_PAUSED) && (ep->slots.busy > 0)) {
            xfer_log(XFER_LOG_WARN, XFER_TCP_SUBSYS, "input from the %s pauses: its messages "
                     "nobody received yet reach the bounds (XFER_UNEXPECTED_EP, "
                     "XFER_UNEXPECTED_BUDGET), and the answers to %u request(s) of ours are "
                     "behind them until receives are posted", ep->is_server ? "client" :
                     "server", ep->slots.busy);
        }
        return XFER_ERR_BUSY;
    default:
        snprintf(why, why_size, "out of memory for a %llu-byte message nobody received yet",
                 (unsigned long long)len);
        return XFER_ERR_NO_MEMORY;
    }
}

static xfer_status_t rx_tag_done(xfer_ep_h ep, char *why, size_t why_size)
{
    void *handle = ep->rx.tag_handle;

    (void)why;
    (void)why_size;
    ep->rx.tag_handle = NULL;
    xfer_tag_done(handle, ep->rx.status);
    return XFER_OK;
}

const xfer_tcp_rx_handler_t xfer_tcp_rx_tag = {0, rx_tag_ext, rx_tag_done};
