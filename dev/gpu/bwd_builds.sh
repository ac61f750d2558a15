#!/usr/bin/env bash
# bwd_builds.sh - one device call that checks and times several builds of
# the CUDA backward side by side (e.g. main and the branches that wait for a
# GPU): for each build, the GPU backward tests (test_gpu_bwd) and
# dev/gpu/bwd_quick.py's checks against the fp64 reference; then every
# build's per-kernel times, in two rounds of alternating order (so drift
# shows as a difference between rounds, not between builds).
#
#   dev/gpu/bwd_builds.sh [FOLDER]      (default .bwdbuilds)
#
# FOLDER holds one subfolder per build (its name is the build's label) with
# libflashqla.so and tests/test_gpu_bwd, the whole folder packed by
# dev/gpu/pack.sh or not. On the dev machine, per build:
#   git checkout BRANCH && make build/libflashqla.so build/tests/test_gpu_bwd &&
#   mkdir -p .bwdbuilds/LABEL && cp build/libflashqla.so build/tests/test_gpu_bwd .bwdbuilds/LABEL/
# then dev/gpu/pack.sh .bwdbuilds and carry .bwdbuilds (about 5 MB a build).
# Output under $OUT: summary.txt (everything that matters) and logs.tgz.
# QUICK_ROWS: the timed shapes (bwd_quick.py --rows, e.g. '16,32,32768,1;2,4,8192,1');
# QUICK_ARGS: more bwd_quick.py options for the timing (e.g. --ungated 0.25).
# SKIP_TESTS: builds (space-separated labels) whose checks are skipped (e.g. a base already checked).
set -u
OUT=${OUT:-/tmp/bwd_builds}
mkdir -p "$OUT" /tmp/bwd_builds_logs
LOG=/tmp/bwd_builds_logs
BIN=${1:-.bwdbuilds}
. "$(dirname "$0")/unpack.sh"
S=$OUT/summary.txt
: > "$S"
# main first (the base of the comparison), then the others in name order
labels=$(cd "$BIN" && ls -d */ | tr -d / | awk '$0 == "main" { print; next } { rest = rest " " $0 } END { print rest }' |
  tr '\n' ' ')
echo "builds: $labels" | tee -a "$S"
for b in $labels; do
  case " ${SKIP_TESTS:-} " in *" $b "*) echo "== $b: checks skipped" | tee -a "$S"; continue ;; esac
  echo "== $b: test_gpu_bwd" | tee -a "$S"
  LD_LIBRARY_PATH=$BIN/$b timeout 200 "$BIN/$b/test_gpu_bwd" > "$LOG/$b.test.log" 2>&1
  echo "rc=$? $(tail -n 1 "$LOG/$b.test.log")" | tee -a "$S"
  grep -E "FAIL|differs" "$LOG/$b.test.log" | head -20 | tee -a "$S"
  echo "== $b: bwd_quick checks" | tee -a "$S"
  PYTHONPATH=python FLASHQLA_LIB=$BIN/$b/libflashqla.so timeout 200 python3 dev/gpu/bwd_quick.py --no-time \
    > "$LOG/$b.quick.log" 2>&1
  grep -vE "Warn|_warn_once" "$LOG/$b.quick.log" | tee -a "$S"
done
for round in 1 2; do
  order=$labels
  [ "$round" = 2 ] && order=$(echo "$labels" | tr ' ' '\n' | tac | tr '\n' ' ')
  for b in $order; do
    echo "== round $round, $b: timing" | tee -a "$S"
    PYTHONPATH=python FLASHQLA_LIB=$BIN/$b/libflashqla.so timeout 120 python3 dev/gpu/bwd_quick.py --time-only \
      ${QUICK_ROWS:+--rows "$QUICK_ROWS"} ${QUICK_ARGS:-} \
      2>&1 | grep -vE "Warn|_warn_once" | tee -a "$S"
  done
done
tar czf "$OUT/logs.tgz" -C "$LOG" .
