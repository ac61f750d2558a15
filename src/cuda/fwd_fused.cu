/*
 * fwd_fused.cu - the forward's sequential kernel with Pg formed in the CTA
 * (sm_90a): the chunk kernel's chain (fwd_chunk_wg.cu) beside a warpgroup
 * that forms each chunk's Pg = scale Gamma (.) tril(Q K^T) from the Q and K
 * tiles the chain loads anyway. The prepare kernel runs before it without
 * Q (fwd_prepare.cu, WQ = false): gamma and Ag only. Per (chunk, value head)
 * the two launches move q, k, v, Ag (and K twice, Ag twice) instead of the
 * two-kernel path's q and k twice plus Ag and Pg twice (docs/perf.md,
 * session 9).
 *
 * One CTA of 128 (NWG + 2) threads per (sequence, value head, 64 NWG value
 * columns), NWG = 1 or 2 chain warpgroups:
 *   warpgroup 0 (24 registers): one thread issues the copies of each
 *     chunk's K, Q, V and Ag tiles and gamma into a three-stage ring;
 *   warpgroups 1 .. NWG (192 registers): the chain, 64 value columns each,
 *     the state S^T in registers, as in fwd_chunk_wg.cu (G1 .. G6 there);
 *     here G1 is issued after G2's wait, with G4, which keeps these
 *     warpgroups within 192 registers;
 *   warpgroup NWG + 1 (104 registers): per chunk, a chunk or more ahead of
 *     the chain, into a two-slot ring: QK = Q K^T (SS wgmma on the stage's
 *     tiles), Pg from the accumulators (stmatrix), and the chain's token
 *     factors from gamma.
 * NWG = 2 where sequences x heads fill the GPU with one CTA per 128 value
 * columns; NWG = 1 (two CTAs per 128 columns, each forming the same Pg)
 * where they do not, in place of the two-kernel path's V split, whose
 * prepare kernel with Q forms Pg and moves it through HBM (pick_fused in
 * fwd.cu, docs/perf.md, session 12).
 *
 * Barriers: full / empty for the stages (empty also waits for the Pg
 * warpgroup's reads), pready / pfree for the Pg slots, and aim per slot:
 * the Pg warpgroup issues chunk c's Q K^T once every chain warpgroup has
 * issued chunk c - 2's G6, so that it runs in the chain's output stretch,
 * not beside its G2 (FU_PG_AIM; a timing choice, not a data dependence).
 *
 * A full fused kernel (the inverse in this warpgroup too, no prepare
 * kernel) measured 3.7x slower per chunk in its preparation than in its
 * chain (docs/perf.md, session 9; a61b9b8).
 *
 * At K = 256 (fu_cfg::BIG): one chain warpgroup per 64 value columns at
 * 240 registers. It writes S^T's io-dtype copy to shared memory at each
 * chunk's start; G2 (U^T alone) and Qs^T read it there as SS products.
 * Qs^T is formed beside G5, scaled by the output factors in G6's
 * accumulators, and G6 adds P^T to it (docs/perf.md, session 26).
 *
 * Covered: K = 64, 128 or 256 (NWG = 1), V a multiple of 64 NWG, bf16 / fp16
 * (fqla_fwd_fused_usable); everything else runs the two kernels. With the
 * in-kernel l2norm (L2N) the prepare kernel writes rk (and scales K K^T by
 * it), the Pg warpgroup forms rq from the stage's Q tile while its Q K^T
 * runs, and both enter Pg and the chain's token factors; the chain itself
 * is unchanged. With CP
 * this kernel is the main pass over segments (cp_mode 2: fqla_fwd_span,
 * start states from the scan), after the prepare kernel without Q and the
 * state-only pre-pass of fwd_chunk_wg.cu, which reads only Ag and gamma.
 */
#include "cuda/fwd_chain.cuh"
#include "cuda/fwd_common.cuh"
#include "cuda/fwd_ptx.cuh"
#include "cuda/hopper.cuh"
#include "cuda/pdl.cuh"

namespace {

constexpr int C = FQLA_FWD_CHUNK;
constexpr uint32_t TILE = C * 128; /* one [64 rows][64 b16] tile, 128-byte swizzle */
/* registers per thread of each role after setmaxnreg: at NWG = 2,
 * (24 + 104 + 2 x 192) x 128 = the 65,536 of an SM. The chain needs its
 * 192: at 184 ptxas serialises its wgmma. NWG = 1 uses the same budgets
 * (the same chain code), with registers to spare. */
#ifndef FU_PROD_REGS
#define FU_PROD_REGS 24
#define FU_PREP_REGS 104
#define FU_CHAIN_REGS 192
#endif
/* FU_PG_AIM L > 0: the Pg warpgroup issues chunk c's Q K^T only after both
 * chain warpgroups issued chunk c - L's G6 (L = 2: x0.99, docs/perf.md
 * session 20); 0: as soon as the stage is loaded */
#ifndef FU_PG_AIM
#define FU_PG_AIM 2
#endif
/* K = 256: the chain waits for chunk c's Pg slot (its token factors) only
 * after G2, which does not read it (x0.97 on nine K = 256 rows); 0: at the
 * chunk's start, as at K <= 128 (docs/perf.md, session 26) */
#ifndef FU_BIG_PREADY_LATE
#define FU_BIG_PREADY_LATE 1
#endif

template <int KD, int NWG_>
struct fu_cfg {
    static constexpr int KB = KD / 64;
    static constexpr int NWG = NWG_;
    /* K = 256: S^T takes 128 of a chain thread's registers, so its io-dtype
     * copy for G2 and Qs^T goes through shared memory (BIG; one chain
     * warpgroup, 240 registers), and the stage's K and Q tiles are 64 KB:
     * two stages and one output tile fit beside the copy */
    static constexpr bool BIG = KD == 256;
    static_assert(!BIG || NWG == 1, "K = 256: one chain warpgroup per CTA");
    static constexpr int CHAIN_REGS = BIG ? 240 : FU_CHAIN_REGS;
    static constexpr int THREADS = 128 * (NWG + 2);
    /* stage: per 64-wide k block the K tile then the Q tile, then the NWG V
     * tiles, the Ag tile and gamma[64] */
    static constexpr uint32_t oK = 0, oQ = TILE, KQ = 2 * TILE;
    static constexpr uint32_t oV = KB * KQ;
    static constexpr uint32_t oAg = oV + NWG * TILE;
    static constexpr uint32_t oGam = oAg + TILE;
    static constexpr uint32_t tx = oGam + 256; /* bytes copied per stage */
    static constexpr uint32_t stage = (tx + 1023) / 1024 * 1024;
    /* with the in-kernel l2norm, rk[64] after gamma (256 bytes more) */
    static constexpr uint32_t oRk = oGam + 256;
    static_assert(oRk + 256 <= stage, "rk within the stage");
    static constexpr int QST = BIG ? 2 : 3;
    /* Pg slot: the tile, (u_t, d_t)[64], o_t[64] */
    static constexpr uint32_t sPg = 0, sFac = TILE;
    static constexpr uint32_t slot = TILE + 1024;
    static constexpr int ASL = 2;
    static constexpr uint32_t oSlots = QST * stage;
    static constexpr int OT = BIG ? 1 : 2;              /* output tiles per chain warpgroup */
    static constexpr uint32_t oO = oSlots + ASL * slot; /* [NWG][OT] output tiles */
    static constexpr uint32_t oSt = oO + OT * NWG * TILE; /* BIG: S^T's io-dtype copy, KB tiles */
    static constexpr uint32_t oBar = oSt + (BIG ? KB * TILE : 0);
    static constexpr uint32_t bytes = oBar + (2 * QST + 3 * ASL) * 8 + 1024;
    static_assert(bytes <= 232448, "shared memory of one CTA");
};

#ifdef FQLA_PREP_CLOCKS
/* Instrumented builds only (nvcc -DFQLA_PREP_CLOCKS, with the prepare
 * kernel's timeline): per CTA of the first launch (blockIdx.x < 1024, y 0)
 * globaltimer stamps: [0] its start, [1] the first chain warpgroup's start
 * of chunk 0's G2 (after the stage and Pg waits), [2] its end (the last
 * warpgroup's); the start's steps: [3] the producer's early copies issued,
 * [4] its grid wait returned, [5] the Pg warpgroup's stage 0 landed, [6]
 * Pg(0) written, [7] the first chain warpgroup's h0 in registers, [8] its
 * stage 0 landed; the set-up: thread 0 [9] after fqla_fwd_span, [10] after
 * the barriers' initialisation, [11] after the CTA barrier; [12] the
 * producer after its setmaxnreg, [13] its stage 0 copies issued; [14] the
 * first chain warpgroup after its setmaxnreg */
#define FU_TL_N 15
#define FU_TL_CTAS 1024
__device__ unsigned long long g_fused_tl[FU_TL_CTAS][FU_TL_N];
#define FU_TL(i, on)                                                                                    \
    do {                                                                                                \
        if ((on) && blockIdx.y == 0 && p.chain0 == 0 && blockIdx.x < FU_TL_CTAS)                        \
            atomicMax(&g_fused_tl[blockIdx.x][i], fqla_globaltimer());                                  \
    } while (0)
#else
#define FU_TL(i, on)
#endif

#ifdef FQLA_FUSED_CLOCKS
/* Instrumented builds only (nvcc -DFQLA_FUSED_CLOCKS): clock64 spans per
 * chunk from the third on, thread 0 of the Pg warpgroup (spans 0-3: stage
 * wait, Q K^T issue and slot wait, factors and Q K^T wait, Pg) and of the
 * first chain warpgroup (8-12: stage and slot wait, G2 with the previous
 * chunk's output store, G1 + G4, G5 + G6, output), in the first 16 CTAs;
 * [14], [15] count their chunks. */
__device__ unsigned long long g_fused_clk[16];
#define FU_CLK_START long long fu_t_ = clock64()
#define FU_CLK(i, on)                                                                                   \
    do {                                                                                                \
        const long long t1_ = clock64();                                                                \
        if ((on) && blockIdx.y == 0 && blockIdx.x < 16 && c >= 2) {                                     \
            atomicAdd(&g_fused_clk[i], (unsigned long long)(t1_ - fu_t_));                              \
            if ((i) == 3) atomicAdd(&g_fused_clk[14], 1ull);                                            \
            if ((i) == 12) atomicAdd(&g_fused_clk[15], 1ull);                                           \
        }                                                                                               \
        fu_t_ = t1_;                                                                                    \
    } while (0)
#else
#define FU_CLK_START
#define FU_CLK(i, on)
#endif

template <typename T, int KD, int NWG_, bool L2N>
__global__ void __launch_bounds__(fu_cfg<KD, NWG_>::THREADS, 1)
    fwd_fused_kernel(const __grid_constant__ fqla_fwd_params p, const __grid_constant__ CUtensorMap tmQ,
                     const __grid_constant__ CUtensorMap tmK, const __grid_constant__ CUtensorMap tmV,
                     const __grid_constant__ fqla_fwd_ag_maps tmA, const __grid_constant__ CUtensorMap tmO)
{
    typedef fu_cfg<KD, NWG_> cfg;
    typedef fqla_io<T> io;
    typedef fqla_wg<T> mma;
    constexpr int NWG = cfg::NWG;
    extern __shared__ unsigned char smem_raw[];
    unsigned char *sm = smem_raw + ((1024u - (fqla_h_smem(smem_raw) & 1023u)) & 1023u);
    uint64_t *full = reinterpret_cast<uint64_t *>(sm + cfg::oBar), *empty = full + cfg::QST;
    uint64_t *pready = empty + cfg::QST, *pfree = pready + cfg::ASL, *aim = pfree + cfg::ASL;
    /* Launched with PDL after the prepare kernel. Only its outputs (Ag and
     * gamma in the workspace) need it finished: the producer waits for it
     * (griddepcontrol.wait) after issuing the first stages' K, Q and V
     * copies, before the first Ag / gamma copy; the chain warpgroups load
     * h0 meanwhile. Everything else read here is the caller's input, which
     * the prepare kernel never writes (its only other write, o's rows past
     * the last sequence, no CTA here touches). docs/perf.md, session 10. */

    const int wg = threadIdx.x >> 7;
    FU_TL(0, threadIdx.x == 0);
    /* the state's row: the sequence, or with CP's main pass (cp_mode 2) the
     * segment, whose start state the scan wrote (h0 = seg_s0) */
    const int64_t ns = ((int64_t)blockIdx.x + p.chain0) / p.HV;
    const int hv = (int)(((int64_t)blockIdx.x + p.chain0) % p.HV);
    const int hq = hv / p.group;
    const int vbase = blockIdx.y * 64 * NWG;
    /* 32-bit token counts (fqla_fwd_wg_usable bounds T): fewer registers */
    int64_t n, batch, start64, len64, slot0;
    bool last;
    if (!fqla_fwd_span(p, ns, n, batch, start64, len64, slot0, last)) return; /* no segment: the whole CTA */
    const int start = (int)start64, len = (int)len64;
    const int nch = (len + C - 1) / C;
    FU_TL(9, threadIdx.x == 0);

    if (threadIdx.x == 0) {
        fqla_tma_prefetch(&tmQ);
        fqla_tma_prefetch(&tmK);
        fqla_tma_prefetch(&tmV);
        for (int w = 0; w < 4; w++) fqla_tma_prefetch(&tmA.strip[w]);
        fqla_tma_prefetch(&tmO);
        for (int s = 0; s < cfg::QST; s++) {
            fqla_mbar_init(&full[s], 1);
            fqla_mbar_init(&empty[s], 128 * (NWG + 1)); /* the chain's and the Pg warpgroup's threads */
        }
        for (int a = 0; a < cfg::ASL; a++) {
            fqla_mbar_init(&pready[a], 128);
            fqla_mbar_init(&pfree[a], 128 * NWG);
            fqla_mbar_init(&aim[a], NWG); /* thread 0 of each chain warpgroup */
        }
        fqla_mbar_init_fence();
    }
    FU_TL(10, threadIdx.x == 0);
    __syncthreads();
    FU_TL(11, threadIdx.x == 0);

    if (wg == 0) {
        /* producer: one thread issues every copy */
        fqla_setmaxnreg_dec<FU_PROD_REGS>();
        if (threadIdx.x < 32 && fqla_elect_one()) {
            FU_TL(12, true);
            const int bc = p.varlen ? 0 : (int)batch;
            /* chunk c's K, Q, V (the caller's inputs) into its stage, the
             * whole stage's bytes announced on full[s] */
            auto inputs = [&](int c) {
                const int s = c % cfg::QST;
                fqla_mbar_wait(&empty[s], ((uint32_t)(c / cfg::QST) & 1) ^ 1);
                unsigned char *st = sm + s * cfg::stage;
                fqla_mbar_arrive_tx(&full[s], cfg::tx + (L2N ? 256u : 0u));
                const int t = start + c * C;
#pragma unroll
                for (int kb = 0; kb < cfg::KB; kb++) {
                    fqla_tma_load_4d(st + cfg::oK + kb * cfg::KQ, &tmK, &full[s], 64 * kb, hq, t, bc);
                    fqla_tma_load_4d(st + cfg::oQ + kb * cfg::KQ, &tmQ, &full[s], 64 * kb, hq, t, bc);
                }
#pragma unroll
                for (int w = 0; w < NWG; w++)
                    fqla_tma_load_4d(st + cfg::oV + w * TILE, &tmV, &full[s], vbase + 64 * w, hv, t, bc);
            };
            const int early = min(nch, cfg::QST); /* stages free from the start */
            for (int c = 0; c < early; c++) {
                inputs(c);
                FU_TL(13, c == 0);
            }
            FU_TL(3, true);
            fqla_pdl_wait(); /* the prepare kernel's Ag and gamma */
            FU_TL(4, true);
            for (int c = 0; c < nch; c++) {
                if (c >= early) inputs(c);
                const int s = c % cfg::QST;
                unsigned char *st = sm + s * cfg::stage;
                const int64_t sh = (slot0 + c) * p.HV + hv;
                fqla_fwd_load_ag(st + cfg::oAg, tmA, &full[s], sh);
                fqla_bulk_load(st + cfg::oGam, p.gam + sh * C, 256, &full[s]);
                if constexpr (L2N) /* the prepare kernel's rk (the q/k head's) */
                    fqla_bulk_load(st + cfg::oRk, p.rk + ((slot0 + c) * p.H + hq) * C, 256, &full[s]);
            }
        }
        FU_TL(2, threadIdx.x == 0);
        return;
    }

    const int tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, tq = lane & 3;

    if (wg == NWG + 1) {
        /* ---- Pg and the token factors ---- */
        fqla_setmaxnreg_dec<FU_PREP_REGS>();
        for (int c = 0; c < nch; c++) {
            FU_CLK_START;
            const int s = c % cfg::QST, a = c & 1;
            const uint32_t ph = (uint32_t)(c / cfg::QST) & 1, aph = (uint32_t)(c >> 1) & 1;
            const unsigned char *st = sm + s * cfg::stage;
            unsigned char *sl = sm + cfg::oSlots + a * cfg::slot;
            const int nvalid = min(C, len - c * C);
            fqla_mbar_wait(&full[s], ph);
            FU_TL(5, c == 0 && tid == 0);
#ifdef FQLA_DEBUG_HELPER_PREP
            /* timing only (wrong results): the helper busy for
             * FQLA_DEBUG_HELPER_SPIN cycles on every M-th chunk, standing in
             * for that chunk's preparation, whose prepare-kernel work the
             * launch below leaves out */
            if (c % FQLA_DEBUG_HELPER_PREP == FQLA_DEBUG_HELPER_PREP - 1) {
                const long long t0_ = clock64();
                while (clock64() - t0_ < FQLA_DEBUG_HELPER_SPIN) {
#if FQLA_DEBUG_HELPER_SLEEP
                    __nanosleep(100);
#endif
                }
            }
#endif
#if FU_PG_AIM
            /* chunk c's Q K^T behind chunk c - FU_PG_AIM's G5 / G6, into the
             * chain's output stretch, not beside its G2 (docs/perf.md,
             * session 20) */
            if (c >= FU_PG_AIM) fqla_mbar_wait(&aim[(c - FU_PG_AIM) & 1], (uint32_t)((c - FU_PG_AIM) >> 1) & 1);
#endif
            FU_CLK(0, tid == 0);

            float accQK[32];
            fqla_wg_fence();
#pragma unroll
            for (int kk = 0; kk < KD / 16; kk++) {
                const uint64_t dK =
                    fqla_desc_kmajor(st + cfg::oK + (kk >> 2) * cfg::KQ) + (kk & 3) * FQLA_DESC_K16_KMAJOR;
                const uint64_t dQ =
                    fqla_desc_kmajor(st + cfg::oQ + (kk >> 2) * cfg::KQ) + (kk & 3) * FQLA_DESC_K16_KMAJOR;
                mma::template ss64<0, 0>(accQK, dQ, dK, kk > 0);
            }
            fqla_wg_commit();
            /* l2norm: rq of this warp's 16 rows (two lanes per row) from the
             * Q tile while Q K^T runs; rk came with the stage. (Formed
             * instead for the next chunk after pready, where that stage had
             * landed, the kernel ran 2-14 % longer; by two producer warps at
             * 24 registers, 8-28 %: docs/perf.md, session 27.) */
            float rq = 1.f;
            if constexpr (L2N) rq = fqla_row_rnorm<T, KD>(st + cfg::oQ, cfg::KQ, 16 * warp + (lane >> 1), lane & 1);
            /* the slot: the chain is done with chunk c - 2 */
            fqla_mbar_wait(&pfree[a], aph ^ 1);
            FU_CLK(1, tid == 0);
            const float *gam = reinterpret_cast<const float *>(st + cfg::oGam);
            const float *rks = reinterpret_cast<const float *>(st + cfg::oRk); /* (L2N) */
            if constexpr (L2N) {
                /* the chain's token factors: each warp its rows' */
                if (!(lane & 1)) {
                    const int t = 16 * warp + (lane >> 1);
                    fqla_chain::token_factors(reinterpret_cast<float2 *>(sl + cfg::sFac),
                                              reinterpret_cast<float *>(sl + cfg::sFac + 512), gam, t, gam[C - 1],
                                              rq, rks[t], p.scale);
                }
            } else if (warp == 0) {
                /* the chain's token factors (without l2norm) */
                float2 *ud = reinterpret_cast<float2 *>(sl + cfg::sFac);
                float *fo = reinterpret_cast<float *>(sl + cfg::sFac + 512);
                const float gC = gam[C - 1];
#pragma unroll
                for (int h = 0; h < 2; h++) fqla_chain::token_factors(ud, fo, gam, lane + 32 * h, gC, 1.f, 1.f, p.scale);
            }
            fqla_wg_wait<0>();
            fqla_reg_fence(accQK);
            FU_CLK(2, tid == 0);

            /* Pg = scale Gamma (.) tril(QK), this warp's 16 rows; rows and
             * columns past the sequence end are zeros. l2norm: QK's
             * entries times rq_i rk_j */
            {
                constexpr float L2E = 1.4426950408889634f;
                const int r0 = 16 * warp + g;
                const float gi[2] = {gam[r0] * L2E, gam[r0 + 8] * L2E};
                float rqr[2] = {1.f, 1.f}; /* rows r0, r0 + 8: lanes 2 g, 2 g + 16 */
                if constexpr (L2N) {
                    rqr[0] = __shfl_sync(0xffffffffu, rq, 2 * g);
                    rqr[1] = __shfl_sync(0xffffffffu, rq, 2 * g + 16);
                }
#pragma unroll
                for (int j2 = 0; j2 < 4; j2++) {
                    uint32_t r[4];
#pragma unroll
                    for (int m = 0; m < 4; m++) {
                        const int h = m & 1, j = 2 * j2 + (m >> 1), col = 8 * j + 2 * tq, row = r0 + 8 * h;
                        const float2 gc = *reinterpret_cast<const float2 *>(gam + col);
                        const bool rok = row < nvalid;
                        float v0 = p.scale * accQK[4 * j + 2 * h] * fqla_ex2(gi[h] - gc.x * L2E);
                        float v1 = p.scale * accQK[4 * j + 2 * h + 1] * fqla_ex2(gi[h] - gc.y * L2E);
                        if constexpr (L2N) {
                            const float2 rc = *reinterpret_cast<const float2 *>(rks + col);
                            v0 *= rqr[h] * rc.x;
                            v1 *= rqr[h] * rc.y;
                        }
                        v0 = rok && col <= row && col < nvalid ? v0 : 0.f;
                        v1 = rok && col + 1 <= row && col + 1 < nvalid ? v1 : 0.f;
                        r[m] = io::pack(v0, v1);
                    }
                    const int mi = lane >> 3, row = 16 * warp + 8 * (mi & 1) + (lane & 7), ch = 2 * j2 + (mi >> 1);
                    fqla_stsm_x4(sl + cfg::sPg + row * 128 + 16 * (ch ^ (row & 7)), r[0], r[1], r[2], r[3]);
                }
            }
            fqla_mbar_arrive(&empty[s]); /* this thread's reads of the stage are done */
            fqla_fence_async_smem();     /* Pg: read by the chain's wgmma */
            fqla_mbar_arrive(&pready[a]);
            FU_TL(6, c == 0 && tid == 0);
            FU_CLK(3, tid == 0);
        }
        FU_TL(2, tid == 0);
        return;
    }

    /* ---- the chain (fwd_chunk_wg.cu's consumers) ---- */
    fqla_setmaxnreg_inc<cfg::CHAIN_REGS>();
    const int cw = wg - 1;
    FU_TL(14, tid == 0 && cw == 0);
    const int v0 = vbase + 64 * cw;
    constexpr int NS = KD / 2;
    constexpr int KS = KD / 16;
    const int vr = v0 + 16 * warp + g, kc = 2 * tq;
    float S[NS];
    fqla_chain::load_state(p, S, ns, hv, vr, kc);
#ifdef FQLA_PREP_CLOCKS
    fqla_reg_fence(S); /* (instrumented builds: the stamp after the loads land) */
    FU_TL(7, tid == 0 && cw == 0);
#endif

    T *ob = (T *)p.o + batch * p.o_sb + hv * p.o_sh + v0;
    unsigned char *Obuf = sm + cfg::oO + cw * cfg::OT * TILE; /* this warpgroup's output staging tiles */
    /* chunk cc's output rows to o (fwd_chain.cuh), issued while the next
     * chunk's G2 runs, so the barrier and the store are off the chain's
     * path */
    auto store_out = [&](int cc) {
        fqla_chain::store_out<T, int, cfg::OT>(p, &tmO, Obuf, ob, cc, start, len, v0, hv, batch, cw, tid);
    };

    for (int c = 0; c < nch; c++) {
        FU_CLK_START;
        const int s = c % cfg::QST, a = c & 1;
        const uint32_t ph = (uint32_t)(c / cfg::QST) & 1, aph = (uint32_t)(c >> 1) & 1;
        unsigned char *st = sm + s * cfg::stage, *sl = sm + cfg::oSlots + a * cfg::slot;
        fqla_mbar_wait(&full[s], ph);
        FU_TL(8, c == 0 && tid == 0 && cw == 0);
        constexpr bool pready_late = cfg::BIG && FU_BIG_PREADY_LATE;
        if (!pready_late) fqla_mbar_wait(&pready[a], aph);
        FU_CLK(8, tid == 0 && cw == 0);
        FU_TL(1, c == 0 && tid == 0 && cw == 0);
        const int nvalid = (int)min(C, len - c * C);
        if (!pready_late && nvalid < C) {
            /* rows past the end: zero K (warpgroup 1) and this V slice (the
             * Pg warpgroup has read K already: it signalled pready after) */
            fqla_chain::zero_rows(st + cfg::oK, cfg::KB, cfg::KQ, cw == 0, st + cfg::oV + cw * TILE, nvalid, tid);
            fqla_named_sync(1, 128 * NWG);
        }
        const float *gm = reinterpret_cast<const float *>(st + cfg::oGam);
        const float2 *ud = reinterpret_cast<const float2 *>(sl + cfg::sFac);
        const float *fos = reinterpret_cast<const float *>(sl + cfg::sFac + 512);

        if constexpr (cfg::BIG) {
            /* S^T's io-dtype copy, the chunk's entering state, for G2 and
             * Qs^T (its last reader, the previous chunk's Qs^T, completed
             * at that chunk's last wait) */
            unsigned char *sst = sm + cfg::oSt;
            fqla_chain::stage_state<T, KD>(sst, S, warp, lane);
            fqla_fence_async_smem();
            fqla_named_sync(4, 128);
            float accU[32], accP[32];
            fqla_wg_fence();
            fqla_chain::g2_ss_issue<T, KS>(accU, sst, st + cfg::oK, cfg::KQ); /* G2: U^T */
            fqla_wg_commit();
            store_out(c - 1); /* the previous chunk's rows, while G2 runs */
            const float gC = gm[C - 1];
            const uint64_t dAg = fqla_desc_kmajor(st + cfg::oAg);
            fqla_wg_wait<0>();
            fqla_reg_fence(accU);
            if (nvalid < C) {
                /* G2 read K's rows past the end before they are zeroed
                 * below: U's columns for them as zeros, or a non-finite row
                 * there (the next sequence's, or past cu[N]) would reach G4
                 * through Ag's zeros (0 * NaN; docs/perf.md, session 28).
                 * accU[i]: token 16 (i / 8) + 8 ((i / 4) % 2) + 2 tq + i % 2 */
#pragma unroll
                for (int i = 0; i < 32; i++)
                    if (16 * (i >> 3) + 8 * ((i >> 2) & 1) + 2 * tq + (i & 1) >= nvalid) accU[i] = 0.f;
            }
            if (pready_late) {
                /* the factors; and the Pg warpgroup has read K (G2 above
                 * read rows past the end as they are: they reach only U's
                 * rows past the end, which G5's zeroed K rows and Pg's zero
                 * columns drop) */
                fqla_mbar_wait(&pready[a], aph);
                if (nvalid < C) {
                    fqla_chain::zero_rows(st + cfg::oK, cfg::KB, cfg::KQ, true, st + cfg::oV, nvalid, tid);
                    fqla_named_sync(1, 128);
                }
            }
            FU_CLK(9, tid == 0);
            float accVd[32];
            /* G1: Vd^T = V^T Ag^T, then G4: Vd^T += (-U^T diag(u)) Ag^T */
            fqla_chain::g14_issue<T>(accVd, accU, ud, tq, st + cfg::oV, dAg);
            {
                const float eC = __expf(gC);
#pragma unroll
                for (int i = 0; i < NS; i++) S[i] *= eC;
            }
            fqla_wg_wait<0>();
            fqla_reg_fence(accVd);
            FU_CLK(10, tid == 0);

            /* G5 on the registers, and Qs^T = S^T Q^T on the staged copy
             * (the entering state) into G6's accumulators */
            uint32_t vd[4][4], vp[4][4];
            fqla_chain::g56_ready<T>(vd, vp, accVd, ud, tq, S);
            fqla_chain::g5_issue<T, KD>(S, vp, fqla_desc_mnmajor(st + cfg::oK, cfg::KQ), cfg::KQ); /* G5 */
            fqla_chain::g2_ss_issue<T, KS>(accP, sst, st + cfg::oQ, cfg::KQ);                     /* Qs^T */
            fqla_wg_commit();
            float fo[16];
            fqla_chain::load_out_factors(fo, fos, tq);
            fqla_wg_wait<0>();
            fqla_reg_fence(S);
            fqla_reg_fence(accP);
            /* O^T = Qs^T diag(o) + Vd^T Pg^T: the factors in fp32 first, as
             * output_tile applies them at K <= 128 */
            fqla_chain::scale_cols(accP, fo);
            fqla_reg_fence(accP);
            fqla_wg_fence();
            fqla_chain::g6_issue<T, true>(accP, vd, fqla_desc_kmajor(sl + cfg::sPg)); /* G6 */
            fqla_wg_commit();
#if FU_PG_AIM
            if (tid == 0) fqla_mbar_arrive(&aim[a]); /* the Pg warpgroup may issue chunk c + FU_PG_AIM's Q K^T */
#endif
            fqla_wg_wait<0>();
            fqla_reg_fence(accP);
            FU_CLK(11, tid == 0);
            fqla_mbar_arrive(&empty[s]); /* the stage and */
            fqla_mbar_arrive(&pfree[a]); /* the slot are no longer read by this thread */

            /* one staging tile: chunk c - 1's store (issued by store_out
             * during this chunk's G2) must have read it */
            if (tid == 0) fqla_bulk_wait_read<0>();
            fqla_named_sync(2 + cw, 128);
            fqla_chain::output_tile<T, false>(Obuf, fo, nullptr, accP, warp, lane);
        } else {
            uint32_t sf[KS][4];
            fqla_chain::pack_state<T>(sf, S);
            float accVd[32], accUQ[64]; /* accUQ[0..31] = U^T, [32..63] = Qs^T */
            const uint64_t dAg = fqla_desc_kmajor(st + cfg::oAg);
            fqla_reg_fence_u(sf);
            fqla_wg_fence();
            fqla_chain::g2_issue<T, KS, 128>(accUQ, sf, st + cfg::oK, cfg::KQ); /* G2 */
            fqla_wg_commit();
            store_out(c - 1); /* the previous chunk's rows, while G2 runs */
            const float gC = gm[C - 1];
            fqla_wg_wait<0>();
            fqla_reg_fence(accUQ);
            FU_CLK(9, tid == 0 && cw == 0);
            /* G1: Vd^T = V^T Ag^T, then G4: Vd^T += (-U^T diag(u)) Ag^T */
            fqla_chain::g14_issue<T>(accVd, accUQ, ud, tq, st + cfg::oV + cw * TILE, dAg);
            {
                const float eC = __expf(gC);
#pragma unroll
                for (int i = 0; i < NS; i++) S[i] *= eC;
            }
            fqla_wg_wait<0>();
            fqla_reg_fence(accVd);
            FU_CLK(10, tid == 0 && cw == 0);

            uint32_t vd[4][4], vp[4][4];
            fqla_chain::g56_ready<T>(vd, vp, accVd, ud, tq, S);
            fqla_chain::g5_issue<T, KD>(S, vp, fqla_desc_mnmajor(st + cfg::oK, cfg::KQ)); /* G5 */
            fqla_wg_commit();
            float accP[32];
            fqla_chain::g6_issue<T>(accP, vd, fqla_desc_kmajor(sl + cfg::sPg)); /* G6 */
            fqla_wg_commit();
#if FU_PG_AIM
            if (tid == 0) fqla_mbar_arrive(&aim[a]); /* the Pg warpgroup may issue chunk c + FU_PG_AIM's Q K^T */
#endif
            float fo[16];
            fqla_chain::load_out_factors(fo, fos, tq);
            fqla_wg_wait<0>();
            fqla_reg_fence(S);
            fqla_reg_fence(accUQ);
            fqla_reg_fence(accP);
            FU_CLK(11, tid == 0 && cw == 0);
            fqla_mbar_arrive(&empty[s]);  /* the stage and */
            fqla_mbar_arrive(&pfree[a]);  /* the slot are no longer read by this thread */

            /* O^T = Qs^T diag(o) + P^T -> staging tile c & 1 as [t][v]
             * (stmatrix.trans); chunk c - 2's store has read it (store_out(c - 1)
             * waited for that before its barrier) */
            fqla_chain::output_tile<T>(Obuf + (c & 1) * TILE, fo, accUQ + 32, accP, warp, lane);
        }
        FU_CLK(12, tid == 0 && cw == 0);
    }
    if (nch > 0) store_out(nch - 1);
    if (tid == 0) fqla_bulk_wait<0>(); /* the CTA's last stores are done before it exits */

    /* the final state: of the sequence (with CP, from its last segment) */
    if (p.ht && last) fqla_chain::store_state(p, S, n, hv, vr, kc);
    FU_TL(2, tid == 0);
}

#ifdef FQLA_PREP_CLOCKS
} // namespace
/* Instrumented builds: the timeline since the last call (then reset). */
extern "C" int fqla_cuda_debug_fused_timeline(unsigned long long out[FU_TL_N * FU_TL_CTAS])
{
    return fqla_debug_clocks_take(g_fused_tl, out, FU_TL_N * FU_TL_CTAS);
}
namespace {
#endif

#ifdef FQLA_FUSED_CLOCKS
} // namespace
/* Instrumented builds: the clock sums since the last call (then reset). */
extern "C" int fqla_cuda_debug_fused_clocks(unsigned long long out[16])
{
    return fqla_debug_clocks_take(g_fused_clk, out, 16);
}
namespace {
#endif

template <typename T, int KD, int NWG, bool L2N>
cudaError_t launch(const fqla_fwd_params &p, int64_t chains, const CUtensorMap *maps, const fqla_fwd_ag_maps &ag,
                   cudaStream_t stream)
{
    typedef fu_cfg<KD, NWG> cfg;
    static fqla_smem_cache cache;
    cudaError_t err = fqla_smem_limit(cache, fwd_fused_kernel<T, KD, NWG, L2N>, cfg::bytes);
    if (err != cudaSuccess) return err;
    /* (the prepare kernel zeroes the o rows after the last sequence) */
    dim3 grid((unsigned)chains, (unsigned)(p.V / (64 * NWG)));
    return fqla_launch(fwd_fused_kernel<T, KD, NWG, L2N>, grid, dim3(cfg::THREADS), cfg::bytes, stream, p.pdl, p,
                           maps[0], maps[1], maps[2], ag, maps[4]);
}

/* launch<T, KD, NWG, L2N> for the io dtype and K (64 or 128, or 256 at
 * NWG = 1: fqla_fwd_fused_usable) */
template <int NWG, bool L2N>
cudaError_t launch_kd(int io_bf16, const fqla_fwd_params &p, int64_t chains, const CUtensorMap *maps,
                      const fqla_fwd_ag_maps &ag, cudaStream_t stream)
{
    if (p.K == 256) {
        if constexpr (NWG == 1)
            return io_bf16 ? launch<__nv_bfloat16, 256, 1, L2N>(p, chains, maps, ag, stream)
                           : launch<__half, 256, 1, L2N>(p, chains, maps, ag, stream);
        return cudaErrorInvalidValue;
    }
    if (p.K == 64)
        return io_bf16 ? launch<__nv_bfloat16, 64, NWG, L2N>(p, chains, maps, ag, stream)
                       : launch<__half, 64, NWG, L2N>(p, chains, maps, ag, stream);
    return io_bf16 ? launch<__nv_bfloat16, 128, NWG, L2N>(p, chains, maps, ag, stream)
                   : launch<__half, 128, NWG, L2N>(p, chains, maps, ag, stream);
}
/* ... with the in-kernel l2norm's factors (L2N) or without */
template <int NWG>
cudaError_t launch_io(int io_bf16, const fqla_fwd_params &p, int64_t chains, const CUtensorMap *maps,
                      const fqla_fwd_ag_maps &ag, cudaStream_t stream)
{
    return p.l2norm ? launch_kd<NWG, true>(io_bf16, p, chains, maps, ag, stream)
                    : launch_kd<NWG, false>(io_bf16, p, chains, maps, ag, stream);
}

} // namespace

int fqla_fwd_fused_usable(const fqla_fwd_params &p, int nwg)
{
    /* CP: the main pass (cp_mode 2); its prepare kernel without Q writes
     * the negligible-transition shortcut's chunk flags (PAIR too) */
    return p.cp_mode != 1 && fqla_route_fused_fits(p.K, p.V, fqla_fwd_tma_usable(p), nwg);
}

cudaError_t fqla_fwd_launch_fused(const fqla_fwd_params &k, int io_bf16, int hb, int nwg, int parts,
                                  cudaStream_t stream, int *used)
{
    *used = 0;
    fqla_fwd_params p = k;
    p.Pg = NULL; /* this path has none: the prepare kernel runs without Q */
    if (!fqla_fwd_fused_usable(p, nwg)) return cudaSuccess;
    CUtensorMap maps[FQLA_FWD_MAPS];
    fqla_fwd_ag_maps ag, ag_store;
    if (!fqla_fwd_tma_maps(p, io_bf16, maps, &ag)) return cudaSuccess; /* the caller runs the two kernels */
    if ((parts & FQLA_FUSED_PREPARE) && !fqla_fwd_map_ag_store(p, io_bf16, &ag_store)) return cudaSuccess;
    *used = 1;
    cudaError_t err = cudaSuccess;
    if (parts & FQLA_FUSED_PREPARE) err = fqla_fwd_launch_prepare(p, io_bf16, hb, &maps[1], &ag_store, stream);
    if (err != cudaSuccess || !(parts & FQLA_FUSED_CHAIN) || (p.cp_mode ? p.segs : p.N) * p.HV == 0) return err;
    const int64_t chains = (p.cp_mode ? p.segs : p.N) * p.HV;
    if (nwg == 1) return launch_io<1>(io_bf16, p, chains, maps, ag, stream);
    /* a split last wave (fused_split, route_plan.h): the first chains with two
     * chain warpgroups per CTA, then the rest with one (a second launch,
     * ordered after the first by the stream: its CTAs take the SMs the
     * first's leave) */
    const int64_t split = !p.cp_mode && p.fused_split > 0 && p.fused_split < chains ? p.fused_split : chains;
    p.chain0 = 0;
    err = launch_io<2>(io_bf16, p, split, maps, ag, stream);
    if (err != cudaSuccess || split == chains) return err;
    p.chain0 = split;
    return launch_io<1>(io_bf16, p, chains - split, maps, ag, stream);
}
