/*
 * ptx/mbarrier.cuh - mbarrier: shared-memory barriers that count arrivals
 * and transaction bytes (TMA completions) per phase.
 *
 * A phase completes when its arrivals and its expected bytes are all in;
 * try_wait.parity(p) succeeds once the phase of parity p has completed, so
 * a waiter tracks the parity it expects (kernel/pipeline.cuh), starting at
 * 0 for data it consumes and at 1 for a slot it may fill (a fresh barrier
 * counts as having completed the phase before its first).
 */
#ifndef FQLA_CUDA_PTX_MBARRIER_CUH
#define FQLA_CUDA_PTX_MBARRIER_CUH

#include "cuda/ptx/common.cuh"

/* mbarrier.init: count arrivals per phase. */
FQLA_DEVICE_INLINE void fqla_mbar_init(uint64_t *b, uint32_t count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(fqla_smem_u32(b)), "r"(count) : "memory");
}
/* fence.mbarrier_init: makes the inits visible to the async proxy (TMA
 * completions) before any copy is issued on them. */
FQLA_DEVICE_INLINE void fqla_mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
/* mbarrier.arrive.expect_tx: one arrival, and bytes more expected this phase. */
FQLA_DEVICE_INLINE void fqla_mbar_arrive_tx(uint64_t *b, uint32_t bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(fqla_smem_u32(b)), "r"(bytes)
                 : "memory");
}
/* mbarrier.arrive: one arrival. */
FQLA_DEVICE_INLINE void fqla_mbar_arrive(uint64_t *b)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(fqla_smem_u32(b)) : "memory");
}
/* mbarrier.try_wait.parity on a shared-window address: 1 once the phase of
 * the given parity has completed (the hardware may suspend the thread for a
 * while before it answers 0). */
FQLA_DEVICE_INLINE uint32_t fqla_mbar_try_wait(uint32_t addr, uint32_t parity)
{
    uint32_t done;
    asm volatile("{\n\t.reg .pred p;\n\t"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                 "selp.u32 %0, 1, 0, p;\n\t}"
                 : "=r"(done)
                 : "r"(addr), "r"(parity)
                 : "memory");
    return done;
}
/* Returns once the phase of the given parity has completed. */
FQLA_DEVICE_INLINE void fqla_mbar_wait(uint64_t *b, uint32_t parity)
{
    const uint32_t a = fqla_smem_u32(b);
    while (!fqla_mbar_try_wait(a, parity)) {
    }
}

#endif
