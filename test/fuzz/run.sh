#!/usr/bin/env bash
# Run every fuzzer (or those named) for SECONDS each, one after the other, from its committed
# corpus and regressions; new inputs go to a scratch directory, not into the tree. Fails if
# any fuzzer finds a crash, a leak, a sanitizer report, a broken property or a hang, and
# prints the path of the input that did it (add it under test/fuzz/regressions/<name>/).
#
#   test/fuzz/run.sh SECONDS [NAME...]     e.g. test/fuzz/run.sh 30, test/fuzz/run.sh 600 rkey
#
# The fuzzers are built by 'make fuzz' in the build directory: $XFER_BUILD_DIR, or build/
# beside the sources. Logs and crash inputs: $XFER_FUZZ_OUT (default a new /tmp directory).
set -euo pipefail

src="$(cd "$(dirname "$0")/../.." && pwd)"
build="${XFER_BUILD_DIR:-$src/build}"
all="bootstrap_wire tcp_wire tcp_stream verbs_wire tensor_wire rkey shm_ring"

if [ $# -lt 1 ] || ! [[ "$1" =~ ^[0-9]+$ ]]; then
    echo "usage: $0 SECONDS [NAME...]   (names: $all)" >&2
    exit 2
fi
seconds="$1"
shift
names="${*:-$all}"
out="${XFER_FUZZ_OUT:-$(mktemp -d /tmp/xfer-fuzz.XXXXXX)}"
mkdir -p "$out"

failed=0
for name in $names; do
    fuzzer="$build/test/fuzz/fuzz_$name"
    if [ ! -x "$fuzzer" ]; then
        echo "$name: $fuzzer is missing: run 'make fuzz' in $build" >&2
        exit 2
    fi
    work="$out/$name"
    rm -rf "$work"
    mkdir -p "$work/corpus" "$work/crashes"
    dirs=("$src/test/fuzz/corpus/$name")
    if [ -d "$src/test/fuzz/regressions/$name" ]; then
        dirs+=("$src/test/fuzz/regressions/$name")
    fi
    # -close_fd_mask=2: the library's log lines stay out (libFuzzer's and the sanitizers'
    # reports still come); -timeout: an input that runs 10 s is a hang
    rc=0
    "$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=16384 \
        -close_fd_mask=2 -print_final_stats=1 -artifact_prefix="$work/crashes/" \
        "$work/corpus" "${dirs[@]}" > "$work/log" 2>&1 || rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -1) || true
    cov=$( (grep -o 'cov: [0-9]*' "$work/log" || true) | tail -1 | sed 's/cov: //')
    crash=$(find "$work/crashes" -type f | head -1) || true
    if [ "$rc" -ne 0 ] || [ -n "$crash" ]; then
        failed=1
        echo "$name: FAILED (exit $rc) after ${runs:-?} runs; log: $work/log"
        grep -E 'ERROR|fuzz check failed|SUMMARY|Test unit written' "$work/log" | head -5 || true
        echo "$name: the input: ${crash:-(none written; see the log)}"
        # a broken property's message went to the closed stderr: the replay prints it
        echo "$name: reproduce with $build/test/fuzz/replay_$name ${crash:-FILE}"
    else
        echo "$name: ok, ${runs:-?} runs in ${seconds} s, cov: ${cov:-?}"
    fi
done
echo "logs: $out"
exit "$failed"
