/*
 * What the two files of the cuda_batch suite share (test_cuda_batch.c: batches of device
 * memory, and the definitions of what is declared here; test_cuda_batch_driver.c: how those
 * batches reach the CUDA driver): lists of scattered blocks, and the rounds of put and get
 * batches against the peer of cuda_peer.h.
 */
#ifndef XFERTEST_TEST_CUDA_BATCH_H
#define XFERTEST_TEST_CUDA_BATCH_H

#include "cuda_peer.h"

#include <stddef.h>
#include <stdint.h>

#define MAX_DESCS  640

/* A list of blocks: block k of len[k] bytes lies at ro[k] in the remote region, one after
 * the other, and at lo[k] in the local buffer, in the reverse order - so that neither side's
 * offsets follow the other's. */
typedef struct blocks {
    size_t            n;
    uint64_t          total;
    xfer_batch_desc_t d[MAX_DESCS];
} blocks_t;

/* b: the n blocks of lens, laid out as blocks_t says. */
void tcb_blocks_make(blocks_t *b, const uint64_t *lens, size_t n);
/* The block lengths of round 0, 1 or 2 (128 x 4 KiB, 37 mixed, 600 small) into lens; their
 * number. */
size_t tcb_lens_of(unsigned round, uint64_t *lens);
/* The local image of pattern(seed) over the remote blocks of b, into img. */
void tcb_local_image(const blocks_t *b, uint64_t seed, char *img);
/* A put batch of b from mem with a notification, checked by the peer as it arrives. */
void tcb_put_round(dev_test_t *t, const blocks_t *b, xfer_mem_t *mem, uint64_t seed);
/* A get batch of b into t->dst, checked against pattern(seed) there. */
void tcb_get_round(dev_test_t *t, const blocks_t *b, uint64_t seed, char *img);
/* dt_start(), or skip where the transport takes no batch of device memory. */
void tcb_start(dev_test_t *t);
/* Put rounds 0, 1 and 2 from device memory here into the peer's. */
void tcb_put_rounds(dev_test_t *t);

#endif
