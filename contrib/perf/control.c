/*
 * The control protocol between xfer_perf's client and server, in tag messages on TAG_CTRL:
 * the client connects, and for each message size sends the parameters (PARAMS), the server
 * answers READY (with an rkey of its buffer for put/get), both run the test, the client says
 * FIN and the server's ACK stops the clock and carries its verdict; BYE ends the session.
 *
 * Every control message, little-endian:
 *   magic u32 | version u16 | kind u16 | status i32 (an xfer_status_t) | length u32 | payload
 * PARAMS payload (client -> server, before each size):
 *   test u32 | flags u32 | window u32 | client memory u8 | server memory u8 | reserved u16 |
 *   size u64 | iterations u64 | warmup u64 | step_base u64 | batch u32 | notify_len u32
 *   (memory: a perf_mem_t, -m; the server allocates its buffers where the client says, as
 *   ucx_perftest's server takes the client's parameters)
 * READY (server -> client): an rkey blob for put/get tests, or on error a message (the
 *   server cannot allocate or register its buffers, or its memory cannot take its part).
 * RKEY  (client -> server, put_lat): the client's rkey blob.
 * FIN   (client -> server, end of a size) and ACK (the reply: on a verification failure the
 *   status is an error and the payload says what; after a batch test with notifications
 *   the server's figures of them, batch.c); BYE ends the session and is ACKed too.
 * SYNC  (client -> server, before the first batch test: the client's clock u64) answered by
 *   SYNC (the server's clock u64 | its boot id): the client estimates the offset between the
 *   two clocks, so that a notification's latency at the server can be taken from the
 *   client's post.
 * A client whose first message is not valid PARAMS (or BYE) is dropped and the server accepts
 * the next one.
 */
#include "perf.h"

#include <xfer/byteorder.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MSG_MAGIC    0x78667066u
#define MSG_VERSION  3     /* 3: batch tests (PARAMS' batch and notify_len, SYNC) */
#define MSG_HDR_LEN  16
#define PARAMS_LEN   56
#define SYNC_ROUNDS  32
#define BOOT_ID_LEN  36

typedef enum {
    MSG_PARAMS = 1, MSG_READY, MSG_RKEY, MSG_FIN, MSG_ACK, MSG_BYE, MSG_SYNC
} msg_kind_t;

static const char *msg_names[] = {"?", "PARAMS", "READY", "RKEY", "FIN", "ACK", "BYE", "SYNC"};

/* ---- control messages ------------------------------------------------------------------------ */

static int ctrl_send(perf_t *perf, msg_kind_t kind, xfer_status_t status, const void *payload,
                     size_t len)
{
    uint8_t msg[MSG_MAX];
    xfer_request_t *req = NULL;
    xfer_status_t st;
    char what[64];

    snprintf(what, sizeof(what), "sending %s", msg_names[kind]);
    if (len > MSG_MAX - MSG_HDR_LEN) {
        return perf_fail(what, XFER_ERR_OUT_OF_RANGE);
    }
    xfer_put_le32(msg, MSG_MAGIC);
    xfer_put_le32(msg + 4, MSG_VERSION | ((uint32_t)kind << 16));
    xfer_put_le32(msg + 8, (uint32_t)status);
    xfer_put_le32(msg + 12, (uint32_t)len);
    if (len > 0) {
        memcpy(msg + MSG_HDR_LEN, payload, len);
    }
    st = xfer_tag_send(perf->ep, TAG_CTRL, msg, MSG_HDR_LEN + len, NULL, NULL, NULL, &req);
    if (st != XFER_OK && st != XFER_INPROGRESS) {
        return perf_fail(what, st);
    }
    if (req != NULL) {
        st = perf_wait(perf, req);
        xfer_request_release(req);
        if (st != XFER_OK) {
            return perf_fail(what, st);
        }
    }
    return 0;
}

/*
 * Post the receive of the next control message ahead, before sending what it answers: a
 * request/response pair should not depend on the unexpected queue.
 */
static int ctrl_post(perf_t *perf)
{
    xfer_status_t st;

    st = xfer_tag_recv(perf->ctx, perf->ep, TAG_CTRL, TAG_FULL, perf->ctrl_buf,
                       sizeof(perf->ctrl_buf), NULL, NULL, NULL, &perf->ctrl_req);
    if (st != XFER_OK && st != XFER_INPROGRESS) {
        perf->ctrl_req = NULL;
        return perf_fail("posting the receive of a control message", st);
    }
    return 0;
}

/*
 * Receive the next control message (posting its receive unless ctrl_post() did), which must
 * be of kind `kind` or one of the kinds in the mask `also` (1 << kind). The payload is copied
 * to payload (up to MSG_MAX bytes) and NUL-terminated.
 */
static int ctrl_recv(perf_t *perf, msg_kind_t kind, unsigned also, msg_kind_t *kind_p,
                     xfer_status_t *status_p, uint8_t *payload, size_t *len_p)
{
    const uint8_t *msg = perf->ctrl_buf;
    xfer_request_t *req;
    xfer_status_t st;
    uint32_t got_kind, len;
    size_t n;
    char what[64];

    snprintf(what, sizeof(what), "waiting for %s from the peer", msg_names[kind]);
    if (perf->ctrl_req == NULL && ctrl_post(perf) != 0) {
        return -1;
    }
    req = perf->ctrl_req;
    perf->ctrl_req = NULL;
    st = perf_wait(perf, req);
    n = xfer_request_length(req);
    if (st == XFER_ERR_TIMEOUT) {
        xfer_request_cancel(req);
    }
    xfer_request_release(req);
    if (st != XFER_OK) {
        return perf_fail(what, st);
    }
    if (n < MSG_HDR_LEN || xfer_get_le32(msg) != MSG_MAGIC ||
        (xfer_get_le32(msg + 4) & 0xffff) != MSG_VERSION) {
        fprintf(stderr, "xfer_perf: %s: not an xfer_perf v%d control message (%zu bytes)\n",
                what, MSG_VERSION, n);
        return -1;
    }
    got_kind = xfer_get_le32(msg + 4) >> 16;
    len = xfer_get_le32(msg + 12);
    if (len != n - MSG_HDR_LEN ||
        (got_kind != (uint32_t)kind &&
         !((got_kind < 32) && (also & (1u << got_kind))))) {
        fprintf(stderr, "xfer_perf: %s: protocol error: got %s with %u payload bytes in a "
                "%zu-byte message\n", what,
                got_kind < sizeof(msg_names) / sizeof(msg_names[0]) ? msg_names[got_kind] : "?",
                len, n);
        return -1;
    }
    memcpy(payload, msg + MSG_HDR_LEN, len);
    payload[len] = '\0';
    *kind_p = (msg_kind_t)got_kind;
    *status_p = (xfer_status_t)(int32_t)xfer_get_le32(msg + 8);
    *len_p = len;
    return 0;
}

static void params_encode(const perf_params_t *p, uint8_t *out)
{
    xfer_put_le32(out, p->test);
    xfer_put_le32(out + 4, p->flags);
    xfer_put_le32(out + 8, p->window);
    out[12] = p->mem[SIDE_CLIENT];
    out[13] = p->mem[SIDE_SERVER];
    xfer_put_le16(out + 14, 0);
    xfer_put_le64(out + 16, p->size);
    xfer_put_le64(out + 24, p->iters);
    xfer_put_le64(out + 32, p->warmup);
    xfer_put_le64(out + 40, p->step_base);
    xfer_put_le32(out + 48, p->batch);
    xfer_put_le32(out + 52, p->notify_len);
}

/* NULL when the parameters are usable, else why not. */
static const char *params_decode(const uint8_t *in, size_t len, perf_params_t *p)
{
    if (len != PARAMS_LEN) {
        return "PARAMS has the wrong length";
    }
    p->test = xfer_get_le32(in);
    p->flags = xfer_get_le32(in + 4);
    p->window = xfer_get_le32(in + 8);
    p->mem[SIDE_CLIENT] = in[12];
    p->mem[SIDE_SERVER] = in[13];
    p->size = xfer_get_le64(in + 16);
    p->iters = xfer_get_le64(in + 24);
    p->warmup = xfer_get_le64(in + 32);
    p->step_base = xfer_get_le64(in + 40);
    p->batch = xfer_get_le32(in + 48);
    p->notify_len = xfer_get_le32(in + 52);
    if (p->test >= TEST_LAST) {
        return "unknown test";
    }
    if ((p->batch == 0) || (p->batch > MAX_BATCH) ||
        (!perf_tests[p->test].batch && (p->batch != 1))) {
        return "batch length out of range";
    }
    if ((p->notify_len != 0) && (!perf_tests[p->test].batch || (p->notify_len < NOTIFY_MIN) ||
                                 (p->notify_len > NOTIFY_MAX))) {
        return "notification length out of range";
    }
    if (p->size == 0 || p->size > MAX_SIZE) {
        return "size out of range";
    }
    if (p->window == 0 || p->window > MAX_WINDOW ||
        (uint64_t)p->window * (perf_tests[p->test].batch ? perf_batch_region(p) : p->size) >
        WINDOW_BYTES_MAX + MAX_SIZE) {
        return "window out of range";
    }
    if (p->iters == 0 || p->iters > (1ull << 32) || p->warmup > (1ull << 32)) {
        return "iterations out of range";
    }
    if (p->mem[SIDE_CLIENT] >= PERF_MEM_LAST || p->mem[SIDE_SERVER] >= PERF_MEM_LAST) {
        return "unknown memory type";
    }
    return NULL;
}

/* Why xfer_rkey_pack failed, and what that means for CUDA memory. */
static void rkey_pack_why(perf_t *perf, const char *side, xfer_status_t st, char *why,
                          size_t why_size)
{
    snprintf(why, why_size, "xfer_rkey_pack of the %s's %s buffer: %s%s", side,
             perf_mem_names[perf->buf_mem], xfer_status_string(st),
             (perf->buf_mem == PERF_MEM_CUDA) ?
             ": the peer's put or get cannot reach cuda memory over a transport that does "
             "not move it itself (xfer stages only the initiator's buffer; its log line "
             "says more)" : "");
}

/* "xfer_perf: the SIDE cannot run TEST with SIZE bytes: WHY" */
static void cannot_run(perf_t *perf, const char *side, const char *why)
{
    fprintf(stderr, "xfer_perf: the %s cannot run %s with %" PRIu64 " bytes: %s\n", side,
            perf_tests[perf->p.test].name, perf->p.size, why);
}

/* ---- the clocks ------------------------------------------------------------------------------ */

/* This host's boot id: two processes that share it share CLOCK_MONOTONIC. "" if unknown.
 * Read once: the server answers SYNC_ROUNDS rounds with it. */
static const char *boot_id(void)
{
    static char id[BOOT_ID_LEN + 1];
    static int read_done;
    FILE *f;

    if (!read_done) {
        read_done = 1;
        f = fopen("/proc/sys/kernel/random/boot_id", "r");
        if (f != NULL) {
            if (fgets(id, sizeof(id), f) == NULL || strlen(id) != BOOT_ID_LEN) {
                id[0] = '\0';
            }
            fclose(f);
        }
    }
    return id;
}

/* The server's side of one SYNC round: its clock, as late as possible, and its boot id. */
static int sync_answer(perf_t *perf)
{
    uint8_t out[8 + BOOT_ID_LEN];
    const char *id = boot_id();

    memset(out, 0, sizeof(out));
    memcpy(out + 8, id, strlen(id));
    xfer_put_le64(out, perf_now_ns());
    return ctrl_send(perf, MSG_SYNC, XFER_OK, out, sizeof(out));
}

/*
 * The offset of the server's clock from the client's, as NTP takes it: over SYNC_ROUNDS
 * round trips, the one with the shortest round trip gives offset = t_server - (t_send +
 * t_back) / 2, off by at most half that round trip. When both sides report the same boot id
 * and the estimate is within its error of 0, the two processes read one CLOCK_MONOTONIC and
 * the offset is 0 exactly.
 */
static int clock_sync(perf_t *perf)
{
    uint8_t payload[MSG_MAX + 1], t0b[8];
    const char *id = boot_id();
    char peer_id[BOOT_ID_LEN + 1];
    uint64_t best_rtt = UINT64_MAX, t0, t1;
    int64_t offset = 0;
    xfer_status_t st;
    msg_kind_t kind;
    size_t len;

    for (int i = 0; i < SYNC_ROUNDS; i++) {
        if (ctrl_post(perf) != 0) {
            return -1;
        }
        t0 = perf_now_ns();
        xfer_put_le64(t0b, t0);
        if (ctrl_send(perf, MSG_SYNC, XFER_OK, t0b, sizeof(t0b)) != 0 ||
            ctrl_recv(perf, MSG_SYNC, 0, &kind, &st, payload, &len) != 0) {
            return -1;
        }
        t1 = perf_now_ns();
        if (len != 8 + BOOT_ID_LEN) {
            fprintf(stderr, "xfer_perf: SYNC with %zu bytes, expected %d\n", len,
                    8 + BOOT_ID_LEN);
            return -1;
        }
        if (t1 - t0 < best_rtt) {
            best_rtt = t1 - t0;
            offset = (int64_t)xfer_get_le64(payload) - (int64_t)(t0 + best_rtt / 2);
        }
        memcpy(peer_id, payload + 8, BOOT_ID_LEN);
        peer_id[BOOT_ID_LEN] = '\0';
    }
    perf->clock_error = (int64_t)(best_rtt / 2);
    perf->clock_offset = offset;
    if ((id[0] != '\0') && (strcmp(id, peer_id) == 0) &&
        (llabs(offset) <= perf->clock_error)) {
        perf->clock_offset = 0;
        perf->clock_error = 0;
    }
    perf->clock_synced = 1;
    return 0;
}

/* ---- client ---------------------------------------------------------------------------------- */

/* The bytes of the server's buffer that this size's operations reach: a slot (a message, or a
 * batch test's region) for each operation a bandwidth or batch test keeps in flight, one where
 * those share their slots (perf_slots_shared) and for the other tests. */
static size_t server_bytes(const perf_params_t *p)
{
    size_t slot = perf_tests[p->test].batch ? perf_batch_region(p) : p->size;
    int windowed = (perf_tests[p->test].bw || perf_tests[p->test].batch) &&
                   !perf_slots_shared(p);

    return (windowed ? p->window : 1) * slot;
}

/*
 * One size, the client's side; appends a row to perf->rows. -1: a failure that leaves the
 * session broken (main closes the endpoint); 1: this size did not run or its data did not
 * verify, and the session can end with BYE.
 */
static int client_run_size(perf_t *perf, size_t size, uint32_t batch, uint64_t *step)
{
    const options_t *o = &perf->opts;
    perf_params_t *p = &perf->p;
    uint8_t payload[MSG_MAX + 1];
    uint64_t t_start, elapsed;
    char why[512];
    xfer_status_t st;
    msg_kind_t kind;
    size_t len, blob_len = 0;
    void *blob = NULL;
    int ret;

    perf_params_init(o, size, batch, *step, p);
    *step += p->warmup + p->iters;
    if (o->verbose) {
        fprintf(stderr, "# %s %zu bytes x %u: %" PRIu64 " iterations after %" PRIu64
                " warm-up, window %u\n", perf_tests[p->test].name, size, p->batch, p->iters,
                p->warmup, p->window);
    }
    if (perf_tests[p->test].batch && (p->flags & PARAM_VERIFY) &&
        (perf_batch_region(p) < size * (uint64_t)p->batch)) {
        cannot_run(perf, "client", "-V needs every block of a batch in its own place, and "
                   "a batch larger than 256 MiB wraps around the buffer");
        return 1;
    }
    if (perf_tests[p->test].batch && (p->notify_len > 0) && !perf->clock_synced) {
        if (clock_sync(perf) != 0) {
            return -1;
        }
        perf_print_clock(perf);
    }

    /* this side's buffers, and put_lat's key to them, before the server is asked: what
     * cannot run here ends the session cleanly */
    st = perf_buffers_setup(perf, 1, why, sizeof(why));
    if (st == XFER_OK && p->test == TEST_PUT_LAT) {
        st = xfer_rkey_pack(perf->mem, &blob, &blob_len);
        if (st != XFER_OK) {
            rkey_pack_why(perf, "client", st, why, sizeof(why));
        }
    }
    if (st != XFER_OK) {
        cannot_run(perf, "client", why);
        return 1;
    }

    params_encode(p, payload);
    if (ctrl_post(perf) != 0 ||
        ctrl_send(perf, MSG_PARAMS, XFER_OK, payload, PARAMS_LEN) != 0 ||
        ctrl_recv(perf, MSG_READY, 0, &kind, &st, payload, &len) != 0) {
        xfer_rkey_blob_free(blob);
        return -1;
    }
    if (st != XFER_OK) {
        cannot_run(perf, "server", (char *)payload);
        xfer_rkey_blob_free(blob);
        return -1;
    }
    if (perf_tests[p->test].server_rkey &&
        perf_rkey_take(perf, payload, len,
                       server_bytes(p)) != 0) {
        xfer_rkey_blob_free(blob);
        return -1;
    }
    if (blob != NULL) {
        ret = ctrl_send(perf, MSG_RKEY, XFER_OK, blob, blob_len);
        xfer_rkey_blob_free(blob);
        if (ret != 0) {
            return -1;
        }
    }

    if (perf_test_client_run(perf, &t_start) != 0) {
        return -1;
    }

    /* the final handshake: the clock stops when the server has seen everything */
    if (ctrl_post(perf) != 0 || ctrl_send(perf, MSG_FIN, XFER_OK, NULL, 0) != 0 ||
        ctrl_recv(perf, MSG_ACK, 0, &kind, &st, payload, &len) != 0) {
        return -1;
    }
    elapsed = perf_now_ns() - t_start;
    if (st != XFER_OK) {
        fprintf(stderr, "xfer_perf: the server reports: %s\n", (char *)payload);
        return 1;
    }
    if (perf->verify_error[0] != '\0') {
        fprintf(stderr, "xfer_perf: verification failed: %s\n", perf->verify_error);
        return 1;
    }
    perf_result_compute(perf, elapsed, &perf->rows[perf->nrows]);
    if (perf_batch_stats_decode(payload, len, &perf->rows[perf->nrows]) != 0) {
        return -1;
    }
    if (!o->json) {
        perf_print_row(perf, &perf->rows[perf->nrows]);
    }
    perf->nrows++;
    return 0;
}

int perf_client_run(perf_t *perf)
{
    const options_t *o = &perf->opts;
    char addr[300];
    uint8_t payload[MSG_MAX + 1];
    uint64_t step = 0;
    xfer_status_t st;
    msg_kind_t kind;
    size_t len;
    int failed = 0;

    snprintf(addr, sizeof(addr), strchr(o->host, ':') ? "[%s]:%u" : "%s:%u", o->host, o->port);
    st = xfer_connect(perf->ctx, addr, &perf->ep);
    if (st != XFER_OK) {
        fprintf(stderr, "xfer_perf: cannot connect to %s: %s\n", addr, xfer_status_string(st));
        return -1;
    }
    if (!o->json) {
        perf_print_header(perf, addr);
    }
    for (unsigned i = 0; i < perf->nruns; i++) {
        /* after an error operations may be pending: main() closes the endpoint first */
        failed = client_run_size(perf, perf->runs[i].size, perf->runs[i].batch, &step);
        if (failed < 0) {
            return -1;
        }
        perf_buffers_release(perf);
        perf_buffers_free(perf);
        if (failed) {
            break;
        }
    }
    if (ctrl_post(perf) != 0 || ctrl_send(perf, MSG_BYE, XFER_OK, NULL, 0) != 0 ||
        ctrl_recv(perf, MSG_ACK, 0, &kind, &st, payload, &len) != 0) {
        return -1;
    }
    if (o->json && !failed) {
        perf_print_json(perf, addr);
    }
    perf_counters_print(perf);
    return failed ? -1 : 0;
}

/* ---- server ---------------------------------------------------------------------------------- */

/* One size, the server's side, after PARAMS. 1: the data did not verify (the client knows). */
static int server_run_size(perf_t *perf)
{
    const perf_params_t *p = &perf->p;
    uint8_t payload[MSG_MAX + 1];
    char why[512];
    xfer_status_t st;
    msg_kind_t kind;
    void *blob = NULL;
    size_t len = 0;
    int ret = 0;

    if (perf->opts.verbose) {
        printf("# %s, %" PRIu64 " bytes, %" PRIu64 " + %" PRIu64 " iterations, window %u%s\n",
               perf_tests[p->test].name, p->size, p->warmup, p->iters, p->window,
               (p->flags & PARAM_VERIFY) ? ", verify" : "");
        fflush(stdout);
    }
    /* what this side cannot run is refused in READY, with the reason */
    st = perf_buffers_setup(perf, 0, why, sizeof(why));
    if (st == XFER_OK && perf_tests[p->test].server_rkey) {
        st = xfer_rkey_pack(perf->mem, &blob, &len);
        if (st != XFER_OK) {
            rkey_pack_why(perf, "server", st, why, sizeof(why));
        }
    }
    if (st != XFER_OK) {
        cannot_run(perf, "server", why);
        ctrl_send(perf, MSG_READY, st, why, strlen(why));
        return -1;
    }
    if (!perf->mem_reported) {
        printf("# memory: client %s, server %s%s%s\n", perf_mem_names[p->mem[SIDE_CLIENT]],
               perf_mem_names[p->mem[SIDE_SERVER]],
               (perf->buf_mem == PERF_MEM_CUDA) ? " " : "",
               (perf->buf_mem == PERF_MEM_CUDA) ? perf_cuda_device_name() : "");
        fflush(stdout);
        perf->mem_reported = 1;
    }
    perf_test_server_prepare(perf);
    ret = ctrl_send(perf, MSG_READY, XFER_OK, blob, len);
    if (blob != NULL) {
        xfer_rkey_blob_free(blob);
    }
    if (ret != 0) {
        return -1;
    }
    if (p->test == TEST_PUT_LAT &&
        (ctrl_recv(perf, MSG_RKEY, 0, &kind, &st, payload, &len) != 0 ||
         perf_rkey_take(perf, payload, len, p->size) != 0)) {
        return -1;
    }

    ret = perf_test_server_run(perf);
    if (ret != 0 || ctrl_recv(perf, MSG_FIN, 0, &kind, &st, payload, &len) != 0) {
        return -1;
    }
    perf_test_server_check(perf);
    if (perf->verify_error[0] != '\0') {
        fprintf(stderr, "xfer_perf: verification failed: %s\n", perf->verify_error);
        return ctrl_send(perf, MSG_ACK, XFER_ERR_PROTOCOL, perf->verify_error,
                         strlen(perf->verify_error)) == 0 ? 1 : -1;
    }
    len = perf_batch_stats_encode(perf, payload);
    return ctrl_send(perf, MSG_ACK, XFER_OK, payload, len);
}

/* One client's session. *served_p: it sent valid parameters (or BYE at once), so it is the
 * client this server runs for and whatever happens next is the run's outcome; a failure
 * before that only drops the client. */
static int server_session(perf_t *perf, int *served_p)
{
    uint8_t payload[MSG_MAX + 1];
    xfer_status_t st;
    msg_kind_t kind;
    const char *why;
    size_t len;
    int ret, failed = 0;

    *served_p = 0;
    for (;;) {
        if (ctrl_recv(perf, MSG_PARAMS, (1u << MSG_BYE) | (1u << MSG_SYNC), &kind, &st,
                      payload, &len) != 0) {
            return -1;
        }
        if (kind == MSG_BYE) {
            *served_p = 1;
            break;
        }
        if (kind == MSG_SYNC) {
            if (sync_answer(perf) != 0) {
                return -1;
            }
            continue;
        }
        why = params_decode(payload, len, &perf->p);
        if (why != NULL) {
            fprintf(stderr, "xfer_perf: the client's parameters: %s\n", why);
            ctrl_send(perf, MSG_READY, XFER_ERR_INVALID_PARAM, why, strlen(why));
            return -1;
        }
        *served_p = 1;
        ret = server_run_size(perf);
        if (ret < 0) {
            return -1;  /* operations may be pending: main() closes the endpoint first */
        }
        failed |= ret;
        perf_buffers_release(perf);
        perf_buffers_free(perf);
    }
    if (ctrl_send(perf, MSG_ACK, XFER_OK, NULL, 0) != 0) {
        return -1;
    }
    printf("# done%s\n", failed ? ", the data did not verify" : "");
    perf_counters_print(perf);
    return failed ? -1 : 0;
}

/*
 * Serve one client, then return. A connection that fails its handshake (a port scanner,
 * a peer of another version or with no transport in common) or a client that sends no valid
 * parameters (garbage, or it goes away first) is logged and dropped, and the server waits for
 * the next: a stray connection must not end a benchmark.
 */
int perf_server_run(perf_t *perf)
{
    const options_t *o = &perf->opts;
    char addr[300], peer[96];
    xfer_status_t st;
    int ret, served;

    snprintf(addr, sizeof(addr), strchr(o->bind, ':') ? "[%s]:%u" : "%s:%u", o->bind, o->port);
    st = xfer_listen(perf->ctx, addr, &perf->listener);
    if (st != XFER_OK) {
        fprintf(stderr, "xfer_perf: cannot listen at %s: %s (%s)\n", addr,
                xfer_status_string(st), xfer_last_error());
        return -1;
    }
    printf("# xfer_perf server: listening on port %u\n", xfer_listener_port(perf->listener));
    fflush(stdout);
    for (;;) {
        st = xfer_accept(perf->listener, -1, &perf->ep);
        if (st != XFER_OK) {
            /* the library's log line said who and why */
            fprintf(stderr, "xfer_perf: a connection failed its handshake (%s); waiting for "
                    "the next client\n", xfer_status_string(st));
            if (st == XFER_ERR_NO_RESOURCE || st == XFER_ERR_IO) {
                usleep(100000);     /* the listener itself may lack descriptors: no spinning */
            }
            continue;
        }
        snprintf(peer, sizeof(peer), "%s", xfer_endpoint_peer(perf->ep));
        printf("# client %s connected, transport %s\n", peer,
               xfer_endpoint_transport(perf->ep));
        fflush(stdout);
        ret = server_session(perf, &served);
        if (served) {
            return ret;
        }
        fprintf(stderr, "xfer_perf: client %s sent no valid parameters; waiting for the next "
                "client\n", peer);
        if (perf->ctrl_req != NULL) {
            xfer_request_release(perf->ctrl_req);
            perf->ctrl_req = NULL;
        }
        xfer_endpoint_close(perf->ep);
        perf->ep = NULL;
    }
}
