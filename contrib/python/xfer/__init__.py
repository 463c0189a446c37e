"""xfer for Python: move bytes and tensors between processes over the fastest transport two
peers share (verbs, tcp), as the C library does.

    import xfer, numpy as np
    ctx = xfer.Context()
    ep = ctx.connect("host:port")
    ep.tag_send(7, np.arange(4.0)).wait()

Buffers are taken without copies from anything with the buffer protocol or DLPack (numpy
arrays; torch/cupy tensors, CUDA ones where xfer moves device memory). Every operation returns
a Request: ``wait()``, ``test()``, or ``await`` it in asyncio. Failures raise XferError, whose
``status`` is xfer's status code.
"""
from xfer._core import (ALL_TAGS, Context, Endpoint, Listener, Memory, RemoteKey, Request,
                        Tensor, XferError, XferTimeoutError, status_string)

__all__ = ["ALL_TAGS", "Context", "Endpoint", "Listener", "Memory", "RemoteKey", "Request",
           "Tensor", "XferError", "XferTimeoutError", "status_string"]
