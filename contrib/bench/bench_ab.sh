#!/usr/bin/env bash
# bench_ab.sh [--out DIR] BUILD_A BUILD_B: did a change make xfer slower? The same xfer_perf
# runs from two built trees - A before the change, B after it - on this host, A and B
# alternating within each of ROUNDS rounds (B first in every other round), so that a drift of
# the machine reaches both alike. Each figure is the median of its rounds, with their range;
# the verdict is on B / A taken within each round, its median and range: within 3 % (a
# bandwidth at least 0.97 of A's, a latency at most 1.03 of A's), or not.
#
# The runs, one per line of AB_TESTS ("TRANSPORT TEST SIZE ITERS FIELD [ARG...]", FIELD the
# figure read from xfer_perf's JSON results: bw_average_mbps, t_typical_usec, ...); the
# default is the list the contract's changes are judged by:
#   tcp tag_bw 1 MiB, tcp tag_lat 8 B, shm tag_lat 8 B, and a batch of 128 x 4 KiB with a
#   16-byte notification (one batch at a time) over tcp and shm
# Over verbs, in the Soft-RoCE guest: AB_TESTS="$(contrib/bench/bench_ab.sh --verbs-tests)"
#   contrib/rxe_guest -- env AB_TESTS=... contrib/bench/bench_ab.sh BUILD_A BUILD_B
# puts put_lat and tag_lat 8 B over verbs instead.
#
# The table goes to stdout and DIR/ab.txt, every round's figures to DIR/rounds.txt. A tool,
# not a test: it exits 0 whatever the figures, non-zero when something fails to run.
# Knobs: ROUNDS (9, at least 9; lib.sh), BENCH_PORT (first port, default 19600),
# RUN_TIMEOUT (300), AB_PIN=1 (server on CPU 1, client on CPU 0, for A and B alike: on two
# CPUs a latency run whose two busy-polling processes share one CPU takes about twice as
# long, and which runs do is chance).
# Needs jq and ss (iproute2), and taskset with AB_PIN=1.
set -euo pipefail

BENCH_NAME=bench_ab
# shellcheck source=contrib/bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

VERBS_TESTS='verbs put_lat 8 20000 t_typical_usec
verbs tag_lat 8 20000 t_typical_usec'
DEFAULT_TESTS='tcp tag_bw 1048576 2000 bw_average_mbps
tcp tag_lat 8 20000 t_typical_usec
shm tag_lat 8 20000 t_typical_usec
tcp batch_put 4096 5000 bw_average_mbps -b 128 --notify 16
shm batch_put 4096 20000 bw_average_mbps -b 128 --notify 16 -m xfer'
if [ "${1:-}" = --verbs-tests ]; then
    echo "$VERBS_TESTS"
    exit 0
fi
bench_out_args "$@"
set -- "${BENCH_ARGS[@]}"
[ $# -eq 2 ] || die "usage: bench_ab.sh [--out DIR] BUILD_A BUILD_B"
BUILD_A=$1
BUILD_B=$2
# One build run from two paths of different lengths (/tmp/before and /tmp/at-ec2b0ec) measured
# 8 % apart in shm tag_lat, 21 rounds: the process's environment and stack are laid out
# differently. Builds compared here sit at paths equally long (two worktrees /tmp/ab-<commit>).
if [ "${#BUILD_A}" -ne "${#BUILD_B}" ]; then
    echo "# note: $BUILD_A and $BUILD_B differ in length; the same build measured up to 8 %" \
         "apart from such paths (shm tag_lat): put both at paths equally long" >&2
fi
PORT=${BENCH_PORT:-19600}
TESTS=${AB_TESTS:-$DEFAULT_TESTS}
for b in "$BUILD_A" "$BUILD_B"; do
    [ -x "$b/contrib/xfer_perf" ] || die "no $b/contrib/xfer_perf: build it first"
done
for tool in jq ss $([ "${AB_PIN:-0}" = 1 ] && echo taskset); do
    command -v "$tool" >/dev/null || die "$tool not found (apt-get install jq iproute2 util-linux)"
done
mkdir -p "$OUT"

# ab_run SIDE LINE: one xfer_perf pair from build SIDE (A or B); FIG = its figure
ab_run() {
    local side=$1 transport test size iters field perf args pin_s=() pin_c=()
    read -r transport test size iters field args <<<"$2"
    perf=$BUILD_A/contrib/xfer_perf
    [ "$side" = B ] && perf=$BUILD_B/contrib/xfer_perf
    if [ "${AB_PIN:-0}" = 1 ]; then
        pin_s=(taskset -c 1)
        pin_c=(taskset -c 0)
    fi
    # shellcheck disable=SC2086 # args: the line's extra words, split on purpose
    run_pair "${side}_${transport}_${test}_$size" "$RUN_TIMEOUT" \
        "${pin_s[@]}" "$perf" -x "$transport" -p "$PORT" -- \
        "${pin_c[@]}" "$perf" -x "$transport" -t "$test" -s "$size" -n "$iters" --json $args \
        -p "$PORT" 127.0.0.1 || die "$side: xfer_perf -x $transport -t $test -s $size failed"
    [ "$(jq -r '.transport' <<<"$PAIR_OUT")" = "$transport" ] ||
        die "$side: xfer_perf did not run over $transport"
    FIG=$(jq ".results[0].$field" <<<"$PAIR_OUT")
}

# a here-string, not a process substitution: the Soft-RoCE guest has no /dev/fd
mapfile -t LINES <<<"$(grep -v '^[[:space:]]*$' <<<"$TESTS")"
echo "# bench_ab: A $BUILD_A, B $BUILD_B; $(nproc) cores; $ROUNDS rounds; AB_PIN=${AB_PIN:-0}" >&2
for ((round = 1; round <= ROUNDS; round++)); do
    echo "# round $round of $ROUNDS" >&2
    for i in "${!LINES[@]}"; do
        order=(A B)
        round_first "$round" || order=(B A)
        for side in "${order[@]}"; do
            ab_run "$side" "${LINES[$i]}"
            round_add "${side}_$i" "$FIG"
        done
        round_ratio "B_$i" "A_$i"
    done
done

{
    rounds_header
    printf "# A: %s\n# B: %s\n# AB_PIN=%s\n" "$BUILD_A" "$BUILD_B" "${AB_PIN:-0}"
    printf "%-44s %-14s %10s %-17s %10s %-17s %6s %-11s %s\n" run field A range B range \
           "B/A" range verdict
    for i in "${!LINES[@]}"; do
        read -r transport test size iters field args <<<"${LINES[$i]}"
        round_median "A_$i"
        round_median "B_$i"
        round_median "R_B_${i}_A_$i"
        a="A_$i" b="B_$i" r="R_B_${i}_A_$i"
        ar="${a}_RANGE" br="${b}_RANGE" rr="${r}_RANGE"
        verdict=$(awk -v r="${!r}" -v f="$field" 'BEGIN {
            lat = (f ~ /usec/); ok = lat ? (r <= 1.03) : (r >= 0.97)
            print ok ? "within 3 %" : "NOT within 3 %" }')
        printf "%-44s %-14s %10.3f %-17s %10.3f %-17s %6.3f %-11s %s\n" \
               "$transport $test $size ${args:-}" "$field" "${!a}" "(${!ar})" "${!b}" \
               "(${!br})" "${!r}" "(${!rr})" "$verdict"
    done
} | tee "$OUT/ab.txt"

# every round's figures, in round order: what the medians and ranges above were taken from
for i in "${!LINES[@]}"; do
    printf "# %s\n" "${LINES[$i]}"
    printf "A   %s\nB   %s\nB/A %s\n" "${ROUND_FIGS[A_$i]}" "${ROUND_FIGS[B_$i]}" \
           "${ROUND_FIGS[R_B_${i}_A_$i]}"
done >"$OUT/rounds.txt"
