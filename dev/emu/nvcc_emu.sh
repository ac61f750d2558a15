#!/usr/bin/env bash
# nvcc_emu.sh - stands in for nvcc in `make NVCC=dev/emu/nvcc_emu.sh`: the
# .cu source is compiled by the host C++ compiler as C++17 with
# dev/emu/cuda_emu.h included first, so its kernels run on the CPU
# (dev/emu/README.md). nvcc's device options are dropped; -Xcompiler
# options are passed on.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
cuda=${CUDA_HOME:-/usr/local/cuda}
args=()
while [ $# -gt 0 ]; do
  case $1 in
    -gencode=*|--expt-relaxed-constexpr|-lineinfo|-Xptxas=*|-O3) ;;
    -gencode|-Xptxas) shift ;;
    -Xcompiler) shift; args+=("$1") ;;
    *) args+=("$1") ;;
  esac
  shift
done
exec ${CXX:-g++} -x c++ -std=c++17 -O1 -g -include "$here/cuda_emu.h" -I"$here/../.." -I"$cuda/include" \
  -Wno-attributes -Wno-unknown-pragmas -Wno-unused-function -Wno-unused-variable "${args[@]}"
