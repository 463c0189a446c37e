"""Through Ray: one torch tensor from one actor to another, by xfer's tensor transport
(contrib/ray), by Ray's object store (no tensor transport) and by Ray's gloo transport, in
the same run. A transfer is what a Ray user waits for: the receiving task called with the
sending task's result (`ray.get(receiver.take.remote(sender.make.remote()))`), the sender
returning the same preallocated tensor each time. Each round runs the three in an order
that turns by one every round, `iters` transfers each after one unmeasured; the figure is
the mean time per transfer, as bytes per second. Reports, per size, each transport's median
speed with its range and xfer's speed over each other's (the median of the per-round
ratios, with their range). Run by bench_ray.sh, which sets up the environment.

    bench_ray.py [--mode shm|tcp] [--rounds 11] [--json FILE]
"""
import argparse
import json
import os
import statistics
import sys
import time

import ray
import torch
from ray.experimental.collective import create_collective_group

import xfer_ray

xfer_ray.register(["cpu"])

MiB = 1 << 20
SIZES = [(MiB, 40, "1 MiB"), (256 * MiB, 4, "256 MiB")]
TRANSPORTS = ["xfer", "object_store", "gloo"]


@ray.remote(enable_tensor_transport=True)
class Sender:
    def __init__(self):
        self.bufs = {n: torch.ones(n, dtype=torch.uint8) for n, _, _ in SIZES}

    @ray.method(tensor_transport="xfer")
    def by_xfer(self, n):
        return self.bufs[n]

    @ray.method(tensor_transport="gloo")
    def by_gloo(self, n):
        return self.bufs[n]

    def by_object_store(self, n):
        return self.bufs[n]


@ray.remote(enable_tensor_transport=True)
class Receiver:
    def take(self, t):
        # the last byte: the tensor is here, whole
        return int(t[-1]) + t.numel()


def one_transfer(s, r, transport, n):
    make = {"xfer": s.by_xfer, "object_store": s.by_object_store, "gloo": s.by_gloo}[transport]
    got = ray.get(r.take.remote(make.remote(n)))
    if got != n + 1:
        raise RuntimeError(f"{transport}: the receiver saw {got - n} as the last byte")


def timed(s, r, transport, n, iters):
    one_transfer(s, r, transport, n)
    start = time.perf_counter()
    for _ in range(iters):
        one_transfer(s, r, transport, n)
    return n * iters / (time.perf_counter() - start)


def summary(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["shm", "tcp"], default="shm",
                    help="xfer's transport between the two actors (shm: xfer's choice on "
                         "one host; tcp: XFER_TRANSPORTS=tcp)")
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.rounds < 9:
        sys.exit("bench_ray: at least 9 rounds")
    env = {"XFER_TRANSPORTS": "tcp"} if args.mode == "tcp" else {}
    opts = {"runtime_env": {"env_vars": env}} if env else {}
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False,
             _temp_dir=os.environ.get("BENCH_RAY_TMP"))
    s = Sender.options(**opts).remote()
    r = Receiver.options(**opts).remote()
    create_collective_group([s, r], backend="torch_gloo")
    print(f"# Ray {ray.__version__}, torch {torch.__version__}, xfer over {args.mode}, "
          f"{os.cpu_count()} cores, {args.rounds} rounds")
    report = {"mode": args.mode, "rounds": args.rounds, "sizes": []}
    for n, iters, name in SIZES:
        speed = {t: [] for t in TRANSPORTS}
        for rnd in range(args.rounds):
            order = TRANSPORTS[rnd % 3:] + TRANSPORTS[:rnd % 3]
            for t in order:
                speed[t].append(timed(s, r, t, n, iters))
        ratio = {o: [x / y for x, y in zip(speed["xfer"], speed[o])]
                 for o in ("object_store", "gloo")}
        entry = {"name": name, "bytes": n, "iters": iters,
                 "speed": {t: summary(v) for t, v in speed.items()},
                 "ratio": {o: summary(v) for o, v in ratio.items()},
                 "raw": {"speed": speed, "ratio": ratio}}
        report["sizes"].append(entry)
        for t in TRANSPORTS:
            q = entry["speed"][t]
            print(f"{name:>8} {t:>13}: {q['median'] / 1e9:6.3f} GB/s "
                  f"({q['min'] / 1e9:.3f}-{q['max'] / 1e9:.3f})")
        for o in ("object_store", "gloo"):
            q = entry["ratio"][o]
            verdict = "faster" if q["median"] > 1 else "NOT faster"
            print(f"{name:>8} xfer/{o:<12}: {q['median']:.2f}x ({q['min']:.2f}-{q['max']:.2f})"
                  f"  {verdict}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    ray.shutdown()


if __name__ == "__main__":
    main()
