/*
 * The staging suites' two processes (test_staging.c: the put/get pipeline; test_staging_msg.c:
 * tagged messages and tensors staged whole): a target child with a registered host region,
 * driven by commands over the control socket, and an initiator whose registered host memory
 * the framework stages as if a transport could not touch it (xfer_staging_test_host), with
 * the memcpy copy engine standing in for a GPU's.
 */
#ifndef XFERTEST_STAGING_FIXTURE_H
#define XFERTEST_STAGING_FIXTURE_H

#include "test_peer.h"
#include "staging_test.h"

#include <stddef.h>
#include <stdint.h>

#define CHUNK   4096u
#define RLEN    (1u << 20)          /* the target's registered region */
#define SLACK   (16u << 10)         /* unregistered guard bytes on each side */
#define ALEN    (RLEN + 2 * SLACK)
#define ROFF    4099u               /* where in the target's region transfers go */

enum {
    CMD_DONE = 1,
    CMD_FILL,       /* seed: fill the whole allocation */
    CMD_CHECK,      /* off, len, seed_in, seed_fill: [off, off+len) of the region holds
                     * pattern(seed_in) at its place, every other byte pattern(seed_fill) */
    CMD_RANGE,      /* off, len, seed: [off, off+len) of the region holds pattern(seed) */
    CMD_RECV,       /* len, tag: receive into the region's start; answers 1 once posted, then
                     * 2 + the length received */
    CMD_SEND,       /* len, tag, seed: the region's start filled with pattern(seed), sent;
                     * answers 1 once posted (the send completes while waiting for more) */
    CMD_PUBLISH,    /* step, len, seed: the region's start filled and published as "t";
                     * answers 1 */
};

typedef struct stg {
    tp_peer_t   peer;
    uint64_t    base;           /* the target's region */
    xfer_rkey_t *rkey;
    char        *local;         /* ALEN bytes; [SLACK, SLACK + RLEN) registered */
    xfer_mem_t  *mem;
} stg_t;

/* The suites' init: a 4 KiB staging chunk, the default depth, no CUDA driver chosen. */
void stg_setup(void);
/* The target child (tp_start's server function). */
int srv_target(tp_side_t *s);
/* A target child and a parent context whose host memory is staged, depth bounce buffers of
 * CHUNK bytes, copies landing after delay polls; and its end. */
void stg_start(stg_t *t, unsigned depth, unsigned delay);
void stg_finish(stg_t *t);
/* The target's whole allocation filled with pattern(seed). */
void remote_fill(stg_t *t, uint64_t seed);
/* After a flush (none when t->peer.ep is NULL: closed), the target's region holds
 * pattern(seed_in) at [off, off + len), pattern(seed_fill) around. */
void remote_check(stg_t *t, uint64_t off, uint64_t len, uint64_t seed_in, uint64_t seed_fill,
                  const char *what);
/* The local allocation holds pattern(seed_fill) everywhere but [SLACK + off, +len), which
 * holds the target's pattern(seed_remote) of its region at roff. */
void local_check(stg_t *t, size_t off, size_t len, uint64_t seed_remote, uint64_t roff,
                 uint64_t seed_fill, const char *what);
size_t chunks_of(size_t len);

#endif /* XFERTEST_STAGING_FIXTURE_H */
