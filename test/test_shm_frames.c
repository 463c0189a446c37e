/*
 * shm, what a peer writes into our ring itself: frames no sender writes (a 4 GiB message,
 * shared puts and inline payloads out of bounds, a put frame into CUDA memory, batches whose
 * stop word or descriptors the peer does not map, notifications of lengths that do not add
 * up, tensor answers to no fetch of ours) fail the endpoint with a protocol error, read or write nothing outside what they may,
 * and leave the process's other peers working; notifications part way in count against the
 * process's budget. The suite is test_shm.c's.
 */
#include "gpu_fixture.h"
#include "shm_child.h"
#include "test_peer.h"
#include "test_util.h"

#include <criterion/criterion.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* What a hostile peer writes as the next frame of every shm ring it maps (shm_ring.h's
 * layout: cells from 512; a header is len:u32 type:u16 flags:u16 status:i32 seq:u32
 * id:u64 a b c d e:u64, its payload after the 64 bytes) before it publishes it by its
 * stamp. key_from_ctl: a, b and e are read from the control socket first (a region of
 * ours: its id, address and our iface's cookie); payload: len bytes of 0xee follow.
 * batch: a BATCH frame's b and d name memory of the peer's own (below). */
typedef struct scribble {
    uint32_t len;
    uint16_t type, flags;
    int32_t  status;
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
        memcpy(base + 520, &w.status, 4);
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
    /* the region key: id, cookie, address, length (xfer_region_key_pack; a little-endian host) */
    memcpy(&id, blob + at + 6, 8);
    memcpy(&cookie, blob + at + 14, 8);
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

/* Failed TRESP frames (9, status XFER_ERR_NOT_FOUND) answering no fetch of ours - an id that
 * was never a request, and one of another generation with a reason after it: the shared
 * tensor engine (framework/tensor_frames.c) refuses them as tcp's test_tcp_proto does. */
Test(shm, a_tensor_answer_to_no_fetch_of_ours_fails_the_endpoint)
{
    static const scribble_t bad[] = {
        {.type = 9, .status = XFER_ERR_NOT_FOUND, .id = 1},
        {.type = 9, .status = XFER_ERR_NOT_FOUND, .id = 1ull << 32, .len = 8, .payload = 1},
    };

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char what[64];

        snprintf(what, sizeof(what), "a TRESP to no fetch (%zu)", i);
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
