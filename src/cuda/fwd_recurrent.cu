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
 * floor). The state is kept as S = c St with one decay scalar c per warp and
 * o is taken from the updated state (step() below: two dot products a row).
 *
 * One warp per (sequence, value head, CPW value columns): each column's K
 * state rows in fp32 registers, split over LPC = K / RW lanes of RW rows
 * each (CPW = 32 / LPC columns per warp; session 28: 64 rows per lane had
 * left one ~250-register warp alone on its scheduler, its every latency
 * exposed). RW is 16 or 32, picked per launch (pick_rw): a token step
 * costs about the same time at either (~0.6 us, latency-bound at one to
 * four warps a scheduler; session 29), so the launch takes the one that
 * needs fewer waves of CTAs, 16 on a tie. Lane p of a column holds rows
 * 4 LPC j + 4 p + c (j < RW / 4, c < 4), so each of its 16-byte loads of a
 * q / k row is one contiguous 16 LPC bytes across the column's lanes, and
 * the other columns of the warp read the same addresses (broadcasts). The
 * partial sums meet by warp shuffles. Lanes prefetch the inputs of token
 * t + FQLA_REC_PFD into L1. (A second register set loading token t + 1
 * ahead cost more in occupancy than it saved; session 29.)
 * The warps of a CTA are adjacent column groups of one value head: they
 * read the same q / k rows, from L1 after the first. Warps past the chains
 * zero o's rows after the last sequence (varlen). No workspace, no shared
 * memory, no synchronisation.
 */
#include "cuda/fwd_common.cuh"
#include "cuda/fwd_prepare_common.cuh"

namespace {

constexpr int WARPS = 4;       /* per CTA */
constexpr int TAIL_WARPS = 64; /* warps zeroing the rows after the last sequence (varlen) */

/* State / q / k entry 4 j + c of lane part p: row 4 LPC j + 4 p + c. */
template <int LPC>
__device__ __forceinline__ int row_of(int i, int p)
{
    return 4 * LPC * (i >> 2) + 4 * p + (i & 3);
}

/* One token's inputs, as loaded (g and beta not yet finished). */
template <int RW>
struct Token {
    float q[RW], k[RW];
    float v, g, beta;
};

/* The lane's RW entries of a q / k row (src at the lane's first row): RW / 4
 * float4 where the caller's pointers and strides allow (VEC4), else one
 * float at a time. */
template <int RW, int LPC, bool VEC4>
__device__ __forceinline__ void load_rows(const float *src, float (&x)[RW])
{
#pragma unroll
    for (int j = 0; j < RW / 4; j++) {
        if constexpr (VEC4) {
            const float4 f = *reinterpret_cast<const float4 *>(src + 4 * LPC * j);
            x[4 * j] = f.x, x[4 * j + 1] = f.y, x[4 * j + 2] = f.z, x[4 * j + 3] = f.w;
        } else {
#pragma unroll
            for (int c = 0; c < 4; c++) x[4 * j + c] = src[4 * LPC * j + c];
        }
    }
}

#ifndef FQLA_REC_ACC /* partial sums of a lane's dot products (experiment, session 29: 1 or 4) */
#define FQLA_REC_ACC 1
#endif

/* The lane's part of a . b over its RW rows, in FQLA_REC_ACC interleaved
 * partial sums: a chain of RW / ACC dependent FMAs, not RW. */
template <int RW>
__device__ __forceinline__ float lane_dot(const float (&a)[RW], const float (&b)[RW])
{
    constexpr int ACC = FQLA_REC_ACC;
    float part[ACC];
#pragma unroll
    for (int j = 0; j < ACC; j++) part[j] = 0.f;
#pragma unroll
    for (int i = 0; i < RW; i++) part[i % ACC] = fmaf(a[i], b[i], part[i % ACC]);
#pragma unroll
    for (int w = 1; w < ACC; w <<= 1)
#pragma unroll
        for (int j = 0; j + w < ACC; j += 2 * w) part[j] += part[j + w];
    return part[0];
}

/* The sum over the LPC lanes of a column (adjacent lanes). */
template <int LPC>
__device__ __forceinline__ float col_sum(float x)
{
#pragma unroll
    for (int o = 1; o < LPC; o <<= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

/* A chain's token inputs at one token: pointers at the lane's first q / k
 * row, its column of v, and g / beta (fp32 or bf16, as bytes), moved one
 * token on by adding the strides (the token index times five 64-bit strides
 * cost ~30 instructions a token, ~10 % of them; session 28). */
struct Cursor {
    const float *q, *k, *v;
    const unsigned char *g, *b;
    int64_t qs, ks, vs, gs, bs; /* elements for q / k / v, bytes for g / beta */

    __device__ __forceinline__ void advance()
    {
        q += qs, k += ks, v += vs, g += gs, b += bs;
    }
    template <int RW, int LPC, bool VEC4>
    __device__ __forceinline__ void load(const fqla_fwd_params &p, Token<RW> &x) const
    {
        load_rows<RW, LPC, VEC4>(q, x.q);
        load_rows<RW, LPC, VEC4>(k, x.k);
        x.v = *v;
        x.g = p.g_bf16 ? __bfloat162float(*(const __nv_bfloat16 *)g) : *(const float *)g;
        x.beta = p.beta_bf16 ? __bfloat162float(*(const __nv_bfloat16 *)b) : *(const float *)b;
    }
};

#ifndef FQLA_REC_PF /* prefetch of token t + FQLA_REC_PFD: 0 none, 1 into L1, 2 into L2 */
#define FQLA_REC_PF 1
#endif
#ifndef FQLA_REC_PFD
#define FQLA_REC_PFD 16 /* session 29: x0.91 of 8's time on one sequence (35B TP1 1x8192) */
#endif

/* One 128-byte line of a token's inputs per lane, FQLA_REC_PFD tokens ahead
 * of the register loads: the q and k rows' K / 32 lines each, the warp's
 * v columns, g, beta (19 lanes at K = 256). A register load one token ahead
 * covers L2's latency but not HBM's (~1 k cycles a token; session 28). */
struct Prefetch {
    const unsigned char *ptr;
    int64_t step;

    __device__ __forceinline__ void issue(bool in_range)
    {
        if (FQLA_REC_PF && ptr && in_range) {
            if (FQLA_REC_PF == 1) asm volatile("prefetch.global.L1 [%0];" ::"l"(__cvta_generic_to_global(ptr)));
            else asm volatile("prefetch.global.L2 [%0];" ::"l"(__cvta_generic_to_global(ptr)));
        }
        ptr += step;
    }
};

/* Below this the decay scalar c is folded into the lane's rows. */
#define FQLA_REC_RENORM 2.3283064e-10f /* 2^-32 */

/* The lane's part of its column's state: S = c St. The decay multiplies
 * one scalar per token instead of every row (c is the same in every lane
 * of the warp: one value head, the same g); it is folded into St only when
 * it falls below FQLA_REC_RENORM, so St stays within 2^32 of S. c only
 * falls: the API's g is <= 0 (flashqla.h); a positive gate summing past ~88
 * would overflow c to inf. */
template <int RW>
struct State {
    float St[RW];
    float c;
};

/* One token of the recurrence on the lane's rows; returns the column's o
 * (valid in every lane of the column). With S' = e^g S + k^ u^T:
 *
 *     u = beta (v - c' rk (k . St)),  St' = St + k (rk u / c'),  o = scale rq c' (q . St'),
 *
 * c' = c e^g: two dot products a row, the second (the output) off the
 * chain from token to token. */
template <int RW, int LPC, bool L2N>
__device__ __forceinline__ float step(const fqla_fwd_params &p, int hv, const Token<RW> &x, State<RW> &s)
{
    float g = x.g, beta = x.beta;
    finish_gate_beta(p, hv, g, beta);
    float d = lane_dot<RW>(x.k, s.St), kk = 0.f, qq = 0.f;
    if constexpr (L2N) kk = lane_dot<RW>(x.k, x.k), qq = lane_dot<RW>(x.q, x.q);
    d = col_sum<LPC>(d);
    float rk = 1.f, rq = 1.f;
    if constexpr (L2N) {
        rk = rsqrtf(col_sum<LPC>(kk) + 1e-6f);
        rq = rsqrtf(col_sum<LPC>(qq) + 1e-6f);
    }
    float c = s.c * expf(g);
    const float u = beta * (x.v - c * rk * d);
    if (c < FQLA_REC_RENORM) { /* the same in every lane of the warp */
#pragma unroll
        for (int i = 0; i < RW; i++) s.St[i] *= c;
        c = 1.f;
    }
    const float ku = rk * u * __frcp_rn(c);
#pragma unroll
    for (int i = 0; i < RW; i++) s.St[i] = fmaf(x.k[i], ku, s.St[i]);
    s.c = c;
    return p.scale * rq * c * col_sum<LPC>(lane_dot<RW>(x.q, s.St));
}

template <int KD, int RW, bool VEC4, bool L2N>
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

    int64_t batch, start, len, slot0;
    fqla_fwd_seq(p, n, batch, start, len, slot0);

    State<RW> S;
    S.c = 1.f;
#pragma unroll
    for (int i = 0; i < RW; i++) {
        S.St[i] = 0.f;
        if (p.h0) {
            const int64_t off =
                fqla_fwd_state_off(n, hv, row_of<LPC>(i, part), vc, p.h0_sn, p.h0_sh, p.h0_s2, p.v_first);
            S.St[i] = p.h0_bf16 ? __bfloat162float(((const __nv_bfloat16 *)p.h0)[off]) : ((const float *)p.h0)[off];
        }
    }

    const size_t gb = p.g_bf16 ? 2 : 4, bb = p.beta_bf16 ? 2 : 4;
    const float *qrow = (const float *)p.q + batch * p.q_sb + start * p.q_st + hq * p.q_sh;
    const float *krow = (const float *)p.k + batch * p.k_sb + start * p.k_st + hq * p.k_sh;
    const float *vrow = (const float *)p.v + batch * p.v_sb + start * p.v_st + hv * p.v_sh + slice * CPW;
    Cursor cur;
    cur.q = qrow + 4 * part, cur.k = krow + 4 * part, cur.v = vrow + (vc - slice * CPW);
    cur.g = (const unsigned char *)p.g + (batch * p.g_sb + start * p.g_st + hv * p.g_sh) * gb;
    cur.b = (const unsigned char *)p.beta + (batch * p.b_sb + start * p.b_st + hv * p.b_sh) * bb;
    cur.qs = p.q_st, cur.ks = p.k_st, cur.vs = p.v_st, cur.gs = p.g_st * gb, cur.bs = p.b_st * bb;

    /* this lane's prefetch line (KL lines per q / k row) */
    constexpr int KL = KD / 32;
    Prefetch pf = {nullptr, 0};
    if (lane < KL) pf = {(const unsigned char *)(qrow + 32 * lane), p.q_st * 4};
    else if (lane < 2 * KL) pf = {(const unsigned char *)(krow + 32 * (lane - KL)), p.k_st * 4};
    else if (lane == 2 * KL) pf = {(const unsigned char *)vrow, p.v_st * 4};
    else if (lane == 2 * KL + 1) pf = {cur.g, cur.gs};
    else if (lane == 2 * KL + 2) pf = {cur.b, cur.bs};
    if (pf.ptr) pf.ptr += FQLA_REC_PFD * pf.step;
    float *ob = (float *)p.o + batch * p.o_sb + start * p.o_st + hv * p.o_sh + vc;
    const bool writer = col && part == 0;

    /* the L1 prefetch FQLA_REC_PFD tokens ahead covers the loads' trip */
    for (int64_t t = start, last = start + len - 1; t <= last; t++) {
        pf.issue(t + FQLA_REC_PFD <= last);
        Token<RW> x;
        cur.load<RW, LPC, VEC4>(p, x);
        const float o = step<RW, LPC, L2N>(p, hv, x, S);
        if (writer) *ob = o;
        ob += p.o_st;
        cur.advance();
    }

    if (p.ht && col) {
#pragma unroll
        for (int i = 0; i < RW; i++) {
            const int64_t off =
                fqla_fwd_state_off(n, hv, row_of<LPC>(i, part), v, p.ht_sn, p.ht_sh, p.ht_s2, p.ht_v_first);
            const float x = S.c * S.St[i];
            if (p.ht_bf16) ((__nv_bfloat16 *)p.ht)[off] = __float2bfloat16_rn(x);
            else ((float *)p.ht)[off] = x;
        }
    }
}

/* CTAs for N x HV chains of V columns at head dim K, RW rows a lane (+ the
 * tail warps of varlen calls). */
int64_t ctas_of(int64_t N, int64_t HV, int64_t K, int64_t V, int rw, bool tail)
{
    const int64_t cpw = 32 / (K / rw); /* columns per warp */
    const int64_t warps = N * HV * ((V + cpw - 1) / cpw) + (tail ? TAIL_WARPS : 0);
    return (warps + WARPS - 1) / WARPS;
}

template <int KD, int RW>
cudaError_t launch_rw(const fqla_fwd_params &p, bool vec4, cudaStream_t stream)
{
    const dim3 grid((unsigned)ctas_of(p.N, p.HV, KD, p.V, RW, p.varlen));
    if (vec4 && p.l2norm) fwd_recurrent_kernel<KD, RW, true, true><<<grid, 32 * WARPS, 0, stream>>>(p);
    else if (vec4) fwd_recurrent_kernel<KD, RW, true, false><<<grid, 32 * WARPS, 0, stream>>>(p);
    else if (p.l2norm) fwd_recurrent_kernel<KD, RW, false, true><<<grid, 32 * WARPS, 0, stream>>>(p);
    else fwd_recurrent_kernel<KD, RW, false, false><<<grid, 32 * WARPS, 0, stream>>>(p);
    return cudaGetLastError();
}

/* CTAs of fwd_recurrent_kernel<KD, RW> resident on one SM (registers bound
 * it: ~110 a thread at RW = 16, ~170 at 32; no shared memory). Asked once
 * per kernel; the L2N / VEC4 forms differ by a few registers, so the plain
 * one stands for them. */
template <int KD, int RW>
int resident_ctas()
{
    static const int n = [] {
        int r = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&r, fwd_recurrent_kernel<KD, RW, true, false>, 32 * WARPS,
                                                          0) != cudaSuccess)
            r = 0;
        return r;
    }();
    return n;
}

/* The whole recurrence runs in one wave of CTAs at a time, each token step
 * ~0.6 us at either width (session 29: 35B TP1 1x8192 one wave 5.06 /
 * 5.27 ms at 16 / 32 rows; 27B TP2 2048x4 two waves at 16 rows 2.58 ms,
 * one at 32 rows 1.40 ms). So: the width with fewer waves, 16 on a tie. */
int g_force_rw = 0; /* fqla_cuda_fwd_tune_recurrent */

template <int KD>
cudaError_t launch_kd(const fqla_fwd_params &p, bool vec4, int sms, cudaStream_t stream)
{
    if (g_force_rw == 16) return launch_rw<KD, 16>(p, vec4, stream);
    if (g_force_rw == 32) return launch_rw<KD, 32>(p, vec4, stream);
    const int64_t r16 = (int64_t)resident_ctas<KD, 16>() * sms, r32 = (int64_t)resident_ctas<KD, 32>() * sms;
    if (r16 > 0 && r32 > 0) {
        const int64_t c16 = ctas_of(p.N, p.HV, KD, p.V, 16, false), c32 = ctas_of(p.N, p.HV, KD, p.V, 32, false);
        if ((c32 + r32 - 1) / r32 < (c16 + r16 - 1) / r16) return launch_rw<KD, 32>(p, vec4, stream);
    }
    return launch_rw<KD, 16>(p, vec4, stream);
}

bool aligned4(const void *ptr, int64_t s0, int64_t s1, int64_t s2)
{
    return ((uintptr_t)ptr % 16) == 0 && s0 % 4 == 0 && s1 % 4 == 0 && s2 % 4 == 0;
}

} // namespace

/* A hook like fwd.cu's fqla_cuda_fwd_tune_*, for the tests and the
 * benchmark: state rows a lane of the fp32 recurrence (16 or 32; 0, the
 * default, picks by the waves). */
extern "C" void fqla_cuda_fwd_tune_recurrent(int rows)
{
    g_force_rw = rows == 16 || rows == 32 ? rows : 0;
}

int64_t fqla_fwd_recurrent_ctas(int64_t N, int64_t HV, int64_t K, int64_t V, int varlen)
{
    return ctas_of(N, HV, K, V, 16, varlen); /* the most CTAs either width launches */
}

cudaError_t fqla_fwd_launch_recurrent(const fqla_fwd_params &p, int sms, cudaStream_t stream)
{
    /* T = 0 still runs: every chain copies h0 (or zeros) to the final state */
    if (p.N * p.HV == 0) return cudaSuccess;
    const bool vec4 = aligned4(p.q, p.q_sb, p.q_st, p.q_sh) && aligned4(p.k, p.k_sb, p.k_st, p.k_sh);
    switch (p.K) {
    case 64: return launch_kd<64>(p, vec4, sms, stream);
    case 128: return launch_kd<128>(p, vec4, sms, stream);
    case 256: return launch_kd<256>(p, vec4, sms, stream);
    }
    return cudaErrorInvalidValue;
}
