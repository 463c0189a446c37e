/*
 * What xfer_perf prints: a size's figures computed from its samples, the table (header and a
 * row per size) or one JSON object, the endpoint's counters with -v, and the error lines.
 */
#include "perf.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

int perf_fail(const char *what, xfer_status_t status)
{
    fprintf(stderr, "xfer_perf: %s: %s\n", what, xfer_status_string(status));
    return -1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return (x > y) - (x < y);
}

void perf_result_compute(perf_t *perf, uint64_t elapsed_ns, result_t *r)
{
    const perf_params_t *p = &perf->p;
    size_t n = p->iters, i99;
    double sum = 0;

    qsort(perf->samples, n, sizeof(double), cmp_double);
    for (size_t i = 0; i < n; i++) {
        sum += perf->samples[i];
    }
    i99 = (size_t)ceil(0.99 * (double)n);
    r->bytes = p->size;
    r->batch = p->batch;
    r->iters = n;
    r->window = perf_tests[p->test].bw ? p->window : 1;
    r->t_typical = perf->samples[n / 2];
    r->elapsed_usec = (double)elapsed_ns / 1e3;
    r->loop_usec = (double)perf->loop_ns / 1e3;
    r->t_99 = perf->samples[(i99 > 0) ? i99 - 1 : 0];
    /* bandwidth tests: the whole time, handshake included; latency tests: the samples */
    r->t_avg = perf_tests[p->test].bw ? (double)elapsed_ns / 1e3 / (double)n : sum / (double)n;
    r->bw_mbps = (r->t_avg > 0) ? (double)p->size / r->t_avg : 0;    /* bytes/usec == MB/s */
    r->mpps = (r->t_avg > 0) ? 1.0 / r->t_avg : 0;
    if (perf_tests[p->test].batch) {
        /* the samples are each batch's post to completion; the rates use the whole time */
        double usec = (double)elapsed_ns / 1e3;

        r->t_avg = sum / (double)n;
        r->bw_mbps = (usec > 0) ? (double)p->size * p->batch * (double)n / usec : 0;
        r->mpps = (usec > 0) ? (double)p->batch * (double)n / usec : 0;
        r->post_usec = (double)perf->post_ns_sum / 1e3 / (double)n / p->batch;
        r->window = p->window;
    }
}

void perf_print_header(perf_t *perf, const char *addr)
{
    const options_t *o = &perf->opts;
    test_t t = o->test;

    printf("# xfer_perf %s: %s, transport %s, thread mode %s, wait mode %s\n",
           perf_tests[t].name, addr, xfer_endpoint_transport(perf->ep),
           o->multi ? "multi" : "serialized", o->sleep ? "sleep" : "poll");
    if (perf_tests[t].batch) {
        printf("# %u batch%s in flight, notification %u bytes, verify %s; t_* = one batch, "
               "post to completion; notify_* = the client's post to the notification at the "
               "server; MsgRate = descriptors (MB = 10^6 bytes)\n", o->window,
               (o->window == 1) ? "" : "es", o->notify_len, o->verify ? "on" : "off");
    } else if (perf_tests[t].bw) {
        printf("# window %u (at most %llu MiB in flight), verify %s; t_* = time between "
               "completions, t_avg = total / iterations (MB = 10^6 bytes)\n", o->window,
               WINDOW_BYTES_MAX >> 20, o->verify ? "on" : "off");
    } else {
        printf("# verify %s; t_* = %s (MB = 10^6 bytes)\n", o->verify ? "on" : "off",
               (t == TEST_TENSOR_LAT) ? "one whole fetch" : "half a round trip");
    }
    printf("# memory: client %s%s%s, server %s\n", perf_mem_names[o->mem[SIDE_CLIENT]],
           (o->mem[SIDE_CLIENT] == PERF_MEM_CUDA) ? " " : "",
           (o->mem[SIDE_CLIENT] == PERF_MEM_CUDA) ? perf_cuda_device_name() : "",
           perf_mem_names[o->mem[SIDE_SERVER]]);
    if (perf_tests[t].batch) {
        printf("%-10s %-7s %-12s %-17s %-14s %-16s %-12s %-12s %-12s %-17s %s\n", "#block",
               "#batch", "#iterations", "BW average[MB/s]", "MsgRate[Mpps]", "post[usec/desc]",
               "t_typ[usec]", "t_avg[usec]", "t_99%[usec]", "notify_avg[usec]",
               "notify_99%[usec]");
    } else {
        printf("%-10s %-13s %-18s %-15s %-17s %-13s %s\n", "#bytes", "#iterations",
               "BW average[MB/s]", "MsgRate[Mpps]", "t_typical[usec]", "t_avg[usec]",
               "t_99%[usec]");
    }
    fflush(stdout);
}

/* The clocks' alignment, once the client has taken it (batch tests with notifications). */
void perf_print_clock(perf_t *perf)
{
    if (perf->opts.json || !perf->clock_synced) {
        return;
    }
    if (perf->clock_error == 0) {
        printf("# clocks: one host, one CLOCK_MONOTONIC (same boot id): notify_* exact\n");
    } else {
        printf("# clocks: the server's is %+.1f usec from the client's, +- %.1f usec (half "
               "the shortest of 32 round trips)\n", (double)perf->clock_offset / 1e3,
               (double)perf->clock_error / 1e3);
    }
    fflush(stdout);
}

void perf_print_row(perf_t *perf, const result_t *r)
{
    if (perf_tests[perf->p.test].batch) {
        char n_avg[32] = "-", n_99[32] = "-";

        if (r->has_notify) {
            snprintf(n_avg, sizeof(n_avg), "%.2f", r->notify_avg);
            snprintf(n_99, sizeof(n_99), "%.2f", r->notify_99);
        }
        printf("%-10" PRIu64 " %-7u %-12" PRIu64 " %-17.2f %-14.6f %-16.4f %-12.2f %-12.2f "
               "%-12.2f %-17s %s\n", r->bytes, r->batch, r->iters, r->bw_mbps, r->mpps,
               r->post_usec, r->t_typical, r->t_avg, r->t_99, n_avg, n_99);
        fflush(stdout);
        return;
    }
    printf("%-10" PRIu64 " %-13" PRIu64 " %-18.2f %-15.6f %-17.2f %-13.2f %.2f\n", r->bytes,
           r->iters, r->bw_mbps, r->mpps, r->t_typical, r->t_avg, r->t_99);
    fflush(stdout);
}

static void json_string(const char *s)
{
    putchar('"');
    for (; *s != '\0'; s++) {
        if (*s == '"' || *s == '\\') {
            printf("\\%c", *s);
        } else if ((unsigned char)*s < 0x20) {
            printf("\\u%04x", *s);
        } else {
            putchar(*s);
        }
    }
    putchar('"');
}

void perf_print_json(perf_t *perf, const char *addr)
{
    printf("{\"test\":\"%s\",\"peer\":", perf_tests[perf->opts.test].name);
    json_string(addr);
    printf(",\"transport\":");
    json_string(xfer_endpoint_transport(perf->ep));
    printf(",\"thread_mode\":\"%s\"", perf->opts.multi ? "multi" : "serialized");
    printf(",\"wait_mode\":\"%s\"", perf->opts.sleep ? "sleep" : "poll");
    printf(",\"memory\":{\"client\":\"%s\",\"server\":\"%s\"}",
           perf_mem_names[perf->opts.mem[SIDE_CLIENT]],
           perf_mem_names[perf->opts.mem[SIDE_SERVER]]);
    printf(",\"verify\":%s,\"mb\":1000000", perf->opts.verify ? "true" : "false");
    if (perf->clock_synced) {
        printf(",\"clock_offset_usec\":%.3f,\"clock_error_usec\":%.3f",
               (double)perf->clock_offset / 1e3, (double)perf->clock_error / 1e3);
    }
    printf(",\"results\":[");
    for (unsigned i = 0; i < perf->nrows; i++) {
        const result_t *r = &perf->rows[i];

        printf("%s{\"bytes\":%" PRIu64 ",\"iterations\":%" PRIu64 ",\"window\":%u,"
               "\"bw_average_mbps\":%.3f,\"msg_rate_mpps\":%.6f,\"t_typical_usec\":%.3f,"
               "\"t_avg_usec\":%.3f,\"t_99_usec\":%.3f,\"elapsed_usec\":%.3f,"
               "\"loop_usec\":%.3f", i ? "," : "", r->bytes, r->iters, r->window, r->bw_mbps,
               r->mpps, r->t_typical, r->t_avg, r->t_99, r->elapsed_usec, r->loop_usec);
        if (perf_tests[perf->opts.test].batch) {
            printf(",\"batch\":%u,\"post_usec_per_desc\":%.4f", r->batch, r->post_usec);
            if (r->has_notify) {
                printf(",\"notify_avg_usec\":%.3f,\"notify_99_usec\":%.3f", r->notify_avg,
                       r->notify_99);
            }
        }
        printf("}");
    }
    printf("]}\n");
}

/* -v: the endpoint's transport counters (those that moved), after the run. */
void perf_counters_print(perf_t *perf)
{
    xfer_counter_t c[128];
    size_t n = 128;

    if (!perf->opts.verbose || (perf->ep == NULL) ||
        (xfer_endpoint_counters(perf->ep, c, &n) != XFER_OK)) {
        return;
    }
    printf("# %s counters of the endpoint to %s (those not 0):\n",
           xfer_endpoint_transport(perf->ep), xfer_endpoint_peer(perf->ep));
    for (size_t i = 0; (i < n) && (i < 128); i++) {
        if (c[i].value != 0) {
            printf("#   %-28s %" PRIu64 "\n", c[i].name, c[i].value);
        }
    }
    fflush(stdout);
}
