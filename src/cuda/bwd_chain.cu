/*
 * bwd_chain.cu - the backward's two sequential passes over each sequence
 * (bwd_common.cuh), one CTA of 256 threads per (sequence, value head, slice
 * of FQLA_BWD_VS value columns): value columns never mix in either chain,
 * so the slices run independently, as the forward's chunk kernels do.
 *
 * states (forward, chunk by chunk; S the state entering the chunk):
 *   store S;  X = V - diag(e) K S;  Y = diag(beta) X;  U = T~ Y;
 *   S <- e_C S + K^T diag(f) U
 * dstates (reverse; dS the gradient w.r.t. the state leaving the chunk,
 * starting from d_final_state):
 *   store dS;  dU = P~^T dO + diag(f) K dS;  dY = T~^T dU;
 *   dS <- e_C dS + Q^T (scale diag(e) dO) - K^T (diag(e beta) dY)
 * and dh0 = dS after the first chunk. e_i = exp(gamma_i), f_i =
 * exp(gamma_C - gamma_i), e_C = exp(gamma_C); gamma, beta, T~, P~ and the
 * l2norm factors come from bwd_prepare.cu.
 *
 * Products: bf16 m16n8k16 mma.sync on hi/lo split operands
 * (kernel/split_mma.cuh), fp32 accumulation. Every operand that is not
 * exactly a bf16 number carries its lo plane (three products, ~fp32): the
 * state, Y, f U, dU, the scaled dY and dO, T~ and P~, and q / k / dO when
 * they are fp16 or normalised in the kernel. Raw bf16 q / k / dO are exact
 * and go in with their hi plane only (two products). Why the chains need
 * fp32-class products at all: a rounding of the state is carried through
 * every later chunk (near-reflections with beta near 2 do not damp it),
 * and the gradients of a one-token sequence are single cancelling sums
 * (dev/models/bwd_chunked.py). The 3xTF32 products with per-element
 * operand reads this replaces spent ~35 instructions per tile product.
 *
 * The state lives in registers, in the update product's accumulator
 * layout (warp w owns 16 of its rows; at K = 64 also half the columns), so
 * e_C S + ... is a register update. Each chunk, S is stored to the
 * workspace straight from those registers and written once as split
 * planes to shared memory, the B operand of K S. The 64-row products split
 * their 64 x 32 outputs over the warps as 4 row blocks x 2 column halves.
 *
 * Inputs arrive a chunk ahead, so the chain does not wait on global
 * memory: the raw q / k rows, the V or dO slice and gamma / beta / the
 * l2norm factors by cp.async into a two-stage ring, issued right after the
 * chunk's first barrier (rows whose strides or base are not 16-byte
 * multiples are copied element by element into the same layout). Raw bf16
 * rows in the ring are the hi planes as they are; fp16 or normalised q / k
 * (and fp16 dO) are converted in place once per chunk (CONVERT), their lo
 * planes in a shared-memory tail that only those launches allocate. T~ and
 * P~ (fp32, in the workspace) are read as each warp's mma A fragments and
 * split into hi / lo in registers where they are used, never stored as
 * planes: dstates loads its fragments of the next chunk's T~ and P~ from
 * global memory into registers right after their last use (64 registers;
 * it has them); states, held to 128 registers for two CTAs an SM, copies
 * the next T~ into one fp32 tile by cp.async after its last read (and into
 * L2 a chunk earlier), and reads its fragments from there.
 *
 * Three CTA barriers per chunk (a fourth after an in-place conversion):
 * each product reads operands that other warps wrote, and each buffer is
 * rewritten only after the barrier that follows its last read (the
 * comments at the barriers say what they publish). Shared memory at
 * K = 128: states 104 KB (121 KB converting), dstates 130 KB (169 KB);
 * at K = 64: 78 (87) and 88 (111) KB.
 */
#include "cuda/bwd_common.cuh"
#include "cuda/fwd_prepare_common.cuh"
#include "cuda/kernel/split_mma.cuh"
#include "cuda/ptx/cp_async.cuh"

#include <type_traits>

namespace {

constexpr int C = FQLA_BWD_C;
constexpr int VS = FQLA_BWD_VS;
constexpr int THREADS = 256;

/* What a launch runs (bwd_chain_cp.cu): whole sequences (no CP), or with CP
 * the pre-pass of segments (from zero / identity states, [H | M] out) or
 * the main pass (from the scan's segment states, every chunk's state out). */
enum { CHAIN_WHOLE = 0, CHAIN_PREPASS = 1, CHAIN_MAIN = 2 };
constexpr int LDX = VS + 8; /* 64 x VS and K x VS tiles of 2-byte elements (80-byte rows) */

using bf16 = __nv_bfloat16;

/* One chunk's inputs (one ring stage); q / k / x hold the io dtype's raw
 * bits, or the bf16 hi plane after the in-place conversion. */
template <int KD, bool REVERSE> struct chain_stage {
    static constexpr int LDQ = KD + 8; /* 272- or 144-byte rows: 16-byte aligned, spread over the banks */
    alignas(16) uint16_t k[C * LDQ];
    alignas(16) uint16_t q[REVERSE ? C * LDQ : 8]; /* dstates only */
    alignas(16) uint16_t x[C * LDX];               /* the V (states) or dO (dstates) slice */
    alignas(16) float gam[C];
    alignas(16) float bet[C];
    alignas(16) float rq[C];
    alignas(16) float rk[C];
};

/* A tile as two bf16 planes. */
template <int ROWS> struct split_planes {
    alignas(16) bf16 hi[ROWS * LDX];
    alignas(16) bf16 lo[ROWS * LDX];
    __device__ __forceinline__ fqla_split_tile tile() { return {hi, lo, LDX}; }
};

template <bool REVERSE> struct scaled_do {
    split_planes<C> p; /* scale diag(e) dO, the B operand of Q^T in the dS update */
};
template <> struct scaled_do<false> {};

/* states' T~ (fp32, one chunk's; 288-byte rows keep the float2 fragment
 * reads free of bank conflicts) */
constexpr int LDT = C + 8;
template <bool REVERSE> struct t_tile {
    alignas(16) float T[C * LDT];
};
template <> struct t_tile<true> {};

template <int KD, bool REVERSE> struct chain_smem {
    chain_stage<KD, REVERSE> st[2];
    split_planes<KD> S;  /* S or dS */
    split_planes<C> a, b; /* states: Y, f U; dstates: dU, -e beta dY */
    scaled_do<REVERSE> e;
    t_tile<REVERSE> t;
};

/* The lo planes of the converted rows (launches with fp16 io or l2norm
 * only): one chunk's, written after the barrier that ends the previous
 * chunk's reads. */
template <int KD, bool REVERSE> struct chain_lo {
    static constexpr int LDQ = chain_stage<KD, REVERSE>::LDQ;
    alignas(16) bf16 k[C * LDQ];
    alignas(16) bf16 q[REVERSE ? C * LDQ : 8];
    alignas(16) bf16 x[REVERSE ? C * LDX : 8];
};

template <int KD, bool REVERSE> constexpr size_t smem_bytes(bool convert)
{
    return sizeof(chain_smem<KD, REVERSE>) + (convert ? sizeof(chain_lo<KD, REVERSE>) : 0);
}

/* Copies 64 rows of `cols` 2-byte elements (rows past nvalid as zeros)
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
    } else { /* rare (misaligned rows): kept rolled, its addresses out of the chain's registers */
#pragma unroll 1
        for (int idx = threadIdx.x; idx < C * cols; idx += THREADS) {
            const int i = idx / cols, j = idx % cols;
            dst[i * ld + j] = i < nvalid ? src[i * st + j] : (uint16_t)0;
        }
    }
}

/* Issues chunk (slot, t0, nvalid)'s copies into stage s. */
template <int KD, bool REVERSE>
__device__ __forceinline__ void issue(const fqla_bwd_params &bp, chain_stage<KD, REVERSE> &s, int64_t slot,
                                      int64_t batch, int64_t t0, int nvalid, int hk, int hv, int v0, bool vec,
                                      bool x_zero)
{
    const fqla_fwd_params &p = bp.f;
    constexpr int LDQ = chain_stage<KD, REVERSE>::LDQ;
    const size_t tile = (size_t)slot * p.HV + hv;
    copy_rows(s.k, LDQ, (const uint16_t *)p.k + batch * p.k_sb + t0 * p.k_st + (int64_t)hk * p.k_sh, p.k_st, KD,
              nvalid, vec);
    if constexpr (REVERSE) {
        copy_rows(s.q, LDQ, (const uint16_t *)p.q + batch * p.q_sb + t0 * p.q_st + (int64_t)hk * p.q_sh, p.q_st, KD,
                  nvalid, vec);
        copy_rows(s.x, LDX, (const uint16_t *)bp.d_o + batch * bp.do_sb + t0 * bp.do_st + (int64_t)hv * bp.do_sh + v0,
                  bp.do_st, VS, x_zero ? 0 : nvalid, vec);
    } else {
        copy_rows(s.x, LDX, (const uint16_t *)p.v + batch * p.v_sb + t0 * p.v_st + (int64_t)hv * p.v_sh + v0, p.v_st,
                  VS, x_zero ? 0 : nvalid, vec);
    }
    const int t = threadIdx.x;
    if (t < C / 4) { /* the workspace rows: 16-byte aligned always */
        fqla_cp_async16(&s.gam[4 * t], p.gam + tile * C + 4 * t, 16);
        fqla_cp_async16(&s.bet[4 * t], bp.bet + tile * C + 4 * t, 16);
        if (p.l2norm) {
            const size_t rrow = ((size_t)slot * p.H + hk) * C;
            fqla_cp_async16(&s.rk[4 * t], p.rk + rrow + 4 * t, 16);
            if (REVERSE) fqla_cp_async16(&s.rq[4 * t], p.rq + rrow + 4 * t, 16);
        }
    }
}

/* Rewrites `cols` columns of a stage's 64 raw rows (pitch ld) as their
 * bf16 hi plane in place, lo into lo (same pitch): row i scaled by r[i]
 * (r nullptr: by 1). Each thread reads and writes only its own pairs. */
template <typename T>
__device__ __forceinline__ void split_rows(uint16_t *raw, bf16 *lo, int ld, int cols, const float *r)
{
    const int per_row = cols / 2;
    for (int idx = threadIdx.x; idx < C * per_row; idx += THREADS) {
        const int i = idx / per_row, j = 2 * (idx % per_row);
        uint32_t *w = reinterpret_cast<uint32_t *>(raw + i * ld + j);
        const uint32_t x = *w;
        const float s = r ? r[i] : 1.f;
        uint32_t h, l;
        fqla_split_pack2(bwd_widen<T>(x & 0xffffu) * s, bwd_widen<T>(x >> 16) * s, h, l);
        *w = h;
        *reinterpret_cast<uint32_t *>(lo + i * ld + j) = l;
    }
}

/* Copies chunk tile's T~ (the workspace's 64 x 64 fp32) into t (pitch LDT). */
__device__ __forceinline__ void issue_t(float *t, const float *Tg)
{
    for (int idx = threadIdx.x; idx < C * C / 4; idx += THREADS) {
        const int i = idx / (C / 4), j = 4 * (idx % (C / 4));
        fqla_cp_async16(t + i * LDT + j, Tg + 4 * idx, 16);
    }
}

/*
 * k-step ks (16 columns) of a 64 x 64 fp32 matrix M (T~ or P~, row-major,
 * pitch ld; global or shared memory) as the warp's A fragment for the
 * 16-row block m0 (TRANS: of M^T): f[2 r], f[2 r + 1] are the pair of
 * fragment register r (mma_sync.cuh: rows g / g + 8, columns 2t, 2t + 1 /
 * 2t + 8, 2t + 9).
 */
template <bool TRANS>
__device__ __forceinline__ void load_frag(float (&f)[8], const float *M, int ld, int m0, int ks)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int r = 0; r < 4; r++) {
        const int i = m0 + g + 8 * (r & 1), k = 16 * ks + 2 * t + 8 * (r >> 1);
        if (TRANS) {
            f[2 * r] = M[k * ld + i];
            f[2 * r + 1] = M[(k + 1) * ld + i];
        } else {
            const float2 v = *reinterpret_cast<const float2 *>(M + i * ld + k);
            f[2 * r] = v.x;
            f[2 * r + 1] = v.y;
        }
    }
}

/* acc[NT] += A B over k-step ks, A given as load_frag's fp32 fragment
 * (split here, hi and lo), B a split tile stored [k][n] (its lo plane where
 * it has one): hi*hi + lo*hi + hi*lo. */
template <int NT>
__device__ __forceinline__ void mma_frag(float (&acc)[NT][4], const float (&f)[8], int ks, const fqla_split_tile &B,
                                         int n0)
{
    static_assert(NT % 2 == 0, "n-tiles come in pairs (one ldmatrix.x4 per 16 columns)");
    const int lane = threadIdx.x & 31;
    uint32_t ah[4], al[4];
#pragma unroll
    for (int r = 0; r < 4; r++) fqla_split_pack2(f[2 * r], f[2 * r + 1], ah[r], al[r]);
#pragma unroll
    for (int np = 0; np < NT / 2; np++) {
        uint32_t bh[4];
        fqla_frag_b_kn(bh, B.hi, B.ld, 16 * ks, n0 + 16 * np, lane);
        fqla_mma_m16n8k16_bf16(acc[2 * np], ah, bh[0], bh[1]);
        fqla_mma_m16n8k16_bf16(acc[2 * np + 1], ah, bh[2], bh[3]);
        fqla_mma_m16n8k16_bf16(acc[2 * np], al, bh[0], bh[1]);
        fqla_mma_m16n8k16_bf16(acc[2 * np + 1], al, bh[2], bh[3]);
        if (B.lo) {
            uint32_t bl[4];
            fqla_frag_b_kn(bl, B.lo, B.ld, 16 * ks, n0 + 16 * np, lane);
            fqla_mma_m16n8k16_bf16(acc[2 * np], ah, bl[0], bl[1]);
            fqla_mma_m16n8k16_bf16(acc[2 * np + 1], ah, bl[2], bl[3]);
        }
    }
}

/* The k-steps ks_lo .. ks_hi of the above (the others are M's zero
 * triangle), dstates' fragments held in registers a chunk ahead. */
template <bool TRANS>
__device__ __forceinline__ void load_frags(float (&f)[4][8], const float *M, int ld, int m0, int ks_lo, int ks_hi)
{
#pragma unroll
    for (int ks = 0; ks < 4; ks++)
        if (ks >= ks_lo && ks <= ks_hi) load_frag<TRANS>(f[ks], M, ld, m0, ks);
}
template <int NT>
__device__ __forceinline__ void mma_frags(float (&acc)[NT][4], const float (&f)[4][8], int ks_lo, int ks_hi,
                                          const fqla_split_tile &B, int n0)
{
#pragma unroll
    for (int ks = 0; ks < 4; ks++)
        if (ks >= ks_lo && ks <= ks_hi) mma_frag(acc, f[ks], ks, B, n0);
}

/* acc (+)= A B over k in [0, KD) as split_mma; at K = 128 in two
 * accumulator sets (k halves) added at the end: two independent chains of
 * mma per n-tile instead of one twice as long (K S and K dS are on the
 * chain's path; at K = 64 the chains are short, and the states kernel at
 * 128 registers spilled the extra set). */
template <int KD, int NT>
__device__ __forceinline__ void split_mma_halves(float (&acc)[NT][4], const fqla_split_tile &A,
                                                 const fqla_split_tile &B, int m0, int n0)
{
    if constexpr (KD < 128) {
        fqla_split_mma<false, false, NT>(acc, A, B, m0, n0, 0, KD);
    } else {
        float acc2[NT][4];
        fqla_acc_zero(acc2);
#pragma unroll
        for (int k = 0; k < KD / 2; k += 16) { /* interleaved in the source: the mma asm stays in order */
            fqla_split_mma<false, false, NT>(acc, A, B, m0, n0, k, k + 16);
            fqla_split_mma<false, false, NT>(acc2, A, B, m0, n0, KD / 2 + k, KD / 2 + k + 16);
        }
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[nt][e] += acc2[nt][e];
    }
}

/* Launch bounds: states fits two CTAs an SM (shared memory <= 103 KB,
 * registers capped at 128); dstates holds T~ and P~ fragments in registers
 * (64 of them) and needs more shared memory: one. */
template <int KD, bool REVERSE> constexpr int min_blocks() { return REVERSE ? 1 : 2; }

/* CONVERT: q / k are not exact bf16 numbers as they come (fp16 io, or
 * l2norm in the kernel): converted in place, with lo planes. A template
 * parameter so that every product's number of terms is known to the
 * compiler (straight-line code, no branch per k-step). */
template <typename T, int KD, bool REVERSE, bool CONVERT>
__global__ void __launch_bounds__(THREADS, (min_blocks<KD, REVERSE>()))
    bwd_chain_kernel(const fqla_bwd_params bp, int vec, int mode)
{
    const fqla_fwd_params &p = bp.f;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    chain_smem<KD, REVERSE> &sm = *reinterpret_cast<chain_smem<KD, REVERSE> *>(smem_raw);
    chain_lo<KD, REVERSE> &lo = *reinterpret_cast<chain_lo<KD, REVERSE> *>(smem_raw + sizeof(chain_smem<KD, REVERSE>));
    constexpr int LDQ = chain_stage<KD, REVERSE>::LDQ;
    /* dO is exact bf16 unless fp16 */
    constexpr bool IO_BF16 = std::is_same<T, __nv_bfloat16>::value;
    static_assert(IO_BF16 || CONVERT, "fp16 q / k always need their lo planes");
    const int hv = blockIdx.y, hk = hv / p.group, v0 = blockIdx.z * VS;
    /* the pre-pass's columns past V: the identity columns (zero input, state I) */
    const bool ident = mode == CHAIN_PREPASS && v0 >= p.V;
    const int tid = threadIdx.x, warp = tid >> 5;
    /* 64-row products: warp w rows m0 = 16 (w % 4), columns n0 = 16 (w / 4).
     * The K-row state: KD / 16 row blocks, the rest of the warps across columns. */
    constexpr int RT = KD / 16, CW = 8 / RT, SNT = VS / CW / 8;
    const int mb = warp & 3, m0 = 16 * mb, n0 = 16 * (warp >> 2);
    const int r0 = 16 * (warp % RT), c0 = (VS / CW) * (warp / RT);
    /* T~ (lower triangular) as A: k-steps 0 .. mb; T~^T and P~^T (upper): mb .. 3 */
    const int ks_lo = REVERSE ? mb : 0, ks_hi = REVERSE ? 3 : mb;
    const float scale = p.scale;
    /* the span: sequence blockIdx.x (CHAIN_WHOLE), or segment blockIdx.x */
    int64_t n, batch, start, len, slot0;
    bool last;
    if (!fqla_fwd_span(p, blockIdx.x, n, batch, start, len, slot0, last)) return;
    int64_t seq_start, seq_len, seq_slot0;
    fqla_fwd_seq(p, n, batch, seq_start, seq_len, seq_slot0);
    const bool first = start == seq_start;
    /* the pre-pass of the segment that ends the chain feeds nothing */
    if (mode == CHAIN_PREPASS && (REVERSE ? first : last)) return;
    /* the pre-pass's identity columns (M) of a segment whose transition is
     * negligible under its decay (fwd_common.cuh): left out, and flagged for
     * the scan by the first such slice (every slice decides alike) */
    if (mode == CHAIN_PREPASS && p.cp_skip && ident) {
        const int neg = fqla_cp_m_negligible(p, len, slot0, hv);
        if (tid == 0 && v0 == p.V) p.seg_flag[blockIdx.x * p.HV + hv] = neg;
        if (neg) return;
    }
    const int chunks = (int)((len + C - 1) / C); /* < 2^31: the slots are int64 only as offsets */
    /* a segment's starting state is in the workspace (the scan wrote it) */
    const bool from_ws = mode == CHAIN_MAIN && chunks > 0;

    /* the starting state, in the accumulator layout: h0 (states) or d_final_state (dstates) */
    float S[SNT][4];
    fqla_acc_pairs(S, r0, c0, [&](int r, int j, float &s0, float &s1) {
        float s[2] = {0.f, 0.f};
        for (int u = 0; u < 2; u++) {
            if (mode == CHAIN_PREPASS) {
                s[u] = ident && r == v0 - p.V + j + u ? 1.f : 0.f;
            } else if (from_ws) {
                const int64_t c = REVERSE ? chunks - 1 : 0;
                s[u] = (REVERSE ? bp.dS : bp.S)[((size_t)(slot0 + c) * p.HV + hv) * KD * p.V + (int64_t)r * p.V + v0 +
                                                 j + u];
            } else {
                s[u] = bwd_start_state<REVERSE>(bp, n, hv, r, v0 + j + u);
            }
        }
        s0 = s[0];
        s1 = s[1];
    });

    /* chunk order: forward, or reverse for the gradient chain */
    auto chunk_at = [&](int it) { return REVERSE ? chunks - 1 - it : it; };
    auto nvalid_of = [&](int c) { return (int)(len - c * C < C ? len - c * C : C); };
    auto tile_of = [&](int c) { return ((size_t)(slot0 + c) * p.HV + hv) * C * C; };
    /* T~ and P~ fragments (dstates: the chunk to come's, from global
     * memory; states: this chunk's, from sm.t just before use) */
    float Tf[4][8], Pf[4][8];
    /* cp.async groups, in order: the ring's copies of chunk it (committed
     * after barrier (a) of chunk it - 1), then (states) T~ of chunk it
     * (after barrier (c) of chunk it - 1), one group each, empty or not */
    if (chunks > 0) {
        const int c = chunk_at(0);
        issue<KD, REVERSE>(bp, sm.st[0], slot0 + c, batch, start + (int64_t)c * C, nvalid_of(c), hk, hv, v0, vec,
                           ident);
        fqla_cp_async_commit();
        if constexpr (REVERSE) {
            load_frags<true>(Tf, bp.Tt + tile_of(c), C, m0, ks_lo, ks_hi);
            load_frags<true>(Pf, bp.Pt + tile_of(c), C, m0, ks_lo, ks_hi);
        } else {
            issue_t(sm.t.T, bp.Tt + tile_of(c));
            fqla_cp_async_commit();
        }
    }
    const fqla_split_tile Sp = sm.S.tile(), Ap = sm.a.tile(), Bp = sm.b.tile();
    for (int it = 0; it < chunks; it++) {
        const int c = chunk_at(it);
        const int64_t slot = slot0 + c;
        const size_t tile = (size_t)slot * p.HV + hv;
        const bool more = it + 1 < chunks;
        const int cn = more ? chunk_at(it + 1) : c;
        chain_stage<KD, REVERSE> &s = sm.st[it & 1];
        const fqla_split_tile Kt = {reinterpret_cast<bf16 *>(s.k), CONVERT ? lo.k : nullptr, LDQ};

        fqla_cp_async_wait<REVERSE ? 0 : 1>(); /* this chunk's ring copies (this thread's) */
        /* store the state entering (states) / the gradient leaving (dstates)
         * this chunk; its split planes are the B operand of K S (K dS) */
        float *dst = (REVERSE ? bp.dS : bp.S) + tile * KD * p.V + v0;
        fqla_acc_pairs(S, r0, c0, [&](int r, int j, float &s0, float &s1) {
            if (mode != CHAIN_PREPASS) *reinterpret_cast<float2 *>(dst + (int64_t)r * p.V + j) = make_float2(s0, s1);
            fqla_split_put2(Sp, r, j, s0, s1);
        });
        __syncthreads(); /* (a) every thread's copies and state planes; chunk it - 1 fully read */
        if (more) {      /* the next chunk's copies, into the stage chunk it - 1 used */
            issue<KD, REVERSE>(bp, sm.st[(it + 1) & 1], slot0 + cn, batch, start + (int64_t)cn * C, nvalid_of(cn), hk, hv,
                               v0, vec, ident);
            /* states: the next T~ is copied after (c), when this one is
             * read; into L2 now, so that copy waits less */
            if (!REVERSE && tid < C * C / 32) fqla_prefetch_l2(bp.Tt + tile_of(cn) + 32 * tid);
        }
        fqla_cp_async_commit();
        const float gC = s.gam[C - 1], eC = __expf(gC);
        if constexpr (!REVERSE) {
            if constexpr (CONVERT) {
                split_rows<T>(s.k, lo.k, LDQ, KD, p.l2norm ? s.rk : nullptr);
                __syncthreads(); /* (a') the converted rows */
            }
            { /* Y = diag(beta) (V - diag(e) K S) */
                float acc[2][4];
                fqla_acc_zero(acc);
                split_mma_halves<KD>(acc, Kt, Sp, m0, n0);
                fqla_acc_pairs(acc, m0, n0, [&](int i, int j, float &a0, float &a1) {
                    const float e = __expf(s.gam[i]), b = s.bet[i];
                    const uint32_t v = *reinterpret_cast<const uint32_t *>(&s.x[i * LDX + j]);
                    const float x0 = bwd_widen<T>(v & 0xffffu) - e * a0, x1 = bwd_widen<T>(v >> 16) - e * a1;
                    fqla_split_put2(Ap, i, j, b * x0, b * x1);
                });
            }
            fqla_cp_async_wait<1>(); /* T~ (this thread's) */
            __syncthreads();         /* (b) Y, T~ */
            {                        /* diag(f) U, U = T~ Y */
                float acc[2][4];
                fqla_acc_zero(acc);
#pragma unroll
                for (int ks = 0; ks < 4; ks++)
                    if (ks <= ks_hi) {
                        float f[8];
                        load_frag<false>(f, sm.t.T, LDT, m0, ks);
                        mma_frag(acc, f, ks, Ap, n0);
                    }
                fqla_acc_pairs(acc, m0, n0, [&](int i, int j, float &a0, float &a1) {
                    const float f = __expf(gC - s.gam[i]);
                    fqla_split_put2(Bp, i, j, f * a0, f * a1);
                });
            }
            __syncthreads(); /* (c) f U; T~ read */
            if (more) issue_t(sm.t.T, bp.Tt + tile_of(cn));
            fqla_cp_async_commit();
            /* S = e_C S + K^T diag(f) U */
#pragma unroll
            for (int nt = 0; nt < SNT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) S[nt][e] *= eC;
            fqla_split_mma<true, false, SNT>(S, Kt, Bp, r0, c0, 0, C);
        } else {
            const fqla_split_tile Qt = {reinterpret_cast<bf16 *>(s.q), CONVERT ? lo.q : nullptr, LDQ};
            const fqla_split_tile Xt = {reinterpret_cast<bf16 *>(s.x), IO_BF16 ? nullptr : lo.x, LDX};
            const fqla_split_tile Ep = sm.e.p.tile();
            /* scale diag(e) dO as split planes (read after (c)); fp16 dO split in place */
            for (int idx = tid; idx < C * VS / 2; idx += THREADS) {
                const int i = idx / (VS / 2), j = 2 * (idx % (VS / 2));
                uint32_t *w = reinterpret_cast<uint32_t *>(&s.x[i * LDX + j]);
                const uint32_t v = *w;
                const float x0 = bwd_widen<T>(v & 0xffffu), x1 = bwd_widen<T>(v >> 16), se = scale * __expf(s.gam[i]);
                fqla_split_put2(Ep, i, j, se * x0, se * x1);
                if (!IO_BF16) {
                    uint32_t h, l;
                    fqla_split_pack2(x0, x1, h, l);
                    *w = h;
                    *reinterpret_cast<uint32_t *>(&lo.x[i * LDX + j]) = l;
                }
            }
            if constexpr (CONVERT) {
                split_rows<T>(s.k, lo.k, LDQ, KD, p.l2norm ? s.rk : nullptr);
                split_rows<T>(s.q, lo.q, LDQ, KD, p.l2norm ? s.rq : nullptr);
                __syncthreads(); /* (a') the converted rows (and fp16 dO) */
            }
            { /* dU = P~^T dO + diag(f) K dS */
                float acc[2][4];
                fqla_acc_zero(acc);
                split_mma_halves<KD>(acc, Kt, Sp, m0, n0);
                fqla_acc_pairs(acc, m0, n0, [&](int i, int j, float &a0, float &a1) {
                    const float f = __expf(gC - s.gam[i]);
                    a0 *= f;
                    a1 *= f;
                });
                mma_frags(acc, Pf, ks_lo, ks_hi, Xt, n0);
                fqla_acc_pairs(acc, m0, n0, [&](int i, int j, float &a0, float &a1) { fqla_split_put2(Ap, i, j, a0, a1); });
            }
            if (more) load_frags<true>(Pf, bp.Pt + tile_of(cn), C, m0, ks_lo, ks_hi);
            __syncthreads(); /* (b) dU */
            {                /* -diag(e beta) dY, dY = T~^T dU */
                float acc[2][4];
                fqla_acc_zero(acc);
                mma_frags(acc, Tf, ks_lo, ks_hi, Ap, n0);
                fqla_acc_pairs(acc, m0, n0, [&](int i, int j, float &a0, float &a1) {
                    const float eb = -__expf(s.gam[i]) * s.bet[i];
                    fqla_split_put2(Bp, i, j, eb * a0, eb * a1);
                });
            }
            if (more) load_frags<true>(Tf, bp.Tt + tile_of(cn), C, m0, ks_lo, ks_hi);
            __syncthreads(); /* (c) -e beta dY */
            /* dS = e_C dS + Q^T (scale diag(e) dO) - K^T (diag(e beta) dY) */
#pragma unroll
            for (int nt = 0; nt < SNT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) S[nt][e] *= eC;
            { /* the two products in two accumulator sets, interleaved: two chains of mma per n-tile */
                float S2[SNT][4];
                fqla_acc_zero(S2);
#pragma unroll
                for (int k = 0; k < C; k += 16) {
                    fqla_split_mma<true, false, SNT>(S, Qt, Ep, r0, c0, k, k + 16);
                    fqla_split_mma<true, false, SNT>(S2, Kt, Bp, r0, c0, k, k + 16);
                }
#pragma unroll
                for (int nt = 0; nt < SNT; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) S[nt][e] += S2[nt][e];
            }
        }
    }
    fqla_cp_async_wait_all();
    if (mode == CHAIN_PREPASS) { /* the segment's [H | M] */
        const int64_t W = p.V + KD;
        float *hm = bp.cp_hm + ((size_t)blockIdx.x * p.HV + hv) * KD * W + v0;
        fqla_acc_pairs(S, r0, c0, [&](int r, int j, float &s0, float &s1) {
            *reinterpret_cast<float2 *>(hm + (int64_t)r * W + j) = make_float2(s0, s1);
        });
        return;
    }
    if (REVERSE && bp.dh0 && first)
        fqla_acc_pairs(S, r0, c0, [&](int r, int j, float &s0, float &s1) {
            bp.dh0[fqla_fwd_state_off(n, hv, r, v0 + j, bp.dh0_sn, bp.dh0_sh, bp.dh0_s2, p.v_first)] = s0;
            bp.dh0[fqla_fwd_state_off(n, hv, r, v0 + j + 1, bp.dh0_sn, bp.dh0_sh, bp.dh0_s2, p.v_first)] = s1;
        });
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

/* Grid: sequences (CHAIN_WHOLE) or segment indices (with CP), value heads,
 * 32-column slices (the pre-pass: of V + K columns). */
template <typename T, int KD, bool REVERSE, bool CONVERT>
cudaError_t launch(const fqla_bwd_params &p, int mode, cudaStream_t stream)
{
    static fqla_smem_cache cache;
    const size_t smem = smem_bytes<KD, REVERSE>(CONVERT);
    cudaError_t e = fqla_smem_limit(cache, bwd_chain_kernel<T, KD, REVERSE, CONVERT>, smem);
    if (e != cudaSuccess) return e;
    const int64_t rows = mode == CHAIN_WHOLE ? p.f.N : fqla_cp_segs(p.f.varlen, p.f.T, p.f.N, p.f.seg_chunks);
    const int64_t cols = mode == CHAIN_PREPASS ? p.f.V + KD : p.f.V;
    return fqla_launch(bwd_chain_kernel<T, KD, REVERSE, CONVERT>,
                       dim3((unsigned)rows, (unsigned)p.f.HV, (unsigned)(cols / VS)), dim3(THREADS), smem, stream, 0,
                       p, rows_vec(p), mode);
}

/* bf16 io with or without l2norm, or fp16 (always converted) */
template <int KD, bool REVERSE>
cudaError_t launch_io(const fqla_bwd_params &p, int io_bf16, int mode, cudaStream_t stream)
{
    if (!io_bf16) return launch<__half, KD, REVERSE, true>(p, mode, stream);
    return p.f.l2norm ? launch<__nv_bfloat16, KD, REVERSE, true>(p, mode, stream)
                      : launch<__nv_bfloat16, KD, REVERSE, false>(p, mode, stream);
}

template <bool REVERSE> cudaError_t launch_kd(const fqla_bwd_params &p, int io_bf16, int mode, cudaStream_t stream)
{
    return p.f.K == 64 ? launch_io<64, REVERSE>(p, io_bf16, mode, stream)
                       : launch_io<128, REVERSE>(p, io_bf16, mode, stream);
}

} // namespace

cudaError_t fqla_bwd_launch_states(const fqla_bwd_params &p, int io_bf16, cudaStream_t stream)
{
    return launch_kd<false>(p, io_bf16, p.f.cp_mode ? CHAIN_MAIN : CHAIN_WHOLE, stream);
}

cudaError_t fqla_bwd_launch_dstates(const fqla_bwd_params &p, int io_bf16, cudaStream_t stream)
{
    return launch_kd<true>(p, io_bf16, p.f.cp_mode ? CHAIN_MAIN : CHAIN_WHOLE, stream);
}

cudaError_t fqla_bwd_launch_states_prepass(const fqla_bwd_params &p, int io_bf16, cudaStream_t stream)
{
    return launch_kd<false>(p, io_bf16, CHAIN_PREPASS, stream);
}

cudaError_t fqla_bwd_launch_dstates_prepass(const fqla_bwd_params &p, int io_bf16, cudaStream_t stream)
{
    return launch_kd<true>(p, io_bf16, CHAIN_PREPASS, stream);
}
