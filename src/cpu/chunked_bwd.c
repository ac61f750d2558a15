/*
 * chunked_bwd.c - the backward of the fast CPU backend: the reverse mode of
 * the chunked forward (chunked_fwd.c, docs/design.md §2) in fp32, with dg and
 * dbeta assembled in fp64.
 *
 * Work items: one per (sequence, q/k head), covering the value heads of its
 * GVA group in lockstep, so dq and dk are summed over the group inside the
 * item in a fixed order (no races, bit-identical for any thread count);
 * dA_log and ddt_bias are summed per item and reduced over sequences in
 * order afterwards.
 *
 * An item makes two passes over its sequence:
 *   1. forward, chunk by chunk: stores, per value head, the state entering
 *      every chunk and the chunk's X = V - diag(e) K S;
 *   2. backward, chunks in reverse: loads q, k once per chunk, recomputes
 *      U from the stored X, and propagates dS (gradient w.r.t. the state
 *      leaving the chunk) to the state entering it. The rows of dq, dk of a
 *      chunk are complete once the chunk's value heads are done, and are
 *      stored at once (after the l2norm backward when the forward
 *      normalised q, k).
 * Keeping X means pass 2 never forms [Q; K] S (a fifth of its work): the
 * two inner products that need it, (Q S)_i . do_i and (K S)_i . dx_i, are
 * q_i . (S do_i) and k_i . (S dx_i), read off the product [dO; dX] S^T that
 * dq and dk need anyway.
 *
 * Chunk forward (notation of cpu_chunk.h; T~ = A = (I + L)^-1 with
 * L = StrictLower(diag(beta) (Gamma . K K^T)), i.e. Gamma . Ar formed with
 * Gamma inside; P~ = scale Gamma . tril(Q K^T)):
 * W = [Q; K] S,  X = V - diag(e) K S,  Y = diag(beta) X,
 * U = T~ Y,  O = scale diag(e) Q S + P~ U,  S' = e_C S + K^T diag(f) U.
 * Its reverse, given dO and dS' (the order below is the code's):
 *   dU   = P~^T dO + diag(f) K dS'            df_j = (K dS')_j . u_j
 *   dP~  = dO U^T,  dT~ = dU Y^T (strict lower),  dY = T~^T dU
 *   dbeta_i = x_i . dy_i,  dX = diag(beta) dY = dV
 *   G2 = [dO; dX] S^T:  de_i = scale q_i . G2_i - k_i . G2_(C+i),
 *                       [dQ; dK] = [scale diag(e); -diag(e)] G2
 *   Z = [scale diag(e) dO; -diag(e) dX]:  dS = e_C dS' + [Q; K]^T Z
 *   dK  += diag(f) U dS'^T,                de_C = <S, dS'>
 *   dL = -T~^T dT~ T~^T (strict lower)
 *   dbeta_i += sum_j dL_ij Gamma_ij k_i.k_j,  M = diag(beta) (Gamma . dL),
 *   dK += (M + M^T) K
 *   dQ~ = scale Gamma . dP~ (lower):  dQ += dQ~ K,  dK += dQ~^T Q
 * and the gate: with R_ij = Gamma_ij (dL_ij beta_i k_i.k_j + scale dP~_ij q_i.k_j)
 * (i > j; Gamma enters through L and P~), the gradient of token t's log decay is the sum of exactly the
 * terms whose exponent contains g_t:
 *   dg_t = sum_{i>=t} de_i e_i + sum_{j<t} df_j f_j + de_C e_C
 *        + sum_{i>=t>j} R_ij
 * summed in fp64 from the terms themselves - never as a difference of
 * cumulative sums - so a tiny dg under strong decay (about e^g) keeps its
 * relative accuracy. Diagonal Gamma_ii = 1 and f_C = 1 do not depend on any
 * gate and are left out.
 *
 * With only dh0 asked for (fqla_problem.dh0_only) pass 1 is skipped: the
 * reverse chain dS' -> dS needs dO, P~, T~ and q, k, never the states or X
 * (chunk_backward_dstate runs those of chunk_backward's steps alone).
 *
 * Memory per worker: the entering states and X of the group,
 * group * chunks * (K + 64) * V floats (24 MiB at T = 8192, K = V = 128,
 * group 2), plus a few hundred KiB of chunk buffers.
 */
#include "cpu/cpu_chunk.h"
#include "cpu/gemm.h"
#include "cpu/threads.h"
#include "cpu/transforms.h"

#include <stdlib.h>
#include <string.h>

#define C64 FQLA_CHUNK

typedef struct bwd_job {
    const fqla_problem *p;
    const fqla_bwd_args *a;
    fqla_cpu_inputs in;
    int64_t chunks_max;   /* chunks of the longest sequence */
    int64_t kept_chunks;  /* chunks whose states and X each worker keeps: chunks_max, or 0
                             when only dh0 is asked for (pass 2 then needs neither) */
    float *scratch;
    int64_t per_worker;   /* floats of scratch per worker */
    double *dA_log_part;  /* [N, HV] per-item partial sums (use_gate_in_kernel) */
    double *ddt_bias_part;
} bwd_job;

/* One worker's buffers ([rows, cols] as used; allocated for cp = 64). */
typedef struct bwd_bufs {
    fqla_chunk_qk qk;
    fqla_chunk_head hd;
    float *states;          /* [group, chunks_max, Kp, Vp] entering states */
    float *xs;              /* [group, chunks_max, 64, Vp] X of every chunk */
    float *dS;              /* [group, Kp, Vp] gradient w.r.t. the state leaving the chunk */
    float *DD, *Z;          /* [2 cp, Vp]: DD = [dO; dX] */
    float *KS, *Y, *U, *KdS, *dU, *Uf; /* [cp, Vp] */
    float *Ut, *Yt;         /* [Vp, cp] */
    float *St, *dSt;        /* [Vp, Kp] */
    float *dQK, *dQKsum;    /* [2 cp, Kp] dQ; dK of one head / of the group (dQK holds G2 first) */
    float *Tt, *P, *Pt, *dP, *dT, *Ttt, *dAr, *Art, *M1, *dLn, *Msym, *dQt, *dQtT; /* [cp, cp] */
    float *tmp;             /* [max(K, V)] */
    double *xr, *dxr, *dx;  /* [Kp] l2norm backward rows */
} bwd_bufs;

static int64_t bwd_floats(int64_t K, int64_t V, int64_t group, int64_t chunks)
{
    int64_t Kp = fqla_round8(K), Vp = fqla_round8(V), M = fqla_round8(K > V ? K : V);
    return fqla_chunk_qk_floats(K) + fqla_chunk_head_floats(V) + group * chunks * (Kp + C64) * Vp +
           group * Kp * Vp + 2 * 2 * C64 * Vp + 6 * C64 * Vp + 2 * Vp * C64 + 2 * Vp * Kp +
           2 * 2 * C64 * Kp + 13 * C64 * C64 + M + 3 * 2 * Kp;
}

static float *take(float **mem, int64_t n)
{
    float *x = *mem;
    *mem += n;
    return x;
}

static void bwd_carve(bwd_bufs *s, int64_t K, int64_t V, int64_t group, int64_t chunks, float *mem)
{
    int64_t Kp = fqla_round8(K), Vp = fqla_round8(V), M = fqla_round8(K > V ? K : V);
    mem = fqla_chunk_qk_carve(&s->qk, K, mem);
    mem = fqla_chunk_head_carve(&s->hd, V, mem);
    s->states = take(&mem, group * chunks * Kp * Vp);
    s->xs = take(&mem, group * chunks * C64 * Vp);
    s->dS = take(&mem, group * Kp * Vp);
    s->DD = take(&mem, 2 * C64 * Vp);
    s->Z = take(&mem, 2 * C64 * Vp);
    s->KS = take(&mem, C64 * Vp);
    s->Y = take(&mem, C64 * Vp);
    s->U = take(&mem, C64 * Vp);
    s->KdS = take(&mem, C64 * Vp);
    s->dU = take(&mem, C64 * Vp);
    s->Uf = take(&mem, C64 * Vp);
    s->Ut = take(&mem, Vp * C64);
    s->Yt = take(&mem, Vp * C64);
    s->St = take(&mem, Vp * Kp);
    s->dSt = take(&mem, Vp * Kp);
    s->dQK = take(&mem, 2 * C64 * Kp);
    s->dQKsum = take(&mem, 2 * C64 * Kp);
    s->Tt = take(&mem, C64 * C64);
    s->P = take(&mem, C64 * C64);
    s->Pt = take(&mem, C64 * C64);
    s->dP = take(&mem, C64 * C64);
    s->dT = take(&mem, C64 * C64);
    s->Ttt = take(&mem, C64 * C64);
    s->dAr = take(&mem, C64 * C64);
    s->Art = take(&mem, C64 * C64);
    s->M1 = take(&mem, C64 * C64);
    s->dLn = take(&mem, C64 * C64);
    s->Msym = take(&mem, C64 * C64);
    s->dQt = take(&mem, C64 * C64);
    s->dQtT = take(&mem, C64 * C64);
    s->tmp = take(&mem, M);
    s->xr = (double *)(void *)take(&mem, 2 * Kp);
    s->dxr = (double *)(void *)take(&mem, 2 * Kp);
    s->dx = (double *)(void *)take(&mem, 2 * Kp);
}

/* X = V - diag(e) K S into X (pass 1 only: the head part must be loaded
 * with v). */
static void chunk_x(bwd_bufs *s, const float *S, float *X)
{
    const fqla_chunk_qk *qk = &s->qk;
    const fqla_chunk_head *hd = &s->hd;
    int64_t cp = qk->cp, K = qk->K, Kp = qk->Kp, Vp = hd->Vp;
    fqla_gemm(0, cp, Vp, K, qk->QK + cp * Kp, Kp, S, Vp, s->KS, Vp);
    for (int64_t i = 0; i < cp; i++)
        fqla_xpay8(Vp, hd->V_ + i * Vp, -hd->e[i], s->KS + i * Vp, X + i * Vp);
}

/* Y = diag(beta) X and U = T~ Y, T~ = A = Gamma . Ar (hd->A), of one head. */
static void chunk_u(bwd_bufs *s, const float *X)
{
    const fqla_chunk_head *hd = &s->hd;
    int64_t cp = s->qk.cp, Vp = hd->Vp;
    for (int64_t i = 0; i < cp; i++) {
        memcpy(s->Tt + i * cp, hd->A + i * cp, (size_t)cp * sizeof(float));
        for (int64_t j = 0; j < Vp; j += 8)
            for (int c = 0; c < 8; c++)
                s->Y[i * Vp + j + c] = hd->beta[i] * X[i * Vp + j + c];
    }
    fqla_gemm(FQLA_GEMM_A_LOWER, cp, Vp, cp, s->Tt, cp, s->Y, Vp, s->U, Vp);
}

/* S_next = e_C S + K^T diag(f) U (pass 1 only, so the dQK buffer, unused
 * there, holds K^T diag(f) [Kp, cp]). */
static void chunk_next_state(bwd_bufs *s, const float *S, float *S_next)
{
    const fqla_chunk_qk *qk = &s->qk;
    const fqla_chunk_head *hd = &s->hd;
    int64_t cp = qk->cp, Kp = qk->Kp, Vp = hd->Vp;
    float *Kf = s->dQK;
    for (int64_t r = 0; r < Kp; r++)
        fqla_mul8(cp, qk->QKt + r * 2 * cp + cp, hd->f, Kf + r * cp);
    for (int64_t x = 0; x < Kp * Vp; x += 8)
        for (int c = 0; c < 8; c++)
            S_next[x + c] = hd->eC * S[x + c];
    fqla_gemm(FQLA_GEMM_ACC, Kp, Vp, cp, Kf, cp, s->U, Vp, S_next, Vp);
}

/* P~ = scale Gamma . tril(Q K^T) of one head. */
static void chunk_p(bwd_bufs *s, float scale)
{
    int64_t cp = s->qk.cp;
    for (int64_t i = 0; i < cp; i++)
        fqla_mul_scale8(cp, s->hd.G + i * cp, s->qk.QKm + i * cp, scale, s->P + i * cp);
}

/* The chunk's dO rows of value head h into the top half of DD (pads zero). */
static void chunk_load_do(const bwd_job *job, bwd_bufs *s, int64_t b, int64_t t0, int64_t h)
{
    const fqla_tensor *d_o = &job->a->d_o;
    int64_t c = s->qk.c, cp = s->qk.cp, V = s->hd.V, Vp = s->hd.Vp;
    for (int64_t i = 0; i < cp; i++) {
        float *r = s->DD + i * Vp;
        memset(r, 0, (size_t)Vp * sizeof(float));
        if (i < c)
            fqla_load_row_f32(d_o, fqla_cpu_row_offset(d_o, b, t0 + i, h), V, r);
    }
}

/* dU = P~^T dO + diag(f) K dS' (KdS = K dS' kept for df). */
static void chunk_du(bwd_bufs *s, const float *dS)
{
    const fqla_chunk_qk *qk = &s->qk;
    int64_t cp = qk->cp, K = qk->K, Kp = qk->Kp, Vp = s->hd.Vp;
    fqla_gemm(0, cp, Vp, K, qk->QK + cp * Kp, Kp, dS, Vp, s->KdS, Vp);
    fqla_transpose(cp, cp, s->P, cp, s->Pt, cp);
    fqla_gemm(FQLA_GEMM_A_UPPER, cp, Vp, cp, s->Pt, cp, s->DD, Vp, s->dU, Vp);
    for (int64_t i = 0; i < cp; i++)
        fqla_axpy8(Vp, s->hd.f[i], s->KdS + i * Vp, s->dU + i * Vp);
}

/* dY = T~^T dU into the bottom half of DD (T~ = hd->A). */
static void chunk_dy(bwd_bufs *s)
{
    int64_t cp = s->qk.cp, Vp = s->hd.Vp;
    fqla_transpose(cp, cp, s->hd.A, cp, s->Ttt, cp);
    fqla_gemm(FQLA_GEMM_A_UPPER, cp, Vp, cp, s->Ttt, cp, s->dU, Vp, s->DD + cp * Vp, Vp);
}

/* dX = diag(beta) dY in place (= dV), and Z = [scale diag(e) dO; -diag(e) dX]. */
static void chunk_z(bwd_bufs *s, float scale)
{
    const fqla_chunk_head *hd = &s->hd;
    int64_t cp = s->qk.cp, Vp = hd->Vp;
    const float *dO = s->DD;
    for (int64_t i = 0; i < cp; i++) {
        float *dx = s->DD + (cp + i) * Vp;
        float *zq = s->Z + i * Vp, *zk = s->Z + (cp + i) * Vp;
        fqla_scale8(Vp, hd->beta[i], dx);
        for (int64_t j = 0; j < Vp; j += 8)
            for (int q = 0; q < 8; q++) {
                zq[j + q] = scale * hd->e[i] * dO[i * Vp + j + q];
                zk[j + q] = -hd->e[i] * dx[j + q];
            }
    }
}

/* dS (entering) = e_C dS' + [Q; K]^T Z, in place. */
static void chunk_dstate(bwd_bufs *s, float *dS)
{
    const fqla_chunk_qk *qk = &s->qk;
    fqla_scale8(qk->Kp * s->hd.Vp, s->hd.eC, dS);
    fqla_gemm(FQLA_GEMM_ACC, qk->Kp, s->hd.Vp, 2 * qk->cp, qk->QKt, 2 * qk->cp, s->Z, s->hd.Vp, dS, s->hd.Vp);
}

/* Only the reverse state chain of one chunk of value head h: dS, the
 * gradient w.r.t. the leaving state, to the entering one. It needs neither
 * the chunk's state nor its X, and runs the same steps as chunk_backward on
 * the same operands, so dh0 comes out bit-identical to the full backward's. */
static void chunk_backward_dstate(const bwd_job *job, bwd_bufs *s, float *dS, int64_t b, int64_t t0, int64_t h)
{
    float scale = (float)job->p->scale;
    chunk_p(s, scale);
    chunk_load_do(job, s, b, t0, h);
    chunk_du(s, dS);
    chunk_dy(s);
    chunk_z(s, scale);
    chunk_dstate(s, dS);
}

/* The reverse of one chunk of value head h (see the file header): S is the
 * stored entering state, dS the gradient w.r.t. the leaving state, updated
 * in place to the entering one. Adds this head's dq, dk to dQKsum and
 * stores dv, dg, dbeta of the chunk's tokens. */
static void chunk_backward(const bwd_job *job, bwd_bufs *s, const float *S, const float *X, float *dS,
                           int64_t b, int64_t t0, int64_t h, int64_t n)
{
    const fqla_problem *p = job->p;
    const fqla_bwd_args *a = job->a;
    const fqla_chunk_qk *qk = &s->qk;
    const fqla_chunk_head *hd = &s->hd;
    int64_t c = qk->c, cp = qk->cp, K = qk->K, Kp = qk->Kp, V = hd->V, Vp = hd->Vp;
    const float *Qr = qk->QK, *Kr = qk->QK + cp * Kp;
    float scale = (float)p->scale;
    double de[C64], df[C64], dbeta[C64];

    float *dO = s->DD, *dX = s->DD + cp * Vp;

    /* forward quantities */
    chunk_u(s, X);
    chunk_p(s, scale);
    chunk_load_do(job, s, b, t0, h);

    /* dU = P~^T dO + diag(f) K dS';  df_j = (K dS')_j . u_j */
    chunk_du(s, dS);
    for (int64_t i = 0; i < cp; i++)
        df[i] = fqla_dot_f64(Vp, s->KdS + i * Vp, s->U + i * Vp);

    /* dP~ = dO U^T, dT~ = dU Y^T (lower parts), dY = T~^T dU */
    fqla_transpose(cp, Vp, s->U, Vp, s->Ut, cp);
    fqla_transpose(cp, Vp, s->Y, Vp, s->Yt, cp);
    memset(s->dP, 0, (size_t)(cp * cp) * sizeof(float));
    memset(s->dT, 0, (size_t)(cp * cp) * sizeof(float));
    fqla_gemm(FQLA_GEMM_C_LOWER, cp, cp, V, dO, Vp, s->Ut, cp, s->dP, cp);
    fqla_gemm(FQLA_GEMM_C_LOWER, cp, cp, V, s->dU, Vp, s->Yt, cp, s->dT, cp);
    chunk_dy(s);

    /* dbeta (from dY), dX (= dV, from dY in place) and Z = [scale diag(e) dO; -diag(e) dX] */
    for (int64_t i = 0; i < cp; i++)
        dbeta[i] = fqla_dot_f64(Vp, X + i * Vp, dX + i * Vp);
    chunk_z(s, scale);
    for (int64_t i = 0; i < c; i++)
        fqla_store_row_f32(&a->dv, fqla_cpu_row_offset(&a->dv, b, t0 + i, h), V, dX + i * Vp);

    /* G2 = [dO; dX] S^T gives de and the state parts of [dQ; dK] */
    fqla_transpose(Kp, Vp, S, Vp, s->St, Kp);
    fqla_gemm(0, 2 * cp, Kp, V, s->DD, Vp, s->St, Kp, s->dQK, Kp);
    for (int64_t i = 0; i < cp; i++) {
        float *gq = s->dQK + i * Kp, *gk = s->dQK + (cp + i) * Kp;
        de[i] = scale * fqla_dot_f64(K, Qr + i * Kp, gq) - fqla_dot_f64(K, Kr + i * Kp, gk);
        fqla_scale8(Kp, scale * hd->e[i], gq);
        fqla_scale8(Kp, -hd->e[i], gk);
    }

    /* dK += diag(f) U dS'^T;  de_C = <S, dS'> */
    double deC = 0;
    for (int64_t r = 0; r < K; r++)
        deC += fqla_dot_f64(V, S + r * Vp, dS + r * Vp);
    fqla_transpose(Kp, Vp, dS, Vp, s->dSt, Kp);
    for (int64_t i = 0; i < cp; i++) {
        memset(s->Uf + i * Vp, 0, (size_t)Vp * sizeof(float));
        fqla_axpy8(Vp, hd->f[i], s->U + i * Vp, s->Uf + i * Vp);
    }
    fqla_gemm(FQLA_GEMM_ACC, cp, Kp, V, s->Uf, Vp, s->dSt, Kp, s->dQK + cp * Kp, Kp);

    chunk_dstate(s, dS);

    /* through the inverse T~ = (I + L)^-1, L = StrictLower(diag(beta) (Gamma . K K^T)):
     * dL = -T~^T dT~ T~^T (strict lower) */
    for (int64_t i = 0; i < cp; i++)
        for (int64_t j = 0; j < cp; j++)
            s->dAr[i * cp + j] = j < i ? s->dT[i * cp + j] : 0.0f;
    fqla_transpose(cp, cp, hd->A, cp, s->Art, cp);
    fqla_gemm(FQLA_GEMM_A_UPPER, cp, cp, cp, s->Art, cp, s->dAr, cp, s->M1, cp);
    memset(s->dLn, 0, (size_t)(cp * cp) * sizeof(float));
    fqla_gemm(FQLA_GEMM_C_LOWER, cp, cp, cp, s->M1, cp, s->Art, cp, s->dLn, cp);
    /* M = diag(beta) (Gamma . dL) (strict lower), Msym = M + M^T; dQ~ = scale Gamma . dP~ */
    for (int64_t i = 0; i < cp; i++) {
        double acc = 0;
        for (int64_t j = 0; j < cp; j++) {
            float gdl = j < i ? -s->dLn[i * cp + j] * hd->G[i * cp + j] : 0.0f;
            acc += (double)gdl * qk->KK[i * cp + j];
            s->Msym[i * cp + j] = hd->beta[i] * gdl;
            s->dQt[i * cp + j] = j <= i ? scale * hd->G[i * cp + j] * s->dP[i * cp + j] : 0.0f;
        }
        dbeta[i] += acc;
    }
    for (int64_t i = 0; i < cp; i++)
        for (int64_t j = 0; j < i; j++) {
            float m = s->Msym[i * cp + j];
            s->Msym[j * cp + i] = m;
        }
    fqla_gemm(FQLA_GEMM_ACC | FQLA_GEMM_A_LOWER, cp, Kp, cp, s->dQt, cp, Kr, Kp, s->dQK, Kp);
    fqla_transpose(cp, cp, s->dQt, cp, s->dQtT, cp);
    fqla_gemm(FQLA_GEMM_ACC | FQLA_GEMM_A_UPPER, cp, Kp, cp, s->dQtT, cp, Qr, Kp, s->dQK + cp * Kp, Kp);
    fqla_gemm(FQLA_GEMM_ACC, cp, Kp, cp, s->Msym, cp, Kr, Kp, s->dQK + cp * Kp, Kp);

    /* dg from the terms that contain each g_t (file header); rp[i] is the
     * running sum of R_ij over j < t */
    double rp[C64], tail = 0, head = 0, cross;
    double E = deC * hd->eC;
    for (int64_t i = 0; i < cp; i++)
        rp[i] = 0;
    double suf[C64 + 1];
    suf[cp] = 0;
    for (int64_t i = cp - 1; i >= 0; i--)
        suf[i] = suf[i + 1] + de[i] * hd->e[i];
    for (int64_t t = 0; t < c; t++) {
        if (t > 0) {
            int64_t j = t - 1;
            head += df[j] * hd->f[j];
            for (int64_t i = t; i < cp; i++) {
                double r = -(double)s->dLn[i * cp + j] * hd->beta[i] * qk->KK[i * cp + j] +
                           (double)scale * s->dP[i * cp + j] * qk->QKm[i * cp + j];
                rp[i] += hd->G[i * cp + j] * r;
            }
        }
        cross = 0;
        for (int64_t i = t; i < cp; i++)
            cross += rp[i];
        tail = suf[t];
        fqla_cpu_store_gate_grads(p, a, job->dA_log_part, job->ddt_bias_part, n, b, t0 + t, h,
                                  tail + head + E + cross, dbeta[t]);
    }

    /* this head's share of dq, dk */
    for (int64_t x = 0; x < 2 * cp * Kp; x += 8)
        for (int q = 0; q < 8; q++)
            s->dQKsum[x + q] += s->dQK[x + q];
}

/* Stores the chunk's dq, dk rows from dQKsum (through the l2norm backward). */
static void store_qk_grads(const bwd_job *job, bwd_bufs *s, int64_t b, int64_t t0, int64_t hk)
{
    const fqla_problem *p = job->p;
    const fqla_bwd_args *a = job->a;
    const fqla_chunk_qk *qk = &s->qk;
    int64_t K = qk->K, Kp = qk->Kp, cp = qk->cp;
    for (int w = 0; w < 2; w++) {
        const fqla_tensor *x = w ? &a->k : &a->q;
        const fqla_tensor *dx = w ? &a->dk : &a->dq;
        for (int64_t i = 0; i < qk->c; i++) {
            float *g = s->dQKsum + (w * cp + i) * Kp;
            int64_t t = t0 + i;
            if (p->opt.use_qk_l2norm) {
                fqla_load_row_f32(x, fqla_cpu_row_offset(x, b, t, hk), K, s->tmp);
                for (int64_t j = 0; j < K; j++) {
                    s->xr[j] = s->tmp[j];
                    s->dxr[j] = g[j];
                }
                double r = fqla_l2norm(s->xr, K);
                fqla_l2norm_grad(s->xr, r, s->dxr, s->dx, K);
                for (int64_t j = 0; j < K; j++)
                    s->tmp[j] = (float)s->dx[j];
                fqla_store_row_f32(dx, fqla_cpu_row_offset(dx, b, t, hk), K, s->tmp);
            } else {
                fqla_store_row_f32(dx, fqla_cpu_row_offset(dx, b, t, hk), K, g);
            }
        }
    }
}

static void bwd_task(void *arg, int64_t item, int worker)
{
    const bwd_job *job = arg;
    const fqla_problem *p = job->p;
    const fqla_bwd_args *a = job->a;
    int64_t n = item / p->H, hk = item % p->H, group = p->group;
    int64_t h0 = hk * group, h1 = h0 + group;
    int64_t K = p->K, V = p->V, Vp = fqla_round8(V), KV = fqla_round8(K) * Vp;
    int v_first = p->opt.state_v_first;
    int64_t b, start, len;
    bwd_bufs s;
    bwd_carve(&s, K, V, group, job->kept_chunks, job->scratch + (int64_t)worker * job->per_worker);
    fqla_seq_bounds(p, n, &b, &start, &len);
    int64_t end = start + len, chunks = (len + C64 - 1) / C64;
#define STATE(h, ci) (s.states + ((h) - h0) * job->kept_chunks * KV + (ci) * KV)
#define XS(h, ci) (s.xs + ((h) - h0) * job->kept_chunks * C64 * Vp + (ci) * C64 * Vp)

    /* pass 1: the state entering every chunk, and its X (dh0 alone: not needed) */
    for (int64_t h = h0; !p->dh0_only && h < h1; h++) {
        int64_t lead[2] = {n, h};
        memset(STATE(h, 0), 0, (size_t)KV * sizeof(float));
        if (a->initial_state.data)
            fqla_cpu_state_load(&a->initial_state, lead, K, V, v_first, STATE(h, 0), Vp, s.tmp);
    }
    for (int64_t ci = 0; !p->dh0_only && ci < chunks; ci++) {
        int64_t t0 = start + ci * C64, c = end - t0 < C64 ? end - t0 : C64;
        fqla_chunk_load_qk(&s.qk, &job->in, b, t0, c, hk, 0);
        fqla_chunk_prepare_qk(&s.qk, 0);
        for (int64_t h = h0; h < h1; h++) {
            fqla_chunk_load_head(&s.hd, &s.qk, &job->in, b, t0, h, 1);
            chunk_x(&s, STATE(h, ci), XS(h, ci));
            if (ci + 1 < chunks) {
                chunk_u(&s, XS(h, ci));
                chunk_next_state(&s, STATE(h, ci), STATE(h, ci + 1));
            }
        }
    }

    /* pass 2: chunks in reverse */
    for (int64_t h = h0; h < h1; h++) {
        float *dS = s.dS + (h - h0) * KV;
        int64_t lead[2] = {n, h};
        memset(dS, 0, (size_t)KV * sizeof(float));
        if (a->d_final_state.data)
            fqla_cpu_state_load(&a->d_final_state, lead, K, V, v_first, dS, Vp, s.tmp);
    }
    for (int64_t ci = chunks - 1; ci >= 0; ci--) {
        int64_t t0 = start + ci * C64, c = end - t0 < C64 ? end - t0 : C64;
        fqla_chunk_load_qk(&s.qk, &job->in, b, t0, c, hk, 1);
        fqla_chunk_prepare_qk(&s.qk, 1);
        memset(s.dQKsum, 0, (size_t)(2 * s.qk.cp * s.qk.Kp) * sizeof(float));
        for (int64_t h = h0; h < h1; h++) {
            fqla_chunk_load_head(&s.hd, &s.qk, &job->in, b, t0, h, 0);
            if (p->dh0_only)
                chunk_backward_dstate(job, &s, s.dS + (h - h0) * KV, b, t0, h);
            else
                chunk_backward(job, &s, STATE(h, ci), XS(h, ci), s.dS + (h - h0) * KV, b, t0, h, n);
        }
        if (!p->dh0_only)
            store_qk_grads(job, &s, b, t0, hk);
    }
    for (int64_t h = h0; a->d_initial_state.data && h < h1; h++) {
        int64_t lead[2] = {n, h};
        fqla_cpu_state_store(&a->d_initial_state, lead, K, V, v_first, s.dS + (h - h0) * KV, Vp, s.tmp);
    }
#undef STATE
#undef XS
}

fqla_status fqla_cpu_bwd(fqla_context *ctx, const fqla_problem *p, const fqla_bwd_args *a)
{
    bwd_job job;
    int64_t items = p->N * p->H;
    int workers = fqla_cpu_workers(p->threads, items);
    memset(&job, 0, sizeof job);
    job.p = p;
    job.a = a;
    job.in = fqla_cpu_inputs_bwd(p, a);
    job.chunks_max = 1;
    for (int64_t n = 0; n < p->N; n++) {
        int64_t b, start, len;
        fqla_seq_bounds(p, n, &b, &start, &len);
        if ((len + C64 - 1) / C64 > job.chunks_max)
            job.chunks_max = (len + C64 - 1) / C64;
    }
    job.kept_chunks = p->dh0_only ? 0 : job.chunks_max;
    job.per_worker = bwd_floats(p->K, p->V, p->group, job.kept_chunks);
    job.scratch = fqla_cpu_alloc_floats(job.per_worker * workers);
    if (p->opt.use_gate_in_kernel && !p->dh0_only)
        job.dA_log_part = calloc((size_t)(2 * p->N * p->HV + 1), sizeof(double));
    if (!job.scratch || (p->opt.use_gate_in_kernel && !p->dh0_only && !job.dA_log_part)) {
        free(job.scratch);
        free(job.dA_log_part);
        return fqla_fail(ctx, FQLA_STATUS_ALLOC_FAILED,
                         "CPU backward: could not allocate %lld bytes of scratch for %d threads",
                         (long long)(job.per_worker * workers * (int64_t)sizeof(float)), workers);
    }
    if (job.dA_log_part)
        job.ddt_bias_part = job.dA_log_part + p->N * p->HV;

    const fqla_tensor *rows[5] = {&a->dq, &a->dk, &a->dv, &a->dg, &a->dbeta};
    for (int i = 0; i < 5; i++)
        fqla_cpu_zero_uncovered(p, rows[i]);
    fqla_cpu_run(ctx, workers, items, bwd_task, &job);

    if (job.dA_log_part)
        fqla_cpu_reduce_gate_params(p, a, job.dA_log_part, job.ddt_bias_part);
    free(job.scratch);
    free(job.dA_log_part);
    return FQLA_STATUS_SUCCESS;
}
