/*
 * What a tensor and its key must be, checked once for every caller: a key (not empty, at most
 * XFER_MAX_KEY_LEN), a tensor a caller publishes, and a tensor's description as a peer sends
 * it (xfer_tensor_meta_check, which the components call on what comes off the wire); and at a
 * component's consumer side, a fetch's arguments, where its answer's data lands, and the
 * metadata last seen per key (xfer_meta_cache_*).
 */
#include "xfer_int.h"

#include <ucs/datastruct/khash.h>
#include <ucs/datastruct/list.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TENSOR_SUBSYS "tensor"

xfer_status_t xfer_tensor_key_check(const xfer_context_t *ctx, const char *key,
                                    size_t *key_len_p)
{
    size_t len;

    if (key == NULL) {
        xfer_refuse(TENSOR_SUBSYS, "tensor key is NULL");
        return XFER_ERR_INVALID_PARAM;
    }
    len = strnlen(key, ctx->fw_config.max_key_len + 1);
    if (len == 0) {
        xfer_refuse(TENSOR_SUBSYS, "tensor key is empty");
        return XFER_ERR_INVALID_PARAM;
    }
    if (len > ctx->fw_config.max_key_len) {
        xfer_refuse(TENSOR_SUBSYS, "tensor key '%.40s...' is longer than "
                    "XFER_MAX_KEY_LEN=%llu bytes", key,
                    (unsigned long long)ctx->fw_config.max_key_len);
        return XFER_ERR_OUT_OF_RANGE;
    }
    *key_len_p = len;
    return XFER_OK;
}

xfer_status_t xfer_tensor_check(const xfer_tensor_t *tensor)
{
    uint64_t elems = 1;
    size_t esize;

    if ((tensor->dtype <= XFER_DTYPE_INVALID) || (tensor->dtype >= XFER_DTYPE_LAST)) {
        xfer_refuse(TENSOR_SUBSYS, "tensor dtype %d is not valid",
                    (int)tensor->dtype);
        return XFER_ERR_INVALID_PARAM;
    }
    if (tensor->rank > XFER_TENSOR_MAX_RANK) {
        xfer_refuse(TENSOR_SUBSYS, "tensor rank %u exceeds %d", tensor->rank,
                    XFER_TENSOR_MAX_RANK);
        return XFER_ERR_INVALID_PARAM;
    }
    for (uint32_t i = 0; i < tensor->rank; i++) {
        if (tensor->dims[i] < 0) {
            xfer_refuse(TENSOR_SUBSYS, "tensor dimension %u is negative (%lld)",
                        i, (long long)tensor->dims[i]);
            return XFER_ERR_INVALID_PARAM;
        }
        if ((tensor->dims[i] != 0) && (elems > UINT64_MAX / (uint64_t)tensor->dims[i])) {
            xfer_refuse(TENSOR_SUBSYS, "tensor shape overflows 64 bits");
            return XFER_ERR_INVALID_PARAM;
        }
        elems *= (uint64_t)tensor->dims[i];
    }
    if (tensor->is_dead) {
        return XFER_OK;     /* carries no data; size and data are ignored */
    }
    esize = xfer_dtype_size(tensor->dtype);
    if ((esize != 0) && ((elems > UINT64_MAX / esize) || (tensor->size != elems * esize))) {
        xfer_refuse(TENSOR_SUBSYS, "tensor size %llu does not match its shape "
                    "(%llu elements of %zu bytes)", (unsigned long long)tensor->size,
                    (unsigned long long)elems, esize);
        return XFER_ERR_INVALID_PARAM;
    }
    if ((tensor->size > 0) && (tensor->data == NULL)) {
        xfer_refuse(TENSOR_SUBSYS, "tensor of %llu bytes has no data",
                    (unsigned long long)tensor->size);
        return XFER_ERR_INVALID_PARAM;
    }
    return XFER_OK;
}

xfer_status_t xfer_tensor_meta_check(unsigned dtype, unsigned rank, const int64_t *dims,
                                         uint64_t size, int is_dead, char *why,
                                         size_t why_size)
{
    uint64_t elems = 1;
    size_t esize;

    if ((dtype <= XFER_DTYPE_INVALID) || (dtype >= XFER_DTYPE_LAST)) {
        snprintf(why, why_size, "tensor dtype %u is not valid", dtype);
        return XFER_ERR_PROTOCOL;
    }
    if (rank > XFER_TENSOR_MAX_RANK) {
        snprintf(why, why_size, "tensor rank %u exceeds %d", rank, XFER_TENSOR_MAX_RANK);
        return XFER_ERR_PROTOCOL;
    }
    for (unsigned i = 0; i < rank; i++) {
        if (dims[i] < 0) {
            snprintf(why, why_size, "tensor dimension %u is negative", i);
            return XFER_ERR_PROTOCOL;
        }
        if ((dims[i] != 0) && (elems > UINT64_MAX / (uint64_t)dims[i])) {
            snprintf(why, why_size, "tensor shape overflows 64 bits");
            return XFER_ERR_PROTOCOL;
        }
        elems *= (uint64_t)dims[i];
    }
    if (is_dead) {
        if (size != 0) {
            snprintf(why, why_size, "dead tensor claims %" PRIu64 " bytes of data", size);
            return XFER_ERR_PROTOCOL;
        }
        return XFER_OK;
    }
    esize = xfer_dtype_size((xfer_dtype_t)dtype);
    if ((esize != 0) && ((elems > UINT64_MAX / esize) || (size != elems * esize))) {
        snprintf(why, why_size, "tensor size %" PRIu64 " does not match its shape (%" PRIu64
                 " elements of %zu bytes)", size, elems, esize);
        return XFER_ERR_PROTOCOL;
    }
    return XFER_OK;
}

xfer_status_t xfer_fetch_start(const xfer_fetch_args_t *args, const xfer_comp_t *comp,
                               uint32_t max_key_len, const char *subsys,
                               xfer_fetch_dest_t *dest)
{
    if ((args == NULL) || (comp == NULL) || (args->result == NULL) || (args->key == NULL) ||
        (args->key_len == 0) || ((args->buffer == NULL) && (args->alloc == NULL))) {
        return XFER_ERR_INVALID_PARAM;
    }
    if (args->key_len > max_key_len) {
        xfer_log(XFER_LOG_ERROR, subsys, "tensor key of %zu bytes exceeds the limit of %u "
                 "bytes (here or at the peer)", args->key_len, max_key_len);
        return XFER_ERR_OUT_OF_RANGE;
    }
    if (dest != NULL) {
        dest->buf       = args->buffer;
        dest->capacity  = (args->buffer != NULL) ? args->capacity : 0;
        dest->alloc     = args->alloc;
        dest->alloc_arg = args->alloc_arg;
        dest->result    = args->result;
    }
    return XFER_OK;
}

xfer_status_t xfer_fetch_land(const xfer_fetch_dest_t *dest, const xfer_tensor_t *meta,
                              uint64_t data_len, void **data_p)
{
    xfer_tensor_t *t = dest->result;
    xfer_tensor_t ask;

    *t       = *meta;
    t->data  = dest->buf;
    *data_p  = NULL;
    if (data_len == 0) {
        return XFER_OK;
    }
    if (dest->buf != NULL) {
        if (data_len > dest->capacity) {
            return XFER_ERR_TRUNCATED;
        }
        *data_p = dest->buf;
        return XFER_OK;
    }
    ask      = *meta;
    ask.data = NULL;
    t->data  = dest->alloc(dest->alloc_arg, &ask);
    *data_p  = t->data;
    return (t->data != NULL) ? XFER_OK : XFER_ERR_NO_MEMORY;
}

/* ---- the consumer's metadata cache ---------------------------------------------------------- */

typedef struct meta_entry {
    ucs_list_link_t lru;            /* most recent first */
    char            *key;           /* the hash's key, owned here */
    uint8_t         value[];
} meta_entry_t;

KHASH_MAP_INIT_STR(xfer_meta, meta_entry_t*)

struct xfer_meta_cache {
    khash_t(xfer_meta) map;
    ucs_list_link_t    lru;
    uint64_t           max;
    size_t             value_size;
};

xfer_meta_cache_t *xfer_meta_cache_create(uint64_t max, size_t value_size)
{
    xfer_meta_cache_t *c = calloc(1, sizeof(*c));

    if (c != NULL) {
        kh_init_inplace(xfer_meta, &c->map);
        ucs_list_head_init(&c->lru);
        c->max        = max;
        c->value_size = value_size;
    }
    return c;
}

static void meta_drop(xfer_meta_cache_t *c, meta_entry_t *e)
{
    khiter_t it = kh_get(xfer_meta, &c->map, e->key);

    if (it != kh_end(&c->map)) {
        kh_del(xfer_meta, &c->map, it);
    }
    ucs_list_del(&e->lru);
    free(e->key);
    free(e);
}

void xfer_meta_cache_destroy(xfer_meta_cache_t *c)
{
    if (c == NULL) {
        return;
    }
    while (!ucs_list_is_empty(&c->lru)) {
        meta_drop(c, ucs_list_head(&c->lru, meta_entry_t, lru));
    }
    kh_destroy_inplace(xfer_meta, &c->map);
    free(c);
}

static meta_entry_t *meta_find(xfer_meta_cache_t *c, const char *key)
{
    khiter_t it = kh_get(xfer_meta, &c->map, key);
    meta_entry_t *e;

    if (it == kh_end(&c->map)) {
        return NULL;
    }
    e = kh_val(&c->map, it);
    ucs_list_del(&e->lru);
    ucs_list_add_head(&c->lru, &e->lru);
    return e;
}

int xfer_meta_cache_find(xfer_meta_cache_t *c, const char *key, void *value)
{
    meta_entry_t *e = meta_find(c, key);

    if (e == NULL) {
        return 0;
    }
    memcpy(value, e->value, c->value_size);
    return 1;
}

void xfer_meta_cache_store(xfer_meta_cache_t *c, const char *key, const void *value)
{
    meta_entry_t *e = meta_find(c, key);
    khiter_t it;
    int ret;

    if (e != NULL) {
        memcpy(e->value, value, c->value_size);
        return;
    }
    if (c->max == 0) {
        return;
    }
    while (kh_size(&c->map) >= c->max) {
        meta_drop(c, ucs_list_tail(&c->lru, meta_entry_t, lru));
    }
    e = malloc(sizeof(*e) + c->value_size);
    if ((e == NULL) || ((e->key = strdup(key)) == NULL)) {
        free(e);
        return;     /* a cache: the next fetch asks again */
    }
    it = kh_put(xfer_meta, &c->map, e->key, &ret);
    if (ret < 0) {
        free(e->key);
        free(e);
        return;
    }
    memcpy(e->value, value, c->value_size);
    kh_val(&c->map, it) = e;
    ucs_list_add_head(&c->lru, &e->lru);
}
