#!/usr/bin/env bash
# Install the NIXL that contrib/nixl is built and tested against into a virtual environment
# (default build/nixl-venv, where test/nixl.sh looks), on top of Debian's python3 and its
# packages (numpy, pytest, torch). The versions are pinned: NIXL's backend ABI is C++ and
# changes between releases (contrib/nixl/nixl_abi.h).
#   nixl-cu13 1.5.1: NIXL with its UCX backend (UCX 1.23 bundled); its dependency on torch is
#                    not needed to import it, and Debian's python3-torch stands in.
#   nixl 1.5.1:      the `nixl` package that picks nixl_cu13 (1.5.2's pins a nixl-cu12 that
#                    was never published, and does not install).
# Safe to run again. Usage: contrib/nixl/setup.sh [VENV]
set -euo pipefail
venv=${1:-build/nixl-venv}
if [[ -x $venv/bin/python ]] && "$venv/bin/python" -c 'import nixl_cu13' 2>/dev/null; then
    echo "NIXL is installed in $venv"
    exit 0
fi
/usr/bin/python3 -m venv --system-site-packages "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check --no-deps nixl-cu13==1.5.1 nixl==1.5.1
"$venv/bin/python" -c 'import nixl_cu13; from nixl._api import nixl_agent' 
echo "NIXL 1.5.1 installed in $venv"
