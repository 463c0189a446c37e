#!/usr/bin/env bash
# bench_tls.sh [--out DIR] BUILD: what tcp's encryption (XFER_TCP_TLS=y: TLS 1.3 records
# sealed by the kernel) costs against plain tcp, both with the same key (XFER_AUTH_KEY_FILE),
# so that only the encryption differs. xfer_perf over loopback, plain and sealed in
# alternating order round by round:
#   tag_bw 1 MiB and 64 MiB (MB/s), and tag_lat 8 B (half a round trip, median, us)
# Each figure is the median of ROUNDS rounds with its range, and sealed / plain within each
# round. The kernel must have TLS (modprobe tls): this host's may not; contrib/rxe_guest runs
# the script in a guest whose kernel has it (there the machine is emulated: the ratios hold,
# the absolute figures do not). The table goes to stdout and DIR/tls.txt, every run to
# DIR/tls.csv.
#
# Knobs: ROUNDS (9, at least 9; lib.sh), BW_ITERS (200), BIG_ITERS (8), LAT_ITERS (2000),
# BENCH_PORT (19950), RUN_TIMEOUT (300). Needs jq and ss (iproute2).
# A tool, not a test: it exits 0 whatever the figures.
set -euo pipefail

# shellcheck disable=SC2034 # read by lib.sh
BENCH_NAME=bench_tls
# shellcheck source=contrib/bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

bench_out_args "$@"
set -- "${BENCH_ARGS[@]}"
[ $# -eq 1 ] || die "usage: bench_tls.sh [--out DIR] BUILD"
PERF=$1/contrib/xfer_perf
[ -x "$PERF" ] || die "no $PERF: build it first"
for tool in jq ss; do
    command -v "$tool" >/dev/null || die "$tool not found (apt-get install jq iproute2)"
done
PORT=${BENCH_PORT:-19950}
BW_ITERS=${BW_ITERS:-200}
BIG_ITERS=${BIG_ITERS:-8}
LAT_ITERS=${LAT_ITERS:-2000}
mkdir -p "$OUT"
export XFER_COMPONENT_PATH=$1/components XFER_TRANSPORTS=tcp
KEY=$(mktemp)
trap 'rm -f "$KEY"; bench_cleanup' EXIT
head -c 32 /dev/urandom >"$KEY"
chmod 600 "$KEY"
export XFER_AUTH_KEY_FILE=$KEY

# fig MODE NAME TEST SIZE ITERS FIELD: one xfer_perf pair, plain or sealed, into NAME's rounds
fig() {
    local mode=$1 name=$2 test=$3 size=$4 iters=$5 field=$6 v
    if [ "$mode" = tls ]; then export XFER_TCP_TLS=y; else export XFER_TCP_TLS=n; fi
    echo "# $mode: xfer_perf -t $test -s $size -n $iters" >&2
    xfer_tcp "$test" "$size" "$iters" || die "xfer_perf $test $size ($mode) failed"
    v=$(jq ".results[0].$field" <<<"$PAIR_OUT")
    round_add "${mode}_$name" "$v"
    echo "$round,$mode,$name,$v" >>"$OUT/tls.csv"
}

echo "round,mode,figure,value" >"$OUT/tls.csv"
echo "# bench_tls: loopback, $(nproc) cores, $ROUNDS rounds, kernel $(uname -r)" >&2
NAMES=(bw_1m bw_64m lat_8)
for ((round = 1; round <= ROUNDS; round++)); do
    echo "# round $round of $ROUNDS" >&2
    round_pair "fig plain bw_1m tag_bw 1048576 $BW_ITERS bw_average_mbps" \
        "fig tls bw_1m tag_bw 1048576 $BW_ITERS bw_average_mbps"
    round_pair "fig plain bw_64m tag_bw 67108864 $BIG_ITERS bw_average_mbps" \
        "fig tls bw_64m tag_bw 67108864 $BIG_ITERS bw_average_mbps"
    round_pair "fig plain lat_8 tag_lat 8 $LAT_ITERS t_typical_usec" \
        "fig tls lat_8 tag_lat 8 $LAT_ITERS t_typical_usec"
    for n in "${NAMES[@]}"; do
        round_ratio "tls_$n" "plain_$n"
    done
done

{
    rounds_header
    printf '%-22s %26s %26s %20s\n' figure plain "sealed (TLS)" "sealed / plain"
    for n in "${NAMES[@]}"; do
        cells=()
        for m in plain_$n tls_$n R_tls_${n}_plain_$n; do
            round_median "$m"
            r=${m}_RANGE
            printf -v v '%.2f (%s)' "${!m}" "${!r}"
            cells+=("$v")
        done
        case $n in
            bw_1m) what="tag_bw 1 MiB, MB/s" ;;
            bw_64m) what="tag_bw 64 MiB, MB/s" ;;
            lat_8) what="tag_lat 8 B, us" ;;
        esac
        printf '%-22s %26s %26s %20s\n' "$what" "${cells[@]}"
    done
} >"$OUT/tls.txt"
cat "$OUT/tls.txt"
