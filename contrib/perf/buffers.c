/*
 * The resources of one message size - the buffer slots and their registration, the peer's
 * rkey, the operation slots, the client's samples - and the data pattern that -V writes into
 * the slots and checks where it lands.
 */
#include "perf.h"

#include <endian.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the resources of one size ------------------------------------------------------------- */

int perf_buffers_setup(perf_t *perf, int client)
{
    const perf_params_t *p = &perf->p;
    xfer_status_t st;
    void *buf;

    if (perf_tests[p->test].bw) {
        perf->nslots = p->window;
    } else if (p->test == TEST_TENSOR_LAT) {
        perf->nslots = client ? 1 : TENSOR_LAT_DEPTH;
    } else {
        perf->nslots = 2;   /* ping-pong: [0] the peer writes here, [1] we send from here */
    }
    if (posix_memalign(&buf, 4096, perf->nslots * p->size) != 0) {
        return perf_fail("allocating the buffers", XFER_ERR_NO_MEMORY);
    }
    memset(buf, 0, perf->nslots * p->size);    /* fault the pages in before the clock runs */
    perf->buf = buf;
    perf->ops = calloc(perf->nslots, sizeof(*perf->ops));
    if (perf->ops == NULL) {
        return perf_fail("allocating the requests", XFER_ERR_NO_MEMORY);
    }
    if (client) {
        perf->samples = calloc(p->iters, sizeof(*perf->samples));
        if (perf->samples == NULL) {
            return perf_fail("allocating the samples", XFER_ERR_NO_MEMORY);
        }
    }
    st = xfer_mem_register(perf->ctx, perf->buf, perf->nslots * p->size, XFER_MEM_HOST,
                           &perf->mem);
    if (st != XFER_OK) {
        return perf_fail("xfer_mem_register", st);
    }
    return 0;
}

/* Release the operations' requests; one still pending is freed by xfer when it ends. */
void perf_buffers_release_requests(perf_t *perf)
{
    for (size_t i = 0; perf->ops != NULL && i < perf->nslots; i++) {
        if (perf->ops[i].req != NULL) {
            xfer_request_release(perf->ops[i].req);
            perf->ops[i].req = NULL;
        }
    }
}

/* Give back what xfer holds; after an error the endpoint is closed first (see main). */
void perf_buffers_release(perf_t *perf)
{
    xfer_status_t st;

    perf_buffers_release_requests(perf);
    if (perf->rkey != NULL) {
        xfer_rkey_destroy(perf->rkey);
        perf->rkey = NULL;
    }
    if (perf->mem != NULL) {
        st = xfer_mem_deregister(perf->mem);
        if (st != XFER_OK) {
            perf_fail("xfer_mem_deregister", st);
        }
        perf->mem = NULL;
    }
}

void perf_buffers_free(perf_t *perf)
{
    free(perf->samples);
    free(perf->ops);
    free(perf->buf);
    perf->samples = NULL;
    perf->ops = NULL;
    perf->buf = NULL;
}

/* Unpack the peer's rkey blob and check that it covers nslots slots. */
int perf_rkey_take(perf_t *perf, const uint8_t *blob, size_t len, size_t nslots)
{
    xfer_status_t st = xfer_rkey_unpack(perf->ep, blob, len, &perf->rkey);

    if (st != XFER_OK) {
        return perf_fail("xfer_rkey_unpack", st);
    }
    if (xfer_rkey_length(perf->rkey) < nslots * perf->p.size) {
        fprintf(stderr, "xfer_perf: the peer's rkey covers %zu bytes, expected %" PRIu64 "\n",
                xfer_rkey_length(perf->rkey), nslots * perf->p.size);
        return -1;
    }
    return 0;
}

/* ---- data pattern ---------------------------------------------------------------------------- */

/* The first verification failure wins; the run goes on so both sides finish cleanly. */
void perf_verify_fail(perf_t *perf, const char *fmt, ...)
{
    va_list ap;

    if (perf->verify_error[0] != '\0') {
        return;
    }
    va_start(ap, fmt);
    vsnprintf(perf->verify_error, sizeof(perf->verify_error), fmt, ap);
    va_end(ap);
}

static uint64_t pattern_word(uint64_t seed, uint64_t iter, uint64_t word)
{
    uint64_t x = (seed << 60) ^ (iter << 28) ^ word ^ 0x9e3779b97f4a7c15ull;

    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return htole64(x);
}

void perf_pattern_fill(uint8_t *p, size_t len, uint64_t seed, uint64_t iter)
{
    size_t off;
    uint64_t w;

    for (off = 0; off + 8 <= len; off += 8) {
        w = pattern_word(seed, iter, off / 8);
        memcpy(p + off, &w, 8);
    }
    if (off < len) {
        w = pattern_word(seed, iter, off / 8);
        memcpy(p + off, &w, len - off);
    }
}

void perf_pattern_check(perf_t *perf, const uint8_t *p, size_t len, uint64_t seed,
                        uint64_t iter, const char *what)
{
    uint8_t expect[8];
    size_t off, n, i;
    uint64_t w;

    for (off = 0; off < len; off += 8) {
        n = (len - off < 8) ? len - off : 8;
        w = pattern_word(seed, iter, off / 8);
        memcpy(expect, &w, 8);
        if (memcmp(p + off, expect, n) == 0) {
            continue;
        }
        for (i = 0; p[off + i] == expect[i]; i++) {
        }
        perf_verify_fail(perf, "%s: iteration %" PRIu64 ", %" PRIu64 " bytes: byte %zu is "
                         "0x%02x, expected 0x%02x", what, iter, perf->p.size, off + i,
                         p[off + i], expect[i]);
        return;
    }
}
