# Sourced by the scripts that run python3 over this build (python.sh, nixl.sh, ray.sh).
#   skip_if_sanitized WHAT  exit 77 (make check's skip), saying why, when libxfer in
#                           $build was built with the sanitizers: python3 would need their
#                           runtime preloaded, and the C suites cover the library there
skip_if_sanitized() {
    if ldd "$build/framework/.libs/libxfer.so" 2>/dev/null | grep -q libasan; then
        echo "SKIP: $1: this build has the sanitizers, which python3 would need preloaded;" \
             "the C suites cover the library here"
        exit 77
    fi
}
