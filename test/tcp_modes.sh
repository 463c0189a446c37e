#!/bin/bash
# make check: tcp suites again in the component's other modes, so that each mode runs the
# same scenarios as the default: XFER_TCP_BUSY_POLL=y (sockets read directly, waits never
# sleep), XFER_TCP_PUT_ACK=y (every put acknowledged by the target), one connection per
# endpoint (XFER_TCP_LANES=1), four lanes striping from 64 KiB on, batch blocks copied
# into the socket instead of spliced (XFER_TCP_SPLICE=n), lanes connected from progress
# after xfer_connect (XFER_TCP_LANE_WAIT=0), and every endpoint authenticated
# (XFER_AUTH_KEY_FILE: the bootstrap proves the key, four lanes prove the endpoint's secret).
set -u
build=${XFERTEST_BUILD_DIR:?set by make check}
export XFERTEST_TRANSPORT=tcp
rc=0
for suite in tag rma tensor close faults; do
    echo "== test_$suite, XFER_TCP_BUSY_POLL=y"
    XFER_TCP_BUSY_POLL=y "$build/test/test_$suite" || rc=1
done
for suite in rma memory staging batch; do
    echo "== test_$suite, XFER_TCP_PUT_ACK=y"
    XFER_TCP_PUT_ACK=y "$build/test/test_$suite" || rc=1
done
for suite in tag rma tensor close; do
    echo "== test_$suite, XFER_TCP_LANES=1"
    XFER_TCP_LANES=1 "$build/test/test_$suite" || rc=1
done
for suite in tag rma tensor sizes memory staging faults batch; do
    echo "== test_$suite, XFER_TCP_LANES=4 XFER_TCP_LANE_MIN_SIZE=64k"
    XFER_TCP_LANES=4 XFER_TCP_LANE_MIN_SIZE=64k "$build/test/test_$suite" || rc=1
done
echo "== test_batch, XFER_TCP_SPLICE=n"
XFER_TCP_SPLICE=n "$build/test/test_batch" || rc=1
XFER_TCP_BUSY_POLL=y "$build/test/test_lanes" || rc=1
echo "== test_scale, XFER_TCP_BUSY_POLL=y"
XFER_TCP_BUSY_POLL=y "$build/test/test_scale" || rc=1
for suite in lanes scale; do
    echo "== test_$suite, XFER_TCP_LANE_WAIT=0: every lane connects from progress"
    XFER_TCP_LANE_WAIT=0 "$build/test/test_$suite" || rc=1
done
key=$(mktemp)
head -c 32 /dev/urandom >"$key"
chmod 600 "$key"
for suite in lanes tag rma tensor; do
    echo "== test_$suite, XFER_AUTH_KEY_FILE set, XFER_TCP_LANES=4"
    XFER_AUTH_KEY_FILE=$key XFER_TCP_LANES=4 XFER_TCP_LANE_MIN_SIZE=64k \
        "$build/test/test_$suite" || rc=1
done
rm -f "$key"
exit $rc
