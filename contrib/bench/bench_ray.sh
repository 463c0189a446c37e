#!/usr/bin/env bash
# xfer's Ray tensor transport against Ray's object store and its gloo transport, through Ray
# (bench_ray.py says what and how), with xfer over shm (its choice on one host) and over tcp.
# Usage: contrib/bench/bench_ray.sh [BUILD_DIR] [--rounds R] [--out DIR]
#   BUILD_DIR  default build (with contrib/ray/setup.sh's Ray in BUILD_DIR/ray-venv)
#   --out DIR  also write ray_<mode>.json there, ray.csv (the ratios) and, with gnuplot,
#              ray.svg (xfer's speed over the object store's and gloo's, with their ranges)
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
if ! command -v gnuplot >/dev/null; then
    echo "# $out/ray.csv; plot skipped: no gnuplot (apt-get install gnuplot-nox)"
    exit 0
fi
# one bar per (size, mode): x 0-1 are 1 MiB shm/tcp, 2-3 256 MiB shm/tcp
for o in object_store gloo; do
    awk -F, -v o=$o 'NR > 1 && $3 == o {x = ($2 == "1 MiB" ? 0 : 2) + ($1 == "tcp"); print x, $4, $5, $6}' \
        "$out/ray.csv" >"$out/$o.dat"
done
gnuplot <<GNUPLOT
set terminal svg size 800,480 dynamic noenhanced font 'sans,12' background rgb 'white'
set output '$out/ray.svg'
set title "Ray actor to actor: xfer's transport's speed over the others' (median, range), $(nproc) cores"
set style fill solid 0.6
set boxwidth 0.35
set yrange [0:*]
set grid ytics lc rgb '#dddddd'
set ylabel 'xfer / other (higher: xfer faster)'
set xtics ("1 MiB, xfer shm" 0, "1 MiB, xfer tcp" 1, "256 MiB, xfer shm" 2, "256 MiB, xfer tcp" 3)
set key top left
plot 1 with lines lc rgb '#888888' dt 2 notitle, \
     '$out/object_store.dat' using (\$1-0.18):2 with boxes lc 1 title 'over the object store', \
     '' using (\$1-0.18):2:3:4 with yerrorbars lc 0 pt 0 notitle, \
     '$out/gloo.dat' using (\$1+0.18):2 with boxes lc 2 title 'over gloo', \
     '' using (\$1+0.18):2:3:4 with yerrorbars lc 0 pt 0 notitle
GNUPLOT
rm -f "$out/object_store.dat" "$out/gloo.dat"
echo "# $out/ray.csv, $out/ray.svg"
