#!/usr/bin/env bash
# bwd_device.sh - one device-machine session for the CUDA backward: the GPU
# backward tests against the fp64 reference (build/tests/test_gpu_bwd),
# compute-sanitizer memcheck / racecheck / synccheck on its small cases, the
# Python GPU tests of the backward, and the backward benchmark
# (bench/bench_bwd.py against FLA and, when it imports, FlashQLA).
# Everything is logged under $OUT, in at most 7 files: summary.txt, gpu.txt
# (GPU, python, torch, triton, nvcc), logs.tgz, the benchmark's two CSVs, the
# Triton and TileLang caches;
# each step is time-boxed and the whole call ends within $DEADLINE seconds
# (default 520: under the device tool's 9-minute budget for one call).
#
#   dev/gpu/bwd_device.sh [build] [tests] [sanitize] [pytest] [bench]
#   (default: all five, in this order; the later steps get what the deadline
#   leaves, so for a full benchmark split the work over two calls on the warm
#   machine, whose build/ stays: `build tests sanitize`, then `build pytest bench`
#   with BWD_ARGS='' for all 32 rows, or BWD_ROWS=...)
#
# Python packages come from the carried, git-ignored folder .whl/ (no network
# on the device): every .whl/*.whl is installed with
# `pip install --no-deps --no-index --target /tmp/site`, and every
# .whl/*.tar.xz (a site folder packed with xz, e.g. flash_qla + tilelang +
# apache-tvm-ffi + torch-c-dlpack-ext + z3, which are too large as wheels) is
# unpacked into /tmp/site; /tmp/site goes on PYTHONPATH. Binaries: carried
# ones in $BWD_BIN (default .bwdbin: test_gpu_bwd, libflashqla.so, COMMIT;
# packed by dev/gpu/pack.sh or not) when they run there, else `make -j16` here
# (a minute or two of device time). To carry them, on the dev machine:
#   make build/libflashqla.so build/tests/test_gpu_bwd && mkdir -p .bwdbin &&
#   cp build/libflashqla.so build/tests/test_gpu_bwd .bwdbin/ &&
#   git rev-parse --short HEAD > .bwdbin/COMMIT && dev/gpu/pack.sh .bwdbin
# and name .bwdbin and .whl in the run tool's carry list (.whl is ~45 MiB of
# the 64 MiB a call may carry).
#
# Environment:
#   DEADLINE=S          the whole call's budget in seconds (default 520)
#   TEST_TIMEOUT=S      the GPU test (default 200)
#   TEST_FILTER=a,b     FQLA_TEST_FILTER for the GPU test (default: every case)
#   SANITIZE_TOOLS      default "memcheck racecheck synccheck"
#   SANITIZE_FILTER     cases under the sanitizers (FQLA_TEST_QUICK=1 sizes), default
#                       "bwd_varlen_edges,bwd_trailing,bwd_gva"
#   SANITIZE_TIMEOUT=S  per tool (default 80)
#   PYTEST_K            pytest -k expression (default: the training tests of test_gpu.py,
#                       "backward or gradcheck or train")
#   PYTEST_TIMEOUT=S    default 150
#   BWD_ROWS            bench_bwd.py --rows (e.g. hk16_hv32:32k_1seq,hk2_hv4:8k_8seq)
#   BWD_ARGS            other bench_bwd.py options (default --quick when BWD_ROWS is unset)
#   BWD_LIBS            bench_bwd.py --lib list (label=path,...) instead of $BWD_BIN's library:
#                       several builds timed in one process beside FLA (paths after unpack.sh,
#                       e.g. BWD_BIN=.bwdab BWD_LIBS='main=@/main/libflashqla.so,new=@/new/libflashqla.so',
#                       @ standing for the unpacked $BWD_BIN)
set -u
OUT=${OUT:-/tmp/bwd_out}
mkdir -p "$OUT"
BIN=${BWD_BIN:-.bwdbin}
DEADLINE=${DEADLINE:-520}
export PYTHONUNBUFFERED=1
steps=${*:-build tests sanitize pytest bench}
LOG=$OUT/logs # tarred into $OUT/logs.tgz at the end
mkdir -p "$LOG"
t_start=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t_start ))s] $*" | tee -a "$OUT/summary.txt"; }
# seconds left for a step: its own limit, cut to what the deadline leaves (>= 1)
left() {
  local l=$(( DEADLINE - ($(date +%s) - t_start) - 10 ))
  [ "$l" -gt "$1" ] && l=$1
  [ "$l" -lt 1 ] && l=1
  echo "$l"
}

nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
# (one file: the run tool returns at most 8 from $OUT)
python3 -c 'import sys, torch, triton; print("python", sys.version.split()[0], "torch", torch.__version__,
  "triton", triton.__version__)' >> "$OUT/gpu.txt" 2>&1
nvcc --version | tail -n 2 >> "$OUT/gpu.txt" 2>&1

# Python packages into /tmp/site, in the background while the build runs
(
  mkdir -p /tmp/site
  whls=$(ls .whl/*.whl 2>/dev/null)
  if [ -n "$whls" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      $whls > "$LOG/pip.log" 2>&1 || echo "pip failed" >> "$LOG/pip.log"
  fi
  for x in .whl/*.tar.xz; do
    [ -f "$x" ] || continue
    xz -dc "$x" | tar xf - -C /tmp/site || echo "unpack of $x failed" >> "$LOG/pip.log"
  done
  echo "site ready: $(ls /tmp/site | tr '\n' ' ')" >> "$LOG/pip.log"
) &
site_pid=$!
export PYTHONPATH=/tmp/site
. "$(dirname "$0")/triton_cache.sh" # FLA's compiled kernels from earlier sessions, if carried
# FlashQLA's TileLang kernels compile on the first call of a head configuration
# (~50 s each): kept between sessions as Triton's are, in
# .tilelangcache/tilelang_cache.tar.xz (git-ignored; put back the
# $OUT/tilelang_cache.tar.xz a call returns, and carry .tilelangcache)
export TILELANG_CACHE_DIR=${TILELANG_CACHE_DIR:-/tmp/tilelang_cache}
mkdir -p "$TILELANG_CACHE_DIR"
[ -f .tilelangcache/tilelang_cache.tar.xz ] &&
  { xz -dc .tilelangcache/tilelang_cache.tar.xz | tar xf - -C "$TILELANG_CACHE_DIR" 2>/dev/null ||
    echo "tilelang cache did not unpack; starting cold" >> "$OUT/summary.txt"; }

. "$(dirname "$0")/unpack.sh" # $BIN packed by dev/gpu/pack.sh
# the commit the records name: $BIN/COMMIT, else HEAD, marked -dirty where the tree differs
# from it (the device's copy of a tree may carry a git directory older than its files: pass
# FQLA_COMMIT=... when building there)
head_of_tree() {
  local c
  c=$(git rev-parse --short HEAD 2>/dev/null) || return 0
  git diff --quiet HEAD -- 2>/dev/null || c=$c-dirty
  echo "$c"
}
export FQLA_COMMIT=${FQLA_COMMIT:-$(cat "$BIN/COMMIT" 2>/dev/null || head_of_tree)}
tests_rc=0
for s in $steps; do
  case $s in
  build)
    if [ -x "$BIN/test_gpu_bwd" ] && ! ldd "$BIN/test_gpu_bwd" 2>&1 | grep -q "not found"; then
      stamp "using carried binaries in $BIN ($FQLA_COMMIT)"
    else
      stamp "building ($FQLA_COMMIT)"
      timeout "$(left 300)" make -j16 build/libflashqla.so build/tests/test_gpu_bwd > "$LOG/build.log" 2>&1; rc=$?
      stamp "build rc=$rc"
      [ $rc -ne 0 ] && tail -n 30 "$LOG/build.log"
      mkdir -p .bwdbin_dev && cp -f build/libflashqla.so build/tests/test_gpu_bwd .bwdbin_dev/ 2>/dev/null
      BIN=.bwdbin_dev
    fi
    ;;
  tests)
    stamp "tests"
    # (an empty FQLA_TEST_FILTER selected no case before the test learned to read it as "all")
    env ${TEST_FILTER:+FQLA_TEST_FILTER=$TEST_FILTER} timeout "$(left "${TEST_TIMEOUT:-200}")" "$BIN/test_gpu_bwd" \
      > "$LOG/test.log" 2>&1; tests_rc=$?
    stamp "tests rc=$tests_rc: $(tail -n 1 "$LOG/test.log")"
    # failures, and the parts outside the coverage contract the library declined
    grep -E "FAIL|  SKIP|differs" "$LOG/test.log" | head -40 | tee -a "$OUT/summary.txt"
    ;;
  sanitize)
    for tool in ${SANITIZE_TOOLS:-memcheck racecheck synccheck}; do
      stamp "$tool"
      FQLA_TEST_QUICK=1 FQLA_TEST_FILTER=${SANITIZE_FILTER:-bwd_varlen_edges,bwd_trailing,bwd_gva} \
        timeout "$(left "${SANITIZE_TIMEOUT:-80}")" compute-sanitizer --tool "$tool" --error-exitcode 9 \
        "$BIN/test_gpu_bwd" > "$LOG/$tool.log" 2>&1; rc=$?
      stamp "$tool rc=$rc: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$LOG/$tool.log" | tail -n 1)" \
        "$(tail -n 1 "$LOG/$tool.log")"
    done
    ;;
  pytest)
    wait "$site_pid"
    stamp "pytest"
    FLASHQLA_LIB=$(cd "$BIN" && pwd)/libflashqla.so
    FLASHQLA_LIB=$FLASHQLA_LIB PYTHONPATH=python:/tmp/site timeout "$(left "${PYTEST_TIMEOUT:-150}")" \
      python3 -m pytest -q -rs python/tests/test_gpu.py \
      -k "${PYTEST_K:-backward or gradcheck or train}" > "$LOG/pytest.log" 2>&1; rc=$?
    stamp "pytest rc=$rc: $(tail -n 1 "$LOG/pytest.log")"
    grep -E "FAILED|ERROR|SKIPPED" "$LOG/pytest.log" | head -20 | tee -a "$OUT/summary.txt"
    ;;
  bench)
    if [ "$tests_rc" -ne 0 ] && [ -z "${FORCE_BENCH:-}" ]; then stamp "bench skipped: tests failed (FORCE_BENCH=1 runs it)"; continue; fi
    wait "$site_pid"
    grep -E "failed" "$LOG/pip.log" && stamp "package install: $(grep failed "$LOG/pip.log" | head -n 3)"
    lib=$BIN/libflashqla.so
    [ -n "${BWD_LIBS:-}" ] && lib=${BWD_LIBS//@/$BIN}
    rows=()
    [ -n "${BWD_ROWS:-}" ] && rows=(--rows "$BWD_ROWS")
    args=${BWD_ARGS-}
    [ -z "${BWD_ROWS:-}" ] && [ -z "${BWD_ARGS+x}" ] && args=--quick
    t=$(left 600)
    stamp "bench (${t}s left): ${rows[*]} $args"
    # shellcheck disable=SC2086
    timeout "$t" python3 bench/bench_bwd.py --lib "$lib" --out "$OUT/bwd-h200.csv" "${rows[@]}" $args \
      > "$LOG/bench.log" 2>&1; rc=$?
    stamp "bench rc=$rc"
    tail -n 45 "$LOG/bench.log"
    tail -n 2 "$LOG/bench.log" >> "$OUT/summary.txt"
    ;;
  *)
    stamp "unknown step $s (build tests sanitize pytest bench)"
    ;;
  esac
done
triton_cache_save "$OUT"
[ -n "$(ls -A "$TILELANG_CACHE_DIR" 2>/dev/null)" ] &&
  tar cf - -C "$TILELANG_CACHE_DIR" . | xz -T0 -6 > "$OUT/tilelang_cache.tar.xz"
stamp "done"
tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOG"
