/*
 * The batch tests, batch_put and batch_get: the client prepares one descriptor list per
 * window slot (xfer_batch_create, once per size) and posts it again and again, up to
 * `window` batches in flight; each batch moves -b blocks of -s bytes between a slot of the
 * client's buffer, where they lie end to end (a staging buffer), and the same slot of the
 * server's, where they are scattered (a paged pool: descriptor i names block i * stride mod
 * the batch length, the stride prime to it, so no two consecutive descriptors touch); without
 * -V every slot is the same region on each side, as the bandwidth tests share one buffer
 * (perf_slots_shared). With --notify each batch carries a notification of that many
 * bytes: the iteration and the post time, on the server's clock. The server takes them as
 * they come (xfer_notify_poll), checks that they arrive whole and in order, and times each
 * from the client's post to its arrival; with -V it also checks, at that moment, that the
 * batch's data is in its buffer, and tells the client (a SEEN message) so that the slot's
 * blocks are not written again before.
 *
 * Figures: a batch's latency is its post to its completion at the client (its data in the
 * destination's memory); post cost is the time inside xfer_batch_post per descriptor;
 * bandwidth counts the blocks' bytes from the first timed post until the server has
 * acknowledged the end.
 */
#include "perf.h"
#include "scatter.h"

#include <xfer/byteorder.h>

#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SEED_CLIENT 1
#define SEED_SERVER 2

#define STATS_LEN   24      /* ACK payload: notifications u64 | average ns i64 | p99 ns i64 */

size_t perf_batch_region(const perf_params_t *p)
{
    uint64_t bytes = p->size * (uint64_t)p->batch;
    uint64_t cap   = (p->size > WINDOW_BYTES_MAX) ? p->size : WINDOW_BYTES_MAX;

    return (size_t)((bytes <= cap) ? bytes : cap / p->size * p->size);
}

/* Block i of a slot's region, wrapping where the region is smaller than the batch; without
 * -V every slot is the same region (perf_slots_shared). */
static uint64_t block_offset(const perf_params_t *p, size_t region, size_t slot, uint64_t i)
{
    return (perf_slots_shared(p) ? 0 : (uint64_t)slot) * region + (i * p->size) % region;
}

/* Descriptor i's block: here (the client's side, end to end) and at the server (scattered). */
static uint64_t client_block(const perf_params_t *p, size_t slot, uint64_t i)
{
    return block_offset(p, perf_batch_region(p), slot, i);
}

static uint64_t server_index(const perf_params_t *p, uint64_t i)
{
    return i * scatter_stride(p->batch) % p->batch;
}

static uint64_t server_block(const perf_params_t *p, size_t slot, uint64_t i)
{
    return block_offset(p, perf_batch_region(p), slot, server_index(p, i));
}

/* -V: each block's pattern names its iteration and its block (-V needs no wrapping) */
static uint64_t block_iter(uint64_t iter, uint64_t block)
{
    return iter * MAX_BATCH + block;
}

static int batches_create(perf_t *perf)
{
    const perf_params_t *p = &perf->p;
    xfer_batch_op_t op = (p->test == TEST_BATCH_PUT) ? XFER_BATCH_PUT : XFER_BATCH_GET;
    xfer_batch_desc_t *descs;
    xfer_status_t st = XFER_OK;

    perf->batches = calloc(p->window, sizeof(*perf->batches));
    descs = calloc(p->batch, sizeof(*descs));
    if ((perf->batches == NULL) || (descs == NULL)) {
        free(descs);
        fprintf(stderr, "xfer_perf: cannot allocate %u descriptor lists\n", p->window);
        return -1;
    }
    for (size_t s = 0; (s < p->window) && (st == XFER_OK); s++) {
        for (uint32_t i = 0; i < p->batch; i++) {
            descs[i].local_offset  = client_block(p, s, i);
            descs[i].remote_offset = server_block(p, s, i);
            descs[i].length        = p->size;
        }
        st = xfer_batch_create(perf->ep, op, perf->mem, perf->rkey, descs, p->batch,
                               &perf->batches[s]);
    }
    free(descs);
    return (st == XFER_OK) ? 0 : perf_fail("xfer_batch_create", st);
}

void perf_batch_release(perf_t *perf)
{
    for (size_t s = 0; (perf->batches != NULL) && (s < perf->p.window); s++) {
        if (perf->batches[s] != NULL) {
            xfer_batch_destroy(perf->batches[s]);
        }
    }
    free(perf->batches);
    perf->batches = NULL;
    for (size_t s = 0; (perf->seen != NULL) && (s < perf->p.window); s++) {
        if (perf->seen[s] != NULL) {
            xfer_request_release(perf->seen[s]);
        }
    }
    free(perf->seen);
    perf->seen = NULL;
}

/* batch_put -V with notifications: the server checks each batch when its notification comes
 * and answers SEEN; a slot is written again only after that. */
static int seen_needed(const perf_params_t *p)
{
    return (p->test == TEST_BATCH_PUT) && (p->flags & PARAM_VERIFY) && (p->notify_len > 0);
}

static int seen_wait(perf_t *perf, size_t slot, uint64_t iter)
{
    xfer_status_t st;

    if (perf->seen[slot] == NULL) {
        return 0;
    }
    st = perf_wait(perf, perf->seen[slot]);
    xfer_request_release(perf->seen[slot]);
    perf->seen[slot] = NULL;
    if (st != XFER_OK) {
        fprintf(stderr, "xfer_perf: batch_put: the server's check of iteration %" PRIu64
                ": %s\n", iter, xfer_status_string(st));
        return -1;
    }
    return 0;
}

/* A batch has completed: its time, and with -V (get) its blocks. */
static int batch_done(perf_t *perf, size_t slot, uint64_t iter, uint64_t first, int timed)
{
    op_slot_t *op = &perf->ops[slot];
    xfer_status_t st = perf_op_wait(perf, op);

    if (op->t_done == 0) {
        op->t_done = perf_now_ns();    /* completed without a callback */
    }
    if (st != XFER_OK) {
        fprintf(stderr, "xfer_perf: %s, iteration %" PRIu64 ": %s (%zu of %u descriptors "
                "landed)\n", perf_tests[perf->p.test].name, iter, xfer_status_string(st),
                (op->req != NULL) ? xfer_request_landed(op->req) : 0, perf->p.batch);
        perf_op_release(op);
        return -1;
    }
    perf_op_release(op);
    if (timed) {
        perf->samples[iter - first] = (double)(op->t_done - op->t_post) / 1e3;
    }
    if ((perf->p.test == TEST_BATCH_GET) && (perf->p.flags & PARAM_VERIFY)) {
        for (uint64_t i = 0; i < perf->p.batch; i++) {
            perf_range_check(perf, client_block(&perf->p, slot, i), perf->p.size, SEED_SERVER,
                             block_iter(slot, server_index(&perf->p, i)), "batch_get");
        }
    }
    return seen_needed(&perf->p) ? seen_wait(perf, slot, iter) : 0;
}

static int batch_post(perf_t *perf, size_t slot, uint64_t iter, int timed)
{
    const perf_params_t *p = &perf->p;
    op_slot_t *op = &perf->ops[slot];
    uint8_t msg[4096];
    uint64_t t_end;
    xfer_status_t st;

    if (p->flags & PARAM_VERIFY) {
        if (p->test == TEST_BATCH_PUT) {
            for (uint64_t i = 0; i < p->batch; i++) {
                perf_range_fill(perf, client_block(p, slot, i), p->size, SEED_CLIENT,
                                block_iter(iter, i));
            }
        } else {
            perf_slot_zero(perf, slot);
        }
    }
    if (seen_needed(p)) {
        st = xfer_tag_recv(perf->ctx, perf->ep, TAG_SEEN | (iter & 0xffffffffu), TAG_FULL,
                           NULL, 0, NULL, NULL, NULL, &perf->seen[slot]);
        if (st != XFER_OK && st != XFER_INPROGRESS) {
            perf->seen[slot] = NULL;
            return perf_fail("xfer_tag_recv of SEEN", st);
        }
    }
    perf_op_reset(op);
    op->t_post = perf_now_ns();
    if (p->notify_len > 0) {
        memset(msg, 0, p->notify_len);
        xfer_put_le64(msg, iter);
        xfer_put_le64(msg + 8, (uint64_t)((int64_t)op->t_post + perf->clock_offset));
    }
    st = xfer_batch_post(perf->batches[slot], (p->notify_len > 0) ? msg : NULL, p->notify_len,
                         0, perf_op_cb, op, &op->req);
    t_end = perf_now_ns();
    if (timed) {
        perf->post_ns_sum += t_end - op->t_post;
    }
    return perf_op_posted(op, st, "xfer_batch_post");
}

/* Iterations [first, first + count), up to window batches in flight, all completed at the
 * end. */
static int batch_phase(perf_t *perf, uint64_t first, uint64_t count, int timed)
{
    size_t window = perf->p.window;
    uint64_t oldest = first;

    for (uint64_t i = first; i < first + count; i++) {
        if (i - oldest == window) {
            if (batch_done(perf, oldest % window, oldest, first, timed) != 0) {
                return -1;
            }
            oldest++;
        }
        if (batch_post(perf, i % window, i, timed) != 0) {
            return -1;
        }
    }
    for (; oldest < first + count; oldest++) {
        if (batch_done(perf, oldest % window, oldest, first, timed) != 0) {
            return -1;
        }
    }
    return 0;
}

int perf_batch_client_run(perf_t *perf, uint64_t *t_start_p)
{
    const perf_params_t *p = &perf->p;

    if (batches_create(perf) != 0) {
        return -1;
    }
    if (seen_needed(p)) {
        perf->seen = calloc(p->window, sizeof(*perf->seen));
        if (perf->seen == NULL) {
            return perf_fail("allocating the SEEN receives", XFER_ERR_NO_MEMORY);
        }
    }
    perf->post_ns_sum = 0;
    if (batch_phase(perf, 0, p->warmup, 0) != 0) {
        return -1;
    }
    *t_start_p = perf_now_ns();
    return batch_phase(perf, p->warmup, p->iters, 1);
}

/* ---- the server ------------------------------------------------------------------------------ */

/* Before READY: batch_get reads a fixed source, block j of slot s holding the pattern of
 * "iteration" (s, j). */
void perf_batch_server_prepare(perf_t *perf)
{
    perf->notified = 0;
    perf->notify_sum_ns = 0;
    perf->notify_error = XFER_OK;
    if ((perf->p.test == TEST_BATCH_GET) && (perf->p.flags & PARAM_VERIFY)) {
        for (size_t s = 0; s < perf->nslots; s++) {
            for (uint64_t j = 0; j < perf->p.batch; j++) {
                perf_range_fill(perf, block_offset(&perf->p, perf_batch_region(&perf->p), s, j),
                                perf->p.size, SEED_SERVER, block_iter(s, j));
            }
        }
    }
}

/* One notification: whole, in order, and with -V the batch's data already in place. */
static int notify_take(perf_t *perf, const uint8_t *msg, size_t len, uint64_t now)
{
    const perf_params_t *p = &perf->p;
    uint64_t iter, posted;
    size_t slot;

    if (len != p->notify_len) {
        perf_verify_fail(perf, "%s: notification %" PRIu64 " has %zu bytes, the client sent "
                         "%u", perf_tests[p->test].name, perf->notified, len, p->notify_len);
        return -1;
    }
    iter = xfer_get_le64(msg);
    posted = xfer_get_le64(msg + 8);
    if (iter != perf->notified) {
        perf_verify_fail(perf, "%s: notification of iteration %" PRIu64 " came where %" PRIu64
                         " was next", perf_tests[p->test].name, iter, perf->notified);
        return -1;
    }
    if (iter >= p->warmup) {
        perf->notify_ns[iter - p->warmup] = (int64_t)(now - posted);
    }
    perf->notified++;
    if (seen_needed(p)) {
        xfer_request_t *req = NULL;
        xfer_status_t st;

        slot = iter % p->window;
        for (uint64_t i = 0; i < p->batch; i++) {
            perf_range_check(perf, server_block(p, slot, i), p->size, SEED_CLIENT,
                             block_iter(iter, i), "batch_put, when its notification came");
        }
        st = xfer_tag_send(perf->ep, TAG_SEEN | (iter & 0xffffffffu), NULL, 0, NULL, NULL,
                           NULL, &req);
        if (req != NULL) {
            xfer_request_release(req);     /* a small send: it ends on its own */
        }
        if (st != XFER_OK && st != XFER_INPROGRESS) {
            return perf_fail("sending SEEN", st);
        }
    }
    return 0;
}

/* Until every notification is in: poll for them, spinning or (-E sleep) sleeping on the
 * context's fd between rounds. */
int perf_batch_server_run(perf_t *perf)
{
    const perf_params_t *p = &perf->p;
    uint64_t total = p->warmup + p->iters, deadline = perf_now_ns() + TIMEOUT_MS * 1000000ull;
    uint8_t msg[4096];
    xfer_status_t st;
    size_t len;

    if (p->notify_len == 0) {
        return 0;   /* one-sided: waiting for FIN progresses the batches */
    }
    while (perf->notified < total) {
        st = xfer_notify_poll(perf->ep, msg, sizeof(msg), &len);
        if (st == XFER_OK) {
            if (notify_take(perf, msg, len, perf_now_ns()) != 0) {
                return (perf->verify_error[0] != '\0') ? 0 : -1;    /* FIN, ACK say it */
            }
            deadline = perf_now_ns() + TIMEOUT_MS * 1000000ull;
            continue;
        }
        if (st != XFER_ERR_NOT_FOUND) {
            return perf_fail("xfer_notify_poll", st);
        }
        if (xfer_endpoint_status(perf->ep) != XFER_OK) {
            return perf_fail("waiting for notifications: the connection",
                             xfer_endpoint_status(perf->ep));
        }
        if (perf_now_ns() > deadline) {
            fprintf(stderr, "xfer_perf: %s: no notification in %d s after %" PRIu64 " of %"
                    PRIu64 "\n", perf_tests[p->test].name, TIMEOUT_MS / 1000, perf->notified,
                    total);
            return -1;
        }
        if (perf->opts.sleep && (xfer_context_arm(perf->ctx) == XFER_OK)) {
            struct pollfd pfd = {.fd = xfer_context_event_fd(perf->ctx), .events = POLLIN};

            poll(&pfd, 1, 100);
        }
    }
    return 0;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

    return (x > y) - (x < y);
}

/* The server's notification latencies: count, average and 99th percentile, for ACK. */
size_t perf_batch_stats_encode(perf_t *perf, uint8_t *out)
{
    const perf_params_t *p = &perf->p;
    size_t n = (perf->notified > p->warmup) ? perf->notified - p->warmup : 0, i99;
    int64_t sum = 0;

    if (!perf_tests[p->test].batch || (p->notify_len == 0)) {
        return 0;
    }
    qsort(perf->notify_ns, n, sizeof(*perf->notify_ns), cmp_i64);
    for (size_t i = 0; i < n; i++) {
        sum += perf->notify_ns[i];
    }
    i99 = (n * 99 + 99) / 100;
    xfer_put_le64(out, n);
    xfer_put_le64(out + 8, (uint64_t)((n > 0) ? sum / (int64_t)n : 0));
    xfer_put_le64(out + 16, (uint64_t)((n > 0) ? perf->notify_ns[(i99 > 0 ? i99 : 1) - 1] : 0));
    return STATS_LEN;
}

int perf_batch_stats_decode(const uint8_t *in, size_t len, result_t *r)
{
    if (len == 0) {
        r->has_notify = 0;
        return 0;
    }
    if (len != STATS_LEN) {
        fprintf(stderr, "xfer_perf: ACK carries %zu bytes of notification figures, not %d\n",
                len, STATS_LEN);
        return -1;
    }
    r->has_notify = (xfer_get_le64(in) > 0);
    r->notify_avg = (double)(int64_t)xfer_get_le64(in + 8) / 1e3;
    r->notify_99 = (double)(int64_t)xfer_get_le64(in + 16) / 1e3;
    return 0;
}
