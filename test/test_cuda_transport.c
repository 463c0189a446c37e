/*
 * CUDA device memory moved by a transport that takes it itself (tcp: through bounce buffers
 * of its own, components/tcp/tcp_cuda.c), between two processes, both sides in device
 * memory: tagged messages (expected and unexpected, eager and large), puts into and gets from
 * a peer's device region, and a tensor published from device memory and fetched into device
 * memory (a caller buffer and an allocation callback's). Every byte is checked through the
 * driver, on the side it landed on.
 *
 * Each scenario runs twice: over the GPU's own driver (it skips where there is none) and over
 * test/plugins/fake_cuda.c, a stand-in for the driver that is the only test double here: its
 * device memory is not CPU-addressable (PROT_NONE), so a transport that touched it instead of
 * a bounce buffer would fault, and its copies land only after several event queries, so a
 * buffer written or reused before its copy landed moves wrong bytes. Small bounce buffers
 * (XFER_TCP_CUDA_CHUNK=4k, two per direction) make every large transfer wait for copies.
 * Over a transport without MEM_CUDA (verbs without GPUDirect, shm) the framework stages what
 * the transport cannot touch: tagged messages and tensors through host buffers of their own
 * (framework/staging_msg.c) - the same scenarios, the same checks. Puts and gets into a
 * peer's device memory run over shm too (RMA_CUDA: the initiator opens the peer's allocation
 * by its CUDA IPC handle) and skip over verbs (no remote key exists for it there;
 * test_staging covers the staged puts and gets of this side's), and so do the two tests of
 * tcp's bounce buffers wherever tcp is not the transport.
 */
#include "cuda_peer.h"
#include "staging_test.h"

#include <xfer/info.h>

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TAG     0x5100u

static const size_t sizes[] = {1, 100, 4095, 4096, 4097, 3 * 4096 + 5, 65536 + 7,
                               DT_MAXLEN - 3};

static void setup(void)
{
    tp_env();
    setenv("XFER_TCP_CUDA_CHUNK", "4k", 1);
    setenv("XFER_TCP_CUDA_DEPTH", "2", 1);
    unsetenv("XFER_CUDA_LIB");
}

TestSuite(cuda_transport, .init = setup, .timeout = 240);

static void fake_driver(void)
{
    tg_use_stand_in_driver();
}

/* Where the transport moves device memory itself nothing was staged; elsewhere every
 * message and tensor of it went through host memory of the framework's. */
static void expect_staged(dev_test_t *t, uint64_t at_least)
{
    xfer_staging_stats_t st;

    xfer_staging_test_stats(t->peer.ctx, &st);
    if (tg_transport_moves_cuda(t->peer.ctx, t->peer.ep)) {
        cr_expect_eq(st.msgs, 0, "%s moves CUDA memory, yet %llu messages were staged",
                     xfer_endpoint_transport(t->peer.ep), (unsigned long long)st.msgs);
    } else {
        cr_expect_geq(st.msgs, at_least, "%llu messages staged over %s",
                      (unsigned long long)st.msgs, xfer_endpoint_transport(t->peer.ep));
    }
}

/* A message of len bytes from device memory here to device memory there and back, checked.
 * unexpected: sent before the peer posts its receive, so that it waits in the peer's
 * unexpected queue. */
static void echo_check(dev_test_t *t, size_t len, uint64_t tag, int unexpected, uint64_t seed)
{
    xfer_request_t *sreq = NULL, *rreq = NULL;
    xfer_status_t s = XFER_ERR_INTERNAL;

    dt_fill(t, t->src, len, seed);
    dt_fill(t, t->dst, len, 7);
    cr_assert(TP_POSTED(xfer_tag_recv(t->peer.ctx, t->peer.ep, tag + 1, UINT64_MAX,
                                      (void*)(uintptr_t)t->dst, len, t->dst_mem, NULL, NULL,
                                      &rreq)));
    if (unexpected) {
        /* a large one completes only once the peer matched it (a rendezvous) */
        s = xfer_tag_send(t->peer.ep, tag, (void*)(uintptr_t)t->src, len, t->src_mem, NULL,
                          NULL, &sreq);
        cr_assert(TP_POSTED(s), "unexpected send of %zu bytes: %s", len, xfer_status_string(s));
        tp_progress_for(t->peer.ctx, 20);
    }
    tp_send(&t->peer, CMD_ECHO);
    tp_send(&t->peer, len);
    tp_send(&t->peer, tag);
    cr_assert_eq(tp_recv(&t->peer), 1);
    if (!unexpected) {
        s = xfer_tag_send(t->peer.ep, tag, (void*)(uintptr_t)t->src, len, t->src_mem, NULL,
                          NULL, &sreq);
    }
    dt_wait_ok(s, sreq, unexpected ? "unexpected send" : "send", len);
    dt_wait_ok(XFER_INPROGRESS, rreq, "echo", len);
    cr_expect_eq(tp_recv(&t->peer), 2);
    cr_expect_eq(dt_check(t, t->dst, len, seed), -1, "%s message of %zu bytes came back "
                 "wrong", unexpected ? "an unexpected" : "a", len);
}

static void tags(int unexpected)
{
    dev_test_t t;

    dt_start(&t);
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        echo_check(&t, sizes[i], TAG + 2 * i, unexpected, 100 + i);
    }
    expect_staged(&t, 2 * (sizeof(sizes) / sizeof(sizes[0])));    /* a send, a receive */
    dt_finish(&t);
}

/* A test of the way tcp moves device memory (its bounce buffers); elsewhere it skips. */
static void tcp_bounce_only(dev_test_t *t)
{
    if (!tg_transport_moves_cuda(t->peer.ctx, t->peer.ep)) {
        fprintf(stderr, "cuda_transport: skipped: %s does not move CUDA memory itself\n",
                xfer_endpoint_transport(t->peer.ep));
        dt_finish(t);
        cr_skip_test("the transport does not move CUDA memory itself");
    }
}

/* Puts from device memory here into the peer's device region, gets back from it. */
static void rma(void)
{
    dev_test_t t;

    dt_start(&t);
    if (t.rkey == NULL) {
        const char *why = "the transport does not move CUDA memory itself: a peer's device "
                          "memory takes no puts or gets (test_staging covers staged puts and "
                          "gets from and into this side's)";

        dt_finish(&t);
        fprintf(stderr, "cuda_transport: skipped: %s\n", why);
        cr_skip_test("%s", why);
    }
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        size_t len = sizes[i], off = (len + 3 <= DT_MAXLEN) ? 3 : 0;
        xfer_request_t *req = NULL;
        xfer_status_t s;

        dt_fill(&t, t.src, len, 200 + i);
        s = xfer_put(t.peer.ep, (void*)(uintptr_t)t.src, len, t.src_mem, t.remote + off, t.rkey,
                     NULL, NULL, &req);
        dt_wait_ok(s, req, "put", len);
        cr_assert_eq(tp_flush(t.peer.ep, TP_WAIT_MS), XFER_OK, "flush after a put");
        cr_expect_eq(dt_cmd(&t, CMD_CHECK, off, len, 200 + i), 1, "put of %zu bytes into "
                     "the peer's device memory", len);

        tp_send(&t.peer, CMD_FILL);
        tp_send(&t.peer, 300 + i);
        cr_assert_eq(tp_recv(&t.peer), 1);
        dt_fill(&t, t.dst, len, 8);
        req = NULL;
        s   = xfer_get(t.peer.ep, (void*)(uintptr_t)t.dst, len, t.dst_mem, t.remote, t.rkey,
                       NULL, NULL, &req);
        dt_wait_ok(s, req, "get", len);
        cr_expect_eq(dt_check(&t, t.dst, len, 300 + i), -1, "get of %zu bytes from the "
                     "peer's device memory", len);
    }
    dt_finish(&t);
}

/* A put into the peer's device memory that the peer watches land, as a put_lat benchmark
 * does: once the last byte is there, every byte before it is. tcp copies the chunks to the
 * device through its bounce buffers, asynchronously, and a chunk that finds them all busy
 * synchronously: a synchronous copy that did not wait for the copies before it landed
 * first, and the last byte could be seen before the bytes ahead of it. */
static void puts_land_in_order(uint64_t pause_ms)
{
    dev_test_t t;

    dt_start(&t);
    if (t.rkey == NULL) {
        dt_finish(&t);
        cr_skip_test("no puts into the peer's device memory over this transport");
    }
    for (uint64_t round = 0; round < 8; round++) {
        size_t len = (round % 2) ? DT_MAXLEN - 1 : 65535;     /* all of it fits the socket */
        xfer_request_t *req = NULL;

        dt_fill(&t, t.src, len, 800 + round);
        tp_send(&t.peer, CMD_WATCH);
        tp_send(&t.peer, len);
        tp_send(&t.peer, 800 + round);
        tp_send(&t.peer, pause_ms);
        cr_assert_eq(tp_recv(&t.peer), 1);
        cr_assert(TP_POSTED(xfer_put(t.peer.ep, (void*)(uintptr_t)t.src, len, t.src_mem,
                                     t.remote, t.rkey, NULL, NULL, &req)));
        dt_wait_ok(XFER_INPROGRESS, req, "put", len);
        cr_expect_eq(tp_recv(&t.peer), 2, "round %llu: the peer saw the last byte of the put "
                     "before the bytes ahead of it", (unsigned long long)round);
    }
    dt_finish(&t);
}

static void *alloc_device(const xfer_tensor_t *meta, void *arg)
{
    dev_test_t *t = arg;
    xfer_cu_ptr_t p = 0;

    /* inside the transport's receive path: allocation only, as the API allows */
    if (t->gpu.drv->mem_alloc(&p, meta->size ? meta->size : 1) != 0) {
        return NULL;
    }
    return (void*)(uintptr_t)p;
}

/* A tensor in the peer's device memory, fetched into device memory here: a registered
 * caller buffer, then a buffer an allocation callback returns (that one published with
 * XFER_PUBLISH_COPY, the device buffer changed right after). */
static void tensors(void)
{
    dev_test_t t;
    uint64_t step = 1;

    dt_start(&t);
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        size_t len = sizes[i];

        for (int use_alloc = 0; use_alloc < 2; use_alloc++, step++) {
            xfer_fetch_params_t fp = {sizeof(fp), NULL, 0, NULL, NULL, NULL};
            const xfer_tensor_t *got;
            xfer_request_t *req = NULL;
            xfer_status_t s;

            if (use_alloc) {
                fp.alloc     = alloc_device;
                fp.alloc_arg = &t;
            } else {
                fp.buffer   = (void*)(uintptr_t)t.dst;
                fp.capacity = DT_MAXLEN;
                fp.mem      = t.dst_mem;
            }
            tp_send(&t.peer, CMD_PUBLISH);
            tp_send(&t.peer, step);
            tp_send(&t.peer, len);
            tp_send(&t.peer, 400 + i);
            tp_send(&t.peer, use_alloc);    /* XFER_PUBLISH_COPY of device memory */
            cr_assert_eq(tp_recv(&t.peer), 1);
            s = xfer_tensor_fetch(t.peer.ep, step, "t", &fp, NULL, NULL, &req);
            cr_assert(TP_POSTED(s), "fetch of %zu bytes: %s", len, xfer_status_string(s));
            cr_assert_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_OK, "fetch of %zu bytes %s",
                         len, use_alloc ? "into an allocation" : "into a registered buffer");
            got = xfer_request_tensor(req);
            cr_assert_not_null(got);
            cr_expect_eq(got->size, len);
            cr_expect_eq(dt_check(&t, (xfer_cu_ptr_t)(uintptr_t)got->data, len, 400 + i), -1,
                         "tensor of %zu bytes fetched %s", len,
                         use_alloc ? "into an allocation" : "into a registered buffer");
            if (use_alloc) {
                cr_expect_eq(t.gpu.drv->mem_free((xfer_cu_ptr_t)(uintptr_t)got->data), 0);
            }
            xfer_request_release(req);
            cr_expect_eq(tp_recv(&t.peer), 2);
        }
    }
    expect_staged(&t, 2 * (sizeof(sizes) / sizeof(sizes[0])));    /* every fetch */
    dt_finish(&t);
}

/* Over the GPU's own driver; skip where there is none. */
Test(cuda_transport, tags_expected) { tags(0); }
Test(cuda_transport, tags_unexpected) { tags(1); }
Test(cuda_transport, put_and_get) { rma(); }
Test(cuda_transport, tensors) { tensors(); }

/* Over the stand-in driver (see the top of the file). */
Test(cuda_transport, tags_expected_stand_in) { fake_driver(); tags(0); }
Test(cuda_transport, tags_unexpected_stand_in) { fake_driver(); tags(1); }
Test(cuda_transport, put_and_get_stand_in) { fake_driver(); rma(); }
Test(cuda_transport, tensors_stand_in) { fake_driver(); tensors(); }
Test(cuda_transport, puts_land_in_order) { puts_land_in_order(100); }
Test(cuda_transport, puts_land_in_order_stand_in) { fake_driver(); puts_land_in_order(100); }

/* The same watched from the start, over a stand-in whose copies into device memory land their
 * last byte 2 ms before the rest (FAKE_CUDA_LAST_BYTE_FIRST), as a copy spread over several
 * engines may: a put must land its last byte by a copy of its own, after the rest. */
Test(cuda_transport, puts_land_their_last_byte_last_whatever_the_copy_engine_stand_in)
{
    fake_driver();
    setenv("FAKE_CUDA_LAST_BYTE_FIRST", "1", 1);
    puts_land_in_order(0);
}

/* The sender dies in the middle of a 16 MiB message that this side receives into device
 * memory through the bounce buffers: the receive fails once, with the connection's error,
 * its copies landed before it is reported; the bounce buffers serve the next peer. */
#define DIE_LEN (16u << 20)

Test(cuda_transport, a_sender_dying_mid_message_fails_the_device_receive_once_stand_in)
{
    xfer_cu_ptr_t big = 0;
    xfer_request_t *rreq = NULL;
    tp_calls_t calls = {0};
    xfer_mem_t *big_mem;
    xfer_status_t s;
    dev_test_t t;

    fake_driver();
    dt_start(&t);
    tcp_bounce_only(&t);
    cr_assert_eq(t.gpu.drv->mem_alloc(&big, DIE_LEN), 0);
    cr_assert_eq(xfer_mem_register(t.peer.ctx, (void*)(uintptr_t)big, DIE_LEN, XFER_MEM_CUDA,
                                   &big_mem), XFER_OK);
    cr_assert(TP_POSTED(xfer_tag_recv(t.peer.ctx, t.peer.ep, TAG, UINT64_MAX,
                                      (void*)(uintptr_t)big, DIE_LEN, big_mem, tp_calls_cb, &calls,
                                      &rreq)));
    tp_send(&t.peer, CMD_STALL_SENDING);
    tp_send(&t.peer, DIE_LEN);
    tp_send(&t.peer, TAG);
    cr_assert_eq(tp_recv(&t.peer), 1);
    tp_progress_for(t.peer.ctx, 200);
    cr_assert_eq(xfer_request_test(rreq), XFER_INPROGRESS,
                 "16 MiB cannot have come from a sender that stopped progressing");
    dt_kill(&t);

    s = xfer_request_wait(rreq, TP_WAIT_MS);
    cr_expect(s < 0, "the receive ended with %s although its sender died",
              xfer_status_string(s));
    cr_expect_neq(s, XFER_ERR_TIMEOUT);
    cr_expect_eq(calls.calls, 1, "the receive's callback ran %d times", calls.calls);
    xfer_request_release(rreq);
    cr_expect_eq(xfer_mem_deregister(big_mem), XFER_OK);
    cr_expect_eq(t.gpu.drv->mem_free(big), 0);
    dt_finish(&t);

    /* a new peer: device memory moves both ways through the bounce buffers again */
    dt_start(&t);
    echo_check(&t, 3 * 4096 + 5, TAG, 0, 500);
    echo_check(&t, 65536 + 7, TAG + 2, 1, 501);
    dt_finish(&t);
}

/* A peer of the same context whose process stops progressing (killed at the end). */
typedef struct stalled {
    tp_peer_t   peer;
    xfer_cu_ptr_t rx_buf;           /* device memory this side receives its message into */
    xfer_mem_t  *rx_mem;
    xfer_request_t *rx_req, *tx_req;
} stalled_t;

/* Fork the peer: before this side initialises CUDA (fork after cuInit is not safe). */
static void stalled_spawn(stalled_t *p)
{
    memset(p, 0, sizeof(*p));
    tp_server_spawn(&p->peer, dt_serve, NULL, NULL);
}

static void stalled_connect(dev_test_t *t, stalled_t *p)
{
    void *blob;
    size_t blen;

    p->peer.ep = tp_connect(t->peer.ctx, &p->peer);
    cr_assert_neq(tp_recv(&p->peer), 0);
    cr_assert_neq(tp_recv(&p->peer), 0, "tcp moves CUDA memory: the peer has a remote key");
    blob = tp_recv_blob(&p->peer, &blen);
    free(blob);
    cr_assert_eq(t->gpu.drv->mem_alloc(&p->rx_buf, DIE_LEN), 0);
    cr_assert_eq(xfer_mem_register(t->peer.ctx, (void*)(uintptr_t)p->rx_buf, DIE_LEN,
                                   XFER_MEM_CUDA, &p->rx_mem), XFER_OK);
}

static void stalled_kill(dev_test_t *t, stalled_t *p)
{
    cr_assert_eq(kill(p->peer.pid, SIGKILL), 0);
    cr_assert_eq(tp_child_wait(&p->peer, 10), 128 + SIGKILL);
    close(p->peer.ctl);
    for (int i = 0; i < 2; i++) {
        xfer_request_t *req = i ? p->tx_req : p->rx_req;

        if (req != NULL) {
            cr_expect(xfer_request_wait(req, TP_WAIT_MS) < 0, "a transfer with a killed "
                      "peer succeeded");
            xfer_request_release(req);
        }
    }
    xfer_endpoint_close(p->peer.ep);
    cr_expect_eq(xfer_mem_deregister(p->rx_mem), XFER_OK);
    cr_expect_eq(t->gpu.drv->mem_free(p->rx_buf), 0);
}

/* Every bounce buffer held by transfers with peers that stopped (XFER_TCP_CUDA_DEPTH=2: a
 * send to A whose socket is full holds both send buffers; receives from A and B, half
 * arrived, hold both receive buffers): device memory still moves both ways with a third
 * peer, through buffers of its endpoint, instead of waiting for peers that may never go on. */
Test(cuda_transport, transfers_with_stalled_peers_do_not_hold_up_another_stand_in)
{
    xfer_cu_ptr_t big = 0;
    xfer_mem_t *big_mem;
    stalled_t a, b;
    dev_test_t t;

    fake_driver();
    stalled_spawn(&a);
    stalled_spawn(&b);
    dt_start(&t);
    if (!tg_transport_moves_cuda(t.peer.ctx, t.peer.ep)) {
        for (int i = 0; i < 2; i++) {
            stalled_t *p = i ? &b : &a;

            kill(p->peer.pid, SIGKILL);
            tp_child_wait(&p->peer, 10);
            close(p->peer.ctl);
        }
        tcp_bounce_only(&t);
    }
    stalled_connect(&t, &a);
    stalled_connect(&t, &b);
    cr_assert_eq(t.gpu.drv->mem_alloc(&big, DIE_LEN), 0);
    cr_assert_eq(xfer_mem_register(t.peer.ctx, (void*)(uintptr_t)big, DIE_LEN, XFER_MEM_CUDA,
                                   &big_mem), XFER_OK);
    for (size_t off = 0; off < DIE_LEN; off += DT_MAXLEN) {
        dt_fill(&t, big + off, DT_MAXLEN, 700 + off / DT_MAXLEN);
    }
    /* receives from A and B whose senders stop half way */
    for (int i = 0; i < 2; i++) {
        stalled_t *p = i ? &b : &a;

        cr_assert(TP_POSTED(xfer_tag_recv(t.peer.ctx, p->peer.ep, TAG, UINT64_MAX,
                                          (void*)(uintptr_t)p->rx_buf, DIE_LEN, p->rx_mem,
                                          NULL, NULL, &p->rx_req)));
        tp_send(&p->peer, CMD_STALL_SENDING);
        tp_send(&p->peer, DIE_LEN);
        tp_send(&p->peer, TAG);
        cr_assert_eq(tp_recv(&p->peer), 1);
    }
    /* a send to A, which reads nothing */
    cr_assert(TP_POSTED(xfer_tag_send(a.peer.ep, TAG, (void*)(uintptr_t)big, DIE_LEN, big_mem,
                                      NULL, NULL, &a.tx_req)));
    tp_progress_for(t.peer.ctx, 300);
    cr_assert_eq(xfer_request_test(a.rx_req), XFER_INPROGRESS);
    cr_assert_eq(xfer_request_test(b.rx_req), XFER_INPROGRESS);
    cr_assert_eq(xfer_request_test(a.tx_req), XFER_INPROGRESS);

    echo_check(&t, 65536 + 7, TAG + 10, 0, 600);
    echo_check(&t, 3 * 4096 + 5, TAG + 12, 1, 601);

    stalled_kill(&t, &a);
    stalled_kill(&t, &b);
    cr_expect_eq(xfer_mem_deregister(big_mem), XFER_OK);
    cr_expect_eq(t.gpu.drv->mem_free(big), 0);
    dt_finish(&t);
}
