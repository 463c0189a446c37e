#!/usr/bin/env python3
"""xfer's NIXL backend against NIXL's UCX backend, through NIXL's own API, in the same run.

    NIXL_PLUGIN_DIR=<dir with libplugin_XFER.so and NIXL's libplugin_UCX.so> \\
        build/nixl-venv/bin/python contrib/bench/bench_nixl.py [--mode shm|tcp] [--rounds R]

(contrib/bench/bench_nixl.sh sets up NIXL_PLUGIN_DIR and the libraries, as test/nixl.sh does.)

Two processes on this host, each a NIXL agent with both backends. The initiator WRITEs, with a
notification, 128 x 4 KiB, 128 x 64 KiB and 1 x 64 MiB descriptors into the target's registered
buffer, through a prepared transfer posted again and again, each post waited for (DONE) before
the next; the target drains its notifications meanwhile. Each round runs both backends on
each shape, their order alternating round by round; a figure is the median over the rounds
(at least 9: one run on a 2-core VM is bimodal and proves nothing), with its range, and the
ratio XFER/UCX is taken within each round.

--mode shm (default): each backend as it chooses on one host (xfer: shm; UCX: its shared
memory transports). --mode tcp: XFER_TRANSPORTS=tcp against UCX_TLS=tcp over loopback.
NIXL 1.5.1's UCX runs without its InfiniBand module (UCX_MODULES=^ib; test/nixl.sh says why).
"""
import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time

import numpy as np

MIB = 1 << 20
BUF = 64 * MIB
SHAPES = [("128 x 4 KiB", 128, 4096, 400), ("128 x 64 KiB", 128, 65536, 100),
          ("1 x 64 MiB", 1, 64 * MIB, 12)]     # name, descriptors, size, posts per round
BACKENDS = ("UCX", "XFER")
WARMUP = 5


def make_agent(name):
    from nixl._api import nixl_agent, nixl_agent_config

    return nixl_agent(name, nixl_agent_config(backends=list(BACKENDS)))


def target_main(conn):
    ag = make_agent("target")
    buf = np.zeros(BUF, dtype=np.uint8)
    reg = ag.register_memory([(buf.ctypes.data, BUF, 0, "")], "DRAM")
    conn.send((ag.get_agent_metadata(), buf.ctypes.data))
    ag.add_remote_agent(conn.recv())
    count = 0
    while not conn.poll():
        for msgs in ag.get_new_notifs().values():
            count += len(msgs)
        time.sleep(0.0002)
    expected = conn.recv()      # the posts made: drain what is still on its way, 5 s at most
    end = time.time() + 5
    while count < expected and time.time() < end:
        for msgs in ag.get_new_notifs().values():
            count += len(msgs)
    ag.deregister_memory(reg)
    conn.send(count)


POSTS = [0]     # every post made, each with a notification


def run(ag, h, posts):
    """Post h posts times, each waited for; seconds per post."""
    POSTS[0] += posts
    t0 = time.perf_counter()
    for _ in range(posts):
        state = ag.transfer(h, b"n")
        while state == "PROC":
            state = ag.check_xfer_state(h)
        if state != "DONE":
            sys.exit(f"bench_nixl: a transfer ended {state}")
    return (time.perf_counter() - t0) / posts


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", choices=("shm", "tcp"), default="shm")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--json", help="write the figures here too")
    a = ap.parse_args()
    if a.rounds < 9 and not os.environ.get("BENCH_FEW_ROUNDS"):
        sys.exit("bench_nixl: at least 9 rounds (BENCH_FEW_ROUNDS=1 allows fewer for a try-out)")
    os.environ.setdefault("UCX_MODULES", "^ib")
    if a.mode == "tcp":
        os.environ["XFER_TRANSPORTS"] = "tcp"
        os.environ["UCX_TLS"] = "tcp,self"
        os.environ.setdefault("UCX_NET_DEVICES", "lo")
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    target = ctx.Process(target=target_main, args=(child,))
    target.start()
    ag = make_agent("initiator")
    src = np.full(BUF, 7, dtype=np.uint8)
    reg = ag.register_memory([(src.ctypes.data, BUF, 0, "")], "DRAM")
    md, raddr = conn.recv()
    conn.send(ag.get_agent_metadata())
    ag.add_remote_agent(md)

    handles = {}
    for name, n, size, _ in SHAPES:
        local = ag.get_xfer_descs([(src.ctypes.data + i * size, size, 0) for i in range(n)],
                                  "DRAM")
        remote = ag.get_xfer_descs([(raddr + i * size, size, 0) for i in range(n)], "DRAM")
        for b in BACKENDS:
            h = ag.initialize_xfer("WRITE", local, remote, "target", b"n", [b])
            assert ag.query_xfer_backend(h) == b
            run(ag, h, WARMUP)
            handles[name, b] = h

    per = {(name, b): [] for name, *_ in SHAPES for b in BACKENDS}
    ratio = {name: [] for name, *_ in SHAPES}
    for r in range(a.rounds):
        for name, n, size, posts in SHAPES:
            order = BACKENDS if r % 2 == 0 else BACKENDS[::-1]
            got = {b: run(ag, handles[name, b], posts) for b in order}
            for b in BACKENDS:
                per[name, b].append(got[b])
            ratio[name].append(got["UCX"] / got["XFER"])     # > 1: XFER is faster

    for h in handles.values():
        ag.release_xfer_handle(h)
    conn.send(POSTS[0])
    notified = conn.recv()
    target.join(30)
    ag.deregister_memory(reg)

    print(f"NIXL {a.mode}: WRITE with a notification, each post waited for; "
          f"{a.rounds} rounds, medians (range); notifications at the target: {notified} "
          f"of {POSTS[0]}")
    print("| descriptors | UCX us | XFER us | XFER GB/s | XFER/UCX speed |")
    print("| --- | --- | --- | --- | --- |")
    out = {"mode": a.mode, "rounds": a.rounds, "shapes": []}
    for name, n, size, _ in SHAPES:
        u, x, q = per[name, "UCX"], per[name, "XFER"], ratio[name]
        gbs = n * size / statistics.median(x) / 1e9
        print(f"| {name} | {statistics.median(u) * 1e6:.1f} ({min(u) * 1e6:.1f}-{max(u) * 1e6:.1f}) "
              f"| {statistics.median(x) * 1e6:.1f} ({min(x) * 1e6:.1f}-{max(x) * 1e6:.1f}) "
              f"| {gbs:.2f} | {statistics.median(q):.2f} ({min(q):.2f}-{max(q):.2f}) |")
        out["shapes"].append({"name": name, "ucx_s": u, "xfer_s": x, "ratio": q})
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
