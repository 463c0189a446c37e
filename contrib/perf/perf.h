/*
 * xfer_perf's shared types and the functions its parts give each other:
 *   options.c   the command line, the test table, the parameters of one size
 *   control.c   the control protocol: connection, PARAMS / READY / RKEY / FIN / ACK / BYE
 *   tests.c     the test loops, the operations in flight and their clock
 *   batch.c     the batch tests: descriptor lists posted whole, notifications at the target
 *   buffers.c   the resources of one size, the data pattern of -V, the slots' bytes
 *   cuda_mem.c  CUDA device memory (-m cuda): the driver loaded with dlopen
 *   report.c    what is printed: the table, JSON, -v counters, error lines
 *   main.c      the context, the side to run, the cleanup
 */
#ifndef XFER_PERF_H
#define XFER_PERF_H

#include <xfer/xfer.h>

#include <stddef.h>
#include <stdint.h>

#define MAX_WINDOW        1024
#define MAX_SIZE          (1ull << 30)
#define SWEEP_MAX         (8ull << 20)
#define WINDOW_BYTES_MAX  (256ull << 20)    /* per side: the window shrinks for large sizes */
#define TIMEOUT_MS        60000             /* the longest wait for one operation or message */
#define TENSOR_LAT_DEPTH  2                 /* tensor_lat: publishes the server keeps ahead */
#define MAX_ROWS          64
#define MSG_MAX           4096              /* the largest control message (control.c) */
#define PARAM_VERIFY      (1u << 0)         /* perf_params_t.flags: -V */
#define MAX_BATCH         1024              /* -b: descriptors per batch */
#define BATCH_SWEEP_BYTES (256ull << 20)    /* -a: the largest batch swept (block x length) */
#define NOTIFY_MIN        16                /* a notification carries iteration and post time */
#define NOTIFY_MAX        4096              /* XFER_NOTIFY_MAX_LEN's default */

/* Tags: control messages on one tag (so they match in order), data on their own. */
#define TAG_CTRL   0x7866706300000000ull    /* "xfpc" */
#define TAG_DATA   0x7866706400000000ull    /* "xfpd" | iteration (tag_bw) */
#define TAG_PING   0x7866706900000000ull
#define TAG_PONG   0x7866706f00000000ull
#define TAG_SEEN   0x7866707300000000ull    /* | iteration: batch_put -V, checked at the target */
#define TAG_FULL   UINT64_MAX

typedef enum {
    TEST_PUT_BW, TEST_GET_BW, TEST_TAG_BW, TEST_TENSOR_BW,
    TEST_PUT_LAT, TEST_TAG_LAT, TEST_TENSOR_LAT,
    TEST_BATCH_PUT, TEST_BATCH_GET,
    TEST_LAST
} test_t;

/* Where a side's buffers live (-m); the values travel in PARAMS. */
typedef enum {
    PERF_MEM_HOST = 0,
    PERF_MEM_CUDA = 1,
    PERF_MEM_XFER = 2,      /* host memory from xfer_mem_alloc() */
    PERF_MEM_LAST
} perf_mem_t;

/* The two sides, as -m names them: the client's buffers are local, the server's remote. */
enum { SIDE_CLIENT = 0, SIDE_SERVER = 1 };

extern const char *const perf_mem_names[PERF_MEM_LAST];

typedef struct perf_test_info {
    const char *name;
    int        bw;          /* WINDOW operations in flight; else a ping-pong */
    int        server_rkey; /* the server sends the client an rkey of its buffer */
    int        batch;       /* a batch test (batch.c): window batches of -b blocks in flight */
} perf_test_info_t;

extern const perf_test_info_t perf_tests[TEST_LAST];

typedef struct options {
    const char *host;       /* NULL: server */
    unsigned   port;
    const char *bind;       /* server: the host part of the address it listens at */
    size_t     max_mem;     /* server: the most a client's parameters may make it allocate */
    test_t     test;
    size_t     size;
    int        sweep;
    int        size_given;  /* -s: a batch sweep (-a) keeps the block size */
    unsigned   batch;       /* -b: descriptors per batch; 0: not given (1, or swept) */
    unsigned   notify_len;  /* --notify: bytes of each batch's notification; 0: none */
    uint64_t   iters;       /* 0: a default for the size */
    int64_t    warmup;      /* -1: a default for the iterations */
    unsigned   window;
    const char *transports;
    int        verify;
    int        json;
    int        verbose;
    int        multi;       /* -T multi: the context's lock, as a threaded application has */
    int        sleep;       /* -E sleep: latency loops wait sleeping, not spinning */
    perf_mem_t mem[2];      /* -m: [SIDE_CLIENT], [SIDE_SERVER] */
    int        cuda_device; /* --cuda-device: this process's GPU for cuda buffers */
} options_t;

/* The parameters of one size: the client sends them in PARAMS (control.c). */
typedef struct perf_params {
    uint32_t test;
    uint32_t flags;
    uint32_t window;
    uint8_t  mem[2];        /* perf_mem_t of [SIDE_CLIENT], [SIDE_SERVER] */
    uint64_t size;
    uint64_t iters;
    uint64_t warmup;
    uint64_t step_base;     /* tensor tests: first step of this size */
    uint32_t batch;         /* batch tests: descriptors per batch (else 1) */
    uint32_t notify_len;    /* batch tests: notification bytes, 0 or NOTIFY_MIN.. */
} perf_params_t;

/* One operation in flight. */
typedef struct op_slot {
    xfer_request_t *req;
    xfer_status_t  status;
    int            done;
    uint64_t       t_done;  /* ns, set by the completion callback; 0 until known */
    uint64_t       t_post;  /* ns, batch tests: when the post was called */
} op_slot_t;

typedef struct result {
    uint64_t bytes;
    uint64_t iters;
    unsigned window;
    double   bw_mbps;
    double   mpps;
    double   t_typical;
    double   t_avg;
    double   elapsed_usec;  /* the timed phase, from the first post to the server's ACK */
    double   loop_usec;     /* latency tests: the timed iterations alone (0 for the others) */
    double   t_99;
    /* batch tests */
    uint32_t batch;         /* descriptors per batch; bytes is the block size */
    double   post_usec;     /* time in xfer_batch_post per descriptor */
    int      has_notify;
    double   notify_avg;    /* post at the initiator to the notification at the target, usec */
    double   notify_99;
} result_t;

/* One row to run: a message size, or a batch test's block size and batch length. */
typedef struct perf_run {
    size_t   size;
    uint32_t batch;
} perf_run_t;

typedef struct perf {
    options_t       opts;
    perf_run_t      runs[MAX_ROWS];     /* what the client runs, in order (options.c) */
    unsigned        nruns;
    xfer_context_t  *ctx;
    xfer_listener_t *listener;
    xfer_endpoint_t *ep;
    perf_params_t   p;              /* the size being run */
    /* resources of one size; perf_buffers_release() undoes them */
    uint8_t         *buf;           /* slots of p.size bytes */
    size_t          nslots;
    size_t          slot_stride;    /* p.size, or 0: every slot is the same buffer */
    perf_mem_t      buf_mem;        /* where buf lives */
    uint8_t         *scratch;       /* cuda buffers: a host copy of one slot (buffers.c) */
    xfer_mem_t      *mem;
    xfer_rkey_t     *rkey;          /* the peer's buffer */
    op_slot_t       *ops;
    double          *samples;       /* client: one per timed iteration, usec */
    char            verify_error[256];
    int             mem_reported;   /* the server printed the memory types */
    /* batch tests (batch.c) */
    xfer_batch_t    **batches;      /* one prepared list per window slot */
    int64_t         clock_offset;   /* ns: the server's clock minus the client's */
    int64_t         clock_error;    /* ns: how far off clock_offset may be */
    int             clock_synced;   /* the client has estimated the offset (control.c) */
    uint64_t        notified;       /* server: notifications taken this size */
    uint64_t        notify_sum_ns;  /* server: their latencies */
    int64_t         *notify_ns;     /* server: one latency per timed iteration */
    xfer_status_t   notify_error;   /* server: a notification that made no sense */
    xfer_request_t  **seen;         /* client, batch_put -V: the server's SEEN per slot */
    uint64_t        loop_ns;        /* client, latency tests: the timed iterations' wall time */
    uint64_t        post_ns_sum;    /* client: time inside xfer_batch_post, timed posts */
    uint8_t         ctrl_buf[MSG_MAX];  /* the next control message lands here */
    xfer_request_t  *ctrl_req;          /* its receive, when posted ahead */
    result_t        rows[MAX_ROWS];
    unsigned        nrows;
} perf_t;

/* Slot `slot` of this size's buffer, and of the peer's (through perf->rkey). A cuda slot is
 * a device address: its bytes are reached through the perf_slot_* functions (buffers.c). */
static inline uint8_t *perf_slot_buf(perf_t *perf, size_t slot)
{
    return perf->buf + slot * perf->slot_stride;
}

static inline uint64_t perf_rkey_slot_addr(perf_t *perf, size_t slot)
{
    return xfer_rkey_address(perf->rkey) + slot * perf->slot_stride;
}

/* Bytes between the starts of two window slots of a batch test: a batch's blocks, end to
 * end, capped so that a side's buffer holds at most WINDOW_BYTES_MAX (the blocks of a larger
 * batch wrap around it, except with -V). */
size_t perf_batch_region(const perf_params_t *p);

/* The bytes of one slot: a message, or a batch test's region. */
static inline size_t perf_slot_bytes(const perf_t *perf)
{
    return perf_tests[perf->p.test].batch ? perf_batch_region(&perf->p) : perf->p.size;
}

/* Bandwidth and batch tests without -V keep every operation in flight on one buffer (a
 * batch test: one region), as ucx_perftest and ib_write_bw do, so that both tools touch the
 * same memory and a window of batches touches as much as a window of puts of their size;
 * -V needs a slot each. */
static inline int perf_slots_shared(const perf_params_t *p)
{
    return (perf_tests[p->test].bw || perf_tests[p->test].batch) && !(p->flags & PARAM_VERIFY);
}

/* options.c */
int  perf_options_parse(int argc, char **argv, options_t *o);
/* The rows the client runs: one size, the sizes of -a, or a batch test's sweep. */
void perf_runs_plan(const options_t *o, perf_run_t *runs, unsigned *nruns_p);
void perf_params_init(const options_t *o, size_t size, uint32_t batch, uint64_t step_base,
                      perf_params_t *p);

/* control.c */
int perf_client_run(perf_t *perf);
int perf_server_run(perf_t *perf);

/* clock.c */
uint64_t      perf_now_ns(void);
/* The latency loops' clock: TSC ticks where invariant (else ns), made ns after the loop. */
typedef struct perf_lat_clock {
    int      tsc;
    uint64_t ns0, ticks0;
    uint64_t timed_ns0;     /* perf_now_ns() where the timed iterations began */
    double   ns_tick;
    double   ns_tick_cal;   /* measured over 2 ms at start, against which the loop's is checked */
} perf_lat_clock_t;
void          perf_lat_clock_start(perf_lat_clock_t *c);
/* The warm-up is over: the timed iterations begin (start's time until this is called). */
void          perf_lat_clock_timed(perf_lat_clock_t *c);
uint64_t      perf_lat_clock_now(const perf_lat_clock_t *c);
/* At the loop's end: scale n samples taken in ticks to ns, by both clocks' advance since
 * start; returns the timed iterations' wall time in ns (perf_t.loop_ns). */
uint64_t      perf_lat_clock_scale(perf_lat_clock_t *c, double *samples, size_t n);

/* tests.c */
void          perf_op_cb(xfer_request_t *req, xfer_status_t status, void *arg);
int           perf_op_posted(op_slot_t *op, xfer_status_t st, const char *what);
void          perf_op_reset(op_slot_t *op);
xfer_status_t perf_op_wait(perf_t *perf, op_slot_t *op);
void          perf_op_release(op_slot_t *op);
int           perf_remote_flush(perf_t *perf);
xfer_status_t perf_request_wait(xfer_request_t *req);
/* Wait for req as -E says: spinning on xfer_request_test (poll) or sleeping (sleep). */
xfer_status_t perf_wait(perf_t *perf, xfer_request_t *req);
int           perf_test_client_run(perf_t *perf, uint64_t *t_start_p);
void          perf_test_server_prepare(perf_t *perf);
int           perf_test_server_run(perf_t *perf);
void          perf_test_server_check(perf_t *perf);

/* batch.c */
int  perf_batch_client_run(perf_t *perf, uint64_t *t_start_p);
int  perf_batch_server_run(perf_t *perf);
void perf_batch_server_prepare(perf_t *perf);
/* The server's notification figures for ACK, and the client's reading of them. */
size_t perf_batch_stats_encode(perf_t *perf, uint8_t *out);
int    perf_batch_stats_decode(const uint8_t *in, size_t len, result_t *r);
void   perf_batch_release(perf_t *perf);

/* buffers.c */
/* What one size's parameters make a side allocate: buffers, requests, samples. */
size_t   perf_buffers_bytes(const perf_params_t *p, int client);
/* Allocate and register them; the server refuses more than --max-mem. */
xfer_status_t perf_buffers_setup(perf_t *perf, int client, char *why, size_t why_size);
void     perf_buffers_release_requests(perf_t *perf);
void     perf_buffers_release(perf_t *perf);
void     perf_buffers_free(perf_t *perf);
int      perf_rkey_take(perf_t *perf, const uint8_t *blob, size_t len, size_t bytes);
void     perf_verify_fail(perf_t *perf, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void     perf_slot_fill(perf_t *perf, size_t slot, size_t len, uint64_t seed, uint64_t iter);
void     perf_slot_check(perf_t *perf, size_t slot, size_t len, uint64_t seed, uint64_t iter,
                         const char *what);
void     perf_range_fill(perf_t *perf, size_t off, size_t len, uint64_t seed, uint64_t iter);
void     perf_range_check(perf_t *perf, size_t off, size_t len, uint64_t seed, uint64_t iter,
                          const char *what);
void     perf_slot_zero(perf_t *perf, size_t slot);
int      perf_slot_byte_set(perf_t *perf, size_t slot, size_t off, uint8_t value);
int      perf_slot_byte_get(perf_t *perf, size_t slot, size_t off, uint8_t *value_p);

/* cuda_mem.c: 0, or -1 with the reason in why (open) or on stderr (the rest) */
int         perf_cuda_open(int device, char *why, size_t why_size);
void        perf_cuda_close(void);
const char  *perf_cuda_device_name(void);
int         perf_cuda_alloc(size_t size, void **ptr_p, char *why, size_t why_size);
void        perf_cuda_free(void *ptr);
int         perf_cuda_memset(void *dst, uint8_t value, size_t len);
int         perf_cuda_to_host(void *dst, const void *src, size_t len);
int         perf_cuda_from_host(void *dst, const void *src, size_t len);

/* report.c */
int  perf_fail(const char *what, xfer_status_t status);
void perf_result_compute(perf_t *perf, uint64_t elapsed_ns, result_t *r);
void perf_print_header(perf_t *perf, const char *addr);
void perf_print_row(perf_t *perf, const result_t *r);
void perf_print_clock(perf_t *perf);
void perf_print_json(perf_t *perf, const char *addr);
void perf_counters_print(perf_t *perf);

#endif
