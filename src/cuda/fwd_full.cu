/*
 * fwd_full.cu - the forward in one kernel (sm_90a): the chain of
 * fwd_fused.cu with each chunk's preparation (gates, K K^T, the gate-free
 * inverse, Ag) and Pg formed beside it by two helper warpgroups, so that
 * no prepare kernel runs and nothing goes through the workspace
 * (docs/perf.md, session 23: the plan and its budgets).
 *
 * One CTA of 512 threads per (sequence, value head), V = 128:
 *   warpgroups 0 and 1 (64 registers each), the helpers: helper h owns the
 *     chunks c = h (mod 2). For chunk c it loads K(c) into its region
 *     (TMA) and the chunk's g and beta (one warp), forms gamma, K K^T over
 *     the K tile, the inverse in place (fwd_prep_wg.cuh: the prepare
 *     kernel's PAIR half, the same arithmetic), Ag into Ag slot h; then,
 *     once the chain's ring holds chunk c's K and Q, Q K^T, Pg and the
 *     chain's token factors into Pg slot h (fwd_pg.cuh);
 *   warpgroups 2 and 3 (192 registers each): the chain, 64 value columns
 *     each (fwd_chain.cuh, as in fwd_fused.cu), the state S^T in
 *     registers. Warpgroup 2's thread 0 also issues the chain's copies: K
 *     and Q into a two-stage ring (read again ~2 chunks after the helper's
 *     K copy: from L2), V into a three-stage ring.
 * There are no registers for a producer warpgroup: 2 x 64 + 2 x 192 is the
 * SM's 65,536 per 128 threads.
 *
 * Barriers: kqfull / kqempty per K, Q stage (empty: both chain warpgroups
 * and the helper that forms that chunk's Pg), vfull / vempty per V stage,
 * kfull per helper region, agready / agfree per Ag slot, pready / pfree per
 * Pg slot (slot h is chunk c's for c = h mod 2, like the K, Q stage).
 *
 * Covered: K = V = 128, bf16 / fp16, padded batches (rows past T arrive as
 * zeros from TMA, beta 0 there), no CP, no l2norm (fqla_fwd_full_usable).
 * Picked by the tuning hook only (fqla_cuda_fwd_tune_chunk's wg = 3): it
 * is correct (bit-identical to the prepare kernel + fwd_fused.cu path) but
 * measured ~2x slower (docs/perf.md, session 23). ptxas spills ~300 bytes
 * in the helpers' 64-register setmaxnreg region, where the same loop
 * compiled as a 64-register kernel has none and runs 2x faster; and even
 * then the helpers take ~6 k cycles per chunk, about the two kernels'
 * whole cost. The timing-only switches below measure both.
 */
#include "cuda/fwd_chain.cuh"
#include "cuda/fwd_common.cuh"
#include "cuda/fwd_pg.cuh"
#include "cuda/fwd_prep_wg.cuh"
#include "cuda/fwd_prepare_common.cuh"
#include "cuda/fwd_ptx.cuh"
#include "cuda/hopper.cuh"

namespace {

constexpr int C = FQLA_FWD_CHUNK;
constexpr uint32_t TILE = C * 128; /* one [64 rows][64 b16] tile, 128-byte swizzle */

#ifdef FQLA_FULL_CLOCKS
/* Instrumented builds only (nvcc -DFQLA_FULL_CLOCKS): clock64 spans per
 * chunk from the third on, in the first 16 CTAs; thread 0 of each helper:
 * [0] the K wait, [1] gates and K K^T, [2] the diagonal solve, [3] the
 * merges, [4] the Ag slot wait, [5] Ag, [6] the K, Q stage wait, [7] Q K^T,
 * the Pg slot wait and the factors, [8] Pg; [15] counts its chunks. Thread
 * 0 of the first chain warpgroup: [16] the K, Q wait, [17] G2 issue and
 * the previous output's store, [18] the Pg wait, [19] the V and Ag waits,
 * [20] the rest of the chunk; [31] counts its chunks. */
__device__ unsigned long long g_full_clk[32];
#define FL_CLK_START long long fl_t_ = clock64()
#define FL_CLK(i, on)                                                                                   \
    do {                                                                                                \
        const long long t1_ = clock64();                                                                \
        if ((on) && blockIdx.x < 16 && c >= 2) atomicAdd(&g_full_clk[i], (unsigned long long)(t1_ - fl_t_)); \
        fl_t_ = t1_;                                                                                    \
    } while (0)
#define FL_COUNT(i, on)                                                                                 \
    do {                                                                                                \
        if ((on) && blockIdx.x < 16 && c >= 2) atomicAdd(&g_full_clk[i], 1ull);                        \
    } while (0)
#else
#define FL_CLK_START
#define FL_CLK(i, on)
#define FL_COUNT(i, on)
#endif
/* Timing only (wrong results): FQLA_FULL_HELPERS_ONLY = 1 runs the helpers
 * alone, the chain warpgroups exit at once and the helpers skip every wait
 * on the chain (Ag and Pg slots, the K, Q stage), for the helpers' own
 * speed in the same compiled form. */
#ifndef FQLA_FULL_HELPERS_ONLY
#define FQLA_FULL_HELPERS_ONLY 0
#endif
/* the merges' tf32 split (3: 3xTF32, the default; 1: plain tf32, timing
 * experiments only) */
#ifndef FQLA_FULL_PREC
#define FQLA_FULL_PREC 3
#endif

struct fl_cfg {
    static constexpr int THREADS = 512;
    static constexpr int HELPER_REGS = 64, CHAIN_REGS = 192;
    /* K, Q ring: per 64-wide k block the K tile then the Q tile */
    static constexpr int KQS = 2;
    static constexpr uint32_t KQ = 2 * TILE;
    static constexpr uint32_t kq_stage = 2 * KQ;
    static constexpr uint32_t oKQ = 0;
    /* V ring: the two chain warpgroups' 64-column tiles */
    static constexpr int VS = 3;
    static constexpr uint32_t v_stage = 2 * TILE;
    static constexpr uint32_t oV = oKQ + KQS * kq_stage;
    /* helper regions: the K tile (16 KB), then KK and X over it (fp32
     * [64][LDF]) */
    static constexpr uint32_t region = C * LDF * 4;
    static constexpr uint32_t oR = oV + VS * v_stage;
    /* per helper: gamma, gamma log2(e), beta */
    static constexpr uint32_t oGates = oR + 2 * region;
    static constexpr uint32_t gates = 1024;
    /* Ag slots (the chain's B operand of G1 and G4) */
    static constexpr uint32_t oAg = oGates + 2 * gates;
    /* Pg slots: the tile, then (u_t, d_t)[64], o_t[64], gamma_C */
    static constexpr uint32_t slot = TILE + 1024, sFac = TILE;
    static constexpr uint32_t oPg = oAg + 2 * TILE;
    static constexpr uint32_t oO = oPg + 2 * slot; /* [2 warpgroups][2] output tiles */
    static constexpr uint32_t oBar = oO + 4 * TILE;
    static constexpr int NBAR = 2 * KQS + 2 * VS + 2 + 4 + 4;
    static constexpr uint32_t bytes = oBar + NBAR * 8 + 1024;
    static_assert(region % 1024 == 0 && oR % 1024 == 0 && oAg % 1024 == 0 && oPg % 1024 == 0 && slot % 1024 == 0,
                  "tiles 1024-aligned (128-byte swizzle)");
    static_assert(bytes <= 232448, "shared memory of one CTA");
};

/* the CTA's shared memory, 1024-aligned (TMA's 128-byte swizzle), behind
 * an opaque copy of the base: each role forms its own pointers */
__device__ __forceinline__ unsigned char *fl_smem(unsigned char *raw)
{
    unsigned char *b = raw;
    asm volatile("" : "+l"(b));
    return b + ((1024u - (fqla_h_smem(b) & 1023u)) & 1023u);
}

template <typename T, bool HELPER>
__device__ __forceinline__ void fl_role(const fqla_fwd_params &p, const CUtensorMap &tmQ, const CUtensorMap &tmK,
                                        const CUtensorMap &tmV, const CUtensorMap &tmO, unsigned char *smem_raw, int wg);

/* FQLA_FULL_HELPERS_ONLY == 2 (timing only): the helpers alone in a CTA
 * of 256 threads compiled for 64 registers per thread (no setmaxnreg), for
 * the same loop's speed where ptxas allocates it as a whole kernel */
#if FQLA_FULL_HELPERS_ONLY == 2
#define FL_LAUNCH_THREADS 256
#define FL_LAUNCH_MIN 4
#else
#define FL_LAUNCH_THREADS fl_cfg::THREADS
#define FL_LAUNCH_MIN 1
#endif
template <typename T>
__global__ void __launch_bounds__(FL_LAUNCH_THREADS, FL_LAUNCH_MIN)
    fwd_full_kernel(const __grid_constant__ fqla_fwd_params p, const __grid_constant__ CUtensorMap tmQ,
                    const __grid_constant__ CUtensorMap tmK, const __grid_constant__ CUtensorMap tmV,
                    const __grid_constant__ CUtensorMap tmO)
{
    typedef fl_cfg cfg;
    extern __shared__ unsigned char smem_raw[];
    /* What each role needs is formed again after its setmaxnreg (fl_smem,
     * fl_span with an opaque block index): values carried from here into
     * the helpers' 64-register region were spilled there, hundreds of
     * bytes, where the same loop compiled alone needs no spill. */
    const int wg = threadIdx.x >> 7;
    {
        unsigned char *sm = fl_smem(smem_raw);
        uint64_t *bar = reinterpret_cast<uint64_t *>(sm + cfg::oBar);
        if (threadIdx.x == 0) {
            fqla_tma_prefetch(&tmQ);
            fqla_tma_prefetch(&tmK);
            fqla_tma_prefetch(&tmV);
            fqla_tma_prefetch(&tmO);
            for (int s = 0; s < cfg::KQS; s++) {
                fqla_mbar_init(&bar[s], 1);                /* kqfull */
                fqla_mbar_init(&bar[cfg::KQS + s], 3 * 128); /* kqempty: the chain's and one helper's threads */
            }
            for (int s = 0; s < cfg::VS; s++) {
                fqla_mbar_init(&bar[2 * cfg::KQS + s], 1);                  /* vfull */
                fqla_mbar_init(&bar[2 * cfg::KQS + cfg::VS + s], 2 * 128);  /* vempty */
            }
            uint64_t *kf = bar + 2 * cfg::KQS + 2 * cfg::VS;
            for (int h = 0; h < 2; h++) {
                fqla_mbar_init(&kf[h], 1);           /* kfull */
                fqla_mbar_init(&kf[2 + h], 128);     /* agready */
                fqla_mbar_init(&kf[4 + h], 2 * 128); /* agfree */
                fqla_mbar_init(&kf[6 + h], 128);     /* pready */
                fqla_mbar_init(&kf[8 + h], 2 * 128); /* pfree */
            }
            fqla_mbar_init_fence();
        }
        /* the Ag slots' blocks above the diagonal, which no helper writes */
        for (int i = threadIdx.x; i < (int)(2 * TILE / 16); i += blockDim.x)
            reinterpret_cast<uint4 *>(sm + cfg::oAg)[i] = make_uint4(0, 0, 0, 0);
        fqla_fence_async_smem();
        __syncthreads();
    }
    if (wg < 2) {
        if (FQLA_FULL_HELPERS_ONLY != 2) fqla_setmaxnreg_dec<cfg::HELPER_REGS>();
        fl_role<T, true>(p, tmQ, tmK, tmV, tmO, smem_raw, wg);
    } else if (FQLA_FULL_HELPERS_ONLY != 2) {
        fqla_setmaxnreg_inc<cfg::CHAIN_REGS>();
        fl_role<T, false>(p, tmQ, tmK, tmV, tmO, smem_raw, wg);
    }
}

/* One role of fwd_full_kernel's CTA: HELPER, warpgroup wg (0, 1) a helper;
 * else a chain warpgroup (wg 2, 3). */
template <typename T, bool HELPER>
__device__ __forceinline__ void fl_role(const fqla_fwd_params &p, const CUtensorMap &tmQ, const CUtensorMap &tmK,
                                        const CUtensorMap &tmV, const CUtensorMap &tmO, unsigned char *smem_raw, int wg)
{
    typedef fl_cfg cfg;
    unsigned char *sm = fl_smem(smem_raw);
    uint64_t *kqfull = reinterpret_cast<uint64_t *>(sm + cfg::oBar), *kqempty = kqfull + cfg::KQS;
    uint64_t *vfull = kqempty + cfg::KQS, *vempty = vfull + cfg::VS, *kfull = vempty + cfg::VS;
    uint64_t *agready = kfull + 2, *agfree = agready + 2, *pready = agfree + 2, *pfree = pready + 2;
    const int tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31;
    unsigned bx = blockIdx.x;
    asm volatile("" : "+r"(bx));
    const int64_t ns = bx / p.HV;
    const int hv = (int)(bx % p.HV), hq = hv / p.group;
    int64_t n, batch, start64, len64, slot0;
    bool last;
    if (!fqla_fwd_span(p, ns, n, batch, start64, len64, slot0, last)) return;
    const int start = (int)start64, len = (int)len64, bc = (int)batch;
    const int nch = (len + C - 1) / C;

    if constexpr (HELPER) {
        /* ---- helper h: chunks h, h + 2, ... ---- */
        const int h = wg, bar = 4 + h; /* named barriers 1-3: the chain's */
        /* The helper's shared-memory pointers are formed again in each
         * phase from an opaque copy of the base: kept live across the loop
         * (seven 64-bit pointers) they were spilled, and 64 registers are
         * what the preparation itself needs (the PAIR half's budget). */
        auto base = [&]() {
            unsigned char *b = sm;
            asm volatile("" : "+l"(b));
            return b;
        };
        auto region = [&](unsigned char *b) { return b + cfg::oR + h * cfg::region; };
        auto gates = [&](unsigned char *b) { return reinterpret_cast<float *>(b + cfg::oGates + h * cfg::gates); };
        /* chunk c's K tile into the region (thread 0) */
        auto issue = [&](int c) {
            if (tid == 0) {
                unsigned char *R = region(base());
                fqla_mbar_arrive_tx(&kfull[h], C * 128 * (uint32_t)sizeof(T));
                for (int kb = 0; kb < 2; kb++)
                    fqla_tma_load_4d(R + kb * TILE, &tmK, &kfull[h], 64 * kb, hq, start + c * C, bc);
            }
        };
        if (h < nch) issue(h);
#pragma unroll 1
        for (int c = h, it = 0; c < nch; c += 2, it++) {
            FL_CLK_START;
            const bool on = tid == 0;
            const int nvalid = min(C, len - c * C);
            const uint32_t ph = (uint32_t)it & 1;
            /* every warp's reads of the previous chunk's gates (its Pg) are
             * done before warp 0 writes this chunk's (racecheck) */
            if (it > 0) fqla_named_sync(bar, 128);
            if (warp == 0) {
                /* the chunk's g and beta, loaded here (their latency runs
                 * beside the K copy's), then gamma */
                float gv[2], bv[2];
                load_gate_beta(p, batch, start + c * C, nvalid, hv, lane, gv, bv);
                chunk_gates(p, hv, nvalid, lane, gv, bv);
                float *gam = gates(base());
                gam[lane] = gv[0];
                gam[lane + 32] = gv[1];
                gam[C + lane] = gv[0] * 1.4426950408889634f; /* gamma log2(e), for Ag */
                gam[C + lane + 32] = gv[1] * 1.4426950408889634f;
                gam[2 * C + lane] = bv[0]; /* beta */
                gam[2 * C + lane + 32] = bv[1];
            }
            fqla_mbar_wait(&kfull[h], ph);
            FL_CLK(0, on);
            fqla_named_sync(bar, 128); /* the gates */
            /* KK = K K^T over the K tile, then X = (I + M)^-1 in place */
            {
                unsigned char *R = region(base());
                kk_wgmma<T, true>(reinterpret_cast<const T *>(R), reinterpret_cast<float *>(R), warp, lane, bar);
            }
            fqla_named_sync(bar, 128);
            FL_CLK(1, on);
            {
                const int hj = 2 * warp + (lane >> 4); /* warps 0, 1: blocks 0, 1 and 2, 3 */
                unsigned char *b = base();
                float *KX = reinterpret_cast<float *>(region(b));
                if (hj < 4) diag_block<true>(KX, KX, gates(b) + 2 * C, 16 * hj, lane & 15);
            }
            fqla_named_sync(bar, 128);
            FL_CLK(2, on);
            {
                unsigned char *b = base();
                float *KX = reinterpret_cast<float *>(region(b));
                merges<FQLA_FULL_PREC>(KX, KX, gates(b) + 2 * C, warp, lane, true,
                                       [&](int) { fqla_named_sync(bar, 128); });
            }
            fqla_named_sync(bar, 128);
            FL_CLK(3, on);

            /* Ag into slot h, once the chain is done with chunk c - 2's:
             * warp w its rows' 16x32 tiles at or left of the diagonal */
            if (!FQLA_FULL_HELPERS_ONLY) fqla_mbar_wait(&agfree[h], ph ^ 1);
            FL_CLK(4, on);
#pragma unroll
            for (int t2 = 0; t2 < 2; t2++) {
                const int n0 = 32 * t2;
                if (n0 >= fqla_fwd_ag_width(warp)) break; /* warp-uniform */
                unsigned char *b = base();
                const float *gam = gates(b);
                uint32_t u[4][2];
                ag_tile_at<T>(u, reinterpret_cast<const float *>(region(b)), gam + C, gam + 2 * C, warp, n0, lane);
                unsigned char *ag = b + cfg::oAg + h * TILE;
                const int mi = lane >> 3, row = 16 * warp + 8 * (mi & 1) + (lane & 7);
#pragma unroll
                for (int j2 = 0; j2 < 2; j2++) {
                    const int ch = n0 / 8 + 2 * j2 + (mi >> 1);
                    fqla_stsm_x4(ag + row * 128 + 16 * (ch ^ (row & 7)), u[2 * j2][0], u[2 * j2][1], u[2 * j2 + 1][0],
                                 u[2 * j2 + 1][1]);
                }
            }
            fqla_fence_async_smem(); /* Ag: read by the chain's wgmma */
            fqla_mbar_arrive(&agready[h]);
            fqla_named_sync(bar, 128); /* every warp's reads of X are done: the region is free */
            if (c + 2 < nch) issue(c + 2);
            FL_CLK(5, on);

            /* Pg(c) from the chain's K, Q stage h, into Pg slot h once the
             * chain is done with chunk c - 2's; the token factors first, so
             * that no accumulator is live across the waits */
            if (!FQLA_FULL_HELPERS_ONLY) fqla_mbar_wait(&kqfull[h], ph);
            FL_CLK(6, on);
            if (!FQLA_FULL_HELPERS_ONLY) fqla_mbar_wait(&pfree[h], ph ^ 1);
            if (warp == 0) {
                unsigned char *sl = base() + cfg::oPg + h * cfg::slot;
                const float *gam = gates(base());
                float2 *ud = reinterpret_cast<float2 *>(sl + cfg::sFac);
                float *fo = reinterpret_cast<float *>(sl + cfg::sFac + 512);
                const float gC = gam[C - 1];
#pragma unroll
                for (int hh = 0; hh < 2; hh++) fqla_chain::token_factors(ud, fo, gam, lane + 32 * hh, gC, 1.f, 1.f, p.scale);
                if (lane == 0) reinterpret_cast<float *>(sl + cfg::sFac + 768)[0] = gC;
            }
            /* in two halves of 32 columns: 16 accumulators live, not 32 */
#pragma unroll 1
            for (int n0 = 0; n0 < C; n0 += 32) {
                unsigned char *b = base();
                const unsigned char *kq = b + cfg::oKQ + h * cfg::kq_stage;
                float acc[16];
                fqla_wg_fence();
                fqla_pg::qk_issue_half<T, 128>(acc, kq, kq + TILE, cfg::KQ, n0);
                fqla_wg_commit();
                fqla_wg_wait<0>();
                fqla_reg_fence(acc);
                fqla_pg::store_half<T>(b + cfg::oPg + h * cfg::slot, acc, gates(b), nvalid, p.scale, warp, lane, n0);
            }
            FL_CLK(7, on);
            fqla_mbar_arrive(&kqempty[h]); /* this thread's reads of the stage are done */
            fqla_fence_async_smem();       /* Pg: read by the chain's wgmma */
            fqla_mbar_arrive(&pready[h]);
            FL_CLK(8, on);
            FL_COUNT(15, on);
        }
        return;
    }

    /* ---- the chain ---- */
    if (FQLA_FULL_HELPERS_ONLY) return;
    const int cw = wg - 2;
    const int g = lane >> 2, tq = lane & 3;
    const int v0 = 64 * cw;
    constexpr int KD = 128, NS = KD / 2, KS = KD / 16;
    const int vr = v0 + 16 * warp + g, kc = 2 * tq;
    /* warpgroup 2's thread 0: chunk c's K and Q, or V, into their rings */
    const bool issuer = cw == 0 && tid == 0;
    auto issue_kq = [&](int c) {
        const int s = c % cfg::KQS;
        unsigned char *st = sm + cfg::oKQ + s * cfg::kq_stage;
        fqla_mbar_arrive_tx(&kqfull[s], 2 * C * 128 * (uint32_t)sizeof(T));
#pragma unroll
        for (int kb = 0; kb < 2; kb++) {
            fqla_tma_load_4d(st + kb * cfg::KQ, &tmK, &kqfull[s], 64 * kb, hq, start + c * C, bc);
            fqla_tma_load_4d(st + kb * cfg::KQ + TILE, &tmQ, &kqfull[s], 64 * kb, hq, start + c * C, bc);
        }
    };
    auto issue_v = [&](int c) {
        const int s = c % cfg::VS;
        unsigned char *st = sm + cfg::oV + s * cfg::v_stage;
        fqla_mbar_arrive_tx(&vfull[s], 2 * C * 64 * (uint32_t)sizeof(T));
#pragma unroll
        for (int w = 0; w < 2; w++) fqla_tma_load_4d(st + w * TILE, &tmV, &vfull[s], 64 * w, hv, start + c * C, bc);
    };
    if (issuer) {
        for (int c = 0; c < min(nch, cfg::KQS); c++) issue_kq(c);
        for (int c = 0; c < min(nch, cfg::VS); c++) issue_v(c);
    }
    float S[NS];
    fqla_chain::load_state(p, S, ns, hv, vr, kc);

    T *ob = (T *)p.o + batch * p.o_sb + hv * p.o_sh + v0;
    unsigned char *Obuf = sm + cfg::oO + cw * 2 * TILE;
    auto store_out = [&](int cc) {
        fqla_chain::store_out(p, &tmO, Obuf, ob, cc, start, len, v0, hv, batch, cw, tid);
    };

    for (int c = 0; c < nch; c++) {
        FL_CLK_START;
        const bool on = tid == 0 && cw == 0;
        const int s = c % cfg::KQS, sv = c % cfg::VS, a = c & 1;
        const uint32_t ph = (uint32_t)(c / cfg::KQS) & 1, vph = (uint32_t)(c / cfg::VS) & 1, aph = (uint32_t)(c >> 1) & 1;
        unsigned char *kq = sm + cfg::oKQ + s * cfg::kq_stage, *vt = sm + cfg::oV + sv * cfg::v_stage + cw * TILE;
        unsigned char *sl = sm + cfg::oPg + a * cfg::slot;
        fqla_mbar_wait(&kqfull[s], ph);
        FL_CLK(16, on);

        uint32_t sf[KS][4];
        fqla_chain::pack_state<T>(sf, S);
        float accVd[32], accUQ[64]; /* accUQ[0..31] = U^T, [32..63] = Qs^T */
        const uint64_t dAg = fqla_desc_kmajor(sm + cfg::oAg + a * TILE);
        fqla_reg_fence_u(sf);
        fqla_wg_fence();
        fqla_chain::g2_issue<T, KS, 128>(accUQ, sf, kq, cfg::KQ); /* G2 */
        fqla_wg_commit();
        store_out(c - 1); /* the previous chunk's rows, while G2 runs */
        FL_CLK(17, on);
        fqla_mbar_wait(&pready[a], aph); /* Pg(c) and the token factors */
        FL_CLK(18, on);
        fqla_mbar_wait(&vfull[sv], vph);
        fqla_mbar_wait(&agready[a], aph);
        FL_CLK(19, on);
        const float2 *ud = reinterpret_cast<const float2 *>(sl + cfg::sFac);
        const float *fos = reinterpret_cast<const float *>(sl + cfg::sFac + 512);
        const float gC = reinterpret_cast<const float *>(sl + cfg::sFac + 768)[0];
        fqla_wg_wait<0>();
        fqla_reg_fence(accUQ);
        {   /* G1: Vd^T = V^T Ag^T, then G4: Vd^T += (-U^T diag(u)) Ag^T */
            uint32_t wn[4][4];
            fqla_chain::g4_operand<T>(wn, accUQ, ud, tq);
            fqla_reg_fence_u(wn);
            fqla_wg_fence();
            fqla_chain::g1_issue<T>(accVd, fqla_desc_mnmajor(vt, TILE), dAg);
            fqla_chain::g4_issue<T>(accVd, wn, dAg);
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
        fqla_chain::g56_operands<T>(vd, vp, accVd, ud, tq);
        fqla_reg_fence(S);
        fqla_reg_fence_u(vd);
        fqla_reg_fence_u(vp);
        fqla_wg_fence();
        fqla_chain::g5_issue<T, KD>(S, vp, fqla_desc_mnmajor(kq, cfg::KQ)); /* G5 */
        fqla_wg_commit();
        float accP[32];
        fqla_chain::g6_issue<T>(accP, vd, fqla_desc_kmajor(sl)); /* G6 */
        fqla_wg_commit();
        float fo[16];
        fqla_chain::load_out_factors(fo, fos, tq);
        fqla_wg_wait<0>();
        fqla_reg_fence(S);
        fqla_reg_fence(accUQ);
        fqla_reg_fence(accP);
        fqla_mbar_arrive(&kqempty[s]); /* the stages, */
        fqla_mbar_arrive(&vempty[sv]);
        fqla_mbar_arrive(&agfree[a]);  /* Ag and */
        fqla_mbar_arrive(&pfree[a]);   /* the Pg slot are no longer read by this thread */
        if (issuer) {
            if (c + cfg::KQS < nch) {
                fqla_mbar_wait(&kqempty[s], ph);
                issue_kq(c + cfg::KQS);
            }
            if (c + cfg::VS < nch) {
                fqla_mbar_wait(&vempty[sv], vph);
                issue_v(c + cfg::VS);
            }
        }

        /* O^T = Qs^T diag(o) + P^T -> staging tile c & 1 (chunk c - 2's
         * store has read it: store_out(c - 1) waited for that) */
        fqla_chain::output_tile<T>(Obuf + (c & 1) * TILE, fo, accUQ + 32, accP, warp, lane);
        FL_CLK(20, on);
        FL_COUNT(31, on);
    }
    if (nch > 0) store_out(nch - 1);
    if (tid == 0) fqla_bulk_wait<0>(); /* the CTA's last stores are done before it exits */
    if (p.ht) fqla_chain::store_state(p, S, n, hv, vr, kc);
}

#ifdef FQLA_FULL_CLOCKS
} // namespace
/* Instrumented builds: the clock sums since the last call (then reset). */
extern "C" int fqla_cuda_debug_full_clocks(unsigned long long out[32])
{
    return fqla_debug_clocks_take(g_full_clk, out, 32);
}
namespace {
#endif

template <typename T>
cudaError_t launch(const fqla_fwd_params &p, const CUtensorMap *maps, cudaStream_t stream)
{
    typedef fl_cfg cfg;
    static volatile int configured[64];
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    if (dev < 0 || dev >= 64 || !configured[dev]) {
        err = cudaFuncSetAttribute(fwd_full_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)cfg::bytes);
        if (err != cudaSuccess) return err;
        if (dev >= 0 && dev < 64) configured[dev] = 1;
    }
    fwd_full_kernel<T><<<(unsigned)(p.N * p.HV), FL_LAUNCH_THREADS, cfg::bytes, stream>>>(p, maps[0], maps[1], maps[2],
                                                                                     maps[4]);
    return cudaGetLastError();
}

} // namespace

int fqla_fwd_full_usable(const fqla_fwd_params &p)
{
    return p.K == 128 && p.V == 128 && !p.varlen && !p.cp_mode && !p.l2norm && p.T <= 0x7fffffffLL - 64 &&
           fqla_fwd_wg_usable(p);
}

cudaError_t fqla_fwd_launch_full(const fqla_fwd_params &k, int io_bf16, cudaStream_t stream, int *used)
{
    *used = 0;
    fqla_fwd_params p = k;
    p.Pg = NULL;
    if (!fqla_fwd_full_usable(p)) return cudaSuccess;
    CUtensorMap maps[FQLA_FWD_MAPS];
    fqla_fwd_ag_maps ag;
    if (!fqla_fwd_tma_maps(p, io_bf16, maps, &ag)) return cudaSuccess; /* the caller runs another path */
    *used = 1;
    if (p.N * p.HV == 0) return cudaSuccess;
    return io_bf16 ? launch<__nv_bfloat16>(p, maps, stream) : launch<__half>(p, maps, stream);
}
