/*
 * Batches over shm, the target's side: a peer's BATCH frame (with cross-memory attach) - its
 * descriptors read from the initiator once and checked against the live registration before
 * a byte moves, then the data moved by process_vm_readv/writev a slice each round of
 * progress, in turn with the other endpoints, answered with BATCH_ACK and the count landed -
 * and the NOTIFY frames of batches that went through the ring or into mapped memory
 * (shm_batch.c says how the initiator sends each).
 */
#include "shm.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>

#define BATCH_IOV_CHUNK  1024   /* iovecs per process_vm_readv/writev (IOV_MAX on Linux) */

/*
 * The iovecs of up to n descriptors from iov[0] (its first skip bytes already moved), at most
 * budget bytes: ours (the descriptors' remote side) in liov, the initiator's in riov, each
 * merged where one range ends at the next one's start - process_vm_readv/writev take the two
 * lists as two streams, so a side that is contiguous costs the kernel one range however
 * scattered the other is. Returns the bytes.
 */
static size_t batch_iov_build(const xfer_batch_iov_t *iov, uint64_t n, uint64_t skip,
                              struct iovec *liov, size_t *nl_p, struct iovec *riov,
                              size_t *nr_p, uint64_t budget)
{
    size_t nl = 0, nr = 0, want = 0;

    for (uint64_t k = 0; (k < n) && (want < budget); k++) {
        uint64_t o    = (k == 0) ? skip : 0;
        uint8_t *ours = (uint8_t*)(uintptr_t)(iov[k].remote + o);
        uint8_t *peer = (uint8_t*)(uintptr_t)(iov[k].local + o);
        size_t len    = iov[k].length - o;

        if (len > budget - want) {
            len = (size_t)(budget - want);  /* the rest of it in the next slice */
        }
        if (len == 0) {
            continue;
        }
        if ((nl > 0) && ((uint8_t*)liov[nl - 1].iov_base + liov[nl - 1].iov_len == ours)) {
            liov[nl - 1].iov_len += len;
        } else {
            liov[nl++] = (struct iovec){ours, len};
        }
        if ((nr > 0) && ((uint8_t*)riov[nr - 1].iov_base + riov[nr - 1].iov_len == peer)) {
            riov[nr - 1].iov_len += len;
        } else {
            riov[nr++] = (struct iovec){peer, len};
        }
        want += len;
    }
    *nl_p = nl;
    *nr_p = nr;
    return want;
}

/* A peer's BATCH frame being moved. Its frame stays at the head of our ring while its data
 * moves, a slice (XFER_FAIR_SLICE bytes) each round of progress, in turn with the other
 * endpoints; it is answered, and consumed, once done - or at its deadline. */
struct xfer_shm_batch_rx {
    uint64_t          pos;          /* our ring's position of its frame */
    xfer_batch_iov_t  *iov;         /* the initiator's descriptors, read once, checked */
    uint64_t          count;
    uint64_t          done;         /* descriptors moved whole */
    uint64_t          skip;         /* bytes of iov[done] moved */
    struct iovec      liov[BATCH_IOV_CHUNK], riov[BATCH_IOV_CHUNK];
};

static void batch_rx_free(xfer_ep_h ep)
{
    if (ep->batch_rx != NULL) {
        free(ep->batch_rx->iov);
        free(ep->batch_rx);
        ep->batch_rx = NULL;
    }
}

/* Whether the batch goes on, by its stop word: XFER_ERR_CANCELED once the initiator cancelled
 * it, XFER_ERR_TIMEOUT once the deadline it holds is past, else XFER_OK. */
static xfer_status_t batch_stop_status(uint64_t stop)
{
    if (stop == XFER_SHM_BATCH_STOP) {
        return XFER_ERR_CANCELED;
    }
    return ((stop != 0) && (xfer_now_ns() >= stop)) ? XFER_ERR_TIMEOUT : XFER_OK;
}

/* The batch's stop word (hdr->d) into *stop_p and, when iov is not NULL, its len bytes of
 * descriptors (hdr->b): both from the initiator, in one system call where they can. */
static xfer_status_t batch_rx_read(xfer_ep_h ep, const xfer_shm_frame_t *hdr, uint64_t *stop_p,
                                   void *iov, size_t len)
{
    struct iovec l[2] = {{stop_p, sizeof(*stop_p)}, {iov, len}};
    struct iovec r[2] = {{(void*)(uintptr_t)hdr->d, sizeof(*stop_p)},
                         {(void*)(uintptr_t)hdr->b, len}};
    unsigned n        = (iov != NULL) ? 2 : 1;
    char why[XFER_REASON_MAX];
    xfer_status_t status;

    if (process_vm_readv(ep->peer_pid, l, n, r, n, 0) ==
        (ssize_t)(sizeof(*stop_p) + ((iov != NULL) ? len : 0))) {
        return XFER_OK;
    }
    /* short or failed: each on its own, which says what failed */
    status = xfer_shm_cma(ep, stop_p, hdr->d, sizeof(*stop_p), 0, why, sizeof(why));
    if ((status == XFER_OK) && (iov != NULL)) {
        status = xfer_shm_cma(ep, iov, hdr->b, len, 0, why, sizeof(why));
    }
    if (status != XFER_OK) {
        xfer_log_peer("batch_refused", XFER_LOG_WARN, XFER_SHM_SUBSYS, "refusing a batch: "
                      "reading its %s: %s", (iov != NULL) ? "stop word and descriptors" :
                      "stop word", why);
    }
    return status;
}

/* Read the frame's stop word and descriptors, and check each descriptor against its region
 * before a byte moves. */
static xfer_status_t batch_rx_start(xfer_ep_h ep, const xfer_shm_frame_t *hdr)
{
    uint64_t count = hdr->c;
    uint64_t stop  = 0;
    xfer_shm_batch_rx_t *br;
    xfer_region_t *region;
    xfer_status_t status;
    uint8_t *base;
    size_t rlen;

    region = xfer_shm_region_named(ep, hdr->a, hdr->e, &status);
    if (region == NULL) {
        xfer_log_peer("batch_refused", XFER_LOG_WARN, XFER_SHM_SUBSYS,
                      "refusing a batch naming region %llu: %s", (unsigned long long)hdr->a,
                      xfer_status_string(status));
        return status;
    }
    base = region->addr;
    rlen = region->length;
    br = calloc(1, sizeof(*br));
    if ((br == NULL) || ((br->iov = malloc(count * sizeof(*br->iov))) == NULL)) {
        free(br);
        return XFER_ERR_NO_MEMORY;
    }
    status = batch_rx_read(ep, hdr, &stop, br->iov, count * sizeof(*br->iov));
    if (status == XFER_OK) {
        status = batch_stop_status(stop);   /* ended before it started: nothing moves */
    }
    if (status != XFER_OK) {
        free(br->iov);
        free(br);
        return status;
    }
    for (uint64_t i = 0; i < count; i++) {
        uint64_t off = br->iov[i].remote - (uintptr_t)base;

        if ((br->iov[i].remote < (uintptr_t)base) || (off > rlen) ||
            (br->iov[i].length > rlen - off) || (br->iov[i].length > SSIZE_MAX)) {
            xfer_log_peer("batch_refused", XFER_LOG_WARN, XFER_SHM_SUBSYS,
                          "refusing a batch: descriptor %llu "
                          "(0x%llx+%llu) is outside region %llu", (unsigned long long)i,
                          (unsigned long long)br->iov[i].remote,
                          (unsigned long long)br->iov[i].length, (unsigned long long)hdr->a);
            free(br->iov);
            free(br);
            return XFER_ERR_OUT_OF_RANGE;
        }
    }
    br->pos      = ep->in.pos;
    br->count    = count;
    ep->batch_rx = br;
    return XFER_OK;
}

/* Move up to budget bytes of the batch, in chunks of descriptors whose ranges are merged on
 * each side where they touch; a short transfer goes on from where it stopped. XFER_OK when
 * every descriptor moved, XFER_INPROGRESS when the rest waits for the next round, or the
 * error of a transfer. */
static xfer_status_t batch_rx_move(xfer_ep_h ep, int get, uint64_t budget)
{
    xfer_shm_batch_rx_t *br = ep->batch_rx;
    uint64_t moved          = 0;

    for (;;) {
        uint64_t skip_left, n;
        size_t nl, nr, want;
        ssize_t got;

        while ((br->done < br->count) && (br->iov[br->done].length == br->skip)) {
            br->done++;             /* finished, or empty */
            br->skip = 0;
        }
        if (br->done == br->count) {
            return XFER_OK;
        }
        if (moved >= budget) {
            return XFER_INPROGRESS;
        }
        n    = (br->count - br->done < BATCH_IOV_CHUNK) ? br->count - br->done : BATCH_IOV_CHUNK;
        want = batch_iov_build(br->iov + br->done, n, br->skip, br->liov, &nl, br->riov, &nr,
                               budget - moved);
        got  = get ? process_vm_writev(ep->peer_pid, br->liov, nl, br->riov, nr, 0) :
                     process_vm_readv(ep->peer_pid, br->liov, nl, br->riov, nr, 0);
        if (got <= 0) {
            xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "a peer's batch: %s of %zu bytes "
                     "in pid %d failed: %s", get ? "process_vm_writev" : "process_vm_readv",
                     want, (int)ep->peer_pid, (got == 0) ? "no progress" : strerror(errno));
            return ((got < 0) && (errno == ESRCH)) ? XFER_ERR_CONNECTION : XFER_ERR_IO;
        }
        ep->rx_copied += (uint64_t)got;
        moved         += (uint64_t)got;
        /* past the descriptors the transfer finished */
        for (skip_left = (uint64_t)got; skip_left > 0;) {
            uint64_t left = br->iov[br->done].length - br->skip;

            if (skip_left < left) {
                br->skip += skip_left;
                break;
            }
            skip_left -= left;
            br->skip   = 0;
            br->done++;
        }
    }
}

/* Whether the batch goes on before a slice after the first: its region is still registered,
 * and the initiator did not end it - by its stop word (hdr->d, in the initiator), so that a
 * batch that ended early moves at most one more slice. */
static xfer_status_t batch_rx_stopped(xfer_ep_h ep, const xfer_shm_frame_t *hdr)
{
    uint64_t stop = 0;
    xfer_status_t status;

    /* the region is looked up again every round, as a sliced put's is: once deregistered it
     * receives nothing more (a get batch reads nothing more of it) */
    if (xfer_shm_region_named(ep, hdr->a, hdr->e, &status) == NULL) {
        xfer_log_peer("batch_refused", XFER_LOG_INFO, XFER_SHM_SUBSYS, "a batch stops: its "
                      "region %llu is no longer registered", (unsigned long long)hdr->a);
        return status;
    }
    status = batch_rx_read(ep, hdr, &stop, NULL, 0);
    return (status == XFER_OK) ? batch_stop_status(stop) : status;
}

/* A peer's notification handed over (xfer_notify_deliver's status): XFER_OK, or the endpoint
 * fails. */
static xfer_status_t notify_delivered(xfer_ep_h ep, xfer_status_t status, const char *why)
{
    if (status != XFER_OK) {
        xfer_shm_ep_fail_later(ep, status, "%s", why);
        return status;
    }
    ep->rx_yield = 1;   /* the application hears of it at the end of this round, not 256
                         * frames later */
    return XFER_OK;
}

/* The peer's notification, after puts PUT frames of its batch (r; NULL: a CMA batch, whose
 * descriptors were checked whole). */
static xfer_status_t notify_deliver(xfer_ep_h ep, const xfer_batch_rx_t *r, uint64_t puts,
                                    const void *msg, size_t len)
{
    char why[XFER_REASON_MAX];

    return notify_delivered(ep, xfer_notify_deliver(&ep->iface->params, ep->fail.fw_ep, r,
                                                    puts, msg, len, XFER_SHM_SUBSYS, why,
                                                    sizeof(why)), why);
}

xfer_status_t xfer_shm_rx_batch(xfer_ep_h ep, const xfer_shm_frame_t *hdr,
                                const uint8_t *payload, char *why, size_t why_size)
{
    const xfer_iface_params_t *params = &ep->iface->params;
    xfer_shm_frame_t ack;
    xfer_status_t status;
    uint64_t landed = 0;

    if (!ep->cma || (hdr->c == 0) || (hdr->c > XFER_SHM_BATCH_MAX) ||
        (hdr->len > params->max_notify_len) ||
        (!(hdr->flags & XFER_SHM_FL_NOTIFY) && (hdr->len != 0))) {
        snprintf(why, why_size, "a batch of %llu descriptors with %u bytes of notification%s",
                 (unsigned long long)hdr->c, hdr->len,
                 ep->cma ? "" : " on an endpoint without CMA");
        return XFER_ERR_PROTOCOL;
    }
    if ((ep->batch_rx != NULL) && (ep->batch_rx->pos != ep->in.pos)) {
        snprintf(why, why_size, "a batch frame at %llu while the one at %llu is not done",
                 (unsigned long long)ep->in.pos, (unsigned long long)ep->batch_rx->pos);
        return XFER_ERR_PROTOCOL;
    }
    if (hdr->flags & XFER_SHM_FL_VOID) {
        status = XFER_ERR_CANCELED;     /* cancelled before it was written */
    } else {
        /* ended by the initiator (cancel, deadline): nothing more moves for it */
        status = (ep->batch_rx != NULL) ? batch_rx_stopped(ep, hdr) : batch_rx_start(ep, hdr);
        if (status == XFER_OK) {
            status = batch_rx_move(ep, (hdr->flags & XFER_SHM_FL_GET) != 0,
                                   XFER_IFACE_FAIR_SLICE(params));
        }
        if (status == XFER_INPROGRESS) {
            ep->rx_more = 1;
            return XFER_ERR_BUSY;   /* the frame stays: the rest in the next round */
        }
    }
    if (ep->batch_rx != NULL) {
        landed = ep->batch_rx->done;
        batch_rx_free(ep);
    }
    if ((status == XFER_OK) && (hdr->flags & XFER_SHM_FL_NOTIFY) &&
        (notify_deliver(ep, NULL, 0, payload, hdr->len) != XFER_OK)) {
        return XFER_OK;     /* the ep failed */
    }
    if (status == XFER_ERR_CONNECTION) {
        xfer_shm_ep_fail_later(ep, status, "the peer's process went away during its batch");
    }
    memset(&ack, 0, sizeof(ack));
    ack.type   = XFER_SHM_F_BATCH_ACK;
    ack.id     = hdr->id;
    ack.status = (int32_t)status;
    ack.a      = landed;
    if (xfer_shm_tx_queue(ep, NULL, &ack, NULL, 0, 0, 1) != XFER_OK) {
        snprintf(why, why_size, "out of memory for an answer");
        return XFER_ERR_NO_MEMORY;
    }
    xfer_shm_tx_write(ep);
    return XFER_OK;
}

void xfer_shm_batch_rx_abort(xfer_ep_h ep)
{
    batch_rx_free(ep);
}

xfer_status_t xfer_shm_rx_notify(xfer_ep_h ep, const xfer_shm_frame_t *hdr,
                                 const uint8_t *payload, char *why, size_t why_size)
{
    uint32_t max = ep->iface->params.max_notify_len;
    xfer_status_t status;

    if (hdr->a > ep->batch_puts.puts) {
        snprintf(why, why_size, "a notification after %llu puts (%llu came)",
                 (unsigned long long)hdr->a, (unsigned long long)ep->batch_puts.puts);
        return XFER_ERR_PROTOCOL;
    }
    if (hdr->b == 0) {      /* whole in this frame */
        if (!(hdr->flags & XFER_SHM_FL_VOID)) {
            (void)notify_deliver(ep, &ep->batch_puts, hdr->a, payload, hdr->len);
        }
        return XFER_OK;
    }
    if ((hdr->b <= hdr->len) || (hdr->b > max)) {
        snprintf(why, why_size, "a notification of %llu bytes whose first frame carries %u "
                 "(XFER_NOTIFY_MAX_LEN=%u)", (unsigned long long)hdr->b, hdr->len, max);
        return XFER_ERR_PROTOCOL;
    }
    status = xfer_notify_rx_begin(ep->fail.fw_ep, &ep->notify_rx, (size_t)hdr->b, why,
                                  why_size);
    if (status != XFER_OK) {
        return status;
    }
    /* the rest follows in DATA frames, nothing between them */
    xfer_shm_rx_expect(ep, XFER_SHM_RX_NOTIFY, ep->notify_rx.buf, hdr->b, hdr->b);
    ep->rx.tag    = hdr->a;
    ep->rx.status = (hdr->flags & XFER_SHM_FL_VOID) ? XFER_ERR_CANCELED : XFER_OK;
    xfer_shm_rx_feed(ep, payload, hdr->len);
    return XFER_OK;
}

xfer_status_t xfer_shm_rx_notify_done(xfer_ep_h ep, char *why, size_t why_size)
{
    if (ep->rx.status != XFER_OK) {
        xfer_notify_rx_end(ep->fail.fw_ep, &ep->notify_rx);    /* voided */
        return XFER_OK;
    }
    (void)notify_delivered(ep, xfer_notify_rx_deliver(&ep->iface->params, ep->fail.fw_ep,
                                                      &ep->notify_rx, &ep->batch_puts,
                                                      ep->rx.tag, XFER_SHM_SUBSYS, why,
                                                      why_size), why);
    return XFER_OK;
}
