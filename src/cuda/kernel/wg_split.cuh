/*
 * kernel/wg_split.cuh - warpgroup products (wgmma) on split bf16 operands:
 * fp32-class products on bf16 tensor cores.
 *
 * A tile is a matrix of rows x cols (cols a multiple of 64) kept in shared
 * memory as one or two bf16 planes, hi = bf16(x) and lo = bf16(x - hi)
 * (lo absent for exact bf16 values). A plane is stored as cols / 64 blocks
 * of rows x 128 bytes in the 128-byte swizzle TMA and wgmma use (the 16-byte
 * chunk index of a row XORed with row % 8; blocks 1024-aligned), so one
 * stored tile serves as either operand in either orientation:
 *   K-major  (operand rows = tile rows, k = tile columns): k-step kk starts
 *            at block kk / 4, + 32 B per step inside it;
 *   MN-major (k = tile rows, operand rows = tile columns): k-step kk starts
 *            2048 B (16 rows) on; 64-wide column blocks are rows x 128 B
 *            apart (the descriptor's leading byte offset).
 * A product of two split tiles is three wgmma a k-step, hi hi + hi lo +
 * lo hi (lo lo is below fp32 accumulation's rounding); a missing lo plane
 * drops its term.
 *
 * Accumulators (m64nN, fp32, N / 2 a thread): thread (warp w of the
 * warpgroup, lane 4 g + t) holds rows 16 w + g (d[4 j], d[4 j + 1]) and
 * 16 w + g + 8 (d[4 j + 2], d[4 j + 3]) at columns 8 j + 2 t, + 1. A warp
 * holds whole rows, so a row sum is a quad sum.
 */
#ifndef FQLA_CUDA_KERNEL_WG_SPLIT_CUH
#define FQLA_CUDA_KERNEL_WG_SPLIT_CUH

#include "cuda/ptx/fence.cuh"
#include "cuda/ptx/matrix_ldst.cuh"
#include "cuda/ptx/misc.cuh"
#include "cuda/ptx/wgmma.cuh"

#include <cuda_bf16.h>

/* A tile's planes as shared-window addresses (lo = 0: no low plane) and its
 * row count. */
struct fqla_wg_tile {
    uint32_t hi, lo;
    int rows;
};

/* Byte offset of element (r, c) in a plane of `rows` rows. */
FQLA_DEVICE_INLINE uint32_t fqla_wg_off(int rows, int r, int c)
{
    return (uint32_t)((c >> 6) * rows * 128 + r * 128 + ((((c & 63) >> 3) ^ (r & 7)) << 4) + ((c & 7) << 1));
}

/* Packing two floats into a bf16 pair, and unpacking by shifts (exact): an
 * earlier helper that unpacked through cuda_bf16's conversions compiled the
 * gradient kernel to code with more spills (148 / 264 bytes against 116 / 184). */
FQLA_DEVICE_INLINE uint32_t fqla_wg_bf2(float a, float b)
{
    const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<const uint32_t *>(&h);
}
FQLA_DEVICE_INLINE float2 fqla_wg_unbf2(uint32_t x) { return make_float2(__uint_as_float(x << 16), __uint_as_float(x & 0xffff0000u)); }
/* a, b split: hi = bf16(a, b), lo = bf16(a - hi_a, b - hi_b), a in the low halves */
FQLA_DEVICE_INLINE void fqla_wg_hilo(float a, float b, uint32_t &hi, uint32_t &lo)
{
    hi = fqla_wg_bf2(a, b);
    const float2 h = fqla_wg_unbf2(hi);
    lo = fqla_wg_bf2(a - h.x, b - h.y);
}

/* Elements (r, c .. c + 7) (c a multiple of 8): one 16-byte store a plane. */
FQLA_DEVICE_INLINE void fqla_wg_put8(const fqla_wg_tile &t, int r, int c, const float (&x)[8])
{
    uint32_t h[4], l[4];
#pragma unroll
    for (int i = 0; i < 4; i++) fqla_wg_hilo(x[2 * i], x[2 * i + 1], h[i], l[i]);
    const uint32_t o = fqla_wg_off(t.rows, r, c);
    fqla_st_shared_v4(t.hi + o, h[0], h[1], h[2], h[3]);
    if (t.lo) fqla_st_shared_v4(t.lo + o, l[0], l[1], l[2], l[3]);
}

/* Whole accumulator tiles <-> a tile's planes with stmatrix / ldmatrix:
 * v holds a warpgroup's m64nN accumulator layout (above) for columns
 * c0 .. c0 + N of t (c0 a multiple of 64). One x4 instruction moves 16
 * columns of the warp's 16 rows: matrices (rows 0-7, 8-15) x (columns
 * 8 j .. 8 j + 7, 8 j + 8 .. 8 j + 15); lane l gives the row address of
 * matrix l / 8. */
struct fqla_wg_frag_row {
    uint32_t off, x; /* the lane's row offset; its chunk XOR (swizzle and column half) */
};
FQLA_DEVICE_INLINE fqla_wg_frag_row fqla_wg_frag_lane()
{
    const int lane = threadIdx.x & 31, row = 16 * ((threadIdx.x >> 5) & 3) + 8 * ((lane >> 3) & 1) + (lane & 7);
    return {(uint32_t)row * 128u, (uint32_t)((lane >> 4) ^ (row & 7))};
}
FQLA_DEVICE_INLINE uint32_t fqla_wg_frag_at(const fqla_wg_frag_row &f, int rows, int c0, int j)
{
    return (uint32_t)(((c0 >> 6) + (j >> 3)) * rows * 128) + f.off + ((((uint32_t)j & 7u) ^ f.x) << 4);
}

template <int N> FQLA_DEVICE_INLINE void fqla_wg_store(const fqla_wg_tile &t, const float (&v)[N / 2], int c0)
{
    const fqla_wg_frag_row f = fqla_wg_frag_lane();
#pragma unroll
    for (int j = 0; j < N / 8; j += 2) {
        uint32_t h[4], l[4];
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int a = 4 * (j + (q >> 1)) + 2 * (q & 1);
            fqla_wg_hilo(v[a], v[a + 1], h[q], l[q]);
        }
        const uint32_t o = fqla_wg_frag_at(f, t.rows, c0, j);
        fqla_stsm_x4_at(t.hi + o, h[0], h[1], h[2], h[3]);
        if (t.lo) fqla_stsm_x4_at(t.lo + o, l[0], l[1], l[2], l[3]);
    }
}

template <int N> FQLA_DEVICE_INLINE void fqla_wg_load(const fqla_wg_tile &t, float (&v)[N / 2], int c0)
{
    const fqla_wg_frag_row f = fqla_wg_frag_lane();
#pragma unroll
    for (int j = 0; j < N / 8; j += 2) {
        const uint32_t o = fqla_wg_frag_at(f, t.rows, c0, j);
        uint32_t h[4], l[4] = {0u, 0u, 0u, 0u};
        fqla_ldsm_x4_at(h, t.hi + o);
        if (t.lo) fqla_ldsm_x4_at(l, t.lo + o);
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int a = 4 * (j + (q >> 1)) + 2 * (q & 1);
            const float2 hv = fqla_wg_unbf2(h[q]), lv = fqla_wg_unbf2(l[q]);
            v[a] = hv.x + lv.x;
            v[a + 1] = hv.y + lv.y;
        }
    }
}

/* A plane's raw 2-byte elements at the accumulator places of columns c0 ..
 * c0 + N: x[a / 2] holds elements a, a + 1 (first in the low half), so a
 * tile of any 2-byte type (fp16 inputs too) is read as it is stored. */
template <int N> FQLA_DEVICE_INLINE void fqla_wg_load_raw(uint32_t plane, int rows, uint32_t (&x)[N / 4], int c0)
{
    const fqla_wg_frag_row f = fqla_wg_frag_lane();
#pragma unroll
    for (int j = 0; j < N / 8; j += 2) {
        uint32_t h[4];
        fqla_ldsm_x4_at(h, plane + fqla_wg_frag_at(f, rows, c0, j));
#pragma unroll
        for (int q = 0; q < 4; q++) x[2 * (j + (q >> 1)) + (q & 1)] = h[q];
    }
}

/* Descriptor of k-step kk of a plane used K-major (MN = 0) or MN-major. */
template <int MN> FQLA_DEVICE_INLINE uint64_t fqla_wg_desc(uint32_t plane, int rows, int kk)
{
    const uint32_t a = MN ? plane + (uint32_t)kk * 2048u : plane + (uint32_t)((kk >> 2) * rows * 128 + (kk & 3) * 32);
    return fqla_desc_at(a, MN ? (uint32_t)rows * 128u : 16u, 1024u);
}

template <int N> struct fqla_wg_n;
template <> struct fqla_wg_n<64> {
    template <int TA, int TB> static FQLA_DEVICE_INLINE void mma(float (&d)[32], uint64_t a, uint64_t b, int acc)
    {
        fqla_wg<__nv_bfloat16>::ss64<TA, TB>(d, a, b, acc);
    }
    template <int TB> static FQLA_DEVICE_INLINE void rs(float (&d)[32], const uint32_t (&a)[4], uint64_t b, int acc)
    {
        fqla_wg<__nv_bfloat16>::rs64<TB>(d, a, b, acc);
    }
};
template <> struct fqla_wg_n<128> {
    template <int TA, int TB> static FQLA_DEVICE_INLINE void mma(float (&d)[64], uint64_t a, uint64_t b, int acc)
    {
        fqla_wg<__nv_bfloat16>::ss128<TA, TB>(d, a, b, acc);
    }
    template <int TB> static FQLA_DEVICE_INLINE void rs(float (&d)[64], const uint32_t (&a)[4], uint64_t b, int acc)
    {
        fqla_wg<__nv_bfloat16>::rs128<TB>(d, a, b, acc);
    }
};

/* Issues acc (+)= A B over k in [k0, k1) (multiples of 16) for the whole
 * warpgroup: TA / TB 0 K-major, 1 MN-major (above); ACC 0 overwrites acc
 * at the first k-step; A_LO / B_LO: the tile's lo plane is used (a
 * template choice: a branch between two wgmma makes ptxas fence the
 * warpgroup before each one, its C7519). No fence, commit or wait:
 * fqla_wg_run wraps a group of these. */
template <int N, int TA, int TB, bool A_LO = true, bool B_LO = true>
FQLA_DEVICE_INLINE void fqla_wg_split(float (&acc)[N / 2], const fqla_wg_tile &A, const fqla_wg_tile &B, int k0, int k1,
                                      bool accumulate)
{
    for (int kk = k0 / 16; kk < k1 / 16; kk++) {
        const uint64_t ah = fqla_wg_desc<TA>(A.hi, A.rows, kk), bh = fqla_wg_desc<TB>(B.hi, B.rows, kk);
        fqla_wg_n<N>::template mma<TA, TB>(acc, ah, bh, (accumulate || kk > k0 / 16) ? 1 : 0);
        if constexpr (B_LO) fqla_wg_n<N>::template mma<TA, TB>(acc, ah, fqla_wg_desc<TB>(B.lo, B.rows, kk), 1);
        if constexpr (A_LO) fqla_wg_n<N>::template mma<TA, TB>(acc, fqla_wg_desc<TA>(A.lo, A.rows, kk), bh, 1);
    }
}

/* Register operands (RS wgmma). A warpgroup's accumulator-layout array x
 * of a 64 x 16 KS matrix (8 KS floats a thread) as the A fragments of its
 * KS k-steps: k-step kk's fragment register q holds x[8 kk + 2 q], + 1
 * (rows g / g + 8, columns 2 t / 2 t + 8 of the step, as the accumulator
 * has them), split into hi / lo planes. */
template <int KS>
FQLA_DEVICE_INLINE void fqla_wg_frags(const float (&x)[8 * KS], uint32_t (&hi)[KS][4], uint32_t (&lo)[KS][4])
{
#pragma unroll
    for (int kk = 0; kk < KS; kk++)
#pragma unroll
        for (int q = 0; q < 4; q++) fqla_wg_hilo(x[8 * kk + 2 * q], x[8 * kk + 2 * q + 1], hi[kk][q], lo[kk][q]);
}

/* Issues acc (+)= A B over KS k-steps with A in registers (fqla_wg_frags;
 * A_LO false: A exact in bf16, its lo plane unused) and B a tile (TB 0
 * K-major, 1 MN-major; B_LO: B.lo used). Which terms run is a template
 * choice: a branch between two wgmma makes ptxas wait for the first
 * (its C7519 warning). wgmma reads A's registers after the issue: the
 * caller keeps them unchanged, and live (fqla_reg_fence_u after the wait),
 * until the group retires. */
template <int N, int TB, bool A_LO, bool B_LO, int KS>
FQLA_DEVICE_INLINE void fqla_wg_rs_split(float (&acc)[N / 2], const uint32_t (&ah)[KS][4], const uint32_t (&al)[KS][4],
                                         const fqla_wg_tile &B, bool accumulate)
{
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
        const uint64_t bh = fqla_wg_desc<TB>(B.hi, B.rows, kk);
        fqla_wg_n<N>::template rs<TB>(acc, ah[kk], bh, (accumulate || kk > 0) ? 1 : 0);
        if constexpr (B_LO) fqla_wg_n<N>::template rs<TB>(acc, ah[kk], fqla_wg_desc<TB>(B.lo, B.rows, kk), 1);
        if constexpr (A_LO) fqla_wg_n<N>::template rs<TB>(acc, al[kk], bh, 1);
    }
}

/* The transposed view of a 64-column block of a tile's hi plane, as raw
 * 2-byte pairs in the accumulator layout: x[r][c] = t(c, c0 + r) for the
 * warpgroup's 64 rows r and the tile's N = 16 KS rows as columns c; pair
 * q of step kk holds view elements 8 kk + 2 q, + 1 (fqla_wg_frags' order,
 * so an exact bf16 tile's pairs are A fragments as they are). One
 * ldmatrix.trans a step. */
template <int KS> FQLA_DEVICE_INLINE void fqla_wg_load_t(const fqla_wg_tile &t, uint32_t (&x)[KS][4], int c0)
{
    const int lane = threadIdx.x & 31, q = lane >> 3, w = (threadIdx.x >> 5) & 3;
#pragma unroll
    for (int kk = 0; kk < KS; kk++)
        fqla_ldsm_x4_t_at(x[kk], t.hi + fqla_wg_off(t.rows, 16 * kk + 8 * (q >> 1) + (lane & 7), c0 + 16 * w + 8 * (q & 1)));
}

/* fqla_wg_issue: fences the accumulators and issues f's products as one
 * group; fqla_wg_retire: waits for every group issued, then fences the
 * accumulators again (work that needs no accumulator, e.g. global loads for
 * the next step, can go between the two); fqla_wg_run: both. */
template <typename F, int N> FQLA_DEVICE_INLINE void fqla_wg_issue(float (&acc)[N], F f)
{
    /* wgmma is .aligned: the warp must arrive converged, which the compiler
     * does not know of an asm statement after divergent code */
    __syncwarp();
    fqla_reg_fence(acc);
    fqla_wg_fence();
    f();
    fqla_wg_commit();
}
template <int N> FQLA_DEVICE_INLINE void fqla_wg_retire(float (&acc)[N])
{
    fqla_wg_wait<0>();
    fqla_reg_fence(acc);
}
template <typename F, int N> FQLA_DEVICE_INLINE void fqla_wg_run(float (&acc)[N], F f)
{
    fqla_wg_issue(acc, f);
    fqla_wg_retire(acc);
}

#endif
