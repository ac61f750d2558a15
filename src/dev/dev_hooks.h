/*
 * dev_hooks.h - the developer build's (make DEV=1, FQLA_DEV) override points
 * in the CUDA backend: one per operation, called right after the product
 * planner has chosen the launch. src/dev/cuda_tune.cu implements them from
 * the tuning settings its exported fqla_cuda_* functions take (the
 * benchmarks and the dev-only GPU tests set them). The default build
 * neither compiles nor calls them.
 */
#ifndef FQLA_DEV_HOOKS_H
#define FQLA_DEV_HOOKS_H

#include "cuda/route_plan.h"
#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The forward: r as planned for shape s (the shape the kernels run) on
 * device d; run = 0 for the workspace query (an override of the CP plan
 * changes the workspace size too), 1 for the run with its workspace. */
void fqla_dev_fwd_route(const fqla_route_device *d, const fqla_fwd_shape *s, fqla_fwd_route *r, int run,
                        const void *workspace);

/* The backward: the chains' CP segment length (chunks, 0: no CP) for
 * problem p, given the planner's choice `planned`; called for the
 * workspace query and for the run alike, so both see the same plan. */
int64_t fqla_dev_bwd_seg_chunks(const fqla_problem *p, int64_t planned);

/* The backward: the chains' warpgroups a CTA (1 or 2; CP's passes too) for
 * problem p, given the planner's choice `planned` (bwd.cu's chain_nwg_of). */
int fqla_dev_bwd_chain_nwg(const fqla_problem *p, int planned);

/* The backward: the mode of the fused reverse pass under construction
 * (src/dev/bwd_fused_rev.cu) in place of the reverse chain where it covers
 * the call, 0 for none (the modes: fqla_cuda_bwd_tune_fused_rev);
 * fqla_dev_bwd_fused_rev_used records, every run, whether it ran. */
int fqla_dev_bwd_fused_rev(const fqla_problem *p);
void fqla_dev_bwd_fused_rev_used(int used_it);

/* Decode and verify: r as chosen for problem p. */
void fqla_dev_decode_route(const fqla_problem *p, int sm_count, fqla_decode_route *r);

#ifdef __cplusplus
}
#endif

#endif
