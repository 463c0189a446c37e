/*
 * Batches of puts and gets between two processes, over the transport under test: the data of
 * every descriptor lands where it should and nowhere else; the target checks a put batch's
 * data the moment its notification arrives (by polling and by handler), and a get batch's
 * notification comes after the read; notifications come in order per peer; a prepared list is
 * posted many times at once. A batch larger than what its post writes completes in a loop that
 * sleeps on the context's fd whenever arm allows, and ends, its callback agreeing, when its
 * endpoint is closed by force right after the post.
 *
 * Here too: the suite's declaration, and the target side and the initiator's helpers that
 * test_batch.h declares for both files. test_batch_end.c holds the rest of the suite: batches
 * that end at their deadline or cancel, refused batches, notification floods, a handler that
 * posts and closes, bad lists refused where made.
 */
#include "test_batch.h"
#include "test_peer.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void setup(void)
{
    tp_env();
}

TestSuite(batch, .init = setup, .timeout = 240);

#define ROUNDS    12
#define NDESC     40

/* The descriptors of round r: NDESC blocks of mixed sizes (1 byte to 1 MiB), each taken from
 * src at a running offset and placed in the round's own part of the target buffer: in even
 * rounds in an order scrambled so that the target's offsets are not monotonic, in odd rounds
 * one after the other as in src (blocks adjacent on both sides, which a transport may move
 * as one). */
static size_t round_descs(unsigned r, xfer_batch_desc_t *d)
{
    static const uint64_t sizes[] = {4096, 1, 65536, 4096, 1u << 20, 777, 4096, 16384};
    uint64_t src = 0, part = DST_LEN / ROUNDS;
    size_t n = 0;

    for (unsigned i = 0; i < NDESC; i++) {
        uint64_t len = sizes[(i + r) % 8];
        uint64_t slot = (i * 7) % NDESC;

        d[n].local_offset  = src;
        d[n].length        = (len > part / NDESC) ? part / NDESC : len;
        d[n].remote_offset = (uint64_t)r * part + ((r & 1) ? src : slot * (part / NDESC));
        src               += d[n].length;
        n++;
    }
    return n;
}

/* Does the target buffer hold round r's data, the blocks' bytes as src held them (pattern
 * seeded by r)? */
static int round_landed(const uint8_t *dst, const uint8_t *src_image, unsigned r)
{
    xfer_batch_desc_t d[NDESC];
    size_t n = round_descs(r, d);

    for (size_t i = 0; i < n; i++) {
        if (memcmp(dst + d[i].remote_offset, src_image + d[i].local_offset, d[i].length) != 0) {
            return 0;
        }
    }
    return 1;
}

static size_t desc_bytes(const xfer_batch_desc_t *d, size_t n)
{
    size_t bytes = 0;

    for (size_t i = 0; i < n; i++) {
        bytes += d[i].length;
    }
    return bytes;
}

/* ---- the target ------------------------------------------------------------------------------ */

typedef struct target {
    tp_side_t *s;
    uint8_t   *dst;
    uint8_t   *image;
    uint64_t  good, seen;
} target_t;

/* Notification of a put round: {round}; check that round's data now. */
static void check_round_notification(target_t *t, const void *msg, size_t len)
{
    uint32_t r;

    t->seen++;
    if (len != sizeof(r)) {
        return;
    }
    memcpy(&r, msg, sizeof(r));
    if (r >= ROUNDS) {
        return;
    }
    tp_fill_pattern(t->image, SRC_LEN, 100 + r);
    t->good += round_landed(t->dst, t->image, r);
}

static void target_handler(xfer_endpoint_t *ep, const void *msg, size_t len, void *arg)
{
    (void)ep;
    check_round_notification(arg, msg, len);
}

/* XFERTEST_TARGET_MEM=xfer: the target's buffer comes from xfer_mem_alloc() (over shm the
 * initiator maps it and copies itself), else it is a static array, registered. */
int tb_target_mem_alloc(void)
{
    const char *v = getenv("XFERTEST_TARGET_MEM");

    return (v != NULL) && (strcmp(v, "xfer") == 0);
}

int tb_srv_target(tp_side_t *s)
{
    static uint8_t dst_static[DST_LEN];
    uint8_t *dst = dst_static;
    xfer_mem_t *mem;
    uint64_t cmd, n;
    void *blob;
    size_t len;

    if (tb_target_mem_alloc()) {
        TP_CHECK_STATUS(xfer_mem_alloc(s->ctx, DST_LEN, XFER_MEM_HOST, &mem), XFER_OK);
        dst = xfer_mem_address(mem);
    } else {
        TP_CHECK_STATUS(xfer_mem_register(s->ctx, dst, DST_LEN, XFER_MEM_HOST, &mem), XFER_OK);
    }
    target_t t = {s, dst, malloc(SRC_LEN), 0, 0};

    TP_CHECK(t.image != NULL, "malloc");
    TP_CHECK_STATUS(xfer_rkey_pack(mem, &blob, &len), XFER_OK);
    TP_CHECK(tp_ctl_send(s->ctl, blob, len) == 0, "ctl");
    xfer_rkey_blob_free(blob);
    for (;;) {
        if (tp_progress_until_ctl(s, TP_WAIT_MS * 3) != 0) {
            return 1;
        }
        TP_CHECK(tp_ctl_recv_u64(s->ctl, &cmd, TP_WAIT_MS) == 0, "ctl");
        switch (cmd) {
        case CMD_DONE:
            free(t.image);
            return 0;
        case CMD_POLL:
        case CMD_ORDER: {
            double end;
            uint64_t in_order = 0;

            TP_CHECK(tp_ctl_recv_u64(s->ctl, &n, TP_WAIT_MS) == 0, "ctl");
            t.good = t.seen = 0;
            end = tp_now_ms() + TP_WAIT_MS;
            while ((t.seen < n) && (tp_now_ms() < end)) {
                uint8_t msg[64];
                xfer_status_t st = xfer_notify_poll(s->ep, msg, sizeof(msg), &len);

                if (st == XFER_ERR_NOT_FOUND) {
                    continue;
                }
                TP_CHECK_STATUS(st, XFER_OK);
                if (cmd == CMD_POLL) {
                    check_round_notification(&t, msg, len);
                } else {
                    uint32_t i;

                    memcpy(&i, msg, sizeof(i));
                    in_order += (len == sizeof(i)) && (i == t.seen);
                    t.seen++;
                }
            }
            TP_CHECK(tp_ctl_send_u64(s->ctl, (cmd == CMD_POLL) ? t.good : in_order) == 0,
                     "ctl");
            break;
        }
        case CMD_HANDLER: {
            double end;

            TP_CHECK(tp_ctl_recv_u64(s->ctl, &n, TP_WAIT_MS) == 0, "ctl");
            t.good = t.seen = 0;
            TP_CHECK_STATUS(xfer_notify_handler_set(s->ctx, target_handler, &t), XFER_OK);
            end = tp_now_ms() + TP_WAIT_MS;
            while ((t.seen < n) && (tp_now_ms() < end)) {
                xfer_progress(s->ctx);
            }
            TP_CHECK_STATUS(xfer_notify_handler_set(s->ctx, NULL, NULL), XFER_OK);
            TP_CHECK(tp_ctl_send_u64(s->ctl, t.good) == 0, "ctl");
            break;
        }
        case CMD_FILL:
            TP_CHECK(tp_ctl_recv_u64(s->ctl, &n, TP_WAIT_MS) == 0, "ctl");
            tp_fill_pattern(dst, DST_LEN, n);
            TP_CHECK(tp_ctl_send_u64(s->ctl, 0) == 0, "ctl");
            break;
        case CMD_SLEEP:
            TP_CHECK(tp_ctl_recv_u64(s->ctl, &n, TP_WAIT_MS) == 0, "ctl");
            usleep((useconds_t)n * 1000);
            TP_CHECK(tp_ctl_send_u64(s->ctl, 0) == 0, "ctl");
            break;
        case CMD_DEREG:
            TP_CHECK_STATUS(xfer_mem_deregister(mem), XFER_OK);
            mem = NULL;
            TP_CHECK(tp_ctl_send_u64(s->ctl, 0) == 0, "ctl");
            break;
        case CMD_COUNT: {
            uint8_t msg[64];

            tp_progress_for(s->ctx, 500);
            n = 0;
            while (xfer_notify_poll(s->ep, msg, sizeof(msg), &len) == XFER_OK) {
                n++;
            }
            TP_CHECK(tp_ctl_send_u64(s->ctl, n) == 0, "ctl");
            break;
        }
        case CMD_STATUS:
            /* what the peer sent may still wait in this side's transport (an RDMA NIC
             * acknowledged it before this process read it): take it in first */
            tp_progress_for(s->ctx, 200);
            TP_CHECK(tp_ctl_send_u64(s->ctl, (uint64_t)(int64_t)xfer_endpoint_status(s->ep)) == 0,
                     "ctl");
            break;
        default:
            return 1;
        }
    }
}

/* ---- the initiator --------------------------------------------------------------------------- */


void tb_init_start(init_t *in, tp_scenario_t fn)
{
    void *blob;
    size_t len;

    tp_start(&in->p, fn, NULL);
    in->src = malloc(SRC_LEN);
    cr_assert_not_null(in->src);
    memset(in->src, 0, SRC_LEN);    /* what a case does not fill still goes out defined */
    cr_assert_eq(xfer_mem_register(in->p.ctx, in->src, SRC_LEN, XFER_MEM_HOST, &in->mem),
                 XFER_OK);
    blob = tp_recv_blob(&in->p, &len);
    cr_assert_eq(xfer_rkey_unpack(in->p.ep, blob, len, &in->rkey), XFER_OK);
    free(blob);
}

void tb_init_finish(init_t *in)
{
    tp_send(&in->p, CMD_DONE);
    xfer_rkey_destroy(in->rkey);
    cr_assert_eq(xfer_mem_deregister(in->mem), XFER_OK);
    free(in->src);
    tp_finish(&in->p);
}

/* The parent progresses while it waits for the target's answer (the target may need our
 * progress to finish what it checks). */
uint64_t tb_recv_progressing_peer(tp_peer_t *p)
{
    double end = tp_now_ms() + TP_WAIT_MS * 2;

    while (!tp_ctl_ready(p->ctl, 0) && (tp_now_ms() < end)) {
        xfer_progress(p->ctx);
    }
    return tp_recv(p);
}

uint64_t tb_recv_progressing(init_t *in)
{
    return tb_recv_progressing_peer(&in->p);
}

xfer_status_t tb_post_ended_early(init_t *in, const xfer_batch_desc_t *d, size_t n,
                                  unsigned sleep_ms, int cancel, xfer_request_t **req_p,
                                  xfer_batch_t **b_p, double *ms_p)
{
    xfer_status_t st;
    double t0;

    *req_p = NULL;
    tp_send(&in->p, CMD_SLEEP);
    tp_send(&in->p, sleep_ms);
    cr_assert_eq(xfer_batch_create(in->p.ep, XFER_BATCH_PUT, in->mem, in->rkey, d, n, b_p),
                 XFER_OK);
    t0 = tp_now_ms();
    cr_assert_eq(xfer_batch_post(*b_p, NULL, 0, cancel ? XFER_BATCH_NO_TIMEOUT : 300, NULL,
                                 NULL, req_p), XFER_OK);
    if (cancel) {
        tp_progress_for(in->p.ctx, 100);
        cr_assert_eq(xfer_request_cancel(*req_p), XFER_OK);
    }
    st    = xfer_request_wait(*req_p, TP_WAIT_MS);
    *ms_p = tp_now_ms() - t0;
    return st;
}

/* Post every round's put batch with its notification, one after the other (src is refilled
 * for each round once the previous batch completed), then let the target take them. */
static void put_rounds(init_t *in, int handler)
{
    for (uint32_t r = 0; r < ROUNDS; r++) {
        xfer_batch_desc_t d[NDESC];
        size_t n = round_descs(r, d);
        xfer_request_t *req = NULL;
        xfer_batch_t *b;

        tp_fill_pattern(in->src, SRC_LEN, 100 + r);
        cr_assert_eq(xfer_batch_create(in->p.ep, XFER_BATCH_PUT, in->mem, in->rkey, d, n, &b),
                     XFER_OK);
        cr_assert_eq(xfer_batch_post(b, &r, sizeof(r), 0, NULL, NULL, &req), XFER_OK);
        cr_assert_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_OK, "round %u", r);
        cr_expect_eq(xfer_request_landed(req), n);
        cr_expect_eq(xfer_request_length(req), desc_bytes(d, n));
        xfer_request_release(req);
        cr_assert_eq(xfer_batch_destroy(b), XFER_OK);
    }
    tp_send(&in->p, handler ? CMD_HANDLER : CMD_POLL);
    tp_send(&in->p, ROUNDS);
    cr_expect_eq(tb_recv_progressing(in), ROUNDS, "rounds whose data was all there when their "
                 "notification arrived");
}

Test(batch, put_batches_land_and_each_notification_comes_after_its_data)
{
    init_t in;

    tb_init_start(&in, tb_srv_target);
    put_rounds(&in, 0);
    tb_init_finish(&in);
}

Test(batch, a_notification_handler_sees_the_data_too)
{
    init_t in;

    tb_init_start(&in, tb_srv_target);
    put_rounds(&in, 1);
    tb_init_finish(&in);
}

/* Gets: the target's buffer holds pattern 7; each round reads its blocks into src at their
 * local offsets; the target's notification comes after. */
static void status_cb(xfer_request_t *req, xfer_status_t status, void *arg)
{
    (void)req;
    *(xfer_status_t*)arg = status;
}

/* An application's loop that arms right after the post: arm must say busy while the batch has
 * bytes its post left queued for progress (tcp writes 64 KiB inside the post), or the loop
 * sleeps on an fd that nothing will wake. The loop learns of the end by the callback, which
 * runs from progress: xfer_request_test() would progress before the first arm. */
Test(batch, a_large_batch_completes_in_a_loop_that_arms_right_after_its_post)
{
    xfer_status_t done = XFER_INPROGRESS;
    xfer_batch_desc_t d[NDESC];
    xfer_request_t *req = NULL;
    struct pollfd pfd;
    uint32_t r = 0;
    xfer_batch_t *b;
    size_t n;
    init_t in;

    tb_init_start(&in, tb_srv_target);
    pfd = (struct pollfd){xfer_context_event_fd(in.p.ctx), POLLIN, 0};
    cr_assert_geq(pfd.fd, 0);
    n = round_descs(r, d);
    cr_assert_gt(desc_bytes(d, n), 256u << 10, "the round is not larger than a post writes");
    tp_fill_pattern(in.src, SRC_LEN, 100 + r);
    cr_assert_eq(xfer_batch_create(in.p.ep, XFER_BATCH_PUT, in.mem, in.rkey, d, n, &b), XFER_OK);
    cr_assert(TP_POSTED(xfer_batch_post(b, &r, sizeof(r), 0, status_cb, &done, &req)));
    for (double end = tp_now_ms() + TP_WAIT_MS; done == XFER_INPROGRESS;) {
        xfer_status_t st = xfer_context_arm(in.p.ctx);

        cr_assert(st == XFER_OK || st == XFER_ERR_BUSY, "arm: %s", xfer_status_string(st));
        if (st == XFER_OK) {
            cr_assert_eq(poll(&pfd, 1, (int)(end - tp_now_ms())), 1, "the loop slept and "
                         "nothing woke it: the batch was still in progress");
        }
        xfer_progress(in.p.ctx);
    }
    cr_assert_eq(done, XFER_OK);
    cr_expect_eq(xfer_request_landed(req), n);
    xfer_request_release(req);
    cr_assert_eq(xfer_batch_destroy(b), XFER_OK);
    tp_send(&in.p, CMD_POLL);
    tp_send(&in.p, 1);
    cr_expect_eq(tb_recv_progressing(&in), 1, "the data was not all there at the notification");
    tb_init_finish(&in);
}

/* The endpoint closed with XFER_CLOSE_FLAG_FORCE right after a large batch's post, while
 * bytes of it wait for progress (tcp: the post writes 64 KiB): the batch ends (canceled, or
 * done where the post moved it all), its callback saying the same, a later post is refused,
 * and nothing of the closed endpoint is touched after (ASan, valgrind). */
Test(batch, a_forced_close_right_after_a_large_post_ends_the_batch_once)
{
    xfer_status_t done = XFER_INPROGRESS;
    xfer_request_t *req = NULL, *creq = NULL;
    xfer_batch_desc_t d[NDESC];
    xfer_status_t s;
    uint32_t r = 0;
    xfer_batch_t *b;
    size_t n;
    init_t in;

    tb_init_start(&in, tb_srv_target);
    n = round_descs(r, d);
    tp_fill_pattern(in.src, SRC_LEN, 100 + r);
    cr_assert_eq(xfer_batch_create(in.p.ep, XFER_BATCH_PUT, in.mem, in.rkey, d, n, &b), XFER_OK);
    cr_assert(TP_POSTED(xfer_batch_post(b, &r, sizeof(r), 0, status_cb, &done, &req)));
    s = xfer_endpoint_close_nb(in.p.ep, XFER_CLOSE_FLAG_FORCE, NULL, NULL, &creq);
    in.p.ep = NULL;
    cr_assert(TP_POSTED(s), "close: %s", xfer_status_string(s));
    if (creq != NULL) {
        (void)xfer_request_wait(creq, TP_WAIT_MS);
        xfer_request_release(creq);
    }
    cr_assert_eq(xfer_request_wait(req, TP_WAIT_MS), done);
    cr_expect(done == XFER_OK || done == XFER_ERR_CANCELED, "the batch ended with %s",
              xfer_status_string(done));
    xfer_request_release(req);
    cr_expect_eq(xfer_batch_post(b, &r, sizeof(r), 0, NULL, NULL, &req), XFER_ERR_CONNECTION);
    cr_assert_eq(xfer_batch_destroy(b), XFER_OK);
    tb_init_finish(&in);
}

Test(batch, get_batches_read_what_the_target_holds)
{
    uint8_t *image = malloc(DST_LEN);
    init_t in;

    cr_assert_not_null(image);
    tb_init_start(&in, tb_srv_target);
    tp_send(&in.p, CMD_FILL);
    tp_send(&in.p, 7);
    cr_assert_eq(tp_recv(&in.p), 0);
    tp_fill_pattern(image, DST_LEN, 7);
    for (uint32_t r = 0; r < ROUNDS; r++) {
        xfer_batch_desc_t d[NDESC];
        size_t n = round_descs(r, d);
        xfer_request_t *req = NULL;
        xfer_batch_t *b;

        memset(in.src, 0, SRC_LEN);
        cr_assert_eq(xfer_batch_create(in.p.ep, XFER_BATCH_GET, in.mem, in.rkey, d, n, &b),
                     XFER_OK);
        cr_assert_eq(xfer_batch_post(b, &r, sizeof(r), 0, NULL, NULL, &req), XFER_OK);
        cr_assert_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_OK, "round %u", r);
        cr_expect_eq(xfer_request_landed(req), n);
        for (size_t i = 0; i < n; i++) {
            cr_assert(memcmp(in.src + d[i].local_offset, image + d[i].remote_offset,
                             d[i].length) == 0, "round %u descriptor %zu differs", r, i);
        }
        xfer_request_release(req);
        cr_assert_eq(xfer_batch_destroy(b), XFER_OK);
    }
    tp_send(&in.p, CMD_ORDER);
    tp_send(&in.p, ROUNDS);
    cr_expect_eq(tb_recv_progressing(&in), ROUNDS, "notifications of the gets in order");
    free(image);
    tb_init_finish(&in);
}

/* Batches of thousands of descriptors - more than a target reads of them at a time (shm
 * reads 1024, tcp carries 1024 a PUTV frame) - of 512 bytes each, placed out of order: a put
 * batch lands every block and a get batch of the same list reads every one back. */
#define MANY_DESCS 2600u
#define MANY_LEN   512u

/* Post one batch of kind over d and wait: every descriptor must land. */
static void many_batch(init_t *in, xfer_batch_op_t kind, const xfer_batch_desc_t *d)
{
    xfer_request_t *req = NULL;
    xfer_batch_t *b;

    cr_assert_eq(xfer_batch_create(in->p.ep, kind, in->mem, in->rkey, d, MANY_DESCS, &b),
                 XFER_OK);
    cr_assert_eq(xfer_batch_post(b, NULL, 0, 0, NULL, NULL, &req), XFER_OK);
    cr_assert_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
    cr_expect_eq(xfer_request_landed(req), MANY_DESCS);
    xfer_request_release(req);
    cr_assert_eq(xfer_batch_destroy(b), XFER_OK);
}

Test(batch, batches_of_thousands_of_descriptors_land_and_read_back_whole)
{
    xfer_batch_desc_t *d = calloc(MANY_DESCS, sizeof(*d));
    uint8_t *put_image   = malloc((size_t)MANY_DESCS * MANY_LEN);
    init_t in;

    cr_assert((d != NULL) && (put_image != NULL));
    for (uint64_t i = 0; i < MANY_DESCS; i++) {
        d[i] = (xfer_batch_desc_t){i * MANY_LEN, ((i * 1543) % MANY_DESCS) * MANY_LEN,
                                   MANY_LEN};
    }
    tb_init_start(&in, tb_srv_target);
    tp_fill_pattern(in.src, SRC_LEN, 41);
    memcpy(put_image, in.src, (size_t)MANY_DESCS * MANY_LEN);
    many_batch(&in, XFER_BATCH_PUT, d);
    memset(in.src, 0, SRC_LEN);
    many_batch(&in, XFER_BATCH_GET, d);
    for (size_t i = 0; i < MANY_DESCS; i++) {
        cr_assert(memcmp(in.src + i * MANY_LEN, put_image + i * MANY_LEN, MANY_LEN) == 0,
                  "descriptor %zu did not come back as it was put", i);
    }
    free(put_image);
    free(d);
    tb_init_finish(&in);
}

/* One prepared list of 256 x 4 KiB posted 8 times without waiting, each with a notification
 * numbered in posting order: all complete, and the target sees 0..7 in order. */
Test(batch, a_prepared_list_is_posted_many_times_at_once_and_notifies_in_order)
{
    xfer_batch_desc_t d[256];
    xfer_request_t *reqs[8];
    xfer_batch_t *b;
    init_t in;

    tb_init_start(&in, tb_srv_target);
    for (unsigned i = 0; i < 256; i++) {
        d[i] = (xfer_batch_desc_t){i * 4096ull, (255 - i) * 4096ull, 4096};
    }
    tp_fill_pattern(in.src, SRC_LEN, 3);
    cr_assert_eq(xfer_batch_create(in.p.ep, XFER_BATCH_PUT, in.mem, in.rkey, d, 256, &b),
                 XFER_OK);
    for (uint32_t i = 0; i < 8; i++) {
        cr_assert_eq(xfer_batch_post(b, &i, sizeof(i), 0, NULL, NULL, &reqs[i]), XFER_OK);
    }
    /* destroyed while posted: it goes once the last post ends */
    cr_assert_eq(xfer_batch_destroy(b), XFER_OK);
    for (unsigned i = 0; i < 8; i++) {
        cr_expect_eq(xfer_request_wait(reqs[i], TP_WAIT_MS), XFER_OK, "post %u", i);
        cr_expect_eq(xfer_request_landed(reqs[i]), 256);
        xfer_request_release(reqs[i]);
    }
    tp_send(&in.p, CMD_ORDER);
    tp_send(&in.p, 8);
    cr_expect_eq(tb_recv_progressing(&in), 8, "notifications in posting order");
    tb_init_finish(&in);
}

/* Many small batches with notifications, not waited for one by one: order per peer holds. */
Test(batch, two_hundred_notifications_arrive_in_order)
{
    xfer_request_t *reqs[200];
    xfer_batch_desc_t d = {0, 0, 64};
    xfer_batch_t *b;
    init_t in;

    tb_init_start(&in, tb_srv_target);
    cr_assert_eq(xfer_batch_create(in.p.ep, XFER_BATCH_PUT, in.mem, in.rkey, &d, 1, &b),
                 XFER_OK);
    for (uint32_t i = 0; i < 200; i++) {
        cr_assert_eq(xfer_batch_post(b, &i, sizeof(i), 0, NULL, NULL, &reqs[i]), XFER_OK);
    }
    tp_send(&in.p, CMD_ORDER);
    tp_send(&in.p, 200);
    cr_expect_eq(tb_recv_progressing(&in), 200);
    for (unsigned i = 0; i < 200; i++) {
        cr_expect_eq(xfer_request_wait(reqs[i], TP_WAIT_MS), XFER_OK);
        xfer_request_release(reqs[i]);
    }
    cr_assert_eq(xfer_batch_destroy(b), XFER_OK);
    tb_init_finish(&in);
}
