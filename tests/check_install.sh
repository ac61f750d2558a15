#!/usr/bin/env bash
# check_install.sh - `make install PREFIX=$tmp` of the library already built in
# BUILD (nothing is rebuilt), then docs/example.c built as a C user would with
# pkg-config (PKG_CONFIG_PATH=$tmp/lib/pkgconfig): against libflashqla.so and
# against libflashqla.a (pkg-config --static: Libs.private), both run; the
# installed header's version is VERSION's. Exit 0 pass, 1 fail, 77 skip (no
# pkg-config).
#
#   tests/check_install.sh [BUILD] [DEV]
set -u
build=${1:-build}
dev=${2:-0}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
command -v pkg-config >/dev/null || { echo "skip: no pkg-config"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL check_install: $*"; exit 1; }

# -o: the libraries count as up to date (the test installs what was built)
make --no-print-directory -s install PREFIX="$tmp" BUILD="$build" DEV="$dev" \
     -o "$build/libflashqla.a" -o "$build/libflashqla.so" > "$tmp/install.log" 2>&1 \
  || { cat "$tmp/install.log"; fail "make install"; }
for f in include/flashqla.h lib/libflashqla.a lib/libflashqla.so lib/pkgconfig/flashqla.pc; do
  [ -f "$tmp/$f" ] || fail "$f not installed"
done
export PKG_CONFIG_PATH="$tmp/lib/pkgconfig"
version=$(cat VERSION)
[ "$(pkg-config --modversion flashqla)" = "$version" ] || fail "flashqla.pc's version is not VERSION's ($version)"
cc=${CC:-cc}
cd "$tmp"   # docs/example.c builds and runs away from the checkout's include/
# shellcheck disable=SC2046
"$cc" -std=c99 "$root/docs/example.c" $(pkg-config --cflags --libs flashqla) -o ex_shared \
  || fail "cc docs/example.c \$(pkg-config --cflags --libs flashqla)"
LD_LIBRARY_PATH="$tmp/lib" ./ex_shared > ex_shared.out 2>&1 || { cat ex_shared.out; fail "example (shared) failed"; }
# static: the archive by name, then the private libraries pkg-config lists
# shellcheck disable=SC2046
"$cc" -std=c99 "$root/docs/example.c" $(pkg-config --cflags flashqla) -L"$tmp/lib" -l:libflashqla.a \
  $(pkg-config --static --libs flashqla | sed 's/-lflashqla\b//') -o ex_static \
  || fail "static link with pkg-config --static --libs flashqla"
./ex_static > ex_static.out 2>&1 || { cat ex_static.out; fail "example (static) failed"; }
printf '#include <flashqla.h>\n#include <stdio.h>\nint main(void) { printf("%%s %%d %%d\\n", FQLA_VERSION_STRING, FQLA_VERSION, fqla_version()); return 0; }\n' > v.c
# shellcheck disable=SC2046
"$cc" -std=c99 v.c $(pkg-config --cflags --libs flashqla) -o v && got=$(LD_LIBRARY_PATH="$tmp/lib" ./v) \
  || fail "version program"
want_num=$(echo "$version" | awk -F. '{ print $1 * 10000 + $2 * 100 + $3 }')
[ "$got" = "$version $want_num $want_num" ] || fail "installed header / library version '$got', VERSION $version"
echo "pass: make install PREFIX=\$tmp; docs/example.c built with pkg-config (shared and static) and run; version $version"
