#!/usr/bin/env bash
# check_and_pair.sh - one device-machine call that checks a change to the
# CUDA backend and times it against a base build in the same process.
#
#   dev/gpu/check_and_pair.sh [build] [tests] [dev] [sanitize] [pytest] [pair]
#   (default: all of them, in that order)
#
# build     the product build (make -j16: library, CLI, every test program),
#           the DEV=1 build's test_gpu_fwd / test_gpu_decode (forced routes),
#           and the base build from the source tree in $BASE_SRC (default
#           .pair/base: e.g. `git archive <commit> | tar -x -C .pair/base`,
#           carried with the call) - all three at once.
# tests     tests/run_tests.sh over build/tests (every C and CUDA test program;
#           GPU tests run here, unlike CI).
# dev       the DEV build's GPU tests (the routes forced by hooks).
# sanitize  compute-sanitizer memcheck, racecheck, synccheck on small shapes
#           ($SANITIZE_FILTER of test_gpu_fwd, all of test_gpu_ptx).
# pytest    python/tests against build/libflashqla.so (the CUDA cases).
# pair      bench/bench_fwd.py --no-fla with --lib 'new=build/...,base=BASE/...'
#           over the 36 uniform rows and the quick rows, then
#           bench/summarize.py --pair new,base (ratios within one process).
# Logs and CSVs go to $OUT (folders are tarred: the tool returns few files).
set -u
OUT=${OUT:-/tmp/check_out}
mkdir -p "$OUT/logs"
LOG=$OUT/logs
BASE_SRC=${BASE_SRC:-.pair/base}
SANITIZE_FILTER=${SANITIZE_FILTER:-zero_len,trailing,head_dims}
export PYTHONUNBUFFERED=1
t_start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t_start ))s] $*" | tee -a "$OUT/summary.txt"; }
steps=${*:-build tests dev sanitize pytest pair}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
test_bins() { # every test program the Makefile of folder $1 knows, as build targets
  (cd "$1" && ls tests/test_*.c tests/test_*.cu 2>/dev/null | sed -E 's#tests/(.*)\.(c|cu)$#build/tests/\1#')
}

for s in $steps; do
  case $s in
  build)
    stamp "build (product, dev, base)"
    ( make -j16 all $(test_bins .) > "$LOG/build-new.log" 2>&1; echo $? > "$LOG/build-new.rc" ) &
    ( make -j16 DEV=1 build-dev/tests/test_gpu_fwd build-dev/tests/test_gpu_decode > "$LOG/build-dev.log" 2>&1
      echo $? > "$LOG/build-dev.rc" ) &
    if [ -d "$BASE_SRC" ]; then
      ( make -C "$BASE_SRC" -j16 build/libflashqla.so > "$LOG/build-base.log" 2>&1; echo $? > "$LOG/build-base.rc" ) &
    fi
    wait
    stamp "build rc: new=$(cat "$LOG/build-new.rc") dev=$(cat "$LOG/build-dev.rc") base=$(cat "$LOG/build-base.rc" 2>/dev/null || echo none)"
    grep -E "error|C751" "$LOG"/build-*.log | head -20
    ;;
  tests)
    stamp "tests"
    timeout 200 tests/run_tests.sh build/tests > "$LOG/tests.log" 2>&1; rc=$?
    stamp "tests rc=$rc: $(tail -n 1 "$LOG/tests.log")"
    grep -E "^FAIL|FAIL " "$LOG/tests.log" | head -30
    ;;
  dev)
    for t in test_gpu_fwd test_gpu_decode; do
      timeout 200 "build-dev/tests/$t" > "$LOG/dev-$t.log" 2>&1; rc=$?
      stamp "dev $t rc=$rc: $(tail -n 1 "$LOG/dev-$t.log")"
      grep -E "FAIL" "$LOG/dev-$t.log" | head -20
    done
    ;;
  sanitize)
    for tool in memcheck racecheck synccheck; do
      FQLA_TEST_FILTER=$SANITIZE_FILTER timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 \
        build/tests/test_gpu_fwd > "$LOG/$tool-fwd.log" 2>&1; rc=$?
      stamp "$tool test_gpu_fwd rc=$rc: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$LOG/$tool-fwd.log" | tail -n 1)"
      timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 build/tests/test_gpu_ptx > "$LOG/$tool-ptx.log" 2>&1; rc=$?
      stamp "$tool test_gpu_ptx rc=$rc: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$LOG/$tool-ptx.log" | tail -n 1)"
    done
    ;;
  pytest)
    FLASHQLA_LIB=$PWD/build/libflashqla.so PYTHONPATH=python timeout 300 python3 -m pytest -q -rs python/tests \
      > "$LOG/pytest.log" 2>&1; rc=$?
    stamp "pytest rc=$rc: $(tail -n 1 "$LOG/pytest.log")"
    grep -E "^FAILED|^ERROR|^SKIPPED" "$LOG/pytest.log" | head -20
    ;;
  pair)
    # new2 is the new library under another path (ctypes loads it a second
    # time): new2 / new is the run's own noise floor for the new / base ratio.
    cp build/libflashqla.so /tmp/libflashqla_new2.so
    # PAIR_BASE_FIRST=1 lists base first: the benchmark alternates the order
    # of the builds from row to row, and a build's place in it can move a row
    # by several per cent (new2 / new shows how much)
    libs="new=build/libflashqla.so,base=$BASE_SRC/build/libflashqla.so,new2=/tmp/libflashqla_new2.so"
    [ -n "${PAIR_BASE_FIRST:-}" ] && libs="base=$BASE_SRC/build/libflashqla.so,new=build/libflashqla.so,new2=/tmp/libflashqla_new2.so"
    for rep in $(seq "${PAIR_REPEAT:-1}"); do
      for rows in "--seqlens 8192x4,4096x8,2048x4,1024x8" "--quick"; do
        stamp "pair $rep $rows"
        timeout ${PAIR_TIMEOUT:-300} python3 bench/bench_fwd.py --lib "$libs" --no-fla --replays "${PAIR_REPLAYS:-10}" \
          $rows --out "$LOG/pair$rep.csv" >> "$LOG/pair.log" 2>&1 || stamp "pair rc=$?"
      done
      for p in new,base new2,new; do
        python3 bench/summarize.py "$LOG/pair$rep.csv" --pair $p --rows > "$LOG/pair$rep-${p/,/-}.txt" 2>&1
        stamp "pair $rep $p: $(grep -E '^(all|uniform|others) ' "$LOG/pair$rep-${p/,/-}.txt" | tr -s ' ' | cut -c1-90 | paste -sd'|')"
      done
    done
    ;;
  esac
done
stamp "done"
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOG"
