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
plugin=$build/contrib/nixl/.libs/libplugin_XFER.so

if [[ ! -f $plugin ]]; then
    echo "SKIP: NIXL's backend: not built (${XFERTEST_NIXL_WHY:-configure found no C++17 compiler})"
    exit 77
fi
if [[ ! -x $py ]] || ! site=$("$py" -c 'import nixl_cu13, os; print(os.path.dirname(os.path.dirname(nixl_cu13.__file__)))' 2>/dev/null); then
    echo "SKIP: NIXL's backend: no python with NIXL at $py (contrib/nixl/setup.sh installs it)"
    exit 77
fi
if ldd "$build/framework/.libs/libxfer.so" 2>/dev/null | grep -q libasan; then
    echo "SKIP: NIXL's backend: this build has the sanitizers, which python3 would need" \
         "preloaded; the C suites cover the library here"
    exit 77
fi
# NIXL_PLUGIN_DIR replaces NIXL's plug-in directory: it gets the plug-in under test and NIXL's
# own UCX plug-in (test_nixl.py runs one test with both), whose bundled UCX libraries are found
# through LD_LIBRARY_PATH once it is not in its own directory.
plugins=$(mktemp -d)
trap 'rm -rf "$plugins"' EXIT
ln -s "$plugin" "$plugins/"
ln -s "$site/.nixl_cu13.mesonpy.libs/plugins/libplugin_UCX.so" "$plugins/"
export NIXL_PLUGIN_DIR=$plugins
export LD_LIBRARY_PATH=$build/framework/.libs:$site/nixl_cu13.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# xfer's transports from this build, not an installed xfer
export XFER_COMPONENT_PATH=$build/components/tcp/.libs:$build/components/shm/.libs
export XFER_NIXL_HOST=127.0.0.1
# NIXL 1.5.1's UCX loads its InfiniBand module, whose bundled libnl-route crashes in its ELF
# destructor at every process exit (rtnl_tc_unregister); without that module UCX's tcp, shared
# memory and self transports remain
export UCX_MODULES=^ib
rc=0
for transport in ${XFERTEST_NIXL_TRANSPORTS:-tcp shm}; do
    echo "== NIXL's XFER backend over $transport"
    XFER_TRANSPORTS=$transport "$py" -m pytest -q -p no:cacheprovider "$src/test/nixl/test_nixl.py" || rc=1
done
exit $rc
