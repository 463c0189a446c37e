/*
 * What the tag suite's two files share: test_tag.c (matching, order, truncation, cancel) holds
 * these helpers, and test_tag_requests.c (the request contract) uses them for its own
 * scenarios. Both run in the one suite, tag, declared in test_tag.c.
 */
#ifndef XFER_TEST_TAG_H
#define XFER_TEST_TAG_H

#include "test_peer.h"

#include <stddef.h>
#include <stdint.h>

/* A tag mask in which every bit must match. */
#define ALL (~0ull)

/* One posted message and the buffer it owns. */
typedef struct msg {
    xfer_request_t *req;
    char           *buf;
    size_t         len;
} msg_t;

/* What a request's callback saw: how often it ran, and the status, request, length and tag
 * it was given (the last call's). */
typedef struct slot {
    int            calls;
    xfer_status_t  status;
    xfer_request_t *req;
    size_t         length;
    uint64_t       tag;
} slot_t;

/* Wait for m's request (timeout_ms), release it and free its buffer; returns the wait's
 * status. */
xfer_status_t tt_msg_wait(msg_t *m, int timeout_ms);
/* Post a receive of up to cap bytes into a zeroed buffer that m owns; ep NULL: from any
 * endpoint. Returns the posting status. */
xfer_status_t tt_recv_post(xfer_context_t *ctx, xfer_endpoint_t *ep, uint64_t tag,
                           uint64_t mask, size_t cap, msg_t *m);

/* The child's side: post a send of len bytes of pattern(seed), failing the child if it
 * cannot be posted. */
void tt_child_send(tp_side_t *s, uint64_t tag, size_t len, uint64_t seed, msg_t *m);
/* The child's side: wait for n sends to complete with XFER_OK and release them. */
void tt_child_wait_sends(msg_t *m, int n);
/* The child's side: progress until the parent's next word on the control channel, and
 * consume it. */
void tt_child_await_word(tp_side_t *s);

/* A request callback that records its call into the slot_t at arg. */
void tt_slot_cb(xfer_request_t *req, xfer_status_t status, void *arg);
/* A child scenario: on each word n > 0 from the parent, one 256-byte message of tag 11 and
 * pattern n, then the word 1; a word 0 ends it. */
int tt_srv_on_demand(tp_side_t *s);

#endif
