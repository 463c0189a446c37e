#!/usr/bin/env bash
# bench_gpu.sh [BUILD_DIR]: xfer with CUDA device memory on a GPU machine, in one run. Prints
# the machine (nvidia-smi, the driver's DMA-BUF and GPUDirect RDMA attributes from gpu_attrs,
# xfer_info -s), then the figures, the ratios and whether the aim is met:
#   put_bw, get_bw over tcp loopback at 64 MiB and 1 GiB, xfer_perf -m cuda against -m host
#            (the same run, alternating, median of REPEAT): aim at 64 MiB
#            cuda / host >= 0.8 for the judged memory pair: cuda,cuda where xfer runs it
#            (tcp moves CUDA memory on both sides through its bounce buffers), else
#            cuda,host (a transport that stages the initiator's CUDA memory only; xfer_perf
#            says so: the refusal is printed)
#   batch_put 128 x 4 KiB over tcp, -m cuda against -m host (-V checked first)
#   ucx_perftest -m cuda (UCX_TLS=tcp,cuda_copy) tag_bw and ucp_put_bw at 64 MiB, beside,
#            with its own cuda / host ratio - when its CUDA module is installed; else a line
#            says it is skipped and why
#   xfer_perf -x shm -m cuda (CUDA IPC between the two processes) put_bw, get_bw at 64 MiB and
#            a batch of 128 x 4 KiB against one 512 KiB put (and the batch again by the
#            driver's copies, XFER_SHM_CUDA_GATHER=n), beside ucx_perftest over
#            UCX_TLS=sm,cuda_copy,cuda_ipc with its ratio
#   ib_write_bw --use_cuda against ib_write_bw at 64 KiB, and xfer_perf -x verbs -m cuda,host
#            against -m host, when an RDMA device is present and perftest was built with CUDA
# A -V run of each cuda memory pair at 64 MiB checks the data first (untimed).
# A tool, not a test: it exits 0 whatever the figures, non-zero only when something fails to
# run (no usable CUDA driver included). It downloads and installs nothing.
#
# BUILD_DIR (or $XFER_BUILD_DIR) is a configured and built tree; default ./build.
# Knobs: BENCH_PORT (first of many ports, default 18800), BENCH_CUDA_DEVICE (0), ROUNDS (9, at least 9),
# ITERS_64M (100), ITERS_1G (8), SIZES ("64m 1g"), BENCH_RDMA_DEVICE (the first ibv device),
# XFER_CUDA_LIB (the driver library; default libcuda.so.1). Needs jq and ss (iproute2);
# nvidia-smi, ucx_perftest and perftest are used where present.
set -euo pipefail

BUILD=${1:-${XFER_BUILD_DIR:-./build}}
PERF=$BUILD/contrib/xfer_perf
ATTRS=$BUILD/contrib/bench/gpu_attrs
INFO=$BUILD/contrib/xfer_info
PORT=${BENCH_PORT:-18800}
GPU=${BENCH_CUDA_DEVICE:-0}
ITERS_64M=${ITERS_64M:-100}
ITERS_1G=${ITERS_1G:-8}
SIZES=${SIZES:-"64m 1g"}
RDMA_DEV=${BENCH_RDMA_DEVICE:-$( (ibv_devices 2>/dev/null || true) | awk 'NR > 2 {print $1; exit}')}
RDMA_SIZE=65536

BENCH_NAME=bench_gpu
# shellcheck source=contrib/bench/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
REPEAT=$ROUNDS      # lib.sh: 9 or more

[ -x "$PERF" ] || die "no $PERF: build first (make -C $BUILD), or pass the build directory"
[ -x "$ATTRS" ] || die "no $ATTRS: build first (make -C $BUILD)"
for tool in jq ss; do
    command -v "$tool" >/dev/null || die "$tool not found (apt-get install jq iproute2)"
done

iters_for() { case $1 in 64m) echo "$ITERS_64M" ;; 1g) echo "$ITERS_1G" ;; *) echo 20 ;; esac; }
median() { sort -g | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
# ucx_perftest's MB is 2^20 bytes; ours (and perftest's message rate x size) 10^6
UCX_MB=1.048576

# ---- the machine -------------------------------------------------------------------------------
echo "# bench_gpu: $(nproc) cores, build $BUILD, GPU $GPU; MB = 10^6 bytes"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current \
               --format=csv || echo "# nvidia-smi failed"
    echo "# nvidia-smi topo -m (GPU-NIC distances: PIX/PXB/PHB/SYS)"
    nvidia-smi topo -m 2>&1 || true
    echo "# kernel modules: $(lsmod 2>/dev/null | awk '$1 ~ /^(nvidia|nvidia_peermem|nv_peer_mem)$/ {printf "%s ", $1}')"
else
    echo "# nvidia-smi not found: no NVIDIA utilities on this machine"
fi
echo "# the CUDA driver's attributes (contrib/bench/gpu_attrs)"
"$ATTRS" || die "no usable CUDA driver (gpu_attrs says why above): nothing to measure"
echo "# how xfer moves host and CUDA memory here (xfer_info -s)"
"$INFO" -s 2>&1 || true

# ---- xfer_perf over tcp: cuda against host -------------------------------------------------------
# xfer_run MEM TEST SIZE ARGS...: one xfer_perf run; R = its BW (MB/s), or REFUSED / FAILED
# with the reason on stderr. Servers start in this shell (not in $(...)), so that the exit
# trap of lib.sh knows them.
# CLIENT_ARGS: more arguments for the client alone (-b).
CLIENT_ARGS=()
xfer_run() {
    local mem=$1 test=$2 size=$3 rc=0
    shift 3
    start_server "xfer_$test" 15 "$PERF" -p "$PORT" --cuda-device "$GPU" "$@"
    "$PERF" -p "$PORT" -t "$test" -s "$size" -m "$mem" --cuda-device "$GPU" --json "$@" \
        ${CLIENT_ARGS[@]+"${CLIENT_ARGS[@]}"} 127.0.0.1 >"$LOGDIR/client.json" \
        2>"$LOGDIR/client.err" || rc=$?
    next_port
    if [ "$rc" = 0 ]; then
        R=$(jq '.results[0].bw_average_mbps' "$LOGDIR/client.json")
        return 0
    fi
    R=FAILED
    grep -q "cannot run" "$LOGDIR/client.err" && R=REFUSED
    sed "s/^/#   /" "$LOGDIR/client.err" >&2
}

declare -A BW JUDGED
echo "# xfer_perf -x tcp, put_bw and get_bw: the data checked (-V, 64 MiB) with CUDA memory"
for test in put_bw get_bw; do
    JUDGED[$test]=cuda,host
    for mem in cuda,host cuda; do
        xfer_run "$mem" "$test" 64m -x tcp -V -n 4 --warmup 1
        case $R in
            REFUSED) echo "#   $test -m $mem: refused (the reason above)" ;;
            FAILED) die "xfer_perf -t $test -m $mem -V failed (the reason above)" ;;
            *) echo "#   $test -m $mem: the data verified"
               [ "$mem" = cuda ] && JUDGED[$test]=cuda ;;
        esac
    done
done
for size in $SIZES; do
    iters=$(iters_for "$size")
    for test in put_bw get_bw; do
        for mem in host cuda,host cuda; do
            vals=()
            for _ in $(seq "$REPEAT"); do
                echo "# xfer_perf -x tcp -t $test -s $size -n $iters -m $mem" >&2
                xfer_run "$mem" "$test" "$size" -x tcp -n "$iters"
                [ "$R" = FAILED ] && die "xfer_perf -t $test -s $size -m $mem failed"
                [ "$R" = REFUSED ] && break
                vals+=("$R")
            done
            if [ ${#vals[@]} -eq 0 ]; then
                BW[$test,$size,$mem]=-
            else
                BW[$test,$size,$mem]=$(printf '%s\n' "${vals[@]}" | median)
            fi
        done
    done
done

printf "# xfer over tcp loopback, median of %s runs; MB = 10^6 bytes\n" "$REPEAT"
printf "%-22s %12s %14s %12s %14s %12s\n" "figure [MB/s]" "host" "cuda,host" "/host" "cuda,cuda" "/host"
for size in $SIZES; do
    for test in put_bw get_bw; do
        h=${BW[$test,$size,host]} ch=${BW[$test,$size,cuda,host]} cc=${BW[$test,$size,cuda]}
        awk -v t="$test $size" -v h="$h" -v ch="$ch" -v cc="$cc" 'BEGIN {
            printf "%-22s %12s %14s %12s %14s %12s\n", t, h, ch,
                   (ch == "-") ? "-" : sprintf("%.2f", ch / h), cc,
                   (cc == "-") ? "-" : sprintf("%.2f", cc / h) }'
    done
done
for test in put_bw get_bw; do
    mem=${JUDGED[$test]}
    awk -v t="$test" -v m="$mem" -v h="${BW[$test,64m,host]:--}" -v c="${BW[$test,64m,$mem]:--}" 'BEGIN {
        if (h == "-" || c == "-") { printf "# aim %s 64m: not measured (SIZES lacks 64m)\n", t; exit }
        printf "# aim: %s 64 MiB, -m %s >= 0.8 x -m host: %s (%.2f)%s\n", t, m,
               (c >= 0.8 * h) ? "met" : "NOT met", c / h,
               (m == "cuda,host") ? "; -m cuda (CUDA memory on both sides) was refused over tcp" : "" }'
done
# a batch of 128 x 4 KiB over tcp, host memory against device memory on both sides (blocks of
# device memory go as one PUT each through the bounce buffers, a driver copy per block on
# each side), checked with -V first
CLIENT_ARGS=(-b 128)
xfer_run cuda batch_put 4k -x tcp -V -n 20 --warmup 2
case $R in
    REFUSED|FAILED) die "xfer_perf -x tcp -t batch_put -b 128 -m cuda -V failed (the reason above)" ;;
esac
vals_h=() vals_c=()
for _ in $(seq "$REPEAT"); do
    xfer_run host batch_put 4k -x tcp -n 500
    vals_h+=("$R")
    xfer_run cuda batch_put 4k -x tcp -n 500
    vals_c+=("$R")
done
CLIENT_ARGS=()
h=$(printf '%s\n' "${vals_h[@]}" | median) c=$(printf '%s\n' "${vals_c[@]}" | median)
awk -v h="$h" -v c="$c" 'BEGIN {
    printf "# tcp batch_put 128 x 4 KiB + notify: -m host %s, -m cuda %s: %.2f (data checked)\n",
           h, c, c / h }'

# ---- ucx_perftest -m cuda --------------------------------------------------------------------------
ucx_bw() {   # ucx_bw TEST MEM: R = MB/s (10^6) at 64 MiB, or "-" with the reason on stderr
    local out rc=0
    start_server "ucx_$1" 15 env UCX_TLS=tcp,cuda_copy UCX_NET_DEVICES=lo ucx_perftest -p "$PORT"
    out=$(UCX_TLS=tcp,cuda_copy UCX_NET_DEVICES=lo ucx_perftest 127.0.0.1 -p "$PORT" \
          -t "$1" -m "$2" -s 67108864 -n "$ITERS_64M" -w 10 -f -v 2>&1) || rc=$?
    next_port
    R="-"
    if [ "$rc" = 0 ]; then
        R=$(awk -F, -v mb=$UCX_MB '/^[0-9]+,/ {v = $6 * mb} END {print (v == "") ? "-" : v}' <<<"$out")
    else
        tail -3 <<<"$out" | sed "s/^/#   ucx_perftest -t $1 -m $2: /" >&2
    fi
}

if ! command -v ucx_perftest >/dev/null; then
    echo "# ucx_perftest: skipped: not installed (ucx-utils)"
elif ! ucx_perftest -h 2>&1 | grep -qE '^ +cuda +- '; then
    echo "# ucx_perftest -m cuda: skipped: this UCX has no CUDA memory type (ucx_perftest -h" \
         "lists: $(ucx_perftest -h 2>&1 | awk '/memory type of message/ {on = 1; next}
                                               on && $2 == "-" {printf "%s ", $1; next} on {exit}'))"
else
    echo "# ucx_perftest (UCX_TLS=tcp,cuda_copy), 64 MiB, $ITERS_64M iterations"
    printf "%-22s %12s %14s %12s %14s %12s\n" "figure [MB/s]" "host" "cuda,host" "/host" "cuda,cuda" "/host"
    for test in tag_bw ucp_put_bw; do
        ucx_bw "$test" host; h=$R
        ucx_bw "$test" cuda,host; ch=$R
        ucx_bw "$test" cuda; cc=$R
        awk -v t="$test 64m" -v h="$h" -v ch="$ch" -v cc="$cc" 'BEGIN {
            r1 = (ch == "-" || h == "-") ? "-" : sprintf("%.2f", ch / h)
            r2 = (cc == "-" || h == "-") ? "-" : sprintf("%.2f", cc / h)
            printf "%-22s %12s %14s %12s %14s %12s\n", t, h, ch, r1, cc, r2 }'
    done
fi

# ---- same host: xfer_perf -x shm (CUDA IPC) against ucx_perftest UCX_TLS=sm,cuda_copy,cuda_ipc ---
# put_bw and get_bw at 64 MiB with both sides in CUDA memory (device to device, the peer's
# allocation opened by its IPC handle), host memory into the peer's CUDA memory, and a batch
# of 128 x 4 KiB with notification against one 512 KiB put, both cuda (the batch by shm's
# copy kernel, and again by the driver's copies); beside, ucx_perftest ucp_put_bw /
# ucp_get_bw -m cuda over cuda_ipc.
echo "# xfer_perf -x shm -m cuda: the data checked (-V) first"
for test in put_bw get_bw; do
    for mem in cuda host,cuda; do
        xfer_run "$mem" "$test" 64m -x shm -V -n 4 --warmup 1
        case $R in
            REFUSED|FAILED) die "xfer_perf -x shm -t $test -m $mem -V failed (the reason above)" ;;
            *) echo "#   shm $test -m $mem: the data verified" ;;
        esac
    done
done
# batches of device memory by shm's copy kernel: 4 KiB blocks (16-byte accesses) both ways,
# and blocks of 99999 bytes (odd addresses: bytewise; spread over two table entries each)
for batch in "put 128 4k" "get 128 4k" "put 37 99999"; do
    read -r dir n size <<<"$batch"
    CLIENT_ARGS=(-b "$n")
    xfer_run cuda "batch_$dir" "$size" -x shm -V -n 20 --warmup 2
    CLIENT_ARGS=()
    case $R in
        REFUSED|FAILED) die "xfer_perf -x shm -t batch_$dir -b $n -s $size -m cuda -V failed (the reason above)" ;;
    esac
    echo "#   shm batch_$dir $n x $size -m cuda: the data verified"
done
declare -A SHM
for _ in $(seq "$REPEAT"); do
    for test in put_bw get_bw; do
        for mem in cuda host,cuda; do
            xfer_run "$mem" "$test" 64m -x shm -n "$ITERS_64M"
            SHM[$test,$mem]+="$R "
        done
    done
    CLIENT_ARGS=(-b 128)
    xfer_run cuda batch_put 4k -x shm -n 2000
    SHM[batch,cuda]+="$R "
    XFER_SHM_CUDA_GATHER=n xfer_run cuda batch_put 4k -x shm -n 200
    SHM[batch_copies,cuda]+="$R "
    CLIENT_ARGS=()
    xfer_run cuda put_bw 512k -x shm -n 2000
    SHM[put512k,cuda]+="$R "
done
shm_med() { tr ' ' '\n' <<<"${SHM[$1]}" | grep -E '^[0-9.]+$' | median; }
ucx_ipc="-"
ucx_ipc_get="-"
if command -v ucx_perftest >/dev/null && ucx_perftest -h 2>&1 | grep -qE '^ +cuda +- '; then
    for test in ucp_put_bw ucp_get_bw; do
        start_server "ucx_ipc_$test" 15 env UCX_TLS=sm,cuda_copy,cuda_ipc ucx_perftest -p "$PORT"
        out=$(UCX_TLS=sm,cuda_copy,cuda_ipc ucx_perftest 127.0.0.1 -p "$PORT" -t "$test" \
              -m cuda -s 67108864 -n "$ITERS_64M" -w 10 -f -v 2>&1) || true
        next_port
        v=$(awk -F, -v mb=$UCX_MB '/^[0-9]+,/ {v = $6 * mb} END {print (v == "") ? "-" : v}' <<<"$out")
        [ "$test" = ucp_put_bw ] && ucx_ipc=$v || ucx_ipc_get=$v
    done
else
    echo "# ucx_perftest over cuda_ipc: skipped: ucx_perftest or its CUDA memory type is missing"
fi
printf "# xfer over shm (CUDA IPC), median of %s runs; MB = 10^6 bytes\n" "$REPEAT"
printf "%-26s %12s %14s %14s %10s\n" "figure [MB/s]" "cuda" "host,cuda" "ucx cuda_ipc" "/ucx"
for test in put_bw get_bw; do
    c=$(shm_med "$test,cuda") hc=$(shm_med "$test,host,cuda")
    u=$([ "$test" = put_bw ] && echo "$ucx_ipc" || echo "$ucx_ipc_get")
    awk -v t="$test 64m" -v c="$c" -v hc="$hc" -v u="$u" 'BEGIN {
        printf "%-26s %12s %14s %14s %10s\n", t, c, hc, u,
               (u == "-" || c == "") ? "-" : sprintf("%.2f", c / u) }'
done
awk -v b="$(shm_med batch,cuda)" -v p="$(shm_med put512k,cuda)" \
    -v c="$(shm_med batch_copies,cuda)" 'BEGIN {
    printf "# shm cuda: 128 x 4 KiB + notify %s, one 512 KiB put %s: %s; the batch by the " \
           "driver'"'"'s copies (XFER_SHM_CUDA_GATHER=n) %s\n", b, p,
           (b == "" || p == "") ? "-" : sprintf("%.2f", b / p), c }'

# ---- RDMA: ib_write_bw --use_cuda, xfer_perf -x verbs -------------------------------------------
if [ -z "$RDMA_DEV" ]; then
    echo "# ib_write_bw --use_cuda, xfer_perf -x verbs: skipped: no RDMA device (ibv_devices lists none)"
elif ! command -v ib_write_bw >/dev/null; then
    echo "# ib_write_bw --use_cuda: skipped: perftest is not installed"
elif ! ib_write_bw --help 2>&1 | grep -q -- '--use_cuda'; then
    echo "# ib_write_bw --use_cuda: skipped: this perftest was built without CUDA"
else
    ulimit -l unlimited 2>/dev/null || true
    ib_bw() {   # ib_bw ARGS...: R = MB/s (10^6) at RDMA_SIZE, or "-" with the reason
        local out rc=0
        start_server ib_write_bw 15 ib_write_bw -d "$RDMA_DEV" -s "$RDMA_SIZE" -F -p "$PORT" "$@"
        out=$(ib_write_bw -d "$RDMA_DEV" -s "$RDMA_SIZE" -F -p "$PORT" "$@" 127.0.0.1 2>&1) ||
            rc=$?
        next_port
        R="-"
        if [ "$rc" = 0 ]; then
            R=$(awk -v s=$RDMA_SIZE '$1 == s && NF >= 5 {v = $5 * s} END {print (v == "") ? "-" : v}' <<<"$out")
        else
            tail -3 <<<"$out" | sed "s/^/#   ib_write_bw $*: /" >&2
        fi
    }
    echo "# ib_write_bw on $RDMA_DEV, $RDMA_SIZE B"
    ib_bw; h=$R
    ib_bw --use_cuda="$GPU"; c=$R
    d="-"
    if ib_write_bw --help 2>&1 | grep -q -- '--use_cuda_dmabuf'; then
        ib_bw --use_cuda="$GPU" --use_cuda_dmabuf; d=$R
    fi
    printf "%-22s %12s %14s %14s\n" "figure [MB/s]" "host" "--use_cuda" "+dmabuf"
    printf "%-22s %12s %14s %14s\n" "ib_write_bw" "$h" "$c" "$d"
    export XFER_VERBS_DEVICE=$RDMA_DEV
    printf "%-22s %12s %14s\n" "figure [MB/s]" "host" "cuda,host"
    for test in put_bw get_bw; do
        xfer_run host "$test" "$RDMA_SIZE" -x verbs -n 2000; h=$R
        xfer_run cuda,host "$test" "$RDMA_SIZE" -x verbs -n 2000; c=$R
        printf "%-22s %12s %14s\n" "xfer $test verbs" "$h" "$c"
    done
fi
