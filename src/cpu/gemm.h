/*
 * gemm.h - the small fp32 matrix kernels of the fast CPU path: one
 * register-blocked matrix product and the element-wise helpers around it.
 *
 * Plain C99 written for gcc -O2 -march=x86-64-v2: at -O2 gcc vectorises only
 * loops whose trip count is a known multiple of the vector width and keeps an
 * accumulator in a register only when it is a single 4-float array, so the
 * product is built from a 4 x 8 micro-kernel (eight float[4] accumulators)
 * and every element-wise loop runs in blocks of 8. Callers therefore pad:
 * every row length n passed here is a multiple of 8 and every row count m a
 * multiple of 4 (the chunked code pads head dims and chunk lengths to 8 with
 * zeros, which leaves every product exact).
 *
 * All matrices are row-major with a leading dimension (elements per row).
 *
 * On x86 with GCC or clang, fqla_gemm also has an AVX2 + FMA body (a 4 x 16
 * tile, compiled with a target attribute) used when the CPU has both; see
 * cpu_isa.h for the choice and gemm.c for why the tile differs. On aarch64
 * it has a NEON body (4 x 16 tiles, the AVX2 body's walk and sums), and
 * fqla_transpose NEON 8 x 8 tiles. The
 * other helpers here stay on the baseline (gcc vectorises them for NEON
 * there).
 */
#ifndef FQLA_CPU_GEMM_H
#define FQLA_CPU_GEMM_H

#include <stdint.h>

enum {
    FQLA_GEMM_ACC = 1,     /* C += A B (else C = A B) */
    FQLA_GEMM_A_LOWER = 2, /* A[i][p] == 0 for p > i: skip those terms */
    FQLA_GEMM_A_UPPER = 4, /* A[i][p] == 0 for p < i: skip those terms */
    FQLA_GEMM_C_LOWER = 8  /* only C[i][j] with j <= i is needed: 4 x 8 blocks
                              wholly above the diagonal are not written */
};

/* C[m x n] (+)= A[m x k] B[k x n]; m % 4 == 0, n % 8 == 0, k >= 0. */
void fqla_gemm(int flags, int64_t m, int64_t n, int64_t k,
               const float *A, int64_t lda, const float *B, int64_t ldb,
               float *C, int64_t ldc);

/* dst[j][i] = src[i][j] for i < rows, j < cols. */
void fqla_transpose(int64_t rows, int64_t cols, const float *src, int64_t lds,
                    float *dst, int64_t ldd);

/* x[0..n) *= a; n % 8 == 0. */
void fqla_scale8(int64_t n, float a, float *x);
/* y[0..n) += a x[0..n); n % 8 == 0. */
void fqla_axpy8(int64_t n, float a, const float *x, float *y);
/* z[0..n) = x[0..n) * y[0..n); n % 8 == 0. */
void fqla_mul8(int64_t n, const float *x, const float *y, float *z);
/* out[0..n) = x * y * s (element-wise, s a scalar); n % 8 == 0. */
void fqla_mul_scale8(int64_t n, const float *x, const float *y, float s, float *out);
/* out[0..n) = x * y * z; n % 8 == 0. */
void fqla_mul3_8(int64_t n, const float *x, const float *y, const float *z, float *out);
/* out[0..n) = x + a y; n % 8 == 0. */
void fqla_xpay8(int64_t n, const float *x, float a, const float *y, float *out);
/* sum of x[i] y[i] over i < n, accumulated in double (n any). */
double fqla_dot_f64(int64_t n, const float *x, const float *y);

/* Rounds n up to a multiple of 8. */
static inline int64_t fqla_round8(int64_t n) { return (n + 7) & ~(int64_t)7; }

#endif
