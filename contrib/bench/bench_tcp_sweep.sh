#!/usr/bin/env bash
# bench_tcp_sweep.sh [--out DIR] [BUILD_DIR]: xfer's tcp transport beside ucx_perftest
# (UCX_TLS=tcp UCX_NET_DEVICES=lo) on loopback, test by test and size by size, from 8 B to
# 64 MiB, so that a reader sees where xfer wins and where it loses. The pairs
# (xfer_perf ~ ucx_perftest):
#   tag_bw ~ tag_bw, put_bw ~ ucp_put_bw, get_bw ~ ucp_get -O GET_WINDOW, tensor_bw ~ none,
#   tag_lat ~ tag_lat, put_lat ~ ucp_put_lat, tensor_lat ~ none
# ucp_get's own default keeps one get in flight, which measures a round trip, not bandwidth:
# it runs with GET_WINDOW (16) in flight, xfer_perf's default window. The other UCX tests keep
# ucx_perftest's defaults (tag_bw and ucp_put_bw: 32 in flight). Each xfer run is followed
# by its UCX run, so that the two see the same load, ROUNDS times (9, at least 9): a figure is the median
# of its ROUNDS runs, so that one run disturbed by the machine's other work does not make it.
# Bandwidth is in MB/s (10^6 bytes: ucx_perftest's 2^20-byte MB is converted), latency is the
# median in usec (half a round trip; tensor_lat: one whole fetch). The ratio is xfer / ucx for
# bandwidth and ucx / xfer for latency: above 1, xfer is better.
# Writes DIR/tcp_sweep.csv (test,size,xfer,ucx,ratio; size in bytes, a failed or missing figure
# left empty) and, with gnuplot, DIR/tcp_sweep.svg: bandwidth and latency against size, log-log,
# xfer solid and UCX dashed, one colour per pair (PNG=1 adds DIR/tcp_sweep.png). Prints the
# table. Without gnuplot it says the plot was skipped and why. A tool, not a test: it exits 0
# whatever the figures, non-zero when a run fails (the others are still written).
#
# BUILD_DIR (or $XFER_BUILD_DIR) is a configured and built tree; default ./build. DIR: default .
# Knobs: SIZES (bytes, "8 64 512 4096 32768 262144 1048576 8388608 67108864"), BENCH_PORT
# (the first port, default 19000; one per run: 972 with the defaults), ROUNDS (9), BW_BYTES
# (what one bandwidth run moves: iterations = BW_BYTES / size, default 1 GiB, within MIN_ITERS
# and BW_MAX_ITERS: 20 and 100000), LAT_BYTES (likewise for latency runs: 256 MiB, within
# MIN_ITERS and LAT_MAX_ITERS: 20000), GET_WINDOW (16), RUN_TIMEOUT (the most seconds one
# client may run, 300), PNG (0). Both sides warm up for a tenth of the iterations (at most
# 1000). With the defaults (9 rounds) it takes about 25 minutes on two cores. Needs ucx-utils
# (ucx_perftest), jq and ss (iproute2); gnuplot (gnuplot-nox) for the plot.
set -euo pipefail

BENCH_NAME=bench_tcp_sweep
# shellcheck source=contrib/bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_out_args "$@"
set -- "${BENCH_ARGS[@]}"

BUILD=${1:-${XFER_BUILD_DIR:-./build}}
PERF=$BUILD/contrib/xfer_perf
PORT=${BENCH_PORT:-19000}
SIZES=${SIZES:-"8 64 512 4096 32768 262144 1048576 8388608 67108864"}
BW_BYTES=${BW_BYTES:-1073741824}
LAT_BYTES=${LAT_BYTES:-268435456}
MIN_ITERS=${MIN_ITERS:-20}
BW_MAX_ITERS=${BW_MAX_ITERS:-100000}
LAT_MAX_ITERS=${LAT_MAX_ITERS:-20000}
GET_WINDOW=${GET_WINDOW:-16}
REPEAT=$ROUNDS      # lib.sh: 9 or more
PNG=${PNG:-0}


[ -x "$PERF" ] || die "no $PERF: build first (make -C $BUILD), or pass the build directory"
for tool in ucx_perftest jq ss; do
    command -v "$tool" >/dev/null || die "$tool not found (apt-get install ucx-utils jq iproute2)"
done
for s in $SIZES; do
    [[ $s =~ ^[1-9][0-9]*$ ]] || die "SIZES: '$s' is not a size in bytes"
done
[[ $REPEAT =~ ^[1-9][0-9]*$ ]] || die "REPEAT: '$REPEAT' is not a count of runs"
mkdir -p "$OUT" || die "cannot create $OUT"
CSV=$OUT/tcp_sweep.csv
SVG=$OUT/tcp_sweep.svg

# The pairs, in the table's order: xfer_perf test, ucx_perftest test (- for none), its extra
# arguments joined by commas (- for none), the colour of the pair in the plot.
PAIRS=(
    "tag_bw     tag_bw      -                #1f77b4"
    "put_bw     ucp_put_bw  -                #d62728"
    "get_bw     ucp_get     -O,$GET_WINDOW   #2ca02c"
    "tensor_bw  -           -                #9467bd"
    "tag_lat    tag_lat     -                #1f77b4"
    "put_lat    ucp_put_lat -                #d62728"
    "tensor_lat -           -                #9467bd"
)

# iters_for TEST SIZE: iterations of one run (BW_BYTES or LAT_BYTES moved, within the bounds)
iters_for() {
    local bytes=$BW_BYTES max=$BW_MAX_ITERS n
    if [[ $1 == *_lat ]]; then bytes=$LAT_BYTES max=$LAT_MAX_ITERS; fi
    n=$((bytes / $2))
    ((n > max)) && n=$max
    ((n < MIN_ITERS)) && n=$MIN_ITERS
    echo "$n"
}
warmup_for() { local w=$(($1 / 10)); ((w > 1000)) && w=1000; ((w < 1)) && w=1; echo "$w"; }
# median VALUE...: their median; nothing when there are none
median() {
    [ $# -gt 0 ] || return 0
    printf '%s\n' "$@" | sort -g |
        awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}

# xfer_figure TEST SIZE ITERS: FIG is the figure (MB/s or median usec), empty on failure. The
# helpers run in this shell, not in $(...), so that the ports they take and the servers they
# start are this shell's to count and to kill.
xfer_figure() {
    local field=bw_average_mbps
    [[ $1 == *_lat ]] && field=t_typical_usec
    FIG=
    xfer_tcp "$1" "$2" "$3" --warmup "$(warmup_for "$3")" || return 0
    if [ "$(jq -r '.transport' <<<"$PAIR_OUT")" != tcp ]; then
        echo "$BENCH_NAME: xfer_perf $1 $2 did not run over tcp" >&2
        return 0
    fi
    FIG=$(jq ".results[0].$field" <<<"$PAIR_OUT")
}

# ucx_figure TEST SIZE ITERS EXTRA: the same for ucx_perftest (EXTRA: arguments joined by commas)
ucx_figure() {
    local extra=()
    [ "$4" = - ] || IFS=, read -ra extra <<<"$4"
    FIG=
    ucx_tcp "$1" "$2" "$3" -w "$(warmup_for "$3")" "${extra[@]}" || return 0
    if [[ $1 == *_lat ]]; then
        FIG=$(cut -d, -f2 <<<"$PAIR_OUT")
    else
        FIG=$(awk -F, -v mb="$UCX_MB" '{printf "%.3f\n", $6 * mb}' <<<"$PAIR_OUT")
    fi
}

# ---- the runs ----------------------------------------------------------------------------------
NSIZES=$(wc -w <<<"$SIZES")
echo "# bench_tcp_sweep: loopback, $(nproc) cores, build $BUILD, $NSIZES sizes x ${#PAIRS[@]}" \
     "tests x $REPEAT; writing $CSV" >&2
echo "test,size,xfer,ucx,ratio" >"$CSV"
FAILED=()
for size in $SIZES; do
    for pair in "${PAIRS[@]}"; do
        read -r test utest extra _ <<<"$pair"
        n=$(iters_for "$test" "$size")
        xs=() us=()
        for _ in $(seq "$REPEAT"); do
            xfer_figure "$test" "$size" "$n"
            if [ -n "$FIG" ]; then xs+=("$FIG"); else FAILED+=("xfer_perf $test $size"); fi
            [ "$utest" != - ] || continue
            ucx_figure "$utest" "$size" "$n" "$extra"
            if [ -n "$FIG" ]; then us+=("$FIG"); else FAILED+=("ucx_perftest $utest $size"); fi
        done
        x=$(median "${xs[@]}")
        u=$(median "${us[@]}")
        r=$(awk -v t="$test" -v x="$x" -v u="$u" 'BEGIN {
                if (x == "" || u == "" || x + 0 <= 0 || u + 0 <= 0) exit
                printf "%.3f\n", (t ~ /_lat$/) ? u / x : x / u }')
        echo "$test,$size,$x,$u,$r" >>"$CSV"
        printf '# %-10s %9s B  n=%-6s xfer %-24s ucx %-24s (%d s)\n' "$test" "$size" "$n" \
               "${xs[*]:--}" "${us[*]:--}" "$SECONDS" >&2
    done
done

# ---- the table ---------------------------------------------------------------------------------
# ORDER: "test:ucx_test:extra " per pair, for awk
ORDER=$(for pair in "${PAIRS[@]}"; do
            read -r t u e _ <<<"$pair"
            printf '%s:%s:%s ' "$t" "$u" "$e"
        done)
# the CSV's rows, test by test in the pairs' order, each test's sizes ascending
by_test() {
    tail -n +2 "$CSV" | sort -t, -k2,2n -s |
        awk -F, -v order="$ORDER" '
            BEGIN {
                n = split(order, o, " ")
                for (i = 1; i <= n; i++) { split(o[i], f, ":"); rank[f[1]] = i }
            }
            { print rank[$1] "," $0 }' | sort -t, -k1,1n -s | cut -d, -f2-
}
AWK_SIZE='function hsize(b) {
    if (b >= 1048576 && b % 1048576 == 0) return (b / 1048576) " MiB"
    if (b >= 1024 && b % 1024 == 0) return (b / 1024) " KiB"
    return b " B"
}'
{
    echo "# xfer_perf -x tcp vs ucx_perftest (UCX_TLS=tcp UCX_NET_DEVICES=lo), loopback," \
         "$(nproc) cores"
    echo "# bandwidth in MB/s (10^6 bytes), ratio = xfer / ucx; latency: median usec (tag_lat,"
    echo "# put_lat: half a round trip; tensor_lat: one whole fetch), ratio = ucx / xfer."
    echo "# ratio > 1: xfer is better. ucp_get runs with -O $GET_WINDOW (xfer_perf's window)."
    echo "# each figure: the median of $REPEAT runs"
    by_test | awk -F, -v order="$ORDER" "$AWK_SIZE"'
        BEGIN {
            n = split(order, o, " ")
            for (i = 1; i <= n; i++) { split(o[i], f, ":"); ucx[f[1]] = f[2]; ex[f[1]] = f[3] }
            printf "%-11s %-16s %8s %12s %12s %7s  %s\n", "test", "ucx_perftest", "size",
                   "xfer", "ucx", "ratio", "xfer"
        }
        function num(v, lat) { return v == "" ? "-" : sprintf(lat ? "%.2f" : "%.1f", v) }
        {
            if (NR > 1 && $1 != prev) print ""
            prev = $1
            lat = $1 ~ /_lat$/
            u = ucx[$1]
            if (ex[$1] != "-") { e = ex[$1]; gsub(/,/, " ", e); u = u " " e }
            verdict = $5 == "" ? "" : ($5 >= 1 ? "  wins" : "  loses")
            printf "%-11s %-16s %8s %12s %12s %7s%s\n", $1, u, hsize($2), num($3, lat),
                   num($4, lat), $5 == "" ? "-" : sprintf("%.2f", $5), verdict
        }'
}

# ---- the plot ----------------------------------------------------------------------------------
# gnuplot_script TERMINAL OUTPUT: both panels, xfer solid and UCX dashed, one colour per pair
gnuplot_script() {
    local dat=$LOGDIR/sweep.dat i=0 bw=() lat=() pair t u e c line label
    by_test | awk -F, -v order="$ORDER" '
        BEGIN { n = split(order, o, " ") }
        {
            x[$1, $2] = $3 == "" ? "-" : $3
            u[$1, $2] = $4 == "" ? "-" : $4
            sizes[$1] = sizes[$1] " " $2
        }
        END {
            for (i = 1; i <= n; i++) {
                split(o[i], f, ":")
                ns = split(sizes[f[1]], s, " ")
                print "# " f[1]
                for (j = 1; j <= ns; j++) print s[j], x[f[1], s[j]], u[f[1], s[j]]
                if (ns == 0) print "1 - -"
                print ""; print ""
            }
        }' >"$dat"
    for pair in "${PAIRS[@]}"; do
        read -r t u e c <<<"$pair"
        line="'$dat' index $i using 1:2 with linespoints lw 2 dt 1 pt 7 ps 0.7 lc rgb '$c'"
        line+=" title 'xfer $t'"
        if [ "$u" != - ]; then
            label=$u
            [ "$e" = - ] || label="$u ${e//,/ }"
            line+=", '' index $i using 1:3 with linespoints lw 2 dt 2 pt 6 ps 0.7 lc rgb '$c'"
            line+=" title 'UCX $label'"
        fi
        if [[ $t == *_lat ]]; then lat+=("$line"); else bw+=("$line"); fi
        i=$((i + 1))
    done
    local xtics sorted
    # shellcheck disable=SC2086 # one size a word
    sorted=$(printf '%s\n' $SIZES | sort -n)
    xtics=$(for s in $sorted; do
                awk -v b="$s" "$AWK_SIZE"' BEGIN { printf "\"%s\" %s, ", hsize(b), b }'
            done)
    cat <<GNUPLOT
set terminal $1
set output '$2'
set datafile missing '-'
set multiplot layout 1,2 title 'xfer_perf -x tcp (solid) and ucx_perftest UCX_TLS=tcp \
(dashed), loopback, $(nproc) cores'
set logscale xy
set xrange [$(head -1 <<<"$sorted") / 2.0 : $(tail -1 <<<"$sorted") * 2.0]
set xtics (${xtics%, }) rotate by -30
set grid xtics ytics mytics lc rgb '#dddddd'
set key top left box opaque
set xlabel 'message size'
set title 'bandwidth: higher is better'
set ylabel 'MB/s (10^6 bytes)'
plot $(IFS=,; echo "${bw[*]}")
set title 'latency (median; tensor_lat: a whole fetch): lower is better'
set ylabel 'usec'
plot $(IFS=,; echo "${lat[*]}")
unset multiplot
GNUPLOT
}

# plot TERMINAL OUTPUT: says what it wrote, or why it did not
plot() {
    local err
    if ! command -v gnuplot >/dev/null; then
        echo "# plot skipped: gnuplot not found (apt-get install gnuplot-nox)"
        return 0
    fi
    if ! err=$(gnuplot -e "set terminal ${1%% *}" 2>&1 </dev/null) || [ -n "$err" ]; then
        echo "# plot skipped: this gnuplot has no ${1%% *} terminal: $err"
        return 0
    fi
    gnuplot_script "$1" "$2" >"$LOGDIR/sweep.gp"
    if ! err=$(gnuplot "$LOGDIR/sweep.gp" 2>&1); then
        echo "# plot failed: gnuplot: $err"
        FAILED+=("gnuplot")
        return 0
    fi
    echo "# plot: $2"
}

echo
echo "# table: $CSV"
plot "svg size 1400,620 dynamic noenhanced font 'sans,12' background rgb 'white'" "$SVG"
if [ "$PNG" = 1 ]; then
    plot "pngcairo size 1400,620 noenhanced font 'sans,10' background rgb 'white'" \
         "$OUT/tcp_sweep.png"
fi
echo "# the sweep took $SECONDS s"
if [ ${#FAILED[@]} -gt 0 ]; then
    echo "$BENCH_NAME: ${#FAILED[@]} failed: ${FAILED[*]}" >&2
    exit 1
fi
