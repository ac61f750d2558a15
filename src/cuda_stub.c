/*
 * cuda_stub.c - the CUDA backend's entry points in a build without nvcc (and
 * in the sanitizer and fuzzer builds): every call reports the backend as
 * unavailable. With nvcc, src/cuda/backend.cu defines them instead.
 */
#include "internal.h"

#ifndef FQLA_HAVE_CUDA

#include <stdio.h>

fqla_status fqla_cuda_device_query(int device, fqla_device_info *info, char *why, size_t why_size)
{
    (void)device;
    (void)info;
    if (why && why_size) snprintf(why, why_size, "flashqla was built without CUDA (no nvcc at build time, or make CUDA=0)");
    return FQLA_STATUS_BACKEND_UNAVAILABLE;
}

static fqla_status unavailable(fqla_context *ctx)
{
    return fqla_fail(ctx, FQLA_STATUS_BACKEND_UNAVAILABLE, "backend CUDA: flashqla was built without CUDA");
}

fqla_status fqla_cuda_supported(fqla_context *ctx, const fqla_problem *p, const void *args)
{
    (void)p;
    (void)args;
    return unavailable(ctx);
}

fqla_status fqla_cuda_workspace(fqla_context *ctx, const fqla_problem *p, const void *args, size_t *bytes)
{
    (void)p;
    (void)args;
    *bytes = 0;
    return unavailable(ctx);
}

fqla_status fqla_cuda_run(fqla_context *ctx, const fqla_problem *p, const void *args, void *workspace,
                          size_t workspace_bytes, void *stream)
{
    (void)p;
    (void)args;
    (void)workspace;
    (void)workspace_bytes;
    (void)stream;
    return unavailable(ctx);
}

#else
/* ISO C forbids an empty translation unit. */
typedef int fqla_cuda_stub_unused;
#endif
