"""Buffers of real frameworks (Debian's python3-torch, numpy) between two processes: every call
that takes `out=` or a buffer, with torch tensors, numpy arrays, memoryviews and DLPack-only
objects; dtypes both ways; what xfer allocates handed to torch without a copy; a 1 GiB tensor;
non-contiguous tensors refused; a completion that fails in Python; 100 concurrent awaits."""
import asyncio

import numpy as np
import pytest

import xfer

torch = pytest.importorskip("torch", reason="torch (Debian: python3-torch) is not installed")

INTERNAL = -19
TORCH_DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int64]


class DLPackOnly:
    """A tensor seen only through DLPack (no buffer protocol), as cupy or jax hand them over."""

    def __init__(self, t):
        self.t = t

    def __dlpack__(self, stream=None):
        return self.t.__dlpack__()

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


def torch_pattern(dtype, n=4096, seed=1):
    base = (torch.arange(n, dtype=torch.int64) * 7 + seed) % 251 - 125
    return base.to(dtype)


def publisher(ctx, ep, conn, dtypes):
    """Publish, for each dtype name, a torch tensor under (1, name), (2, name) and (3, name),
    then serve until told (what nobody fetched ends with the context)."""
    for i, name in enumerate(dtypes):
        t = torch_pattern(getattr(torch, name), seed=i).reshape(64, -1)
        for step in (1, 2, 3):
            ctx.publish(step, name, t, copy=True)
    conn.send("published")
    while not conn.poll(0):
        ctx.progress()
    conn.recv()


def connect_published(ctx, p):
    """The endpoint to a publishing peer, once it says its tensors are published."""
    ep = ctx.connect(p.address)
    assert p.recv() == "published"
    return ep


def names(dtypes):
    return [str(d).split(".")[1] for d in dtypes]


def test_fetch_into_torch_numpy_memoryview_and_dlpack_only(peer):
    p = peer(publisher, names(TORCH_DTYPES))
    with xfer.Context() as ctx:
        ep = connect_published(ctx, p)
        for i, dt in enumerate(TORCH_DTYPES):
            name = names([dt])[0]
            want = torch_pattern(dt, seed=i).reshape(64, -1)
            # a torch tensor: filled in place, handed back as itself
            out = torch.zeros(64, 64, dtype=dt)
            t = ep.fetch(1, name, out=out).wait(20)
            assert t.data is out and torch.equal(out, want), name
            assert (t.dtype, t.shape) == (name, (64, 64))
            # a DLPack-only object: the same
            out = torch.zeros(64, 64, dtype=dt)
            t = ep.fetch(2, name, out=DLPackOnly(out)).wait(20)
            assert torch.equal(out, want), name
            # numpy and a memoryview over the bytes
            raw = bytearray(want.numel() * want.element_size())
            t = ep.fetch(3, name, out=memoryview(raw)).wait(20)
            assert torch.equal(torch.frombuffer(raw, dtype=dt).reshape(64, 64), want), name
            assert t.dtype == name and t.shape == (64, 64)
        p.send("done")
        ep.close()
    p.finish()


def test_what_xfer_allocates_goes_to_torch_by_dlpack_with_its_dtype(peer):
    p = peer(publisher, names(TORCH_DTYPES))
    with xfer.Context() as ctx:
        ep = connect_published(ctx, p)
        for i, dt in enumerate(TORCH_DTYPES):
            name = names([dt])[0]
            t = ep.fetch(1, name).wait(20)
            got = torch.from_dlpack(t)
            assert got.dtype == dt, f"{name} arrived as {got.dtype}"
            assert got.shape == (64, 64)
            assert torch.equal(got, torch_pattern(dt, seed=i).reshape(64, -1))
            # no copy: the torch tensor is the fetch's memory, kept alive by it
            addr = got.data_ptr()
            del t
            assert got.data_ptr() == addr and got.dtype == dt
            got += 0                    # still writable memory
        p.send("done")
        ep.close()
    p.finish()


async def _await_fetch(ep, step, out):
    return await ep.fetch(step, "float32", out=out)


def test_a_failing_completion_fails_the_request_and_never_hangs(peer, monkeypatch):
    """A test double for the one fault Python code in the completion path can hit once the
    torch case above works: the dtype table gives something that is not a name, so building
    the result raises. The request must complete - wait and await - with an XferError that
    carries the exception."""
    p = peer(publisher, ["float32"])
    with xfer.Context() as ctx:
        ep = connect_published(ctx, p)
        code = {v: k for k, v in xfer._core.DTYPES.items()}["float32"]
        monkeypatch.setitem(xfer._core.DTYPES, code, 12345)
        req = ep.fetch(1, "float32", out=np.zeros(64 * 64, np.float32))
        with pytest.raises(xfer.XferError) as e:
            req.wait(20)
        assert e.value.status == INTERNAL and isinstance(e.value.__cause__, TypeError)
        assert req.done()
        with pytest.raises(xfer.XferError) as e:
            asyncio.run(asyncio.wait_for(_await_fetch(ep, 2, np.zeros(64 * 64, np.float32)),
                                         20))
        assert isinstance(e.value.__cause__, TypeError)
        p.send("done")
        ep.close()
    p.finish()


def test_non_contiguous_tensors_are_refused(peer):
    p = peer(publisher, ["float32"])
    with xfer.Context() as ctx:
        ep = connect_published(ctx, p)
        strided = torch.zeros(64, 128)[:, ::2]
        with pytest.raises(BufferError):
            ep.fetch(1, "float32", out=strided)
        with pytest.raises(BufferError):
            ctx.publish(9, "strided", strided)
        with pytest.raises(BufferError):
            ep.tag_send(1, torch.zeros(8, 8).t())
        assert torch.equal(strided, torch.zeros(64, 64))
        p.send("done")
        ep.close()
    p.finish()


GIB = 1 << 30


def big_publisher(ctx, ep, conn):
    t = torch.arange(GIB // 8, dtype=torch.int64)
    req = ctx.publish(1, "big", t)
    conn.send("published")
    req.wait(120)


def test_a_1_gib_tensor(peer):
    p = peer(big_publisher)
    with xfer.Context() as ctx:
        ep = connect_published(ctx, p)
        got = torch.from_dlpack(ep.fetch(1, "big").wait(120))
        assert got.dtype == torch.int64 and got.numel() == GIB // 8
        assert torch.equal(got[:1000], torch.arange(1000))
        assert int(got[-1]) == GIB // 8 - 1
        assert torch.equal(got, torch.arange(GIB // 8, dtype=torch.int64))
        ep.close()
    p.finish(120)


# ---- many awaits at once ----------------------------------------------------------------------

N_EACH = 34     # fetches, receives and batches: 102 awaits


def mixed_peer(ctx, ep, conn):
    region = np.zeros(N_EACH * 4096, dtype=np.uint8)
    with ctx.register(region) as mem:
        pubs = [ctx.publish(1, f"t{i}", torch.full((256,), float(i)), copy=True)
                for i in range(N_EACH)]
        ep.tag_send(1 << 40, mem.pack()).wait(20)
        sends = [ep.tag_send(1000 + i, np.full(100, i, np.uint8)) for i in range(N_EACH)]
        notes = set()
        while len(notes) < N_EACH:
            msg = ep.notify_poll()
            if msg is not None:
                i = int(msg)
                assert (region[i * 4096:(i + 1) * 4096] == i % 251).all(), "data after note"
                notes.add(i)
        for r in pubs + sends:
            r.wait(20)
        conn.send(sorted(notes))
        conn.recv()


async def _mixed(ctx, ep):
    blob = bytearray(4096)
    n = await ctx.tag_recv(blob, 1 << 40, ep=ep)
    rkey = ep.unpack_rkey(bytes(blob[:n]))
    src = np.concatenate([np.full(4096, i % 251, np.uint8) for i in range(N_EACH)])
    mem = ctx.register(src)
    batches = [ep.batch("put", mem, rkey, [(i * 4096, i * 4096, 4096)]) for i in range(N_EACH)]
    outs = [torch.zeros(256) for _ in range(N_EACH)]
    bufs = [np.zeros(100, np.uint8) for _ in range(N_EACH)]
    aws = ([ep.fetch(1, f"t{i}", out=outs[i]) for i in range(N_EACH)] +
           [ctx.tag_recv(bufs[i], 1000 + i, ep=ep) for i in range(N_EACH)] +
           [b.post(notify=str(i).encode()) for i, b in enumerate(batches)])
    results = await asyncio.wait_for(asyncio.gather(*aws), 60)
    for b in batches:
        b.destroy()
    mem.deregister()
    return results, outs, bufs


def test_a_hundred_concurrent_awaits_of_fetches_receives_and_batches(peer):
    p = peer(mixed_peer)
    with xfer.Context() as ctx:
        ep = ctx.connect(p.address)
        results, outs, bufs = asyncio.run(_mixed(ctx, ep))
        assert len(results) == 3 * N_EACH
        for i in range(N_EACH):
            assert torch.equal(outs[i], torch.full((256,), float(i)))
            assert results[N_EACH + i] == 100 and (bufs[i] == i).all()
        assert p.recv() == list(range(N_EACH))
        p.send("done")
        ep.close()
    p.finish()


# ---- every call that takes a buffer --------------------------------------------------------------

KINDS = ["numpy", "memoryview", "torch", "dlpack-only"]


def buffer_of(kind, n, fill):
    """n bytes holding fill, as kind; and a function that reads them back as bytes."""
    t = torch.full((n,), fill, dtype=torch.uint8)
    if kind == "numpy":
        a = t.numpy().copy()
        return a, lambda: a.tobytes()
    if kind == "memoryview":
        b = bytearray(t.numpy().tobytes())
        return memoryview(b), lambda: bytes(b)
    if kind == "torch":
        return t, lambda: t.numpy().tobytes()
    return DLPackOnly(t), lambda: t.numpy().tobytes()


def echo_and_serve(ctx, ep, conn):
    """Echo four tagged messages back with tag + 1, then hand over a registered region's key
    and serve puts and gets until told."""
    for kind in KINDS:
        buf = bytearray(4096)
        n = ctx.tag_recv(buf, 10, ep=ep).wait(20)
        ep.tag_send(11, bytes(buf[:n])).wait(20)
    region = np.zeros(1 << 16, dtype=np.uint8)
    with ctx.register(region) as mem:
        ep.tag_send(12, mem.pack()).wait(20)
        while not conn.poll(0):
            ctx.progress()
        conn.recv()


@pytest.mark.parametrize("kind", KINDS)
def test_sends_receives_puts_and_gets_take_every_kind_of_buffer(peer, kind):
    p = peer(echo_and_serve)
    with xfer.Context() as ctx:
        ep = ctx.connect(p.address)
        for k in KINDS:                 # the peer echoes four messages
            out, _ = buffer_of(kind, 1000, 7)
            back, read_back = buffer_of(kind, 1000, 0)
            rreq = ctx.tag_recv(back, 11, ep=ep)
            ep.tag_send(10, out).wait(20)
            assert rreq.wait(20) == 1000 and read_back() == bytes([7]) * 1000, k
        blob = bytearray(4096)
        n = ctx.tag_recv(blob, 12, ep=ep).wait(20)
        rkey = ep.unpack_rkey(bytes(blob[:n]))
        src, _ = buffer_of(kind, 4096, 9)
        dst, read_dst = buffer_of(kind, 4096, 0)
        with ctx.register(src) as smem, ctx.register(dst) as dmem:
            ep.put(src, rkey, rkey.address + 100, mem=smem).wait(20)
            ep.flush().wait(20)
            assert ep.get(dst, rkey, rkey.address + 100, mem=dmem).wait(20) == 4096
            assert read_dst() == bytes([9]) * 4096
        p.send("done")
        ep.close()
    p.finish()
