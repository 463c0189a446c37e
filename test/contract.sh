#!/bin/bash
# make check: the conformance suite of docs/contract.md (test/test_contract) over every
# transport and mode this host runs - tcp with its defaults, one lane, four lanes striping from
# 64 KiB, batch blocks copied instead of spliced, busy polling; shm with cross-memory attach,
# without it, and through a ring of 16 cells of 512 bytes. The verbs and gdr runs are in the
# Soft-RoCE guest (test/verbs_guest.sh). One line per mode says how it went.
set -u
build=${XFERTEST_BUILD_DIR:?set by make check}
rc=0
# The tests that measure how long one peer holds progress (one_peer_s_*) run alone: beside
# another test's processes, that test's loopback traffic is processed on our thread's CPU time
# and the two share two cores. The others run as Criterion schedules them.
fair='one_peer_s_*'
run() {
    local transport=$1
    shift
    echo "== test_contract over $transport${*:+, $*}"
    if ! env XFERTEST_TRANSPORT="$transport" "$@" "$build/test/test_contract" \
            --filter="contract/!($fair)" ||
       ! env XFERTEST_TRANSPORT="$transport" "$@" "$build/test/test_contract" \
            --filter="contract/$fair" --jobs 1; then
        echo "== test_contract over $transport${*:+, $*} FAILED"
        rc=1
    fi
}
run tcp
run tcp XFER_TCP_LANES=1
run tcp XFER_TCP_LANES=4 XFER_TCP_LANE_MIN_SIZE=64k
run tcp XFER_TCP_SPLICE=n
run tcp XFER_TCP_BUSY_POLL=y
run shm
run shm XFER_SHM_CMA=off
run shm XFER_SHM_CMA=off XFER_SHM_CELLS=16 XFER_SHM_CELL_SIZE=512
exit $rc
