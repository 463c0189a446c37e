/*
 * Where a batch's blocks lie at its target: block i of n at (i * stride) mod n, the stride
 * about 0.618 n and prime to n, so that no two consecutive blocks are neighbours. xfer_perf's
 * batch tests place the server's blocks so, and tcp_floor --scatter receives into the same
 * places, so that its floor stands for the same pattern.
 */
#ifndef XFER_PERF_SCATTER_H
#define XFER_PERF_SCATTER_H

#include <stdint.h>

static inline uint64_t scatter_gcd(uint64_t a, uint64_t b)
{
    while (b != 0) {
        uint64_t t = a % b;

        a = b;
        b = t;
    }
    return a;
}

/* n >= 1 */
static inline uint64_t scatter_stride(uint64_t n)
{
    uint64_t s = (n * 618 / 1000) | 1;

    while (scatter_gcd(s, n) != 1) {
        s += 2;
    }
    return s;
}

#endif
