#!/usr/bin/env bash
# xfer's Ray tensor transport against Ray's object store and its gloo transport, through Ray
# (bench_ray.py says what and how), with xfer over shm (its choice on one host) and over tcp.
# Usage: contrib/bench/bench_ray.sh [BUILD_DIR] [--rounds R] [--out DIR]
#   BUILD_DIR  default build (with contrib/ray/setup.sh's Ray in BUILD_DIR/ray-venv)
#   --out DIR  also write ray_<mode>.json there and ray.csv (the ratios)
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=build
if [[ $# -gt 0 && $1 != -* ]]; then build=$1; shift; fi
build=$(cd "$build" && pwd)
rounds=11 out=
while [[ $# -gt 0 ]]; do
    case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "bench_ray: unknown argument $1" >&2; exit 1 ;;
    esac
done
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
[[ -z $out ]] || mkdir -p "$out"
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
echo "wrote $out/ray.csv"
