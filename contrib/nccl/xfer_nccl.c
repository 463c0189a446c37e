/*
 * libnccl-net-xfer.so: NCCL's network plug-in (NCCL_NET_PLUGIN=xfer) on top of xfer. NCCL
 * moves its data through whichever transport two peers share - verbs, tcp - chosen by xfer's
 * bootstrap as for any xfer connection, and the XFER_* environment steers it as everywhere.
 *
 * The mapping:
 * - one xfer context per process (init), one device: the context, named after the transport
 *   it ranks first;
 * - listen: an xfer listener on every address; the handle carries "host:port" of it
 *   (XFER_NCCL_HOST, else the first IPv4 address of an interface that is up and not
 *   loopback, else 127.0.0.1);
 * - connect: xfer_connect() blocks for the handshake, and NCCL's connect must not (both ranks
 *   of a pair call connect and accept from one proxy thread each), so a connect runs on a
 *   thread of its own and later calls with the same handle collect it; accept:
 *   xfer_accept(listener, 0) moves the handshakes without waiting;
 * - isend/irecv: tagged messages on the comm's endpoint, NCCL's tag as xfer's, matched in
 *   posted order per endpoint; a receive may be larger than the message; up to
 *   NCCL_NET_MAX_REQUESTS requests per comm (more: NULL, NCCL retries); irecv groups up to
 *   XN_MAX_RECVS receives in one request;
 * - regMr: xfer_mem_register (host, or CUDA memory when the CUDA driver has a device: xfer
 *   stages it); iflush: nothing to do, receives into CUDA memory are copied in before they
 *   complete.
 * Only ncclNetPlugin_v8 and ncclNetPlugin_v9 are exported (-export-symbols-regex).
 */
#include "nccl_net.h"

#include <xfer/info.h>
#include <xfer/xfer.h>

#include <arpa/inet.h>
#include <dlfcn.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XN_MAX_RECVS   8                /* receives one irecv may group (maxRecvs) */
#define XN_HANDLE_MAGIC 0x78666e63u     /* "xfnc" */
#define XN_ADDR_MAX    100

/* What listen puts in NCCL's handle, and connect reads from the peer's copy of it. */
typedef struct xn_handle {
    uint32_t magic;
    uint32_t reserved;
    char     address[XN_ADDR_MAX];     /* "host:port", NUL-terminated */
} xn_handle_t;
_Static_assert(sizeof(xn_handle_t) <= NCCL_NET_HANDLE_MAXSIZE, "handle too large for NCCL");

typedef struct xn_mr {
    xfer_mem_t *mem;                    /* NULL for a zero-length registration */
} xn_mr_t;

typedef struct xn_comm xn_comm_t;

typedef struct xn_req {
    xn_comm_t      *comm;
    int            used;
    int            n;                   /* 1 for a send, the grouped receives for irecv */
    size_t         cap[XN_MAX_RECVS];   /* a receive's buffer size */
    xfer_request_t *r[XN_MAX_RECVS];
} xn_req_t;

struct xn_comm {
    xfer_endpoint_t *ep;
    int             is_send;
    xn_req_t        reqs[NCCL_NET_MAX_REQUESTS];
};

typedef struct xn_listen {
    xfer_listener_t *listener;
} xn_listen_t;

/* A connect in progress: its thread runs xfer_connect(); NCCL's later calls find it by the
 * address of the handle it passes (which stays put between those calls). */
typedef struct xn_connect {
    struct xn_connect *next;
    const void        *key;
    char              address[XN_ADDR_MAX];
    pthread_t         thread;
    atomic_int        done;
    xfer_status_t     status;
    xfer_endpoint_t   *ep;
} xn_connect_t;

static struct {
    pthread_mutex_t   lock;
    int               inited;           /* no version up to 9 has a finalize */
    xfer_context_t    *ctx;
    ncclDebugLogger_t logger;
    char              name[64];         /* "xfer-<transport>" */
    int               ptr_support;
    int               speed_mbps;
    float             latency_us;
    xn_connect_t      *connects;
} xn = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* ---- logging ------------------------------------------------------------------------------ */

__attribute__((format(printf, 4, 5)))
static void xn_log_at(ncclDebugLogLevel level, const char *file, int line, const char *fmt, ...)
{
    char msg[512];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (xn.logger != NULL) {
        xn.logger(level, NCCL_NET | NCCL_INIT, file, line, "NET/xfer: %s", msg);
    } else if (level == NCCL_LOG_WARN) {
        fprintf(stderr, "NET/xfer: %s\n", msg);
    }
}
#define xn_warn(...) xn_log_at(NCCL_LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define xn_info(...) xn_log_at(NCCL_LOG_INFO, __FILE__, __LINE__, __VA_ARGS__)

/* An xfer status as NCCL's: the peer's doing, our resources, or a misuse. */
static ncclResult_t xn_result(xfer_status_t st)
{
    switch (st) {
    case XFER_OK:
        return ncclSuccess;
    case XFER_ERR_CONNECTION:
    case XFER_ERR_UNREACHABLE:
    case XFER_ERR_PROTOCOL:
    case XFER_ERR_TIMEOUT:
        return ncclRemoteError;
    case XFER_ERR_INVALID_PARAM:
    case XFER_ERR_TRUNCATED:
    case XFER_ERR_OUT_OF_RANGE:
        return ncclInvalidUsage;
    case XFER_ERR_NO_MEMORY:
    case XFER_ERR_NO_RESOURCE:
        return ncclSystemError;
    default:
        return ncclInternalError;
    }
}

/* ---- init and the device ------------------------------------------------------------------ */

/* Whether the CUDA driver (XFER_CUDA_LIB, as xfer loads it) has a device here. */
static int cuda_present(void)
{
    const char *lib = getenv("XFER_CUDA_LIB");
    int (*cu_init)(unsigned), (*cu_count)(int*);
    void *h = dlopen((lib != NULL) && (*lib != '\0') ? lib : "libcuda.so.1",
                     RTLD_NOW | RTLD_LOCAL);
    int count = 0;

    if (h == NULL) {
        return 0;
    }
    *(void**)&cu_init  = dlsym(h, "cuInit");
    *(void**)&cu_count = dlsym(h, "cuDeviceGetCount");
    if ((cu_init == NULL) || (cu_count == NULL) || (cu_init(0) != 0) || (cu_count(&count) != 0)) {
        count = 0;
    }
    /* the driver stays loaded: xfer uses it for CUDA registrations */
    return count > 0;
}

/* The transport the context ranks first for tagged host messages, and its estimates. */
static ncclResult_t describe(void)
{
    const xfer_select_req_t req = {XFER_CAP_TAG | XFER_CAP_MEM_HOST, 0};
    xfer_selection_t sel;
    const char *best = NULL;

    if (xfer_select(xn.ctx, &req, &sel) != XFER_OK) {
        xn_warn("cannot rank xfer's transports");
        return ncclInternalError;
    }
    for (size_t i = 0; i < sel.num_entries; i++) {
        if (sel.entries[i].rank == 0) {
            best = sel.entries[i].name;
        } else if (sel.entries[i].rank < 0) {
            xn_info("transport %s not used: %s", sel.entries[i].name, sel.entries[i].reason);
        }
    }
    if (best == NULL) {
        xfer_selection_release(&sel);
        xn_warn("no xfer transport can carry NCCL's messages here (XFER_TRANSPORTS, "
                "xfer_info -s tell why); NCCL falls back to its own");
        return ncclInternalError;
    }
    snprintf(xn.name, sizeof(xn.name), "xfer-%s", best);
    for (size_t i = 0, n = xfer_component_count(xn.ctx); i < n; i++) {
        xfer_component_info_t info;

        if ((xfer_component_get(xn.ctx, i, &info) == XFER_OK) && (info.attr != NULL) &&
            (strcmp(info.name, best) == 0)) {
            xn.speed_mbps = (int)(info.attr->bandwidth_mbs * 8.0);
            xn.latency_us = (float)info.attr->latency_us;
        }
    }
    xfer_selection_release(&sel);
    return ncclSuccess;
}

static ncclResult_t xn_init(ncclDebugLogger_t logger)
{
    ncclResult_t ret = ncclSuccess;
    xfer_status_t st;

    pthread_mutex_lock(&xn.lock);
    xn.logger = logger;
    if (xn.inited) {
        goto out;
    }
    st = xfer_context_create(NULL, &xn.ctx);
    if (st != XFER_OK) {
        xn_warn("xfer_context_create: %s; NCCL falls back to its own transports",
                xfer_status_string(st));
        xn.ctx = NULL;
        ret    = ncclInternalError;
        goto out;
    }
    ret = describe();
    if (ret != ncclSuccess) {
        xfer_context_destroy(xn.ctx);
        xn.ctx = NULL;
        goto out;
    }
    xn.ptr_support = NCCL_PTR_HOST | (cuda_present() ? NCCL_PTR_CUDA : 0);
    xn.inited      = 1;
    xn_info("using %s (%d Mbps, %.1f us, %s memory)", xn.name, xn.speed_mbps,
            (double)xn.latency_us, (xn.ptr_support & NCCL_PTR_CUDA) ? "host and CUDA" : "host");
out:
    pthread_mutex_unlock(&xn.lock);
    return ret;
}

static ncclResult_t xn_devices(int *ndev)
{
    *ndev = (xn.ctx != NULL) ? 1 : 0;
    return ncclSuccess;
}

static ncclResult_t check_dev(int dev)
{
    if ((xn.ctx == NULL) || (dev != 0)) {
        xn_warn("device %d does not exist (the plug-in has one, 0, after a successful init)",
                dev);
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}

static ncclResult_t xn_get_properties_v8(int dev, ncclNetProperties_v8_t *props)
{
    ncclResult_t ret = check_dev(dev);

    if (ret != ncclSuccess) {
        return ret;
    }
    memset(props, 0, sizeof(*props));
    props->name             = xn.name;
    props->pciPath          = NULL;     /* not one NIC: NCCL places it by the CPU */
    props->guid             = 0;
    props->ptrSupport       = xn.ptr_support;
    props->regIsGlobal      = 1;        /* a registration belongs to the context, not a comm */
    props->speed            = xn.speed_mbps;
    props->port             = 0;
    props->latency          = xn.latency_us;
    props->maxComms         = 1024 * 1024;
    props->maxRecvs         = XN_MAX_RECVS;
    props->netDeviceType    = NCCL_NET_DEVICE_HOST;
    props->netDeviceVersion = NCCL_NET_DEVICE_INVALID_VERSION;
    return ncclSuccess;
}

static ncclResult_t xn_get_properties_v9(int dev, ncclNetProperties_v9_t *props)
{
    ncclNetProperties_v8_t p8;
    ncclResult_t ret = xn_get_properties_v8(dev, &p8);

    if (ret != ncclSuccess) {
        return ret;
    }
    memset(props, 0, sizeof(*props));
    props->name             = p8.name;
    props->pciPath          = p8.pciPath;
    props->guid             = p8.guid;
    props->ptrSupport       = p8.ptrSupport;
    props->regIsGlobal      = p8.regIsGlobal;
    props->forceFlush       = 0;
    props->speed            = p8.speed;
    props->port             = p8.port;
    props->latency          = p8.latency;
    props->maxComms         = p8.maxComms;
    props->maxRecvs         = p8.maxRecvs;
    props->netDeviceType    = p8.netDeviceType;
    props->netDeviceVersion = p8.netDeviceVersion;
    props->vProps.ndevs     = 1;
    props->vProps.devs[0]   = dev;
    props->maxP2pBytes      = (size_t)1 << 40;
    props->maxCollBytes     = (size_t)1 << 40;
    return ncclSuccess;
}

/* ---- connections -------------------------------------------------------------------------- */

/* The host peers reach this process at: XFER_NCCL_HOST, else the first IPv4 address of an
 * interface that is up and not loopback, else 127.0.0.1. */
static void advertised_host(char *buf, size_t size)
{
    const char *env = getenv("XFER_NCCL_HOST");
    struct ifaddrs *ifs = NULL;

    if ((env != NULL) && (*env != '\0')) {
        snprintf(buf, size, "%s", env);
        return;
    }
    snprintf(buf, size, "127.0.0.1");
    if (getifaddrs(&ifs) != 0) {
        return;
    }
    for (struct ifaddrs *i = ifs; i != NULL; i = i->ifa_next) {
        if ((i->ifa_addr != NULL) && (i->ifa_addr->sa_family == AF_INET) &&
            (i->ifa_flags & IFF_UP) && !(i->ifa_flags & IFF_LOOPBACK)) {
            inet_ntop(AF_INET, &((struct sockaddr_in*)i->ifa_addr)->sin_addr, buf,
                      (socklen_t)size);
            break;
        }
    }
    freeifaddrs(ifs);
}

static ncclResult_t xn_listen(int dev, void *handle, void **listen_comm)
{
    xn_handle_t *h = handle;
    char host[64];
    xn_listen_t *lc;
    xfer_status_t st;
    ncclResult_t ret = check_dev(dev);

    *listen_comm = NULL;
    if (ret != ncclSuccess) {
        return ret;
    }
    lc = calloc(1, sizeof(*lc));
    if (lc == NULL) {
        return ncclSystemError;
    }
    st = xfer_listen(xn.ctx, ":0", &lc->listener);
    if (st != XFER_OK) {
        xn_warn("xfer_listen: %s", xfer_status_string(st));
        free(lc);
        return xn_result(st);
    }
    advertised_host(host, sizeof(host));
    memset(handle, 0, NCCL_NET_HANDLE_MAXSIZE);
    h->magic = XN_HANDLE_MAGIC;
    snprintf(h->address, sizeof(h->address), strchr(host, ':') ? "[%s]:%u" : "%s:%u", host,
             (unsigned)xfer_listener_port(lc->listener));
    xn_info("listening at %s", h->address);
    *listen_comm = lc;
    return ncclSuccess;
}

static xn_comm_t *comm_new(xfer_endpoint_t *ep, int is_send)
{
    xn_comm_t *c = calloc(1, sizeof(*c));

    if (c == NULL) {
        xfer_endpoint_close_nb(ep, XFER_CLOSE_FLAG_FORCE, NULL, NULL, NULL);
        return NULL;
    }
    c->ep      = ep;
    c->is_send = is_send;
    return c;
}

static void *connect_thread(void *arg)
{
    xn_connect_t *pc = arg;

    pc->status = xfer_connect(xn.ctx, pc->address, &pc->ep);
    atomic_store(&pc->done, 1);
    return NULL;
}

static ncclResult_t xn_connect(int dev, void *handle, void **send_comm,
                               ncclNetDeviceHandle_v8_t **dev_comm)
{
    const xn_handle_t *h = handle;
    xn_connect_t *pc, **pp;
    ncclResult_t ret = check_dev(dev);

    *send_comm = NULL;
    if (ret != ncclSuccess) {
        return ret;
    }
    if ((dev_comm != NULL) && (*dev_comm != NULL)) {
        xn_warn("device offload was asked for; this plug-in has none");
        return ncclInvalidUsage;
    }
    pthread_mutex_lock(&xn.lock);
    for (pp = &xn.connects; (*pp != NULL) && ((*pp)->key != handle); pp = &(*pp)->next) {
    }
    pc = *pp;
    if (pc == NULL) {
        /* the first call for this handle: it came from the peer, check it as such */
        if ((h->magic != XN_HANDLE_MAGIC) ||
            (memchr(h->address, '\0', sizeof(h->address)) == NULL)) {
            pthread_mutex_unlock(&xn.lock);
            xn_warn("connect: the handle is not one of this plug-in's listen handles");
            return ncclInvalidArgument;
        }
        pc = calloc(1, sizeof(*pc));
        if (pc == NULL) {
            pthread_mutex_unlock(&xn.lock);
            return ncclSystemError;
        }
        pc->key = handle;
        snprintf(pc->address, sizeof(pc->address), "%s", h->address);
        if (pthread_create(&pc->thread, NULL, connect_thread, pc) != 0) {
            pthread_mutex_unlock(&xn.lock);
            free(pc);
            xn_warn("connect to %s: cannot start its thread", h->address);
            return ncclSystemError;
        }
        pc->next    = xn.connects;
        xn.connects = pc;
        pthread_mutex_unlock(&xn.lock);
        return ncclSuccess;     /* called again until *send_comm is set */
    }
    if (!atomic_load(&pc->done)) {
        pthread_mutex_unlock(&xn.lock);
        return ncclSuccess;
    }
    *pp = pc->next;
    pthread_mutex_unlock(&xn.lock);
    pthread_join(pc->thread, NULL);
    if (pc->status != XFER_OK) {
        xn_warn("connect to %s: %s", pc->address, xfer_status_string(pc->status));
        ret = xn_result(pc->status);
        free(pc);
        return ret;
    }
    xn_info("connected to %s over %s", pc->address, xfer_endpoint_transport(pc->ep));
    *send_comm = comm_new(pc->ep, 1);
    free(pc);
    return (*send_comm != NULL) ? ncclSuccess : ncclSystemError;
}

static ncclResult_t xn_accept(void *listen_comm, void **recv_comm,
                              ncclNetDeviceHandle_v8_t **dev_comm)
{
    xn_listen_t *lc = listen_comm;
    xfer_endpoint_t *ep;
    xfer_status_t st;

    *recv_comm = NULL;
    if ((dev_comm != NULL) && (*dev_comm != NULL)) {
        xn_warn("device offload was asked for; this plug-in has none");
        return ncclInvalidUsage;
    }
    st = xfer_accept(lc->listener, 0, &ep);
    if (st != XFER_OK) {
        /* nothing yet (XFER_ERR_TIMEOUT), or a handshake that failed - a stranger, a peer
         * that went; xfer logged it - after which the listener keeps working */
        if (st != XFER_ERR_TIMEOUT) {
            xn_info("accept: a handshake failed: %s", xfer_status_string(st));
        }
        return ncclSuccess;
    }
    xn_info("accepted %s over %s", xfer_endpoint_peer(ep), xfer_endpoint_transport(ep));
    *recv_comm = comm_new(ep, 0);
    return (*recv_comm != NULL) ? ncclSuccess : ncclSystemError;
}

/* ---- memory ------------------------------------------------------------------------------- */

static ncclResult_t xn_reg_mr(void *comm, void *data, size_t size, int type, void **mhandle)
{
    xn_mr_t *mr;
    xfer_status_t st;

    (void)comm;
    *mhandle = NULL;
    if ((type != NCCL_PTR_HOST) && !((type == NCCL_PTR_CUDA) &&
                                     (xn.ptr_support & NCCL_PTR_CUDA))) {
        xn_warn("regMr: memory type %d is not one this plug-in moves", type);
        return ncclInvalidArgument;
    }
    mr = calloc(1, sizeof(*mr));
    if (mr == NULL) {
        return ncclSystemError;
    }
    if (size > 0) {
        st = xfer_mem_register(xn.ctx, data, size,
                               (type == NCCL_PTR_CUDA) ? XFER_MEM_CUDA : XFER_MEM_HOST,
                               &mr->mem);
        if (st != XFER_OK) {
            xn_warn("regMr of %zu bytes at %p: %s", size, data, xfer_status_string(st));
            free(mr);
            return xn_result(st);
        }
    }
    *mhandle = mr;
    return ncclSuccess;
}

static ncclResult_t xn_reg_mr_dmabuf(void *comm, void *data, size_t size, int type,
                                     uint64_t offset, int fd, void **mhandle)
{
    (void)comm; (void)data; (void)size; (void)type; (void)offset; (void)fd;
    *mhandle = NULL;
    xn_warn("regMrDmaBuf: DMA-BUF registration is not supported (ptrSupport does not claim it)");
    return ncclInvalidUsage;
}

static ncclResult_t xn_dereg_mr(void *comm, void *mhandle)
{
    xn_mr_t *mr = mhandle;

    (void)comm;
    if (mr != NULL) {
        if (mr->mem != NULL) {
            xfer_mem_deregister(mr->mem);
        }
        free(mr);
    }
    return ncclSuccess;
}

static xfer_mem_t *mem_of(void *mhandle)
{
    return (mhandle != NULL) ? ((xn_mr_t*)mhandle)->mem : NULL;
}

/* ---- data --------------------------------------------------------------------------------- */

static xn_req_t *req_get(xn_comm_t *c)
{
    for (int i = 0; i < NCCL_NET_MAX_REQUESTS; i++) {
        if (!c->reqs[i].used) {
            memset(&c->reqs[i], 0, sizeof(c->reqs[i]));
            c->reqs[i].used = 1;
            c->reqs[i].comm = c;
            return &c->reqs[i];
        }
    }
    return NULL;
}

/* Release what r holds, done or not (a pending xfer request goes when it completes). */
static void req_put(xn_req_t *r)
{
    for (int i = 0; i < r->n; i++) {
        if (r->r[i] != NULL) {
            xfer_request_release(r->r[i]);
            r->r[i] = NULL;
        }
    }
    r->used = 0;
}

static ncclResult_t isend_common(void *send_comm, void *data, size_t size, int tag,
                                 void *mhandle, void **request)
{
    xn_comm_t *c = send_comm;
    xn_req_t *r;
    xfer_status_t st;

    *request = NULL;
    if ((c == NULL) || !c->is_send) {
        xn_warn("isend on a comm that is not a send comm");
        return ncclInvalidArgument;
    }
    r = req_get(c);
    if (r == NULL) {
        return ncclSuccess;     /* NCCL_NET_MAX_REQUESTS in flight: NCCL tries again */
    }
    r->n = 1;
    st   = xfer_tag_send(c->ep, (uint32_t)tag, data, size, mem_of(mhandle), NULL, NULL,
                         &r->r[0]);
    if ((st != XFER_OK) && (st != XFER_INPROGRESS)) {
        xn_warn("isend of %zu bytes, tag %d: %s", size, tag, xfer_status_string(st));
        req_put(r);
        return xn_result(st);
    }
    *request = r;
    return ncclSuccess;
}

static ncclResult_t xn_isend_v8(void *send_comm, void *data, int size, int tag, void *mhandle,
                                void **request)
{
    if (size < 0) {
        xn_warn("isend of %d bytes", size);
        return ncclInvalidArgument;
    }
    return isend_common(send_comm, data, (size_t)size, tag, mhandle, request);
}

static ncclResult_t xn_isend_v9(void *send_comm, void *data, size_t size, int tag,
                                void *mhandle, void **request)
{
    return isend_common(send_comm, data, size, tag, mhandle, request);
}

/* sizes8 or sizes9: the receive buffers' sizes, as version 8 or 9 passes them. */
static ncclResult_t irecv_common(void *recv_comm, int n, void **data, const int *sizes8,
                                 const size_t *sizes9, int *tags, void **mhandles,
                                 void **request)
{
    xn_comm_t *c = recv_comm;
    xn_req_t *r;
    xfer_status_t st;

    *request = NULL;
    if ((c == NULL) || c->is_send) {
        xn_warn("irecv on a comm that is not a receive comm");
        return ncclInvalidArgument;
    }
    if ((n < 1) || (n > XN_MAX_RECVS)) {
        xn_warn("irecv of %d receives at once (1 to %d)", n, XN_MAX_RECVS);
        return ncclInvalidArgument;
    }
    r = req_get(c);
    if (r == NULL) {
        return ncclSuccess;
    }
    for (int i = 0; i < n; i++) {
        if ((sizes8 != NULL) && (sizes8[i] < 0)) {
            xn_warn("irecv into %d bytes", sizes8[i]);
            req_put(r);
            return ncclInvalidArgument;
        }
        r->cap[i] = (sizes8 != NULL) ? (size_t)sizes8[i] : sizes9[i];
        st        = xfer_tag_recv(xn.ctx, c->ep, (uint32_t)tags[i], UINT64_MAX, data[i],
                                  r->cap[i], mem_of((mhandles != NULL) ? mhandles[i] : NULL),
                                  NULL, NULL, &r->r[i]);
        r->n      = i + 1;
        if ((st != XFER_OK) && (st != XFER_INPROGRESS)) {
            xn_warn("irecv %d of %d (%zu bytes, tag %d): %s", i + 1, n, r->cap[i], tags[i],
                    xfer_status_string(st));
            r->n = i;
            for (int j = 0; j < i; j++) {
                xfer_request_cancel(r->r[j]);
            }
            req_put(r);
            return xn_result(st);
        }
    }
    *request = r;
    return ncclSuccess;
}

static ncclResult_t xn_irecv_v8(void *recv_comm, int n, void **data, int *sizes, int *tags,
                                void **mhandles, void **request)
{
    return irecv_common(recv_comm, n, data, sizes, NULL, tags, mhandles, request);
}

static ncclResult_t xn_irecv_v9(void *recv_comm, int n, void **data, size_t *sizes, int *tags,
                                void **mhandles, void **request)
{
    return irecv_common(recv_comm, n, data, NULL, sizes, tags, mhandles, request);
}

static ncclResult_t xn_iflush(void *recv_comm, int n, void **data, int *sizes, void **mhandles,
                              void **request)
{
    (void)recv_comm; (void)n; (void)data; (void)sizes; (void)mhandles;
    /* a receive into CUDA memory completes after its bytes were copied in: nothing to flush */
    *request = NULL;
    return ncclSuccess;
}

static ncclResult_t xn_test(void *request, int *done, int *sizes)
{
    xn_req_t *r = request;
    ncclResult_t ret = ncclSuccess;

    *done = 0;
    if ((r == NULL) || !r->used) {
        xn_warn("test of a request that is not in flight");
        return ncclInvalidArgument;
    }
    for (int i = 0; i < r->n; i++) {
        if (xfer_request_test(r->r[i]) == XFER_INPROGRESS) {
            return ncclSuccess;
        }
    }
    for (int i = 0; i < r->n; i++) {
        xfer_status_t st = xfer_request_test(r->r[i]);
        size_t len       = xfer_request_length(r->r[i]);

        if (st == XFER_ERR_TRUNCATED) {
            xn_warn("a message of %zu bytes arrived for a receive of %zu (tag %llu)", len,
                    r->cap[i], (unsigned long long)xfer_request_tag(r->r[i]));
        } else if (st != XFER_OK) {
            xn_warn("%s on %s: %s", r->comm->is_send ? "send" : "receive",
                    xfer_endpoint_peer(r->comm->ep), xfer_status_string(st));
        }
        if ((st != XFER_OK) && (ret == ncclSuccess)) {
            ret = xn_result(st);
        }
        if (sizes != NULL) {
            sizes[i] = (len > (size_t)INT32_MAX) ? INT32_MAX : (int)len;
        }
    }
    req_put(r);
    *done = 1;
    return ret;
}

/* ---- closing ------------------------------------------------------------------------------ */

static ncclResult_t close_comm(xn_comm_t *c)
{
    if (c == NULL) {
        return ncclSuccess;
    }
    for (int i = 0; i < NCCL_NET_MAX_REQUESTS; i++) {
        if (c->reqs[i].used) {
            req_put(&c->reqs[i]);   /* NCCL no longer tests them; they go with the endpoint */
        }
    }
    xfer_endpoint_close(c->ep);     /* flushes what was reported sent, bounded in time */
    free(c);
    return ncclSuccess;
}

static ncclResult_t xn_close_send(void *send_comm)
{
    return close_comm(send_comm);
}

static ncclResult_t xn_close_recv(void *recv_comm)
{
    return close_comm(recv_comm);
}

static ncclResult_t xn_close_listen(void *listen_comm)
{
    xn_listen_t *lc = listen_comm;

    if (lc != NULL) {
        xfer_listener_close(lc->listener);
        free(lc);
    }
    return ncclSuccess;
}

/* ---- the exported tables ------------------------------------------------------------------ */

__attribute__((visibility("default")))
const ncclNet_v8_t ncclNetPlugin_v8 = {
    .name          = "xfer",
    .init          = xn_init,
    .devices       = xn_devices,
    .getProperties = xn_get_properties_v8,
    .listen        = xn_listen,
    .connect       = xn_connect,
    .accept        = xn_accept,
    .regMr         = xn_reg_mr,
    .regMrDmaBuf   = xn_reg_mr_dmabuf,
    .deregMr       = xn_dereg_mr,
    .isend         = xn_isend_v8,
    .irecv         = xn_irecv_v8,
    .iflush        = xn_iflush,
    .test          = xn_test,
    .closeSend     = xn_close_send,
    .closeRecv     = xn_close_recv,
    .closeListen   = xn_close_listen,
    .getDeviceMr   = NULL,
    .irecvConsumed = NULL,
};

__attribute__((visibility("default")))
const ncclNet_v9_t ncclNetPlugin_v9 = {
    .name          = "xfer",
    .init          = xn_init,
    .devices       = xn_devices,
    .getProperties = xn_get_properties_v9,
    .listen        = xn_listen,
    .connect       = xn_connect,
    .accept        = xn_accept,
    .regMr         = xn_reg_mr,
    .regMrDmaBuf   = xn_reg_mr_dmabuf,
    .deregMr       = xn_dereg_mr,
    .isend         = xn_isend_v9,
    .irecv         = xn_irecv_v9,
    .iflush        = xn_iflush,
    .test          = xn_test,
    .closeSend     = xn_close_send,
    .closeRecv     = xn_close_recv,
    .closeListen   = xn_close_listen,
    .getDeviceMr   = NULL,
    .irecvConsumed = NULL,
    .makeVDevice   = NULL,
};
