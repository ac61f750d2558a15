/*
 * cpu_isa.c - the run-time choice between the baseline, AVX2 + FMA and
 * AVX-512 kernels, or on aarch64 between the baseline and NEON (see cpu_isa.h). The choice is made under pthread_once, so
 * concurrent first calls agree, and cached for the life of the process.
 */
#include "cpu/cpu_isa.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static pthread_once_t isa_once = PTHREAD_ONCE_INIT;
static int isa_current = FQLA_CPU_ISA_BASE;

int fqla_cpu_isa_available(void)
{
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    __builtin_cpu_init(); /* needed when called before constructors have run */
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma"))
        return FQLA_CPU_ISA_BASE;
    if (__builtin_cpu_supports("avx512f"))
        return FQLA_CPU_ISA_AVX512;
    return FQLA_CPU_ISA_AVX2;
#elif defined(__aarch64__)
    return FQLA_CPU_ISA_NEON; /* baseline on every aarch64 CPU */
#endif
    return FQLA_CPU_ISA_BASE;
}

static void isa_init(void)
{
    const char *env = getenv("FQLA_CPU_ISA");
    int want_base = env && (strcmp(env, "sse") == 0 || strcmp(env, "base") == 0);
    isa_current = want_base ? FQLA_CPU_ISA_BASE : fqla_cpu_isa_available();
}

int fqla_cpu_isa(void)
{
    pthread_once(&isa_once, isa_init);
    return isa_current;
}

int fqla_cpu_isa_force(int isa)
{
    pthread_once(&isa_once, isa_init);
    int best = fqla_cpu_isa_available();
    isa_current = isa < FQLA_CPU_ISA_BASE ? FQLA_CPU_ISA_BASE : isa > best ? best : isa;
    return isa_current;
}
