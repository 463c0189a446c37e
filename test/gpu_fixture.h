/*
 * A CUDA device for the suites that move device memory (test_cuda.c, test_staging.c), opened
 * through libxfer's own driver table so that the tests use the driver as the library does.
 */
#ifndef XFERTEST_GPU_FIXTURE_H
#define XFERTEST_GPU_FIXTURE_H

#include <xfer/component.h>

typedef struct tg_gpu {
    const xfer_cuda_driver_t *drv;
    int                      device;
    void                     *cu_ctx;   /* device 0's primary context, current */
} tg_gpu_t;

/* Initialise CUDA, retain device 0's primary context and make it current; or skip the test
 * with the reason, also printed on stderr after "suite: skipped: ". Call it after forking any
 * peer: a child of a process that initialised CUDA cannot use the driver. */
void tg_gpu_open(tg_gpu_t *g, const char *suite);

#endif
