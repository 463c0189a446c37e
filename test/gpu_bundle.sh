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
# It fails when ldd cannot find a library that is not glibc's or the driver's, and ends by
# printing the bundle's size.
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

# deps FILE: "NAME PATH" for each library ldd names for FILE, PATH "-" where it finds none
deps() {
    ldd "$1" 2>/dev/null | awk '$2 == "=>" {print $1, ($3 ~ /^\//) ? $3 : "-"}'
}

# the ELF files that run: what libtool put under .libs, and the programs built in place
mapfile -t elves < <(find "$build" -type f \( -path '*/.libs/*' -o -perm -u+x \) \
                          ! -name '*.o' ! -name '*.la' ! -name '*.lai' -print0 |
                     xargs -0 file -L | awk -F: '/ELF/ {print $1}')
elves+=("$(command -v jq)" "$(command -v ss)")
# the tree's own libraries (libxfer, the components): the wrappers find them, not ldd
declare -A own=()
while read -r name; do
    own[$name]=1
done < <(find "$build" -path '*/.libs/*' -name '*.so*' -printf '%f\n')
missing=0
for f in "${elves[@]}"; do
    while read -r name path; do
        if [[ $name =~ $host_lib ]] || [ -n "${own[$name]:-}" ] || [[ $path == "$build"/* ]] ||
           [ -e "$out/lib/$name" ]; then
            continue
        fi
        if [ "$path" = - ]; then
            echo "gpu_bundle: $f needs $name, which ldd does not find here" >&2
            missing=1
            continue
        fi
        cp -L "$path" "$out/lib/$name"
    done < <(deps "$f")
done
[ "$missing" = 0 ] || exit 1
cp -L "$(command -v jq)" "$(command -v ss)" "$out/bin/"
echo "gpu_bundle: $out: ${#elves[@]} programs and libraries, $(find "$out/lib" -type f | wc -l)" \
     "libraries bundled, $(du -sh "$out" | cut -f1) in all"
