/*
 * The verbs channel's message header (components/verbs/verbs_wire.c) on its own, no device
 * needed: the 16-byte TAG header, the 24-byte TENSOR_REQUEST header and the 40-byte header
 * of every other type round-trip;
 * every message shorter than its header, or whose length lies, is refused with a reason;
 * another version or an unknown type is XFER_ERR_UNSUPPORTED with what could be read;
 * random bytes never crash the parser (and never read past what arrived: the buffers are
 * exactly as long as the message, for the sanitizers and valgrind to see).
 */
#include "../components/verbs/verbs_wire.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

TestSuite(verbs_wire, .timeout = 60);

static char why[256];

/* Unpack the first len bytes of msg from a heap copy of exactly len bytes. */
static xfer_status_t unpack(const uint8_t *msg, size_t len, xfer_verbs_wire_hdr_t *hdr)
{
    uint8_t *copy = malloc(len ? len : 1);
    xfer_status_t st;

    cr_assert_not_null(copy);
    memcpy(copy, msg, len);
    why[0] = '\0';
    st     = xfer_verbs_wire_unpack_hdr(copy, len, hdr, why, sizeof(why));
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
