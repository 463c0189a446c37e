/*
 * The verbs messages and addresses (components/verbs/verbs_wire.c): the header of every type
 * (with what the receive path hands the tensor parsers), the iface and endpoint addresses a
 * peer sends through the bootstrap, and the remote key.
 *
 * The whole input is offered as one received message (its length is what the completion
 * says), as an iface address, as an endpoint address and as a remote key. What parses is
 * packed again and must parse to the same value; a message's extension goes to the parser its
 * type's receiver calls. Then the bytes are read as a recipe for headers and addresses that
 * are packed and parsed back: parse(pack(x)) == x whenever the parser takes pack(x).
 */
#include "fuzz.h"
#include "../../components/verbs/verbs_wire.h"
#include "../../components/verbs/tensor_wire.h"

#define MAX_KEY 64u
#define MSG_MAX 4096u

static uint8_t msg[MSG_MAX];

static void check_same_hdr(const xfer_verbs_wire_hdr_t *a, const xfer_verbs_wire_hdr_t *b)
{
    FUZZ_CHECK((a->version == b->version) && (a->type == b->type) &&
               (a->credits == b->credits) && (a->status == b->status) &&
               (a->length == b->length) && (a->id == b->id) && (a->tag == b->tag) &&
               (a->size == b->size), "%s header changed", xfer_verbs_msg_name(a->type));
}

static void check_same_ep_addr(const xfer_verbs_wire_ep_addr_t *a,
                               const xfer_verbs_wire_ep_addr_t *b)
{
    FUZZ_CHECK((a->qpn == b->qpn) && (a->psn == b->psn) && (a->rx_slots == b->rx_slots) &&
               (a->seg_size == b->seg_size) && (a->max_msg_size == b->max_msg_size) &&
               (a->max_key_len == b->max_key_len) && (a->max_rd_atomic == b->max_rd_atomic) &&
               (a->ka_addr == b->ka_addr) && (a->ka_rkey == b->ka_rkey) &&
               (a->rdma_chunk == b->rdma_chunk),
               "endpoint address changed");
}

/* What the receive path does with a message whose header parsed. */
static void parse_ext(const xfer_verbs_wire_hdr_t *hdr, const uint8_t *ext)
{
    xfer_tensor_wire_rereq_t rereq;
    xfer_tensor_wire_meta_t meta;
    xfer_tensor_wire_req_t req;
    xfer_tensor_wire_err_t err;
    xfer_verbs_wire_rts_t rts, rts2;
    char why[FUZZ_WHY_LEN];
    uint8_t buf[XFER_VERBS_WIRE_RTS_LEN];

    switch (hdr->type) {
    case XFER_VERBS_MSG_RTS:
        FUZZ_CHECK(hdr->length == XFER_VERBS_WIRE_RTS_LEN, "RTS of %u bytes", hdr->length);
        xfer_verbs_wire_unpack_rts(ext, &rts);
        xfer_verbs_wire_pack_rts(&rts, buf);
        FUZZ_CHECK(memcmp(buf, ext, XFER_VERBS_WIRE_RTS_LEN) == 0, "a non-canonical RTS parsed");
        xfer_verbs_wire_unpack_rts(buf, &rts2);
        FUZZ_CHECK((rts.addr == rts2.addr) && (rts.rkey == rts2.rkey), "RTS changed");
        break;
    case XFER_VERBS_MSG_TENSOR_REQUEST:
        if (xfer_tensor_wire_unpack_req(ext, hdr->length, MAX_KEY, &req, why, sizeof(why)) ==
            XFER_OK) {
            FUZZ_CHECK((req.key >= ext) && (req.key + req.key_len == ext + hdr->length),
                       "the key is not the end of the message");
        }
        break;
    case XFER_VERBS_MSG_META_DATA_UPDATE:
        if (xfer_tensor_wire_unpack_meta(ext, hdr->length, &meta, why, sizeof(why)) ==
            XFER_OK) {
            FUZZ_CHECK(xfer_tensor_wire_meta_len(&meta) == hdr->length, "meta length");
        }
        break;
    case XFER_VERBS_MSG_TENSOR_RE_REQUEST:
        xfer_tensor_wire_unpack_rereq(ext, hdr->length, &rereq, why, sizeof(why));
        break;
    case XFER_VERBS_MSG_ERROR_STATUS:
        if (xfer_tensor_wire_unpack_err(ext, hdr->length, hdr->status, &err, why,
                                        sizeof(why)) == XFER_OK) {
            FUZZ_CHECK(err.reason + err.reason_len == (const char*)ext + hdr->length,
                       "the reason is not the end of the message");
        }
        break;
    default:
        break;
    }
}

static void parse_message(const uint8_t *data, size_t size)
{
    xfer_verbs_wire_hdr_t hdr, hdr2;
    char why[FUZZ_WHY_LEN];
    size_t hdr_len, len;

    if (xfer_verbs_wire_unpack_hdr(data, size, &hdr, why, sizeof(why)) != XFER_OK) {
        return;
    }
    hdr_len = xfer_verbs_wire_hdr_len(hdr.type);
    FUZZ_CHECK((hdr.version == XFER_VERBS_WIRE_VERSION) && (hdr.type > 0) &&
               (hdr.type < XFER_VERBS_MSG_LAST) && (hdr_len + hdr.length == size),
               "a %zu-byte message of type %u parsed with length %u", size, hdr.type,
               hdr.length);
    parse_ext(&hdr, data + hdr_len);
    if (size > sizeof(msg)) {
        return;
    }
    len = xfer_verbs_wire_pack_hdr(&hdr, msg);
    FUZZ_CHECK(len == hdr_len, "packed a %zu-byte header, parsed %zu", len, hdr_len);
    /* only the canonical encoding parses: reserved bytes are 0 */
    FUZZ_CHECK(memcmp(msg, data, len) == 0, "a non-canonical %s header parsed",
               xfer_verbs_msg_name(hdr.type));
    memcpy(msg + len, data + len, size - len);
    FUZZ_CHECK(xfer_verbs_wire_unpack_hdr(msg, size, &hdr2, why, sizeof(why)) == XFER_OK,
               "a packed header does not parse: %s", why);
    check_same_hdr(&hdr, &hdr2);
}

static void round_trip_addresses(const uint8_t *data, size_t size)
{
    xfer_verbs_wire_iface_addr_t ia, ia2;
    xfer_verbs_wire_ep_addr_t ea, ea2;
    xfer_verbs_wire_rkey_t k, k2;
    uint8_t buf[XFER_VERBS_WIRE_EP_ADDR_LEN];
    char why[FUZZ_WHY_LEN];

    if (xfer_verbs_wire_unpack_iface_addr(data, size, &ia) == XFER_OK) {
        xfer_verbs_wire_pack_iface_addr(&ia, buf);
        FUZZ_CHECK(memcmp(buf, data, XFER_VERBS_WIRE_IFACE_ADDR_LEN) == 0,
                   "a non-canonical iface address parsed");
        FUZZ_CHECK(xfer_verbs_wire_unpack_iface_addr(buf, XFER_VERBS_WIRE_IFACE_ADDR_LEN,
                                                     &ia2) == XFER_OK, "iface address");
        FUZZ_CHECK(!memcmp(ia.gid, ia2.gid, 16) && (ia.lid == ia2.lid) &&
                   (ia.port == ia2.port) && (ia.link_layer == ia2.link_layer) &&
                   (ia.active_mtu == ia2.active_mtu) && (ia.gid_index == ia2.gid_index) &&
                   (ia.subnet_prefix == ia2.subnet_prefix), "iface address changed");
    }
    if (xfer_verbs_wire_unpack_ep_addr(data, size, &ea, why, sizeof(why)) == XFER_OK) {
        xfer_verbs_wire_pack_ep_addr(&ea, buf);
        FUZZ_CHECK(memcmp(buf, data, XFER_VERBS_WIRE_EP_ADDR_LEN) == 0,
                   "a non-canonical endpoint address parsed");
        FUZZ_CHECK(xfer_verbs_wire_unpack_ep_addr(buf, XFER_VERBS_WIRE_EP_ADDR_LEN, &ea2, why,
                                                  sizeof(why)) == XFER_OK, "ep address");
        check_same_ep_addr(&ea, &ea2);
    }
    if (xfer_verbs_wire_unpack_rkey(data, size, &k) == XFER_OK) {
        xfer_verbs_wire_pack_rkey(&k, buf);
        FUZZ_CHECK(!memcmp(buf, data, XFER_VERBS_WIRE_RKEY_LEN), "remote key changed");
        FUZZ_CHECK(xfer_verbs_wire_unpack_rkey(buf, XFER_VERBS_WIRE_RKEY_LEN, &k2) == XFER_OK,
                   "a packed remote key does not parse");
    }
}

static void round_trip_values(const uint8_t *data, size_t size)
{
    fuzz_cursor_t c = {data, size};
    xfer_verbs_wire_hdr_t hdr, hdr2;
    xfer_verbs_wire_ep_addr_t ea, ea2;
    xfer_verbs_wire_rkey_t k, k2;
    uint8_t buf[XFER_VERBS_WIRE_HDR_LEN + 256];
    char why[FUZZ_WHY_LEN];
    size_t len;

    memset(&hdr, 0, sizeof(hdr));
    hdr.version = XFER_VERBS_WIRE_VERSION;
    hdr.type    = (uint8_t)(fuzz_take(&c, 1) % (XFER_VERBS_MSG_LAST + 1));
    hdr.credits = (uint16_t)fuzz_take(&c, 2);
    hdr.status  = (int32_t)fuzz_take(&c, 4);
    hdr.length  = (uint32_t)fuzz_take(&c, 1);
    hdr.id      = fuzz_take(&c, 8);
    hdr.tag     = fuzz_take(&c, 8);
    hdr.size    = fuzz_take(&c, 8);
    len = xfer_verbs_wire_pack_hdr(&hdr, buf);
    memset(buf + len, 0, hdr.length);
    if (xfer_verbs_wire_unpack_hdr(buf, len + hdr.length, &hdr2, why, sizeof(why)) ==
        XFER_OK) {
        /* what the short headers do not carry comes from the completion */
        if (hdr.type == XFER_VERBS_MSG_TAG) {
            hdr.status = 0;
            hdr.id     = 0;
            hdr.size   = hdr.length;
        } else if (hdr.type == XFER_VERBS_MSG_TENSOR_REQUEST) {
            hdr.status = 0;
            hdr.size   = 0;
        }
        check_same_hdr(&hdr, &hdr2);
    }

    memset(&ea, 0, sizeof(ea));
    ea.qpn           = (uint32_t)fuzz_take(&c, 3);
    ea.psn           = (uint32_t)fuzz_take(&c, 3);
    ea.rx_slots      = (uint32_t)fuzz_take(&c, 3);
    ea.seg_size      = (uint32_t)fuzz_take(&c, 3);
    ea.max_msg_size  = fuzz_take(&c, 8);
    ea.max_key_len   = (uint32_t)fuzz_take(&c, 4);
    ea.max_rd_atomic = (uint32_t)fuzz_take(&c, 1);
    ea.ka_addr       = fuzz_take(&c, 8);
    ea.ka_rkey       = (uint32_t)fuzz_take(&c, 4);
    ea.rdma_chunk    = (uint32_t)fuzz_take(&c, 4);
    xfer_verbs_wire_pack_ep_addr(&ea, buf);
    if (xfer_verbs_wire_unpack_ep_addr(buf, XFER_VERBS_WIRE_EP_ADDR_LEN, &ea2, why,
                                       sizeof(why)) == XFER_OK) {
        check_same_ep_addr(&ea, &ea2);
    }

    k.rkey   = (uint32_t)fuzz_take(&c, 4);
    k.addr   = fuzz_take(&c, 8);
    k.length = fuzz_take(&c, 8);
    xfer_verbs_wire_pack_rkey(&k, buf);
    if (xfer_verbs_wire_unpack_rkey(buf, XFER_VERBS_WIRE_RKEY_LEN, &k2) == XFER_OK) {
        FUZZ_CHECK((k.rkey == k2.rkey) && (k.addr == k2.addr) && (k.length == k2.length),
                   "remote key changed");
    } else {
        FUZZ_CHECK(k.addr + k.length < k.addr, "a key that does not wrap refused");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    parse_message(data, size);
    round_trip_addresses(data, size);
    round_trip_values(data, size);
    return 0;
}
