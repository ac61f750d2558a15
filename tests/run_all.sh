#!/usr/bin/env bash
# `make test`: the tests, the symbols the shared library exports, the same
# tests under ASan+UBSan, a bounded libFuzzer run over the argument
# validation, and the Python tests when the package's dependencies are
# importable. Ends with one line: N passed, N failed, N skipped.
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

section "tests under ASan + UBSan ($build/asan/tests, quick sizes)"
out=$(FQLA_TEST_QUICK=1 ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
      "$here/run_tests.sh" "$build/asan/tests" 2>&1); printf '%s\n' "$out"; add "$(printf '%s\n' "$out" | tail -n 1)"

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
