/*
 * ptx/misc.cuh - single instructions of no larger family: ex2.approx,
 * cvt.rna.tf32 and prefetch.global.L2.
 */
#ifndef FQLA_CUDA_PTX_MISC_CUH
#define FQLA_CUDA_PTX_MISC_CUH

#include "cuda/ptx/common.cuh"

/* ex2.approx.ftz.f32: 2^x (MUFU, ~2 ulp; 0 for large negative x) */
FQLA_DEVICE_INLINE float fqla_ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
/* cvt.rna.tf32.f32: x rounded to tf32 (to nearest, ties away from zero), in
 * fp32's bit layout. */
FQLA_DEVICE_INLINE uint32_t fqla_cvt_rna_tf32(float x)
{
    uint32_t r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}
/* prefetch.global.L2: moves the 128-byte line holding p into L2 (a hint;
 * never faults on in-bounds addresses). */
FQLA_DEVICE_INLINE void fqla_prefetch_l2(const void *p)
{
    asm volatile("prefetch.global.L2 [%0];" ::"l"(__cvta_generic_to_global(p)));
}

#endif
