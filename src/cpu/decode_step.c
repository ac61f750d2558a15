/*
 * decode_step.c - one decode token on a tile of the state, portable C plus
 * AVX2 + FMA and AVX-512F bodies chosen at run time on x86, NEON bodies on
 * aarch64 (see decode_step.h).
 *
 * Every body computes the same sums in the same association within itself
 * (fixed partial accumulators, combined in a fixed order), so a path's
 * results never depend on the thread count; the paths round differently
 * from each other (FMA, lane order) and are each held to the fp64 oracle.
 */
#include "cpu/decode_step.h"

#include "cpu/cpu_isa.h"

#include <string.h>

/* ---- portable C ---- */

#if defined(__GNUC__)
#define FQLA_INLINE __attribute__((always_inline)) inline
#else
#define FQLA_INLINE inline
#endif

/* Written for a constant w (32) after inlining so gcc -O2 vectorises the
 * j loops; any w <= FQLA_DECODE_KV_TILE is correct. */
static FQLA_INLINE void kv_c(int64_t K, int64_t w, float *S, int64_t ld, const fqla_decode_token *t,
                             float *o)
{
    float wv[FQLA_DECODE_KV_TILE] = {0}, rv[FQLA_DECODE_KV_TILE] = {0}, u[FQLA_DECODE_KV_TILE];
    for (int64_t i = 0; i < K; i++) {
        const float *row = S + i * ld;
        float ki = t->k[i], qi = t->q[i];
        for (int64_t j = 0; j < w; j++) {
            wv[j] += ki * row[j];
            rv[j] += qi * row[j];
        }
    }
    for (int64_t j = 0; j < w; j++) {
        u[j] = t->beta * (t->v[j] - t->a * wv[j]);
        o[j] = t->ca * rv[j] + t->cu * u[j];
    }
    for (int64_t i = 0; i < K; i++) {
        float *row = S + i * ld, ki = t->k[i];
        for (int64_t j = 0; j < w; j++)
            row[j] = t->a * row[j] + ki * u[j];
    }
}

static void kv_c32(int64_t K, float *S, int64_t ld, const fqla_decode_token *t, float *o)
{
    kv_c(K, 32, S, ld, t, o);
}

static void kv_cw(int64_t K, int64_t w, float *S, int64_t ld, const fqla_decode_token *t, float *o)
{
    kv_c(K, w, S, ld, t, o);
}

static void vk_c(int64_t K, int64_t n, float *S, int64_t ld, const fqla_decode_token *t, float *o)
{
    for (int64_t j = 0; j < n; j++) {
        float *row = S + j * ld;
        /* two partial sums each: half the dependency chain */
        float w0 = 0, w1 = 0, r0 = 0, r1 = 0;
        int64_t i = 0;
        for (; i + 2 <= K; i += 2) {
            w0 += row[i] * t->k[i];
            r0 += row[i] * t->q[i];
            w1 += row[i + 1] * t->k[i + 1];
            r1 += row[i + 1] * t->q[i + 1];
        }
        if (i < K) {
            w0 += row[i] * t->k[i];
            r0 += row[i] * t->q[i];
        }
        float u = t->beta * (t->v[j] - t->a * (w0 + w1));
        o[j] = t->ca * (r0 + r1) + t->cu * u;
        for (i = 0; i < K; i++)
            row[i] = t->a * row[i] + u * t->k[i];
    }
}

/* ---- x86 SIMD bodies ---- */

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define FQLA_HAVE_X86_DECODE 1
#include <immintrin.h>

#define FQLA_AVX2 __attribute__((target("avx2,fma")))
#define FQLA_AVX512 __attribute__((target("avx512f,avx2,fma")))

/* 16 columns as two ymm; rows in pairs (eight accumulators). */
FQLA_AVX2 static void kv_avx2(int64_t K, float *S, int64_t ld, const fqla_decode_token *t, float *o)
{
    __m256 w0a = _mm256_setzero_ps(), w0b = w0a, w1a = w0a, w1b = w0a;
    __m256 r0a = w0a, r0b = w0a, r1a = w0a, r1b = w0a;
    int64_t i = 0;
    for (; i + 2 <= K; i += 2) {
        const float *s0 = S + i * ld, *s1 = s0 + ld;
        __m256 k0 = _mm256_broadcast_ss(t->k + i), q0 = _mm256_broadcast_ss(t->q + i);
        __m256 k1 = _mm256_broadcast_ss(t->k + i + 1), q1 = _mm256_broadcast_ss(t->q + i + 1);
        __m256 a0 = _mm256_loadu_ps(s0), b0 = _mm256_loadu_ps(s0 + 8);
        __m256 a1 = _mm256_loadu_ps(s1), b1 = _mm256_loadu_ps(s1 + 8);
        w0a = _mm256_fmadd_ps(k0, a0, w0a);
        w0b = _mm256_fmadd_ps(k0, b0, w0b);
        r0a = _mm256_fmadd_ps(q0, a0, r0a);
        r0b = _mm256_fmadd_ps(q0, b0, r0b);
        w1a = _mm256_fmadd_ps(k1, a1, w1a);
        w1b = _mm256_fmadd_ps(k1, b1, w1b);
        r1a = _mm256_fmadd_ps(q1, a1, r1a);
        r1b = _mm256_fmadd_ps(q1, b1, r1b);
    }
    if (i < K) {
        const float *s0 = S + i * ld;
        __m256 k0 = _mm256_broadcast_ss(t->k + i), q0 = _mm256_broadcast_ss(t->q + i);
        __m256 a0 = _mm256_loadu_ps(s0), b0 = _mm256_loadu_ps(s0 + 8);
        w0a = _mm256_fmadd_ps(k0, a0, w0a);
        w0b = _mm256_fmadd_ps(k0, b0, w0b);
        r0a = _mm256_fmadd_ps(q0, a0, r0a);
        r0b = _mm256_fmadd_ps(q0, b0, r0b);
    }
    __m256 av = _mm256_set1_ps(t->a), bv = _mm256_set1_ps(t->beta);
    __m256 cav = _mm256_set1_ps(t->ca), cuv = _mm256_set1_ps(t->cu);
    __m256 ua = _mm256_mul_ps(bv, _mm256_fnmadd_ps(av, _mm256_add_ps(w0a, w1a), _mm256_loadu_ps(t->v)));
    __m256 ub = _mm256_mul_ps(bv, _mm256_fnmadd_ps(av, _mm256_add_ps(w0b, w1b), _mm256_loadu_ps(t->v + 8)));
    _mm256_storeu_ps(o, _mm256_fmadd_ps(cav, _mm256_add_ps(r0a, r1a), _mm256_mul_ps(cuv, ua)));
    _mm256_storeu_ps(o + 8, _mm256_fmadd_ps(cav, _mm256_add_ps(r0b, r1b), _mm256_mul_ps(cuv, ub)));
    for (i = 0; i < K; i++) {
        float *row = S + i * ld;
        __m256 ki = _mm256_broadcast_ss(t->k + i);
        _mm256_storeu_ps(row, _mm256_fmadd_ps(ki, ua, _mm256_mul_ps(av, _mm256_loadu_ps(row))));
        _mm256_storeu_ps(row + 8, _mm256_fmadd_ps(ki, ub, _mm256_mul_ps(av, _mm256_loadu_ps(row + 8))));
    }
}

/* 16 columns as one zmm; rows in fours (eight accumulators). */
FQLA_AVX512 static void kv_avx512(int64_t K, float *S, int64_t ld, const fqla_decode_token *t, float *o)
{
    __m512 w0 = _mm512_setzero_ps(), w1 = w0, w2 = w0, w3 = w0;
    __m512 r0 = w0, r1 = w0, r2 = w0, r3 = w0;
    int64_t i = 0;
    for (; i + 4 <= K; i += 4) {
        const float *s = S + i * ld;
        __m512 a0 = _mm512_loadu_ps(s), a1 = _mm512_loadu_ps(s + ld);
        __m512 a2 = _mm512_loadu_ps(s + 2 * ld), a3 = _mm512_loadu_ps(s + 3 * ld);
        w0 = _mm512_fmadd_ps(_mm512_set1_ps(t->k[i]), a0, w0);
        r0 = _mm512_fmadd_ps(_mm512_set1_ps(t->q[i]), a0, r0);
        w1 = _mm512_fmadd_ps(_mm512_set1_ps(t->k[i + 1]), a1, w1);
        r1 = _mm512_fmadd_ps(_mm512_set1_ps(t->q[i + 1]), a1, r1);
        w2 = _mm512_fmadd_ps(_mm512_set1_ps(t->k[i + 2]), a2, w2);
        r2 = _mm512_fmadd_ps(_mm512_set1_ps(t->q[i + 2]), a2, r2);
        w3 = _mm512_fmadd_ps(_mm512_set1_ps(t->k[i + 3]), a3, w3);
        r3 = _mm512_fmadd_ps(_mm512_set1_ps(t->q[i + 3]), a3, r3);
    }
    for (; i < K; i++) {
        __m512 a0 = _mm512_loadu_ps(S + i * ld);
        w0 = _mm512_fmadd_ps(_mm512_set1_ps(t->k[i]), a0, w0);
        r0 = _mm512_fmadd_ps(_mm512_set1_ps(t->q[i]), a0, r0);
    }
    __m512 w = _mm512_add_ps(_mm512_add_ps(w0, w1), _mm512_add_ps(w2, w3));
    __m512 r = _mm512_add_ps(_mm512_add_ps(r0, r1), _mm512_add_ps(r2, r3));
    __m512 av = _mm512_set1_ps(t->a);
    __m512 u = _mm512_mul_ps(_mm512_set1_ps(t->beta), _mm512_fnmadd_ps(av, w, _mm512_loadu_ps(t->v)));
    _mm512_storeu_ps(o, _mm512_fmadd_ps(_mm512_set1_ps(t->ca), r, _mm512_mul_ps(_mm512_set1_ps(t->cu), u)));
    for (i = 0; i < K; i++) {
        float *row = S + i * ld;
        _mm512_storeu_ps(row, _mm512_fmadd_ps(_mm512_set1_ps(t->k[i]), u, _mm512_mul_ps(av, _mm512_loadu_ps(row))));
    }
}

/* 32 columns as two zmm (two cache lines per row, which the prefetchers
 * follow better than one line per 512-byte row); rows in pairs (eight
 * accumulators). */
FQLA_AVX512 static void kv_avx512_32(int64_t K, float *S, int64_t ld, const fqla_decode_token *t, float *o)
{
    __m512 w0a = _mm512_setzero_ps(), w0b = w0a, w1a = w0a, w1b = w0a;
    __m512 r0a = w0a, r0b = w0a, r1a = w0a, r1b = w0a;
    int64_t i = 0;
    for (; i + 2 <= K; i += 2) {
        const float *s0 = S + i * ld, *s1 = s0 + ld;
        __m512 k0 = _mm512_set1_ps(t->k[i]), q0 = _mm512_set1_ps(t->q[i]);
        __m512 k1 = _mm512_set1_ps(t->k[i + 1]), q1 = _mm512_set1_ps(t->q[i + 1]);
        __m512 a0 = _mm512_loadu_ps(s0), b0 = _mm512_loadu_ps(s0 + 16);
        __m512 a1 = _mm512_loadu_ps(s1), b1 = _mm512_loadu_ps(s1 + 16);
        w0a = _mm512_fmadd_ps(k0, a0, w0a);
        w0b = _mm512_fmadd_ps(k0, b0, w0b);
        r0a = _mm512_fmadd_ps(q0, a0, r0a);
        r0b = _mm512_fmadd_ps(q0, b0, r0b);
        w1a = _mm512_fmadd_ps(k1, a1, w1a);
        w1b = _mm512_fmadd_ps(k1, b1, w1b);
        r1a = _mm512_fmadd_ps(q1, a1, r1a);
        r1b = _mm512_fmadd_ps(q1, b1, r1b);
    }
    if (i < K) {
        const float *s0 = S + i * ld;
        __m512 k0 = _mm512_set1_ps(t->k[i]), q0 = _mm512_set1_ps(t->q[i]);
        __m512 a0 = _mm512_loadu_ps(s0), b0 = _mm512_loadu_ps(s0 + 16);
        w0a = _mm512_fmadd_ps(k0, a0, w0a);
        w0b = _mm512_fmadd_ps(k0, b0, w0b);
        r0a = _mm512_fmadd_ps(q0, a0, r0a);
        r0b = _mm512_fmadd_ps(q0, b0, r0b);
    }
    __m512 av = _mm512_set1_ps(t->a), bv = _mm512_set1_ps(t->beta);
    __m512 cav = _mm512_set1_ps(t->ca), cuv = _mm512_set1_ps(t->cu);
    __m512 ua = _mm512_mul_ps(bv, _mm512_fnmadd_ps(av, _mm512_add_ps(w0a, w1a), _mm512_loadu_ps(t->v)));
    __m512 ub = _mm512_mul_ps(bv, _mm512_fnmadd_ps(av, _mm512_add_ps(w0b, w1b), _mm512_loadu_ps(t->v + 16)));
    _mm512_storeu_ps(o, _mm512_fmadd_ps(cav, _mm512_add_ps(r0a, r1a), _mm512_mul_ps(cuv, ua)));
    _mm512_storeu_ps(o + 16, _mm512_fmadd_ps(cav, _mm512_add_ps(r0b, r1b), _mm512_mul_ps(cuv, ub)));
    for (i = 0; i < K; i++) {
        float *row = S + i * ld;
        __m512 ki = _mm512_set1_ps(t->k[i]);
        _mm512_storeu_ps(row, _mm512_fmadd_ps(ki, ua, _mm512_mul_ps(av, _mm512_loadu_ps(row))));
        _mm512_storeu_ps(row + 16, _mm512_fmadd_ps(ki, ub, _mm512_mul_ps(av, _mm512_loadu_ps(row + 16))));
    }
}

/* 128 columns, whole rows of a V = 128 state, read from S and written to D
 * (the same memory in place, the next step's state in verify): the first pass walks
 * memory in order (the prefetchers follow it; 32-column strips read one
 * line in four of each row), the second finds the state in L2. Sixteen
 * accumulators, each updated once per row. */
FQLA_AVX512 static void kv_avx512_128(int64_t K, const float *S, int64_t ld, float *D, int64_t ldd,
                                      const fqla_decode_token *t, float *o)
{
    __m512 w[8], r[8], u[8];
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++)
        w[c] = r[c] = _mm512_setzero_ps();
    for (int64_t i = 0; i < K; i++) {
        const float *row = S + i * ld;
        __m512 kb = _mm512_set1_ps(t->k[i]), qb = _mm512_set1_ps(t->q[i]);
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) {
            __m512 a = _mm512_loadu_ps(row + 16 * c);
            w[c] = _mm512_fmadd_ps(kb, a, w[c]);
            r[c] = _mm512_fmadd_ps(qb, a, r[c]);
        }
    }
    __m512 av = _mm512_set1_ps(t->a), bv = _mm512_set1_ps(t->beta);
    __m512 cav = _mm512_set1_ps(t->ca), cuv = _mm512_set1_ps(t->cu);
#pragma GCC unroll 8
    for (int c = 0; c < 8; c++) {
        u[c] = _mm512_mul_ps(bv, _mm512_fnmadd_ps(av, w[c], _mm512_loadu_ps(t->v + 16 * c)));
        _mm512_storeu_ps(o + 16 * c, _mm512_fmadd_ps(cav, r[c], _mm512_mul_ps(cuv, u[c])));
    }
    for (int64_t i = 0; i < K; i++) {
        const float *row = S + i * ld;
        float *out = D + i * ldd;
        __m512 kb = _mm512_set1_ps(t->k[i]);
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++)
            _mm512_storeu_ps(out + 16 * c,
                             _mm512_fmadd_ps(kb, u[c], _mm512_mul_ps(av, _mm512_loadu_ps(row + 16 * c))));
    }
}

/* Horizontal sum of a ymm in a fixed order. */
FQLA_AVX2 static float hsum256(__m256 x)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Rows of K floats (K % 8 == 0): the dot products of every row first, one
 * row after another (loads in memory order, which the prefetchers follow),
 * then the updates from L1 (at most 16 rows per pass, as vk_avx512). */
FQLA_AVX2 static void vk_avx2(int64_t K, int64_t n, float *S, int64_t ld, const fqla_decode_token *t,
                              float *o)
{
    float u[16];
    __m256 av = _mm256_set1_ps(t->a);
    if (n > 16) {
        vk_avx2(K, 16, S, ld, t, o);
        vk_avx2(K, n - 16, S + 16 * ld, ld, t, o + 16);
        return;
    }
    for (int64_t j = 0; j < n; j++) {
        const float *s0 = S + j * ld;
        __m256 w0 = _mm256_setzero_ps(), w1 = w0, r0 = w0, r1 = w0;
        int64_t c = 0;
        for (; c + 16 <= K; c += 16) {
            __m256 a0 = _mm256_loadu_ps(s0 + c), a1 = _mm256_loadu_ps(s0 + c + 8);
            w0 = _mm256_fmadd_ps(a0, _mm256_loadu_ps(t->k + c), w0);
            r0 = _mm256_fmadd_ps(a0, _mm256_loadu_ps(t->q + c), r0);
            w1 = _mm256_fmadd_ps(a1, _mm256_loadu_ps(t->k + c + 8), w1);
            r1 = _mm256_fmadd_ps(a1, _mm256_loadu_ps(t->q + c + 8), r1);
        }
        if (c < K) {
            __m256 a0 = _mm256_loadu_ps(s0 + c);
            w0 = _mm256_fmadd_ps(a0, _mm256_loadu_ps(t->k + c), w0);
            r0 = _mm256_fmadd_ps(a0, _mm256_loadu_ps(t->q + c), r0);
        }
        u[j] = t->beta * (t->v[j] - t->a * hsum256(_mm256_add_ps(w0, w1)));
        o[j] = t->ca * hsum256(_mm256_add_ps(r0, r1)) + t->cu * u[j];
    }
    for (int64_t j = 0; j < n; j++) {
        float *s0 = S + j * ld;
        __m256 uj = _mm256_set1_ps(u[j]);
        for (int64_t c = 0; c < K; c += 8)
            _mm256_storeu_ps(s0 + c, _mm256_fmadd_ps(uj, _mm256_loadu_ps(t->k + c),
                                                     _mm256_mul_ps(av, _mm256_loadu_ps(s0 + c))));
    }
}

/* The lane sums of four zmm, in a fixed order: halves added, then two
 * rounds of pairwise horizontal adds, then the 128-bit halves. */
#define HI256(x) _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)) /* AVX-512F only */
FQLA_AVX512 static void reduce4(__m512 a, __m512 b, __m512 c, __m512 d, float *out)
{
    __m256 ya = _mm256_add_ps(_mm512_castps512_ps256(a), HI256(a));
    __m256 yb = _mm256_add_ps(_mm512_castps512_ps256(b), HI256(b));
    __m256 yc = _mm256_add_ps(_mm512_castps512_ps256(c), HI256(c));
    __m256 yd = _mm256_add_ps(_mm512_castps512_ps256(d), HI256(d));
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(ya, yb), _mm256_hadd_ps(yc, yd));
    _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
}

/* Rows of K floats (K % 16 == 0). Two passes, like the [K, V] strips: the
 * dot products of every row first (loads that depend on nothing, so out of
 * cache many lines are in flight), then the updates, which find the rows
 * in L1. n <= 16 per
 * call keeps the rows there (decode_step.h's [V, K] tiles are 16 rows). */
FQLA_AVX512 static void vk_avx512(int64_t K, int64_t n, const float *S, int64_t ld, float *D, int64_t ldd,
                                  const fqla_decode_token *t, float *o)
{
    float u[16];
    __m512 av = _mm512_set1_ps(t->a);
    if (n > 16) {
        vk_avx512(K, 16, S, ld, D, ldd, t, o);
        vk_avx512(K, n - 16, S + 16 * ld, ld, D + 16 * ldd, ldd, t, o + 16);
        return;
    }
    /* rows in order, two at a time: the loads walk memory in order, which
     * the hardware prefetchers follow (rows in interleaved fours they did
     * not); rows do not depend on each other, so out-of-order execution
     * overlaps them. The four dot products of a pair are summed across
     * lanes together (reduce4). */
    int64_t j = 0;
    for (; j + 2 <= n; j += 2) {
        const float *s0 = S + j * ld, *s1 = s0 + ld;
        __m512 w0a = _mm512_setzero_ps(), w0b = w0a, r0a = w0a, r0b = w0a;
        __m512 w1a = w0a, w1b = w0a, r1a = w0a, r1b = w0a;
        int64_t c = 0;
        for (; c + 32 <= K; c += 32) {
            __m512 ka = _mm512_loadu_ps(t->k + c), kb = _mm512_loadu_ps(t->k + c + 16);
            __m512 qa = _mm512_loadu_ps(t->q + c), qb = _mm512_loadu_ps(t->q + c + 16);
            __m512 a0 = _mm512_loadu_ps(s0 + c), b0 = _mm512_loadu_ps(s0 + c + 16);
            __m512 a1 = _mm512_loadu_ps(s1 + c), b1 = _mm512_loadu_ps(s1 + c + 16);
            w0a = _mm512_fmadd_ps(a0, ka, w0a);
            r0a = _mm512_fmadd_ps(a0, qa, r0a);
            w0b = _mm512_fmadd_ps(b0, kb, w0b);
            r0b = _mm512_fmadd_ps(b0, qb, r0b);
            w1a = _mm512_fmadd_ps(a1, ka, w1a);
            r1a = _mm512_fmadd_ps(a1, qa, r1a);
            w1b = _mm512_fmadd_ps(b1, kb, w1b);
            r1b = _mm512_fmadd_ps(b1, qb, r1b);
        }
        if (c < K) {
            __m512 ka = _mm512_loadu_ps(t->k + c), qa = _mm512_loadu_ps(t->q + c);
            __m512 a0 = _mm512_loadu_ps(s0 + c), a1 = _mm512_loadu_ps(s1 + c);
            w0a = _mm512_fmadd_ps(a0, ka, w0a);
            r0a = _mm512_fmadd_ps(a0, qa, r0a);
            w1a = _mm512_fmadd_ps(a1, ka, w1a);
            r1a = _mm512_fmadd_ps(a1, qa, r1a);
        }
        float sum[4]; /* w0, r0, w1, r1 */
        reduce4(_mm512_add_ps(w0a, w0b), _mm512_add_ps(r0a, r0b), _mm512_add_ps(w1a, w1b),
                _mm512_add_ps(r1a, r1b), sum);
        u[j] = t->beta * (t->v[j] - t->a * sum[0]);
        o[j] = t->ca * sum[1] + t->cu * u[j];
        u[j + 1] = t->beta * (t->v[j + 1] - t->a * sum[2]);
        o[j + 1] = t->ca * sum[3] + t->cu * u[j + 1];
    }
    for (; j < n; j++) {
        const float *s0 = S + j * ld;
        __m512 w0 = _mm512_setzero_ps(), r0 = w0;
        for (int64_t c = 0; c < K; c += 16) {
            __m512 a0 = _mm512_loadu_ps(s0 + c);
            w0 = _mm512_fmadd_ps(a0, _mm512_loadu_ps(t->k + c), w0);
            r0 = _mm512_fmadd_ps(a0, _mm512_loadu_ps(t->q + c), r0);
        }
        u[j] = t->beta * (t->v[j] - t->a * _mm512_reduce_add_ps(w0));
        o[j] = t->ca * _mm512_reduce_add_ps(r0) + t->cu * u[j];
    }
    /* the updates column block by column block, k's block held in a
     * register: loading k next to the row stores stalled on 4K aliasing */
    for (int64_t c = 0; c < K; c += 16) {
        __m512 kk = _mm512_loadu_ps(t->k + c);
        for (j = 0; j < n; j++)
            _mm512_storeu_ps(D + j * ldd + c, _mm512_fmadd_ps(_mm512_set1_ps(u[j]), kk,
                                                              _mm512_mul_ps(av, _mm512_loadu_ps(S + j * ld + c))));
    }
}
#endif


/* ---- aarch64 NEON bodies (NEON is baseline there: no run-time check
 * beyond fqla_cpu_isa(), which tests lower to the portable path) ---- */

#if defined(__aarch64__)
#define FQLA_HAVE_NEON_DECODE 1
#include <arm_neon.h>

/* 16 columns as four q registers; rows in fours (k and q of four rows in
 * one register each, taken lane by lane), even and odd rows into separate
 * accumulators (sixteen, half of the register file), as kv_avx2's pairs. */
static void kv_neon(int64_t K, float *S, int64_t ld, const fqla_decode_token *t, float *o)
{
    float32x4_t we[4], wo[4], re[4], ro[4], u[4];
    for (int c = 0; c < 4; c++)
        we[c] = wo[c] = re[c] = ro[c] = vdupq_n_f32(0.0f);
    int64_t i = 0;
    for (; i + 4 <= K; i += 4) {
        const float *s = S + i * ld;
        float32x4_t k4 = vld1q_f32(t->k + i), q4 = vld1q_f32(t->q + i);
        for (int c = 0; c < 4; c++) {
            float32x4_t a0 = vld1q_f32(s + 4 * c), a1 = vld1q_f32(s + ld + 4 * c);
            float32x4_t a2 = vld1q_f32(s + 2 * ld + 4 * c), a3 = vld1q_f32(s + 3 * ld + 4 * c);
            we[c] = vfmaq_laneq_f32(we[c], a0, k4, 0);
            re[c] = vfmaq_laneq_f32(re[c], a0, q4, 0);
            wo[c] = vfmaq_laneq_f32(wo[c], a1, k4, 1);
            ro[c] = vfmaq_laneq_f32(ro[c], a1, q4, 1);
            we[c] = vfmaq_laneq_f32(we[c], a2, k4, 2);
            re[c] = vfmaq_laneq_f32(re[c], a2, q4, 2);
            wo[c] = vfmaq_laneq_f32(wo[c], a3, k4, 3);
            ro[c] = vfmaq_laneq_f32(ro[c], a3, q4, 3);
        }
    }
    for (; i < K; i++) {
        const float *s = S + i * ld;
        for (int c = 0; c < 4; c++) {
            float32x4_t a0 = vld1q_f32(s + 4 * c);
            we[c] = vfmaq_n_f32(we[c], a0, t->k[i]);
            re[c] = vfmaq_n_f32(re[c], a0, t->q[i]);
        }
    }
    for (int c = 0; c < 4; c++) {
        float32x4_t w = vaddq_f32(we[c], wo[c]), r = vaddq_f32(re[c], ro[c]);
        u[c] = vmulq_n_f32(vfmsq_n_f32(vld1q_f32(t->v + 4 * c), w, t->a), t->beta);
        vst1q_f32(o + 4 * c, vfmaq_n_f32(vmulq_n_f32(u[c], t->cu), r, t->ca));
    }
    for (i = 0; i < K; i++) {
        float *row = S + i * ld;
        float ki = t->k[i];
        for (int c = 0; c < 4; c++)
            vst1q_f32(row + 4 * c, vfmaq_n_f32(vmulq_n_f32(vld1q_f32(row + 4 * c), t->a), u[c], ki));
    }
}

/* Rows of K floats (K % 4 == 0): the dot products of every row first, in
 * memory order, then the updates from L1 (at most 16 rows per pass), as
 * vk_avx2. Four partial sums per dot product, lanes summed in a fixed
 * order (vaddvq_f32). */
static void vk_neon(int64_t K, int64_t n, float *S, int64_t ld, const fqla_decode_token *t, float *o)
{
    float u[16];
    if (n > 16) {
        vk_neon(K, 16, S, ld, t, o);
        vk_neon(K, n - 16, S + 16 * ld, ld, t, o + 16);
        return;
    }
    for (int64_t j = 0; j < n; j++) {
        const float *s0 = S + j * ld;
        float32x4_t w[4], r[4];
        for (int c = 0; c < 4; c++)
            w[c] = r[c] = vdupq_n_f32(0.0f);
        int64_t c = 0;
        for (; c + 16 <= K; c += 16)
            for (int b = 0; b < 4; b++) {
                float32x4_t a = vld1q_f32(s0 + c + 4 * b);
                w[b] = vfmaq_f32(w[b], a, vld1q_f32(t->k + c + 4 * b));
                r[b] = vfmaq_f32(r[b], a, vld1q_f32(t->q + c + 4 * b));
            }
        for (; c < K; c += 4) {
            float32x4_t a = vld1q_f32(s0 + c);
            w[0] = vfmaq_f32(w[0], a, vld1q_f32(t->k + c));
            r[0] = vfmaq_f32(r[0], a, vld1q_f32(t->q + c));
        }
        float ws = vaddvq_f32(vaddq_f32(vaddq_f32(w[0], w[1]), vaddq_f32(w[2], w[3])));
        float rs = vaddvq_f32(vaddq_f32(vaddq_f32(r[0], r[1]), vaddq_f32(r[2], r[3])));
        u[j] = t->beta * (t->v[j] - t->a * ws);
        o[j] = t->ca * rs + t->cu * u[j];
    }
    for (int64_t j = 0; j < n; j++) {
        float *s0 = S + j * ld;
        for (int64_t c = 0; c < K; c += 4)
            vst1q_f32(s0 + c, vfmaq_n_f32(vmulq_n_f32(vld1q_f32(s0 + c), t->a), vld1q_f32(t->k + c), u[j]));
    }
}
#endif

void fqla_decode_step_kv(int64_t K, int64_t w, float *S, int64_t ld, const fqla_decode_token *t,
                         float *o)
{
#ifdef FQLA_HAVE_X86_DECODE
    int isa = fqla_cpu_isa();
    if (isa >= FQLA_CPU_ISA_AVX512 && w == 128) {
        kv_avx512_128(K, S, ld, S, ld, t, o);
        return;
    }
#endif
    if (w > FQLA_DECODE_KV_TILE) {
        for (int64_t j = 0; j < w; j += FQLA_DECODE_KV_TILE) {
            fqla_decode_token h = *t;
            h.v += j;
            fqla_decode_step_kv(K, w - j < FQLA_DECODE_KV_TILE ? w - j : FQLA_DECODE_KV_TILE, S + j, ld, &h, o + j);
        }
        return;
    }
#ifdef FQLA_HAVE_X86_DECODE
    if (isa >= FQLA_CPU_ISA_AVX512 && w == 32) {
        kv_avx512_32(K, S, ld, t, o);
        return;
    }
    if (isa >= FQLA_CPU_ISA_AVX512 && w == 16) {
        kv_avx512(K, S, ld, t, o);
        return;
    }
    if (isa >= FQLA_CPU_ISA_AVX2 && w % 16 == 0) {
        /* two independent 16-column halves */
        for (int64_t j = 0; j < w; j += 16) {
            fqla_decode_token h = *t;
            h.v += j;
            kv_avx2(K, S + j, ld, &h, o + j);
        }
        return;
    }
#endif
#ifdef FQLA_HAVE_NEON_DECODE
    if (w % 16 == 0 && fqla_cpu_isa() >= FQLA_CPU_ISA_NEON) {
        for (int64_t j = 0; j < w; j += 16) {
            fqla_decode_token h = *t;
            h.v += j;
            kv_neon(K, S + j, ld, &h, o + j);
        }
        return;
    }
#endif
    if (w == 32)
        kv_c32(K, S, ld, t, o);
    else
        kv_cw(K, w, S, ld, t, o);
}

#ifdef FQLA_HAVE_X86_DECODE
/* w % 16 == 0 */
FQLA_AVX512 static void copy_rows_avx512(int64_t rows, int64_t w, const float *src, int64_t lds, float *dst,
                                         int64_t ldd)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < w; c += 16)
            _mm512_storeu_ps(dst + r * ldd + c, _mm512_loadu_ps(src + r * lds + c));
}
#endif

void fqla_decode_copy_rows(int64_t rows, int64_t w, const float *src, int64_t lds, float *dst, int64_t ldd)
{
#ifdef FQLA_HAVE_X86_DECODE
    if (w % 16 == 0 && fqla_cpu_isa() >= FQLA_CPU_ISA_AVX512) {
        copy_rows_avx512(rows, w, src, lds, dst, ldd);
        return;
    }
#endif
    for (int64_t r = 0; r < rows; r++)
        memcpy(dst + r * ldd, src + r * lds, (size_t)w * sizeof(float));
}

void fqla_decode_step_vk(int64_t K, int64_t n, float *S, int64_t ld, const fqla_decode_token *t,
                         float *o)
{
#ifdef FQLA_HAVE_X86_DECODE
    int isa = fqla_cpu_isa();
    if (isa >= FQLA_CPU_ISA_AVX512 && K % 16 == 0) {
        vk_avx512(K, n, S, ld, S, ld, t, o);
        return;
    }
    if (isa >= FQLA_CPU_ISA_AVX2 && K % 8 == 0) {
        vk_avx2(K, n, S, ld, t, o);
        return;
    }
#endif
#ifdef FQLA_HAVE_NEON_DECODE
    if (K % 4 == 0 && fqla_cpu_isa() >= FQLA_CPU_ISA_NEON) {
        vk_neon(K, n, S, ld, t, o);
        return;
    }
#endif
    vk_c(K, n, S, ld, t, o);
}

int fqla_decode_step_to_ok(int64_t K, int64_t V, int v_first)
{
#ifdef FQLA_HAVE_X86_DECODE
    if (fqla_cpu_isa() >= FQLA_CPU_ISA_AVX512)
        return v_first ? K % 16 == 0 : V == FQLA_DECODE_KV_WIDE;
#endif
    (void)K;
    (void)V;
    (void)v_first;
    return 0;
}

void fqla_decode_step_to(int v_first, int64_t K, int64_t w, const float *S, int64_t ld, float *D, int64_t ldd,
                         const fqla_decode_token *t, float *o)
{
#ifdef FQLA_HAVE_X86_DECODE
    if (v_first)
        vk_avx512(K, w, S, ld, D, ldd, t, o);
    else
        kv_avx512_128(K, S, ld, D, ldd, t, o);
#else
    (void)v_first, (void)K, (void)w, (void)S, (void)ld, (void)D, (void)ldd, (void)t, (void)o;
#endif
}
