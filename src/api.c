/*
 * api.c - the public entry points. Each call runs the same pipeline:
 *
 *   live-context check -> validation (validate.c) -> the backend's supported()
 *   -> workspace check -> the backend's run function
 *
 * so every backend sees only validated problems, and a rejected call has
 * launched nothing and written nothing.
 */
#include "internal.h"

#include <string.h>

/* CUDA workspaces are carved into TMA-aligned buffers. */
#define FQLA_WORKSPACE_ALIGN 256

void fqla_fwd_args_init(fqla_fwd_args *args)
{
    if (!args) return;
    memset(args, 0, sizeof *args);
    args->opt.scale = FQLA_SCALE_DEFAULT;
}

void fqla_bwd_args_init(fqla_bwd_args *args)
{
    if (!args) return;
    memset(args, 0, sizeof *args);
    args->opt.scale = FQLA_SCALE_DEFAULT;
}

void fqla_decode_args_init(fqla_decode_args *args)
{
    if (!args) return;
    memset(args, 0, sizeof *args);
    args->opt.scale = FQLA_SCALE_DEFAULT;
}

static int host_readable(const fqla_context *ctx) { return ctx->backend != FQLA_BACKEND_CUDA; }

/* Validation of the op's argument struct into *p. */
static fqla_status validate(fqla_context *ctx, fqla_op op, const void *args, fqla_problem *p)
{
    if (!args) return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE, "args: NULL pointer");
    switch (op) {
    case FQLA_OP_FWD: return fqla_validate_fwd(ctx, (const fqla_fwd_args *)args, host_readable(ctx), p);
    case FQLA_OP_BWD: return fqla_validate_bwd(ctx, (const fqla_bwd_args *)args, host_readable(ctx), p);
    case FQLA_OP_DECODE: return fqla_validate_decode(ctx, (const fqla_decode_args *)args, 0, host_readable(ctx), p);
    case FQLA_OP_VERIFY: return fqla_validate_decode(ctx, (const fqla_decode_args *)args, 1, host_readable(ctx), p);
    }
    return fqla_fail(ctx, FQLA_STATUS_INTERNAL_ERROR, "unknown operation %d", (int)op);
}

static fqla_status backend_supported(fqla_context *ctx, const fqla_problem *p, const void *args)
{
    switch (ctx->backend) {
    case FQLA_BACKEND_CPU: return fqla_cpu_supported(ctx, p);
    case FQLA_BACKEND_CPU_REFERENCE: return fqla_ref_supported(ctx, p);
    case FQLA_BACKEND_CUDA: return fqla_cuda_supported(ctx, p, args);
    }
    return fqla_fail(ctx, FQLA_STATUS_INTERNAL_ERROR, "ctx: unknown backend %d", (int)ctx->backend);
}

/* The CPU backends allocate their own scratch (no workspace): the no-hidden-
 * allocation rule exists for CUDA-graph capture, which does not apply there. */
static fqla_status backend_workspace(fqla_context *ctx, const fqla_problem *p, const void *args, size_t *bytes)
{
    *bytes = 0;
    if (ctx->backend == FQLA_BACKEND_CUDA) return fqla_cuda_workspace(ctx, p, args, bytes);
    return FQLA_STATUS_SUCCESS;
}

static fqla_status backend_run(fqla_context *ctx, const fqla_problem *p, const void *args,
                               void *workspace, size_t workspace_bytes, void *stream)
{
    switch (ctx->backend) {
    case FQLA_BACKEND_CPU:
        switch (p->op) {
        case FQLA_OP_FWD: return fqla_cpu_fwd(ctx, p, (const fqla_fwd_args *)args);
        case FQLA_OP_BWD: return fqla_cpu_bwd(ctx, p, (const fqla_bwd_args *)args);
        default: return fqla_cpu_decode(ctx, p, (const fqla_decode_args *)args);
        }
    case FQLA_BACKEND_CPU_REFERENCE:
        switch (p->op) {
        case FQLA_OP_FWD: return fqla_ref_fwd(ctx, p, (const fqla_fwd_args *)args);
        case FQLA_OP_BWD: return fqla_ref_bwd(ctx, p, (const fqla_bwd_args *)args);
        default: return fqla_ref_decode(ctx, p, (const fqla_decode_args *)args);
        }
    case FQLA_BACKEND_CUDA:
        return fqla_cuda_run(ctx, p, args, workspace, workspace_bytes, stream);
    }
    return fqla_fail(ctx, FQLA_STATUS_INTERNAL_ERROR, "ctx: unknown backend %d", (int)ctx->backend);
}

/* The pipeline after the context check; ctx is the acquired context. */
static fqla_status run_supported(fqla_context *ctx, fqla_op op, const void *args, fqla_problem *p)
{
    fqla_status st = validate(ctx, op, args, p);
    if (st != FQLA_STATUS_SUCCESS) return st;
    return backend_supported(ctx, p, args);
}

static fqla_status run_workspace_size(fqla_context *ctx, fqla_op op, const void *args, size_t *bytes)
{
    fqla_problem p;
    if (!bytes) return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE, "bytes: NULL pointer");
    fqla_status st = run_supported(ctx, op, args, &p);
    if (st != FQLA_STATUS_SUCCESS) return st;
    return backend_workspace(ctx, &p, args, bytes);
}

static fqla_status run_op(fqla_context *ctx, fqla_op op, const void *args,
                          void *workspace, size_t workspace_bytes, void *stream)
{
    fqla_problem p;
    size_t needed = 0;
    fqla_status st = run_supported(ctx, op, args, &p);
    if (st != FQLA_STATUS_SUCCESS) return st;
    st = backend_workspace(ctx, &p, args, &needed);
    if (st != FQLA_STATUS_SUCCESS) return st;
    if (needed > 0) {
        if (!workspace)
            return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE, "workspace: NULL, but %zu bytes are needed", needed);
        if (workspace_bytes < needed)
            return fqla_fail(ctx, FQLA_STATUS_WORKSPACE_TOO_SMALL,
                             "workspace: %zu bytes given, %zu bytes needed", workspace_bytes, needed);
        if ((uintptr_t)workspace % FQLA_WORKSPACE_ALIGN)
            return fqla_fail(ctx, FQLA_STATUS_MISALIGNED, "workspace: pointer not %d-byte aligned",
                             FQLA_WORKSPACE_ALIGN);
    }
    /* one read for the whole call: fqla_context_set_threads may run beside it */
    if (ctx->backend != FQLA_BACKEND_CUDA) p.threads = fqla_context_threads(ctx);
    return backend_run(ctx, &p, args, workspace, workspace_bytes, stream);
}

/* The entry points hold the context for the whole call (context.c), so a
 * destroy from another thread cannot free it under a running call. */
static fqla_status op_supported(const fqla_context *handle, fqla_op op, const void *args)
{
    fqla_context *ctx;
    fqla_problem p;
    fqla_status st = fqla_context_enter(handle, &ctx);
    if (st != FQLA_STATUS_SUCCESS) return st;
    st = run_supported(ctx, op, args, &p);
    fqla_context_release(ctx);
    return st;
}

static fqla_status op_workspace_size(const fqla_context *handle, fqla_op op, const void *args, size_t *bytes)
{
    fqla_context *ctx;
    if (bytes) *bytes = 0;
    fqla_status st = fqla_context_enter(handle, &ctx);
    if (st != FQLA_STATUS_SUCCESS) return st;
    st = run_workspace_size(ctx, op, args, bytes);
    fqla_context_release(ctx);
    return st;
}

static fqla_status op_run(const fqla_context *handle, fqla_op op, const void *args,
                          void *workspace, size_t workspace_bytes, void *stream)
{
    fqla_context *ctx;
    fqla_status st = fqla_context_enter(handle, &ctx);
    if (st != FQLA_STATUS_SUCCESS) return st;
    st = run_op(ctx, op, args, workspace, workspace_bytes, stream);
    fqla_context_release(ctx);
    return st;
}

fqla_status fqla_fwd_supported(fqla_context *ctx, const fqla_fwd_args *args)
{
    return op_supported(ctx, FQLA_OP_FWD, args);
}
fqla_status fqla_fwd_workspace_size(fqla_context *ctx, const fqla_fwd_args *args, size_t *bytes)
{
    return op_workspace_size(ctx, FQLA_OP_FWD, args, bytes);
}
fqla_status fqla_fwd(fqla_context *ctx, const fqla_fwd_args *args, void *workspace, size_t workspace_bytes,
                     void *stream)
{
    return op_run(ctx, FQLA_OP_FWD, args, workspace, workspace_bytes, stream);
}

fqla_status fqla_bwd_supported(fqla_context *ctx, const fqla_bwd_args *args)
{
    return op_supported(ctx, FQLA_OP_BWD, args);
}
fqla_status fqla_bwd_workspace_size(fqla_context *ctx, const fqla_bwd_args *args, size_t *bytes)
{
    return op_workspace_size(ctx, FQLA_OP_BWD, args, bytes);
}
fqla_status fqla_bwd(fqla_context *ctx, const fqla_bwd_args *args, void *workspace, size_t workspace_bytes,
                     void *stream)
{
    return op_run(ctx, FQLA_OP_BWD, args, workspace, workspace_bytes, stream);
}

fqla_status fqla_decode_supported(fqla_context *ctx, const fqla_decode_args *args)
{
    return op_supported(ctx, FQLA_OP_DECODE, args);
}
fqla_status fqla_decode_workspace_size(fqla_context *ctx, const fqla_decode_args *args, size_t *bytes)
{
    return op_workspace_size(ctx, FQLA_OP_DECODE, args, bytes);
}
fqla_status fqla_decode(fqla_context *ctx, const fqla_decode_args *args, void *workspace, size_t workspace_bytes,
                        void *stream)
{
    return op_run(ctx, FQLA_OP_DECODE, args, workspace, workspace_bytes, stream);
}

fqla_status fqla_verify_supported(fqla_context *ctx, const fqla_decode_args *args)
{
    return op_supported(ctx, FQLA_OP_VERIFY, args);
}
fqla_status fqla_verify_workspace_size(fqla_context *ctx, const fqla_decode_args *args, size_t *bytes)
{
    return op_workspace_size(ctx, FQLA_OP_VERIFY, args, bytes);
}
fqla_status fqla_verify(fqla_context *ctx, const fqla_decode_args *args, void *workspace, size_t workspace_bytes,
                        void *stream)
{
    return op_run(ctx, FQLA_OP_VERIFY, args, workspace, workspace_bytes, stream);
}
