#!/bin/sh
# bench_cpu.sh - builds bench/bench_cpu.c against this checkout's CPU library
# and a ggml built OUTSIDE the repository (dev/cpu/build_ggml.sh), and runs it.
#
#   dev/cpu/bench_cpu.sh GGML_SRC GGML_LIBDIR [bench_cpu options]
#   e.g. dev/cpu/bench_cpu.sh ~/ggml ~/ggml-build/src --csv bench/results/cpu.csv
# GGML_SRC gives the headers (include/ggml.h, ggml-cpu.h); GGML_LIBDIR the
# folder build_ggml.sh printed. Records carry `git describe`'s short commit
# (-dirty when the checkout differs from it outside bench/results/) and the
# CPU's model name.
set -eu
SRC=${1:?usage: bench_cpu.sh GGML_SRC GGML_LIBDIR [options]}
LIB=${2:?usage: bench_cpu.sh GGML_SRC GGML_LIBDIR [options]}
shift 2
cd "$(dirname "$0")/../.."
make CUDA=0 build/libflashqla.a >&2
cc -O2 -march=x86-64-v2 -std=c99 -Wall -Wextra -D_POSIX_C_SOURCE=200809L -DFQLA_BENCH_GGML -Iinclude -I"$SRC/include" \
   -pthread bench/bench_cpu.c cli/cpu_edge.c build/libflashqla.a -L"$LIB" -Wl,-rpath,"$LIB" -lggml-cpu -lggml-base -lm \
   -o build/bench_cpu_ggml
# the commit, +dirty when anything but the results files differs from it
COMMIT=$(git rev-parse --short=7 HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- . ':!bench/results' 2>/dev/null || COMMIT="$COMMIT-dirty"

MACHINE=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -1 | tr -d ',' )
exec build/bench_cpu_ggml --machine "${MACHINE:-cpu} x$(nproc)" --commit "$COMMIT" "$@"
