/*
 * The verbs channel's message header (components/verbs/verbs_wire.c) on its own, no device
 * needed: the 16-byte TAG header, the 24-byte TENSOR_REQUEST header and the 40-byte header
 * of every other type round-trip;
 * every message shorter than its header, or whose length lies, is refused with a reason;
 * another version or an unknown type is XFER_ERR_UNSUPPORTED with what could be read;
 * random bytes never crash the parser (and never read past what arrived: the buffers are
 * exactly as long as the message, for the sanitizers and valgrind to see). The endpoint
 * address round-trips and refuses a peer of another version by name; the 64-bit sizes of the
 * headers, the address and the remote key keep every bit around 2^32, and the length of a
 * transfer's last RDMA chunk is right on both sides of every 32-bit boundary.
 */
#include "../components/verbs/verbs_wire.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

TestSuite(verbs_wire, .timeout = 60);

static char why[256];

/* A heap copy of exactly len bytes of msg (why cleared for the parser to come). */
static uint8_t *exact_copy(const uint8_t *msg, size_t len)
{
    uint8_t *copy = malloc(len ? len : 1);

    cr_assert_not_null(copy);
    memcpy(copy, msg, len);
    why[0] = '\0';
    return copy;
}

/* Unpack the first len bytes of msg from a heap copy of exactly len bytes. */
static xfer_status_t unpack(const uint8_t *msg, size_t len, xfer_verbs_wire_hdr_t *hdr)
{
    uint8_t *copy    = exact_copy(msg, len);
    xfer_status_t st = xfer_verbs_wire_unpack_hdr(copy, len, hdr, why, sizeof(why));

    free(copy);
    return st;
}

Test(verbs_wire, a_tag_message_has_a_16_byte_header)
{
    xfer_verbs_wire_hdr_t h = {.type = XFER_VERBS_MSG_TAG, .credits = 0x1234,
                               .tag = 0x0102030405060708ull, .length = 5, .size = 5,
                               .id = 99, .status = -3}, r;
    uint8_t msg[64];

    memset(msg, 0xee, sizeof(msg));
    cr_assert_eq(xfer_verbs_wire_hdr_len(XFER_VERBS_MSG_TAG), 16);
    cr_assert_eq(xfer_verbs_wire_pack_hdr(&h, msg), 16);
    cr_assert_eq(msg[16], 0xee, "the TAG header wrote past its 16 bytes");
    memcpy(msg + 16, "hello", 5);

    cr_assert_eq(unpack(msg, 21, &r), XFER_OK, "%s", why);
    cr_assert_eq(r.version, XFER_VERBS_WIRE_VERSION);
    cr_assert_eq(r.type, XFER_VERBS_MSG_TAG);
    cr_assert_eq(r.credits, 0x1234);
    cr_assert_eq(r.tag, 0x0102030405060708ull);
    cr_assert_eq(r.length, 5, "a TAG message's payload is what arrived after the header");
    cr_assert_eq(r.size, 5);
    cr_assert_eq(r.id, 0, "id and status are not on the wire of a TAG message");
    cr_assert_eq(r.status, 0);

    /* an empty message is a header alone; one byte less is refused */
    cr_assert_eq(unpack(msg, 16, &r), XFER_OK, "%s", why);
    cr_assert_eq(r.length, 0);
    for (size_t len = 0; len < 16; len++) {
        cr_assert_eq(unpack(msg, len, &r), XFER_ERR_PROTOCOL, "%zu bytes", len);
        cr_assert_neq(why[0], '\0');
    }
}

Test(verbs_wire, a_tensor_request_has_a_24_byte_header)
{
    xfer_verbs_wire_hdr_t h = {.type = XFER_VERBS_MSG_TENSOR_REQUEST, .credits = 9,
                               .tag = 0x1112131415161718ull, .id = 0x0badcafe, .length = 77,
                               .size = 5, .status = -3}, r;
    uint8_t msg[64];
    size_t ext = 16 + 12 + 1;      /* the smallest extension: rank 0, a 1-byte key */

    memset(msg, 0xee, sizeof(msg));
    cr_assert_eq(xfer_verbs_wire_hdr_len(XFER_VERBS_MSG_TENSOR_REQUEST), 24);
    cr_assert_eq(xfer_verbs_wire_pack_hdr(&h, msg), 24);
    cr_assert_eq(msg[24], 0xee, "the TENSOR_REQUEST header wrote past its 24 bytes");

    cr_assert_eq(unpack(msg, 24 + ext, &r), XFER_OK, "%s", why);
    cr_assert_eq(r.type, XFER_VERBS_MSG_TENSOR_REQUEST);
    cr_assert_eq(r.credits, 9);
    cr_assert_eq(r.tag, 0x1112131415161718ull, "the step");
    cr_assert_eq(r.id, 0x0badcafe, "the request index");
    cr_assert_eq(r.length, ext, "the extension is what arrived after the header");
    cr_assert_eq(r.size, 0, "size and status are not on the wire of a TENSOR_REQUEST");
    cr_assert_eq(r.status, 0);
    /* the index sits where the 40-byte layout keeps its id: another version still names it */
    msg[2] = XFER_VERBS_WIRE_VERSION + 1;
    cr_assert_eq(unpack(msg, 40, &r), XFER_ERR_UNSUPPORTED);
    cr_assert_eq(r.id, 0x0badcafe);
    msg[2] = XFER_VERBS_WIRE_VERSION;

    /* shorter than the header, or than the smallest extension, is refused */
    for (size_t len = 0; len < 24 + ext; len++) {
        cr_assert_eq(unpack(msg, len, &r), XFER_ERR_PROTOCOL, "%zu bytes", len);
        cr_assert_neq(why[0], '\0');
    }
}

Test(verbs_wire, the_other_types_have_the_40_byte_header)
{
    static const struct {
        unsigned type;
        uint32_t ext;
    } cases[] = {
        {XFER_VERBS_MSG_RTS, XFER_VERBS_WIRE_RTS_LEN},
        {XFER_VERBS_MSG_FIN, 0},
        {XFER_VERBS_MSG_TENSOR_RE_REQUEST, 16},
        {XFER_VERBS_MSG_ERROR_STATUS, 8 + 11},
    };
    uint8_t msg[128];

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        xfer_verbs_wire_hdr_t h = {.type = (uint8_t)cases[i].type, .credits = 7, .status = -5,
                                   .length = cases[i].ext, .id = 0xa1a2a3a4a5a6a7a8ull,
                                   .tag = 42, .size = 1ull << 40}, r;

        memset(msg, 0, sizeof(msg));
        cr_assert_eq(xfer_verbs_wire_hdr_len(cases[i].type), 40);
        cr_assert_eq(xfer_verbs_wire_pack_hdr(&h, msg), 40);
        cr_assert_eq(unpack(msg, 40 + cases[i].ext, &r), XFER_OK, "%s: %s",
                     xfer_verbs_msg_name(cases[i].type), why);
        cr_assert(r.type == h.type && r.credits == 7 && r.status == -5 &&
                  r.length == cases[i].ext && r.id == h.id && r.tag == 42 && r.size == h.size,
                  "%s did not round-trip", xfer_verbs_msg_name(cases[i].type));
        /* a byte more or less than the header says */
        cr_assert_eq(unpack(msg, 40 + cases[i].ext + 1, &r), XFER_ERR_PROTOCOL);
        cr_assert(strstr(why, "bytes follow") != NULL, "%s", why);
        if (cases[i].ext > 0) {
            cr_assert_eq(unpack(msg, 40 + cases[i].ext - 1, &r), XFER_ERR_PROTOCOL);
        }
        /* shorter than the 40 bytes, even if it would hold a TAG header */
        for (size_t len = 0; len < 40; len++) {
            cr_assert_eq(unpack(msg, len, &r), XFER_ERR_PROTOCOL, "%s of %zu bytes",
                         xfer_verbs_msg_name(cases[i].type), len);
        }
    }
}

/* Reserved bytes are 0 (a later version may give them a meaning): the header's, on a short
 * and a long header, and an RTS's are refused otherwise. */
Test(verbs_wire, reserved_bytes_set_are_refused)
{
    static const unsigned types[] = {XFER_VERBS_MSG_TAG, XFER_VERBS_MSG_RTS,
                                     XFER_VERBS_MSG_FIN};
    uint8_t msg[128];

    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        xfer_verbs_wire_hdr_t h = {.type = (uint8_t)types[i], .length = 0}, r;
        size_t len;

        memset(msg, 0, sizeof(msg));
        if (types[i] == XFER_VERBS_MSG_RTS) {
            h.length = XFER_VERBS_WIRE_RTS_LEN;
        }
        len = xfer_verbs_wire_pack_hdr(&h, msg) + h.length;
        cr_assert_eq(unpack(msg, len, &r), XFER_OK, "%s: %s", xfer_verbs_msg_name(types[i]),
                     why);
        msg[6] = 1;
        cr_expect_eq(unpack(msg, len, &r), XFER_ERR_PROTOCOL, "%s",
                     xfer_verbs_msg_name(types[i]));
        cr_expect(strstr(why, "reserved") != NULL, "%s", why);
        msg[6] = 0;
        if (types[i] == XFER_VERBS_MSG_RTS) {
            msg[40 + 12] = 1;
            cr_expect_eq(unpack(msg, len, &r), XFER_ERR_PROTOCOL, "RTS reserved word");
        }
    }
}

Test(verbs_wire, another_version_or_type_is_unsupported_and_named)
{
    xfer_verbs_wire_hdr_t h = {.type = XFER_VERBS_MSG_TENSOR_RE_REQUEST, .credits = 3,
                               .length = 16, .id = 0x77}, r;
    uint8_t msg[56] = {0};

    xfer_verbs_wire_pack_hdr(&h, msg);
    msg[2] = XFER_VERBS_WIRE_VERSION + 1;
    cr_assert_eq(unpack(msg, sizeof(msg), &r), XFER_ERR_UNSUPPORTED);
    cr_assert(strstr(why, "wire version") != NULL, "%s", why);
    cr_assert_eq(r.id, 0x77, "the id names the message in the answer");
    cr_assert_eq(r.credits, 3);

    msg[2] = XFER_VERBS_WIRE_VERSION;
    msg[3] = 0x7f;
    cr_assert_eq(unpack(msg, sizeof(msg), &r), XFER_ERR_UNSUPPORTED);
    cr_assert(strstr(why, "unknown message type 127") != NULL, "%s", why);
    cr_assert_eq(r.id, 0x77);

    /* too short for the 40-byte layout: nothing past the common part is guessed */
    cr_assert_eq(unpack(msg, 12, &r), XFER_ERR_UNSUPPORTED);
    cr_assert_eq(r.id, 0);
    cr_assert_eq(r.length, 0);

    msg[0] ^= 0xff;
    cr_assert_eq(unpack(msg, sizeof(msg), &r), XFER_ERR_PROTOCOL);
    cr_assert(strstr(why, "magic") != NULL, "%s", why);
}

Test(verbs_wire, random_bytes_never_crash)
{
    uint8_t buf[96];
    unsigned seed = 4242;

    for (int it = 0; it < 200000; it++) {
        size_t len = (size_t)(rand_r(&seed) % (sizeof(buf) + 1));
        xfer_verbs_wire_hdr_t r;

        for (size_t i = 0; i < len; i++) {
            buf[i] = (uint8_t)rand_r(&seed);
        }
        /* a valid start often, so that the checks past the first ones are reached too */
        if ((len >= 4) && (it % 2)) {
            buf[0] = 0x56;
            buf[1] = 0x58;
            buf[2] = XFER_VERBS_WIRE_VERSION;
            buf[3] = (uint8_t)(1 + buf[3] % (XFER_VERBS_MSG_LAST - 1));
            if ((len >= 16) && (it % 4 == 1)) {
                uint32_t follow = (uint32_t)(len - xfer_verbs_wire_hdr_len(buf[3]));

                buf[12] = (uint8_t)follow;
                buf[13] = buf[14] = buf[15] = 0;
            }
        }
        if (unpack(buf, len, &r) == XFER_OK) {
            cr_assert_eq(xfer_verbs_wire_hdr_len(r.type) + r.length, len,
                         "an accepted message's header and length cover what arrived");
        }
    }
}

/* Sizes on both sides of the 32-bit boundaries, and the largest. */
static const uint64_t sizes32[] = {
    0x7fffffffull, 0x80000000ull, 0x80000001ull, 0xffffffffull, 0x100000000ull,
    0x100000001ull, 0x1ffffffffull, 0x200000001ull, UINT64_MAX - 1, UINT64_MAX,
};
#define NUM_SIZES32 (sizeof(sizes32) / sizeof(sizes32[0]))

Test(verbs_wire, header_sizes_keep_every_bit_past_32)
{
    static const unsigned types[] = {XFER_VERBS_MSG_RTS, XFER_VERBS_MSG_TENSOR_RE_REQUEST};
    uint8_t msg[XFER_VERBS_WIRE_HDR_LEN + XFER_VERBS_WIRE_RTS_LEN];

    for (size_t t = 0; t < 2; t++) {
        for (size_t i = 0; i < NUM_SIZES32; i++) {
            xfer_verbs_wire_hdr_t h = {.type = (uint8_t)types[t], .length = 16,
                                       .id = sizes32[i], .tag = sizes32[i],
                                       .size = sizes32[i]}, r;

            memset(msg, 0, sizeof(msg));
            xfer_verbs_wire_pack_hdr(&h, msg);
            cr_assert_eq(unpack(msg, sizeof(msg), &r), XFER_OK, "%s", why);
            cr_assert(r.size == sizes32[i] && r.id == sizes32[i] && r.tag == sizes32[i],
                      "%s of size 0x%llx came back as 0x%llx", xfer_verbs_msg_name(types[t]),
                      (unsigned long long)sizes32[i], (unsigned long long)r.size);
        }
    }
}

static xfer_verbs_wire_ep_addr_t ep_addr_good(void)
{
    xfer_verbs_wire_ep_addr_t a = {.qpn = 0x123456, .psn = 0xabcdef, .rx_slots = 128,
                                   .seg_size = 8192, .max_msg_size = 1ull << 31,
                                   .max_key_len = 256, .max_rd_atomic = 16,
                                   .ka_addr = 0x7f0000001000ull, .ka_rkey = 0x99,
                                   .rdma_chunk = 1u << 30};
    return a;
}

static xfer_status_t unpack_ep(const uint8_t *buf, size_t len, xfer_verbs_wire_ep_addr_t *a)
{
    uint8_t *copy    = exact_copy(buf, len);
    xfer_status_t st = xfer_verbs_wire_unpack_ep_addr(copy, len, a, why, sizeof(why));

    free(copy);
    return st;
}

Test(verbs_wire, the_endpoint_address_round_trips_with_its_chunk_size)
{
    static const uint32_t chunks[] = {1, 4096, 4097, 1u << 30, 1u << 31, UINT32_MAX};
    uint8_t buf[XFER_VERBS_WIRE_EP_ADDR_LEN + 1];

    for (size_t i = 0; i < NUM_SIZES32; i++) {
        xfer_verbs_wire_ep_addr_t a = ep_addr_good(), r;

        a.max_msg_size = sizes32[i];
        a.ka_addr      = sizes32[NUM_SIZES32 - 1 - i];
        a.rdma_chunk   = chunks[i % (sizeof(chunks) / sizeof(chunks[0]))];
        memset(buf, 0xee, sizeof(buf));
        xfer_verbs_wire_pack_ep_addr(&a, buf);
        cr_assert_eq(buf[XFER_VERBS_WIRE_EP_ADDR_LEN], 0xee, "packed past the address");
        cr_assert_eq(unpack_ep(buf, XFER_VERBS_WIRE_EP_ADDR_LEN, &r), XFER_OK, "%s", why);
        cr_assert(r.qpn == a.qpn && r.psn == a.psn && r.rx_slots == a.rx_slots &&
                  r.seg_size == a.seg_size && r.max_key_len == a.max_key_len &&
                  r.max_rd_atomic == a.max_rd_atomic && r.ka_rkey == a.ka_rkey,
                  "the 32-bit fields changed");
        cr_assert_eq(r.max_msg_size, a.max_msg_size);
        cr_assert_eq(r.ka_addr, a.ka_addr);
        cr_assert_eq(r.rdma_chunk, a.rdma_chunk);
        /* a byte more or less is not an address */
        cr_assert_eq(unpack_ep(buf, XFER_VERBS_WIRE_EP_ADDR_LEN + 1, &r), XFER_ERR_PROTOCOL);
        cr_assert_eq(unpack_ep(buf, XFER_VERBS_WIRE_EP_ADDR_LEN - 1, &r), XFER_ERR_PROTOCOL);
    }
}

Test(verbs_wire, an_endpoint_address_of_another_version_is_refused_by_name)
{
    xfer_verbs_wire_ep_addr_t a = ep_addr_good(), r;
    uint8_t buf[XFER_VERBS_WIRE_EP_ADDR_LEN];

    /* version 4 and earlier: 48 bytes that begin with the QP number */
    memset(buf, 0x11, sizeof(buf));
    cr_assert_eq(unpack_ep(buf, XFER_VERBS_WIRE_EP_ADDR_V4_LEN, &r), XFER_ERR_UNSUPPORTED);
    cr_assert(strstr(why, "version 4 or earlier") != NULL, "%s", why);

    /* a later version, whatever its length */
    xfer_verbs_wire_pack_ep_addr(&a, buf);
    buf[2] = XFER_VERBS_WIRE_VERSION + 1;
    for (size_t len = 4; len <= sizeof(buf); len += 4) {
        cr_assert_eq(unpack_ep(buf, len, &r), XFER_ERR_UNSUPPORTED, "%zu bytes", len);
        cr_assert(strstr(why, "wire version") != NULL, "%s", why);
    }

    /* this version, but not an address: magic, reserved bytes, a chunk of 0 */
    xfer_verbs_wire_pack_ep_addr(&a, buf);
    buf[0] ^= 0xff;
    cr_assert_eq(unpack_ep(buf, sizeof(buf), &r), XFER_ERR_PROTOCOL);
    cr_assert(strstr(why, "magic") != NULL, "%s", why);
    xfer_verbs_wire_pack_ep_addr(&a, buf);
    buf[3] = 1;
    cr_assert_eq(unpack_ep(buf, sizeof(buf), &r), XFER_ERR_PROTOCOL);
    xfer_verbs_wire_pack_ep_addr(&a, buf);
    buf[55] = 1;
    cr_assert_eq(unpack_ep(buf, sizeof(buf), &r), XFER_ERR_PROTOCOL);
    a.rdma_chunk = 0;
    xfer_verbs_wire_pack_ep_addr(&a, buf);
    cr_assert_eq(unpack_ep(buf, sizeof(buf), &r), XFER_ERR_PROTOCOL);
    cr_assert(strstr(why, "rdma_chunk 0") != NULL, "%s", why);
}

Test(verbs_wire, the_last_chunk_on_both_sides_of_32_bits)
{
    static const struct {
        uint64_t len;
        uint32_t chunk;
        uint64_t last;
    } cases[] = {
        {0, 4096, 0},                       /* only the immediate */
        {1, 4096, 1},
        {4095, 4096, 4095},
        {4096, 4096, 4096},                 /* one full chunk */
        {4097, 4096, 1},
        {300 * 4096ull, 4096, 4096},        /* many full chunks */
        {300 * 4096ull + 1, 4096, 1},
        {0xffffffffull, 1u << 30, (1u << 30) - 1},
        {0x100000000ull, 1u << 30, 1u << 30},
        {0x100000001ull, 1u << 30, 1},
        {0xffffffffull, 1u << 31, (1u << 31) - 1},
        {0x100000000ull, 1u << 31, 1u << 31},
        {0x100000001ull, 1u << 31, 1},
        {0xffffffffull, UINT32_MAX, UINT32_MAX},
        {0x100000000ull, UINT32_MAX, 1},
        {0x100000000ull, 3, 1},             /* 2^32 - 1 is a multiple of 3 */
        {0x100000001ull, 3, 2},
        {UINT64_MAX, 1u << 30, (1u << 30) - 1},
        {UINT64_MAX, 4096, 4095},
        {UINT64_MAX, 1, 1},
        {UINT64_MAX, UINT32_MAX, UINT32_MAX},   /* 2^64 - 1 is a multiple of 2^32 - 1 */
    };

    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint64_t got = xfer_verbs_wire_last_chunk(cases[i].len, cases[i].chunk);

        cr_assert_eq(got, cases[i].last, "last chunk of %llu bytes in chunks of %u: %llu, "
                     "expected %llu", (unsigned long long)cases[i].len, cases[i].chunk,
                     (unsigned long long)got, (unsigned long long)cases[i].last);
        cr_assert(got <= UINT32_MAX, "a chunk's length fits a completion's byte_len");
    }
}

Test(verbs_wire, remote_key_lengths_keep_every_bit_past_32)
{
    uint8_t buf[XFER_VERBS_WIRE_RKEY_LEN];

    for (size_t i = 0; i < NUM_SIZES32; i++) {
        xfer_verbs_wire_rkey_t k = {.rkey = 0x1234, .addr = 0, .length = sizes32[i]}, r;

        xfer_verbs_wire_pack_rkey(&k, buf);
        cr_assert_eq(xfer_verbs_wire_unpack_rkey(buf, sizeof(buf), &r), XFER_OK);
        cr_assert_eq(r.length, sizes32[i]);
        /* the same length from an address it would wrap past is refused */
        k.addr = UINT64_MAX - sizes32[i] + 2;
        xfer_verbs_wire_pack_rkey(&k, buf);
        cr_assert_eq(xfer_verbs_wire_unpack_rkey(buf, sizeof(buf), &r), XFER_ERR_INVALID_PARAM,
                     "0x%llx+0x%llx wraps", (unsigned long long)k.addr,
                     (unsigned long long)k.length);
    }
}
