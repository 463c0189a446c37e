/*
 * One-sided put and get between two processes. The peer registers a 16 MiB region with
 * unregistered slack on both sides, hands over its key, and then only progresses and answers
 * commands on the control channel (fill the buffer with a pattern; check it holds an expected
 * image). Data is verified on the side that did not initiate the transfer; ranges outside
 * either buffer must be refused with XFER_ERR_OUT_OF_RANGE and leave every byte alone.
 */
#include "test_peer.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static void setup(void)
{
    tp_env();
}

TestSuite(rma, .init = setup, .timeout = 120);

#define RLEN   (16u << 20)      /* registered remote region */
#define SLACK  (64u << 10)      /* unregistered bytes on each side */
#define ALEN   (RLEN + 2 * SLACK)
#define SENTINEL ((void*)0x5e47)

enum {
    CMD_DONE = 1,
    CMD_FILL,       /* seed: fill the whole allocation */
    CMD_CHECK,      /* off, len, seed_in, seed_fill: region[off, off+len) = pattern(seed_in),
                     * every other byte of the allocation = pattern(seed_fill) at its place */
    CMD_PAUSE,      /* answer, then wait for the next command without progressing */
    CMD_RESUME,     /* no answer: progress again */
    CMD_DEREG,      /* deregister the region: the initiator's key no longer fits */
};

/* ---- the target ------------------------------------------------------------------------------ */

static uint64_t ctl_u64(tp_side_t *s)
{
    uint64_t v;

    TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
    return v;
}

/* Every target maps its buffer at the same address when it can, so that two targets are
 * told apart only by their keys. */
static char *target_alloc(void)
{
    void *p = mmap((void*)0x5a0000000000ull, ALEN, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);

    return (p == MAP_FAILED) ? NULL : p;
}

static int srv_target(tp_side_t *s)
{
    char *alloc = target_alloc(), *base, *expect = malloc(ALEN);
    int mapped  = (alloc != NULL);

    if (!mapped) {
        alloc = malloc(ALEN);
    }
    base = alloc + SLACK;
    xfer_mem_t *mem;
    void *blob;
    size_t len;

    TP_CHECK(alloc && expect, "malloc");
    tp_fill_pattern(alloc, ALEN, 1);
    TP_CHECK_STATUS(xfer_mem_register(s->ctx, base, RLEN, XFER_MEM_HOST, &mem), XFER_OK);
    TP_CHECK_STATUS(xfer_rkey_pack(mem, &blob, &len), XFER_OK);
    TP_CHECK(tp_ctl_send_u64(s->ctl, (uintptr_t)base) == 0, "ctl");
    TP_CHECK(tp_ctl_send(s->ctl, blob, len) == 0, "ctl");
    xfer_rkey_blob_free(blob);

    for (;;) {
        uint64_t cmd, off, n, seed_in, seed_fill;
        ssize_t bad;

        TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS) == 0, "no command from the parent");
        cmd = ctl_u64(s);
        if (cmd == CMD_DONE) {
            break;
        }
        if (cmd == CMD_FILL) {
            tp_fill_pattern(alloc, ALEN, ctl_u64(s));
            TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
            continue;
        }
        if (cmd == CMD_RESUME) {
            continue;
        }
        if ((cmd == CMD_PAUSE) || (cmd == CMD_DEREG)) {
            if ((cmd == CMD_DEREG) && (mem != NULL)) {
                TP_CHECK_STATUS(xfer_mem_deregister(mem), XFER_OK);
                mem = NULL;
            }
            TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
            if (cmd == CMD_PAUSE) {
                TP_CHECK(tp_ctl_ready(s->ctl, TP_WAIT_MS), "no command after a pause");
            }
            continue;
        }
        TP_CHECK(cmd == CMD_CHECK, "unknown command %llu", (unsigned long long)cmd);
        off       = ctl_u64(s);
        n         = ctl_u64(s);
        seed_in   = ctl_u64(s);
        seed_fill = ctl_u64(s);
        tp_fill_pattern(expect, ALEN, seed_fill);
        tp_fill_pattern(expect + SLACK + off, n, seed_in);
        bad = -1;
        for (size_t i = 0; i < ALEN; i += 4096) {
            size_t chunk = (ALEN - i < 4096) ? ALEN - i : 4096;
            if (memcmp(alloc + i, expect + i, chunk) != 0) {
                for (size_t j = i; (j < i + chunk) && (bad < 0); j++) {
                    bad = (alloc[j] != expect[j]) ? (ssize_t)j : -1;
                }
                break;
            }
        }
        if (bad >= 0) {
            fprintf(stderr, "target: byte %zd of the region (offset %lld from its start) is "
                    "wrong\n", bad, (long long)bad - SLACK);
        }
        TP_CHECK(tp_ctl_send_u64(s->ctl, (bad < 0) ? 1 : (uint64_t)bad + 2) == 0, "ctl");
    }
    if (mem != NULL) {
        TP_CHECK_STATUS(xfer_mem_deregister(mem), XFER_OK);
    }
    if (mapped) {
        munmap(alloc, ALEN);
    } else {
        free(alloc);
    }
    free(expect);
    return 0;
}

/* ---- the initiator --------------------------------------------------------------------------- */

typedef struct rma {
    tp_peer_t   peer;
    uint64_t    base;           /* remote region */
    xfer_rkey_t *rkey;
    char        *local;         /* ALEN bytes; [SLACK, SLACK + RLEN) registered as mem */
    xfer_mem_t  *mem;
} rma_t;

static void rma_start(rma_t *r)
{
    void *blob;
    size_t len;

    tp_start(&r->peer, srv_target, NULL);
    r->base = tp_recv(&r->peer);
    blob    = tp_recv_blob(&r->peer, &len);
    cr_assert_eq(xfer_rkey_unpack(r->peer.ep, blob, len, &r->rkey), XFER_OK);
    free(blob);
    cr_assert_eq(xfer_rkey_address(r->rkey), r->base);
    cr_assert_eq(xfer_rkey_length(r->rkey), RLEN);
    r->local = malloc(ALEN);
    cr_assert_not_null(r->local);
    cr_assert_eq(xfer_mem_register(r->peer.ctx, r->local + SLACK, RLEN, XFER_MEM_HOST, &r->mem),
                 XFER_OK);
}

static void rma_finish(rma_t *r)
{
    tp_send(&r->peer, CMD_DONE);
    xfer_rkey_destroy(r->rkey);
    cr_expect_eq(xfer_mem_deregister(r->mem), XFER_OK);
    free(r->local);
    tp_finish(&r->peer);
}

static void remote_fill(rma_t *r, uint64_t seed)
{
    tp_send(&r->peer, CMD_FILL);
    tp_send(&r->peer, seed);
    cr_assert_eq(tp_recv(&r->peer), 1);
}

/* Assert the target holds pattern seed_in at [off, off+len) and seed_fill everywhere else. */
static void remote_check(rma_t *r, uint64_t off, uint64_t len, uint64_t seed_in,
                         uint64_t seed_fill, const char *what)
{
    uint64_t v;

    tp_send(&r->peer, CMD_CHECK);
    tp_send(&r->peer, off);
    tp_send(&r->peer, len);
    tp_send(&r->peer, seed_in);
    tp_send(&r->peer, seed_fill);
    v = tp_recv(&r->peer);
    cr_assert_eq(v, 1, "%s: the target's byte at offset %lld from its region is wrong", what,
                 (long long)v - 2 - SLACK);
}

/* Local bytes [off, off+len) of r->local hold pattern(seed) of the remote allocation at
 * remote offset roff (what a get from there must have brought). */
static void local_check_remote(rma_t *r, size_t off, size_t len, uint64_t seed, uint64_t roff)
{
    char *expect = malloc(ALEN);
    ssize_t bad = -1;

    tp_fill_pattern(expect, ALEN, seed);
    if (memcmp(r->local + off, expect + SLACK + roff, len) != 0) {
        for (size_t i = 0; (i < len) && (bad < 0); i++) {
            bad = (r->local[off + i] != expect[SLACK + roff + i]) ? (ssize_t)i : -1;
        }
    }
    free(expect);
    cr_assert_eq(bad, -1, "got %zu bytes: byte %zd differs from the target's", len, bad);
}

/* A put, then a flush: the data is in the target's memory when this returns XFER_OK. */
static xfer_status_t put(rma_t *r, size_t loff, size_t len, uint64_t raddr)
{
    xfer_request_t *req = NULL;
    xfer_status_t s = xfer_put(r->peer.ep, r->local + loff, len, r->mem, raddr, r->rkey, NULL,
                               NULL, &req);

    s = tp_op_result(s, req, TP_WAIT_MS);
    return (s == XFER_OK) ? tp_flush(r->peer.ep, TP_WAIT_MS) : s;
}

static xfer_status_t get(rma_t *r, size_t loff, size_t len, uint64_t raddr)
{
    xfer_request_t *req = NULL;
    xfer_status_t s = xfer_get(r->peer.ep, r->local + loff, len, r->mem, raddr, r->rkey, NULL,
                               NULL, &req);
    return tp_op_result(s, req, TP_WAIT_MS);
}

static void put_and_verify(size_t size)
{
    rma_t r;
    xfer_status_t s;

    rma_start(&r);
    remote_fill(&r, 1000 + size);
    tp_fill_pattern(r.local + SLACK, size, size);
    s = put(&r, SLACK, size, r.base);
    cr_assert_eq(s, XFER_OK, "put of %zu bytes: %s", size, xfer_status_string(s));
    remote_check(&r, 0, size, size, 1000 + size, "put");
    rma_finish(&r);
}

static void get_and_verify(size_t size)
{
    rma_t r;
    xfer_status_t s;

    rma_start(&r);
    remote_fill(&r, 2000 + size);
    memset(r.local, 0, ALEN);
    s = get(&r, SLACK, size, r.base);
    cr_assert_eq(s, XFER_OK, "get of %zu bytes: %s", size, xfer_status_string(s));
    local_check_remote(&r, SLACK, size, 2000 + size, 0);
    for (size_t i = SLACK + size; i < ALEN; i += 997) {
        cr_assert_eq(r.local[i], 0, "get wrote past its %zu bytes (at %zu)", size, i - SLACK);
    }
    rma_finish(&r);
}

Test(rma, put_1_byte)    { put_and_verify(1); }
Test(rma, put_4_kib)     { put_and_verify(4096); }
Test(rma, put_1_mib)     { put_and_verify(1 << 20); }
Test(rma, put_16_mib)    { put_and_verify(RLEN); }
Test(rma, get_1_byte)    { get_and_verify(1); }
Test(rma, get_4_kib)     { get_and_verify(4096); }
Test(rma, get_1_mib)     { get_and_verify(1 << 20); }
Test(rma, get_16_mib)    { get_and_verify(RLEN); }

Test(rma, put_and_get_at_offsets)
{
    rma_t r;

    rma_start(&r);
    remote_fill(&r, 7);
    /* put from an offset inside the local registration to an offset inside the region */
    tp_fill_pattern(r.local + SLACK + 777, 100000, 8);
    cr_assert_eq(put(&r, SLACK + 777, 100000, r.base + 12345), XFER_OK);
    remote_check(&r, 12345, 100000, 8, 7, "put at offset 12345");
    /* the last byte of the region */
    tp_fill_pattern(r.local + SLACK + 5, 1, 9);
    remote_fill(&r, 7);
    cr_assert_eq(put(&r, SLACK + 5, 1, r.base + RLEN - 1), XFER_OK);
    remote_check(&r, RLEN - 1, 1, 9, 7, "put of the region's last byte");

    /* get into an offset, from an offset; the local bytes around stay as they were */
    remote_fill(&r, 10);
    tp_fill_pattern(r.local, ALEN, 11);
    cr_assert_eq(get(&r, SLACK + 333, 99999, r.base + 54321), XFER_OK);
    local_check_remote(&r, SLACK + 333, 99999, 10, 54321);
    {
        char *expect = malloc(ALEN);
        tp_fill_pattern(expect, ALEN, 11);
        cr_expect_eq(memcmp(r.local, expect, SLACK + 333), 0, "get wrote before its buffer");
        cr_expect_eq(memcmp(r.local + SLACK + 333 + 99999, expect + SLACK + 333 + 99999,
                            ALEN - (SLACK + 333 + 99999)), 0, "get wrote after its buffer");
        free(expect);
    }
    cr_assert_eq(get(&r, SLACK, 1, r.base + RLEN - 1), XFER_OK);
    local_check_remote(&r, SLACK, 1, 10, RLEN - 1);
    rma_finish(&r);
}

Test(rma, ranges_outside_the_remote_region_are_refused)
{
    rma_t r;
    char *before = malloc(ALEN);
    struct {
        int64_t  off;       /* from the region's base */
        uint64_t len;
    } bad[] = {
        {RLEN - 10, 20}, {-1, 2}, {-1, 1}, {RLEN, 1}, {-4096, 1}, {0, RLEN + 1},
        {RLEN + 100000, 16}, {RLEN - 1, 2},
    };

    rma_start(&r);
    remote_fill(&r, 21);
    tp_fill_pattern(r.local, ALEN, 22);
    memcpy(before, r.local, ALEN);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint64_t addr = r.base + (uint64_t)bad[i].off;
        size_t len    = (bad[i].len > RLEN) ? RLEN : bad[i].len;
        xfer_status_t s;

        if (bad[i].len > RLEN) {
            /* the local side is fine (whole registration); only the remote is too short:
             * a range of RLEN + 1 bytes starting 1 byte early */
            addr = r.base - 1;
        }
        s = put(&r, SLACK, len, addr);
        cr_expect_eq(s, XFER_ERR_OUT_OF_RANGE, "put to region%+lld, %zu bytes: %s",
                     (long long)(addr - r.base), len, xfer_status_string(s));
        s = get(&r, SLACK, len, addr);
        cr_expect_eq(s, XFER_ERR_OUT_OF_RANGE, "get from region%+lld, %zu bytes: %s",
                     (long long)(addr - r.base), len, xfer_status_string(s));
    }
    /* an address range that wraps around */
    cr_expect_eq(put(&r, SLACK, 16, UINT64_MAX - 7), XFER_ERR_OUT_OF_RANGE);
    cr_expect_eq(get(&r, SLACK, 16, UINT64_MAX - 7), XFER_ERR_OUT_OF_RANGE);
    cr_expect_eq(memcmp(r.local, before, ALEN), 0, "a refused get wrote into the local buffer");
    remote_check(&r, 0, 0, 0, 21, "after refused puts");
    cr_expect_eq(xfer_endpoint_status(r.peer.ep), XFER_OK, "refusals do not break the endpoint");
    /* and the endpoint still works */
    tp_fill_pattern(r.local + SLACK, 4096, 23);
    cr_assert_eq(put(&r, SLACK, 4096, r.base), XFER_OK);
    remote_check(&r, 0, 4096, 23, 21, "a put after the refusals");
    free(before);
    rma_finish(&r);
}

static int cb_calls;

static void count_cb(xfer_request_t *req, xfer_status_t status, void *arg)
{
    cb_calls++;
}

Test(rma, local_buffer_outside_its_registration_is_refused)
{
    rma_t r;
    xfer_request_t *req = SENTINEL;
    char *lo, *hi;
    struct {
        const char *what;
        char       *buf;
        size_t     len;
        xfer_mem_t **mem;
        int        null_rkey, null_ep;
        xfer_status_t want;
    } cases[6];
    xfer_mem_t *null_mem = NULL;

    rma_start(&r);
    remote_fill(&r, 31);
    lo = r.local + SLACK;
    hi = r.local + SLACK + RLEN;
    cases[0] = (typeof(cases[0])){"ends past mem", hi - 10, 20, &r.mem, 0, 0,
                                  XFER_ERR_OUT_OF_RANGE};
    cases[1] = (typeof(cases[0])){"starts before mem", lo - 1, 2, &r.mem, 0, 0,
                                  XFER_ERR_OUT_OF_RANGE};
    cases[2] = (typeof(cases[0])){"wholly after mem", hi, 1, &r.mem, 0, 0,
                                  XFER_ERR_OUT_OF_RANGE};
    cases[3] = (typeof(cases[0])){"mem NULL", lo, 16, &null_mem, 0, 0, XFER_ERR_INVALID_PARAM};
    cases[4] = (typeof(cases[0])){"rkey NULL", lo, 16, &r.mem, 1, 0, XFER_ERR_INVALID_PARAM};
    cases[5] = (typeof(cases[0])){"ep NULL", lo, 16, &r.mem, 0, 1, XFER_ERR_INVALID_PARAM};
    cb_calls = 0;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        xfer_endpoint_t *ep = cases[i].null_ep ? NULL : r.peer.ep;
        xfer_rkey_t *rkey   = cases[i].null_rkey ? NULL : r.rkey;
        xfer_status_t s;

        xfer_last_error_clear();
        s = xfer_put(ep, cases[i].buf, cases[i].len, *cases[i].mem, r.base, rkey, count_cb,
                     NULL, &req);
        cr_expect_eq(s, cases[i].want, "put, local buffer %s: %s", cases[i].what,
                     xfer_status_string(s));
        cr_assert_eq(req, SENTINEL, "put %s: a failed call creates no request", cases[i].what);
        cr_expect_neq(xfer_last_error()[0], '\0', "put %s: no reason given", cases[i].what);
        xfer_last_error_clear();
        s = xfer_get(ep, cases[i].buf, cases[i].len, *cases[i].mem, r.base, rkey, count_cb,
                     NULL, &req);
        cr_expect_eq(s, cases[i].want, "get, local buffer %s: %s", cases[i].what,
                     xfer_status_string(s));
        cr_assert_eq(req, SENTINEL, "get %s: a failed call creates no request", cases[i].what);
        cr_expect_neq(xfer_last_error()[0], '\0', "get %s: no reason given", cases[i].what);
        if (*cases[i].mem == NULL) {
            cr_expect(strstr(xfer_last_error(), "xfer_get needs a registered local buffer") !=
                      NULL, "the reason is '%s'", xfer_last_error());
        }
    }
    for (int i = 0; i < 50; i++) {
        xfer_progress(r.peer.ctx);
    }
    cr_expect_eq(cb_calls, 0, "a failed call never calls its callback");
    remote_check(&r, 0, 0, 0, 31, "after refused puts");
    rma_finish(&r);
}

typedef struct slot {
    int           calls;
    xfer_status_t status;
    xfer_request_t *req;
} slot_t;

static void slot_cb(xfer_request_t *req, xfer_status_t status, void *arg)
{
    slot_t *s = arg;

    s->calls++;
    s->status = status;
    s->req    = req;
}

#define NOPS  1024
#define OPLEN (RLEN / NOPS)

Test(rma, many_puts_and_gets_in_flight)
{
    static slot_t slots[NOPS];
    xfer_request_t *reqs[NOPS];
    rma_t r;

    rma_start(&r);
    remote_fill(&r, 41);
    tp_fill_pattern(r.local + SLACK, RLEN, 42);
    memset(slots, 0, sizeof(slots));
    /* the puts go in reverse order of offset, all posted before any is waited for */
    for (int i = 0; i < NOPS; i++) {
        size_t off      = (size_t)(NOPS - 1 - i) * OPLEN;
        xfer_status_t s = xfer_put(r.peer.ep, r.local + SLACK + off, OPLEN, r.mem, r.base + off,
                                   r.rkey, slot_cb, &slots[i], &reqs[i]);
        cr_assert(TP_POSTED(s), "put %d: %s", i, xfer_status_string(s));
    }
    for (int i = 0; i < NOPS; i++) {
        cr_assert_eq(xfer_request_wait(reqs[i], TP_WAIT_MS), XFER_OK, "put %d", i);
    }
    for (int i = 0; i < NOPS; i++) {
        cr_assert_eq(slots[i].calls, 1, "put %d: callback called %d times", i, slots[i].calls);
        cr_assert_eq(slots[i].status, XFER_OK);
        cr_assert_eq(slots[i].req, reqs[i], "the callback gets the request");
        cr_assert_eq(xfer_request_length(reqs[i]), OPLEN);
        xfer_request_release(reqs[i]);
    }
    cr_assert_eq(tp_flush(r.peer.ep, TP_WAIT_MS), XFER_OK);
    remote_check(&r, 0, RLEN, 42, 41, "1024 puts in flight");

    remote_fill(&r, 43);
    memset(r.local, 0, ALEN);
    memset(slots, 0, sizeof(slots));
    for (int i = 0; i < NOPS; i++) {
        size_t off      = (size_t)i * OPLEN;
        xfer_status_t s = xfer_get(r.peer.ep, r.local + SLACK + off, OPLEN, r.mem, r.base + off,
                                   r.rkey, slot_cb, &slots[i], &reqs[i]);
        cr_assert(TP_POSTED(s), "get %d: %s", i, xfer_status_string(s));
    }
    for (int i = NOPS - 1; i >= 0; i--) {
        cr_assert_eq(xfer_request_wait(reqs[i], TP_WAIT_MS), XFER_OK, "get %d", i);
    }
    for (int i = 0; i < NOPS; i++) {
        cr_assert_eq(slots[i].calls, 1, "get %d: callback called %d times", i, slots[i].calls);
        xfer_request_release(reqs[i]);
    }
    local_check_remote(&r, SLACK, RLEN, 43, 0);
    rma_finish(&r);
}

Test(rma, self_releasing_puts_call_back_once)
{
    static slot_t slots[256];
    rma_t r;
    double end;
    int done = 0;

    rma_start(&r);
    remote_fill(&r, 51);
    tp_fill_pattern(r.local + SLACK, 256 * 4096, 52);
    memset(slots, 0, sizeof(slots));
    for (int i = 0; i < 256; i++) {
        xfer_status_t s = xfer_put(r.peer.ep, r.local + SLACK + i * 4096, 4096, r.mem,
                                   r.base + i * 4096, r.rkey, slot_cb, &slots[i], NULL);
        cr_assert(TP_POSTED(s), "put %d: %s", i, xfer_status_string(s));
    }
    end = tp_now_ms() + TP_WAIT_MS;
    while ((done < 256) && (tp_now_ms() < end)) {
        xfer_progress(r.peer.ctx);
        done = 0;
        for (int i = 0; i < 256; i++) {
            done += (slots[i].calls > 0);
        }
    }
    tp_progress_for(r.peer.ctx, 50);
    for (int i = 0; i < 256; i++) {
        cr_assert_eq(slots[i].calls, 1, "put %d: callback called %d times", i, slots[i].calls);
        cr_assert_eq(slots[i].status, XFER_OK, "put %d: %s", i,
                     xfer_status_string(slots[i].status));
    }
    cr_assert_eq(tp_flush(r.peer.ep, TP_WAIT_MS), XFER_OK);
    remote_check(&r, 0, 256 * 4096, 52, 51, "self-releasing puts");
    rma_finish(&r);
}

/* Two targets forked alike: their regions most likely sit at the same address, so only the
 * key's owner tells them apart. A key unpacked on A's endpoint must not reach B. */
Test(rma, a_key_unpacked_on_one_endpoint_is_refused_on_another)
{
    rma_t a;
    tp_peer_t b;
    xfer_endpoint_t *ep_b;
    uint64_t base_b;
    void *blob;
    size_t len;
    xfer_status_t s;
    xfer_request_t *req = NULL;

    rma_start(&a);
    tp_server_spawn(&b, srv_target, NULL, NULL);
    ep_b   = tp_connect(a.peer.ctx, &b);
    base_b = tp_recv(&b);
    blob   = tp_recv_blob(&b, &len);
    free(blob);
    if (base_b != a.base) {
        cr_log_warn("the two regions differ (%#llx, %#llx): the test is weaker",
                    (unsigned long long)a.base, (unsigned long long)base_b);
    }
    tp_send(&b, CMD_FILL);
    tp_send(&b, 61);
    cr_assert_eq(tp_recv(&b), 1);
    tp_fill_pattern(a.local + SLACK, 4096, 62);
    s = xfer_put(ep_b, a.local + SLACK, 4096, a.mem, a.base, a.rkey, NULL, NULL, &req);
    s = tp_op_result(s, req, TP_WAIT_MS);
    cr_expect(!TP_POSTED(s) && (s != XFER_ERR_TIMEOUT),
              "a put on B's endpoint with A's key: %s", xfer_status_string(s));
    req = NULL;
    s = xfer_get(ep_b, a.local + SLACK, 4096, a.mem, a.base, a.rkey, NULL, NULL, &req);
    s = tp_op_result(s, req, TP_WAIT_MS);
    cr_expect(!TP_POSTED(s) && (s != XFER_ERR_TIMEOUT),
              "a get on B's endpoint with A's key: %s", xfer_status_string(s));
    /* B is untouched (check the whole of it as pattern 61) */
    tp_send(&b, CMD_CHECK);
    tp_send(&b, 0);
    tp_send(&b, 0);
    tp_send(&b, 0);
    tp_send(&b, 61);
    cr_expect_eq(tp_recv(&b), 1, "A's key wrote into B's memory");
    tp_send(&b, CMD_DONE);
    xfer_endpoint_close(ep_b);
    tp_child_expect_ok(&b, 30);
    rma_finish(&a);
}

/* ---- when a put completes (tcp) ------------------------------------------------------------- */

static void require_tcp(void)
{
    if (strcmp(tp_transport(), "tcp") != 0) {
        cr_skip_test("a put's completion is the transport's: over %s it completes when the "
                     "data is in the target's memory, which test_verbs checks",
                     tp_transport());
    }
}

/* Start with XFER_TCP_PUT_ACK=ack in this process, whatever the environment says. */
static void rma_start_put_ack(rma_t *r, const char *ack)
{
    const char *was = getenv("XFER_TCP_PUT_ACK");
    char *saved     = was ? strdup(was) : NULL;

    setenv("XFER_TCP_PUT_ACK", ack, 1);
    rma_start(r);
    if (saved != NULL) {
        setenv("XFER_TCP_PUT_ACK", saved, 1);
        free(saved);
    } else {
        unsetenv("XFER_TCP_PUT_ACK");
    }
}

static void target_pause(rma_t *r)
{
    tp_send(&r->peer, CMD_PAUSE);
    cr_assert_eq(tp_recv(&r->peer), 1);
}

/* tcp's put completes once written, without a round trip: the target does not progress
 * while the puts complete; a flush waits for it, and then the data is there. */
Test(rma, tcp_puts_complete_without_the_target_and_a_flush_waits_for_it)
{
    xfer_request_t *small = NULL, *large = NULL, *flush = NULL;
    rma_t r;

    require_tcp();
    rma_start_put_ack(&r, "n");
    remote_fill(&r, 71);
    tp_fill_pattern(r.local + SLACK, (1 << 20) + 4096, 72);
    target_pause(&r);
    cr_assert(TP_POSTED(xfer_put(r.peer.ep, r.local + SLACK, 4096, r.mem, r.base, r.rkey,
                                 NULL, NULL, &small)));
    cr_assert(TP_POSTED(xfer_put(r.peer.ep, r.local + SLACK + 4096, 1 << 20, r.mem,
                                 r.base + 4096, r.rkey, NULL, NULL, &large)));
    cr_assert_eq(xfer_request_wait(small, TP_WAIT_MS), XFER_OK, "a 4 KiB put waits for the "
                 "target");
    cr_assert_eq(xfer_request_wait(large, TP_WAIT_MS), XFER_OK, "a 1 MiB put waits for the "
                 "target (it fits the sockets' buffers)");
    cr_assert(TP_POSTED(xfer_endpoint_flush(r.peer.ep, NULL, NULL, &flush)));
    tp_progress_for(r.peer.ctx, 300);
    cr_assert_eq(xfer_request_test(flush), XFER_INPROGRESS, "a flush completed while the "
                 "target did not progress: it cannot know the data is in its memory");
    tp_send(&r.peer, CMD_RESUME);
    cr_assert_eq(xfer_request_wait(flush, TP_WAIT_MS), XFER_OK);
    xfer_request_release(small);
    xfer_request_release(large);
    xfer_request_release(flush);
    remote_check(&r, 0, (1 << 20) + 4096, 72, 71, "puts then a flush");
    rma_finish(&r);
}

/* A put the target refuses after it completed here: the next flush reports it, once; the
 * endpoint goes on. */
Test(rma, tcp_a_refused_put_fails_the_next_flush)
{
    xfer_request_t *req = NULL;
    xfer_status_t s;
    rma_t r;

    require_tcp();
    rma_start_put_ack(&r, "n");
    tp_send(&r.peer, CMD_DEREG);
    cr_assert_eq(tp_recv(&r.peer), 1);
    tp_fill_pattern(r.local + SLACK, 65536, 81);
    s = xfer_put(r.peer.ep, r.local + SLACK, 65536, r.mem, r.base, r.rkey, NULL, NULL, &req);
    cr_assert_eq(tp_op_result(s, req, TP_WAIT_MS), XFER_OK, "the put completes here");
    s = tp_flush(r.peer.ep, TP_WAIT_MS);
    cr_expect_eq(s, XFER_ERR_NOT_FOUND, "the flush after a refused put: %s",
                 xfer_status_string(s));
    cr_expect_eq(tp_flush(r.peer.ep, TP_WAIT_MS), XFER_OK, "the refusal is reported once");
    cr_expect_eq(xfer_endpoint_status(r.peer.ep), XFER_OK, "a refused put does not break "
                 "the endpoint");
    rma_finish(&r);
}

/* XFER_TCP_PUT_ACK=y: every put waits for the target, and a refusal fails the put itself. */
Test(rma, tcp_put_ack_makes_a_put_wait_for_the_target)
{
    xfer_request_t *req = NULL;
    xfer_status_t s;
    rma_t r;

    require_tcp();
    rma_start_put_ack(&r, "y");
    remote_fill(&r, 91);
    tp_fill_pattern(r.local + SLACK, 4096, 92);
    target_pause(&r);
    cr_assert(TP_POSTED(xfer_put(r.peer.ep, r.local + SLACK, 4096, r.mem, r.base, r.rkey,
                                 NULL, NULL, &req)));
    tp_progress_for(r.peer.ctx, 300);
    cr_assert_eq(xfer_request_test(req), XFER_INPROGRESS, "an acknowledged put completed "
                 "while the target did not progress");
    tp_send(&r.peer, CMD_RESUME);
    cr_assert_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
    xfer_request_release(req);
    remote_check(&r, 0, 4096, 92, 91, "an acknowledged put, without a flush");
    tp_send(&r.peer, CMD_DEREG);
    cr_assert_eq(tp_recv(&r.peer), 1);
    req = NULL;
    s = xfer_put(r.peer.ep, r.local + SLACK, 4096, r.mem, r.base, r.rkey, NULL, NULL, &req);
    cr_expect_eq(tp_op_result(s, req, TP_WAIT_MS), XFER_ERR_NOT_FOUND);
    cr_expect_eq(tp_flush(r.peer.ep, TP_WAIT_MS), XFER_OK);
    rma_finish(&r);
}

/* tcp's counters count frames by kind, each once: a put and a flush are one PUT frame and no
 * batch's; a get is one GET request and no put. */
Test(rma, tcp_counters_count_each_frame_by_its_kind)
{
    xfer_batch_desc_t d[4];
    xfer_request_t *req = NULL;
    xfer_status_t st;
    xfer_batch_t *b;
    rma_t r;

    require_tcp();
    rma_start(&r);
    tp_fill_pattern(r.local + SLACK, 4096, 5);
    tp_fill_pattern(xfer_mem_address(r.mem), 4 * 4096, 6);     /* what the batch sends */
    st = xfer_put(r.peer.ep, r.local + SLACK, 4096, r.mem, r.base, r.rkey, NULL, NULL, &req);
    cr_assert_eq(tp_op_result(st, req, TP_WAIT_MS), XFER_OK);
    cr_assert_eq(tp_flush(r.peer.ep, TP_WAIT_MS), XFER_OK);
    cr_expect_eq(tu_ep_counter(r.peer.ep, "tx_put_frames"), 1);
    cr_expect_eq(tu_ep_counter(r.peer.ep, "tx_putv_blocks"), 0);
    cr_expect_eq(tu_ep_counter(r.peer.ep, "tx_get_requests"), 0);
    req = NULL;
    st = xfer_get(r.peer.ep, r.local + SLACK, 4096, r.mem, r.base, r.rkey, NULL, NULL, &req);
    cr_assert_eq(tp_op_result(st, req, TP_WAIT_MS), XFER_OK);
    cr_expect_eq(tu_ep_counter(r.peer.ep, "tx_put_frames"), 1);
    cr_expect_eq(tu_ep_counter(r.peer.ep, "tx_get_requests"), 1);
    for (int i = 0; i < 4; i++) {
        d[i] = (xfer_batch_desc_t){i * 4096ull, i * 4096ull, 4096};
    }
    cr_assert_eq(xfer_batch_create(r.peer.ep, XFER_BATCH_PUT, r.mem, r.rkey, d, 4, &b),
                 XFER_OK);
    req = NULL;
    st = xfer_batch_post(b, NULL, 0, 0, NULL, NULL, &req);
    cr_assert_eq(tp_op_result(st, req, TP_WAIT_MS), XFER_OK);
    cr_assert_eq(xfer_batch_destroy(b), XFER_OK);
    cr_expect_eq(tu_ep_counter(r.peer.ep, "tx_putv_frames"), 1);
    cr_expect_eq(tu_ep_counter(r.peer.ep, "tx_putv_blocks"), 4);
    cr_expect_eq(tu_ep_counter(r.peer.ep, "tx_put_frames"), 1);
    rma_finish(&r);
}
