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
 *   S^T = e_C S^T + U^T diag(f rk) K
 *
 * rq, rk are the in-kernel l2norm's factors (1 without it); the gate and
 * beta are finished here (finish_gate_beta: in-kernel gate, sigmoid,
 * floor), so the kernel needs no prepare kernel and no workspace.
 *
 * Every product runs on mma.sync m16n8k16 in bf16x3: an fp32 operand x is
 * split into hi = bf16(x) and lo = bf16(x - hi), and a b is summed as
 * lo_a hi_b + hi_a lo_b + hi_a hi_b in fp32 (the lo lo term and the split's
 * residue are ~2^-17 of the product: dev/models/fp32_chunked_precision.py
 * puts o at 7e-6 to 1.6e-5). Operands live in shared memory in fp32 and are
 * split as their fragments are loaded.
 *
 * The substitution solves one value column per TPC = 256 / BV threads (4
 * or 8): thread part p sums the terms j = p (mod TPC) of row i, the parts
 * meet by shuffles, and every part then holds u_i.
 *
 * Per chunk five CTA barriers: A (q, k, v landed, S^T published), B (the
 * chunk's gamma, beta and norms), C (L, P, X written), D (U written), E
 * (k read for the last time). The next chunk's q is copied after C, v
 * after D, k after E (cp.async, zero-filled past the sequence end, so
 * padded rows add nothing and NaN rows past cu[N] are never read).
 *
 * Grid: x = (sequence, value head), plus TAIL CTAs that zero o's rows after
 * the last sequence (varlen); y = the V / BV slices. Shared memory (fp32):
 * Q, K, V (then X), S^T, L, P, U^T, and the chunk's per-token factors.
 */
#include "cuda/fwd_common.cuh"
#include "cuda/fwd_prepare_common.cuh" /* load_gate, finish_gate_beta */
#include "cuda/ptx/cp_async.cuh"
#include "cuda/ptx/mma_sync.cuh"

#include <cuda_bf16.h>

namespace {

constexpr int C = FQLA_FWD_CHUNK;
constexpr int NT = FQLA_FWD_THREADS; /* 8 warps */
constexpr int TAIL = 32;             /* CTAs zeroing o's rows after the last sequence */
constexpr int LDC = C + 8;           /* rows of L, P, U^T: 8 mod 32 floats, float2 fragment loads conflict-free */

template <int KD, int BV>
struct f32_cfg {
    static constexpr int LDQ = KD + 8; /* Q, K, S^T rows */
    static constexpr int LDV = BV + 8; /* V / X rows */
    static constexpr int TPC = NT / BV; /* substitution threads per value column */
    static constexpr int MTS = BV / 16; /* S^T m-tiles (value columns) */
    static constexpr int NTW = (KD / 8) * MTS / 8; /* S^T n-tiles per warp */
    static constexpr int CNT = BV / 16; /* n-tiles per warp of the 64 x BV products */
    /* offsets in floats */
    static constexpr int oQ = 0;
    static constexpr int oK = oQ + C * LDQ;
    static constexpr int oV = oK + C * LDQ;
    static constexpr int oS = oV + C * LDV;
    static constexpr int oL = oS + BV * LDQ;
    static constexpr int oP = oL + C * LDC;
    static constexpr int oU = oP + C * LDC;
    static constexpr int oVec = oU + BV * LDC; /* gam, e, f, beta, rq, rk, kf: [64] each */
    static constexpr int floats = oVec + 7 * C;
    static constexpr size_t bytes = (size_t)floats * 4;
    static_assert(bytes <= 227 * 1024, "the plan fits an SM's shared memory");
    static_assert(NTW >= 1 && (KD / 8) * MTS % 8 == 0, "S^T tiles spread over the 8 warps");
    static_assert(LDQ % 4 == 0 && LDV % 4 == 0 && oK % 4 == 0 && oV % 4 == 0, "16-byte rows for cp.async");
};

/* bf16x3 operands: two fp32 values as the bf16 pairs hi and lo. */
__device__ __forceinline__ void split2(float x0, float x1, uint32_t &hi, uint32_t &lo)
{
    const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
    const float2 hf = __bfloat1622float2(h);
    const __nv_bfloat162 l = __floats2bfloat162_rn(x0 - hf.x, x1 - hf.y);
    hi = *reinterpret_cast<const uint32_t *>(&h);
    lo = *reinterpret_cast<const uint32_t *>(&l);
}

struct frag_a {
    uint32_t h[4], l[4];
};
struct frag_b {
    uint32_t h[2], l[2];
};

/* d += a b in bf16x3 (the small terms first). */
__device__ __forceinline__ void mma3(float (&d)[4], const frag_a &a, const frag_b &b)
{
    fqla_mma_m16n8k16_bf16(d, a.l, b.h[0], b.h[1]);
    fqla_mma_m16n8k16_bf16(d, a.h, b.l[0], b.l[1]);
    fqla_mma_m16n8k16_bf16(d, a.h, b.h[0], b.h[1]);
}

/* A fragment (16 x 16) at (m0, k0) of a row-major fp32 [m][k] tile. */
__device__ __forceinline__ void load_a(frag_a &a, const float *base, int ld, int m0, int k0, int lane)
{
    const int g = lane >> 2, t = lane & 3;
    const float *r0 = base + (m0 + g) * ld + k0 + 2 * t, *r1 = r0 + 8 * ld;
    const float2 x0 = *reinterpret_cast<const float2 *>(r0), x1 = *reinterpret_cast<const float2 *>(r1);
    const float2 x2 = *reinterpret_cast<const float2 *>(r0 + 8), x3 = *reinterpret_cast<const float2 *>(r1 + 8);
    split2(x0.x, x0.y, a.h[0], a.l[0]);
    split2(x1.x, x1.y, a.h[1], a.l[1]);
    split2(x2.x, x2.y, a.h[2], a.l[2]);
    split2(x3.x, x3.y, a.h[3], a.l[3]);
}

/* B fragment (16 x 8) at (k0, n0) of B = X^T, X a row-major fp32 [n][k] tile. */
__device__ __forceinline__ void load_b_nk(frag_b &b, const float *base, int ld, int k0, int n0, int lane)
{
    const int g = lane >> 2, t = lane & 3;
    const float *r = base + (n0 + g) * ld + k0 + 2 * t;
    const float2 x0 = *reinterpret_cast<const float2 *>(r), x1 = *reinterpret_cast<const float2 *>(r + 8);
    split2(x0.x, x0.y, b.h[0], b.l[0]);
    split2(x1.x, x1.y, b.h[1], b.l[1]);
}

/* B fragment (16 x 8) at (k0, n0) of B = diag(s) X, X a row-major fp32 [k][n] tile. */
__device__ __forceinline__ void load_b_kn(frag_b &b, const float *base, int ld, const float *s, int k0, int n0,
                                          int lane)
{
    const int g = lane >> 2, t = lane & 3;
    const int k = k0 + 2 * t;
    const float *c = base + n0 + g;
    split2(c[k * ld] * s[k], c[(k + 1) * ld] * s[k + 1], b.h[0], b.l[0]);
    split2(c[(k + 8) * ld] * s[k + 8], c[(k + 9) * ld] * s[k + 9], b.h[1], b.l[1]);
}

/* Copies chunk cc's rows of a tile (q / k: KD columns, v: the CTA's BV
 * columns) into shared memory (ld floats a row), zeros past the sequence
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

template <int KD, int BV>
__global__ void __launch_bounds__(NT, 1) fwd_chunk_f32_kernel(const __grid_constant__ fqla_fwd_params p)
{
    typedef f32_cfg<KD, BV> cfg;
    constexpr int LDQ = cfg::LDQ, LDV = cfg::LDV, TPC = cfg::TPC, CNT = cfg::CNT, NTW = cfg::NTW;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    float *sm = reinterpret_cast<float *>(smem_raw);
    float *Qs = sm + cfg::oQ, *Ks = sm + cfg::oK, *Vs = sm + cfg::oV, *St = sm + cfg::oS;
    float *Ls = sm + cfg::oL, *Ps = sm + cfg::oP, *Ut = sm + cfg::oU;
    float *gam = sm + cfg::oVec, *ev = gam + C, *fv = ev + C, *bv = fv + C, *rq = bv + C, *rk = rq + C, *kf = rk + C;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tq = lane & 3;
    const int64_t chains = p.N * p.HV;
    if ((int64_t)blockIdx.x >= chains) {
        /* o's rows after the last sequence (varlen): exact zeros */
        if (!p.varlen || !p.o || blockIdx.y != 0) return;
        const int64_t end = fqla_fwd_cu(p, p.N), per_row = (int64_t)p.HV * p.V;
        for (int64_t i = ((int64_t)blockIdx.x - chains) * NT + tid; i < (p.T - end) * per_row; i += (int64_t)TAIL * NT) {
            const int64_t t = end + i / per_row, r = i % per_row;
            ((float *)p.o)[t * p.o_st + (r / p.V) * p.o_sh + r % p.V] = 0.f;
        }
        return;
    }
    const int64_t n = blockIdx.x / p.HV;
    const int hv = blockIdx.x % p.HV;
    const int hq = hv / p.group;
    const int v0 = blockIdx.y * BV;

    int64_t batch, start, len, slot0;
    fqla_fwd_seq(p, n, batch, start, len, slot0);
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
            float x = 0.f;
            if (p.h0) {
                const int64_t off = fqla_fwd_state_off(n, hv, r, v0 + v, p.h0_sn, p.h0_sh, p.h0_s2, p.v_first);
                x = p.h0_bf16 ? __bfloat162float(((const __nv_bfloat16 *)p.h0)[off]) : ((const float *)p.h0)[off];
            }
            S[ni][e] = x;
        }
    /* S^T -> St, the B operand of K S and Q S; published by barrier A */
    auto write_st = [&]() {
#pragma unroll
        for (int ni = 0; ni < NTW; ni++) {
            const int v = 16 * smt + g, r = 8 * (snt0 + ni) + 2 * tq;
            *reinterpret_cast<float2 *>(St + v * LDQ + r) = make_float2(S[ni][0], S[ni][1]);
            *reinterpret_cast<float2 *>(St + (v + 8) * LDQ + r) = make_float2(S[ni][2], S[ni][3]);
        }
    };

    const float *qb = (const float *)p.q + batch * p.q_sb + start * p.q_st + hq * p.q_sh;
    const float *kb = (const float *)p.k + batch * p.k_sb + start * p.k_st + hq * p.k_sh;
    const float *vb = (const float *)p.v + batch * p.v_sb + start * p.v_st + hv * p.v_sh + v0;
    float *ob = p.o ? (float *)p.o + batch * p.o_sb + start * p.o_st + hv * p.o_sh + v0 : NULL;

    /* the 64 x BV products: warp w takes rows 16 mw.. and columns n0.. */
    const int mw = warp & 3, n0 = (warp >> 2) * (BV / 2);
    /* the 64 x 64 products: rows 16 mw.., columns j0.. (four n-tiles) */
    const int j0 = (warp >> 2) * 32;

    if (nch > 0) {
        const int nv = (int)min((int64_t)C, len);
        copy_rows<KD>(Qs, LDQ, qb, p.q_st, 0, nv, tid);
        copy_rows<KD>(Ks, LDQ, kb, p.k_st, 0, nv, tid);
        copy_rows<BV>(Vs, LDV, vb, p.v_st, 0, nv, tid);
        write_st();
    }

    for (int64_t c = 0; c < nch; c++) {
        const int64_t t0 = c * C;
        const int nvalid = (int)min((int64_t)C, len - t0);
        fqla_cp_async_wait_all();
        __syncthreads(); /* A: q, k, v of chunk c landed; S^T published */

        /* the chunk's gate and beta (warp 0: tokens lane and lane + 32),
         * gamma by a warp scan; the l2norm factors (4 threads a row) */
        if (warp == 0) {
            float gg[2], bb[2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int i = lane + 32 * h;
                gg[h] = bb[h] = 0.f;
                if (i < nvalid) {
                    const int64_t tt = start + t0 + i;
                    gg[h] = load_gate(p.g, p.g_bf16, batch * p.g_sb + tt * p.g_st + hv * p.g_sh);
                    bb[h] = load_gate(p.beta, p.beta_bf16, batch * p.b_sb + tt * p.b_st + hv * p.b_sh);
                    finish_gate_beta(p, hv, gg[h], bb[h]);
                }
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
                gam[i] = gg[h];
                ev[i] = expf(gg[h]);
                fv[i] = expf(gC - gg[h]);
                bv[i] = bb[h];
            }
        }
        {
            const int i = tid >> 2, part = tid & 3;
            float sq = 0.f, sk = 0.f;
            if (p.l2norm) {
#pragma unroll 4
                for (int k = part; k < KD; k += 4) {
                    const float a = Qs[i * LDQ + k], b = Ks[i * LDQ + k];
                    sq = fmaf(a, a, sq);
                    sk = fmaf(b, b, sk);
                }
                sq += __shfl_xor_sync(0xffffffffu, sq, 1);
                sq += __shfl_xor_sync(0xffffffffu, sq, 2);
                sk += __shfl_xor_sync(0xffffffffu, sk, 1);
                sk += __shfl_xor_sync(0xffffffffu, sk, 2);
            }
            if (part == 0) {
                rq[i] = p.l2norm ? rsqrtf(sq + 1e-6f) : 1.f;
                rk[i] = p.l2norm ? rsqrtf(sk + 1e-6f) : 1.f;
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
            frag_a ak, aq;
            load_a(ak, Ks, LDQ, 16 * mw, 16 * ks, lane);
            load_a(aq, Qs, LDQ, 16 * mw, 16 * ks, lane);
#pragma unroll
            for (int nt = 0; nt < CNT; nt++) {
                frag_b b;
                load_b_nk(b, St, LDQ, 16 * ks, n0 + 8 * nt, lane);
                mma3(aKS[nt], ak, b);
                mma3(aQS[nt], aq, b);
            }
#pragma unroll
            for (int nt = 0; nt < 4; nt++) {
                if (j0 + 8 * nt > 16 * mw + 15) continue; /* above the diagonal */
                frag_b b;
                load_b_nk(b, Ks, LDQ, 16 * ks, j0 + 8 * nt, lane);
                mma3(aKK[nt], ak, b);
                mma3(aQK[nt], aq, b);
            }
        }
        const int r0 = 16 * mw + g, r1 = r0 + 8;
        /* L and P */
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int i = e < 2 ? r0 : r1, j = j0 + 8 * nt + 2 * tq + (e & 1);
                const float G = i >= j ? expf(gam[i] - gam[j]) : 0.f;
                const float kk = rk[i] * rk[j] * G * aKK[nt][e];
                Ls[i * LDC + j] = i > j ? bv[i] * kk : 0.f;
                Ps[i * LDC + j] = p.scale * rq[i] * rk[j] * G * aQK[nt][e];
            }
        /* X = diag(beta) (V - diag(e rk) KS), in place of V; O's first term */
        {
            const float u0 = ev[r0] * rk[r0], u1 = ev[r1] * rk[r1];
            const float o0 = p.scale * rq[r0] * ev[r0], o1 = p.scale * rq[r1] * ev[r1];
            const float b0 = bv[r0], b1 = bv[r1];
#pragma unroll
            for (int nt = 0; nt < CNT; nt++) {
                const int col = n0 + 8 * nt + 2 * tq;
                float2 *x0 = reinterpret_cast<float2 *>(Vs + r0 * LDV + col);
                float2 *x1 = reinterpret_cast<float2 *>(Vs + r1 * LDV + col);
                const float2 a = *x0, b = *x1;
                *x0 = make_float2(b0 * (a.x - u0 * aKS[nt][0]), b0 * (a.y - u0 * aKS[nt][1]));
                *x1 = make_float2(b1 * (b.x - u1 * aKS[nt][2]), b1 * (b.y - u1 * aKS[nt][3]));
                aQS[nt][0] *= o0;
                aQS[nt][1] *= o0;
                aQS[nt][2] *= o1;
                aQS[nt][3] *= o1;
            }
        }
        if (tid < C) kf[tid] = fv[tid] * rk[tid];
        __syncthreads(); /* C: L, P, X, kf written; Q and S^T read for the last time */
        if (c + 1 < nch) copy_rows<KD>(Qs, LDQ, qb, p.q_st, t0 + C, (int)min((int64_t)C, len - t0 - C), tid);

        /* U = (I + L)^-1 X, one value column per TPC threads */
        {
            const int v = tid / TPC, part = tid % TPC;
            float ur[C / TPC];
#pragma unroll
            for (int m = 0; m < C / TPC; m++) ur[m] = 0.f;
#pragma unroll
            for (int i = 0; i < C; i++) {
                float s = 0.f;
#pragma unroll
                for (int m = 0; m < C / TPC; m++)
                    if (m * TPC < i) s = fmaf(Ls[i * LDC + m * TPC + part], ur[m], s);
#pragma unroll
                for (int o = 1; o < TPC; o <<= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
                const float u = Vs[i * LDV + v] - s;
                if (part == i % TPC) {
                    ur[i / TPC] = u;
                    Ut[v * LDC + i] = u;
                }
            }
        }
        __syncthreads(); /* D: U written; X read for the last time */
        if (c + 1 < nch) copy_rows<BV>(Vs, LDV, vb, p.v_st, t0 + C, (int)min((int64_t)C, len - t0 - C), tid);

        /* O += P U (P lower triangular: k-tiles 0 .. mw) */
        if (ob) {
#pragma unroll
            for (int kt = 0; kt < 4; kt++) {
                if (kt > mw) break;
                frag_a a;
                load_a(a, Ps, LDC, 16 * mw, 16 * kt, lane);
#pragma unroll
                for (int nt = 0; nt < CNT; nt++) {
                    frag_b b;
                    load_b_nk(b, Ut, LDC, 16 * kt, n0 + 8 * nt, lane);
                    mma3(aQS[nt], a, b);
                }
            }
#pragma unroll
            for (int nt = 0; nt < CNT; nt++) {
                const int col = n0 + 8 * nt + 2 * tq;
                if (r0 < nvalid) {
                    ob[(t0 + r0) * p.o_st + col] = aQS[nt][0];
                    ob[(t0 + r0) * p.o_st + col + 1] = aQS[nt][1];
                }
                if (r1 < nvalid) {
                    ob[(t0 + r1) * p.o_st + col] = aQS[nt][2];
                    ob[(t0 + r1) * p.o_st + col + 1] = aQS[nt][3];
                }
            }
        }

        /* S^T = e_C S^T + U^T diag(f rk) K */
        {
            const float eC = ev[C - 1];
#pragma unroll
            for (int ni = 0; ni < NTW; ni++)
#pragma unroll
                for (int e = 0; e < 4; e++) S[ni][e] *= eC;
#pragma unroll
            for (int kt = 0; kt < 4; kt++) {
                frag_a a;
                load_a(a, Ut, LDC, 16 * smt, 16 * kt, lane);
#pragma unroll
                for (int ni = 0; ni < NTW; ni++) {
                    frag_b b;
                    load_b_kn(b, Ks, LDQ, kf, 16 * kt, 8 * (snt0 + ni), lane);
                    mma3(S[ni], a, b);
                }
            }
        }
        write_st();     /* St was last read before barrier C */
        __syncthreads(); /* E: K read for the last time */
        if (c + 1 < nch) copy_rows<KD>(Ks, LDQ, kb, p.k_st, t0 + C, (int)min((int64_t)C, len - t0 - C), tid);
    }

    if (p.ht) {
#pragma unroll
        for (int ni = 0; ni < NTW; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int v = 16 * smt + g + 8 * (e >> 1), r = 8 * (snt0 + ni) + 2 * tq + (e & 1);
                const int64_t off = fqla_fwd_state_off(n, hv, r, v0 + v, p.ht_sn, p.ht_sh, p.ht_s2, p.ht_v_first);
                if (p.ht_bf16) ((__nv_bfloat16 *)p.ht)[off] = __float2bfloat16_rn(S[ni][e]);
                else ((float *)p.ht)[off] = S[ni][e];
            }
    }
}

template <int KD, int BV>
cudaError_t launch(const fqla_fwd_params &p, cudaStream_t stream)
{
    typedef f32_cfg<KD, BV> cfg;
    static fqla_smem_cache cache;
    cudaError_t err = fqla_smem_limit(cache, fwd_chunk_f32_kernel<KD, BV>, cfg::bytes);
    if (err != cudaSuccess) return err;
    const dim3 grid((unsigned)(p.N * p.HV + (p.varlen && p.o ? TAIL : 0)), (unsigned)(p.V / BV));
    return fqla_launch(fwd_chunk_f32_kernel<KD, BV>, grid, dim3(NT), cfg::bytes, stream, 0, p);
}

} // namespace

cudaError_t fqla_fwd_launch_chunk_f32(const fqla_fwd_params &p, int bv, cudaStream_t stream)
{
    if (p.N * p.HV == 0) return cudaSuccess;
    if (bv == 64 && p.V % 64 != 0) return cudaErrorInvalidValue;
    if (p.K == 64 && bv == 32) return launch<64, 32>(p, stream);
    if (p.K == 64 && bv == 64) return launch<64, 64>(p, stream);
    if (p.K == 128 && bv == 32) return launch<128, 32>(p, stream);
    if (p.K == 128 && bv == 64) return launch<128, 64>(p, stream);
    return cudaErrorInvalidValue;
}
