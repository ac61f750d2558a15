/*
 * test_gpu_decode.c - the CUDA decode and verify kernels against the fp64
 * reference backend (FQLA_BACKEND_CPU_REFERENCE on host copies):
 *   - chaining: reference prefill of L tokens, then N GPU decode steps (or
 *     one GPU verify of T tokens) on a state pool, equals one reference
 *     prefill of L + N tokens (o rows and states) within docs/testing.md's
 *     thresholds, for K = V in {64, 128, 256}, both state layouts, f32 and
 *     bf16 storage, every input dtype, every in-kernel transform, GVA, and
 *     every V-slice width the kernel has;
 *   - padded (negative) slots: o rows zero, nothing else touched; unused pool
 *     entries and guard bands around the pool bit-identical; a slot >= P
 *     (no host copy) gives NaN rows and touches nothing;
 *   - a pool offset beyond 2^31 elements; B = 1024 with H = 2, HV = 8;
 *   - CUDA-graph capture and replay with new data, bit-identical to eager.
 * Every case is skipped (with the reason) when the CUDA backend is not
 * available, as on CI machines without a GPU.
 *
 * FQLA_TEST_DECODE_EMULATE=1 runs the same cases with the CPU reference in
 * place of the GPU and host memory in place of device memory (no graph and
 * no large-pool case): it checks the harness itself on a machine without a
 * GPU.
 *
 * bf16 state storage rounds the state after every token, so for it the bar
 * is docs/testing.md's rule "at most 2x the error of a same-precision
 * implementation": the reference decode on the same bf16 pool, whose only
 * error is that rounding.
 */
#include "common/check.h"
#include "cuda/route_plan.h"
#include "flashqla.h"
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef FQLA_HAVE_CUDA
/* The CUDA runtime entry points (C ABI of libcudart; handles are void *). */
#include "cudart_c.h"
#ifdef FQLA_DEV
/* the developer build's hooks (src/dev/cuda_tune.cu): a forced V-slice
 * width (0 = the planner's) and K split */
extern void fqla_cuda_decode_tune(int wv, int streaming);
extern void fqla_cuda_decode_tune_ksplit(int ks);
#endif
#define MEMCPY_H2D CUDART_MEMCPY_H2D
#define MEMCPY_D2H CUDART_MEMCPY_D2H
#define CAPTURE_THREAD_LOCAL CUDART_CAPTURE_THREAD_LOCAL
#endif

static int g_emulate; /* the CPU reference stands in for the GPU */

/* ------------------------------------------------------------------------ */
/* device memory (or host memory when emulating)                              */

static void *dev_alloc(size_t bytes)
{
    void *p = NULL;
    if (g_emulate) return malloc(bytes ? bytes : 1);
#ifdef FQLA_HAVE_CUDA
    if (cudaMalloc(&p, bytes ? bytes : 1) != 0) return NULL;
#endif
    return p;
}

static void dev_free(void *p)
{
    if (!p) return;
    if (g_emulate) { free(p); return; }
#ifdef FQLA_HAVE_CUDA
    cudaFree(p);
#endif
}

static void h2d(void *d, const void *h, size_t bytes)
{
    if (g_emulate) { memcpy(d, h, bytes); return; }
#ifdef FQLA_HAVE_CUDA
    int e = cudaMemcpy(d, h, bytes, MEMCPY_H2D);
    CHECK(e == 0, "cudaMemcpy H2D: %s", cudaGetErrorString(e));
#endif
}

static void d2h(void *h, const void *d, size_t bytes)
{
    if (g_emulate) { memcpy(h, d, bytes); return; }
#ifdef FQLA_HAVE_CUDA
    int e = cudaMemcpy(h, d, bytes, MEMCPY_D2H);
    CHECK(e == 0, "cudaMemcpy D2H: %s", cudaGetErrorString(e));
#endif
}

static void tune(int wv, int ks)
{
#if defined(FQLA_HAVE_CUDA) && defined(FQLA_DEV)
    if (!g_emulate) {
        fqla_cuda_decode_tune(wv, -1);
        fqla_cuda_decode_tune_ksplit(ks);
    }
#else
    (void)wv; (void)ks; /* the product build has no hooks: see forced_ok */
#endif
}

/* ------------------------------------------------------------------------ */
/* host values: doubles, rounded to a dtype, and their encoded bytes          */

static double round_to(double x, fqla_dtype dt)
{
    switch (dt) {
    case FQLA_DTYPE_F32: return (float)x;
    case FQLA_DTYPE_F16: return fqla_f16_to_f32(fqla_f32_to_f16((float)x));
    case FQLA_DTYPE_BF16: return fqla_bf16_to_f32(fqla_f32_to_bf16((float)x));
    default: return x;
    }
}

/* n doubles -> a new buffer of dtype dt (F32, F16, BF16, F64, I32, I64) */
static void *encode(const double *x, int64_t n, fqla_dtype dt)
{
    void *buf = malloc((size_t)n * fqla_dtype_size(dt) + 16);
    for (int64_t i = 0; i < n; i++) {
        switch (dt) {
        case FQLA_DTYPE_F32: ((float *)buf)[i] = (float)x[i]; break;
        case FQLA_DTYPE_F16: ((uint16_t *)buf)[i] = fqla_f32_to_f16((float)x[i]); break;
        case FQLA_DTYPE_BF16: ((uint16_t *)buf)[i] = fqla_f32_to_bf16((float)x[i]); break;
        case FQLA_DTYPE_I32: ((int32_t *)buf)[i] = (int32_t)x[i]; break;
        case FQLA_DTYPE_I64: ((int64_t *)buf)[i] = (int64_t)x[i]; break;
        default: ((double *)buf)[i] = x[i]; break;
        }
    }
    return buf;
}

static double decode1(const void *buf, int64_t i, fqla_dtype dt)
{
    switch (dt) {
    case FQLA_DTYPE_F32: return ((const float *)buf)[i];
    case FQLA_DTYPE_F16: return fqla_f16_to_f32(((const uint16_t *)buf)[i]);
    case FQLA_DTYPE_BF16: return fqla_bf16_to_f32(((const uint16_t *)buf)[i]);
    default: return ((const double *)buf)[i];
    }
}

static fqla_tensor tensor(void *data, fqla_dtype dt, int ndim, int64_t d0, int64_t d1, int64_t d2, int64_t d3,
                          int64_t d4)
{
    int64_t shape[5] = {d0, d1, d2, d3, d4};
    return fqla_tensor_contiguous(data, dt, ndim, shape);
}

/* A [B, Tsel, heads, n] view of tokens [t0, t0 + Tsel) of a contiguous
 * [B, Tall, heads, n] buffer (ndim 4), or of [B, Tall, heads] (ndim 3). */
static fqla_tensor token_view(void *base, fqla_dtype dt, int ndim, int64_t B, int64_t Tall, int64_t heads,
                              int64_t n, int64_t t0, int64_t Tsel)
{
    fqla_tensor t;
    memset(&t, 0, sizeof t);
    int64_t row = ndim == 4 ? heads * n : heads;
    t.data = (char *)base + (size_t)(t0 * row) * fqla_dtype_size(dt);
    t.dtype = dt;
    t.ndim = ndim;
    t.shape[0] = B; t.shape[1] = Tsel; t.shape[2] = heads;
    t.strides[0] = Tall * row; t.strides[1] = row;
    if (ndim == 4) { t.shape[3] = n; t.strides[2] = n; t.strides[3] = 1; }
    else t.strides[2] = 1;
    return t;
}

/* ------------------------------------------------------------------------ */
/* a problem: configuration, inputs (rounded doubles), reference prefill      */

typedef struct cfg {
    const char *name;
    int B, H, HV, K, L, N;       /* N decode steps, or T verify tokens */
    fqla_dtype io, gate, state, slot;
    int vfirst, l2norm, gate_in, sigmoid, neg;
    double scale;                /* 0 = default */
    int npad;                    /* padded batch rows (slot -1) */
    int wv;                      /* V-slice width override (0 = heuristic) */
    int verify;                  /* 0 decode; 1 verify into step_states; 2 verify into step_slots */
    int ks;                      /* [K, V] K-split override (0 = heuristic, 1 = unsplit, 2/4/8) */
} cfg;

typedef struct problem {
    cfg c;
    int64_t TT, P;               /* tokens in all (L + N), pool entries */
    double *q, *k, *v, *g, *beta, *h0;    /* rounded input values */
    float A_log[64], dt_bias[64];
    int64_t *slots;              /* [B] */
    fqla_options opt;
} problem;

static void problem_free(problem *p)
{
    free(p->q); free(p->k); free(p->v); free(p->g); free(p->beta); free(p->h0); free(p->slots);
}

static void make_problem(problem *p, const cfg *c)
{
    memset(p, 0, sizeof *p);
    p->c = *c;
    p->TT = c->L + c->N;
    int64_t B = c->B, H = c->H, HV = c->HV, K = c->K, TT = p->TT;
    p->P = B + 5 + (int64_t)(check_uniform() * 7);
    p->q = malloc(sizeof(double) * B * TT * H * K);
    p->k = malloc(sizeof(double) * B * TT * H * K);
    p->v = malloc(sizeof(double) * B * TT * HV * K);
    p->g = malloc(sizeof(double) * B * TT * HV);
    p->beta = malloc(sizeof(double) * B * TT * HV);
    p->h0 = malloc(sizeof(double) * B * HV * K * K);
    p->slots = malloc(sizeof(int64_t) * B);
    for (int64_t r = 0; r < B * TT * H; r++) {
        /* without the in-kernel l2norm, feed unit-norm k (stable recurrence) */
        double nq = 0, nk = 0, amp = c->l2norm ? 0.5 + 3 * check_uniform() : 1;
        double *qr = p->q + r * K, *kr = p->k + r * K;
        for (int64_t i = 0; i < K; i++) {
            qr[i] = check_normal(); kr[i] = check_normal();
            nq += qr[i] * qr[i]; nk += kr[i] * kr[i];
        }
        for (int64_t i = 0; i < K; i++) {
            qr[i] = round_to(c->l2norm ? amp * qr[i] : qr[i] / sqrt(nq), c->io);
            kr[i] = round_to(c->l2norm ? amp * kr[i] : kr[i] / sqrt(nk), c->io);
        }
    }
    for (int64_t i = 0; i < B * TT * HV * K; i++) p->v[i] = round_to(check_normal(), c->io);
    for (int64_t h = 0; h < HV; h++) {
        p->A_log[h] = (float)(-1.5 + 2 * check_uniform());
        p->dt_bias[h] = (float)(check_normal());
    }
    for (int64_t i = 0; i < B * TT * HV; i++) {
        int64_t h = i % HV;
        double gv;
        if (c->gate_in) gv = 2 * check_normal();
        else if (h % 4 == 3) gv = 0; /* a head that does not decay */
        else gv = -log1p(exp(-check_normal())) / (1 + 3 * (double)h / HV); /* logsigmoid, spread */
        p->g[i] = round_to(gv, c->gate);
        double bv = c->sigmoid ? 3 * check_normal() : check_uniform();
        p->beta[i] = round_to(bv, c->gate);
    }
    for (int64_t i = 0; i < B * HV * K * K; i++) p->h0[i] = 0.5 * check_normal();
    /* distinct random slots; the last npad rows are padding, shuffled in */
    int64_t *perm = malloc(sizeof(int64_t) * p->P);
    for (int64_t i = 0; i < p->P; i++) perm[i] = i;
    for (int64_t i = p->P - 1; i > 0; i--) {
        int64_t j = (int64_t)(check_uniform() * (double)(i + 1)), t = perm[i];
        perm[i] = perm[j]; perm[j] = t;
    }
    for (int64_t b = 0; b < B; b++) p->slots[b] = perm[b];
    for (int i = 0; i < c->npad && i < B; i++) {
        int64_t b = (int64_t)(check_uniform() * (double)B);
        p->slots[b] = -1 - (int64_t)(check_uniform() * 3);
    }
    free(perm);
    memset(&p->opt, 0, sizeof p->opt);
    p->opt.scale = c->scale;
    p->opt.use_qk_l2norm = c->l2norm;
    p->opt.use_gate_in_kernel = c->gate_in;
    p->opt.use_beta_sigmoid = c->sigmoid;
    p->opt.allow_neg_eigval = c->neg;
    p->opt.state_v_first = c->vfirst;
}

/* Reference prefill (fp64) of the first `len` tokens from h0: o [B, len, HV, V]
 * and the final state [B, HV, K, V] (layout per opt), both doubles. */
static int ref_prefill(fqla_context *ref, const problem *p, int64_t len, double *o, double *fin)
{
    const cfg *c = &p->c;
    int64_t B = c->B, H = c->H, HV = c->HV, K = c->K;
    fqla_fwd_args a;
    fqla_fwd_args_init(&a);
    a.q = token_view(p->q, FQLA_DTYPE_F64, 4, B, p->TT, H, K, 0, len);
    a.k = token_view(p->k, FQLA_DTYPE_F64, 4, B, p->TT, H, K, 0, len);
    a.v = token_view(p->v, FQLA_DTYPE_F64, 4, B, p->TT, HV, K, 0, len);
    a.g = token_view(p->g, FQLA_DTYPE_F64, 3, B, p->TT, HV, 1, 0, len);
    a.beta = token_view(p->beta, FQLA_DTYPE_F64, 3, B, p->TT, HV, 1, 0, len);
    if (c->gate_in) {
        a.A_log = tensor((void *)p->A_log, FQLA_DTYPE_F32, 1, HV, 0, 0, 0, 0);
        a.dt_bias = tensor((void *)p->dt_bias, FQLA_DTYPE_F32, 1, HV, 0, 0, 0, 0);
    }
    a.initial_state = tensor(p->h0, FQLA_DTYPE_F64, 4, B, HV, K, K, 0);
    a.o = tensor(o, FQLA_DTYPE_F64, 4, B, len, HV, K, 0);
    a.final_state = tensor(fin, FQLA_DTYPE_F64, 4, B, HV, K, K, 0);
    a.opt = p->opt;
    fqla_status st = fqla_fwd(ref, &a, NULL, 0, NULL);
    CHECK(st == FQLA_STATUS_SUCCESS, "reference prefill: %s: %s", fqla_status_string(st), fqla_last_error(ref));
    return st == FQLA_STATUS_SUCCESS;
}

/* Worst per-(b, h) relative error of a [B, n_rows, HV, V]-like comparison:
 * x and ref give element (b, r, h, j) through the callbacks' flat indices. */
typedef struct worst { double err; int64_t b, h; } worst;

static void worst_update(worst *w, double e, int64_t b, int64_t h)
{
    if (!(e <= w->err)) { w->err = e; w->b = b; w->h = h; } /* NaN wins too */
}

/* ------------------------------------------------------------------------ */
/* the GPU side of one problem                                                */

#define GUARD_BYTES 4096

typedef struct gpu {
    fqla_context *ctx;
    void *q, *k, *v, *g, *beta, *A_log, *dt_bias, *slots, *o;
    void *pool_alloc, *pool;     /* pool = pool_alloc + GUARD_BYTES */
    size_t pool_bytes, o_bytes;
} gpu;

static int64_t state_elems(const problem *p) { return (int64_t)p->c.HV * p->c.K * p->c.K; }

static void gpu_upload_inputs(gpu *d, const problem *p)
{
    const cfg *c = &p->c;
    int64_t B = c->B, H = c->H, HV = c->HV, K = c->K, TT = p->TT;
    void *tmp;
    size_t es = fqla_dtype_size(c->io), gs = fqla_dtype_size(c->gate);
    struct { void **dst; const double *src; int64_t n; fqla_dtype dt; size_t es; } in[5] = {
        {&d->q, p->q, B * TT * H * K, c->io, es}, {&d->k, p->k, B * TT * H * K, c->io, es},
        {&d->v, p->v, B * TT * HV * K, c->io, es}, {&d->g, p->g, B * TT * HV, c->gate, gs},
        {&d->beta, p->beta, B * TT * HV, c->gate, gs}};
    for (int i = 0; i < 5; i++) {
        if (!*in[i].dst) *in[i].dst = dev_alloc((size_t)in[i].n * in[i].es);
        tmp = encode(in[i].src, in[i].n, in[i].dt);
        h2d(*in[i].dst, tmp, (size_t)in[i].n * in[i].es);
        free(tmp);
    }
    if (!d->A_log) d->A_log = dev_alloc(sizeof p->A_log);
    if (!d->dt_bias) d->dt_bias = dev_alloc(sizeof p->dt_bias);
    h2d(d->A_log, p->A_log, sizeof p->A_log);
    h2d(d->dt_bias, p->dt_bias, sizeof p->dt_bias);
    double *sl = malloc(sizeof(double) * B);
    for (int64_t b = 0; b < B; b++) sl[b] = (double)p->slots[b];
    tmp = encode(sl, B, c->slot);
    if (!d->slots) d->slots = dev_alloc((size_t)B * 8);
    h2d(d->slots, tmp, (size_t)B * fqla_dtype_size(c->slot));
    free(tmp);
    free(sl);
}

/* Decode / verify args over tokens [t0, t0 + T) of the uploaded inputs,
 * writing o rows [orow, orow + T) of the [B, N, HV, V] o buffer. */
static fqla_decode_args gpu_args(const gpu *d, const problem *p, int64_t t0, int64_t T, int64_t orow)
{
    const cfg *c = &p->c;
    int64_t B = c->B, H = c->H, HV = c->HV, K = c->K, TT = p->TT;
    fqla_decode_args a;
    fqla_decode_args_init(&a);
    a.q = token_view(d->q, c->io, 4, B, TT, H, K, t0, T);
    a.k = token_view(d->k, c->io, 4, B, TT, H, K, t0, T);
    a.v = token_view(d->v, c->io, 4, B, TT, HV, K, t0, T);
    a.g = token_view(d->g, c->gate, 3, B, TT, HV, 1, t0, T);
    a.beta = token_view(d->beta, c->gate, 3, B, TT, HV, 1, t0, T);
    if (c->gate_in) {
        a.A_log = tensor(d->A_log, FQLA_DTYPE_F32, 1, HV, 0, 0, 0, 0);
        a.dt_bias = tensor(d->dt_bias, FQLA_DTYPE_F32, 1, HV, 0, 0, 0, 0);
    }
    a.state_pool = tensor(d->pool, c->state, 4, p->P, HV, K, K, 0);
    a.slots = tensor(d->slots, c->slot, 1, B, 0, 0, 0, 0);
    a.o = token_view(d->o, c->io, 4, B, c->N, HV, K, orow, T);
    a.opt = p->opt;
    return a;
}

/* Fills the host pool image: entry slots[b] = encoded state fin[b]; every
 * other entry and the guard bands random bytes (checked later). */
static unsigned char *make_pool_image(const problem *p, const double *fin, size_t *bytes)
{
    const cfg *c = &p->c;
    size_t es = fqla_dtype_size(c->state);
    int64_t E = state_elems(p);
    size_t pool_bytes = (size_t)(p->P * E) * es;
    *bytes = pool_bytes + 2 * GUARD_BYTES;
    unsigned char *img = malloc(*bytes);
    for (size_t i = 0; i < *bytes; i++) img[i] = (unsigned char)(check_uniform() * 256);
    /* keep random pool floats finite so an accidental read shows as a wrong value, not only NaN */
    double *tmpd = malloc(sizeof(double) * E);
    for (int64_t s = 0; s < p->P; s++) {
        for (int64_t i = 0; i < E; i++) tmpd[i] = 0.25 * check_normal();
        void *enc = encode(tmpd, E, c->state);
        memcpy(img + GUARD_BYTES + (size_t)(s * E) * es, enc, (size_t)E * es);
        free(enc);
    }
    for (int64_t b = 0; b < c->B; b++) {
        /* padding (< 0) and out-of-pool slots (slot_past_pool) have no entry */
        if (p->slots[b] < 0 || p->slots[b] >= p->P) continue;
        void *enc = encode(fin + b * E, E, c->state);
        memcpy(img + GUARD_BYTES + (size_t)(p->slots[b] * E) * es, enc, (size_t)E * es);
        free(enc);
    }
    free(tmpd);
    return img;
}

static void gpu_free(gpu *d)
{
    dev_free(d->q); dev_free(d->k); dev_free(d->v); dev_free(d->g); dev_free(d->beta);
    dev_free(d->A_log); dev_free(d->dt_bias); dev_free(d->slots); dev_free(d->o); dev_free(d->pool_alloc);
    if (d->ctx) fqla_context_destroy(d->ctx);
}

static fqla_context *gpu_context(void)
{
    fqla_context *ctx = NULL;
    fqla_status st = fqla_context_create(&ctx, g_emulate ? FQLA_BACKEND_CPU_REFERENCE : FQLA_BACKEND_CUDA, 0);
    CHECK(st == FQLA_STATUS_SUCCESS, "context: %s", fqla_last_error(NULL));
    return ctx;
}

static fqla_context *ref_context(void)
{
    fqla_context *ctx = NULL;
    fqla_status st = fqla_context_create(&ctx, FQLA_BACKEND_CPU_REFERENCE, 0);
    CHECK(st == FQLA_STATUS_SUCCESS, "reference context: %s", fqla_last_error(NULL));
    return ctx;
}

/* Reference decode / verify on host images (the same-precision baseline):
 * pool image and args mirroring the GPU call, with f64 inputs. */
static fqla_decode_args host_args(const problem *p, void *pool, void *o, int64_t t0, int64_t T, int64_t N,
                                  int64_t *slots_i64)
{
    const cfg *c = &p->c;
    int64_t B = c->B, H = c->H, HV = c->HV, K = c->K, TT = p->TT;
    fqla_decode_args a;
    fqla_decode_args_init(&a);
    a.q = token_view(p->q, FQLA_DTYPE_F64, 4, B, TT, H, K, t0, T);
    a.k = token_view(p->k, FQLA_DTYPE_F64, 4, B, TT, H, K, t0, T);
    a.v = token_view(p->v, FQLA_DTYPE_F64, 4, B, TT, HV, K, t0, T);
    a.g = token_view(p->g, FQLA_DTYPE_F64, 3, B, TT, HV, 1, t0, T);
    a.beta = token_view(p->beta, FQLA_DTYPE_F64, 3, B, TT, HV, 1, t0, T);
    if (c->gate_in) {
        a.A_log = tensor((void *)p->A_log, FQLA_DTYPE_F32, 1, HV, 0, 0, 0, 0);
        a.dt_bias = tensor((void *)p->dt_bias, FQLA_DTYPE_F32, 1, HV, 0, 0, 0, 0);
    }
    a.state_pool = tensor(pool, c->state, 4, p->P, HV, K, K, 0);
    a.slots = tensor(slots_i64, FQLA_DTYPE_I64, 1, B, 0, 0, 0, 0);
    a.o = token_view(o, FQLA_DTYPE_F64, 4, B, N, HV, K, 0, T);
    a.opt = p->opt;
    return a;
}

/* ------------------------------------------------------------------------ */
/* chained decode / verify against one longer prefill                         */

static double thr_for(const cfg *c)
{
    return c->io == FQLA_DTYPE_F32 ? 1e-4 : 5e-3;
}

/* The launch the planner (src/cuda/route_plan.h) chooses for c on the
 * test's GPU. */
static fqla_decode_route planned(const cfg *c, fqla_context *ctx)
{
    fqla_device_info info;
    memset(&info, 0, sizeof info);
    fqla_context_info(ctx, &info);
    fqla_route_device d;
    d.sm_count = info.sm_count;
    d.cc_major = info.cc_major;
    d.cc_minor = info.cc_minor;
    fqla_decode_shape s;
    s.B = c->B;
    s.HV = c->HV;
    s.K = c->K;
    s.V = c->K;
    s.state_esize = (int)fqla_dtype_size(c->state);
    s.v_first = c->vfirst;
    fqla_decode_route r;
    fqla_decode_plan(&d, &s, &r);
    return r;
}

/* A case that forces a variant (wv, ks): in the developer build through its
 * hooks; in the product build it runs where the planner picks that same
 * variant, and is reported as skipped elsewhere. */
static int forced_ok(const cfg *c)
{
#if defined(FQLA_HAVE_CUDA) && !defined(FQLA_DEV)
    if ((c->wv || c->ks) && !g_emulate) {
        fqla_context *ctx = gpu_context();
        if (!ctx) return 0;
        const fqla_decode_route r = planned(c, ctx);
        fqla_context_destroy(ctx);
        if ((c->wv && c->wv != r.wv) || (c->ks && c->ks != r.ks)) {
            check_skip(c->name, "forces a variant the planner does not choose here: needs a DEV=1 build");
            return 0;
        }
    }
#else
    (void)c;
#endif
    return 1;
}

static void run_chain(const cfg *c)
{
    if (!forced_ok(c)) return;
    problem p;
    make_problem(&p, c);
    const int64_t B = c->B, HV = c->HV, K = c->K, KK = (int64_t)K * K, E = state_elems(&p), N = c->N, L = c->L;
    const size_t es = fqla_dtype_size(c->state), ios = fqla_dtype_size(c->io);
    fqla_context *ref = ref_context();
    gpu d;
    memset(&d, 0, sizeof d);
    d.ctx = gpu_context();
    double *o_long = malloc(sizeof(double) * B * p.TT * HV * K);
    double *fin_L = malloc(sizeof(double) * B * E), *fin_long = malloc(sizeof(double) * B * E);
    double *fin_steps = c->verify ? malloc(sizeof(double) * B * N * E) : NULL;
    if (!ref || !d.ctx) goto done;

    /* the oracle: prefill(L) for the pool, prefill(L + N) for the answer */
    if (!ref_prefill(ref, &p, L, o_long, fin_L)) goto done;
    if (c->verify)
        for (int64_t t = 0; t < N; t++) {
            if (!ref_prefill(ref, &p, L + t + 1, o_long, fin_long)) goto done;
            for (int64_t b = 0; b < B; b++)
                memcpy(fin_steps + (b * N + t) * E, fin_long + b * E, sizeof(double) * E);
        }
    if (!ref_prefill(ref, &p, p.TT, o_long, fin_long)) goto done;

    size_t img_bytes;
    unsigned char *img = make_pool_image(&p, fin_L, &img_bytes);
    d.pool_alloc = dev_alloc(img_bytes);
    d.pool = (char *)d.pool_alloc + GUARD_BYTES;
    d.o_bytes = (size_t)(B * N * HV * K) * ios;
    d.o = dev_alloc(d.o_bytes);
    gpu_upload_inputs(&d, &p);
    h2d(d.pool_alloc, img, img_bytes);
    unsigned char *poison = malloc(d.o_bytes);
    memset(poison, 0xff, d.o_bytes); /* NaN in f32, f16 and bf16 */
    h2d(d.o, poison, d.o_bytes);

    /* verify targets: dense step_states, or unused pool entries per (b, t) */
    size_t ss_bytes = (size_t)(B * N * E) * es;
    void *ss_dev = NULL;
    int64_t *step_slot = NULL;
    void *step_slot_dev = NULL;
    unsigned char *ss_img = NULL;
    if (c->verify == 1) {
        ss_img = malloc(ss_bytes);
        for (size_t i = 0; i < ss_bytes; i++) ss_img[i] = (unsigned char)(check_uniform() * 256);
        ss_dev = dev_alloc(ss_bytes);
        h2d(ss_dev, ss_img, ss_bytes);
    }
    if (c->verify == 2) {
        /* the pool has P - (active rows) unused entries; give each (b, t) one
         * while they last, the rest -1 (skipped) */
        char *used = calloc((size_t)p.P, 1);
        for (int64_t b = 0; b < B; b++)
            if (p.slots[b] >= 0) used[p.slots[b]] = 1;
        step_slot = malloc(sizeof(int64_t) * B * N);
        int64_t next = 0;
        for (int64_t i = 0; i < B * N; i++) {
            while (next < p.P && used[next]) next++;
            step_slot[i] = next < p.P && check_uniform() < 0.8 ? next++ : -1;
        }
        free(used);
        double *tmp = malloc(sizeof(double) * B * N);
        for (int64_t i = 0; i < B * N; i++) tmp[i] = (double)step_slot[i];
        void *enc = encode(tmp, B * N, c->slot);
        step_slot_dev = dev_alloc((size_t)(B * N) * 8);
        h2d(step_slot_dev, enc, (size_t)(B * N) * fqla_dtype_size(c->slot));
        free(enc);
        free(tmp);
    }

    tune(c->wv, c->ks);
    fqla_status st = FQLA_STATUS_SUCCESS;
    if (!c->verify) {
        for (int64_t n = 0; n < N && st == FQLA_STATUS_SUCCESS; n++) {
            fqla_decode_args a = gpu_args(&d, &p, L + n, 1, n);
            st = fqla_decode(d.ctx, &a, NULL, 0, NULL);
        }
    } else {
        fqla_decode_args a = gpu_args(&d, &p, L, N, 0);
        if (c->verify == 1) a.step_states = tensor(ss_dev, c->state, 5, B, N, HV, K, K);
        else {
            int64_t shp[2] = {B, N};
            a.step_slots = fqla_tensor_contiguous(step_slot_dev, c->slot, 2, shp);
        }
        st = fqla_verify(d.ctx, &a, NULL, 0, NULL);
    }
    tune(0, 0);
    CHECK(st == FQLA_STATUS_SUCCESS, "%s: %s: %s", c->name, fqla_status_string(st), fqla_last_error(d.ctx));

    unsigned char *img_after = malloc(img_bytes), *o_after = malloc(d.o_bytes);
    d2h(img_after, d.pool_alloc, img_bytes);
    d2h(o_after, d.o, d.o_bytes);
    unsigned char *ss_after = NULL;
    if (c->verify == 1) {
        ss_after = malloc(ss_bytes);
        d2h(ss_after, ss_dev, ss_bytes);
    }

    /* same-precision baseline: the reference decode / verify on a host copy of the pool */
    unsigned char *base_img = malloc(img_bytes);
    memcpy(base_img, img, img_bytes);
    double *o_base = malloc(sizeof(double) * B * N * HV * K);
    double *ss_base = c->verify ? malloc(sizeof(double) * B * N * E) : NULL;
    {
        fqla_status sb = FQLA_STATUS_SUCCESS;
        void *pool_h = base_img + GUARD_BYTES;
        if (!c->verify) {
            for (int64_t n = 0; n < N && sb == FQLA_STATUS_SUCCESS; n++) {
                fqla_decode_args a = host_args(&p, pool_h, o_base + n * HV * K, L + n, 1, N, p.slots);
                sb = fqla_decode(ref, &a, NULL, 0, NULL);
            }
        } else {
            /* step states in the pool dtype (the baseline rounds them as the kernel does) */
            fqla_decode_args a = host_args(&p, pool_h, o_base, L, N, N, p.slots);
            void *ss_h = malloc(ss_bytes);
            a.step_states = tensor(ss_h, c->state, 5, B, N, HV, K, K);
            sb = fqla_verify(ref, &a, NULL, 0, NULL);
            for (int64_t i = 0; i < B * N * E; i++) ss_base[i] = decode1(ss_h, i, c->state);
            free(ss_h);
        }
        CHECK(sb == FQLA_STATUS_SUCCESS, "baseline: %s", fqla_last_error(ref));
    }

    /* compare */
    worst wo = {0, -1, -1}, ws = {0, -1, -1}, bo = {0, -1, -1}, bs = {0, -1, -1};
    for (int64_t b = 0; b < B; b++) {
        int64_t slot = p.slots[b];
        for (int64_t h = 0; h < HV; h++) {
            if (slot < 0) {
                int zero = 1;
                for (int64_t n = 0; n < N; n++)
                    for (int64_t j = 0; j < K; j++)
                        zero &= decode1(o_after, ((b * N + n) * HV + h) * K + j, c->io) == 0.0;
                CHECK(zero, "%s: padded row b=%lld h=%lld: o not zeroed", c->name, (long long)b, (long long)h);
                continue;
            }
            double num = 0, den = 0, bnum = 0;
            for (int64_t n = 0; n < N; n++)
                for (int64_t j = 0; j < K; j++) {
                    double r = o_long[((b * p.TT + L + n) * HV + h) * K + j];
                    double x = decode1(o_after, ((b * N + n) * HV + h) * K + j, c->io);
                    double y = o_base[((b * N + n) * HV + h) * K + j];
                    num += (x - r) * (x - r); den += r * r; bnum += (y - r) * (y - r);
                    if (!isfinite(x)) num = INFINITY;
                }
            worst_update(&wo, sqrt(num / den), b, h);
            worst_update(&bo, sqrt(bnum / den), b, h);
            /* states: the pool entry (decode) or each step state (verify) */
            for (int64_t n = c->verify ? 0 : N - 1; n < N; n++) {
                const double *r = c->verify ? fin_steps + (b * N + n) * E + h * KK : fin_long + b * E + h * KK;
                double snum = 0, sden = 0, sbn = 0;
                int skip = 0;
                for (int64_t i = 0; i < KK; i++) {
                    double x, y;
                    if (!c->verify) {
                        x = decode1(img_after + GUARD_BYTES, slot * E + h * KK + i, c->state);
                        y = decode1(base_img + GUARD_BYTES, slot * E + h * KK + i, c->state);
                    } else if (c->verify == 1) {
                        x = decode1(ss_after, (b * N + n) * E + h * KK + i, c->state);
                        y = ss_base[(b * N + n) * E + h * KK + i];
                    } else {
                        int64_t s2 = step_slot[b * N + n];
                        if (s2 < 0) { skip = 1; break; }
                        x = decode1(img_after + GUARD_BYTES, s2 * E + h * KK + i, c->state);
                        y = ss_base[(b * N + n) * E + h * KK + i];
                    }
                    snum += (x - r[i]) * (x - r[i]); sden += r[i] * r[i]; sbn += (y - r[i]) * (y - r[i]);
                    if (!isfinite(x)) snum = INFINITY;
                }
                if (skip) continue;
                worst_update(&ws, sqrt(snum / sden), b, h);
                worst_update(&bs, sqrt(sbn / sden), b, h);
            }
        }
    }
    double thr = thr_for(c);
    double to = fmax(thr, 2 * bo.err), ts = fmax(thr, 2 * bs.err);
    printf("  %-34s o %.2e (bar %.1e)  state %.2e (bar %.1e)\n", c->name, wo.err, to, ws.err, ts);
    CHECK(wo.err <= to, "%s: o rel error %.3e > %.1e at b=%lld h=%lld", c->name, wo.err, to, (long long)wo.b,
          (long long)wo.h);
    CHECK(ws.err <= ts, "%s: state rel error %.3e > %.1e at b=%lld h=%lld", c->name, ws.err, ts, (long long)ws.b,
          (long long)ws.h);

    /* untouched: guard bands; every pool entry the call may not write */
    CHECK(memcmp(img, img_after, GUARD_BYTES) == 0, "%s: guard band before the pool changed", c->name);
    CHECK(memcmp(img + img_bytes - GUARD_BYTES, img_after + img_bytes - GUARD_BYTES, GUARD_BYTES) == 0,
          "%s: guard band after the pool changed", c->name);
    {
        char *writable = calloc((size_t)p.P, 1);
        for (int64_t b = 0; b < B; b++) {
            if (!c->verify && p.slots[b] >= 0) writable[p.slots[b]] = 1;
            for (int64_t n = 0; c->verify == 2 && p.slots[b] >= 0 && n < N; n++)
                if (step_slot[b * N + n] >= 0) writable[step_slot[b * N + n]] = 1;
        }
        for (int64_t s = 0; s < p.P; s++) {
            if (writable[s]) continue;
            size_t off = GUARD_BYTES + (size_t)(s * E) * es;
            CHECK(memcmp(img + off, img_after + off, (size_t)E * es) == 0,
                  "%s: pool entry %lld changed (no sequence may write it)", c->name, (long long)s);
        }
        free(writable);
    }
    if (c->verify == 1)
        for (int64_t b = 0; b < B; b++)
            if (p.slots[b] < 0)
                CHECK(memcmp(ss_img + (size_t)(b * N * E) * es, ss_after + (size_t)(b * N * E) * es,
                             (size_t)(N * E) * es) == 0,
                      "%s: step_states of padded row %lld written", c->name, (long long)b);

    free(img_after); free(o_after); free(ss_after); free(base_img); free(o_base); free(ss_base);
    free(img); free(poison); free(ss_img); free(step_slot);
    dev_free(ss_dev); dev_free(step_slot_dev);
done:
    free(o_long); free(fin_L); free(fin_long); free(fin_steps);
    gpu_free(&d);
    if (ref) fqla_context_destroy(ref);
    problem_free(&p);
}

/* ------------------------------------------------------------------------ */
/* cases                                                                       */

static int g_gpu_ok;
static char g_why[256];

#define F32 FQLA_DTYPE_F32
#define F16 FQLA_DTYPE_F16
#define BF16 FQLA_DTYPE_BF16
#define I32 FQLA_DTYPE_I32
#define I64 FQLA_DTYPE_I64

static void chained_decode(void)
{
    const int q = check_quick();
    /* name, B, H, HV, K, L, N, io, gate, state, slot, vfirst, l2, gate_in, sigm, neg, scale, npad, wv, verify */
    const cfg cases[] = {
        {"k128 kv f32 bf16io gva all", 5, 2, 8, 128, 9, 3, BF16, F32, F32, I32, 0, 1, 1, 1, 0, 0, 1, 0, 0, 0},
        {"k128 vk f32 f32io plain", 4, 4, 4, 128, 7, 3, F32, F32, F32, I64, 1, 0, 0, 0, 0, 0.3, 1, 0, 0, 0},
        {"k128 kv f32 f32io plain", 3, 1, 2, 128, 5, 2, F32, F32, F32, I64, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
        {"k64 vk bf16st f16io neg", 4, 2, 4, 64, 6, 3, F16, BF16, BF16, I32, 1, 1, 0, 1, 1, 0, 1, 0, 0, 0},
        {"k64 kv f32 f32io", 3, 3, 6, 64, 6, 2, F32, F32, F32, I32, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0},
        {"k256 kv f32 bf16io", 2, 1, 2, 256, 4, 2, BF16, BF16, F32, I64, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0},
        {"k256 vk bf16st bf16io", 3, 2, 4, 256, 4, 2, BF16, F32, BF16, I32, 1, 1, 0, 1, 1, 0, 1, 0, 0, 0},
        {"k128 kv bf16st bf16io", 4, 2, 4, 128, 6, 3, BF16, F32, BF16, I32, 0, 1, 1, 1, 0, 0, 1, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (q && i % 2) continue;
        run_chain(&cases[i]);
    }
}

/* every V-slice width of each (K, layout, state dtype): 2048/K, 1024/K, 512/K */
static void every_slice_width(void)
{
    const int Ks[3] = {64, 128, 256};
    for (int ki = 0; ki < 3; ki++)
        for (int vf = 0; vf < 2; vf++)
            for (int st = 0; st < 2; st++)
                for (int w = 0; w < 3; w++) {
                    int K = Ks[ki], wv = (2048 >> w) / K;
                    char name[64];
                    snprintf(name, sizeof name, "k%d %s %s wv%d", K, vf ? "vk" : "kv", st ? "bf16st" : "f32", wv);
                    cfg c = {name, 2, 1, 2, K, 3, 2, BF16, F32, st ? BF16 : F32, I32,
                             vf, 1, 0, 0, 0, 0, 0, wv, 0, 0};
                    if (check_quick() && K == 256) continue;
                    run_chain(&c);
                }
    /* the [K, V] K-split variants: KS warps share a 128-byte-wide slice */
    for (int ki = 0; ki < 3; ki++)
        for (int st = 0; st < 2; st++)
            for (int ks = 2; ks <= 8; ks *= 2) {
                const int K = Ks[ki], vals = K / ks / 4 * (st ? 8 : 4);
                if (vals < 16 || vals > 64) continue;
                if (check_quick() && K == 256) continue;
                char name[64];
                snprintf(name, sizeof name, "k%d kv %s ks%d", K, st ? "bf16st" : "f32", ks);
                cfg c = {name, 3, 1, 3, K, 3, 2, BF16, F32, st ? BF16 : F32, I32,
                         0, 1, 0, 0, 0, 0, 1, 0, 0, ks};
                run_chain(&c);
            }
}

/* Each variant the planner (route_plan.h) chooses, on a batch it chooses it
 * for (132 SMs; on a GPU with another count a different choice is reported
 * as skipped): [K, V] unsplit (fp32, K = 64, enough warps), K splits 2, 4
 * and 8, and [V, K] at the widest and the narrowest slice. */
static void planned_variants(void)
{
    enum { NP = 12 };
    /* name, B, H, HV, K, L, N, io, gate, state, slot, vfirst, l2, gate_in, sigm, neg, scale, npad, wv, verify, ks */
    const cfg cases[NP] = {
        {"planned k64 kv f32 unsplit", 66, 2, 8, 64, 3, 2, BF16, F32, F32, I32, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0},
        {"planned k64 kv f32 ks2", 33, 2, 8, 64, 3, 2, BF16, F32, F32, I32, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0},
        {"planned k64 kv f32 ks4", 2, 1, 2, 64, 3, 2, BF16, F32, F32, I32, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0},
        {"planned k128 kv f32 ks2", 17, 2, 8, 128, 3, 2, BF16, F32, F32, I32, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0},
        {"planned k128 kv f32 ks4", 2, 1, 2, 128, 3, 2, BF16, F32, F32, I32, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0},
        {"planned k256 kv f32 ks4", 2, 1, 2, 256, 3, 2, BF16, F32, F32, I32, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0},
        {"planned k64 kv bf16st ks2", 66, 2, 8, 64, 3, 2, BF16, F32, BF16, I32, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0},
        {"planned k64 kv bf16st ks4", 2, 1, 2, 64, 3, 2, BF16, F32, BF16, I32, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0},
        {"planned k128 kv bf16st ks4", 2, 1, 2, 128, 3, 2, BF16, F32, BF16, I32, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0},
        {"planned k256 kv bf16st ks8", 2, 1, 2, 256, 3, 2, BF16, F32, BF16, I32, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0},
        {"planned k128 vk f32 widest", 17, 2, 8, 128, 3, 2, BF16, F32, F32, I32, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0},
        {"planned k128 vk bf16st narrowest", 2, 1, 2, 128, 3, 2, BF16, F32, BF16, I32, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0},
    };
    /* the planner's (wv, ks) on 132 SMs */
    const int want[NP][2] = {{32, 1}, {32, 2}, {32, 4}, {32, 2}, {32, 4}, {32, 4},
                             {64, 2}, {64, 4}, {64, 4}, {64, 8}, {16, 1}, {4, 1}};
    fqla_context *ctx = gpu_context();
    if (!ctx) return;
    for (int i = 0; i < NP; i++) {
        if (check_quick() && cases[i].K == 256) continue;
        const fqla_decode_route r = planned(&cases[i], ctx);
        if (!g_emulate && (r.wv != want[i][0] || r.ks != want[i][1])) { /* (emulation: the CPU's core count) */
            fqla_device_info info;
            fqla_context_info(ctx, &info);
            if (info.sm_count != 132) {
                check_skip(cases[i].name, "the planner picks another variant at this GPU's SM count");
                continue;
            }
            CHECK(0, "%s: planned wv %d ks %d, %d %d expected", cases[i].name, r.wv, r.ks, want[i][0], want[i][1]);
        }
        run_chain(&cases[i]);
    }
    fqla_context_destroy(ctx);
}

static void verify_step_states(void)
{
    const cfg cases[] = {
        {"verify T4 kv f32 step_states", 4, 2, 4, 128, 6, 4, BF16, F32, F32, I32, 0, 1, 1, 1, 0, 0, 1, 0, 1, 0},
        {"verify T3 vk bf16st step_states", 3, 1, 4, 128, 5, 3, BF16, BF16, BF16, I64, 1, 1, 0, 1, 1, 0, 1, 0, 1, 0},
        {"verify T2 k64 f32io step_states", 3, 3, 3, 64, 5, 2, F32, F32, F32, I64, 0, 0, 0, 0, 0, 0.2, 0, 0, 1, 0},
        {"verify T5 k256 vk f32", 2, 1, 2, 256, 3, 5, BF16, F32, F32, I32, 1, 1, 1, 1, 0, 0, 0, 0, 1, 0},
        {"verify T3 kv f32 ks2", 3, 2, 4, 128, 4, 3, BF16, F32, F32, I32, 0, 1, 1, 1, 0, 0, 1, 0, 1, 2},
        {"verify T4 kv f32 ks4", 2, 1, 4, 128, 4, 4, F32, F32, F32, I64, 0, 1, 0, 1, 0, 0, 0, 0, 1, 4},
        {"verify T3 kv bf16st ks8", 2, 2, 2, 128, 4, 3, BF16, BF16, BF16, I32, 0, 1, 1, 0, 0, 0, 1, 0, 1, 8},
        {"verify T2 kv f32 unsplit wv16", 3, 1, 2, 128, 4, 2, BF16, F32, F32, I32, 0, 1, 0, 1, 0, 0, 0, 16, 1, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_chain(&cases[i]);
}

static void verify_step_slots(void)
{
    const cfg cases[] = {
        {"verify T3 kv f32 step_slots", 3, 2, 4, 128, 5, 3, BF16, F32, F32, I64, 0, 1, 1, 1, 0, 0, 1, 0, 2, 0},
        {"verify T2 vk bf16st step_slots", 4, 2, 2, 64, 4, 2, F16, BF16, BF16, I32, 1, 1, 0, 1, 0, 0, 1, 0, 2, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_chain(&cases[i]);
}

/* One decode step of (B, H, HV, K) against the reference decode on host
 * copies of exactly the encoded inputs the GPU got. */
static void one_step_vs_reference(const cfg *c, int64_t P_big, int use_graph)
{
    problem p;
    make_problem(&p, c);
    const int64_t B = c->B, HV = c->HV, K = c->K, KK = (int64_t)K * K, E = state_elems(&p);
    const size_t es = fqla_dtype_size(c->state), ios = fqla_dtype_size(c->io);
    fqla_context *ref = ref_context();
    gpu d;
    memset(&d, 0, sizeof d);
    d.ctx = gpu_context();
    /* pool: P_big entries on the device (only the used ones and their
     * neighbours are ever written from the host), a compact host pool */
    int64_t P = P_big > 0 ? P_big : p.P;
    if (P_big > 0) {
        /* move the active slots to the end of the big pool, past 2^31 elements */
        for (int64_t b = 0; b < B; b++)
            if (p.slots[b] >= 0) p.slots[b] = P - 2 - 3 * b;
    }
    int64_t *slots_compact = malloc(sizeof(int64_t) * B);
    int64_t P_host = B;
    double *tmpd = malloc(sizeof(double) * E);
    unsigned char *host_pool = malloc((size_t)(P_host * E) * es);
    for (int64_t b = 0; b < B; b++) {
        slots_compact[b] = p.slots[b] < 0 ? p.slots[b] : b;
        for (int64_t i = 0; i < E; i++) tmpd[i] = 0.5 * check_normal();
        void *enc = encode(tmpd, E, c->state);
        memcpy(host_pool + (size_t)(b * E) * es, enc, (size_t)E * es);
        free(enc);
    }
    size_t dev_pool_bytes = (size_t)(P * E) * es;
    d.pool_alloc = dev_alloc(dev_pool_bytes + 2 * GUARD_BYTES);
    if (!d.pool_alloc) {
        printf("  (could not allocate a %.1f GB pool: case not run)\n", dev_pool_bytes / 1e9);
        CHECK(0, "device allocation of %zu bytes failed", dev_pool_bytes);
        goto done;
    }
    d.pool = (char *)d.pool_alloc + GUARD_BYTES;
    /* neighbours of each used entry (and the guard bands) get a pattern */
    unsigned char *pattern = malloc((size_t)E * es);
    for (size_t i = 0; i < (size_t)E * es; i++) pattern[i] = (unsigned char)(check_uniform() * 256);
    unsigned char guard[GUARD_BYTES];
    for (size_t i = 0; i < GUARD_BYTES; i++) guard[i] = (unsigned char)(check_uniform() * 256);
    h2d(d.pool_alloc, guard, GUARD_BYTES);
    h2d((char *)d.pool + dev_pool_bytes, guard, GUARD_BYTES);
    char *active = calloc((size_t)P, 1);
    for (int64_t b = 0; b < B; b++)
        if (p.slots[b] >= 0) active[p.slots[b]] = 1;
    for (int64_t b = 0; b < B; b++) {
        int64_t s = p.slots[b];
        if (s < 0) continue;
        if (s + 1 < P && !active[s + 1]) h2d((char *)d.pool + (size_t)((s + 1) * E) * es, pattern, (size_t)E * es);
        if (s >= 1 && !active[s - 1]) h2d((char *)d.pool + (size_t)((s - 1) * E) * es, pattern, (size_t)E * es);
        h2d((char *)d.pool + (size_t)(s * E) * es, host_pool + (size_t)(b * E) * es, (size_t)E * es);
    }
    d.o_bytes = (size_t)(B * HV * K) * ios;
    d.o = dev_alloc(d.o_bytes);
    unsigned char *o_dev = malloc(d.o_bytes);
    double *o_ref = malloc(sizeof(double) * B * HV * K);

    int rounds = use_graph ? 2 : 1;
#ifdef FQLA_HAVE_CUDA
    void *stream = NULL, *graph = NULL, *exec = NULL;
#endif
    for (int round = 0; round < rounds; round++) {
        if (round > 0) { /* new data in the same buffers */
            problem p2;
            make_problem(&p2, c);
            memcpy(p.q, p2.q, sizeof(double) * B * p.TT * c->H * K);
            memcpy(p.k, p2.k, sizeof(double) * B * p.TT * c->H * K);
            memcpy(p.v, p2.v, sizeof(double) * B * p.TT * HV * K);
            memcpy(p.g, p2.g, sizeof(double) * B * p.TT * HV);
            memcpy(p.beta, p2.beta, sizeof(double) * B * p.TT * HV);
            problem_free(&p2);
            for (int64_t b = 0; b < B; b++)
                if (p.slots[b] >= 0) {
                    for (int64_t i = 0; i < E; i++) tmpd[i] = 0.5 * check_normal();
                    void *enc = encode(tmpd, E, c->state);
                    memcpy(host_pool + (size_t)(b * E) * es, enc, (size_t)E * es);
                    free(enc);
                    h2d((char *)d.pool + (size_t)(p.slots[b] * E) * es, host_pool + (size_t)(b * E) * es,
                        (size_t)E * es);
                }
        }
        gpu_upload_inputs(&d, &p);
        unsigned char *poison = malloc(d.o_bytes);
        memset(poison, 0xff, d.o_bytes);
        h2d(d.o, poison, d.o_bytes);
        free(poison);

        fqla_decode_args a = gpu_args(&d, &p, c->L, 1, 0);
        a.state_pool.shape[0] = P;
        fqla_status st = FQLA_STATUS_SUCCESS;
#ifdef FQLA_HAVE_CUDA
        if (use_graph && !g_emulate) {
            int e = 0;
            if (round == 0) {
                e = cudaStreamCreate(&stream);
                CHECK(e == 0, "cudaStreamCreate: %s", cudaGetErrorString(e));
                e = cudaStreamBeginCapture(stream, CAPTURE_THREAD_LOCAL);
                CHECK(e == 0, "cudaStreamBeginCapture: %s", cudaGetErrorString(e));
                st = fqla_decode(d.ctx, &a, NULL, 0, stream);
                e = cudaStreamEndCapture(stream, &graph);
                CHECK(e == 0, "cudaStreamEndCapture: %s", cudaGetErrorString(e));
                e = cudaGraphInstantiateWithFlags(&exec, graph, 0);
                CHECK(e == 0, "cudaGraphInstantiate: %s", cudaGetErrorString(e));
            }
            if (exec) {
                e = cudaGraphLaunch(exec, stream);
                CHECK(e == 0, "cudaGraphLaunch: %s", cudaGetErrorString(e));
                e = cudaStreamSynchronize(stream);
                CHECK(e == 0, "graph replay: %s", cudaGetErrorString(e));
            }
        } else
#endif
            st = fqla_decode(d.ctx, &a, NULL, 0, NULL);
        CHECK(st == FQLA_STATUS_SUCCESS, "%s: %s: %s", c->name, fqla_status_string(st), fqla_last_error(d.ctx));
        d2h(o_dev, d.o, d.o_bytes);

        if (use_graph && !g_emulate) {
            /* the replay must equal an eager call bit for bit: save what it
             * wrote, restore the pool entries, run eagerly, compare */
            size_t eb = (size_t)E * es;
            unsigned char *replayed = malloc((size_t)B * eb), *eager = malloc((size_t)B * eb);
            unsigned char *o_eager = malloc(d.o_bytes);
            for (int64_t b = 0; b < B; b++)
                if (p.slots[b] >= 0) {
                    d2h(replayed + b * eb, (char *)d.pool + (size_t)(p.slots[b] * E) * es, eb);
                    h2d((char *)d.pool + (size_t)(p.slots[b] * E) * es, host_pool + b * eb, eb);
                }
            fqla_status se = fqla_decode(d.ctx, &a, NULL, 0, NULL);
            CHECK(se == FQLA_STATUS_SUCCESS, "eager decode: %s", fqla_last_error(d.ctx));
            d2h(o_eager, d.o, d.o_bytes);
            CHECK(memcmp(o_eager, o_dev, d.o_bytes) == 0, "%s: graph replay o differs from eager", c->name);
            for (int64_t b = 0; b < B; b++)
                if (p.slots[b] >= 0) {
                    d2h(eager + b * eb, (char *)d.pool + (size_t)(p.slots[b] * E) * es, eb);
                    CHECK(memcmp(eager + b * eb, replayed + b * eb, eb) == 0,
                          "%s: graph replay state of row %lld differs from eager", c->name, (long long)b);
                }
            free(replayed); free(eager); free(o_eager);
        }

        /* reference on host copies of the same encoded inputs */
        {
            fqla_decode_args r;
            fqla_decode_args_init(&r);
            /* the rounded values as f64: exactly what the GPU read */
            r.q = token_view(p.q, FQLA_DTYPE_F64, 4, B, p.TT, c->H, K, c->L, 1);
            r.k = token_view(p.k, FQLA_DTYPE_F64, 4, B, p.TT, c->H, K, c->L, 1);
            r.v = token_view(p.v, FQLA_DTYPE_F64, 4, B, p.TT, HV, K, c->L, 1);
            r.g = token_view(p.g, FQLA_DTYPE_F64, 3, B, p.TT, HV, 1, c->L, 1);
            r.beta = token_view(p.beta, FQLA_DTYPE_F64, 3, B, p.TT, HV, 1, c->L, 1);
            if (c->gate_in) {
                r.A_log = tensor(p.A_log, FQLA_DTYPE_F32, 1, HV, 0, 0, 0, 0);
                r.dt_bias = tensor(p.dt_bias, FQLA_DTYPE_F32, 1, HV, 0, 0, 0, 0);
            }
            unsigned char *pool_before = malloc((size_t)(P_host * E) * es);
            memcpy(pool_before, host_pool, (size_t)(P_host * E) * es);
            r.state_pool = tensor(host_pool, c->state, 4, P_host, HV, K, K, 0);
            r.slots = tensor(slots_compact, FQLA_DTYPE_I64, 1, B, 0, 0, 0, 0);
            r.o = tensor(o_ref, FQLA_DTYPE_F64, 4, B, 1, HV, K, 0);
            r.opt = p.opt;
            fqla_status sr = fqla_decode(ref, &r, NULL, 0, NULL);
            CHECK(sr == FQLA_STATUS_SUCCESS, "reference decode: %s", fqla_last_error(ref));

            worst wo = {0, -1, -1}, ws = {0, -1, -1};
            unsigned char *entry = malloc((size_t)E * es);
            for (int64_t b = 0; b < B; b++) {
                for (int64_t h = 0; h < HV; h++) {
                    double num = 0, den = 0;
                    int zero = 1;
                    for (int64_t j = 0; j < K; j++) {
                        double x = decode1(o_dev, (b * HV + h) * K + j, c->io), y = o_ref[(b * HV + h) * K + j];
                        num += (x - y) * (x - y); den += y * y;
                        if (!isfinite(x)) num = INFINITY;
                        zero &= x == 0.0;
                    }
                    if (p.slots[b] < 0) CHECK(zero, "%s: padded row %lld not zeroed", c->name, (long long)b);
                    else worst_update(&wo, sqrt(num / den), b, h);
                }
                if (p.slots[b] < 0) continue;
                d2h(entry, (char *)d.pool + (size_t)(p.slots[b] * E) * es, (size_t)E * es);
                for (int64_t h = 0; h < HV; h++) {
                    double num = 0, den = 0;
                    for (int64_t i = 0; i < KK; i++) {
                        double x = decode1(entry, h * KK + i, c->state);
                        double y = decode1(host_pool, b * E + h * KK + i, c->state);
                        num += (x - y) * (x - y); den += y * y;
                        if (!isfinite(x)) num = INFINITY;
                    }
                    worst_update(&ws, sqrt(num / den), b, h);
                }
                /* the neighbours keep their pattern */
                int64_t s = p.slots[b];
                if (s + 1 < P && !active[s + 1]) {
                    d2h(entry, (char *)d.pool + (size_t)((s + 1) * E) * es, (size_t)E * es);
                    CHECK(memcmp(entry, pattern, (size_t)E * es) == 0, "%s: pool entry %lld (unused) changed",
                          c->name, (long long)(s + 1));
                }
            }
            free(entry);
            free(pool_before);
            double thr = thr_for(c);
            /* the state is compared after both sides rounded it to the pool dtype */
            double ts = c->state == FQLA_DTYPE_BF16 ? fmax(thr, 8e-3) : thr;
            printf("  %-34s round %d: o %.2e  state %.2e\n", c->name, round, wo.err, ws.err);
            CHECK(wo.err <= thr, "%s: o rel error %.3e > %.1e at b=%lld h=%lld", c->name, wo.err, thr,
                  (long long)wo.b, (long long)wo.h);
            CHECK(ws.err <= ts, "%s: state rel error %.3e > %.1e at b=%lld h=%lld", c->name, ws.err, ts,
                  (long long)ws.b, (long long)ws.h);
        }
    }
    {
        unsigned char g2[GUARD_BYTES];
        d2h(g2, d.pool_alloc, GUARD_BYTES);
        CHECK(memcmp(g2, guard, GUARD_BYTES) == 0, "%s: guard band before the pool changed", c->name);
        d2h(g2, (char *)d.pool + dev_pool_bytes, GUARD_BYTES);
        CHECK(memcmp(g2, guard, GUARD_BYTES) == 0, "%s: guard band after the pool changed", c->name);
    }
#ifdef FQLA_HAVE_CUDA
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    if (stream) cudaStreamDestroy(stream);
#endif
    free(pattern); free(o_dev); free(o_ref); free(active);
done:
    free(slots_compact); free(tmpd); free(host_pool);
    gpu_free(&d);
    if (ref) fqla_context_destroy(ref);
    problem_free(&p);
}

/* B = 1024 with H = 2, HV = 8 (FLA's fused_recurrent fails here) */
static void batch_1024_h2_hv8(void)
{
    cfg c = {"B1024 H2 HV8 k128 f32", check_quick() ? 64 : 1024, 2, 8, 128, 1, 1, BF16, F32, F32, I32,
             0, 1, 1, 1, 0, 0, 7, 0, 0, 0};
    one_step_vs_reference(&c, 0, 0);
    cfg c2 = {"B1024 H2 HV8 k128 vk bf16st", check_quick() ? 64 : 1024, 2, 8, 128, 1, 1, BF16, F32, BF16, I64,
              1, 1, 1, 1, 0, 0, 7, 0, 0, 0};
    one_step_vs_reference(&c2, 0, 0);
}

/* pool offsets past 2^31 elements: P * HV * K * V > 2^31, active slots at the end */
static void pool_offset_beyond_2_31(void)
{
    cfg c = {"pool > 2^31 elements f32", 4, 1, 2, 128, 1, 1, BF16, F32, F32, I64, 0, 1, 1, 1, 0, 0, 1, 0, 0, 0};
    int64_t P = ((int64_t)1 << 31) / (2 * 128 * 128) + 64; /* 8.6 GB of f32 */
    one_step_vs_reference(&c, P, 0);
}

static void graph_capture_replay(void)
{
    cfg c = {"graph k128 kv f32", 64, 4, 16, 128, 1, 1, BF16, F32, F32, I32, 0, 1, 1, 1, 0, 0, 5, 0, 0, 0};
    one_step_vs_reference(&c, 0, 1);
    cfg c2 = {"graph k128 vk bf16st", 8, 2, 8, 128, 1, 1, BF16, BF16, BF16, I64, 1, 1, 0, 1, 0, 0, 2, 0, 0, 0};
    one_step_vs_reference(&c2, 0, 1);
}

/* a slot >= P without a host copy: NaN rows, nothing written */
static void slot_past_pool(void)
{
    problem p;
    cfg c = {"slot >= P", 3, 1, 2, 64, 1, 1, F32, F32, F32, I32, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    make_problem(&p, &c);
    const int64_t B = c.B, HV = c.HV, K = c.K, E = state_elems(&p);
    gpu d;
    memset(&d, 0, sizeof d);
    d.ctx = gpu_context();
    p.slots[1] = p.P + 3;
    size_t img_bytes;
    double *fin = calloc((size_t)(B * E), sizeof(double));
    for (int64_t i = 0; i < B * E; i++) fin[i] = check_normal();
    unsigned char *img = make_pool_image(&p, fin, &img_bytes), *after = malloc(img_bytes);
    d.pool_alloc = dev_alloc(img_bytes);
    d.pool = (char *)d.pool_alloc + GUARD_BYTES;
    d.o_bytes = (size_t)(B * HV * K) * 4;
    d.o = dev_alloc(d.o_bytes);
    gpu_upload_inputs(&d, &p);
    h2d(d.pool_alloc, img, img_bytes);
    fqla_decode_args a = gpu_args(&d, &p, 0, 1, 0);
    fqla_status st = fqla_decode(d.ctx, &a, NULL, 0, NULL);
    if (g_emulate) {
        /* the host backends check slot values: an error, nothing written */
        CHECK(st == FQLA_STATUS_INVALID_VALUE, "host backend accepted slot >= P");
    } else {
        CHECK(st == FQLA_STATUS_SUCCESS, "%s", fqla_last_error(d.ctx));
        float *o = malloc(d.o_bytes);
        d2h(o, d.o, d.o_bytes);
        int nan_ok = 1, fin_ok = 1;
        for (int64_t h = 0; h < HV; h++)
            for (int64_t j = 0; j < K; j++) {
                nan_ok &= isnan(o[(1 * HV + h) * K + j]);
                fin_ok &= isfinite(o[(0 * HV + h) * K + j]) && isfinite(o[(2 * HV + h) * K + j]);
            }
        CHECK(nan_ok, "row with slot >= P: o is not NaN");
        CHECK(fin_ok, "rows with valid slots: o not finite");
        free(o);
        d2h(after, d.pool_alloc, img_bytes);
        size_t es = 4;
        for (int64_t s = 0; s < p.P; s++) {
            if (s == p.slots[0] || s == p.slots[2]) continue;
            size_t off = GUARD_BYTES + (size_t)(s * E) * es;
            CHECK(memcmp(img + off, after + off, (size_t)E * es) == 0, "pool entry %lld changed", (long long)s);
        }
        CHECK(memcmp(img, after, GUARD_BYTES) == 0 &&
              memcmp(img + img_bytes - GUARD_BYTES, after + img_bytes - GUARD_BYTES, GUARD_BYTES) == 0,
              "guard bands changed");
    }
    free(fin); free(img); free(after);
    gpu_free(&d);
    problem_free(&p);
}

/* what the CUDA kernels reject, with the reason */
static void unsupported_reported(void)
{
    if (g_emulate) return;
    problem p;
    cfg c = {"unsupported", 2, 1, 1, 128, 1, 1, F32, F32, F32, I32, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    make_problem(&p, &c);
    gpu d;
    memset(&d, 0, sizeof d);
    d.ctx = gpu_context();
    size_t bytes = (size_t)(p.P * state_elems(&p)) * 4 + 2 * GUARD_BYTES;
    d.pool_alloc = dev_alloc(bytes);
    d.o = dev_alloc((size_t)(c.B * c.HV * c.K) * 4);
    gpu_upload_inputs(&d, &p);
    /* a pool that starts 4 bytes past a 16-byte boundary */
    d.pool = (char *)d.pool_alloc + 4;
    fqla_decode_args a = gpu_args(&d, &p, 0, 1, 0);
    fqla_status st = fqla_decode_supported(d.ctx, &a);
    CHECK(st == FQLA_STATUS_MISALIGNED, "misaligned pool: got %s", fqla_status_string(st));
    CHECK(strstr(fqla_last_error(d.ctx), "state_pool") != NULL, "message does not name state_pool: %s",
          fqla_last_error(d.ctx));
    gpu_free(&d);
    problem_free(&p);
}

/* argv[1], when given, runs only the cases it names (comma-separated; used to
 * run a small subset under compute-sanitizer) */
static const char *g_filter;

#define RUN(fn)                                                       \
    do {                                                              \
        if (g_filter && !strstr(g_filter, #fn)) break;                \
        if (g_gpu_ok) CHECK_RUN(fn);                                  \
        else check_skip(#fn, g_why);                                  \
    } while (0)

int main(int argc, char **argv)
{
    g_filter = argc > 1 ? argv[1] : NULL;
    check_rng_seed(check_seed());
    const char *em = getenv("FQLA_TEST_DECODE_EMULATE");
    g_emulate = em && *em && *em != '0';
    if (g_emulate) {
        g_gpu_ok = 1;
        printf("emulating the GPU with the CPU reference\n");
    } else {
        g_gpu_ok = fqla_backend_available(FQLA_BACKEND_CUDA, g_why, sizeof g_why) == FQLA_STATUS_SUCCESS;
        if (g_gpu_ok) {
            fqla_context *ctx = NULL;
            if (fqla_context_create(&ctx, FQLA_BACKEND_CUDA, 0) != FQLA_STATUS_SUCCESS) {
                g_gpu_ok = 0;
                snprintf(g_why, sizeof g_why, "CUDA context: %s", fqla_last_error(NULL));
            } else {
                fqla_device_info info;
                fqla_context_info(ctx, &info);
                if (info.cc_major != 9 || info.cc_minor != 0) {
                    g_gpu_ok = 0;
                    snprintf(g_why, sizeof g_why, "GPU %s is sm_%d%d, the kernels are sm_90a", info.name,
                             info.cc_major, info.cc_minor);
                }
                fqla_context_destroy(ctx);
            }
        }
    }
    RUN(chained_decode);
    RUN(every_slice_width);
    RUN(planned_variants);
    RUN(verify_step_states);
    RUN(verify_step_slots);
    RUN(slot_past_pool);
    RUN(batch_1024_h2_hv8);
    RUN(unsupported_reported);
    if (g_emulate && !g_filter) {
        check_skip("graph_capture_replay", "emulation has no CUDA graphs");
        check_skip("pool_offset_beyond_2_31", "emulation: not on the host");
    } else if (!g_emulate) {
        RUN(graph_capture_replay);
        RUN(pool_offset_beyond_2_31);
    }
    return check_summary();
}
