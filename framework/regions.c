/*
 * Region tables for every transport (engine.h): ids from 1 up in a hash, each region with a
 * random key of its own, and the random numbers the components make their tokens of.
 */
#include "xfer_int.h"

#include <xfer/byteorder.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>
#include <time.h>
#include <ucs/datastruct/khash.h>
#include <unistd.h>

typedef struct region_entry {
    void     *region;
    uint64_t key;       /* random: what a peer's remote key must carry to reach region */
} region_entry_t;

KHASH_MAP_INIT_INT64(xfer_regions, region_entry_t)

struct xfer_regions {
    khash_t(xfer_regions) map;
    uint64_t              next_id;
};

uint64_t xfer_random64(void)
{
    struct timespec ts;
    uint64_t v = 0;

    if (getrandom(&v, sizeof(v), GRND_NONBLOCK) == (ssize_t)sizeof(v)) {
        return v;
    }
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ((uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)getpid() << 32) ^
           (uint64_t)ts.tv_sec;
}

xfer_status_t xfer_regions_create(xfer_regions_t **t_p)
{
    xfer_regions_t *t = calloc(1, sizeof(*t));

    if (t == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    kh_init_inplace(xfer_regions, &t->map);
    t->next_id = 1;
    *t_p       = t;
    return XFER_OK;
}

void xfer_regions_destroy(xfer_regions_t *t, void (*release)(void *region))
{
    void *region;

    if (t == NULL) {
        return;
    }
    if (release != NULL) {
        region_entry_t e;

        kh_foreach_value(&t->map, e, {
            region = e.region;
            release(region);
        });
    }
    kh_destroy_inplace(xfer_regions, &t->map);
    free(t);
}

xfer_status_t xfer_region_insert(xfer_regions_t *t, void *region, uint64_t *id_p,
                                 uint64_t *key_p)
{
    khiter_t it;
    int ret;

    it = kh_put(xfer_regions, &t->map, t->next_id, &ret);
    if (ret < 0) {
        return XFER_ERR_NO_MEMORY;
    }
    kh_value(&t->map, it).region = region;
    kh_value(&t->map, it).key    = xfer_random64();
    *id_p  = t->next_id++;
    *key_p = kh_value(&t->map, it).key;
    return XFER_OK;
}

int xfer_region_remove(xfer_regions_t *t, uint64_t id, const void *region, const char *subsys)
{
    khiter_t it = kh_get(xfer_regions, &t->map, id);

    if ((it == kh_end(&t->map)) || (kh_value(&t->map, it).region != region)) {
        xfer_log(XFER_LOG_WARN, subsys, "mem_dereg of an unknown region %p", region);
        return 0;
    }
    kh_del(xfer_regions, &t->map, it);
    return 1;
}

void *xfer_region_lookup(xfer_regions_t *t, uint64_t id)
{
    khiter_t it = kh_get(xfer_regions, &t->map, id);

    return (it == kh_end(&t->map)) ? NULL : kh_value(&t->map, it).region;
}

void *xfer_region_find(xfer_regions_t *t, uint64_t id, uint64_t key)
{
    khiter_t it = kh_get(xfer_regions, &t->map, id);
    uint64_t diff;

    if (it == kh_end(&t->map)) {
        return NULL;
    }
    /* compared in constant time: how long a wrong key took says nothing of the right one */
    diff = kh_value(&t->map, it).key ^ key;
    diff = (diff | (~diff + 1)) >> 63;      /* 1 when they differ */
    return diff ? NULL : kh_value(&t->map, it).region;
}

xfer_status_t xfer_region_refused(uint32_t *bad_keys_p)
{
    return (++*bad_keys_p > XFER_BAD_KEYS_MAX) ? XFER_ERR_PROTOCOL : XFER_OK;
}

xfer_status_t xfer_region_new(xfer_regions_t *t, size_t rec_size, void *addr, size_t length,
                              void *rec_p)
{
    xfer_region_t *r;
    xfer_status_t status;

    if (!xfer_region_args_ok(addr, length)) {
        return XFER_ERR_INVALID_PARAM;
    }
    r = calloc(1, rec_size);
    if (r == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    r->addr   = addr;
    r->length = length;
    status    = xfer_region_insert(t, r, &r->id, &r->key);
    if (status != XFER_OK) {
        free(r);
        return status;
    }
    *(void**)rec_p = r;
    return XFER_OK;
}

void xfer_region_outside(const xfer_region_t *r, uint64_t addr, uint64_t len, char *why,
                         size_t why_size)
{
    snprintf(why, why_size, "range 0x%" PRIx64 "+%" PRIu64 " is outside region %" PRIu64
             " (0x%" PRIx64 "+%zu)", addr, len, r->id, (uint64_t)(uintptr_t)r->addr, r->length);
}

xfer_region_t *xfer_region_named(xfer_regions_t *t, uint64_t id, uint64_t key,
                                 xfer_ep_failq_t *q, xfer_ep_fail_t *f, uint32_t *bad_keys_p,
                                 xfer_status_t *status_p, char *why, size_t why_size)
{
    xfer_region_t *r = xfer_region_find(t, id, key);

    if (r != NULL) {
        *status_p = XFER_OK;
    } else if ((bad_keys_p != NULL) && (xfer_region_refused(bad_keys_p) != XFER_OK)) {
        snprintf(why, why_size, "%" PRIu32 " requests whose keys fit no region: the peer is "
                 "scanning for keys", *bad_keys_p);
        xfer_ep_fail_later(q, f, XFER_ERR_PROTOCOL, "%s", why);
        *status_p = XFER_ERR_NOT_FOUND;
    } else {
        snprintf(why, why_size, "no region here has id %" PRIu64 " and that key", id);
        *status_p = XFER_ERR_NOT_FOUND;
    }
    return r;
}

xfer_region_t *xfer_region_reach(xfer_regions_t *t, uint64_t id, uint64_t key, uint64_t addr,
                                 uint64_t len, xfer_ep_failq_t *q, xfer_ep_fail_t *f,
                                 uint32_t *bad_keys_p, xfer_status_t *status_p, char *why,
                                 size_t why_size)
{
    xfer_region_t *r = xfer_region_named(t, id, key, q, f, bad_keys_p, status_p, why,
                                         why_size);

    if ((r != NULL) && (xfer_region_at(r, addr, len, why, why_size) == NULL)) {
        *status_p = XFER_ERR_OUT_OF_RANGE;
        return NULL;
    }
    return r;
}

void xfer_region_key_pack(const xfer_region_t *r, void *buf)
{
    uint8_t *p = buf;

    xfer_put_le64(p, r->id);
    xfer_put_le64(p + 8, r->key);
    xfer_put_le64(p + 16, (uintptr_t)r->addr);
    xfer_put_le64(p + 24, r->length);
}

xfer_status_t xfer_region_key_unpack(const void *buf, xfer_region_key_t *k)
{
    const uint8_t *p = buf;

    k->id     = xfer_get_le64(p);
    k->key    = xfer_get_le64(p + 8);
    k->addr   = xfer_get_le64(p + 16);
    k->length = xfer_get_le64(p + 24);
    return (k->addr + k->length < k->addr) ? XFER_ERR_INVALID_PARAM : XFER_OK;
}
