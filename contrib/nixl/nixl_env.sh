# Sourced: nixl_env BUILD PYTHON sets up the environment in which an unmodified NIXL (the one
# PYTHON imports) runs this build's backend plug-in beside NIXL's own UCX backend - as
# test/nixl.sh and contrib/bench/bench_nixl.sh run it. It returns 1, with the reason in
# NIXL_ENV_WHY, when BUILD has no plug-in or PYTHON no NIXL; the caller removes
# $NIXL_PLUGIN_DIR at exit.
#   NIXL_PLUGIN_DIR   a new directory with this build's libplugin_XFER.so and NIXL's
#                     libplugin_UCX.so (the variable replaces NIXL's own directory), whose
#                     bundled UCX libraries are then found through LD_LIBRARY_PATH
#   XFER_COMPONENT_PATH  xfer's transports from BUILD, not an installed xfer
#   UCX_MODULES=^ib   NIXL 1.5.1's UCX loads its InfiniBand module, whose bundled libnl-route
#                     crashes in its ELF destructor at every process exit (rtnl_tc_unregister);
#                     without it UCX's tcp, shared memory and self transports remain
nixl_env() {
    local build=$1 py=$2 site
    if [[ ! -f $build/contrib/nixl/.libs/libplugin_XFER.so ]]; then
        NIXL_ENV_WHY="no NIXL plug-in in $build (${XFERTEST_NIXL_WHY:-configure found no C++17 compiler})"
        return 1
    fi
    if [[ ! -x $py ]] || ! site=$("$py" -c 'import nixl_cu13, os; print(os.path.dirname(os.path.dirname(nixl_cu13.__file__)))' 2>/dev/null); then
        NIXL_ENV_WHY="no python with NIXL at $py (contrib/nixl/setup.sh installs it)"
        return 1
    fi
    NIXL_PLUGIN_DIR=$(mktemp -d) || return 1
    ln -s "$build/contrib/nixl/.libs/libplugin_XFER.so" "$NIXL_PLUGIN_DIR/"
    ln -s "$site/.nixl_cu13.mesonpy.libs/plugins/libplugin_UCX.so" "$NIXL_PLUGIN_DIR/"
    export NIXL_PLUGIN_DIR
    export LD_LIBRARY_PATH=$build/framework/.libs:$site/nixl_cu13.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export XFER_COMPONENT_PATH=$build/components/tcp/.libs:$build/components/shm/.libs
    export UCX_MODULES=^ib
}
