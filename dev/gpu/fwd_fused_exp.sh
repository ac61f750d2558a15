#!/usr/bin/env bash
# fwd_fused_exp.sh - issue 42's first timing experiment on the device machine:
# the whole forward in one kernel (src/dev/fwd_fused_exp.cu; results wrong
# by design) against today's fused route (prepare kernel + fused kernel), in
# one process on the nine rows timed for the earlier fused attempts, with the
# per-kernel profile. Needs a developer library:
#
#   make DEV=1 build-dev/libflashqla.so && mkdir -p .devN && cp build-dev/libflashqla.so .devN/ &&
#   git rev-parse --short HEAD > .devN/COMMIT && dev/gpu/pack.sh .devN
#   (device) EXP_BIN=.devN dev/gpu/fwd_fused_exp.sh      # logs under $OUT
#
# Variants (bench_fwd.py --variants 'hb,late,wg,nwg,cp'), EXP_MODES (default
# '0 10 11 12'): 0 today's route; 10-26 the experiment's modes (the table
# in src/dev/fwd_fused_exp.cu: 10 the products warpgroup alone, 11 with the
# inverse warps, 12 with their hand-offs, 13 / 14 / 15 / 16 its parts and
# forms, 17 the inverse on the products warpgroup's tensor cores, 18 / 19 its
# parts, 20 / 21 its diagonal blocks on the idle warps, 22-25 their forms
# and places, 26 the one-kernel forward, correct; the bench checks no
# outputs: test_gpu_fwd's fwd_one_kernel does for 26); all on the
# fused kernel (wg 2) with the planner's nwg, no CP.
# EXP_ROWS replaces the nine rows (bench_fwd.py --rows).
# Each mode first runs one row under `timeout` (a hang in the experiment's
# barriers ends the call there, not at the device's limit).
set -u
OUT=${OUT:-/tmp/exp_out}
BIN=${EXP_BIN:-.devexp}
mkdir -p "$OUT"
[ -f "$BIN/pack.tar.xz" ] && tar xJf "$BIN/pack.tar.xz" -C "$BIN"
LIB=$BIN/libflashqla.so
export FQLA_COMMIT=$(cat "$BIN/COMMIT" 2>/dev/null || echo unknown)
ROWS=${EXP_ROWS:-'Sym h32:8192x4,35B/9B/4B TP1:8192x4,27B TP1:8192x4,397B/122B TP1:8192x4,397B/122B TP2:4096x8,35B/9B/4B TP1:1024x8,Sym h32:1024x8,Sym h32:2048x4,2B/0.8B TP1:1024x8'}
nvidia-smi -L > "$OUT/gpu.txt" 2>&1
ok=""
for v in ${EXP_MODES:-0 10 11 12}; do
  if timeout 90 python3 bench/bench_fwd.py --lib "$LIB" --no-fla --rows 'Sym h32:1024x8' --replays 2 \
       --variants "$v,-1,2,0,0" --out "$OUT/smoke.csv" > "$OUT/smoke-$v.txt" 2>&1; then
    ok="$ok${ok:+;}$v,-1,2,0,0"
  else
    echo "variant $v: smoke run failed or hung (rc $?)" >> "$OUT/summary.txt"
  fi
done
echo "variants that ran: $ok" >> "$OUT/summary.txt"
[ -n "$ok" ] && timeout ${EXP_TIMEOUT:-300} python3 bench/bench_fwd.py --lib "$LIB" --no-fla --profile --replays 5 \
    --rows "$ROWS" --variants "$ok" --out "$OUT/exp.csv" > "$OUT/exp.txt" 2>&1
echo "bench rc $?" >> "$OUT/summary.txt"
