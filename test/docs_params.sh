#!/usr/bin/env bash
# The docs cannot drift from the code: docs/parameters.md must be what `xfer_info --markdown`
# prints from the parameter tables (a component that does not load on this host is compared
# without its section, and said); every XFER_* variable README.md names must be one of them,
# or one that a caller reads itself; and every call xfer/xfer.h declares must appear in
# README.md's "The API in one page".
set -u
build=${XFERTEST_BUILD_DIR:?set by make check}
src=${XFERTEST_SRC_DIR:?set by make check}
info=${XFERTEST_INFO:-$build/contrib/xfer_info}
doc=$src/docs/parameters.md
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT

if ! "$info" --markdown > "$tmp/generated.md"; then
    echo "FAIL: $info --markdown failed"
    exit 1
fi
cp "$doc" "$tmp/doc.md"
# sections (components) the generator has not: not loaded here
for section in $(grep '^## ' "$doc" | cut -c4-); do
    if ! grep -qx "## $section" "$tmp/generated.md"; then
        echo "note: component $section does not load here; its section is not compared"
        awk -v s="## $section" '$0 == s {skip = 1; next} /^## / {skip = 0} !skip' \
            "$tmp/doc.md" > "$tmp/doc2.md" && mv "$tmp/doc2.md" "$tmp/doc.md"
    fi
done
if ! diff -u "$tmp/doc.md" "$tmp/generated.md" > "$tmp/diff"; then
    echo "FAIL: docs/parameters.md is not what the parameter tables say; regenerate it:"
    echo "  $info --markdown > docs/parameters.md"
    head -40 "$tmp/diff"
    exit 1
fi
# callers' own variables (xfer_context_params_t.env_names) and name patterns
own='^XFER_NCCL_HOST$'
rc=0
for name in $(grep -o '`XFER_[A-Z0-9_]*`' "$src/README.md" | tr -d '`' | sort -u); do
    case $name in
        *_) continue ;;     # a prefix (XFER_TCP_...)
    esac
    if ! grep -q "^| \`$name\` " "$doc" && ! [[ $name =~ $own ]] &&
       ! grep -q "define $name\b\|^ *$name *=" "$src/framework/include/xfer/xfer.h"; then
        echo "FAIL: README.md names $name, which no parameter table declares"
        rc=1
    fi
done
api=$(awk '/^## The API in one page/ {on = 1; next} /^## / {on = 0} on' "$src/README.md")
for call in $(grep -A1 'XFER_API' "$src/framework/include/xfer/xfer.h" | grep -o 'xfer_[a-z0-9_]*(' |
              tr -d '(' | sort -u); do
    if ! grep -q "$call" <<< "$api"; then
        echo "FAIL: README.md's API page does not show $call (xfer/xfer.h declares it)"
        rc=1
    fi
done
[[ $rc == 0 ]] && echo "PASS: docs/parameters.md matches the tables ($(grep -c '^| `XFER' \
    "$tmp/generated.md") parameters); README names only real variables and shows every call"
exit $rc
