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
 * Over a transport without MEM_CUDA (verbs without GPUDirect) the framework stages what the
 * transport cannot touch: tagged messages and tensors through host buffers of their own
 * (framework/staging_msg.c) - the same scenarios, the same checks; puts and gets into a
 * peer's device memory skip there (no remote key exists for it; test_staging covers the
 * staged puts and gets of this side's), and so do the two tests of tcp's bounce buffers.
 */
#include "gpu_fixture.h"
#include "staging_test.h"
#include "test_peer.h"

#include <xfer/info.h>

#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAXLEN  (1u << 20)
#define TAG     0x5100u

static const size_t sizes[] = {1, 100, 4095, 4096, 4097, 3 * 4096 + 5, 65536 + 7, MAXLEN - 3};

enum {
    CMD_DONE = 1,
    CMD_ECHO,       /* len, tag: post a receive into D (reply 1), send it back with tag + 1
                     * (reply 2) */
    CMD_FILL,       /* seed: pattern(seed) into all of D */
    CMD_CHECK,      /* off, len, seed: D[off, off + len) holds pattern(seed) */
    CMD_PUBLISH,    /* step, len, seed, copy: publish D[0, len) = pattern(seed) as "t"
                     * (copy: with XFER_PUBLISH_COPY, D changed right after), wait until it
                     * was fetched */
    CMD_STALL_SENDING, /* len, tag: post a send of len host bytes (reply 1), then stop
                        * progressing until killed */
    CMD_STALL,      /* reply 1, then stop progressing until killed */
    CMD_WATCH,      /* len, seed: D[0, len) = something else (reply 1); progress until the
                     * last byte is pattern(seed)'s, then reply 2 if all of it is, else 3 */
};

static void setup(void)
{
    tp_env();
    setenv("XFER_TCP_CUDA_CHUNK", "4k", 1);
    setenv("XFER_TCP_CUDA_DEPTH", "2", 1);
    unsetenv("XFER_CUDA_LIB");
}

TestSuite(cuda_transport, .init = setup, .timeout = 240);

/* ---- the peer -------------------------------------------------------------------------------- */

static uint64_t ctl_u64(tp_side_t *s)
{
    uint64_t v;

    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
    return v;
}

static int srv_device(tp_side_t *s)
{
    char why[XFER_REASON_MAX];
    const xfer_cuda_driver_t *drv;
    char *host = malloc(MAXLEN);
    xfer_cu_ptr_t dptr = 0;
    void *cu_ctx, *blob;
    xfer_mem_t *mem;
    size_t len;

    TP_CHECK(host != NULL, "malloc");
    if (xfer_cuda_init(why, sizeof(why)) != XFER_OK) {
        TP_CHECK(tp_ctl_send_u64(s->ctl, 0) == 0, "ctl");  /* no GPU: the parent skips */
        free(host);
        return 0;
    }
    drv = xfer_cuda_driver(why, sizeof(why));
    TP_CHECK(drv != NULL, "%s", why);
    TP_CHECK(drv->device_primary_ctx_retain(&cu_ctx, 0) == 0, "primary context");
    TP_CHECK(drv->ctx_set_current(cu_ctx) == 0, "set context");
    TP_CHECK(drv->mem_alloc(&dptr, MAXLEN) == 0, "cuMemAlloc");
    TP_CHECK_STATUS(xfer_mem_register(s->ctx, (void*)(uintptr_t)dptr, MAXLEN, XFER_MEM_CUDA,
                                      &mem), XFER_OK);
    TP_CHECK(tp_ctl_send_u64(s->ctl, dptr) == 0, "ctl");
    if (xfer_rkey_pack(mem, &blob, &len) != XFER_OK) {
        /* the transport does not move CUDA memory itself: no puts and gets into it (only the
         * initiator's side of those is staged), tags and tensors through host memory */
        TP_CHECK(tp_ctl_send_u64(s->ctl, 0) == 0, "ctl");
    } else {
        TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
        TP_CHECK(tp_ctl_send(s->ctl, blob, len) == 0, "ctl");
        xfer_rkey_blob_free(blob);
    }
    for (;;) {
        xfer_request_t *req = NULL;
        uint64_t cmd, a, b, c;

        TP_CHECK(tp_progress_until_ctl(s, 120000) == 0, "no command from the parent");
        cmd = ctl_u64(s);
        if (cmd == CMD_DONE) {
            break;
        }
        switch (cmd) {
        case CMD_ECHO:
            a = ctl_u64(s);
            b = ctl_u64(s);
            TP_CHECK(TP_POSTED(xfer_tag_recv(s->ctx, s->ep, b, UINT64_MAX, (void*)(uintptr_t)dptr,
                                             a, mem, NULL, NULL, &req)), "tag recv");
            TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
            TP_CHECK_STATUS(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
            TP_CHECK(xfer_request_length(req) == a, "received %zu bytes of %llu",
                     xfer_request_length(req), (unsigned long long)a);
            xfer_request_release(req);
            req = NULL;
            TP_CHECK(TP_POSTED(xfer_tag_send(s->ep, b + 1, (void*)(uintptr_t)dptr, a, mem,
                                             NULL, NULL, &req)), "tag send");
            if (req != NULL) {
                TP_CHECK_STATUS(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
                xfer_request_release(req);
            }
            TP_CHECK(tp_ctl_send_u64(s->ctl, 2) == 0, "ctl");
            break;
        case CMD_FILL:
            tp_fill_pattern(host, MAXLEN, ctl_u64(s));
            TP_CHECK(drv->memcpy_htod(dptr, host, MAXLEN) == 0, "cuMemcpyHtoD");
            TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
            break;
        case CMD_CHECK: {
            ssize_t bad;

            a = ctl_u64(s);
            b = ctl_u64(s);
            c = ctl_u64(s);
            TP_CHECK(drv->memcpy_dtoh(host, dptr + a, b) == 0, "cuMemcpyDtoH");
            bad = tp_check_pattern(host, b, c);
            TP_CHECK(tp_ctl_send_u64(s->ctl, (bad < 0) ? 1 : (uint64_t)bad + 2) == 0, "ctl");
            break;
        }
        case CMD_PUBLISH: {
            xfer_tensor_t t = {XFER_DTYPE_UINT8, 1, {0}, 0, NULL, 0};

            a = ctl_u64(s);
            b = ctl_u64(s);
            c = ctl_u64(s);
            tp_fill_pattern(host, b, c);
            TP_CHECK(drv->memcpy_htod(dptr, host, b) == 0, "cuMemcpyHtoD");
            t.dims[0] = (int64_t)b;
            t.size    = b;
            t.data    = (void*)(uintptr_t)dptr;
            if (ctl_u64(s) != 0) {
                /* XFER_PUBLISH_COPY: the tensor is copied at once; the device buffer is the
                 * caller's again and changes before anyone fetches */
                TP_CHECK(TP_POSTED(xfer_tensor_publish(s->ctx, a, "t", &t, XFER_PUBLISH_COPY,
                                                       NULL, NULL, &req)), "publish");
                tp_fill_pattern(host, b, c + 1000);
                TP_CHECK(drv->memcpy_htod(dptr, host, b) == 0, "cuMemcpyHtoD");
            } else {
                TP_CHECK(TP_POSTED(xfer_tensor_publish(s->ctx, a, "t", &t, 0, NULL, NULL,
                                                       &req)), "publish");
            }
            TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
            TP_CHECK_STATUS(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
            xfer_request_release(req);
            TP_CHECK(tp_ctl_send_u64(s->ctl, 2) == 0, "ctl");
            break;
        }
        case CMD_STALL_SENDING: {
            char *big;

            a   = ctl_u64(s);
            b   = ctl_u64(s);
            big = malloc(a);
            TP_CHECK(big != NULL, "malloc");
            memset(big, 0x5a, a);
            TP_CHECK(TP_POSTED(xfer_tag_send(s->ep, b, big, a, NULL, NULL, NULL, &req)),
                     "tag send");
            TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
            tp_ctl_recv_u64(s->ctl, &c, TP_WAIT_MS * 3);    /* killed before this returns */
            return 1;
        }
        case CMD_WATCH: {
            char last = 0;
            double end;

            a = ctl_u64(s);
            b = ctl_u64(s);
            TP_CHECK(a > 0 && a <= MAXLEN, "length");
            tp_fill_pattern(host, a, b);
            c = (uint8_t)host[a - 1];
            for (uint64_t other = b + 1000; (uint8_t)host[a - 1] == c; other++) {
                tp_fill_pattern(host, a, other);
            }
            TP_CHECK(drv->memcpy_htod(dptr, host, a) == 0, "cuMemcpyHtoD");
            TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
            /* let the put pile up in the socket: it is then read in one go, more of it than
             * there are bounce buffers */
            usleep(100 * 1000);
            end = tp_now_ms() + TP_WAIT_MS;
            do {
                TP_CHECK(tp_now_ms() < end, "the put's last byte never came");
                xfer_progress(s->ctx);
                TP_CHECK(drv->memcpy_dtoh(&last, dptr + a - 1, 1) == 0, "cuMemcpyDtoH");
            } while ((uint8_t)last != c);
            TP_CHECK(drv->memcpy_dtoh(host, dptr, a) == 0, "cuMemcpyDtoH");
            TP_CHECK(tp_ctl_send_u64(s->ctl, (tp_check_pattern(host, a, b) < 0) ? 2 : 3) == 0,
                     "ctl");
            break;
        }
        case CMD_STALL:
            TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
            tp_ctl_recv_u64(s->ctl, &c, TP_WAIT_MS * 3);    /* killed before this returns */
            return 1;
        default:
            TP_CHECK(0, "unknown command %llu", (unsigned long long)cmd);
        }
    }
    TP_CHECK_STATUS(xfer_mem_deregister(mem), XFER_OK);
    TP_CHECK(drv->mem_free(dptr) == 0, "cuMemFree");
    drv->device_primary_ctx_release(0);
    free(host);
    return 0;
}

/* ---- this side ------------------------------------------------------------------------------- */

typedef struct dev_test {
    tp_peer_t     peer;
    tg_gpu_t      gpu;
    xfer_cu_ptr_t src, dst;         /* this side's device buffers */
    xfer_mem_t    *src_mem, *dst_mem;
    uint64_t      remote;           /* the peer's device region */
    xfer_rkey_t   *rkey;
    char          *host;
} dev_test_t;

static void fake_driver(void)
{
    tg_use_stand_in_driver();
}

static void dt_start(dev_test_t *t)
{
    void *blob;
    size_t blen;

    memset(t, 0, sizeof(*t));
    t->host = malloc(MAXLEN);
    cr_assert_not_null(t->host);
    tp_start(&t->peer, srv_device, NULL);
    t->remote = tp_recv(&t->peer);
    if (t->remote == 0) {
        tp_finish(&t->peer);
        fprintf(stderr, "cuda_transport: skipped: the peer found no usable CUDA device\n");
        cr_skip_test("the peer found no usable CUDA device");
    }
    if (tp_recv(&t->peer) != 0) {
        blob = tp_recv_blob(&t->peer, &blen);
        cr_assert_eq(xfer_rkey_unpack(t->peer.ep, blob, blen, &t->rkey), XFER_OK);
        free(blob);
    }
    tg_gpu_open(&t->gpu, "cuda_transport");
    cr_assert_eq(t->gpu.drv->mem_alloc(&t->src, MAXLEN), 0);
    cr_assert_eq(t->gpu.drv->mem_alloc(&t->dst, MAXLEN), 0);
    cr_assert_eq(xfer_mem_register(t->peer.ctx, (void*)(uintptr_t)t->src, MAXLEN, XFER_MEM_CUDA,
                                   &t->src_mem), XFER_OK);
    cr_assert_eq(xfer_mem_register(t->peer.ctx, (void*)(uintptr_t)t->dst, MAXLEN, XFER_MEM_CUDA,
                                   &t->dst_mem), XFER_OK);
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

static void dt_finish(dev_test_t *t)
{
    cr_expect_eq(xfer_mem_deregister(t->src_mem), XFER_OK);
    cr_expect_eq(xfer_mem_deregister(t->dst_mem), XFER_OK);
    cr_expect_eq(t->gpu.drv->mem_free(t->src), 0);
    cr_expect_eq(t->gpu.drv->mem_free(t->dst), 0);
    xfer_rkey_destroy(t->rkey);
    tp_send(&t->peer, CMD_DONE);
    tp_finish(&t->peer);
    t->gpu.drv->device_primary_ctx_release(t->gpu.device);
    free(t->host);
}

/* pattern(seed) into this side's device buffer at ptr. */
static void dev_fill(dev_test_t *t, xfer_cu_ptr_t ptr, size_t len, uint64_t seed)
{
    tp_fill_pattern(t->host, len, seed);
    cr_assert_eq(t->gpu.drv->memcpy_htod(ptr, t->host, len), 0);
}

/* Whether this side's device memory at ptr holds pattern(seed); -1 when it does. */
static ssize_t dev_check(dev_test_t *t, xfer_cu_ptr_t ptr, size_t len, uint64_t seed)
{
    cr_assert_eq(t->gpu.drv->memcpy_dtoh(t->host, ptr, len), 0);
    return tp_check_pattern(t->host, len, seed);
}

/* A command of three arguments (CMD_CHECK), and its answer. */
static uint64_t peer_cmd(dev_test_t *t, uint64_t cmd, uint64_t a, uint64_t b, uint64_t c)
{
    tp_send(&t->peer, cmd);
    tp_send(&t->peer, a);
    tp_send(&t->peer, b);
    tp_send(&t->peer, c);
    return tp_recv(&t->peer);
}

static void wait_ok(xfer_status_t s, xfer_request_t *req, const char *what, size_t len)
{
    cr_assert(TP_POSTED(s), "%s of %zu bytes: %s", what, len, xfer_status_string(s));
    cr_assert_eq(tp_op_result(s, req, TP_WAIT_MS), XFER_OK, "%s of %zu bytes", what, len);
}

/* A message of len bytes from device memory here to device memory there and back, checked.
 * unexpected: sent before the peer posts its receive, so that it waits in the peer's
 * unexpected queue. */
static void echo_check(dev_test_t *t, size_t len, uint64_t tag, int unexpected, uint64_t seed)
{
    xfer_request_t *sreq = NULL, *rreq = NULL;
    xfer_status_t s = XFER_ERR_INTERNAL;

    dev_fill(t, t->src, len, seed);
    dev_fill(t, t->dst, len, 7);
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
    wait_ok(s, sreq, unexpected ? "unexpected send" : "send", len);
    wait_ok(XFER_INPROGRESS, rreq, "echo", len);
    cr_expect_eq(tp_recv(&t->peer), 2);
    cr_expect_eq(dev_check(t, t->dst, len, seed), -1, "%s message of %zu bytes came back "
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
        size_t len = sizes[i], off = (len + 3 <= MAXLEN) ? 3 : 0;
        xfer_request_t *req = NULL;
        xfer_status_t s;

        dev_fill(&t, t.src, len, 200 + i);
        s = xfer_put(t.peer.ep, (void*)(uintptr_t)t.src, len, t.src_mem, t.remote + off, t.rkey,
                     NULL, NULL, &req);
        wait_ok(s, req, "put", len);
        cr_assert_eq(tp_flush(t.peer.ep, TP_WAIT_MS), XFER_OK, "flush after a put");
        cr_expect_eq(peer_cmd(&t, CMD_CHECK, off, len, 200 + i), 1, "put of %zu bytes into "
                     "the peer's device memory", len);

        tp_send(&t.peer, CMD_FILL);
        tp_send(&t.peer, 300 + i);
        cr_assert_eq(tp_recv(&t.peer), 1);
        dev_fill(&t, t.dst, len, 8);
        req = NULL;
        s   = xfer_get(t.peer.ep, (void*)(uintptr_t)t.dst, len, t.dst_mem, t.remote, t.rkey,
                       NULL, NULL, &req);
        wait_ok(s, req, "get", len);
        cr_expect_eq(dev_check(&t, t.dst, len, 300 + i), -1, "get of %zu bytes from the "
                     "peer's device memory", len);
    }
    dt_finish(&t);
}

/* A put into the peer's device memory that the peer watches land, as a put_lat benchmark
 * does: once the last byte is there, every byte before it is. tcp copies the chunks to the
 * device through its bounce buffers, asynchronously, and a chunk that finds them all busy
 * synchronously: a synchronous copy that did not wait for the copies before it landed
 * first, and the last byte could be seen before the bytes ahead of it. */
static void puts_land_in_order(void)
{
    dev_test_t t;

    dt_start(&t);
    if (t.rkey == NULL) {
        dt_finish(&t);
        cr_skip_test("no puts into the peer's device memory over this transport");
    }
    for (uint64_t round = 0; round < 8; round++) {
        size_t len = (round % 2) ? MAXLEN - 1 : 65535;     /* all of it fits the socket */
        xfer_request_t *req = NULL;

        dev_fill(&t, t.src, len, 800 + round);
        tp_send(&t.peer, CMD_WATCH);
        tp_send(&t.peer, len);
        tp_send(&t.peer, 800 + round);
        cr_assert_eq(tp_recv(&t.peer), 1);
        cr_assert(TP_POSTED(xfer_put(t.peer.ep, (void*)(uintptr_t)t.src, len, t.src_mem,
                                     t.remote, t.rkey, NULL, NULL, &req)));
        wait_ok(XFER_INPROGRESS, req, "put", len);
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
                fp.capacity = MAXLEN;
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
            cr_expect_eq(dev_check(&t, (xfer_cu_ptr_t)(uintptr_t)got->data, len, 400 + i), -1,
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
Test(cuda_transport, puts_land_in_order) { puts_land_in_order(); }
Test(cuda_transport, puts_land_in_order_stand_in) { fake_driver(); puts_land_in_order(); }

/* The sender dies in the middle of a 16 MiB message that this side receives into device
 * memory through the bounce buffers: the receive fails once, with the connection's error,
 * its copies landed before it is reported; the bounce buffers serve the next peer. */
#define DIE_LEN (16u << 20)

typedef struct calls {
    int           n;
    xfer_status_t status;
} calls_t;

static void count_cb(xfer_request_t *req, xfer_status_t status, void *arg)
{
    calls_t *c = arg;

    (void)req;
    c->n++;
    c->status = status;
}

Test(cuda_transport, a_sender_dying_mid_message_fails_the_device_receive_once_stand_in)
{
    xfer_cu_ptr_t big = 0;
    xfer_request_t *rreq = NULL;
    calls_t calls = {0};
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
                                      (void*)(uintptr_t)big, DIE_LEN, big_mem, count_cb, &calls,
                                      &rreq)));
    tp_send(&t.peer, CMD_STALL_SENDING);
    tp_send(&t.peer, DIE_LEN);
    tp_send(&t.peer, TAG);
    cr_assert_eq(tp_recv(&t.peer), 1);
    tp_progress_for(t.peer.ctx, 200);
    cr_assert_eq(xfer_request_test(rreq), XFER_INPROGRESS,
                 "16 MiB cannot have come from a sender that stopped progressing");
    cr_assert_eq(kill(t.peer.pid, SIGKILL), 0);
    cr_assert_eq(tp_child_wait(&t.peer, 10), 128 + SIGKILL);
    close(t.peer.ctl);
    t.peer.ctl = -1;

    s = xfer_request_wait(rreq, TP_WAIT_MS);
    cr_expect(s < 0, "the receive ended with %s although its sender died",
              xfer_status_string(s));
    cr_expect_neq(s, XFER_ERR_TIMEOUT);
    cr_expect_eq(calls.n, 1, "the receive's callback ran %d times", calls.n);
    xfer_request_release(rreq);
    cr_expect_eq(xfer_mem_deregister(big_mem), XFER_OK);
    cr_expect_eq(t.gpu.drv->mem_free(big), 0);
    cr_expect_eq(xfer_mem_deregister(t.src_mem), XFER_OK);
    cr_expect_eq(xfer_mem_deregister(t.dst_mem), XFER_OK);
    cr_expect_eq(t.gpu.drv->mem_free(t.src), 0);
    cr_expect_eq(t.gpu.drv->mem_free(t.dst), 0);
    xfer_rkey_destroy(t.rkey);
    xfer_endpoint_close(t.peer.ep);
    xfer_context_destroy(t.peer.ctx);
    t.gpu.drv->device_primary_ctx_release(t.gpu.device);
    free(t.host);

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
    tp_server_spawn(&p->peer, srv_device, NULL, NULL);
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
    for (size_t off = 0; off < DIE_LEN; off += MAXLEN) {
        dev_fill(&t, big + off, MAXLEN, 700 + off / MAXLEN);
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
