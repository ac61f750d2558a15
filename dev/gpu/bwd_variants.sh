#!/usr/bin/env bash
# bwd_variants.sh - an A/B of backward kernel variants in one device call.
# Builds the tree as it is (the baseline, "base") and, beside it, the tree
# with each patch given applied (git apply; the baseline's objects are copied
# first, so only what a patch touches recompiles). Then, for every variant:
# build/tests/test_gpu_bwd (its per-case worst errors and verdict, all
# variants at once: the fp64 reference is CPU work) and the backward's time
# on a few benchmark rows (dev/gpu/bwd_quick.py's timing(), per kernel),
# each variant in its own process, the variants timed in turn, twice
# (ABCD ABCD), so that clock drift shows as a difference between rounds.
#
#   dev/gpu/bwd_variants.sh name=path/to.patch ...
#
# Environment: OUT (logs; default /tmp/bwd_variants), DEADLINE (seconds,
# default 540), ROWS (H,HV,T,N;... default the four --quick rows),
# TEST_FILTER (FQLA_TEST_FILTER for test_gpu_bwd; TESTS=0: no test_gpu_bwd), SANITIZE (compute-sanitizer
# tools run on the base build's test_gpu_bwd beside the tests, e.g. "memcheck
# racecheck") with SANITIZE_FILTER, EXTRA (a command run on the base tree
# beside the tests, e.g. another GPU test; EXTRA_TARGETS: what make builds for it).
# Output: $OUT/summary.txt (verdicts and times), $OUT/<name>.test.txt,
# $OUT/<name>.build.txt.
set -u
OUT=${OUT:-/tmp/bwd_variants}
DEADLINE=${DEADLINE:-540}
ROWS=${ROWS:-16,32,32768,1;16,32,8192,8;2,4,32768,4;2,4,8192,1}
mkdir -p "$OUT"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/summary.txt"; }
left() { echo $(( DEADLINE - ($(date +%s) - t0) - 5 )); }
root=$PWD
names=(base)
dirs=("$root")

stamp "build base"
timeout "$(left)" make -j16 build/libflashqla.so build/tests/test_gpu_bwd ${EXTRA_TARGETS:-} > "$OUT/base.build.txt" 2>&1 ||
  { stamp "base build FAILED"; tail -20 "$OUT/base.build.txt"; exit 1; }

for spec in "$@"; do
  name=${spec%%=*}
  patch=${spec#*=}
  d=/tmp/variant_$name
  rm -rf "$d"
  mkdir -p "$d"
  # the tree with its build (mtimes kept), without the carried packages
  tar -C "$root" --exclude=./.whl --exclude=./.tilelangcache --exclude=./.tritoncache -cf - . | tar -C "$d" -xf -
  if ! (cd "$d" && git apply "$root/$patch") > "$OUT/$name.build.txt" 2>&1; then
    stamp "$name: patch does not apply"
    continue
  fi
  names+=("$name")
  dirs+=("$d")
done

stamp "build variants: ${names[*]:1}"
for i in "${!names[@]}"; do
  [ "$i" = 0 ] && continue
  (cd "${dirs[$i]}" && timeout "$(left)" make -j8 build/libflashqla.so build/tests/test_gpu_bwd >> "$OUT/${names[$i]}.build.txt" 2>&1 ||
    echo "BUILD FAILED" >> "$OUT/${names[$i]}.build.txt") &
done
wait
for i in "${!names[@]}"; do
  grep -q "BUILD FAILED" "$OUT/${names[$i]}.build.txt" 2>/dev/null && stamp "${names[$i]}: build FAILED"
done

stamp "test_gpu_bwd, all variants at once${SANITIZE:+, $SANITIZE on base}${EXTRA:+, EXTRA on base}"
for tool in ${SANITIZE:-}; do
  (FQLA_TEST_FILTER=${SANITIZE_FILTER:-} timeout "$(( $(left) - 120 ))" compute-sanitizer --tool "$tool" \
    --error-exitcode 9 build/tests/test_gpu_bwd > "$OUT/base.$tool.txt" 2>&1; echo "exit $?" >> "$OUT/base.$tool.txt") &
done
if [ -n "${EXTRA:-}" ]; then
  (timeout "$(( $(left) - 120 ))" bash -c "$EXTRA" > "$OUT/base.extra.txt" 2>&1; echo "exit $?" >> "$OUT/base.extra.txt") &
fi
for i in "${!names[@]}"; do
  [ "${TESTS:-1}" = 0 ] && break
  (cd "${dirs[$i]}" && FQLA_TEST_FILTER=${TEST_FILTER:-} timeout "$(( $(left) - 120 ))" build/tests/test_gpu_bwd \
    > "$OUT/${names[$i]}.test.txt" 2>&1; echo "exit $?" >> "$OUT/${names[$i]}.test.txt") &
done
wait
for n in "${names[@]}"; do
  [ "${TESTS:-1}" = 0 ] && break
  stamp "$n test: $(grep -E 'passed|failed|FAIL' "$OUT/$n.test.txt" | tail -n 3 | tr '\n' ' ')"
done
for f in "$OUT"/base.*check.txt "$OUT"/base.extra.txt; do
  [ -f "$f" ] && stamp "$(basename "$f"): $(grep -E 'SUMMARY|passed|failed|^exit' "$f" | tail -n 3 | tr '\n' ' ')"
done

cat > /tmp/bwd_variant_time.py <<'EOF'
import sys
sys.path.insert(0, "dev/gpu")
import bwd_quick
for row in sys.argv[1].split(";"):
    H, HV, T, N = (int(x) for x in row.split(","))
    bwd_quick.timing(H, HV, T, N)
EOF
for round in 1 2; do
  for i in "${!names[@]}"; do
    [ "$(left)" -lt 20 ] && { stamp "deadline: timing stopped"; break 2; }
    r=$( (cd "${dirs[$i]}" && PYTHONPATH=python FLASHQLA_LIB=build/libflashqla.so timeout "$(left)" \
      python3 /tmp/bwd_variant_time.py "$ROWS") 2>&1 | grep -E "timing|kernels|Error|error" )
    stamp "round $round ${names[$i]}:"
    echo "$r" | tee -a "$OUT/summary.txt"
  done
done
stamp "done"
