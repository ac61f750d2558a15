/*
 * test_reference.c - the fp64 CPU reference backend (FQLA_BACKEND_CPU_REFERENCE),
 * the oracle of every other path, checked through the public API against
 * oracles written here:
 *   - forward: a per-token dense formulation (S <- exp(g)(I - beta k k^T) S
 *     + beta k v^T, in complex double) and the chunked WY form of docs/design.md §2;
 *   - backward: central finite differences of L = <dO, O> + <dHT, HT> in
 *     fp64 (rel <= 1e-6) for every gradient and every option, and the
 *     complex-step derivative of the dense formulation (exact to rounding, so
 *     it also judges the tiny dg of strong decay, where differences cannot);
 *   - decode chained after a forward equals a longer forward; verify's step
 *     states equal the final states of forwards over the prefixes.
 * All tensors are F64 unless a case says otherwise; inputs are fresh random.
 */
#include "common/check.h"
#include "flashqla.h"

#include <complex.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef double complex cplx;

#define GRAD_TOL 1e-6   /* docs/testing.md: fp64 backward vs finite differences */
#define FWD_TOL 1e-12   /* fp64 forward vs the oracles here */

static fqla_context *ctx;

/* ------------------------------------------------------------------------ */
/* A problem: shapes, options and every input as double arrays               */

typedef struct prob {
    int64_t B, T, H, HV, K, V, N;
    int varlen;
    int64_t cu[8];
    fqla_options opt;
    int has_h0, has_dht;
    double *q, *k, *v, *g, *beta, *A_log, *dt_bias, *h0; /* inputs */
    double *dout, *dht;                                   /* upstream gradients */
} prob;

static int64_t nqk(const prob *P) { return P->B * P->T * P->H * P->K; }
static int64_t nvo(const prob *P) { return P->B * P->T * P->HV * P->V; }
static int64_t ngb(const prob *P) { return P->B * P->T * P->HV; }
static int64_t nst(const prob *P) { return P->N * P->HV * P->K * P->V; }

static double *alloc_d(int64_t n)
{
    double *p = calloc((size_t)(n > 0 ? n : 1), sizeof *p);
    if (!p) { fprintf(stderr, "out of memory\n"); exit(2); }
    return p;
}

static void fill_normal(double *x, int64_t n, double s)
{
    for (int64_t i = 0; i < n; i++) x[i] = s * check_normal();
}

/* Decay modes for g */
enum { G_MODERATE = 0, G_STRONG = 1 };

/* Makes a random problem. cu (ncu entries) selects varlen with B = 1. */
static void prob_make(prob *P, int64_t B, int64_t T, int64_t H, int64_t HV, int64_t K, int64_t V,
                      const int64_t *cu, int ncu, fqla_options opt, int has_h0, int has_dht, int gmode)
{
    memset(P, 0, sizeof *P);
    P->B = B; P->T = T; P->H = H; P->HV = HV; P->K = K; P->V = V;
    P->opt = opt;
    P->has_h0 = has_h0;
    P->has_dht = has_dht;
    if (cu) {
        P->varlen = 1;
        P->N = ncu - 1;
        memcpy(P->cu, cu, (size_t)ncu * sizeof *cu);
    } else {
        P->N = B;
    }
    P->q = alloc_d(nqk(P)); P->k = alloc_d(nqk(P)); P->v = alloc_d(nvo(P));
    P->g = alloc_d(ngb(P)); P->beta = alloc_d(ngb(P));
    P->A_log = alloc_d(HV); P->dt_bias = alloc_d(HV);
    P->h0 = alloc_d(nst(P));
    P->dout = alloc_d(nvo(P)); P->dht = alloc_d(nst(P));

    fill_normal(P->q, nqk(P), 1.0);
    /* without l2norm keep |k| ~ 1 so beta |k|^2 stays in the stable range */
    fill_normal(P->k, nqk(P), opt.use_qk_l2norm ? 1.0 : 1.0 / sqrt((double)K));
    fill_normal(P->v, nvo(P), 1.0);
    for (int64_t i = 0; i < ngb(P); i++) {
        if (gmode == G_STRONG) P->g[i] = -20.0;
        else if (opt.use_gate_in_kernel) P->g[i] = check_normal();
        else P->g[i] = log(0.6 + 0.39 * check_uniform());
        P->beta[i] = opt.use_beta_sigmoid ? check_normal() : 0.1 + 0.8 * check_uniform();
    }
    for (int64_t h = 0; h < HV; h++) {
        P->A_log[h] = -1.5 + 1.3 * check_uniform();
        P->dt_bias[h] = 0.5 * check_normal();
    }
    fill_normal(P->h0, nst(P), 0.5);
    fill_normal(P->dout, nvo(P), 1.0);
    fill_normal(P->dht, nst(P), 1.0);
}

static void prob_free(prob *P)
{
    free(P->q); free(P->k); free(P->v); free(P->g); free(P->beta);
    free(P->A_log); free(P->dt_bias); free(P->h0); free(P->dout); free(P->dht);
}

static double resolved_scale(const prob *P)
{
    return P->opt.scale > 0 ? P->opt.scale : 1.0 / sqrt((double)P->K);
}

static void seq_bounds(const prob *P, int64_t n, int64_t *b, int64_t *start, int64_t *len)
{
    if (P->varlen) { *b = 0; *start = P->cu[n]; *len = P->cu[n + 1] - P->cu[n]; }
    else { *b = n; *start = 0; *len = P->T; }
}

/* Offset of state element (n, h, i over K, j over V) in the caller's layout. */
static int64_t st_idx(const prob *P, int64_t n, int64_t h, int64_t i, int64_t j)
{
    int64_t base = (n * P->HV + h) * P->K * P->V;
    return P->opt.state_v_first ? base + j * P->K + i : base + i * P->V + j;
}

/* ------------------------------------------------------------------------ */
/* Calls into the library                                                    */

static fqla_tensor tens(void *d, fqla_dtype dt, int nd, int64_t a, int64_t b, int64_t c, int64_t e)
{
    int64_t s[4] = {a, b, c, e};
    return fqla_tensor_contiguous(d, dt, nd, s);
}

static fqla_tensor state_tensor(const prob *P, double *d)
{
    return P->opt.state_v_first ? tens(d, FQLA_DTYPE_F64, 4, P->N, P->HV, P->V, P->K)
                                : tens(d, FQLA_DTYPE_F64, 4, P->N, P->HV, P->K, P->V);
}

/* The inputs of P as tensors in a forward args struct. */
static void fill_fwd_inputs(const prob *P, fqla_fwd_args *a)
{
    fqla_fwd_args_init(a);
    a->q = tens(P->q, FQLA_DTYPE_F64, 4, P->B, P->T, P->H, P->K);
    a->k = tens(P->k, FQLA_DTYPE_F64, 4, P->B, P->T, P->H, P->K);
    a->v = tens(P->v, FQLA_DTYPE_F64, 4, P->B, P->T, P->HV, P->V);
    a->g = tens(P->g, FQLA_DTYPE_F64, 3, P->B, P->T, P->HV, 0);
    a->beta = tens(P->beta, FQLA_DTYPE_F64, 3, P->B, P->T, P->HV, 0);
    if (P->opt.use_gate_in_kernel) {
        a->A_log = tens(P->A_log, FQLA_DTYPE_F64, 1, P->HV, 0, 0, 0);
        a->dt_bias = tens(P->dt_bias, FQLA_DTYPE_F64, 1, P->HV, 0, 0, 0);
    }
    if (P->has_h0) a->initial_state = state_tensor(P, P->h0);
    if (P->varlen) a->cu_seqlens = tens((void *)P->cu, FQLA_DTYPE_I64, 1, P->N + 1, 0, 0, 0);
    a->opt = P->opt;
}

static fqla_status run_fwd_ctx(fqla_context *c, const prob *P, double *o, double *ht)
{
    fqla_fwd_args a;
    fill_fwd_inputs(P, &a);
    a.o = tens(o, FQLA_DTYPE_F64, 4, P->B, P->T, P->HV, P->V);
    if (ht) a.final_state = state_tensor(P, ht);
    return fqla_fwd(c, &a, NULL, 0, NULL);
}

static fqla_status run_fwd(const prob *P, double *o, double *ht) { return run_fwd_ctx(ctx, P, o, ht); }

typedef struct grads {
    double *dq, *dk, *dv, *dg, *dbeta, *dh0, *dA_log, *ddt_bias;
} grads;

static void grads_alloc(const prob *P, grads *G)
{
    G->dq = alloc_d(nqk(P)); G->dk = alloc_d(nqk(P)); G->dv = alloc_d(nvo(P));
    G->dg = alloc_d(ngb(P)); G->dbeta = alloc_d(ngb(P)); G->dh0 = alloc_d(nst(P));
    G->dA_log = alloc_d(P->HV); G->ddt_bias = alloc_d(P->HV);
}

static void grads_free(grads *G)
{
    free(G->dq); free(G->dk); free(G->dv); free(G->dg); free(G->dbeta);
    free(G->dh0); free(G->dA_log); free(G->ddt_bias);
}

static fqla_status run_bwd_ctx(fqla_context *c, const prob *P, grads *G)
{
    fqla_fwd_args f;
    fqla_bwd_args a;
    fill_fwd_inputs(P, &f);
    fqla_bwd_args_init(&a);
    a.q = f.q; a.k = f.k; a.v = f.v; a.g = f.g; a.beta = f.beta;
    a.A_log = f.A_log; a.dt_bias = f.dt_bias; a.initial_state = f.initial_state;
    a.cu_seqlens = f.cu_seqlens;
    a.opt = P->opt;
    a.d_o = tens(P->dout, FQLA_DTYPE_F64, 4, P->B, P->T, P->HV, P->V);
    if (P->has_dht) a.d_final_state = state_tensor(P, P->dht);
    a.dq = tens(G->dq, FQLA_DTYPE_F64, 4, P->B, P->T, P->H, P->K);
    a.dk = tens(G->dk, FQLA_DTYPE_F64, 4, P->B, P->T, P->H, P->K);
    a.dv = tens(G->dv, FQLA_DTYPE_F64, 4, P->B, P->T, P->HV, P->V);
    a.dg = tens(G->dg, FQLA_DTYPE_F64, 3, P->B, P->T, P->HV, 0);
    a.dbeta = tens(G->dbeta, FQLA_DTYPE_F64, 3, P->B, P->T, P->HV, 0);
    if (P->has_h0) a.d_initial_state = state_tensor(P, G->dh0);
    if (P->opt.use_gate_in_kernel) {
        a.dA_log = tens(G->dA_log, FQLA_DTYPE_F64, 1, P->HV, 0, 0, 0);
        a.ddt_bias = tens(G->ddt_bias, FQLA_DTYPE_F64, 1, P->HV, 0, 0, 0);
    }
    return fqla_bwd(c, &a, NULL, 0, NULL);
}

static fqla_status run_bwd(const prob *P, grads *G) { return run_bwd_ctx(ctx, P, G); }

/* L = <dO, O> + <dHT, HT> through the library's forward. */
static double lib_loss(const prob *P, double *o, double *ht)
{
    fqla_status st = run_fwd(P, o, ht);
    CHECK(st == FQLA_STATUS_SUCCESS, "fwd: %s", fqla_last_error(ctx));
    double L = 0;
    for (int64_t i = 0; i < nvo(P); i++) L += P->dout[i] * o[i];
    if (P->has_dht)
        for (int64_t i = 0; i < nst(P); i++) L += P->dht[i] * ht[i];
    return L;
}

/* ------------------------------------------------------------------------ */
/* Oracle 1: the per-token dense formulation, in complex double              */

typedef struct cin {
    cplx *q, *k, *v, *g, *beta, *A_log, *dt_bias, *h0;
} cin;

static cplx *to_c(const double *x, int64_t n)
{
    cplx *c = malloc((size_t)(n > 0 ? n : 1) * sizeof *c);
    if (!c) { fprintf(stderr, "out of memory\n"); exit(2); }
    for (int64_t i = 0; i < n; i++) c[i] = x[i];
    return c;
}

static void cin_make(const prob *P, cin *X)
{
    X->q = to_c(P->q, nqk(P)); X->k = to_c(P->k, nqk(P)); X->v = to_c(P->v, nvo(P));
    X->g = to_c(P->g, ngb(P)); X->beta = to_c(P->beta, ngb(P));
    X->A_log = to_c(P->A_log, P->HV); X->dt_bias = to_c(P->dt_bias, P->HV);
    X->h0 = to_c(P->h0, nst(P));
}

static void cin_free(cin *X)
{
    free(X->q); free(X->k); free(X->v); free(X->g); free(X->beta);
    free(X->A_log); free(X->dt_bias); free(X->h0);
}

/* The transformed q, k (normalised in place), gate and beta of one token. */
static void c_transform(const prob *P, const cin *X, int64_t b, int64_t t, int64_t h,
                        cplx *qv, cplx *kv, cplx *gv, cplx *bv)
{
    int64_t K = P->K, hk = h / (P->HV / P->H);
    int64_t qo = ((b * P->T + t) * P->H + hk) * K, go = (b * P->T + t) * P->HV + h;
    cplx sq = 0, sk = 0;
    for (int64_t i = 0; i < K; i++) {
        qv[i] = X->q[qo + i];
        kv[i] = X->k[qo + i];
        sq += qv[i] * qv[i];
        sk += kv[i] * kv[i];
    }
    if (P->opt.use_qk_l2norm) {
        cplx rq = 1.0 / csqrt(sq + 1e-6), rk = 1.0 / csqrt(sk + 1e-6);
        for (int64_t i = 0; i < K; i++) { qv[i] *= rq; kv[i] *= rk; }
    }
    *gv = X->g[go];
    if (P->opt.use_gate_in_kernel)
        *gv = -cexp(X->A_log[h]) * clog(1.0 + cexp(*gv + X->dt_bias[h]));
    *bv = X->beta[go];
    if (P->opt.use_beta_sigmoid)
        *bv = (P->opt.allow_neg_eigval ? 2.0 : 1.0) / (1.0 + cexp(-*bv));
}

/* o [B,T,HV,V] (rows outside every sequence left 0) and ht [N,HV,..]. */
static void dense_forward(const prob *P, const cin *X, cplx *o, cplx *ht)
{
    int64_t K = P->K, V = P->V;
    cplx *S = malloc((size_t)(2 * K * V + K * K + 2 * K) * sizeof *S);
    cplx *Sn = S + K * V, *M = Sn + K * V, *qv = M + K * K, *kv = qv + K;
    double scale = resolved_scale(P);
    for (int64_t i = 0; i < nvo(P); i++) o[i] = 0;
    for (int64_t n = 0; n < P->N; n++) {
        int64_t b, start, len;
        seq_bounds(P, n, &b, &start, &len);
        for (int64_t h = 0; h < P->HV; h++) {
            for (int64_t i = 0; i < K; i++)
                for (int64_t j = 0; j < V; j++)
                    S[i * V + j] = P->has_h0 ? X->h0[st_idx(P, n, h, i, j)] : 0;
            for (int64_t t = start; t < start + len; t++) {
                cplx gv, bv;
                c_transform(P, X, b, t, h, qv, kv, &gv, &bv);
                cplx a = cexp(gv);
                const cplx *vv = X->v + ((b * P->T + t) * P->HV + h) * V;
                /* M = exp(g) (I - beta k k^T), the token's transition matrix */
                for (int64_t i = 0; i < K; i++)
                    for (int64_t l = 0; l < K; l++)
                        M[i * K + l] = a * ((i == l ? 1.0 : 0.0) - bv * kv[i] * kv[l]);
                for (int64_t i = 0; i < K; i++)
                    for (int64_t j = 0; j < V; j++) {
                        cplx acc = bv * kv[i] * vv[j];
                        for (int64_t l = 0; l < K; l++) acc += M[i * K + l] * S[l * V + j];
                        Sn[i * V + j] = acc;
                    }
                memcpy(S, Sn, (size_t)(K * V) * sizeof *S);
                for (int64_t j = 0; j < V; j++) {
                    cplx acc = 0;
                    for (int64_t i = 0; i < K; i++) acc += S[i * V + j] * qv[i];
                    o[((b * P->T + t) * P->HV + h) * V + j] = scale * acc;
                }
            }
            for (int64_t i = 0; i < K; i++)
                for (int64_t j = 0; j < V; j++)
                    ht[st_idx(P, n, h, i, j)] = S[i * V + j];
        }
    }
    free(S);
}

/* Complex-step derivative of L with respect to every element of x (one of
 * X's arrays, n elements): dL/dx_i = Im L(x + i h e_i) / h, no cancellation. */
static void complex_step(const prob *P, cin *X, cplx *x, int64_t n, double *out)
{
    const double h = 1e-30;
    cplx *o = malloc((size_t)nvo(P) * sizeof *o), *ht = malloc((size_t)(nst(P) + 1) * sizeof *ht);
    for (int64_t e = 0; e < n; e++) {
        cplx x0 = x[e];
        x[e] = x0 + h * I;
        dense_forward(P, X, o, ht);
        x[e] = x0;
        double L = 0;
        for (int64_t i = 0; i < nvo(P); i++) L += P->dout[i] * cimag(o[i]);
        if (P->has_dht)
            for (int64_t i = 0; i < nst(P); i++) L += P->dht[i] * cimag(ht[i]);
        out[e] = L / h;
    }
    free(o);
    free(ht);
}

/* ------------------------------------------------------------------------ */
/* Oracle 2: the chunked WY form of docs/design.md §2, in double                  */

static void wy_forward(const prob *P, int64_t C, double *o, double *ht)
{
    int64_t K = P->K, V = P->V;
    cin X;
    cin_make(P, &X);
    double *S = alloc_d(K * V), *Q = alloc_d(C * K), *Kc = alloc_d(C * K), *Vc = alloc_d(C * V);
    double *bc = alloc_d(C), *gam = alloc_d(C), *Ar = alloc_d(C * C), *R = alloc_d(C * V), *U = alloc_d(C * V);
    cplx *qv = malloc((size_t)K * sizeof *qv), *kv = malloc((size_t)K * sizeof *kv);
    double scale = resolved_scale(P);
    memset(o, 0, (size_t)nvo(P) * sizeof *o);
    for (int64_t n = 0; n < P->N; n++) {
        int64_t b, start, len;
        seq_bounds(P, n, &b, &start, &len);
        for (int64_t h = 0; h < P->HV; h++) {
            for (int64_t i = 0; i < K; i++)
                for (int64_t j = 0; j < V; j++)
                    S[i * V + j] = P->has_h0 ? P->h0[st_idx(P, n, h, i, j)] : 0;
            for (int64_t c0 = start; c0 < start + len; c0 += C) {
                int64_t c = start + len - c0 < C ? start + len - c0 : C;
                for (int64_t r = 0; r < c; r++) {
                    cplx gv, bv;
                    c_transform(P, &X, b, c0 + r, h, qv, kv, &gv, &bv);
                    for (int64_t i = 0; i < K; i++) { Q[r * K + i] = creal(qv[i]); Kc[r * K + i] = creal(kv[i]); }
                    for (int64_t j = 0; j < V; j++) Vc[r * V + j] = P->v[((b * P->T + c0 + r) * P->HV + h) * V + j];
                    bc[r] = creal(bv);
                    gam[r] = creal(gv) + (r ? gam[r - 1] : 0);
                }
                /* Ar = (I + StrictLower(diag(beta) K K^T))^-1 by forward substitution */
                for (int64_t r = 0; r < c; r++)
                    for (int64_t s = 0; s < c; s++) {
                        if (s > r) { Ar[r * C + s] = 0; continue; }
                        if (s == r) { Ar[r * C + s] = 1; continue; }
                        double acc = 0;
                        for (int64_t m = s; m < r; m++) {
                            double kk = 0;
                            for (int64_t i = 0; i < K; i++) kk += Kc[r * K + i] * Kc[m * K + i];
                            acc += bc[r] * kk * Ar[m * C + s];
                        }
                        Ar[r * C + s] = -acc;
                    }
                /* R = diag(beta) (V - diag(exp gamma) K S); U = (Gamma . Ar) R */
                for (int64_t r = 0; r < c; r++)
                    for (int64_t j = 0; j < V; j++) {
                        double ks = 0;
                        for (int64_t i = 0; i < K; i++) ks += Kc[r * K + i] * S[i * V + j];
                        R[r * V + j] = bc[r] * (Vc[r * V + j] - exp(gam[r]) * ks);
                    }
                for (int64_t r = 0; r < c; r++)
                    for (int64_t j = 0; j < V; j++) {
                        double acc = 0;
                        for (int64_t s = 0; s <= r; s++) acc += exp(gam[r] - gam[s]) * Ar[r * C + s] * R[s * V + j];
                        U[r * V + j] = acc;
                    }
                /* O = scale (diag(exp gamma) Q S + (Gamma . tril(Q K^T)) U) */
                for (int64_t r = 0; r < c; r++)
                    for (int64_t j = 0; j < V; j++) {
                        double qs = 0, acc = 0;
                        for (int64_t i = 0; i < K; i++) qs += Q[r * K + i] * S[i * V + j];
                        for (int64_t s = 0; s <= r; s++) {
                            double qk = 0;
                            for (int64_t i = 0; i < K; i++) qk += Q[r * K + i] * Kc[s * K + i];
                            acc += exp(gam[r] - gam[s]) * qk * U[s * V + j];
                        }
                        o[((b * P->T + c0 + r) * P->HV + h) * V + j] = scale * (exp(gam[r]) * qs + acc);
                    }
                /* S' = exp(gamma_C) S + K^T diag(exp(gamma_C - gamma)) U */
                for (int64_t i = 0; i < K; i++)
                    for (int64_t j = 0; j < V; j++) {
                        double acc = exp(gam[c - 1]) * S[i * V + j];
                        for (int64_t s = 0; s < c; s++) acc += Kc[s * K + i] * exp(gam[c - 1] - gam[s]) * U[s * V + j];
                        S[i * V + j] = acc;
                    }
            }
            for (int64_t i = 0; i < K; i++)
                for (int64_t j = 0; j < V; j++) ht[st_idx(P, n, h, i, j)] = S[i * V + j];
        }
    }
    free(S); free(Q); free(Kc); free(Vc); free(bc); free(gam); free(Ar); free(R); free(U);
    free(qv); free(kv);
    cin_free(&X);
}

/* ------------------------------------------------------------------------ */
/* Gradient checks                                                           */

/* Central finite differences of lib_loss for every element of x. */
static void finite_diff(prob *P, double *x, int64_t n, double *out)
{
    double *o = alloc_d(nvo(P)), *ht = alloc_d(nst(P));
    for (int64_t e = 0; e < n; e++) {
        double x0 = x[e], h = 1e-5 * (fabs(x0) > 1 ? fabs(x0) : 1);
        x[e] = x0 + h;
        double lp = lib_loss(P, o, ht);
        x[e] = x0 - h;
        double lm = lib_loss(P, o, ht);
        x[e] = x0;
        out[e] = (lp - lm) / (2 * h);
    }
    free(o);
    free(ht);
}

enum { ORACLE_FD = 1, ORACLE_CS = 2 };

/* Compares every gradient the library returns for P with the selected
 * oracles; prints the worst relative error. */
static void check_grads(prob *P, const char *label, int oracles)
{
    grads G;
    grads_alloc(P, &G);
    fqla_status st = run_bwd(P, &G);
    CHECK(st == FQLA_STATUS_SUCCESS, "%s: bwd: %s", label, fqla_last_error(ctx));
    if (st != FQLA_STATUS_SUCCESS) { grads_free(&G); return; }

    cin X;
    cin_make(P, &X);
    struct { const char *name; double *x; cplx *cx; double *grad; int64_t n; int on; } items[] = {
        {"dq", P->q, X.q, G.dq, nqk(P), 1},
        {"dk", P->k, X.k, G.dk, nqk(P), 1},
        {"dv", P->v, X.v, G.dv, nvo(P), 1},
        {"dg", P->g, X.g, G.dg, ngb(P), 1},
        {"dbeta", P->beta, X.beta, G.dbeta, ngb(P), 1},
        {"dh0", P->h0, X.h0, G.dh0, nst(P), P->has_h0},
        {"dA_log", P->A_log, X.A_log, G.dA_log, P->HV, P->opt.use_gate_in_kernel},
        {"ddt_bias", P->dt_bias, X.dt_bias, G.ddt_bias, P->HV, P->opt.use_gate_in_kernel},
    };
    double worst = 0;
    const char *worst_name = "";
    for (size_t it = 0; it < sizeof items / sizeof items[0]; it++) {
        if (!items[it].on) continue;
        double *ref = alloc_d(items[it].n);
        for (int o = ORACLE_FD; o <= ORACLE_CS; o <<= 1) {
            if (!(oracles & o)) continue;
            if (o == ORACLE_FD) finite_diff(P, items[it].x, items[it].n, ref);
            else complex_step(P, &X, items[it].cx, items[it].n, ref);
            double rel = check_rel_error(items[it].grad, ref, items[it].n);
            CHECK(rel <= GRAD_TOL, "%s: %s vs %s: rel %.3e", label, items[it].name,
                  o == ORACLE_FD ? "finite differences" : "complex step", rel);
            if (!(rel <= worst)) { worst = rel; worst_name = items[it].name; }
        }
        free(ref);
    }
    printf("  %s: worst gradient rel %.2e (%s)\n", label, worst, worst_name);
    cin_free(&X);
    grads_free(&G);
}

static fqla_options opts(int l2, int gate, int sig, int neg, int vfirst)
{
    fqla_options o;
    memset(&o, 0, sizeof o);
    o.scale = FQLA_SCALE_DEFAULT;
    o.use_qk_l2norm = l2;
    o.use_gate_in_kernel = gate;
    o.use_beta_sigmoid = sig;
    o.allow_neg_eigval = neg;
    o.state_v_first = vfirst;
    return o;
}

/* ------------------------------------------------------------------------ */
/* Forward cases                                                             */

static void compare_forward(prob *P, const char *label)
{
    double *o = alloc_d(nvo(P)), *ht = alloc_d(nst(P)), *o2 = alloc_d(nvo(P)), *ht2 = alloc_d(nst(P));
    cplx *co = malloc((size_t)nvo(P) * sizeof *co), *cht = malloc((size_t)(nst(P) + 1) * sizeof *cht);
    for (int64_t i = 0; i < nvo(P); i++) o[i] = NAN; /* every row must be written */
    fqla_status st = run_fwd(P, o, ht);
    CHECK(st == FQLA_STATUS_SUCCESS, "%s: fwd: %s", label, fqla_last_error(ctx));

    cin X;
    cin_make(P, &X);
    dense_forward(P, &X, co, cht);
    for (int64_t i = 0; i < nvo(P); i++) o2[i] = creal(co[i]);
    for (int64_t i = 0; i < nst(P); i++) ht2[i] = creal(cht[i]);
    double ro = check_rel_error(o, o2, nvo(P)), rh = check_rel_error(ht, ht2, nst(P));
    CHECK(ro <= FWD_TOL && rh <= FWD_TOL, "%s: vs dense per-token: o rel %.3e, final state rel %.3e", label, ro, rh);

    wy_forward(P, 3, o2, ht2);
    double wo = check_rel_error(o, o2, nvo(P)), wh = check_rel_error(ht, ht2, nst(P));
    CHECK(wo <= FWD_TOL && wh <= FWD_TOL, "%s: vs chunked WY: o rel %.3e, final state rel %.3e", label, wo, wh);
    printf("  %s: o rel %.1e / %.1e, final state rel %.1e / %.1e (dense / WY)\n", label, ro, wo, rh, wh);
    cin_free(&X);
    free(o); free(ht); free(o2); free(ht2); free(co); free(cht);
}

static void fwd_matches_dense_and_wy(void)
{
    prob P;
    prob_make(&P, 2, 9, 1, 2, 4, 5, NULL, 0, opts(0, 0, 0, 0, 0), 1, 1, G_MODERATE);
    compare_forward(&P, "plain B=2 GVA2 h0");
    prob_free(&P);

    int64_t cu[4] = {0, 5, 5, 12};
    prob_make(&P, 1, 14, 2, 4, 5, 3, cu, 4, opts(1, 1, 1, 1, 1), 1, 1, G_MODERATE);
    compare_forward(&P, "varlen+zero-length+trailing, all options, v_first");
    prob_free(&P);
}

/* The forward of a mutated input must move the result: the oracles above are
 * only useful if a wrong library answer is caught (this guards the guard). */
static void fwd_oracles_can_fail(void)
{
    prob P;
    prob_make(&P, 1, 7, 1, 1, 3, 4, NULL, 0, opts(0, 0, 0, 0, 0), 1, 0, G_MODERATE);
    double *o = alloc_d(nvo(&P)), *ht = alloc_d(nst(&P)), *o2 = alloc_d(nvo(&P)), *ht2 = alloc_d(nst(&P));
    CHECK(run_fwd(&P, o, ht) == FQLA_STATUS_SUCCESS, "fwd: %s", fqla_last_error(ctx));
    P.beta[3] += 1e-3; /* the oracle sees a slightly different problem */
    wy_forward(&P, 3, o2, ht2);
    double r = check_rel_error(o, o2, nvo(&P));
    CHECK(r > 1e-8, "a perturbed beta went unnoticed by the WY oracle (rel %.3e)", r);
    free(o); free(ht); free(o2); free(ht2);
    prob_free(&P);
}

/* ------------------------------------------------------------------------ */
/* Backward cases: finite differences on tiny shapes, one feature at a time   */

static void bwd_fd_plain(void)
{
    prob P;
    prob_make(&P, 2, 7, 1, 1, 4, 4, NULL, 0, opts(0, 0, 0, 0, 0), 0, 0, G_MODERATE);
    check_grads(&P, "plain", ORACLE_FD);
    prob_free(&P);
}

static void bwd_fd_h0_dht(void)
{
    prob P;
    prob_make(&P, 1, 9, 1, 2, 5, 4, NULL, 0, opts(0, 0, 0, 0, 0), 1, 1, G_MODERATE);
    check_grads(&P, "h0 + d_final_state", ORACLE_FD);
    prob_free(&P);
}

static void bwd_fd_l2norm(void)
{
    prob P;
    prob_make(&P, 1, 8, 1, 1, 6, 4, NULL, 0, opts(1, 0, 0, 0, 0), 1, 1, G_MODERATE);
    check_grads(&P, "l2norm", ORACLE_FD);
    prob_free(&P);
}

static void bwd_fd_gate_in_kernel(void)
{
    prob P;
    prob_make(&P, 1, 8, 1, 2, 4, 5, NULL, 0, opts(0, 1, 0, 0, 0), 1, 1, G_MODERATE);
    check_grads(&P, "gate in kernel (dA_log, ddt_bias)", ORACLE_FD);
    prob_free(&P);
}

static void bwd_fd_beta_sigmoid_neg_eigval(void)
{
    prob P;
    prob_make(&P, 1, 9, 1, 1, 4, 4, NULL, 0, opts(1, 0, 1, 1, 0), 1, 1, G_MODERATE);
    check_grads(&P, "beta sigmoid + allow_neg_eigval", ORACLE_FD);
    prob_free(&P);
    prob_make(&P, 1, 6, 1, 1, 3, 4, NULL, 0, opts(0, 0, 1, 0, 0), 0, 1, G_MODERATE);
    check_grads(&P, "beta sigmoid", ORACLE_FD);
    prob_free(&P);
}

static void bwd_fd_gva_group2(void)
{
    prob P;
    prob_make(&P, 2, 6, 2, 4, 4, 3, NULL, 0, opts(0, 0, 0, 0, 0), 1, 1, G_MODERATE);
    check_grads(&P, "GVA group 2 (H=2, HV=4)", ORACLE_FD);
    prob_free(&P);
}

static void bwd_fd_varlen_two_sequences(void)
{
    int64_t cu[3] = {0, 4, 9};
    prob P;
    /* T = 11: rows 9 and 10 belong to no sequence */
    prob_make(&P, 1, 11, 1, 2, 4, 4, cu, 3, opts(0, 0, 0, 0, 0), 1, 1, G_MODERATE);
    check_grads(&P, "varlen [0,4,9] T=11", ORACLE_FD);
    grads G;
    grads_alloc(&P, &G);
    for (int64_t i = 0; i < nqk(&P); i++) G.dq[i] = G.dk[i] = NAN;
    for (int64_t i = 0; i < nvo(&P); i++) G.dv[i] = NAN;
    for (int64_t i = 0; i < ngb(&P); i++) G.dg[i] = G.dbeta[i] = NAN;
    CHECK(run_bwd(&P, &G) == FQLA_STATUS_SUCCESS, "bwd: %s", fqla_last_error(ctx));
    int bad = 0;
    for (int64_t t = 9; t < 11; t++) {
        for (int64_t i = 0; i < P.H * P.K; i++) bad += G.dq[t * P.H * P.K + i] != 0 || G.dk[t * P.H * P.K + i] != 0;
        for (int64_t i = 0; i < P.HV * P.V; i++) bad += G.dv[t * P.HV * P.V + i] != 0;
        for (int64_t i = 0; i < P.HV; i++) bad += G.dg[t * P.HV + i] != 0 || G.dbeta[t * P.HV + i] != 0;
    }
    CHECK(bad == 0, "%d gradient entries of uncovered rows are not zero", bad);
    grads_free(&G);
    prob_free(&P);
}

static void bwd_fd_state_v_first(void)
{
    prob P;
    prob_make(&P, 1, 7, 1, 1, 3, 5, NULL, 0, opts(0, 0, 0, 0, 1), 1, 1, G_MODERATE);
    check_grads(&P, "state_v_first (K=3, V=5)", ORACLE_FD);
    prob_free(&P);
}

static void bwd_all_options_fd_and_complex_step(void)
{
    int64_t cu[3] = {0, 3, 8};
    prob P;
    prob_make(&P, 1, 9, 1, 2, 4, 3, cu, 3, opts(1, 1, 1, 1, 1), 1, 1, G_MODERATE);
    P.opt.scale = 0.7;
    check_grads(&P, "every option at once", ORACLE_FD | ORACLE_CS);
    prob_free(&P);
}

/* T = 140 crosses two checkpoint blocks of 64: the recomputation from
 * checkpoints must give the same gradients. */
static void bwd_across_checkpoint_blocks(void)
{
    int64_t T = check_quick() ? 70 : 140;
    prob P;
    prob_make(&P, 1, T, 1, 1, 2, 3, NULL, 0, opts(0, 0, 0, 0, 0), 1, 1, G_MODERATE);
    /* slow decay so early tokens still matter at the end */
    for (int64_t i = 0; i < ngb(&P); i++) P.g[i] = -0.02 * check_uniform();
    check_grads(&P, "T across 64-token checkpoints", ORACLE_FD);
    prob_free(&P);
}

/* g = -20 on every token: the true dg is ~ e^-20. Finite differences cannot
 * resolve it (the loss is O(1)), the complex step can. */
static void bwd_strong_decay_dg(void)
{
    prob P;
    prob_make(&P, 1, 8, 1, 2, 4, 4, NULL, 0, opts(0, 0, 0, 0, 0), 1, 1, G_STRONG);
    check_grads(&P, "strong decay g=-20", ORACLE_CS);
    /* and the mixed case: strong decay on half the tokens */
    prob_free(&P);
    prob_make(&P, 1, 9, 1, 1, 3, 4, NULL, 0, opts(1, 0, 1, 0, 0), 1, 1, G_MODERATE);
    for (int64_t i = 0; i < ngb(&P); i += 2) P.g[i] = -20.0;
    check_grads(&P, "alternating g=-20", ORACLE_CS);
    prob_free(&P);
}

/* One g = -inf wipes the state: outputs from there on equal a fresh start,
 * and the backward stays finite. */
static void g_minus_inf(void)
{
    prob P, Q;
    prob_make(&P, 1, 8, 1, 1, 3, 3, NULL, 0, opts(0, 0, 0, 0, 0), 1, 1, G_MODERATE);
    int64_t cut = 4;
    P.g[cut] = -INFINITY;
    double *o = alloc_d(nvo(&P)), *ht = alloc_d(nst(&P));
    CHECK(run_fwd(&P, o, ht) == FQLA_STATUS_SUCCESS, "fwd: %s", fqla_last_error(ctx));
    /* the suffix alone, from a zero state (g of its first token is irrelevant) */
    prob_make(&Q, 1, 8 - cut, 1, 1, 3, 3, NULL, 0, opts(0, 0, 0, 0, 0), 0, 1, G_MODERATE);
    memcpy(Q.q, P.q + cut * 3, (size_t)(8 - cut) * 3 * sizeof(double));
    memcpy(Q.k, P.k + cut * 3, (size_t)(8 - cut) * 3 * sizeof(double));
    memcpy(Q.v, P.v + cut * 3, (size_t)(8 - cut) * 3 * sizeof(double));
    memcpy(Q.g, P.g + cut, (size_t)(8 - cut) * sizeof(double));
    memcpy(Q.beta, P.beta + cut, (size_t)(8 - cut) * sizeof(double));
    double *o2 = alloc_d(nvo(&Q)), *ht2 = alloc_d(nst(&Q));
    CHECK(run_fwd(&Q, o2, ht2) == FQLA_STATUS_SUCCESS, "fwd: %s", fqla_last_error(ctx));
    double r = check_rel_error(o + cut * 3, o2, nvo(&Q)), rh = check_rel_error(ht, ht2, nst(&Q));
    CHECK(r <= FWD_TOL && rh <= FWD_TOL, "after g=-inf: o rel %.3e, final rel %.3e", r, rh);
    grads G;
    grads_alloc(&P, &G);
    CHECK(run_bwd(&P, &G) == FQLA_STATUS_SUCCESS, "bwd: %s", fqla_last_error(ctx));
    int nonfinite = 0;
    for (int64_t i = 0; i < nqk(&P); i++) nonfinite += !isfinite(G.dq[i]) || !isfinite(G.dk[i]);
    for (int64_t i = 0; i < nvo(&P); i++) nonfinite += !isfinite(G.dv[i]);
    for (int64_t i = 0; i < ngb(&P); i++) nonfinite += !isfinite(G.dg[i]) || !isfinite(G.dbeta[i]);
    for (int64_t i = 0; i < nst(&P); i++) nonfinite += !isfinite(G.dh0[i]);
    CHECK(nonfinite == 0, "%d gradients are not finite", nonfinite);
    /* nothing flows back through the wiped state: the tokens before the cut
     * get the gradients of the prefix alone (without d_final_state) */
    prob R;
    prob_make(&R, 1, cut, 1, 1, 3, 3, NULL, 0, opts(0, 0, 0, 0, 0), 1, 0, G_MODERATE);
    memcpy(R.q, P.q, (size_t)cut * 3 * sizeof(double));
    memcpy(R.k, P.k, (size_t)cut * 3 * sizeof(double));
    memcpy(R.v, P.v, (size_t)cut * 3 * sizeof(double));
    memcpy(R.dout, P.dout, (size_t)cut * 3 * sizeof(double));
    memcpy(R.g, P.g, (size_t)cut * sizeof(double));
    memcpy(R.beta, P.beta, (size_t)cut * sizeof(double));
    memcpy(R.h0, P.h0, (size_t)nst(&R) * sizeof(double));
    grads GR;
    grads_alloc(&R, &GR);
    CHECK(run_bwd(&R, &GR) == FQLA_STATUS_SUCCESS, "bwd: %s", fqla_last_error(ctx));
    double e = fmax(fmax(check_rel_error(G.dq, GR.dq, nqk(&R)), check_rel_error(G.dk, GR.dk, nqk(&R))),
                    fmax(check_rel_error(G.dv, GR.dv, nvo(&R)), check_rel_error(G.dh0, GR.dh0, nst(&R))));
    e = fmax(e, fmax(check_rel_error(G.dg, GR.dg, ngb(&R)), check_rel_error(G.dbeta, GR.dbeta, ngb(&R))));
    CHECK(e <= FWD_TOL, "gradients before g=-inf differ from the prefix alone: rel %.3e", e);
    CHECK(G.dg[cut] == 0, "dg at the g=-inf token is %g, want 0", G.dg[cut]);
    grads_free(&GR);
    prob_free(&R);
    grads_free(&G);
    free(o); free(ht); free(o2); free(ht2);
    prob_free(&P);
    prob_free(&Q);
}

/* ------------------------------------------------------------------------ */
/* Storage dtypes, strides, threads                                          */

/* f32 inputs and outputs, bf16 initial state: the reference reads them
 * exactly and computes in double, so it agrees with the F64 run on the same
 * values up to the final f32 rounding. */
static void fwd_f32_bf16_storage(void)
{
    prob P;
    prob_make(&P, 1, 9, 1, 2, 4, 4, NULL, 0, opts(1, 1, 1, 0, 0), 1, 0, G_MODERATE);
    int64_t nq = nqk(&P), nv = nvo(&P), ng = ngb(&P), ns = nst(&P);
    float *q = malloc((size_t)nq * 4), *k = malloc((size_t)nq * 4), *v = malloc((size_t)nv * 4);
    float *g = malloc((size_t)ng * 4), *be = malloc((size_t)ng * 4), *o = malloc((size_t)nv * 4);
    float *ht = malloc((size_t)ns * 4), *Al = malloc((size_t)P.HV * 4), *dt = malloc((size_t)P.HV * 4);
    uint16_t *h0 = malloc((size_t)ns * 2);
    /* round the F64 problem to what the narrow tensors hold */
    for (int64_t i = 0; i < nq; i++) { q[i] = (float)P.q[i]; P.q[i] = q[i]; k[i] = (float)P.k[i]; P.k[i] = k[i]; }
    for (int64_t i = 0; i < nv; i++) { v[i] = (float)P.v[i]; P.v[i] = v[i]; }
    for (int64_t i = 0; i < ng; i++) { g[i] = (float)P.g[i]; P.g[i] = g[i]; be[i] = (float)P.beta[i]; P.beta[i] = be[i]; }
    for (int64_t h = 0; h < P.HV; h++) { Al[h] = (float)P.A_log[h]; P.A_log[h] = Al[h]; dt[h] = (float)P.dt_bias[h]; P.dt_bias[h] = dt[h]; }
    for (int64_t i = 0; i < ns; i++) {
        float f = (float)P.h0[i];
        uint32_t u;
        memcpy(&u, &f, 4);
        u &= 0xffff0000u; /* truncate to a bf16-representable value */
        memcpy(&f, &u, 4);
        P.h0[i] = f;
        h0[i] = (uint16_t)(u >> 16);
    }
    fqla_fwd_args a;
    fqla_fwd_args_init(&a);
    a.q = tens(q, FQLA_DTYPE_F32, 4, P.B, P.T, P.H, P.K);
    a.k = tens(k, FQLA_DTYPE_F32, 4, P.B, P.T, P.H, P.K);
    a.v = tens(v, FQLA_DTYPE_F32, 4, P.B, P.T, P.HV, P.V);
    a.g = tens(g, FQLA_DTYPE_F32, 3, P.B, P.T, P.HV, 0);
    a.beta = tens(be, FQLA_DTYPE_F32, 3, P.B, P.T, P.HV, 0);
    a.A_log = tens(Al, FQLA_DTYPE_F32, 1, P.HV, 0, 0, 0);
    a.dt_bias = tens(dt, FQLA_DTYPE_F32, 1, P.HV, 0, 0, 0);
    a.initial_state = tens(h0, FQLA_DTYPE_BF16, 4, P.N, P.HV, P.K, P.V);
    a.o = tens(o, FQLA_DTYPE_F32, 4, P.B, P.T, P.HV, P.V);
    a.final_state = tens(ht, FQLA_DTYPE_F32, 4, P.N, P.HV, P.K, P.V);
    a.opt = P.opt;
    fqla_status st = fqla_fwd(ctx, &a, NULL, 0, NULL);
    CHECK(st == FQLA_STATUS_SUCCESS, "fwd f32/bf16: %s", fqla_last_error(ctx));
    double *o64 = alloc_d(nv), *ht64 = alloc_d(ns), *od = alloc_d(nv), *htd = alloc_d(ns);
    CHECK(run_fwd(&P, o64, ht64) == FQLA_STATUS_SUCCESS, "fwd f64: %s", fqla_last_error(ctx));
    for (int64_t i = 0; i < nv; i++) od[i] = o[i];
    for (int64_t i = 0; i < ns; i++) htd[i] = ht[i];
    double ro = check_rel_error(od, o64, nv), rh = check_rel_error(htd, ht64, ns);
    CHECK(ro < 1e-7 && rh < 1e-7, "f32 storage vs f64: o rel %.3e, final rel %.3e", ro, rh);
    free(q); free(k); free(v); free(g); free(be); free(o); free(ht); free(Al); free(dt); free(h0);
    free(o64); free(ht64); free(od); free(htd);
    prob_free(&P);
}

/* q and v with padded (non-contiguous) head strides give bit-identical o. */
static void fwd_strided_inputs(void)
{
    prob P;
    prob_make(&P, 2, 5, 1, 2, 3, 4, NULL, 0, opts(0, 0, 0, 0, 0), 1, 1, G_MODERATE);
    double *o = alloc_d(nvo(&P)), *ht = alloc_d(nst(&P));
    CHECK(run_fwd(&P, o, ht) == FQLA_STATUS_SUCCESS, "fwd: %s", fqla_last_error(ctx));
    const int64_t pad = 3;
    double *qs = alloc_d(P.B * P.T * P.H * (P.K + pad)), *vs = alloc_d(P.B * P.T * P.HV * (P.V + pad));
    for (int64_t r = 0; r < P.B * P.T * P.H; r++)
        for (int64_t i = 0; i < P.K + pad; i++) qs[r * (P.K + pad) + i] = i < P.K ? P.q[r * P.K + i] : NAN;
    for (int64_t r = 0; r < P.B * P.T * P.HV; r++)
        for (int64_t i = 0; i < P.V + pad; i++) vs[r * (P.V + pad) + i] = i < P.V ? P.v[r * P.V + i] : NAN;
    fqla_fwd_args a;
    fill_fwd_inputs(&P, &a);
    a.q.data = qs;
    a.q.strides[2] = P.K + pad; a.q.strides[1] = P.H * (P.K + pad); a.q.strides[0] = P.T * P.H * (P.K + pad);
    a.v.data = vs;
    a.v.strides[2] = P.V + pad; a.v.strides[1] = P.HV * (P.V + pad); a.v.strides[0] = P.T * P.HV * (P.V + pad);
    double *o2 = alloc_d(nvo(&P)), *ht2 = alloc_d(nst(&P));
    a.o = tens(o2, FQLA_DTYPE_F64, 4, P.B, P.T, P.HV, P.V);
    a.final_state = state_tensor(&P, ht2);
    CHECK(fqla_fwd(ctx, &a, NULL, 0, NULL) == FQLA_STATUS_SUCCESS, "strided fwd: %s", fqla_last_error(ctx));
    CHECK(memcmp(o, o2, (size_t)nvo(&P) * sizeof *o) == 0, "strided o differs from contiguous");
    CHECK(memcmp(ht, ht2, (size_t)nst(&P) * sizeof *ht) == 0, "strided final state differs");
    free(o); free(ht); free(o2); free(ht2); free(qs); free(vs);
    prob_free(&P);
}

/* 4 threads and 1 thread give bit-identical forward and backward results. */
static void threads_deterministic(void)
{
    fqla_context *c4 = NULL;
    CHECK(fqla_context_create(&c4, FQLA_BACKEND_CPU_REFERENCE, 0) == FQLA_STATUS_SUCCESS, "create");
    if (!c4) return;
    fqla_context_set_threads(c4, 4);
    fqla_context_set_threads(ctx, 1);
    int64_t cu[4] = {0, 30, 31, 70};
    prob P;
    prob_make(&P, 1, 72, 2, 4, 5, 6, cu, 4, opts(1, 1, 1, 1, 0), 1, 1, G_MODERATE);
    double *o1 = alloc_d(nvo(&P)), *o4 = alloc_d(nvo(&P)), *h1 = alloc_d(nst(&P)), *h4 = alloc_d(nst(&P));
    CHECK(run_fwd_ctx(ctx, &P, o1, h1) == FQLA_STATUS_SUCCESS, "fwd: %s", fqla_last_error(ctx));
    CHECK(run_fwd_ctx(c4, &P, o4, h4) == FQLA_STATUS_SUCCESS, "fwd: %s", fqla_last_error(c4));
    CHECK(memcmp(o1, o4, (size_t)nvo(&P) * 8) == 0 && memcmp(h1, h4, (size_t)nst(&P) * 8) == 0,
          "forward differs between 1 and 4 threads");
    grads G1, G4;
    grads_alloc(&P, &G1);
    grads_alloc(&P, &G4);
    CHECK(run_bwd_ctx(ctx, &P, &G1) == FQLA_STATUS_SUCCESS, "bwd: %s", fqla_last_error(ctx));
    CHECK(run_bwd_ctx(c4, &P, &G4) == FQLA_STATUS_SUCCESS, "bwd: %s", fqla_last_error(c4));
    int same = !memcmp(G1.dq, G4.dq, (size_t)nqk(&P) * 8) && !memcmp(G1.dk, G4.dk, (size_t)nqk(&P) * 8) &&
               !memcmp(G1.dv, G4.dv, (size_t)nvo(&P) * 8) && !memcmp(G1.dg, G4.dg, (size_t)ngb(&P) * 8) &&
               !memcmp(G1.dbeta, G4.dbeta, (size_t)ngb(&P) * 8) && !memcmp(G1.dh0, G4.dh0, (size_t)nst(&P) * 8) &&
               !memcmp(G1.dA_log, G4.dA_log, (size_t)P.HV * 8) && !memcmp(G1.ddt_bias, G4.ddt_bias, (size_t)P.HV * 8);
    CHECK(same, "backward differs between 1 and 4 threads");
    grads_free(&G1);
    grads_free(&G4);
    free(o1); free(o4); free(h1); free(h4);
    prob_free(&P);
    fqla_context_destroy(c4);
}

static void not_supported_names_size(void)
{
    const int64_t dims[2][2] = {{1025, 4}, {4, 1025}};
    for (int c = 0; c < 2; c++) {
        int64_t K = dims[c][0], V = dims[c][1];
        double *q = alloc_d(K), *k = alloc_d(K), *v = alloc_d(V), *o = alloc_d(V), g = -0.1, be = 0.5;
        fqla_fwd_args a;
        fqla_fwd_args_init(&a);
        a.q = tens(q, FQLA_DTYPE_F64, 4, 1, 1, 1, K);
        a.k = tens(k, FQLA_DTYPE_F64, 4, 1, 1, 1, K);
        a.v = tens(v, FQLA_DTYPE_F64, 4, 1, 1, 1, V);
        a.g = tens(&g, FQLA_DTYPE_F64, 3, 1, 1, 1, 0);
        a.beta = tens(&be, FQLA_DTYPE_F64, 3, 1, 1, 1, 0);
        a.o = tens(o, FQLA_DTYPE_F64, 4, 1, 1, 1, V);
        fqla_status st = fqla_fwd_supported(ctx, &a);
        CHECK(st == FQLA_STATUS_NOT_SUPPORTED, "K=%lld V=%lld: status %s", (long long)K, (long long)V,
              fqla_status_string(st));
        CHECK(strstr(fqla_last_error(ctx), "1025") != NULL, "message does not name the size: %s", fqla_last_error(ctx));
        o[0] = 42;
        st = fqla_fwd(ctx, &a, NULL, 0, NULL);
        CHECK(st == FQLA_STATUS_NOT_SUPPORTED && o[0] == 42, "fwd ran or wrote for an unsupported size");
        free(q); free(k); free(v); free(o);
    }
    /* the largest supported size runs */
    {
        int64_t K = 1024, V = 1;
        double *q = alloc_d(K), *k = alloc_d(K), v = 1.5, o = NAN, g = -0.1, be = 0.5;
        fill_normal(q, K, 1.0);
        fill_normal(k, K, 1.0);
        fqla_fwd_args a;
        fqla_fwd_args_init(&a);
        a.q = tens(q, FQLA_DTYPE_F64, 4, 1, 1, 1, K);
        a.k = tens(k, FQLA_DTYPE_F64, 4, 1, 1, 1, K);
        a.v = tens(&v, FQLA_DTYPE_F64, 4, 1, 1, 1, V);
        a.g = tens(&g, FQLA_DTYPE_F64, 3, 1, 1, 1, 0);
        a.beta = tens(&be, FQLA_DTYPE_F64, 3, 1, 1, 1, 0);
        a.o = tens(&o, FQLA_DTYPE_F64, 4, 1, 1, 1, V);
        CHECK(fqla_fwd(ctx, &a, NULL, 0, NULL) == FQLA_STATUS_SUCCESS, "K=1024: %s", fqla_last_error(ctx));
        /* one token from zero: o = scale <q, k> beta v */
        double qk = 0;
        for (int64_t i = 0; i < K; i++) qk += q[i] * k[i];
        double want = qk * 0.5 * 1.5 / 32.0;
        CHECK(fabs(o - want) <= 1e-12 * (1 + fabs(want)), "K=1024 one token: o %.17g, want %.17g", o, want);
        free(q); free(k);
    }
}

/* ------------------------------------------------------------------------ */
/* Decode and verify                                                         */

/* A view of rows [t0, t0 + len) of P's arrays (strides of the full T). */
static fqla_tensor view(double *d, int64_t B, int64_t T, int64_t Hd, int64_t D, int64_t t0, int64_t len, int nd)
{
    fqla_tensor x = nd == 4 ? tens(d, FQLA_DTYPE_F64, 4, B, T, Hd, D) : tens(d, FQLA_DTYPE_F64, 3, B, T, Hd, 0);
    x.shape[1] = len;
    x.data = d + t0 * x.strides[1];
    return x;
}

/* Forward over tokens [0, len) of every row; final states into ht. */
static fqla_status fwd_prefix(const prob *P, int64_t len, double *o, double *ht)
{
    fqla_fwd_args a;
    fill_fwd_inputs(P, &a);
    a.q = view(P->q, P->B, P->T, P->H, P->K, 0, len, 4);
    a.k = view(P->k, P->B, P->T, P->H, P->K, 0, len, 4);
    a.v = view(P->v, P->B, P->T, P->HV, P->V, 0, len, 4);
    a.g = view(P->g, P->B, P->T, P->HV, 0, 0, len, 3);
    a.beta = view(P->beta, P->B, P->T, P->HV, 0, 0, len, 3);
    a.o = tens(o, FQLA_DTYPE_F64, 4, P->B, len, P->HV, P->V);
    a.final_state = state_tensor(P, ht);
    return fqla_fwd(ctx, &a, NULL, 0, NULL);
}

static void decode_inputs(const prob *P, fqla_decode_args *a, int64_t t0, int64_t len)
{
    fqla_decode_args_init(a);
    a->q = view(P->q, P->B, P->T, P->H, P->K, t0, len, 4);
    a->k = view(P->k, P->B, P->T, P->H, P->K, t0, len, 4);
    a->v = view(P->v, P->B, P->T, P->HV, P->V, t0, len, 4);
    a->g = view(P->g, P->B, P->T, P->HV, 0, t0, len, 3);
    a->beta = view(P->beta, P->B, P->T, P->HV, 0, t0, len, 3);
    if (P->opt.use_gate_in_kernel) {
        a->A_log = tens(P->A_log, FQLA_DTYPE_F64, 1, P->HV, 0, 0, 0);
        a->dt_bias = tens(P->dt_bias, FQLA_DTYPE_F64, 1, P->HV, 0, 0, 0);
    }
    a->opt = P->opt;
}

static fqla_tensor pool_tensor(const prob *P, double *d, int64_t nslots)
{
    return P->opt.state_v_first ? tens(d, FQLA_DTYPE_F64, 4, nslots, P->HV, P->V, P->K)
                                : tens(d, FQLA_DTYPE_F64, 4, nslots, P->HV, P->K, P->V);
}

/* Rows 0 and 2 are live sequences in pool slots 2 and 0; row 1 is padding. */
static const int64_t dec_slots[3] = {2, -1, 0};

static void decode_chain_case(fqla_options opt, const char *label)
{
    const int64_t L = 5, steps = 4, Pn = 4;
    prob P;
    prob_make(&P, 3, L + steps, 1, 2, 4, 3, NULL, 0, opt, 0, 0, G_MODERATE);
    int64_t S1 = P.HV * P.K * P.V; /* one slot */
    double *o_full = alloc_d(nvo(&P)), *ht_full = alloc_d(nst(&P));
    double *o_pre = alloc_d(nvo(&P)), *ht_pre = alloc_d(nst(&P));
    CHECK(fwd_prefix(&P, L + steps, o_full, ht_full) == FQLA_STATUS_SUCCESS, "fwd: %s", fqla_last_error(ctx));
    CHECK(fwd_prefix(&P, L, o_pre, ht_pre) == FQLA_STATUS_SUCCESS, "fwd prefix: %s", fqla_last_error(ctx));

    double *pool = alloc_d(Pn * S1), *pool0 = alloc_d(Pn * S1);
    fill_normal(pool, Pn * S1, 1.0); /* unused slots hold garbage that must survive */
    for (int64_t b = 0; b < 3; b++)
        if (dec_slots[b] >= 0) memcpy(pool + dec_slots[b] * S1, ht_pre + b * S1, (size_t)S1 * 8);
    memcpy(pool0, pool, (size_t)(Pn * S1) * 8);

    double *o = alloc_d(3 * P.HV * P.V);
    double worst = 0;
    for (int64_t s = 0; s < steps; s++) {
        fqla_decode_args a;
        decode_inputs(&P, &a, L + s, 1);
        a.state_pool = pool_tensor(&P, pool, Pn);
        a.slots = tens((void *)dec_slots, FQLA_DTYPE_I64, 1, 3, 0, 0, 0);
        for (int64_t i = 0; i < 3 * P.HV * P.V; i++) o[i] = NAN;
        a.o = tens(o, FQLA_DTYPE_F64, 4, 3, 1, P.HV, P.V);
        fqla_status st = fqla_decode(ctx, &a, NULL, 0, NULL);
        CHECK(st == FQLA_STATUS_SUCCESS, "%s: decode: %s", label, fqla_last_error(ctx));
        for (int64_t b = 0; b < 3; b++) {
            const double *row = o + b * P.HV * P.V;
            if (dec_slots[b] < 0) {
                int nz = 0;
                for (int64_t i = 0; i < P.HV * P.V; i++) nz += row[i] != 0;
                CHECK(nz == 0, "%s: padding row o not zeroed", label);
                continue;
            }
            double r = check_rel_error(row, o_full + ((b * P.T + L + s) * P.HV) * P.V, P.HV * P.V);
            CHECK(r <= FWD_TOL, "%s: step %lld row %lld: o rel %.3e", label, (long long)s, (long long)b, r);
            if (r > worst) worst = r;
        }
    }
    for (int64_t b = 0; b < 3; b++)
        if (dec_slots[b] >= 0) {
            double r = check_rel_error(pool + dec_slots[b] * S1, ht_full + b * S1, S1);
            CHECK(r <= FWD_TOL, "%s: pool state after decode rel %.3e", label, r);
            if (r > worst) worst = r;
        }
    CHECK(memcmp(pool + 1 * S1, pool0 + 1 * S1, (size_t)S1 * 8) == 0 &&
          memcmp(pool + 3 * S1, pool0 + 3 * S1, (size_t)S1 * 8) == 0, "%s: unused pool slots changed", label);
    printf("  %s: decode x%lld vs forward, worst rel %.2e\n", label, (long long)steps, worst);
    free(o_full); free(ht_full); free(o_pre); free(ht_pre); free(pool); free(pool0); free(o);
    prob_free(&P);
}

static void decode_chain_equals_forward(void)
{
    decode_chain_case(opts(0, 0, 0, 0, 0), "plain");
    decode_chain_case(opts(1, 1, 1, 1, 1), "all options, v_first");
}

static void verify_case(int v_first)
{
    const int64_t L = 4, Td = 3, Pn = 7;
    prob P;
    prob_make(&P, 3, L + Td, 1, 2, 3, 4, NULL, 0, opts(1, 1, 1, 0, v_first), 0, 0, G_MODERATE);
    int64_t S1 = P.HV * P.K * P.V;
    double *o_full = alloc_d(nvo(&P)), *ht = alloc_d(nst(&P));
    CHECK(fwd_prefix(&P, L + Td, o_full, ht) == FQLA_STATUS_SUCCESS, "fwd: %s", fqla_last_error(ctx));
    /* the prefix states the verify must reproduce: prefix[t] after L + t + 1 tokens */
    double *prefix = alloc_d((Td + 1) * nst(&P)), *otmp = alloc_d(nvo(&P));
    for (int64_t t = 0; t <= Td; t++)
        CHECK(fwd_prefix(&P, L + t, otmp, prefix + t * nst(&P)) == FQLA_STATUS_SUCCESS, "fwd prefix");

    double *pool = alloc_d(Pn * S1), *pool0 = alloc_d(Pn * S1);
    fill_normal(pool, Pn * S1, 1.0);
    for (int64_t b = 0; b < 3; b++)
        if (dec_slots[b] >= 0) memcpy(pool + dec_slots[b] * S1, prefix + b * S1, (size_t)S1 * 8);
    memcpy(pool0, pool, (size_t)(Pn * S1) * 8);

    /* (a) step_states */
    double *steps = alloc_d(3 * Td * S1), *o = alloc_d(3 * Td * P.HV * P.V);
    for (int64_t i = 0; i < 3 * Td * S1; i++) steps[i] = NAN;
    fqla_decode_args a;
    decode_inputs(&P, &a, L, Td);
    a.state_pool = pool_tensor(&P, pool, Pn);
    a.slots = tens((void *)dec_slots, FQLA_DTYPE_I64, 1, 3, 0, 0, 0);
    a.o = tens(o, FQLA_DTYPE_F64, 4, 3, Td, P.HV, P.V);
    {
        int64_t s5[5] = {3, Td, P.HV, v_first ? P.V : P.K, v_first ? P.K : P.V};
        a.step_states = fqla_tensor_contiguous(steps, FQLA_DTYPE_F64, 5, s5);
    }
    fqla_status st = fqla_verify(ctx, &a, NULL, 0, NULL);
    CHECK(st == FQLA_STATUS_SUCCESS, "verify (step_states): %s", fqla_last_error(ctx));
    double worst = 0;
    for (int64_t b = 0; b < 3; b++) {
        if (dec_slots[b] < 0) continue;
        for (int64_t t = 0; t < Td; t++) {
            double r = check_rel_error(steps + (b * Td + t) * S1, prefix + (t + 1) * nst(&P) + b * S1, S1);
            CHECK(r <= FWD_TOL, "step state b=%lld t=%lld rel %.3e", (long long)b, (long long)t, r);
            double ro = check_rel_error(o + (b * Td + t) * P.HV * P.V, o_full + (b * P.T + L + t) * P.HV * P.V, P.HV * P.V);
            CHECK(ro <= FWD_TOL, "verify o b=%lld t=%lld rel %.3e", (long long)b, (long long)t, ro);
            worst = fmax(worst, fmax(r, ro));
        }
    }
    int untouched = 1;
    for (int64_t i = 0; i < Td * S1; i++) untouched &= isnan(steps[1 * Td * S1 + i]);
    CHECK(untouched, "step states of the padding row were written");
    CHECK(memcmp(pool, pool0, (size_t)(Pn * S1) * 8) == 0, "verify with step_states changed the pool");

    /* (b) step_slots: row 0 keeps tokens 0 and 2, row 2 tokens 1 and 2;
     * the padding row names slot 5, which must stay untouched. */
    const int64_t step_slots[9] = {3, -1, 4, 5, -1, -1, -1, 6, 1};
    decode_inputs(&P, &a, L, Td);
    a.state_pool = pool_tensor(&P, pool, Pn);
    a.slots = tens((void *)dec_slots, FQLA_DTYPE_I64, 1, 3, 0, 0, 0);
    a.o = tens(o, FQLA_DTYPE_F64, 4, 3, Td, P.HV, P.V);
    a.step_slots = tens((void *)step_slots, FQLA_DTYPE_I64, 2, 3, Td, 0, 0);
    st = fqla_verify(ctx, &a, NULL, 0, NULL);
    CHECK(st == FQLA_STATUS_SUCCESS, "verify (step_slots): %s", fqla_last_error(ctx));
    struct { int64_t slot, b, t; } kept[4] = {{3, 0, 0}, {4, 0, 2}, {6, 2, 1}, {1, 2, 2}};
    for (int i = 0; i < 4; i++) {
        double r = check_rel_error(pool + kept[i].slot * S1, prefix + (kept[i].t + 1) * nst(&P) + kept[i].b * S1, S1);
        CHECK(r <= FWD_TOL, "pool slot %lld (row %lld token %lld) rel %.3e", (long long)kept[i].slot,
              (long long)kept[i].b, (long long)kept[i].t, r);
        worst = fmax(worst, r);
    }
    for (int64_t s = 0; s < Pn; s += (s == 0 ? 2 : 3)) /* slots 0, 2, 5: read slots and the padding row's */
        CHECK(memcmp(pool + s * S1, pool0 + s * S1, (size_t)S1 * 8) == 0, "pool slot %lld changed", (long long)s);
    printf("  verify (state_v_first %d): worst rel %.2e\n", v_first, worst);
    free(o_full); free(ht); free(prefix); free(otmp); free(pool); free(pool0); free(steps); free(o);
    prob_free(&P);
}

static void verify_step_states_equal_prefix_forwards(void)
{
    verify_case(0);
    verify_case(1);
}

/* ------------------------------------------------------------------------ */

int main(void)
{
    check_rng_seed(check_seed());
    if (fqla_context_create(&ctx, FQLA_BACKEND_CPU_REFERENCE, 0) != FQLA_STATUS_SUCCESS) {
        printf("FAIL create: %s\n", fqla_last_error(NULL));
        printf("0 passed, 1 failed, 0 skipped\n");
        return 1;
    }
    CHECK_RUN(fwd_matches_dense_and_wy);
    CHECK_RUN(fwd_oracles_can_fail);
    CHECK_RUN(bwd_fd_plain);
    CHECK_RUN(bwd_fd_h0_dht);
    CHECK_RUN(bwd_fd_l2norm);
    CHECK_RUN(bwd_fd_gate_in_kernel);
    CHECK_RUN(bwd_fd_beta_sigmoid_neg_eigval);
    CHECK_RUN(bwd_fd_gva_group2);
    CHECK_RUN(bwd_fd_varlen_two_sequences);
    CHECK_RUN(bwd_fd_state_v_first);
    CHECK_RUN(bwd_all_options_fd_and_complex_step);
    CHECK_RUN(bwd_across_checkpoint_blocks);
    CHECK_RUN(bwd_strong_decay_dg);
    CHECK_RUN(g_minus_inf);
    CHECK_RUN(fwd_f32_bf16_storage);
    CHECK_RUN(fwd_strided_inputs);
    CHECK_RUN(threads_deterministic);
    CHECK_RUN(not_supported_names_size);
    CHECK_RUN(decode_chain_equals_forward);
    CHECK_RUN(verify_step_states_equal_prefix_forwards);
    fqla_context_destroy(ctx);
    return check_summary();
}
