"""xfer as a Ray tensor transport: Ray's Direct Transport moves torch tensors between actors
over xfer, one-sided - the receiving actor reads the sender's registered tensors with xfer
gets; the sender's actor does no work for the transfer (its xfer progress thread serves it).

    import ray, xfer_ray
    xfer_ray.register()                      # in the driver, before the actors are created

    @ray.remote(enable_tensor_transport=True)
    class Producer:
        @ray.method(tensor_transport="xfer")
        def make(self):
            return torch.ones(1 << 20)

Ray carries the metadata (shapes, dtypes, the sender's xfer address and one remote key per
tensor) in its own object metadata; xfer adds no side channel. Same-host actors meet over shm,
others over the fastest transport they share (XFER_TRANSPORTS and the rest of xfer's
environment apply in every actor).
"""
from xfer_ray.transport import (XferCommunicatorMetadata, XferFetchRequest,
                                XferTensorTransport, XferTransportMetadata, register)

__all__ = ["XferCommunicatorMetadata", "XferFetchRequest", "XferTensorTransport",
           "XferTransportMetadata", "register"]
