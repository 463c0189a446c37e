/*
 * The slots of shared puts in the shm segment (components/shm/shm_ring.c, compiled in): two
 * sides racing through one claim word take every part exactly once, the target's the top
 * ones, counted right; a word of another generation, or one a peer made impossible, gives
 * nothing and counts nothing.
 */
#include "shm_ring_util.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>

TestSuite(shm_ring_coop, .timeout = 120);

/* ---- shared puts' slots ----------------------------------------------------------------- */

#define COOP_PARTS   200u
#define COOP_ROUNDS  2000

typedef struct coop_side {
    uint8_t  *base;
    uint32_t gen;
    int      back;
    int      *ready;    /* both sides count in, then start together */
    uint8_t  taken[COOP_PARTS];
    unsigned count;
} coop_side_t;

static void *coop_taker(void *arg)
{
    coop_side_t *c = arg;
    int i;

    __atomic_add_fetch(c->ready, 1, __ATOMIC_ACQ_REL);
    while (__atomic_load_n(c->ready, __ATOMIC_ACQUIRE) < 2) {
        sched_yield();
    }
    while ((i = xfer_shm_coop_take(c->base, 1, c->gen, COOP_PARTS, c->back)) >= 0) {
        c->taken[i]++;
        c->count++;
        for (volatile int spin = 0; spin < 200; spin++) {
            /* a part's copy: the other side takes meanwhile */
        }
        if ((c->count % 8) == 0) {
            sched_yield();  /* valgrind runs one thread at a time: let the other one in */
        }
        if (c->back) {
            xfer_shm_coop_done_add(c->base, 1, 0);
        }
    }
    return NULL;
}

/* Each round opens slot 1 anew and lets a thread per side take parts at once (through two
 * mappings, as two processes would): every part is taken exactly once, the target's parts are
 * the top ones, and the initiator counts exactly those as the target's, all done. */
Test(shm_ring_coop, shared_put_parts_are_taken_once_by_two_racing_sides)
{
    seg_t s;
    unsigned both = 0;

    seg_open(&s, NCELLS, CELL);
    for (uint32_t round = 1; round <= COOP_ROUNDS; round++) {
        int ready = 0;
        coop_side_t in = {.base = s.peer, .gen = round, .back = 0, .ready = &ready};
        coop_side_t tg = {.base = s.own, .gen = round, .back = 1, .ready = &ready};
        pthread_t t;
        int failed = 1, theirs;

        xfer_shm_coop_open(s.peer, 1, round, COOP_PARTS);
        cr_assert_eq(pthread_create(&t, NULL, coop_taker, &tg), 0);
        coop_taker(&in);
        pthread_join(t, NULL);
        for (unsigned i = 0; i < COOP_PARTS; i++) {
            cr_assert_eq(in.taken[i] + tg.taken[i], 1, "round %u: part %u taken %u + %u times",
                         round, i, in.taken[i], tg.taken[i]);
            cr_assert(!tg.taken[i] || (i >= in.count), "round %u: the target took part %u "
                      "below the initiator's %u", round, i, in.count);
        }
        theirs = xfer_shm_coop_theirs(s.peer, 1, round, COOP_PARTS);
        cr_assert_eq(theirs, (int)tg.count, "round %u: the target's parts", round);
        cr_assert_eq(xfer_shm_coop_done(s.peer, 1, round, &failed), (int64_t)tg.count);
        cr_assert_eq(failed, 0);
        both += (in.count > 0) && (tg.count > 0);
    }
    cr_log_info("both sides took parts in %u of %d rounds", both, COOP_ROUNDS);
    cr_assert_gt(both, 0, "the sides never raced: the test tests nothing");
    seg_close(&s);
}

static void coop_word_set(uint8_t *base, unsigned slot, int done, uint64_t v)
{
    memcpy(base + OFF_COOP + slot * 16 + (done ? 8 : 0), &v, 8);
}

/* What a hostile or confused peer leaves in a slot yields no part and no count. */
Test(shm_ring_coop, a_claim_word_of_another_generation_or_impossible_gives_nothing)
{
    static const struct {
        uint64_t word;
        const char *what;
    } bad[] = {
        {(8ull << 32) | (0 << 16) | 10, "another generation"},
        {(7ull << 32) | (6 << 16) | 5, "front past back"},
        {(7ull << 32) | (0 << 16) | 11, "back past the parts"},
        {(7ull << 32) | (0xffffull << 16) | 0xffff, "both at their largest"},
    };
    seg_t s;
    int failed = 0;

    seg_open(&s, NCELLS, CELL);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        coop_word_set(s.own, 2, 0, bad[i].word);
        cr_assert_eq(xfer_shm_coop_take(s.peer, 2, 7, 10, 0), -1, "front, %s", bad[i].what);
        cr_assert_eq(xfer_shm_coop_take(s.own, 2, 7, 10, 1), -1, "back, %s", bad[i].what);
        cr_assert_eq(xfer_shm_coop_theirs(s.peer, 2, 7, 10), -1, "theirs, %s", bad[i].what);
    }
    /* an open slot that is not finished has no count of the target's parts yet */
    xfer_shm_coop_open(s.peer, 2, 7, 10);
    cr_assert_eq(xfer_shm_coop_theirs(s.peer, 2, 7, 10), -1);
    cr_assert_eq(xfer_shm_coop_take(s.peer, 2, 7, 10, 0), 0);
    cr_assert_eq(xfer_shm_coop_take(s.own, 2, 7, 10, 1), 9);
    /* a late frame of the slot's last use takes nothing */
    cr_assert_eq(xfer_shm_coop_take(s.own, 2, 6, 10, 1), -1);
    cr_assert_eq(xfer_shm_coop_done(s.peer, 2, 7, &failed), 0);
    cr_assert_eq(xfer_shm_coop_done_add(s.own, 2, 1), 1, "the count after a part, failed");
    cr_assert_eq(xfer_shm_coop_done(s.peer, 2, 7, &failed), 1);
    cr_assert_eq(failed, 1, "a failed part is reported");
    cr_assert_eq(xfer_shm_coop_done(s.peer, 2, 6, &failed), -1, "another generation's count");
    cr_assert_eq(xfer_shm_coop_done_add(s.peer, 2, 0), 2, "the count after one more part");
    cr_assert_eq(xfer_shm_coop_done(s.peer, 2, 7, &failed), 2);
    cr_assert_eq(failed, 1, "a failed part stays reported");
    /* slots are apart: slot 3 is untouched */
    cr_assert_eq(xfer_shm_coop_take(s.peer, 3, 7, 10, 0), -1);
    seg_close(&s);
}
