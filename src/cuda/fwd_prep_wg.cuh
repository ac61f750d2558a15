/*
 * fwd_prep_wg.cuh - one chunk's preparation by one warpgroup, in pieces that
 * the prepare kernel (fwd_prepare.cu) and the fully fused kernel
 * (fwd_full.cu) share: K K^T by wgmma over the K tile, the diagonal 16x16
 * blocks of the gate-free inverse by forward substitution, the off-diagonal
 * blocks by doubling on tensor cores in 3xTF32, and Ag's 16x32 tiles in
 * accumulator layout. The matrices KK and X are fp32 in shared memory,
 * [64][LDF]; X may lie over KK (the inverse in place: each step overwrites a
 * block only after the last step that reads it).
 */
#pragma once
#include "cuda/fwd_common.cuh"
#include "cuda/fwd_prepare_common.cuh"
#include "cuda/fwd_ptx.cuh"
#include "cuda/hopper.cuh"

namespace {

/* fp32 matrices KK and X: [64][72]. 72 = 8 mod 32 words: the float2 operand
 * loads (row g, columns 2t, 2t+1) hit every bank once per half warp. */
constexpr int LDF = FQLA_FWD_CHUNK + 8;

/* 16x16 fp32 blocks in m16n8 accumulator layout: acc[nt][e] is row
 * g + 8 (e / 2), column 8 nt + 2 t + e % 2 of the block. */
__device__ __forceinline__ void zero16(float (&acc)[2][4])
{
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[nt][e] = 0.f;
}
__device__ __forceinline__ void neg16(float (&acc)[2][4])
{
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[nt][e] = -acc[nt][e];
}
/* rows times s[row] (diag(s) A) */
__device__ __forceinline__ void rows_times16(float (&acc)[2][4], const float *s, int lane)
{
    const float s0 = s[lane >> 2], s1 = s[(lane >> 2) + 8];
#pragma unroll
    for (int nt = 0; nt < 2; nt++) {
        acc[nt][0] *= s0;
        acc[nt][1] *= s0;
        acc[nt][2] *= s1;
        acc[nt][3] *= s1;
    }
}
/* the block to fp32 shared memory at m (row stride LDF) */
__device__ __forceinline__ void store16(float *m, const float (&acc)[2][4], int lane)
{
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < 2; nt++) {
        *reinterpret_cast<float2 *>(m + g * LDF + 8 * nt + 2 * t) = make_float2(acc[nt][0], acc[nt][1]);
        *reinterpret_cast<float2 *>(m + (g + 8) * LDF + 8 * nt + 2 * t) = make_float2(acc[nt][2], acc[nt][3]);
    }
}
/* acc += A B, A and B 16x16 fp32 blocks in shared memory (row-major, row
 * stride LDF), tf32 m16n8k8 in PREC's split (3: 3xTF32) */
template <int PREC>
__device__ __forceinline__ void mm16(float (&acc)[2][4], const float *a, const float *b, int lane)
{
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int ks = 0; ks < 2; ks++) {
        const float *ak = a + 8 * ks, *bk = b + 8 * ks * LDF;
        const tf32_a<PREC> af(ak[g * LDF + t], ak[(g + 8) * LDF + t], ak[g * LDF + t + 4], ak[(g + 8) * LDF + t + 4]);
#pragma unroll
        for (int nt = 0; nt < 2; nt++) mma_f32<PREC>(acc[nt], af, bk[t * LDF + 8 * nt + g], bk[(t + 4) * LDF + 8 * nt + g]);
    }
}

/* Without Q (the fused path): KK = K K^T by one warpgroup, SS wgmma
 * m64n64k16 on the K tile as TMA writes it (two 64-column boxes, 128-byte
 * swizzle: both operands K-major, the same descriptors), then warp w (of
 * the warpgroup) stores its 16 rows' blocks at or left of the diagonal to
 * KKd (fp32, row stride LDF). mma.sync with ldmatrix fragments made K K^T
 * 34 % of the kernel's shared-memory wavefronts, the largest share, in a
 * kernel bound by its shared-memory pipe (docs/perf.md, session 10): each
 * warp loaded its own copies of the operands. OVER_K: KKd lies over the K
 * tile (PAIR). */
template <typename T, bool OVER_K>
__device__ __forceinline__ void kk_wgmma(const T *Ktile, float *KKd, int w, int lane, int bar)
{
    float d[32];
    /* one descriptor, stepped by constants: 32 bytes per k-step in a box,
     * the box (64 columns x 64 rows) 64 C sizeof(T) bytes on (the
     * descriptor counts 16-byte units) */
    const uint64_t d0 = fqla_desc_kmajor(Ktile);
    fqla_wg_fence();
#pragma unroll
    for (int kk = 0; kk < 128 / 16; kk++) {
        const uint64_t dk = d0 + (uint64_t)((kk >> 2) * 64 * FQLA_FWD_CHUNK * (int)sizeof(T) / 16) + (kk & 3) * FQLA_DESC_K16_KMAJOR;
        fqla_wg<T>::template ss64<0, 0>(d, dk, dk, kk > 0);
    }
    fqla_wg_commit();
    fqla_wg_wait<0>();
    fqla_reg_fence(d);
    /* KKd over the K tile (PAIR): every warp's part of the product has read
     * it before any warp stores (named barrier bar, the warpgroup) */
    if (OVER_K) fqla_named_sync(bar, 128);
    /* d[4j..4j+3]: rows 16 w + g (+ 8), columns 8 j + 2 t, + 1 */
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        if (j / 2 > w) break; /* blocks above the diagonal are not read */
        float *dd = KKd + (16 * w + g) * LDF + 8 * j + 2 * t;
        *reinterpret_cast<float2 *>(dd) = make_float2(d[4 * j], d[4 * j + 1]);
        *reinterpret_cast<float2 *>(dd + 8 * LDF) = make_float2(d[4 * j + 2], d[4 * j + 3]);
    }
}

/* A 16-column block b of Ag's rows 16 mw..: 0 above the diagonal (zeros),
 * 1 the diagonal block (i >= j kept), 2 below it. */
__device__ __forceinline__ int ag_kind(int b, int mw) { return b > mw ? 0 : b == mw ? 1 : 2; }
/* u (store_tile's layout) = Ag = Gamma (.) X diag(beta) on the 16x32 tile
 * at (r0, n0), the two 16-column blocks of kinds K0, K1 (ag_kind): a
 * straight-line body per combination, the diagonal masks only where they
 * apply. The general loop kept all sixteen masks as bits of one register
 * (LOP3, P2R per element) and branched per n-tile: ~11 instructions per
 * element, 28 % of the kernel's (docs/perf.md, session 10). Used without
 * Q; the kernels with Q keep the general loop (this body with the kinds
 * at run time spilled ~100 bytes there). */
template <typename T, int K0, int K1>
__device__ __forceinline__ void ag_tile(uint32_t (&u)[4][2], const float *Xh, const float *gh, const float *bh, int r0,
                                        int n0, int lane)
{
    typedef fqla_io<T> io;
    const int g = lane >> 2, t = lane & 3;
    const float gi[2] = {gh[r0 + g], gh[r0 + g + 8]};
#pragma unroll
    for (int nt = 0; nt < 4; nt++) {
        const int kind = nt < 2 ? K0 : K1;
        u[nt][0] = u[nt][1] = 0u;
        if (kind == 0) continue;
        const int col = n0 + 8 * nt + 2 * t, lc = 8 * (nt & 1) + 2 * t; /* lc: in the 16-column block */
        const float2 gc = *reinterpret_cast<const float2 *>(gh + col);
        const float2 bc = *reinterpret_cast<const float2 *>(bh + col);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int lr = g + 8 * h;
            const float2 xv = *reinterpret_cast<const float2 *>(Xh + (r0 + lr) * LDF + col);
            float v0 = fqla_ex2(gi[h] - gc.x) * xv.x * bc.x;
            float v1 = fqla_ex2(gi[h] - gc.y) * xv.y * bc.y;
            if (kind == 1) { /* the diagonal block: i >= j only */
                v0 = lc <= lr ? v0 : 0.f;
                v1 = lc + 1 <= lr ? v1 : 0.f;
            }
            u[nt][h] = io::pack(v0, v1);
        }
    }
}


/* Ag's 16x32 tile at rows r0 = 16 mw, columns n0 (0 or 32) of one head
 * (ag_tile, its block kinds picked here; the tile must hold a block at or
 * left of the diagonal: n0 < fqla_fwd_ag_width(mw)). */
template <typename T>
__device__ __forceinline__ void ag_tile_at(uint32_t (&u)[4][2], const float *Xh, const float *gh, const float *bh,
                                           int mw, int n0, int lane)
{
    const int r0 = 16 * mw;
    switch (ag_kind(n0 / 16, mw) * 3 + ag_kind(n0 / 16 + 1, mw)) {
    case 3: ag_tile<T, 1, 0>(u, Xh, gh, bh, r0, n0, lane); break;
    case 7: ag_tile<T, 2, 1>(u, Xh, gh, bh, r0, n0, lane); break;
    default: ag_tile<T, 2, 2>(u, Xh, gh, bh, r0, n0, lane); break;
    }
}

/* Step a: diagonal block s / 16 of X = (I + M)^-1, M = diag(b)
 * StrictLower(KK), by forward substitution, lane jc (0 .. 15) of a half warp
 * its column. Right-looking: once x_i is known it updates every later row's
 * sum; each row's sum adds its terms in increasing k. IN_PLACE: X is KK
 * (every lane of the warp reads the block before any lane overwrites it). */
template <bool IN_PLACE>
__device__ __forceinline__ void diag_block(const float *KK, float *X, const float *b, int s, int jc)
{
    float acc[16], x[16];
#pragma unroll
    for (int i = 0; i < 16; i++) acc[i] = 0.f;
#pragma unroll
    for (int i = 0; i < 16; i++) {
        x[i] = (i == jc ? 1.f : 0.f) - b[s + i] * acc[i];
#pragma unroll
        for (int r = i + 1; r < 16; r++) acc[r] += KK[(s + r) * LDF + s + i] * x[i];
    }
    if (IN_PLACE) __syncwarp();
#pragma unroll
    for (int i = 0; i < 16; i++) X[(s + i) * LDF + s + jc] = x[i];
}

/* Step b: the off-diagonal blocks of X by doubling, in three levels, warp
 * role r (0 .. 3) of the head's four warps; phase(i) separates the levels
 * (a barrier over every warp that reads another's blocks; i: the timing
 * span that ends there):
 *   1. r0: X_10 = -X_11 M_10 X_00, r2: X_32 = -X_33 M_32 X_22 (the two
 *      32x32 diagonal inverses); r1: M_21 X_11 and M_20 X_00, r3: M_31 X_11
 *      and M_30 X_00 (kept in registers);
 *   2. r1: T_20 = M_20 X_00 + M_21 X_10, T_21 = M_21 X_11; r3: T_30, T_31
 *      likewise;
 *   3. X_2j = -X_22 T_2j (r0: j = 0, r1: j = 1), X_3j = -(X_32 T_2j +
 *      X_33 T_3j) (r2, r3).
 * Five dependent 16x16 products on the longest path, against nine for
 * walking block column 0 down (docs/perf.md, session 9). T and the level-1
 * temporaries go through the blocks above the diagonal, which nothing else
 * reads. Products in PREC's tf32 split (mm16). active: whether this warp's
 * head has a chunk (the barriers run either way). */
template <int PREC, typename Phase>
__device__ __forceinline__ void merges(float *Xw, const float *KKh, const float *bw, int r, int lane, bool active,
                                       Phase phase)
{
    auto blk = [&](float *m, int i, int j) { return m + 16 * i * LDF + 16 * j; };
    auto cblk = [&](const float *m, int i, int j) { return m + 16 * i * LDF + 16 * j; };
    float acc[2][4], acc2[2][4];
    /* level 1 */
    if (active) {
        zero16(acc);
        zero16(acc2);
        if (r == 0 || r == 2) {
            const int i = r + 1, k = r; /* X_10 or X_32 */
            mm16<PREC>(acc, cblk(KKh, i, k), cblk(Xw, k, k), lane);
            rows_times16(acc, bw + 16 * i, lane);
            float *tmp = blk(Xw, r == 0 ? 2 : 0, r == 0 ? 3 : 1);
            store16(tmp, acc, lane);
            __syncwarp();
            zero16(acc2);
            mm16<PREC>(acc2, cblk(Xw, i, i), tmp, lane);
            neg16(acc2);
            store16(blk(Xw, i, k), acc2, lane);
        } else {
            const int i = r == 1 ? 2 : 3;
            mm16<PREC>(acc, cblk(KKh, i, 1), cblk(Xw, 1, 1), lane);  /* M_i1 X_11 */
            mm16<PREC>(acc2, cblk(KKh, i, 0), cblk(Xw, 0, 0), lane); /* M_i0 X_00, partial */
        }
    }
    phase(5);
    /* level 2 */
    if (active && (r == 1 || r == 3)) {
        const int i = r == 1 ? 2 : 3;
        mm16<PREC>(acc2, cblk(KKh, i, 1), cblk(Xw, 1, 0), lane); /* + M_i1 X_10 */
        rows_times16(acc, bw + 16 * i, lane);
        rows_times16(acc2, bw + 16 * i, lane);
        store16(blk(Xw, r == 1 ? 0 : 1, 2), acc2, lane); /* T_i0 */
        store16(blk(Xw, r == 1 ? 0 : 1, 3), acc, lane);  /* T_i1 */
    }
    phase(6);
    /* level 3: T_2j at block (0, 2 + j), T_3j at (1, 2 + j) */
    if (active) {
        const int j = r & 1, i = r < 2 ? 2 : 3;
        zero16(acc);
        if (i == 3) mm16<PREC>(acc, cblk(Xw, 3, 2), cblk(Xw, 0, 2 + j), lane);
        mm16<PREC>(acc, cblk(Xw, i, i), cblk(Xw, i - 2, 2 + j), lane);
        neg16(acc);
        store16(blk(Xw, i, j), acc, lane);
    }
}

} // namespace
