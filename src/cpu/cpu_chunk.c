/*
 * cpu_chunk.c - chunk loading, gates and the gate-free triangular inverse
 * shared by the chunked forward and backward of the fast CPU path, plus the
 * row and state I/O of the CPU backend (see cpu_chunk.h).
 */
#include "cpu/cpu_chunk.h"
#include "cpu/cpu_isa.h"
#include "cpu/gemm.h"
#include "cpu/transforms.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define C64 FQLA_CHUNK

int64_t fqla_chunk_qk_floats(int64_t K)
{
    int64_t Kp = fqla_round8(K);
    return 2 * C64 * Kp + Kp * 2 * C64 + 2 * C64 * C64 + 2 * Kp;
}

float *fqla_chunk_qk_carve(fqla_chunk_qk *s, int64_t K, float *mem)
{
    int64_t Kp = fqla_round8(K);
    s->K = K;
    s->Kp = Kp;
    s->c = s->cp = 0;
    s->QK = mem;
    mem += 2 * C64 * Kp;
    s->QKt = mem;
    mem += Kp * 2 * C64;
    s->QKm = mem;
    mem += C64 * C64;
    s->KK = mem;
    mem += C64 * C64;
    s->row = (double *)(void *)mem; /* 8-float aligned: fine for double */
    return mem + 2 * Kp;
}

int64_t fqla_chunk_head_floats(int64_t V)
{
    return C64 * fqla_round8(V) + 2 * C64 * C64;
}

float *fqla_chunk_head_carve(fqla_chunk_head *s, int64_t V, float *mem)
{
    s->V = V;
    s->Vp = fqla_round8(V);
    s->c = s->cp = 0;
    s->V_ = mem;
    mem += C64 * s->Vp;
    s->G = mem;
    mem += C64 * C64;
    s->A = mem;
    return mem + C64 * C64;
}

float *fqla_cpu_alloc_floats(int64_t n)
{
    if (n < 0 || (uint64_t)n > SIZE_MAX / sizeof(float) - 1)
        return NULL;
    return malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
}

int64_t fqla_cpu_heads_per_item(const fqla_problem *p, int threads)
{
    /* aim for at least two items per worker so uneven sequences balance */
    int64_t pairs = p->N * p->H, want = 2 * (int64_t)(threads > 0 ? threads : 1);
    if (pairs <= 0 || pairs >= want)
        return p->group;
    int64_t split = (want + pairs - 1) / pairs;
    if (split > p->group)
        split = p->group;
    return (p->group + split - 1) / split;
}

float fqla_chunk_exp(double x, int ninf)
{
    if (ninf > 0 || x < -87.0)
        return 0.0f;
    return expf((float)x);
}

void fqla_cpu_load_qk(const fqla_cpu_inputs *in, const fqla_tensor *x, int64_t b, int64_t t,
                      int64_t hk, double *row, float *dst)
{
    int64_t K = in->p->K;
    fqla_load_row_f32(x, fqla_cpu_row_offset(x, b, t, hk), K, dst);
    if (!in->p->opt.use_qk_l2norm)
        return;
    /* the shared fp64 definition, so the normalisation matches the reference */
    for (int64_t i = 0; i < K; i++)
        row[i] = dst[i];
    fqla_l2norm(row, K);
    for (int64_t i = 0; i < K; i++)
        dst[i] = (float)row[i];
}

void fqla_chunk_load_qk(fqla_chunk_qk *s, const fqla_cpu_inputs *in, int64_t b, int64_t t0,
                        int64_t c, int64_t hk, int with_q)
{
    int64_t Kp = s->Kp, cp = fqla_round8(c);
    s->c = c;
    s->cp = cp;
    float *Q = s->QK, *Kr = s->QK + cp * Kp;
    memset(s->QK, 0, (size_t)(2 * cp * Kp) * sizeof(float));
    for (int64_t i = 0; i < c; i++) {
        if (with_q)
            fqla_cpu_load_qk(in, in->q, b, t0 + i, hk, s->row, Q + i * Kp);
        fqla_cpu_load_qk(in, in->k, b, t0 + i, hk, s->row, Kr + i * Kp);
    }
}

void fqla_chunk_prepare_qk(fqla_chunk_qk *s, int with_q)
{
    int64_t cp = s->cp, K = s->K, Kp = s->Kp;
    const float *Kr = s->QK + cp * Kp;
    fqla_transpose(2 * cp, Kp, s->QK, Kp, s->QKt, 2 * cp);
    /* the lower-only products leave blocks above the diagonal unwritten;
     * zero them so element-wise masks never meet stale values */
    memset(s->KK, 0, (size_t)(cp * cp) * sizeof(float));
    fqla_gemm(FQLA_GEMM_C_LOWER, cp, cp, K, Kr, Kp, s->QKt + cp, 2 * cp, s->KK, cp);
    if (with_q) {
        memset(s->QKm, 0, (size_t)(cp * cp) * sizeof(float));
        fqla_gemm(FQLA_GEMM_C_LOWER, cp, cp, K, s->QK, Kp, s->QKt + cp, 2 * cp, s->QKm, cp);
    }
}

/* Columns of row i of A (cp floats per row) below the diagonal:
 * row_i[c] = -sum_{j<i} a[j] row_j[c]; columns >= i are left to the caller. */
static void substitution_row_base(float *A, int64_t cp, int64_t i, const float *a)
{
    float *ri = A + i * cp;
    for (int64_t c0 = 0; c0 < cp; c0 += 8) {
        float lo[4] = {0, 0, 0, 0}, hi[4] = {0, 0, 0, 0};
        for (int64_t j = c0; j < i; j++) {
            const float *rj = A + j * cp + c0;
            float x = a[j];
            for (int q = 0; q < 4; q++) {
                lo[q] -= x * rj[q];
                hi[q] -= x * rj[4 + q];
            }
        }
        for (int q = 0; q < 4; q++) {
            ri[c0 + q] = lo[q];
            ri[c0 + 4 + q] = hi[q];
        }
    }
}

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
#define FQLA_HAVE_AVX512_SUBST 1
/* The same sums, 16 columns per zmm with FMA (a masked last block when
 * cp % 16 == 8); blocks that start at or after column i are all zero. */
__attribute__((target("avx512f"))) static void substitution_row_avx512(float *A, int64_t cp, int64_t i,
                                                                       const float *a)
{
    float *ri = A + i * cp;
    for (int64_t c0 = 0; c0 < cp; c0 += 16) {
        __mmask16 m = cp - c0 >= 16 ? (__mmask16)0xffff : (__mmask16)0x00ff;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t j = c0; j < i; j++)
            acc = _mm512_fnmadd_ps(_mm512_set1_ps(a[j]), _mm512_maskz_loadu_ps(m, A + j * cp + c0), acc);
        _mm512_mask_storeu_ps(ri + c0, m, acc);
    }
}
#endif

#if defined(__aarch64__)
#include <arm_neon.h>
#define FQLA_HAVE_NEON_SUBST 1
/* The same sums, 8 columns per two q registers with FMA (cp % 8 == 0). */
static void substitution_row_neon(float *A, int64_t cp, int64_t i, const float *a)
{
    float *ri = A + i * cp;
    for (int64_t c0 = 0; c0 < cp; c0 += 8) {
        float32x4_t lo = vdupq_n_f32(0.0f), hi = lo;
        for (int64_t j = c0; j < i; j++) {
            const float *rj = A + j * cp + c0;
            lo = vfmsq_n_f32(lo, vld1q_f32(rj), a[j]);
            hi = vfmsq_n_f32(hi, vld1q_f32(rj + 4), a[j]);
        }
        vst1q_f32(ri + c0, lo);
        vst1q_f32(ri + c0 + 4, hi);
    }
}
#endif

static void substitution_row(float *A, int64_t cp, int64_t i, const float *a)
{
#ifdef FQLA_HAVE_AVX512_SUBST
    if (fqla_cpu_isa() >= FQLA_CPU_ISA_AVX512) {
        substitution_row_avx512(A, cp, i, a);
        return;
    }
#endif
#ifdef FQLA_HAVE_NEON_SUBST
    if (fqla_cpu_isa() >= FQLA_CPU_ISA_NEON) {
        substitution_row_neon(A, cp, i, a);
        return;
    }
#endif
    substitution_row_base(A, cp, i, a);
}

void fqla_chunk_load_head(fqla_chunk_head *hd, const fqla_chunk_qk *s, const fqla_cpu_inputs *in,
                          int64_t b, int64_t t0, int64_t h, int with_v)
{
    int64_t V = hd->V, Vp = hd->Vp, c = s->c, cp = s->cp;
    double fin[C64], gsum = 0;
    int ninf[C64], cnt = 0;
    hd->c = c;
    hd->cp = cp;

    for (int64_t i = 0; i < c; i++) {
        int64_t t = t0 + i;
        if (with_v) {
            fqla_load_row_f32(in->v, fqla_cpu_row_offset(in->v, b, t, h), V, hd->V_ + i * Vp);
            memset(hd->V_ + i * Vp + V, 0, (size_t)(Vp - V) * sizeof(float));
        }
        double g = fqla_cpu_gate(in, b, t, h);
        hd->beta[i] = (float)fqla_cpu_beta(in, b, t, h);
        /* -inf gates are counted, not summed (see cpu_chunk.h) */
        if (g == -INFINITY)
            cnt++;
        else
            gsum += g;
        fin[i] = gsum;
        ninf[i] = cnt;
    }
    /* pad tokens: zero v and beta and a zero gate, which adds exactly nothing */
    for (int64_t i = c; i < cp; i++) {
        memset(hd->V_ + i * Vp, 0, (size_t)Vp * sizeof(float));
        hd->beta[i] = 0;
        fin[i] = gsum;
        ninf[i] = cnt;
    }

    /* When every gamma_i lies in [-80, 0] (no -inf, moderate decay) Gamma is
     * the product e_i * exp(-gamma_j) of two normal floats (about 2.5 ulp,
     * one multiply instead of one expf per entry); otherwise each entry is
     * its own exponential of a difference, so strong decay neither
     * overflows exp(-gamma_j) nor underflows the product early. */
    double lo = 0, hi = -1;
    for (int64_t i = 0; i < cp; i++) {
        lo = fin[i] < lo ? fin[i] : lo;
        hi = fin[i] > hi ? fin[i] : hi;
    }
    int product_form = cnt == 0 && lo >= -80.0 && hi <= 0.0;
    float inv[C64];
    for (int64_t i = 0; i < cp; i++) {
        hd->e[i] = fqla_chunk_exp(fin[i], ninf[i]);
        hd->f[i] = fqla_chunk_exp(gsum - fin[i], cnt - ninf[i]);
        inv[i] = product_form ? expf((float)-fin[i]) : 0.0f;
    }
    for (int64_t i = 0; i < cp; i++) {
        float *Gi = hd->G + i * cp;
        if (product_form) {
            for (int64_t j = 0; j < cp; j += 8)
                for (int q = 0; q < 8; q++)
                    Gi[j + q] = hd->e[i] * inv[j + q];
            Gi[i] = 1.0f;
            for (int64_t j = i + 1; j < cp; j++)
                Gi[j] = 0;
        } else {
            for (int64_t j = 0; j <= i; j++)
                Gi[j] = fqla_chunk_exp(fin[i] - fin[j], ninf[i] - ninf[j]);
            for (int64_t j = i + 1; j < cp; j++)
                Gi[j] = 0;
        }
    }
    hd->eC = fqla_chunk_exp(gsum, cnt);

    /* A by forward substitution, row by row:
     *     row_i = e_i - sum_{j<i} a_ij row_j,   a_ij = beta_i Gamma_ij (k_i.k_j).
     * Row j is zero beyond column j, so a block of columns [c0, ...) of row_i
     * takes only the rows j >= c0; each block is summed in registers over j
     * in increasing order. */
    float *A = hd->A;
    float a[C64];
    for (int64_t i = 0; i < cp; i++) {
        float *ri = A + i * cp;
        const float *Gi = hd->G + i * cp;
        for (int64_t j = 0; j < i; j++)
            a[j] = hd->beta[i] * Gi[j] * s->KK[i * cp + j];
        substitution_row(A, cp, i, a);
        /* row i of A is e_i on and above the diagonal */
        ri[i] = 1.0f;
        for (int64_t j = i + 1; j < cp; j++)
            ri[j] = 0.0f;
    }
}

void fqla_cpu_state_load(const fqla_tensor *t, const int64_t *lead, int64_t K, int64_t V,
                         int v_first, float *S, int64_t ld, float *tmp)
{
    int64_t base = fqla_cpu_state_base(t, lead), rs = t->strides[t->ndim - 2];
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
    int64_t base = fqla_cpu_state_base(t, lead), rs = t->strides[t->ndim - 2];
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
