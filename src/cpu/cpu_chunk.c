/*
 * cpu_chunk.c - chunk loading, gates and the gate-free triangular inverse
 * shared by the chunked forward and backward of the fast CPU path, plus the
 * row and state I/O of the CPU backend (see cpu_chunk.h).
 */
#include "cpu/cpu_chunk.h"
#include "cpu/gemm.h"
#include "cpu/transforms.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define C64 FQLA_CHUNK

int64_t fqla_chunk_floats(int64_t K, int64_t V)
{
    int64_t Kp = fqla_round8(K), Vp = fqla_round8(V), M = fqla_round8(K > V ? K : V);
    return 2 * C64 * Kp      /* QK */
           + Kp * 2 * C64    /* QKt */
           + C64 * Vp        /* V */
           + 4 * C64 * C64   /* G, KK, QKm, Ar */
           + 2 * M + M;      /* row (double), rowf */
}

void fqla_chunk_carve(fqla_chunk *ch, int64_t K, int64_t V, float *mem)
{
    int64_t Kp = fqla_round8(K), Vp = fqla_round8(V), M = fqla_round8(K > V ? K : V);
    ch->K = K;
    ch->V = V;
    ch->Kp = Kp;
    ch->Vp = Vp;
    ch->c = ch->cp = 0;
    ch->QK = mem;
    mem += 2 * C64 * Kp;
    ch->QKt = mem;
    mem += Kp * 2 * C64;
    ch->V_ = mem;
    mem += C64 * Vp;
    ch->G = mem;
    mem += C64 * C64;
    ch->KK = mem;
    mem += C64 * C64;
    ch->QKm = mem;
    mem += C64 * C64;
    ch->Ar = mem;
    mem += C64 * C64;
    ch->row = (double *)(void *)mem; /* mem is 8-float (32-byte) aligned here */
    mem += 2 * M;
    ch->rowf = mem;
}

float *fqla_cpu_alloc_floats(int64_t n)
{
    if (n < 0 || (uint64_t)n > SIZE_MAX / sizeof(float) - 1)
        return NULL;
    return malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
}

float fqla_chunk_exp(double x, int ninf)
{
    if (ninf > 0 || x < -87.0)
        return 0.0f;
    return expf((float)x);
}

int64_t fqla_cpu_row_offset(const fqla_tensor *x, int64_t b, int64_t t, int64_t h)
{
    return b * x->strides[0] + t * x->strides[1] + h * x->strides[2];
}

void fqla_cpu_load_qk(const fqla_cpu_inputs *in, const fqla_tensor *x, int64_t b, int64_t t,
                      int64_t hk, double *row, float *dst)
{
    int64_t K = in->p->K;
    int64_t off = fqla_cpu_row_offset(x, b, t, hk);
    fqla_load_row_f32(x, off, K, dst);
    if (!in->p->opt.use_qk_l2norm)
        return;
    /* the shared fp64 definition, so the normalisation matches the reference */
    for (int64_t i = 0; i < K; i++)
        row[i] = dst[i];
    fqla_l2norm(row, K);
    for (int64_t i = 0; i < K; i++)
        dst[i] = (float)row[i];
}

double fqla_cpu_gate(const fqla_cpu_inputs *in, int64_t b, int64_t t, int64_t h)
{
    double g = fqla_load(in->g, fqla_cpu_row_offset(in->g, b, t, h));
    if (in->p->opt.use_gate_in_kernel)
        g = fqla_gate_value(g, fqla_load(in->A_log, h * in->A_log->strides[0]),
                            fqla_load(in->dt_bias, h * in->dt_bias->strides[0]));
    return g;
}

double fqla_cpu_beta(const fqla_cpu_inputs *in, int64_t b, int64_t t, int64_t h)
{
    double beta = fqla_load(in->beta, fqla_cpu_row_offset(in->beta, b, t, h));
    if (in->p->opt.use_beta_sigmoid)
        beta = fqla_beta_value(beta, in->p->opt.allow_neg_eigval);
    return beta;
}

void fqla_chunk_load(fqla_chunk *ch, const fqla_cpu_inputs *in, int64_t b, int64_t t0,
                     int64_t c, int64_t h, int with_q)
{
    const fqla_problem *p = in->p;
    int64_t K = ch->K, V = ch->V, Kp = ch->Kp, Vp = ch->Vp, hk = h / p->group;
    int64_t cp = fqla_round8(c);
    double fin[C64], gsum = 0;
    int ninf[C64], cnt = 0;
    ch->c = c;
    ch->cp = cp;
    float *Q = ch->QK, *Kr = ch->QK + cp * Kp;

    for (int64_t i = 0; i < c; i++) {
        int64_t t = t0 + i;
        if (with_q) {
            fqla_cpu_load_qk(in, in->q, b, t, hk, ch->row, Q + i * Kp);
            memset(Q + i * Kp + K, 0, (size_t)(Kp - K) * sizeof(float));
        }
        fqla_cpu_load_qk(in, in->k, b, t, hk, ch->row, Kr + i * Kp);
        memset(Kr + i * Kp + K, 0, (size_t)(Kp - K) * sizeof(float));
        fqla_load_row_f32(in->v, fqla_cpu_row_offset(in->v, b, t, h), V, ch->V_ + i * Vp);
        memset(ch->V_ + i * Vp + V, 0, (size_t)(Vp - V) * sizeof(float));
        double g = fqla_cpu_gate(in, b, t, h);
        ch->beta[i] = (float)fqla_cpu_beta(in, b, t, h);
        /* -inf gates are counted, not summed (see cpu_chunk.h) */
        if (g == -INFINITY)
            cnt++;
        else
            gsum += g;
        fin[i] = gsum;
        ninf[i] = cnt;
    }
    /* pad tokens: zero q, k, v, beta and a zero gate, which adds exactly nothing */
    for (int64_t i = c; i < cp; i++) {
        memset(Q + i * Kp, 0, (size_t)Kp * sizeof(float));
        memset(Kr + i * Kp, 0, (size_t)Kp * sizeof(float));
        memset(ch->V_ + i * Vp, 0, (size_t)Vp * sizeof(float));
        ch->beta[i] = 0;
        fin[i] = gsum;
        ninf[i] = cnt;
    }
    if (!with_q)
        memset(Q, 0, (size_t)(cp * Kp) * sizeof(float));

    for (int64_t i = 0; i < cp; i++) {
        ch->e[i] = fqla_chunk_exp(fin[i], ninf[i]);
        ch->f[i] = fqla_chunk_exp(gsum - fin[i], cnt - ninf[i]);
        float *Gi = ch->G + i * cp;
        for (int64_t j = 0; j <= i; j++)
            Gi[j] = fqla_chunk_exp(fin[i] - fin[j], ninf[i] - ninf[j]);
        for (int64_t j = i + 1; j < cp; j++)
            Gi[j] = 0;
    }
    ch->eC = fqla_chunk_exp(gsum, cnt);
}

void fqla_chunk_prepare(fqla_chunk *ch, int with_q)
{
    int64_t cp = ch->cp, K = ch->K, Kp = ch->Kp;
    const float *Kr = ch->QK + cp * Kp;
    fqla_transpose(2 * cp, Kp, ch->QK, Kp, ch->QKt, 2 * cp);
    /* the lower-only products leave blocks above the diagonal unwritten;
     * zero them so element-wise masks never meet stale values */
    memset(ch->KK, 0, (size_t)(cp * cp) * sizeof(float));
    if (with_q)
        memset(ch->QKm, 0, (size_t)(cp * cp) * sizeof(float));
    fqla_gemm(FQLA_GEMM_C_LOWER, cp, cp, K, Kr, Kp, ch->QKt + cp, 2 * cp, ch->KK, cp);
    if (with_q)
        fqla_gemm(FQLA_GEMM_C_LOWER, cp, cp, K, ch->QK, Kp, ch->QKt + cp, 2 * cp, ch->QKm, cp);

    /* Ar by forward substitution: row_i = e_i - sum_{j<i} beta_i (k_i.k_j) row_j.
     * Row j is zero beyond column j, so the update runs over round8(j + 1). */
    float *Ar = ch->Ar;
    for (int64_t i = 0; i < cp; i++) {
        float *ri = Ar + i * cp;
        memset(ri, 0, (size_t)cp * sizeof(float));
        ri[i] = 1.0f;
        for (int64_t j = 0; j < i; j++) {
            float a = ch->beta[i] * ch->KK[i * cp + j];
            if (a != 0.0f)
                fqla_axpy8(fqla_round8(j + 1), -a, Ar + j * cp, ri);
        }
    }
}

void fqla_cpu_state_load(const fqla_tensor *t, const int64_t *lead, int64_t K, int64_t V,
                         int v_first, float *S, int64_t ld, float *tmp)
{
    int nd = t->ndim;
    int64_t base = 0;
    for (int d = 0; d < nd - 2; d++)
        base += lead[d] * t->strides[d];
    int64_t rs = t->strides[nd - 2];
    if (!v_first) {
        for (int64_t i = 0; i < K; i++)
            fqla_load_row_f32(t, base + i * rs, V, S + i * ld);
        return;
    }
    for (int64_t j = 0; j < V; j++) {
        fqla_load_row_f32(t, base + j * rs, K, tmp);
        for (int64_t i = 0; i < K; i++)
            S[i * ld + j] = tmp[i];
    }
}

void fqla_cpu_state_store(const fqla_tensor *t, const int64_t *lead, int64_t K, int64_t V,
                          int v_first, const float *S, int64_t ld, float *tmp)
{
    int nd = t->ndim;
    int64_t base = 0;
    for (int d = 0; d < nd - 2; d++)
        base += lead[d] * t->strides[d];
    int64_t rs = t->strides[nd - 2];
    if (!v_first) {
        for (int64_t i = 0; i < K; i++)
            fqla_store_row_f32(t, base + i * rs, V, S + i * ld);
        return;
    }
    for (int64_t j = 0; j < V; j++) {
        for (int64_t i = 0; i < K; i++)
            tmp[i] = S[i * ld + j];
        fqla_store_row_f32(t, base + j * rs, K, tmp);
    }
}

void fqla_cpu_zero_rows(const fqla_tensor *x, int64_t b, int64_t t0, int64_t t1)
{
    if (!x || !x->data || t1 <= t0)
        return;
    int64_t heads = x->shape[2];
    int64_t n = x->ndim == 4 ? x->shape[3] : 1;
    float zeros[256];
    memset(zeros, 0, sizeof zeros);
    for (int64_t t = t0; t < t1; t++)
        for (int64_t h = 0; h < heads; h++) {
            int64_t off = fqla_cpu_row_offset(x, b, t, h);
            for (int64_t j = 0; j < n; j += 256)
                fqla_store_row_f32(x, off + j, n - j < 256 ? n - j : 256, zeros);
        }
}

void fqla_cpu_zero_uncovered(const fqla_problem *p, const fqla_tensor *x)
{
    if (!p->varlen)
        return; /* without cu_seqlens every row belongs to its batch row's sequence */
    int64_t end = 0;
    if (p->N > 0) {
        int64_t b, start, len;
        fqla_seq_bounds(p, p->N - 1, &b, &start, &len);
        end = start + len;
    }
    for (int64_t b = 0; b < p->B; b++)
        fqla_cpu_zero_rows(x, b, end, p->T);
}
