/*
 * xfer: move data and tensors between processes over the fastest transport two peers share.
 *
 * This header is the application API. Transports are plug-ins (see xfer/component.h) that
 * libxfer finds, loads and ranks at xfer_context_create(); xfer/info.h lets a program (and
 * the xfer_info tool) see what was found and why a transport would or would not be chosen.
 *
 * Conventions: functions return xfer_status_t; outputs (named *_p) come last and are set only
 * on success; xfer_status_string() names every status.
 */
#ifndef XFER_XFER_H
#define XFER_XFER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define XFER_API __attribute__((visibility("default")))

#define XFER_VERSION_MAJOR 0
#define XFER_VERSION_MINOR 1

/* ---- status --------------------------------------------------------------------------------- */

typedef enum {
    XFER_OK                 =   0,
    XFER_INPROGRESS         =   1,  /* started; completion is reported later */
    XFER_ERR_NO_MEMORY      =  -1,
    XFER_ERR_INVALID_PARAM  =  -2,  /* bad argument or bad configuration value */
    XFER_ERR_NOT_FOUND      =  -3,
    XFER_ERR_UNSUPPORTED    =  -4,  /* the operation is not implemented by this transport */
    XFER_ERR_UNAVAILABLE    =  -5,  /* the transport cannot work on this host */
    XFER_ERR_IO             =  -6,
    XFER_ERR_CONNECTION     =  -7,  /* the peer went away or the link failed */
    XFER_ERR_TIMEOUT        =  -8,
    XFER_ERR_TRUNCATED      =  -9,  /* message longer than the receive buffer */
    XFER_ERR_CANCELED       = -10,
    XFER_ERR_PROTOCOL       = -11,  /* the peer sent something malformed */
    XFER_ERR_BUSY           = -12,
    XFER_ERR_NO_RESOURCE    = -13,
    XFER_ERR_ABI            = -14,  /* a plug-in was built for another ABI */
    XFER_ERR_EXISTS         = -15,
    XFER_ERR_OUT_OF_RANGE   = -16,
    XFER_ERR_ABORTED        = -17,
    XFER_ERR_UNREACHABLE    = -18,  /* the peers share no transport */
    XFER_ERR_INTERNAL       = -19,
} xfer_status_t;

XFER_API const char *xfer_status_string(xfer_status_t status);

/* ---- logging -------------------------------------------------------------------------------- */

/* XFER_LOG_LEVEL=error|warn|info|debug|trace selects what reaches stderr (default warn). */
typedef enum {
    XFER_LOG_ERROR = 0,
    XFER_LOG_WARN  = 1,
    XFER_LOG_INFO  = 2,
    XFER_LOG_DEBUG = 3,
    XFER_LOG_TRACE = 4,
} xfer_log_level_t;

/* ---- tensors -------------------------------------------------------------------------------- */

typedef enum {
    XFER_DTYPE_INVALID = 0,
    XFER_DTYPE_FLOAT16, XFER_DTYPE_BFLOAT16, XFER_DTYPE_FLOAT32, XFER_DTYPE_FLOAT64,
    XFER_DTYPE_INT8, XFER_DTYPE_INT16, XFER_DTYPE_INT32, XFER_DTYPE_INT64,
    XFER_DTYPE_UINT8, XFER_DTYPE_UINT16, XFER_DTYPE_UINT32, XFER_DTYPE_UINT64,
    XFER_DTYPE_BOOL,
    XFER_DTYPE_BYTES,   /* variable-size (string-like) payload: size is authoritative */
    XFER_DTYPE_LAST
} xfer_dtype_t;

#define XFER_TENSOR_MAX_RANK 8

typedef struct xfer_tensor {
    xfer_dtype_t dtype;
    uint32_t     rank;                          /* 0..XFER_TENSOR_MAX_RANK */
    int64_t      dims[XFER_TENSOR_MAX_RANK];
    uint64_t     size;                          /* bytes of data */
    void         *data;
    int          is_dead;                       /* a dead tensor carries no data */
} xfer_tensor_t;

/* ---- context -------------------------------------------------------------------------------- */

typedef struct xfer_context xfer_context_t;

enum {
    /* Create the context even when the environment is invalid (unknown transport names, bad
     * parameter values); the problems are kept for xfer_context_env_error(). For tools. */
    XFER_CONTEXT_FLAG_INSPECT = 1u << 0,
};

typedef struct xfer_context_params {
    uint32_t   size;        /* sizeof(xfer_context_params_t); lets the struct grow */
    uint32_t   flags;       /* XFER_CONTEXT_FLAG_* */
} xfer_context_params_t;

/*
 * Find, load and query the transport components, read the XFER_* environment and validate
 * it. Fails with XFER_ERR_INVALID_PARAM on a bad environment (the log says what and why),
 * unless XFER_CONTEXT_FLAG_INSPECT is given. params may be NULL.
 */
XFER_API xfer_status_t xfer_context_create(const xfer_context_params_t *params,
                                           xfer_context_t **ctx_p);
XFER_API void xfer_context_destroy(xfer_context_t *ctx);

/* The environment problems found at create (one per line), or NULL when there were none. */
XFER_API const char *xfer_context_env_error(const xfer_context_t *ctx);

/* ---- connections ---------------------------------------------------------------------------- */

/*
 * Two processes meet over a TCP bootstrap connection: the server listens, the client
 * connects, and each sends the transports it allows (XFER_TRANSPORTS), best first. The server
 * picks the first of the client's transports that it also offers; if they share none, both
 * sides fail with XFER_ERR_UNREACHABLE and a log line naming what each side offered. Every
 * handshake step is bounded by XFER_BOOTSTRAP_TIMEOUT. A peer that is not an xfer peer of the
 * same protocol version is refused with XFER_ERR_PROTOCOL; the listener keeps working.
 *
 * Status: the bootstrap and negotiation are implemented; the data operations on an endpoint
 * arrive with the TCP data path.
 */
typedef struct xfer_listener xfer_listener_t;
typedef struct xfer_endpoint xfer_endpoint_t;

/* address: "host:port", "[v6]:port" or ":port"; port 0 picks a free port. */
XFER_API xfer_status_t xfer_listen(xfer_context_t *ctx, const char *address,
                                   xfer_listener_t **listener_p);
XFER_API uint16_t xfer_listener_port(const xfer_listener_t *listener);
/* Readable when a connection is waiting; for poll/epoll loops. */
XFER_API int xfer_listener_fd(const xfer_listener_t *listener);
XFER_API void xfer_listener_close(xfer_listener_t *listener);

/* Wait up to timeout_ms (-1: forever) for a connection, then run the handshake. */
XFER_API xfer_status_t xfer_accept(xfer_listener_t *listener, int timeout_ms,
                                   xfer_endpoint_t **ep_p);
XFER_API xfer_status_t xfer_connect(xfer_context_t *ctx, const char *address,
                                    xfer_endpoint_t **ep_p);
/* The transport the two sides agreed on, e.g. "tcp". */
XFER_API const char *xfer_endpoint_transport(const xfer_endpoint_t *ep);
/* The peer's address as text. */
XFER_API const char *xfer_endpoint_peer(const xfer_endpoint_t *ep);
XFER_API void xfer_endpoint_close(xfer_endpoint_t *ep);

#ifdef __cplusplus
}
#endif

#endif /* XFER_XFER_H */
