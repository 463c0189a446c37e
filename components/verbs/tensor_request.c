/*
 * The consumer's side of a tensor fetch: the seeds' RdmaTensorRequest, with its states and
 * transitions written down as a table.
 *
 *   fetch() --TENSOR_REQUEST{key, index, destination, expected metadata}--> producer
 *
 *   state          event                 action                       next
 *   REQUESTED      write arrives         complete (the expectation    (end)
 *                                        held: steady state)
 *   REQUESTED      META_DATA_UPDATE      cache the metadata; find a   RE_REQUESTED
 *                                        destination that fits; send
 *                                        TENSOR_RE_REQUEST
 *   REQUESTED,     ERROR_STATUS          complete with its status     (end)
 *   RE_REQUESTED
 *   RE_REQUESTED   write arrives         complete                     (end)
 *   RE_REQUESTED   META_DATA_UPDATE      protocol error: fail it      WITHDRAWN
 *   WITHDRAWN      write / ERROR_STATUS  complete with the reason     (end)
 *                                        it was given up for
 *   WITHDRAWN      META_DATA_UPDATE      nothing: the withdrawal      WITHDRAWN
 *                                        crosses it and ends it
 *
 * A request is withdrawn (cancel, abort, a destination that does not fit) with an
 * ERROR_STATUS of direction WITHDRAW. While the producer may still write into a destination
 * it was given, the fetch completes only once the producer's last word (the write, or the
 * ERROR_STATUS that answers the withdrawal) came: the caller's buffer is never written after
 * its fetch completed. A request whose destination was never told completes at once.
 *
 * Request indices are the channel's slot table (slot + generation, the framework's): an
 * answer for a request that ended finds another generation and is rejected and counted,
 * never applied to the slot's next owner.
 *
 * Metadata cache: per channel (the same key may differ between producers), by key without
 * the step, bounded (TENSOR_META_CACHE entries, least recently used out first). A hit sends
 * the expectation with a destination that fits it, so that the steady state is one
 * TENSOR_REQUEST and one write. A fetch into a buffer the alloc callback returns has no
 * destination until the metadata is known, so it always takes the META_DATA_UPDATE round.
 */
#include "verbs.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum {
    TREQ_EV_WRITE,
    TREQ_EV_META,
    TREQ_EV_ERROR,
    TREQ_EV_NUM
} treq_event_t;

static const char *const state_names[] = {
    [XFER_VERBS_TREQ_REQUESTED]    = "REQUESTED",
    [XFER_VERBS_TREQ_RE_REQUESTED] = "RE_REQUESTED",
    [XFER_VERBS_TREQ_WITHDRAWN]    = "WITHDRAWN",
};

static const char *const event_names[] = {
    [TREQ_EV_WRITE] = "the tensor write",
    [TREQ_EV_META]  = "META_DATA_UPDATE",
    [TREQ_EV_ERROR] = "ERROR_STATUS",
};

/* What arrived: the write's length, or the message's header and extension. */
typedef struct treq_input {
    uint32_t                    byte_len;
    const xfer_verbs_wire_hdr_t *hdr;
    const uint8_t               *ext;
} treq_input_t;

typedef void (*treq_action_t)(xfer_verbs_treq_t *treq, const treq_input_t *in);

static void on_write(xfer_verbs_treq_t *treq, const treq_input_t *in);
static void on_meta(xfer_verbs_treq_t *treq, const treq_input_t *in);
static void on_error(xfer_verbs_treq_t *treq, const treq_input_t *in);
static void on_meta_twice(xfer_verbs_treq_t *treq, const treq_input_t *in);
static void on_withdrawn_end(xfer_verbs_treq_t *treq, const treq_input_t *in);
static void on_ignore(xfer_verbs_treq_t *treq, const treq_input_t *in);

static const treq_action_t transitions[XFER_VERBS_TREQ_NUM_STATES][TREQ_EV_NUM] = {
    [XFER_VERBS_TREQ_REQUESTED] = {
        [TREQ_EV_WRITE] = on_write,
        [TREQ_EV_META]  = on_meta,
        [TREQ_EV_ERROR] = on_error,
    },
    [XFER_VERBS_TREQ_RE_REQUESTED] = {
        [TREQ_EV_WRITE] = on_write,
        [TREQ_EV_META]  = on_meta_twice,
        [TREQ_EV_ERROR] = on_error,
    },
    [XFER_VERBS_TREQ_WITHDRAWN] = {
        [TREQ_EV_WRITE] = on_withdrawn_end,
        [TREQ_EV_META]  = on_ignore,
        [TREQ_EV_ERROR] = on_withdrawn_end,
    },
};

/* ---- the request table --------------------------------------------------------------------- */

static xfer_verbs_treq_t *treq_find(xfer_ep_h ch, uint32_t idx)
{
    uint32_t slot = xfer_tensor_idx_slot(idx);
    const xfer_slot_t *s;

    if (slot >= ch->slots.num) {
        return NULL;
    }
    s = &ch->slots.s[slot];
    if ((s->kind != XFER_VERBS_SLOT_FETCH) || (xfer_tensor_idx_make(slot, s->gen) != idx)) {
        return NULL;
    }
    return s->obj;
}

static void treq_free(xfer_verbs_treq_t *treq)
{
    xfer_slot_free(&treq->ch->slots, treq->slot);
    free(treq);
}

/* Complete the fetch (once); the request itself may live on, withdrawn. */
static void treq_complete(xfer_verbs_treq_t *treq, xfer_status_t status, size_t length)
{
    xfer_verbs_op_t *op = treq->op;

    if (op == NULL) {
        return;
    }
    treq->op = NULL;
    if (op->post != XFER_VERBS_POST_NONE) {
        ucs_list_del(&op->list);
        op->post = XFER_VERBS_POST_NONE;
    }
    xfer_verbs_op_complete(op, status, length, 0);
}

/* Give the request up: tell the producer, and complete now when it was never told where to
 * write; else on its last word. */
static void treq_withdraw(xfer_verbs_treq_t *treq, xfer_status_t status, const char *reason)
{
    treq->end_status = status;
    treq->state      = XFER_VERBS_TREQ_WITHDRAWN;
    xfer_verbs_tensor_error_send(treq->ch, treq->idx, XFER_TENSOR_ERR_WITHDRAW, status, reason);
    if (treq->addr == 0) {
        treq_complete(treq, status, 0);
    }
}

/* The consumer cancels: a request that never left ends now; one the producer has is
 * withdrawn (the fetch completes now when the producer was never told where to write, else
 * on its last word). */
static xfer_status_t treq_cancel(xfer_cancel_hook_t *hook, xfer_status_t status)
{
    xfer_verbs_treq_t *treq = ucs_container_of(hook, xfer_verbs_treq_t, hook);

    if (treq->op->post != XFER_VERBS_POST_NONE) {
        treq_complete(treq, status, 0);
        treq_free(treq);
    } else if (treq->state != XFER_VERBS_TREQ_WITHDRAWN) {
        treq_withdraw(treq, status, "the consumer cancelled the fetch");
    }
    return XFER_OK;
}

void xfer_verbs_treq_fail(xfer_verbs_treq_t *treq, xfer_status_t status)
{
    treq_complete(treq, (treq->state == XFER_VERBS_TREQ_WITHDRAWN) ? treq->end_status : status,
                  0);
    treq_free(treq);
}

static void treq_event(xfer_ep_h ch, uint32_t idx, treq_event_t ev, const treq_input_t *in)
{
    xfer_verbs_treq_t *treq = treq_find(ch, idx);

    if (treq == NULL) {
        ch->stats.rejected++;
        xfer_log(XFER_LOG_WARN, XFER_VERBS_SUBSYS, "QP 0x%x: %s for request index 0x%08" PRIx32
                 " that is not pending (stale or duplicate): ignored", ch->qp->qp_num,
                 event_names[ev], idx);
        return;
    }
    xfer_log_at(XFER_LOG_TRACE, XFER_VERBS_SUBSYS, "QP 0x%x: request 0x%08" PRIx32 " (%s) in "
                "state %s", ch->qp->qp_num, idx, treq->key, state_names[treq->state]);
    transitions[treq->state][ev](treq, in);
}

/* ---- destinations -------------------------------------------------------------------------- */

xfer_status_t xfer_verbs_ch_mrc_get(xfer_ep_h ch, const void *addr, size_t len,
                                    xfer_regcache_entry_t **mr_p)
{
    xfer_regcache_stats_t before, after;
    xfer_status_t status;

    xfer_regcache_stats(ch->iface->mrc, &before);
    status = xfer_regcache_get(ch->iface->mrc, addr, len, mr_p);
    xfer_regcache_stats(ch->iface->mrc, &after);
    ch->stats.mrc_hits      += after.hits - before.hits;
    ch->stats.mrc_misses    += after.misses - before.misses;
    ch->stats.mrc_evictions += after.evictions - before.evictions;
    return status;
}

/* Make [buf, buf + capacity) the destination the producer is told: its rkey from the
 * caller's registration or from the MR cache (held until the fetch completes). A destination
 * of 0 bytes needs none: the write of an empty or dead tensor carries only its immediate. */
static xfer_status_t dest_set(xfer_verbs_treq_t *treq, void *buf, size_t capacity)
{
    xfer_verbs_op_t *op = treq->op;
    xfer_status_t status;

    treq->buf      = buf;
    treq->capacity = capacity;
    if ((buf == NULL) || (capacity == 0)) {
        treq->addr = 0;
        treq->rkey = 0;
        return XFER_OK;
    }
    if (treq->memh != NULL) {
        treq->rkey = treq->memh->mr->rkey;
    } else {
        if (treq->ch->iface->devmem != NULL) {
            status = treq->ch->iface->devmem->unregistered(treq->ch->iface, buf, capacity);
            if (status != XFER_OK) {
                return status;
            }
        }
        status = xfer_verbs_ch_mrc_get(treq->ch, buf, capacity, &op->mr);
        if (status != XFER_OK) {
            return status;
        }
        treq->rkey = xfer_verbs_mr(op->mr)->rkey;
    }
    treq->addr = (uintptr_t)buf;
    return XFER_OK;
}

/* ---- fetch --------------------------------------------------------------------------------- */

xfer_status_t xfer_verbs_tensor_fetch(xfer_ep_h ch, const xfer_fetch_args_t *args,
                                      xfer_comp_t *comp)
{
    xfer_verbs_wire_hdr_t hdr   = {.type = XFER_VERBS_MSG_TENSOR_REQUEST};
    xfer_status_t status        = xfer_verbs_ch_check(ch);
    xfer_tensor_wire_req_t req  = {0};
    xfer_verbs_treq_t *treq;
    xfer_verbs_op_t *op;
    uint64_t id, seg_room;
    size_t len;

    if ((status != XFER_OK) && (status != XFER_ERR_BUSY)) {
        return status;
    }
    /* the key goes in one message segment, with the request and the metadata it may carry */
    seg_room = ch->iface->cfg->seg_size - XFER_VERBS_WIRE_TREQ_HDR_LEN -
               XFER_TENSOR_WIRE_REQ_FIXED - XFER_TENSOR_WIRE_META_MAX;
    status   = xfer_fetch_start(args, comp, (ch->max_key_len < seg_room) ? ch->max_key_len :
                                (uint32_t)seg_room, XFER_VERBS_SUBSYS, NULL);
    if (status != XFER_OK) {
        return status;
    }
    /* malloc and clear the fixed part: glibc's calloc bypasses the per-thread cache, and
     * this is once per fetch */
    treq = malloc(sizeof(*treq) + args->key_len + 1);
    op   = xfer_verbs_op_new(ch->iface, ch, XFER_VERBS_OP_FETCH, comp);
    if ((treq == NULL) || (op == NULL)) {
        free(treq);
        if (op != NULL) {
            xfer_verbs_op_free(op);
        }
        return XFER_ERR_NO_MEMORY;
    }
    memset(treq, 0, sizeof(*treq));
    op->result      = args->result;
    treq->op        = op;
    treq->ch        = ch;
    treq->state     = XFER_VERBS_TREQ_REQUESTED;
    treq->alloc     = args->alloc;
    treq->alloc_arg = args->alloc_arg;
    treq->memh      = args->buffer ? args->memh : NULL;
    treq->step      = args->step;
    treq->key_len   = (uint32_t)args->key_len;
    memcpy(treq->key, args->key, args->key_len);
    treq->key[args->key_len] = '\0';

    if (xfer_meta_cache_find(ch->meta_cache, treq->key, &treq->meta)) {
        ch->stats.meta_hits++;
    } else {
        ch->stats.meta_misses++;
        treq->meta.flags = XFER_TENSOR_META_NONE;
    }
    status = dest_set(treq, args->buffer, args->buffer ? args->capacity : 0);
    if (status == XFER_OK) {
        status = xfer_slot_alloc(&ch->slots, XFER_VERBS_SLOT_FETCH, treq, &id, &treq->slot);
    }
    if (status != XFER_OK) {
        if (op->mr != NULL) {
            xfer_regcache_put(ch->iface->mrc, op->mr);
        }
        xfer_verbs_op_free(op);
        free(treq);
        return status;
    }
    treq->idx = xfer_tensor_idx_make((uint32_t)id, (uint32_t)(id >> 32));
    xfer_comp_hook(comp, &treq->hook, treq_cancel);    /* off again at its completion */

    if (!(treq->meta.flags & XFER_TENSOR_META_NONE) &&
        (xfer_tensor_wire_data_len(&treq->meta) > treq->capacity)) {
        /* A destination is promised to hold what is expected (tensor_wire.h), and the cached
         * tensor does not fit this one (or there is none yet: alloc). Ask as a first fetch
         * does; the answer says what the tensor is now. */
        memset(&treq->meta, 0, sizeof(treq->meta));
        treq->meta.flags = XFER_TENSOR_META_NONE;
    }
    req.addr    = treq->addr;
    req.rkey    = treq->rkey;
    req.expect  = treq->meta;
    req.key     = (const uint8_t*)treq->key;
    req.key_len = treq->key_len;
    len         = XFER_VERBS_WIRE_TREQ_HDR_LEN + xfer_tensor_wire_req_len(&req);
    if (len > sizeof(op->msg_buf)) {
        op->msg = malloc(len);
        if (op->msg == NULL) {
            op->msg = op->msg_buf;
            xfer_verbs_treq_fail(treq, XFER_ERR_NO_MEMORY);
            return XFER_INPROGRESS;     /* completes from progress() */
        }
    }
    hdr.id      = treq->idx;
    hdr.tag     = treq->step;
    xfer_verbs_wire_pack_hdr(&hdr, op->msg);
    xfer_tensor_wire_pack_req(&req, op->msg + XFER_VERBS_WIRE_TREQ_HDR_LEN);
    op->msg_len = len;
    op->post    = XFER_VERBS_POST_MSG;
    xfer_verbs_ch_submit(ch, op);
    return XFER_INPROGRESS;
}

/* ---- the transitions ----------------------------------------------------------------------- */

/* The write's completion reports only its last chunk (the one with the immediate): it must
 * be the last of the chunks the producer's endpoint address announced, for the size due. */
static void on_write(xfer_verbs_treq_t *treq, const treq_input_t *in)
{
    uint64_t expect = xfer_tensor_wire_data_len(&treq->meta);
    uint32_t chunk  = treq->ch->peer.rdma_chunk;
    uint64_t last   = xfer_verbs_wire_last_chunk(expect, chunk);
    xfer_status_t status;

    if ((treq->meta.flags & XFER_TENSOR_META_NONE) || (in->byte_len != last)) {
        xfer_log(XFER_LOG_WARN, XFER_VERBS_SUBSYS, "tensor '%s': the producer's write ended "
                 "with a chunk of %" PRIu32 " bytes where a %" PRIu64 "-byte tensor in chunks "
                 "of %" PRIu32 " ends with %" PRIu64 "%s", treq->key, in->byte_len, expect,
                 chunk, last,
                 (treq->meta.flags & XFER_TENSOR_META_NONE) ? " (no metadata known)" : "");
        treq_complete(treq, XFER_ERR_PROTOCOL, 0);
    } else if ((expect > 0) && xfer_verbs_memh_on_gpu(treq->memh) &&
               ((status = treq->ch->iface->devmem->landed(treq->ch->iface, treq->memh,
                                                          treq->buf, (size_t)expect)) !=
                XFER_OK)) {
        /* the tensor is in GPU memory but not yet known to be visible there */
        treq_complete(treq, status, 0);
    } else {
        treq->ch->stats.rx_write_bytes += expect;
        if (treq->buf != NULL) {
            XFER_VERBS_DEVICE_WROTE(treq->buf, (expect < treq->capacity) ? expect :
                                               treq->capacity);
        }
        xfer_tensor_wire_meta_to(&treq->meta, treq->op->result);
        treq->op->result->data = treq->buf;
        treq_complete(treq, XFER_OK, (size_t)expect);
    }
    treq_free(treq);
}

static void on_error(xfer_verbs_treq_t *treq, const treq_input_t *in)
{
    char reason[XFER_TENSOR_WIRE_MAX_REASON + 1];
    char why[XFER_REASON_MAX];
    xfer_tensor_wire_err_t err;
    xfer_status_t status = (xfer_status_t)in->hdr->status;

    if (xfer_tensor_wire_unpack_err(in->ext, in->hdr->length, in->hdr->status, &err, why,
                                    sizeof(why)) != XFER_OK) {
        xfer_log(XFER_LOG_WARN, XFER_VERBS_SUBSYS, "tensor '%s': bad ERROR_STATUS: %s",
                 treq->key, why);
        status = XFER_ERR_PROTOCOL;
    } else {
        xfer_reason_copy(reason, sizeof(reason), err.reason, err.reason_len);
        xfer_log_at(XFER_LOG_DEBUG, XFER_VERBS_SUBSYS, "fetch of '%s' (step %" PRIu64 ") "
                    "failed at the producer: %s (%s)", treq->key, treq->step, reason,
                    xfer_status_string(status));
    }
    treq_complete(treq, status, 0);
    treq_free(treq);
}

static void on_meta(xfer_verbs_treq_t *treq, const treq_input_t *in)
{
    xfer_ep_h ch              = treq->ch;
    xfer_verbs_wire_hdr_t hdr = {.type = XFER_VERBS_MSG_TENSOR_RE_REQUEST, .id = treq->idx};
    xfer_tensor_wire_rereq_t rr;
    uint8_t ext[XFER_TENSOR_WIRE_REREQ_LEN];
    char why[XFER_REASON_MAX];
    xfer_tensor_wire_meta_t meta;
    xfer_status_t status;
    uint64_t addr = treq->addr;
    uint64_t need;

    /* the producer writes nothing before the re-request: a failure here completes at once */
    treq->addr = 0;
    status = xfer_tensor_wire_unpack_meta(in->ext, in->hdr->length, &meta, why, sizeof(why));
    if ((status == XFER_OK) && (meta.flags & XFER_TENSOR_META_NONE)) {
        snprintf(why, sizeof(why), "META_DATA_UPDATE without metadata");
        status = XFER_ERR_PROTOCOL;
    }
    if (status != XFER_OK) {
        xfer_log(XFER_LOG_WARN, XFER_VERBS_SUBSYS, "tensor '%s': %s", treq->key, why);
        treq_withdraw(treq, XFER_ERR_PROTOCOL, why);
        return;
    }
    xfer_meta_cache_store(ch->meta_cache, treq->key, &meta);
    treq->meta = meta;
    need       = xfer_tensor_wire_data_len(&meta);
    if (treq->alloc != NULL) {
        xfer_tensor_t t;
        void *buf;

        xfer_tensor_wire_meta_to(&meta, &t);
        buf = treq->alloc(treq->alloc_arg, &t);
        if (buf == NULL) {
            treq_withdraw(treq, XFER_ERR_NO_MEMORY, "the consumer's allocation failed");
            return;
        }
        status = dest_set(treq, buf, (size_t)need);
    } else if (need > treq->capacity) {
        snprintf(why, sizeof(why), "a %" PRIu64 "-byte tensor does not fit the consumer's "
                 "%zu bytes", need, treq->capacity);
        treq_withdraw(treq, XFER_ERR_TRUNCATED, why);
        return;
    } else {
        treq->addr = addr;  /* the caller's buffer still */
    }
    if (status != XFER_OK) {
        treq->addr = 0;
        treq_withdraw(treq, status, "the consumer cannot register its destination");
        return;
    }
    rr.addr  = treq->addr;
    rr.rkey  = treq->rkey;
    hdr.size = treq->capacity;
    xfer_tensor_wire_pack_rereq(&rr, ext);
    if (xfer_verbs_ch_send_ctrl(ch, &hdr, ext, sizeof(ext), NULL, 0) != XFER_OK) {
        return;     /* the channel failed: its teardown completes the fetch */
    }
    ch->stats.rerequests++;
    treq->state = XFER_VERBS_TREQ_RE_REQUESTED;
}

static void on_meta_twice(xfer_verbs_treq_t *treq, const treq_input_t *in)
{
    (void)in;
    xfer_log(XFER_LOG_WARN, XFER_VERBS_SUBSYS, "tensor '%s': a second META_DATA_UPDATE after "
             "the re-request", treq->key);
    treq_withdraw(treq, XFER_ERR_PROTOCOL, "META_DATA_UPDATE after TENSOR_RE_REQUEST");
}

static void on_withdrawn_end(xfer_verbs_treq_t *treq, const treq_input_t *in)
{
    (void)in;
    treq_complete(treq, treq->end_status, 0);
    treq_free(treq);
}

static void on_ignore(xfer_verbs_treq_t *treq, const treq_input_t *in)
{
    (void)treq;
    (void)in;
}

/* ---- entry points from the channel --------------------------------------------------------- */

void xfer_verbs_treq_write_arrived(xfer_ep_h ch, uint32_t idx, uint32_t byte_len)
{
    treq_input_t in = {.byte_len = byte_len};

    treq_event(ch, idx, TREQ_EV_WRITE, &in);
}

xfer_status_t xfer_verbs_treq_rx(xfer_ep_h ch, const xfer_verbs_wire_hdr_t *hdr,
                                 const uint8_t *ext, char *why, size_t why_size)
{
    treq_input_t in = {.hdr = hdr, .ext = ext};

    if (hdr->id > UINT32_MAX) {
        snprintf(why, why_size, "%s for request index 0x%" PRIx64 " (wider than 32 bits)",
                 xfer_verbs_msg_name(hdr->type), hdr->id);
        return XFER_ERR_PROTOCOL;
    }
    treq_event(ch, (uint32_t)hdr->id,
               (hdr->type == XFER_VERBS_MSG_META_DATA_UPDATE) ? TREQ_EV_META : TREQ_EV_ERROR,
               &in);
    return XFER_OK;
}
