/*
 * CUDA memory between processes of one host, by CUDA IPC.
 *
 * A registration of CUDA memory takes the IPC handle of the allocation holding it
 * (cuIpcGetMemHandle of the allocation's base) and the PCI bus id of its GPU; its remote key
 * carries both, and the allocation's base and length, after the host key's fields. A peer
 * that puts to or gets from such a key opens the handle once (cuIpcOpenMemHandle, in a CUDA
 * context of this iface's: the one of the first local CUDA memory used, or the primary
 * context of the key's GPU), keeps it open while any of its keys of that allocation lives,
 * and copies with the driver (cuMemcpyAsync on a stream of its own, then
 * cuStreamSynchronize): host or device memory here to or from the peer's device memory, and
 * device memory to or from the peer's xfer_mem_alloc memory mapped here (shm_map.c). A
 * batch between device memory on both sides goes by one launch of a copy kernel
 * (shm_cuda_gather.c); other batches hand the driver their copies up to 256 a
 * cuMemcpyBatchAsync call where it has it, else one cuMemcpyAsync each. A peer in this same
 * process (another context) is reached at its own address: the driver opens no handle in
 * the process that exported it. The target takes no part: nothing of it runs, and it is
 * told nothing, but a batch's notification, written into the ring after the last copy
 * landed. A put or get is done when
 * it returns; a batch when its notification is in the ring. A put's last byte is copied
 * after the rest, so that a reader polling it sees every byte ahead of it.
 *
 * Trust: the key's region must lie inside the allocation it names, and the opened
 * allocation must be at least that long (cuMemGetAddressRange of what the handle opened) -
 * else the key is refused and nothing moves, so no offset the peer wrote reaches past what
 * the handle maps here. A handle opens the whole allocation: a peer given a key to part of
 * one could reach all of it, as with any CUDA IPC. The target refuses PUT, GET and BATCH
 * frames that name CUDA memory (shm_rma.c): it never touches device memory itself.
 *
 * What the initiator cannot do itself - device memory here to or from host memory of the
 * peer's that is not mapped here - is declined with XFER_ERR_UNSUPPORTED before anything
 * moved; the framework stages such puts, gets and batches through host memory.
 */
#include "shm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#define CU_STREAM_NON_BLOCKING  0x1u

/* An allocation of a peer's opened here, shared by the keys that name it. */
struct xfer_shm_cuda_open {
    ucs_list_link_t        list;       /* iface->cuda.opened */
    uint32_t               pid;
    xfer_cuda_ipc_handle_t handle;
    xfer_cu_ptr_t          base;
    uint64_t               size;       /* what cuMemGetAddressRange says of it */
    unsigned               refs;
    int                    own;        /* this process's own memory: not opened, not closed */
};

/* The driver with its IPC entries, or NULL with why. */
static const xfer_cuda_driver_t *ipc_driver(char *why, size_t why_size)
{
    const xfer_cuda_driver_t *drv = xfer_cuda_driver(why, why_size);

    if (drv == NULL) {
        return NULL;
    }
    if (!XFER_CUDA_DRIVER_HAS(drv, ipc_get_mem_handle) ||
        !XFER_CUDA_DRIVER_HAS(drv, ipc_open_mem_handle) ||
        !XFER_CUDA_DRIVER_HAS(drv, ipc_close_mem_handle)) {
        snprintf(why, why_size, "the CUDA driver %s has no IPC entry points "
                 "(cuIpcGetMemHandle, cuIpcOpenMemHandle_v2, cuIpcCloseMemHandle)",
                 drv->library);
        return NULL;
    }
    return drv;
}

/* ---- registration and keys ------------------------------------------------------------------ */

xfer_status_t xfer_shm_cuda_reg(xfer_iface_h iface, const xfer_mem_reg_params_t *params,
                                xfer_memh_h memh)
{
    const xfer_mem_attr_t *attr = params->attr;
    char why[XFER_REASON_MAX], err[XFER_REASON_MAX];
    const xfer_cuda_driver_t *drv;
    void *saved = NULL;
    int res, dev = 0;

    if (!iface->cfg->cuda_ipc) {
        xfer_log(XFER_LOG_DEBUG, XFER_SHM_SUBSYS, "CUDA memory at %p is not shared by IPC "
                 "(XFER_SHM_CUDA_IPC=n)", params->addr);
        return XFER_ERR_UNSUPPORTED;
    }
    drv = ipc_driver(why, sizeof(why));
    if (drv == NULL) {
        xfer_log(XFER_LOG_INFO, XFER_SHM_SUBSYS, "no CUDA IPC for %zu bytes at %p: %s",
                 params->length, params->addr, why);
        return XFER_ERR_UNSUPPORTED;
    }
    (void)drv->ctx_get_current(&saved);
    res = drv->ctx_set_current(attr->cuda_context);
    if (res == 0) {
        res = drv->ipc_get_mem_handle(&memh->handle, attr->alloc_base);
    }
    if (res == 0) {
        res = drv->device_get(&dev, attr->cuda_device);
    }
    if (res == 0) {
        res = drv->device_get_pci_bus_id(memh->bus_id, sizeof(memh->bus_id), dev);
    }
    (void)drv->ctx_set_current(saved);
    if (res != 0) {
        /* memory of cuMemCreate or a stream-ordered pool has no legacy handle */
        xfer_log(XFER_LOG_INFO, XFER_SHM_SUBSYS, "no CUDA IPC handle for %zu bytes at %p "
                 "(%s): %s", params->length, params->addr, attr->how,
                 xfer_cuda_result_string(res, err, sizeof(err)));
        return XFER_ERR_UNSUPPORTED;
    }
    memh->bus_id[sizeof(memh->bus_id) - 1] = '\0';
    memh->cuda       = 1;
    memh->cu_ctx     = attr->cuda_context;
    memh->alloc_base = attr->alloc_base;
    memh->alloc_len  = attr->alloc_length;
    return XFER_OK;
}

void xfer_shm_cuda_rkey_pack(xfer_memh_h memh, uint8_t *b)
{
    memcpy(b, &memh->alloc_base, 8);
    memcpy(b + 8, &memh->alloc_len, 8);
    memcpy(b + 16, memh->bus_id, sizeof(memh->bus_id));
    memcpy(b + 32, &memh->handle, XFER_CUDA_IPC_HANDLE_SIZE);
}

xfer_status_t xfer_shm_cuda_rkey_unpack(xfer_rkey_h rkey, const uint8_t *b)
{
    memcpy(&rkey->alloc_base, b, 8);
    memcpy(&rkey->alloc_len, b + 8, 8);
    memcpy(rkey->bus_id, b + 16, sizeof(rkey->bus_id));
    memcpy(&rkey->handle, b + 32, XFER_CUDA_IPC_HANDLE_SIZE);
    if (rkey->bus_id[sizeof(rkey->bus_id) - 1] != '\0') {
        xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "remote key of CUDA memory: its GPU's bus id "
                 "is not a string of %zu bytes", sizeof(rkey->bus_id));
        return XFER_ERR_INVALID_PARAM;
    }
    if ((rkey->k.addr < rkey->alloc_base) || (rkey->alloc_len == 0) ||
        (rkey->k.addr - rkey->alloc_base > rkey->alloc_len) ||
        (rkey->k.length > rkey->alloc_len - (rkey->k.addr - rkey->alloc_base))) {
        xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "remote key of CUDA memory: %llu bytes at "
                 "0x%llx do not lie in the allocation it names (%llu bytes at 0x%llx)",
                 (unsigned long long)rkey->k.length, (unsigned long long)rkey->k.addr,
                 (unsigned long long)rkey->alloc_len, (unsigned long long)rkey->alloc_base);
        return XFER_ERR_INVALID_PARAM;
    }
    rkey->cuda = 1;
    return XFER_OK;
}

/* ---- this side's context and stream --------------------------------------------------------- */

/* The device whose PCI bus id is bus_id, or -1. */
static int device_by_bus_id(const xfer_cuda_driver_t *drv, const char *bus_id)
{
    char id[sizeof(((xfer_memh_h)0)->bus_id)];
    int count = 0, dev;

    if ((bus_id[0] == '\0') || (drv->device_get_count(&count) != 0)) {
        return -1;
    }
    for (int i = 0; i < count; i++) {
        if ((drv->device_get(&dev, i) == 0) &&
            (drv->device_get_pci_bus_id(id, sizeof(id), dev) == 0) &&
            (strncasecmp(id, bus_id, sizeof(id)) == 0)) {
            return dev;
        }
    }
    return -1;
}

/* Set up the iface's context and stream: local_ctx when given, else the primary context of
 * the GPU with bus_id (the first one when it is not visible here). */
static xfer_status_t cuda_setup(xfer_iface_h iface, const xfer_cuda_driver_t *drv,
                                void *local_ctx, const char *bus_id)
{
    xfer_shm_cuda_t *c = &iface->cuda;
    char err[XFER_REASON_MAX];
    void *ctx = local_ctx;
    int res, dev = -1;

    if (xfer_cuda_init(c->why, sizeof(c->why)) != XFER_OK) {
        return XFER_ERR_UNAVAILABLE;
    }
    if (ctx == NULL) {
        dev = device_by_bus_id(drv, bus_id);
        if (dev < 0) {
            xfer_log(XFER_LOG_INFO, XFER_SHM_SUBSYS, "the peer's GPU %s is not visible here: "
                     "its memory is opened in the first GPU's context", bus_id);
            res = drv->device_get(&dev, 0);
            if (res != 0) {
                snprintf(c->why, sizeof(c->why), "no CUDA device here: %s",
                         xfer_cuda_result_string(res, err, sizeof(err)));
                return XFER_ERR_UNAVAILABLE;
            }
        }
        res = drv->device_primary_ctx_retain(&ctx, dev);
        if (res != 0) {
            snprintf(c->why, sizeof(c->why), "cannot retain the primary context of CUDA device "
                     "%d: %s", dev, xfer_cuda_result_string(res, err, sizeof(err)));
            return XFER_ERR_UNAVAILABLE;
        }
    }
    res = drv->ctx_set_current(ctx);
    if (res == 0) {
        res = drv->stream_create(&c->stream, CU_STREAM_NON_BLOCKING);
    }
    if (res != 0) {
        snprintf(c->why, sizeof(c->why), "cannot create a CUDA stream: %s",
                 xfer_cuda_result_string(res, err, sizeof(err)));
        if (local_ctx == NULL) {
            (void)drv->device_primary_ctx_release(dev);
        }
        return XFER_ERR_UNAVAILABLE;
    }
    c->ctx     = ctx;
    c->primary = (local_ctx == NULL) ? dev : -1;
    return XFER_OK;
}

/* Enter the iface's CUDA context (set up at the first use, the driver table kept from then
 * on), the caller's kept in *saved_p. */
static const xfer_cuda_driver_t *cuda_enter(xfer_iface_h iface, void *local_ctx,
                                            const char *bus_id, void **saved_p)
{
    xfer_shm_cuda_t *c = &iface->cuda;
    const xfer_cuda_driver_t *drv;
    char why[XFER_REASON_MAX];

    if (c->state > 0) {
        *saved_p = NULL;
        (void)c->drv->ctx_get_current(saved_p);
        (void)c->drv->ctx_set_current(c->ctx);
        return c->drv;
    }
    if (c->state < 0) {
        return NULL;
    }
    drv = ipc_driver(why, sizeof(why));
    if (drv == NULL) {
        snprintf(c->why, sizeof(c->why), "%s", why);
        c->state = -1;
        return NULL;
    }
    *saved_p = NULL;
    (void)drv->ctx_get_current(saved_p);
    if (cuda_setup(iface, drv, local_ctx, bus_id) != XFER_OK) {
        xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "CUDA IPC: %s", c->why);
        (void)drv->ctx_set_current(*saved_p);
        c->state = -1;
        return NULL;
    }
    c->drv   = drv;
    c->state = 1;
    return drv;
}

static void cuda_leave(const xfer_cuda_driver_t *drv, void *saved)
{
    (void)drv->ctx_set_current(saved);
}

/* Close an allocation opened here (none to close for one of this process) and forget it;
 * in the iface's context. */
static void opened_free(const xfer_cuda_driver_t *drv, xfer_shm_cuda_open_t *o)
{
    ucs_list_del(&o->list);
    if (!o->own) {
        (void)drv->ipc_close_mem_handle(o->base);
    }
    free(o);
}

void xfer_shm_cuda_cleanup(xfer_iface_h iface)
{
    xfer_shm_cuda_t *c = &iface->cuda;
    const xfer_cuda_driver_t *drv = c->drv;
    void *saved = NULL;

    if (c->state <= 0) {
        return;
    }
    (void)drv->ctx_get_current(&saved);
    (void)drv->ctx_set_current(c->ctx);
    (void)drv->stream_synchronize(c->stream);
    xfer_shm_gather_cleanup(iface);
    while (!ucs_list_is_empty(&c->opened)) {
        opened_free(drv, ucs_list_head(&c->opened, xfer_shm_cuda_open_t, list));
    }
    (void)drv->stream_destroy(c->stream);
    (void)drv->ctx_set_current(saved);
    if (c->primary >= 0) {
        (void)drv->device_primary_ctx_release(c->primary);
    }
    c->state = 0;
}

/* ---- the peer's allocations, opened ---------------------------------------------------------- */

/* The peer's allocation that rkey names, opened here (in the iface's context, entered). */
static xfer_status_t rkey_open(xfer_ep_h ep, const xfer_cuda_driver_t *drv, xfer_rkey_h rkey)
{
    xfer_shm_cuda_t *c = &ep->iface->cuda;
    char err[XFER_REASON_MAX];
    xfer_shm_cuda_open_t *o;
    xfer_cu_ptr_t base = 0;
    size_t size        = 0;
    int res;

    if (rkey->opened != NULL) {
        return XFER_OK;
    }
    ucs_list_for_each(o, &c->opened, list) {
        if ((o->pid == rkey->pid) &&
            (memcmp(&o->handle, &rkey->handle, sizeof(o->handle)) == 0)) {
            break;
        }
    }
    if (&o->list == &c->opened) {
        o = calloc(1, sizeof(*o));
        if (o == NULL) {
            return XFER_ERR_NO_MEMORY;
        }
        if (rkey->pid == (uint32_t)getpid()) {
            /* another iface of this process registered it: its address is valid here, and the
             * driver opens no handle in the process that exported it */
            o->own  = 1;
            o->base = rkey->alloc_base;
            res     = 0;
        } else {
            res = drv->ipc_open_mem_handle(&o->base, rkey->handle, XFER_CUDA_IPC_LAZY_PEER);
        }
        if (res != 0) {
            xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "cannot open the CUDA IPC handle of "
                     "pid %u's allocation (%llu bytes on GPU %s): %s", rkey->pid,
                     (unsigned long long)rkey->alloc_len, rkey->bus_id,
                     xfer_cuda_result_string(res, err, sizeof(err)));
            free(o);
            return XFER_ERR_UNAVAILABLE;
        }
        res = drv->mem_get_address_range(&base, &size, o->base);
        if ((res != 0) || (base != o->base)) {
            size = 0;
        }
        o->pid    = rkey->pid;
        o->handle = rkey->handle;
        o->size   = size;
        ucs_list_add_tail(&c->opened, &o->list);
    }
    if (o->size < rkey->alloc_len) {
        /* the key claims more than the handle maps: nothing it names is touched */
        xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "a remote key of pid %u names a CUDA "
                 "allocation of %llu bytes; its IPC handle opens %llu", rkey->pid,
                 (unsigned long long)rkey->alloc_len, (unsigned long long)o->size);
        if (o->refs == 0) {
            opened_free(drv, o);
        }
        return XFER_ERR_INVALID_PARAM;
    }
    o->refs++;
    rkey->opened = o;
    return XFER_OK;
}

void xfer_shm_cuda_rkey_release(xfer_iface_h iface, xfer_rkey_h rkey)
{
    const xfer_cuda_driver_t *drv = iface->cuda.drv;
    xfer_shm_cuda_open_t *o       = rkey->opened;
    void *saved                   = NULL;

    rkey->opened = NULL;
    if ((o == NULL) || (--o->refs > 0)) {
        return;     /* nothing opened (then the iface's CUDA state may not be set up) */
    }
    (void)drv->ctx_get_current(&saved);
    (void)drv->ctx_set_current(iface->cuda.ctx);
    opened_free(drv, o);
    (void)drv->ctx_set_current(saved);
}

/* ---- copies ---------------------------------------------------------------------------------- */

/* Where remote_addr of rkey is here: in the peer's opened allocation, or in its memory mapped
 * here (the caller saw to it that it is one of them). The range was checked against the key. */
static xfer_cu_ptr_t remote_ptr(const xfer_rkey_h rkey, uint64_t remote_addr)
{
    if (rkey->cuda) {
        return rkey->opened->base + (remote_addr - rkey->alloc_base);
    }
    return (xfer_cu_ptr_t)(uintptr_t)(rkey->map.data + (remote_addr - rkey->k.addr));
}

/* Enter the context and open what the key names; NULL with *status_p when it cannot. */
static const xfer_cuda_driver_t *copies_begin(xfer_ep_h ep, xfer_memh_h memh, xfer_rkey_h rkey,
                                              void **saved_p, xfer_status_t *status_p)
{
    const xfer_cuda_driver_t *drv;

    drv = cuda_enter(ep->iface, ((memh != NULL) && memh->cuda) ? memh->cu_ctx : NULL,
                     rkey->cuda ? rkey->bus_id : "", saved_p);
    if (drv == NULL) {
        xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "CUDA memory to or from pid %d: %s",
                 (int)ep->peer_pid, ep->iface->cuda.why);
        *status_p = XFER_ERR_UNAVAILABLE;
        return NULL;
    }
    *status_p = rkey->cuda ? rkey_open(ep, drv, rkey) : XFER_OK;
    if (*status_p != XFER_OK) {
        cuda_leave(drv, *saved_p);
        return NULL;
    }
    return drv;
}

static int copy_start(const xfer_cuda_driver_t *drv, xfer_iface_h iface, int is_put,
                      uint64_t local, xfer_cu_ptr_t remote, uint64_t len)
{
    return is_put ? drv->memcpy_async(remote, local, len, iface->cuda.stream) :
                    drv->memcpy_async(local, remote, len, iface->cuda.stream);
}

/* Wait for the copies started (after the first failure to start one too, so that nothing
 * runs on once the operation completed); the first error. */
static xfer_status_t copies_end(xfer_ep_h ep, const xfer_cuda_driver_t *drv, int res,
                                void *saved)
{
    int sync = drv->stream_synchronize(ep->iface->cuda.stream);
    char err[XFER_REASON_MAX];

    cuda_leave(drv, saved);
    if ((res != 0) || (sync != 0)) {
        xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "a CUDA copy to or from pid %d failed: %s",
                 (int)ep->peer_pid,
                 xfer_cuda_result_string((res != 0) ? res : sync, err, sizeof(err)));
        return XFER_ERR_IO;
    }
    return XFER_OK;
}

xfer_status_t xfer_shm_cuda_rma(xfer_ep_h ep, int is_put, void *buf, size_t length,
                                xfer_memh_h memh, uint64_t remote_addr, xfer_rkey_h rkey)
{
    const xfer_cuda_driver_t *drv;
    xfer_cu_ptr_t remote;
    xfer_status_t status;
    size_t head;
    void *saved;
    int res;

    drv = copies_begin(ep, memh, rkey, &saved, &status);
    if (drv == NULL) {
        return status;
    }
    remote = remote_ptr(rkey, remote_addr);
    /* a put's last byte by a copy of its own, after the rest in stream order: one copy may be
     * spread over engines that land its bytes in any order, and a reader may poll the last
     * byte (as xfer_perf's put_lat does) */
    head = (is_put && (length > 1)) ? length - 1 : length;
    res  = (head == 0) ? 0 : copy_start(drv, ep->iface, is_put, (uintptr_t)buf, remote, head);
    if ((res == 0) && (head < length)) {
        res = copy_start(drv, ep->iface, 1, (uintptr_t)buf + head, remote + head, 1);
    }
    return copies_end(ep, drv, res, saved);
}

/* Where descriptor v of a batch copies to and from: a put from here into the peer's memory,
 * a get the other way. */
static void batch_ends(const xfer_batch_args_t *args, const xfer_batch_iov_t *v,
                       xfer_cu_ptr_t *dst_p, xfer_cu_ptr_t *src_p)
{
    xfer_cu_ptr_t remote = remote_ptr(args->rkey, v->remote);

    *dst_p = args->is_put ? remote : v->local;
    *src_p = args->is_put ? v->local : remote;
}

/* A batch's copies handed to the driver SHM_CUDA_BATCH_MAX at a time by cuMemcpyBatchAsync:
 * about the cost of one cuMemcpyAsync a call instead of one a block, which is most of the
 * time of a batch of small blocks. *next_p is the first descriptor no call took; a call's
 * error is returned as the driver gave it (what that call started is unknown: the caller
 * waits for the stream and copies from *next_p on again, one by one). */
#define SHM_CUDA_BATCH_MAX  256
static int copies_batched(const xfer_cuda_driver_t *drv, xfer_iface_h iface,
                          const xfer_batch_args_t *args, size_t *next_p)
{
    xfer_cu_ptr_t dsts[SHM_CUDA_BATCH_MAX], srcs[SHM_CUDA_BATCH_MAX];
    xfer_cuda_memcpy_attr_t attr = {.src_access_order = XFER_CUDA_SRC_ACCESS_ORDER_STREAM};
    size_t sizes[SHM_CUDA_BATCH_MAX], attr_idx = 0, fail_idx, i = 0, n;
    int res = 0;

    while ((i < args->count) && (res == 0)) {
        for (n = 0; (i < args->count) && (n < SHM_CUDA_BATCH_MAX); i++) {
            const xfer_batch_iov_t *v = &args->iov[i];

            if (v->length == 0) {
                continue;
            }
            batch_ends(args, v, &dsts[n], &srcs[n]);
            sizes[n] = v->length;
            n++;
        }
        fail_idx = SIZE_MAX;
        res = (n == 0) ? 0 : drv->memcpy_batch_async(dsts, srcs, sizes, n, &attr, &attr_idx,
                                                     1, &fail_idx, iface->cuda.stream);
        if (res == 0) {
            *next_p = i;
        }
    }
    return res;
}

/* Whether the copy kernel takes a batch: device memory here of the iface's context (the
 * kernel runs in it) and the peer's allocation on the same GPU, opened by IPC in that
 * context. Not memory of another context of this process, which a kernel here cannot
 * reach, nor host memory; nor another GPU's, which it reaches only where the two have peer
 * access (the driver's copies go through the host where they have not). */
static int gather_fits(xfer_iface_h iface, const xfer_batch_args_t *args)
{
    return iface->cfg->cuda_gather && (args->memh != NULL) && args->memh->cuda &&
           (args->memh->cu_ctx == iface->cuda.ctx) && args->rkey->cuda &&
           !args->rkey->opened->own &&
           (strncasecmp(args->memh->bus_id, args->rkey->bus_id,
                        sizeof(args->rkey->bus_id)) == 0) &&
           xfer_shm_gather_ready(iface);
}

static int copies_gathered(xfer_iface_h iface, const xfer_batch_args_t *args)
{
    xfer_cu_ptr_t dst, src;
    int res = 0;

    for (size_t i = 0; (i < args->count) && (res == 0); i++) {
        batch_ends(args, &args->iov[i], &dst, &src);
        res = xfer_shm_gather_add(iface, dst, src, args->iov[i].length);
    }
    return xfer_shm_gather_end(iface, res);
}

xfer_status_t xfer_shm_cuda_batch(xfer_ep_h ep, xfer_batch_args_t *args)
{
    xfer_shm_cuda_t *c = &ep->iface->cuda;
    const xfer_cuda_driver_t *drv;
    char err[XFER_REASON_MAX];
    xfer_status_t status;
    size_t first = 0;
    void *saved;
    int res = 0;

    drv = copies_begin(ep, args->memh, args->rkey, &saved, &status);
    if (drv == NULL) {
        return status;
    }
    if (gather_fits(ep->iface, args)) {
        return copies_end(ep, drv, copies_gathered(ep->iface, args), saved);
    }
    if (ep->iface->cfg->cuda_batch_copy && !c->batch_refused &&
        XFER_CUDA_DRIVER_HAS(drv, memcpy_batch_async)) {
        res = copies_batched(drv, ep->iface, args, &first);
        if (res != 0) {
            /* not for these pointers, or not on this platform: the rest one by one, from
             * now on every batch (what the failed call started lands before they run) */
            xfer_log(XFER_LOG_INFO, XFER_SHM_SUBSYS, "cuMemcpyBatchAsync refused a batch to "
                     "or from pid %d (%s): its copies go one cuMemcpyAsync each",
                     (int)ep->peer_pid, xfer_cuda_result_string(res, err, sizeof(err)));
            (void)drv->stream_synchronize(c->stream);
            c->batch_refused = 1;
            res = 0;
        }
    }
    for (size_t i = first; (i < args->count) && (res == 0); i++) {
        const xfer_batch_iov_t *v = &args->iov[i];

        if (v->length > 0) {
            res = copy_start(drv, ep->iface, args->is_put, v->local,
                             remote_ptr(args->rkey, v->remote), v->length);
        }
    }
    return copies_end(ep, drv, res, saved);
}
