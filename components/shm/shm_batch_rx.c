/*
 * Batches over shm, the target's side: a peer's BATCH frame (with cross-memory attach) - its
 * descriptors read from the initiator a chunk at a time and all checked against the live
 * registration before a byte moves, then the data moved by process_vm_readv/writev a slice
 * each round of progress, in turn with the other endpoints, answered with BATCH_ACK and the
 * count landed - and the NOTIFY frames that follow the data of the other batches (copied
 * into mapped memory, or walked by the framework; shm_batch.c says how the initiator sends
 * each).
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
#define BATCH_DESC_CHUNK 1024   /* descriptors read from the initiator at a time: what one
                                 * peer's batch holds here, however many it has */

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
 * endpoints; it is answered, and consumed, once done - or at its deadline. Its descriptors
 * are read from the initiator BATCH_DESC_CHUNK at a time, so that a batch of XFER_SHM_BATCH_MAX
 * holds what one of BATCH_DESC_CHUNK does: each chunk checked against the region when read,
 * every chunk once before a byte moves and again when it is read to be moved (the initiator
 * may have changed its memory meanwhile). */
struct xfer_shm_batch_rx {
    uint64_t          pos;          /* our ring's position of its frame */
    uint64_t          count;        /* its descriptors */
    uint64_t          done;         /* ... moved whole */
    uint64_t          skip;         /* bytes of descriptor done moved */
    uint64_t          first;        /* the descriptor in iov[0] */
    uint64_t          loaded;       /* ... and how many iov holds */
    const uint8_t     *rbase;       /* the region, checked at the start and before every */
    size_t            rlen;         /* round after it (batch_rx_stopped) */
    xfer_batch_iov_t  iov[BATCH_DESC_CHUNK];
    struct iovec      liov[BATCH_IOV_CHUNK], riov[BATCH_IOV_CHUNK];
};

static void batch_rx_free(xfer_ep_h ep)
{
    free(ep->batch_rx);
    ep->batch_rx = NULL;
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

/* Into *stop_p (NULL: not wanted) the batch's stop word (hdr->d) and into iov (NULL: none)
 * its descriptors [first, first + n) (from hdr->b): from the initiator, in one system call
 * where they can. */
static xfer_status_t batch_rx_read(xfer_ep_h ep, const xfer_shm_frame_t *hdr, uint64_t *stop_p,
                                   xfer_batch_iov_t *iov, uint64_t first, uint64_t n)
{
    uint64_t at = hdr->b + first * sizeof(*iov);
    size_t len  = (size_t)n * sizeof(*iov);
    struct iovec l[2], r[2];
    unsigned k = 0;
    size_t want = 0;
    char why[XFER_REASON_MAX];
    xfer_status_t status = XFER_OK;

    if (stop_p != NULL) {
        l[k]   = (struct iovec){stop_p, sizeof(*stop_p)};
        r[k++] = (struct iovec){(void*)(uintptr_t)hdr->d, sizeof(*stop_p)};
        want  += sizeof(*stop_p);
    }
    if (iov != NULL) {
        l[k]   = (struct iovec){iov, len};
        r[k++] = (struct iovec){(void*)(uintptr_t)at, len};
        want  += len;
    }
    if (process_vm_readv(ep->peer_pid, l, k, r, k, 0) == (ssize_t)want) {
        return XFER_OK;
    }
    /* short or failed: each on its own, which says what failed */
    if (stop_p != NULL) {
        status = xfer_shm_cma(ep, stop_p, hdr->d, sizeof(*stop_p), 0, why, sizeof(why));
    }
    if ((status == XFER_OK) && (iov != NULL)) {
        status = xfer_shm_cma(ep, iov, at, len, 0, why, sizeof(why));
    }
    if (status != XFER_OK) {
        xfer_log_peer("batch_refused", XFER_LOG_WARN, XFER_SHM_SUBSYS, "refusing a batch: "
                      "reading its %s: %s", (iov == NULL) ? "stop word" : (stop_p == NULL) ?
                      "descriptors" : "stop word and descriptors", why);
    }
    return status;
}

/* Read descriptors [first, first + BATCH_DESC_CHUNK) (fewer at the end) into br->iov, and the
 * stop word with them into *stop_p (NULL: not wanted); each must lie in the region. */
static xfer_status_t batch_rx_load(xfer_ep_h ep, const xfer_shm_frame_t *hdr,
                                   xfer_shm_batch_rx_t *br, uint64_t first, uint64_t *stop_p)
{
    uint64_t n = (br->count - first < BATCH_DESC_CHUNK) ? br->count - first : BATCH_DESC_CHUNK;
    xfer_status_t status = batch_rx_read(ep, hdr, stop_p, br->iov, first, n);

    br->first  = first;
    br->loaded = (status == XFER_OK) ? n : 0;
    for (uint64_t i = 0; i < br->loaded; i++) {
        const xfer_batch_iov_t *v = &br->iov[i];

        if (!xfer_range_within((uintptr_t)br->rbase, br->rlen, v->remote, v->length) ||
            (v->length > SSIZE_MAX)) {
            xfer_log_peer("batch_refused", XFER_LOG_WARN, XFER_SHM_SUBSYS, "refusing a batch: "
                          "descriptor %llu (0x%llx+%llu) is outside region %llu",
                          (unsigned long long)(first + i), (unsigned long long)v->remote,
                          (unsigned long long)v->length, (unsigned long long)hdr->a);
            br->loaded = 0;
            return XFER_ERR_OUT_OF_RANGE;
        }
    }
    return status;
}

/* Check the frame's descriptors against its region before a byte moves - the last chunk
 * first, so that the first is loaded at the end, read with the stop word. */
static xfer_status_t batch_rx_start(xfer_ep_h ep, const xfer_shm_frame_t *hdr)
{
    xfer_status_t status = XFER_OK;
    uint64_t stop        = 0;
    xfer_shm_batch_rx_t *br;
    xfer_region_t *region;

    region = xfer_shm_region_named(ep, hdr->a, hdr->e, 0, &status);
    if (region == NULL) {
        xfer_log_peer("batch_refused", XFER_LOG_WARN, XFER_SHM_SUBSYS,
                      "refusing a batch naming region %llu: %s", (unsigned long long)hdr->a,
                      xfer_status_string(status));
        return status;
    }
    br = malloc(sizeof(*br));    /* its arrays are written before they are read */
    if (br == NULL) {
        return XFER_ERR_NO_MEMORY;
    }
    br->count = hdr->c;
    br->done  = 0;
    br->skip  = 0;
    br->rbase = region->addr;
    br->rlen  = region->length;
    for (uint64_t k = (br->count - 1) / BATCH_DESC_CHUNK + 1; (k-- > 0) && (status == XFER_OK);) {
        status = batch_rx_load(ep, hdr, br, k * BATCH_DESC_CHUNK, (k == 0) ? &stop : NULL);
    }
    if (status == XFER_OK) {
        status = batch_stop_status(stop);   /* ended before it started: nothing moves */
    }
    if (status != XFER_OK) {
        free(br);
        return status;
    }
    br->pos      = ep->in.pos;
    ep->batch_rx = br;
    return XFER_OK;
}

/* Move up to budget bytes of the batch, in chunks of descriptors whose ranges are merged on
 * each side where they touch; a short transfer goes on from where it stopped. XFER_OK when
 * every descriptor moved, XFER_INPROGRESS when the rest waits for the next round, or the
 * error of a transfer or of the descriptors read next. */
static xfer_status_t batch_rx_move(xfer_ep_h ep, const xfer_shm_frame_t *hdr, int get,
                                   uint64_t budget)
{
    xfer_shm_batch_rx_t *br = ep->batch_rx;
    uint64_t moved          = 0;

    for (;;) {
        uint64_t skip_left, n, end = br->first + br->loaded;
        xfer_status_t status;
        size_t nl, nr, want;
        ssize_t got;

        if ((br->done == end) && (br->done < br->count)) {
            status = batch_rx_load(ep, hdr, br, br->done, NULL);
            if (status != XFER_OK) {
                return status;
            }
            continue;
        }
        if ((br->done < br->count) && (br->iov[br->done - br->first].length == br->skip)) {
            br->done++;             /* finished, or empty */
            br->skip = 0;
            continue;
        }
        if (br->done == br->count) {
            return XFER_OK;
        }
        if (moved >= budget) {
            return XFER_INPROGRESS;
        }
        n    = (end - br->done < BATCH_IOV_CHUNK) ? end - br->done : BATCH_IOV_CHUNK;
        want = batch_iov_build(br->iov + (br->done - br->first), n, br->skip, br->liov, &nl,
                               br->riov, &nr, budget - moved);
        got  = get ? process_vm_writev(ep->peer_pid, br->liov, nl, br->riov, nr, 0) :
                     process_vm_readv(ep->peer_pid, br->liov, nl, br->riov, nr, 0);
        if (got <= 0) {
            xfer_log(XFER_LOG_ERROR, XFER_SHM_SUBSYS, "a peer's batch: %s of %zu bytes "
                     "in pid %d failed: %s", get ? "process_vm_writev" : "process_vm_readv",
                     want, (int)ep->peer_pid, (got == 0) ? "no progress" : strerror(errno));
            return ((got < 0) && (errno == ESRCH)) ? XFER_ERR_CONNECTION : XFER_ERR_IO;
        }
        ep->rx_copied += (uint64_t)got;
        ep->rx_bytes  += get ? 0 : (uint64_t)got;
        moved         += (uint64_t)got;
        /* past the descriptors the transfer finished (all of them loaded) */
        for (skip_left = (uint64_t)got; skip_left > 0;) {
            uint64_t left = br->iov[br->done - br->first].length - br->skip;

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
    if (xfer_shm_region_named(ep, hdr->a, hdr->e, 1, &status) == NULL) {
        xfer_log_peer("batch_refused", XFER_LOG_INFO, XFER_SHM_SUBSYS, "a batch stops: its "
                      "region %llu is no longer registered", (unsigned long long)hdr->a);
        return status;
    }
    status = batch_rx_read(ep, hdr, &stop, NULL, 0, 0);
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

/* The peer's notification: its batch's data is in (a CMA batch's descriptors were checked
 * whole here; other batches' data came before it). */
static xfer_status_t notify_deliver(xfer_ep_h ep, const void *msg, size_t len)
{
    char why[XFER_REASON_MAX];

    return notify_delivered(ep, xfer_notify_deliver(&ep->iface->params, ep->fail.fw_ep, NULL,
                                                    0, msg, len, XFER_SHM_SUBSYS, why,
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
            status = batch_rx_move(ep, hdr, (hdr->flags & XFER_SHM_FL_GET) != 0,
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
        (notify_deliver(ep, payload, hdr->len) != XFER_OK)) {
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

    if (hdr->a != 0) {
        snprintf(why, why_size, "a notification after %llu puts of its batch: it follows its "
                 "batch's data, not frames of it (a is reserved, 0)", (unsigned long long)hdr->a);
        return XFER_ERR_PROTOCOL;
    }
    if (hdr->b == 0) {      /* whole in this frame */
        if (!(hdr->flags & XFER_SHM_FL_VOID)) {
            (void)notify_deliver(ep, payload, hdr->len);
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
                                                      &ep->notify_rx, NULL, 0,
                                                      XFER_SHM_SUBSYS, why,
                                                      why_size), why);
    return XFER_OK;
}
