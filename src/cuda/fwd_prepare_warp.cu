/*
 * fwd_prepare_warp.cu - the forward's preparation without Q, one warp per
 * (chunk slot, q/k head): gamma and Ag of the group's value heads for the
 * kernel that forms Pg beside the chain (fwd_fused.cu). Same outputs as
 * fwd_prepare.cu's kernel without Q (gamma to the workspace, Ag in the
 * packed layout of fwd_common.cuh), by another organisation of the work
 * (docs/perf.md, session 19):
 *
 *   1. K's tile by TMA (the fused kernel's map) and the first value head's
 *      gates and betas, in flight together;
 *   2. K K^T's ten 16x16 blocks at and below the diagonal on tensor cores
 *      (ldmatrix, m16n8k16, fp32 accumulate, all ten in registers), then
 *      StrictLower(K K^T) over the tile, shared by the group's heads;
 *   per value head (the next head's gates in flight meanwhile):
 *   3. gamma = the gates' inclusive cumsum (lane: rows lane, lane + 32),
 *      written to the workspace;
 *   4. X = (I + N)^-1 with N = diag(beta) StrictLower(K K^T), one column per
 *      lane (columns lane and 32 + lane): the top left 32x32 block by
 *      forward substitution in fp32, every lane walking the same rows in
 *      step so that each load of K K^T is one broadcast (beta scales each
 *      row's sum); the dense lower-left product K K^T_BA X_AA in 3xTF32 on
 *      tensor cores; then rows 32..63 of both columns by substitution from
 *      it (the bottom right block's in the same pass);
 *   5. Ag_ic = exp2(l_i - l_c) X_ic beta_c (l = gamma log2 e) for i >= c,
 *      zero above the diagonal: one row of the packed layout per store
 *      instruction, the lanes' columns side by side.
 *
 * Why: the CTA kernel spends a chunk's life in phase barriers and its
 * dependent steps interleaved from six chunks per SM (docs/perf.md, session
 * 18: no single limit); here nothing waits on another warp, and twelve
 * items per SM run side by side (4 warps per CTA, 72 KB of shared memory:
 * three CTAs per SM).
 *
 * Covered: K = 128, no l2norm, no chunk_ok (not CP's pre-pass), bf16 or
 * fp16 K; any group, varlen or padded batches, the in-kernel gate and beta
 * options. Extra CTAs (varlen) zero the rows of o after the last sequence,
 * as the CTA kernel's do.
 */
#include "cuda/fwd_common.cuh"
#include "cuda/fwd_prepare_common.cuh"
#include "cuda/fwd_ptx.cuh"
#include "cuda/hopper.cuh"
#include "cuda/pdl.cuh"

namespace {

constexpr int C = FQLA_FWD_CHUNK;
constexpr int KD = 128;
constexpr int WARPS = 4;                                     /* per CTA, one item each */
constexpr int LDN = C + 4; /* N's row pitch (floats): 16-byte aligned rows */
/* per warp: K's tile (16 KB, by TMA), then N over it (64 x 68 fp32), in a
 * 1024-aligned region; then the warps' mbarriers: 72 KB, three CTAs per SM */
constexpr int REGION = 18 * 1024;
static_assert(C * LDN * 4 <= REGION && C * KD * 2 <= REGION, "the warp's region holds K's tile and N");
constexpr size_t SMEM = (size_t)WARPS * REGION + WARPS * 8;

/* Address of 16-byte chunk ch (k = 8 ch .. 8 ch + 7) of row r of the K
 * tile as TMA lays it out: two boxes of 64 columns (8 KB each), 128-byte
 * rows, chunk ch % 8 of a row at position (ch % 8) ^ (r % 8). */
__device__ __forceinline__ const unsigned char *ktile_at(const unsigned char *tile, int r, int ch)
{
    return tile + (ch >> 3) * (C * 128) + r * 128 + (((ch & 7) ^ (r & 7)) << 4);
}

/* acc[b(i, j)] = block (i, j) of K K^T (i >= j, b = i (i + 1) / 2 + j), n8
 * halves [2]: per k-step one ldmatrix of each block row in A order and one
 * in B order (the same four 8x8 matrices, B's pairs adjacent), 20 mma. */
template <typename T>
__device__ __forceinline__ void kk_lower(float (&acc)[10][2][4], const unsigned char *tile, int lane)
{
    const int m = lane >> 3, rr = lane & 7;
#pragma unroll
    for (int b = 0; b < 10; b++)
#pragma unroll
        for (int nh = 0; nh < 2; nh++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[b][nh][e] = 0.f;
#pragma unroll 2
    for (int ks = 0; ks < KD / 16; ks++) {
        uint32_t a[4][4], bf[4][4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            /* A: (rows 0-7, k 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15) */
            fqla_ldsm_x4(a[i], ktile_at(tile, 16 * i + rr + 8 * (m & 1), 2 * ks + (m >> 1)));
            /* B: (n 0-7, k 0-7), (0-7, 8-15), (8-15, 0-7), (8-15, 8-15) */
            fqla_ldsm_x4(bf[i], ktile_at(tile, 16 * i + rr + 8 * (m >> 1), 2 * ks + (m & 1)));
        }
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j <= i; j++) {
                const int b = i * (i + 1) / 2 + j;
                fqla_io<T>::mma(acc[b][0], a[i], bf[j][0], bf[j][1]);
                fqla_io<T>::mma(acc[b][1], a[i], bf[j][2], bf[j][3]);
            }
    }
}

/* Block (i, j) of StrictLower(K K^T) into the warp's rows (accumulator
 * layout: acc[nh][2e + q] is row 16 i + g + 8 e, column 16 j + 8 nh + 2 t
 * + q); beta is applied by the solve, per value head. */
__device__ __forceinline__ void store_kkblock(float *KKw, const float (&acc)[2][4], int i, int j, int lane)
{
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int e = 0; e < 2; e++) {
        const int r = 16 * i + g + 8 * e;
#pragma unroll
        for (int nh = 0; nh < 2; nh++) {
            const int col = 16 * j + 8 * nh + 2 * t;
            float v0 = acc[nh][2 * e], v1 = acc[nh][2 * e + 1];
            if (i == j) { /* strictly below the diagonal only */
                v0 = col < r ? v0 : 0.f;
                v1 = col + 1 < r ? v1 : 0.f;
            }
            *reinterpret_cast<float2 *>(KKw + r * LDN + col) = make_float2(v0, v1);
        }
    }
}

/* Rows 0..31 of X's column c = lane (the top left 32x32 block's) by
 * forward substitution: x_i = [i == c] - beta_i sum_{j < i} KK_ij x_j (N =
 * diag(beta) StrictLower(KK)), four partial sums per row; every lane reads
 * the same KK words (one broadcast each). bv: the lane's betas of rows
 * lane, lane + 32. */
__device__ __forceinline__ void solve_top(float (&x)[32], const float *KKw, const float (&bv)[2], int lane)
{
#pragma unroll
    for (int i = 0; i < 32; i++) {
        const float *nr = KKw + i * LDN;
        const float bi = __shfl_sync(0xffffffffu, bv[0], i);
        float a[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int j4 = 0; j4 < i; j4 += 4) {
            const float4 n = *reinterpret_cast<const float4 *>(nr + j4);
            a[0] = fmaf(n.x, x[j4], a[0]);
            if (j4 + 1 < i) a[1] = fmaf(n.y, x[j4 + 1], a[1]);
            if (j4 + 2 < i) a[2] = fmaf(n.z, x[j4 + 2], a[2]);
            if (j4 + 3 < i) a[3] = fmaf(n.w, x[j4 + 3], a[3]);
        }
        x[i] = lane == i ? 1.f : -bi * ((a[0] + a[1]) + (a[2] + a[3]));
    }
}

/* Y = KK_BA X_AA (rows 32..63 of KK, columns 0..31, times the top left
 * block of X; N_BA X_AA = diag(beta_B) Y) in 3xTF32 on tensor cores,
 * through the scratch block R (rows 0..31, columns 32..63 of the warp's KK
 * area, which KK leaves unused): X_AA in, lane c's column; Y out,
 * row-major, for lane c's reads of column c. */
__device__ __forceinline__ void lower_left_product(float *KKw, const float (&x)[32], int lane)
{
    const int g = lane >> 2, t = lane & 3;
    float *R = KKw + 32;
#pragma unroll
    for (int j = 0; j < 32; j++) R[j * LDN + lane] = x[j];
    __syncwarp();
    float acc[2][4][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mt][nt][e] = 0.f;
#pragma unroll
    for (int ks = 0; ks < 4; ks++) {
        float b[4][2];
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            b[nt][0] = R[(8 * ks + t) * LDN + 8 * nt + g];
            b[nt][1] = R[(8 * ks + t + 4) * LDN + 8 * nt + g];
        }
#pragma unroll
        for (int mt = 0; mt < 2; mt++) {
            const float *nr = KKw + (32 + 16 * mt + g) * LDN + 8 * ks + t;
            const tf32_a<3> a(nr[0], nr[8 * LDN], nr[4], nr[8 * LDN + 4]);
#pragma unroll
            for (int nt = 0; nt < 4; nt++) mma_f32<3>(acc[mt][nt], a, b[nt][0], b[nt][1]);
        }
    }
    __syncwarp(); /* every lane's reads of X_AA are done */
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++)
                *reinterpret_cast<float2 *>(R + (16 * mt + g + 8 * e) * LDN + 8 * nt + 2 * t) =
                    make_float2(acc[mt][nt][2 * e], acc[mt][nt][2 * e + 1]);
    __syncwarp();
}

/* Rows 32..63 of X's columns lane (xa, from Y's column lane) and 32 + lane
 * (xb: the bottom right block's), one pass over KK's rows for both. */
__device__ __forceinline__ void solve_bottom(float (&xa)[32], float (&xb)[32], const float *KKw, const float (&bv)[2],
                                             int lane)
{
    const float *R = KKw + 32;
#pragma unroll
    for (int i = 0; i < 32; i++) {
        const float *nr = KKw + (32 + i) * LDN + 32;
        const float bi = __shfl_sync(0xffffffffu, bv[1], i);
        float a[4] = {R[i * LDN + lane], 0.f, 0.f, 0.f}, b[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int j4 = 0; j4 < i; j4 += 4) {
            const float4 n = *reinterpret_cast<const float4 *>(nr + j4);
            a[0] = fmaf(n.x, xa[j4], a[0]);
            b[0] = fmaf(n.x, xb[j4], b[0]);
            if (j4 + 1 < i) a[1] = fmaf(n.y, xa[j4 + 1], a[1]), b[1] = fmaf(n.y, xb[j4 + 1], b[1]);
            if (j4 + 2 < i) a[2] = fmaf(n.z, xa[j4 + 2], a[2]), b[2] = fmaf(n.z, xb[j4 + 2], b[2]);
            if (j4 + 3 < i) a[3] = fmaf(n.w, xa[j4 + 3], a[3]), b[3] = fmaf(n.w, xb[j4 + 3], b[3]);
        }
        xa[i] = -bi * ((a[0] + a[1]) + (a[2] + a[3]));
        xb[i] = lane == i ? 1.f : -bi * ((b[0] + b[1]) + (b[2] + b[3]));
    }
}

/* Ag's column c = C0 + lane, rows R0 .. R0 + NR - 1 (x: X's), into the
 * packed layout: a row's strip holds columns below 16 (row / 16 + 1). lv,
 * bv: the lane's l = gamma log2 e and beta of rows lane, lane + 32. */
template <typename T, int C0, int R0, int NR>
__device__ __forceinline__ void store_ag_column(const float (&x)[NR], const fqla_fwd_params &p, int64_t tile,
                                                const float (&lv)[2], const float (&bv)[2], int lane)
{
    const int c = C0 + lane;
    const float lc = lv[C0 >> 5], bc = bv[C0 >> 5];
    unsigned short *ag = reinterpret_cast<unsigned short *>(p.Ag);
    const int64_t tiles = p.slots * p.HV;
#pragma unroll
    for (int i = 0; i < NR; i++) {
        const int r = R0 + i;
        const float li = __shfl_sync(0xffffffffu, lv[r >> 5], r & 31); /* before the lanes part */
        if (c >= fqla_fwd_ag_width(r >> 4)) continue; /* right of the row's strip */
        const float v = r >= c ? fqla_ex2(li - lc) * x[i] * bc : 0.f; /* above the diagonal: 0 (ex2 may be inf) */
        ag[fqla_fwd_ag_row(tiles, tile, r) + c] = (unsigned short)(fqla_io<T>::pack(v, 0.f) & 0xffffu);
    }
}

template <typename T>
__global__ void __launch_bounds__(WARPS * 32, 3) fwd_prepare_warp_kernel(const __grid_constant__ fqla_fwd_params p, const __grid_constant__ CUtensorMap tmK)
{
    /* 1024-byte alignment: TMA's 128-byte swizzle (no static shared memory
     * in this kernel, so the dynamic base is the CTA's) */
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    /* the fused kernel may start launching (it waits for this grid's end
     * before its first global access: pdl.cuh) */
    fqla_pdl_trigger();
    const int64_t items = p.slots * p.H, ctas = (items + WARPS - 1) / WARPS;
    if ((int64_t)blockIdx.x >= ctas) {
        zero_tail<T>(p, (int64_t)blockIdx.x - ctas);
        return;
    }
    /* the warp's item: a chunk slot and q/k head, for the group's value heads */
    const int64_t item = (int64_t)blockIdx.x * WARPS + warp;
    if (item >= items) return;
    const int64_t slot = item / p.H;
    const int hq = (int)(item % p.H);
    int64_t c = 0, batch = 0, start = 0, len = 0;
    if (p.varlen) {
        if (!find_slot(p, slot, c, start, len)) return; /* a slot without a chunk */
    } else {
        batch = slot / p.cps;
        c = slot % p.cps;
        len = p.T;
    }
    const int64_t t0 = start + c * C;
    const int nvalid = (int)min((int64_t)C, len - c * C);

    /* 1. K's tile by TMA into the warp's region, and the first value head's
     * gates and betas (rows lane, lane + 32), both in flight during the
     * wait for the other. Rows past the sequence hold the next tokens or
     * zeros: harmless, every N entry with such a row or column has that
     * row's beta = 0, since N_ij needs i > j. */
    unsigned char *region = smem_raw + warp * REGION;
    uint64_t *kbar = reinterpret_cast<uint64_t *>(smem_raw + WARPS * REGION) + warp;
    if (lane == 0) {
        if (fqla_smem_u32(smem_raw) & 1023) __trap(); /* the swizzle's alignment (see above) */
        fqla_mbar_init(kbar, 1);
        fqla_mbar_init_fence();
        fqla_mbar_arrive_tx(kbar, C * KD * (uint32_t)sizeof(T));
        for (int kb = 0; kb < KD / 64; kb++)
            fqla_tma_load_4d(region + kb * C * 128, &tmK, kbar, 64 * kb, hq, (int)t0, p.varlen ? 0 : (int)batch);
    }
    float graw[2], braw[2];
    load_gate_beta(p, batch, t0, nvalid, hq * p.group, lane, graw, braw);

    /* 2. K K^T's lower blocks from the tile, StrictLower(K K^T) over it
     * (shared by the group's value heads) */
    __syncwarp(); /* the barrier's initialisation is visible */
    fqla_mbar_wait(kbar, 0);
    float *KKw = reinterpret_cast<float *>(region);
    {
        float acc[10][2][4];
        kk_lower<T>(acc, region, lane);
        __syncwarp(); /* every lane's reads of the tile are done */
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int j = 0; j <= i; j++) store_kkblock(KKw, acc[i * (i + 1) / 2 + j], i, j, lane);
    }
    __syncwarp();

    for (int jv = 0; jv < p.group; jv++) {
        const int hv = hq * p.group + jv;
        /* 3. this head's gamma (written to the workspace) and beta; the next
         * head's raw gates and betas in flight */
        float gv[2] = {graw[0], graw[1]}, bv[2] = {braw[0], braw[1]};
        if (jv + 1 < p.group) load_gate_beta(p, batch, t0, nvalid, hv + 1, lane, graw, braw);
#pragma unroll
        for (int h = 0; h < 2; h++)
            if (lane + 32 * h < nvalid) finish_gate_beta(p, hv, gv[h], bv[h]);
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const float y = __shfl_up_sync(0xffffffffu, gv[h], o);
                if (lane >= o) gv[h] += y;
            }
        gv[1] += __shfl_sync(0xffffffffu, gv[0], 31);
        float *gdst = p.gam + ((size_t)slot * p.HV + hv) * C;
        gdst[lane] = gv[0];
        gdst[lane + 32] = gv[1];
        const float lv[2] = {gv[0] * 1.4426950408889634f, gv[1] * 1.4426950408889634f};

        /* 4. X and Ag by columns: lane's rows 0..31, then its rows 32..63
         * with those of column 32 + lane */
        const int64_t tile = slot * p.HV + hv;
        {
            float x[32];
            solve_top(x, KKw, bv, lane);
            store_ag_column<T, 0, 0, 32>(x, p, tile, lv, bv, lane);
            lower_left_product(KKw, x, lane);
        }
        float xa[32], xb[32];
        solve_bottom(xa, xb, KKw, bv, lane);
        store_ag_column<T, 0, 32, 32>(xa, p, tile, lv, bv, lane);
        store_ag_column<T, 32, 32, 32>(xb, p, tile, lv, bv, lane);
        __syncwarp(); /* the scratch block's reads are done before the next head writes it */
    }
}

/* Launches of this kernel so far (tests: the variant really ran). */
unsigned long long g_launches;

template <typename T>
cudaError_t launch(const fqla_fwd_params &p, const CUtensorMap &tmK, cudaStream_t stream)
{
    /* the shared-memory limit once per device (kept out of later calls:
     * graph capture) */
    static volatile int configured[64];
    int dev = 0;
    cudaError_t err = cudaGetDevice(&dev);
    if (err != cudaSuccess) return err;
    if (dev < 0 || dev >= 64 || !configured[dev]) {
        err = cudaFuncSetAttribute(fwd_prepare_warp_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)SMEM);
        if (err != cudaSuccess) return err;
        if (dev >= 0 && dev < 64) configured[dev] = 1;
    }
    const int64_t items = p.slots * p.H, ctas = (items + WARPS - 1) / WARPS;
    const int64_t tail = p.varlen ? (p.T + C - 1) / C : 0; /* one 64-row block of o each */
    if (ctas + tail == 0) return cudaSuccess;
    fwd_prepare_warp_kernel<T><<<(unsigned)(ctas + tail), WARPS * 32, SMEM, stream>>>(p, tmK);
    g_launches++;
    return cudaGetLastError();
}

} // namespace

int fqla_fwd_prepare_warp_usable(const fqla_fwd_params &p)
{
    return !p.Pg && p.K == KD && !p.l2norm && !p.chunk_ok;
}

cudaError_t fqla_fwd_launch_prepare_warp(const fqla_fwd_params &p, int io_bf16, const CUtensorMap *tmK,
                                         cudaStream_t stream)
{
    if (!fqla_fwd_prepare_warp_usable(p) || !tmK) return cudaErrorInvalidValue;
    return io_bf16 ? launch<__nv_bfloat16>(p, *tmK, stream) : launch<__half>(p, *tmK, stream);
}

extern "C" unsigned long long fqla_cuda_debug_prepare_warp_launches(void) { return g_launches; }
