/*
 * The adapter's completion queues: the channels' QPs complete into them, more than one when a
 * device's largest CQ cannot hold every channel's entries (a CQ overrun is a fatal
 * asynchronous error, so every channel reserves room for its queues before it has a QP).
 *
 * Progress polls the hot CQs and one cold CQ in turn (xfer_verbs_cq_poll_turns says how);
 * sleeping arms every CQ on the iface's completion channel and polls each once more (the race
 * the seeds describe: a completion between the last poll and the request raises no event).
 */
#include "verbs.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* One more CQ of len entries (at most the device's), on the iface's completion channel. */
xfer_status_t xfer_verbs_cq_add(xfer_iface_h iface, int len)
{
    xfer_verbs_cq_t *c = &iface->cqs[iface->num_cqs];

    if (len > iface->dev_attr.max_cqe) {
        len = iface->dev_attr.max_cqe;
    }
    c->cq = ibv_create_cq(iface->ctx, len, iface, iface->comp_channel, 0);
    if (c->cq == NULL) {
        xfer_log(XFER_LOG_ERROR, XFER_VERBS_SUBSYS, "%s: ibv_create_cq(%d): %s",
                 iface->dev_name, len, strerror(errno));
        return XFER_ERR_NO_RESOURCE;
    }
    c->len       = c->cq->cqe;
    c->committed = 0;
    c->armed     = 0;
    c->idle      = 0;
    iface->num_cqs++;
    return XFER_OK;
}

void xfer_verbs_cq_destroy_all(xfer_iface_h iface)
{
    for (unsigned i = 0; i < iface->num_cqs; i++) {
        ibv_destroy_cq(iface->cqs[i].cq);
    }
    iface->num_cqs = 0;
}

xfer_status_t xfer_verbs_cq_reserve(xfer_iface_h iface, int n, unsigned *idx_p)
{
    for (unsigned i = 0; i < iface->num_cqs; i++) {
        xfer_verbs_cq_t *c = &iface->cqs[i];
        int want           = c->committed + n;

        if (want > c->len) {
            int size = c->len;

            while (size < want) {
                size *= 2;
            }
            if (size > iface->dev_attr.max_cqe) {
                size = iface->dev_attr.max_cqe;
            }
            if ((size < want) || (ibv_resize_cq(c->cq, size) != 0)) {
                continue;   /* full: another CQ */
            }
            c->len = c->cq->cqe;
        }
        c->committed = want;
        *idx_p       = i;
        return XFER_OK;
    }
    /* every CQ is full and at the device's largest: one more, of the configured size */
    if ((iface->num_cqs == XFER_VERBS_CQS_MAX) ||
        (xfer_verbs_cq_add(iface, ((int)iface->cfg->cq_size > n) ? (int)iface->cfg->cq_size : n) !=
         XFER_OK)) {
        xfer_log(XFER_LOG_ERROR, XFER_VERBS_SUBSYS, "%s: no completion queue can take another "
                 "channel's %d entries (%u queues of at most %d, the device's limit)",
                 iface->dev_name, n, iface->num_cqs, iface->dev_attr.max_cqe);
        return XFER_ERR_NO_RESOURCE;
    }
    iface->cqs[iface->num_cqs - 1].committed = n;
    *idx_p = iface->num_cqs - 1;
    return XFER_OK;
}

void xfer_verbs_cq_release(xfer_iface_h iface, unsigned idx, int n)
{
    iface->cqs[idx].committed -= n;
}

static void wc_dispatch(xfer_iface_h iface, const struct ibv_wc *wc)
{
    xfer_ep_h ch = xfer_verbs_channel_find(iface, (uint32_t)(wc->wr_id >> 32));

    if (ch != NULL) {
        xfer_verbs_ch_handle_wc(ch, wc);
    }   /* else: a channel destroyed since; its completions mean nothing now */
}

unsigned xfer_verbs_cq_poll_one(xfer_iface_h iface, unsigned k)
{
    struct ibv_wc wc[XFER_VERBS_CQ_BATCH];
    unsigned got = 0;
    int n;

    do {
        n = ibv_poll_cq(iface->cqs[k].cq, XFER_VERBS_CQ_BATCH, wc);
        for (int i = 0; i < n; i++) {
            wc_dispatch(iface, &wc[i]);
        }
        got += (n > 0) ? (unsigned)n : 0;
    } while ((n == XFER_VERBS_CQ_BATCH) && (got < 8 * XFER_VERBS_CQ_BATCH));
    if (n < 0) {
        xfer_log(XFER_LOG_ERROR, XFER_VERBS_SUBSYS, "%s: ibv_poll_cq failed (%d)",
                 iface->dev_name, n);
    }
    return got;
}

/*
 * One call polls the hot CQs - those posted to, or with completions, lately - and one cold CQ
 * in turn, so that its cost follows the active channels, not the number of CQs a thousand
 * connected peers need (rxe: one CQ per 85 channels). A completion on a cold CQ (a message
 * from a peer that was quiet) is seen within num_cqs calls, and the CQ turns hot; one that was
 * idle for XFER_VERBS_CQ_HOT_IDLE polls turns cold again. One CQ and nothing kept back by
 * xfer_verbs_cq_arm is polled directly (xfer_verbs_cq_poll, inline in verbs.h).
 */
unsigned xfer_verbs_cq_poll_turns(xfer_iface_h iface)
{
    unsigned count = 0;
    unsigned cold  = iface->cq_next;
    uint64_t hot   = iface->cq_hot;   /* as it was before this call's cold poll */

    if (iface->backlog_len > 0) {
        int len = iface->backlog_len;

        iface->backlog_len = 0;
        for (int i = 0; i < len; i++) {
            wc_dispatch(iface, &iface->backlog[i]);
        }
        count += (unsigned)len;
    }
    if (iface->num_cqs == 1) {
        return count + xfer_verbs_cq_poll_one(iface, 0);
    }
    if (++iface->cq_next >= iface->num_cqs) {
        iface->cq_next = 0;
    }
    if (!(hot & (UINT64_C(1) << cold))) {
        unsigned got = xfer_verbs_cq_poll_one(iface, cold);

        if (got > 0) {
            iface->cqs[cold].idle = 0;
            xfer_verbs_cq_touch(iface, cold);
            count += got;
        }
    }
    for (; hot != 0; hot &= hot - 1) {
        unsigned k   = (unsigned)__builtin_ctzll(hot);
        unsigned got = xfer_verbs_cq_poll_one(iface, k);

        if (got > 0) {
            iface->cqs[k].idle = 0;
            count += got;
        } else if (++iface->cqs[k].idle >= XFER_VERBS_CQ_HOT_IDLE) {
            iface->cqs[k].idle = 0;
            iface->cq_hot &= ~(UINT64_C(1) << k);
        }
    }
    return count;
}

void xfer_verbs_cq_events_drain(xfer_iface_h iface)
{
    struct ibv_cq *cq;
    void *ctx;

    while (ibv_get_cq_event(iface->comp_channel, &cq, &ctx) == 0) {
        ibv_ack_cq_events(cq, 1);
        for (unsigned k = 0; k < iface->num_cqs; k++) {
            if (iface->cqs[k].cq == cq) {
                iface->cqs[k].armed = 0;
                xfer_verbs_cq_touch(iface, k);   /* its completions: look at once */
            }
        }
    }
}

/*
 * Ask every CQ for an event at its next completion, then poll each once more: a completion
 * that arrived between the last poll and the request raises no event. XFER_ERR_BUSY when one
 * was found (kept in iface->backlog for the next poll) or a CQ cannot be armed.
 */
xfer_status_t xfer_verbs_cq_arm(xfer_iface_h iface)
{
    int n;

    xfer_verbs_cq_events_drain(iface);
    for (unsigned k = 0; k < iface->num_cqs; k++) {
        xfer_verbs_cq_t *c = &iface->cqs[k];

        if (!c->armed) {
            if (ibv_req_notify_cq(c->cq, 0) != 0) {
                return XFER_ERR_BUSY;   /* cannot sleep on it: keep polling */
            }
            c->armed = 1;
        }
        /* a completion that came before the request raises no event: look once more */
        n = ibv_poll_cq(c->cq, XFER_VERBS_CQ_BATCH, iface->backlog);
        if (n > 0) {
            iface->backlog_len = n;
            xfer_verbs_cq_touch(iface, k);
            return XFER_ERR_BUSY;
        }
    }
    return XFER_OK;
}
