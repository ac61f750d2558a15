#!/usr/bin/env bash
# check_version.sh - the version has one source, VERSION, and everything
# agrees with it: the header's defaults (a program built without the
# Makefile's -D), fqla_version() of the built library, `flashqla --version`,
# pyproject.toml's dynamic version (read from VERSION) and, when torch
# imports, flashqla.__version__ of the Python package. Exit 0 pass, 1 fail.
#
#   tests/check_version.sh [BUILD]
set -u
build=${1:-build}
cd "$(dirname "$0")/.."
fail() { echo "FAIL check_version: $*"; exit 1; }
version=$(cat VERSION)
echo "$version" | grep -qE '^[0-9]+\.[0-9]+\.[0-9]+$' || fail "VERSION '$version' is not MAJOR.MINOR.PATCH"
num=$(echo "$version" | awk -F. '{ print $1 * 10000 + $2 * 100 + $3 }')
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '#include "flashqla.h"\n#include <stdio.h>\nint main(void) { printf("%%s %%d\\n", FQLA_VERSION_STRING, FQLA_VERSION); return 0; }\n' > "$tmp/h.c"
"${CC:-cc}" -std=c99 -Iinclude "$tmp/h.c" -o "$tmp/h" && got=$("$tmp/h") || fail "header program"
[ "$got" = "$version $num" ] || fail "include/flashqla.h's defaults say '$got', VERSION $version"
printf '#include "flashqla.h"\n#include <stdio.h>\nint main(void) { printf("%%d\\n", fqla_version()); return 0; }\n' > "$tmp/l.c"
"${CC:-cc}" -std=c99 -Iinclude "$tmp/l.c" "$build/libflashqla.so" -Wl,-rpath,"$(cd "$build" && pwd)" -o "$tmp/l" \
  && got=$("$tmp/l") || fail "library program"
[ "$got" = "$num" ] || fail "fqla_version() of $build/libflashqla.so is $got, VERSION $version ($num)"
got=$("$build/flashqla" --version) || fail "flashqla --version"
[ "$got" = "flashqla $version" ] || fail "flashqla --version says '$got', VERSION $version"
grep -qE '^version = \{ *file *= *"VERSION" *\}' pyproject.toml && grep -q 'dynamic = \["version"\]' pyproject.toml \
  || fail "pyproject.toml does not take its version from VERSION"
if python3 -c 'import torch' >/dev/null 2>&1; then
  got=$(PYTHONPATH=python FLASHQLA_LIB="$(cd "$build" && pwd)/libflashqla.so" python3 -c 'import flashqla; print(flashqla.__version__)') \
    || fail "import flashqla"
  [ "$got" = "$version" ] || fail "flashqla.__version__ is $got, VERSION $version"
  py=" python $got;"
fi
echo "pass: VERSION $version; header $num; library $num; flashqla --version;${py:-} pyproject dynamic"
