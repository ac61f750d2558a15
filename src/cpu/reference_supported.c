/*
 * reference_supported.c - what the fp64 reference backend covers: every head
 * dim K, V in [1, 1024] and the dtypes it can load and store (everything the
 * contract names, plus F64 for tests). Validation (src/validate.c) has already
 * checked shapes and consistency; this only rejects what it cannot run.
 */
#include "internal.h"

#define REF_MAX_HEAD_DIM 1024

static int io_dtype_ok(fqla_dtype d)
{
    return d == FQLA_DTYPE_F32 || d == FQLA_DTYPE_F16 || d == FQLA_DTYPE_BF16 || d == FQLA_DTYPE_F64;
}

static int gate_state_dtype_ok(fqla_dtype d)
{
    return d == FQLA_DTYPE_F32 || d == FQLA_DTYPE_BF16 || d == FQLA_DTYPE_F64;
}

fqla_status fqla_ref_supported(fqla_context *ctx, const fqla_problem *p)
{
    if (p->K < 1 || p->K > REF_MAX_HEAD_DIM)
        return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED,
                         "K = %lld (q, k head dim) is not supported by the CPU reference (supported: 1..%d)",
                         (long long)p->K, REF_MAX_HEAD_DIM);
    if (p->V < 1 || p->V > REF_MAX_HEAD_DIM)
        return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED,
                         "V = %lld (v head dim) is not supported by the CPU reference (supported: 1..%d)",
                         (long long)p->V, REF_MAX_HEAD_DIM);
    if (!io_dtype_ok(p->io_dtype))
        return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED,
                         "q/k/v dtype %s is not supported by the CPU reference (supported: f32, f16, bf16, f64)",
                         fqla_dtype_string(p->io_dtype));
    if (!gate_state_dtype_ok(p->gate_dtype))
        return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED,
                         "g/beta dtype %s is not supported by the CPU reference (supported: f32, bf16, f64)",
                         fqla_dtype_string(p->gate_dtype));
    if (!gate_state_dtype_ok(p->state_dtype))
        return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED,
                         "%s dtype %s is not supported by the CPU reference (supported: f32, bf16, f64)",
                         (p->op == FQLA_OP_DECODE || p->op == FQLA_OP_VERIFY) ? "state_pool" : "state",
                         fqla_dtype_string(p->state_dtype));
    return FQLA_STATUS_SUCCESS;
}
