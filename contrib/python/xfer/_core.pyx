# cython: language_level=3, boundscheck=False, wraparound=False, embedsignature=True
"""
The binding's core: xfer's objects as Python classes, buffers taken through the buffer
protocol or DLPack without copies, requests that complete through xfer's callbacks (which
run where progress runs, holding the GIL only to record the outcome), and the context's
event fd for asyncio.

Every call into xfer releases the GIL: a callback needs the GIL, and runs under the
context's lock, so a thread holding the GIL must never wait for that lock.
"""
from cpython.buffer cimport (PyObject_CheckBuffer, PyObject_GetBuffer, PyBuffer_Release,
                             PyBUF_ANY_CONTIGUOUS, PyBUF_C_CONTIGUOUS, PyBUF_FORMAT,
                             PyBUF_WRITABLE, PyBUF_SIMPLE)
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.pycapsule cimport (PyCapsule_GetPointer, PyCapsule_SetName, PyCapsule_IsValid,
                               PyCapsule_New, PyCapsule_Destructor)
from cpython.ref cimport PyObject, Py_INCREF, Py_XDECREF
from cpython.pythread cimport PyThread_get_thread_ident
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memset

from xfer._cxfer cimport *

import asyncio
import weakref

cdef extern from *:
    """
    /* DLPack's ABI (dlpack.h, v0.8; Apache-2.0), the part a consumer reads */
    typedef struct { int32_t device_type; int32_t device_id; } xfer_py_dl_device;
    typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } xfer_py_dl_dtype;
    typedef struct {
        void *data; xfer_py_dl_device device; int32_t ndim; xfer_py_dl_dtype dtype;
        int64_t *shape; int64_t *strides; uint64_t byte_offset;
    } xfer_py_dl_tensor;
    typedef struct xfer_py_dl_managed {
        xfer_py_dl_tensor dl_tensor; void *manager_ctx;
        void (*deleter)(struct xfer_py_dl_managed *self);
    } xfer_py_dl_managed;
    """
    ctypedef struct xfer_py_dl_device:
        int32_t device_type
        int32_t device_id
    ctypedef struct xfer_py_dl_dtype:
        uint8_t code
        uint8_t bits
        uint16_t lanes
    ctypedef struct xfer_py_dl_tensor:
        void *data
        xfer_py_dl_device device
        int32_t ndim
        xfer_py_dl_dtype dtype
        int64_t *shape
        int64_t *strides
        uint64_t byte_offset
    ctypedef struct xfer_py_dl_managed:
        xfer_py_dl_tensor dl_tensor
        void *manager_ctx
        void (*deleter)(xfer_py_dl_managed *self)

# DLPack device types and dtype codes
DEF DL_CPU = 1
DEF DL_CUDA = 2
DEF DL_CUDA_HOST = 3
DEF DL_CUDA_MANAGED = 13
DEF DL_INT = 0
DEF DL_UINT = 1
DEF DL_FLOAT = 2
DEF DL_BFLOAT = 4
DEF DL_BOOL = 6

ALL_TAGS = 0xffffffffffffffff

# ---- errors ------------------------------------------------------------------------------------

class XferError(Exception):
    """An xfer call or operation failed: ``status`` is xfer's status code (negative),
    ``name`` its text (``xfer_status_string``), ``reason`` xfer's words for why (what it
    logged, ``xfer_last_error``; "" when it said nothing)."""

    def __init__(self, status, what, reason=""):
        self.status = int(status)
        self.name = xfer_status_string(<xfer_status_t>self.status).decode()
        self.reason = reason
        super().__init__(f"{what}: {self.name} ({reason})" if reason else
                         f"{what}: {self.name}")


class XferTimeoutError(XferError, TimeoutError):
    """A wait ran out of time; the request is still pending."""


cdef inline int check(xfer_status_t st, what) except -1:
    """Raise for a failed call; its reason is what xfer logged on this thread since the
    xfer_last_error_clear() that precedes every call here."""
    if st == XFER_OK or st == XFER_INPROGRESS:
        return 0
    reason = xfer_last_error().decode(errors="replace")
    if st == XFER_ERR_TIMEOUT:
        raise XferTimeoutError(st, what, reason)
    raise XferError(st, what, reason)


def status_string(int status):
    """xfer's text for a status code."""
    return xfer_status_string(<xfer_status_t>status).decode()

include "_buffers.pxi"
include "_requests.pxi"
include "_objects.pxi"
include "_batches.pxi"

# ---- the context -------------------------------------------------------------------------------

cdef class Context:
    """xfer's context: the transports the environment (XFER_*) allows, opened. auth_key
    (bytes, 16 to 4096) is the key every peer must prove it holds, as XFER_AUTH_KEY_FILE's;
    a peer without it is refused with XFER_ERR_DENIED."""
    cdef xfer_context_t *ctx
    cdef dict reactors
    cdef object _endpoints          # xfer's endpoint (its address) -> its Endpoint, weakly
    cdef object _notify_handler
    cdef object _handler_error      # what the notification handler raised, for progress()

    def __cinit__(self, progress_thread=False, serialized=False, auth_key=None):
        cdef xfer_context_params_t params
        cdef xfer_status_t st
        cdef bytes key = bytes(auth_key) if auth_key is not None else None
        cdef const char *key_p = NULL
        memset(&params, 0, sizeof(params))
        params.size = sizeof(params)
        params.flags = ((XFER_CONTEXT_FLAG_PROGRESS_THREAD if progress_thread else 0) |
                        (XFER_CONTEXT_FLAG_SERIALIZED if serialized else 0))
        if key is not None:
            key_p = key
            params.auth_key = key_p
            params.auth_key_len = len(key)
        with nogil:
            xfer_last_error_clear()
            st = xfer_context_create(&params, &self.ctx)
        if st != XFER_OK:
            self.ctx = NULL
            check(st, "context_create (the log says why)")
        self.reactors = {}
        self._endpoints = weakref.WeakValueDictionary()

    cdef object _endpoint(self, xfer_endpoint_t *ep):
        return self._endpoints.get(<uintptr_t>ep)

    def on_notify(self, handler):
        """handler(endpoint, message: bytes) for every notification, from progress, in order
        per endpoint (those already queued too); None removes it. What it raises, progress()
        raises."""
        cdef xfer_status_t st
        self.check_open()
        self._notify_handler = handler
        with nogil:
            xfer_last_error_clear()
            if handler is None:
                st = xfer_notify_handler_set(self.ctx, NULL, NULL)
            else:
                st = xfer_notify_handler_set(self.ctx, notify_cb, <void*>self)
        check(st, "notify_handler_set")

    cdef check_open(self):
        if self.ctx == NULL:
            raise XferError(XFER_ERR_INVALID_PARAM, "the context is closed")

    @property
    def is_open(self):
        return self.ctx != NULL

    def listen(self, str address=":0"):
        """Listen for peers at address ("host:port", "[v6]:port"; port 0 picks one). The
        default, ":0", is loopback (127.0.0.1 and ::1): only this host's processes reach it;
        name an interface's address, or "*:port" (every interface, both families), to be
        reachable from the network."""
        cdef Listener lst = Listener.__new__(Listener)
        cdef bytes a = address.encode()
        cdef const char *ap = a
        cdef xfer_status_t st
        self.check_open()
        with nogil:
            xfer_last_error_clear()
            st = xfer_listen(self.ctx, ap, &lst.l)
        check(st, f"listen on {address}")
        lst.context = self
        return lst

    def connect(self, str address):
        """Connect to a listener ("host:port"); blocks for the handshake (GIL released)."""
        cdef xfer_endpoint_t *ep = NULL
        cdef bytes a = address.encode()
        cdef const char *ap = a
        cdef xfer_status_t st
        self.check_open()
        with nogil:
            xfer_last_error_clear()
            st = xfer_connect(self.ctx, ap, &ep)
        check(st, f"connect to {address}")
        return endpoint_of(self, ep)

    async def connect_async(self, str address):
        """connect() for asyncio: the handshake runs in the loop's executor."""
        return await asyncio.get_running_loop().run_in_executor(None, self.connect, address)

    def register(self, buf, cuda=None):
        """Register buf (buffer protocol or DLPack; CUDA memory found by DLPack's device or
        cuda=True) for put/get and faster sends."""
        cdef Memory m = Memory.__new__(Memory)
        cdef xfer_mem_type_t mt
        cdef xfer_status_t st
        self.check_open()
        m.buf = acquire(buf, True)
        if cuda is None:
            mt = XFER_MEM_CUDA if m.buf.cuda else XFER_MEM_HOST
        else:
            mt = XFER_MEM_CUDA if cuda else XFER_MEM_HOST
        with nogil:
            xfer_last_error_clear()
            st = xfer_mem_register(self.ctx, m.buf.ptr, m.buf.nbytes, mt, &m.mem)
        if st != XFER_OK:
            m.buf.release()
            check(st, "mem_register")
        m.context = self
        return m

    def tag_recv(self, buf, uint64_t tag, uint64_t mask=ALL_TAGS, Endpoint ep=None,
                 Memory mem=None):
        """Receive a message whose tag matches (tag & mask) into buf, from ep or any peer."""
        cdef _Buf b
        cdef Request r
        cdef xfer_status_t st
        cdef xfer_endpoint_t *e = NULL
        cdef xfer_mem_t *mp = mem_ptr(mem)
        self.check_open()
        if ep is not None:
            ep.check()
            e = ep.ep
        b = acquire(buf, True)
        r = Request.new(self, "recv", b)
        with nogil:
            xfer_last_error_clear()
            st = xfer_tag_recv(self.ctx, e, tag, mask, b.ptr, b.nbytes, mp, complete_cb,
                               <void*>r, &r.req)
        r.posted(st, "tag_recv")
        return r

    def publish(self, uint64_t step, str key, tensor, bint copy=False, str dtype=None):
        """Publish tensor (a C-contiguous array: numpy, or anything with DLPack) under
        (step, key) for one fetch. Without copy it must stay unchanged until the request
        completes; dtype overrides the element type (e.g. "bfloat16")."""
        cdef _Buf b
        cdef Request r
        cdef xfer_tensor_t t
        cdef xfer_status_t st
        cdef bytes k = key.encode()
        cdef const char *kp = k
        cdef uint32_t flags = XFER_PUBLISH_COPY if copy else 0
        self.check_open()
        b = acquire(tensor, False, True)
        memset(&t, 0, sizeof(t))
        cdef int code = DTYPE_CODES[dtype] if dtype is not None else b.dtype
        t.dtype = <xfer_dtype_t>code
        if t.dtype == XFER_DTYPE_INVALID:
            b.release()
            raise TypeError("the tensor's element type has no xfer dtype; pass dtype=")
        t.rank = b.rank
        for i in range(b.rank):
            t.dims[i] = b.dims[i]
        t.size = b.nbytes
        t.data = b.ptr
        r = Request.new(self, "publish", b)
        with nogil:
            xfer_last_error_clear()
            st = xfer_tensor_publish(self.ctx, step, kp, &t, flags, complete_cb, <void*>r,
                                     &r.req)
        r.posted(st, "tensor_publish")
        if copy:
            r.drop_bufs()
        return r

    def abort(self, uint64_t step, int status=-17):
        """Abort a step: its publishes and fetches here, and peers' fetches of it, fail."""
        cdef xfer_status_t st
        self.check_open()
        with nogil:
            xfer_last_error_clear()
            st = xfer_tensor_abort(self.ctx, step, <xfer_status_t>status)
        check(st, "tensor_abort")

    def progress(self):
        """One round of every transport's progress; the events processed."""
        cdef unsigned n
        self.check_open()
        with nogil:
            n = xfer_progress(self.ctx)
        if self._handler_error is not None:
            e, self._handler_error = self._handler_error, None
            raise e
        return n

    @property
    def event_fd(self):
        """A descriptor that is readable when progress has work (see arm())."""
        cdef int fd
        self.check_open()
        with nogil:
            fd = xfer_context_event_fd(self.ctx)
        if fd < 0:
            raise XferError(XFER_ERR_NO_MEMORY, "event_fd")
        return fd

    def arm(self):
        """True when nothing is pending, so sleeping on event_fd loses nothing; False: call
        progress() again first."""
        cdef xfer_status_t st
        self.check_open()
        with nogil:
            xfer_last_error_clear()
            st = xfer_context_arm(self.ctx)
        if st == XFER_ERR_BUSY:
            return False
        check(st, "context_arm")
        return True

    def _reactor(self, loop):
        r = self.reactors.get(loop)
        if r is None:
            r = self.reactors[loop] = _Reactor(self, loop)
        return r

    def close(self):
        """Destroy the context: what is still open closes, pending requests fail with
        XFER_ERR_CANCELED; every object of it is unusable afterwards."""
        cdef xfer_context_t *ctx = self.ctx
        for r in self.reactors.values():
            r.close()
        self.reactors.clear()
        if ctx != NULL:
            with nogil:
                xfer_context_destroy(ctx)
            self.ctx = NULL

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __dealloc__(self):
        if self.ctx != NULL:
            with nogil:
                xfer_context_destroy(self.ctx)
            self.ctx = NULL
