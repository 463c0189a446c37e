#!/usr/bin/env bash
# Quick start on a fresh Debian machine: install what xfer needs, build it in build/ (out of
# tree), show the transports this host has (xfer_info), and run the main job: the
# hello_tensors demo, two processes moving tensors and tagged messages over loopback.
# Safe to run again: it skips what is already done.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS="build-essential autoconf automake libtool pkg-config libucx-dev libibverbs-dev
      librdmacm-dev ibverbs-providers libhwloc-dev libcriterion-dev jq libssl-dev"
# The Python binding (contrib/python) is built and tested with Debian's python3, and with
# Debian's torch as a real framework
PKGS="$PKGS python3-dev cython3 python3-setuptools python3-numpy python3-pytest python3-torch
      python3-pip python3-wheel python3-venv"
# The verbs suites run in a qemu guest with Soft-RoCE (contrib/rxe_guest): without these,
# make check skips them and says why.
PKGS="$PKGS qemu-system-x86 linux-image-amd64 busybox-static rdma-core ibverbs-utils perftest
      iproute2 kmod"
# shellcheck disable=SC2086
if ! dpkg -s $PKGS >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; fi
    $SUDO apt-get update -q
    # shellcheck disable=SC2086
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends $PKGS
fi

[ -x configure ] || ./autogen.sh
mkdir -p build
cd build
[ -f Makefile ] || ../configure
make -j"$(nproc)"
cd ..
# NIXL (pinned, from PyPI) for the test of xfer's NIXL backend (contrib/nixl); without it
# make check skips that test and says so
contrib/nixl/setup.sh build/nixl-venv ||
    echo "NIXL could not be installed from PyPI: make check skips contrib/nixl's test"
# Ray (pinned, from PyPI) for the test of xfer's Ray tensor transport (contrib/ray); without it
# make check skips that test and says so
contrib/ray/setup.sh build/ray-venv ||
    echo "Ray could not be installed from PyPI: make check skips contrib/ray's test"
cd build

echo
echo "== xfer_info: the transports this host has =="
./contrib/xfer_info

echo
echo "== hello_tensors: a producer and a consumer move tensors and messages over TCP loopback =="
echo "   (source: contrib/examples/hello_tensors.c; XFER_TRANSPORTS=tcp, the embedded default)"
XFER_TRANSPORTS=tcp ./contrib/examples/hello_tensors

echo
echo "== the same two processes with no XFER_TRANSPORTS: peers on one host choose shm =="
./contrib/examples/hello_tensors

echo
echo "Next: ./build/contrib/xfer_perf -h (bandwidth and latency), contrib/bench/bench_tcp.sh"
