/*
 * ptx/common.cuh - what every wrapper of the ptx layer shares: the
 * qualifier of a wrapper and the shared-window address of a pointer.
 *
 * The ptx layer (src/cuda/ptx/) holds one short inline-PTX wrapper per
 * instruction, grouped by instruction family, one header per family, each
 * wrapper named after its instruction. Nothing here decides a protocol:
 * phases, arrival counts, byte counts and layouts are the kernels' (the
 * helpers of src/cuda/kernel/ name the recurring ones). ptx.cuh includes
 * them all.
 */
#ifndef FQLA_CUDA_PTX_COMMON_CUH
#define FQLA_CUDA_PTX_COMMON_CUH

#include <stdint.h>

#define FQLA_DEVICE_INLINE __device__ __forceinline__
/* A CTA-shared array declared in a kernel or device function (the dynamic
 * one stays `extern __shared__`): a name of its own so that the CPU
 * emulator (dev/emu/cuda_emu.h), which runs one CTA at a time, can make it
 * a static. */
#ifndef FQLA_SHARED
#define FQLA_SHARED __shared__
#endif

/* Shared-memory operands ([addr] of mbarrier, TMA, ldmatrix, ...) take
 * 32-bit shared-window addresses. */
FQLA_DEVICE_INLINE uint32_t fqla_smem_u32(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

#endif
