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
 * A chunk's inputs (raw q / k rows, the V or dO slice, T~, P~, gamma,
 * beta, the l2norm factors) go into a two-stage ring by cp.async one chunk
 * ahead, so the chain never waits on global memory: each step was ~45 % of
 * a chunk's time waiting on its copies with the copies in line. Rows whose
 * strides or base are not 16-byte multiples are copied element by element
 * into the same layout (same kernel, slower). q / k / v / dO stay in their
 * 2-byte dtype in shared memory and are widened (and normalised) as the
 * products read them.
 *
 * Each product is one call of bwd_mma in 3xTF32 (~fp32; plain tf32 in the
 * chains took x0.94 of the time and raised dg / dh0 errors from ~1e-6 to
 * ~7e-4). The state is kept in fp32 in shared memory; the eight warps split
 * each product's output tiles; the products with T~ and P~ skip their zero
 * triangles.
 */
#include "cuda/bwd_common.cuh"
#include "cuda/fwd_prepare_common.cuh"
#include "cuda/ptx/cp_async.cuh"

namespace {

constexpr int C = FQLA_BWD_C;
constexpr int VS = FQLA_BWD_VS;
constexpr int THREADS = 256;
constexpr int LDV = VS + 8; /* 64 x VS and K x VS fp32 tiles */
constexpr int LDX = VS + 8; /* 64 x VS 2-byte slices (16-byte rows) */
constexpr int LDM = C + 4;  /* 64 x 64 fp32 tiles */

/* One chunk's inputs (one ring stage). T is the io dtype's storage. */
template <int KD> struct chain_stage {
    static constexpr int LDQ = KD + 8; /* 2-byte rows, 16-byte aligned */
    uint16_t q[C * LDQ], k[C * LDQ];   /* q only in dstates */
    uint16_t x[C * LDX];               /* the V (states) or dO (dstates) slice */
    float T[C * LDM], P[C * LDM];      /* P only in dstates */
    float gam[C], bet[C], rq[C], rk[C];
};

template <int KD> struct chain_smem {
    chain_stage<KD> st[2];
    float S[KD * LDV]; /* S or dS */
    float a[C * LDV], b[C * LDV], c[C * LDV];
    float e[C], f[C];
};

/* A 2-byte element of dtype T, widened. */
template <typename T> __device__ __forceinline__ float wid(uint16_t x);
template <> __device__ __forceinline__ float wid<__nv_bfloat16>(uint16_t x) { return __uint_as_float((uint32_t)x << 16); }
template <> __device__ __forceinline__ float wid<__half>(uint16_t x) { return __half2float(__ushort_as_half(x)); }

/* Element (r, v) of a caller's state, either layout. */
__device__ __forceinline__ int64_t state_off(int64_t n, int hv, int r, int v, int64_t sn, int64_t sh, int64_t s2,
                                             int v_first)
{
    return fqla_fwd_state_off(n, hv, r, v, sn, sh, s2, v_first);
}

/* Copies `rows` rows of `cols` 2-byte elements (rows past nvalid as zeros)
 * from src (row i at src + i * st) into dst (pitch ld): 16-byte cp.async
 * where `vec`, else element by element. */
__device__ __forceinline__ void copy_rows(uint16_t *dst, int ld, const uint16_t *src, int64_t st, int cols, int nvalid,
                                          bool vec)
{
    if (vec) {
        const int per_row = cols / 8;
        for (int idx = threadIdx.x; idx < C * per_row; idx += THREADS) {
            const int i = idx / per_row, j = 8 * (idx % per_row);
            fqla_cp_async16(dst + i * ld + j, i < nvalid ? src + i * st + j : src, i < nvalid ? 16 : 0);
        }
    } else {
        for (int idx = threadIdx.x; idx < C * cols; idx += THREADS) {
            const int i = idx / cols, j = idx % cols;
            dst[i * ld + j] = i < nvalid ? src[i * st + j] : (uint16_t)0;
        }
    }
}

/* Issues chunk (slot, t0, nvalid)'s copies into stage s. */
template <int KD, bool REVERSE>
__device__ __forceinline__ void issue(const fqla_bwd_params &bp, chain_stage<KD> &s, int64_t slot, int64_t batch,
                                      int64_t t0, int nvalid, int hk, int hv, int v0, bool vec)
{
    const fqla_fwd_params &p = bp.f;
    constexpr int LDQ = chain_stage<KD>::LDQ;
    const size_t tile = (size_t)slot * p.HV + hv;
    copy_rows(s.k, LDQ, (const uint16_t *)p.k + batch * p.k_sb + t0 * p.k_st + (int64_t)hk * p.k_sh, p.k_st, KD,
              nvalid, vec);
    if (REVERSE) {
        copy_rows(s.q, LDQ, (const uint16_t *)p.q + batch * p.q_sb + t0 * p.q_st + (int64_t)hk * p.q_sh, p.q_st, KD,
                  nvalid, vec);
        copy_rows(s.x, LDX, (const uint16_t *)bp.d_o + batch * bp.do_sb + t0 * bp.do_st + (int64_t)hv * bp.do_sh + v0,
                  bp.do_st, VS, nvalid, vec);
    } else {
        copy_rows(s.x, LDX, (const uint16_t *)p.v + batch * p.v_sb + t0 * p.v_st + (int64_t)hv * p.v_sh + v0, p.v_st,
                  VS, nvalid, vec);
    }
    /* the workspace tiles: 16-byte aligned always */
    const float *Tg = bp.Tt + tile * C * C, *Pg = bp.Pt + tile * C * C;
    for (int idx = threadIdx.x; idx < C * C / 4; idx += THREADS) {
        const int i = idx / (C / 4), j = 4 * (idx % (C / 4));
        fqla_cp_async16(&s.T[i * LDM + j], Tg + 4 * idx, 16);
        if (REVERSE) fqla_cp_async16(&s.P[i * LDM + j], Pg + 4 * idx, 16);
    }
    const int t = threadIdx.x;
    if (t < C / 4) {
        fqla_cp_async16(&s.gam[4 * t], bp.gam + tile * C + 4 * t, 16);
        fqla_cp_async16(&s.bet[4 * t], bp.bet + tile * C + 4 * t, 16);
        if (p.l2norm) {
            const size_t rrow = ((size_t)slot * p.H + hk) * C;
            fqla_cp_async16(&s.rk[4 * t], p.rk + rrow + 4 * t, 16);
            if (REVERSE) fqla_cp_async16(&s.rq[4 * t], p.rq + rrow + 4 * t, 16);
        }
    }
}

template <typename T, int KD, bool REVERSE>
__global__ void __launch_bounds__(THREADS) bwd_chain_kernel(const fqla_bwd_params bp, int vec)
{
    const fqla_fwd_params &p = bp.f;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    chain_smem<KD> &sm = *reinterpret_cast<chain_smem<KD> *>(smem_raw);
    constexpr int LDQ = chain_stage<KD>::LDQ;
    const int64_t n = blockIdx.x;
    const int hv = blockIdx.y, hk = hv / p.group, v0 = blockIdx.z * VS;
    const int tid = threadIdx.x, warp = tid >> 5;
    /* 64-row products: warp w rows 16 (w % 4), columns 16 (w / 4); the K-row
     * state update: KD / 16 row tiles, the rest of the warps across columns */
    constexpr int RT = KD / 16, CW = 8 / RT, SNT = VS / CW / 8;
    const int m0 = 16 * (warp & 3), n0 = 16 * (warp >> 2);
    const int r0 = 16 * (warp % RT), c0 = (VS / CW) * (warp / RT);
    const float scale = p.scale;
    int64_t batch, start, len, slot0;
    fqla_fwd_seq(p, n, batch, start, len, slot0);
    const int64_t chunks = (len + C - 1) / C;

    /* the starting state: h0 (states) or d_final_state (dstates) */
    for (int idx = tid; idx < KD * VS; idx += THREADS) {
        const int r = idx / VS, j = idx % VS;
        float s = 0.f;
        if (REVERSE) {
            if (bp.dht) s = bp.dht[state_off(n, hv, r, v0 + j, bp.dht_sn, bp.dht_sh, bp.dht_s2, p.v_first)];
        } else if (p.h0) {
            const int64_t o = state_off(n, hv, r, v0 + j, p.h0_sn, p.h0_sh, p.h0_s2, p.v_first);
            s = p.h0_bf16 ? __bfloat162float(((const __nv_bfloat16 *)p.h0)[o]) : ((const float *)p.h0)[o];
        }
        sm.S[r * LDV + j] = s;
    }
    if (!p.l2norm && tid < C)
        for (int b = 0; b < 2; b++) sm.st[b].rq[tid] = sm.st[b].rk[tid] = 1.f;

    /* chunk order: forward, or reverse for the gradient chain */
    auto chunk_at = [&](int64_t it) { return REVERSE ? chunks - 1 - it : it; };
    auto nvalid_of = [&](int64_t c) { return (int)(len - c * C < C ? len - c * C : C); };
    if (chunks > 0) {
        const int64_t c = chunk_at(0);
        issue<KD, REVERSE>(bp, sm.st[0], slot0 + c, batch, start + c * C, nvalid_of(c), hk, hv, v0, vec);
    }
    fqla_cp_async_commit();
    for (int64_t it = 0; it < chunks; it++) {
        const int64_t c = chunk_at(it), slot = slot0 + c;
        const size_t tile = (size_t)slot * p.HV + hv;
        chain_stage<KD> &s = sm.st[it & 1];
        if (it + 1 < chunks) { /* the next chunk's copies, into the other stage */
            const int64_t cn = chunk_at(it + 1);
            issue<KD, REVERSE>(bp, sm.st[(it + 1) & 1], slot0 + cn, batch, start + cn * C, nvalid_of(cn), hk, hv, v0,
                               vec);
        }
        fqla_cp_async_commit();
        fqla_cp_async_wait<1>(); /* this chunk's group has landed (for this thread) */
        __syncthreads();         /* ... and every thread's; the state's last update too */
        /* store the state entering (states) / the gradient leaving (dstates) this chunk */
        float *dst = (REVERSE ? bp.dS : bp.S) + tile * KD * p.V;
        for (int idx = tid; idx < KD * VS; idx += THREADS) {
            const int r = idx / VS, j = idx % VS;
            dst[(int64_t)r * p.V + v0 + j] = sm.S[r * LDV + j];
        }
        if (tid < C) {
            sm.e[tid] = __expf(s.gam[tid]);
            sm.f[tid] = __expf(s.gam[C - 1] - s.gam[tid]);
        }
        __syncthreads();
        const float eC = __expf(s.gam[C - 1]);
        auto Kr = [&](int i, int k) { return wid<T>(s.k[i * LDQ + k]) * s.rk[i]; };
        auto Kt = [&](int i, int k) { return wid<T>(s.k[k * LDQ + i]) * s.rk[k]; };
        if (!REVERSE) {
            float *X = sm.a, *U = sm.b;
            { /* X = V - diag(e) K S */
                float acc[1][2][4];
                bwd_zero(acc);
                bwd_mma<true>(acc, m0, n0, 0, KD, Kr, [&](int k, int j) { return sm.S[k * LDV + j]; });
                bwd_each(acc, m0, n0, [&](int i, int j, float v) {
                    X[i * LDV + j] = wid<T>(s.x[i * LDX + j]) - sm.e[i] * v;
                });
            }
            __syncthreads();
            { /* U = T~ diag(beta) X */
                float acc[1][2][4];
                bwd_zero(acc);
                bwd_mma<true>(acc, m0, n0, 0, m0 + 16, [&](int i, int k) { return s.T[i * LDM + k]; },
                              [&](int k, int j) { return s.bet[k] * X[k * LDV + j]; });
                bwd_each(acc, m0, n0, [&](int i, int j, float v) { U[i * LDV + j] = v; });
            }
            __syncthreads();
            { /* S = e_C S + K^T diag(f) U */
                float acc[1][SNT][4];
                bwd_zero(acc);
                bwd_mma<true>(acc, r0, c0, 0, C, Kt, [&](int k, int j) { return sm.f[k] * U[k * LDV + j]; });
                bwd_each(acc, r0, c0, [&](int i, int j, float v) { sm.S[i * LDV + j] = eC * sm.S[i * LDV + j] + v; });
            }
        } else {
            float *dU = sm.b, *dY = sm.c;
            auto dO = [&](int k, int j) { return wid<T>(s.x[k * LDX + j]); };
            { /* diag(f) K dS */
                float acc[1][2][4];
                bwd_zero(acc);
                bwd_mma<true>(acc, m0, n0, 0, KD, Kr, [&](int k, int j) { return sm.S[k * LDV + j]; });
                bwd_each(acc, m0, n0, [&](int i, int j, float v) { dU[i * LDV + j] = sm.f[i] * v; });
            }
            __syncthreads();
            { /* dU = P~^T dO + diag(f) K dS (P~^T is upper triangular) */
                float acc[1][2][4];
                bwd_zero(acc);
                bwd_mma<true>(acc, m0, n0, m0, C, [&](int i, int k) { return s.P[k * LDM + i]; }, dO);
                bwd_each(acc, m0, n0, [&](int i, int j, float v) { dU[i * LDV + j] += v; });
            }
            __syncthreads();
            { /* dY = T~^T dU */
                float acc[1][2][4];
                bwd_zero(acc);
                bwd_mma<true>(acc, m0, n0, m0, C, [&](int i, int k) { return s.T[k * LDM + i]; },
                              [&](int k, int j) { return dU[k * LDV + j]; });
                bwd_each(acc, m0, n0, [&](int i, int j, float v) { dY[i * LDV + j] = v; });
            }
            __syncthreads();
            { /* dS = e_C dS + Q^T (scale diag(e) dO) - K^T (diag(e beta) dY) */
                float acc[1][SNT][4];
                bwd_zero(acc);
                bwd_mma<true>(acc, r0, c0, 0, C, [&](int i, int k) { return wid<T>(s.q[k * LDQ + i]) * s.rq[k]; },
                              [&](int k, int j) { return scale * sm.e[k] * dO(k, j); });
                bwd_mma<true>(acc, r0, c0, 0, C, Kt,
                              [&](int k, int j) { return -sm.e[k] * s.bet[k] * dY[k * LDV + j]; });
                bwd_each(acc, r0, c0, [&](int i, int j, float v) { sm.S[i * LDV + j] = eC * sm.S[i * LDV + j] + v; });
            }
        }
        __syncthreads(); /* this stage is read; the next iteration's copies may reuse it */
    }
    fqla_cp_async_wait_all();
    if (REVERSE && bp.dh0) {
        __syncthreads();
        for (int idx = tid; idx < KD * VS; idx += THREADS) {
            const int r = idx / VS, j = idx % VS;
            bp.dh0[state_off(n, hv, r, v0 + j, bp.dh0_sn, bp.dh0_sh, bp.dh0_s2, p.v_first)] = sm.S[r * LDV + j];
        }
    }
}

/* Whether every 2-byte row the chains copy starts on a 16-byte boundary. */
int rows_vec(const fqla_bwd_params &b)
{
    const fqla_fwd_params &p = b.f;
    const void *base[4] = {p.q, p.k, p.v, b.d_o};
    const int64_t st[12] = {p.q_sb, p.q_st, p.q_sh, p.k_sb, p.k_st, p.k_sh,
                            p.v_sb, p.v_st, p.v_sh, b.do_sb, b.do_st, b.do_sh};
    for (int i = 0; i < 4; i++)
        if ((uintptr_t)base[i] % 16) return 0;
    for (int i = 0; i < 12; i++)
        if (st[i] % 8) return 0;
    return 1;
}

template <typename T, int KD, bool REVERSE> cudaError_t launch(const fqla_bwd_params &p, cudaStream_t stream)
{
    static fqla_smem_cache cache;
    const size_t smem = sizeof(chain_smem<KD>);
    cudaError_t e = fqla_smem_limit(cache, bwd_chain_kernel<T, KD, REVERSE>, smem);
    if (e != cudaSuccess) return e;
    return fqla_launch(bwd_chain_kernel<T, KD, REVERSE>, dim3((unsigned)p.f.N, (unsigned)p.f.HV, (unsigned)(p.f.V / VS)),
                       dim3(THREADS), smem, stream, 0, p, rows_vec(p));
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
