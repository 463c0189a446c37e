"""NIXL's XFER backend (contrib/nixl), driven through NIXL's own Python API.

This process is the initiator: a NIXL agent with the XFER backend (and, in one test, NIXL's
UCX backend beside it). The target is another process (multiprocessing, spawned), an agent
of its own that this one talks to through a pipe for what a test needs to know: its
metadata, its buffers' addresses, the notifications it saw and what its memory held when it
saw them. Metadata goes the way NIXL exchanges it (get_agent_metadata / add_remote_agent).

test/nixl.sh runs this file once per transport (XFER_TRANSPORTS), with NIXL_PLUGIN_DIR
holding the plug-in under test and NIXL's UCX plug-in.
"""

import hashlib
import multiprocessing as mp
import os
import signal
import socket
import time

import numpy as np
import pytest

MIB = 1 << 20
HALF = 64 * MIB     # the target registers its buffer as two halves of this size
WAIT_S = 60


def make_agent(name, backends, listen_port=None, prog_thread=True):
    """An agent; with listen_port, one that also serves its metadata there (NIXL's listener
    thread, which peers fetch it from and send theirs to); without prog_thread, one whose
    backends run no progress thread (NIXL's enable_prog_thread=False): its transfers move
    only while it checks them."""
    from nixl._api import nixl_agent, nixl_agent_config

    if listen_port is None:
        return nixl_agent(name, nixl_agent_config(backends=list(backends),
                                                  enable_prog_thread=prog_thread))
    return nixl_agent(name, nixl_agent_config(backends=list(backends), enable_listen_thread=True,
                                              listen_port=listen_port,
                                              enable_prog_thread=prog_thread))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pattern(n, seed):
    """n bytes that differ with seed and with the offset."""
    return ((np.arange(n, dtype=np.uint64) * 2654435761 + seed * 97) >> 7).astype(np.uint8)


def digest(a):
    return hashlib.sha256(a.tobytes()).hexdigest()


# ---- the target process --------------------------------------------------------------------


def target_main(conn, backends, listen_port):
    ag = make_agent("target", backends, listen_port)
    buf = np.zeros(2 * HALF, dtype=np.uint8)
    regs = [ag.register_memory([(buf.ctypes.data + i * HALF, HALF, 0, "")], "DRAM")
            for i in range(2)]
    if listen_port is None:     # metadata through the pipe
        conn.send((ag.get_agent_metadata(), buf.ctypes.data))
        ag.add_remote_agent(conn.recv())
    else:                       # through NIXL's listener: only the address comes this way
        conn.send((None, buf.ctypes.data))
    seen = []       # (message, digest of the buffer when the notification was seen)
    while True:
        cmd, *args = conn.recv()
        if cmd == "fill":
            seed, = args
            buf[:] = pattern(buf.size, seed)
            conn.send(True)
        elif cmd == "zero":
            buf[:] = 0
            conn.send(True)
        elif cmd == "wait":
            # Wait for a notification with this message. What the buffer held when it came:
            # first the last 8 bytes of each range in probes (the last of a range to land),
            # read at once, then the digest of the whole buffer.
            msg, timeout, probes = args
            end = time.time() + timeout
            found = None
            while found is None and time.time() < end:
                for m in ag.get_new_notifs().get("initiator", []):
                    tails = [bytes(buf[o:o + 8]) for o in probes]
                    seen.append((m, (tails, digest(buf))))
                for i, (m, d) in enumerate(seen):
                    if m == msg:
                        found = d
                        del seen[i]
                        break
                if found is None:
                    time.sleep(0.0005)
            conn.send(found)
        elif cmd == "digest":
            conn.send(digest(buf))
        elif cmd == "notify":
            msg, = args
            ag.send_notif("initiator", msg)
            conn.send(True)
        elif cmd == "quit":
            break
    for r in regs:
        ag.deregister_memory(r)
    ag.remove_remote_agent("initiator")
    conn.send("bye")


class Target:
    def __init__(self, backends, listen_port=None):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=target_main, args=(child, backends, listen_port),
                                daemon=True)
        self.proc.start()

    def call(self, *cmd):
        self.conn.send(cmd)
        return self.answer(cmd[0])

    def answer(self, what):
        if not self.conn.poll(WAIT_S + 10):
            raise AssertionError(f"the target did not answer {what}")
        return self.conn.recv()

    def close(self):
        if self.proc.is_alive():
            try:
                self.call("quit")
            except (AssertionError, OSError, EOFError):
                pass
        self.proc.join(20)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join()


class Pair:
    """This process's agent and buffer, the target's, connected."""

    def __init__(self, backends=("XFER",), via_listener=False, prog_thread=True):
        port = free_port() if via_listener else None
        self.target = Target(backends, port)
        # NIXL's metadata exchange runs on the listener thread of each side
        self.ag = make_agent("initiator", backends, free_port() if via_listener else None,
                             prog_thread)
        self.buf = np.zeros(2 * HALF, dtype=np.uint8)
        self.reg = self.ag.register_memory([(self.buf.ctypes.data, self.buf.size, 0, "")],
                                           "DRAM")
        md, self.raddr = self.target.answer("its metadata")
        if port is None:
            self.target.conn.send(self.ag.get_agent_metadata())
            assert self.ag.add_remote_agent(md) in (b"target", "target")
            return
        self.ag.fetch_remote_metadata("target", "127.0.0.1", port)
        self.ag.send_local_metadata("127.0.0.1", port)
        end = time.time() + WAIT_S
        while not self.ag.check_remote_metadata("target"):
            assert time.time() < end, "no metadata from the target's listener"
            time.sleep(0.01)

    def descs(self, pairs):
        """Local and remote descriptor lists for [(local offset, remote offset, length)]."""
        la = self.buf.ctypes.data
        local = self.ag.get_xfer_descs([(la + lo, n, 0) for lo, _, n in pairs], "DRAM")
        remote = self.ag.get_xfer_descs([(self.raddr + ro, n, 0) for _, ro, n in pairs], "DRAM")
        return local, remote

    def run(self, op, pairs, notif=b"", backends=("XFER",)):
        """Post and wait: the final state, the backend, and - with a notification - the digest
        of the target's buffer when the target saw it. The target is watching for it before
        the transfer is posted, so that the digest is of its memory at the notification's
        arrival, while the transfer may still be moving what the notification must follow."""
        local, remote = self.descs(pairs)
        h = self.ag.initialize_xfer(op, local, remote, "target", notif, list(backends))
        if notif:
            self.target.conn.send(("wait", notif, WAIT_S, probes(pairs)))
        state = self.ag.transfer(h)
        end = time.time() + WAIT_S
        while state == "PROC" and time.time() < end:
            state = self.ag.check_xfer_state(h)
        backend = self.ag.query_xfer_backend(h)
        self.ag.release_xfer_handle(h)
        return state, backend, (self.target.answer("wait") if notif else None)

    def close(self):
        self.target.close()
        self.ag.deregister_memory(self.reg)


@pytest.fixture(scope="module")
def pair():
    p = Pair()
    yield p
    p.close()


def probes(pairs):
    """Where the last 8 bytes of each remote range are."""
    return [ro + n - 8 for _, ro, n in pairs]


def seen_as(pairs, want):
    """What the target should have seen at the notification: the tails, then the digest."""
    return ([bytes(want[o:o + 8]) for o in probes(pairs)], digest(want))


def layout(ndesc, size):
    """Descriptor i: local offset i * size, remote offset (ndesc - 1 - i) * size, reversed so
    that a descriptor that lands in the wrong place shows."""
    return [(i * size, (ndesc - 1 - i) * size, size) for i in range(ndesc)]


def expected_remote(pairs, src, base):
    out = base.copy()
    for lo, ro, n in pairs:
        out[ro:ro + n] = src[lo:lo + n]
    return out


SHAPES = [(1, 4096), (1024, 4096), (128, 64 * 1024), (16, MIB), (1, 64 * MIB)]


@pytest.mark.parametrize("ndesc,size", SHAPES, ids=[f"{n}x{s}" for n, s in SHAPES])
def test_write_lands_before_its_notification(pair, ndesc, size):
    seed = ndesc * 7 + size
    pairs = layout(ndesc, size)
    pair.buf[:] = pattern(pair.buf.size, seed)
    assert pair.target.call("zero")
    msg = f"write {ndesc}x{size}".encode()
    state, backend, seen = pair.run("WRITE", pairs, msg)
    assert (state, backend) == ("DONE", "XFER")
    want = expected_remote(pairs, pair.buf, np.zeros(2 * HALF, dtype=np.uint8))
    assert seen == seen_as(pairs, want)     # all of the data was there at the notification


@pytest.mark.parametrize("ndesc,size", SHAPES, ids=[f"{n}x{s}" for n, s in SHAPES])
def test_read_brings_the_data_then_notifies(pair, ndesc, size):
    seed = ndesc * 11 + size
    pairs = layout(ndesc, size)
    assert pair.target.call("fill", seed)
    remote = pattern(2 * HALF, seed)
    pair.buf[:] = 0
    msg = f"read {ndesc}x{size}".encode()
    state, backend, seen = pair.run("READ", pairs, msg)
    assert (state, backend) == ("DONE", "XFER")
    for lo, ro, n in pairs:
        assert np.array_equal(pair.buf[lo:lo + n], remote[ro:ro + n])
    assert seen == seen_as(pairs, remote)   # notified, and its memory read, not changed


def xfer_progress_threads():
    """This process's threads that xfer runs progress on (it names them xfer-progress)."""
    n = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                n += f.read().strip() == "xfer-progress"
        except OSError:
            pass
    return n


def test_without_nixls_progress_thread_checking_moves_the_transfers():
    """An initiator created with enable_prog_thread=False: the backend starts no progress
    thread of xfer's, and its WRITEs and READs complete, notifications after the data,
    because check_xfer_state progresses them."""
    before = xfer_progress_threads()       # the agents of other tests
    p = Pair(prog_thread=False)
    try:
        assert xfer_progress_threads() == before
        for ndesc, size in [(128, 4096), (16, MIB)]:
            pairs = layout(ndesc, size)
            p.buf[:] = pattern(p.buf.size, ndesc)
            assert p.target.call("zero")
            state, backend, seen = p.run("WRITE", pairs, f"no thread {ndesc}".encode())
            assert (state, backend) == ("DONE", "XFER")
            want = expected_remote(pairs, p.buf, np.zeros(2 * HALF, dtype=np.uint8))
            assert seen == seen_as(pairs, want)
            assert p.target.call("fill", size)
            p.buf[:] = 0
            state, _, _ = p.run("READ", pairs)
            assert state == "DONE"
            remote = pattern(2 * HALF, size)
            for lo, ro, n in pairs:
                assert np.array_equal(p.buf[lo:lo + n], remote[ro:ro + n])
    finally:
        p.close()
    # and with the thread, as every other test runs: one more
    p = Pair()
    try:
        assert xfer_progress_threads() == before + 1
    finally:
        p.close()


def test_a_notification_follows_the_data_of_every_registration(pair):
    # one descriptor into each of the target's two registrations: two xfer batches, and the
    # notification after both
    pairs = [(0, HALF + 4096, HALF - 8192), (HALF, 0, HALF)]
    pair.buf[:] = pattern(pair.buf.size, 5)
    assert pair.target.call("zero")
    state, _, seen = pair.run("WRITE", pairs, b"both halves")
    assert state == "DONE"
    want = expected_remote(pairs, pair.buf, np.zeros(2 * HALF, dtype=np.uint8))
    assert seen == seen_as(pairs, want)


def test_a_transfer_without_notification_delivers_none(pair):
    pair.buf[:] = pattern(pair.buf.size, 9)
    state, _, _ = pair.run("WRITE", layout(4, 4096))
    assert state == "DONE"
    assert pair.target.call("wait", b"", 1, []) is None


def test_notifications_without_data_both_ways(pair):
    pair.ag.send_notif("target", b"hello target")
    assert pair.target.call("wait", b"hello target", WAIT_S, []) is not None
    assert pair.target.call("notify", b"hello initiator")
    end = time.time() + WAIT_S
    while not pair.ag.check_remote_xfer_done("target", b"hello initiator"):
        assert time.time() < end, "no notification from the target"
        time.sleep(0.001)


def test_a_prepared_transfer_posts_again(pair):
    local, remote = pair.descs(layout(8, 65536))
    h = pair.ag.initialize_xfer("WRITE", local, remote, "target", b"", ["XFER"])
    assert pair.target.call("zero")
    for seed in (1, 2, 3):
        pair.buf[:] = pattern(pair.buf.size, seed)
        msg = f"again {seed}".encode()
        pair.target.conn.send(("wait", msg, WAIT_S, probes(layout(8, 65536))))
        state = pair.ag.transfer(h, msg)
        while state == "PROC":
            state = pair.ag.check_xfer_state(h)
        assert state == "DONE"
        # each post overwrites the same ranges with its own data, before its notification
        want = expected_remote(layout(8, 65536), pair.buf, np.zeros(2 * HALF, dtype=np.uint8))
        assert pair.target.answer("wait") == seen_as(layout(8, 65536), want)
    pair.ag.release_xfer_handle(h)


def test_a_released_transfer_in_flight_is_aborted_or_complete(pair):
    # release right after posting: either the whole transfer landed and notified, or no
    # notification comes - never a notification before all of the data
    pairs = layout(64, MIB)
    pair.buf[:] = pattern(pair.buf.size, 21)
    assert pair.target.call("zero")
    local, remote = pair.descs(pairs)
    h = pair.ag.initialize_xfer("WRITE", local, remote, "target", b"aborted", ["XFER"])
    pair.target.conn.send(("wait", b"aborted", 5, probes(pairs)))
    state = pair.ag.transfer(h)
    assert state in ("PROC", "DONE")
    pair.ag.release_xfer_handle(h)
    got = pair.target.answer("wait")
    if got is not None:
        want = expected_remote(pairs, pair.buf, np.zeros(2 * HALF, dtype=np.uint8))
        assert got == seen_as(pairs, want)
    # the pair works on
    state, _, seen = pair.run("WRITE", layout(1, 4096), b"after abort")
    assert state == "DONE" and seen is not None


def test_a_transfer_to_this_same_agent_is_a_copy():
    ag = make_agent("self", ["XFER"])
    src = pattern(MIB, 3)
    dst = np.zeros(MIB, dtype=np.uint8)
    regs = [ag.register_memory([(a.ctypes.data, a.size, 0, "")], "DRAM") for a in (src, dst)]
    local = ag.get_xfer_descs([(src.ctypes.data, MIB, 0)], "DRAM")
    remote = ag.get_xfer_descs([(dst.ctypes.data, MIB, 0)], "DRAM")
    h = ag.initialize_xfer("WRITE", local, remote, "self", b"to me")
    state = ag.transfer(h)
    while state == "PROC":
        state = ag.check_xfer_state(h)
    assert state == "DONE"
    assert np.array_equal(src, dst)
    assert ag.check_remote_xfer_done("self", b"to me")
    ag.release_xfer_handle(h)
    for r in regs:
        ag.deregister_memory(r)


def test_beside_nixls_ucx_backend():
    p = Pair(backends=("UCX", "XFER"))
    try:
        for backend, seed in (("UCX", 31), ("XFER", 32)):
            pairs = layout(32, 65536)
            p.buf[:] = pattern(p.buf.size, seed)
            assert p.target.call("zero")
            msg = f"via {backend}".encode()
            state, used, seen = p.run("WRITE", pairs, msg, backends=(backend,))
            assert (state, used) == ("DONE", backend)
            want = expected_remote(pairs, p.buf, np.zeros(2 * HALF, dtype=np.uint8))
            assert seen == seen_as(pairs, want)
    finally:
        p.close()


def test_metadata_through_nixls_listener():
    # each side's connection info and keys go through NIXL's own metadata exchange
    # (fetch_remote_metadata / send_local_metadata to the target's listener thread)
    p = Pair(via_listener=True)
    try:
        pairs = layout(16, 65536)
        p.buf[:] = pattern(p.buf.size, 41)
        assert p.target.call("zero")
        state, backend, seen = p.run("WRITE", pairs, b"via the listener")
        assert (state, backend) == ("DONE", "XFER")
        want = expected_remote(pairs, p.buf, np.zeros(2 * HALF, dtype=np.uint8))
        assert seen == seen_as(pairs, want)
    finally:
        p.close()


def test_a_target_that_dies_fails_the_transfer():
    p = Pair()
    try:
        state, _, _ = p.run("WRITE", layout(1, 4096))
        assert state == "DONE"
        os.kill(p.target.proc.pid, signal.SIGKILL)
        p.target.proc.join(10)
        # the endpoint learns of it (the socket closes); a transfer then fails, and none hangs
        end = time.time() + WAIT_S
        while True:
            local, remote = p.descs(layout(16, MIB))
            try:
                h = p.ag.initialize_xfer("WRITE", local, remote, "target", b"", ["XFER"])
            except Exception:       # NIXL refuses to prepare it: the backend said why
                break
            state = p.ag.transfer(h)
            while state == "PROC" and time.time() < end:
                state = p.ag.check_xfer_state(h)
            p.ag.release_xfer_handle(h)
            if state == "ERR":
                break
            assert time.time() < end, "transfers to a dead target still succeed"
            time.sleep(0.05)
    finally:
        p.ag.remove_remote_agent("target")
        p.ag.deregister_memory(p.reg)
