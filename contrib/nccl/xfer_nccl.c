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
 *
 * This file: the process-wide state, logging, init, the device and the exported tables;
 * nccl_conn.c the connections, nccl_data.c registration and the data path.
 */
#include "nccl_plugin.h"

#include <xfer/info.h>

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

xn_state_t xn = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* ---- logging ------------------------------------------------------------------------------ */

void xn_log_at(ncclDebugLogLevel level, const char *file, int line, const char *fmt, ...)
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

ncclResult_t xn_result(xfer_status_t st)
{
    switch (st) {
    case XFER_OK:
        return ncclSuccess;
    case XFER_ERR_CONNECTION:
    case XFER_ERR_PEER_CLOSED:
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
    /* the plug-in's own variables: read here (nccl_conn.c), not by a component */
    static const char *const env_names[] = {"XFER_NCCL_HOST", NULL};
    xfer_context_params_t params = {.size = sizeof(params), .env_names = env_names};
    ncclResult_t ret = ncclSuccess;
    xfer_status_t st;

    pthread_mutex_lock(&xn.lock);
    xn.logger = logger;
    if (xn.inited) {
        goto out;
    }
    st = xfer_context_create(&params, &xn.ctx);
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

ncclResult_t xn_check_dev(int dev)
{
    if ((xn.ctx == NULL) || (dev != 0)) {
        xn_warn("device %d does not exist (the plug-in has one, 0, after a successful init)",
                dev);
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}

/* The fields versions 8 and 9 share (same names, different structs), filled from xn. */
#define XN_PROPS_COMMON(_p) \
    do { \
        memset((_p), 0, sizeof(*(_p))); \
        (_p)->name             = xn.name; \
        (_p)->pciPath          = NULL;  /* not one NIC: NCCL places it by the CPU */ \
        (_p)->ptrSupport       = xn.ptr_support; \
        (_p)->regIsGlobal      = 1;     /* a registration is the context's, not a comm's */ \
        (_p)->speed            = xn.speed_mbps; \
        (_p)->latency          = xn.latency_us; \
        (_p)->maxComms         = 1024 * 1024; \
        (_p)->maxRecvs         = XN_MAX_RECVS; \
        (_p)->netDeviceType    = NCCL_NET_DEVICE_HOST; \
        (_p)->netDeviceVersion = NCCL_NET_DEVICE_INVALID_VERSION; \
    } while (0)

static ncclResult_t xn_get_properties_v8(int dev, ncclNetProperties_v8_t *props)
{
    ncclResult_t ret = xn_check_dev(dev);

    if (ret == ncclSuccess) {
        XN_PROPS_COMMON(props);
    }
    return ret;
}

static ncclResult_t xn_get_properties_v9(int dev, ncclNetProperties_v9_t *props)
{
    ncclResult_t ret = xn_check_dev(dev);

    if (ret != ncclSuccess) {
        return ret;
    }
    XN_PROPS_COMMON(props);
    props->vProps.ndevs   = 1;
    props->vProps.devs[0] = dev;
    props->maxP2pBytes    = (size_t)1 << 40;
    props->maxCollBytes   = (size_t)1 << 40;
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
