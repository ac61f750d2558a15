/*
 * fwd_fused_exp.cu - (developer build, timing only) issue 42's first
 * experiment: the whole forward in one kernel, the preparation split over
 * warps as pipeline stages instead of one auxiliary warpgroup. Its results
 * are WRONG by design; it prices the layout before the rest is built
 * (docs/history/2026-12-07h-fusedfwd-exp.md has the measurements).
 *
 * fwd_fused.cu's kernel (K = 64 / 128, bf16 / fp16, no l2norm, no CP) with
 * four warpgroups at 64 / 192 / 192 / 64 registers:
 *   - no prepare kernel runs. The producer warp copies K, Q, V and gamma
 *     (from whatever the workspace holds: a stand-in for the gate scan the
 *     real kernel's producer would do, same bytes), no Ag;
 *   - the products warpgroup (64 registers; fwd_fused.cu's Pg warpgroup has
 *     104): per chunk Q K^T, its epilogue in ungated coordinates (P = scale
 *     tril(Q K^T): no Gamma, no exponentials) into the Pg slot as today,
 *     then K K^T by the same SS wgmma into the same accumulator and its
 *     epilogue, L = diag(beta) StrictLower(K K^T) in fp32, into the L slot
 *     (gamma stands in for beta);
 *   - the inverse warps, warps 1-3 of the producer's warpgroup: X = (I +
 *     L)^-1 in place a chunk at a time, paced by the stage ring like every
 *     consumer: a. the 16 x 16 diagonal blocks by forward substitution,
 *     b. the off-diagonal blocks by doubling (level 1: (1,0), (3,2); level
 *     2: the lower-left 32 x 32 block), c. Ag' = X diag(beta e^-gamma) as a
 *     bf16 tile in the 128-byte swizzle into the Ag slot;
 *   - the chain unchanged but for reading Ag from the Ag slot.
 *
 * Modes (fqla_cuda_fwd_tune's prep_variant; dev/gpu/fwd_fused_exp.sh):
 *   10  the products warpgroup; the inverse warps idle, the chain reads a
 *       stale Ag slot;
 *   11  + the inverse warps (3xTF32 mma.sync merges) on a stale L slot, the
 *       chain not waiting for them (the issue's first experiment; the data
 *       races are the experiment's);
 *   12  11 with the hand-offs a correct kernel needs: the L slot (products
 *       -> inverse warps: lready / lfree) and the Ag slot (inverse warps ->
 *       the chain's G1 / G4: aready / afree), single slots;
 *   13  12 without the merges (b); 14 without the substitution (a) too;
 *   15  12 with the merges in fp32 FMAs on the CUDA cores;
 *   16  12 with plain tf32 merges, one mma a product (the numerics model,
 *       bench/results/inverse-precision.md, has o and the state unchanged
 *       end to end with a plain-tf32 or fp16 inverse: Ag is rounded to bf16);
 *   17  the whole inverse on the products warpgroup's tensor cores in fp16
 *       (ex_pinv; the inverse warps idle): each warp inverts its 16 x 16
 *       diagonal block of I + L by doubling on mma.sync (bit levels 1, 2, 3),
 *       then with D those blocks and N = D Lo (Lo the block-strictly-lower
 *       part of L, N^4 = 0) X = (I + N^2)(I - N) D as four 64 x 64 x 64
 *       RS wgmma, and the warpgroup writes Ag' itself (numerics model:
 *       variant 9 of dev/models/inverse_precision.py);
 *   18  17 without the diagonal blocks' doubling (D = their K K^T);
 *   19  17 without the inverse: the products warpgroup writes Ag' from
 *       K K^T (its hand-offs and epilogue alone);
 *   20  17 with the diagonal blocks on the three idle warps (ex_diag_warps):
 *       the products warpgroup forms K K^T first, hands them its diagonal
 *       blocks (kdready), forms Q K^T and P while they invert them, then
 *       waits for D (dready) and runs the four wgmma products;
 *   21  20 with K K^T and the hand-off of chunk c + 1 right after chunk c's
 *       Ag': the warps invert while the products warpgroup waits for the
 *       chain's slots and forms Q K^T;
 *   22  21 with the diagonal blocks in fp32 on the CUDA cores, in registers:
 *       a block a half warp, a column a lane, right-looking substitution
 *       (no tensor instruction to queue behind the chain's wgmma);
 *   23  18 at 20-22's register split (40 / 88);
 *   24  22 at 32 / 96, its substitution a 16-byte word at a time;
 *   25  18 with D from two idle warps that form the diagonal blocks' K K^T
 *       themselves (mma.sync on the stage's K tile) as the stage lands,
 *       invert them as 24 does and leave D as the products warps' A
 *       fragments (ex_diag_self): off the products warpgroup's path;
 *   26  25 made correct, the one-kernel forward: a gate warp forms gamma
 *       and beta in the stage (ex_gates), P, Lo and the diagonal blocks
 *       carry Gamma (the gated system on every chunk, variant 10 of
 *       dev/models/inverse_precision.py), Ag = X diag(beta); checked against
 *       the reference by test_gpu_fwd's fwd_one_kernel; the gate warp of the
 *       last sequence's CTAs also zeroes o's rows past cu[N].
 * The question (issue 42): does the kernel alone reach x0.85 of today's two
 * kernels (prepare + fused) on the nine rows of the earlier fused attempts?
 * On the H100: mode 10 x0.73, 12 x1.36, 16 x1.19; 17 x1.06, 18 x0.86,
 * 19 x0.71, 20 x1.11, 21 x1.14 (docs/history/2026-12-07i-fusedfwd-pinv.md);
 * 22 x1.06, 23 x0.89, 24 x1.04 (docs/history/2026-12-08-fusedfwd-diag.md).
 */
#include "cuda/fwd_chain.cuh"
#include "cuda/fwd_common.cuh"
#include "cuda/fwd_prepare_common.cuh"
#include "cuda/kernel/io.cuh"
#include "cuda/kernel/named_barrier.cuh"
#include "cuda/kernel/pipeline.cuh"
#include "cuda/ptx/ptx.cuh"
#include "dev/fwd_fused_exp.cuh"

#include <stddef.h>

namespace {

constexpr int C = FQLA_FWD_CHUNK;
constexpr uint32_t TILE = C * 128;
constexpr int LDF = C + 8; /* fp32 L / X rows (fwd_prepare.cu's stride) */
constexpr float L2E = 1.4426950408889634f; /* log2(e): Gamma_ij = 2^((gamma_i - gamma_j) L2E), one ex2 */
constexpr int CHAIN_REGS = 192;
constexpr int PG_AIM = 2;
/* the inverse warps' named barrier (96 threads); the chain's are fqla_chain_bar's */
enum class ex_bar : uint32_t { inv = 8, prod = 9 /* the products warpgroup (128), modes 17-21 */ };

template <int KD, int NWG>
struct ex_stage {
    unsigned char kq[KD / 64][2][TILE];
    unsigned char v[NWG][TILE];
    float gam[C];
    float beta[C]; /* mode 26: beta, from the gate warp with gamma */
    unsigned char pad[512];
};
struct ex_slot {
    unsigned char pg[TILE];
    float2 ud[C];
    float fo[C];
    unsigned char pad[256];
};
template <int KD, int NWG>
struct ex_smem {
    ex_stage<KD, NWG> stage[3];
    ex_slot slot[2];
    unsigned char out[NWG][2][TILE];
    unsigned char ag[TILE];  /* Ag' (the inverse warps), read by the chain's G1 / G4 */
    union {
        float L[C * LDF];             /* diag(beta) StrictLower(K K^T), inverted in place */
        struct {
            unsigned char pt[2][TILE]; /* modes 17-21: fp16 Lo, then N; D (block diagonal) */
            union {
                float kdb[4][256];         /* modes 20 / 21: the diagonal blocks for ex_diag_warps */
                struct {
                    float kdw[2][256];     /* modes 25 / 26: a diagonal block of each of their two warps */
                    uint32_t dc[4][32][4]; /* modes 25 / 26: D's blocks as the products warps' A fragments */
                };
            };
        };
    };
    float colf[2][C];        /* beta_j e^-gamma_j (modes 17-21: by chunk parity) */
    uint64_t full[3], empty[3], pready[2], pfree[2], aim[2];
    uint64_t lready, lfree, aready, afree; /* from mode 12: the L and Ag slots' hand-offs (20 / 21: kdready, dready) */
    uint64_t dready, dfree;                /* modes 25 / 26: dc's hand-offs */
};

template <int KD, int NWG_, int MODE>
struct ex_cfg {
    static constexpr int KB = KD / 64, NWG = NWG_, QST = 3, ASL = 2;
    static constexpr int THREADS = 128 * (NWG + 2);
    static constexpr bool INV = MODE >= 11 && MODE <= 16; /* the inverse warps */
    static constexpr bool PINV = MODE >= 17;              /* the inverse on the products warpgroup */
    static constexpr bool PDIAG = MODE == 17;             /* its diagonal blocks' doubling */
    static constexpr bool PMERGE = MODE <= 18 || MODE >= 20; /* its four wgmma products */
    /* 25: the diagonal blocks on two idle warps that form their K K^T
     * themselves (mma.sync from the stage's K tile) as soon as the stage
     * lands, a chunk or more before the products warpgroup's merges; the
     * products warpgroup runs mode 18's code with D from them (dc) */
    static constexpr bool SDIAG = MODE >= 25;
    /* 26: mode 25 made correct (the one-kernel forward): a gate warp (warp 3
     * of the producer's warpgroup) forms gamma and beta into the stage from
     * g and beta, with the in-kernel options; the products warpgroup's P,
     * Lo and the diagonal blocks carry Gamma (the gated system, inverted in
     * fp16 on every chunk: variant 10 of dev/models/inverse_precision.py),
     * and Ag = X diag(beta) */
    static constexpr bool REAL = MODE == 26;
    static constexpr bool DWARPS = MODE >= 20 && MODE <= 24 && MODE != 23; /* the diagonal blocks on the idle warps */
    static constexpr bool LOOKAHEAD = DWARPS && MODE >= 21;  /* ... a chunk ahead of the merges */
    static constexpr bool FDIAG = MODE == 22 || MODE == 24;  /* ... in fp32 on the CUDA cores */
    /* registers a thread: the producer's warpgroup (producer warp + inverse
     * warps; 17-19 the producer warp alone, 20 / 21 it and the diagonal
     * blocks' warps) and the products warpgroup (at 64 / 64, modes 17 and 20
     * had every wgmma of the kernel serialised by ptxas, C7512) */
    static constexpr int SIDE_REGS = MODE == 23 || SDIAG ? 40 : MODE == 24 ? 32 : DWARPS ? 40 : PINV ? 24 : 64;
    static constexpr int PROD_REGS = MODE == 23 || SDIAG ? 88 : MODE == 24 ? 96 : DWARPS ? 88 : PINV ? 104 : 64;
    /* 23: mode 18 at 20-22's register split (does 88 a products thread cost
     * the +0.15-0.2 of 20-22?); 24: 22 at 32 / 96, its substitution reading
     * a 16-byte word at a time (the products warpgroup spills 36 bytes at 88) */
    static constexpr bool DEP = MODE >= 12;
    static constexpr bool MERGES = MODE <= 12 || MODE >= 15; /* 13, 14: without the off-diagonal blocks' merges */
    static constexpr bool SUBST = MODE != 14;  /* 14: without the diagonal blocks' substitution either */
    static constexpr bool FF = MODE == 15;     /* the merges in fp32 FMAs on the CUDA cores, not mma.sync */
    static constexpr int PREC = MODE == 16 ? 1 : 3; /* 16: plain tf32 merges, one mma a product */
    typedef ex_stage<KD, NWG> stage_t;
    typedef ex_smem<KD, NWG> smem_t;
    static constexpr uint32_t stage = sizeof(stage_t);
    static constexpr uint32_t oK = offsetof(stage_t, kq), oQ = oK + TILE, KQ = sizeof(stage_t::kq[0]);
    static constexpr uint32_t oV = offsetof(stage_t, v), oGam = offsetof(stage_t, gam);
    static constexpr uint32_t tx = REAL ? oGam : oGam + sizeof(stage_t::gam); /* REAL: the tiles alone */
    static constexpr uint32_t oBeta = offsetof(stage_t, beta);
    static constexpr uint32_t slot = sizeof(ex_slot), sPg = offsetof(ex_slot, pg), sFac = offsetof(ex_slot, ud);
    static constexpr uint32_t oSlots = offsetof(smem_t, slot), oO = offsetof(smem_t, out);
    static constexpr uint32_t oAg = offsetof(smem_t, ag), oL = offsetof(smem_t, L), oColf = offsetof(smem_t, colf);
    static constexpr uint32_t oBar = offsetof(smem_t, full), oDc = offsetof(smem_t, dc), oKdw = offsetof(smem_t, kdw);
    static constexpr uint32_t bytes = sizeof(smem_t) + 1024;
    static_assert(stage % 1024 == 0 && oV % 1024 == 0 && oSlots % 1024 == 0 && oO % 1024 == 0 && oAg % 1024 == 0 &&
                      oL % 1024 == 0,
                  "tiles 1024-aligned");
    static_assert(bytes <= 232448, "shared memory of one CTA");
    static_assert(SIDE_REGS + PROD_REGS + NWG * CHAIN_REGS <= 512, "registers");
    static_assert(SIDE_REGS % 8 == 0 && PROD_REGS % 8 == 0, "setmaxnreg takes multiples of 8");
};

struct ex_bars {
    uint64_t *full, *empty, *pready, *pfree, *aim;
    uint64_t *lready, *lfree, *aready, *afree;
    uint64_t *dready, *dfree; /* modes 25 / 26 */
};
struct ex_work {
    int64_t ns, n, batch, slot0;
    int start, len, nch, hv, hq, vbase;
    int last;
};

template <int KD, int NWG, int MODE>
__device__ __forceinline__ void ex_load(const fqla_fwd_params &p, const CUtensorMap &tmQ, const CUtensorMap &tmK,
                                        const CUtensorMap &tmV, unsigned char *sm, const ex_bars &b,
                                        const ex_work &w)
{
    typedef ex_cfg<KD, NWG, MODE> cfg;
    const int bc = p.varlen ? 0 : (int)w.batch;
    for (int c = 0; c < w.nch; c++) {
        const fqla_pipe<cfg::QST> ps = fqla_pipe<cfg::QST>::at(c);
        const int s = ps.stage;
        fqla_mbar_wait(&b.empty[s], ps.empty_parity());
        unsigned char *st = sm + s * cfg::stage;
        fqla_mbar_arrive_tx(&b.full[s], cfg::tx);
        const int t = w.start + c * C;
#pragma unroll
        for (int kb = 0; kb < cfg::KB; kb++) {
            fqla_tma_load_4d(st + cfg::oK + kb * cfg::KQ, &tmK, &b.full[s], 64 * kb, w.hq, t, bc);
            fqla_tma_load_4d(st + cfg::oQ + kb * cfg::KQ, &tmQ, &b.full[s], 64 * kb, w.hq, t, bc);
        }
#pragma unroll
        for (int i = 0; i < NWG; i++)
            fqla_tma_load_4d(st + cfg::oV + i * TILE, &tmV, &b.full[s], w.vbase + 64 * i, w.hv, t, bc);
        const int64_t sh = (w.slot0 + c) * p.HV + w.hv;
        if constexpr (!cfg::REAL) fqla_bulk_load(st + cfg::oGam, p.gam + sh * C, 256, &b.full[s]);
    }
}

/* ---- modes 17-21: the inverse on the products warpgroup (20 / 21: its
 * diagonal blocks on the idle warps). Timing only like the rest: the
 * fragment code below has run on no reference; variant 9 of
 * dev/models/inverse_precision.py checks the algebra. ---------------------- */

/* A 64 x 64 accumulator (wgmma m64n64 layout: warp w rows 16 w + g, + 8;
 * acc[4 j + 2 h + e] column 8 j + 2 tq + e of row 16 w + g + 8 h) as a U
 * tile in the 128-byte swizzle, element f(value, row, column); rows hold the
 * wgmma operand's K-major A rows or MN-major B rows. */
template <typename U, typename F>
__device__ __forceinline__ void ex_tile_store(unsigned char *tile, const float (&acc)[32], int warp, int lane, F f)
{
    const int g = lane >> 2, tq = lane & 3, r0 = 16 * warp + g;
#pragma unroll
    for (int j2 = 0; j2 < 4; j2++) {
        uint32_t r[4];
#pragma unroll
        for (int m = 0; m < 4; m++) {
            const int h = m & 1, j = 2 * j2 + (m >> 1), col = 8 * j + 2 * tq, row = r0 + 8 * h;
            r[m] = fqla_io<U>::pack(f(acc[4 * j + 2 * h], row, col), f(acc[4 * j + 2 * h + 1], row, col + 1));
        }
        const int mi = lane >> 3, row = 16 * warp + 8 * (mi & 1) + (lane & 7), ch = 2 * j2 + (mi >> 1);
        fqla_stsm_x4(tile + row * 128 + 16 * (ch ^ (row & 7)), r[0], r[1], r[2], r[3]);
    }
}
/* An RS wgmma A operand (fp16) of k-step kk from the accumulator: columns
 * 16 kk .. 16 kk + 15 in pairs, each value times sgn */
__device__ __forceinline__ void ex_afrag(uint32_t (&a)[4], const float (&acc)[32], int kk, float sgn)
{
#pragma unroll
    for (int i = 0; i < 4; i++) a[i] = fqla_io<__half>::pack(sgn * acc[8 * kk + 2 * i], sgn * acc[8 * kk + 2 * i + 1]);
}

/* 16 x 16 blocks held by one warp in the m16n8 accumulator layout:
 * c[nt][2 h + e] is row g + 8 h, column 8 nt + 2 tq + e. As an m16n8k16 A
 * fragment (fp16) a = {c[0][0..1], c[0][2..3], c[1][0..1], c[1][2..3]}; the
 * B operand of M for n-tile nt is then (a_t[nt], a_t[nt + 2]) with a_t the A
 * fragment of M^T, so a product A B needs A and B^T as A fragments. */
__device__ __forceinline__ void ex_pack16(uint32_t (&a)[4], const float (&c)[2][4], float sgn)
{
    typedef fqla_io<__half> h;
    a[0] = h::pack(sgn * c[0][0], sgn * c[0][1]);
    a[1] = h::pack(sgn * c[0][2], sgn * c[0][3]);
    a[2] = h::pack(sgn * c[1][0], sgn * c[1][1]);
    a[3] = h::pack(sgn * c[1][2], sgn * c[1][3]);
}
/* d += A B, 16 x 16 x 16 in fp16 (a: A's fragment, bt: B^T's) */
__device__ __forceinline__ void ex_mm16h(float (&d)[2][4], const uint32_t (&a)[4], const uint32_t (&bt)[4])
{
    fqla_mma_m16n8k16_f16(d[0], a, bt[0], bt[2]);
    fqla_mma_m16n8k16_f16(d[1], a, bt[1], bt[3]);
}

/* (I + L)^-1 of a warp's 16 x 16 diagonal block, L = diag(beta)
 * StrictLower(K K^T), in fp16 on mma.sync: X = I - L2 (the entries whose row
 * and column differ in bit 0 only), then for the bits b = 1, 2, 3, Lo the
 * entries whose highest differing bit is b (the lower-left quarter of each
 * 2^(b+1) block): N = X Lo, X <- X + (-N) X (X is block diagonal, so
 * (X Lo)^2 = 0 and (I + X Lo)^-1 = I - X Lo). X^T is carried beside X as the
 * next product's B operand; K K^T is symmetric, so L^T comes from the same
 * values. kd: the block of K K^T (ex_pack16's layout); br: beta of rows g,
 * g + 8; bc: of columns 2 tq, 2 tq + 1, 8 + 2 tq, 9 + 2 tq. */
__device__ __forceinline__ void ex_diag_inverse(uint32_t (&aD)[4], const float (&kd)[2][4], float br0, float br1,
                                                const float (&bc)[4], int lane)
{
    const int g = lane >> 2, tq = lane & 3;
    /* the highest bit in which an element's row and column differ (-1 on the diagonal) */
    auto hbit = [&](int nt, int i) {
        const int d = (g + 8 * (i >> 1)) ^ (8 * nt + 2 * tq + (i & 1));
        return d ? 31 - __clz(d) : -1;
    };
    float X[2][4], Xt[2][4], Lt[2][4];
#pragma unroll
    for (int nt = 0; nt < 2; nt++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int row = g + 8 * (i >> 1), col = 8 * nt + 2 * tq + (i & 1);
            const float l = row > col ? ((i >> 1) ? br1 : br0) * kd[nt][i] : 0.f;
            Lt[nt][i] = col > row ? bc[2 * nt + (i & 1)] * kd[nt][i] : 0.f;
            const float id = row == col ? 1.f : 0.f;
            const bool b0 = hbit(nt, i) == 0;
            X[nt][i] = id - (b0 ? l : 0.f);
            Xt[nt][i] = id - (b0 ? Lt[nt][i] : 0.f);
        }
    uint32_t aX[4], aXt[4];
    ex_pack16(aX, X, 1.f);
    ex_pack16(aXt, Xt, 1.f);
#pragma unroll
    for (int b = 1; b <= 3; b++) {
        float lo[2][4], N[2][4];
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                lo[nt][i] = hbit(nt, i) == b ? Lt[nt][i] : 0.f;
                N[nt][i] = 0.f;
            }
        uint32_t aLot[4], aNn[4];
        ex_pack16(aLot, lo, 1.f);
        ex_mm16h(N, aX, aLot);   /* N = X Lo */
        ex_pack16(aNn, N, -1.f);
        ex_mm16h(X, aNn, aXt);   /* X += (-N) X */
        if (b < 3) {
            ex_mm16h(Xt, aXt, aNn); /* X^T += X^T (-N^T) */
            ex_pack16(aXt, Xt, 1.f);
        }
        ex_pack16(aX, X, 1.f);
    }
#pragma unroll
    for (int i = 0; i < 4; i++) aD[i] = aX[i];
}

/* Column j of (I + L)^-1 for a 16 x 16 strictly lower L in fp32 registers,
 * right-looking: x = e_j, then for i = 0 .. 14, x_r -= L_ri x_i for r > i.
 * m holds L_ri (r > i) at [16 i + r], row i's upper part (K K^T's symmetry),
 * read a 16-byte word at a time (modes 24 - 26). */
__device__ __forceinline__ void ex_col_inverse(float (&x)[16], const float *m, int j)
{
#pragma unroll
    for (int q = 0; q < 16; q++) x[q] = q == j ? 1.f : 0.f;
#pragma unroll
    for (int i = 0; i < 15; i++) {
#pragma unroll
        for (int q = (i + 1) >> 2; q < 4; q++) {
            const float4 v = reinterpret_cast<const float4 *>(m + 16 * i)[q];
            const float e[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (4 * q + u > i) x[4 * q + u] = fmaf(-e[u], x[i], x[4 * q + u]);
        }
    }
}

/* Mode 20: the three idle warps of the producer's warpgroup invert the four
 * diagonal blocks (warp 0 blocks 0 and 3, warps 1 and 2 blocks 1 and 2) from
 * kdb (lower: beta_i K K^T, upper: beta_j K K^T, the products warpgroup's)
 * into D's tile, a chunk at a time: kdready -> dready (the L slot's
 * mbarriers). */
template <int KD, int NWG, int MODE>
__device__ __forceinline__ void ex_diag_warps(unsigned char *sm, const ex_bars &b, const ex_work &w)
{
    typedef ex_cfg<KD, NWG, MODE> cfg;
    const int iw = (threadIdx.x - 32) >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    const float *kdb = reinterpret_cast<const float *>(sm + cfg::oL + 2 * TILE);
    unsigned char *t1 = sm + cfg::oL + TILE;
    for (int c = 0; c < w.nch; c++) {
        fqla_mbar_wait(b.lready, fqla_pipe<1>::at(c).phase);
        if constexpr (cfg::FDIAG) {
            /* mode 22: warps 0 and 1, a block a half warp, column j a lane:
             * x = (I + L)^-1 e_j by x_i = acc_i, acc_r -= L_ri x_i (r > i);
             * L_ri (r > i) is row i's upper part of kdb (beta_r K K^T_ir) */
            if (iw < 2) {
                const int blk = 2 * iw + (lane >> 4), j = lane & 15;
                const float *m = kdb + 256 * blk;
                float x[16];
                if constexpr (MODE == 24) {
                    ex_col_inverse(x, m, j);
                } else { /* mode 22: a row of L in registers a step */
#pragma unroll
                    for (int r = 0; r < 16; r++) x[r] = r == j ? 1.f : 0.f;
#pragma unroll
                    for (int i = 0; i < 15; i++) {
                        float row[16];
#pragma unroll
                        for (int q = 0; q < 4; q++) {
                            const float4 v = reinterpret_cast<const float4 *>(m + 16 * i)[q];
                            row[4 * q] = v.x, row[4 * q + 1] = v.y, row[4 * q + 2] = v.z, row[4 * q + 3] = v.w;
                        }
#pragma unroll
                        for (int r = i + 1; r < 16; r++) x[r] = fmaf(-row[r], x[i], x[r]);
                    }
                }
#pragma unroll
                for (int r = 0; r < 16; r++) {
                    const int rr = 16 * blk + r, cc = 16 * blk + j;
                    *reinterpret_cast<__half *>(t1 + rr * 128 + 16 * ((cc >> 3) ^ (rr & 7)) + 2 * (cc & 7)) =
                        __float2half_rn(x[r]);
                }
            }
            fqla_fence_async_smem();
            fqla_mbar_arrive(b.lfree);
            continue;
        }
#pragma unroll 1
        for (int r = 0; r < (iw == 0 ? 2 : 1); r++) {
            const int blk = iw == 0 ? 3 * r : iw;
            const float *m = kdb + 256 * blk;
            float kd[2][4];
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) kd[nt][i] = m[16 * (g + 8 * (i >> 1)) + 8 * nt + 2 * tq + (i & 1)];
            uint32_t aD[4];
            ex_diag_inverse(aD, kd, 1.f, 1.f, {1.f, 1.f, 1.f, 1.f}, lane);
            const int mi = lane >> 3, row = 16 * blk + 8 * (mi & 1) + (lane & 7), ch = 2 * blk + (mi >> 1);
            fqla_stsm_x4(t1 + row * 128 + 16 * (ch ^ (row & 7)), aD[0], aD[1], aD[2], aD[3]);
        }
        fqla_fence_async_smem();
        fqla_mbar_arrive(b.lfree);
    }
}

/* Mode 26: warp 3 of the producer's warpgroup, per chunk: the stored g and
 * beta of its 64 tokens (two a lane, loaded before the stage is free), the
 * in-kernel gate and beta sigmoid where asked (tokens past the end stay 0),
 * gamma = the inclusive cumsum of g by a warp scan, both into the stage; each
 * lane then arrives on the stage's full barrier. */
template <int KD, int NWG, int MODE>
__device__ __forceinline__ void ex_gates(const fqla_fwd_params &p, unsigned char *sm, const ex_bars &b,
                                         const ex_work &w)
{
    typedef ex_cfg<KD, NWG, MODE> cfg;
    const int lane = threadIdx.x & 31;
    const int64_t bc = p.varlen ? 0 : w.batch;
    for (int c = 0; c < w.nch; c++) {
        const fqla_pipe<cfg::QST> ps = fqla_pipe<cfg::QST>::at(c);
        const int nvalid = min(C, w.len - c * C);
        float g[2], be[2];
        load_gate_beta(p, bc, (int64_t)w.start + c * C, nvalid, w.hv, lane, g, be);
#pragma unroll
        for (int h = 0; h < 2; h++)
            if (lane + 32 * h < nvalid) finish_gate_beta(p, w.hv, g[h], be[h]);
        float s0 = g[0], s1 = g[1];
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const float t0 = __shfl_up_sync(0xffffffffu, s0, o), t1 = __shfl_up_sync(0xffffffffu, s1, o);
            if (lane >= o) s0 += t0, s1 += t1;
        }
        s1 += __shfl_sync(0xffffffffu, s0, 31);
        fqla_mbar_wait(&b.empty[ps.stage], ps.empty_parity());
        unsigned char *st = sm + ps.stage * cfg::stage;
        float *gm = reinterpret_cast<float *>(st + cfg::oGam), *bt = reinterpret_cast<float *>(st + cfg::oBeta);
        gm[lane] = s0, gm[lane + 32] = s1;
        bt[lane] = be[0], bt[lane + 32] = be[1];
        fqla_mbar_arrive(&b.full[ps.stage]);
    }
    /* varlen: o's rows past cu[N] are zeroed by the last sequence's CTAs,
     * each its head's value columns (the prepare kernel's job elsewhere) */
    if (p.varlen && p.o && w.n == p.N - 1) {
        typedef unsigned short b16;
        const int64_t end = fqla_fwd_cu(p, p.N);
        const int per_row = 8 * NWG; /* 16-byte words of the CTA's 64 NWG columns */
        for (int64_t i = lane; i < (p.T - end) * per_row; i += 32) {
            b16 *dst = (b16 *)p.o + (end + i / per_row) * p.o_st + w.hv * p.o_sh + w.vbase + 8 * (i % per_row);
            *reinterpret_cast<uint4 *>(dst) = make_uint4(0u, 0u, 0u, 0u);
        }
    }
}

/* Modes 25 / 26: warps 1 and 2 of the producer's warpgroup, blocks 2 iw
 * and 2 iw + 1 of each chunk, one after the other: the block's K K^T by
 * mma.sync from the stage's K tile (one ldmatrix.x4 a k-step is both
 * operands: the block's rows are A's rows and B^T's) into the warp's kdw,
 * then ex_col_inverse on lanes 0-15 (a column a lane), and D written to dc
 * as the products warp's A fragment (fp16). dc is single: the warps write
 * chunk c's once the products warpgroup has read chunk c - 1's (dfree). */
template <typename T, int KD, int NWG, int MODE>
__device__ __forceinline__ void ex_diag_self(unsigned char *sm, const ex_bars &b, const ex_work &w)
{
    typedef ex_cfg<KD, NWG, MODE> cfg;
    const int iw = (threadIdx.x - 32) >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    float *m = reinterpret_cast<float *>(sm + cfg::oKdw) + 256 * iw;
    for (int c = 0; c < w.nch; c++) {
        const fqla_pipe<cfg::QST> ps = fqla_pipe<cfg::QST>::at(c);
        const unsigned char *st = sm + ps.stage * cfg::stage;
        const float *gm = reinterpret_cast<const float *>(st + cfg::oGam);
        const int nvalid = min(C, w.len - c * C);
        fqla_mbar_wait(&b.full[ps.stage], ps.phase);
#pragma unroll 1
        for (int r = 0; r < 2; r++) {
            const int blk = 2 * iw + r;
            float d[2][4] = {};
#pragma unroll
            for (int kk = 0; kk < KD / 16; kk++) {
                /* rows 16 blk + (lane & 15), 16-byte chunk 2 (kk % 4) + lane / 16 of box kk / 4 */
                const int row = 16 * blk + (lane & 15), ch = 2 * (kk & 3) + (lane >> 4);
                uint32_t a[4];
                fqla_ldsm_x4(a, st + cfg::oK + (kk >> 2) * cfg::KQ + row * 128 + 16 * (ch ^ (row & 7)));
                /* ldmatrix order: (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15) */
                fqla_io<T>::mma(d[0], a, a[0], a[2]);
                fqla_io<T>::mma(d[1], a, a[1], a[3]);
            }
            /* m: lower beta_q K K^T_qi at [16 i + q] (row i's upper part), as mode 22 reads it;
             * REAL: beta_q K K^T_qi Gamma_qi, 0 for tokens q past the end (whatever K holds there) */
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int row = g + 8 * (i >> 1), col = 8 * nt + 2 * tq + (i & 1);
                    if (col <= row) continue;
                    if constexpr (cfg::REAL) {
                        const int tqk = 16 * blk + col, tik = 16 * blk + row;
                        const float *bt = reinterpret_cast<const float *>(st + cfg::oBeta);
                        m[16 * row + col] =
                            tqk < nvalid ? bt[tqk] * d[nt][i] * fqla_ex2((gm[tqk] - gm[tik]) * L2E)
                                         : 0.f;
                    } else {
                        m[16 * row + col] = gm[16 * blk + col] * d[nt][i];
                    }
                }
            if (r == 1) fqla_mbar_arrive(&b.empty[ps.stage]);
            __syncwarp();
            /* dc: the products warpgroup has read chunk c - 1's */
            if (r == 0) fqla_mbar_wait(b.dfree, fqla_pipe<1>::at(c).empty_parity());
            if (lane < 16) {
                const int j = lane;
                float x[16];
                ex_col_inverse(x, m, j);
                /* element (q, j): lane 4 (q % 8) + (j % 8) / 2 of warp blk, word (q / 8) + 2 (j / 8), half j % 2 */
                __half *dc = reinterpret_cast<__half *>(sm + cfg::oDc) + blk * 256;
#pragma unroll
                for (int q = 0; q < 16; q++)
                    dc[8 * (4 * (q & 7) + ((j & 7) >> 1)) + 2 * ((q >> 3) + 2 * (j >> 3)) + (j & 1)] =
                        __float2half_rn(x[q]);
            }
            __syncwarp();
        }
        fqla_mbar_arrive(b.dready);
    }
}

/* The rest of mode 17 after K K^T: acc holds K K^T; Ag' into the Ag slot.
 * pt[0]: Lo, then N (fp16, MN-major B rows); pt[1]: D, block diagonal (its
 * off-diagonal blocks zeroed once at the start). */
template <typename T, int KD, int NWG, int MODE>
__device__ __forceinline__ void ex_pinv(float (&acc)[32], const float (&kd)[2][4], float br0, float br1,
                                        const float (&bc)[4], unsigned char *sm, const ex_bars &b, int c)
{
    typedef ex_cfg<KD, NWG, MODE> cfg;
    typedef fqla_wg<__half> wgh;
    const int tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31;
    unsigned char *t0 = sm + cfg::oL, *t1 = sm + cfg::oL + TILE;
    const float *colf = reinterpret_cast<const float *>(sm + cfg::oColf) + (c & 1) * C;
    const uint64_t d0 = fqla_desc_mnmajor(t0, TILE), d1 = fqla_desc_mnmajor(t1, TILE);
    if constexpr (cfg::DWARPS) {
        /* Lo is stored and D's tile written by the idle warps (dready) */
        fqla_mbar_wait(b.lfree, fqla_pipe<1>::at(c).phase);
        fqla_wg_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
            fqla_wg<__half>::ss64<0, 1>(acc, fqla_desc_kmajor(t1) + kk * FQLA_DESC_K16_KMAJOR,
                                       d0 + kk * FQLA_DESC_K16_MNMAJOR, kk > 0);
        fqla_wg_commit();
        fqla_wg_wait<0>();
        fqla_reg_fence(acc);
    }
    if constexpr (cfg::PMERGE) {
        if constexpr (!cfg::DWARPS) {
        /* Lo = diag(beta) times K K^T's blocks below the diagonal blocks (REAL: stored already) */
        if constexpr (!cfg::REAL)
            ex_tile_store<__half>(t0, acc, warp, lane, [&](float v, int row, int col) {
                return (col >> 4) < (row >> 4) ? ((row & 8) ? br1 : br0) * v : 0.f;
            });
        uint32_t aD[4];
        if constexpr (cfg::PDIAG) {
            ex_diag_inverse(aD, kd, br0, br1, bc, lane);
        } else {
            ex_pack16(aD, kd, 1.f);
        }
        {
            const int mi = lane >> 3, row = 16 * warp + 8 * (mi & 1) + (lane & 7), ch = 2 * warp + (mi >> 1);
            fqla_stsm_x4(t1 + row * 128 + 16 * (ch ^ (row & 7)), aD[0], aD[1], aD[2], aD[3]);
        }
        fqla_fence_async_smem();
        fqla_bar_sync(ex_bar::prod, 128);
        /* N = D Lo: warp w's A rows are D's block w at k-step w, zeros elsewhere */
        uint32_t aK[4][4];
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
#pragma unroll
            for (int i = 0; i < 4; i++) aK[kk][i] = kk == warp ? aD[i] : 0u;
        fqla_reg_fence_u(aK);
        fqla_wg_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++) wgh::rs64<1>(acc, aK[kk], d0 + kk * FQLA_DESC_K16_MNMAJOR, kk > 0);
        fqla_wg_commit();
        fqla_wg_wait<0>();
        fqla_reg_fence(acc);
        } /* !DWARPS */
        uint32_t aN[4][4];
#pragma unroll
        for (int kk = 0; kk < 4; kk++) ex_afrag(aN[kk], acc, kk, 1.f);
        fqla_bar_sync(ex_bar::prod, 128); /* every warp's N is formed: Lo's tile is free */
        ex_tile_store<__half>(t0, acc, warp, lane, [](float v, int, int) { return v; });
        fqla_fence_async_smem();
        fqla_bar_sync(ex_bar::prod, 128);
        /* T = I + N N */
        fqla_wg_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++) wgh::rs64<1>(acc, aN[kk], d0 + kk * FQLA_DESC_K16_MNMAJOR, kk > 0);
        fqla_wg_commit();
        fqla_wg_wait<0>();
        fqla_reg_fence(acc);
        {
            const int g = lane >> 2, tq = lane & 3, r0 = 16 * warp + g;
#pragma unroll
            for (int i = 0; i < 32; i++)
                if (8 * (i >> 2) + 2 * tq + (i & 1) == r0 + 8 * ((i >> 1) & 1)) acc[i] += 1.f;
        }
        /* S = T + (-T) N = (I + N^2)(I - N) */
        uint32_t aT[4][4];
#pragma unroll
        for (int kk = 0; kk < 4; kk++) ex_afrag(aT[kk], acc, kk, -1.f);
        fqla_wg_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++) wgh::rs64<1>(acc, aT[kk], d0 + kk * FQLA_DESC_K16_MNMAJOR, 1);
        fqla_wg_commit();
        fqla_wg_wait<0>();
        fqla_reg_fence(acc);
        /* X = S D */
#pragma unroll
        for (int kk = 0; kk < 4; kk++) ex_afrag(aT[kk], acc, kk, 1.f);
        fqla_wg_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++) wgh::rs64<1>(acc, aT[kk], d1 + kk * FQLA_DESC_K16_MNMAJOR, kk > 0);
        fqla_wg_commit();
        fqla_wg_wait<0>();
        fqla_reg_fence(acc);
        fqla_bar_sync(ex_bar::prod, 128); /* the tiles are free for the next chunk */
    } else {
        fqla_bar_sync(ex_bar::prod, 128); /* colf */
    }
    /* Ag' = X diag(beta e^-gamma) (tril) into the Ag slot once the chain is done with the last one */
    fqla_mbar_wait(b.afree, fqla_pipe<1>::at(c).empty_parity());
    ex_tile_store<T>(sm + cfg::oAg, acc, warp, lane,
                     [&](float v, int row, int col) { return col <= row ? v * colf[col] : 0.f; });
    fqla_fence_async_smem();
    fqla_mbar_arrive(b.aready);
}

/* acc = K K^T of the stage at st, by SS wgmma, retired */
template <typename T, int KD, int NWG, int MODE>
__device__ __forceinline__ void ex_kkt(float (&acc)[32], const unsigned char *st)
{
    typedef ex_cfg<KD, NWG, MODE> cfg;
    fqla_wg_fence();
#pragma unroll
    for (int kk = 0; kk < KD / 16; kk++) {
        const uint64_t dK = fqla_desc_kmajor(st + cfg::oK + (kk >> 2) * cfg::KQ) + (kk & 3) * FQLA_DESC_K16_KMAJOR;
        fqla_wg<T>::template ss64<0, 0>(acc, dK, dK, kk > 0);
    }
    fqla_wg_commit();
    fqla_wg_wait<0>();
    fqla_reg_fence(acc);
}

/* The products warpgroup: Q K^T -> P (ungated) and the token factors into
 * the Pg slot, then K K^T -> L into the L slot. */
template <typename T, int KD, int NWG, int MODE>
__device__ __forceinline__ void ex_products(const fqla_fwd_params &p, unsigned char *sm, const ex_bars &b,
                                            const ex_work &w)
{
    typedef ex_cfg<KD, NWG, MODE> cfg;
    typedef fqla_wg<T> mma;
    const int tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, tq = lane & 3;
    float *L = reinterpret_cast<float *>(sm + cfg::oL);
    if constexpr (cfg::PINV) {
        uint4 *d = reinterpret_cast<uint4 *>(sm + cfg::oL + TILE);
        for (int i = tid; i < (int)(TILE / 16); i += 128) d[i] = make_uint4(0u, 0u, 0u, 0u);
    }
    /* modes 20 / 21: chunk cc's K K^T; Lo into its tile and the diagonal
     * blocks (lower beta_i K K^T, upper beta_j K K^T) to the idle warps */
    auto handoff = [&](int cc) {
        const fqla_pipe<cfg::QST> pc = fqla_pipe<cfg::QST>::at(cc);
        const unsigned char *st = sm + pc.stage * cfg::stage;
        fqla_mbar_wait(&b.full[pc.stage], pc.phase);
        const float *gm = reinterpret_cast<const float *>(st + cfg::oGam);
        float acck[32];
        ex_kkt<T, KD, NWG, MODE>(acck, st);
        const float b0 = gm[16 * warp + g], b1 = gm[16 * warp + g + 8];
        ex_tile_store<__half>(sm + cfg::oL, acck, warp, lane, [&](float v, int row, int col) {
            return (col >> 4) < (row >> 4) ? ((row & 8) ? b1 : b0) * v : 0.f;
        });
        float *kdb = reinterpret_cast<float *>(sm + cfg::oL + 2 * TILE) + 256 * warp;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            float v = acck[i];
#pragma unroll
            for (int ww = 1; ww < 4; ww++) v = warp == ww ? acck[8 * ww + i] : v;
            const int row = g + 8 * ((i >> 1) & 1), col = 8 * (i >> 2) + 2 * tq + (i & 1);
            kdb[16 * row + col] = row > col ? (row & 8 ? b1 : b0) * v : row < col ? gm[16 * warp + col] * v : 0.f;
        }
        fqla_fence_async_smem();
        fqla_mbar_arrive(b.lready);
    };
    if constexpr (cfg::LOOKAHEAD) {
        if (w.nch > 0) handoff(0);
    }
    for (int c = 0; c < w.nch; c++) {
        const fqla_pipe<cfg::QST> ps = fqla_pipe<cfg::QST>::at(c);
        const fqla_pipe<cfg::ASL> pa = fqla_pipe<cfg::ASL>::at(c);
        const int s = ps.stage, a = pa.stage;
        const unsigned char *st = sm + s * cfg::stage;
        unsigned char *sl = sm + cfg::oSlots + a * cfg::slot;
        const int nvalid = min(C, w.len - c * C);
        fqla_mbar_wait(&b.full[s], ps.phase);
        if (c >= PG_AIM) {
            const fqla_pipe<cfg::ASL> pm = fqla_pipe<cfg::ASL>::at(c - PG_AIM);
            fqla_mbar_wait(&b.aim[pm.stage], pm.phase);
        }
        if constexpr (cfg::DWARPS && !cfg::LOOKAHEAD) handoff(c);
        float acc[32];
        fqla_wg_fence();
#pragma unroll
        for (int kk = 0; kk < KD / 16; kk++) {
            const uint64_t dK = fqla_desc_kmajor(st + cfg::oK + (kk >> 2) * cfg::KQ) + (kk & 3) * FQLA_DESC_K16_KMAJOR;
            const uint64_t dQ = fqla_desc_kmajor(st + cfg::oQ + (kk >> 2) * cfg::KQ) + (kk & 3) * FQLA_DESC_K16_KMAJOR;
            mma::template ss64<0, 0>(acc, dQ, dK, kk > 0);
        }
        fqla_wg_commit();
        fqla_mbar_wait(&b.pfree[a], pa.empty_parity());
        const float *gam = reinterpret_cast<const float *>(st + cfg::oGam);
        if (warp == 0) {
            float2 *ud = reinterpret_cast<float2 *>(sl + cfg::sFac);
            float *fo = reinterpret_cast<float *>(sl + cfg::sFac + 512);
            const float gC = gam[C - 1];
#pragma unroll
            for (int h = 0; h < 2; h++) fqla_chain::token_factors(ud, fo, gam, lane + 32 * h, gC, 1.f, 1.f, p.scale);
        }
        fqla_wg_wait<0>();
        fqla_reg_fence(acc);
        const int r0 = 16 * warp + g;
        const float gl[2] = {gam[r0] * L2E, gam[r0 + 8] * L2E}; /* REAL: rows r0, r0 + 8 (row bit 3) */
        if constexpr (cfg::REAL) {
            /* Pg = scale Gamma (.) tril(Q K^T), as fwd_fused.cu's fu_pg */
            ex_tile_store<T>(sl + cfg::sPg, acc, warp, lane, [&](float v, int row, int col) {
                return row < nvalid && col <= row && col < nvalid
                           ? p.scale * v * fqla_ex2(gl[(row >> 3) & 1] - gam[col] * L2E)
                           : 0.f;
            });
        } else {
            /* P = scale tril(Q K^T): masks and the scale only */
            ex_tile_store<T>(sl + cfg::sPg, acc, warp, lane, [&](float v, int row, int col) {
                return row < nvalid && col <= row && col < nvalid ? p.scale * v : 0.f;
            });
        }
        /* K K^T into the same accumulators (mode 20: formed above) */
        if constexpr (!cfg::DWARPS) ex_kkt<T, KD, NWG, MODE>(acc, st);
        if constexpr (cfg::REAL) {
            /* Lo = the gated L's blocks below the diagonal blocks, beta_i K K^T_ij Gamma_ij
             * (rows past the end 0), while the stage holds gamma and beta; its tile is free
             * (the last chunk's merges ended at a warpgroup barrier) */
            const float *bt = reinterpret_cast<const float *>(st + cfg::oBeta);
            const float br[2] = {bt[r0], bt[r0 + 8]};
            ex_tile_store<__half>(sm + cfg::oL, acc, warp, lane, [&](float v, int row, int col) {
                return (col >> 4) < (row >> 4) && row < nvalid
                           ? br[(row >> 3) & 1] * v * fqla_ex2(gl[(row >> 3) & 1] - gam[col] * L2E)
                           : 0.f;
            });
        }
        /* beta's stand-in read before the stage is released */
        const float b0 = gam[r0], b1 = gam[r0 + 8];
        if constexpr (cfg::PINV) {
            float kd[2][4] = {}, bc[4] = {};
            if constexpr (cfg::SDIAG) {
                fqla_mbar_wait(b.dready, fqla_pipe<1>::at(c).phase);
                const uint4 f = reinterpret_cast<const uint4 *>(sm + cfg::oDc)[warp * 32 + lane];
                fqla_mbar_arrive(b.dfree);
                const uint32_t fw[4] = {f.x, f.y, f.z, f.w};
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const float2 v = fqla_io<__half>::unpack(fw[i]);
                    kd[i >> 1][2 * (i & 1)] = v.x, kd[i >> 1][2 * (i & 1) + 1] = v.y;
                }
            } else if constexpr (!cfg::DWARPS) {
#pragma unroll
                for (int i = 0; i < 8; i++) {
                    float v = acc[i];
#pragma unroll
                    for (int ww = 1; ww < 4; ww++) v = warp == ww ? acc[8 * ww + i] : v;
                    kd[i >> 2][i & 3] = v;
                }
#pragma unroll
                for (int i = 0; i < 4; i++) bc[i] = gam[16 * warp + 8 * (i >> 1) + 2 * tq + (i & 1)];
            }
            if (tid < C)
                reinterpret_cast<float *>(sm + cfg::oColf)[(c & 1) * C + tid] =
                    cfg::REAL ? reinterpret_cast<const float *>(st + cfg::oBeta)[tid] : gam[tid] * __expf(-gam[tid]);
            fqla_mbar_arrive(&b.empty[s]);
            fqla_fence_async_smem();
            fqla_mbar_arrive(&b.pready[a]);
            ex_pinv<T, KD, NWG, MODE>(acc, kd, b0, b1, bc, sm, b, c);
            /* mode 21: the next chunk's K K^T now, so its diagonal blocks are
             * inverted while this warpgroup waits for the chain and forms Q K^T */
            if constexpr (cfg::LOOKAHEAD) {
                if (c + 1 < w.nch) handoff(c + 1);
            }
            continue;
        }
        fqla_mbar_arrive(&b.empty[s]);
        fqla_fence_async_smem();
        fqla_mbar_arrive(&b.pready[a]);
        /* L = diag(beta) StrictLower(K K^T), fp32 (gamma stands in for beta);
         * mode 12 on: once the inverse warps are done with the previous one */
        if constexpr (cfg::DEP) fqla_mbar_wait(b.lfree, fqla_pipe<1>::at(c).empty_parity());
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int col = 8 * j + 2 * tq;
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int row = r0 + 8 * h;
                const float bb = h ? b1 : b0;
                float2 v = make_float2(col < row ? bb * acc[4 * j + 2 * h] : 0.f,
                                       col + 1 < row ? bb * acc[4 * j + 2 * h + 1] : 0.f);
                *reinterpret_cast<float2 *>(L + row * LDF + col) = v;
            }
        }
        if constexpr (cfg::DEP) fqla_mbar_arrive(b.lready);
    }
}

/* acc += A B on 16 x 16 fp32 blocks (row stride LDF): tf32 mma.sync (PREC 3:
 * 3xTF32, 1: plain tf32) in
 * the m16n8k8 accumulator layout, or (FF, mode 15) fp32 FMAs on the CUDA
 * cores, lane -> row lane / 2, columns 8 (lane % 2) .. + 7 as acc[n][e] =
 * column + 4 n + e */
template <bool FF, int PREC>
__device__ __forceinline__ void ex_mm16(float (&acc)[2][4], const float *a, const float *b, int lane)
{
    if constexpr (FF) {
        const int r = lane >> 1, c0 = 8 * (lane & 1);
#pragma unroll
        for (int k0 = 0; k0 < 16; k0 += 4) {
            const float4 a4 = *reinterpret_cast<const float4 *>(a + r * LDF + k0);
            const float av[4] = {a4.x, a4.y, a4.z, a4.w};
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const float4 b0 = *reinterpret_cast<const float4 *>(b + (k0 + k) * LDF + c0);
                const float4 b1 = *reinterpret_cast<const float4 *>(b + (k0 + k) * LDF + c0 + 4);
                acc[0][0] = fmaf(av[k], b0.x, acc[0][0]);
                acc[0][1] = fmaf(av[k], b0.y, acc[0][1]);
                acc[0][2] = fmaf(av[k], b0.z, acc[0][2]);
                acc[0][3] = fmaf(av[k], b0.w, acc[0][3]);
                acc[1][0] = fmaf(av[k], b1.x, acc[1][0]);
                acc[1][1] = fmaf(av[k], b1.y, acc[1][1]);
                acc[1][2] = fmaf(av[k], b1.z, acc[1][2]);
                acc[1][3] = fmaf(av[k], b1.w, acc[1][3]);
            }
        }
        return;
    }
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int ks = 0; ks < 2; ks++) {
        const float *ak = a + 8 * ks, *bk = b + 8 * ks * LDF;
        const tf32_a<PREC> af(ak[g * LDF + t], ak[(g + 8) * LDF + t], ak[g * LDF + t + 4], ak[(g + 8) * LDF + t + 4]);
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
            mma_f32<PREC>(acc[nt], af, bk[t * LDF + 8 * nt + g], bk[(t + 4) * LDF + 8 * nt + g]);
    }
}
__device__ __forceinline__ void ex_zero(float (&acc)[2][4])
{
#pragma unroll
    for (int n = 0; n < 2; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[n][e] = 0.f;
}
/* m = sgn acc (a 16 x 16 block, row stride LDF; FF: ex_mm16's FMA layout) */
template <bool FF>
__device__ __forceinline__ void ex_store(float *m, const float (&acc)[2][4], int lane, float sgn)
{
    if constexpr (FF) {
        float *row = m + (lane >> 1) * LDF + 8 * (lane & 1);
        *reinterpret_cast<float4 *>(row) =
            make_float4(sgn * acc[0][0], sgn * acc[0][1], sgn * acc[0][2], sgn * acc[0][3]);
        *reinterpret_cast<float4 *>(row + 4) =
            make_float4(sgn * acc[1][0], sgn * acc[1][1], sgn * acc[1][2], sgn * acc[1][3]);
        return;
    }
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < 2; nt++) {
        *reinterpret_cast<float2 *>(m + g * LDF + 8 * nt + 2 * t) = make_float2(sgn * acc[nt][0], sgn * acc[nt][1]);
        *reinterpret_cast<float2 *>(m + (g + 8) * LDF + 8 * nt + 2 * t) =
            make_float2(sgn * acc[nt][2], sgn * acc[nt][3]);
    }
}
__device__ __forceinline__ float *blk(float *X, int i, int j) { return X + 16 * i * LDF + 16 * j; }

/* The inverse warps (warps 1-3 of warpgroup 0): X = (I + L)^-1 in place,
 * then Ag' = X diag(beta e^-gamma) into the Ag slot, per chunk. */
template <int KD, int NWG, int MODE>
__device__ __forceinline__ void ex_inverse(unsigned char *sm, const ex_bars &b, const ex_work &w)
{
    typedef ex_cfg<KD, NWG, MODE> cfg;
    const int it = threadIdx.x - 32, iw = it >> 5, lane = it & 31; /* 0 .. 95 */
    float *X = reinterpret_cast<float *>(sm + cfg::oL);
    float *colf = reinterpret_cast<float *>(sm + cfg::oColf);
    unsigned char *ag = sm + cfg::oAg;
    for (int c = 0; c < w.nch; c++) {
        const fqla_pipe<cfg::QST> ps = fqla_pipe<cfg::QST>::at(c);
        const unsigned char *st = sm + ps.stage * cfg::stage;
        fqla_mbar_wait(&b.full[ps.stage], ps.phase);
        const float *gam = reinterpret_cast<const float *>(st + cfg::oGam);
        if constexpr (cfg::DEP) fqla_mbar_wait(b.lready, fqla_pipe<1>::at(c).phase);
        /* a. the diagonal blocks by forward substitution: warps 0 and 1, a
         * block per half warp, a column per lane; warp 2 the column factors */
        if (iw < 2) {
            if constexpr (cfg::SUBST) {
                const int bb = 2 * iw + (lane >> 4), j = lane & 15;
                float *D = blk(X, bb, bb);
                float x[16];
#pragma unroll
                for (int i = 0; i < 16; i++) {
                    float s = i == j ? 1.f : 0.f;
#pragma unroll
                    for (int m = 0; m < i; m++) s -= D[i * LDF + m] * x[m];
                    x[i] = i < j ? 0.f : s;
                }
                __syncwarp();
#pragma unroll
                for (int i = 0; i < 16; i++) D[i * LDF + j] = x[i];
            }
        } else {
            for (int t = lane; t < C; t += 32) colf[t] = gam[t] * __expf(-gam[t]);
        }
        fqla_bar_sync(ex_bar::inv, 96);
        if constexpr (cfg::MERGES) {
        /* b1. X_10 = -X_11 L_10 X_00 and X_32 = -X_33 L_32 X_22 (warps 0, 1) */
        if (iw < 2) {
            const int i = 2 * iw + 1, j = 2 * iw;
            float t1[2][4], t2[2][4];
            ex_zero(t1);
            ex_mm16<cfg::FF, cfg::PREC>(t1, blk(X, i, j), blk(X, j, j), lane);
            /* t1 to the block's place (its L is read only here), then X_ii t1 */
            __syncwarp();
            ex_store<cfg::FF>(blk(X, i, j), t1, lane, 1.f);
            __syncwarp();
            ex_zero(t2);
            ex_mm16<cfg::FF, cfg::PREC>(t2, blk(X, i, i), blk(X, i, j), lane);
            __syncwarp();
            ex_store<cfg::FF>(blk(X, i, j), t2, lane, -1.f);
        }
        fqla_bar_sync(ex_bar::inv, 96);
        /* b2. T = B X_A (B = rows 2-3 x columns 0-1 of L), then X_LL = -X_D T */
        {
            float t1[2][4], t2[2][4];
            ex_zero(t1);
            ex_zero(t2);
            if (iw == 0) { /* T_20 = L_20 X_00 + L_21 X_10 */
                ex_mm16<cfg::FF, cfg::PREC>(t1, blk(X, 2, 0), blk(X, 0, 0), lane);
                ex_mm16<cfg::FF, cfg::PREC>(t1, blk(X, 2, 1), blk(X, 1, 0), lane);
            } else if (iw == 1) { /* T_30 = L_30 X_00 + L_31 X_10 */
                ex_mm16<cfg::FF, cfg::PREC>(t1, blk(X, 3, 0), blk(X, 0, 0), lane);
                ex_mm16<cfg::FF, cfg::PREC>(t1, blk(X, 3, 1), blk(X, 1, 0), lane);
            } else { /* T_21 = L_21 X_11, T_31 = L_31 X_11 */
                ex_mm16<cfg::FF, cfg::PREC>(t1, blk(X, 2, 1), blk(X, 1, 1), lane);
                ex_mm16<cfg::FF, cfg::PREC>(t2, blk(X, 3, 1), blk(X, 1, 1), lane);
            }
            fqla_bar_sync(ex_bar::inv, 96);
            if (iw == 0) ex_store<cfg::FF>(blk(X, 2, 0), t1, lane, -1.f); /* -T, so X_LL = X_D (-T) */
            else if (iw == 1) ex_store<cfg::FF>(blk(X, 3, 0), t1, lane, -1.f);
            else {
                ex_store<cfg::FF>(blk(X, 2, 1), t1, lane, -1.f);
                ex_store<cfg::FF>(blk(X, 3, 1), t2, lane, -1.f);
            }
            fqla_bar_sync(ex_bar::inv, 96);
            ex_zero(t1);
            ex_zero(t2);
            if (iw == 0) { /* X_20 = X_22 (-T_20), X_21 = X_22 (-T_21) */
                ex_mm16<cfg::FF, cfg::PREC>(t1, blk(X, 2, 2), blk(X, 2, 0), lane);
                ex_mm16<cfg::FF, cfg::PREC>(t2, blk(X, 2, 2), blk(X, 2, 1), lane);
            } else if (iw == 1) { /* X_30 = X_32 (-T_20) + X_33 (-T_30) */
                ex_mm16<cfg::FF, cfg::PREC>(t1, blk(X, 3, 2), blk(X, 2, 0), lane);
                ex_mm16<cfg::FF, cfg::PREC>(t1, blk(X, 3, 3), blk(X, 3, 0), lane);
            } else { /* X_31 = X_32 (-T_21) + X_33 (-T_31) */
                ex_mm16<cfg::FF, cfg::PREC>(t1, blk(X, 3, 2), blk(X, 2, 1), lane);
                ex_mm16<cfg::FF, cfg::PREC>(t1, blk(X, 3, 3), blk(X, 3, 1), lane);
            }
            fqla_bar_sync(ex_bar::inv, 96);
            if (iw == 0) {
                ex_store<cfg::FF>(blk(X, 2, 0), t1, lane, 1.f);
                ex_store<cfg::FF>(blk(X, 2, 1), t2, lane, 1.f);
            } else if (iw == 1) {
                ex_store<cfg::FF>(blk(X, 3, 0), t1, lane, 1.f);
            } else {
                ex_store<cfg::FF>(blk(X, 3, 1), t1, lane, 1.f);
            }
        }
        } /* MERGES */
        fqla_bar_sync(ex_bar::inv, 96);
        if constexpr (cfg::DEP) fqla_mbar_wait(b.afree, fqla_pipe<1>::at(c).empty_parity());
        /* c. Ag' = X diag(colf) -> bf16 [64][64] in the 128-byte swizzle;
         * 512 16-byte chunks over the 96 threads */
        for (int q = it; q < C * 8; q += 96) {
            const int r = q >> 3, ch = q & 7, c0 = 8 * ch;
            uint32_t u[4];
            if (c0 > r) {
                u[0] = u[1] = u[2] = u[3] = 0u;
            } else {
                const float4 x0 = *reinterpret_cast<const float4 *>(X + r * LDF + c0);
                const float4 x1 = *reinterpret_cast<const float4 *>(X + r * LDF + c0 + 4);
                const float4 f0 = *reinterpret_cast<const float4 *>(colf + c0);
                const float4 f1 = *reinterpret_cast<const float4 *>(colf + c0 + 4);
                u[0] = fqla_io<__nv_bfloat16>::pack(x0.x * f0.x, x0.y * f0.y);
                u[1] = fqla_io<__nv_bfloat16>::pack(x0.z * f0.z, x0.w * f0.w);
                u[2] = fqla_io<__nv_bfloat16>::pack(x1.x * f1.x, x1.y * f1.y);
                u[3] = fqla_io<__nv_bfloat16>::pack(x1.z * f1.z, x1.w * f1.w);
            }
            *reinterpret_cast<uint4 *>(ag + r * 128 + 16 * (ch ^ (r & 7))) = make_uint4(u[0], u[1], u[2], u[3]);
        }
        fqla_fence_async_smem();
        fqla_mbar_arrive(&b.empty[ps.stage]);
        if constexpr (cfg::DEP) {
            fqla_mbar_arrive(b.aready);
            fqla_mbar_arrive(b.lfree);
        } else {
            fqla_bar_sync(ex_bar::inv, 96); /* the next chunk's substitution overwrites X */
        }
    }
}

template <typename T, int KD, int NWG, int MODE>
__device__ __forceinline__ void ex_chain(const fqla_fwd_params &p, const CUtensorMap &tmO, unsigned char *sm,
                                         const ex_bars &b, const ex_work &w, int cw)
{
    typedef ex_cfg<KD, NWG, MODE> cfg;
    const int tid = threadIdx.x & 127, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, tq = lane & 3;
    const int v0 = w.vbase + 64 * cw;
    constexpr int NS = KD / 2;
    constexpr int KS = KD / 16;
    const int vr = v0 + 16 * warp + g, kc = 2 * tq;
    float S[NS];
    fqla_chain::load_state(p, S, w.ns, w.hv, vr, kc);
    T *ob = (T *)p.o + w.batch * p.o_sb + w.hv * p.o_sh + v0;
    unsigned char *Obuf = sm + cfg::oO + cw * 2 * TILE;
    auto store_out = [&](int cc) {
        fqla_chain::store_out<T, int, 2>(p, &tmO, Obuf, ob, cc, w.start, w.len, v0, w.hv, w.batch, cw, tid);
    };
    const uint64_t dAg = fqla_desc_kmajor(sm + cfg::oAg);
    for (int c = 0; c < w.nch; c++) {
        const fqla_pipe<cfg::QST> ps = fqla_pipe<cfg::QST>::at(c);
        const fqla_pipe<cfg::ASL> pa = fqla_pipe<cfg::ASL>::at(c);
        const int s = ps.stage, a = pa.stage;
        unsigned char *st = sm + s * cfg::stage, *sl = sm + cfg::oSlots + a * cfg::slot;
        fqla_mbar_wait(&b.full[s], ps.phase);
        fqla_mbar_wait(&b.pready[a], pa.phase);
        const int nvalid = (int)min(C, w.len - c * C);
        if (nvalid < C) {
            fqla_chain::zero_rows(st + cfg::oK, cfg::KB, cfg::KQ, cw == 0, st + cfg::oV + cw * TILE, nvalid, tid);
            fqla_bar_sync(fqla_chain_bar::chains, 128 * NWG);
        }
        const float *gm = reinterpret_cast<const float *>(st + cfg::oGam);
        const float2 *ud = reinterpret_cast<const float2 *>(sl + cfg::sFac);
        const float *fos = reinterpret_cast<const float *>(sl + cfg::sFac + 512);
        uint32_t sf[KS][4];
        fqla_chain::pack_state<T>(sf, S);
        float accVd[32], accUQ[64];
        fqla_reg_fence_u(sf);
        fqla_wg_fence();
        fqla_chain::g2_issue<T, KS, 128>(accUQ, sf, st + cfg::oK, cfg::KQ);
        fqla_wg_commit();
        store_out(c - 1);
        const float gC = gm[C - 1];
        fqla_wg_wait<0>();
        fqla_reg_fence(accUQ);
        if constexpr (cfg::DEP) fqla_mbar_wait(b.aready, fqla_pipe<1>::at(c).phase);
        fqla_chain::g14_issue<T>(accVd, accUQ, ud, tq, st + cfg::oV + cw * TILE, dAg);
        {
            const float eC = __expf(gC);
#pragma unroll
            for (int i = 0; i < NS; i++) S[i] *= eC;
        }
        fqla_wg_wait<0>();
        fqla_reg_fence(accVd);
        if constexpr (cfg::DEP) fqla_mbar_arrive(b.afree);
        uint32_t vd[4][4], vp[4][4];
        fqla_chain::g56_ready<T>(vd, vp, accVd, ud, tq, S);
        fqla_chain::g5_issue<T, KD>(S, vp, fqla_desc_mnmajor(st + cfg::oK, cfg::KQ));
        fqla_wg_commit();
        float accP[32];
        fqla_chain::g6_issue<T>(accP, vd, fqla_desc_kmajor(sl + cfg::sPg));
        fqla_wg_commit();
        if (tid == 0) fqla_mbar_arrive(&b.aim[a]);
        float fo[16];
        fqla_chain::load_out_factors(fo, fos, tq);
        fqla_wg_wait<0>();
        fqla_reg_fence(S);
        fqla_reg_fence(accUQ);
        fqla_reg_fence(accP);
        fqla_mbar_arrive(&b.empty[s]);
        fqla_mbar_arrive(&b.pfree[a]);
        fqla_chain::output_tile<T>(Obuf + (c & 1) * TILE, fo, accUQ + 32, accP, warp, lane);
    }
    if (w.nch > 0) store_out(w.nch - 1);
    if (tid == 0) fqla_bulk_wait<0>();
    if (p.ht && w.last) fqla_chain::store_state(p, S, w.n, w.hv, vr, kc);
}

template <typename T, int KD, int NWG, int MODE>
__global__ void __launch_bounds__(ex_cfg<KD, NWG, MODE>::THREADS, 1)
    fwd_fused_exp_kernel(const __grid_constant__ fqla_fwd_params p, const __grid_constant__ CUtensorMap tmQ,
                         const __grid_constant__ CUtensorMap tmK, const __grid_constant__ CUtensorMap tmV,
                         const __grid_constant__ CUtensorMap tmO)
{
    typedef ex_cfg<KD, NWG, MODE> cfg;
    extern __shared__ unsigned char smem_raw[];
    unsigned char *sm = smem_raw + ((1024u - (fqla_smem_u32(smem_raw) & 1023u)) & 1023u);
    uint64_t *full = reinterpret_cast<uint64_t *>(sm + cfg::oBar), *empty = full + cfg::QST;
    uint64_t *pready = empty + cfg::QST, *pfree = pready + cfg::ASL, *aim = pfree + cfg::ASL;
    uint64_t *hand = aim + cfg::ASL;
    const ex_bars bars = {full, empty, pready, pfree, aim, hand, hand + 1, hand + 2, hand + 3, hand + 4, hand + 5};
    const int wg = threadIdx.x >> 7;
    const int64_t ns = (int64_t)blockIdx.x / p.HV;
    const int hv = (int)((int64_t)blockIdx.x % p.HV);
    const int hq = hv / p.group;
    const int vbase = blockIdx.y * 64 * NWG;
    int64_t n, batch, start64, len64, slot0;
    bool last;
    if (!fqla_fwd_span(p, ns, n, batch, start64, len64, slot0, last)) return;
    const ex_work w = {ns, n, batch, slot0, (int)start64, (int)len64, ((int)len64 + C - 1) / C, hv, hq, vbase, last};
    if (threadIdx.x == 0) {
        fqla_tma_prefetch(&tmQ);
        fqla_tma_prefetch(&tmK);
        fqla_tma_prefetch(&tmV);
        fqla_tma_prefetch(&tmO);
        for (int s = 0; s < cfg::QST; s++) {
            fqla_mbar_init(&full[s], 1 + (cfg::REAL ? 32 : 0)); /* REAL: + the gate warp's lanes */
            fqla_mbar_init(&empty[s], 128 * (NWG + 1) + (cfg::INV ? 96 : 0) + (cfg::SDIAG ? 64 : 0));
        }
        for (int a = 0; a < cfg::ASL; a++) {
            fqla_mbar_init(&pready[a], 128);
            fqla_mbar_init(&pfree[a], 128 * NWG);
            fqla_mbar_init(&aim[a], NWG);
        }
        fqla_mbar_init(bars.lready, 128);
        fqla_mbar_init(bars.lfree, 96);
        fqla_mbar_init(bars.aready, cfg::PINV ? 128 : 96);
        fqla_mbar_init(bars.afree, 128 * NWG);
        fqla_mbar_init(bars.dready, 64); /* the diagonal blocks' two warps */
        fqla_mbar_init(bars.dfree, 128); /* the products warpgroup */
        fqla_mbar_init_fence();
    }
    __syncthreads();
    if (wg == 0) {
        fqla_setmaxnreg_dec<cfg::SIDE_REGS>();
        if (threadIdx.x < 32) {
            if (fqla_elect_one()) ex_load<KD, NWG, MODE>(p, tmQ, tmK, tmV, sm, bars, w);
        } else if constexpr (cfg::INV) {
            ex_inverse<KD, NWG, MODE>(sm, bars, w);
        } else if constexpr (cfg::DWARPS) {
            ex_diag_warps<KD, NWG, MODE>(sm, bars, w);
        } else if constexpr (cfg::SDIAG) {
            if (threadIdx.x < 96) ex_diag_self<T, KD, NWG, MODE>(sm, bars, w);
            else if constexpr (cfg::REAL) ex_gates<KD, NWG, MODE>(p, sm, bars, w);
        }
        return;
    }
    if (wg <= NWG) {
        fqla_setmaxnreg_inc<CHAIN_REGS>();
        ex_chain<T, KD, NWG, MODE>(p, tmO, sm, bars, w, wg - 1);
    } else {
        fqla_setmaxnreg_dec<cfg::PROD_REGS>();
        ex_products<T, KD, NWG, MODE>(p, sm, bars, w);
    }
}

template <typename T, int KD, int NWG, int MODE>
cudaError_t launch(const fqla_fwd_params &p, const CUtensorMap *maps, cudaStream_t stream)
{
    typedef ex_cfg<KD, NWG, MODE> cfg;
    static fqla_smem_cache cache;
    cudaError_t err = fqla_smem_limit(cache, fwd_fused_exp_kernel<T, KD, NWG, MODE>, cfg::bytes);
    if (err != cudaSuccess) return err;
    dim3 grid((unsigned)(p.N * p.HV), (unsigned)(p.V / (64 * NWG)));
    return fqla_launch(fwd_fused_exp_kernel<T, KD, NWG, MODE>, grid, dim3(cfg::THREADS), cfg::bytes, stream, 0, p,
                       maps[0], maps[1], maps[2], maps[4]);
}

template <int NWG, int MODE>
cudaError_t launch_io(int io_bf16, const fqla_fwd_params &p, const CUtensorMap *maps, cudaStream_t stream)
{
    if (p.K == 64)
        return io_bf16 ? launch<__nv_bfloat16, 64, NWG, MODE>(p, maps, stream)
                       : launch<__half, 64, NWG, MODE>(p, maps, stream);
    return io_bf16 ? launch<__nv_bfloat16, 128, NWG, MODE>(p, maps, stream)
                   : launch<__half, 128, NWG, MODE>(p, maps, stream);
}

/* ... with one or two chain warpgroups a CTA, for the run-time mode (one of
 * the modes from MODE up) */
template <int MODE>
cudaError_t launch_mode(int mode, int nwg, int io_bf16, const fqla_fwd_params &p, const CUtensorMap *maps,
                        cudaStream_t stream)
{
    if constexpr (MODE < FQLA_DEV_FWD_EXP_LAST) {
        if (mode != MODE) return launch_mode<MODE + 1>(mode, nwg, io_bf16, p, maps, stream);
    }
    return nwg == 1 ? launch_io<1, MODE>(io_bf16, p, maps, stream) : launch_io<2, MODE>(io_bf16, p, maps, stream);
}

} // namespace

static int64_t g_exp_launches = 0;

cudaError_t fqla_dev_fwd_launch_fused_exp(const fqla_fwd_params &k, int io_bf16, int mode, int nwg, int parts,
                                          cudaStream_t stream, int *used)
{
    *used = 0;
    fqla_fwd_params p = k;
    p.Pg = NULL;
    if (p.cp_mode || p.l2norm || (p.K != 64 && p.K != 128) || p.V % (64 * nwg) != 0) return cudaSuccess;
    CUtensorMap maps[FQLA_FWD_MAPS];
    fqla_fwd_ag_maps ag; /* encoded with the others, unused: no Ag is copied here */
    if (!fqla_fwd_tma_maps(p, io_bf16, maps, &ag)) return cudaSuccess;
    *used = 1;
    /* no prepare kernel: the chain launch is the whole forward */
    if (!(parts & FQLA_FUSED_CHAIN) || p.N * p.HV == 0) return cudaSuccess;
    if (!fqla_dev_fwd_fused_exp_mode(mode)) mode = FQLA_DEV_FWD_EXP_FIRST;
    g_exp_launches++;
    return launch_mode<FQLA_DEV_FWD_EXP_FIRST>(mode, nwg, io_bf16, p, maps, stream);
}

/* How many times the experiment's kernel was launched (a test's check that
 * a forced mode ran, not the two kernels it falls back to). */
extern "C" __attribute__((visibility("default"))) int64_t fqla_cuda_fwd_debug_exp_launches(void)
{
    return g_exp_launches;
}
