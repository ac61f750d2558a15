/*
 * bwd_prepare.cu - the backward's chunk-parallel preparation (bwd_common.cuh).
 *
 * Per chunk slot and value head, from the forward's inputs:
 *   gam   chunk-local inclusive cumsum of the log decay (after the in-kernel
 *         gate and the forward's floor of -100, fwd_prepare_common.cuh);
 *   bet   beta (after the in-kernel sigmoid);
 *   rq/rk the l2norm row factors (written by the group's first value head);
 *   Tt    T~ = (I + L)^-1, L = StrictLower(diag(beta) (Gamma . K K^T)): the
 *         gated system, which stays bounded for any keys (docs/design.md §2);
 *   Pt    P~ = scale Gamma . tril(Q K^T);
 *         both as the operand tiles the chains and the gradient kernel
 *         take by plain copies: the fp32 values' hi and lo bf16 planes
 *         (kernel/wg_split.cuh's swizzled [64][64] layout, 8 KB each, hi
 *         first; the same bytes as fp32);
 *   chunk_ok  with the chains' CP: 1 where every row has beta ||k||^2 in
 *         [0, 2] (from K K^T's diagonal), the shortcut's test
 *         (fqla_cp_m_negligible).
 * Rows past a sequence's end are zeros (beta 0, g 0), so they drop out.
 *
 * Its fp32 instance serves the fp32 forward (fqla_fwd_launch_chain_f32_prepare,
 * fwd.cu's chain route): q / k rows through registers, normalised there with
 * the l2norm (so the factors are 1), split into hi / lo rows for the products
 * (three a k-step) and written by the group's first CTA as the state chain's
 * planes (bp.qkp); its tail blocks zero o's rows past cu[N].
 *
 * Grid: slots x HV CTAs, a chunk slot's value heads next to each other (a
 * GVA group's CTAs then read the same q / k rows while they are in L2);
 * 256 threads. q and k rows by cp.async, every copy of the CTA in one
 * commit group, in flight while warp 0 forms the gates. K K^T
 * and Q K^T by m16n8k16 mma.sync on the 2-byte rows (warp w: rows 16 (w % 4),
 * columns 32 (w / 4)); T~ in fp32: the four diagonal 16 x 16 blocks by
 * forward substitution on CUDA cores (one warp each, a lane per column),
 * then block row i's off-diagonal blocks T_ij = -D_i sum_m L_im T_mj for
 * i = 1, 2, 3 by 3xTF32 mma.sync (invert_unit_lower).
 */
#include "cuda/bwd_common.cuh"
#include "cuda/fwd_prepare_common.cuh"
#include "cuda/kernel/wg_split.cuh"
#include "cuda/ptx/cp_async.cuh"
#include "cuda/ptx/mma_sync.cuh"

#include <type_traits>

namespace {

constexpr int C = FQLA_BWD_C;
constexpr int LDM = 65; /* 64 x 64 fp32 tiles */

/* Shared memory, ~40 KB at K = 128, so that four CTAs share an SM (the
 * kernel is bound by the latency of its steps, not by a pipe): q and k rows
 * as they come (2-byte io elements; the l2norm factors go into the
 * products' epilogues), then L and T~ over them once the products are in
 * registers. NPL = 2 for fp32 io: each row as its hi and lo bf16 rows
 * (normalised first with the l2norm), ~70 KB. */
template <int KD, int NPL = 1> struct prep_smem {
    static constexpr int LDK = KD + 8; /* 2-byte elements */
    union {
        uint16_t q[NPL][C * LDK];
        float L[C * LDM];
    } a;
    union {
        uint16_t k[NPL][C * LDK];
        float T[C * LDM];
    } b;
    float tmp[8 * 16 * 9]; /* invert_unit_lower's staging blocks */
    float gam[C], bet[C];
    float rq[C], rk[C]; /* l2norm row factors (1 without) */
};

/* The chunk's rows of x into dst by cp.async, 16 bytes a copy (zeros past
 * nvalid: src_bytes 0), uncommitted: the caller commits q's and k's as one
 * group. Rows are 16-byte aligned on the CUDA backend (fqla_vt_aligned16:
 * data pointers and strides). Every copy of the CTA is in flight at once;
 * loading a row a warp and storing it before the next (the first form)
 * made ~16 dependent global round trips a CTA, most of this latency-bound
 * kernel's time. */
template <typename T, int KD>
__device__ void issue_rows(const T *x, int64_t sb, int64_t st, int64_t sh, int64_t batch, int64_t t0, int nvalid,
                           int head, uint16_t *dst)
{
    constexpr int LDK = KD + 8, VPR = KD / 8; /* 16-byte vectors a row */
    static_assert((LDK * 2) % 16 == 0, "shared rows must stay 16-byte aligned");
    const uint16_t *xr = reinterpret_cast<const uint16_t *>(x);
    for (int e = threadIdx.x; e < C * VPR; e += blockDim.x) {
        const int i = e / VPR, c = 8 * (e % VPR);
        const bool in = i < nvalid;
        const uint16_t *src = in ? xr + batch * sb + (t0 + i) * st + (int64_t)head * sh + c : xr;
        fqla_cp_async16(dst + i * LDK + c, src, in ? 16 : 0);
    }
}

/* fp32 io: the chunk's rows of x, a warp a row and KD / 32 elements a lane
 * (one 8- or 16-byte load: fp32 rows are 16-byte aligned on this route),
 * normalised with l2norm (1 / sqrt(|x|^2 + 1e-6), zeros past nvalid),
 * split into hi / lo bf16 rows in shared memory for the products
 * (mma_rows: three a product, as bf16x3), and where `plane` is given also
 * into the chain's hi and lo planes (kernel/wg_split.cuh's [64][KD] layout,
 * plane and plane + 64 KD) in the workspace. */
template <int KD>
__device__ void f32_rows(const float *x, int64_t sb, int64_t st, int64_t sh, int64_t batch, int64_t t0, int nvalid,
                         int head, bool l2norm, uint16_t *hi, uint16_t *lo, uint16_t *plane)
{
    constexpr int LDK = KD + 8, PER = KD / 32;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, c = PER * lane;
    for (int i = warp; i < C; i += 8) {
        float v[PER];
        if (i < nvalid) {
            const float *r = x + batch * sb + (t0 + i) * st + (int64_t)head * sh + c;
            if constexpr (PER == 4) {
                const float4 u = *reinterpret_cast<const float4 *>(r);
                v[0] = u.x; v[1] = u.y; v[2] = u.z; v[3] = u.w;
            } else {
                const float2 u = *reinterpret_cast<const float2 *>(r);
                v[0] = u.x; v[1] = u.y;
            }
        } else {
#pragma unroll
            for (int e = 0; e < PER; e++) v[e] = 0.f;
        }
        if (l2norm) {
            float ss = 0.f;
#pragma unroll
            for (int e = 0; e < PER; e++) ss += v[e] * v[e];
#pragma unroll
            for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
            const float f = i < nvalid ? rsqrtf(ss + 1e-6f) : 0.f;
#pragma unroll
            for (int e = 0; e < PER; e++) v[e] *= f;
        }
        uint32_t h[PER / 2], l[PER / 2];
#pragma unroll
        for (int e = 0; e < PER / 2; e++) {
            fqla_wg_hilo(v[2 * e], v[2 * e + 1], h[e], l[e]);
            *reinterpret_cast<uint32_t *>(hi + i * LDK + c + 2 * e) = h[e];
            *reinterpret_cast<uint32_t *>(lo + i * LDK + c + 2 * e) = l[e];
        }
        if (plane) { /* PER consecutive elements: one 8- or 4-byte piece of a 16-byte chunk */
            unsigned char *ph = reinterpret_cast<unsigned char *>(plane) + fqla_wg_off(C, i, c);
            if constexpr (PER == 4) {
                *reinterpret_cast<uint2 *>(ph) = make_uint2(h[0], h[1]);
                *reinterpret_cast<uint2 *>(ph + C * KD * 2) = make_uint2(l[0], l[1]);
            } else {
                *reinterpret_cast<uint32_t *>(ph) = h[0];
                *reinterpret_cast<uint32_t *>(ph + C * KD * 2) = l[0];
            }
        }
    }
}

/* Row factors of rows in shared memory (issue_rows): 1 / sqrt(|x|^2 + 1e-6)
 * with l2norm (0 past nvalid), else 1; into f, and with l2norm into r
 * (global) where given. */
template <typename T, int KD>
__device__ void row_factors(const uint16_t *src, int nvalid, bool l2norm, float *f, float *r)
{
    constexpr int LDK = KD + 8;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (!l2norm) {
        for (int i = threadIdx.x; i < C; i += blockDim.x) f[i] = 1.f;
        return;
    }
    for (int i = warp; i < C; i += 8) {
        float ss = 0.f;
#pragma unroll
        for (int j = 0; j < KD / 32; j++) {
            const float y = bwd_widen<T>(src[i * LDK + lane + 32 * j]);
            ss += y * y;
        }
#pragma unroll
        for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (lane == 0) {
            const float fi = i < nvalid ? rsqrtf(ss + 1e-6f) : 0.f;
            f[i] = fi;
            if (r) r[i] = fi;
        }
    }
}

/* acc[nt] (+)= A[m0 .. m0 + 16) x B[n0 .. n0 + 8 NT)^T over KD columns of
 * two 2-byte row-major matrices in shared memory (row pitch LDK): one warp,
 * m16n8k16 mma.sync on the rows as they came (bf16 or fp16: exact products,
 * fp32 accumulate, as the tf32 form they replace), each fragment register
 * one 32-bit load of a column pair. Rows g of a fragment sit LDK / 2 words
 * apart (4 banks mod 32 at LDK = KD + 8), so the 32 lanes' loads hit 32
 * banks. */
template <typename T, int KD, int NT>
__device__ __forceinline__ void mma_rows(float (&acc)[1][NT][4], const uint16_t *A, const uint16_t *B, int m0, int n0)
{
    constexpr int LDK = KD + 8; /* prep_smem's */
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    auto ld = [](const uint16_t *p) { return *reinterpret_cast<const uint32_t *>(p); };
#pragma unroll 4
    for (int k = 0; k < KD; k += 16) {
        const uint16_t *ar = A + (m0 + g) * LDK + k + 2 * t;
        const uint32_t a[4] = {ld(ar), ld(ar + 8 * LDK), ld(ar + 8), ld(ar + 8 * LDK + 8)};
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const uint16_t *br = B + (n0 + 8 * nt + g) * LDK + k + 2 * t;
            if (std::is_same<T, __nv_bfloat16>::value) fqla_mma_m16n8k16_bf16(acc[0][nt], a, ld(br), ld(br + 8));
            else fqla_mma_m16n8k16_f16(acc[0][nt], a, ld(br), ld(br + 8));
        }
    }
}

/* acc += A B for a 16 x 16 block A (row stride LDM) and a 16 x 8 block B
 * (row stride ldb), fp32 in shared memory: m16n8k8 tf32 mma in 3xTF32
 * (fwd_prepare_common.cuh: about fp32 accuracy). */
__device__ __forceinline__ void mm16x8(float (&acc)[4], const float *a, const float *b, int ldb, int lane)
{
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int ks = 0; ks < 2; ks++) {
        const float *ak = a + 8 * ks, *bk = b + 8 * ks * ldb;
        const tf32_a<3> af(ak[g * LDM + t], ak[(g + 8) * LDM + t], ak[g * LDM + t + 4], ak[(g + 8) * LDM + t + 4]);
        mma_f32<3>(acc, af, bk[t * ldb + g], bk[(t + 4) * ldb + g]);
    }
}

constexpr int LDR = 9; /* a warp's 16 x 8 fp32 staging block (tmp) */

/* T = (I + L)^-1 for a strictly lower L (both 64 x 64, stride LDM); tmp
 * holds 8 x 16 x LDR floats. The diagonal 16 x 16 blocks D_i by forward
 * substitution (a lane per column), then block row i = 1, 2, 3 of the
 * rest, T_ij = -D_i sum_{m = j}^{i - 1} L_im T_mj, by 3xTF32 mma, a warp
 * per 16 x 8 half of a block: the sum into the warp's staging block, then
 * D_i times it. (On CUDA cores, FMAs fed from shared memory, these rounds
 * were a third of the kernel's samples: docs/history/2026-12-05-gpu2.md.) */
__device__ void invert_unit_lower(const float *L, float *T, float *tmp)
{
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    /* the blocks above the diagonal: zeros (the planes store all of T) */
    for (int e = tid; e < 6 * 256; e += blockDim.x) {
        const int b = e >> 8, bi = b < 3 ? 0 : b < 5 ? 1 : 2, bj = b < 3 ? b + 1 : b < 5 ? b - 1 : 3;
        T[(16 * bi + ((e >> 4) & 15)) * LDM + 16 * bj + (e & 15)] = 0.f;
    }
    if (warp < 4 && lane < 16) { /* diagonal block warp, column lane */
        const int b = 16 * warp, c = lane;
        float col[16];
#pragma unroll
        for (int r = 0; r < 16; r++) {
            float v = r == c ? 1.f : 0.f;
#pragma unroll
            for (int x = 0; x < r; x++) v -= L[(b + r) * LDM + b + x] * col[x];
            col[r] = r < c ? 0.f : v;
        }
#pragma unroll
        for (int r = 0; r < 16; r++) T[(b + r) * LDM + b + c] = col[r];
    }
    __syncthreads();
    const int g = lane >> 2, t = lane & 3;
    float *R = tmp + warp * 16 * LDR;
    for (int i = 1; i < 4; i++) {
        if (warp < 2 * i) { /* block (i, j), columns 8 h .. 8 h + 7 */
            const int j = warp >> 1, c0 = 16 * j + 8 * (warp & 1);
            float acc[4] = {0.f, 0.f, 0.f, 0.f};
            for (int m = j; m < i; m++) mm16x8(acc, L + 16 * i * LDM + 16 * m, T + 16 * m * LDM + c0, LDM, lane);
            R[g * LDR + 2 * t] = acc[0];
            R[g * LDR + 2 * t + 1] = acc[1];
            R[(g + 8) * LDR + 2 * t] = acc[2];
            R[(g + 8) * LDR + 2 * t + 1] = acc[3];
            __syncwarp();
            float d[4] = {0.f, 0.f, 0.f, 0.f};
            mm16x8(d, T + 16 * i * LDM + 16 * i, R, LDR, lane);
            float *o = T + (16 * i + g) * LDM + c0 + 2 * t;
            o[0] = -d[0];
            o[1] = -d[1];
            o[8 * LDM] = -d[2];
            o[8 * LDM + 1] = -d[3];
            __syncwarp(); /* R is read before the next round's stores */
        }
        __syncthreads();
    }
}

/* T: the io dtype; float for the fp32 forward on these kernels
 * (bwd_common.cuh, fqla_fwd_launch_chain_f32_prepare): q / k split into hi /
 * lo rows (f32_rows) and the products three a k-step; the l2norm applied to
 * the rows, so the factors below are 1; the group-first CTA also writes the
 * chain's q / k planes (bp.qkp). */
template <typename T, int KD>
__global__ void __launch_bounds__(256, std::is_same<T, float>::value ? 2 : 4) bwd_prepare_kernel(const fqla_bwd_params bp)
{
    constexpr bool F32 = std::is_same<T, float>::value;
    constexpr int NPL = F32 ? 2 : 1;
    using IO = typename std::conditional<F32, __nv_bfloat16, T>::type; /* the products' 2-byte type */
    const fqla_fwd_params &p = bp.f;
    if (F32 && (int64_t)blockIdx.x >= p.slots * p.HV) { /* the forward's o rows after the last sequence */
        zero_tail<float>(p, (int64_t)blockIdx.x - p.slots * p.HV);
        return;
    }
    extern __shared__ __align__(16) unsigned char smem_raw[];
    prep_smem<KD, NPL> &sm = *reinterpret_cast<prep_smem<KD, NPL> *>(smem_raw);
    /* slot-major, a slot's value heads adjacent (the header says why) */
    const int64_t slot = blockIdx.x / (unsigned)p.HV;
    const int hv = (int)(blockIdx.x % (unsigned)p.HV), hk = hv / p.group;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

    int64_t batch, t0;
    int nvalid;
    if (!bwd_slot_chunk(p, slot, batch, t0, nvalid)) return;
    const bool write_r = !F32 && p.l2norm && hv % p.group == 0;
    const size_t tile = (size_t)slot * p.HV + hv;

    const T *q = (const T *)p.q, *k = (const T *)p.k;
    float *rq = write_r ? p.rq + ((size_t)slot * p.H + hk) * C : nullptr;
    float *rk = write_r ? p.rk + ((size_t)slot * p.H + hk) * C : nullptr;
    /* in flight while warp 0 forms the gates below */
    if constexpr (!F32) {
        issue_rows<T, KD>(q, p.q_sb, p.q_st, p.q_sh, batch, t0, nvalid, hk, sm.a.q[0]);
        issue_rows<T, KD>(k, p.k_sb, p.k_st, p.k_sh, batch, t0, nvalid, hk, sm.b.k[0]);
        fqla_cp_async_commit();
    }
    if (warp == 0) {
        float g[2], b[2];
        load_gate_beta(p, batch, t0, nvalid, hv, lane, g, b);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            if (lane + 32 * h < nvalid) finish_gate_beta(p, hv, g[h], b[h]);
            else g[h] = b[h] = 0.f;
        }
        /* inclusive scan of g over the 64 rows (two halves of 32) */
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const float y = __shfl_up_sync(0xffffffffu, g[h], o);
                if (lane >= o) g[h] += y;
            }
        }
        g[1] += __shfl_sync(0xffffffffu, g[0], 31);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            sm.gam[lane + 32 * h] = g[h];
            sm.bet[lane + 32 * h] = b[h];
            p.gam[tile * C + lane + 32 * h] = g[h];
            bp.bet[tile * C + lane + 32 * h] = b[h];
        }
    }
    if constexpr (F32) {
        /* the planes: k hi, k lo, q hi, q lo of (slot, q/k head), by the group's first CTA */
        uint16_t *pl = hv % p.group == 0 ? bp.qkp + ((size_t)slot * p.H + hk) * 4 * C * KD : nullptr;
        f32_rows<KD>((const float *)p.k, p.k_sb, p.k_st, p.k_sh, batch, t0, nvalid, hk, p.l2norm, sm.b.k[0],
                     sm.b.k[NPL - 1], pl);
        f32_rows<KD>((const float *)p.q, p.q_sb, p.q_st, p.q_sh, batch, t0, nvalid, hk, p.l2norm, sm.a.q[0],
                     sm.a.q[NPL - 1], pl ? pl + 2 * C * KD : nullptr);
        if (tid < C) sm.rq[tid] = sm.rk[tid] = 1.f; /* normalised rows */
    } else {
        fqla_cp_async_wait_all();
        __syncthreads(); /* every thread's rows landed */
        row_factors<T, KD>(sm.a.q[0], nvalid, p.l2norm, sm.rq, rq);
        row_factors<T, KD>(sm.b.k[0], nvalid, p.l2norm, sm.rk, rk);
    }
    __syncthreads();

    int bad = 0; /* a row with beta ||k||^2 outside [0, 2] (CP's shortcut test, chunk_ok) */
    { /* K K^T -> L, Q K^T -> P~ */
        const int m0 = 16 * (warp & 3), n0 = 32 * (warp >> 2);
        float kk[1][4][4], qk[1][4][4];
        bwd_zero(kk);
        bwd_zero(qk);
        mma_rows<IO, KD>(kk, sm.b.k[0], sm.b.k[0], m0, n0);
        mma_rows<IO, KD>(qk, sm.a.q[0], sm.b.k[0], m0, n0);
        if constexpr (F32) { /* bf16x3: + hi lo + lo hi */
            mma_rows<IO, KD>(kk, sm.b.k[0], sm.b.k[1], m0, n0);
            mma_rows<IO, KD>(kk, sm.b.k[1], sm.b.k[0], m0, n0);
            mma_rows<IO, KD>(qk, sm.a.q[0], sm.b.k[1], m0, n0);
            mma_rows<IO, KD>(qk, sm.a.q[1], sm.b.k[0], m0, n0);
        }
        __syncthreads(); /* q and k are read: L and T~ go over them */
        const float scale = p.scale;
        bwd_each(kk, m0, n0, [&](int i, int j, float v) {
            v *= sm.rk[i] * sm.rk[j];
            sm.a.L[i * LDM + j] = j < i ? sm.bet[i] * __expf(sm.gam[i] - sm.gam[j]) * v : 0.f;
            if (i == j) bad |= !(sm.bet[i] * v >= 0.f && sm.bet[i] * v <= 2.f);
        });
        /* P~ by column pairs (accumulator elements e, e + 1), hi / lo planes */
        unsigned char *Pt = (unsigned char *)(bp.Pt + tile * C * C);
        const int g = lane >> 2, t = lane & 3;
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int i = m0 + g + 8 * hh, j = n0 + 8 * nt + 2 * t;
                float v[2];
#pragma unroll
                for (int c = 0; c < 2; c++)
                    v[c] = j + c <= i ? scale * __expf(sm.gam[i] - sm.gam[j + c]) *
                                            (sm.rq[i] * sm.rk[j + c] * qk[0][nt][2 * hh + c])
                                      : 0.f;
                uint32_t hi, lo;
                fqla_wg_hilo(v[0], v[1], hi, lo);
                const uint32_t o = fqla_wg_off(C, i, j);
                *reinterpret_cast<uint32_t *>(Pt + o) = hi;
                *reinterpret_cast<uint32_t *>(Pt + C * C * 2 + o) = lo;
            }
    }
    bad = __syncthreads_or(bad);
    if (p.chunk_ok && tid == 0) p.chunk_ok[tile] = !bad;
    invert_unit_lower(sm.a.L, sm.b.T, sm.tmp);
    /* T~'s hi / lo planes, 8 elements (16 bytes) a store */
    unsigned char *Tt = (unsigned char *)(bp.Tt + tile * C * C);
    for (int idx = tid; idx < C * C / 8; idx += blockDim.x) {
        const int r = idx >> 3, c = 8 * (idx & 7);
        uint32_t h[4], l[4];
#pragma unroll
        for (int q = 0; q < 4; q++) fqla_wg_hilo(sm.b.T[r * LDM + c + 2 * q], sm.b.T[r * LDM + c + 2 * q + 1], h[q], l[q]);
        const uint32_t o = fqla_wg_off(C, r, c);
        *reinterpret_cast<uint4 *>(Tt + o) = make_uint4(h[0], h[1], h[2], h[3]);
        *reinterpret_cast<uint4 *>(Tt + C * C * 2 + o) = make_uint4(l[0], l[1], l[2], l[3]);
    }
}

template <typename T, int KD> cudaError_t launch(const fqla_bwd_params &p, cudaStream_t stream)
{
    static fqla_smem_cache cache;
    const size_t smem = sizeof(prep_smem<KD, std::is_same<T, float>::value ? 2 : 1>);
    cudaError_t e = fqla_smem_limit(cache, bwd_prepare_kernel<T, KD>, smem);
    if (e != cudaSuccess) return e;
    /* slots x HV < 2^31 (a grid's x limit): the backward's workspace holds two
     * K x V fp32 states per (slot, value head), so that many would be
     * terabytes; the fp32 forward's planner checks it with the tail blocks
     * (route_plan.h, fqla_route_f32_chain_covers) */
    /* fp32 forward, varlen: and the blocks that zero o's rows past cu[N] (ceil(T / 64)) */
    const int64_t tail = std::is_same<T, float>::value && p.f.varlen ? (p.f.T + C - 1) / C : 0;
    return fqla_launch(bwd_prepare_kernel<T, KD>, dim3((unsigned)(p.f.slots * p.f.HV + tail)), dim3(256), smem, stream,
                       0, p);
}

} // namespace

cudaError_t fqla_fwd_launch_chain_f32_prepare(const fqla_bwd_params &p, cudaStream_t stream)
{
    return p.f.K == 64 ? launch<float, 64>(p, stream) : launch<float, 128>(p, stream);
}

cudaError_t fqla_bwd_launch_prepare(const fqla_bwd_params &p, int io_bf16, cudaStream_t stream)
{
    if (p.f.K == 64) return io_bf16 ? launch<__nv_bfloat16, 64>(p, stream) : launch<__half, 64>(p, stream);
    return io_bf16 ? launch<__nv_bfloat16, 128>(p, stream) : launch<__half, 128>(p, stream);
}
