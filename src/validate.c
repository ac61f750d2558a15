/*
 * validate.c - backend-independent validation of fqla_fwd / fqla_bwd /
 * fqla_decode / fqla_verify arguments, and the fqla_problem it fills.
 *
 * Every rule of docs/testing.md's bad-input list that does not depend on the
 * backend is checked here, before anything runs; a failure returns a specific
 * status with a message naming the argument (through fqla_fail) and leaves
 * every output untouched. Decisions worth knowing:
 *
 *   - T = 0 (and cu_seqlens with zero-length sequences) is legal: validation
 *     succeeds with N computed, and the backends do nothing for empty
 *     sequences. A required tensor with T = 0 may have data == NULL.
 *   - opt.allow_neg_eigval without opt.use_beta_sigmoid is rejected: as in
 *     FLA, the factor 2 belongs to the in-kernel sigmoid; a caller that
 *     computes beta itself passes beta in [0, 2] directly.
 *   - A_log / dt_bias given without use_gate_in_kernel are rejected (they
 *     would be silently ignored), as are step_states / step_slots for decode.
 *   - g and beta must share one dtype (fqla_problem has one gate_dtype).
 *   - fqla_bwd with none of dq, dk, dv, dg, dbeta and with d_initial_state
 *     computes d_initial_state alone (fqla_problem.dh0_only); dA_log and
 *     ddt_bias must then be absent. Some of the five given and some not is
 *     an error naming the first absent one.
 *   - dtype sets: q, k, v, o (and d_o, dq, dk, dv) one dtype of F32, F16,
 *     BF16, F64; g, beta, states, pool F32, BF16 or F64; A_log, dt_bias and
 *     the fp32 gradients (dg, dbeta, dA_log, ddt_bias, d_initial_state,
 *     d_final_state) F32 or F64; cu_seqlens, slots, step_slots I32 or I64.
 *     Which of these a backend runs is its supported() check (F64 is for the
 *     reference backend).
 *   - Values are read only where they are host memory: all tensors when
 *     host_readable (CPU backends), otherwise only cu_seqlens_host and
 *     slots_host. When both a host copy and a readable tensor exist they
 *     must agree.
 *   - Slots: slot >= P is an error; two sequences sharing a slot are an
 *     error; for verify, every non-negative value of slots and step_slots
 *     together must be distinct (a step slot never overwrites an entry that
 *     another sequence reads, or that another step writes).
 *   - Sizes: besides each tensor's own element count and byte span, the
 *     products B*T*HV*max(K,V), N*HV*K*V and (B*ceil(T/64) + N)*HV*K*V, in
 *     bytes of 8, must fit in int64, so backends can size workspaces with
 *     plain int64 arithmetic.
 *   - Alignment (host_readable == 0 only): the data pointers of q, k, v, o
 *     (bwd: also d_o, dq, dk, dv) and their strides of dimensions longer than
 *     1, in bytes, are multiples of 16 (FQLA_STATUS_MISALIGNED).
 */
#include "validate_tensor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TRY FQLA_VT_TRY

/* The inputs every operation shares. */
typedef struct common_in {
    const fqla_tensor *q, *k, *v, *g, *beta, *A_log, *dt_bias;
    const fqla_options *opt;
    /* forward and backward only (seq_prologue) */
    const fqla_tensor *cu, *h0;
    const int64_t *cu_host;
} common_in;

static int64_t read_int(const fqla_tensor *t, int64_t i)
{
    if (t->dtype == FQLA_DTYPE_I32) return ((const int32_t *)t->data)[i * t->strides[t->ndim - 1]];
    return ((const int64_t *)t->data)[i * t->strides[t->ndim - 1]];
}

/* Options that do not need the shapes; scale is resolved later with K. */
static fqla_status check_options(fqla_context *ctx, const fqla_options *o, fqla_problem *p)
{
    if (isnan(o->scale) || isinf(o->scale))
        return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE, "opt.scale = %g is not finite", o->scale);
    if (o->scale < 0)
        return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE,
                         "opt.scale = %g is negative (it must be > 0, or FQLA_SCALE_DEFAULT (0) for 1/sqrt(K))",
                         o->scale);
    if (o->allow_neg_eigval && !o->use_beta_sigmoid)
        return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE,
                         "opt.allow_neg_eigval needs opt.use_beta_sigmoid (it doubles the in-kernel sigmoid; pass beta in [0, 2] yourself otherwise)");
    /* flags normalised to 0 / 1 so backends may compare them */
    p->opt.scale = o->scale;
    p->opt.use_qk_l2norm = o->use_qk_l2norm != 0;
    p->opt.use_gate_in_kernel = o->use_gate_in_kernel != 0;
    p->opt.use_beta_sigmoid = o->use_beta_sigmoid != 0;
    p->opt.allow_neg_eigval = o->allow_neg_eigval != 0;
    p->opt.state_v_first = o->state_v_first != 0;
    return FQLA_STATUS_SUCCESS;
}

/* q, k, v, g, beta, A_log, dt_bias: sets B, T, H, HV, K, V, group and the
 * dtypes. zero_dim is 1 where T = 0 is allowed (fwd/bwd), -1 otherwise. */
static fqla_status check_common(fqla_context *ctx, fqla_vt_list *L, const common_in *in,
                                int zero_dim, fqla_problem *p)
{
    TRY(check_options(ctx, in->opt, p));

    TRY(fqla_vt_required(ctx, "q", in->q, 4, zero_dim));
    TRY(fqla_vt_add(ctx, L, "q", in->q, 4, "[B, T, H, K]", zero_dim, 0));
    TRY(fqla_vt_dtype(ctx, "q", in->q, FQLA_VT_IO, "F32, F16, BF16 or F64"));
    p->B = in->q->shape[0];
    p->T = in->q->shape[1];
    p->H = in->q->shape[2];
    p->K = in->q->shape[3];
    p->io_dtype = in->q->dtype;

    TRY(fqla_vt_required(ctx, "k", in->k, 4, zero_dim));
    TRY(fqla_vt_add(ctx, L, "k", in->k, 4, "[B, T, H, K]", zero_dim, 0));
    TRY(fqla_vt_same_dtype(ctx, "k", in->k, "q", in->q));
    TRY(fqla_vt_dim(ctx, "k", in->k, 0, p->B, "q has B"));
    TRY(fqla_vt_dim(ctx, "k", in->k, 1, p->T, "q has T"));
    TRY(fqla_vt_dim(ctx, "k", in->k, 2, p->H, "q has H"));
    TRY(fqla_vt_dim(ctx, "k", in->k, 3, p->K, "q has K"));

    TRY(fqla_vt_required(ctx, "v", in->v, 4, zero_dim));
    TRY(fqla_vt_add(ctx, L, "v", in->v, 4, "[B, T, HV, V]", zero_dim, 0));
    TRY(fqla_vt_same_dtype(ctx, "v", in->v, "q", in->q));
    TRY(fqla_vt_dim(ctx, "v", in->v, 0, p->B, "q has B"));
    TRY(fqla_vt_dim(ctx, "v", in->v, 1, p->T, "q has T"));
    p->HV = in->v->shape[2];
    p->V = in->v->shape[3];
    if (p->HV % p->H != 0)
        return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE,
                         "v: HV = shape[2] = %lld is not a multiple of H = %lld (q/k heads)",
                         (long long)p->HV, (long long)p->H);
    p->group = p->HV / p->H;

    TRY(fqla_vt_required(ctx, "g", in->g, 3, zero_dim));
    TRY(fqla_vt_add(ctx, L, "g", in->g, 3, "[B, T, HV]", zero_dim, 0));
    TRY(fqla_vt_dtype(ctx, "g", in->g, FQLA_VT_GATE, "F32, BF16 or F64"));
    TRY(fqla_vt_dim(ctx, "g", in->g, 0, p->B, "q has B"));
    TRY(fqla_vt_dim(ctx, "g", in->g, 1, p->T, "q has T"));
    TRY(fqla_vt_dim(ctx, "g", in->g, 2, p->HV, "v has HV"));
    p->gate_dtype = in->g->dtype;

    TRY(fqla_vt_required(ctx, "beta", in->beta, 3, zero_dim));
    TRY(fqla_vt_add(ctx, L, "beta", in->beta, 3, "[B, T, HV]", zero_dim, 0));
    TRY(fqla_vt_same_dtype(ctx, "beta", in->beta, "g", in->g));
    TRY(fqla_vt_dim(ctx, "beta", in->beta, 0, p->B, "q has B"));
    TRY(fqla_vt_dim(ctx, "beta", in->beta, 1, p->T, "q has T"));
    TRY(fqla_vt_dim(ctx, "beta", in->beta, 2, p->HV, "v has HV"));

    if (p->opt.use_gate_in_kernel) {
        TRY(fqla_vt_required(ctx, "A_log", in->A_log, 1, -1));
        TRY(fqla_vt_add(ctx, L, "A_log", in->A_log, 1, "[HV]", -1, 0));
        TRY(fqla_vt_dtype(ctx, "A_log", in->A_log, FQLA_VT_F32, "F32 (F64 for the reference)"));
        TRY(fqla_vt_dim(ctx, "A_log", in->A_log, 0, p->HV, "v has HV"));
        TRY(fqla_vt_required(ctx, "dt_bias", in->dt_bias, 1, -1));
        TRY(fqla_vt_add(ctx, L, "dt_bias", in->dt_bias, 1, "[HV]", -1, 0));
        TRY(fqla_vt_dtype(ctx, "dt_bias", in->dt_bias, FQLA_VT_F32, "F32 (F64 for the reference)"));
        TRY(fqla_vt_dim(ctx, "dt_bias", in->dt_bias, 0, p->HV, "v has HV"));
    } else {
        if (in->A_log->data)
            return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE,
                             "A_log: given but opt.use_gate_in_kernel is 0 (it would be ignored)");
        if (in->dt_bias->data)
            return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE,
                             "dt_bias: given but opt.use_gate_in_kernel is 0 (it would be ignored)");
    }
    p->scale = in->opt->scale == FQLA_SCALE_DEFAULT ? 1.0 / sqrt((double)p->K) : in->opt->scale;
    p->state_dtype = FQLA_DTYPE_F32;
    return FQLA_STATUS_SUCCESS;
}

/* A tensor of shape [B, T, HV, V] (or [B, T, H, K] when heads/dim say so)
 * with q's dtype: o, d_o, dq, dk, dv. */
static fqla_status check_like(fqla_context *ctx, fqla_vt_list *L, const char *name,
                              const fqla_tensor *t, const fqla_tensor *q, int64_t heads,
                              int64_t dim, int qk, int zero_dim, int output,
                              const fqla_problem *p)
{
    TRY(fqla_vt_required(ctx, name, t, 4, zero_dim));
    TRY(fqla_vt_add(ctx, L, name, t, 4, qk ? "[B, T, H, K]" : "[B, T, HV, V]", zero_dim, output));
    TRY(fqla_vt_same_dtype(ctx, name, t, "q", q));
    TRY(fqla_vt_dim(ctx, name, t, 0, p->B, "q has B"));
    TRY(fqla_vt_dim(ctx, name, t, 1, p->T, "q has T"));
    TRY(fqla_vt_dim(ctx, name, t, 2, heads, qk ? "q has H" : "v has HV"));
    TRY(fqla_vt_dim(ctx, name, t, 3, dim, qk ? "q has K" : "v has V"));
    return FQLA_STATUS_SUCCESS;
}

/* A [B, T, HV] gate-shaped tensor: dg, dbeta. */
static fqla_status check_gate_like(fqla_context *ctx, fqla_vt_list *L, const char *name,
                                   const fqla_tensor *t, int zero_dim, const fqla_problem *p)
{
    TRY(fqla_vt_required(ctx, name, t, 3, zero_dim));
    TRY(fqla_vt_add(ctx, L, name, t, 3, "[B, T, HV]", zero_dim, 1));
    TRY(fqla_vt_dtype(ctx, name, t, FQLA_VT_F32, "F32 (F64 for the reference)"));
    TRY(fqla_vt_dim(ctx, name, t, 0, p->B, "q has B"));
    TRY(fqla_vt_dim(ctx, name, t, 1, p->T, "q has T"));
    TRY(fqla_vt_dim(ctx, name, t, 2, p->HV, "v has HV"));
    return FQLA_STATUS_SUCCESS;
}

/* A [HV] per-head tensor: dA_log, ddt_bias (outputs). */
static fqla_status check_head_grad(fqla_context *ctx, fqla_vt_list *L, const char *name,
                                   const fqla_tensor *t, const fqla_problem *p)
{
    TRY(fqla_vt_required(ctx, name, t, 1, -1));
    TRY(fqla_vt_add(ctx, L, name, t, 1, "[HV]", -1, 1));
    TRY(fqla_vt_dtype(ctx, name, t, FQLA_VT_F32, "F32 (F64 for the reference)"));
    TRY(fqla_vt_dim(ctx, name, t, 0, p->HV, "v has HV"));
    return FQLA_STATUS_SUCCESS;
}

/* A state tensor [lead..., HV, K, V] ([lead..., HV, V, K] with state_v_first).
 * nlead leading dims with sizes lead[] described by lead_why[]. */
static fqla_status check_state(fqla_context *ctx, fqla_vt_list *L, const char *name,
                               const fqla_tensor *t, int nlead, const int64_t *lead,
                               const char *const *lead_why, unsigned dtypes,
                               const char *dtypes_what, int output, const fqla_problem *p)
{
    int v_first = p->opt.state_v_first;
    const char *layout;
    if (nlead == 1)
        layout = v_first ? "[N, HV, V, K]" : "[N, HV, K, V]";
    else
        layout = v_first ? "[B, T, HV, V, K]" : "[B, T, HV, K, V]";
    TRY(fqla_vt_add(ctx, L, name, t, nlead + 3, layout, -1, output));
    TRY(fqla_vt_dtype(ctx, name, t, dtypes, dtypes_what));
    for (int d = 0; d < nlead; d++)
        TRY(fqla_vt_dim(ctx, name, t, d, lead[d], lead_why[d]));
    TRY(fqla_vt_dim(ctx, name, t, nlead, p->HV, "v has HV"));
    TRY(fqla_vt_dim(ctx, name, t, nlead + 1, v_first ? p->V : p->K,
                    v_first ? "with opt.state_v_first the layout is [.., HV, V, K], and V"
                            : "the layout is [.., HV, K, V] (opt.state_v_first = 0), and K"));
    TRY(fqla_vt_dim(ctx, name, t, nlead + 2, v_first ? p->K : p->V,
                    v_first ? "with opt.state_v_first the layout is [.., HV, V, K], and K"
                            : "the layout is [.., HV, K, V] (opt.state_v_first = 0), and V"));
    return FQLA_STATUS_SUCCESS;
}

static fqla_status check_seq_state(fqla_context *ctx, fqla_vt_list *L, const char *name,
                                   const fqla_tensor *t, unsigned dtypes, const char *what,
                                   int output, const fqla_problem *p)
{
    static const char *const why[1] = {"the number of sequences N"};
    return check_state(ctx, L, name, t, 1, &p->N, why, dtypes, what, output, p);
}

/* The cu_seqlens values: start at 0, never decrease, end at most at T. get(i)
 * is either the host copy or the readable tensor. */
static fqla_status check_cu_values(fqla_context *ctx, const char *name, const int64_t *host,
                                   const fqla_tensor *t, int64_t n, int64_t T)
{
    int64_t prev = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t x = host ? host[i] : read_int(t, i);
        if (i == 0 && x != 0)
            return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE, "%s[0] = %lld but it must be 0",
                             name, (long long)x);
        if (x < prev)
            return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE,
                             "%s[%lld] = %lld < %s[%lld] = %lld (it must not decrease)", name,
                             (long long)i, (long long)x, name, (long long)(i - 1), (long long)prev);
        if (x > T)
            return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE,
                             "%s[%lld] = %lld ends past T = %lld (q: shape[1])", name,
                             (long long)i, (long long)x, (long long)T);
        prev = x;
    }
    return FQLA_STATUS_SUCCESS;
}

/* cu_seqlens / cu_seqlens_host: sets N, varlen, cu_host, cu. */
static fqla_status check_cu(fqla_context *ctx, fqla_vt_list *L, const fqla_tensor *cu,
                            const int64_t *cu_host, int host_readable, fqla_problem *p)
{
    if (!cu->data) {
        if (cu_host)
            return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE,
                             "cu_seqlens_host: given but cu_seqlens is absent (pass both)");
        p->N = p->B;
        return FQLA_STATUS_SUCCESS;
    }
    TRY(fqla_vt_add(ctx, L, "cu_seqlens", cu, 1, "[N + 1]", -1, 0));
    TRY(fqla_vt_dtype(ctx, "cu_seqlens", cu, FQLA_VT_INT, "I32 or I64"));
    if (cu->shape[0] < 2)
        return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE,
                         "cu_seqlens: shape[0] = %lld but it needs N + 1 >= 2 entries",
                         (long long)cu->shape[0]);
    if (p->B != 1)
        return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE,
                         "cu_seqlens: given with B = %lld (q: shape[0]); variable-length input is packed into B = 1",
                         (long long)p->B);
    int64_t n = cu->shape[0];
    if (cu_host) {
        TRY(check_cu_values(ctx, "cu_seqlens_host", cu_host, NULL, n, p->T));
        TRY(fqla_vt_add_host(ctx, L, "cu_seqlens_host", cu_host, n));
    }
    if (host_readable) {
        TRY(check_cu_values(ctx, "cu_seqlens", NULL, cu, n, p->T));
        for (int64_t i = 0; cu_host && i < n; i++)
            if (cu_host[i] != read_int(cu, i))
                return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE,
                                 "cu_seqlens_host[%lld] = %lld but cu_seqlens[%lld] = %lld (the copies differ)",
                                 (long long)i, (long long)cu_host[i], (long long)i,
                                 (long long)read_int(cu, i));
    }
    p->varlen = 1;
    p->N = n - 1;
    p->cu_host = cu_host;
    p->cu = host_readable ? cu : NULL;
    return FQLA_STATUS_SUCCESS;
}

/* Sizes backends compute from the problem (workspaces, chunk states) fit in
 * int64 bytes. */
static fqla_status check_products(fqla_context *ctx, const fqla_problem *p)
{
    int64_t r, chunks, kv = p->K > p->V ? p->K : p->V;
    if (!fqla_vt_mul(p->B, p->T, &r) || !fqla_vt_mul(r, p->HV, &r) || !fqla_vt_mul(r, kv, &r) ||
        !fqla_vt_mul(r, 8, &r))
        return fqla_fail(ctx, FQLA_STATUS_OVERFLOW,
                         "q, v: B * T * HV * max(K, V) * 8 bytes overflows int64 (B = %lld, T = %lld, HV = %lld, K = %lld, V = %lld)",
                         (long long)p->B, (long long)p->T, (long long)p->HV, (long long)p->K,
                         (long long)p->V);
    if (!fqla_vt_mul(p->B, p->T / 64 + 1, &chunks) || chunks > INT64_MAX - p->N ||
        !fqla_vt_mul(chunks + p->N, p->HV, &r) || !fqla_vt_mul(r, p->K, &r) ||
        !fqla_vt_mul(r, p->V, &r) || !fqla_vt_mul(r, 8, &r))
        return fqla_fail(ctx, FQLA_STATUS_OVERFLOW,
                         "q, v: the states (B * ceil(T / 64) + N) * HV * K * V * 8 bytes overflow int64 (HV = %lld, K = %lld, V = %lld)",
                         (long long)p->HV, (long long)p->K, (long long)p->V);
    return FQLA_STATUS_SUCCESS;
}

static fqla_status check_aligned(fqla_context *ctx, const char *const *names,
                                 const fqla_tensor *const *ts, int n)
{
    for (int i = 0; i < n; i++)
        TRY(fqla_vt_aligned16(ctx, names[i], ts[i]));
    return FQLA_STATUS_SUCCESS;
}

/* What the forward and the backward check first, in this order: the
 * problem, q / k / v / gates and options, cu_seqlens, initial_state. */
static fqla_status seq_prologue(fqla_context *ctx, fqla_vt_list *L, const common_in *in, fqla_op op,
                                int host_readable, fqla_problem *p)
{
    if (!p) return fqla_fail(ctx, FQLA_STATUS_INTERNAL_ERROR, "validation: NULL problem");
    memset(p, 0, sizeof *p);
    L->n = 0;
    p->op = op;
    TRY(check_common(ctx, L, in, 1, p));
    TRY(check_cu(ctx, L, in->cu, in->cu_host, host_readable, p));
    if (in->h0->data) {
        TRY(check_seq_state(ctx, L, "initial_state", in->h0, FQLA_VT_STATE, "F32, BF16 or F64", 0, p));
        p->state_dtype = in->h0->dtype;
    }
    return FQLA_STATUS_SUCCESS;
}

fqla_status fqla_validate_fwd(fqla_context *ctx, const fqla_fwd_args *a, int host_readable,
                              fqla_problem *p)
{
    fqla_vt_list L;
    common_in in;
    if (!a) return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE, "args: NULL");
    in.q = &a->q; in.k = &a->k; in.v = &a->v; in.g = &a->g; in.beta = &a->beta;
    in.A_log = &a->A_log; in.dt_bias = &a->dt_bias; in.opt = &a->opt;
    in.cu = &a->cu_seqlens; in.cu_host = a->cu_seqlens_host; in.h0 = &a->initial_state;
    TRY(seq_prologue(ctx, &L, &in, FQLA_OP_FWD, host_readable, p));
    /* the final state alone (flashqla.h): o absent, final_state given */
    p->ht_only = !a->o.data && a->final_state.data;
    if (!p->ht_only) TRY(check_like(ctx, &L, "o", &a->o, &a->q, p->HV, p->V, 0, 1, 1, p));
    if (a->final_state.data) {
        TRY(check_seq_state(ctx, &L, "final_state", &a->final_state, FQLA_VT_STATE,
                            "F32, BF16 or F64", 1, p));
        if (!a->initial_state.data) p->state_dtype = a->final_state.dtype;
    }
    TRY(check_products(ctx, p));
    if (!host_readable) {
        const char *const names[4] = {"q", "k", "v", "o"};
        const fqla_tensor *const ts[4] = {&a->q, &a->k, &a->v, &a->o};
        TRY(check_aligned(ctx, names, ts, p->ht_only ? 3 : 4));
    }
    p->f64_tensor = fqla_vt_first_f64(&L);
    return fqla_vt_no_alias(ctx, &L);
}

/* Whether a backward asks for d_initial_state alone (flashqla.h): none of
 * dq, dk, dv, dg, dbeta given and d_initial_state given. At T = 0 a full
 * backward's five may have NULL data as well (empty tensors, as frameworks
 * hand them out); there a given dA_log or ddt_bias keeps the full backward,
 * as before this mode existed. */
static int bwd_dh0_only(const fqla_bwd_args *a, const fqla_problem *p)
{
    if (a->dq.data || a->dk.data || a->dv.data || a->dg.data || a->dbeta.data) return 0;
    if (!a->d_initial_state.data) return 0;
    return p->T > 0 || !(a->dA_log.data || a->ddt_bias.data);
}

/* A full backward writes all five per-token gradients: some given and some
 * not is an error naming the first absent one (an empty one of T = 0 may
 * have NULL data, as for any required tensor). */
static fqla_status check_token_grads_given(fqla_context *ctx, const fqla_bwd_args *a)
{
    const char *const names[5] = {"dq", "dk", "dv", "dg", "dbeta"};
    const fqla_tensor *const ts[5] = {&a->dq, &a->dk, &a->dv, &a->dg, &a->dbeta};
    const int ndim[5] = {4, 4, 4, 3, 3};
    int given = 0;
    for (int i = 0; i < 5; i++)
        given |= ts[i]->data != NULL;
    for (int i = 0; i < 5; i++)
        if (given && fqla_vt_required(ctx, names[i], ts[i], ndim[i], 1) != FQLA_STATUS_SUCCESS)
            return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE,
                             "%s: data is NULL (required: dq, dk, dv, dg and dbeta are given together, "
                             "or all left absent for d_initial_state alone)", names[i]);
    return FQLA_STATUS_SUCCESS;
}

fqla_status fqla_validate_bwd(fqla_context *ctx, const fqla_bwd_args *a, int host_readable,
                              fqla_problem *p)
{
    fqla_vt_list L;
    common_in in;
    if (!a) return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE, "args: NULL");
    in.q = &a->q; in.k = &a->k; in.v = &a->v; in.g = &a->g; in.beta = &a->beta;
    in.A_log = &a->A_log; in.dt_bias = &a->dt_bias; in.opt = &a->opt;
    in.cu = &a->cu_seqlens; in.cu_host = a->cu_seqlens_host; in.h0 = &a->initial_state;
    TRY(seq_prologue(ctx, &L, &in, FQLA_OP_BWD, host_readable, p));
    TRY(check_like(ctx, &L, "d_o", &a->d_o, &a->q, p->HV, p->V, 0, 1, 0, p));
    if (a->d_final_state.data) {
        TRY(check_seq_state(ctx, &L, "d_final_state", &a->d_final_state, FQLA_VT_F32,
                            "F32 (F64 for the reference)", 0, p));
        if (!a->initial_state.data) p->state_dtype = a->d_final_state.dtype;
    }
    p->dh0_only = bwd_dh0_only(a, p);
    if (!p->dh0_only) {
        TRY(check_token_grads_given(ctx, a));
        TRY(check_like(ctx, &L, "dq", &a->dq, &a->q, p->H, p->K, 1, 1, 1, p));
        TRY(check_like(ctx, &L, "dk", &a->dk, &a->q, p->H, p->K, 1, 1, 1, p));
        TRY(check_like(ctx, &L, "dv", &a->dv, &a->q, p->HV, p->V, 0, 1, 1, p));
        TRY(check_gate_like(ctx, &L, "dg", &a->dg, 1, p));
        TRY(check_gate_like(ctx, &L, "dbeta", &a->dbeta, 1, p));
    }
    if (a->initial_state.data) {
        if (!a->d_initial_state.data)
            return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE,
                             "d_initial_state: data is NULL but initial_state is given (required then)");
        TRY(check_seq_state(ctx, &L, "d_initial_state", &a->d_initial_state, FQLA_VT_F32,
                            "F32 (F64 for the reference)", 1, p));
    } else if (a->d_initial_state.data) {
        return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE,
                         "d_initial_state: given but initial_state is absent (the forward started from zero)");
    }
    if (p->opt.use_gate_in_kernel && p->dh0_only) {
        if (a->dA_log.data)
            return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE,
                             "dA_log: given but dq, dk, dv, dg and dbeta are absent (a backward of "
                             "d_initial_state alone computes no dA_log; leave it absent)");
        if (a->ddt_bias.data)
            return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE,
                             "ddt_bias: given but dq, dk, dv, dg and dbeta are absent (a backward of "
                             "d_initial_state alone computes no ddt_bias; leave it absent)");
    } else if (p->opt.use_gate_in_kernel) {
        TRY(check_head_grad(ctx, &L, "dA_log", &a->dA_log, p));
        TRY(check_head_grad(ctx, &L, "ddt_bias", &a->ddt_bias, p));
    } else {
        if (a->dA_log.data)
            return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE,
                             "dA_log: given but opt.use_gate_in_kernel is 0");
        if (a->ddt_bias.data)
            return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE,
                             "ddt_bias: given but opt.use_gate_in_kernel is 0");
    }
    TRY(check_products(ctx, p));
    if (!host_readable) {
        const char *const names[7] = {"q", "k", "v", "d_o", "dq", "dk", "dv"};
        const fqla_tensor *const ts[7] = {&a->q, &a->k, &a->v, &a->d_o, &a->dq, &a->dk, &a->dv};
        TRY(check_aligned(ctx, names, ts, p->dh0_only ? 4 : 7));
    }
    p->f64_tensor = fqla_vt_first_f64(&L);
    return fqla_vt_no_alias(ctx, &L);
}

/* ------------------------------------------------------------------------ */
/* Decode / verify slots                                                      */

typedef struct slot_ref {
    int64_t value;
    int64_t seq;   /* b */
    int64_t step;  /* t for a step slot, -1 for slots[b] */
} slot_ref;

static int cmp_slot_ref(const void *x, const void *y)
{
    const slot_ref *a = x, *b = y;
    if (a->value != b->value) return a->value < b->value ? -1 : 1;
    if (a->seq != b->seq) return a->seq < b->seq ? -1 : 1;
    return a->step < b->step ? -1 : a->step > b->step;
}

static void describe_ref(const slot_ref *r, const char *slots_name, char *buf, size_t n)
{
    if (r->step < 0)
        snprintf(buf, n, "%s[%lld]", slots_name, (long long)r->seq);
    else
        snprintf(buf, n, "step_slots[%lld, %lld]", (long long)r->seq, (long long)r->step);
}

/* Every non-negative slot value (slots, and for verify step_slots) is < P and
 * appears once. `slots` is the host copy or NULL (then slot_t is read);
 * steps is the readable step_slots tensor or NULL. */
static fqla_status check_slot_values(fqla_context *ctx, const int64_t *slots,
                                     const fqla_tensor *slot_t, const fqla_tensor *steps,
                                     const fqla_problem *p)
{
    int64_t n = 0, cap = p->B;
    if (steps && !fqla_vt_mul(p->B, p->T + 1, &cap))
        return fqla_fail(ctx, FQLA_STATUS_OVERFLOW, "step_slots: B * (T + 1) overflows int64");
    if ((uint64_t)cap > SIZE_MAX / sizeof(slot_ref))
        return fqla_fail(ctx, FQLA_STATUS_OVERFLOW, "slots: too many to check on this host");
    slot_ref *refs = malloc((size_t)cap * sizeof *refs);
    if (!refs)
        return fqla_fail(ctx, FQLA_STATUS_ALLOC_FAILED,
                         "slots: could not allocate %lld bytes to check for duplicates",
                         (long long)cap * (long long)sizeof *refs);
    const char *sname = slots ? "slots_host" : "slots";
    fqla_status st = FQLA_STATUS_SUCCESS;
    for (int64_t b = 0; b < p->B && st == FQLA_STATUS_SUCCESS; b++) {
        int64_t s = slots ? slots[b] : read_int(slot_t, b);
        if (s >= p->P)
            st = fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE,
                           "%s[%lld] = %lld but state_pool has P = %lld entries", sname,
                           (long long)b, (long long)s, (long long)p->P);
        else if (s >= 0) {
            refs[n].value = s; refs[n].seq = b; refs[n].step = -1; n++;
        }
        for (int64_t t = 0; steps && t < p->T && st == FQLA_STATUS_SUCCESS; t++) {
            int64_t i[2] = {b, t};
            int64_t off = fqla_offset(steps, i);
            int64_t x = steps->dtype == FQLA_DTYPE_I32 ? ((const int32_t *)steps->data)[off]
                                                       : ((const int64_t *)steps->data)[off];
            if (x >= p->P)
                st = fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE,
                               "step_slots[%lld, %lld] = %lld but state_pool has P = %lld entries",
                               (long long)b, (long long)t, (long long)x, (long long)p->P);
            else if (x >= 0) {
                refs[n].value = x; refs[n].seq = b; refs[n].step = t; n++;
            }
        }
    }
    if (st == FQLA_STATUS_SUCCESS) {
        qsort(refs, (size_t)n, sizeof *refs, cmp_slot_ref);
        for (int64_t i = 1; i < n; i++) {
            if (refs[i].value != refs[i - 1].value) continue;
            char x[64], y[64];
            describe_ref(&refs[i - 1], sname, x, sizeof x);
            describe_ref(&refs[i], sname, y, sizeof y);
            st = fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE,
                           "%s = %s = %lld: each state_pool entry may be used by one sequence or step only",
                           x, y, (long long)refs[i].value);
            break;
        }
    }
    free(refs);
    return st;
}

fqla_status fqla_validate_decode(fqla_context *ctx, const fqla_decode_args *a, int verify,
                                 int host_readable, fqla_problem *p)
{
    fqla_vt_list L;
    common_in in;
    if (!a) return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE, "args: NULL");
    if (!p) return fqla_fail(ctx, FQLA_STATUS_INTERNAL_ERROR, "validation: NULL problem");
    memset(p, 0, sizeof *p);
    L.n = 0;
    p->op = verify ? FQLA_OP_VERIFY : FQLA_OP_DECODE;
    in.q = &a->q; in.k = &a->k; in.v = &a->v; in.g = &a->g; in.beta = &a->beta;
    in.A_log = &a->A_log; in.dt_bias = &a->dt_bias; in.opt = &a->opt;
    TRY(check_common(ctx, &L, &in, -1, p));
    if (!verify && p->T != 1)
        return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE,
                         "q: shape[1] = T = %lld but fqla_decode takes one token per sequence (T = 1; fqla_verify takes several)",
                         (long long)p->T);
    p->N = p->B;

    TRY(fqla_vt_required(ctx, "state_pool", &a->state_pool, 4, -1));
    {
        /* P comes from the pool itself, so only HV, K, V are compared */
        static const char *const why[1] = {"state_pool has P"};
        p->P = a->state_pool.ndim == 4 ? a->state_pool.shape[0] : 0;
        TRY(check_state(ctx, &L, "state_pool", &a->state_pool, 1, &p->P, why, FQLA_VT_STATE,
                        "F32, BF16 or F64", 1, p));
        p->state_dtype = a->state_pool.dtype;
    }

    TRY(fqla_vt_required(ctx, "slots", &a->slots, 1, -1));
    TRY(fqla_vt_add(ctx, &L, "slots", &a->slots, 1, "[B]", -1, 0));
    TRY(fqla_vt_dtype(ctx, "slots", &a->slots, FQLA_VT_INT, "I32 or I64"));
    TRY(fqla_vt_dim(ctx, "slots", &a->slots, 0, p->B, "q has B"));

    TRY(check_like(ctx, &L, "o", &a->o, &a->q, p->HV, p->V, 0, -1, 1, p));

    const fqla_tensor *readable_steps = NULL;
    if (!verify) {
        if (a->step_states.data)
            return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE,
                             "step_states: given to fqla_decode (it is for fqla_verify only)");
        if (a->step_slots.data)
            return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE,
                             "step_slots: given to fqla_decode (it is for fqla_verify only)");
    } else if (a->step_states.data && a->step_slots.data) {
        return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE,
                         "step_states and step_slots: both given (fqla_verify writes exactly one of them)");
    } else if (a->step_states.data) {
        static const char *const why[2] = {"q has B", "q has T"};
        int64_t lead[2];
        lead[0] = p->B;
        lead[1] = p->T;
        TRY(check_state(ctx, &L, "step_states", &a->step_states, 2, lead, why, FQLA_VT_STATE,
                        "F32, BF16 or F64", 1, p));
        TRY(fqla_vt_same_dtype(ctx, "step_states", &a->step_states, "state_pool",
                               &a->state_pool));
    } else if (a->step_slots.data) {
        TRY(fqla_vt_add(ctx, &L, "step_slots", &a->step_slots, 2, "[B, T]", -1, 0));
        TRY(fqla_vt_dtype(ctx, "step_slots", &a->step_slots, FQLA_VT_INT, "I32 or I64"));
        TRY(fqla_vt_dim(ctx, "step_slots", &a->step_slots, 0, p->B, "q has B"));
        TRY(fqla_vt_dim(ctx, "step_slots", &a->step_slots, 1, p->T, "q has T"));
        if (host_readable) readable_steps = &a->step_slots;
    } else {
        return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE,
                         "step_states and step_slots: neither given (fqla_verify writes exactly one of them)");
    }

    TRY(check_products(ctx, p));
    if (!host_readable) {
        const char *const names[4] = {"q", "k", "v", "o"};
        const fqla_tensor *const ts[4] = {&a->q, &a->k, &a->v, &a->o};
        TRY(check_aligned(ctx, names, ts, 4));
    }
    if (a->slots_host) TRY(fqla_vt_add_host(ctx, &L, "slots_host", a->slots_host, p->B));
    p->f64_tensor = fqla_vt_first_f64(&L);
    TRY(fqla_vt_no_alias(ctx, &L));

    if (a->slots_host)
        TRY(check_slot_values(ctx, a->slots_host, NULL, readable_steps, p));
    if (host_readable) {
        TRY(check_slot_values(ctx, NULL, &a->slots, a->slots_host ? NULL : readable_steps, p));
        for (int64_t b = 0; a->slots_host && b < p->B; b++)
            if (a->slots_host[b] != read_int(&a->slots, b))
                return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE,
                                 "slots_host[%lld] = %lld but slots[%lld] = %lld (the copies differ)",
                                 (long long)b, (long long)a->slots_host[b], (long long)b,
                                 (long long)read_int(&a->slots, b));
    }
    return FQLA_STATUS_SUCCESS;
}

/* ------------------------------------------------------------------------ */

void fqla_seq_bounds(const fqla_problem *p, int64_t n, int64_t *batch, int64_t *start,
                     int64_t *len)
{
    if (!p->varlen) {
        *batch = n;
        *start = 0;
        *len = p->T;
        return;
    }
    int64_t s = 0, e = 0;
    if (p->cu_host) {
        s = p->cu_host[n];
        e = p->cu_host[n + 1];
    } else if (p->cu) {
        s = read_int(p->cu, n);
        e = read_int(p->cu, n + 1);
    }
    *batch = 0;
    *start = s;
    *len = e - s;
}
