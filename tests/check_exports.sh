#!/usr/bin/env bash
# check_exports.sh - the shared library exports exactly the public API: every
# function declared FQLA_API in include/flashqla.h, and nothing else (the
# library is compiled with hidden visibility and links the static CUDA runtime
# without re-exporting it). In a developer build (DEV=1 as second argument),
# the dev hooks fqla_dev_* and fqla_cuda_* are allowed besides.
#
#   tests/check_exports.sh LIB.so [DEV]     DEV: 1 for a `make DEV=1` library, else 0
#
# Exit status: 0 pass, 1 fail, 77 skipped (no nm, or no library).
set -u
lib=${1:?usage: tests/check_exports.sh LIB.so [DEV]}
dev=${2:-0}
header="$(cd "$(dirname "$0")/.." && pwd)/include/flashqla.h"

if ! command -v nm >/dev/null 2>&1; then
  echo "skip: nm not found (binutils)"; exit 77
fi
if [ ! -f "$lib" ]; then
  echo "skip: $lib not built"; exit 77
fi

tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
# declared: the name before the first '(' of each FQLA_API line
grep -E '^FQLA_API ' "$header" | sed -E 's/\(.*//; s/.*[^A-Za-z0-9_]([A-Za-z0-9_]+)$/\1/' | sort -u > "$tmp/declared"
if ! nm -D --defined-only "$lib" > "$tmp/nm" 2>"$tmp/nm.err"; then
  cat "$tmp/nm.err"; echo "FAIL: nm -D $lib"; exit 1
fi
awk 'NF >= 3 { print $3 }' "$tmp/nm" | sed 's/@.*//' | sort -u > "$tmp/exported"

fail=0
if [ ! -s "$tmp/declared" ]; then
  echo "FAIL: no FQLA_API declarations found in $header"; exit 1
fi
# a function declared without FQLA_API would be hidden by the build
unmarked=$(grep -nE '^[A-Za-z_][A-Za-z0-9_ ]*[ *]fqla_[A-Za-z0-9_]+\(' "$header" | grep -v ':FQLA_API ' || true)
if [ -n "$unmarked" ]; then
  echo "FAIL: declared in include/flashqla.h without FQLA_API (hidden, not exported):"
  printf '%s\n' "$unmarked" | sed 's/^/  line /'
  fail=1
fi
# exported but not declared (dev hooks allowed in a DEV build)
extra=$(comm -13 "$tmp/declared" "$tmp/exported")
if [ "$dev" = 1 ]; then
  extra=$(printf '%s\n' "$extra" | grep -vE '^fqla_(dev|cuda)_[A-Za-z0-9_]+$' || true)
fi
if [ -n "$extra" ]; then
  echo "FAIL: exported by $lib but not declared in include/flashqla.h:"
  printf '  %s\n' $extra
  fail=1
fi
# declared but not exported
missing=$(comm -23 "$tmp/declared" "$tmp/exported")
if [ -n "$missing" ]; then
  echo "FAIL: declared in include/flashqla.h but not exported by $lib:"
  printf '  %s\n' $missing
  fail=1
fi
if [ "$fail" -eq 0 ]; then
  echo "ok: $lib exports the $(wc -l < "$tmp/declared") public functions and nothing else$([ "$dev" = 1 ] && echo ' (dev hooks allowed)')"
fi
exit "$fail"
