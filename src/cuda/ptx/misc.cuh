/*
 * ptx/misc.cuh - single instructions of no larger family: ex2.approx,
 * cvt.rna.tf32, prefetch.global.L2, st.shared.v4, ld.acquire.gpu,
 * atom.acq_rel.gpu.add and discard.global.L2.
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

/* ld.acquire.gpu.b32: a flag another grid releases (fence, then atomic):
 * the loads after it, and those of the threads a barrier orders after it,
 * see what the release published. */
FQLA_DEVICE_INLINE int fqla_ld_acquire_gpu(const int *p)
{
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(__cvta_generic_to_global(p)) : "memory");
    return v;
}

/* atom.acq_rel.gpu.global.add.u32: returns the old value; the writes this
 * thread published before it (and those a barrier ordered before it) are
 * visible to the thread whose add comes after it, which also sees theirs. */
FQLA_DEVICE_INLINE int fqla_atom_add_acq_rel_gpu(int *p, int v)
{
    int old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;"
                 : "=r"(old)
                 : "l"(__cvta_generic_to_global(p)), "r"(v)
                 : "memory");
    return old;
}

/* discard.global.L2: drops the 128-byte L2 line at p (128-aligned) without
 * writing it back; its bytes are undefined afterwards. For scratch that no
 * one reads again, so that it never reaches DRAM. */
FQLA_DEVICE_INLINE void fqla_discard_l2(void *p)
{
    asm volatile("discard.global.L2 [%0], 128;" ::"l"(__cvta_generic_to_global(p)) : "memory");
}

/* st.shared.v4.b32 by shared-window address. Volatile (it keeps its order
 * against the barriers and fences, all volatile asm) but without a memory
 * clobber, so that the compiler may still move global loads above it: with
 * the clobber, a loop that loads from global memory and stores into shared
 * memory waits for each load in turn. */
FQLA_DEVICE_INLINE void fqla_st_shared_v4(uint32_t a, uint32_t x, uint32_t y, uint32_t z, uint32_t w)
{
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(a), "r"(x), "r"(y), "r"(z), "r"(w));
}

#endif
