#!/usr/bin/env bash
# The examples README.md points to must run as it says: batch_notify over tcp and over shm.
set -u
build=${XFERTEST_BUILD_DIR:?set by make check}
rc=0
for transport in tcp shm; do
    echo "== batch_notify over $transport"
    if ! XFER_TRANSPORTS=$transport timeout 60 "$build/contrib/examples/batch_notify"; then
        echo "FAIL: batch_notify over $transport"
        rc=1
    fi
done
exit $rc
