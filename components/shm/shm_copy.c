/*
 * Copies between this process's memory and a mapping of a peer's (puts, gets, batches and
 * rendezvous messages to and from xfer_mem_alloc memory).
 *
 * From XFER_SHM_NT_COPY_MIN bytes on, the destination is written with non-temporal stores:
 * a copy that large does not stay in this core's caches anyway, and a plain store first
 * reads each destination line into the cache (a third stream of memory traffic beside the
 * source's reads and the destination's writes). Measured alone on the development machine,
 * a 64 MiB copy ran at 6-10 GB/s with memcpy and 12-13 GB/s with these stores. glibc's
 * memcpy makes the same choice, but from 3/4 of the last-level cache per thread,
 * which on a virtual machine is the whole host's (hundreds of MiB) and never reached.
 *
 * Blocks of XFER_SHM_VEC_MIN to XFER_SHM_VEC_MAX bytes whose two sides lie at the same offset
 * within 32 bytes (page-aligned KV-cache blocks, a batch's pieces) are copied by a loop of
 * aligned 32-byte loads and stores where the CPU has AVX2. On the development machine
 * (Sapphire Rapids under KVM; 128 scattered 4 KiB blocks against one 512 KiB copy, medians
 * of 4000 each) glibc's memcpy (its AVX-512 variant) copied the blocks at 0.90-0.95 of the
 * one copy's speed, this loop at 0.97-1.0; from 64 KiB on the two are alike, and one large
 * memcpy (rep movsb) is as fast as anything. With the sides at different offsets within
 * 32 bytes the loop measured no better than memcpy, which is left to handle them.
 */
#include "shm.h"

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

#define XFER_SHM_VEC_MIN 256u
#define XFER_SHM_VEC_MAX (64u << 10)    /* from here memcpy (rep movsb) is as fast */

/* SSE2 is part of x86-64: no dispatch needed. The destination is aligned to 16 bytes by a
 * plain copy of its head; the source may be unaligned (loadu). */
static void copy_nt(uint8_t *dst, const uint8_t *src, size_t n)
{
    size_t head = (16 - ((uintptr_t)dst & 15)) & 15;

    memcpy(dst, src, head);
    dst += head;
    src += head;
    n   -= head;
    /* the last 1 to 64 bytes are left to the plain copy after the fence: they land after all
     * the rest, for a reader that polls the last byte for the data's arrival */
    for (; n > 64; n -= 64, dst += 64, src += 64) {
        __m128i a = _mm_loadu_si128((const __m128i*)(const void*)src);
        __m128i b = _mm_loadu_si128((const __m128i*)(const void*)(src + 16));
        __m128i c = _mm_loadu_si128((const __m128i*)(const void*)(src + 32));
        __m128i d = _mm_loadu_si128((const __m128i*)(const void*)(src + 48));

        _mm_stream_si128((__m128i*)(void*)dst, a);
        _mm_stream_si128((__m128i*)(void*)(dst + 16), b);
        _mm_stream_si128((__m128i*)(void*)(dst + 32), c);
        _mm_stream_si128((__m128i*)(void*)(dst + 48), d);
    }
    /* non-temporal stores are weakly ordered: everything after this copy (a completion, a
     * notification written into the ring) must come after them */
    _mm_sfence();
    memcpy(dst, src, n);
}

/* n >= XFER_SHM_VEC_MIN, dst and src at the same offset within 32 bytes. Stores go in
 * address order, the last bytes last, as from copy_nt. */
__attribute__((target("avx2")))
static void copy_vec(uint8_t *dst, const uint8_t *src, size_t n)
{
    size_t head = (32 - ((uintptr_t)dst & 31)) & 31;

    /* the head: one unaligned vector, which the aligned loop partly writes again */
    _mm256_storeu_si256((__m256i*)(void*)dst,
                        _mm256_loadu_si256((const __m256i*)(const void*)src));
    dst += head;
    src += head;
    n   -= head;
    for (; n >= 128; n -= 128, dst += 128, src += 128) {
        __m256i a = _mm256_load_si256((const __m256i*)(const void*)src);
        __m256i b = _mm256_load_si256((const __m256i*)(const void*)(src + 32));
        __m256i c = _mm256_load_si256((const __m256i*)(const void*)(src + 64));
        __m256i d = _mm256_load_si256((const __m256i*)(const void*)(src + 96));

        _mm256_store_si256((__m256i*)(void*)dst, a);
        _mm256_store_si256((__m256i*)(void*)(dst + 32), b);
        _mm256_store_si256((__m256i*)(void*)(dst + 64), c);
        _mm256_store_si256((__m256i*)(void*)(dst + 96), d);
    }
    for (; n >= 32; n -= 32, dst += 32, src += 32) {
        _mm256_store_si256((__m256i*)(void*)dst,
                           _mm256_load_si256((const __m256i*)(const void*)src));
    }
    if (n > 0) {
        /* the last 32 bytes of the block, overlapping what the loop wrote (the block is
         * longer than that: n >= XFER_SHM_VEC_MIN) */
        _mm256_storeu_si256((__m256i*)(void*)(dst + n - 32),
                            _mm256_loadu_si256((const __m256i*)(const void*)(src + n - 32)));
    }
}

static int copy_vec_fits(const void *dst, const void *src, size_t n)
{
    return (n >= XFER_SHM_VEC_MIN) && (n < XFER_SHM_VEC_MAX) &&
           ((((uintptr_t)dst ^ (uintptr_t)src) & 31) == 0) && __builtin_cpu_supports("avx2");
}
#else
static void copy_nt(uint8_t *dst, const uint8_t *src, size_t n)
{
    memcpy(dst, src, n);
}

static void copy_vec(uint8_t *dst, const uint8_t *src, size_t n)
{
    memcpy(dst, src, n);
}

static int copy_vec_fits(const void *dst, const void *src, size_t n)
{
    (void)dst;
    (void)src;
    (void)n;
    return 0;
}
#endif

static inline void copy_chosen(xfer_iface_h iface, void *dst, const void *src, size_t n,
                               size_t whole)
{
    /* a short part of a large transfer (its last) is not worth aligning for streaming */
    if ((whole >= iface->cfg->nt_copy_min) && (n >= 4096)) {
        copy_nt(dst, src, n);
    } else if (copy_vec_fits(dst, src, n)) {
        copy_vec(dst, src, n);
    } else {
        memcpy(dst, src, n);
    }
}

void xfer_shm_copy(xfer_iface_h iface, void *dst, const void *src, size_t n)
{
    copy_chosen(iface, dst, src, n, n);
}

void xfer_shm_copy_part(xfer_iface_h iface, void *dst, const void *src, size_t n, size_t whole)
{
    copy_chosen(iface, dst, src, n, whole);
}
