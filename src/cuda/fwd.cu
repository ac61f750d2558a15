/* Placeholder until the fwd kernels land: reports NOT_SUPPORTED. */
#include "cuda/cuda_backend.h"

fqla_status fqla_cuda_fwd_supported(fqla_context *ctx, const fqla_problem *p, const fqla_fwd_args *a)
{
    (void)p; (void)a;
    return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED, "CUDA backend: the fwd kernels are not built yet");
}
fqla_status fqla_cuda_fwd_workspace(fqla_context *ctx, const fqla_problem *p, const fqla_fwd_args *a, size_t *bytes)
{
    *bytes = 0;
    return fqla_cuda_fwd_supported(ctx, p, a);
}
fqla_status fqla_cuda_fwd_run(fqla_context *ctx, const fqla_problem *p, const fqla_fwd_args *a,
                              void *workspace, size_t workspace_bytes, cudaStream_t stream)
{
    (void)workspace; (void)workspace_bytes; (void)stream;
    return fqla_cuda_fwd_supported(ctx, p, a);
}
