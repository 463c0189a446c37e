/*
 * The stand-in framework of rkey_env.h.
 */
#include "rkey_env.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static xfer_status_t part_rkey_pack(xfer_iface_h iface, xfer_memh_h memh, void *buf,
                                    size_t *len_p)
{
    rkey_env_part_t *part = (rkey_env_part_t*)iface;

    (void)memh;
    if (*len_p < part->blob_len) {
        *len_p = part->blob_len;
        return XFER_ERR_NO_RESOURCE;
    }
    memcpy(buf, part->blob, part->blob_len);
    *len_p = part->blob_len;
    return XFER_OK;
}

static xfer_status_t part_rkey_unpack(xfer_iface_h iface, const void *buf, size_t len,
                                      xfer_rkey_h *rkey_p)
{
    rkey_env_part_t *part = (rkey_env_part_t*)iface;
    xfer_rkey_h rkey      = malloc(1);     /* a leak here shows as one in the harness */

    if (rkey == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    part->env->seen     = buf;
    part->env->seen_len = len;
    *rkey_p             = rkey;
    return XFER_OK;
}

static void part_rkey_release(xfer_iface_h iface, xfer_rkey_h rkey)
{
    (void)iface;
    free(rkey);
}

void rkey_env_init(rkey_env_t *env, uint64_t ctx_id, unsigned num)
{
    xfer_component_entry_t *entries = env->entries;

    if (entries == NULL) {
        entries = calloc(RKEY_ENV_MAX_PARTS, sizeof(*entries));
        if (entries == NULL) {
            fprintf(stderr, "rkey_env: out of memory\n");
            abort();
        }
    }
    memset(env, 0, sizeof(*env));
    env->entries          = entries;
    env->ctx.serialized   = 1;                  /* one thread: no context lock */
    env->ctx.id           = ctx_id;
    env->ctx.ifaces       = env->ifaces;
    env->ctx.num_ifaces   = num;
    ucs_list_head_init(&env->ctx.rkeys);
    ucs_list_head_init(&env->ctx.mems);
    env->comp.rkey_pack    = part_rkey_pack;
    env->comp.rkey_unpack  = part_rkey_unpack;
    env->comp.rkey_release = part_rkey_release;
    for (unsigned i = 0; i < RKEY_ENV_MAX_PARTS; i++) {
        env->parts[i].env     = env;
        env->entries[i].name  = env->parts[i].name;
        env->ifaces[i].entry  = &env->entries[i];
        env->ifaces[i].comp   = &env->comp;
        env->ifaces[i].iface  = (xfer_iface_h)&env->parts[i];
        env->ifaces[i].index  = i;
    }
    env->mem.ctx  = &env->ctx;
    env->mem.memh = env->memh;
    env->ep.ctx   = &env->ctx;
}

void rkey_env_cleanup(rkey_env_t *env)
{
    free(env->entries);
    env->entries = NULL;
}

xfer_status_t rkey_env_pack(rkey_env_t *env, uint64_t addr, uint64_t length, void **blob_p,
                            size_t *len_p)
{
    for (unsigned i = 0; i < RKEY_ENV_MAX_PARTS; i++) {
        env->memh[i] = env->parts[i].registered ? (xfer_memh_h)&env->parts[i] : NULL;
    }
    env->mem.addr   = (void*)(uintptr_t)addr;
    env->mem.length = (size_t)length;
    return xfer_rkey_pack(&env->mem, blob_p, len_p);
}

xfer_status_t rkey_env_unpack(rkey_env_t *env, const char *transport, uint64_t peer_id,
                              const void *blob, size_t len, xfer_rkey_t **rkey_p)
{
    env->ep.fw_iface = &env->ifaces[0];
    env->ep.peer_id  = peer_id;
    snprintf(env->ep.transport, sizeof(env->ep.transport), "%s", transport);
    snprintf(env->ep.peer, sizeof(env->ep.peer), "fuzz peer");
    env->seen     = NULL;
    env->seen_len = 0;
    return xfer_rkey_unpack(&env->ep, blob, len, rkey_p);
}
