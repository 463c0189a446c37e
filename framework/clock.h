/*
 * The framework's clock: milliseconds on CLOCK_MONOTONIC, for deadlines (bootstrap steps,
 * closes, request waits). Not the wall clock, so that a time change moves no deadline.
 */
#ifndef XFER_CLOCK_H
#define XFER_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline int64_t xfer_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

#endif
