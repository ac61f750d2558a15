/*
 * fwd_recurrent.cu - the CUDA forward for fp32 q/k/v: the recurrence token by
 * token in fp32 on CUDA cores, the slower path the chunked kernels' bf16 /
 * fp16 tensor-core products cannot serve at fp32 accuracy (TESTING.md:
 * 1e-4 against the fp64 reference for fp32 inputs).
 *
 * Per (sequence, value head) and token t, as the decode kernel
 * (decode_kernel.cuh) computes it:
 *
 *     S <- e^g S;  u = beta (v - S^T k^);  S <- S + k^ u^T;  o = scale S^T q^
 *
 * with k^ = rk k, q^ = rq q (the in-kernel l2norm's factors, else 1), g and
 * beta from finish_gate_beta (the in-kernel gate, beta sigmoid, the gate's
 * floor), and both reductions on the state before the token:
 *
 *     S^T k^ = e^g rk (S_old^T k),   o = scale (e^g rq (S_old^T q) + rq rk (q . k) u).
 *
 * One warp per (sequence, value head, CPW value columns): each column's K
 * state rows in fp32 registers, split over LPC = K / 64 lanes of 64 rows
 * each (CPW = 32 / LPC columns per warp), so a lane holds 64 floats. A lane
 * reads its 64 rows of q and k (the same addresses for every column group of
 * the warp: broadcasts) and sums its part; the LPC partial sums meet by warp
 * shuffles. Warps past the chains' zero o's rows after the last sequence
 * (varlen). No workspace, no shared memory, no synchronisation.
 */
#include "cuda/fwd_common.cuh"
#include "cuda/fwd_prepare_common.cuh"

namespace {

constexpr int RW = 64;        /* state rows per lane */
constexpr int WARPS = 4;      /* per CTA */
constexpr int TAIL_WARPS = 64; /* warps zeroing the rows after the last sequence (varlen) */

/* 64 consecutive floats of a row: four at a time where the caller's
 * pointers and strides allow (VEC4), else one at a time. */
template <bool VEC4>
__device__ __forceinline__ void load64(const float *src, float (&x)[RW])
{
    if constexpr (VEC4) {
#pragma unroll
        for (int i = 0; i < RW / 4; i++) {
            const float4 f = reinterpret_cast<const float4 *>(src)[i];
            x[4 * i] = f.x, x[4 * i + 1] = f.y, x[4 * i + 2] = f.z, x[4 * i + 3] = f.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < RW; i++) x[i] = src[i];
    }
}

/* The sum over the LPC lanes of a column (adjacent lanes). */
template <int LPC>
__device__ __forceinline__ float col_sum(float x)
{
#pragma unroll
    for (int o = 1; o < LPC; o <<= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

template <int KD, bool VEC4>
__global__ void __launch_bounds__(32 * WARPS) fwd_recurrent_kernel(const __grid_constant__ fqla_fwd_params p)
{
    constexpr int LPC = KD / RW, CPW = 32 / LPC;
    const int lane = threadIdx.x & 31;
    const int64_t w = (int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5);
    const int slices = (p.V + CPW - 1) / CPW;
    const int64_t chains = p.N * p.HV * slices;
    if (w >= chains) {
        /* o's rows after the last sequence (varlen): exact zeros */
        if (!p.varlen) return;
        const int64_t end = fqla_fwd_cu(p, p.N), per_row = (int64_t)p.HV * p.V;
        for (int64_t i = (w - chains) * 32 + lane; i < (p.T - end) * per_row; i += (int64_t)TAIL_WARPS * 32) {
            const int64_t t = end + i / per_row, r = i % per_row;
            ((float *)p.o)[t * p.o_st + (r / p.V) * p.o_sh + r % p.V] = 0.f;
        }
        return;
    }
    const int slice = (int)(w % slices);
    const int hv = (int)((w / slices) % p.HV);
    const int64_t n = w / slices / p.HV;
    const int hq = hv / p.group;
    const int part = lane % LPC, v = slice * CPW + lane / LPC;
    const bool col = v < p.V; /* lanes past V keep their place in the shuffles */
    const int vc = col ? v : 0;
    const int k0 = part * RW;

    int64_t batch, start, len, slot0;
    fqla_fwd_seq(p, n, batch, start, len, slot0);

    float S[RW];
#pragma unroll
    for (int i = 0; i < RW; i++) {
        S[i] = 0.f;
        if (p.h0) {
            const int64_t off = fqla_fwd_state_off(n, hv, k0 + i, vc, p.h0_sn, p.h0_sh, p.h0_s2, p.v_first);
            S[i] = p.h0_bf16 ? __bfloat162float(((const __nv_bfloat16 *)p.h0)[off]) : ((const float *)p.h0)[off];
        }
    }

    const float *qb = (const float *)p.q + batch * p.q_sb + hq * p.q_sh + k0;
    const float *kb = (const float *)p.k + batch * p.k_sb + hq * p.k_sh + k0;
    const float *vb = (const float *)p.v + batch * p.v_sb + hv * p.v_sh + vc;
    float *ob = (float *)p.o + batch * p.o_sb + hv * p.o_sh + vc;
    for (int64_t t = start; t < start + len; t++) {
        float qr[RW], kr[RW];
        load64<VEC4>(qb + t * p.q_st, qr);
        load64<VEC4>(kb + t * p.k_st, kr);
        const float vt = vb[t * p.v_st];
        float g = load_gate(p.g, p.g_bf16, batch * p.g_sb + t * p.g_st + hv * p.g_sh);
        float beta = load_gate(p.beta, p.beta_bf16, batch * p.b_sb + t * p.b_st + hv * p.b_sh);
        finish_gate_beta(p, hv, g, beta);
        float kS = 0.f, qS = 0.f, qk = 0.f, kk = 0.f, qq = 0.f;
#pragma unroll
        for (int i = 0; i < RW; i++) {
            kS += kr[i] * S[i];
            qS += qr[i] * S[i];
            qk += qr[i] * kr[i];
            if (p.l2norm) {
                kk += kr[i] * kr[i];
                qq += qr[i] * qr[i];
            }
        }
        kS = col_sum<LPC>(kS);
        qS = col_sum<LPC>(qS);
        qk = col_sum<LPC>(qk);
        float rk = 1.f, rq = 1.f;
        if (p.l2norm) {
            rk = rsqrtf(col_sum<LPC>(kk) + 1e-6f);
            rq = rsqrtf(col_sum<LPC>(qq) + 1e-6f);
        }
        const float eg = expf(g);
        const float u = beta * (vt - eg * rk * kS);
        const float ku = rk * u;
#pragma unroll
        for (int i = 0; i < RW; i++) S[i] = eg * S[i] + kr[i] * ku;
        if (col && part == 0) ob[t * p.o_st] = p.scale * (eg * rq * qS + rq * rk * qk * u);
    }

    if (p.ht && col) {
#pragma unroll
        for (int i = 0; i < RW; i++) {
            const int64_t off = fqla_fwd_state_off(n, hv, k0 + i, v, p.ht_sn, p.ht_sh, p.ht_s2, p.ht_v_first);
            if (p.ht_bf16) ((__nv_bfloat16 *)p.ht)[off] = __float2bfloat16_rn(S[i]);
            else ((float *)p.ht)[off] = S[i];
        }
    }
}

template <int KD>
cudaError_t launch_kd(const fqla_fwd_params &p, bool vec4, cudaStream_t stream)
{
    const dim3 grid((unsigned)fqla_fwd_recurrent_ctas(p.N, p.HV, KD, p.V, p.varlen));
    if (vec4) fwd_recurrent_kernel<KD, true><<<grid, 32 * WARPS, 0, stream>>>(p);
    else fwd_recurrent_kernel<KD, false><<<grid, 32 * WARPS, 0, stream>>>(p);
    return cudaGetLastError();
}

bool aligned4(const void *ptr, int64_t s0, int64_t s1, int64_t s2)
{
    return ((uintptr_t)ptr % 16) == 0 && s0 % 4 == 0 && s1 % 4 == 0 && s2 % 4 == 0;
}

} // namespace

int64_t fqla_fwd_recurrent_ctas(int64_t N, int64_t HV, int64_t K, int64_t V, int varlen)
{
    const int64_t cpw = 32 / (K / RW); /* columns per warp */
    const int64_t warps = N * HV * ((V + cpw - 1) / cpw) + (varlen ? TAIL_WARPS : 0);
    return (warps + WARPS - 1) / WARPS;
}

cudaError_t fqla_fwd_launch_recurrent(const fqla_fwd_params &p, cudaStream_t stream)
{
    /* T = 0 still runs: every chain copies h0 (or zeros) to the final state */
    if (p.N * p.HV == 0) return cudaSuccess;
    const bool vec4 = aligned4(p.q, p.q_sb, p.q_st, p.q_sh) && aligned4(p.k, p.k_sb, p.k_st, p.k_sh);
    switch (p.K) {
    case 64: return launch_kd<64>(p, vec4, stream);
    case 128: return launch_kd<128>(p, vec4, stream);
    case 256: return launch_kd<256>(p, vec4, stream);
    }
    return cudaErrorInvalidValue;
}
