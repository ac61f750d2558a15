/*
 * decode.cu - the CUDA backend's decode and verify entry points: what the
 * kernels cover (K = V in {64, 128, 256}, f32 / bf16 state storage, 16-byte
 * aligned state tiles) and the launch of the variant the route planner
 * chooses (route_plan.h: the V-slice width per warp and the K split, from
 * the number of warps the problem makes against the SM count).
 * The kernels themselves are in decode_kernel.cuh; no workspace, no
 * allocation, no synchronisation, so a call can be captured in a CUDA graph.
 */
#include "cuda/cuda_backend.h"
#include "cuda/decode_launch.cuh"
#include "cuda/route_plan.h"
#ifdef FQLA_DEV
#include "dev/dev_hooks.h" /* the developer build's launch override */
#endif

#include <string.h>

static bool dtype_is_io(fqla_dtype d) { return d == FQLA_DTYPE_F32 || d == FQLA_DTYPE_F16 || d == FQLA_DTYPE_BF16; }
static bool dtype_is_gate(fqla_dtype d) { return d == FQLA_DTYPE_F32 || d == FQLA_DTYPE_BF16; }
static bool dtype_is_index(fqla_dtype d) { return d == FQLA_DTYPE_I32 || d == FQLA_DTYPE_I64; }

/* The kernel moves the state in 16-byte vectors: the base pointer and every
 * stride above the contiguous one must keep that alignment. */
static fqla_status check_aligned(fqla_context *ctx, const fqla_tensor *t, const char *name)
{
    const size_t es = fqla_dtype_size(t->dtype);
    if (((uintptr_t)t->data) % 16 != 0)
        return fqla_fail(ctx, FQLA_STATUS_MISALIGNED,
                         "%s: the CUDA decode kernels need a 16-byte aligned pointer (got %p)", name, t->data);
    for (int d = 0; d + 1 < t->ndim; d++)
        if ((t->strides[d] * (int64_t)es) % 16 != 0)
            return fqla_fail(ctx, FQLA_STATUS_MISALIGNED,
                             "%s: stride %d is %lld elements (%lld bytes); the CUDA decode kernels need "
                             "multiples of 16 bytes", name, d, (long long)t->strides[d],
                             (long long)(t->strides[d] * (int64_t)es));
    return FQLA_STATUS_SUCCESS;
}

fqla_status fqla_cuda_decode_supported(fqla_context *ctx, const fqla_problem *p, const fqla_decode_args *a)
{
    if (p->K != p->V)
        return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED,
                         "K = %lld, V = %lld: the CUDA decode kernels need K == V (64, 128 or 256)",
                         (long long)p->K, (long long)p->V);
    if (p->K != 64 && p->K != 128 && p->K != 256)
        return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED,
                         "K = V = %lld: the CUDA decode kernels support K = V in {64, 128, 256}", (long long)p->K);
    if (p->state_dtype != FQLA_DTYPE_F32 && p->state_dtype != FQLA_DTYPE_BF16)
        return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED,
                         "state_pool: dtype %s; the CUDA decode kernels store the state as f32 or bf16",
                         fqla_dtype_string(p->state_dtype));
    if (!dtype_is_io(a->q.dtype) || !dtype_is_io(a->k.dtype) || !dtype_is_io(a->v.dtype) || !dtype_is_io(a->o.dtype))
        return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED,
                         "q/k/v/o: dtype %s; the CUDA decode kernels take f32, f16 or bf16",
                         fqla_dtype_string(a->q.dtype));
    if (!dtype_is_gate(a->g.dtype) || !dtype_is_gate(a->beta.dtype))
        return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED,
                         "g/beta: dtype %s / %s; the CUDA decode kernels take f32 or bf16",
                         fqla_dtype_string(a->g.dtype), fqla_dtype_string(a->beta.dtype));
    if (p->opt.use_gate_in_kernel && (!dtype_is_gate(a->A_log.dtype) || !dtype_is_gate(a->dt_bias.dtype)))
        return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED, "A_log/dt_bias: the CUDA decode kernels take f32 or bf16");
    if (!dtype_is_index(a->slots.dtype))
        return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED, "slots: dtype %s; need i32 or i64",
                         fqla_dtype_string(a->slots.dtype));
    if (p->op == FQLA_OP_VERIFY && a->step_slots.data && !dtype_is_index(a->step_slots.dtype))
        return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED, "step_slots: dtype %s; need i32 or i64",
                         fqla_dtype_string(a->step_slots.dtype));
    fqla_status st = check_aligned(ctx, &a->state_pool, "state_pool");
    if (st != FQLA_STATUS_SUCCESS) return st;
    if (p->op == FQLA_OP_VERIFY && a->step_states.data) {
        st = check_aligned(ctx, &a->step_states, "step_states");
        if (st != FQLA_STATUS_SUCCESS) return st;
    }
    return FQLA_STATUS_SUCCESS;
}

fqla_status fqla_cuda_decode_workspace(fqla_context *ctx, const fqla_problem *p, const fqla_decode_args *a, size_t *bytes)
{
    *bytes = 0;
    return fqla_cuda_decode_supported(ctx, p, a);
}

static int64_t stride_or0(const fqla_tensor *t, int d) { return t->data && d < t->ndim ? t->strides[d] : 0; }

fqla_status fqla_cuda_decode_run(fqla_context *ctx, const fqla_problem *p, const fqla_decode_args *a,
                                 void *workspace, size_t workspace_bytes, cudaStream_t stream)
{
    (void)workspace; (void)workspace_bytes;
    fqla_status st = fqla_cuda_decode_supported(ctx, p, a);
    if (st != FQLA_STATUS_SUCCESS) return st;

    const bool verify = p->op == FQLA_OP_VERIFY;
    const bool multi = p->T > 1;
    fqla_route_device d;
    d.sm_count = ctx->info.sm_count;
    d.cc_major = ctx->info.cc_major;
    d.cc_minor = ctx->info.cc_minor;
    fqla_decode_shape shape;
    shape.B = p->B;
    shape.HV = p->HV;
    shape.K = p->K;
    shape.V = p->V;
    shape.state_esize = (int)fqla_dtype_size(p->state_dtype);
    shape.v_first = p->opt.state_v_first != 0;
    fqla_decode_route r;
    fqla_decode_plan(&d, &shape, &r);
#ifdef FQLA_DEV
    fqla_dev_decode_route(p, ctx->info.sm_count, &r);
#endif
    const int wv = r.wv, ks = r.ks;

    DecodeParams k;
    memset(&k, 0, sizeof k);
    k.q = a->q.data; k.k = a->k.data; k.v = a->v.data; k.g = a->g.data; k.beta = a->beta.data;
    k.A_log = a->A_log.data; k.dt_bias = a->dt_bias.data;
    k.slots = a->slots.data; k.step_slots = a->step_slots.data;
    k.pool = a->state_pool.data; k.o = a->o.data; k.step_states = a->step_states.data;
    k.q_s0 = a->q.strides[0]; k.q_s1 = a->q.strides[1]; k.q_s2 = a->q.strides[2];
    k.k_s0 = a->k.strides[0]; k.k_s1 = a->k.strides[1]; k.k_s2 = a->k.strides[2];
    k.v_s0 = a->v.strides[0]; k.v_s1 = a->v.strides[1]; k.v_s2 = a->v.strides[2];
    k.o_s0 = a->o.strides[0]; k.o_s1 = a->o.strides[1]; k.o_s2 = a->o.strides[2];
    k.g_s0 = a->g.strides[0]; k.g_s1 = a->g.strides[1];
    k.b_s0 = a->beta.strides[0]; k.b_s1 = a->beta.strides[1];
    k.alog_s = stride_or0(&a->A_log, 0); k.dtb_s = stride_or0(&a->dt_bias, 0);
    k.slot_s = a->slots.strides[0];
    k.st_s0 = stride_or0(&a->step_slots, 0); k.st_s1 = stride_or0(&a->step_slots, 1);
    k.pool_s0 = a->state_pool.strides[0]; k.pool_s1 = a->state_pool.strides[1];
    k.pool_row = a->state_pool.strides[2];
    k.ss_s0 = stride_or0(&a->step_states, 0); k.ss_s1 = stride_or0(&a->step_states, 1);
    k.ss_s2 = stride_or0(&a->step_states, 2); k.ss_row = stride_or0(&a->step_states, 3);
    k.B = p->B; k.T = p->T; k.HV = p->HV; k.P = p->P; k.group = p->group;
    k.ngroups = (int)(p->V / wv);
    k.total_warps = p->B * p->HV * k.ngroups * ks;
    k.io_dt = (int)a->q.dtype; k.g_dt = (int)a->g.dtype; k.beta_dt = (int)a->beta.dtype;
    k.alog_dt = a->A_log.data ? (int)a->A_log.dtype : DEC_F32;
    k.dtb_dt = a->dt_bias.data ? (int)a->dt_bias.dtype : DEC_F32;
    k.slot_dt = (int)a->slots.dtype;
    k.step_slot_dt = a->step_slots.data ? (int)a->step_slots.dtype : DEC_I64;
    k.use_l2norm = p->opt.use_qk_l2norm != 0;
    k.use_gate = p->opt.use_gate_in_kernel != 0;
    k.use_beta_sigmoid = p->opt.use_beta_sigmoid != 0;
    k.allow_neg_eigval = p->opt.allow_neg_eigval != 0;
    k.write_mode = !verify ? DEC_WRITE_POOL : (a->step_states.data ? DEC_WRITE_STEP_STATES : DEC_WRITE_STEP_SLOTS);
    k.streaming = r.streaming;
    k.scale = (float)p->scale;
    k.pdl = r.pdl;
    k.prefetch = k.pdl && r.prefetch;

    const bool vf = p->opt.state_v_first != 0;
    cudaError_t err = p->state_dtype == FQLA_DTYPE_F32
        ? fqla_decode_launch_f32(k, (int)p->K, wv, ks, vf, multi, r.warps, stream)
        : fqla_decode_launch_bf16(k, (int)p->K, wv, ks, vf, multi, r.warps, stream);
    return fqla_cuda_check(ctx, err, verify ? "verify kernel launch" : "decode kernel launch");
}
