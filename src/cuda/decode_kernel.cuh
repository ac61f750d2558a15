/*
 * decode_kernel.cuh - the CUDA decode / multi-token verify kernel on a state
 * pool: for each sequence b and value head h, T tokens of
 *
 *     S <- exp(g) S;  u = beta (v - S^T k);  S <- S + k u^T;  o = S^T (scale q)
 *
 * starting from state_pool[slots[b], h], with the state written back to the
 * pool (decode), to step_states[b, t, h] or to state_pool[step_slots[b, t], h]
 * (verify) after each token.
 *
 * Decode is memory-bound: the state is read and written once per token and
 * everything else is a few hundred bytes. So the design is about bytes in
 * flight and nothing else:
 *   - one warp owns a (b, h, V-slice of WV columns) tile with all K rows, so
 *     both K-reductions (S^T k and S^T q) are register sums plus a few warp
 *     shuffles: no shared memory, no __syncthreads, warps run independently;
 *   - each lane holds K * WV / 32 state elements (64 at the default WV),
 *     loaded with 16-byte vector loads, all issued before the first use;
 *   - both reductions use the state before the token, which is exact:
 *         S^T k_hat   = exp(g) rk (S_old^T k)
 *         o           = scale (exp(g) rq (S_old^T q) + (q_hat . k_hat) u)
 *     so one reduction round serves u and o, and the l2norm factors rk, rq
 *     are folded into scalars instead of rescaling q and k;
 *   - small batches use a narrower WV (more warps) to spread the state over
 *     all SMs: latency, not bandwidth, bounds them.
 *
 * Lane layouts (VEC = 16 bytes / state element size):
 *   [K, V] state (V contiguous): LC = WV / VEC lanes across the slice, LR =
 *     32 / LC lanes down K; lane (lr, lc) holds rows lr*RK .. lr*RK+RK-1
 *     (RK = K / LR) x VEC columns. The K-sum is over the lr lane bits.
 *   [V, K] state (K contiguous): 8 lanes across K, each holding CK chunks of
 *     VEC elements (chunk c at k = (c * 8 + lc) * VEC), 4 lanes down the
 *     slice, each holding RV = WV / 4 rows. The K-sum is over the lc bits.
 *
 * K split (KS > 1, [K, V] only): a group of KS adjacent warps of one CTA
 * shares a (b, h, V-slice) tile of WV = 128 bytes per row, warp kp holding
 * rows kp * K / KS .. (kp + 1) * K / KS - 1. Every warp instruction then
 * touches whole 128-byte row segments (as in [V, K]) instead of 32- or
 * 64-byte ones. The K-sums are finished through shared memory: after the
 * warp's shuffles, each warp writes its partial S^T k, S^T q (WV each) and
 * |k|^2, |q|^2, q.k, the group meets at a named barrier, and every warp adds
 * the KS partials in the same order (so all of them compute the same u).
 * Double-buffered by token parity: one barrier per token.
 *
 * Programmatic dependent launch: the kernel waits (griddepcontrol.wait)
 * before its first global memory access, so it may be launched while the
 * previous kernel of the stream is still running (the launcher sets the
 * attribute when asked); without the attribute the wait is a no-op.
 *
 * L2 prefetch before the wait (p.prefetch, under PDL, chosen by the host
 * from the call's size): while the previous kernel still runs, each warp
 * reads its slot and issues prefetch.global.L2 for its state tile and
 * token-0 input rows. A prefetch
 * only moves lines into L2, which is the GPU's point of coherence, so it can
 * never make a later load see stale data: if the previous kernel writes
 * those lines (or the slot itself) after the prefetch, the loads after the
 * wait still see its writes, and the prefetch was merely wasted. What it
 * buys is the DRAM latency of the two dependent trips (inputs and slot, then
 * the state), which is most of a small call.
 */
#ifndef FQLA_CUDA_DECODE_KERNEL_CUH
#define FQLA_CUDA_DECODE_KERNEL_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include "cuda/kernel/named_barrier.cuh"
#include "cuda/ptx/misc.cuh"
#include "cuda/ptx/pdl.cuh"

/* Named barriers (kernel/named_barrier.cuh; 0 is the CTA's __syncthreads) */
enum class dec_bar : uint32_t {
    xch = 1, /* + g: the KS warps of exchange group g (warp / KS) */
};

/* most warps per CTA of a K-split group exchange (= the launch bound / 32) */
#define FQLA_DECODE_XCH_WARPS 8

/* Element type codes of the kernel's runtime-typed inputs (= fqla_dtype). */
enum { DEC_F32 = 0, DEC_F16 = 1, DEC_BF16 = 2, DEC_I32 = 4, DEC_I64 = 5 };

/* Where the state goes after a token. */
enum { DEC_WRITE_POOL = 0,        /* decode: back to state_pool[slots[b]] (last token) */
       DEC_WRITE_STEP_STATES = 1, /* verify: step_states[b, t] */
       DEC_WRITE_STEP_SLOTS = 2   /* verify: state_pool[step_slots[b, t]] */ };

struct DecodeParams {
    const void *q, *k, *v, *g, *beta, *A_log, *dt_bias, *slots, *step_slots;
    void *pool, *o, *step_states;
    /* strides in elements (the innermost one is 1 for every tensor) */
    int64_t q_s0, q_s1, q_s2;
    int64_t k_s0, k_s1, k_s2;
    int64_t v_s0, v_s1, v_s2;
    int64_t o_s0, o_s1, o_s2;
    int64_t g_s0, g_s1, b_s0, b_s1;  /* g, beta [B, T, HV]: last stride 1 */
    int64_t alog_s, dtb_s;
    int64_t slot_s, st_s0, st_s1;    /* slots [B], step_slots [B, T] */
    int64_t pool_s0, pool_s1, pool_row;     /* [P, HV, rows, cols] */
    int64_t ss_s0, ss_s1, ss_s2, ss_row;    /* step_states [B, T, HV, rows, cols] */
    int64_t B, T, HV, P, group;
    int64_t total_warps;             /* B * HV * (V / WV) * KS */
    int ngroups;                     /* V / WV */
    int io_dt, g_dt, beta_dt, alog_dt, dtb_dt, slot_dt, step_slot_dt;
    int use_l2norm, use_gate, use_beta_sigmoid, allow_neg_eigval;
    int write_mode;
    int streaming;                   /* evict-first hints on the state stream */
    int pdl;                         /* launch with programmatic stream serialization (host side only) */
    int prefetch;                    /* L2 prefetch of the state and inputs before the PDL wait */
    float scale;
};

static __device__ __forceinline__ float dec_load(const void *p, int64_t i, int dt)
{
    switch (dt) {
    case DEC_F16: return __half2float(static_cast<const __half *>(p)[i]);
    case DEC_BF16: return __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[i]);
    default: return static_cast<const float *>(p)[i];
    }
}

static __device__ __forceinline__ float dec_to_float(float x) { return x; }
static __device__ __forceinline__ float dec_to_float(__half x) { return __half2float(x); }
static __device__ __forceinline__ float dec_to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

static __device__ __forceinline__ void dec_store(void *p, int64_t i, int dt, float x)
{
    switch (dt) {
    case DEC_F16: static_cast<__half *>(p)[i] = __float2half_rn(x); break;
    case DEC_BF16: static_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16_rn(x); break;
    default: static_cast<float *>(p)[i] = x; break;
    }
}

/* A hint: moves the 128-byte line holding p into L2; never faults on
 * in-bounds addresses and returns nothing. */
static __device__ __forceinline__ void dec_prefetch_l2(const void *p)
{
    fqla_prefetch_l2(p);
}

static __device__ __forceinline__ int64_t dec_load_index(const void *p, int64_t i, int dt)
{
    return dt == DEC_I64 ? static_cast<const int64_t *>(p)[i] : (int64_t) static_cast<const int32_t *>(p)[i];
}

/* 16 bytes of state <-> VEC floats. */
template <typename ST> struct StateVec;
template <> struct StateVec<float> {
    static constexpr int VEC = 4;
    static __device__ __forceinline__ void load(const float *p, float *x, int streaming)
    {
        const float4 *a = reinterpret_cast<const float4 *>(p);
        float4 r = streaming ? __ldcs(a) : *a;
        x[0] = r.x; x[1] = r.y; x[2] = r.z; x[3] = r.w;
    }
    static __device__ __forceinline__ void store(float *p, const float *x, int streaming)
    {
        float4 r = make_float4(x[0], x[1], x[2], x[3]);
        float4 *a = reinterpret_cast<float4 *>(p);
        if (streaming) __stcs(a, r); else *a = r;
    }
};
template <> struct StateVec<__nv_bfloat16> {
    static constexpr int VEC = 8;
    static __device__ __forceinline__ void load(const __nv_bfloat16 *p, float *x, int streaming)
    {
        const uint4 *a = reinterpret_cast<const uint4 *>(p);
        uint4 r = streaming ? __ldcs(a) : *a;
        const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            /* bf16 -> f32 is a 16-bit shift: exact and cheaper than cvt */
            x[2 * i] = __uint_as_float(w[i] << 16);
            x[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
        }
    }
    static __device__ __forceinline__ void store(__nv_bfloat16 *p, const float *x, int streaming)
    {
        uint32_t w[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            __nv_bfloat162 h = __floats2bfloat162_rn(x[2 * i], x[2 * i + 1]);
            w[i] = *reinterpret_cast<uint32_t *>(&h);
        }
        uint4 r = make_uint4(w[0], w[1], w[2], w[3]);
        uint4 *a = reinterpret_cast<uint4 *>(p);
        if (streaming) __stcs(a, r); else *a = r;
    }
};

/* Compile-time lane layout of one (K, WV, layout, state type) variant. */
template <int K, int WV, bool VFIRST, typename ST, int KS = 1> struct DecodeLayout {
    static constexpr int VEC = StateVec<ST>::VEC;
    /* [K, V] */
    static constexpr int KV_LC = WV / VEC > 0 ? WV / VEC : 1;
    static constexpr int KV_LR = 32 / KV_LC;
    static constexpr int KV_KK = K / KS;             /* rows of one warp */
    static constexpr int KV_RK = KV_KK / KV_LR;
    /* [V, K] */
    static constexpr int VK_LC = 8;
    static constexpr int VK_LR = 4;
    static constexpr int VK_RV = WV / VK_LR;
    static constexpr int VK_CK = K / (VK_LC * VEC);

    static constexpr bool valid = VFIRST
        ? (KS == 1 && WV % VK_LR == 0 && VK_RV >= 1 && K % (VK_LC * VEC) == 0 && VK_CK >= 1)
        : (WV % VEC == 0 && WV / VEC <= 32 && 32 % KV_LC == 0 && K % KS == 0 && KV_KK % KV_LR == 0 &&
           KV_RK >= 1 && (KS == 1 || KS == 2 || KS == 4 || KS == 8));

    /* memory rows per lane x contiguous elements per lane (in VEC chunks) */
    static constexpr int NR = VFIRST ? VK_RV : KV_RK;
    static constexpr int NC = VFIRST ? VK_CK : 1;
    static constexpr int NI = NC * VEC;               /* inner elements per row */
    static constexpr int NK = VFIRST ? NI : NR;       /* K values per lane */
    static constexpr int NV = VFIRST ? NR : NI;       /* V values per lane */
    /* the K-sum runs over lane bits [RED_LO, 32) or [1, 8) */
    static constexpr int RED_LO = VFIRST ? 1 : KV_LC;
    static constexpr int RED_HI = VFIRST ? VK_LC : 32;
};

template <int K, int WV, bool VFIRST, bool MULTI, typename ST, int KS = 1>
__global__ void __launch_bounds__(256) fqla_decode_kernel(const DecodeParams p)
{
    typedef DecodeLayout<K, WV, VFIRST, ST, KS> L;
    typedef StateVec<ST> SV;
    constexpr int VEC = L::VEC, NR = L::NR, NC = L::NC, NI = L::NI, NK = L::NK, NV = L::NV;

    const int lane = threadIdx.x & 31;
    /* 32-bit index math (the launcher guarantees total_warps < 2^31): 64-bit
     * divisions are software routines sitting right before the first load */
    const uint32_t w = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (w >= (uint32_t)p.total_warps) return;
    /* KS adjacent warps share a tile (KS divides the warps per CTA) */
    const uint32_t wt = w / KS;
    const int kp = (int)(w % KS);
    const int k0 = kp * L::KV_KK;
    const uint32_t bh = wt / (uint32_t)p.ngroups;
    const int vg = (int)(wt - bh * (uint32_t)p.ngroups);
    const uint32_t b32 = bh / (uint32_t)p.HV;
    const int64_t hv = (int64_t)(bh - b32 * (uint32_t)p.HV);
    const int64_t b = (int64_t)b32;
    const int64_t hk = (int64_t)((uint32_t)hv / (uint32_t)p.group);
    const int v0 = vg * WV;

    /* this lane's rows / columns inside the tile */
    int lr, lc;
    if (VFIRST) { lr = lane / L::VK_LC; lc = lane % L::VK_LC; }
    else { lr = lane / L::KV_LC; lc = lane % L::KV_LC; }
    /* K index of this lane's k value i, V index of its v value j */
    auto kidx = [&](int i) -> int {
        if (VFIRST) return ((i / VEC) * L::VK_LC + lc) * VEC + (i % VEC);
        return k0 + lr * L::KV_RK + i;
    };
    auto vidx = [&](int j) -> int {
        if (VFIRST) return v0 + lr * L::VK_RV + j;
        return v0 + lc * VEC + j;
    };
    /* offset of (memory row r, chunk c) inside a tile whose row stride is rs */
    auto tile_off = [&](int r, int c, int64_t rs) -> int64_t {
        if (VFIRST) return (int64_t)(v0 + lr * L::VK_RV + r) * rs + (c * L::VK_LC + lc) * VEC;
        return (int64_t)(k0 + lr * L::KV_RK + r) * rs + v0 + lc * VEC;
    };
    const bool writer = VFIRST ? (lc == 0) : (lr == 0 && kp == 0);

    /* token inputs. Token 0 is loaded first, before the slot is known, so its
     * latency overlaps the slot -> state dependency (for a padded row these
     * reads of its own input rows are simply unused); with MULTI token t + 1
     * is prefetched into separate registers during token t. */
    float kk[NK], qq[NK], vv[NV], graw, braw;
    float kn[MULTI ? NK : 1], qn[MULTI ? NK : 1], vn[MULTI ? NV : 1], gn = 0.0f, bn = 0.0f;
    auto load_token = [&](int64_t t, float *k_, float *q_, float *v_, float &g_, float &b_) {
        const int64_t qo = b * p.q_s0 + t * p.q_s1 + hk * p.q_s2;
        const int64_t ko = b * p.k_s0 + t * p.k_s1 + hk * p.k_s2;
        const int64_t vo = b * p.v_s0 + t * p.v_s1 + hv * p.v_s2;
        /* one branch on the dtype, then straight-line loads */
        auto rows = [&](auto zero) {
            typedef decltype(zero) IT;
            const IT *qp = static_cast<const IT *>(p.q) + qo, *kp = static_cast<const IT *>(p.k) + ko;
            const IT *vp = static_cast<const IT *>(p.v) + vo;
#pragma unroll
            for (int i = 0; i < NK; i++) {
                k_[i] = dec_to_float(kp[kidx(i)]);
                q_[i] = dec_to_float(qp[kidx(i)]);
            }
#pragma unroll
            for (int j = 0; j < NV; j++)
                v_[j] = dec_to_float(vp[vidx(j)]);
        };
        if (p.io_dt == DEC_BF16) rows(__nv_bfloat16());
        else if (p.io_dt == DEC_F16) rows(__half());
        else rows(0.0f);
        g_ = dec_load(p.g, b * p.g_s0 + t * p.g_s1 + hv, p.g_dt);
        b_ = dec_load(p.beta, b * p.b_s0 + t * p.b_s1 + hv, p.beta_dt);
    };

    if (p.prefetch) {
        /* before the wait: hints only (see the header). The slot read here
         * may be stale; it only picks which lines to warm and is read again
         * after the wait. Lanes take the 128-byte lines of the token-0 q, k, v
         * rows in turn; for the state tile, the lane whose 16 bytes start a
         * line prefetches it (every line of a tile starts in some lane's
         * vector, of this warp or of a neighbour). */
        const int es = p.io_dt == DEC_F32 ? 4 : 2;
        const int lines = (int)(((int64_t)K * es + 127) / 128);
        if (lane < lines) {
            dec_prefetch_l2(static_cast<const char *>(p.q) + (b * p.q_s0 + hk * p.q_s2) * es + lane * 128);
            dec_prefetch_l2(static_cast<const char *>(p.k) + (b * p.k_s0 + hk * p.k_s2) * es + lane * 128);
            dec_prefetch_l2(static_cast<const char *>(p.v) + (b * p.v_s0 + hv * p.v_s2) * es + lane * 128);
        }
        const int64_t ps = dec_load_index(p.slots, b * p.slot_s, p.slot_dt);
        if (ps >= 0 && ps < p.P) {
            const ST *src = static_cast<const ST *>(p.pool) + ps * p.pool_s0 + hv * p.pool_s1;
#pragma unroll
            for (int r = 0; r < NR; r++)
#pragma unroll
                for (int c = 0; c < NC; c++) {
                    const ST *a = src + tile_off(r, c, p.pool_row);
                    if ((reinterpret_cast<uintptr_t>(a) & 127) < 16) dec_prefetch_l2(a);
                }
        }
    }
    /* programmatic dependent launch: nothing global is loaded (beyond the
     * hints above) before the previous kernel of the stream has finished and
     * its writes are visible; the next kernel may start its own launch now
     * (it waits likewise) */
    fqla_pdl_wait();
    fqla_pdl_trigger();
    load_token(0, kk, qq, vv, graw, braw);

    const int64_t slot = dec_load_index(p.slots, b * p.slot_s, p.slot_dt);
    if (slot < 0 || slot >= p.P) {
        /* padding: zeros; a slot past the pool (only possible without a host
         * copy of slots): NaN, so the caller sees it. Nothing else touched. */
        const float fill = slot < 0 ? 0.0f : __int_as_float(0x7fffffff);
        if (writer)
            for (int64_t t = 0; t < p.T; t++)
#pragma unroll
                for (int j = 0; j < NV; j++)
                    dec_store(p.o, b * p.o_s0 + t * p.o_s1 + hv * p.o_s2 + vidx(j), p.io_dt, fill);
        return;
    }

    /* the state tile: s[r][i], r = memory row, i = inner element */
    ST *const pool = static_cast<ST *>(p.pool);
    const ST *src = pool + slot * p.pool_s0 + hv * p.pool_s1;
    float s[NR][NI];
#pragma unroll
    for (int r = 0; r < NR; r++)
#pragma unroll
        for (int c = 0; c < NC; c++)
            SV::load(src + tile_off(r, c, p.pool_row), &s[r][c * VEC], p.streaming);

    float A = 0.0f, dtb = 0.0f;
    if (p.use_gate) {
        A = __expf(dec_load(p.A_log, hv * p.alog_s, p.alog_dt));
        dtb = dec_load(p.dt_bias, hv * p.dtb_s, p.dtb_dt);
    }

    auto store_tile = [&](ST *dst, int64_t rs) {
#pragma unroll
        for (int r = 0; r < NR; r++)
#pragma unroll
            for (int c = 0; c < NC; c++)
                SV::store(dst + tile_off(r, c, rs), &s[r][c * VEC], p.streaming);
    };

    const int64_t T = MULTI ? p.T : 1;
    for (int64_t t = 0; t < T; t++) {
        /* scalar transforms (every lane computes them: no broadcast needed) */
        float g = graw;
        if (p.use_gate) {
            const float x = graw + dtb;
            /* softplus without overflow: x + log1p(e^-x) for x > 0 */
            const float sp = x > 0.0f ? x + log1pf(expf(-x)) : log1pf(expf(x));
            g = -A * sp;
        }
        float beta = braw;
        if (p.use_beta_sigmoid) {
            beta = braw >= 0.0f ? 1.0f / (1.0f + expf(-braw)) : expf(braw) / (1.0f + expf(braw));
            if (p.allow_neg_eigval) beta *= 2.0f;
        }
        const float decay = expf(g);

        /* partial sums over this lane's K values: S^T k, S^T q, |k|^2, |q|^2, q.k */
        float ak[NV], aq[NV];
#pragma unroll
        for (int j = 0; j < NV; j++) { ak[j] = 0.0f; aq[j] = 0.0f; }
#pragma unroll
        for (int r = 0; r < NR; r++)
#pragma unroll
            for (int i = 0; i < NI; i++) {
                const int ki = VFIRST ? i : r, vj = VFIRST ? r : i;
                ak[vj] = fmaf(s[r][i], kk[ki], ak[vj]);
                aq[vj] = fmaf(s[r][i], qq[ki], aq[vj]);
            }
        float nk = 0.0f, nq = 0.0f, nqk = 0.0f;
#pragma unroll
        for (int i = 0; i < NK; i++) {
            nk = fmaf(kk[i], kk[i], nk);
            nq = fmaf(qq[i], qq[i], nq);
            nqk = fmaf(qq[i], kk[i], nqk);
        }
#pragma unroll
        for (int off = L::RED_LO; off < L::RED_HI; off <<= 1) {
#pragma unroll
            for (int j = 0; j < NV; j++) {
                ak[j] += __shfl_xor_sync(0xffffffffu, ak[j], off);
                aq[j] += __shfl_xor_sync(0xffffffffu, aq[j], off);
            }
            nk += __shfl_xor_sync(0xffffffffu, nk, off);
            nq += __shfl_xor_sync(0xffffffffu, nq, off);
            nqk += __shfl_xor_sync(0xffffffffu, nqk, off);
        }
        if constexpr (KS > 1) {
            /* finish the K-sums over the group's KS warps (see the header) */
            constexpr int XS = 2 * WV + 4;
            FQLA_SHARED float xch[2][FQLA_DECODE_XCH_WARPS * XS];
            const int wic = (int)(threadIdx.x >> 5), g0 = wic - kp;
            float *buf = xch[MULTI ? (int)(t & 1) : 0];
            if (lr == 0) {
#pragma unroll
                for (int j = 0; j < NV; j++) {
                    buf[wic * XS + lc * NV + j] = ak[j];
                    buf[wic * XS + WV + lc * NV + j] = aq[j];
                }
            }
            if (lane == 0) {
                buf[wic * XS + 2 * WV] = nk;
                buf[wic * XS + 2 * WV + 1] = nq;
                buf[wic * XS + 2 * WV + 2] = nqk;
            }
            fqla_bar_sync(dec_bar::xch, 32 * KS, wic / KS);
#pragma unroll
            for (int j = 0; j < NV; j++) { ak[j] = 0.0f; aq[j] = 0.0f; }
            nk = 0.0f; nq = 0.0f; nqk = 0.0f;
#pragma unroll
            for (int m = 0; m < KS; m++) {
                const float *pb = buf + (g0 + m) * XS;
#pragma unroll
                for (int j = 0; j < NV; j++) {
                    ak[j] += pb[lc * NV + j];
                    aq[j] += pb[WV + lc * NV + j];
                }
                nk += pb[2 * WV];
                nq += pb[2 * WV + 1];
                nqk += pb[2 * WV + 2];
            }
        }
        float rk = 1.0f, rq = 1.0f;
        if (p.use_l2norm) {
            rk = rsqrtf(nk + 1e-6f);
            rq = rsqrtf(nq + 1e-6f);
        }
        const float qk = nqk * rk * rq;

        /* u = beta (v - exp(g) S^T k_hat); o = scale (exp(g) S^T q_hat + (q_hat.k_hat) u) */
        float uk[NV];
        const int64_t oo = b * p.o_s0 + t * p.o_s1 + hv * p.o_s2;
#pragma unroll
        for (int j = 0; j < NV; j++) {
            const float u = beta * (vv[j] - decay * rk * ak[j]);
            const float o = p.scale * (decay * rq * aq[j] + qk * u);
            if (writer) dec_store(p.o, oo + vidx(j), p.io_dt, o);
            uk[j] = u * rk; /* k_hat u^T = k (rk u)^T */
        }

        if constexpr (MULTI)
            if (t + 1 < T) load_token(t + 1, kn, qn, vn, gn, bn);

        /* S <- exp(g) S + k_hat u^T */
#pragma unroll
        for (int r = 0; r < NR; r++)
#pragma unroll
            for (int i = 0; i < NI; i++) {
                const int ki = VFIRST ? i : r, vj = VFIRST ? r : i;
                s[r][i] = fmaf(kk[ki], uk[vj], decay * s[r][i]);
            }

        if (p.write_mode == DEC_WRITE_STEP_STATES) {
            store_tile(static_cast<ST *>(p.step_states) + b * p.ss_s0 + t * p.ss_s1 + hv * p.ss_s2, p.ss_row);
        } else if (p.write_mode == DEC_WRITE_STEP_SLOTS) {
            const int64_t ds = dec_load_index(p.step_slots, b * p.st_s0 + t * p.st_s1, p.step_slot_dt);
            if (ds >= 0 && ds < p.P) store_tile(pool + ds * p.pool_s0 + hv * p.pool_s1, p.pool_row);
        }

        if constexpr (MULTI) {
#pragma unroll
            for (int i = 0; i < NK; i++) { kk[i] = kn[i]; qq[i] = qn[i]; }
#pragma unroll
            for (int j = 0; j < NV; j++) vv[j] = vn[j];
            graw = gn;
            braw = bn;
        }
    }
    if (p.write_mode == DEC_WRITE_POOL)
        store_tile(pool + slot * p.pool_s0 + hv * p.pool_s1, p.pool_row);
}

#endif
