"""XferTensorTransport: Ray's TensorTransportManager over xfer (see the package's docstring).

The sending actor registers each tensor of an object with xfer when Ray asks for the object's
metadata, and keeps the registrations until Ray garbage-collects the object. Ray hands the
metadata - the sender's xfer address and one packed remote key per tensor - to the receiving
actor, which connects (once per sender, cached), registers its destination tensors and reads
every tensor with one xfer get each, all in flight at once. Abort (Ray's failure monitor),
a sender that dies and a timeout all end the gets: cancelled, waited for, and only then are
the destination tensors deregistered, so that nothing lands in memory that was handed back.
"""
import atexit
import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional

import xfer

import ray
from ray.experimental.rdt.tensor_transport_manager import (CommunicatorMetadata,
                                                           FetchRequest,
                                                           TensorTransportManager,
                                                           TensorTransportMetadata)

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

NAME = "XFER"

# how long a wait sleeps in xfer before it looks at Ray's abort flag again
_POLL_S = 0.05
# the most one get moves: a larger tensor goes as several gets, all in flight at once, so that
# the receiver takes in one piece while the sender sends the next (32 MiB: the fastest of 8, 32,
# 64 and 256 MiB for a 256 MiB tensor over tcp here, contrib/bench/bench_ray.sh); and a
# transport bounds one message (tcp's XFER_TCP_MAX_MSG_SIZE is 1 GiB by default)
_CHUNK = 32 << 20
# destination registrations whose gets would not end (see XferFetchRequest.finish)
_KEPT: List[Any] = []
# how many actors' "xfer runs there" answers a process remembers
_ACTORS_REMEMBERED = 4096
# how many of Ray's abort flags a process keeps: a flag for an object whose receive already
# ended (or never starts here) is never taken, so the oldest go first
_ABORTS_REMEMBERED = 4096
# how long cancelled gets may take to finish before their destination is given up (leaked,
# never deregistered under a transfer that might still land)
_CANCEL_WAIT_S = 10.0


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name, "")
    try:
        value = int(text) if text else default
    except ValueError:
        raise ValueError(f"{name}={text!r} is not a number") from None
    if value < 1:
        raise ValueError(f"{name}={text!r} must be at least 1")
    return value


def _byte_view(t: "torch.Tensor") -> "torch.Tensor":
    """The tensor's bytes as a flat uint8 tensor sharing its memory (xfer registers and moves
    bytes; the dtype travels in Ray's metadata). Contiguous tensors only."""
    import torch
    if not t.is_contiguous():
        raise ValueError("xfer's Ray transport moves contiguous tensors only")
    return t.reshape(-1).view(torch.uint8)


def _transport_error(what: str, cause: BaseException):
    from ray.exceptions import RayDirectTransportError
    return RayDirectTransportError(f"{what}: {cause}")


def _aborted_class():
    from ray.exceptions import RayDirectTransportError

    class XferAborted(RayDirectTransportError):
        """Ray aborted the transfer (abort_transport) while its gets ran."""
    return XferAborted


_Aborted = _aborted_class()


@dataclass
class XferCommunicatorMetadata(CommunicatorMetadata):
    """Nothing: a one-sided get needs no pairing of ranks."""


@dataclass
class XferTransportMetadata(TensorTransportMetadata):
    """What the receiver needs to read the object's tensors.

    xfer_address: the sending actor's xfer listener ("host:port").
    xfer_rkeys: one packed remote key per tensor (None for a tensor with no bytes).
    """
    xfer_address: Optional[str] = None
    xfer_rkeys: List[Optional[bytes]] = field(default_factory=list)

    __eq__ = object.__eq__
    __hash__ = object.__hash__


class _Node:
    """This process's xfer side: a context with a progress thread (which serves peers' gets
    while the actor runs its own tasks), a listener with an accept thread, the endpoints
    peers opened to us and those we opened to them."""

    def __init__(self):
        self.ctx = xfer.Context(progress_thread=True)
        host = os.environ.get("XFER_RAY_HOST") or ray.util.get_node_ip_address()
        bracketed = f"[{host}]" if ":" in host else host
        self.listener = self.ctx.listen(f"{bracketed}:0")
        self.address = f"{bracketed}:{self.listener.port}"
        self.max_peers = _env_int("XFER_RAY_MAX_PEERS", 64)
        self.chunk = _env_int("XFER_RAY_CHUNK", _CHUNK)
        self.lock = threading.Lock()
        self.accepted: List[xfer.Endpoint] = []
        # address -> [endpoint, transfers using it], least recently used first
        self.peers: "OrderedDict[str, list]" = OrderedDict()
        # [endpoint, transfers using it] whose connection broke while in use
        self.retired: List[list] = []
        self.closing = False
        self.acceptor = threading.Thread(target=self._accept_loop, name="xfer-ray-accept",
                                         daemon=True)
        self.acceptor.start()
        atexit.register(self.close)

    def _accept_loop(self):
        while not self.closing:
            try:
                ep = self.listener.accept(timeout=0.2)
            except xfer.XferTimeoutError:
                ep = None
            except xfer.XferError as e:
                # a peer that failed its handshake: it gets the error, we go on
                logger.debug("xfer_ray: accept: %s", e)
                continue
            with self.lock:
                if ep is not None:
                    self.accepted.append(ep)
                # endpoints whose peer went away are of no more use: closed here
                live = []
                for a in self.accepted:
                    if a.status == 0:
                        live.append(a)
                    else:
                        a.close(force=True)
                self.accepted = live

    def lease(self, address: str) -> xfer.Endpoint:
        """An endpoint to the peer at address, connected on first use; release() it after.
        One whose connection broke is not handed out again: a new one replaces it, and the
        broken one is closed once the transfers still holding it let go."""
        with self.lock:
            entry = self.peers.get(address)
            if entry is not None and entry[0].status != 0:
                self._retire(address)
                entry = None
            if entry is not None:
                self.peers.move_to_end(address)
                entry[1] += 1
                return entry[0]
        ep = self.ctx.connect(address)
        with self.lock:
            entry = self.peers.get(address)
            if entry is not None and entry[0].status == 0:
                # another thread connected meanwhile: use one endpoint per peer
                ep.close(force=True)
                ep = entry[0]
                entry[1] += 1
            else:
                if entry is not None:
                    self._retire(address)
                self.peers[address] = [ep, 1]
            self._evict()
        return ep

    def release(self, address: str, ep: xfer.Endpoint) -> None:
        with self.lock:
            entry = self.peers.get(address)
            if entry is not None and entry[0] is ep:
                entry[1] -= 1
            else:
                for old in self.retired:
                    if old[0] is ep:
                        old[1] -= 1
                        if old[1] == 0:
                            ep.close(force=True)
                            self.retired.remove(old)
                        break
            self._evict()

    def _retire(self, address: str) -> None:
        """Take the endpoint of address out of use (lock held): closed now when idle, else
        when its last transfer releases it."""
        entry = self.peers.pop(address)
        if entry[1] == 0:
            entry[0].close(force=True)
        else:
            self.retired.append(entry)

    def _evict(self):
        """Close the least recently used idle endpoints beyond max_peers (lock held)."""
        while len(self.peers) > self.max_peers:
            for address, (ep, users) in self.peers.items():
                if users == 0:
                    ep.close(force=True)
                    del self.peers[address]
                    break
            else:
                return      # all in use: closed when released

    def close(self):
        if self.closing:
            return
        self.closing = True
        self.acceptor.join(5)
        with self.lock:
            for ep in self.accepted:
                ep.close(force=True)
            for ep, _ in list(self.peers.values()) + self.retired:
                ep.close(force=True)
            self.accepted, self.peers, self.retired = [], OrderedDict(), []
        self.listener.close()
        self.ctx.close()


class XferFetchRequest(FetchRequest):
    """The receiver's gets of one object, in flight: wait_fetch_complete() waits for them;
    dropped unwaited, or ended by an error, they are cancelled, waited for and deregistered."""

    def __init__(self, obj_id: str, tensors: List[Any], node: Optional[_Node] = None,
                 address: Optional[str] = None, ep: Optional[xfer.Endpoint] = None):
        super().__init__(obj_id=obj_id, tensors=tensors)
        self.node = node
        self.address = address
        self.ep = ep
        self.gets: List[xfer.Request] = []
        self.mems: List[xfer.Memory] = []
        self.rkeys: List[xfer.RemoteKey] = []
        self.finished = False

    def finish(self, cancel: bool) -> None:
        """End the gets (cancel those still running when cancel), then release the
        registrations and the endpoint. Idempotent."""
        if self.finished:
            return
        self.finished = True
        settled = True
        for req in self.gets:
            if cancel and not req.done():
                try:
                    req.cancel()
                except xfer.XferError:
                    pass
            try:
                req.wait(_CANCEL_WAIT_S)
            except xfer.XferTimeoutError:
                settled = False
            except xfer.XferError:
                pass
        if settled:
            for mem in self.mems:
                try:
                    mem.deregister()
                except xfer.XferError as e:
                    # the context closed first (process exit): nothing is registered any more
                    logger.debug("xfer_ray: %s: deregister: %s", self.obj_id, e)
        else:
            # a get that neither finished nor cancelled may still write into these tensors:
            # their registrations (which hold them) are kept for the life of the process
            # rather than handed back
            _KEPT.extend(self.mems)
            logger.error("xfer_ray: %s: gets still running %.0f s after cancel; their %d "
                         "destination buffers stay registered", self.obj_id, _CANCEL_WAIT_S,
                         len(self.mems))
        self.gets, self.rkeys = [], []
        if self.node is not None:
            self.node.release(self.address, self.ep)
            self.node, self.ep = None, None

    def __del__(self):
        self.finish(cancel=True)


class XferTensorTransport(TensorTransportManager):
    """Ray's tensor transport "xfer": one-sided (the receiver gets), abortable."""

    def __init__(self):
        # xfer starts on first use: a driver that only coordinates never opens a context
        self._node: Optional[_Node] = None
        self._node_lock = threading.Lock()
        # obj_id -> the registrations of its tensors, until Ray garbage-collects it
        self._sent: Dict[str, List[xfer.Memory]] = {}
        # abort flags not yet taken by a receive, oldest first (bounded)
        self._aborted: "OrderedDict[str, None]" = OrderedDict()
        self._outcomes = {"completed": 0, "aborted": 0, "failed": 0}
        # the actors known to run xfer, most recently asked about last
        self._actors_with_xfer: "OrderedDict[Any, bool]" = OrderedDict()
        self._lock = threading.Lock()

    def node(self) -> _Node:
        with self._node_lock:
            if self._node is None:
                self._node = _Node()
            return self._node

    # ---- what the transport is ------------------------------------------------------------

    def tensor_transport_backend(self) -> str:
        return NAME

    @staticmethod
    def is_one_sided() -> bool:
        return True

    @staticmethod
    def can_abort_transport() -> bool:
        return True

    def actor_has_tensor_transport(self, actor: "ray.actor.ActorHandle") -> bool:
        """Whether xfer runs in that actor. Ray asks before every call of a method that names
        the transport; the actor is asked once (a round trip to it), and a yes is remembered:
        xfer, once started in a process, stays until the process ends."""
        key = actor._actor_id
        with self._lock:
            if key in self._actors_with_xfer:
                self._actors_with_xfer.move_to_end(key)
                return True

        def __xfer_ray_available__(self) -> bool:
            try:
                from ray.experimental.rdt.util import get_tensor_transport_manager
                get_tensor_transport_manager(NAME).node()
                return True
            except Exception:
                logger.warning("xfer_ray: xfer cannot start in this actor", exc_info=True)
                return False

        has = ray.get(actor.__ray_call__.options(concurrency_group="_ray_system").remote(
            __xfer_ray_available__))
        if has:
            with self._lock:
                self._actors_with_xfer[key] = True
                while len(self._actors_with_xfer) > _ACTORS_REMEMBERED:
                    self._actors_with_xfer.popitem(last=False)
        return has

    def get_communicator_metadata(self, src_actor, dst_actor, backend=None):
        return XferCommunicatorMetadata()

    # ---- the sender -----------------------------------------------------------------------

    def extract_tensor_transport_metadata(self, obj_id: str,
                                          rdt_object: List["torch.Tensor"]
                                          ) -> XferTransportMetadata:
        tensor_meta, rkeys, mems = [], [], []
        device = None
        try:
            for t in rdt_object:
                if device is None:
                    device = t.device
                elif t.device.type != device.type:
                    raise ValueError("the tensors of one Ray object must share a device type")
                tensor_meta.append((t.shape, t.dtype))
                if t.numel() == 0:
                    rkeys.append(None)
                    continue
                mem = self.node().ctx.register(_byte_view(t))
                mems.append(mem)
                rkeys.append(mem.pack())
        except BaseException:
            for mem in mems:
                mem.deregister()
            raise
        with self._lock:
            self._sent[obj_id] = mems
        return XferTransportMetadata(
            tensor_meta=tensor_meta, tensor_device=device.type if device else None,
            xfer_address=self.node().address if mems else None, xfer_rkeys=rkeys)

    def send_multiple_tensors(self, tensors, tensor_transport_metadata, communicator_metadata):
        raise NotImplementedError("xfer's Ray transport is one-sided: the receiver gets")

    def garbage_collect(self, obj_id: str, tensor_transport_meta: TensorTransportMetadata,
                        tensors: List["torch.Tensor"]) -> None:
        with self._lock:
            mems = self._sent.pop(obj_id, [])
        # a receiver's get after this fails (the key no longer opens anything), never reads
        # memory handed back
        for mem in mems:
            try:
                mem.deregister()
            except xfer.XferError as e:
                logger.warning("xfer_ray: garbage_collect of %s: %s", obj_id, e)

    def live_objects(self) -> int:
        """Objects whose tensors are registered for receivers (not yet garbage-collected)."""
        with self._lock:
            return len(self._sent)

    # ---- the receiver ---------------------------------------------------------------------

    def _check_abort(self, obj_id: str) -> None:
        with self._lock:
            if obj_id in self._aborted:
                del self._aborted[obj_id]
                raise _Aborted(f"xfer transfer of {obj_id}: aborted by Ray")

    def _count(self, outcome: str) -> None:
        with self._lock:
            self._outcomes[outcome] += 1

    def outcomes(self) -> Dict[str, int]:
        """How this process's receives ended: completed, aborted (by Ray), failed."""
        with self._lock:
            return dict(self._outcomes)

    def fetch_multiple_tensors(self, obj_id: str,
                               tensor_transport_metadata: TensorTransportMetadata,
                               communicator_metadata: CommunicatorMetadata,
                               target_buffers: Optional[List["torch.Tensor"]] = None
                               ) -> XferFetchRequest:
        import torch
        meta = tensor_transport_metadata
        if not isinstance(meta, XferTransportMetadata):
            raise TypeError(f"xfer_ray: metadata of another transport: {type(meta).__name__}")
        if len(meta.xfer_rkeys) != len(meta.tensor_meta):
            raise ValueError(f"xfer_ray: {obj_id}: {len(meta.xfer_rkeys)} keys for "
                             f"{len(meta.tensor_meta)} tensors")
        try:
            self._check_abort(obj_id)       # Ray gave up before this receive began
        except _Aborted:
            self._count("aborted")
            raise
        if target_buffers:
            tensors = list(target_buffers)
        else:
            tensors = [torch.empty(shape, dtype=dtype, device=meta.tensor_device or "cpu")
                       for shape, dtype in meta.tensor_meta]
        if not any(blob is not None for blob in meta.xfer_rkeys):
            return XferFetchRequest(obj_id, tensors)
        node = self.node()
        try:
            ep = node.lease(meta.xfer_address)
        except xfer.XferError as e:
            self._count("failed")
            raise _transport_error(f"xfer transfer of {obj_id}: connect to the sender at "
                                   f"{meta.xfer_address}", e) from None
        fetch = XferFetchRequest(obj_id, tensors, node, meta.xfer_address, ep)
        try:
            for t, blob in zip(tensors, meta.xfer_rkeys):
                if blob is None:
                    continue
                dest = _byte_view(t)
                rkey = ep.unpack_rkey(blob)
                if rkey.length != dest.numel():
                    raise ValueError(f"xfer_ray: {obj_id}: the sender registered "
                                     f"{rkey.length} bytes for a tensor of {dest.numel()}")
                mem = node.ctx.register(dest)
                fetch.mems.append(mem)
                fetch.rkeys.append(rkey)
                chunk = node.chunk
                for off in range(0, dest.numel(), chunk):
                    fetch.gets.append(ep.get(dest[off:off + chunk], rkey, rkey.address + off,
                                             mem=mem))
        except BaseException as e:
            fetch.finish(cancel=True)
            self._count("failed")
            if isinstance(e, xfer.XferError):
                raise _transport_error(f"xfer transfer of {obj_id}", e) from None
            raise
        return fetch

    def wait_fetch_complete(self, fetch_request: FetchRequest, timeout: float = -1
                            ) -> List["torch.Tensor"]:
        if not isinstance(fetch_request, XferFetchRequest) or fetch_request.finished:
            return fetch_request.tensors
        fetch = fetch_request
        deadline = None if timeout < 0 else time.monotonic() + timeout
        try:
            for req in fetch.gets:
                while True:
                    self._check_abort(fetch.obj_id)
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        if req.test():
                            break
                        # the caller may wait again: the gets stay in flight
                        raise TimeoutError(f"xfer transfer of {fetch.obj_id} not done after "
                                           f"{timeout} s")
                    try:
                        req.wait(_POLL_S if left is None else min(_POLL_S, left))
                        break
                    except xfer.XferTimeoutError:
                        continue
        except TimeoutError:
            raise
        except xfer.XferError as e:
            fetch.finish(cancel=True)
            self._count("failed")
            raise _transport_error(f"xfer transfer of {fetch.obj_id} from "
                                   f"{fetch.address} (the sender may have died)", e) from None
        except BaseException as e:
            fetch.finish(cancel=True)
            self._count("aborted" if isinstance(e, _Aborted) else "failed")
            raise
        fetch.finish(cancel=False)
        self._count("completed")
        with self._lock:
            # an abort that came as the gets ended is of no more use
            self._aborted.pop(fetch.obj_id, None)
        return fetch.tensors

    def recv_multiple_tensors(self, obj_id, tensor_transport_metadata, communicator_metadata,
                              target_buffers=None):
        return self.wait_fetch_complete(self.fetch_multiple_tensors(
            obj_id, tensor_transport_metadata, communicator_metadata, target_buffers))

    def abort_transport(self, obj_id: str, communicator_metadata: CommunicatorMetadata):
        with self._lock:
            self._aborted[obj_id] = None
            self._aborted.move_to_end(obj_id)
            while len(self._aborted) > _ABORTS_REMEMBERED:
                self._aborted.popitem(last=False)


def register(devices: Optional[List[str]] = None) -> None:
    """Register the transport with Ray under the name "xfer": in the driver, before the actor
    classes whose methods name it are defined (again is harmless). devices: the torch device
    types it takes, default ["cpu"]; ["cpu", "cuda"] also takes CUDA tensors, which go as xfer
    moves device memory (GPUDirect over verbs, staged over tcp) - a path not yet run on a GPU,
    so it is asked for, not assumed."""
    import torch
    from ray.experimental import register_tensor_transport
    from ray.experimental.rdt import util
    known = util.transport_manager_info.get(NAME)
    if known is not None and known.transport_manager_class is XferTensorTransport:
        return      # registered already, by this module: once is enough
    register_tensor_transport(NAME, devices or ["cpu"], XferTensorTransport,
                              torch.Tensor)
