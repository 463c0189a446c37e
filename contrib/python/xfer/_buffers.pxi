# Part of xfer._core (included by _core.pyx): buffers taken through the buffer protocol or DLPack, and fetched tensors.

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
# xfer's dtypes as DLPack's (code, bits)
DL_DTYPES = {XFER_DTYPE_FLOAT16: (DL_FLOAT, 16), XFER_DTYPE_BFLOAT16: (DL_BFLOAT, 16),
             XFER_DTYPE_FLOAT32: (DL_FLOAT, 32), XFER_DTYPE_FLOAT64: (DL_FLOAT, 64),
             XFER_DTYPE_INT8: (DL_INT, 8), XFER_DTYPE_INT16: (DL_INT, 16),
             XFER_DTYPE_INT32: (DL_INT, 32), XFER_DTYPE_INT64: (DL_INT, 64),
             XFER_DTYPE_UINT8: (DL_UINT, 8), XFER_DTYPE_UINT16: (DL_UINT, 16),
             XFER_DTYPE_UINT32: (DL_UINT, 32), XFER_DTYPE_UINT64: (DL_UINT, 64),
             XFER_DTYPE_BOOL: (DL_BOOL, 8), XFER_DTYPE_BYTES: (DL_UINT, 8)}


class Tensor:
    """A fetched tensor: ``dtype`` (a name: "float32", "bfloat16", ...), ``shape``,
    ``is_dead``, and ``data``: the ``out`` object it was fetched into when that is a framework's
    tensor (DLPack), else a numpy array over the bytes (bfloat16 as uint16, bytes as uint8)
    when numpy is there, else a memoryview. No copy: the data is the fetch's buffer. A tensor in
    memory xfer allocated is also a DLPack producer, with its own dtype: ``torch.from_dlpack(t)``
    takes it as it is (bfloat16 as bfloat16)."""

    __slots__ = ("dtype", "shape", "is_dead", "data", "_owned")

    def __init__(self, dtype, shape, is_dead, data, owned=None):
        self.dtype = dtype
        self.shape = shape
        self.is_dead = is_dead
        self.data = data
        self._owned = owned

    def __dlpack__(self, stream=None):
        if self._owned is not None:
            return dl_export(self._owned, (<_Owned>self._owned).ptr, DTYPE_CODES[self.dtype],
                             self.shape)
        if hasattr(self.data, "__dlpack__"):
            return self.data.__dlpack__()
        raise BufferError("this tensor has no data to export" if self.is_dead else
                          "this tensor's data exports no DLPack")

    def __dlpack_device__(self):
        if self._owned is None and hasattr(self.data, "__dlpack_device__"):
            return self.data.__dlpack_device__()
        return (DL_CPU, 0)

    def __repr__(self):
        return f"Tensor(dtype={self.dtype!r}, shape={self.shape!r}, is_dead={self.is_dead})"


# ---- DLPack export of memory xfer allocated ----------------------------------------------------

ctypedef struct dl_export_t:
    xfer_py_dl_managed managed      # first: the consumer's pointer is also ours
    int64_t shape[8]
    PyObject *owner                 # holds the memory until the consumer's deleter runs


cdef void dl_export_free(xfer_py_dl_managed *m) with gil:
    cdef dl_export_t *e = <dl_export_t*>m
    Py_XDECREF(e.owner)
    free(e)


cdef void dl_capsule_free(object capsule):
    """A capsule nobody consumed (still named "dltensor") frees what it holds."""
    cdef xfer_py_dl_managed *m
    if PyCapsule_IsValid(capsule, "dltensor"):
        m = <xfer_py_dl_managed*>PyCapsule_GetPointer(capsule, "dltensor")
        m.deleter(m)


cdef object dl_export(object owner, void *data, int dtype, tuple shape):
    cdef dl_export_t *e
    if len(shape) > XFER_TENSOR_MAX_RANK:
        raise ValueError(f"a tensor of rank {len(shape)}")
    if dtype not in DL_DTYPES:
        raise BufferError(f"{DTYPES.get(dtype, dtype)} has no DLPack type")
    e = <dl_export_t*>calloc(1, sizeof(dl_export_t))
    if e == NULL:
        raise MemoryError()
    code, bits = DL_DTYPES[dtype]
    e.managed.dl_tensor.data = data
    e.managed.dl_tensor.device.device_type = DL_CPU
    e.managed.dl_tensor.ndim = len(shape)
    e.managed.dl_tensor.dtype.code = code
    e.managed.dl_tensor.dtype.bits = bits
    e.managed.dl_tensor.dtype.lanes = 1
    for i in range(len(shape)):
        e.shape[i] = shape[i]
    if dtype == XFER_DTYPE_BYTES:       # a flat run of bytes
        e.managed.dl_tensor.ndim = 1
        e.shape[0] = (<_Owned>owner).size
    e.managed.dl_tensor.shape = e.shape
    e.managed.dl_tensor.strides = NULL  # compact, C order
    e.managed.manager_ctx = e
    e.managed.deleter = dl_export_free
    Py_INCREF(owner)
    e.owner = <PyObject*>owner
    return PyCapsule_New(&e.managed, "dltensor", <PyCapsule_Destructor>dl_capsule_free)


cdef object as_array(object buf, str dtype, tuple shape, Py_ssize_t size):
    try:
        import numpy
    except ImportError:
        return memoryview(buf)[:size]
    storage = {"bfloat16": "uint16", "bytes": "uint8"}.get(dtype, dtype)
    arr = numpy.frombuffer(buf, dtype=numpy.uint8, count=size).view(storage)
    return arr.reshape(shape) if dtype != "bytes" else arr
