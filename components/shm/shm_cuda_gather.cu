/*
 * The kernel of shm's CUDA batches between device memory here and a peer's opened by IPC
 * (shm_cuda_gather.c): block k of the grid copies descriptors k, k + gridDim.x, ... of a
 * table in pinned host memory, 16 bytes a thread and access where both sides are 16-byte
 * aligned, else bytewise. One launch moves a whole table: a batch of small blocks costs one
 * launch, not a driver copy per block (about 4 us each on an H200).
 *
 * shm_cuda_gather_ptx.h holds its PTX, made by `make -C <build> shm-gather-ptx` (nvcc), and
 * is committed, so that building xfer needs no CUDA compiler: the driver compiles the PTX for
 * its GPU when the module is loaded. The PTX asks for ISA 7.0 and sm_70 (CUDA 11.0 drivers,
 * Volta) and uses nothing newer.
 */
typedef struct xfer_shm_gather_desc {
    unsigned long long dst, src, len;
} xfer_shm_gather_desc_t;

extern "C" __global__ void xfer_shm_gather(const xfer_shm_gather_desc_t *descs, unsigned count)
{
    for (unsigned k = blockIdx.x; k < count; k += gridDim.x) {
        const unsigned long long dst = descs[k].dst, src = descs[k].src, len = descs[k].len;
        unsigned long long i = threadIdx.x;

        if (((dst | src) & 15) == 0) {
            const uint4 *s = (const uint4*)src;
            uint4 *d       = (uint4*)dst;
            const unsigned long long n = len >> 4;

            for (; i < n; i += blockDim.x) {
                d[i] = s[i];
            }
            i = (n << 4) + threadIdx.x;
        }
        for (; i < len; i += blockDim.x) {
            ((unsigned char*)dst)[i] = ((const unsigned char*)src)[i];
        }
    }
}
