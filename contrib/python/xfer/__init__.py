"""xfer for Python: move bytes and tensors between processes over the fastest transport two
peers share (verbs, tcp), as the C library does.

    import xfer, numpy as np
    ctx = xfer.Context()
    ep = ctx.connect("host:port")
    ep.tag_send(7, np.arange(4.0)).wait()

Buffers are taken without copies from anything with the buffer protocol or DLPack (numpy
arrays; torch/cupy tensors, CUDA ones where xfer moves device memory). Every operation returns
a Request: ``wait()``, ``test()``, or ``await`` it in asyncio; nothing is left pending - an
exception while completing one completes it with an XferError that carries it. Failures raise
XferError: ``status`` is xfer's status code, ``reason`` its words for why. Batches
(``Endpoint.batch``) move many blocks with one request, a notification after the data, a
deadline and cancel; notifications arrive by handler (``Context.on_notify``), by polling
(``Endpoint.notify_poll``) or as an async iterator (``Endpoint.notifications()``).
"""
from xfer._core import (ALL_TAGS, NO_TIMEOUT, Batch, Context, Endpoint, Listener, Memory,
                        RemoteKey, Request, Tensor, XferError, XferTimeoutError, status_string)

__all__ = ["ALL_TAGS", "NO_TIMEOUT", "Batch", "Context", "Endpoint", "Listener", "Memory",
           "RemoteKey", "Request", "Tensor", "XferError", "XferTimeoutError", "status_string"]
