/*
 * Batch walks for every transport (engine.h): a batch's descriptors posted one by one through
 * the owner's post(), as room allows, with one completion record per descriptor that counts
 * what landed and holds the walk until it is told.
 */
#include "xfer_int.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void xfer_batch_walk_init(xfer_batch_walk_t *w, const xfer_batch_walk_ops_t *ops,
                          xfer_batch_args_t *args, int puts_land)
{
    memset(w, 0, sizeof(*w));
    w->ops       = ops;
    w->args      = args;
    w->puts_land = puts_land;
    w->status    = XFER_OK;
    w->holds     = 1;   /* the posting's */
}

void xfer_batch_walk_cleanup(xfer_batch_walk_t *w)
{
    free(w->subs);
    w->subs = NULL;
}

void xfer_batch_walk_stop(xfer_batch_walk_t *w, xfer_status_t status)
{
    w->stopped = 1;
    if ((status != XFER_OK) && (w->status == XFER_OK)) {
        w->status = status;
    }
}

void xfer_batch_walk_release(xfer_batch_walk_t *w)
{
    if (--w->holds == 0) {
        w->ops->done(w);
    }
}

void xfer_batch_walk_complete(xfer_batch_walk_t *w, xfer_comp_t *comp)
{
    xfer_status_t status = ((w->status == XFER_OK) && (w->landed < w->args->count)) ?
                           XFER_ERR_CANCELED : w->status;   /* ended early, nothing failed */

    w->args->landed = w->landed;
    xfer_batch_walk_cleanup(w);
    comp->priv = NULL;
    comp->cb(comp, status, w->landed, 0);
}

static void landed_add(xfer_batch_walk_t *w, size_t n)
{
    if (!w->args->is_put || w->puts_land) {
        w->landed       += n;
        w->args->landed  = w->landed;
    }
}

static void walk_sub_cb(xfer_comp_t *self, xfer_status_t status, size_t length, uint64_t tag)
{
    xfer_batch_walk_sub_t *sub = ucs_container_of(self, xfer_batch_walk_sub_t, comp);
    xfer_batch_walk_t *w       = sub->walk;

    (void)length;
    (void)tag;
    w->inflight -= w->args->iov[sub - w->subs].length;
    if (status == XFER_OK) {
        landed_add(w, 1);
    } else {
        xfer_batch_walk_stop(w, status);
    }
    if (w->ops->more != NULL) {
        w->ops->more(w);
    } else {
        xfer_batch_walk_fill(w);
    }
    xfer_batch_walk_release(w);
}

static int walk_room(xfer_batch_walk_t *w)
{
    return (w->ops->room != NULL) ? w->ops->room(w) : (w->inflight < XFER_BATCH_WINDOW);
}

int xfer_batch_walk_fill(xfer_batch_walk_t *w)
{
    int posted = 0;

    /* the records come with the first post: an owner that moves the data another way (shm's
     * copies into mapped memory) keeps only the walk's counts. Each is written when its
     * descriptor is posted, and only then read: not zeroed, since an owner that takes many
     * descriptors in one operation (tcp) uses a few of them, and zeroing a record for each of
     * a 128-descriptor batch cost its initiator about 4 % of its work per batch. */
    if ((w->subs == NULL) && !w->stopped && (w->next < w->args->count)) {
        w->subs = (w->args->count <= SIZE_MAX / sizeof(*w->subs)) ?
                  malloc(w->args->count * sizeof(*w->subs)) : NULL;
        if (w->subs == NULL) {
            xfer_log(XFER_LOG_ERROR, "batch", "no memory for the records of a batch of %zu "
                     "descriptors", w->args->count);
            xfer_batch_walk_stop(w, XFER_ERR_NO_MEMORY);
            return 0;
        }
    }

    while (!w->stopped && (w->next < w->args->count) && walk_room(w)) {
        size_t i                   = w->next, n = 1;
        xfer_batch_walk_sub_t *sub = &w->subs[i];
        xfer_status_t status;

        sub->comp.cb   = walk_sub_cb;
        sub->comp.priv = NULL;
        sub->walk      = w;
        status       = w->ops->post(w, i, &sub->comp, &n);
        if (status == XFER_INPROGRESS) {
            w->holds++;
            w->inflight += w->args->iov[i].length;
        } else if (status == XFER_OK) {
            landed_add(w, n);
        } else {
            xfer_log((status == XFER_ERR_CANCELED) ? XFER_LOG_DEBUG : XFER_LOG_ERROR, "batch",
                     "a batch stops at descriptor %zu of %zu: %s", i,
                     w->args->count, xfer_status_string(status));
            xfer_batch_walk_stop(w, status);
            break;
        }
        w->next += n;
        posted   = 1;
    }
    return posted;
}
