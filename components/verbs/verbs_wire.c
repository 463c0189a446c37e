/*
 * Packing and validating parsing of the verbs messages and addresses (verbs_wire.h). Pure
 * functions of their arguments, so that tests can build hostile messages with them.
 */
#include "verbs_wire.h"
#include "tensor_wire.h"

#include <xfer/byteorder.h>
#include <xfer/component.h>

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

const char *xfer_verbs_msg_name(unsigned type)
{
    static const char *const names[] = {
        [XFER_VERBS_MSG_TAG]     = "TAG",
        [XFER_VERBS_MSG_RTS]     = "RTS",
        [XFER_VERBS_MSG_FIN]     = "FIN",
        [XFER_VERBS_MSG_TENSOR_REQUEST]    = "TENSOR_REQUEST",
        [XFER_VERBS_MSG_META_DATA_UPDATE]  = "META_DATA_UPDATE",
        [XFER_VERBS_MSG_TENSOR_RE_REQUEST] = "TENSOR_RE_REQUEST",
        [XFER_VERBS_MSG_ERROR_STATUS]      = "ERROR_STATUS",
        [XFER_VERBS_MSG_NOTIFY]            = "NOTIFY",
        [XFER_VERBS_MSG_BYE]               = "BYE",
    };

    return ((type < XFER_VERBS_MSG_LAST) && (names[type] != NULL)) ? names[type] : "?";
}

size_t xfer_verbs_wire_pack_hdr(const xfer_verbs_wire_hdr_t *hdr, uint8_t *buf)
{
    xfer_put_le16(buf, XFER_VERBS_WIRE_MAGIC);
    buf[2] = XFER_VERBS_WIRE_VERSION;
    buf[3] = hdr->type;
    xfer_put_le16(buf + 4, hdr->credits);
    xfer_put_le16(buf + 6, 0);
    if (hdr->type == XFER_VERBS_MSG_TAG) {
        xfer_put_le64(buf + 8, hdr->tag);
        return XFER_VERBS_WIRE_TAG_HDR_LEN;
    }
    if (hdr->type == XFER_VERBS_MSG_TENSOR_REQUEST) {
        xfer_put_le64(buf + 8, hdr->tag);
        xfer_put_le64(buf + 16, hdr->id);
        return XFER_VERBS_WIRE_TREQ_HDR_LEN;
    }
    xfer_put_le32(buf + 8, (uint32_t)hdr->status);
    xfer_put_le32(buf + 12, hdr->length);
    xfer_put_le64(buf + 16, hdr->id);
    xfer_put_le64(buf + 24, hdr->tag);
    xfer_put_le64(buf + 32, hdr->size);
    return XFER_VERBS_WIRE_HDR_LEN;
}

/* The 40-byte layout's fields after the common part. */
static void unpack_long(const uint8_t *buf, xfer_verbs_wire_hdr_t *hdr)
{
    hdr->status = (int32_t)xfer_get_le32(buf + 8);
    hdr->length = xfer_get_le32(buf + 12);
    hdr->id     = xfer_get_le64(buf + 16);
    hdr->tag    = xfer_get_le64(buf + 24);
    hdr->size   = xfer_get_le64(buf + 32);
}

/* The smallest extension each type carries. */
static uint32_t min_ext(unsigned type)
{
    switch (type) {
    case XFER_VERBS_MSG_RTS:   return XFER_VERBS_WIRE_RTS_LEN;
    case XFER_VERBS_MSG_TENSOR_REQUEST:
        return XFER_TENSOR_WIRE_REQ_FIXED + XFER_TENSOR_WIRE_META_FIXED + 1;
    case XFER_VERBS_MSG_META_DATA_UPDATE:  return XFER_TENSOR_WIRE_META_FIXED;
    case XFER_VERBS_MSG_TENSOR_RE_REQUEST: return XFER_TENSOR_WIRE_REREQ_LEN;
    case XFER_VERBS_MSG_ERROR_STATUS:      return XFER_TENSOR_WIRE_ERR_FIXED;
    default:                   return 0;
    }
}

xfer_status_t xfer_verbs_wire_unpack_hdr(const uint8_t *buf, size_t msg_len,
                                         xfer_verbs_wire_hdr_t *hdr, char *why,
                                         size_t why_size)
{
    size_t hdr_len;

    memset(hdr, 0, sizeof(*hdr));
    if (msg_len < XFER_VERBS_WIRE_HDR_COMMON) {
        snprintf(why, why_size, "message of %zu bytes is shorter than a header (%u)", msg_len,
                 XFER_VERBS_WIRE_HDR_COMMON);
        return XFER_ERR_PROTOCOL;
    }
    if (xfer_get_le16(buf) != XFER_VERBS_WIRE_MAGIC) {
        snprintf(why, why_size, "bad magic 0x%04x", xfer_get_le16(buf));
        return XFER_ERR_PROTOCOL;
    }
    hdr->version = buf[2];
    hdr->type    = buf[3];
    hdr->credits = xfer_get_le16(buf + 4);
    if ((hdr->version != XFER_VERBS_WIRE_VERSION) || (hdr->type == 0) ||
        (hdr->type >= XFER_VERBS_MSG_LAST)) {
        if (msg_len >= XFER_VERBS_WIRE_HDR_LEN) {
            unpack_long(buf, hdr);  /* best effort: the id names the message in the answer */
        }
        if (hdr->version != XFER_VERBS_WIRE_VERSION) {
            snprintf(why, why_size, "wire version %u, this side speaks %u", hdr->version,
                     XFER_VERBS_WIRE_VERSION);
        } else {
            snprintf(why, why_size, "unknown message type %u", hdr->type);
        }
        return XFER_ERR_UNSUPPORTED;
    }
    if (xfer_get_le16(buf + 6) != 0) {
        snprintf(why, why_size, "%s header with reserved bytes set (0x%04x)",
                 xfer_verbs_msg_name(hdr->type), xfer_get_le16(buf + 6));
        return XFER_ERR_PROTOCOL;
    }
    hdr_len = xfer_verbs_wire_hdr_len(hdr->type);
    if (msg_len < hdr_len) {
        snprintf(why, why_size, "%s of %zu bytes is shorter than its header (%zu)",
                 xfer_verbs_msg_name(hdr->type), msg_len, hdr_len);
        return XFER_ERR_PROTOCOL;
    }
    if (hdr->type == XFER_VERBS_MSG_TAG) {
        hdr->tag    = xfer_get_le64(buf + 8);
        hdr->length = (uint32_t)(msg_len - hdr_len);   /* msg_len is a completion's u32 */
        hdr->size   = hdr->length;
        return XFER_OK;
    }
    if (hdr->type == XFER_VERBS_MSG_TENSOR_REQUEST) {
        hdr->tag    = xfer_get_le64(buf + 8);
        hdr->id     = xfer_get_le64(buf + 16);
        hdr->length = (uint32_t)(msg_len - hdr_len);
    } else {
        unpack_long(buf, hdr);  /* a 40-byte header says how much follows: it must be so */
        if ((uint64_t)hdr->length != msg_len - hdr_len) {
            snprintf(why, why_size, "%s header says %" PRIu32 " bytes follow, %zu arrived",
                     xfer_verbs_msg_name(hdr->type), hdr->length, msg_len - hdr_len);
            return XFER_ERR_PROTOCOL;
        }
    }
    if (hdr->length < min_ext(hdr->type)) {
        snprintf(why, why_size, "%s of %" PRIu32 " bytes is shorter than its extension (%u)",
                 xfer_verbs_msg_name(hdr->type), hdr->length, min_ext(hdr->type));
        return XFER_ERR_PROTOCOL;
    }
    if ((hdr->type == XFER_VERBS_MSG_BYE) &&
        ((hdr->status != 0) || (hdr->length != 0) || (hdr->id != 0) || (hdr->size != 0))) {
        snprintf(why, why_size, "BYE with fields set that are reserved (0)");
        return XFER_ERR_PROTOCOL;
    }
    if ((hdr->type == XFER_VERBS_MSG_RTS) && (hdr->length != XFER_VERBS_WIRE_RTS_LEN)) {
        snprintf(why, why_size, "RTS carries %" PRIu32 " bytes, not %u", hdr->length,
                 XFER_VERBS_WIRE_RTS_LEN);
        return XFER_ERR_PROTOCOL;
    }
    if ((hdr->type == XFER_VERBS_MSG_RTS) && (xfer_get_le32(buf + hdr_len + 12) != 0)) {
        snprintf(why, why_size, "RTS with reserved bytes set");
        return XFER_ERR_PROTOCOL;
    }
    if ((hdr->type == XFER_VERBS_MSG_FIN) && (hdr->length != 0)) {
        snprintf(why, why_size, "%s carries %" PRIu32 " unexpected bytes",
                 xfer_verbs_msg_name(hdr->type), hdr->length);
        return XFER_ERR_PROTOCOL;
    }
    return XFER_OK;
}

void xfer_verbs_wire_pack_rts(const xfer_verbs_wire_rts_t *rts, uint8_t *buf)
{
    xfer_put_le64(buf, rts->addr);
    xfer_put_le32(buf + 8, rts->rkey);
    xfer_put_le32(buf + 12, 0);
}

void xfer_verbs_wire_unpack_rts(const uint8_t *buf, xfer_verbs_wire_rts_t *rts)
{
    rts->addr = xfer_get_le64(buf);
    rts->rkey = xfer_get_le32(buf + 8);
}

void xfer_verbs_wire_pack_iface_addr(const xfer_verbs_wire_iface_addr_t *a, uint8_t *buf)
{
    memcpy(buf, a->gid, 16);
    xfer_put_le16(buf + 16, a->lid);
    buf[18] = a->port;
    buf[19] = a->link_layer;
    buf[20] = a->active_mtu;
    buf[21] = a->gid_index;
    xfer_put_le16(buf + 22, 0);
    xfer_put_le64(buf + 24, a->subnet_prefix);
}

xfer_status_t xfer_verbs_wire_unpack_iface_addr(const uint8_t *buf, size_t len,
                                                xfer_verbs_wire_iface_addr_t *a)
{
    if ((len != XFER_VERBS_WIRE_IFACE_ADDR_LEN) || (xfer_get_le16(buf + 22) != 0)) {
        return XFER_ERR_PROTOCOL;   /* reserved bytes are 0, so that a later version may use them */
    }
    memcpy(a->gid, buf, 16);
    a->lid           = xfer_get_le16(buf + 16);
    a->port          = buf[18];
    a->link_layer    = buf[19];
    a->active_mtu    = buf[20];
    a->gid_index     = buf[21];
    a->subnet_prefix = xfer_get_le64(buf + 24);
    if ((a->active_mtu < 1) || (a->active_mtu > 5)) {  /* IBV_MTU_256 .. IBV_MTU_4096 */
        return XFER_ERR_PROTOCOL;
    }
    return XFER_OK;
}

void xfer_verbs_wire_pack_ep_addr(const xfer_verbs_wire_ep_addr_t *a, uint8_t *buf)
{
    xfer_put_le16(buf, XFER_VERBS_WIRE_MAGIC);
    buf[2] = XFER_VERBS_WIRE_VERSION;
    buf[3] = 0;
    xfer_put_le32(buf + 4, a->qpn);
    xfer_put_le32(buf + 8, a->psn);
    xfer_put_le32(buf + 12, a->rx_slots);
    xfer_put_le32(buf + 16, a->seg_size);
    xfer_put_le32(buf + 20, a->max_key_len);
    xfer_put_le64(buf + 24, a->max_msg_size);
    xfer_put_le32(buf + 32, a->max_rd_atomic);
    xfer_put_le32(buf + 36, a->ka_rkey);
    xfer_put_le64(buf + 40, a->ka_addr);
    xfer_put_le32(buf + 48, a->rdma_chunk);
    xfer_put_le32(buf + 52, 0);
}

xfer_status_t xfer_verbs_wire_unpack_ep_addr(const uint8_t *buf, size_t len,
                                             xfer_verbs_wire_ep_addr_t *a, char *why,
                                             size_t why_size)
{
    /* the version first: another version may have another length */
    if ((len >= 4) && (xfer_get_le16(buf) == XFER_VERBS_WIRE_MAGIC) &&
        (buf[2] != XFER_VERBS_WIRE_VERSION)) {
        snprintf(why, why_size, "the peer speaks verbs wire version %u, this side %u", buf[2],
                 XFER_VERBS_WIRE_VERSION);
        return XFER_ERR_UNSUPPORTED;
    }
    if (len == XFER_VERBS_WIRE_EP_ADDR_V4_LEN) {
        snprintf(why, why_size, "endpoint address of %zu bytes: the peer speaks verbs wire "
                 "version 4 or earlier, this side %u", len, XFER_VERBS_WIRE_VERSION);
        return XFER_ERR_UNSUPPORTED;
    }
    if (len != XFER_VERBS_WIRE_EP_ADDR_LEN) {
        snprintf(why, why_size, "endpoint address of %zu bytes, expected %u", len,
                 XFER_VERBS_WIRE_EP_ADDR_LEN);
        return XFER_ERR_PROTOCOL;
    }
    if ((xfer_get_le16(buf) != XFER_VERBS_WIRE_MAGIC) || (buf[3] != 0) ||
        (xfer_get_le32(buf + 52) != 0)) {
        snprintf(why, why_size, "endpoint address: bad magic 0x%04x or reserved bytes not 0",
                 xfer_get_le16(buf));
        return XFER_ERR_PROTOCOL;
    }
    a->qpn           = xfer_get_le32(buf + 4);
    a->psn           = xfer_get_le32(buf + 8);
    a->rx_slots      = xfer_get_le32(buf + 12);
    a->seg_size      = xfer_get_le32(buf + 16);
    a->max_key_len   = xfer_get_le32(buf + 20);
    a->max_msg_size  = xfer_get_le64(buf + 24);
    a->max_rd_atomic = xfer_get_le32(buf + 32);
    a->ka_rkey       = xfer_get_le32(buf + 36);
    a->ka_addr       = xfer_get_le64(buf + 40);
    a->rdma_chunk    = xfer_get_le32(buf + 48);
    if ((a->qpn == 0) || (a->qpn > 0xffffff) || (a->psn > 0xffffff) || (a->rx_slots < 8) ||
        (a->rx_slots > 65536) || (a->seg_size < 256) || (a->seg_size > (1u << 20)) ||
        (a->max_rd_atomic == 0) || (a->max_msg_size == 0) || (a->rdma_chunk == 0)) {
        snprintf(why, why_size, "endpoint address out of range: qpn 0x%" PRIx32 " psn 0x%"
                 PRIx32 " slots %" PRIu32 " segment %" PRIu32 " rd_atomic %" PRIu32
                 " max_msg_size %" PRIu64 " rdma_chunk %" PRIu32, a->qpn, a->psn, a->rx_slots,
                 a->seg_size, a->max_rd_atomic, a->max_msg_size, a->rdma_chunk);
        return XFER_ERR_PROTOCOL;
    }
    return XFER_OK;
}

#define RKEY_MAGIC 0x4b525658u    /* "XVRK" */

void xfer_verbs_wire_pack_rkey(const xfer_verbs_wire_rkey_t *k, uint8_t *buf)
{
    xfer_put_le32(buf, RKEY_MAGIC);
    xfer_put_le32(buf + 4, k->rkey);
    xfer_put_le64(buf + 8, k->addr);
    xfer_put_le64(buf + 16, k->length);
}

xfer_status_t xfer_verbs_wire_unpack_rkey(const uint8_t *buf, size_t len,
                                          xfer_verbs_wire_rkey_t *k)
{
    if ((len != XFER_VERBS_WIRE_RKEY_LEN) || (xfer_get_le32(buf) != RKEY_MAGIC)) {
        return XFER_ERR_INVALID_PARAM;
    }
    k->rkey   = xfer_get_le32(buf + 4);
    k->addr   = xfer_get_le64(buf + 8);
    k->length = xfer_get_le64(buf + 16);
    return (k->addr + k->length < k->addr) ? XFER_ERR_INVALID_PARAM : XFER_OK;
}
