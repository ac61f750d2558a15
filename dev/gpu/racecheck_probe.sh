#!/usr/bin/env bash
# racecheck_probe.sh - builds dev/gpu/racecheck_probe.cu and runs each of its
# four variants under compute-sanitizer's racecheck (device machine, ~30 s);
# prints each variant's hazard summary. See the .cu for the question.
set -u
out=${OUT:-/tmp}/racecheck_probe
nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Isrc -o "$out" dev/gpu/racecheck_probe.cu || exit 1
for v in 0 1 2 3; do
  compute-sanitizer --tool racecheck "$out" "$v" > "$out.$v.log" 2>&1
  echo "variant $v: $(grep -m1 -E '^(plain|mbarrier|wgmma)' "$out.$v.log") $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$out.$v.log" | head -1)"
done
