/*
 * The shm interface: its epoll set (the endpoints' doorbell connections), progress, sleeping
 * and completions, and whether a peer is on this host.
 *
 * progress() polls the rings of the watched endpoints directly (shm_act.c: those with work
 * lately, and those the activity map names) - shared memory needs no system call to be
 * read - and asks epoll only now and then (every EPOLL_EVERY calls, and after a sleep): for the
 * doorbell bytes of a peer that woke us and for the end of a peer's connection.
 */
#include "shm.h"

#include <limits.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#define EPOLL_BATCH 16
#define EPOLL_EVERY 64

/* One op per receive, put, get and large send: from a pool, not malloc; one with more than
 * XFER_SHM_OP_POOL_EXTRA bytes of payload (a long notification) on its own. */
static const xfer_iface_base_desc_t base_desc = {
    .subsys       = XFER_SHM_SUBSYS,
    .fail_ops     = &xfer_shm_ep_fail_ops,
    .op_size      = sizeof(xfer_shm_op_t),
    .op_extra     = XFER_SHM_OP_POOL_EXTRA,
    .op_pool_name = "xfer_shm_ops",
    .answer_size  = sizeof(xfer_shm_answer_t),
    .answer       = xfer_shm_tensor_answer,
    .regions      = 1,
};

xfer_status_t xfer_shm_iface_open(const void *config, const xfer_iface_params_t *params,
                                  xfer_iface_h *iface_p)
{
    const xfer_shm_config_t *cfg = config;
    char why[XFER_REASON_MAX], cma_why[XFER_REASON_MAX];
    xfer_iface_h iface;
    xfer_status_t status;
    int cma;

    status = XFER_IFACE_ALLOC(cfg, params, iface_p, iface);
    if (status != XFER_OK) {
        return status;
    }
    ucs_list_head_init(&iface->eps);
    ucs_list_head_init(&iface->batches);
    ucs_list_head_init(&iface->batch_work);
    ucs_list_head_init(&iface->pulls);
    ucs_list_head_init(&iface->cuda.opened);
    iface->cuda.primary = -1;

    cma    = xfer_shm_cma_allowed(cfg, cma_why, sizeof(cma_why));
    status = xfer_shm_host_id(&iface->me, cma, why, sizeof(why));
    if (status != XFER_OK) {
        xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "cannot open: %s", why);
        free(iface);
        return status;
    }
    xfer_log(XFER_LOG_DEBUG, XFER_SHM_SUBSYS, "%s", cma_why);
    status = xfer_iface_base_open(&iface->base, &base_desc, params);
    if (status != XFER_OK) {
        free(iface);
        return status;
    }
    xfer_shm_act_open(iface);
    *iface_p = iface;
    return XFER_OK;
}

void xfer_shm_iface_close(xfer_iface_h iface)
{
    if (iface == NULL) {
        return;
    }
    while (!ucs_list_is_empty(&iface->eps)) {
        xfer_shm_ep_destroy(ucs_list_head(&iface->eps, struct xfer_ep, list));
    }
    xfer_shm_cuda_cleanup(iface);
    xfer_shm_act_close(iface);
    xfer_iface_base_close(&iface->base);
    free(iface);
}

xfer_status_t xfer_shm_iface_address(xfer_iface_h iface, void *buf, size_t *len_p)
{
    if (!xfer_out_room(buf, len_p, XFER_SHM_IFACE_ADDR_LEN)) {
        return XFER_ERR_NO_RESOURCE;
    }
    iface->me.pid = (uint32_t)getpid();
    xfer_shm_host_id_pack(&iface->me, buf);
    return XFER_OK;
}

int xfer_shm_iface_reachable(xfer_iface_h iface, const void *peer_addr, size_t len, char *why,
                             size_t why_size)
{
    xfer_shm_host_id_t peer;

    if (xfer_shm_host_id_unpack(peer_addr, len, &peer, why, why_size) != XFER_OK) {
        return 0;
    }
    return xfer_shm_host_reachable(iface, &peer, why, why_size);
}

int xfer_shm_host_reachable(xfer_iface_h iface, const xfer_shm_host_id_t *peer, char *why,
                            size_t why_size)
{
    if (memcmp(peer->boot_id, iface->me.boot_id, sizeof(peer->boot_id)) != 0) {
        snprintf(why, why_size, "the peer is on another host (its boot id differs)");
        return 0;
    }
    if (peer->pid_ns != iface->me.pid_ns) {
        snprintf(why, why_size, "the peer is in another pid namespace (a container): its "
                 "pid and /proc/<pid> mean nothing here");
        return 0;
    }
    if (peer->mnt_ns != iface->me.mnt_ns) {
        snprintf(why, why_size, "the peer is in another mount namespace: its /proc is not "
                 "ours");
        return 0;
    }
    if (peer->uid != iface->me.uid) {
        snprintf(why, why_size, "the peer runs as another user (uid %u, we are %u): its "
                 "memory may not be opened", peer->uid, iface->me.uid);
        return 0;
    }
    return 1;
}

xfer_shm_op_t *xfer_shm_op_new(xfer_iface_h iface, xfer_ep_h ep, xfer_shm_op_kind_t kind,
                               xfer_comp_t *comp, size_t extra)
{
    xfer_shm_op_t *op = xfer_op_get(iface->base.ops, sizeof(xfer_shm_op_t), extra, comp, ep);

    if (op != NULL) {
        op->kind  = kind;
        op->iface = iface;
        op->ep    = ep;
        op->slot  = UINT32_MAX;
        op->tx.op       = op;
        op->tx.embedded = 1;
    }
    return op;
}

void xfer_shm_op_complete(xfer_shm_op_t *op, xfer_status_t status, size_t length, uint64_t tag)
{
    xfer_op_complete(op->iface->base.ops, op, status, length, tag);
    /* a flush waiting for this put, get or batch completes after it */
    if ((op->serial != 0) && (op->ep != NULL)) {
        xfer_flushes_answered(&op->ep->flushes, op->serial);
        xfer_shm_ep_flushes_check(op->ep);
    }
}

static unsigned epoll_progress(xfer_iface_h iface)
{
    struct epoll_event events[EPOLL_BATCH];
    int num = epoll_wait(iface->base.epfd, events, EPOLL_BATCH, 0);

    if ((num < 0) && (errno != EINTR)) {
        xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "epoll_wait: %s", strerror(errno));
    }
    for (int i = 0; i < num; i++) {
        xfer_shm_ep_doorbell(events[i].data.ptr);
    }
    return (num > 0) ? (unsigned)num : 0;
}

unsigned xfer_shm_iface_progress(xfer_iface_h iface)
{
    unsigned count = 0;
    xfer_ep_h ep, tmp;

    count += xfer_ep_failq_progress(&iface->base.failq);
    if (iface->slept || (++iface->polls >= EPOLL_EVERY)) {
        if (iface->slept) {
            xfer_shm_act_disarm(iface);
        }
        iface->slept = 0;
        iface->polls = 0;
        count       += epoll_progress(iface);
    }
    xfer_shm_act_collect(iface);
    /* the watched endpoints only: those with work lately, and those the map named now */
    ucs_list_for_each_safe(ep, tmp, &iface->act.watched, watch_link) {
        int work = 0;

        if (ep->fail.state == XFER_EP_CONNECTED) {
            if (!ucs_list_is_empty(&ep->txq)) {
                int written = xfer_shm_tx_write(ep);

                count += (written > 0) ? (unsigned)written : 0;
                work   = 1;
            }
            /* an empty ring costs one load here, not a round of the input loop */
            if (xfer_shm_ring_ready(&ep->in) || !ucs_list_is_empty(&ep->txq)) {
                count += xfer_shm_ep_rx_progress(ep);
                work   = 1;
            }
            if ((ep->coop_busy > 0) && (ep->fail.state == XFER_EP_CONNECTED)) {
                count += xfer_shm_coop_check(ep);
                work   = 1;
            }
            work |= ep->rx_more;
        }
        if (work && (ep->fail.state == XFER_EP_CONNECTED)) {
            ep->idle = 0;
        } else {
            (void)xfer_shm_ep_idle(ep);
        }
    }

    if (!ucs_list_is_empty(&iface->batch_work)) {
        count += xfer_shm_batch_work(iface) + 1;
    }
    if (!ucs_list_is_empty(&iface->pulls)) {
        count += xfer_shm_pulls_progress(iface);
    }

    return count + xfer_iface_deliver(&iface->base, &iface->params, 0);
}

int xfer_shm_iface_event_fd(xfer_iface_h iface)
{
    return iface ? iface->base.epfd : -1;
}

xfer_status_t xfer_shm_iface_event_arm(xfer_iface_h iface)
{
    xfer_ep_h ep;

    if (xfer_op_queued(iface->base.ops) || xfer_tanswers_pending(iface->base.tanswers) ||
        xfer_ep_failq_busy(&iface->base.failq) ||
        !ucs_list_is_empty(&iface->batch_work) || !ucs_list_is_empty(&iface->pulls)) {
        return XFER_ERR_BUSY;
    }
    ucs_list_for_each(ep, &iface->act.watched, watch_link) {
        if (ep->fail.state != XFER_EP_CONNECTED) {
            continue;
        }
        /* input that waits for a receive or for room does not keep us awake; a frame whose
         * work goes on in slices does */
        if ((!xfer_shm_ring_arm(&ep->in) && !ep->rx_paused) || ep->rx_more) {
            return XFER_ERR_BUSY;
        }
        if (!ucs_list_is_empty(&ep->txq) && !xfer_shm_ring_wait_room(&ep->out)) {
            return XFER_ERR_BUSY;
        }
        /* armed above: a target finishing its parts of a shared put from now on rings */
        if ((ep->coop_busy > 0) && xfer_shm_coop_ready(ep)) {
            return XFER_ERR_BUSY;
        }
    }
    /* the endpoints not watched have an empty ring and nothing to send (xfer_shm_ep_idle):
     * a frame to one of them sets a bit, which the armed map makes ring the doorbell */
    if (!xfer_shm_act_arm(iface)) {
        xfer_shm_act_disarm(iface);
        return XFER_ERR_BUSY;
    }
    iface->slept = 1;
    return XFER_OK;
}
