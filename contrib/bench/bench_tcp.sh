#!/usr/bin/env bash
# bench_tcp.sh [BUILD_DIR]: xfer's tcp transport against iperf3 and ucx_perftest (UCX_TLS=tcp,
# its defaults otherwise), all on loopback. Prints the figures, then each aim with
# the figures it compares, their ratio and whether it is met:
#   tag_bw 1 MiB      xfer >= 1.2 x ucx_perftest tag_bw, and >= 1.5 x iperf3 (one stream)
#   tag_lat 8 B       xfer <= 0.95 x ucx_perftest tag_lat (medians of half a round trip)
#   put_lat 8 B       <= 1.1 x xfer's own tag_lat 8 B (medians)
#   tensor_bw 1 MiB   >= 0.95 x xfer's put_bw 1 MiB
#   tensor_bw 64 MiB  >= 0.95 x xfer's tag_bw 64 MiB
# Every figure is the median of ROUNDS rounds (9 or more, lib.sh) with its range; the runs
# that are compared with each other run one after the other, in alternating order from round
# to round, and each aim's ratio is taken within a round - the median of those, with their
# range, is judged. A tool, not a test: it exits 0 whatever the figures, non-zero only when
# something fails to run. bench_tcp_sweep.sh puts the tests beside UCX's from 8 B to 64 MiB.
#
# BUILD_DIR (or $XFER_BUILD_DIR) is a configured and built tree; default ./build.
# Knobs: ROUNDS (9), BENCH_PORT (first port, default 18600), BW_ITERS (1 MiB runs, 2000),
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

# xfer_add NAME TEST SIZE ITERS FIELD / ucx_add / iperf_add: one run, added to NAME's rounds
xfer_add() { xfer_fig FIG "$2" "$3" "$4" "$5"; round_add "$1" "$FIG"; }
ucx_add() {
    local name=$1 col=$2
    shift 2
    ucx_fig "$@"
    round_add "$name" "$(awk -F, -v c="$col" -v mb=$UCX_MB \
        '{print (c == 6) ? $c * mb : $c}' <<<"$UCX_LINE")"
}
iperf_add() {
    echo "# iperf3 -c 127.0.0.1 -t $IPERF_SECS ..." >&2
    run_pair iperf3 "$RUN_TIMEOUT" iperf3 -s -1 --forceflush -p "$PORT" -- \
        iperf3 -c 127.0.0.1 -p "$PORT" -t "$IPERF_SECS" -J || die "iperf3 failed"
    round_add "$1" "$(jq '.end.sum_received.bits_per_second / 8 / 1e6' <<<"$PAIR_OUT")"
}
for ((round = 1; round <= ROUNDS; round++)); do
    echo "# round $round of $ROUNDS" >&2
    # 1 MiB: xfer, UCX and one iperf3 stream; xfer's put and tensor beside each other
    round_pair "xfer_add XFER_BW tag_bw $BW_SIZE $BW_ITERS bw_average_mbps" \
         "ucx_add UCX_BW 6 tag_bw $BW_SIZE $BW_ITERS -w 200" "iperf_add IPERF_BW"
    round_pair "xfer_add XFER_PUT_BW put_bw $BW_SIZE $BW_ITERS bw_average_mbps" \
         "xfer_add XFER_TENSOR_BW tensor_bw $BW_SIZE $BW_ITERS bw_average_mbps"
    # 64 MiB
    round_pair "xfer_add XFER_BIG_BW tag_bw $BIG_SIZE $BIG_ITERS bw_average_mbps" \
         "xfer_add XFER_BIG_TENSOR_BW tensor_bw $BIG_SIZE $BIG_ITERS bw_average_mbps"
    # 8 bytes: medians of half a round trip
    round_pair "xfer_add XFER_LAT50 tag_lat $LAT_SIZE $LAT_ITERS t_typical_usec" \
         "ucx_add UCX_LAT50 2 tag_lat $LAT_SIZE $LAT_ITERS"
    round_pair "xfer_add XFER_PUT_LAT50 put_lat $LAT_SIZE $LAT_ITERS t_typical_usec" \
         "xfer_add XFER_LAT50_OWN tag_lat $LAT_SIZE $LAT_ITERS t_typical_usec"
    round_ratio XFER_BW UCX_BW
    round_ratio XFER_BW IPERF_BW
    round_ratio XFER_LAT50 UCX_LAT50
    round_ratio XFER_PUT_LAT50 XFER_LAT50_OWN
    round_ratio XFER_TENSOR_BW XFER_PUT_BW
    round_ratio XFER_BIG_TENSOR_BW XFER_BIG_BW
done

FIGS=(XFER_BW IPERF_BW UCX_BW XFER_PUT_BW XFER_TENSOR_BW XFER_BIG_BW XFER_BIG_TENSOR_BW
      XFER_LAT50 UCX_LAT50 XFER_PUT_LAT50 XFER_LAT50_OWN
      R_XFER_BW_UCX_BW R_XFER_BW_IPERF_BW R_XFER_LAT50_UCX_LAT50
      R_XFER_PUT_LAT50_XFER_LAT50_OWN R_XFER_TENSOR_BW_XFER_PUT_BW
      R_XFER_BIG_TENSOR_BW_XFER_BIG_BW)
for v in "${FIGS[@]}"; do
    round_median "$v"
    export "$v" "${v}_RANGE"
done

# ---- the figures and the aims ------------------------------------------------------------------
rounds_header
awk -v bwn="$BW_ITERS" -v bign="$BIG_ITERS" -v latn="$LAT_ITERS" -v isecs="$IPERF_SECS" \
    -v aim_w=40 "$AWK_AIMS"'
function fig(run, v, unit, note) {
    printf "%-36s %12.2f %-5s %-17s %s\n", run, ENVIRON[v], unit, "(" ENVIRON[v "_RANGE"] ")",
           note
}
function raim(what, a, b, unit, op, bound,    r) {
    r = "R_" a "_" b
    aim(what, ENVIRON[a], ENVIRON[b], unit, op, bound, ENVIRON[r], "(rounds " ENVIRON[r "_RANGE"] ")")
}
BEGIN {
    printf "# xfer over tcp vs iperf3 and ucx_perftest (UCX_TLS=tcp), loopback; MB = 10^6 bytes\n"
    printf "%-36s %12s %-5s %-17s %s\n", "run", "median", "unit", "range", "iterations"
    fig("xfer_perf tag_bw 1 MiB", "XFER_BW", "MB/s", bwn)
    fig("iperf3 one stream", "IPERF_BW", "MB/s", isecs " s")
    fig("ucx_perftest tag_bw 1 MiB", "UCX_BW", "MB/s", bwn)
    fig("xfer_perf put_bw 1 MiB", "XFER_PUT_BW", "MB/s", bwn)
    fig("xfer_perf tensor_bw 1 MiB", "XFER_TENSOR_BW", "MB/s", bwn)
    fig("xfer_perf tag_bw 64 MiB", "XFER_BIG_BW", "MB/s", bign)
    fig("xfer_perf tensor_bw 64 MiB", "XFER_BIG_TENSOR_BW", "MB/s", bign)
    fig("xfer_perf tag_lat 8 B median", "XFER_LAT50", "usec", latn)
    fig("ucx_perftest tag_lat 8 B median", "UCX_LAT50", "usec", latn)
    fig("xfer_perf put_lat 8 B median", "XFER_PUT_LAT50", "usec", latn)
    fig("xfer_perf tag_lat 8 B (put pair)", "XFER_LAT50_OWN", "usec", latn)
    printf "\n# the aims: a, b: the medians above; ratio: the median of the rounds\x27 a / b\n"
    aims_header()
    raim("tag_bw 1 MiB: xfer / ucx_perftest", "XFER_BW", "UCX_BW", "MB/s", ">=", 1.2)
    raim("tag_bw 1 MiB: xfer / iperf3", "XFER_BW", "IPERF_BW", "MB/s", ">=", 1.5)
    raim("tag_lat 8 B median: xfer / ucx_perftest", "XFER_LAT50", "UCX_LAT50", "usec", "<=", 0.95)
    raim("8 B medians: put_lat / tag_lat (xfer)", "XFER_PUT_LAT50", "XFER_LAT50_OWN", "usec", "<=", 1.1)
    raim("1 MiB: tensor_bw / put_bw (xfer)", "XFER_TENSOR_BW", "XFER_PUT_BW", "MB/s", ">=", 0.95)
    raim("64 MiB: tensor_bw / tag_bw (xfer)", "XFER_BIG_TENSOR_BW", "XFER_BIG_BW", "MB/s", ">=", 0.95)
}'
