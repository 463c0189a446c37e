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
    XFER_ERR_PEER_CLOSED    = -20,  /* the peer closed its endpoint in order */
    XFER_ERR_DENIED         = -21,  /* the peer did not prove the key, or is not allowed */
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

/*
 * Why the last failure on this thread happened, in words: the text of the last ERROR or WARN
 * line that xfer logged on this thread (whether or not XFER_LOG_LEVEL let it reach stderr),
 * e.g. "xfer_get needs a registered local buffer ...", or "" when none came since
 * xfer_last_error_clear(). A status says what failed, this says why; clear before a call to
 * read exactly that call's reason after it. The string is thread-local and stays valid until
 * this thread's next call into xfer.
 */
XFER_API const char *xfer_last_error(void);
XFER_API void xfer_last_error_clear(void);

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

/* Bytes per element of a fixed-size dtype; 0 for XFER_DTYPE_BYTES and invalid values. */
XFER_API size_t xfer_dtype_size(xfer_dtype_t dtype);

typedef struct xfer_tensor {
    xfer_dtype_t dtype;
    uint32_t     rank;                          /* 0..XFER_TENSOR_MAX_RANK */
    int64_t      dims[XFER_TENSOR_MAX_RANK];
    uint64_t     size;                          /* bytes of data */
    void         *data;
    int          is_dead;                       /* a dead tensor carries no data */
} xfer_tensor_t;

/* ---- context -------------------------------------------------------------------------------- */

typedef struct xfer_context  xfer_context_t;
typedef struct xfer_endpoint xfer_endpoint_t;

enum {
    /* Create the context even when the environment is invalid (unknown transport names, bad
     * parameter values); the problems are kept for xfer_context_env_error(). For tools. */
    XFER_CONTEXT_FLAG_INSPECT = 1u << 0,
    /* Start a progress thread, as XFER_PROGRESS_THREAD=y does. */
    XFER_CONTEXT_FLAG_PROGRESS_THREAD = 1u << 1,
    /* The application promises never to call into this context (or its endpoints, memory,
     * keys and requests) from two threads at the same time, like UCX's
     * UCS_THREAD_MODE_SERIALIZED: the context then takes no lock. Refused together with a
     * progress thread, which would break the promise. */
    XFER_CONTEXT_FLAG_SERIALIZED = 1u << 2,
};

typedef struct xfer_context_params {
    uint32_t   size;        /* sizeof(xfer_context_params_t); lets the struct grow */
    uint32_t   flags;       /* XFER_CONTEXT_FLAG_* */
    /* XFER_* variables that the caller reads itself (a binding's, a plug-in's), NULL-ended:
     * they are not reported as unknown, and a misspelt one is matched against them too */
    const char *const *env_names;
    /* The shared secret every peer must prove it holds (auth_key_len bytes, 16 to 4096),
     * instead of XFER_AUTH_KEY_FILE; copied. NULL: the file's, if set. */
    const void        *auth_key;
    size_t            auth_key_len;
} xfer_context_params_t;

/*
 * Find, load and query the transport components, read the XFER_* environment and validate
 * it, and open every available transport that the environment allows. Fails with XFER_ERR_INVALID_PARAM on a bad environment (the log says what and why),
 * unless XFER_CONTEXT_FLAG_INSPECT is given. params may be NULL.
 */
XFER_API xfer_status_t xfer_context_create(const xfer_context_params_t *params,
                                           xfer_context_t **ctx_p);
/* Closes and frees what is still open - listeners, endpoints (their pending operations
 * complete with XFER_ERR_CANCELED), remote keys, registrations, requests; every handle of the
 * context is invalid afterwards. */
XFER_API void xfer_context_destroy(xfer_context_t *ctx);

/* The environment problems found at create (one per line), or NULL when there were none. */
XFER_API const char *xfer_context_env_error(const xfer_context_t *ctx);

/* ---- threads and progress ------------------------------------------------------------------ */

/*
 * Thread model. Every call may come from any thread. A context serialises the calls made on
 * it and on its objects (endpoints, memory, requests) with one lock, like UCX's
 * UCS_THREAD_MODE_MULTI: simple and safe, not a scalability feature. A context created with
 * XFER_CONTEXT_FLAG_SERIALIZED leaves that to the application and skips the lock (about 60
 * instructions per call and per progress, in callgrind).
 *
 * Callbacks. Completion callbacks run from one place: the end of a round of progress
 * (xfer_progress(), xfer_request_test(), xfer_request_wait(), the progress thread), after every
 * transport has finished its own work, in the order the operations completed, with the lock
 * held. A callback may post, release (its own request too), cancel, test, progress, and close
 * any endpoint (its own too); it must not wait (xfer_request_wait() from a callback fails with
 * XFER_ERR_BUSY) or destroy the context (refused). A request's status changes from
 * XFER_INPROGRESS only when its callback runs, so no thread sees a result before its callback.
 * A fetch's allocation callback is different: it runs inside the transport's receive path,
 * where the size becomes known; it may only allocate, and any xfer call it makes that could
 * reach a transport is refused (XFER_ERR_BUSY, or 0 from xfer_progress()).
 *
 * Progress is explicit: operations move when some thread calls xfer_progress(),
 * xfer_request_test() or xfer_request_wait(). With XFER_PROGRESS_THREAD=y (or
 * XFER_CONTEXT_FLAG_PROGRESS_THREAD) the context runs its own thread that sleeps on the
 * transports' file descriptors and progresses when they fire.
 */

/* Run every open transport's progress once; returns how many events were processed. */
XFER_API unsigned xfer_progress(xfer_context_t *ctx);

/*
 * For event loops (asyncio, libuv, epoll) that sleep on a file descriptor instead of calling
 * xfer_request_wait(), like UCX's ucp_worker_get_efd() and ucp_worker_arm():
 *   loop: xfer_progress(); if xfer_context_arm() == XFER_OK, wait until the fd is readable
 *   (with nothing else to do); else progress again.
 * The fd (owned by the context, valid until it is destroyed) becomes readable when a
 * transport has input or a completion, when another thread posts or completes something, and
 * at the context's own next deadline (a close's timeout, a tensor request's expiry).
 * xfer_context_arm() returns XFER_OK when nothing is pending, so sleeping on the fd loses no
 * work; XFER_ERR_BUSY when there is work (completions to deliver, input already read, a copy
 * that polls): progress again first. Reading the fd is not needed; progress clears it.
 */
XFER_API int xfer_context_event_fd(xfer_context_t *ctx);
XFER_API xfer_status_t xfer_context_arm(xfer_context_t *ctx);

/* ---- memory --------------------------------------------------------------------------------- */

/*
 * What a registered buffer is. The type is checked: host memory registered as XFER_MEM_CUDA,
 * or CUDA device memory as XFER_MEM_HOST, is refused (XFER_ERR_INVALID_PARAM, the log says
 * what the memory is). XFER_MEM_AUTO finds out; xfer_mem_type() says what it found. Checking
 * host memory neither loads nor initialises CUDA: a process in which CUDA is not initialised
 * has no device memory. XFER_MEM_CUDA loads the driver (XFER_CUDA_LIB, default libcuda.so.1)
 * and initialises it; without one it fails with XFER_ERR_UNAVAILABLE, naming the library and
 * why. The range must lie in one CUDA allocation. CUDA memory is registered with the open
 * transports that move it (XFER_CAP_MEM_CUDA; xfer_info -s says which) or put and get it
 * (XFER_CAP_RMA_CUDA: shm, by CUDA IPC between processes of one host); on the others put
 * and get of it, and batches descriptor by descriptor (their notification after the data),
 * are staged through pinned host buffers (XFER_STAGING_CHUNK,
 * XFER_STAGING_DEPTH), tagged messages and tensor fetches of it through a host buffer of
 * their size (over RMA_CUDA transports too), and a peer cannot put to or get from it over
 * them (its remote key has no part for them). It is refused when no open transport moves or
 * stages it. A tensor published from CUDA memory is copied to host memory at publish when an
 * open transport cannot touch it.
 */
typedef enum {
    XFER_MEM_HOST = 0,      /* CPU-addressable: malloc, mmap, pinned, CUDA managed memory */
    XFER_MEM_CUDA = 1,      /* CUDA device memory (cuMemAlloc, cudaMalloc) */
    XFER_MEM_AUTO = 2,      /* whichever of the two the range is */
} xfer_mem_type_t;

typedef struct xfer_mem  xfer_mem_t;    /* a registered local buffer */
typedef struct xfer_rkey xfer_rkey_t;   /* a peer's buffer, unpacked from its packed key */

/* Register [addr, addr + length) with every open transport. length 0 is invalid. */
XFER_API xfer_status_t xfer_mem_register(xfer_context_t *ctx, void *addr, size_t length,
                                         xfer_mem_type_t type, xfer_mem_t **mem_p);
/*
 * Allocate length bytes of host memory (type XFER_MEM_HOST or XFER_MEM_AUTO; page-aligned,
 * zeroed) and register it, like ucp_mem_map()'s ALLOCATE: xfer_mem_address() says where it is,
 * xfer_mem_deregister() (or xfer_context_destroy()) frees it. It lives in a sealed memfd, so a peer on the same host maps
 * it and its puts and gets are one memcpy by the peer - no kernel copy, no round trip through
 * this process (shm). Other transports move it like any registered buffer. A range inside it
 * registered again with xfer_mem_register() is registered like any other memory.
 */
XFER_API xfer_status_t xfer_mem_alloc(xfer_context_t *ctx, size_t length, xfer_mem_type_t type,
                                      xfer_mem_t **mem_p);
/* Fails with XFER_ERR_BUSY while an operation that uses the buffer is outstanding. Memory from
 * xfer_mem_alloc() is freed here; a peer that still maps it keeps its pages, never this
 * process's memory. */
XFER_API xfer_status_t xfer_mem_deregister(xfer_mem_t *mem);
XFER_API void  *xfer_mem_address(const xfer_mem_t *mem);
XFER_API size_t xfer_mem_length(const xfer_mem_t *mem);
/* XFER_MEM_HOST or XFER_MEM_CUDA: what the buffer was found to be (never XFER_MEM_AUTO). */
XFER_API xfer_mem_type_t xfer_mem_type(const xfer_mem_t *mem);

/*
 * Pack what a peer needs to put to and get from this buffer into a self-describing blob
 * (malloc'd; free it with xfer_rkey_blob_free()). Send it to the peer any way you like.
 */
XFER_API xfer_status_t xfer_rkey_pack(xfer_mem_t *mem, void **blob_p, size_t *length_p);
XFER_API void xfer_rkey_blob_free(void *blob);
/* Unpack a blob received from the peer of ep. A blob from any other context than ep's peer
 * is refused (XFER_ERR_INVALID_PARAM). The remote buffer's bounds come with it. */
XFER_API xfer_status_t xfer_rkey_unpack(xfer_endpoint_t *ep, const void *blob, size_t length,
                                        xfer_rkey_t **rkey_p);
XFER_API uint64_t xfer_rkey_address(const xfer_rkey_t *rkey);
XFER_API size_t   xfer_rkey_length(const xfer_rkey_t *rkey);
XFER_API void xfer_rkey_destroy(xfer_rkey_t *rkey);

/* ---- requests ------------------------------------------------------------------------------- */

/*
 * Every non-blocking operation takes a callback (may be NULL), its argument, and req_p.
 * With req_p != NULL the caller gets a request to test, wait on, cancel and finally release;
 * with req_p == NULL the request releases itself after its callback. A call that fails
 * returns the error, creates no request and never calls the callback.
 */
typedef struct xfer_request xfer_request_t;
typedef void (*xfer_request_cb_t)(xfer_request_t *req, xfer_status_t status, void *user_data);

/* XFER_INPROGRESS while pending (after one round of progress), else the final status. */
XFER_API xfer_status_t xfer_request_test(xfer_request_t *req);
/* Progress, sleeping on the transports' file descriptors between events, until the request
 * completes or timeout_ms passes (-1: no limit). Returns its final status, or
 * XFER_ERR_TIMEOUT with the request still pending. */
XFER_API xfer_status_t xfer_request_wait(xfer_request_t *req, int timeout_ms);
/* Cancel a posted tag receive, a pending tensor fetch or a batch: it completes with
 * XFER_ERR_CANCELED. XFER_ERR_BUSY when it can no longer be cancelled (data is arriving; a
 * batch whose notification has left, which the target's answer completes);
 * XFER_ERR_UNSUPPORTED for other operations. A completed request is left as it is. */
XFER_API xfer_status_t xfer_request_cancel(xfer_request_t *req);
/* After completion: bytes moved. For XFER_ERR_TRUNCATED: the length of the message. */
XFER_API size_t   xfer_request_length(const xfer_request_t *req);
/* After a tag receive completes: the sender's tag. */
XFER_API uint64_t xfer_request_tag(const xfer_request_t *req);
/* After a tensor fetch completes with XFER_OK: its metadata and data (the struct is owned by
 * the request; the data is the caller's buffer or what its allocation callback returned).
 * After a failure it is NULL - except when the allocation callback had already returned a
 * buffer: then data points to it, so that the caller can free it. */
XFER_API const xfer_tensor_t *xfer_request_tensor(const xfer_request_t *req);
/* After a batch completes: how many of its descriptors are known to have landed (all of them
 * on XFER_OK; after a timeout, a cancel or an error, a lower bound - see xfer_batch_post). */
XFER_API size_t   xfer_request_landed(const xfer_request_t *req);
/* Free a completed request now, or a pending one as soon as it completes. */
XFER_API void xfer_request_release(xfer_request_t *req);

/* ---- connections ---------------------------------------------------------------------------- */

/*
 * Two processes meet over a TCP bootstrap connection: the server listens, the client
 * connects, and each sends the transports it allows (XFER_TRANSPORTS) with their addresses,
 * best first. The server picks the first of the client's transports that it also offers; if
 * they share none, both sides fail with XFER_ERR_UNREACHABLE and a log line naming what each
 * side offered. The chosen transport then connects its own endpoint (it may carry its
 * traffic on the bootstrap connection itself, as tcp does). A handshake is bounded by
 * XFER_BOOTSTRAP_TIMEOUT (on the server, from its accept). A peer that is not an xfer peer of
 * the same protocol version is refused with XFER_ERR_PROTOCOL; the listener keeps working.
 */
typedef struct xfer_listener xfer_listener_t;

/* address: "host:port", "[v6]:port", ":port" (this host's loopback, 127.0.0.1 and ::1) or
 * "*:port" (every interface, IPv4 and IPv6); port 0 picks a free port, the same for every
 * address. A name that resolves to several addresses is listened on at each (up to four); a
 * family the host lacks is skipped. Every socket the transports open for this listener's
 * endpoints (tcp's lane port) binds the address the peer reached, nothing wider. */
XFER_API xfer_status_t xfer_listen(xfer_context_t *ctx, const char *address,
                                   xfer_listener_t **listener_p);
XFER_API uint16_t xfer_listener_port(const xfer_listener_t *listener);
/* For poll/epoll loops: an epoll descriptor (pollable) holding the listening socket, the
 * sockets of the handshakes in progress and a timer for their deadlines. It is readable when
 * xfer_accept() has something to do - a connection waits, a handshake can move on, or one is
 * past its deadline - and then xfer_accept(listener, 0, &ep) does it without waiting. */
XFER_API int xfer_listener_fd(const xfer_listener_t *listener);
/* Closes the handshakes in progress too. */
XFER_API void xfer_listener_close(xfer_listener_t *listener);

/*
 * Serve the listener for up to timeout_ms (0: only what is ready now; -1: no limit): take the
 * connections that wait and move every handshake whose peer has sent or can take the next
 * step. Handshakes run side by side, each on its own socket with its own deadline, so a slow
 * or silent client delays no other.
 *   XFER_OK                 *ep_p is the first that completed; the others go on in later calls.
 *   XFER_ERR_TIMEOUT        none completed in time (or a handshake passed its deadline).
 *   another error           a handshake failed - the peer refused, was refused
 *                           (XFER_ERR_UNREACHABLE), sent garbage, went away - and none
 *                           completed. Its connection is closed with a log line saying who
 *                           and why; the listener keeps working: call again.
 * At most XFER_BOOTSTRAP_MAX_PENDING handshakes are in progress per listener: a connection
 * beyond that closes the oldest (XFER_ERR_NO_RESOURCE), which bounds what clients can make
 * the server hold. While it waits it progresses the transports as well (what they listen
 * on, such as tcp's lane port, is drained while a burst of peers connects); what they
 * complete is delivered by the next xfer_progress(): no callback runs inside xfer_accept().
 * The other way round, xfer_progress() and every wait take connections and move handshakes
 * too (every 64th call; a sleeping context wakes every 50 ms while handshakes are in
 * progress): up to XFER_BOOTSTRAP_MAX_PENDING endpoints that complete there wait for
 * xfer_accept(), which returns them first; the kernel's backlog (SOMAXCONN) holds the rest.
 */
XFER_API xfer_status_t xfer_accept(xfer_listener_t *listener, int timeout_ms,
                                   xfer_endpoint_t **ep_p);
/* Resolve address and try each of its addresses in turn (e.g. localhost as ::1, then
 * 127.0.0.1) until one connects, then run the handshake; all within XFER_BOOTSTRAP_TIMEOUT. */
XFER_API xfer_status_t xfer_connect(xfer_context_t *ctx, const char *address,
                                    xfer_endpoint_t **ep_p);
/* The transport the two sides agreed on, e.g. "tcp". */
XFER_API const char *xfer_endpoint_transport(const xfer_endpoint_t *ep);
/* The peer's address as text. */
XFER_API const char *xfer_endpoint_peer(const xfer_endpoint_t *ep);
/* XFER_OK while the connection works, else the error that broke it. */
XFER_API xfer_status_t xfer_endpoint_status(const xfer_endpoint_t *ep);
/*
 * Flush: complete once every operation posted on ep before this call that this side can
 * finish alone has finished, and everything it sent has been acknowledged by the peer's host
 * (in the peer's memory, or in its transport's receive buffers), so that closing the
 * endpoint or exiting loses none of it. Puts are in the peer's memory (a put the peer
 * refused fails the flush with its status), gets complete; eager sends, large tcp sends
 * and tensor answers are acknowledged. A rendezvous send (a large message over verbs, which
 * the receiver pulls once it matches) is not waited for: it has not been reported complete.
 * XFER_OK then, or the endpoint's error when it fails first. After the peer closed its
 * endpoint in order (XFER_ERR_PEER_CLOSED), a flush still completes XFER_OK when everything
 * sent before it had been acknowledged by then, else with XFER_ERR_PEER_CLOSED: the answer
 * depends on what reached the peer, not on when it closed. Non-blocking, like any other
 * operation (UCX's ucp_ep_flush_nbx).
 */
XFER_API xfer_status_t xfer_endpoint_flush(xfer_endpoint_t *ep, xfer_request_cb_t cb,
                                           void *user_data, xfer_request_t **req_p);

enum {
    /* Close at once: what is queued or on its way is dropped, and every pending operation
     * completes with XFER_ERR_CANCELED (UCX's UCP_EP_CLOSE_FLAG_FORCE). */
    XFER_CLOSE_FLAG_FORCE = 1u << 0,
};

/*
 * Close ep without blocking; ep is invalid as soon as this returns. Without
 * XFER_CLOSE_FLAG_FORCE the endpoint first flushes, for at most XFER_CLOSE_TIMEOUT, so that
 * everything already reported complete reaches the peer and the sends and batches in flight
 * finish (a large send waits for the peer to take it); then the connection closes and the
 * operations still pending (receives, fetches, whatever the timeout cut short) complete with
 * XFER_ERR_CANCELED. The request completes with XFER_OK once the
 * endpoint closed with everything delivered, XFER_ERR_TIMEOUT when the timeout forced it,
 * or the endpoint's error when it had failed (then nothing more could be delivered). Once
 * flushed, the transport tells the peer, behind everything sent: the peer's endpoint handles
 * all of it, then says XFER_ERR_PEER_CLOSED (its pending receives and requests that needed
 * this side complete with it; what it received stays receivable). A forced close, one that
 * the timeout forced, or a process that ends without closing, is a broken connection there
 * (XFER_ERR_CONNECTION).
 */
XFER_API xfer_status_t xfer_endpoint_close_nb(xfer_endpoint_t *ep, uint32_t flags,
                                              xfer_request_cb_t cb, void *user_data,
                                              xfer_request_t **req_p);
/* xfer_endpoint_close_nb() without flags, waiting (progressing) until the close is done, at
 * most XFER_CLOSE_TIMEOUT. From a callback, which must not wait, it returns at once and the
 * close goes on in progress. xfer_context_destroy() closes what is left the same way. */
XFER_API void xfer_endpoint_close(xfer_endpoint_t *ep);

/* One counter of an endpoint's transport, e.g. {"tx_TENSOR_REQUEST", 12}. */
#define XFER_COUNTER_NAME_MAX 40
typedef struct xfer_counter {
    char     name[XFER_COUNTER_NAME_MAX];
    uint64_t value;
} xfer_counter_t;

/* Copy up to *count_p of the endpoint's counters (messages by type, bytes written, cache
 * hits, credit stalls... as its transport keeps them) into counters, and set *count_p to how
 * many there are (which may be more than fitted; 0 when the transport keeps none). With
 * XFER_STATS=y every endpoint's counters are printed to stderr when it closes. */
XFER_API xfer_status_t xfer_endpoint_counters(xfer_endpoint_t *ep, xfer_counter_t *counters,
                                              size_t *count_p);
/* The same for the process: what peers caused that is logged at a bounded rate - for each
 * cause, peer_<cause> (every occurrence: refused handshakes, lane connections, tensor
 * requests...) and peer_<cause>_unlogged (those whose log line was held back). */
XFER_API xfer_status_t xfer_context_counters(xfer_context_t *ctx, xfer_counter_t *counters,
                                             size_t *count_p);

/* ---- one-sided ------------------------------------------------------------------------------ */

/*
 * Write [buf, buf + length) - which must lie inside the registered mem - to remote_addr in
 * the peer's buffer described by rkey (unpacked on this ep). A range outside either buffer is
 * refused with XFER_ERR_OUT_OF_RANGE, here when it can be known here, else by the peer.
 * Completes when buf may be reused. The data is in the peer's memory once an
 * xfer_endpoint_flush() posted after the put completes (the flush fails with the peer's error
 * when it refused the put); over verbs and gdr, and over tcp with XFER_TCP_PUT_ACK=y, it is already
 * there when the put completes, and a refused put completes with the peer's error. A put or
 * get into memory the peer deregistered fails with XFER_ERR_NOT_FOUND and moves nothing; over
 * verbs and gdr the endpoint fails with it, or with XFER_ERR_CONNECTION when the peer's side
 * ended first (docs/contract.md, C28).
 */
XFER_API xfer_status_t xfer_put(xfer_endpoint_t *ep, const void *buf, size_t length,
                                xfer_mem_t *mem, uint64_t remote_addr, xfer_rkey_t *rkey,
                                xfer_request_cb_t cb, void *user_data, xfer_request_t **req_p);
/* Read from the peer's buffer into [buf, buf + length) inside mem. */
XFER_API xfer_status_t xfer_get(xfer_endpoint_t *ep, void *buf, size_t length, xfer_mem_t *mem,
                                uint64_t remote_addr, xfer_rkey_t *rkey,
                                xfer_request_cb_t cb, void *user_data, xfer_request_t **req_p);

/* ---- two-sided ------------------------------------------------------------------------------ */

/*
 * Tagged messages. A receive matches a message when (msg_tag & tag_mask) == (tag & tag_mask),
 * from any peer (ep == NULL) or from one endpoint. Messages that arrive before a matching
 * receive wait in an unexpected queue; messages from one peer match in the order they were
 * sent. A receive from any peer takes messages from the peers of every open transport (tcp
 * and verbs peers alike): a message goes to the earliest posted receive that matches it. A
 * message longer than the receive buffer completes the receive with
 * XFER_ERR_TRUNCATED, and xfer_request_length() gives the message's length. mem is optional
 * (NULL: the transport registers or copies as it needs). Zero-length messages work.
 * A send completes when its buffer may be reused.
 */
XFER_API xfer_status_t xfer_tag_send(xfer_endpoint_t *ep, uint64_t tag, const void *buf,
                                     size_t length, xfer_mem_t *mem, xfer_request_cb_t cb,
                                     void *user_data, xfer_request_t **req_p);
XFER_API xfer_status_t xfer_tag_recv(xfer_context_t *ctx, xfer_endpoint_t *ep, uint64_t tag,
                                     uint64_t tag_mask, void *buf, size_t length,
                                     xfer_mem_t *mem, xfer_request_cb_t cb, void *user_data,
                                     xfer_request_t **req_p);

/* ---- tensors -------------------------------------------------------------------------------- */

/*
 * A producer publishes a tensor under (step, key); a consumer fetches it from the producer's
 * endpoint. One publish satisfies one fetch. Fetch may come before or after publish: a fetch
 * that arrives first waits on the producer's side until the key is published. Keys are at
 * most XFER_MAX_KEY_LEN bytes (not counting the NUL).
 */
enum {
    /* Copy the data at publish, so the caller may reuse its buffer at once. Without it the
     * data must stay valid until the publish request completes (the tensor was sent). */
    XFER_PUBLISH_COPY = 1u << 0,
};

/* Never blocks. XFER_ERR_EXISTS when (step, key) is already published and not yet fetched;
 * XFER_ERR_ABORTED when the step was aborted. The request completes with XFER_OK once a
 * consumer has the tensor, or with the abort status. */
XFER_API xfer_status_t xfer_tensor_publish(xfer_context_t *ctx, uint64_t step, const char *key,
                                           const xfer_tensor_t *tensor, uint32_t flags,
                                           xfer_request_cb_t cb, void *user_data,
                                           xfer_request_t **req_p);

/*
 * Who may fetch what this context publishes. cb is asked about each peer's request of a
 * tensor (ep: that peer's endpoint) when the request arrives while the tensor is published,
 * and when a publish could answer a waiting request; 0 keeps the tensor from it. Such a
 * request is treated exactly as one for a tensor that does not exist: it waits, within the
 * same bounds, until a publish it may have or XFER_TENSOR_REQUEST_TIMEOUT - nothing tells the
 * peer that the tensor exists. NULL (the default): every peer may fetch every tensor. cb runs
 * inside the tensor engine, under the context's lock, while the engine walks the requests:
 * like a fetch's allocation callback it may only answer, and every xfer call it makes is
 * refused (XFER_ERR_BUSY, or 0 from xfer_progress()) - closing ep included.
 */
typedef int (*xfer_tensor_access_cb_t)(xfer_endpoint_t *ep, uint64_t step, const char *key,
                                       size_t key_len, void *arg);
XFER_API xfer_status_t xfer_tensor_access_set(xfer_context_t *ctx, xfer_tensor_access_cb_t cb,
                                              void *arg);

/* Where a fetched tensor's data goes: a caller buffer, or a buffer the callback returns
 * once the size is known (return NULL to fail the fetch with XFER_ERR_NO_MEMORY). The
 * callback runs inside the transport's receive path: it may only allocate (see "Callbacks"). */
typedef void *(*xfer_tensor_alloc_cb_t)(const xfer_tensor_t *meta, void *alloc_arg);

typedef struct xfer_fetch_params {
    uint32_t               size;        /* sizeof(xfer_fetch_params_t) */
    void                   *buffer;     /* caller buffer, or NULL to use alloc */
    size_t                 capacity;    /* its size; a larger tensor fails XFER_ERR_TRUNCATED */
    xfer_mem_t             *mem;        /* optional registration covering buffer */
    xfer_tensor_alloc_cb_t alloc;
    void                   *alloc_arg;
} xfer_fetch_params_t;

/* On XFER_OK, xfer_request_tensor() has the tensor (dtype, shape, size, is_dead, data). */
XFER_API xfer_status_t xfer_tensor_fetch(xfer_endpoint_t *ep, uint64_t step, const char *key,
                                         const xfer_fetch_params_t *params,
                                         xfer_request_cb_t cb, void *user_data,
                                         xfer_request_t **req_p);

#define XFER_STEP_ALL UINT64_MAX

/* ---- batches and notifications -------------------------------------------------------------- */

/*
 * (Names in capitals below - XFER_BATCH_MAX_DESCS, XFER_NOTIFY_MAX_LEN, XFER_BATCH_TIMEOUT,
 * XFER_NOTIFY_MAX_QUEUED - are environment parameters, read when the context is created:
 * docs/parameters.md lists them with their defaults and ranges, xfer_info -c their values.
 * XFER_BATCH_NO_TIMEOUT alone is a macro.)
 *
 * A batch moves many blocks between one registered local buffer and one remote buffer in one
 * request: N descriptors, each a (local offset, remote offset, length) counted from
 * xfer_mem_address(mem) and xfer_rkey_address(rkey). A list is checked and prepared once
 * (xfer_batch_create) and may then be posted any number of times, also while earlier posts
 * of it are in flight; each transport posts it as one unit (verbs: a chain of work requests
 * with few signalled, tcp: frames gathered into few writes, shm: one pass of the target).
 *
 * A posted batch completes once every descriptor's data is in the destination's memory (a
 * put: the peer's; a get: ours). It may carry a notification: a message of at most
 * XFER_NOTIFY_MAX_LEN bytes that the peer receives only once every byte of the batch is
 * visible in its memory (a put) or has been read from it (a get), never before; a batch with
 * a descriptor the peer refused delivers no notification. Notifications from one endpoint
 * arrive in the order their batches were posted.
 *
 * Each post has a deadline (timeout_ms > 0; 0: XFER_BATCH_TIMEOUT; XFER_BATCH_NO_TIMEOUT:
 * none). A batch not done by then whose notification has not left completes with
 * XFER_ERR_TIMEOUT, and xfer_request_landed() says how many descriptors are known to have
 * landed; the transport posts nothing more of it and never sends its notification. What was
 * already on its way may still land: until the transport has let go of it -
 * xfer_mem_deregister() succeeds again - the ranges of the descriptors not counted as landed
 * are undefined, in the local buffer of a get and in the peer's buffer of a put.
 * xfer_request_cancel() ends a batch the same way with XFER_ERR_CANCELED. Once the
 * notification has left, the target's word is final: the cancel returns XFER_ERR_BUSY, the
 * deadline no longer ends the batch, and it completes with the target's answer (XFER_OK when
 * the notification was delivered) - a batch never both ends early and notifies. A target
 * that moves the data itself (shm) stops at the deadline too (docs/contract.md, C16).
 */
typedef struct xfer_batch xfer_batch_t;

typedef struct xfer_batch_desc {
    uint64_t local_offset;
    uint64_t remote_offset;
    uint64_t length;
} xfer_batch_desc_t;

typedef enum {
    XFER_BATCH_PUT = 0,
    XFER_BATCH_GET = 1,
} xfer_batch_op_t;

#define XFER_BATCH_NO_TIMEOUT (-1)

/* Check every descriptor against mem and rkey (XFER_ERR_OUT_OF_RANGE naming the first that
 * does not fit) and prepare the list for ep. count is at most XFER_BATCH_MAX_DESCS. The batch
 * keeps mem registered (deregistering fails while it exists) and rkey alive. */
XFER_API xfer_status_t xfer_batch_create(xfer_endpoint_t *ep, xfer_batch_op_t op,
                                         xfer_mem_t *mem, xfer_rkey_t *rkey,
                                         const xfer_batch_desc_t *descs, size_t count,
                                         xfer_batch_t **batch_p);
/* Post the batch, with a notification when notify != NULL (notify_len bytes, copied). */
XFER_API xfer_status_t xfer_batch_post(xfer_batch_t *batch, const void *notify,
                                       size_t notify_len, int timeout_ms,
                                       xfer_request_cb_t cb, void *user_data,
                                       xfer_request_t **req_p);
/* Release the list; posts of it still in flight keep what they need until they end. Closing
 * the endpoint ends its batches' use (posting fails with XFER_ERR_CONNECTION); each must
 * still be destroyed. */
XFER_API xfer_status_t xfer_batch_destroy(xfer_batch_t *batch);

/*
 * Notifications, at the target: taken by polling an endpoint (oldest first), or by a handler
 * that progress calls for each, in order per endpoint. Each endpoint keeps at most
 * XFER_NOTIFY_MAX_QUEUED not yet taken; a peer that sends more fails the endpoint with
 * XFER_ERR_NO_RESOURCE, so that a peer cannot make this side hold without bound.
 */
typedef void (*xfer_notify_cb_t)(xfer_endpoint_t *ep, const void *msg, size_t length,
                                 void *user_data);
/* Set (cb != NULL) or remove the context's handler. Notifications already queued are handed
 * to it too. It runs like a completion callback: it may post, close and progress, not wait. */
XFER_API xfer_status_t xfer_notify_handler_set(xfer_context_t *ctx, xfer_notify_cb_t cb,
                                               void *user_data);
/* Take the endpoint's oldest notification into buf (capacity bytes), its length in *length_p.
 * Progresses once when none is queued. XFER_ERR_NOT_FOUND: none; XFER_ERR_TRUNCATED: it is
 * longer than capacity (*length_p says how long; it stays queued). */
XFER_API xfer_status_t xfer_notify_poll(xfer_endpoint_t *ep, void *buf, size_t capacity,
                                        size_t *length_p);

/*
 * Abort a step (or every step: XFER_STEP_ALL) with status (an error): this side's pending
 * fetches of it and its unfetched publishes complete with status; peers' fetches of its
 * tensors - waiting now or arriving later - fail with status too.
 */
XFER_API xfer_status_t xfer_tensor_abort(xfer_context_t *ctx, uint64_t step,
                                         xfer_status_t status);

#ifdef __cplusplus
}
#endif

#endif /* XFER_XFER_H */
