/*
 * fwd_prepare_warp.cu - the forward's preparation without Q, one warp per
 * (chunk slot, value head): gamma and Ag for the kernel that forms Pg beside
 * the chain (fwd_fused.cu). Same outputs as fwd_prepare.cu's kernel without
 * Q (gamma to the workspace, Ag in the packed layout of fwd_common.cuh), by
 * another organisation of the work (docs/perf.md, session 19):
 *
 *   1. the gate and beta of the 64 rows (lane: rows lane and lane + 32),
 *      gamma = their inclusive cumsum, written to the workspace;
 *   2. K K^T's ten 16x16 blocks at and below the diagonal on tensor cores
 *      (m16n8k16, fp32 accumulate) with K's fragments loaded straight from
 *      global memory: lane (g, t) loads 16 bytes at column 32 s + 8 t of
 *      rows g and g + 8 of a block, which is the A fragment of two k-steps
 *      and the B fragment of the same two, under one permutation of the k
 *      index that A and B share (a sum over k does not see it);
 *      N = diag(beta) StrictLower(K K^T) goes to the warp's shared memory;
 *   3. X = (I + N)^-1, one column per lane (columns lane and 32 + lane):
 *      the top left 32x32 block by forward substitution in fp32, every
 *      lane walking the same rows in step so that each load of N is one
 *      broadcast; Y = N_BA X_AA, the dense part of the rows below, in
 *      3xTF32 on tensor cores; then rows 32..63 of both columns by
 *      substitution from Y (the bottom right block's in the same pass);
 *   4. Ag_ic = exp2(l_i - l_c) X_ic beta_c (l = gamma log2 e) for i >= c,
 *      zero above the diagonal: one row of the packed layout per store
 *      instruction, the lanes' columns side by side.
 *
 * Why: the CTA kernel spends a chunk's life in phase barriers and its
 * dependent steps interleaved from six chunks per SM (docs/perf.md, session
 * 18: no single limit); here nothing waits on another warp, and twelve
 * chunks per SM run side by side (4 warps per CTA, 68 KB of shared memory:
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
#include "cuda/pdl.cuh"

namespace {

constexpr int C = FQLA_FWD_CHUNK;
constexpr int KD = 128;
constexpr int WARPS = 4;                                     /* per CTA, one item each */
constexpr int LDN = C + 4;                                   /* N's row pitch (floats): 16-byte aligned rows */
constexpr size_t SMEM = (size_t)WARPS * C * LDN * sizeof(float); /* 69,632 bytes: three CTAs per SM */

/* Rows 16 i + g and 16 i + g + 8 (h = 0, 1) of the chunk's K, lane's 16
 * bytes at column 32 s + 8 t (s = 0..3); zeros past the valid rows. */
template <typename T>
__device__ __forceinline__ void load_kblock(uint4 (&f)[2][4], const T *k0, int64_t k_st, int i, int nvalid, int lane)
{
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = 16 * i + g + 8 * h;
        const uint4 *src = reinterpret_cast<const uint4 *>(k0 + (int64_t)(r < nvalid ? r : 0) * k_st) + t;
#pragma unroll
        for (int s = 0; s < 4; s++) f[h][s] = r < nvalid ? __ldg(src + 4 * s) : make_uint4(0u, 0u, 0u, 0u);
    }
}

__device__ __forceinline__ uint32_t word(const uint4 &u, int k) { return k == 0 ? u.x : k == 1 ? u.y : k == 2 ? u.z : u.w; }

/* The A fragments of block row i for its 8 k-steps (s, hh): k-step (s, hh)
 * takes words 2 hh (the fragment's columns 2t, 2t+1) and 2 hh + 1 (columns
 * 2t + 8, 2t + 9) of each row's 16 bytes; formed once per block row (the
 * quads interleave rows g and g + 8, so they cost moves). */
__device__ __forceinline__ void a_quads(uint32_t (&a)[8][4], const uint4 (&f)[2][4])
{
#pragma unroll
    for (int s = 0; s < 4; s++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            a[2 * s + hh][0] = word(f[0][s], 2 * hh);
            a[2 * s + hh][1] = word(f[1][s], 2 * hh);
            a[2 * s + hh][2] = word(f[0][s], 2 * hh + 1);
            a[2 * s + hh][3] = word(f[1][s], 2 * hh + 1);
        }
}

/* acc[nh] = block (i, j) of K K^T, n8 half nh, from block row i's A quads
 * and block row j's rows (the B fragments: the same words, pairwise). */
template <typename T>
__device__ __forceinline__ void kk_block(float (&acc)[2][4], const uint32_t (&a)[8][4], const uint4 (&fj)[2][4])
{
#pragma unroll
    for (int nh = 0; nh < 2; nh++)
#pragma unroll
        for (int e = 0; e < 4; e++) acc[nh][e] = 0.f;
#pragma unroll
    for (int s = 0; s < 4; s++)
#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            fqla_io<T>::mma(acc[0], a[2 * s + hh], word(fj[0][s], 2 * hh), word(fj[0][s], 2 * hh + 1));
            fqla_io<T>::mma(acc[1], a[2 * s + hh], word(fj[1][s], 2 * hh), word(fj[1][s], 2 * hh + 1));
        }
}

/* Block (i, j) of N = diag(beta) StrictLower(K K^T) into the warp's rows
 * (accumulator layout: acc[nh][2e + q] is row 16 i + g + 8 e, column
 * 16 j + 8 nh + 2 t + q). bv: lane's betas of rows lane, lane + 32. */
__device__ __forceinline__ void store_nblock(float *Nw, const float (&acc)[2][4], int i, int j, const float (&bv)[2],
                                             int lane)
{
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int e = 0; e < 2; e++) {
        const int r = 16 * i + g + 8 * e;
        const float b = __shfl_sync(0xffffffffu, bv[i >> 1], r & 31); /* rows < 32 iff i < 2 */
#pragma unroll
        for (int nh = 0; nh < 2; nh++) {
            const int col = 16 * j + 8 * nh + 2 * t;
            float v0 = acc[nh][2 * e] * b, v1 = acc[nh][2 * e + 1] * b;
            if (i == j) { /* strictly below the diagonal only */
                v0 = col < r ? v0 : 0.f;
                v1 = col + 1 < r ? v1 : 0.f;
            }
            *reinterpret_cast<float2 *>(Nw + r * LDN + col) = make_float2(v0, v1);
        }
    }
}

/* Rows 0..31 of X's column c = lane (the top left 32x32 block's) by
 * forward substitution: x_i = [i == c] - sum_{j < i} N_ij x_j, four partial
 * sums per row; every lane reads the same N words (one broadcast each). */
__device__ __forceinline__ void solve_top(float (&x)[32], const float *Nw, int lane)
{
#pragma unroll
    for (int i = 0; i < 32; i++) {
        const float *nr = Nw + i * LDN;
        float a[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int j4 = 0; j4 < i; j4 += 4) {
            const float4 n = *reinterpret_cast<const float4 *>(nr + j4);
            a[0] = fmaf(n.x, x[j4], a[0]);
            if (j4 + 1 < i) a[1] = fmaf(n.y, x[j4 + 1], a[1]);
            if (j4 + 2 < i) a[2] = fmaf(n.z, x[j4 + 2], a[2]);
            if (j4 + 3 < i) a[3] = fmaf(n.w, x[j4 + 3], a[3]);
        }
        x[i] = lane == i ? 1.f : -((a[0] + a[1]) + (a[2] + a[3]));
    }
}

/* Y = N_BA X_AA (rows 32..63 of N, columns 0..31, times the top left block
 * of X) in 3xTF32 on tensor cores, through the scratch block R (rows 0..31,
 * columns 32..63 of the warp's N area, which N leaves unused): X_AA in,
 * lane c's column; Y out, row-major, for lane c's reads of column c. */
__device__ __forceinline__ void lower_left_product(float *Nw, const float (&x)[32], int lane)
{
    const int g = lane >> 2, t = lane & 3;
    float *R = Nw + 32;
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
            const float *nr = Nw + (32 + 16 * mt + g) * LDN + 8 * ks + t;
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
 * (xb: the bottom right block's), one pass over N's rows for both. */
__device__ __forceinline__ void solve_bottom(float (&xa)[32], float (&xb)[32], const float *Nw, int lane)
{
    const float *R = Nw + 32;
#pragma unroll
    for (int i = 0; i < 32; i++) {
        const float *nr = Nw + (32 + i) * LDN + 32;
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
        xa[i] = -((a[0] + a[1]) + (a[2] + a[3]));
        xb[i] = lane == i ? 1.f : -((b[0] + b[1]) + (b[2] + b[3]));
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
__global__ void __launch_bounds__(WARPS * 32, 3) fwd_prepare_warp_kernel(const __grid_constant__ fqla_fwd_params p)
{
    extern __shared__ __align__(16) float smem_n[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    /* the fused kernel may start launching (it waits for this grid's end
     * before its first global access: pdl.cuh) */
    fqla_pdl_trigger();
    const int64_t items = p.slots * p.HV, ctas = (items + WARPS - 1) / WARPS;
    if ((int64_t)blockIdx.x >= ctas) {
        zero_tail<T>(p, (int64_t)blockIdx.x - ctas);
        return;
    }
    const int64_t item = (int64_t)blockIdx.x * WARPS + warp;
    if (item >= items) return;
    const int64_t slot = item / p.HV;
    const int hv = (int)(item % p.HV), hq = hv / p.group;
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

    /* 1. gates and betas (rows lane, lane + 32), gamma */
    float gv[2], bv[2];
    load_gate_beta(p, batch, t0, nvalid, hv, lane, gv, bv);
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

    /* 2. N = diag(beta) StrictLower(K K^T), block row by block row */
    float *Nw = smem_n + warp * C * LDN;
    const T *k0 = (const T *)p.k + batch * p.k_sb + t0 * p.k_st + hq * p.k_sh;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint32_t a[8][4];
        {
            uint4 fi[2][4];
            load_kblock<T>(fi, k0, p.k_st, i, nvalid, lane);
            a_quads(a, fi);
            float acc[2][4];
            kk_block<T>(acc, a, fi);
            store_nblock(Nw, acc, i, i, bv, lane);
        }
#pragma unroll
        for (int j = 0; j < i; j++) {
            uint4 fj[2][4];
            load_kblock<T>(fj, k0, p.k_st, j, nvalid, lane);
            float acc[2][4];
            kk_block<T>(acc, a, fj);
            store_nblock(Nw, acc, i, j, bv, lane);
        }
    }
    __syncwarp();

    /* 3-4. X and Ag by columns: lane's rows 0..31, then its rows 32..63
     * with those of column 32 + lane */
    const int64_t tile = slot * p.HV + hv;
    {
        float x[32];
        solve_top(x, Nw, lane);
        store_ag_column<T, 0, 0, 32>(x, p, tile, lv, bv, lane);
        lower_left_product(Nw, x, lane);
    }
    float xa[32], xb[32];
    solve_bottom(xa, xb, Nw, lane);
    store_ag_column<T, 0, 32, 32>(xa, p, tile, lv, bv, lane);
    store_ag_column<T, 32, 32, 32>(xb, p, tile, lv, bv, lane);
}

/* Launches of this kernel so far (tests: the variant really ran). */
unsigned long long g_launches;

template <typename T>
cudaError_t launch(const fqla_fwd_params &p, cudaStream_t stream)
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
    const int64_t items = p.slots * p.HV, ctas = (items + WARPS - 1) / WARPS;
    const int64_t tail = p.varlen ? (p.T + C - 1) / C : 0; /* one 64-row block of o each */
    if (ctas + tail == 0) return cudaSuccess;
    fwd_prepare_warp_kernel<T><<<(unsigned)(ctas + tail), WARPS * 32, SMEM, stream>>>(p);
    g_launches++;
    return cudaGetLastError();
}

} // namespace

int fqla_fwd_prepare_warp_usable(const fqla_fwd_params &p)
{
    return !p.Pg && p.K == KD && !p.l2norm && !p.chunk_ok;
}

cudaError_t fqla_fwd_launch_prepare_warp(const fqla_fwd_params &p, int io_bf16, cudaStream_t stream)
{
    if (!fqla_fwd_prepare_warp_usable(p)) return cudaErrorInvalidValue;
    return io_bf16 ? launch<__nv_bfloat16>(p, stream) : launch<__half>(p, stream);
}

extern "C" unsigned long long fqla_cuda_debug_prepare_warp_launches(void) { return g_launches; }
