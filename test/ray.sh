#!/usr/bin/env bash
# xfer's Ray tensor transport (contrib/ray) on a real local Ray cluster: test/ray/test_ray.py
# once over each transport xfer's users meet on one host (XFERTEST_RAY_TRANSPORTS, default
# "tcp shm"), with test/ray/test_ray_two_nodes.py (a second raylet), then
# test/ray/test_ray_abort.py with Ray's fetch timeout cut short. The python
# is XFERTEST_RAY_PYTHON, else the one contrib/ray/setup.sh installs Ray for
# (build/ray-venv); without Ray the test is skipped and says why.
set -u
build=${XFERTEST_BUILD_DIR:?set by make check}
src=${XFERTEST_SRC_DIR:?set by make check}
py=${XFERTEST_RAY_PYTHON:-$build/ray-venv/bin/python}

# shellcheck source=python_env.sh
. "$src/test/python_env.sh"
skip_if_sanitized "Ray's xfer transport"
if ! ls "$build"/contrib/python/xfer/_core*.so >/dev/null 2>&1; then
    echo "SKIP: Ray's xfer transport: no Python binding in $build (${XFERTEST_PYTHON_WHY:-make python-build says why})"
    exit 77
fi
if [[ ! -x $py ]] || ! "$py" -c 'import ray.experimental.rdt, torch' 2>/dev/null; then
    echo "SKIP: Ray's xfer transport: no python with Ray and torch at $py (contrib/ray/setup.sh installs Ray)"
    exit 77
fi
# Every Ray worker inherits this environment from the raylet that ray.init() starts here:
# the transport's package, the tests' module (whose actor classes the workers import), this
# build's binding, library and transports; no token prompt.
export PYTHONPATH=$src/contrib/ray:$src/test/ray:$build/contrib/python${PYTHONPATH:+:$PYTHONPATH}
export LD_LIBRARY_PATH=$build/framework/.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export XFER_COMPONENT_PATH=$build/components/tcp/.libs:$build/components/shm/.libs
export XFER_RAY_HOST=127.0.0.1
export RAY_AUTH_MODE=disabled RAY_USAGE_STATS_ENABLED=0
rc=0
for transport in ${XFERTEST_RAY_TRANSPORTS:-tcp shm}; do
    echo "== Ray's xfer transport over $transport"
    # each file in its own process: Ray's failure monitor outlives ray.shutdown() and would
    # look up the first cluster's objects in the second
    for file in test_ray.py test_ray_two_nodes.py; do
        XFER_TRANSPORTS=$transport "$py" -m pytest -q -p no:cacheprovider "$src/test/ray/$file" || rc=1
    done
done
echo "== Ray aborts a transfer that outlives its fetch timeout"
RAY_rdt_fetch_fail_timeout_milliseconds=1500 "$py" -m pytest -q -p no:cacheprovider \
    "$src/test/ray/test_ray_abort.py" || rc=1
exit $rc
