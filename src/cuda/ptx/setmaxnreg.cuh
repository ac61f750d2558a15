/*
 * ptx/setmaxnreg.cuh - register reallocation between warpgroups.
 *
 * R is the new per-thread maximum (a multiple of 8 in 24 .. 256); .dec
 * returns registers to the CTA's pool, .inc blocks until the pool has them.
 * All four warps of a warpgroup execute the same one. The entry count must
 * be known to ptxas: the kernel needs __launch_bounds__(threads, 1), else
 * ptxas ignores the instruction (C7508).
 */
#ifndef FQLA_CUDA_PTX_SETMAXNREG_CUH
#define FQLA_CUDA_PTX_SETMAXNREG_CUH

#include "cuda/ptx/common.cuh"

/* setmaxnreg.inc */
template <int R> FQLA_DEVICE_INLINE void fqla_setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(R)); }
/* setmaxnreg.dec */
template <int R> FQLA_DEVICE_INLINE void fqla_setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(R)); }

#endif
