/*
 * Two processes with CUDA device memory each, for the suites that move it between them
 * (test_cuda_transport.c, test_cuda_batch.c). The peer (dt_serve, run by tp_start) holds a
 * device region D of DT_MAXLEN bytes, registered, with its remote key sent to this side
 * when the transport gives one (or host memory: dt_peer_region), and serves the commands
 * below on it; this side
 * (dt_start) holds two device buffers of its own, registered, and that key unpacked.
 */
#ifndef XFERTEST_CUDA_PEER_H
#define XFERTEST_CUDA_PEER_H

#include "gpu_fixture.h"
#include "test_peer.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define DT_MAXLEN  (1u << 20)


enum {
    CMD_DONE = 1,
    CMD_ECHO,       /* len, tag: post a receive into D (reply 1), send it back with tag + 1
                     * (reply 2) */
    CMD_FILL,       /* seed: pattern(seed) into all of D */
    CMD_CHECK,      /* off, len, seed: D[off, off + len) holds pattern(seed) */
    CMD_PUBLISH,    /* step, len, seed, copy: publish D[0, len) = pattern(seed) as "t"
                     * (copy: with XFER_PUBLISH_COPY, D changed right after), wait until it
                     * was fetched */
    CMD_STALL_SENDING, /* len, tag: post a send of len host bytes (reply 1), then stop
                        * progressing until killed */
    CMD_STALL,      /* reply 1, then stop progressing until killed */
    CMD_WATCH,      /* len, seed, pause_ms: D[0, len) = something else (reply 1), sleep
                     * pause_ms; progress until the last byte is pattern(seed)'s, then reply
                     * 2 if all of it is, else 3 */
    CMD_AWAIT_NOTIFY, /* len, seed: D[0, len) = something else (reply 1); progress until a
                       * batch notification comes, then reply 2 if D[0, len) holds
                       * pattern(seed) and the notification says "batch <seed>", else 3 */
    CMD_KEY,        /* reply 1, then D's packed remote key */
};

typedef struct dev_test {
    tp_peer_t     peer;
    tg_gpu_t      gpu;
    xfer_cu_ptr_t src, dst;         /* this side's device buffers */
    xfer_mem_t    *src_mem, *dst_mem;
    uint64_t      remote;           /* the peer's device region */
    xfer_rkey_t   *rkey;
    char          *host;
} dev_test_t;

/* What the peer's region D is: device memory, host memory from xfer_mem_alloc() (which a
 * peer on this host maps), or malloc'd host memory. */
typedef enum {
    DT_REGION_DEVICE,
    DT_REGION_XFER_ALLOC,
    DT_REGION_MALLOC,
} dt_region_t;

/* The kind of D of the peers started from now on (device memory unless said). */
void dt_peer_region(dt_region_t kind);
/* An environment variable the peers started from now on set before they touch CUDA (the
 * stand-in driver's knobs for the peer alone); the strings must outlive them. */
void dt_peer_env(const char *name, const char *value);
/* The peer's side: serve commands until CMD_DONE (reply 0 first where there is no GPU). */
int dt_serve(tp_side_t *s);

/* Start the peer, open the GPU here, allocate and register src and dst; skips the test
 * where the peer found no GPU. */
void dt_start(dev_test_t *t);
/* Release this side's buffers and key, stop the peer (or, after dt_kill, close its endpoint
 * and context). */
void dt_finish(dev_test_t *t);
/* Kill the peer's process (SIGKILL) and reap it; its control channel is closed. */
void dt_kill(dev_test_t *t);
/* pattern(seed) into this side's device buffer at ptr. */
void dt_fill(dev_test_t *t, xfer_cu_ptr_t ptr, size_t len, uint64_t seed);
/* Whether this side's device memory at ptr holds pattern(seed); -1 when it does. */
ssize_t dt_check(dev_test_t *t, xfer_cu_ptr_t ptr, size_t len, uint64_t seed);
/* A command of three arguments (CMD_CHECK), and its answer. */
uint64_t dt_cmd(dev_test_t *t, uint64_t cmd, uint64_t a, uint64_t b, uint64_t c);
/* s posted, and req (or s itself) completed with XFER_OK. */
void dt_wait_ok(xfer_status_t s, xfer_request_t *req, const char *what, size_t len);

#endif
