/*
 * cuda_copy_floor: what a batch of scattered device-to-device blocks costs with the CUDA
 * driver alone, no xfer - the floor under xfer_perf -x shm -m cuda -t batch_put. One GPU, two
 * allocations; block k of a batch goes from the first at (n - 1 - k) x size to the second at
 * 2 x k x size (both sides scattered, as in the benchmark). Each way is timed over 2000
 * batches, each waited for (cuStreamSynchronize), best of three:
 *   one copy                 the batch's bytes as one cuMemcpyAsync (what one put costs)
 *   one copy + last byte     the same split as shm puts a put (the last byte after the rest)
 *   per-block cuMemcpyAsync  one driver copy per block
 *   cuMemcpyBatchAsync       one driver call for the whole batch
 *   gather kernel            one launch of shm's copy kernel (components/shm/
 *                            shm_cuda_gather.cu), its table in pinned host memory, or copied to
 *                            device memory first
 * and the kernel's copy is checked block by block.
 *
 * Build and run where a GPU and CUDA 12.8 or later are (not part of the build: it needs nvcc):
 *   nvcc -O2 -o cuda_copy_floor contrib/bench/cuda_copy_floor.cu -lcuda
 *   ./cuda_copy_floor [BLOCKS [BLOCK_BYTES]]     (default 128 4096)
 */
#include "../../components/shm/shm_cuda_gather.cu"

#include <cuda.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ITERS  2000
#define MAXN   1024

#define CK(x) do { CUresult r_ = (x); \
    if (r_ != CUDA_SUCCESS) { fprintf(stderr, "%s: error %d\n", #x, (int)r_); exit(1); } } while (0)
#define RK(x) do { cudaError_t r_ = (x); \
    if (r_ != cudaSuccess) { fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(r_)); exit(1); } } while (0)

static double now_us(void)
{
    struct timespec t;

    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

int main(int argc, char **argv)
{
    static const char *names[] = {"one copy", "one copy + last byte", "per-block cuMemcpyAsync",
                                  "cuMemcpyBatchAsync", "gather kernel, table in pinned memory",
                                  "gather kernel, table copied to the GPU first"};
    const int n    = (argc > 1) ? atoi(argv[1]) : 128;
    const int size = (argc > 2) ? atoi(argv[2]) : 4096;
    CUdeviceptr a, b, dsts[MAXN], srcs[MAXN];
    xfer_shm_gather_desc_t *table, *dtable;
    size_t sizes[MAXN], idx = 0, total;
    CUmemcpyAttributes attr;
    CUstream s;

    if ((n < 1) || (n > MAXN) || (size < 1) || ((size_t)2 * n * size > (256u << 20))) {
        fprintf(stderr, "usage: %s [BLOCKS (1-%d) [BLOCK_BYTES]], 2 x BLOCKS x BLOCK_BYTES "
                "<= 256 MiB\n", argv[0], MAXN);
        return 2;
    }
    total = (size_t)n * size;
    RK(cudaSetDevice(0));
    RK(cudaFree(0));
    CK(cuMemAlloc(&a, 256u << 20));
    CK(cuMemAlloc(&b, 256u << 20));
    CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    RK(cudaHostAlloc((void**)&table, sizeof(*table) * MAXN, cudaHostAllocMapped));
    RK(cudaMalloc((void**)&dtable, sizeof(*dtable) * MAXN));
    for (int k = 0; k < n; k++) {
        dsts[k]  = b + (size_t)2 * k * size;
        srcs[k]  = a + (size_t)(n - 1 - k) * size;
        sizes[k] = size;
        table[k] = (xfer_shm_gather_desc_t){dsts[k], srcs[k], (unsigned long long)size};
    }
    memset(&attr, 0, sizeof(attr));
    attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;

    for (int way = 0; way < 6; way++) {
        double best = 1e30;

        for (int rep = 0; rep < 3; rep++) {
            double t0 = now_us(), us;

            for (int i = 0; i < ITERS; i++) {
                switch (way) {
                case 0:
                    CK(cuMemcpyAsync(b, a, total, s));
                    break;
                case 1:
                    CK(cuMemcpyAsync(b, a, total - 1, s));
                    CK(cuMemcpyAsync(b + total - 1, a + total - 1, 1, s));
                    break;
                case 2:
                    for (int k = 0; k < n; k++) {
                        CK(cuMemcpyAsync(dsts[k], srcs[k], sizes[k], s));
                    }
                    break;
                case 3:
                    CK(cuMemcpyBatchAsync(dsts, srcs, sizes, n, &attr, &idx, 1, s));
                    break;
                case 4:
                    xfer_shm_gather<<<n, 256, 0, (cudaStream_t)s>>>(table, n);
                    break;
                case 5:
                    CK(cuMemcpyHtoDAsync((CUdeviceptr)dtable, table, sizeof(*table) * n, s));
                    xfer_shm_gather<<<n, 256, 0, (cudaStream_t)s>>>(dtable, n);
                    break;
                }
                CK(cuStreamSynchronize(s));
            }
            us   = (now_us() - t0) / ITERS;
            best = (us < best) ? us : best;
        }
        RK(cudaGetLastError());
        printf("%-46s %4d x %8d B: %9.2f us a batch %10.1f MB/s\n", names[way], n, size, best,
               total / best);
    }

    /* the kernel's copy, block by block */
    unsigned char *src = (unsigned char*)malloc(total), *got = (unsigned char*)malloc(size);
    int bad = 0;

    for (size_t i = 0; i < total; i++) {
        src[i] = (unsigned char)(i * 7 + 3);
    }
    CK(cuMemsetD8(b, 0, (size_t)2 * n * size));
    CK(cuMemcpyHtoD(a, src, total));
    xfer_shm_gather<<<n, 256, 0, (cudaStream_t)s>>>(table, n);
    CK(cuStreamSynchronize(s));
    for (int k = 0; k < n; k++) {
        CK(cuMemcpyDtoH(got, dsts[k], size));
        bad += memcmp(got, src + (size_t)(n - 1 - k) * size, size) != 0;
    }
    printf("gather kernel: %d of %d blocks wrong\n", bad, n);
    return bad != 0;
}
