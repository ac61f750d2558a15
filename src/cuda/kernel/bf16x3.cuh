/*
 * kernel/bf16x3.cuh - fp32 products on bf16 tensor cores (mma.sync
 * m16n8k16) in bf16x3: an fp32 operand x is split into hi = bf16(x) and
 * lo = bf16(x - hi), and a b is summed as lo_a hi_b + hi_a lo_b + hi_a hi_b
 * in fp32 (the small terms first). The lo lo term and the split's residue
 * are ~2^-17 of a product (fp32 holds 2^-24; 3xTF32 reaches ~2^-21 at
 * twice the tensor time).
 *
 * Operands are split once, when they are made, into a "split tile": an
 * fp32 tile's own words, where word 2p of a row holds the bf16 pair hi of
 * elements 2p and 2p + 1 and word 2p + 1 their lo pair. One 8-byte load at
 * an element pair's fp32 address then gives a fragment register's hi and
 * lo, and a tile can be split in place (each 8 bytes by the thread that
 * reads them). Fragment layouts are ptx/mma_sync.cuh's.
 */
#ifndef FQLA_CUDA_KERNEL_BF16X3_CUH
#define FQLA_CUDA_KERNEL_BF16X3_CUH

#include <cuda_bf16.h>

#include "cuda/ptx/mma_sync.cuh"

/* Two fp32 values as their bf16 pairs: .x hi, .y lo (a split tile's two words). */
FQLA_DEVICE_INLINE uint2 fqla_x3_split(float x0, float x1)
{
    const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
    const float2 hf = __bfloat1622float2(h);
    const __nv_bfloat162 l = __floats2bfloat162_rn(x0 - hf.x, x1 - hf.y);
    return make_uint2(*reinterpret_cast<const uint32_t *>(&h), *reinterpret_cast<const uint32_t *>(&l));
}

struct fqla_x3_a {
    uint32_t h[4], l[4];
};
struct fqla_x3_b {
    uint32_t h[2], l[2];
};

/* d += a b in bf16x3 (the small terms first). */
FQLA_DEVICE_INLINE void fqla_x3_mma(float (&d)[4], const fqla_x3_a &a, const fqla_x3_b &b)
{
    fqla_mma_m16n8k16_bf16(d, a.l, b.h[0], b.h[1]);
    fqla_mma_m16n8k16_bf16(d, a.h, b.l[0], b.l[1]);
    fqla_mma_m16n8k16_bf16(d, a.h, b.h[0], b.h[1]);
}

FQLA_DEVICE_INLINE uint2 fqla_x3_lds2(const float *p) { return *reinterpret_cast<const uint2 *>(p); }

/* A fragment (16 x 16) at (m0, k0) of a split row-major [m][k] tile. */
FQLA_DEVICE_INLINE void fqla_x3_load_a(fqla_x3_a &a, const float *base, int ld, int m0, int k0, int lane)
{
    const int g = lane >> 2, t = lane & 3;
    const float *r0 = base + (m0 + g) * ld + k0 + 2 * t, *r1 = r0 + 8 * ld;
    const uint2 x0 = fqla_x3_lds2(r0), x1 = fqla_x3_lds2(r1), x2 = fqla_x3_lds2(r0 + 8), x3 = fqla_x3_lds2(r1 + 8);
    a.h[0] = x0.x, a.l[0] = x0.y;
    a.h[1] = x1.x, a.l[1] = x1.y;
    a.h[2] = x2.x, a.l[2] = x2.y;
    a.h[3] = x3.x, a.l[3] = x3.y;
}

/* B fragment (16 x 8) at (k0, n0) of B = X^T, X a split row-major [n][k] tile. */
FQLA_DEVICE_INLINE void fqla_x3_load_b_nk(fqla_x3_b &b, const float *base, int ld, int k0, int n0, int lane)
{
    const int g = lane >> 2, t = lane & 3;
    const float *r = base + (n0 + g) * ld + k0 + 2 * t;
    const uint2 x0 = fqla_x3_lds2(r), x1 = fqla_x3_lds2(r + 8);
    b.h[0] = x0.x, b.l[0] = x0.y;
    b.h[1] = x1.x, b.l[1] = x1.y;
}

#endif
