#!/usr/bin/env bash
# The aarch64 section of `make test` (also `make test-aarch64`): the C library
# built CPU-only with Debian's cross gcc (aarch64-linux-gnu-gcc) into its own
# folder (build-aarch64/ by default; build/ is left alone), and the CPU test
# programs run under qemu-user. On aarch64 the fast CPU path takes its NEON
# bodies (decode / verify step, GEMM micro-kernel), and the tests that walk the
# matrix-kernel paths run the portable bodies too, each against the fp64
# reference. Correctness only: qemu's timings say nothing about an Arm CPU.
# Where the cross compiler or qemu-aarch64 is missing this prints why and
# counts one skip. Ends with one line: N passed, N failed, N skipped.
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
build=${1:-build-aarch64}
cross_cc=${AARCH64_CC:-aarch64-linux-gnu-gcc}
sysroot=${AARCH64_SYSROOT:-/usr/aarch64-linux-gnu}

missing=
command -v "$cross_cc" >/dev/null 2>&1 || missing="$missing $cross_cc"
command -v qemu-aarch64 >/dev/null 2>&1 || missing="$missing qemu-aarch64"
[ -d "$sysroot/lib" ] || missing="$missing $sysroot (libc6-dev-arm64-cross)"
if [ -n "$missing" ]; then
  echo "skip: aarch64 tests need$missing (Debian: apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)"
  echo "0 passed, 0 failed, 1 skipped"
  exit 0
fi

# Every C test program but the CUDA ones (no GPU code in this build) and the
# CLI's (it runs the x86 flashqla program).
progs=$(cd "$root" && ls tests/test_*.c | grep -v -e '^tests/test_gpu_' -e '^tests/test_cli\.c$' |
        sed -e "s|^tests/\(.*\)\.c$|$build/tests/\1|")
t0=$(date +%s)
# A make of its own (the parent's flags and jobserver are not ours); CFLAGS
# without the x86 -march. -O2 as on x86.
if ! (cd "$root" && env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -j"$(nproc 2>/dev/null || echo 2)" \
        BUILD="$build" CUDA=0 DEV=0 CC="$cross_cc" CFLAGS=-O2 $progs) > "$root/$build.log" 2>&1; then
  tail -n 30 "$root/$build.log"; echo "FAIL aarch64 build (log: $build.log)"
  echo "0 passed, 1 failed, 0 skipped"
  exit 1
fi
echo "built in $(( $(date +%s) - t0 )) s with $("$cross_cc" --version | head -n 1)"
rm -f "$root/$build.log"

t0=$(date +%s)
out=$(FQLA_TEST_RUNNER="qemu-aarch64 -L $sysroot" "$here/run_tests.sh" "$root/$build/tests" 2>&1); rc=$?
printf '%s\n' "$out" | sed '$d'
echo "ran under qemu-aarch64 in $(( $(date +%s) - t0 )) s"
printf '%s\n' "$out" | tail -n 1
exit $rc
