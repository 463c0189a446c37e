/*
 * libnccl-net-xfer.so driven the way NCCL's proxy drives a network plug-in: dlopen, the
 * ncclNetPlugin_v8/_v9 symbol, init/devices/getProperties, listen with the handle exchanged
 * out of band, connect and accept called in turn until both return a comm, then isend/irecv
 * with many requests in flight per comm, polled with test. Two ranks are two real processes
 * over real sockets (the transport XFERTEST_TRANSPORT names). No NCCL and no GPU are needed:
 * this is the plug-in's side of the contract, as nccl_net.h writes it down.
 */
#include "../contrib/nccl/nccl_net.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define WAIT_MS 30000
#define XN_DEREG_WAIT_MS_TEST 10000    /* the plug-in's XN_DEREG_WAIT_MS */

static void setup(void)
{
    const char *t = getenv("XFERTEST_TRANSPORT");

    setenv("XFER_TRANSPORTS", (t != NULL) ? t : "tcp", 1);
    setenv("XFER_BOOTSTRAP_TIMEOUT", "5s", 1);
    unsetenv("XFER_COMPONENT_PATH");
}

TestSuite(nccl_net, .init = setup, .timeout = 300);

static double now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static char plugin_path[4096];

static void *load_plugin(void)
{
    const char *build = getenv("XFERTEST_BUILD_DIR");
    void *h;

    cr_assert_not_null(build, "XFERTEST_BUILD_DIR is not set (run through make check)");
    snprintf(plugin_path, sizeof(plugin_path), "%s/contrib/nccl/.libs/libnccl-net-xfer.so",
             build);
    h = dlopen(plugin_path, RTLD_NOW | RTLD_LOCAL);
    cr_assert_not_null(h, "dlopen %s: %s", plugin_path, dlerror());
    return h;
}

/* ---- one API over versions 8 to 11 -------------------------------------------------------- */

typedef struct net {
    int                 version;
    const ncclNet_v8_t  *v8;
    const ncclNet_v9_t  *v9;
    const ncclNet_v10_t *v10;
    const ncclNet_v11_t *v11;
    void                *ctx;       /* version 11's init gives one */
} net_t;

static net_t net_load(int version)
{
    void *h = load_plugin();
    net_t n = {.version = version};
    char name[32];
    void *sym;

    snprintf(name, sizeof(name), "ncclNetPlugin_v%d", version);
    sym = dlsym(h, name);
    cr_assert_not_null(sym, "no %s in %s", name, plugin_path);
    n.v8  = (version == 8) ? sym : NULL;
    n.v9  = (version == 9) ? sym : NULL;
    n.v10 = (version == 10) ? sym : NULL;
    n.v11 = (version == 11) ? sym : NULL;
    return n;
}

/* A member that every version has with the same type. */
#define NET(n, fn) ((n)->v8 ? (n)->v8->fn : (n)->v9 ? (n)->v9->fn : \
                    (n)->v10 ? (n)->v10->fn : (n)->v11->fn)

static ncclResult_t net_init(net_t *n)
{
    return n->v8 ? n->v8->init(NULL) : n->v9 ? n->v9->init(NULL) :
           n->v10 ? n->v10->init(NULL, NULL) : n->v11->init(&n->ctx, 42, NULL, NULL, NULL);
}

static ncclResult_t net_listen(const net_t *n, void *handle, void **listen_comm)
{
    return n->v8 ? n->v8->listen(0, handle, listen_comm) :
           n->v9 ? n->v9->listen(0, handle, listen_comm) :
           n->v10 ? n->v10->listen(0, handle, listen_comm) :
                    n->v11->listen(n->ctx, 0, handle, listen_comm);
}

static ncclResult_t net_connect(const net_t *n, void *handle, void **send_comm,
                                ncclNetDeviceHandle_v8_t **dev_comm)
{
    ncclNetCommConfig_v10_t config = {-1};

    return n->v8 ? n->v8->connect(0, handle, send_comm, dev_comm) :
           n->v9 ? n->v9->connect(0, handle, send_comm, dev_comm) :
           n->v10 ? n->v10->connect(0, &config, handle, send_comm, dev_comm) :
                    n->v11->connect(n->ctx, 0, handle, send_comm, dev_comm);
}

static ncclResult_t net_isend(const net_t *n, void *comm, void *data, size_t size, int tag,
                              void *mh, void **req)
{
    return n->v8 ? n->v8->isend(comm, data, (int)size, tag, mh, req) :
           n->v9 ? n->v9->isend(comm, data, size, tag, mh, req) :
           n->v10 ? n->v10->isend(comm, data, size, tag, mh, NULL, req) :
                    n->v11->isend(comm, data, size, tag, mh, NULL, req);
}

static ncclResult_t net_irecv(const net_t *n, void *comm, int cnt, void **data,
                              const size_t *sizes, int *tags, void **mhs, void **req)
{
    void *ph[8] = {0};
    int s8[8];
    size_t s9[8];

    for (int i = 0; i < cnt; i++) {
        s8[i] = (int)sizes[i];
        s9[i] = sizes[i];
    }
    return n->v8 ? n->v8->irecv(comm, cnt, data, s8, tags, mhs, req) :
           n->v9 ? n->v9->irecv(comm, cnt, data, s9, tags, mhs, req) :
           n->v10 ? n->v10->irecv(comm, cnt, data, s9, tags, mhs, ph, req) :
                    n->v11->irecv(comm, cnt, data, s9, tags, mhs, ph, req);
}

/* ---- a rank ----------------------------------------------------------------------------------- */

typedef struct rank {
    net_t net;
    int   ctl;          /* socketpair to the other rank */
    int   id;
    void  *listen_comm;
    void  *send_comm;
    void  *recv_comm;
} rank_t;

/* Child-side checks end the child with a message; the parent sees its exit status. */
#define CHECK(_cond, ...) \
    do { \
        if (!(_cond)) { \
            fprintf(stderr, "[rank %d] %s:%d: ", r->id, __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__); \
            fprintf(stderr, "\n"); \
            if (r->id == 0) { \
                cr_assert_fail("rank 0 failed a check (see stderr)"); \
            } \
            _exit(1); \
        } \
    } while (0)

static void ctl_send(rank_t *r, const void *buf, size_t len)
{
    CHECK(send(r->ctl, buf, len, MSG_NOSIGNAL) == (ssize_t)len, "ctl send: %s",
          strerror(errno));
}

static void ctl_recv(rank_t *r, void *buf, size_t len)
{
    size_t got = 0;

    while (got < len) {
        struct pollfd pfd = {r->ctl, POLLIN, 0};
        ssize_t n;

        CHECK(poll(&pfd, 1, WAIT_MS) == 1, "ctl: no word from the other rank");
        n = recv(r->ctl, (char*)buf + got, len - got, 0);
        CHECK(n > 0, "ctl recv: %s", (n == 0) ? "closed" : strerror(errno));
        got += (size_t)n;
    }
}

static int ctl_readable(rank_t *r)
{
    struct pollfd pfd = {r->ctl, POLLIN, 0};

    return poll(&pfd, 1, 0) == 1;
}

static void barrier(rank_t *r)
{
    char c = 'b';

    ctl_send(r, &c, 1);
    ctl_recv(r, &c, 1);
}

/* init, one device with sane properties, listen, swap handles, connect + accept in turns. */
static void rank_connect(rank_t *r)
{
    char mine[NCCL_NET_HANDLE_MAXSIZE], theirs[NCCL_NET_HANDLE_MAXSIZE];
    ncclNetDeviceHandle_v8_t *dev_comm = NULL;
    double end;
    int ndev = -1;

    CHECK(net_init(&r->net) == ncclSuccess, "init failed");
    CHECK((NET(&r->net, devices)(&ndev) == ncclSuccess) && (ndev == 1), "%d devices", ndev);
    if (r->net.v8) {
        ncclNetProperties_v8_t p;

        CHECK(r->net.v8->getProperties(0, &p) == ncclSuccess, "getProperties");
        CHECK((strncmp(p.name, "xfer-", 5) == 0) && (p.ptrSupport & NCCL_PTR_HOST) &&
              (p.maxRecvs >= 4) && (p.speed > 0) && (p.regIsGlobal == 1),
              "properties: %s ptr %d recvs %d speed %d", p.name, p.ptrSupport, p.maxRecvs,
              p.speed);
        CHECK(r->net.v8->getProperties(1, &p) == ncclInvalidArgument, "device 1 exists");
    } else if (r->net.v9) {
        ncclNetProperties_v9_t p;

        CHECK(r->net.v9->getProperties(0, &p) == ncclSuccess, "getProperties");
        CHECK((strncmp(p.name, "xfer-", 5) == 0) && (p.ptrSupport & NCCL_PTR_HOST) &&
              (p.maxRecvs >= 4) && (p.vProps.ndevs == 1) && (p.maxP2pBytes > 0),
              "properties: %s ptr %d recvs %d ndevs %d", p.name, p.ptrSupport, p.maxRecvs,
              p.vProps.ndevs);
    } else if (r->net.v10) {
        ncclNetProperties_v10_t p;

        CHECK(r->net.v10->getProperties(0, &p) == ncclSuccess, "getProperties");
        CHECK((strncmp(p.name, "xfer-", 5) == 0) && (p.vProps.ndevs == 1) &&
              (p.maxP2pBytes > 0) && (p.maxRecvs >= 4), "properties: %s ndevs %d", p.name,
              p.vProps.ndevs);
    } else {
        ncclNetProperties_v11_t p;

        CHECK(r->net.ctx != NULL, "version 11's init gave no context");
        CHECK(r->net.v11->getProperties(0, &p) == ncclSuccess, "getProperties");
        CHECK((strncmp(p.name, "xfer-", 5) == 0) && (p.vProps.ndevs == 1) &&
              (p.maxP2pBytes > 0) && (p.maxMultiRequestSize == 1),
              "properties: %s ndevs %d multi %d", p.name, p.vProps.ndevs,
              p.maxMultiRequestSize);
    }
    CHECK(net_listen(&r->net, mine, &r->listen_comm) == ncclSuccess, "listen");
    ctl_send(r, mine, sizeof(mine));
    ctl_recv(r, theirs, sizeof(theirs));
    end = now_ms() + WAIT_MS;
    while ((r->send_comm == NULL) || (r->recv_comm == NULL)) {
        CHECK(now_ms() < end, "not connected in %d ms (send %p, recv %p)", WAIT_MS,
              r->send_comm, r->recv_comm);
        if (r->send_comm == NULL) {
            CHECK(net_connect(&r->net, theirs, &r->send_comm, &dev_comm) == ncclSuccess,
                  "connect");
        }
        if (r->recv_comm == NULL) {
            CHECK(NET(&r->net, accept)(r->listen_comm, &r->recv_comm, &dev_comm) ==
                  ncclSuccess, "accept");
        }
    }
}

static void rank_close(rank_t *r)
{
    CHECK(NET(&r->net, closeSend)(r->send_comm) == ncclSuccess, "closeSend");
    CHECK(NET(&r->net, closeRecv)(r->recv_comm) == ncclSuccess, "closeRecv");
    CHECK(NET(&r->net, closeListen)(r->listen_comm) == ncclSuccess, "closeListen");
    if (r->net.v11) {
        CHECK(r->net.v11->finalize(r->net.ctx) == ncclSuccess, "finalize");
    }
}

static uint8_t pattern(int from, size_t size, int idx, size_t i)
{
    return (uint8_t)((from * 131) ^ (size * 7) ^ (idx * 31) ^ (i * 2654435761u >> 7));
}

/* Wait for one request; 1 when done with *size, 0 on a failing test (its result in *res). */
static int wait_req(rank_t *r, void *req, int *sizes, ncclResult_t *res)
{
    double end = now_ms() + WAIT_MS;
    int done = 0;

    while (!done) {
        *res = NET(&r->net, test)(req, &done, sizes);
        if (*res != ncclSuccess) {
            return 0;
        }
        CHECK(now_ms() < end, "a request did not complete in %d ms", WAIT_MS);
    }
    return 1;
}

/*
 * Both ranks send count messages of size bytes to each other at once, tags 0..count-1,
 * keeping up to NCCL_NET_MAX_REQUESTS of each kind in flight as NCCL's proxy does; every
 * receive is 64 bytes larger than its message. Checks bytes and reported sizes.
 */
static void exchange(rank_t *r, size_t size, int count)
{
    size_t cap = size + 64;
    uint8_t *sbuf = malloc(size * (size_t)count + 1), *rbuf = malloc(cap * (size_t)count);
    void *smh, *rmh, *sreq[NCCL_NET_MAX_REQUESTS] = {0}, *rreq[NCCL_NET_MAX_REQUESTS] = {0};
    int sidx[NCCL_NET_MAX_REQUESTS], ridx[NCCL_NET_MAX_REQUESTS];
    int sent = 0, recvd = 0, sposted = 0, rposted = 0;
    double end = now_ms() + WAIT_MS * 2;

    CHECK((sbuf != NULL) && (rbuf != NULL), "malloc");
    for (int k = 0; k < count; k++) {
        for (size_t i = 0; i < size; i++) {
            sbuf[(size_t)k * size + i] = pattern(r->id, size, k, i);
        }
    }
    memset(rbuf, 0xee, cap * (size_t)count);
    CHECK(NET(&r->net, regMr)(r->send_comm, sbuf, size * (size_t)count + 1, NCCL_PTR_HOST,
                              &smh) == ncclSuccess, "regMr send");
    CHECK(NET(&r->net, regMr)(r->recv_comm, rbuf, cap * (size_t)count, NCCL_PTR_HOST, &rmh) ==
          ncclSuccess, "regMr recv");
    while ((sent < count) || (recvd < count)) {
        CHECK(now_ms() < end, "size %zu: %d of %d sent, %d received", size, sent, count,
              recvd);
        for (int s = 0; s < NCCL_NET_MAX_REQUESTS; s++) {
            ncclResult_t res;
            int done = 0, got = -1;

            if ((sreq[s] == NULL) && (sposted < count)) {
                CHECK(net_isend(&r->net, r->send_comm, sbuf + (size_t)sposted * size, size,
                                sposted, smh, &sreq[s]) == ncclSuccess, "isend");
                if (sreq[s] != NULL) {
                    sidx[s] = sposted++;
                }
            }
            if ((rreq[s] == NULL) && (rposted < count)) {
                void *data = rbuf + (size_t)rposted * cap;
                int tag    = rposted;

                CHECK(net_irecv(&r->net, r->recv_comm, 1, &data, &cap, &tag, &rmh, &rreq[s]) ==
                      ncclSuccess, "irecv");
                if (rreq[s] != NULL) {
                    ridx[s] = rposted++;
                }
            }
            if (sreq[s] != NULL) {
                res = NET(&r->net, test)(sreq[s], &done, &got);
                CHECK(res == ncclSuccess, "send test: %d", res);
                if (done) {
                    CHECK(got == (int)size, "send %d reported %d bytes of %zu", sidx[s], got,
                          size);
                    sreq[s] = NULL;
                    sent++;
                }
            }
            if (rreq[s] != NULL) {
                done = 0;
                res  = NET(&r->net, test)(rreq[s], &done, &got);
                CHECK(res == ncclSuccess, "recv test: %d", res);
                if (done) {
                    const uint8_t *p = rbuf + (size_t)ridx[s] * cap;

                    CHECK(got == (int)size, "receive %d reported %d bytes of %zu", ridx[s], got,
                          size);
                    for (size_t i = 0; i < size; i++) {
                        CHECK(p[i] == pattern(1 - r->id, size, ridx[s], i),
                              "size %zu message %d: byte %zu is wrong", size, ridx[s], i);
                    }
                    CHECK(p[size] == 0xee, "size %zu message %d: written past its end", size,
                          ridx[s]);
                    rreq[s] = NULL;
                    recvd++;
                }
            }
        }
    }
    CHECK(NET(&r->net, deregMr)(r->send_comm, smh) == ncclSuccess, "deregMr");
    CHECK(NET(&r->net, deregMr)(r->recv_comm, rmh) == ncclSuccess, "deregMr");
    free(sbuf);
    free(rbuf);
}

/* irecv of four receives at once, tags in another order than sent: each takes its tag's. */
static void grouped(rank_t *r)
{
    enum { N = 4, LEN = 3000 };
    static uint8_t out[N][LEN], in[N][LEN + 100];
    void *data[N], *sreq[N], *rreq = NULL;
    int tags[N] = {102, 100, 103, 101}, sizes[N];
    size_t caps[N];
    ncclResult_t res;

    for (int k = 0; k < N; k++) {
        memset(out[k], 'a' + k + r->id * N, LEN - k);
        data[k] = in[k];
        caps[k] = sizeof(in[k]);
    }
    CHECK(net_irecv(&r->net, r->recv_comm, N, data, caps, tags, NULL, &rreq) == ncclSuccess &&
          (rreq != NULL), "grouped irecv");
    for (int k = 0; k < N; k++) {
        sreq[k] = NULL;
        CHECK(net_isend(&r->net, r->send_comm, out[k], LEN - (size_t)k, 100 + k, NULL,
                        &sreq[k]) == ncclSuccess && (sreq[k] != NULL), "isend %d", k);
    }
    for (int k = 0; k < N; k++) {
        CHECK(wait_req(r, sreq[k], NULL, &res), "send %d: %d", k, res);
    }
    CHECK(wait_req(r, rreq, sizes, &res), "grouped receive: %d", res);
    for (int k = 0; k < N; k++) {
        int from = tags[k] - 100;   /* the sender's message k */

        CHECK(sizes[k] == LEN - from, "receive %d (tag %d): %d bytes", k, tags[k], sizes[k]);
        CHECK((in[k][0] == 'a' + from + (1 - r->id) * N) &&
              (in[k][LEN - from - 1] == in[k][0]), "receive %d (tag %d) holds another message",
              k, tags[k]);
    }
}

/* NCCL_NET_MAX_REQUESTS in flight on a comm: one more gets no request, and no error. */
static void request_bound(rank_t *r)
{
    void *reqs[NCCL_NET_MAX_REQUESTS + 1] = {0}, *extra = NULL, *rreq;
    static uint8_t zero[1];
    ncclResult_t res;
    int size;

    for (int k = 0; k < NCCL_NET_MAX_REQUESTS; k++) {
        CHECK(net_isend(&r->net, r->send_comm, zero, 0, 7, NULL, &reqs[k]) == ncclSuccess &&
              (reqs[k] != NULL), "isend %d", k);
    }
    CHECK(net_isend(&r->net, r->send_comm, zero, 0, 7, NULL, &extra) == ncclSuccess &&
          (extra == NULL), "request %d was taken", NCCL_NET_MAX_REQUESTS + 1);
    for (int k = 0; k < NCCL_NET_MAX_REQUESTS; k++) {
        void *data = zero;
        size_t cap = 0;
        int tag    = 7;

        rreq = NULL;
        CHECK(net_irecv(&r->net, r->recv_comm, 1, &data, &cap, &tag, NULL, &rreq) ==
              ncclSuccess && (rreq != NULL), "irecv %d", k);
        CHECK(wait_req(r, rreq, &size, &res) && (size == 0), "zero-byte receive %d", k);
    }
    for (int k = 0; k < NCCL_NET_MAX_REQUESTS; k++) {
        CHECK(wait_req(r, reqs[k], &size, &res) && (size == 0), "zero-byte send %d", k);
    }
}

/* A message larger than its receive: the receive's test fails, saying so; the comm goes on. */
static void truncated(rank_t *r)
{
    static uint8_t big[5000], small[1000];
    void *sreq = NULL, *rreq = NULL, *data = small;
    size_t cap = sizeof(small);
    int tag = 9, size;
    ncclResult_t res;

    CHECK(net_isend(&r->net, r->send_comm, big, sizeof(big), tag, NULL, &sreq) == ncclSuccess,
          "isend");
    CHECK(net_irecv(&r->net, r->recv_comm, 1, &data, &cap, &tag, NULL, &rreq) == ncclSuccess,
          "irecv");
    CHECK(wait_req(r, sreq, &size, &res), "send: %d", res);
    CHECK(!wait_req(r, rreq, &size, &res) && (res == ncclInvalidUsage),
          "a truncated receive ended with %d", res);
}

/*
 * deregMr of a region that operations still use never leaks it. Rank 0 deregisters a region
 * with a receive pending into it: the receive is given up, so the message rank 1 sends next
 * lands in a later receive, never in the deregistered region. Rank 0 then deregisters a
 * region with a large send outstanding: deregMr waits for the send, which rank 1 takes a
 * moment later, and succeeds.
 */
static void dereg_outstanding(rank_t *r)
{
    enum { LEN = 4096, TAG = 5 };
    size_t big = 16u << 20, cap = LEN;
    uint8_t *region = malloc(LEN), *later = malloc(LEN), *bulk = malloc(big);
    void *mh, *req = NULL, *data;
    int tag = TAG, size;
    ncclResult_t res;
    double t0;

    CHECK((region != NULL) && (later != NULL) && (bulk != NULL), "malloc");
    rank_connect(r);
    memset(region, 0xee, LEN);
    memset(bulk, 0x5a, big);
    if (r->id == 0) {
        CHECK(NET(&r->net, regMr)(r->recv_comm, region, LEN, NCCL_PTR_HOST, &mh) ==
              ncclSuccess, "regMr");
        data = region;
        CHECK(net_irecv(&r->net, r->recv_comm, 1, &data, &cap, &tag, &mh, &req) ==
              ncclSuccess && (req != NULL), "irecv");
        CHECK(NET(&r->net, deregMr)(r->recv_comm, mh) == ncclSuccess,
              "deregMr with a receive pending");
        barrier(r);                                 /* rank 1 sends now */
        data = later;
        req  = NULL;
        CHECK(net_irecv(&r->net, r->recv_comm, 1, &data, &cap, &tag, NULL, &req) ==
              ncclSuccess && (req != NULL), "irecv");
        CHECK(wait_req(r, req, &size, &res) && (size == LEN), "the later receive: %d", res);
        CHECK(later[0] == 0x17 && later[LEN - 1] == 0x17, "the later receive holds %#x",
              later[0]);
        for (size_t i = 0; i < LEN; i++) {
            CHECK(region[i] == 0xee, "byte %zu of the deregistered region was written", i);
        }
        /* a send outstanding: deregMr waits for it */
        CHECK(NET(&r->net, regMr)(r->send_comm, bulk, big, NCCL_PTR_HOST, &mh) == ncclSuccess,
              "regMr");
        req = NULL;
        CHECK(net_isend(&r->net, r->send_comm, bulk, big, TAG + 1, mh, &req) == ncclSuccess &&
              (req != NULL), "isend");
        barrier(r);                                 /* rank 1 receives in a moment */
        t0 = now_ms();
        CHECK(NET(&r->net, deregMr)(r->send_comm, mh) == ncclSuccess,
              "deregMr with a send outstanding");
        CHECK(wait_req(r, req, &size, &res), "the send: %d", res);
        CHECK(now_ms() - t0 < XN_DEREG_WAIT_MS_TEST, "deregMr took %.0f ms", now_ms() - t0);
    } else {
        barrier(r);
        memset(region, 0x17, LEN);
        CHECK(net_isend(&r->net, r->send_comm, region, LEN, TAG, NULL, &req) == ncclSuccess &&
              (req != NULL), "isend");
        CHECK(wait_req(r, req, &size, &res), "send: %d", res);
        barrier(r);
        usleep(300000);
        data = bulk;
        tag  = TAG + 1;
        req  = NULL;
        CHECK(net_irecv(&r->net, r->recv_comm, 1, &data, &big, &tag, NULL, &req) ==
              ncclSuccess && (req != NULL), "irecv");
        CHECK(wait_req(r, req, &size, &res) && (size == (int)big), "the large receive: %d",
              res);
    }
    barrier(r);
    rank_close(r);
    free(region);
    free(later);
    free(bulk);
}

static const size_t sizes[] = {0, 1, 7, 4096, 65537, 1u << 20, (4u << 20) + 3, 64u << 20};

static void rank_main(rank_t *r)
{
    rank_connect(r);
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        int count = (sizes[i] <= 65537) ? 100 : (sizes[i] <= (4u << 20) + 3) ? 12 : 3;

        exchange(r, sizes[i], count);
        barrier(r);
    }
    grouped(r);
    barrier(r);
    request_bound(r);
    barrier(r);
    truncated(r);
    barrier(r);
    rank_close(r);
}

/* Rank 1 in a child, rank 0 here; fn runs in both. */
static void two_ranks(int version, void (*fn)(rank_t *r))
{
    int sv[2], status;
    pid_t pid;

    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        rank_t r = {.ctl = sv[1], .id = 1};

        close(sv[0]);
        alarm(240);
        r.net = net_load(version);
        fn(&r);
        _exit(0);
    } else {
        rank_t r = {.ctl = sv[0], .id = 0};

        close(sv[1]);
        r.net = net_load(version);
        fn(&r);
        cr_assert_eq(waitpid(pid, &status, 0), pid);
        cr_assert(WIFEXITED(status) && (WEXITSTATUS(status) == 0), "rank 1 failed (status %#x)",
                  status);
    }
}

Test(nccl_net, v8_two_ranks_move_every_size_both_ways)
{
    two_ranks(8, rank_main);
}

Test(nccl_net, v9_two_ranks_move_every_size_both_ways)
{
    two_ranks(9, rank_main);
}

Test(nccl_net, v10_two_ranks_move_every_size_both_ways)
{
    two_ranks(10, rank_main);
}

Test(nccl_net, v11_two_ranks_move_every_size_both_ways)
{
    two_ranks(11, rank_main);
}

/* Version 11 inits per communicator and finalizes each: a finalize leaves the other
 * communicators' comms working, and after the last one a new init works again. */
static void v11_twice(rank_t *r)
{
    void *second = NULL;

    rank_connect(r);
    CHECK(r->net.v11->init(&second, 43, NULL, NULL, NULL) == ncclSuccess, "second init");
    exchange(r, 4096, 10);
    CHECK(r->net.v11->finalize(second) == ncclSuccess, "finalize of the second");
    exchange(r, 4096, 10);                  /* the first init's comms still work */
    barrier(r);
    rank_close(r);                          /* finalizes the first, the last */
    barrier(r);
    r->send_comm = r->recv_comm = r->listen_comm = NULL;
    rank_connect(r);                        /* a new init */
    exchange(r, 65537, 10);
    barrier(r);
    rank_close(r);
}

Test(nccl_net, v11_inits_and_finalizes_once_per_communicator)
{
    two_ranks(11, v11_twice);
}

Test(nccl_net, dereg_mr_with_operations_outstanding_never_leaks_the_region)
{
    two_ranks(9, dereg_outstanding);
}

/*
 * A rank closes its comms with requests in flight (as NCCL does when it aborts): its pending
 * receive and the peer's messages it never received. The peer's answer is the same on every
 * transport: a send still using its buffer at the close (64 MiB, never received) and a receive
 * posted before it fail with ncclRemoteError, never succeed or hang; a small send may have
 * completed before (its buffer was free), and from when the peer saw the close every new
 * send fails, at posting or at its test.
 */
static void close_in_flight(rank_t *r)
{
    size_t big = 64u << 20, cap = 4096;
    uint8_t *bulk = malloc(big), small[4096];
    void *req = NULL, *sreq = NULL, *bigreq = NULL, *rreq = NULL, *data = small;
    int tag = 1, size, done;
    ncclResult_t res;
    double end;

    CHECK(bulk != NULL, "malloc");
    memset(bulk, 0x33, big);
    rank_connect(r);
    if (r->id == 1) {
        CHECK(net_irecv(&r->net, r->recv_comm, 1, &data, &cap, &tag, NULL, &req) ==
              ncclSuccess && (req != NULL), "irecv");
        barrier(r);                                 /* rank 0 posts its sends */
        barrier(r);
        CHECK(NET(&r->net, closeRecv)(r->recv_comm) == ncclSuccess, "closeRecv in flight");
        CHECK(NET(&r->net, closeSend)(r->send_comm) == ncclSuccess, "closeSend");
        barrier(r);                                 /* rank 0 checks what it sees */
        CHECK(NET(&r->net, closeListen)(r->listen_comm) == ncclSuccess, "closeListen");
        free(bulk);
        return;
    }
    tag = 7;                                        /* rank 1 sends nothing */
    CHECK(net_irecv(&r->net, r->recv_comm, 1, &data, &cap, &tag, NULL, &rreq) == ncclSuccess &&
          (rreq != NULL), "irecv");
    barrier(r);
    CHECK(net_isend(&r->net, r->send_comm, bulk, big, 2, NULL, &bigreq) == ncclSuccess &&
          (bigreq != NULL), "isend 64 MiB");
    CHECK(net_isend(&r->net, r->send_comm, small, 100, 3, NULL, &sreq) == ncclSuccess &&
          (sreq != NULL), "isend 100 B");
    barrier(r);                                     /* rank 1 closes now */
    CHECK(!wait_req(r, bigreq, &size, &res) && (res == ncclRemoteError),
          "a 64 MiB send the peer never received ended with %d", res);
    CHECK(!wait_req(r, rreq, &size, &res) && (res == ncclRemoteError),
          "a receive from a peer that closed ended with %d", res);
    res = ncclSuccess;
    (void)wait_req(r, sreq, &size, &res);
    CHECK((res == ncclSuccess) || (res == ncclRemoteError), "the small send ended with %d",
          res);
    /* the peer's close is known now: a new send fails */
    sreq = NULL;
    res  = net_isend(&r->net, r->send_comm, small, 100, 4, NULL, &sreq);
    done = 0;
    for (end = now_ms() + WAIT_MS; (res == ncclSuccess) && (sreq != NULL) && !done;) {
        res = NET(&r->net, test)(sreq, &done, &size);
        CHECK(now_ms() < end, "a send after the close neither failed nor completed");
    }
    CHECK(res == ncclRemoteError, "a send after the peer closed: result %d (done %d)", res,
          done);
    barrier(r);
    rank_close(r);
    free(bulk);
}

Test(nccl_net, closing_comms_with_requests_in_flight_fails_the_peers_requests_alike)
{
    two_ranks(9, close_in_flight);
}

/*
 * The end of a run: rank 1 receives every message rank 0 sent, then closes at once; rank 0
 * tests its sends only after that. Each was received, so each succeeds, on every transport:
 * the close must not turn a delivered send into an error.
 */
static void close_after_receiving(rank_t *r)
{
    enum { N = 16 };
    size_t len[N], cap;
    uint8_t *buf[N];
    void *req[N], *data;
    int size, tag;
    ncclResult_t res;

    for (int i = 0; i < N; i++) {
        len[i] = (i % 2) ? (1u << 20) + (size_t)i : 4096;
        buf[i] = malloc(len[i]);
        CHECK(buf[i] != NULL, "malloc");
        memset(buf[i], i, len[i]);
        req[i] = NULL;
    }
    rank_connect(r);
    for (int i = 0; i < N; i++) {
        tag  = i;
        data = buf[i];
        cap  = len[i];
        if (r->id == 0) {
            CHECK(net_isend(&r->net, r->send_comm, buf[i], len[i], tag, NULL, &req[i]) ==
                  ncclSuccess && (req[i] != NULL), "isend %d", i);
        } else {
            CHECK(net_irecv(&r->net, r->recv_comm, 1, &data, &cap, &tag, NULL, &req[i]) ==
                  ncclSuccess && (req[i] != NULL), "irecv %d", i);
        }
    }
    if (r->id == 1) {
        for (int i = 0; i < N; i++) {
            CHECK(wait_req(r, req[i], &size, &res) && (size == (int)len[i]), "receive %d: %d",
                  i, res);
        }
        CHECK(NET(&r->net, closeRecv)(r->recv_comm) == ncclSuccess, "closeRecv");
        CHECK(NET(&r->net, closeSend)(r->send_comm) == ncclSuccess, "closeSend");
        barrier(r);
        CHECK(NET(&r->net, closeListen)(r->listen_comm) == ncclSuccess, "closeListen");
    } else {
        int last = 0;

        /* as NCCL's proxy does, progress comes from testing: the last send only, so that the
         * others are first tested once rank 1 has closed */
        for (double end = now_ms() + WAIT_MS; !ctl_readable(r);) {
            CHECK(now_ms() < end, "no word from rank 1");
            if (!last) {
                res = NET(&r->net, test)(req[N - 1], &last, &size);
                CHECK(res == ncclSuccess, "the last send, which rank 1 receives: %d", res);
            }
        }
        barrier(r);                                 /* rank 1 received all and closed */
        for (int i = 0; i < N - 1 + !last; i++) {
            CHECK(wait_req(r, req[i], &size, &res), "send %d, which rank 1 received, ended "
                  "with %d", i, res);
        }
        rank_close(r);
    }
    for (int i = 0; i < N; i++) {
        free(buf[i]);
    }
}

Test(nccl_net, a_send_the_peer_received_succeeds_although_the_peer_closed_at_once)
{
    two_ranks(9, close_after_receiving);
}

/* ---- a peer that dies --------------------------------------------------------------------- */

Test(nccl_net, a_dead_peer_fails_the_requests_instead_of_hanging)
{
    rank_t r = {.id = 0};
    int sv[2], status;
    ncclResult_t res;
    void *rreq = NULL, *sreq = NULL, *data;
    static uint8_t buf[1 << 16];
    size_t cap = sizeof(buf);
    int tag = 1, size, done = 0;
    double end;
    pid_t pid;

    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        rank_t c = {.ctl = sv[1], .id = 1};
        char word;

        close(sv[0]);
        alarm(120);
        c.net = net_load(8);
        rank_connect(&c);
        ctl_recv(&c, &word, 1);     /* then wait to be killed */
        pause();
        _exit(0);
    }
    close(sv[1]);
    r.ctl = sv[0];
    r.net = net_load(8);
    rank_connect(&r);
    data = buf;
    cr_assert_eq(net_irecv(&r.net, r.recv_comm, 1, &data, &cap, &tag, NULL, &rreq),
                 ncclSuccess);
    cr_assert_not_null(rreq);
    kill(pid, SIGKILL);
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    end = now_ms() + WAIT_MS;
    do {
        res = r.net.v8->test(rreq, &done, &size);
        cr_assert_lt(now_ms(), end, "the receive from a dead peer neither failed nor completed");
    } while ((res == ncclSuccess) && !done);
    cr_assert_neq(res, ncclSuccess, "a receive from a dead peer completed");
    cr_assert_eq(res, ncclRemoteError, "a receive from a dead peer: result %d", res);
    /* Sending to it fails too, without hanging. A small send may complete once copied (it
     * did over verbs, before the send comm's own connection had seen the peer go): the comm
     * must fail a later one, at posting or at its test. */
    end = now_ms() + WAIT_MS;
    res = ncclSuccess;
    while (res == ncclSuccess) {
        cr_assert_lt(now_ms(), end, "sends to a dead peer kept succeeding for %d ms", WAIT_MS);
        sreq = NULL;
        res  = net_isend(&r.net, r.send_comm, buf, 100, 2, NULL, &sreq);
        done = 0;
        while ((res == ncclSuccess) && (sreq != NULL) && !done) {
            res = r.net.v8->test(sreq, &done, &size);
            cr_assert_lt(now_ms(), end, "a send to a dead peer neither failed nor completed");
        }
        usleep(1000);
    }
    cr_assert_eq(res, ncclRemoteError, "a send to a dead peer: result %d", res);
    rank_close(&r);
}

/* ---- loading ------------------------------------------------------------------------------ */

/* The names of the symbols path's .dynsym defines (global or weak, not undefined), one per
 * line, into out; read from the ELF file itself (no binutils, which valgrind would trace). */
static int defined_dynamic_symbols(const char *path, char *out, size_t size)
{
    FILE *f = fopen(path, "rb");
    Elf64_Ehdr eh;
    Elf64_Shdr *sh = NULL;
    char *strtab = NULL;
    size_t used = 0;
    int count = -1;

    out[0] = '\0';
    if ((f == NULL) || (fread(&eh, sizeof(eh), 1, f) != 1) ||
        (memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) || (eh.e_ident[EI_CLASS] != ELFCLASS64) ||
        (eh.e_shentsize != sizeof(Elf64_Shdr))) {
        goto out;
    }
    sh = calloc(eh.e_shnum, sizeof(*sh));
    if ((sh == NULL) || (fseek(f, (long)eh.e_shoff, SEEK_SET) != 0) ||
        (fread(sh, sizeof(*sh), eh.e_shnum, f) != eh.e_shnum)) {
        goto out;
    }
    for (unsigned i = 0; i < eh.e_shnum; i++) {
        const Elf64_Shdr *str;

        if ((sh[i].sh_type != SHT_DYNSYM) || (sh[i].sh_link >= eh.e_shnum)) {
            continue;
        }
        str    = &sh[sh[i].sh_link];
        strtab = malloc(str->sh_size + 1);
        if ((strtab == NULL) || (fseek(f, (long)str->sh_offset, SEEK_SET) != 0) ||
            (fread(strtab, 1, str->sh_size, f) != str->sh_size)) {
            goto out;
        }
        strtab[str->sh_size] = '\0';
        count = 0;
        for (size_t k = 1; k < sh[i].sh_size / sizeof(Elf64_Sym); k++) {
            Elf64_Sym sym;
            int bind;

            if ((fseek(f, (long)(sh[i].sh_offset + k * sizeof(sym)), SEEK_SET) != 0) ||
                (fread(&sym, sizeof(sym), 1, f) != 1) || (sym.st_name >= str->sh_size)) {
                count = -1;
                goto out;
            }
            bind = ELF64_ST_BIND(sym.st_info);
            if ((sym.st_shndx == SHN_UNDEF) || ((bind != STB_GLOBAL) && (bind != STB_WEAK))) {
                continue;
            }
            used += (size_t)snprintf(out + used, (used < size) ? size - used : 0, "%s\n",
                                     strtab + sym.st_name);
            count++;
        }
        break;
    }
out:
    free(strtab);
    free(sh);
    if (f != NULL) {
        fclose(f);
    }
    return count;
}

Test(nccl_net, exports_only_the_plugin_tables)
{
    char names[4096];
    int n;

    load_plugin();
    n = defined_dynamic_symbols(plugin_path, names, sizeof(names));
    cr_assert_geq(n, 0, "cannot read the dynamic symbols of %s", plugin_path);
    for (int v = 8; v <= 11; v++) {
        char want[32];

        snprintf(want, sizeof(want), "ncclNetPlugin_v%d\n", v);
        cr_assert(strstr(names, want) != NULL, "no %s:\n%s", want, names);
    }
    cr_assert_eq(n, 4, "%d symbols exported, the four tables expected:\n%s", n, names);
}

Test(nccl_net, init_fails_cleanly_when_no_transport_opens)
{
    static const char *const fail[] = {"tfail", NULL};
    char *dir = tu_plugin_dir(fail);
    const ncclNet_v8_t *n;
    int ndev = -1;

    /* a transport that exists as a component but whose query fails here */
    setenv("XFER_COMPONENT_PATH", dir, 1);
    setenv("XFER_TRANSPORTS", "tfail", 1);
    n = net_load(8).v8;
    cr_assert_neq(n->init(NULL), ncclSuccess, "init succeeded with no usable transport");
    cr_assert_eq(n->devices(&ndev), ncclSuccess);
    cr_assert_eq(ndev, 0, "%d devices after a failed init", ndev);
    /* a bad environment is an error too, not an abort */
    setenv("XFER_TRANSPORTS", "no_such_transport", 1);
    cr_assert_neq(n->init(NULL), ncclSuccess, "init succeeded with XFER_TRANSPORTS invalid");
    tu_dir_remove(dir);
}

static void setup_log(void)
{
    setup();
    cr_redirect_stderr();
}

/* The plug-in's own variable (XFER_NCCL_HOST) is known to the context it creates: no
 * "unknown environment variable" for it, and a misspelling of it is pointed to it. */
Test(nccl_net, its_own_variable_is_known_and_a_misspelling_points_to_it, .init = setup_log)
{
    const ncclNet_v8_t *n;
    char log[8192];
    size_t len;
    FILE *err;

    setenv("XFER_NCCL_HOST", "127.0.0.1", 1);
    setenv("XFER_NCCL_HSOT", "127.0.0.1", 1);
    n = net_load(8).v8;
    cr_assert_eq(n->init(NULL), ncclSuccess);
    fflush(stderr);
    err = cr_get_redirected_stderr();
    len = fread(log, 1, sizeof(log) - 1, err);
    log[len] = '\0';
    cr_expect(strstr(log, "unknown environment variable XFER_NCCL_HOST ") == NULL &&
              strstr(log, "unknown environment variable XFER_NCCL_HOST;") == NULL,
              "XFER_NCCL_HOST reported unknown:\n%s", log);
    cr_expect(strstr(log, "XFER_NCCL_HSOT; did you mean XFER_NCCL_HOST?") != NULL,
              "the misspelling was not pointed to XFER_NCCL_HOST:\n%s", log);
}
