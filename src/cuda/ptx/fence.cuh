/*
 * ptx/fence.cuh - proxy fences.
 *
 * Shared memory written by ordinary stores (st.shared, stmatrix: the
 * generic proxy) is read by wgmma and TMA stores through the async proxy;
 * every writer fences, then a barrier orders the reader after the writers.
 */
#ifndef FQLA_CUDA_PTX_FENCE_CUH
#define FQLA_CUDA_PTX_FENCE_CUH

#include "cuda/ptx/common.cuh"

/* fence.proxy.async.shared::cta: this thread's generic-proxy shared-memory
 * writes -> visible to the async proxy (wgmma operands, TMA stores). */
FQLA_DEVICE_INLINE void fqla_fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
/* The executing thread's async-proxy (bulk copy) accesses of global memory
 * ordered with its generic ones: after a bulk store has completed
 * (cp.async.bulk.wait_group), before a generic release that publishes it. */
FQLA_DEVICE_INLINE void fqla_fence_async_global() { asm volatile("fence.proxy.async.global;" ::: "memory"); }

#endif
