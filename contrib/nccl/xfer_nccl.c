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
 * ncclNetPlugin_v8 to _v11 are exported, and nothing else (-export-symbols-regex).
 *
 * This file: the process-wide state, logging, init and finalize, the device; nccl_versions.c
 * the exported tables, nccl_conn.c the connections, nccl_data.c registration and the data
 * path.
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

ncclResult_t xn_init(ncclDebugLogger_t logger)
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

ncclResult_t xn_devices(int *ndev)
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

/* Version 11 inits once per communicator and finalizes each: the context goes with the last
 * finalize once no comm and no connect is left (an earlier version never finalizes). */
ncclResult_t xn_init_ref(ncclDebugLogger_t logger)
{
    ncclResult_t ret = xn_init(logger);

    if (ret == ncclSuccess) {
        pthread_mutex_lock(&xn.lock);
        xn.users++;
        pthread_mutex_unlock(&xn.lock);
    }
    return ret;
}

ncclResult_t xn_finalize(void)
{
    pthread_mutex_lock(&xn.lock);
    if ((xn.users > 0) && (--xn.users == 0) && xn.inited && (xn.comms == NULL) &&
        (xn.connects == NULL)) {
        xfer_context_destroy(xn.ctx);
        xn.ctx    = NULL;
        xn.inited = 0;
    }
    pthread_mutex_unlock(&xn.lock);
    return ncclSuccess;
}
