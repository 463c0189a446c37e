/*
 * What only the shm component has: it is chosen by default for a peer on this host, a peer
 * killed at any point leaves nothing behind (its segments are memfds, in no mount), a peer
 * killed in the middle of a message fails the endpoint, and a peer that writes nonsense into
 * our ring fails the endpoint with a protocol error and reads or writes nothing outside it;
 * a batch whose stop word or descriptors lie where the peer maps nothing moves nothing;
 * a put by frames into CUDA memory (which only the initiator moves, by its IPC handle) is
 * refused.
 * The shared API suites (tag, rma, tensor, ...) run over shm as over tcp: test/shm_modes.sh.
 */
#include "gpu_fixture.h"
#include "test_peer.h"
#include "test_util.h"

#include <criterion/criterion.h>

#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define BIG (64u << 20)

static void suite_init(void)
{
    setenv("XFERTEST_TRANSPORT", "shm", 1);
    tp_env();
}

TestSuite(shm, .init = suite_init, .timeout = 120);

/* Entries of /dev/shm whose name contains "xfer". */
static int dev_shm_xfer_entries(void)
{
    DIR *d = opendir("/dev/shm");
    struct dirent *e;
    int n = 0;

    if (d == NULL) {
        return 0;
    }
    while ((e = readdir(d)) != NULL) {
        n += (strstr(e->d_name, "xfer") != NULL);
    }
    closedir(d);
    return n;
}

/* This process's descriptors and mappings of shm segments (memfd "xfer-shm"). */
static int own_segments(void)
{
    char path[300], target[256], line[512];
    struct dirent *e;
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    FILE *maps;

    cr_assert_not_null(d);
    while ((e = readdir(d)) != NULL) {
        ssize_t len;

        snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
        len = readlink(path, target, sizeof(target) - 1);
        if (len > 0) {
            target[len] = '\0';
            n += (strstr(target, "memfd:xfer-shm") != NULL);
        }
    }
    closedir(d);
    maps = fopen("/proc/self/maps", "r");
    cr_assert_not_null(maps);
    while (fgets(line, sizeof(line), maps) != NULL) {
        n += (strstr(line, "memfd:xfer-shm") != NULL);
    }
    fclose(maps);
    return n;
}

static int srv_idle(tp_side_t *s)
{
    uint64_t v;

    (void)tp_progress_until_ctl(s, TP_WAIT_MS);
    (void)tp_ctl_recv_u64(s->ctl, &v, 0);
    return 0;
}

Test(shm, a_peer_on_this_host_gets_shm_by_default)
{
    tp_peer_t p;

    setenv("XFER_TRANSPORTS", "all", 1);   /* no restriction: ranking and reach decide */
    tp_start(&p, srv_idle, NULL);          /* asserts the endpoint is shm */
    cr_assert_gt(own_segments(), 0, "an shm endpoint maps its rings");
    tp_send(&p, 1);
    tp_finish(&p);
    cr_assert_eq(own_segments(), 0, "the rings went with the endpoint and the context");
}

/* A child's: the bases of the two shm rings it maps (its own and its peer's), found in
 * /proc/self/maps. */
static void shm_rings_mapped(uint8_t *bases[2])
{
    char line[512];
    FILE *maps = fopen("/proc/self/maps", "r");
    int n      = 0;

    TP_CHECK(maps != NULL, "maps");
    while (fgets(line, sizeof(line), maps) != NULL) {
        unsigned long lo, hi;

        if ((strstr(line, "memfd:xfer-shm") != NULL) &&
            (sscanf(line, "%lx-%lx", &lo, &hi) == 2) && (n++ < 2)) {
            bases[n - 1] = (uint8_t*)lo;
        }
    }
    fclose(maps);
    TP_CHECK(n == 2, "found %d shm rings in the child, expected 2", n);
}

/* A child's: tell the parent it is ready (1), then wait to be killed. */
static int ready_then_stall(tp_side_t *s)
{
    TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
    pause();
    return 0;
}

/* Send one BIG message (more than the ring holds), then stop progressing: the receiver is in
 * the middle of it when we are killed. */
static int srv_send_and_stall(tp_side_t *s)
{
    static uint8_t buf[BIG];

    tp_fill_pattern(buf, BIG, 5);
    TP_CHECK(TP_POSTED(xfer_tag_send(s->ep, 7, buf, BIG, NULL, NULL, NULL, NULL)), "send");
    return ready_then_stall(s);
}

Test(shm, a_peer_killed_in_the_middle_of_a_message_fails_the_receive)
{
    static uint8_t buf[BIG];
    xfer_request_t *req = NULL;
    xfer_status_t status;
    int before = dev_shm_xfer_entries();
    tp_peer_t p;

    /* without CMA the data is pipelined through the ring, which the stalled sender stops
     * filling after the first ring-full */
    setenv("XFER_SHM_CMA", "off", 1);
    tp_start(&p, srv_send_and_stall, NULL);
    cr_assert_eq(tp_recv(&p), 1);
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 7, UINT64_MAX, buf, BIG, NULL, NULL, NULL,
                                      &req)));
    tp_progress_for(p.ctx, 100);
    cr_assert_eq(xfer_request_test(req), XFER_INPROGRESS, "the message cannot be whole: its "
                 "sender stopped after the first ring-full");
    kill(p.pid, SIGKILL);
    cr_assert_eq(tp_child_wait(&p, 10), 128 + SIGKILL);
    status = xfer_request_wait(req, TP_WAIT_MS);
    cr_assert_eq(status, XFER_ERR_CONNECTION, "a receive cut short by the sender's death: %s",
                 xfer_status_string(status));
    cr_assert_eq(xfer_endpoint_status(p.ep), XFER_ERR_CONNECTION);
    xfer_request_release(req);
    xfer_endpoint_close(p.ep);
    xfer_context_destroy(p.ctx);
    cr_assert_eq(own_segments(), 0, "no segment of the dead peer stays mapped or open");
    cr_assert_eq(dev_shm_xfer_entries(), before, "nothing was left in /dev/shm");
}

Test(shm, a_rendezvous_message_whose_sender_died_is_not_delivered)
{
    static uint8_t buf[BIG];
    xfer_request_t *req = NULL;
    xfer_status_t status;
    double end;
    tp_peer_t p;

    /* with CMA only the descriptor is in our ring: the data died with the sender */
    tp_start(&p, srv_send_and_stall, NULL);
    cr_assert_eq(tp_recv(&p), 1);
    kill(p.pid, SIGKILL);
    cr_assert_eq(tp_child_wait(&p, 10), 128 + SIGKILL);
    end = tp_now_ms() + TP_WAIT_MS;
    while ((xfer_endpoint_status(p.ep) == XFER_OK) && (tp_now_ms() < end)) {
        xfer_progress(p.ctx);
    }
    cr_assert_eq(xfer_endpoint_status(p.ep), XFER_ERR_CONNECTION);
    status = xfer_tag_recv(p.ctx, p.ep, 7, UINT64_MAX, buf, BIG, NULL, NULL, NULL, &req);
    status = tp_op_result(status, req, TP_WAIT_MS);
    cr_assert_eq(status, XFER_ERR_CONNECTION, "a receive of a message whose data is gone: %s",
                 xfer_status_string(status));
    xfer_endpoint_close(p.ep);
    xfer_context_destroy(p.ctx);
    cr_assert_eq(own_segments(), 0);
}

/* A peer that sends a rendezvous message and then, without ending, writes the word that says
 * its endpoint ended (offset 200 of the control block of every shm ring it maps), as a
 * hostile peer may: the read of its message's data ends in an error. */
static int srv_send_then_say_gone(tp_side_t *s)
{
    static uint8_t heap[BIG];
    uint8_t *buf    = heap;
    xfer_mem_t *mem = NULL;
    uint8_t *rings[2];

    if (s->arg != NULL) {   /* from xfer_mem_alloc() memory, which the receiver maps */
        TP_CHECK_STATUS(xfer_mem_alloc(s->ctx, BIG, XFER_MEM_HOST, &mem), XFER_OK);
        buf = xfer_mem_address(mem);
    }
    tp_fill_pattern(buf, BIG, 5);
    TP_CHECK(TP_POSTED(xfer_tag_send(s->ep, 7, buf, BIG, mem, NULL, NULL, NULL)), "send");
    tp_progress_for(s->ctx, 20);
    shm_rings_mapped(rings);
    for (int i = 0; i < 2; i++) {
        __atomic_store_n((uint32_t*)(void*)(rings[i] + 200), 1u, __ATOMIC_SEQ_CST);
    }
    return ready_then_stall(s);
}

/* Such a peer's message is not delivered - the bytes read may be anything - and its endpoint
 * fails, at the next progress, as the peer said; another peer of the process still works. */
Test(shm, a_peer_that_says_it_ended_while_its_message_is_read_fails_only_its_endpoint)
{
    static uint8_t buf[BIG];
    xfer_request_t *req = NULL;
    xfer_status_t status;
    tp_peer_t p;

    for (int alloc = 0; alloc < 2; alloc++) {
        tp_start(&p, srv_send_then_say_gone, alloc ? (void*)"xfer_mem_alloc" : NULL);
        cr_assert_eq(tp_recv(&p), 1);
        status = xfer_tag_recv(p.ctx, p.ep, 7, UINT64_MAX, buf, BIG, NULL, NULL, NULL, &req);
        status = tp_op_result(status, req, TP_WAIT_MS);
        cr_assert_eq(status, XFER_ERR_CONNECTION, "a receive of a message whose sender says it "
                     "ended: %s", xfer_status_string(status));
        for (double end = tp_now_ms() + TP_WAIT_MS;
             (xfer_endpoint_status(p.ep) == XFER_OK) && (tp_now_ms() < end);) {
            xfer_progress(p.ctx);
        }
        cr_assert_eq(xfer_endpoint_status(p.ep), XFER_ERR_CONNECTION, "the endpoint: %s",
                     xfer_status_string(xfer_endpoint_status(p.ep)));
        tp_another_peer_works(p.ctx, (const size_t[]){1, 4096, 1 << 20, 0});
        kill(p.pid, SIGKILL);
        (void)tp_child_wait(&p, 10);
        xfer_endpoint_close(p.ep);
        xfer_context_destroy(p.ctx);
        cr_assert_eq(own_segments(), 0);
    }
}

/* The server child is killed at a random moment of its life - before listening, during the
 * handshake, while mapping our ring, while idle - as often as we can make it happen. */
Test(shm, peers_killed_at_any_point_leave_nothing_behind)
{
    int before = dev_shm_xfer_entries();
    unsigned seed = (unsigned)getpid();

    for (int round = 0; round < 30; round++) {
        xfer_context_t *ctx = tp_context(0);
        xfer_endpoint_t *ep = NULL;
        tp_peer_t p;
        pid_t killer;

        tp_server_spawn(&p, srv_idle, NULL, NULL);
        killer = fork();
        cr_assert_geq(killer, 0);
        if (killer == 0) {
            usleep((useconds_t)(rand_r(&seed) % 3000) + (unsigned)round * 50);
            kill(p.pid, SIGKILL);
            _exit(0);
        }
        if (xfer_connect(ctx, p.address, &ep) == XFER_OK) {
            tp_progress_for(ctx, 5);
            xfer_endpoint_close(ep);
        }
        waitpid(killer, NULL, 0);
        kill(p.pid, SIGKILL);
        (void)tp_child_wait(&p, 10);
        xfer_context_destroy(ctx);
        cr_assert_eq(own_segments(), 0, "round %d: a segment stays open or mapped", round);
        seed = seed * 1103515245u + 12345u;
    }
    cr_assert_eq(dev_shm_xfer_entries(), before, "nothing was left in /dev/shm");
}

/* What a hostile peer writes as the next frame of every shm ring it maps (shm_ring.h's
 * layout: cells from 512; a header is len:u32 type:u16 flags:u16 status:i32 seq:u32
 * id:u64 a b c d e:u64, its payload after the 64 bytes) before it publishes it by its
 * stamp. key_from_ctl: a, b and e are read from the control socket first (a region of
 * ours: its id, address and our iface's cookie); payload: len bytes of 0xee follow.
 * batch: a BATCH frame's b and d name memory of the peer's own (below). */
typedef struct scribble {
    uint32_t len;
    uint16_t type, flags;
    uint64_t id, a, b, c, d, e;
    int      key_from_ctl;
    int      payload;
    int      batch;
} scribble_t;

/* scribble_t.batch: b names one descriptor of the peer's - a put of BATCH_BLOCK bytes of
 * BATCH_BYTE from its memory to the address b held - and d a stop word of 0 (no deadline);
 * or one of the two lies at an address the peer does not map. */
enum { BATCH_GOOD = 1, BATCH_BAD_STOP, BATCH_BAD_DESC };

#define BATCH_BLOCK    4096u
#define BATCH_BYTE     0x5a
#define UNMAPPED_ADDR  8u           /* in the first page, which no process maps */

/* component.h's xfer_batch_iov_t, which the target reads out of the initiator */
typedef struct {
    uint64_t local, remote, length;
} batch_desc_t;

static uint8_t batch_src[BATCH_BLOCK];
static batch_desc_t batch_desc;
static uint64_t batch_stop;

static void batch_words(scribble_t *w)
{
    memset(batch_src, BATCH_BYTE, sizeof(batch_src));
    batch_desc.local  = (uintptr_t)batch_src;
    batch_desc.remote = w->b;
    batch_desc.length = sizeof(batch_src);
    batch_stop        = 0;
    w->b = (w->batch == BATCH_BAD_DESC) ? UNMAPPED_ADDR : (uintptr_t)&batch_desc;
    w->d = (w->batch == BATCH_BAD_STOP) ? UNMAPPED_ADDR : (uintptr_t)&batch_stop;
}

static const scribble_t scribble_garbage = {.len = 0xffffffffu, .type = 2};  /* a 4 GiB TAG */

/* A hostile peer: once connected, it writes its scribble (arg) into every shm ring it maps,
 * as the frame the owner takes next (the ring is new: cell 0, stamp 1), and waits. */
static int srv_scribbler(tp_side_t *s)
{
    scribble_t w = *(const scribble_t*)((s->arg != NULL) ? s->arg : &scribble_garbage);
    uint8_t *rings[2];

    if (w.key_from_ctl) {
        TP_CHECK(tp_ctl_recv_u64(s->ctl, &w.a, TP_WAIT_MS) == 0, "ctl");
        TP_CHECK(tp_ctl_recv_u64(s->ctl, &w.b, TP_WAIT_MS) == 0, "ctl");
        TP_CHECK(tp_ctl_recv_u64(s->ctl, &w.e, TP_WAIT_MS) == 0, "ctl");
    }
    if (w.batch) {
        batch_words(&w);
    }
    shm_rings_mapped(rings);
    for (int i = 0; i < 2; i++) {
        uint8_t *base  = rings[i];
        uint32_t stamp = 1;
        uint64_t tail;

        memcpy(&tail, base + 128, 8);
        TP_CHECK(tail == 0, "a ring in which %llu cells were taken already",
                 (unsigned long long)tail);
        memcpy(base + 512, &w.len, 4);      /* the cell the consumer reads next (tail 0) */
        memcpy(base + 516, &w.type, 2);
        memcpy(base + 518, &w.flags, 2);
        memcpy(base + 528, &w.id, 8);
        memcpy(base + 536, &w.a, 8);
        memcpy(base + 544, &w.b, 8);
        memcpy(base + 552, &w.c, 8);
        memcpy(base + 560, &w.d, 8);
        memcpy(base + 568, &w.e, 8);
        if (w.payload) {
            memset(base + 576, 0xee, w.len);
        }
        __atomic_store_n((uint32_t*)(void*)(base + 524), stamp, __ATOMIC_RELEASE);
    }
    return ready_then_stall(s);
}

/* Send a scribbler with key_from_ctl the words of shm's part of mem's key (memory.c's
 * layout) that a frame names: the region's id, its address (plus off) and the cookie. */
static void send_key_words(tp_peer_t *p, xfer_mem_t *mem, uint64_t off)
{
    uint64_t cookie, id, addr;
    size_t len, at = 29;
    uint8_t *blob;

    cr_assert_eq(xfer_rkey_pack(mem, (void**)&blob, &len), XFER_OK);
    cr_assert((len > at + 30) && (blob[at] == 3) && (memcmp(blob + at + 1, "shm", 3) == 0));
    memcpy(&cookie, blob + at + 6, 8);
    memcpy(&id, blob + at + 14, 8);
    memcpy(&addr, blob + at + 22, 8);
    xfer_rkey_blob_free(blob);
    tp_send(p, id);
    tp_send(p, addr + off);
    tp_send(p, cookie);
}

/* Our endpoint to a peer that scribbled w: a receive on it fails with a protocol error, the
 * endpoint too, and another peer still works. */
static void scribbled(const scribble_t *w, const char *what)
{
    uint8_t buf[64];
    xfer_request_t *req = NULL;
    xfer_status_t status;
    tp_peer_t p;

    tp_start(&p, srv_scribbler, (void*)w);
    cr_assert_eq(tp_recv(&p), 1);
    cr_assert(TP_POSTED(xfer_tag_recv(p.ctx, p.ep, 1, UINT64_MAX, buf, sizeof(buf), NULL,
                                      NULL, NULL, &req)));
    status = xfer_request_wait(req, TP_WAIT_MS);
    cr_assert_eq(status, XFER_ERR_PROTOCOL, "a receive on an endpoint whose ring holds %s: "
                 "%s", what, xfer_status_string(status));
    cr_assert_eq(xfer_endpoint_status(p.ep), XFER_ERR_PROTOCOL);
    xfer_request_release(req);
    /* the process goes on: another peer works */
    tp_another_peer_works(p.ctx, (const size_t[]){1, 4096, 1 << 20, 0});
    kill(p.pid, SIGKILL);
    (void)tp_child_wait(&p, 10);
    xfer_endpoint_close(p.ep);
    xfer_context_destroy(p.ctx);
}

Test(shm, a_peer_scribbling_over_our_ring_fails_the_endpoint_and_nothing_else)
{
    scribbled(&scribble_garbage, "garbage");
}

/* SHARE frames (15) that no initiator writes: a slot past the four, none of the payload its
 * MAPPED flag (16) calls for, and a put of no bytes. */
Test(shm, a_shared_put_frame_out_of_bounds_fails_the_endpoint)
{
    static const scribble_t bad[] = {
        {.type = 15, .id = 4 | (1ull << 32), .c = 1 << 20},
        {.type = 15, .flags = 16, .id = 1ull << 32, .c = 1 << 20},
        {.type = 15, .id = 1ull << 32, .c = 0},
    };

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char what[64];

        snprintf(what, sizeof(what), "bad SHARE frame %zu", i);
        scribbled(&bad[i], what);
    }
}

/* Frames that claim an inline payload (flag 64) no sender writes: longer than the 32 bytes
 * the header holds, of a type whose header needs every word (PUT, 4), a rendezvous message
 * (RNDV, 1). */
Test(shm, an_inline_frame_out_of_bounds_fails_the_endpoint)
{
    static const scribble_t bad[] = {
        {.type = 2, .flags = 64, .len = 33, .id = 1},
        {.type = 4, .flags = 64, .len = 8},
        {.type = 2, .flags = 64 | 1, .len = 0, .id = 1},
    };

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char what[64];

        snprintf(what, sizeof(what), "bad inline frame %zu", i);
        scribbled(&bad[i], what);
    }
}

/* A PUT frame (4) with 64 bytes of data in the ring, naming a region of our CUDA memory
 * (registered with shm for its IPC handle; the stand-in driver's device memory is not
 * CPU-addressable): refused - only the initiator moves CUDA memory, by the handle - so the
 * device memory keeps its bytes, the endpoint stays up, and the data is dropped. */
Test(shm, a_put_frame_into_cuda_memory_is_refused_and_touches_nothing)
{
    static const scribble_t put = {.type = 4, .len = 64, .id = 1, .c = 64, .key_from_ctl = 1,
                                   .payload = 1};
    uint8_t *host = malloc(1 << 20), *back = malloc(1 << 20);
    xfer_cu_ptr_t dptr = 0;
    xfer_mem_t *mem;
    tg_gpu_t gpu;
    tp_peer_t p;

    cr_assert((host != NULL) && (back != NULL));
    tg_use_stand_in_driver();
    tp_start(&p, srv_scribbler, (void*)&put);
    tg_gpu_open(&gpu, "shm");
    cr_assert_eq(gpu.drv->mem_alloc(&dptr, 1 << 20), 0);
    tp_fill_pattern(host, 1 << 20, 77);
    cr_assert_eq(gpu.drv->memcpy_htod(dptr, host, 1 << 20), 0);
    cr_assert_eq(xfer_mem_register(p.ctx, (void*)(uintptr_t)dptr, 1 << 20, XFER_MEM_CUDA, &mem),
                 XFER_OK);
    send_key_words(&p, mem, 0);
    cr_assert_eq(tp_recv(&p), 1);
    tp_progress_for(p.ctx, 300);
    cr_expect_eq(xfer_endpoint_status(p.ep), XFER_OK, "a refused put failed the endpoint");
    cr_assert_eq(gpu.drv->memcpy_dtoh(back, dptr, 1 << 20), 0);
    cr_expect_eq(memcmp(back, host, 1 << 20), 0, "the refused put changed device memory");
    kill(p.pid, SIGKILL);
    (void)tp_child_wait(&p, 10);
    xfer_endpoint_close(p.ep);
    cr_expect_eq(xfer_mem_deregister(mem), XFER_OK);
    cr_expect_eq(gpu.drv->mem_free(dptr), 0);
    xfer_context_destroy(p.ctx);
    gpu.drv->device_primary_ctx_release(gpu.device);
    free(host);
    free(back);
}

/* BATCH frames (12) of a put with a 16-byte notification, which a hostile peer writes
 * itself, naming a descriptor and a stop word in its own memory. A good one moves its block
 * and delivers its notification: the frame is right. One whose stop word, or whose
 * descriptors, lie where the peer maps nothing is refused before a byte moves: no
 * notification, the region untouched, and the endpoint stays up. */
Test(shm, a_batch_whose_stop_word_or_descriptors_are_unmapped_moves_nothing)
{
    static const char *const what[] = {"", "good", "stop word unmapped", "descriptors unmapped"};
    const size_t len = 1 << 16;
    uint8_t *buf     = malloc(len);

    cr_assert_not_null(buf);
    for (int mode = BATCH_GOOD; mode <= BATCH_BAD_DESC; mode++) {
        scribble_t w = {.type = 12, .flags = 4, .len = 16, .id = 1, .c = 1, .key_from_ctl = 1,
                        .payload = 1, .batch = mode};
        uint8_t note[64];
        size_t note_len = 0;
        xfer_status_t st;
        xfer_mem_t *mem;
        tp_peer_t p;

        memset(buf, 0, len);
        tp_start(&p, srv_scribbler, &w);
        cr_assert_eq(xfer_mem_register(p.ctx, buf, len, XFER_MEM_HOST, &mem), XFER_OK);
        send_key_words(&p, mem, BATCH_BLOCK);
        cr_assert_eq(tp_recv(&p), 1);
        tp_progress_for(p.ctx, 300);
        st = xfer_notify_poll(p.ep, note, sizeof(note), &note_len);
        cr_expect_eq(xfer_endpoint_status(p.ep), XFER_OK, "%s: the endpoint failed", what[mode]);
        for (size_t i = 0; i < len; i++) {
            int in_block = (mode == BATCH_GOOD) && (i >= BATCH_BLOCK) && (i < 2 * BATCH_BLOCK);

            cr_assert_eq(buf[i], in_block ? BATCH_BYTE : 0, "%s: byte %zu of the region is %u",
                         what[mode], i, buf[i]);
        }
        if (mode == BATCH_GOOD) {
            cr_expect_eq(st, XFER_OK, "the good batch's notification: %s",
                         xfer_status_string(st));
            cr_expect_eq(note_len, 16);
        } else {
            cr_expect_eq(st, XFER_ERR_NOT_FOUND, "%s: a notification (%s)", what[mode],
                         xfer_status_string(st));
        }
        kill(p.pid, SIGKILL);
        (void)tp_child_wait(&p, 10);
        xfer_endpoint_close(p.ep);
        cr_expect_eq(xfer_mem_deregister(mem), XFER_OK);
        xfer_context_destroy(p.ctx);
    }
    free(buf);
}

/* NOTIFY frames (14) with a 16-byte payload, as a hostile peer writes them. Without a
 * continuation (b 0) it is delivered whole, its bytes those of the frame. Refused, failing
 * the endpoint: one with its reserved word a set (a notification follows its batch's data,
 * never frames of it), and a continued one
 * whose whole length (b) is not longer than its first frame or is past XFER_NOTIFY_MAX_LEN,
 * for which the target would allocate. */
Test(shm, a_notification_frame_is_delivered_whole_or_its_lengths_are_refused)
{
    static const scribble_t good = {.type = 14, .len = 16, .payload = 1};
    static const scribble_t bad[] = {
        {.type = 14, .len = 16, .payload = 1, .a = 1},
        {.type = 14, .len = 16, .payload = 1, .b = 16},
        {.type = 14, .len = 16, .payload = 1, .b = 4096 + 1},
        {.type = 14, .len = 16, .payload = 1, .b = UINT64_MAX},
    };
    uint8_t note[64], expected[16];
    size_t note_len = 0;
    tp_peer_t p;

    tp_start(&p, srv_scribbler, (void*)&good);
    cr_assert_eq(tp_recv(&p), 1);
    tp_progress_for(p.ctx, 300);
    cr_assert_eq(xfer_notify_poll(p.ep, note, sizeof(note), &note_len), XFER_OK);
    memset(expected, 0xee, sizeof(expected));
    cr_assert_eq(note_len, sizeof(expected));
    cr_assert_eq(memcmp(note, expected, sizeof(expected)), 0);
    cr_expect_eq(xfer_endpoint_status(p.ep), XFER_OK);
    kill(p.pid, SIGKILL);
    (void)tp_child_wait(&p, 10);
    xfer_endpoint_close(p.ep);
    xfer_context_destroy(p.ctx);

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char what[64];

        snprintf(what, sizeof(what), "bad NOTIFY frame %zu", i);
        scribbled(&bad[i], what);
    }
}

/* A notification is charged to the process's XFER_NOTIFY_BUDGET from its first frame, not
 * only once queued: NOTE_PEERS peers (each with a context of its own in this process) write
 * the first NOTIFY frame of one of NOTE_MAX bytes and never the rest. The budget (256 KiB)
 * has room for fewer than all of them: the endpoints of the peers past their share fail with
 * XFER_ERR_NO_RESOURCE, the others wait intact. When the peers that were kept die, their
 * endpoints fail - not closed by the application yet - and give their share back: the next
 * such peer is kept. */
#define NOTE_MAX   65536u
#define NOTE_PEERS 4

Test(shm, notifications_part_way_in_are_held_to_the_process_budget)
{
    static const scribble_t first = {.type = 14, .len = 16, .payload = 1, .b = NOTE_MAX};
    tp_peer_t p[NOTE_PEERS + 1];
    xfer_status_t st[NOTE_PEERS];
    unsigned held = 0, refused = 0;

    setenv("XFER_NOTIFY_MAX_LEN", "65536", 1);
    setenv("XFER_NOTIFY_BUDGET", "256k", 1);
    /* every child forked before a ring is mapped here: each finds only its own two */
    for (int i = 0; i <= NOTE_PEERS; i++) {
        tp_server_spawn(&p[i], srv_scribbler, (void*)&first, NULL);
    }
    for (int i = 0; i < NOTE_PEERS; i++) {
        p[i].ctx = tp_context(0);
        p[i].ep  = tp_connect(p[i].ctx, &p[i]);
        cr_assert_eq(tp_recv(&p[i]), 1);
        tp_progress_for(p[i].ctx, 200);
    }
    for (int i = 0; i < NOTE_PEERS; i++) {
        st[i] = xfer_endpoint_status(p[i].ep);
        cr_expect((st[i] == XFER_OK) || (st[i] == XFER_ERR_NO_RESOURCE), "peer %d: %s", i,
                  xfer_status_string(st[i]));
        held    += (st[i] == XFER_OK);
        refused += (st[i] == XFER_ERR_NO_RESOURCE);
    }
    cr_expect_geq(held, 1, "no peer could begin its notification");
    cr_expect_geq(refused, 1, "%u notifications of %u bytes part-way in, all kept within a "
                  "budget of 256 KiB", held, NOTE_MAX);
    cr_expect_leq(held * (uint64_t)NOTE_MAX, 256u << 10);

    for (int i = 0; i < NOTE_PEERS; i++) {
        if (st[i] == XFER_OK) {
            kill(p[i].pid, SIGKILL);
            (void)tp_child_wait(&p[i], 10);
            tp_progress_for(p[i].ctx, 200);
            cr_expect_neq(xfer_endpoint_status(p[i].ep), XFER_OK, "peer %d died", i);
        }
    }
    p[NOTE_PEERS].ctx = tp_context(0);
    p[NOTE_PEERS].ep  = tp_connect(p[NOTE_PEERS].ctx, &p[NOTE_PEERS]);
    cr_assert_eq(tp_recv(&p[NOTE_PEERS]), 1);
    tp_progress_for(p[NOTE_PEERS].ctx, 300);
    cr_expect_eq(xfer_endpoint_status(p[NOTE_PEERS].ep), XFER_OK, "a notification part-way "
                 "in after the others' endpoints failed: %s",
                 xfer_status_string(xfer_endpoint_status(p[NOTE_PEERS].ep)));

    for (int i = 0; i <= NOTE_PEERS; i++) {
        if (p[i].pid > 0) {
            kill(p[i].pid, SIGKILL);
            (void)tp_child_wait(&p[i], 10);
        }
        xfer_endpoint_close(p[i].ep);
        xfer_context_destroy(p[i].ctx);
    }
}

/* A peer's batch of LONG_DESCS descriptors, all the same LONG_BLOCK bytes of a registered
 * buffer here and of the parent's region (its key from the parent), with a notification:
 * posted, waited for, its status sent back. */
#define LONG_PEERS  16
#define LONG_DESCS  65536u          /* XFER_SHM_BATCH_MAX */
#define LONG_BLOCK  64u             /* 4 MiB a batch: 64 slices of XFER_FAIR_SLICE=64k */
#define LONG_GROWTH (8u << 10)      /* KiB */

static int srv_long_batch(tp_side_t *s)
{
    static uint8_t src[LONG_BLOCK];
    xfer_batch_desc_t *d = calloc(LONG_DESCS, sizeof(*d));
    xfer_request_t *req  = NULL;
    xfer_batch_t *b      = NULL;
    xfer_status_t st;
    xfer_rkey_t *rkey;
    xfer_mem_t *mem;
    size_t len;
    void *blob;

    TP_CHECK(d != NULL, "calloc");
    for (unsigned i = 0; i < LONG_DESCS; i++) {
        d[i].length = LONG_BLOCK;
    }
    TP_CHECK(tp_ctl_recv_alloc(s->ctl, &blob, &len, TP_WAIT_MS) == 0, "ctl");
    TP_CHECK_STATUS(xfer_rkey_unpack(s->ep, blob, len, &rkey), XFER_OK);
    free(blob);
    TP_CHECK_STATUS(xfer_mem_register(s->ctx, src, sizeof(src), XFER_MEM_HOST, &mem), XFER_OK);
    TP_CHECK_STATUS(xfer_batch_create(s->ep, XFER_BATCH_PUT, mem, rkey, d, LONG_DESCS, &b),
                    XFER_OK);
    TP_CHECK_STATUS(xfer_batch_post(b, "long", 4, XFER_BATCH_NO_TIMEOUT, NULL, NULL, &req),
                    XFER_OK);
    st = xfer_request_wait(req, TP_WAIT_MS * 3);
    xfer_request_release(req);
    TP_CHECK(tp_ctl_send_u64(s->ctl, (uint64_t)(int64_t)st) == 0, "ctl");
    (void)tp_progress_until_ctl(s, TP_WAIT_MS);
    xfer_batch_destroy(b);
    xfer_rkey_destroy(rkey);
    TP_CHECK_STATUS(xfer_mem_deregister(mem), XFER_OK);
    free(d);
    return 0;
}

/* A target reads a peer's batch descriptors out of the peer a chunk at a time: LONG_PEERS
 * peers whose batches of LONG_DESCS descriptors (the most one may have, 1.5 MiB of them each)
 * are all being moved at once make this process hold far less than their tables - its peak
 * RSS grows by under LONG_GROWTH KiB - and every batch lands whole with its notification. */
Test(shm, peers_batches_of_the_most_descriptors_hold_a_bounded_table_each)
{
    static uint8_t region[LONG_BLOCK];
    tp_peer_t p[LONG_PEERS];
    int reported[LONG_PEERS] = {0};
    xfer_mem_t *mem[LONG_PEERS];
    void *blob[LONG_PEERS];
    size_t len[LONG_PEERS];
    long before, growth;
    int left = LONG_PEERS;
    double until;

    setenv("XFER_FAIR_SLICE", "64k", 1);
    /* every child forked before a ring is mapped here: each finds only its own */
    for (int i = 0; i < LONG_PEERS; i++) {
        tp_server_spawn(&p[i], srv_long_batch, NULL, NULL);
    }
    for (int i = 0; i < LONG_PEERS; i++) {
        p[i].ctx = tp_context(0);
        p[i].ep  = tp_connect(p[i].ctx, &p[i]);
        cr_assert_eq(xfer_mem_register(p[i].ctx, region, sizeof(region), XFER_MEM_HOST,
                                       &mem[i]), XFER_OK);
        cr_assert_eq(xfer_rkey_pack(mem[i], &blob[i], &len[i]), XFER_OK);
        tp_progress_for(p[i].ctx, 20);
    }
    before = tu_peak_rss_kib();
    for (int i = 0; i < LONG_PEERS; i++) {
        tp_send_blob(&p[i], blob[i], len[i]);
    }
    until = tp_now_ms() + 3.0 * TP_WAIT_MS;
    while ((left > 0) && (tp_now_ms() < until)) {
        for (int i = 0; i < LONG_PEERS; i++) {
            xfer_progress(p[i].ctx);
            if (!reported[i] && tp_ctl_ready(p[i].ctl, 0)) {
                int64_t st = (int64_t)tp_recv(&p[i]);

                cr_expect_eq(st, XFER_OK, "peer %d's batch: %s", i,
                             xfer_status_string((xfer_status_t)st));
                reported[i] = 1;
                left--;
            }
        }
    }
    growth = tu_peak_rss_kib() - before;
    cr_assert_eq(left, 0, "%d batches did not end", left);
    cr_log_info("%d peers' batches of %u descriptors: peak RSS grew by %ld KiB", LONG_PEERS,
                LONG_DESCS, growth);
    cr_expect_lt(growth, (long)LONG_GROWTH, "the peers' batches made this process hold %ld KiB "
                 "more", growth);
    /* closed while the children still progress, then let go */
    for (int i = 0; i < LONG_PEERS; i++) {
        char note[8];
        size_t note_len = 0;

        cr_expect_eq(xfer_notify_poll(p[i].ep, note, sizeof(note), &note_len), XFER_OK,
                     "peer %d's notification", i);
        xfer_endpoint_close(p[i].ep);
        xfer_rkey_blob_free(blob[i]);
        cr_expect_eq(xfer_mem_deregister(mem[i]), XFER_OK);
        xfer_context_destroy(p[i].ctx);
    }
    for (int i = 0; i < LONG_PEERS; i++) {
        tp_send(&p[i], 1);
        tp_child_expect_ok(&p[i], 30);
    }
}

/* A peer that, CUT_ROUNDS times, takes a key from the parent and moves CUT_LEN bytes into it
 * - a batch of 16 blocks in even rounds, one put in odd ones - and sends back the status. */
#define CUT_ROUNDS 20               /* more than XFER_BAD_KEYS_MAX */
#define CUT_LEN    (4u << 20)       /* 64 slices of XFER_FAIR_SLICE=64k */
#define CUT_BYTE   0x3c

static int srv_cut_mover(tp_side_t *s)
{
    uint8_t *src = malloc(CUT_LEN);
    xfer_batch_desc_t d[16];
    xfer_mem_t *mem;

    TP_CHECK(src != NULL, "malloc");
    memset(src, CUT_BYTE, CUT_LEN);
    for (unsigned i = 0; i < 16; i++) {
        d[i] = (xfer_batch_desc_t){i * (CUT_LEN / 16), i * (CUT_LEN / 16), CUT_LEN / 16};
    }
    TP_CHECK_STATUS(xfer_mem_register(s->ctx, src, CUT_LEN, XFER_MEM_HOST, &mem), XFER_OK);
    for (int r = 0; r < CUT_ROUNDS; r++) {
        xfer_request_t *req = NULL;
        xfer_batch_t *b     = NULL;
        xfer_rkey_t *rkey;
        xfer_status_t st;
        size_t len;
        void *blob;

        TP_CHECK(tp_ctl_recv_alloc(s->ctl, &blob, &len, TP_WAIT_MS) == 0, "ctl");
        TP_CHECK_STATUS(xfer_rkey_unpack(s->ep, blob, len, &rkey), XFER_OK);
        free(blob);
        if (r % 2 == 0) {
            TP_CHECK_STATUS(xfer_batch_create(s->ep, XFER_BATCH_PUT, mem, rkey, d, 16, &b),
                            XFER_OK);
            st = xfer_batch_post(b, NULL, 0, XFER_BATCH_NO_TIMEOUT, NULL, NULL, &req);
        } else {
            st = xfer_put(s->ep, src, CUT_LEN, mem, xfer_rkey_address(rkey), rkey, NULL, NULL,
                          &req);
        }
        st = tp_op_result(st, req, TP_WAIT_MS);
        if (b != NULL) {
            xfer_batch_destroy(b);
        }
        xfer_rkey_destroy(rkey);
        TP_CHECK(tp_ctl_send_u64(s->ctl, (uint64_t)(int64_t)st) == 0, "ctl");
    }
    TP_CHECK_STATUS(xfer_mem_deregister(mem), XFER_OK);
    (void)tp_progress_until_ctl(s, TP_WAIT_MS);
    free(src);
    return 0;
}

/* A region deregistered while a peer's batch or put moves into it in slices is looked up
 * again, and missed, before the next slice: this side's doing, not a key the peer guessed.
 * CUT_ROUNDS transfers cut that way, more than the misses that make a peer a key scanner,
 * each end XFER_OK or XFER_ERR_NOT_FOUND, and the endpoint stays up. */
Test(shm, transfers_cut_by_deregistrations_do_not_count_as_guessed_keys)
{
    uint8_t *region = malloc(CUT_LEN);
    tp_peer_t p;

    cr_assert_not_null(region);
    setenv("XFER_FAIR_SLICE", "64k", 1);
    tp_start(&p, srv_cut_mover, NULL);
    for (int r = 0; r < CUT_ROUNDS; r++) {
        int landing = 0;
        xfer_mem_t *mem;
        int64_t st;
        size_t len;
        void *blob;

        memset(region, 0, CUT_LEN);
        cr_assert_eq(xfer_mem_register(p.ctx, region, CUT_LEN, XFER_MEM_HOST, &mem), XFER_OK);
        cr_assert_eq(xfer_rkey_pack(mem, &blob, &len), XFER_OK);
        tp_send_blob(&p, blob, len);
        xfer_rkey_blob_free(blob);
        for (double end = tp_now_ms() + TP_WAIT_MS; !landing && (tp_now_ms() < end);) {
            xfer_progress(p.ctx);
            landing = (__atomic_load_n(&region[0], __ATOMIC_RELAXED) == CUT_BYTE);
        }
        cr_assert(landing, "round %d never began to land", r);
        cr_assert_eq(xfer_mem_deregister(mem), XFER_OK);
        while (!tp_ctl_ready(p.ctl, 0)) {
            xfer_progress(p.ctx);
        }
        st = (int64_t)tp_recv(&p);
        cr_expect((st == XFER_OK) || (st == XFER_ERR_NOT_FOUND), "round %d: %s", r,
                  xfer_status_string((xfer_status_t)st));
    }
    cr_expect_eq(xfer_endpoint_status(p.ep), XFER_OK, "the endpoint after %d cut transfers: "
                 "%s", CUT_ROUNDS, xfer_status_string(xfer_endpoint_status(p.ep)));
    xfer_endpoint_close(p.ep);
    xfer_context_destroy(p.ctx);
    tp_send(&p, 1);
    tp_child_expect_ok(&p, 30);
    free(region);
}

/* Clients that close their endpoint as soon as xfer_connect returns: the server completes its
 * side while the client's segment goes (unmapped, then its memfd closed, its connection
 * closed), at any point of that. The accept never answers XFER_ERR_UNAVAILABLE - which says
 * cross-memory attach does not work and to turn it off - for a peer that merely left: it
 * gives an endpoint that fails with a connection error, or one that worked until the close
 * (which the client made in order: XFER_ERR_PEER_CLOSED). */
#define QUICK_CLIENTS 300

Test(shm, a_client_that_leaves_at_once_is_a_connection_error_not_a_cma_one)
{
    xfer_context_t *ctx = tp_context(0);
    /* under valgrind each client takes a second to start: fewer, for what valgrind checks */
    unsigned clients = (tp_slowdown() > 1) ? 20 : QUICK_CLIENTS, gone = 0;
    xfer_listener_t *l;
    char addr[64];

    cr_assert_eq(xfer_listen(ctx, "127.0.0.1:0", &l), XFER_OK);
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", xfer_listener_port(l));
    for (unsigned i = 0; i < clients; i++) {
        xfer_endpoint_t *ep = NULL;
        xfer_status_t st;
        tp_peer_t c;
        double end;

        tp_client_spawn(&c, addr, NULL, NULL, NULL);
        st = xfer_accept(l, TP_WAIT_MS, &ep);
        cr_assert_eq(st, XFER_OK, "client %u: accept: %s", i, xfer_status_string(st));
        /* the close reaches the endpoint as a connection error, or an orderly close */
        end = tp_now_ms() + TP_WAIT_MS;
        while ((xfer_endpoint_status(ep) == XFER_OK) && (tp_now_ms() < end)) {
            xfer_progress(ctx);
        }
        st = xfer_endpoint_status(ep);
        cr_assert((st == XFER_ERR_CONNECTION) || (st == XFER_ERR_PEER_CLOSED), "client %u: the "
                  "endpoint of a client that left: %s", i, xfer_status_string(st));
        xfer_endpoint_close(ep);
        cr_assert_eq(tp_child_wait(&c, 10), 0, "client %u", i);
        gone++;
    }
    cr_log_info("%u clients came and went", gone);
    xfer_listener_close(l);
    xfer_context_destroy(ctx);
}
