/*
 * What the files of the NCCL plug-in share: the handle, the comm and request types, the
 * process-wide state, logging. xfer_nccl.c: init, the device; nccl_versions.c: the exported
 * tables; nccl_conn.c: listen, connect, accept, close; nccl_data.c: registration,
 * isend/irecv/test.
 */
#ifndef XFER_NCCL_PLUGIN_H
#define XFER_NCCL_PLUGIN_H

#include "nccl_net.h"

#include <xfer/xfer.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

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
    xn_mr_t        *mr[XN_MAX_RECVS];   /* the registration each uses, for deregMr */
} xn_req_t;

struct xn_comm {
    xn_comm_t       *next;              /* xn.comms, under xn.lock */
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

typedef struct xn_state {
    pthread_mutex_t   lock;
    int               inited;
    int               users;            /* version 11's inits not yet finalized */
    xfer_context_t    *ctx;
    ncclDebugLogger_t logger;
    char              name[64];         /* "xfer-<transport>" */
    int               ptr_support;
    int               speed_mbps;
    float             latency_us;
    xn_connect_t      *connects;
    xn_comm_t         *comms;           /* every open comm: deregMr finds what uses a region */
} xn_state_t;

extern xn_state_t xn;

__attribute__((format(printf, 4, 5)))
void xn_log_at(ncclDebugLogLevel level, const char *file, int line, const char *fmt, ...);
#define xn_warn(...) xn_log_at(NCCL_LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define xn_info(...) xn_log_at(NCCL_LOG_INFO, __FILE__, __LINE__, __VA_ARGS__)
/* An xfer status as NCCL's: the peer's doing, our resources, or a misuse. */
ncclResult_t xn_result(xfer_status_t st);
/* ncclSuccess when dev is the plug-in's device and init succeeded. */
ncclResult_t xn_check_dev(int dev);

/* How long deregMr waits for operations that still use its region to finish (ms). */
#define XN_DEREG_WAIT_MS 10000

static inline double xn_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* xfer_nccl.c */
ncclResult_t xn_init(ncclDebugLogger_t logger);
/* xn_init(), counted for xn_finalize(), which ends the context with the last. */
ncclResult_t xn_init_ref(ncclDebugLogger_t logger);
ncclResult_t xn_finalize(void);
ncclResult_t xn_devices(int *ndev);

/* nccl_conn.c */
ncclResult_t xn_listen(int dev, void *handle, void **listen_comm);
ncclResult_t xn_connect(int dev, void *handle, void **send_comm,
                        ncclNetDeviceHandle_v8_t **dev_comm);
ncclResult_t xn_accept(void *listen_comm, void **recv_comm, ncclNetDeviceHandle_v8_t **dev_comm);
ncclResult_t xn_close_send(void *send_comm);
ncclResult_t xn_close_recv(void *recv_comm);
ncclResult_t xn_close_listen(void *listen_comm);

/* nccl_data.c */
ncclResult_t xn_reg_mr(void *comm, void *data, size_t size, int type, void **mhandle);
ncclResult_t xn_reg_mr_dmabuf(void *comm, void *data, size_t size, int type, uint64_t offset,
                              int fd, void **mhandle);
ncclResult_t xn_dereg_mr(void *comm, void *mhandle);
ncclResult_t xn_isend_v8(void *send_comm, void *data, int size, int tag, void *mhandle,
                         void **request);
ncclResult_t xn_isend_v9(void *send_comm, void *data, size_t size, int tag, void *mhandle,
                         void **request);
ncclResult_t xn_irecv_v8(void *recv_comm, int n, void **data, int *sizes, int *tags,
                         void **mhandles, void **request);
ncclResult_t xn_irecv_v9(void *recv_comm, int n, void **data, size_t *sizes, int *tags,
                         void **mhandles, void **request);
ncclResult_t xn_iflush(void *recv_comm, int n, void **data, int *sizes, void **mhandles,
                       void **request);
ncclResult_t xn_test(void *request, int *done, int *sizes);
/* Release what a request holds, done or not (a pending xfer request goes when it completes). */
void xn_req_put(xn_req_t *r);

#endif /* XFER_NCCL_PLUGIN_H */
