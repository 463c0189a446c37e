#!/usr/bin/env bash
# xfer's NIXL backend against NIXL's UCX backend through NIXL's API (bench_nixl.py says what
# and how), in both modes: each backend's choice on one host (shm), and tcp on loopback.
# Usage: contrib/bench/bench_nixl.sh [BUILD_DIR] [--rounds R] [--out DIR]
#   BUILD_DIR  default build (with contrib/nixl/setup.sh's NIXL in BUILD_DIR/nixl-venv)
#   --out DIR  also write nixl_<mode>.json there
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=build
if [[ $# -gt 0 && $1 != -* ]]; then build=$1; shift; fi
build=$(cd "$build" && pwd)
rounds=9 out=
while [[ $# -gt 0 ]]; do
    case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "bench_nixl: unknown argument $1" >&2; exit 1 ;;
    esac
done
# shellcheck source=../nixl/nixl_env.sh
. "$src/contrib/nixl/nixl_env.sh"
py=$build/nixl-venv/bin/python
nixl_env "$build" "$py" || { echo "bench_nixl: $NIXL_ENV_WHY" >&2; exit 1; }
trap 'rm -rf "$NIXL_PLUGIN_DIR"' EXIT
export XFER_NIXL_HOST=127.0.0.1
for mode in shm tcp; do
    # NIXL's Python logger prints a line per agent and backend created: not figures
    "$py" "$src/contrib/bench/bench_nixl.py" --mode "$mode" --rounds "$rounds" \
        ${out:+--json "$out/nixl_$mode.json"} | grep -v "NIXL INFO"
    echo
done
