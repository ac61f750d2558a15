/*
 * fwd_prepare.cu - the forward's chunk-parallel preparation kernel
 * (docs/design.md, CUDA). It computes, per chunk of 64 tokens and q/k head,
 * what the sequential chunk kernels need and can be formed for every chunk
 * at once:
 *
 *   gamma      inclusive cumsum of the log gates g (optionally -exp(A_log)
 *              softplus(a + dt_bias); beta optionally sigmoid), per value
 *              head of the GVA group, to the workspace;
 *   rq, rk     with use_qk_l2norm the row factors 1 / sqrt(|x|^2 + 1e-6);
 *   Pg         scale Gamma (.) tril(Q K^T) per value head (only with Q),
 *              Gamma_ij = exp(gamma_i - gamma_j), i >= j;
 *   Ag         Gamma (.) Ar diag(beta) per value head, Ar the gate-free
 *              inverse X of I + StrictLower(diag(beta) K K^T), in packed
 *              strips (fwd_common.cuh).
 *
 * Where a chunk's rows all have beta ||k||^2 in [0, 2] every factor
 * I - beta k k^T is a contraction and Ar stays bounded; elsewhere (raw keys
 * under a strong decay) Ar overflows fp32, and the kernel inverts the gated
 * system I + StrictLower(diag(beta) (Gamma (.) K K^T)) instead, whose
 * inverse is Gamma (.) Ar. The two forms are two instantiations of step 4,
 * chosen per batch of heads by a vote (contractive) that a CTA barrier ORs.
 *
 * Grid: x = the chunk slots' CTAs (PAIR: two slots per CTA), then, varlen
 * only, CTAs that zero the rows of o past the last sequence (one 64-row
 * block each, block (x - slot CTAs) H + y); y = the q/k head. A slot that
 * holds no chunk exits at once (PAIR: its half runs on zeros through the
 * barriers and stores nothing).
 *
 * Block: 256 threads, eight warps, every warp in every step; the roles
 * change per step (prep_thread names them):
 *   1. loads: thread 0 (PAIR: of each half) starts K's TMA copy
 *      (prep_load_k_tma), or every thread its cp.async copies of Q and K
 *      rows (with Q: prep_load_qk_rows); meanwhile warp j loads value head
 *      j's gates and betas and forms gamma (prep_gates);
 *   2. with Q and l2norm: the row factors, 16 rows per warp (prep_l2norm);
 *   3. K K^T (and Q K^T, Pg): with Q warp w its 16x32 tile (rows
 *      16 (w % 4), columns 32 (w / 4)) by ldmatrix + mma.sync
 *      (prep_qk_products), Pg straight from the accumulators
 *      (prep_pg_epilogue); without Q warpgroup 0
 *      (PAIR: each half's) by SS wgmma (kk_wgmma, kk_wgmma_l2n);
 *   4. the regime vote (PAIR: prep_vote_pair), then per batch of HB = 2
 *      value heads (prep_invert_batch) warps 4 hh .. 4 hh + 3 head hh (PAIR:
 *      chunk hh), warp w % 4 one block role: a. the diagonal 16x16 blocks
 *      by forward substitution, b. the off-diagonal blocks by doubling in
 *      3xTF32 mma, c. Ag's 16x32 tile per warp.
 * Registers: 64 per thread where four CTAs share an SM (without Q: PAIR
 * and LEAN), 80 with Q (three CTAs, __launch_bounds__); ptxas spills 4 to
 * 12 bytes in some instantiations (-warn-spills lists them).
 *
 * Shared memory (prep_smem, the plan): three layouts, after their kernels.
 *   with Q    Q and K rows, then X of the batch's two heads over them; KK;
 *             rq, rk; gamma, beta per value head; the warps' staging tiles;
 *             ~65 KB at K = 128 and group 4: three CTAs per SM.
 *   PAIR      (without Q, group 1) two chunk slots per CTA, one per half of
 *             the warps, so that step 4's batch has two "heads" where a
 *             group of one has one: per half one region that holds the
 *             chunk's K tile (TMA), KK over it, and X over KK (step 4
 *             inverts in place); 46.6 KB and four CTAs per SM (x0.92 of
 *             the three-CTA layout's time on the H200).
 *   LEAN      (without Q, groups >= 2) X (the K tile lands in it first), KK,
 *             gamma and beta; no rq, rk arrays and no staging tiles (Ag
 *             leaves from registers): 57,344 bytes at group 4, four CTAs per
 *             SM (the kernel x0.957 on the H200).
 *
 * Why the shapes. The off-diagonal blocks by doubling: five dependent 16x16
 * products on the longest path, against nine for walking block column 0
 * down; on tensor cores, where fp32 FMAs fed from shared memory took ~640
 * warp-wide 16-byte loads per value head. Without Q (fwd_fused.cu forms Pg
 * itself) the kernel was bound by the SM's shared-memory pipe (~75 % busy),
 * so it moves fewer bytes through it: K by TMA (the fused kernel's map,
 * 128-byte swizzle) in place of cp.async, K K^T by one warpgroup's wgmma in
 * place of per-warp ldmatrix + mma, step 4c one straight-line body per tile
 * kind (ag_tile), and each warp's Ag tile leaves by one TMA store
 * (store_tile_tma; LEAN from registers, store_tile_regs). Outputs go from
 * accumulator layout to 16-byte stores through a per-warp staging tile
 * (stmatrix). Gamma is kept in shared memory times log2(e), so each Gamma
 * entry is one ex2, and only the n-tiles that cut the diagonal are masked.
 *
 * PREC (fqla_cuda_fwd_tune's first argument, tuning builds only): 1 does
 * the merges in plain tf32 (one mma per product, as FLA's solve_tril); 3,
 * the default, in 3xTF32 (fp32-level accuracy: the inverse's math stays
 * fp32).
 */
#include "cuda/fwd_common.cuh"
#include "cuda/fwd_prepare_common.cuh"
#include "cuda/kernel/io.cuh"
#include "cuda/kernel/mma_frag.cuh"
#include "cuda/kernel/named_barrier.cuh"
#include "cuda/ptx/ptx.cuh"

#include <stddef.h>

namespace {

constexpr int C = FQLA_FWD_CHUNK;
constexpr int NWARPS = FQLA_FWD_THREADS / 32;

/* fp32 matrices KK and X: [64][72]. 72 = 8 mod 32 words: the float2 operand
 * loads (row g, columns 2t, 2t+1) hit every bank once per half warp. */
constexpr int LDF = C + 8;
constexpr int HB = 2; /* value heads per batch in step 4: four warps each */
static_assert(FQLA_FWD_THREADS == 256 && HB * 4 == NWARPS, "step 4: four warps per head of the batch");

/* ---- shared-memory plan ------------------------------------------------ */

typedef unsigned short prep_b16; /* a bf16 / fp16 element of a tile (T) */

/* per warp a 16x32 b16 output tile in TMA's 64-byte swizzle (store_tile) */
struct prep_staging {
    unsigned char tile[NWARPS][16 * 64];
};
/* the K copies' mbarriers and PAIR's per-half flags */
struct prep_misc {
    uint64_t kbar[2];  /* per half (PAIR); else [0] */
    int have_pair[2];  /* PAIR: the half has a chunk (read in step 4c) */
    int part_pair[2];  /* PAIR: the half's chunk ends inside its tile */
};
static_assert(sizeof(prep_misc) == 32, "prep_misc: 32 bytes (LEAN keeps it in KK's row padding)");

template <int KD>
struct prep_smem {
    static constexpr int LDQ = KD + 8; /* b16 rows of Q and K (with Q) */
    static constexpr size_t kk_bytes = (size_t)C * LDF * sizeof(float); /* one KK (PAIR: one half's region) */
    /* region 0: Q and K rows (with Q; LEAN's K tile at k's address), then X
     * of the batch's heads over them once KK and QK are formed */
    struct qk_rows {
        prep_b16 q[C][LDQ];
        prep_b16 k[C][LDQ];
    };
    union region0 {
        qk_rows qk;
        float x[HB][C][LDF];
    };
    /* with Q; then gamma[group][64], beta[group][64] (x log2(e); run-time
     * group), prep_staging, prep_misc */
    struct with_q {
        region0 r;
        float kk[C][LDF];
        float rq[C], rk[C];
    };
    /* PAIR: per half one region kk[half]: the chunk's K tile (TMA, 128-byte
     * swizzle), then its KK over it, then X over KK */
    struct pair {
        float kk[2][C][LDF];
        float rq[C], rk[C]; /* L2N's rk scratch: half 0's in rq, half 1's in rk */
        float gam[2][C], bet[2][C];
        prep_staging staging;
        prep_misc misc;
    };
    /* LEAN; then gamma[group][64], beta[group][64]. KK's row 0 padding
     * (columns 64..71) holds prep_misc; with l2norm rk's 256 bytes follow
     * the K tile in region 0 */
    struct lean {
        region0 r;
        float kk[C][LDF];
    };
    /* what launch() requests */
    static constexpr size_t gamma_beta(int group) { return (size_t)group * 2 * C * sizeof(float); }
    __host__ __device__ static size_t bytes(int group)
    {
        return sizeof(with_q) + gamma_beta(group) + sizeof(prep_staging) + sizeof(prep_misc);
    }
    __host__ __device__ static size_t bytes_pair() { return sizeof(pair); }
    __host__ __device__ static size_t bytes_lean(int group) { return sizeof(lean) + gamma_beta(group); }

    static_assert(sizeof(region0) % 16 == 0 && sizeof(qk_rows) % 16 == 0, "alignment of the fp32 regions");
    static_assert(offsetof(with_q, kk) == sizeof(region0) && offsetof(lean, kk) == sizeof(region0), "no padding");
    static_assert(sizeof(with_q) == sizeof(region0) + (C * LDF + 2 * C) * sizeof(float), "with_q: no padding");
    static_assert(sizeof(lean) == sizeof(region0) + C * LDF * sizeof(float), "lean: no padding");
    /* the staging tiles start 512-byte aligned (TMA's 64-byte swizzle):
     * gamma and beta rows are 512 bytes per head */
    static_assert(sizeof(with_q) % 512 == 0 && 2 * C * sizeof(float) % 512 == 0, "with_q: staging alignment");
    static_assert(offsetof(pair, staging) % 512 == 0, "PAIR: staging alignment");
    static_assert(sizeof(pair) == 2 * kk_bytes + 6 * C * sizeof(float) + sizeof(prep_staging) +
                                      sizeof(prep_misc),
                  "PAIR: no padding");
    static_assert(kk_bytes % 1024 == 0 && kk_bytes >= (size_t)C * 128 * 2,
                  "PAIR: a K tile (128-byte swizzle, 1024-aligned) in each kk region");
    static_assert(offsetof(qk_rows, k) % 1024 == 0, "LEAN: the K tile (128-byte swizzle) 1024-aligned");
    static_assert(sizeof(region0) >= offsetof(qk_rows, k) + (size_t)C * 128 * 2, "LEAN: the K tile within region 0");
    static_assert(sizeof(region0) >= offsetof(qk_rows, k) + (size_t)C * KD * 2 + C * 4,
                  "LEAN with l2norm: rk after the K tile");
    static_assert(sizeof(prep_misc) <= (LDF - C) * sizeof(float), "LEAN: prep_misc in KK's row padding");
};

/* The kernel's named pointers into its plan (the layout of WQ / PAIR /
 * LEAN); ng the gamma, beta rows: the group's heads, or the pair's chunks. */
template <typename T, int KD, bool WQ, bool PAIR>
struct prep_carve {
    T *Qs, *Ks;       /* [64][LDQ] Q and K rows (with Q); LEAN: Ks the K tile */
    T *Kpair;         /* PAIR: this half's K tile, at the start of its kk region */
    float *KKall;     /* [PAIR ? 2 : 1][64][LDF] K K^T (PAIR: per half, over its K tile) */
    float *X;         /* [HB][64][LDF] the batch's inverses: over Q and K, or PAIR over KK */
    float *rqs, *rks; /* [64] l2norm factors (with Q); PAIR: L2N's rk per half */
    float *gam, *bet; /* [ng][64] gamma log2(e), beta */
    unsigned char *stage; /* this warp's staging tile (LEAN: none) */
    prep_misc *misc;
    uint32_t *vword;  /* [8] the regime votes: KK's row 1 padding */

    __device__ __forceinline__ prep_carve(unsigned char *smem_raw, int ng)
    {
        typedef prep_smem<KD> plan;
        constexpr bool LEAN = !WQ && !PAIR;
        constexpr int NKK = PAIR ? 2 : 1;
        Qs = reinterpret_cast<T *>(smem_raw);
        Ks = Qs + C * plan::LDQ;
        Kpair = reinterpret_cast<T *>(smem_raw + (PAIR ? (threadIdx.x >> 7) * plan::kk_bytes : 0));
        KKall = reinterpret_cast<float *>(smem_raw + (PAIR ? 0 : sizeof(typename plan::region0)));
        X = PAIR ? KKall : reinterpret_cast<float *>(smem_raw);
        rqs = KKall + NKK * C * LDF; /* (LEAN: none) */
        rks = rqs + C;
        gam = LEAN ? rqs : rks + C;
        bet = gam + ng * C;
        stage = reinterpret_cast<unsigned char *>(bet + ng * C) + (threadIdx.x >> 5) * 16 * 64;
        misc = reinterpret_cast<prep_misc *>(
            LEAN ? reinterpret_cast<unsigned char *>(KKall + C)
                 : smem_raw + (PAIR ? plan::bytes_pair() : plan::bytes(ng)) - sizeof(prep_misc));
        vword = reinterpret_cast<uint32_t *>(KKall + LDF + C);
    }
    /* head (PAIR: chunk) h's K K^T: the group's one, or PAIR's per half */
    __device__ __forceinline__ float *kk_of(int h) const { return PAIR ? KKall + h * C * LDF : KKall; }
};

/* Named barriers (kernel/named_barrier.cuh; 0 is the CTA's __syncthreads) */
enum class prep_bar : uint32_t {
    half = 1, /* + half: PAIR's warpgroup of 128 threads (K K^T over its K tile) */
};

/* What a thread is in the kernel (for the role functions of steps 1-2 and
 * the vote): its lane and warp, its half, its chunk slot and head. */
struct prep_thread {
    int tid, lane, warp;
    int half; /* PAIR: the half (warpgroup), its chunk slot */
    int64_t slot;
    int hq;
};
/* a chunk slot's chunk */
struct prep_chunk {
    int64_t batch; /* its sequence's batch row (padded batch) */
    int64_t t0;    /* its first token */
    int nvalid;    /* its valid rows (0: none) */
    bool have;     /* the slot holds a chunk */
};

/* ---- output tiles ------------------------------------------------------ */

/* stmatrix of a 16x32 tile in accumulator layout (u[nt][h] packs row g +
 * 8h, columns 8nt + 2t, +1; g = lane / 4, t = lane % 4) into a warp's
 * staging area: 16 rows of 64 bytes, 16-byte chunk c of row r at chunk
 * c ^ ((r / 2) % 4), conflict-free both ways. */
__device__ __forceinline__ void stage_tile(const uint32_t (&u)[4][2], int lane, unsigned char *stage)
{
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = (lane & 7) + 8 * h, mi = lane >> 3;
        fqla_stsm_x4(stage + r * 64 + 16 * (mi ^ ((r >> 1) & 3)), u[0][h], u[1][h], u[2][h], u[3][h]);
    }
}
/* Stores a 16x32 tile (columns n0..) into 16 rows of a row-major matrix of
 * the io dtype (dst: the tile's first row; pitch: elements per row; only
 * columns below width are written) from accumulator layout through the
 * warp's staging area (stage_tile), then each lane loads and stores 16 bytes
 * twice. */
template <typename T>
__device__ __forceinline__ void store_tile(T *dst, int pitch, int width, const uint32_t (&u)[4][2], int n0, int lane,
                                           unsigned char *stage)
{
    stage_tile(u, lane, stage);
    __syncwarp();
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = (lane >> 2) + 8 * h, ch = lane & 3;
        const uint4 w = *reinterpret_cast<const uint4 *>(stage + r * 64 + 16 * (ch ^ ((r >> 1) & 3)));
        if (n0 + 8 * ch < width) *reinterpret_cast<uint4 *>(dst + r * pitch + n0 + 8 * ch) = w;
    }
    __syncwarp(); /* the staging area is free for the next tile */
}

/* store_tile without the copy-out (PAIR): stmatrix lays the staging tile
 * out as TMA's 64-byte swizzle does (chunk c of row r at c ^ ((r / 2) % 4)
 * in a 512-byte aligned area), so one lane sends it by a TMA store through
 * tmAg (fqla_fwd_map_ag_store) at row y, column x. The copy-out's 16-byte
 * shared loads and global stores were two L1 requests per lane and tile
 * (the kernel x0.985 without them on the H200). pending: this warp has a
 * store in flight from the staging area (lane 0's bulk group), waited for
 * before the area is written again. */
template <typename T>
__device__ __forceinline__ void store_tile_tma(const CUtensorMap *tmAg, int x, int y, const uint32_t (&u)[4][2],
                                               int lane, unsigned char *stage, bool &pending)
{
    if (pending && lane == 0) fqla_bulk_wait_read<0>();
    __syncwarp();
    stage_tile(u, lane, stage);
    fqla_fence_async_smem(); /* each lane's stmatrix writes, for the TMA read */
    __syncwarp();
    if (lane == 0) {
        fqla_tma_store_2d(tmAg, stage, x, y);
        fqla_bulk_commit();
    }
    pending = true;
}

/* Ag's 16x32 tile from accumulator layout (store_tile's u) straight to
 * global memory: each lane its two adjacent columns of a row, 4 bytes per
 * store, only columns below width (LEAN, which has no staging tiles; L2
 * merges the rows' pieces into sectors) */
template <typename T>
__device__ __forceinline__ void store_tile_regs(T *dst, int pitch, int width, const uint32_t (&u)[4][2], int n0,
                                                int lane)
{
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int nt = 0; nt < 4; nt++) {
        if (n0 + 8 * nt >= width) continue;
#pragma unroll
        for (int h = 0; h < 2; h++)
            *reinterpret_cast<uint32_t *>(dst + (g + 8 * h) * pitch + n0 + 8 * nt + 2 * t) = u[nt][h];
    }
}

/* ---- 16x16 fp32 blocks ------------------------------------------------- */

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
/* a compile-time bool as a type (step 4's two instantiations) */
template <bool B>
struct fqla_bool {
    static constexpr bool value = B;
};

/* Whether a chunk's rows all have beta_i KK_ii = beta_i ||k_i||^2 in
 * [0, 2] (KKj its K K^T, bh its beta; the warp's vote, warp-uniform). Then
 * every factor I - beta_t k_t k_t^T of the chunk is a contraction, and the
 * gate-free inverse's entries, Ar_ij = -beta_i k_i^T (prod over i > t > j of
 * those factors) k_j, are at most beta_i ||k_i|| ||k_j||: no growth along
 * the chunk (unit keys, as with l2norm, and beta in [0, 2] always are).
 * Outside it they grow like |beta ||k||^2 - 1|^n and overflow fp32 within a
 * chunk (raw keys), so step 4 then inverts the gated system. CP's
 * negligible-transition test uses the same bound (||M|| <= e^gamma_C). */
__device__ __forceinline__ bool contractive(const float *KKj, const float *bh, int lane)
{
    const float x0 = bh[lane] * KKj[lane * LDF + lane];
    const float x1 = bh[lane + 32] * KKj[(lane + 32) * LDF + lane + 32];
    return __all_sync(0xffffffffu, x0 >= 0.f && x0 <= 2.f && x1 >= 0.f && x1 <= 2.f);
}
/* dst = Gamma (.) src on a 16x16 block (row stride LDF; dst may be src),
 * gr and gc gamma log2(e) of its rows and columns: Gamma_ij = 2^(gr_i -
 * gc_j). DIAG: a diagonal block, whose entries at and above the diagonal
 * become 0 (the substitution never reads them, and 2^(gr_i - gc_j) > 1
 * there could overflow). Lane: row lane % 16, columns 8 (lane / 16) .. + 7. */
template <bool DIAG>
__device__ __forceinline__ void gate16(float *dst, const float *src, const float *gr, const float *gc, int lane)
{
    const int r = lane & 15, c = 8 * (lane >> 4);
    const float g = gr[r];
#pragma unroll
    for (int q = 0; q < 2; q++) {
        const float4 v = *reinterpret_cast<const float4 *>(src + r * LDF + c + 4 * q);
        const float4 gg = *reinterpret_cast<const float4 *>(gc + c + 4 * q);
        float4 o = make_float4(v.x * fqla_ex2(g - gg.x), v.y * fqla_ex2(g - gg.y), v.z * fqla_ex2(g - gg.z),
                               v.w * fqla_ex2(g - gg.w));
        if (DIAG) {
            const int j = c + 4 * q;
            o.x = j < r ? o.x : 0.f;
            o.y = j + 1 < r ? o.y : 0.f;
            o.z = j + 2 < r ? o.z : 0.f;
            o.w = j + 3 < r ? o.w : 0.f;
        }
        *reinterpret_cast<float4 *>(dst + r * LDF + c + 4 * q) = o;
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

/* ---- step 3 without Q: K K^T by wgmma ---------------------------------- */

/* KK = K K^T by one warpgroup, SS wgmma m64n64k16 on the K tile as TMA
 * writes it (KD / 64 64-column boxes, 128-byte swizzle: both operands
 * K-major, the same descriptors), then warp w (of the warpgroup) stores its
 * 16 rows' blocks at or left of the diagonal to KKd (fp32, row stride
 * LDF). mma.sync with ldmatrix fragments made K K^T 34 % of the kernel's
 * shared-memory wavefronts, the largest share, in a kernel bound by its
 * shared-memory pipe: each warp loaded its own copies of the operands.
 * kk_acc: the product into d (accumulator layout), waited for; one
 * descriptor, stepped by constants: 32 bytes per k-step in a box, the box
 * (64 columns x 64 rows) 64 C sizeof(T) bytes on (the descriptor counts
 * 16-byte units) */
template <typename T, int KD>
__device__ __forceinline__ void kk_acc(const T *Ktile, float (&d)[32])
{
    const uint64_t d0 = fqla_desc_kmajor(Ktile);
    fqla_wg_fence();
#pragma unroll
    for (int kk = 0; kk < KD / 16; kk++) {
        const uint64_t dk = d0 + (uint64_t)((kk >> 2) * 64 * C * (int)sizeof(T) / 16) + (kk & 3) * FQLA_DESC_K16_KMAJOR;
        fqla_wg<T>::template ss64<0, 0>(d, dk, dk, kk > 0);
    }
    fqla_wg_commit();
    fqla_wg_wait<0>();
    fqla_reg_fence(d);
}

/* Rows nvalid.. of a K tile as loaded by TMA (KD / 64 boxes of C rows x
 * 128 bytes, 128-byte swizzle: whole rows, so the swizzle does not
 * matter) as zeros; tid of the 128 threads of a warpgroup. */
template <typename T, int KD>
__device__ __forceinline__ void zero_k_rows(T *Ktile, int nvalid, int tid)
{
    const uint4 z = make_uint4(0, 0, 0, 0);
    unsigned char *base = reinterpret_cast<unsigned char *>(Ktile);
#pragma unroll
    for (int b = 0; b < KD / 64; b++)
        for (int idx = tid; idx < (C - nvalid) * 8; idx += 128)
            *reinterpret_cast<uint4 *>(base + (size_t)b * 64 * C * sizeof(T) + (nvalid + (idx >> 3)) * 128 +
                                       16 * (idx & 7)) = z;
}

/* OVER_K: KKd lies over the K tile (PAIR), half's warpgroup */
template <typename T, int KD, bool OVER_K>
__device__ __forceinline__ void kk_wgmma(const T *Ktile, float *KKd, int w, int lane, int half)
{
    float d[32];
    kk_acc<T, KD>(Ktile, d);
    /* KKd over the K tile (PAIR): every warp's part of the product has read
     * it before any warp stores (the warpgroup's named barrier) */
    if (OVER_K) fqla_bar_sync(prep_bar::half, 128, half);
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

/* kk_wgmma with the in-kernel l2norm (L2N): rk_i = 1 / sqrt(|k_i|^2 +
 * 1e-6) from K K^T's own diagonal (fp32 sums of exact bf16 / fp16
 * products, as the two-kernel path's sums over the row), into rk (shared,
 * the warpgroup's 64 rows) and rk_global (the workspace, or null), then
 * K K^T scaled to the normalised keys', rk_i rk_j (K K^T)_ij. Summing the
 * rows from the K tile instead cost the kernel ~15 % even with
 * conflict-free loads. The barrier between the rk writes and their reads:
 * PAIR (OVER_K) half's warpgroup's named barrier, which the store over the
 * K tile needs anyway; LEAN, where only warps 0-3 (active) form K K^T, the
 * CTA barrier, so that every warp passes the same barriers. */
template <typename T, int KD, bool OVER_K>
__device__ __forceinline__ void kk_wgmma_l2n(const T *Ktile, float *KKd, int w, int lane, int half, bool active,
                                             float *rk, float *rk_global)
{
    float d[32];
    const int g = lane >> 2, t = lane & 3;
    if (active) {
        kk_acc<T, KD>(Ktile, d);
        /* the diagonal of rows 16 w + g (n-tile 2 w) and 16 w + g + 8
         * (n-tile 2 w + 1): column 2 t + e = g % 8, so lane t = g / 2 */
        if (t == (g >> 1)) {
            /* w is the warp's: a branch per warp with constant indices (a
             * select over j made ptxas copy d to local memory) */
            float a0, a1;
            switch (w) {
            case 0: a0 = (g & 1) ? d[1] : d[0], a1 = (g & 1) ? d[7] : d[6]; break;
            case 1: a0 = (g & 1) ? d[9] : d[8], a1 = (g & 1) ? d[15] : d[14]; break;
            case 2: a0 = (g & 1) ? d[17] : d[16], a1 = (g & 1) ? d[23] : d[22]; break;
            default: a0 = (g & 1) ? d[25] : d[24], a1 = (g & 1) ? d[31] : d[30]; break;
            }
            const float r0 = rsqrtf(a0 + 1e-6f), r1 = rsqrtf(a1 + 1e-6f);
            rk[16 * w + g] = r0;
            rk[16 * w + g + 8] = r1;
            if (rk_global) {
                rk_global[16 * w + g] = r0;
                rk_global[16 * w + g + 8] = r1;
            }
        }
    }
    if (OVER_K) fqla_bar_sync(prep_bar::half, 128, half); /* rk; and every warp has read the K tile under KKd */
    else __syncthreads();
    if (!active) return;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        if (j / 2 > w) break; /* blocks above the diagonal are not read */
        const float ra = rk[16 * w + g], rb = rk[16 * w + g + 8];
        const float2 rc = *reinterpret_cast<const float2 *>(rk + 8 * j + 2 * t);
        float *dd = KKd + (16 * w + g) * LDF + 8 * j + 2 * t;
        *reinterpret_cast<float2 *>(dd) = make_float2(d[4 * j] * (ra * rc.x), d[4 * j + 1] * (ra * rc.y));
        *reinterpret_cast<float2 *>(dd + 8 * LDF) = make_float2(d[4 * j + 2] * (rb * rc.x), d[4 * j + 3] * (rb * rc.y));
    }
}

/* ---- step 4c's tile without Q ------------------------------------------ */

/* A 16-column block b of Ag's rows 16 mw..: 0 above the diagonal (zeros),
 * 1 the diagonal block (i >= j kept), 2 below it. */
__device__ __forceinline__ int ag_kind(int b, int mw) { return b > mw ? 0 : b == mw ? 1 : 2; }
/* u (store_tile's layout) = Ag = Gamma (.) X diag(beta) on the 16x32
 * tile at (r0, n0), or X diag(beta) where X is the gated system's inverse
 * (gated: Gamma (.) Ar already), the two 16-column blocks of kinds K0, K1
 * (ag_kind): a straight-line body per combination, the diagonal masks only
 * where they apply. The general loop kept all sixteen masks as bits of one
 * register (LOP3, P2R per element) and branched per n-tile: ~11
 * instructions per element, 28 % of the kernel's. Used without Q; the
 * kernels with Q keep the general loop (this body with the kinds at run
 * time spilled ~100 bytes there). */
template <typename T, int K0, int K1>
__device__ __forceinline__ void ag_tile(uint32_t (&u)[4][2], const float *Xh, const float *gh, const float *bh, int r0,
                                        int n0, int lane, bool gated)
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
            float v0 = (gated ? 1.f : fqla_ex2(gi[h] - gc.x)) * xv.x * bc.x;
            float v1 = (gated ? 1.f : fqla_ex2(gi[h] - gc.y)) * xv.y * bc.y;
            if (kind == 1) { /* the diagonal block: i >= j only */
                v0 = lc <= lr ? v0 : 0.f;
                v1 = lc + 1 <= lr ? v1 : 0.f;
            }
            u[nt][h] = io::pack(v0, v1);
        }
    }
}

/* ---- the kernel's roles, in order -------------------------------------- */

/* 1 (without Q): K's TMA copy, two boxes of 64 columns (the fused kernel's
 * map), by one thread per half. Rows past the sequence end hold the next
 * sequence's tokens (zeros past T): harmless while finite, their beta is 0,
 * so M's rows and columns for them are 0 and X is the identity there
 * (the kernel zeroes them once the copy lands); a half without a chunk
 * loads tokens 0..63 and stores nothing. */
template <typename T, int KD, bool PAIR>
__device__ __forceinline__ void prep_load_k_tma(const fqla_fwd_params &p, const CUtensorMap *tmK,
                                                unsigned char *smem_raw, const prep_carve<T, KD, false, PAIR> &s,
                                                const prep_thread &th, const prep_chunk &ch)
{
    if ((th.tid & 127) == 0 && (PAIR || th.tid == 0)) {
        uint64_t *bar = s.misc->kbar + th.half;
        T *Kd = PAIR ? s.Kpair : s.Ks;
        if (fqla_smem_u32(smem_raw) & 1023) __trap(); /* the swizzle's alignment (see the kernel) */
        fqla_mbar_init(bar, 1);
        fqla_mbar_init_fence();
        fqla_mbar_arrive_tx(bar, C * KD * (uint32_t)sizeof(T));
        for (int kb = 0; kb < KD / 64; kb++)
            fqla_tma_load_4d(Kd + kb * 64 * C, tmK, bar, 64 * kb, th.hq, (int)ch.t0, p.varlen ? 0 : (int)ch.batch);
    }
}

/* 1 (with Q): the chunk's Q and K rows by cp.async (zeros past the end),
 * in flight during the gates. A thread copies column vector cv of rows i0,
 * i0 + RPI, ...: one pointer per operand stepped by RPI rows (the index and
 * 64-bit address math per copy were 13 % of the kernel's instructions);
 * rows past the end read nothing (size 0) from the chunk's first row. */
template <typename T, int KD>
__device__ __forceinline__ void prep_load_qk_rows(const fqla_fwd_params &p, const prep_carve<T, KD, true, false> &s,
                                                  const prep_thread &th, const prep_chunk &ch)
{
    constexpr int LDQ = prep_smem<KD>::LDQ;
    const T *qb = (const T *)p.q + ch.batch * p.q_sb + th.hq * p.q_sh;
    const T *kb = (const T *)p.k + ch.batch * p.k_sb + th.hq * p.k_sh;
    constexpr int VPR = KD / 8;
    T *Kd = s.Ks;
    constexpr int CT = FQLA_FWD_THREADS;
    static_assert(CT % VPR == 0, "whole rows per pass");
    constexpr int RPI = CT / VPR; /* rows per pass */
    const int tl = th.tid, i0 = tl / VPR, cv = tl % VPR;
    const T *k0 = kb + ch.t0 * p.k_st + cv * 8, *q0 = qb + ch.t0 * p.q_st + cv * 8;
    const T *ks = k0 + i0 * p.k_st, *qs = q0 + i0 * p.q_st;
    const int64_t kstep = RPI * p.k_st, qstep = RPI * p.q_st;
#pragma unroll
    for (int it = 0; it < C / RPI; it++) {
        const int i = i0 + RPI * it;
        const bool ok = i < ch.nvalid;
        fqla_cp_async16(s.Qs + i * LDQ + cv * 8, ok ? qs : q0, ok ? 16 : 0);
        fqla_cp_async16(Kd + i * LDQ + cv * 8, ok ? ks : k0, ok ? 16 : 0);
        ks += kstep;
        qs += qstep;
    }
    fqla_cp_async_commit();
}

/* 1 (beside the copies): gate, beta and gamma of every value head of the
 * group, one warp per head (PAIR: the first warp of each half, its chunk),
 * to shared memory (gamma times log2(e)) and gamma to the workspace. The
 * first head's loads (graw, braw) were issued before the copies: behind
 * them they waited ~11 k cycles. */
template <bool PAIR>
__device__ __forceinline__ void prep_gates(const fqla_fwd_params &p, const prep_thread &th, const prep_chunk &ch,
                                           int ng, int jg0, const float (&graw)[2], const float (&braw)[2],
                                           float *gam, float *bet)
{
    const int lane = th.lane;
    for (int jj = jg0; jj < ng; jj += NWARPS) {
        const int hv = PAIR ? th.hq : th.hq * p.group + jj;
        float gv[2], bv[2];
        if (jj == jg0) {
            gv[0] = graw[0], gv[1] = graw[1], bv[0] = braw[0], bv[1] = braw[1];
        } else {
            load_gate_beta(p, ch.batch, ch.t0, ch.nvalid, hv, lane, gv, bv);
        }
#pragma unroll
        for (int h = 0; h < 2; h++)
            if (lane + 32 * h < ch.nvalid) finish_gate_beta(p, hv, gv[h], bv[h]);
        /* inclusive scan of 64 values: rows lane and lane + 32 */
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                float y = __shfl_up_sync(0xffffffffu, gv[h], o);
                if (lane >= o) gv[h] += y;
            }
        gv[1] += __shfl_sync(0xffffffffu, gv[0], 31);
        float *gh = gam + jj * C, *bh = bet + jj * C;
        gh[lane] = gv[0] * 1.4426950408889634f;
        gh[lane + 32] = gv[1] * 1.4426950408889634f;
        bh[lane] = bv[0];
        bh[lane + 32] = bv[1];
        if (ch.have) {
            float *gdst = p.gam + ((size_t)th.slot * p.HV + hv) * C;
            gdst[lane] = gv[0];
            gdst[lane + 32] = gv[1];
        }
    }
}

/* 2 (with Q and l2norm): the row factors rq, rk, 128 row tasks (64 of Q,
 * 64 of K), 16 per warp, to shared memory and the workspace. Without Q the
 * factors come from K K^T's diagonal (kk_wgmma_l2n); the fused kernel forms
 * rq from its own Q tile. */
template <typename T, int KD>
__device__ __forceinline__ void prep_l2norm(const fqla_fwd_params &p, const prep_carve<T, KD, true, false> &s,
                                            const prep_thread &th)
{
    typedef fqla_io<T> io;
    constexpr int LDQ = prep_smem<KD>::LDQ;
    const int lane = th.lane;
    for (int r = th.warp; r < 2 * C; r += 8) {
        const T *row = (r < C ? s.Qs + r * LDQ : s.Ks + (r - C) * LDQ);
        float ss = 0.f;
        for (int j = lane; j < KD; j += 32) {
            float x = io::to_f(row[j]);
            ss += x * x;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (lane == 0) {
            float f = rsqrtf(ss + 1e-6f);
            if (r < C) s.rqs[r] = f;
            else s.rks[r - C] = f;
        }
    }
    __syncthreads();
    if (th.tid < C) {
        size_t off = ((size_t)th.slot * p.H + th.hq) * C + th.tid;
        p.rq[off] = s.rqs[th.tid];
        p.rk[off] = s.rks[th.tid];
    }
}

/* 4 (PAIR): the regime vote before step 4, the first warp of each half its
 * chunk, a word per warp in KK's row 1 padding (the first half's region,
 * where its K tile was), ORed by a CTA barrier; returns whether a chunk of
 * the CTA is outside the regime (CTA-uniform). PAIR inverts in place, so it
 * votes here: a redo would find KK's diagonal blocks overwritten. Two
 * instantiations: CP's chunk_ok store (and its address math) only where CP
 * asks. The loop, a word per warp and the OR of all eight (in step 4) are
 * the general form for two voters: written as an `if` on vword[half],
 * ptxas spilled 4 bytes and the kernel ran x1.016. */
template <typename T, int KD>
__device__ __forceinline__ bool prep_vote_pair(const fqla_fwd_params &p, const prep_carve<T, KD, false, true> &s,
                                               const prep_thread &th, int ng)
{
    const int warp = th.warp, lane = th.lane, half = th.half;
    auto vote = [&](auto with_ok) {
        uint32_t mv = 0;
#pragma unroll 1
        for (int jj = (warp & 3) == 0 ? half : 2; jj < ng; jj += NWARPS) {
            const bool ok = contractive(s.kk_of(jj), s.bet + jj * C, lane);
            mv |= ok ? 0u : 1u << (jj & 31);
            /* a half without a chunk votes (beta 0) but has no slot */
            if (decltype(with_ok)::value && lane == 0 && s.misc->have_pair[jj])
                p.chunk_ok[(size_t)(2 * (int64_t)blockIdx.x + jj) * p.HV + th.hq] = ok;
        }
        return mv;
    };
    const uint32_t m = p.chunk_ok ? vote(fqla_bool<true>{}) : vote(fqla_bool<false>{});
    if (lane == 0) s.vword[warp] = m;
    /* also orders the votes' reads of KK before step a's in-place writes */
    return __syncthreads_or(m != 0);
}

/* The copies landed, for every warp (CTA barriers). Without Q the K
 * tile's rows past the sequence's end (the next sequence's tokens, or
 * whatever lies past cu[N]) become zeros: their beta of 0 nulls them only
 * while they are finite (0 * Inf = NaN), and a NaN there would reach the
 * chunk's every output row through Ag. PAIR: the half's warpgroup; LEAN:
 * the first, which forms K K^T. The barrier after it is the CTA's, under a
 * CTA-uniform test, so that every warp passes the same barriers (a
 * warpgroup's named barrier taken by one half only was correct, but
 * compute-sanitizer's racecheck then paired the later CTA barriers wrongly
 * and reported hazards). */
template <typename T, int KD, bool WQ, bool PAIR>
__device__ __forceinline__ void prep_wait_tiles(uint64_t *kbar, const int *part_pair, T *Kt, int nvalid, int warp,
                                                int tid, int half)
{
    if constexpr (!WQ) {
        __syncthreads(); /* the barrier's initialisation (and PAIR's part_pair) is visible */
        fqla_mbar_wait(kbar + half, 0); /* single use: phase 0 */
        if (PAIR ? (part_pair[0] | part_pair[1]) : nvalid < C) {
            if (nvalid < C && (PAIR || warp < 4)) zero_k_rows<T, KD>(Kt, nvalid, tid & 127);
            fqla_fence_async_smem(); /* for the wgmma reads */
            __syncthreads();
        }
    } else {
        fqla_cp_async_wait_all();
        __syncthreads();
    }
}

/* 3 (without Q): KK by wgmma into KKd (no Pg on this path), and with L2N
 * rk (into rk_scratch and the workspace) and KK scaled by it; Kt the K
 * tile, half the warpgroup (PAIR) whose named barrier orders KKd over Kt. */
template <typename T, int KD, bool PAIR, bool L2N>
__device__ __forceinline__ void prep_kk_without_q(const fqla_fwd_params &p, const T *Kt, float *KKd, float *rk_scratch,
                                                  bool have, int64_t slot, int hq, int warp, int lane, int half)
{
    static_assert(KD == 64 || KD == 128 || KD == 256, "the fused path's K tile");
    const int mw = warp & 3;
    if constexpr (L2N)
        kk_wgmma_l2n<T, KD, PAIR>(Kt, KKd, mw, lane, half, PAIR || warp < 4, rk_scratch,
                                  have ? p.rk + ((size_t)slot * p.H + hq) * C : nullptr);
    else if (PAIR || warp < 4)
        kk_wgmma<T, KD, PAIR>(Kt, KKd, mw, lane, half);
}

/* 3 (with Q): KK = K K^T and QK = Q K^T on the warp's 16x32 tile at
 * (r0, n0) by ldmatrix + mma.sync (a warp skips its blocks above the
 * diagonal), then the l2norm factors and the scale; KK's blocks at or left
 * of the diagonal to shared memory, QK (scaled) left in aqk for Pg. */
template <typename T, int KD>
__device__ __forceinline__ void prep_qk_products(const fqla_fwd_params &p, const T *Qs, const T *Ks, float *KK,
                                                 const float *rqs, const float *rks, int lane, int g, int t, int warp,
                                                 float (&akk)[4][4], float (&aqk)[4][4])
{
    typedef fqla_io<T> io;
    /* NOTE: the tile from warp here (as parameters r0 and n0 the
     * comparisons with them were swapped and the SASS changed) */
    const int r0 = 16 * (warp & 3), n0 = (warp >> 2) * 32;
    constexpr int LDQ = prep_smem<KD>::LDQ;
    const T *Ksrc = Ks;
    float *KKd = KK;
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) akk[i][e] = aqk[i][e] = 0.f;
    if (n0 <= r0 + 15)
#pragma unroll(KD == 64 ? 2 : 4)
    for (int ks = 0; ks < KD / 16; ks++) {
        uint32_t ak[4], aq[4];
        fqla_frag_a(ak, Ksrc, LDQ, r0, 16 * ks, lane);
        fqla_frag_a(aq, Qs, LDQ, r0, 16 * ks, lane);
#pragma unroll
        for (int np = 0; np < 2; np++) {
            if (n0 + 16 * np > r0 + 15) continue; /* above the diagonal */
            uint32_t b[4];
            fqla_frag_b_nk(b, Ksrc, LDQ, 16 * ks, n0 + 16 * np, lane);
            io::mma(akk[2 * np], ak, b[0], b[1]);
            io::mma(akk[2 * np + 1], ak, b[2], b[3]);
            io::mma(aqk[2 * np], aq, b[0], b[1]);
            io::mma(aqk[2 * np + 1], aq, b[2], b[3]);
        }
    }
    __syncthreads(); /* rqs / rks written by other warps */
    if (p.l2norm) { /* CTA-uniform; without l2norm only the scale applies */
        const float rq0 = rqs[r0 + g] * p.scale, rq1 = rqs[r0 + g + 8] * p.scale;
        const float rk0 = rks[r0 + g], rk1 = rks[r0 + g + 8];
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            const float2 rc = *reinterpret_cast<const float2 *>(rks + n0 + 8 * nt + 2 * t);
            akk[nt][0] = akk[nt][0] * rk0 * rc.x;
            akk[nt][1] = akk[nt][1] * rk0 * rc.y;
            akk[nt][2] = akk[nt][2] * rk1 * rc.x;
            akk[nt][3] = akk[nt][3] * rk1 * rc.y;
            aqk[nt][0] *= rq0 * rc.x;
            aqk[nt][1] *= rq0 * rc.y;
            aqk[nt][2] *= rq1 * rc.x;
            aqk[nt][3] *= rq1 * rc.y;
        }
    } else {
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) aqk[nt][e] *= p.scale;
    }
#pragma unroll
    for (int nt = 0; nt < 4; nt++) {
        const int col = n0 + 8 * nt + 2 * t;
        if (n0 + 16 * (nt >> 1) <= r0 + 15) { /* the 16x16 block is read later */
            *reinterpret_cast<float2 *>(KKd + (r0 + g) * LDF + col) = make_float2(akk[nt][0], akk[nt][1]);
            *reinterpret_cast<float2 *>(KKd + (r0 + g + 8) * LDF + col) = make_float2(akk[nt][2], akk[nt][3]);
        }
    }
}

/* 3 (with Q): Pg = scale Gamma (.) tril(QK) for every value head of the
 * group, the warp's 16x32 tile at (r0, n0) (n-tiles wholly above the
 * diagonal are zeros), straight from the accumulators aqk through the
 * warp's staging tile. */
template <typename T>
__device__ __forceinline__ void prep_pg_epilogue(const fqla_fwd_params &p, int64_t slot, int hq, int lane, int r0,
                                                 int n0, int g, int t, unsigned char *stage, const float *gam,
                                                 const float (&aqk)[4][4])
{
    typedef fqla_io<T> io;
    for (int jj = 0; jj < p.group; jj++) {
        const int hv = hq * p.group + jj;
        const float *gh = gam + jj * C;
        const float gi[2] = {gh[r0 + g], gh[r0 + g + 8]};
        uint32_t u[4][2];
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            u[nt][0] = u[nt][1] = 0u;
            const int cb = n0 + 8 * nt;
            if (cb <= r0 + 15) {
                const int col = cb + 2 * t;
                const float2 gc = *reinterpret_cast<const float2 *>(gh + col);
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int r = r0 + g + 8 * h;
                    float v0 = aqk[nt][2 * h] * fqla_ex2(gi[h] - gc.x);
                    float v1 = aqk[nt][2 * h + 1] * fqla_ex2(gi[h] - gc.y);
                    if (cb >= r0) { /* the diagonal block: i >= j only */
                        v0 = col <= r ? v0 : 0.f;
                        v1 = col + 1 <= r ? v1 : 0.f;
                    }
                    u[nt][h] = io::pack(v0, v1);
                }
            }
        }
        store_tile<T>((T *)p.Pg + (((size_t)slot * p.HV + hv) * C + r0) * C, C, C, u, n0, lane, stage);
    }
}

/* 4, one batch of nb value heads from head j0 (PAIR: the pair's two
 * chunks), steps a-c: warps 4 hh .. 4 hh + 3 work on head hh of the batch
 * (Xw its X, bw its beta; active: the batch has that head), warp w % 4 =
 * bj one block role. Two instantiations, chosen per batch (CTA-uniform):
 * with no gated head in the batch the gate-free form alone (ANY_GATED
 * false), its registers and instructions as if the gated form did not
 * exist (one body carrying both forms cost the kernel x1.04 on the H200).
 * SPEC (outside PAIR, gate-free): warps 4 .. 3 + nb vote the batch's heads
 * beside step a, whose barrier ORs the votes (vword); where a head is
 * outside it returns true before step b, gated0 / gated1 set, for the
 * gated form to run steps a-c again.
 * NOTE: this function takes the kernel's values one by one, and derives
 * KK from the plan itself: the split into functions was kept only where
 * the kernels' SASS stayed identical, and splitting steps a-c further, or
 * passing the plan and thread structs, changed ptxas's register allocation
 * and schedule. */
template <typename T, int KD, int PREC, bool WQ, bool PAIR, bool ANY_GATED, bool SPEC>
__device__ __forceinline__ bool prep_invert_batch(const fqla_fwd_params &p, const fqla_fwd_ag_maps &tmAg, int j0,
                                                  int nb, bool active, const float *bw_batch, int warp, int lane,
                                                  float *gam, float *bet, float *X, uint32_t *vword, int64_t slot,
                                                  int hq, int hh, int bj, float *Xw, int mw, int r0, int n0, int g,
                                                  int t, int *have_pair, unsigned char *stage, bool &gated0,
                                                  bool &gated1, bool &ag_pending)
{
    typedef fqla_io<T> io;
    constexpr bool LEAN = !WQ && !PAIR;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    float *KKall = reinterpret_cast<float *>(smem_raw + (PAIR ? 0 : sizeof(typename prep_smem<KD>::region0)));
    /* head (PAIR: chunk) h's K K^T: the group's one, or PAIR's per half */
    auto kk_of = [&](int h) -> float * { return PAIR ? KKall + h * C * LDF : KKall; };
    /* NOTE: PAIR's from bet here (the parameter changed its SASS), the
     * others' the kernel's (the reverse) */
    const float *bw = PAIR ? bet + (j0 + hh) * C : bw_batch;
    const bool gs0 = ANY_GATED && gated0, gs1 = ANY_GATED && gated1;
    uint32_t mv = 0; /* SPEC: this warp's vote */

    /* a. the diagonal 16x16 blocks, one per half warp, lane -> column
     * jc: with two heads, warp w takes block w of both; with one, warps
     * 0 and 1 take blocks 0, 1 and 2, 3. First the warp puts its two
     * blocks' strictly lower entries of the gated system, Gamma_ij KK_ij,
     * into X's blocks (PAIR: in place over KK). Then forward
     * substitution, right-looking: once x_i is known it updates every
     * later row's sum; each row's sum adds its terms in increasing k.
     * The gated system (outside the contraction regime only) keeps
     * every entry bounded where the gate-free inverse overflowed fp32
     * (raw keys under a strong decay). */
    if (SPEC && warp >= 4) {
        if (warp - 4 < nb) {
            const int jj = j0 + warp - 4;
            const bool ok = contractive(kk_of(jj), bet + jj * C, lane);
            mv = ok ? 0u : 1u;
            if (p.chunk_ok && lane == 0) p.chunk_ok[(size_t)slot * p.HV + hq * p.group + jj] = ok;
        }
        if (lane == 0) vword[warp - 4] = mv;
    } else {
        const int hj = 2 * warp + (lane >> 4); /* half-warp job */
        const int ha = nb == 2 ? hj & 1 : 0, blk = nb == 2 ? hj >> 1 : hj;
        if (hj < 4 * nb) { /* warp-uniform: 4 nb is even */
#pragma unroll
            for (int e = 0; e < 2; e++) { /* the warp's two jobs */
                const int je = 2 * warp + e;
                const int he = nb == 2 ? je & 1 : 0, se = 16 * (nb == 2 ? je >> 1 : je);
                if (he == 0 ? gs0 : gs1) {
                    const float *ge = gam + (j0 + he) * C + se;
                    /* kk_of(he), written out: through the lambda ptxas reassociated
                     * this address and the PAIR kernels' SASS changed */
                    const float *src = (PAIR ? KKall + he * C * LDF : KKall) + se * LDF + se;
                    gate16<true>(X + he * C * LDF + se * LDF + se, src, ge, ge, lane);
                }
            }
            if (ANY_GATED) __syncwarp();
            const int s = 16 * blk, jc = lane & 15;
            const float *ba = bet + (j0 + ha) * C;
            float *Xa = X + ha * C * LDF;
            /* the system's entries: gated in X, or KK's as stored */
            const float *Ls = (ha == 0 ? gs0 : gs1) ? Xa : kk_of(ha);
            float acc[16], x[16];
#pragma unroll
            for (int i = 0; i < 16; i++) acc[i] = 0.f;
#pragma unroll
            for (int i = 0; i < 16; i++) {
                x[i] = (i == jc ? 1.f : 0.f) - ba[s + i] * acc[i];
#pragma unroll
                for (int r = i + 1; r < 16; r++) acc[r] += Ls[(s + r) * LDF + s + i] * x[i];
            }
            /* PAIR, or the gated system: Ls is Xa (in place); every lane
             * has read the block before any lane overwrites it (without,
             * the x stores start inside the substitution: a sync here
             * cost LEAN +136 FFMA and +46 LDS of code) */
            if (PAIR || ANY_GATED) __syncwarp();
#pragma unroll
            for (int i = 0; i < 16; i++) Xa[(s + i) * LDF + s + jc] = x[i];
        }
    }
    if (SPEC) {
        /* step a's barrier; the words are read only where a head is outside */
        if (__syncthreads_or(mv != 0)) {
            gated0 = vword[0];
            gated1 = nb == 2 && vword[1];
            if (gated0 || gated1) return true;
        }
    } else {
        __syncthreads();
    }

    /* b. the off-diagonal blocks by doubling, X = (I + M)^-1 with
     * M = diag(beta) StrictLower(Gamma (.) KK), in three levels separated by
     * barriers, each warp of the head one role r = bj:
     *   1. r0: X_10 = -X_11 M_10 X_00, r2: X_32 = -X_33 M_32 X_22 (the
     *      two 32x32 diagonal inverses); r1: M_21 X_11 and M_20 X_00,
     *      r3: M_31 X_11 and M_30 X_00 (kept in registers);
     *   2. r1: T_20 = M_20 X_00 + M_21 X_10, T_21 = M_21 X_11; r3: T_30,
     *      T_31 likewise;
     *   3. X_2j = -X_22 T_2j (r0: j = 0, r1: j = 1), X_3j = -(X_32 T_2j +
     *      X_33 T_3j) (r2, r3).
     * Five dependent 16x16 products on the longest path, against nine
     * for walking block column 0 down. T and
     * the level-1 temporaries go through the blocks above the diagonal,
     * which nothing else reads. Products in 3xTF32 (mm16). */
    {
        const float *KKh = kk_of(hh);
        const float *gw = gam + (j0 + hh) * C; /* gamma log2(e) of the warp's head */
        auto blk = [&](float *m, int i, int j) { return m + 16 * i * LDF + 16 * j; };
        auto cblk = [&](const float *m, int i, int j) { return m + 16 * i * LDF + 16 * j; };
        /* the gated system: M's blocks below the diagonal blocks,
         * Gamma (.) KK, go into X's blocks of the same place (PAIR: in
         * place), where this level and the next read them and level 1
         * or 3 overwrites them with X's: each role gates the blocks it
         * reads itself (r0 M_10, r2 M_32, r1 M_20 and M_21, r3 M_30 and
         * M_31), so a warp's own __syncwarp orders it */
        const bool gsw = hh == 0 ? gs0 : gs1;
        const float *Mh = gsw ? Xw : KKh;
        float acc[2][4], acc2[2][4];
        const int r = bj;
        if (active && gsw) {
            if (r == 0 || r == 2) {
                gate16<false>(blk(Xw, r + 1, r), cblk(KKh, r + 1, r), gw + 16 * (r + 1), gw + 16 * r, lane);
            } else {
                const int i = r == 1 ? 2 : 3;
                gate16<false>(blk(Xw, i, 0), cblk(KKh, i, 0), gw + 16 * i, gw, lane);
                gate16<false>(blk(Xw, i, 1), cblk(KKh, i, 1), gw + 16 * i, gw + 16, lane);
            }
            __syncwarp();
        }
        /* level 1 */
        if (active) {
            zero16(acc);
            zero16(acc2);
            if (r == 0 || r == 2) {
                const int i = r + 1, k = r; /* X_10 or X_32 */
                mm16<PREC>(acc, cblk(Mh, i, k), cblk(Xw, k, k), lane);
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
                mm16<PREC>(acc, cblk(Mh, i, 1), cblk(Xw, 1, 1), lane);  /* M_i1 X_11 */
                mm16<PREC>(acc2, cblk(Mh, i, 0), cblk(Xw, 0, 0), lane); /* M_i0 X_00, partial */
            }
        }
        __syncthreads();
        /* level 2 */
        if (active && (r == 1 || r == 3)) {
            const int i = r == 1 ? 2 : 3;
            mm16<PREC>(acc2, cblk(Mh, i, 1), cblk(Xw, 1, 0), lane); /* + M_i1 X_10 */
            rows_times16(acc, bw + 16 * i, lane);
            rows_times16(acc2, bw + 16 * i, lane);
            store16(blk(Xw, r == 1 ? 0 : 1, 2), acc2, lane); /* T_i0 */
            store16(blk(Xw, r == 1 ? 0 : 1, 3), acc, lane);  /* T_i1 */
        }
        __syncthreads();
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
    __syncthreads();

    /* c. Ag = Gamma (.) Ar diag(beta) (X is Ar, or Gamma (.) Ar from the
     * gated system): this warp's tile of each head;
     * the tiles right of the diagonal block (warps 4 and 5) are zeros,
     * which the packed layout does not store */
    /* NOTE: n0 and mw written out from warp: with the parameters the
     * compiler swapped this comparison's operands and the SASS changed */
    for (int h2 = 0; h2 < nb && (warp >> 2) * 32 < fqla_fwd_ag_width(warp & 3); h2++) {
        const int jj = j0 + h2, hv = PAIR ? hq : hq * p.group + jj;
        const int64_t sl = PAIR ? 2 * (int64_t)blockIdx.x + h2 : slot; /* PAIR: chunk h2's slot */
        if (PAIR && !have_pair[h2]) continue; /* warp-uniform */
        const float *Xh = X + h2 * C * LDF, *gh = gam + jj * C, *bh = bet + jj * C;
        const bool gsh = h2 == 0 ? gs0 : gs1; /* X is Gamma (.) Ar already */
        uint32_t u[4][2];
        /* the kinds of the tile's two 16-column blocks: the tile at
         * rows r0.. and columns n0.. meets the diagonal block mw in at
         * most one of them; 3 combinations occur among the stored
         * tiles (warp-uniform) */
        if constexpr (WQ) { /* ag_tile's kinds at run time spilled ~100 bytes here */
            const float gi[2] = {gh[r0 + g], gh[r0 + g + 8]};
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                u[nt][0] = u[nt][1] = 0u;
                const int cb = n0 + 8 * nt;
                if (cb <= r0 + 15) { /* blocks at or left of the diagonal: written */
                    const int col = cb + 2 * t;
                    const float2 gc = *reinterpret_cast<const float2 *>(gh + col);
                    const float2 bc = *reinterpret_cast<const float2 *>(bh + col);
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int r = r0 + g + 8 * h;
                        const float2 xv = *reinterpret_cast<const float2 *>(Xh + r * LDF + col);
                        float v0 = (gsh ? 1.f : fqla_ex2(gi[h] - gc.x)) * xv.x * bc.x;
                        float v1 = (gsh ? 1.f : fqla_ex2(gi[h] - gc.y)) * xv.y * bc.y;
                        if (cb >= r0) { /* the diagonal block: i >= j only */
                            v0 = col <= r ? v0 : 0.f;
                            v1 = col + 1 <= r ? v1 : 0.f;
                        }
                        u[nt][h] = io::pack(v0, v1);
                    }
                }
            }
        } else {
            switch (ag_kind(n0 / 16, mw) * 3 + ag_kind(n0 / 16 + 1, mw)) {
            case 3: ag_tile<T, 1, 0>(u, Xh, gh, bh, r0, n0, lane, gsh); break;
            case 7: ag_tile<T, 2, 1>(u, Xh, gh, bh, r0, n0, lane, gsh); break;
            default: ag_tile<T, 2, 2>(u, Xh, gh, bh, r0, n0, lane, gsh); break;
            }
        }
        /* into strip mw of the packed layout (fwd_common.cuh): row r0
         * of the tile, the strip's width its pitch */
        const int64_t tile = sl * p.HV + hv;
        T *agrow = (T *)p.Ag + fqla_fwd_ag_row(p.slots * p.HV, tile, r0);
        const int agw = fqla_fwd_ag_width(mw);
        if constexpr (WQ)
            store_tile<T>(agrow, agw, agw, u, n0, lane, stage);
        else if constexpr (LEAN)
            store_tile_regs<T>(agrow, agw, agw, u, n0, lane);
        else
            store_tile_tma<T>(&tmAg.strip[mw], n0, (int)(tile * 16), u, lane, stage, ag_pending);
    }
    return false;
}

template <typename T, int KD, int PREC, bool WQ, bool PAIR, bool L2N>
__global__ void __launch_bounds__(FQLA_FWD_THREADS, (PAIR || !WQ) ? 4 : 3)
    fwd_prepare_kernel(const __grid_constant__ fqla_fwd_params p, const __grid_constant__ CUtensorMap tmK,
                       const __grid_constant__ fqla_fwd_ag_maps tmAg)
{
    typedef fqla_io<T> io;
    constexpr int LDQ = prep_smem<KD>::LDQ;
    /* PAIR (group 1, without Q): two chunk slots per CTA, one per half of
     * the warps, in place of two value heads of a group in step 4. Each
     * half's K tile, KK and X share one region: KK is written once the
     * half's K K^T has read K, and step 4 inverts in place (it overwrites a
     * block of M only after the last level that reads it). */
    static_assert(!PAIR || !WQ, "PAIR: without Q");
    /* L2N: the in-kernel l2norm without Q (the kernels with Q read p.l2norm) */
    static_assert(!L2N || !WQ, "L2N: without Q");
    constexpr bool LEAN = !WQ && !PAIR;
    constexpr int NKK = PAIR ? 2 : 1;
    /* 1024-byte alignment: TMA's 128-byte swizzle (no static shared memory
     * in this kernel, so the dynamic base is the CTA's) */
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    /* the plan's buffers (prep_smem, prep_carve) */
    T *Qs = reinterpret_cast<T *>(smem_raw);
    T *Ks = Qs + C * LDQ;
    float *KKall = reinterpret_cast<float *>(smem_raw + (PAIR ? 0 : sizeof(typename prep_smem<KD>::region0)));
    float *X = PAIR ? KKall : reinterpret_cast<float *>(smem_raw);
    T *Kpair = reinterpret_cast<T *>(smem_raw + (PAIR ? (threadIdx.x >> 7) * prep_smem<KD>::kk_bytes : 0));
    float *KK = KKall; /* the group's (PAIR: the first chunk's) */
    auto kk_of = [&](int h) -> float * { return PAIR ? KKall + h * C * LDF : KKall; };
    float *rqs = KKall + NKK * C * LDF; /* (LEAN: none) */
    float *rks = rqs + C;
    const int ng = PAIR ? 2 : p.group; /* gamma, beta rows: the group's heads, or the pair's chunks */
    float *gam = LEAN ? rqs : rks + C; /* [ng][64] gamma * log2(e) */
    float *bet = gam + ng * C;         /* [ng][64] */
    unsigned char *stage = reinterpret_cast<unsigned char *>(bet + ng * C) + (threadIdx.x >> 5) * 16 * 64;
    unsigned char *misc = LEAN ? reinterpret_cast<unsigned char *>(KKall + C)
                               : smem_raw + (PAIR ? prep_smem<KD>::bytes_pair() : prep_smem<KD>::bytes(p.group)) -
                                     sizeof(prep_misc);
    /* prep_misc's fields (as byte offsets: as members the SASS changed) */
    uint64_t *kbar = reinterpret_cast<uint64_t *>(misc + offsetof(prep_misc, kbar));
    int *have_pair = reinterpret_cast<int *>(misc + offsetof(prep_misc, have_pair));
    int *part_pair = reinterpret_cast<int *>(misc + offsetof(prep_misc, part_pair));

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int half = PAIR ? warp >> 2 : 0;
    const int64_t ctas = PAIR ? (p.slots + 1) / 2 : p.slots; /* CTAs with chunk slots */
    const int64_t slot = PAIR ? 2 * (int64_t)blockIdx.x + half : blockIdx.x;
    const int hq = blockIdx.y;
    /* the chunk kernel may start launching (it waits for this kernel's end
     * before its first global access: ptx/pdl.cuh) */
    fqla_pdl_trigger();

    if ((int64_t)blockIdx.x >= ctas) {
        zero_tail<T>(p, ((int64_t)blockIdx.x - ctas) * gridDim.y + hq);
        return;
    }
    /* a slot without a chunk: the CTA returns; with PAIR that half runs on
     * with no tokens (zeros, X = I) through the barriers and stores nothing.
     * Every warp searches: one warp searching and a barrier to broadcast
     * was slower. */
    int64_t c = 0, batch = 0, start = 0, len = 0;
    bool have = slot < p.slots;
    if (have && p.varlen) {
        have = find_slot(p, slot, c, start, len);
    } else if (have) {
        batch = slot / p.cps;
        c = slot % p.cps;
        len = p.T;
    }
    if (!PAIR && !have) return;
    const int64_t t0 = start + c * C;
    const int nvalid = have ? (int)min((int64_t)C, len - c * C) : 0;
    if (PAIR && (tid & 127) == 0) {
        have_pair[half] = have; /* read in step 4c, after barriers */
        part_pair[half] = nvalid < C; /* read after step 1's barrier */
    }

    /* the role functions' view of the plan, the thread and the chunk */
    const prep_carve<T, KD, WQ, PAIR> s(smem_raw, ng);
    prep_thread th;
    th.tid = tid, th.lane = lane, th.warp = warp, th.half = half, th.slot = slot, th.hq = hq;
    prep_chunk ch;
    ch.batch = batch, ch.t0 = t0, ch.nvalid = nvalid, ch.have = have;

    /* 1. the gate warps' first head's gates and betas, issued first (behind
     * the copies they waited ~11 k cycles); the copies of Q and K; the
     * gates of every head */
    const int jg0 = PAIR ? ((warp & 3) == 0 ? half : 2) : warp; /* gate warp's first head (PAIR: chunk) */
    float graw[2] = {0.f, 0.f}, braw[2] = {0.f, 0.f};
    if (jg0 < ng) load_gate_beta(p, batch, t0, nvalid, PAIR ? hq : hq * p.group + jg0, lane, graw, braw);
    if constexpr (!WQ) prep_load_k_tma<T, KD, PAIR>(p, &tmK, smem_raw, s, th, ch);
    else prep_load_qk_rows<T, KD>(p, s, th, ch);
    prep_gates<PAIR>(p, th, ch, ng, jg0, graw, braw, gam, bet);
    prep_wait_tiles<T, KD, WQ, PAIR>(kbar, part_pair, PAIR ? Kpair : Ks, nvalid, warp, tid, half);

    /* 2. with Q and l2norm: the row factors (without Q, L2N forms rk from
     * K K^T's diagonal in step 3, and the fused kernel rq from its Q tile) */
    if constexpr (WQ)
        if (p.l2norm) prep_l2norm<T, KD>(p, s, th);

    /* 3. KK = K K^T (and with Q, QK = Q K^T and Pg): warp -> rows 16 (w % 4),
     * cols 32 (w / 4). Only the 16x16 blocks on or below the diagonal are
     * read later (the merges read KK_ik for i > k, step 4a and the vote the
     * diagonal blocks, Pg is zero above the diagonal), so a warp skips the
     * products and KK stores of its blocks above it (warp-uniform): two
     * warps have none. */
    const int mw = warp & 3, r0 = 16 * mw, n0 = (warp >> 2) * 32;
    if constexpr (!WQ) {
        /* without Q (no Pg on this path): KK only, by wgmma, and with L2N
         * rk and KK scaled by it. PAIR: each half (a warpgroup) its chunk's,
         * its named barrier prep_bar::half + half; LEAN the first warpgroup
         * (the barrier at step 4 waits for it). L2N's rk scratch: PAIR each
         * half's rq / rk row, LEAN the 256 bytes after the K tile in region
         * 0 (dead until step 4). */
        prep_kk_without_q<T, KD, PAIR, L2N>(p, PAIR ? Kpair : Ks, kk_of(half),
                                            PAIR ? rqs + half * C : reinterpret_cast<float *>(Ks + C * KD), have,
                                            slot, hq, warp, lane, half);
    }
    if constexpr (WQ) {
        float akk[4][4], aqk[4][4];
        prep_qk_products<T, KD>(p, Qs, Ks, KK, rqs, rks, lane, g, t, warp, akk, aqk);
        prep_pg_epilogue<T>(p, slot, hq, lane, r0, n0, g, t, stage, gam, aqk);
    }

    /* 4. per batch of up to HB value heads: warp -> head hh = w / 4 of the
     * batch, block column bj = w % 4. Q and K are dead from here on (the
     * barrier after the products above): X overwrites them (PAIR: X
     * overwrites KK, in place). First KK is made visible. Then the regime
     * vote (contractive): one warp per head (PAIR: chunk) tests its rows
     * exactly, a CTA barrier ORs the answers, and only where some head is
     * outside does any warp read the words (one per voter, vword, in row 1's
     * padding of KK, columns 64..71, which nothing else touches; PAIR: the
     * first half's, where its K tile was). The vote also serves CP's
     * negligible-transition test (chunk_ok). Where it stands between two
     * barriers, the CTA waits for its chain of loads and its warp vote:
     * that, not its instructions, is what it costs. So without PAIR, where
     * X does not overwrite KK, warps 4-7 vote each batch's heads while warps
     * 0-3 form its diagonal blocks gate-free (step a), and step a's barrier
     * ORs the votes; a batch with a head outside then runs steps a-c again,
     * gated. PAIR inverts in place, so its first warp of each half votes its
     * chunk before step 4 (prep_vote_pair; a redo would find KK's diagonal
     * blocks overwritten). */
    const int hh = warp >> 2, bj = warp & 3;
    float *Xw = X + hh * C * LDF;
    bool ag_pending = false; /* (PAIR) a TMA store from this warp's staging area in flight */
    __syncthreads();
    uint32_t *const vword = reinterpret_cast<uint32_t *>(KKall + LDF + C);
    bool outside = false; /* PAIR: a chunk of the CTA outside the regime (CTA-uniform) */
    if constexpr (PAIR) outside = prep_vote_pair<T, KD>(p, s, th, ng);
    for (int j0 = 0; j0 < ng; j0 += HB) {
        const int nb = min(HB, ng - j0);
        const bool active = hh < nb;
        const float *bw = bet + (j0 + hh) * C;
        if (j0 > 0) __syncthreads(); /* the previous batch's reads of X done */
        bool gated0 = false, gated1 = false; /* per head of the batch (PAIR: chunk) */
#define FQLA_PREP_BATCH_ARGS                                                                                          \
    p, tmAg, j0, nb, active, bw, warp, lane, gam, bet, X, vword, slot, hq, hh, bj, Xw, mw, r0, n0, g, t, have_pair,  \
        stage, gated0, gated1, ag_pending
        if constexpr (PAIR) {
            if (outside) {
                const uint4 wa = *reinterpret_cast<const uint4 *>(vword), wb = *reinterpret_cast<const uint4 *>(vword + 4);
                const uint32_t m = wa.x | wa.y | wa.z | wa.w | wb.x | wb.y | wb.z | wb.w;
                gated0 = (m >> (j0 & 31)) & 1u;
                gated1 = nb == 2 && ((m >> ((j0 + 1) & 31)) & 1u);
            }
            if (gated0 || gated1) prep_invert_batch<T, KD, PREC, WQ, PAIR, true, false>(FQLA_PREP_BATCH_ARGS);
            else prep_invert_batch<T, KD, PREC, WQ, PAIR, false, false>(FQLA_PREP_BATCH_ARGS);
        } else {
            /* gate-free with the votes beside step a; a batch with a head
             * outside runs steps a-c again, gated */
            if (prep_invert_batch<T, KD, PREC, WQ, PAIR, false, true>(FQLA_PREP_BATCH_ARGS))
                prep_invert_batch<T, KD, PREC, WQ, PAIR, true, false>(FQLA_PREP_BATCH_ARGS);
        }
#undef FQLA_PREP_BATCH_ARGS
    }
    /* the warp's last Ag stores are done before the CTA exits (the fused
     * kernel reads them after this grid completes) */
    if (PAIR && lane == 0) fqla_bulk_wait<0>();
}

template <typename T, int KD, int PREC, bool WQ = true, bool PAIR = false, bool L2N = false>
cudaError_t launch(const fqla_fwd_params &p, const CUtensorMap &tmK, const fqla_fwd_ag_maps &tmAg,
                   cudaStream_t stream)
{
    const size_t smem = PAIR  ? prep_smem<KD>::bytes_pair()
                  : !WQ ? prep_smem<KD>::bytes_lean(p.group) /* LEAN */
                        : prep_smem<KD>::bytes(p.group);
    /* the limit grows with the group (a larger one needs more) */
    static fqla_smem_cache cache;
    cudaError_t err = fqla_smem_limit(cache, fwd_prepare_kernel<T, KD, PREC, WQ, PAIR, L2N>, smem);
    if (err != cudaSuccess) return err;
    /* varlen: the 64-row blocks of o that may lie past the last sequence,
     * spread over the H rows of the grid (CTA (slots + x, y) zeroes block
     * x H + y). One block per CTA column instead made the tail H times as
     * many CTAs, nearly all of them exiting at once: 16384 of the 32896 CTAs
     * at 4 x 8192 tokens, H = 32. */
    const int64_t tail = p.varlen ? ((p.T + C - 1) / C + p.H - 1) / p.H : 0;
    dim3 grid((unsigned)((PAIR ? (p.slots + 1) / 2 : p.slots) + tail), (unsigned)p.H);
    return fqla_launch(fwd_prepare_kernel<T, KD, PREC, WQ, PAIR, L2N>, grid, dim3(FQLA_FWD_THREADS), smem, stream, 0, p,
                       tmK, tmAg);
}

/* the kernels without Q (fwd_fused.cu forms Pg, K = 64, 128 or 256): K by
 * TMA, Ag stored by TMA; at group 1 two chunks per CTA (PAIR), except at
 * K = 256, whose 32 KB K tile PAIR's 18 KB region per half cannot hold:
 * LEAN there at every group (~87 KB, two CTAs per SM). L2N: the in-kernel
 * l2norm's rk, from K K^T's diagonal. */
template <typename T, int PREC, bool L2N>
cudaError_t launch_without_q(const fqla_fwd_params &p, const CUtensorMap &tmK, const fqla_fwd_ag_maps &tmAg,
                             cudaStream_t stream)
{
    if (p.K == 256) return launch<T, 256, PREC, false, false, L2N>(p, tmK, tmAg, stream);
    if (p.K == 64)
        return p.group == 1 ? launch<T, 64, PREC, false, true, L2N>(p, tmK, tmAg, stream)
                            : launch<T, 64, PREC, false, false, L2N>(p, tmK, tmAg, stream);
    return p.group == 1 ? launch<T, 128, PREC, false, true, L2N>(p, tmK, tmAg, stream)
                        : launch<T, 128, PREC, false, false, L2N>(p, tmK, tmAg, stream);
}

template <typename T, int PREC>
cudaError_t launch_kd(const fqla_fwd_params &p, const CUtensorMap *tmK, const fqla_fwd_ag_maps *tmAg,
                      cudaStream_t stream)
{
    /* without Pg: no Q, no Q K^T (launch_without_q) */
    if (!p.Pg) {
        if (!fqla_fwd_fused_k(p.K) || !tmK || !tmAg) return cudaErrorInvalidValue;
        return p.l2norm ? launch_without_q<T, PREC, true>(p, *tmK, *tmAg, stream)
                        : launch_without_q<T, PREC, false>(p, *tmK, *tmAg, stream);
    }
    /* the kernels with Q copy K and store Ag from the threads */
    static const CUtensorMap unused = {};
    static const fqla_fwd_ag_maps unused_ag = {};
    switch (p.K) {
    case 64: return launch<T, 64, PREC>(p, unused, unused_ag, stream);
    case 128: return launch<T, 128, PREC>(p, unused, unused_ag, stream);
    case 256: return launch<T, 256, PREC>(p, unused, unused_ag, stream);
    }
    return cudaErrorInvalidValue;
}

/* variant: 2 -> plain tf32 merges (tuning builds only); else 3xTF32 */
template <typename T>
cudaError_t launch_variant(const fqla_fwd_params &p, int variant, const CUtensorMap *tmK, const fqla_fwd_ag_maps *tmAg,
                           cudaStream_t stream)
{
#if FQLA_FWD_TUNING
    if (variant == 2) return launch_kd<T, 1>(p, tmK, tmAg, stream);
#endif
    (void)variant;
    return launch_kd<T, 3>(p, tmK, tmAg, stream);
}

} // namespace

/* hb: the variant of fqla_cuda_fwd_tune's first argument (see the top). */
cudaError_t fqla_fwd_launch_prepare(const fqla_fwd_params &p, int io_bf16, int hb, const CUtensorMap *tmK,
                                    const fqla_fwd_ag_maps *tmAg, cudaStream_t stream)
{
    if (p.slots + (p.varlen ? (p.T + C - 1) / C : 0) == 0 || p.H == 0) return cudaSuccess;
    return io_bf16 ? launch_variant<__nv_bfloat16>(p, hb, tmK, tmAg, stream)
                   : launch_variant<__half>(p, hb, tmK, tmAg, stream);
}
