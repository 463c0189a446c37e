#!/usr/bin/env bash
# bench_shm.sh [--out DIR] [BUILD_DIR]: same-host transfers and batches, in one run.
#
# 1. xfer's shm transport against ucx_perftest with UCX_TLS=sm and against xfer's own tcp on
#    loopback: tag_lat 8 B (medians of half a round trip), tag_bw 1 MiB and put_bw 64 MiB.
# 2. Batches (xfer_perf batch_put), over shm and over tcp: the time inside xfer_batch_post
#    per descriptor for a prepared list of 1024 x 4 KiB; 128 x 4 KiB with a notification
#    against one 512 KiB put (put_bw -w 1: one put at a time, as one batch at a time); and
#    the notification's latency at the target beside the batch's own. Beside tcp's, its
#    floor: tcp_floor (plain sockets, no xfer) receiving 512 KiB messages into 128 scattered
#    4 KiB blocks with one recvmsg, against into one buffer - what the kernel's copy to many
#    destinations costs by itself on this host.
#    And tcp's aim taken apart: a batch of one 512 KiB block, and puts that complete when
#    their data has landed (XFER_TCP_PUT_ACK=y), as a batch does; and the 128 blocks copied
#    into the socket (XFER_TCP_SPLICE=n) instead of spliced, the sender's copy saved, which a
#    batch allows because it completes only once landed. And the same batches and
#    puts two in flight (-w 2, each side's window on one region, as put_bw's on one buffer):
#    the bandwidth of a stream, where the round trip that tells a batch it has landed
#    overlaps the next batch.
# 3. A sweep of batch_put (-a: blocks 4 KiB - 64 MiB x batch lengths 1 - 1024, up to 256 MiB a
#    batch) over shm and tcp: DIR/shm_batch.csv and, with gnuplot, DIR/shm_batch.svg
#    (bandwidth against block size, one line per batch length, shm solid and tcp dashed).
# Then each aim with the figures it compares, their ratio and whether it is met:
#   shm tag_lat 8 B      <= 1.0 x ucx_perftest (UCX_TLS=sm)   and <= 1/3 x xfer tcp
#   shm tag_bw 1 MiB     >= 1.0 x ucx_perftest                and >= 3 x xfer tcp
#   shm put_bw 64 MiB    >= 1.0 x ucx_perftest                and >= 3 x xfer tcp
#   batch post           <= 0.5 usec per descriptor (1024 x 4 KiB)
#   128 x 4 KiB + notify >= 0.9 x one 512 KiB put (one at a time, and two in flight)
# xfer_perf's buffers come from xfer_mem_alloc (-m xfer), as ucx_perftest's come from
# ucp_mem_map: a same-host peer maps them (shm puts and batches are a memcpy). One more row
# gives shm put_bw 64 MiB with malloc'd buffers, which shm moves by CMA (the target copies).
# The table goes to stdout and DIR/shm.txt. A tool, not a test: it exits 0 whatever the
# figures, non-zero when something fails to run.
#
# BUILD_DIR (or $XFER_BUILD_DIR) is a configured and built tree; default ./build. DIR: default .
# Knobs: BENCH_PORT (first port, default 19200), LAT_ITERS (20000), BW_ITERS (1 MiB runs,
# 2000), BIG_ITERS (64 MiB runs, 50), BATCH_ITERS (batch runs, 20000: at 2000 a 512 KiB run
# over shm lasts 30 ms, too short to measure on a busy VM), ROUNDS (9, at least 9: each figure
# of 1 and 2 is the median of that many rounds, the runs of each comparison alternating their
# order from round to round), SWEEP (1; 0 skips 3), RUN_TIMEOUT (300).
# Needs ucx-utils (ucx_perftest), jq, ss (iproute2); gnuplot for the plot; tcp_floor is built
# with xfer (BUILD_DIR/contrib/bench).
set -euo pipefail

BENCH_NAME=bench_shm
# shellcheck source=contrib/bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
bench_out_args "$@"
set -- "${BENCH_ARGS[@]}"

BUILD=${1:-${XFER_BUILD_DIR:-./build}}
PERF=$BUILD/contrib/xfer_perf
FLOOR=$BUILD/contrib/bench/tcp_floor
PORT=${BENCH_PORT:-19200}
LAT_ITERS=${LAT_ITERS:-20000}
BW_ITERS=${BW_ITERS:-2000}
BIG_ITERS=${BIG_ITERS:-50}
BATCH_ITERS=${BATCH_ITERS:-20000}
SWEEP=${SWEEP:-1}


for bin in "$PERF" "$FLOOR"; do
    [ -x "$bin" ] || die "no $bin: build first (make -C $BUILD), or pass the build directory"
done
for tool in ucx_perftest jq ss; do
    command -v "$tool" >/dev/null || die "$tool not found (apt-get install ucx-utils jq iproute2)"
done
mkdir -p "$OUT"
TXT=$OUT/shm.txt CSV=$OUT/shm_batch.csv SVG=$OUT/shm_batch.svg

echo "# bench_shm: one host, $(nproc) cores, build $BUILD; MB = 10^6 bytes" >&2

# xfer_run TRANSPORT TEST SIZE ITERS [ARG...]: one xfer_perf run on both sides over TRANSPORT;
# its JSON object in PAIR_OUT, checked to have run over TRANSPORT; LOG_TAG, when set, names its
# logs apart from another run of the same test and size
xfer_run() {
    local tl=$1 test=$2 size=$3 iters=$4
    shift 4
    echo "# xfer_perf -x $tl -t $test -s $size -n $iters $* ..." >&2
    run_pair "xfer_${tl}_${test}_$size${LOG_TAG:+_$LOG_TAG}" "$RUN_TIMEOUT" "$PERF" -x "$tl" \
        -p "$PORT" -- \
        "$PERF" -x "$tl" -t "$test" -s "$size" -n "$iters" --json -m xfer "$@" -p "$PORT" \
        127.0.0.1 ||
        die "xfer_perf -x $tl -t $test -s $size failed"
    [ "$(jq -r '.transport' <<<"$PAIR_OUT")" = "$tl" ] || die "xfer_perf did not run over $tl"
}

# xfer_fig NAME FIELD TRANSPORT TEST SIZE ITERS [ARG...]: NAME = results[0].FIELD
xfer_fig() {
    local name=$1 field=$2
    shift 2
    xfer_run "$@"
    printf -v "$name" '%s' "$(jq ".results[0].$field" <<<"$PAIR_OUT")"
}

# floor_fig NAME MSGS [ARG...]: tcp_floor bw of 512 KiB messages, polling like xfer_perf;
# NAME = its MB/s
floor_fig() {
    local name=$1 msgs=$2
    shift 2
    echo "# tcp_floor -s 512k -n $msgs --wait poll $* ..." >&2
    run_pair "tcp_floor_${name}" "$RUN_TIMEOUT" "$FLOOR" -p "$PORT" -- \
        "$FLOOR" -p "$PORT" -s 512k -n "$msgs" --wait poll --json "$@" 127.0.0.1 ||
        die "tcp_floor $* failed"
    printf -v "$name" '%s' "$(jq '.mbps' <<<"$PAIR_OUT")"
}

# ucx_fig NAME TEST SIZE ITERS: ucx_perftest with UCX_TLS=sm; a latency's median or a
# bandwidth in MB of 10^6 bytes
ucx_fig() {
    local name=$1 test=$2 size=$3 iters=$4 line
    echo "# ucx_perftest -t $test -s $size -n $iters (UCX_TLS=sm) ..." >&2
    run_pair "ucx_sm_${test}_$size" "$RUN_TIMEOUT" env UCX_TLS=sm ucx_perftest -p "$PORT" -- \
        env UCX_TLS=sm ucx_perftest 127.0.0.1 -p "$PORT" -t "$test" -s "$size" -n "$iters" \
        -f -v || die "ucx_perftest $test $size failed"
    line=$(awk '/^ *[0-9]+,/ {v = $0} END {print v}' <<<"$PAIR_OUT")
    [ -n "$line" ] || die "ucx_perftest -t $test -s $size printed no CSV line"
    if [[ $test == *_lat ]]; then
        printf -v "$name" '%s' "$(cut -d, -f2 <<<"$line")"
    else
        printf -v "$name" '%s' "$(awk -F, -v mb="$UCX_MB" '{print $6 * mb}' <<<"$line")"
    fi
}

# Each figure is the median of ROUNDS rounds; a round runs every figure once, the runs of each
# comparison one after the other and in the other order in every other round, so that a
# change in the machine's state (on a VM, which physical cores the two processes get) reaches
# both sides of a ratio alike.
FIGS=(SHM_LAT UCX_LAT TCP_LAT SHM_BW UCX_BW TCP_BW SHM_PUT SHM_PUT_CMA UCX_PUT TCP_PUT
      SHM_POST TCP_POST SHM_B128 TCP_B128 SHM_B128_LAT TCP_B128_LAT SHM_B128_NOT TCP_B128_NOT
      SHM_P512 TCP_P512 FLOOR_ONE FLOOR_SCAT TCP_B1 TCP_P512_ACK SHM_B128_W2 SHM_P512_W2
      TCP_B128_W2 TCP_P512_W2 TCP_B128_COPY)
# each aim's ratio is taken within a round, and the median of those is judged
RATIOS=(SHM_LAT/UCX_LAT SHM_LAT/TCP_LAT SHM_BW/UCX_BW SHM_BW/TCP_BW SHM_PUT/UCX_PUT
        SHM_PUT/TCP_PUT SHM_B128/SHM_P512 TCP_B128/TCP_P512 FLOOR_SCAT/FLOOR_ONE
        TCP_B1/TCP_P512 TCP_P512_ACK/TCP_P512 TCP_B128/TCP_B1 SHM_B128_W2/SHM_P512_W2
        TCP_B128_W2/TCP_P512_W2 TCP_B128/TCP_B128_COPY)
# b128_fig T TL: 128 x 4 KiB with a notification over TL: T_B128, its latency and the
# notification's
b128_fig() {
    xfer_fig "$1_B128" bw_average_mbps "$2" batch_put 4096 "$BATCH_ITERS" -b 128
    printf -v "$1_B128_LAT" '%s' "$(jq '.results[0].t_avg_usec' <<<"$PAIR_OUT")"
    printf -v "$1_B128_NOT" '%s' "$(jq '.results[0].notify_avg_usec' <<<"$PAIR_OUT")"
}
for ((round = 1; round <= ROUNDS; round++)); do
    echo "# round $round of $ROUNDS" >&2
    # ---- 1. shm against UCX's sm and xfer's tcp ----------------------------------------------------
    round_pair "xfer_fig SHM_LAT t_typical_usec shm tag_lat 8 $LAT_ITERS" \
               "ucx_fig UCX_LAT tag_lat 8 $LAT_ITERS" \
               "xfer_fig TCP_LAT t_typical_usec tcp tag_lat 8 $LAT_ITERS"
    round_pair "xfer_fig SHM_BW bw_average_mbps shm tag_bw 1048576 $BW_ITERS" \
               "ucx_fig UCX_BW tag_bw 1048576 $BW_ITERS" \
               "xfer_fig TCP_BW bw_average_mbps tcp tag_bw 1048576 $BW_ITERS"
    round_pair "xfer_fig SHM_PUT bw_average_mbps shm put_bw 67108864 $BIG_ITERS" \
               "xfer_fig SHM_PUT_CMA bw_average_mbps shm put_bw 67108864 $BIG_ITERS -m host" \
               "ucx_fig UCX_PUT ucp_put_bw 67108864 $BIG_ITERS" \
               "xfer_fig TCP_PUT bw_average_mbps tcp put_bw 67108864 $BIG_ITERS"

    # ---- 2. batches ---------------------------------------------------------------------------------
    for tl in shm tcp; do
        T=${tl^^}
        xfer_fig "${T}_POST" post_usec_per_desc "$tl" batch_put 4096 "$((BATCH_ITERS / 8))" -b 1024
        round_pair "b128_fig $T $tl" \
                   "xfer_fig ${T}_P512 bw_average_mbps $tl put_bw 524288 $BATCH_ITERS -w 1"
        LOG_TAG=w2 xfer_fig "${T}_B128_W2" bw_average_mbps "$tl" batch_put 4096 \
            "$BATCH_ITERS" -b 128 -w 2
        LOG_TAG=w2 xfer_fig "${T}_P512_W2" bw_average_mbps "$tl" put_bw 524288 \
            "$BATCH_ITERS" -w 2
    done
    # where tcp's batch loses to its put: a batch completes when its data has landed, a put
    # when the socket has taken it (one put at a time still streams; one batch at a time
    # waits for the last bytes to be read and answered) - the same 512 KiB as one block, and
    # puts that complete when landed (XFER_TCP_PUT_ACK=y) - and then what 128 blocks cost
    xfer_fig TCP_B1 bw_average_mbps tcp batch_put 524288 "$BATCH_ITERS" -b 1
    XFER_TCP_PUT_ACK=y LOG_TAG=ack xfer_fig TCP_P512_ACK bw_average_mbps tcp put_bw 524288 \
        "$BATCH_ITERS" -w 1
    # a batch's blocks leave by splice, the sender's copy saved (a put's cannot: it completes
    # when the socket has it); the same batches copied
    XFER_TCP_SPLICE=n LOG_TAG=copy xfer_fig TCP_B128_COPY bw_average_mbps tcp batch_put 4096 \
        "$BATCH_ITERS" -b 128
    floor_fig FLOOR_SCAT "$BATCH_ITERS" --scatter 4096
    floor_fig FLOOR_ONE "$BATCH_ITERS"

    for v in "${FIGS[@]}"; do
        [[ ${!v} =~ ^[0-9.e+-]+$ ]] || die "could not read $v (got '${!v}')"
        ROUND_FIGS[$v]+="${!v} "
    done
    for r in "${RATIOS[@]}"; do
        a=${r%/*} b=${r#*/}
        ROUND_FIGS[R_${a}_$b]+="$(awk -v a="${!a}" -v b="${!b}" 'BEGIN {print (b > 0) ? a / b : 0}') "
    done
done

for v in "${FIGS[@]}"; do
    round_median "$v"
    export "${v}_RANGE"
done
for r in "${RATIOS[@]}"; do
    a=${r%/*} b=${r#*/}
    round_median "R_${a}_$b"
    export "R_${a}_$b" "R_${a}_${b}_RANGE"
done

# ---- 3. the sweep --------------------------------------------------------------------------------
echo "transport,block,batch,bw_mbps,t_avg_usec,notify_avg_usec,post_usec_per_desc" >"$CSV"
if [ "$SWEEP" = 1 ]; then
    for tl in shm tcp; do
        echo "# xfer_perf -x $tl -t batch_put -a ..." >&2
        run_pair "xfer_${tl}_batch_sweep" "$RUN_TIMEOUT" "$PERF" -x "$tl" -p "$PORT" -- \
            "$PERF" -x "$tl" -t batch_put -a --json -m xfer -p "$PORT" 127.0.0.1 ||
            die "xfer_perf -x $tl -t batch_put -a failed"
        jq -r --arg tl "$tl" '.results[] | [$tl, .bytes, .batch, .bw_average_mbps,
                              .t_avg_usec, .notify_avg_usec, .post_usec_per_desc] | @csv' \
            <<<"$PAIR_OUT" | tr -d '"' >>"$CSV"
    done
fi

# ---- the figures and the aims -------------------------------------------------------------------
{
rounds_header
awk -v sl="$SHM_LAT" -v ul="$UCX_LAT" -v tl="$TCP_LAT" -v sb="$SHM_BW" -v ub="$UCX_BW" \
    -v tb="$TCP_BW" -v sp="$SHM_PUT" -v spc="$SHM_PUT_CMA" -v up="$UCX_PUT" -v tp="$TCP_PUT" \
    -v spost="$SHM_POST" -v tpost="$TCP_POST" -v sb128="$SHM_B128" -v tb128="$TCP_B128" \
    -v sb128l="$SHM_B128_LAT" -v tb128l="$TCP_B128_LAT" -v sb128n="$SHM_B128_NOT" \
    -v tb128n="$TCP_B128_NOT" -v sp512="$SHM_P512" -v tp512="$TCP_P512" -v cores="$(nproc)" \
    -v f1="$FLOOR_ONE" -v fs="$FLOOR_SCAT" -v tb1="$TCP_B1" -v tp512a="$TCP_P512_ACK" \
    -v sb128w="$SHM_B128_W2" -v sp512w="$SHM_P512_W2" -v tb128w="$TCP_B128_W2" \
    -v tp512w="$TCP_P512_W2" -v tb128c="$TCP_B128_COPY" -v rounds="$ROUNDS" -v aim_w=46 "$AWK_AIMS"'
function fig(run, value, unit, name) {
    printf "%-52s %12.3f %-5s %s\n", run, value, unit, ENVIRON[name "_RANGE"]
}
# a ratio that is no aim (MB/s): a, b, the median of a / b over the rounds (R_<key>), its range
function part(label, a, b, key) {
    printf "%-46s %10.3f %10.3f %-5s %7.2f  (rounds %s)\n", label, a, b, "MB/s",
           ENVIRON["R_" key], ENVIRON["R_" key "_RANGE"]
}
BEGIN {
    printf "# same host (%d cores): xfer shm vs ucx_perftest UCX_TLS=sm vs xfer tcp; batches\n", cores
    printf "%-52s %12s %-5s %s\n", "run", "figure", "unit", "rounds"
    fig("xfer shm tag_lat 8 B median", sl, "usec", "SHM_LAT")
    fig("ucx_perftest sm tag_lat 8 B median", ul, "usec", "UCX_LAT")
    fig("xfer tcp tag_lat 8 B median", tl, "usec", "TCP_LAT")
    fig("xfer shm tag_bw 1 MiB", sb, "MB/s", "SHM_BW")
    fig("ucx_perftest sm tag_bw 1 MiB", ub, "MB/s", "UCX_BW")
    fig("xfer tcp tag_bw 1 MiB", tb, "MB/s", "TCP_BW")
    fig("xfer shm put_bw 64 MiB", sp, "MB/s", "SHM_PUT")
    fig("xfer shm put_bw 64 MiB, -m host (CMA)", spc, "MB/s", "SHM_PUT_CMA")
    fig("ucx_perftest sm ucp_put_bw 64 MiB", up, "MB/s", "UCX_PUT")
    fig("xfer tcp put_bw 64 MiB", tp, "MB/s", "TCP_PUT")
    fig("shm batch_put 1024 x 4 KiB: post per descriptor", spost, "usec", "SHM_POST")
    fig("tcp batch_put 1024 x 4 KiB: post per descriptor", tpost, "usec", "TCP_POST")
    fig("shm batch_put 128 x 4 KiB + notify", sb128, "MB/s", "SHM_B128")
    fig("  its batch latency (post to completion), avg", sb128l, "usec", "SHM_B128_LAT")
    fig("  its notification at the target (from post), avg", sb128n, "usec", "SHM_B128_NOT")
    fig("shm put_bw 512 KiB -w 1", sp512, "MB/s", "SHM_P512")
    fig("tcp batch_put 128 x 4 KiB + notify", tb128, "MB/s", "TCP_B128")
    fig("  its batch latency (post to completion), avg", tb128l, "usec", "TCP_B128_LAT")
    fig("  its notification at the target (from post), avg", tb128n, "usec", "TCP_B128_NOT")
    fig("tcp put_bw 512 KiB -w 1", tp512, "MB/s", "TCP_P512")
    fig("tcp batch_put 1 x 512 KiB + notify", tb1, "MB/s", "TCP_B1")
    fig("tcp put_bw 512 KiB -w 1, XFER_TCP_PUT_ACK=y", tp512a, "MB/s", "TCP_P512_ACK")
    fig("tcp batch_put 128 x 4 KiB + notify, XFER_TCP_SPLICE=n", tb128c, "MB/s", "TCP_B128_COPY")
    fig("shm batch_put 128 x 4 KiB + notify -w 2", sb128w, "MB/s", "SHM_B128_W2")
    fig("shm put_bw 512 KiB -w 2", sp512w, "MB/s", "SHM_P512_W2")
    fig("tcp batch_put 128 x 4 KiB + notify -w 2", tb128w, "MB/s", "TCP_B128_W2")
    fig("tcp put_bw 512 KiB -w 2", tp512w, "MB/s", "TCP_P512_W2")
    fig("tcp_floor 512 KiB into 128 scattered 4 KiB blocks", fs, "MB/s", "FLOOR_SCAT")
    fig("tcp_floor 512 KiB into one buffer", f1, "MB/s", "FLOOR_ONE")
    printf "\n# the aims: a, b: the figures above; ratio: the median of the rounds\x27 a / b (their\n"
    printf "# range after the verdict)\n"
    aims_header()
    aim("shm tag_lat 8 B: xfer shm / ucx sm", sl, ul, "usec", "<=", 1.0, ENVIRON["R_SHM_LAT_UCX_LAT"], ENVIRON["R_SHM_LAT_UCX_LAT_RANGE"])
    aim("shm tag_lat 8 B: xfer shm / xfer tcp", sl, tl, "usec", "<=", 0.333, ENVIRON["R_SHM_LAT_TCP_LAT"], ENVIRON["R_SHM_LAT_TCP_LAT_RANGE"])
    aim("tag_bw 1 MiB: xfer shm / ucx sm", sb, ub, "MB/s", ">=", 1.0, ENVIRON["R_SHM_BW_UCX_BW"], ENVIRON["R_SHM_BW_UCX_BW_RANGE"])
    aim("tag_bw 1 MiB: xfer shm / xfer tcp", sb, tb, "MB/s", ">=", 3.0, ENVIRON["R_SHM_BW_TCP_BW"], ENVIRON["R_SHM_BW_TCP_BW_RANGE"])
    aim("put_bw 64 MiB: xfer shm / ucx sm", sp, up, "MB/s", ">=", 1.0, ENVIRON["R_SHM_PUT_UCX_PUT"], ENVIRON["R_SHM_PUT_UCX_PUT_RANGE"])
    aim("put_bw 64 MiB: xfer shm / xfer tcp", sp, tp, "MB/s", ">=", 3.0, ENVIRON["R_SHM_PUT_TCP_PUT"], ENVIRON["R_SHM_PUT_TCP_PUT_RANGE"])
    aim("shm: post per descriptor (1024 x 4 KiB)", spost, 1, "usec", "<=", 0.5)
    aim("tcp: post per descriptor (1024 x 4 KiB)", tpost, 1, "usec", "<=", 0.5)
    aim("shm: 128 x 4 KiB + notify / one 512 KiB put", sb128, sp512, "MB/s", ">=", 0.9, ENVIRON["R_SHM_B128_SHM_P512"], ENVIRON["R_SHM_B128_SHM_P512_RANGE"])
    aim("tcp: 128 x 4 KiB + notify / one 512 KiB put", tb128, tp512, "MB/s", ">=", 0.9, ENVIRON["R_TCP_B128_TCP_P512"], ENVIRON["R_TCP_B128_TCP_P512_RANGE"])
    aim("shm: the same, two in flight (-w 2)", sb128w, sp512w, "MB/s", ">=", 0.9, ENVIRON["R_SHM_B128_W2_SHM_P512_W2"], ENVIRON["R_SHM_B128_W2_SHM_P512_W2_RANGE"])
    aim("tcp: the same, two in flight (-w 2)", tb128w, tp512w, "MB/s", ">=", 0.9, ENVIRON["R_TCP_B128_W2_TCP_P512_W2"], ENVIRON["R_TCP_B128_W2_TCP_P512_W2_RANGE"])
    printf "\n# the floor under the tcp batch aims, without xfer: plain sockets, the same blocks\n"
    part("tcp_floor: 128 scattered 4 KiB / one buffer", fs, f1, "FLOOR_SCAT_FLOOR_ONE")
    printf "\n# the tcp batch aim taken apart: completion when landed, then the blocks\n"
    part("tcp: 1 x 512 KiB + notify / one 512 KiB put", tb1, tp512, "TCP_B1_TCP_P512")
    part("tcp: put acked when landed / put", tp512a, tp512, "TCP_P512_ACK_TCP_P512")
    part("tcp: 128 x 4 KiB / 1 x 512 KiB, both + notify", tb128, tb1, "TCP_B128_TCP_B1")
    part("tcp: 128 x 4 KiB, blocks spliced / copied", tb128, tb128c, "TCP_B128_TCP_B128_COPY")
}'
} | tee "$TXT"

# ---- the plot -----------------------------------------------------------------------------------
plot_script() {
    local i=0 lines=() tl b dash
    for tl in shm tcp; do
        dash=1
        [ "$tl" = tcp ] && dash=2
        for b in 1 16 256 1024; do
            awk -F, -v tl="$tl" -v b="$b" 'NR > 1 && $1 == tl && $3 == b {print $2, $4}' \
                "$CSV" >"$LOGDIR/$tl.$b.dat"
            [ -s "$LOGDIR/$tl.$b.dat" ] || continue
            lines+=("'$LOGDIR/$tl.$b.dat' using 1:2 with linespoints lw 2 dt $dash \
lc $((i % 4 + 1)) title '$tl, $b per batch'")
            i=$((i + 1))
        done
        i=0
    done
    cat <<GNUPLOT
set terminal svg size 1000,620 dynamic noenhanced font 'sans,12' background rgb 'white'
set output '$SVG'
set title 'xfer_perf batch_put, one batch in flight, 16-byte notification: shm (solid), tcp \
loopback (dashed), $(nproc) cores'
set logscale xy
set grid xtics ytics mytics lc rgb '#dddddd'
set key bottom right box opaque
set xlabel 'block size (bytes)'
set ylabel 'MB/s (10^6 bytes)'
set xtics ("4k" 4096, "16k" 16384, "64k" 65536, "256k" 262144, "1m" 1048576, "4m" 4194304, \
"16m" 16777216, "64m" 67108864)
plot $(IFS=,; echo "${lines[*]}")
GNUPLOT
}

echo
echo "# table: $TXT; sweep: $CSV"
if [ "$SWEEP" != 1 ]; then
    echo "# plot skipped: SWEEP=0"
elif ! command -v gnuplot >/dev/null; then
    echo "# plot skipped: gnuplot not found (apt-get install gnuplot-nox)"
else
    plot_script >"$LOGDIR/batch.gp"
    gnuplot "$LOGDIR/batch.gp" || die "gnuplot failed"
    echo "# plot: $SVG"
fi
echo "# bench_shm took $SECONDS s"
