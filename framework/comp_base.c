/*
 * What every component's iface and endpoints share (engine.h): opening an iface and its base
 * (epoll set, timer, regions, op pool, tensor answers), cancel(), an endpoint's socket from
 * the bootstrap, and its state and failure told once - the two queues each iface keeps, one
 * of endpoints whose teardown waits for the next progress and one of endpoints whose failure
 * the framework is still to be told.
 */
#include "xfer_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>

enum {
    QUEUED_NONE = 0,
    QUEUED_DEFERRED,
    QUEUED_TELL
};

xfer_status_t xfer_iface_alloc(const void *config, const xfer_iface_params_t *params,
                               const void *iface_p, size_t size, size_t cfg_offset,
                               size_t params_offset, void **mem_p)
{
    uint8_t *mem;

    if ((config == NULL) || (params == NULL) || (iface_p == NULL) ||
        (params->size < offsetof(xfer_iface_params_t, max_key_len) + sizeof(uint32_t)) ||
        (params_offset + sizeof(xfer_iface_params_t) > size) ||
        (cfg_offset + sizeof(config) > size)) {
        return XFER_ERR_INVALID_PARAM;
    }
    mem = calloc(1, size);
    if (mem == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    memcpy(mem + cfg_offset, &config, sizeof(config));
    memcpy(mem + params_offset, params, (params->size < sizeof(xfer_iface_params_t)) ?
                                        params->size : sizeof(xfer_iface_params_t));
    *mem_p = mem;
    return XFER_OK;
}

xfer_status_t xfer_iface_base_open(xfer_iface_base_t *b, const xfer_iface_base_desc_t *d,
                                   const xfer_iface_params_t *params)
{
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = &b->timerfd};
    xfer_status_t status  = XFER_ERR_NO_MEMORY;

    memset(b, 0, sizeof(*b));
    xfer_ep_failq_init(&b->failq, d->fail_ops);
    b->timerfd = -1;
    b->epfd    = epoll_create1(EPOLL_CLOEXEC);
    if (d->timer && (b->epfd >= 0)) {
        b->timerfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    }
    if ((b->epfd < 0) ||
        (d->timer && ((b->timerfd < 0) ||
                      (epoll_ctl(b->epfd, EPOLL_CTL_ADD, b->timerfd, &ev) != 0)))) {
        xfer_log(XFER_LOG_ERROR, d->subsys, "cannot open an iface: %s: %s",
                 (b->epfd < 0) ? "epoll_create1" : "its timer", strerror(errno));
        xfer_iface_base_close(b);
        return XFER_ERR_NO_RESOURCE;
    }
    if ((d->regions && (xfer_regions_create(&b->regions) != XFER_OK)) ||
        (xfer_op_pool_create(d->op_size, d->op_extra, d->op_pool_name, &b->ops) != XFER_OK)) {
        b->ops = NULL;
    } else {
        status = xfer_tanswers_create(params, d->answer_size, d->answer, &b->tanswers);
    }
    if (status != XFER_OK) {
        xfer_log(XFER_LOG_ERROR, d->subsys, "cannot open an iface: out of memory for its "
                 "regions, operations or tensor answers");
        b->tanswers = NULL;
        xfer_iface_base_close(b);
    }
    return status;
}

void xfer_iface_base_close(xfer_iface_base_t *b)
{
    if (b->ops != NULL) {
        xfer_op_pool_destroy(b->ops);     /* what completed is delivered first */
    }
    if (b->tanswers != NULL) {
        xfer_tanswers_destroy(b->tanswers);
    }
    if (b->regions != NULL) {
        xfer_regions_destroy(b->regions, free);
    }
    if (b->timerfd >= 0) {
        close(b->timerfd);
    }
    if (b->epfd >= 0) {
        close(b->epfd);
    }
    b->ops      = NULL;
    b->tanswers = NULL;
    b->regions  = NULL;
    b->epfd     = b->timerfd = -1;
}

xfer_status_t xfer_iface_base_timer(xfer_iface_base_t *b, uint64_t period_ns)
{
    struct itimerspec its = {{0, 0}, {0, 0}};

    if (period_ns == b->timer_ns) {
        return XFER_OK;
    }
    if (period_ns > 0) {
        period_ns               = (period_ns < 1000000) ? 1000000 : period_ns;
        its.it_interval.tv_sec  = (time_t)(period_ns / 1000000000u);
        its.it_interval.tv_nsec = (long)(period_ns % 1000000000u);
        its.it_value            = its.it_interval;
    }
    if (timerfd_settime(b->timerfd, 0, &its, NULL) != 0) {
        return XFER_ERR_IO;
    }
    b->timer_ns = period_ns;
    return XFER_OK;
}

xfer_status_t xfer_op_too_long(const char *subsys, const char *what, size_t length,
                               uint64_t limit, const char *param)
{
    xfer_log(XFER_LOG_ERROR, subsys, "%s of %zu bytes exceeds the message limit of %llu bytes "
             "(%s, here or at the peer)", what, length, (unsigned long long)limit, param);
    return XFER_ERR_OUT_OF_RANGE;
}

xfer_status_t xfer_iface_cancel(xfer_iface_h iface, xfer_comp_t *comp, xfer_status_t status)
{
    return (iface == NULL) ? XFER_ERR_INVALID_PARAM : xfer_comp_cancel(comp, status);
}

void xfer_ep_failq_init(xfer_ep_failq_t *q, const xfer_ep_fail_ops_t *ops)
{
    ucs_list_head_init(&q->deferred);
    ucs_list_head_init(&q->tell);
    q->ops = ops;
}

void xfer_ep_fail_init(xfer_ep_fail_t *f, void *owner, void *fw_ep)
{
    memset(f, 0, sizeof(*f));
    f->owner = owner;
    f->fw_ep = fw_ep;
    ucs_list_head_init(&f->link);
}

/* Record status and the reason, unless a failure is recorded already: 1 when this did. */
static int fail_vset(xfer_ep_fail_t *f, xfer_status_t status, const char *fmt, va_list ap)
{
    if (f->status != XFER_OK) {
        return 0;
    }
    f->status = (status != XFER_OK) ? status : XFER_ERR_CONNECTION;
    vsnprintf(f->reason, sizeof(f->reason), fmt, ap);
    return 1;
}

static void fail_forget(xfer_ep_fail_t *f)
{
    if (f->queued != QUEUED_NONE) {
        ucs_list_del(&f->link);
        f->queued = QUEUED_NONE;
    }
}

/* The failure's log line: "<who>: the peer closed its endpoint in order" at INFO for
 * XFER_ERR_PEER_CLOSED, else "<who> failed: <reason> (<status>)" at the level who gives. */
static void fail_log(const xfer_ep_failq_t *q, const xfer_ep_fail_t *f)
{
    char who[XFER_REASON_MAX];
    xfer_log_level_t level = q->ops->who(f->owner, who, sizeof(who));

    if (f->status == XFER_ERR_PEER_CLOSED) {
        xfer_log(XFER_LOG_INFO, q->ops->subsys, "%s: the peer closed its endpoint in order",
                 who);
    } else {
        xfer_log(level, q->ops->subsys, "%s failed: %s (%s)", who, f->reason,
                 xfer_status_string(f->status));
    }
}

/* Tear f's endpoint down with its recorded status, once, and queue it for ep_failed. */
static void fail_teardown(xfer_ep_failq_t *q, xfer_ep_fail_t *f)
{
    if (f->torn) {
        return;
    }
    f->torn  = 1;
    f->state = XFER_EP_FAILED;
    fail_log(q, f);
    q->ops->teardown(f->owner, f->status);
    fail_forget(f);
    f->queued = QUEUED_TELL;
    ucs_list_add_tail(&q->tell, &f->link);
}

void xfer_ep_fail_v(xfer_ep_failq_t *q, xfer_ep_fail_t *f, xfer_status_t status,
                    const char *fmt, va_list ap)
{
    fail_vset(f, status, fmt, ap);      /* failing later: that reason stays */
    fail_teardown(q, f);
}

void xfer_ep_fail(xfer_ep_failq_t *q, xfer_ep_fail_t *f, xfer_status_t status,
                  const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    xfer_ep_fail_v(q, f, status, fmt, ap);
    va_end(ap);
}

void xfer_ep_fail_later(xfer_ep_failq_t *q, xfer_ep_fail_t *f, xfer_status_t status,
                        const char *fmt, ...)
{
    va_list ap;
    int recorded;

    va_start(ap, fmt);
    recorded = fail_vset(f, status, fmt, ap);
    va_end(ap);
    if (recorded && !f->torn) {
        f->queued = QUEUED_DEFERRED;
        f->state  = XFER_EP_FAILING;
        ucs_list_add_tail(&q->deferred, &f->link);
        if (q->ops->failing != NULL) {
            q->ops->failing(f->owner);
        }
    }
}

unsigned xfer_ep_failq_teardown(xfer_ep_failq_t *q)
{
    unsigned count = 0;

    while (!ucs_list_is_empty(&q->deferred)) {
        xfer_ep_fail_t *f = ucs_list_extract_head(&q->deferred, xfer_ep_fail_t, link);

        f->queued = QUEUED_NONE;
        fail_teardown(q, f);
        count++;
    }
    return count;
}

void xfer_ep_fail_destroy(xfer_ep_failq_t *q, xfer_ep_fail_t *f)
{
    if (!f->torn) {
        f->torn  = 1;
        f->state = XFER_EP_FAILED;
        q->ops->teardown(f->owner, XFER_ERR_CANCELED);
    }
    fail_forget(f);
}

unsigned xfer_ep_failq_tell(xfer_ep_failq_t *q, const xfer_iface_params_t *params)
{
    unsigned count = 0;

    while (!ucs_list_is_empty(&q->tell)) {
        xfer_ep_fail_t *f = ucs_list_extract_head(&q->tell, xfer_ep_fail_t, link);

        f->queued = QUEUED_NONE;
        if (params->ep_failed != NULL) {
            params->ep_failed(params->fw_arg, f->fw_ep, f->status, f->reason);
        }
        count++;
    }
    return count;
}

int xfer_ep_sock_take(int sock_fd, const char *subsys)
{
    int fd = fcntl(sock_fd, F_DUPFD_CLOEXEC, 0);

    if (fd < 0) {
        xfer_log(XFER_LOG_ERROR, subsys, "cannot take the endpoint's connection (dup of socket "
                 "%d): %s", sock_fd, strerror(errno));
    }
    return fd;
}

xfer_status_t xfer_ep_sock_watch(int epfd, int fd, void *ep, const char *subsys)
{
    struct epoll_event ev = {.events = EPOLLIN | EPOLLRDHUP, .data.ptr = ep};

    if (epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
        xfer_log(XFER_LOG_ERROR, subsys, "cannot watch the endpoint's connection (epoll_ctl "
                 "ADD %d): %s", fd, strerror(errno));
        return XFER_ERR_NO_RESOURCE;
    }
    return XFER_OK;
}

void xfer_ep_sock_close(int epfd, int *fd_p)
{
    if (*fd_p < 0) {
        return;
    }
    /* ENOENT when it was never watched (an endpoint that failed before it connected) */
    (void)epoll_ctl(epfd, EPOLL_CTL_DEL, *fd_p, NULL);
    close(*fd_p);
    *fd_p = -1;
}
