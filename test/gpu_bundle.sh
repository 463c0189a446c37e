#!/bin/bash
# test/gpu_bundle.sh [BUILD_DIR] [OUT_DIR]: a built tree and the shared libraries it needs, for
# a machine with an NVIDIA GPU and its driver but not xfer's build dependencies (UCX, hwloc,
# Criterion, rdma-core), such as a device machine lent for a short while:
#   OUT_DIR/build  the tree without its objects (*.o, *.lo's objects, .deps), which the suites
#                  and tools run from;
#   OUT_DIR/lib    every library that ldd names for xfer's libraries, components, test suites,
#                  test plugins and tools, but glibc's own and the GPU driver (the machine's);
#   OUT_DIR/bin    jq and ss, which the suites and benches call.
# Defaults: BUILD_DIR ./build, OUT_DIR ./.dev (ignore it: echo /.dev/ >> .git/info/exclude).
# libtool's wrappers name the build tree by its absolute path, so on the other machine the
# checkout must sit at the same path as here, and OUT_DIR/build be moved (not linked: the
# component loader compares real paths) to where BUILD_DIR was:
#   mv .dev/build build
#   export LD_LIBRARY_PATH=$PWD/.dev/lib PATH=$PWD/.dev/bin:$PATH
#   bash test/gpu_suites.sh build && bash contrib/bench/bench_gpu.sh build
# It ends by checking that every library named is either in OUT_DIR/lib, in the tree, or
# glibc's or the driver's, and prints the bundle's size.
set -euo pipefail

build=$(cd "${1:-build}" && pwd)
out=${2:-.dev}
[ -x "$build/contrib/xfer_info" ] || { echo "gpu_bundle: $build is not a built tree" >&2; exit 2; }
for tool in ldd jq ss; do
    command -v "$tool" >/dev/null || { echo "gpu_bundle: $tool not found" >&2; exit 2; }
done

# glibc's libraries and the CUDA driver: the other machine has its own, which must be used
host_lib='^(libc|libm|libpthread|libdl|librt|libresolv|libutil|ld-linux[-a-z0-9_]*|libcuda|libnvidia-[a-z0-9_-]+)\.so'

rm -rf "$out"
mkdir -p "$out/lib" "$out/bin"
# the tree without what only a rebuild needs
tar -C "$(dirname "$build")" --exclude='*.o' --exclude='.deps' -cf - "$(basename "$build")" |
    tar -C "$out" -xf -
[ "$(basename "$build")" = build ] || mv "$out/$(basename "$build")" "$out/build"

# the ELF files that run: what libtool put under .libs, and the programs built in place
mapfile -t elves < <(find "$build" -type f \( -path '*/.libs/*' -o -perm -u+x \) \
                          ! -name '*.o' ! -name '*.la' ! -name '*.lai' -print0 |
                     xargs -0 file -L | awk -F: '/ELF/ {print $1}')
declare -A need=()
for f in "${elves[@]}"; do
    while read -r name path; do
        [[ $name =~ $host_lib ]] && continue
        [[ $path == "$build"/* ]] && continue
        need[$name]=$path
    done < <(ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}')
done
for name in "${!need[@]}"; do
    cp -L "${need[$name]}" "$out/lib/$name"
done
cp -L "$(command -v jq)" "$(command -v ss)" "$out/bin/"
for tool in jq ss; do
    while read -r name path; do
        [[ $name =~ $host_lib ]] || [ -e "$out/lib/$name" ] || cp -L "$path" "$out/lib/$name"
    done < <(ldd "$(command -v "$tool")" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}')
done

# every library named is in the bundle, in the tree, or the machine's own
missing=0
for f in "${elves[@]}"; do
    while read -r name path; do
        if ! [[ $name =~ $host_lib ]] && [[ $path != "$build"/* ]] && ! [ -e "$out/lib/$name" ]
        then
            echo "gpu_bundle: $f needs $name, not bundled" >&2
            missing=1
        fi
    done < <(ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}')
done
[ "$missing" = 0 ] || exit 1
echo "gpu_bundle: $out: ${#elves[@]} programs and libraries, $(find "$out/lib" -type f | wc -l) libraries bundled," \
     "$(du -sh "$out" | cut -f1) in all"
