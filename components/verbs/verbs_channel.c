/*
 * A channel: one RC queue pair to one peer, with many message slots and credit-based flow
 * control (where the seeds' design had one slot per peer and an ACK per message).
 *
 * Connection. ep_create() takes the QP to INIT and posts every receive; the endpoint
 * addresses (QPN, a random non-zero PSN, slot count and size, a keepalive word) cross the
 * bootstrap; ep_connect() takes the QP to RTR and RTS with the smaller of both MTUs and
 * writes one byte on the bootstrap connection. Nothing is sent before the peer's byte
 * arrives: its QP is then in RTR, so no first packet is dropped into a retry. The bootstrap
 * connection stays open as a liveness wire: the peer's death closes it at once.
 *
 * Credits. A sender holds one credit per receive the peer has posted for it and spends one
 * per message. Receivers repost consumed slots in batches (an eighth of the slots, at most
 * XFER_VERBS_RX_BATCH_MAX, per ibv_post_recv) and owe a credit back once its slot is posted
 * again: piggybacked on the next message (which also posts the batch early once a quarter
 * of the slots are unreturned), or, when half the slots are unreturned and no queued message
 * can carry them, by a zero-length RDMA WRITE WITH IMMEDIATE (the immediate is the count).
 * Data messages leave
 * XFER_VERBS_CTRL_CREDITS credits for answers (FIN, the tensor messages and writes), so
 * answers always pass even when a receiver holds credits back for its unexpected queue.
 *
 * Send queue. Sends are signalled every SIGNAL_INTERVAL work requests (and RDMA operations
 * always): RC completes in order, so one completion frees the send queue entries and copy
 * buffers of everything posted before it. Whatever cannot be posted (no credit, no room)
 * waits in the channel's queue, in order.
 *
 * Errors. A completion with an error fails the channel: every pending operation completes
 * with a status, the failure is logged with ibv_wc_status_str, the framework hears of it
 * (ep_failed), and the rest of the process goes on. Idle channels are probed (an 8-byte RDMA
 * WRITE to the peer's keepalive word) every KEEPALIVE, so a dead peer is found within
 * KEEPALIVE plus the RC retry budget (TIMEOUT x (RETRY_COUNT + 1)).
 */
#include "verbs.h"

#include <ucs/sys/math.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <unistd.h>

#define READY_BYTE          'R'
#define CONNECT_WAIT_MAX    30.0    /* seconds to wait for the peer's ready byte */
#define DESTROY_DRAIN_MAX   0.2     /* seconds ep_destroy waits for sends to complete */
#define SLOTS_INITIAL       64
#define SLOTS_MAX           (1u << 20)

static uint32_t random_psn(void)
{
    uint32_t psn = 0;

    if (getrandom(&psn, sizeof(psn), 0) != sizeof(psn)) {
        psn = (uint32_t)(xfer_verbs_now() * 1e6);
    }
    psn &= 0xffffff;
    return (psn != 0) ? psn : 1;
}

static uint64_t wr_id(xfer_ep_h ch, uint32_t low)
{
    return ((uint64_t)ch->id << 32) | low;
}

/* ---- outstanding-exchange slots ---------------------------------------------------------- */

xfer_status_t xfer_verbs_slot_alloc(xfer_ep_h ch, xfer_verbs_slot_kind_t kind, void *obj,
                                    uint64_t *id_p)
{
    xfer_verbs_slot_t *slot;
    uint32_t idx;

    if (ch->free_slot == UINT32_MAX) {
        uint32_t n = ch->num_slots ? ch->num_slots * 2 : SLOTS_INITIAL;
        xfer_verbs_slot_t *slots;

        if (n > SLOTS_MAX) {
            xfer_log(XFER_LOG_ERROR, XFER_VERBS_SUBSYS, "more than %u exchanges outstanding "
                     "on one channel", SLOTS_MAX);
            return XFER_ERR_NO_RESOURCE;
        }
        slots = realloc(ch->slots, n * sizeof(*slots));
        if (slots == NULL) {
            return XFER_ERR_NO_MEMORY;
        }
        for (uint32_t i = ch->num_slots; i < n; i++) {
            slots[i].gen       = 1;
            slots[i].kind      = XFER_VERBS_SLOT_FREE;
            slots[i].obj       = NULL;
            slots[i].next_free = (i + 1 < n) ? i + 1 : UINT32_MAX;
        }
        ch->free_slot = ch->num_slots;
        ch->slots     = slots;
        ch->num_slots = n;
    }
    idx           = ch->free_slot;
    slot          = &ch->slots[idx];
    ch->free_slot = slot->next_free;
    slot->kind    = kind;
    slot->obj     = obj;
    ch->busy_slots++;
    *id_p = ((uint64_t)slot->gen << 32) | idx;
    if (kind == XFER_VERBS_SLOT_FETCH) {
        ((xfer_verbs_treq_t*)obj)->slot = idx;
    } else {
        ((xfer_verbs_op_t*)obj)->slot = idx;
    }
    return XFER_OK;
}

/* The generation makes a stale or duplicate id miss instead of hitting a reused slot. */
xfer_verbs_slot_t *xfer_verbs_slot_find(xfer_ep_h ch, uint64_t id)
{
    uint32_t idx = (uint32_t)id;

    if ((idx >= ch->num_slots) || (ch->slots[idx].gen != (uint32_t)(id >> 32)) ||
        (ch->slots[idx].kind == XFER_VERBS_SLOT_FREE)) {
        return NULL;
    }
    return &ch->slots[idx];
}

void xfer_verbs_slot_free(xfer_ep_h ch, uint32_t idx)
{
    xfer_verbs_slot_t *slot = &ch->slots[idx];

    slot->gen++;
    if (slot->gen == 0) {
        slot->gen = 1;
    }
    slot->kind      = XFER_VERBS_SLOT_FREE;
    slot->obj       = NULL;
    slot->next_free = ch->free_slot;
    ch->free_slot   = idx;
    ch->busy_slots--;
}

/* ---- creation and connection ------------------------------------------------------------- */

static xfer_status_t qp_create(xfer_ep_h ch)
{
    xfer_iface_h iface = ch->iface;
    struct ibv_qp_init_attr init;
    struct ibv_qp_attr attr;

    memset(&init, 0, sizeof(init));
    init.send_cq             = iface->cq;
    init.recv_cq             = iface->cq;
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

/* The receive work request of slot idx, its one scatter entry in sge. */
static void rx_wr_fill(xfer_ep_h ch, uint32_t idx, struct ibv_recv_wr *wr, struct ibv_sge *sge)
{
    sge->addr   = (uintptr_t)(ch->rx_slab + (size_t)idx * ch->iface->cfg->seg_size);
    sge->length = (uint32_t)ch->iface->cfg->seg_size;
    sge->lkey   = ch->rx_mr->lkey;
    wr->wr_id   = wr_id(ch, XFER_VERBS_WR_RECV | idx);
    wr->sg_list = sge;
    wr->num_sge = 1;
    wr->next    = NULL;
}

static xfer_status_t rx_post(xfer_ep_h ch, uint32_t idx)
{
    struct ibv_recv_wr wr, *bad;
    struct ibv_sge sge;

    rx_wr_fill(ch, idx, &wr, &sge);
    return (ibv_post_recv(ch->qp, &wr, &bad) == 0) ? XFER_OK : XFER_ERR_NO_RESOURCE;
}

/* Consumed slots are reposted in batches: one ibv_post_recv for rx_batch of them. A slot's
 * credit becomes owed (returnable) only once it is posted again, so the peer never sends
 * into a slot that is not there; rx_due_owed counts the credits that wait on the post. */
static int rx_flush(xfer_ep_h ch)
{
    struct ibv_recv_wr wrs[XFER_VERBS_RX_BATCH_MAX], *bad;
    struct ibv_sge sges[XFER_VERBS_RX_BATCH_MAX];

    if (ch->rx_due == 0) {
        return 0;
    }
    for (uint32_t i = 0; i < ch->rx_due; i++) {
        rx_wr_fill(ch, ch->rx_due_idx[i], &wrs[i], &sges[i]);
        if (i > 0) {
            wrs[i - 1].next = &wrs[i];
        }
    }
    if (ibv_post_recv(ch->qp, wrs, &bad) != 0) {
        xfer_verbs_ch_fail(ch, XFER_ERR_IO, "ibv_post_recv of %u receives: %s", ch->rx_due,
                           strerror(errno));
        return -1;
    }
    ch->credits_owed += ch->rx_due_owed;
    ch->rx_due        = 0;
    ch->rx_due_owed   = 0;
    return 0;
}

/* Slot idx was consumed: repost it (with the next batch). owed: its credit goes back to
 * the peer once it is posted; else it is held (see credits_held). */
static int rx_repost(xfer_ep_h ch, uint32_t idx, int owed)
{
    ch->rx_due_idx[ch->rx_due++] = idx;
    if (owed) {
        ch->rx_due_owed++;
    } else {
        ch->credits_held++;
    }
    return (ch->rx_due >= ch->rx_batch) ? rx_flush(ch) : 0;
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
    return ((ch->wrs != NULL) && (ch->rx_due_idx != NULL)) ? XFER_OK : XFER_ERR_NO_MEMORY;
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
    free(ch->slots);
    xfer_verbs_meta_cache_clear(ch);
    kh_destroy_inplace(xfer_verbs_meta, &ch->meta_cache);
    kh_destroy_inplace(xfer_verbs_rsp, &ch->rsp_by_idx);
    free(ch);
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
    ch->fw_ep     = params->fw_ep;
    ch->is_server = params->is_server;
    ch->sock      = -1;
    ch->free_slot = UINT32_MAX;
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
    ch->id        = ++iface->next_ch_id;   /* before any work request carries it */
    if (ch->id == 0) {
        ch->id = ++iface->next_ch_id;
    }
    ucs_list_head_init(&ch->pendq);
    ucs_list_head_init(&ch->rsps);
    ucs_list_head_init(&ch->meta_lru);
    kh_init_inplace(xfer_verbs_rsp, &ch->rsp_by_idx);
    kh_init_inplace(xfer_verbs_meta, &ch->meta_cache);

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
    status = xfer_verbs_cq_reserve(iface, (int)(ch->sq_len + ch->rx_slots));
    if (status != XFER_OK) {
        free(ch);
        return status;
    }
    ch->sock = fcntl(params->sock_fd, F_DUPFD_CLOEXEC, 0);
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
        status = rx_post(ch, i);
        if (status != XFER_OK) {
            xfer_log(XFER_LOG_ERROR, XFER_VERBS_SUBSYS, "ibv_post_recv: %s", strerror(errno));
            goto err;
        }
    }
    ucs_list_add_tail(&iface->channels, &ch->list);
    ch->last_activity = xfer_verbs_now();
    *ep_p = ch;
    return XFER_OK;

err:
    iface->cq_committed -= (int)(ch->sq_len + ch->rx_slots);
    ch_free(ch);
    return status;
}

xfer_status_t xfer_verbs_ep_address(xfer_ep_h ch, void *buf, size_t *len_p)
{
    xfer_verbs_wire_ep_addr_t a;

    if (*len_p < XFER_VERBS_WIRE_EP_ADDR_LEN) {
        *len_p = XFER_VERBS_WIRE_EP_ADDR_LEN;
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
    a.ka_addr = (uintptr_t)ch->ka_word;
    a.ka_rkey = ch->ka_mr->rkey;
    xfer_verbs_wire_pack_ep_addr(&a, buf);
    *len_p = XFER_VERBS_WIRE_EP_ADDR_LEN;
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
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP};
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
    ev.data.ptr = ch;
    if (epoll_ctl(ch->iface->epfd, EPOLL_CTL_ADD, ch->sock, &ev) != 0) {
        xfer_log(XFER_LOG_ERROR, XFER_VERBS_SUBSYS, "epoll_ctl: %s", strerror(errno));
        return XFER_ERR_NO_RESOURCE;
    }
    if (send(ch->sock, &ready, 1, MSG_NOSIGNAL) != 1) {
        xfer_log(XFER_LOG_ERROR, XFER_VERBS_SUBSYS, "cannot tell the peer the channel is "
                 "ready: %s", strerror(errno));
        return XFER_ERR_CONNECTION;
    }
    ch->state         = XFER_VERBS_CH_WAIT_PEER;
    ch->last_activity = xfer_verbs_now();
    xfer_verbs_ch_sock_event(ch);   /* its byte may be here already */
    return XFER_OK;
}

xfer_status_t xfer_verbs_ch_check(xfer_ep_h ch)
{
    if (ch->state == XFER_VERBS_CH_FAILED) {
        return ch->fail_status;
    }
    return (ch->state == XFER_VERBS_CH_CREATED) ? XFER_ERR_BUSY : XFER_OK;
}

/* ---- sending ----------------------------------------------------------------------------- */

/* Post one work request. Signal it when asked to, or when enough went unsignalled that the
 * send queue or the copy buffers could run out before the next completion. */
static int post_send(xfer_ep_h ch, struct ibv_send_wr *wr, xfer_verbs_op_t *op, int signal)
{
    struct ibv_send_wr *bad;
    uint32_t idx = XFER_VERBS_WR_NONE;

    if (!signal && (++ch->unsignaled >= ch->signal_interval)) {
        signal = 1;
    }
    if (signal) {
        struct xfer_verbs_wr *e;

        idx            = ch->wr_head % ch->sq_len;
        e              = &ch->wrs[idx];
        e->seq         = ch->sq_posted + 1;
        e->tx_head     = ch->tx_head;
        e->op          = op;
        wr->send_flags |= IBV_SEND_SIGNALED;
    }
    wr->wr_id = wr_id(ch, idx);
    if (ibv_post_send(ch->qp, wr, &bad) != 0) {
        xfer_verbs_ch_fail(ch, XFER_ERR_IO, "ibv_post_send (%s): %s",
                           (wr->opcode == IBV_WR_SEND) ? "send" : "RDMA", strerror(errno));
        return -1;
    }
    if (signal) {
        ch->wr_head++;
        ch->unsignaled = 0;
    }
    ch->sq_posted++;
    ch->sq_free--;
    return 0;
}

/* Whether a message can be posted now: a credit (a data message leaves the control
 * reserve) and send queue room (one entry stays free for credit returns). */
static int msg_postable(const xfer_ep_h ch, int ctrl)
{
    return (ctrl ? (ch->credits >= 1) : (ch->credits > XFER_VERBS_CTRL_CREDITS)) &&
           (ch->sq_free > 1);
}

static uint16_t credits_take(xfer_ep_h ch)
{
    uint32_t n = (ch->credits_owed > 0xffff) ? 0xffff : ch->credits_owed;

    ch->credits_owed -= n;
    return (uint16_t)n;
}

/* XFER_VERBS_TEST_CORRUPT: damage this message (once) as the tests asked. */
static size_t corrupt(xfer_iface_h iface, uint8_t *msg, size_t msg_len)
{
    const char *how = iface->corrupt_how;

    iface->corrupt_type = 0;
    xfer_log(XFER_LOG_WARN, XFER_VERBS_SUBSYS, "damaging a %s (%s) on purpose",
             xfer_verbs_msg_name(msg[3]), how);
    if (strcmp(how, "type") == 0) {
        msg[3] = 0x7f;
    } else if (strcmp(how, "version") == 0) {
        msg[2] = 0x7f;
    } else if ((strcmp(how, "short") == 0) && (msg_len > XFER_VERBS_WIRE_HDR_LEN)) {
        return msg_len - 1;     /* a 40-byte header still claims the byte; a TENSOR_REQUEST's
                                 * key length does */
    } else if (strcmp(how, "field") == 0) {
        size_t hdr_len = xfer_verbs_wire_hdr_len(msg[3]);

        /* TENSOR_REQUEST: its key_len; META_DATA_UPDATE: its rank */
        if (msg_len >= hdr_len + 16) {
            msg[hdr_len + ((msg[3] == XFER_VERBS_MSG_TENSOR_REQUEST) ? 12 : 9)] = 0xff;
        }
    }
    return msg_len;
}

/* Post a message, msg (header and extension, its credits field filled here) then payload:
 * inline when it fits, else copied into the next copy buffer. */
static int post_msg(xfer_ep_h ch, uint8_t *msg, size_t msg_len, const void *payload,
                    size_t payload_len)
{
    size_t total = msg_len + payload_len;
    struct ibv_send_wr wr;
    struct ibv_sge sge[2];
    uint16_t credits;

    /* once a quarter of the slots are unreturned, the ones waiting for their repost go too:
     * the peer must not starve for credits this message could have carried */
    if ((ch->rx_due_owed > 0) && (ch->credits_owed + ch->rx_due_owed >= ch->rx_slots / 4) &&
        (rx_flush(ch) != 0)) {
        return -1;
    }
    credits = credits_take(ch);
    if (ch->iface->corrupt_type == msg[3]) {
        msg_len = corrupt(ch->iface, msg, msg_len);
        total   = msg_len + payload_len;
    }

    msg[4] = (uint8_t)credits;      /* the header's credits field, little-endian */
    msg[5] = (uint8_t)(credits >> 8);
    memset(&wr, 0, sizeof(wr));
    wr.opcode  = IBV_WR_SEND;
    wr.sg_list = sge;
    if (total <= ch->iface->max_inline) {
        sge[0].addr   = (uintptr_t)msg;
        sge[0].length = (uint32_t)msg_len;
        sge[0].lkey   = 0;
        sge[1].addr   = (uintptr_t)payload;
        sge[1].length = (uint32_t)payload_len;
        sge[1].lkey   = 0;
        wr.num_sge    = (payload_len > 0) ? 2 : 1;
        wr.send_flags = IBV_SEND_INLINE;
    } else {
        uint8_t *buf = ch->tx_slab + (ch->tx_head % ch->tx_slots) * ch->iface->cfg->seg_size;

        memcpy(buf, msg, msg_len);
        if (payload_len > 0) {
            memcpy(buf + msg_len, payload, payload_len);
        }
        ch->tx_head++;
        sge[0].addr   = (uintptr_t)buf;
        sge[0].length = (uint32_t)total;
        sge[0].lkey   = ch->tx_mr->lkey;
        wr.num_sge    = 1;
    }
    ch->credits--;
    ch->stats.tx_msgs[(msg[3] < XFER_VERBS_MSG_LAST) ? msg[3] : 0]++;
    xfer_log_at(XFER_LOG_TRACE, XFER_VERBS_SUBSYS, "QP 0x%x: send %s, %zu bytes (%s), %u "
                "credits left, %u returned", ch->qp->qp_num, xfer_verbs_msg_name(msg[3]),
                total, (wr.send_flags & IBV_SEND_INLINE) ? "inline" : "copied", ch->credits,
                credits);
    return post_send(ch, &wr, NULL, 0);
}

/* Post RDMA chunks of op while the send queue has room; 1 when all are posted. A tensor
 * write's last chunk (maybe of 0 bytes) carries its immediate: it consumes a receive at the
 * peer, so it waits for a credit like a message. */
static int post_rdma(xfer_ep_h ch, xfer_verbs_op_t *op)
{
    size_t chunk = ch->iface->port_attr.max_msg_sz;

    if ((chunk == 0) || (chunk > (1u << 30))) {
        chunk = 1u << 30;
    }
    while ((op->rdma_posted < op->rdma_len) || op->imm_pending) {
        size_t len = op->rdma_len - op->rdma_posted;
        struct ibv_sge sge;
        struct ibv_send_wr wr;

        if (ch->sq_free <= 1) {     /* one stays free for credit returns */
            return 0;
        }
        if (len > chunk) {
            len = chunk;
        }
        sge.addr   = (uintptr_t)op->buf + op->rdma_posted;
        sge.length = (uint32_t)len;
        sge.lkey   = op->lkey;
        memset(&wr, 0, sizeof(wr));
        wr.opcode              = (enum ibv_wr_opcode)op->opcode;
        wr.sg_list             = &sge;
        wr.num_sge             = (len > 0) ? 1 : 0;
        wr.wr.rdma.remote_addr = op->raddr + op->rdma_posted;
        wr.wr.rdma.rkey        = op->rkey;
        if ((op->opcode == IBV_WR_RDMA_WRITE) && (len > 0) && (len <= ch->iface->max_inline)) {
            /* a small write goes inside the work request, as ib_write_lat's does: the
             * device need not fetch it through the key */
            wr.send_flags = IBV_SEND_INLINE;
        }
        if (op->imm_pending && (op->rdma_posted + len == op->rdma_len)) {
            /* unlike a message it carries no credits back, so it leaves the last credit
             * for a credit return: two sides that both spent theirs would wait forever */
            if ((ch->credits < 2) || !msg_postable(ch, 1)) {
                ch->stats.credit_stalls++;
                return 0;
            }
            wr.opcode   = IBV_WR_RDMA_WRITE_WITH_IMM;
            wr.imm_data = htonl(op->imm);
            ch->credits--;
            op->imm_pending = 0;
            ch->stats.tx_writes++;
            ch->stats.tx_write_bytes += op->rdma_len;
        }
        if (post_send(ch, &wr, op, 1) != 0) {
            return -1;
        }
        op->rdma_posted += len;
        op->rdma_inflight++;
    }
    return 1;
}

/* Whether the first queued message can go now (and carry the owed credits). */
static int pendq_head_ready(xfer_ep_h ch)
{
    const xfer_verbs_op_t *op;

    if (ucs_list_is_empty(&ch->pendq)) {
        return 0;
    }
    op = ucs_list_head(&ch->pendq, xfer_verbs_op_t, list);
    return (op->post == XFER_VERBS_POST_MSG) && msg_postable(ch, op->ctrl);
}

/* Return owed credits alone when half the slots are owed and no message will carry them -
 * none is queued, or the first is stuck (waiting for credits the peer may be waiting on us
 * to return). */
static void credits_return(xfer_ep_h ch)
{
    struct ibv_send_wr wr;

    /* half of the slots not held for unexpected messages: with many held, the few left
     * (at least the control credits) must still come back */
    uint32_t threshold = (ch->rx_slots - ch->credits_held) / 2;

    if ((ch->state != XFER_VERBS_CH_CONNECTED) ||
        (ch->credits_owed + ch->rx_due_owed == 0) ||
        (ch->credits_owed + ch->rx_due_owed < threshold) || pendq_head_ready(ch) ||
        (ch->credits < 1) || (ch->sq_free < 1)) {
        return;
    }
    if (rx_flush(ch) != 0) {
        return;
    }
    memset(&wr, 0, sizeof(wr));
    wr.opcode              = IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.imm_data            = htonl(credits_take(ch));
    wr.num_sge             = 0;
    wr.wr.rdma.remote_addr = ch->peer.ka_addr;
    wr.wr.rdma.rkey        = ch->peer.ka_rkey;
    ch->credits--;
    post_send(ch, &wr, NULL, 0);
}

void xfer_verbs_ch_progress_pending(xfer_ep_h ch)
{
    while ((ch->state == XFER_VERBS_CH_CONNECTED) && !ucs_list_is_empty(&ch->pendq)) {
        xfer_verbs_op_t *op = ucs_list_head(&ch->pendq, xfer_verbs_op_t, list);
        int done;

        if (op->post == XFER_VERBS_POST_MSG) {
            if (!msg_postable(ch, op->ctrl)) {
                ch->stats.credit_stalls += (ch->sq_free > 1);
                break;
            }
            done = (post_msg(ch, op->msg, op->msg_len, op->payload, op->payload_len) == 0) ?
                   1 : -1;
        } else {
            done = post_rdma(ch, op);
        }
        if (done <= 0) {
            break;      /* no room (0), or the channel failed (-1) and flushed the queue */
        }
        ucs_list_del(&op->list);
        op->post = XFER_VERBS_POST_NONE;
        if ((op->kind == XFER_VERBS_OP_CTRL) ||
            ((op->kind == XFER_VERBS_OP_SEND) && (op->slot == UINT32_MAX))) {
            /* copied or inline: the caller's buffer is free (eager sends complete now) */
            xfer_verbs_op_complete(op, XFER_OK, op->payload_len, 0);
        }
    }
    credits_return(ch);
}

int xfer_verbs_ch_send_now(xfer_ep_h ch, uint8_t *msg, size_t msg_len, const void *payload,
                           size_t payload_len)
{
    if ((ch->state != XFER_VERBS_CH_CONNECTED) || !ucs_list_is_empty(&ch->pendq) ||
        !msg_postable(ch, 0)) {
        return 0;
    }
    if (post_msg(ch, msg, msg_len, payload, payload_len) != 0) {
        return -1;
    }
    credits_return(ch);
    return 1;
}

void xfer_verbs_ch_submit(xfer_ep_h ch, xfer_verbs_op_t *op)
{
    ucs_list_add_tail(&ch->pendq, &op->list);
    xfer_verbs_ch_progress_pending(ch);
}

xfer_status_t xfer_verbs_ch_send_ctrl(xfer_ep_h ch, const xfer_verbs_wire_hdr_t *hdr,
                                      const void *ext, size_t ext_len, const void *payload,
                                      size_t payload_len)
{
    xfer_verbs_op_t *op;
    xfer_verbs_wire_hdr_t h = *hdr;
    size_t hdr_len;

    if (ch->state == XFER_VERBS_CH_FAILED) {
        return ch->fail_status;
    }
    op = xfer_verbs_op_new(ch->iface, ch, XFER_VERBS_OP_CTRL, NULL);
    if (op == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    op->msg_len = xfer_verbs_wire_hdr_len(h.type) + ext_len + payload_len;
    if (op->msg_len > sizeof(op->msg_buf)) {
        op->msg = malloc(op->msg_len);
        if (op->msg == NULL) {
            op->msg = op->msg_buf;
            xfer_verbs_op_free(op);
            return XFER_ERR_NO_MEMORY;
        }
    }
    h.length = (uint32_t)(ext_len + payload_len);
    hdr_len  = xfer_verbs_wire_pack_hdr(&h, op->msg);
    if (ext_len > 0) {
        memcpy(op->msg + hdr_len, ext, ext_len);
    }
    if (payload_len > 0) {
        memcpy(op->msg + hdr_len + ext_len, payload, payload_len);
    }
    op->ctrl = 1;
    op->post = XFER_VERBS_POST_MSG;
    xfer_verbs_ch_submit(ch, op);
    return XFER_OK;
}

void xfer_verbs_ch_credit_release(xfer_ep_h ch)
{
    if (ch->credits_held > 0) {
        /* its slot may still wait for a repost: post first, then the credit may go back */
        if (rx_flush(ch) != 0) {
            return;
        }
        ch->credits_held--;
        ch->credits_owed++;
        credits_return(ch);
    }
}

/* ---- completions ------------------------------------------------------------------------- */

/* A message this side does not speak (another version, an unknown type): say so to the
 * peer, naming the message's id, and go on - the rest of the channel is sound. */
static void rx_unsupported(xfer_ep_h ch, const xfer_verbs_wire_hdr_t *hdr, const char *why)
{
    xfer_log(XFER_LOG_WARN, XFER_VERBS_SUBSYS, "QP 0x%x: refused a message from the peer: %s",
             ch->qp->qp_num, why);
    ch->stats.rejected++;
    xfer_verbs_tensor_error_send(ch, (uint32_t)hdr->id, XFER_TENSOR_ERR_TO_CONSUMER,
                                 XFER_ERR_UNSUPPORTED, why);
}

static void rx_message(xfer_ep_h ch, uint32_t idx, uint32_t byte_len)
{
    const uint8_t *buf = ch->rx_slab + (size_t)idx * ch->iface->cfg->seg_size;
    char why[XFER_REASON_MAX];
    xfer_verbs_wire_hdr_t hdr;
    xfer_status_t status;
    const uint8_t *ext;

    XFER_VERBS_DEVICE_WROTE(buf, (byte_len < ch->iface->cfg->seg_size) ? byte_len :
                                 ch->iface->cfg->seg_size);
    status = xfer_verbs_wire_unpack_hdr(buf, byte_len, &hdr, why, sizeof(why));
    xfer_log_at(XFER_LOG_TRACE, XFER_VERBS_SUBSYS, "QP 0x%x: received %s, %u bytes in slot %u",
                ch->qp->qp_num, (status == XFER_OK) ? xfer_verbs_msg_name(hdr.type) : "garbage",
                byte_len, idx);
    if (status == XFER_ERR_UNSUPPORTED) {
        if (hdr.version == XFER_VERBS_WIRE_VERSION) {
            ch->credits += hdr.credits;     /* an unknown type: the header is still ours */
        }
        rx_unsupported(ch, &hdr, why);
        status = XFER_OK;
    } else if (status == XFER_OK) {
        ext          = buf + xfer_verbs_wire_hdr_len(hdr.type);
        ch->credits += hdr.credits;
        ch->stats.rx_msgs[hdr.type]++;
        if (ch->credits > ch->peer.rx_slots) {
            snprintf(why, sizeof(why), "the peer returned more credits (%u) than it has slots "
                     "(%u)", ch->credits, ch->peer.rx_slots);
            status = XFER_ERR_PROTOCOL;
        } else if ((hdr.type == XFER_VERBS_MSG_TAG) || (hdr.type == XFER_VERBS_MSG_RTS) ||
                   (hdr.type == XFER_VERBS_MSG_FIN)) {
            status = xfer_verbs_tag_rx(ch, &hdr, ext, why, sizeof(why));
        } else if ((hdr.type == XFER_VERBS_MSG_META_DATA_UPDATE) ||
                   ((hdr.type == XFER_VERBS_MSG_ERROR_STATUS) &&
                    (hdr.tag == XFER_TENSOR_ERR_TO_CONSUMER))) {
            status = xfer_verbs_treq_rx(ch, &hdr, ext, why, sizeof(why));
        } else {
            status = xfer_verbs_rsp_rx(ch, &hdr, ext, why, sizeof(why));
        }
    }
    if ((status != XFER_OK) && (status != XFER_INPROGRESS)) {
        xfer_verbs_ch_fail(ch, status, "bad message from the peer: %s", why);
        return;
    }
    if (ch->state == XFER_VERBS_CH_FAILED) {
        return;     /* an answer it sent failed the channel */
    }
    /* an unexpected message kept past the cap holds its credit until it is received */
    rx_repost(ch, idx, status != XFER_INPROGRESS);
}

static void send_completed(xfer_ep_h ch, const struct ibv_wc *wc)
{
    uint32_t idx = (uint32_t)wc->wr_id;
    struct xfer_verbs_wr *e;
    xfer_verbs_op_t *op;

    if (idx >= ch->sq_len) {
        return;     /* unsignaled: only errors come here, handled by the caller */
    }
    e            = &ch->wrs[idx];
    op           = e->op;
    e->op        = NULL;
    ch->sq_done  = e->seq;
    ch->sq_free  = ch->sq_len - (uint32_t)(ch->sq_posted - ch->sq_done);
    ch->tx_tail  = e->tx_head;
    ch->wr_tail++;
    if (op == NULL) {
        ch->ka_pending = 0;
        return;
    }
    if (--op->rdma_inflight == 0) {
        if ((op->rdma_posted == op->rdma_len) && !op->imm_pending) {
            xfer_verbs_rdma_done(op, XFER_OK);
        }
    }
}

void xfer_verbs_ch_handle_wc(xfer_ep_h ch, const struct ibv_wc *wc)
{
    uint32_t low = (uint32_t)wc->wr_id;

    if (ch->state == XFER_VERBS_CH_FAILED) {
        return;     /* flushed work requests of a channel that already failed */
    }
    ch->active = 1;     /* no clock read per completion: the timer dates it */
    if (wc->status != IBV_WC_SUCCESS) {
        xfer_status_t st = (wc->status == IBV_WC_RETRY_EXC_ERR) ? XFER_ERR_TIMEOUT :
                           (wc->status == IBV_WC_REM_ACCESS_ERR) ? XFER_ERR_OUT_OF_RANGE :
                           XFER_ERR_CONNECTION;

        xfer_verbs_ch_fail(ch, st, "%s completion on QP 0x%x: %s (vendor error 0x%x)",
                           (low & XFER_VERBS_WR_RECV) ? "receive" : "send", ch->qp->qp_num,
                           ibv_wc_status_str(wc->status), wc->vendor_err);
        return;
    }
    if (low & XFER_VERBS_WR_RECV) {
        uint32_t idx = low & ~XFER_VERBS_WR_RECV;

        if (idx >= ch->rx_slots) {
            return;
        }
        if ((wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM) &&
            (ntohl(wc->imm_data) & XFER_TENSOR_IMM_FLAG)) {
            /* a tensor write: repost first, the completion may post an answer */
            if (rx_repost(ch, idx, 1) != 0) {
                return;
            }
            ch->stats.rx_writes++;
            ch->stats.rx_write_bytes += wc->byte_len;
            xfer_verbs_treq_write_arrived(ch, ntohl(wc->imm_data) & ~XFER_TENSOR_IMM_FLAG,
                                          wc->byte_len);
        } else if (wc->opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
            uint32_t n = ntohl(wc->imm_data);

            if ((uint64_t)ch->credits + n > ch->peer.rx_slots) {
                xfer_verbs_ch_fail(ch, XFER_ERR_PROTOCOL, "the peer returned %u credits, "
                                   "more than its %u slots", n, ch->peer.rx_slots);
                return;
            }
            ch->credits += n;
            if (rx_repost(ch, idx, 1) != 0) {
                return;
            }
        } else {
            rx_message(ch, idx, wc->byte_len);
        }
    } else {
        send_completed(ch, wc);
    }
    if (ch->state != XFER_VERBS_CH_FAILED) {
        xfer_verbs_ch_progress_pending(ch);
    }
}

/* ---- failure and teardown ---------------------------------------------------------------- */

/* Complete everything ch has pending with status. */
static void ch_teardown(xfer_ep_h ch, xfer_status_t status)
{
    xfer_iface_h iface = ch->iface;
    struct ibv_qp_attr attr = {.qp_state = IBV_QPS_ERR};
    xfer_verbs_op_t *op, *tmp;

    ch->state = XFER_VERBS_CH_FAILED;
    if (ch->qp != NULL) {
        ibv_modify_qp(ch->qp, &attr, IBV_QP_STATE);  /* flush; no more sends go out */
    }
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
    ucs_list_for_each_safe(op, tmp, &ch->pendq, list) {
        ucs_list_del(&op->list);
        op->post = XFER_VERBS_POST_NONE;
        if (op->kind == XFER_VERBS_OP_FETCH) {
            continue;   /* its request, in the slots below, completes it */
        }
        if (op->slot != UINT32_MAX) {
            xfer_verbs_slot_free(ch, op->slot);
            op->slot = UINT32_MAX;
        }
        if ((op->busy && (op->kind == XFER_VERBS_OP_RECV)) ||
            (op->kind == XFER_VERBS_OP_TWRITE)) {
            xfer_verbs_rdma_done(op, status);   /* off iface->busy, or its answer ends */
        } else {
            xfer_verbs_op_complete(op, status, 0, 0);
        }
    }
    for (uint32_t i = 0; i < ch->num_slots; i++) {
        xfer_verbs_slot_t *slot = &ch->slots[i];
        void *obj               = slot->obj;
        xfer_verbs_slot_kind_t kind = slot->kind;

        if (kind == XFER_VERBS_SLOT_FREE) {
            continue;
        }
        if (kind == XFER_VERBS_SLOT_SEND) {
            xfer_verbs_slot_free(ch, i);
            ((xfer_verbs_op_t*)obj)->slot = UINT32_MAX;
            xfer_verbs_op_complete(obj, status, 0, 0);
        } else {
            xfer_verbs_treq_fail(obj, status);  /* frees the slot */
        }
    }
    xfer_verbs_rsp_drop_ch(ch, status);
    /* receives for this peer only fail; receives for any peer stay posted */
    ucs_list_for_each_safe(op, tmp, &iface->posted, list) {
        if (op->ch == ch) {
            ucs_list_del(&op->list);
            xfer_verbs_op_complete(op, status, 0, 0);
        }
    }
    xfer_verbs_unexp_drop_ch(iface, ch, 0);
}

static void ch_fail_va(xfer_ep_h ch, xfer_log_level_t level, xfer_status_t status,
                       const char *fmt, va_list ap)
{
    if (ch->state == XFER_VERBS_CH_FAILED) {
        return;
    }
    vsnprintf(ch->fail_reason, sizeof(ch->fail_reason), fmt, ap);
    ch->fail_status = status;
    xfer_log_at(level, XFER_VERBS_SUBSYS, "channel of QP 0x%x (%s) failed: %s (%s)",
                (ch->qp != NULL) ? ch->qp->qp_num : 0, ch->iface->dev_name, ch->fail_reason,
                xfer_status_string(status));
    ch_teardown(ch, status);
    if (!ch->in_notify) {
        ch->in_notify = 1;
        ucs_list_add_tail(&ch->iface->notify, &ch->notify_link);
    }
}

void xfer_verbs_ch_fail(xfer_ep_h ch, xfer_status_t status, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    ch_fail_va(ch, XFER_LOG_WARN, status, fmt, ap);
    va_end(ap);
}

/* A peer that closes between two exchanges is an ordinary end, not worth a warning. */
static void ch_fail_quiet(xfer_ep_h ch, xfer_status_t status, const char *fmt, ...)
{
    int busy = !ucs_list_is_empty(&ch->pendq) || (ch->busy_slots > 0) ||
               (ch->sq_done != ch->sq_posted);
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

    while ((n = ibv_poll_cq(iface->cq, XFER_VERBS_CQ_BATCH, wc)) > 0) {
        for (int i = 0; i < n; i++) {
            xfer_ep_h owner = xfer_verbs_channel_find(iface, (uint32_t)(wc[i].wr_id >> 32));

            if (owner != NULL) {
                xfer_verbs_ch_handle_wc(owner, &wc[i]);
            }
        }
    }
}

void xfer_verbs_ch_sock_event(xfer_ep_h ch)
{
    char buf[16];
    ssize_t n;

    if (ch->state == XFER_VERBS_CH_FAILED) {
        epoll_ctl(ch->iface->epfd, EPOLL_CTL_DEL, ch->sock, NULL);
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
        xfer_verbs_ch_fail(ch, XFER_ERR_PROTOCOL, "unexpected %zd bytes on the bootstrap "
                           "connection", n);
        return;
    }
    cq_drain_for(ch);
    if (ch->state != XFER_VERBS_CH_FAILED) {
        ch_fail_quiet(ch, XFER_ERR_CONNECTION, "the peer closed the connection%s%s",
                           (n < 0) ? ": " : "", (n < 0) ? strerror(errno) : "");
    }
}

static void probe(xfer_ep_h ch, double now);
static void ch_fail_quiet(xfer_ep_h ch, xfer_status_t status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

void xfer_verbs_ch_timer(xfer_ep_h ch, double now)
{
    const xfer_verbs_config_t *cfg = ch->iface->cfg;

    if (ch->active) {   /* idle time is known to within one tick (KEEPALIVE / 2) */
        ch->active        = 0;
        ch->last_activity = now;
    }
    if ((ch->state == XFER_VERBS_CH_WAIT_PEER) &&
        (now - ch->last_activity > CONNECT_WAIT_MAX)) {
        xfer_verbs_ch_fail(ch, XFER_ERR_TIMEOUT, "the peer did not finish connecting within "
                           "%.0f s", CONNECT_WAIT_MAX);
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
    struct ibv_send_wr wr;
    struct ibv_sge sge;

    if (ch->sq_free < 2) {
        return;
    }
    sge.addr   = (uintptr_t)ch->ka_word;
    sge.length = 8;
    sge.lkey   = ch->ka_mr->lkey;
    memset(&wr, 0, sizeof(wr));
    wr.opcode              = IBV_WR_RDMA_WRITE;
    wr.sg_list             = &sge;
    wr.num_sge             = 1;
    wr.wr.rdma.remote_addr = ch->peer.ka_addr + 8;
    wr.wr.rdma.rkey        = ch->peer.ka_rkey;
    if (post_send(ch, &wr, NULL, 1) == 0) {
        ch->ka_pending    = 1;
        ch->last_activity = now;
    }
}

void xfer_verbs_ep_destroy(xfer_ep_h ch)
{
    xfer_iface_h iface;
    double until;

    if (ch == NULL) {
        return;
    }
    iface = ch->iface;
    /* best effort for what was reported sent: let the send queue drain a little */
    until = xfer_verbs_now() + DESTROY_DRAIN_MAX;
    while ((ch->state == XFER_VERBS_CH_CONNECTED) &&
           ((ch->sq_done != ch->sq_posted) || !ucs_list_is_empty(&ch->pendq)) &&
           (xfer_verbs_now() < until)) {
        if ((ch->sq_done != ch->sq_posted) && (ch->unsignaled > 0) && (ch->sq_free > 0) &&
            ucs_list_is_empty(&ch->pendq)) {
            /* nothing signalled covers the last sends: ask with a probe */
            if (!ch->ka_pending) {
                probe(ch, xfer_verbs_now());
            }
        }
        cq_drain_for(ch);
    }
    if (ch->state != XFER_VERBS_CH_FAILED) {
        ch_teardown(ch, XFER_ERR_CANCELED);
    }
    if (ch->in_notify) {
        ucs_list_del(&ch->notify_link);
        ch->in_notify = 0;
    }
    xfer_verbs_iface_deliver_ch(iface, ch);
    xfer_verbs_unexp_drop_ch(iface, ch, 1);
    epoll_ctl(iface->epfd, EPOLL_CTL_DEL, ch->sock, NULL);
    ucs_list_del(&ch->list);
    iface->cq_committed -= (int)(ch->sq_len + ch->rx_slots);
    ch_free(ch);
}

/* ---- counters ---------------------------------------------------------------------------- */

static void counter_put(xfer_counter_t *c, size_t max, size_t *n, const char *prefix,
                        const char *name, uint64_t value)
{
    if (*n < max) {
        snprintf(c[*n].name, sizeof(c[*n].name), "%s%s", prefix, name);
        c[*n].value = value;
    }
    (*n)++;
}

#define STAT(_name, _field) {_name, offsetof(xfer_verbs_ch_stats_t, _field)}

/* The counters besides the per-type message counts, in the order they are listed. */
static const struct {
    const char *name;
    size_t     offset;
} scalar_counters[] = {
    STAT("tx_tensor_writes", tx_writes),          STAT("tx_tensor_write_bytes", tx_write_bytes),
    STAT("rx_tensor_writes", rx_writes),          STAT("rx_tensor_write_bytes", rx_write_bytes),
    STAT("re_requests", rerequests),              STAT("meta_cache_hits", meta_hits),
    STAT("meta_cache_misses", meta_misses),       STAT("mr_cache_hits", mrc_hits),
    STAT("mr_cache_misses", mrc_misses),          STAT("mr_cache_evictions", mrc_evictions),
    STAT("bounced", bounced),                     STAT("credit_stalls", credit_stalls),
    STAT("rejected", rejected),
};

void xfer_verbs_ep_counters(xfer_ep_h ch, xfer_counter_t *c, size_t *count_p)
{
    const xfer_verbs_ch_stats_t *st = &ch->stats;
    size_t max = *count_p;
    size_t n   = 0;

    for (unsigned t = 1; t < XFER_VERBS_MSG_LAST; t++) {
        counter_put(c, max, &n, "tx_", xfer_verbs_msg_name(t), st->tx_msgs[t]);
    }
    for (unsigned t = 1; t < XFER_VERBS_MSG_LAST; t++) {
        counter_put(c, max, &n, "rx_", xfer_verbs_msg_name(t), st->rx_msgs[t]);
    }
    for (size_t i = 0; i < sizeof(scalar_counters) / sizeof(scalar_counters[0]); i++) {
        counter_put(c, max, &n, "", scalar_counters[i].name,
                    *(const uint64_t*)((const char*)st + scalar_counters[i].offset));
    }
    *count_p = n;
}
