#!/usr/bin/env python3
"""What the Python layer adds to xfer: an 8-byte tagged ping-pong written in Python against
the same ping-pong in C (xfer_perf -t tag_lat -s 8), over the same transport (XFER_TRANSPORTS,
default tcp on loopback), in turns, so that both see the same machine.

    PYTHONPATH=<the built package> python3 contrib/bench/bench_python.py \
        --xfer-perf build/contrib/xfer_perf [--iters N] [--rounds R]

For each wait mode - poll (spin on test(), xfer_perf -E poll, a serialized context as
xfer_perf's default) and sleep (wait(), -E sleep) - it prints the medians over the rounds of
the half round trip in C and in Python, and the median and range of their difference per
round trip within each round (the pair alternating its order): the cost of the binding's calls
(a receive, a send, and the waits) over the C calls they make. A tool, not a test.
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import time

import xfer


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spin(req):
    while not req.test():
        pass


def pong(port, iters, mode):
    """The echoing side: receive tag 1, answer tag 2, iters times."""
    with xfer.Context(serialized=(mode == "poll")) as ctx:
        with ctx.listen(f"127.0.0.1:{port}") as lst:
            print("ready", flush=True)
            ep = lst.accept(timeout=30)
        buf = bytearray(8)
        for _ in range(iters):
            r = ctx.tag_recv(buf, 1, ep=ep)
            spin(r) if mode == "poll" else r.wait()
            s = ep.tag_send(2, buf)
            spin(s) if mode == "poll" else s.wait()
        ep.close()


def ping(port, iters, warmup, mode):
    """The measuring side: half the mean round trip over iters, in microseconds."""
    with xfer.Context(serialized=(mode == "poll")) as ctx:
        ep = ctx.connect(f"127.0.0.1:{port}")
        sbuf, rbuf = bytearray(8), bytearray(8)
        t0 = 0.0
        for i in range(warmup + iters):
            if i == warmup:
                t0 = time.perf_counter()
            r = ctx.tag_recv(rbuf, 2, ep=ep)
            s = ep.tag_send(1, sbuf)
            if mode == "poll":
                spin(s)
                spin(r)
            else:
                s.wait()
                r.wait()
        elapsed = time.perf_counter() - t0
        ep.close()
    return elapsed / iters / 2 * 1e6


def python_round(iters, warmup, mode):
    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "--pong", str(port),
                               "--iters", str(iters + warmup), "--mode", mode],
                              stdout=subprocess.PIPE, text=True)
    try:
        if server.stdout.readline().strip() != "ready":
            raise SystemExit("the Python ponger did not start")
        return ping(port, iters, warmup, mode)
    finally:
        server.wait(60)


def c_round(xfer_perf, iters, warmup, mode):
    port = str(free_port())
    args = ["-t", "tag_lat", "-s", "8", "-n", str(iters), "--warmup", str(warmup), "-p", port,
            "-E", mode]
    server = subprocess.Popen([xfer_perf, *args], stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            out = subprocess.run([xfer_perf, *args, "127.0.0.1"], capture_output=True,
                                 text=True)
            if out.returncode == 0:
                break
            time.sleep(0.05)
        else:
            raise SystemExit(f"xfer_perf failed: {out.stderr}")
    finally:
        server.wait(60)
    # the result row: bytes, iterations, BW, rate, t_typical, t_avg, t_99% (half round trips):
    # t_avg, as the Python side measures a mean
    for line in out.stdout.splitlines():
        cols = line.split()
        if len(cols) >= 6 and cols[0] == "8" and not line.startswith("#"):
            return float(cols[5])
    raise SystemExit(f"cannot read xfer_perf's result:\n{out.stdout}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--xfer-perf", help="xfer_perf binary (the C side of the comparison)")
    ap.add_argument("--iters", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--modes", default="poll,sleep")
    ap.add_argument("--pong", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="poll", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.pong:
        pong(a.pong, a.iters, a.mode)
        return
    os.environ.setdefault("XFER_TRANSPORTS", "tcp")
    warmup = max(100, a.iters // 10)
    print(f"# 8-byte tag ping-pong over {os.environ['XFER_TRANSPORTS']}, {a.iters} iterations,"
          f" medians of {a.rounds} rounds taken in turns")
    print(f"{'mode':<6} {'C half-RTT us':>14} {'Python half-RTT us':>19} "
          f"{'Python - C per round trip us (range)':>37}")
    for mode in a.modes.split(","):
        cs, ps, ds = [], [], []
        for r in range(a.rounds):
            # the pair alternates its order from round to round, as lib.sh's rounds do
            runs = [("c", lambda: c_round(a.xfer_perf, a.iters, warmup, mode)),
                    ("p", lambda: python_round(a.iters, warmup, mode))]
            got = {}
            for name, run in (runs if r % 2 == 0 else runs[::-1]):
                if name == "c" and not a.xfer_perf:
                    continue
                got[name] = run()
            ps.append(got["p"])
            if "c" in got:
                cs.append(got["c"])
                ds.append(2 * (got["p"] - got["c"]))
        c = statistics.median(cs) if cs else float("nan")
        p = statistics.median(ps)
        d = f"{statistics.median(ds):.2f} ({min(ds):.2f} to {max(ds):.2f})" if ds else "-"
        print(f"{mode:<6} {c:>14.2f} {p:>19.2f} {d:>37}")


if __name__ == "__main__":
    main()
