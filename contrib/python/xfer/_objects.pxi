# Part of xfer._core (included by _core.pyx): registered memory, remote keys, endpoints and listeners.

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
            xfer_last_error_clear()
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
                xfer_last_error_clear()
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
    cdef object __weakref__

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

    @property
    def status(self):
        """0 (XFER_OK) while the connection works, else the status that ended it (e.g.
        XFER_ERR_CONNECTION when the peer died, XFER_ERR_PEER_CLOSED when it closed in
        order): how a long-lived holder of endpoints finds the ones to drop."""
        self.check()
        return xfer_endpoint_status(self.ep)

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
            xfer_last_error_clear()
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
            xfer_last_error_clear()
            st = xfer_rkey_unpack(self.ep, p, n, &k.rkey)
        check(st, "rkey_unpack")
        k.endpoint = self
        return k

    def put(self, buf, RemoteKey rkey not None, remote_address=None, *, Memory mem not None):
        """Write buf - inside mem, its registration here (required) - into the peer's
        registered buffer at remote_address (default: its start). In the peer's memory once a
        flush() after it completes."""
        return self._rma(True, buf, rkey, remote_address, mem)

    def get(self, buf, RemoteKey rkey not None, remote_address=None, *, Memory mem not None):
        """Read the peer's registered buffer at remote_address into buf, which lies inside
        mem, its registration here (required)."""
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
            xfer_last_error_clear()
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
            xfer_last_error_clear()
            st = xfer_tensor_fetch(self.ep, step, kp, &params, complete_cb, <void*>r, &r.req)
        r.posted(st, "tensor_fetch")
        return r

    def batch(self, str op, Memory mem not None, RemoteKey rkey not None, descs):
        """A Batch of op ("put" or "get") between mem and the peer's buffer of rkey: descs
        are (local_offset, remote_offset, length) triples, or an (N, 3) uint64 array."""
        self.check()
        return batch_new(self, op, mem, rkey, descs)

    def notify_poll(self):
        """The oldest notification from the peer (bytes), or None; progresses once when none
        is queued. A context with a notification handler hands them to it instead."""
        return notify_poll(self)

    def notifications(self):
        """An async iterator over the peer's notifications, in the order sent."""
        return notifications_of(self)

    def flush(self):
        """Completes once everything posted before it reached the peer."""
        cdef Request r
        cdef xfer_status_t st
        self.check()
        r = Request.new(self.context, "flush", None)
        with nogil:
            xfer_last_error_clear()
            st = xfer_endpoint_flush(self.ep, complete_cb, <void*>r, &r.req)
        r.posted(st, "flush")
        return r

    def close(self, bint force=False):
        """Close: flushes first (bounded by XFER_CLOSE_TIMEOUT) unless force."""
        cdef xfer_endpoint_t *ep = self.ep
        self.ep = NULL
        if ep == NULL or self.context.ctx == NULL:
            return
        self.context._endpoints.pop(<uintptr_t>ep, None)
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
    ctx._endpoints[<uintptr_t>ep] = e
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
            xfer_last_error_clear()
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
