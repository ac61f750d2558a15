/*
 * tensor.c - dtype names and sizes, tensor constructors, and element access
 * for host tensors of any supported dtype (the CPU backends read and write
 * through these, so strides and dtypes are handled in one place).
 */
#include "internal.h"

#include <math.h>
#include <string.h>
#if defined(__SSE4_1__)
#include <smmintrin.h>
#endif

const char *fqla_dtype_string(fqla_dtype dtype)
{
    switch (dtype) {
    case FQLA_DTYPE_F32: return "f32";
    case FQLA_DTYPE_F16: return "f16";
    case FQLA_DTYPE_BF16: return "bf16";
    case FQLA_DTYPE_F64: return "f64";
    case FQLA_DTYPE_I32: return "i32";
    case FQLA_DTYPE_I64: return "i64";
    }
    return "unknown";
}

size_t fqla_dtype_size(fqla_dtype dtype)
{
    switch (dtype) {
    case FQLA_DTYPE_F16:
    case FQLA_DTYPE_BF16: return 2;
    case FQLA_DTYPE_F32:
    case FQLA_DTYPE_I32: return 4;
    case FQLA_DTYPE_F64:
    case FQLA_DTYPE_I64: return 8;
    }
    return 0;
}

fqla_tensor fqla_tensor_contiguous(void *data, fqla_dtype dtype, int ndim, const int64_t *shape)
{
    fqla_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dtype;
    if (ndim < 0 || ndim > FQLA_MAX_DIMS) {
        t.ndim = ndim; /* left for validation to reject by name */
        return t;
    }
    t.ndim = ndim;
    if (!shape) {
        /* sizes of -1, which validation rejects by the argument's name (a
         * size is never negative), where reading shape[] would crash */
        for (int d = 0; d < ndim; d++) t.shape[d] = -1;
        return t;
    }
    /* a stride past int64 saturates at INT64_MAX, and so does every outer
     * one: validation then reports the shape's overflow by name, where a
     * wrapped product would have been a negative stride the caller never
     * set (and undefined behaviour) */
    int64_t stride = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        t.shape[d] = shape[d];
        t.strides[d] = stride;
        const int64_t n = shape[d] > 0 ? shape[d] : 1;
        stride = stride > INT64_MAX / n ? INT64_MAX : stride * n;
    }
    return t;
}

int64_t fqla_tensor_numel(const fqla_tensor *t)
{
    if (!t || !t->data || t->ndim < 0 || t->ndim > FQLA_MAX_DIMS) return 0;
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++) {
        const int64_t s = t->shape[d];
        if (s <= 0) return 0;
        if (n > INT64_MAX / s) return -1; /* the product overflows int64 */
        n *= s;
    }
    return n;
}

/* ---- fp16 conversions (bit-exact, round to nearest even; bf16: internal.h) ---- */

static float bits_to_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint32_t f32_to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

float fqla_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) return bits_to_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        if (man == 0) return bits_to_f32(sign);
        /* subnormal: value = man * 2^-24 */
        float f = (float)man * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    return bits_to_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

uint16_t fqla_f32_to_f16(float f)
{
    uint32_t u = f32_to_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);     /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);    /* rounds to >= 65520: Inf */
    if (a < 0x38800000u) {                                       /* below 2^-14: subnormal or 0 */
        /* scale to units of 2^-24 and round to nearest even */
        float v = bits_to_f32(a) * 16777216.0f;
        float r = (float)(long)v;
        float diff = v - r;
        if (diff > 0.5f || (diff == 0.5f && ((long)r & 1))) r += 1.0f;
        return (uint16_t)(sign | (uint16_t)r);
    }
    uint32_t rounded = a + 0xfffu + ((a >> 13) & 1u);
    return (uint16_t)(sign | (uint16_t)(((rounded >> 13) - (112u << 10)) & 0x7fffu));
}

/* ---- element access ---- */

double fqla_load(const fqla_tensor *t, int64_t offset)
{
    const char *base = (const char *)t->data;
    switch (t->dtype) {
    case FQLA_DTYPE_F32: return ((const float *)base)[offset];
    case FQLA_DTYPE_F64: return ((const double *)base)[offset];
    case FQLA_DTYPE_BF16: return fqla_bf16_to_f32(((const uint16_t *)base)[offset]);
    case FQLA_DTYPE_F16: return fqla_f16_to_f32(((const uint16_t *)base)[offset]);
    case FQLA_DTYPE_I32: return ((const int32_t *)base)[offset];
    case FQLA_DTYPE_I64: return (double)((const int64_t *)base)[offset];
    }
    return NAN;
}

void fqla_store(const fqla_tensor *t, int64_t offset, double value)
{
    char *base = (char *)t->data;
    switch (t->dtype) {
    case FQLA_DTYPE_F32: ((float *)base)[offset] = (float)value; return;
    case FQLA_DTYPE_F64: ((double *)base)[offset] = value; return;
    case FQLA_DTYPE_BF16: ((uint16_t *)base)[offset] = fqla_f32_to_bf16((float)value); return;
    case FQLA_DTYPE_F16: ((uint16_t *)base)[offset] = fqla_f32_to_f16((float)value); return;
    case FQLA_DTYPE_I32: ((int32_t *)base)[offset] = (int32_t)value; return;
    case FQLA_DTYPE_I64: ((int64_t *)base)[offset] = (int64_t)value; return;
    }
}

/* bf16 rows <-> fp32, four elements a step where the build has SSE4.1
 * (x86-64-v2, the default target): widening is a 16-bit shift, narrowing the
 * scalar functions' round-to-nearest-even with the same NaN rule, so both
 * paths give the same bits. The CPU backends convert every bf16 element of
 * q, k, v and o through these; one at a time they made a bf16 prefill
 * ~1.3x the fp32 one on the CI machine. */
void fqla_bf16_row_to_f32(const uint16_t *s, int64_t n, float *dst)
{
    int64_t i = 0;
#if defined(__SSE4_1__)
    for (; i + 4 <= n; i += 4) {
        __m128i h = _mm_loadl_epi64((const __m128i *)(const void *)(s + i));
        __m128i w = _mm_slli_epi32(_mm_cvtepu16_epi32(h), 16);
        _mm_storeu_ps(dst + i, _mm_castsi128_ps(w));
    }
#endif
    for (; i < n; i++) dst[i] = fqla_bf16_to_f32(s[i]);
}

void fqla_f32_row_to_bf16(const float *src, int64_t n, uint16_t *d)
{
    int64_t i = 0;
#if defined(__SSE4_1__)
    const __m128i abs_mask = _mm_set1_epi32(0x7fffffff), inf = _mm_set1_epi32(0x7f800000);
    const __m128i half = _mm_set1_epi32(0x7fff), one = _mm_set1_epi32(1), quiet = _mm_set1_epi32(0x40);
    for (; i + 8 <= n; i += 8) {
        __m128i r[2];
        for (int h = 0; h < 2; h++) {
            __m128i u = _mm_castps_si128(_mm_loadu_ps(src + i + 4 * h));
            __m128i nan = _mm_cmpgt_epi32(_mm_and_si128(u, abs_mask), inf);
            __m128i lsb = _mm_and_si128(_mm_srli_epi32(u, 16), one);
            __m128i rounded = _mm_srli_epi32(_mm_add_epi32(u, _mm_add_epi32(half, lsb)), 16);
            __m128i quieted = _mm_or_si128(_mm_srli_epi32(u, 16), quiet);
            r[h] = _mm_blendv_epi8(rounded, quieted, nan);
        }
        _mm_storeu_si128((__m128i *)(void *)(d + i), _mm_packus_epi32(r[0], r[1]));
    }
#endif
    for (; i < n; i++) d[i] = fqla_f32_to_bf16(src[i]);
}

void fqla_load_row_f32(const fqla_tensor *t, int64_t offset, int64_t n, float *dst)
{
    switch (t->dtype) {
    case FQLA_DTYPE_F32:
        memcpy(dst, (const float *)t->data + offset, (size_t)n * sizeof(float));
        return;
    case FQLA_DTYPE_BF16:
        fqla_bf16_row_to_f32((const uint16_t *)t->data + offset, n, dst);
        return;
    default:
        for (int64_t i = 0; i < n; i++) dst[i] = (float)fqla_load(t, offset + i);
        return;
    }
}

void fqla_store_row_f32(const fqla_tensor *t, int64_t offset, int64_t n, const float *src)
{
    switch (t->dtype) {
    case FQLA_DTYPE_F32:
        memcpy((float *)t->data + offset, src, (size_t)n * sizeof(float));
        return;
    case FQLA_DTYPE_BF16:
        fqla_f32_row_to_bf16(src, n, (uint16_t *)t->data + offset);
        return;
    default:
        for (int64_t i = 0; i < n; i++) fqla_store(t, offset + i, src[i]);
        return;
    }
}
