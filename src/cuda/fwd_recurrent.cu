/*
 * fwd_recurrent.cu - the CUDA forward for fp32 q/k/v: the recurrence token by
 * token in fp32 on CUDA cores, the slower path the chunked kernels' bf16 /
 * fp16 tensor-core products cannot serve at fp32 accuracy (the tests ask
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
 * each (CPW = 32 / LPC columns per warp). Lane p of a column holds rows
 * 4 LPC j + 4 p + c (j < RW / 4, c < 4). RW is 32, or 16 where that
 * needs fewer waves of CTAs (launch_kd): the whole recurrence of a chain
 * runs in one CTA, so the time is about T x the waves x the step time.
 *
 * The step is latency-bound (ncu: ~155 instructions a token at
 * one issue every ~7 cycles of a warp; two warps a scheduler). Its inputs
 * therefore come ahead of it: each warp copies the q and k rows of token
 * t + RING - 1 into its shared-memory ring by cp.async while it works on
 * token t (a register load of token t had stalled the first FMA ~400
 * cycles a token), and loads v, g and beta one token ahead into registers
 * (now 215 instructions a token at one issue every ~4.5 cycles). A step
 * pipelined by one token (q_t . St formed with k_t+1 . St, one round of
 * shuffles) measured x1.2-1.5 slower, with four or eight slots.
 * k is read from the ring for the first dot product and the update, q only
 * after the update, so neither row holds registers across the step. The
 * warps of a CTA are adjacent column groups of one value head (the same q
 * / k rows: the second copy hits L2). Warps past the chains zero o's rows
 * after the last sequence (varlen). No workspace, no block-wide
 * synchronisation.
 */
#include "cuda/fwd_common.cuh"
#include "cuda/fwd_prepare_common.cuh"
#include "cuda/kernel/pipeline.cuh"
#include "cuda/ptx/cp_async.cuh"

namespace {

constexpr int WARPS = 4;       /* per CTA */
constexpr int TAIL_WARPS = 64; /* warps zeroing the rows after the last sequence (varlen) */
constexpr int RING = 4;        /* tokens of q / k rows in a warp's ring: 3 in flight while one is used */
static_assert((RING & (RING - 1)) == 0, "RING: a power of two (slots by mask)");

/* State / q / k entry 4 j + c of lane part p: row 4 LPC j + 4 p + c. */
template <int LPC>
__device__ __forceinline__ int row_of(int i, int p)
{
    return 4 * LPC * (i >> 2) + 4 * p + (i & 3);
}

/* The lane's RW entries of a q / k row in shared memory: RW / 4 float4,
 * lane part p's at float4 LPC j + p (the column's lanes read adjacent 16
 * bytes; the warp's other columns read the same ones: broadcasts). */
template <int RW, int LPC>
__device__ __forceinline__ void read_rows(const float *row, int part, float (&x)[RW])
{
#pragma unroll
    for (int j = 0; j < RW / 4; j++) {
        const float4 f = reinterpret_cast<const float4 *>(row)[LPC * j + part];
        x[4 * j] = f.x, x[4 * j + 1] = f.y, x[4 * j + 2] = f.z, x[4 * j + 3] = f.w;
    }
}

/* The lane's part of a . b over its RW rows, in four interleaved partial
 * sums: a chain of RW / 4 dependent FMAs, not RW (x0.96 of the time on one
 * sequence, H200). */
template <int RW>
__device__ __forceinline__ float lane_dot(const float (&a)[RW], const float (&b)[RW])
{
    float part[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int i = 0; i < RW; i++) part[i % 4] = fmaf(a[i], b[i], part[i % 4]);
    return (part[0] + part[1]) + (part[2] + part[3]);
}

/* The sum over the LPC lanes of a column (adjacent lanes). */
template <int LPC>
__device__ __forceinline__ float col_sum(float x)
{
#pragma unroll
    for (int o = 1; o < LPC; o <<= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

/* The warp's copier of q / k rows into its ring: pointers at a token's
 * rows, moved one token on by the strides. Each lane copies K / 64 of the
 * rows' 16-byte pieces (VEC4), else K / 16 floats. */
template <int KD, bool VEC4>
struct Stager {
    const float *q, *k;
    int64_t qs, ks;

    __device__ __forceinline__ void stage(float *slot, int lane, bool in_range)
    {
        if (in_range) {
            if constexpr (VEC4) {
#pragma unroll
                for (int c = lane; c < KD / 2; c += 32) { /* piece c: q's (c < K / 4), else k's */
                    const int row = c / (KD / 4), off = 4 * (c % (KD / 4));
                    fqla_cp_async16(slot + row * KD + off, (row ? k : q) + off, 16);
                }
            } else {
#pragma unroll
                for (int c = lane; c < 2 * KD; c += 32) fqla_cp_async4(slot + c, (c < KD ? q + c : k + (c - KD)));
            }
        }
        fqla_cp_async_commit(); /* an empty group past the end keeps the count */
        q += qs, k += ks;
    }
};

/* The lane's v (its column) and the warp's g and beta, one token ahead. */
struct Scalars {
    const float *v;
    const unsigned char *g, *b; /* fp32 or bf16, as bytes */
    int64_t vs, gs, bs;         /* elements for v, bytes for g / beta */

    __device__ __forceinline__ void load(const fqla_fwd_params &p, float &vx, float &gx, float &bx)
    {
        vx = *v;
        gx = load_gate(g, p.g_bf16, 0);
        bx = load_gate(b, p.beta_bf16, 0);
        v += vs, g += gs, b += bs;
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

/* One token of the recurrence on the lane's rows, q and k read from the
 * ring slot; returns the column's o (valid in every lane of the column).
 * With S' = e^g S + k^ u^T:
 *
 *     u = beta (v - c' rk (k . St)),  St' = St + k (rk u / c'),  o = scale rq c' (q . St'),
 *
 * c' = c e^g: two dot products a row, the second (the output) off the
 * chain from token to token. */
template <int KD, int RW, int LPC, bool L2N>
__device__ __forceinline__ float step(const fqla_fwd_params &p, int hv, const float *slot, int part, float v,
                                      float g, float beta, State<RW> &s)
{
    finish_gate_beta(p, hv, g, beta);
    float x[RW];
    read_rows<RW, LPC>(slot + KD, part, x); /* k */
    float d = lane_dot<RW>(x, s.St), rk = 1.f;
    if constexpr (L2N) rk = lane_dot<RW>(x, x);
    d = col_sum<LPC>(d);
    if constexpr (L2N) rk = rsqrtf(col_sum<LPC>(rk) + 1e-6f);
    float c = s.c * expf(g);
    const float u = beta * (v - c * rk * d);
    if (c < FQLA_REC_RENORM) { /* the same in every lane of the warp */
#pragma unroll
        for (int i = 0; i < RW; i++) s.St[i] *= c;
        c = 1.f;
    }
    /* c >= 2^-32 here: the approximate reciprocal is within 2 ulp, without
     * __frcp_rn's branch to its slow path */
    const float ku = rk * u * __fdividef(1.f, c);
#pragma unroll
    for (int i = 0; i < RW; i++) s.St[i] = fmaf(x[i], ku, s.St[i]);
    s.c = c;
    read_rows<RW, LPC>(slot, part, x); /* q */
    float e = lane_dot<RW>(x, s.St), rq = 1.f;
    if constexpr (L2N) rq = lane_dot<RW>(x, x);
    e = col_sum<LPC>(e);
    if constexpr (L2N) rq = rsqrtf(col_sum<LPC>(rq) + 1e-6f);
    return p.scale * rq * c * e;
}

template <int KD, int RW, bool VEC4, bool L2N>
__global__ void __launch_bounds__(32 * WARPS) fwd_recurrent_kernel(const __grid_constant__ fqla_fwd_params p)
{
    constexpr int LPC = KD / RW, CPW = 32 / LPC;
    FQLA_SHARED __align__(16) float ring[WARPS][RING][2][KD]; /* per warp, per token: the q row, the k row */
    const int lane = threadIdx.x & 31;
    const int64_t w = (int64_t)blockIdx.x * WARPS + (threadIdx.x >> 5);
    const int slices = (p.V + CPW - 1) / CPW;
    const int64_t chains = p.N * p.HV * slices;
    if (w >= chains) {
        /* o's rows after the last sequence (varlen): exact zeros (none
         * without o: the final state alone) */
        if (!p.varlen || !p.o) return;
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
    float(*my)[2][KD] = ring[threadIdx.x >> 5];

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
    Stager<KD, VEC4> rows;
    rows.q = (const float *)p.q + batch * p.q_sb + start * p.q_st + hq * p.q_sh;
    rows.k = (const float *)p.k + batch * p.k_sb + start * p.k_st + hq * p.k_sh;
    rows.qs = p.q_st, rows.ks = p.k_st;
    Scalars sc;
    sc.v = (const float *)p.v + batch * p.v_sb + start * p.v_st + hv * p.v_sh + vc;
    sc.g = (const unsigned char *)p.g + (batch * p.g_sb + start * p.g_st + hv * p.g_sh) * gb;
    sc.b = (const unsigned char *)p.beta + (batch * p.b_sb + start * p.b_st + hv * p.b_sh) * bb;
    sc.vs = p.v_st, sc.gs = p.g_st * gb, sc.bs = p.b_st * bb;
    float *ob = (float *)p.o + batch * p.o_sb + start * p.o_st + hv * p.o_sh + vc;
    const bool writer = col && part == 0 && p.o; /* no o: the final state alone */

    /* the ring: tokens 0 .. RING - 2 in flight before the loop; at token t
     * the copy of token t + RING - 1 goes into the slot token t - 1 used */
#pragma unroll
    for (int i = 0; i < RING - 1; i++) rows.stage(&my[i][0][0], lane, i < len);
    float vx = 0.f, gx = 0.f, bx = 0.f;
    if (len > 0) sc.load(p, vx, gx, bx);
    for (int64_t t = 0; t < len; t++) {
        const int slot = fqla_pipe<RING>::at(t).stage;
        rows.stage(&my[(slot + RING - 1) & (RING - 1)][0][0], lane, t + RING - 1 < len);
        const float vt = vx, gt = gx, bt = bx;
        if (t + 1 < len) sc.load(p, vx, gx, bx);
        fqla_cp_async_wait<RING - 1>(); /* this lane's copies of token t */
        __syncwarp();                   /* and every lane's */
        const float o = step<KD, RW, LPC, L2N>(p, hv, &my[slot][0][0], part, vt, gt, bt, S);
        if (writer) *ob = o;
        ob += p.o_st;
        __syncwarp(); /* every lane has read the slot before token t + 1 refills it */
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
    const dim3 block(32 * WARPS);
    if (vec4 && p.l2norm) return fqla_launch(fwd_recurrent_kernel<KD, RW, true, true>, grid, block, 0, stream, 0, p);
    if (vec4) return fqla_launch(fwd_recurrent_kernel<KD, RW, true, false>, grid, block, 0, stream, 0, p);
    if (p.l2norm) return fqla_launch(fwd_recurrent_kernel<KD, RW, false, true>, grid, block, 0, stream, 0, p);
    return fqla_launch(fwd_recurrent_kernel<KD, RW, false, false>, grid, block, 0, stream, 0, p);
}

/* CTAs of fwd_recurrent_kernel<KD, RW> resident on one SM (registers bound
 * it: 72-96 a thread at RW = 16, 128 at 32; the ring is 8-32 KB a CTA).
 * Asked once per kernel; the L2N / VEC4 forms differ by a few registers,
 * so the plain one stands for them. */
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

/* The time is about T x the waves of CTAs x the step time, and a step
 * takes about as long at either width (measured on the H200, one wave: 35B TP1
 * 1x8192 4.27 / 4.46 ms at 32 / 16 rows, 397B TP8 1x32768 16.45 /
 * 16.79). So: the width with fewer waves, 32 on a tie. (At K = 128, four
 * CTAs an SM hold 128 value columns at 32 rows, seven 112 at 16: 16 does
 * not need fewer waves with today's register counts, but the occupancy is
 * asked, not assumed.) rows = 16 or 32 forces that width. */
template <int KD>
cudaError_t launch_kd(const fqla_fwd_params &p, bool vec4, int sms, int rows, cudaStream_t stream)
{
    if (rows == 16) return launch_rw<KD, 16>(p, vec4, stream);
    if (rows == 32) return launch_rw<KD, 32>(p, vec4, stream);
    const int64_t r16 = (int64_t)resident_ctas<KD, 16>() * sms, r32 = (int64_t)resident_ctas<KD, 32>() * sms;
    if (r16 > 0 && r32 > 0) {
        const int64_t c16 = ctas_of(p.N, p.HV, KD, p.V, 16, false), c32 = ctas_of(p.N, p.HV, KD, p.V, 32, false);
        if ((c16 + r16 - 1) / r16 < (c32 + r32 - 1) / r32) return launch_rw<KD, 16>(p, vec4, stream);
    }
    return launch_rw<KD, 32>(p, vec4, stream);
}

bool aligned4(const void *ptr, int64_t s0, int64_t s1, int64_t s2)
{
    return ((uintptr_t)ptr % 16) == 0 && s0 % 4 == 0 && s1 % 4 == 0 && s2 % 4 == 0;
}

} // namespace

int64_t fqla_fwd_recurrent_ctas(int64_t N, int64_t HV, int64_t K, int64_t V, int varlen)
{
    return ctas_of(N, HV, K, V, 16, varlen); /* the most CTAs either width launches */
}

cudaError_t fqla_fwd_launch_recurrent(const fqla_fwd_params &p, int sms, int rows, cudaStream_t stream)
{
    /* T = 0 still runs: every chain copies h0 (or zeros) to the final state */
    if (p.N * p.HV == 0) return cudaSuccess;
    const bool vec4 = aligned4(p.q, p.q_sb, p.q_st, p.q_sh) && aligned4(p.k, p.k_sb, p.k_st, p.k_sh);
    switch (p.K) {
    case 64: return launch_kd<64>(p, vec4, sms, rows, stream);
    case 128: return launch_kd<128>(p, vec4, sms, rows, stream);
    case 256: return launch_kd<256>(p, vec4, sms, rows, stream);
    }
    return cudaErrorInvalidValue;
}
