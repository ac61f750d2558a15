/*
 * fwd_chunk_wo.cu - the forward's sequential kernel with the output on its
 * own warpgroup (sm_90a, TMA + wgmma). Same contract and workspace as
 * fwd_chunk_wg.cu, minus Pg: this kernel forms Pg itself.
 *
 * EXPERIMENTAL, not the default: it passes every test of fwd_chunk_kernels
 * but measured ~2x slower per chunk than fwd_chunk_wg.cu on the H200
 * (docs/perf.md v5, with the hypotheses not yet checked). Selected only by
 * fqla_cuda_fwd_tune_chunk(2, 0).
 *
 * One CTA of three warpgroups per (sequence, value head, 64 value columns):
 *   producer  warp 0: TMA loads of K, Q, the V slice and Ag into a two-stage
 *             ring (full / empty mbarriers); warp 1: the per-token factors
 *             (ready);
 *   chain     the state recurrence only, S^T (64 x K, fp32) a wgmma
 *             accumulator:  U^T = S^T K^T,  Vd^T = V^T Ag^T - (U^T diag(u)) Ag^T,
 *             S^T = e^gamma_C S^T + (Vd^T diag(d)) K.  It publishes the
 *             chunk-start state S^T (bf16) and Vd^T in shared memory
 *             (stmatrix, 128-byte swizzle: wgmma B operands);
 *   output    O = diag(o) Q S + P Vd with P = scale Gamma (.) tril(Q K^T)
 *             (rq, rk folded in) formed from its own SS product of the
 *             staged Q and K tiles, so Pg never goes through global memory;
 *             it stores o.
 * The chain per chunk is three dependent wgmma groups; everything about the
 * output runs beside it. Hand-offs per chunk (buffers double-buffered by
 * chunk parity b): sready[b] (S published), vready[b] (Vd published),
 * ofree[b] (the output warpgroup is done with both). Tails as in
 * fwd_chunk_wg.cu: the chain warpgroup zeroes the K and V rows past the end
 * before either warpgroup reads them (named barrier 1 over both).
 */
#include "cuda/fwd_common.cuh"
#include "cuda/fwd_ptx.cuh"
#include "cuda/hopper.cuh"

namespace {

constexpr int C = FQLA_FWD_CHUNK;
constexpr uint32_t TILE = C * 128; /* one [64 rows][64 b16] swizzled tile */

template <int KD>
struct wo_cfg {
    static constexpr int KB = KD / 64;
    /* one pipeline stage (bytes from its base; tiles 1024-aligned) */
    static constexpr uint32_t oK = 0;
    static constexpr uint32_t oQ = oK + KB * TILE;
    static constexpr uint32_t oV = oQ + KB * TILE;
    static constexpr uint32_t oAg = oV + TILE;
    static constexpr uint32_t oGam = oAg + TILE;  /* float[64] */
    static constexpr uint32_t oRq = oGam + 256;   /* float[64] (l2norm) */
    static constexpr uint32_t oRk = oRq + 256;
    static constexpr uint32_t oFac = oRk + 256;   /* float2[64] (u_t, d_t), float[64] o_t */
    static constexpr uint32_t tx_tiles = oGam + 256;
    static constexpr uint32_t stage = (oFac + 3 * 256 + 1023) / 1024 * 1024;
    /* three stages (~50 KB each): a stage is refilled only once both
     * warpgroups are done with it, and a TMA round trip (~1-2 us) is longer
     * than a chunk */
    static constexpr int STAGES = 3;
    static constexpr uint32_t oSb = STAGES * stage;       /* [2][KB] tiles: S^T, [v][k] */
    static constexpr uint32_t oVd = oSb + 2 * KB * TILE;   /* [2] tiles: Vd^T, [v][t] */
    static constexpr int LDO = C + 8;                      /* output staging rows (b16) */
    static constexpr uint32_t oO = oVd + 2 * TILE;         /* [2][64][LDO] */
    static constexpr uint32_t oBar = oO + 2 * C * LDO * 2;
    static constexpr uint32_t bytes = oBar + 15 * 8 + 1024;
};

/* Stores the A-operand fragments of one 64 x 16 k-block (registers of
 * rows 16 w + g (+8), columns 16 kk + 2 tq (+8)) into a swizzled [64][64]
 * tile as a wgmma K-major operand: 16-byte chunk c of row r at
 * r * 128 + (c ^ (r & 7)) * 16. */
__device__ __forceinline__ void stsm_kblock(unsigned char *tile, int kk, const uint32_t (&a)[4], int warp, int lane)
{
    const int q = lane >> 3;
    const int r = 16 * warp + 8 * (q & 1) + (lane & 7);
    const int ch = 2 * (kk & 3) + (q >> 1);
    const uint32_t addr = fqla_h_smem(tile + r * 128 + ((ch ^ (r & 7)) << 4));
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(a[0]),
                 "r"(a[1]), "r"(a[2]), "r"(a[3])
                 : "memory");
}

template <typename T, int KD>
__global__ void __launch_bounds__(384, 1)
    fwd_chunk_wo_kernel(const __grid_constant__ fqla_fwd_params p, const __grid_constant__ CUtensorMap tmQ,
                        const __grid_constant__ CUtensorMap tmK, const __grid_constant__ CUtensorMap tmV,
                        const __grid_constant__ CUtensorMap tmA)
{
    typedef wo_cfg<KD> cfg;
    typedef fqla_io<T> io;
    typedef fqla_wg<T> mma;
    constexpr int KS = KD / 16;
    extern __shared__ unsigned char smem_raw[];
    unsigned char *sm = (unsigned char *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    uint64_t *bar = reinterpret_cast<uint64_t *>(sm + cfg::oBar);
    uint64_t *full = bar, *empty = bar + 3, *ready = bar + 6, *sready = bar + 9, *vready = bar + 11,
             *ofree = bar + 13;

    const int wg = threadIdx.x >> 7;
    const int64_t n = blockIdx.x / p.HV;
    const int hv = blockIdx.x % p.HV;
    const int hq = hv / p.group;
    const int v0 = blockIdx.y * 64;
    int64_t batch, start, len, slot0;
    fqla_fwd_seq(p, n, batch, start, len, slot0);
    const int64_t nch = (len + C - 1) / C;

    if (threadIdx.x == 0) {
        fqla_tma_prefetch(&tmQ);
        fqla_tma_prefetch(&tmK);
        fqla_tma_prefetch(&tmV);
        fqla_tma_prefetch(&tmA);
        for (int s = 0; s < cfg::STAGES; s++) {
            fqla_mbar_init(&full[s], 1);
            fqla_mbar_init(&empty[s], 8); /* lane 0 of the chain and output warps */
            fqla_mbar_init(&ready[s], 32); /* every lane of the factor warp */
        }
        for (int b = 0; b < 2; b++) {
            fqla_mbar_init(&sready[b], 4);
            fqla_mbar_init(&vready[b], 4);
            fqla_mbar_init(&ofree[b], 4);
        }
        fqla_mbar_init_fence();
    }
    __syncthreads();

    const int tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, tq = lane & 3;

    if (wg == 0) {
        fqla_setmaxnreg_dec<40>();
        if (warp == 0) {
            if (fqla_elect_one()) {
                const int bc = p.varlen ? 0 : (int)batch;
                const uint32_t tx = cfg::tx_tiles + (p.l2norm ? 512u : 0u);
                for (int64_t c = 0; c < nch; c++) {
                    const int s = (int)(c % cfg::STAGES);
                    fqla_mbar_wait(&empty[s], ((uint32_t)(c / cfg::STAGES) & 1) ^ 1);
                    unsigned char *st = sm + s * cfg::stage;
                    fqla_mbar_arrive_tx(&full[s], tx);
                    const int t = (int)(start + c * C);
#pragma unroll
                    for (int kb = 0; kb < cfg::KB; kb++) {
                        fqla_tma_load_4d(st + cfg::oK + kb * TILE, &tmK, &full[s], 64 * kb, hq, t, bc);
                        fqla_tma_load_4d(st + cfg::oQ + kb * TILE, &tmQ, &full[s], 64 * kb, hq, t, bc);
                    }
                    fqla_tma_load_4d(st + cfg::oV, &tmV, &full[s], v0, hv, t, bc);
                    const int64_t sh = (slot0 + c) * p.HV + hv;
                    fqla_tma_load_2d(st + cfg::oAg, &tmA, &full[s], 0, (int)(sh * C));
                    fqla_bulk_load(st + cfg::oGam, p.gam + sh * C, 256, &full[s]);
                    if (p.l2norm) {
                        const int64_t qh = ((slot0 + c) * p.H + hq) * C;
                        fqla_bulk_load(st + cfg::oRq, p.rq + qh, 256, &full[s]);
                        fqla_bulk_load(st + cfg::oRk, p.rk + qh, 256, &full[s]);
                    }
                }
            }
        } else if (warp == 1) {
            /* per-token factors, once per CTA: lane l does tokens 2 l, 2 l + 1 */
            for (int64_t c = 0; c < nch; c++) {
                const int s = (int)(c % cfg::STAGES);
                fqla_mbar_wait(&full[s], (uint32_t)(c / cfg::STAGES) & 1);
                unsigned char *st = sm + s * cfg::stage;
                const float *gm = reinterpret_cast<const float *>(st + cfg::oGam);
                float2 *ud = reinterpret_cast<float2 *>(st + cfg::oFac);
                float *fo = reinterpret_cast<float *>(st + cfg::oFac + 512);
                const float gC = gm[C - 1];
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int t = 2 * lane + e;
                    float rq = 1.f, rk = 1.f;
                    if (p.l2norm) {
                        rq = reinterpret_cast<const float *>(st + cfg::oRq)[t];
                        rk = reinterpret_cast<const float *>(st + cfg::oRk)[t];
                    }
                    const float eg = __expf(gm[t]);
                    ud[t] = make_float2(eg * rk, __expf(gC - gm[t]) * rk);
                    fo[t] = p.scale * rq * eg;
                }
                fqla_mbar_arrive(&ready[s]);
            }
        }
        return;
    }

    if (wg == 1) {
        /* ---------------- chain warpgroup ---------------- */
        fqla_setmaxnreg_inc<232>();
        constexpr int NS = KD / 2;
        float S[NS]; /* S^T: row 16 warp + g + 8 ((i >> 1) & 1), column 8 (i >> 2) + 2 tq + (i & 1) */
#pragma unroll
        for (int i = 0; i < NS; i++) {
            float x = 0.f;
            if (p.h0) {
                const int vv = v0 + 16 * warp + g + 8 * ((i >> 1) & 1);
                const int kk = 8 * (i >> 2) + 2 * tq + (i & 1);
                const int64_t off = n * p.h0_sn + hv * p.h0_sh +
                                    (p.v_first ? (int64_t)vv * p.h0_s2 + kk : (int64_t)kk * p.h0_s2 + vv);
                x = p.h0_bf16 ? __bfloat162float(((const __nv_bfloat16 *)p.h0)[off]) : ((const float *)p.h0)[off];
            }
            S[i] = x;
        }
        for (int64_t c = 0; c < nch; c++) {
            /* stage s (phase ph) of the ring; buffer b (phase bph) of the hand-offs */
            const int s = (int)(c % cfg::STAGES), b = (int)(c & 1);
            const uint32_t ph = (uint32_t)(c / cfg::STAGES) & 1, bph = (uint32_t)(c >> 1) & 1;
            unsigned char *st = sm + s * cfg::stage;
            fqla_mbar_wait(&full[s], ph);
            fqla_mbar_wait(&ready[s], ph);
            const int nvalid = (int)min((int64_t)C, len - c * C);
            if (nvalid < C) {
                const uint4 z = make_uint4(0, 0, 0, 0);
                for (int idx = tid; idx < (C - nvalid) * 8; idx += 128) {
                    const int r = nvalid + (idx >> 3), cv = idx & 7;
#pragma unroll
                    for (int kb = 0; kb < cfg::KB; kb++)
                        *reinterpret_cast<uint4 *>(st + cfg::oK + kb * TILE + r * 128 + cv * 16) = z;
                    *reinterpret_cast<uint4 *>(st + cfg::oV + r * 128 + cv * 16) = z;
                }
                fqla_fence_async_smem();
                fqla_named_sync(1, 256);
            }
            const float2 *ud = reinterpret_cast<const float2 *>(st + cfg::oFac);
            const float gC = reinterpret_cast<const float *>(st + cfg::oGam)[C - 1];

            /* the chunk-start state in bf16: A operand of U^T, published for Q S */
            uint32_t sf[KS][4];
#pragma unroll
            for (int kk = 0; kk < KS; kk++) {
                sf[kk][0] = io::pack(S[8 * kk + 0], S[8 * kk + 1]);
                sf[kk][1] = io::pack(S[8 * kk + 2], S[8 * kk + 3]);
                sf[kk][2] = io::pack(S[8 * kk + 4], S[8 * kk + 5]);
                sf[kk][3] = io::pack(S[8 * kk + 6], S[8 * kk + 7]);
            }
            float accVd[32], accU[32];
            const uint64_t dAg = fqla_desc_kmajor(st + cfg::oAg);
            fqla_reg_fence_u(sf);
            fqla_wg_fence();
            {   /* Vd^T = V^T Ag^T, then U^T = S^T K^T */
                const uint64_t dV = fqla_desc_mnmajor(st + cfg::oV, TILE);
#pragma unroll
                for (int kk = 0; kk < 4; kk++)
                    mma::template ss64<1, 0>(accVd, dV + kk * FQLA_DESC_K16_MNMAJOR,
                                             dAg + kk * FQLA_DESC_K16_KMAJOR, kk > 0);
                fqla_wg_commit();
#pragma unroll
                for (int kk = 0; kk < KS; kk++)
                    mma::template rs64<0>(accU, sf[kk],
                                          fqla_desc_kmajor(st + cfg::oK + (kk >> 2) * TILE) +
                                              (kk & 3) * FQLA_DESC_K16_KMAJOR,
                                          kk > 0);
                fqla_wg_commit();
            }
            /* publish S^T (bf16) once the output warpgroup is done with buffer b */
            fqla_mbar_wait(&ofree[b], bph ^ 1);
            {
                unsigned char *sb = sm + cfg::oSb + b * cfg::KB * TILE;
#pragma unroll
                for (int kk = 0; kk < KS; kk++) stsm_kblock(sb + (kk >> 2) * TILE, kk, sf[kk], warp, lane);
                fqla_fence_async_smem();
                __syncwarp();
                if (lane == 0) fqla_mbar_arrive(&sready[b]);
            }
            fqla_wg_wait<0>();
            fqla_reg_fence(accU);
            fqla_reg_fence(accVd);
            {   /* Vd^T += (-U^T diag(u)) Ag^T */
                uint32_t wn[4][4];
#pragma unroll
                for (int kk = 0; kk < 4; kk++)
#pragma unroll
                    for (int r = 0; r < 4; r++) {
                        const int t0 = 16 * kk + 8 * (r >> 1) + 2 * tq;
                        wn[kk][r] = io::pack(-ud[t0].x * accU[8 * kk + 2 * r], -ud[t0 + 1].x * accU[8 * kk + 2 * r + 1]);
                    }
                fqla_reg_fence_u(wn);
                fqla_wg_fence();
#pragma unroll
                for (int kk = 0; kk < 4; kk++)
                    mma::template rs64<0>(accVd, wn[kk], dAg + kk * FQLA_DESC_K16_KMAJOR, 1);
                fqla_wg_commit();
            }
            {
                const float eC = __expf(gC);
#pragma unroll
                for (int i = 0; i < NS; i++) S[i] *= eC;
            }
            fqla_wg_wait<0>();
            fqla_reg_fence(accVd);
            uint32_t vd[4][4], vp[4][4];
#pragma unroll
            for (int kk = 0; kk < 4; kk++)
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    const float a0 = accVd[8 * kk + 2 * r], a1 = accVd[8 * kk + 2 * r + 1];
                    const int t0 = 16 * kk + 8 * (r >> 1) + 2 * tq;
                    vd[kk][r] = io::pack(a0, a1);
                    vp[kk][r] = io::pack(ud[t0].y * a0, ud[t0 + 1].y * a1);
                }
            fqla_reg_fence(S);
            fqla_reg_fence_u(vp);
            fqla_wg_fence();
            {   /* S^T += Vp^T K (K tile [t][k]: B MN-major) */
                const uint64_t dKt = fqla_desc_mnmajor(st + cfg::oK, TILE);
#pragma unroll
                for (int kk = 0; kk < 4; kk++) {
                    if constexpr (KD == 128)
                        mma::template rs128<1>(S, vp[kk], dKt + kk * FQLA_DESC_K16_MNMAJOR, 1);
                    else
                        mma::template rs64<1>(S, vp[kk], dKt + kk * FQLA_DESC_K16_MNMAJOR, 1);
                }
                fqla_wg_commit();
            }
            {   /* publish Vd^T while the state update runs */
                unsigned char *vb = sm + cfg::oVd + b * TILE;
#pragma unroll
                for (int kk = 0; kk < 4; kk++) stsm_kblock(vb, kk, vd[kk], warp, lane);
                fqla_fence_async_smem();
                __syncwarp();
                if (lane == 0) fqla_mbar_arrive(&vready[b]);
            }
            fqla_wg_wait<0>();
            fqla_reg_fence(S);
            __syncwarp();
            if (lane == 0) fqla_mbar_arrive(&empty[s]);
        }
        if (p.ht) {
#pragma unroll
            for (int i = 0; i < NS; i++) {
                const int vv = v0 + 16 * warp + g + 8 * ((i >> 1) & 1);
                const int kk = 8 * (i >> 2) + 2 * tq + (i & 1);
                const int64_t off = n * p.ht_sn + hv * p.ht_sh +
                                    (p.v_first ? (int64_t)vv * p.ht_s2 + kk : (int64_t)kk * p.ht_s2 + vv);
                if (p.ht_bf16) ((__nv_bfloat16 *)p.ht)[off] = __float2bfloat16_rn(S[i]);
                else ((float *)p.ht)[off] = S[i];
            }
        }
        return;
    }

    /* ---------------- output warpgroup ---------------- */
    T *ob = (T *)p.o + batch * p.o_sb + hv * p.o_sh + v0;
    const int i0 = 16 * warp + g; /* this thread's token rows i0, i0 + 8 */
    for (int64_t c = 0; c < nch; c++) {
        const int s = (int)(c % cfg::STAGES), b = (int)(c & 1);
        const uint32_t ph = (uint32_t)(c / cfg::STAGES) & 1, bph = (uint32_t)(c >> 1) & 1;
        unsigned char *st = sm + s * cfg::stage;
        fqla_mbar_wait(&full[s], ph);
        fqla_mbar_wait(&ready[s], ph);
        const int nvalid = (int)min((int64_t)C, len - c * C);
        if (nvalid < C) fqla_named_sync(1, 256); /* the chain warpgroup zeroed the rows past the end */
        const float *gm = reinterpret_cast<const float *>(st + cfg::oGam);
        const float *rq = reinterpret_cast<const float *>(st + cfg::oRq);
        const float *rk = reinterpret_cast<const float *>(st + cfg::oRk);
        const float *fo = reinterpret_cast<const float *>(st + cfg::oFac + 512);

        float accS[32], accO[32];
        fqla_wg_fence();
#pragma unroll
        for (int kk = 0; kk < KS; kk++) /* Q K^T */
            mma::template ss64<0, 0>(accS,
                                     fqla_desc_kmajor(st + cfg::oQ + (kk >> 2) * TILE) + (kk & 3) * FQLA_DESC_K16_KMAJOR,
                                     fqla_desc_kmajor(st + cfg::oK + (kk >> 2) * TILE) + (kk & 3) * FQLA_DESC_K16_KMAJOR,
                                     kk > 0);
        fqla_wg_commit();
        fqla_mbar_wait(&sready[b], bph);
        fqla_wg_fence();
        {   /* Q S (S^T published as [v][k]: B K-major) */
            unsigned char *sb = sm + cfg::oSb + b * cfg::KB * TILE;
#pragma unroll
            for (int kk = 0; kk < KS; kk++)
                mma::template ss64<0, 0>(accO,
                                         fqla_desc_kmajor(st + cfg::oQ + (kk >> 2) * TILE) +
                                             (kk & 3) * FQLA_DESC_K16_KMAJOR,
                                         fqla_desc_kmajor(sb + (kk >> 2) * TILE) + (kk & 3) * FQLA_DESC_K16_KMAJOR,
                                         kk > 0);
            fqla_wg_commit();
        }
        /* P = scale Gamma (.) tril(Q K^T) with the l2norm factors, as A fragments */
        fqla_wg_wait<1>();
        fqla_reg_fence(accS);
        uint32_t pf[4][4];
        {
            const float g0 = gm[i0], g1 = gm[i0 + 8];
            float a0 = p.scale, a1 = p.scale;
            if (p.l2norm) {
                a0 *= rq[i0];
                a1 *= rq[i0 + 8];
            }
#pragma unroll
            for (int kk = 0; kk < 4; kk++)
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    const int e = 8 * kk + 2 * r;
                    const int row = (r & 1) ? i0 + 8 : i0;
                    const float gi = (r & 1) ? g1 : g0, ai = (r & 1) ? a1 : a0;
                    const int j = 16 * kk + 8 * (r >> 1) + 2 * tq;
                    const float2 gj = *reinterpret_cast<const float2 *>(gm + j);
                    float2 kj = make_float2(1.f, 1.f);
                    if (p.l2norm) kj = *reinterpret_cast<const float2 *>(rk + j);
                    const float x0 = j <= row ? ai * kj.x * __expf(gi - gj.x) * accS[e] : 0.f;
                    const float x1 = j + 1 <= row ? ai * kj.y * __expf(gi - gj.y) * accS[e + 1] : 0.f;
                    pf[kk][r] = io::pack(x0, x1);
                }
        }
        fqla_wg_wait<0>();
        fqla_reg_fence(accO);
        {   /* rows of Q S times o_t */
            const float f0 = fo[i0], f1 = fo[i0 + 8];
#pragma unroll
            for (int e = 0; e < 32; e++) accO[e] *= ((e >> 1) & 1) ? f1 : f0;
        }
        /* the last read of stage s by this warpgroup: release it now, before
         * waiting for the chain's Vd, so that the ring refills early */
        __syncwarp();
        if (lane == 0) fqla_mbar_arrive(&empty[s]);
        fqla_mbar_wait(&vready[b], bph);
        fqla_reg_fence(accO);
        fqla_reg_fence_u(pf);
        fqla_wg_fence();
        {   /* O += P Vd (Vd^T published as [v][t]: B K-major) */
            const uint64_t dVd = fqla_desc_kmajor(sm + cfg::oVd + b * TILE);
#pragma unroll
            for (int kk = 0; kk < 4; kk++) mma::template rs64<0>(accO, pf[kk], dVd + kk * FQLA_DESC_K16_KMAJOR, 1);
            fqla_wg_commit();
        }
        fqla_wg_wait<0>();
        fqla_reg_fence(accO);
        __syncwarp();
        if (lane == 0) fqla_mbar_arrive(&ofree[b]);
        /* O (token rows) -> staging -> o */
        {
            T *dst = reinterpret_cast<T *>(sm + cfg::oO) + b * C * cfg::LDO;
            const int q = lane >> 3;
#pragma unroll
            for (int j = 0; j < 8; j += 2) {
                const uint32_t addr =
                    fqla_h_smem(dst + (16 * warp + 8 * (q & 1) + (lane & 7)) * cfg::LDO + 8 * (j + (q >> 1)));
                asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr),
                             "r"(io::pack(accO[4 * j], accO[4 * j + 1])), "r"(io::pack(accO[4 * j + 2], accO[4 * j + 3])),
                             "r"(io::pack(accO[4 * j + 4], accO[4 * j + 5])),
                             "r"(io::pack(accO[4 * j + 6], accO[4 * j + 7]))
                             : "memory");
            }
            fqla_named_sync(2, 128);
            const int64_t t0 = start + c * C;
#pragma unroll
            for (int it = 0; it < 4; it++) {
                const int r = (tid >> 3) + 16 * it, cv = tid & 7;
                const uint4 x = *reinterpret_cast<const uint4 *>(dst + r * cfg::LDO + cv * 8);
                if (r < nvalid) *reinterpret_cast<uint4 *>(ob + (t0 + r) * p.o_st + cv * 8) = x;
            }
        }
    }
}

template <typename T, int KD>
cudaError_t launch(const fqla_fwd_params &p, const CUtensorMap *maps, cudaStream_t stream)
{
    typedef wo_cfg<KD> cfg;
    static volatile int configured[64];
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    if (dev < 0 || dev >= 64 || !configured[dev]) {
        err = cudaFuncSetAttribute(fwd_chunk_wo_kernel<T, KD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   (int)cfg::bytes);
        if (err != cudaSuccess) return err;
        if (dev >= 0 && dev < 64) configured[dev] = 1;
    }
    dim3 grid((unsigned)(p.N * p.HV), (unsigned)(p.V / 64));
    fwd_chunk_wo_kernel<T, KD><<<grid, 384, cfg::bytes, stream>>>(p, maps[0], maps[1], maps[2], maps[3]);
    return cudaGetLastError();
}

} // namespace

cudaError_t fqla_fwd_launch_chunk_wo(const fqla_fwd_params &p, int io_bf16, cudaStream_t stream, int *used)
{
    *used = 0;
    if (p.N * p.HV == 0) return cudaSuccess;
    CUtensorMap maps[5];
    if (!fqla_fwd_tma_maps(p, io_bf16, maps)) return cudaSuccess;
    *used = 1;
    if (p.K == 128)
        return io_bf16 ? launch<__nv_bfloat16, 128>(p, maps, stream) : launch<__half, 128>(p, maps, stream);
    return io_bf16 ? launch<__nv_bfloat16, 64>(p, maps, stream) : launch<__half, 64>(p, maps, stream);
}
