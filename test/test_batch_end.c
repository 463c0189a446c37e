/*
 * The batch suite continued (test_batch.c holds its data path and the helpers test_batch.h
 * declares), over the transport under test: a batch that cannot finish ends at its deadline
 * or its cancel with the count of what landed; a refused descriptor fails its batch and
 * suppresses its notification; a peer that floods notifications past the bound fails the
 * endpoint; a notification handler may post a batch of its own and close its endpoint, after
 * which nothing more reaches it; bad lists are refused where they are made.
 */
#include "test_batch.h"
#include "test_peer.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

/* ---- ending early ---------------------------------------------------------------------------- */

/* A batch of 96 x 1 MiB puts while the target does not progress for 3 s. Over transports that
 * need the target (tcp, shm) it cannot finish: it ends at its 300 ms deadline (or at once on
 * cancel) with fewer than all descriptors landed, the local memory busy until the transport
 * lets go. An RDMA NIC writes without the target's CPU, and so does shm's initiator into
 * xfer_mem_alloc memory that it mapped: there it may complete, and then it is whole. Either
 * way it ends in time, and the endpoint works afterwards. */
static int completes_without_the_target(void)
{
    const char *map = getenv("XFER_SHM_MAP");

    return (strcmp(tp_transport(), "verbs") == 0) ||
           ((strcmp(tp_transport(), "shm") == 0) && tb_target_mem_alloc() &&
            ((map == NULL) || (map[0] != 'n')));
}

static void ended_early(int cancel)
{
    static xfer_batch_desc_t d[96];
    xfer_request_t *req;
    xfer_status_t st;
    xfer_batch_t *b;
    double dt;
    init_t in;

    tb_init_start(&in, tb_srv_target);
    for (unsigned i = 0; i < 96; i++) {
        d[i] = (xfer_batch_desc_t){(i % 8) * (1ull << 20), i * (1ull << 18), 1u << 18};
    }
    st = tb_post_ended_early(&in, d, 96, 3000, cancel, &req, &b, &dt);
    if (st == XFER_OK) {
        cr_expect(completes_without_the_target(), "only an RDMA NIC or a mapping finishes "
                  "without the target; over %s it completed", tp_transport());
        cr_expect_eq(xfer_request_landed(req), 96);
    } else {
        cr_expect_eq(st, cancel ? XFER_ERR_CANCELED : XFER_ERR_TIMEOUT, "%s",
                     xfer_status_string(st));
        cr_expect_lt(xfer_request_landed(req), 96);
        cr_expect_lt(dt, 2000, "it took %.0f ms to end", dt);
    }
    xfer_request_release(req);
    cr_assert_eq(xfer_batch_destroy(b), XFER_OK);
    /* once the target is back the endpoint carries on: a flush behind what was in flight
     * completes, the transport has let go, and tb_init_finish can deregister the memory */
    cr_assert_eq(tb_recv_progressing(&in), 0);
    {
        xfer_request_t *f = NULL;

        cr_assert_eq(xfer_endpoint_flush(in.p.ep, NULL, NULL, &f), XFER_OK);
        cr_expect_eq(xfer_request_wait(f, TP_WAIT_MS), XFER_OK);
        xfer_request_release(f);
        tp_progress_for(in.p.ctx, 50);
    }
    tb_init_finish(&in);
}

Test(batch, a_batch_that_cannot_finish_ends_at_its_deadline_saying_what_landed)
{
    ended_early(0);
}

Test(batch, a_cancelled_batch_ends_saying_what_landed)
{
    ended_early(1);
}

/* The target deregisters its buffer; a batch into it is refused and notifies nobody. Where
 * the endpoint survives the refusal (tcp, shm), the next batch into the same place fails too
 * and the target has no notification queued. */
Test(batch, a_refused_batch_fails_and_sends_no_notification)
{
    xfer_batch_desc_t d[4] = {{0, 0, 4096}, {4096, 8192, 4096}, {0, 65536, 100},
                              {0, 1 << 20, 1 << 20}};
    xfer_request_t *req = NULL;
    xfer_status_t st;
    xfer_batch_t *b;
    uint32_t one = 1;
    init_t in;

    tb_init_start(&in, tb_srv_target);
    tp_fill_pattern(in.src, SRC_LEN, 5);
    tp_send(&in.p, CMD_DEREG);
    cr_assert_eq(tb_recv_progressing(&in), 0);
    cr_assert_eq(xfer_batch_create(in.p.ep, XFER_BATCH_PUT, in.mem, in.rkey, d, 4, &b),
                 XFER_OK);
    cr_assert_eq(xfer_batch_post(b, &one, sizeof(one), 0, NULL, NULL, &req), XFER_OK);
    st = xfer_request_wait(req, TP_WAIT_MS);
    cr_expect_neq(st, XFER_OK);
    cr_expect_lt(xfer_request_landed(req), 4);
    xfer_request_release(req);
    cr_assert_eq(xfer_batch_destroy(b), XFER_OK);
    tp_send(&in.p, CMD_COUNT);
    cr_expect_eq(tb_recv_progressing(&in), 0, "a refused batch's notification was delivered");
    tb_init_finish(&in);
}

/* The target keeps at most 4 notifications; the initiator sends 12 it does not take: the
 * target's endpoint fails with XFER_ERR_NO_RESOURCE instead of holding more. The initiator may
 * hear of that before its last posts, which then fail - never before the fifth. */
static int srv_hoarder(tp_side_t *s)
{
    return tb_srv_target(s);
}

Test(batch, a_peer_that_floods_notifications_fails_the_endpoint)
{
    xfer_batch_desc_t d = {0, 0, 8};
    xfer_request_t *reqs[12];
    unsigned posted;
    xfer_batch_t *b;
    init_t in;

    setenv("XFER_NOTIFY_MAX_QUEUED", "4", 1);
    tb_init_start(&in, srv_hoarder);
    unsetenv("XFER_NOTIFY_MAX_QUEUED");
    cr_assert_eq(xfer_batch_create(in.p.ep, XFER_BATCH_PUT, in.mem, in.rkey, &d, 1, &b),
                 XFER_OK);
    for (posted = 0; posted < 12; posted++) {
        uint32_t i = posted;
        xfer_status_t st = xfer_batch_post(b, &i, sizeof(i), 0, NULL, NULL, &reqs[i]);

        if (st != XFER_OK) {
            double end = tp_now_ms() + TP_WAIT_MS;

            /* the target failed the endpoint on the fifth already, and this side heard; the
             * endpoint reports it from the next progress (a post cannot call back) */
            cr_assert_geq(posted, 5, "post %u: %s", posted, xfer_status_string(st));
            while ((xfer_endpoint_status(in.p.ep) == XFER_OK) && (tp_now_ms() < end)) {
                xfer_progress(in.p.ctx);
            }
            cr_assert_neq(xfer_endpoint_status(in.p.ep), XFER_OK, "post %u failed (%s) on a "
                          "working endpoint", posted, xfer_status_string(st));
            break;
        }
    }
    for (unsigned i = 0; i < posted; i++) {
        (void)xfer_request_wait(reqs[i], TP_WAIT_MS);
        xfer_request_release(reqs[i]);
    }
    cr_assert_eq(xfer_batch_destroy(b), XFER_OK);
    tp_send(&in.p, CMD_STATUS);
    cr_expect_eq((xfer_status_t)(int64_t)tb_recv_progressing(&in), XFER_ERR_NO_RESOURCE);
    tb_init_finish(&in);
}

/* ---- checked where made ---------------------------------------------------------------------- */

/* ---- a handler that posts and closes -------------------------------------------------------- */

#define REPLY_LEN (64u << 10)   /* the target's buffer: the handler's get fills the first half,
                                 * the initiator's notifying puts write the last 4 KiB */

typedef struct replier {
    tp_side_t      *s;
    uint8_t        *dst;
    xfer_mem_t     *mem;
    xfer_rkey_t    *rkey;       /* the initiator's buffer */
    xfer_request_t *req;        /* the handler's batch */
    xfer_status_t  reply_status;
    int            replied;
    uint64_t       seen, after_close;
    int            closed;
} replier_t;

static void reply_done(xfer_request_t *req, xfer_status_t status, void *arg)
{
    replier_t *r = arg;

    (void)req;
    r->reply_status = status;
    r->replied      = 1;
}

/* The first notification: read the initiator's first half buffer back with a get batch
 * posted from here. The second: close the endpoint, from here. Any later one is a bug. */
static void replier_handler(xfer_endpoint_t *ep, const void *msg, size_t len, void *arg)
{
    replier_t *r = arg;
    xfer_batch_desc_t d = {0, 0, REPLY_LEN / 2};
    xfer_batch_t *b = NULL;

    (void)msg;
    (void)len;
    if (r->closed) {
        r->after_close++;
        return;
    }
    if (r->seen++ == 0) {
        r->reply_status = xfer_batch_create(ep, XFER_BATCH_GET, r->mem, r->rkey, &d, 1, &b);
        if (r->reply_status == XFER_OK) {
            r->reply_status = xfer_batch_post(b, NULL, 0, 0, reply_done, r, &r->req);
            xfer_batch_destroy(b);      /* the post keeps what it needs */
        }
        r->replied = (r->reply_status != XFER_OK);
        return;
    }
    xfer_endpoint_close(ep);
    r->s->ep = NULL;
    r->closed = 1;
}

static int srv_replier(tp_side_t *s)
{
    replier_t r = {.s = s, .dst = calloc(1, REPLY_LEN), .reply_status = XFER_ERR_NOT_FOUND};
    uint8_t *image = malloc(REPLY_LEN);
    void *blob;
    size_t len;
    double end;

    TP_CHECK((r.dst != NULL) && (image != NULL), "malloc");
    TP_CHECK_STATUS(xfer_mem_register(s->ctx, r.dst, REPLY_LEN, XFER_MEM_HOST, &r.mem), XFER_OK);
    TP_CHECK_STATUS(xfer_rkey_pack(r.mem, &blob, &len), XFER_OK);
    TP_CHECK(tp_ctl_send(s->ctl, blob, len) == 0, "ctl");
    xfer_rkey_blob_free(blob);
    TP_CHECK(tp_ctl_recv_alloc(s->ctl, &blob, &len, TP_WAIT_MS) == 0, "ctl");
    TP_CHECK_STATUS(xfer_rkey_unpack(s->ep, blob, len, &r.rkey), XFER_OK);
    free(blob);
    TP_CHECK_STATUS(xfer_notify_handler_set(s->ctx, replier_handler, &r), XFER_OK);
    /* until closed with the handler's get done, then a little longer for strays */
    end = tp_now_ms() + TP_WAIT_MS;
    while (!(r.closed && r.replied) && (tp_now_ms() < end)) {
        xfer_progress(s->ctx);
    }
    tp_progress_for(s->ctx, 300);
    if (r.req != NULL) {
        xfer_request_release(r.req);
    }
    tp_fill_pattern(image, REPLY_LEN, 77);
    TP_CHECK(tp_ctl_send_u64(s->ctl, r.seen) == 0, "ctl");
    TP_CHECK(tp_ctl_send_u64(s->ctl, r.after_close) == 0, "ctl");
    TP_CHECK(tp_ctl_send_u64(s->ctl, (uint64_t)(int64_t)r.reply_status) == 0, "ctl");
    TP_CHECK(tp_ctl_send_u64(s->ctl, memcmp(r.dst, image, REPLY_LEN / 2) == 0) == 0, "ctl");
    TP_CHECK_STATUS(xfer_notify_handler_set(s->ctx, NULL, NULL), XFER_OK);
    xfer_rkey_destroy(r.rkey);
    TP_CHECK_STATUS(xfer_mem_deregister(r.mem), XFER_OK);
    free(r.dst);
    free(image);
    return 0;
}

Test(batch, a_notification_handler_may_post_a_batch_and_close_its_endpoint)
{
    xfer_batch_desc_t d = {REPLY_LEN - 4096, REPLY_LEN - 4096, 4096};
    uint8_t *src = malloc(REPLY_LEN);
    xfer_request_t *req[4];
    xfer_status_t st;
    xfer_rkey_t *rkey;
    xfer_mem_t *mem;
    xfer_batch_t *b;
    void *blob;
    size_t len;
    tp_peer_t p;

    cr_assert_not_null(src);
    tp_fill_pattern(src, REPLY_LEN, 77);
    tp_start(&p, srv_replier, NULL);
    cr_assert_eq(xfer_mem_register(p.ctx, src, REPLY_LEN, XFER_MEM_HOST, &mem), XFER_OK);
    blob = tp_recv_blob(&p, &len);
    cr_assert_eq(xfer_rkey_unpack(p.ep, blob, len, &rkey), XFER_OK);
    free(blob);
    cr_assert_eq(xfer_rkey_pack(mem, &blob, &len), XFER_OK);
    tp_send_blob(&p, blob, len);
    xfer_rkey_blob_free(blob);

    /* four notifying puts, one at a time, each after the handler has had the previous */
    cr_assert_eq(xfer_batch_create(p.ep, XFER_BATCH_PUT, mem, rkey, &d, 1, &b), XFER_OK);
    for (int i = 0; i < 4; i++) {
        uint32_t n = (uint32_t)i;
        double end = tp_now_ms() + 300;

        req[i] = NULL;
        st     = xfer_batch_post(b, &n, sizeof(n), 0, NULL, NULL, &req[i]);
        if (i < 2) {
            cr_assert_eq(st, XFER_OK, "post %d: %s", i, xfer_status_string(st));
        }
        if (req[i] != NULL) {
            st = xfer_request_wait(req[i], TP_WAIT_MS);
        }
        if (i < 2) {
            cr_expect_eq(st, XFER_OK, "batch %d: %s", i, xfer_status_string(st));
        }   /* after the target's close: an error, now or at the post */
        while (tp_now_ms() < end) {
            xfer_progress(p.ctx);   /* serves the handler's get */
        }
    }
    for (int i = 0; i < 4; i++) {
        if (req[i] != NULL) {
            xfer_request_release(req[i]);
        }
    }
    cr_assert_eq(xfer_batch_destroy(b), XFER_OK);
    xfer_rkey_destroy(rkey);
    cr_expect_eq(tb_recv_progressing_peer(&p), 2, "notifications the handler took");
    cr_expect_eq(tb_recv_progressing_peer(&p), 0, "notifications after its close");
    cr_expect_eq((xfer_status_t)(int64_t)tb_recv_progressing_peer(&p), XFER_OK,
                 "the handler's own batch");
    cr_expect_eq(tb_recv_progressing_peer(&p), 1, "its data");
    cr_assert_eq(xfer_mem_deregister(mem), XFER_OK);
    free(src);
    tp_finish(&p);
}

Test(batch, bad_lists_and_notifications_are_refused_where_they_are_made)
{
    xfer_batch_desc_t d[2] = {{0, 0, 16}, {SRC_LEN - 8, 0, 16}};
    uint8_t big[8192] = {0};
    xfer_batch_t *b = NULL;
    init_t in;

    tb_init_start(&in, tb_srv_target);
    cr_expect_eq(xfer_batch_create(in.p.ep, XFER_BATCH_PUT, in.mem, in.rkey, d, 2, &b),
                 XFER_ERR_OUT_OF_RANGE, "local range past the registration");
    d[1] = (xfer_batch_desc_t){0, DST_LEN - 8, 16};
    cr_expect_eq(xfer_batch_create(in.p.ep, XFER_BATCH_GET, in.mem, in.rkey, d, 2, &b),
                 XFER_ERR_OUT_OF_RANGE, "remote range past the key");
    d[1] = (xfer_batch_desc_t){UINT64_MAX - 4, 0, 16};
    cr_expect_eq(xfer_batch_create(in.p.ep, XFER_BATCH_PUT, in.mem, in.rkey, d, 2, &b),
                 XFER_ERR_OUT_OF_RANGE, "wrapping offset");
    cr_expect_eq(xfer_batch_create(in.p.ep, XFER_BATCH_PUT, in.mem, in.rkey, d, 0, &b),
                 XFER_ERR_INVALID_PARAM, "empty list");
    cr_expect_eq(xfer_batch_create(in.p.ep, (xfer_batch_op_t)9, in.mem, in.rkey, d, 1, &b),
                 XFER_ERR_INVALID_PARAM, "unknown operation");
    cr_assert_eq(xfer_batch_create(in.p.ep, XFER_BATCH_PUT, in.mem, in.rkey, d, 1, &b),
                 XFER_OK);
    cr_expect_eq(xfer_batch_post(b, big, sizeof(big), 0, NULL, NULL, NULL),
                 XFER_ERR_INVALID_PARAM, "notification past XFER_NOTIFY_MAX_LEN");
    cr_expect_eq(xfer_batch_post(b, NULL, 4, 0, NULL, NULL, NULL), XFER_ERR_INVALID_PARAM);
    cr_expect_eq(xfer_batch_post(b, NULL, 0, -5, NULL, NULL, NULL), XFER_ERR_INVALID_PARAM);
    /* the registration is held by the list */
    cr_expect_eq(xfer_mem_deregister(in.mem), XFER_ERR_BUSY);
    cr_assert_eq(xfer_batch_destroy(b), XFER_OK);
    {
        size_t len = 0;
        uint8_t buf[8];

        cr_expect_eq(xfer_notify_poll(in.p.ep, buf, sizeof(buf), &len), XFER_ERR_NOT_FOUND);
    }
    tb_init_finish(&in);
}
