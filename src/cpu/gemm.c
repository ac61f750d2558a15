/*
 * gemm.c - fp32 matrix product and element-wise helpers (see gemm.h for the
 * shape rules and why the loops look the way they do).
 *
 * The product walks 8-column panels of B (a k x 8 panel stays in L1 while
 * every 4-row block of A passes over it) and runs the 4 x 8 micro-kernel on
 * each block. Triangular flags shorten the k range or skip blocks; they
 * never change the order of the additions of the terms that remain, so a
 * flagged product is bit-identical to the full one.
 */
#include "cpu/gemm.h"

#include "cpu/cpu_isa.h"

#include <math.h>

/* C[4 x 8] (+)= A[4 x (p0..p1)] B[(p0..p1) x 8]. Eight float[4] accumulators:
 * gcc -O2 keeps each in one SSE register and vectorises every c-loop. */
static void kernel_4x8(int acc, int64_t p0, int64_t p1, const float *restrict A, int64_t lda,
                       const float *restrict B, int64_t ldb, float *restrict C, int64_t ldc)
{
    float c00[4] = {0}, c10[4] = {0}, c20[4] = {0}, c30[4] = {0};
    float c01[4] = {0}, c11[4] = {0}, c21[4] = {0}, c31[4] = {0};
    const float *a0 = A, *a1 = A + lda, *a2 = A + 2 * lda, *a3 = A + 3 * lda;
    for (int64_t p = p0; p < p1; p++) {
        const float *b = B + p * ldb;
        float x0 = a0[p], x1 = a1[p], x2 = a2[p], x3 = a3[p];
        for (int c = 0; c < 4; c++) {
            c00[c] += x0 * b[c];
            c10[c] += x1 * b[c];
            c20[c] += x2 * b[c];
            c30[c] += x3 * b[c];
        }
        for (int c = 0; c < 4; c++) {
            c01[c] += x0 * b[4 + c];
            c11[c] += x1 * b[4 + c];
            c21[c] += x2 * b[4 + c];
            c31[c] += x3 * b[4 + c];
        }
    }
    float *r0 = C, *r1 = C + ldc, *r2 = C + 2 * ldc, *r3 = C + 3 * ldc;
    if (acc) {
        for (int c = 0; c < 4; c++) { r0[c] += c00[c]; r0[4 + c] += c01[c]; }
        for (int c = 0; c < 4; c++) { r1[c] += c10[c]; r1[4 + c] += c11[c]; }
        for (int c = 0; c < 4; c++) { r2[c] += c20[c]; r2[4 + c] += c21[c]; }
        for (int c = 0; c < 4; c++) { r3[c] += c30[c]; r3[4 + c] += c31[c]; }
    } else {
        for (int c = 0; c < 4; c++) { r0[c] = c00[c]; r0[4 + c] = c01[c]; }
        for (int c = 0; c < 4; c++) { r1[c] = c10[c]; r1[4 + c] = c11[c]; }
        for (int c = 0; c < 4; c++) { r2[c] = c20[c]; r2[4 + c] = c21[c]; }
        for (int c = 0; c < 4; c++) { r3[c] = c30[c]; r3[4 + c] = c31[c]; }
    }
}

static void gemm_base(int flags, int64_t m, int64_t n, int64_t k,
                      const float *A, int64_t lda, const float *B, int64_t ldb,
                      float *C, int64_t ldc)
{
    int acc = (flags & FQLA_GEMM_ACC) != 0;
    for (int64_t j = 0; j < n; j += 8) {
        /* rows i..i+3 reach column j only when i + 3 >= j */
        int64_t i0 = (flags & FQLA_GEMM_C_LOWER) ? (j / 4) * 4 : 0;
        for (int64_t i = i0; i < m; i += 4) {
            int64_t p0 = 0, p1 = k;
            if ((flags & FQLA_GEMM_A_LOWER) && i + 4 < p1)
                p1 = i + 4;
            if ((flags & FQLA_GEMM_A_UPPER) && i > p0)
                p0 = i < k ? i : k;
            kernel_4x8(acc, p0, p1, A + i * lda, lda, B + j, ldb, C + i * ldc + j, ldc);
        }
    }
}

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define FQLA_HAVE_AVX2_GEMM 1
#include <immintrin.h>
/*
 * The AVX2 + FMA product. The same plain C, compiled for that target: a
 * float[8] accumulator is one ymm register and fmaf becomes one vfmadd
 * (-std=c99 turns off contraction of a * b + c, so fmaf says it). With
 * 8-wide registers a 4 x 8 tile has only four accumulators, fewer than
 * the FMA latency x throughput (4 x 2) needs, so the main tile is 4 x 16:
 * eight accumulators, two B loads and four broadcasts per eight FMAs.
 * Every C element is still one fmaf chain over p in increasing order, in
 * either tile, so the tile chosen never changes a result.
 */
#define FQLA_AVX2 __attribute__((target("avx2,fma")))

#define AVX2_STORE_ROW(r, lo, hi, w)                                      \
    do {                                                                  \
        if (acc) {                                                        \
            for (int c = 0; c < 8; c++) (r)[c] += (lo)[c];                \
            if ((w) == 16) for (int c = 0; c < 8; c++) (r)[8 + c] += (hi)[c]; \
        } else {                                                          \
            for (int c = 0; c < 8; c++) (r)[c] = (lo)[c];                 \
            if ((w) == 16) for (int c = 0; c < 8; c++) (r)[8 + c] = (hi)[c]; \
        }                                                                 \
    } while (0)

/* C[4 x 16] (+)= A[4 x (p0..p1)] B[(p0..p1) x 16]. */
FQLA_AVX2 static void kernel_4x16_avx2(int acc, int64_t p0, int64_t p1, const float *restrict A,
                                       int64_t lda, const float *restrict B, int64_t ldb,
                                       float *restrict C, int64_t ldc)
{
    float c00[8] = {0}, c10[8] = {0}, c20[8] = {0}, c30[8] = {0};
    float c01[8] = {0}, c11[8] = {0}, c21[8] = {0}, c31[8] = {0};
    const float *a0 = A, *a1 = A + lda, *a2 = A + 2 * lda, *a3 = A + 3 * lda;
    for (int64_t p = p0; p < p1; p++) {
        const float *b = B + p * ldb;
        float x0 = a0[p], x1 = a1[p], x2 = a2[p], x3 = a3[p];
        for (int c = 0; c < 8; c++) {
            c00[c] = fmaf(x0, b[c], c00[c]);
            c10[c] = fmaf(x1, b[c], c10[c]);
            c20[c] = fmaf(x2, b[c], c20[c]);
            c30[c] = fmaf(x3, b[c], c30[c]);
        }
        for (int c = 0; c < 8; c++) {
            c01[c] = fmaf(x0, b[8 + c], c01[c]);
            c11[c] = fmaf(x1, b[8 + c], c11[c]);
            c21[c] = fmaf(x2, b[8 + c], c21[c]);
            c31[c] = fmaf(x3, b[8 + c], c31[c]);
        }
    }
    AVX2_STORE_ROW(C, c00, c01, 16);
    AVX2_STORE_ROW(C + ldc, c10, c11, 16);
    AVX2_STORE_ROW(C + 2 * ldc, c20, c21, 16);
    AVX2_STORE_ROW(C + 3 * ldc, c30, c31, 16);
}

/* C[4 x 8] (+)= A[4 x (p0..p1)] B[(p0..p1) x 8]: the last odd 8-column panel
 * and the blocks of a 16-column panel whose right half lies above the
 * diagonal under FQLA_GEMM_C_LOWER. */
FQLA_AVX2 static void kernel_4x8_avx2(int acc, int64_t p0, int64_t p1, const float *restrict A,
                                      int64_t lda, const float *restrict B, int64_t ldb,
                                      float *restrict C, int64_t ldc)
{
    float c00[8] = {0}, c10[8] = {0}, c20[8] = {0}, c30[8] = {0};
    const float *a0 = A, *a1 = A + lda, *a2 = A + 2 * lda, *a3 = A + 3 * lda;
    for (int64_t p = p0; p < p1; p++) {
        const float *b = B + p * ldb;
        float x0 = a0[p], x1 = a1[p], x2 = a2[p], x3 = a3[p];
        for (int c = 0; c < 8; c++) {
            c00[c] = fmaf(x0, b[c], c00[c]);
            c10[c] = fmaf(x1, b[c], c10[c]);
            c20[c] = fmaf(x2, b[c], c20[c]);
            c30[c] = fmaf(x3, b[c], c30[c]);
        }
    }
    AVX2_STORE_ROW(C, c00, c00, 8);
    AVX2_STORE_ROW(C + ldc, c10, c10, 8);
    AVX2_STORE_ROW(C + 2 * ldc, c20, c20, 8);
    AVX2_STORE_ROW(C + 3 * ldc, c30, c30, 8);
}

/* Same walk as gemm_base with 16-column panels (an 8-column one last when
 * n % 16 == 8). Under C_LOWER a 4-row block at i needs the left half of
 * the panel at j when i + 3 >= j and the right half when i + 3 >= j + 8;
 * blocks needing only the left half get the 4 x 8 tile, so no block wholly
 * above the diagonal is written, as in the baseline. */
FQLA_AVX2 static void gemm_avx2(int flags, int64_t m, int64_t n, int64_t k,
                                const float *A, int64_t lda, const float *B, int64_t ldb,
                                float *C, int64_t ldc)
{
    int acc = (flags & FQLA_GEMM_ACC) != 0;
    int lower = (flags & FQLA_GEMM_C_LOWER) != 0;
    for (int64_t j = 0; j < n; j += 16) {
        int wide = j + 16 <= n;
        int64_t i0 = lower ? (j / 4) * 4 : 0;
        for (int64_t i = i0; i < m; i += 4) {
            int64_t p0 = 0, p1 = k;
            if ((flags & FQLA_GEMM_A_LOWER) && i + 4 < p1)
                p1 = i + 4;
            if ((flags & FQLA_GEMM_A_UPPER) && i > p0)
                p0 = i < k ? i : k;
            const float *a = A + i * lda;
            float *c = C + i * ldc + j;
            if (wide && !(lower && i + 3 < j + 8))
                kernel_4x16_avx2(acc, p0, p1, a, lda, B + j, ldb, c, ldc);
            else
                kernel_4x8_avx2(acc, p0, p1, a, lda, B + j, ldb, c, ldc);
        }
    }
}
#endif

#ifdef FQLA_HAVE_AVX2_GEMM
/*
 * The AVX-512 product: an 8 x 32 tile (sixteen zmm accumulators, two B
 * loads and eight broadcasts per sixteen FMAs), 4-row and 16-column
 * variants for the edges. Every C element is still one FMA chain over p in
 * increasing order, as in the AVX2 tiles, so AVX-512 and AVX2 products
 * are bit-identical whatever the tile. Blocks taller than the triangle
 * flags' 4-row granularity read terms those flags would skip; the flags
 * promise that they are exact zeros and FMA with a zero leaves the sum
 * unchanged (up to the sign of a zero sum). FQLA_GEMM_C_LOWER products
 * have their own walk (gemm_lower_avx512).
 */
#define FQLA_AVX512 __attribute__((target("avx512f,avx2,fma")))

#define ROW_FMA2(r, x)                                  \
    do {                                                \
        __m512 bx = _mm512_set1_ps(x);                  \
        c##r##a = _mm512_fmadd_ps(bx, b0, c##r##a);     \
        c##r##b = _mm512_fmadd_ps(bx, b1, c##r##b);     \
    } while (0)
#define ROW_STORE2(r)                                                                         \
    do {                                                                                      \
        float *cr = C + (r) * ldc;                                                            \
        if (acc) {                                                                            \
            c##r##a = _mm512_add_ps(_mm512_loadu_ps(cr), c##r##a);                            \
            c##r##b = _mm512_add_ps(_mm512_loadu_ps(cr + 16), c##r##b);                       \
        }                                                                                     \
        _mm512_storeu_ps(cr, c##r##a);                                                        \
        _mm512_storeu_ps(cr + 16, c##r##b);                                                   \
    } while (0)

FQLA_AVX512 static void kernel_8x32_avx512(int acc, int64_t p0, int64_t p1, const float *restrict A, int64_t lda,
                                           const float *restrict B, int64_t ldb, float *restrict C, int64_t ldc)
{
    __m512 c0a = _mm512_setzero_ps(), c0b = c0a, c1a = c0a, c1b = c0a, c2a = c0a, c2b = c0a, c3a = c0a, c3b = c0a;
    __m512 c4a = c0a, c4b = c0a, c5a = c0a, c5b = c0a, c6a = c0a, c6b = c0a, c7a = c0a, c7b = c0a;
    for (int64_t p = p0; p < p1; p++) {
        const float *b = B + p * ldb;
        __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
        const float *a = A + p;
        ROW_FMA2(0, a[0]);
        ROW_FMA2(1, a[lda]);
        ROW_FMA2(2, a[2 * lda]);
        ROW_FMA2(3, a[3 * lda]);
        ROW_FMA2(4, a[4 * lda]);
        ROW_FMA2(5, a[5 * lda]);
        ROW_FMA2(6, a[6 * lda]);
        ROW_FMA2(7, a[7 * lda]);
    }
    ROW_STORE2(0); ROW_STORE2(1); ROW_STORE2(2); ROW_STORE2(3);
    ROW_STORE2(4); ROW_STORE2(5); ROW_STORE2(6); ROW_STORE2(7);
}

FQLA_AVX512 static void kernel_4x32_avx512(int acc, int64_t p0, int64_t p1, const float *restrict A, int64_t lda,
                                           const float *restrict B, int64_t ldb, float *restrict C, int64_t ldc)
{
    __m512 c0a = _mm512_setzero_ps(), c0b = c0a, c1a = c0a, c1b = c0a, c2a = c0a, c2b = c0a, c3a = c0a, c3b = c0a;
    for (int64_t p = p0; p < p1; p++) {
        const float *b = B + p * ldb;
        __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
        const float *a = A + p;
        ROW_FMA2(0, a[0]);
        ROW_FMA2(1, a[lda]);
        ROW_FMA2(2, a[2 * lda]);
        ROW_FMA2(3, a[3 * lda]);
    }
    ROW_STORE2(0); ROW_STORE2(1); ROW_STORE2(2); ROW_STORE2(3);
}

#define ROW_FMA1(r, x) c##r = _mm512_fmadd_ps(_mm512_set1_ps(x), b0, c##r)
#define ROW_STORE1(r)                                                         \
    do {                                                                      \
        float *cr = C + (r) * ldc;                                            \
        if (acc)                                                              \
            c##r = _mm512_add_ps(_mm512_loadu_ps(cr), c##r);                  \
        _mm512_storeu_ps(cr, c##r);                                           \
    } while (0)

FQLA_AVX512 static void kernel_8x16_avx512(int acc, int64_t p0, int64_t p1, const float *restrict A, int64_t lda,
                                           const float *restrict B, int64_t ldb, float *restrict C, int64_t ldc)
{
    __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0, c7 = c0;
    for (int64_t p = p0; p < p1; p++) {
        __m512 b0 = _mm512_loadu_ps(B + p * ldb);
        const float *a = A + p;
        ROW_FMA1(0, a[0]);
        ROW_FMA1(1, a[lda]);
        ROW_FMA1(2, a[2 * lda]);
        ROW_FMA1(3, a[3 * lda]);
        ROW_FMA1(4, a[4 * lda]);
        ROW_FMA1(5, a[5 * lda]);
        ROW_FMA1(6, a[6 * lda]);
        ROW_FMA1(7, a[7 * lda]);
    }
    ROW_STORE1(0); ROW_STORE1(1); ROW_STORE1(2); ROW_STORE1(3);
    ROW_STORE1(4); ROW_STORE1(5); ROW_STORE1(6); ROW_STORE1(7);
}

FQLA_AVX512 static void kernel_4x16_avx512(int acc, int64_t p0, int64_t p1, const float *restrict A, int64_t lda,
                                           const float *restrict B, int64_t ldb, float *restrict C, int64_t ldc)
{
    __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0;
    for (int64_t p = p0; p < p1; p++) {
        __m512 b0 = _mm512_loadu_ps(B + p * ldb);
        const float *a = A + p;
        ROW_FMA1(0, a[0]);
        ROW_FMA1(1, a[lda]);
        ROW_FMA1(2, a[2 * lda]);
        ROW_FMA1(3, a[3 * lda]);
    }
    ROW_STORE1(0); ROW_STORE1(1); ROW_STORE1(2); ROW_STORE1(3);
}

/* FQLA_GEMM_C_LOWER (the chunk-local Gram matrices): 8 x 16 tiles wholly
 * on or below the diagonal, and the AVX2 walk's 4 x 8 blocks in the tiles
 * the diagonal crosses, so exactly the blocks the AVX2 walk writes are
 * written (none wholly above the diagonal), with the same sums. */
FQLA_AVX512 static void gemm_lower_avx512(int acc, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda,
                                          const float *B, int64_t ldb, float *C, int64_t ldc)
{
    for (int64_t j = 0; j < n; j += 16) {
        int64_t w = n - j >= 16 ? 16 : 8;
        for (int64_t i = (j / 4) * 4; i < m; i += 8) {
            if (i + 8 <= m && w == 16 && i >= j + 15) {
                kernel_8x16_avx512(acc, 0, k, A + i * lda, lda, B + j, ldb, C + i * ldc + j, ldc);
                continue;
            }
            for (int64_t ih = i; ih < i + 8 && ih < m; ih += 4)
                for (int64_t jh = j; jh < j + w; jh += 8)
                    if (ih + 3 >= jh)
                        kernel_4x8_avx2(acc, 0, k, A + ih * lda, lda, B + jh, ldb, C + ih * ldc + jh, ldc);
        }
    }
}

/* Column panels of 32 (then 16, then a last 8 on the AVX2 4 x 8 tile),
 * row blocks of 8 (then 4). */
FQLA_AVX512 static void gemm_avx512(int flags, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda,
                                    const float *B, int64_t ldb, float *C, int64_t ldc)
{
    int acc = (flags & FQLA_GEMM_ACC) != 0;
    for (int64_t j = 0; j < n;) {
        int64_t w = n - j >= 32 ? 32 : n - j >= 16 ? 16 : 8;
        for (int64_t i = 0; i < m;) {
            int64_t h = m - i >= 8 ? 8 : 4;
            int64_t p0 = 0, p1 = k;
            if ((flags & FQLA_GEMM_A_LOWER) && i + h < p1)
                p1 = i + h;
            if ((flags & FQLA_GEMM_A_UPPER) && i > p0)
                p0 = i < k ? i : k;
            const float *a = A + i * lda, *b = B + j;
            float *c = C + i * ldc + j;
            if (w == 32) {
                if (h == 8) kernel_8x32_avx512(acc, p0, p1, a, lda, b, ldb, c, ldc);
                else kernel_4x32_avx512(acc, p0, p1, a, lda, b, ldb, c, ldc);
            } else if (w == 16) {
                if (h == 8) kernel_8x16_avx512(acc, p0, p1, a, lda, b, ldb, c, ldc);
                else kernel_4x16_avx512(acc, p0, p1, a, lda, b, ldb, c, ldc);
            } else {
                kernel_4x8_avx2(acc, p0, p1, a, lda, b, ldb, c, ldc);
                if (h == 8)
                    kernel_4x8_avx2(acc, p0, p1, a + 4 * lda, lda, b, ldb, c + 4 * ldc, ldc);
            }
            i += h;
        }
        j += w;
    }
}
#endif


#if defined(__aarch64__)
#define FQLA_HAVE_NEON_GEMM 1
#include <arm_neon.h>
/*
 * The NEON product (aarch64, where NEON and FMA are baseline): the AVX2
 * walk with 4-float registers. A 4 x 16 tile has sixteen accumulators (half
 * of the 32 vector registers; enough independent FMA chains for the
 * latency x throughput of big Arm cores), four B loads and four A
 * broadcasts (fmla by element) per sixteen FMAs; a 4 x 8 tile for the last
 * odd panel and the blocks C_LOWER needs only half of. Every C element is
 * one FMA chain over p in increasing order in either tile, so the tile
 * never changes a result (and the sums are those of the x86 AVX2 tiles).
 */
#define NEON_STORE(r, acc_v, w)                                                   \
    do {                                                                          \
        for (int c = 0; c < (w) / 4; c++) {                                       \
            float32x4_t x = (acc_v)[c];                                           \
            if (acc)                                                              \
                x = vaddq_f32(vld1q_f32((r) + 4 * c), x);                         \
            vst1q_f32((r) + 4 * c, x);                                            \
        }                                                                         \
    } while (0)

/* C[4 x 16] (+)= A[4 x (p0..p1)] B[(p0..p1) x 16]. */
static void kernel_4x16_neon(int acc, int64_t p0, int64_t p1, const float *restrict A, int64_t lda,
                             const float *restrict B, int64_t ldb, float *restrict C, int64_t ldc)
{
    float32x4_t c0[4], c1[4], c2[4], c3[4];
    for (int c = 0; c < 4; c++)
        c0[c] = c1[c] = c2[c] = c3[c] = vdupq_n_f32(0.0f);
    const float *a0 = A, *a1 = A + lda, *a2 = A + 2 * lda, *a3 = A + 3 * lda;
    for (int64_t p = p0; p < p1; p++) {
        const float *b = B + p * ldb;
        float32x4_t b0 = vld1q_f32(b), b1 = vld1q_f32(b + 4), b2 = vld1q_f32(b + 8), b3 = vld1q_f32(b + 12);
        float x0 = a0[p], x1 = a1[p], x2 = a2[p], x3 = a3[p];
        c0[0] = vfmaq_n_f32(c0[0], b0, x0); c0[1] = vfmaq_n_f32(c0[1], b1, x0);
        c0[2] = vfmaq_n_f32(c0[2], b2, x0); c0[3] = vfmaq_n_f32(c0[3], b3, x0);
        c1[0] = vfmaq_n_f32(c1[0], b0, x1); c1[1] = vfmaq_n_f32(c1[1], b1, x1);
        c1[2] = vfmaq_n_f32(c1[2], b2, x1); c1[3] = vfmaq_n_f32(c1[3], b3, x1);
        c2[0] = vfmaq_n_f32(c2[0], b0, x2); c2[1] = vfmaq_n_f32(c2[1], b1, x2);
        c2[2] = vfmaq_n_f32(c2[2], b2, x2); c2[3] = vfmaq_n_f32(c2[3], b3, x2);
        c3[0] = vfmaq_n_f32(c3[0], b0, x3); c3[1] = vfmaq_n_f32(c3[1], b1, x3);
        c3[2] = vfmaq_n_f32(c3[2], b2, x3); c3[3] = vfmaq_n_f32(c3[3], b3, x3);
    }
    NEON_STORE(C, c0, 16);
    NEON_STORE(C + ldc, c1, 16);
    NEON_STORE(C + 2 * ldc, c2, 16);
    NEON_STORE(C + 3 * ldc, c3, 16);
}

/* C[4 x 8] (+)= A[4 x (p0..p1)] B[(p0..p1) x 8]. */
static void kernel_4x8_neon(int acc, int64_t p0, int64_t p1, const float *restrict A, int64_t lda,
                            const float *restrict B, int64_t ldb, float *restrict C, int64_t ldc)
{
    float32x4_t c0[2], c1[2], c2[2], c3[2];
    for (int c = 0; c < 2; c++)
        c0[c] = c1[c] = c2[c] = c3[c] = vdupq_n_f32(0.0f);
    const float *a0 = A, *a1 = A + lda, *a2 = A + 2 * lda, *a3 = A + 3 * lda;
    for (int64_t p = p0; p < p1; p++) {
        const float *b = B + p * ldb;
        float32x4_t b0 = vld1q_f32(b), b1 = vld1q_f32(b + 4);
        float x0 = a0[p], x1 = a1[p], x2 = a2[p], x3 = a3[p];
        c0[0] = vfmaq_n_f32(c0[0], b0, x0); c0[1] = vfmaq_n_f32(c0[1], b1, x0);
        c1[0] = vfmaq_n_f32(c1[0], b0, x1); c1[1] = vfmaq_n_f32(c1[1], b1, x1);
        c2[0] = vfmaq_n_f32(c2[0], b0, x2); c2[1] = vfmaq_n_f32(c2[1], b1, x2);
        c3[0] = vfmaq_n_f32(c3[0], b0, x3); c3[1] = vfmaq_n_f32(c3[1], b1, x3);
    }
    NEON_STORE(C, c0, 8);
    NEON_STORE(C + ldc, c1, 8);
    NEON_STORE(C + 2 * ldc, c2, 8);
    NEON_STORE(C + 3 * ldc, c3, 8);
}

/* gemm_avx2's walk: 16-column panels (an 8-column one last when n % 16 ==
 * 8); under C_LOWER the 4 x 8 tile for blocks that need only the left half,
 * so no block wholly above the diagonal is written. */
static void gemm_neon(int flags, int64_t m, int64_t n, int64_t k, const float *A, int64_t lda,
                      const float *B, int64_t ldb, float *C, int64_t ldc)
{
    int acc = (flags & FQLA_GEMM_ACC) != 0;
    int lower = (flags & FQLA_GEMM_C_LOWER) != 0;
    for (int64_t j = 0; j < n; j += 16) {
        int wide = j + 16 <= n;
        int64_t i0 = lower ? (j / 4) * 4 : 0;
        for (int64_t i = i0; i < m; i += 4) {
            int64_t p0 = 0, p1 = k;
            if ((flags & FQLA_GEMM_A_LOWER) && i + 4 < p1)
                p1 = i + 4;
            if ((flags & FQLA_GEMM_A_UPPER) && i > p0)
                p0 = i < k ? i : k;
            const float *a = A + i * lda;
            float *c = C + i * ldc + j;
            if (wide && !(lower && i + 3 < j + 8))
                kernel_4x16_neon(acc, p0, p1, a, lda, B + j, ldb, c, ldc);
            else
                kernel_4x8_neon(acc, p0, p1, a, lda, B + j, ldb, c, ldc);
        }
    }
}
#endif

void fqla_gemm(int flags, int64_t m, int64_t n, int64_t k,
               const float *A, int64_t lda, const float *B, int64_t ldb,
               float *C, int64_t ldc)
{
#ifdef FQLA_HAVE_AVX2_GEMM
    int isa = fqla_cpu_isa();
    if (isa >= FQLA_CPU_ISA_AVX512 && (flags & FQLA_GEMM_C_LOWER) &&
        !(flags & (FQLA_GEMM_A_LOWER | FQLA_GEMM_A_UPPER))) {
        gemm_lower_avx512((flags & FQLA_GEMM_ACC) != 0, m, n, k, A, lda, B, ldb, C, ldc);
        return;
    }
    if (isa >= FQLA_CPU_ISA_AVX512 && !(flags & FQLA_GEMM_C_LOWER)) {
        gemm_avx512(flags, m, n, k, A, lda, B, ldb, C, ldc);
        return;
    }
    if (isa >= FQLA_CPU_ISA_AVX2) {
        gemm_avx2(flags, m, n, k, A, lda, B, ldb, C, ldc);
        return;
    }
#endif
#ifdef FQLA_HAVE_NEON_GEMM
    if (fqla_cpu_isa() >= FQLA_CPU_ISA_NEON) {
        gemm_neon(flags, m, n, k, A, lda, B, ldb, C, ldc);
        return;
    }
#endif
    gemm_base(flags, m, n, k, A, lda, B, ldb, C, ldc);
}

static void transpose_base(int64_t i0, int64_t i1, int64_t j0, int64_t j1, const float *src, int64_t lds,
                           float *dst, int64_t ldd)
{
    for (int64_t j = j0; j < j1; j++)
        for (int64_t i = i0; i < i1; i++)
            dst[j * ldd + i] = src[i * lds + j];
}

#ifdef FQLA_HAVE_AVX2_GEMM
/* One full 8 x 8 tile in ymm registers: unpack pairs, shuffle quads,
 * swap 128-bit halves (the usual three-stage transpose). */
FQLA_AVX512 static void transpose8x8_avx(const float *src, int64_t lds, float *dst, int64_t ldd)
{
    __m256 r0 = _mm256_loadu_ps(src), r1 = _mm256_loadu_ps(src + lds);
    __m256 r2 = _mm256_loadu_ps(src + 2 * lds), r3 = _mm256_loadu_ps(src + 3 * lds);
    __m256 r4 = _mm256_loadu_ps(src + 4 * lds), r5 = _mm256_loadu_ps(src + 5 * lds);
    __m256 r6 = _mm256_loadu_ps(src + 6 * lds), r7 = _mm256_loadu_ps(src + 7 * lds);
    __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
    __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
    __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
    __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xee);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xee);
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xee);
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xee);
    _mm256_storeu_ps(dst, _mm256_permute2f128_ps(u0, u4, 0x20));
    _mm256_storeu_ps(dst + ldd, _mm256_permute2f128_ps(u1, u5, 0x20));
    _mm256_storeu_ps(dst + 2 * ldd, _mm256_permute2f128_ps(u2, u6, 0x20));
    _mm256_storeu_ps(dst + 3 * ldd, _mm256_permute2f128_ps(u3, u7, 0x20));
    _mm256_storeu_ps(dst + 4 * ldd, _mm256_permute2f128_ps(u0, u4, 0x31));
    _mm256_storeu_ps(dst + 5 * ldd, _mm256_permute2f128_ps(u1, u5, 0x31));
    _mm256_storeu_ps(dst + 6 * ldd, _mm256_permute2f128_ps(u2, u6, 0x31));
    _mm256_storeu_ps(dst + 7 * ldd, _mm256_permute2f128_ps(u3, u7, 0x31));
}
#endif

#ifdef FQLA_HAVE_NEON_GEMM
/* One full 8 x 8 tile as four 4 x 4 blocks in q registers: 32-bit then
 * 64-bit interleaves (trn1 / trn2) transpose each block, which is stored
 * to the mirrored block. */
static void transpose8x8_neon(const float *src, int64_t lds, float *dst, int64_t ldd)
{
    for (int bi = 0; bi < 8; bi += 4)
        for (int bj = 0; bj < 8; bj += 4) {
            const float *s = src + bi * lds + bj;
            float32x4_t r0 = vld1q_f32(s), r1 = vld1q_f32(s + lds);
            float32x4_t r2 = vld1q_f32(s + 2 * lds), r3 = vld1q_f32(s + 3 * lds);
            float32x4_t t0 = vtrn1q_f32(r0, r1), t1 = vtrn2q_f32(r0, r1);
            float32x4_t t2 = vtrn1q_f32(r2, r3), t3 = vtrn2q_f32(r2, r3);
            float64x2_t d0 = vreinterpretq_f64_f32(t0), d1 = vreinterpretq_f64_f32(t1);
            float64x2_t d2 = vreinterpretq_f64_f32(t2), d3 = vreinterpretq_f64_f32(t3);
            float *d = dst + bj * ldd + bi;
            vst1q_f32(d, vreinterpretq_f32_f64(vtrn1q_f64(d0, d2)));
            vst1q_f32(d + ldd, vreinterpretq_f32_f64(vtrn1q_f64(d1, d3)));
            vst1q_f32(d + 2 * ldd, vreinterpretq_f32_f64(vtrn2q_f64(d0, d2)));
            vst1q_f32(d + 3 * ldd, vreinterpretq_f32_f64(vtrn2q_f64(d1, d3)));
        }
}
#endif

void fqla_transpose(int64_t rows, int64_t cols, const float *src, int64_t lds,
                    float *dst, int64_t ldd)
{
#ifdef FQLA_HAVE_AVX2_GEMM
    int simd = fqla_cpu_isa() >= FQLA_CPU_ISA_AVX512;
#elif defined(FQLA_HAVE_NEON_GEMM)
    int simd = fqla_cpu_isa() >= FQLA_CPU_ISA_NEON;
#else
    int simd = 0;
#endif
    /* 8 x 8 tiles keep both sides in a few cache lines */
    for (int64_t i0 = 0; i0 < rows; i0 += 8)
        for (int64_t j0 = 0; j0 < cols; j0 += 8) {
            int64_t i1 = i0 + 8 < rows ? i0 + 8 : rows, j1 = j0 + 8 < cols ? j0 + 8 : cols;
#ifdef FQLA_HAVE_AVX2_GEMM
            if (simd && i1 - i0 == 8 && j1 - j0 == 8) {
                transpose8x8_avx(src + i0 * lds + j0, lds, dst + j0 * ldd + i0, ldd);
                continue;
            }
#elif defined(FQLA_HAVE_NEON_GEMM)
            if (simd && i1 - i0 == 8 && j1 - j0 == 8) {
                transpose8x8_neon(src + i0 * lds + j0, lds, dst + j0 * ldd + i0, ldd);
                continue;
            }
#endif
            (void)simd;
            transpose_base(i0, i1, j0, j1, src, lds, dst, ldd);
        }
}

/* The element-wise helpers, written once (ELEMENTWISE) and compiled for the
 * baseline and, on x86, for AVX-512F: gcc vectorises each 8-float block
 * into one ymm there instead of two xmm (no FMA contraction under
 * -std=c99, so both bodies round alike). */
#define ELEMENTWISE(attr, sfx)                                                                   \
    attr static void scale8_##sfx(int64_t n, float a, float *x)                                  \
    {                                                                                            \
        for (int64_t i = 0; i < n; i += 8)                                                       \
            for (int c = 0; c < 8; c++)                                                          \
                x[i + c] *= a;                                                                   \
    }                                                                                            \
    attr static void axpy8_##sfx(int64_t n, float a, const float *restrict x, float *restrict y) \
    {                                                                                            \
        for (int64_t i = 0; i < n; i += 8)                                                       \
            for (int c = 0; c < 8; c++)                                                          \
                y[i + c] += a * x[i + c];                                                        \
    }                                                                                            \
    attr static void mul8_##sfx(int64_t n, const float *restrict x, const float *restrict y,     \
                                float *restrict z)                                               \
    {                                                                                            \
        for (int64_t i = 0; i < n; i += 8)                                                       \
            for (int c = 0; c < 8; c++)                                                          \
                z[i + c] = x[i + c] * y[i + c];                                                  \
    }                                                                                            \
    attr static void mul_scale8_##sfx(int64_t n, const float *restrict x, const float *restrict y, \
                                      float s, float *restrict out)                              \
    {                                                                                            \
        for (int64_t i = 0; i < n; i += 8)                                                       \
            for (int c = 0; c < 8; c++)                                                          \
                out[i + c] = x[i + c] * y[i + c] * s;                                            \
    }                                                                                            \
    attr static void mul3_8_##sfx(int64_t n, const float *restrict x, const float *restrict y,   \
                                  const float *restrict z, float *restrict out)                  \
    {                                                                                            \
        for (int64_t i = 0; i < n; i += 8)                                                       \
            for (int c = 0; c < 8; c++)                                                          \
                out[i + c] = x[i + c] * y[i + c] * z[i + c];                                     \
    }                                                                                            \
    attr static void xpay8_##sfx(int64_t n, const float *restrict x, float a, const float *restrict y, \
                                 float *restrict out)                                            \
    {                                                                                            \
        for (int64_t i = 0; i < n; i += 8)                                                       \
            for (int c = 0; c < 8; c++)                                                          \
                out[i + c] = x[i + c] + a * y[i + c];                                            \
    }

ELEMENTWISE(, base)
#ifdef FQLA_HAVE_AVX2_GEMM
ELEMENTWISE(FQLA_AVX512, avx512)
#define ELEMENTWISE_CALL(name, ...)                          \
    do {                                                     \
        if (fqla_cpu_isa() >= FQLA_CPU_ISA_AVX512)           \
            name##_avx512(__VA_ARGS__);                      \
        else                                                 \
            name##_base(__VA_ARGS__);                        \
    } while (0)
#else
#define ELEMENTWISE_CALL(name, ...) name##_base(__VA_ARGS__)
#endif

void fqla_scale8(int64_t n, float a, float *x) { ELEMENTWISE_CALL(scale8, n, a, x); }

void fqla_axpy8(int64_t n, float a, const float *restrict x, float *restrict y)
{
    ELEMENTWISE_CALL(axpy8, n, a, x, y);
}

void fqla_mul8(int64_t n, const float *restrict x, const float *restrict y, float *restrict z)
{
    ELEMENTWISE_CALL(mul8, n, x, y, z);
}

void fqla_mul_scale8(int64_t n, const float *restrict x, const float *restrict y, float s,
                     float *restrict out)
{
    ELEMENTWISE_CALL(mul_scale8, n, x, y, s, out);
}

void fqla_mul3_8(int64_t n, const float *restrict x, const float *restrict y, const float *restrict z,
                 float *restrict out)
{
    ELEMENTWISE_CALL(mul3_8, n, x, y, z, out);
}

void fqla_xpay8(int64_t n, const float *restrict x, float a, const float *restrict y, float *restrict out)
{
    ELEMENTWISE_CALL(xpay8, n, x, a, y, out);
}

double fqla_dot_f64(int64_t n, const float *x, const float *y)
{
    /* four independent fp64 sums (one dependency chain would cost an add
     * latency per element), combined in a fixed order */
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        s0 += (double)x[i] * y[i];
        s1 += (double)x[i + 1] * y[i + 1];
        s2 += (double)x[i + 2] * y[i + 2];
        s3 += (double)x[i + 3] * y[i + 3];
    }
    for (; i < n; i++)
        s0 += (double)x[i] * y[i];
    return (s0 + s1) + (s2 + s3);
}
