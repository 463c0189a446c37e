/*
 * Flushes of an endpoint whose operations the peer answers (engine.h): each flush counts the
 * answered operations posted before it that still wait for their answer, and completes once
 * that count is down to 0 and the component's own conditions hold.
 */
#include "xfer_int.h"

void xfer_flushes_init(xfer_flushes_t *q, const xfer_flushes_ops_t *ops, void *arg)
{
    ucs_list_head_init(&q->waiting);
    q->ops     = ops;
    q->arg     = arg;
    q->posted  = 0;
    q->pending = 0;
}

void xfer_flushes_answered(xfer_flushes_t *q, uint64_t serial)
{
    xfer_flush_t *f;

    q->pending--;
    ucs_list_for_each(f, &q->waiting, list) {
        if ((serial <= f->mark) && (f->pending > 0)) {
            f->pending--;
        }
    }
}

void xfer_flushes_add(xfer_flushes_t *q, xfer_flush_t *f)
{
    f->mark    = q->posted;
    f->pending = q->pending;
    ucs_list_add_tail(&q->waiting, &f->list);
}

unsigned xfer_flushes_check(xfer_flushes_t *q)
{
    xfer_flush_t *f, *tmp;
    xfer_status_t status;
    unsigned count = 0;

    ucs_list_for_each_safe(f, tmp, &q->waiting, list) {
        status = XFER_OK;
        if ((f->pending > 0) || !q->ops->reached(q->arg, f, &status)) {
            continue;
        }
        ucs_list_del(&f->list);
        q->ops->complete(f, status);
        count++;
    }
    return count;
}

void xfer_flushes_fail(xfer_flushes_t *q, xfer_status_t status)
{
    while (!ucs_list_is_empty(&q->waiting)) {
        q->ops->complete(ucs_list_extract_head(&q->waiting, xfer_flush_t, list), status);
    }
}
