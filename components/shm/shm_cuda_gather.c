/*
 * CUDA batches by a kernel: between device memory here (of the iface's CUDA context) and a
 * peer's allocation opened here by its IPC handle, a batch's blocks are written, in pieces of
 * at most GATHER_PIECE bytes, into a table in pinned host memory, and one launch of
 * xfer_shm_gather (shm_cuda_gather.cu) copies the whole table. The driver carries out every
 * cuMemcpyAsync - and every copy of a cuMemcpyBatchAsync - as a copy of its own, about 4 us
 * each on an H200: 128 blocks of 4 KiB took 480 us so, and 11 us as one launch (a single
 * 512 KiB copy: 10 us). Pieces spread a large block over the GPU's multiprocessors.
 *
 * The module is loaded in the iface's context at its first such batch (the driver compiles
 * the PTX then). Where it cannot be - a driver without module entry points, one older than
 * the PTX - the reason is logged once and the iface's batches go by copies (shm_cuda.c).
 * Every address the kernel is given was checked before it got here: the local range against
 * its registration (inside one allocation), the remote one against the key, the key against
 * the allocation it names and that against what the IPC handle opened (shm_cuda.c). A
 * driver copy given a bad address fails with an error; a kernel faults, and the fault is
 * sticky in the CUDA context - the application's too, where it is the primary one - so
 * nothing unchecked reaches it.
 *
 * The table is filled by one batch at a time (the framework calls shm under its context's
 * lock); when a batch fills it, its launch is waited for before it is filled again, and
 * every batch ends by waiting for the stream (shm_cuda.c), so the next finds it free.
 */
#include "shm.h"
#include "shm_cuda_gather_ptx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GATHER_PIECE    (64u * 1024)    /* largest table entry */
#define GATHER_THREADS  256u            /* threads of a block of the grid */
#define GATHER_NAME     "xfer_shm_gather"
/* The table is read by the GPU at its host address: pinned memory is mapped into the
 * unified address space (and DEVICEMAP says so where that is not the default). */
#define CU_MEMHOSTALLOC_DEVICEMAP  0x02u

static int gather_launch(xfer_iface_h iface)
{
    xfer_shm_cuda_t *c       = &iface->cuda;
    unsigned long long table = (uintptr_t)c->gather_table;
    unsigned count           = c->gather_n;
    void *params[]           = {&table, &count};

    c->gather_n = 0;
    if (count == 0) {
        return 0;
    }
    return c->drv->launch_kernel(c->gather_func, count, 1, 1, GATHER_THREADS, 1, 1, 0,
                                 c->stream, params, NULL);
}

/* The kernel checked once, before it moves anyone's data, against what it must do: the driver
 * compiled PTX for this GPU at load, and a kernel that copied wrong would corrupt batches
 * silently. A block of 4099 bytes at aligned addresses (16-byte accesses and a tail) and one
 * of 1000 at odd ones (bytewise), through the table as a batch uses it. 0, or -1 with why. */
#define SELFTEST_LEN  8192u
static int gather_selftest(xfer_iface_h iface, const xfer_cuda_driver_t *drv, char *why,
                           size_t why_size)
{
    xfer_shm_cuda_t *c = &iface->cuda;
    uint8_t *host, *want, *got;
    char err[XFER_REASON_MAX];
    xfer_cu_ptr_t buf = 0;
    int res, ok = 0;

    host = calloc(3, SELFTEST_LEN);
    if (host == NULL) {
        snprintf(why, why_size, "no memory to check the copy kernel");
        return -1;
    }
    want = host + SELFTEST_LEN;
    got  = want + SELFTEST_LEN;
    for (unsigned i = 0; i < SELFTEST_LEN; i++) {
        host[i] = (uint8_t)(i * 131 + 7);
    }
    memcpy(want + 16, host, 4099);          /* the destination half as the kernel must leave it */
    memcpy(want + 5001, host + 4101, 1000);
    res = drv->mem_alloc(&buf, 2 * SELFTEST_LEN);
    if (res == 0) {
        res = drv->memcpy_htod_async(buf, host, SELFTEST_LEN, c->stream);
    }
    if (res == 0) {
        res = drv->memcpy_htod_async(buf + SELFTEST_LEN, got, SELFTEST_LEN, c->stream);
    }
    if (res == 0) {
        c->gather_table[0] = (xfer_shm_gather_desc_t){buf + SELFTEST_LEN + 16, buf, 4099};
        c->gather_table[1] = (xfer_shm_gather_desc_t){buf + SELFTEST_LEN + 5001, buf + 4101,
                                                      1000};
        c->gather_n        = 2;
        res = gather_launch(iface);
    }
    if (res == 0) {
        res = drv->memcpy_dtoh_async(got, buf + SELFTEST_LEN, SELFTEST_LEN, c->stream);
    }
    if (res == 0) {
        res = drv->stream_synchronize(c->stream);
    }
    if (res != 0) {
        snprintf(why, why_size, "cannot check the copy kernel: %s",
                 xfer_cuda_result_string(res, err, sizeof(err)));
    } else if (memcmp(got, want, SELFTEST_LEN) != 0) {
        snprintf(why, why_size, "the copy kernel, as the driver compiled it, did not copy "
                 "what it was given");
    } else {
        ok = 1;
    }
    if (buf != 0) {
        (void)drv->stream_synchronize(c->stream);
        (void)drv->mem_free(buf);
    }
    free(host);
    return ok ? 0 : -1;
}

/* Load the module and take the table; in the iface's context, entered. */
static int gather_load(xfer_iface_h iface, const xfer_cuda_driver_t *drv, char *why,
                       size_t why_size)
{
    xfer_shm_cuda_t *c = &iface->cuda;
    char err[XFER_REASON_MAX];
    void *table = NULL;
    int res;

    if (!XFER_CUDA_DRIVER_HAS(drv, module_load_data) ||
        !XFER_CUDA_DRIVER_HAS(drv, module_get_function) ||
        !XFER_CUDA_DRIVER_HAS(drv, module_unload) || !XFER_CUDA_DRIVER_HAS(drv, launch_kernel)) {
        snprintf(why, why_size, "the CUDA driver %s has no module entry points "
                 "(cuModuleLoadData, cuModuleGetFunction, cuLaunchKernel)", drv->library);
        return -1;
    }
    res = drv->module_load_data(&c->gather_module, xfer_shm_gather_ptx);
    if (res != 0) {
        snprintf(why, why_size, "the CUDA driver cannot load the copy kernel's PTX (ISA 7.0, "
                 "sm_70): %s", xfer_cuda_result_string(res, err, sizeof(err)));
        return -1;
    }
    res = drv->module_get_function(&c->gather_func, c->gather_module, GATHER_NAME);
    if (res == 0) {
        res = drv->mem_host_alloc(&table, iface->cfg->cuda_gather_descs *
                                  sizeof(xfer_shm_gather_desc_t), CU_MEMHOSTALLOC_DEVICEMAP);
    }
    if (res != 0) {
        snprintf(why, why_size, "cannot set up the copy kernel %s: %s", GATHER_NAME,
                 xfer_cuda_result_string(res, err, sizeof(err)));
        (void)drv->module_unload(c->gather_module);
        c->gather_module = NULL;
        return -1;
    }
    c->gather_table = table;
    c->gather_n     = 0;
    if (gather_selftest(iface, drv, why, why_size) != 0) {
        (void)drv->mem_free_host(table);
        (void)drv->module_unload(c->gather_module);
        c->gather_table  = NULL;
        c->gather_module = NULL;
        return -1;
    }
    return 1;
}

int xfer_shm_gather_ready(xfer_iface_h iface)
{
    xfer_shm_cuda_t *c = &iface->cuda;
    char why[XFER_REASON_MAX];

    if (c->gather_state == 0) {
        c->gather_state = gather_load(iface, c->drv, why, sizeof(why));
        if (c->gather_state < 0) {
            xfer_log(XFER_LOG_INFO, XFER_SHM_SUBSYS, "batches of CUDA memory go by copies, "
                     "not by a kernel: %s", why);
        }
    }
    return c->gather_state > 0;
}

int xfer_shm_gather_add(xfer_iface_h iface, xfer_cu_ptr_t dst, xfer_cu_ptr_t src,
                        uint64_t len)
{
    xfer_shm_cuda_t *c = &iface->cuda;
    uint64_t piece;
    int res;

    while (len > 0) {
        if (c->gather_n == iface->cfg->cuda_gather_descs) {
            res = gather_launch(iface);
            if (res == 0) {
                res = c->drv->stream_synchronize(c->stream);   /* the table read: refill */
            }
            if (res != 0) {
                return res;
            }
        }
        piece = (len < GATHER_PIECE) ? len : GATHER_PIECE;
        c->gather_table[c->gather_n++] = (xfer_shm_gather_desc_t){dst, src, piece};
        dst += piece;
        src += piece;
        len -= piece;
    }
    return 0;
}

int xfer_shm_gather_end(xfer_iface_h iface, int res)
{
    if (res != 0) {
        iface->cuda.gather_n = 0;     /* what a failed batch left is not launched */
        return res;
    }
    return gather_launch(iface);
}

void xfer_shm_gather_cleanup(xfer_iface_h iface)
{
    xfer_shm_cuda_t *c = &iface->cuda;

    if (c->gather_state > 0) {
        (void)c->drv->mem_free_host(c->gather_table);
        (void)c->drv->module_unload(c->gather_module);
    }
    c->gather_state = 0;
    c->gather_table = NULL;
}
