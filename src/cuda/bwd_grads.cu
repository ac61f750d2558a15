/*
 * bwd_grads.cu - every per-token gradient of one chunk, from the state
 * entering it (S) and the gradient w.r.t. the state leaving it (dS'), both
 * stored by bwd_chain.cu (bwd_common.cuh). The reverse of the chunk forward
 * (notation of src/cpu/chunked_bwd.c, whose header derives it):
 *
 *   X = V - diag(e) K S,  Y = diag(beta) X,  U = T~ Y
 *   dU  = P~^T dO + diag(f) K dS'          df_j = (K dS')_j . u_j
 *   dP~ = dO U^T,  dT~ = dU Y^T,  dY = T~^T dU,  dX = diag(beta) dY = dv
 *   dbeta_i = x_i . dy_i + sum_j dL_ij Gamma_ij k_i . k_j
 *   de_i = scale q_i . (dO S^T)_i - (K S)_i . dX_i,  de_C = <S, dS'>
 *   dQ = scale diag(e) dO S^T + dQ~ K
 *   dK = -diag(e) dX S^T + diag(f) U dS'^T + dQ~^T Q + (M + M^T) K
 *   dL = -T~^T dT~ T~^T (strict lower),  M = diag(beta) (Gamma . dL),
 *   dQ~ = scale Gamma . dP~ (lower)
 *   dg_t = sum_{i >= t} de_i e_i + sum_{j < t} df_j f_j + de_C e_C
 *          + sum_{i >= t > j} R_ij,  R_ij = Gamma_ij (dL_ij beta_i k_i.k_j
 *          + scale dP~_ij q_i.k_j)
 * dg from the terms that contain g_t, so a tiny dg under a strong decay
 * keeps its relative accuracy.
 *
 * Grid (slots, H): one CTA of 512 threads per chunk and q/k head runs the
 * value heads of its GVA group in order, so dq and dk are summed over the
 * group in registers (no atomics, bit-identical reruns). Per value head the
 * value columns go in slices of FQLA_BWD_VS: the slice products (64 x VS
 * outputs: warp w rows 16 (w % 4), columns 8 (w / 4)) land in shared
 * memory; the 64 x K gradients (warp w rows 16 (w % 4), columns K/4 (w / 4))
 * stay in registers across slices and heads: dO S^T of the head, and the
 * group's dQ, dK.
 */
#include "cuda/bwd_common.cuh"
#include "cuda/fwd_prepare_common.cuh"

namespace {

constexpr int C = FQLA_BWD_C;
constexpr int VS = FQLA_BWD_VS;
constexpr int LDV = VS + 4;  /* 64 x VS fp32 slices */
constexpr int LDB = VS + 4;  /* K x VS state slices */
constexpr int LDM = C + 4;   /* 64 x 64 tiles */

template <int KD> struct grads_smem {
    static constexpr int LDK = KD + 4;
    float q[C * LDK], k[C * LDK];
    float T[C * LDM], P[C * LDM], dP[C * LDM], dT[C * LDM];
    /* the slice buffers; after the slices, three 64 x 64 work tiles */
    union {
        struct {
            float X[C * LDV], KS[C * LDV], dO[C * LDV], U[C * LDV], dU[C * LDV], dY[C * LDV];
        } s;
        float w[3][C * LDM];
    } u;
    float S[KD * LDB], dS[KD * LDB];
    float gam[C], bet[C], e[C], f[C];
    float df[C], db[C], de[C]; /* de collects -(K S)_i . dx_i over the slices first */
    float red[4][C];   /* per-warp-column partial row sums */
};

constexpr int THREADS = 512;
constexpr int RG = THREADS / C; /* threads per row in the row-wise passes */

/* Sums v over the 4 lanes t of a quad (the lanes that hold one row of an
 * mma accumulator tile), in a fixed order. */
__device__ __forceinline__ float quad_sum(float v)
{
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    return v;
}

/* Sums v over the RG adjacent lanes that share a row, in a fixed order. */
__device__ __forceinline__ float row_sum(float v)
{
#pragma unroll
    for (int o = 1; o < RG; o <<= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Row dots sum_j a(i, j) b(i, j) over a 64 x VS slice, added to out[i]:
 * RG threads per row, VS / RG columns each, then a fixed-order sum. */
template <typename FA, typename FB>
__device__ __forceinline__ void row_dots(FA a, FB b, float *out)
{
    const int i = threadIdx.x / RG, q = threadIdx.x % RG;
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < VS / RG; j++) s += a(i, q * (VS / RG) + j) * b(i, q * (VS / RG) + j);
    s = row_sum(s);
    if (q == 0) out[i] += s;
}

/* sum over rows of the register tile's r(i, j) * x(i, j), per row, into
 * red[warp column group][row]; then out[i] = sum of the four in order. */
template <int MT, int NT, typename F>
__device__ __forceinline__ void tile_row_dots(float (&acc)[MT][NT][4], int m0, int n0, F x, float (*red)[C])
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int i = m0 + 16 * mt + 8 * h + g;
            float s = 0.f;
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 2; e++) s += acc[mt][nt][2 * h + e] * x(i, n0 + 8 * nt + 2 * t + e);
            s = quad_sum(s);
            if (t == 0) red[warp >> 2][i] = s;
        }
}

template <typename T, int KD>
__global__ void __launch_bounds__(THREADS, 1) bwd_grads_kernel(const fqla_bwd_params bp)
{
    const fqla_fwd_params &p = bp.f;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    grads_smem<KD> &sm = *reinterpret_cast<grads_smem<KD> *>(smem_raw);
    constexpr int LDK = grads_smem<KD>::LDK;
    constexpr int NTK = KD / 32; /* n-tiles of a warp's K/4 columns */
    static_assert(THREADS == 512, "the warp tilings below are for sixteen warps");
    const int64_t slot = blockIdx.x;
    const int hk = blockIdx.y;
    const int tid = threadIdx.x, warp = tid >> 5;
    const float scale = p.scale;

    int64_t batch, t0;
    int nvalid;
    if (!bwd_slot_chunk(p, slot, batch, t0, nvalid)) {
        if (bp.gate_part)
            for (int h = tid; h < p.group; h += blockDim.x) {
                const size_t tile = (size_t)slot * p.HV + hk * p.group + h;
                bp.gate_part[2 * tile] = bp.gate_part[2 * tile + 1] = 0.f;
            }
        return;
    }
    const size_t rrow = ((size_t)slot * p.H + hk) * C;

    /* q, k rows (normalised), fp32 */
    for (int w = 0; w < 2; w++) {
        const T *x = (const T *)(w ? p.k : p.q);
        const int64_t sb = w ? p.k_sb : p.q_sb, st = w ? p.k_st : p.q_st, sh = w ? p.k_sh : p.q_sh;
        const float *r = p.l2norm ? (w ? p.rk : p.rq) + rrow : nullptr;
        float *dst = w ? sm.k : sm.q;
        bwd_copy(
            C * KD,
            [&](int idx) {
                const int i = idx / KD, j = idx % KD;
                if (i >= nvalid) return 0.f;
                const float v = bwd_ld<T>(x, batch * sb + (t0 + i) * st + (int64_t)hk * sh + j);
                return r ? v * r[i] : v;
            },
            [&](int idx, float v) { dst[(idx / KD) * LDK + idx % KD] = v; });
    }

    /* the 64 x K register tiles: warp w rows 16 (w % 4), columns K/4 (w / 4) */
    const int gm0 = 16 * (warp & 3), gn0 = (KD / 4) * (warp >> 2);
    float dQ[1][NTK][4], dK[1][NTK][4], G2q[1][NTK][4];
    bwd_zero(dQ);
    bwd_zero(dK);
    /* the slice tiles: warp w rows 16 (w % 4), columns 8 (w / 4) */
    const int sm0 = 16 * (warp & 3), sn0 = 8 * (warp >> 2);
    /* the 64 x 64 tiles: warp w rows 16 (w % 4), columns 16 (w / 4) */
    const int cm0 = 16 * (warp & 3), cn0 = 16 * (warp >> 2);

    for (int h = 0; h < p.group; h++) {
        const int hv = hk * p.group + h;
        const size_t tile = (size_t)slot * p.HV + hv;
        __syncthreads(); /* the previous head's reads are done */
        bwd_copy(C * C, [&](int idx) { return bp.Tt[tile * C * C + idx]; },
                 [&](int idx, float v) { sm.T[(idx >> 6) * LDM + (idx & 63)] = v; });
        bwd_copy(C * C, [&](int idx) { return bp.Pt[tile * C * C + idx]; },
                 [&](int idx, float v) { sm.P[(idx >> 6) * LDM + (idx & 63)] = v; });
        for (int idx = tid; idx < C * C; idx += blockDim.x) {
            sm.dP[(idx >> 6) * LDM + (idx & 63)] = 0.f;
            sm.dT[(idx >> 6) * LDM + (idx & 63)] = 0.f;
        }
        if (tid < C) {
            sm.gam[tid] = bp.gam[tile * C + tid];
            sm.bet[tid] = bp.bet[tile * C + tid];
            sm.df[tid] = sm.de[tid] = sm.db[tid] = 0.f;
        }
        __syncthreads();
        if (tid < C) {
            sm.e[tid] = __expf(sm.gam[tid]);
            sm.f[tid] = __expf(sm.gam[C - 1] - sm.gam[tid]);
        }
        bwd_zero(G2q);
        float deC = 0.f; /* this thread's share of <S, dS'> */

        for (int v0 = 0; v0 < p.V; v0 += VS) {
            __syncthreads(); /* the previous slice's reads are done */
            const float *Sg = bp.S + tile * KD * p.V, *dSg = bp.dS + tile * KD * p.V;
            bwd_copy(KD * VS, [&](int idx) { return Sg[(int64_t)(idx / VS) * p.V + v0 + idx % VS]; },
                     [&](int idx, float v) { sm.S[(idx / VS) * LDB + idx % VS] = v; });
            bwd_copy(KD * VS, [&](int idx) { return dSg[(int64_t)(idx / VS) * p.V + v0 + idx % VS]; },
                     [&](int idx, float v) { sm.dS[(idx / VS) * LDB + idx % VS] = v; });
            bwd_copy(C * VS,
                     [&](int idx) {
                         const int i = idx / VS, j = idx % VS;
                         return i < nvalid ? bwd_ld<T>((const T *)p.v, batch * p.v_sb + (t0 + i) * p.v_st +
                                                                            (int64_t)hv * p.v_sh + v0 + j)
                                           : 0.f;
                     },
                     [&](int idx, float v) { sm.u.s.X[(idx / VS) * LDV + idx % VS] = v; });
            bwd_copy(C * VS,
                     [&](int idx) {
                         const int i = idx / VS, j = idx % VS;
                         return i < nvalid ? bwd_ld<T>((const T *)bp.d_o, batch * bp.do_sb + (t0 + i) * bp.do_st +
                                                                              (int64_t)hv * bp.do_sh + v0 + j)
                                           : 0.f;
                     },
                     [&](int idx, float v) { sm.u.s.dO[(idx / VS) * LDV + idx % VS] = v; });
            __syncthreads();
            float *X = sm.u.s.X, *KS = sm.u.s.KS, *dO = sm.u.s.dO, *U = sm.u.s.U, *dU = sm.u.s.dU, *dY = sm.u.s.dY;
            { /* K S, K dS' */
                float a1[1][1][4], a2[1][1][4];
                bwd_zero(a1);
                bwd_zero(a2);
                auto Kr = [&](int i, int k) { return sm.k[i * LDK + k]; };
                bwd_mma<true>(a1, sm0, sn0, 0, KD, Kr, [&](int k, int j) { return sm.S[k * LDB + j]; });
                bwd_mma<true>(a2, sm0, sn0, 0, KD, Kr, [&](int k, int j) { return sm.dS[k * LDB + j]; });
                bwd_each(a1, sm0, sn0, [&](int i, int j, float v) {
                    KS[i * LDV + j] = v;
                    X[i * LDV + j] -= sm.e[i] * v;
                });
                bwd_each(a2, sm0, sn0, [&](int i, int j, float v) { dU[i * LDV + j] = v; });
            }
            __syncthreads();
            { /* U = T~ diag(beta) X */
                float a1[1][1][4];
                bwd_zero(a1);
                bwd_mma<true>(a1, sm0, sn0, 0, sm0 + 16, [&](int i, int k) { return sm.T[i * LDM + k]; },
                        [&](int k, int j) { return sm.bet[k] * X[k * LDV + j]; });
                bwd_each(a1, sm0, sn0, [&](int i, int j, float v) { U[i * LDV + j] = v; });
            }
            __syncthreads();
            /* df_i += (K dS')_i . u_i (dU holds K dS' still) */
            row_dots([&](int i, int j) { return dU[i * LDV + j]; }, [&](int i, int j) { return U[i * LDV + j]; },
                     sm.df);
            __syncthreads();
            { /* dU = P~^T dO + diag(f) K dS' */
                float a1[1][1][4];
                bwd_zero(a1);
                bwd_mma<true>(a1, sm0, sn0, sm0, C, [&](int i, int k) { return sm.P[k * LDM + i]; },
                        [&](int k, int j) { return dO[k * LDV + j]; });
                bwd_each(a1, sm0, sn0, [&](int i, int j, float v) { dU[i * LDV + j] = v + sm.f[i] * dU[i * LDV + j]; });
            }
            __syncthreads();
            { /* dY = T~^T dU;  dP~ += dO U^T;  dT~ += dU Y^T */
                float a1[1][1][4];
                bwd_zero(a1);
                bwd_mma<true>(a1, sm0, sn0, sm0, C, [&](int i, int k) { return sm.T[k * LDM + i]; },
                        [&](int k, int j) { return dU[k * LDV + j]; });
                bwd_each(a1, sm0, sn0, [&](int i, int j, float v) { dY[i * LDV + j] = v; });
                float a2[1][2][4], a3[1][2][4];
                bwd_zero(a2);
                bwd_zero(a3);
                bwd_mma<true>(a2, cm0, cn0, 0, VS, [&](int i, int k) { return dO[i * LDV + k]; },
                        [&](int k, int j) { return U[j * LDV + k]; });
                bwd_mma<true>(a3, cm0, cn0, 0, VS, [&](int i, int k) { return dU[i * LDV + k]; },
                        [&](int k, int j) { return sm.bet[j] * X[j * LDV + k]; });
                bwd_each(a2, cm0, cn0, [&](int i, int j, float v) { sm.dP[i * LDM + j] += v; });
                bwd_each(a3, cm0, cn0, [&](int i, int j, float v) { sm.dT[i * LDM + j] += v; });
            }
            __syncthreads();
            /* dv = diag(beta) dY;  dbeta_i += x_i . dy_i;  dek_i += (K S)_i . dx_i */
            for (int idx = tid; idx < nvalid * VS; idx += blockDim.x) {
                const int i = idx / VS, j = idx % VS;
                ((T *)bp.dv)[batch * bp.dv_sb + (t0 + i) * bp.dv_st + (int64_t)hv * bp.dv_sh + v0 + j] =
                    bwd_cvt<T>(sm.bet[i] * dY[i * LDV + j]);
            }
            row_dots([&](int i, int j) { return X[i * LDV + j]; }, [&](int i, int j) { return dY[i * LDV + j]; },
                     sm.db);
            row_dots([&](int i, int j) { return KS[i * LDV + j]; },
                     [&](int i, int j) { return -sm.bet[i] * dY[i * LDV + j]; }, sm.de);
            for (int idx = tid; idx < KD * VS; idx += blockDim.x) {
                const int r = idx / VS, j = idx % VS;
                deC += sm.S[r * LDB + j] * sm.dS[r * LDB + j];
            }
            /* G2q += dO S^T;  dK += -diag(e beta) dY S^T + diag(f) U dS'^T */
            bwd_mma<true>(G2q, gm0, gn0, 0, VS, [&](int i, int k) { return dO[i * LDV + k]; },
                    [&](int k, int j) { return sm.S[j * LDB + k]; });
            bwd_mma<true>(dK, gm0, gn0, 0, VS, [&](int i, int k) { return -sm.e[i] * sm.bet[i] * dY[i * LDV + k]; },
                    [&](int k, int j) { return sm.S[j * LDB + k]; });
            bwd_mma<true>(dK, gm0, gn0, 0, VS, [&](int i, int k) { return sm.f[i] * U[i * LDV + k]; },
                    [&](int k, int j) { return sm.dS[j * LDB + k]; });
        }

        /* de_C: a fixed-order block sum of the threads' shares */
        {
            float s = deC;
#pragma unroll
            for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            __syncthreads();
            if ((tid & 31) == 0) sm.red[0][warp] = s;
            __syncthreads();
            if (tid == 0) {
                float t = 0.f;
                for (int w = 0; w < THREADS / 32; w++) t += sm.red[0][w];
                sm.red[3][0] = t; /* read before tile_row_dots reuses red */
            }
        }
        __syncthreads();
        const float deC_all = sm.red[3][0];
        __syncthreads();
        /* de_i = scale q_i . (dO S^T)_i - (K S)_i . dx_i */
        tile_row_dots(G2q, gm0, gn0, [&](int i, int j) { return sm.q[i * LDK + j]; }, sm.red);
        __syncthreads();
        if (tid < C)
            sm.de[tid] += scale * (sm.red[0][tid] + sm.red[1][tid] + sm.red[2][tid] + sm.red[3][tid]);
        /* dQ += scale diag(e) dO S^T */
        bwd_each(G2q, gm0, gn0, [&](int i, int j, float &v) { (void)j; v *= scale * sm.e[i]; });
#pragma unroll
        for (int a = 0; a < 1; a++)
#pragma unroll
            for (int b = 0; b < NTK; b++)
#pragma unroll
                for (int x = 0; x < 4; x++) dQ[a][b][x] += G2q[a][b][x];

        float *M1 = sm.u.w[0], *dL = sm.u.w[1], *KK = sm.u.w[2];
        { /* M1 = T~^T (strict lower dT~);  K K^T */
            float a1[1][2][4], a2[1][2][4];
            bwd_zero(a1);
            bwd_zero(a2);
            bwd_mma<true>(a1, cm0, cn0, cm0, C, [&](int i, int k) { return sm.T[k * LDM + i]; },
                    [&](int k, int j) { return j < k ? sm.dT[k * LDM + j] : 0.f; });
            bwd_mma<true>(a2, cm0, cn0, 0, KD, [&](int i, int k) { return sm.k[i * LDK + k]; },
                    [&](int k, int j) { return sm.k[j * LDK + k]; });
            bwd_each(a1, cm0, cn0, [&](int i, int j, float v) { M1[i * LDM + j] = v; });
            bwd_each(a2, cm0, cn0, [&](int i, int j, float v) { KK[i * LDM + j] = v; });
        }
        __syncthreads();
        { /* dL = -M1 T~^T (strict lower) */
            float a1[1][2][4];
            bwd_zero(a1);
            bwd_mma<true>(a1, cm0, cn0, 0, C, [&](int i, int k) { return M1[i * LDM + k]; },
                    [&](int k, int j) { return sm.T[j * LDM + k]; });
            bwd_each(a1, cm0, cn0, [&](int i, int j, float v) { dL[i * LDM + j] = j < i ? -v : 0.f; });
        }
        __syncthreads();
        /* per element (i, j): gdl = Gamma dL (strict lower); dbeta_i += sum gdl KK;
         * M = diag(beta) gdl into M1; R_ij = beta_i gdl KK + dP~ P~ into dL;
         * dQ~ = scale Gamma dP~ (lower) into dP */
        {
            const int i = tid / RG, q = tid % RG;
            float s = 0.f;
            for (int jj = 0; jj < C / RG; jj++) {
                const int j = q * (C / RG) + jj;
                const float G = j <= i ? __expf(sm.gam[i] - sm.gam[j]) : 0.f;
                const float gdl = j < i ? dL[i * LDM + j] * G : 0.f;
                const float kk = KK[i * LDM + j];
                s += gdl * kk;
                M1[i * LDM + j] = sm.bet[i] * gdl;
                const float dp = sm.dP[i * LDM + j];
                dL[i * LDM + j] = j < i ? sm.bet[i] * gdl * kk + dp * sm.P[i * LDM + j] : 0.f;
                sm.dP[i * LDM + j] = scale * G * dp;
            }
            s = row_sum(s);
            if (q == 0) sm.db[i] += s;
        }
        __syncthreads();
        { /* dQ += dQ~ K;  dK += dQ~^T Q + (M + M^T) K */
            bwd_mma<true>(dQ, gm0, gn0, 0, C, [&](int i, int k) { return sm.dP[i * LDM + k]; },
                    [&](int k, int j) { return sm.k[k * LDK + j]; });
            bwd_mma<true>(dK, gm0, gn0, 0, C, [&](int i, int k) { return sm.dP[k * LDM + i]; },
                    [&](int k, int j) { return sm.q[k * LDK + j]; });
            bwd_mma<true>(dK, gm0, gn0, 0, C,
                    [&](int i, int k) { return k < i ? M1[i * LDM + k] : (k > i ? M1[k * LDM + i] : 0.f); },
                    [&](int k, int j) { return sm.k[k * LDK + j]; });
        }
        /* dg_t = sum_{i >= t} (de_i e_i + sum_{j < t} R_ij) + sum_{j < t} df_j f_j + de_C e_C */
        {
            const int t = tid / RG, q = tid % RG;
            float s = 0.f;
            for (int i = t + q; i < C; i += RG) {
                s += sm.de[i] * sm.e[i];
                for (int j = 0; j < t; j++) s += dL[i * LDM + j];
            }
            for (int j = q; j < t; j += RG) s += sm.df[j] * sm.f[j];
            s = row_sum(s);
            float dgv = s + deC_all * __expf(sm.gam[C - 1]);
            float dbv = sm.db[t];
            const bool ok = t < nvalid && q == 0;
            float part_a = 0.f, part_d = 0.f;
            if (ok) {
                const int64_t tt = t0 + t;
                if (p.gate_in_kernel) {
                    const float raw = load_gate(p.g, p.g_bf16, batch * p.g_sb + tt * p.g_st + hv * p.g_sh);
                    const float A = __expf(p.A_log[hv * p.alog_s]);
                    const float x = raw + p.dt_bias[hv * p.dtb_s];
                    float gval = -A * softplus_f(x);
                    /* the forward's floor: below it g did not depend on its input */
                    const float dx = gval < FQLA_FWD_G_FLOOR ? 0.f : -A * sigmoid_f(x) * dgv;
                    part_d = dx;
                    part_a = gval < FQLA_FWD_G_FLOOR ? 0.f : gval * dgv;
                    dgv = dx;
                }
                if (p.beta_sigmoid) {
                    const float b = load_gate(p.beta, p.beta_bf16, batch * p.b_sb + tt * p.b_st + hv * p.b_sh);
                    dbv *= (p.neg_eig ? 2.f : 1.f) * sigmoid_f(b) * sigmoid_f(-b);
                }
                bp.dg[batch * bp.dg_sb + tt * bp.dg_st + (int64_t)hv * bp.dg_sh] = dgv;
                bp.dbeta[batch * bp.db_sb + tt * bp.db_st + (int64_t)hv * bp.db_sh] = dbv;
            }
            if (bp.gate_part) {
                __syncthreads();
                if (q == 0) {
                    sm.red[0][t] = part_a;
                    sm.red[1][t] = part_d;
                }
                __syncthreads();
                if (tid == 0) {
                    float sa = 0.f, sd = 0.f;
                    for (int i = 0; i < C; i++) {
                        sa += sm.red[0][i];
                        sd += sm.red[1][i];
                    }
                    bp.gate_part[2 * tile] = sa;
                    bp.gate_part[2 * tile + 1] = sd;
                }
            }
        }
    }

    /* dq, dk rows: through the l2norm backward dx = r (dxhat - xhat <xhat, dxhat>) */
    auto store = [&](float(&acc)[1][NTK][4], const float *xs, T *out, int64_t sb, int64_t st, int64_t sh,
                     const float *r) {
        __syncthreads();
        if (p.l2norm) {
            tile_row_dots(acc, gm0, gn0, [&](int i, int j) { return xs[i * LDK + j]; }, sm.red);
            __syncthreads();
            if (tid < C) sm.de[tid] = sm.red[0][tid] + sm.red[1][tid] + sm.red[2][tid] + sm.red[3][tid];
            __syncthreads();
        }
        bwd_each(acc, gm0, gn0, [&](int i, int j, float v) {
            if (i >= nvalid) return;
            if (p.l2norm) v = r[rrow + i] * (v - xs[i * LDK + j] * sm.de[i]);
            out[batch * sb + (t0 + i) * st + (int64_t)hk * sh + j] = bwd_cvt<T>(v);
        });
    };
    store(dQ, sm.q, (T *)bp.dq, bp.dq_sb, bp.dq_st, bp.dq_sh, p.rq);
    store(dK, sm.k, (T *)bp.dk, bp.dk_sb, bp.dk_st, bp.dk_sh, p.rk);
}

template <typename T, int KD> cudaError_t launch(const fqla_bwd_params &p, cudaStream_t stream)
{
    static fqla_smem_cache cache;
    const size_t smem = sizeof(grads_smem<KD>);
    cudaError_t e = fqla_smem_limit(cache, bwd_grads_kernel<T, KD>, smem);
    if (e != cudaSuccess) return e;
    return fqla_launch(bwd_grads_kernel<T, KD>, dim3((unsigned)p.f.slots, (unsigned)p.f.H), dim3(THREADS), smem, stream,
                       0, p);
}

} // namespace

cudaError_t fqla_bwd_launch_grads(const fqla_bwd_params &p, int io_bf16, cudaStream_t stream)
{
    if (p.f.K == 64) return io_bf16 ? launch<__nv_bfloat16, 64>(p, stream) : launch<__half, 64>(p, stream);
    return io_bf16 ? launch<__nv_bfloat16, 128>(p, stream) : launch<__half, 128>(p, stream);
}
