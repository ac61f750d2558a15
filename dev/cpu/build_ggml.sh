#!/bin/sh
# build_ggml.sh - builds ggml's CPU backend (shared libraries) from public
# ggml sources OUTSIDE this repository, for bench/bench_cpu.c and
# `flashqla bench --backend cpu --ggml DIR`, which load it at run time
# (dlopen) and time ggml_gated_delta_net next to flashqla's CPU backend.
#
#   dev/cpu/build_ggml.sh SRC [BUILD]
#     SRC    a checkout (or exported tree) of github.com/ggml-org/ggml, or of
#            llama.cpp's ggml/ folder, that has ggml_gated_delta_net
#     BUILD  where to build (default: SRC/build-flashqla-bench)
# Prints the folder holding libggml*.so; pass that as --ggml.
#
# Native flags (GGML_NATIVE=ON): ggml is measured at its best on this machine.
# No ggml code or binary enters the repository.
set -eu
SRC=${1:?usage: build_ggml.sh SRC [BUILD]}
BUILD=${2:-$SRC/build-flashqla-bench}
case "$(cd "$BUILD" 2>/dev/null && pwd || echo "$BUILD")" in
  "$(git -C "$(dirname "$0")" rev-parse --show-toplevel 2>/dev/null || echo /nonexistent)"*)
    echo "build_ggml.sh: build ggml outside the repository" >&2; exit 2;;
esac
grep -q "ggml_gated_delta_net" "$SRC/include/ggml.h" || {
  echo "build_ggml.sh: $SRC/include/ggml.h has no ggml_gated_delta_net (too old a ggml)" >&2; exit 2; }
GEN=""
command -v ninja >/dev/null 2>&1 && GEN="-G Ninja"
cmake -S "$SRC" -B "$BUILD" $GEN -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
  -DGGML_NATIVE=ON -DGGML_OPENMP=OFF -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF \
  -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_BLAS=OFF >&2
cmake --build "$BUILD" --target ggml-cpu ggml-base ggml -j "${JOBS:-2}" >&2
dirname "$(find "$BUILD" -name 'libggml-cpu.so' | head -1)"
