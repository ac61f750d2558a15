/*
 * backend.cu - the CUDA backend's dispatcher: device query, the architecture
 * check, and routing of each validated problem to its kernel family
 * (fwd*.cu, bwd*.cu, decode*.cu). The caller's current device is restored after each
 * call, so a context for device 1 can be used from a thread whose current
 * device is 0.
 */
#include "cuda/cuda_backend.h"

#include <stdio.h>

fqla_status fqla_cuda_check(fqla_context *ctx, cudaError_t err, const char *what)
{
    if (err == cudaSuccess) return FQLA_STATUS_SUCCESS;
    return fqla_fail(ctx, FQLA_STATUS_DEVICE_ERROR, "%s: %s (%s)", what, cudaGetErrorString(err),
                     cudaGetErrorName(err));
}

extern "C" fqla_status fqla_cuda_device_query(int device, fqla_device_info *info, char *why, size_t why_size)
{
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err != cudaSuccess || count == 0) {
        /* The runtime reports a machine without any NVIDIA driver as
         * cudaErrorInsufficientDriver ("driver version is insufficient"), which
         * reads like "upgrade your driver": cudaDriverGetVersion gives 0 there. */
        int driver = 0;
        cudaError_t derr = cudaDriverGetVersion(&driver);
        if (why && why_size) {
            if (derr != cudaSuccess || driver == 0)
                snprintf(why, why_size, "no NVIDIA driver found (libcuda not installed or not loadable), so no CUDA device can be used");
            else if (err == cudaErrorInsufficientDriver)
                snprintf(why, why_size, "the NVIDIA driver supports CUDA %d.%d, older than the CUDA %d.%d runtime "
                         "flashqla was built with", driver / 1000, driver % 1000 / 10, CUDART_VERSION / 1000,
                         CUDART_VERSION % 1000 / 10);
            else if (err == cudaSuccess || err == cudaErrorNoDevice)
                snprintf(why, why_size, "no CUDA device found (NVIDIA driver present)");
            else
                snprintf(why, why_size, "no CUDA device (%s)", cudaGetErrorString(err));
        }
        cudaGetLastError(); /* clear the recorded error so the next runtime call does not report it */
        return FQLA_STATUS_BACKEND_UNAVAILABLE;
    }
    if (device >= count) {
        if (why && why_size) snprintf(why, why_size, "device %d does not exist (%d CUDA devices)", device, count);
        return FQLA_STATUS_INVALID_VALUE;
    }
    cudaDeviceProp prop;
    err = cudaGetDeviceProperties(&prop, device);
    if (err != cudaSuccess) {
        if (why && why_size) snprintf(why, why_size, "cudaGetDeviceProperties: %s", cudaGetErrorString(err));
        return FQLA_STATUS_DEVICE_ERROR;
    }
    info->backend = FQLA_BACKEND_CUDA;
    info->device = device;
    snprintf(info->name, sizeof info->name, "%s", prop.name);
    info->cc_major = prop.major;
    info->cc_minor = prop.minor;
    info->sm_count = prop.multiProcessorCount;
    info->threads = 0;
    return FQLA_STATUS_SUCCESS;
}

/* The kernels are compiled for sm_90a only: other GPUs get ARCH_MISMATCH. */
static fqla_status check_arch(fqla_context *ctx)
{
    if (ctx->info.cc_major == 9 && ctx->info.cc_minor == 0) return FQLA_STATUS_SUCCESS;
    return fqla_fail(ctx, FQLA_STATUS_ARCH_MISMATCH,
                     "device %d (%s) has compute capability %d.%d; the CUDA kernels are built for sm_90a (9.0)",
                     ctx->device, ctx->info.name, ctx->info.cc_major, ctx->info.cc_minor);
}

extern "C" fqla_status fqla_cuda_supported(fqla_context *ctx, const fqla_problem *p, const void *args)
{
    fqla_status st = check_arch(ctx);
    if (st != FQLA_STATUS_SUCCESS) return st;
    switch (p->op) {
    case FQLA_OP_FWD: return fqla_cuda_fwd_supported(ctx, p, (const fqla_fwd_args *)args);
    case FQLA_OP_DECODE:
    case FQLA_OP_VERIFY: return fqla_cuda_decode_supported(ctx, p, (const fqla_decode_args *)args);
    case FQLA_OP_BWD: return fqla_cuda_bwd_supported(ctx, p, (const fqla_bwd_args *)args);
    }
    return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED, "operation %d: not a CUDA backend operation", (int)p->op);
}

extern "C" fqla_status fqla_cuda_workspace(fqla_context *ctx, const fqla_problem *p, const void *args, size_t *bytes)
{
    *bytes = 0;
    switch (p->op) {
    case FQLA_OP_FWD: return fqla_cuda_fwd_workspace(ctx, p, (const fqla_fwd_args *)args, bytes);
    case FQLA_OP_DECODE:
    case FQLA_OP_VERIFY: return fqla_cuda_decode_workspace(ctx, p, (const fqla_decode_args *)args, bytes);
    case FQLA_OP_BWD: return fqla_cuda_bwd_workspace(ctx, p, (const fqla_bwd_args *)args, bytes);
    }
    return fqla_cuda_supported(ctx, p, args);
}

extern "C" fqla_status fqla_cuda_run(fqla_context *ctx, const fqla_problem *p, const void *args, void *workspace,
                                     size_t workspace_bytes, void *stream)
{
    int previous = -1;
    fqla_status st = fqla_cuda_check(ctx, cudaGetDevice(&previous), "cudaGetDevice");
    if (st != FQLA_STATUS_SUCCESS) return st;
    if (previous != ctx->device) {
        st = fqla_cuda_check(ctx, cudaSetDevice(ctx->device), "cudaSetDevice");
        if (st != FQLA_STATUS_SUCCESS) return st;
    }
    cudaStream_t s = (cudaStream_t)stream;
    switch (p->op) {
    case FQLA_OP_FWD:
        st = fqla_cuda_fwd_run(ctx, p, (const fqla_fwd_args *)args, workspace, workspace_bytes, s);
        break;
    case FQLA_OP_DECODE:
    case FQLA_OP_VERIFY:
        st = fqla_cuda_decode_run(ctx, p, (const fqla_decode_args *)args, workspace, workspace_bytes, s);
        break;
    case FQLA_OP_BWD:
        st = fqla_cuda_bwd_run(ctx, p, (const fqla_bwd_args *)args, workspace, workspace_bytes, s);
        break;
    }
    if (previous != ctx->device) cudaSetDevice(previous);
    return st;
}
