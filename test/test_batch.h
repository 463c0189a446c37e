/*
 * What the two files of the batch suite share (test_batch.c: the data path, and the definitions
 * of what is declared here; test_batch_end.c: batches that end early or are refused,
 * notification floods, a handler that posts and closes, bad lists): the two buffers' sizes,
 * the commands the target side takes over the control channel, the target scenario that
 * serves them, and the initiator's helpers around it.
 */
#ifndef XFER_TEST_BATCH_H
#define XFER_TEST_BATCH_H

#include "test_peer.h"

#include <stdint.h>

#define DST_LEN   (24u << 20)   /* the target's buffer */
#define SRC_LEN   (8u << 20)    /* the initiator's buffer */

/* What tb_srv_target() does when the initiator sends it, each a u64 on the control channel. */
enum {
    CMD_DONE = 1,
    CMD_POLL,       /* n, poll: take n notifications (checking each round's data), report */
    CMD_HANDLER,    /* n: the same through the context's handler */
    CMD_FILL,       /* seed: fill the target buffer */
    CMD_SLEEP,      /* ms: do not progress for ms, then answer */
    CMD_DEREG,      /* deregister the target buffer, answer */
    CMD_ORDER,      /* n: take n notifications by polling; answer how many came in order */
    CMD_STATUS,     /* answer the endpoint's status */
    CMD_COUNT,      /* progress 500 ms, then answer how many notifications are queued */
};

/* The initiator's side of a test: its peer, its registered buffer of SRC_LEN bytes and the key
 * of the target's buffer. */
typedef struct init {
    tp_peer_t    p;
    uint8_t      *src;
    xfer_mem_t   *mem;
    xfer_rkey_t  *rkey;
} init_t;

/* Whether the target's buffer comes from xfer_mem_alloc() (XFERTEST_TARGET_MEM=xfer): over shm
 * the initiator then maps it and copies itself, so a batch may finish without the target. */
int tb_target_mem_alloc(void);
/* The target scenario: registers its buffer of DST_LEN bytes, sends its key, then serves CMD_*
 * until CMD_DONE. */
int tb_srv_target(tp_side_t *s);
/* Start the target scenario fn (tb_srv_target or a wrapper of it) and set up the initiator's
 * side against it; asserts success. */
void tb_init_start(init_t *in, tp_scenario_t fn);
/* Send CMD_DONE, release what tb_init_start() set up, close, and assert the target passed. */
void tb_init_finish(init_t *in);
/* The target's next answer, received while progressing (the target may need this side's
 * progress to finish what it checks). */
uint64_t tb_recv_progressing_peer(tp_peer_t *p);
uint64_t tb_recv_progressing(init_t *in);
/* The target sleeps sleep_ms; a put batch of d[0..n) is posted meanwhile and either cancelled
 * after 100 ms (cancel) or given a 300 ms deadline. Returns how it ended, its request in
 * *req_p (the caller releases it), the batch in *b_p (the caller destroys it) and the ms it
 * took to end in *ms_p. */
xfer_status_t tb_post_ended_early(init_t *in, const xfer_batch_desc_t *d, size_t n,
                                  unsigned sleep_ms, int cancel, xfer_request_t **req_p,
                                  xfer_batch_t **b_p, double *ms_p);

#endif
