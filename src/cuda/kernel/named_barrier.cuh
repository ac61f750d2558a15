/*
 * kernel/named_barrier.cuh - named CTA barriers by name.
 *
 * The convention: each kernel declares its barrier ids as an enum class,
 * first id 1 (0 is __syncthreads'), for example
 *
 *   enum class fu_bar : uint32_t { chain = 1, s_staged = 2, out0 = 3 };
 *
 * and syncs with fqla_bar_sync(fu_bar::chain, 128 * NWG), never with a
 * literal id. An id that varies per warpgroup (one barrier per chain
 * warpgroup) is the enum's first id plus the warpgroup index, written with
 * fqla_bar_id(first, i). The thread count (arrivers and waiters, a
 * multiple of 32) stays at the call: one barrier may serve different sets
 * of threads in different branches.
 */
#ifndef FQLA_CUDA_KERNEL_NAMED_BARRIER_CUH
#define FQLA_CUDA_KERNEL_NAMED_BARRIER_CUH

#include <type_traits>

#include "cuda/ptx/barrier.cuh"

/* ids 1 .. 15 (bar.sync / bar.arrive take 0 .. 15; 0 is __syncthreads') */
template <typename E> FQLA_DEVICE_INLINE constexpr uint32_t fqla_bar_id(E id, uint32_t i = 0)
{
    static_assert(std::is_enum<E>::value, "a barrier id is an enum value");
    return (uint32_t)id + i;
}
/* bar.sync on a named barrier: arrive, and wait until n threads have */
template <typename E> FQLA_DEVICE_INLINE void fqla_bar_sync(E id, uint32_t n, uint32_t i = 0)
{
    fqla_named_sync(fqla_bar_id(id, i), n);
}
/* bar.arrive on a named barrier: arrive without waiting */
template <typename E> FQLA_DEVICE_INLINE void fqla_bar_arrive(E id, uint32_t n, uint32_t i = 0)
{
    fqla_named_arrive(fqla_bar_id(id, i), n);
}

#endif
