/*
 * The contract (docs/contract.md, C25), budgets: many peers together cannot make the process
 * hold more than its process-wide budgets, however they flood, and a peer that behaves still
 * gets its work done meanwhile.
 *
 * 16 hostile peers connect to this process and flood every queue a peer fills at once:
 * messages nobody receives, tensor requests for keys never published, batches whose
 * notifications nobody takes, and gets whose answers they do not read. Each of those queues
 * has its per-endpoint bound, which alone would let 16 peers make this process hold several
 * hundred MiB; the budgets here are 8 MiB (messages, notifications, answers) and 1024
 * requests. The peak resident size of this process (getrusage) grows by less than what the
 * budgets allow plus the bookkeeping around them; then a 17th peer pings, puts, gets, posts
 * a batch with a notification and fetches a tensor, and all of it completes.
 */
#include "contract.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NHOSTILE   16
#define REGION     (16u << 20)
#define MSG_LEN    4000u            /* eager on every transport */
#define NMSG       1024u            /* 4 MB of messages nobody receives, per peer */
#define NFETCH     1024u            /* requests for tensors never published, per peer */
#define NOTE_LEN   4096u            /* XFER_NOTIFY_MAX_LEN */
#define NNOTE      2048u            /* 8 MB of notifications nobody takes, per peer */
#define GET_LEN    (1u << 20)
#define NGET       16u              /* 16 MiB of answers, per peer */
#define TAG_NOBODY 0xbad0ull
#define TAG_PING   0x600dull
#define TAG_STOP   0x600eull
#define GROWTH_MAX (40u << 10)      /* KiB: 24 MiB of budgets, 4 MiB of kept buffers, slack */

static void budgets_set(void)
{
    setenv("XFER_UNEXPECTED_BUDGET", "8m", 1);
    setenv("XFER_UNEXPECTED_EP", "4m", 1);
    setenv("XFER_NOTIFY_BUDGET", "8m", 1);
    setenv("XFER_ANSWERS_BUDGET", "8m", 1);
    setenv("XFER_TENSOR_BUDGET", "1024", 1);
    setenv("XFER_CLOSE_TIMEOUT", "1s", 1);
}

/* ---- the hostile peer --------------------------------------------------------------------- */

static int cli_hostile(tp_side_t *s)
{
    xfer_request_t **reqs = calloc(NMSG + NFETCH + NNOTE + NGET, sizeof(*reqs));
    uint8_t *msg = calloc(1, MSG_LEN), *note = calloc(1, NOTE_LEN), *dst = calloc(1, REGION);
    xfer_batch_desc_t d = {0, 0, 64};
    xfer_batch_t *b     = NULL;
    size_t n = 0, len;
    xfer_rkey_t *rkey;
    xfer_mem_t *mem;
    uint64_t stop;
    void *blob;

    TP_CHECK((reqs != NULL) && (msg != NULL) && (note != NULL) && (dst != NULL), "malloc");
    TP_CHECK(tp_ctl_recv_alloc(s->ctl, &blob, &len, TP_WAIT_MS) == 0, "ctl");
    TP_CHECK_STATUS(xfer_rkey_unpack(s->ep, blob, len, &rkey), XFER_OK);
    free(blob);
    TP_CHECK_STATUS(xfer_mem_register(s->ctx, dst, REGION, XFER_MEM_HOST, &mem), XFER_OK);
    /* everything at once, never waiting; the endpoint may fail at a bound (that is one of
     * the answers the contract allows), and then the rest is refused */
    for (unsigned i = 0; i < NMSG; i++) {
        if (!TP_POSTED(xfer_tag_send(s->ep, TAG_NOBODY, msg, MSG_LEN, NULL, NULL, NULL,
                                     &reqs[n]))) {
            break;
        }
        n++;
    }
    for (unsigned i = 0; i < NFETCH; i++) {
        xfer_fetch_params_t fp = {sizeof(fp), note, NOTE_LEN, NULL, NULL, NULL};
        char key[32];

        snprintf(key, sizeof(key), "never-%u-%u", (unsigned)s->index, i);
        if (!TP_POSTED(xfer_tensor_fetch(s->ep, 1, key, &fp, NULL, NULL, &reqs[n]))) {
            break;
        }
        n++;
    }
    if (xfer_batch_create(s->ep, XFER_BATCH_PUT, mem, rkey, &d, 1, &b) == XFER_OK) {
        for (unsigned i = 0; i < NNOTE; i++) {
            if (!TP_POSTED(xfer_batch_post(b, note, NOTE_LEN, XFER_BATCH_NO_TIMEOUT, NULL,
                                           NULL, &reqs[n]))) {
                break;
            }
            n++;
        }
    }
    tp_progress_for(s->ctx, 1500 * tp_slowdown());
    /* answers it will not read: from here on it does not progress */
    for (unsigned i = 0; i < NGET; i++) {
        if (!TP_POSTED(xfer_get(s->ep, dst + (size_t)i * GET_LEN, GET_LEN, mem,
                                xfer_rkey_address(rkey) + (uint64_t)i * GET_LEN, rkey, NULL,
                                NULL, &reqs[n]))) {
            break;
        }
        n++;
    }
    xfer_progress(s->ctx);
    TP_CHECK(tp_ctl_send_u64(s->ctl, n) == 0, "ctl");
    TP_CHECK(tp_ctl_recv_u64(s->ctl, &stop, 600000) == 0, "ctl");
    xfer_endpoint_close_nb(s->ep, XFER_CLOSE_FLAG_FORCE, NULL, NULL, NULL);
    s->ep = NULL;
    for (size_t i = 0; i < n; i++) {
        if (reqs[i] != NULL) {
            xfer_request_wait(reqs[i], TP_WAIT_MS);
            xfer_request_release(reqs[i]);
        }
    }
    if (b != NULL) {
        xfer_batch_destroy(b);
    }
    xfer_rkey_destroy(rkey);
    xfer_mem_deregister(mem);
    free(reqs);
    free(msg);
    free(note);
    free(dst);
    return 0;
}

/* ---- the peer that behaves ---------------------------------------------------------------- */

static int cli_good(tp_side_t *s)
{
    static uint8_t buf[1u << 16];
    xfer_batch_desc_t d = {0, 4096, 4096};
    xfer_request_t *req = NULL;
    xfer_fetch_params_t fp = {sizeof(fp), buf, sizeof(buf), NULL, NULL, NULL};
    uint64_t ping = 0, back;
    const xfer_tensor_t *t;
    xfer_status_t st;
    xfer_rkey_t *rkey;
    xfer_batch_t *b;
    xfer_mem_t *mem;
    void *blob;
    size_t len;

    TP_CHECK(tp_ctl_recv_alloc(s->ctl, &blob, &len, TP_WAIT_MS) == 0, "ctl");
    TP_CHECK_STATUS(xfer_rkey_unpack(s->ep, blob, len, &rkey), XFER_OK);
    free(blob);
    TP_CHECK_STATUS(xfer_mem_register(s->ctx, buf, sizeof(buf), XFER_MEM_HOST, &mem), XFER_OK);
    for (int i = 0; i < 20; i++, ping++) {
        TP_CHECK(TP_POSTED(xfer_tag_recv(s->ctx, s->ep, TAG_PING, ~0ull, &back, sizeof(back),
                                         NULL, NULL, NULL, &req)), "recv");
        TP_CHECK_STATUS(ct_send(s->ep, TAG_PING, &ping, sizeof(ping)), XFER_OK);
        TP_CHECK_STATUS(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
        TP_CHECK(back == ping, "ping %llu came back as %llu", (unsigned long long)ping,
                 (unsigned long long)back);
        xfer_request_release(req);
        req = NULL;
    }
    tp_fill_pattern(buf, sizeof(buf), 7);
    TP_CHECK_STATUS(ct_put(s->ep, buf, sizeof(buf), mem, xfer_rkey_address(rkey), rkey),
                    XFER_OK);
    TP_CHECK_STATUS(tp_flush(s->ep, TP_WAIT_MS), XFER_OK);
    memset(buf, 0, sizeof(buf));
    st = xfer_get(s->ep, buf, sizeof(buf), mem, xfer_rkey_address(rkey), rkey, NULL, NULL,
                  &req);
    TP_CHECK_STATUS(tp_op_result(st, req, TP_WAIT_MS), XFER_OK);
    TP_CHECK(tp_check_pattern(buf, sizeof(buf), 7) == -1, "the get read other bytes");
    req = NULL;
    TP_CHECK_STATUS(xfer_batch_create(s->ep, XFER_BATCH_PUT, mem, rkey, &d, 1, &b), XFER_OK);
    st = xfer_batch_post(b, "good", 4, 0, NULL, NULL, &req);
    TP_CHECK_STATUS(tp_op_result(st, req, TP_WAIT_MS), XFER_OK);
    req = NULL;
    TP_CHECK_STATUS(xfer_batch_destroy(b), XFER_OK);
    st = xfer_tensor_fetch(s->ep, 1, "good", &fp, NULL, NULL, &req);
    TP_CHECK(TP_POSTED(st), "fetch: %s", xfer_status_string(st));
    TP_CHECK_STATUS(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
    t = xfer_request_tensor(req);
    TP_CHECK((t != NULL) && (t->size == 8) && (memcmp(t->data, "tensor!", 8) == 0),
             "the tensor");
    xfer_request_release(req);
    TP_CHECK_STATUS(ct_send(s->ep, TAG_STOP, &ping, sizeof(ping)), XFER_OK);
    TP_CHECK_STATUS(tp_flush(s->ep, TP_WAIT_MS), XFER_OK);
    xfer_rkey_destroy(rkey);
    TP_CHECK_STATUS(xfer_mem_deregister(mem), XFER_OK);
    return 0;
}

/* ---- this process ------------------------------------------------------------------------- */

/* Progress until every hostile peer said it flooded; the counts of what each posted. */
static void wait_floods(xfer_context_t *ctx, tp_peer_t *h, uint64_t *posted)
{
    for (int i = 0; i < NHOSTILE; i++) {
        double until = tp_now_ms() + 60000.0 * tp_slowdown();

        while (!tp_ctl_ready(h[i].ctl, 0)) {
            cr_assert_lt(tp_now_ms(), until, "hostile peer %d never finished flooding", i);
            if (xfer_progress(ctx) == 0) {
                usleep(100);
            }
        }
        posted[i] = tp_recv(&h[i]);
    }
}

/* Serve the good peer: echo its pings until it stops. */
static void serve_good(xfer_context_t *ctx, xfer_endpoint_t *ep)
{
    for (;;) {
        xfer_request_t *r = NULL;
        uint64_t msg, tag;

        cr_assert(TP_POSTED(xfer_tag_recv(ctx, ep, 0x6000ull, ~0xffull, &msg, sizeof(msg), NULL,
                                          NULL, NULL, &r)));
        cr_assert_eq(xfer_request_wait(r, TP_WAIT_MS * 2), XFER_OK, "the good peer's message");
        tag = xfer_request_tag(r);
        xfer_request_release(r);
        if (tag == TAG_STOP) {
            return;
        }
        cr_assert_eq(xfer_tag_send(ep, TAG_PING, &msg, sizeof(msg), NULL, NULL, NULL, NULL),
                     XFER_OK);
    }
}

Test(contract, hostile_peers_together_stay_within_the_process_budgets_and_a_good_peer_completes)
{
    static uint8_t region[REGION];
    static const char tensor_data[8] = "tensor!";
    xfer_endpoint_t *eps[NHOSTILE], *good_ep;
    uint64_t posted[NHOSTILE];
    xfer_request_t *pub = NULL;
    xfer_context_t *ctx;
    xfer_listener_t *l;
    tp_peer_t h[NHOSTILE], g;
    long before, growth;
    xfer_tensor_t t;
    xfer_mem_t *mem;
    char addr[64], note[16];
    size_t len, note_len = 0;
    void *blob;
    double until;

    budgets_set();
    ctx = tp_context(0);
    cr_assert_eq(xfer_listen(ctx, "127.0.0.1:0", &l), XFER_OK);
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", xfer_listener_port(l));
    memset(region, 1, sizeof(region));
    cr_assert_eq(xfer_mem_register(ctx, region, sizeof(region), XFER_MEM_HOST, &mem), XFER_OK);
    cr_assert_eq(xfer_rkey_pack(mem, &blob, &len), XFER_OK);
    for (int i = 0; i < NHOSTILE; i++) {
        tp_opts_t o = {.index = i};

        tp_client_spawn(&h[i], addr, cli_hostile, NULL, &o);
        cr_assert_eq(xfer_accept(l, TP_WAIT_MS, &eps[i]), XFER_OK);
    }
    /* every endpoint made: what grows from here is what the peers make this process hold */
    tp_progress_for(ctx, 200);
    before = tu_peak_rss_kib();
    for (int i = 0; i < NHOSTILE; i++) {
        tp_send_blob(&h[i], blob, len);
    }
    wait_floods(ctx, h, posted);
    tp_progress_for(ctx, 1000 * tp_slowdown());

    /* a peer that behaves, while the floods wait */
    memset(&t, 0, sizeof(t));
    t.dtype   = XFER_DTYPE_UINT8;
    t.rank    = 1;
    t.dims[0] = sizeof(tensor_data);
    t.size    = sizeof(tensor_data);
    t.data    = (void*)tensor_data;
    cr_assert(TP_POSTED(xfer_tensor_publish(ctx, 1, "good", &t, XFER_PUBLISH_COPY, NULL, NULL,
                                            &pub)));
    tp_client_spawn(&g, addr, cli_good, NULL, NULL);
    cr_assert_eq(xfer_accept(l, TP_WAIT_MS, &good_ep), XFER_OK);
    tp_send_blob(&g, blob, len);
    serve_good(ctx, good_ep);
    until = tp_now_ms() + TP_WAIT_MS;
    while ((xfer_notify_poll(good_ep, note, sizeof(note), &note_len) != XFER_OK) &&
           (tp_now_ms() < until)) {
    }
    cr_expect_eq(note_len, 4, "the good peer's notification");
    cr_expect_eq(memcmp(note, "good", 4), 0, "the good peer's notification");
    cr_expect_eq(xfer_request_wait(pub, TP_WAIT_MS), XFER_OK, "the published tensor");
    xfer_request_release(pub);
    tp_child_expect_ok(&g, 60);

    growth = tu_peak_rss_kib() - before;
    cr_log_info("over %s: %d hostile peers flooded (posted %llu operations each, the first), "
                "peak RSS grew by %ld KiB", tp_transport(), NHOSTILE,
                (unsigned long long)posted[0], growth);
    cr_expect_lt(growth, (long)GROWTH_MAX, "the peers made this process hold %ld KiB more",
                 growth);

    for (int i = 0; i < NHOSTILE; i++) {
        tp_send(&h[i], 1);
        xfer_endpoint_close_nb(eps[i], XFER_CLOSE_FLAG_FORCE, NULL, NULL, NULL);
    }
    xfer_endpoint_close(good_ep);
    for (int i = 0; i < NHOSTILE; i++) {
        tp_child_expect_ok(&h[i], 120);
    }
    xfer_rkey_blob_free(blob);
    cr_assert_eq(xfer_mem_deregister(mem), XFER_OK);
    xfer_listener_close(l);
    xfer_context_destroy(ctx);
}
