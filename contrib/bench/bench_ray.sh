#!/usr/bin/env bash
# xfer's Ray tensor transport against Ray's object store and its gloo transport, through Ray
# (bench_ray.py says what and how), with xfer over shm (its choice on one host) and over tcp.
# Usage: contrib/bench/bench_ray.sh [BUILD_DIR] [--rounds R] [--out DIR]
#   BUILD_DIR  default build (with contrib/ray/setup.sh's Ray in BUILD_DIR/ray-venv)
#   --out DIR  also write ray_<mode>.json there, ray.csv (the ratios) and, with gnuplot,
#              ray.svg (xfer's speed over the object store's and gloo's, with their ranges)
set -euo pipefail
# shellcheck source=py_bench.sh
. "$(dirname "$0")/py_bench.sh"
py_bench_args bench_ray 11 "$@"
py=$build/ray-venv/bin/python
"$py" -c 'import ray' 2>/dev/null || { echo "bench_ray: no Ray in $build/ray-venv (contrib/ray/setup.sh)" >&2; exit 1; }
# the environment every Ray worker inherits, as test/ray.sh sets it
export PYTHONPATH=$src/contrib/ray:$src/contrib/bench:$build/contrib/python${PYTHONPATH:+:$PYTHONPATH}
export LD_LIBRARY_PATH=$build/framework/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export XFER_COMPONENT_PATH=$build/components/tcp/.libs:$build/components/shm/.libs
export XFER_RAY_HOST=127.0.0.1 RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
BENCH_RAY_TMP=$(mktemp -d)
export BENCH_RAY_TMP
trap 'rm -rf "$BENCH_RAY_TMP"' EXIT
for mode in shm tcp; do
    "$py" "$src/contrib/bench/bench_ray.py" --mode "$mode" --rounds "$rounds" \
        ${out:+--json "$out/ray_$mode.json"}
    echo
done
[[ -n $out ]] || exit 0
"$py" - "$out" <<'PY'
import json, sys
out = sys.argv[1]
with open(f"{out}/ray.csv", "w") as f:
    f.write("mode,size,against,ratio_median,ratio_min,ratio_max,xfer_GBps,other_GBps\n")
    for mode in ("shm", "tcp"):
        for s in json.load(open(f"{out}/ray_{mode}.json"))["sizes"]:
            for o in ("object_store", "gloo"):
                q = s["ratio"][o]
                f.write(f"{mode},{s['name']},{o},{q['median']:.3f},{q['min']:.3f},"
                        f"{q['max']:.3f},{s['speed']['xfer']['median'] / 1e9:.3f},"
                        f"{s['speed'][o]['median'] / 1e9:.3f}\n")
PY
# one bar per (size, mode): x 0-1 are 1 MiB shm/tcp, 2-3 256 MiB shm/tcp
for o in object_store gloo; do
    awk -F, -v o=$o 'NR > 1 && $3 == o {x = ($2 == "1 MiB" ? 0 : 2) + ($1 == "tcp"); print x, $4, $5, $6}' \
        "$out/ray.csv" >"$out/$o.dat"
done
ratio_bars "$out/ray.svg" \
    "Ray actor to actor: xfer's transport's speed over the others' (median, range)" \
    'xfer / other (higher: xfer faster)' \
    '("1 MiB, xfer shm" 0, "1 MiB, xfer tcp" 1, "256 MiB, xfer shm" 2, "256 MiB, xfer tcp" 3)' \
    "$out/object_store.dat" 'over the object store' "$out/gloo.dat" 'over gloo'
rm -f "$out/object_store.dat" "$out/gloo.dat"
echo "# $out/ray.csv, $out/ray.svg"
