/*
 * kernel/split_mma.cuh - warp products on bf16 tensor cores with fp32-level
 * accuracy where an operand needs it.
 *
 * A tile of fp32 values lives in shared memory as two bf16 planes of the
 * same shape: hi = bf16(x) and lo = bf16(x - hi), 16 significant bits
 * together (relative error ~2^-17). A product of two split tiles is three
 * mma.sync m16n8k16: hi*hi + hi*lo + lo*hi (lo*lo is below the fp32
 * accumulation's rounding). An operand without a lo plane (lo == nullptr:
 * an exact bf16 input, or a product the numerics allow in plain bf16)
 * drops its terms, so one helper covers plain, 2-product and 3-product
 * forms. The backward's numerics model (dev/models/bwd_chunked.py, its
 * "bf16x3" format) says which products need the split.
 *
 * Every operand is read with ldmatrix (kernel/mma_frag.cuh) in either
 * orientation, so a tile stored once serves as A, A^T, B or B^T of
 * different products: one fragment load per 16 x 16 operand block instead
 * of per-element loads and conversions.
 *
 * Rows are 16-byte aligned; ld (elements) a multiple of 8 and, to spread
 * ldmatrix's rows over the banks, not a multiple of 64 (the callers pad
 * rows by 8 elements).
 */
#ifndef FQLA_CUDA_KERNEL_SPLIT_MMA_CUH
#define FQLA_CUDA_KERNEL_SPLIT_MMA_CUH

#include "cuda/kernel/mma_frag.cuh"
#include "cuda/ptx/mma_sync.cuh"

#include <cuda_bf16.h>

/* A tile's two planes (lo may be nullptr: no low part) and its row pitch. */
struct fqla_split_tile {
    __nv_bfloat16 *hi, *lo;
    int ld;
};

/* x0, x1 as packed bf16x2 hi and lo parts (x0 in the low half, the
 * fragment registers' packing): one cvt.rn.bf16x2 per part. */
FQLA_DEVICE_INLINE void fqla_split_pack2(float x0, float x1, uint32_t &hi, uint32_t &lo)
{
    const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
    const float2 hf = __bfloat1622float2(h);
    const __nv_bfloat162 l = __floats2bfloat162_rn(x0 - hf.x, x1 - hf.y);
    hi = *reinterpret_cast<const uint32_t *>(&h);
    lo = *reinterpret_cast<const uint32_t *>(&l);
}

/* Elements (r, c) and (r, c + 1) (c even) set to x0, x1: one 4-byte store
 * per plane, the accumulator layout's column pair. */
FQLA_DEVICE_INLINE void fqla_split_put2(const fqla_split_tile &t, int r, int c, float x0, float x1)
{
    /* packed conversions (one cvt.rn.bf16x2 per plane, fqla_split_pack2's
     * arithmetic; the lo part only where t has a lo plane): the single-value
     * F2F conversions were the gradient kernel's most stalled instructions */
    const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
    *reinterpret_cast<__nv_bfloat162 *>(t.hi + r * t.ld + c) = h;
    if (t.lo) {
        const float2 hf = __bfloat1622float2(h);
        *reinterpret_cast<__nv_bfloat162 *>(t.lo + r * t.ld + c) = __floats2bfloat162_rn(x0 - hf.x, x1 - hf.y);
    }
}

/* Element (r, c) as fp32 (hi + lo). */
FQLA_DEVICE_INLINE float fqla_split_get(const fqla_split_tile &t, int r, int c)
{
    float x = __bfloat162float(t.hi[r * t.ld + c]);
    if (t.lo) x += __bfloat162float(t.lo[r * t.ld + c]);
    return x;
}

template <bool T_>
FQLA_DEVICE_INLINE void fqla_split_frag_a(uint32_t (&a)[4], const __nv_bfloat16 *p, int ld, int m0, int k0, int lane)
{
    if (T_) fqla_frag_a_t(a, p, ld, m0, k0, lane);
    else fqla_frag_a(a, p, ld, m0, k0, lane);
}
template <bool T_>
FQLA_DEVICE_INLINE void fqla_split_frag_b(uint32_t (&b)[4], const __nv_bfloat16 *p, int ld, int k0, int n0, int lane)
{
    if (T_) fqla_frag_b_nk(b, p, ld, k0, n0, lane);
    else fqla_frag_b_kn(b, p, ld, k0, n0, lane);
}

/*
 * acc[NT] (+)= A[m0 .. m0 + 16) x B[.., n0 .. n0 + 8 NT) over k in [k0, k1)
 * (multiples of 16; NT even), one warp. A_T: A is stored transposed (tile
 * [k][m]; else [m][k]); B_T: B is stored transposed (tile [n][k]; else
 * [k][n]). acc[nt] is the m16n8 accumulator of columns n0 + 8 nt
 * (ptx/mma_sync.cuh: rows g, g + 8, columns 2t, 2t + 1).
 */
template <bool A_T, bool B_T, int NT>
FQLA_DEVICE_INLINE void fqla_split_mma(float (&acc)[NT][4], const fqla_split_tile &A, const fqla_split_tile &B, int m0,
                                       int n0, int k0, int k1)
{
    static_assert(NT % 2 == 0, "n-tiles come in pairs (one ldmatrix.x4 per 16 columns)");
    const int lane = threadIdx.x & 31;
    for (int k = k0; k < k1; k += 16) {
        uint32_t ah[4], al[4];
        fqla_split_frag_a<A_T>(ah, A.hi, A.ld, m0, k, lane);
        if (A.lo) fqla_split_frag_a<A_T>(al, A.lo, A.ld, m0, k, lane);
#pragma unroll
        for (int np = 0; np < NT / 2; np++) {
            uint32_t bh[4];
            fqla_split_frag_b<B_T>(bh, B.hi, B.ld, k, n0 + 16 * np, lane);
            fqla_mma_m16n8k16_bf16(acc[2 * np], ah, bh[0], bh[1]);
            fqla_mma_m16n8k16_bf16(acc[2 * np + 1], ah, bh[2], bh[3]);
            if (A.lo) {
                fqla_mma_m16n8k16_bf16(acc[2 * np], al, bh[0], bh[1]);
                fqla_mma_m16n8k16_bf16(acc[2 * np + 1], al, bh[2], bh[3]);
            }
            if (B.lo) {
                uint32_t bl[4];
                fqla_split_frag_b<B_T>(bl, B.lo, B.ld, k, n0 + 16 * np, lane);
                fqla_mma_m16n8k16_bf16(acc[2 * np], ah, bl[0], bl[1]);
                fqla_mma_m16n8k16_bf16(acc[2 * np + 1], ah, bl[2], bl[3]);
            }
        }
    }
}

template <int NT> FQLA_DEVICE_INLINE void fqla_acc_zero(float (&acc)[NT][4])
{
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[nt][e] = 0.f;
}

/* Calls f(row, col, v0, v1) for each column pair (col even) of the warp's
 * accumulator tile at (m0, n0); v0, v1 are references. */
template <int NT, typename F> FQLA_DEVICE_INLINE void fqla_acc_pairs(float (&acc)[NT][4], int m0, int n0, F f)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int h = 0; h < 2; h++) f(m0 + g + 8 * h, n0 + 8 * nt + 2 * t, acc[nt][2 * h], acc[nt][2 * h + 1]);
}

#endif
