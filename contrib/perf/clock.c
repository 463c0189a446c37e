/*
 * The clocks of xfer_perf. perf_now_ns() is CLOCK_MONOTONIC, for deadlines and bandwidth.
 * The latency loops read a cheaper one inside the interval they time: on x86-64 with an
 * invariant TSC (constant_tsc and nonstop_tsc), rdtsc - 8 ns here where clock_gettime takes
 * 19, and the read itself is part of every sample - scaled to nanoseconds by the two clocks'
 * advance over the whole loop, as ucx_perftest times with the TSC, unless that rate is more
 * than 5 % off one measured over 2 ms at the start (the loop's ends read on CPUs whose TSCs
 * disagree, as in some VMs). Elsewhere it is perf_now_ns().
 */
#include "perf.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__)
#include <x86intrin.h>
#endif

uint64_t perf_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Does /proc/cpuinfo list both flags that make the TSC a clock across cores and C-states? */
static int tsc_invariant(void)
{
#if defined(__x86_64__)
    static int known = -1;
    char line[4096];
    FILE *f;

    if (known >= 0) {
        return known;
    }
    known = 0;
    f     = fopen("/proc/cpuinfo", "r");
    while ((f != NULL) && (fgets(line, sizeof(line), f) != NULL)) {
        if (strncmp(line, "flags", 5) == 0) {
            known = (strstr(line, " constant_tsc") != NULL) &&
                    (strstr(line, " nonstop_tsc") != NULL);
            break;
        }
    }
    if (f != NULL) {
        fclose(f);
    }
    return known;
#else
    return 0;
#endif
}

void perf_lat_clock_start(perf_lat_clock_t *c)
{
    c->tsc         = tsc_invariant();
    c->ns_tick     = 1.0;
    c->ns_tick_cal = 0;
    if (c->tsc) {
        /* a short calibration, unlikely to be split by a move to another CPU */
        uint64_t n0 = perf_now_ns(), t0 = perf_lat_clock_now(c), n1;

        while ((n1 = perf_now_ns()) - n0 < 2000000) {
        }
        c->ns_tick_cal = (double)(n1 - n0) / (double)(perf_lat_clock_now(c) - t0);
    }
    c->ns0       = perf_now_ns();
    c->timed_ns0 = c->ns0;
    c->ticks0    = perf_lat_clock_now(c);
}

void perf_lat_clock_timed(perf_lat_clock_t *c)
{
    c->timed_ns0 = perf_now_ns();
}

uint64_t perf_lat_clock_now(const perf_lat_clock_t *c)
{
#if defined(__x86_64__)
    if (c->tsc) {
        return __rdtsc();
    }
#endif
    (void)c;
    return perf_now_ns();
}

uint64_t perf_lat_clock_scale(perf_lat_clock_t *c, double *samples, size_t n)
{
    uint64_t ticks = perf_lat_clock_now(c) - c->ticks0;
    uint64_t end   = perf_now_ns();
    uint64_t ns    = end - c->ns0;

    if (!c->tsc || (ticks == 0)) {
        return end - c->timed_ns0;  /* the samples are nanoseconds already */
    }
    c->ns_tick = (double)ns / (double)ticks;
    if ((c->ns_tick_cal > 0) && ((c->ns_tick > c->ns_tick_cal * 1.05) ||
                                 (c->ns_tick < c->ns_tick_cal * 0.95))) {
        /* the TSCs of the CPUs the loop ran on do not agree (seen in VMs): the loop's two
         * ends were read on different ones; the calibration's rate is the one to trust */
        fprintf(stderr, "xfer_perf: the TSC advanced %.3f ns a tick over the loop and %.3f at "
                "its start: the CPUs' TSCs disagree; scaled by the start's\n", c->ns_tick,
                c->ns_tick_cal);
        c->ns_tick = c->ns_tick_cal;
    }
    for (size_t i = 0; i < n; i++) {
        samples[i] *= c->ns_tick;
    }
    return end - c->timed_ns0;
}
