/*
 * fwd_chunk_wg.cu - the forward's sequential kernel on Hopper's
 * asynchronous units (sm_90a): TMA loads into a two-stage shared-memory
 * ring completed on mbarriers, wgmma for every product, a producer
 * warpgroup and NWG consumer warpgroups (setmaxnreg budgets), the fp32
 * state resident in registers. It replaces fwd_chunk.cu (mma.sync) where
 * the inputs allow TMA (K = 64 or 128, V a multiple of 64, 16-byte aligned
 * rows; fwd.cu decides) and reads the same workspace from fwd_prepare.cu.
 *
 * Consumer warpgroup w owns 64 value columns and keeps the state
 * transposed, S^T (64 x K, fp32), as a wgmma accumulator, so that S^T
 * rounded to bf16 is directly the register A operand of the products with
 * the chunk's keys and queries (FlashInfer's layout). Per chunk (t = token
 * of the chunk, u_t = e^gamma_t rk_t, o_t = scale rq_t e^gamma_t, d_t =
 * e^(gamma_C - gamma_t) rk_t; rq, rk = 1 without l2norm):
 *
 *   G1  Vd^T  = V^T Ag^T                 (SS, off the state chain)
 *   G2  [U^T | Qs^T] = S^T [K; Q]^T      (RS, one N = 128 product: the K
 *                                         and Q tiles of a 64-wide k block
 *                                         sit back to back, 128 token rows)
 *   G4  Vd^T -= (U^T diag(u)) Ag^T       (RS)   Vd = Ag (V - diag(u) K S)
 *   G5  S^T   = e^gamma_C S^T + (Vd^T diag(d)) K          (RS, K MN-major)
 *   G6  P^T   = Vd^T Pg^T                (RS)
 *       O^T   = Qs^T diag(o) + P^T       -> shared (stmatrix.trans) -> o
 *
 * The chain from one chunk's state to the next is G2 -> G4 -> G5; G1 waits
 * for no state and G6 is issued after G5. The output rows of chunk c
 * are written to global memory while chunk c + 1's first products run.
 *
 * Grid: x = sequence (or with CP segment) x value head, y = slices of
 * 64 NWG value columns (the CP pre-pass adds the K columns of the
 * transition). 128 (NWG + 1) threads:
 *   warpgroup 0, the producer (56 registers where it gives registers back):
 *     one elected thread of warp 0 issues every copy (wg_load); warp 1
 *     writes each stage's token factors (wg_factors);
 *   warpgroups 1 .. NWG, the consumers (224 registers at NWG = 2, 200 at
 *     NWG = 1): the chain, 64 value columns each (wg_chain).
 * Shared memory (wg_smem): a two-stage ring of the chunk's inputs
 * (wg_stage: K, Q, V, Ag, Pg tiles, gamma, rq, rk, the token factors), the
 * output staging tiles, and the full / empty / ready barriers per stage.
 * OUT = false is the state-only variant of the CP pre-pass: no Q, Pg or
 * output, a smaller stage, two CTAs per SM.
 *
 * Tails: a chunk past the sequence end loads the next sequence's rows (or
 * TMA's zeros at the tensor's end); the consumers zero those K and V rows in
 * shared memory before the products, so they add nothing, and the output
 * rows past the end are not stored.
 */
#include "cuda/fwd_chain.cuh"
#include "cuda/fwd_common.cuh"
#include "cuda/kernel/io.cuh"
#include "cuda/kernel/named_barrier.cuh"
#include "cuda/kernel/pipeline.cuh"
#include "cuda/ptx/ptx.cuh"

#include <stddef.h>

namespace {

constexpr int C = FQLA_FWD_CHUNK;
constexpr uint32_t TILE = C * 128; /* one [64 rows][64 b16] swizzled tile */
/* two stages: a third (it fits at NWG = 1) measured no faster on the
 * H200, so the chunk is not waiting for its loads */
constexpr int STAGES = 2;

/* One stage of the ring: a chunk's inputs. Tiles are [64 rows][64 b16] in
 * TMA's 128-byte swizzle, each 1024-aligned. */
template <int KD, int NWG, bool OUT>
struct wg_stage {
    unsigned char kq[KD / 64][OUT ? 2 : 1][TILE]; /* per 64-wide k block: the K tile, then the Q tile (OUT) */
    unsigned char v[NWG][TILE];                   /* V, 64 value columns per consumer warpgroup */
    unsigned char agpg[OUT ? 2 : 1][TILE];        /* Ag (the square tile of the packed strips), then Pg (OUT) */
    float gam[C];                                 /* gamma, the chunk-local cumsum of g */
    float rq[C];                                  /* l2norm factors (l2norm only; rq only with OUT) */
    float rk[C];
    float2 ud[C];                                 /* (u_t, d_t), written by the factor warp */
    float fo[C];                                  /* o_t, written by the factor warp */
    unsigned char pad[512];                       /* to a whole number of KB */
};

/* The CTA's shared memory, 1024-aligned. */
template <int KD, int NWG, bool OUT>
struct wg_smem {
    wg_stage<KD, NWG, OUT> stage[STAGES];
    unsigned char out[NWG][2][TILE]; /* per consumer warpgroup two [64 tokens][64 values] tiles: the o map's box */
    uint64_t full[STAGES];           /* the stage's copies landed: 1 arrival + its bytes */
    uint64_t empty[STAGES];          /* every consumer thread is done with it */
    uint64_t ready[STAGES];          /* its token factors are written: the factor warp's 32 lanes */
};
/* the state-only pre-pass: no output staging */
template <int KD, int NWG>
struct wg_smem<KD, NWG, false> {
    wg_stage<KD, NWG, false> stage[STAGES];
    uint64_t full[STAGES], empty[STAGES], ready[STAGES];
};

template <int KD, int NWG, bool OUT>
struct wg_cfg {
    typedef wg_stage<KD, NWG, OUT> stage_t;
    typedef wg_smem<KD, NWG, OUT> smem_t;
    typedef wg_smem<KD, NWG, true> smem_out_t;
    static constexpr int KB = KD / 64; /* 64-wide blocks of K */
    /* byte offsets into a stage (the kernel addresses the plan by them) */
    static constexpr uint32_t stage = sizeof(stage_t);
    static constexpr uint32_t oK = offsetof(stage_t, kq), oQ = oK + TILE;
    static constexpr uint32_t KQ = sizeof(stage_t::kq[0]); /* stride between k blocks */
    static constexpr uint32_t oV = offsetof(stage_t, v);
    static constexpr uint32_t oAg = offsetof(stage_t, agpg), oPg = oAg + TILE;
    static constexpr uint32_t oGam = offsetof(stage_t, gam), oRq = offsetof(stage_t, rq), oRk = offsetof(stage_t, rk);
    static constexpr uint32_t oUd = offsetof(stage_t, ud), oFo = offsetof(stage_t, fo);
    /* TMA bytes per stage without rq, rk: the tiles and gamma */
    static constexpr uint32_t tx_tiles = oGam + sizeof(stage_t::gam);
    /* ... and into the CTA's shared memory */
    static constexpr uint32_t oO = STAGES * stage;
    static constexpr uint32_t oBar = offsetof(smem_t, full);
    static constexpr uint32_t bytes = sizeof(smem_t) + 1024; /* + slack for the 1024 alignment */
    static constexpr int THREADS = 128 * (NWG + 1);
    /* CTAs per SM the registers are budgeted for, and the consumers' share
     * after the producer gives its registers back (setmaxnreg) */
    static constexpr int MINB = OUT ? 1 : 2;
    static constexpr bool REALLOC = NWG == 2 || !OUT;
    static constexpr int PROD_REGS = 56;
    static constexpr int CREG = NWG == 2 ? 224 : 200;

    static_assert(stage % 1024 == 0 && oV % 1024 == 0 && oAg % 1024 == 0, "every stage's tiles 1024-aligned");
    static_assert(oRq == oGam + 256 && oRk == oRq + 256, "gamma, rq, rk: 256-byte bulk copies back to back");
    static_assert(oFo == oUd + 512, "o_t after (u_t, d_t)");
    static_assert(!OUT || offsetof(smem_out_t, out) == oO, "the output tiles after the ring");
    static_assert(offsetof(smem_t, empty) == oBar + 8 * STAGES && offsetof(smem_t, ready) == oBar + 16 * STAGES,
                  "full, empty, ready back to back");
    static_assert(MINB * (bytes + 1024) <= 233472, "MINB CTAs' shared memory per SM");
    static_assert(!REALLOC || PROD_REGS * 128 + CREG * 128 * NWG <= 65536 / MINB, "the register budgets fit");
};

/* The ring's barriers (wg_smem's). */
struct wg_bars {
    uint64_t *full, *empty, *ready;
};

/* What one CTA runs: the state's row ns (the sequence, or with cp_mode the
 * segment) with its sequence n, token span, chunk slots and chunks; the
 * value head, its q/k head and the CTA's first value column. */
struct wg_work {
    int64_t ns, n, batch, start, len, slot0, nch;
    int hv, hq, vbase;
    bool last;
};

/* Thread 0: the maps prefetched, the barriers initialised. */
template <int NWG, bool OUT>
__device__ __forceinline__ void wg_init(const CUtensorMap &tmQ, const CUtensorMap &tmK, const CUtensorMap &tmV,
                                        const fqla_fwd_ag_maps &tmA, const CUtensorMap &tmP, const CUtensorMap &tmO,
                                        const wg_bars &b)
{
    fqla_tma_prefetch(&tmQ);
    fqla_tma_prefetch(&tmK);
    fqla_tma_prefetch(&tmV);
    for (int w = 0; w < 4; w++) fqla_tma_prefetch(&tmA.strip[w]);
    if (OUT) fqla_tma_prefetch(&tmP); /* (not encoded without Pg) */
    if (OUT) fqla_tma_prefetch(&tmO);
    for (int s = 0; s < STAGES; s++) {
        fqla_mbar_init(&b.full[s], 1);
        /* every consumer thread: each arrive then orders that thread's own
         * reads of the stage before the next lap's writes. (A lane-0 arrive
         * after __syncwarp orders them too, but compute-sanitizer's
         * racecheck does not follow __syncwarp, and reported every read of
         * the stage's gamma and token factors against the next lap's
         * writes.) */
        fqla_mbar_init(&b.empty[s], 128 * NWG);
        fqla_mbar_init(&b.ready[s], 32); /* every lane of the factor warp */
    }
    fqla_mbar_init_fence();
}

/* The producer's elected thread: every copy of every stage, the caller's
 * inputs (K, Q, V) of the first stages before the grid wait. */
template <int KD, int NWG, bool OUT>
__device__ __forceinline__ void wg_load(const fqla_fwd_params &p, const CUtensorMap &tmQ, const CUtensorMap &tmK,
                                        const CUtensorMap &tmV, const fqla_fwd_ag_maps &tmA, const CUtensorMap &tmP,
                                        unsigned char *sm, const wg_bars &b, const wg_work &w)
{
    typedef wg_cfg<KD, NWG, OUT> cfg;
    const int bc = p.varlen ? 0 : (int)w.batch;
    /* rq only with an output; rk scales the keys of the state chain */
    const uint32_t tx = cfg::tx_tiles + (p.l2norm ? (OUT ? 512u : 256u) : 0u);
    /* chunk c's K, Q, V (the caller's inputs) into its stage, the whole
     * stage's bytes announced on full[s] */
    auto inputs = [&](int64_t c) {
        const fqla_pipe<STAGES> ps = fqla_pipe<STAGES>::at(c);
        const int s = ps.stage;
        fqla_mbar_wait(&b.empty[s], ps.empty_parity());
        unsigned char *st = sm + s * cfg::stage;
        fqla_mbar_arrive_tx(&b.full[s], tx);
        const int t = (int)(w.start + c * C);
#pragma unroll
        for (int kb = 0; kb < cfg::KB; kb++) {
            fqla_tma_load_4d(st + cfg::oK + kb * cfg::KQ, &tmK, &b.full[s], 64 * kb, w.hq, t, bc);
            if (OUT) fqla_tma_load_4d(st + cfg::oQ + kb * cfg::KQ, &tmQ, &b.full[s], 64 * kb, w.hq, t, bc);
        }
#pragma unroll
        for (int i = 0; i < NWG; i++)
            fqla_tma_load_4d(st + cfg::oV + i * TILE, &tmV, &b.full[s], w.vbase + 64 * i, w.hv, t, bc);
    };
    const int64_t early = w.nch < STAGES ? w.nch : STAGES; /* stages free from the start */
    for (int64_t c = 0; c < early; c++) inputs(c);
    fqla_pdl_wait(); /* the prepare kernel's outputs (a no-op if waited before) */
    for (int64_t c = 0; c < w.nch; c++) {
        if (c >= early) inputs(c);
        const int s = fqla_pipe<STAGES>::at(c).stage;
        unsigned char *st = sm + s * cfg::stage;
        const int64_t sh = (w.slot0 + c) * p.HV + w.hv;
        fqla_fwd_load_ag(st + cfg::oAg, tmA, &b.full[s], sh);
        if (OUT) fqla_tma_load_2d(st + cfg::oPg, &tmP, &b.full[s], 0, (int)(sh * C));
        fqla_bulk_load(st + cfg::oGam, p.gam + sh * C, 256, &b.full[s]);
        if (p.l2norm) {
            const int64_t qh = ((w.slot0 + c) * p.H + w.hq) * C;
            if (OUT) fqla_bulk_load(st + cfg::oRq, p.rq + qh, 256, &b.full[s]);
            fqla_bulk_load(st + cfg::oRk, p.rk + qh, 256, &b.full[s]);
        }
    }
}

/* Producer warp 1: the token factors of each stage, once per CTA instead
 * of once per consumer thread; lane l does tokens 2 l, 2 l + 1. */
template <int KD, int NWG, bool OUT>
__device__ __forceinline__ void wg_factors(const fqla_fwd_params &p, unsigned char *sm, const wg_bars &b,
                                           const wg_work &w)
{
    typedef wg_cfg<KD, NWG, OUT> cfg;
    const int lane = threadIdx.x & 31;
    for (int64_t c = 0; c < w.nch; c++) {
        const fqla_pipe<STAGES> ps = fqla_pipe<STAGES>::at(c);
        const int s = ps.stage;
        /* empty first: the consumers' reads of the last lap's factors are
         * then ordered before these writes by an mbarrier this warp waits
         * on itself (it already follows through the producer's wait and the
         * copy's completion, which compute-sanitizer's racecheck does not
         * track) */
        fqla_mbar_wait(&b.empty[s], ps.empty_parity());
        fqla_mbar_wait(&b.full[s], ps.phase);
        unsigned char *st = sm + s * cfg::stage;
        const float *gm = reinterpret_cast<const float *>(st + cfg::oGam);
        float2 *ud = reinterpret_cast<float2 *>(st + cfg::oUd);
        float *fo = reinterpret_cast<float *>(st + cfg::oFo);
        const float gC = gm[C - 1];
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int t = 2 * lane + e;
            float rq = 1.f, rk = 1.f;
            if (p.l2norm) {
                if (OUT) rq = reinterpret_cast<const float *>(st + cfg::oRq)[t];
                rk = reinterpret_cast<const float *>(st + cfg::oRk)[t];
            }
            fqla_chain::token_factors(ud, fo, gm, t, gC, rq, rk, p.scale);
        }
        fqla_mbar_arrive(&b.ready[s]);
    }
}

/* Consumer warpgroup cw: the chain over the span's chunks, then the final
 * state. */
template <typename T, int KD, int NWG, bool OUT>
__device__ __forceinline__ void wg_chain(const fqla_fwd_params &p, const CUtensorMap &tmO, unsigned char *sm,
                                         const wg_bars &b, const wg_work &w, int cw)
{
    typedef wg_cfg<KD, NWG, OUT> cfg;
    const int tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, tq = lane & 3;
    const int v0 = w.vbase + 64 * cw;
    constexpr int NS = KD / 2; /* state accumulators per thread */
    constexpr int KS = KD / 16; /* k-steps over K */

    /* S^T: value rows vr (+ 8), key columns kc (+ 1, + 8 ...): fwd_chain.cuh */
    const int vr = v0 + 16 * warp + g, kc = 2 * tq;
    float S[NS];
    if (p.cp_mode == 1 && v0 >= p.V) { /* V and v0 are multiples of 64: the whole warpgroup */
#pragma unroll
        for (int i = 0; i < NS; i++) /* the transition's columns start from I */
            S[i] = vr + 8 * ((i >> 1) & 1) - p.V == kc + 8 * (i >> 2) + (i & 1) ? 1.f : 0.f;
    } else {
        fqla_chain::load_state(p, S, w.ns, w.hv, vr, kc);
    }

    T *ob = OUT ? (T *)p.o + w.batch * p.o_sb + w.hv * p.o_sh + v0 : NULL;
    unsigned char *Obuf = sm + cfg::oO + cw * 2 * TILE; /* this warpgroup's two staging tiles (OUT) */
    /* chunk cc's output rows to o (fwd_chain.cuh) */
    auto store_out = [&](int64_t cc) {
        fqla_chain::store_out(p, &tmO, Obuf, ob, cc, w.start, w.len, v0, w.hv, w.batch, cw, tid);
    };

    for (int64_t c = 0; c < w.nch; c++) {
        const fqla_pipe<STAGES> ps = fqla_pipe<STAGES>::at(c);
        const int s = ps.stage;
        unsigned char *st = sm + s * cfg::stage;
        fqla_mbar_wait(&b.full[s], ps.phase);
        fqla_mbar_wait(&b.ready[s], ps.phase);
        const int nvalid = (int)min((int64_t)C, w.len - c * C);
        if (nvalid < C) {
            /* rows past the end: zero K (consumer 0) and this V slice */
            fqla_chain::zero_rows(st + cfg::oK, cfg::KB, cfg::KQ, cw == 0, st + cfg::oV + cw * TILE, nvalid, tid);
            fqla_bar_sync(fqla_chain_bar::chains, 128 * NWG);
        }
        const float *gm = reinterpret_cast<const float *>(st + cfg::oGam);
        const float2 *ud = reinterpret_cast<const float2 *>(st + cfg::oUd);
        const float *fos = reinterpret_cast<const float *>(st + cfg::oFo);

        /* S^T in the io dtype: the A operand of G2 */
        uint32_t sf[KS][4];
        fqla_chain::pack_state<T>(sf, S);
        float accVd[32], accUQ[OUT ? 64 : 32]; /* accUQ[0..31] = U^T, [32..63] = Qs^T */
        const uint64_t dAg = fqla_desc_kmajor(st + cfg::oAg);
        fqla_reg_fence_u(sf);
        fqla_wg_fence();
        /* G1, then G2 (U^T = S^T K^T alone without an output) */
        fqla_chain::g1_issue<T>(accVd, fqla_desc_mnmajor(st + cfg::oV + cw * TILE, TILE), dAg);
        fqla_wg_commit();
        fqla_chain::g2_issue<T, KS, OUT ? 128 : 64>(accUQ, sf, st + cfg::oK, cfg::KQ);
        fqla_wg_commit();
        if (OUT) store_out(c - 1); /* the previous chunk's rows, while G1 / G2 run */

        /* this thread's token columns are t = 8 j + 2 tq + e (j = 0..7, e = 0, 1) */
        const float gC = gm[C - 1];

        fqla_wg_wait<0>();
        fqla_reg_fence(accUQ);
        fqla_reg_fence(accVd);
        /* G4: Vd^T += (-U^T diag(u)) Ag^T */
        {
            uint32_t wn[4][4];
            fqla_chain::g4_operand<T>(wn, accUQ, ud, tq);
            fqla_reg_fence_u(wn);
            fqla_wg_fence();
            fqla_chain::g4_issue<T>(accVd, wn, dAg);
            fqla_wg_commit();
        }
        {   /* the state decays by e^gamma_C before G5 adds to it, while G4
             * runs (S is no operand of it) */
            const float eC = __expf(gC);
#pragma unroll
            for (int i = 0; i < NS; i++) S[i] *= eC;
        }
        fqla_wg_wait<0>();
        fqla_reg_fence(accVd);

        /* Vd (for G6) and Vp = Vd diag(d) (for G5) as A fragments */
        uint32_t vd[4][4], vp[4][4];
        fqla_chain::g56_ready<T>(vd, vp, accVd, ud, tq, S);
        /* G5 (the K tiles' atoms KB tiles apart) */
        fqla_chain::g5_issue<T, KD>(S, vp, fqla_desc_mnmajor(st + cfg::oK, cfg::KQ));
        fqla_wg_commit();
        if constexpr (!OUT) {
            fqla_wg_wait<0>();
            fqla_reg_fence(S);
            fqla_mbar_arrive(&b.empty[s]);
        } else {
            float accP[32];
            fqla_chain::g6_issue<T>(accP, vd, fqla_desc_kmajor(st + cfg::oPg)); /* G6 */
            fqla_wg_commit();
            /* output factors while the products run */
            float fo[16];
            fqla_chain::load_out_factors(fo, fos, tq);
            fqla_wg_wait<0>();
            fqla_reg_fence(S);
            fqla_reg_fence(accUQ);
            fqla_reg_fence(accP);
            fqla_mbar_arrive(&b.empty[s]); /* stage s is no longer read by this thread */

            /* O^T = Qs^T diag(o) + P^T -> staging tile c & 1 as [t][v] */
            fqla_chain::output_tile<T>(Obuf + (c & 1) * TILE, fo, accUQ + 32, accP, warp, lane);
        }
    }
    if (OUT && w.nch > 0) store_out(w.nch - 1);
    if (OUT && tid == 0) fqla_bulk_wait<0>(); /* the CTA's last stores are done before it exits */

    /* the final state: of the sequence, or with CP's main pass of the
     * sequence's last segment (the pre-pass: of every segment it runs) */
    if (p.ht && (p.cp_mode != 2 || w.last)) fqla_chain::store_state(p, S, p.cp_mode == 2 ? w.n : w.ns, w.hv, vr, kc);
}

template <typename T, int KD, int NWG, bool OUT>
__global__ void __launch_bounds__(128 * (NWG + 1), wg_cfg<KD, NWG, OUT>::MINB)
    fwd_chunk_wg_kernel(const __grid_constant__ fqla_fwd_params p, const __grid_constant__ CUtensorMap tmQ,
                        const __grid_constant__ CUtensorMap tmK, const __grid_constant__ CUtensorMap tmV,
                        const __grid_constant__ fqla_fwd_ag_maps tmA, const __grid_constant__ CUtensorMap tmP,
                        const __grid_constant__ CUtensorMap tmO)
{
    typedef wg_cfg<KD, NWG, OUT> cfg;
    extern __shared__ unsigned char smem_raw[];
    /* wg_smem, 1024-aligned (TMA's 128-byte swizzle) by an offset from
     * smem_raw, not a round trip through an integer: the compiler then still
     * knows every pointer below is shared and emits LDS / STS, not generic
     * LD / ST (the factor loads sit on the chain) */
    unsigned char *sm = smem_raw + ((1024u - (fqla_smem_u32(smem_raw) & 1023u)) & 1023u);
    uint64_t *full = reinterpret_cast<uint64_t *>(sm + cfg::oBar);
    const wg_bars bars = {full, full + STAGES, full + 2 * STAGES};
    /* Launched with PDL after the prepare kernel (CP's kernels launch
     * plainly, p.pdl = 0, where this wait is a no-op). Only the prepare
     * kernel's outputs (Ag, Pg, gamma, rq, rk) need it finished: without CP
     * the producer waits after issuing the first stages' K, Q, V copies,
     * and h0 (the caller's) loads meanwhile; CP's passes wait here, before
     * the segment flags and chunk_ok are read. Let the next kernel's launch
     * begin. */
    if (p.cp_mode) fqla_pdl_wait();
    fqla_pdl_trigger();

    /* the work: the state's row ns (the sequence, or with cp_mode the
     * segment), its span, value head and slice */
    const int wg = threadIdx.x >> 7;
    const int64_t ns = blockIdx.x / p.HV;
    const int hv = blockIdx.x % p.HV;
    const int hq = hv / p.group;
    const int vbase = blockIdx.y * 64 * NWG;
    int64_t n, batch, start, len, slot0;
    bool last;
    /* The pre-pass leaves out each sequence's last segment: the scan needs
     * no H or M of it, and the main pass runs it on to the final state. */
    /* The final state alone after CP's scan runs only each sequence's last
     * segment, from its scanned start state. */
    if (!fqla_fwd_span(p, ns, n, batch, start, len, slot0, last) || (p.cp_mode == 1 && last) ||
        (p.state_only && p.cp_mode == 2 && !last)) {
        /* no segment, or the last: a defined flag all the same */
        if (!OUT && p.cp_skip && vbase == p.V && threadIdx.x == 0) p.seg_flag[ns * p.HV + hv] = 0;
        return;
    }
    if (!OUT && p.cp_skip && vbase >= p.V) {
        /* pre-pass, transition columns: a negligible M is left out and
         * flagged for the scan (one flag per segment and head, written by
         * the first such slice; every slice decides alike) */
        const int neg = fqla_cp_m_negligible(p, len, slot0, hv);
        if (threadIdx.x == 0 && vbase == p.V) p.seg_flag[ns * p.HV + hv] = neg;
        if (neg) return;
    }
    const wg_work w = {ns, n, batch, start, len, slot0, (len + C - 1) / C, hv, hq, vbase, last};

    if (threadIdx.x == 0) wg_init<NWG, OUT>(tmQ, tmK, tmV, tmA, tmP, tmO, bars);
    __syncthreads();

    if (wg == 0) {
        if (cfg::REALLOC) fqla_setmaxnreg_dec<cfg::PROD_REGS>();
        if (threadIdx.x < 32 && fqla_elect_one()) wg_load<KD, NWG, OUT>(p, tmQ, tmK, tmV, tmA, tmP, sm, bars, w);
        else if ((threadIdx.x >> 5) == 1) wg_factors<KD, NWG, OUT>(p, sm, bars, w);
        return;
    }
    if (cfg::REALLOC) fqla_setmaxnreg_inc<cfg::CREG>();
    wg_chain<T, KD, NWG, OUT>(p, tmO, sm, bars, w, wg - 1);
}

template <typename T, int KD, int NWG, bool OUT>
cudaError_t launch(const fqla_fwd_params &p, const CUtensorMap *maps, const fqla_fwd_ag_maps &ag, cudaStream_t stream)
{
    typedef wg_cfg<KD, NWG, OUT> cfg;
    static fqla_smem_cache cache;
    cudaError_t err = fqla_smem_limit(cache, fwd_chunk_wg_kernel<T, KD, NWG, OUT>, cfg::bytes);
    if (err != cudaSuccess) return err;
    /* rows: sequences, or segment indices; columns: V slices (with the
     * pre-pass also the K columns of the transition) */
    const int64_t rows = p.cp_mode ? p.segs : p.N;
    const int64_t cols = p.cp_mode == 1 ? p.V + p.K : p.V;
    dim3 grid((unsigned)(rows * p.HV), (unsigned)(cols / (64 * NWG)));
    return fqla_launch(fwd_chunk_wg_kernel<T, KD, NWG, OUT>, grid, dim3(cfg::THREADS), cfg::bytes, stream, p.pdl, p,
                           maps[0], maps[1], maps[2], ag, maps[3], maps[4]);
}

template <typename T>
cudaError_t launch_t(const fqla_fwd_params &p, int nwg, const CUtensorMap *maps, const fqla_fwd_ag_maps &ag,
                     cudaStream_t stream)
{
    /* the state-only variant: CP's pre-pass, and the final state alone (one
     * warpgroup, two CTAs per SM) */
    if (p.cp_mode == 1 || p.state_only)
        return p.K == 128 ? launch<T, 128, 1, false>(p, maps, ag, stream) : launch<T, 64, 1, false>(p, maps, ag, stream);
    if (p.K == 128)
        return nwg == 2 ? launch<T, 128, 2, true>(p, maps, ag, stream) : launch<T, 128, 1, true>(p, maps, ag, stream);
    return nwg == 2 ? launch<T, 64, 2, true>(p, maps, ag, stream) : launch<T, 64, 1, true>(p, maps, ag, stream);
}

} // namespace

cudaError_t fqla_fwd_launch_chunk_wg(const fqla_fwd_params &p, int io_bf16, int nwg, cudaStream_t stream,
                                     int *used)
{
    *used = 0;
    if (p.N * p.HV == 0) return cudaSuccess;
    CUtensorMap maps[FQLA_FWD_MAPS];
    fqla_fwd_ag_maps ag;
    if (!fqla_fwd_tma_maps(p, io_bf16, maps, &ag)) return cudaSuccess; /* the caller runs the mma.sync kernel */
    *used = 1;
    return io_bf16 ? launch_t<__nv_bfloat16>(p, nwg, maps, ag, stream) : launch_t<__half>(p, nwg, maps, ag, stream);
}
