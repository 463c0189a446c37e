/*
 * The conformance suite of docs/contract.md: one test per clause, run unchanged over every
 * transport and mode (test/contract.sh; in the Soft-RoCE guest over verbs and gdr). Its files
 * are split by the contract's sections (test_contract_close.c, ...); test_contract.c declares
 * the suite and holds the helpers declared here. Nothing in a test may depend on which
 * transport carries it.
 */
#ifndef XFER_TEST_CONTRACT_H
#define XFER_TEST_CONTRACT_H

#include "test_peer.h"

#include <xfer/xfer.h>

/* Post a tagged send of len bytes and wait for it: its final status. */
xfer_status_t ct_send(xfer_endpoint_t *ep, uint64_t tag, const void *buf, size_t len);
/* Post a put and wait for it: its final status. */
xfer_status_t ct_put(xfer_endpoint_t *ep, const void *buf, size_t len, xfer_mem_t *mem,
                     uint64_t remote_addr, xfer_rkey_t *rkey);
/* Progress ctx until ep's status is no longer XFER_OK, at most timeout_ms: the status. */
xfer_status_t ct_status_change(xfer_context_t *ctx, xfer_endpoint_t *ep, int timeout_ms);
/* A child's: register len bytes at buf (NULL: len bytes from xfer_mem_alloc) and send their
 * key to the parent (tp_recv_blob); the registration. */
xfer_mem_t *ct_offer(tp_side_t *s, void *buf, size_t len);

#endif
