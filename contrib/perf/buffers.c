/*
 * The resources of one message size - the buffer slots (host or CUDA memory, -m) and their
 * registration, the peer's rkey, the operation slots, the client's samples - the data
 * pattern that -V writes into the slots and checks where it lands, and the slots' bytes as
 * the tests reach them: directly in host memory, through a host copy in CUDA memory.
 */
#include "perf.h"

#include <endian.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the resources of one size ------------------------------------------------------------- */

/* XFER_OK, or an error with the reason in why (the server sends both to the client). */
static size_t slots_of(const perf_params_t *p, int client)
{
    if (perf_tests[p->test].batch || perf_tests[p->test].bw) {
        return p->window;   /* a batch test's slot: one batch's blocks (perf_batch_region) */
    }
    if (p->test == TEST_TENSOR_LAT) {
        return client ? 1 : TENSOR_LAT_DEPTH;
    }
    return 2;               /* ping-pong: [0] the peer writes here, [1] we send from here */
}

static size_t slot_bytes_of(const perf_params_t *p)
{
    return perf_tests[p->test].batch ? perf_batch_region(p) : p->size;
}

size_t perf_buffers_bytes(const perf_params_t *p, int client)
{
    size_t slots = slots_of(p, client);
    size_t bytes = (perf_slots_shared(p) ? 1 : slots) * slot_bytes_of(p);

    bytes += slots * sizeof(op_slot_t);
    if (client) {
        bytes += p->iters * sizeof(double);                 /* the samples */
    } else if (perf_tests[p->test].batch && (p->notify_len > 0)) {
        bytes += p->iters * sizeof(int64_t);                /* the notification times */
    }
    return bytes;
}

xfer_status_t perf_buffers_setup(perf_t *perf, int client, char *why, size_t why_size)
{
    const perf_params_t *p = &perf->p;
    size_t bytes, need = perf_buffers_bytes(p, client);
    xfer_status_t st;
    void *buf;

    /* the client decides the parameters: a server takes no more than it was told it may */
    if (!client && (need > perf->opts.max_mem)) {
        snprintf(why, why_size, "these parameters need %.1f MiB of the server's memory, more "
                 "than its --max-mem of %.1f MiB allows", (double)need / (1 << 20),
                 (double)perf->opts.max_mem / (1 << 20));
        return XFER_ERR_NO_RESOURCE;
    }
    perf->nslots      = slots_of(p, client);
    perf->slot_stride = perf_slots_shared(p) ? 0 : perf_slot_bytes(perf);
    bytes             = (perf_slots_shared(p) ? 1 : perf->nslots) * perf_slot_bytes(perf);
    perf->buf_mem = (perf_mem_t)p->mem[client ? SIDE_CLIENT : SIDE_SERVER];
    if (perf->buf_mem == PERF_MEM_CUDA) {
        if (perf_cuda_open(perf->opts.cuda_device, why, why_size) != 0) {
            return XFER_ERR_UNAVAILABLE;
        }
        if (perf_cuda_alloc(bytes, &buf, why, why_size) != 0) {
            return XFER_ERR_NO_MEMORY;
        }
        perf->buf = buf;
        if (perf_cuda_memset(buf, 0, bytes) != 0) {
            snprintf(why, why_size, "cannot clear the cuda buffers (cuMemsetD8 failed)");
            return XFER_ERR_IO;
        }
    } else if (perf->buf_mem == PERF_MEM_XFER) {
        st = xfer_mem_alloc(perf->ctx, bytes, XFER_MEM_HOST, &perf->mem);
        if (st != XFER_OK) {
            snprintf(why, why_size, "xfer_mem_alloc of %zu bytes: %s", bytes,
                     xfer_status_string(st));
            return st;
        }
        perf->buf = xfer_mem_address(perf->mem);
        memset(perf->buf, 0, bytes);    /* fault the pages in before the clock runs */
    } else {
        if (posix_memalign(&buf, 4096, bytes) != 0) {
            snprintf(why, why_size, "cannot allocate %zu bytes of buffers", bytes);
            return XFER_ERR_NO_MEMORY;
        }
        memset(buf, 0, bytes);  /* fault the pages in before the clock runs */
        perf->buf = buf;
    }
    perf->ops = calloc(perf->nslots, sizeof(*perf->ops));
    if (client && (perf->ops != NULL)) {
        perf->samples = calloc(p->iters, sizeof(*perf->samples));
    }
    if (!client && perf_tests[p->test].batch && (p->notify_len > 0)) {
        perf->notify_ns = calloc(p->iters, sizeof(*perf->notify_ns));
        if (perf->notify_ns == NULL) {
            snprintf(why, why_size, "cannot allocate the notification samples");
            return XFER_ERR_NO_MEMORY;
        }
    }
    if ((perf->ops == NULL) || (client && (perf->samples == NULL))) {
        snprintf(why, why_size, "cannot allocate the requests and samples");
        return XFER_ERR_NO_MEMORY;
    }
    if (perf->mem != NULL) {
        return XFER_OK;     /* xfer_mem_alloc registered it */
    }
    st = xfer_mem_register(perf->ctx, perf->buf, bytes,
                           (perf->buf_mem == PERF_MEM_CUDA) ? XFER_MEM_CUDA : XFER_MEM_HOST,
                           &perf->mem);
    if (st != XFER_OK) {
        snprintf(why, why_size, "xfer_mem_register of %zu bytes of %s memory: %s%s", bytes,
                 perf_mem_names[perf->buf_mem], xfer_status_string(st),
                 (perf->buf_mem == PERF_MEM_CUDA) ? " (xfer's log line says why)" : "");
        return st;
    }
    return XFER_OK;
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
    perf_batch_release(perf);      /* its lists hold the registration and the rkey */
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
    free(perf->notify_ns);
    free(perf->ops);
    free(perf->scratch);
    if (perf->buf_mem == PERF_MEM_CUDA) {
        perf_cuda_free(perf->buf);
    } else if (perf->buf_mem == PERF_MEM_HOST) {
        free(perf->buf);
    }   /* PERF_MEM_XFER: freed by its xfer_mem_deregister */
    perf->samples = NULL;
    perf->notify_ns = NULL;
    perf->ops = NULL;
    perf->scratch = NULL;
    perf->buf = NULL;
}

/* Unpack the peer's rkey blob and check that it covers `bytes`. */
int perf_rkey_take(perf_t *perf, const uint8_t *blob, size_t len, size_t bytes)
{
    xfer_status_t st = xfer_rkey_unpack(perf->ep, blob, len, &perf->rkey);

    if (st != XFER_OK) {
        return perf_fail("xfer_rkey_unpack", st);
    }
    if (xfer_rkey_length(perf->rkey) < bytes) {
        fprintf(stderr, "xfer_perf: the peer's rkey covers %zu bytes, expected %zu\n",
                xfer_rkey_length(perf->rkey), bytes);
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

static void pattern_fill(uint8_t *p, size_t len, uint64_t seed, uint64_t iter)
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

static void pattern_check(perf_t *perf, const uint8_t *p, size_t len, uint64_t seed,
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

/* ---- the slots' bytes ------------------------------------------------------------------------ */

/* The host copy of one slot that CUDA memory is filled and read through, made on first use. */
static uint8_t *scratch_get(perf_t *perf)
{
    if (perf->scratch == NULL) {
        perf->scratch = malloc(perf_slot_bytes(perf));
        if (perf->scratch == NULL) {
            perf_verify_fail(perf, "cannot allocate a host copy of one %zu-byte slot",
                             perf_slot_bytes(perf));
        }
    }
    return perf->scratch;
}

/*
 * The pattern into the first len bytes of slot, and checked there. CUDA memory is filled and
 * read through a host copy; a copy that fails is a failure of the data, reported with it at
 * the end of the size.
 */
void perf_slot_fill(perf_t *perf, size_t slot, size_t len, uint64_t seed, uint64_t iter)
{
    perf_range_fill(perf, slot * perf->slot_stride, len, seed, iter);
}

void perf_slot_check(perf_t *perf, size_t slot, size_t len, uint64_t seed, uint64_t iter,
                     const char *what)
{
    perf_range_check(perf, slot * perf->slot_stride, len, seed, iter, what);
}

/* The same for len bytes at offset off of the buffer (len at most a slot's bytes). */
void perf_range_fill(perf_t *perf, size_t off, size_t len, uint64_t seed, uint64_t iter)
{
    if (perf->buf_mem != PERF_MEM_CUDA) {
        pattern_fill(perf->buf + off, len, seed, iter);
        return;
    }
    if (scratch_get(perf) == NULL) {
        return;
    }
    pattern_fill(perf->scratch, len, seed, iter);
    if (perf_cuda_from_host(perf->buf + off, perf->scratch, len) != 0) {
        perf_verify_fail(perf, "iteration %" PRIu64 ": cannot fill the cuda buffer at offset "
                         "%zu", iter, off);
    }
}

void perf_range_check(perf_t *perf, size_t off, size_t len, uint64_t seed, uint64_t iter,
                      const char *what)
{
    if (perf->buf_mem != PERF_MEM_CUDA) {
        pattern_check(perf, perf->buf + off, len, seed, iter, what);
        return;
    }
    if (scratch_get(perf) == NULL) {
        return;
    }
    if (perf_cuda_to_host(perf->scratch, perf->buf + off, len) != 0) {
        perf_verify_fail(perf, "%s: iteration %" PRIu64 ": cannot read the cuda buffer at "
                         "offset %zu back", what, iter, off);
        return;
    }
    pattern_check(perf, perf->scratch, len, seed, iter, what);
}

void perf_slot_zero(perf_t *perf, size_t slot)
{
    if (perf->buf_mem != PERF_MEM_CUDA) {
        memset(perf_slot_buf(perf, slot), 0, perf_slot_bytes(perf));
    } else if (perf_cuda_memset(perf_slot_buf(perf, slot), 0, perf_slot_bytes(perf)) != 0) {
        perf_verify_fail(perf, "cannot clear the cuda slot %zu", slot);
    }
}

/* One byte of a slot (put_lat's marker); 0 or -1 (the reason printed). */
int perf_slot_byte_set(perf_t *perf, size_t slot, size_t off, uint8_t value)
{
    if (perf->buf_mem == PERF_MEM_CUDA) {
        return perf_cuda_from_host(perf_slot_buf(perf, slot) + off, &value, 1);
    }
    perf_slot_buf(perf, slot)[off] = value;
    return 0;
}

int perf_slot_byte_get(perf_t *perf, size_t slot, size_t off, uint8_t *value_p)
{
    if (perf->buf_mem == PERF_MEM_CUDA) {
        return perf_cuda_to_host(value_p, perf_slot_buf(perf, slot) + off, 1);
    }
    /* the peer's put lands behind the compiler's back */
    *value_p = *(volatile uint8_t*)(perf_slot_buf(perf, slot) + off);
    return 0;
}
