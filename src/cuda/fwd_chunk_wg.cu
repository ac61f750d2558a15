/*
 * fwd_chunk_wg.cu - the forward's sequential kernel on Hopper's
 * asynchronous units (sm_90a): TMA loads into a two-stage shared-memory
 * ring completed on mbarriers, wgmma for every product, a producer
 * warpgroup and NWG consumer warpgroups (setmaxnreg budgets), the fp32
 * state resident in registers. It replaces fwd_chunk.cu (mma.sync) where
 * the inputs allow TMA (K = 64 or 128, V a multiple of 64, 16-byte aligned
 * rows; fwd.cu decides) and reads the same workspace from fwd_prepare.cu.
 *
 * One CTA per (sequence, value head, 64 * NWG columns of V); consumer
 * warpgroup w owns 64 value columns and keeps the state transposed,
 * S^T (64 x K, fp32), as a wgmma accumulator, so that S^T rounded to bf16 is
 * directly the register A operand of the products with the chunk's keys and
 * queries (FlashInfer's layout). Per chunk (t = token of the chunk,
 * u_t = e^gamma_t rk_t, o_t = scale rq_t e^gamma_t, d_t = e^(gamma_C -
 * gamma_t) rk_t; rq, rk = 1 without l2norm):
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
 * Tails: a chunk past the sequence end loads the next sequence's rows (or
 * TMA's zeros at the tensor's end); the consumers zero those K and V rows in
 * shared memory before the products, so they add nothing, and the output
 * rows past the end are not stored.
 */
#include "cuda/fwd_chain.cuh"
#include "cuda/fwd_common.cuh"
#include "cuda/fwd_ptx.cuh"
#include "cuda/hopper.cuh"
#include "cuda/pdl.cuh"

namespace {

constexpr int C = FQLA_FWD_CHUNK;
constexpr uint32_t TILE = C * 128; /* one [64 rows][64 b16] swizzled tile */

/* OUT = false: the state-only variant of the CP pre-pass (no Q, Pg or
 * output: a smaller stage, so two CTAs share an SM). */
template <int KD, int NWG, bool OUT>
struct wg_cfg {
    static constexpr int KB = KD / 64; /* 64-wide blocks of K */
    /* one pipeline stage (bytes from the stage base; tiles 1024-aligned) */
    /* per 64-wide k block kb: the K tile, then the Q tile (token rows) */
    static constexpr uint32_t oK = 0;
    static constexpr uint32_t oQ = TILE;
    static constexpr uint32_t KQ = (OUT ? 2 : 1) * TILE; /* stride between k blocks */
    static constexpr uint32_t oV = KB * KQ;             /* [NWG] tiles, 64 value columns each */
    static constexpr uint32_t oAg = oV + NWG * TILE;
    static constexpr uint32_t oPg = oAg + TILE;
    static constexpr uint32_t oGam = oPg + (OUT ? TILE : 0); /* float[64] gamma */
    static constexpr uint32_t oRq = oGam + 256;         /* float[64] (l2norm) */
    static constexpr uint32_t oRk = oRq + 256;
    static constexpr uint32_t oFac = oRk + 256;         /* float2[64] (u_t, d_t), float[64] o_t */
    static constexpr uint32_t tx_tiles = oGam + 256;    /* TMA bytes per stage without rq, rk */
    static constexpr uint32_t stage = (oFac + 3 * 256 + 1023) / 1024 * 1024;
    /* two stages: a third (it fits at NWG = 1) measured no faster, so the
     * chunk is not waiting for its loads (docs/perf.md v5) */
    static constexpr int STAGES = 2;
    /* output staging: [NWG][2] tiles of [64 tokens][64 values] b16 in TMA's
     * 128-byte swizzle (the o map's box) */
    static constexpr uint32_t oO = STAGES * stage;
    static constexpr uint32_t oBar = oO + (OUT ? NWG * 2 * TILE : 0);
    static constexpr uint32_t bytes = oBar + 3 * STAGES * 8 + 1024; /* + slack for the 1024 alignment */
    static constexpr int THREADS = 128 * (NWG + 1);
    /* CTAs per SM the registers are budgeted for, and the consumers' share
     * after the producer gives its registers back (setmaxnreg) */
    static constexpr int MINB = OUT ? 1 : 2;
    static constexpr bool REALLOC = NWG == 2 || !OUT;
    static constexpr int CREG = NWG == 2 ? 224 : 200;
};

/* Whether segment span (len, slot0) of value head hv has a negligible
 * transition M: ||M||_2 <= prod_t e^(g_t) ||I - beta_t k_t k_t^T||_2
 * <= e^(sum g) <= e^-17 ~ 4e-8 (below fp32 rounding, DESIGN.md §3) when the
 * segment's decay sums to <= -17 and every token has 0 <= beta ||k||^2 <= 2.
 * Both come per chunk from the prepare kernel: the decay as gamma's last
 * entry (the chunk's sum), the second as chunk_ok. O(chunks) reads, so the
 * check costs little beside the chain it saves. A block-wide call (every
 * thread, __syncthreads inside); the same inputs give the same answer. */
static __device__ int m_negligible(const fqla_fwd_params &p, int64_t len, int64_t slot0, int hv)
{
    __shared__ float part[32];
    const int tid = threadIdx.x, nthr = blockDim.x;
    const int64_t nch = (len + FQLA_FWD_CHUNK - 1) / FQLA_FWD_CHUNK;
    float s = 0.f;
    int bad = 0;
    for (int64_t c = tid; c < nch; c += nthr) {
        const int64_t i = (slot0 + c) * p.HV + hv;
        s += p.gam[i * FQLA_FWD_CHUNK + FQLA_FWD_CHUNK - 1];
        bad |= !p.chunk_ok[i];
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((tid & 31) == 0) part[tid >> 5] = s;
    bad = __syncthreads_or(bad);
    float tot = 0.f;
    for (int w = 0; w < nthr / 32; w++) tot += part[w]; /* the same order in every thread */
    return !bad && tot <= -17.f;
}

#ifdef FQLA_CHAIN_CLOCKS
/* Instrumented builds only (nvcc -DFQLA_CHAIN_CLOCKS): thread 0 of each
 * consumer warpgroup of the first 16 CTAs (blockIdx.y = 0) adds clock64
 * spans of every chunk from the third on, per warpgroup: [0] waiting for the
 * stage (copies, token factors), [1] issuing G1 and G2 and the previous
 * chunk's output store, [2] waiting for G1 and G2, [3] forming and issuing
 * G4, [4] waiting for G4, [5] forming Vd, Vp and issuing G5 and G6, [6]
 * waiting for G5 and G6, [7] the output epilogue; [8] counts the chunks. */
__device__ unsigned long long g_chain_clk[2][9];
#define CHAIN_CLK_START long long chain_t_ = clock64()
#define CHAIN_CLK(i)                                                                            \
    do {                                                                                        \
        const long long t1_ = clock64();                                                        \
        if (OUT && blockIdx.y == 0 && blockIdx.x < 16 && tid == 0 && c >= 2) {                  \
            atomicAdd(&g_chain_clk[cw][i], (unsigned long long)(t1_ - chain_t_));               \
            if (i == 7) atomicAdd(&g_chain_clk[cw][8], 1ull);                                   \
        }                                                                                       \
        chain_t_ = t1_;                                                                         \
    } while (0)
#else
#define CHAIN_CLK_START
#define CHAIN_CLK(i)
#endif

template <typename T, int KD, int NWG, bool OUT>
__global__ void __launch_bounds__(128 * (NWG + 1), wg_cfg<KD, NWG, OUT>::MINB)
    fwd_chunk_wg_kernel(const __grid_constant__ fqla_fwd_params p, const __grid_constant__ CUtensorMap tmQ,
                        const __grid_constant__ CUtensorMap tmK, const __grid_constant__ CUtensorMap tmV,
                        const __grid_constant__ fqla_fwd_ag_maps tmA, const __grid_constant__ CUtensorMap tmP,
                        const __grid_constant__ CUtensorMap tmO)
{
    typedef wg_cfg<KD, NWG, OUT> cfg;
    extern __shared__ unsigned char smem_raw[];
    /* 1024-aligned (TMA's 128-byte swizzle) by an offset from smem_raw, not a
     * round trip through an integer: the compiler then still knows every
     * pointer below is shared and emits LDS / STS, not generic LD / ST
     * (the factor loads sit on the chain: docs/perf.md, v7b) */
    unsigned char *sm = smem_raw + ((1024u - (fqla_h_smem(smem_raw) & 1023u)) & 1023u);
    /* full: the stage's copies landed; ready: its token factors are written;
     * empty: every consumer warp is done with it */
    uint64_t *full = reinterpret_cast<uint64_t *>(sm + cfg::oBar), *empty = full + cfg::STAGES;
    uint64_t *ready = empty + cfg::STAGES;
    /* Launched with PDL after the prepare kernel (CP's kernels launch
     * plainly, p.pdl = 0, where this wait is a no-op). Only the prepare
     * kernel's outputs (Ag, Pg, gamma, rq, rk) need it finished: without CP
     * the producer waits after issuing the first stages' K, Q, V copies,
     * and h0 (the caller's) loads meanwhile (docs/perf.md, session 10); CP's
     * passes wait here, before the segment flags and chunk_ok are read. Let
     * the next kernel's launch begin. */
    if (p.cp_mode) fqla_pdl_wait();
    fqla_pdl_trigger();

    const int wg = threadIdx.x >> 7;
    const int64_t ns = blockIdx.x / p.HV; /* sequence, or segment with cp_mode: the state's row */
    const int hv = blockIdx.x % p.HV;
    const int hq = hv / p.group;
    const int vbase = blockIdx.y * 64 * NWG;
    int64_t n, batch, start, len, slot0;
    bool last;
    /* The pre-pass leaves out each sequence's last segment: the scan needs
     * no H or M of it, and the main pass runs it on to the final state. */
    if (!fqla_fwd_span(p, ns, n, batch, start, len, slot0, last) || (p.cp_mode == 1 && last)) {
        /* no segment, or the last: a defined flag all the same */
        if (!OUT && p.cp_skip && vbase == p.V && threadIdx.x == 0) p.seg_flag[ns * p.HV + hv] = 0;
        return;
    }
    if (!OUT && p.cp_skip && vbase >= p.V) {
        /* pre-pass, transition columns: a negligible M is left out and
         * flagged for the scan (one flag per segment and head, written by
         * the first such slice; every slice decides alike) */
        const int neg = m_negligible(p, len, slot0, hv);
        if (threadIdx.x == 0 && vbase == p.V) p.seg_flag[ns * p.HV + hv] = neg;
        if (neg) return;
    }
    const int64_t nch = (len + C - 1) / C;

    if (threadIdx.x == 0) {
        fqla_tma_prefetch(&tmQ);
        fqla_tma_prefetch(&tmK);
        fqla_tma_prefetch(&tmV);
        for (int w = 0; w < 4; w++) fqla_tma_prefetch(&tmA.strip[w]);
        if (OUT) fqla_tma_prefetch(&tmP); /* (not encoded without Pg) */
        if (OUT) fqla_tma_prefetch(&tmO);
        for (int s = 0; s < cfg::STAGES; s++) {
            fqla_mbar_init(&full[s], 1);
            /* every consumer thread: each arrive then orders that thread's
             * own reads of the stage before the next lap's writes. (A lane-0
             * arrive after __syncwarp orders them too, but compute-sanitizer's
             * racecheck does not follow __syncwarp, and reported every read
             * of the stage's gamma and token factors against the next lap's
             * writes: docs/perf.md, session 7.) */
            fqla_mbar_init(&empty[s], 128 * NWG);
            fqla_mbar_init(&ready[s], 32); /* every lane of the factor warp */
        }
        fqla_mbar_init_fence();
    }
    __syncthreads();

    if (wg == 0) {
        /* producer: one thread issues every copy of a stage */
        if (cfg::REALLOC) fqla_setmaxnreg_dec<56>();
        if (threadIdx.x < 32 && fqla_elect_one()) {
            const int bc = p.varlen ? 0 : (int)batch;
            /* rq only with an output; rk scales the keys of the state chain */
            uint32_t tx = cfg::tx_tiles + (p.l2norm ? (OUT ? 512u : 256u) : 0u);
#ifdef FQLA_DEBUG_NO_AGPG
            /* Timing experiments only (wrong results): Ag and Pg are not
             * loaded, so the kernel moves a fused kernel's bytes (q, k, v
             * in, o out) and runs its chain on whatever the stage holds. */
            tx -= (OUT ? 2 : 1) * TILE;
#endif
            /* chunk c's K, Q, V (the caller's inputs) into its stage, the
             * whole stage's bytes announced on full[s] */
            auto inputs = [&](int64_t c) {
                const int s = (int)(c % cfg::STAGES);
                const uint32_t ph = (uint32_t)(c / cfg::STAGES) & 1;
                fqla_mbar_wait(&empty[s], ph ^ 1);
                unsigned char *st = sm + s * cfg::stage;
                fqla_mbar_arrive_tx(&full[s], tx);
                const int t = (int)(start + c * C);
#pragma unroll
                for (int kb = 0; kb < cfg::KB; kb++) {
                    fqla_tma_load_4d(st + cfg::oK + kb * cfg::KQ, &tmK, &full[s], 64 * kb, hq, t, bc);
                    if (OUT) fqla_tma_load_4d(st + cfg::oQ + kb * cfg::KQ, &tmQ, &full[s], 64 * kb, hq, t, bc);
                }
#pragma unroll
                for (int w = 0; w < NWG; w++)
                    fqla_tma_load_4d(st + cfg::oV + w * TILE, &tmV, &full[s], vbase + 64 * w, hv, t, bc);
            };
            const int64_t early = nch < cfg::STAGES ? nch : cfg::STAGES; /* stages free from the start */
            for (int64_t c = 0; c < early; c++) inputs(c);
            fqla_pdl_wait(); /* the prepare kernel's outputs (a no-op if waited above) */
            for (int64_t c = 0; c < nch; c++) {
                if (c >= early) inputs(c);
                const int s = (int)(c % cfg::STAGES);
                unsigned char *st = sm + s * cfg::stage;
                const int64_t sh = (slot0 + c) * p.HV + hv;
#ifndef FQLA_DEBUG_NO_AGPG
                fqla_fwd_load_ag(st + cfg::oAg, tmA, &full[s], sh);
                if (OUT) fqla_tma_load_2d(st + cfg::oPg, &tmP, &full[s], 0, (int)(sh * C));
#endif
                fqla_bulk_load(st + cfg::oGam, p.gam + sh * C, 256, &full[s]);
                if (p.l2norm) {
                    const int64_t qh = ((slot0 + c) * p.H + hq) * C;
                    if (OUT) fqla_bulk_load(st + cfg::oRq, p.rq + qh, 256, &full[s]);
                    fqla_bulk_load(st + cfg::oRk, p.rk + qh, 256, &full[s]);
                }
            }
        }
        else if ((threadIdx.x >> 5) == 1) {
            /* the token factors of each stage, once per CTA instead of once
             * per consumer thread: lane l does tokens 2 l, 2 l + 1 */
            const int lane = threadIdx.x & 31;
            for (int64_t c = 0; c < nch; c++) {
                const int s = (int)(c % cfg::STAGES);
                /* empty first: the consumers' reads of the last lap's factors
                 * are then ordered before these writes by an mbarrier this
                 * warp waits on itself (it already follows through the
                 * producer's wait and the copy's completion, which
                 * compute-sanitizer's racecheck does not track) */
                fqla_mbar_wait(&empty[s], ((uint32_t)(c / cfg::STAGES) & 1) ^ 1);
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
                        if (OUT) rq = reinterpret_cast<const float *>(st + cfg::oRq)[t];
                        rk = reinterpret_cast<const float *>(st + cfg::oRk)[t];
                    }
                    fqla_chain::token_factors(ud, fo, gm, t, gC, rq, rk, p.scale);
                }
                fqla_mbar_arrive(&ready[s]);
            }
        }
        return;
    }

    /* consumers */
    if (cfg::REALLOC) fqla_setmaxnreg_inc<cfg::CREG>();
    const int cw = wg - 1;
    const int tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, tq = lane & 3;
    const int v0 = vbase + 64 * cw;
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
        fqla_chain::load_state(p, S, ns, hv, vr, kc);
    }

    T *ob = OUT ? (T *)p.o + batch * p.o_sb + hv * p.o_sh + v0 : NULL;
    unsigned char *Obuf = sm + cfg::oO + cw * 2 * TILE; /* this warpgroup's two staging tiles */
    /* chunk cc's output rows to o (fwd_chain.cuh) */
    auto store_out = [&](int64_t cc) {
        fqla_chain::store_out(p, &tmO, Obuf, ob, cc, start, len, v0, hv, batch, cw, tid);
    };

    for (int64_t c = 0; c < nch; c++) {
        CHAIN_CLK_START;
        const int s = (int)(c % cfg::STAGES);
        const uint32_t ph = (uint32_t)(c / cfg::STAGES) & 1;
        unsigned char *st = sm + s * cfg::stage;
        fqla_mbar_wait(&full[s], ph);
        fqla_mbar_wait(&ready[s], ph);
        CHAIN_CLK(0);
        const int nvalid = (int)min((int64_t)C, len - c * C);
        if (nvalid < C) {
            /* rows past the end: zero K (consumer 0) and this V slice */
            fqla_chain::zero_rows(st + cfg::oK, cfg::KB, cfg::KQ, cw == 0, st + cfg::oV + cw * TILE, nvalid, tid);
            fqla_named_sync(1, 128 * NWG);
        }
        const float *gm = reinterpret_cast<const float *>(st + cfg::oGam);
        const float2 *ud = reinterpret_cast<const float2 *>(st + cfg::oFac);
        const float *fos = reinterpret_cast<const float *>(st + cfg::oFac + 512);

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
        CHAIN_CLK(1);

        fqla_wg_wait<0>();
        fqla_reg_fence(accUQ);
        fqla_reg_fence(accVd);
        CHAIN_CLK(2);
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
        CHAIN_CLK(3);
        fqla_wg_wait<0>();
        fqla_reg_fence(accVd);
        CHAIN_CLK(4);

        /* Vd (for G6) and Vp = Vd diag(d) (for G5) as A fragments */
        uint32_t vd[4][4], vp[4][4];
        fqla_chain::g56_ready<T>(vd, vp, accVd, ud, tq, S);
        /* G5 (the K tiles' atoms KB tiles apart) */
        fqla_chain::g5_issue<T, KD>(S, vp, fqla_desc_mnmajor(st + cfg::oK, cfg::KQ));
        fqla_wg_commit();
        if constexpr (!OUT) {
            fqla_wg_wait<0>();
            fqla_reg_fence(S);
            fqla_mbar_arrive(&empty[s]);
        } else {
            float accP[32];
            fqla_chain::g6_issue<T>(accP, vd, fqla_desc_kmajor(st + cfg::oPg)); /* G6 */
            fqla_wg_commit();
            /* output factors while the products run */
            float fo[16];
            fqla_chain::load_out_factors(fo, fos, tq);
            CHAIN_CLK(5);
            fqla_wg_wait<0>();
            fqla_reg_fence(S);
            fqla_reg_fence(accUQ);
            fqla_reg_fence(accP);
            CHAIN_CLK(6);
            fqla_mbar_arrive(&empty[s]); /* stage s is no longer read by this thread */

            /* O^T = Qs^T diag(o) + P^T -> staging tile c & 1 as [t][v] */
            fqla_chain::output_tile<T>(Obuf + (c & 1) * TILE, fo, accUQ + 32, accP, warp, lane);
            CHAIN_CLK(7);
        }
    }
    if (OUT && nch > 0) store_out(nch - 1);
    if (OUT && tid == 0) fqla_bulk_wait<0>(); /* the CTA's last stores are done before it exits */

    /* the final state: of the sequence, or with CP's main pass of the
     * sequence's last segment (the pre-pass: of every segment it runs) */
    if (p.ht && (p.cp_mode != 2 || last)) fqla_chain::store_state(p, S, p.cp_mode == 2 ? n : ns, hv, vr, kc);
}

#ifdef FQLA_CHAIN_CLOCKS
} // namespace
/* Instrumented builds: the clock sums since the last call (then reset). */
extern "C" int fqla_cuda_debug_chain_clocks(unsigned long long out[18])
{
    return fqla_debug_clocks_take(g_chain_clk, out, 18);
}
namespace {
#endif

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
    if (p.cp_mode == 1) /* the state-only pre-pass: one warpgroup, two CTAs per SM */
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
