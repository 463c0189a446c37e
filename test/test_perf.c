/*
 * xfer_perf with CUDA buffers (-m), run as two processes over tcp on loopback: the server
 * and the client are the real tool, the CUDA driver is test/plugins/fake_cuda.c through
 * XFER_CUDA_LIB - a stand-in for the GPU alone, whose device memory no CPU access reaches
 * (PROT_NONE): a tool that filled, checked or polled a cuda buffer through its pointer
 * instead of through the driver would crash, and one that registered it as host memory
 * would be refused by xfer.
 *
 * - put_bw and get_bw from cuda memory to host memory move through xfer's staging pipeline
 *   with -V (the pattern written through the driver, checked on the far side and, for get,
 *   read back through the driver), at every size of -a and at sizes across several chunks;
 * - what xfer does not stage over tcp - tags and tensors of cuda memory, a peer's put or get
 *   into cuda memory, a publish of cuda memory - is refused by the side concerned before
 *   the test starts, with the reason, and both processes end;
 * - without a driver (a missing library, one that is not a CUDA driver, a device it does
 *   not have) -m cuda fails with one line that says what was tried and why.
 * Also contrib/bench/gpu_attrs, which bench_gpu.sh runs, over the same stand-in driver.
 * And the batch tests (batch_put, batch_get; contrib/perf/batch.c) in host memory: prepared
 * lists posted again and again with -V, the server checking each put batch's blocks when
 * its notification comes, notifications timed and in order, the sweep's rows, and the
 * options they refuse.
 */
#include "test_util.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

TestSuite(perf, .timeout = 240);

typedef struct perf_server {
    FILE     *out;
    unsigned port;
    char     errpath[256];
} perf_server_t;

typedef struct perf_run {
    int  client_rc;
    char *client_out;       /* stdout and stderr */
    int  server_rc;
    char *server_out;       /* stdout */
    char *server_err;
} perf_run_t;

static const char *build_dir(void)
{
    const char *build = getenv("XFERTEST_BUILD_DIR");

    cr_assert_not_null(build, "XFERTEST_BUILD_DIR is not set: run the tests with 'make check'");
    return build;
}

/* The stand-in driver library, for XFER_CUDA_LIB. */
static const char *fake_cuda(void)
{
    static char path[1024];
    const char *dir = getenv("XFERTEST_PLUGIN_DIR");

    cr_assert_not_null(dir, "XFERTEST_PLUGIN_DIR is not set");
    snprintf(path, sizeof(path), "%s/fakecuda.so", dir);
    cr_assert_eq(access(path, R_OK), 0, "%s is missing", path);
    return path;
}

/* The transport the runs use: XFERTEST_TRANSPORT (verbs in the guest), tcp by default. */
static const char *transport(void)
{
    const char *t = getenv("XFERTEST_TRANSPORT");

    return ((t != NULL) && (t[0] != '\0')) ? t : "tcp";
}

static char *slurp(const char *path)
{
    char *text = calloc(1, 65536);
    FILE *f    = fopen(path, "r");

    cr_assert_not_null(text);
    cr_assert_not_null(f, "%s", path);
    (void)!fread(text, 1, 65535, f);
    fclose(f);
    return text;
}

/* Start a server on a port of the kernel's choosing, with `env` (VAR=value ...) before it
 * and `args` after its own. */
static void server_start_args(perf_server_t *s, const char *env, const char *args)
{
    char cmd[2048], line[256];

    snprintf(s->errpath, sizeof(s->errpath), "/tmp/xfertest_perf.%d.err", (int)getpid());
    snprintf(cmd, sizeof(cmd), "timeout 120 env %s %s/contrib/xfer_perf -x %s -p 0 %s 2>%s",
             env, build_dir(), transport(), args, s->errpath);
    s->out = popen(cmd, "r");
    cr_assert_not_null(s->out);
    cr_assert_not_null(fgets(line, sizeof(line), s->out), "the server printed nothing:\n%s",
                       slurp(s->errpath));
    cr_assert_eq(sscanf(line, "# xfer_perf server: listening on port %u", &s->port), 1, "%s",
                 line);
}

static void server_start(perf_server_t *s, const char *env)
{
    server_start_args(s, env, "");
}

/* Read the server's output to its end (a pipe closed early would kill it) and its status. */
static void server_finish(perf_server_t *s, perf_run_t *r)
{
    size_t len = 0, cap = 65536;
    char line[1024];
    int status;

    r->server_out = calloc(1, cap);
    cr_assert_not_null(r->server_out);
    while (fgets(line, sizeof(line), s->out) != NULL) {
        if (len + strlen(line) < cap) {
            memcpy(r->server_out + len, line, strlen(line) + 1);
            len += strlen(line);
        }
    }
    status       = pclose(s->out);
    r->server_rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r->server_err = slurp(s->errpath);
    unlink(s->errpath);
}

/* One client run against a fresh server: `senv` before the server, `cenv` and `args` for
 * the client. */
static void perf_run(const char *senv, const char *cenv, const char *args, perf_run_t *r)
{
    perf_server_t s;
    char cmd[2048];

    server_start(&s, senv);
    snprintf(cmd, sizeof(cmd), "timeout 100 env %s %s/contrib/xfer_perf -x %s -p %u %s "
             "127.0.0.1", cenv, build_dir(), transport(), s.port, args);
    r->client_rc = tu_run(cmd, 1, &r->client_out);
    server_finish(&s, r);
}

static void perf_run_free(perf_run_t *r)
{
    free(r->client_out);
    free(r->server_out);
    free(r->server_err);
}

static int count_lines(const char *text, const char *prefix)
{
    int n = 0;

    for (const char *p = text; p != NULL && *p != '\0'; p = strchr(p, '\n'), p = p ? p + 1 : p) {
        n += (strncmp(p, prefix, strlen(prefix)) == 0);
    }
    return n;
}

static void expect_ran(const perf_run_t *r, const char *what)
{
    cr_expect_eq(r->client_rc, 0, "%s: the client failed (%d):\n%s", what, r->client_rc,
                 r->client_out);
    cr_expect_eq(r->server_rc, 0, "%s: the server failed (%d):\n%s%s", what, r->server_rc,
                 r->server_out, r->server_err);
    cr_expect(strstr(r->server_out, "# done\n") != NULL, "%s:\n%s", what, r->server_out);
}

/* ---- cuda memory that xfer stages ----------------------------------------------------------- */

static void cuda_to_host(const char *test)
{
    char env[1200], args[256];
    perf_run_t r;

    snprintf(env, sizeof(env), "XFER_CUDA_LIB=%s", fake_cuda());

    /* every size of the sweep, 1 B to 8 MiB, two of them more than one 4 MiB chunk */
    snprintf(args, sizeof(args), "-t %s -m cuda,host -a -n 8 --warmup 2 -V", test);
    perf_run(env, env, args, &r);
    expect_ran(&r, test);
    cr_expect(strstr(r.client_out, "# memory: client cuda device 0 (stand-in GPU), server "
                     "host\n") != NULL, "%s", r.client_out);
    cr_expect(strstr(r.server_out, "# memory: client cuda, server host\n") != NULL, "%s",
              r.server_out);
    cr_expect_eq(count_lines(r.client_out, "8388608 "), 1, "%s", r.client_out);
    cr_expect_eq(count_lines(r.client_out, "1 "), 1, "%s", r.client_out);
    perf_run_free(&r);

    /* odd sizes across many small chunks, a window of them in flight */
    snprintf(env, sizeof(env), "XFER_CUDA_LIB=%s XFER_STAGING_CHUNK=64k", fake_cuda());
    snprintf(args, sizeof(args), "-t %s -m cuda,host -s 300001 -n 40 -w 4 -V --json", test);
    perf_run(env, env, args, &r);
    expect_ran(&r, test);
    cr_expect(strstr(r.client_out, "\"memory\":{\"client\":\"cuda\",\"server\":\"host\"}") !=
              NULL, "%s", r.client_out);
    cr_expect(strstr(r.client_out, "\"bytes\":300001,\"iterations\":40,\"window\":4") != NULL,
              "%s", r.client_out);
    perf_run_free(&r);
}

Test(perf, put_bw_from_cuda_memory) { cuda_to_host("put_bw"); }
Test(perf, get_bw_into_cuda_memory) { cuda_to_host("get_bw"); }

/* Whether the transport under test puts into and gets from a peer's CUDA memory: tcp moves
 * it through its bounce buffers, shm opens it by its CUDA IPC handle (unless
 * XFER_SHM_CUDA_IPC turns that off). */
static int reaches_peers_cuda(void)
{
    const char *ipc = getenv("XFER_SHM_CUDA_IPC");
    int ipc_off     = (ipc != NULL) && ((strcmp(ipc, "n") == 0) || (strcmp(ipc, "no") == 0) ||
                                        (strcmp(ipc, "0") == 0) || (strcmp(ipc, "off") == 0));

    return (strcmp(transport(), "tcp") == 0) || ((strcmp(transport(), "shm") == 0) && !ipc_off);
}

/* Every test with both sides' buffers in CUDA memory, data checked: over a transport that
 * reaches a peer's (tcp, through its bounce buffers, made small here so that a message spans
 * many; shm, by IPC) all of them; over verbs in the guest the tagged and tensor tests, which
 * xfer stages through host memory (a put or get into the peer's cuda memory is refused
 * there, below). */
Test(perf, every_test_runs_with_cuda_memory_on_both_sides)
{
    static const char *const tests[] = {"tag_bw", "tag_lat", "tensor_bw", "tensor_lat",
                                        "put_bw", "get_bw", "put_lat"};
    size_t num_tests = sizeof(tests) / sizeof(tests[0]);
    char env[1200], args[256];
    perf_run_t r;

    if (!reaches_peers_cuda()) {
        num_tests = 4;
    }
    snprintf(env, sizeof(env), "XFER_CUDA_LIB=%s XFER_TCP_CUDA_CHUNK=64k XFER_TCP_CUDA_DEPTH=2",
             fake_cuda());
    for (size_t i = 0; i < num_tests; i++) {
        snprintf(args, sizeof(args), "-t %s -m cuda -s 300001 -n 6 --warmup 1 -V", tests[i]);
        perf_run(env, env, args, &r);
        expect_ran(&r, tests[i]);
        cr_expect(strstr(r.client_out, "# memory: client cuda device 0 (stand-in GPU), server "
                         "cuda\n") != NULL, "%s: %s", tests[i], r.client_out);
        perf_run_free(&r);
    }
}

/* Batches with CUDA memory on either side or both, data checked. Over tcp a batch of puts
 * from host memory into the peer's CUDA memory goes as PUTV frames, which the target reads
 * block by block through its bounce buffers; from CUDA memory as PUT frames. Over shm the
 * initiator copies every block with the CUDA driver, the peer's CUDA memory opened by its
 * IPC handle, its host memory from xfer_mem_alloc mapped; its malloc'd host memory, which
 * shm cannot reach from device memory, through the framework's staging. */
Test(perf, batches_move_cuda_memory_on_either_side)
{
    static const char *const tcp_mems[] = {"host,cuda", "cuda,host", "cuda"};
    static const char *const shm_mems[] = {"host,cuda", "cuda,xfer", "xfer,cuda", "cuda",
                                           "cuda,host"};
    static const char *const tests[] = {"batch_put", "batch_get"};
    int shm = strcmp(transport(), "shm") == 0;
    const char *const *mems = shm ? shm_mems : tcp_mems;
    size_t num_mems = shm ? 5 : 3;
    char env[1200], args[256];
    perf_run_t r;

    if (!reaches_peers_cuda()) {
        cr_skip_test("%s does not reach a peer's CUDA memory (tcp and shm do)", transport());
    }
    snprintf(env, sizeof(env), "XFER_CUDA_LIB=%s XFER_TCP_CUDA_CHUNK=64k XFER_TCP_CUDA_DEPTH=2",
             fake_cuda());
    for (size_t m = 0; m < num_mems; m++) {
        for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
            snprintf(args, sizeof(args), "-t %s -m %s -s 300001 -b 5 -w 2 -n 6 --warmup 1 -V",
                     tests[i], mems[m]);
            perf_run(env, env, args, &r);
            expect_ran(&r, tests[i]);
            perf_run_free(&r);
        }
    }
}

/* -m xfer: buffers from xfer_mem_alloc on both sides (over shm the initiator maps the peer's
 * and copies itself), every test's data checked. */
Test(perf, every_test_runs_with_memory_from_xfer_mem_alloc)
{
    static const char *const tests[] = {"tag_bw", "tag_lat", "tensor_bw", "tensor_lat",
                                        "put_bw", "get_bw", "put_lat", "batch_put",
                                        "batch_get"};
    char args[256];
    perf_run_t r;

    for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
        snprintf(args, sizeof(args), "-t %s -m xfer -s 300001 -n 6 --warmup 1 -V%s", tests[i],
                 (strncmp(tests[i], "batch", 5) == 0) ? " -b 5 -w 2" : "");
        perf_run("", "", args, &r);
        expect_ran(&r, tests[i]);
        cr_expect(strstr(r.client_out, "# memory: client xfer, server xfer\n") != NULL,
                  "%s: %s", tests[i], r.client_out);
        perf_run_free(&r);
    }
}

/* ---- what a transport cannot reach: refused before the test, with the reason ---------------- */

typedef struct refusal {
    const char *test;
    const char *mem;
    int        by_client;   /* the client refuses (and ends with BYE); else the server */
    const char *why;        /* in the refusing side's line */
} refusal_t;

static const refusal_t refusals[] = {
    {"put_bw",     "host,cuda", 0, "xfer_rkey_pack of the server's cuda buffer: operation not "
                                   "supported: the peer's put or get cannot reach cuda memory"},
    {"get_bw",     "cuda",      0, "xfer_rkey_pack of the server's cuda buffer"},
    {"put_lat",    "cuda,host", 1, "xfer_rkey_pack of the client's cuda buffer: operation not "
                                   "supported"},
};

/* Over a transport that does not reach a peer's CUDA memory (verbs: the guest runs this suite
 * over it), a put or get into the peer's cuda memory - which has no remote key there - is
 * refused before the test starts, by the side concerned, in one line. tcp moves CUDA memory
 * itself and shm opens it by IPC, so there the test has nothing to refuse. */
Test(perf, what_the_transport_does_not_move_is_refused_with_the_reason)
{
    char env[1200], args[256], line[1024], why[512];
    perf_run_t r;

    if (reaches_peers_cuda()) {
        fprintf(stderr, "perf: skipped: %s reaches a peer's CUDA memory, nothing is refused "
                "(the guest runs this over verbs)\n", transport());
        cr_skip_test("%s reaches a peer's CUDA memory", transport());
    }
    snprintf(env, sizeof(env), "XFER_CUDA_LIB=%s", fake_cuda());
    for (size_t i = 0; i < sizeof(refusals) / sizeof(refusals[0]); i++) {
        const refusal_t *c = &refusals[i];

        snprintf(why, sizeof(why), "%s", c->why);

        snprintf(args, sizeof(args), "-t %s -m %s -s 4096 -n 10", c->test, c->mem);
        snprintf(line, sizeof(line), "xfer_perf: the %s cannot run %s with 4096 bytes: ",
                 c->by_client ? "client" : "server", c->test);
        perf_run(env, env, args, &r);
        cr_expect_eq(r.client_rc, 1, "%s -m %s: client %d:\n%s", c->test, c->mem, r.client_rc,
                     r.client_out);
        cr_expect(strstr(r.client_out, line) != NULL, "%s -m %s: no '%s' in:\n%s", c->test,
                  c->mem, line, r.client_out);
        cr_expect(strstr(r.client_out, why) != NULL, "%s -m %s: no '%s' in:\n%s", c->test,
                  c->mem, why, r.client_out);
        cr_expect_eq(count_lines(r.client_out, "xfer_perf: "), 1, "%s -m %s:\n%s", c->test,
                     c->mem, r.client_out);
        if (c->by_client) {
            /* nothing was asked of the server: the session ends with BYE */
            cr_expect_eq(r.server_rc, 0, "%s -m %s: server %d:\n%s", c->test, c->mem,
                         r.server_rc, r.server_err);
            cr_expect(strstr(r.server_out, "# done\n") != NULL, "%s", r.server_out);
        } else {
            /* the server says it too, and ends */
            cr_expect_eq(r.server_rc, 1, "%s -m %s: server %d:\n%s", c->test, c->mem,
                         r.server_rc, r.server_err);
            cr_expect(strstr(r.server_err, line) != NULL, "%s -m %s:\n%s", c->test, c->mem,
                      r.server_err);
        }
        perf_run_free(&r);
    }
}

/* ---- no driver ------------------------------------------------------------------------------ */

/* The client fails before it connects: no server is needed, nothing listens on port 1. */
static void client_without_driver(const char *env, const char *args, const char *expect)
{
    char cmd[2048], *out;
    int rc;

    snprintf(cmd, sizeof(cmd), "timeout 30 env %s %s/contrib/xfer_perf -x tcp -p 1 %s "
             "127.0.0.1", env, build_dir(), args);
    rc = tu_run(cmd, 1, &out);
    cr_expect_eq(rc, 1, "%s: %d:\n%s", cmd, rc, out);
    cr_expect(strncmp(out, "xfer_perf: -m cuda: ", 20) == 0, "%s:\n%s", cmd, out);
    cr_expect(strstr(out, expect) != NULL, "%s: no '%s' in:\n%s", cmd, expect, out);
    cr_expect_eq(count_lines(out, ""), 1, "one line, not:\n%s", out);
    free(out);
}

Test(perf, cuda_without_a_driver_fails_in_one_line)
{
    char env[1200], lib[1024];

    client_without_driver("XFER_CUDA_LIB=/nonexistent/libcuda.so.1", "-m cuda",
                          "cannot load the CUDA driver library /nonexistent/libcuda.so.1 (from "
                          "XFER_CUDA_LIB): /nonexistent/libcuda.so.1: cannot open shared "
                          "object file");
    /* a real library that is not a CUDA driver: a test plug-in of xfer */
    snprintf(lib, sizeof(lib), "%s/xfer_tgood.so", getenv("XFERTEST_PLUGIN_DIR"));
    snprintf(env, sizeof(env), "XFER_CUDA_LIB=%s", lib);
    client_without_driver(env, "-m cuda,host", "is not a usable CUDA driver library: it has no "
                          "cuInit");
    snprintf(env, sizeof(env), "XFER_CUDA_LIB=%s", fake_cuda());
    client_without_driver(env, "-m cuda --cuda-device 3", "--cuda-device 3: the driver sees 1 "
                          "device");
    if (!tu_host_has_cuda_driver()) {
        client_without_driver("XFER_CUDA_LIB=", "-m cuda", "cannot load the CUDA driver "
                              "library libcuda.so.1 (the default; XFER_CUDA_LIB may name "
                              "another)");
    }
}

/* A server without a driver refuses a client that asks it for cuda memory, and says why;
 * host memory on both sides never needs one. */
Test(perf, server_without_a_driver_refuses_cuda_with_the_reason)
{
    char env[1200];
    perf_run_t r;

    snprintf(env, sizeof(env), "XFER_CUDA_LIB=%s", fake_cuda());
    perf_run("XFER_CUDA_LIB=/nonexistent/libcuda.so.1", env, "-t put_bw -m host,cuda -s 4096",
             &r);
    cr_expect_eq(r.client_rc, 1, "%s", r.client_out);
    cr_expect(strstr(r.client_out, "xfer_perf: the server cannot run put_bw with 4096 bytes: "
                     "cannot load the CUDA driver library /nonexistent/libcuda.so.1") != NULL,
              "%s", r.client_out);
    cr_expect_eq(r.server_rc, 1, "%s", r.server_err);
    perf_run_free(&r);

    perf_run("XFER_CUDA_LIB=/nonexistent/libcuda.so.1", "XFER_CUDA_LIB=/nonexistent/libcuda.so.1",
             "-t put_bw -m host -s 4096 -n 10 -V", &r);
    expect_ran(&r, "-m host without a driver");
    cr_expect(strstr(r.client_out, "# memory: client host, server host\n") != NULL, "%s",
              r.client_out);
    perf_run_free(&r);
}

/* A client's parameters decide what the server allocates: beyond --max-mem the server
 * refuses them before allocating, and the client is told why; within it the run goes on. */
Test(perf, the_server_refuses_parameters_beyond_its_memory_limit)
{
    perf_server_t s;
    perf_run_t r;
    char cmd[1024];

    server_start_args(&s, "", "--max-mem 16m");
    snprintf(cmd, sizeof(cmd), "timeout 100 %s/contrib/xfer_perf -x %s -p %u -t tag_lat -s 64m "
             "127.0.0.1", build_dir(), transport(), s.port);
    r.client_rc = tu_run(cmd, 1, &r.client_out);
    server_finish(&s, &r);
    cr_expect_eq(r.client_rc, 1, "%s", r.client_out);
    cr_expect(strstr(r.client_out, "the server cannot run tag_lat with 67108864 bytes: these "
                     "parameters need 128.0 MiB of the server's memory, more than its "
                     "--max-mem of 16.0 MiB allows") != NULL, "%s", r.client_out);
    perf_run_free(&r);

    /* within the limit the same server runs the client to the end */
    server_start_args(&s, "", "--max-mem 600m");
    snprintf(cmd, sizeof(cmd), "timeout 100 %s/contrib/xfer_perf -x %s -p %u -t tag_bw -s 1m "
             "-n 20 127.0.0.1", build_dir(), transport(), s.port);
    r.client_rc = tu_run(cmd, 1, &r.client_out);
    server_finish(&s, &r);
    expect_ran(&r, "within --max-mem");
    perf_run_free(&r);
}

/* ---- batch tests ---------------------------------------------------------------------------- */

/* Odd block size and batch length (the server's blocks scattered by a stride prime to 37),
 * three batches in flight, every block's data checked: put batches at the server when each
 * notification comes (and the client writes a slot again only after the server's SEEN),
 * get batches at the client. */
Test(perf, batch_tests_move_checked_data_and_time_the_notifications)
{
    static const char *const tests[] = {"batch_put", "batch_get"};
    char args[256];
    perf_run_t r;

    for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
        snprintf(args, sizeof(args), "-t %s -s 4099 -b 37 -w 3 -n 40 --warmup 5 -V --notify 64",
                 tests[i]);
        perf_run("", "", args, &r);
        expect_ran(&r, tests[i]);
        cr_expect(strstr(r.client_out, "# 3 batches in flight, notification 64 bytes, verify "
                         "on;") != NULL, "%s: %s", tests[i], r.client_out);
        cr_expect(strstr(r.client_out, "# clocks: one host, one CLOCK_MONOTONIC") != NULL,
                  "%s: %s", tests[i], r.client_out);
        cr_expect_eq(count_lines(r.client_out, "4099       37      40 "), 1, "%s: %s", tests[i],
                     r.client_out);
        perf_run_free(&r);

        /* the longest lists, checked: more blocks than one read or write takes (tcp reads
         * a PUTV's blocks up to 256 at a time, wherever the socket's data ends) */
        snprintf(args, sizeof(args), "-t %s -s 4099 -b 1024 -w 2 -n 6 --warmup 1 -V", tests[i]);
        perf_run("", "", args, &r);
        expect_ran(&r, tests[i]);
        cr_expect_eq(count_lines(r.client_out, "4099       1024    6 "), 1, "%s: %s", tests[i],
                     r.client_out);
        perf_run_free(&r);

        /* the same as JSON: the notification figures, and none without notifications */
        snprintf(args, sizeof(args), "-t %s -s 64k -b 16 -n 30 --json", tests[i]);
        perf_run("", "", args, &r);
        expect_ran(&r, tests[i]);
        cr_expect(strstr(r.client_out, "\"bytes\":65536,\"iterations\":30,\"window\":1,") !=
                  NULL, "%s: %s", tests[i], r.client_out);
        cr_expect(strstr(r.client_out, "\"batch\":16,\"post_usec_per_desc\":") != NULL,
                  "%s: %s", tests[i], r.client_out);
        cr_expect(strstr(r.client_out, "\"notify_avg_usec\":") != NULL, "%s: %s", tests[i],
                  r.client_out);
        cr_expect(strstr(r.client_out, "\"clock_error_usec\":0.000") != NULL, "%s: %s",
                  tests[i], r.client_out);
        perf_run_free(&r);

        snprintf(args, sizeof(args), "-t %s -s 64k -b 16 -n 30 --json --notify 0", tests[i]);
        perf_run("", "", args, &r);
        expect_ran(&r, tests[i]);
        cr_expect(strstr(r.client_out, "\"batch\":16,") != NULL, "%s", r.client_out);
        cr_expect(strstr(r.client_out, "notify_avg_usec") == NULL, "%s", r.client_out);
        cr_expect(strstr(r.client_out, "clock_") == NULL, "%s", r.client_out);
        perf_run_free(&r);
    }
}

/* A JSON figure's value, or -1 when it is missing. */
static double json_figure(const char *text, const char *name)
{
    char key[64];
    const char *p;

    snprintf(key, sizeof(key), "\"%s\":", name);
    p = strstr(text, key);
    return (p != NULL) ? strtod(p + strlen(key), NULL) : -1.0;
}

/* The latency tests time with the TSC where it is invariant and scale the samples to
 * microseconds after the loop, against CLOCK_MONOTONIC: the figures must be positive, the
 * median no more than the 99th percentile, and the samples must add up to most of the timed
 * iterations' wall time (loop_usec: what lies between two samples is bookkeeping; they add
 * up to 0.99 of it on a loaded 2-core machine), never to more - a figure in the wrong unit
 * falls far outside - and that loop is part of the timed phase (which adds the warm-up and
 * the final handshake). */
Test(perf, latency_figures_are_in_microseconds)
{
    static const char *const tests[] = {"tag_lat", "put_lat", "tensor_lat"};
    char args[256];
    perf_run_t r;

    for (size_t i = 0; i < sizeof(tests) / sizeof(tests[0]); i++) {
        /* tag_lat and put_lat give half a round trip, tensor_lat a whole fetch */
        double per_iter = (i < 2) ? 2 : 1, typ, avg, p99, elapsed, loop, share;

        snprintf(args, sizeof(args), "-t %s -s 8 -n 20000 --warmup 10 --json", tests[i]);
        perf_run("", "", args, &r);
        expect_ran(&r, tests[i]);
        typ     = json_figure(r.client_out, "t_typical_usec");
        avg     = json_figure(r.client_out, "t_avg_usec");
        p99     = json_figure(r.client_out, "t_99_usec");
        elapsed = json_figure(r.client_out, "elapsed_usec");
        loop    = json_figure(r.client_out, "loop_usec");
        cr_expect((typ > 0) && (avg > 0) && (p99 >= typ), "%s: typical %g, average %g, 99%% "
                  "%g usec: %s", tests[i], typ, avg, p99, r.client_out);
        cr_expect((loop > 0) && (loop < elapsed), "%s: the timed iterations took %g usec of "
                  "the %g usec timed", tests[i], loop, elapsed);
        share = avg * per_iter * 20000 / loop;
        cr_expect((share > 0.5) && (share < 1.02), "%s: 20000 samples of %g usec are %.2f of "
                  "the %g usec their iterations took", tests[i], avg, share, loop);
        perf_run_free(&r);
    }
}

/* -a with -s sweeps the batch lengths 1, 4, ... 1024; with -b the block sizes 4k ... 64m. */
Test(perf, batch_sweeps_give_a_row_each)
{
    static const char *const lengths[] = {"1 ", "4 ", "16 ", "64 ", "256 ", "1024 "};
    char row[64];
    perf_run_t r;

    perf_run("", "", "-t batch_put -a -s 4k -n 3 --warmup 1", &r);
    expect_ran(&r, "batch_put -a -s 4k");
    cr_expect_eq(count_lines(r.client_out, "4096 "), 6, "%s", r.client_out);
    for (size_t i = 0; i < sizeof(lengths) / sizeof(lengths[0]); i++) {
        snprintf(row, sizeof(row), "4096       %s", lengths[i]);
        cr_expect_eq(count_lines(r.client_out, row), 1, "no row '%s' in:\n%s", row,
                     r.client_out);
    }
    perf_run_free(&r);

    perf_run("", "", "-t batch_get -a -b 2 -n 2 --warmup 0 --notify 0", &r);
    expect_ran(&r, "batch_get -a -b 2");
    cr_expect_eq(count_lines(r.client_out, "4096 "), 1, "%s", r.client_out);
    cr_expect_eq(count_lines(r.client_out, "67108864 "), 1, "%s", r.client_out);
    /* no clock line: without notifications nothing is timed across the two clocks */
    cr_expect_eq(count_lines(r.client_out, "# "), 3, "header lines:\n%s", r.client_out);
    cr_expect_eq(count_lines(r.client_out, "# clocks"), 0, "%s", r.client_out);
    perf_run_free(&r);
}

Test(perf, batch_options_that_do_not_fit_are_usage_errors)
{
    static const struct { const char *args, *why; } bad[] = {
        {"-t put_bw -b 4", "-b: put_bw is not a batch test"},
        {"-t batch_put -b 1025", "-b: '1025' is not a batch length from 1 to 1024"},
        {"-t batch_put --notify 8", "--notify: '8' is not 0 or a length from 16 to 4096"},
        {"-t batch_get -a -s 4k -b 8", "-a sweeps the block size or the batch length"},
    };
    char cmd[1024], *out;
    int rc;

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(cmd, sizeof(cmd), "%s/contrib/xfer_perf %s 127.0.0.1", build_dir(),
                 bad[i].args);
        rc = tu_run(cmd, 1, &out);
        cr_expect_eq(rc, 2, "%s: %d\n%s", bad[i].args, rc, out);
        cr_expect(strstr(out, bad[i].why) != NULL, "%s:\n%s", bad[i].args, out);
        free(out);
    }
}

/* ---- bench_gpu.sh's report of the driver's attributes --------------------------------------- */

Test(perf, gpu_attrs_reports_each_attribute_or_why_not)
{
    static const char *const attrs[] = {
        "DMA_BUF_SUPPORTED ", "GPU_DIRECT_RDMA_SUPPORTED ",
        "GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS ", "GPU_DIRECT_RDMA_WRITES_ORDERING ",
        "GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED ",
    };
    char cmd[2048], *out;
    int rc;

    snprintf(cmd, sizeof(cmd), "env XFER_CUDA_LIB=%s %s/contrib/bench/gpu_attrs", fake_cuda(),
             build_dir());
    rc = tu_run(cmd, 1, &out);
    cr_expect_eq(rc, 0, "%s:\n%s", cmd, out);
    cr_expect(strstr(out, "CUDA driver API 12.4, 1 device\n") != NULL, "%s", out);
    cr_expect(strstr(out, "device 0: stand-in GPU, PCI 0000:00:00.0") != NULL, "%s", out);
    cr_expect_eq(count_lines(out, "  "), 5, "%s", out);
    for (size_t i = 0; i < sizeof(attrs) / sizeof(attrs[0]); i++) {
        cr_expect(strstr(out, attrs[i]) != NULL, "no %s in:\n%s", attrs[i], out);
    }
    free(out);

    snprintf(cmd, sizeof(cmd), "env XFER_CUDA_LIB=/nonexistent/libcuda.so.1 "
             "%s/contrib/bench/gpu_attrs", build_dir());
    rc = tu_run(cmd, 1, &out);
    cr_expect_eq(rc, 1, "%s:\n%s", cmd, out);
    cr_expect(strstr(out, "gpu_attrs: cannot load the CUDA driver library "
                     "/nonexistent/libcuda.so.1: ") != NULL, "%s", out);
    cr_expect_eq(count_lines(out, ""), 1, "%s", out);
    free(out);
}
