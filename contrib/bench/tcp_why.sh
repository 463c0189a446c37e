#!/usr/bin/env bash
# tcp_why.sh [BUILD_DIR]: why ucx_perftest over tcp (UCX_TLS=tcp) goes as fast as xfer on
# loopback, and where the bound lies on this host. It measures, on loopback:
#   - ucx_perftest tag_bw 1 MiB with UCX_NET_DEVICES=lo against all devices (UCX then spreads a
#     rendezvous over every tcp device: multi-rail), with protocols v1 (the default of UCX 1.13)
#     and v2 (UCX_PROTO_ENABLE=y); tag_lat 8 B with -E poll (the default) against -E sleep;
#   - which protocol UCX picks for 8 B and 1 MiB tagged sends (ucx_info -e for v1,
#     UCX_PROTO_INFO=y for v2), printed before the table;
#   - iperf3 with its defaults, with -l 1M and with -P 2;
#   - xfer_perf -x tcp tag_bw 1 MiB and tag_lat 8 B;
#   - tcp_floor (plain sockets, no library): bw 1 MiB with -P 1 and -P 2, with the kernel's
#     autotuned socket buffers and with 4 MiB ones, with --zerocopy, and waiting by blocking,
#     by busy polling and by epoll_wait; lat 8 B waiting in those three ways;
#   - pinned: tag_bw, bw and lat with the two processes on CPUs 0 and 1, and the sleeping
#     latencies with both on CPU 0 (a wakeup on another CPU costs more than one on the same).
# Each variant runs REPS times, the variants taking turns (each round starting one further
# along), so that the drift of a shared machine hits them alike; the table gives the median,
# the fastest and slowest run, and the ratio to the reference row of the section (marked *).
# A tool, not a test: it exits 0 whatever the figures, 1 when a run gave no figure (the table
# says which) or something is missing.
#
# BUILD_DIR (or $XFER_BUILD_DIR) is a configured and built tree; default ./build. PERF_BIN and
# FLOOR_BIN override the paths of xfer_perf and tcp_floor (not XFER_*: xfer warns of unknown
# XFER_ variables). Knobs: REPS (5), BENCH_PORT (20000: one port per run from there, skipping
# ports in use), BW_ITERS (2000), LAT_ITERS (20000), IPERF_SECS (3). Needs iperf3, ucx-utils
# (ucx_perftest, ucx_info), jq, ss (iproute2) and taskset (util-linux). REPS=5 takes 4 to 6
# minutes on 2 cores.
set -euo pipefail

BUILD=${1:-${XFER_BUILD_DIR:-./build}}
PERF=${PERF_BIN:-$BUILD/contrib/xfer_perf}
FLOOR=${FLOOR_BIN:-$BUILD/contrib/bench/tcp_floor}
REPS=${REPS:-5}
PORT=${BENCH_PORT:-20000}
BW_ITERS=${BW_ITERS:-2000}
LAT_ITERS=${LAT_ITERS:-20000}
IPERF_SECS=${IPERF_SECS:-3}
BW_SIZE=1048576
LAT_SIZE=8
# ucx_perftest's MB is 2^20 bytes; everything here is printed in 10^6
UCX_MB=1.048576

BENCH_NAME=tcp_why
# shellcheck source=contrib/bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

for v in REPS BW_ITERS LAT_ITERS IPERF_SECS PORT; do
    [[ ${!v} =~ ^[1-9][0-9]*$ ]] || die "$v must be a positive integer (got '${!v}')"
done
[ -x "$PERF" ] || die "no $PERF: build first (make -C $BUILD), or pass the build directory"
[ -x "$FLOOR" ] || die "no $FLOOR: build first (make -C $BUILD), or pass the build directory"
for tool in iperf3 ucx_perftest ucx_info jq ss taskset; do
    command -v "$tool" >/dev/null ||
        die "$tool not found (apt-get install iperf3 ucx-utils jq iproute2 util-linux)"
done

# Every UCX run starts from the same environment: tcp only, nothing else inherited.
UCX=(env -u UCX_NET_DEVICES -u UCX_PROTO_ENABLE -u UCX_PROTO_INFO UCX_TLS=tcp)

# Move PORT past ports something else listens on: start_server would take that for our server.
skip_busy_ports() {
    while [ -n "$(ss -Hltn "sport = :$PORT")" ]; do
        next_port
    done
}

# The last server started has served its one client: let it leave (or end it), so that it
# takes no CPU from the next run, and move to the next free port.
end_server() {
    local pid=${SERVERS[-1]}

    for _ in $(seq 50); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    next_port
    skip_busy_ports
}

# What a client printed when it failed, on stderr (its last 20 lines).
failed() {
    echo "$BENCH_NAME: $1 failed:" >&2
    tail -20 <<<"$2" | sed 's/^/    /' >&2
}

# taskset's prefix for a CPU, or nothing for "-"
pin() { [ "$1" = - ] || echo "taskset -c $1"; }

# ---- one run of each kind: VAL (and for latencies VAL2, the mean) ------------------------------

# ucx_perftest -c for a CPU, or nothing for "-"
ucx_cpu() { [ "$1" = - ] || echo "-c $1"; }

# shellcheck disable=SC2046 # ucx_cpu gives words, or none
ucx_bw() {  # SERVER_CPU CLIENT_CPU ENV_ASSIGNMENTS... (CPU -: not pinned)
    local scpu=$1 ccpu=$2 out
    shift 2
    start_server ucx_perftest 10 "${UCX[@]}" "$@" ucx_perftest -p "$PORT" $(ucx_cpu "$scpu")
    out=$("${UCX[@]}" "$@" ucx_perftest 127.0.0.1 -p "$PORT" -t tag_bw -s "$BW_SIZE" \
          -n "$BW_ITERS" -w 200 $(ucx_cpu "$ccpu") -f -v 2>&1) ||
        { end_server; failed "ucx_perftest tag_bw $*" "$out"; return 1; }
    end_server
    # -f -v: a CSV header, then iterations,lat50,avg_lat,overall_lat,avg_bw,overall_bw,...
    VAL=$(awk -F, -v mb=$UCX_MB '/^[0-9]+,/ {v = $6 * mb} END {print v}' <<<"$out")
}

# shellcheck disable=SC2046
ucx_lat() {  # WAIT_MODE SERVER_CPU CLIENT_CPU ENV_ASSIGNMENTS...
    local mode=$1 scpu=$2 ccpu=$3 out
    shift 3
    start_server ucx_perftest 10 "${UCX[@]}" "$@" ucx_perftest -p "$PORT" -E "$mode" \
        $(ucx_cpu "$scpu")
    out=$("${UCX[@]}" "$@" ucx_perftest 127.0.0.1 -p "$PORT" -t tag_lat -s "$LAT_SIZE" \
          -n "$LAT_ITERS" -E "$mode" $(ucx_cpu "$ccpu") -f -v 2>&1) ||
        { end_server; failed "ucx_perftest tag_lat -E $mode $*" "$out"; return 1; }
    end_server
    # the median, and the overall mean (all iterations' time over their number)
    VAL=$(awk -F, '/^[0-9]+,/ {v = $2} END {print v}' <<<"$out")
    VAL2=$(awk -F, '/^[0-9]+,/ {v = $4} END {print v}' <<<"$out")
}

iperf() {  # IPERF3_CLIENT_OPTIONS...
    local out
    start_server iperf3 10 iperf3 -s -1 --forceflush -p "$PORT"
    out=$(iperf3 -c 127.0.0.1 -p "$PORT" -t "$IPERF_SECS" -J "$@" 2>"$LOGDIR/client.err") ||
        { end_server; failed "iperf3 $*" "$out$(cat "$LOGDIR/client.err")"; return 1; }
    end_server
    VAL=$(jq '.end.sum_received.bits_per_second / 8 / 1e6' <<<"$out")
}

xfer() {  # TEST SIZE ITERS
    local out
    start_server xfer_perf 10 "$PERF" -x tcp -p "$PORT"
    out=$("$PERF" -x tcp -t "$1" -s "$2" -n "$3" --json -p "$PORT" 127.0.0.1 \
          2>"$LOGDIR/client.err") ||
        { end_server; failed "xfer_perf $1" "$out$(cat "$LOGDIR/client.err")"; return 1; }
    end_server
    if [ "$1" = tag_bw ]; then
        VAL=$(jq '.results[0].bw_average_mbps' <<<"$out")
    else
        VAL=$(jq '.results[0].t_typical_usec' <<<"$out")
        VAL2=$(jq '.results[0].t_avg_usec' <<<"$out")
    fi
}

# tcp_floor's figures, and a note of its other ones for the variant being run ($ID)
floor() {  # SERVER_CPU CLIENT_CPU TCP_FLOOR_CLIENT_OPTIONS... (CPU -: not pinned)
    local scpu=$1 ccpu=$2 out
    shift 2
    # shellcheck disable=SC2046 # pin gives words, or none
    start_server tcp_floor 10 $(pin "$scpu") "$FLOOR" -p "$PORT"
    # shellcheck disable=SC2046
    out=$($(pin "$ccpu") "$FLOOR" -p "$PORT" --json "$@" 127.0.0.1 2>"$LOGDIR/client.err") ||
        { end_server; failed "tcp_floor $*" "$out$(cat "$LOGDIR/client.err")"; return 1; }
    end_server
    if [ "$(jq -r .test <<<"$out")" = bw ]; then
        VAL=$(jq .mbps <<<"$out")
    else
        VAL=$(jq .half_rtt_median_usec <<<"$out")
        VAL2=$(jq .half_rtt_avg_usec <<<"$out")
    fi
    jq -r '"cores busy: client \(.cpu_client), server \(.cpu_server)" +
           (if .test == "bw" then "; sndbuf \(.sndbuf) rcvbuf \(.rcvbuf)" else "" end) +
           (if .zerocopy then "; \(.zerocopy_copied) of \(.zerocopy_sends) zero-copy sends" +
            " flagged copied by the kernel" else "" end)' <<<"$out" >"$LOGDIR/note.$ID"
}

# ---- the variants: id, section, label, the run ------------------------------------------------
IDS=()
declare -A SECTION LABEL RUN
variant() { IDS+=("$1"); SECTION[$1]=$2; LABEL[$1]=$3; RUN[$1]=$4; }

BW="-s $BW_SIZE -n $BW_ITERS"
LAT="-T lat -s $LAT_SIZE -n $LAT_ITERS"
variant ucx_lo      bw  "ucx_perftest tag_bw, UCX_NET_DEVICES=lo"   "ucx_bw - - UCX_NET_DEVICES=lo"
variant ucx_all     bw  "ucx_perftest tag_bw, all devices"          "ucx_bw - -"
variant ucx_lo_v2   bw  "ucx_perftest tag_bw, lo, PROTO_ENABLE=y" \
                        "ucx_bw - - UCX_NET_DEVICES=lo UCX_PROTO_ENABLE=y"
variant ucx_all_v2  bw  "ucx_perftest tag_bw, all, PROTO_ENABLE=y"  "ucx_bw - - UCX_PROTO_ENABLE=y"
variant xfer_bw     bw  "xfer_perf -x tcp tag_bw"                   "xfer tag_bw $BW_SIZE $BW_ITERS"
variant iperf       bw  "iperf3 (128 KiB writes)"                   "iperf"
variant iperf_l1m   bw  "iperf3 -l 1M"                              "iperf -l 1M"
variant iperf_p2    bw  "iperf3 -P 2"                               "iperf -P 2"
variant floor_p1    bw  "tcp_floor bw -P 1"                         "floor - - $BW"
variant floor_p2    bw  "tcp_floor bw -P 2"                         "floor - - $BW -P 2"
variant floor_p1_4m bw  "tcp_floor bw -P 1, 4 MiB socket buffers" \
                        "floor - - $BW --sndbuf 4m --rcvbuf 4m"
variant floor_p2_4m bw  "tcp_floor bw -P 2, 4 MiB socket buffers" \
                        "floor - - $BW -P 2 --sndbuf 4m --rcvbuf 4m"
variant floor_zc    bw  "tcp_floor bw -P 1 --zerocopy"              "floor - - $BW --zerocopy"
variant floor_poll  bw  "tcp_floor bw -P 1 --wait poll"             "floor - - $BW --wait poll"
variant floor_epoll bw  "tcp_floor bw -P 1 --wait epoll"            "floor - - $BW --wait epoll"
if [ "$(nproc)" -ge 2 ]; then
    variant ucx_lo2     bw  "ucx_perftest tag_bw, lo, 2 CPUs"       "ucx_bw 0 1 UCX_NET_DEVICES=lo"
    variant floor_p1c2  bw  "tcp_floor bw -P 1, 2 CPUs"             "floor 0 1 $BW"
    variant floor_poll2 bw  "tcp_floor bw -P 1 --wait poll, 2 CPUs" "floor 0 1 $BW --wait poll"
fi
variant ucx_poll    lat "ucx_perftest tag_lat, lo, -E poll" \
                        "ucx_lat poll - - UCX_NET_DEVICES=lo"
variant ucx_sleep   lat "ucx_perftest tag_lat, lo, -E sleep" \
                        "ucx_lat sleep - - UCX_NET_DEVICES=lo"
variant ucx_sleep1  lat "ucx_perftest tag_lat, lo, -E sleep, 1 CPU" \
                        "ucx_lat sleep 0 0 UCX_NET_DEVICES=lo"
variant xfer_lat    lat "xfer_perf -x tcp tag_lat" \
                        "xfer tag_lat $LAT_SIZE $LAT_ITERS"
variant fl_block    lat "tcp_floor lat --wait block"                "floor - - $LAT --wait block"
variant fl_poll     lat "tcp_floor lat --wait poll"                 "floor - - $LAT --wait poll"
variant fl_epoll    lat "tcp_floor lat --wait epoll"                "floor - - $LAT --wait epoll"
variant fl_block1   lat "tcp_floor lat --wait block, 1 CPU"         "floor 0 0 $LAT --wait block"
if [ "$(nproc)" -ge 2 ]; then
    variant fl_block2 lat "tcp_floor lat --wait block, 2 CPUs"      "floor 0 1 $LAT --wait block"
    variant fl_poll2  lat "tcp_floor lat --wait poll, 2 CPUs"       "floor 0 1 $LAT --wait poll"
fi
REF_BW=floor_p1
REF_LAT=fl_block

skip_busy_ports

# ---- what UCX chooses --------------------------------------------------------------------------

# The rows of UCX_PROTO_INFO's table of ucp_tag_send*() from host memory that hold 8 B and 1 MiB.
proto_info() {  # ENV_ASSIGNMENTS...
    local out
    start_server ucx_perftest 10 "${UCX[@]}" UCX_PROTO_ENABLE=y "$@" ucx_perftest -p "$PORT"
    out=$("${UCX[@]}" UCX_PROTO_ENABLE=y UCX_PROTO_INFO=y "$@" ucx_perftest 127.0.0.1 \
          -p "$PORT" -t tag_bw -s "$BW_SIZE" -n 20 -w 2 -f -v 2>&1) ||
        { end_server; failed "ucx_perftest with UCX_PROTO_INFO=y" "$out"; return 0; }
    end_server
    awk -v sizes="$LAT_SIZE $BW_SIZE" '
        BEGIN { n = split(sizes, want, " ") }
        /\| / && /ep_cfg/ { intable = ($0 ~ /ucp_tag_send\*\(\) from host memory/); next }
        intable && /\|/ {
            line = $0; sub(/^[^|]*\|/, "", line); split(line, f, "|")
            for (i in f) { gsub(/^ +| +$/, "", f[i]) }
            if (split(f[1], r, /\.\./) != 2) { next }
            for (k = 1; k <= n; k++) {
                if ((want[k] >= r[1] + 0) && ((r[2] == "inf") || (want[k] <= r[2] + 0))) {
                    printf "#     %7s B: %s (%s) [its range %s]\n", want[k], f[2], f[3], f[1]
                }
            }
        }' <<<"$out"
}

# The tcp devices UCX sees, their addresses and the kernel's route to each.
ucx_devices() {
    local dev addr route
    for dev in $(ucx_info -d 2>/dev/null |
                 awk '/Transport: tcp/ {t = 1; next} t && /Device:/ {print $3; t = 0}'); do
        addr=$(ip -4 -o addr show dev "$dev" 2>/dev/null | awk '{print $4; exit}')
        addr=${addr%/*}
        route=$( [ -z "$addr" ] || ip -o route get "$addr" 2>/dev/null |
                 awk '{print $1, "via dev", $4; exit}')
        printf '%s (%s, %s)  ' "$dev" "${addr:-no IPv4}" "${route:-no route}"
    done
}

echo "# tcp_why: loopback, $(nproc) cores, kernel $(uname -r)," \
     "$(ucx_info -v | awk '/Version/ {print "UCX", $3}'), REPS=$REPS; MB = 10^6 bytes"
echo "# load average at the start: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# UCX tcp devices (address, kernel route): $(ucx_devices)"
echo "# UCX's choices with protocols v1 (ucx_info -u t -e: lanes, tag_send thresholds):"
for d in lo all; do
    envs=()
    [ $d = all ] || envs=(UCX_NET_DEVICES=lo)
    echo "#   $d:"
    "${UCX[@]}" "${envs[@]}" ucx_info -u t -e 2>&1 |
        awk '/lane\[|tag_send:|rma_bw:/ {sub(/^# */, ""); print "#     " $0}'
done
echo "# UCX's choices with UCX_PROTO_ENABLE=y (UCX_PROTO_INFO=y, tagged sends from host memory):"
echo "#   lo:"
proto_info UCX_NET_DEVICES=lo
echo "#   all:"
proto_info

# ---- the runs ----------------------------------------------------------------------------------
FAILS=0
n=${#IDS[@]}
for ((rep = 0; rep < REPS; rep++)); do
    t0=$SECONDS
    for ((k = 0; k < n; k++)); do
        ID=${IDS[(k + rep) % n]}
        VAL='' VAL2=''
        # shellcheck disable=SC2086 # RUN holds a function and its words
        if ${RUN[$ID]} && [[ $VAL =~ ^[0-9.e+-]+$ ]]; then
            echo "$VAL" >>"$LOGDIR/val.$ID.1"
            [ -z "$VAL2" ] || echo "$VAL2" >>"$LOGDIR/val.$ID.2"
        else
            echo "$BENCH_NAME: ${LABEL[$ID]}: run $((rep + 1)) gave no figure" >&2
            FAILS=$((FAILS + 1))
        fi
    done
    echo "# round $((rep + 1))/$REPS done in $((SECONDS - t0)) s" >&2
done

# ---- the table ---------------------------------------------------------------------------------

# stats FILE: median min max count
stats() {
    [ -s "$1" ] || { echo "- - - 0"; return; }
    sort -g "$1" | awk '{v[NR] = $1} END {
        print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2, v[1], v[NR], NR }'
}

row() {  # ID SERIES NAME UNIT REF_ID
    local id=$1 series=$2 name=$3 unit=$4 ref=$5 med lo hi cnt rmed mark=' '
    read -r med lo hi cnt <<<"$(stats "$LOGDIR/val.$id.$series")"
    read -r rmed _ <<<"$(stats "$LOGDIR/val.$ref.$series")"
    [ "$id" = "$ref" ] && mark='*'
    awk -v name="$name" -v mark="$mark" -v med="$med" -v lo="$lo" -v hi="$hi" -v cnt="$cnt" \
        -v reps="$REPS" -v unit="$unit" -v rmed="$rmed" 'BEGIN {
        if (cnt == 0) {
            printf "%-48s %9s %9s %9s %-5s %6s  %5s\n", name, "-", "-", "-", unit, "-", "0/" reps
            exit
        }
        f = (unit == "MB/s") ? "%9.0f" : "%9.2f"
        ratio = (rmed == "-" || rmed == 0) ? "-" : sprintf("%.2f", med / rmed)
        printf "%-48s " f " " f " " f " %-5s %6s%s %5s\n", name, med, lo, hi, unit, ratio, mark,
               cnt "/" reps
    }'
}

printf '%-48s %9s %9s %9s %-5s %6s  %5s\n' variant median min max unit ratio runs
echo "# bandwidth, 1 MiB messages (iperf3: a byte stream); ratio to tcp_floor bw -P 1"
for id in "${IDS[@]}"; do
    [ "${SECTION[$id]}" != bw ] || row "$id" 1 "${LABEL[$id]}" MB/s "$REF_BW"
done
echo "# latency, 8 B, half a round trip, median; ratio to tcp_floor lat --wait block"
for id in "${IDS[@]}"; do
    [ "${SECTION[$id]}" != lat ] || row "$id" 1 "${LABEL[$id]}" usec "$REF_LAT"
done
echo "# latency, mean (ucx_perftest: its overall latency, all iterations)"
for id in "${IDS[@]}"; do
    [ "${SECTION[$id]}" != lat ] || row "$id" 2 "${LABEL[$id]}" usec "$REF_LAT"
done
echo "# tcp_floor, its last run of each: each side's CPU time over the run's time (the cores it"
echo "# kept busy; the loopback receive work counts mostly to the sender) and the socket buffers"
echo "# the kernel reports at the end"
for id in "${IDS[@]}"; do
    [ ! -s "$LOGDIR/note.$id" ] || printf '#   %-42s %s\n' "${LABEL[$id]}:" "$(<"$LOGDIR/note.$id")"
done
echo "# 1 CPU: both processes on CPU 0; 2 CPUs: on CPUs 0 and 1 (taskset, ucx_perftest -c)"
echo "# load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
[ "$FAILS" -eq 0 ] || die "$FAILS run(s) gave no figure (see above)"
