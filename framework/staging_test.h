/*
 * What the test suites may see of the staging pipeline (framework/staging.c). Not installed:
 * applications have no use for it.
 */
#ifndef XFER_STAGING_TEST_H
#define XFER_STAGING_TEST_H

#include <xfer/xfer.h>

#include <stddef.h>
#include <stdint.h>

/* Counters of a context's pipeline, cumulative since the context was created. */
typedef struct xfer_staging_stats {
    uint64_t ops;           /* staged puts and gets posted */
    uint64_t ops_failed;    /* of which completed with an error */
    uint64_t chunks;        /* chunks whose copy and transfer both finished */
    uint64_t copies;        /* copies that landed */
    uint64_t transfers;     /* transfers of a chunk that completed successfully */
    unsigned in_flight;     /* bounce buffers held now */
    unsigned max_in_flight; /* most held at once */
    unsigned pool_slots;    /* bounce buffers in the pool; 0 until the first staged op */
    size_t   chunk_size;    /* XFER_STAGING_CHUNK */
    /* tagged messages and tensors staged whole (staging_msg.c) */
    uint64_t msgs;          /* sends, receives, fetches and publishes through host memory */
    uint64_t msg_copies;    /* copies between them and the memory they stand for */
} xfer_staging_stats_t;

/*
 * Test hook for hosts without a GPU: from this call on, host memory registered on ctx is
 * treated as memory the transports cannot touch - put and get move it through the staging
 * pipeline, with memcpy as its copy engine in place of CUDA's, each copy landing only after
 * delay_polls polls (0: at the first). Call it before the first registration.
 */
XFER_API xfer_status_t xfer_staging_test_host(xfer_context_t *ctx, unsigned delay_polls);
XFER_API void xfer_staging_test_stats(xfer_context_t *ctx, xfer_staging_stats_t *stats_p);

#endif /* XFER_STAGING_TEST_H */
