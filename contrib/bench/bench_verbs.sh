#!/usr/bin/env bash
# bench_verbs.sh [BUILD_DIR]: xfer's verbs transport against perftest, on one RDMA device, in
# one run (one guest boot). Prints the figures, the ratios and whether the aims are met:
#   put_bw  64 KiB   xfer_perf -t put_bw   vs ib_write_bw -s 65536    xfer >= 0.9 x perftest
#   put_lat 8 B      xfer_perf -t put_lat  vs ib_write_lat -s 8       xfer <= 1.2 x perftest
#   tag_lat 8 B      xfer_perf -t tag_lat  vs ib_send_lat -s 8        xfer <= 1.2 x perftest
#   tensor_bw, tensor_lat at 8 B, 64 KiB, 1 MiB   xfer_perf -t tensor_* vs -t put_* in the
#            same run: tensor_bw >= 0.9 x put_bw at 1 MiB; tensor_lat <= put_lat + tag_lat
#            (a steady-state fetch is one message and one write; put_lat and tag_lat are
#            each one way), with ib_write_bw / ib_write_lat at the same sizes for reference
#   the device's floor (contrib/bench/verbs_floor, raw verbs): the same round trips without
#            xfer - a send, a write, and a fetch's SEND + WRITE WITH IMMEDIATE - beside
#            tag_lat, put_lat and tensor_lat at 8 B, with the tensors (not judged)
# Latencies are half round trips (perftest's *_lat and xfer_perf report the same), medians;
# tensor_lat is one whole fetch (request there, tensor back). xfer_perf runs single-threaded
# with a serialized context (no context lock), as perftest and ucx_perftest do by default;
# put_lat and tag_lat are also run with -T multi (the lock a threaded application pays) and
# printed beside, not judged.
# Each latency pair runs REPEAT times, perftest and xfer_perf alternating, and the median of
# the runs counts: on a shared, emulated machine one run can catch a busy moment of the host.
# The fastest run of each tool is compared too, and the raw-verbs floor of the pair's pattern
# (verbs_floor) runs between them: on Soft-RoCE under emulation whole runs fall into a fast or
# a slow mode, raw verbs included (contrib/README.md), so the medians also count the modes
# each tool drew.
# A tool, not a test: it exits 0 whatever the figures, non-zero only when something fails to run.
#
# Without an RDMA NIC, run it in the Soft-RoCE guest (absolute figures are emulation-bound;
# only the ratios of one run mean anything):
#   contrib/rxe_guest -- contrib/bench/bench_verbs.sh build
# Knobs: BENCH_DEVICE (default: $RXE_GUEST_DEVICE_A or the first device), BENCH_GID_INDEX
# (default: $RXE_GUEST_GID_INDEX_A or 1), BENCH_ADDR (default: $RXE_GUEST_ADDR_A or
# 127.0.0.1), BENCH_PORT (18700), BW_ITERS (2000), LAT_ITERS (5000), ROUNDS (9, at least 9),
# TENSOR (1; 0 skips the tensor figures), TENSOR_ITERS (500), MULTI (1; 0 skips -T multi).
set -euo pipefail

BUILD=${1:-${XFER_BUILD_DIR:-./build}}
PERF=$BUILD/contrib/xfer_perf
DEV=${BENCH_DEVICE:-${RXE_GUEST_DEVICE_A:-$(ibv_devices 2>/dev/null | awk 'NR > 2 {print $1; exit}')}}
GIDX=${BENCH_GID_INDEX:-${RXE_GUEST_GID_INDEX_A:-1}}
ADDR=${BENCH_ADDR:-${RXE_GUEST_ADDR_A:-127.0.0.1}}
PORT=${BENCH_PORT:-18700}
BW_ITERS=${BW_ITERS:-2000}
LAT_ITERS=${LAT_ITERS:-5000}
TENSOR=${TENSOR:-1}
TENSOR_ITERS=${TENSOR_ITERS:-500}
MULTI=${MULTI:-1}
BW_SIZE=65536
LAT_SIZE=8

BENCH_NAME=bench_verbs
# shellcheck source=contrib/bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
REPEAT=$ROUNDS      # lib.sh: 9 or more

[ -x "$PERF" ] || die "no $PERF: build first (make -C $BUILD), or pass the build directory"
[ -n "$DEV" ] || die "no RDMA device (run it in the guest: contrib/rxe_guest -- $0 $BUILD)"
for tool in ib_write_bw ib_write_lat ib_send_lat jq ss; do
    command -v "$tool" >/dev/null || die "$tool not found (apt-get install perftest jq iproute2)"
done
ulimit -l unlimited 2>/dev/null || true
export XFER_VERBS_DEVICE=$DEV XFER_VERBS_GID_INDEX=$GIDX


# perftest prints one result line that starts with the message size. Bandwidth comes from the
# message rate (10^6 messages/s) times the size, so that MB means 10^6 bytes as in xfer_perf
# (perftest's own MB column is 2^20 bytes).
perftest_bw() {
    local out
    out=$("$@" 2>&1) || { echo "$out" >&2; die "$1 failed"; }
    awk -v s=$BW_SIZE '$1 == s && NF >= 5 {print $5 * s}' <<<"$out" | tail -1
}
# columns: #bytes #iterations t_min t_max t_typical t_avg ...
perftest_lat() {
    local out
    out=$("$@" 2>&1) || { echo "$out" >&2; die "$1 failed"; }
    awk -v s=$LAT_SIZE '$1 == s && NF >= 6 {print $5}' <<<"$out" | tail -1
}

xfer_run() {   # xfer_run JQ_FIELD xfer_perf-args...
    local field=$1 json
    shift
    start_server xfer 30 "$PERF" -x verbs -p "$PORT"
    json=$("$PERF" -x verbs "$@" --json -p "$PORT" "$ADDR") || die "xfer_perf $* failed"
    [ "$(jq -r '.transport' <<<"$json")" = verbs ] || die "xfer_perf did not run over verbs"
    jq ".results[0].$field" <<<"$json"
    next_port
}

echo "# bench_verbs: device $DEV (GID index $GIDX), $(nproc) cores, build $BUILD; MB = 10^6 bytes" >&2

echo "# ib_write_bw -s $BW_SIZE -n $BW_ITERS ..." >&2
start_server ib_write_bw 30 \
    ib_write_bw -d "$DEV" -x "$GIDX" -s $BW_SIZE -n "$BW_ITERS" -p "$PORT"
PT_PUT_BW=$(perftest_bw ib_write_bw -d "$DEV" -x "$GIDX" -s $BW_SIZE -n "$BW_ITERS" -p "$PORT" "$ADDR")
next_port
echo "# xfer_perf -t put_bw -s $BW_SIZE -n $BW_ITERS ..." >&2
X_PUT_BW=$(xfer_run bw_average_mbps -t put_bw -s $BW_SIZE -n "$BW_ITERS")

# The device's own floor for the three patterns (contrib/bench/verbs_floor, raw verbs, no xfer):
# what perftest's pairs cannot show, the fetch's pattern - a SEND answered by a WRITE WITH
# IMMEDIATE. REQ_BYTES is the TENSOR_REQUEST xfer_perf sends: a 24-byte header, 16 bytes of
# destination and key length, 20 bytes of rank-1 metadata and the 4-byte key "perf"
# (verbs_wire.h, tensor_wire.h; 92 bytes up to wire version 3); a TAG message of 8 bytes is
# 24 on the wire.
FLOOR=$BUILD/contrib/bench/verbs_floor
REQ_BYTES=64
floor_run() {   # floor_run PATTERN A_BYTES B_BYTES: the median round trip, usec
    local out
    out=$("$FLOOR" -d "$DEV" -x "$GIDX" -n "$LAT_ITERS" "$@" 2>&1) || {
        echo "$out" >&2; die "verbs_floor $* failed"; }
    awk '{for (i = 1; i < NF; i++) if ($i == "rtt_median_usec") print $(i + 1)}' <<<"$out"
}
median() { tr ' ' '\n' | sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
fastest() { tr ' ' '\n' | sort -g | head -1; }

# lat_pair PERFTEST_TOOL XFER_TEST FLOOR_PATTERN...: REPEAT alternating runs; sets PT_LAT,
# X_LAT and (with MULTI=1) XM_LAT, the medians, PT_BEST and X_BEST, the fastest runs, and
# F_LAT and F_BEST, the same for the raw-verbs floor of the pattern, run between them (half
# round trips; 0 without verbs_floor)
lat_pair() {
    local tool=$1 test=$2 pt=() x=() xm=() fl=()
    shift 2
    for r in $(seq "$REPEAT"); do
        echo "# $tool -s $LAT_SIZE -n $LAT_ITERS (run $r of $REPEAT) ..." >&2
        start_server "$tool" 30 \
            "$tool" -d "$DEV" -x "$GIDX" -s $LAT_SIZE -n "$LAT_ITERS" -p "$PORT"
        pt+=("$(perftest_lat "$tool" -d "$DEV" -x "$GIDX" -s $LAT_SIZE -n "$LAT_ITERS" -p "$PORT" \
                "$ADDR")")
        next_port
        echo "# xfer_perf -t $test -s $LAT_SIZE -n $LAT_ITERS (run $r of $REPEAT) ..." >&2
        x+=("$(xfer_run t_typical_usec -t "$test" -s $LAT_SIZE -n "$LAT_ITERS")")
        if [ "$MULTI" = 1 ]; then
            echo "# xfer_perf -T multi -t $test -s $LAT_SIZE -n $LAT_ITERS (run $r of $REPEAT) ..." >&2
            xm+=("$(xfer_run t_typical_usec -T multi -t "$test" -s $LAT_SIZE -n "$LAT_ITERS")")
        fi
        if [ -x "$FLOOR" ]; then
            fl+=("$(floor_run "$@" | awk '{print $1 / 2}')")
        fi
    done
    echo "#   $tool: ${pt[*]}; xfer_perf $test: ${x[*]}; -T multi: ${xm[*]:-not run};" \
         "verbs_floor $* (half): ${fl[*]:-not run}" >&2
    PT_LAT=$(median <<<"${pt[*]}")
    X_LAT=$(median <<<"${x[*]}")
    XM_LAT=$( ((${#xm[@]} > 0)) && median <<<"${xm[*]}" || echo 0)
    PT_BEST=$(fastest <<<"${pt[*]}")
    X_BEST=$(fastest <<<"${x[*]}")
    F_LAT=$( ((${#fl[@]} > 0)) && median <<<"${fl[*]}" || echo 0)
    F_BEST=$( ((${#fl[@]} > 0)) && fastest <<<"${fl[*]}" || echo 0)
}

lat_pair ib_write_lat put_lat write 8 8
PT_PUT_LAT=$PT_LAT X_PUT_LAT=$X_LAT XM_PUT_LAT=$XM_LAT PT_PUT_BEST=$PT_BEST X_PUT_BEST=$X_BEST
F_PUT_LAT=$F_LAT F_PUT_BEST=$F_BEST
lat_pair ib_send_lat tag_lat send 24 24
PT_TAG_LAT=$PT_LAT X_TAG_LAT=$X_LAT XM_TAG_LAT=$XM_LAT PT_TAG_BEST=$PT_BEST X_TAG_BEST=$X_BEST
F_TAG_LAT=$F_LAT F_TAG_BEST=$F_BEST

for v in PT_PUT_BW X_PUT_BW PT_PUT_LAT X_PUT_LAT PT_TAG_LAT X_TAG_LAT PT_PUT_BEST X_PUT_BEST \
         PT_TAG_BEST X_TAG_BEST; do
    [[ ${!v} =~ ^[0-9.e+-]+$ ]] || die "could not read $v (got '${!v}')"
done

awk -v pbw="$PT_PUT_BW" -v xbw="$X_PUT_BW" -v pl="$PT_PUT_LAT" -v xl="$X_PUT_LAT" \
    -v pt="$PT_TAG_LAT" -v xt="$X_TAG_LAT" -v dev="$DEV" -v rep="$REPEAT" \
    -v xml="$XM_PUT_LAT" -v xmt="$XM_TAG_LAT" -v plb="$PT_PUT_BEST" -v xlb="$X_PUT_BEST" \
    -v ptb="$PT_TAG_BEST" -v xtb="$X_TAG_BEST" -v fpl="$F_PUT_LAT" -v fpb="$F_PUT_BEST" \
    -v ftl="$F_TAG_LAT" -v ftb="$F_TAG_BEST" '
function verdict(ok) { return ok ? "met" : "NOT met" }
BEGIN {
    printf "# xfer over verbs vs perftest on %s; MB = 10^6 bytes; latencies: median half\n", dev
    printf "# round trips, the median of %d alternating runs\n", rep
    printf "%-30s %12s %12s %8s %s\n", "figure", "xfer_perf", "perftest", "ratio", "aim"
    printf "%-30s %12.1f %12.1f %8.2f %s\n", "put_bw 65536 B [MB/s]", xbw, pbw, xbw / pbw,
           "xfer >= 0.9 x ib_write_bw: " verdict(xbw >= 0.9 * pbw)
    printf "%-30s %12.2f %12.2f %8.2f %s\n", "put_lat 8 B [usec]", xl, pl, xl / pl,
           "xfer <= 1.2 x ib_write_lat: " verdict(xl <= 1.2 * pl)
    printf "%-30s %12.2f %12.2f %8.2f %s\n", "tag_lat 8 B [usec]", xt, pt, xt / pt,
           "xfer <= 1.2 x ib_send_lat: " verdict(xt <= 1.2 * pt)
    if (xml > 0) {
        printf "%-30s %12.2f %12.2f %8.2f %s\n", "put_lat 8 B, -T multi [usec]", xml, pl,
               xml / pl, "(with the context lock; not judged)"
        printf "%-30s %12.2f %12.2f %8.2f %s\n", "tag_lat 8 B, -T multi [usec]", xmt, pt,
               xmt / pt, "(with the context lock; not judged)"
    }
    # Soft-RoCE under emulation: whole runs fall into a fast or a slow mode, raw verbs too
    # (contrib/README.md), so a median of runs also counts which mode each tool drew.
    printf "# the fastest of the %d runs of each tool: mode against mode when each drew the\n", rep
    printf "# fast one\n"
    printf "%-30s %12.2f %12.2f %8.2f %s\n", "put_lat 8 B, fastest [usec]", xlb, plb, xlb / plb,
           "xfer <= 1.2 x ib_write_lat: " verdict(xlb <= 1.2 * plb)
    printf "%-30s %12.2f %12.2f %8.2f %s\n", "tag_lat 8 B, fastest [usec]", xtb, ptb, xtb / ptb,
           "xfer <= 1.2 x ib_send_lat: " verdict(xtb <= 1.2 * ptb)
    if (fpl > 0) {
        printf "# raw verbs (verbs_floor), run between them: the device with no library, half\n"
        printf "# round trips (not judged)\n"
        printf "%-30s %12s %12s %8s\n", "pattern", "median", "fastest", "ratio"
        printf "%-30s %12.2f %12.2f %8.2f\n", "write 8 B [usec]", fpl, fpb, fpl / fpb
        printf "%-30s %12.2f %12.2f %8.2f\n", "send 24 B [usec]", ftl, ftb, ftl / ftb
    }
}'

[ "$TENSOR" = 1 ] || exit 0

# ---- tensors: the steady state of a fetch against a put of the same size, same run ----------
pt_bw_at() {    # ib_write_bw at size $1
    start_server ib_write_bw 30 ib_write_bw -d "$DEV" -x "$GIDX" -s "$1" -n "$TENSOR_ITERS" -p "$PORT"
    BW_SIZE=$1 perftest_bw ib_write_bw -d "$DEV" -x "$GIDX" -s "$1" -n "$TENSOR_ITERS" -p "$PORT" "$ADDR"
    next_port
}
pt_lat_at() {   # ib_write_lat at size $1
    start_server ib_write_lat 30 ib_write_lat -d "$DEV" -x "$GIDX" -s "$1" -n "$LAT_ITERS" -p "$PORT"
    LAT_SIZE=$1 perftest_lat ib_write_lat -d "$DEV" -x "$GIDX" -s "$1" -n "$LAT_ITERS" -p "$PORT" "$ADDR"
    next_port
}
TROWS=()
FFETCH=() FFETCH24=()
for size in 8 65536 1048576; do
    # tensor and put runs alternate, as the latency pairs above do: under emulation a run can
    # catch a slow spell of the host, and alternating spreads the spells over both
    echo "# tensor_bw / put_bw / ib_write_bw at $size B ..." >&2
    tv=() pv=()
    for _ in $(seq "$REPEAT"); do
        tv+=("$(xfer_run bw_average_mbps -t tensor_bw -s "$size" -n "$TENSOR_ITERS")")
        pv+=("$(xfer_run bw_average_mbps -t put_bw -s "$size" -n "$TENSOR_ITERS")")
    done
    t_bw=$(median <<<"${tv[*]}") p_bw=$(median <<<"${pv[*]}")
    w_bw=$(pt_bw_at "$size")
    # round trips of 1 MiB take tens of ms under emulation: fewer of them at the large sizes
    lat_n=$(( size > 65536 ? (LAT_ITERS / 20 > 100 ? LAT_ITERS / 20 : 100) : LAT_ITERS ))
    echo "# tensor_lat / put_lat / ib_write_lat at $size B, $lat_n iterations ..." >&2
    tv=() pv=()
    for _ in $(seq "$REPEAT"); do
        tv+=("$(xfer_run t_typical_usec -t tensor_lat -s "$size" -n "$lat_n")")
        pv+=("$(xfer_run t_typical_usec -t put_lat -s "$size" -n "$lat_n")")
        if [ "$size" = 8 ] && [ -x "$FLOOR" ]; then
            FFETCH+=("$(floor_run fetch $REQ_BYTES 8)")
            FFETCH24+=("$(floor_run fetch 24 8)")
        fi
    done
    echo "#   $size B: tensor_lat ${tv[*]}; put_lat ${pv[*]}" >&2
    t_lat=$(median <<<"${tv[*]}") p_lat=$(median <<<"${pv[*]}")
    w_lat=$(LAT_ITERS=$lat_n pt_lat_at "$size")
    for v in t_bw p_bw w_bw t_lat p_lat w_lat; do
        [[ ${!v} =~ ^[0-9.e+-]+$ ]] || die "could not read $v at $size B (got '${!v}')"
    done
    TROWS+=("$size $t_bw $p_bw $w_bw $t_lat $p_lat $w_lat")
done
printf '%s\n' "${TROWS[@]}" | awk -v tag="$X_TAG_LAT" -v pt_tag="$PT_TAG_LAT" -v rep="$REPEAT" '
function verdict(ok) { return ok ? "met" : "NOT met" }
BEGIN {
    printf "# tensors over verbs, steady state (medians of %d runs); bandwidth MB/s, latency usec\n", rep
    printf "# tag_lat (one message, from above): %.2f usec; ib_send_lat: %.2f usec\n", tag, pt_tag
    printf "# t/(p+t): tensor_lat / (put_lat + tag_lat), the aim; t/floor: tensor_lat / (ib_write_lat\n"
    printf "# + ib_send_lat), what perftest takes for one write and one message\n"
    printf "%-9s %10s %10s %11s %6s  %10s %9s %12s %7s %7s  %s\n", "size", "tensor_bw", "put_bw",
           "ib_write_bw", "t/put", "tensor_lat", "put_lat", "ib_write_lat", "t/(p+t)", "t/floor",
           "aims"
}
{
    aim = "lat <= put_lat + tag_lat: " verdict($5 <= $6 + tag)
    if ($1 == 1048576) aim = aim "; bw >= 0.9 x put_bw: " verdict($2 >= 0.9 * $3)
    printf "%-9d %10.1f %10.1f %11.1f %6.2f  %10.2f %9.2f %12.2f %7.2f %7.2f  %s\n", $1, $2, $3,
           $4, $2 / $3, $5, $6, $7, $5 / ($6 + tag), $5 / ($7 + pt_tag), aim
}'

[ ${#FFETCH[@]} -gt 0 ] || { echo "# no $FLOOR: the device's floor was not measured" >&2; exit 0; }
echo "#   verbs_floor round trips: fetch $REQ_BYTES+8 ${FFETCH[*]}; fetch 24+8 ${FFETCH24[*]}" >&2
T8_LAT=$(awk '$1 == 8 {print $5}' <<<"$(printf '%s\n' "${TROWS[@]}")")
awk -v ff="$(median <<<"${FFETCH[*]}")" -v fs="$F_TAG_LAT" \
    -v fw="$F_PUT_LAT" -v ff24="$(median <<<"${FFETCH24[*]}")" \
    -v tag="$X_TAG_LAT" -v put="$X_PUT_LAT" -v t8="$T8_LAT" -v req="$REQ_BYTES" \
    -v rep="$REPEAT" '
BEGIN {
    printf "# the device alone (contrib/bench/verbs_floor: raw verbs, the work requests xfer posts,\n"
    printf "# no xfer), medians of %d runs: send and write between the latency pairs above,\n", rep
    printf "# the fetches between the tensor runs at 8 B; usec\n"
    printf "%-44s %9s %-16s %9s %7s\n", "pattern", "floor", "xfer figure", "xfer", "ratio"
    printf "%-44s %9.2f %-16s %9.2f %7.2f\n", "send 24 B, answered alike (half round trip)",
           fs, "tag_lat 8 B", tag, tag / fs
    printf "%-44s %9.2f %-16s %9.2f %7.2f\n", "write 8 B, answered alike (half round trip)",
           fw, "put_lat 8 B", put, put / fw
    printf "%-44s %9.2f %-16s %9.2f %7.2f\n", "send " req " B + write-with-imm 8 B (round trip)",
           ff, "tensor_lat 8 B", t8, t8 / ff
    printf "%-44s %9.2f\n", "send 24 B + write-with-imm 8 B (round trip)", ff24
    printf "# fetch floor / (write floor + send floor), one way each: %.2f; with a 24-byte\n",
           ff / (fw + fs)
    printf "# request: %.2f. Above 1, the device itself takes that much longer for a fetch than\n",
           ff24 / (fw + fs)
    printf "# for a write and a message: tensor_lat stays within put_lat + tag_lat only if xfer\n"
    printf "# spends that much less of its own time on a fetch than on a put and a message.\n"
}'
