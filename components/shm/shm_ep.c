/*
 * An shm endpoint's life: its segments (one ring per direction, each in a memfd of the side
 * that consumes it, mapped by the peer through /proc/<pid>/fd), its liveness (the bootstrap
 * connection, whose end the kernel reports however the peer's process ended), failure and
 * teardown, flushes, outstanding-request slots, and the cross-memory attach it moves large
 * data with.
 *
 * A memfd lives in no mount: when both processes are gone, or one is killed at any point of
 * the set-up, nothing of the segment is left anywhere. The peer can only open it while we
 * hold it open, and only with the same rights ptrace would need (PTRACE_MODE_READ).
 */
#include "shm.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#define EP_ADDR_LEN 72u
#define SLOTS_MAX   (1u << 20)

typedef struct ep_addr {
    uint64_t token, base, max_msg;
    uint32_t pid, memfd, ncells, cell_size, cma;
    uint64_t ino;                   /* the memfd's inode */
    uint32_t act_fd, act_idx;       /* the iface's activity map and our bit in it */
    uint64_t act_ino;               /* ... the map's inode */
} ep_addr_t;

static void ep_addr_pack(const ep_addr_t *a, uint8_t *b)
{
    memcpy(b, &a->token, 8);
    memcpy(b + 8, &a->base, 8);
    memcpy(b + 16, &a->max_msg, 8);
    memcpy(b + 24, &a->pid, 4);
    memcpy(b + 28, &a->memfd, 4);
    memcpy(b + 32, &a->ncells, 4);
    memcpy(b + 36, &a->cell_size, 4);
    memcpy(b + 40, &a->cma, 4);
    memset(b + 44, 0, 4);
    memcpy(b + 48, &a->ino, 8);
    memcpy(b + 56, &a->act_fd, 4);
    memcpy(b + 60, &a->act_idx, 4);
    memcpy(b + 64, &a->act_ino, 8);
}

static void ep_addr_unpack(const uint8_t *b, ep_addr_t *a)
{
    memcpy(&a->token, b, 8);
    memcpy(&a->base, b + 8, 8);
    memcpy(&a->max_msg, b + 16, 8);
    memcpy(&a->pid, b + 24, 4);
    memcpy(&a->memfd, b + 28, 4);
    memcpy(&a->ncells, b + 32, 4);
    memcpy(&a->cell_size, b + 36, 4);
    memcpy(&a->cma, b + 40, 4);
    memcpy(&a->ino, b + 48, 8);
    memcpy(&a->act_fd, b + 56, 4);
    memcpy(&a->act_idx, b + 60, 4);
    memcpy(&a->act_ino, b + 64, 8);
}

static const xfer_flushes_ops_t flushes_ops;

xfer_status_t xfer_shm_ep_create(xfer_iface_h iface, const xfer_ep_params_t *params,
                                 xfer_ep_h *ep_p)
{
    const xfer_shm_config_t *cfg = iface->cfg;
    xfer_shm_host_id_t peer;
    char why[XFER_REASON_MAX];
    size_t seg_len;
    xfer_ep_h ep;
    void *base;

    if (params->sock_fd < 0) {
        return XFER_ERR_INVALID_PARAM;
    }
    if (xfer_shm_host_id_unpack(params->peer_iface_addr, params->peer_iface_addr_len, &peer,
                                why, sizeof(why)) != XFER_OK) {
        xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "peer address: %s", why);
        return XFER_ERR_PROTOCOL;
    }
    if (!xfer_shm_host_reachable(iface, &peer, why, sizeof(why))) {
        xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "cannot reach the peer: %s", why);
        return XFER_ERR_UNREACHABLE;
    }
    ep = calloc(1, sizeof(*ep));
    if (ep == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    ep->iface     = iface;
    ep->is_server = params->is_server;
    ep->peer_pid  = (pid_t)peer.pid;
    ep->cma       = iface->me.cma && peer.cma;
    ep->token     = xfer_random64();
    xfer_slots_init(&ep->slots, SLOTS_MAX);
    xfer_tframes_init(&ep->tf, &xfer_shm_tframes_ops, ep, iface->base.ops, &ep->slots,
                      iface->base.tanswers, params->fw_ep);
    ep->max_msg   = cfg->max_msg_size;
    ep->fd        = -1;
    ep->memfd     = -1;
    ucs_list_head_init(&ep->txq);
    xfer_flushes_init(&ep->flushes, &flushes_ops, ep);
    xfer_ep_fail_init(&ep->fail, ep, params->fw_ep);

    seg_len   = xfer_shm_seg_len((uint32_t)cfg->cells, (uint32_t)cfg->cell_size);
    ep->fd    = xfer_ep_sock_take(params->sock_fd, XFER_SHM_SUBSYS);
    if (ep->fd < 0) {
        goto err;
    }
    ep->memfd = xfer_memfd_sealed("xfer-shm", seg_len, why, sizeof(why));
    if (ep->memfd < 0) {
        xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "cannot create an endpoint's segment: %s",
                 why);
        goto err;
    }
    ep->memfd_ino = xfer_shm_fd_ino(ep->memfd);
    base = mmap(NULL, seg_len, PROT_READ | PROT_WRITE, MAP_SHARED, ep->memfd, 0);
    if (base == MAP_FAILED) {
        xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "cannot map an endpoint's segment of %zu "
                 "bytes: %s", seg_len, strerror(errno));
        goto err;
    }
    xfer_shm_seg_init(&ep->in, base, (uint32_t)cfg->cells, (uint32_t)cfg->cell_size,
                      ep->token);
    ucs_list_add_tail(&iface->eps, &ep->list);
    xfer_shm_act_bind(ep);
    *ep_p = ep;
    return XFER_OK;

err:
    if (ep->fd >= 0) {
        close(ep->fd);
    }
    if (ep->memfd >= 0) {
        close(ep->memfd);
    }
    free(ep);
    return XFER_ERR_NO_RESOURCE;
}

xfer_status_t xfer_shm_ep_address(xfer_ep_h ep, void *buf, size_t *len_p)
{
    ep_addr_t a;

    if (!xfer_out_room(buf, len_p, EP_ADDR_LEN)) {
        return XFER_ERR_NO_RESOURCE;
    }
    a.token     = ep->token;
    a.base      = (uint64_t)(uintptr_t)ep->in.base;
    a.max_msg   = ep->iface->cfg->max_msg_size;
    a.pid       = (uint32_t)getpid();
    a.memfd     = (uint32_t)ep->memfd;
    a.ino       = ep->memfd_ino;
    a.ncells    = ep->in.ncells;
    a.cell_size = ep->in.cell_size;
    a.cma       = (uint32_t)ep->cma;
    a.act_fd    = (uint32_t)ep->iface->act.fd;
    a.act_idx   = ep->act_idx;
    a.act_ino   = ep->iface->act.ino;
    ep_addr_pack(&a, buf);
    return XFER_OK;
}

/* Map the peer's segment: /proc/<pid>/fd/<memfd> names its memfd while the peer holds it. */
static xfer_status_t peer_segment_map(xfer_ep_h ep, const ep_addr_t *a, char *why,
                                      size_t why_size)
{
    xfer_shm_peer_fd_t pf = {0};
    xfer_shm_map_t map;
    xfer_status_t status;

    if (xfer_shm_geometry_check(a->ncells, a->cell_size, why, why_size) != XFER_OK) {
        return XFER_ERR_PROTOCOL;
    }
    if ((pid_t)a->pid != ep->peer_pid) {
        snprintf(why, why_size, "the endpoint address names pid %u, the peer's interface %d",
                 a->pid, (int)ep->peer_pid);
        return XFER_ERR_PROTOCOL;
    }
    pf.pid    = ep->peer_pid;
    pf.fd     = a->memfd;
    pf.ino    = a->ino;
    pf.length = xfer_shm_seg_len(a->ncells, a->cell_size);
    pf.exact  = 1;
    status = xfer_shm_peer_map(&pf, &map, why, why_size);
    if (status == XFER_ERR_CONNECTION) {
        /* the peer's process ended, or it closed its endpoint already: the endpoint is made
         * and fails at once, as one over a network would once it learns */
        size_t len = strlen(why);

        snprintf(why + len, why_size - len, " before this side mapped its ring");
        return status;
    }
    if (status != XFER_OK) {
        return status;
    }
    status = xfer_shm_seg_attach(&ep->out, map.base, map.map_len, a->token, why, why_size);
    if (status != XFER_OK) {
        xfer_shm_peer_unmap(&map);
        ep->out.base = NULL;
        return status;
    }
    if (a->act_idx == XFER_SHM_ACT_NONE) {
        return XFER_OK;     /* the peer watches our ring at every progress */
    }
    /* the peer's activity map: where this side says that its ring has frames */
    pf.fd     = a->act_fd;
    pf.ino    = a->act_ino;
    pf.length = XFER_SHM_ACT_LEN;
    status = xfer_shm_peer_map(&pf, &ep->act_map, why, why_size);
    if (status == XFER_OK) {
        status = xfer_shm_ring_act_attach(&ep->out, ep->act_map.data, a->act_idx, why,
                                          why_size);
    }
    return status;
}

/* The peer left while this side connected (why says how it showed): the endpoint is
 * connected and fails at once with a connection error, as for any peer that goes. */
static xfer_status_t connect_peer_gone(xfer_ep_h ep, const char *why)
{
    ep->fail.state = XFER_EP_CONNECTED;
    ep->peer_gone  = 1;
    xfer_shm_ep_fail_later(ep, XFER_ERR_CONNECTION, "%s", why);
    return XFER_OK;
}

/* Has the peer closed its end of the connection (its endpoint closed, its process gone)? */
static int peer_hung_up(xfer_ep_h ep)
{
    struct pollfd pfd = {.fd = ep->fd, .events = POLLRDHUP};

    return (ep->fd >= 0) && (poll(&pfd, 1, 0) == 1) &&
           ((pfd.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0);
}

xfer_status_t xfer_shm_ep_connect(xfer_ep_h ep, const void *peer_ep_addr, size_t addr_len)
{
    char why[XFER_REASON_MAX];
    xfer_status_t status;
    ep_addr_t a;

    if (ep->fail.state != XFER_EP_CREATED) {
        return XFER_ERR_INVALID_PARAM;
    }
    if ((peer_ep_addr == NULL) || (addr_len != EP_ADDR_LEN)) {
        xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "an shm endpoint address of %zu bytes "
                 "(expected %u)", addr_len, EP_ADDR_LEN);
        return XFER_ERR_PROTOCOL;
    }
    ep_addr_unpack(peer_ep_addr, &a);
    status = peer_segment_map(ep, &a, why, sizeof(why));
    if (status == XFER_ERR_CONNECTION) {
        return connect_peer_gone(ep, why);
    }
    if (status != XFER_OK) {
        xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "connect: %s", why);
        return status;
    }
    ep->cma     = ep->cma && a.cma;
    ep->max_msg = (a.max_msg < ep->max_msg) ? a.max_msg : ep->max_msg;
    if (ep->cma) {
        /* both sides allow CMA: prove it works in this direction before relying on it */
        uint32_t magic = 0;

        status = xfer_shm_cma(ep, &magic, a.base, sizeof(magic), 0, why, sizeof(why));
        if ((status == XFER_OK) && (magic != XFER_SHM_SEG_MAGIC)) {
            snprintf(why, sizeof(why), "read 0x%08x where the peer's segment starts",
                     magic);
            status = XFER_ERR_PROTOCOL;
        }
        if ((status == XFER_ERR_CONNECTION) || ((status != XFER_OK) && peer_hung_up(ep))) {
            /* the peer closed its endpoint after it sent its address: its segment is
             * unmapped (EFAULT), or its process is gone (ESRCH, which xfer_shm_cma tells
             * as XFER_ERR_CONNECTION: both sides share a pid namespace) - not a verdict on
             * CMA, and no reason to try another transport */
            char gone[XFER_REASON_MAX + 64];

            snprintf(gone, sizeof(gone), "the peer closed its endpoint while this side "
                     "connected (%s)", why);
            return connect_peer_gone(ep, gone);
        }
        if (status != XFER_OK) {
            xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "connect: cross-memory attach to the "
                     "peer fails: %s (XFER_SHM_CMA=off on both sides moves data through the "
                     "ring instead)", why);
            return XFER_ERR_UNAVAILABLE;
        }
    }
    status = xfer_ep_sock_watch(ep->iface->base.epfd, ep->fd, ep, XFER_SHM_SUBSYS);
    if (status != XFER_OK) {
        return status;
    }
    ep->fail.state = XFER_EP_CONNECTED;
    xfer_shm_ep_watch(ep);  /* what the peer wrote before it knew of the map is looked at */
    xfer_log(XFER_LOG_DEBUG, XFER_SHM_SUBSYS, "connected to pid %u: rings of %u x %u bytes, "
             "CMA %s", a.pid, ep->out.ncells, ep->out.cell_size, ep->cma ? "on" : "off");
    return XFER_OK;
}

xfer_status_t xfer_shm_cma(xfer_ep_h ep, void *local, uint64_t remote, uint64_t len, int to_peer,
                           char *why, size_t why_size)
{
    uint64_t done = 0;

    while (done < len) {
        struct iovec l = {(uint8_t*)local + done, (size_t)(len - done)};
        struct iovec r = {(void*)(uintptr_t)(remote + done), (size_t)(len - done)};
        ssize_t n      = to_peer ? process_vm_writev(ep->peer_pid, &l, 1, &r, 1, 0) :
                                   process_vm_readv(ep->peer_pid, &l, 1, &r, 1, 0);

        if (n <= 0) {
            snprintf(why, why_size, "%s of %llu bytes at 0x%llx in pid %d failed after %llu: "
                     "%s", to_peer ? "process_vm_writev" : "process_vm_readv",
                     (unsigned long long)len, (unsigned long long)remote, (int)ep->peer_pid,
                     (unsigned long long)done, (n == 0) ? "no progress" : strerror(errno));
            return ((n < 0) && (errno == ESRCH)) ? XFER_ERR_CONNECTION : XFER_ERR_IO;
        }
        done += (uint64_t)n;
    }
    ep->rx_copied += len;
    ep->rx_bytes  += to_peer ? 0 : len;
    return XFER_OK;
}

/* Nothing is posted before the endpoint connects: its ring is not there yet. */
xfer_status_t xfer_shm_ep_check(xfer_ep_h ep)
{
    return xfer_ep_state_check(&ep->fail, XFER_ERR_INVALID_PARAM);
}

/* ---- flushes -------------------------------------------------------------------------------- */

/* A flush's own conditions: the entries before it written, the shared puts before it done. */
static int flush_reached(void *arg, xfer_flush_t *f, xfer_status_t *status_p)
{
    xfer_shm_op_t *op = ucs_container_of(f, xfer_shm_op_t, flush);
    xfer_ep_h ep      = arg;

    (void)status_p;
    return (ep->tx_done >= op->mark_tx) && !xfer_shm_coop_waits(ep, op->mark_coop);
}

static void flush_complete(xfer_flush_t *f, xfer_status_t status)
{
    xfer_shm_op_complete(ucs_container_of(f, xfer_shm_op_t, flush), status, 0, 0);
}

static const xfer_flushes_ops_t flushes_ops = {flush_reached, flush_complete};

unsigned xfer_shm_ep_flushes_check(xfer_ep_h ep)
{
    return (ep->fail.state == XFER_EP_CONNECTED) ? xfer_flushes_check(&ep->flushes) : 0;
}

/* Nothing a flush would wait for: every entry written, every put and get answered. What is
 * in the peer's ring is in its host's memory: written entries are delivered. */
static int all_delivered(xfer_ep_h ep)
{
    return xfer_flushes_idle(&ep->flushes) && (ep->tx_done == ep->tx_queued) &&
           !xfer_shm_coop_waits(ep, ep->coop_posted);
}

xfer_status_t xfer_shm_ep_flush(xfer_ep_h ep, xfer_comp_t *comp)
{
    xfer_status_t status = xfer_shm_ep_check(ep);
    xfer_shm_op_t *op;

    if (status != XFER_OK) {
        return (ep->fail.state == XFER_EP_FAILED) ? xfer_ep_flush_ended(&ep->fail) : status;
    }
    if (all_delivered(ep)) {
        return XFER_OK;
    }
    op = xfer_shm_op_new(ep->iface, ep, XFER_SHM_OP_FLUSH, comp, 0);
    if (op == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    op->mark_tx   = ep->tx_queued;
    op->mark_coop = ep->coop_posted;
    xfer_flushes_add(&ep->flushes, &op->flush);
    return XFER_INPROGRESS;
}

/* ---- orderly close ---------------------------------------------------------------------------
 *
 * The closing side has flushed; BYE goes into the peer's ring behind everything, and the close
 * goes on once it is written. The peer handles every frame before it, completes the flushes
 * that what it wrote satisfies, and ends its endpoint with XFER_ERR_PEER_CLOSED; the end of
 * the connection without a BYE is a broken one. */

xfer_status_t xfer_shm_ep_shutdown(xfer_ep_h ep, xfer_comp_t *comp)
{
    xfer_status_t status = xfer_shm_ep_check(ep);

    if (status != XFER_OK) {
        return status;
    }
    status = xfer_shm_tx_ctrl(ep, XFER_SHM_F_BYE, XFER_OK, 0, 0);
    if (status != XFER_OK) {
        return status;
    }
    return xfer_shm_ep_flush(ep, comp);
}

xfer_status_t xfer_shm_rx_bye(xfer_ep_h ep, const xfer_shm_frame_t *hdr,
                              const uint8_t *payload, char *why, size_t why_size)
{
    (void)payload;
    if ((hdr->status != XFER_OK) || (hdr->len != 0) || (hdr->flags != 0) ||
        ((hdr->id | hdr->a | hdr->b | hdr->c | hdr->d | hdr->e) != 0)) {
        snprintf(why, why_size, "a BYE frame with status %d, %u payload bytes, flags 0x%x or "
                 "words set: all are reserved (0)", (int)hdr->status, hdr->len, hdr->flags);
        return XFER_ERR_PROTOCOL;
    }
    xfer_shm_ep_flushes_check(ep);
    ep->peer_gone = 1;      /* nothing more comes: no warning */
    return xfer_ep_bye(&ep->fail, all_delivered(ep), why, why_size);
}

/* ---- failure and teardown ------------------------------------------------------------------- */

/* What a slot waited for ends with its endpoint. */
static void slot_end(void *op, xfer_status_t status)
{
    xfer_shm_op_complete(op, status, 0, 0);
}

/* Close the endpoint and end everything pending on it with status. */
static void ep_teardown(void *arg, xfer_status_t status)
{
    xfer_ep_h ep = arg;

    if (ep->out.base != NULL) {
        /* before its sends end and its tensors go: the peer stops trusting reads of them */
        xfer_shm_ring_gone_set(&ep->out);
    }
    xfer_ep_sock_close(ep->iface->base.epfd, &ep->fd);
    xfer_shm_rx_abort(ep, status);
    xfer_notify_rx_end(ep->fail.fw_ep, &ep->notify_rx);      /* one part-way in */
    xfer_shm_tx_drop_all(ep, status);
    xfer_shm_coop_ep_gone(ep, status);
    xfer_shm_pulls_ep_gone(ep, status);
    xfer_flushes_fail(&ep->flushes, status);
    xfer_slots_end_all(&ep->slots, slot_end, status);
    xfer_shm_treqs_gone(ep, status);
}

static xfer_log_level_t ep_who(void *arg, char *buf, size_t size)
{
    xfer_ep_h ep = arg;

    snprintf(buf, size, "endpoint to the %s (pid %d)", ep->is_server ? "client" : "server",
             (int)ep->peer_pid);
    return ep->peer_gone ? XFER_LOG_INFO : XFER_LOG_WARN;
}

const xfer_ep_fail_ops_t xfer_shm_ep_fail_ops = {XFER_SHM_SUBSYS, ep_who, ep_teardown, NULL};

void xfer_shm_ep_destroy(xfer_ep_h ep)
{
    xfer_iface_h iface;

    if (ep == NULL) {
        return;
    }
    iface = ep->iface;
    xfer_ep_fail_destroy(&iface->base.failq, &ep->fail);
    /* tensors handed out for this peer's fetches are released before the ep goes */
    xfer_tanswers_release(iface->base.tanswers);
    xfer_op_deliver_owner(iface->base.ops, ep);
    xfer_shm_batch_ep_gone(ep);
    ucs_list_del(&ep->list);
    xfer_shm_act_unbind(ep);
    xfer_shm_peer_unmap(&ep->act_map);
    xfer_shm_peer_mem_release(ep);
    if (ep->in.base != NULL) {
        munmap(ep->in.base, ep->in.seg_len);
    }
    if (ep->out.base != NULL) {
        munmap(ep->out.base, ep->out.seg_len);
    }
    if (ep->memfd >= 0) {
        close(ep->memfd);
    }
    xfer_slots_cleanup(&ep->slots);
    free(ep);
}
