#!/usr/bin/env bash
# decode_device.sh - everything the CUDA decode needs from one device call:
# the GPU decode tests, compute-sanitizer memcheck on a small subset, and the
# benchmark against FLA (bench_decode.py). Binaries are built on the host
# (make build/libflashqla.so build/tests/test_gpu_decode) and carried in
# $BIN (default .decbin) with the commit they came from; FLA comes as the
# fla_core wheel in .whl/. Logs and the CSV go to $OUT. Each step has its own
# time limit (TEST_S, MEMCHECK_S, BENCH_S seconds) so that a slow step cannot
# take the others' results with it; BENCH is the bench script to run.
set -u
BIN=${BIN:-.decbin}
. "$(dirname "$0")/../dev/gpu/unpack.sh" # a folder packed by dev/gpu/pack.sh
. "$(dirname "$0")/../dev/gpu/triton_cache.sh" # FLA's compiled kernels from earlier sessions
BENCH=${BENCH:-bench/bench_decode.py}
OUT=${OUT:-/tmp/decode-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/fla_core-*.whl && export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.used,temperature.gpu --format=csv \
    > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"

start=$(date +%s)
env ${TEST_ENV:-} timeout "${TEST_S:-120}" "$BIN/test_gpu_decode" > "$OUT/test.log" 2>&1
echo "== test_gpu_decode rc=$? ($(( $(date +%s) - start )) s)"
grep -vE '^ok |^  ' "$OUT/test.log" | tail -n 12

if [ "${MEMCHECK:-1}" = 1 ]; then
    start=$(date +%s)
    FQLA_TEST_QUICK=1 timeout "${MEMCHECK_S:-100}" compute-sanitizer --tool memcheck --error-exitcode 9 \
        "$BIN/test_gpu_decode" \
        ${MEMCHECK_CASES:-chained_decode,verify_step_slots,slot_past_pool,pool_offset_beyond_2_31} \
        > "$OUT/memcheck.log" 2>&1
    echo "== memcheck rc=$? ($(( $(date +%s) - start )) s)"
    grep -E 'ERROR SUMMARY|passed,|Invalid|error' "$OUT/memcheck.log" | head -n 8
fi

start=$(date +%s)
PYTHONUNBUFFERED=1 timeout "${BENCH_S:-400}" python3 "$BENCH" --lib "$BIN/libflashqla.so" \
    --out "$OUT/decode-h200.csv" --commit "$(cat "$BIN/commit" 2>/dev/null || echo unknown)" ${BENCH_ARGS:-} \
    > "$OUT/bench.log" 2>&1
echo "== bench rc=$? ($(( $(date +%s) - start )) s)"
triton_cache_save "$OUT"
cut -c1-400 "$OUT/bench.log"
