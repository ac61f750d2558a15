/*
 * fwd_prepare_common.cuh - the prepare kernel's (fwd_prepare.cu) building
 * blocks that do not depend on its CTA's layout: the gate and beta loads
 * with the in-kernel options, the varlen slot search, the zeroing of o past
 * the last sequence, and fp32 products on tensor cores (tf32 parts).
 */
#pragma once
#include "cuda/fwd_common.cuh"

#include <cuda_bf16.h>

#include "cuda/kernel/io.cuh"
#include "cuda/ptx/misc.cuh"
#include "cuda/ptx/mma_sync.cuh"

namespace {

__device__ __forceinline__ float load_gate(const void *p, int bf16, int64_t off)
{
    if (bf16) return __bfloat162float(((const __nv_bfloat16 *)p)[off]);
    return ((const float *)p)[off];
}

/* log(1 + e^x) without overflow (the CPU reference's form). */
__device__ __forceinline__ float softplus_f(float x)
{
    return x > 0.f ? x + log1pf(expf(-x)) : log1pf(expf(x));
}
__device__ __forceinline__ float sigmoid_f(float x)
{
    if (x >= 0.f) return 1.f / (1.f + expf(-x));
    float e = expf(x);
    return e / (1.f + e);
}

/* Rows i = lane, lane + 32 of a chunk (t0, nvalid valid rows) of value
 * head hv: the stored gate and beta, 0 past the end. Issued before the
 * chunk's K copies: behind them the loads waited ~11 k cycles. */
__device__ __forceinline__ void load_gate_beta(const fqla_fwd_params &p, int64_t batch, int64_t t0, int nvalid, int hv,
                                               int lane, float (&g)[2], float (&b)[2])
{
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int64_t tt = t0 + lane + 32 * h;
        const bool ok = lane + 32 * h < nvalid;
        g[h] = ok ? load_gate(p.g, p.g_bf16, batch * p.g_sb + tt * p.g_st + hv * p.g_sh) : 0.f;
        b[h] = ok ? load_gate(p.beta, p.beta_bf16, batch * p.b_sb + tt * p.b_st + hv * p.b_sh) : 0.f;
    }
}
/* The floor of a token's log decay. Every decay factor over a span that
 * holds such a token is then at most e^-100, which fp32 (flushed to zero)
 * reads as 0, as it reads the true factor; a g of -inf (a reset) would
 * instead make gamma_i - gamma_j = -inf - -inf = NaN in Gamma and in the
 * token factors of every later row of the chunk. The tokens after it keep
 * their differences of gamma, rounded at gamma's magnitude (~100, as a
 * strong decay's ~1300 already is). NaN stays NaN. */
#define FQLA_FWD_G_FLOOR (-100.f)

/* A stored gate and beta of value head hv to the log decay (g, or
 * -exp(A_log) softplus(g + dt_bias) with the in-kernel gate; at least
 * FQLA_FWD_G_FLOOR) and beta (optionally sigmoid, times 2 with negative
 * eigenvalues allowed). */
__device__ __forceinline__ void finish_gate_beta(const fqla_fwd_params &p, int hv, float &g, float &b)
{
    if (p.gate_in_kernel) g = -expf(p.A_log[hv * p.alog_s]) * softplus_f(g + p.dt_bias[hv * p.dtb_s]);
    if (g < FQLA_FWD_G_FLOOR) g = FQLA_FWD_G_FLOOR;
    if (p.beta_sigmoid) {
        b = sigmoid_f(b);
        if (p.neg_eig) b *= 2.f;
    }
}

/* Finds the chunk of slot s (varlen) and its sequence's first token and
 * length: the sequence is the largest n with base(n) = cu[n] / 64 + n <= s.
 * Returns 0 when the slot holds no chunk. */
__device__ int find_slot(const fqla_fwd_params &p, int64_t s, int64_t &c_out, int64_t &start_out, int64_t &len_out)
{
    int64_t lo, start, len;
    if (p.N < 32) {
        /* one round of loads: lane j holds cu[j]; the bases are strictly
         * increasing in j, so the sequence is the count of those <= s, less
         * one (the binary search below takes log2 N + 1 dependent rounds of
         * L2 latency, ~1 k cycles each under the kernel's load) */
        const int lane = threadIdx.x & 31;
        const int64_t cu = lane <= p.N ? fqla_fwd_cu(p, lane) : 0;
        const unsigned below = __ballot_sync(0xffffffffu, lane < p.N && cu / FQLA_FWD_CHUNK + lane <= s);
        lo = __popc(below) - 1;
        if (lo < 0) lo = 0; /* s below base(0) = 0 cannot happen; kept safe */
        start = __shfl_sync(0xffffffffu, cu, (int)lo);
        len = __shfl_sync(0xffffffffu, cu, (int)lo + 1) - start;
    } else {
        int64_t hi = p.N - 1;
        lo = 0;
        while (lo < hi) {
            int64_t mid = (lo + hi + 1) >> 1;
            if (fqla_fwd_cu(p, mid) / FQLA_FWD_CHUNK + mid <= s) lo = mid;
            else hi = mid - 1;
        }
        start = fqla_fwd_cu(p, lo);
        len = fqla_fwd_cu(p, lo + 1) - start;
    }
    const int64_t base = start / FQLA_FWD_CHUNK + lo;
    if (base > s) return 0;
    const int64_t c = s - base;
    if (c * FQLA_FWD_CHUNK >= len) return 0;
    c_out = c;
    start_out = start;
    len_out = len;
    return 1;
}

/* Zeroes o rows [64 tb, 64 tb + 64) past cu[N]: 2-byte o by 16-byte stores
 * (its rows 16-byte aligned on the routes that call this with them), fp32 o
 * (the fp32 chain route's prepare kernel, bwd_prepare.cu) element by
 * element, its rows' alignment not required there. */
template <typename T>
__device__ __forceinline__ void zero_tail(const fqla_fwd_params &p, int64_t tb)
{
    if (!p.o) return; /* the final state alone: no o */
    const int64_t end = fqla_fwd_cu(p, p.N);
    if ((tb + 1) * FQLA_FWD_CHUNK <= end) return; /* every row of the block is in a sequence */
    constexpr int VEC = sizeof(T) == 2 ? 8 : 1; /* elements a store */
    const int vec_per_head = p.V / VEC;
    const int per_row = p.HV * vec_per_head;
    for (int idx = threadIdx.x; idx < FQLA_FWD_CHUNK * per_row; idx += blockDim.x) {
        int64_t t = tb * FQLA_FWD_CHUNK + idx / per_row;
        if (t < end || t >= p.T) continue;
        int r = idx % per_row;
        int h = r / vec_per_head, cv = r % vec_per_head;
        T *dst = (T *)p.o + t * p.o_st + h * p.o_sh + cv * VEC;
        if constexpr (VEC == 8) *reinterpret_cast<uint4 *>(dst) = make_uint4(0, 0, 0, 0);
        else *dst = T(0);
    }
}
/* tf32 operand: round to nearest (ties away), the 13 low bits cleared. */
__device__ __forceinline__ uint32_t to_tf32(float x)
{
    return fqla_cvt_rna_tf32(x) & 0xffffe000u;
}

/* An fp32 operand as tf32 parts. PREC 3 (3xTF32): fqla_tf32_split3. PREC 1:
 * big = x rounded to tf32. */
template <int PREC>
__device__ __forceinline__ void split_tf32(float x, uint32_t &big, uint32_t &small)
{
    if (PREC == 3) {
        fqla_tf32_split3(x, big, small);
    } else {
        big = to_tf32(x);
        small = 0u;
    }
}
template <int PREC>
struct tf32_a {
    uint32_t big[4], small[4];
    /* from fp32 values in A fragment order */
    __device__ __forceinline__ tf32_a(float a0, float a1, float a2, float a3)
    {
        split_tf32<PREC>(a0, big[0], small[0]);
        split_tf32<PREC>(a1, big[1], small[1]);
        split_tf32<PREC>(a2, big[2], small[2]);
        split_tf32<PREC>(a3, big[3], small[3]);
    }
};

/* d += A B for one m16n8k8 step (A fragment split once per k-step, B
 * fragment b0, b1 fp32). PREC 3: the small products first, small x small
 * dropped: about fp32 accuracy. PREC 1: plain tf32. */
template <int PREC>
__device__ __forceinline__ void mma_f32(float (&d)[4], const tf32_a<PREC> &a, float b0, float b1)
{
    uint32_t bb0, bb1, bs0, bs1;
    split_tf32<PREC>(b0, bb0, bs0);
    split_tf32<PREC>(b1, bb1, bs1);
    if (PREC == 3) {
        fqla_mma_tf32(d, a.small, bb0, bb1);
        fqla_mma_tf32(d, a.big, bs0, bs1);
    }
    fqla_mma_tf32(d, a.big, bb0, bb1);
}

} // namespace
