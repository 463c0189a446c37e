/*
 * Region tables for every transport (engine.h): ids from 1 up in a hash, and the random
 * numbers the components make their cookies of.
 */
#include "xfer_int.h"

#include <stdlib.h>
#include <sys/random.h>
#include <time.h>
#include <ucs/datastruct/khash.h>
#include <unistd.h>

KHASH_MAP_INIT_INT64(xfer_regions, void*)

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
        kh_foreach_value(&t->map, region, {
            release(region);
        });
    }
    kh_destroy_inplace(xfer_regions, &t->map);
    free(t);
}

xfer_status_t xfer_region_insert(xfer_regions_t *t, void *region, uint64_t *id_p)
{
    khiter_t it;
    int ret;

    it = kh_put(xfer_regions, &t->map, t->next_id, &ret);
    if (ret < 0) {
        return XFER_ERR_NO_MEMORY;
    }
    kh_value(&t->map, it) = region;
    *id_p = t->next_id++;
    return XFER_OK;
}

int xfer_region_remove(xfer_regions_t *t, uint64_t id, const void *region)
{
    khiter_t it = kh_get(xfer_regions, &t->map, id);

    if ((it == kh_end(&t->map)) || (kh_value(&t->map, it) != region)) {
        return 0;
    }
    kh_del(xfer_regions, &t->map, it);
    return 1;
}

void *xfer_region_lookup(xfer_regions_t *t, uint64_t id)
{
    khiter_t it = kh_get(xfer_regions, &t->map, id);

    return (it == kh_end(&t->map)) ? NULL : kh_value(&t->map, it);
}
