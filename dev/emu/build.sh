#!/usr/bin/env bash
# build.sh - the library with its CUDA kernels compiled for the CPU emulator
# (cuda_emu.h, by nvcc_emu.sh) and the CUDA runtime of cudart_emu.cpp, in
# build/emu/cuda (a DEV=1 build: the GPU tests' forced paths run too), and
# the GPU test programs named (default: test_gpu_fwd test_gpu_bwd):
#
#   dev/emu/build.sh [test_gpu_bwd ...]
#   FQLA_TEST_QUICK=1 FQLA_TEST_FILTER=bwd_lengths build/emu/cuda/tests/test_gpu_bwd
#
# Environment of the programs: FQLA_EMU_ORDER=1 runs each CTA's threads in
# reverse; FQLA_EMU_CTA_ORDER=1 runs each grid's CTAs last first;
# FQLA_EMU_ASYNC=issue performs each cp.async at its issue instead of its
# wait; FQLA_EMU_POISON=0 starts dynamic shared memory at zero instead of
# 0xFF bytes; FQLA_EMU_TRACE=1 prints every launch. A change of the
# emulator's files rebuilds every kernel (they are part of the
# configuration stamp).
set -eu
cd "$(dirname "$0")/../.."
cuda=${CUDA_HOME:-/usr/local/cuda}
out=build/emu
mkdir -p "$out"
${CXX:-g++} -std=c++17 -O1 -c -I. -I"$cuda/include" dev/emu/cudart_emu.cpp -o "$out/cudart_emu.o"
stamp=$(cat dev/emu/cuda_emu.h dev/emu/tma_emu.h dev/emu/nvcc_emu.sh | md5sum | cut -c1-12)
targets=()
for t in "${@:-test_gpu_fwd test_gpu_bwd}"; do for u in $t; do targets+=("$out/cuda/tests/$u"); done; done
make -j"${JOBS:-2}" NVCC="$PWD/dev/emu/nvcc_emu.sh" NVCC_EXTRA="-DFQLA_EMU_BUILD=$stamp" BUILD="$out/cuda" DEV=1 \
  CUDA_LIBS="$PWD/$out/cudart_emu.o -lstdc++" "${targets[@]}" > "$out/build.log" 2>&1 ||
  { tail -30 "$out/build.log"; exit 1; }
echo "built: ${targets[*]}"
