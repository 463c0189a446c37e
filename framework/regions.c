/*
 * Region tables for every transport (engine.h): ids from 1 up in a hash, each region with a
 * random key of its own, and the random numbers the components make their tokens of.
 */
#include "xfer_int.h"

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

int xfer_region_remove(xfer_regions_t *t, uint64_t id, const void *region)
{
    khiter_t it = kh_get(xfer_regions, &t->map, id);

    if ((it == kh_end(&t->map)) || (kh_value(&t->map, it).region != region)) {
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
