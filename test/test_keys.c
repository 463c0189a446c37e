/*
 * Remote keys are capabilities: a region's key carries a random 64-bit key of that region
 * alone (framework/regions.c), which the target checks on every put and get. The peer
 * registers two regions, A and B, next to each other and hands over both keys. A key forged
 * from B's with A's secret - what a peer given A's key could build, knowing B's id - is
 * refused and B keeps every byte; a peer that tries key after key is failed once it missed
 * more than XFER_BAD_KEYS_MAX times. Over verbs the key is the HCA's 32-bit rkey, which the
 * HCA checks on every access: there a forged or guessed key fails the initiator's connection
 * at the first try, and B keeps every byte all the same.
 */
#include "test_peer.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void setup(void)
{
    tp_env();
}

TestSuite(keys, .init = setup, .timeout = 120);

#define LEN  (64u << 10)
#define SEED 0x4b455953u

enum { CMD_CHECK = 1, CMD_DONE };

/* Register A and B, send their addresses and keys; answer CMD_CHECK with whether B still
 * holds its pattern, until CMD_DONE. */
static int srv_two_regions(tp_side_t *s)
{
    char *buf = malloc(2 * LEN);
    xfer_mem_t *mem[2];

    TP_CHECK(buf != NULL, "malloc");
    tp_fill_pattern(buf, 2 * LEN, SEED);
    for (int i = 0; i < 2; i++) {
        void *blob;
        size_t len;

        TP_CHECK_STATUS(xfer_mem_register(s->ctx, buf + i * LEN, LEN, XFER_MEM_HOST, &mem[i]),
                        XFER_OK);
        TP_CHECK_STATUS(xfer_rkey_pack(mem[i], &blob, &len), XFER_OK);
        TP_CHECK(tp_ctl_send(s->ctl, blob, len) == 0, "ctl");
        xfer_rkey_blob_free(blob);
    }
    for (;;) {
        uint64_t cmd;

        if (tp_progress_until_ctl(s, TP_WAIT_MS) != 0) {
            break;
        }
        TP_CHECK(tp_ctl_recv_u64(s->ctl, &cmd, TP_WAIT_MS) == 0, "ctl");
        if (cmd == CMD_DONE) {
            break;
        }
        TP_CHECK(tp_ctl_send_u64(s->ctl, tp_check_pattern(buf, 2 * LEN, SEED) == -1) == 0,
                 "ctl");
    }
    for (int i = 0; i < 2; i++) {
        TP_CHECK_STATUS(xfer_mem_deregister(mem[i]), XFER_OK);
    }
    free(buf);
    return 0;
}

static uint64_t get_le64(const uint8_t *p)
{
    uint64_t v = 0;

    for (int i = 7; i >= 0; i--) {
        v = (v << 8) | p[i];
    }
    return v;
}

/* Where B's secret sits in its blob: the one 8-byte field in which A's and B's blobs differ
 * although it is neither their ids (B's is A's + 1) nor their addresses (B's is A's + LEN).
 * Its first bytes may be alike in both (random keys can share a byte), so the field is not
 * found by its first differing byte but as the 8 bytes that end where the next known field
 * (an id or an address) or the blob begins; a differing byte outside it means a layout this
 * test does not know. -1 when the blobs have no such field. */
static long secret_at(const uint8_t *a, const uint8_t *b, size_t len, uint64_t addr_a)
{
    uint8_t *known = calloc(len + 1, 1);
    size_t first = len, end;
    long found   = -1;

    cr_assert_not_null(known);
    for (size_t i = 0; i + 8 <= len; i++) {
        uint64_t x = get_le64(a + i), y = get_le64(b + i);

        if ((x != y) && ((y == x + 1) || ((x == addr_a) && (y == addr_a + LEN)))) {
            memset(known + i, 1, 8);
        }
    }
    for (size_t i = 0; (i < len) && (first == len); i++) {
        first = (!known[i] && (a[i] != b[i])) ? i : len;
    }
    for (end = first; (end < len) && !known[end]; end++) {
    }
    if ((first < len) && (end >= 8) && (end - 8 <= first)) {
        found = (long)(end - 8);
        for (size_t i = end; i < len; i++) {
            if (!known[i] && (a[i] != b[i])) {
                found = -1;     /* two of them: not a layout this test knows */
            }
        }
        for (size_t i = (size_t)found; (found >= 0) && (i < end); i++) {
            if (known[i]) {
                found = -1;
            }
        }
    }
    free(known);
    return found;
}

typedef struct keys {
    tp_peer_t   peer;
    uint8_t     *blob[2];
    size_t      len[2];
    xfer_rkey_t *rkey[2];
    char        local[64];
    xfer_mem_t  *mem;
} keys_t;

/* Over verbs the key is the HCA's: a wrong one moves the initiator's QP to the error state,
 * failing its endpoint at the first try. */
static int keys_are_the_hcas(void)
{
    return strcmp(tp_transport(), "verbs") == 0;
}

/* Where B's own secret sits in its blob (*width_p bytes): over verbs the HCA's rkey, the 4
 * bytes after the magic "XVRK" of verbs' part of the key (verbs_wire.h: magic, rkey,
 * address, length); else see secret_at. */
static long secret_field(const keys_t *k, size_t *width_p)
{
    if (keys_are_the_hcas()) {
        const uint8_t *m = memmem(k->blob[1], k->len[1], "XVRK", 4);
        long at          = (m != NULL) ? (long)(m - k->blob[1]) + 4 : -1;

        *width_p = 4;
        return ((at >= 0) && ((size_t)at + 4 <= k->len[1]) &&
                (memcmp(k->blob[0] + at, k->blob[1] + at, 4) != 0)) ? at : -1;
    }
    *width_p = 8;
    return secret_at(k->blob[0], k->blob[1], k->len[0], xfer_rkey_address(k->rkey[0]));
}

static void keys_start(keys_t *k)
{
    tp_start(&k->peer, srv_two_regions, NULL);
    for (int i = 0; i < 2; i++) {
        k->blob[i] = tp_recv_blob(&k->peer, &k->len[i]);
        cr_assert_eq(xfer_rkey_unpack(k->peer.ep, k->blob[i], k->len[i], &k->rkey[i]), XFER_OK);
    }
    cr_assert_eq(k->len[0], k->len[1]);
    cr_assert_eq(xfer_rkey_address(k->rkey[1]), xfer_rkey_address(k->rkey[0]) + LEN);
    cr_assert_eq(xfer_mem_register(k->peer.ctx, k->local, sizeof(k->local), XFER_MEM_HOST,
                                   &k->mem), XFER_OK);
    memset(k->local, 0x5a, sizeof(k->local));
}

static void keys_finish(keys_t *k)
{
    tp_send(&k->peer, CMD_DONE);
    for (int i = 0; i < 2; i++) {
        xfer_rkey_destroy(k->rkey[i]);
        free(k->blob[i]);
    }
    cr_expect_eq(xfer_mem_deregister(k->mem), XFER_OK);
    tp_finish(&k->peer);
}

/* A put of the local bytes with key blob (len bytes) at addr: its outcome, flush included. */
static xfer_status_t put_with(keys_t *k, const uint8_t *blob, size_t len, uint64_t addr)
{
    xfer_request_t *req = NULL;
    xfer_rkey_t *rkey;
    xfer_status_t s = xfer_rkey_unpack(k->peer.ep, blob, len, &rkey);

    if (s != XFER_OK) {
        return s;
    }
    s = xfer_put(k->peer.ep, k->local, sizeof(k->local), k->mem, addr, rkey, NULL, NULL, &req);
    s = tp_op_result(s, req, TP_WAIT_MS);
    if (s == XFER_OK) {
        s = tp_flush(k->peer.ep, TP_WAIT_MS);
    }
    xfer_rkey_destroy(rkey);
    return s;
}

static int region_b_intact(keys_t *k)
{
    tp_send(&k->peer, CMD_CHECK);
    return (int)tp_recv(&k->peer);
}

/* B's key with A's secret in it: refused, and B is untouched; the real keys still work. */
Test(keys, a_key_forged_from_another_regions_secret_is_refused)
{
    uint64_t b_addr;
    uint8_t *forged;
    xfer_status_t s;
    size_t width;
    long at;
    keys_t k;

    keys_start(&k);
    b_addr = xfer_rkey_address(k.rkey[1]);
    at     = secret_field(&k, &width);
    cr_assert_geq(at, 0, "no field of a %zu-byte key holds a secret of its region alone "
                  "(the two keys differ only in id and address)", k.len[0]);
    forged = malloc(k.len[1]);
    cr_assert_not_null(forged);
    memcpy(forged, k.blob[1], k.len[1]);
    memcpy(forged + at, k.blob[0] + at, width);
    s = put_with(&k, forged, k.len[1], b_addr);
    cr_expect_neq(s, XFER_OK, "a put with B's key carrying A's secret was carried out");
    cr_expect(region_b_intact(&k), "B was written through a forged key");
    if (keys_are_the_hcas()) {
        cr_expect_neq(xfer_endpoint_status(k.peer.ep), XFER_OK, "the HCA let the initiator's "
                      "connection go on after a wrong rkey");
    } else {
        cr_expect_eq(xfer_endpoint_status(k.peer.ep), XFER_OK, "one refusal fails nothing");
        /* the real key of B works */
        cr_expect_eq(put_with(&k, k.blob[1], k.len[1], b_addr), XFER_OK);
    }
    free(forged);
    keys_finish(&k);
}

/* Guessing: B's key with a new random secret each time. Every guess is refused; after
 * XFER_BAD_KEYS_MAX misses the peer is failed (over verbs after the first), so that scanning
 * ends there. */
Test(keys, a_peer_scanning_for_keys_is_failed_after_a_bounded_number_of_tries)
{
    enum { BAD_KEYS_MAX = 16 };     /* engine.h's XFER_BAD_KEYS_MAX */
    uint64_t b_addr;
    uint8_t *guess;
    int tries = 0;
    size_t width;
    long at;
    keys_t k;

    keys_start(&k);
    b_addr = xfer_rkey_address(k.rkey[1]);
    at     = secret_field(&k, &width);
    cr_assert_geq(at, 0);
    guess = malloc(k.len[1]);
    cr_assert_not_null(guess);
    memcpy(guess, k.blob[1], k.len[1]);
    srand(7);
    while ((xfer_endpoint_status(k.peer.ep) == XFER_OK) && (tries < 4 * BAD_KEYS_MAX)) {
        for (size_t i = 0; i < width; i++) {
            guess[at + i] = (uint8_t)rand();
        }
        cr_expect_neq(put_with(&k, guess, k.len[1], b_addr), XFER_OK, "guess %d fit", tries);
        tries++;
        for (int i = 0; (i < 20) && (xfer_endpoint_status(k.peer.ep) == XFER_OK); i++) {
            (void)xfer_progress(k.peer.ctx);
        }
    }
    cr_expect_neq(xfer_endpoint_status(k.peer.ep), XFER_OK,
                  "the endpoint still works after %d wrong keys", tries);
    cr_expect_leq(tries, BAD_KEYS_MAX + 2, "%d guesses before the endpoint failed", tries);
    cr_expect(region_b_intact(&k), "B was written by a guess");
    free(guess);
    keys_finish(&k);
}
