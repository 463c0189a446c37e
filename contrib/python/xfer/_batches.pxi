# Part of xfer._core (included by _core.pyx): batches (prepared descriptor lists, posted with a
# notification and a deadline) and notifications (by handler, by polling, as an async iterator).

NO_TIMEOUT = -1     # Batch.post(timeout=NO_TIMEOUT): no deadline

# ---- batches -----------------------------------------------------------------------------------

cdef class Batch:
    """A descriptor list checked and prepared once (xfer_batch_create), posted any number of
    times: each post moves every (local_offset, remote_offset, length) block between mem and
    the peer's buffer of rkey, offsets counted from their starts."""
    cdef xfer_batch_t *batch
    cdef readonly Endpoint endpoint
    cdef readonly str op
    cdef readonly Py_ssize_t count
    cdef object _keep           # mem and rkey: alive while the list is

    def post(self, notify=None, timeout=None):
        """Post the list; the Request completes once every block is in the destination's
        memory. notify (bytes, at most XFER_NOTIFY_MAX_LEN) reaches the peer only after all of
        the data. timeout: seconds (None: XFER_BATCH_TIMEOUT, NO_TIMEOUT: none); a batch that
        ends early (deadline, cancel) never notifies, and Request.landed says how many blocks
        are known to have landed."""
        cdef Request r
        cdef xfer_status_t st
        cdef const unsigned char[:] nv
        cdef const void *np = NULL
        cdef size_t nlen = 0
        cdef int ms
        self.check()
        if timeout is None:
            ms = 0
        elif timeout == NO_TIMEOUT:
            ms = XFER_BATCH_NO_TIMEOUT
        elif timeout > 0:
            ms = max(1, min(int(timeout * 1000), 2 ** 31 - 1))
        else:
            raise ValueError("timeout: seconds > 0, None or NO_TIMEOUT")
        if notify is not None:
            nv = memoryview(notify).cast("B")
            nlen = nv.shape[0]
            np = &nv[0] if nlen > 0 else <const void*>b""
        r = Request.new(self.endpoint.context, "batch", (self, notify))
        with nogil:
            xfer_last_error_clear()
            st = xfer_batch_post(self.batch, np, nlen, ms, complete_cb, <void*>r, &r.req)
        r.posted(st, "batch_post")
        return r

    cdef check(self):
        self.endpoint.context.check_open()
        if self.batch == NULL:
            raise XferError(XFER_ERR_INVALID_PARAM, "the batch is destroyed")

    def destroy(self):
        """Release the list; posts still in flight keep what they need until they end."""
        cdef xfer_status_t st
        if self.batch != NULL and self.endpoint.context.ctx != NULL:
            with nogil:
                xfer_last_error_clear()
                st = xfer_batch_destroy(self.batch)
            self.batch = NULL
            check(st, "batch_destroy")
        self.batch = NULL
        self._keep = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()

    def __dealloc__(self):
        if (self.batch != NULL and self.endpoint is not None and
                self.endpoint.context.ctx != NULL):
            with nogil:
                xfer_batch_destroy(self.batch)
        self.batch = NULL


cdef Batch batch_new(Endpoint ep, str op, Memory mem, RemoteKey rkey, descs):
    """descs: (local_offset, remote_offset, length) triples - a sequence, or an (N, 3) array
    of unsigned 64-bit integers, taken without a copy."""
    cdef Batch b = Batch.__new__(Batch)
    cdef const uint64_t[:, ::1] arr
    cdef xfer_batch_desc_t *d = NULL
    cdef xfer_batch_desc_t *owned = NULL
    cdef xfer_batch_op_t code
    cdef xfer_status_t st
    cdef size_t n
    if op not in ("put", "get"):
        raise ValueError(f"op {op!r}: 'put' or 'get'")
    code = XFER_BATCH_PUT if op == "put" else XFER_BATCH_GET
    try:
        arr = descs
    except (TypeError, ValueError, BufferError):
        arr = None
    if arr is not None:
        if arr.shape[1] != 3:
            raise ValueError("descriptors: an (N, 3) array of uint64")
        n = arr.shape[0]
        d = <xfer_batch_desc_t*>&arr[0, 0] if n > 0 else NULL
    else:
        items = list(descs)
        n = len(items)
        owned = <xfer_batch_desc_t*>malloc((n if n > 0 else 1) * sizeof(xfer_batch_desc_t))
        if owned == NULL:
            raise MemoryError()
        try:
            for i, item in enumerate(items):
                lo, ro, ln = item
                owned[i].local_offset = lo
                owned[i].remote_offset = ro
                owned[i].length = ln
        except BaseException:
            free(owned)
            raise
        d = owned
    with nogil:
        xfer_last_error_clear()
        st = xfer_batch_create(ep.ep, code, mem.mem, rkey.rkey, d, n, &b.batch)
    free(owned)
    check(st, "batch_create")
    b.endpoint = ep
    b.op = op
    b.count = <Py_ssize_t>n
    b._keep = (mem, rkey)
    return b

# ---- notifications -----------------------------------------------------------------------------

cdef void notify_cb(xfer_endpoint_t *ep, const void *msg, size_t length,
                    void *user_data) with gil:
    cdef Context ctx = <Context>user_data
    try:
        ctx._notify_handler(ctx._endpoint(ep), PyBytes_FromStringAndSize(<const char*>msg,
                                                                          <Py_ssize_t>length))
    except BaseException as e:     # a handler cannot raise into C: progress() raises it
        if ctx._handler_error is None:
            ctx._handler_error = e


cdef object notify_poll(Endpoint e):
    """The endpoint's oldest notification as bytes, or None (after one round of progress)."""
    cdef bytearray buf = bytearray(4096)
    cdef unsigned char *p
    cdef size_t cap, length = 0
    cdef xfer_status_t st
    e.check()
    while True:
        p = buf
        cap = len(buf)
        with nogil:
            xfer_last_error_clear()
            st = xfer_notify_poll(e.ep, p, cap, &length)
        if st == XFER_ERR_NOT_FOUND:
            return None
        if st == XFER_ERR_TRUNCATED:
            buf = bytearray(length)
            continue
        check(st, "notify_poll")
        return bytes(buf[:length])


async def notifications_of(Endpoint e):
    """Each notification of e as it arrives, for asyncio: between them the task sleeps on the
    context's event fd (armed first, so that nothing that arrives is missed)."""
    loop = asyncio.get_running_loop()
    reactor = e.context._reactor(loop)
    while True:
        msg = notify_poll(e)
        if msg is not None:
            yield msg
        elif e.context.arm():
            await reactor.next_round()      # the fd woke the reactor, which progressed
        else:
            await asyncio.sleep(0)          # work pending: poll again after the others ran
