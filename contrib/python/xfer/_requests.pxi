# Part of xfer._core (included by _core.pyx): requests, their completion callback, and asyncio.

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
    r.finish(status)
    _inflight.discard(r)


cdef object completion_error(str kind, e):
    """The error of a request whose completion failed in Python (its outcome could not be
    made into a result): XFER_ERR_INTERNAL, the exception as its reason and its cause."""
    err = XferError(XFER_ERR_INTERNAL, f"completing the {kind}", f"{type(e).__name__}: {e}")
    err.__cause__ = e
    return err


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

    cdef finish(self, xfer_status_t status):
        """The request completed (from complete_cb, which cannot raise into C): record the
        outcome and wake an awaiting task. An exception on the way completes the request with
        an error that carries it: nothing is left pending."""
        try:
            self.outcome(status)
        except BaseException as e:
            status = XFER_ERR_INTERNAL
            self._error = completion_error(self.kind, e)
        try:
            self.drop_bufs()
        except BaseException as e:
            if self._error is None:
                status = XFER_ERR_INTERNAL
                self._error = completion_error(self.kind, e)
        self._status = status
        if self._future is not None:
            try:
                if PyThread_get_thread_ident() == self._loop_thread:
                    _settle(self._future, self)
                else:
                    self._loop.call_soon_threadsafe(_settle, self._future, self)
            except RuntimeError:
                pass        # the loop is closed: nobody can await the future any more

    cdef outcome(self, xfer_status_t status):
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
            return Tensor(dtype, shape, False, as_array(owned, dtype, shape, owned.size),
                          owned)
        if not PyObject_CheckBuffer(self._out):
            return Tensor(dtype, shape, False, self._out)    # a framework's tensor, filled
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
                xfer_last_error_clear()
                st = xfer_request_wait(self.req, ms)
            if self._status == XFER_INPROGRESS:
                if st == XFER_OK or st == XFER_ERR_TIMEOUT:
                    raise XferTimeoutError(XFER_ERR_TIMEOUT, f"wait for a {self.kind}")
                check(st, f"wait for a {self.kind}")
        return self.result()

    def result(self):
        """The outcome of a completed request: bytes moved (send, receive, put, get), a
        Tensor (fetch), None (publish, flush); raises XferError for a failed one."""
        if self._status == XFER_INPROGRESS:
            raise XferError(XFER_ERR_BUSY, f"the {self.kind} is still in progress")
        if self._error is not None:
            raise self._error
        if self._status < 0:        # the reason was logged where progress ran, not here
            raise (XferTimeoutError if self._status == XFER_ERR_TIMEOUT else
                   XferError)(self._status, self.kind)
        if self.kind == "fetch":
            return self._result
        if self.kind in ("publish", "flush", "close", "batch"):
            return None
        return self._length

    @property
    def length(self):
        """Bytes moved; for a truncated receive, the message's length."""
        return self._length

    @property
    def landed(self):
        """A completed batch: how many of its descriptors are known to have landed (all of
        them when it succeeded; a lower bound after a deadline, a cancel or an error)."""
        if self._status == XFER_INPROGRESS or self.req == NULL:
            return 0
        return xfer_request_landed(self.req)

    @property
    def tag(self):
        """A completed receive's sender tag."""
        return self._tag

    def cancel(self):
        """Cancel a posted receive, fetch or batch (it completes with XFER_ERR_CANCELED; a
        batch whose notification has left completes with the peer's answer instead)."""
        cdef xfer_status_t st
        if self._status == XFER_INPROGRESS:
            self.context.check_open()
            with nogil:
                xfer_last_error_clear()
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
        self.waiters = []
        self.fd = ctx.event_fd
        loop.add_reader(self.fd, self.run)

    def next_round(self):
        """A future done after the next round of progress."""
        fut = self.loop.create_future()
        self.waiters.append(fut)
        return fut

    def kick(self):
        if not self.scheduled:
            self.scheduled = True
            self.loop.call_soon(self.run)

    def run(self):
        self.scheduled = False
        if not self.ctx.is_open:
            return
        waiters, self.waiters = self.waiters, []
        try:
            self.ctx.progress()
        finally:
            for fut in waiters:
                if not fut.done():
                    fut.set_result(None)
        if not self.ctx.arm():
            self.kick()

    def close(self):
        self.loop.remove_reader(self.fd)
