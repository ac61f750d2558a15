/*
 * fwd_fused_exp.cuh - (developer build) issue 42's first timing experiment,
 * the whole forward in one kernel (fwd_fused_exp.cu), launched in place of
 * the fused route's two kernels when fqla_cuda_fwd_tune's prep_variant is
 * 10 (the products warpgroup alone), 11 (and the inverse warps) or 12 (and
 * the hand-offs between them), 13 / 14 (12 without the inverse's merges /
 * and its substitution), 15 (12 with the merges on the CUDA cores),
 * 16 (12 with plain tf32 merges), 17 (the inverse on the products warpgroup's
 * tensor cores in fp16) and 18 / 19 (17 without its diagonal blocks / without
 * the inverse), 20 / 21 (17 with the diagonal blocks on the idle warps, a
 * chunk ahead in 21, in fp32 on the CUDA cores in 22), 23 (18 at 22's
 * register split), 24 (22 at 32 / 96 registers), 25 (18 with its diagonal
 * blocks from two warps that form them from the stage's K tile) and 26
 * (25 made correct: the one-kernel forward, checked against the reference
 * by test_gpu_fwd's fwd_one_kernel). Modes 10-25 are timing only: their
 * outputs are wrong by design.
 */
#ifndef FQLA_DEV_FWD_FUSED_EXP_CUH
#define FQLA_DEV_FWD_FUSED_EXP_CUH

#include "cuda/fwd_common.cuh"

/* prep_variant values that select the experiment: its modes, first to last */
enum { FQLA_DEV_FWD_EXP_FIRST = 10, FQLA_DEV_FWD_EXP_LAST = 26 };
static inline bool fqla_dev_fwd_fused_exp_mode(int prep_variant)
{
    return prep_variant >= FQLA_DEV_FWD_EXP_FIRST && prep_variant <= FQLA_DEV_FWD_EXP_LAST;
}

/* Like fqla_fwd_launch_fused (parts: FQLA_FUSED_PREPARE launches nothing,
 * FQLA_FUSED_CHAIN the kernel); *used = 0 where it does not cover the call
 * (CP, l2norm, K = 256, V not a multiple of 64 nwg, no TMA maps). */
cudaError_t fqla_dev_fwd_launch_fused_exp(const fqla_fwd_params &k, int io_bf16, int mode, int nwg, int parts,
                                          cudaStream_t stream, int *used);

#endif
