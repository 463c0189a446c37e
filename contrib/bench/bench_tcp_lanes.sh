#!/usr/bin/env bash
# bench_tcp_lanes.sh [BUILD_DIR]: what lanes (XFER_TCP_LANES) give on this host, to choose the
# default and XFER_TCP_LANE_MIN_SIZE by measurement. xfer_perf -x tcp -t TEST (tag_bw) on
# loopback for each size in SIZES ("256k 512k 1m 4m") and lane count in LANES ("1 2 4"), with
# shares from 64 KiB on, waiting as WAIT says (poll, or sleep: xfer_perf -E). Each combination
# runs ROUNDS (9, at least 9: lib.sh) times, the combinations taking turns so that a shared
# machine's drift hits them alike; the table gives the median MB/s (10^6 bytes), every run, and the ratio to one
# lane. A tool, not a test: it exits 0 whatever the figures, 1 when a run gave no figure.
# PERF_BIN overrides xfer_perf's path; BENCH_PORT (21000) is where the ports start.
set -euo pipefail

BENCH_NAME=bench_tcp_lanes
# shellcheck source=contrib/bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
BUILD=${1:-${XFER_BUILD_DIR:-./build}}
PERF=${PERF_BIN:-$BUILD/contrib/xfer_perf}
REPS=$ROUNDS
SIZES=${SIZES:-"256k 512k 1m 4m"}
LANES=${LANES:-"1 2 4"}
WAIT=${WAIT:-poll}
TEST=${TEST:-tag_bw}
ITERS=${ITERS:-2000}
port=${BENCH_PORT:-21000}

[ -x "$PERF" ] || { echo "bench_tcp_lanes: no xfer_perf at $PERF" >&2; exit 1; }
runs=$LOGDIR/runs     # lib.sh removes LOGDIR at exit
missing=0

one() {   # size lanes -> MB/s on stdout, or nothing
    local size=$1 lanes=$2 out
    port=$((port + 1))
    XFER_TCP_LANES=$lanes XFER_TCP_LANE_MIN_SIZE=64k "$PERF" -x tcp -E "$WAIT" -p "$port" \
        >/dev/null 2>&1 &
    local server=$!
    sleep 0.3
    out=$(XFER_TCP_LANES=$lanes XFER_TCP_LANE_MIN_SIZE=64k timeout 120 "$PERF" -x tcp \
          -t "$TEST" -s "$size" -n "$ITERS" -E "$WAIT" -p "$port" 127.0.0.1 2>/dev/null |
          tail -1 | awk '{print $3}') || true
    wait "$server" 2>/dev/null || true
    echo "$out"
}

for rep in $(seq "$REPS"); do
    for size in $SIZES; do
        for lanes in $LANES; do
            v=$(one "$size" "$lanes")
            [ -n "$v" ] || { missing=1; v=-; }
            echo "$size $lanes $v" >> "$runs"
        done
    done
done

median() { grep -v -- '-$' | sort -n | awk '{a[NR] = $1} END {if (NR) print a[int((NR + 1) / 2)]}'; }
printf '%s -E %s, %s runs each (MB/s)\n' "$TEST" "$WAIT" "$REPS"
printf '%-6s %-5s %9s %7s  %s\n' size lanes median "x 1" runs
for size in $SIZES; do
    base=$(awk -v s="$size" '$1 == s && $2 == 1 {print $3}' "$runs" | median)
    for lanes in $LANES; do
        all=$(awk -v s="$size" -v l="$lanes" '$1 == s && $2 == l {print $3}' "$runs")
        med=$(median <<<"$all")
        ratio=$(awk -v m="${med:-0}" -v b="${base:-0}" 'BEGIN {print (b > 0) ? sprintf("%.2f", m / b) : "-"}')
        printf '%-6s %-5s %9s %7s  %s\n' "$size" "$lanes" "${med:--}" "$ratio" "$(tr '\n' ' ' <<<"$all")"
    done
done
exit $missing
