/*
 * The context's data-path machinery: the lock that serialises the API (UCX's
 * UCS_THREAD_MODE_MULTI model), the opened transport instances, progress, and sleeping on the
 * transports' file descriptors instead of spinning.
 *
 * Sleeping: one thread at a time (the "poller") sleeps in poll() on every iface's event fd
 * plus the context's wake eventfd; other waiting threads sleep on the condition variable. A
 * completion broadcasts the condition; posting an operation or completing a request while a
 * poller sleeps writes the eventfd, so nobody sleeps through work that is not an fd event
 * (a completion a component queued in software, a send posted from another thread).
 */
#include "xfer_int.h"
#include "staging.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define PROGRESS_SUBSYS "progress"

static void ep_failed_upcall(void *fw_arg, void *fw_ep, xfer_status_t status, const char *reason)
{
    xfer_endpoint_t *ep = fw_ep;

    (void)fw_arg;
    if ((ep != NULL) && (ep->status == XFER_OK)) {
        ep->status = status;
        /* the transport logged the cause at the level it deserves; a clean close is routine */
        if (status == XFER_ERR_PEER_CLOSED) {
            xfer_log(XFER_LOG_INFO, PROGRESS_SUBSYS, "endpoint to %s over %s: the peer closed "
                     "it in order", ep->peer, ep->transport);
        } else {
            xfer_log(XFER_LOG_INFO, PROGRESS_SUBSYS, "endpoint to %s over %s failed: %s (%s)",
                     ep->peer, ep->transport, reason ? reason : "",
                     xfer_status_string(status));
        }
        xfer_tm_ep_failed(ep, status);
    }
}

static void iface_close(xfer_fw_iface_t *fi)
{
    if (fi->iface != NULL) {
        fi->comp->iface_close(fi->iface);
        fi->iface = NULL;
    }
    fi->entry->fw_iface = NULL;
}

/* Open every available, allowed transport that can serve an endpoint, ranked for what every
 * endpoint carries - host memory. Moving CUDA memory (MEM_CUDA, RMA_CUDA) is not counted:
 * tcp does it through bounce buffers and must not outrank verbs for it, and a transport that
 * moves it by GPUDirect carries host memory as fast as the verbs it is built on. Reaching
 * other hosts is not counted either: whether a transport reaches a peer is decided per peer
 * at connect (iface_reachable, negotiation skips it for the others), so shm, which lacks
 * XFER_CAP_INTER_HOST, must rank ahead of tcp to be chosen for the peers it does reach. */
static xfer_status_t ifaces_open(xfer_context_t *ctx)
{
    const xfer_select_req_t req = {XFER_OFFER_CAPS,
                                   XFER_CAP_ALL & ~(XFER_CAP_MEM_CUDA | XFER_CAP_RMA_CUDA |
                                                    XFER_CAP_INTER_HOST)};
    xfer_selection_t sel;
    xfer_status_t status;

    status = xfer_select(ctx, &req, &sel);
    if (status != XFER_OK) {
        return status;
    }
    ctx->ifaces = calloc(sel.num_entries + 1, sizeof(*ctx->ifaces));
    if (ctx->ifaces == NULL) {
        xfer_selection_release(&sel);
        return XFER_ERR_NO_MEMORY;
    }
    for (size_t i = 0; i < sel.num_entries; i++) {
        xfer_component_entry_t *e = xfer_loader_find(ctx, sel.entries[i].name);
        xfer_fw_iface_t *fi       = &ctx->ifaces[ctx->num_ifaces];
        const xfer_component_v1_t *comp;
        xfer_iface_params_t params;

        if ((sel.entries[i].rank < 0) || (e == NULL) || (e->comp == NULL)) {
            continue;
        }
        comp = e->comp;
        if ((comp->iface_open == NULL) || (comp->iface_close == NULL) ||
            (comp->ep_create == NULL) || (comp->ep_destroy == NULL) ||
            (comp->progress == NULL)) {
            xfer_log(XFER_LOG_WARN, PROGRESS_SUBSYS, "%s claims capabilities but lacks the "
                     "iface/endpoint/progress entry points; not used", e->name);
            continue;
        }
        memset(&params, 0, sizeof(params));
        params.size            = sizeof(params);
        params.fw_arg          = ctx;
        params.max_key_len     = (uint32_t)ctx->fw_config.max_key_len;
        params.tensor_request  = xfer_tensor_upcall_request;
        params.tensor_withdraw = xfer_tensor_upcall_withdraw;
        params.tensor_release  = xfer_tensor_upcall_release;
        params.ep_failed       = ep_failed_upcall;
        params.max_tensor_requests = (uint32_t)ctx->fw_config.tensor_max_requests;
        params.notify          = xfer_notify_upcall;
        params.max_notify_len  = (uint32_t)ctx->fw_config.notify_max_len;
        params.fair_slice      = ctx->fw_config.fair_slice;
        params.authenticated   = (ctx->auth_key != NULL);

        fi->entry    = e;
        fi->comp     = comp;
        fi->index    = ctx->num_ifaces;
        fi->event_fd = -1;
        status       = comp->iface_open(e->params.config, &params, &fi->iface);
        if (status != XFER_OK) {
            xfer_log(XFER_LOG_WARN, PROGRESS_SUBSYS, "cannot open %s: %s; not used", e->name,
                     xfer_status_string(status));
            fi->iface = NULL;
            continue;
        }
        fi->addr_len = sizeof(fi->addr);
        if (comp->iface_address == NULL) {
            fi->addr_len = 0;
        } else if (comp->iface_address(fi->iface, fi->addr, &fi->addr_len) != XFER_OK) {
            xfer_log(XFER_LOG_WARN, PROGRESS_SUBSYS, "%s: no interface address; not used",
                     e->name);
            comp->iface_close(fi->iface);
            fi->iface = NULL;
            continue;
        }
        if (comp->event_fd != NULL) {
            fi->event_fd = comp->event_fd(fi->iface);
        }
        e->fw_iface = fi;
        ctx->num_ifaces++;
        xfer_log(XFER_LOG_DEBUG, PROGRESS_SUBSYS, "opened %s (event fd %d)", e->name,
                 fi->event_fd);
    }
    xfer_selection_release(&sel);
    return XFER_OK;
}

static void *progress_thread(void *arg)
{
    xfer_context_t *ctx = arg;

    xfer_ctx_lock(ctx);
    while (!ctx->stopping) {
        xfer_progress_locked(ctx);
        xfer_sleep_locked(ctx, 100);
    }
    xfer_ctx_unlock(ctx);
    return NULL;
}

xfer_status_t xfer_ctx_data_init(xfer_context_t *ctx, int open_ifaces)
{
    xfer_status_t status;

    ctx->wake_fd      = -1;
    ctx->user_epfd    = -1;
    ctx->user_timerfd = -1;
    ucs_list_head_init(&ctx->endpoints);
    ucs_list_head_init(&ctx->closing);
    ucs_list_head_init(&ctx->closed);
    ucs_list_head_init(&ctx->flush_ready);
    ucs_list_head_init(&ctx->hooks);
    ucs_list_head_init(&ctx->listeners);
    ucs_list_head_init(&ctx->rkeys);
    ucs_list_head_init(&ctx->mems);
    ucs_list_head_init(&ctx->requests);
    ucs_list_head_init(&ctx->ready);
    ucs_list_head_init(&ctx->notify_ready);
    xfer_batch_ctx_init(ctx);
    xfer_tm_init(ctx);
    pthread_mutex_init(&ctx->lock, NULL);
    ctx->lock_owner = (pthread_t)0;
    ctx->lock_depth = 0;
    pthread_cond_init(&ctx->cond, NULL);
    if (xfer_request_pool_init(ctx) != XFER_OK) {
        return XFER_ERR_NO_MEMORY;
    }

    while (ctx->id == 0) {
        if (getrandom(&ctx->id, sizeof(ctx->id), 0) != sizeof(ctx->id)) {
            ctx->id = ((uint64_t)getpid() << 32) ^ (uint64_t)time(NULL) ^ (uintptr_t)ctx;
        }
    }
    ctx->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (ctx->wake_fd < 0) {
        xfer_log(XFER_LOG_ERROR, PROGRESS_SUBSYS, "eventfd: %s", strerror(errno));
        return XFER_ERR_NO_RESOURCE;
    }
    status = xfer_tensor_table_create(ctx);
    if (status != XFER_OK) {
        return status;
    }
    return open_ifaces ? ifaces_open(ctx) : XFER_OK;
}

xfer_status_t xfer_ctx_thread_start(xfer_context_t *ctx)
{
    int ret = pthread_create(&ctx->thread, NULL, progress_thread, ctx);

    if (ret != 0) {
        xfer_log(XFER_LOG_ERROR, PROGRESS_SUBSYS, "cannot start the progress thread: %s",
                 strerror(ret));
        return XFER_ERR_NO_RESOURCE;
    }
    ctx->thread_started = 1;
    /* named, so that top -H, gdb and tests tell it from the application's threads; a name
     * that cannot be set changes nothing else */
    (void)pthread_setname_np(ctx->thread, "xfer-progress");
    return XFER_OK;
}

/* Destroy: every request still posted to a transport (receives from any peer, mostly: the
 * endpoints' own operations ended with them) is cancelled, and progress delivers the
 * completions while the registrations they hold still exist. Bounded: a transport that
 * cannot cancel something gets a few rounds, then its completion comes from iface_close. */
static void requests_drain_for_destroy(xfer_context_t *ctx)
{
    xfer_request_t *req, *tmp;

    ucs_list_for_each_safe(req, tmp, &ctx->requests, list) {
        if ((req->status != XFER_INPROGRESS) || req->queued) {
            continue;
        }
        if ((req->ops != NULL) && (req->ops->cancel != NULL)) {
            (void)req->ops->cancel(req, XFER_ERR_CANCELED);
        }
    }
    for (int round = 0; round < 16; round++) {
        if (xfer_progress_locked(ctx) == 0) {
            break;
        }
    }
}

/* What the transports complete while they close (after the registrations are gone) is
 * delivered last, with no transport left to call into and no registration to hold. */
static void requests_detach_mems(xfer_context_t *ctx)
{
    xfer_request_t *req;

    ucs_list_for_each(req, &ctx->requests, list) {
        if (req->mem != NULL) {
            req->mem->busy--;
            req->mem = NULL;
        }
    }
}

void xfer_ctx_data_cleanup(xfer_context_t *ctx)
{
    unsigned num_ifaces;

    if (ctx->thread_started) {
        xfer_ctx_lock(ctx);
        ctx->stopping = 1;
        xfer_wake_locked(ctx);
        pthread_cond_broadcast(&ctx->cond);
        xfer_ctx_unlock(ctx);
        pthread_join(ctx->thread, NULL);
        ctx->thread_started = 0;
    }
    xfer_ctx_lock(ctx);
    ctx->destroying = 1;    /* nothing new is posted from the callbacks that run below */
    xfer_listeners_close_all(ctx);
    xfer_endpoints_close_all(ctx);
    if (ctx->tensors != NULL) {
        xfer_tensor_table_destroy(ctx);
    }
    if (ctx->req_mp_ready) {
        requests_drain_for_destroy(ctx);
        xfer_staging_destroy(ctx);
        requests_detach_mems(ctx);
    }
    xfer_batch_ctx_cleanup(ctx);
    xfer_tm_cleanup(ctx);
    xfer_rkeys_release_all(ctx);
    xfer_mems_release_all(ctx);
    num_ifaces = ctx->num_ifaces;
    for (unsigned i = 0; (ctx->ifaces != NULL) && (i < num_ifaces); i++) {
        iface_close(&ctx->ifaces[i]);
    }
    ctx->num_ifaces = 0;
    if (ctx->req_mp_ready) {
        while (!ucs_list_is_empty(&ctx->ready)) {
            xfer_requests_dispatch(ctx);
        }
    }
    xfer_requests_free_all(ctx);
    xfer_msg_stage_cleanup(ctx);
    xfer_request_pool_cleanup(ctx);
    xfer_ctx_unlock(ctx);
    free(ctx->ifaces);
    ctx->ifaces     = NULL;
    if (ctx->wake_fd >= 0) {
        close(ctx->wake_fd);
        ctx->wake_fd = -1;
    }
    if (ctx->user_epfd >= 0) {
        close(ctx->user_epfd);
        close(ctx->user_timerfd);
        ctx->user_epfd = ctx->user_timerfd = -1;
    }
    pthread_cond_destroy(&ctx->cond);
    pthread_mutex_destroy(&ctx->lock);
}

void xfer_progress_hook_add(xfer_context_t *ctx, xfer_progress_hook_t *hook,
                            unsigned (*progress)(xfer_context_t *ctx),
                            int (*timeout)(xfer_context_t *ctx), int (*busy)(xfer_context_t *ctx))
{
    if (hook->registered) {
        return;
    }
    hook->progress   = progress;
    hook->timeout    = timeout;
    hook->busy       = busy;
    hook->registered = 1;
    ucs_list_add_tail(&ctx->hooks, &hook->link);
}

void xfer_progress_hook_del(xfer_context_t *ctx, xfer_progress_hook_t *hook)
{
    (void)ctx;
    if (hook->registered) {
        ucs_list_del(&hook->link);
        hook->registered = 0;
    }
}

/* The hooks registered now, each once: one may remove itself or another meanwhile. */
#define HOOKS_MAX 16

static unsigned hooks_collect(xfer_context_t *ctx, xfer_progress_hook_t **hooks)
{
    xfer_progress_hook_t *hook;
    unsigned n = 0;

    ucs_list_for_each(hook, &ctx->hooks, link) {
        if (n < HOOKS_MAX) {
            hooks[n++] = hook;
        }
    }
    return n;
}

unsigned xfer_progress_transports_locked(xfer_context_t *ctx)
{
    unsigned count = 0;

    for (unsigned i = 0; i < ctx->num_ifaces; i++) {
        count += ctx->ifaces[i].comp->progress(ctx->ifaces[i].iface);
    }
    return count;
}

unsigned xfer_progress_locked(xfer_context_t *ctx)
{
    xfer_progress_hook_t *hooks[HOOKS_MAX];
    unsigned count = 0, n;

    ctx->user_armed = 0;    /* whoever sleeps on the event fd is awake */

    for (unsigned i = 0; i < ctx->num_ifaces; i++) {
        count += ctx->ifaces[i].comp->progress(ctx->ifaces[i].iface);
    }
    n = hooks_collect(ctx, hooks);
    for (unsigned i = 0; i < n; i++) {
        if (hooks[i]->registered) {
            count += hooks[i]->progress(ctx);
        }
    }
    /* user callbacks only now, after every transport and hook has returned */
    if (!ucs_list_is_empty(&ctx->ready)) {
        count += xfer_requests_dispatch(ctx);
    }
    return count;
}

unsigned xfer_progress(xfer_context_t *ctx)
{
    unsigned count;

    if ((ctx == NULL) || (xfer_api_check(ctx, "xfer_progress", 0) != XFER_OK)) {
        return 0;
    }
    xfer_ctx_lock(ctx);
    count = xfer_progress_locked(ctx);
    xfer_ctx_unlock(ctx);
    return count;
}

void xfer_wake_locked(xfer_context_t *ctx)
{
    uint64_t one = 1;

    if ((ctx->poller_busy || ctx->user_armed) && (ctx->wake_fd >= 0)) {
        /* EAGAIN only when the counter is saturated: it is readable anyway */
        (void)!write(ctx->wake_fd, &one, sizeof(one));
    }
}

static void cond_wait_ms(xfer_context_t *ctx, int timeout_ms)
{
    struct timespec ts;

    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec  += timeout_ms / 1000;
    ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    xfer_ctx_cond_wait(ctx, &ts);
}

void xfer_ctx_cond_wait(xfer_context_t *ctx, const struct timespec *deadline)
{
    unsigned depth = ctx->lock_depth;

    if (ctx->serialized) {
        return;     /* no other thread to wait for, and no lock to wait with */
    }

    __atomic_store_n(&ctx->lock_owner, (pthread_t)0, __ATOMIC_RELAXED);
    ctx->lock_depth = 0;
    pthread_cond_timedwait(&ctx->cond, &ctx->lock, deadline);
    __atomic_store_n(&ctx->lock_owner, pthread_self(), __ATOMIC_RELAXED);
    ctx->lock_depth = depth;
}

/* A hook polls (a copy lands without an fd event): do not sleep on the fds. */
static int hooks_busy(xfer_context_t *ctx)
{
    xfer_progress_hook_t *hook;

    ucs_list_for_each(hook, &ctx->hooks, link) {
        if ((hook->busy != NULL) && hook->busy(ctx)) {
            return 1;
        }
    }
    return 0;
}

/* ms to the context's nearest deadline (a close, a peer's request waiting for a tensor, a
 * batch): 0 when one is due, -1 when there is none. */
static int next_deadline_ms(xfer_context_t *ctx)
{
    xfer_progress_hook_t *hook;
    int next = -1;

    ucs_list_for_each(hook, &ctx->hooks, link) {
        int until = (hook->timeout != NULL) ? hook->timeout(ctx) : -1;

        if ((until >= 0) && ((next < 0) || (until < next))) {
            next = until;
        }
    }
    return next;
}

/* Arm every iface: 0 when one has events pending (progress again, do not sleep). */
static int ifaces_arm(xfer_context_t *ctx)
{
    for (unsigned i = 0; i < ctx->num_ifaces; i++) {
        xfer_fw_iface_t *fi = &ctx->ifaces[i];

        if ((fi->comp->event_arm != NULL) && (fi->comp->event_arm(fi->iface) == XFER_ERR_BUSY)) {
            return 0;
        }
    }
    return 1;
}

int xfer_transports_wait_fds(xfer_context_t *ctx, struct pollfd *fds, unsigned max)
{
    unsigned n = 0;

    if (ctx->poller_busy) {
        return 0;       /* another thread sleeps on them, and progresses when they fire */
    }
    if (!ifaces_arm(ctx)) {
        return -1;
    }
    for (unsigned i = 0; (i < ctx->num_ifaces) && (n < max); i++) {
        if (ctx->ifaces[i].event_fd >= 0) {
            fds[n].fd       = ctx->ifaces[i].event_fd;
            fds[n].events   = POLLIN;
            fds[n++].revents = 0;
        }
    }
    return (int)n;
}

void xfer_sleep_locked(xfer_context_t *ctx, int timeout_ms)
{
    struct pollfd fds[64];
    unsigned nfds = 0;
    uint64_t count;
    int until;

    if ((timeout_ms <= 0) || !ucs_list_is_empty(&ctx->ready)) {
        return;
    }
    /* A copy of the staging pipeline lands without an fd event: poll for it, letting go of
     * the lock for a moment so that a thread that polls here does not lock out the others. */
    if (hooks_busy(ctx)) {
        struct timespec ts;

        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50000;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        xfer_ctx_cond_wait(ctx, &ts);
        return;
    }
    /* wake up for the nearest deadline: a close, a peer's request waiting for a tensor */
    until = next_deadline_ms(ctx);
    if (until == 0) {
        return;
    }
    if ((until > 0) && (until < timeout_ms)) {
        timeout_ms = until;
    }
    if (ctx->poller_busy) {
        cond_wait_ms(ctx, timeout_ms);
        return;
    }
    if (!ifaces_arm(ctx)) {
        return;
    }
    fds[nfds].fd     = ctx->wake_fd;
    fds[nfds++].events = POLLIN;
    for (unsigned i = 0; (i < ctx->num_ifaces) && (nfds < 64); i++) {
        if (ctx->ifaces[i].event_fd >= 0) {
            fds[nfds].fd       = ctx->ifaces[i].event_fd;
            fds[nfds++].events = POLLIN;
        }
    }
    ctx->poller_busy = 1;
    xfer_ctx_unlock(ctx);
    (void)poll(fds, nfds, timeout_ms);
    xfer_ctx_lock(ctx);
    while (read(ctx->wake_fd, &count, sizeof(count)) == sizeof(count)) {
    }
    ctx->poller_busy = 0;
    /* whoever sleeps on cond may take over polling */
    pthread_cond_broadcast(&ctx->cond);
}

/* ---- the event fd for the application's own loop ------------------------------------------- */

static int user_epfd_create(xfer_context_t *ctx)
{
    struct epoll_event ev = {.events = EPOLLIN};

    ctx->user_epfd    = epoll_create1(EPOLL_CLOEXEC);
    ctx->user_timerfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if ((ctx->user_epfd < 0) || (ctx->user_timerfd < 0)) {
        goto err;
    }
    ev.data.fd = ctx->wake_fd;
    if (epoll_ctl(ctx->user_epfd, EPOLL_CTL_ADD, ctx->wake_fd, &ev) != 0) {
        goto err;
    }
    ev.data.fd = ctx->user_timerfd;
    if (epoll_ctl(ctx->user_epfd, EPOLL_CTL_ADD, ctx->user_timerfd, &ev) != 0) {
        goto err;
    }
    for (unsigned i = 0; i < ctx->num_ifaces; i++) {
        if (ctx->ifaces[i].event_fd < 0) {
            continue;
        }
        ev.data.fd = ctx->ifaces[i].event_fd;
        if (epoll_ctl(ctx->user_epfd, EPOLL_CTL_ADD, ev.data.fd, &ev) != 0) {
            goto err;
        }
    }
    return 0;

err:
    xfer_log(XFER_LOG_ERROR, PROGRESS_SUBSYS, "cannot make the context's event fd: %s",
             strerror(errno));
    if (ctx->user_epfd >= 0) {
        close(ctx->user_epfd);
    }
    if (ctx->user_timerfd >= 0) {
        close(ctx->user_timerfd);
    }
    ctx->user_epfd = ctx->user_timerfd = -1;
    return -1;
}

int xfer_context_event_fd(xfer_context_t *ctx)
{
    int fd;

    if ((ctx == NULL) || (xfer_api_check(ctx, "xfer_context_event_fd", 0) != XFER_OK)) {
        return -1;
    }
    xfer_ctx_lock(ctx);
    if ((ctx->user_epfd < 0) && (user_epfd_create(ctx) != 0)) {
        fd = -1;
    } else {
        fd = ctx->user_epfd;
    }
    xfer_ctx_unlock(ctx);
    return fd;
}

xfer_status_t xfer_context_arm(xfer_context_t *ctx)
{
    struct itimerspec its = {{0, 0}, {0, 0}};
    xfer_status_t status;
    uint64_t count;
    int until;

    if (ctx == NULL) {
        return XFER_ERR_INVALID_PARAM;
    }
    status = xfer_api_check(ctx, "xfer_context_arm", 0);
    if (status != XFER_OK) {
        return status;
    }
    xfer_ctx_lock(ctx);
    if (ctx->user_epfd < 0) {
        xfer_ctx_unlock(ctx);
        xfer_log(XFER_LOG_ERROR, PROGRESS_SUBSYS, "xfer_context_arm before "
                 "xfer_context_event_fd: there is no fd to sleep on");
        return XFER_ERR_INVALID_PARAM;
    }
    /* what woke the fd before is consumed: from here on, only new work makes it readable */
    while (read(ctx->wake_fd, &count, sizeof(count)) == sizeof(count)) {
    }
    (void)!read(ctx->user_timerfd, &count, sizeof(count));
    until = next_deadline_ms(ctx);
    if (!ucs_list_is_empty(&ctx->ready) || hooks_busy(ctx) || (until == 0) ||
        !ifaces_arm(ctx)) {
        xfer_ctx_unlock(ctx);
        return XFER_ERR_BUSY;
    }
    if (until > 0) {
        its.it_value.tv_sec  = until / 1000;
        its.it_value.tv_nsec = (long)(until % 1000) * 1000000L;
    }
    timerfd_settime(ctx->user_timerfd, 0, &its, NULL);   /* zero: disarmed */
    ctx->user_armed = 1;
    xfer_ctx_unlock(ctx);
    return XFER_OK;
}
