/*
 * Tag receives from any peer when several transports carry tagged messages.
 *
 * Each transport matches its own peers' messages against the receives posted to it, in
 * posting order, so a receive from any peer is posted to every tag transport - one sub-receive
 * each, in the user's posting order - and the first transport that binds a message to it wins
 * it: before binding, a transport asks tag_claim(), which answers yes exactly once per
 * receive and then cancels the sub-receives on the other transports. A transport that is told
 * no completes its sub-receive with XFER_ERR_CANCELED and goes on matching, so a message
 * always goes to the earliest posted receive that is still free, and one peer's messages (one
 * peer is on one transport) match in the order they were sent.
 *
 * Every posted sub-receive completes exactly once (matched, cancelled, or by its transport
 * closing); the shared state lives until the last has, so no transport ever completes into
 * freed memory. The user's request completes with the winner's outcome, or - when there is no
 * winner - once every sub-receive has ended (cancelled, or its transport closed).
 */
#include "xfer_int.h"

#include <stdlib.h>

#define TAG_ANY_SUBSYS "endpoint"

typedef struct tag_any tag_any_t;

typedef struct tag_any_sub {
    xfer_comp_t     comp;       /* what the transport completes */
    tag_any_t       *ta;
    xfer_fw_iface_t *fi;
    int             pending;    /* posted; its completion not seen yet */
} tag_any_sub_t;

struct tag_any {
    xfer_request_t  *req;       /* NULL once the request completed */
    tag_any_sub_t   *winner;    /* the sub-receive a transport claimed */
    int             cancelled;  /* the user cancelled before any claim */
    xfer_status_t   last_error; /* of the sub-receives that ended without a claim */
    unsigned        num, pending;
    tag_any_sub_t   subs[];
};

static void tag_any_release(tag_any_t *ta)
{
    if ((ta->pending == 0) && (ta->req == NULL)) {
        free(ta);
    }
}

static void tag_any_finish(tag_any_t *ta, xfer_status_t status, size_t length, uint64_t tag)
{
    xfer_request_t *req = ta->req;

    ta->req  = NULL;
    req->any = NULL;
    xfer_request_complete(req, status, length, tag);
}

/* Cancel the sub-receives other than keep: their completions (XFER_ERR_CANCELED) come from
 * their transports' progress; a "not found" means the completion is already on its way. */
static void tag_any_cancel_others(tag_any_t *ta, const tag_any_sub_t *keep)
{
    for (unsigned i = 0; i < ta->num; i++) {
        tag_any_sub_t *sub = &ta->subs[i];

        if ((sub != keep) && sub->pending && (sub->fi->comp->cancel != NULL)) {
            (void)sub->fi->comp->cancel(sub->fi->iface, &sub->comp, XFER_ERR_CANCELED);
        }
    }
}

static void sub_done(xfer_comp_t *self, xfer_status_t status, size_t length, uint64_t tag)
{
    tag_any_sub_t *sub = ucs_container_of(self, tag_any_sub_t, comp);
    tag_any_t *ta      = sub->ta;

    if (!sub->pending) {
        xfer_log(XFER_LOG_ERROR, TAG_ANY_SUBSYS, "a receive for any peer was completed twice "
                 "by %s; second completion ignored", sub->fi->entry->name);
        return;
    }
    sub->pending = 0;
    ta->pending--;
    if ((ta->winner == NULL) && !ta->cancelled && (status != XFER_ERR_CANCELED) &&
        (status >= 0)) {
        /* a transport that delivered without claiming: the message is its */
        ta->winner = sub;
        tag_any_cancel_others(ta, sub);
    }
    if (ta->req != NULL) {
        if (sub == ta->winner) {
            tag_any_finish(ta, status, length, tag);
        } else {
            if (status != XFER_ERR_CANCELED) {
                ta->last_error = status;
            }
            if ((ta->pending == 0) && (ta->winner == NULL)) {
                tag_any_finish(ta, ta->cancelled ? XFER_ERR_CANCELED : ta->last_error, 0, 0);
            }
        }
    }
    tag_any_release(ta);
}

int xfer_tag_claim_upcall(void *fw_arg, xfer_comp_t *comp)
{
    tag_any_sub_t *sub;
    tag_any_t *ta;

    (void)fw_arg;
    if (comp->cb != sub_done) {
        return 1;       /* a receive posted to this transport alone */
    }
    sub = ucs_container_of(comp, tag_any_sub_t, comp);
    ta  = sub->ta;
    if (ta->winner != NULL) {
        return ta->winner == sub;
    }
    if (ta->cancelled) {
        return 0;
    }
    ta->winner = sub;
    tag_any_cancel_others(ta, sub);
    return 1;
}

unsigned xfer_tag_ifaces(const xfer_context_t *ctx)
{
    unsigned n = 0;

    for (unsigned i = 0; i < ctx->num_ifaces; i++) {
        n += (ctx->ifaces[i].comp->tag_recv != NULL);
    }
    return n;
}

xfer_status_t xfer_tag_recv_any(xfer_context_t *ctx, xfer_request_t *req, uint64_t tag,
                                uint64_t tag_mask, void *buf, size_t length, xfer_mem_t *mem)
{
    unsigned n          = xfer_tag_ifaces(ctx);
    xfer_status_t first = XFER_ERR_UNSUPPORTED;
    tag_any_t *ta;

    ta = calloc(1, sizeof(*ta) + n * sizeof(ta->subs[0]));
    if (ta == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    ta->req        = req;
    ta->last_error = XFER_ERR_CANCELED;
    req->any       = ta;
    for (unsigned i = 0; (i < ctx->num_ifaces) && (ta->winner == NULL); i++) {
        xfer_fw_iface_t *fi = &ctx->ifaces[i];
        tag_any_sub_t *sub  = &ta->subs[ta->num];
        xfer_status_t status;

        if (fi->comp->tag_recv == NULL) {
            continue;
        }
        sub->comp.cb = sub_done;
        sub->ta      = ta;
        sub->fi      = fi;
        sub->pending = 1;      /* before posting: the transport may claim inside */
        ta->pending++;
        ta->num++;
        status = fi->comp->tag_recv(fi->iface, NULL, tag, tag_mask, buf, length,
                                    (mem != NULL) ? mem->memh[fi->index] : NULL, &sub->comp);
        if ((status != XFER_OK) && (status != XFER_INPROGRESS)) {
            xfer_log(XFER_LOG_DEBUG, TAG_ANY_SUBSYS, "a receive for any peer could not be "
                     "posted to %s: %s", fi->entry->name, xfer_status_string(status));
            sub->pending = 0;
            ta->pending--;
            ta->num--;
            if (first == XFER_ERR_UNSUPPORTED) {
                first = status;
            }
        }
    }
    if (ta->pending == 0) {
        req->any = NULL;
        free(ta);
        return first;
    }
    return XFER_INPROGRESS;
}

xfer_status_t xfer_tag_any_cancel(xfer_request_t *req, xfer_status_t status)
{
    tag_any_t *ta = req->any;
    xfer_status_t ret;

    if (ta->winner != NULL) {
        /* a transport has the message: it says whether it is too late */
        ret = ta->winner->fi->comp->cancel(ta->winner->fi->iface, &ta->winner->comp, status);
        return (ret == XFER_ERR_NOT_FOUND) ? XFER_ERR_BUSY : ret;
    }
    ta->cancelled = 1;
    tag_any_cancel_others(ta, NULL);
    tag_any_finish(ta, status, 0, 0);
    tag_any_release(ta);
    return XFER_OK;
}
