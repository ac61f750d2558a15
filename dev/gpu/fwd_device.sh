#!/usr/bin/env bash
# fwd_device.sh - one device-machine session for the CUDA forward: the GPU
# forward tests against the fp64 reference, compute-sanitizer memcheck on
# small shapes, and the FLA comparison benchmark (bench/bench_fwd.py).
# Logs go to $OUT. Uses binaries carried in $FWD_BIN (default .fwdbin:
# test_gpu_fwd and libflashqla.so built on the dev machine, COMMIT) when they
# start, otherwise builds them here. Other builds in subfolders of $FWD_BIN
# (each libflashqla.so with its COMMIT; base/ by custom) are timed in the same
# benchmark process. FLA comes from the wheel $FLA_WHL (default: fla-core 0.5.2 in .whl,
# the version of every earlier row of bench/results/fwd-h200.csv).
#
#   dev/gpu/fwd_device.sh [tests] [memcheck|sanitize] [pytest] [bench]
#   (default: tests memcheck bench). sanitize runs memcheck, synccheck,
#   racecheck and initcheck (or SANITIZE_TOOLS' list) on SANITIZE_FILTER's
#   cases (small shapes of every kernel); pytest the python tests against the
#   carried library.
#   BENCH_ARGS='--rows ... --variants ...' to pick benchmark rows and variants.
#   DEADLINE=S: the benchmark is cut off S seconds after the script started
#   (rows already measured are kept: the CSV is written row by row).
set -u
OUT=${OUT:-/tmp/fwd_out}
mkdir -p "$OUT"
BIN=${FWD_BIN:-.fwdbin}
. "$(dirname "$0")/unpack.sh" # a folder packed by dev/gpu/pack.sh
. "$(dirname "$0")/triton_cache.sh" # FLA's compiled kernels and autotuning from earlier sessions
FLA_WHL=${FLA_WHL:-.whl/fla_core-0.5.2-py3-none-any.whl}
DEADLINE=${DEADLINE:-600}
export PYTHONUNBUFFERED=1
# the commit the carried binaries were built from (written by the dev machine)
export FQLA_COMMIT=${FQLA_COMMIT:-$(cat "$BIN/COMMIT" 2>/dev/null)}
steps=${*:-tests memcheck bench}
LOG=$OUT/logs # tarred into $OUT/logs.tgz at the end: the device tool returns at most 8 files
mkdir -p "$LOG"
t_start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t_start ))s] $*" | tee -a "$OUT/summary.txt"; }

nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1

# binaries: carried ones if they run, else build
if ! ldd "$BIN/test_gpu_fwd" 2>&1 | grep -q "not found" && [ -x "$BIN/test_gpu_fwd" ]; then
  stamp "using carried binaries ($FQLA_COMMIT)"
else
  stamp "building"
  make -j16 build/libflashqla.so build/tests/test_gpu_fwd > "$LOG/build.log" 2>&1 || { stamp "build failed"; tail -30 "$LOG/build.log"; }
  mkdir -p .fwdbin_dev && cp build/libflashqla.so build/tests/test_gpu_fwd .fwdbin_dev/ && BIN=.fwdbin_dev
fi

# FLA into /tmp/site while the tests run
case " $steps " in *" bench "*|*" pytest "*)
  ( python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      "$FLA_WHL" > "$LOG/pip.log" 2>&1 || echo "pip failed" >> "$LOG/pip.log" ) &
  pip_pid=$! ;;
esac

for s in $steps; do
  case $s in
  tests)
    stamp "tests"
    timeout "${TEST_TIMEOUT:-120}" "$BIN/test_gpu_fwd" > "$LOG/test.log" 2>&1; rc=$?
    stamp "tests rc=$rc: $(tail -n 1 "$LOG/test.log")"
    tests_rc=$rc
    grep -E "FAIL|differs" "$LOG/test.log" | head -40
    ;;
  memcheck)
    stamp "memcheck"
    FQLA_TEST_FILTER=${MEMCHECK_FILTER:-zero_len,trailing,head_dims} timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 \
      "$BIN/test_gpu_fwd" > "$LOG/memcheck.log" 2>&1; rc=$?
    stamp "memcheck rc=$rc: $(grep -E 'ERROR SUMMARY' "$LOG/memcheck.log" | tail -n 1)"
    ;;
  sanitize)
    for tool in ${SANITIZE_TOOLS:-memcheck synccheck racecheck initcheck}; do
      stamp "$tool"
      FQLA_TEST_FILTER=${SANITIZE_FILTER:-zero_len,trailing,head_dims,gva,context_parallel} timeout "${SANITIZE_TIMEOUT:-150}" \
        compute-sanitizer --tool $tool --error-exitcode 9 "$BIN/test_gpu_fwd" > "$LOG/$tool.log" 2>&1; rc=$?
      stamp "$tool rc=$rc: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$LOG/$tool.log" | tail -n 1)"
    done
    ;;
  pytest)
    wait "$pip_pid"
    stamp "pytest"
    FLASHQLA_LIB=$BIN/libflashqla.so PYTHONPATH=python:/tmp/site timeout "${PYTEST_TIMEOUT:-200}" \
      python3 -m pytest -q python/tests > "$LOG/pytest.log" 2>&1; rc=$?
    stamp "pytest rc=$rc: $(tail -n 1 "$LOG/pytest.log")"
    ;;
  bench)
    if [ "${tests_rc:-0}" -ne 0 ] && [ -z "${FORCE_BENCH:-}" ]; then stamp "bench skipped: tests failed"; continue; fi
    wait "$pip_pid"
    grep -q "pip failed" "$LOG/pip.log" && stamp "pip failed: $(tail -n 3 "$LOG/pip.log")"
    export PYTHONPATH=/tmp/site
    # the carried build, then every other build in a subfolder (base/, or any
    # name), each labelled by its COMMIT file: all timed in the same process
    libs=$BIN/libflashqla.so
    for d in "$BIN"/*/; do
      [ -f "$d/libflashqla.so" ] || continue
      libs="$libs,$(cat "$d/COMMIT" 2>/dev/null || basename "$d")=${d}libflashqla.so"
    done
    left=$(( DEADLINE - ($(date +%s) - t_start) - 5 ))
    stamp "bench (${left}s left)"
    eval "timeout $left python3 bench/bench_fwd.py --lib '$libs' --out $OUT/fwd-h200.csv ${BENCH_ARGS:-}" \
      > "$LOG/bench.log" 2>&1; rc=$?
    stamp "bench rc=$rc"
    tail -n 60 "$LOG/bench.log"
    ;;
  esac
done
triton_cache_save "$OUT"
stamp "done"
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOG"
