"""xfer's Ray tensor transport (contrib/ray) on a real local Ray cluster: actors move torch
tensors to each other with tensor_transport="xfer" and check every byte. test/ray.sh runs it
once per xfer transport (XFER_TRANSPORTS, inherited by every Ray worker)."""
import os
import time

import pytest
import ray
import torch

import xfer_ray

GiB = 1 << 30
MiB = 1 << 20

# before any class names the transport
xfer_ray.register(["cpu"])


def pattern(n, seed):
    """n bytes that the sender and the checker make alike and a shifted copy would not."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)


def mixed(count):
    """count tensors of every shape and dtype a model has, in one object (a dict of lists and
    plain values around them, as a state dict would be)."""
    out = {"step": 7, "tensors": []}
    for i in range(count):
        kind = i % 6
        if kind == 0:
            t = torch.arange(i + 1, dtype=torch.float32) * 0.5
        elif kind == 1:
            t = (torch.arange((i + 1) * 3, dtype=torch.float32) / 7).to(torch.bfloat16)
            t = t.reshape(i + 1, 3)
        elif kind == 2:
            t = torch.arange(i * 5, dtype=torch.int64).reshape(-1, 5) - 1000
        elif kind == 3:
            t = torch.arange(i + 2) % 3 == 0
        elif kind == 4:
            t = torch.tensor(float(i))                  # 0-d
        else:
            t = torch.empty((0, 4), dtype=torch.float16)
        out["tensors"].append(t)
    return out


@ray.remote(enable_tensor_transport=True)
class Sender:
    @ray.method(tensor_transport="xfer")
    def bytes(self, n, seed):
        return pattern(n, seed)

    @ray.method(tensor_transport="xfer")
    def zeros(self, n):
        return torch.zeros(n, dtype=torch.uint8)

    @ray.method(tensor_transport="xfer")
    def mixed(self, count):
        return mixed(count)

    def live(self):
        from ray.experimental.rdt.util import get_tensor_transport_manager
        return get_tensor_transport_manager("XFER").live_objects()

    def pid(self):
        return os.getpid()


@ray.remote(enable_tensor_transport=True)
class Receiver:
    def check(self, t, n, seed):
        """Whether t is pattern(n, seed), byte for byte."""
        return t.dtype == torch.uint8 and t.numel() == n and torch.equal(t, pattern(n, seed))

    def echo(self, obj):
        return obj

    def length(self, t):
        return t.numel()

    def outcomes(self):
        from ray.experimental.rdt.util import get_tensor_transport_manager
        return get_tensor_transport_manager("XFER").outcomes()

    def pid(self):
        return os.getpid()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False,
             _temp_dir=str(tmp_path_factory.mktemp("ray")))
    yield
    ray.shutdown()


def wait_until(fn, timeout=30):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if fn():
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("n", [1 << 10, MiB, 64 * MiB, GiB],
                         ids=["1KiB", "1MiB", "64MiB", "1GiB"])
def test_an_actor_receives_a_tensor_byte_for_byte(cluster, n):
    s, r = Sender.remote(), Receiver.remote()
    ref = s.bytes.remote(n, n)
    assert ray.get(r.check.remote(ref, n, n), timeout=300)
    # the same object again, to a second receiver: the sender keeps serving it
    r2 = Receiver.remote()
    assert ray.get(r2.check.remote(ref, n, n), timeout=300)
    for a in (s, r, r2):
        ray.kill(a)


def test_many_tensors_of_every_dtype_in_one_object(cluster):
    s, r = Sender.remote(), Receiver.remote()
    ref = s.mixed.remote(120)
    got = ray.get(r.echo.remote(ref), timeout=120)
    assert got["step"] == 7 and len(got["tensors"]) == 120
    # what the sender made, made again here: every tensor exactly
    for i, (a, b) in enumerate(zip(got["tensors"], mixed(120)["tensors"])):
        assert a.dtype == b.dtype and a.shape == b.shape, i
        assert torch.equal(a, b), i
    for a in (s, r):
        ray.kill(a)


def test_the_driver_gets_and_puts_over_xfer(cluster):
    """The driver is a peer too: ray.get of an actor's object and ray.put of its own."""
    s, r = Sender.remote(), Receiver.remote()
    ref = s.bytes.remote(3 * MiB + 5, 11)
    t = ray.get(ref, timeout=120)
    assert torch.equal(t, pattern(3 * MiB + 5, 11))
    mine = ray.put(pattern(MiB, 12), _tensor_transport="xfer")
    assert ray.get(r.check.remote(mine, MiB, 12), timeout=120)
    for a in (s, r):
        ray.kill(a)


def test_what_was_sent_is_released_when_ray_collects_it(cluster):
    """The sender's registrations live exactly as long as Ray's references: received or not,
    once the last reference goes, garbage_collect deregisters them."""
    s, r = Sender.remote(), Receiver.remote()
    refs = [s.bytes.remote(MiB, i) for i in range(8)]
    assert all(ray.get([r.check.remote(ref, MiB, i) for i, ref in enumerate(refs)],
                       timeout=120))
    unsent = s.bytes.remote(MiB, 99)
    assert wait_until(lambda: ray.get(s.live.remote()) == 9)
    del refs
    assert wait_until(lambda: ray.get(s.live.remote()) == 1), ray.get(s.live.remote())
    del unsent
    assert wait_until(lambda: ray.get(s.live.remote()) == 0), ray.get(s.live.remote())
    for a in (s, r):
        ray.kill(a)


def test_a_broken_endpoint_is_replaced_even_while_a_transfer_holds_it():
    """The receiver's endpoint cache, without Ray: when the connection to a sender breaks
    while a transfer still holds its endpoint, the next transfer gets a new connection, and
    the broken endpoint is closed when the last holder lets go."""
    from xfer_ray.transport import _Node
    sender, receiver = _Node(), _Node()
    try:
        first = receiver.lease(sender.address)
        assert wait_until(lambda: len(sender.accepted) == 1)
        with sender.lock:
            sender.accepted.pop().close(force=True)     # the sender's side goes
        assert wait_until(lambda: first.status != 0)
        second = receiver.lease(sender.address)         # first is still held
        assert second is not first and second.status == 0
        assert [e for e, _ in receiver.retired] == [first]
        receiver.release(sender.address, first)
        assert receiver.retired == []
        receiver.release(sender.address, second)
        assert receiver.peers[sender.address] == [second, 0]
        assert receiver.lease(sender.address) is second  # a working one is kept
        receiver.release(sender.address, second)
    finally:
        receiver.close()
        sender.close()


def test_abort_flags_are_bounded_and_the_newest_still_aborts():
    """Ray's abort flags, without Ray: one raised for an object no receive here takes (its
    receive ended, or never starts) is not kept forever - the oldest go past a bound - and
    the newest still aborts the receive of its object."""
    from xfer_ray.transport import _ABORTS_REMEMBERED, _Aborted
    t = xfer_ray.XferTensorTransport()
    for i in range(_ABORTS_REMEMBERED + 100):
        t.abort_transport(f"obj{i}", None)
    assert len(t._aborted) == _ABORTS_REMEMBERED
    assert "obj0" not in t._aborted
    newest = f"obj{_ABORTS_REMEMBERED + 99}"
    with pytest.raises(_Aborted):
        t._check_abort(newest)
    assert newest not in t._aborted         # taken once
    t._check_abort(newest)                  # and not again


def one_tensor_metadata(sender, src, n):
    """Ray's metadata of one tensor of n bytes that sender offers: src, registered there."""
    from xfer_ray.transport import XferTransportMetadata
    mem = sender.node().ctx.register(src)
    return mem, XferTransportMetadata(tensor_meta=[((n,), torch.uint8)], tensor_device="cpu",
                                      xfer_address=sender.node().address,
                                      xfer_rkeys=[mem.pack()])


@pytest.fixture
def pair():
    """Two transports in this process, without Ray: a receiver and a sender."""
    t, sender = xfer_ray.XferTensorTransport(), xfer_ray.XferTensorTransport()
    yield t, sender
    t.node().close()
    sender.node().close()


def test_metadata_that_lies_about_a_tensor_s_size_is_refused_before_any_get(pair):
    """A sender whose key covers fewer bytes than the tensor Ray describes (a lying or broken
    peer): the receive is refused with ValueError, nothing is read, the endpoint is released."""
    t, sender = pair
    mem, meta = one_tensor_metadata(sender, pattern(4096, 3), 8192)
    with pytest.raises(ValueError, match="registered 4096 bytes for a tensor of 8192"):
        t.fetch_multiple_tensors("liar", meta, None)
    assert t.node().peers[sender.node().address][1] == 0     # no holder left
    assert t.outcomes() == {"completed": 0, "aborted": 0, "failed": 1}
    mem.deregister()


def test_an_abort_that_comes_before_the_receive_ends_it_as_aborted(pair):
    """Ray's failure monitor may abort a transfer before the receiver's actor began it (an
    actor slow to start): the receive then ends at once, aborted - counted so, nothing read -
    and the same object's next receive is not aborted by the flag again."""
    from xfer_ray.transport import _Aborted
    t, sender = pair
    src = pattern(4096, 5)
    mem, meta = one_tensor_metadata(sender, src, 4096)
    t.abort_transport("early", None)
    with pytest.raises(_Aborted):
        t.recv_multiple_tensors("early", meta, None)
    assert t.outcomes() == {"completed": 0, "aborted": 1, "failed": 0}
    got = t.recv_multiple_tensors("early", meta, None)
    assert torch.equal(got[0], src)
    assert t.outcomes() == {"completed": 1, "aborted": 1, "failed": 0}
    mem.deregister()


def big_over_tcp():
    """A transfer long enough to kill or abort it midway: 4 GiB over xfer's tcp (about 3 s
    here), whatever transport the rest of the suite runs on."""
    return {"runtime_env": {"env_vars": {"XFER_TRANSPORTS": "tcp"}}}


def test_a_sender_killed_mid_transfer_fails_the_receive_and_nothing_hangs(cluster):
    n = 4 * GiB
    s = Sender.options(**big_over_tcp()).remote()
    r = Receiver.options(**big_over_tcp()).remote()
    ref = s.zeros.remote(n)
    ray.get(s.live.remote())                    # made and registered
    assert wait_until(lambda: ray.get(s.live.remote()) == 1)
    started = time.monotonic()
    got = r.length.remote(ref)
    time.sleep(1.0)
    ray.kill(s)
    with pytest.raises(Exception) as e:
        ray.get(got, timeout=120)
    assert time.monotonic() - started < 120
    print("the receive failed with", type(e.value).__name__)
    # it failed in the transport, midway: the gets saw the sender go (not a transfer that
    # never started, nor one that finished before the kill)
    assert wait_until(lambda: ray.get(r.outcomes.remote())["failed"] == 1)
    assert ray.get(r.outcomes.remote())["completed"] == 0
    # the receiver is not wedged: it takes an object from another sender
    s2 = Sender.options(**big_over_tcp()).remote()
    assert ray.get(r.check.remote(s2.bytes.remote(MiB, 5), MiB, 5), timeout=120)
    for a in (r, s2):
        ray.kill(a)


def test_a_receiver_killed_mid_transfer_leaves_the_sender_serving(cluster):
    n = 4 * GiB
    s = Sender.options(**big_over_tcp()).remote()
    r = Receiver.options(**big_over_tcp()).remote()
    ref = s.zeros.remote(n)
    assert wait_until(lambda: ray.get(s.live.remote()) == 1)
    got = r.length.remote(ref)
    time.sleep(1.0)
    ray.kill(r)
    with pytest.raises(Exception):
        ray.get(got, timeout=120)
    # the sender serves the same object to another receiver, whole
    r2 = Receiver.options(**big_over_tcp()).remote()
    assert ray.get(r2.length.remote(ref), timeout=300) == n
    del ref, got
    assert wait_until(lambda: ray.get(s.live.remote()) == 0)
    for a in (s, r2):
        ray.kill(a)
