/*
 * The verbs adapter: one opened device port with its protection domain, its completion queues
 * (verbs_cq.c) on one completion channel, and the progress engine.
 *
 * Progress polls the CQs. Sleeping goes through one epoll set holding the completion channel,
 * a timer (keepalive probes of idle channels), the device's asynchronous events (a port that
 * goes down, a QP or CQ in error: rxe may stall a QP whose own port died without completing
 * anything, so only the event tells) and every channel's bootstrap socket (the peer's
 * readiness, and its death: a closed socket is faster than any RDMA timeout). Arming
 * asks for completion events and then polls the CQs once more (verbs_cq.c).
 */
#include "verbs.h"
#include "verbs_devices.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#define PROGRESS_FD_PERIOD 64   /* read the clock every this many progress() calls, */
#define PROGRESS_FD_GAP    1e-3 /* and look at the fds once this many seconds have passed */

/* RoCE: the RoCE v2 GID of an IPv4 address (::ffff:a.b.c.d), else any RoCE v2 GID, else 0.
 * InfiniBand: GID 0. */
static int gid_pick(xfer_iface_h iface)
{
    int v2 = -1;

    if (iface->port_attr.link_layer != IBV_LINK_LAYER_ETHERNET) {
        return 0;
    }
    for (int i = 0; i < iface->port_attr.gid_tbl_len; i++) {
        static const uint8_t v4_prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
        struct ibv_gid_entry entry;

        if ((ibv_query_gid_ex(iface->ctx, iface->port, (uint32_t)i, &entry, 0) != 0) ||
            (entry.gid_type != IBV_GID_TYPE_ROCE_V2)) {
            continue;
        }
        if (memcmp(entry.gid.raw, v4_prefix, sizeof(v4_prefix)) == 0) {
            return i;
        }
        if (v2 < 0) {
            v2 = i;
        }
    }
    return (v2 >= 0) ? v2 : 0;
}

/* Open the first ACTIVE port that XFER_VERBS_DEVICE allows. */
static xfer_status_t port_open(xfer_iface_h iface)
{
    const char *filter = iface->cfg->device;
    struct ibv_device **list;
    int num = 0;
    unsigned seen = 0;

    list = ibv_get_device_list(&num);
    if (list == NULL) {
        xfer_log(XFER_LOG_ERROR, XFER_VERBS_SUBSYS, "ibv_get_device_list: %s", strerror(errno));
        return XFER_ERR_UNAVAILABLE;
    }
    for (int d = 0; (d < num) && (iface->ctx == NULL); d++) {
        const char *name       = ibv_get_device_name(list[d]);
        struct ibv_context *ctx = ibv_open_device(list[d]);

        if (ctx == NULL) {
            continue;
        }
        if (ibv_query_device(ctx, &iface->dev_attr) == 0) {
            for (unsigned p = 1; p <= iface->dev_attr.phys_port_cnt; p++) {
                if (!xfer_verbs_port_matches(filter, name, p) ||
                    (ibv_query_port(ctx, (uint8_t)p, &iface->port_attr) != 0)) {
                    continue;
                }
                seen++;
                if (iface->port_attr.state == IBV_PORT_ACTIVE) {
                    iface->ctx  = ctx;
                    iface->port = (uint8_t)p;
                    snprintf(iface->dev_name, sizeof(iface->dev_name), "%s:%u", name, p);
                    break;
                }
            }
        }
        if (iface->ctx != ctx) {
            ibv_close_device(ctx);
        }
    }
    ibv_free_device_list(list);
    if (iface->ctx == NULL) {
        xfer_log(XFER_LOG_ERROR, XFER_VERBS_SUBSYS, "no ACTIVE RDMA port%s%s (%u matching "
                 "ports seen)", *filter ? " matches XFER_VERBS_DEVICE=" : "", filter, seen);
        return XFER_ERR_UNAVAILABLE;
    }
    return XFER_OK;
}

static xfer_status_t gid_setup(xfer_iface_h iface)
{
    int idx = (iface->cfg->gid_index >= 0) ? (int)iface->cfg->gid_index : gid_pick(iface);

    if ((idx >= iface->port_attr.gid_tbl_len) ||
        (ibv_query_gid(iface->ctx, iface->port, idx, &iface->gid) != 0)) {
        xfer_log(XFER_LOG_ERROR, XFER_VERBS_SUBSYS, "%s: cannot read GID index %d (table of "
                 "%d)", iface->dev_name, idx, iface->port_attr.gid_tbl_len);
        return XFER_ERR_INVALID_PARAM;
    }
    iface->gid_index = idx;
    return XFER_OK;
}

static void address_build(xfer_iface_h iface)
{
    xfer_verbs_wire_iface_addr_t a;

    memset(&a, 0, sizeof(a));
    memcpy(a.gid, iface->gid.raw, 16);
    a.lid           = iface->port_attr.lid;
    a.port          = iface->port;
    a.link_layer    = iface->port_attr.link_layer;
    a.active_mtu    = (uint8_t)iface->port_attr.active_mtu;
    a.gid_index     = (uint8_t)iface->gid_index;
    a.subnet_prefix = be64toh(iface->gid.global.subnet_prefix);
    xfer_verbs_wire_pack_iface_addr(&a, iface->address);
}

static xfer_status_t events_setup(xfer_iface_h iface)
{
    struct epoll_event ev = {.events = EPOLLIN};
    int flags;

    flags = fcntl(iface->comp_channel->fd, F_GETFL);
    if ((flags < 0) || (fcntl(iface->comp_channel->fd, F_SETFL, flags | O_NONBLOCK) < 0)) {
        return XFER_ERR_NO_RESOURCE;
    }
    ev.data.ptr = NULL;
    if (epoll_ctl(iface->base.epfd, EPOLL_CTL_ADD, iface->comp_channel->fd, &ev) != 0) {
        return XFER_ERR_NO_RESOURCE;
    }
    flags = fcntl(iface->ctx->async_fd, F_GETFL);
    if ((flags < 0) || (fcntl(iface->ctx->async_fd, F_SETFL, flags | O_NONBLOCK) < 0)) {
        return XFER_ERR_NO_RESOURCE;
    }
    ev.data.ptr = iface->ctx;
    if (epoll_ctl(iface->base.epfd, EPOLL_CTL_ADD, iface->ctx->async_fd, &ev) != 0) {
        return XFER_ERR_NO_RESOURCE;
    }
    /* the keepalive probes go out every half period */
    if ((iface->cfg->keepalive > 0) &&
        (xfer_iface_base_timer(&iface->base, (uint64_t)(iface->cfg->keepalive / 2 * 1e9)) !=
         XFER_OK)) {
        return XFER_ERR_NO_RESOURCE;
    }
    return XFER_OK;
}

/* The tests' fault injection (see corrupt_type in verbs.h); never set in production. */
static void corrupt_setup(xfer_iface_h iface)
{
    const char *spec = getenv("XFER_VERBS_TEST_CORRUPT");
    const char *colon;

    if ((spec == NULL) || ((colon = strchr(spec, ':')) == NULL)) {
        return;
    }
    for (unsigned t = 1; t < XFER_VERBS_MSG_LAST; t++) {
        const char *name = xfer_verbs_msg_name(t);

        if ((strlen(name) == (size_t)(colon - spec)) && (strncmp(spec, name, strlen(name)) == 0)) {
            iface->corrupt_type = (uint8_t)t;
        }
    }
    snprintf(iface->corrupt_how, sizeof(iface->corrupt_how), "%s", colon + 1);
    xfer_log(XFER_LOG_WARN, XFER_VERBS_SUBSYS, "XFER_VERBS_TEST_CORRUPT=%s: the next such "
             "message will be damaged on purpose (a test)", spec);
}


#define MRC_ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE)

/* The registration cache's calls: an MR of the iface's protection domain. */
static int mrc_reg(void *arg, uintptr_t start, uintptr_t end, void **handle_p)
{
    xfer_iface_h iface = arg;

    errno     = 0;
    *handle_p = ibv_reg_mr(iface->pd, (void*)start, end - start, MRC_ACCESS);
    return (*handle_p != NULL) ? 0 : (errno != 0) ? errno : EIO;
}

static int mrc_dereg(void *arg, void *handle)
{
    (void)arg;
    return ibv_dereg_mr(handle);
}

/*
 * The registration cache for buffers the user did not register: cached only where libucm's
 * unmap reports cover the process (framework/regcache.c says why). Where they do not, say so
 * once per process, and what it costs: a warning when libucm was wanted and failed,
 * information when the user or a memory checker turned caching off.
 */
static xfer_status_t mrc_setup(xfer_iface_h iface)
{
    static int said;
    xfer_regcache_params_t mrc_params = {.reg = mrc_reg, .dereg = mrc_dereg, .arg = iface,
                                         .what = "ibv_reg_mr"};
    char why[XFER_REASON_MAX];
    xfer_log_level_t level = XFER_LOG_INFO;
    const char *refused;
    xfer_status_t status;

    mrc_params.max_entries = xfer_verbs_mr_cache_allowed(iface->cfg, why, sizeof(why)) ?
                             iface->cfg->mrc_max_entries : 0;
    mrc_params.max_bytes   = iface->cfg->mrc_max_bytes;
    status = xfer_regcache_create(&mrc_params, &iface->mrc);
    if (status != XFER_OK) {
        return status;
    }
    refused = xfer_regcache_uncached_why(iface->mrc);
    if ((refused != NULL) && (mrc_params.max_entries > 0)) {
        snprintf(why, sizeof(why), "%s", refused);
        level = XFER_LOG_WARN;
    }
    if ((refused != NULL) && !__atomic_exchange_n(&said, 1, __ATOMIC_RELAXED)) {
        xfer_log(level, XFER_VERBS_SUBSYS, "registrations of buffers not registered with "
                 "xfer_mem_register are not cached (%s): each operation on one registers it "
                 "and deregisters it at completion (ibv_reg_mr + ibv_dereg_mr per operation)",
                 why);
    }
    return XFER_OK;
}

/* Operations from a pool: malloc and free per message would be on the data path. */
static const xfer_iface_base_desc_t base_desc = {
    .subsys       = XFER_VERBS_SUBSYS,
    .fail_ops     = &xfer_verbs_ch_fail_ops,
    .op_size      = sizeof(xfer_verbs_op_t),
    .op_pool_name = "xfer_verbs_ops",
    .answer_size  = sizeof(xfer_verbs_rsp_t),
    .answer       = xfer_verbs_tensor_answer,
    .timer        = 1,
};

xfer_status_t xfer_verbs_iface_open(const void *config, const xfer_iface_params_t *params,
                                    xfer_iface_h *iface_p)
{
    xfer_iface_h iface;
    xfer_status_t status;

    status = XFER_IFACE_ALLOC(config, params, iface_p, iface);
    if (status != XFER_OK) {
        return status;
    }
    ucs_list_head_init(&iface->channels);
    kh_init_inplace(xfer_verbs_chans, &iface->chan_ids);
    ucs_list_head_init(&iface->busy);
    status = xfer_iface_base_open(&iface->base, &base_desc, params);
    if (status != XFER_OK) {
        kh_destroy_inplace(xfer_verbs_chans, &iface->chan_ids);
        free(iface);
        return status;
    }

    status = port_open(iface);
    if (status != XFER_OK) {
        goto err;
    }
    status = gid_setup(iface);
    if (status != XFER_OK) {
        goto err;
    }
    status          = XFER_ERR_NO_RESOURCE;
    iface->pd       = ibv_alloc_pd(iface->ctx);
    iface->comp_channel = (iface->pd != NULL) ? ibv_create_comp_channel(iface->ctx) : NULL;
    if (iface->comp_channel == NULL) {
        xfer_log(XFER_LOG_ERROR, XFER_VERBS_SUBSYS, "%s: cannot allocate a protection domain "
                 "or completion channel: %s", iface->dev_name, strerror(errno));
        goto err;
    }
    if (xfer_verbs_cq_add(iface, (int)iface->cfg->cq_size) != XFER_OK) {
        goto err;
    }
    if (events_setup(iface) != XFER_OK) {
        xfer_log(XFER_LOG_ERROR, XFER_VERBS_SUBSYS, "cannot set up event descriptors: %s",
                 strerror(errno));
        goto err;
    }
    status = mrc_setup(iface);
    if (status != XFER_OK) {
        goto err;
    }
    iface->max_inline = (uint32_t)iface->cfg->max_inline;
    /* a work request's scatter entry holds at most the port's largest message (0: says
     * nothing) */
    iface->rdma_chunk = (uint32_t)iface->cfg->rdma_chunk;
    if ((iface->port_attr.max_msg_sz > 0) && (iface->port_attr.max_msg_sz < iface->rdma_chunk)) {
        iface->rdma_chunk = iface->port_attr.max_msg_sz;
    }
    corrupt_setup(iface);
    address_build(iface);
    xfer_log_at(XFER_LOG_INFO, XFER_VERBS_SUBSYS, "opened %s (GID index %d, MTU %d, %s)",
                iface->dev_name, iface->gid_index, 128 << iface->port_attr.active_mtu,
                (iface->port_attr.link_layer == IBV_LINK_LAYER_ETHERNET) ? "RoCE" :
                "InfiniBand");
    *iface_p = iface;
    return XFER_OK;

err:
    xfer_verbs_iface_close(iface);
    return status;
}

/* Failure notices, tensor releases and queued completions (engine.h). */
static unsigned deliver(xfer_iface_h iface)
{
    return xfer_iface_deliver(&iface->base, &iface->params, XFER_IFACE_DELIVER_INLINE);
}

void xfer_verbs_iface_close(xfer_iface_h iface)
{
    if (iface == NULL) {
        return;
    }
    while (!ucs_list_is_empty(&iface->channels)) {
        xfer_verbs_ep_destroy(ucs_list_head(&iface->channels, struct xfer_ep, list));
    }
    deliver(iface);
    xfer_verbs_batch_iface_cleanup(iface);
    if (iface->mrc != NULL) {
        xfer_regcache_destroy(iface->mrc);
    }
    kh_destroy_inplace(xfer_verbs_chans, &iface->chan_ids);
    xfer_iface_base_close(&iface->base);
    xfer_verbs_cq_destroy_all(iface);
    if (iface->comp_channel != NULL) {
        ibv_destroy_comp_channel(iface->comp_channel);
    }
    if (iface->pd != NULL) {
        ibv_dealloc_pd(iface->pd);
    }
    if (iface->ctx != NULL) {
        ibv_close_device(iface->ctx);
    }
    free(iface);
}

xfer_status_t xfer_verbs_iface_address(xfer_iface_h iface, void *buf, size_t *len_p)
{
    if (!xfer_out_room(buf, len_p, sizeof(iface->address))) {
        return XFER_ERR_NO_RESOURCE;
    }
    memcpy(buf, iface->address, sizeof(iface->address));
    return XFER_OK;
}

xfer_ep_h xfer_verbs_channel_find(xfer_iface_h iface, uint32_t id)
{
    khiter_t it = kh_get(xfer_verbs_chans, &iface->chan_ids, id);

    return (it == kh_end(&iface->chan_ids)) ? NULL : kh_value(&iface->chan_ids, it);
}

static unsigned async_events(xfer_iface_h iface);

static unsigned fds_poll(xfer_iface_h iface)
{
    struct epoll_event evs[16];
    unsigned count = 0;
    int n;

    n = epoll_wait(iface->base.epfd, evs, 16, 0);
    for (int i = 0; i < n; i++) {
        if (evs[i].data.ptr == NULL) {
            xfer_verbs_cq_events_drain(iface);
        } else if (evs[i].data.ptr == iface->ctx) {
            count += async_events(iface);
        } else if (evs[i].data.ptr == &iface->base.timerfd) {
            uint64_t ticks;
            double now = xfer_now_sec();
            xfer_ep_h ch, tmp;

            if (read(iface->base.timerfd, &ticks, sizeof(ticks)) < 0) {
                continue;   /* EAGAIN: another reader was first */
            }
            ucs_list_for_each_safe(ch, tmp, &iface->channels, list) {
                xfer_verbs_ch_timer(ch, now);
            }
        } else {
            xfer_verbs_ch_sock_event(evs[i].data.ptr);
            count++;
        }
    }
    return count;
}

static void fail_all(xfer_iface_h iface, xfer_status_t status, const char *why)
{
    xfer_ep_h ch, tmp;

    xfer_verbs_cq_poll(iface);     /* what completed before the event comes first */
    ucs_list_for_each_safe(ch, tmp, &iface->channels, list) {
        xfer_verbs_ch_fail(ch, status, "%s", why);
    }
}

/* The device's asynchronous events. Each is acknowledged before it is acted on: destroying
 * a QP waits for its events to be acknowledged. */
static unsigned async_events(xfer_iface_h iface)
{
    struct ibv_async_event ev;
    unsigned count = 0;

    while (ibv_get_async_event(iface->ctx, &ev) == 0) {
        enum ibv_event_type type = ev.event_type;
        const char *name         = ibv_event_type_str(type);
        uint32_t qp_num          = 0;
        int port                 = 0;
        char why[128];

        switch (type) {
        case IBV_EVENT_QP_FATAL:
        case IBV_EVENT_QP_REQ_ERR:
        case IBV_EVENT_QP_ACCESS_ERR:
        case IBV_EVENT_PATH_MIG_ERR:
            qp_num = ev.element.qp->qp_num;
            break;
        case IBV_EVENT_PORT_ERR:
        case IBV_EVENT_PORT_ACTIVE:
        case IBV_EVENT_LID_CHANGE:
        case IBV_EVENT_GID_CHANGE:
        case IBV_EVENT_PKEY_CHANGE:
        case IBV_EVENT_SM_CHANGE:
        case IBV_EVENT_CLIENT_REREGISTER:
            port = ev.element.port_num;
            break;
        default:
            break;
        }
        ibv_ack_async_event(&ev);
        count++;

        switch (type) {
        case IBV_EVENT_QP_FATAL:
        case IBV_EVENT_QP_REQ_ERR:
        case IBV_EVENT_QP_ACCESS_ERR:
        case IBV_EVENT_PATH_MIG_ERR: {
            xfer_ep_h ch;

            ucs_list_for_each(ch, &iface->channels, list) {
                if ((ch->qp != NULL) && (ch->qp->qp_num == qp_num)) {
                    xfer_verbs_cq_poll(iface);
                    xfer_verbs_ch_fail(ch, XFER_ERR_CONNECTION, "asynchronous event %s", name);
                    break;
                }
            }
            break;
        }
        case IBV_EVENT_PORT_ERR:
            if (port == iface->port) {
                snprintf(why, sizeof(why), "port %s went down (%s)", iface->dev_name, name);
                xfer_log(XFER_LOG_WARN, XFER_VERBS_SUBSYS, "%s: failing its %zu channel(s)",
                         why, ucs_list_length(&iface->channels));
                fail_all(iface, XFER_ERR_CONNECTION, why);
            }
            break;
        case IBV_EVENT_CQ_ERR:
        case IBV_EVENT_DEVICE_FATAL:
            snprintf(why, sizeof(why), "device %s: %s", iface->dev_name, name);
            xfer_log(XFER_LOG_ERROR, XFER_VERBS_SUBSYS, "%s: failing its %zu channel(s)", why,
                     ucs_list_length(&iface->channels));
            fail_all(iface, XFER_ERR_IO, why);
            break;
        default:
            xfer_log(XFER_LOG_INFO, XFER_VERBS_SUBSYS, "%s: asynchronous event %s (port %d)",
                     iface->dev_name, name, port);
            break;
        }
    }
    return count;
}

unsigned xfer_verbs_iface_progress(xfer_iface_h iface)
{
    unsigned count = xfer_verbs_cq_poll(iface);

    /* The fds (async events, the timer, connection sockets) want attention within a
     * millisecond, not every few microseconds: an epoll_wait() per 64 calls cost a tag
     * round trip a system call or more while it spun. Sleeping looks at them at once
     * (event_arm). */
    if ((++iface->progress_count % PROGRESS_FD_PERIOD) == 0) {
        double now = xfer_now_sec();

        if (now - iface->fds_polled >= PROGRESS_FD_GAP) {
            iface->fds_polled = now;
            count += fds_poll(iface);
        }
    }
    return count + deliver(iface);
}

int xfer_verbs_iface_event_fd(xfer_iface_h iface)
{
    return iface->base.epfd;
}

xfer_status_t xfer_verbs_iface_event_arm(xfer_iface_h iface)
{
    if (xfer_op_queued(iface->base.ops) || xfer_tanswers_pending(iface->base.tanswers) ||
        xfer_ep_failq_busy(&iface->base.failq) || (iface->backlog_len > 0)) {
        return XFER_ERR_BUSY;
    }
    if (fds_poll(iface) > 0) {
        return XFER_ERR_BUSY;
    }
    if (xfer_verbs_cq_arm(iface) != XFER_OK) {
        return XFER_ERR_BUSY;
    }
    return xfer_op_queued(iface->base.ops) ? XFER_ERR_BUSY : XFER_OK;
}

/* ---- operations -------------------------------------------------------------------------- */

xfer_verbs_op_t *xfer_verbs_op_new(xfer_iface_h iface, xfer_ep_h ch, xfer_verbs_op_kind_t kind,
                                   xfer_comp_t *comp)
{
    xfer_verbs_op_t *op = xfer_op_get(iface->base.ops, offsetof(xfer_verbs_op_t, msg_buf), 0,
                                      comp, ch);

    if (op != NULL) {
        op->iface = iface;
        op->ch    = ch;
        op->kind  = kind;
        op->slot  = UINT32_MAX;
        op->msg   = op->msg_buf;
    }
    return op;
}

void xfer_verbs_op_complete(xfer_verbs_op_t *op, xfer_status_t status, size_t length,
                            uint64_t tag)
{
    if (op->mr != NULL) {
        xfer_regcache_put(op->iface->mrc, op->mr);
        op->mr = NULL;
    }
    if (op->msg != op->msg_buf) {
        free(op->msg);
        op->msg = op->msg_buf;
    }
    if (op->kind == XFER_VERBS_OP_CTRL) {
        xfer_verbs_op_free(op);
        return;
    }
    xfer_op_complete(op->iface->base.ops, op, status, length, tag);
}

xfer_status_t xfer_verbs_op_lkey(xfer_verbs_op_t *op, xfer_memh_h memh)
{
    xfer_status_t status;

    if (op->len == 0) {
        op->lkey = 0;
        return XFER_OK;
    }
    if (memh != NULL) {
        op->lkey = memh->mr->lkey;
        return XFER_OK;
    }
    if (op->iface->devmem != NULL) {
        status = op->iface->devmem->unregistered(op->iface, op->buf, op->len);
        if (status != XFER_OK) {
            return status;
        }
    }
    status = xfer_regcache_get(op->iface->mrc, op->buf, op->len, &op->mr);
    if (status == XFER_OK) {
        op->lkey = xfer_verbs_mr(op->mr)->lkey;
    }
    return status;
}
