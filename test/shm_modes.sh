#!/bin/bash
# make check: the shared API suites over shm (XFERTEST_TRANSPORT=shm), as they run over tcp:
# first with the defaults (small data through the ring, large data by cross-memory attach),
# then with XFER_SHM_CMA=off (every byte through the ring, pipelined), test_batch into a target
# buffer from xfer_mem_alloc (mapped by the initiator), xfer_perf's tests with their copies
# shared by both sides, CUDA memory with its IPC off, and the data-moving suites again
# through a small ring of small cells, so that messages wrap it many times.
set -u
build=${XFERTEST_BUILD_DIR:?set by make check}
export XFERTEST_TRANSPORT=shm
rc=0
for suite in tag rma keys auth tensor memory close faults progress threads callbacks bounds \
             unexp remap sizes staging staging_msg nccl_net perf batch cuda_transport \
             cuda_batch scale; do
    echo "== test_$suite over shm"
    "$build/test/test_$suite" || rc=1
done
# CUDA memory not shared by IPC: staged as over a transport without RMA_CUDA, a peer's
# device memory out of reach of put and get
for suite in staging cuda_transport; do
    echo "== test_$suite over shm, XFER_SHM_CUDA_IPC=n"
    XFER_SHM_CUDA_IPC=n "$build/test/test_$suite" || rc=1
done
echo "== test_perf over shm, XFER_SHM_CUDA_IPC=n: puts into the peer's CUDA memory refused"
XFER_SHM_CUDA_IPC=n "$build/test/test_perf" \
    --filter '*/what_the_transport_does_not_move_is_refused_with_the_reason' || rc=1
for suite in tag rma tensor memory close faults batch; do
    echo "== test_$suite over shm, XFER_SHM_CMA=off"
    XFER_SHM_CMA=off "$build/test/test_$suite" || rc=1
done
# the target's memory from xfer_mem_alloc: batches copied by the initiator into its mapping
for cma in auto off; do
    echo "== test_batch over shm, XFERTEST_TARGET_MEM=xfer XFER_SHM_CMA=$cma"
    XFERTEST_TARGET_MEM=xfer XFER_SHM_CMA=$cma "$build/test/test_batch" || rc=1
done
# every xfer_perf test between memory from xfer_mem_alloc, data checked, with the copies of
# puts and messages shared by both sides from their smallest size (300 KB: two parts)
echo "== test_perf over shm, XFER_SHM_COOP_MIN=4k, memory from xfer_mem_alloc"
XFER_SHM_COOP_MIN=4k "$build/test/test_perf" \
    --filter '*/every_test_runs_with_memory_from_xfer_mem_alloc' || rc=1
for suite in rma tensor batch; do
    echo "== test_$suite over shm, XFER_SHM_CMA=off XFER_SHM_CELLS=16 XFER_SHM_CELL_SIZE=512"
    XFER_SHM_CMA=off XFER_SHM_CELLS=16 XFER_SHM_CELL_SIZE=512 "$build/test/test_$suite" || rc=1
done
exit $rc
