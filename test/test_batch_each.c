/*
 * Batches on a transport without a batch entry point: the real tcp component built without it
 * (test/plugins/xfer_tcp.so, as a plug-in built before batches existed would be), so that the
 * framework moves each descriptor through put and get - a batch walk (engine.h) of at most
 * XFER_BATCH_WINDOW (8 MiB, engine.h) in flight - and, for puts, flushes behind them. Only where
 * the suites run over tcp: the variant is tcp.
 */
#include "test_batch.h"
#include "test_peer.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#define EACH_DESCS 128u
#define EACH_LEN   (128u << 10)    /* 128 x 128 KiB: 16 MiB, twice the walk's window */

static char *each_dir;

static void each_setup(void)
{
    tp_env();
    if (strcmp(tp_transport(), "tcp") != 0) {
        return;
    }
    each_dir = tu_plugin_dir((const char *[]){"tcp", NULL});
    setenv("XFERTEST_COMPONENT_PATH", each_dir, 1);
    tp_env();
}

static void each_teardown(void)
{
    if (each_dir != NULL) {
        tu_dir_remove(each_dir);
        each_dir = NULL;
    }
}

TestSuite(batch_each, .init = each_setup, .fini = each_teardown, .timeout = 240);

static void skip_unless_tcp(void)
{
    if (each_dir == NULL) {
        cr_skip_test("the component without batch is tcp's; this run is over %s",
                     tp_transport());
    }
}

/* Descriptor i: the initiator's block (i % 64) of its 8 MiB, the target's block i. */
static void each_descs(xfer_batch_desc_t *d, unsigned first, unsigned n)
{
    for (unsigned i = 0; i < n; i++) {
        d[i] = (xfer_batch_desc_t){((first + i) % 64) * (uint64_t)EACH_LEN,
                                   (first + i) * (uint64_t)EACH_LEN, EACH_LEN};
    }
}

static xfer_status_t each_post(init_t *in, xfer_batch_op_t kind, const xfer_batch_desc_t *d,
                               unsigned n, size_t *landed_p)
{
    xfer_request_t *req = NULL;
    xfer_status_t st;
    xfer_batch_t *b;

    cr_assert_eq(xfer_batch_create(in->p.ep, kind, in->mem, in->rkey, d, n, &b), XFER_OK);
    cr_assert_eq(xfer_batch_post(b, NULL, 0, 0, NULL, NULL, &req), XFER_OK);
    st = xfer_request_wait(req, TP_WAIT_MS);
    *landed_p = xfer_request_landed(req);
    if (st == XFER_OK) {
        cr_expect_eq(xfer_request_length(req), (size_t)n * EACH_LEN);
    }
    xfer_request_release(req);
    cr_assert_eq(xfer_batch_destroy(b), XFER_OK);
    return st;
}

/* 16 MiB of puts land (more than the walk keeps in flight), and gets read them back. */
Test(batch_each, puts_and_gets_go_one_by_one_and_land_whole)
{
    static xfer_batch_desc_t d[EACH_DESCS];
    size_t landed;
    init_t in;

    skip_unless_tcp();
    tb_init_start(&in, tb_srv_target);
    tp_fill_pattern(in.src, SRC_LEN, 41);
    each_descs(d, 0, EACH_DESCS);
    cr_assert_eq(each_post(&in, XFER_BATCH_PUT, d, EACH_DESCS, &landed), XFER_OK);
    cr_expect_eq(landed, EACH_DESCS);
    /* the target's blocks 64..127 hold the same 8 MiB as 0..63: read each half back */
    for (unsigned half = 0; half < 2; half++) {
        memset(in.src, 0, SRC_LEN);
        each_descs(d, half * 64, 64);
        cr_assert_eq(each_post(&in, XFER_BATCH_GET, d, 64, &landed), XFER_OK);
        cr_expect_eq(landed, 64);
        {
            uint8_t *want = malloc(SRC_LEN);

            cr_assert_not_null(want);
            tp_fill_pattern(want, SRC_LEN, 41);
            cr_expect(memcmp(in.src, want, SRC_LEN) == 0, "half %u read back differs", half);
            free(want);
        }
    }
    tb_init_finish(&in);
}

/* Such a transport cannot carry a notification: refused where it is posted, nothing sent. */
Test(batch_each, a_notification_is_refused_and_the_batch_without_it_goes)
{
    xfer_batch_desc_t d[4];
    xfer_request_t *req = NULL;
    uint32_t note = 7;
    size_t landed;
    xfer_batch_t *b;
    init_t in;

    skip_unless_tcp();
    tb_init_start(&in, tb_srv_target);
    each_descs(d, 0, 4);
    cr_assert_eq(xfer_batch_create(in.p.ep, XFER_BATCH_PUT, in.mem, in.rkey, d, 4, &b),
                 XFER_OK);
    cr_expect_eq(xfer_batch_post(b, &note, sizeof(note), 0, NULL, NULL, &req),
                 XFER_ERR_UNSUPPORTED);
    cr_expect_null(req);
    cr_assert_eq(xfer_batch_destroy(b), XFER_OK);
    cr_expect_eq(each_post(&in, XFER_BATCH_PUT, d, 4, &landed), XFER_OK);
    cr_expect_eq(landed, 4);
    tp_send(&in.p, CMD_COUNT);
    cr_expect_eq(tb_recv_progressing(&in), 0, "notifications queued at the target");
    tb_init_finish(&in);
}

/* The target does not progress for 2 s: a cancelled batch, and one past its deadline, ends at
 * once with none landed (a put lands at the flush behind all of them), what it had in flight
 * completes later, and the endpoint carries on. */
static void each_ended_early(int cancel)
{
    static xfer_batch_desc_t d[EACH_DESCS];
    xfer_request_t *req, *f = NULL;
    xfer_status_t st;
    xfer_batch_t *b;
    double ms;
    init_t in;

    skip_unless_tcp();
    tb_init_start(&in, tb_srv_target);
    each_descs(d, 0, EACH_DESCS);
    st = tb_post_ended_early(&in, d, EACH_DESCS, 2000, cancel, &req, &b, &ms);
    cr_expect_eq(st, cancel ? XFER_ERR_CANCELED : XFER_ERR_TIMEOUT, "%s",
                 xfer_status_string(st));
    cr_expect_eq(xfer_request_landed(req), 0);
    cr_expect_lt(ms, 1500, "it took %.0f ms to end", ms);
    xfer_request_release(req);
    cr_assert_eq(xfer_batch_destroy(b), XFER_OK);
    cr_assert_eq(tb_recv_progressing(&in), 0);
    cr_assert_eq(xfer_endpoint_flush(in.p.ep, NULL, NULL, &f), XFER_OK);
    cr_expect_eq(xfer_request_wait(f, TP_WAIT_MS), XFER_OK);
    xfer_request_release(f);
    tb_init_finish(&in);
}

Test(batch_each, a_cancelled_batch_ends_at_once_and_the_endpoint_goes_on)
{
    each_ended_early(1);
}

Test(batch_each, a_batch_past_its_deadline_ends_at_once_and_the_endpoint_goes_on)
{
    each_ended_early(0);
}
