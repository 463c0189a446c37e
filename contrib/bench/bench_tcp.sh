#!/usr/bin/env bash
# bench_tcp.sh [BUILD_DIR]: xfer's tcp transport against iperf3 and ucx_perftest (UCX_TLS=tcp),
# all on loopback, in one run. Prints the figures, the ratios and whether the aims are met:
#   bandwidth (1 MiB tag messages)  xfer >= ucx_perftest and xfer >= 0.8 x iperf3
#   latency   (8-byte tag ping-pong, half round trip)  xfer <= ucx_perftest
# A tool, not a test: it exits 0 whatever the figures, non-zero only when something fails to run.
#
# BUILD_DIR (or $XFER_BUILD_DIR) is a configured and built tree; default ./build.
# Knobs: BENCH_PORT (first of 6 ports, default 18600), BW_ITERS (2000), LAT_ITERS (20000),
# IPERF_SECS (5). Needs iperf3, ucx-utils (ucx_perftest), jq and ss (iproute2).
set -euo pipefail

BUILD=${1:-${XFER_BUILD_DIR:-./build}}
PERF=$BUILD/contrib/xfer_perf
PORT=${BENCH_PORT:-18600}
BW_ITERS=${BW_ITERS:-2000}
LAT_ITERS=${LAT_ITERS:-20000}
IPERF_SECS=${IPERF_SECS:-5}
BW_SIZE=1048576
LAT_SIZE=8

BENCH_NAME=bench_tcp
# shellcheck source=contrib/bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

[ -x "$PERF" ] || die "no $PERF: build first (make -C $BUILD), or pass the build directory"
for tool in iperf3 ucx_perftest jq ss; do
    command -v "$tool" >/dev/null || die "$tool not found (apt-get install iperf3 ucx-utils jq iproute2)"
done


# UCX over TCP on loopback only
export UCX_TLS=tcp UCX_NET_DEVICES=lo
# ucx_perftest's MB is 2^20 bytes; ours (and iperf3's M) is 10^6
UCX_MB=1.048576

echo "# bench_tcp: loopback, $(nproc) cores, build $BUILD; MB = 10^6 bytes" >&2

# ---- bandwidth ---------------------------------------------------------------------------------
echo "# xfer_perf -x tcp -t tag_bw -s $BW_SIZE -n $BW_ITERS ..." >&2
start_server xfer_bw 10 "$PERF" -x tcp -p "$PORT"
XFER_BW_JSON=$("$PERF" -x tcp -t tag_bw -s "$BW_SIZE" -n "$BW_ITERS" --json -p "$PORT" 127.0.0.1) ||
    die "xfer_perf tag_bw failed"
XFER_TRANSPORT=$(jq -r '.transport' <<<"$XFER_BW_JSON")
XFER_BW=$(jq '.results[0].bw_average_mbps' <<<"$XFER_BW_JSON")
next_port

echo "# iperf3 -c 127.0.0.1 -t $IPERF_SECS ..." >&2
start_server iperf3 10 iperf3 -s -1 --forceflush -p "$PORT"
IPERF_JSON=$(iperf3 -c 127.0.0.1 -p "$PORT" -t "$IPERF_SECS" -J) || die "iperf3 failed"
IPERF_BW=$(jq '.end.sum_received.bits_per_second / 8 / 1e6' <<<"$IPERF_JSON")
next_port

echo "# ucx_perftest -t tag_bw -s $BW_SIZE -n $BW_ITERS (UCX_TLS=tcp) ..." >&2
start_server ucx_bw 10 ucx_perftest -p "$PORT"
UCX_BW_CSV=$(ucx_perftest 127.0.0.1 -p "$PORT" -t tag_bw -s "$BW_SIZE" -n "$BW_ITERS" -w 200 \
             -f -v 2>&1) || { echo "$UCX_BW_CSV" >&2; die "ucx_perftest tag_bw failed"; }
# -f -v: a CSV header, then iterations,lat50,avg_lat,overall_lat,avg_bw,overall_bw,avg_mr,...
UCX_BW=$(awk -F, -v mb=$UCX_MB '/^[0-9]+,/ {v = $6 * mb} END {print v}' <<<"$UCX_BW_CSV")
next_port

# ---- latency -----------------------------------------------------------------------------------
echo "# xfer_perf -x tcp -t tag_lat -s $LAT_SIZE -n $LAT_ITERS ..." >&2
start_server xfer_lat 10 "$PERF" -x tcp -p "$PORT"
XFER_LAT_JSON=$("$PERF" -x tcp -t tag_lat -s "$LAT_SIZE" -n "$LAT_ITERS" --json -p "$PORT" \
                127.0.0.1) || die "xfer_perf tag_lat failed"
XFER_LAT50=$(jq '.results[0].t_typical_usec' <<<"$XFER_LAT_JSON")
XFER_LATAVG=$(jq '.results[0].t_avg_usec' <<<"$XFER_LAT_JSON")
next_port

echo "# ucx_perftest -t tag_lat -s $LAT_SIZE -n $LAT_ITERS (UCX_TLS=tcp) ..." >&2
start_server ucx_lat 10 ucx_perftest -p "$PORT"
UCX_LAT_CSV=$(ucx_perftest 127.0.0.1 -p "$PORT" -t tag_lat -s "$LAT_SIZE" -n "$LAT_ITERS" \
              -f -v 2>&1) || { echo "$UCX_LAT_CSV" >&2; die "ucx_perftest tag_lat failed"; }
UCX_LAT50=$(awk -F, '/^[0-9]+,/ {v = $2} END {print v}' <<<"$UCX_LAT_CSV")
UCX_LATAVG=$(awk -F, '/^[0-9]+,/ {v = $3} END {print v}' <<<"$UCX_LAT_CSV")

for v in XFER_BW IPERF_BW UCX_BW XFER_LAT50 XFER_LATAVG UCX_LAT50 UCX_LATAVG; do
    [[ ${!v} =~ ^[0-9.e+-]+$ ]] || die "could not read $v (got '${!v}')"
done

# ---- the table ---------------------------------------------------------------------------------
awk -v xbw="$XFER_BW" -v ibw="$IPERF_BW" -v ubw="$UCX_BW" \
    -v xl50="$XFER_LAT50" -v xlavg="$XFER_LATAVG" -v ul50="$UCX_LAT50" -v ulavg="$UCX_LATAVG" \
    -v tr="$XFER_TRANSPORT" -v bws="$BW_SIZE" -v lats="$LAT_SIZE" '
function verdict(ok) { return ok ? "met" : "NOT met" }
BEGIN {
    printf "# xfer over %s vs iperf3 and ucx_perftest (UCX_TLS=tcp), loopback; MB = 10^6 bytes\n", tr
    printf "%-34s %12s %12s %12s %12s %10s\n", "figure", "xfer_perf", "iperf3", "ucx_perftest",
           "xfer/iperf3", "xfer/ucx"
    printf "%-34s %12.1f %12.1f %12.1f %12.2f %10.2f\n", "tag_bw " bws " B [MB/s]", xbw, ibw, ubw,
           xbw / ibw, xbw / ubw
    printf "%-34s %12.2f %12s %12.2f %12s %10.2f\n", "tag_lat " lats " B median [usec]", xl50, "-",
           ul50, "-", xl50 / ul50
    printf "%-34s %12.2f %12s %12.2f %12s %10.2f\n", "tag_lat " lats " B average [usec]", xlavg,
           "-", ulavg, "-", xlavg / ulavg
    printf "# aims: bandwidth >= ucx_perftest: %s (%.2f); bandwidth >= 0.8 x iperf3: %s (%.2f);\n",
           verdict(xbw >= ubw), xbw / ubw, verdict(xbw >= 0.8 * ibw), xbw / ibw
    printf "#       latency (median) <= ucx_perftest: %s (%.2f)\n", verdict(xl50 <= ul50),
           xl50 / ul50
}'
