/* Placeholder until the decode kernels land: reports NOT_SUPPORTED. */
#include "cuda/cuda_backend.h"

fqla_status fqla_cuda_decode_supported(fqla_context *ctx, const fqla_problem *p, const fqla_decode_args *a)
{
    (void)p; (void)a;
    return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED, "CUDA backend: the decode kernels are not built yet");
}
fqla_status fqla_cuda_decode_workspace(fqla_context *ctx, const fqla_problem *p, const fqla_decode_args *a, size_t *bytes)
{
    *bytes = 0;
    return fqla_cuda_decode_supported(ctx, p, a);
}
fqla_status fqla_cuda_decode_run(fqla_context *ctx, const fqla_problem *p, const fqla_decode_args *a,
                              void *workspace, size_t workspace_bytes, cudaStream_t stream)
{
    (void)workspace; (void)workspace_bytes; (void)stream;
    return fqla_cuda_decode_supported(ctx, p, a);
}
