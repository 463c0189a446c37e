# The part of xfer/xfer.h the Python binding calls (declarations only).
from libc.stdint cimport uint16_t, uint32_t, uint64_t, int64_t

cdef extern from "xfer/xfer.h" nogil:
    ctypedef enum xfer_status_t:
        XFER_OK
        XFER_INPROGRESS
        XFER_ERR_INVALID_PARAM
        XFER_ERR_TIMEOUT
        XFER_ERR_BUSY
        XFER_ERR_NO_MEMORY
        XFER_ERR_UNSUPPORTED
        XFER_ERR_INTERNAL
        XFER_ERR_CANCELED
        XFER_ERR_NOT_FOUND
        XFER_ERR_TRUNCATED

    ctypedef enum xfer_dtype_t:
        XFER_DTYPE_INVALID
        XFER_DTYPE_FLOAT16
        XFER_DTYPE_BFLOAT16
        XFER_DTYPE_FLOAT32
        XFER_DTYPE_FLOAT64
        XFER_DTYPE_INT8
        XFER_DTYPE_INT16
        XFER_DTYPE_INT32
        XFER_DTYPE_INT64
        XFER_DTYPE_UINT8
        XFER_DTYPE_UINT16
        XFER_DTYPE_UINT32
        XFER_DTYPE_UINT64
        XFER_DTYPE_BOOL
        XFER_DTYPE_BYTES
        XFER_DTYPE_LAST

    ctypedef enum xfer_mem_type_t:
        XFER_MEM_HOST
        XFER_MEM_CUDA
        XFER_MEM_AUTO

    enum:
        XFER_TENSOR_MAX_RANK
        XFER_CONTEXT_FLAG_PROGRESS_THREAD
        XFER_CONTEXT_FLAG_SERIALIZED
        XFER_CLOSE_FLAG_FORCE
        XFER_PUBLISH_COPY

    ctypedef struct xfer_tensor_t:
        xfer_dtype_t dtype
        uint32_t     rank
        int64_t      dims[8]
        uint64_t     size
        void         *data
        int          is_dead

    ctypedef struct xfer_context_t
    ctypedef struct xfer_endpoint_t
    ctypedef struct xfer_listener_t
    ctypedef struct xfer_mem_t
    ctypedef struct xfer_rkey_t
    ctypedef struct xfer_request_t

    ctypedef void (*xfer_request_cb_t)(xfer_request_t *req, xfer_status_t status,
                                       void *user_data)
    ctypedef void *(*xfer_tensor_alloc_cb_t)(const xfer_tensor_t *meta, void *alloc_arg)

    ctypedef struct xfer_context_params_t:
        uint32_t size
        uint32_t flags
        const void *auth_key
        size_t auth_key_len

    ctypedef struct xfer_fetch_params_t:
        uint32_t               size
        void                   *buffer
        size_t                 capacity
        xfer_mem_t             *mem
        xfer_tensor_alloc_cb_t alloc
        void                   *alloc_arg

    const char *xfer_status_string(xfer_status_t status)
    const char *xfer_last_error()
    void xfer_last_error_clear()
    size_t xfer_dtype_size(xfer_dtype_t dtype)

    xfer_status_t xfer_context_create(const xfer_context_params_t *params,
                                      xfer_context_t **ctx_p)
    void xfer_context_destroy(xfer_context_t *ctx)
    unsigned xfer_progress(xfer_context_t *ctx)
    int xfer_context_event_fd(xfer_context_t *ctx)
    xfer_status_t xfer_context_arm(xfer_context_t *ctx)

    xfer_status_t xfer_mem_register(xfer_context_t *ctx, void *addr, size_t length,
                                    xfer_mem_type_t type, xfer_mem_t **mem_p)
    xfer_status_t xfer_mem_deregister(xfer_mem_t *mem)
    void *xfer_mem_address(const xfer_mem_t *mem)
    size_t xfer_mem_length(const xfer_mem_t *mem)
    xfer_status_t xfer_rkey_pack(xfer_mem_t *mem, void **blob_p, size_t *length_p)
    void xfer_rkey_blob_free(void *blob)
    xfer_status_t xfer_rkey_unpack(xfer_endpoint_t *ep, const void *blob, size_t length,
                                   xfer_rkey_t **rkey_p)
    uint64_t xfer_rkey_address(const xfer_rkey_t *rkey)
    size_t xfer_rkey_length(const xfer_rkey_t *rkey)
    void xfer_rkey_destroy(xfer_rkey_t *rkey)

    xfer_status_t xfer_request_test(xfer_request_t *req)
    xfer_status_t xfer_request_wait(xfer_request_t *req, int timeout_ms)
    xfer_status_t xfer_request_cancel(xfer_request_t *req)
    size_t xfer_request_length(const xfer_request_t *req)
    size_t xfer_request_landed(const xfer_request_t *req)
    uint64_t xfer_request_tag(const xfer_request_t *req)
    const xfer_tensor_t *xfer_request_tensor(const xfer_request_t *req)
    void xfer_request_release(xfer_request_t *req)

    xfer_status_t xfer_listen(xfer_context_t *ctx, const char *address,
                              xfer_listener_t **listener_p)
    uint16_t xfer_listener_port(const xfer_listener_t *listener)
    int xfer_listener_fd(const xfer_listener_t *listener)
    void xfer_listener_close(xfer_listener_t *listener)
    xfer_status_t xfer_accept(xfer_listener_t *listener, int timeout_ms, xfer_endpoint_t **ep_p)
    xfer_status_t xfer_connect(xfer_context_t *ctx, const char *address, xfer_endpoint_t **ep_p)
    const char *xfer_endpoint_transport(const xfer_endpoint_t *ep)
    const char *xfer_endpoint_peer(const xfer_endpoint_t *ep)
    xfer_status_t xfer_endpoint_status(const xfer_endpoint_t *ep)
    xfer_status_t xfer_endpoint_flush(xfer_endpoint_t *ep, xfer_request_cb_t cb,
                                      void *user_data, xfer_request_t **req_p)
    xfer_status_t xfer_endpoint_close_nb(xfer_endpoint_t *ep, uint32_t flags,
                                         xfer_request_cb_t cb, void *user_data,
                                         xfer_request_t **req_p)
    void xfer_endpoint_close(xfer_endpoint_t *ep)

    xfer_status_t xfer_put(xfer_endpoint_t *ep, const void *buf, size_t length, xfer_mem_t *mem,
                           uint64_t remote_addr, xfer_rkey_t *rkey, xfer_request_cb_t cb,
                           void *user_data, xfer_request_t **req_p)
    xfer_status_t xfer_get(xfer_endpoint_t *ep, void *buf, size_t length, xfer_mem_t *mem,
                           uint64_t remote_addr, xfer_rkey_t *rkey, xfer_request_cb_t cb,
                           void *user_data, xfer_request_t **req_p)
    xfer_status_t xfer_tag_send(xfer_endpoint_t *ep, uint64_t tag, const void *buf,
                                size_t length, xfer_mem_t *mem, xfer_request_cb_t cb,
                                void *user_data, xfer_request_t **req_p)
    xfer_status_t xfer_tag_recv(xfer_context_t *ctx, xfer_endpoint_t *ep, uint64_t tag,
                                uint64_t tag_mask, void *buf, size_t length, xfer_mem_t *mem,
                                xfer_request_cb_t cb, void *user_data, xfer_request_t **req_p)
    xfer_status_t xfer_tensor_publish(xfer_context_t *ctx, uint64_t step, const char *key,
                                      const xfer_tensor_t *tensor, uint32_t flags,
                                      xfer_request_cb_t cb, void *user_data,
                                      xfer_request_t **req_p)
    xfer_status_t xfer_tensor_fetch(xfer_endpoint_t *ep, uint64_t step, const char *key,
                                    const xfer_fetch_params_t *params, xfer_request_cb_t cb,
                                    void *user_data, xfer_request_t **req_p)
    xfer_status_t xfer_tensor_abort(xfer_context_t *ctx, uint64_t step, xfer_status_t status)

    ctypedef struct xfer_batch_t
    ctypedef struct xfer_batch_desc_t:
        uint64_t local_offset
        uint64_t remote_offset
        uint64_t length
    ctypedef enum xfer_batch_op_t:
        XFER_BATCH_PUT
        XFER_BATCH_GET
    int XFER_BATCH_NO_TIMEOUT
    xfer_status_t xfer_batch_create(xfer_endpoint_t *ep, xfer_batch_op_t op, xfer_mem_t *mem,
                                    xfer_rkey_t *rkey, const xfer_batch_desc_t *descs,
                                    size_t count, xfer_batch_t **batch_p)
    xfer_status_t xfer_batch_post(xfer_batch_t *batch, const void *notify, size_t notify_len,
                                  int timeout_ms, xfer_request_cb_t cb, void *user_data,
                                  xfer_request_t **req_p)
    xfer_status_t xfer_batch_destroy(xfer_batch_t *batch)
    ctypedef void (*xfer_notify_cb_t)(xfer_endpoint_t *ep, const void *msg, size_t length,
                                      void *user_data)
    xfer_status_t xfer_notify_handler_set(xfer_context_t *ctx, xfer_notify_cb_t cb,
                                          void *user_data)
    xfer_status_t xfer_notify_poll(xfer_endpoint_t *ep, void *buf, size_t capacity,
                                   size_t *length_p)
