/*
 * The operations of every transport (engine.h): a memory pool per component iface (malloc and
 * free per message would be on the data path; one larger than the pool's elements is
 * allocated on its own) and the queue of completed ones, delivered at the end of the
 * component's progress in the order they completed. Getting, giving back and completing an
 * op are inline in engine.h; here are the pool's life and the delivery.
 */
#include "xfer_int.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <ucs/datastruct/mpool.h>

#define OP_ALIGN      64u           /* a cache line */
#define OP_CHUNK      256u          /* ops per chunk of the pool */

static ucs_mpool_ops_t op_mp_ops = {
    .chunk_alloc   = ucs_mpool_chunk_malloc,
    .chunk_release = ucs_mpool_chunk_free,
};

xfer_status_t xfer_op_pool_create(size_t op_size, size_t extra_max, const char *name,
                                  xfer_op_pool_t **pool_p)
{
    xfer_op_pool_t *pool;

    if ((op_size < sizeof(xfer_op_t)) || (pool_p == NULL)) {
        return XFER_ERR_INVALID_PARAM;
    }
    pool = calloc(1, sizeof(*pool));
    if (pool == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    if (ucs_mpool_init(&pool->mp, 0, op_size + extra_max, 0, OP_ALIGN, OP_CHUNK, UINT_MAX,
                       &op_mp_ops, name) != UCS_OK) {
        free(pool);
        return XFER_ERR_NO_MEMORY;
    }
    pool->op_size   = op_size;
    pool->extra_max = extra_max;
    *pool_p         = pool;
    return XFER_OK;
}

void xfer_op_pool_destroy(xfer_op_pool_t *pool)
{
    if (pool == NULL) {
        return;
    }
    while (pool->head != NULL) {
        xfer_op_deliver(pool);
    }
    ucs_mpool_cleanup(&pool->mp, 1);
    free(pool);
}

void *xfer_op_alloc_large(xfer_op_pool_t *pool, size_t extra)
{
    return calloc(1, pool->op_size + extra);
}

unsigned xfer_op_deliver(xfer_op_pool_t *pool)
{
    return xfer_op_deliver_inline(pool);
}

void xfer_op_deliver_owner(xfer_op_pool_t *pool, void *owner)
{
    /* from the head again after each: a callback may change the queue */
    for (;;) {
        xfer_op_t *prev = NULL, *op;

        for (op = pool->head; (op != NULL) && (op->owner != owner); op = op->next) {
            prev = op;
        }
        if (op == NULL) {
            return;
        }
        xfer_op_deliver_one(pool, prev, op);
    }
}

