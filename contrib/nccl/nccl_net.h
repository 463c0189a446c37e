/*
 * NCCL's network plug-in interface, versions 8 to 11: the types a plug-in exports and NCCL
 * calls. Written from NCCL's published plug-in headers (NVIDIA/nccl, plugins/net/example/nccl,
 * as of NCCL 2.28.9: err.h, common.h, net_device.h, net_v8.h to net_v11.h; Apache-2.0,
 * Copyright (c) 2017-2026
 * NVIDIA CORPORATION & AFFILIATES), field for field and in the same order, because NCCL reads
 * these structs by layout. Only what this plug-in uses is kept; nothing here is xfer's.
 */
#ifndef XFER_NCCL_NET_H
#define XFER_NCCL_NET_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    ncclSuccess            = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError        = 2,
    ncclInternalError      = 3,
    ncclInvalidArgument    = 4,
    ncclInvalidUsage       = 5,
    ncclRemoteError        = 6,
} ncclResult_t;

typedef enum {
    NCCL_LOG_NONE    = 0,
    NCCL_LOG_VERSION = 1,
    NCCL_LOG_WARN    = 2,
    NCCL_LOG_INFO    = 3,
    NCCL_LOG_ABORT   = 4,
    NCCL_LOG_TRACE   = 5,
} ncclDebugLogLevel;

#define NCCL_INIT 1ul       /* ncclDebugLogSubSys: the two this plug-in logs under */
#define NCCL_NET  16ul

typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags,
                                  const char *file, int line, const char *fmt, ...);
/* NCCL's profiler hook (version 10 on); this plug-in records no events of its own */
typedef ncclResult_t (*ncclProfilerCallback_t)(void **eHandle, int type, void *phandle,
                                               int64_t pluginId, void *extData);

#define NCCL_NET_HANDLE_MAXSIZE 128
#define NCCL_PTR_HOST           0x1
#define NCCL_PTR_CUDA           0x2
#define NCCL_PTR_DMABUF         0x4
#define NCCL_NET_MAX_REQUESTS   32      /* requests NCCL keeps in flight per comm */
#define NCCL_NET_DEVICE_INVALID_VERSION 0x0
#define NCCL_NET_MAX_DEVS_PER_NIC_V9    4

typedef enum {
    NCCL_NET_DEVICE_HOST   = 0,
    NCCL_NET_DEVICE_UNPACK = 1,
} ncclNetDeviceType;

typedef struct {
    ncclNetDeviceType netDeviceType;
    int               netDeviceVersion;
    void              *handle;
    size_t            size;
    int               needsProxyProgress;
} ncclNetDeviceHandle_v8_t;
typedef ncclNetDeviceHandle_v8_t ncclNetDeviceHandle_v9_t;
typedef ncclNetDeviceHandle_v9_t ncclNetDeviceHandle_v10_t;
typedef ncclNetDeviceHandle_v10_t ncclNetDeviceHandle_v11_t;

/* ---- version 8 (NCCL 2.19 and later) ------------------------------------------------------ */

typedef struct {
    char              *name;
    char              *pciPath;
    uint64_t          guid;
    int               ptrSupport;       /* NCCL_PTR_* */
    int               regIsGlobal;      /* regMr is not tied to a comm */
    int               speed;            /* Mbps */
    int               port;
    float             latency;          /* us; 0: NCCL's default */
    int               maxComms;
    int               maxRecvs;         /* receives one irecv may group */
    ncclNetDeviceType netDeviceType;
    int               netDeviceVersion;
} ncclNetProperties_v8_t;

typedef struct {
    const char *name;
    ncclResult_t (*init)(ncclDebugLogger_t logFunction);
    ncclResult_t (*devices)(int *ndev);
    ncclResult_t (*getProperties)(int dev, ncclNetProperties_v8_t *props);
    ncclResult_t (*listen)(int dev, void *handle, void **listenComm);
    ncclResult_t (*connect)(int dev, void *handle, void **sendComm,
                            ncclNetDeviceHandle_v8_t **sendDevComm);
    ncclResult_t (*accept)(void *listenComm, void **recvComm,
                           ncclNetDeviceHandle_v8_t **recvDevComm);
    ncclResult_t (*regMr)(void *comm, void *data, size_t size, int type, void **mhandle);
    ncclResult_t (*regMrDmaBuf)(void *comm, void *data, size_t size, int type, uint64_t offset,
                                int fd, void **mhandle);
    ncclResult_t (*deregMr)(void *comm, void *mhandle);
    ncclResult_t (*isend)(void *sendComm, void *data, int size, int tag, void *mhandle,
                          void **request);
    ncclResult_t (*irecv)(void *recvComm, int n, void **data, int *sizes, int *tags,
                          void **mhandles, void **request);
    ncclResult_t (*iflush)(void *recvComm, int n, void **data, int *sizes, void **mhandles,
                           void **request);
    ncclResult_t (*test)(void *request, int *done, int *sizes);
    ncclResult_t (*closeSend)(void *sendComm);
    ncclResult_t (*closeRecv)(void *recvComm);
    ncclResult_t (*closeListen)(void *listenComm);
    ncclResult_t (*getDeviceMr)(void *comm, void *mhandle, void **dptr_mhandle);
    ncclResult_t (*irecvConsumed)(void *recvComm, int n, void *request);
} ncclNet_v8_t;

/* ---- version 9 (NCCL 2.22 and later): sizes in size_t, virtual devices --------------------- */

typedef struct {
    int ndevs;
    int devs[NCCL_NET_MAX_DEVS_PER_NIC_V9];
} ncclNetVDeviceProps_v9_t;

typedef struct {
    char                     *name;
    char                     *pciPath;
    uint64_t                 guid;
    int                      ptrSupport;
    int                      regIsGlobal;
    int                      forceFlush;    /* flush after every receive */
    int                      speed;
    int                      port;
    float                    latency;
    int                      maxComms;
    int                      maxRecvs;
    ncclNetDeviceType        netDeviceType;
    int                      netDeviceVersion;
    ncclNetVDeviceProps_v9_t vProps;
    size_t                   maxP2pBytes;
    size_t                   maxCollBytes;
} ncclNetProperties_v9_t;

typedef struct {
    const char *name;
    ncclResult_t (*init)(ncclDebugLogger_t logFunction);
    ncclResult_t (*devices)(int *ndev);
    ncclResult_t (*getProperties)(int dev, ncclNetProperties_v9_t *props);
    ncclResult_t (*listen)(int dev, void *handle, void **listenComm);
    ncclResult_t (*connect)(int dev, void *handle, void **sendComm,
                            ncclNetDeviceHandle_v9_t **sendDevComm);
    ncclResult_t (*accept)(void *listenComm, void **recvComm,
                           ncclNetDeviceHandle_v9_t **recvDevComm);
    ncclResult_t (*regMr)(void *comm, void *data, size_t size, int type, void **mhandle);
    ncclResult_t (*regMrDmaBuf)(void *comm, void *data, size_t size, int type, uint64_t offset,
                                int fd, void **mhandle);
    ncclResult_t (*deregMr)(void *comm, void *mhandle);
    ncclResult_t (*isend)(void *sendComm, void *data, size_t size, int tag, void *mhandle,
                          void **request);
    ncclResult_t (*irecv)(void *recvComm, int n, void **data, size_t *sizes, int *tags,
                          void **mhandles, void **request);
    ncclResult_t (*iflush)(void *recvComm, int n, void **data, int *sizes, void **mhandles,
                           void **request);
    ncclResult_t (*test)(void *request, int *done, int *sizes);
    ncclResult_t (*closeSend)(void *sendComm);
    ncclResult_t (*closeRecv)(void *recvComm);
    ncclResult_t (*closeListen)(void *listenComm);
    ncclResult_t (*getDeviceMr)(void *comm, void *mhandle, void **dptr_mhandle);
    ncclResult_t (*irecvConsumed)(void *recvComm, int n, void *request);
    ncclResult_t (*makeVDevice)(int *d, ncclNetVDeviceProps_v9_t *props);
} ncclNet_v9_t;

/* ---- version 10 (NCCL 2.24 and later): comm config, profiler handles ---------------------- */

#define NCCL_NET_MAX_DEVS_PER_NIC_V11 4

typedef struct {
    int ndevs;
    int devs[NCCL_NET_MAX_DEVS_PER_NIC_V11];
} ncclNetVDeviceProps_v10_t;

typedef struct {
    int trafficClass;                   /* plug-in specific; NCCL_NET_TRAFFIC_CLASS_UNDEF */
} ncclNetCommConfig_v10_t;

typedef struct {
    char                      *name;
    char                      *pciPath;
    uint64_t                  guid;
    int                       ptrSupport;
    int                       regIsGlobal;
    int                       forceFlush;
    int                       speed;
    int                       port;
    float                     latency;
    int                       maxComms;
    int                       maxRecvs;
    ncclNetDeviceType         netDeviceType;
    int                       netDeviceVersion;
    ncclNetVDeviceProps_v10_t vProps;
    size_t                    maxP2pBytes;
    size_t                    maxCollBytes;
} ncclNetProperties_v10_t;

typedef struct {
    const char *name;
    ncclResult_t (*init)(ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
    ncclResult_t (*devices)(int *ndev);
    ncclResult_t (*getProperties)(int dev, ncclNetProperties_v10_t *props);
    ncclResult_t (*listen)(int dev, void *handle, void **listenComm);
    ncclResult_t (*connect)(int dev, ncclNetCommConfig_v10_t *config, void *handle,
                            void **sendComm, ncclNetDeviceHandle_v10_t **sendDevComm);
    ncclResult_t (*accept)(void *listenComm, void **recvComm,
                           ncclNetDeviceHandle_v10_t **recvDevComm);
    ncclResult_t (*regMr)(void *comm, void *data, size_t size, int type, void **mhandle);
    ncclResult_t (*regMrDmaBuf)(void *comm, void *data, size_t size, int type, uint64_t offset,
                                int fd, void **mhandle);
    ncclResult_t (*deregMr)(void *comm, void *mhandle);
    ncclResult_t (*isend)(void *sendComm, void *data, size_t size, int tag, void *mhandle,
                          void *phandle, void **request);
    ncclResult_t (*irecv)(void *recvComm, int n, void **data, size_t *sizes, int *tags,
                          void **mhandles, void **phandles, void **request);
    ncclResult_t (*iflush)(void *recvComm, int n, void **data, int *sizes, void **mhandles,
                           void **request);
    ncclResult_t (*test)(void *request, int *done, int *sizes);
    ncclResult_t (*closeSend)(void *sendComm);
    ncclResult_t (*closeRecv)(void *recvComm);
    ncclResult_t (*closeListen)(void *listenComm);
    ncclResult_t (*getDeviceMr)(void *comm, void *mhandle, void **dptr_mhandle);
    ncclResult_t (*irecvConsumed)(void *recvComm, int n, void *request);
    ncclResult_t (*makeVDevice)(int *d, ncclNetVDeviceProps_v10_t *props);
} ncclNet_v10_t;

/* ---- version 11 (NCCL 2.28 and later): a context per init, finalize, network attributes ---- */

typedef ncclNetVDeviceProps_v10_t ncclNetVDeviceProps_v11_t;
typedef ncclNetCommConfig_v10_t ncclNetCommConfig_v11_t;

typedef struct {
    char                      *name;
    char                      *pciPath;
    uint64_t                  guid;
    int                       ptrSupport;
    int                       regIsGlobal;
    int                       forceFlush;
    int                       speed;
    int                       port;
    float                     latency;
    int                       maxComms;
    int                       maxRecvs;
    ncclNetDeviceType         netDeviceType;
    int                       netDeviceVersion;
    ncclNetVDeviceProps_v11_t vProps;
    size_t                    maxP2pBytes;
    size_t                    maxCollBytes;
    int                       maxMultiRequestSize;  /* requests in one multi-request */
} ncclNetProperties_v11_t;

typedef struct {
    int32_t maxConcurrentPeers;
    int32_t minConcurrentPeers;
    int32_t maxFlowsPerPeer;
    int32_t minFlowsPerPeer;
} ncclNetCommAttr_v11_t;

typedef struct {
    ncclNetCommAttr_v11_t sendCommAttr;
    ncclNetCommAttr_v11_t recvCommAttr;
    uint32_t              op;
    uint32_t              algo;
    uint32_t              proto;
} ncclNetAttr_v11_t;

typedef struct {
    const char *name;
    ncclResult_t (*init)(void **ctx, uint64_t commId, ncclNetCommConfig_v11_t *config,
                         ncclDebugLogger_t logFunction, ncclProfilerCallback_t profFunction);
    ncclResult_t (*devices)(int *ndev);
    ncclResult_t (*getProperties)(int dev, ncclNetProperties_v11_t *props);
    ncclResult_t (*listen)(void *ctx, int dev, void *handle, void **listenComm);
    ncclResult_t (*connect)(void *ctx, int dev, void *handle, void **sendComm,
                            ncclNetDeviceHandle_v11_t **sendDevComm);
    ncclResult_t (*accept)(void *listenComm, void **recvComm,
                           ncclNetDeviceHandle_v11_t **recvDevComm);
    ncclResult_t (*regMr)(void *comm, void *data, size_t size, int type, void **mhandle);
    ncclResult_t (*regMrDmaBuf)(void *comm, void *data, size_t size, int type, uint64_t offset,
                                int fd, void **mhandle);
    ncclResult_t (*deregMr)(void *comm, void *mhandle);
    ncclResult_t (*isend)(void *sendComm, void *data, size_t size, int tag, void *mhandle,
                          void *phandle, void **request);
    ncclResult_t (*irecv)(void *recvComm, int n, void **data, size_t *sizes, int *tags,
                          void **mhandles, void **phandles, void **request);
    ncclResult_t (*iflush)(void *recvComm, int n, void **data, int *sizes, void **mhandles,
                           void **request);
    ncclResult_t (*test)(void *request, int *done, int *sizes);
    ncclResult_t (*closeSend)(void *sendComm);
    ncclResult_t (*closeRecv)(void *recvComm);
    ncclResult_t (*closeListen)(void *listenComm);
    ncclResult_t (*getDeviceMr)(void *comm, void *mhandle, void **dptr_mhandle);
    ncclResult_t (*irecvConsumed)(void *recvComm, int n, void *request);
    ncclResult_t (*makeVDevice)(int *d, ncclNetVDeviceProps_v11_t *props);
    ncclResult_t (*finalize)(void *ctx);
    ncclResult_t (*setNetAttr)(void *ctx, ncclNetAttr_v11_t *netAttr);
} ncclNet_v11_t;

#endif /* XFER_NCCL_NET_H */
