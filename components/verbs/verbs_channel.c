/*
 * A channel's life: one RC queue pair to one peer, with many message slots and credit-based
 * flow control (where the seeds' design had one slot per peer and an ACK per message), from
 * creation through connection and liveness to failure and teardown. What it sends is posted
 * by verbs_tx.c, what it receives and every completion are handled by verbs_rx.c, the ids of
 * its outstanding exchanges live in the framework's slot table (ch->slots) and its counters
 * are listed by verbs_counters.c.
 *
 * Connection. ep_create() takes the QP to INIT and posts every receive; the endpoint
 * addresses (QPN, a random non-zero PSN, slot count and size, a keepalive word) cross the
 * bootstrap; ep_connect() takes the QP to RTR and RTS with the smaller of both MTUs and
 * writes one byte on the bootstrap connection. Nothing is sent before the peer's byte
 * arrives: its QP is then in RTR, so no first packet is dropped into a retry. The bootstrap
 * connection stays open as a liveness wire: the peer's death closes it at once.
 *
 * Errors. A completion with an error fails the channel: every pending operation completes
 * with a status, the failure is logged with ibv_wc_status_str, the framework hears of it
 * (ep_failed), and the rest of the process goes on. Idle channels are probed (an 8-byte RDMA
 * WRITE to the peer's keepalive word) every KEEPALIVE, so a dead peer is found within
 * KEEPALIVE plus the RC retry budget (TIMEOUT x (RETRY_COUNT + 1)).
 */
#include "verbs.h"

#include <ucs/sys/math.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#define READY_BYTE          'R'
#define BYE_TAKEN_BYTE      'B'     /* the peer took our BYE */
#define CONNECT_WAIT_MAX    30.0    /* seconds to wait for the peer's ready byte */

static uint32_t random_psn(void)
{
    uint32_t psn = 0;

    if (getrandom(&psn, sizeof(psn), 0) != sizeof(psn)) {
        psn = (uint32_t)(xfer_now_sec() * 1e6);
    }
    psn &= 0xffffff;
    return (psn != 0) ? psn : 1;
}

/* ---- creation and connection ------------------------------------------------------------- */

static xfer_status_t qp_create(xfer_ep_h ch)
{
    xfer_iface_h iface = ch->iface;
    struct ibv_qp_init_attr init;
    struct ibv_qp_attr attr;

    memset(&init, 0, sizeof(init));
    init.send_cq             = iface->cqs[ch->cq_idx].cq;
    init.recv_cq             = iface->cqs[ch->cq_idx].cq;
    init.qp_type             = IBV_QPT_RC;
    init.cap.max_send_wr     = ch->sq_len;
    init.cap.max_recv_wr     = ch->rx_slots;
    init.cap.max_send_sge    = 2;
    init.cap.max_recv_sge    = 1;
    init.cap.max_inline_data = iface->max_inline;
    ch->qp = ibv_create_qp(iface->pd, &init);
    if (ch->qp == NULL) {
        xfer_log(XFER_LOG_ERROR, XFER_VERBS_SUBSYS, "%s: ibv_create_qp (send %u, receive %u, "
                 "inline %u): %s", iface->dev_name, ch->sq_len, ch->rx_slots,
                 iface->max_inline, strerror(errno));
        return XFER_ERR_NO_RESOURCE;
    }
    if (init.cap.max_inline_data < iface->max_inline) {
        iface->max_inline = init.cap.max_inline_data;
    }

    memset(&attr, 0, sizeof(attr));
    attr.qp_state        = IBV_QPS_INIT;
    attr.pkey_index      = 0;
    attr.port_num        = iface->port;
    attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                           IBV_ACCESS_REMOTE_READ;
    if (ibv_modify_qp(ch->qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                      IBV_QP_ACCESS_FLAGS) != 0) {
        xfer_log(XFER_LOG_ERROR, XFER_VERBS_SUBSYS, "QP 0x%x to INIT: %s", ch->qp->qp_num,
                 strerror(errno));
        return XFER_ERR_NO_RESOURCE;
    }
    return XFER_OK;
}

static xfer_status_t buffers_create(xfer_ep_h ch)
{
    xfer_iface_h iface = ch->iface;
    size_t seg         = iface->cfg->seg_size;

    if ((posix_memalign((void**)&ch->rx_slab, 4096, ch->rx_slots * seg) != 0) ||
        (posix_memalign((void**)&ch->tx_slab, 4096, ch->tx_slots * seg) != 0) ||
        (posix_memalign((void**)&ch->ka_word, 64, 64) != 0)) {
        return XFER_ERR_NO_MEMORY;
    }
    memset(ch->ka_word, 0, 64);
    ch->rx_mr = ibv_reg_mr(iface->pd, ch->rx_slab, ch->rx_slots * seg, IBV_ACCESS_LOCAL_WRITE);
    ch->tx_mr = ibv_reg_mr(iface->pd, ch->tx_slab, ch->tx_slots * seg, IBV_ACCESS_LOCAL_WRITE);
    ch->ka_mr = ibv_reg_mr(iface->pd, ch->ka_word, 64, IBV_ACCESS_LOCAL_WRITE |
                           IBV_ACCESS_REMOTE_WRITE);
    if ((ch->rx_mr == NULL) || (ch->tx_mr == NULL) || (ch->ka_mr == NULL)) {
        xfer_log(XFER_LOG_ERROR, XFER_VERBS_SUBSYS, "cannot register %zu bytes of message "
                 "slots: %s (is the locked-memory limit, ulimit -l, too low?)",
                 (ch->rx_slots + ch->tx_slots) * seg, strerror(errno));
        return XFER_ERR_NO_RESOURCE;
    }
    ch->wrs        = calloc(ch->sq_len, sizeof(*ch->wrs));
    ch->rx_due_idx = calloc(ch->rx_batch, sizeof(*ch->rx_due_idx));
    ch->meta_cache = xfer_meta_cache_create(iface->cfg->meta_cache,
                                            sizeof(xfer_tensor_wire_meta_t));
    return ((ch->wrs != NULL) && (ch->rx_due_idx != NULL) && (ch->meta_cache != NULL)) ?
           XFER_OK : XFER_ERR_NO_MEMORY;
}

static void ch_free(xfer_ep_h ch)
{
    if (ch->qp != NULL) {
        ibv_destroy_qp(ch->qp);
    }
    if (ch->rx_mr != NULL) {
        ibv_dereg_mr(ch->rx_mr);
    }
    if (ch->tx_mr != NULL) {
        ibv_dereg_mr(ch->tx_mr);
    }
    if (ch->ka_mr != NULL) {
        ibv_dereg_mr(ch->ka_mr);
    }
    if (ch->sock >= 0) {
        close(ch->sock);
    }
    free(ch->rx_slab);
    free(ch->tx_slab);
    free(ch->ka_word);
    free(ch->wrs);
    free(ch->rx_due_idx);
    xfer_slots_cleanup(&ch->slots);
    xfer_meta_cache_destroy(ch->meta_cache);
    free(ch);
}

/* The iface finds a channel by its id (each completion names one): O(1), not a walk of the
 * channels, whatever their number. */
static xfer_status_t ch_index(xfer_iface_h iface, xfer_ep_h ch)
{
    int ret;
    khiter_t it = kh_put(xfer_verbs_chans, &iface->chan_ids, ch->id, &ret);

    if (ret < 0) {
        return XFER_ERR_NO_MEMORY;
    }
    kh_value(&iface->chan_ids, it) = ch;
    return XFER_OK;
}

static void ch_unindex(xfer_iface_h iface, xfer_ep_h ch)
{
    khiter_t it = kh_get(xfer_verbs_chans, &iface->chan_ids, ch->id);

    if (it != kh_end(&iface->chan_ids)) {
        kh_del(xfer_verbs_chans, &iface->chan_ids, it);
    }
}

xfer_status_t xfer_verbs_ep_create(xfer_iface_h iface, const xfer_ep_params_t *params,
                                   xfer_ep_h *ep_p)
{
    const xfer_verbs_config_t *cfg = iface->cfg;
    xfer_status_t status;
    xfer_ep_h ch;
    int flags;

    ch = calloc(1, sizeof(*ch));
    if (ch == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    ch->iface     = iface;
    xfer_ep_fail_init(&ch->fail, ch, params->fw_ep);
    ch->is_server = params->is_server;
    ch->sock      = -1;
    xfer_slots_init(&ch->slots, 1u << 20);   /* a tensor request's id has 20 bits of slot */
    ch->state     = XFER_VERBS_CH_CREATED;
    ch->sq_len    = (uint32_t)cfg->tx_queue_len;
    ch->rx_slots  = (uint32_t)cfg->rx_queue_len;
    /* an eighth of the slots at most, so the peer's window stays wide */
    ch->rx_batch  = ucs_min(XFER_VERBS_RX_BATCH_MAX, ucs_max(1u, ch->rx_slots / 8));
    ch->tx_slots  = ch->sq_len;
    ch->sq_free   = ch->sq_len;
    /* Unsignalled work requests leave the send queue only with a later signalled one: an
     * interval as long as the queue fills it with requests nothing will ever complete (a
     * tag ping-pong hung at its 15th message with TX_QUEUE_LEN=16 and the default 32). */
    ch->signal_interval = ucs_max(1u, ucs_min((uint32_t)cfg->signal_interval,
                                              ch->sq_len / 4));
    ch->psn       = random_psn();
    /* before any work request carries it; 0 is none, and a wrapped id may still be taken */
    do {
        ch->id = ++iface->next_ch_id;
    } while ((ch->id == 0) || (xfer_verbs_channel_find(iface, ch->id) != NULL));
    ucs_list_head_init(&ch->pendq);
    ucs_list_head_init(&ch->flushes);
    ucs_list_head_init(&ch->batches);

    if ((params->peer_iface_addr == NULL) ||
        (xfer_verbs_wire_unpack_iface_addr(params->peer_iface_addr,
                                           params->peer_iface_addr_len,
                                           &ch->peer_iface) != XFER_OK)) {
        xfer_log(XFER_LOG_ERROR, XFER_VERBS_SUBSYS, "the peer's verbs address (%zu bytes) is "
                 "not valid", params->peer_iface_addr_len);
        free(ch);
        return XFER_ERR_PROTOCOL;
    }
    if (ch->peer_iface.link_layer != iface->port_attr.link_layer) {
        xfer_log(XFER_LOG_ERROR, XFER_VERBS_SUBSYS, "the peer's port is %s, ours (%s) is %s: "
                 "no common fabric", (ch->peer_iface.link_layer == IBV_LINK_LAYER_ETHERNET) ?
                 "Ethernet" : "InfiniBand", iface->dev_name,
                 (iface->port_attr.link_layer == IBV_LINK_LAYER_ETHERNET) ? "Ethernet" :
                 "InfiniBand");
        free(ch);
        return XFER_ERR_UNREACHABLE;
    }
    status = xfer_verbs_cq_reserve(iface, (int)(ch->sq_len + ch->rx_slots), &ch->cq_idx);
    if (status != XFER_OK) {
        free(ch);
        return status;
    }
    ch->sock = xfer_ep_sock_take(params->sock_fd, XFER_VERBS_SUBSYS);
    if (ch->sock < 0) {
        status = XFER_ERR_NO_RESOURCE;
        goto err;
    }
    flags = fcntl(ch->sock, F_GETFL);
    if ((flags < 0) || (fcntl(ch->sock, F_SETFL, flags | O_NONBLOCK) != 0)) {
        status = XFER_ERR_NO_RESOURCE;
        goto err;
    }
    status = buffers_create(ch);
    if (status != XFER_OK) {
        goto err;
    }
    status = qp_create(ch);
    if (status != XFER_OK) {
        goto err;
    }
    for (uint32_t i = 0; i < ch->rx_slots; i++) {
        status = xfer_verbs_ch_rx_post(ch, i);
        if (status != XFER_OK) {
            xfer_log(XFER_LOG_ERROR, XFER_VERBS_SUBSYS, "ibv_post_recv: %s", strerror(errno));
            goto err;
        }
    }
    status = ch_index(iface, ch);
    if (status != XFER_OK) {
        goto err;
    }
    ucs_list_add_tail(&iface->channels, &ch->list);
    ch->last_activity = xfer_now_sec();
    *ep_p = ch;
    return XFER_OK;

err:
    xfer_verbs_cq_release(iface, ch->cq_idx, (int)(ch->sq_len + ch->rx_slots));
    ch_free(ch);
    return status;
}

xfer_status_t xfer_verbs_ep_address(xfer_ep_h ch, void *buf, size_t *len_p)
{
    xfer_verbs_wire_ep_addr_t a;

    if (!xfer_out_room(buf, len_p, XFER_VERBS_WIRE_EP_ADDR_LEN)) {
        return XFER_ERR_NO_RESOURCE;
    }
    memset(&a, 0, sizeof(a));
    a.qpn           = ch->qp->qp_num;
    a.psn           = ch->psn;
    a.rx_slots      = ch->rx_slots;
    a.seg_size      = (uint32_t)ch->iface->cfg->seg_size;
    a.max_msg_size  = ch->iface->cfg->max_msg_size;
    a.max_key_len   = ch->iface->params.max_key_len;
    a.max_rd_atomic = (uint32_t)ch->iface->cfg->max_rd_atomic;
    if ((int)a.max_rd_atomic > ch->iface->dev_attr.max_qp_rd_atom) {
        a.max_rd_atomic = (uint32_t)ch->iface->dev_attr.max_qp_rd_atom;
    }
    a.ka_addr    = (uintptr_t)ch->ka_word;
    a.ka_rkey    = ch->ka_mr->rkey;
    a.rdma_chunk = ch->iface->rdma_chunk;
    xfer_verbs_wire_pack_ep_addr(&a, buf);
    return XFER_OK;
}

/* IB ack timeout: 4.096 us x 2^exponent. */
static uint8_t timeout_exponent(double seconds)
{
    uint8_t e = 1;

    while ((e < 31) && (4.096e-6 * (double)(1ull << e) < seconds)) {
        e++;
    }
    return e;
}

static xfer_status_t qp_connect(xfer_ep_h ch)
{
    xfer_iface_h iface             = ch->iface;
    const xfer_verbs_config_t *cfg = iface->cfg;
    enum ibv_mtu mtu               = iface->port_attr.active_mtu;
    struct ibv_qp_attr attr;
    static const uint8_t zero[16];
    uint32_t rd;

    if ((enum ibv_mtu)ch->peer_iface.active_mtu < mtu) {
        mtu = (enum ibv_mtu)ch->peer_iface.active_mtu;
    }
    if ((cfg->mtu > 0) && ((enum ibv_mtu)cfg->mtu < mtu)) {
        mtu = (enum ibv_mtu)cfg->mtu;
    }
    memset(&attr, 0, sizeof(attr));
    attr.qp_state           = IBV_QPS_RTR;
    attr.path_mtu           = mtu;
    attr.dest_qp_num        = ch->peer.qpn;
    attr.rq_psn             = ch->peer.psn;
    attr.max_dest_rd_atomic = (uint8_t)((cfg->max_rd_atomic < (uint64_t)iface->dev_attr.max_qp_rd_atom) ?
                              cfg->max_rd_atomic : (uint64_t)iface->dev_attr.max_qp_rd_atom);
    attr.min_rnr_timer      = 12;   /* 0.64 ms; receives are reposted at once anyway */
    attr.ah_attr.dlid       = ch->peer_iface.lid;
    attr.ah_attr.port_num   = iface->port;
    if ((iface->port_attr.link_layer == IBV_LINK_LAYER_ETHERNET) ||
        (memcmp(ch->peer_iface.gid, zero, 16) != 0 && (ch->peer_iface.lid == 0))) {
        attr.ah_attr.is_global      = 1;
        attr.ah_attr.grh.hop_limit  = 64;
        attr.ah_attr.grh.sgid_index = (uint8_t)iface->gid_index;
        memcpy(attr.ah_attr.grh.dgid.raw, ch->peer_iface.gid, 16);
    }
    if (ibv_modify_qp(ch->qp, &attr, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                      IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                      IBV_QP_MIN_RNR_TIMER) != 0) {
        xfer_log(XFER_LOG_ERROR, XFER_VERBS_SUBSYS, "QP 0x%x to RTR (peer QP 0x%x, MTU %d): "
                 "%s", ch->qp->qp_num, ch->peer.qpn, 128 << mtu, strerror(errno));
        return XFER_ERR_UNREACHABLE;
    }

    rd = ch->peer.max_rd_atomic;    /* what the peer's responder serves */
    if (rd > cfg->max_rd_atomic) {
        rd = (uint32_t)cfg->max_rd_atomic;
    }
    if ((int)rd > iface->dev_attr.max_qp_init_rd_atom) {
        rd = (uint32_t)iface->dev_attr.max_qp_init_rd_atom;
    }
    memset(&attr, 0, sizeof(attr));
    attr.qp_state      = IBV_QPS_RTS;
    attr.sq_psn        = ch->psn;
    attr.timeout       = timeout_exponent(cfg->timeout);
    attr.retry_cnt     = (uint8_t)cfg->retry_count;
    attr.rnr_retry     = (uint8_t)cfg->rnr_retry;
    attr.max_rd_atomic = (uint8_t)rd;
    if (ibv_modify_qp(ch->qp, &attr, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
                      IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC) != 0) {
        xfer_log(XFER_LOG_ERROR, XFER_VERBS_SUBSYS, "QP 0x%x to RTS: %s", ch->qp->qp_num,
                 strerror(errno));
        return XFER_ERR_UNREACHABLE;
    }
    xfer_log_at(XFER_LOG_DEBUG, XFER_VERBS_SUBSYS, "QP 0x%x connected to 0x%x (MTU %d, "
                "%u credits, reads %u)", ch->qp->qp_num, ch->peer.qpn, 128 << mtu,
                ch->peer.rx_slots, rd);
    return XFER_OK;
}

xfer_status_t xfer_verbs_ep_connect(xfer_ep_h ch, const void *peer_ep_addr, size_t addr_len)
{
    char why[XFER_REASON_MAX];
    const char ready = READY_BYTE;
    xfer_status_t status;

    status = xfer_verbs_wire_unpack_ep_addr(peer_ep_addr, addr_len, &ch->peer, why,
                                            sizeof(why));
    if (status != XFER_OK) {
        xfer_log(XFER_LOG_ERROR, XFER_VERBS_SUBSYS, "the peer's endpoint address: %s", why);
        return status;
    }
    status = qp_connect(ch);
    if (status != XFER_OK) {
        return status;
    }
    ch->credits      = ch->peer.rx_slots;
    ch->max_msg_size = (ch->peer.max_msg_size < ch->iface->cfg->max_msg_size) ?
                       ch->peer.max_msg_size : ch->iface->cfg->max_msg_size;
    ch->max_key_len  = (ch->peer.max_key_len < ch->iface->params.max_key_len) ?
                       ch->peer.max_key_len : ch->iface->params.max_key_len;
    if (ch->peer.seg_size < ch->iface->cfg->seg_size) {
        xfer_log(XFER_LOG_ERROR, XFER_VERBS_SUBSYS, "the peer's message slots are %" PRIu32
                 " bytes, ours %" PRIu64 ": set XFER_VERBS_SEG_SIZE alike on both sides",
                 ch->peer.seg_size, ch->iface->cfg->seg_size);
        return XFER_ERR_UNREACHABLE;
    }
    /* watched only from now on: until ep_connect() the framework still reads the socket
     * (maybe unlocked, beside a progress thread) */
    status = xfer_ep_sock_watch(ch->iface->base.epfd, ch->sock, ch, XFER_VERBS_SUBSYS);
    if (status != XFER_OK) {
        return status;
    }
    if (send(ch->sock, &ready, 1, MSG_NOSIGNAL) != 1) {
        xfer_log(XFER_LOG_ERROR, XFER_VERBS_SUBSYS, "cannot tell the peer the channel is "
                 "ready: %s", strerror(errno));
        return XFER_ERR_CONNECTION;
    }
    ch->state         = XFER_VERBS_CH_WAIT_PEER;
    ch->last_activity = xfer_now_sec();
    xfer_verbs_ch_sock_event(ch);   /* its byte may be here already */
    return XFER_OK;
}

xfer_status_t xfer_verbs_ch_check(xfer_ep_h ch)
{
    if (ch->state == XFER_VERBS_CH_FAILED) {
        return ch->fail.status;
    }
    return (ch->state == XFER_VERBS_CH_CREATED) ? XFER_ERR_BUSY : XFER_OK;
}

/* ---- failure and teardown ---------------------------------------------------------------- */

/* Complete everything ch has pending with status. */
static void ch_teardown(void *arg, xfer_status_t status)
{
    xfer_ep_h ch            = arg;
    struct ibv_qp_attr attr = {.qp_state = IBV_QPS_ERR};
    xfer_verbs_op_t *op, *tmp;

    if ((ch->state != XFER_VERBS_CH_CREATED) && (ch->sock >= 0) &&
        (status != XFER_ERR_PEER_CLOSED) && (status != XFER_ERR_CANCELED)) {
        /* a channel that fails here is closed to the peer at once, as tcp and shm close
         * their connection: the peer ends its side with XFER_ERR_CONNECTION now instead of
         * when its RC retries run out (7 x XFER_VERBS_TIMEOUT). Not after the peer's BYE
         * (the peer's close goes on over the socket) nor for a local destroy (ch_free
         * closes it), nor while the framework's handshake still owns the socket. The
         * socket leaves the epoll set at its next event (xfer_verbs_ch_sock_event). */
        shutdown(ch->sock, SHUT_RDWR);
    }
    ch->state = XFER_VERBS_CH_FAILED;
    if (ch->qp != NULL) {
        ibv_modify_qp(ch->qp, &attr, IBV_QP_STATE);  /* flush; no more sends go out */
    }
    /* batches first: they take their ops out of the send queue's ring and the queue */
    xfer_verbs_batch_ch_fail(ch, status);
    /* RDMA in flight: each op once, then what still waits to be posted */
    for (uint32_t i = 0; i < ch->sq_len; i++) {
        xfer_verbs_op_t *rop = ch->wrs[i].op;

        if (rop == NULL) {
            continue;
        }
        for (uint32_t j = i; j < ch->sq_len; j++) {
            if (ch->wrs[j].op == rop) {
                ch->wrs[j].op = NULL;
            }
        }
        if (rop->post != XFER_VERBS_POST_NONE) {
            ucs_list_del(&rop->list);
            rop->post = XFER_VERBS_POST_NONE;
        }
        rop->rdma_inflight = 0;
        xfer_verbs_rdma_done(rop, status);
    }
    xfer_verbs_ch_flushes_fail(ch, status);
    ucs_list_for_each_safe(op, tmp, &ch->pendq, list) {
        ucs_list_del(&op->list);
        op->post = XFER_VERBS_POST_NONE;
        if (op->kind == XFER_VERBS_OP_FETCH) {
            continue;   /* its request, in the slots below, completes it */
        }
        if (op->slot != UINT32_MAX) {
            xfer_slot_free(&ch->slots, op->slot);
            op->slot = UINT32_MAX;
        }
        if ((op->busy && (op->kind == XFER_VERBS_OP_RECV)) ||
            (op->kind == XFER_VERBS_OP_TWRITE)) {
            xfer_verbs_rdma_done(op, status);   /* off iface->busy, or its answer ends */
        } else {
            xfer_verbs_op_complete(op, status, 0, 0);
        }
    }
    for (uint32_t i = 0; i < ch->slots.num; i++) {
        xfer_slot_t *slot = &ch->slots.s[i];
        void *obj               = slot->obj;
        uint32_t kind           = slot->kind;

        if (kind == XFER_VERBS_SLOT_FREE) {
            continue;
        }
        if (kind == XFER_VERBS_SLOT_SEND) {
            xfer_slot_free(&ch->slots, i);
            ((xfer_verbs_op_t*)obj)->slot = UINT32_MAX;
            xfer_verbs_op_complete(obj, status, 0, 0);
        } else {
            xfer_verbs_treq_fail(obj, status);  /* frees the slot */
        }
    }
    xfer_verbs_rsp_drop_ch(ch, status);
}

static xfer_log_level_t ch_who(void *arg, char *buf, size_t size)
{
    xfer_ep_h ch = arg;

    snprintf(buf, size, "channel of QP 0x%x (%s)", (ch->qp != NULL) ? ch->qp->qp_num : 0,
             ch->iface->dev_name);
    return ch->fail_level;
}

/* Channels fail at once: never later. */
const xfer_ep_fail_ops_t xfer_verbs_ch_fail_ops = {XFER_VERBS_SUBSYS, ch_who, ch_teardown, NULL};

static void ch_fail_va(xfer_ep_h ch, xfer_log_level_t level, xfer_status_t status,
                       const char *fmt, va_list ap)
{
    if (ch->state != XFER_VERBS_CH_FAILED) {
        ch->fail_level = level;
    }
    xfer_ep_fail_v(&ch->iface->base.failq, &ch->fail, status, fmt, ap);
}

void xfer_verbs_ch_fail(xfer_ep_h ch, xfer_status_t status, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    ch_fail_va(ch, XFER_LOG_WARN, status, fmt, ap);
    va_end(ap);
}

/* A peer that closes between two exchanges is an ordinary end, not worth a warning. */
static void __attribute__((format(printf, 3, 4)))
ch_fail_quiet(xfer_ep_h ch, xfer_status_t status, const char *fmt, ...)
{
    int busy = !ucs_list_is_empty(&ch->pendq) || (ch->slots.busy > 0) ||
               (ch->sq_done != ch->sq_posted) || !ucs_list_is_empty(&ch->batches);
    va_list ap;

    va_start(ap, fmt);
    ch_fail_va(ch, busy ? XFER_LOG_WARN : XFER_LOG_INFO, status, fmt, ap);
    va_end(ap);
}

/* Completions of ch that are already in the CQ belong before a failure seen on the socket
 * (the peer may have sent its last message and exited). */
static void cq_drain_for(xfer_ep_h ch)
{
    struct ibv_wc wc[XFER_VERBS_CQ_BATCH];
    xfer_iface_h iface = ch->iface;
    int n;

    while ((n = ibv_poll_cq(iface->cqs[ch->cq_idx].cq, XFER_VERBS_CQ_BATCH, wc)) > 0) {
        for (int i = 0; i < n; i++) {
            xfer_ep_h owner = xfer_verbs_channel_find(iface, (uint32_t)(wc[i].wr_id >> 32));

            if (owner != NULL) {
                xfer_verbs_ch_handle_wc(owner, &wc[i]);
            }
        }
    }
}

static void bye_taken(xfer_ep_h ch);

void xfer_verbs_ch_sock_event(xfer_ep_h ch)
{
    char buf[16];
    ssize_t n;

    if (ch->state == XFER_VERBS_CH_FAILED) {
        epoll_ctl(ch->iface->base.epfd, EPOLL_CTL_DEL, ch->sock, NULL);
        return;
    }
    if (ch->state == XFER_VERBS_CH_CREATED) {
        return;     /* the framework's handshake still owns the socket */
    }
    n = recv(ch->sock, buf, sizeof(buf), 0);
    if ((n < 0) && ((errno == EAGAIN) || (errno == EWOULDBLOCK) || (errno == EINTR))) {
        return;
    }
    if (n > 0) {
        if ((ch->state == XFER_VERBS_CH_WAIT_PEER) && (buf[0] == READY_BYTE) && (n == 1)) {
            xfer_log_at(XFER_LOG_DEBUG, XFER_VERBS_SUBSYS, "QP 0x%x: the peer is ready",
                        ch->qp->qp_num);
            ch->state = XFER_VERBS_CH_CONNECTED;
            xfer_verbs_ch_progress_pending(ch);
            return;
        }
        if ((ch->state == XFER_VERBS_CH_CONNECTED) && ch->bye_sent && !ch->bye_taken &&
            (n == 1) && (buf[0] == BYE_TAKEN_BYTE)) {
            bye_taken(ch);
            return;
        }
        xfer_verbs_ch_fail(ch, XFER_ERR_PROTOCOL, "unexpected %zd bytes on the bootstrap "
                           "connection", n);
        return;
    }
    if (ch->bye_taken) {
        /* the peer ended after taking our BYE, as it should */
        epoll_ctl(ch->iface->base.epfd, EPOLL_CTL_DEL, ch->sock, NULL);
        return;
    }
    cq_drain_for(ch);
    if (ch->state != XFER_VERBS_CH_FAILED) {
        ch_fail_quiet(ch, XFER_ERR_CONNECTION, "the peer closed the connection%s%s",
                           (n < 0) ? ": " : "", (n < 0) ? strerror(errno) : "");
    }
}

static void probe(xfer_ep_h ch, double now);

void xfer_verbs_ch_timer(xfer_ep_h ch, double now)
{
    const xfer_verbs_config_t *cfg = ch->iface->cfg;

    if (ch->active) {   /* idle time is known to within one tick (KEEPALIVE / 2) */
        ch->active        = 0;
        ch->last_activity = now;
    }
    if ((ch->state == XFER_VERBS_CH_WAIT_PEER) &&
        (now - ch->last_activity > CONNECT_WAIT_MAX)) {
        /* the peer's byte may wait behind this tick: a process that did not progress for so
         * long (registering gigabytes, say) must not take its own delay for the peer's */
        xfer_verbs_ch_sock_event(ch);
        if (ch->state == XFER_VERBS_CH_WAIT_PEER) {
            xfer_verbs_ch_fail(ch, XFER_ERR_TIMEOUT, "the peer did not finish connecting "
                               "within %.0f s", CONNECT_WAIT_MAX);
        }
        return;
    }
    if ((ch->state == XFER_VERBS_CH_CONNECTED) && !ch->ka_pending &&
        (now - ch->last_activity >= cfg->keepalive)) {
        probe(ch, now);
    }
}

/* An RDMA WRITE needs no receive at the peer, only a live peer to acknowledge it. Signalled,
 * so that its completion also covers every send posted before it. */
static void probe(xfer_ep_h ch, double now)
{
    if (xfer_verbs_ch_post_probe(ch) == 0) {
        ch->ka_pending    = 1;
        ch->last_activity = now;
    }
}

/* ---- orderly close -------------------------------------------------------------------------
 *
 * The closing side has flushed; its BYE goes behind everything (RC delivers in order) and the
 * close goes on once the peer has it: its send completed, or the peer said so with one byte
 * on the bootstrap connection. The peer handles every message before the BYE, writes that
 * byte and ends the channel with XFER_ERR_PEER_CLOSED, its QP in the error state at once: an
 * acknowledgement it still owed us (for the probe a flush posts behind the BYE, or one that
 * was lost and is retried) never comes then, and without the byte the close would wait for
 * its timeout. A flush on the peer's side succeeds when everything it had sent that carried
 * data was known delivered by then (work requests posted after the last signalled
 * completion are not known, and count as not delivered). */

xfer_status_t xfer_verbs_ep_shutdown(xfer_ep_h ch, xfer_comp_t *comp)
{
    xfer_verbs_wire_hdr_t hdr = {.type = XFER_VERBS_MSG_BYE};
    xfer_status_t status;

    if (ch->state == XFER_VERBS_CH_FAILED) {
        return ch->fail.status;
    }
    hdr.tag = ch->rx_msgs;
    status = xfer_verbs_ch_send_ctrl(ch, &hdr, NULL, 0, NULL, 0);
    if (status != XFER_OK) {
        return status;
    }
    ch->bye_sent = 1;
    return xfer_verbs_ep_flush(ch, comp);
}

/* Whether only flushes wait: nothing else is queued, in flight or waiting for the peer. */
static int only_flushes_wait(xfer_ep_h ch)
{
    xfer_verbs_op_t *op;

    ucs_list_for_each(op, &ch->pendq, list) {
        if (op->post != XFER_VERBS_POST_FLUSH) {
            return 0;
        }
    }
    return ucs_list_is_empty(&ch->batches) && (ch->slots.busy == 0);
}

/* The flushes waiting for acknowledgements have what they wait for. */
static void flushes_delivered(xfer_ep_h ch)
{
    xfer_verbs_op_t *op, *tmp;

    ucs_list_for_each_safe(op, tmp, &ch->pendq, list) {
        ucs_list_del(&op->list);
        xfer_verbs_op_complete(op, XFER_OK, 0, 0);
    }
    xfer_verbs_ch_flushes_fail(ch, XFER_OK);
}

/* The channel ends after the peer's orderly close: flushes succeed when delivered (everything
 * sent that carried data is known to be there), and the channel fails with
 * XFER_ERR_PEER_CLOSED. */
static void bye_end(xfer_ep_h ch, int delivered, const char *why)
{
    xfer_verbs_ch_flushes_check(ch);
    ch->fail.bye_clean = delivered && only_flushes_wait(ch);
    if (ch->fail.bye_clean) {
        flushes_delivered(ch);
    }
    ch_fail_quiet(ch, XFER_ERR_PEER_CLOSED, "%s", why);
}

int xfer_verbs_ch_say_bye_taken(xfer_ep_h ch)
{
    const char taken = BYE_TAKEN_BYTE;

    return (send(ch->sock, &taken, 1, MSG_NOSIGNAL | MSG_DONTWAIT) == 1) ? 0 : -1;
}

void xfer_verbs_ch_bye_rx(xfer_ep_h ch, uint64_t peer_rx)
{
    if ((ch->sock >= 0) && (xfer_verbs_ch_say_bye_taken(ch) != 0)) {
        /* the peer's close then ends at its own acknowledgements, or its timeout */
        xfer_log_at(XFER_LOG_DEBUG, XFER_VERBS_SUBSYS, "QP 0x%x: cannot tell the peer that "
                    "its BYE arrived: %s", ch->qp->qp_num, strerror(errno));
    }
    /* what carried data is known there: acknowledged by the peer's device, or posted before
     * a message the peer took before its BYE (RC executes in order) */
    bye_end(ch, (ch->sq_done >= ch->data_seq) || (peer_rx >= ch->data_msgs),
            "the peer closed its endpoint");
}

/* The peer's word that it took our BYE, and with it everything we sent before it: the close's
 * flush succeeds, and the channel waits quietly for its destroy (the peer's end of the
 * bootstrap connection closes next). Anything but flushes still waiting cannot end now. */
static void bye_taken(xfer_ep_h ch)
{
    if (!only_flushes_wait(ch)) {
        ch_fail_quiet(ch, XFER_ERR_PEER_CLOSED, "the peer took the notice of our close "
                      "while operations still waited for it");
        return;
    }
    xfer_log_at(XFER_LOG_DEBUG, XFER_VERBS_SUBSYS, "QP 0x%x: the peer took our BYE (%llu of "
                "%llu work requests acknowledged)", ch->qp->qp_num,
                (unsigned long long)ch->sq_done, (unsigned long long)ch->sq_posted);
    ch->bye_taken = 1;
    flushes_delivered(ch);
}

void xfer_verbs_ep_destroy(xfer_ep_h ch)
{
    xfer_iface_h iface;

    if (ch == NULL) {
        return;
    }
    iface = ch->iface;
    xfer_verbs_ch_log_unsent(ch);
    /* what was reported sent is delivered by the framework's flush before it gets here (or
     * the close was forced): nothing more is waited for */
    xfer_ep_fail_destroy(&iface->base.failq, &ch->fail);
    xfer_op_deliver_owner(iface->base.ops, ch);
    epoll_ctl(iface->base.epfd, EPOLL_CTL_DEL, ch->sock, NULL);
    ucs_list_del(&ch->list);
    ch_unindex(iface, ch);
    xfer_verbs_cq_release(iface, ch->cq_idx, (int)(ch->sq_len + ch->rx_slots));
    ch_free(ch);
}
