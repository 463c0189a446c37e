/*
 * Tag matching, one engine for every transport (as libfabric's util_srx serves its
 * providers). The context owns the receives the application posts - for one endpoint, or for
 * any peer of any transport - and the messages that arrived before a receive for them (the
 * unexpected queue). A transport hands each arriving message's header to xfer_tag_arrive()
 * and learns where its data goes: a posted receive's buffer (tcp reads the socket straight
 * into it), a buffer of the message's length that holds it until a receive comes, or "not
 * now" at the bounds (the transport stops reading that peer until tag_resume). A message
 * whose data stays at the sender until it is pulled (rendezvous: shm by CMA, verbs by RDMA
 * READ) is kept as the transport's description of it; the receive that takes it asks the
 * transport to pull it (tag_pull). Either way the transport says xfer_tag_done() when the
 * data is in.
 *
 * Matching: (msg_tag & mask) == (tag & mask), the receive for any peer or for the message's
 * endpoint. An arriving message takes the earliest posted receive that matches it; a new
 * receive the earliest arrived message that matches it - one still arriving too, which it
 * then waits for. A peer's messages arrive in order on its one transport, so they match in
 * the order they were sent, and a receive from any peer takes the first message of any.
 *
 * Bounds: a kept message counts its bytes (none for a rendezvous one) and 64 of bookkeeping
 * against its endpoint's XFER_UNEXPECTED_EP and its fair share of the process's
 * XFER_UNEXPECTED_BUDGET (budget.c). Past them the transport pauses that peer; one whose
 * peer waits for answers behind the message (URGENT) may go to twice its endpoint's bound;
 * one that must keep it (FORCE: its data is in already, or the peer is gone and what is left
 * is bounded by the transport's buffers) keeps it and learns that it went over, so that it
 * slows the peer down otherwise (verbs holds the message's credit); one whose data can stay
 * where it arrived (INPLACE: a verbs receive slot) is then kept there, as a rendezvous one,
 * so that what is past the bounds holds no memory beyond the transport's own buffers.
 *
 * Buffers of kept messages from 64 KiB on are kept when freed, the most recent first, up to
 * XFER_UNEXPECTED_EP bytes in all, and taken again by a message they fit without wasting a
 * quarter: a receiver that falls behind a stream of large messages takes every one as
 * unexpected, and a fresh buffer that large faults in every page as it is filled (tcp
 * tag_bw 1 MiB ran at a third of its speed so).
 */
#include "xfer_int.h"
#include "staging.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define TM_SUBSYS       "tag"
#define TM_OVERHEAD     64u             /* what a kept message counts beyond its bytes */
#define TM_KEEP_MIN     (64u << 10)     /* buffers kept when freed from this size on */
#define TM_UNEXP_TAG    1u              /* a handle's low bit: an unexpected entry */

typedef struct tm_unexp {
    ucs_list_link_t  list;              /* tm.unexp in arrival order, or tm.kept */
    xfer_endpoint_t  *ep;
    uint64_t         tag;
    uint64_t         length;
    uint64_t         cost;              /* counted against the bounds */
    int              complete;          /* every byte is in (a rendezvous one: at once) */
    int              rndv;
    int              budgeted;          /* its cost is taken from the process's budget */
    int              notify;            /* tell the transport when it goes (tag_released) */
    int              over;              /* kept past the bounds (FORCE) */
    xfer_request_t   *recv;             /* a receive bound to it while it arrives */
    size_t           capacity;          /* bytes of data[] */
    size_t           priv_len;
    uint8_t          priv[XFER_TAG_PRIV_MAX];
    uint8_t          data[];
} tm_unexp_t;

static int tag_matches(uint64_t msg_tag, uint64_t tag, uint64_t mask)
{
    return ((msg_tag ^ tag) & mask) == 0;
}

static void *unexp_handle(tm_unexp_t *ue)
{
    return (void*)((uintptr_t)ue | TM_UNEXP_TAG);
}

void xfer_tm_init(xfer_context_t *ctx)
{
    ucs_list_head_init(&ctx->tm.posted);
    ucs_list_head_init(&ctx->tm.unexp);
    ucs_list_head_init(&ctx->tm.kept);
}

/* ---- kept messages -------------------------------------------------------------------------- */

static tm_unexp_t *unexp_alloc(xfer_context_t *ctx, uint64_t len)
{
    tm_unexp_t *ue, *best = NULL;
    size_t cap = (size_t)len;

    if (len >= TM_KEEP_MIN) {
        ucs_list_for_each(ue, &ctx->tm.kept, list) {
            if ((ue->capacity >= len) && (ue->capacity - len <= len / 4) &&
                ((best == NULL) || (ue->capacity < best->capacity))) {
                best = ue;
            }
        }
        if (best != NULL) {
            ucs_list_del(&best->list);
            ctx->tm.kept_bytes -= best->capacity;
            return best;
        }
        cap = (size_t)((len + 4095) & ~(uint64_t)4095);
    }
    ue = malloc(sizeof(*ue) + cap);
    if (ue != NULL) {
        ue->capacity = cap;
    }
    return ue;
}

static void unexp_free(xfer_context_t *ctx, tm_unexp_t *ue)
{
    uint64_t keep = ctx->fw_config.unexpected_ep;

    if ((ue->capacity < TM_KEEP_MIN) || (ue->capacity > keep)) {
        free(ue);
        return;
    }
    ucs_list_add_head(&ctx->tm.kept, &ue->list);
    ctx->tm.kept_bytes += ue->capacity;
    while (ctx->tm.kept_bytes > keep) {
        tm_unexp_t *old = ucs_list_tail(&ctx->tm.kept, tm_unexp_t, list);

        ucs_list_del(&old->list);
        ctx->tm.kept_bytes -= old->capacity;
        free(old);
    }
}

/* Room was made: the transports read the peers they paused again. */
static void resume_paused(xfer_context_t *ctx)
{
    if (!ctx->tm.paused) {
        return;
    }
    ctx->tm.paused = 0;
    xfer_progress_hook_del(ctx, &ctx->tm.hook);
    for (unsigned i = 0; i < ctx->num_ifaces; i++) {
        xfer_tag_resume_func_t resume = xfer_component_tag_resume(ctx->ifaces[i].comp);

        if (resume != NULL) {
            resume(ctx->ifaces[i].iface);
        }
    }
}

/* ue leaves the queue (received, or dropped with its endpoint when received is -1). */
static void unexp_release(xfer_context_t *ctx, tm_unexp_t *ue, int received)
{
    xfer_endpoint_t *ep = ue->ep;

    ucs_list_del(&ue->list);
    ep->unexp_bytes -= ue->cost;
    if (ue->budgeted) {
        xfer_budget_give(ep, XFER_BUDGET_UNEXPECTED, ue->cost);
    }
    if (ue->notify && ue->over && (received >= 0)) {
        xfer_tag_released_func_t released = xfer_component_tag_released(ep->fw_iface->comp);

        if (released != NULL) {
            released(ep->ep, ue->priv, ue->priv_len, received);
        }
    }
    unexp_free(ctx, ue);
    resume_paused(ctx);
}

/* May ep keep cost more bytes of messages nobody received? Within its bound and its share of
 * the process's budget (taken when it fits); an URGENT one to twice its bound. */
static int unexp_room(xfer_endpoint_t *ep, uint64_t cost, unsigned flags, int *budgeted_p)
{
    uint64_t bound = ep->ctx->fw_config.unexpected_ep;

    if (flags & XFER_TAG_ARRIVE_URGENT) {
        bound *= 2;
    }
    *budgeted_p = 0;
    if ((ep->unexp_bytes + cost > bound) ||
        !xfer_budget_take(ep, XFER_BUDGET_UNEXPECTED, cost)) {
        return 0;
    }
    *budgeted_p = 1;
    return 1;
}

/* ---- completing a receive ------------------------------------------------------------------- */

/* The receive req took a message of length bytes under tag: its status is the transport's,
 * or XFER_ERR_TRUNCATED when the message was longer than its buffer. */
static void recv_complete(xfer_request_t *req, xfer_status_t status)
{
    if ((status == XFER_OK) && (req->msg_len > req->recv_cap)) {
        status = XFER_ERR_TRUNCATED;
    }
    xfer_request_complete(req, status, (size_t)req->msg_len, req->msg_tag);
}

static xfer_memh_h recv_memh(const xfer_request_t *req, const xfer_fw_iface_t *fi)
{
    return (req->recv_mem != NULL) ? req->recv_mem->memh[fi->index] : NULL;
}

/* A kept message meets its receive: its data is copied there (by its transport where that
 * buffer needs it, device memory), or pulled from the sender. */
static void unexp_deliver(xfer_context_t *ctx, tm_unexp_t *ue, xfer_request_t *req)
{
    xfer_endpoint_t *ep   = ue->ep;
    xfer_fw_iface_t *fi   = ep->fw_iface;
    size_t n              = (ue->length < req->recv_cap) ? (size_t)ue->length : req->recv_cap;
    xfer_status_t status  = XFER_OK;

    req->msg_len  = ue->length;
    req->msg_tag  = ue->tag;
    req->recv_ep  = ep;
    if (ue->rndv) {
        xfer_tag_pull_func_t pull = xfer_component_tag_pull(fi->comp);

        req->recv_busy = 1;
        status = (pull == NULL) ? XFER_ERR_INTERNAL :
                 pull(ep->ep, ue->priv, ue->priv_len, ue->length, req->recv_buf,
                      req->recv_cap, recv_memh(req, fi), req);
        unexp_release(ctx, ue, 1);
        if (status != XFER_INPROGRESS) {
            recv_complete(req, status);
        }
        return;
    }
    if (n > 0) {
        xfer_tag_copy_func_t copy = xfer_component_tag_copy(fi->comp);

        if (copy != NULL) {
            status = copy(ep->ep, req->recv_buf, recv_memh(req, fi), ue->data, n);
        } else {
            memcpy(req->recv_buf, ue->data, n);
        }
    }
    unexp_release(ctx, ue, 1);
    recv_complete(req, status);
}

/* ---- the transports' side ------------------------------------------------------------------- */

/* A message no receive takes: kept, within the bounds, until one comes (xfer_tag_arrive).
 * Out of line, so that a message a receive waits for - every message of a ping-pong - pays
 * for none of it. */
static int __attribute__((noinline))
arrive_unexpected(xfer_context_t *ctx, xfer_endpoint_t *ep, uint64_t tag, uint64_t length,
                  unsigned flags, const void *priv, size_t priv_len, xfer_tag_dest_t *dest)
{
    int rndv = (flags & XFER_TAG_ARRIVE_RNDV) != 0;
    uint64_t cost;
    tm_unexp_t *ue;
    int budgeted;

    if (priv_len > XFER_TAG_PRIV_MAX) {
        xfer_log(XFER_LOG_ERROR, TM_SUBSYS, "%s keeps %zu bytes about a message, more than %u",
                 ep->transport, priv_len, XFER_TAG_PRIV_MAX);
        return XFER_TAG_PAUSE;
    }
    cost = (rndv ? 0 : length) + TM_OVERHEAD;
    if (!unexp_room(ep, cost, flags, &budgeted)) {
        if (!(flags & XFER_TAG_ARRIVE_FORCE)) {
            if (!ctx->tm.paused) {
                ctx->tm.paused     = 1;
                ctx->tm.gives_seen = xfer_budget_gives();
                xfer_progress_hook_add(ctx, &ctx->tm.hook, xfer_tm_progress, NULL, NULL);
            }
            return XFER_TAG_PAUSE;
        }
        if (flags & XFER_TAG_ARRIVE_INPLACE) {
            rndv   = 1;        /* it stays in the transport's buffer */
            cost   = TM_OVERHEAD;
            flags |= XFER_TAG_ARRIVE_NOTIFY;
        }
    }
    ue = unexp_alloc(ctx, rndv ? 0 : length);
    if (ue == NULL) {
        if (budgeted) {
            xfer_budget_give(ep, XFER_BUDGET_UNEXPECTED, cost);
        }
        xfer_log(XFER_LOG_ERROR, TM_SUBSYS, "out of memory for a %" PRIu64 "-byte message "
                 "of %s that nobody received yet", length, ep->peer);
        return XFER_TAG_NO_MEMORY;
    }
    ue->ep       = ep;
    ue->tag      = tag;
    ue->length   = length;
    ue->cost     = cost;
    ue->complete = rndv;
    ue->rndv     = rndv;
    ue->budgeted = budgeted;
    ue->notify   = (flags & XFER_TAG_ARRIVE_NOTIFY) != 0;
    ue->over     = !budgeted;
    ue->recv     = NULL;
    ue->priv_len = priv_len;
    if (priv_len > 0) {
        memcpy(ue->priv, priv, priv_len);
    }
    ep->unexp_bytes += cost;
    ucs_list_add_tail(&ctx->tm.unexp, &ue->list);
    dest->buf      = rndv ? NULL : ue->data;
    dest->capacity = rndv ? 0 : (size_t)length;
    dest->memh     = NULL;
    dest->handle   = unexp_handle(ue);
    dest->over     = !budgeted;
    return XFER_TAG_UNEXPECTED;
}

int xfer_tag_arrive(void *fw_arg, void *fw_ep, uint64_t tag, uint64_t length, unsigned flags,
                    const void *priv, size_t priv_len, xfer_tag_dest_t *dest)
{
    xfer_context_t *ctx = fw_arg;
    xfer_endpoint_t *ep = fw_ep;
    xfer_request_t *req;

    ucs_list_for_each(req, &ctx->tm.posted, recv_list) {
        if (((req->recv_ep != NULL) && (req->recv_ep != ep)) ||
            !tag_matches(tag, req->recv_tag, req->recv_mask)) {
            continue;
        }
        ucs_list_del(&req->recv_list);
        req->recv_busy = 1;
        req->recv_ep   = ep;
        req->msg_tag   = tag;
        req->msg_len   = length;
        dest->buf      = req->recv_buf;
        dest->capacity = req->recv_cap;
        dest->memh     = recv_memh(req, ep->fw_iface);
        dest->handle   = req;
        dest->over     = 0;
        return XFER_TAG_MATCHED;
    }
    return arrive_unexpected(ctx, ep, tag, length, flags, priv, priv_len, dest);
}

void xfer_tag_done(void *handle, xfer_status_t status)
{
    tm_unexp_t *ue;
    xfer_request_t *req;

    if (!((uintptr_t)handle & TM_UNEXP_TAG)) {
        req = handle;
        req->recv_busy = 0;
        recv_complete(req, status);
        return;
    }
    ue  = (tm_unexp_t*)((uintptr_t)handle & ~(uintptr_t)TM_UNEXP_TAG);
    req = ue->recv;
    if (status != XFER_OK) {
        /* what arrived of it is lost: a receive that waited for it fails */
        if (req != NULL) {
            req->recv_busy = 0;
            recv_complete(req, status);
        }
        unexp_release(ue->ep->ctx, ue, 0);
        return;
    }
    ue->complete = 1;
    if (req != NULL) {
        ue->recv       = NULL;
        req->recv_busy = 0;
        unexp_deliver(ue->ep->ctx, ue, req);
    }
}

/* ---- the application's side ----------------------------------------------------------------- */

xfer_status_t xfer_tm_post(xfer_context_t *ctx, xfer_endpoint_t *ep, xfer_request_t *req,
                           uint64_t tag, uint64_t mask, void *buf, size_t length,
                           xfer_mem_t *mem)
{
    tm_unexp_t *ue;

    req->recv_ep   = ep;
    req->recv_tag  = tag;
    req->recv_mask = mask;
    req->recv_buf  = buf;
    req->recv_cap  = length;
    req->recv_mem  = mem;
    req->recv_busy = 0;
    ucs_list_for_each(ue, &ctx->tm.unexp, list) {
        if ((ue->recv != NULL) || ((ep != NULL) && (ue->ep != ep)) ||
            !tag_matches(ue->tag, tag, mask)) {
            continue;
        }
        if (ue->complete) {
            unexp_deliver(ctx, ue, req);
        } else {
            ue->recv       = req;       /* it completes when the rest has arrived */
            req->recv_ep   = ue->ep;
            req->recv_busy = 1;
        }
        return XFER_INPROGRESS;
    }
    if ((ep != NULL) && (ep->status != XFER_OK)) {
        return ep->status;      /* nothing it sent before its end matches */
    }
    ucs_list_add_tail(&ctx->tm.posted, &req->recv_list);
    resume_paused(ctx);         /* a message that waited for room may be for it */
    return XFER_INPROGRESS;
}

xfer_status_t xfer_tm_cancel(xfer_request_t *req, xfer_status_t status)
{
    if (req->recv_busy) {
        return XFER_ERR_BUSY;   /* a message is arriving into it */
    }
    ucs_list_del(&req->recv_list);
    ucs_list_head_init(&req->recv_list);
    xfer_request_complete(req, status, 0, 0);
    return XFER_OK;
}

/* The receives for ep alone complete with status: nothing more comes from it. */
static void posted_fail(xfer_context_t *ctx, xfer_endpoint_t *ep, xfer_status_t status)
{
    xfer_request_t *req, *tmp;

    ucs_list_for_each_safe(req, tmp, &ctx->tm.posted, recv_list) {
        if (req->recv_ep == ep) {
            ucs_list_del(&req->recv_list);
            ucs_list_head_init(&req->recv_list);
            xfer_request_complete(req, status, 0, 0);
        }
    }
}

void xfer_tm_ep_failed(xfer_endpoint_t *ep, xfer_status_t status)
{
    posted_fail(ep->ctx, ep, status);
}

void xfer_tm_ep_gone(xfer_endpoint_t *ep)
{
    xfer_context_t *ctx = ep->ctx;
    tm_unexp_t *ue, *tmp;

    posted_fail(ctx, ep, XFER_ERR_CANCELED);
    /* its messages nobody received go with it (its transport's endpoint went already) */
    ucs_list_for_each_safe(ue, tmp, &ctx->tm.unexp, list) {
        if (ue->ep == ep) {
            if (ue->recv != NULL) {
                ue->recv->recv_busy = 0;
                recv_complete(ue->recv, XFER_ERR_CANCELED);
            }
            unexp_release(ctx, ue, -1);
        }
    }
}

unsigned xfer_tm_progress(xfer_context_t *ctx)
{
    /* a budget another context or endpoint gave back: paused peers may fit now */
    if (ctx->tm.paused && (xfer_budget_gives() != ctx->tm.gives_seen)) {
        resume_paused(ctx);
        return 1;
    }
    return 0;
}

void xfer_tm_cleanup(xfer_context_t *ctx)
{
    tm_unexp_t *ue, *tmp;

    ucs_list_for_each_safe(ue, tmp, &ctx->tm.unexp, list) {
        unexp_release(ctx, ue, -1);
    }
    ucs_list_for_each_safe(ue, tmp, &ctx->tm.kept, list) {
        ucs_list_del(&ue->list);
        free(ue);
    }
    ctx->tm.kept_bytes = 0;
}

const xfer_req_ops_t xfer_tm_recv_ops = {NULL, xfer_tm_cancel, NULL};
