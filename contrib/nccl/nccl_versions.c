/*
 * The tables libnccl-net-xfer.so exports, one per version of NCCL's plug-in interface that it
 * speaks (8 to 11; NCCL 2.28 looks for 11 first), and the thin wrappers where a version calls
 * differently: properties, init and finalize, a context argument, profiler handles. What the
 * calls do is the same for every version (xfer_nccl.c, nccl_conn.c, nccl_data.c).
 */
#include "nccl_plugin.h"

#include <string.h>

/* The fields every version shares (same names, different structs), filled from xn. */
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

/* Versions 9 to 11 add one virtual device over the device, and transfer size limits. */
#define XN_PROPS_V9(_p, _dev) \
    do { \
        XN_PROPS_COMMON(_p); \
        (_p)->vProps.ndevs   = 1; \
        (_p)->vProps.devs[0] = (_dev); \
        (_p)->maxP2pBytes    = (size_t)1 << 40; \
        (_p)->maxCollBytes   = (size_t)1 << 40; \
    } while (0)

static ncclResult_t xn_get_properties_v9(int dev, ncclNetProperties_v9_t *props)
{
    ncclResult_t ret = xn_check_dev(dev);

    if (ret == ncclSuccess) {
        XN_PROPS_V9(props, dev);
    }
    return ret;
}

static ncclResult_t xn_get_properties_v10(int dev, ncclNetProperties_v10_t *props)
{
    ncclResult_t ret = xn_check_dev(dev);

    if (ret == ncclSuccess) {
        XN_PROPS_V9(props, dev);
    }
    return ret;
}

static ncclResult_t xn_get_properties_v11(int dev, ncclNetProperties_v11_t *props)
{
    ncclResult_t ret = xn_check_dev(dev);

    if (ret == ncclSuccess) {
        XN_PROPS_V9(props, dev);
        props->maxMultiRequestSize = 1;     /* one request is one operation */
    }
    return ret;
}

/* ---- what versions 10 and 11 call differently --------------------------------------------- */

static ncclResult_t xn_init_v10(ncclDebugLogger_t logger, ncclProfilerCallback_t prof)
{
    (void)prof;
    return xn_init(logger);
}

static ncclResult_t xn_connect_v10(int dev, ncclNetCommConfig_v10_t *config, void *handle,
                                   void **send_comm, ncclNetDeviceHandle_v10_t **dev_comm)
{
    (void)config;       /* a traffic class: xfer's transports have none to set */
    return xn_connect(dev, handle, send_comm, dev_comm);
}

static ncclResult_t xn_isend_v10(void *send_comm, void *data, size_t size, int tag,
                                 void *mhandle, void *phandle, void **request)
{
    (void)phandle;
    return xn_isend_v9(send_comm, data, size, tag, mhandle, request);
}

static ncclResult_t xn_irecv_v10(void *recv_comm, int n, void **data, size_t *sizes, int *tags,
                                 void **mhandles, void **phandles, void **request)
{
    (void)phandles;
    return xn_irecv_v9(recv_comm, n, data, sizes, tags, mhandles, request);
}

/* Version 11's context is the process's: every init of it hands out the same. */
static ncclResult_t xn_init_v11(void **ctx, uint64_t comm_id, ncclNetCommConfig_v11_t *config,
                                ncclDebugLogger_t logger, ncclProfilerCallback_t prof)
{
    ncclResult_t ret;

    (void)comm_id; (void)config; (void)prof;
    *ctx = NULL;
    ret  = xn_init_ref(logger);
    if (ret == ncclSuccess) {
        *ctx = &xn;
    }
    return ret;
}

static ncclResult_t xn_listen_v11(void *ctx, int dev, void *handle, void **listen_comm)
{
    (void)ctx;
    return xn_listen(dev, handle, listen_comm);
}

static ncclResult_t xn_connect_v11(void *ctx, int dev, void *handle, void **send_comm,
                                   ncclNetDeviceHandle_v11_t **dev_comm)
{
    (void)ctx;
    return xn_connect(dev, handle, send_comm, dev_comm);
}

static ncclResult_t xn_finalize_v11(void *ctx)
{
    if (ctx != &xn) {
        xn_warn("finalize of a context this plug-in did not give");
        return ncclInvalidArgument;
    }
    return xn_finalize();
}

/* ---- the exported tables ------------------------------------------------------------------ */

/* The members every version has with the same signature, and so the same function. */
#define XN_NET_SAME \
    .name          = "xfer", \
    .devices       = xn_devices, \
    .accept        = xn_accept, \
    .regMr         = xn_reg_mr, \
    .regMrDmaBuf   = xn_reg_mr_dmabuf, \
    .deregMr       = xn_dereg_mr, \
    .iflush        = xn_iflush, \
    .test          = xn_test, \
    .closeSend     = xn_close_send, \
    .closeRecv     = xn_close_recv, \
    .closeListen   = xn_close_listen, \
    .getDeviceMr   = NULL, \
    .irecvConsumed = NULL

__attribute__((visibility("default")))
const ncclNet_v8_t ncclNetPlugin_v8 = {
    XN_NET_SAME,
    .init          = xn_init,
    .getProperties = xn_get_properties_v8,
    .listen        = xn_listen,
    .connect       = xn_connect,
    .isend         = xn_isend_v8,
    .irecv         = xn_irecv_v8,
};

__attribute__((visibility("default")))
const ncclNet_v9_t ncclNetPlugin_v9 = {
    XN_NET_SAME,
    .init          = xn_init,
    .getProperties = xn_get_properties_v9,
    .listen        = xn_listen,
    .connect       = xn_connect,
    .isend         = xn_isend_v9,
    .irecv         = xn_irecv_v9,
    .makeVDevice   = NULL,
};

__attribute__((visibility("default")))
const ncclNet_v10_t ncclNetPlugin_v10 = {
    XN_NET_SAME,
    .init          = xn_init_v10,
    .getProperties = xn_get_properties_v10,
    .listen        = xn_listen,
    .connect       = xn_connect_v10,
    .isend         = xn_isend_v10,
    .irecv         = xn_irecv_v10,
    .makeVDevice   = NULL,
};

__attribute__((visibility("default")))
const ncclNet_v11_t ncclNetPlugin_v11 = {
    XN_NET_SAME,
    .init          = xn_init_v11,
    .getProperties = xn_get_properties_v11,
    .listen        = xn_listen_v11,
    .connect       = xn_connect_v11,
    .isend         = xn_isend_v10,
    .irecv         = xn_irecv_v10,
    .makeVDevice   = NULL,
    .finalize      = xn_finalize_v11,
    .setNetAttr    = NULL,     /* NCCL's hints about peers and flows: nothing to tune here */
};
