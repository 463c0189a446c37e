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

/*
 * A target driven by the test (ct_target): it offers CT_REGION bytes (ct_offer) and then,
 * progressing between commands, carries out what the parent asks over the control channel
 * (ct_do), answering each with one word:
 *   CT_CHECK off len seed  whether [off, off + len) of its region holds the pattern of seed,
 *                          looked at WITHOUT progressing first (0: yes, else 1 + the offset);
 *   CT_FILL  off len seed  write that pattern there (0);
 *   CT_SEND  tag len seed  post a send of a message of len bytes of that pattern (0 once
 *                          posted; it completes in the progress that follows);
 *   CT_RECV  tag len seed  receive a message of tag from its endpoint and check it (0, or
 *                          which check failed: 1 its status, 2 its length, 3 + the offset);
 *   CT_STATUS              its endpoint's status;
 *   CT_FAILED              its endpoint's status once it is no longer XFER_OK, progressing
 *                          up to TP_WAIT_MS for that (XFER_OK if it stays so);
 *   CT_FETCH step key len  post a fetch of the tensor ct_key(key) of step from its endpoint
 *                          into a buffer of len bytes (0 once posted);
 *   CT_FETCHED i           the status of its i-th fetch once it completed, progressing up to
 *                          TP_WAIT_MS for it;
 *   CT_STOP                wait for its sends, close, deregister, and end (0).
 */
#define CT_REGION (32u << 20)
enum { CT_CHECK = 1, CT_FILL, CT_SEND, CT_RECV, CT_STATUS, CT_FAILED, CT_STOP, CT_FETCH,
       CT_FETCHED };
/* The key of tensor number n: "ct-<n>" in buf (CT_KEY_MAX bytes). */
#define CT_KEY_MAX 32
const char *ct_key(char *buf, uint64_t n);
int ct_target(tp_side_t *s);
/* Send the target a command without waiting for its answer (ct_answer() reads it). */
void ct_ask(tp_peer_t *p, uint64_t cmd, uint64_t a, uint64_t b, uint64_t c);
/* The target's next answer, progressing p->ctx (when set) while it comes. */
uint64_t ct_answer(tp_peer_t *p);
/* ct_ask(), then ct_answer(). */
uint64_t ct_do(tp_peer_t *p, uint64_t cmd, uint64_t a, uint64_t b, uint64_t c);
/* XFER_CLOSE_TIMEOUT for the contexts created from now on: half of TP_WAIT_MS, so that an
 * orderly close that moves tens of MiB first (a slow emulated RDMA device beside other work)
 * is not cut short by the 10 s default. */
void ct_close_timeout_scaled(void);
/* tp_start() with ct_target, and the target region's key unpacked on p->ep. */
xfer_rkey_t *ct_start(tp_peer_t *p);

#endif
