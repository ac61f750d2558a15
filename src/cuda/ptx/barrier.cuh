/*
 * ptx/barrier.cuh - named CTA barriers (bar.sync / bar.arrive) and
 * elect.sync.
 *
 * A named barrier id is 0 .. 15 (0 is __syncthreads'); n counts every
 * participating thread, arrivers and waiters, a multiple of 32. Kernels
 * name their ids in an enum (kernel/named_barrier.cuh). A compile-time id
 * lets ptxas see which barriers a kernel uses; a run-time one makes it
 * reserve all 16.
 */
#ifndef FQLA_CUDA_PTX_BARRIER_CUH
#define FQLA_CUDA_PTX_BARRIER_CUH

#include "cuda/ptx/common.cuh"

/* bar.sync id, n: arrive and wait for n threads. */
FQLA_DEVICE_INLINE void fqla_named_sync(uint32_t id, uint32_t n) { asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory"); }
/* bar.arrive id, n: arrive without waiting (the waiters use bar.sync). */
FQLA_DEVICE_INLINE void fqla_named_arrive(uint32_t id, uint32_t n)
{
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory");
}
/* barrier.sync / barrier.arrive without .aligned: the same, for warps that
 * reach one barrier from different places in the code (warpgroups by role).
 * The .aligned forms above require every thread of the barrier to execute
 * the same instruction (PTX ISA), which compute-sanitizer's synccheck
 * enforces. */
FQLA_DEVICE_INLINE void fqla_named_sync_any(uint32_t id, uint32_t n)
{
    asm volatile("barrier.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}
FQLA_DEVICE_INLINE void fqla_named_arrive_any(uint32_t id, uint32_t n)
{
    asm volatile("barrier.arrive %0, %1;" ::"r"(id), "r"(n) : "memory");
}
/* elect.sync over the full warp: true in one lane. */
FQLA_DEVICE_INLINE bool fqla_elect_one()
{
    uint32_t p;
    asm volatile("{\n\t.reg .b32 r;\n\t.reg .pred q;\n\telect.sync r|q, 0xffffffff;\n\t"
                 "selp.u32 %0, 1, 0, q;\n\t}"
                 : "=r"(p));
    return p != 0;
}

#endif
