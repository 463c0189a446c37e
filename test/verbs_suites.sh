#!/bin/bash
# Inside the guest: run test/test_<suite> for each argument (suite:test runs one test) and
# report each suite's time; exit non-zero when any failed. Usage: verbs_suites.sh BUILD SUITE...
set -u
build=$1
shift
rc=0
for arg in "$@"; do
    suite=${arg%%:*}
    filter=()
    if [[ $arg == *:* ]]; then
        filter=(--filter "${suite#verbs_}/${arg#*:}")
    fi
    start=$SECONDS
    echo "== test_$suite over $XFERTEST_TRANSPORT ${filter[*]}"
    if ! "$build/test/test_$suite" -j1 "${filter[@]}"; then
        echo "== test_$suite FAILED"
        rc=1
    fi
    echo "== test_$suite: $((SECONDS - start)) s"
done
exit $rc
