/*
 * cpu_fast_util.h - helpers shared by the fast CPU backend's tests
 * (test_cpu_fast.c, test_decode_chain.c, test_determinism.c): a problem
 * description, fresh random inputs for it, runs of fqla_fwd / fqla_bwd on any
 * context through the public API, and per-(sequence, head) error metrics.
 *
 * Inputs are drawn in double and rounded once to the storage dtype of the
 * case; the CPU backend gets them in that dtype, the fp64 reference
 * (FQLA_BACKEND_CPU_REFERENCE) gets the very same rounded values as F64
 * tensors, so the comparison measures the backend and nothing else.
 * Every output buffer is poisoned with NaN before a run.
 */
#ifndef FQLA_TEST_CPU_FAST_UTIL_H
#define FQLA_TEST_CPU_FAST_UTIL_H

#include "common/check.h"
#include "flashqla.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---- storage: a flat buffer of one dtype ---- */

typedef struct tbuf {
    void *data;
    fqla_dtype dtype;
    int64_t n;
} tbuf;

static inline uint16_t tu_f32_to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float tu_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* IEEE half, round to nearest even (normal and subnormal range). */
static inline uint16_t tu_f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) {
        float v = fabsf(f) * 16777216.0f;
        float r = nearbyintf(v);
        return (uint16_t)(sign | (uint16_t)r);
    }
    uint32_t rounded = a + 0xfffu + ((a >> 13) & 1u);
    return (uint16_t)(sign | (uint16_t)(((rounded >> 13) - (112u << 10)) & 0x7fffu));
}

static inline float tu_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    float x;
    if (e == 0x1f) {
        uint32_t u = sign | 0x7f800000u | (m << 13);
        memcpy(&x, &u, sizeof x);
        return x;
    }
    if (e == 0) {
        x = (float)m * 5.9604644775390625e-8f;
        return sign ? -x : x;
    }
    uint32_t u = sign | ((e + 112u) << 23) | (m << 13);
    memcpy(&x, &u, sizeof x);
    return x;
}

static inline size_t tu_size(fqla_dtype d)
{
    return d == FQLA_DTYPE_F64 || d == FQLA_DTYPE_I64 ? 8 : (d == FQLA_DTYPE_F32 || d == FQLA_DTYPE_I32) ? 4 : 2;
}

static inline double tb_get(const tbuf *b, int64_t i)
{
    switch (b->dtype) {
    case FQLA_DTYPE_F64: return ((const double *)b->data)[i];
    case FQLA_DTYPE_F32: return ((const float *)b->data)[i];
    case FQLA_DTYPE_BF16: return tu_bf16_to_f32(((const uint16_t *)b->data)[i]);
    case FQLA_DTYPE_F16: return tu_f16_to_f32(((const uint16_t *)b->data)[i]);
    case FQLA_DTYPE_I32: return ((const int32_t *)b->data)[i];
    case FQLA_DTYPE_I64: return (double)((const int64_t *)b->data)[i];
    }
    return NAN;
}

static inline void tb_put(tbuf *b, int64_t i, double x)
{
    switch (b->dtype) {
    case FQLA_DTYPE_F64: ((double *)b->data)[i] = x; return;
    case FQLA_DTYPE_F32: ((float *)b->data)[i] = (float)x; return;
    case FQLA_DTYPE_BF16: ((uint16_t *)b->data)[i] = tu_f32_to_bf16((float)x); return;
    case FQLA_DTYPE_F16: ((uint16_t *)b->data)[i] = tu_f32_to_f16((float)x); return;
    case FQLA_DTYPE_I32: ((int32_t *)b->data)[i] = (int32_t)x; return;
    case FQLA_DTYPE_I64: ((int64_t *)b->data)[i] = (int64_t)x; return;
    }
}

/* A buffer of n elements; with x, filled from x (rounded to dtype), else
 * poisoned with NaN. */
static inline tbuf tb_make(fqla_dtype dtype, int64_t n, const double *x)
{
    tbuf b;
    b.dtype = dtype;
    b.n = n;
    b.data = malloc((size_t)(n > 0 ? n : 1) * tu_size(dtype));
    for (int64_t i = 0; i < n; i++)
        tb_put(&b, i, x ? x[i] : NAN);
    return b;
}

static inline void tb_free(tbuf *b)
{
    free(b->data);
    b->data = NULL;
}

/* x rounded through the dtype, in place. */
static inline void tu_round(fqla_dtype dtype, double *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        if (dtype == FQLA_DTYPE_F32) x[i] = (float)x[i];
        else if (dtype == FQLA_DTYPE_BF16) x[i] = tu_bf16_to_f32(tu_f32_to_bf16((float)x[i]));
        else if (dtype == FQLA_DTYPE_F16) x[i] = tu_f16_to_f32(tu_f32_to_f16((float)x[i]));
    }
}

static inline double *tu_doubles(int64_t n)
{
    return (double *)calloc((size_t)(n > 0 ? n : 1), sizeof(double));
}

/* A copy of the buffer as doubles (caller frees). */
static inline double *tb_to_doubles(const tbuf *b)
{
    double *x = tu_doubles(b->n);
    for (int64_t i = 0; i < b->n; i++)
        x[i] = tb_get(b, i);
    return x;
}

static inline fqla_tensor tu_tensor(tbuf *b, int ndim, int64_t d0, int64_t d1, int64_t d2, int64_t d3,
                                    int64_t d4)
{
    int64_t shape[5] = {d0, d1, d2, d3, d4};
    return fqla_tensor_contiguous(b->data, b->dtype, ndim, shape);
}

/* ---- the problem ---- */

enum { GATE_RANDOM, GATE_ZERO, GATE_STRONG, GATE_NEGINF, GATE_SPREAD };
enum { BETA_RANDOM, BETA_ZERO, BETA_ONE, BETA_NEAR2 };

typedef struct gdn_case {
    int64_t B, T, H, HV, K, V;
    int ncu;                 /* entries of cu (0: no cu_seqlens) */
    int64_t cu[8];
    fqla_dtype io, gate, state;
    int gate_mode, beta_mode;
    int k_near_q;            /* draw k = q + noise/2, so that q.k is far from 0 */
    int raw_keys;            /* q, k drawn N(0, 1) without the in-kernel l2norm: ||k||^2 ~ K */
    int h0, final, dht;      /* initial state given; final state wanted; d_final_state given */
    fqla_options opt;
} gdn_case;

/* A case with defaults: fp32 everywhere, random gates and beta. */
static inline gdn_case gdn_case_make(int64_t B, int64_t T, int64_t H, int64_t HV, int64_t K, int64_t V)
{
    gdn_case c;
    memset(&c, 0, sizeof c);
    c.B = B;
    c.T = T;
    c.H = H;
    c.HV = HV;
    c.K = K;
    c.V = V;
    c.io = c.gate = c.state = FQLA_DTYPE_F32;
    c.opt.scale = FQLA_SCALE_DEFAULT;
    return c;
}

static inline void gdn_set_cu(gdn_case *c, int n, const int64_t *cu)
{
    c->ncu = n;
    for (int i = 0; i < n; i++)
        c->cu[i] = cu[i];
}

static inline int64_t gdn_N(const gdn_case *c) { return c->ncu ? c->ncu - 1 : c->B; }

/* Sequence n: batch row and token range. */
static inline void gdn_bounds(const gdn_case *c, int64_t n, int64_t *b, int64_t *t0, int64_t *t1)
{
    if (c->ncu) {
        *b = 0;
        *t0 = c->cu[n];
        *t1 = c->cu[n + 1];
    } else {
        *b = n;
        *t0 = 0;
        *t1 = c->T;
    }
}

/* The inputs as doubles, already rounded to the case's storage dtypes. */
typedef struct gdn_data {
    int64_t nq, nv, ng, ns;
    double *q, *k, *v, *g, *beta, *A_log, *dt_bias, *h0, *d_o, *dht;
} gdn_data;

static inline double tu_uniform(double lo, double hi) { return lo + (hi - lo) * check_uniform(); }

static inline gdn_data gdn_data_make(const gdn_case *c)
{
    gdn_data d;
    int64_t N = gdn_N(c);
    d.nq = c->B * c->T * c->H * c->K;
    d.nv = c->B * c->T * c->HV * c->V;
    d.ng = c->B * c->T * c->HV;
    d.ns = N * c->HV * c->K * c->V;
    d.q = tu_doubles(d.nq);
    d.k = tu_doubles(d.nq);
    d.v = tu_doubles(d.nv);
    d.g = tu_doubles(d.ng);
    d.beta = tu_doubles(d.ng);
    d.A_log = tu_doubles(c->HV);
    d.dt_bias = tu_doubles(c->HV);
    d.h0 = tu_doubles(d.ns);
    d.d_o = tu_doubles(d.nv);
    d.dht = tu_doubles(d.ns);
    /* without the in-kernel l2norm, ||k|| ~ 1 keeps the recurrence contractive */
    double qk_scale = c->opt.use_qk_l2norm || c->raw_keys ? 1.0 : 1.0 / sqrt((double)c->K);
    for (int64_t i = 0; i < d.nq; i++) {
        d.q[i] = qk_scale * check_normal();
        d.k[i] = qk_scale * check_normal();
        if (c->k_near_q) d.k[i] = d.q[i] + 0.5 * d.k[i];
    }
    for (int64_t i = 0; i < d.nv; i++) {
        d.v[i] = check_normal();
        d.d_o[i] = check_normal();
    }
    for (int64_t h = 0; h < c->HV; h++) {
        d.A_log[h] = tu_uniform(-1.0, 1.0);
        d.dt_bias[h] = 0.5 * check_normal();
    }
    int64_t inf_t = c->T / 2 + 3 < c->T ? c->T / 2 + 3 : c->T - 1;
    for (int64_t i = 0; i < d.ng; i++) {
        int64_t h = i % c->HV, t = (i / c->HV) % c->T;
        double g;
        if (c->opt.use_gate_in_kernel) {
            g = check_normal(); /* raw a */
        } else {
            switch (c->gate_mode) {
            case GATE_ZERO: g = 0; break;
            case GATE_STRONG: g = -20.0 - check_uniform(); break; /* 64 tokens: about -1300 */
            case GATE_SPREAD: g = -(16.0 * (double)h / (double)(c->HV > 1 ? c->HV - 1 : 1)) * check_uniform(); break;
            case GATE_NEGINF: g = t == inf_t ? -INFINITY : -tu_uniform(0.01, 0.3); break;
            default: g = -tu_uniform(0.01, 0.3); break;
            }
        }
        d.g[i] = g;
        double bt;
        switch (c->beta_mode) {
        case BETA_ZERO: bt = c->opt.use_beta_sigmoid ? -40.0 : 0.0; break;
        case BETA_ONE: bt = c->opt.use_beta_sigmoid ? 40.0 : 1.0; break;
        case BETA_NEAR2: bt = 12.0; break; /* 2 sigmoid(12) = 2 - 1.2e-5 with allow_neg_eigval */
        default: bt = c->opt.use_beta_sigmoid ? check_normal() : check_uniform(); break;
        }
        d.beta[i] = bt;
    }
    for (int64_t i = 0; i < d.ns; i++) {
        d.h0[i] = 0.3 * check_normal();
        d.dht[i] = 0.3 * check_normal();
    }
    tu_round(c->io, d.q, d.nq);
    tu_round(c->io, d.k, d.nq);
    tu_round(c->io, d.v, d.nv);
    tu_round(c->io, d.d_o, d.nv);
    tu_round(c->gate, d.g, d.ng);
    tu_round(c->gate, d.beta, d.ng);
    tu_round(FQLA_DTYPE_F32, d.A_log, c->HV);
    tu_round(FQLA_DTYPE_F32, d.dt_bias, c->HV);
    tu_round(c->state, d.h0, d.ns);
    tu_round(FQLA_DTYPE_F32, d.dht, d.ns);
    return d;
}

static inline void gdn_data_free(gdn_data *d)
{
    free(d->q); free(d->k); free(d->v); free(d->g); free(d->beta); free(d->A_log);
    free(d->dt_bias); free(d->h0); free(d->d_o); free(d->dht);
}

/* ---- runs ---- */

/* Outputs as doubles (NULL where not produced). */
typedef struct gdn_out {
    fqla_status status;
    double *o, *fs;
    double *dq, *dk, *dv, *dg, *dbeta, *dh0, *dA_log, *ddt_bias;
} gdn_out;

static inline void gdn_out_free(gdn_out *o)
{
    free(o->o); free(o->fs); free(o->dq); free(o->dk); free(o->dv); free(o->dg);
    free(o->dbeta); free(o->dh0); free(o->dA_log); free(o->ddt_bias);
    memset(o, 0, sizeof *o);
}

/* The input tensors of a case: dtypes of the case, or all F64 (ref). */
typedef struct gdn_tensors {
    tbuf q, k, v, g, beta, A_log, dt_bias, h0, cu, d_o, dht;
} gdn_tensors;

static inline gdn_tensors gdn_tensors_make(const gdn_case *c, const gdn_data *d, int ref)
{
    gdn_tensors t;
    fqla_dtype io = ref ? FQLA_DTYPE_F64 : c->io, gt = ref ? FQLA_DTYPE_F64 : c->gate;
    fqla_dtype st = ref ? FQLA_DTYPE_F64 : c->state, f32 = ref ? FQLA_DTYPE_F64 : FQLA_DTYPE_F32;
    double cu[8];
    for (int i = 0; i < c->ncu; i++)
        cu[i] = (double)c->cu[i];
    t.q = tb_make(io, d->nq, d->q);
    t.k = tb_make(io, d->nq, d->k);
    t.v = tb_make(io, d->nv, d->v);
    t.g = tb_make(gt, d->ng, d->g);
    t.beta = tb_make(gt, d->ng, d->beta);
    t.A_log = tb_make(f32, c->HV, d->A_log);
    t.dt_bias = tb_make(f32, c->HV, d->dt_bias);
    t.h0 = tb_make(st, d->ns, d->h0);
    t.cu = tb_make(FQLA_DTYPE_I64, c->ncu, cu);
    t.d_o = tb_make(io, d->nv, d->d_o);
    t.dht = tb_make(f32, d->ns, d->dht);
    return t;
}

static inline void gdn_tensors_free(gdn_tensors *t)
{
    tb_free(&t->q); tb_free(&t->k); tb_free(&t->v); tb_free(&t->g); tb_free(&t->beta);
    tb_free(&t->A_log); tb_free(&t->dt_bias); tb_free(&t->h0); tb_free(&t->cu);
    tb_free(&t->d_o); tb_free(&t->dht);
}

/* Fills the forward inputs of args from t (shapes of c). */
static inline void gdn_fwd_inputs(const gdn_case *c, gdn_tensors *t, fqla_fwd_args *a)
{
    int64_t N = gdn_N(c);
    fqla_fwd_args_init(a);
    a->q = tu_tensor(&t->q, 4, c->B, c->T, c->H, c->K, 0);
    a->k = tu_tensor(&t->k, 4, c->B, c->T, c->H, c->K, 0);
    a->v = tu_tensor(&t->v, 4, c->B, c->T, c->HV, c->V, 0);
    a->g = tu_tensor(&t->g, 3, c->B, c->T, c->HV, 0, 0);
    a->beta = tu_tensor(&t->beta, 3, c->B, c->T, c->HV, 0, 0);
    if (c->opt.use_gate_in_kernel) {
        a->A_log = tu_tensor(&t->A_log, 1, c->HV, 0, 0, 0, 0);
        a->dt_bias = tu_tensor(&t->dt_bias, 1, c->HV, 0, 0, 0, 0);
    }
    if (c->h0)
        a->initial_state = c->opt.state_v_first ? tu_tensor(&t->h0, 4, N, c->HV, c->V, c->K, 0)
                                                : tu_tensor(&t->h0, 4, N, c->HV, c->K, c->V, 0);
    if (c->ncu)
        a->cu_seqlens = tu_tensor(&t->cu, 1, c->ncu, 0, 0, 0, 0);
    a->opt = c->opt;
}

/* Runs the forward of case c on ctx (ref: F64 tensors). */
static inline gdn_out gdn_run_fwd(fqla_context *ctx, const gdn_case *c, const gdn_data *d, int ref)
{
    gdn_out out;
    fqla_fwd_args a;
    int64_t N = gdn_N(c);
    memset(&out, 0, sizeof out);
    gdn_tensors t = gdn_tensors_make(c, d, ref);
    gdn_fwd_inputs(c, &t, &a);
    tbuf o = tb_make(ref ? FQLA_DTYPE_F64 : c->io, d->nv, NULL);
    tbuf fs = tb_make(ref ? FQLA_DTYPE_F64 : c->state, d->ns, NULL);
    a.o = tu_tensor(&o, 4, c->B, c->T, c->HV, c->V, 0);
    if (c->final)
        a.final_state = c->opt.state_v_first ? tu_tensor(&fs, 4, N, c->HV, c->V, c->K, 0)
                                             : tu_tensor(&fs, 4, N, c->HV, c->K, c->V, 0);
    out.status = fqla_fwd(ctx, &a, NULL, 0, NULL);
    out.o = tb_to_doubles(&o);
    if (c->final)
        out.fs = tb_to_doubles(&fs);
    tb_free(&o);
    tb_free(&fs);
    gdn_tensors_free(&t);
    return out;
}

/* The backward's inputs of case c: the forward's (f), d_o and, where the
 * case has one, d_final_state; no gradient outputs yet. */
static inline void gdn_bwd_inputs(const gdn_case *c, gdn_tensors *t, const fqla_fwd_args *f, fqla_bwd_args *a)
{
    int64_t N = gdn_N(c);
    fqla_bwd_args_init(a);
    a->q = f->q; a->k = f->k; a->v = f->v; a->g = f->g; a->beta = f->beta;
    a->A_log = f->A_log; a->dt_bias = f->dt_bias; a->initial_state = f->initial_state;
    a->cu_seqlens = f->cu_seqlens;
    a->opt = c->opt;
    a->d_o = tu_tensor(&t->d_o, 4, c->B, c->T, c->HV, c->V, 0);
    if (c->dht)
        a->d_final_state = c->opt.state_v_first ? tu_tensor(&t->dht, 4, N, c->HV, c->V, c->K, 0)
                                                : tu_tensor(&t->dht, 4, N, c->HV, c->K, c->V, 0);
}

/* Runs the backward of case c on ctx (ref: F64 tensors). */
static inline gdn_out gdn_run_bwd(fqla_context *ctx, const gdn_case *c, const gdn_data *d, int ref)
{
    gdn_out out;
    fqla_fwd_args f;
    fqla_bwd_args a;
    int64_t N = gdn_N(c);
    fqla_dtype io = ref ? FQLA_DTYPE_F64 : c->io, f32 = ref ? FQLA_DTYPE_F64 : FQLA_DTYPE_F32;
    memset(&out, 0, sizeof out);
    gdn_tensors t = gdn_tensors_make(c, d, ref);
    gdn_fwd_inputs(c, &t, &f);
    gdn_bwd_inputs(c, &t, &f, &a);
    tbuf dq = tb_make(io, d->nq, NULL), dk = tb_make(io, d->nq, NULL), dv = tb_make(io, d->nv, NULL);
    tbuf dg = tb_make(f32, d->ng, NULL), db = tb_make(f32, d->ng, NULL), dh0 = tb_make(f32, d->ns, NULL);
    tbuf dA = tb_make(f32, c->HV, NULL), ddt = tb_make(f32, c->HV, NULL);
    a.dq = tu_tensor(&dq, 4, c->B, c->T, c->H, c->K, 0);
    a.dk = tu_tensor(&dk, 4, c->B, c->T, c->H, c->K, 0);
    a.dv = tu_tensor(&dv, 4, c->B, c->T, c->HV, c->V, 0);
    a.dg = tu_tensor(&dg, 3, c->B, c->T, c->HV, 0, 0);
    a.dbeta = tu_tensor(&db, 3, c->B, c->T, c->HV, 0, 0);
    if (c->h0)
        a.d_initial_state = c->opt.state_v_first ? tu_tensor(&dh0, 4, N, c->HV, c->V, c->K, 0)
                                                 : tu_tensor(&dh0, 4, N, c->HV, c->K, c->V, 0);
    if (c->opt.use_gate_in_kernel) {
        a.dA_log = tu_tensor(&dA, 1, c->HV, 0, 0, 0, 0);
        a.ddt_bias = tu_tensor(&ddt, 1, c->HV, 0, 0, 0, 0);
    }
    out.status = fqla_bwd(ctx, &a, NULL, 0, NULL);
    out.dq = tb_to_doubles(&dq);
    out.dk = tb_to_doubles(&dk);
    out.dv = tb_to_doubles(&dv);
    out.dg = tb_to_doubles(&dg);
    out.dbeta = tb_to_doubles(&db);
    if (c->h0)
        out.dh0 = tb_to_doubles(&dh0);
    if (c->opt.use_gate_in_kernel) {
        out.dA_log = tb_to_doubles(&dA);
        out.ddt_bias = tb_to_doubles(&ddt);
    }
    tb_free(&dq); tb_free(&dk); tb_free(&dv); tb_free(&dg); tb_free(&db); tb_free(&dh0);
    tb_free(&dA); tb_free(&ddt);
    gdn_tensors_free(&t);
    return out;
}

/* ---- metrics ---- */

/* The worst rel error over (sequence, head) blocks of a [B, T, heads, n]
 * output (rows of each sequence only), and the overall one, both by
 * check_rel_error; *where gets "seq s head h". */
static inline double gdn_worst_rel(const gdn_case *c, const double *x, const double *ref, int64_t heads,
                                   int64_t n, double *overall, int64_t *w_seq, int64_t *w_head)
{
    int64_t N = gdn_N(c), rows = 0;
    double worst = 0;
    *w_seq = *w_head = -1;
    for (int64_t s = 0; s < N; s++) {
        int64_t b, t0, t1;
        gdn_bounds(c, s, &b, &t0, &t1);
        rows += t1 - t0;
        if (t1 <= t0)
            continue;
        double *xs = tu_doubles((t1 - t0) * n), *rs = tu_doubles((t1 - t0) * n);
        for (int64_t h = 0; h < heads; h++) {
            for (int64_t t = t0; t < t1; t++)
                for (int64_t j = 0; j < n; j++) {
                    int64_t off = ((b * c->T + t) * heads + h) * n + j;
                    xs[(t - t0) * n + j] = x[off];
                    rs[(t - t0) * n + j] = ref[off];
                }
            double e = check_rel_error(xs, rs, (t1 - t0) * n);
            if (!(e <= worst)) {
                worst = e;
                *w_seq = s;
                *w_head = h;
            }
        }
        free(xs);
        free(rs);
    }
    (void)rows;
    *overall = check_rel_error(x, ref, c->B * c->T * heads * n);
    return worst;
}

/* Checks a [B, T, heads, n] output against the reference within tol, per
 * (sequence, head); name says which output. */
static inline void gdn_check_rows(const gdn_case *c, const char *name, const double *x, const double *ref,
                                  int64_t heads, int64_t n, double tol)
{
    double overall;
    int64_t s, h;
    double worst = gdn_worst_rel(c, x, ref, heads, n, &overall, &s, &h);
    CHECK(worst <= tol && overall <= tol, "%s: rel %.3g overall, worst %.3g at sequence %lld head %lld (tol %.1g)",
          name, overall, worst, (long long)s, (long long)h, tol);
}

/* Checks a flat output (states, per-head parameters) within tol. */
static inline void gdn_check_flat(const char *name, const double *x, const double *ref, int64_t n, double tol)
{
    double e = check_rel_error(x, ref, n);
    CHECK(e <= tol, "%s: rel %.3g (tol %.1g)", name, e, tol);
}

/* Rows no sequence covers (varlen: after the last cu_seqlens entry) must
 * be exactly zero. */
static inline void gdn_check_trailing_zero(const gdn_case *c, const char *name, const double *x, int64_t heads,
                                           int64_t n)
{
    if (!c->ncu)
        return;
    int64_t bad = 0;
    for (int64_t t = c->cu[c->ncu - 1]; t < c->T; t++)
        for (int64_t j = 0; j < heads * n; j++)
            bad += x[t * heads * n + j] != 0.0;
    CHECK(bad == 0, "%s: %lld values in rows after the last sequence are not zero", name, (long long)bad);
}

static inline fqla_context *tu_context(fqla_backend backend, int threads)
{
    fqla_context *ctx = NULL;
    fqla_status st = fqla_context_create(&ctx, backend, 0);
    CHECK(st == FQLA_STATUS_SUCCESS, "context_create(%d): %s", (int)backend, fqla_last_error(NULL));
    if (ctx && threads > 0)
        fqla_context_set_threads(ctx, threads);
    return ctx;
}

#endif
