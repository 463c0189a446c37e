/*
 * shm's puts and gets to memory the peer allocated with xfer_mem_alloc(): the initiator maps
 * the peer's sealed memfd and copies itself, so they complete while the owner does not
 * progress; XFER_SHM_MAP=n hands them to the owner again. What a peer announces is checked
 * before anything is mapped: a key whose memory was freed never reaches a later allocation
 * that reuses its descriptor number (the inode must match), and a memfd that is not sealed
 * against shrinking - one the owner could cut short under the mapping, faulting us - is never
 * mapped (the owner announces it by a key it rewrote itself: a hostile peer, for real). The
 * copies land whole at the edges of each way of copying (non-temporal, vector loop, memcpy).
 *
 * Rendezvous messages sent from such memory: the receiver copies them from a read-only
 * mapping of the sender's memfd, kept for later messages (at most 8 per peer); a descriptor
 * number that names another file now is read by CMA instead, and after 8 such ranges the
 * peer is not mapped at all; a message that claims bytes beyond the range it names (the
 * sender rewrites its frame in our ring) fails the endpoint. The owner: shm_owner.h.
 */
#include "shm_owner.h"
#include "test_util.h"

#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

TestSuite(shm_map, .init = shm_owner_suite_init, .timeout = 120);

Test(shm_map, puts_and_gets_to_allocated_memory_complete_while_the_owner_sleeps)
{
    init_t in;
    peer_key_t k;

    init_start(&in);
    key_take(&in.p, CMD_ALLOC, &k);
    owner_pause(&in.p);
    tp_fill_pattern(in.buf, LEN, 7);
    cr_assert_eq(rma(&in.p, 1, in.buf, in.mem, &k, 0, LEN, 2000, NULL), XFER_OK,
                 "a put to mapped memory waits for nobody");
    memset(in.buf, 0, LEN);
    cr_assert_eq(rma(&in.p, 0, in.buf + 4096, in.mem, &k, 4096, 8192, 2000, NULL), XFER_OK);
    cr_assert_lt(tp_check_pattern_at(in.buf, 4096, 8192, 7), 0, "the get read the put's data");
    /* the command ends the owner's pause: the data is in its memory */
    cr_assert(owner_holds(&in.p, &k, 0, LEN, 7), "the owner's memory holds the put's data");
    init_finish(&in, &k, 1);
}

Test(shm_map, with_XFER_SHM_MAP_n_the_owner_carries_out_the_put)
{
    xfer_request_t *req = NULL;
    init_t in;
    peer_key_t k;

    setenv("XFER_SHM_MAP", "n", 1);
    init_start(&in);
    key_take(&in.p, CMD_ALLOC, &k);
    owner_pause(&in.p);
    tp_fill_pattern(in.buf, 65536, 8);
    cr_assert_eq(rma(&in.p, 1, in.buf, in.mem, &k, 0, 65536, 300, &req), XFER_ERR_TIMEOUT,
                 "a put completed while its owner did not progress, with mapping off");
    cr_assert(owner_holds(&in.p, &k, 65536, LEN - 65536, FILL));
    cr_assert_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
    xfer_request_release(req);
    cr_assert(owner_holds(&in.p, &k, 0, 65536, 8));
    init_finish(&in, &k, 1);
}

/* Keys of freed memory: one that was mapped before the free writes the freed pages, which
 * belong to nothing of the owner's; one never mapped names a descriptor number that a later
 * allocation took - its inode differs, nothing is mapped, and the owner refuses the put. */
Test(shm_map, a_key_of_freed_memory_never_reaches_a_later_allocation)
{
    peer_key_t k[4];     /* a: mapped, then freed; b: freed unused; c, d: allocated after */
    init_t in;

    init_start(&in);
    key_take(&in.p, CMD_ALLOC, &k[0]);
    key_take(&in.p, CMD_ALLOC, &k[1]);
    tp_fill_pattern(in.buf, LEN, 11);
    cr_assert_eq(rma(&in.p, 1, in.buf, in.mem, &k[0], 0, 4096, TP_WAIT_MS, NULL), XFER_OK);
    owner_free(&in.p, &k[0]);
    owner_free(&in.p, &k[1]);
    key_take(&in.p, CMD_ALLOC, &k[2]);
    key_take(&in.p, CMD_ALLOC, &k[3]);
    cr_assert((k[2].fd == k[1].fd) || (k[3].fd == k[1].fd), "a later allocation took the "
              "freed key's descriptor number %u (%u, %u): the case this test is about",
              k[1].fd, k[2].fd, k[3].fd);
    cr_assert_eq(rma(&in.p, 1, in.buf, in.mem, &k[0], 0, LEN, TP_WAIT_MS, NULL), XFER_OK,
                 "a mapped key writes its own (freed) pages");
    cr_assert_neq(rma(&in.p, 1, in.buf, in.mem, &k[1], 0, LEN, TP_WAIT_MS, NULL), XFER_OK,
                  "a put through the key of freed memory succeeded");
    cr_assert(owner_holds(&in.p, &k[2], 0, LEN, FILL), "a later allocation was written");
    cr_assert(owner_holds(&in.p, &k[3], 0, LEN, FILL), "a later allocation was written");
    init_finish(&in, k, 4);
}

Test(shm_map, a_memfd_that_is_not_sealed_is_never_mapped)
{
    init_t in;
    peer_key_t k;

    init_start(&in);
    key_take(&in.p, CMD_FAKE, &k);
    tp_fill_pattern(in.buf, LEN, 13);
    cr_assert_eq(rma(&in.p, 1, in.buf, in.mem, &k, 0, LEN, TP_WAIT_MS, NULL), XFER_OK,
                 "the put goes through the owner instead");
    tp_send(&in.p, CMD_FAKE_CHECK);
    cr_assert_eq(tp_recv(&in.p), 1, "the unsealed memfd was written");
    cr_assert(owner_holds(&in.p, &k, 0, LEN, 13), "the registered memory holds the put");
    init_finish(&in, &k, 1);
}

/* A key of memory registered by its owner (not allocated by xfer) names no file: the
 * descriptor is the no-file mark, and the inode and offset after it are zeros, not whatever
 * the heap held (they go to the peer). */
Test(shm_map, a_key_of_registered_memory_names_no_file_and_carries_no_stray_bytes)
{
    static const uint8_t zeros[16];
    void *blob;
    uint8_t *part;
    size_t len;
    init_t in;

    init_start(&in);
    cr_assert_eq(xfer_rkey_pack(in.mem, &blob, &len), XFER_OK);
    part = shm_part(blob, len);
    cr_assert_not_null(part, "the key has an shm part");
    cr_assert_eq(key_fd(blob, len), UINT32_MAX, "a descriptor named for malloc'd memory");
    cr_assert_eq(memcmp(part + 40, zeros, sizeof(zeros)), 0, "inode and offset are not zero");
    xfer_rkey_blob_free(blob);
    init_finish(&in, NULL, 0);
}

/* Copies to and from the mapping, case by case: a put from in.buf + src to dst of the owner's
 * allocation and a get back. Every byte lands, at any alignment of either side, and the bytes
 * beside the range stay as they were. With same_offset the source is moved up to 31 bytes
 * so that both sides lie at the same offset within 32 bytes (the mapping is page-aligned). */
typedef struct copy_case {
    size_t src, dst, len;
    int    same_offset;
} copy_case_t;

static void copies_land(const copy_case_t *cases, size_t num, uint64_t seed)
{
    uint8_t *want = malloc(LEN);
    init_t in;
    peer_key_t k;

    cr_assert_not_null(want);
    init_start(&in);
    key_take(&in.p, CMD_ALLOC, &k);
    for (size_t i = 0; i < num; i++) {
        size_t d = cases[i].dst, n = cases[i].len, s = cases[i].src;

        if (cases[i].same_offset) {
            s += (d - (uintptr_t)(in.buf + s)) & 31;
        }
        cr_assert_leq(s + n, LEN);
        /* the owner checks by offset: what lands at d must be pattern(seed) of d */
        tp_fill_pattern_at(want, d, n, seed + i);
        memcpy(in.buf + s, want + d, n);
        cr_assert_eq(rma(&in.p, 1, in.buf + s, in.mem, &k, d, n, TP_WAIT_MS, NULL), XFER_OK);
        cr_assert(owner_holds(&in.p, &k, d, n, seed + i), "case %zu: the put's bytes", i);
        cr_assert(owner_holds(&in.p, &k, d - ((d < 64) ? d : 64), (d < 64) ? d : 64, FILL),
                  "case %zu: bytes before the range changed", i);
        cr_assert(owner_holds(&in.p, &k, d + n, 64, FILL), "case %zu: bytes after it", i);

        memset(in.buf, 0, LEN);
        cr_assert_eq(rma(&in.p, 0, in.buf + s, in.mem, &k, d, n, TP_WAIT_MS, NULL), XFER_OK);
        cr_assert_eq(memcmp(in.buf + s, want + d, n), 0, "case %zu: the get's bytes", i);
        cr_assert_eq(in.buf[s + n], 0, "case %zu: the get wrote past its range", i);
        cr_assert((s == 0) || (in.buf[s - 1] == 0), "case %zu: ... or before it", i);
    }
    init_finish(&in, &k, 1);
    free(want);
}

/* From XFER_SHM_NT_COPY_MIN on, copies use non-temporal stores (shm_copy.c), which align the
 * destination themselves. */
Test(shm_map, non_temporal_copies_move_every_byte_at_any_alignment)
{
    static const copy_case_t cases[] = {
        {1, 7, 65536 + 13, 0},          /* both unaligned, differently */
        {4099, 70033, 8192 + 5, 0},
        {15, 81920, 4096, 0},           /* the destination aligned, the source not */
        {0, 131072, LEN - 131072 - 4096, 0},
    };

    setenv("XFER_SHM_NT_COPY_MIN", "4k", 1);
    copies_land(cases, sizeof(cases) / sizeof(cases[0]), 20);
}

/* Blocks of 256 B to 64 KiB whose sides lie at the same offset within 32 bytes are copied by
 * a vector loop where the CPU has AVX2 (shm_copy.c): an unaligned head, aligned 32-byte
 * stores, a tail that overlaps them. The cases sit at its edges - the smallest block, one
 * byte too short for it, heads and tails of 1 to 31 bytes, the largest block, the first that
 * memcpy takes again - and beside it (sides at different offsets). Without AVX2 memcpy
 * copies them all, and the test checks that. */
Test(shm_map, block_copies_move_every_byte_at_their_edges)
{
    /* 64 bytes or more apart at the owner: each case checks the bytes beside its own */
    static const copy_case_t cases[] = {
        {0, 0, 256, 1},
        {4096, 512, 255, 1},                /* memcpy */
        {8192, 4096, 4096, 1},              /* a page-aligned block */
        {12288 + 1, 12288 + 1, 4096 + 28, 1}, /* a head of 31 bytes, a tail of 29 */
        {20480, 20480 + 31, 300, 1},        /* a head of 1 byte, a tail of 11 */
        {32768, 32768 + 16, 65536 - 1, 1},  /* the largest */
        {131072, 131072, 65536, 1},         /* memcpy again */
        {262144 + 3, 262144, 4096, 0},      /* the sides 3 bytes apart: memcpy */
        {393216, 393216 + 5, 8192 + 7, 0},
    };

    copies_land(cases, sizeof(cases) / sizeof(cases[0]), 40);
}

/* ---- rendezvous messages from allocated memory ------------------------------------------------ */

/* Mappings of a peer's xfer_mem_alloc memfd in this process: read-only ones in *ro. */
static unsigned peer_mem_mappings(unsigned *ro)
{
    FILE *maps = fopen("/proc/self/maps", "r");
    unsigned n = 0;
    char line[512];

    cr_assert_not_null(maps);
    *ro = 0;
    while (fgets(line, sizeof(line), maps) != NULL) {
        char perms[8];

        if ((strstr(line, "memfd:xfer-mem") == NULL) ||
            (sscanf(line, "%*x-%*x %7s", perms) != 1)) {
            continue;
        }
        n++;
        *ro += (strcmp(perms, "r--s") == 0);
    }
    fclose(maps);
    return n;
}

/* Receive the message CMD_SEND sends from allocation k into buf at MSG_OFF, posted before the
 * send (expected) or after it arrived (unexpected); the receive's status. */
static xfer_status_t recv_msg(init_t *in, const peer_key_t *k, int expected)
{
    xfer_request_t *req = NULL;
    xfer_status_t st;

    memset(in->buf, 0, LEN);
    if (!expected) {
        tp_send(&in->p, CMD_SEND);
        tp_send(&in->p, k->index);
        cr_assert_eq(tp_recv(&in->p), 1);
        tp_progress_for(in->p.ctx, 50);     /* the descriptor arrives unexpected */
    }
    st = xfer_tag_recv(in->p.ctx, in->p.ep, MSG_TAG + k->index, UINT64_MAX,
                       in->buf + MSG_OFF, MSG_LEN, in->mem, NULL, NULL, &req);
    cr_assert(TP_POSTED(st), "tag recv: %s", xfer_status_string(st));
    if (expected) {
        tp_send(&in->p, CMD_SEND);
        tp_send(&in->p, k->index);
        cr_assert_eq(tp_recv(&in->p), 1);
    }
    st = xfer_request_wait(req, TP_WAIT_MS);
    xfer_request_release(req);
    return st;
}

/* Messages from 10 allocations, expected and unexpected: all arrive whole; they were read
 * from read-only mappings, of which no more than 8 stay. */
Test(shm_map, messages_from_allocated_memory_are_copied_from_a_read_only_mapping)
{
    peer_key_t k[10];
    unsigned n, ro;
    init_t in;

    init_start(&in);
    for (unsigned i = 0; i < 10; i++) {
        key_take(&in.p, CMD_ALLOC, &k[i]);
        for (int expected = 0; expected < 2; expected++) {
            cr_assert_eq(recv_msg(&in, &k[i], expected), XFER_OK);
            cr_assert_lt(tp_check_pattern_at(in.buf, MSG_OFF, MSG_LEN, FILL), 0,
                         "message %u (%s) arrived whole", i, expected ? "expected" :
                         "unexpected");
            send_done(&in, XFER_OK);
        }
        n = peer_mem_mappings(&ro);
        cr_assert_eq(n, (i < 8) ? i + 1 : 8, "%u of the peer's memfds are mapped after %u "
                     "allocations sent from", n, i + 1);
        cr_assert_eq(ro, n, "%u of %u mappings are read only", ro, n);
    }
    init_finish(&in, k, 10);
}

Test(shm_map, with_XFER_SHM_MAP_n_messages_are_read_by_cma)
{
    unsigned ro;
    init_t in;
    peer_key_t k;

    setenv("XFER_SHM_MAP", "n", 1);
    init_start(&in);
    key_take(&in.p, CMD_ALLOC, &k);
    cr_assert_eq(recv_msg(&in, &k, 1), XFER_OK);
    cr_assert_lt(tp_check_pattern_at(in.buf, MSG_OFF, MSG_LEN, FILL), 0);
    send_done(&in, XFER_OK);
    cr_assert_eq(peer_mem_mappings(&ro), 0, "the peer's memory was mapped");
    init_finish(&in, &k, 1);
}

/* The sender's descriptor number names another file (a memfd it put in its place): the inode
 * the message announces does not match, so nothing is mapped and the data comes by CMA. */
Test(shm_map, a_message_whose_descriptor_names_another_file_is_read_by_cma)
{
    unsigned ro;
    init_t in;
    peer_key_t k;

    init_start(&in);
    key_take(&in.p, CMD_ALLOC, &k);
    tp_send(&in.p, CMD_REPLACE);
    tp_send(&in.p, k.index);
    cr_assert_eq(tp_recv(&in.p), 1);
    cr_assert_eq(recv_msg(&in, &k, 0), XFER_OK);
    cr_assert_lt(tp_check_pattern_at(in.buf, MSG_OFF, MSG_LEN, FILL), 0,
                 "the message came whole, from the sender's memory");
    send_done(&in, XFER_OK);
    cr_assert_eq(peer_mem_mappings(&ro), 0, "another file was mapped");
    init_finish(&in, &k, 1);
}

/* A peer whose ranges keep failing the checks: after 8 of them its memory is not mapped any
 * more, even a range that would map - every message still arrives, by CMA. */
Test(shm_map, after_8_ranges_that_do_not_map_the_peer_is_read_by_cma)
{
    peer_key_t k[9];
    unsigned ro;
    init_t in;

    init_start(&in);
    for (unsigned i = 0; i < 9; i++) {
        key_take(&in.p, CMD_ALLOC, &k[i]);
        if (i < 8) {
            tp_send(&in.p, CMD_REPLACE);
            tp_send(&in.p, k[i].index);
            cr_assert_eq(tp_recv(&in.p), 1);
        }
        cr_assert_eq(recv_msg(&in, &k[i], 1), XFER_OK);
        cr_assert_lt(tp_check_pattern_at(in.buf, MSG_OFF, MSG_LEN, FILL), 0,
                     "message %u arrived whole", i);
        send_done(&in, XFER_OK);
    }
    cr_assert_eq(peer_mem_mappings(&ro), 0, "the peer's memory was mapped after 8 refusals");
    init_finish(&in, k, 9);
}

/* The sender rewrites its frame in our ring before we read it: the message now claims bytes
 * past the range it names. The endpoint fails with a protocol error; nothing is read. */
Test(shm_map, a_message_claiming_bytes_beyond_its_range_fails_the_endpoint)
{
    xfer_request_t *req = NULL;
    xfer_status_t st;
    unsigned ro;
    init_t in;
    peer_key_t k;

    init_start(&in);
    key_take(&in.p, CMD_ALLOC, &k);
    tp_send(&in.p, CMD_SEND);
    tp_send(&in.p, k.index);
    cr_assert_eq(tp_recv(&in.p), 1);
    tp_send(&in.p, CMD_CORRUPT);
    cr_assert_eq(tp_recv(&in.p), 1, "the sender found its frame in our ring");
    memset(in.buf, 0, LEN);
    cr_assert(TP_POSTED(xfer_tag_recv(in.p.ctx, in.p.ep, MSG_TAG + k.index, UINT64_MAX,
                                      in.buf + MSG_OFF, MSG_LEN, in.mem, NULL, NULL, &req)));
    st = xfer_request_wait(req, TP_WAIT_MS);
    xfer_request_release(req);
    cr_assert_eq(st, XFER_ERR_PROTOCOL, "the receive: %s", xfer_status_string(st));
    cr_assert_eq(xfer_endpoint_status(in.p.ep), XFER_ERR_PROTOCOL);
    for (size_t i = 0; i < LEN; i++) {
        cr_assert_eq(in.buf[i], 0, "byte %zu of the receive buffer was written", i);
    }
    cr_assert_eq(peer_mem_mappings(&ro), 0);
    init_finish(&in, &k, 1);
}
