#!/usr/bin/env bash
# xfer's NIXL backend against NIXL's UCX backend through NIXL's API (bench_nixl.py says what
# and how), in both modes: each backend's choice on one host (shm), and tcp on loopback.
# Usage: contrib/bench/bench_nixl.sh [BUILD_DIR] [--rounds R] [--out DIR]
#   BUILD_DIR  default build (with contrib/nixl/setup.sh's NIXL in BUILD_DIR/nixl-venv)
#   --out DIR  also write nixl_<mode>.json there, nixl.csv (the ratios) and, with gnuplot,
#              nixl.svg (XFER/UCX speed per shape and mode, with the range of the rounds)
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=build
if [[ $# -gt 0 && $1 != -* ]]; then build=$1; shift; fi
build=$(cd "$build" && pwd)
rounds=9 out=
while [[ $# -gt 0 ]]; do
    case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "bench_nixl: unknown argument $1" >&2; exit 1 ;;
    esac
done
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
if ! command -v gnuplot >/dev/null; then
    echo "# plot skipped: no gnuplot (apt-get install gnuplot-nox)"
    exit 0
fi
awk -F, 'NR > 1 && $1 == "shm" {print NR - 2, $3, $4, $5, $2}' "$out/nixl.csv" >"$out/shm.dat"
awk -F, 'NR > 1 && $1 == "tcp" {print NR - 5, $3, $4, $5, $2}' "$out/nixl.csv" >"$out/tcp.dat"
gnuplot <<GNUPLOT
set terminal svg size 800,480 dynamic noenhanced font 'sans,12' background rgb 'white'
set output '$out/nixl.svg'
set title "NIXL WRITE with a notification: XFER backend's speed over UCX's (median, range), $(nproc) cores"
set style fill solid 0.6
set boxwidth 0.35
set yrange [0:*]
set grid ytics lc rgb '#dddddd'
set ylabel 'XFER / UCX (higher: XFER faster)'
set xtics ("128 x 4 KiB" 0, "128 x 64 KiB" 1, "1 x 64 MiB" 2)
set key top right
plot 1 with lines lc rgb '#888888' dt 2 notitle, \
     '$out/shm.dat' using (\$1-0.18):2 with boxes lc 1 title 'one host (xfer shm, UCX sm)', \
     '' using (\$1-0.18):2:3:4 with yerrorbars lc 0 pt 0 notitle, \
     '$out/tcp.dat' using (\$1+0.18):2 with boxes lc 2 title 'tcp loopback', \
     '' using (\$1+0.18):2:3:4 with yerrorbars lc 0 pt 0 notitle
GNUPLOT
rm -f "$out/shm.dat" "$out/tcp.dat"
echo "# $out/nixl.csv, $out/nixl.svg"
