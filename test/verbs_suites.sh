#!/bin/bash
# Inside the guest: run test/test_<suite> for each argument (suite:test runs one test, or
# those a Criterion glob matches) and report each suite's time; exit non-zero when any
# failed. An argument NAME=VALUE exports NAME for the suites after it (NAME= unsets it).
# An argument --lane starts a lane: the lanes run side by side, each its suites in order
# with its own NAME=VALUEs, and each lane's output is printed whole when all are done.
# Usage: verbs_suites.sh BUILD [NAME=VALUE | SUITE | --lane]...
# XFERTEST_VALGRIND=1 runs each suite and every process it forks under memcheck (test/valgrind.supp);
# an error or a definite leak in any of them fails the test, and the logs go to
# XFERTEST_VALGRIND_LOGS (default /tmp/xfer-vg on the host: the guest's own /tmp is private).
set -u

# Criterion's runner talks to its workers over a unix socket it must create in /tmp, and in
# the guest /tmp is the host's (9p), where no socket can be made. Give the suites a private
# tmpfs /tmp in a mount namespace, with the directory that holds the trees bound back in.
if [[ $(stat -f -c %T /tmp) != tmpfs && -z ${RXE_SUITES_PRIVATE_TMP:-} ]]; then
    export RXE_SUITES_PRIVATE_TMP=1
    exec unshare -m -- "$0" "$@"
fi
if [[ ${RXE_SUITES_PRIVATE_TMP:-} == 1 ]]; then
    export RXE_SUITES_PRIVATE_TMP=done     # once: the lanes below run in it as it is
    keep=("$(readlink -f "$1")" "$(readlink -f "$(dirname "$0")")")   # before /tmp changes
    mkdir -p /run/xfer-hosttmp
    mount --bind /tmp /run/xfer-hosttmp
    mount -t tmpfs tmpfs /tmp
    for path in "${keep[@]}"; do
        if [[ $path == /tmp/* ]]; then
            top=${path#/tmp/}
            top=${top%%/*}
            if [[ ! -e /tmp/$top ]]; then
                mkdir -p "/tmp/$top"
                mount --bind "/run/xfer-hosttmp/$top" "/tmp/$top"
            fi
        fi
    done
fi

build=$1
shift

# Lanes: one process each (this script again, sharing the private /tmp set up above)
if [[ " $* " == *" --lane "* ]]; then
    lanes=()
    lane=()
    for arg in "$@" --lane; do
        if [[ $arg == --lane ]]; then
            ((${#lane[@]} > 0)) && lanes+=("${lane[*]}")
            lane=()
        else
            lane+=("$arg")
        fi
    done
    out=$(mktemp -d /tmp/xfer-lanes.XXXXXX) || exit 1
    start=$SECONDS
    pids=()
    for i in "${!lanes[@]}"; do
        # shellcheck disable=SC2086 # a lane's words are suite names and NAME=VALUEs
        (
            set -f  # a lane's words are split, never globbed (a test filter is a glob)
            "$0" "$build" ${lanes[i]}
            lrc=$?
            echo "== this lane: $((SECONDS - start)) s"
            exit $lrc
        ) >"$out/$i" 2>&1 &
        pids+=($!)
    done
    rc=0
    for i in "${!lanes[@]}"; do
        wait "${pids[i]}" || rc=1
        echo "==== lane $((i + 1)) of ${#lanes[@]}: ${lanes[i]}"
        cat "$out/$i"
    done
    rm -rf -- "$out"
    exit $rc
fi

rc=0
wrap=()
if [[ -n ${XFERTEST_VALGRIND:-} ]]; then
    logs=${XFERTEST_VALGRIND_LOGS:-/tmp/xfer-vg}
    [[ -n ${RXE_SUITES_PRIVATE_TMP:-} && $logs == /tmp/* ]] && logs=/run/xfer-hosttmp/${logs#/tmp/}
    mkdir -p "$logs"
    # --vgdb=no: the guest's /tmp cannot hold vgdb's FIFOs. Definite leaks are errors;
    # "possibly lost" (only an interior pointer left) is in the logs but does not fail. The
    # system tools a test runs (ip, tc, modprobe, through sh) are not ours to check: their
    # leaks would fail their commands.
    wrap=(valgrind --vgdb=no --trace-children=yes --leak-check=full
          --trace-children-skip='*/sh,*/ip,*/tc,*/modprobe'
          --errors-for-leak-kinds=definite --error-exitcode=99
          --suppressions="$(dirname "$(readlink -f "$0")")/valgrind.supp"
          --log-file="$logs/%q{XFERTEST_VG_SUITE}.%p.log")
    export LD_LIBRARY_PATH=$build/framework/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
# The RDMA devices' own counters (rxe: retransmissions, sequence errors, RNR), one
# "device:counter=value" per line: a suite that fails prints what changed while it ran, so
# that a stall says whether the device lost and resent packets (the emulated guest under
# load) or moved everything it was given. The other lane's traffic is counted too.
rdma_counters() {
    local f dev
    for f in /sys/class/infiniband/*/ports/*/hw_counters/*; do
        [[ -r $f ]] || continue
        dev=${f#/sys/class/infiniband/}
        dev=${dev%%/*}
        echo "$dev:${f##*/}=$(<"$f")"
    done
}
rdma_counters_changed() {
    local name now before
    declare -A was=()
    while IFS='=' read -r name before; do
        was[$name]=$before
    done <<<"$1"
    rdma_counters | while IFS='=' read -r name now; do
        before=${was[$name]:-0}
        ((now != before)) && printf ' %s +%d' "$name" $((now - before))
    done
}
for arg in "$@"; do
    if [[ $arg == *=* ]]; then
        if [[ $arg == *= ]]; then
            unset "${arg%=}"    # NAME= takes NAME back to its default
        else
            export "${arg?}"
        fi
        echo "== from here on: $arg"
        continue
    fi
    suite=${arg%%:*}
    filter=()
    if [[ $arg == *:* ]]; then
        filter=(--filter "*/${arg#*:}")
    fi
    start=$SECONDS
    echo "== test_$suite over ${XFERTEST_TRANSPORT:-tcp} ${filter[*]}"
    export XFERTEST_VG_SUITE=$suite
    bin=$build/test/test_$suite
    [[ ${#wrap[@]} -gt 0 ]] && bin=$build/test/.libs/test_$suite   # not libtool's wrapper script
    counters=$(rdma_counters)
    if ! "${wrap[@]}" "$bin" -j1 "${filter[@]}"; then
        echo "== test_$suite FAILED; the RDMA devices counted meanwhile:" \
            "$(rdma_counters_changed "$counters")"
        rc=1
    fi
    echo "== test_$suite: $((SECONDS - start)) s"
done
exit $rc
