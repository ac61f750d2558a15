#!/usr/bin/env bash
# cp_device.sh - one call on a multi-GPU device machine for context
# parallelism across GPUs (flashqla.distributed, docs/distributed.md):
# build the library, run the NCCL cases of python/tests/test_distributed.py
# and the CUDA cases of python/tests/test_bwd_dh0_only.py (beside them, on
# the last GPU, the backward's GPU test, which they do not load much), then
# bench/bench_cp.py on 1, 2, ... GPUs.
#
#   dev/gpu/cp_device.sh            (run tool: kind nvidia-h200-x2 or larger,
#                                    carry .whl for FLA's cp_context cases)
#
# Environment: OUT (logs, default /tmp/cp_out), DEADLINE (seconds, default
# 560), CP_TOKENS (space-separated token counts for bench_cp, default
# "1048576"), CP_GPUS (default "1 2 ... device count"), CP_ITERS (default 5),
# PYTEST_K (default "nccl or cuda"), TESTS=0 (no pytest, no test_gpu_bwd).
# Output: $OUT/summary.txt, $OUT/cp-multi-h200.csv (the rows this call
# appended), $OUT/logs.tgz (one log per step; the device tool returns at
# most 8 files).
set -u
OUT=${OUT:-/tmp/cp_out}
DEADLINE=${DEADLINE:-560}
LOG=/tmp/cp_logs
mkdir -p "$OUT" "$LOG"
trap 'tar czf "$OUT/logs.tgz" -C /tmp cp_logs' EXIT
export PYTHONUNBUFFERED=1
# NVLink multicast stays off on shared hosts (the device notes say why)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$OUT/summary.txt"; }
left() { local l=$(( DEADLINE - ($(date +%s) - t0) - 10 )); [ "$l" -lt 1 ] && l=1; echo "$l"; }

ngpu=$(python3 -c 'import torch; print(torch.cuda.device_count())')
stamp "GPUs: $ngpu"
{ nvidia-smi; nvidia-smi topo -m; } > "$LOG/gpu.txt" 2>&1

if ls .whl/*.whl > /dev/null 2>&1; then
  pip install --no-deps --no-index --target /tmp/site .whl/*.whl > "$LOG/pip.txt" 2>&1
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
export FLASHQLA_LIB=$PWD/build/libflashqla.so

stamp "build"
timeout "$(left)" make -j32 build/libflashqla.so build/tests/test_gpu_bwd > "$LOG/build.txt" 2>&1 ||
  { stamp "build FAILED"; tail -30 "$LOG/build.txt"; exit 1; }

if [ "${TESTS:-1}" != 0 ]; then
  stamp "pytest -k ${PYTEST_K:-nccl or cuda} beside test_gpu_bwd on GPU $((ngpu - 1))"
  (CUDA_VISIBLE_DEVICES=$((ngpu - 1)) timeout "$(( $(left) - 150 ))" build/tests/test_gpu_bwd \
     > "$LOG/test_gpu_bwd.txt" 2>&1; echo "exit $?" >> "$LOG/test_gpu_bwd.txt") &
  timeout "$(( $(left) - 150 ))" python3 -m pytest -q -rs python/tests/test_distributed.py \
    python/tests/test_bwd_dh0_only.py -k "${PYTEST_K:-nccl or cuda}" > "$LOG/pytest.txt" 2>&1
  echo "exit $?" >> "$LOG/pytest.txt"
  wait
  stamp "pytest: $(tail -2 "$LOG/pytest.txt" | tr '\n' ' ')"
  stamp "test_gpu_bwd: $(grep -E 'passed|failed|FAIL' "$LOG/test_gpu_bwd.txt" | tail -3 | tr '\n' ' ') $(tail -1 "$LOG/test_gpu_bwd.txt")"
fi

csv=$OUT/cp-multi-h200.csv
for tokens in ${CP_TOKENS:-1048576}; do
  for n in ${CP_GPUS:-$(seq 1 "$ngpu")}; do
    stamp "bench_cp tokens=$tokens gpus=$n"
    timeout "$(left)" torchrun --standalone --nproc_per_node="$n" bench/bench_cp.py \
      --tokens "$tokens" --iters "${CP_ITERS:-5}" --out "$csv" > "$LOG/bench_cp_${tokens}_$n.txt" 2>&1 ||
      stamp "bench_cp failed: $(tail -3 "$LOG/bench_cp_${tokens}_$n.txt" | tr '\n' ' ')"
  done
done
[ -f "$csv" ] && cat "$csv" | tee -a "$OUT/summary.txt"
stamp "done"
