#!/usr/bin/env bash
# check_config.sh - the build follows its configuration: in a scratch build
# folder, a CPU-only library is built; the same configuration is then up to
# date and leaves $(BUILD)/config-c.stamp untouched; other CFLAGS, and (when
# nvcc is found) the CUDA switch, rewrite it and put the library out of date;
# switching CUDA off again leaves config-cu.stamp (the CUDA objects) alone.
# A few seconds (the C sources once, -j). Exit 0 pass, 1 fail.
#
#   tests/check_config.sh
set -u
cd "$(dirname "$0")/.."
fail() { echo "FAIL check_config: $*"; exit 1; }
# a make of its own, not the calling make's variables or jobserver
unset MAKEFLAGS MFLAGS MAKELEVEL
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mk() { make --no-print-directory BUILD="$tmp/b" "$@"; }
lib=$tmp/b/libflashqla.a
mk -s -j"$(nproc 2>/dev/null || echo 2)" CUDA=0 CFLAGS=-O1 "$lib" > "$tmp/log" 2>&1 || { tail -n 20 "$tmp/log"; fail "CPU-only build"; }
stamp=$(cat "$tmp/b/config-c.stamp")
echo "$stamp" | grep -q 'cflags=-O1 ' || fail "the stamp does not record CFLAGS: $stamp"
touch -d '2000-01-01' "$tmp/b/config-c.stamp"
mk -q CUDA=0 CFLAGS=-O1 "$lib" || fail "the same configuration is not up to date"
[ "$(stat -c %Y "$tmp/b/config-c.stamp")" = "$(date -d 2000-01-01 +%s)" ] || fail "the same configuration rewrote the stamp"
mk -q CUDA=0 CFLAGS=-O2 "$lib" && fail "other CFLAGS leave the library up to date"
grep -q 'cflags=-O2 ' "$tmp/b/config-c.stamp" || fail "other CFLAGS did not rewrite the stamp"
mk -q CUDA=0 CFLAGS=-O2 "$tmp/b/obj/src/api.o" && fail "other CFLAGS leave an object up to date"
mk -q CUDA=0 CFLAGS=-O1 DEV=0 "$lib" && fail "back to the first CFLAGS: not rebuilt"
msg="CFLAGS tracked"
if command -v nvcc >/dev/null || [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]; then
  mk -q CFLAGS=-O1 "$lib" && fail "switching CUDA on leaves the library up to date"
  grep -q 'nvcc=/' "$tmp/b/config-cu.stamp" || fail "nvcc is not in config-cu.stamp"
  touch -d '2000-01-01' "$tmp/b/config-cu.stamp"
  mk -q CUDA=0 CFLAGS=-O1 "$lib"
  [ "$(stat -c %Y "$tmp/b/config-cu.stamp")" = "$(date -d 2000-01-01 +%s)" ] \
    || fail "switching CUDA off rewrote config-cu.stamp (the CUDA objects would be rebuilt)"
  msg="$msg; the CUDA switch tracked"
fi
echo "pass: config stamp: $msg"
