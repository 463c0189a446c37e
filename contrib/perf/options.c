/*
 * xfer_perf's command line: the usage text, the options, the test table, and the parameters
 * that the options give one message size (the defaults that depend on the test and the size).
 */
#include "perf.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_PORT      18515
#define DEFAULT_MAX_MEM   (1ull << 30)
#define DEFAULT_WINDOW    16

const char *const perf_mem_names[PERF_MEM_LAST] = {
    [PERF_MEM_HOST] = "host",
    [PERF_MEM_CUDA] = "cuda",
    [PERF_MEM_XFER] = "xfer",
};

const perf_test_info_t perf_tests[TEST_LAST] = {
    [TEST_PUT_BW]     = {"put_bw",     1, 1, 0},
    [TEST_GET_BW]     = {"get_bw",     1, 1, 0},
    [TEST_TAG_BW]     = {"tag_bw",     1, 0, 0},
    [TEST_TENSOR_BW]  = {"tensor_bw",  1, 0, 0},
    [TEST_PUT_LAT]    = {"put_lat",    0, 1, 0},
    [TEST_TAG_LAT]    = {"tag_lat",    0, 0, 0},
    [TEST_TENSOR_LAT] = {"tensor_lat", 0, 0, 0},
    [TEST_BATCH_PUT]  = {"batch_put",  0, 1, 1},
    [TEST_BATCH_GET]  = {"batch_get",  0, 1, 1},
};

#define BATCH_SWEEP_BLOCK_MIN  (4ull << 10)
#define BATCH_SWEEP_BLOCK_MAX  (64ull << 20)

static void usage(FILE *f)
{
    fprintf(f,
            "Usage: xfer_perf [options]         run the server (serves one client; skips\n"
            "                                   connections that fail the handshake or send\n"
            "                                   no valid parameters)\n"
            "       xfer_perf [options] HOST    run a test against the server on HOST\n"
            "Bandwidth and latency of xfer between two processes, like ib_write_bw and "
            "ucx_perftest.\n"
            "\n"
            "  -p, --port PORT        TCP port of the server (default %d)\n"
            "      --bind HOST        server: listen at HOST only (default \"*\", every\n"
            "                         interface; \"\" is loopback, as xfer_listen's \":port\")\n"
            "      --max-mem BYTES    server: the most memory one client's parameters may make\n"
            "                         it allocate (default 1g; k, m, g suffixes); beyond it\n"
            "                         the server refuses them and tells the client why\n"
            "  -t, --test TEST        put_bw, get_bw, tag_bw (default), tensor_bw,\n"
            "                         put_lat, tag_lat, tensor_lat, batch_put, batch_get\n"
            "  -s, --size BYTES       message size, a batch test's block size; k, m, g\n"
            "                         suffixes are powers of 1024 (default 65536)\n"
            "  -a, --all              sweep the sizes 1, 2, 4, ... 8m; batch tests: the block\n"
            "                         sizes 4k, 16k, ... 64m times the batch lengths 1, 4, ...\n"
            "                         1024, up to 256 MiB a batch (-s or -b fixes one of them)\n"
            "  -b, --batch N          batch tests: descriptors per batch, 1 to %d (default 1)\n"
            "      --notify BYTES     batch tests: each batch carries a notification of BYTES\n"
            "                         (%d to %d; default %d; 0: none) that the server takes\n"
            "                         and times\n"
            "  -n, --iters N          timed iterations (default: depends on test and size)\n"
            "      --warmup N         untimed iterations first (default: a tenth, at most 1000)\n"
            "  -w, --window N         operations in flight in bandwidth tests (default %d; the\n"
            "                         window shrinks so that it holds at most 256 MiB); batches\n"
            "                         in flight in batch tests (default 1)\n"
            "  -x, --transports LIST  set XFER_TRANSPORTS=LIST in this process (e.g. tcp)\n"
            "  -m, --mem TYPE[,TYPE]  where the buffers live: host (default: posix_memalign,\n"
            "                         then xfer_mem_register), xfer (host memory from\n"
            "                         xfer_mem_alloc, as ucx_perftest's from ucp_mem_map: a\n"
            "                         same-host peer maps it and puts/gets with memcpy) or\n"
            "                         cuda (CUDA device memory, cuMemAlloc); one TYPE for both\n"
            "                         sides, or the client's (local) then the server's\n"
            "                         (remote), like ucx_perftest -m. Over a transport\n"
            "                         without MEM_CUDA xfer\n"
            "                         stages cuda memory through host memory, except the\n"
            "                         target of a put or get (the server's buffer in put_bw,\n"
            "                         get_bw, put_lat; the client's too in put_lat): xfer_perf\n"
            "                         refuses that, saying why. The driver is loaded with\n"
            "                         dlopen: XFER_CUDA_LIB, else libcuda.so.1\n"
            "      --cuda-device N    this side's GPU for cuda buffers (default 0); each side\n"
            "                         takes its own\n"
            "  -T, --thread-mode MODE serialized (default: one thread, the context takes no\n"
            "                         lock, as ucx_perftest's default) or multi (the lock a\n"
            "                         threaded application pays; needed with\n"
            "                         XFER_PROGRESS_THREAD=y)\n"
            "  -E, --wait-mode MODE   poll (default: every wait spins on xfer_request_test,\n"
            "                         as ucx_perftest's default) or sleep (xfer_request_wait,\n"
            "                         sleeping on the transports' file descriptors); this\n"
            "                         side's own choice. put_lat can only poll\n"
            "  -V, --verify           fill buffers with a pattern and check it where it lands;\n"
            "                         bandwidth tests then give each operation in flight its\n"
            "                         own buffer (without -V they share one, as ucx_perftest's\n"
            "                         and ib_write_bw's do)\n"
            "  -j, --json             print the results as one JSON object\n"
            "  -v, --verbose          say more, and print the endpoint's counters at the end\n"
            "  -h, --help             this text\n"
            "\n"
            "Columns: BW average[MB/s] (MB = 10^6 bytes), MsgRate[Mpps], t_typical (median),\n"
            "t_avg and t_99%% in usec: bandwidth tests time completions with WINDOW in flight;\n"
            "tag_lat and put_lat report half a round trip, tensor_lat one whole fetch.\n"
            "Batch tests: BW counts the blocks' bytes; post[usec/desc] is the time inside\n"
            "xfer_batch_post per descriptor; t_* is one batch from its post to its completion\n"
            "(the data in the destination's memory); notify_* from the client's post to the\n"
            "notification taken at the server (the clocks aligned as NTP does; exact on one\n"
            "host).\n"
            "Only the client's -t -s -a -b -n -w -V -m --notify matter: it sends them to the\n"
            "server, as ucx_perftest's client sends its parameters (the server's own are\n"
            "ignored).\n",
            DEFAULT_PORT, MAX_BATCH, NOTIFY_MIN, NOTIFY_MAX, NOTIFY_MIN, DEFAULT_WINDOW);
}

static int parse_u64(const char *s, uint64_t max, int suffix, uint64_t *v_p)
{
    char *end;
    unsigned long long v;
    uint64_t mul = 1;

    if (*s == '\0' || *s == '-') {
        return -1;
    }
    v = strtoull(s, &end, 10);
    if (suffix && *end != '\0' && end[1] == '\0') {
        switch (*end) {
        case 'k': case 'K': mul = 1ull << 10; end++; break;
        case 'm': case 'M': mul = 1ull << 20; end++; break;
        case 'g': case 'G': mul = 1ull << 30; end++; break;
        default: break;
        }
    }
    if (end == s || *end != '\0' || v > max / mul) {
        return -1;
    }
    *v_p = v * mul;
    return 0;
}

static int parse_mem_type(const char *s, size_t len, perf_mem_t *mem_p)
{
    for (int m = 0; m < PERF_MEM_LAST; m++) {
        if ((strlen(perf_mem_names[m]) == len) && (strncmp(s, perf_mem_names[m], len) == 0)) {
            *mem_p = (perf_mem_t)m;
            return 0;
        }
    }
    return -1;
}

/* -m TYPE (both sides) or -m CLIENT,SERVER */
static int parse_mem(const char *s, perf_mem_t mem[2])
{
    const char *comma = strchr(s, ',');
    perf_mem_t m[2];

    if (comma == NULL) {
        if (parse_mem_type(s, strlen(s), &m[0]) != 0) {
            return -1;
        }
        m[1] = m[0];
    } else if ((parse_mem_type(s, (size_t)(comma - s), &m[0]) != 0) ||
               (parse_mem_type(comma + 1, strlen(comma + 1), &m[1]) != 0)) {
        return -1;
    }
    mem[SIDE_CLIENT] = m[0];
    mem[SIDE_SERVER] = m[1];
    return 0;
}

/* 0, or 2 on a usage error (the message printed); -h prints the usage and exits 0. */
int perf_options_parse(int argc, char **argv, options_t *o)
{
    static const struct option long_opts[] = {
        {"port",       required_argument, NULL, 'p'},
        {"bind",       required_argument, NULL, 'B'},
        {"max-mem",    required_argument, NULL, 'M'},
        {"test",       required_argument, NULL, 't'},
        {"size",       required_argument, NULL, 's'},
        {"all",        no_argument,       NULL, 'a'},
        {"iters",      required_argument, NULL, 'n'},
        {"warmup",     required_argument, NULL, 'W'},
        {"window",     required_argument, NULL, 'w'},
        {"batch",      required_argument, NULL, 'b'},
        {"notify",     required_argument, NULL, 'N'},
        {"transports", required_argument, NULL, 'x'},
        {"mem",        required_argument, NULL, 'm'},
        {"cuda-device", required_argument, NULL, 'D'},
        {"thread-mode", required_argument, NULL, 'T'},
        {"wait-mode",  required_argument, NULL, 'E'},
        {"verify",     no_argument,       NULL, 'V'},
        {"json",       no_argument,       NULL, 'j'},
        {"verbose",    no_argument,       NULL, 'v'},
        {"help",       no_argument,       NULL, 'h'},
        {NULL, 0, NULL, 0}
    };
    uint64_t v;
    int c, window_given = 0;

    *o = (options_t){.port = DEFAULT_PORT, .bind = "*", .max_mem = DEFAULT_MAX_MEM,
                     .test = TEST_TAG_BW, .size = 65536, .warmup = -1,
                     .window = DEFAULT_WINDOW, .notify_len = NOTIFY_MIN};
    while ((c = getopt_long(argc, argv, "p:t:s:ab:n:w:x:m:T:E:Vjvh", long_opts, NULL)) != -1) {
        switch (c) {
        case 'p':
            if (parse_u64(optarg, 65535, 0, &v) != 0) {
                fprintf(stderr, "xfer_perf: -p: '%s' is not a port number\n", optarg);
                return 2;
            }
            o->port = (unsigned)v;
            break;
        case 'B':
            o->bind = optarg;
            break;
        case 'M':
            if (parse_u64(optarg, UINT64_MAX >> 1, 1, &v) != 0) {
                fprintf(stderr, "xfer_perf: --max-mem: '%s' is not a size\n", optarg);
                return 2;
            }
            o->max_mem = (size_t)v;
            break;
        case 't':
            for (o->test = 0; o->test < TEST_LAST; o->test++) {
                if (strcmp(optarg, perf_tests[o->test].name) == 0) {
                    break;
                }
            }
            if (o->test == TEST_LAST) {
                fprintf(stderr, "xfer_perf: -t: unknown test '%s' (put_bw, get_bw, tag_bw, "
                        "tensor_bw, put_lat, tag_lat, tensor_lat, batch_put, batch_get)\n",
                        optarg);
                return 2;
            }
            break;
        case 's':
            if (parse_u64(optarg, MAX_SIZE, 1, &v) != 0 || v == 0) {
                fprintf(stderr, "xfer_perf: -s: '%s' is not a size from 1 to 1g\n", optarg);
                return 2;
            }
            o->size = v;
            o->size_given = 1;
            break;
        case 'a': o->sweep = 1; break;
        case 'b':
            if (parse_u64(optarg, MAX_BATCH, 0, &v) != 0 || v == 0) {
                fprintf(stderr, "xfer_perf: -b: '%s' is not a batch length from 1 to %d\n",
                        optarg, MAX_BATCH);
                return 2;
            }
            o->batch = (unsigned)v;
            break;
        case 'N':
            if (parse_u64(optarg, NOTIFY_MAX, 0, &v) != 0 || (v != 0 && v < NOTIFY_MIN)) {
                fprintf(stderr, "xfer_perf: --notify: '%s' is not 0 or a length from %d to "
                        "%d\n", optarg, NOTIFY_MIN, NOTIFY_MAX);
                return 2;
            }
            o->notify_len = (unsigned)v;
            break;
        case 'n':
            if (parse_u64(optarg, 1ull << 32, 0, &v) != 0 || v == 0) {
                fprintf(stderr, "xfer_perf: -n: '%s' is not a count from 1 to 2^32\n", optarg);
                return 2;
            }
            o->iters = v;
            break;
        case 'W':
            if (parse_u64(optarg, 1ull << 32, 0, &v) != 0) {
                fprintf(stderr, "xfer_perf: --warmup: '%s' is not a count\n", optarg);
                return 2;
            }
            o->warmup = (int64_t)v;
            break;
        case 'w':
            if (parse_u64(optarg, MAX_WINDOW, 0, &v) != 0 || v == 0) {
                fprintf(stderr, "xfer_perf: -w: '%s' is not a window from 1 to %d\n", optarg,
                        MAX_WINDOW);
                return 2;
            }
            o->window = (unsigned)v;
            window_given = 1;
            break;
        case 'x': o->transports = optarg; break;
        case 'm':
            if (parse_mem(optarg, o->mem) != 0) {
                fprintf(stderr, "xfer_perf: -m: '%s' is not TYPE or TYPE,TYPE with each TYPE "
                        "host, xfer or cuda\n", optarg);
                return 2;
            }
            break;
        case 'D':
            if (parse_u64(optarg, 1023, 0, &v) != 0) {
                fprintf(stderr, "xfer_perf: --cuda-device: '%s' is not a device number\n",
                        optarg);
                return 2;
            }
            o->cuda_device = (int)v;
            break;
        case 'T':
            if ((strcmp(optarg, "serialized") != 0) && (strcmp(optarg, "multi") != 0)) {
                fprintf(stderr, "xfer_perf: -T: '%s' is not serialized or multi\n", optarg);
                return 2;
            }
            o->multi = (strcmp(optarg, "multi") == 0);
            break;
        case 'E':
            if ((strcmp(optarg, "poll") != 0) && (strcmp(optarg, "sleep") != 0)) {
                fprintf(stderr, "xfer_perf: -E: '%s' is not poll or sleep\n", optarg);
                return 2;
            }
            o->sleep = (strcmp(optarg, "sleep") == 0);
            break;
        case 'V': o->verify = 1; break;
        case 'j': o->json = 1; break;
        case 'v': o->verbose = 1; break;
        case 'h': usage(stdout); exit(0);
        default:  usage(stderr); return 2;
        }
    }
    if (optind + 1 < argc) {
        fprintf(stderr, "xfer_perf: unexpected argument '%s'\n", argv[optind + 1]);
        return 2;
    }
    if (o->sleep && (o->test == TEST_PUT_LAT)) {
        fprintf(stderr, "xfer_perf: -E sleep: put_lat watches its buffer for the peer's put, "
                "which no event announces; it can only poll\n");
        return 2;
    }
    if (perf_tests[o->test].batch) {
        if (o->sweep && o->size_given && o->batch) {
            fprintf(stderr, "xfer_perf: -a sweeps the block size or the batch length: not "
                    "with both -s and -b\n");
            return 2;
        }
        if (!window_given) {
            o->window = 1;  /* one batch at a time, as a KV-cache mover waits for a layer */
        }
    } else {
        if (o->sweep && o->size_given) {
            fprintf(stderr, "xfer_perf: -a and -s exclude each other\n");
            return 2;
        }
        if (o->batch > 1) {
            fprintf(stderr, "xfer_perf: -b: %s is not a batch test (batch_put, batch_get)\n",
                    perf_tests[o->test].name);
            return 2;
        }
        o->notify_len = 0;
    }
    o->host = (optind < argc) ? argv[optind] : NULL;
    return 0;
}

void perf_runs_plan(const options_t *o, perf_run_t *runs, unsigned *nruns_p)
{
    unsigned n = 0;

    if (!perf_tests[o->test].batch) {
        for (size_t size = o->sweep ? 1 : o->size; size <= (o->sweep ? SWEEP_MAX : o->size);
             size *= 2) {
            runs[n++] = (perf_run_t){size, 1};
        }
    } else if (!o->sweep) {
        runs[n++] = (perf_run_t){o->size, o->batch ? o->batch : 1};
    } else {
        /* 8 block sizes x 6 lengths at most: within MAX_ROWS */
        for (uint64_t size = o->size_given ? o->size : BATCH_SWEEP_BLOCK_MIN;
             size <= (o->size_given ? o->size : BATCH_SWEEP_BLOCK_MAX); size *= 4) {
            for (uint32_t b = o->batch ? o->batch : 1; b <= (o->batch ? o->batch : MAX_BATCH);
                 b *= 4) {
                if (size * b <= BATCH_SWEEP_BYTES || (o->size_given || o->batch)) {
                    runs[n++] = (perf_run_t){(size_t)size, b};
                }
            }
        }
    }
    *nruns_p = n;
}

static uint64_t default_iters(test_t t, size_t size)
{
    uint64_t n = (perf_tests[t].bw ? (1ull << 30) : (256ull << 20)) / size;
    uint64_t lo = perf_tests[t].bw ? 200 : 100, hi = perf_tests[t].bw ? 100000 : 20000;

    return (n < lo) ? lo : (n > hi) ? hi : n;
}

/* A batch row moves about 1 GiB: between 10 and 20000 batches. */
static uint64_t batch_iters(size_t size, uint32_t batch)
{
    uint64_t n = (1ull << 30) / ((uint64_t)size * batch);

    return (n < 10) ? 10 : (n > 20000) ? 20000 : n;
}

/*
 * The client's parameters for one size: the window shrinks so that it holds at most
 * WINDOW_BYTES_MAX, and -n and --warmup left out get defaults for the test and the size.
 */
void perf_params_init(const options_t *o, size_t size, uint32_t batch, uint64_t step_base,
                      perf_params_t *p)
{
    memset(p, 0, sizeof(*p));
    p->batch = batch;
    p->notify_len = o->notify_len;
    p->test = o->test;
    p->flags = o->verify ? PARAM_VERIFY : 0;
    p->size = size;
    p->window = o->window;
    p->mem[SIDE_CLIENT] = (uint8_t)o->mem[SIDE_CLIENT];
    p->mem[SIDE_SERVER] = (uint8_t)o->mem[SIDE_SERVER];
    if (perf_tests[o->test].bw && (uint64_t)p->window * size > WINDOW_BYTES_MAX) {
        p->window = (size >= WINDOW_BYTES_MAX) ? 1 : (uint32_t)(WINDOW_BYTES_MAX / size);
    }
    if (perf_tests[o->test].batch) {
        uint64_t region = perf_batch_region(p);

        if ((uint64_t)p->window * region > WINDOW_BYTES_MAX) {
            p->window = (region >= WINDOW_BYTES_MAX) ? 1 : (uint32_t)(WINDOW_BYTES_MAX / region);
        }
    }
    p->iters = o->iters ? o->iters : perf_tests[o->test].batch ?
               batch_iters(size, batch) : default_iters(o->test, size);
    p->warmup = (o->warmup >= 0) ? (uint64_t)o->warmup :
                (p->iters / 10 > 1000) ? 1000 : (p->iters / 10 ? p->iters / 10 : 1);
    p->step_base = step_base;
}
