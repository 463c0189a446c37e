"""NIXL's XFER backend with VRAM: the initiator's descriptors in CUDA device memory, the
target's in host memory. test/nixl.sh runs this file with XFER_CUDA_LIB naming the CUDA
driver: on a host without a GPU the stand-in driver test/plugins/fake_cuda.c (a test double
of the GPU alone: its device memory is PROT_NONE, reached only by its copy functions, so a
transport that touched device memory instead of moving it as device memory would crash the
test), and on a GPU machine the real one. The target is test_nixl's."""
import ctypes
import os
import time

import numpy as np
import pytest

from test_nixl import (HALF, MIB, WAIT_S, Target, expected_remote, layout,
                       make_agent, pattern, probes, seen_as)

VSIZE = 16 * MIB


class Device:
    """Device memory through the CUDA driver API of the library xfer loads (the same
    handle: dlopen of one path loads one library)."""

    def __init__(self):
        self.cu = ctypes.CDLL(os.environ["XFER_CUDA_LIB"])
        self.check("cuInit", 0)
        dev = ctypes.c_int()
        self.check("cuDeviceGet", ctypes.byref(dev), 0)
        ctx = ctypes.c_void_p()
        self.check("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
        self.check("cuCtxSetCurrent", ctx)

    def check(self, fn, *args):
        res = getattr(self.cu, fn)(*args)
        assert res == 0, f"{fn}: CUDA error {res}"

    def alloc(self, n):
        ptr = ctypes.c_uint64()
        self.check("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(n))
        return ptr.value

    def upload(self, ptr, a):
        self.check("cuMemcpyHtoD_v2", ctypes.c_uint64(ptr), a.ctypes.data_as(ctypes.c_void_p),
                   ctypes.c_size_t(a.nbytes))

    def download(self, ptr, n):
        out = np.empty(n, dtype=np.uint8)
        self.check("cuMemcpyDtoH_v2", out.ctypes.data_as(ctypes.c_void_p), ctypes.c_uint64(ptr),
                   ctypes.c_size_t(n))
        return out


@pytest.fixture(scope="module")
def vpair():
    assert os.environ.get("XFER_CUDA_LIB"), "run by test/nixl.sh, which names the driver"
    target = Target(("XFER",))
    ag = make_agent("initiator", ["XFER"])
    dev = Device()
    vaddr = dev.alloc(VSIZE)
    reg = ag.register_memory([(vaddr, VSIZE, 0, "")], "VRAM")
    md, raddr = target.answer("its metadata")
    target.conn.send(ag.get_agent_metadata())
    ag.add_remote_agent(md)
    yield ag, target, dev, vaddr, raddr
    target.close()
    ag.deregister_memory(reg)


def run(ag, target, op, local, remote, notif, pairs):
    """Post and wait: the final state ("DONE", "ERR", or "refused" when the post raised),
    and - with a notification - what the target saw."""
    h = ag.initialize_xfer(op, local, remote, "target", notif, ["XFER"])
    if notif:
        target.conn.send(("wait", notif, WAIT_S, probes(pairs)))
    try:
        state = ag.transfer(h)
    except Exception:           # NIXL raises the backend's refusal (NIXL_ERR_NOT_SUPPORTED)
        state = "refused"
    end = time.time() + WAIT_S
    while state == "PROC" and time.time() < end:
        state = ag.check_xfer_state(h)
    ag.release_xfer_handle(h)
    return state, (target.answer("wait") if notif else None)


def test_xfer_says_it_takes_vram_when_the_driver_is_there(vpair):
    ag = vpair[0]
    assert "VRAM_SEG" in ag.get_backend_mem_types("XFER")


@pytest.mark.parametrize("ndesc,size", [(128, 4096), (16, MIB)], ids=["128x4KiB", "16x1MiB"])
def test_vram_written_to_a_peers_host_memory_lands_before_its_notification(vpair, ndesc, size):
    ag, target, dev, vaddr, raddr = vpair
    pairs = layout(ndesc, size)
    src = pattern(VSIZE, ndesc + 100)
    dev.upload(vaddr, src)
    assert target.call("zero")
    local = ag.get_xfer_descs([(vaddr + lo, n, 0) for lo, _, n in pairs], "VRAM")
    remote = ag.get_xfer_descs([(raddr + ro, n, 0) for _, ro, n in pairs], "DRAM")
    state, seen = run(ag, target, "WRITE", local, remote, f"vram {ndesc}".encode(), pairs)
    assert state == "DONE"
    want = expected_remote(pairs, src, np.zeros(2 * HALF, dtype=np.uint8))
    assert seen == seen_as(pairs, want)


@pytest.mark.parametrize("ndesc,size", [(128, 4096), (16, MIB)], ids=["128x4KiB", "16x1MiB"])
def test_a_peers_host_memory_read_into_vram(vpair, ndesc, size):
    ag, target, dev, vaddr, raddr = vpair
    pairs = layout(ndesc, size)
    assert target.call("fill", ndesc + 200)
    remote_bytes = pattern(2 * HALF, ndesc + 200)
    dev.upload(vaddr, np.zeros(VSIZE, dtype=np.uint8))
    local = ag.get_xfer_descs([(vaddr + lo, n, 0) for lo, _, n in pairs], "VRAM")
    remote = ag.get_xfer_descs([(raddr + ro, n, 0) for _, ro, n in pairs], "DRAM")
    state, _ = run(ag, target, "READ", local, remote, b"", pairs)
    got = dev.download(vaddr, VSIZE)
    assert state == "DONE"
    for lo, ro, n in pairs:
        assert np.array_equal(got[lo:lo + n], remote_bytes[ro:ro + n])


def test_vram_within_one_agent_is_refused_with_a_reason():
    ag = make_agent("self", ["XFER"])
    dev = Device()
    a = dev.alloc(MIB)
    host = np.zeros(MIB, dtype=np.uint8)
    regs = [ag.register_memory([(a, MIB, 0, "")], "VRAM"),
            ag.register_memory([(host.ctypes.data, MIB, 0, "")], "DRAM")]
    local = ag.get_xfer_descs([(a, MIB, 0)], "VRAM")
    remote = ag.get_xfer_descs([(host.ctypes.data, MIB, 0)], "DRAM")
    # a copy within one agent is a memmove: refused, at preparation or at posting, and
    # nothing of the device memory touched (the stand-in would have crashed)
    try:
        h = ag.initialize_xfer("WRITE", local, remote, "self")
        try:
            state = ag.transfer(h)
        finally:
            ag.release_xfer_handle(h)
    except Exception as e:      # NIXL raises the backend's status as an exception
        state = f"raised {type(e).__name__}"
    assert state == "ERR" or state.startswith("raised"), state
    for r in regs:
        ag.deregister_memory(r)
