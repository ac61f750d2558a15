/*
 * bwd_fused_rev.cuh - (developer build) the fused reverse pass under
 * construction (bwd_fused_rev.cu), in place of the reverse chain where
 * fqla_cuda_bwd_tune_fused_rev(1) asks for it and it covers the call.
 */
#ifndef FQLA_DEV_BWD_FUSED_REV_CUH
#define FQLA_DEV_BWD_FUSED_REV_CUH

#include "cuda/bwd_common.cuh"

/* Whether the kernel covers the launch described by p in the mode. */
bool fqla_dev_bwd_fused_rev_covers(const fqla_bwd_params &p, int io_bf16, int mode);
/* The reverse chain's outputs (dS for every chunk, dh0) for every sequence
 * and value head; the state chain runs apart (fqla_bwd_launch_chain_states).
 * mode (fqla_cuda_bwd_tune_fused_rev's): 1 the whole V a CTA, 3 a CTA per
 * 64-column value half; 2 and 4 the same without the dS stores (timing
 * only: the gradient kernel reads them); 5 the half-width pass with the
 * gradient work: every gradient of the chunks whose states are bf16 planes
 * (dq / dk summed over a q/k head's CTAs, dg / dbeta over the two halves,
 * by the last CTA to arrive), the gradient kernel for the other chunks; 6
 * mode 5 with dq / dk unsummed (timing only). */
cudaError_t fqla_dev_bwd_launch_fused_rev(const fqla_bwd_params &p, int mode, cudaStream_t stream);
/* Whether the mode's pass forms gradients (5, 6): the gradient kernel then
 * leaves its chunks out (fqla_bwd_params.fused_grads). */
static inline bool fqla_dev_bwd_fused_rev_grads(int mode) { return mode == 5 || mode == 6; }

#endif
