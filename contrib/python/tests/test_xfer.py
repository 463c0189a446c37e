"""The Python binding between two real processes (conftest.Peer), over XFERTEST_TRANSPORT:
tagged messages, put/get, tensors, buffers by the buffer protocol and by DLPack without copies,
asyncio, and errors as exceptions carrying xfer's status."""
import asyncio
import errno

import numpy as np
import pytest

import xfer

TRUNCATED, TIMEOUT, CONNECTION, UNREACHABLE, INVALID = -9, -8, -7, -18, -2
SIZES = [0, 1, 8, 4095, 65536, (1 << 20) + 3, 4 << 20]


def pattern(n, seed):
    return ((np.arange(n, dtype=np.uint64) * 2654435761 + seed) >> 7).astype(np.uint8)


# ---- tagged messages ---------------------------------------------------------------------------

def echo(ctx, ep, conn):
    """Receive each size from the test, send it back with tag + 1."""
    for n in SIZES:
        buf = np.empty(n, dtype=np.uint8)
        req = ctx.tag_recv(buf, 100 + n % 97, ep=ep)
        assert req.wait(20) == n
        ep.tag_send(101 + n % 97, buf).wait(20)


def test_tag_messages_round_trip_in_place(peer):
    p = peer(echo)
    with xfer.Context() as ctx:
        ep = ctx.connect(p.address)
        assert ep.transport == "tcp" or ep.transport
        for n in SIZES:
            out = pattern(n, n)
            back = np.zeros(n + 16, dtype=np.uint8)     # a receive larger than the message
            rreq = ctx.tag_recv(back, 101 + n % 97)     # from any peer
            sreq = ep.tag_send(100 + n % 97, out)
            assert sreq.wait(20) == n
            assert rreq.wait(20) == n
            assert rreq.tag == 101 + n % 97
            # the bytes landed in our array itself: no copy on the way in or out
            assert np.array_equal(back[:n], out)
            assert not back[n:].any()
        ep.close()
    p.finish()


def send_big(ctx, ep, conn):
    ep.tag_send(5, pattern(5000, 1)).wait(20)
    ep.tag_send(6, b"after").wait(20)


def test_a_truncated_receive_raises_with_the_status_and_the_length(peer):
    p = peer(send_big)
    with xfer.Context() as ctx:
        ep = ctx.connect(p.address)
        small = bytearray(1000)
        with pytest.raises(xfer.XferError) as e:
            ctx.tag_recv(small, 5, ep=ep).wait(20)
        assert e.value.status == TRUNCATED
        assert "truncated" in str(e.value).lower()
        # the connection goes on
        tail = bytearray(16)
        req = ctx.tag_recv(tail, 6, ep=ep)
        assert req.wait(20) == 5 and bytes(tail[:5]) == b"after"
        assert req.length == 5
        ep.close()
    p.finish()


def test_buffers_are_checked_not_copied():
    with xfer.Context() as ctx:
        with pytest.raises(BufferError):     # a receive into read-only memory
            ctx.tag_recv(b"immutable", 1)
        with pytest.raises((BufferError, ValueError)):   # a strided view would need a copy
            ctx.tag_recv(np.zeros(16)[::2], 1)
        with pytest.raises(TypeError):
            ctx.tag_recv(12345, 1)


# ---- DLPack ------------------------------------------------------------------------------------

class DLOnly:
    """An object that offers its memory only through DLPack (like a torch tensor)."""

    def __init__(self, arr):
        self.arr = arr

    def __dlpack__(self, stream=None):
        return self.arr.__dlpack__()

    def __dlpack_device__(self):
        return self.arr.__dlpack_device__()


def echo_once(ctx, ep, conn):
    buf = np.empty(1 << 16, dtype=np.uint8)
    n = ctx.tag_recv(buf, 1, ep=ep).wait(20)
    ep.tag_send(2, buf[:n]).wait(20)


def test_dlpack_buffers_send_and_receive_in_place(peer):
    p = peer(echo_once)
    with xfer.Context() as ctx:
        ep = ctx.connect(p.address)
        out = np.arange(1000, dtype=np.float32)
        back = np.zeros(1000, dtype=np.float32)
        rreq = ctx.tag_recv(DLOnly(back), 2, ep=ep)
        ep.tag_send(1, DLOnly(out)).wait(20)
        assert rreq.wait(20) == out.nbytes
        assert np.array_equal(back, out)
        with pytest.raises(BufferError):
            ctx.tag_recv(DLOnly(np.zeros((4, 4))[:, 1]), 3)
        ep.close()
    p.finish()


# ---- put and get -------------------------------------------------------------------------------

def progress_until_word(ctx, conn):
    """A target of puts and gets posts nothing of its own: it progresses until told."""
    while not conn.poll(0):
        ctx.progress()
    return conn.recv()


def rma_target(ctx, ep, conn):
    region = np.zeros(1 << 20, dtype=np.uint8)
    region[:100] = 7
    with ctx.register(region) as mem:
        ep.tag_send(1, mem.pack()).wait(20)
        progress_until_word(ctx, conn)          # the test put and got, and flushed
        conn.send(bytes(region[4096:4096 + 5000]))
        progress_until_word(ctx, conn)


def test_put_get_through_a_remote_key(peer):
    p = peer(rma_target)
    with xfer.Context() as ctx:
        ep = ctx.connect(p.address)
        blob = bytearray(4096)
        n = ctx.tag_recv(blob, 1, ep=ep).wait(20)
        rkey = ep.unpack_rkey(bytes(blob[:n]))
        assert rkey.length == 1 << 20
        src = pattern(5000, 3)
        smem = ctx.register(src)                # put and get move registered memory
        ep.put(src, rkey, rkey.address + 4096, mem=smem).wait(20)
        ep.flush().wait(20)
        got = np.zeros(100, dtype=np.uint8)
        with ctx.register(got) as gmem:         # a get lands in registered memory only
            assert ep.get(got, rkey, mem=gmem).wait(20) == 100
        assert (got == 7).all()
        # outside the peer's buffer: refused, with the status saying so
        with pytest.raises(xfer.XferError) as e:
            ep.put(src, rkey, rkey.address + (1 << 20) - 10, mem=smem).wait(20)
            ep.flush().wait(20)
        assert e.value.status == -16
        with pytest.raises(TypeError):
            ep.put(src, rkey)                   # the local registration is required
        with pytest.raises(xfer.XferError) as e:
            ep.put(pattern(10, 1), rkey, mem=smem)  # a buffer outside that registration
        assert e.value.status == -16
        assert "outside the registered buffer" in e.value.reason, e.value.reason
        assert e.value.reason in str(e.value)
        smem.deregister()
        p.send("look")
        assert p.recv() == bytes(src)
        p.send("done")
        ep.close(force=True)
    p.finish()


# ---- tensors -----------------------------------------------------------------------------------

def producer(ctx, ep, conn):
    m = np.arange(12, dtype=np.float32).reshape(3, 4)
    v = np.arange(5, dtype=np.int64) * -3
    h = np.array([1, 2, 3], dtype=np.uint16)
    reqs = [ctx.publish(1, "matrix", m), ctx.publish(1, "vector", v, copy=True),
            ctx.publish(2, "half", h, dtype="bfloat16")]
    v[:] = 0                                    # copied at publish: the fetch sees the old
    for r in reqs:
        r.wait(20)


def test_tensors_published_and_fetched_keep_dtype_and_shape(peer):
    p = peer(producer)
    with xfer.Context() as ctx:
        ep = ctx.connect(p.address)
        out = np.zeros(64, dtype=np.uint8)
        t = ep.fetch(1, "matrix", out=out).wait(20)
        assert (t.dtype, t.shape, t.is_dead) == ("float32", (3, 4), False)
        assert np.array_equal(t.data, np.arange(12, dtype=np.float32).reshape(3, 4))
        assert np.shares_memory(t.data, out)   # fetched into our buffer, viewed in place
        t = ep.fetch(1, "vector").wait(20)     # into memory xfer allocated for it
        assert t.dtype == "int64" and np.array_equal(t.data, np.arange(5) * -3)
        t = ep.fetch(2, "half").wait(20)
        assert t.dtype == "bfloat16" and t.shape == (3,)
        assert list(t.data) == [1, 2, 3]       # bfloat16 bits, as uint16
        ep.close()
    p.finish()


# ---- asyncio -----------------------------------------------------------------------------------

def async_echo(ctx, ep, conn):
    async def main():
        bufs = [np.empty(256, dtype=np.uint8) for _ in range(50)]
        got = await asyncio.gather(*(ctx.tag_recv(b, i, ep=ep) for i, b in enumerate(bufs)))
        assert got == [256] * 50
        await asyncio.gather(*(ep.tag_send(1000 + i, b) for i, b in enumerate(bufs)))
    asyncio.run(main())


def test_requests_are_awaitable(peer):
    p = peer(async_echo)

    async def main():
        with xfer.Context() as ctx:
            ep = await ctx.connect_async(p.address)
            outs = [pattern(256, i) for i in range(50)]
            backs = [np.zeros(256, dtype=np.uint8) for _ in range(50)]
            recvs = [ctx.tag_recv(b, 1000 + i, ep=ep) for i, b in enumerate(backs)]
            await asyncio.gather(*(ep.tag_send(i, o) for i, o in enumerate(outs)))
            assert await asyncio.wait_for(asyncio.gather(*recvs), 20) == [256] * 50
            for o, b in zip(outs, backs):
                assert np.array_equal(o, b)
            ep.close()
    asyncio.run(main())
    p.finish()


def test_the_loop_sleeps_on_the_event_fd_while_nothing_comes():
    async def main():
        with xfer.Context() as ctx:
            req = ctx.tag_recv(bytearray(8), 1)
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(req, 0.3)
            req.cancel()
            with pytest.raises(xfer.XferError) as e:
                req.wait(5)
            assert e.value.status == -10      # canceled

    import resource
    before = resource.getrusage(resource.RUSAGE_SELF)
    asyncio.run(main())
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert cpu < 0.25, f"{cpu:.2f} s of CPU in a 0.3 s wait: the loop spins"


def async_listener_client(ctx, ep, conn):
    port = conn.recv()
    with xfer.Context() as c2:
        e2 = c2.connect(f"127.0.0.1:{port}")
        e2.tag_send(9, b"hello").wait(20)
        e2.close()


def test_accept_async(peer):
    p = peer(async_listener_client)

    async def main():
        with xfer.Context() as ctx:
            ep0 = ctx.connect(p.address)
            with ctx.listen("127.0.0.1:0") as lst:
                p.send(lst.port)
                ep = await asyncio.wait_for(lst.accept_async(), 20)
            buf = bytearray(16)
            assert await ctx.tag_recv(buf, 9, ep=ep) == 5
            assert bytes(buf[:5]) == b"hello"
            ep.close()
            ep0.close()
    asyncio.run(main())
    p.finish()


# ---- errors ------------------------------------------------------------------------------------

def test_errors_carry_xfer_status():
    with xfer.Context() as ctx:
        with pytest.raises(xfer.XferError) as e:
            ctx.connect("127.0.0.1:1")
        assert e.value.status in (CONNECTION, UNREACHABLE, TIMEOUT, -6)
        with pytest.raises(xfer.XferTimeoutError) as t:
            ctx.tag_recv(bytearray(8), 1).wait(0.05)
        assert isinstance(t.value, TimeoutError) and t.value.status == TIMEOUT
        with pytest.raises(xfer.XferError):
            ctx.listen("not an address")
    with pytest.raises(xfer.XferError) as e:
        ctx.tag_recv(bytearray(8), 1)          # the context is closed
    assert e.value.status == INVALID
    assert "truncated" in xfer.status_string(TRUNCATED).lower()


def test_a_bad_environment_is_an_exception(monkeypatch):
    monkeypatch.setenv("XFER_TRANSPORTS", "no_such_transport")
    with pytest.raises(xfer.XferError) as e:
        xfer.Context()
    assert e.value.status == INVALID


def dies(ctx, ep, conn):
    conn.send("ready")
    conn.recv()             # the test's receive is posted: now die under it
    import os
    os._exit(0)


def test_a_peer_that_dies_fails_the_pending_receive(peer):
    p = peer(dies)
    with xfer.Context() as ctx:
        ep = ctx.connect(p.address)
        assert ep.status == 0
        req = ctx.tag_recv(bytearray(8), 1, ep=ep)
        assert p.recv() == "ready"
        p.send("die")
        with pytest.raises(xfer.XferError) as e:
            req.wait(20)
        assert e.value.status in (CONNECTION, -10)
        # the endpoint says so too: the connection broke (not an orderly close)
        assert ep.status == CONNECTION
        ep.close()


def _outward_address():
    """This host's address on its default route, or None (no route: nothing to test)."""
    import socket
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))         # TEST-NET-1: no packet leaves
            addr = s.getsockname()[0]
    except OSError:
        return None
    return None if addr.startswith("127.") else addr


def test_listen_defaults_to_loopback():
    """listen() without an address is reachable from this host only: a connect to the host's
    outward address is refused, one to loopback is accepted, over IPv4 and (where the host
    has it) IPv6."""
    import socket
    import threading
    outward = _outward_address()
    loopbacks = ["127.0.0.1"]
    if socket.has_ipv6:
        try:
            with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
                s.bind(("::1", 0))
            loopbacks.append("[::1]")
        except OSError:
            pass
    with xfer.Context() as server, xfer.Context() as client, server.listen() as lst:
        if outward is not None:
            with pytest.raises(xfer.XferError) as e:
                client.connect(f"{outward}:{lst.port}")
            assert e.value.status == CONNECTION, e.value
        for host in loopbacks:
            got = []
            t = threading.Thread(target=lambda: got.append(client.connect(f"{host}:{lst.port}")))
            t.start()
            accepted = lst.accept(timeout=10)
            t.join(10)
            assert accepted is not None and len(got) == 1, host
            got[0].close(force=True)
            accepted.close(force=True)
    if outward is None:
        pytest.skip("no outward address: only the loopback half was checked")


def test_a_key_admits_only_peers_that_hold_it():
    """Context(auth_key=...): a client with the server's key is admitted and moves a message;
    one without a key or with another is refused with XFER_ERR_DENIED (-21), and the
    listener goes on. (A client with another key finds the server's proof wrong and leaves
    first: the server sees it go.)"""
    import threading
    key, other = b"k" * 32, b"o" * 32
    DENIED = -21
    with xfer.Context(auth_key=key) as server, server.listen() as lst:
        address = f"127.0.0.1:{lst.port}"
        for client_key in (None, other):
            with xfer.Context(auth_key=client_key) as client:
                failed = []

                def refused():
                    try:
                        client.connect(address)
                    except xfer.XferError as e:
                        failed.append(e)
                t = threading.Thread(target=refused)
                t.start()
                with pytest.raises(xfer.XferError) as e:
                    lst.accept(timeout=10)
                t.join(10)
                assert e.value.status == (DENIED if client_key is None else CONNECTION), e.value
                assert len(failed) == 1 and failed[0].status == DENIED, failed
        with xfer.Context(auth_key=key) as client:
            got = []
            t = threading.Thread(target=lambda: got.append(client.connect(address)))
            t.start()
            ep = lst.accept(timeout=10)
            t.join(10)
            assert ep is not None and len(got) == 1
            buf = bytearray(8)
            r = server.tag_recv(buf, 5, ep=ep)
            got[0].tag_send(5, b"keyed!").wait(10)
            assert r.wait(10) == 6 and bytes(buf[:6]) == b"keyed!"
            got[0].close(force=True)
            ep.close(force=True)
