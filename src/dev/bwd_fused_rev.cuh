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
 * gradient prototype (timing only: the gradient kernel does not run), 6
 * the same without the chunk's tail, 7 and 8 as 5 and 6 with dq / dk stored
 * once a q/k head; 9 as 7 with a q/k head's CTAs adjacent in the grid, 10
 * as 9 with dq / dk summed over them in L2 in a fixed order, 11 and 12 (timing
 * only) each CTA's fp32 rows stored to its own slot or red-added into one,
 * 13 the slots of 11 summed in part order by the CTA that arrives last; 14
 * the real gradient work (every gradient of the chunks whose states are bf16
 * planes, dq / dk summed as in 13, dg / dbeta over the two halves the same
 * way; the gradient kernel forms the other chunks'). */
cudaError_t fqla_dev_bwd_launch_fused_rev(const fqla_bwd_params &p, int mode, cudaStream_t stream);
/* Whether the mode's pass stands in for the gradient kernel too (5-13: the
 * timing prototypes); 14 forms the gradients of the chunks it covers and
 * leaves the others to the gradient kernel (fqla_bwd_params.fused_grads). */
static inline bool fqla_dev_bwd_fused_rev_grads(int mode) { return mode >= 5 && mode <= 13; }
static inline bool fqla_dev_bwd_fused_rev_real(int mode) { return mode == 14; }

#endif
