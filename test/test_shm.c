/*
 * What only the shm component has: it is chosen by default for a peer on this host, a peer
 * killed at any point leaves nothing behind (its segments are memfds, in no mount), a peer
 * killed in the middle of a message fails the endpoint, a peer that says it ended while its
 * message is read fails only its endpoint, and peers' batches are bounded and cut by
 * deregistrations as they should. What a peer writes into our ring itself is in
 * test_shm_frames.c.
 * The shared API suites (tag, rma, tensor, ...) run over shm as over tcp: test/shm_modes.sh.
 */
#include "gpu_fixture.h"
#include "shm_child.h"
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
