/*
 * fwd_chunk_f32.cu - the forward for fp32 q/k/v, chunked (issue 42): the
 * whole chunked algorithm of docs/design.md §2 in one kernel, at fp32
 * accuracy (o and the final state within ~1e-5 of the fp64 reference),
 * where the bf16 / fp16 kernels' two-byte products cannot serve. One CTA
 * (eight warps) per (sequence, value head, BV value columns) walks the
 * sequence's 64-token chunks with its state slice in registers, as S^T
 * (BV x K, mma accumulator fragments). Per chunk, as src/cpu/chunked_fwd.c:
 *
 *   gamma = cumsum g,  e_i = e^gamma_i,  f_j = e^(gamma_C - gamma_j)
 *   KS = K S,  QS = Q S,  KK = K K^T,  QK = Q K^T         (one k loop)
 *   L  = StrictLower(diag(beta rk) (Gamma . KK) diag(rk))
 *   X  = diag(beta) (V - diag(e rk) KS)
 *   U  = (I + L)^-1 X                    forward substitution, fp32
 *   O  = diag(scale rq e) QS + P U,  P = scale diag(rq) (Gamma . tril(QK)) diag(rk)
 *   S^T = e_C S^T + U^T (diag(f rk) K)
 *
 * rq, rk are the in-kernel l2norm's factors (1 without it); the gate and
 * beta are finished here (finish_gate_beta: in-kernel gate, sigmoid,
 * floor), so the kernel needs no prepare kernel and no workspace.
 *
 * Every product runs on mma.sync m16n8k16 in bf16x3: an fp32 operand x is
 * split into hi = bf16(x) and lo = bf16(x - hi), and a b is summed as
 * lo_a hi_b + hi_a lo_b + hi_a hi_b in fp32 (the lo lo term and the split's
 * residue are ~2^-17 of the product: dev/models/fp32_chunked_precision.py
 * puts o at 7e-6 to 1.6e-5). Each operand is split once, when it is made
 * (the first version split at every fragment load: 56 % of its
 * instructions, docs/history/2026-12-05-gpu.md), into a "split tile": the
 * fp32 tile's own words, word 2p of a row the bf16 pair hi of elements 2p,
 * 2p + 1 and word 2p + 1 their lo pair, so one 8-byte load at an element
 * pair's fp32 address gives a fragment register's hi and lo. q and k are
 * split in place after they land (with their l2norm sums), and in the same
 * pass diag(f rk) K is split transposed into Kt (the state update's B,
 * whose pairs run along the tokens); S^T from its accumulators, P at its
 * epilogue, U^T by the substitution.
 *
 * The substitution solves one value column per TPC = 256 / BV threads (4
 * or 8), in 16-row blocks: the rows' dot products with the earlier blocks
 * are split over the TPC threads (thread part p takes the earlier rows j =
 * p mod TPC, whose u it keeps in registers) and summed by shuffles, 16 at
 * once; the 16 x 16 triangle is then solved by each of the TPC threads
 * alike, column by column (a 16-step dependent chain). L is stored
 * transposed, so a thread reads a row j's 16 entries of a block as four
 * 16-byte loads.
 *
 * Per chunk four CTA barriers: A (q, k, v landed, S^T and the chunk's
 * gamma, e, f, beta published), B (q, k split, Kt, the norms), C (L^T, P,
 * X written), D (U written). K is read for the last time by the products
 * before C (the state update reads Kt), so the next chunk's q and k are
 * copied after C and its v after D, while the substitution and the O and
 * state products run (cp.async, zero-filled past the sequence end, so
 * padded rows add nothing and NaN rows past cu[N] are never read). Warp 0
 * loads the next chunk's stored gate and beta after D and finishes them
 * (gamma by a warp scan, e, f, beta) into the buffer of that chunk's
 * parity at the end of the chunk.
 *
 * Context parallelism (cp_mode, fwd.cu run_cp_f32): where a few long
 * sequences leave SMs idle, the rows are segments (fqla_fwd_span). The
 * pre-pass (cp_mode 1) runs every segment but a sequence's last from a zero
 * state with the K transition columns beside the V ones (they start from I
 * and see V = 0) and stores H | M; with the shortcut (cp_skip) it first
 * reads the segment's gates and key norms (f32_segment_reach) to leave out
 * a negligible M and to start H where the earlier chunks are negligible at
 * the segment's end. fwd_cp.cu's scan forms the start states, and the main
 * pass (cp_mode 2) runs every segment from its own.
 *
 * Grid: x = (sequence or segment, value head), plus TAIL CTAs that zero o's
 * rows after the last sequence (varlen); y = the V / BV slices (the
 * pre-pass: (V + K) / BV). Shared memory (fp32
 * words): Q, K (split in place), V (then X), S^T (split), L^T, P, U^T and
 * Kt (split), and the per-token factors (gamma, e, f, beta by chunk
 * parity; rq, rk): 213 KB at K = 128, 64 columns.
 */
#include "cuda/fwd_common.cuh"
#include "cuda/fwd_prepare_common.cuh" /* load_gate, finish_gate_beta */
#include "cuda/kernel/bf16x3.cuh"
#include "cuda/ptx/cp_async.cuh"

#include <cuda_bf16.h>

namespace {

constexpr int C = FQLA_FWD_CHUNK;
constexpr int NT = FQLA_FWD_THREADS; /* 8 warps */
constexpr int TAIL = 32;             /* CTAs zeroing o's rows after the last sequence */
/* Row pitches are 8 mod 32 words: the 8-byte fragment loads of a half-warp
 * (rows g = 0..3 or 4..7, pairs t = 0..3) cover the 32 banks once. */
constexpr int LDC = C + 8; /* L^T, P, U^T rows */

template <int KD, int BV>
struct f32_cfg {
    static constexpr int LDQ = KD + 8;             /* Q, K, S^T rows */
    static constexpr int LDV = BV + 8;             /* V / X rows */
    static constexpr int TPC = NT / BV;            /* substitution threads per value column */
    static constexpr int MTS = BV / 16;            /* S^T m-tiles (value columns) */
    static constexpr int NTW = (KD / 8) * MTS / 8; /* S^T n-tiles per warp */
    static constexpr int CNT = BV / 16;            /* n-tiles per warp of the 64 x BV products */
    /* offsets in words */
    static constexpr int oQ = 0;
    static constexpr int oK = oQ + C * LDQ;
    static constexpr int oV = oK + C * LDQ;
    static constexpr int oS = oV + C * LDV;
    static constexpr int oL = oS + BV * LDQ;
    static constexpr int oP = oL + C * LDC;
    static constexpr int oU = oP + C * LDC;
    static constexpr int oKt = oU + BV * LDC;
    static constexpr int oVec = oKt + KD * LDC; /* [2][gam, e, f, beta] by chunk parity, then rq, rk: [64] each */
    static constexpr int words = oVec + 10 * C;
    static constexpr size_t bytes = (size_t)words * 4;
    static_assert(bytes <= 227 * 1024, "the plan fits an SM's shared memory");
    static_assert(NTW >= 1 && (KD / 8) * MTS % 8 == 0, "S^T tiles spread over the 8 warps");
    static_assert(LDQ % 32 == 8 && LDV % 32 == 8 && LDC % 32 == 8, "conflict-free 8-byte fragment loads");
    static_assert(oK % 4 == 0 && oV % 4 == 0 && oL % 4 == 0, "16-byte rows for cp.async and L^T's loads");
    static_assert(KD / 16 >= 4, "the split pass: 8 threads a row pair, column pairs sub + 8 m");
};

/* Copies chunk cc's rows of a tile (q / k: KD columns, v: the CTA's BV
 * columns) into shared memory (ld words a row), zeros past the sequence
 * end; one commit group. */
template <int W>
__device__ __forceinline__ void copy_rows(float *dst, int ld, const float *src, int64_t st, int64_t t0, int nvalid,
                                          int tid)
{
    constexpr int VR = W / 4; /* 16-byte pieces a row */
    for (int idx = tid; idx < C * VR; idx += NT) {
        const int i = idx / VR, cv = idx % VR;
        const bool ok = i < nvalid;
        fqla_cp_async16(dst + i * ld + 4 * cv, src + (t0 + (ok ? i : 0)) * st + 4 * cv, ok ? 16 : 0);
    }
    fqla_cp_async_commit();
}

/* CP's pre-pass with the negligible-transition shortcut (p.cp_skip): how
 * much of a segment (len tokens from start, keys kb) its zero-start end
 * state H needs, and whether its transition M is negligible. Every token
 * t with 0 <= beta_t ||k_t||^2 <= 2 (normalised keys where the kernel
 * normalises them) has ||I - beta_t k_t k_t^T||_2 <= 1, so the chain over
 * a span of such tokens has norm at most e^(the span's sum of g). Where the
 * chunks after chunk c sum to <= -17 (e^-17 ~ 4e-8, below fp32 rounding;
 * the bf16 CP's test, fwd_common.cuh fqla_cp_m_negligible) and hold only
 * such tokens, whatever chunks 0 .. c add to the state reaches the end
 * damped below rounding: H is run from a zero state from chunk c + 1 on
 * (returned; 0 where no such c exists). M is negligible where the whole
 * segment passes the test (*m_neg; only computed with whole, which reads
 * every chunk; else the walk stops at the first c found). The chunks are
 * read from the end, eight at a time (a warp each: the 64 tokens' finished
 * gates and beta, their keys' squared norms), and summed in one order by
 * every thread, so all threads (and every CTA of the segment) agree. A
 * block-wide call. */
template <int KD>
__device__ int64_t f32_segment_reach(const fqla_fwd_params &p, const float *kb, int64_t batch, int64_t start,
                                     int64_t len, int hv, bool whole, int *m_neg, float *scratch)
{
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t nch = (len + C - 1) / C;
    int *good_of = reinterpret_cast<int *>(scratch + NT / 32);
    float acc = 0.f; /* the sum of g over the chunks walked */
    int ok = 1;      /* they hold only tokens that pass */
    int64_t first = -1;
    for (int64_t top = nch; top > 0; top -= NT / 32) {
        const int64_t c = top - 1 - warp;
        float sg = 0.f;
        int good = 1;
        if (c >= 0) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int64_t t = c * C + lane + 32 * h;
                if (t >= len) continue;
                const int64_t tt = start + t;
                float gg = load_gate(p.g, p.g_bf16, batch * p.g_sb + tt * p.g_st + hv * p.g_sh);
                float bb = load_gate(p.beta, p.beta_bf16, batch * p.b_sb + tt * p.b_st + hv * p.b_sh);
                finish_gate_beta(p, hv, gg, bb);
                const float4 *kr = reinterpret_cast<const float4 *>(kb + t * p.k_st);
                float kk = 0.f;
#pragma unroll 8
                for (int j = 0; j < KD / 4; j++) {
                    const float4 x = kr[j];
                    kk = fmaf(x.x, x.x, fmaf(x.y, x.y, fmaf(x.z, x.z, fmaf(x.w, x.w, kk))));
                }
                if (p.l2norm) kk = kk / (kk + 1e-6f); /* ||rk k||^2 */
                const float bk = bb * kk;
                sg += gg;
                good &= bk >= 0.f && bk <= 2.f; /* false for NaN */
            }
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) sg += __shfl_xor_sync(0xffffffffu, sg, o);
            good = __all_sync(0xffffffffu, good);
        }
        if (lane == 0) {
            scratch[warp] = sg;
            good_of[warp] = good;
        }
        __syncthreads();
        for (int w = 0; w < NT / 32 && top - 1 - w >= 0; w++) {
            if (first < 0 && ok && acc <= -17.f) first = top - w; /* chunks top - w .. nch - 1 suffice */
            acc += scratch[w];
            ok &= good_of[w];
        }
        __syncthreads(); /* scratch is rewritten next round */
        if (first >= 0 && !whole) break;
    }
    if (whole) *m_neg = ok && acc <= -17.f;
    return first > 0 ? first : 0;
}

template <int KD, int BV, bool OUT>
__global__ void __launch_bounds__(NT, 1) fwd_chunk_f32_kernel(const __grid_constant__ fqla_fwd_params p)
{
    typedef f32_cfg<KD, BV> cfg;
    constexpr int LDQ = cfg::LDQ, LDV = cfg::LDV, TPC = cfg::TPC, CNT = cfg::CNT, NTW = cfg::NTW;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    float *sm = reinterpret_cast<float *>(smem_raw);
    float *Qs = sm + cfg::oQ, *Ks = sm + cfg::oK, *Vs = sm + cfg::oV, *St = sm + cfg::oS;
    float *Lt = sm + cfg::oL, *Ps = sm + cfg::oP, *Ut = sm + cfg::oU, *Kt = sm + cfg::oKt;
    float *const vec = sm + cfg::oVec; /* chunk parity b: gam, e, f, beta at vec + 4 C b */
    float *rq = vec + 8 * C, *rk = rq + C;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tq = lane & 3;
    /* rows: sequences, or with CP segment indices (cp_mode 1: the
     * pre-pass, cp_mode 2: the main pass; fwd_common.cuh) */
    const int64_t chains = (p.cp_mode ? p.segs : p.N) * p.HV;
    if ((int64_t)blockIdx.x >= chains) {
        /* o's rows after the last sequence (varlen): exact zeros */
        if (!p.varlen || !OUT || blockIdx.y != 0) return;
        const int64_t end = fqla_fwd_cu(p, p.N), per_row = (int64_t)p.HV * p.V;
        for (int64_t i = ((int64_t)blockIdx.x - chains) * NT + tid; i < (p.T - end) * per_row; i += (int64_t)TAIL * NT) {
            const int64_t t = end + i / per_row, r = i % per_row;
            ((float *)p.o)[t * p.o_st + (r / p.V) * p.o_sh + r % p.V] = 0.f;
        }
        return;
    }
    const int64_t ns = blockIdx.x / p.HV; /* the state's row: the sequence, or the segment */
    const int hv = blockIdx.x % p.HV;
    const int hq = hv / p.group;
    const int v0 = blockIdx.y * BV;

    int64_t n, batch, start, len, slot0;
    bool last;
    /* The pre-pass leaves out each sequence's last segment (the main pass
     * runs it on to the final state); without o the main pass runs only
     * that one (the final state alone). */
    if (!fqla_fwd_span(p, ns, n, batch, start, len, slot0, last) || (p.cp_mode == 1 && last) ||
        (p.cp_mode == 2 && !p.o && !last)) {
        if (p.cp_mode == 1 && p.cp_skip && v0 == p.V && tid == 0) p.seg_flag[ns * p.HV + hv] = 0; /* defined */
        return;
    }
    /* the pre-pass's transition columns: the state's columns v0 - V .. start
     * from the identity and see V = 0 (fwd_cp.cu). Read from the parameters
     * where used (held in a register through the chunk loop, this and the
     * span's values spilled at K = 128, 64 columns) */
    auto ident_cols = [&]() { return p.cp_mode == 1 && (int)blockIdx.y * BV >= p.V; };
    const bool ident = ident_cols();
    const int64_t nch = (len + C - 1) / C;

    /* S^T fragments: warp w holds m-tile smt (value columns 16 smt..) and
     * n-tiles snt0 .. snt0 + NTW - 1 (state rows 8 snt0..) */
    const int smt = warp % cfg::MTS, snt0 = (warp / cfg::MTS) * NTW;
    float S[NTW][4];
#pragma unroll
    for (int ni = 0; ni < NTW; ni++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int v = 16 * smt + g + 8 * (e >> 1), r = 8 * (snt0 + ni) + 2 * tq + (e & 1);
            float x = ident && v0 + v - p.V == r ? 1.f : 0.f;
            if (p.h0) {
                const int64_t off = fqla_fwd_state_off(ns, hv, r, v0 + v, p.h0_sn, p.h0_sh, p.h0_s2, p.v_first);
                x = p.h0_bf16 ? __bfloat162float(((const __nv_bfloat16 *)p.h0)[off]) : ((const float *)p.h0)[off];
            }
            S[ni][e] = x;
        }
    /* S^T -> St (split), the B operand of K S and Q S; published by barrier A */
    auto write_st = [&]() {
#pragma unroll
        for (int ni = 0; ni < NTW; ni++) {
            const int v = 16 * smt + g, r = 8 * (snt0 + ni) + 2 * tq;
            *reinterpret_cast<uint2 *>(St + v * LDQ + r) = fqla_x3_split(S[ni][0], S[ni][1]);
            *reinterpret_cast<uint2 *>(St + (v + 8) * LDQ + r) = fqla_x3_split(S[ni][2], S[ni][3]);
        }
    };

    const float *qb = (const float *)p.q + batch * p.q_sb + start * p.q_st + hq * p.q_sh;
    const float *kb = (const float *)p.k + batch * p.k_sb + start * p.k_st + hq * p.k_sh;
    const float *vb = (const float *)p.v + batch * p.v_sb + start * p.v_st + hv * p.v_sh + v0;
    float *ob = OUT ? (float *)p.o + batch * p.o_sb + start * p.o_st + hv * p.o_sh + v0 : NULL;

    /* the pre-pass with the shortcut: where the segment's decay makes its
     * early chunks negligible at its end, H starts later (c_first), and a
     * negligible M is left out and flagged for the scan (one flag per
     * segment and head, written by the first transition slice; every
     * slice decides alike) */
    int64_t c_first = 0;
    if (p.cp_mode == 1 && p.cp_skip) {
        int m_neg = 0;
        c_first = f32_segment_reach<KD>(p, kb, batch, start, len, hv, ident, &m_neg, sm);
        if (ident) {
            if (v0 == p.V && tid == 0) p.seg_flag[ns * p.HV + hv] = m_neg;
            if (m_neg) return;
            c_first = 0; /* M needs every chunk */
        }
    }
    /* o's element pairs 8-byte aligned (the contract asks 4): one store a pair */
    const bool o_pairs = ((uintptr_t)ob & 7) == 0 && (p.o_st & 1) == 0;

    /* the 64 x BV products: warp w takes rows 16 mw.. and columns n0..;
     * mw pairs 0 / 3 and 1 / 2 share an SM sub-partition (warps w and
     * w + 4), so the triangular products (K K^T, Q K^T, P U) load every
     * partition about evenly */
    const int mw = warp < 4 ? warp : 7 - warp, n0 = (warp >> 2) * (BV / 2);
    /* the 64 x 64 products: rows 16 mw.., columns j0.. (four n-tiles) */
    const int j0 = (warp >> 2) * 32;

    /* warp 0: the stored gate and beta of chunk cc's tokens lane and lane +
     * 32 (0 past the end), loaded after the previous chunk's barrier D
     * (in flight through its O and state products) and finished at its end (gamma, e, f, beta into the
     * buffer of cc's parity), so no warp waits on them at a barrier */
    float graw[2] = {0.f, 0.f}, braw[2] = {0.f, 0.f};
    auto load_gates = [&](int64_t cc) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int i = lane + 32 * h;
            graw[h] = braw[h] = 0.f;
            if (cc * C + i < len) {
                const int64_t tt = start + cc * C + i;
                graw[h] = load_gate(p.g, p.g_bf16, batch * p.g_sb + tt * p.g_st + hv * p.g_sh);
                braw[h] = load_gate(p.beta, p.beta_bf16, batch * p.b_sb + tt * p.b_st + hv * p.b_sh);
            }
        }
    };
    auto finish_gates = [&](int64_t cc) {
        const int nv = (int)min((int64_t)C, len - cc * C);
        float *v4 = vec + 4 * C * (int)(cc & 1);
        float gg[2], bb[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            gg[h] = graw[h], bb[h] = braw[h];
            if (lane + 32 * h < nv) finish_gate_beta(p, hv, gg[h], bb[h]);
            else gg[h] = bb[h] = 0.f;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const float y = __shfl_up_sync(0xffffffffu, gg[h], o);
                if (lane >= o) gg[h] += y;
            }
        }
        gg[1] += __shfl_sync(0xffffffffu, gg[0], 31);
        const float gC = __shfl_sync(0xffffffffu, gg[1], 31);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int i = lane + 32 * h;
            v4[i] = gg[h];
            v4[C + i] = expf(gg[h]);
            v4[2 * C + i] = expf(gC - gg[h]);
            v4[3 * C + i] = bb[h];
        }
    };
    if (c_first < nch && warp == 0) {
        load_gates(c_first);
        finish_gates(c_first);
    }
    if (c_first < nch) {
        const int64_t t0 = c_first * C;
        const int nv = (int)min((int64_t)C, len - t0);
        if (OUT) copy_rows<KD>(Qs, LDQ, qb, p.q_st, t0, nv, tid);
        copy_rows<KD>(Ks, LDQ, kb, p.k_st, t0, nv, tid);
        if (!ident) copy_rows<BV>(Vs, LDV, vb, p.v_st, t0, nv, tid);
        write_st();
    }

    for (int64_t c = c_first; c < nch; c++) {
        const int64_t t0 = c * C;
        const int nvalid = (int)min((int64_t)C, len - t0);
        fqla_cp_async_wait_all();
        __syncthreads(); /* A: q, k, v of chunk c landed; S^T and its gamma, e, f, beta published */

        const float *gam = vec + 4 * C * (int)(c & 1), *ev = gam + C, *fv = ev + C, *bv = fv + C;
        /* q and k split in place, 8 threads a row pair (2 rp, 2 rp + 1), column
         * pairs sub + 8 m, with their l2norm sums; and diag(f rk) K
         * transposed into Kt (its pairs along the tokens: the state
         * update's B), from the k values kept in registers */
        {
            constexpr int M = KD / 16;
            const int rp = tid >> 3, sub = tid & 7, i0 = 2 * rp;
            float2 kx[M][2];
            float sq0 = 0.f, sq1 = 0.f, sk0 = 0.f, sk1 = 0.f;
#pragma unroll
            for (int m = 0; m < M; m++) {
                const int col = 2 * (sub + 8 * m);
                float *q0 = Qs + i0 * LDQ + col, *q1 = q0 + LDQ, *k0 = Ks + i0 * LDQ + col, *k1 = k0 + LDQ;
                kx[m][0] = *reinterpret_cast<const float2 *>(k0);
                kx[m][1] = *reinterpret_cast<const float2 *>(k1);
                if (OUT) {
                    const float2 a0 = *reinterpret_cast<const float2 *>(q0), a1 = *reinterpret_cast<const float2 *>(q1);
                    sq0 = fmaf(a0.x, a0.x, fmaf(a0.y, a0.y, sq0));
                    sq1 = fmaf(a1.x, a1.x, fmaf(a1.y, a1.y, sq1));
                    *reinterpret_cast<uint2 *>(q0) = fqla_x3_split(a0.x, a0.y);
                    *reinterpret_cast<uint2 *>(q1) = fqla_x3_split(a1.x, a1.y);
                }
                sk0 = fmaf(kx[m][0].x, kx[m][0].x, fmaf(kx[m][0].y, kx[m][0].y, sk0));
                sk1 = fmaf(kx[m][1].x, kx[m][1].x, fmaf(kx[m][1].y, kx[m][1].y, sk1));
                *reinterpret_cast<uint2 *>(k0) = fqla_x3_split(kx[m][0].x, kx[m][0].y);
                *reinterpret_cast<uint2 *>(k1) = fqla_x3_split(kx[m][1].x, kx[m][1].y);
            }
#pragma unroll
            for (int o = 1; o < 8; o <<= 1) {
                if (OUT) {
                    sq0 += __shfl_xor_sync(0xffffffffu, sq0, o);
                    sq1 += __shfl_xor_sync(0xffffffffu, sq1, o);
                }
                sk0 += __shfl_xor_sync(0xffffffffu, sk0, o);
                sk1 += __shfl_xor_sync(0xffffffffu, sk1, o);
            }
            const float rk0 = p.l2norm ? rsqrtf(sk0 + 1e-6f) : 1.f, rk1 = p.l2norm ? rsqrtf(sk1 + 1e-6f) : 1.f;
            if (sub == 0) {
                rq[i0] = p.l2norm ? rsqrtf(sq0 + 1e-6f) : 1.f;
                rq[i0 + 1] = p.l2norm ? rsqrtf(sq1 + 1e-6f) : 1.f;
                rk[i0] = rk0;
                rk[i0 + 1] = rk1;
            }
            const float f0 = fv[i0] * rk0, f1 = fv[i0 + 1] * rk1;
#pragma unroll
            for (int m = 0; m < M; m++) {
                const int col = 2 * (sub + 8 * m);
                *reinterpret_cast<uint2 *>(Kt + col * LDC + i0) = fqla_x3_split(f0 * kx[m][0].x, f1 * kx[m][1].x);
                *reinterpret_cast<uint2 *>(Kt + (col + 1) * LDC + i0) =
                    fqla_x3_split(f0 * kx[m][0].y, f1 * kx[m][1].y);
            }
        }
        __syncthreads(); /* B */

        /* KS, QS (64 x BV) and KK, QK (64 x 64) in one k loop: the A
         * fragments of K and Q serve both */
        float aKS[CNT][4], aQS[CNT][4], aKK[4][4], aQK[4][4];
#pragma unroll
        for (int i = 0; i < CNT; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) aKS[i][e] = aQS[i][e] = 0.f;
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) aKK[i][e] = aQK[i][e] = 0.f;
#pragma unroll 2
        for (int ks = 0; ks < KD / 16; ks++) {
            fqla_x3_a ak, aq;
            fqla_x3_load_a(ak, Ks, LDQ, 16 * mw, 16 * ks, lane);
            if (OUT) fqla_x3_load_a(aq, Qs, LDQ, 16 * mw, 16 * ks, lane);
#pragma unroll
            for (int nt = 0; nt < CNT; nt++) {
                fqla_x3_b b;
                fqla_x3_load_b_nk(b, St, LDQ, 16 * ks, n0 + 8 * nt, lane);
                fqla_x3_mma(aKS[nt], ak, b);
                if (OUT) fqla_x3_mma(aQS[nt], aq, b);
            }
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                if (j0 + 8 * nt > 16 * mw + 15) continue; /* above the diagonal */
                fqla_x3_b b;
                fqla_x3_load_b_nk(b, Ks, LDQ, 16 * ks, j0 + 8 * nt, lane);
                fqla_x3_mma(aKK[nt], ak, b);
                if (OUT) fqla_x3_mma(aQK[nt], aq, b);
            }
        }
        const int r0 = 16 * mw + g, r1 = r0 + 8;
        /* L^T (fp32, zero at and above the diagonal) and P (split) */
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            float pv[4];
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int i = e < 2 ? r0 : r1, j = j0 + 8 * nt + 2 * tq + (e & 1);
                const float G = i >= j ? expf(gam[i] - gam[j]) : 0.f;
                Lt[j * LDC + i] = i > j ? bv[i] * rk[i] * rk[j] * G * aKK[nt][e] : 0.f;
                if (OUT) pv[e] = p.scale * rq[i] * rk[j] * G * aQK[nt][e];
            }
            if (OUT) {
                const int col = j0 + 8 * nt + 2 * tq;
                *reinterpret_cast<uint2 *>(Ps + r0 * LDC + col) = fqla_x3_split(pv[0], pv[1]);
                *reinterpret_cast<uint2 *>(Ps + r1 * LDC + col) = fqla_x3_split(pv[2], pv[3]);
            }
        }
        /* X = diag(beta) (V - diag(e rk) KS), in place of V; O's first term */
        {
            const float u0 = ev[r0] * rk[r0], u1 = ev[r1] * rk[r1];
            const float o0 = OUT ? p.scale * rq[r0] * ev[r0] : 0.f, o1 = OUT ? p.scale * rq[r1] * ev[r1] : 0.f;
            const float b0 = bv[r0], b1 = bv[r1];
#pragma unroll
            for (int nt = 0; nt < CNT; nt++) {
                const int col = n0 + 8 * nt + 2 * tq;
                float2 *x0 = reinterpret_cast<float2 *>(Vs + r0 * LDV + col);
                float2 *x1 = reinterpret_cast<float2 *>(Vs + r1 * LDV + col);
                const bool vz = ident_cols();
                const float2 a = vz ? make_float2(0.f, 0.f) : *x0, b = vz ? make_float2(0.f, 0.f) : *x1;
                *x0 = make_float2(b0 * (a.x - u0 * aKS[nt][0]), b0 * (a.y - u0 * aKS[nt][1]));
                *x1 = make_float2(b1 * (b.x - u1 * aKS[nt][2]), b1 * (b.y - u1 * aKS[nt][3]));
                aQS[nt][0] *= o0;
                aQS[nt][1] *= o0;
                aQS[nt][2] *= o1;
                aQS[nt][3] *= o1;
            }
        }
        __syncthreads(); /* C: L^T, P, X written; Q, K and S^T read for the last time */
        if (c + 1 < nch) {
            const int nv = (int)min((int64_t)C, len - t0 - C);
            if (OUT) copy_rows<KD>(Qs, LDQ, qb, p.q_st, t0 + C, nv, tid);
            copy_rows<KD>(Ks, LDQ, kb, p.k_st, t0 + C, nv, tid);
        }

        /* U = (I + L)^-1 X, one value column per TPC threads, 16-row blocks */
        {
            const int v = tid / TPC, part = tid % TPC;
            float ur[C / TPC]; /* u_j, j = part + TPC m */
#pragma unroll
            for (int b = 0; b < C / 16; b++) {
                float s[16];
#pragma unroll
                for (int i = 0; i < 16; i++) s[i] = 0.f;
                /* the earlier blocks' rows j = part + TPC m */
#pragma unroll
                for (int m = 0; m < 16 * b / TPC; m++) {
                    const float *l = Lt + (m * TPC + part) * LDC + 16 * b;
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        const float4 x = *reinterpret_cast<const float4 *>(l + 4 * q);
                        s[4 * q] = fmaf(x.x, ur[m], s[4 * q]);
                        s[4 * q + 1] = fmaf(x.y, ur[m], s[4 * q + 1]);
                        s[4 * q + 2] = fmaf(x.z, ur[m], s[4 * q + 2]);
                        s[4 * q + 3] = fmaf(x.w, ur[m], s[4 * q + 3]);
                    }
                }
#pragma unroll
                for (int i = 0; i < 16; i++) {
                    if (b > 0) {
#pragma unroll
                        for (int o = 1; o < TPC; o <<= 1) s[i] += __shfl_xor_sync(0xffffffffu, s[i], o);
                    }
                    s[i] = Vs[(16 * b + i) * LDV + v] - s[i];
                }
                /* the block's triangle, column by column */
#pragma unroll
                for (int jj = 0; jj < 15; jj++) {
                    const float *l = Lt + (16 * b + jj) * LDC + 16 * b;
#pragma unroll
                    for (int q = (jj + 1) / 4; q < 4; q++) { /* the 16-byte pieces that hold rows past jj */
                        const float4 x = *reinterpret_cast<const float4 *>(l + 4 * q);
                        const float xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            if (4 * q + e > jj) s[4 * q + e] = fmaf(-xs[e], s[jj], s[4 * q + e]);
                    }
                }
                /* keep this part's u; U^T split, two elements a thread */
#pragma unroll
                for (int jj = 0; jj < 16; jj++)
                    if ((16 * b + jj) % TPC == part) ur[(16 * b + jj) / TPC] = s[jj];
#pragma unroll
                for (int q = 0; q < 8; q++) {
                    if (q % TPC != part) continue; /* TPC = 4: pairs part, part + 4; 8: pair part */
                    const int j = 16 * b + 2 * q;
                    *reinterpret_cast<uint2 *>(Ut + v * LDC + j) = fqla_x3_split(s[2 * q], s[2 * q + 1]);
                }
            }
        }
        __syncthreads(); /* D: U written; X read for the last time */
        if (c + 1 < nch && !ident_cols()) copy_rows<BV>(Vs, LDV, vb, p.v_st, t0 + C, (int)min((int64_t)C, len - t0 - C), tid);
        if (c + 1 < nch && warp == 0) load_gates(c + 1); /* in flight through the O and state products */

        /* O += P U (P lower triangular: k-tiles 0 .. mw) */
        if (OUT) {
#pragma unroll
            for (int kt = 0; kt < 4; kt++) {
                if (kt > mw) break;
                fqla_x3_a a;
                fqla_x3_load_a(a, Ps, LDC, 16 * mw, 16 * kt, lane);
#pragma unroll
                for (int nt = 0; nt < CNT; nt++) {
                    fqla_x3_b b;
                    fqla_x3_load_b_nk(b, Ut, LDC, 16 * kt, n0 + 8 * nt, lane);
                    fqla_x3_mma(aQS[nt], a, b);
                }
            }
#pragma unroll
            for (int nt = 0; nt < CNT; nt++) {
                const int col = n0 + 8 * nt + 2 * tq;
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int r = h ? r1 : r0;
                    if (r >= nvalid) continue;
                    float *o = ob + (t0 + r) * p.o_st + col;
                    if (o_pairs) *reinterpret_cast<float2 *>(o) = make_float2(aQS[nt][2 * h], aQS[nt][2 * h + 1]);
                    else o[0] = aQS[nt][2 * h], o[1] = aQS[nt][2 * h + 1];
                }
            }
        }

        /* S^T = e_C S^T + U^T (diag(f rk) K) */
        {
            const float eC = ev[C - 1];
#pragma unroll
            for (int ni = 0; ni < NTW; ni++)
#pragma unroll
                for (int e = 0; e < 4; e++) S[ni][e] *= eC;
#pragma unroll
            for (int kt = 0; kt < 4; kt++) {
                fqla_x3_a a;
                fqla_x3_load_a(a, Ut, LDC, 16 * smt, 16 * kt, lane);
#pragma unroll
                for (int ni = 0; ni < NTW; ni++) {
                    fqla_x3_b b;
                    fqla_x3_load_b_nk(b, Kt, LDC, 16 * kt, 8 * (snt0 + ni), lane);
                    fqla_x3_mma(S[ni], a, b);
                }
            }
        }
        write_st(); /* St was last read before barrier C */
        /* the next chunk's gamma, e, f, beta into the other parity's
         * buffer (last read in chunk c - 1, before barrier A) */
        if (c + 1 < nch && warp == 0) finish_gates(c + 1);
        /* no barrier here: what the next chunk writes before its barrier A
         * (nothing: its copies were issued after C and D into tiles read
         * before them) and after it (Kt, q, k in place, rq, rk; L^T, P, U^T)
         * is read in this chunk before A */
    }

    /* the final state (the main pass: from a sequence's last segment), or
     * the pre-pass's H | M of the segment */
    if (p.ht) {
        int64_t row = ns;
        if (p.cp_mode == 2) { /* the sequence's final state, from its last segment */
            fqla_fwd_span(p, ns, n, batch, start, len, slot0, last);
            if (!last) return;
            row = n;
        }
#pragma unroll
        for (int ni = 0; ni < NTW; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int v = 16 * smt + g + 8 * (e >> 1), r = 8 * (snt0 + ni) + 2 * tq + (e & 1);
                const int64_t off = fqla_fwd_state_off(row, hv, r, v0 + v, p.ht_sn, p.ht_sh, p.ht_s2, p.ht_v_first);
                if (p.ht_bf16) ((__nv_bfloat16 *)p.ht)[off] = __float2bfloat16_rn(S[ni][e]);
                else ((float *)p.ht)[off] = S[ni][e];
            }
    }
}

/* OUT: the variant that forms o, launched exactly where o is given and the
 * call is not CP's pre-pass (the kernel reads OUT for both); without it
 * (the pre-pass, the final state alone) q is never loaded and Q S, Q K^T, P and P U are not formed
 * (~40 % of a chunk's products at K = 128, 64 columns). */
template <int KD, int BV, bool OUT>
cudaError_t launch(const fqla_fwd_params &p, cudaStream_t stream)
{
    typedef f32_cfg<KD, BV> cfg;
    static fqla_smem_cache cache;
    cudaError_t err = fqla_smem_limit(cache, fwd_chunk_f32_kernel<KD, BV, OUT>, cfg::bytes);
    if (err != cudaSuccess) return err;
    /* rows: sequences or segments; columns: V slices (the pre-pass: and the
     * K transition columns); the TAIL CTAs where o's rows past cu[N] are zeroed */
    const int64_t rows = p.cp_mode ? p.segs : p.N, cols = p.cp_mode == 1 ? p.V + p.K : p.V;
    const dim3 grid((unsigned)(rows * p.HV + (p.varlen && OUT ? TAIL : 0)), (unsigned)(cols / BV));
    return fqla_launch(fwd_chunk_f32_kernel<KD, BV, OUT>, grid, dim3(NT), cfg::bytes, stream, 0, p);
}

template <int KD, int BV>
cudaError_t launch_out(const fqla_fwd_params &p, cudaStream_t stream)
{
    return p.o && p.cp_mode != 1 ? launch<KD, BV, true>(p, stream) : launch<KD, BV, false>(p, stream);
}

} // namespace

cudaError_t fqla_fwd_launch_chunk_f32(const fqla_fwd_params &p, int bv, cudaStream_t stream)
{
    if (p.N * p.HV == 0) return cudaSuccess;
    if (bv == 64 && p.V % 64 != 0) return cudaErrorInvalidValue; /* (then V + K too) */
    if (p.K == 64 && bv == 32) return launch_out<64, 32>(p, stream);
    if (p.K == 64 && bv == 64) return launch_out<64, 64>(p, stream);
    if (p.K == 128 && bv == 32) return launch_out<128, 32>(p, stream);
    if (p.K == 128 && bv == 64) return launch_out<128, 64>(p, stream);
    return cudaErrorInvalidValue;
}
