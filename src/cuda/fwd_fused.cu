/*
 * fwd_fused.cu - the forward's sequential kernel with Pg formed in the CTA
 * (sm_90a): the chunk kernel's chain (fwd_chunk_wg.cu) beside a warpgroup
 * that forms each chunk's Pg = scale Gamma (.) tril(Q K^T) from the Q and K
 * tiles the chain loads anyway. The prepare kernel runs before it without
 * Q (fwd_prepare.cu, WQ = false): gamma and Ag only. Per (chunk, value head)
 * the two launches move q, k, v, Ag (and K twice, Ag twice) instead of the
 * two-kernel path's q and k twice plus Ag and Pg twice.
 *
 * Grid: x = sequence (with CP segment) x value head, from p.chain0 on; y =
 * slices of 64 NWG value columns. One CTA of 128 (NWG + 2) threads, NWG = 1
 * or 2 chain warpgroups:
 *   warpgroup 0, the producer (24 registers): one thread issues the copies
 *     of each chunk's K, Q, V and Ag tiles and gamma into a three-stage
 *     ring (fu_load);
 *   warpgroups 1 .. NWG, the chain (192 registers): 64 value columns each,
 *     the state S^T in registers, as in fwd_chunk_wg.cu (G1 .. G6 there);
 *     here G1 is issued after G2's wait, with G4, which keeps these
 *     warpgroups within 192 registers (fu_chain);
 *   warpgroup NWG + 1, the Pg warpgroup (104 registers): per chunk, a chunk
 *     or more ahead of the chain, into a two-slot ring: QK = Q K^T (SS
 *     wgmma on the stage's tiles), Pg from the accumulators (stmatrix), and
 *     the chain's token factors from gamma (fu_pg).
 * NWG = 2 where sequences x heads fill the GPU with one CTA per 128 value
 * columns; NWG = 1 (two CTAs per 128 columns, each forming the same Pg)
 * where they do not, in place of the two-kernel path's V split, whose
 * prepare kernel with Q forms Pg and moves it through HBM (pick_fused in
 * fwd.cu).
 *
 * Shared memory (fu_smem): the stage ring (fu_stage: K, Q, V, Ag tiles,
 * gamma, rk), the Pg slot ring (fu_slot: the Pg tile and the token
 * factors), the output staging tiles, at K = 256 S^T's io-dtype copy, and
 * the barriers: full / empty for the stages (empty also waits for the Pg
 * warpgroup's reads), pready / pfree for the Pg slots, and aim per slot:
 * the Pg warpgroup issues chunk c's Q K^T once every chain warpgroup has
 * issued chunk c - PG_AIM's G6, so that it runs in the chain's output
 * stretch, not beside its G2 (a timing choice, not a data dependence).
 *
 * A full fused kernel (the inverse in this warpgroup too, no prepare
 * kernel) measured 3.7x slower per chunk in its preparation than in its
 * chain (a61b9b8).
 *
 * At K = 256 (fu_cfg::BIG): one chain warpgroup per 64 value columns at
 * 240 registers. It writes S^T's io-dtype copy to shared memory at each
 * chunk's start; G2 (U^T alone) and Qs^T read it there as SS products.
 * Qs^T is formed beside G5, scaled by the output factors in G6's
 * accumulators, and G6 adds P^T to it.
 *
 * Covered: K = 64, 128 or 256 (NWG = 1), V a multiple of 64 NWG, bf16 / fp16
 * (fqla_fwd_fused_usable); everything else runs the two kernels. With the
 * in-kernel l2norm (L2N) the prepare kernel writes rk (and scales K K^T by
 * it), the Pg warpgroup forms rq from the stage's Q tile while its Q K^T
 * runs, and both enter Pg and the chain's token factors; the chain itself
 * is unchanged. With CP this kernel is the main pass over segments
 * (cp_mode 2: fqla_fwd_span, start states from the scan), after the prepare
 * kernel without Q and the state-only pre-pass of fwd_chunk_wg.cu, which
 * reads only Ag and gamma.
 */
#include "cuda/fwd_chain.cuh"
#include "cuda/fwd_common.cuh"
#include "cuda/kernel/io.cuh"
#include "cuda/kernel/named_barrier.cuh"
#include "cuda/kernel/pipeline.cuh"
#include "cuda/ptx/ptx.cuh"
#ifdef FQLA_DEV
#include "dev/fwd_fused_exp.cuh" /* issue 42's timing experiment */
#endif

#include <stddef.h>

/* The in-kernel l2norm's factor 1 / sqrt(sum x^2 + 1e-6) of row r of a
 * [64][KD] tile of 2-byte values that TMA stored as KD / 64 boxes of 64
 * rows x 128 bytes (box b at tile + b box_stride). Two adjacent lanes share
 * a row, each summing half of it (part = lane & 1). A sum may visit a row's
 * 16-byte chunks in any order, so each lane starts at its own: chunk j of
 * a box's row is read at j ^ (r & 7) (and ^ 4 for the second part where
 * both parts read the same chunks of different boxes). Then the 8 lanes of
 * each load phase hit 8 different 16-byte bank groups. Reading chunk j at
 * j for every row (one bank group for the whole warp, 8-way conflicts)
 * made these sums cost ~18 % of this kernel on the H200 (~45 % of the
 * prepare kernel without Q). Both lanes of the pair return the factor.
 * Used for rq by the Pg warpgroup; the prepare kernel without Q takes rk
 * from K K^T's diagonal, the kernels with Q sum padded rows (fwd_prepare.cu,
 * step 2), all in fp32. */
template <typename T, int KD>
FQLA_DEVICE_INLINE float fqla_row_rnorm(const unsigned char *tile, uint32_t box_stride, int r, int part)
{
    constexpr int CH = KD / 16; /* 16-byte chunks in half a row */
    const int rot = (r & 7) ^ (CH >= 8 ? 4 * part : 0);
    float ss = 0.f;
#pragma unroll
    for (int i = 0; i < CH; i++) {
        const int q = part * CH + i; /* box q / 8, chunk q % 8 (read at (q % 8) ^ rot) */
        const uint4 w =
            *reinterpret_cast<const uint4 *>(tile + (q >> 3) * box_stride + r * 128 + (((q & 7) ^ rot) * 16));
        const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float2 f = fqla_io<T>::unpack(u[j]);
            ss += f.x * f.x + f.y * f.y;
        }
    }
    ss += __shfl_xor_sync(0xffffffffu, ss, 1);
    return rsqrtf(ss + 1e-6f);
}

namespace {

constexpr int C = FQLA_FWD_CHUNK;
constexpr uint32_t TILE = C * 128; /* one [64 rows][64 b16] tile, 128-byte swizzle */
/* registers per thread of each role after setmaxnreg: at NWG = 2,
 * (24 + 104 + 2 x 192) x 128 = the 65,536 of an SM. The chain needs its
 * 192: at 184 ptxas serialises its wgmma. NWG = 1 uses the same budgets
 * (the same chain code), with registers to spare. */
constexpr int PROD_REGS = 24;
constexpr int PREP_REGS = 104;
constexpr int CHAIN_REGS_K128 = 192;
/* The Pg warpgroup issues chunk c's Q K^T only after every chain warpgroup
 * issued chunk c - PG_AIM's G6 (PG_AIM = 2: x0.99 of the time at 0, where
 * it issues as soon as the stage is loaded, on the H200). */
constexpr int PG_AIM = 2;
/* K = 256: the chain waits for chunk c's Pg slot (its token factors) only
 * after G2, which does not read it (x0.97 on nine K = 256 shapes, on the
 * H200); false: at the chunk's start, as at K <= 128. */
constexpr bool BIG_PREADY_LATE = true;

/* One stage of the input ring. Tiles are [64 rows][64 b16] in TMA's
 * 128-byte swizzle, each 1024-aligned. */
template <int KD, int NWG>
struct fu_stage {
    unsigned char kq[KD / 64][2][TILE]; /* per 64-wide k block: the K tile, then the Q tile */
    unsigned char v[NWG][TILE];         /* V, 64 value columns per chain warpgroup */
    unsigned char ag[TILE];             /* Ag (the square tile of the packed strips) */
    float gam[C];                       /* gamma, the chunk-local cumsum of g */
    float rk[C];                        /* the prepare kernel's rk (L2N only) */
    unsigned char pad[512];             /* to a whole number of KB */
};

/* One slot of the Pg ring: written by the Pg warpgroup, read by the chain. */
struct fu_slot {
    unsigned char pg[TILE]; /* Pg, [64][64] b16 in the 128-byte swizzle (stmatrix) */
    float2 ud[C];           /* the token factors (u_t, d_t) */
    float fo[C];            /* ... and o_t */
    unsigned char pad[256]; /* to a whole number of KB */
};

/* The CTA's shared memory, 1024-aligned. BIG (K = 256): S^T's io-dtype
 * copy, KD / 64 tiles. */
template <int KD, int NWG, int QST, int ASL, int OT, bool BIG = KD == 256>
struct fu_smem {
    fu_stage<KD, NWG> stage[QST];
    fu_slot slot[ASL];
    unsigned char out[NWG][OT][TILE]; /* per chain warpgroup OT [64 tokens][64 values] output tiles */
    unsigned char sst[KD / 64][TILE]; /* BIG: S^T in the io dtype, 64 value rows x 64 keys per tile */
    uint64_t full[QST];               /* the stage's copies landed: 1 arrival + its bytes */
    uint64_t empty[QST];              /* the chain's and the Pg warpgroup's threads are done with it */
    uint64_t pready[ASL];             /* the slot's Pg and factors are written: the Pg warpgroup's threads */
    uint64_t pfree[ASL];              /* the chain's threads are done with the slot */
    uint64_t aim[ASL];                /* thread 0 of each chain warpgroup issued the chunk's G6 */
};
template <int KD, int NWG, int QST, int ASL, int OT>
struct fu_smem<KD, NWG, QST, ASL, OT, false> {
    fu_stage<KD, NWG> stage[QST];
    fu_slot slot[ASL];
    unsigned char out[NWG][OT][TILE];
    uint64_t full[QST], empty[QST], pready[ASL], pfree[ASL], aim[ASL];
};

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
    static constexpr int CHAIN_REGS = BIG ? 240 : CHAIN_REGS_K128;
    static constexpr int THREADS = 128 * (NWG + 2);
    static constexpr int QST = BIG ? 2 : 3; /* stages */
    static constexpr int ASL = 2;           /* Pg slots */
    static constexpr int OT = BIG ? 1 : 2;  /* output tiles per chain warpgroup */
    typedef fu_stage<KD, NWG> stage_t;
    typedef fu_smem<KD, NWG, QST, ASL, OT> smem_t;
    typedef fu_smem<KD, NWG, QST, ASL, OT, true> smem_big_t;
    /* byte offsets (the kernel addresses the plan by them) */
    static constexpr uint32_t stage = sizeof(stage_t);
    static constexpr uint32_t oK = offsetof(stage_t, kq), oQ = oK + TILE, KQ = sizeof(stage_t::kq[0]);
    static constexpr uint32_t oV = offsetof(stage_t, v);
    static constexpr uint32_t oAg = offsetof(stage_t, ag);
    static constexpr uint32_t oGam = offsetof(stage_t, gam);
    static constexpr uint32_t oRk = offsetof(stage_t, rk);
    static constexpr uint32_t tx = oGam + sizeof(stage_t::gam); /* bytes copied per stage (+ 256 with rk) */
    static constexpr uint32_t slot = sizeof(fu_slot);
    static constexpr uint32_t sPg = offsetof(fu_slot, pg), sFac = offsetof(fu_slot, ud);
    static constexpr uint32_t oSlots = offsetof(smem_t, slot);
    static constexpr uint32_t oO = offsetof(smem_t, out);
    static constexpr uint32_t oSt = offsetof(smem_big_t, sst);
    static constexpr uint32_t oBar = offsetof(smem_t, full);
    static constexpr uint32_t bytes = sizeof(smem_t) + 1024; /* + slack for the 1024 alignment */

    static_assert(stage % 1024 == 0 && oV % 1024 == 0 && oAg % 1024 == 0, "every stage's tiles 1024-aligned");
    static_assert(oRk == oGam + 256, "rk after gamma");
    static_assert(slot % 1024 == 0 && oSlots % 1024 == 0 && oO % 1024 == 0 && oSt % 1024 == 0,
                  "the Pg, output and S^T tiles 1024-aligned");
    static_assert(offsetof(fu_slot, fo) == sFac + 512, "o_t after (u_t, d_t)");
    static_assert(oBar == (BIG ? oSt + KB * TILE : oSt), "the barriers after the tiles");
    static_assert(offsetof(smem_t, aim) == oBar + (2 * QST + 2 * ASL) * 8, "full, empty, pready, pfree, aim back to back");
    static_assert(bytes <= 232448, "shared memory of one CTA");
    static_assert(PROD_REGS + PREP_REGS + NWG * CHAIN_REGS <= 512, "the register budgets fit the SM's 64K");
};

/* The barriers (fu_smem's), by role. */
struct fu_bars {
    uint64_t *full, *empty, *pready, *pfree, *aim;
};

/* What one CTA runs: the state's row ns (the sequence, or with CP's main
 * pass the segment), its sequence n, token span and chunk slots; the value
 * head, its q/k head and the CTA's first value column. 32-bit token counts
 * (fqla_fwd_wg_usable bounds T): fewer registers. */
struct fu_work {
    int64_t ns, n, batch, slot0;
    int start, len, nch, hv, hq, vbase;
    int last; /* the span ends the sequence (fqla_fwd_span) */
};

/* Thread 0: the maps prefetched, the barriers initialised. */
template <int NWG, int QST, int ASL>
__device__ __forceinline__ void fu_init(const CUtensorMap &tmQ, const CUtensorMap &tmK, const CUtensorMap &tmV,
                                        const fqla_fwd_ag_maps &tmA, const CUtensorMap &tmO, const fu_bars &b)
{
    fqla_tma_prefetch(&tmQ);
    fqla_tma_prefetch(&tmK);
    fqla_tma_prefetch(&tmV);
    for (int w = 0; w < 4; w++) fqla_tma_prefetch(&tmA.strip[w]);
    fqla_tma_prefetch(&tmO);
    for (int s = 0; s < QST; s++) {
        fqla_mbar_init(&b.full[s], 1);
        fqla_mbar_init(&b.empty[s], 128 * (NWG + 1)); /* the chain's and the Pg warpgroup's threads */
    }
    for (int a = 0; a < ASL; a++) {
        fqla_mbar_init(&b.pready[a], 128);
        fqla_mbar_init(&b.pfree[a], 128 * NWG);
        fqla_mbar_init(&b.aim[a], NWG); /* thread 0 of each chain warpgroup */
    }
    fqla_mbar_init_fence();
}

/* The producer's elected thread: every copy of every stage. The caller's
 * inputs (K, Q, V) of the first stages go out before the grid wait, the
 * prepare kernel's outputs (Ag, gamma, rk) after it. */
template <int KD, int NWG, bool L2N>
__device__ __forceinline__ void fu_load(const fqla_fwd_params &p, const CUtensorMap &tmQ, const CUtensorMap &tmK,
                                        const CUtensorMap &tmV, const fqla_fwd_ag_maps &tmA, unsigned char *sm,
                                        const fu_bars &b, const fu_work &w)
{
    typedef fu_cfg<KD, NWG> cfg;
    const int bc = p.varlen ? 0 : (int)w.batch;
    /* chunk c's K, Q, V (the caller's inputs) into its stage, the whole
     * stage's bytes announced on full[s] */
    auto inputs = [&](int c) {
        const fqla_pipe<cfg::QST> ps = fqla_pipe<cfg::QST>::at(c);
        const int s = ps.stage;
        fqla_mbar_wait(&b.empty[s], ps.empty_parity());
        unsigned char *st = sm + s * cfg::stage;
        fqla_mbar_arrive_tx(&b.full[s], cfg::tx + (L2N ? 256u : 0u));
        const int t = w.start + c * C;
#pragma unroll
        for (int kb = 0; kb < cfg::KB; kb++) {
            fqla_tma_load_4d(st + cfg::oK + kb * cfg::KQ, &tmK, &b.full[s], 64 * kb, w.hq, t, bc);
            fqla_tma_load_4d(st + cfg::oQ + kb * cfg::KQ, &tmQ, &b.full[s], 64 * kb, w.hq, t, bc);
        }
#pragma unroll
        for (int i = 0; i < NWG; i++)
            fqla_tma_load_4d(st + cfg::oV + i * TILE, &tmV, &b.full[s], w.vbase + 64 * i, w.hv, t, bc);
    };
    const int early = min(w.nch, cfg::QST); /* stages free from the start */
    for (int c = 0; c < early; c++) inputs(c);
    fqla_pdl_wait(); /* the prepare kernel's Ag and gamma */
    for (int c = 0; c < w.nch; c++) {
        if (c >= early) inputs(c);
        const int s = fqla_pipe<cfg::QST>::at(c).stage;
        unsigned char *st = sm + s * cfg::stage;
        const int64_t sh = (w.slot0 + c) * p.HV + w.hv;
        fqla_fwd_load_ag(st + cfg::oAg, tmA, &b.full[s], sh);
        fqla_bulk_load(st + cfg::oGam, p.gam + sh * C, 256, &b.full[s]);
        if constexpr (L2N) /* the prepare kernel's rk (the q/k head's) */
            fqla_bulk_load(st + cfg::oRk, p.rk + ((w.slot0 + c) * p.H + w.hq) * C, 256, &b.full[s]);
    }
}

/* The Pg warpgroup: per chunk, Q K^T from the stage's tiles, then Pg =
 * scale Gamma (.) tril(Q K^T) and the chain's token factors into the Pg
 * slot. */
template <typename T, int KD, int NWG, bool L2N>
__device__ __forceinline__ void fu_pg(const fqla_fwd_params &p, unsigned char *sm, const fu_bars &b,
                                      const fu_work &w)
{
    typedef fu_cfg<KD, NWG> cfg;
    typedef fqla_io<T> io;
    typedef fqla_wg<T> mma;
    const int tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, tq = lane & 3;
    for (int c = 0; c < w.nch; c++) {
        const fqla_pipe<cfg::QST> ps = fqla_pipe<cfg::QST>::at(c);
        const fqla_pipe<cfg::ASL> pa = fqla_pipe<cfg::ASL>::at(c);
        const int s = ps.stage, a = pa.stage;
        const unsigned char *st = sm + s * cfg::stage;
        unsigned char *sl = sm + cfg::oSlots + a * cfg::slot;
        const int nvalid = min(C, w.len - c * C);
        fqla_mbar_wait(&b.full[s], ps.phase);
        if constexpr (PG_AIM > 0) {
            /* chunk c's Q K^T behind chunk c - PG_AIM's G5 / G6, into the
             * chain's output stretch, not beside its G2 */
            if (c >= PG_AIM) {
                const fqla_pipe<cfg::ASL> pm = fqla_pipe<cfg::ASL>::at(c - PG_AIM);
                fqla_mbar_wait(&b.aim[pm.stage], pm.phase);
            }
        }

        float accQK[32];
        fqla_wg_fence();
#pragma unroll
        for (int kk = 0; kk < KD / 16; kk++) {
            const uint64_t dK = fqla_desc_kmajor(st + cfg::oK + (kk >> 2) * cfg::KQ) + (kk & 3) * FQLA_DESC_K16_KMAJOR;
            const uint64_t dQ = fqla_desc_kmajor(st + cfg::oQ + (kk >> 2) * cfg::KQ) + (kk & 3) * FQLA_DESC_K16_KMAJOR;
            mma::template ss64<0, 0>(accQK, dQ, dK, kk > 0);
        }
        fqla_wg_commit();
        /* l2norm: rq of this warp's 16 rows (two lanes per row) from the
         * Q tile while Q K^T runs; rk came with the stage. (Formed instead
         * for the next chunk after pready, where that stage had landed, the
         * kernel ran 2-14 % longer on the H200; by two producer warps at 24
         * registers, 8-28 %.) */
        float rq = 1.f;
        if constexpr (L2N) rq = fqla_row_rnorm<T, KD>(st + cfg::oQ, cfg::KQ, 16 * warp + (lane >> 1), lane & 1);
        /* the slot: the chain is done with chunk c - 2 */
        fqla_mbar_wait(&b.pfree[a], pa.empty_parity());
        const float *gam = reinterpret_cast<const float *>(st + cfg::oGam);
        const float *rks = reinterpret_cast<const float *>(st + cfg::oRk); /* (L2N) */
        if constexpr (L2N) {
            /* the chain's token factors: each warp its rows' */
            if (!(lane & 1)) {
                const int t = 16 * warp + (lane >> 1);
                fqla_chain::token_factors(reinterpret_cast<float2 *>(sl + cfg::sFac),
                                          reinterpret_cast<float *>(sl + cfg::sFac + 512), gam, t, gam[C - 1], rq,
                                          rks[t], p.scale);
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

        /* Pg = scale Gamma (.) tril(QK), this warp's 16 rows; rows and
         * columns past the sequence end are zeros. l2norm: QK's entries
         * times rq_i rk_j */
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
        fqla_mbar_arrive(&b.empty[s]); /* this thread's reads of the stage are done */
        fqla_fence_async_smem();       /* Pg: read by the chain's wgmma */
        fqla_mbar_arrive(&b.pready[a]);
    }
}

/* Chain warpgroup cw: the chain over the span's chunks, each chunk's
 * output rows stored during the next chunk's G2, then the final state. */
template <typename T, int KD, int NWG>
__device__ __forceinline__ void fu_chain(const fqla_fwd_params &p, const CUtensorMap &tmO, unsigned char *sm,
                                         const fu_bars &b, const fu_work &w, int cw)
{
    typedef fu_cfg<KD, NWG> cfg;
    const int tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, tq = lane & 3;
    const int v0 = w.vbase + 64 * cw;
    constexpr int NS = KD / 2;
    constexpr int KS = KD / 16;
    const int vr = v0 + 16 * warp + g, kc = 2 * tq;
    float S[NS];
    fqla_chain::load_state(p, S, w.ns, w.hv, vr, kc);

    T *ob = (T *)p.o + w.batch * p.o_sb + w.hv * p.o_sh + v0;
    unsigned char *Obuf = sm + cfg::oO + cw * cfg::OT * TILE; /* this warpgroup's output staging tiles */
    /* chunk cc's output rows to o (fwd_chain.cuh), issued while the next
     * chunk's G2 runs, so the barrier and the store are off the chain's
     * path */
    auto store_out = [&](int cc) {
        fqla_chain::store_out<T, int, cfg::OT>(p, &tmO, Obuf, ob, cc, w.start, w.len, v0, w.hv, w.batch, cw, tid);
    };

    for (int c = 0; c < w.nch; c++) {
        const fqla_pipe<cfg::QST> ps = fqla_pipe<cfg::QST>::at(c);
        const fqla_pipe<cfg::ASL> pa = fqla_pipe<cfg::ASL>::at(c);
        const int s = ps.stage, a = pa.stage;
        unsigned char *st = sm + s * cfg::stage, *sl = sm + cfg::oSlots + a * cfg::slot;
        fqla_mbar_wait(&b.full[s], ps.phase);
        constexpr bool pready_late = cfg::BIG && BIG_PREADY_LATE;
        if (!pready_late) fqla_mbar_wait(&b.pready[a], pa.phase);
        const int nvalid = (int)min(C, w.len - c * C);
        if (!pready_late && nvalid < C) {
            /* rows past the end: zero K (warpgroup 1) and this V slice (the
             * Pg warpgroup has read K already: it signalled pready after) */
            fqla_chain::zero_rows(st + cfg::oK, cfg::KB, cfg::KQ, cw == 0, st + cfg::oV + cw * TILE, nvalid, tid);
            fqla_bar_sync(fqla_chain_bar::chains, 128 * NWG);
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
            fqla_bar_sync(fqla_chain_bar::state, 128);
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
                 * through Ag's zeros (0 * NaN). accU[i]: token 16 (i / 8) +
                 * 8 ((i / 4) % 2) + 2 tq + i % 2 */
#pragma unroll
                for (int i = 0; i < 32; i++)
                    if (16 * (i >> 3) + 8 * ((i >> 2) & 1) + 2 * tq + (i & 1) >= nvalid) accU[i] = 0.f;
            }
            if (pready_late) {
                /* the factors; and the Pg warpgroup has read K (G2 above
                 * read rows past the end as they are: they reach only U's
                 * rows past the end, which G5's zeroed K rows and Pg's zero
                 * columns drop) */
                fqla_mbar_wait(&b.pready[a], pa.phase);
                if (nvalid < C) {
                    fqla_chain::zero_rows(st + cfg::oK, cfg::KB, cfg::KQ, true, st + cfg::oV, nvalid, tid);
                    fqla_bar_sync(fqla_chain_bar::chains, 128);
                }
            }
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
            if constexpr (PG_AIM > 0)
                if (tid == 0) fqla_mbar_arrive(&b.aim[a]); /* the Pg warpgroup may issue chunk c + PG_AIM's Q K^T */
            fqla_wg_wait<0>();
            fqla_reg_fence(accP);
            fqla_mbar_arrive(&b.empty[s]); /* the stage and */
            fqla_mbar_arrive(&b.pfree[a]); /* the slot are no longer read by this thread */

            /* one staging tile: chunk c - 1's store (issued by store_out
             * during this chunk's G2) must have read it */
            if (tid == 0) fqla_bulk_wait_read<0>();
            fqla_bar_sync(fqla_chain_bar::out, 128, cw);
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
            /* G1: Vd^T = V^T Ag^T, then G4: Vd^T += (-U^T diag(u)) Ag^T */
            fqla_chain::g14_issue<T>(accVd, accUQ, ud, tq, st + cfg::oV + cw * TILE, dAg);
            {
                const float eC = __expf(gC);
#pragma unroll
                for (int i = 0; i < NS; i++) S[i] *= eC;
            }
            fqla_wg_wait<0>();
            fqla_reg_fence(accVd);

            uint32_t vd[4][4], vp[4][4];
            fqla_chain::g56_ready<T>(vd, vp, accVd, ud, tq, S);
            fqla_chain::g5_issue<T, KD>(S, vp, fqla_desc_mnmajor(st + cfg::oK, cfg::KQ)); /* G5 */
            fqla_wg_commit();
            float accP[32];
            fqla_chain::g6_issue<T>(accP, vd, fqla_desc_kmajor(sl + cfg::sPg)); /* G6 */
            fqla_wg_commit();
            if constexpr (PG_AIM > 0)
                if (tid == 0) fqla_mbar_arrive(&b.aim[a]); /* the Pg warpgroup may issue chunk c + PG_AIM's Q K^T */
            float fo[16];
            fqla_chain::load_out_factors(fo, fos, tq);
            fqla_wg_wait<0>();
            fqla_reg_fence(S);
            fqla_reg_fence(accUQ);
            fqla_reg_fence(accP);
            fqla_mbar_arrive(&b.empty[s]); /* the stage and */
            fqla_mbar_arrive(&b.pfree[a]); /* the slot are no longer read by this thread */

            /* O^T = Qs^T diag(o) + P^T -> staging tile c & 1 as [t][v]
             * (stmatrix.trans); chunk c - 2's store has read it (store_out(c - 1)
             * waited for that before its barrier) */
            fqla_chain::output_tile<T>(Obuf + (c & 1) * TILE, fo, accUQ + 32, accP, warp, lane);
        }
    }
    if (w.nch > 0) store_out(w.nch - 1);
    if (tid == 0) fqla_bulk_wait<0>(); /* the CTA's last stores are done before it exits */

    /* the final state: of the sequence (with CP, from its last segment) */
    if (p.ht && w.last) fqla_chain::store_state(p, S, w.n, w.hv, vr, kc);
}

template <typename T, int KD, int NWG_, bool L2N>
__global__ void __launch_bounds__(fu_cfg<KD, NWG_>::THREADS, 1)
    fwd_fused_kernel(const __grid_constant__ fqla_fwd_params p, const __grid_constant__ CUtensorMap tmQ,
                     const __grid_constant__ CUtensorMap tmK, const __grid_constant__ CUtensorMap tmV,
                     const __grid_constant__ fqla_fwd_ag_maps tmA, const __grid_constant__ CUtensorMap tmO)
{
    typedef fu_cfg<KD, NWG_> cfg;
    constexpr int NWG = cfg::NWG;
    extern __shared__ unsigned char smem_raw[];
    /* fu_smem, 1024-aligned by an offset from smem_raw (fwd_chunk_wg.cu says why) */
    unsigned char *sm = smem_raw + ((1024u - (fqla_smem_u32(smem_raw) & 1023u)) & 1023u);
    uint64_t *full = reinterpret_cast<uint64_t *>(sm + cfg::oBar), *empty = full + cfg::QST;
    uint64_t *pready = empty + cfg::QST, *pfree = pready + cfg::ASL, *aim = pfree + cfg::ASL;
    const fu_bars bars = {full, empty, pready, pfree, aim};
    /* Launched with PDL after the prepare kernel. Only its outputs (Ag and
     * gamma in the workspace) need it finished: the producer waits for it
     * (griddepcontrol.wait) after issuing the first stages' K, Q and V
     * copies, before the first Ag / gamma copy; the chain warpgroups load
     * h0 meanwhile. Everything else read here is the caller's input, which
     * the prepare kernel never writes (its only other write, o's rows past
     * the last sequence, no CTA here touches). */

    const int wg = threadIdx.x >> 7;
    /* the state's row: the sequence, or with CP's main pass (cp_mode 2) the
     * segment, whose start state the scan wrote (h0 = seg_s0) */
    const int64_t ns = ((int64_t)blockIdx.x + p.chain0) / p.HV;
    const int hv = (int)(((int64_t)blockIdx.x + p.chain0) % p.HV);
    const int hq = hv / p.group;
    const int vbase = blockIdx.y * 64 * NWG;
    int64_t n, batch, start64, len64, slot0;
    bool last;
    if (!fqla_fwd_span(p, ns, n, batch, start64, len64, slot0, last)) return; /* no segment: the whole CTA */
    const int start = (int)start64, len = (int)len64;
    const fu_work w = {ns, n, batch, slot0, start, len, (len + C - 1) / C, hv, hq, vbase, last};

    if (threadIdx.x == 0) fu_init<NWG, cfg::QST, cfg::ASL>(tmQ, tmK, tmV, tmA, tmO, bars);
    __syncthreads();

    if (wg == 0) {
        fqla_setmaxnreg_dec<PROD_REGS>();
        if (threadIdx.x < 32 && fqla_elect_one()) fu_load<KD, NWG, L2N>(p, tmQ, tmK, tmV, tmA, sm, bars, w);
        return;
    }
    if (wg <= NWG) {
        fqla_setmaxnreg_inc<cfg::CHAIN_REGS>();
        fu_chain<T, KD, NWG>(p, tmO, sm, bars, w, wg - 1);
    } else {
        fqla_setmaxnreg_dec<PREP_REGS>();
        fu_pg<T, KD, NWG, L2N>(p, sm, bars, w);
    }
}

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
#ifdef FQLA_DEV
    if (fqla_dev_fwd_fused_exp_mode(hb)) return fqla_dev_fwd_launch_fused_exp(k, io_bf16, hb, nwg, parts, stream, used);
#endif
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
