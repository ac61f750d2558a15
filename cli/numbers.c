/*
 * numbers.c - the CLI's small numeric helpers: a seeded random generator
 * (splitmix64 + Box-Muller, so a seed gives the same inputs on every
 * machine), bf16 / fp16 conversion with round-to-nearest-even, a monotonic
 * clock and a median.
 */
#include "cli.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void cli_rng_seed(cli_rng *r, uint64_t seed)
{
    r->s = seed;
    r->have_spare = 0;
    r->spare = 0.0;
}

uint64_t cli_rng_u64(cli_rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

double cli_rng_uniform(cli_rng *r)
{
    /* 53 random bits, shifted by half a step so 0 never comes out (log below). */
    return ((double)(cli_rng_u64(r) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

double cli_rng_normal(cli_rng *r)
{
    if (r->have_spare) {
        r->have_spare = 0;
        return r->spare;
    }
    double u1 = cli_rng_uniform(r), u2 = cli_rng_uniform(r);
    double rad = sqrt(-2.0 * log(u1));
    double th = 6.283185307179586 * u2;
    r->spare = rad * sin(th);
    r->have_spare = 1;
    return rad * cos(th);
}

uint16_t cli_f32_to_bf16(float x)
{
    uint32_t b;
    memcpy(&b, &x, 4);
    if ((b & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((b >> 16) | 0x40); /* quiet NaN */
    b += 0x7fffu + ((b >> 16) & 1u);
    return (uint16_t)(b >> 16);
}

float cli_bf16_to_f32(uint16_t x)
{
    uint32_t b = (uint32_t)x << 16;
    float f;
    memcpy(&f, &b, 4);
    return f;
}

uint16_t cli_f32_to_f16(float x)
{
    uint32_t b;
    memcpy(&b, &x, 4);
    uint16_t sign = (uint16_t)((b >> 16) & 0x8000u);
    uint32_t a = b & 0x7fffffffu;
    if (a >= 0x7f800000u) return (uint16_t)(sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520 rounds to inf */
    if (a < 0x38800000u) {
        /* Below 2^-14: a subnormal half is round(|x| * 2^24); the scaling is
         * exact and lrintf rounds to nearest even. 1024 lands on the smallest
         * normal, whose encoding is 0x0400 - still right. */
        return (uint16_t)(sign | (uint16_t)lrintf(fabsf(x) * 16777216.0f));
    }
    uint32_t h = ((((a >> 23) - 127u + 15u) << 10) | ((a & 0x7fffffu) >> 13));
    uint32_t rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++; /* carry may bump the exponent: fine */
    return (uint16_t)(sign | h);
}

float cli_f16_to_f32(uint16_t x)
{
    uint32_t sign = (uint32_t)(x & 0x8000u) << 16;
    uint32_t e = (x >> 10) & 0x1fu, m = x & 0x3ffu, b;
    if (e == 0) {
        float f = ldexpf((float)m, -24);
        return sign ? -f : f;
    }
    if (e == 31) b = sign | 0x7f800000u | (m << 13);
    else b = sign | ((e - 15u + 127u) << 23) | (m << 13);
    float f;
    memcpy(&f, &b, 4);
    return f;
}

double cli_load(const void *data, fqla_dtype d, size_t i)
{
    switch (d) {
    case FQLA_DTYPE_F32: return ((const float *)data)[i];
    case FQLA_DTYPE_F16: return cli_f16_to_f32(((const uint16_t *)data)[i]);
    case FQLA_DTYPE_BF16: return cli_bf16_to_f32(((const uint16_t *)data)[i]);
    case FQLA_DTYPE_F64: return ((const double *)data)[i];
    case FQLA_DTYPE_I32: return ((const int32_t *)data)[i];
    case FQLA_DTYPE_I64: return (double)((const int64_t *)data)[i];
    }
    return 0.0;
}

void cli_store(void *data, fqla_dtype d, size_t i, double v)
{
    switch (d) {
    case FQLA_DTYPE_F32: ((float *)data)[i] = (float)v; break;
    case FQLA_DTYPE_F16: ((uint16_t *)data)[i] = cli_f32_to_f16((float)v); break;
    case FQLA_DTYPE_BF16: ((uint16_t *)data)[i] = cli_f32_to_bf16((float)v); break;
    case FQLA_DTYPE_F64: ((double *)data)[i] = v; break;
    case FQLA_DTYPE_I32: ((int32_t *)data)[i] = (int32_t)v; break;
    case FQLA_DTYPE_I64: ((int64_t *)data)[i] = (int64_t)v; break;
    }
}

double cli_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double cli_median(double *x, int n)
{
    if (n <= 0) return 0.0;
    qsort(x, (size_t)n, sizeof *x, cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}
