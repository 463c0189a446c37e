/*
 * The staging pipeline inside libxfer (staging.c: the design, the pool and the per-operation
 * state machine; staging_copy.c: the copy engines). Not installed.
 */
#ifndef XFER_STAGING_H
#define XFER_STAGING_H

#include "xfer_int.h"
#include "staging_test.h"

/* ---- copy engines (staging_copy.c) ---------------------------------------------------------- */

typedef enum {
    XFER_STAGING_TO_HOST,           /* device (or staged) buffer -> bounce buffer */
    XFER_STAGING_FROM_HOST,         /* bounce buffer -> device (or staged) buffer */
} xfer_staging_dir_t;

typedef struct xfer_copier xfer_copier_t;

/*
 * A copy engine: copies that start at once and finish later, one at a time per slot (a
 * bounce buffer), asked about without blocking. Two implementations: CUDA (the driver table:
 * an own stream, one event per slot) and host memcpy, which moves staged host memory for the
 * suites on machines without a GPU.
 */
typedef struct xfer_copier_ops {
    const char      *name;
    /* Pinned host memory for the pool; freed with host_free. */
    xfer_status_t   (*host_alloc)(xfer_copier_t *c, size_t size, void **ptr_p, char *why,
                                  size_t why_size);
    void            (*host_free)(xfer_copier_t *c, void *ptr);
    /* Start copying len bytes for slot; XFER_OK (poll says when it landed) or an error. */
    xfer_status_t   (*start)(xfer_copier_t *c, unsigned slot, void *dst, const void *src,
                             size_t len, xfer_staging_dir_t dir, char *why, size_t why_size);
    /* XFER_OK: the slot's copy landed; XFER_INPROGRESS; or the copy's error. */
    xfer_status_t   (*poll)(xfer_copier_t *c, unsigned slot, char *why, size_t why_size);
    /* Wait for every copy in flight, release the engine's resources. */
    void            (*close)(xfer_copier_t *c);
} xfer_copier_ops_t;

struct xfer_copier {
    const xfer_copier_ops_t  *ops;
    unsigned                 num_slots;
    /* CUDA */
    const xfer_cuda_driver_t *cu;
    void                     *cu_ctx;       /* the context the stream and events live in */
    int                      primary_device;/* >= 0: cu_ctx is this device's retained
                                             * primary context */
    void                     *stream;
    void                     **events;      /* one per slot */
    /* host memcpy */
    struct host_copy         *host;         /* one per slot */
    unsigned                 host_delay;    /* polls before a copy lands */
};

/* Open a copy engine with num_slots slots. CUDA: a stream and events in cu_ctx, the context
 * of the memory being staged; NULL (stream-ordered allocations have none) takes device's
 * primary context. */
xfer_status_t xfer_copier_open_cuda(xfer_copier_t *c, unsigned num_slots, void *cu_ctx,
                                    int device, char *why, size_t why_size);
/* A copy that has landed when it returns, in the CUDA engine's context, ordered after every
 * copy the engine started before (its stream, synchronised); the host side may be any host
 * memory. */
xfer_status_t xfer_copier_sync_cuda(xfer_copier_t *c, void *dst, const void *src, size_t len,
                                    xfer_staging_dir_t dir, char *why, size_t why_size);
xfer_status_t xfer_copier_open_host(xfer_copier_t *c, unsigned num_slots, unsigned delay,
                                    char *why, size_t why_size);

/* ---- the pipeline (staging.c) --------------------------------------------------------------- */

typedef struct xfer_staging xfer_staging_t;

/* A put or get of a staged buffer over ep (the checks of endpoint.c or batch.c done, the lock
 * held): comp is told once every chunk has been copied and transferred (a request's, or one
 * descriptor's of a staged batch), from xfer_staging_progress. XFER_INPROGRESS or an error
 * (comp untouched). */
xfer_status_t xfer_staging_rma(xfer_endpoint_t *ep, xfer_comp_t *comp, int is_put,
                               void *buf, size_t length, xfer_mem_t *mem, uint64_t remote_addr,
                               xfer_rkey_t *rkey);

/* Progress: land copies, post the next transfers, complete finished operations; how many
 * steps were taken. After the transports' progress. */
unsigned xfer_staging_progress(xfer_context_t *ctx);
/* 1 when a copy is in flight: a sleep must not wait for a file descriptor then. */
int xfer_staging_copying(const xfer_context_t *ctx);
/* The endpoint is going: its operations post nothing more and fail with XFER_ERR_CANCELED
 * unless already failed (what is posted completes from the transport's ep_destroy). */
void xfer_staging_ep_destroy(xfer_endpoint_t *ep);
/* Context destroy, after the endpoints: wait for copies, fail what is left, release the
 * pool (its registrations and pinned memory) and the copy engine. */
void xfer_staging_destroy(xfer_context_t *ctx);

/* ---- messages and tensors, staged whole (staging_msg.c) ------------------------------------ */

typedef struct xfer_msg_stage xfer_msg_stage_t;

/* Whether transport fi cannot touch mem, so that a message of it is staged. */
int xfer_msg_staged(const xfer_mem_t *mem, const xfer_fw_iface_t *fi);
/* A send of mem's buf: a host copy made now (req owns it until it ends) in *host_p. */
xfer_status_t xfer_msg_stage_send(xfer_request_t *req, const void *buf, size_t length,
                                  const xfer_mem_t *mem, void **host_p);
/* A receive into mem's buf: a host buffer of length bytes to post instead, in *host_p. */
xfer_status_t xfer_msg_stage_recv(xfer_request_t *req, void *buf, size_t length,
                                  const xfer_mem_t *mem, void **host_p);
/* Whether a fetch over ep with params goes through host memory; then xfer_msg_stage_fetch
 * turns args into an allocation of a host buffer once the tensor's size is known. */
int xfer_msg_stage_fetch_needed(const xfer_endpoint_t *ep, const xfer_fetch_params_t *params);
xfer_status_t xfer_msg_stage_fetch(xfer_request_t *req, const xfer_fetch_params_t *params,
                                   xfer_fetch_args_t *args);
/* req (req->stage set) ended with *status_p: what arrived is copied where it belongs (the
 * status becomes the copy's failure, if any), the host buffer freed. */
void xfer_msg_stage_end(xfer_request_t *req, xfer_status_t *status_p, size_t *length_p);
void xfer_msg_stage_free(xfer_request_t *req);
/* A tensor published in ctx: a host copy of its data in *copy_p when asked (copy_asked) or
 * when it is device memory that an open transport cannot touch; else NULL. */
xfer_status_t xfer_msg_stage_publish(xfer_context_t *ctx, const xfer_tensor_t *tensor,
                                     int copy_asked, void **copy_p);
/* Context destroy, after every request: the copy engines. */
void xfer_msg_stage_cleanup(xfer_context_t *ctx);

#endif /* XFER_STAGING_H */
