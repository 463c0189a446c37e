/*
 * A CUDA device for the suites that move device memory (test_cuda.c, test_staging.c), opened
 * through libxfer's own driver table so that the tests use the driver as the library does.
 */
#ifndef XFERTEST_GPU_FIXTURE_H
#define XFERTEST_GPU_FIXTURE_H

#include <xfer/component.h>
#include <xfer/info.h>
#include <xfer/xfer.h>

typedef struct tg_gpu {
    const xfer_cuda_driver_t *drv;
    int                      device;
    void                     *cu_ctx;   /* device 0's primary context, current */
} tg_gpu_t;

/* Initialise CUDA, retain device 0's primary context and make it current; or skip the test
 * with the reason, also printed on stderr after "suite: skipped: ". Call it after forking any
 * peer: a child of a process that initialised CUDA cannot use the driver. */
void tg_gpu_open(tg_gpu_t *g, const char *suite);

/* Make XFER_CUDA_LIB the stand-in driver, test/plugins/fake_cuda.c (fakecuda.so under
 * XFERTEST_PLUGIN_DIR): the only test double of the suites, for the GPU that is not there. */
void tg_use_stand_in_driver(void);

/* The capabilities (XFER_CAP_*) of ep's transport. */
uint64_t tg_transport_caps(xfer_context_t *ctx, xfer_endpoint_t *ep);
/* Whether ep's transport moves CUDA memory itself (XFER_CAP_MEM_CUDA: tcp through bounce
 * buffers, gdr by GPUDirect) rather than through the staging pipeline. */
int tg_transport_moves_cuda(xfer_context_t *ctx, xfer_endpoint_t *ep);

#endif
