#!/usr/bin/env bash
# bwd_check.sh - one device call for the CUDA backward while it is being
# built: the build, tests/test_gpu_bwd, compute-sanitizer on small cases,
# and dev/gpu/bwd_quick.py's per-kernel times. Logs under $OUT.
set -u
OUT=${OUT:-/tmp/bwd_check}
mkdir -p "$OUT"
make -j16 all build/tests/test_gpu_bwd > "$OUT/build.log" 2>&1 || { grep -E "error" "$OUT/build.log" | head; exit 1; }
build/tests/test_gpu_bwd > "$OUT/test_gpu_bwd.log" 2>&1
grep -E "FAIL|passed" "$OUT/test_gpu_bwd.log" | head -20
for tool in memcheck racecheck synccheck; do
  FQLA_TEST_QUICK=1 FQLA_TEST_FILTER=${SANITIZE_FILTER:-bwd_lengths,bwd_varlen_edges} timeout 200 \
    compute-sanitizer --tool $tool build/tests/test_gpu_bwd > "$OUT/$tool.log" 2>&1
  echo "$tool: $(grep -E 'SUMMARY' "$OUT/$tool.log" | tail -1)"
done
PYTHONPATH=python FLASHQLA_LIB=build/libflashqla.so timeout 200 python3 dev/gpu/bwd_quick.py 2>&1 |
  grep -E "timing|kernels|ALL|BAD|failed" | tee "$OUT/quick.log"
