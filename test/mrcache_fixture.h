/*
 * What the registration-cache suites share (test_verbs_mrcache.c: lookup, eviction,
 * invalidation; test_verbs_unmap.c: libucm's unmap reports and the component's mr_cache
 * attribute): a real RDMA device, a page-aligned test buffer of NPAGES pages, a cache of
 * framework/regcache.c over them registering MRs as the verbs component does, and a count of
 * ibv_dereg_mr calls. mrcache_fixture.c defines ibv_dereg_mr, which wins over libibverbs' for
 * the cache's calls from this executable and forwards to the real one, so that the tests see
 * exactly when (and which) registration is released - which the stats (cached entries only)
 * do not show for held or uncached entries.
 *
 * Buffers are page-aligned anonymous mappings so that which pages a registration covers is
 * known exactly; entries the tests want kept apart are a page or more apart (touching regions
 * are not merged, overlapping ones are).
 */
#ifndef XFER_TEST_MRCACHE_FIXTURE_H
#define XFER_TEST_MRCACHE_FIXTURE_H

#include <xfer/component.h>

#include <infiniband/verbs.h>
#include <stddef.h>
#include <stdint.h>

#define ACCESS  (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)
#define NPAGES  32
/* The MR behind a cache entry. */
#define MR(_entry) ((struct ibv_mr*)(_entry)->handle)

extern struct ibv_context *ctx;
extern struct ibv_pd      *pd;
extern xfer_regcache_t    *mrc;
extern char               *buf;     /* NPAGES pages */
extern size_t             page;
extern unsigned           num_dereg;        /* ibv_dereg_mr calls seen */
extern uint32_t           last_dereg_lkey;

/* Open the first RDMA device, its protection domain and the test buffer; skips the test
 * without a device. */
void open_device(void);
/* A cache's parameters: these bounds, and registrations of pd as verbs makes them. */
xfer_regcache_params_t cache_params(uint64_t max_entries, uint64_t max_bytes);
/* open_device(), then a cache with these bounds; skips when it could cache nothing. */
void cache_open(uint64_t max_entries, uint64_t max_bytes);
/* The suites' .init and .fini. */
void mrc_setup(void);
void mrc_teardown(void);
xfer_regcache_stats_t mrc_stats(void);
/* Page p of the test buffer. */
char *pg(unsigned p);
/* A hold on a region covering [addr, addr + length), asserted. */
xfer_regcache_entry_t *get_ok(const void *addr, size_t length);
/* get + put, and whether it hit. */
int touch(const void *addr, size_t length);
/* Copy len bytes from src (lkey) to dst (rkey) with an RDMA WRITE on a queue pair connected
 * to itself, and wait for its completion: proof that the registrations are alive. */
int rdma_write(const void *src, uint32_t lkey, void *dst, uint32_t rkey, uint32_t len);
/* The cache caches nothing: two gets of one buffer register twice, each put deregisters. */
void expect_uncached(void);

#endif
