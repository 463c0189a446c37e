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
from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_SetName, PyCapsule_IsValid
from cpython.pythread cimport PyThread_get_thread_ident
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memset

from xfer._cxfer cimport *

import asyncio

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
    ``name`` its text (``xfer_status_string``)."""

    def __init__(self, status, what):
        self.status = int(status)
        self.name = xfer_status_string(<xfer_status_t>self.status).decode()
        super().__init__(f"{what}: {self.name}")


class XferTimeoutError(XferError, TimeoutError):
    """A wait ran out of time; the request is still pending."""


cdef inline int check(xfer_status_t st, what) except -1:
    if st == XFER_OK or st == XFER_INPROGRESS:
        return 0
    if st == XFER_ERR_TIMEOUT:
        raise XferTimeoutError(st, what)
    raise XferError(st, what)


def status_string(int status):
    """xfer's text for a status code."""
    return xfer_status_string(<xfer_status_t>status).decode()

# ---- buffers -----------------------------------------------------------------------------------

cdef class _Buf:
    """A contiguous buffer of some Python object, held (not copied) until release()."""
    cdef Py_buffer view
    cdef bint has_view
    cdef xfer_py_dl_managed *managed
    cdef object capsule
    cdef void *ptr
    cdef size_t nbytes
    cdef bint cuda
    cdef int dtype              # xfer_dtype_t, when asked for
    cdef uint32_t rank
    cdef int64_t dims[8]

    cdef release(self):
        if self.has_view:
            PyBuffer_Release(&self.view)
            self.has_view = False
        if self.managed != NULL:
            if self.managed.deleter != NULL:
                self.managed.deleter(self.managed)
            self.managed = NULL
            self.capsule = None

    def __dealloc__(self):
        self.release()


cdef int dtype_from_format(const char *fmt, Py_ssize_t itemsize):
    cdef char c = fmt[0] if fmt != NULL else b'B'
    if c in (b'@', b'=', b'<', b'!', b'>'):
        c = fmt[1]
    if c == b'e':
        return XFER_DTYPE_FLOAT16
    if c == b'f':
        return XFER_DTYPE_FLOAT32
    if c == b'd':
        return XFER_DTYPE_FLOAT64
    if c == b'?':
        return XFER_DTYPE_BOOL
    if c in (b'b', b'h', b'i', b'l', b'q'):
        return {1: XFER_DTYPE_INT8, 2: XFER_DTYPE_INT16, 4: XFER_DTYPE_INT32,
                8: XFER_DTYPE_INT64}.get(itemsize, XFER_DTYPE_INVALID)
    if c in (b'B', b'H', b'I', b'L', b'Q', b'c'):
        return {1: XFER_DTYPE_UINT8, 2: XFER_DTYPE_UINT16, 4: XFER_DTYPE_UINT32,
                8: XFER_DTYPE_UINT64}.get(itemsize, XFER_DTYPE_INVALID)
    return XFER_DTYPE_INVALID


cdef int dtype_from_dl(xfer_py_dl_dtype d):
    if d.lanes != 1:
        return XFER_DTYPE_INVALID
    if d.code == DL_FLOAT:
        return {16: XFER_DTYPE_FLOAT16, 32: XFER_DTYPE_FLOAT32,
                64: XFER_DTYPE_FLOAT64}.get(d.bits, XFER_DTYPE_INVALID)
    if d.code == DL_BFLOAT and d.bits == 16:
        return XFER_DTYPE_BFLOAT16
    if d.code == DL_INT:
        return {8: XFER_DTYPE_INT8, 16: XFER_DTYPE_INT16, 32: XFER_DTYPE_INT32,
                64: XFER_DTYPE_INT64}.get(d.bits, XFER_DTYPE_INVALID)
    if d.code == DL_UINT:
        return {8: XFER_DTYPE_UINT8, 16: XFER_DTYPE_UINT16, 32: XFER_DTYPE_UINT32,
                64: XFER_DTYPE_UINT64}.get(d.bits, XFER_DTYPE_INVALID)
    if d.code == DL_BOOL and d.bits == 8:
        return XFER_DTYPE_BOOL
    return XFER_DTYPE_INVALID


cdef _Buf acquire(object obj, bint writable, bint shaped=False):
    """obj's memory: through the buffer protocol (host memory), else DLPack (host or CUDA).
    shaped: also its dtype and shape (C order), for tensors."""
    cdef _Buf b = _Buf.__new__(_Buf)
    cdef int flags
    cdef xfer_py_dl_tensor *t
    cdef int64_t n, expect
    if PyObject_CheckBuffer(obj):
        flags = (PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) if shaped else PyBUF_ANY_CONTIGUOUS
        if writable:
            flags |= PyBUF_WRITABLE
        PyObject_GetBuffer(obj, &b.view, flags)
        b.has_view = True
        b.ptr = b.view.buf
        b.nbytes = <size_t>b.view.len
        if shaped:
            if b.view.ndim > XFER_TENSOR_MAX_RANK:
                b.release()
                raise ValueError(f"a tensor of rank {b.view.ndim}; xfer takes up to 8")
            b.dtype = dtype_from_format(b.view.format, b.view.itemsize)
            b.rank = <uint32_t>b.view.ndim
            for i in range(b.view.ndim):
                b.dims[i] = b.view.shape[i]
        return b
    if hasattr(obj, "__dlpack__"):
        capsule = obj.__dlpack__()
        if not PyCapsule_IsValid(capsule, "dltensor"):
            raise TypeError("__dlpack__ returned no unused 'dltensor' capsule")
        b.managed = <xfer_py_dl_managed*>PyCapsule_GetPointer(capsule, "dltensor")
        PyCapsule_SetName(capsule, "used_dltensor")     # ours now: we call its deleter
        b.capsule = capsule
        t = &b.managed.dl_tensor
        if t.device.device_type not in (DL_CPU, DL_CUDA, DL_CUDA_HOST, DL_CUDA_MANAGED):
            b.release()
            raise TypeError(f"DLPack device type {t.device.device_type}: xfer moves host "
                            "and CUDA memory")
        if t.ndim > XFER_TENSOR_MAX_RANK:
            b.release()
            raise ValueError(f"a tensor of rank {t.ndim}; xfer takes up to 8")
        n = 1
        for i in range(t.ndim):
            n *= t.shape[i]
        if t.strides != NULL:       # C-contiguous, or it would need a copy
            expect = 1
            for i in range(t.ndim - 1, -1, -1):
                if t.shape[i] != 1 and t.strides[i] != expect:
                    b.release()
                    raise BufferError("the DLPack tensor is not contiguous (C order)")
                expect *= t.shape[i]
        b.ptr = <char*>t.data + t.byte_offset
        b.nbytes = <size_t>(n * ((t.dtype.bits * t.dtype.lanes + 7) // 8))
        b.cuda = t.device.device_type == DL_CUDA
        b.dtype = dtype_from_dl(t.dtype)
        b.rank = <uint32_t>t.ndim
        for i in range(t.ndim):
            b.dims[i] = t.shape[i]
        return b
    raise TypeError(f"{type(obj).__name__} exposes neither the buffer protocol nor DLPack")


cdef class _Owned:
    """Memory xfer allocated for a fetched tensor, freed with the last view of it."""
    cdef void *ptr
    cdef Py_ssize_t size
    cdef Py_ssize_t shape[1]

    def __getbuffer__(self, Py_buffer *view, int flags):
        self.shape[0] = self.size
        view.buf = self.ptr
        view.obj = self
        view.len = self.size
        view.readonly = 0
        view.itemsize = 1
        view.format = NULL
        if flags & PyBUF_FORMAT:
            view.format = b"B"
        view.ndim = 1
        view.shape = self.shape
        view.strides = NULL
        view.suboffsets = NULL
        view.internal = NULL

    def __releasebuffer__(self, Py_buffer *view):
        pass

    def __dealloc__(self):
        free(self.ptr)

# ---- tensors -----------------------------------------------------------------------------------

DTYPES = {XFER_DTYPE_FLOAT16: "float16", XFER_DTYPE_BFLOAT16: "bfloat16",
          XFER_DTYPE_FLOAT32: "float32", XFER_DTYPE_FLOAT64: "float64",
          XFER_DTYPE_INT8: "int8", XFER_DTYPE_INT16: "int16", XFER_DTYPE_INT32: "int32",
          XFER_DTYPE_INT64: "int64", XFER_DTYPE_UINT8: "uint8", XFER_DTYPE_UINT16: "uint16",
          XFER_DTYPE_UINT32: "uint32", XFER_DTYPE_UINT64: "uint64", XFER_DTYPE_BOOL: "bool",
          XFER_DTYPE_BYTES: "bytes"}
DTYPE_CODES = {v: k for k, v in DTYPES.items()}


class Tensor:
    """A fetched tensor: ``dtype`` (a name: "float32", "bfloat16", ...), ``shape``,
    ``is_dead``, and ``data`` - a numpy array over the bytes (bfloat16 as uint16, bytes as
    uint8) when numpy is there, else a memoryview. No copy: the array is the fetch's buffer."""

    __slots__ = ("dtype", "shape", "is_dead", "data")

    def __init__(self, dtype, shape, is_dead, data):
        self.dtype = dtype
        self.shape = shape
        self.is_dead = is_dead
        self.data = data

    def __repr__(self):
        return f"Tensor(dtype={self.dtype!r}, shape={self.shape!r}, is_dead={self.is_dead})"


cdef object as_array(object buf, str dtype, tuple shape, Py_ssize_t size):
    try:
        import numpy
    except ImportError:
        return memoryview(buf)[:size]
    storage = {"bfloat16": "uint16", "bytes": "uint8"}.get(dtype, dtype)
    arr = numpy.frombuffer(buf, dtype=numpy.uint8, count=size).view(storage)
    return arr.reshape(shape) if dtype != "bytes" else arr

# ---- requests ----------------------------------------------------------------------------------

cdef set _inflight = set()      # requests xfer may still call back: they must stay alive

ctypedef struct fetch_alloc_t:
    void   *ptr
    size_t size


cdef void *fetch_alloc(const xfer_tensor_t *meta, void *arg) nogil:
    cdef fetch_alloc_t *fa = <fetch_alloc_t*>arg
    fa.ptr = malloc(meta.size if meta.size > 0 else 1)
    fa.size = meta.size
    return fa.ptr


cdef void complete_cb(xfer_request_t *req, xfer_status_t status, void *user_data) with gil:
    cdef Request r = <Request>user_data
    try:
        r.done_cb(status)
    except BaseException as e:      # a callback cannot raise into C: keep it for result()
        r._error = e
    _inflight.discard(r)


cdef class Request:
    """A non-blocking operation. ``wait()`` blocks (releasing the GIL), ``test()`` polls,
    ``await request`` suspends an asyncio task; each returns the operation's result or raises
    XferError with its status."""
    cdef xfer_request_t *req
    cdef readonly Context context
    cdef readonly str kind
    cdef int _status
    cdef object _bufs
    cdef object _result
    cdef object _error
    cdef object _future
    cdef object _loop
    cdef unsigned long _loop_thread
    cdef fetch_alloc_t *fa
    cdef object _out
    cdef size_t _length
    cdef uint64_t _tag

    def __cinit__(self):
        self._status = XFER_INPROGRESS

    @staticmethod
    cdef Request new(Context ctx, str kind, object bufs):
        cdef Request r = Request.__new__(Request)
        r.context = ctx
        r.kind = kind
        r._bufs = bufs
        _inflight.add(r)
        return r

    cdef posted(self, xfer_status_t st, what):
        if st != XFER_OK and st != XFER_INPROGRESS:
            _inflight.discard(self)
            self.drop_bufs()
            self._status = st
            check(st, what)

    cdef drop_bufs(self):
        if self._bufs is not None:
            if isinstance(self._bufs, _Buf):
                (<_Buf>self._bufs).release()
            else:           # buffers, and what must outlive the operation (a remote key)
                for b in self._bufs:
                    if isinstance(b, _Buf):
                        (<_Buf>b).release()
            self._bufs = None

    cdef done_cb(self, xfer_status_t status):
        cdef const xfer_tensor_t *t
        self._length = xfer_request_length(self.req)
        if self.kind == "recv":
            self._tag = xfer_request_tag(self.req)
        if self.kind == "fetch" and status == XFER_OK:
            t = xfer_request_tensor(self.req)
            self._result = self.tensor_of(t)
        elif self.fa != NULL and self.fa.ptr != NULL:
            free(self.fa.ptr)       # a failed fetch into our allocation
            self.fa.ptr = NULL
        self.drop_bufs()
        self._status = status
        if self._future is not None:
            if PyThread_get_thread_ident() == self._loop_thread:
                _settle(self._future, self)
            else:
                self._loop.call_soon_threadsafe(_settle, self._future, self)

    cdef object tensor_of(self, const xfer_tensor_t *t):
        cdef _Owned owned
        dtype = DTYPES.get(<int>t.dtype, "bytes")
        shape = tuple(t.dims[i] for i in range(t.rank))
        if t.is_dead:
            return Tensor(dtype, shape, True, None)
        if self.fa != NULL and self.fa.ptr != NULL:
            owned = _Owned.__new__(_Owned)
            owned.ptr = self.fa.ptr
            owned.size = <Py_ssize_t>t.size
            self.fa.ptr = NULL
            return Tensor(dtype, shape, False, as_array(owned, dtype, shape, owned.size))
        return Tensor(dtype, shape, False, as_array(self._out, dtype, shape, t.size))

    def __dealloc__(self):
        if self.req != NULL and self.context is not None and self.context.ctx != NULL:
            with nogil:
                xfer_request_release(self.req)
        self.req = NULL
        if self.fa != NULL:
            free(self.fa.ptr)
            free(self.fa)
            self.fa = NULL

    @property
    def status(self):
        """XFER_INPROGRESS (1) while pending, then the final status (0: done)."""
        return self._status

    def done(self):
        return self._status != XFER_INPROGRESS

    def test(self):
        """One round of progress; True once the request completed."""
        cdef xfer_status_t st
        if self._status == XFER_INPROGRESS and self.req != NULL:
            self.context.check_open()
            with nogil:
                st = xfer_request_test(self.req)
        return self._status != XFER_INPROGRESS

    def wait(self, timeout=None):
        """Progress (sleeping on the transports' descriptors) until done; return the result.
        timeout in seconds (None: no limit); XferTimeoutError when it runs out."""
        cdef int ms = -1 if timeout is None else max(0, int(timeout * 1000))
        cdef xfer_status_t st
        if self._status == XFER_INPROGRESS:
            self.context.check_open()
            with nogil:
                st = xfer_request_wait(self.req, ms)
            if self._status == XFER_INPROGRESS:
                check(st if st != XFER_OK else XFER_ERR_TIMEOUT, f"wait for a {self.kind}")
        return self.result()

    def result(self):
        """The outcome of a completed request: bytes moved (send, receive, put, get), a
        Tensor (fetch), None (publish, flush); raises XferError for a failed one."""
        if self._status == XFER_INPROGRESS:
            raise XferError(XFER_ERR_BUSY, f"the {self.kind} is still in progress")
        if self._error is not None:
            raise self._error
        check(<xfer_status_t>self._status, self.kind)
        if self.kind == "fetch":
            return self._result
        if self.kind in ("publish", "flush", "close"):
            return None
        return self._length

    @property
    def length(self):
        """Bytes moved; for a truncated receive, the message's length."""
        return self._length

    @property
    def tag(self):
        """A completed receive's sender tag."""
        return self._tag

    def cancel(self):
        """Cancel a posted receive or fetch (it completes with XFER_ERR_CANCELED)."""
        cdef xfer_status_t st
        if self._status == XFER_INPROGRESS:
            self.context.check_open()
            with nogil:
                st = xfer_request_cancel(self.req)
            if st != XFER_ERR_BUSY:
                check(st, "cancel")

    def __await__(self):
        return _await_request(self).__await__()

    def __repr__(self):
        state = "pending" if self._status == XFER_INPROGRESS else status_string(self._status)
        return f"<xfer.Request {self.kind} {state}>"


def _settle(fut, Request r):
    if fut.done():
        return
    try:
        fut.set_result(r.result())
    except BaseException as e:
        fut.set_exception(e)


async def _await_request(Request r):
    if r._status == XFER_INPROGRESS:
        loop = asyncio.get_running_loop()
        r._future = loop.create_future()
        r._loop = loop
        r._loop_thread = PyThread_get_thread_ident()
        r.context._reactor(loop).kick()
        return await r._future
    return r.result()


class _Reactor:
    """One per (context, event loop): progresses the context when its event fd is readable,
    and again soon while arm says work is pending."""

    def __init__(self, ctx, loop):
        self.ctx = ctx
        self.loop = loop
        self.scheduled = False
        self.fd = ctx.event_fd
        loop.add_reader(self.fd, self.run)

    def kick(self):
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self.run)

    def run(self):
        self.scheduled = False
        if not self.ctx.is_open:
            return
        self.ctx.progress()
        if not self.ctx.arm():
            self.kick()

    def close(self):
        self.loop.remove_reader(self.fd)

# ---- memory and keys ---------------------------------------------------------------------------

cdef class Memory:
    """A registered buffer (xfer_mem_register): the object's memory, held until
    deregister(). ``pack()`` gives the remote key a peer unpacks to put and get here."""
    cdef xfer_mem_t *mem
    cdef _Buf buf
    cdef readonly Context context

    @property
    def address(self):
        return <uint64_t>xfer_mem_address(self.mem) if self.mem != NULL else 0

    @property
    def length(self):
        return xfer_mem_length(self.mem) if self.mem != NULL else 0

    @property
    def is_cuda(self):
        return self.buf is not None and self.buf.cuda

    def pack(self):
        """The remote key, as bytes to send to the peer."""
        cdef void *blob = NULL
        cdef size_t length = 0
        cdef xfer_status_t st
        self.context.check_open()
        with nogil:
            st = xfer_rkey_pack(self.mem, &blob, &length)
        check(st, "rkey_pack")
        try:
            return PyBytes_FromStringAndSize(<char*>blob, <Py_ssize_t>length)
        finally:
            xfer_rkey_blob_free(blob)

    def deregister(self):
        cdef xfer_status_t st
        if self.mem != NULL and self.context.ctx != NULL:
            with nogil:
                st = xfer_mem_deregister(self.mem)
            check(st, "mem_deregister")
        self.mem = NULL
        if self.buf is not None:
            self.buf.release()
            self.buf = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.deregister()

    def __dealloc__(self):
        if self.mem != NULL and self.context is not None and self.context.ctx != NULL:
            with nogil:
                xfer_mem_deregister(self.mem)
        self.mem = NULL


cdef inline xfer_mem_t *mem_ptr(Memory m):
    return m.mem if m is not None else NULL


cdef class RemoteKey:
    """A peer's registered buffer, unpacked on an endpoint."""
    cdef xfer_rkey_t *rkey
    cdef readonly Endpoint endpoint

    @property
    def address(self):
        return xfer_rkey_address(self.rkey)

    @property
    def length(self):
        return xfer_rkey_length(self.rkey)

    def __dealloc__(self):
        if (self.rkey != NULL and self.endpoint is not None and
                self.endpoint.context.ctx != NULL):
            with nogil:
                xfer_rkey_destroy(self.rkey)
        self.rkey = NULL

# ---- connections -------------------------------------------------------------------------------

cdef class Endpoint:
    """A connection to one peer, over the transport the two sides agreed on."""
    cdef xfer_endpoint_t *ep
    cdef readonly Context context

    cdef check(self):
        self.context.check_open()
        if self.ep == NULL:
            raise XferError(XFER_ERR_INVALID_PARAM, "the endpoint is closed")

    @property
    def transport(self):
        self.check()
        return xfer_endpoint_transport(self.ep).decode()

    @property
    def peer(self):
        self.check()
        return xfer_endpoint_peer(self.ep).decode()

    def tag_send(self, uint64_t tag, buf, Memory mem=None):
        """Send buf's bytes with tag; the request completes when buf may be reused."""
        cdef _Buf b
        cdef Request r
        cdef xfer_status_t st
        cdef xfer_mem_t *mp = mem_ptr(mem)
        self.check()
        b = acquire(buf, False)
        r = Request.new(self.context, "send", b)
        with nogil:
            st = xfer_tag_send(self.ep, tag, b.ptr, b.nbytes, mp, complete_cb, <void*>r,
                               &r.req)
        r.posted(st, "tag_send")
        return r

    def unpack_rkey(self, bytes blob):
        """The peer's remote key (from its Memory.pack())."""
        cdef RemoteKey k = RemoteKey.__new__(RemoteKey)
        cdef const char *p = blob
        cdef size_t n = len(blob)
        cdef xfer_status_t st
        self.check()
        with nogil:
            st = xfer_rkey_unpack(self.ep, p, n, &k.rkey)
        check(st, "rkey_unpack")
        k.endpoint = self
        return k

    def put(self, buf, RemoteKey rkey, remote_address=None, Memory mem=None):
        """Write buf into the peer's registered buffer at remote_address (default: its
        start). In the peer's memory once a flush() after it completes."""
        return self._rma(True, buf, rkey, remote_address, mem)

    def get(self, buf, RemoteKey rkey, remote_address=None, Memory mem=None):
        """Read the peer's registered buffer at remote_address into buf."""
        return self._rma(False, buf, rkey, remote_address, mem)

    cdef _rma(self, bint is_put, buf, RemoteKey rkey, remote_address, Memory mem):
        cdef _Buf b
        cdef Request r
        cdef xfer_status_t st
        cdef uint64_t addr
        cdef xfer_mem_t *mp = mem_ptr(mem)
        cdef xfer_rkey_t *rk = rkey.rkey
        self.check()
        addr = rkey.address if remote_address is None else remote_address
        b = acquire(buf, not is_put)
        r = Request.new(self.context, "put" if is_put else "get", (b, rkey))
        with nogil:
            if is_put:
                st = xfer_put(self.ep, b.ptr, b.nbytes, mp, addr, rk, complete_cb, <void*>r,
                              &r.req)
            else:
                st = xfer_get(self.ep, b.ptr, b.nbytes, mp, addr, rk, complete_cb, <void*>r,
                              &r.req)
        r.posted(st, "put" if is_put else "get")
        return r

    def fetch(self, uint64_t step, str key, out=None, Memory mem=None):
        """Fetch the tensor the peer published under (step, key): into out (any writable
        buffer, at least as large), or into memory xfer allocates. The result is a Tensor."""
        cdef xfer_fetch_params_t params
        cdef _Buf b = None
        cdef Request r
        cdef xfer_status_t st
        cdef bytes k = key.encode()
        cdef const char *kp = k
        self.check()
        memset(&params, 0, sizeof(params))
        params.size = sizeof(params)
        if out is not None:
            b = acquire(out, True)
            params.buffer = b.ptr
            params.capacity = b.nbytes
            params.mem = mem_ptr(mem)
        r = Request.new(self.context, "fetch", b)
        if out is None:
            r.fa = <fetch_alloc_t*>malloc(sizeof(fetch_alloc_t))
            if r.fa == NULL:
                _inflight.discard(r)
                raise MemoryError()
            r.fa.ptr = NULL
            params.alloc = fetch_alloc
            params.alloc_arg = r.fa
        else:
            r._out = out
        with nogil:
            st = xfer_tensor_fetch(self.ep, step, kp, &params, complete_cb, <void*>r, &r.req)
        r.posted(st, "tensor_fetch")
        return r

    def flush(self):
        """Completes once everything posted before it reached the peer."""
        cdef Request r
        cdef xfer_status_t st
        self.check()
        r = Request.new(self.context, "flush", None)
        with nogil:
            st = xfer_endpoint_flush(self.ep, complete_cb, <void*>r, &r.req)
        r.posted(st, "flush")
        return r

    def close(self, bint force=False):
        """Close: flushes first (bounded by XFER_CLOSE_TIMEOUT) unless force."""
        cdef xfer_endpoint_t *ep = self.ep
        self.ep = NULL
        if ep == NULL or self.context.ctx == NULL:
            return
        with nogil:
            if force:
                xfer_endpoint_close_nb(ep, XFER_CLOSE_FLAG_FORCE, NULL, NULL, NULL)
            else:
                xfer_endpoint_close(ep)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __dealloc__(self):
        if self.ep != NULL and self.context is not None and self.context.ctx != NULL:
            with nogil:
                xfer_endpoint_close_nb(self.ep, 0, NULL, NULL, NULL)
        self.ep = NULL


cdef Endpoint endpoint_of(Context ctx, xfer_endpoint_t *ep):
    cdef Endpoint e = Endpoint.__new__(Endpoint)
    e.ep = ep
    e.context = ctx
    return e


cdef class Listener:
    """Where peers connect (xfer_listen)."""
    cdef xfer_listener_t *l
    cdef readonly Context context

    @property
    def port(self):
        return xfer_listener_port(self.l)

    def fileno(self):
        """Readable when accept() has something to do."""
        return xfer_listener_fd(self.l)

    def accept(self, timeout=None):
        """The next peer's Endpoint; timeout in seconds (None: no limit)."""
        cdef xfer_endpoint_t *ep = NULL
        cdef int ms = -1 if timeout is None else max(0, int(timeout * 1000))
        cdef xfer_status_t st
        self.context.check_open()
        with nogil:
            st = xfer_accept(self.l, ms, &ep)
        check(st, "accept")
        return endpoint_of(self.context, ep)

    async def accept_async(self):
        """accept() for asyncio: waits on the listener's fd."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                return self.accept(0)
            except XferTimeoutError:
                pass
            fut = loop.create_future()
            loop.add_reader(self.fileno(), fut.set_result, None)
            try:
                await fut
            finally:
                loop.remove_reader(self.fileno())

    def close(self):
        if self.l != NULL and self.context.ctx != NULL:
            with nogil:
                xfer_listener_close(self.l)
        self.l = NULL

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __dealloc__(self):
        if self.l != NULL and self.context is not None and self.context.ctx != NULL:
            with nogil:
                xfer_listener_close(self.l)
        self.l = NULL

# ---- the context -------------------------------------------------------------------------------

cdef class Context:
    """xfer's context: the transports the environment (XFER_*) allows, opened."""
    cdef xfer_context_t *ctx
    cdef dict reactors

    def __cinit__(self, progress_thread=False, serialized=False):
        cdef xfer_context_params_t params
        cdef xfer_status_t st
        params.size = sizeof(params)
        params.flags = ((XFER_CONTEXT_FLAG_PROGRESS_THREAD if progress_thread else 0) |
                        (XFER_CONTEXT_FLAG_SERIALIZED if serialized else 0))
        with nogil:
            st = xfer_context_create(&params, &self.ctx)
        if st != XFER_OK:
            self.ctx = NULL
            check(st, "context_create (the log says why)")
        self.reactors = {}

    cdef check_open(self):
        if self.ctx == NULL:
            raise XferError(XFER_ERR_INVALID_PARAM, "the context is closed")

    @property
    def is_open(self):
        return self.ctx != NULL

    def listen(self, str address="0.0.0.0:0"):
        cdef Listener lst = Listener.__new__(Listener)
        cdef bytes a = address.encode()
        cdef const char *ap = a
        cdef xfer_status_t st
        self.check_open()
        with nogil:
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
            st = xfer_tensor_abort(self.ctx, step, <xfer_status_t>status)
        check(st, "tensor_abort")

    def progress(self):
        """One round of every transport's progress; the events processed."""
        cdef unsigned n
        self.check_open()
        with nogil:
            n = xfer_progress(self.ctx)
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
