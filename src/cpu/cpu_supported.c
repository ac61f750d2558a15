/*
 * cpu_supported.c - what the fast fp32 CPU backend covers: head dims K, V in
 * [1, 256] (every size, padded inside to a multiple of 8), q/k/v in F32, F16
 * or BF16, g/beta and states in F32 or BF16. F64 is the reference backend's
 * (FQLA_BACKEND_CPU_REFERENCE). Validation (src/validate.c) has checked
 * everything else.
 */
#include "cpu/cpu_io.h"

#define CPU_MAX_HEAD_DIM FQLA_CPU_MAX_HEAD_DIM

static const char *op_name(fqla_op op)
{
    switch (op) {
    case FQLA_OP_FWD: return "forward";
    case FQLA_OP_BWD: return "backward";
    case FQLA_OP_DECODE: return "decode";
    case FQLA_OP_VERIFY: return "verify";
    }
    return "operation";
}

static int io_dtype_ok(fqla_dtype d)
{
    return d == FQLA_DTYPE_F32 || d == FQLA_DTYPE_F16 || d == FQLA_DTYPE_BF16;
}

static int gate_state_dtype_ok(fqla_dtype d) { return d == FQLA_DTYPE_F32 || d == FQLA_DTYPE_BF16; }

fqla_status fqla_cpu_supported(fqla_context *ctx, const fqla_problem *p)
{
    const char *op = op_name(p->op);
    if (p->K < 1 || p->K > CPU_MAX_HEAD_DIM)
        return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED,
                         "K = %lld (q, k head dim) is not supported by the CPU %s (supported: 1..%d)",
                         (long long)p->K, op, CPU_MAX_HEAD_DIM);
    if (p->V < 1 || p->V > CPU_MAX_HEAD_DIM)
        return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED,
                         "V = %lld (v head dim) is not supported by the CPU %s (supported: 1..%d)",
                         (long long)p->V, op, CPU_MAX_HEAD_DIM);
    if (!io_dtype_ok(p->io_dtype))
        return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED,
                         "q/k/v dtype %s is not supported by the fp32 CPU backend (supported: f32, f16, bf16%s)",
                         fqla_dtype_string(p->io_dtype),
                         p->io_dtype == FQLA_DTYPE_F64 ? "; f64 runs on FQLA_BACKEND_CPU_REFERENCE" : "");
    if (!gate_state_dtype_ok(p->gate_dtype))
        return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED,
                         "g/beta dtype %s is not supported by the fp32 CPU backend (supported: f32, bf16%s)",
                         fqla_dtype_string(p->gate_dtype),
                         p->gate_dtype == FQLA_DTYPE_F64 ? "; f64 runs on FQLA_BACKEND_CPU_REFERENCE" : "");
    if (!gate_state_dtype_ok(p->state_dtype))
        return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED,
                         "%s dtype %s is not supported by the fp32 CPU backend (supported: f32, bf16%s)",
                         (p->op == FQLA_OP_DECODE || p->op == FQLA_OP_VERIFY) ? "state_pool" : "state",
                         fqla_dtype_string(p->state_dtype),
                         p->state_dtype == FQLA_DTYPE_F64 ? "; f64 runs on FQLA_BACKEND_CPU_REFERENCE" : "");
    /* any other argument in F64 (final_state, the gradients, A_log, ...):
     * the checks above see only q/k/v, g/beta and the state's dtype */
    if (p->f64_tensor)
        return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED,
                         "%s: dtype f64 is not supported by the fp32 CPU backend (f64 runs on "
                         "FQLA_BACKEND_CPU_REFERENCE)", p->f64_tensor);
    return FQLA_STATUS_SUCCESS;
}
