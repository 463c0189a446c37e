/*
 * hello_tensors: the first xfer program to read. One run forks into two processes on
 * loopback:
 *
 *   producer   listens, publishes three tensors (one of them dead), receives two tagged
 *              messages and answers them;
 *   consumer   connects, fetches the tensors (into its own registered buffer, and into a
 *              buffer its allocation callback returns), sends the messages, reads the answer.
 *
 * Each side prints what moved, over which transport, and how fast. Run it from the build tree:
 *   ./contrib/examples/hello_tensors          (XFER_TRANSPORTS=tcp etc. work as everywhere)
 */
#include <xfer/xfer.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define WAIT_MS     10000       /* no step of this demo should take longer */
#define TAG_HELLO   1
#define TAG_PAYLOAD 2
#define TAG_REPLY   3
#define PAYLOAD_LEN (8u << 20)

static const char *who = "producer";

/* Any failure ends the demo: say where and why. */
static void check(xfer_status_t status, const char *what)
{
    if (status != XFER_OK && status != XFER_INPROGRESS) {
        fprintf(stderr, "%s: %s: %s\n", who, what, xfer_status_string(status));
        exit(1);
    }
}

/* Block until a request is done (sleeping in the library between events), then free it. */
static void finish(xfer_request_t *req, const char *what)
{
    check(xfer_request_wait(req, WAIT_MS), what);
    xfer_request_release(req);
}

static double usec_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);    /* one clock for both processes on this host */
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static void print_type(const xfer_tensor_t *t)
{
    static const char *names[XFER_DTYPE_LAST] = {
        "invalid", "float16", "bfloat16", "float32", "float64", "int8", "int16", "int32",
        "int64", "uint8", "uint16", "uint32", "uint64", "bool", "bytes"};

    printf("%s [", (t->dtype < XFER_DTYPE_LAST) ? names[t->dtype] : "?");
    for (uint32_t i = 0; i < t->rank; i++) {
        printf("%s%lld", i ? " x " : "", (long long)t->dims[i]);
    }
    printf("]");
}

/* ---- the producer ---------------------------------------------------------------------------- */

static void producer(xfer_context_t *ctx, xfer_endpoint_t *ep)
{
    /* 1. Publish three tensors under step 0. A publish never blocks; its request completes
     *    once the consumer has the tensor. Without XFER_PUBLISH_COPY the data must stay put
     *    until then, so "weights" lives in a buffer we keep; "tokens" is copied at publish. */
    static float weights[256 * 1024];
    int64_t tokens[4 * 8];
    xfer_tensor_t w = {.dtype = XFER_DTYPE_FLOAT32, .rank = 2, .dims = {256, 1024},
                       .size = sizeof(weights), .data = weights};
    xfer_tensor_t t = {.dtype = XFER_DTYPE_INT64, .rank = 2, .dims = {4, 8},
                       .size = sizeof(tokens), .data = tokens};
    xfer_tensor_t mask = {.dtype = XFER_DTYPE_BOOL, .rank = 1, .dims = {0}, .is_dead = 1};
    xfer_request_t *pub[3], *hello_req, *payload_req, *reply_req;

    for (size_t i = 0; i < 256 * 1024; i++) {
        weights[i] = (float)i * 0.5f;
    }
    for (int i = 0; i < 4 * 8; i++) {
        tokens[i] = 100 + i;
    }
    check(xfer_tensor_publish(ctx, 0, "weights", &w, 0, NULL, NULL, &pub[0]), "publish weights");
    check(xfer_tensor_publish(ctx, 0, "tokens", &t, XFER_PUBLISH_COPY, NULL, NULL, &pub[1]),
          "publish tokens");
    check(xfer_tensor_publish(ctx, 0, "mask", &mask, 0, NULL, NULL, &pub[2]), "publish mask");
    printf("producer: published step 0: \"weights\" float32 [256 x 1024], "
           "\"tokens\" int64 [4 x 8], \"mask\" (dead)\n");

    /* 2. Post receives for the two tagged messages: the tag picks the buffer. */
    static char payload[PAYLOAD_LEN];
    char hello[64] = "";

    memset(payload, 0, PAYLOAD_LEN);    /* fault the pages in now, so we time the transfer */
    check(xfer_tag_recv(ctx, ep, TAG_HELLO, UINT64_MAX, hello, sizeof(hello) - 1, NULL, NULL,
                        NULL, &hello_req), "receive hello");
    check(xfer_tag_recv(ctx, ep, TAG_PAYLOAD, UINT64_MAX, payload, PAYLOAD_LEN, NULL, NULL,
                        NULL, &payload_req), "receive payload");

    /* 3. Wait: waiting on any request progresses all of them. */
    check(xfer_request_wait(hello_req, WAIT_MS), "receive hello");
    printf("producer: received tag %d: \"%s\" (%zu bytes)\n", TAG_HELLO, hello,
           xfer_request_length(hello_req));
    xfer_request_release(hello_req);

    check(xfer_request_wait(payload_req, WAIT_MS), "receive payload");
    double t_end = usec_now(), t_sent;
    size_t n = xfer_request_length(payload_req);

    memcpy(&t_sent, payload, sizeof(t_sent));   /* the consumer wrote its clock up front */
    printf("producer: received tag %d: %zu bytes in %.0f usec = %.0f MB/s, from the "
           "consumer's send call to here, over %s\n", TAG_PAYLOAD, n, t_end - t_sent,
           n / (t_end - t_sent), xfer_endpoint_transport(ep));
    xfer_request_release(payload_req);

    for (int i = 0; i < 3; i++) {
        finish(pub[i], "publish");
    }
    printf("producer: the consumer has all three tensors\n");

    /* 4. Answer, and keep the connection until the consumer has read the answer and quit. */
    char reply[96];

    snprintf(reply, sizeof(reply), "thanks: got \"%s\" and %zu bytes", hello, n);
    check(xfer_tag_send(ep, TAG_REPLY, reply, strlen(reply) + 1, NULL, NULL, NULL, &reply_req),
          "send reply");
    finish(reply_req, "send reply");
}

/* ---- the consumer ---------------------------------------------------------------------------- */

/* Called once the tensor's size is known: where should its data go? */
static void *alloc_cb(const xfer_tensor_t *meta, void *alloc_arg)
{
    void **where = alloc_arg;

    *where = malloc(meta->size ? meta->size : 1);
    return *where;
}

/* Fetch (step 0, key), wait, print what came and how fast. */
static const xfer_tensor_t *fetch(xfer_endpoint_t *ep, const char *key,
                                  const xfer_fetch_params_t *params, xfer_request_t **req_p)
{
    double t0 = usec_now(), dt;
    const xfer_tensor_t *t;

    check(xfer_tensor_fetch(ep, 0, key, params, NULL, NULL, req_p), key);
    check(xfer_request_wait(*req_p, WAIT_MS), key);
    dt = usec_now() - t0;
    t = xfer_request_tensor(*req_p);
    printf("consumer: fetched \"%s\" ", key);
    if (t->is_dead) {
        printf("dead (no data), in %.0f usec\n", dt);
    } else {
        print_type(t);
        printf(": %llu bytes in %.0f usec = %.1f MB/s\n", (unsigned long long)t->size, dt,
               t->size / dt);
    }
    return t;
}

static void consumer(xfer_context_t *ctx, xfer_endpoint_t *ep)
{
    /* 1. Into our own buffer, registered once so the transport can place data directly. */
    static float weights[256 * 1024];
    xfer_mem_t *mem;
    xfer_request_t *req;
    const xfer_tensor_t *t;

    memset(weights, 0, sizeof(weights));    /* fault the pages in now, not while timing */
    check(xfer_mem_register(ctx, weights, sizeof(weights), XFER_MEM_HOST, &mem), "register");
    xfer_fetch_params_t into_buffer = {.size = sizeof(into_buffer), .buffer = weights,
                                       .capacity = sizeof(weights), .mem = mem};

    fetch(ep, "weights", &into_buffer, &req);
    printf("consumer:   weights[1000] = %.1f (the producer wrote 1000 * 0.5)\n", weights[1000]);
    xfer_request_release(req);

    /* 2. Into a buffer we allocate when the size is known; it is ours to free. */
    void *allocated = NULL;
    xfer_fetch_params_t by_callback = {.size = sizeof(by_callback), .alloc = alloc_cb,
                                       .alloc_arg = &allocated};

    t = fetch(ep, "tokens", &by_callback, &req);
    const int64_t *tok = t->data;
    printf("consumer:   tokens row 0 = %lld %lld %lld ... %lld\n", (long long)tok[0],
           (long long)tok[1], (long long)tok[2], (long long)tok[7]);
    xfer_request_release(req);
    free(allocated);

    allocated = NULL;
    fetch(ep, "mask", &by_callback, &req);      /* dead: no data, so no buffer is needed */
    xfer_request_release(req);
    free(allocated);

    /* 3. Two tagged messages; the second carries our clock so the producer can time it. */
    static const char hello[] = "hello from the consumer";
    static char payload[PAYLOAD_LEN];
    xfer_request_t *sends[2], *reply_req;
    char reply[96] = "";

    memset(payload, 'x', PAYLOAD_LEN);
    check(xfer_tag_recv(ctx, ep, TAG_REPLY, UINT64_MAX, reply, sizeof(reply) - 1, NULL, NULL,
                        NULL, &reply_req), "receive reply");
    check(xfer_tag_send(ep, TAG_HELLO, hello, sizeof(hello) - 1, NULL, NULL, NULL, &sends[0]),
          "send hello");
    double t0 = usec_now();

    memcpy(payload, &t0, sizeof(t0));
    check(xfer_tag_send(ep, TAG_PAYLOAD, payload, PAYLOAD_LEN, NULL, NULL, NULL, &sends[1]),
          "send payload");
    finish(sends[0], "send hello");
    finish(sends[1], "send payload");
    printf("consumer: sent tag %d (%zu bytes) and tag %d (%u bytes)\n", TAG_HELLO,
           sizeof(hello) - 1, TAG_PAYLOAD, PAYLOAD_LEN);

    finish(reply_req, "receive reply");
    printf("consumer: the producer answered: \"%s\"\n", reply);
    check(xfer_mem_deregister(mem), "deregister");
}

/* ---- main: fork, then each process makes its own context ---------------------------------- */

int main(void)
{
    xfer_context_t *ctx;
    xfer_listener_t *listener;
    xfer_endpoint_t *ep;
    char address[64];
    uint16_t port;
    int pipefd[2], status;
    pid_t pid;

    setvbuf(stdout, NULL, _IOLBF, 0);           /* whole lines, so the two sides interleave */
    if (pipe(pipefd) != 0 || (pid = fork()) < 0) {
        perror("hello_tensors");
        return 1;
    }

    if (pid == 0) {
        /* The consumer learns the producer's port through the pipe, then connects. */
        who = "consumer";
        close(pipefd[1]);
        if (read(pipefd[0], &port, sizeof(port)) != sizeof(port)) {
            fprintf(stderr, "consumer: the producer did not start\n");
            return 1;
        }
        check(xfer_context_create(NULL, &ctx), "xfer_context_create");
        snprintf(address, sizeof(address), "127.0.0.1:%u", port);
        check(xfer_connect(ctx, address, &ep), "connect");
        printf("consumer: connected to %s over %s\n", address, xfer_endpoint_transport(ep));
        consumer(ctx, ep);
        xfer_endpoint_close(ep);
        xfer_context_destroy(ctx);
        return 0;
    }

    /* The producer listens on a free port (port 0) and tells the consumer which one. */
    close(pipefd[0]);
    check(xfer_context_create(NULL, &ctx), "xfer_context_create");
    check(xfer_listen(ctx, "127.0.0.1:0", &listener), "listen");
    port = xfer_listener_port(listener);
    printf("producer: listening on 127.0.0.1:%u\n", port);
    if (write(pipefd[1], &port, sizeof(port)) != sizeof(port)) {
        perror("producer: write");
        return 1;
    }
    close(pipefd[1]);
    check(xfer_accept(listener, WAIT_MS, &ep), "accept");
    printf("producer: %s connected; we agreed on %s\n", xfer_endpoint_peer(ep),
           xfer_endpoint_transport(ep));
    producer(ctx, ep);

    waitpid(pid, &status, 0);       /* the consumer has read our answer and quit */
    xfer_endpoint_close(ep);
    xfer_listener_close(listener);
    xfer_context_destroy(ctx);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "producer: the consumer failed\n");
        return 1;
    }
    printf("hello_tensors: done\n");
    return 0;
}
