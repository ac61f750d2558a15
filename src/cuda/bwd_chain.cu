/*
 * bwd_chain.cu - the backward's two sequential passes over each sequence
 * (bwd_common.cuh), one CTA of 256 threads per (sequence, value head, slice
 * of FQLA_BWD_VS value columns): value columns never mix in either chain,
 * so the slices run independently, as the forward's chunk kernels do.
 *
 * states (forward, chunk by chunk; S the state entering the chunk):
 *   store S;  X = V - diag(e) K S;  U = T~ diag(beta) X;
 *   S <- e_C S + K^T diag(f) U
 * dstates (reverse; dS the gradient w.r.t. the state leaving the chunk,
 * starting from d_final_state):
 *   store dS;  dU = P~^T dO + diag(f) K dS;  dY = T~^T dU;
 *   dS <- e_C dS + Q^T (scale diag(e) dO) - K^T (diag(e beta) dY)
 * and dh0 = dS after the first chunk. e_i = exp(gamma_i), f_i =
 * exp(gamma_C - gamma_i), e_C = exp(gamma_C); gamma, beta, T~, P~ and the
 * l2norm factors come from bwd_prepare.cu.
 *
 * Each product is one call of bwd_mma (tf32 operands, fp32 accumulate); the
 * state is kept in fp32 in shared memory. 256 threads: the eight warps
 * split each product's output tiles (halving the per-chunk latency of four). The products
 * with T~ and P~ skip their zero triangles.
 */
#include "cuda/bwd_common.cuh"
#include "cuda/fwd_prepare_common.cuh"

namespace {

constexpr int C = FQLA_BWD_C;
constexpr int VS = FQLA_BWD_VS;
constexpr int LDV = VS + 8; /* 64 x VS and K x VS tiles */
constexpr int LDM = C + 4;  /* 64 x 64 tiles */

template <int KD> struct chain_smem {
    static constexpr int LDK = KD + 4;
    float q[C * LDK], k[C * LDK]; /* q only in dstates */
    float S[KD * LDV];            /* S or dS */
    float a[C * LDV], b[C * LDV], c[C * LDV];
    float T[C * LDM], P[C * LDM];
    float gam[C], bet[C], e[C], f[C];
};

/* The sequence of CTA row n: batch row, first token, length, first slot. */
__device__ __forceinline__ void seq_of(const fqla_fwd_params &p, int64_t n, int64_t &batch, int64_t &start,
                                       int64_t &len, int64_t &slot0)
{
    fqla_fwd_seq(p, n, batch, start, len, slot0);
}

/* Loads a chunk's rows of x (normalised by the stored factors r) into dst. */
template <typename T, int KD>
__device__ __forceinline__ void load_qk(const T *x, int64_t sb, int64_t st, int64_t sh, int64_t batch, int64_t t0,
                                        int nvalid, int head, const float *r, float *dst)
{
    constexpr int LDK = KD + 4;
    bwd_copy(
        C * KD,
        [&](int idx) {
            const int i = idx / KD, j = idx % KD;
            if (i >= nvalid) return 0.f;
            const float v = bwd_ld<T>(x, batch * sb + (t0 + i) * st + (int64_t)head * sh + j);
            return r ? v * r[i] : v;
        },
        [&](int idx, float v) { dst[(idx / KD) * LDK + idx % KD] = v; });
}

/* A 64 x VS slice of an io-dtype [.., T, HV, V] tensor (zero past nvalid). */
template <typename T>
__device__ __forceinline__ void load_slice(const T *x, int64_t sb, int64_t st, int64_t sh, int64_t batch, int64_t t0,
                                           int nvalid, int hv, int v0, float *dst)
{
    bwd_copy(
        C * VS,
        [&](int idx) {
            const int i = idx / VS, j = idx % VS;
            return i < nvalid ? bwd_ld<T>(x, batch * sb + (t0 + i) * st + (int64_t)hv * sh + v0 + j) : 0.f;
        },
        [&](int idx, float v) { dst[(idx / VS) * LDV + idx % VS] = v; });
}

__device__ __forceinline__ void load_tile64(const float *src, float *dst)
{
    bwd_copy(C * C, [&](int idx) { return src[idx]; }, [&](int idx, float v) { dst[(idx >> 6) * LDM + (idx & 63)] = v; });
}

/* Hints the next chunk's tiles into L2 (prefetch.global.L2) while this one
 * runs: the chains wait on each chunk's copies, and from L2 they come at a
 * fraction of the DRAM latency. */
template <typename T, int KD>
__device__ __forceinline__ void prefetch_chunk(const fqla_bwd_params &bp, const T *x, int64_t sb, int64_t st, int64_t sh,
                                               const T *y, int64_t yb, int64_t yt, int64_t yh, int64_t batch, int64_t t0,
                                               int nvalid, int hk, int hv, int v0, size_t tile, bool with_q)
{
    const fqla_fwd_params &p = bp.f;
    for (int idx = threadIdx.x; idx < C * (KD / 64); idx += blockDim.x) {
        const int i = idx / (KD / 64), part = idx % (KD / 64);
        if (i >= nvalid) continue;
        fqla_prefetch_l2((const T *)p.k + batch * p.k_sb + (t0 + i) * p.k_st + (int64_t)hk * p.k_sh + 64 * part);
        if (with_q)
            fqla_prefetch_l2((const T *)p.q + batch * p.q_sb + (t0 + i) * p.q_st + (int64_t)hk * p.q_sh + 64 * part);
    }
    for (int i = threadIdx.x; i < nvalid; i += blockDim.x)
        fqla_prefetch_l2(y + batch * yb + (t0 + i) * yt + (int64_t)hv * yh + v0);
    for (int idx = threadIdx.x; idx < 128; idx += blockDim.x) {
        fqla_prefetch_l2(bp.Tt + tile * C * C + 32 * idx);
        if (with_q) fqla_prefetch_l2(bp.Pt + tile * C * C + 32 * idx);
    }
    (void)x; (void)sb; (void)st; (void)sh;
}

/* gamma, beta of the tile and the factors e, f; returns e_C. */
__device__ __forceinline__ void load_gates(const fqla_bwd_params &bp, size_t tile, float *gam, float *bet, float *e,
                                           float *f)
{
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        gam[i] = bp.gam[tile * C + i];
        bet[i] = bp.bet[tile * C + i];
    }
    __syncthreads();
    const float gC = gam[C - 1];
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        e[i] = __expf(gam[i]);
        f[i] = __expf(gC - gam[i]);
    }
}

/* The K x VS state slice to the workspace tile. */
template <int KD>
__device__ __forceinline__ void store_state(const float *S, float *dst, int V, int v0)
{
    for (int idx = threadIdx.x; idx < KD * VS; idx += blockDim.x) {
        const int r = idx / VS, j = idx % VS;
        dst[(int64_t)r * V + v0 + j] = S[r * LDV + j];
    }
}

/* Element (r, v) of a caller's state, fp32 or bf16, either layout. */
__device__ __forceinline__ int64_t state_off(int64_t n, int hv, int r, int v, int64_t sn, int64_t sh, int64_t s2,
                                             int v_first)
{
    return fqla_fwd_state_off(n, hv, r, v, sn, sh, s2, v_first);
}

template <typename T, int KD>
__global__ void __launch_bounds__(256) bwd_states_kernel(const fqla_bwd_params bp)
{
    const fqla_fwd_params &p = bp.f;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    chain_smem<KD> &sm = *reinterpret_cast<chain_smem<KD> *>(smem_raw);
    constexpr int LDK = chain_smem<KD>::LDK;
    const int64_t n = blockIdx.x;
    const int hv = blockIdx.y, hk = hv / p.group, v0 = blockIdx.z * VS;
    const int warp = threadIdx.x >> 5;
    /* 64-row products: warp w rows 16 (w % 4), columns 16 (w / 4); the K-row
     * state update: KD / 16 row tiles, the rest of the warps across columns */
    constexpr int RT = KD / 16, CW = 8 / RT, SNT = VS / CW / 8;
    const int m0 = 16 * (warp & 3), n0 = 16 * (warp >> 2);
    const int r0 = 16 * (warp % RT), c0 = (VS / CW) * (warp / RT);
    int64_t batch, start, len, slot0;
    seq_of(p, n, batch, start, len, slot0);
    const int64_t chunks = (len + C - 1) / C;

    for (int idx = threadIdx.x; idx < KD * VS; idx += blockDim.x) {
        const int r = idx / VS, j = idx % VS;
        float s = 0.f;
        if (p.h0) {
            const int64_t o = state_off(n, hv, r, v0 + j, p.h0_sn, p.h0_sh, p.h0_s2, p.v_first);
            s = p.h0_bf16 ? __bfloat162float(((const __nv_bfloat16 *)p.h0)[o]) : ((const float *)p.h0)[o];
        }
        sm.S[r * LDV + j] = s;
    }
    float *X = sm.a, *U = sm.b;
    for (int64_t c = 0; c < chunks; c++) {
        const int64_t slot = slot0 + c, t0 = start + c * C;
        const int nvalid = (int)(len - c * C < C ? len - c * C : C);
        const size_t tile = (size_t)slot * p.HV + hv;
        __syncthreads(); /* the previous chunk's reads are done */
        load_qk<T, KD>((const T *)p.k, p.k_sb, p.k_st, p.k_sh, batch, t0, nvalid, hk,
                       p.l2norm ? p.rk + ((size_t)slot * p.H + hk) * C : nullptr, sm.k);
        load_slice<T>((const T *)p.v, p.v_sb, p.v_st, p.v_sh, batch, t0, nvalid, hv, v0, X);
        load_tile64(bp.Tt + tile * C * C, sm.T);
        load_gates(bp, tile, sm.gam, sm.bet, sm.e, sm.f);
        store_state<KD>(sm.S, bp.S + tile * KD * p.V, p.V, v0);
        if (c + 1 < chunks) {
            const int nv = (int)(len - (c + 1) * C < C ? len - (c + 1) * C : C);
            prefetch_chunk<T, KD>(bp, (const T *)p.k, 0, 0, 0, (const T *)p.v, p.v_sb, p.v_st, p.v_sh, batch,
                                  t0 + C, nv, hk, hv, v0, tile + p.HV, false);
        }
        __syncthreads();
        { /* X = V - diag(e) K S */
            float acc[1][2][4];
            bwd_zero(acc);
            bwd_mma<true>(acc, m0, n0, 0, KD, [&](int i, int k) { return sm.k[i * LDK + k]; },
                    [&](int k, int j) { return sm.S[k * LDV + j]; });
            bwd_each(acc, m0, n0, [&](int i, int j, float v) { X[i * LDV + j] -= sm.e[i] * v; });
        }
        __syncthreads();
        { /* U = T~ diag(beta) X */
            float acc[1][2][4];
            bwd_zero(acc);
            bwd_mma<true>(acc, m0, n0, 0, m0 + 16, [&](int i, int k) { return sm.T[i * LDM + k]; },
                    [&](int k, int j) { return sm.bet[k] * X[k * LDV + j]; });
            bwd_each(acc, m0, n0, [&](int i, int j, float v) { U[i * LDV + j] = v; });
        }
        __syncthreads();
        { /* S = e_C S + K^T diag(f) U */
            float acc[1][SNT][4];
            bwd_zero(acc);
            bwd_mma<true>(acc, r0, c0, 0, C, [&](int i, int k) { return sm.k[k * LDK + i]; },
                    [&](int k, int j) { return sm.f[k] * U[k * LDV + j]; });
            const float eC = __expf(sm.gam[C - 1]);
            bwd_each(acc, r0, c0, [&](int i, int j, float v) { sm.S[i * LDV + j] = eC * sm.S[i * LDV + j] + v; });
        }
    }
}

template <typename T, int KD>
__global__ void __launch_bounds__(256) bwd_dstates_kernel(const fqla_bwd_params bp)
{
    const fqla_fwd_params &p = bp.f;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    chain_smem<KD> &sm = *reinterpret_cast<chain_smem<KD> *>(smem_raw);
    constexpr int LDK = chain_smem<KD>::LDK;
    const int64_t n = blockIdx.x;
    const int hv = blockIdx.y, hk = hv / p.group, v0 = blockIdx.z * VS;
    const int warp = threadIdx.x >> 5;
    /* 64-row products: warp w rows 16 (w % 4), columns 16 (w / 4); the K-row
     * state update: KD / 16 row tiles, the rest of the warps across columns */
    constexpr int RT = KD / 16, CW = 8 / RT, SNT = VS / CW / 8;
    const int m0 = 16 * (warp & 3), n0 = 16 * (warp >> 2);
    const int r0 = 16 * (warp % RT), c0 = (VS / CW) * (warp / RT);
    int64_t batch, start, len, slot0;
    seq_of(p, n, batch, start, len, slot0);
    const int64_t chunks = (len + C - 1) / C;
    const float scale = p.scale;

    for (int idx = threadIdx.x; idx < KD * VS; idx += blockDim.x) {
        const int r = idx / VS, j = idx % VS;
        sm.S[r * LDV + j] =
            bp.dht ? bp.dht[state_off(n, hv, r, v0 + j, bp.dht_sn, bp.dht_sh, bp.dht_s2, p.v_first)] : 0.f;
    }
    float *dO = sm.a, *dU = sm.b, *dY = sm.c;
    for (int64_t c = chunks - 1; c >= 0; c--) {
        const int64_t slot = slot0 + c, t0 = start + c * C;
        const int nvalid = (int)(len - c * C < C ? len - c * C : C);
        const size_t tile = (size_t)slot * p.HV + hv;
        __syncthreads();
        const size_t rrow = ((size_t)slot * p.H + hk) * C;
        load_qk<T, KD>((const T *)p.q, p.q_sb, p.q_st, p.q_sh, batch, t0, nvalid, hk,
                       p.l2norm ? p.rq + rrow : nullptr, sm.q);
        load_qk<T, KD>((const T *)p.k, p.k_sb, p.k_st, p.k_sh, batch, t0, nvalid, hk,
                       p.l2norm ? p.rk + rrow : nullptr, sm.k);
        load_slice<T>((const T *)bp.d_o, bp.do_sb, bp.do_st, bp.do_sh, batch, t0, nvalid, hv, v0, dO);
        load_tile64(bp.Tt + tile * C * C, sm.T);
        load_tile64(bp.Pt + tile * C * C, sm.P);
        load_gates(bp, tile, sm.gam, sm.bet, sm.e, sm.f);
        store_state<KD>(sm.S, bp.dS + tile * KD * p.V, p.V, v0);
        if (c > 0)
            prefetch_chunk<T, KD>(bp, (const T *)p.k, 0, 0, 0, (const T *)bp.d_o, bp.do_sb, bp.do_st, bp.do_sh, batch,
                                  t0 - C, C, hk, hv, v0, tile - p.HV, true);
        __syncthreads();
        { /* K dS */
            float acc[1][2][4];
            bwd_zero(acc);
            bwd_mma<true>(acc, m0, n0, 0, KD, [&](int i, int k) { return sm.k[i * LDK + k]; },
                    [&](int k, int j) { return sm.S[k * LDV + j]; });
            bwd_each(acc, m0, n0, [&](int i, int j, float v) { dU[i * LDV + j] = sm.f[i] * v; });
        }
        __syncthreads();
        { /* dU = P~^T dO + diag(f) K dS (P~^T is upper triangular) */
            float acc[1][2][4];
            bwd_zero(acc);
            bwd_mma<true>(acc, m0, n0, m0, C, [&](int i, int k) { return sm.P[k * LDM + i]; },
                    [&](int k, int j) { return dO[k * LDV + j]; });
            bwd_each(acc, m0, n0, [&](int i, int j, float v) { dU[i * LDV + j] += v; });
        }
        __syncthreads();
        { /* dY = T~^T dU */
            float acc[1][2][4];
            bwd_zero(acc);
            bwd_mma<true>(acc, m0, n0, m0, C, [&](int i, int k) { return sm.T[k * LDM + i]; },
                    [&](int k, int j) { return dU[k * LDV + j]; });
            bwd_each(acc, m0, n0, [&](int i, int j, float v) { dY[i * LDV + j] = v; });
        }
        __syncthreads();
        { /* dS = e_C dS + Q^T (scale diag(e) dO) - K^T (diag(e beta) dY) */
            float acc[1][SNT][4];
            bwd_zero(acc);
            bwd_mma<true>(acc, r0, c0, 0, C, [&](int i, int k) { return sm.q[k * LDK + i]; },
                    [&](int k, int j) { return scale * sm.e[k] * dO[k * LDV + j]; });
            bwd_mma<true>(acc, r0, c0, 0, C, [&](int i, int k) { return sm.k[k * LDK + i]; },
                    [&](int k, int j) { return -sm.e[k] * sm.bet[k] * dY[k * LDV + j]; });
            const float eC = __expf(sm.gam[C - 1]);
            bwd_each(acc, r0, c0, [&](int i, int j, float v) { sm.S[i * LDV + j] = eC * sm.S[i * LDV + j] + v; });
        }
    }
    if (bp.dh0) {
        __syncthreads();
        for (int idx = threadIdx.x; idx < KD * VS; idx += blockDim.x) {
            const int r = idx / VS, j = idx % VS;
            bp.dh0[state_off(n, hv, r, v0 + j, bp.dh0_sn, bp.dh0_sh, bp.dh0_s2, p.v_first)] = sm.S[r * LDV + j];
        }
    }
}

template <typename T, int KD, bool REVERSE> cudaError_t launch(const fqla_bwd_params &p, cudaStream_t stream)
{
    static fqla_smem_cache cache;
    auto kernel = REVERSE ? bwd_dstates_kernel<T, KD> : bwd_states_kernel<T, KD>;
    const size_t smem = sizeof(chain_smem<KD>);
    cudaError_t e = fqla_smem_limit(cache, kernel, smem);
    if (e != cudaSuccess) return e;
    return fqla_launch(kernel, dim3((unsigned)p.f.N, (unsigned)p.f.HV, (unsigned)(p.f.V / VS)), dim3(256), smem,
                       stream, 0, p);
}

template <bool REVERSE> cudaError_t launch_kd(const fqla_bwd_params &p, int io_bf16, cudaStream_t stream)
{
    if (p.f.K == 64)
        return io_bf16 ? launch<__nv_bfloat16, 64, REVERSE>(p, stream) : launch<__half, 64, REVERSE>(p, stream);
    return io_bf16 ? launch<__nv_bfloat16, 128, REVERSE>(p, stream) : launch<__half, 128, REVERSE>(p, stream);
}

} // namespace

cudaError_t fqla_bwd_launch_states(const fqla_bwd_params &p, int io_bf16, cudaStream_t stream)
{
    return launch_kd<false>(p, io_bf16, stream);
}

cudaError_t fqla_bwd_launch_dstates(const fqla_bwd_params &p, int io_bf16, cudaStream_t stream)
{
    return launch_kd<true>(p, io_bf16, stream);
}
