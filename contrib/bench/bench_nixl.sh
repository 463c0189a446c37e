#!/usr/bin/env bash
# xfer's NIXL backend against NIXL's UCX backend through NIXL's API (bench_nixl.py says what
# and how), in both modes: each backend's choice on one host (shm), and tcp on loopback.
# Usage: contrib/bench/bench_nixl.sh [BUILD_DIR] [--rounds R] [--out DIR]
#   BUILD_DIR  default build (with contrib/nixl/setup.sh's NIXL in BUILD_DIR/nixl-venv)
#   --out DIR  also write nixl_<mode>.json there, nixl.csv (the ratios) and, with gnuplot,
#              nixl.svg (XFER/UCX speed per shape and mode, with the range of the rounds)
set -euo pipefail
# shellcheck source=py_bench.sh
. "$(dirname "$0")/py_bench.sh"
py_bench_args bench_nixl 9 "$@"
# shellcheck source=../nixl/nixl_env.sh
. "$src/contrib/nixl/nixl_env.sh"
py=$build/nixl-venv/bin/python
nixl_env "$build" "$py" || { echo "bench_nixl: $NIXL_ENV_WHY" >&2; exit 1; }
trap 'rm -rf "$NIXL_PLUGIN_DIR"' EXIT
export XFER_NIXL_HOST=127.0.0.1
for mode in shm tcp; do
    # NIXL's Python logger prints a line per agent and backend created: not figures
    "$py" "$src/contrib/bench/bench_nixl.py" --mode "$mode" --rounds "$rounds" \
        ${out:+--json "$out/nixl_$mode.json"} | grep -v "NIXL INFO"
    echo
done

[[ -n $out ]] || exit 0
"$py" - "$out" <<'PY'
import json, statistics, sys
out = sys.argv[1]
with open(f"{out}/nixl.csv", "w") as f:
    f.write("mode,shape,ratio_median,ratio_min,ratio_max\n")
    for mode in ("shm", "tcp"):
        for s in json.load(open(f"{out}/nixl_{mode}.json"))["shapes"]:
            q = s["ratio"]
            f.write(f"{mode},{s['name']},{statistics.median(q):.3f},{min(q):.3f},{max(q):.3f}\n")
PY
awk -F, 'NR > 1 && $1 == "shm" {print NR - 2, $3, $4, $5}' "$out/nixl.csv" >"$out/shm.dat"
awk -F, 'NR > 1 && $1 == "tcp" {print NR - 5, $3, $4, $5}' "$out/nixl.csv" >"$out/tcp.dat"
ratio_bars "$out/nixl.svg" \
    "NIXL WRITE with a notification: XFER backend's speed over UCX's (median, range)" \
    'XFER / UCX (higher: XFER faster)' '("128 x 4 KiB" 0, "128 x 64 KiB" 1, "1 x 64 MiB" 2)' \
    "$out/shm.dat" 'one host (xfer shm, UCX sm)' "$out/tcp.dat" 'tcp loopback'
rm -f "$out/shm.dat" "$out/tcp.dat"
echo "# $out/nixl.csv, $out/nixl.svg"
