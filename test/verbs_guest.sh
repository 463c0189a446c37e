#!/bin/bash
# make check's verbs part: the suites over real RDMA verbs, in a qemu guest with Soft-RoCE
# (contrib/rxe_guest; the host kernel has no RDMA). One guest boot runs every transport-
# parameterised suite with XFERTEST_TRANSPORT=verbs plus the verbs-specific suites; a second
# boot with --two-hosts runs the test that takes a link down; a third, with 10 GiB, moves a
# tensor of 2^32 + 1 bytes. Where no guest can run (no qemu, no kernel package) the whole test
# is skipped with the reason; CI installs both, so there it always runs.
set -u

src=${XFERTEST_SRC_DIR:?set by make check}
build=${XFERTEST_BUILD_DIR:?set by make check}
guest=$src/contrib/rxe_guest

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
gdr=    # gdr's suite, where gdr is built (it needs the CUDA headers)
[[ -x $build/test/test_gdr_mem ]] && gdr=gdr_mem
# the conformance suite (docs/contract.md; over gdr it needs a GPU, which the guest has not),
# the parameterised suites, unchanged, then the verbs-specific ones, then remap again with
# the MR cache off (every unregistered buffer registered per operation), then tcp's encryption
# (test_tls: this guest's kernel has TLS, the host's may not); not test_sizes: its
# 4 GiB buffers do not fit this guest (below, a guest of its own)
# The bound guards against a hang; the suites take 15-20 minutes under TCG on a 2-core VM
# (test_perf alone 300-440 s), and about 30 on a slower host of the same kind, so it leaves
# room above that.
"$guest" --timeout 2400 -- "$src/test/verbs_suites.sh" "$build" \
    contract memory rma keys auth tag tensor faults threads progress callbacks close bounds \
    unexp remap verbs_mrcache verbs_unmap \
    verbs verbs_tensor verbs_chunks anypeer staging staging_msg cuda_transport cuda_batch perf nccl_net batch $gdr \
    XFER_VERBS_MR_CACHE=off remap \
    XFERTEST_TRANSPORT=tcp tls ||
    failed "the suites' guest" $?
"$guest" --two-hosts --timeout 300 -- "$src/test/verbs_suites.sh" "$build" \
    verbs:link_down || failed "the two-host guest" $?
# a tensor of 2^32 + 1 bytes (test_sizes): over verbs both sides' 4 GiB are registered, so
# pinned; and 512 endpoints in one burst (test_scale: about 3.5 MiB of queues and slots each,
# in 7 CQs on rxe): a guest of their own with the memory for them, when the host has it to spare
big_mib=10240
avail_mib=$(awk '/^MemAvailable:/ { print int($2 / 1024) }' /proc/meminfo)
if ((avail_mib < big_mib + 1024)); then
    echo "SKIP: test_sizes and test_scale over verbs need a $big_mib MiB guest; the host has" \
        "$avail_mib MiB available"
else
    "$guest" --memory "$big_mib" --timeout 900 -- "$src/test/verbs_suites.sh" "$build" \
        sizes:a_tensor_of_4_gib_and_a_byte_into_an_allocation scale || failed "the 10 GiB guest" $?
fi
exit $rc
