/*
 * The tensor suites' two sides, shared by test_tensor.c (every transport) and
 * test_verbs_tensor.c (the verbs protocol's own cases): a producer child driven over the
 * control channel (publish this spec, wait for my publishes, abort this step, progress), and
 * the consumer's helpers that fetch and check metadata and data.
 */
#ifndef XFER_TEST_TENSOR_PEER_H
#define XFER_TEST_TENSOR_PEER_H

#include "test_peer.h"

#include <stddef.h>
#include <stdint.h>

#define SENTINEL ((void*)0x5e47)

enum {
    CMD_DONE = 1,
    CMD_PUBLISH,        /* spec_t; reply: the posting status */
    CMD_WAIT_ALL,       /* reply: int64 statuses of every publish request, in order */
    CMD_ABORT,          /* step, status; reply: the status of xfer_tensor_abort */
    CMD_PROGRESS,       /* ms; progress that long, reply 1 */
    CMD_COUNTERS,       /* reply: the producer endpoint's xfer_counter_t array */
};

typedef struct spec {
    uint64_t      step;
    char          key[1100];
    uint32_t      flags;        /* XFER_PUBLISH_* */
    int           clobber;      /* overwrite and free the data right after publishing */
    int           readonly;     /* the data in a read-only mapping (it cannot be registered) */
    uint32_t      count;        /* > 1: keys key0..keyN-1, uint64 vectors of 1 + i % 64 */
    uint64_t      seed;
    xfer_tensor_t t;            /* data is ignored: pattern(seed) of t.size bytes */
} spec_t;

typedef struct fetch {
    xfer_request_t *req;
    char           *buf;
    size_t         cap;
    int            calls;
    xfer_status_t  cb_status;
} fetch_t;

spec_t spec_make(uint64_t step, const char *key, xfer_dtype_t dtype, uint32_t rank,
                 const int64_t *dims, uint64_t seed);
void spec_nth(const spec_t *s, uint32_t i, spec_t *out);
int srv_producer(tp_side_t *s);
xfer_status_t publish(tp_peer_t *p, const spec_t *sp);
void publish_ok(tp_peer_t *p, const spec_t *sp);
size_t publishes_wait(tp_peer_t *p, int64_t *res, size_t cap);
void publishes_expect(tp_peer_t *p, size_t n, xfer_status_t want);
xfer_status_t remote_abort(tp_peer_t *p, uint64_t step, xfer_status_t status);
void producer_done(tp_peer_t *p);
void fetch_cb(xfer_request_t *req, xfer_status_t status, void *arg);
xfer_status_t fetch_post(tp_peer_t *p, uint64_t step, const char *key, size_t cap,
                         fetch_t *f);
void fetch_release(fetch_t *f);
void check_fetched(fetch_t *f, const spec_t *sp);
void fetch_expect(tp_peer_t *p, const spec_t *sp);
xfer_status_t fetch_status(tp_peer_t *p, uint64_t step, const char *key, size_t cap);

/* The counters of the consumer's endpoint (ep), or the producer's (CMD_COUNTERS): the value
 * of name, asserting it exists. */
uint64_t counter_of(const xfer_counter_t *c, size_t n, const char *name);
size_t ep_counters(xfer_endpoint_t *ep, xfer_counter_t *c, size_t max);
size_t producer_counters(tp_peer_t *p, xfer_counter_t *c, size_t max);

#endif
