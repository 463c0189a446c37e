/*
 * Messages nobody received yet, on every transport (framework/tag_match.c keeps them): the
 * buffers of large ones are kept when freed and taken again by the next ones they fit. Rounds
 * of messages of mixed sizes arrive with nothing posted, then receives take them: every one
 * lands whole, of its own length and bytes (a kept buffer never leaks a message's bytes into
 * another's, nor its length), truncated ones included, whether its buffer was kept, too large
 * to keep or pushed out of the kept ones, or the message stayed at the sender until its
 * receive pulled it (shm by CMA, verbs by RDMA READ); the bound, XFER_UNEXPECTED_EP, is 4 MiB
 * here. And once a round has warmed the kept buffers, a round of large messages lands without
 * faulting in a fresh page per 4 KiB of data, which is what made a receiver that fell behind
 * a stream of large messages stay behind (tcp tag_bw 1 MiB at a quarter of its speed). Two
 * processes, over XFERTEST_TRANSPORT.
 */
#include "test_peer.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

static void setup(void)
{
    tp_env();
    setenv("XFER_UNEXPECTED_EP", "4m", 1);
}

TestSuite(unexp, .init = setup, .timeout = 120);

#define TAG 9u

/* A round's sizes: 1 MiB (kept); 4 KiB less (a kept 1 MiB buffer fits it); small ones, never
 * kept; 768 KiB + 1 (a 1 MiB buffer would waste more than a quarter on it: a new one); the
 * smallest size kept and one byte less; one larger than the bound (never kept); and enough
 * of about 1 MiB to push earlier buffers out of it. */
static const size_t sizes[] = {
    1u << 20, (1u << 20) - 4096, 100, (768u << 10) + 1, 65536, 65535, (5u << 20) + 3,
    1u << 20, (1u << 20) + 1, 300u << 10, 1u << 20, 1u << 20, 8,
};
#define NSIZES    (sizeof(sizes) / sizeof(sizes[0]))
#define ROUNDS    4
#define TRUNCATE  3     /* this one is received into a buffer 1000 bytes short */
#define LARGE     (1u << 20)
#define NLARGE    16    /* the fault round: 1 MiB messages */
#define NBUF      ((NLARGE > NSIZES) ? NLARGE : NSIZES)

static uint64_t seed_of(unsigned round, size_t i)
{
    return (uint64_t)round * 100 + i + 1;
}

/* Per word of the parent: 1..ROUNDS send that round's sizes, ROUNDS + 1 sends NLARGE 1 MiB
 * messages, 0 ends. */
static int srv_rounds(tp_side_t *s)
{
    for (;;) {
        size_t n = NSIZES, len;
        xfer_request_t *req[NBUF];
        char *buf[NBUF];
        uint64_t v;

        TP_CHECK(tp_progress_until_ctl(s, TP_WAIT_MS) == 0, "no word from the parent");
        TP_CHECK(tp_ctl_recv_u64(s->ctl, &v, TP_WAIT_MS) == 0, "ctl");
        if (v == 0) {
            return 0;
        }
        if (v == ROUNDS + 1) {
            n = NLARGE;
        }
        for (size_t i = 0; i < n; i++) {
            xfer_status_t st;

            len    = (v == ROUNDS + 1) ? LARGE : sizes[i];
            buf[i] = malloc(len);
            TP_CHECK(buf[i] != NULL, "malloc");
            tp_fill_pattern(buf[i], len, seed_of((unsigned)v, i));
            req[i] = NULL;
            st     = xfer_tag_send(s->ep, TAG, buf[i], len, NULL, NULL, NULL, &req[i]);
            TP_CHECK(TP_POSTED(st), "send %zu of round %llu: %s", i, (unsigned long long)v,
                     xfer_status_string(st));
        }
        for (size_t i = 0; i < n; i++) {
            TP_CHECK_STATUS(xfer_request_wait(req[i], TP_WAIT_MS), XFER_OK);
            xfer_request_release(req[i]);
            free(buf[i]);
        }
        TP_CHECK(tp_ctl_send_u64(s->ctl, 1) == 0, "ctl");
    }
}

/* Receive n messages of round r, all arrived (or waiting, paused) before their receives. */
static void take_round(tp_peer_t *p, unsigned r, size_t n, const size_t *lens, char **buf)
{
    for (size_t i = 0; i < n; i++) {
        size_t cap          = lens[i] - ((i == TRUNCATE) ? 1000 : 0);
        xfer_status_t want  = (i == TRUNCATE) ? XFER_ERR_TRUNCATED : XFER_OK;
        xfer_request_t *req = NULL;

        memset(buf[i], 0, lens[i]);
        cr_assert(TP_POSTED(xfer_tag_recv(p->ctx, p->ep, TAG, UINT64_MAX, buf[i], cap, NULL,
                                          NULL, NULL, &req)));
        cr_assert_eq(xfer_request_wait(req, TP_WAIT_MS), want, "round %u, message %zu (%zu "
                     "bytes)", r, i, lens[i]);
        cr_assert_eq(xfer_request_length(req), lens[i], "round %u, message %zu: length", r, i);
        cr_assert_eq(tp_check_pattern(buf[i], cap, seed_of(r, i)), -1, "round %u, message %zu "
                     "(%zu bytes): its bytes", r, i, lens[i]);
        cr_assert((cap == lens[i]) || (buf[i][cap] == 0), "round %u, message %zu: a byte past "
                  "the receive's buffer", r, i);
        xfer_request_release(req);
    }
}

static long minor_faults(void)
{
    struct rusage ru;

    cr_assert_eq(getrusage(RUSAGE_SELF, &ru), 0);
    return ru.ru_minflt;
}

Test(unexp, unexpected_messages_land_whole_from_kept_buffers_without_faulting_them_in)
{
    size_t large[NLARGE];
    char *buf[NBUF];
    long before, faults;
    tp_peer_t p;

    for (size_t i = 0; i < NLARGE; i++) {
        large[i] = LARGE;
    }
    tp_start(&p, srv_rounds, NULL);
    /* the receive buffers, touched now - after the fork, which would make every page
     * copy-on-write again - so that only the transport's own pages count below */
    for (size_t i = 0; i < NBUF; i++) {
        buf[i] = malloc((5u << 20) + 3);
        cr_assert_not_null(buf[i]);
        memset(buf[i], 1, (5u << 20) + 3);
    }
    for (unsigned r = 1; r <= ROUNDS; r++) {
        tp_send(&p, r);
        /* with nothing posted: what the bound admits waits as unexpected messages, the rest
         * in the socket until receives drain them */
        tp_progress_for(p.ctx, 200);
        take_round(&p, r, NSIZES, sizes, buf);
        cr_assert_eq(tp_recv(&p), 1);
    }
    /* 16 MiB in 1 MiB messages, 4 MiB of them at a time in kept buffers */
    tp_send(&p, ROUNDS + 1);
    before = minor_faults();
    tp_progress_for(p.ctx, 200);
    take_round(&p, ROUNDS + 1, NLARGE, large, buf);
    faults = minor_faults() - before;
    cr_assert_eq(tp_recv(&p), 1);
    cr_log_info("%ld minor faults while %u MiB arrived as unexpected messages", faults, NLARGE);
    /* A fresh buffer faults in each of its 256 pages, unless malloc kept it from the last
     * free: with nothing kept, 480 of the round's 4096 pages faulted here (glibc gives some
     * back). Valgrind's own bookkeeping faults pages of its own: not counted under it. */
    if (tp_slowdown() == 1) {
        cr_assert_lt(faults, 64, "%ld page faults: the kept buffers were not taken again",
                     faults);
    }
    tp_send(&p, 0);
    tp_finish(&p);
    for (size_t i = 0; i < NBUF; i++) {
        free(buf[i]);
    }
}
