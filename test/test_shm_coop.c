/*
 * Large puts into memory the peer allocated with xfer_mem_alloc() (XFER_SHM_COOP_MIN, lowered
 * here to 256 KiB so that a 1 MiB put has 4 parts) are copied by both sides while the owner
 * progresses: the data lands whole, from a mapped source or by CMA, and the initiator's log
 * shows the owner took parts; an owner that does not progress takes none and the put
 * completes anyway; a flush waits for a shared put; a forced close completes one that waits,
 * and so does one from a put's callback; puts posted from completion callbacks run to the
 * end. A large message from allocated memory into allocated memory is shared the same way:
 * the sender copies parts into the receive buffer, which it maps. The owner: shm_owner.h.
 */
#include "shm_owner.h"
#include "test_util.h"

#include <criterion/criterion.h>

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

TestSuite(shm_coop, .init = shm_owner_suite_init, .timeout = 120);

/* ---- large puts, copied by both sides -------------------------------------------------------- */

#define COOP_TRIES 20

static void coop_env(void)
{
    setenv("XFER_SHM_COOP_MIN", "256k", 1);
    setenv("XFER_LOG_LEVEL", "debug", 1);
}

/* The owner with one allocation (k), sharing from 256 KiB. */
static void coop_start_owner(init_t *in, peer_key_t *k)
{
    coop_env();
    init_start(in);
    key_take(&in->p, CMD_ALLOC, k);
}

/* The same, and LEN bytes of ours from xfer_mem_alloc (*mem). */
static void coop_start(init_t *in, peer_key_t *k, xfer_mem_t **mem)
{
    coop_start_owner(in, k);
    cr_assert_eq(xfer_mem_alloc(in->p.ctx, LEN, XFER_MEM_HOST, mem), XFER_OK);
}

static void coop_finish(init_t *in, peer_key_t *k, xfer_mem_t *mem)
{
    cr_assert_eq(xfer_mem_deregister(mem), XFER_OK);
    init_finish(in, k, 1);
}

/* stderr goes to a file while the puts run: the initiator's debug log says, per shared put,
 * how many of its parts the target copied. The file is read through a description of its
 * own, so reading does not move where the log writes. */
typedef struct log_capture {
    char     path[64];
    int      saved;
    FILE     *reader;
    unsigned shared;    /* shared puts logged so far */
    unsigned took;      /* ... of which the target took parts */
} log_capture_t;

static void capture_start(log_capture_t *c)
{
    int fd;

    fflush(stderr);
    memset(c, 0, sizeof(*c));
    snprintf(c->path, sizeof(c->path), "/tmp/xfer-test-log-XXXXXX");
    fd = mkstemp(c->path);
    cr_assert_geq(fd, 0);
    c->saved  = dup(2);
    c->reader = fopen(c->path, "r");
    cr_assert((c->saved >= 0) && (c->reader != NULL));
    cr_assert_geq(dup2(fd, 2), 0);
    close(fd);
    unlink(c->path);
}

/* Read what was logged since the last scan. */
static void capture_scan(log_capture_t *c)
{
    char line[512];

    fflush(stderr);
    clearerr(c->reader);
    for (;;) {
        long at = ftell(c->reader);
        const char *p;
        unsigned theirs, parts;

        if (fgets(line, sizeof(line), c->reader) == NULL) {
            break;
        }
        if (strchr(line, '\n') == NULL) {
            fseek(c->reader, at, SEEK_SET);     /* the rest of the line is still coming */
            break;
        }
        p = strstr(line, "the peer copied ");
        if ((p != NULL) && (sscanf(p, "the peer copied %u of its %u parts", &theirs,
                                   &parts) == 2)) {
            cr_assert_eq(parts, LEN / (256u * 1024u), "a 1 MiB put in %u parts", parts);
            cr_assert_leq(theirs, parts);
            c->shared++;
            c->took += (theirs > 0);
        }
    }
}

static void capture_end(log_capture_t *c)
{
    capture_scan(c);
    cr_assert_geq(dup2(c->saved, 2), 0);
    close(c->saved);
    fclose(c->reader);
}

/* Pin this process and the owner to two cpus of ours: left to itself, the scheduler of a
 * busy machine runs two processes that talk over a socket on one core, and then the owner
 * never runs while a put is being copied. 0 when there is only one cpu. */
static int coop_pin(init_t *in)
{
    cpu_set_t set, one;
    int cpus[2], n = 0;

    cr_assert_eq(sched_getaffinity(0, sizeof(set), &set), 0);
    for (int c = 0; (c < CPU_SETSIZE) && (n < 2); c++) {
        if (CPU_ISSET(c, &set)) {
            cpus[n++] = c;
        }
    }
    if (n < 2) {
        return 0;
    }
    CPU_ZERO(&one);
    CPU_SET(cpus[0], &one);
    cr_assert_eq(sched_setaffinity(0, sizeof(one), &one), 0);
    tp_send(&in->p, CMD_PIN);
    tp_send(&in->p, (uint64_t)cpus[1]);
    cr_assert_eq(tp_recv(&in->p), 1, "the owner could not be pinned");
    return 1;
}

/* The owner with one allocation, ours, both pinned where there are two cpus. */
static void coop_start_pinned(init_t *in, peer_key_t *k, xfer_mem_t **mem)
{
    coop_start(in, k, mem);
    (void)coop_pin(in);
}

/* The owner progresses without sleeping until the next command. */
static void owner_spin(init_t *in)
{
    tp_send(&in->p, CMD_SPIN);
    cr_assert_eq(tp_recv(&in->p), 1);
}

/* The owner pinned and spinning, our allocation filled with pattern(seed), the log captured:
 * ready for puts from that allocation. */
static void coop_spinning(init_t *in, peer_key_t *k, xfer_mem_t **mem, uint64_t seed,
                          log_capture_t *cap)
{
    coop_start_pinned(in, k, mem);
    tp_fill_pattern(xfer_mem_address(*mem), LEN, seed);
    owner_spin(in);
    capture_start(cap);
}

/* Puts of the whole allocation from src while the owner spins in progress, each checked
 * whole (a new pattern each time), until the owner took parts of COOP_TRIES of them or
 * COOP_MS passed (the cpus may be busy with other work). */
#define COOP_MS 5000
static void coop_puts(init_t *in, const peer_key_t *k, uint8_t *src, xfer_mem_t *mem,
                      log_capture_t *cap)
{
    double end = tp_now_ms() + COOP_MS;
    unsigned i;

    capture_start(cap);
    for (i = 0; (cap->took < COOP_TRIES) && (tp_now_ms() < end); i++) {
        owner_spin(in);
        tp_fill_pattern(src, LEN, 100 + i);
        cr_assert_eq(rma(&in->p, 1, src, mem, k, 0, LEN, TP_WAIT_MS, NULL), XFER_OK);
        /* the check is a command: it ends the owner's spin */
        cr_assert(owner_holds(&in->p, k, 0, LEN, 100 + i), "put %u landed whole", i);
        capture_scan(cap);
    }
    capture_end(cap);
    /* the first put is announced; a later one only once the owner read the last announcement
     * (it spins, but may not have run since) */
    cr_assert((cap->shared >= 1) && (cap->shared <= i), "%u of %u puts were shared",
              cap->shared, i);
    cr_log_info("the owner took parts of %u of %u puts", cap->took, i);
}

Test(shm_coop, a_large_put_from_allocated_memory_is_copied_by_both_sides)
{
    log_capture_t cap;
    xfer_mem_t *mem;
    init_t in;
    peer_key_t k;
    int pinned;

    coop_start(&in, &k, &mem);
    pinned = coop_pin(&in);
    coop_puts(&in, &k, xfer_mem_address(mem), mem, &cap);
    if (pinned) {
        cr_assert_gt(cap.took, 0, "a spinning owner on a cpu of its own took parts of none "
                     "of %u puts", cap.shared);
    } else {
        cr_log_warn("one cpu: the owner never runs beside the initiator, nothing to check");
    }
    coop_finish(&in, &k, mem);
}

/* From malloc'd memory the owner reads its parts by CMA, where the kernel allows it; where it
 * does not, the initiator copies them all. Either way every put lands whole. */
Test(shm_coop, a_large_put_from_registered_memory_lands_whole)
{
    log_capture_t cap;
    init_t in;
    peer_key_t k;

    coop_start_owner(&in, &k);
    coop_puts(&in, &k, in.buf, in.mem, &cap);
    init_finish(&in, &k, 1);
}

/* An owner that does not progress takes no part, and is told of the first put only: the
 * rest are not announced, so that its ring does not fill with frames it would skip (and a
 * flush, which waits for what is queued for the ring, still completes). */
Test(shm_coop, large_puts_complete_while_the_owner_does_not_progress)
{
    xfer_request_t *flush = NULL;
    log_capture_t cap;
    init_t in;
    peer_key_t k;

    coop_start_owner(&in, &k);
    owner_pause(&in.p);
    capture_start(&cap);
    for (unsigned i = 0; i < 300; i++) {
        tp_fill_pattern(in.buf, LEN, 21 + i);
        cr_assert_eq(rma(&in.p, 1, in.buf, in.mem, &k, 0, LEN, 2000, NULL), XFER_OK,
                     "large put %u waited for an owner that does not progress", i);
    }
    cr_assert(TP_POSTED(xfer_endpoint_flush(in.p.ep, NULL, NULL, &flush)));
    cr_assert_eq(xfer_request_wait(flush, 2000), XFER_OK, "a flush waited for the owner");
    xfer_request_release(flush);
    capture_end(&cap);
    cr_assert_eq(cap.shared, 1, "%u puts were announced to an owner that reads none",
                 cap.shared);
    cr_assert_eq(cap.took, 0, "an owner in a pause took parts");
    cr_assert(owner_holds(&in.p, &k, 0, LEN, 21 + 299));
    init_finish(&in, &k, 1);
}

/* Shared puts, each followed by a flush: the flush completes after its put. */
Test(shm_coop, a_flush_completes_after_the_shared_puts_before_it)
{
    xfer_request_t *put, *flush;
    xfer_mem_t *mem;
    uint8_t *src;
    init_t in;
    peer_key_t k;

    coop_start(&in, &k, &mem);
    src = xfer_mem_address(mem);
    owner_spin(&in);
    for (unsigned round = 0; round < COOP_TRIES; round++) {
        tp_fill_pattern(src, LEN, 40 + round);
        cr_assert(TP_POSTED(xfer_put(in.p.ep, src, LEN, mem, k.addr, k.rkey, NULL, NULL,
                                     &put)));
        cr_assert(TP_POSTED(xfer_endpoint_flush(in.p.ep, NULL, NULL, &flush)));
        cr_assert_eq(xfer_request_wait(flush, TP_WAIT_MS), XFER_OK);
        cr_assert_eq(xfer_request_test(put), XFER_OK, "round %u: the put is not done at its "
                     "flush", round);
        xfer_request_release(put);
        xfer_request_release(flush);
    }
    cr_assert(owner_holds(&in.p, &k, 0, LEN, 40 + COOP_TRIES - 1));
    coop_finish(&in, &k, mem);
}

/* Messages from the owner's allocation into one of ours, the owner spinning meanwhile: each
 * arrives whole, and the owner (the sender) copied parts of some. */
Test(shm_coop, a_large_message_between_allocated_memory_is_copied_by_both_sides)
{
    double end = tp_now_ms() + COOP_MS;
    xfer_request_t *req;
    log_capture_t cap;
    xfer_mem_t *mem;
    uint8_t *dst;
    init_t in;
    peer_key_t k;
    int pinned;
    unsigned i;

    coop_start(&in, &k, &mem);
    dst    = xfer_mem_address(mem);
    pinned = coop_pin(&in);
    capture_start(&cap);
    for (i = 0; (cap.took < COOP_TRIES) && (tp_now_ms() < end); i++) {
        memset(dst, 0, LEN);
        tp_send(&in.p, CMD_SEND);
        tp_send(&in.p, k.index);
        cr_assert_eq(tp_recv(&in.p), 1);
        owner_spin(&in);
        req = NULL;
        cr_assert(TP_POSTED(xfer_tag_recv(in.p.ctx, in.p.ep, MSG_TAG + k.index, UINT64_MAX,
                                          dst + MSG_OFF, MSG_LEN, mem, NULL, NULL, &req)));
        cr_assert_eq(xfer_request_wait(req, TP_WAIT_MS), XFER_OK);
        cr_assert_eq(xfer_request_length(req), MSG_LEN);
        xfer_request_release(req);
        cr_assert_lt(tp_check_pattern_at(dst, MSG_OFF, MSG_LEN, FILL), 0,
                     "message %u arrived whole", i);
        for (size_t b = 0; b < MSG_OFF; b++) {
            cr_assert((dst[b] == 0) && (dst[MSG_OFF + MSG_LEN + b] == 0),
                      "message %u wrote outside its buffer", i);
        }
        send_done(&in, XFER_OK);    /* a command: it ends the spin */
        capture_scan(&cap);
    }
    capture_end(&cap);
    cr_assert((cap.shared >= 1) && (cap.shared <= i), "%u of %u messages were shared",
              cap.shared, i);
    cr_log_info("the sender took parts of %u of %u messages", cap.took, i);
    if (pinned) {
        cr_assert_gt(cap.took, 0, "a spinning sender on a cpu of its own took parts of none "
                     "of %u messages", i);
    }
    coop_finish(&in, &k, mem);
}

/* A forced close while a shared put may still wait for the owner's parts: the put completes
 * (done, or cancelled), the close completes, and nothing is touched after (ASan, valgrind).
 * The close comes right after a post that had not completed yet; with the owner spinning on
 * a cpu of its own that is mostly a put whose owner still copies a part. */
Test(shm_coop, a_forced_close_completes_a_shared_put_that_waits)
{
    xfer_request_t *put = NULL, *close_req = NULL;
    xfer_status_t st = XFER_OK;
    xfer_mem_t *mem;
    init_t in;
    peer_key_t k;

    coop_start_pinned(&in, &k, &mem);
    owner_spin(&in);
    for (unsigned i = 0; i < 1000; i++) {
        cr_assert(TP_POSTED(xfer_put(in.p.ep, xfer_mem_address(mem), LEN, mem, k.addr, k.rkey,
                                     NULL, NULL, &put)));
        st = xfer_request_test(put);
        if (st == XFER_INPROGRESS) {
            break;
        }
        cr_assert_eq(st, XFER_OK);
        xfer_request_release(put);
        put = NULL;
    }
    cr_log_info("closing with a put %s", (put != NULL) ? "not completed" : "none pending");
    cr_assert(TP_POSTED(xfer_endpoint_close_nb(in.p.ep, XFER_CLOSE_FLAG_FORCE, NULL, NULL,
                                               &close_req)));
    in.p.ep = NULL;
    cr_assert_eq(xfer_request_wait(close_req, TP_WAIT_MS), XFER_OK);
    xfer_request_release(close_req);
    if (put != NULL) {
        st = xfer_request_wait(put, TP_WAIT_MS);
        cr_assert((st == XFER_OK) || (st == XFER_ERR_CANCELED), "the put after a forced close: "
                  "%s", xfer_status_string(st));
        cr_log_info("the put ended: %s", xfer_status_string(st));
        xfer_request_release(put);
    }
    coop_finish(&in, &k, mem);
}

/* Shared puts posted from completion callbacks, each from the one before it (with a pattern of
 * its own, written into the source the completed put let go of): a callback runs from
 * progress once its put's parts are all counted, so the put it posts opens a slot anew; the
 * chain runs to its end and the last put lands whole. */
#define CHAIN_LEN 20

typedef struct put_chain {
    xfer_endpoint_t  *ep;
    xfer_mem_t       *mem;
    uint8_t          *src;
    const peer_key_t *k;
    unsigned         posted, done, failed;
    xfer_status_t    last;
} put_chain_t;

static void chain_cb(xfer_request_t *req, xfer_status_t status, void *arg)
{
    put_chain_t *c = arg;
    xfer_status_t st;

    (void)req;
    c->done++;
    if (status != XFER_OK) {
        c->failed++;
        c->last = status;
        return;
    }
    if (c->posted < CHAIN_LEN) {
        /* the put before is done with src: the next one carries a pattern of its own */
        tp_fill_pattern(c->src, LEN, 77 + c->posted);
        st = xfer_put(c->ep, c->src, LEN, c->mem, c->k->addr, c->k->rkey, chain_cb, c, NULL);
        if (st == XFER_OK) {
            c->posted++;
        } else {
            c->failed++;
            c->last = st;
        }
    }
}

Test(shm_coop, shared_puts_posted_from_completion_callbacks_run_to_the_end)
{
    put_chain_t c = {0};
    log_capture_t cap;
    xfer_mem_t *mem;
    init_t in;
    peer_key_t k;
    double end;

    coop_spinning(&in, &k, &mem, 77, &cap);
    c.ep  = in.p.ep;
    c.mem = mem;
    c.src = xfer_mem_address(mem);
    c.k   = &k;
    cr_assert_eq(xfer_put(c.ep, c.src, LEN, mem, k.addr, k.rkey, chain_cb, &c, NULL), XFER_OK);
    c.posted = 1;
    end = tp_now_ms() + TP_WAIT_MS;
    while ((c.done < c.posted || c.posted < CHAIN_LEN) && (c.failed == 0) &&
           (tp_now_ms() < end)) {
        xfer_progress(in.p.ctx);
    }
    capture_end(&cap);
    cr_assert_eq(c.failed, 0, "a put of the chain failed: %s", xfer_status_string(c.last));
    cr_assert_eq(c.done, CHAIN_LEN, "%u of %u puts completed (%u posted)", c.done, CHAIN_LEN,
                 c.posted);
    cr_assert_geq(cap.shared, 1, "no put of the chain was shared");
    cr_log_info("%u of %u chained puts shared, the owner took parts of %u", cap.shared,
                CHAIN_LEN, cap.took);
    cr_assert(owner_holds(&in.p, &k, 0, LEN, 77 + CHAIN_LEN - 1),
              "the chain's last put landed whole");
    coop_finish(&in, &k, mem);
}

/* A callback that force-closes the endpoint while other shared puts on it still wait for
 * their parts: the close runs from inside progress, after the transport counted the first
 * put; every other put still completes, once (done or cancelled), the close completes, and
 * nothing of the endpoint is touched after (ASan, valgrind). */
#define CLOSE_PUTS 8

typedef struct put_close {
    xfer_endpoint_t *ep;
    xfer_request_t  *close_req;
    unsigned        done, ok, canceled, other;
    xfer_status_t   odd;
} put_close_t;

static void close_cb(xfer_request_t *req, xfer_status_t status, void *arg)
{
    put_close_t *c = arg;

    (void)req;
    c->done++;
    if (status == XFER_OK) {
        c->ok++;
    } else if (status == XFER_ERR_CANCELED) {
        c->canceled++;
    } else {
        c->other++;
        c->odd = status;
    }
    if (c->ep != NULL) {
        cr_assert(TP_POSTED(xfer_endpoint_close_nb(c->ep, XFER_CLOSE_FLAG_FORCE, NULL, NULL,
                                                   &c->close_req)));
        c->ep = NULL;
    }
}

Test(shm_coop, a_callback_that_closes_the_endpoint_completes_the_puts_still_shared)
{
    put_close_t c = {0};
    log_capture_t cap;
    xfer_mem_t *mem;
    init_t in;
    peer_key_t k;
    double end;

    coop_spinning(&in, &k, &mem, 5, &cap);
    c.ep = in.p.ep;
    for (unsigned i = 0; i < CLOSE_PUTS; i++) {
        cr_assert_eq(xfer_put(in.p.ep, xfer_mem_address(mem), LEN, mem, k.addr, k.rkey,
                              close_cb, &c, NULL), XFER_OK, "put %u", i);
    }
    in.p.ep = NULL;     /* the first callback closes it */
    end = tp_now_ms() + TP_WAIT_MS;
    while ((c.done < CLOSE_PUTS) && (tp_now_ms() < end)) {
        xfer_progress(in.p.ctx);
    }
    capture_end(&cap);
    cr_assert_eq(c.done, CLOSE_PUTS, "%u of %u puts completed", c.done, CLOSE_PUTS);
    cr_assert_eq(c.other, 0, "a put ended with %s", xfer_status_string(c.odd));
    cr_assert_geq(c.ok, 1, "the put whose callback closed completed");
    cr_assert_not_null(c.close_req);
    cr_assert_eq(xfer_request_wait(c.close_req, TP_WAIT_MS), XFER_OK);
    xfer_request_release(c.close_req);
    cr_log_info("%u puts done, %u cancelled by the close; %u shared, the owner took parts of %u",
                c.ok, c.canceled, cap.shared, cap.took);
    coop_finish(&in, &k, mem);
}
