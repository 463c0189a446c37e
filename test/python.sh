#!/usr/bin/env bash
# The Python binding's pytest suite (contrib/python/tests) against this build tree's package
# (built by `make` into build/contrib/python when configure found a python3 with Cython, numpy
# and pytest), over tcp and over shm (XFERTEST_PYTHON_TRANSPORTS); the framework tests take
# Debian's python3-torch, and say so when they skip without it.
set -u
build=${XFERTEST_BUILD_DIR:?set by make check}
src=${XFERTEST_SRC_DIR:?set by make check}
py=${XFERTEST_PYTHON:-}

if [[ -z $py ]]; then
    echo "SKIP: the Python binding: ${XFERTEST_PYTHON_WHY:-configure found no python3}"
    exit 77
fi
# shellcheck source=python_env.sh
. "$src/test/python_env.sh"
skip_if_sanitized "the Python binding"
if ! ls "$build"/contrib/python/xfer/_core*.so >/dev/null 2>&1; then
    echo "FAIL: $build/contrib/python/xfer has no built extension (make python-build says why)"
    exit 1
fi
cd "$build/contrib/python" || exit 1
# the same suite over each transport the binding's users meet on one host
rc=0
for transport in ${XFERTEST_PYTHON_TRANSPORTS:-tcp shm}; do
    echo "== the Python binding over $transport"
    XFERTEST_TRANSPORT=$transport PYTHONPATH="$build/contrib/python" "$py" -m pytest -q \
        -p no:cacheprovider "$src/contrib/python/tests" || rc=1
done
# `pip wheel contrib/python`, as a user builds it, builds out of the source tree too: nothing
# of either build is left in it
wheels=$(mktemp -d)
if ! XFER_BUILD_DIR=$build XFER_SRC_DIR=$src "$py" -m pip wheel --no-deps --no-build-isolation \
        --no-index -q -w "$wheels" "$src/contrib/python" >"$wheels/log" 2>&1; then
    echo "FAIL: pip wheel contrib/python:"; tail -20 "$wheels/log"
    rc=1
elif ! ls "$wheels"/xfer-*.whl >/dev/null 2>&1; then
    echo "FAIL: pip wheel contrib/python made no wheel"
    rc=1
fi
rm -rf "$wheels"
for made in build xfer.egg-info xfer/_core.c xfer/_core.cpython-*.so; do
    for path in "$src"/contrib/python/$made; do
        if [[ -e $path ]]; then
            echo "FAIL: building the Python package wrote $path into the source tree"
            rc=1
        fi
    done
done
exit $rc
