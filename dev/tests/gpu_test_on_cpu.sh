#!/usr/bin/env bash
# gpu_test_on_cpu.sh - runs a GPU test program's own logic on a machine
# without a GPU: tests/test_gpu_bwd.c compiled against cuda_on_cpu.c, where
# device memory is host memory and the "CUDA" context is the CPU fast backend
# (fp32 chunked, bf16 / fp16 outputs rounded as the GPU's are). What it checks
# is the test, not the kernels: argument set-up, poison, guard bands, the
# comparison with the fp64 reference, trailing rows, the skip logic.
# Graph capture is refused by the stand-in, so exclude bwd_graph_replay.
#
#   dev/tests/gpu_test_on_cpu.sh [TEST=tests/test_gpu_bwd.c]
#   FQLA_TEST_QUICK=1 FQLA_TEST_FILTER=bwd_gva,bwd_varlen dev/tests/gpu_test_on_cpu.sh
set -eu
src=${1:-tests/test_gpu_bwd.c}
out=build/gpu_test_on_cpu
mkdir -p "$out"
make CUDA=0 build/libflashqla.a > "$out/make.log"
cflags="-std=c99 -Wall -Wextra -pedantic -O2 -Iinclude -Isrc -Itests -D_POSIX_C_SOURCE=200809L -pthread"
cc $cflags -DFQLA_HAVE_CUDA -Dfqla_backend_available=cpu_standin_backend_available \
  -Dfqla_context_create=cpu_standin_context_create -c "$src" -o "$out/test.o"
cc $cflags -c dev/tests/cuda_on_cpu.c -o "$out/cuda_on_cpu.o"
cc "$out/test.o" "$out/cuda_on_cpu.o" tests/common/check.c $cflags -o "$out/test" build/libflashqla.a -lm
FQLA_TEST_FILTER=${FQLA_TEST_FILTER:-bwd_contract,bwd_lengths,bwd_varlen,bwd_trailing,bwd_gva,bwd_states,bwd_v_first,bwd_fp16,bwd_bf16,bwd_options,bwd_neg,bwd_strong,bwd_no_decay,bwd_head,bwd_fp32,bwd_robust,bwd_workspace,bwd_state,bwd_not} \
  "$out/test"
