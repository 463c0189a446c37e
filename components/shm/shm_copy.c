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
 */
#include "shm.h"

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__)
#include <emmintrin.h>

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
#else
static void copy_nt(uint8_t *dst, const uint8_t *src, size_t n)
{
    memcpy(dst, src, n);
}
#endif

void xfer_shm_copy(xfer_iface_h iface, void *dst, const void *src, size_t n)
{
    xfer_shm_copy_part(iface, dst, src, n, n);
}

void xfer_shm_copy_part(xfer_iface_h iface, void *dst, const void *src, size_t n, size_t whole)
{
    /* a short part of a large transfer (its last) is not worth aligning for streaming */
    if ((whole >= iface->cfg->nt_copy_min) && (n >= 4096)) {
        copy_nt(dst, src, n);
    } else {
        memcpy(dst, src, n);
    }
}
