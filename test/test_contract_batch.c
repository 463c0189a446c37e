/*
 * The contract (docs/contract.md), batches: a batch that ends early - cancelled, or past its
 * deadline - delivers no notification, and one whose notification was delivered completes
 * XFER_OK with every descriptor landed. Never both: the target's word is final.
 */
#include "contract.h"

#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define TGT_LEN   (8u << 20)
#define SRC_LEN   (1u << 20)
#define POSTS     300
#define INFLIGHT  8

/* The target: registers TGT_LEN bytes, sends the key, takes notifications (each a u32 batch
 * number) by handler until the initiator says how many posts there were and that all ended;
 * then progresses a while longer (a notification must not come after the batch ended) and
 * sends the bitmap of the numbers it saw, and how often it saw one twice. */
typedef struct seen {
    uint8_t  bits[POSTS];
    uint64_t twice, bad;
} seen_t;

static void seen_cb(xfer_endpoint_t *ep, const void *msg, size_t len, void *arg)
{
    seen_t *s = arg;
    uint32_t i;

    (void)ep;
    if (len != sizeof(i)) {
        s->bad++;
        return;
    }
    memcpy(&i, msg, sizeof(i));
    if (i >= POSTS) {
        s->bad++;
    } else if (s->bits[i]++) {
        s->twice++;
    }
}

/* A target's start: registers dst (NULL: dst_len bytes from xfer_mem_alloc), sends its key,
 * takes notifications by handler (cb, arg), and progresses until the initiator's first word.
 * Its registration. */
static xfer_mem_t *target_open(tp_side_t *s, void *dst, size_t dst_len, xfer_notify_cb_t cb,
                               void *arg)
{
    xfer_mem_t *mem = ct_offer(s, dst, dst_len);

    TP_CHECK_STATUS(xfer_notify_handler_set(s->ctx, cb, arg), XFER_OK);
    TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS * 3) == 0, "no word from the initiator");
    return mem;
}

/* A target's end: once the initiator says its batches ended, progresses a while longer (a
 * notification must not come after), sends what it saw (seen, len bytes) and lets go. */
static void target_report(tp_side_t *s, xfer_mem_t *mem, const void *seen, size_t len)
{
    uint64_t v;

    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
    tp_progress_for(s->ctx, 200);
    TP_CHECK(tp_ctl_send(s->ctl, seen, len) == 0, "ctl");
    TP_CHECK_STATUS(xfer_notify_handler_set(s->ctx, NULL, NULL), XFER_OK);
    TP_CHECK_STATUS(xfer_mem_deregister(mem), XFER_OK);
}

/* The initiator's end: waits for the n batches to complete XFER_OK, tells the target, and
 * takes its report (report_len bytes). */
static void batches_end(tp_peer_t *p, xfer_request_t **reqs, uint32_t n, void *report,
                        size_t report_len)
{
    size_t len;

    for (uint32_t i = 0; i < n; i++) {
        cr_assert_eq(xfer_request_wait(reqs[i], TP_WAIT_MS), XFER_OK, "batch %u", i);
        xfer_request_release(reqs[i]);
    }
    tp_send(p, 1);
    cr_assert_eq(tp_ctl_recv(p->ctl, report, report_len, &len, TP_WAIT_MS * 2), 0);
    cr_assert_eq(len, report_len);
}

static int srv_notified(tp_side_t *s)
{
    static uint8_t dst[TGT_LEN];
    static seen_t seen;
    xfer_mem_t *mem;
    uint64_t v;

    mem = target_open(s, dst, sizeof(dst), seen_cb, &seen);
    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
    tp_progress_for(s->ctx, 300);
    TP_CHECK(tp_ctl_send(s->ctl, &seen, sizeof(seen)) == 0, "ctl");
    /* the initiator flushes (what ended early may still be on its way) */
    TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS * 3) == 0, "no word from the initiator");
    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
    TP_CHECK_STATUS(xfer_notify_handler_set(s->ctx, NULL, NULL), XFER_OK);
    TP_CHECK_STATUS(xfer_mem_deregister(mem), XFER_OK);
    return 0;
}

typedef struct post {
    xfer_request_t *req;
    xfer_status_t  status;
    size_t         landed;
    int            cancel_ok;   /* xfer_request_cancel said XFER_OK */
} post_t;

/* POSTS batches of ndesc blocks of blk bytes, INFLIGHT at a time, each with its number as
 * notification; every third cancelled at once (cancel), or all given a deadline of
 * timeout_ms. Then every batch that completed XFER_OK was notified once, all of its
 * descriptors landed, and no batch that ended otherwise was notified. */
static void cancel_or_deadline(int cancel, int timeout_ms, size_t ndesc, uint64_t blk)
{
    static post_t posts[POSTS];
    xfer_batch_desc_t *d = calloc(ndesc, sizeof(*d));
    unsigned ok = 0, ended = 0;
    xfer_mem_t *mem;
    xfer_rkey_t *rkey;
    xfer_batch_t *b;
    uint8_t *src;
    void *blob;
    size_t len;
    seen_t seen;
    tp_peer_t p;

    cr_assert_not_null(d);
    memset(posts, 0, sizeof(posts));
    tp_start(&p, srv_notified, NULL);
    src = malloc(SRC_LEN);
    cr_assert_not_null(src);
    tp_fill_pattern(src, SRC_LEN, 3);
    cr_assert_eq(xfer_mem_register(p.ctx, src, SRC_LEN, XFER_MEM_HOST, &mem), XFER_OK);
    blob = tp_recv_blob(&p, &len);
    cr_assert_eq(xfer_rkey_unpack(p.ep, blob, len, &rkey), XFER_OK);
    free(blob);
    for (size_t i = 0; i < ndesc; i++) {
        d[i] = (xfer_batch_desc_t){(i * blk) % (SRC_LEN - blk), (i * blk) % (TGT_LEN - blk),
                                   blk};
    }
    cr_assert_eq(xfer_batch_create(p.ep, XFER_BATCH_PUT, mem, rkey, d, ndesc, &b), XFER_OK);
    for (uint32_t i = 0; i < POSTS + INFLIGHT; i++) {
        if (i >= INFLIGHT) {
            post_t *q = &posts[i - INFLIGHT];

            q->status = xfer_request_wait(q->req, TP_WAIT_MS);
            cr_assert_neq(xfer_request_test(q->req), XFER_INPROGRESS, "batch %u did not end "
                          "within %d ms", i - INFLIGHT, TP_WAIT_MS);
            q->landed = xfer_request_landed(q->req);
            xfer_request_release(q->req);
            q->req = NULL;
        }
        if (i < POSTS) {
            post_t *q = &posts[i];

            cr_assert_eq(xfer_batch_post(b, &i, sizeof(i), cancel ? XFER_BATCH_NO_TIMEOUT :
                                         timeout_ms, NULL, NULL, &q->req), XFER_OK);
            if (cancel && (i % 3 == 0)) {
                xfer_status_t c = xfer_request_cancel(q->req);

                cr_assert((c == XFER_OK) || (c == XFER_ERR_BUSY), "cancel: %s",
                          xfer_status_string(c));
                q->cancel_ok = (c == XFER_OK);
            }
        }
    }
    tp_send(&p, 1);
    cr_assert_eq(tp_ctl_recv(p.ctl, &seen, sizeof(seen), &len, TP_WAIT_MS * 2), 0);
    cr_assert_eq(len, sizeof(seen));
    cr_expect_eq(seen.twice, 0, "notifications delivered twice");
    cr_expect_eq(seen.bad, 0, "notifications that were not sent");
    for (unsigned i = 0; i < POSTS; i++) {
        const post_t *q = &posts[i];

        if (q->status == XFER_OK) {
            ok++;
            cr_expect(seen.bits[i], "batch %u completed XFER_OK but its notification never "
                      "came", i);
            cr_expect_eq(q->landed, ndesc, "batch %u completed XFER_OK with %zu of %zu "
                         "descriptors landed", i, q->landed, ndesc);
            cr_expect(!q->cancel_ok, "batch %u: its cancel said XFER_OK, then it completed "
                      "XFER_OK", i);
        } else {
            ended++;
            cr_expect_eq(q->status, cancel ? XFER_ERR_CANCELED : XFER_ERR_TIMEOUT, "batch %u "
                         "ended with %s", i, xfer_status_string(q->status));
            cr_expect(!seen.bits[i], "batch %u ended with %s, and its notification was "
                      "delivered too", i, xfer_status_string(q->status));
            cr_expect_leq(q->landed, ndesc);
            if (cancel) {
                cr_expect(q->cancel_ok, "batch %u was cancelled though its cancel said "
                          "XFER_ERR_BUSY", i);
            }
        }
    }
    cr_log_info("over %s: %u batches completed, %u ended early", tp_transport(), ok, ended);
    if (!cancel) {
        cr_expect_eq(ok + ended, POSTS);
    }
    cr_assert_eq(xfer_batch_destroy(b), XFER_OK);
    xfer_rkey_destroy(rkey);
    {
        xfer_status_t st = tp_flush(p.ep, TP_WAIT_MS);

        cr_assert_eq(st, XFER_OK, "the flush after the batches: %s", xfer_status_string(st));
    }
    tp_send(&p, 2);
    cr_assert_eq(xfer_mem_deregister(mem), XFER_OK);
    free(src);
    free(d);
    tp_finish(&p);
}

Test(contract, a_cancelled_batch_is_either_cancelled_unnotified_or_complete_and_notified)
{
    cancel_or_deadline(1, 0, 16, 4096);
}

Test(contract, a_batch_past_its_deadline_is_either_unnotified_or_complete_and_notified)
{
    cancel_or_deadline(0, 1, 64, 16384);
}

/* ---- notifications in posting order -------------------------------------------------------- */

#define ORDER_POSTS 40
#define GET_DESCS   64
#define GET_BLK     (64u << 10)

typedef struct order {
    uint32_t got[ORDER_POSTS];
    uint32_t n;
    uint64_t bad;
} order_t;

static void order_cb(xfer_endpoint_t *ep, const void *msg, size_t len, void *arg)
{
    order_t *o = arg;
    uint32_t i;

    (void)ep;
    if ((len != sizeof(i)) || (o->n >= ORDER_POSTS)) {
        o->bad++;
        return;
    }
    memcpy(&i, msg, sizeof(i));
    o->got[o->n++] = i;
}

/* The target: takes notifications by handler, in the order they come, until the initiator
 * says all its batches ended; then sends what it saw. */
static int srv_order(tp_side_t *s)
{
    static uint8_t dst[TGT_LEN];
    static order_t order;

    target_report(s, target_open(s, dst, sizeof(dst), order_cb, &order), &order, sizeof(order));
    return 0;
}

/* Batches alternate between a large get (whose notification can go only once its reads are
 * done) and a small put (whose frames are out at once), all in flight together: the target
 * must still take the notifications in the order the batches were posted. */
Test(contract, notifications_arrive_in_the_order_their_batches_were_posted)
{
    static xfer_batch_desc_t gd[GET_DESCS];
    xfer_request_t *reqs[ORDER_POSTS];
    xfer_batch_desc_t pd = {0, 0, 64};
    xfer_batch_t *get, *put;
    xfer_rkey_t *rkey;
    xfer_mem_t *mem;
    uint8_t *buf;
    order_t order;
    void *blob;
    size_t len;
    tp_peer_t p;

    tp_start(&p, srv_order, NULL);
    buf = calloc(1, TGT_LEN);     /* the puts may send it before a get filled it */
    cr_assert_not_null(buf);
    cr_assert_eq(xfer_mem_register(p.ctx, buf, TGT_LEN, XFER_MEM_HOST, &mem), XFER_OK);
    blob = tp_recv_blob(&p, &len);
    cr_assert_eq(xfer_rkey_unpack(p.ep, blob, len, &rkey), XFER_OK);
    free(blob);
    for (size_t i = 0; i < GET_DESCS; i++) {
        gd[i] = (xfer_batch_desc_t){i * GET_BLK, i * GET_BLK, GET_BLK};
    }
    cr_assert_eq(xfer_batch_create(p.ep, XFER_BATCH_GET, mem, rkey, gd, GET_DESCS, &get),
                 XFER_OK);
    cr_assert_eq(xfer_batch_create(p.ep, XFER_BATCH_PUT, mem, rkey, &pd, 1, &put), XFER_OK);
    for (uint32_t i = 0; i < ORDER_POSTS; i++) {
        reqs[i] = NULL;
        cr_assert_eq(xfer_batch_post((i % 2) ? put : get, &i, sizeof(i), XFER_BATCH_NO_TIMEOUT,
                                     NULL, NULL, &reqs[i]), XFER_OK);
    }
    batches_end(&p, reqs, ORDER_POSTS, &order, sizeof(order));
    cr_expect_eq(order.bad, 0);
    cr_expect_eq(order.n, ORDER_POSTS, "%u notifications came of %u", order.n, ORDER_POSTS);
    for (uint32_t i = 0; i < order.n; i++) {
        cr_expect_eq(order.got[i], i, "notification %u of the target was batch %u's: the order "
                     "of posting is lost", i, order.got[i]);
    }
    cr_assert_eq(xfer_batch_destroy(get), XFER_OK);
    cr_assert_eq(xfer_batch_destroy(put), XFER_OK);
    xfer_rkey_destroy(rkey);
    cr_assert_eq(tp_flush(p.ep, TP_WAIT_MS), XFER_OK);
    cr_assert_eq(xfer_mem_deregister(mem), XFER_OK);
    free(buf);
    tp_finish(&p);
}

/* ---- notifications of every length up to the bound ----------------------------------------- */

#define NOTE_MAX   4096u            /* XFER_NOTIFY_MAX_LEN's default */
#define NOTE_CASES 15u

/* Notification i: its length (1, around one shm cell of the default size and of 512 bytes,
 * the bound) and its bytes, a function of i that a cut, a shift or a stale byte breaks. */
static size_t note_len_of(uint32_t i)
{
    static const size_t lens[] = {4, 447, 448, 449, 4031, 4032, 4033, 4095, NOTE_MAX};

    return lens[i % (sizeof(lens) / sizeof(lens[0]))];
}

static void note_make(uint32_t i, uint8_t *buf)
{
    memcpy(buf, &i, sizeof(i));
    for (size_t k = sizeof(i); k < note_len_of(i); k++) {
        buf[k] = (uint8_t)(i * 131u + k * 7u + (k >> 8));
    }
}

typedef struct notes_seen {
    uint32_t good, bad, n;
} notes_seen_t;

static void notes_cb(xfer_endpoint_t *ep, const void *msg, size_t len, void *arg)
{
    static uint8_t want[NOTE_MAX];
    notes_seen_t *s = arg;
    uint32_t i;

    (void)ep;
    s->n++;
    if (len < sizeof(i)) {
        s->bad++;
        return;
    }
    memcpy(&i, msg, sizeof(i));
    note_make(i, want);
    if ((i < NOTE_CASES) && (len == note_len_of(i)) && (memcmp(msg, want, len) == 0)) {
        s->good++;
    } else {
        s->bad++;
    }
}

/* The target of the notifications: its region malloc'd, or (arg non-NULL) from
 * xfer_mem_alloc(), which a peer on this host maps and copies into itself. */
static int srv_notes(tp_side_t *s)
{
    static uint8_t dst[TGT_LEN];
    static notes_seen_t seen;

    target_report(s, target_open(s, (s->arg != NULL) ? NULL : dst, sizeof(dst), notes_cb, &seen),
                  &seen, sizeof(seen));
    return 0;
}

/* Notifications of 4 bytes to XFER_NOTIFY_MAX_LEN (4 KiB) - one byte either side of what one
 * shm cell carries, at the default cell size and at 512 bytes - with put batches of one
 * descriptor and of 64, and get batches: every one is posted, completes, and is delivered
 * whole and once (C18: the bound is the framework's, the same on every transport). The
 * target's region is malloc'd, or from xfer_mem_alloc (over shm copied into by this side). */
static void notes_of_every_length(int xfer_alloc)
{
    static xfer_batch_desc_t many[64];
    xfer_request_t *reqs[NOTE_CASES];
    xfer_batch_desc_t one = {0, 0, 4096};
    xfer_batch_t *b[3];
    static uint8_t note[NOTE_MAX];
    notes_seen_t seen;
    xfer_rkey_t *rkey;
    xfer_mem_t *mem;
    uint8_t *buf;
    void *blob;
    size_t len;
    tp_peer_t p;

    tp_start(&p, srv_notes, xfer_alloc ? (void*)"xfer_mem_alloc" : NULL);
    buf = calloc(1, SRC_LEN);
    cr_assert_not_null(buf);
    cr_assert_eq(xfer_mem_register(p.ctx, buf, SRC_LEN, XFER_MEM_HOST, &mem), XFER_OK);
    blob = tp_recv_blob(&p, &len);
    cr_assert_eq(xfer_rkey_unpack(p.ep, blob, len, &rkey), XFER_OK);
    free(blob);
    for (size_t i = 0; i < 64; i++) {
        many[i] = (xfer_batch_desc_t){i * 4096, i * 8192, 4096};
    }
    cr_assert_eq(xfer_batch_create(p.ep, XFER_BATCH_PUT, mem, rkey, &one, 1, &b[0]), XFER_OK);
    cr_assert_eq(xfer_batch_create(p.ep, XFER_BATCH_PUT, mem, rkey, many, 64, &b[1]), XFER_OK);
    cr_assert_eq(xfer_batch_create(p.ep, XFER_BATCH_GET, mem, rkey, many, 64, &b[2]), XFER_OK);
    for (uint32_t i = 0; i < NOTE_CASES; i++) {
        xfer_status_t s;

        note_make(i, note);
        reqs[i] = NULL;
        s = xfer_batch_post(b[i % 3], note, note_len_of(i), XFER_BATCH_NO_TIMEOUT, NULL, NULL,
                            &reqs[i]);
        cr_assert_eq(s, XFER_OK, "batch %u (%s, a notification of %zu bytes): %s", i,
                     (i % 3 == 2) ? "get" : "put", note_len_of(i), xfer_status_string(s));
    }
    batches_end(&p, reqs, NOTE_CASES, &seen, sizeof(seen));
    cr_expect_eq(seen.bad, 0, "%u notifications came cut, shifted or unknown", seen.bad);
    cr_expect_eq(seen.good, NOTE_CASES, "%u notifications of %u came whole", seen.good,
                 NOTE_CASES);
    for (unsigned k = 0; k < 3; k++) {
        cr_assert_eq(xfer_batch_destroy(b[k]), XFER_OK);
    }
    xfer_rkey_destroy(rkey);
    cr_assert_eq(tp_flush(p.ep, TP_WAIT_MS), XFER_OK);
    cr_assert_eq(xfer_mem_deregister(mem), XFER_OK);
    free(buf);
    tp_finish(&p);
}

Test(contract, a_notification_of_any_length_up_to_the_bound_is_delivered_whole)
{
    notes_of_every_length(0);
}

Test(contract, a_notification_of_any_length_up_to_the_bound_is_delivered_whole_into_xfer_memory)
{
    notes_of_every_length(1);
}

/* ---- what still lands after a batch ended early (C17) ------------------------------------- */

#define LATE_BLK   (4u << 20)
#define LATE_DESCS 64u              /* 256 MiB: far more than a transport may keep in flight */
/* What may land after the end: XFER_BATCH_WINDOW (8 MiB) queued by xfer, and what the kernel
 * holds between the two processes - on tcp each connection's socket buffers, which grow up to
 * net.ipv4.tcp_rmem's largest (32 MiB on Debian) as the target drains them; 4 lanes measured
 * 32-36 MiB here. */
#define LATE_MAX   (64u << 20)
#define LATE_FILL  0x5a

/* Bytes of buf[0, len) that are LATE_FILL: what landed of the batch. */
static uint64_t late_landed_bytes(const uint8_t *buf, size_t len)
{
    uint64_t fill, n = 0, w;

    memset(&fill, LATE_FILL, sizeof(fill));
    for (size_t i = 0; i < len; i += sizeof(w)) {
        memcpy(&w, buf + i, sizeof(w));
        if (w == fill) {
            n += sizeof(w);
        } else if (w != 0) {
            for (size_t k = 0; k < sizeof(w); k++) {
                n += (buf[i + k] == LATE_FILL);
            }
        }
    }
    return n;
}

/* The target: LATE_DESCS blocks of zeroes, registered; progresses until the initiator says
 * that nothing of its batch can land any more, then sends how many bytes of it landed. */
static int srv_late(tp_side_t *s)
{
    size_t len   = (size_t)LATE_DESCS * LATE_BLK;
    uint8_t *dst = calloc(1, len);
    xfer_mem_t *mem;
    uint64_t v;

    TP_CHECK(dst != NULL, "no memory for the target");
    mem = target_open(s, dst, len, NULL, NULL);
    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
    TP_CHECK(tp_ctl_send_u64(s->ctl, late_landed_bytes(dst, len)) == 0, "ctl");
    TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS) == 0, "no word from the initiator");
    TP_CHECK_STATUS(xfer_mem_deregister(mem), XFER_OK);
    free(dst);
    return 0;
}

/* A 256 MiB put batch without a notification, cancelled as soon as it is posted (cancel) or
 * given a 1 ms deadline: it ends early, and what lands of it after that - until the flush,
 * and until the source's registration may go - is bounded by what a transport keeps in flight,
 * never the rest of the batch. What it reported landed did land. */
static void late_after_early_end(int cancel)
{
    static xfer_batch_desc_t d[LATE_DESCS];
    xfer_request_t *req = NULL;
    uint64_t landed_bytes;
    xfer_status_t st;
    xfer_rkey_t *rkey;
    xfer_batch_t *b;
    xfer_mem_t *mem;
    size_t landed, len;
    uint8_t *src;
    void *blob;
    tp_peer_t p;
    int waited;

    tp_start(&p, srv_late, NULL);
    src = calloc(1, LATE_BLK + 8);     /* the batch's block, then 8 bytes of zeroes */
    cr_assert_not_null(src);
    memset(src, LATE_FILL, LATE_BLK);
    cr_assert_eq(xfer_mem_register(p.ctx, src, LATE_BLK + 8, XFER_MEM_HOST, &mem), XFER_OK);
    blob = tp_recv_blob(&p, &len);
    cr_assert_eq(xfer_rkey_unpack(p.ep, blob, len, &rkey), XFER_OK);
    free(blob);
    /* the connection is up and the batch goes out at once: a put of zeroes, flushed */
    cr_assert_eq(ct_put(p.ep, src + LATE_BLK, 8, mem, xfer_rkey_address(rkey), rkey), XFER_OK);
    cr_assert_eq(tp_flush(p.ep, TP_WAIT_MS), XFER_OK);
    for (size_t i = 0; i < LATE_DESCS; i++) {
        d[i] = (xfer_batch_desc_t){0, i * LATE_BLK, LATE_BLK};
    }
    cr_assert_eq(xfer_batch_create(p.ep, XFER_BATCH_PUT, mem, rkey, d, LATE_DESCS, &b),
                 XFER_OK);
    cr_assert_eq(xfer_batch_post(b, NULL, 0, cancel ? XFER_BATCH_NO_TIMEOUT : 1, NULL, NULL,
                                 &req), XFER_OK);
    if (cancel) {
        st = xfer_request_cancel(req);
        cr_assert_eq(st, XFER_OK, "a batch without a notification can always be cancelled: %s",
                     xfer_status_string(st));
    }
    st = xfer_request_wait(req, TP_WAIT_MS);
    cr_assert_eq(st, cancel ? XFER_ERR_CANCELED : XFER_ERR_TIMEOUT, "the batch ended with %s",
                 xfer_status_string(st));
    landed = xfer_request_landed(req);
    xfer_request_release(req);
    cr_assert_eq(xfer_batch_destroy(b), XFER_OK);
    xfer_rkey_destroy(rkey);
    st = tp_flush(p.ep, TP_WAIT_MS * 3);
    cr_assert_eq(st, XFER_OK, "the flush after the batch: %s", xfer_status_string(st));
    /* the source's registration goes once the transport let go of it: nothing lands after */
    for (waited = 0; (st = xfer_mem_deregister(mem)) == XFER_ERR_BUSY; waited += 10) {
        cr_assert_lt(waited, TP_WAIT_MS, "the source is still held %d ms after the flush",
                     waited);
        tp_progress_for(p.ctx, 10);
    }
    cr_assert_eq(st, XFER_OK);
    tp_send(&p, 1);
    landed_bytes = tp_recv(&p);
    cr_log_info("over %s: a batch %s landed %zu descriptors by then, %" PRIu64 " bytes in all",
                tp_transport(), cancel ? "cancelled" : "past its deadline", landed,
                landed_bytes);
    cr_expect_geq(landed_bytes, (uint64_t)landed * LATE_BLK, "the batch reported %zu "
                  "descriptors landed, and %" PRIu64 " bytes did", landed, landed_bytes);
    cr_expect_leq(landed_bytes, (uint64_t)landed * LATE_BLK + LATE_MAX, "after it ended with "
                  "%zu descriptors landed, %" PRIu64 " bytes of it landed: more than a "
                  "transport may keep in flight (%u)", landed, landed_bytes, LATE_MAX);
    tp_send(&p, 2);
    free(src);
    tp_finish(&p);
}

Test(contract, a_cancelled_batch_lands_at_most_a_window_more)
{
    late_after_early_end(1);
}

Test(contract, a_batch_past_its_deadline_lands_at_most_a_window_more)
{
    late_after_early_end(0);
}

/* Post a batch of n descriptors without a notification; it must complete XFER_OK with every
 * descriptor landed. */
static void batch_whole(xfer_endpoint_t *ep, xfer_batch_op_t op, xfer_mem_t *mem,
                        xfer_rkey_t *rkey, const xfer_batch_desc_t *descs, size_t n)
{
    xfer_request_t *req = NULL;
    xfer_batch_t *batch;

    cr_assert_eq(xfer_batch_create(ep, op, mem, rkey, descs, n, &batch), XFER_OK);
    cr_assert_eq(xfer_batch_post(batch, NULL, 0, XFER_BATCH_NO_TIMEOUT, NULL, NULL, &req),
                 XFER_OK);
    cr_assert_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
    cr_assert_eq(xfer_request_landed(req), n);
    xfer_request_release(req);
    cr_assert_eq(xfer_batch_destroy(batch), XFER_OK);
}

/* C14: a batch completes XFER_OK only with every descriptor's data in the destination's
 * memory - the target's for a put (it looks without progressing), ours for a get - and
 * xfer_request_landed() is then the number of descriptors. Scattered blocks, both ways. */
Test(contract, a_batch_completes_ok_with_every_descriptor_in_the_destination)
{
    enum { NDESC = 64, BLK = 16384 };
    xfer_batch_desc_t descs[NDESC];
    xfer_rkey_t *rkey;
    xfer_mem_t *mem;
    uint8_t *local;
    tp_peer_t p;

    rkey  = ct_start(&p);
    local = malloc(NDESC * BLK);
    cr_assert_not_null(local);
    cr_assert_eq(xfer_mem_register(p.ctx, local, NDESC * BLK, XFER_MEM_HOST, &mem), XFER_OK);
    for (uint64_t i = 0; i < NDESC; i++) {
        /* every other block, backwards, at an odd offset into a page */
        descs[i] = (xfer_batch_desc_t){.local_offset  = i * BLK,
                                       .remote_offset = (NDESC - 1 - i) * 2 * BLK + 8 * i,
                                       .length        = BLK};
        tp_fill_pattern(local + i * BLK, BLK, 300 + i);
    }
    batch_whole(p.ep, XFER_BATCH_PUT, mem, rkey, descs, NDESC);
    for (uint64_t i = 0; i < NDESC; i++) {
        cr_assert_eq(ct_do(&p, CT_CHECK, descs[i].remote_offset, BLK, 300 + i), 0,
                     "put descriptor %" PRIu64, i);
        cr_assert_eq(ct_do(&p, CT_FILL, descs[i].remote_offset, BLK, 400 + i), 0);
    }
    memset(local, 0, NDESC * BLK);
    batch_whole(p.ep, XFER_BATCH_GET, mem, rkey, descs, NDESC);
    for (uint64_t i = 0; i < NDESC; i++) {
        ssize_t bad = tp_check_pattern(local + i * BLK, BLK, 400 + i);

        cr_assert_lt(bad, 0, "get descriptor %" PRIu64 ": byte %zd", i, bad);
    }
    cr_assert_eq(xfer_mem_deregister(mem), XFER_OK);
    free(local);
    xfer_rkey_destroy(rkey);
    cr_assert_eq(ct_do(&p, CT_STOP, 0, 0, 0), 0);
    tp_finish(&p);
}

/* The batches' callbacks that had run when the close's callback ran. */
static tp_calls_t batch_put, batch_get;
static int batches_before_close = -1;

static void close_after_batches_cb(xfer_request_t *req, xfer_status_t status, void *arg)
{
    batches_before_close = batch_put.calls + batch_get.calls;
    tp_calls_cb(req, status, arg);
}

/* A put batch of ndesc blocks of blk bytes into the target's region and a get batch of as
 * many from the region's second half, then at once a close with flags. Orderly: both batches
 * complete XFER_OK before the close does, with every block where it belongs. Forced: each
 * completes XFER_OK so, or XFER_ERR_CANCELED with fewer descriptors known landed, before the
 * close does. */
static void close_right_after_batches(size_t ndesc, size_t blk, uint32_t flags)
{
    xfer_batch_desc_t *descs = calloc(ndesc, sizeof(*descs));
    xfer_request_t *preq = NULL, *greq = NULL, *creq = NULL;
    uint8_t *local       = malloc(2 * ndesc * blk);
    tp_calls_t closed    = {0};
    xfer_batch_t *pb, *gb;
    xfer_rkey_t *rkey;
    xfer_mem_t *mem;
    tp_peer_t p;

    cr_assert((descs != NULL) && (local != NULL));
    cr_assert_leq(2 * ndesc * blk, CT_REGION);
    memset(&batch_put, 0, sizeof(batch_put));
    memset(&batch_get, 0, sizeof(batch_get));
    batches_before_close = -1;
    ct_close_timeout_scaled();
    rkey = ct_start(&p);
    cr_assert_eq(xfer_mem_register(p.ctx, local, 2 * ndesc * blk, XFER_MEM_HOST, &mem),
                 XFER_OK);
    for (uint64_t i = 0; i < ndesc; i++) {
        descs[i] = (xfer_batch_desc_t){.local_offset = i * blk, .remote_offset = i * blk,
                                       .length = blk};
        tp_fill_pattern(local + i * blk, blk, 700 + i);
    }
    cr_assert_eq(ct_do(&p, CT_FILL, ndesc * blk, ndesc * blk, 800), 0);
    cr_assert_eq(xfer_batch_create(p.ep, XFER_BATCH_PUT, mem, rkey, descs, ndesc, &pb),
                 XFER_OK);
    for (uint64_t i = 0; i < ndesc; i++) {
        descs[i].local_offset  += ndesc * blk;
        descs[i].remote_offset += ndesc * blk;
    }
    cr_assert_eq(xfer_batch_create(p.ep, XFER_BATCH_GET, mem, rkey, descs, ndesc, &gb),
                 XFER_OK);
    cr_assert_eq(xfer_batch_post(pb, NULL, 0, XFER_BATCH_NO_TIMEOUT, tp_calls_cb, &batch_put,
                                 &preq), XFER_OK);
    cr_assert_eq(xfer_batch_post(gb, NULL, 0, XFER_BATCH_NO_TIMEOUT, tp_calls_cb, &batch_get,
                                 &greq), XFER_OK);
    cr_assert_eq(xfer_batch_destroy(pb), XFER_OK);
    cr_assert_eq(xfer_batch_destroy(gb), XFER_OK);
    cr_assert_eq(xfer_endpoint_close_nb(p.ep, flags, close_after_batches_cb, &closed, &creq),
                 XFER_OK);
    p.ep = NULL;
    cr_assert_eq(xfer_request_wait(creq, TP_WAIT_MS), XFER_OK, "the close");
    cr_assert_eq(closed.calls, 1);
    cr_assert_eq(batches_before_close, 2, "%d batch callbacks ran before the close's",
                 batches_before_close);
    if (flags & XFER_CLOSE_FLAG_FORCE) {
        const tp_calls_t *c[2]     = {&batch_put, &batch_get};
        const xfer_request_t *r[2] = {preq, greq};

        for (int k = 0; k < 2; k++) {
            size_t landed = xfer_request_landed(r[k]);

            cr_assert((c[k]->status == XFER_OK) || (c[k]->status == XFER_ERR_CANCELED),
                      "batch %d of a forced close: %s", k, xfer_status_string(c[k]->status));
            cr_assert((c[k]->status == XFER_OK) ? (landed == ndesc) : (landed <= ndesc),
                      "batch %d: %s with %zu of %zu landed", k,
                      xfer_status_string(c[k]->status), landed, ndesc);
        }
        goto done;
    }
    cr_assert_eq(batch_put.status, XFER_OK, "the put batch: %s",
                 xfer_status_string(batch_put.status));
    cr_assert_eq(batch_get.status, XFER_OK, "the get batch: %s",
                 xfer_status_string(batch_get.status));
    cr_assert_eq(xfer_request_landed(preq), ndesc, "put: %zu landed", xfer_request_landed(preq));
    cr_assert_eq(xfer_request_landed(greq), ndesc, "get: %zu landed", xfer_request_landed(greq));
    for (uint64_t i = 0; i < ndesc; i++) {
        cr_assert_eq(ct_do(&p, CT_CHECK, i * blk, blk, 700 + i), 0, "put block %" PRIu64, i);
    }
    cr_assert_lt(tp_check_pattern(local + ndesc * blk, ndesc * blk, 800), 0, "the get's blocks");
done:
    xfer_request_release(creq);
    xfer_request_release(preq);
    xfer_request_release(greq);
    cr_assert_eq(xfer_mem_deregister(mem), XFER_OK);
    free(local);
    free(descs);
    xfer_rkey_destroy(rkey);
    cr_assert_eq(ct_do(&p, CT_STOP, 0, 0, 0), 0);
    tp_child_expect_ok(&p, 60);
    xfer_context_destroy(p.ctx);
}

/* C19, C21: an orderly close posted right after a put batch and a get batch waits for both
 * - small blocks, and 16 MiB each, more than a batch has in flight at once where it goes
 * descriptor by descriptor (shm without cross-memory attach): they complete XFER_OK before
 * the close does, the put's blocks in the target's memory and the get's in ours. */
Test(contract, an_orderly_close_right_after_batches_completes_them_first)
{
    close_right_after_batches(128, 4096, 0);
    close_right_after_batches(64, 256u << 10, 0);
}

/* C23: a forced close right after the same batches ends them - each completes XFER_OK with
 * every descriptor landed, or XFER_ERR_CANCELED with a lower bound of what landed - before
 * its own callback runs. */
Test(contract, a_forced_close_right_after_batches_ends_them_first)
{
    close_right_after_batches(128, 4096, XFER_CLOSE_FLAG_FORCE);
    close_right_after_batches(64, 256u << 10, XFER_CLOSE_FLAG_FORCE);
}
