/*
 * What every fuzz harness shares: the libFuzzer entry point, a check that stops the process
 * on a broken property (so that libFuzzer keeps the input and the replay reports it), and a
 * cursor that turns input bytes into values for the structured round trips.
 *
 * A harness is a plain C file defining LLVMFuzzerTestOneInput. Built with clang and
 * -fsanitize=fuzzer it is a fuzzer (make fuzz); linked with replay.c by the normal compiler
 * it replays test/fuzz/corpus/<name> and test/fuzz/regressions/<name> (make check).
 */
#ifndef XFER_FUZZ_H
#define XFER_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Room for the parsers' "why" texts. */
#define FUZZ_WHY_LEN 256

/* A property the code under test must keep. Harness code, not library code: it aborts. */
#define FUZZ_CHECK(_cond, ...) \
    do { \
        if (!(_cond)) { \
            fprintf(stderr, "%s:%d: fuzz check failed: %s: ", __FILE__, __LINE__, #_cond); \
            fprintf(stderr, __VA_ARGS__); \
            fprintf(stderr, "\n"); \
            abort(); \
        } \
    } while (0)

/* Input bytes consumed front to back; once they run out every value is 0. */
typedef struct fuzz_cursor {
    const uint8_t *p;
    size_t        left;
} fuzz_cursor_t;

static inline uint64_t fuzz_take(fuzz_cursor_t *c, unsigned bytes)
{
    uint64_t v = 0;

    for (unsigned i = 0; i < bytes; i++) {
        uint8_t b = 0;

        if (c->left > 0) {
            b = *c->p++;
            c->left--;
        }
        v |= (uint64_t)b << (8 * i);
    }
    return v;
}

/* Up to max bytes into dst (the count comes from the input); returns how many. */
static inline size_t fuzz_take_bytes(fuzz_cursor_t *c, void *dst, size_t max)
{
    size_t n = (max == 0) ? 0 : (size_t)(fuzz_take(c, 2) % (max + 1));

    if (n > c->left) {
        n = c->left;
    }
    memcpy(dst, c->p, n);
    c->p    += n;
    c->left -= n;
    return n;
}

/* A transport name of 1..max characters from [a-z0-9_], as the loader and wire accept. */
static inline size_t fuzz_take_name(fuzz_cursor_t *c, char *dst, size_t max)
{
    static const char alphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789_";
    size_t n = 1 + (size_t)(fuzz_take(c, 1) % max);

    for (size_t i = 0; i < n; i++) {
        dst[i] = alphabet[fuzz_take(c, 1) % (sizeof(alphabet) - 1)];
    }
    dst[n] = '\0';
    return n;
}

#endif
