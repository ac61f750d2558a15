/*
 * cpu_chunk.h - what the chunked forward and backward of the fast CPU path
 * share (docs/design.md §2, C = 64): loading one chunk with the in-kernel
 * transforms applied, the chunk-local gates and the gate-free triangular
 * inverse A; plus the row and state I/O the decode path uses too.
 *
 * A chunk is split the way GVA shares it: the q/k part (fqla_chunk_qk: q, k,
 * Q K^T, K K^T) depends only on the q/k head and is loaded once for all the
 * value heads of its group; the head part (fqla_chunk_head: v, beta, gates,
 * Gamma, A) is per value head.
 *
 * Layout in fp32 scratch (c real tokens, cp = c rounded up to 8; Kp, Vp = K,
 * V rounded up to 8; every pad row / column is zero, which keeps every
 * product exact and lets the matrix kernels run on whole 4 x 8 blocks):
 *     QK   [2 cp, Kp]   rows 0..cp-1 = q (transformed), rows cp.. = k
 *     QKt  [Kp, 2 cp]   its transpose (Q^T | K^T)
 *     QKm, KK [cp, cp]  q_i.k_j and k_i.k_j (lower triangle incl. diagonal;
 *                       zero above)
 *     V    [cp, Vp]
 *     beta, e, f [cp]   beta, e_i = exp(gamma_i), f_j = exp(gamma_C - gamma_j)
 *     eC                exp(gamma_C)
 *     G    [cp, cp]     Gamma_ij = exp(gamma_i - gamma_j), i >= j; 0 above
 *     A    [cp, cp]     (I + StrictLower(diag(beta) (Gamma . K K^T)))^-1, 0 above:
 *                       Gamma . Ar, docs/design.md §2's gate-free inverse Ar times the
 *                       mask, formed with Gamma inside (Ar alone grows like
 *                       |beta ||k||^2 - 1|^n and overflows fp32 on raw keys)
 *
 * Gates: gamma is the cumulative sum of g inside the chunk, kept in double
 * as (count of -inf gates so far, sum of the finite ones), so that one
 * g = -inf zeroes exactly the terms that cross it instead of producing
 * (-inf) - (-inf) = NaN, and a cumulative decay of -1300 loses nothing.
 * Every exponent is <= 0; results below exp(-87) (the fp32 normal range) are
 * flushed to 0 so that no denormal enters the products.
 */
#ifndef FQLA_CPU_CHUNK_H
#define FQLA_CPU_CHUNK_H

#include "internal.h"
#include "cpu/cpu_io.h"

#define FQLA_CHUNK 64

/* The q/k part of a chunk. */
typedef struct fqla_chunk_qk {
    int64_t K, Kp, c, cp;
    float *QK, *QKt, *QKm, *KK;
    double *row;             /* [Kp] fp64 row for the l2norm */
} fqla_chunk_qk;

/* The value-head part of a chunk. */
typedef struct fqla_chunk_head {
    int64_t V, Vp, c, cp;
    float *V_;               /* V */
    float *G, *A;
    float beta[FQLA_CHUNK], e[FQLA_CHUNK], f[FQLA_CHUNK];
    float eC;
} fqla_chunk_head;

/* Floats of scratch of each part, and carving it from mem (8-float
 * aligned; the result is too). */
int64_t fqla_chunk_qk_floats(int64_t K);
float *fqla_chunk_qk_carve(fqla_chunk_qk *s, int64_t K, float *mem);
int64_t fqla_chunk_head_floats(int64_t V);
float *fqla_chunk_head_carve(fqla_chunk_head *s, int64_t V, float *mem);

/* Loads transformed k (and q when with_q; else the q rows are zeroed) of
 * tokens [t0, t0 + c) of batch row b, q/k head hk, padded to cp. */
void fqla_chunk_load_qk(fqla_chunk_qk *s, const fqla_cpu_inputs *in, int64_t b, int64_t t0,
                        int64_t c, int64_t hk, int with_q);
/* QKt, KK and (with_q) QKm. */
void fqla_chunk_prepare_qk(fqla_chunk_qk *s, int with_q);
/* Loads v (when with_v), beta and the gates of value head h for the same
 * tokens, and computes e, f, eC, Gamma and A (needs s prepared). */
void fqla_chunk_load_head(fqla_chunk_head *hd, const fqla_chunk_qk *s, const fqla_cpu_inputs *in,
                          int64_t b, int64_t t0, int64_t h, int with_v);

/* exp(x) for x <= 0 with the chunk conventions: 0 when any -inf gate lies in
 * the span (ninf > 0) or x < -87. */
float fqla_chunk_exp(double x, int ninf);

/* Rows are read and written with fqla_load_row_f32 / fqla_store_row_f32
 * (src/tensor.c): their bf16 conversions are inline (internal.h), so the
 * common bf16 rows cost no call per element. */

/* Transformed q or k row of (b, t, hk): K floats into dst (l2-normalised
 * when asked; row is [K] fp64 scratch). Gate and beta: cpu_io.h. */
void fqla_cpu_load_qk(const fqla_cpu_inputs *in, const fqla_tensor *x, int64_t b, int64_t t,
                      int64_t hk, double *row, float *dst);

/* A state [K, V] (or [V, K] stored, v_first) at lead index (lead[0..ndim-2))
 * of t, to / from S (K rows of ld floats, columns >= V untouched on load).
 * tmp: [max(K, V)] floats. */
void fqla_cpu_state_load(const fqla_tensor *t, const int64_t *lead, int64_t K, int64_t V,
                         int v_first, float *S, int64_t ld, float *tmp);
void fqla_cpu_state_store(const fqla_tensor *t, const int64_t *lead, int64_t K, int64_t V,
                          int v_first, const float *S, int64_t ld, float *tmp);

/* malloc of n floats (n >= 0); NULL when it fails or n does not fit size_t. */
float *fqla_cpu_alloc_floats(int64_t n);

/* How a (sequence, q/k head) pair's GVA group is split into work items:
 * heads_per_item value heads each (the whole group unless there are too few
 * pairs to keep `threads` workers busy). */
int64_t fqla_cpu_heads_per_item(const fqla_problem *p, int threads);

#endif
