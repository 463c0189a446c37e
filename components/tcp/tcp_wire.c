/*
 * Packing and validating parsing of the tcp data-path frames described in tcp_wire.h. Pure
 * functions of their arguments, so that tests can build (hostile) frames with them.
 */
#include "tcp_wire.h"

#include <xfer/byteorder.h>
#include <xfer/component.h>

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

const char *xfer_tcp_wire_type_name(unsigned type)
{
    static const char *const names[] = {
        [XFER_TCP_WIRE_TAG]           = "TAG",
        [XFER_TCP_WIRE_PUT_REQ]       = "PUT_REQ",
        [XFER_TCP_WIRE_PUT_ACK]       = "PUT_ACK",
        [XFER_TCP_WIRE_GET_REQ]       = "GET_REQ",
        [XFER_TCP_WIRE_GET_RESP]      = "GET_RESP",
        [XFER_TCP_WIRE_TENSOR_REQ]    = "TENSOR_REQ",
        [XFER_TCP_WIRE_TENSOR_RESP]   = "TENSOR_RESP",
        [XFER_TCP_WIRE_TENSOR_CANCEL] = "TENSOR_CANCEL",
        [XFER_TCP_WIRE_PUT]           = "PUT",
        [XFER_TCP_WIRE_PUT_FAIL]      = "PUT_FAIL",
        [XFER_TCP_WIRE_FLUSH_REQ]     = "FLUSH_REQ",
        [XFER_TCP_WIRE_FLUSH_ACK]     = "FLUSH_ACK",
        [XFER_TCP_WIRE_BATCH_END]     = "BATCH_END",
        [XFER_TCP_WIRE_BATCH_ACK]     = "BATCH_ACK",
        [XFER_TCP_WIRE_PUTV]          = "PUTV",
        [XFER_TCP_WIRE_BYE]           = "BYE",
    };

    if ((type == 0) || (type >= XFER_TCP_WIRE_TYPE_LAST)) {
        return "unknown";
    }
    return names[type];
}

void xfer_tcp_wire_pack_hdr(const xfer_tcp_wire_hdr_t *hdr, void *buf)
{
    uint8_t *p = buf;

    xfer_put_le16(p, hdr->magic);
    p[2] = hdr->version;
    p[3] = (uint8_t)(hdr->type | (hdr->striped ? XFER_TCP_WIRE_STRIPED : 0));
    /* a striped frame's status field says over how many lanes (its status is 0) */
    xfer_put_le32(p + 4, hdr->striped ? (uint32_t)hdr->striped : (uint32_t)hdr->status);
    xfer_put_le64(p + 8, hdr->id);
    xfer_put_le64(p + 16, hdr->length);
}

void xfer_tcp_wire_pack_put_ext(const xfer_tcp_wire_rma_t *rma, void *buf)
{
    uint8_t *p = buf;

    xfer_put_le64(p, rma->region);
    xfer_put_le64(p + 8, rma->cookie);
    xfer_put_le64(p + 16, rma->addr);
}

void xfer_tcp_wire_pack_putv_ext(const xfer_tcp_wire_putv_t *putv, void *buf)
{
    uint8_t *p = buf;

    xfer_put_le64(p, putv->region);
    xfer_put_le64(p + 8, putv->cookie);
    xfer_put_le32(p + 16, putv->count);
    xfer_put_le32(p + 20, 0);
}

void xfer_tcp_wire_pack_putv_desc(void *table, uint32_t i, uint64_t addr, uint64_t len)
{
    uint8_t *p = (uint8_t*)table + (size_t)i * XFER_TCP_WIRE_PUTV_DESC_LEN;

    xfer_put_le64(p, addr);
    xfer_put_le64(p + 8, len);
}

void xfer_tcp_wire_pack_get_ext(const xfer_tcp_wire_rma_t *rma, void *buf)
{
    xfer_tcp_wire_pack_put_ext(rma, buf);
    xfer_put_le64((uint8_t*)buf + 24, rma->len);
}

void xfer_tcp_wire_pack_tensor_req_ext(const xfer_tcp_wire_tensor_req_t *req, void *buf)
{
    uint8_t *p = buf;

    xfer_put_le64(p, req->step);
    xfer_put_le32(p + 8, req->key_len);
    xfer_put_le32(p + 12, 0);
}

size_t xfer_tcp_wire_pack_tensor_resp_ext(const xfer_tcp_wire_tensor_resp_t *resp, void *buf)
{
    uint8_t *p = buf;

    xfer_put_le32(p, resp->reason_len);
    xfer_put_le32(p + 4, 0);
    return 8 + xfer_tensor_wire_pack_meta(&resp->meta, p + 8);
}

void xfer_tcp_wire_pack_ep_addr(const xfer_tcp_wire_ep_addr_t *addr, void *buf)
{
    uint8_t *p = buf;

    memset(p, 0, XFER_TCP_WIRE_EP_ADDR_LEN);
    xfer_put_le16(p, XFER_TCP_WIRE_MAGIC);
    p[2] = XFER_TCP_WIRE_VERSION;
    p[3] = addr->lanes;
    xfer_put_le32(p + 4, addr->limits.max_key_len);
    xfer_put_le64(p + 8, addr->limits.max_msg_size);
    xfer_put_le16(p + 16, addr->lane_port);
    p[18] = addr->flags;
    xfer_put_le64(p + 24, addr->token);
}

void xfer_tcp_wire_pack_lane_hello(const xfer_tcp_wire_lane_hello_t *hello, void *buf)
{
    uint8_t *p = buf;

    memset(p, 0, XFER_TCP_WIRE_LANE_HELLO_LEN);
    xfer_put_le16(p, hello->proven ? XFER_TCP_WIRE_LANE_PROVEN_MAGIC : XFER_TCP_WIRE_LANE_MAGIC);
    p[2] = XFER_TCP_WIRE_VERSION;
    p[3] = hello->lane;
    xfer_put_le64(p + 8, hello->token);
}

int xfer_tcp_wire_type_stripes(unsigned type)
{
    return (type == XFER_TCP_WIRE_TAG) || (type == XFER_TCP_WIRE_PUT_REQ) ||
           (type == XFER_TCP_WIRE_PUT) || (type == XFER_TCP_WIRE_TENSOR_RESP);
}

void xfer_tcp_wire_stripe(uint64_t len, unsigned lanes, unsigned i, uint64_t *off_p,
                          uint64_t *len_p)
{
    uint64_t share = (lanes > 1) ? (len / lanes) & ~(uint64_t)4095 : 0;
    uint64_t first = len - share * (lanes - 1);

    *off_p = (i == 0) ? 0 : first + share * (i - 1);
    *len_p = (i == 0) ? first : share;
}

static int status_is_valid(int32_t status)
{
    return (status == XFER_OK) || ((status < 0) && (status >= XFER_ERR_LOWEST));
}

static int type_is_response(unsigned type)
{
    return (type == XFER_TCP_WIRE_PUT_ACK) || (type == XFER_TCP_WIRE_GET_RESP) ||
           (type == XFER_TCP_WIRE_TENSOR_RESP) || (type == XFER_TCP_WIRE_PUT_FAIL) ||
           (type == XFER_TCP_WIRE_FLUSH_ACK) || (type == XFER_TCP_WIRE_BATCH_ACK);
}

/* Does the frame's length fit its type and the limits? */
static int length_is_valid(const xfer_tcp_wire_hdr_t *hdr, const xfer_tcp_wire_limits_t *lim)
{
    uint64_t len = hdr->length;

    switch (hdr->type) {
    case XFER_TCP_WIRE_TAG:
        return len <= lim->max_msg_size;
    case XFER_TCP_WIRE_PUT_REQ:
    case XFER_TCP_WIRE_PUT:
        return (len >= XFER_TCP_WIRE_PUT_EXT_LEN) &&
               (len - XFER_TCP_WIRE_PUT_EXT_LEN <= lim->max_msg_size);
    case XFER_TCP_WIRE_GET_REQ:
        return len == XFER_TCP_WIRE_GET_EXT_LEN;
    case XFER_TCP_WIRE_GET_RESP:
        return (len <= lim->max_msg_size) && ((hdr->status == XFER_OK) || (len == 0));
    case XFER_TCP_WIRE_TENSOR_REQ:
        return (len >= XFER_TCP_WIRE_TREQ_EXT_LEN) &&
               (len - XFER_TCP_WIRE_TREQ_EXT_LEN <= lim->max_key_len);
    case XFER_TCP_WIRE_TENSOR_RESP:
        /* dims, reason and data are told apart by the extension; bound their sum here */
        if (len < XFER_TCP_WIRE_TRESP_EXT_LEN) {
            return 0;
        }
        len -= XFER_TCP_WIRE_TRESP_EXT_LEN;
        return (len <= lim->max_msg_size) ||
               (len - lim->max_msg_size <= XFER_TCP_WIRE_MAX_REASON + 8u * XFER_TENSOR_MAX_RANK);
    case XFER_TCP_WIRE_BATCH_END:
        return (len >= XFER_TCP_WIRE_BATCH_EXT_LEN) &&
               (len - XFER_TCP_WIRE_BATCH_EXT_LEN <= XFER_TCP_WIRE_MAX_NOTIFY);
    case XFER_TCP_WIRE_BATCH_ACK:
        return len == XFER_TCP_WIRE_BATCH_ACK_LEN;
    case XFER_TCP_WIRE_PUTV:
        /* the table's size is checked with its count (unpack_putv_ext) */
        return (len >= XFER_TCP_WIRE_PUTV_EXT_LEN + XFER_TCP_WIRE_PUTV_DESC_LEN) &&
               (len - XFER_TCP_WIRE_PUTV_EXT_LEN <= lim->max_msg_size +
                (uint64_t)XFER_TCP_WIRE_PUTV_MAX * XFER_TCP_WIRE_PUTV_DESC_LEN);
    default: /* PUT_ACK, TENSOR_CANCEL, PUT_FAIL, FLUSH_REQ, FLUSH_ACK */
        return len == 0;
    }
}

xfer_status_t xfer_tcp_wire_unpack_hdr(const void *buf, const xfer_tcp_wire_limits_t *limits,
                                       xfer_tcp_wire_hdr_t *hdr, char *why, size_t why_size)
{
    const uint8_t *p = buf;

    hdr->magic   = xfer_get_le16(p);
    hdr->version = p[2];
    hdr->type    = p[3] & ~XFER_TCP_WIRE_STRIPED;
    hdr->striped = (p[3] & XFER_TCP_WIRE_STRIPED) ? 1 : 0;
    hdr->status  = (int32_t)xfer_get_le32(p + 4);
    hdr->id      = xfer_get_le64(p + 8);
    hdr->length  = xfer_get_le64(p + 16);

    if (hdr->magic != XFER_TCP_WIRE_MAGIC) {
        snprintf(why, why_size, "wrong magic 0x%04x (expected 0x%04x)", hdr->magic,
                 XFER_TCP_WIRE_MAGIC);
        return XFER_ERR_PROTOCOL;
    }
    if (hdr->version != XFER_TCP_WIRE_VERSION) {
        snprintf(why, why_size, "peer speaks tcp protocol version %u, this side speaks %u",
                 hdr->version, XFER_TCP_WIRE_VERSION);
        return XFER_ERR_PROTOCOL;
    }
    if ((hdr->type == 0) || (hdr->type >= XFER_TCP_WIRE_TYPE_LAST)) {
        snprintf(why, why_size, "unknown frame type %u", hdr->type);
        return XFER_ERR_PROTOCOL;
    }
    if (hdr->striped) {
        if (!xfer_tcp_wire_type_stripes(hdr->type) || (hdr->status < 2) ||
            (hdr->status > (int32_t)XFER_TCP_WIRE_LANES_MAX)) {
            snprintf(why, why_size, "%s frame striped over %" PRId32 " lanes",
                     xfer_tcp_wire_type_name(hdr->type), hdr->status);
            return XFER_ERR_PROTOCOL;
        }
        hdr->striped = (uint8_t)hdr->status;
        hdr->status  = 0;
    }
    if ((type_is_response(hdr->type) ? !status_is_valid(hdr->status) : (hdr->status != 0)) ||
        ((hdr->type == XFER_TCP_WIRE_PUT_FAIL) && (hdr->status == XFER_OK))) {
        snprintf(why, why_size, "%s frame carries status %" PRId32 ", which is not valid there",
                 xfer_tcp_wire_type_name(hdr->type), hdr->status);
        return XFER_ERR_PROTOCOL;
    }
    if ((hdr->type == XFER_TCP_WIRE_BYE) && (hdr->id != 0)) {
        snprintf(why, why_size, "BYE frame carries id %" PRIu64 " where 0 is reserved",
                 hdr->id);
        return XFER_ERR_PROTOCOL;
    }
    if (!length_is_valid(hdr, limits)) {
        snprintf(why, why_size, "%s frame length %" PRIu64 " is outside its bounds (message "
                 "limit %" PRIu64 ", key limit %" PRIu32 ")", xfer_tcp_wire_type_name(hdr->type),
                 hdr->length, limits->max_msg_size, limits->max_key_len);
        return XFER_ERR_PROTOCOL;
    }
    return XFER_OK;
}

xfer_status_t xfer_tcp_wire_unpack_put_ext(const void *buf, const xfer_tcp_wire_hdr_t *hdr,
                                           xfer_tcp_wire_rma_t *rma, char *why,
                                           size_t why_size)
{
    const uint8_t *p = buf;

    rma->region = xfer_get_le64(p);
    rma->cookie = xfer_get_le64(p + 8);
    rma->addr   = xfer_get_le64(p + 16);
    rma->len    = hdr->length - XFER_TCP_WIRE_PUT_EXT_LEN;
    if (rma->addr + rma->len < rma->addr) {
        snprintf(why, why_size, "%s range 0x%" PRIx64 "+%" PRIu64 " wraps around",
                 xfer_tcp_wire_type_name(hdr->type), rma->addr, rma->len);
        return XFER_ERR_PROTOCOL;
    }
    return XFER_OK;
}

xfer_status_t xfer_tcp_wire_unpack_putv_ext(const void *buf, const xfer_tcp_wire_hdr_t *hdr,
                                            xfer_tcp_wire_putv_t *putv, char *why,
                                            size_t why_size)
{
    const uint8_t *p = buf;
    uint32_t reserved;

    putv->region = xfer_get_le64(p);
    putv->cookie = xfer_get_le64(p + 8);
    putv->count  = xfer_get_le32(p + 16);
    reserved     = xfer_get_le32(p + 20);
    if ((putv->count == 0) || (putv->count > XFER_TCP_WIRE_PUTV_MAX) || (reserved != 0)) {
        snprintf(why, why_size, "PUTV of %" PRIu32 " blocks (1 to %u; reserved %" PRIu32 ")",
                 putv->count, XFER_TCP_WIRE_PUTV_MAX, reserved);
        return XFER_ERR_PROTOCOL;
    }
    if (hdr->length - XFER_TCP_WIRE_PUTV_EXT_LEN <
        (uint64_t)putv->count * XFER_TCP_WIRE_PUTV_DESC_LEN) {
        snprintf(why, why_size, "PUTV of %" PRIu32 " blocks in a frame of %" PRIu64 " bytes",
                 putv->count, hdr->length);
        return XFER_ERR_PROTOCOL;
    }
    return XFER_OK;
}

xfer_status_t xfer_tcp_wire_unpack_putv_table(const void *table, const xfer_tcp_wire_hdr_t *hdr,
                                              uint32_t count, uint64_t *addr, uint64_t *len,
                                              char *why, size_t why_size)
{
    const uint8_t *p = table;
    uint64_t data    = hdr->length - XFER_TCP_WIRE_PUTV_EXT_LEN -
                       (uint64_t)count * XFER_TCP_WIRE_PUTV_DESC_LEN;
    uint64_t sum     = 0;

    for (uint32_t i = 0; i < count; i++, p += XFER_TCP_WIRE_PUTV_DESC_LEN) {
        addr[i] = xfer_get_le64(p);
        len[i]  = xfer_get_le64(p + 8);
        if ((addr[i] + len[i] < addr[i]) || (len[i] > data - sum)) {
            snprintf(why, why_size, "PUTV block %" PRIu32 " (0x%" PRIx64 "+%" PRIu64 ") wraps "
                     "around or overruns the frame's %" PRIu64 " bytes of data", i, addr[i],
                     len[i], data);
            return XFER_ERR_PROTOCOL;
        }
        sum += len[i];
    }
    if (sum != data) {
        snprintf(why, why_size, "PUTV blocks of %" PRIu64 " bytes in all, in a frame carrying "
                 "%" PRIu64, sum, data);
        return XFER_ERR_PROTOCOL;
    }
    return XFER_OK;
}

xfer_status_t xfer_tcp_wire_unpack_get_ext(const void *buf, const xfer_tcp_wire_hdr_t *hdr,
                                           const xfer_tcp_wire_limits_t *limits,
                                           xfer_tcp_wire_rma_t *rma, char *why,
                                           size_t why_size)
{
    const uint8_t *p = buf;

    (void)hdr;
    rma->region = xfer_get_le64(p);
    rma->cookie = xfer_get_le64(p + 8);
    rma->addr   = xfer_get_le64(p + 16);
    rma->len    = xfer_get_le64(p + 24);
    if (rma->len > limits->max_msg_size) {
        snprintf(why, why_size, "GET_REQ asks for %" PRIu64 " bytes, the limit is %" PRIu64,
                 rma->len, limits->max_msg_size);
        return XFER_ERR_PROTOCOL;
    }
    if (rma->addr + rma->len < rma->addr) {
        snprintf(why, why_size, "GET_REQ range 0x%" PRIx64 "+%" PRIu64 " wraps around",
                 rma->addr, rma->len);
        return XFER_ERR_PROTOCOL;
    }
    return XFER_OK;
}

xfer_status_t xfer_tcp_wire_unpack_tensor_req_ext(const void *buf,
                                                  const xfer_tcp_wire_hdr_t *hdr,
                                                  const xfer_tcp_wire_limits_t *limits,
                                                  xfer_tcp_wire_tensor_req_t *req, char *why,
                                                  size_t why_size)
{
    const uint8_t *p = buf;

    req->step    = xfer_get_le64(p);
    req->key_len = xfer_get_le32(p + 8);
    if ((req->key_len > limits->max_key_len) ||
        (hdr->length != XFER_TCP_WIRE_TREQ_EXT_LEN + (uint64_t)req->key_len)) {
        snprintf(why, why_size, "TENSOR_REQ key of %" PRIu32 " bytes does not match the frame "
                 "length %" PRIu64 " or exceeds the limit of %" PRIu32, req->key_len,
                 hdr->length, limits->max_key_len);
        return XFER_ERR_PROTOCOL;
    }
    if (xfer_get_le32(p + 12) != 0) {
        snprintf(why, why_size, "TENSOR_REQ reserved field is not zero");
        return XFER_ERR_PROTOCOL;
    }
    return XFER_OK;
}

xfer_status_t xfer_tcp_wire_unpack_tensor_resp_ext(const void *buf, size_t len,
                                                   const xfer_tcp_wire_hdr_t *hdr,
                                                   const xfer_tcp_wire_limits_t *limits,
                                                   xfer_tcp_wire_tensor_resp_t *resp,
                                                   size_t *need_p, char *why, size_t why_size)
{
    const uint8_t *p = buf;
    unsigned rank    = p[8 + 9];
    size_t meta_len, need;
    uint64_t data_len;

    resp->reason_len = xfer_get_le32(p);
    if ((xfer_get_le32(p + 4) != 0) || (rank > XFER_TENSOR_MAX_RANK) ||
        (resp->reason_len > ((hdr->status == XFER_OK) ? 0 : XFER_TCP_WIRE_MAX_REASON))) {
        snprintf(why, why_size, "TENSOR_RESP with a reserved word set, rank %u or a reason of "
                 "%" PRIu32 " bytes (status %" PRId32 ")", rank, resp->reason_len,
                 hdr->status);
        return XFER_ERR_PROTOCOL;
    }
    need = XFER_TCP_WIRE_TRESP_EXT_LEN + 8u * rank + resp->reason_len;
    if (len < need) {
        if (need > hdr->length) {
            snprintf(why, why_size, "TENSOR_RESP of %" PRIu64 " bytes shorter than its "
                     "extension (%zu)", hdr->length, need);
            return XFER_ERR_PROTOCOL;
        }
        *need_p = need;
        return XFER_INPROGRESS;
    }
    if (xfer_tensor_wire_parse_meta(p + 8, XFER_TENSOR_WIRE_META_FIXED + 8u * rank,
                                    &resp->meta, &meta_len, why, why_size) != XFER_OK) {
        return XFER_ERR_PROTOCOL;
    }
    if (((resp->meta.flags & XFER_TENSOR_META_NONE) != 0) != (hdr->status != XFER_OK)) {
        snprintf(why, why_size, "TENSOR_RESP of status %" PRId32 " %s", hdr->status,
                 (hdr->status == XFER_OK) ? "describes no tensor" : "describes a tensor");
        return XFER_ERR_PROTOCOL;
    }
    data_len = xfer_tensor_wire_data_len(&resp->meta);
    if ((data_len > limits->max_msg_size) || (hdr->length != need + data_len)) {
        snprintf(why, why_size, "TENSOR_RESP length %" PRIu64 " does not match its extension (%"
                 "zu) and data (%" PRIu64 ") or exceeds the limit of %" PRIu64, hdr->length,
                 need, data_len, limits->max_msg_size);
        return XFER_ERR_PROTOCOL;
    }
    return XFER_OK;
}

xfer_status_t xfer_tcp_wire_unpack_ep_addr(const void *buf, size_t len,
                                           xfer_tcp_wire_ep_addr_t *addr)
{
    const uint8_t *p = buf;

    if (len == 0) {
        return XFER_OK;
    }
    if ((buf == NULL) || (len != XFER_TCP_WIRE_EP_ADDR_LEN) ||
        (xfer_get_le16(p) != XFER_TCP_WIRE_MAGIC) || (p[2] != XFER_TCP_WIRE_VERSION) ||
        (p[3] == 0) || (p[3] > XFER_TCP_WIRE_LANES_MAX) ||
        ((p[18] & ~XFER_TCP_WIRE_ADDR_TLS) != 0) || (p[19] != 0) ||
        (xfer_get_le32(p + 20) != 0)) {
        return XFER_ERR_PROTOCOL;   /* reserved bytes are 0, so that a later version may use them */
    }
    addr->lanes               = p[3];
    addr->limits.max_key_len  = xfer_get_le32(p + 4);
    addr->limits.max_msg_size = xfer_get_le64(p + 8);
    addr->lane_port           = xfer_get_le16(p + 16);
    addr->flags               = p[18];
    addr->token               = xfer_get_le64(p + 24);
    return XFER_OK;
}

xfer_status_t xfer_tcp_wire_unpack_lane_hello(const void *buf, xfer_tcp_wire_lane_hello_t *hello,
                                              char *why, size_t why_size)
{
    const uint8_t *p = buf;

    if (((xfer_get_le16(p) != XFER_TCP_WIRE_LANE_MAGIC) &&
         (xfer_get_le16(p) != XFER_TCP_WIRE_LANE_PROVEN_MAGIC)) ||
        (p[2] != XFER_TCP_WIRE_VERSION)) {
        snprintf(why, why_size, "not a tcp v%u lane hello (magic 0x%04x, version %u)",
                 XFER_TCP_WIRE_VERSION, xfer_get_le16(p), p[2]);
        return XFER_ERR_PROTOCOL;
    }
    if ((p[3] == 0) || (p[3] >= XFER_TCP_WIRE_LANES_MAX)) {
        snprintf(why, why_size, "lane hello names lane %u (1..%u)", p[3],
                 XFER_TCP_WIRE_LANES_MAX - 1);
        return XFER_ERR_PROTOCOL;
    }
    if (xfer_get_le32(p + 4) != 0) {
        snprintf(why, why_size, "lane hello with reserved bytes set (0x%08x)",
                 xfer_get_le32(p + 4));
        return XFER_ERR_PROTOCOL;
    }
    hello->lane   = p[3];
    hello->token  = xfer_get_le64(p + 8);
    hello->proven = (xfer_get_le16(p) == XFER_TCP_WIRE_LANE_PROVEN_MAGIC);
    return XFER_OK;
}
