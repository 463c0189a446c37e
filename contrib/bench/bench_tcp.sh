#!/usr/bin/env bash
# bench_tcp.sh [BUILD_DIR]: xfer's tcp transport against iperf3 and ucx_perftest (UCX_TLS=tcp,
# its defaults otherwise), all on loopback, in one run. Prints the figures, then each aim with
# the figures it compares, their ratio and whether it is met:
#   tag_bw 1 MiB      xfer >= 1.2 x ucx_perftest tag_bw, and >= 1.5 x iperf3 (one stream)
#   tag_lat 8 B       xfer <= 0.95 x ucx_perftest tag_lat (medians of half a round trip)
#   put_lat 8 B       <= 1.1 x xfer's own tag_lat 8 B (medians)
#   tensor_bw 1 MiB   >= 0.95 x xfer's put_bw 1 MiB
#   tensor_bw 64 MiB  >= 0.95 x xfer's tag_bw 64 MiB
# Runs that are compared with each other run one after the other, so that they share the
# machine's state. A tool, not a test: it exits 0 whatever the figures, non-zero only when
# something fails to run. bench_tcp_sweep.sh puts the tests beside UCX's from 8 B to 64 MiB.
#
# BUILD_DIR (or $XFER_BUILD_DIR) is a configured and built tree; default ./build.
# Knobs: BENCH_PORT (first of 10 ports, default 18600), BW_ITERS (1 MiB runs, 2000),
# BIG_ITERS (64 MiB runs, 50), LAT_ITERS (20000), IPERF_SECS (5), RUN_TIMEOUT (the most seconds
# one client may run, 300). Needs iperf3, ucx-utils (ucx_perftest), jq and ss (iproute2).
set -euo pipefail

BUILD=${1:-${XFER_BUILD_DIR:-./build}}
PERF=$BUILD/contrib/xfer_perf
PORT=${BENCH_PORT:-18600}
BW_ITERS=${BW_ITERS:-2000}
BIG_ITERS=${BIG_ITERS:-50}
LAT_ITERS=${LAT_ITERS:-20000}
IPERF_SECS=${IPERF_SECS:-5}
BW_SIZE=1048576
BIG_SIZE=67108864
LAT_SIZE=8

BENCH_NAME=bench_tcp
# shellcheck source=contrib/bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[ -x "$PERF" ] || die "no $PERF: build first (make -C $BUILD), or pass the build directory"
for tool in iperf3 ucx_perftest jq ss; do
    command -v "$tool" >/dev/null || die "$tool not found (apt-get install iperf3 ucx-utils jq iproute2)"
done

echo "# bench_tcp: loopback, $(nproc) cores, build $BUILD; MB = 10^6 bytes" >&2

# xfer_fig NAME TEST SIZE ITERS FIELD: one xfer_perf run; NAME=results[0].FIELD
xfer_fig() {
    local name=$1 test=$2 size=$3 iters=$4 field=$5
    echo "# xfer_perf -x tcp -t $test -s $size -n $iters ..." >&2
    xfer_tcp "$test" "$size" "$iters" || die "xfer_perf $test $size failed"
    [ "$(jq -r '.transport' <<<"$PAIR_OUT")" = tcp ] || die "xfer_perf did not run over tcp"
    printf -v "$name" '%s' "$(jq ".results[0].$field" <<<"$PAIR_OUT")"
}

# ucx_fig TEST SIZE ITERS [ARG...]: one ucx_perftest run; its CSV line in UCX_LINE
ucx_fig() {
    echo "# ucx_perftest -t $1 -s $2 -n $3 (UCX_TLS=tcp) ..." >&2
    ucx_tcp "$@" || die "ucx_perftest $1 $2 failed"
    UCX_LINE=$PAIR_OUT
}

# ---- bandwidth, 1 MiB --------------------------------------------------------------------------
xfer_fig XFER_BW tag_bw $BW_SIZE "$BW_ITERS" bw_average_mbps

echo "# iperf3 -c 127.0.0.1 -t $IPERF_SECS ..." >&2
run_pair iperf3 "$RUN_TIMEOUT" iperf3 -s -1 --forceflush -p "$PORT" -- \
    iperf3 -c 127.0.0.1 -p "$PORT" -t "$IPERF_SECS" -J || die "iperf3 failed"
IPERF_BW=$(jq '.end.sum_received.bits_per_second / 8 / 1e6' <<<"$PAIR_OUT")

ucx_fig tag_bw $BW_SIZE "$BW_ITERS" -w 200
UCX_BW=$(awk -F, -v mb=$UCX_MB '{print $6 * mb}' <<<"$UCX_LINE")

xfer_fig XFER_PUT_BW put_bw $BW_SIZE "$BW_ITERS" bw_average_mbps
xfer_fig XFER_TENSOR_BW tensor_bw $BW_SIZE "$BW_ITERS" bw_average_mbps

# ---- bandwidth, 64 MiB -------------------------------------------------------------------------
xfer_fig XFER_BIG_BW tag_bw $BIG_SIZE "$BIG_ITERS" bw_average_mbps
xfer_fig XFER_BIG_TENSOR_BW tensor_bw $BIG_SIZE "$BIG_ITERS" bw_average_mbps

# ---- latency, 8 bytes --------------------------------------------------------------------------
xfer_fig XFER_LAT50 tag_lat $LAT_SIZE "$LAT_ITERS" t_typical_usec
XFER_LATAVG=$(jq '.results[0].t_avg_usec' <<<"$PAIR_OUT")
xfer_fig XFER_PUT_LAT50 put_lat $LAT_SIZE "$LAT_ITERS" t_typical_usec
XFER_PUT_LATAVG=$(jq '.results[0].t_avg_usec' <<<"$PAIR_OUT")

ucx_fig tag_lat $LAT_SIZE "$LAT_ITERS"
UCX_LAT50=$(cut -d, -f2 <<<"$UCX_LINE")
UCX_LATAVG=$(cut -d, -f3 <<<"$UCX_LINE")

for v in XFER_BW IPERF_BW UCX_BW XFER_PUT_BW XFER_TENSOR_BW XFER_BIG_BW XFER_BIG_TENSOR_BW \
         XFER_LAT50 XFER_LATAVG XFER_PUT_LAT50 XFER_PUT_LATAVG UCX_LAT50 UCX_LATAVG; do
    [[ ${!v} =~ ^[0-9.e+-]+$ ]] || die "could not read $v (got '${!v}')"
done

# ---- the figures and the aims ------------------------------------------------------------------
awk -v xbw="$XFER_BW" -v ibw="$IPERF_BW" -v ubw="$UCX_BW" -v xput="$XFER_PUT_BW" \
    -v xten="$XFER_TENSOR_BW" -v xbig="$XFER_BIG_BW" -v xbigten="$XFER_BIG_TENSOR_BW" \
    -v xl50="$XFER_LAT50" -v xlavg="$XFER_LATAVG" -v xp50="$XFER_PUT_LAT50" \
    -v xpavg="$XFER_PUT_LATAVG" -v ul50="$UCX_LAT50" -v ulavg="$UCX_LATAVG" \
    -v bwn="$BW_ITERS" -v bign="$BIG_ITERS" -v latn="$LAT_ITERS" -v isecs="$IPERF_SECS" \
    -v aim_w=40 "$AWK_AIMS"'
function fig(run, value, unit, note) { printf "%-36s %12.2f %-5s %s\n", run, value, unit, note }
BEGIN {
    printf "# xfer over tcp vs iperf3 and ucx_perftest (UCX_TLS=tcp), loopback; MB = 10^6 bytes\n"
    printf "%-36s %12s %-5s %s\n", "run", "figure", "unit", "iterations"
    fig("xfer_perf tag_bw 1 MiB", xbw, "MB/s", bwn)
    fig("iperf3 one stream", ibw, "MB/s", isecs " s")
    fig("ucx_perftest tag_bw 1 MiB", ubw, "MB/s", bwn)
    fig("xfer_perf put_bw 1 MiB", xput, "MB/s", bwn)
    fig("xfer_perf tensor_bw 1 MiB", xten, "MB/s", bwn)
    fig("xfer_perf tag_bw 64 MiB", xbig, "MB/s", bign)
    fig("xfer_perf tensor_bw 64 MiB", xbigten, "MB/s", bign)
    fig("xfer_perf tag_lat 8 B median", xl50, "usec", latn)
    fig("xfer_perf tag_lat 8 B average", xlavg, "usec", latn)
    fig("xfer_perf put_lat 8 B median", xp50, "usec", latn)
    fig("xfer_perf put_lat 8 B average", xpavg, "usec", latn)
    fig("ucx_perftest tag_lat 8 B median", ul50, "usec", latn)
    fig("ucx_perftest tag_lat 8 B average", ulavg, "usec", latn)
    printf "\n# the aims: ratio = a / b\n"
    aims_header()
    aim("tag_bw 1 MiB: xfer / ucx_perftest", xbw, ubw, "MB/s", ">=", 1.2)
    aim("tag_bw 1 MiB: xfer / iperf3", xbw, ibw, "MB/s", ">=", 1.5)
    aim("tag_lat 8 B median: xfer / ucx_perftest", xl50, ul50, "usec", "<=", 0.95)
    aim("8 B medians: put_lat / tag_lat (xfer)", xp50, xl50, "usec", "<=", 1.1)
    aim("1 MiB: tensor_bw / put_bw (xfer)", xten, xput, "MB/s", ">=", 0.95)
    aim("64 MiB: tensor_bw / tag_bw (xfer)", xbigten, xbig, "MB/s", ">=", 0.95)
}'
