/*
 * ptx/tma.cuh - the tensor memory accelerator: tile copies through a
 * CUtensorMap (cp.async.bulk.tensor) and contiguous bulk copies
 * (cp.async.bulk), their bulk async-groups, and prefetch.tensormap.
 *
 * Loads complete on an mbarrier with the box's full byte count, elements
 * outside the tensor included (they arrive as zeros); coordinates are
 * element indices, innermost first. A map is passed to the kernel as a
 * const __grid_constant__ parameter (or sits in global memory), so that its
 * generic address is what TMA reads.
 */
#ifndef FQLA_CUDA_PTX_TMA_CUH
#define FQLA_CUDA_PTX_TMA_CUH

#include <cuda.h> /* CUtensorMap (a type only: libcuda is not linked) */

#include "cuda/ptx/common.cuh"

/* prefetch.tensormap */
FQLA_DEVICE_INLINE void fqla_tma_prefetch(const CUtensorMap *m)
{
    asm volatile("prefetch.tensormap [%0];" ::"l"((uint64_t)m) : "memory");
}
/* cp.async.bulk.tensor.4d global -> shared, completion on bar. */
FQLA_DEVICE_INLINE void fqla_tma_load_4d(void *dst, const CUtensorMap *m, uint64_t *bar, int c0, int c1, int c2, int c3)
{
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%3, %4, %5, %6}], [%2];" ::"r"(fqla_smem_u32(dst)),
                 "l"((uint64_t)m), "r"(fqla_smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}
/* cp.async.bulk.tensor.2d global -> shared, completion on bar. */
FQLA_DEVICE_INLINE void fqla_tma_load_2d(void *dst, const CUtensorMap *m, uint64_t *bar, int c0, int c1)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%3, %4}], [%2];" ::"r"(fqla_smem_u32(dst)),
                 "l"((uint64_t)m), "r"(fqla_smem_u32(bar)), "r"(c0), "r"(c1)
                 : "memory");
}
/* cp.async.bulk global -> shared: contiguous bytes (a multiple of 16, both
 * addresses 16-aligned), completion on bar. */
FQLA_DEVICE_INLINE void fqla_bulk_load(void *dst, const void *src, uint32_t bytes, uint64_t *bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     fqla_smem_u32(dst)),
                 "l"(src), "r"(bytes), "r"(fqla_smem_u32(bar))
                 : "memory");
}
/* cp.async.bulk shared -> global: contiguous bytes (a multiple of 16, both
 * addresses 16-aligned), in this thread's bulk async-group. */
FQLA_DEVICE_INLINE void fqla_bulk_store(void *dst, const void *src, uint32_t bytes)
{
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;" ::"l"(dst), "r"(fqla_smem_u32(src)),
                 "r"(bytes)
                 : "memory");
}
/* cp.async.bulk.tensor.4d shared -> global (box elements outside the tensor
 * are not written), in this thread's bulk async-group. */
FQLA_DEVICE_INLINE void fqla_tma_store_4d(const CUtensorMap *m, const void *src, int c0, int c1, int c2, int c3)
{
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5}], [%1];" ::"l"(
                     (uint64_t)m),
                 "r"(fqla_smem_u32(src)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}
/* cp.async.bulk.tensor.2d shared -> global, in this thread's bulk async-group. */
FQLA_DEVICE_INLINE void fqla_tma_store_2d(const CUtensorMap *m, const void *src, int c0, int c1)
{
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.tile.bulk_group [%0, {%2, %3}], [%1];" ::"l"((uint64_t)m),
                 "r"(fqla_smem_u32(src)), "r"(c0), "r"(c1)
                 : "memory");
}
/* cp.async.bulk.commit_group: closes this thread's pending bulk stores into a group. */
FQLA_DEVICE_INLINE void fqla_bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
/* cp.async.bulk.wait_group.read: at most N of this thread's groups still
 * read shared memory (their sources may be reused). */
template <int N> FQLA_DEVICE_INLINE void fqla_bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory"); }
/* cp.async.bulk.wait_group: at most N pending at all (their global writes done). */
template <int N> FQLA_DEVICE_INLINE void fqla_bulk_wait() { asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory"); }

#endif
