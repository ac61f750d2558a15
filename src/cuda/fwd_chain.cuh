/*
 * fwd_chain.cuh - the per-thread pieces of the state chain that the two
 * warp-specialised sequential kernels share (fwd_chunk_wg.cu and
 * fwd_fused.cu): the state's load and store in the caller's layout, its
 * bf16 / fp16 copy as wgmma A fragments, the operands of G4, G5 and G6 from
 * the accumulators and the token factors, the products G1 .. G6 themselves,
 * the output tile, and the rows past a sequence's end. Layouts as in fwd_chunk_wg.cu: a consumer
 * warpgroup holds S^T (64 value rows x K) as a wgmma accumulator; thread
 * (warp, g = lane / 4, tq = lane % 4) holds value rows vr = v0 + 16 warp + g
 * (+ 8) and key columns kc = 2 tq (+ 1, + 8 ...). At K = 256 (fwd_fused.cu)
 * the chain stages S^T's io-dtype copy in shared memory (stage_state) and
 * G2 and Qs^T read it from there (g2_ss_issue): S^T takes 128 registers.
 */
#ifndef FQLA_CUDA_FWD_CHAIN_CUH
#define FQLA_CUDA_FWD_CHAIN_CUH

#include "cuda/fwd_common.cuh"
#include "cuda/kernel/io.cuh"
#include "cuda/kernel/named_barrier.cuh"
#include "cuda/ptx/ptx.cuh"

/* Tile sh's Ag (fwd_common.cuh's packed layout) into dst as the square
 * 64 x 64 tile with 128-byte swizzle (8 KB, 1024-aligned), completing on
 * bar: one 16-row box per strip, its columns past the strip's width zeros
 * (out of the strip map's bounds; the box's full 2 KB count on bar). */
__device__ __forceinline__ void fqla_fwd_load_ag(unsigned char *dst, const fqla_fwd_ag_maps &m, uint64_t *bar,
                                                 int64_t sh)
{
#pragma unroll
    for (int w = 0; w < 4; w++) fqla_tma_load_2d(dst + 2048 * w, &m.strip[w], bar, 0, (int)(sh * 16));
}

/* The named barriers of the two chain kernels (fwd_chunk_wg.cu and
 * fwd_fused.cu; ids 1 .. 15, kernel/named_barrier.cuh). */
enum class fqla_chain_bar : uint32_t {
    chains = 1, /* every chain warpgroup (128 NWG threads): a tail chunk's rows are zeroed */
    out = 2,    /* + cw, one per chain warpgroup (128 threads): its output staging tile is written */
    state = 4,  /* K = 256, one chain warpgroup (fwd_fused.cu): S^T's io-dtype copy is written */
};
static_assert((uint32_t)fqla_chain_bar::out + 2 <= (uint32_t)fqla_chain_bar::state, "two chain warpgroups' out ids");

namespace fqla_chain {

/* S^T accumulator i: value row vr + 8 ((i >> 1) & 1), key column
 * kc + 8 (i >> 2) + (i & 1); its offset from the thread's base in a state
 * with key stride skey and value stride sval. The layout and dtype tests are
 * made once per call, not per element (per element they cost ~40
 * instructions, ~2700 per warp before the first chunk). */
__device__ __forceinline__ int64_t soff(int i, int64_t skey, int64_t sval)
{
    return (int64_t)(8 * (i >> 2) + (i & 1)) * skey + (int64_t)(8 * ((i >> 1) & 1)) * sval;
}

/* S = h0[row, hv] (fp32 or bf16, [K][V] or [V][K]), or zeros without h0. */
template <int NS>
__device__ __forceinline__ void load_state(const fqla_fwd_params &p, float (&S)[NS], int64_t row, int hv, int vr,
                                           int kc)
{
    if (!p.h0) {
#pragma unroll
        for (int i = 0; i < NS; i++) S[i] = 0.f;
        return;
    }
    const int64_t skey = p.v_first ? 1 : p.h0_s2, sval = p.v_first ? p.h0_s2 : 1;
    const int64_t base = row * p.h0_sn + hv * p.h0_sh + kc * skey + vr * sval;
    if (p.h0_bf16) {
        const __nv_bfloat16 *h = (const __nv_bfloat16 *)p.h0 + base;
#pragma unroll
        for (int i = 0; i < NS; i++) S[i] = __bfloat162float(h[soff(i, skey, sval)]);
    } else {
        const float *h = (const float *)p.h0 + base;
#pragma unroll
        for (int i = 0; i < NS; i++) S[i] = h[soff(i, skey, sval)];
    }
}

/* ht[row, hv] = S (p.ht set; fp32 or bf16, the caller's layout). */
template <int NS>
__device__ __forceinline__ void store_state(const fqla_fwd_params &p, const float (&S)[NS], int64_t row, int hv,
                                            int vr, int kc)
{
    const int64_t skey = p.ht_v_first ? 1 : p.ht_s2, sval = p.ht_v_first ? p.ht_s2 : 1;
    const int64_t base = row * p.ht_sn + hv * p.ht_sh + kc * skey + vr * sval;
    if (p.ht_bf16) {
        __nv_bfloat16 *h = (__nv_bfloat16 *)p.ht + base;
#pragma unroll
        for (int i = 0; i < NS; i++) h[soff(i, skey, sval)] = __float2bfloat16_rn(S[i]);
    } else {
        float *h = (float *)p.ht + base;
#pragma unroll
        for (int i = 0; i < NS; i++) h[soff(i, skey, sval)] = S[i];
    }
}

/* Token t's factors for the chain from gamma (gm, the chunk's inclusive
 * cumsum; gC its last entry) and the l2norm factors rq, rk (1 without
 * l2norm): (u_t, d_t) = (e^gamma_t rk_t, e^(gamma_C - gamma_t) rk_t) and
 * o_t = scale rq_t e^gamma_t, written once per CTA for every consumer. */
__device__ __forceinline__ void token_factors(float2 *ud, float *fo, const float *gm, int t, float gC, float rq,
                                              float rk, float scale)
{
    const float eg = __expf(gm[t]);
    ud[t] = make_float2(eg * rk, __expf(gC - gm[t]) * rk);
    fo[t] = scale * rq * eg;
}

/* S^T in the io dtype: the A operand of G2, one k-step of 16 keys per kk. */
template <typename T, int KS>
__device__ __forceinline__ void pack_state(uint32_t (&sf)[KS][4], const float (&S)[8 * KS])
{
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
        sf[kk][0] = fqla_io<T>::pack(S[8 * kk + 0], S[8 * kk + 1]);
        sf[kk][1] = fqla_io<T>::pack(S[8 * kk + 2], S[8 * kk + 3]);
        sf[kk][2] = fqla_io<T>::pack(S[8 * kk + 4], S[8 * kk + 5]);
        sf[kk][3] = fqla_io<T>::pack(S[8 * kk + 6], S[8 * kk + 7]);
    }
}

/* S^T in the io dtype into KD / 64 tiles of 64 value rows x 64 keys
 * (8 KB each, 1024-aligned, TMA's 128-byte swizzle, K-major): the A operand
 * of g2_ss_issue. stmatrix: matrix m of a store holds rows 8 (m & 1) and
 * the 8-key group 2 j2 + (m >> 1) of this warp's 16 rows. The caller fences
 * (fence.proxy.async) and synchronises the warpgroup before the wgmma. */
template <typename T, int KD>
__device__ __forceinline__ void stage_state(unsigned char *dst, const float (&S)[KD / 2], int warp, int lane)
{
    const int mi = lane >> 3, row = 16 * warp + 8 * (mi & 1) + (lane & 7);
#pragma unroll
    for (int b = 0; b < KD / 64; b++)
#pragma unroll
        for (int j2 = 0; j2 < 4; j2++) {
            uint32_t r[4];
#pragma unroll
            for (int m = 0; m < 4; m++) {
                const int i = 32 * b + 4 * (2 * j2 + (m >> 1)) + 2 * (m & 1);
                r[m] = fqla_io<T>::pack(S[i], S[i + 1]);
            }
            const int ch = 2 * j2 + (mi >> 1);
            fqla_stsm_x4(dst + b * FQLA_FWD_CHUNK * 128 + row * 128 + 16 * (ch ^ (row & 7)), r[0], r[1], r[2], r[3]);
        }
}

/* G4's A operand, -U^T diag(u), from U^T's 32 accumulators (register r of
 * k-step kk: accumulators 8 kk + 2 r, +1; token columns 16 kk + 8 (r >> 1)
 * + 2 tq, +1) and the stage's (u_t, d_t). */
template <typename T>
__device__ __forceinline__ void g4_operand(uint32_t (&wn)[4][4], const float *accU, const float2 *ud, int tq)
{
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const int t0 = 16 * kk + 8 * (r >> 1) + 2 * tq;
            const float u0 = ud[t0].x, u1 = ud[t0 + 1].x;
            wn[kk][r] = fqla_io<T>::pack(-u0 * accU[8 * kk + 2 * r], -u1 * accU[8 * kk + 2 * r + 1]);
        }
}

/* Vd (G6's A operand) and Vp = Vd diag(d) (G5's) from Vd^T's accumulators. */
template <typename T>
__device__ __forceinline__ void g56_operands(uint32_t (&vd)[4][4], uint32_t (&vp)[4][4], const float (&accVd)[32],
                                             const float2 *ud, int tq)
{
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const float a0 = accVd[8 * kk + 2 * r], a1 = accVd[8 * kk + 2 * r + 1];
            const int t0 = 16 * kk + 8 * (r >> 1) + 2 * tq;
            const float d0 = ud[t0].y, d1 = ud[t0 + 1].y;
            vd[kk][r] = fqla_io<T>::pack(a0, a1);
            vp[kk][r] = fqla_io<T>::pack(d0 * a0, d1 * a1);
        }
}

/* This thread's output factors o_t, t = 8 j + 2 tq (+ 1). */
__device__ __forceinline__ void load_out_factors(float (&fo)[16], const float *fos, int tq)
{
#pragma unroll
    for (int j = 0; j < 8; j++) {
        const float2 f = *reinterpret_cast<const float2 *>(fos + 8 * j + 2 * tq);
        fo[2 * j] = f.x;
        fo[2 * j + 1] = f.y;
    }
}

/* acc (64 value rows x 64 tokens, accumulator layout) times diag(o):
 * column 8 j + 2 tq + e by fo[2 j + e] (load_out_factors) */
__device__ __forceinline__ void scale_cols(float (&acc)[32], const float (&fo)[16])
{
#pragma unroll
    for (int i = 0; i < 32; i++) acc[i] *= fo[2 * (i >> 2) + (i & 1)];
}

/* O^T = Qs^T diag(o) + P^T into dst as [t][v] b16 in TMA's 128-byte swizzle
 * (stmatrix.trans; lane l addresses token row 8 (j + q / 2) + l % 8, 16-byte
 * chunk 2 warp + q % 2 of it, swizzled: chunk ^ (row % 8), so the 8 rows of
 * each matrix hit 8 different bank groups), then fenced for the TMA store.
 * QS = false: accP holds O^T already (K = 256: scale_cols, then G6 added P^T
 * to Qs^T diag(o)); fo and accQs are not read. */
template <typename T, bool QS = true>
__device__ __forceinline__ void output_tile(unsigned char *dst, const float (&fo)[16], const float *accQs,
                                            const float (&accP)[32], int warp, int lane)
{
    const int q = lane >> 3, rr = lane & 7;
#pragma unroll
    for (int j = 0; j < 8; j += 2) {
        uint32_t r[4];
#pragma unroll
        for (int m = 0; m < 4; m++) {
            /* matrix m: token block j + (m >> 1), value rows 8 (m & 1) */
            const int jj = j + (m >> 1), i0 = 4 * jj + 2 * (m & 1);
            if constexpr (QS)
                r[m] = fqla_io<T>::pack(fo[2 * jj] * accQs[i0] + accP[i0], fo[2 * jj + 1] * accQs[i0 + 1] + accP[i0 + 1]);
            else
                r[m] = fqla_io<T>::pack(accP[i0], accP[i0 + 1]);
        }
        const int row = 8 * (j + (q >> 1)) + rr, ch = 2 * warp + (q & 1);
        fqla_stsm_x4_t(dst + row * 128 + 16 * (ch ^ rr), r[0], r[1], r[2], r[3]);
    }
    fqla_fence_async_smem();
}

/* The rows nvalid.. of a stage's K tiles (KB of them, kq bytes apart; when
 * zero_k) and of one V tile as zeros, whole 128-byte rows (the swizzle does
 * not matter), fenced for wgmma; tid of the warpgroup's 128 threads. */
__device__ __forceinline__ void zero_rows(unsigned char *k, int kb_count, uint32_t kq, bool zero_k, unsigned char *v,
                                          int nvalid, int tid)
{
    const uint4 z = make_uint4(0, 0, 0, 0);
    for (int idx = tid; idx < (FQLA_FWD_CHUNK - nvalid) * 8; idx += 128) {
        const int r = nvalid + (idx >> 3), cv = idx & 7;
        if (zero_k)
            for (int kb = 0; kb < kb_count; kb++) *reinterpret_cast<uint4 *>(k + kb * kq + r * 128 + cv * 16) = z;
        *reinterpret_cast<uint4 *>(v + r * 128 + cv * 16) = z;
    }
    fqla_fence_async_smem();
}

/* A varlen tail chunk's nvalid output rows from the swizzled tile src to o
 * (row by row: the rows after them belong to the next sequence). */
template <typename T>
__device__ __forceinline__ void store_rows(T *ob, int64_t o_st, int64_t t0, const unsigned char *src, int nvalid,
                                           int tid)
{
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int r = (tid >> 3) + 16 * i, cv = tid & 7;
        const uint4 x = *reinterpret_cast<const uint4 *>(src + r * 128 + 16 * (cv ^ (r & 7)));
        if (r < nvalid) *reinterpret_cast<uint4 *>(ob + (t0 + r) * o_st + cv * 8) = x;
    }
}

/* The chain warpgroup cw's store of chunk cc's output rows, staged in tile
 * cc % OT of its OT (1 or 2) at obuf (8 KB each), to o (nothing for cc < 0; start
 * and len the sequence's, in the kernel's integer type I). A whole chunk,
 * or any chunk of a padded batch (the map clips rows past T), goes out as
 * one TMA store issued by thread 0 of the warpgroup, which first waits
 * until its previous store has read its tile: the barrier after that wait
 * orders it before every later write of that tile. A varlen tail chunk
 * (the rows after it belong to the next sequence) is stored row by row.
 * Called by the whole warpgroup, one chunk after the tile was written,
 * while the next chunk's products run (fwd_chunk_wg.cu, fwd_fused.cu). */
template <typename T, typename I, int OT = 2>
__device__ __forceinline__ void store_out(const fqla_fwd_params &p, const CUtensorMap *tmO, const unsigned char *obuf,
                                          T *ob, I cc, I start, I len, int v0, int hv, int64_t batch, int cw, int tid)
{
    constexpr I C = FQLA_FWD_CHUNK;
    if (tid == 0) fqla_bulk_wait_read<0>();
    fqla_bar_sync(fqla_chain_bar::out, 128, cw); /* the warpgroup's stmatrix writes are done and fenced */
    if (cc < 0) return;
    static_assert(OT == 1 || OT == 2, "one or two staging tiles");
    const unsigned char *src = obuf + (cc & (OT - 1)) * (FQLA_FWD_CHUNK * 128);
    const I t0 = start + cc * C;
    const int nvalid = (int)min(C, len - cc * C);
    if (nvalid == C || !p.varlen) {
        if (tid == 0) {
            fqla_tma_store_4d(tmO, src, v0, hv, (int)t0, p.varlen ? 0 : (int)batch);
            fqla_bulk_commit();
        }
        return;
    }
    store_rows(ob, p.o_st, t0, src, nvalid, tid);
}

/* The chain's products, issued by the whole warpgroup (no commit: the
 * caller groups them). Shared-memory operands by descriptor (ptx/wgmma.cuh):
 * tiles of 64 token rows x 64 columns in TMA's 128-byte swizzle, one k-step
 * of 16 tokens FQLA_DESC_K16_* on. */

/* G1: Vd^T = V^T Ag^T (the V tile [t][v]: A MN-major; the accumulators
 * overwritten) */
template <typename T>
__device__ __forceinline__ void g1_issue(float (&accVd)[32], uint64_t dV, uint64_t dAg)
{
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
        fqla_wg<T>::template ss64<1, 0>(accVd, dV + kk * FQLA_DESC_K16_MNMAJOR, dAg + kk * FQLA_DESC_K16_KMAJOR,
                                        kk > 0);
}

/* G2: [U^T | Qs^T] = S^T [K; Q]^T with the Q tiles (N = 128: each 64-wide
 * k block's K and Q tiles back to back at k, kq bytes per block), or
 * U^T = S^T K^T alone (N = 64); sf: pack_state's fragments */
template <typename T, int KS, int N>
__device__ __forceinline__ void g2_issue(float (&accUQ)[N / 2], const uint32_t (&sf)[KS][4], const unsigned char *k,
                                         uint32_t kq)
{
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
        const uint64_t dKQ = fqla_desc_kmajor(k + (kk >> 2) * kq) + (kk & 3) * FQLA_DESC_K16_KMAJOR;
        if constexpr (N == 128) fqla_wg<T>::template rs128<0>(accUQ, sf[kk], dKQ, kk > 0);
        else fqla_wg<T>::template rs64<0>(accUQ, sf[kk], dKQ, kk > 0);
    }
}

/* acc = S^T B^T from stage_state's tiles at sst and the stage's 64-token
 * tiles at b (one per 64-wide k block, kq bytes apart): G2's U^T with b the
 * K tiles, and at K = 256 Qs^T with b the Q tiles (both SS, N = 64) */
template <typename T, int KS>
__device__ __forceinline__ void g2_ss_issue(float (&acc)[32], const unsigned char *sst, const unsigned char *b,
                                            uint32_t kq)
{
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
        const uint64_t dS = fqla_desc_kmajor(sst + (kk >> 2) * (FQLA_FWD_CHUNK * 128)) + (kk & 3) * FQLA_DESC_K16_KMAJOR;
        const uint64_t dB = fqla_desc_kmajor(b + (kk >> 2) * kq) + (kk & 3) * FQLA_DESC_K16_KMAJOR;
        fqla_wg<T>::template ss64<0, 0>(acc, dS, dB, kk > 0);
    }
}

/* G4: Vd^T += (-U^T diag(u)) Ag^T (wn: g4_operand's fragments) */
template <typename T>
__device__ __forceinline__ void g4_issue(float (&accVd)[32], const uint32_t (&wn)[4][4], uint64_t dAg)
{
#pragma unroll
    for (int kk = 0; kk < 4; kk++) fqla_wg<T>::template rs64<0>(accVd, wn[kk], dAg + kk * FQLA_DESC_K16_KMAJOR, 1);
}

/* G5: S^T += Vp^T K (the K tiles [t][k]: B MN-major, dKt over all KD / 64
 * of them, kq bytes apart; vp: g56_operands' fragments). K = 256 as two
 * N = 128 halves: an N = 256 accumulator is the two N = 128 ones side by
 * side. */
template <typename T, int KD>
__device__ __forceinline__ void g5_issue(float (&S)[KD / 2], const uint32_t (&vp)[4][4], uint64_t dKt,
                                         uint32_t kq = 0)
{
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        if constexpr (KD == 256) {
            float(&lo)[64] = *reinterpret_cast<float(*)[64]>(&S[0]);
            float(&hi)[64] = *reinterpret_cast<float(*)[64]>(&S[64]);
            fqla_wg<T>::template rs128<1>(lo, vp[kk], dKt + kk * FQLA_DESC_K16_MNMAJOR, 1);
            fqla_wg<T>::template rs128<1>(hi, vp[kk], dKt + ((2 * kq) >> 4) + kk * FQLA_DESC_K16_MNMAJOR, 1);
        } else if constexpr (KD == 128) {
            fqla_wg<T>::template rs128<1>(S, vp[kk], dKt + kk * FQLA_DESC_K16_MNMAJOR, 1);
        } else {
            fqla_wg<T>::template rs64<1>(S, vp[kk], dKt + kk * FQLA_DESC_K16_MNMAJOR, 1);
        }
    }
}

/* G6: P^T = Vd^T Pg^T (vd: g56_operands' fragments; overwritten, or with
 * ACC added to accP: K = 256's Qs^T diag(o)) */
template <typename T, bool ACC = false>
__device__ __forceinline__ void g6_issue(float (&accP)[32], const uint32_t (&vd)[4][4], uint64_t dPg)
{
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
        fqla_wg<T>::template rs64<0>(accP, vd[kk], dPg + kk * FQLA_DESC_K16_KMAJOR, ACC || kk > 0);
}

/* G1 + G4 as one group, Vd^T = V^T Ag^T - U^T diag(u) Ag^T, from U^T's
 * accumulators (accU) and the stage's (u_t, d_t): G4's operand formed,
 * fenced and both issued (vtile: the stage's 64-column V tile, A MN-major) */
template <typename T>
__device__ __forceinline__ void g14_issue(float (&accVd)[32], const float *accU, const float2 *ud, int tq,
                                          const unsigned char *vtile, uint64_t dAg)
{
    uint32_t wn[4][4];
    g4_operand<T>(wn, accU, ud, tq);
    fqla_reg_fence_u(wn);
    fqla_wg_fence();
    g1_issue<T>(accVd, fqla_desc_mnmajor(vtile, FQLA_FWD_CHUNK * 128), dAg);
    g4_issue<T>(accVd, wn, dAg);
    fqla_wg_commit();
}

/* G5's and G6's operands from Vd^T (g56_operands), fenced with S for the
 * products that follow */
template <typename T, int NS>
__device__ __forceinline__ void g56_ready(uint32_t (&vd)[4][4], uint32_t (&vp)[4][4], const float (&accVd)[32],
                                          const float2 *ud, int tq, float (&S)[NS])
{
    g56_operands<T>(vd, vp, accVd, ud, tq);
    fqla_reg_fence(S);
    fqla_reg_fence_u(vd);
    fqla_reg_fence_u(vp);
    fqla_wg_fence();
}

} // namespace fqla_chain

#endif
