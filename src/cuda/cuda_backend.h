/*
 * cuda_backend.h - entry points of the CUDA kernel families, called by the
 * dispatcher in backend.cu. Each family checks what it covers in *_supported
 * (naming the unsupported item through fqla_fail), gives its exact workspace
 * in *_workspace, and launches on `stream` in *_run without allocating or
 * synchronising. The problem was validated by src/validate.c; the context's
 * device is current and is sm_90.
 */
#ifndef FQLA_CUDA_BACKEND_H
#define FQLA_CUDA_BACKEND_H

#include <cuda_runtime.h>

extern "C" {
#include "internal.h"
}

/* chunked prefill forward (fwd*.cu) */
fqla_status fqla_cuda_fwd_supported(fqla_context *ctx, const fqla_problem *p, const fqla_fwd_args *a);
fqla_status fqla_cuda_fwd_workspace(fqla_context *ctx, const fqla_problem *p, const fqla_fwd_args *a, size_t *bytes);
fqla_status fqla_cuda_fwd_run(fqla_context *ctx, const fqla_problem *p, const fqla_fwd_args *a,
                              void *workspace, size_t workspace_bytes, cudaStream_t stream);

/* chunked backward (bwd*.cu) */
fqla_status fqla_cuda_bwd_supported(fqla_context *ctx, const fqla_problem *p, const fqla_bwd_args *a);
fqla_status fqla_cuda_bwd_workspace(fqla_context *ctx, const fqla_problem *p, const fqla_bwd_args *a, size_t *bytes);
fqla_status fqla_cuda_bwd_run(fqla_context *ctx, const fqla_problem *p, const fqla_bwd_args *a,
                              void *workspace, size_t workspace_bytes, cudaStream_t stream);

/* decode and verify (decode*.cu); p->op is FQLA_OP_DECODE or FQLA_OP_VERIFY */
fqla_status fqla_cuda_decode_supported(fqla_context *ctx, const fqla_problem *p, const fqla_decode_args *a);
fqla_status fqla_cuda_decode_workspace(fqla_context *ctx, const fqla_problem *p, const fqla_decode_args *a, size_t *bytes);
fqla_status fqla_cuda_decode_run(fqla_context *ctx, const fqla_problem *p, const fqla_decode_args *a,
                                 void *workspace, size_t workspace_bytes, cudaStream_t stream);

/* Maps a CUDA error to FQLA_STATUS_DEVICE_ERROR with the runtime's message. */
fqla_status fqla_cuda_check(fqla_context *ctx, cudaError_t err, const char *what);

#endif
