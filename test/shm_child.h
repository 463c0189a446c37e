/*
 * Helpers of the shm suites' children (test_shm.c, test_shm_frames.c), which reach into the
 * rings of their own endpoint as a hostile peer would.
 */
#ifndef XFER_TEST_SHM_CHILD_H
#define XFER_TEST_SHM_CHILD_H

#include "test_peer.h"

#include <stdint.h>

/* The bases of the two shm rings the child maps (its own and its peer's), found in
 * /proc/self/maps; it fails unless there are two. */
void shm_rings_mapped(uint8_t *bases[2]);
/* Tell the parent the child is ready (1), then wait to be killed. */
int ready_then_stall(tp_side_t *s);

#endif
