/*
 * The producer's side of a tensor fetch: the seeds' RdmaTensorResponse, with its states and
 * transitions written down as a table.
 *
 *   TENSOR_REQUEST -> the framework's engine has it (xfer_tanswer_*, engine.h), and the
 *   framework's rendezvous table its waiter (WAIT_PUBLISH)
 *
 *   state            event               action                          next
 *   WAIT_PUBLISH     published           the consumer expects exactly    WRITING
 *                                        this and its destination fits:
 *                                        RDMA WRITE WITH IMMEDIATE
 *   WAIT_PUBLISH     published           else META_DATA_UPDATE; hold     WAIT_RE_REQUEST
 *                                        the tensor
 *   WAIT_PUBLISH     failed (abort, ...) ERROR_STATUS with the reason    (end)
 *   WAIT_PUBLISH     withdrawn           the engine gives the waiter     (end)
 *                                        back; ERROR_STATUS CANCELED
 *   WAIT_RE_REQUEST  TENSOR_RE_REQUEST   check the destination; write    WRITING
 *   WAIT_RE_REQUEST  withdrawn           release the tensor; answer      (end)
 *   WRITING          write completed     release the tensor              (end)
 *   WRITING          withdrawn           nothing: the write answers it   WRITING
 *   any other pair                       the peer broke the protocol:
 *                                        ERROR_STATUS, the response ends
 *
 * The write goes straight from the published tensor: the framework keeps it valid and
 * unchanged until tensor_release(), so no copy is needed while a re-request is on its way.
 * A source that cannot be registered (the MR cache refuses it) is copied once into a
 * registered bounce buffer; the write never goes out with a key that does not cover it.
 * The write's immediate consumes one of the consumer's receives, so it waits for a credit
 * like a message: tensor writes in flight per channel are bounded by the consumer's slots.
 * A dead tensor, or an empty one, is a zero-byte write that carries only the immediate.
 */
#include "verbs.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum {
    RSP_EV_READY,
    RSP_EV_RE_REQUEST,
    RSP_EV_WITHDRAW,
    RSP_EV_NUM
} rsp_event_t;

static const char *const state_names[] = {
    [XFER_VERBS_RSP_WAIT_PUBLISH]    = "WAIT_PUBLISH",
    [XFER_VERBS_RSP_WAIT_RE_REQUEST] = "WAIT_RE_REQUEST",
    [XFER_VERBS_RSP_WRITING]         = "WRITING",
};

static const char *const event_names[] = {
    [RSP_EV_READY]      = "the publish",
    [RSP_EV_RE_REQUEST] = "TENSOR_RE_REQUEST",
    [RSP_EV_WITHDRAW]   = "a withdrawal",
};

typedef struct rsp_input {
    xfer_status_t               status;     /* READY */
    const xfer_tensor_t         *tensor;
    const char                  *reason;
    const xfer_verbs_wire_hdr_t *hdr;       /* messages */
    const uint8_t               *ext;
} rsp_input_t;

typedef void (*rsp_action_t)(xfer_verbs_rsp_t *rsp, const rsp_input_t *in);

static void on_ready(xfer_verbs_rsp_t *rsp, const rsp_input_t *in);
static void on_re_request(xfer_verbs_rsp_t *rsp, const rsp_input_t *in);
static void on_withdraw_waiting(xfer_verbs_rsp_t *rsp, const rsp_input_t *in);
static void on_withdraw_held(xfer_verbs_rsp_t *rsp, const rsp_input_t *in);
static void on_ignore(xfer_verbs_rsp_t *rsp, const rsp_input_t *in);

static const rsp_action_t transitions[XFER_VERBS_RSP_NUM_STATES][RSP_EV_NUM] = {
    [XFER_VERBS_RSP_WAIT_PUBLISH] = {
        [RSP_EV_READY]    = on_ready,
        [RSP_EV_WITHDRAW] = on_withdraw_waiting,
    },
    [XFER_VERBS_RSP_WAIT_RE_REQUEST] = {
        [RSP_EV_RE_REQUEST] = on_re_request,
        [RSP_EV_WITHDRAW]   = on_withdraw_held,
    },
    [XFER_VERBS_RSP_WRITING] = {
        [RSP_EV_WITHDRAW] = on_ignore,
    },
};

void xfer_verbs_tensor_error_send(xfer_ep_h ch, uint32_t idx, unsigned dir,
                                  xfer_status_t status, const char *reason)
{
    xfer_verbs_wire_hdr_t hdr = {.type = XFER_VERBS_MSG_ERROR_STATUS, .id = idx, .tag = dir,
                                 .status = (status < 0) ? status : XFER_ERR_PROTOCOL};
    uint8_t ext[XFER_TENSOR_WIRE_ERR_FIXED + XFER_TENSOR_WIRE_MAX_REASON];
    size_t len = strlen(reason);
    size_t n;

    if (len > XFER_TENSOR_WIRE_MAX_REASON) {
        len = XFER_TENSOR_WIRE_MAX_REASON;
    }
    n = xfer_tensor_wire_pack_err(reason, len, ext);
    xfer_verbs_ch_send_ctrl(ch, &hdr, ext, n, NULL, 0);
}

/* ---- the response table: the engine's ------------------------------------------------------- */

static xfer_verbs_rsp_t *rsp_find(xfer_ep_h ch, uint32_t idx)
{
    xfer_tanswer_t *a = xfer_tanswer_find(ch->iface->base.tanswers, &ch->treqs, idx);

    return (a == NULL) ? NULL : a->priv;
}

/* What the response holds of the tensor besides the tensor itself goes now. */
static void rsp_let_go(xfer_verbs_rsp_t *rsp)
{
    xfer_iface_h iface = ((xfer_ep_h)rsp->a->ep)->iface;

    if (rsp->mr != NULL) {
        xfer_regcache_put(iface->mrc, rsp->mr);
        rsp->mr = NULL;
    }
    if (rsp->bounce_mr != NULL) {
        ibv_dereg_mr(rsp->bounce_mr);
        rsp->bounce_mr = NULL;
    }
    free(rsp->bounce);
    rsp->bounce = NULL;
}

/* The response ends: its tensor is released from the next progress() (the framework's
 * callbacks must not run inside the completion that ended it). */
static void rsp_finish(xfer_verbs_rsp_t *rsp, xfer_status_t status)
{
    rsp_let_go(rsp);
    xfer_tanswer_done(rsp->a, status);
}

/* Tell the consumer the request failed, and end the response. */
static void rsp_fail(xfer_verbs_rsp_t *rsp, xfer_status_t status, const char *reason)
{
    xfer_log_at(XFER_LOG_DEBUG, XFER_VERBS_SUBSYS, "tensor '%s' (step %" PRIu64 "): %s (%s)",
                rsp->a->key, rsp->a->step, reason, xfer_status_string(status));
    xfer_verbs_tensor_error_send(rsp->a->ep, (uint32_t)rsp->a->id, XFER_TENSOR_ERR_TO_CONSUMER,
                                 status, reason);
    rsp_finish(rsp, status);
}

static void rsp_event(xfer_verbs_rsp_t *rsp, rsp_event_t ev, const rsp_input_t *in)
{
    rsp_action_t action = transitions[rsp->state][ev];
    char why[XFER_REASON_MAX];

    xfer_log_at(XFER_LOG_TRACE, XFER_VERBS_SUBSYS, "response 0x%08" PRIx32 " (%s) in state %s: "
                "%s", (uint32_t)rsp->a->id, rsp->a->key, state_names[rsp->state],
                event_names[ev]);
    if (action == NULL) {
        snprintf(why, sizeof(why), "%s in state %s", event_names[ev], state_names[rsp->state]);
        xfer_log_peer("peer_protocol", XFER_LOG_WARN, XFER_VERBS_SUBSYS,
                      "tensor '%s': %s breaks the protocol",
                      rsp->a->key, why);
        ((xfer_ep_h)rsp->a->ep)->stats.rejected++;
        if (rsp->state == XFER_VERBS_RSP_WRITING) {
            return;     /* the write is on its way and ends the request */
        }
        rsp_fail(rsp, XFER_ERR_PROTOCOL, why);
        return;
    }
    action(rsp, in);
}

/* ---- writing ------------------------------------------------------------------------------- */

static void write_start(xfer_verbs_rsp_t *rsp)
{
    xfer_ep_h ch = rsp->a->ep;
    uint64_t len = xfer_tensor_wire_data_len(&rsp->meta);
    xfer_verbs_op_t *op;

    if (ch->state == XFER_VERBS_CH_FAILED) {
        rsp_finish(rsp, ch->fail.status);
        return;
    }
    op = xfer_verbs_op_new(ch->iface, ch, XFER_VERBS_OP_TWRITE, NULL);
    if (op == NULL) {
        rsp_fail(rsp, XFER_ERR_NO_MEMORY, "the producer is out of memory");
        return;
    }
    op->owner       = rsp;
    op->opcode      = IBV_WR_RDMA_WRITE;
    op->imm         = XFER_TENSOR_IMM_FLAG | (uint32_t)rsp->a->id;
    op->imm_pending = 1;
    op->rdma_len    = (size_t)len;
    if (len == 0) {
        /* only the immediate: aimed at the peer's keepalive word, which is always valid */
        op->raddr = ch->peer.ka_addr;
        op->rkey  = ch->peer.ka_rkey;
    } else {
        op->raddr = rsp->dst_addr;
        op->rkey  = rsp->dst_rkey;
        if (xfer_verbs_ch_mrc_get(ch, rsp->src, (size_t)len, &rsp->mr) == XFER_OK) {
            op->buf  = (void*)rsp->src;
            op->lkey = xfer_verbs_mr(rsp->mr)->lkey;
        } else {
            rsp->bounce = malloc((size_t)len);
            if (rsp->bounce != NULL) {
                rsp->bounce_mr = ibv_reg_mr(ch->iface->pd, rsp->bounce, (size_t)len,
                                            IBV_ACCESS_LOCAL_WRITE);
            }
            if (rsp->bounce_mr == NULL) {
                xfer_verbs_op_free(op);
                rsp_fail(rsp, XFER_ERR_NO_RESOURCE, "the producer can neither register the "
                         "tensor nor a bounce buffer for it");
                return;
            }
            memcpy(rsp->bounce, rsp->src, (size_t)len);
            ch->stats.bounced++;
            op->buf  = rsp->bounce;
            op->lkey = rsp->bounce_mr->lkey;
        }
    }
    rsp->state = XFER_VERBS_RSP_WRITING;
    op->post   = XFER_VERBS_POST_RDMA;
    xfer_verbs_ch_submit(ch, op);
}

void xfer_verbs_rsp_write_done(xfer_verbs_op_t *op, xfer_status_t status)
{
    xfer_verbs_rsp_t *rsp = op->owner;

    xfer_verbs_op_free(op);
    rsp_finish(rsp, status);
}

/* ---- the transitions ----------------------------------------------------------------------- */

/* The framework's answer, checked by the engine: metadata that holds, within the channel's
 * size limit. */
static void on_ready(xfer_verbs_rsp_t *rsp, const rsp_input_t *in)
{
    const xfer_tensor_t *t = in->tensor;
    xfer_ep_h ch           = rsp->a->ep;
    xfer_verbs_wire_hdr_t hdr = {.type = XFER_VERBS_MSG_META_DATA_UPDATE,
                                 .id = (uint32_t)rsp->a->id};
    uint8_t ext[XFER_TENSOR_WIRE_META_MAX];
    char why[XFER_REASON_MAX];
    uint64_t len;

    if (in->status != XFER_OK) {
        snprintf(why, sizeof(why), "the producer failed the request: %s", in->reason);
        rsp_fail(rsp, in->status, why);
        return;
    }
    xfer_tensor_wire_meta_from(&rsp->meta, t);
    if (t->is_dead) {
        rsp->meta.size = 0;
    }
    rsp->src = t->data;
    len      = xfer_tensor_wire_data_len(&rsp->meta);
    if (xfer_tensor_wire_meta_equal(&rsp->expect, &rsp->meta) && (len <= rsp->dst_capacity) &&
        ((rsp->dst_addr != 0) || (len == 0))) {
        write_start(rsp);   /* the steady state: one request, one write */
        return;
    }
    rsp->state = XFER_VERBS_RSP_WAIT_RE_REQUEST;
    xfer_verbs_ch_send_ctrl(ch, &hdr, ext, xfer_tensor_wire_pack_meta(&rsp->meta, ext), NULL, 0);
}

static void on_re_request(xfer_verbs_rsp_t *rsp, const rsp_input_t *in)
{
    uint64_t len = xfer_tensor_wire_data_len(&rsp->meta);
    char why[XFER_REASON_MAX];
    xfer_tensor_wire_rereq_t rr;

    if (xfer_tensor_wire_unpack_rereq(in->ext, in->hdr->length, &rr, why, sizeof(why)) !=
        XFER_OK) {
        rsp_fail(rsp, XFER_ERR_PROTOCOL, why);
        return;
    }
    if ((len > in->hdr->size) || ((len > 0) && (rr.addr == 0))) {
        snprintf(why, sizeof(why), "TENSOR_RE_REQUEST gives %" PRIu64 " bytes at 0x%" PRIx64
                 " for a %" PRIu64 "-byte tensor", in->hdr->size, rr.addr, len);
        rsp_fail(rsp, XFER_ERR_PROTOCOL, why);
        return;
    }
    rsp->dst_addr     = rr.addr;
    rsp->dst_rkey     = rr.rkey;
    rsp->dst_capacity = in->hdr->size;
    write_start(rsp);
}

/* The status the consumer gave up with; XFER_ERR_CANCELED when it named none. */
static xfer_status_t withdraw_status(const rsp_input_t *in)
{
    return (in->hdr->status < 0) ? (xfer_status_t)in->hdr->status : XFER_ERR_CANCELED;
}

/* The engine withdraws the waiter and answers with XFER_ERR_CANCELED (on_ready). */
static void on_withdraw_waiting(xfer_verbs_rsp_t *rsp, const rsp_input_t *in)
{
    xfer_ep_h ch = rsp->a->ep;

    (void)in;
    xfer_tanswer_cancel(ch->iface->base.tanswers, &ch->treqs, rsp->a->id);
}

static void on_withdraw_held(xfer_verbs_rsp_t *rsp, const rsp_input_t *in)
{
    xfer_verbs_tensor_error_send(rsp->a->ep, (uint32_t)rsp->a->id, XFER_TENSOR_ERR_TO_CONSUMER,
                                 withdraw_status(in), "withdrawn by the consumer");
    rsp_finish(rsp, withdraw_status(in));
}

static void on_ignore(xfer_verbs_rsp_t *rsp, const rsp_input_t *in)
{
    (void)rsp;
    (void)in;
}

/* ---- entry points -------------------------------------------------------------------------- */

void xfer_verbs_tensor_answer(xfer_tanswer_t *a, xfer_status_t status,
                              const xfer_tensor_t *tensor, const char *reason)
{
    xfer_verbs_rsp_t *rsp = a->priv;
    xfer_ep_h ch          = a->ep;
    rsp_input_t in        = {.status = status, .tensor = tensor, .reason = reason};

    rsp->a = a;
    if (ch->state == XFER_VERBS_CH_FAILED) {
        xfer_tanswer_done(a, ch->fail.status);  /* nothing goes to a channel that failed */
        return;
    }
    rsp_event(rsp, RSP_EV_READY, &in);
}

/* How many of one peer's requests may be pending here, waiting or being answered (the
 * framework's bound, which the framework holds to for the waiting ones). */
static uint32_t max_pending(xfer_iface_h iface)
{
    const xfer_iface_params_t *p = &iface->params;

    if ((p->size < offsetof(xfer_iface_params_t, max_tensor_requests) + sizeof(uint32_t)) ||
        (p->max_tensor_requests == 0)) {
        return UINT32_MAX;
    }
    return p->max_tensor_requests;
}

static xfer_status_t rx_request(xfer_ep_h ch, const xfer_verbs_wire_hdr_t *hdr,
                                const uint8_t *ext, char *why, size_t why_size)
{
    xfer_iface_h iface = ch->iface;
    xfer_tensor_wire_req_t req;
    xfer_status_t status;
    xfer_verbs_rsp_t *rsp;
    xfer_tanswer_t *a;

    if ((hdr->id > UINT32_MAX) || (hdr->id & XFER_TENSOR_IMM_FLAG)) {
        snprintf(why, why_size, "TENSOR_REQUEST with index 0x%" PRIx64 " (31 bits at most)",
                 hdr->id);
        return XFER_ERR_PROTOCOL;
    }
    if (xfer_tensor_wire_unpack_req(ext, hdr->length, iface->params.max_key_len, &req, why,
                                    why_size) != XFER_OK) {
        xfer_log_peer("tensor_request_refused", XFER_LOG_WARN, XFER_VERBS_SUBSYS,
                      "QP 0x%x: refused a TENSOR_REQUEST: %s",
                      ch->qp->qp_num, why);
        ch->stats.rejected++;
        xfer_verbs_tensor_error_send(ch, (uint32_t)hdr->id, XFER_TENSOR_ERR_TO_CONSUMER,
                                     XFER_ERR_PROTOCOL, why);
        return XFER_OK;
    }
    if (ch->treqs.count >= max_pending(iface)) {
        char reason[XFER_REASON_MAX];

        snprintf(reason, sizeof(reason), "%u of this peer's tensor requests are already "
                 "pending here (XFER_TENSOR_MAX_REQUESTS)", ch->treqs.count);
        xfer_log_at(XFER_LOG_DEBUG, XFER_VERBS_SUBSYS, "QP 0x%x: refusing a TENSOR_REQUEST: "
                    "%s", ch->qp->qp_num, reason);
        ch->stats.rejected++;
        xfer_verbs_tensor_error_send(ch, (uint32_t)hdr->id, XFER_TENSOR_ERR_TO_CONSUMER,
                                     XFER_ERR_NO_RESOURCE, reason);
        return XFER_OK;
    }
    a = xfer_tanswer_new(iface->base.tanswers, &ch->treqs, ch, ch->fail.fw_ep, (uint32_t)hdr->id,
                         hdr->tag, req.key_len, ch->max_msg_size, &status, why, why_size);
    if (a == NULL) {
        return status;      /* an index still pending: the peer broke the protocol */
    }
    rsp               = a->priv;
    rsp->a            = a;
    rsp->dst_addr     = req.addr;
    rsp->dst_rkey     = req.rkey;
    /* a destination holds exactly what its expectation says (tensor_wire.h) */
    rsp->dst_capacity = ((req.addr != 0) && !(req.expect.flags & XFER_TENSOR_META_NONE)) ?
                        xfer_tensor_wire_data_len(&req.expect) : 0;
    rsp->expect       = req.expect;
    memcpy(a->key, req.key, req.key_len);
    xfer_tanswer_start(a);
    return XFER_OK;
}

xfer_status_t xfer_verbs_rsp_rx(xfer_ep_h ch, const xfer_verbs_wire_hdr_t *hdr,
                                const uint8_t *ext, char *why, size_t why_size)
{
    rsp_input_t in = {.hdr = hdr, .ext = ext};
    xfer_tensor_wire_err_t err;
    xfer_verbs_rsp_t *rsp;
    rsp_event_t ev;

    switch (hdr->type) {
    case XFER_VERBS_MSG_TENSOR_REQUEST:
        return rx_request(ch, hdr, ext, why, why_size);
    case XFER_VERBS_MSG_TENSOR_RE_REQUEST:
        ev = RSP_EV_RE_REQUEST;
        break;
    case XFER_VERBS_MSG_ERROR_STATUS:
        if (hdr->tag != XFER_TENSOR_ERR_WITHDRAW) {
            snprintf(why, why_size, "ERROR_STATUS of unknown direction %" PRIu64, hdr->tag);
            return XFER_ERR_PROTOCOL;
        }
        if (xfer_tensor_wire_unpack_err(ext, hdr->length, hdr->status, &err, why, why_size) !=
            XFER_OK) {
            return XFER_ERR_PROTOCOL;
        }
        ev = RSP_EV_WITHDRAW;
        break;
    default:
        snprintf(why, why_size, "%s is not a producer's message",
                 xfer_verbs_msg_name(hdr->type));
        return XFER_ERR_PROTOCOL;
    }
    rsp = (hdr->id <= UINT32_MAX) ? rsp_find(ch, (uint32_t)hdr->id) : NULL;
    if (rsp == NULL) {
        if (ev == RSP_EV_WITHDRAW) {
            return XFER_OK;     /* it was answered already: the answer ends it there */
        }
        ch->stats.rejected++;
        xfer_log_peer("peer_protocol", XFER_LOG_WARN, XFER_VERBS_SUBSYS,
                      "QP 0x%x: %s for index 0x%" PRIx64 " that "
                      "has no response pending: ignored", ch->qp->qp_num,
                      xfer_verbs_msg_name(hdr->type), hdr->id);
        return XFER_OK;
    }
    rsp_event(rsp, ev, &in);
    return XFER_OK;
}

void xfer_verbs_rsp_drop_ch(xfer_ep_h ch, xfer_status_t status)
{
    xfer_tanswer_t *a;

    /* the registrations and bounce buffers of the tensors held go; the engine releases them */
    for (a = ch->treqs.first; a != NULL; a = a->next) {
        if (((xfer_verbs_rsp_t*)a->priv)->a == a) {
            rsp_let_go(a->priv);
        }
    }
    xfer_tanswers_ep_gone(&ch->treqs, status);
}
