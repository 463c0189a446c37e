/*
 * Batches into and out of a peer's CUDA device memory, between two processes, over the
 * transport under test (shm: the initiator opens the peer's allocation by its CUDA IPC handle
 * and copies with the driver; tcp: through its bounce buffers): the peer checks a put batch's
 * data in its device memory the moment the notification arrives; a get batch lands
 * scattered in device memory here; a batch from host memory lands in the peer's device
 * memory; device memory here moves to and from the peer's host memory (over shm by the
 * driver into the peer's xfer_mem_alloc memory mapped here; its malloc'd memory takes
 * staged puts and gets, and refuses batches); two contexts of one process do the same
 * (over shm by the address itself). Over shm, a remote key that claims more of
 * the allocation than the handle opens moves nothing, into the allocation or past it, and
 * keys that no shm side writes are refused. A peer that stops progressing leaves a batch
 * with a notification to end at its deadline, saying what landed; once it dies, the
 * endpoint fails and what is posted after ends with an error. How a batch reaches the
 * driver (its batch calls, shm's copy kernel, and their faults) is in
 * test_cuda_batch_driver.c, which shares the helpers here through test_cuda_batch.h.
 *
 * Each runs over the GPU's own driver (skipped where there is none) and over
 * test/plugins/fake_cuda.c, the stand-in for the driver (cuda_peer.h, test_cuda_transport.c):
 * its device memory is not CPU-addressable, and its copies land only when the stream is
 * synchronised or its events asked, so a notification sent before the copies were waited
 * for arrives before the data. Transports that give no remote key for device memory (verbs
 * without GPUDirect) skip.
 */
#include "test_cuda_batch.h"
#include "cuda_peer.h"

#include <xfer/info.h>

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void setup(void)
{
    tp_env();
    unsetenv("XFER_CUDA_LIB");
}

TestSuite(cuda_batch, .init = setup, .timeout = 240);

void tcb_blocks_make(blocks_t *b, const uint64_t *lens, size_t n)
{
    uint64_t at = 0;

    cr_assert_leq(n, MAX_DESCS);
    b->n = n;
    for (size_t k = 0; k < n; k++) {
        b->d[k].remote_offset = at;
        b->d[k].length        = lens[k];
        at += lens[k];
    }
    b->total = at;
    cr_assert_leq(b->total, DT_MAXLEN);
    at = 0;
    for (size_t k = n; k-- > 0;) {
        b->d[k].local_offset = at;
        at += lens[k];
    }
}

/* 128 x 4 KiB; 600 blocks of 1 to 1500 bytes (more than one driver call takes over shm:
 * shm_cuda.c hands the driver 256 copies a call); and blocks of mixed sizes (one byte to
 * 20000, odd ones included). */
size_t tcb_lens_of(unsigned round, uint64_t *lens)
{
    static const uint64_t mixed[] = {1, 4095, 20000, 4096, 777, 8192, 3, 12289, 64};
    size_t n = 0;

    if (round == 0) {
        for (; n < 128; n++) {
            lens[n] = 4096;
        }
        return n;
    }
    if (round == 2) {
        for (; n < 600; n++) {
            lens[n] = 1 + (n * 7919) % 1500;
        }
        return n;
    }
    for (; n < 37; n++) {
        lens[n] = mixed[(n * 5 + round) % (sizeof(mixed) / sizeof(mixed[0]))];
    }
    return n;
}

/* The local image of pattern(seed) over the remote blocks: block k's bytes at lo[k]. */
void tcb_local_image(const blocks_t *b, uint64_t seed, char *img)
{
    char *want = malloc(b->total);

    cr_assert_not_null(want);
    tp_fill_pattern(want, b->total, seed);
    for (size_t k = 0; k < b->n; k++) {
        memcpy(img + b->d[k].local_offset, want + b->d[k].remote_offset, b->d[k].length);
    }
    free(want);
}

/* A put batch of b from src (registered as mem) with a notification; the peer checks its
 * device memory when the notification arrives. */
void tcb_put_round(dev_test_t *t, const blocks_t *b, xfer_mem_t *mem, uint64_t seed)
{
    xfer_request_t *req = NULL;
    xfer_batch_t *batch = NULL;
    char note[32];
    xfer_status_t s;

    cr_assert_eq(xfer_batch_create(t->peer.ep, XFER_BATCH_PUT, mem, t->rkey, b->d, b->n,
                                   &batch), XFER_OK);
    tp_send(&t->peer, CMD_AWAIT_NOTIFY);
    tp_send(&t->peer, b->total);
    tp_send(&t->peer, seed);
    cr_assert_eq(tp_recv(&t->peer), 1);
    snprintf(note, sizeof(note), "batch %llu", (unsigned long long)seed);
    s = xfer_batch_post(batch, note, strlen(note), 0, NULL, NULL, &req);
    cr_assert(TP_POSTED(s), "put batch: %s", xfer_status_string(s));
    cr_assert_not_null(req);
    s = xfer_request_wait(req, TP_WAIT_MS);
    cr_assert_eq(s, XFER_OK, "put batch of %zu blocks: %s (%zu landed)", b->n,
                 xfer_status_string(s), xfer_request_landed(req));
    cr_expect_eq(xfer_request_landed(req), b->n);
    xfer_request_release(req);
    cr_expect_eq(tp_recv(&t->peer), 2, "%zu blocks, %llu bytes: the peer's device memory did "
                 "not hold the batch when its notification came", b->n,
                 (unsigned long long)b->total);
    cr_expect_eq(xfer_batch_destroy(batch), XFER_OK);
}

/* A get batch of b into dst, whose blocks must hold pattern(seed) as the peer's region
 * does; img: DT_MAXLEN bytes to build the expected image in. */
void tcb_get_round(dev_test_t *t, const blocks_t *b, uint64_t seed, char *img)
{
    xfer_request_t *req = NULL;
    xfer_batch_t *batch = NULL;
    xfer_status_t s;

    dt_fill(t, t->dst, DT_MAXLEN, 7);
    cr_assert_eq(xfer_batch_create(t->peer.ep, XFER_BATCH_GET, t->dst_mem, t->rkey, b->d, b->n,
                                   &batch), XFER_OK);
    s = xfer_batch_post(batch, NULL, 0, 0, NULL, NULL, &req);
    dt_wait_ok(s, req, "get batch", b->total);
    tcb_local_image(b, seed, img);
    cr_assert_eq(t->gpu.drv->memcpy_dtoh(t->host, t->dst, b->total), 0);
    cr_expect_eq(memcmp(t->host, img, b->total), 0, "%zu blocks, %llu bytes: the blocks read "
                 "from the peer's region did not land where they belong", b->n,
                 (unsigned long long)b->total);
    cr_expect_eq(xfer_batch_destroy(batch), XFER_OK);
}

/* Start the peer; skip where the transport takes no batch of device memory: no remote key
 * of the peer's (its region in device memory), or none of this side's device memory (a
 * transport without MEM_CUDA or RMA_CUDA gives no key for the peer's device memory, and
 * this side's reaches it only staged, which device_with_malloc covers). */
void tcb_start(dev_test_t *t)
{
    dt_start(t);
    if ((t->rkey == NULL) || !(tg_transport_caps(t->peer.ctx, t->peer.ep) &
                               (XFER_CAP_MEM_CUDA | XFER_CAP_RMA_CUDA))) {
        fprintf(stderr, "cuda_batch: skipped: %s takes no batch of device memory\n",
                xfer_endpoint_transport(t->peer.ep));
        dt_finish(t);
        cr_skip_test("no batches of device memory over this transport");
    }
}

/* Device memory here into the peer's, scattered both ways: 128, 37 and 600 blocks. */
void tcb_put_rounds(dev_test_t *t)
{
    uint64_t lens[MAX_DESCS];
    blocks_t b;

    for (unsigned round = 0; round < 3; round++) {
        tcb_blocks_make(&b, lens, tcb_lens_of(round, lens));
        tcb_local_image(&b, 900 + round, t->host);
        cr_assert_eq(t->gpu.drv->memcpy_htod(t->src, t->host, b.total), 0);
        tcb_put_round(t, &b, t->src_mem, 900 + round);
    }
}

static void put_device(void)
{
    dev_test_t t;

    tcb_start(&t);
    tcb_put_rounds(&t);
    dt_finish(&t);
}

/* The peer's device memory into device memory here. */
static void get_device(void)
{
    uint64_t lens[MAX_DESCS];
    char *img;
    dev_test_t t;
    blocks_t b;

    tcb_start(&t);
    img = malloc(DT_MAXLEN);
    cr_assert_not_null(img);
    for (unsigned round = 0; round < 3; round++) {
        tcb_blocks_make(&b, lens, tcb_lens_of(round, lens));
        tp_send(&t.peer, CMD_FILL);
        tp_send(&t.peer, 950 + round);
        cr_assert_eq(tp_recv(&t.peer), 1);
        tcb_get_round(&t, &b, 950 + round, img);
    }
    free(img);
    dt_finish(&t);
}

/* Host memory here into the peer's device memory. */
static void put_host(void)
{
    uint64_t lens[MAX_DESCS];
    char *src = malloc(DT_MAXLEN);
    xfer_mem_t *mem;
    dev_test_t t;
    blocks_t b;

    cr_assert_not_null(src);
    tcb_start(&t);
    cr_assert_eq(xfer_mem_register(t.peer.ctx, src, DT_MAXLEN, XFER_MEM_HOST, &mem), XFER_OK);
    for (unsigned round = 0; round < 2; round++) {
        tcb_blocks_make(&b, lens, tcb_lens_of(round, lens));
        tcb_local_image(&b, 980 + round, src);
        tcb_put_round(&t, &b, mem, 980 + round);
    }
    cr_expect_eq(xfer_mem_deregister(mem), XFER_OK);
    free(src);
    dt_finish(&t);
}

/* Device memory here into the peer's host memory from xfer_mem_alloc (over shm: mapped
 * here, the driver copies into the mapping), and back by a get batch. */
static void device_with_xfer_alloc(void)
{
    uint64_t lens[MAX_DESCS];
    char *img = malloc(DT_MAXLEN);
    dev_test_t t;
    blocks_t b;

    cr_assert_not_null(img);
    dt_peer_region(DT_REGION_XFER_ALLOC);
    tcb_start(&t);
    for (unsigned round = 0; round < 2; round++) {
        tcb_blocks_make(&b, lens, tcb_lens_of(round, lens));
        tcb_local_image(&b, 960 + round, t.host);
        cr_assert_eq(t.gpu.drv->memcpy_htod(t.src, t.host, b.total), 0);
        tcb_put_round(&t, &b, t.src_mem, 960 + round);
        tcb_get_round(&t, &b, 960 + round, img);    /* what the put left there */
    }
    free(img);
    dt_finish(&t);
}

/* Device memory here and the peer's malloc'd host memory, on every transport: a put batch
 * (the peer checks the data when the notification comes) and a get batch, a put and a get.
 * Where the transport cannot move them itself (over shm neither side can: no CMA into device
 * memory, no mapping of the peer's; verbs without GPUDirect) the framework stages them
 * through host buffers, a batch's notification sent alone after its data. */
static void device_with_malloc(void)
{
    uint64_t lens[MAX_DESCS];
    char *img = malloc(DT_MAXLEN);
    xfer_request_t *req = NULL;
    xfer_status_t s;
    dev_test_t t;
    blocks_t b;

    cr_assert_not_null(img);
    dt_peer_region(DT_REGION_MALLOC);
    dt_start(&t);
    cr_assert_not_null(t.rkey, "no key for the peer's malloc'd memory over %s",
                       xfer_endpoint_transport(t.peer.ep));
    for (unsigned round = 0; round < 3; round++) {
        tcb_blocks_make(&b, lens, tcb_lens_of(round, lens));
        tcb_local_image(&b, 970 + round, t.host);
        cr_assert_eq(t.gpu.drv->memcpy_htod(t.src, t.host, b.total), 0);
        tcb_put_round(&t, &b, t.src_mem, 970 + round);
        tcb_get_round(&t, &b, 970 + round, img);
    }
    dt_fill(&t, t.src, DT_MAXLEN, 975);
    req = NULL;
    s   = xfer_put(t.peer.ep, (void*)(uintptr_t)t.src, 300000, t.src_mem, t.remote + 5, t.rkey,
                   NULL, NULL, &req);
    dt_wait_ok(s, req, "put", 300000);
    cr_assert_eq(tp_flush(t.peer.ep, TP_WAIT_MS), XFER_OK);
    cr_expect_eq(dt_cmd(&t, CMD_CHECK, 5, 300000, 975), 1, "a put of device memory into the "
                 "peer's malloc'd memory");
    req = NULL;
    dt_fill(&t, t.dst, DT_MAXLEN, 7);
    s = xfer_get(t.peer.ep, (void*)(uintptr_t)t.dst, 300000, t.dst_mem, t.remote + 5, t.rkey,
                 NULL, NULL, &req);
    dt_wait_ok(s, req, "get", 300000);
    cr_expect_eq(dt_check(&t, t.dst, 300000, 975), -1, "a get into device memory of the "
                 "peer's malloc'd memory");
    free(img);
    dt_finish(&t);
}

/* The same memory: put batches of 16 blocks of 1 MiB from device memory, one after the other,
 * each complete within its wait (TP_WAIT_MS) with its notification after its data. Over tcp
 * such a batch is larger than its window (XFER_BATCH_WINDOW): the rest is queued as the
 * window opens, which must happen whatever the write round it opens in (a round whose budget
 * ran out just as the send queue emptied once left a batch waiting forever, 1 in ~17). */
static void window_reopens(void)
{
    xfer_batch_desc_t d[16];
    xfer_request_t *req;
    xfer_batch_t *batch = NULL;
    xfer_status_t s;
    dev_test_t t;

    dt_peer_region(DT_REGION_MALLOC);
    dt_start(&t);
    cr_assert_not_null(t.rkey);
    for (unsigned k = 0; k < 16; k++) {
        d[k] = (xfer_batch_desc_t){0, 0, DT_MAXLEN};   /* the same MiB, again and again */
    }
    cr_assert_eq(xfer_batch_create(t.peer.ep, XFER_BATCH_PUT, t.src_mem, t.rkey, d, 16, &batch),
                 XFER_OK);
    for (unsigned rep = 0; rep < 60; rep++) {
        req = NULL;
        s   = xfer_batch_post(batch, NULL, 0, 0, NULL, NULL, &req);
        cr_assert(TP_POSTED(s), "batch %u: %s", rep, xfer_status_string(s));
        s = (s == XFER_OK) ? xfer_request_wait(req, TP_WAIT_MS) : s;
        cr_assert_eq(s, XFER_OK, "batch %u of 16 x 1 MiB from device memory: %s (%zu landed)",
                     rep, xfer_status_string(s), xfer_request_landed(req));
        xfer_request_release(req);
    }
    cr_expect_eq(xfer_batch_destroy(batch), XFER_OK);
    dt_finish(&t);
}

/* The same memory: the context is destroyed while batches move (staged where the transport
 * cannot move them; puts with a notification and gets, 600 blocks each) - what is in flight
 * ends with the endpoints, the staging pool and every hold go, and nothing is touched after
 * it was freed (run under ASan and valgrind: test/verbs_suites.sh with XFERTEST_VALGRIND=1). */
static void destroy_in_flight(void)
{
    uint64_t lens[MAX_DESCS];
    xfer_request_t *req[4] = {NULL, NULL, NULL, NULL};
    xfer_batch_t *put = NULL, *get = NULL;
    dev_test_t t;
    blocks_t b;

    dt_peer_region(DT_REGION_MALLOC);
    dt_start(&t);
    cr_assert_not_null(t.rkey);
    tcb_blocks_make(&b, lens, tcb_lens_of(2, lens));
    cr_assert_eq(xfer_batch_create(t.peer.ep, XFER_BATCH_PUT, t.src_mem, t.rkey, b.d, b.n,
                                   &put), XFER_OK);
    cr_assert_eq(xfer_batch_create(t.peer.ep, XFER_BATCH_GET, t.dst_mem, t.rkey, b.d, b.n,
                                   &get), XFER_OK);
    for (unsigned k = 0; k < 4; k++) {
        xfer_status_t s = xfer_batch_post((k % 2) ? get : put, "gone", 4, 0, NULL, NULL,
                                          &req[k]);

        cr_assert(TP_POSTED(s), "batch %u: %s", k, xfer_status_string(s));
    }
    /* requests, batches, registrations and the key are the context's to free */
    xfer_context_destroy(t.peer.ctx);
    dt_kill(&t);
    cr_expect_eq(t.gpu.drv->mem_free(t.src), 0);
    cr_expect_eq(t.gpu.drv->mem_free(t.dst), 0);
    t.gpu.drv->device_primary_ctx_release(t.gpu.device);
    free(t.host);
}

/* The same memory: a put batch with a notification cancelled as soon as it is posted either
 * wins - the request ends XFER_ERR_CANCELED with at most its blocks landed, and its
 * notification never reaches the peer, whose first one is the next batch's, after that
 * batch's data - or loses: the cancel says XFER_ERR_BUSY, the batch completes XFER_OK and its
 * notification is the first. Never both (docs/contract.md, C16). Staged batches hold their
 * notification until the data is in, so there the cancel wins. */
static void cancel_with_malloc(void)
{
    uint64_t lens[MAX_DESCS];
    xfer_request_t *req = NULL, *next = NULL;
    xfer_batch_t *batch = NULL;
    xfer_status_t s, c, end;
    dev_test_t t;
    blocks_t b;

    dt_peer_region(DT_REGION_MALLOC);
    dt_start(&t);
    cr_assert_not_null(t.rkey);
    tcb_blocks_make(&b, lens, tcb_lens_of(0, lens));
    tcb_local_image(&b, 1002, t.host);
    cr_assert_eq(t.gpu.drv->memcpy_htod(t.src, t.host, b.total), 0);
    cr_assert_eq(xfer_batch_create(t.peer.ep, XFER_BATCH_PUT, t.src_mem, t.rkey, b.d, b.n,
                                   &batch), XFER_OK);
    tp_send(&t.peer, CMD_AWAIT_NOTIFY);
    tp_send(&t.peer, b.total);
    tp_send(&t.peer, 1002);
    cr_assert_eq(tp_recv(&t.peer), 1);
    s = xfer_batch_post(batch, "batch 1001", 10, 0, NULL, NULL, &req);
    cr_assert(TP_POSTED(s), "put batch: %s", xfer_status_string(s));
    c   = (s == XFER_OK) ? xfer_request_cancel(req) : XFER_ERR_BUSY;
    end = xfer_request_wait(req, TP_WAIT_MS);
    cr_assert((c == XFER_OK) || (c == XFER_ERR_BUSY), "cancel: %s", xfer_status_string(c));
    if (c == XFER_OK) {
        cr_expect_eq(end, XFER_ERR_CANCELED, "a cancelled batch ended with %s",
                     xfer_status_string(end));
        cr_expect_leq(xfer_request_landed(req), b.n);
    } else {
        cr_expect_eq(end, XFER_OK, "a batch whose cancel came too late ended with %s",
                     xfer_status_string(end));
    }
    fprintf(stderr, "cuda_batch: over %s, a batch cancelled at its post: %s (%zu landed)\n",
            xfer_endpoint_transport(t.peer.ep), xfer_status_string(end),
            xfer_request_landed(req));
    xfer_request_release(req);
    s = xfer_batch_post(batch, "batch 1002", 10, 0, NULL, NULL, &next);
    cr_assert(TP_POSTED(s), "put batch: %s", xfer_status_string(s));
    cr_assert_eq(xfer_request_wait(next, TP_WAIT_MS), XFER_OK);
    xfer_request_release(next);
    cr_expect_eq(tp_recv(&t.peer), (c == XFER_OK) ? 2 : 3, "the peer's first notification "
                 "(2: the second batch's, after its data; 3: another) after a cancel that "
                 "said %s", xfer_status_string(c));
    cr_expect_eq(xfer_batch_destroy(batch), XFER_OK);
    dt_finish(&t);
}

Test(cuda_batch, device_memory_with_the_peers_xfer_mem_alloc_memory)
{
    device_with_xfer_alloc();
}

Test(cuda_batch, device_memory_with_the_peers_xfer_mem_alloc_memory_stand_in)
{
    tg_use_stand_in_driver();
    device_with_xfer_alloc();
}

Test(cuda_batch, device_memory_with_the_peers_malloced_memory)
{
    device_with_malloc();
}

Test(cuda_batch, device_memory_with_the_peers_malloced_memory_stand_in)
{
    tg_use_stand_in_driver();
    device_with_malloc();
}

Test(cuda_batch, batches_larger_than_their_window_never_wait_for_an_event_stand_in)
{
    tg_use_stand_in_driver();
    window_reopens();
}

Test(cuda_batch, a_context_destroyed_while_batches_of_device_memory_move_frees_everything_stand_in)
{
    tg_use_stand_in_driver();
    destroy_in_flight();
}

Test(cuda_batch, a_cancel_at_post_either_wins_without_a_notification_or_loses)
{
    cancel_with_malloc();
}

Test(cuda_batch, a_cancel_at_post_either_wins_without_a_notification_or_loses_stand_in)
{
    tg_use_stand_in_driver();
    cancel_with_malloc();
}

typedef struct acceptor {
    xfer_listener_t *l;
    xfer_endpoint_t *ep;
    xfer_status_t   status;
} acceptor_t;

static void *accept_one(void *arg)
{
    acceptor_t *a = arg;

    a->status = xfer_accept(a->l, TP_WAIT_MS, &a->ep);
    return NULL;
}

/* Two contexts of one process, connected over the transport under test: a put batch and a
 * get from device memory of one into device memory of the other (over shm the driver opens
 * no IPC handle in the process that exported it: the address itself is used). */
static void same_process(void)
{
    xfer_cu_ptr_t a_mem = 0, b_mem = 0;
    xfer_context_t *ca, *cb;
    xfer_mem_t *ma, *mb;
    xfer_endpoint_t *ep;
    xfer_request_t *req = NULL;
    xfer_batch_t *batch;
    xfer_rkey_t *rkey;
    uint64_t lens[MAX_DESCS];
    char addr[64], *host = malloc(DT_MAXLEN), *img = malloc(DT_MAXLEN);
    acceptor_t acc = {0};
    pthread_t th;
    xfer_status_t s;
    void *blob;
    size_t blen;
    blocks_t b;
    tg_gpu_t g;

    cr_assert((host != NULL) && (img != NULL));
    ca = tp_context(XFER_CONTEXT_FLAG_PROGRESS_THREAD);    /* the target progresses alone */
    cb = tp_context(0);
    tg_gpu_open(&g, "cuda_batch");     /* after a context took XFER_CUDA_LIB */
    cr_assert_eq(xfer_listen(ca, "127.0.0.1:0", &acc.l), XFER_OK);
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", xfer_listener_port(acc.l));
    cr_assert_eq(pthread_create(&th, NULL, accept_one, &acc), 0);
    s = xfer_connect(cb, addr, &ep);
    pthread_join(th, NULL);
    cr_assert_eq(s, XFER_OK, "xfer_connect: %s", xfer_status_string(s));
    cr_assert_eq(acc.status, XFER_OK);
    if (!(tg_transport_caps(cb, ep) & (XFER_CAP_MEM_CUDA | XFER_CAP_RMA_CUDA))) {
        fprintf(stderr, "cuda_batch: skipped: %s takes no batch of device memory\n",
                xfer_endpoint_transport(ep));
        xfer_endpoint_close(ep);
        xfer_endpoint_close(acc.ep);
        xfer_listener_close(acc.l);
        xfer_context_destroy(cb);
        xfer_context_destroy(ca);
        g.drv->device_primary_ctx_release(g.device);
        free(host);
        free(img);
        cr_skip_test("no batches of device memory over this transport");
    }
    cr_assert_eq(g.drv->mem_alloc(&a_mem, DT_MAXLEN), 0);
    cr_assert_eq(g.drv->mem_alloc(&b_mem, DT_MAXLEN), 0);
    cr_assert_eq(xfer_mem_register(ca, (void*)(uintptr_t)a_mem, DT_MAXLEN, XFER_MEM_CUDA, &ma),
                 XFER_OK);
    cr_assert_eq(xfer_mem_register(cb, (void*)(uintptr_t)b_mem, DT_MAXLEN, XFER_MEM_CUDA, &mb),
                 XFER_OK);
    cr_assert_eq(xfer_rkey_pack(ma, &blob, &blen), XFER_OK);
    cr_assert_eq(xfer_rkey_unpack(ep, blob, blen, &rkey), XFER_OK);
    xfer_rkey_blob_free(blob);

    tcb_blocks_make(&b, lens, tcb_lens_of(1, lens));
    tcb_local_image(&b, 1000, host);
    cr_assert_eq(g.drv->memcpy_htod(b_mem, host, b.total), 0);
    cr_assert_eq(xfer_batch_create(ep, XFER_BATCH_PUT, mb, rkey, b.d, b.n, &batch), XFER_OK);
    s = xfer_batch_post(batch, NULL, 0, 0, NULL, NULL, &req);
    cr_assert_eq(tp_op_result(s, req, TP_WAIT_MS), XFER_OK);
    cr_expect_eq(xfer_batch_destroy(batch), XFER_OK);
    cr_assert_eq(g.drv->memcpy_dtoh(img, a_mem, b.total), 0);
    cr_expect_eq(tp_check_pattern(img, b.total, 1000), -1, "a batch between two contexts of "
                 "one process");

    req = NULL;
    s   = xfer_get(ep, (void*)(uintptr_t)b_mem, b.total, mb, (uintptr_t)a_mem, rkey, NULL,
                   NULL, &req);
    cr_assert_eq(tp_op_result(s, req, TP_WAIT_MS), XFER_OK);
    cr_assert_eq(g.drv->memcpy_dtoh(img, b_mem, b.total), 0);
    cr_expect_eq(tp_check_pattern(img, b.total, 1000), -1, "a get between two contexts of one "
                 "process");

    xfer_rkey_destroy(rkey);
    cr_expect_eq(xfer_mem_deregister(ma), XFER_OK);
    cr_expect_eq(xfer_mem_deregister(mb), XFER_OK);
    xfer_endpoint_close(ep);
    xfer_endpoint_close(acc.ep);
    xfer_listener_close(acc.l);
    xfer_context_destroy(cb);
    xfer_context_destroy(ca);
    cr_expect_eq(g.drv->mem_free(a_mem), 0);
    cr_expect_eq(g.drv->mem_free(b_mem), 0);
    g.drv->device_primary_ctx_release(g.device);
    free(host);
    free(img);
}

Test(cuda_batch, device_memory_between_two_contexts_of_one_process) { same_process(); }
Test(cuda_batch, device_memory_between_two_contexts_of_one_process_stand_in)
{
    tg_use_stand_in_driver();
    same_process();
}

/* Offsets in a packed remote key (memory.c): the framework's bounds, big-endian, then parts
 * of name length, name, blob length (2, big-endian) and blob; and in shm's blob (shm.h) the
 * region's length and the CUDA allocation's, little-endian. */
#define KEY_LENGTH_AT       21u
#define SHM_LENGTH_AT       24u
#define SHM_ALLOC_BASE_AT   64u
#define SHM_ALLOC_LEN_AT    72u
#define SHM_BUS_ID_AT       80u

static void add_be64(uint8_t *p, uint64_t v)
{
    uint64_t x = 0;

    for (int i = 0; i < 8; i++) {
        x = (x << 8) | p[i];
    }
    x += v;
    for (int i = 7; i >= 0; i--, x >>= 8) {
        p[i] = (uint8_t)x;
    }
}

static void add_le64(uint8_t *p, uint64_t v)
{
    uint64_t x;

    memcpy(&x, p, 8);
    x += v;
    memcpy(p, &x, 8);
}

/* The peer's key altered: what no shm side writes is refused at unpack; grown by 4 KiB past
 * its allocation in every length it states (so that each layer's own bounds check passes),
 * it is taken, but a put through it, even into the real part, moves nothing - the IPC handle
 * opens less than the key claims. */
static void forged(void)
{
    xfer_request_t *req = NULL;
    xfer_rkey_t *fake = NULL;
    uint8_t *blob, *part = NULL;
    size_t len, at;
    dev_test_t t;
    xfer_status_t s;

    tcb_start(&t);
    if (strcmp(xfer_endpoint_transport(t.peer.ep), "shm") != 0) {
        dt_finish(&t);
        cr_skip_test("the forged fields are those of shm's key");
    }
    tp_send(&t.peer, CMD_FILL);
    tp_send(&t.peer, 990);
    cr_assert_eq(tp_recv(&t.peer), 1);
    tp_send(&t.peer, CMD_KEY);
    cr_assert_eq(tp_recv(&t.peer), 1);
    blob = tp_recv_blob(&t.peer, &len);
    for (at = 29; (part == NULL) && (at + 1 < len);) {
        size_t name_len = blob[at], blen = ((size_t)blob[at + 1 + name_len] << 8) |
                                           blob[at + 2 + name_len];

        if ((name_len == 3) && (memcmp(blob + at + 1, "shm", 3) == 0)) {
            part = blob + at + 3 + name_len;
            cr_assert_geq(blen, SHM_ALLOC_LEN_AT + 8, "shm's key is not one of CUDA memory");
        }
        at += 3 + name_len + blen;
    }
    cr_assert_not_null(part, "no shm part in the peer's key");
    /* keys no shm side writes are refused as they are unpacked */
    for (int i = 0; i < 5; i++) {
        static const char *const what[] = {
            "an unknown kind", "a host key's kind with CUDA fields", "a region below its "
            "allocation", "a region past its allocation's end", "a bus id without its end"};
        uint8_t *bad = malloc(len), *bpart = bad + (part - blob);

        cr_assert_not_null(bad);
        memcpy(bad, blob, len);
        switch (i) {
        case 0: bpart[56] = 2; break;
        case 1: bpart[56] = 0; break;
        case 2: add_le64(bpart + SHM_ALLOC_BASE_AT, 8); break;
        case 3: add_le64(bpart + SHM_ALLOC_LEN_AT, (uint64_t)-1); break;
        default: bpart[SHM_BUS_ID_AT + 15] = 'x'; break;
        }
        cr_expect_eq(xfer_rkey_unpack(t.peer.ep, bad, len, &fake), XFER_ERR_INVALID_PARAM,
                     "a key with %s was taken", what[i]);
        free(bad);
    }
    add_be64(blob + KEY_LENGTH_AT, 4096);
    add_le64(part + SHM_LENGTH_AT, 4096);
    add_le64(part + SHM_ALLOC_LEN_AT, 4096);
    cr_assert_eq(xfer_rkey_unpack(t.peer.ep, blob, len, &fake), XFER_OK);
    free(blob);
    dt_fill(&t, t.src, 8192, 991);
    for (int i = 0; i < 2; i++) {
        uint64_t to = t.remote + (i ? DT_MAXLEN - 4096 : 0);

        req = NULL;
        s   = xfer_put(t.peer.ep, (void*)(uintptr_t)t.src, 8192, t.src_mem, to, fake, NULL,
                       NULL, &req);
        if (TP_POSTED(s)) {
            s = tp_op_result(s, req, TP_WAIT_MS);
        }
        cr_expect_eq(s, XFER_ERR_INVALID_PARAM, "a put through a key that claims more than "
                     "the allocation: %s", xfer_status_string(s));
    }
    cr_expect_eq(dt_cmd(&t, CMD_CHECK, 0, DT_MAXLEN, 990), 1, "the peer's device memory "
                 "changed");
    xfer_rkey_destroy(fake);
    dt_finish(&t);
}

Test(cuda_batch, a_bad_key_is_refused_and_one_claiming_more_than_the_allocation_moves_nothing)
{
    forged();
}

Test(cuda_batch,
     a_bad_key_is_refused_and_one_claiming_more_than_the_allocation_moves_nothing_stand_in)
{
    tg_use_stand_in_driver();
    forged();
}

/* The peer stops progressing: batches of one block with a notification complete while the
 * transport can take their notification without the peer (over shm, into the ring: the data
 * is copied by this side), then one ends at its 200 ms deadline with XFER_ERR_TIMEOUT and at
 * most its block counted as landed (over shm its block, copied in the post). Over tcp the
 * first batch's notification leaves with it, into the socket: from then on the target's word
 * completes it (docs/contract.md, C16) - its deadline passes without ending it, a cancel is
 * too late, and it ends, with an error, when the peer is killed. The peer is killed: the
 * endpoint fails, a batch posted then ends with an error, not a hang. */
#define SILENT_MAX_BATCHES 100000

static void silent_peer(void)
{
    xfer_batch_desc_t d = {0, 0, 4096};
    xfer_request_t *req = NULL, *waiting = NULL;
    xfer_batch_t *batch = NULL;
    xfer_status_t s = XFER_OK;
    double t0, took = 0;
    unsigned i;
    dev_test_t t;

    tcb_start(&t);
    cr_assert_eq(xfer_batch_create(t.peer.ep, XFER_BATCH_PUT, t.src_mem, t.rkey, &d, 1, &batch),
                 XFER_OK);
    tp_send(&t.peer, CMD_STALL);
    cr_assert_eq(tp_recv(&t.peer), 1);
    for (i = 0; (i < SILENT_MAX_BATCHES) && (s == XFER_OK); i++) {
        char note[32];

        snprintf(note, sizeof(note), "batch %u", i);
        req = NULL;
        t0  = tp_now_ms();
        s   = xfer_batch_post(batch, note, strlen(note), 200, NULL, NULL, &req);
        cr_assert(TP_POSTED(s), "batch %u: %s", i, xfer_status_string(s));
        s    = xfer_request_wait(req, 2000);
        took = tp_now_ms() - t0;
        if (xfer_request_test(req) == XFER_INPROGRESS) {
            /* its notification left: the target's answer ends it, not the deadline */
            cr_expect_eq(xfer_request_cancel(req), XFER_ERR_BUSY, "batch %u: a cancel after "
                         "its notification left", i);
            waiting = req;
            break;
        }
        if (s == XFER_OK) {
            cr_assert_eq(xfer_request_landed(req), 1);
            xfer_request_release(req);
        }
    }
    if (waiting == NULL) {
        cr_assert_eq(s, XFER_ERR_TIMEOUT, "batch %u to a peer that stopped progressing ended "
                     "with %s", i - 1, xfer_status_string(s));
        cr_expect_geq(took, 150.0, "the batch ended %.0f ms after its post, before its "
                      "deadline", took);
        cr_expect_lt(took, 1500.0, "the batch ended %.0f ms after its post, its deadline "
                     "200 ms", took);
        cr_expect_leq(xfer_request_landed(req), 1);
        if (strcmp(xfer_endpoint_transport(t.peer.ep), "shm") == 0) {
            /* the block was copied by this side before the post returned: it is known
             * landed */
            cr_expect_eq(xfer_request_landed(req), 1, "over shm the batch's block landed, not "
                         "counted");
        }
        fprintf(stderr, "cuda_batch: over %s, batch %u of a silent peer timed out (%.0f ms, "
                "%zu landed)\n", xfer_endpoint_transport(t.peer.ep), i - 1, took,
                xfer_request_landed(req));
        xfer_request_release(req);
    } else {
        fprintf(stderr, "cuda_batch: over %s, batch %u of a silent peer waits for its answer "
                "past its deadline\n", xfer_endpoint_transport(t.peer.ep), i);
    }

    dt_kill(&t);
    /* the death is noticed by progress: a batch posted from now on ends with an error */
    req = NULL;
    for (t0 = tp_now_ms(); tp_now_ms() - t0 < TP_WAIT_MS; usleep(10 * 1000)) {
        xfer_progress(t.peer.ctx);
        if (xfer_endpoint_status(t.peer.ep) != XFER_OK) {
            break;
        }
    }
    cr_expect_neq(xfer_endpoint_status(t.peer.ep), XFER_OK, "the peer died, its endpoint is "
                  "still up");
    if (waiting != NULL) {
        s = xfer_request_wait(waiting, TP_WAIT_MS);
        cr_expect(s < 0 && s != XFER_ERR_TIMEOUT, "the batch that waited for its answer ended "
                  "with %s", xfer_status_string(s));
        xfer_request_release(waiting);
    }
    s = xfer_batch_post(batch, "late", 4, 200, NULL, NULL, &req);
    if (TP_POSTED(s)) {
        s = xfer_request_wait(req, TP_WAIT_MS);
        xfer_request_release(req);
    }
    cr_expect(s < 0 && s != XFER_ERR_TIMEOUT, "a batch to a dead peer ended with %s",
              xfer_status_string(s));

    cr_expect_eq(xfer_batch_destroy(batch), XFER_OK);
    dt_finish(&t);
}

Test(cuda_batch, a_batch_to_a_peer_that_stops_progressing_ends_at_its_deadline) { silent_peer(); }

Test(cuda_batch, a_batch_to_a_peer_that_stops_progressing_ends_at_its_deadline_stand_in)
{
    tg_use_stand_in_driver();
    silent_peer();
}

Test(cuda_batch, a_put_batch_is_in_the_peers_device_memory_at_its_notification) { put_device(); }
Test(cuda_batch, a_get_batch_lands_in_device_memory_here) { get_device(); }
Test(cuda_batch, a_put_batch_from_host_memory_lands_in_the_peers_device_memory) { put_host(); }

Test(cuda_batch, a_put_batch_is_in_the_peers_device_memory_at_its_notification_stand_in)
{
    tg_use_stand_in_driver();
    put_device();
}

Test(cuda_batch, a_get_batch_lands_in_device_memory_here_stand_in)
{
    tg_use_stand_in_driver();
    get_device();
}

Test(cuda_batch, a_put_batch_from_host_memory_lands_in_the_peers_device_memory_stand_in)
{
    tg_use_stand_in_driver();
    put_host();
}
