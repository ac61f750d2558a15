/*
 * dtype_conv.h - the GPU tests' host-side element conversions: inputs are
 * drawn in double, rounded to the dtype the device will see, packed into
 * that dtype for the upload, and results unpacked back to double for the
 * comparison with the fp64 reference.
 */
#ifndef FQLA_TESTS_DTYPE_CONV_H
#define FQLA_TESTS_DTYPE_CONV_H

#include "flashqla.h"
#include "internal.h"

#include <stdint.h>
#include <stdlib.h>

static inline size_t dsize(fqla_dtype d) { return fqla_dtype_size(d); }

/* Rounds x to dtype d and back (the value the GPU will see). */
static inline double round_to(fqla_dtype d, double x)
{
    switch (d) {
    case FQLA_DTYPE_BF16: return fqla_bf16_to_f32(fqla_f32_to_bf16((float)x));
    case FQLA_DTYPE_F16: return fqla_f16_to_f32(fqla_f32_to_f16((float)x));
    case FQLA_DTYPE_F32: return (float)x;
    default: return x;
    }
}

/* n values packed as dtype d in a fresh malloc'd buffer (at least one element). */
static inline void *to_dtype(fqla_dtype d, const double *x, int64_t n)
{
    void *out = malloc((size_t)(n > 0 ? n : 1) * dsize(d));
    for (int64_t i = 0; i < n; i++) {
        if (d == FQLA_DTYPE_BF16) ((uint16_t *)out)[i] = fqla_f32_to_bf16((float)x[i]);
        else if (d == FQLA_DTYPE_F16) ((uint16_t *)out)[i] = fqla_f32_to_f16((float)x[i]);
        else if (d == FQLA_DTYPE_F32) ((float *)out)[i] = (float)x[i];
        else if (d == FQLA_DTYPE_I32) ((int32_t *)out)[i] = (int32_t)x[i];
        else if (d == FQLA_DTYPE_I64) ((int64_t *)out)[i] = (int64_t)x[i];
        else ((double *)out)[i] = x[i];
    }
    return out;
}

/* n values of dtype d (bf16, f16, f32 or f64) into x. */
static inline void from_dtype(fqla_dtype d, const void *src, double *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        if (d == FQLA_DTYPE_BF16) x[i] = fqla_bf16_to_f32(((const uint16_t *)src)[i]);
        else if (d == FQLA_DTYPE_F16) x[i] = fqla_f16_to_f32(((const uint16_t *)src)[i]);
        else if (d == FQLA_DTYPE_F32) x[i] = ((const float *)src)[i];
        else x[i] = ((const double *)src)[i];
    }
}

#endif
