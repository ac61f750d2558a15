/*
 * cpu_chunk.h - what the chunked forward and backward of the fast CPU path
 * share (DESIGN.md §2, C = 64): loading one chunk of one value head with the
 * in-kernel transforms applied, the chunk-local gates, and the gate-free
 * triangular inverse Ar. Also the state and row I/O the decode path uses.
 *
 * Layout of one chunk in fp32 scratch (c real tokens, cp = c rounded up to
 * 8; Kp, Vp = K, V rounded up to 8; every pad row / column is zero, which
 * keeps every product exact and lets the matrix kernels run on whole 4 x 8
 * blocks):
 *     QK   [2 cp, Kp]   rows 0..cp-1 = q (transformed), rows cp.. = k
 *     QKt  [Kp, 2 cp]   its transpose (Q^T | K^T)
 *     V    [cp, Vp]
 *     beta, e, f [cp]   beta, e_i = exp(gamma_i), f_j = exp(gamma_C - gamma_j)
 *     eC                exp(gamma_C)
 *     G    [cp, cp]     Gamma_ij = exp(gamma_i - gamma_j), i >= j; 0 above
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

#define FQLA_CHUNK 64

/* The raw input tensors of an operation and the problem. */
typedef struct fqla_cpu_inputs {
    const fqla_problem *p;
    const fqla_tensor *q, *k, *v, *g, *beta, *A_log, *dt_bias;
} fqla_cpu_inputs;

/* Scratch for one chunk (one worker). */
typedef struct fqla_chunk {
    int64_t K, V, Kp, Vp;
    int64_t c, cp;           /* tokens of the current chunk, padded */
    float *QK, *QKt, *V_;    /* see the header comment; V_ is V */
    float *G;                /* [64, 64] used as [cp, cp] */
    float *KK, *QKm;         /* [cp, cp] k_i.k_j and q_i.k_j (lower parts valid) */
    float *Ar;               /* [cp, cp] (I + StrictLower(diag(beta) K K^T))^-1 */
    float beta[FQLA_CHUNK], e[FQLA_CHUNK], f[FQLA_CHUNK];
    float eC;
    double *row;             /* [max(K, V)] fp64 row for the l2norm */
    float *rowf;             /* [max(K, V)] fp32 row */
} fqla_chunk;

/* Floats of chunk scratch for head dims K, V (for fqla_chunk_carve). */
int64_t fqla_chunk_floats(int64_t K, int64_t V);
/* Points the chunk's buffers into mem (fqla_chunk_floats(K, V) floats,
 * 8-float aligned). */
void fqla_chunk_carve(fqla_chunk *ch, int64_t K, int64_t V, float *mem);

/* Loads tokens [t0, t0 + c) of batch row b, value head h (q/k head
 * h / group): transformed q (when with_q), k, v, beta and the gates, and pads
 * to cp. */
void fqla_chunk_load(fqla_chunk *ch, const fqla_cpu_inputs *in, int64_t b, int64_t t0,
                     int64_t c, int64_t h, int with_q);
/* QKt, KK (and QKm when with_q) and Ar from the loaded chunk. */
void fqla_chunk_prepare(fqla_chunk *ch, int with_q);

/* exp(x) for x <= 0 with the chunk conventions: 0 when any -inf gate lies in
 * the span (ninf > 0) or x < -87. */
float fqla_chunk_exp(double x, int ninf);

/* Transformed inputs of one token. */
/* q or k row of (b, t, hk): K floats into dst (l2-normalised when asked;
 * row is [K] fp64 scratch). */
void fqla_cpu_load_qk(const fqla_cpu_inputs *in, const fqla_tensor *x, int64_t b, int64_t t,
                      int64_t hk, double *row, float *dst);
double fqla_cpu_gate(const fqla_cpu_inputs *in, int64_t b, int64_t t, int64_t h);
double fqla_cpu_beta(const fqla_cpu_inputs *in, int64_t b, int64_t t, int64_t h);
/* Element offset of (b, t, h, 0) in a 4-D row tensor, (b, t, h) in a 3-D one. */
int64_t fqla_cpu_row_offset(const fqla_tensor *x, int64_t b, int64_t t, int64_t h);

/* A state [K, V] (or [V, K] stored, v_first) at lead index (lead[0..ndim-2))
 * of t, to / from S (K rows of ld floats, columns >= V untouched on load).
 * tmp: [max(K, V)] floats. */
void fqla_cpu_state_load(const fqla_tensor *t, const int64_t *lead, int64_t K, int64_t V,
                         int v_first, float *S, int64_t ld, float *tmp);
void fqla_cpu_state_store(const fqla_tensor *t, const int64_t *lead, int64_t K, int64_t V,
                          int v_first, const float *S, int64_t ld, float *tmp);

/* Zeroes rows [t0, t1) of batch row b of a [B, T, ...] tensor (3-D or 4-D;
 * absent tensors ignored), and every row no sequence covers (varlen: the
 * rows after the last cu_seqlens entry). */
void fqla_cpu_zero_rows(const fqla_tensor *x, int64_t b, int64_t t0, int64_t t1);
void fqla_cpu_zero_uncovered(const fqla_problem *p, const fqla_tensor *x);

/* malloc of n floats (n >= 0); NULL when it fails or n does not fit size_t. */
float *fqla_cpu_alloc_floats(int64_t n);

#endif
