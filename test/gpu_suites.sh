#!/bin/bash
# test/gpu_suites.sh [BUILD_DIR]: on a machine with an NVIDIA GPU, the suites whose tests run
# over the GPU's own driver (make check runs them too, where those tests skip without a GPU),
# over tcp and over shm (CUDA IPC, and with it off), shm's batches by its copy kernel with a
# small table and by the driver's copies; it fails when a suite fails or when a test that
# wants the GPU skipped for want of one. Run after a build (make check TESTS= builds the
# suites without running them); then contrib/bench/bench_gpu.sh for the figures.
# On a machine without xfer's build dependencies, run it from test/gpu_bundle.sh's bundle.
set -u
build=$(cd "${1:-${XFERTEST_BUILD_DIR:-build}}" && pwd) || exit 2
src=$(cd "$(dirname "$0")/.." && pwd)
export XFERTEST_BUILD_DIR=$build XFERTEST_SRC_DIR=$src \
       XFERTEST_PLUGIN_DIR=$build/test/plugins/.libs XFERTEST_INFO=$build/contrib/xfer_info
log=$(mktemp)
trap 'rm -f "$log"' EXIT
rc=0

run() {   # run LABEL ENV... SUITE [ARGS]: one suite; its skips for want of a GPU count as failures
    local label=$1 st
    shift
    echo "== $label"
    env "$@" --verbose >"$log" 2>&1
    st=$?
    grep -E '^\[(FAIL|SKIP)\]|Synthesis' "$log"
    if [ "$st" != 0 ]; then
        rc=1
    elif grep -E '^\[SKIP\]' "$log" | grep -qiE 'no CUDA device|no usable CUDA|libcuda|NVIDIA driver|CUDA driver'; then
        echo "$label: a test skipped for want of a GPU"
        rc=1
    fi
}

for s in cuda gdr_mem cuda_transport cuda_batch staging shm; do
    run "test_$s over tcp" XFERTEST_TRANSPORT=tcp "$build/test/test_$s"
done
for s in cuda_transport cuda_batch staging; do
    run "test_$s over shm" XFERTEST_TRANSPORT=shm "$build/test/test_$s"
done
for s in cuda_transport staging; do
    run "test_$s over shm, XFER_SHM_CUDA_IPC=n" XFERTEST_TRANSPORT=shm XFER_SHM_CUDA_IPC=n \
        "$build/test/test_$s"
done
# the copy kernel refilling a table of 16 mid-batch; the driver's copies (the stand-in
# tests, which count kernel launches, left out)
run "test_cuda_batch over shm, XFER_SHM_CUDA_GATHER_DESCS=16" XFERTEST_TRANSPORT=shm \
    XFER_SHM_CUDA_GATHER_DESCS=16 "$build/test/test_cuda_batch"
run "test_cuda_batch over shm, XFER_SHM_CUDA_GATHER=n" XFERTEST_TRANSPORT=shm \
    XFER_SHM_CUDA_GATHER=n "$build/test/test_cuda_batch" --filter '*/!(*stand_in)'
[ "$rc" = 0 ] && echo "gpu_suites: all passed" || echo "gpu_suites: FAILED"
exit $rc
