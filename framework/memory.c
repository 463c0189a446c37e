/*
 * Memory registration and remote keys.
 *
 * A buffer is registered with every open transport, so any endpoint can use it. Its packed
 * remote key is self-describing and carries the owner context's id and the buffer's bounds,
 * then one blob per transport:
 *
 *   rkey := magic:u32 ("XRK1") num:u8 owner_id:u64 addr:u64 length:u64
 *           { name_len:u8 name[name_len] blob_len:u16 blob[blob_len] } * num
 *
 * (big-endian). Unpacking checks every length, that the owner is the endpoint's peer and that
 * the endpoint's transport has a blob, before the component sees its part.
 *
 * Before any transport sees a buffer, its type is found (mem_type.c) and checked against the
 * one the caller gave; the registration keeps what was found (for CUDA memory the device,
 * context, buffer id and allocation) and hands it to transports that take it.
 *
 * xfer_mem_alloc() memory lives in a memfd sealed against shrinking and growing, so that a
 * same-host peer can map it without the owner being able to pull pages from under the
 * mapping (a SIGBUS in the peer). Only the allocation's own registration offers the memfd:
 * its end frees the memory, so a peer that still maps it writes pages that no longer belong
 * to this process. A range inside it registered again is registered like any other memory -
 * its deregistration leaves the memory in use here, where a mapping peer must not write.
 */
#include "xfer_int.h"
#include "cuda_driver.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MEM_SUBSYS   "memory"
#define RKEY_MAGIC   0x58524b31u    /* "XRK1" */
#define RKEY_MAX_BLOB 1024u

int xfer_mem_covers(const xfer_mem_t *mem, const void *buf, size_t length)
{
    uintptr_t start = (uintptr_t)mem->addr, p = (uintptr_t)buf;

    return (p >= start) && (p - start <= mem->length) && (length <= mem->length - (p - start));
}

static void mem_dereg_all(xfer_mem_t *mem)
{
    xfer_context_t *ctx = mem->ctx;

    for (unsigned i = 0; i < ctx->num_ifaces; i++) {
        if ((mem->memh[i] != NULL) && (ctx->ifaces[i].comp->mem_dereg != NULL)) {
            ctx->ifaces[i].comp->mem_dereg(ctx->ifaces[i].iface, mem->memh[i]);
        }
    }
    if (mem->alloc_length > 0) {
        munmap(mem->addr, mem->alloc_length);
    }
    if (mem->fd >= 0) {
        close(mem->fd);
    }
    free(mem->memh);
    free(mem);
}

static const char *mem_type_name(xfer_mem_type_t type)
{
    switch (type) {
    case XFER_MEM_HOST: return "XFER_MEM_HOST";
    case XFER_MEM_CUDA: return "XFER_MEM_CUDA";
    default:            return "XFER_MEM_AUTO";
    }
}

/* Find what the range is and check it against what the caller said; attr_p gets the type
 * resolved. Only a registration that says CUDA loads and initialises the driver. */
static xfer_status_t mem_resolve(void *addr, size_t length, xfer_mem_type_t type,
                                 xfer_mem_attr_t *attr_p)
{
    char why[XFER_REASON_MAX];
    xfer_mem_attr_t attr;
    xfer_status_t status;

    if (type == XFER_MEM_CUDA) {
        status = xfer_cuda_init(why, sizeof(why));
        if (status != XFER_OK) {
            xfer_refuse(MEM_SUBSYS, "cannot register %zu bytes at %p as "
                        "XFER_MEM_CUDA: %s", length, addr, why);
            return status;
        }
    }
    status = xfer_mem_detect(addr, length, &attr, why, sizeof(why));
    if (status != XFER_OK) {
        xfer_refuse(MEM_SUBSYS, "cannot register %zu bytes at %p as %s: %s",
                    length, addr, mem_type_name(type), why);
        return status;
    }
    if ((type != XFER_MEM_AUTO) && (type != attr.type)) {
        xfer_refuse(MEM_SUBSYS, "cannot register %zu bytes at %p as %s: it is %s "
                    "(%s); register it as %s or XFER_MEM_AUTO", length, addr, mem_type_name(type),
                    (attr.type == XFER_MEM_CUDA) ? "CUDA device memory" : "host memory", attr.how,
                    mem_type_name(attr.type));
        return XFER_ERR_INVALID_PARAM;
    }
    if (attr.type == XFER_MEM_CUDA) {
        status = xfer_cuda_sync_memops(&attr, why, sizeof(why));
        if (status != XFER_OK) {
            xfer_refuse(MEM_SUBSYS, "cannot register %zu bytes at %p: %s", length,
                        addr, why);
            return status;
        }
    }
    xfer_log(XFER_LOG_DEBUG, MEM_SUBSYS, "%zu bytes at %p are %s: %s", length, addr,
             mem_type_name(attr.type), attr.how);
    *attr_p = attr;
    return XFER_OK;
}

/* Memory a transport cannot touch (CUDA memory, where the transport lacks
 * XFER_CAP_MEM_CUDA) is registered only with the transports that move it; the others stage
 * puts and gets of it through host buffers (staging.c). It is refused when no open
 * transport does either. */
static xfer_status_t mem_check_staged_ifaces(xfer_context_t *ctx, const xfer_mem_attr_t *attr)
{
    unsigned usable = 0;

    for (unsigned i = 0; i < ctx->num_ifaces; i++) {
        uint64_t caps = ctx->ifaces[i].entry->attr.caps;

        usable += ((caps & (XFER_CAP_MEM_CUDA | XFER_CAP_RMA_CUDA)) &&
                   (attr->type == XFER_MEM_CUDA)) || (caps & (XFER_CAP_PUT | XFER_CAP_GET));
    }
    if (usable == 0) {
        xfer_refuse(MEM_SUBSYS, "cannot register %s memory (%s): no open "
                    "transport moves it or has put/get to stage it through host memory "
                    "(xfer_info -s says why)", (attr->type == XFER_MEM_CUDA) ? "CUDA" : "staged",
                    attr->how);
        return XFER_ERR_UNSUPPORTED;
    }
    return XFER_OK;
}

/* Whether transport fi is asked to take a registration of mem itself (else staging.c moves
 * it): CUDA memory goes to the transports that move it (MEM_CUDA) or put and get it
 * (RMA_CUDA: shm by CUDA IPC; its messages are still staged, xfer_msg_staged()). One may
 * still decline a buffer (XFER_ERR_UNSUPPORTED: no way to register it with its device, no
 * IPC handle for it), which is then staged there too. */
static int mem_iface_direct(const xfer_fw_iface_t *fi, const xfer_mem_t *mem)
{
    if (!mem->staged) {
        return 1;
    }
    return (mem->attr.type == XFER_MEM_CUDA) &&
           (fi->entry->attr.caps & (XFER_CAP_MEM_CUDA | XFER_CAP_RMA_CUDA));
}

static xfer_status_t mem_reg_iface(xfer_fw_iface_t *fi, xfer_mem_t *mem, xfer_memh_h *memh_p)
{
    xfer_mem_reg_params_t params;

    if (fi->comp->mem_reg_params == NULL) {
        return fi->comp->mem_reg(fi->iface, mem->addr, mem->length, mem->attr.type, memh_p);
    }
    params.size   = sizeof(params);
    params.addr   = mem->addr;
    params.length = mem->length;
    params.attr   = &mem->attr;
    params.fd        = mem->fd;
    params.fd_offset = 0;     /* xfer_mem_alloc maps its memfd whole */
    return fi->comp->mem_reg_params(fi->iface, &params, memh_p);
}

/* Register [addr, addr + length). alloc_fd >= 0: the memfd of xfer_mem_alloc() holding it
 * whole, alloc_length bytes mapped at addr; the registration owns both once it succeeds. */
static xfer_status_t mem_register(xfer_context_t *ctx, const char *func, void *addr,
                                  size_t length, xfer_mem_type_t type, int alloc_fd,
                                  size_t alloc_length, xfer_mem_t **mem_p)
{
    xfer_status_t status = XFER_OK;
    xfer_mem_attr_t attr;
    xfer_mem_t *mem;

    if ((ctx == NULL) || (addr == NULL) || (length == 0) || (mem_p == NULL)) {
        xfer_refuse(MEM_SUBSYS, "%s: %s", func,
                    (length == 0) ? "length is 0" : "NULL argument");
        return XFER_ERR_INVALID_PARAM;
    }
    if ((type != XFER_MEM_HOST) && (type != XFER_MEM_CUDA) && (type != XFER_MEM_AUTO)) {
        xfer_refuse(MEM_SUBSYS, "%s: unknown memory type %d", func, (int)type);
        return XFER_ERR_INVALID_PARAM;
    }
    status = mem_resolve(addr, length, type, &attr);
    if (status != XFER_OK) {
        return status;
    }
    mem = calloc(1, sizeof(*mem));
    if (mem == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    xfer_ctx_lock(ctx);
    status = xfer_api_check(ctx, func, 1);
    if (status != XFER_OK) {
        goto err_unlock;
    }
    mem->fd           = alloc_fd;
    mem->alloc_length = alloc_length;
    /* CUDA memory, and host memory under the suites' hook (staging_test.h) */
    mem->staged = (attr.type == XFER_MEM_CUDA) || ctx->staging_host;
    if (mem->staged) {
        status = mem_check_staged_ifaces(ctx, &attr);
        if (status != XFER_OK) {
            goto err_unlock;
        }
    }
    mem->memh = calloc(ctx->num_ifaces + 1, sizeof(*mem->memh));
    if (mem->memh == NULL) {
        status = XFER_ERR_NO_MEMORY;
        goto err_unlock;
    }
    mem->ctx    = ctx;
    mem->addr   = addr;
    mem->length = length;
    mem->attr   = attr;
    for (unsigned i = 0; i < ctx->num_ifaces; i++) {
        xfer_fw_iface_t *fi = &ctx->ifaces[i];

        if ((fi->comp->mem_reg == NULL) && (fi->comp->mem_reg_params == NULL)) {
            continue;
        }
        if (!mem_iface_direct(fi, mem)) {
            continue;
        }
        status = mem_reg_iface(fi, mem, &mem->memh[i]);
        if ((status == XFER_ERR_UNSUPPORTED) && mem->staged) {
            /* a transport that moves CUDA memory where it can (gdr) but not this memory: it
             * logged why, and its puts and gets of it are staged as on tcp and verbs */
            xfer_log(XFER_LOG_INFO, MEM_SUBSYS, "%s does not take %zu bytes at %p (%s): "
                     "staged through host memory there", fi->entry->name, length, addr,
                     attr.how);
            mem->memh[i] = NULL;
            status       = XFER_OK;
            continue;
        }
        if (status != XFER_OK) {
            xfer_refuse(MEM_SUBSYS, "%s cannot register %zu bytes at %p: %s",
                        fi->entry->name, length, addr, xfer_status_string(status));
            mem->memh[i] = NULL;
            goto err_dereg;
        }
    }
    ucs_list_add_tail(&ctx->mems, &mem->list);
    xfer_ctx_unlock(ctx);
    *mem_p = mem;
    return XFER_OK;

err_dereg:
    if (alloc_fd >= 0) {
        /* the caller keeps what it passed */
        mem->fd           = -1;
        mem->alloc_length = 0;
    }
    mem_dereg_all(mem);
    xfer_ctx_unlock(ctx);
    return status;

err_unlock:
    xfer_ctx_unlock(ctx);
    free(mem);
    return status;
}

xfer_status_t xfer_mem_register(xfer_context_t *ctx, void *addr, size_t length,
                                xfer_mem_type_t type, xfer_mem_t **mem_p)
{
    return mem_register(ctx, "xfer_mem_register", addr, length, type, -1, 0, mem_p);
}

int xfer_memfd_sealed(const char *name, size_t length, char *why, size_t why_size)
{
    const char *what = NULL;
    int fd           = memfd_create(name, MFD_CLOEXEC | MFD_ALLOW_SEALING);

    if (fd < 0) {
        what = "memfd_create";
    } else if (ftruncate(fd, (off_t)length) != 0) {
        what = "ftruncate";
    } else if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        what = "F_ADD_SEALS";
    }
    if (what != NULL) {
        snprintf(why, why_size, "%s of a %zu-byte memfd: %s", what, length, strerror(errno));
        if (fd >= 0) {
            close(fd);
        }
        return -1;
    }
    return fd;
}

xfer_status_t xfer_mem_alloc(xfer_context_t *ctx, size_t length, xfer_mem_type_t type,
                             xfer_mem_t **mem_p)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    char why[XFER_REASON_MAX];
    xfer_status_t status;
    size_t alloc_length;
    void *addr;
    int fd;

    if ((ctx == NULL) || (length == 0) || (mem_p == NULL)) {
        xfer_refuse(MEM_SUBSYS, "xfer_mem_alloc: %s",
                    (length == 0) ? "length is 0" : "NULL argument");
        return XFER_ERR_INVALID_PARAM;
    }
    if ((type != XFER_MEM_HOST) && (type != XFER_MEM_AUTO)) {
        xfer_refuse(MEM_SUBSYS, "xfer_mem_alloc allocates host memory only (type "
                    "%d): allocate device memory with cuMemAlloc and register it", (int)type);
        return (type == XFER_MEM_CUDA) ? XFER_ERR_UNSUPPORTED : XFER_ERR_INVALID_PARAM;
    }
    if (length > SIZE_MAX - page) {
        xfer_refuse(MEM_SUBSYS, "xfer_mem_alloc: %zu bytes is too large", length);
        return XFER_ERR_INVALID_PARAM;
    }
    alloc_length = (length + page - 1) / page * page;
    fd = xfer_memfd_sealed("xfer-mem", alloc_length, why, sizeof(why));
    if (fd < 0) {
        xfer_refuse(MEM_SUBSYS, "xfer_mem_alloc of %zu bytes: %s", length, why);
        return XFER_ERR_NO_MEMORY;
    }
    addr = mmap(NULL, alloc_length, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED) {
        xfer_refuse(MEM_SUBSYS, "xfer_mem_alloc cannot map %zu bytes: %s",
                    alloc_length, strerror(errno));
        close(fd);
        return XFER_ERR_NO_MEMORY;
    }
    status = mem_register(ctx, "xfer_mem_alloc", addr, length, XFER_MEM_HOST, fd,
                          alloc_length, mem_p);
    if (status != XFER_OK) {
        munmap(addr, alloc_length);
        close(fd);
    }
    return status;
}

xfer_status_t xfer_mem_register_internal(xfer_context_t *ctx, void *addr, size_t length,
                                         xfer_mem_t **mem_p)
{
    xfer_mem_t *mem = calloc(1, sizeof(*mem));

    if (mem == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    mem->memh = calloc(ctx->num_ifaces + 1, sizeof(*mem->memh));
    if (mem->memh == NULL) {
        free(mem);
        return XFER_ERR_NO_MEMORY;
    }
    mem->ctx              = ctx;
    mem->addr             = addr;
    mem->length           = length;
    mem->fd               = -1;
    mem->attr.type        = XFER_MEM_HOST;
    mem->attr.cuda_device = -1;
    snprintf(mem->attr.how, sizeof(mem->attr.how), "xfer's staging buffers");
    ucs_list_head_init(&mem->list);
    for (unsigned i = 0; i < ctx->num_ifaces; i++) {
        xfer_fw_iface_t *fi = &ctx->ifaces[i];
        xfer_status_t status;

        if ((fi->comp->mem_reg == NULL) && (fi->comp->mem_reg_params == NULL)) {
            continue;
        }
        status = mem_reg_iface(fi, mem, &mem->memh[i]);
        if (status != XFER_OK) {
            xfer_refuse(MEM_SUBSYS, "%s cannot register %zu bytes of staging "
                        "buffers at %p: %s", fi->entry->name, length, addr,
                        xfer_status_string(status));
            mem->memh[i] = NULL;
            mem_dereg_all(mem);
            return status;
        }
    }
    *mem_p = mem;
    return XFER_OK;
}

void xfer_mem_deregister_internal(xfer_mem_t *mem)
{
    mem_dereg_all(mem);
}

xfer_status_t xfer_mem_deregister(xfer_mem_t *mem)
{
    xfer_context_t *ctx;

    if (mem == NULL) {
        return XFER_ERR_INVALID_PARAM;
    }
    ctx = mem->ctx;
    xfer_ctx_lock(ctx);
    if (xfer_api_check(ctx, "xfer_mem_deregister", 0) != XFER_OK) {
        xfer_ctx_unlock(ctx);
        return XFER_ERR_BUSY;
    }
    if (mem->busy > 0) {
        xfer_refuse(MEM_SUBSYS, "cannot deregister %p: %u operation(s) using it "
                    "are still outstanding", mem->addr, mem->busy);
        xfer_ctx_unlock(ctx);
        return XFER_ERR_BUSY;
    }
    ucs_list_del(&mem->list);
    mem_dereg_all(mem);
    xfer_ctx_unlock(ctx);
    return XFER_OK;
}

void xfer_mems_release_all(xfer_context_t *ctx)
{
    xfer_mem_t *mem, *tmp;

    ucs_list_for_each_safe(mem, tmp, &ctx->mems, list) {
        xfer_log(XFER_LOG_DEBUG, MEM_SUBSYS, "deregistering %p at context destroy", mem->addr);
        ucs_list_del(&mem->list);
        mem_dereg_all(mem);
    }
}

void *xfer_mem_address(const xfer_mem_t *mem)
{
    return mem ? mem->addr : NULL;
}

size_t xfer_mem_length(const xfer_mem_t *mem)
{
    return mem ? mem->length : 0;
}

xfer_mem_type_t xfer_mem_type(const xfer_mem_t *mem)
{
    return mem ? mem->attr.type : XFER_MEM_HOST;
}

/* ---- packing ---- */

static uint8_t *put_be(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = bytes - 1; i >= 0; i--, v >>= 8) {
        p[i] = (uint8_t)v;
    }
    return p + bytes;
}

static int take_be(const uint8_t **p, size_t *left, int bytes, uint64_t *v)
{
    if (*left < (size_t)bytes) {
        return 0;
    }
    *v = 0;
    for (int i = 0; i < bytes; i++) {
        *v = (*v << 8) | (*p)[i];
    }
    *p    += bytes;
    *left -= (size_t)bytes;
    return 1;
}

xfer_status_t xfer_rkey_pack(xfer_mem_t *mem, void **blob_p, size_t *length_p)
{
    xfer_context_t *ctx;
    uint8_t *buf, *p;
    size_t size;
    unsigned num = 0;

    if ((mem == NULL) || (blob_p == NULL) || (length_p == NULL)) {
        return XFER_ERR_INVALID_PARAM;
    }
    ctx = mem->ctx;
    xfer_ctx_lock(ctx);
    size = 4 + 1 + 24 + ctx->num_ifaces * (1 + XFER_NAME_MAX + 2 + RKEY_MAX_BLOB);
    buf  = malloc(size);
    if (buf == NULL) {
        xfer_ctx_unlock(ctx);
        return XFER_ERR_NO_MEMORY;
    }
    p = put_be(buf, RKEY_MAGIC, 4);
    p = put_be(p, 0, 1);                /* patched below */
    p = put_be(p, ctx->id, 8);
    p = put_be(p, (uintptr_t)mem->addr, 8);
    p = put_be(p, mem->length, 8);
    for (unsigned i = 0; i < ctx->num_ifaces; i++) {
        xfer_fw_iface_t *fi = &ctx->ifaces[i];
        size_t name_len     = strlen(fi->entry->name), blob_len = RKEY_MAX_BLOB;
        uint8_t *name_at    = p;
        xfer_status_t status;

        if ((mem->memh[i] == NULL) || (fi->comp->rkey_pack == NULL)) {
            continue;
        }
        p = put_be(p, name_len, 1);
        memcpy(p, fi->entry->name, name_len);
        p += name_len;
        status = fi->comp->rkey_pack(fi->iface, mem->memh[i], p + 2, &blob_len);
        if ((status != XFER_OK) || (blob_len > RKEY_MAX_BLOB)) {
            xfer_log(XFER_LOG_WARN, MEM_SUBSYS, "%s cannot pack a remote key: %s",
                     fi->entry->name, xfer_status_string(status));
            p = name_at;
            continue;
        }
        put_be(p, blob_len, 2);
        p += 2 + blob_len;
        num++;
    }
    if ((num == 0) && mem->staged) {
        /* no transport has it: a peer's put or get would find nothing to address */
        xfer_refuse(MEM_SUBSYS, "cannot pack a remote key for %zu bytes at %p "
                    "(%s): no open transport moves this memory itself, and staging serves only "
                    "the local buffer of a put or get, never the remote one", mem->length,
                    mem->addr, mem->attr.how);
        xfer_ctx_unlock(ctx);
        free(buf);
        return XFER_ERR_UNSUPPORTED;
    }
    buf[4] = (uint8_t)num;
    xfer_ctx_unlock(ctx);
    *blob_p   = buf;
    *length_p = (size_t)(p - buf);
    return XFER_OK;
}

void xfer_rkey_blob_free(void *blob)
{
    free(blob);
}

xfer_status_t xfer_rkey_unpack(xfer_endpoint_t *ep, const void *blob, size_t length,
                               xfer_rkey_t **rkey_p)
{
    const uint8_t *p = blob, *part = NULL;
    uint64_t magic, num, owner, addr, len, part_len = 0;
    size_t left      = length;
    xfer_context_t *ctx;
    xfer_status_t status;
    xfer_rkey_t *rkey;

    if ((ep == NULL) || (blob == NULL) || (rkey_p == NULL)) {
        return XFER_ERR_INVALID_PARAM;
    }
    ctx = ep->ctx;
    if (!take_be(&p, &left, 4, &magic) || (magic != RKEY_MAGIC) ||
        !take_be(&p, &left, 1, &num) || !take_be(&p, &left, 8, &owner) ||
        !take_be(&p, &left, 8, &addr) || !take_be(&p, &left, 8, &len)) {
        xfer_refuse(MEM_SUBSYS, "remote key blob of %zu bytes is not an xfer "
                    "remote key (bad magic or too short)", length);
        return XFER_ERR_INVALID_PARAM;
    }
    if (owner != ep->peer_id) {
        xfer_refuse(MEM_SUBSYS, "remote key belongs to context %016llx, but the "
                    "peer of this endpoint (%s) is context %016llx",
                    (unsigned long long)owner, ep->peer, (unsigned long long)ep->peer_id);
        return XFER_ERR_INVALID_PARAM;
    }
    if (addr + len < addr) {
        xfer_refuse(MEM_SUBSYS, "remote key bounds wrap around");
        return XFER_ERR_INVALID_PARAM;
    }
    /* Walk every part first: the blob must be well formed to its last byte. */
    for (uint64_t i = 0; i < num; i++) {
        uint64_t name_len, blob_len;
        char name[XFER_NAME_MAX];

        if (!take_be(&p, &left, 1, &name_len) || (name_len == 0) ||
            (name_len >= sizeof(name)) || (left < name_len)) {
            goto malformed;
        }
        memcpy(name, p, name_len);
        name[name_len] = '\0';
        p    += name_len;
        left -= name_len;
        if (!take_be(&p, &left, 2, &blob_len) || (left < blob_len)) {
            goto malformed;
        }
        if (strcmp(name, ep->transport) == 0) {
            part     = p;
            part_len = blob_len;
        }
        p    += blob_len;
        left -= blob_len;
    }
    if (left != 0) {
        goto malformed;
    }
    if (part == NULL) {
        /* memory.c registers CUDA memory only with the transports that move it or put and
         * get it (MEM_CUDA, RMA_CUDA) */
        xfer_refuse(MEM_SUBSYS, "remote key has no part for transport %s: the "
                    "peer's buffer is not registered with it (CUDA memory is registered only "
                    "with transports that move CUDA memory or put and get it by IPC; staging "
                    "serves the local buffer of a put or get, not the remote one)",
                    ep->transport);
        return XFER_ERR_INVALID_PARAM;
    }
    rkey = calloc(1, sizeof(*rkey));
    if (rkey == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    xfer_ctx_lock(ctx);
    status = (ep->fw_iface->comp->rkey_unpack == NULL) ? XFER_ERR_UNSUPPORTED :
             ep->fw_iface->comp->rkey_unpack(ep->fw_iface->iface, part, part_len, &rkey->rkey);
    xfer_ctx_unlock(ctx);
    if (status != XFER_OK) {
        xfer_refuse(MEM_SUBSYS, "%s refused the remote key: %s", ep->transport,
                    xfer_status_string(status));
        free(rkey);
        return status;
    }
    rkey->ctx      = ctx;
    rkey->fw_iface = ep->fw_iface;
    rkey->owner_id = owner;
    rkey->addr     = addr;
    rkey->length   = len;
    xfer_ctx_lock(ctx);
    ucs_list_add_tail(&ctx->rkeys, &rkey->list);
    xfer_ctx_unlock(ctx);
    *rkey_p        = rkey;
    return XFER_OK;

malformed:
    xfer_refuse(MEM_SUBSYS, "remote key blob of %zu bytes is malformed (a part "
                "runs past its end, or bytes trail it)", length);
    return XFER_ERR_INVALID_PARAM;
}

uint64_t xfer_rkey_address(const xfer_rkey_t *rkey)
{
    return rkey ? rkey->addr : 0;
}

size_t xfer_rkey_length(const xfer_rkey_t *rkey)
{
    return rkey ? rkey->length : 0;
}

static void rkey_free(xfer_rkey_t *rkey)
{
    ucs_list_del(&rkey->list);
    if (rkey->fw_iface->comp->rkey_release != NULL) {
        rkey->fw_iface->comp->rkey_release(rkey->fw_iface->iface, rkey->rkey);
    }
    free(rkey);
}

void xfer_rkey_destroy(xfer_rkey_t *rkey)
{
    xfer_context_t *ctx;

    if (rkey == NULL) {
        return;
    }
    ctx = rkey->ctx;
    xfer_ctx_lock(ctx);
    if (rkey->busy > 0) {
        rkey->destroyed = 1;    /* a staged operation posts with it still; it frees it */
    } else {
        rkey_free(rkey);
    }
    xfer_ctx_unlock(ctx);
}

void xfer_rkey_put(xfer_rkey_t *rkey)
{
    if ((--rkey->busy == 0) && rkey->destroyed) {
        rkey_free(rkey);
    }
}

void xfer_rkeys_release_all(xfer_context_t *ctx)
{
    xfer_rkey_t *rkey, *tmp;

    ucs_list_for_each_safe(rkey, tmp, &ctx->rkeys, list) {
        rkey_free(rkey);
    }
}
