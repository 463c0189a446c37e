#!/bin/bash
# make check: the single-threaded data-path suites again, with every context the harness makes
# created XFER_CONTEXT_FLAG_SERIALIZED (no context lock), so that both thread modes are
# tested over the same scenarios. test_threads is not among them: its threads share a context,
# which only the locked mode allows.
set -u
build=${XFERTEST_BUILD_DIR:?set by make check}
export XFERTEST_SERIALIZED=1
rc=0
for suite in memory rma tag tensor faults progress callbacks close staging staging_msg; do
    echo "== test_$suite, serialized contexts"
    "$build/test/test_$suite" || rc=1
done
exit $rc
