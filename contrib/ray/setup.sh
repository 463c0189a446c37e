#!/usr/bin/env bash
# Install the Ray that contrib/ray is built and tested against into a virtual environment
# (default build/ray-venv, where test/ray.sh looks), on top of Debian's python3 and its
# packages (torch, numpy, pytest), which the venv sees. Pinned: Ray's tensor-transport
# interface (ray.experimental.rdt) is alpha and changes between releases.
#   ray 2.60.0: ray.experimental.register_tensor_transport and TensorTransportManager as
#               contrib/ray/xfer_ray/transport.py implements them
# Safe to run again. Usage: contrib/ray/setup.sh [VENV]
set -euo pipefail
venv=${1:-build/ray-venv}
if [[ -x $venv/bin/python ]] && "$venv/bin/python" -c 'import ray; assert ray.__version__ == "2.60.0"' 2>/dev/null; then
    echo "Ray is installed in $venv"
    exit 0
fi
/usr/bin/python3 -m venv --system-site-packages "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check ray==2.60.0
"$venv/bin/python" -c 'import ray.experimental.rdt, torch'
echo "Ray 2.60.0 installed in $venv"
