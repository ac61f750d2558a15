/*
 * fwd_chunk.cu - the forward's sequential kernel on mma.sync (the path
 * beside fwd_chunk_wg.cu's TMA + wgmma kernel; docs/design.md, CUDA). One
 * CTA per (sequence, value head, V slice of BV columns) walks the
 * sequence's chunks in order with the fp32 state slice S (K x BV) in
 * registers:
 *
 *   U  = K S,  Qs = Q S                      (S rounded to the io dtype)
 *   W  = V - diag(e^gamma rk) U              -> shared, io dtype
 *   O  = diag(scale rq e^gamma) Qs           (registers)
 *   Vd = Ag W                                -> shared (Ag from the prepare kernel)
 *   O += Pg Vd                               -> shared, stored to o one chunk later
 *   S  = e^gamma_C S + K^T diag(e^(gamma_C - gamma) rk) Vd
 *
 * rq, rk are the l2norm factors (1 without use_qk_l2norm): K^T diag(rk) is the
 * normalised K^T, so q and k are never rewritten. Products are mma.sync
 * m16n8k16 with fp32 accumulation; the next chunk's tiles (Q, K, V, Ag, Pg,
 * gamma, rq, rk) stream in with cp.async while the current one computes.
 * Rows past the sequence end load as zeros, so they add nothing to S.
 *
 * Grid: x = (sequence, value head), y = the V / BV slices. Block: 256
 * threads, eight warps, all in every product (no producer warps): for the
 * chunk-row products (U, Qs, W, Vd, O) warp w takes 16 rows (mw) and BV / 2
 * columns; for the state, its fragments (chunk_cfg: WM warps along K, SMT
 * m-tiles, SNT n-tiles each). With LATE (the default is
 * FQLA_FWD_LATE_LOADS) the next chunk's copies (chunk_load) and the
 * previous chunk's output stores (chunk_store_out) are issued after
 * barrier C by the four warps whose triangular Ag W share is smallest, off
 * the chain, instead of by every warp after A. Registers: one CTA per SM
 * (__launch_bounds__(256, 1)); ptxas takes 119 to 201 per thread, no
 * spills.
 *
 * Per chunk, three CTA barriers (no named barriers): A (chunk landed, S
 * published as Sb), C (W written), D (Vd, Vp written). After D, the O
 * product Pg Vd and the state update K^T Vp run in one loop
 * (chunk_o_state): they are independent mma chains, so each hides the
 * other's latency.
 *
 * Shared memory (chunk_cfg::smem): the chunk's tiles double-buffered
 * (buffer c % 2 for chunk c, by fqla_pipe), then Sb, W, Vd, Vp and the
 * output rows O, then gamma, rq, rk per buffer.
 */
#include "cuda/fwd_common.cuh"
#include "cuda/kernel/io.cuh"
#include "cuda/kernel/mma_frag.cuh"
#include "cuda/kernel/pipeline.cuh"
#include "cuda/ptx/cp_async.cuh"

#include <stddef.h>

namespace {

constexpr int C = FQLA_FWD_CHUNK;
constexpr int LDA = C + 8; /* Ag, Pg rows */

template <int KD, int BV>
struct chunk_cfg {
    static constexpr int LDQ = KD + 8;
    static constexpr int LDV = BV + 8;
    /* The shared-memory plan: the chunk's tiles double-buffered (buffer
     * c % 2 for chunk c: the next chunk's copies land while this one
     * computes), then the per-chunk products, then the fp32 row factors.
     * b16: one bf16 / fp16 element (T). */
    typedef unsigned short b16;
    struct smem {
        b16 q[2][C][LDQ];
        b16 k[2][C][LDQ];
        b16 v[2][C][LDV];  /* the CTA's BV columns of V */
        b16 ag[2][C][LDA]; /* Ag, unpacked (zeros right of each strip) */
        b16 pg[2][C][LDA];
        b16 sb[KD][LDV];   /* S in the io dtype: the B operand of K S and Q S */
        b16 w[C][LDV];     /* W = V - diag(e^gamma rk) K S */
        b16 vd[C][LDV];    /* Vd = Ag W */
        b16 vp[C][LDV];    /* Vp = diag(e^(gamma_C - gamma) rk) Vd */
        b16 o[C][LDV];     /* the chunk's output rows, stored one chunk later */
        float gam[2][C], rq[2][C], rk[2][C];
    };
    /* element offsets (b16 units) of the tiles, as the kernel indexes them */
    static constexpr int oQ = offsetof(smem, q) / 2;
    static constexpr int oK = offsetof(smem, k) / 2;
    static constexpr int oV = offsetof(smem, v) / 2;
    static constexpr int oAg = offsetof(smem, ag) / 2;
    static constexpr int oPg = offsetof(smem, pg) / 2;
    static constexpr int oSb = offsetof(smem, sb) / 2;
    static constexpr int oW = offsetof(smem, w) / 2;
    static constexpr int oVd = offsetof(smem, vd) / 2;
    static constexpr int oVp = offsetof(smem, vp) / 2;
    static constexpr int oO = offsetof(smem, o) / 2;
    static constexpr int oEnd = offsetof(smem, gam) / 2;
    static constexpr size_t bytes = sizeof(smem);
    static_assert(oEnd == offsetof(smem, o) / 2 + C * LDV && bytes == (size_t)oEnd * 2 + 6 * C * sizeof(float),
                  "no padding in the plan");
    static_assert(LDQ % 8 == 0 && LDV % 8 == 0 && LDA % 8 == 0 && offsetof(smem, k) % 16 == 0 &&
                      offsetof(smem, v) % 16 == 0 && offsetof(smem, ag) % 16 == 0 && offsetof(smem, pg) % 16 == 0 &&
                      offsetof(smem, sb) % 16 == 0 && offsetof(smem, w) % 16 == 0 && offsetof(smem, gam) % 16 == 0,
                  "cp.async and ldmatrix: 16-byte aligned rows");
    static_assert(bytes <= 227 * 1024, "the plan fits an SM's shared memory");
    /* state fragments: warps along m (WM), m-tiles per warp (SMT), n-tiles per warp (SNT) */
    static constexpr int MT = KD / 16;
    static constexpr int SMT = MT >= 8 ? MT / 8 : 1;
    static constexpr int WM = MT >= 8 ? 8 : MT;
    static constexpr int SNW = 8 / WM;
    static constexpr int SNT = (BV / 8) / SNW;
    /* chunk-row products (64 x BV): n-tiles per warp */
    static constexpr int CNT = BV / 16;
    static_assert(SNT % 2 == 0 && CNT % 2 == 0, "n-tiles come in pairs");
};

/* Issues the cp.async copies of chunk cc (its first token start + 64 cc;
 * rows past len read as zeros) into buffer b of the plan: Q and K rows,
 * the CTA's V columns, Ag (unpacked from its strips) and Pg, gamma, and
 * with l2norm rq, rk; spread over threads lt = 0 .. nt - 1 (nt >= 48), one
 * commit group. */
template <typename T, int KD, int BV>
__device__ __forceinline__ void chunk_load(const fqla_fwd_params &p, T *Qs, T *Ks, T *Vs, T *Ags, T *Pgs, float *gam,
                                           float *rqs, float *rks, const T *qb, const T *kb, const T *vb,
                                           int64_t start, int64_t len, int64_t slot0, int hv, int hq, int64_t cc,
                                           int b, int lt, int nt)
{
    typedef chunk_cfg<KD, BV> cfg;
    constexpr int LDQ = cfg::LDQ, LDV = cfg::LDV;
    const int64_t t0 = start + cc * C;
    const int nvalid = (int)min((int64_t)C, len - cc * C);
    constexpr int VQ = KD / 8;
    for (int idx = lt; idx < C * VQ; idx += nt) {
        int i = idx / VQ, cv = idx % VQ;
        int ok = i < nvalid;
        int64_t t = t0 + (ok ? i : 0);
        fqla_cp_async16(Qs + (b * C + i) * LDQ + cv * 8, qb + t * p.q_st + cv * 8, ok ? 16 : 0);
        fqla_cp_async16(Ks + (b * C + i) * LDQ + cv * 8, kb + t * p.k_st + cv * 8, ok ? 16 : 0);
    }
    constexpr int VV = BV / 8;
    for (int idx = lt; idx < C * VV; idx += nt) {
        int i = idx / VV, cv = idx % VV;
        int ok = i < nvalid;
        int64_t t = t0 + (ok ? i : 0);
        fqla_cp_async16(Vs + (b * C + i) * LDV + cv * 8, vb + t * p.v_st + cv * 8, ok ? 16 : 0);
    }
    const int64_t ti = (slot0 + cc) * p.HV + hv;
    const T *pg = (const T *)p.Pg + ti * C * C;
    for (int idx = lt; idx < C * 8; idx += nt) {
        int i = idx >> 3, cv = idx & 7;
        /* Ag's packed strips (fwd_common.cuh): zeros past the strip's width */
        const int in = cv * 8 < fqla_fwd_ag_width(i >> 4);
        const T *ag = (const T *)p.Ag + fqla_fwd_ag_row(p.slots * p.HV, ti, i);
        fqla_cp_async16(Ags + (b * C + i) * LDA + cv * 8, ag + (in ? cv * 8 : 0), in ? 16 : 0);
        fqla_cp_async16(Pgs + (b * C + i) * LDA + cv * 8, pg + i * C + cv * 8, 16);
    }
    if (lt < 16) {
        const float *src = p.gam + ((size_t)(slot0 + cc) * p.HV + hv) * C;
        fqla_cp_async16(gam + b * C + lt * 4, src + lt * 4, 16);
    } else if (p.l2norm && lt < 48) {
        int j = lt & 15;
        const float *src = (lt < 32 ? p.rq : p.rk) + ((size_t)(slot0 + cc) * p.H + hq) * C;
        fqla_cp_async16((lt < 32 ? rqs : rks) + b * C + j * 4, src + j * 4, 16);
    }
    fqla_cp_async_commit();
}

/* Stores chunk cc's output rows from Os to o (threads lt = 0 .. nt - 1). */
template <typename T, int KD, int BV>
__device__ __forceinline__ void chunk_store_out(const fqla_fwd_params &p, const T *Os, T *ob, int64_t start,
                                                int64_t len, int64_t cc, int lt, int nt)
{
    typedef chunk_cfg<KD, BV> cfg;
    constexpr int LDV = cfg::LDV;
    const int64_t t0 = start + cc * C;
    const int nvalid = (int)min((int64_t)C, len - cc * C);
    constexpr int VV = BV / 8;
    for (int idx = lt; idx < nvalid * VV; idx += nt) {
        int i = idx / VV, cv = idx % VV;
        *reinterpret_cast<uint4 *>(ob + (t0 + i) * p.o_st + cv * 8) =
            *reinterpret_cast<const uint4 *>(Os + i * LDV + cv * 8);
    }
}

/* S -> Sb (io dtype), the B operand of K S and Q S: the thread's state
 * fragments (rows 16 (sm0 + mi) + g (+ 8), columns sn0 + 8 ni + 2 tq, + 1) */
template <typename T, int KD, int BV>
__device__ __forceinline__ void chunk_write_sb(T *Sb,
                                               const float (&S)[chunk_cfg<KD, BV>::SMT][chunk_cfg<KD, BV>::SNT][4],
                                               int sm0, int sn0, int g, int tq)
{
    typedef fqla_io<T> io;
    typedef chunk_cfg<KD, BV> cfg;
    constexpr int LDV = cfg::LDV;
#pragma unroll
    for (int mi = 0; mi < cfg::SMT; mi++)
#pragma unroll
        for (int ni = 0; ni < cfg::SNT; ni++) {
            int row = 16 * (sm0 + mi) + g, col = sn0 + 8 * ni + 2 * tq;
            *reinterpret_cast<uint32_t *>(Sb + row * LDV + col) = io::pack(S[mi][ni][0], S[mi][ni][1]);
            *reinterpret_cast<uint32_t *>(Sb + (row + 8) * LDV + col) = io::pack(S[mi][ni][2], S[mi][ni][3]);
        }
}

/* U = K S and Qs = Q S (accumulating into accU, accO): the warp's 16 rows
 * 16 mw.. and its columns n0.. of the chunk's K and Q tiles (Kc, Qc)
 * against Sb */
template <typename T, int KD, int BV>
__device__ __forceinline__ void chunk_ks_qs(float (&accU)[chunk_cfg<KD, BV>::CNT][4],
                                            float (&accO)[chunk_cfg<KD, BV>::CNT][4], const T *Kc, const T *Qc,
                                            const T *Sb, int mw, int n0, int lane)
{
    typedef fqla_io<T> io;
    typedef chunk_cfg<KD, BV> cfg;
    constexpr int LDQ = cfg::LDQ, LDV = cfg::LDV;
#pragma unroll 4
    for (int ks = 0; ks < KD / 16; ks++) {
        uint32_t ak[4], aq[4];
        fqla_frag_a(ak, Kc, LDQ, 16 * mw, 16 * ks, lane);
        fqla_frag_a(aq, Qc, LDQ, 16 * mw, 16 * ks, lane);
#pragma unroll
        for (int np = 0; np < cfg::CNT / 2; np++) {
            uint32_t bb[4];
            fqla_frag_b_kn(bb, Sb, LDV, 16 * ks, n0 + 16 * np, lane);
            io::mma(accU[2 * np], ak, bb[0], bb[1]);
            io::mma(accU[2 * np + 1], ak, bb[2], bb[3]);
            io::mma(accO[2 * np], aq, bb[0], bb[1]);
            io::mma(accO[2 * np + 1], aq, bb[2], bb[3]);
        }
    }
}

/* the thread's state fragments from h0 (or zeros): rows 16 (sm0 + mi) + g
 * (+ 8), columns v0 + sn0 + 8 ni + 2 tq (+ 1) */
template <typename T, int KD, int BV>
__device__ __forceinline__ void chunk_init_state(const fqla_fwd_params &p,
                                                 float (&S)[chunk_cfg<KD, BV>::SMT][chunk_cfg<KD, BV>::SNT][4],
                                                 int64_t n, int hv, int v0, int sm0, int sn0, int g, int tq)
{
    typedef chunk_cfg<KD, BV> cfg;
#pragma unroll
    for (int mi = 0; mi < cfg::SMT; mi++)
#pragma unroll
        for (int ni = 0; ni < cfg::SNT; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float x = 0.f;
                if (p.h0) {
                    int row = 16 * (sm0 + mi) + g + 8 * (e >> 1);
                    int col = v0 + sn0 + 8 * ni + 2 * tq + (e & 1);
                    int64_t off = n * p.h0_sn + hv * p.h0_sh +
                                  (p.v_first ? (int64_t)col * p.h0_s2 + row : (int64_t)row * p.h0_s2 + col);
                    x = p.h0_bf16 ? __bfloat162float(((const __nv_bfloat16 *)p.h0)[off])
                                  : ((const float *)p.h0)[off];
                }
                S[mi][ni][e] = x;
            }
}

/* O += Pg Vd (Pg lower triangular: k-blocks 0..mw) and S += K^T Vp,
 * interleaved per k-block: two independent mma chains; then O to Os */
template <typename T, int KD, int BV>
__device__ __forceinline__ void chunk_o_state(float (&S)[chunk_cfg<KD, BV>::SMT][chunk_cfg<KD, BV>::SNT][4],
                                              float (&accO)[chunk_cfg<KD, BV>::CNT][4], T *Os, const T *Pc,
                                              const T *Kc, const T *Vds, const T *Vps, int mw, int sm0, int sn0,
                                              int r0, int r1, int n0, int tq, int lane)
{
    typedef fqla_io<T> io;
    typedef chunk_cfg<KD, BV> cfg;
    constexpr int LDQ = cfg::LDQ, LDV = cfg::LDV;
#pragma unroll
    for (int ks = 0; ks < C / 16; ks++) {
        if (ks <= mw) {
            uint32_t a[4];
            fqla_frag_a(a, Pc, LDA, 16 * mw, 16 * ks, lane);
#pragma unroll
            for (int np = 0; np < cfg::CNT / 2; np++) {
                uint32_t bb[4];
                fqla_frag_b_kn(bb, Vds, LDV, 16 * ks, n0 + 16 * np, lane);
                io::mma(accO[2 * np], a, bb[0], bb[1]);
                io::mma(accO[2 * np + 1], a, bb[2], bb[3]);
            }
        }
        uint32_t a[cfg::SMT][4];
#pragma unroll
        for (int mi = 0; mi < cfg::SMT; mi++)
            fqla_frag_a_t(a[mi], Kc, LDQ, 16 * (sm0 + mi), 16 * ks, lane);
#pragma unroll
        for (int np = 0; np < cfg::SNT / 2; np++) {
            uint32_t bb[4];
            fqla_frag_b_kn(bb, Vps, LDV, 16 * ks, sn0 + 16 * np, lane);
#pragma unroll
            for (int mi = 0; mi < cfg::SMT; mi++) {
                io::mma(S[mi][2 * np], a[mi], bb[0], bb[1]);
                io::mma(S[mi][2 * np + 1], a[mi], bb[2], bb[3]);
            }
        }
    }
#pragma unroll
    for (int nt = 0; nt < cfg::CNT; nt++) {
        int col = n0 + 8 * nt + 2 * tq;
        *reinterpret_cast<uint32_t *>(Os + r0 * LDV + col) = io::pack(accO[nt][0], accO[nt][1]);
        *reinterpret_cast<uint32_t *>(Os + r1 * LDV + col) = io::pack(accO[nt][2], accO[nt][3]);
    }
}

/* the final state S (fp32 fragments) to ht */
template <typename T, int KD, int BV>
__device__ __forceinline__ void chunk_store_state(const fqla_fwd_params &p,
                                                  const float (&S)[chunk_cfg<KD, BV>::SMT][chunk_cfg<KD, BV>::SNT][4],
                                                  int64_t n, int hv, int v0, int sm0, int sn0, int g, int tq)
{
    typedef chunk_cfg<KD, BV> cfg;
#pragma unroll
    for (int mi = 0; mi < cfg::SMT; mi++)
#pragma unroll
        for (int ni = 0; ni < cfg::SNT; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int row = 16 * (sm0 + mi) + g + 8 * (e >> 1);
                int col = v0 + sn0 + 8 * ni + 2 * tq + (e & 1);
                int64_t off = n * p.ht_sn + hv * p.ht_sh +
                              (p.ht_v_first ? (int64_t)col * p.ht_s2 + row : (int64_t)row * p.ht_s2 + col);
                if (p.ht_bf16) ((__nv_bfloat16 *)p.ht)[off] = __float2bfloat16_rn(S[mi][ni][e]);
                else ((float *)p.ht)[off] = S[mi][ni][e];
            }
}

template <typename T, int KD, int BV, bool LATE>
__global__ void __launch_bounds__(FQLA_FWD_THREADS, 1) fwd_chunk_kernel(const fqla_fwd_params p)
{
    typedef fqla_io<T> io;
    typedef chunk_cfg<KD, BV> cfg;
    constexpr int LDQ = cfg::LDQ, LDV = cfg::LDV;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    T *sm = reinterpret_cast<T *>(smem_raw);
    T *Qs = sm + cfg::oQ, *Ks = sm + cfg::oK, *Vs = sm + cfg::oV;
    T *Ags = sm + cfg::oAg, *Pgs = sm + cfg::oPg;
    T *Sb = sm + cfg::oSb, *Ws = sm + cfg::oW, *Vds = sm + cfg::oVd, *Vps = sm + cfg::oVp, *Os = sm + cfg::oO;
    float *gam = reinterpret_cast<float *>(sm + cfg::oEnd); /* [2][64] */
    float *rqs = gam + 2 * C;                                /* [2][64] */
    float *rks = rqs + 2 * C;                                /* [2][64] */

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, tq = lane & 3;
    const int64_t n = blockIdx.x / p.HV;
    const int hv = blockIdx.x % p.HV;
    const int hq = hv / p.group;
    const int v0 = blockIdx.y * BV;

    int64_t batch, start, len, slot0;
    fqla_fwd_seq(p, n, batch, start, len, slot0);
    const int64_t nch = (len + C - 1) / C;

    /* state fragments */
    const int sm0 = (warp % cfg::WM) * cfg::SMT;
    const int sn0 = (warp / cfg::WM) * cfg::SNT * 8;
    float S[cfg::SMT][cfg::SNT][4];
    chunk_init_state<T, KD, BV>(p, S, n, hv, v0, sm0, sn0, g, tq);

    /* chunk-row product mapping: warp -> 16 rows (mw), BV/2 columns (n0).
     * mw pairs 0/3 and 1/2 share an SM sub-partition (warps w and w + 4), so
     * the triangular products Ag W and Pg Vd load every partition evenly. */
    const int mw = warp < 4 ? warp : 7 - warp;
    const int n0 = (warp >> 2) * (BV / 2);
    const int r0 = 16 * mw + g, r1 = r0 + 8;

    const T *qb = (const T *)p.q + batch * p.q_sb + hq * p.q_sh;
    const T *kb = (const T *)p.k + batch * p.k_sb + hq * p.k_sh;
    const T *vb = (const T *)p.v + batch * p.v_sb + hv * p.v_sh + v0;
    T *ob = (T *)p.o + batch * p.o_sb + hv * p.o_sh + v0;

    if (!p.l2norm && tid < 2 * C) {
        rqs[tid] = 1.f;
        rks[tid] = 1.f;
    }

    /* Issues the cp.async loads of chunk cc into buffer b, spread over
     * threads lt = 0 .. nt - 1 (nt >= 48). */
    auto load_chunk = [&](int64_t cc, int b, int lt, int nt) {
        chunk_load<T, KD, BV>(p, Qs, Ks, Vs, Ags, Pgs, gam, rqs, rks, qb, kb, vb, start, len, slot0, hv, hq, cc, b, lt,
                              nt);
    };

    /* Stores chunk cc's output rows from Os (threads lt = 0 .. nt - 1). */
    auto store_out = [&](int64_t cc, int lt, int nt) { chunk_store_out<T, KD, BV>(p, Os, ob, start, len, cc, lt, nt); };

    /* S -> Sb (io dtype), the B operand of K S and Q S. Written after the
     * chunk's last product, published by the next iteration's barrier. */
    auto write_sb = [&]() { chunk_write_sb<T, KD, BV>(Sb, S, sm0, sn0, g, tq); };

    if (nch > 0) {
        load_chunk(0, 0, tid, FQLA_FWD_THREADS);
        write_sb();
    }
    /* LATE: the copy warps are those with mw <= 1, one per SM sub-partition
     * (warps w and w + 4 share one) */
    const bool copier = mw <= 1;
    const int ctid = (warp & 3) * 32 + lane; /* warps 0, 1, 6, 7 -> 0 .. 127 */

    for (int64_t c = 0; c < nch; c++) {
        const int b = fqla_pipe<2>::at(c).stage; /* chunk c's buffer; b ^ 1 the next chunk's */
        fqla_cp_async_wait_all();
        __syncthreads(); /* A: chunk c and Sb landed; iteration c - 1 finished everywhere */
        if (!LATE) {
            if (c + 1 < nch) load_chunk(c + 1, b ^ 1, tid, FQLA_FWD_THREADS);
            if (c > 0) store_out(c - 1, tid, FQLA_FWD_THREADS);
        }

        const T *Qc = Qs + b * C * LDQ, *Kc = Ks + b * C * LDQ, *Vc = Vs + b * C * LDV;
        const float *gm = gam + b * C, *rq = rqs + b * C, *rk = rks + b * C;
        const float gC = gm[C - 1];
        /* S was published as Sb last iteration: decay it now, off the chain */
        {
            const float eC = __expf(gC);
#pragma unroll
            for (int mi = 0; mi < cfg::SMT; mi++)
#pragma unroll
                for (int ni = 0; ni < cfg::SNT; ni++)
#pragma unroll
                    for (int e = 0; e < 4; e++) S[mi][ni][e] *= eC;
        }

        /* U = K S and Qs = Q S */
        float accU[cfg::CNT][4], accO[cfg::CNT][4];
#pragma unroll
        for (int i = 0; i < cfg::CNT; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) accU[i][e] = accO[i][e] = 0.f;
        chunk_ks_qs<T, KD, BV>(accU, accO, Kc, Qc, Sb, mw, n0, lane);
        {
            const float e0 = __expf(gm[r0]), e1 = __expf(gm[r1]);
            const float u0 = e0 * rk[r0], u1 = e1 * rk[r1];
            const float o0 = p.scale * rq[r0] * e0, o1 = p.scale * rq[r1] * e1;
#pragma unroll
            for (int nt = 0; nt < cfg::CNT; nt++) {
                int col = n0 + 8 * nt + 2 * tq;
                float2 va = io::unpack(*reinterpret_cast<const uint32_t *>(Vc + r0 * LDV + col));
                float2 vb2 = io::unpack(*reinterpret_cast<const uint32_t *>(Vc + r1 * LDV + col));
                *reinterpret_cast<uint32_t *>(Ws + r0 * LDV + col) =
                    io::pack(va.x - u0 * accU[nt][0], va.y - u0 * accU[nt][1]);
                *reinterpret_cast<uint32_t *>(Ws + r1 * LDV + col) =
                    io::pack(vb2.x - u1 * accU[nt][2], vb2.y - u1 * accU[nt][3]);
                accO[nt][0] *= o0;
                accO[nt][1] *= o0;
                accO[nt][2] *= o1;
                accO[nt][3] *= o1;
            }
        }
        __syncthreads(); /* C */

        /* Vd = Ag W (Ag lower triangular: k-blocks 0..mw) */
        {
            const T *Ac = Ags + b * C * LDA;
            float accV[cfg::CNT][4];
#pragma unroll
            for (int i = 0; i < cfg::CNT; i++)
#pragma unroll
                for (int e = 0; e < 4; e++) accV[i][e] = 0.f;
#pragma unroll
            for (int ks = 0; ks < 4; ks++) {
                if (ks > mw) break;
                uint32_t a[4];
                fqla_frag_a(a, Ac, LDA, 16 * mw, 16 * ks, lane);
#pragma unroll
                for (int np = 0; np < cfg::CNT / 2; np++) {
                    uint32_t bb[4];
                    fqla_frag_b_kn(bb, Ws, LDV, 16 * ks, n0 + 16 * np, lane);
                    io::mma(accV[2 * np], a, bb[0], bb[1]);
                    io::mma(accV[2 * np + 1], a, bb[2], bb[3]);
                }
            }
            const float d0 = __expf(gC - gm[r0]) * rk[r0], d1 = __expf(gC - gm[r1]) * rk[r1];
#pragma unroll
            for (int nt = 0; nt < cfg::CNT; nt++) {
                int col = n0 + 8 * nt + 2 * tq;
                *reinterpret_cast<uint32_t *>(Vds + r0 * LDV + col) = io::pack(accV[nt][0], accV[nt][1]);
                *reinterpret_cast<uint32_t *>(Vds + r1 * LDV + col) = io::pack(accV[nt][2], accV[nt][3]);
                *reinterpret_cast<uint32_t *>(Vps + r0 * LDV + col) =
                    io::pack(d0 * accV[nt][0], d0 * accV[nt][1]);
                *reinterpret_cast<uint32_t *>(Vps + r1 * LDV + col) =
                    io::pack(d1 * accV[nt][2], d1 * accV[nt][3]);
            }
        }
        /* LATE: buffer b ^ 1 was last read in iteration c - 1 (before
         * barrier A); Os is next written after barrier D */
        if (LATE && copier) {
            if (c + 1 < nch) load_chunk(c + 1, b ^ 1, ctid, 128);
            if (c > 0) store_out(c - 1, ctid, 128);
        }
        __syncthreads(); /* D */

        chunk_o_state<T, KD, BV>(S, accO, Os, Pgs + b * C * LDA, Kc, Vds, Vps, mw, sm0, sn0, r0, r1, n0, tq, lane);
        if (c + 1 < nch) write_sb();
    }
    __syncthreads();
    if (nch > 0) store_out(nch - 1, tid, FQLA_FWD_THREADS);

    if (p.ht) chunk_store_state<T, KD, BV>(p, S, n, hv, v0, sm0, sn0, g, tq);
}

template <typename T, int KD, int BV, bool LATE>
cudaError_t launch(const fqla_fwd_params &p, cudaStream_t stream)
{
    typedef chunk_cfg<KD, BV> cfg;
    static fqla_smem_cache cache;
    cudaError_t err = fqla_smem_limit(cache, fwd_chunk_kernel<T, KD, BV, LATE>, cfg::bytes);
    if (err != cudaSuccess) return err;
    dim3 grid((unsigned)(p.N * p.HV), (unsigned)(p.V / BV));
    return fqla_launch(fwd_chunk_kernel<T, KD, BV, LATE>, grid, dim3(FQLA_FWD_THREADS), cfg::bytes, stream, 0, p);
}

template <typename T, bool LATE>
cudaError_t launch_cfg(const fqla_fwd_params &p, int bv, cudaStream_t stream)
{
    if (p.K == 64 && bv == 32) return launch<T, 64, 32, LATE>(p, stream);
    if (p.K == 64 && bv == 64) return launch<T, 64, 64, LATE>(p, stream);
    if (p.K == 128 && bv == 32) return launch<T, 128, 32, LATE>(p, stream);
    if (p.K == 128 && bv == 64) return launch<T, 128, 64, LATE>(p, stream);
    if (p.K == 256 && bv == 32) return launch<T, 256, 32, LATE>(p, stream);
    return cudaErrorInvalidValue;
}

template <typename T>
cudaError_t launch_late(const fqla_fwd_params &p, int bv, int late, cudaStream_t stream)
{
#if FQLA_FWD_TUNING
    if (late >= 0 && (late != 0) != (bool)FQLA_FWD_LATE_LOADS)
        return launch_cfg<T, !FQLA_FWD_LATE_LOADS>(p, bv, stream);
#endif
    (void)late;
    return launch_cfg<T, (bool)FQLA_FWD_LATE_LOADS>(p, bv, stream);
}

} // namespace

int fqla_fwd_chunk_has(int kd, int bv)
{
    return (kd == 64 && (bv == 32 || bv == 64)) || (kd == 128 && (bv == 32 || bv == 64)) ||
           (kd == 256 && bv == 32);
}

cudaError_t fqla_fwd_launch_chunk(const fqla_fwd_params &p, int io_bf16, int bv, int late, cudaStream_t stream)
{
    if (p.N * p.HV == 0) return cudaSuccess;
    return io_bf16 ? launch_late<__nv_bfloat16>(p, bv, late, stream) : launch_late<__half>(p, bv, late, stream);
}
