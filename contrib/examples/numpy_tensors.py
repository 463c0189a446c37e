#!/usr/bin/env python3
"""Two processes move numpy tensors with xfer: the producer publishes, the consumer fetches
into its own array and sends a tagged reply. Run from the build tree:

    PYTHONPATH=build/contrib/python python3 contrib/examples/numpy_tensors.py
"""
import os

import numpy as np

import xfer

r, w = os.pipe()
if os.fork() == 0:                                  # the producer
    with xfer.Context() as ctx, ctx.listen("127.0.0.1:0") as lst:
        os.write(w, str(lst.port).encode())
        ep = lst.accept(timeout=10)
        ctx.publish(1, "weights", np.arange(12, dtype=np.float32).reshape(3, 4)).wait(10)
        reply = bytearray(64)
        n = ctx.tag_recv(reply, 7, ep=ep).wait(10)
        print("producer got:", bytes(reply[:n]).decode())
        ep.close()
    os._exit(0)

port = int(os.read(r, 16))
with xfer.Context() as ctx:                         # the consumer
    ep = ctx.connect(f"127.0.0.1:{port}")
    out = np.empty((3, 4), dtype=np.float32)
    t = ep.fetch(1, "weights", out=out).wait(10)    # lands in out: no copy
    print(f"consumer fetched {t.dtype}{list(t.shape)} over {ep.transport}:\n{out}")
    ep.tag_send(7, b"thanks").wait(10)
    ep.close()
os.wait()
