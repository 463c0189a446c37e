/*
 * Sending: messages go into the peer's ring in the order they were queued, one frame per
 * cell. A message's first frame carries its header and the start of its payload; the rest
 * follows in DATA frames, written as the peer frees cells, so that data longer than the ring
 * is pipelined through it. A small message into an idle ring is written straight from the
 * caller's buffer without a queue entry.
 */
#include "shm.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* Wake the peer, which sleeps on its end of the connection. A full socket means it has
 * bytes to wake it already. */
void xfer_shm_doorbell_ring(xfer_ep_h ep)
{
    static const uint8_t one = 1;

    if (ep->fd >= 0) {
        (void)!send(ep->fd, &one, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    }
}

/* Copy the next frame of tx into cell c; 1 when tx is then written whole. */
static int frame_fill(xfer_ep_h ep, xfer_shm_tx_t *tx, uint8_t *c)
{
    size_t cap = xfer_shm_cell_payload(&ep->out);
    xfer_shm_frame_t hdr;
    uint8_t *p = c + XFER_SHM_FRAME_HDR;
    uint64_t n;

    if (!tx->started) {
        hdr = tx->hdr;
        if (tx->head_len > 0) {
            memcpy(p, tx->head, tx->head_len);
        }
        n = tx->len - tx->sent;
        if (n > cap - tx->head_len) {
            n = cap - tx->head_len;
        }
        if (n > 0) {
            memcpy(p + tx->head_len, tx->data + tx->sent, n);
        }
        hdr.len     = (uint32_t)(tx->head_len + n);
        hdr.seq     = 0;        /* the stamp is publish's */
        tx->started = 1;
    } else {
        memset(&hdr, 0, sizeof(hdr));
        hdr.type = XFER_SHM_F_DATA;
        n        = tx->len - tx->sent;
        if (n > cap) {
            n = cap;
        }
        if (n > 0) {
            memcpy(p, tx->data + tx->sent, n);
        }
        hdr.len = (uint32_t)n;
    }
    memcpy(c, &hdr, sizeof(hdr));
    tx->sent += n;
    return tx->sent == tx->len;
}

/* tx leaves the queue: written whole (XFER_OK), what waited on it going on, or dropped with
 * the status its ep ends with - an op waiting for an answer then fails with its slot, one
 * that completes once written fails here. */
static void tx_end(xfer_ep_h ep, xfer_shm_tx_t *tx, xfer_status_t status)
{
    ucs_list_del(&tx->list);
    ep->tx_done += (status == XFER_OK);
    if (tx->answer) {
        ep->answers--;
        xfer_budget_queue_remove(ep->fail.fw_ep, XFER_BUDGET_ANSWERS, &ep->answer_bytes,
                                 XFER_SHM_ANSWER_COST(tx->len));
    }
    if ((tx->op != NULL) && tx->op->on_write) {
        xfer_shm_op_complete(tx->op, status, (status == XFER_OK) ? tx->op->len : 0, 0);
    }
    if ((tx->answer_of != NULL) && (status == XFER_OK)) {
        xfer_shm_answer_sent(tx->answer_of);
    }
    free(tx->owned);
    tx->owned = NULL;
    if (!tx->embedded) {
        free(tx);
    }
}

int xfer_shm_tx_write(xfer_ep_h ep)
{
    char why[XFER_REASON_MAX];
    xfer_status_t status;
    int wake = 0, count = 0;

    while (!ucs_list_is_empty(&ep->txq) && (ep->fail.state == XFER_EP_CONNECTED)) {
        xfer_shm_tx_t *tx = ucs_list_head(&ep->txq, xfer_shm_tx_t, list);
        uint8_t *c        = xfer_shm_ring_claim(&ep->out, &status, why, sizeof(why));

        if (c == NULL) {
            if (status != XFER_OK) {
                xfer_shm_ep_fail_later(ep, status, "%s", why);
                return -1;
            }
            break;
        }
        count++;
        if (frame_fill(ep, tx, c)) {
            wake |= xfer_shm_ring_publish(&ep->out);
            tx_end(ep, tx, XFER_OK);
        } else {
            wake |= xfer_shm_ring_publish(&ep->out);
        }
    }
    if (wake) {
        xfer_shm_doorbell_ring(ep);
    }
    xfer_shm_ep_flushes_check(ep);
    return count;
}

xfer_status_t xfer_shm_tx_queue(xfer_ep_h ep, xfer_shm_tx_t *tx, const xfer_shm_frame_t *hdr,
                                const void *data, uint64_t len, int copy, int answer)
{
    size_t cap = xfer_shm_cell_payload(&ep->out);

    if ((tx == NULL) && ucs_list_is_empty(&ep->txq) && (len <= cap)) {
        /* one cell into a ring with room: no entry, no copy but the one into the cell */
        char why[XFER_REASON_MAX];
        xfer_status_t status;
        uint8_t *c = xfer_shm_ring_claim(&ep->out, &status, why, sizeof(why));

        if (c != NULL) {
            xfer_shm_frame_t h = *hdr;

            h.len = (uint32_t)len;
            h.seq = 0;
            memcpy(c, &h, sizeof(h));
            if (len > 0) {
                memcpy(c + XFER_SHM_FRAME_HDR, data, len);
            }
            ep->tx_queued++;
            ep->tx_done++;
            if (xfer_shm_ring_publish(&ep->out)) {
                xfer_shm_doorbell_ring(ep);
            }
            return XFER_OK;
        }
        if (status != XFER_OK) {
            xfer_shm_ep_fail_later(ep, status, "%s", why);
            return XFER_OK;     /* the ep fails at the next progress(), with the message */
        }
    }
    if (tx == NULL) {
        tx = calloc(1, sizeof(*tx) + (copy ? len : 0));
        if (tx == NULL) {
            return XFER_ERR_NO_MEMORY;
        }
        if (copy && (len > 0)) {
            memcpy(tx + 1, data, len);
            data = tx + 1;
        }
    } else {
        tx->embedded = 1;
    }
    tx->hdr     = *hdr;
    tx->data    = data;
    tx->len     = len;
    tx->sent    = 0;
    tx->started = 0;
    tx->answer  = answer;
    if (tx->head == NULL) {
        tx->head_len = 0;
    }
    if (tx->head_len > cap) {
        tx->head_len = cap;     /* callers keep heads well under a cell */
    }
    ep->tx_queued++;
    if (answer) {
        ep->answers++;
        xfer_budget_queue_add(ep->fail.fw_ep, XFER_BUDGET_ANSWERS, &ep->answer_bytes,
                              XFER_SHM_ANSWER_COST(len));
    }
    ucs_list_add_tail(&ep->txq, &tx->list);
    xfer_shm_ep_watch(ep);  /* progress writes the rest as the ring frees room */
    return XFER_OK;
}

int xfer_shm_tx_inline(xfer_ep_h ep, unsigned type, uint64_t id, uint64_t a, const void *data,
                       uint32_t len)
{
    char why[XFER_REASON_MAX];
    xfer_shm_frame_t *h;
    xfer_status_t status;
    uint8_t *c;

    if (!ucs_list_is_empty(&ep->txq) || (len > xfer_shm_cell_payload(&ep->out))) {
        return 0;
    }
    c = xfer_shm_ring_claim(&ep->out, &status, why, sizeof(why));
    if (c == NULL) {
        if (status != XFER_OK) {
            xfer_shm_ep_fail_later(ep, status, "%s", why);
        }
        return 0;
    }
    h = (xfer_shm_frame_t*)(void*)c;
    memset(h, 0, sizeof(*h));
    h->len  = len;
    h->type = (uint16_t)type;
    h->id   = id;
    h->a    = a;
    if ((len <= XFER_SHM_INLINE_MAX) && xfer_shm_inline_type(type)) {
        /* in the header's line: the peer reads one cache line for the whole frame */
        h->flags = XFER_SHM_FL_INLINE;
        if (len > 0) {
            memcpy(c + XFER_SHM_INLINE_OFF, data, len);
        }
    } else if (len > 0) {
        memcpy(c + XFER_SHM_FRAME_HDR, data, len);
    }
    ep->tx_queued++;
    ep->tx_done++;
    if (xfer_shm_ring_publish(&ep->out)) {
        xfer_shm_doorbell_ring(ep);
    }
    return 1;
}

xfer_status_t xfer_shm_tx_ctrl(xfer_ep_h ep, unsigned type, xfer_status_t status, uint64_t id,
                               int answer)
{
    xfer_shm_frame_t hdr;
    xfer_status_t ret;

    memset(&hdr, 0, sizeof(hdr));
    hdr.type   = (uint16_t)type;
    hdr.status = (int32_t)status;
    hdr.id     = id;
    ret        = xfer_shm_tx_queue(ep, NULL, &hdr, NULL, 0, 1, answer);
    if ((ret == XFER_OK) && !ucs_list_is_empty(&ep->txq)) {
        xfer_shm_tx_write(ep);
    }
    return ret;
}

void xfer_shm_tx_drop_all(xfer_ep_h ep, xfer_status_t status)
{
    while (!ucs_list_is_empty(&ep->txq)) {
        tx_end(ep, ucs_list_head(&ep->txq, xfer_shm_tx_t, list), status);
    }
}
