#!/usr/bin/env bash
# `make test`: the tests, the symbols the shared library exports, the same
# tests under ASan+UBSan, test_handles under ThreadSanitizer, a bounded
# libFuzzer run over the argument validation, the programs of examples/, and
# the Python tests when the package's dependencies are importable. Ends with
# one line: N passed, N failed, N skipped.
set -u
build=${1:-build}
fuzz_seconds=${2:-90}
here=$(cd "$(dirname "$0")" && pwd)
total_p=0 total_f=0 total_s=0
add() { # add "N passed, N failed, N skipped"
  local l=$1
  total_p=$((total_p + $(echo "$l" | sed -E 's/^([0-9]+) passed.*/\1/')))
  total_f=$((total_f + $(echo "$l" | sed -E 's/.* ([0-9]+) failed.*/\1/')))
  total_s=$((total_s + $(echo "$l" | grep -oE '[0-9]+ skipped' | grep -oE '[0-9]+' || echo 0)))
}
section() { echo; echo "######## $1"; }

section "tests ($build/tests)"
out=$("$here/run_tests.sh" "$build/tests" 2>&1); printf '%s\n' "$out"; add "$(printf '%s\n' "$out" | tail -n 1)"

section "exported symbols ($build/libflashqla.so)"
"$here/check_exports.sh" "$build/libflashqla.so" "${FQLA_DEV_BUILD:-0}"
case $? in
  0) add "1 passed, 0 failed" ;;
  77) add "0 passed, 0 failed, 1 skipped" ;;
  *) echo "FAIL check_exports"; add "0 passed, 1 failed" ;;
esac

section "packaging: version, config stamp, make install + pkg-config"
# VERSION agrees with the header, the library, the CLI and Python; the build
# follows its configuration (tests/check_config.sh builds the C sources once in
# a scratch folder); `make install` of the library built here, and
# docs/example.c built against it with pkg-config. The sdist check is slower
# and apart: tests/check_sdist.sh.
for chk in check_version check_config check_install; do
  case $chk in
    check_install) "$here/$chk.sh" "$build" "${FQLA_DEV_BUILD:-0}" ;;
    check_version) "$here/$chk.sh" "$build" ;;
    *) "$here/$chk.sh" ;;
  esac
  case $? in
    0) add "1 passed, 0 failed" ;;
    77) add "0 passed, 0 failed, 1 skipped" ;;
    *) echo "FAIL $chk"; add "0 passed, 1 failed" ;;
  esac
done

section "tests under ASan + UBSan ($build/asan/tests, quick sizes; CUDA stubbed in this build)"
out=$(FQLA_TEST_QUICK=1 ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
      "$here/run_tests.sh" "$build/asan/tests" 2>&1); printf '%s\n' "$out"; add "$(printf '%s\n' "$out" | tail -n 1)"

section "test_handles under ThreadSanitizer ($build/tsan/tests, quick sizes)"
# Calls, fqla_context_set_threads and destroys on one context from several
# threads: TSan reports an unsynchronised access that the plain run cannot see.
# Built here from the library's C sources; skipped where TSan cannot run.
tsan_dir="$(cd "$build" && pwd)/tsan"
tsan_cc=${CC:-cc}
mkdir -p "$tsan_dir/tests"
printf 'int main(void) { return 0; }\n' > "$tsan_dir/probe.c"
if ! { "$tsan_cc" -fsanitize=thread "$tsan_dir/probe.c" -o "$tsan_dir/probe" && "$tsan_dir/probe"; } >/dev/null 2>&1; then
  echo "skip: $tsan_cc cannot build or run a -fsanitize=thread program here"; add "0 passed, 0 failed, 1 skipped"
elif ! (cd "$here/.." && "$tsan_cc" -std=c99 -Wall -Wextra -pedantic -Iinclude -Isrc -Itests -pthread \
          -D_POSIX_C_SOURCE=200809L -O1 -g -fsanitize=thread src/*.c src/cpu/*.c tests/test_handles.c \
          tests/common/*.c -o "$tsan_dir/tests/test_handles" -lm) > "$tsan_dir/build.log" 2>&1; then
  tail -n 20 "$tsan_dir/build.log"; echo "FAIL TSan build of test_handles"; add "0 passed, 1 failed"
else
  out=$(FQLA_TEST_QUICK=1 TSAN_OPTIONS="halt_on_error=0 exitcode=66 ${TSAN_OPTIONS:-}" \
        "$here/run_tests.sh" "$tsan_dir/tests" 2>&1); printf '%s\n' "$out"; add "$(printf '%s\n' "$out" | tail -n 1)"
fi

section "aarch64: CPU build with the cross gcc, tests under qemu-aarch64 (build-aarch64/tests)"
# The NEON bodies of the fast CPU path and the portable ones, against the fp64
# reference (tests/run_aarch64.sh; skipped, with the reason, without the tools).
out=$("$here/run_aarch64.sh" build-aarch64 2>&1); printf '%s\n' "$out"; add "$(printf '%s\n' "$out" | tail -n 1)"

section "libFuzzer over argument validation (${fuzz_seconds}s)"
if [ -x "$build/fuzz/fuzz_validate" ]; then
  mkdir -p "$build/fuzz/corpus"
  if "$build/fuzz/fuzz_validate" -max_total_time="$fuzz_seconds" -print_final_stats=1 \
       "$build/fuzz/corpus" > "$build/fuzz/log" 2>&1; then
    grep -E 'stat::number_of_executed_units|Done' "$build/fuzz/log" | tail -n 2
    add "1 passed, 0 failed"
  else
    tail -n 40 "$build/fuzz/log"; echo "FAIL fuzz_validate"; add "0 passed, 1 failed"
  fi
else
  echo "skip: fuzz target not built (needs clang)"; add "0 passed, 0 failed, 1 skipped"
fi

section "examples (examples/)"
# The programs of examples/ run as a user would run them, so they stay true.
# Self-contained: the C examples are compiled here against $build/libflashqla.a
# (as the tests are; a CUDA build's archive also needs the CUDA runtime, tried
# second), the Python ones run on this checkout's package and $build's library.
# One count per example; the Python ones are skipped, with the reason, where
# torch or the package does not import.
ex_root=$(cd "$here/.." && pwd)
ex_build="$(cd "$build" && pwd)"
ex_dir="$ex_build/examples"
ex_p=0 ex_f=0 ex_s=0
mkdir -p "$ex_dir"
for ex_c in "$ex_root"/examples/*.c; do
  [ -e "$ex_c" ] || continue
  ex_name=$(basename "$ex_c" .c)
  echo "== examples/$ex_name.c"
  ex_cc() { (cd "$ex_root" && "${CC:-cc}" -std=c99 -Wall -Wextra -pedantic -O2 -Iinclude "$ex_c" \
              "$ex_build/libflashqla.a" -o "$ex_dir/$ex_name" -lm -pthread "$@"); }
  if ! ex_cc > "$ex_dir/$ex_name.build.log" 2>&1 &&
     ! ex_cc -L"${CUDA_HOME:-/usr/local/cuda}/lib64" -lcudart_static -ldl -lrt -lstdc++ \
         > "$ex_dir/$ex_name.build.log" 2>&1; then
    tail -n 20 "$ex_dir/$ex_name.build.log"; echo "FAIL examples/$ex_name.c: build"; ex_f=$((ex_f + 1)); continue
  fi
  if (cd "$ex_root" && timeout 60 "$ex_dir/$ex_name") 2>&1; then
    ex_p=$((ex_p + 1))
  else
    echo "FAIL examples/$ex_name.c: exit status $?"; ex_f=$((ex_f + 1))
  fi
done
for ex_py in "$ex_root"/examples/*.py; do
  [ -e "$ex_py" ] || continue
  echo "== examples/$(basename "$ex_py")"
  if ! ex_why=$(cd "$ex_root" && PYTHONPATH="$ex_root/python" FLASHQLA_LIB="$ex_build/libflashqla.so" \
                python3 -c 'import torch, flashqla' 2>&1); then
    echo "skip: torch or flashqla does not import ($(printf '%s\n' "$ex_why" | tail -n 1))"; ex_s=$((ex_s + 1)); continue
  fi
  if (cd "$ex_root" && PYTHONPATH="$ex_root/python${PYTHONPATH:+:$PYTHONPATH}" \
        FLASHQLA_LIB="$ex_build/libflashqla.so" timeout 120 python3 "$ex_py") 2>&1; then
    ex_p=$((ex_p + 1))
  else
    echo "FAIL examples/$(basename "$ex_py"): exit status $?"; ex_f=$((ex_f + 1))
  fi
done
add "$ex_p passed, $ex_f failed, $ex_s skipped"

section "python tests"
# The tests exercise this checkout's package and the library just built, not
# whatever flashqla may be installed in site-packages.
export PYTHONPATH="$here/../python${PYTHONPATH:+:$PYTHONPATH}"
export FLASHQLA_LIB="$(cd "$build" && pwd)/libflashqla.so"
if python3 -c 'import torch, numpy, pytest, flashqla' >/dev/null 2>&1; then
  out=$(cd "$here/.." && python3 -m pytest -q python/tests 2>&1); rc=$?
  printf '%s\n' "$out" | tail -n 30
  last=$(printf '%s\n' "$out" | grep -E '(passed|failed|skipped)' | tail -n 1)
  p=$(echo "$last" | grep -oE '[0-9]+ passed' | grep -oE '[0-9]+' || echo 0)
  f=$(echo "$last" | grep -oE '[0-9]+ (failed|error)' | grep -oE '[0-9]+' | paste -sd+ | bc 2>/dev/null || echo 0)
  s=$(echo "$last" | grep -oE '[0-9]+ skipped' | grep -oE '[0-9]+' || echo 0)
  [ -z "$f" ] && f=0
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
  add "$p passed, $f failed, $s skipped"
else
  echo "skip: python package or torch/numpy/pytest not importable"
  add "0 passed, 0 failed, 1 skipped"
fi

echo
echo "$total_p passed, $total_f failed, $total_s skipped"
[ "$total_f" -eq 0 ]
