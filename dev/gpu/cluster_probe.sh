#!/usr/bin/env bash
# cluster_probe.sh - builds dev/gpu/cluster_probe.cu for sm_90a and runs it,
# then under compute-sanitizer's memcheck and racecheck (device machine,
# ~30 s): the ptx layer's cluster wrappers against what every rank wrote, and
# with --time what a cluster barrier and a push of 8 / 32 KiB to the next rank cost.
set -u
out=${OUT:-/tmp}/cluster_probe
nvcc -O2 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Isrc -o "$out" dev/gpu/cluster_probe.cu || exit 1
"$out" --time; rc=$?
for tool in memcheck racecheck synccheck; do
  compute-sanitizer --tool $tool "$out" > "$out.$tool.log" 2>&1
  echo "$tool: rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$out.$tool.log" | head -1)"
done
exit $rc
