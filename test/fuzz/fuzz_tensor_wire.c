/*
 * The four tensor messages of the verbs transport (components/verbs/tensor_wire.c):
 * TENSOR_REQUEST, META_DATA_UPDATE, TENSOR_RE_REQUEST and ERROR_STATUS, each an extension
 * behind the verbs header.
 *
 * The first input byte picks the message, the rest is its extension (an ERROR_STATUS takes
 * the header's status from the next four bytes). What parses is packed again and must come
 * out byte for byte as it went in. Then the bytes are read as a recipe for values of each
 * message that are packed and parsed back: parse(pack(x)) == x whenever the parser takes
 * pack(x).
 */
#include "fuzz.h"
#include "../../components/verbs/tensor_wire.h"

#include <xfer/component.h>

#define MAX_KEY 64u
#define BUF_MAX (XFER_TENSOR_WIRE_REQ_FIXED + XFER_TENSOR_WIRE_META_MAX + 1024u)

static uint8_t buf[BUF_MAX];

static void check_same_meta(const xfer_tensor_wire_meta_t *a, const xfer_tensor_wire_meta_t *b)
{
    FUZZ_CHECK(xfer_tensor_wire_meta_equal(a, b) && xfer_tensor_wire_meta_equal(b, a),
               "metadata changed");
}

static void round_trip_message(const uint8_t *data, size_t size)
{
    xfer_tensor_wire_rereq_t rereq;
    xfer_tensor_wire_meta_t meta;
    xfer_tensor_wire_req_t req;
    xfer_tensor_wire_err_t err;
    char why[FUZZ_WHY_LEN];
    const uint8_t *ext;
    int32_t status;
    size_t len;

    if (size < 1) {
        return;
    }
    ext = data + 1;
    len = size - 1;
    switch (data[0] % 4) {
    case 0:
        if (xfer_tensor_wire_unpack_req(ext, len, MAX_KEY, &req, why, sizeof(why)) != XFER_OK) {
            return;
        }
        FUZZ_CHECK((req.key_len >= 1) && (req.key_len <= MAX_KEY), "%u-byte key", req.key_len);
        FUZZ_CHECK(xfer_tensor_wire_req_len(&req) == len, "TENSOR_REQUEST length");
        check_same_meta(&req.expect, &req.expect);
        FUZZ_CHECK(xfer_tensor_wire_pack_req(&req, buf) == len, "packed length");
        FUZZ_CHECK(!memcmp(buf, ext, len), "TENSOR_REQUEST changed");
        break;
    case 1:
        if (xfer_tensor_wire_unpack_meta(ext, len, &meta, why, sizeof(why)) != XFER_OK) {
            return;
        }
        FUZZ_CHECK(!(meta.flags & XFER_TENSOR_META_NONE), "META_DATA_UPDATE without meta");
        FUZZ_CHECK(xfer_tensor_wire_pack_meta(&meta, buf) == len, "packed length");
        FUZZ_CHECK(!memcmp(buf, ext, len), "META_DATA_UPDATE changed");
        break;
    case 2:
        if (xfer_tensor_wire_unpack_rereq(ext, len, &rereq, why, sizeof(why)) != XFER_OK) {
            return;
        }
        FUZZ_CHECK(xfer_tensor_wire_pack_rereq(&rereq, buf) == len, "packed length");
        FUZZ_CHECK(!memcmp(buf, ext, len), "TENSOR_RE_REQUEST changed");
        break;
    default:
        if (len < 4) {
            return;
        }
        memcpy(&status, ext, 4);
        ext += 4;
        len -= 4;
        if (xfer_tensor_wire_unpack_err(ext, len, status, &err, why, sizeof(why)) != XFER_OK) {
            return;
        }
        FUZZ_CHECK((status < 0) && (err.reason_len <= XFER_TENSOR_WIRE_MAX_REASON) &&
                   (err.reason == (const char*)ext + XFER_TENSOR_WIRE_ERR_FIXED),
                   "ERROR_STATUS");
        FUZZ_CHECK(xfer_tensor_wire_pack_err(err.reason, err.reason_len, buf) == len,
                   "packed length");
        FUZZ_CHECK(!memcmp(buf, ext, len), "ERROR_STATUS changed");
        break;
    }
}

static void take_meta(fuzz_cursor_t *c, xfer_tensor_wire_meta_t *m)
{
    memset(m, 0, sizeof(*m));
    m->dtype = (uint32_t)(fuzz_take(c, 1) % 32);
    m->rank  = (uint32_t)(fuzz_take(c, 1) % (XFER_TENSOR_MAX_RANK + 1));
    m->flags = (uint32_t)(fuzz_take(c, 1) % 4);
    for (uint32_t i = 0; i < m->rank; i++) {
        m->dims[i] = (int64_t)(fuzz_take(c, 1) % 16);
    }
    m->size = fuzz_take(c, 2);
}

static void round_trip_values(const uint8_t *data, size_t size)
{
    fuzz_cursor_t c = {data, size};
    xfer_tensor_wire_rereq_t rereq, rereq2;
    xfer_tensor_wire_meta_t meta, meta2;
    xfer_tensor_wire_req_t req, req2;
    xfer_tensor_wire_err_t err;
    uint8_t key[MAX_KEY + 8];
    char reason[XFER_TENSOR_WIRE_MAX_REASON + 8], why[FUZZ_WHY_LEN];
    int32_t status;
    size_t len;

    take_meta(&c, &meta);
    len = xfer_tensor_wire_pack_meta(&meta, buf);
    if (xfer_tensor_wire_unpack_meta(buf, len, &meta2, why, sizeof(why)) == XFER_OK) {
        check_same_meta(&meta, &meta2);
    }

    memset(&req, 0, sizeof(req));
    req.addr    = fuzz_take(&c, 8);
    req.rkey    = (uint32_t)fuzz_take(&c, 4);
    take_meta(&c, &req.expect);
    req.key_len = (uint32_t)fuzz_take_bytes(&c, key, sizeof(key));
    req.key     = key;
    len = xfer_tensor_wire_pack_req(&req, buf);
    FUZZ_CHECK(len == xfer_tensor_wire_req_len(&req), "packed length");
    if (xfer_tensor_wire_unpack_req(buf, len, MAX_KEY, &req2, why, sizeof(why)) == XFER_OK) {
        FUZZ_CHECK((req.addr == req2.addr) && (req.rkey == req2.rkey) &&
                   (req.key_len == req2.key_len) && !memcmp(req2.key, key, req.key_len),
                   "TENSOR_REQUEST changed");
        check_same_meta(&req.expect, &req2.expect);
    } else {
        const xfer_tensor_wire_meta_t *e = &req.expect;
        /* "nothing known" may say nothing else; other metadata must stand on its own */
        int meta_ok = (e->flags & XFER_TENSOR_META_NONE) ?
                      ((e->flags == XFER_TENSOR_META_NONE) && (e->dtype == 0) &&
                       (e->rank == 0) && (e->size == 0)) :
                      (xfer_tensor_wire_unpack_meta(buf + XFER_TENSOR_WIRE_REQ_FIXED,
                                                    xfer_tensor_wire_meta_len(e), &meta2, why,
                                                    sizeof(why)) == XFER_OK);

        FUZZ_CHECK((req.key_len == 0) || (req.key_len > MAX_KEY) || !meta_ok,
                   "a TENSOR_REQUEST with a valid key and metadata refused");
    }

    rereq.addr = fuzz_take(&c, 8);
    rereq.rkey = (uint32_t)fuzz_take(&c, 4);
    len = xfer_tensor_wire_pack_rereq(&rereq, buf);
    FUZZ_CHECK(xfer_tensor_wire_unpack_rereq(buf, len, &rereq2, why, sizeof(why)) == XFER_OK,
               "a packed TENSOR_RE_REQUEST does not parse: %s", why);
    FUZZ_CHECK((rereq.addr == rereq2.addr) && (rereq.rkey == rereq2.rkey), "RE_REQUEST");

    status = (int32_t)(int8_t)fuzz_take(&c, 1);
    len    = fuzz_take_bytes(&c, reason, sizeof(reason));
    len    = xfer_tensor_wire_pack_err(reason, len, buf);
    if (xfer_tensor_wire_unpack_err(buf, len, status, &err, why, sizeof(why)) == XFER_OK) {
        FUZZ_CHECK((err.reason_len == len - XFER_TENSOR_WIRE_ERR_FIXED) &&
                   !memcmp(err.reason, reason, err.reason_len), "ERROR_STATUS changed");
    } else {
        FUZZ_CHECK((status >= 0) || (status < XFER_ERR_LOWEST), "ERROR_STATUS refused: %s",
                   why);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    round_trip_message(data, size);
    round_trip_values(data, size);
    return 0;
}
