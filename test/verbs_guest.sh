#!/bin/bash
# make check's verbs part: the suites over real RDMA verbs, in qemu guests with Soft-RoCE
# (contrib/rxe_guest; the host kernel has no RDMA). A 12 GiB guest moves a tensor of
# 2^32 + 1 bytes and connects 512 endpoints; the next runs every transport-parameterised
# suite with XFERTEST_TRANSPORT=verbs and the verbs-specific suites; one with --two-hosts
# runs the tests that take a link down and silence a device; the last, the contract's
# fairness tests. Where no guest can run (no qemu, no kernel package) the whole test is
# skipped with the reason; CI installs both, so there it always runs.
#
# The suites' guest runs its suites in two lanes side by side (verbs_suites.sh --lane). One
# suite at a time kept its two vCPUs about 60 % busy (most of a test is one process's
# emulated work), and two lanes take about 60 % of the time of one. Two guests side by side
# instead overcommit the host's cores and were slower than one: do not.
set -u

src=${XFERTEST_SRC_DIR:?set by make check}
build=${XFERTEST_BUILD_DIR:?set by make check}
guest=$src/contrib/rxe_guest
suites=$src/test/verbs_suites.sh

if ! why=$("$guest" --two-hosts --check); then
    echo "SKIP: verbs suites need a Soft-RoCE guest: $why"
    exit 77
fi

export XFERTEST_TRANSPORT=verbs
rc=0
# one line per failed guest, which CI's digest of the failures picks up
failed() {
    echo "== verbs_guest: $1 FAILED (exit $2; 124: it ran out of time)"
    rc=1
}
gdr=    # gdr's suites, where gdr is built (it needs the CUDA headers)
[[ -x $build/test/test_gdr_mem ]] && gdr="gdr_mem gdr_topo"

# Lane 1: the conformance suite (docs/contract.md; over gdr it needs a GPU, which the guest
# has not) but its fairness tests, which run alone below; the parameterised suites, the
# verbs-specific ones, then remap again with the MR cache off (every unregistered buffer
# registered per operation), then tcp's encryption (test_tls: this guest's kernel has TLS,
# the host's may not).
lane1=("contract:!(one_peer*)" memory rma keys auth tag tensor faults threads progress
       callbacks close unexp remap verbs_mrcache verbs_unmap verbs XFER_VERBS_MR_CACHE=off
       remap XFERTEST_TRANSPORT=tcp tls)
# Lane 2: test_perf's tests of what the transport moves (its option, output and driver
# tests are the tool's alone, and run on the host), the NCCL plug-in, the bounds, batches,
# the batches of device memory that verbs without GPUDirect has staged (the stand-in driver's
# memory with the peer's host memory; the rest of test_cuda_batch needs a key for the peer's
# device memory, which verbs gives only with a GPU), gdr's memory suite, then more of the
# parameterised and verbs-specific suites: the lanes took 750 and 439 s with these in lane 1,
# 566 and 563 s this way.
lane2=("perf:@(put_bw_*|get_bw_*|every_test_runs_with_*|what_the_transport_does_not_move_*|batch*_move_*|batch_tests_*)"
       nccl_net bounds batch "cuda_batch:@(*malloced*|*cancel_at_post*|*never_wait*)"
       $gdr verbs_tensor verbs_chunks anypeer staging staging_msg cuda_transport)
# A tensor of 2^32 + 1 bytes (test_sizes: over verbs both sides' 4 GiB are registered, so
# pinned) and 512 endpoints in one burst (test_scale: about 3.5 MiB of queues and slots
# each, in 7 CQs on rxe), when the host has the memory for them to spare: in a 12 GiB guest
# of their own, before the lanes. Beside the lanes, pinning the 4 GiB held everything else
# in the guest: a contract test took 48 s to connect and post, and then rxe under TCG did
# not complete its two 512 KiB batches within the close's 30 s (twice in three CIs) - the
# emulator's load, not the clause's.
big=()
big_mib=12288
avail_mib=$(awk '/^MemAvailable:/ { print int($2 / 1024) }' /proc/meminfo)
if ((avail_mib < big_mib + 1024)); then
    echo "SKIP: test_sizes and test_scale over verbs need a $big_mib MiB guest; the host has" \
        "$avail_mib MiB available"
else
    big=(sizes:a_tensor_of_4_gib_and_a_byte_into_an_allocation scale)
fi

# With two lanes busy on two vCPUs, rxe under TCG can go longer than the default 100 ms x 7
# without acknowledging a large RDMA WRITE (a 4 GiB tensor, the largest batch), and the
# channel fails with "transport retry counter exceeded": the verdict on a dead link, which
# this is not. 1 s a try (7.5 s in all) is not enough either: a 16 MiB put went unacknowledged
# that long beside the pinning of a 4 GiB tensor. Both lanes wait 4 s a try
# (30 s in all). A dead peer is still found at once: its socket and its CM ID close with it.
# The tests that bound how fast a dead link or a damaged channel is found (test_verbs_faults,
# verbs:link_down, verbs_tensor's damaged requests) set their own timeouts.
rc_wait=XFER_VERBS_TIMEOUT=4s
# The bound guards against a hang: the lanes take about 1000 s under TCG on a 2-core VM.
if ((${#big[@]} > 0)); then
    "$guest" --memory "$big_mib" --timeout 900 -- "$suites" "$build" "$rc_wait" "${big[@]}" ||
        failed "the large tests' guest" $?
fi
"$guest" --memory 3072 --timeout 2400 -- "$suites" "$build" \
    "$rc_wait" "${lane1[@]}" --lane "$rc_wait" "${lane2[@]}" ||
    failed "the suites' guest" $?
"$guest" --two-hosts --timeout 300 -- "$suites" "$build" \
    "verbs:@(link_down|a_close_to_a_silent_device*)" ||
    failed "the two-host guest" $?
# The contract's fairness tests measure one endpoint's round trips and a batch's deadline while
# another peer floods this process: in a guest of their own, since beside the other lane (a
# 4 GiB tensor, 512 endpoints) rxe under TCG once held an initiator's progress past its
# deadline for 95 s, and once a handshake for 60 s - the emulator's load, not the clause's.
"$guest" --timeout 300 -- "$suites" "$build" "$rc_wait" "contract:one_peer*" ||
    failed "the fairness tests' guest" $?
exit $rc
