/*
 * A gdr interface is a verbs interface (verbs_adapter.c opens it with the verbs part of gdr's
 * config) with gdr's state hung on it: the registration strategy for CUDA memory (gdr_mem.c)
 * and the flush QP (gdr_flush.c), made on the first registration that needs it. Host memory
 * is registered exactly as verbs registers it. The verbs code reaches gdr through
 * iface->devmem where it would touch GPU memory with the CPU or complete a transfer into it.
 */
#include "gdr.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct gdr_state {
    const xfer_gdr_config_t *cfg;
    xfer_gdr_mem_t          mem;
    xfer_gdr_flush_t        *flush;     /* NULL until a registration needs it */
    unsigned                declined;   /* registrations left to staging */
} gdr_state_t;

static gdr_state_t *state_of(xfer_iface_h iface)
{
    return iface->devmem_arg;
}

/* ---- the hooks the verbs code calls -------------------------------------------------------- */

static xfer_status_t devmem_landed(xfer_iface_h iface, xfer_memh_h memh, void *buf, size_t len)
{
    const xfer_gdr_memh_t *info = memh->devmem;
    gdr_state_t *st             = state_of(iface);
    char why[XFER_REASON_MAX];

    (void)len;
    if (!info->flush) {
        return XFER_OK;
    }
    if (xfer_gdr_flush_run(st->flush, (uintptr_t)buf, memh->mr->rkey, why, sizeof(why)) !=
        XFER_OK) {
        xfer_log(XFER_LOG_ERROR, XFER_GDR_SUBSYS, "data written into GPU %d memory at %p "
                 "cannot be flushed: %s", info->device, buf, why);
        return XFER_ERR_IO;
    }
    return XFER_OK;
}

static xfer_status_t devmem_copy_in(xfer_iface_h iface, xfer_memh_h memh, void *dst,
                                    const void *src, size_t len)
{
    const xfer_gdr_memh_t *info = memh->devmem;
    const xfer_cuda_driver_t *drv;
    void *prev = NULL, *ctx = info->cuda_context;
    char why[XFER_REASON_MAX];
    int res, retained = 0;

    (void)iface;
    drv = xfer_cuda_driver(why, sizeof(why));
    if (drv == NULL) {
        xfer_log(XFER_LOG_ERROR, XFER_GDR_SUBSYS, "cannot copy a message into GPU memory: %s",
                 why);
        return XFER_ERR_UNAVAILABLE;
    }
    if (drv->ctx_get_current(&prev) != 0) {
        prev = NULL;
    }
    if ((ctx == NULL) && (drv->device_primary_ctx_retain(&ctx, info->device) == 0)) {
        retained = 1;
    }
    res = drv->ctx_set_current(ctx);
    if (res == 0) {
        res = drv->memcpy_htod((xfer_cu_ptr_t)(uintptr_t)dst, src, len);
    }
    drv->ctx_set_current(prev);
    if (retained) {
        drv->device_primary_ctx_release(info->device);
    }
    if (res != 0) {
        xfer_log(XFER_LOG_ERROR, XFER_GDR_SUBSYS, "copying a %zu-byte message into GPU %d "
                 "memory at %p: %s", len, info->device, dst,
                 xfer_cuda_result_string(res, why, sizeof(why)));
        return XFER_ERR_IO;
    }
    return XFER_OK;
}

static xfer_status_t devmem_unregistered(xfer_iface_h iface, const void *buf, size_t len)
{
    char why[XFER_REASON_MAX];
    xfer_mem_attr_t attr;

    (void)iface;
    if (xfer_mem_detect(buf, len, &attr, why, sizeof(why)) != XFER_OK) {
        xfer_log(XFER_LOG_ERROR, XFER_GDR_SUBSYS, "buffer %p+%zu: %s", buf, len, why);
        return XFER_ERR_INVALID_PARAM;
    }
    if (attr.type == XFER_MEM_CUDA) {
        /* the MR cache finds registrations by address and learns of host unmappings only; a
         * device buffer freed and allocated again at the same address would meet the old one */
        xfer_log(XFER_LOG_ERROR, XFER_GDR_SUBSYS, "buffer %p+%zu is CUDA memory of GPU %d and "
                 "was not registered: register it with xfer_mem_register first (gdr keeps no "
                 "cache of device registrations it was not given)", buf, len,
                 attr.cuda_device);
        return XFER_ERR_INVALID_PARAM;
    }
    return XFER_OK;
}

static const xfer_verbs_devmem_ops_t gdr_devmem_ops = {
    .landed       = devmem_landed,
    .copy_in      = devmem_copy_in,
    .unregistered = devmem_unregistered,
};

/* ---- interface ----------------------------------------------------------------------------- */

xfer_status_t xfer_gdr_iface_open(const void *config, const xfer_iface_params_t *params,
                                  xfer_iface_h *iface_p)
{
    const xfer_gdr_config_t *cfg = config;
    xfer_iface_h iface;
    xfer_status_t status;
    gdr_state_t *st;

    st = calloc(1, sizeof(*st));
    if (st == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    status = xfer_verbs_iface_open(&cfg->verbs, params, &iface);
    if (status != XFER_OK) {
        free(st);
        return status;
    }
    st->cfg = cfg;
    xfer_gdr_mem_init(&st->mem, iface->pd, iface->dev_name, cfg);
    xfer_log(XFER_LOG_DEBUG, XFER_GDR_SUBSYS, "%s: DMA-BUF %s%s; peermem %s%s", iface->dev_name,
             st->mem.nic_dmabuf ? "accepted" : "no: ", st->mem.nic_dmabuf ? "" : st->mem.nic_why,
             st->mem.peermem ? "loaded" : "no: ", st->mem.peermem ? "" : st->mem.peermem_why);
    iface->devmem     = &gdr_devmem_ops;
    iface->devmem_arg = st;
    *iface_p          = iface;
    return XFER_OK;
}

void xfer_gdr_iface_close(xfer_iface_h iface)
{
    gdr_state_t *st = state_of(iface);

    xfer_gdr_flush_destroy(st->flush);  /* before the verbs side frees the PD */
    xfer_verbs_iface_close(iface);
    free(st);
}

/* The flush QP, made when the first registration needs it. */
static xfer_status_t flush_ready(xfer_iface_h iface, gdr_state_t *st, char *why,
                                 size_t why_size)
{
    xfer_gdr_flush_params_t fp;
    double bound = st->cfg->verbs.timeout * (double)(st->cfg->verbs.retry_count + 1);

    if (st->flush != NULL) {
        return XFER_OK;
    }
    fp.ctx       = iface->ctx;
    fp.pd        = iface->pd;
    fp.port      = iface->port;
    fp.gid_index = iface->gid_index;
    fp.port_attr = &iface->port_attr;
    fp.timeout   = (bound > 1.0) ? bound : 1.0;
    return xfer_gdr_flush_create(&fp, &st->flush, why, why_size);
}

xfer_status_t xfer_gdr_mem_reg_params(xfer_iface_h iface, const xfer_mem_reg_params_t *params,
                                      xfer_memh_h *memh_p)
{
    gdr_state_t *st = state_of(iface);
    char why[XFER_REASON_MAX];
    xfer_gdr_memh_t *info;
    xfer_memh_h memh;
    xfer_status_t status;
    struct ibv_mr *mr;

    if (params->attr->type != XFER_MEM_CUDA) {
        return xfer_verbs_mem_reg(iface, params->addr, params->length, XFER_MEM_HOST, memh_p);
    }
    memh = calloc(1, sizeof(*memh));
    info = calloc(1, sizeof(*info));
    if ((memh == NULL) || (info == NULL)) {
        free(memh);
        free(info);
        return XFER_ERR_NO_MEMORY;
    }
    status = xfer_gdr_mem_reg(&st->mem, params, &mr, info, why, sizeof(why));
    if ((status == XFER_OK) && info->flush) {
        status = flush_ready(iface, st, why, sizeof(why));
        if (status != XFER_OK) {
            ibv_dereg_mr(mr);
            status = XFER_ERR_UNSUPPORTED;  /* unflushed data would be unsafe: stage it */
        }
    }
    if (status != XFER_OK) {
        /* the first time says it as a warning, later ones at info: one line each */
        xfer_log((st->declined++ == 0) ? XFER_LOG_WARN : XFER_LOG_INFO, XFER_GDR_SUBSYS,
                 "gdr does not take %zu bytes of GPU %d memory at %p (%s): %s",
                 params->length, params->attr->cuda_device, params->addr,
                 (status == XFER_ERR_UNSUPPORTED) ? "staged through host memory instead" :
                 xfer_status_string(status), why);
        free(memh);
        free(info);
        return status;
    }
    xfer_log(XFER_LOG_DEBUG, XFER_GDR_SUBSYS, "%zu bytes of GPU %d memory at %p (buffer id "
             "%llu) registered by %s, flush %s", params->length, info->device, params->addr,
             (unsigned long long)info->buffer_id, info->how, info->flush ? "on" : "off");
    memh->mr     = mr;
    memh->devmem = info;
    *memh_p      = memh;
    return XFER_OK;
}

void xfer_gdr_mem_dereg(xfer_iface_h iface, xfer_memh_h memh)
{
    free(memh->devmem);
    memh->devmem = NULL;
    xfer_verbs_mem_dereg(iface, memh);
}
