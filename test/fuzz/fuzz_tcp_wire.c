/*
 * The tcp data-path frames (components/tcp/tcp_wire.c): the header and every extension, the
 * endpoint address and the remote key.
 *
 * The whole input is offered as an endpoint address and as a remote key; each that parses is
 * packed again and must parse to the same value (the key: the same bytes). Then the input is
 * read as a stream of frames as the receive state machine reads it - a header, its type's
 * extension, then past its length - and every header and extension that parses is packed
 * again and must come out byte for byte as it went in. Finally the same bytes are read as a
 * recipe for values that are packed and parsed back: parse(pack(x)) == x whenever the parser
 * takes pack(x).
 */
#include "fuzz.h"
#include "../../components/tcp/tcp_wire.h"

#define MAX_MSG (1u << 20)
#define MAX_KEY 64u

static const xfer_tcp_wire_limits_t limits = {MAX_MSG, MAX_KEY};

static void round_trip_addresses(const uint8_t *data, size_t size)
{
    xfer_tcp_wire_ep_addr_t lim = {.lanes = 1}, lim2 = {.lanes = 1};
    xfer_tcp_wire_lane_hello_t hello, hello2;
    xfer_region_key_t rkey, rkey2;
    uint8_t buf[XFER_TCP_WIRE_EP_ADDR_LEN];
    char why[FUZZ_WHY_LEN];

    if (xfer_tcp_wire_unpack_ep_addr(data, size, &lim) == XFER_OK) {
        FUZZ_CHECK((size == 0) || (size == XFER_TCP_WIRE_EP_ADDR_LEN), "%zu-byte address", size);
        FUZZ_CHECK((lim.lanes >= 1) && (lim.lanes <= XFER_TCP_WIRE_LANES_MAX),
                   "%u lanes parsed", lim.lanes);
        xfer_tcp_wire_pack_ep_addr(&lim, buf);
        /* only the canonical encoding parses: reserved bytes are 0 */
        FUZZ_CHECK((size == 0) || (memcmp(buf, data, XFER_TCP_WIRE_EP_ADDR_LEN) == 0),
                   "a non-canonical endpoint address parsed");
        FUZZ_CHECK(xfer_tcp_wire_unpack_ep_addr(buf, XFER_TCP_WIRE_EP_ADDR_LEN, &lim2) ==
                   XFER_OK, "a packed endpoint address does not parse");
        FUZZ_CHECK((lim.limits.max_msg_size == lim2.limits.max_msg_size) &&
                   (lim.limits.max_key_len == lim2.limits.max_key_len) &&
                   (lim.lanes == lim2.lanes) && (lim.lane_port == lim2.lane_port) &&
                   (lim.token == lim2.token) && (lim.flags == lim2.flags),
                   "endpoint address changed");
    }
    if ((size >= XFER_TCP_WIRE_LANE_HELLO_LEN) &&
        (xfer_tcp_wire_unpack_lane_hello(data, &hello, why, sizeof(why)) == XFER_OK)) {
        FUZZ_CHECK((hello.lane >= 1) && (hello.lane < XFER_TCP_WIRE_LANES_MAX), "lane %u",
                   hello.lane);
        xfer_tcp_wire_pack_lane_hello(&hello, buf);
        FUZZ_CHECK(memcmp(buf, data, XFER_TCP_WIRE_LANE_HELLO_LEN) == 0,
                   "a non-canonical lane hello parsed");
        FUZZ_CHECK((xfer_tcp_wire_unpack_lane_hello(buf, &hello2, why, sizeof(why)) ==
                    XFER_OK) && (hello.lane == hello2.lane) && (hello.token == hello2.token),
                   "lane hello changed");
    }
    /* the key a tcp rkey is: the framework's region key */
    if ((size == XFER_REGION_KEY_LEN) && (xfer_region_key_unpack(data, &rkey) == XFER_OK)) {
        xfer_region_t r = {rkey.id, rkey.key, (uint8_t*)(uintptr_t)rkey.addr, rkey.length};

        FUZZ_CHECK(rkey.addr + rkey.length >= rkey.addr, "a wrapping key parsed");
        xfer_region_key_pack(&r, buf);
        FUZZ_CHECK(memcmp(buf, data, XFER_REGION_KEY_LEN) == 0, "remote key changed");
        FUZZ_CHECK(xfer_region_key_unpack(buf, &rkey2) == XFER_OK, "rkey");
    }
}

/* The extension of a frame whose header parsed; ext has at least ext_len(type) bytes. */
static void round_trip_ext(const xfer_tcp_wire_hdr_t *hdr, const uint8_t *ext, size_t avail)
{
    uint8_t buf[XFER_TCP_WIRE_TRESP_EXT_MAX];
    xfer_tcp_wire_tensor_resp_t resp;
    xfer_tcp_wire_tensor_req_t req;
    xfer_tcp_wire_rma_t rma;
    char why[FUZZ_WHY_LEN];
    uint64_t data_len;
    size_t need, ext_len;
    xfer_status_t st;

    switch (hdr->type) {
    case XFER_TCP_WIRE_PUT_REQ:
        if ((avail < XFER_TCP_WIRE_PUT_EXT_LEN) ||
            (xfer_tcp_wire_unpack_put_ext(ext, hdr, &rma, why, sizeof(why)) != XFER_OK)) {
            return;
        }
        FUZZ_CHECK((rma.len <= MAX_MSG) && (rma.addr + rma.len >= rma.addr), "PUT range");
        xfer_tcp_wire_pack_put_ext(&rma, buf);
        FUZZ_CHECK(!memcmp(buf, ext, XFER_TCP_WIRE_PUT_EXT_LEN), "PUT_REQ extension changed");
        break;
    case XFER_TCP_WIRE_GET_REQ:
        if ((avail < XFER_TCP_WIRE_GET_EXT_LEN) ||
            (xfer_tcp_wire_unpack_get_ext(ext, hdr, &limits, &rma, why, sizeof(why)) !=
             XFER_OK)) {
            return;
        }
        FUZZ_CHECK((rma.len <= MAX_MSG) && (rma.addr + rma.len >= rma.addr), "GET range");
        xfer_tcp_wire_pack_get_ext(&rma, buf);
        FUZZ_CHECK(!memcmp(buf, ext, XFER_TCP_WIRE_GET_EXT_LEN), "GET_REQ extension changed");
        break;
    case XFER_TCP_WIRE_TENSOR_REQ:
        if ((avail < XFER_TCP_WIRE_TREQ_EXT_LEN) ||
            (xfer_tcp_wire_unpack_tensor_req_ext(ext, hdr, &limits, &req, why, sizeof(why)) !=
             XFER_OK)) {
            return;
        }
        FUZZ_CHECK(req.key_len <= MAX_KEY, "key of %u bytes", req.key_len);
        xfer_tcp_wire_pack_tensor_req_ext(&req, buf);
        FUZZ_CHECK(!memcmp(buf, ext, XFER_TCP_WIRE_TREQ_EXT_LEN), "TENSOR_REQ changed");
        break;
    case XFER_TCP_WIRE_TENSOR_RESP:
        /* its fixed part first, then as much more as it asks for (its dims, its reason) */
        need = XFER_TCP_WIRE_TRESP_EXT_LEN;
        if (avail < need) {
            return;
        }
        st = xfer_tcp_wire_unpack_tensor_resp_ext(ext, need, hdr, &limits, &resp, &need, why,
                                                  sizeof(why));
        if (st == XFER_INPROGRESS) {
            FUZZ_CHECK((need > XFER_TCP_WIRE_TRESP_EXT_LEN) && (need <= hdr->length),
                       "TENSOR_RESP asked for %zu bytes", need);
            if (avail < need) {
                return;
            }
            st = xfer_tcp_wire_unpack_tensor_resp_ext(ext, need, hdr, &limits, &resp, &need,
                                                      why, sizeof(why));
            FUZZ_CHECK(st != XFER_INPROGRESS, "TENSOR_RESP asked twice for more");
        }
        if (st != XFER_OK) {
            return;
        }
        data_len = xfer_tensor_wire_data_len(&resp.meta);
        ext_len  = 8 + xfer_tensor_wire_meta_len(&resp.meta);
        FUZZ_CHECK((resp.reason_len <= XFER_TCP_WIRE_MAX_REASON) && (data_len <= MAX_MSG) &&
                   (hdr->length == ext_len + resp.reason_len + data_len),
                   "TENSOR_RESP parts do not add up");
        FUZZ_CHECK(((resp.meta.flags & XFER_TENSOR_META_NONE) != 0) == (hdr->status != 0),
                   "TENSOR_RESP of status %d with a description %s", (int)hdr->status,
                   (resp.meta.flags & XFER_TENSOR_META_NONE) ? "of none" : "of a tensor");
        FUZZ_CHECK((xfer_tcp_wire_pack_tensor_resp_ext(&resp, buf) == ext_len) &&
                   !memcmp(buf, ext, ext_len), "TENSOR_RESP changed");
        break;
    case XFER_TCP_WIRE_PUTV: {
        static uint64_t addr[XFER_TCP_WIRE_PUTV_MAX], len[XFER_TCP_WIRE_PUTV_MAX];
        uint8_t table[XFER_TCP_WIRE_PUTV_DESC_LEN];
        xfer_tcp_wire_putv_t putv;
        uint64_t sum = 0;

        if ((avail < XFER_TCP_WIRE_PUTV_EXT_LEN) ||
            (xfer_tcp_wire_unpack_putv_ext(ext, hdr, &putv, why, sizeof(why)) != XFER_OK)) {
            return;
        }
        FUZZ_CHECK((putv.count >= 1) && (putv.count <= XFER_TCP_WIRE_PUTV_MAX) &&
                   (hdr->length >= XFER_TCP_WIRE_PUTV_EXT_LEN +
                    (uint64_t)putv.count * XFER_TCP_WIRE_PUTV_DESC_LEN), "PUTV count %u",
                   putv.count);
        xfer_tcp_wire_pack_putv_ext(&putv, buf);
        FUZZ_CHECK(!memcmp(buf, ext, XFER_TCP_WIRE_PUTV_EXT_LEN), "PUTV extension changed");
        if ((avail - XFER_TCP_WIRE_PUTV_EXT_LEN <
             (uint64_t)putv.count * XFER_TCP_WIRE_PUTV_DESC_LEN) ||
            (xfer_tcp_wire_unpack_putv_table(ext + XFER_TCP_WIRE_PUTV_EXT_LEN, hdr, putv.count,
                                             addr, len, why, sizeof(why)) != XFER_OK)) {
            return;
        }
        for (uint32_t i = 0; i < putv.count; i++) {
            FUZZ_CHECK(addr[i] + len[i] >= addr[i], "PUTV block %u wraps", i);
            xfer_tcp_wire_pack_putv_desc(table, 0, addr[i], len[i]);
            FUZZ_CHECK(!memcmp(table, ext + XFER_TCP_WIRE_PUTV_EXT_LEN +
                               (size_t)i * XFER_TCP_WIRE_PUTV_DESC_LEN, sizeof(table)),
                       "PUTV block %u changed", i);
            sum += len[i];
        }
        FUZZ_CHECK(sum == hdr->length - XFER_TCP_WIRE_PUTV_EXT_LEN -
                   (uint64_t)putv.count * XFER_TCP_WIRE_PUTV_DESC_LEN,
                   "PUTV blocks do not add up to its data");
        break;
    }
    default:
        break;  /* no extension */
    }
}

static void parse_stream(const uint8_t *data, size_t size)
{
    uint8_t buf[XFER_TCP_WIRE_HDR_LEN];
    char why[FUZZ_WHY_LEN];

    while (size >= XFER_TCP_WIRE_HDR_LEN) {
        xfer_tcp_wire_hdr_t hdr;

        if (xfer_tcp_wire_unpack_hdr(data, &limits, &hdr, why, sizeof(why)) != XFER_OK) {
            return;
        }
        FUZZ_CHECK(strcmp(xfer_tcp_wire_type_name(hdr.type), "unknown") != 0, "type %u",
                   hdr.type);
        xfer_tcp_wire_pack_hdr(&hdr, buf);
        FUZZ_CHECK(!memcmp(buf, data, XFER_TCP_WIRE_HDR_LEN), "header changed");
        data += XFER_TCP_WIRE_HDR_LEN;
        size -= XFER_TCP_WIRE_HDR_LEN;
        round_trip_ext(&hdr, data, size);
        if (hdr.length > size) {
            return;
        }
        data += hdr.length;
        size -= (size_t)hdr.length;
    }
}

static void round_trip_values(const uint8_t *data, size_t size)
{
    fuzz_cursor_t c = {data, size};
    uint8_t buf[XFER_TCP_WIRE_HDR_LEN + XFER_TCP_WIRE_TRESP_EXT_MAX + 256];
    uint8_t *ext = buf + XFER_TCP_WIRE_HDR_LEN;
    size_t need;
    xfer_tcp_wire_hdr_t hdr, hdr2;
    xfer_tcp_wire_rma_t rma, rma2;
    xfer_tcp_wire_tensor_req_t req, req2;
    xfer_tcp_wire_tensor_resp_t resp, resp2;
    xfer_region_key_t rkey, rkey2;
    xfer_tcp_wire_ep_addr_t lim, lim2;
    char why[FUZZ_WHY_LEN];

    memset(&hdr, 0, sizeof(hdr));   /* padding too: the round trip compares whole structs */
    memset(&hdr2, 0, sizeof(hdr2));
    hdr.magic   = XFER_TCP_WIRE_MAGIC;
    hdr.version = XFER_TCP_WIRE_VERSION;
    hdr.type    = (uint8_t)(fuzz_take(&c, 1) % (XFER_TCP_WIRE_TYPE_LAST + 1));
    hdr.status  = (int32_t)fuzz_take(&c, 4);
    hdr.id      = fuzz_take(&c, 8);
    hdr.length  = fuzz_take(&c, 8);
    hdr.striped = (uint8_t)(fuzz_take(&c, 1) % (XFER_TCP_WIRE_LANES_MAX + 1));
    if (hdr.striped) {
        hdr.status = 0;     /* the status field carries the lane count */
    }
    xfer_tcp_wire_pack_hdr(&hdr, buf);
    if (xfer_tcp_wire_unpack_hdr(buf, &limits, &hdr2, why, sizeof(why)) == XFER_OK) {
        FUZZ_CHECK(!memcmp(&hdr, &hdr2, sizeof(hdr)), "header changed");
        FUZZ_CHECK(!hdr.striped || (xfer_tcp_wire_type_stripes(hdr.type) &&
                                    (hdr.striped >= 2)), "%s parsed striped over %u",
                   xfer_tcp_wire_type_name(hdr.type), hdr.striped);
    }
    hdr.striped = 0;

    memset(&rma, 0, sizeof(rma));
    rma.region = fuzz_take(&c, 8);
    rma.cookie = fuzz_take(&c, 8);
    rma.addr   = fuzz_take(&c, 8);
    rma.len    = fuzz_take(&c, 3);
    hdr.type   = XFER_TCP_WIRE_PUT_REQ;
    hdr.status = 0;
    hdr.length = XFER_TCP_WIRE_PUT_EXT_LEN + rma.len;
    xfer_tcp_wire_pack_hdr(&hdr, buf);
    xfer_tcp_wire_pack_put_ext(&rma, ext);
    if ((xfer_tcp_wire_unpack_hdr(buf, &limits, &hdr2, why, sizeof(why)) == XFER_OK) &&
        (xfer_tcp_wire_unpack_put_ext(ext, &hdr2, &rma2, why, sizeof(why)) == XFER_OK)) {
        FUZZ_CHECK(!memcmp(&rma, &rma2, sizeof(rma)), "PUT_REQ changed");
    } else {
        FUZZ_CHECK((rma.len > MAX_MSG) || (rma.addr + rma.len < rma.addr), "PUT_REQ refused");
    }
    hdr.type   = XFER_TCP_WIRE_GET_REQ;
    hdr.length = XFER_TCP_WIRE_GET_EXT_LEN;
    xfer_tcp_wire_pack_hdr(&hdr, buf);
    xfer_tcp_wire_pack_get_ext(&rma, ext);
    if ((xfer_tcp_wire_unpack_hdr(buf, &limits, &hdr2, why, sizeof(why)) == XFER_OK) &&
        (xfer_tcp_wire_unpack_get_ext(ext, &hdr2, &limits, &rma2, why, sizeof(why)) ==
         XFER_OK)) {
        FUZZ_CHECK(!memcmp(&rma, &rma2, sizeof(rma)), "GET_REQ changed");
    } else {
        FUZZ_CHECK((rma.len > MAX_MSG) || (rma.addr + rma.len < rma.addr), "GET_REQ refused");
    }

    req.step    = fuzz_take(&c, 8);
    req.key_len = (uint32_t)fuzz_take(&c, 1);
    hdr.type    = XFER_TCP_WIRE_TENSOR_REQ;
    hdr.length  = XFER_TCP_WIRE_TREQ_EXT_LEN + req.key_len;
    xfer_tcp_wire_pack_hdr(&hdr, buf);
    xfer_tcp_wire_pack_tensor_req_ext(&req, ext);
    if ((xfer_tcp_wire_unpack_hdr(buf, &limits, &hdr2, why, sizeof(why)) == XFER_OK) &&
        (xfer_tcp_wire_unpack_tensor_req_ext(ext, &hdr2, &limits, &req2, why, sizeof(why)) ==
         XFER_OK)) {
        FUZZ_CHECK((req.step == req2.step) && (req.key_len == req2.key_len), "TENSOR_REQ");
    } else {
        FUZZ_CHECK(req.key_len > MAX_KEY, "a %u-byte key refused", req.key_len);
    }

    memset(&resp, 0, sizeof(resp));
    memset(&resp2, 0, sizeof(resp2));
    resp.meta.dtype = (uint32_t)fuzz_take(&c, 1);
    resp.meta.rank  = (uint32_t)(fuzz_take(&c, 1) % (XFER_TENSOR_MAX_RANK + 1));
    resp.meta.flags = (uint32_t)(fuzz_take(&c, 1) % 4);
    resp.reason_len = (uint32_t)fuzz_take(&c, 1);
    for (unsigned i = 0; i < resp.meta.rank; i++) {
        resp.meta.dims[i] = (int64_t)(fuzz_take(&c, 1) % 8);
    }
    resp.meta.size = fuzz_take(&c, 2);
    hdr.type   = XFER_TCP_WIRE_TENSOR_RESP;
    hdr.status = (int32_t)(int8_t)fuzz_take(&c, 1);
    need       = 8 + xfer_tensor_wire_meta_len(&resp.meta) + resp.reason_len;
    hdr.length = need + ((hdr.status == 0) ? xfer_tensor_wire_data_len(&resp.meta) : 0);
    xfer_tcp_wire_pack_hdr(&hdr, buf);
    xfer_tcp_wire_pack_tensor_resp_ext(&resp, ext);
    if ((xfer_tcp_wire_unpack_hdr(buf, &limits, &hdr2, why, sizeof(why)) == XFER_OK) &&
        (xfer_tcp_wire_unpack_tensor_resp_ext(ext, need, &hdr2, &limits, &resp2, &need, why,
                                              sizeof(why)) == XFER_OK)) {
        FUZZ_CHECK(!memcmp(&resp, &resp2, sizeof(resp)), "TENSOR_RESP changed");
    }

    rkey.id     = fuzz_take(&c, 8);
    rkey.key    = fuzz_take(&c, 8);
    rkey.addr   = fuzz_take(&c, 8);
    rkey.length = fuzz_take(&c, 8);
    xfer_region_key_pack(&(xfer_region_t){rkey.id, rkey.key, (uint8_t*)(uintptr_t)rkey.addr,
                                          rkey.length}, buf);
    if (xfer_region_key_unpack(buf, &rkey2) == XFER_OK) {
        FUZZ_CHECK(!memcmp(&rkey, &rkey2, sizeof(rkey)), "rkey changed");
    } else {
        FUZZ_CHECK(rkey.addr + rkey.length < rkey.addr, "a key that does not wrap refused");
    }

    lim.limits.max_key_len  = (uint32_t)fuzz_take(&c, 4);
    lim.limits.max_msg_size = fuzz_take(&c, 8);
    lim.lanes               = (uint8_t)(1 + fuzz_take(&c, 1) % XFER_TCP_WIRE_LANES_MAX);
    lim.lane_port           = (uint16_t)(1 + fuzz_take(&c, 2) % 65535);
    lim.token               = fuzz_take(&c, 8);
    lim.flags               = (uint8_t)(fuzz_take(&c, 1) & XFER_TCP_WIRE_ADDR_TLS);
    xfer_tcp_wire_pack_ep_addr(&lim, buf);
    FUZZ_CHECK(xfer_tcp_wire_unpack_ep_addr(buf, XFER_TCP_WIRE_EP_ADDR_LEN, &lim2) == XFER_OK,
               "a packed endpoint address does not parse");
    FUZZ_CHECK((lim.limits.max_key_len == lim2.limits.max_key_len) &&
               (lim.limits.max_msg_size == lim2.limits.max_msg_size) &&
               (lim.lanes == lim2.lanes) && (lim.lane_port == lim2.lane_port) &&
               (lim.token == lim2.token) && (lim.flags == lim2.flags),
               "endpoint address changed");

    /* every share of a striped length is inside it, and together they cover it once */
    {
        uint64_t len = fuzz_take(&c, 4), at = 0;
        unsigned n   = 1 + (unsigned)(fuzz_take(&c, 1) % XFER_TCP_WIRE_LANES_MAX);
        uint64_t off0, len0;

        xfer_tcp_wire_stripe(len, n, 0, &off0, &len0);
        FUZZ_CHECK((off0 == 0) && (len0 <= len), "share 0 of %llu: %llu+%llu",
                   (unsigned long long)len, (unsigned long long)off0, (unsigned long long)len0);
        at = len0;
        for (unsigned i = 1; i < n; i++) {
            uint64_t off, l;

            xfer_tcp_wire_stripe(len, n, i, &off, &l);
            FUZZ_CHECK(off == at, "share %u of %llu starts at %llu, not %llu", i,
                       (unsigned long long)len, (unsigned long long)off,
                       (unsigned long long)at);
            at += l;
        }
        FUZZ_CHECK(at == len, "shares of %llu cover %llu", (unsigned long long)len,
                   (unsigned long long)at);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    round_trip_addresses(data, size);
    parse_stream(data, size);
    round_trip_values(data, size);
    return 0;
}
