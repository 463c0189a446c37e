/*
 * What the two files of the verbs suite share (test_verbs.c: its setup and data-path tests;
 * test_verbs_faults.c: a killed peer, a link gone down): the suite's .init, which
 * link_down's own .init calls too, and the helpers both sides of a scenario use.
 */
#ifndef XFER_TEST_VERBS_H
#define XFER_TEST_VERBS_H

#include "test_peer.h"

#include <stddef.h>
#include <stdint.h>

#define ALL      (~0ull)        /* a tag mask: match every bit */

/* Skip the calling test unless it runs over verbs with an RDMA device (the guest). */
void tv_setup(void);

/* The child's side of the control channel: wait for the parent's next word, send one. */
uint64_t tv_child_word(tp_side_t *s);
void tv_child_say(tp_side_t *s, uint64_t v);
/* malloc for a child: it exits (status 3) instead of returning NULL. */
void *tv_xmalloc(size_t len);
/* req's final status, or XFER_INPROGRESS when it is still pending after timeout_ms. */
xfer_status_t tv_req_wait(xfer_request_t *req, int timeout_ms);
/* tv_req_wait(), then release req; its length and tag through the pointers (may be NULL). */
xfer_status_t tv_req_done(xfer_request_t *req, int timeout_ms, size_t *len_p, uint64_t *tag_p);

#endif
