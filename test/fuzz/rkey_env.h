/*
 * A minimal framework around framework/memory.c for the remote-key blob: a context whose
 * transports are stand-ins that pack a given blob and record what unpack hands them, a
 * registered buffer and an endpoint. memory.c's own xfer_rkey_pack and xfer_rkey_unpack run
 * on it unchanged; only the transports are not real, because the blob's framing is what is
 * under test and any transport's part is opaque bytes to it. Used by the fuzz_rkey harness
 * and the seed generator.
 */
#ifndef XFER_FUZZ_RKEY_ENV_H
#define XFER_FUZZ_RKEY_ENV_H

#include "../../framework/xfer_int.h"

#define RKEY_ENV_OWNER     0x0123456789abcdefull   /* the peer context the seeds name */
#define RKEY_ENV_MAX_PARTS 4u
#define RKEY_ENV_MAX_BLOB  1024u                   /* what memory.c packs per transport */

typedef struct rkey_env rkey_env_t;

typedef struct rkey_env_part {
    rkey_env_t *env;
    char       name[XFER_NAME_MAX];
    int        registered;                 /* the buffer is registered with it: packed */
    uint8_t    blob[RKEY_ENV_MAX_BLOB];
    size_t     blob_len;
} rkey_env_part_t;

struct rkey_env {
    xfer_context_t         ctx;
    xfer_fw_iface_t        ifaces[RKEY_ENV_MAX_PARTS];
    xfer_component_entry_t *entries;       /* RKEY_ENV_MAX_PARTS, on the heap: they are big */
    xfer_component_v1_t    comp;
    rkey_env_part_t        parts[RKEY_ENV_MAX_PARTS];
    xfer_memh_h            memh[RKEY_ENV_MAX_PARTS];
    xfer_mem_t             mem;
    xfer_endpoint_t        ep;
    /* what the transport's rkey_unpack was handed last */
    const uint8_t          *seen;
    size_t                 seen_len;
};

/* A context of num transports (names and blobs in parts[] to be filled by the caller). */
void rkey_env_init(rkey_env_t *env, uint64_t ctx_id, unsigned num);
void rkey_env_cleanup(rkey_env_t *env);
/* xfer_rkey_pack of a buffer [addr, addr + length) registered with the parts marked so. */
xfer_status_t rkey_env_pack(rkey_env_t *env, uint64_t addr, uint64_t length, void **blob_p,
                            size_t *len_p);
/* xfer_rkey_unpack on an endpoint of transport to the peer context peer_id. */
xfer_status_t rkey_env_unpack(rkey_env_t *env, const char *transport, uint64_t peer_id,
                              const void *blob, size_t len, xfer_rkey_t **rkey_p);

#endif
