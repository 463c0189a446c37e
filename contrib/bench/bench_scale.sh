#!/usr/bin/env bash
# bench_scale.sh [--out DIR] BUILD: what many peers cost one process. For each transport and
# each count of endpoints, scale_probe (built in BUILD) connects that many endpoints from one
# client process to one server process in one burst (both pinned, the server to core 1 and
# the client to core 0) and measures, with all but one idle:
#   connect   the burst's time per endpoint (us)
#   rss, fds  resident memory (KiB) and descriptors the client gained per endpoint
#   lanes     endpoints lacking a lane they agreed on (tcp; must be 0)
#   progress  an empty xfer_progress() (ns), the mean of 200,000 calls
#   rt_poll   the 8-byte round trip of the one active pair, both sides spinning (us)
#   rt_any    the same, the client receiving the answers from any peer (us)
#   rt_sleep  the same, both sides asleep in xfer_request_wait (us)
# Each figure is the median of ROUNDS rounds (the counts in alternating order), with its
# range; progress, rt_poll and rt_any also as the ratio to the smallest count's within each
# round.
# The table goes to stdout and DIR/scale.txt, every run to DIR/scale.csv and, with gnuplot,
# the figures against the count to DIR/scale.svg.
#
# Knobs: ROUNDS (9, at least 9; lib.sh), SCALE_COUNTS ("1 16 64 256 1024"),
# SCALE_TRANSPORTS ("tcp shm"; verbs in the Soft-RoCE guest:
#   contrib/rxe_guest -- env SCALE_TRANSPORTS=verbs contrib/bench/bench_scale.sh BUILD),
# BENCH_PORT (19700), RUN_TIMEOUT (300). Needs jq, ss (iproute2) and taskset (util-linux);
# gnuplot (gnuplot-nox) for the plot. A tool, not a test: it exits 0 whatever the figures.
set -euo pipefail

# shellcheck disable=SC2034 # read by lib.sh
BENCH_NAME=bench_scale
# shellcheck source=contrib/bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

bench_out_args "$@"
set -- "${BENCH_ARGS[@]}"
[ $# -eq 1 ] || die "usage: bench_scale.sh [--out DIR] BUILD"
need_scale_probe "$1"
read -r -a COUNTS <<<"${SCALE_COUNTS:-1 16 64 256 1024}"
read -r -a TRANSPORTS <<<"${SCALE_TRANSPORTS:-tcp shm}"
PORT=${BENCH_PORT:-19700}
FIELDS=(connect_us_per_ep rss_kib_per_ep fds_per_ep lanes_missing progress_ns rt_poll_us
        rt_any_us rt_sleep_us)
mkdir -p "$OUT"
CSV=$OUT/scale.csv
echo "transport,round,endpoints,$(IFS=,; echo "${FIELDS[*]}")" >"$CSV"
# the probe's components: the build's own, whatever the environment says
export XFER_COMPONENT_PATH=$1/components
# a thousand endpoints take two thousand descriptors and more on each side
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

PROBE_ENV=()
probe() {
    probe_pair "$1" "$2" "$2"
}

echo "# bench_scale: $PROBE; $(nproc) cores; $ROUNDS rounds; counts ${COUNTS[*]}" >&2
for ((round = 1; round <= ROUNDS; round++)); do
    echo "# round $round of $ROUNDS" >&2
    for t in "${TRANSPORTS[@]}"; do
        runs=()
        for n in "${COUNTS[@]}"; do
            runs+=("probe $t $n")
        done
        round_pair "${runs[@]}"
        for n in "${COUNTS[@]}"; do
            for f in progress_ns rt_poll_us rt_any_us; do
                round_ratio "${t}_${n}_$f" "${t}_${COUNTS[0]}_$f"
            done
        done
    done
done

# the table into its file first (not through a pipe, whose subshell would keep the medians),
# then to stdout
{
    rounds_header
    printf '%-5s %6s %20s %14s %6s %5s %22s %16s %22s %16s %22s %16s %22s\n' transport \
        endpoints "connect us/ep" "rss KiB/ep" fds/ep lanes "progress ns" "x ${COUNTS[0]}" \
        "rt_poll us" "x ${COUNTS[0]}" "rt_any us" "x ${COUNTS[0]}" "rt_sleep us"
    for t in "${TRANSPORTS[@]}"; do
        for n in "${COUNTS[@]}"; do
            cells=()
            for f in "${FIELDS[@]}"; do
                round_median "${t}_${n}_$f"
                m=${t}_${n}_$f
                r=${m}_RANGE
                printf -v v '%.2f' "${!m}"
                case $f in
                fds_per_ep|lanes_missing) cells+=("$v") ;;
                *) cells+=("$v (${!r})") ;;
                esac
            done
            for f in progress_ns rt_poll_us rt_any_us; do
                round_median "R_${t}_${n}_${f}_${t}_${COUNTS[0]}_$f"
                m=R_${t}_${n}_${f}_${t}_${COUNTS[0]}_$f
                r=${m}_RANGE
                printf -v v '%.2f' "${!m}"
                cells+=("$v (${!r})")
            done
            printf '%-5s %6s %20s %14s %6s %5s %22s %16s %22s %16s %22s %16s %22s\n' "$t" \
                "$n" "${cells[0]}" "${cells[1]}" "${cells[2]}" "${cells[3]}" "${cells[4]}" \
                "${cells[8]}" "${cells[5]}" "${cells[9]}" "${cells[6]}" "${cells[10]}" \
                "${cells[7]}"
        done
    done
} >"$OUT/scale.txt"
cat "$OUT/scale.txt"

if ! command -v gnuplot >/dev/null; then
    echo "# no plot: gnuplot not found (apt-get install gnuplot-nox)" >&2
    exit 0
fi
plots=()
for t in "${TRANSPORTS[@]}"; do
    for n in "${COUNTS[@]}"; do
        p=${t}_${n}_progress_ns r=${t}_${n}_rt_poll_us z=${t}_${n}_rt_sleep_us
        echo "$n ${!p} ${!r} ${!z}"
    done >"$LOGDIR/$t.dat"
    plots+=("'$LOGDIR/$t.dat' using 1:2 with linespoints title '$t progress (ns)'"
            "'$LOGDIR/$t.dat' using 1:(\$3 * 1000) with linespoints title '$t rt_poll (ns)'"
            "'$LOGDIR/$t.dat' using 1:(\$4 * 1000) with linespoints title '$t rt_sleep (ns)'")
done
gnuplot <<EOF
set terminal svg size 900,520 dynamic noenhanced
set output '$OUT/scale.svg'
set title "scale_probe: one active pair beside idle endpoints (medians of $ROUNDS rounds)"
set logscale xy
set xrange [0.8:1500]
set xlabel 'endpoints in the process'
set ylabel 'ns'
set key outside right
plot $(IFS=,; echo "${plots[*]}")
EOF
echo "# plot: $OUT/scale.svg" >&2
