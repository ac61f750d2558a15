#!/usr/bin/env bash
# bwd_ncu.sh - ncu profiles of backward kernels on one forward + backward call
# (dev/gpu/bwd_one.py, bf16, K = V = 128): for each kernel regex given, the
# headline metrics and stall reasons (dev/gpu/ncu_prep.sh) and the stall
# samples by stretch between barriers (dev/gpu/ncu_stretches.py), under
# $OUT/<regex>/. Binaries from $BWD_BIN (default .bwdbin, packed or not).
#
#   dev/gpu/bwd_ncu.sh [KERNEL_REGEX ...]   (default: bwd_grads bwd_prepare)
#   ONE_ARGS='--H 16 --HV 32 --T 8192' picks the shapes.
set -u
OUT=${OUT:-/tmp/bwd_ncu}
BIN=${BWD_BIN:-.bwdbin}
. "$(dirname "$0")/unpack.sh"
export BIN
base=$OUT
mkdir -p "$base"
for kern in ${*:-bwd_grads bwd_prepare}; do
  d=$base/$kern
  mkdir -p "$d"
  OUT=$d FWD_BIN=$BIN NCU_CMD="PYTHONPATH=python FLASHQLA_LIB=$BIN/libflashqla.so python3 dev/gpu/bwd_one.py ${ONE_ARGS:-}" \
    bash "$(dirname "$0")/ncu_prep.sh" "$kern" > "$d/headline.txt" 2>&1
  python3 "$(dirname "$0")/ncu_stretches.py" "$d/ncu_sass.csv" > "$d/stretches.txt" 2>&1
  echo "== $kern"; cat "$d/headline.txt"; head -60 "$d/stretches.txt"
  rm -f "$d/ncu_raw.csv"
done 2>&1 | tee "$base/summary.txt"
# the device tool returns at most 8 files: everything else in one archive
(cd "$base" && tar cJf ncu.tar.xz --exclude summary.txt --exclude ncu.tar.xz . && find . -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +)
