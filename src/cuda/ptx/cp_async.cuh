/*
 * ptx/cp_async.cuh - per-thread asynchronous global -> shared copies
 * (cp.async, 4 or 16 bytes) and their commit groups.
 */
#ifndef FQLA_CUDA_PTX_CP_ASYNC_CUH
#define FQLA_CUDA_PTX_CP_ASYNC_CUH

#include "cuda/ptx/common.cuh"

/* cp.async.cg 16 bytes; src_bytes = 0 writes zeros (src unread). */
FQLA_DEVICE_INLINE void fqla_cp_async16(void *dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;"
                 :: "r"(fqla_smem_u32(dst)), "l"(src), "r"(src_bytes) : "memory");
}
/* cp.async.ca 4 bytes (rows not 16-byte aligned). */
FQLA_DEVICE_INLINE void fqla_cp_async4(void *dst, const void *src)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(fqla_smem_u32(dst)), "l"(src) : "memory");
}
/* cp.async.commit_group */
FQLA_DEVICE_INLINE void fqla_cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
/* cp.async.wait_group: at most N of this thread's committed groups pending. */
template <int N>
FQLA_DEVICE_INLINE void fqla_cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }
/* Every committed group landed. Copies issued since the last commit are NOT
 * waited for (wait_group 0, not cp.async.wait_all): commit before waiting.
 * A branch that left out the commit read stale tiles on the H200 and passed
 * the CPU emulator until it kept commit groups as the GPU does
 * (docs/history/2026-12-05-gpu.md). */
FQLA_DEVICE_INLINE void fqla_cp_async_wait_all() { fqla_cp_async_wait<0>(); }

#endif
