/*
 * cpu_isa.h - which instruction set the fast CPU path's matrix kernels use,
 * chosen once per process at run time.
 *
 * The library is built for a baseline (x86-64-v2: SSE4.2, no FMA). On x86
 * with GCC or clang the hot loops also have bodies compiled (with target
 * attributes) for AVX2 + FMA and for AVX-512F, used when the CPU has them,
 * unless the environment variable FQLA_CPU_ISA=sse (read once, at the first
 * use) forces the baseline.
 * On aarch64 NEON is part of the architecture: the NEON bodies are compiled
 * in (no target attributes, no CPU check) and are the path above the
 * baseline there, at the same level as AVX2 on x86 (the two never exist in
 * one build); FQLA_CPU_ISA=base selects the portable C bodies instead.
 * Every thread of every call reads the same cached choice, so results stay
 * bit-identical run to run and across thread counts; the two paths round
 * differently (FMA), so they are not bit-identical to each other.
 */
#ifndef FQLA_CPU_ISA_H
#define FQLA_CPU_ISA_H

enum {
    FQLA_CPU_ISA_BASE = 0, /* the build's baseline (SSE on x86-64-v2) */
    FQLA_CPU_ISA_AVX2 = 1, /* AVX2 + FMA kernels */
    FQLA_CPU_ISA_AVX512 = 2, /* AVX-512F kernels where there are any (else AVX2's) */
    FQLA_CPU_ISA_NEON = 1 /* aarch64 only: the NEON kernels */
};

/* The path in use: the best one compiled in and supported by the CPU, or
 * the baseline when FQLA_CPU_ISA is "sse" (or "base"). Paths are ordered:
 * isa >= FQLA_CPU_ISA_AVX2 means AVX2 + FMA may be used. */
int fqla_cpu_isa(void);

/* The best path this build and CPU support, ignoring FQLA_CPU_ISA. */
int fqla_cpu_isa_available(void);

/* For tests only: use isa from now on (lowered to the best available path
 * where isa is not). Must not run while a product is in flight.
 * Returns the path now in use. */
int fqla_cpu_isa_force(int isa);

#endif
