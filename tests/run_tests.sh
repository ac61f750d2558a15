#!/usr/bin/env bash
# Runs every test program in a folder and adds up their closing lines
# ("N passed, N failed[, N skipped]"). A program that crashes or prints no
# closing line counts as one failure. Exit status 1 when anything failed.
# FQLA_TEST_RUNNER, when set, is put before each program (an emulator:
# tests/run_aarch64.sh runs the aarch64 build under qemu-aarch64).
set -u
dir=${1:?usage: run_tests.sh DIR}
passed=0 failed=0 skipped=0
for t in "$dir"/test_*; do
  [ -x "$t" ] || continue
  echo "== $(basename "$t")"
  out=$(${FQLA_TEST_RUNNER:-} "$t" 2>&1); rc=$?
  printf '%s\n' "$out" | grep -v '^ok ' || true
  last=$(printf '%s\n' "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
  if [ -z "$last" ]; then
    echo "  (no summary line; exit status $rc) counted as 1 failure"; failed=$((failed + 1)); continue
  fi
  p=$(echo "$last" | sed -E 's/^([0-9]+) passed.*/\1/')
  f=$(echo "$last" | sed -E 's/.* ([0-9]+) failed.*/\1/')
  s=$(echo "$last" | grep -oE '[0-9]+ skipped' | grep -oE '[0-9]+' || echo 0)
  passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
    echo "  exit status $rc with no failed case: counted as 1 failure"; failed=$((failed + 1))
  fi
done
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
