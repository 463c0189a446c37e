#!/usr/bin/env bash
# NIXL's XFER backend (contrib/nixl) under an unmodified NIXL: test/nixl/test_nixl.py through
# NIXL's Python API, once over each transport xfer's users meet on one host
# (XFERTEST_NIXL_TRANSPORTS, default "tcp shm"). The python is XFERTEST_NIXL_PYTHON, else
# the one contrib/nixl/setup.sh installs NIXL for (build/nixl-venv); without NIXL the test
# is skipped and says why.
set -u
build=${XFERTEST_BUILD_DIR:?set by make check}
src=${XFERTEST_SRC_DIR:?set by make check}
py=${XFERTEST_NIXL_PYTHON:-$build/nixl-venv/bin/python}

# shellcheck source=python_env.sh
. "$src/test/python_env.sh"
skip_if_sanitized "NIXL's backend"
# shellcheck source=../contrib/nixl/nixl_env.sh
. "$src/contrib/nixl/nixl_env.sh"
if ! nixl_env "$build" "$py"; then
    echo "SKIP: NIXL's backend: $NIXL_ENV_WHY"
    exit 77
fi
trap 'rm -rf "$NIXL_PLUGIN_DIR"' EXIT
export XFER_NIXL_HOST=127.0.0.1
cuda_lib=${XFERTEST_NIXL_CUDA_LIB:-$build/test/plugins/.libs/fakecuda.so}
rc=0
for transport in ${XFERTEST_NIXL_TRANSPORTS:-tcp shm}; do
    echo "== NIXL's XFER backend over $transport"
    XFER_TRANSPORTS=$transport "$py" -m pytest -q -p no:cacheprovider "$src/test/nixl/test_nixl.py" || rc=1
    # VRAM descriptors, with the CUDA driver xfer loads: the stand-in test/plugins/fake_cuda.c
    # here (XFERTEST_NIXL_CUDA_LIB names another, e.g. libcuda.so.1 on a GPU machine)
    echo "== NIXL's XFER backend with VRAM over $transport"
    XFER_TRANSPORTS=$transport XFER_CUDA_LIB=$cuda_lib "$py" -m pytest -q -p no:cacheprovider \
        "$src/test/nixl/test_nixl_vram.py" || rc=1
done
exit $rc
