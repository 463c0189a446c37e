/*
 * The tensor protocol's wire format (components/verbs/tensor_wire.c) on its own, no device
 * needed: every message round-trips; every truncated, extended or lying message is refused
 * with a reason; random bytes never crash a parser; request indices keep slot and generation
 * apart and never set the immediate's tensor flag; sizes and dimensions around 2^32 keep
 * every bit, and a size cut to 32 bits no longer matches its shape.
 */
#include "../components/verbs/tensor_wire.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

TestSuite(tensor_wire, .timeout = 60);

#define MAX_KEY 256

static char why[256];

static xfer_tensor_wire_meta_t meta3(void)
{
    xfer_tensor_wire_meta_t m = {.dtype = XFER_DTYPE_FLOAT32, .rank = 3, .size = 2 * 3 * 5 * 4,
                                 .dims = {2, 3, 5}};
    return m;
}

static xfer_tensor_wire_meta_t meta_none(void)
{
    xfer_tensor_wire_meta_t m = {.flags = XFER_TENSOR_META_NONE};
    return m;
}

static size_t req_build(uint8_t *buf, const xfer_tensor_wire_meta_t *m, const char *key)
{
    xfer_tensor_wire_req_t r = {.addr = 0x1122334455667788ull, .rkey = 0xabcdef01u,
                                .expect = *m, .key = (const uint8_t*)key,
                                .key_len = (uint32_t)strlen(key)};
    size_t n = xfer_tensor_wire_pack_req(&r, buf);

    cr_assert_eq(n, xfer_tensor_wire_req_len(&r));
    return n;
}

Test(tensor_wire, request_round_trips)
{
    const xfer_tensor_wire_meta_t metas[] = {meta_none(), meta3()};
    uint8_t buf[512];

    for (unsigned i = 0; i < 2; i++) {
        size_t n = req_build(buf, &metas[i], "layer7/weights");
        xfer_tensor_wire_req_t r;

        cr_assert_eq(n, 16 + 12 + 8 * metas[i].rank + 14, "destination, rank + dims, key");

        cr_assert_eq(xfer_tensor_wire_unpack_req(buf, n, MAX_KEY, &r, why, sizeof(why)),
                     XFER_OK, "%s", why);
        cr_assert_eq(r.addr, 0x1122334455667788ull);
        cr_assert_eq(r.rkey, 0xabcdef01u);
        cr_assert_eq(r.key_len, 14);
        cr_assert_eq(memcmp(r.key, "layer7/weights", 14), 0);
        cr_assert(xfer_tensor_wire_meta_equal(&r.expect, &metas[i]));
    }
}

Test(tensor_wire, metadata_round_trips_dead_and_variable_size)
{
    xfer_tensor_t dead = {.dtype = XFER_DTYPE_INT64, .rank = 2, .dims = {4, 0}, .size = 0,
                          .is_dead = 1};
    xfer_tensor_t bytes = {.dtype = XFER_DTYPE_BYTES, .rank = 1, .dims = {3}, .size = 12345};
    xfer_tensor_t scalar = {.dtype = XFER_DTYPE_FLOAT64, .rank = 0, .size = 8};
    const xfer_tensor_t *ts[] = {&dead, &bytes, &scalar};
    uint8_t buf[XFER_TENSOR_WIRE_META_MAX];

    for (unsigned i = 0; i < 3; i++) {
        xfer_tensor_wire_meta_t m, back;
        size_t n;

        xfer_tensor_wire_meta_from(&m, ts[i]);
        n = xfer_tensor_wire_pack_meta(&m, buf);
        cr_assert_eq(n, 12 + 8 * ts[i]->rank, "shape travels as rank + dims");
        cr_assert_eq(xfer_tensor_wire_unpack_meta(buf, n, &back, why, sizeof(why)), XFER_OK,
                     "tensor %u: %s", i, why);
        cr_assert(xfer_tensor_wire_meta_equal(&m, &back), "tensor %u", i);
        cr_assert_eq(!!(back.flags & XFER_TENSOR_META_DEAD), ts[i]->is_dead);
    }
}

Test(tensor_wire, re_request_and_error_round_trip)
{
    xfer_tensor_wire_rereq_t rr = {.addr = 0xfeedull << 32, .rkey = 77}, rb;
    xfer_tensor_wire_err_t e;
    uint8_t buf[512];
    size_t n = xfer_tensor_wire_pack_rereq(&rr, buf);

    cr_assert_eq(xfer_tensor_wire_unpack_rereq(buf, n, &rb, why, sizeof(why)), XFER_OK, "%s",
                 why);
    cr_assert_eq(rb.addr, rr.addr);
    cr_assert_eq(rb.rkey, rr.rkey);

    n = xfer_tensor_wire_pack_err("key 'x' missing after abort", 27, buf);
    cr_assert_eq(xfer_tensor_wire_unpack_err(buf, n, XFER_ERR_ABORTED, &e, why, sizeof(why)),
                 XFER_OK, "%s", why);
    cr_assert_eq(e.reason_len, 27);
    cr_assert_eq(memcmp(e.reason, "key 'x' missing after abort", 27), 0);

    /* a reason longer than the limit is cut, not overflowed */
    {
        char longr[1000];

        memset(longr, 'r', sizeof(longr));
        n = xfer_tensor_wire_pack_err(longr, sizeof(longr), buf);
        cr_assert_eq(n, XFER_TENSOR_WIRE_ERR_FIXED + XFER_TENSOR_WIRE_MAX_REASON);
        cr_assert_eq(xfer_tensor_wire_unpack_err(buf, n, XFER_ERR_NO_MEMORY, &e, why,
                                                 sizeof(why)), XFER_OK, "%s", why);
    }
}

Test(tensor_wire, every_truncation_and_extension_is_refused)
{
    xfer_tensor_wire_meta_t m3 = meta3(), mn = meta_none(), mo;
    xfer_tensor_wire_rereq_t rr = {.addr = 1, .rkey = 2};
    xfer_tensor_wire_req_t r;
    xfer_tensor_wire_rereq_t rb;
    xfer_tensor_wire_err_t e;
    uint8_t buf[512];
    size_t n;

    /* a request: any shorter length is refused; so is a longer one whose key_len lies */
    for (unsigned which = 0; which < 2; which++) {
        n = req_build(buf, which ? &m3 : &mn, "abc");
        for (size_t len = 0; len < n; len++) {
            cr_assert_eq(xfer_tensor_wire_unpack_req(buf, len, MAX_KEY, &r, why, sizeof(why)),
                         XFER_ERR_PROTOCOL, "request of %zu of %zu bytes accepted", len, n);
        }
        cr_assert_eq(xfer_tensor_wire_unpack_req(buf, n + 1, MAX_KEY, &r, why, sizeof(why)),
                     XFER_ERR_PROTOCOL, "a byte after the key accepted");
    }
    n = xfer_tensor_wire_pack_meta(&m3, buf);
    for (size_t len = 0; len < n; len++) {
        cr_assert_eq(xfer_tensor_wire_unpack_meta(buf, len, &mo, why, sizeof(why)),
                     XFER_ERR_PROTOCOL, "metadata of %zu of %zu bytes accepted", len, n);
    }
    cr_assert_eq(xfer_tensor_wire_unpack_meta(buf, n + 8, &mo, why, sizeof(why)),
                 XFER_ERR_PROTOCOL, "metadata with a trailing dimension accepted");
    n = xfer_tensor_wire_pack_rereq(&rr, buf);
    for (size_t len = 0; len <= n + 4; len++) {
        if (len != n) {
            cr_assert_eq(xfer_tensor_wire_unpack_rereq(buf, len, &rb, why, sizeof(why)),
                         XFER_ERR_PROTOCOL, "re-request of %zu bytes accepted", len);
        }
    }
    n = xfer_tensor_wire_pack_err("why", 3, buf);
    for (size_t len = 0; len <= n + 4; len++) {
        if (len != n) {
            cr_assert_eq(xfer_tensor_wire_unpack_err(buf, len, XFER_ERR_IO, &e, why,
                                                     sizeof(why)),
                         XFER_ERR_PROTOCOL, "error of %zu bytes accepted", len);
        }
    }
}

/* Pack m, let mutate change the bytes, expect a refusal that says something. */
static void meta_lie(void (*mutate)(uint8_t *buf), const char *what)
{
    xfer_tensor_wire_meta_t m = meta3(), back;
    uint8_t buf[XFER_TENSOR_WIRE_META_MAX + 64];
    size_t n = xfer_tensor_wire_pack_meta(&m, buf);

    mutate(buf);
    why[0] = '\0';
    cr_assert_eq(xfer_tensor_wire_unpack_meta(buf, n, &back, why, sizeof(why)),
                 XFER_ERR_PROTOCOL, "%s accepted", what);
    cr_assert_neq(why[0], '\0', "%s: refused without a reason", what);
}

/* meta: 0 u64 size, 8 u8 dtype, 9 u8 rank, 10 u8 flags, 11 u8 reserved, 12 dims */
static void lie_rank(uint8_t *b)      { b[9] = 9; }
static void lie_rank_big(uint8_t *b)  { b[9] = 0xff; }
static void lie_rank_short(uint8_t *b) { b[9] = 4; }          /* 4 dims said, 3 there */
static void lie_dtype(uint8_t *b)     { b[8] = XFER_DTYPE_LAST; }
static void lie_dtype0(uint8_t *b)    { b[8] = 0; }
static void lie_flags(uint8_t *b)     { b[10] = 0x80; }
static void lie_reserved(uint8_t *b)  { b[11] = 1; }
static void lie_size(uint8_t *b)      { b[0] ^= 4; }           /* 120 -> 124 bytes */
static void lie_neg_dim(uint8_t *b)   { memset(b + 12, 0xff, 8); }
static void lie_dead(uint8_t *b)      { b[10] = XFER_TENSOR_META_DEAD; }  /* dead, size 120 */
static void lie_none(uint8_t *b)      { b[10] = XFER_TENSOR_META_NONE; }  /* none, but a shape */
static void lie_overflow(uint8_t *b)
{
    for (int i = 0; i < 3; i++) {
        memset(b + 12 + 8 * i, 0, 8);
        b[12 + 8 * i + 7] = 0x10;                             /* 2^60 each: the product wraps */
    }
}

Test(tensor_wire, lying_metadata_is_refused_with_a_reason)
{
    meta_lie(lie_rank, "rank 9");
    meta_lie(lie_rank_big, "rank 255");
    meta_lie(lie_rank_short, "rank 4 with 3 dimensions present");
    meta_lie(lie_dtype, "an unknown dtype");
    meta_lie(lie_dtype0, "dtype 0 with a shape");
    meta_lie(lie_flags, "an unknown flag");
    meta_lie(lie_reserved, "a non-zero reserved byte");
    meta_lie(lie_size, "a size that is not dims x dtype size");
    meta_lie(lie_neg_dim, "a negative dimension");
    meta_lie(lie_dead, "a dead tensor with a size");
    meta_lie(lie_none, "'no metadata' with a shape");
    meta_lie(lie_overflow, "dimensions whose product overflows");
}

Test(tensor_wire, lying_requests_and_errors_are_refused)
{
    xfer_tensor_wire_meta_t mn = meta_none();
    xfer_tensor_wire_req_t r;
    xfer_tensor_wire_err_t e;
    uint8_t buf[1024];
    char key[MAX_KEY + 2];
    size_t n;

    /* key_len 0, key_len above the limit (with the bytes there), key_len past the end */
    n = req_build(buf, &mn, "k");
    buf[12] = 0;
    cr_assert_eq(xfer_tensor_wire_unpack_req(buf, n - 1, MAX_KEY, &r, why, sizeof(why)),
                 XFER_ERR_PROTOCOL, "an empty key accepted");
    memset(key, 'k', MAX_KEY + 1);
    key[MAX_KEY + 1] = '\0';
    n = req_build(buf, &mn, key);
    cr_assert_eq(xfer_tensor_wire_unpack_req(buf, n, MAX_KEY, &r, why, sizeof(why)),
                 XFER_ERR_PROTOCOL, "a key over the limit accepted");
    cr_assert_eq(xfer_tensor_wire_unpack_req(buf, n, MAX_KEY + 1, &r, why, sizeof(why)),
                 XFER_OK, "the same key within a larger limit: %s", why);
    n = req_build(buf, &mn, "abc");
    buf[12] = 0xff;
    buf[13] = 0xff;
    buf[14] = 0xff;
    buf[15] = 0xff;
    cr_assert_eq(xfer_tensor_wire_unpack_req(buf, n, UINT32_MAX, &r, why, sizeof(why)),
                 XFER_ERR_PROTOCOL, "key_len 2^32-1 accepted");

    /* errors: a reason_len that lies, the OK status, a status this side does not know */
    n = xfer_tensor_wire_pack_err("reason", 6, buf);
    buf[0] = 7;
    cr_assert_eq(xfer_tensor_wire_unpack_err(buf, n, XFER_ERR_IO, &e, why, sizeof(why)),
                 XFER_ERR_PROTOCOL, "reason_len 7 with 6 bytes accepted");
    buf[0] = 6;
    cr_assert_eq(xfer_tensor_wire_unpack_err(buf, n, XFER_OK, &e, why, sizeof(why)),
                 XFER_ERR_PROTOCOL, "ERROR_STATUS with XFER_OK accepted");
    cr_assert_eq(xfer_tensor_wire_unpack_err(buf, n, 5, &e, why, sizeof(why)),
                 XFER_ERR_PROTOCOL, "ERROR_STATUS with a positive status accepted");
    cr_assert_eq(xfer_tensor_wire_unpack_err(buf, n, -1000, &e, why, sizeof(why)),
                 XFER_ERR_PROTOCOL, "ERROR_STATUS with an unknown status accepted");
}

Test(tensor_wire, random_bytes_never_crash)
{
    uint8_t buf[600];
    unsigned seed = 12345;

    for (int it = 0; it < 200000; it++) {
        size_t len = (size_t)(rand_r(&seed) % (sizeof(buf) + 1));
        xfer_tensor_wire_req_t r;
        xfer_tensor_wire_meta_t m;
        xfer_tensor_wire_rereq_t rr;
        xfer_tensor_wire_err_t e;

        for (size_t i = 0; i < len; i++) {
            buf[i] = (uint8_t)rand_r(&seed);
        }
        /* small ranks and no reserved bits, in metadata at 0 and in a request's at 16, so
         * that the checks past the first ones are reached too */
        if ((len > 28) && (it % 2)) {
            buf[9] %= 10;
            buf[11] = 0;
            buf[16 + 9] %= 10;
            buf[16 + 11] = 0;
        }
        if (xfer_tensor_wire_unpack_req(buf, len, MAX_KEY, &r, why, sizeof(why)) == XFER_OK) {
            cr_assert(r.key_len >= 1 && r.key_len <= MAX_KEY);
            cr_assert(r.key + r.key_len == buf + len, "the key ends where the message does");
        }
        if (xfer_tensor_wire_unpack_meta(buf, len, &m, why, sizeof(why)) == XFER_OK) {
            cr_assert(m.rank <= XFER_TENSOR_MAX_RANK);
            cr_assert_eq(len, 12 + 8 * m.rank);
        }
        (void)xfer_tensor_wire_unpack_rereq(buf, len, &rr, why, sizeof(why));
        if (xfer_tensor_wire_unpack_err(buf, len, XFER_ERR_IO, &e, why, sizeof(why)) ==
            XFER_OK) {
            cr_assert(e.reason_len <= XFER_TENSOR_WIRE_MAX_REASON);
        }
    }
}

Test(tensor_wire, request_indices_keep_slot_and_generation_apart)
{
    const uint32_t slots[] = {0, 1, 4095, XFER_TENSOR_IDX_MAX_SLOTS - 1};
    const uint32_t gens[]  = {0, 1, 1000, (1u << XFER_TENSOR_IDX_GEN_BITS) - 1};

    for (unsigned i = 0; i < 4; i++) {
        for (unsigned j = 0; j < 4; j++) {
            uint32_t idx = xfer_tensor_idx_make(slots[i], gens[j]);

            cr_assert_eq(xfer_tensor_idx_slot(idx), slots[i]);
            cr_assert_eq(xfer_tensor_idx_gen(idx), gens[j]);
            cr_assert_eq(idx & XFER_TENSOR_IMM_FLAG, 0, "an index never sets the tensor flag");
        }
    }
    /* the generation wraps within its bits: the next generation of the last one is 0 */
    cr_assert_eq(xfer_tensor_idx_gen(xfer_tensor_idx_make(5, 1u << XFER_TENSOR_IDX_GEN_BITS)),
                 0);
    cr_assert_neq(xfer_tensor_idx_make(5, 1), xfer_tensor_idx_make(5, 2),
                  "a stale index of the same slot differs");
}

Test(tensor_wire, sizes_and_dimensions_around_32_bits_round_trip)
{
    static const uint64_t sizes[] = {
        0xffffffffull, 0x100000000ull, 0x100000001ull, 0x1ffffffffull, UINT64_MAX,
    };
    uint8_t buf[512];

    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        /* uint8 of that many elements; bytes of that size (the size alone says it) */
        xfer_tensor_wire_meta_t u8 = {.dtype = XFER_DTYPE_UINT8, .rank = 1,
                                      .size = sizes[i], .dims = {(int64_t)sizes[i]}};
        xfer_tensor_wire_meta_t by = {.dtype = XFER_DTYPE_BYTES, .rank = 2, .size = sizes[i],
                                      .dims = {1, 3}};
        const xfer_tensor_wire_meta_t *ms[] = {&u8, &by};

        if (sizes[i] > INT64_MAX) {
            u8.rank = 2;        /* 2^64 - 1 = (2^32 + 1) x (2^32 - 1) */
            u8.dims[0] = 0x100000001ll;
            u8.dims[1] = 0xffffffffll;
        }
        for (unsigned j = 0; j < 2; j++) {
            xfer_tensor_wire_meta_t back;
            xfer_tensor_wire_req_t r;
            size_t n = xfer_tensor_wire_pack_meta(ms[j], buf);

            cr_assert_eq(xfer_tensor_wire_unpack_meta(buf, n, &back, why, sizeof(why)),
                         XFER_OK, "0x%llx bytes: %s", (unsigned long long)sizes[i], why);
            cr_assert_eq(back.size, sizes[i]);
            cr_assert(xfer_tensor_wire_meta_equal(&back, ms[j]));
            cr_assert_eq(xfer_tensor_wire_data_len(&back), sizes[i]);
            n = req_build(buf, ms[j], "big");
            cr_assert_eq(xfer_tensor_wire_unpack_req(buf, n, MAX_KEY, &r, why, sizeof(why)),
                         XFER_OK, "%s", why);
            cr_assert_eq(r.expect.size, sizes[i], "the expectation's size");
        }
        /* the size cut to its low 32 bits no longer matches the shape */
        if (sizes[i] <= UINT32_MAX) {
            continue;
        }
        u8.size = (uint32_t)sizes[i];
        xfer_tensor_wire_pack_meta(&u8, buf);
        cr_assert_eq(xfer_tensor_wire_unpack_meta(buf, 12 + 8 * u8.rank, &u8, why,
                                                  sizeof(why)), XFER_ERR_PROTOCOL,
                     "0x%llx elements of 1 byte claiming 0x%llx bytes",
                     (unsigned long long)sizes[i], (unsigned long long)(uint32_t)sizes[i]);
    }
}

Test(tensor_wire, a_shape_past_64_bits_is_refused)
{
    xfer_tensor_wire_meta_t m = {.dtype = XFER_DTYPE_FLOAT32, .rank = 2, .size = 0,
                                 .dims = {0x100000000ll, 0x100000000ll}};
    uint8_t buf[XFER_TENSOR_WIRE_META_MAX];
    size_t n = xfer_tensor_wire_pack_meta(&m, buf);

    cr_assert_eq(xfer_tensor_wire_unpack_meta(buf, n, &m, why, sizeof(why)), XFER_ERR_PROTOCOL);
    cr_assert(strstr(why, "overflows") != NULL, "%s", why);
    /* 2^62 four-byte elements: the elements fit 64 bits, their bytes do not */
    m.rank    = 1;
    m.dims[0] = 1ll << 62;
    m.size    = 0;
    n = xfer_tensor_wire_pack_meta(&m, buf);
    cr_assert_eq(xfer_tensor_wire_unpack_meta(buf, n, &m, why, sizeof(why)), XFER_ERR_PROTOCOL);
}
