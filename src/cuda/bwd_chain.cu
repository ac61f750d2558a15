/*
 * bwd_chain.cu - the backward's two sequential passes over each sequence
 * (bwd_common.cuh), one warpgroup per (sequence, value head, slice of
 * FQLA_BWD_VS = 64 value columns; a last slice of 32 runs with zero columns
 * past V), one or two slices of one (sequence, value head) a CTA (NWG; two
 * share the chunk's K, Q, T~, P~ and their conversion, one walks a chunk
 * faster: bwd.cu's chain_nwg_of picks): value columns never mix in
 * either chain, so the slices run independently, as the forward's chunk
 * kernels do. Both chains run in one launch (bwd_chain_kernel below).
 *
 * states (forward, chunk by chunk; S the state entering the chunk):
 *   store S (fp32, or where bwd_state_bf16 says its bf16 plane: staged by
 *   stmatrix.trans from the A fragments the first product takes anyway,
 *   written by one bulk copy a warpgroup);
 *   X = V - diag(e) K S;  Y = diag(beta) X;  U = T~ Y;
 *   S <- e_C S + K^T diag(f) U
 * dstates (reverse; dS the gradient w.r.t. the state leaving the chunk,
 * starting from d_final_state):
 *   store dS;  dU = P~^T dO + diag(f) K dS;  dY = T~^T dU;
 *   dS <- e_C dS + Q^T (scale diag(e) dO) - K^T (diag(e beta) dY)
 * and dh0 = dS after the first chunk. e_i = exp(gamma_i), f_i =
 * exp(gamma_C - gamma_i), e_C = exp(gamma_C); gamma, beta, T~, P~ and the
 * l2norm factors come from bwd_prepare.cu.
 *
 * The warpgroup holds the state transposed, S^T (64 value rows x K), as a
 * wgmma accumulator (kernel/wg_split.cuh's layout), and every product of a
 * chunk keeps the value rows as its M dimension, so each one's result is
 * the next one's A operand straight from registers (RS wgmma), transposed:
 *   states   (K S)^T = S^T K^T;  U^T = Y^T T~^T;  S^T += (f U)^T K
 *   dstates  (K dS)^T = dS^T K^T;  dU^T = dO^T P~ + (K dS)^T diag(f);
 *            dY^T = dU^T T~;  dS^T += (scale e dO)^T Q - (e beta dY)^T K
 * Only the chunk's inputs are in shared memory (K, Q: [t][k]; V or dO:
 * [t][v], read transposed into registers by ldmatrix.trans; T~, P~), as
 * bf16 planes in the 128-byte swizzle, so no intermediate goes through
 * shared memory and a chunk needs two CTA barriers (inputs landed; planes
 * converted).
 *
 * Precision as the rest of the backward (bwd_common.cuh): every operand
 * that is not an exact bf16 number is split into hi / lo (three products a
 * k-step): the state, Y, f U, dU, the scaled dY and dO, T~ and P~ (fp32 in
 * the workspace, split here), and q / k / dO when they are fp16 or
 * normalised in the kernel (CONVERT: converted in place, with lo planes).
 * Why the chains need fp32-class products at all: a rounding of the state
 * is carried through every later chunk (near-reflections with beta near 2
 * do not damp it), and the gradients of a one-token sequence are single
 * cancelling sums (dev/models/bwd_chunked.py).
 *
 * The state chain also serves the fp32 forward (T = float,
 * fqla_fwd_launch_chain_f32; fwd.cu's chain route): its q / k arrive as the
 * hi / lo planes the prepare kernel wrote, v is read into registers, and
 * each chunk forms O^T = scale (Q S)^T diag(e) + U^T P~^T beside the update
 * and stores o instead of the state (chain_f32_out), the final state at the
 * end; with CP its pre-pass and main pass run around the forward's scan.
 *
 * Inputs arrive a chunk ahead by cp.async: the raw q / k rows and the V or
 * dO slice into a two-stage ring, T~ (and P~) as the hi / lo planes
 * bwd_prepare.cu stores, into a set of planes for even and one for odd
 * chunks (until 9b09672 they came as fp32 into one staging tile and every
 * chunk split them between its two barriers). (The chains'
 * first form, 16 x 16 mma.sync tiles over 8 warps with the intermediates
 * in shared memory and three CTA barriers a chunk, took 1.77 / 2.7 ms on
 * hk16_hv32 32k_1seq; docs/history/2026-12-04-bwd.md.)
 */
#include "cuda/bwd_common.cuh"
#include "cuda/ptx/pdl.cuh"
#include "cuda/fwd_prepare_common.cuh"
#include "cuda/kernel/named_barrier.cuh"
#include "cuda/kernel/wg_split.cuh"
#include "cuda/ptx/cp_async.cuh"
#include "cuda/ptx/tma.cuh"

#include <type_traits>

namespace {

constexpr int C = FQLA_BWD_C;
constexpr int VS = FQLA_BWD_VS;
/* NWG, a template parameter below: chain warpgroups a CTA, each a 64-column
 * slice of one (span, value head), 128 NWG threads (bwd.cu's chain_nwg_of
 * says which launches take one and which two) */
constexpr int TILE = C * 64 * 2; /* a 64 x 64 bf16 plane */

/* What a launch runs (bwd_chain_cp.cu): whole sequences (no CP), or with CP
 * the pre-pass of segments (from zero / identity states, [H | M] out) or
 * the main pass (from the scan's segment states, every chunk's state out). */
enum { CHAIN_WHOLE = 0, CHAIN_PREPASS = 1, CHAIN_MAIN = 2 };

/* Named barriers: a warpgroup's staging plane written (one id a warpgroup). */
enum class chain_bar : uint32_t { staged = 1 };

/* One stage's per-token rows (fp32, from the workspace). */
struct chain_rows {
    alignas(16) float gam[C];
    alignas(16) float bet[C];
    alignas(16) float rq[C];
    alignas(16) float rk[C];
};

/* The chunk's per-token factors, written after the first barrier. */
struct chain_coef {
    float e[C];  /* states: e_t; dstates: scale e_t */
    float f[C];  /* f_t */
    float b[C];  /* states: beta_t; dstates: -e_t beta_t */
};

/* Shared memory (byte offsets from a 1024-aligned base). F32 (the fp32
 * forward, fqla_fwd_launch_chain_f32): each stage holds k's and q's hi and
 * lo planes as the prepare kernel stored them, and no value slice (v is
 * read from global memory into registers). */
template <int KD, bool REVERSE, bool CONVERT, int NWG, bool F32 = false> struct chain_layout {
    static constexpr int KP = C * KD * 2;                     /* a [64][KD] plane */
    static constexpr int NQK = REVERSE || F32 ? 2 : 1;        /* k (, q) */
    static constexpr int NTP = REVERSE || F32 ? 2 : 1;        /* T~ (, P~) */
    static constexpr int STAGE = F32 ? 2 * NQK * KP : NQK * KP + NWG * TILE; /* k (, q) raw / hi planes; each chain's V or
                                                                                dO slice; F32: k hi, k lo, q hi, q lo */
    static constexpr int ring = 0;                            /* two stages */
    static constexpr int tp = 2 * STAGE;                      /* T~ (, P~) hi, lo planes: even chunks */
    static constexpr int lo = tp + 2 * NTP * TILE;            /* CONVERT: k (, q) lo planes */
    static constexpr int tp1 = lo + (CONVERT && !F32 ? NQK * KP : 0); /* T~ (, P~) hi, lo planes: odd chunks */
    static constexpr int rows = tp1 + 2 * NTP * TILE;         /* chain_rows[2] */
    static constexpr int coef = rows + 2 * (int)sizeof(chain_rows);
    static constexpr int bytes = coef + (int)sizeof(chain_coef) + 1024; /* + the base's alignment */
    /* the state chain's staging of its bf16 states (bwd_state_bf16), a [K][64]
     * plane a warpgroup; inside the reverse chain's layout, which sizes the
     * launch (static_assert in launch) */
    static constexpr int stg = (coef + (int)sizeof(chain_coef) + 1023) & ~1023;
    static constexpr int stg_end = stg + NWG * KD * 128;
    static constexpr int staged_bytes = stg_end + 1024; /* the state chain's launch with its staging */
    static_assert(stg_end > stg && staged_bytes > stg_end, "the staging follows the coefficients");
    static_assert(KP % 1024 == 0 && STAGE % 1024 == 0 && tp % 1024 == 0 && lo % 1024 == 0 && tp1 % 1024 == 0,
                  "wgmma planes must be 1024-aligned");
    static_assert(bytes <= 227 * 1024, "over the H100 / H200 shared memory a block may have");
};

/* Copies 64 rows of COLS 2-byte elements (the plane's width) from src
 * (row i at src + i * st) into a swizzled plane; rows past nvalid and
 * columns past valid (a multiple of 8) as zeros. 16-byte cp.async where
 * `vec`: a thread's pieces are one column chunk in rows a multiple of 8
 * apart, so one swizzled address and one source pointer, each stepped by a
 * constant (the general indexing cost ~1000 instructions a chunk). Else
 * element by element (kept rolled): never taken through the API, whose
 * validation refuses rows off 16-byte boundaries (bwd_grads.cu's copy_raw64
 * says why the branch stays for now). */
template <int COLS, int THREADS>
__device__ __forceinline__ void copy_plane(unsigned char *plane, const uint16_t *src, int64_t st, int valid, int nvalid,
                                           bool vec)
{
    constexpr int PER_ROW = COLS / 8, STEP = THREADS / PER_ROW; /* rows between a thread's pieces */
    static_assert(STEP % 8 == 0 && C % STEP == 0, "a thread's pieces share their swizzle phase");
    if (vec) {
        const int i0 = threadIdx.x / PER_ROW, j = 8 * (threadIdx.x % PER_ROW);
        unsigned char *d = plane + fqla_wg_off(C, i0, j);
        const uint16_t *s = src + (int64_t)i0 * st + j;
        const int64_t step = (int64_t)STEP * st;
#pragma unroll
        for (int n = 0; n < C / STEP; n++) {
            const bool ok = i0 + STEP * n < nvalid && j < valid;
            fqla_cp_async16(d + STEP * 128 * n, ok ? s + step * n : src, ok ? 16 : 0);
        }
    } else {
#pragma unroll 1
        for (int idx = threadIdx.x; idx < C * COLS; idx += THREADS) {
            const int i = idx / COLS, j = idx % COLS;
            *reinterpret_cast<uint16_t *>(plane + fqla_wg_off(C, i, j)) =
                i < nvalid && j < valid ? src[i * st + j] : (uint16_t)0;
        }
    }
}

/* T~ or P~ (its hi / lo planes as bwd_prepare.cu stores them, 16 KB) into
 * place by cp.async. */
template <int THREADS> __device__ __forceinline__ void copy_tile(unsigned char *dst, const float *src)
{
#pragma unroll
    for (int n = 0; n < C * C / 4 / THREADS; n++) {
        const int idx = threadIdx.x + n * THREADS;
        fqla_cp_async16(dst + 16 * idx, src + 4 * idx, 16);
    }
}

/* Rewrites a [64][KD] plane of raw io elements as its bf16 hi plane in
 * place and lo into lo: row i scaled by r[i] (r nullptr: by 1; rows past
 * nvalid are zeros). */
template <typename T, int KD, int THREADS>
__device__ __forceinline__ void split_plane(unsigned char *hi, unsigned char *lo, const float *r, int nvalid)
{
#pragma unroll 2
    for (int idx = threadIdx.x; idx < C * KD / 8; idx += THREADS) {
        const int i = idx / (KD / 8), j = 8 * (idx % (KD / 8));
        const uint32_t o = fqla_wg_off(C, i, j);
        uint4 *w = reinterpret_cast<uint4 *>(hi + o);
        const uint4 u = *w;
        const uint32_t x[4] = {u.x, u.y, u.z, u.w};
        const float s = r ? (i < nvalid ? r[i] : 0.f) : 1.f;
        uint32_t h[4], l[4];
#pragma unroll
        for (int q = 0; q < 4; q++)
            fqla_wg_hilo(bwd_widen<T>(x[q] & 0xffffu) * s, bwd_widen<T>(x[q] >> 16) * s, h[q], l[q]);
        *w = make_uint4(h[0], h[1], h[2], h[3]);
        *reinterpret_cast<uint4 *>(lo + o) = make_uint4(l[0], l[1], l[2], l[3]);
    }
}

/* Pins register A fragments (hi, lo) in place: before a product's issue,
 * so that they are computed before its wgmma.fence (ptxas otherwise may
 * place their conversions between the wgmma and inject a wait there), and
 * after its wait, so that they stay live and unchanged while wgmma reads
 * them. */
template <int KS> __device__ __forceinline__ void pin_a(uint32_t (&hi)[KS][4], uint32_t (&lo)[KS][4])
{
    fqla_reg_fence_u(hi);
    fqla_reg_fence_u(lo);
}

/* fqla_wg_run of products whose A operand is the fragments (hi, lo). */
template <int N, int KS, typename F>
__device__ __forceinline__ void rs_run(float (&acc)[N], uint32_t (&hi)[KS][4], uint32_t (&lo)[KS][4], F f)
{
    pin_a(hi, lo);
    fqla_wg_run(acc, f);
    pin_a(hi, lo);
}

/* The chunk column (token) of accumulator element a of a 64-column
 * accumulator, and its value row offset (0 or 8). */
__device__ __forceinline__ int col_of(int a) { return 8 * (a >> 2) + 2 * (threadIdx.x & 3) + (a & 1); }
__device__ __forceinline__ int row8_of(int a) { return 8 * ((a >> 1) & 1); }

/* The CP pre-pass's window (the gate-driven shortcut of the end state H):
 * how many of a segment's chunks the chain must walk, counted from the
 * segment's end for the state chain (the state leaving it), from its start
 * for the reverse chain (the gradient entering it). The chunks beyond the
 * window reach that end through the window's transitions, each contractive
 * (chunk_ok: every beta ||k||^2 in [0, 2]) and together decaying by
 * e^(sum of their gamma_C) <= e^-17, the bound fqla_cp_m_negligible uses for
 * M: so the pre-pass leaves them out. The whole segment where no window
 * qualifies. Warp 0 walks the chunks 32 at a time (an inclusive scan of
 * gamma_C in walk order, stopped at the first chunk that fails chunk_ok);
 * block-wide (every thread calls it; a __syncthreads inside), and every CTA
 * of a (segment, value head) gets the same answer. */
template <bool REVERSE>
__device__ int chain_window(const fqla_fwd_params &p, int chunks, int64_t slot0, int hv, int *scratch)
{
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        int win = chunks;
        float run = 0.f; /* gamma_C summed over the chunks walked before this round */
        for (int base = 0; base < chunks; base += 32) {
            const int w = base + lane; /* walk position: 0 is the segment's end (state chain) or start */
            float gC = 0.f;
            int ok = 0;
            if (w < chunks) {
                const int c = REVERSE ? w : chunks - 1 - w;
                const int64_t i = (slot0 + c) * p.HV + hv;
                gC = p.gam[i * C + C - 1];
                ok = p.chunk_ok[i];
            }
            float inc = gC; /* the inclusive scan over the lanes, in lane order */
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const float y = __shfl_up_sync(0xffffffffu, inc, o);
                if (lane >= o) inc += y;
            }
            const float tot = run + inc;
            const unsigned bad = __ballot_sync(0xffffffffu, w < chunks && !ok);
            const unsigned done = __ballot_sync(0xffffffffu, w < chunks && ok && tot <= -17.f);
            /* the first lane whose window qualifies, if no failing chunk comes before it */
            const int first_done = done ? __ffs(done) - 1 : 32, first_bad = bad ? __ffs(bad) - 1 : 32;
            if (first_done < first_bad) {
                win = base + first_done + 1;
                break;
            }
            if (first_bad < 32) break; /* a chunk that is not contractive: the whole segment */
            run = __shfl_sync(0xffffffffu, tot, 31);
        }
        if (lane == 0) *scratch = win;
    }
    __syncthreads();
    const int win = *scratch;
    __syncthreads(); /* every thread has read it before the scratch is reused */
    return win;
}

/* The fp32 forward's output of a chunk (chain_run with T = float): O^T =
 * scale (Q S)^T diag(e) + U^T P~^T, qs holding (Q S)^T on entry, u U^T
 * (before the state update's f scaling); stored (store) as fp32 o rows
 * t0 .. t0 + nv, this thread's value rows from column vcol (its accumulator
 * rows below vw). A warp's store of one accumulator element writes four
 * tokens' 32-byte runs of eight value columns: whole sectors. */
template <typename CF>
__device__ __forceinline__ void chain_f32_out(const fqla_bwd_params &bp, float (&qs)[32], const float (&u)[32],
                                              const fqla_wg_tile &Pt, const CF &cf, bool store, int64_t batch,
                                              int64_t t0, int nv, int hv, int vcol, int vw)
{
    const fqla_fwd_params &p = bp.f;
#pragma unroll
    for (int a = 0; a < 32; a++) qs[a] *= p.scale * cf.e[col_of(a)];
    uint32_t uh[4][4], ul[4][4];
    fqla_wg_frags(u, uh, ul);
    rs_run(qs, uh, ul, [&] { fqla_wg_rs_split<64, 0, true, true>(qs, uh, ul, Pt, true); });
    if (!store || !p.o) return;
    float *o = (float *)p.o + batch * p.o_sb + (int64_t)hv * p.o_sh + vcol;
#pragma unroll
    for (int a = 0; a < 32; a++) {
        const int t = col_of(a), v = row8_of(a);
        if (t < nv && v < vw) o[(t0 + t) * p.o_st + v] = qs[a];
    }
}

/* CONVERT: q / k are not exact bf16 numbers as they come (fp16 io, or
 * l2norm in the kernel): converted in place, with lo planes. A template
 * parameter so that every product's number of terms is known to the
 * compiler. One CTA an SM (registers: ~230 a thread); shared memory at
 * K = 128 and NWG = 2: states 82 (98) KB, dstates 162 (194) KB, the launch
 * of both the larger; 16 KB less at NWG = 1. */
template <typename T, int KD, bool REVERSE, bool CONVERT, int NWG>
__device__ __forceinline__ void chain_run(const fqla_bwd_params &bp, int vec, int mode, int64_t row, int hv, int zpair,
                                          unsigned char *sm)
{
    /* the fp32 forward (T = float, fqla_fwd_launch_chain_f32): the state
     * chain storing o instead of the states (chain_f32_out) */
    constexpr bool F32 = std::is_same<T, float>::value;
    static_assert(!F32 || (!REVERSE && CONVERT), "fp32: the state chain, on split q / k planes");
    using L = chain_layout<KD, REVERSE, CONVERT, NWG, F32>;
    constexpr int THREADS = 128 * NWG;
    const fqla_fwd_params &p = bp.f;
    const uint32_t s0 = fqla_smem_u32(sm);
    chain_rows *rows = reinterpret_cast<chain_rows *>(sm + L::rows);
    chain_coef &cf = *reinterpret_cast<chain_coef *>(sm + L::coef);
    /* T~ (, P~): hi, lo (, hi, lo) planes, a set for even and one for odd chunks */
    auto tp_of = [&](int s) { return s ? L::tp1 : L::tp; };
    /* dO is exact bf16 unless fp16 */
    constexpr bool IO_BF16 = std::is_same<T, __nv_bfloat16>::value;
    static_assert(IO_BF16 || CONVERT, "fp16 q / k always need their lo planes");
    constexpr int NS = KD / 2, KK = KD / 16; /* S^T's accumulators a thread; its k-steps */
    const int hk = hv / p.group;
    /* slices: ceil(V / 64) of the value columns, then (the pre-pass) K / 64
     * of the identity columns (zero input, state I); warpgroup wg runs slice
     * NWG zpair + wg, if there is one */
    const int nreal = (p.V + VS - 1) / VS, nslices = nreal + (mode == CHAIN_PREPASS ? KD / VS : 0);
    const int tid = threadIdx.x, wg = tid >> 7, vr = 16 * ((tid >> 5) & 3) + ((tid & 31) >> 2), t4 = tid & 3;
    const int slice0 = NWG * zpair, slice = slice0 + wg;
    const bool ident = mode == CHAIN_PREPASS && slice >= nreal;
    const int v0 = ident ? p.V + VS * (slice - nreal) : VS * slice;
    const int vw = ident ? VS : (p.V - v0 < VS ? p.V - v0 : VS); /* the slice's columns */
    bool active = slice < nslices;
    /* the span: sequence `row` (CHAIN_WHOLE), or segment `row` */
    int64_t n, batch, start, len, slot0;
    bool last;
    /* the fp32 forward's pre-pass defines the shortcut's flag of every segment
     * index it leaves out (0), as the chunked fp32 kernel's does (the
     * backward's two chains share the flags: each writes those it runs) */
    const bool flag_cta = F32 && mode == CHAIN_PREPASS && p.cp_skip && tid == 0 && slice0 <= nreal &&
                          nreal < slice0 + NWG;
    if (!fqla_fwd_span(p, row, n, batch, start, len, slot0, last)) {
        if (flag_cta) p.seg_flag[row * p.HV + hv] = 0;
        return;
    }
    int64_t seq_start, seq_len, seq_slot0;
    fqla_fwd_seq(p, n, batch, seq_start, seq_len, seq_slot0);
    const bool first = start == seq_start;
    /* the pre-pass of the segment that ends the chain feeds nothing */
    if (mode == CHAIN_PREPASS && (REVERSE ? first : last)) {
        if (flag_cta) p.seg_flag[row * p.HV + hv] = 0;
        return;
    }
    /* the pre-pass's identity columns (M) of a segment whose transition is
     * negligible under its decay (fwd_common.cuh): left out, and flagged for
     * the scan by the CTA of the first identity slice (every CTA decides
     * alike). A block-wide test, made by every CTA that has an identity slice. */
    if (mode == CHAIN_PREPASS && p.cp_skip && slice0 + NWG > nreal && slice0 < nslices) {
        const int neg = fqla_cp_m_negligible(p, len, slot0, hv);
        if (tid == 0 && slice0 <= nreal && nreal < slice0 + NWG) p.seg_flag[row * p.HV + hv] = neg;
        if (neg && ident) active = false;
    }
    if (!__syncthreads_or(active)) return; /* no slice left to this CTA */
    const int chunks = (int)((len + C - 1) / C); /* < 2^31: the slots are int64 only as offsets */
    /* the pre-pass of a CTA whose slices are all real (H alone) walks only
     * the shortcut's window: the last chunks of the segment (states) or the
     * first (dstates), chain_window */
    int it0 = 0;
    if (mode == CHAIN_PREPASS && p.cp_skip && !__syncthreads_or(active && ident))
        it0 = chunks - chain_window<REVERSE>(p, chunks, slot0, hv, reinterpret_cast<int *>(sm + L::coef));
    /* a segment's starting state is in the workspace (the scan wrote it);
     * the fp32 forward's main pass reads it as h0 at the segment's index
     * (fwd.cu points f.h0 at the forward scan's seg_s0) */
    const bool from_ws = !F32 && mode == CHAIN_MAIN && chunks > 0;
    const int64_t h0_row = F32 && mode == CHAIN_MAIN ? row : n;

    /* S^T element a: value row vr + row8_of(a), key column kc(a) */
    auto kc = [&](int a) { return 8 * (a >> 2) + 2 * t4 + (a & 1); };
    float S[NS]; /* h0 (states) or d_final_state (dstates), transposed */
#pragma unroll
    for (int a = 0; a < NS; a++) {
        const int v = vr + row8_of(a), k = kc(a);
        float s = 0.f;
        if (!active) {
        } else if (mode == CHAIN_PREPASS) {
            s = ident && k == v0 - p.V + v ? 1.f : 0.f;
        } else if (v < vw) {
            if (from_ws) {
                const int64_t c = REVERSE ? chunks - 1 : 0;
                s = (REVERSE ? bp.dS : bp.S)[((size_t)(slot0 + c) * p.HV + hv) * KD * p.V + (int64_t)k * p.V + v0 + v];
            } else {
                s = bwd_start_state<REVERSE>(bp, h0_row, hv, k, v0 + v);
            }
        }
        S[a] = s;
    }

    auto chunk_at = [&](int it) { return REVERSE ? chunks - 1 - it : it; };
    auto nvalid_of = [&](int c) { return (int)(len - c * C < C ? len - c * C : C); };
    auto stage = [&](int s) { return sm + L::ring + s * L::STAGE; };
    /* chunk c's copies into ring stage s and T~ (, P~) set s: one cp.async group */
    auto issue = [&](int c, int s) {
        const int64_t slot = slot0 + c, t0 = start + (int64_t)c * C;
        const int nv = nvalid_of(c);
        const size_t tile = (size_t)slot * p.HV + hv;
        unsigned char *st = stage(s);
        if constexpr (F32) {
            /* k's and q's planes as the prepare kernel stored them; P~; this CTA's
             * value rows into L2 (read into registers at the chunk's start) */
            const uint16_t *qk = bp.qkp + ((size_t)slot * p.H + hk) * 4 * C * KD;
#pragma unroll 4
            for (int n = 0; n < 4 * L::KP / 16 / THREADS; n++) {
                const int idx = tid + n * THREADS;
                fqla_cp_async16(st + 16 * idx, qk + 8 * idx, 16);
            }
            copy_tile<THREADS>(sm + tp_of(s) + 2 * TILE, bp.Pt + tile * C * C);
            for (int idx = tid; idx < NWG * C * 2; idx += THREADS) { /* slice, row, 32-column half */
                const int col = VS * (slice0 + idx / (2 * C)) + 32 * (idx & 1), r = (idx >> 1) % C;
                if (col < p.V && r < nv)
                    fqla_prefetch_l2((const float *)p.v + batch * p.v_sb + (t0 + r) * p.v_st + (int64_t)hv * p.v_sh + col);
            }
        } else {
            copy_plane<KD, THREADS>(st, (const uint16_t *)p.k + batch * p.k_sb + t0 * p.k_st + (int64_t)hk * p.k_sh,
                                    p.k_st, KD, nv, vec);
            if constexpr (REVERSE) {
                copy_plane<KD, THREADS>(st + L::KP,
                                        (const uint16_t *)p.q + batch * p.q_sb + t0 * p.q_st + (int64_t)hk * p.q_sh,
                                        p.q_st, KD, nv, vec);
                copy_tile<THREADS>(sm + tp_of(s) + 2 * TILE, bp.Pt + tile * C * C);
            }
            /* each real slice's V or dO columns (identity slices have zero input, never read) */
#pragma unroll
            for (int w = 0; w < NWG; w++) {
                const int c0 = VS * (slice0 + w);
                if (c0 >= p.V) break;
                const int64_t off = REVERSE ? batch * bp.do_sb + t0 * bp.do_st + (int64_t)hv * bp.do_sh + c0
                                            : batch * p.v_sb + t0 * p.v_st + (int64_t)hv * p.v_sh + c0;
                copy_plane<VS, THREADS>(st + L::NQK * L::KP + w * TILE, (const uint16_t *)(REVERSE ? bp.d_o : p.v) + off,
                                        REVERSE ? bp.do_st : p.v_st, p.V - c0, nv, vec);
            }
        }
        copy_tile<THREADS>(sm + tp_of(s), bp.Tt + tile * C * C);
        if (tid < C / 4) { /* the workspace rows: 16-byte aligned always */
            chain_rows &r = rows[s];
            fqla_cp_async16(&r.gam[4 * tid], p.gam + tile * C + 4 * tid, 16);
            fqla_cp_async16(&r.bet[4 * tid], bp.bet + tile * C + 4 * tid, 16);
            if (!F32 && p.l2norm) { /* fp32: the planes are normalised */
                const size_t rrow = ((size_t)slot * p.H + hk) * C;
                fqla_cp_async16(&r.rk[4 * tid], p.rk + rrow + 4 * tid, 16);
                if (REVERSE) fqla_cp_async16(&r.rq[4 * tid], p.rq + rrow + 4 * tid, 16);
            }
        }
        fqla_cp_async_commit();
    };

    if (chunks > it0) issue(chunk_at(it0), it0 & 1);
    for (int it = it0; it < chunks; it++) {
        const int c = chunk_at(it), s = it & 1, nv = nvalid_of(c);
        const size_t tile = (size_t)(slot0 + c) * p.HV + hv;
        unsigned char *st = stage(s);
        const uint32_t k_hi = fqla_smem_u32(st), q_hi = k_hi + L::KP;
        const uint32_t tp = s0 + tp_of(s);
        const fqla_wg_tile Tt{tp, tp + TILE, C}, Pt{tp + 2 * TILE, tp + 3 * TILE, C};
        const fqla_wg_tile Kt{k_hi, F32 ? k_hi + L::KP : CONVERT ? s0 + L::lo : 0u, C};
        const fqla_wg_tile Qt{F32 ? k_hi + 2 * L::KP : q_hi,
                              F32 ? k_hi + 3 * L::KP : CONVERT ? s0 + L::lo + L::KP : 0u, C};
        const fqla_wg_tile Xt{fqla_smem_u32(st + L::NQK * L::KP + wg * TILE), 0u, C};
        const chain_rows &r = rows[s];

        fqla_cp_async_wait_all(); /* this chunk's copies (this thread's) */
        fqla_fence_async_smem();  /* cp.async wrote through the generic proxy; wgmma reads through the async one */
        __syncthreads();          /* (a) every thread's copies; chunk it - 1 fully read */
        if constexpr (CONVERT && !F32) {
            split_plane<T, KD, THREADS>(st, sm + L::lo, p.l2norm ? r.rk : nullptr, nv);
            if constexpr (REVERSE)
                split_plane<T, KD, THREADS>(st + L::KP, sm + L::lo + L::KP, p.l2norm ? r.rq : nullptr, nv);
        }
        const float gC = r.gam[C - 1], eC = __expf(gC);
        if (tid < C) {
            const float gm = r.gam[tid], e = __expf(gm);
            cf.e[tid] = REVERSE ? p.scale * e : e;
            cf.f[tid] = __expf(gC - gm);
            cf.b[tid] = REVERSE ? -e * r.bet[tid] : r.bet[tid];
        }
        /* the previous chunk's bulk copy has read its staging plane */
        if (!REVERSE && IO_BF16 && (tid & 127) == 0) fqla_bulk_wait_read<0>();
        fqla_fence_async_smem();
        __syncthreads(); /* (b) the converted planes and the factors; the staging planes free */

        if (it + 1 < chunks) issue(chunk_at(it + 1), s ^ 1);
        /* the state entering a full chunk past its sequence's or segment's first:
         * its bf16 plane, staged and written by one bulk copy (below) */
        const bool s16 = !REVERSE && IO_BF16 && active && mode != CHAIN_PREPASS && bwd_state_bf16(c, nv, seq_len);
        /* store the state entering (states) / the gradient leaving (dstates) this chunk */
        if (!F32 && active && mode != CHAIN_PREPASS && !s16) {
            float *dst = (REVERSE ? bp.dS : bp.S) + tile * KD * p.V + v0;
#pragma unroll
            for (int a = 0; a < NS; a++) {
                const int v = vr + row8_of(a);
                if (v < vw) dst[(int64_t)kc(a) * p.V + v] = S[a];
            }
        }
        /* (K S)^T or (K dS)^T: [value row][token]. Nothing between a wgmma's
         * issue and its wait branches (ptxas serializes wgmma in flight
         * across a branch it cannot prove uniform: its C7518), and a
         * warpgroup without a slice runs the products too, on zeros, its
         * results unused. */
        uint32_t sh[KK][4], sl[KK][4];
        float ks[32];
        fqla_wg_frags(S, sh, sl);
        if constexpr (!REVERSE && IO_BF16) {
            if (s16) {
                /* S's hi values (S^T's A fragments) into the staging plane [k][v]
                 * by stmatrix.trans: k-step kk's four 8 x 8 matrices (value rows
                 * +0 / +8, key columns +0 / +8), lane l addressing row l % 8 of
                 * matrix l / 8; then one bulk copy of the plane (the gradient
                 * kernel's S tile as it stores it, bwd_grads.cu) */
                unsigned char *pl = sm + L::stg + wg * KD * 128;
                const int lane = tid & 31, m = lane >> 3, chunk = 2 * ((tid >> 5) & 3) + (m & 1);
#pragma unroll
                for (int kk = 0; kk < KK; kk++) {
                    const int k = 16 * kk + 8 * (m >> 1) + (lane & 7);
                    fqla_stsm_x4_t(pl + fqla_wg_off(KD, k, 8 * chunk), sh[kk][0], sh[kk][1], sh[kk][2], sh[kk][3]);
                }
                fqla_fence_async_smem();
                fqla_bar_sync(chain_bar::staged, 128, (uint32_t)wg);
                if ((tid & 127) == 0) {
                    fqla_bulk_store(bwd_state_plane<KD>(bp.S, tile, p.V, v0), pl, KD * 128);
                    fqla_bulk_commit();
                }
            }
        }
        float x[32];       /* V^T or dO^T (identity slices, no slice: zeros) */
        float qs[32];      /* F32: (Q S)^T, then O^T */
        uint32_t xr[4][4]; /* the same as raw 2-byte pairs (not F32) */
        if constexpr (F32) { /* fp32 v from global memory (in L2: issue()), in flight under K S */
            const bool rows = active && !ident;
#pragma unroll
            for (int a = 0; a < 32; a++) {
                const int t = col_of(a), v = vr + row8_of(a);
                x[a] = rows && t < nv && v < vw
                           ? ((const float *)p.v)[batch * p.v_sb + (start + (int64_t)c * C + t) * p.v_st +
                                                  (int64_t)hv * p.v_sh + v0 + v]
                           : 0.f;
            }
        }
        pin_a(sh, sl);
        fqla_wg_issue(ks, [&] { fqla_wg_rs_split<64, 0, true, CONVERT>(ks, sh, sl, Kt, false); });
        if constexpr (F32) fqla_wg_issue(qs, [&] { fqla_wg_rs_split<64, 0, true, true>(qs, sh, sl, Qt, false); });
        if constexpr (!F32) {
            fqla_wg_load_t<4>(Xt, xr, 0);
            const uint32_t keep = ident || !active ? 0u : ~0u;
#pragma unroll
            for (int kk = 0; kk < 4; kk++)
#pragma unroll
                for (int q = 0; q < 4; q++) xr[kk][q] &= keep;
        }
        fqla_wg_retire(ks);
        if constexpr (F32) fqla_reg_fence(qs);
        pin_a(sh, sl);
        if constexpr (!F32) bwd_widen_frags<T>(xr, x);
        if constexpr (!REVERSE) {
            /* Y^T = (V^T - (K S)^T diag(e)) diag(beta);  U^T = Y^T T~^T */
#pragma unroll
            for (int a = 0; a < 32; a++) {
                const int t = col_of(a);
                x[a] = cf.b[t] * (x[a] - cf.e[t] * ks[a]);
            }
            uint32_t yh[4][4], yl[4][4];
            fqla_wg_frags(x, yh, yl);
            float u[32];
            rs_run(u, yh, yl, [&] { fqla_wg_rs_split<64, 0, true, true>(u, yh, yl, Tt, false); });
            if constexpr (F32) chain_f32_out(bp, qs, u, Pt, cf, mode != CHAIN_PREPASS && active && !ident, batch,
                                             start + (int64_t)c * C, nv, hv, v0 + vr, vw - vr);
            /* S^T = e_C S^T + (f U)^T K */
#pragma unroll
            for (int a = 0; a < 32; a++) u[a] *= cf.f[col_of(a)];
            uint32_t uh[4][4], ul[4][4];
            fqla_wg_frags(u, uh, ul);
#pragma unroll
            for (int a = 0; a < NS; a++) S[a] *= eC;
            rs_run(S, uh, ul, [&] { fqla_wg_rs_split<KD, 1, true, CONVERT>(S, uh, ul, Kt, true); });
        } else {
            /* dU^T = dO^T P~ + (K dS)^T diag(f) */
            uint32_t oh[4][4], ol[4][4];
            if constexpr (IO_BF16) {
#pragma unroll
                for (int kk = 0; kk < 4; kk++)
#pragma unroll
                    for (int q = 0; q < 4; q++) oh[kk][q] = ol[kk][q] = xr[kk][q];
            } else {
                fqla_wg_frags(x, oh, ol);
            }
            float du[32];
            rs_run(du, oh, ol, [&] { fqla_wg_rs_split<64, 1, !IO_BF16, true>(du, oh, ol, Pt, false); });
#pragma unroll
            for (int a = 0; a < 32; a++) du[a] += cf.f[col_of(a)] * ks[a];
            /* dY^T = dU^T T~ */
            uint32_t dh[4][4], dl[4][4];
            fqla_wg_frags(du, dh, dl);
            float dy[32];
            rs_run(dy, dh, dl, [&] { fqla_wg_rs_split<64, 1, true, true>(dy, dh, dl, Tt, false); });
            /* dS^T = e_C dS^T + (scale diag(e) dO)^T Q - (diag(e beta) dY)^T K */
#pragma unroll
            for (int a = 0; a < 32; a++) {
                const int t = col_of(a);
                dy[a] *= cf.b[t];
                x[a] *= cf.e[t];
            }
            uint32_t eh[4][4], el[4][4], yh[4][4], yl[4][4];
            fqla_wg_frags(x, eh, el);
            fqla_wg_frags(dy, yh, yl);
#pragma unroll
            for (int a = 0; a < NS; a++) S[a] *= eC;
            pin_a(eh, el);
            pin_a(yh, yl);
            fqla_wg_run(S, [&] {
                fqla_wg_rs_split<KD, 1, true, CONVERT>(S, eh, el, Qt, true);
                fqla_wg_rs_split<KD, 1, true, CONVERT>(S, yh, yl, Kt, true);
            });
            pin_a(eh, el);
            pin_a(yh, yl);
        }
    }
    /* the bulk copies of the staged states done before the CTA (and its shared
     * memory) goes */
    if (!REVERSE && IO_BF16 && (tid & 127) == 0) fqla_bulk_wait<0>();
    if (!active) return;
    if (F32 && mode != CHAIN_PREPASS) { /* the final state, from the sequence's last span */
        if (p.ht && last)
#pragma unroll
            for (int a = 0; a < NS; a++) {
                const int v = vr + row8_of(a);
                if (v >= vw) continue;
                const int64_t o = fqla_fwd_state_off(n, hv, kc(a), v0 + v, p.ht_sn, p.ht_sh, p.ht_s2, p.ht_v_first);
                if (p.ht_bf16) ((__nv_bfloat16 *)p.ht)[o] = __float2bfloat16_rn(S[a]);
                else ((float *)p.ht)[o] = S[a];
            }
        return;
    }
    if (mode == CHAIN_PREPASS) { /* the segment's [H | M] */
        const int64_t W = p.V + KD;
        float *hm = bp.cp_hm[REVERSE] + ((size_t)row * p.HV + hv) * KD * W + v0;
#pragma unroll
        for (int a = 0; a < NS; a++) {
            const int v = vr + row8_of(a);
            if (v < vw) hm[(int64_t)kc(a) * W + v] = S[a];
        }
        return;
    }
    if (REVERSE && bp.dh0 && first)
#pragma unroll
        for (int a = 0; a < NS; a++) {
            const int v = vr + row8_of(a);
            if (v < vw)
                bp.dh0[fqla_fwd_state_off(n, hv, kc(a), v0 + v, bp.dh0_sn, bp.dh0_sh, bp.dh0_s2, p.v_first)] = S[a];
        }
}

/* The two chains in one launch. They are independent (each reads only
 * prepare's workspace and the inputs), so their CTAs share the GPU: where
 * sequences x value heads leave SMs idle, one launch fills twice as many as
 * two launches one after the other (with the CP pre-pass's window, faster
 * on every CP row timed; where the chains fill the SMs without CP a step
 * is 3-10 % slower than with two separate kernels, cause not found:
 * docs/history/2026-12-05-bwdchains.md, so there launch() runs the
 * single-direction instances, DIRS). blockIdx.z: the reverse chain's
 * slice pairs first (its chunk step is the longer), then the state
 * chain's; a grid of the first zpairs alone runs the reverse chain alone
 * (dh0 alone: the state chain feeds only the gradient kernel). Both bodies
 * are inlined here, so the kernel takes the larger shared-memory layout,
 * the reverse chain's. */
enum chain_dirs { CHAINS_BOTH, CHAIN_REVERSE_ONLY, CHAIN_STATES_ONLY };

/* This CTA's work: its row (sequence or segment), value head and slice
 * pair (blockIdx.z's meaning). CTAs start in the order of their linear
 * index, x fastest. Whole sequences of unequal lengths (bp.n_order) are
 * taken longest first: all CTAs of the longest sequence (the reverse
 * chain's slice pairs before the state chain's, its step is the longer),
 * then the next, so that the long walks start in the first wave and the
 * short ones fill the SMs behind them (the longest-processing-time-first
 * list schedule; in index order a long sequence's CTAs can start in the last
 * wave: on the bench's hk16_hv32 8k_8seq, 32k_4seq and 32k_8seq rows a
 * model of the launch puts the chains' span 21-24 % over this order's). */
__device__ __forceinline__ void chain_cta(const fqla_bwd_params &bp, int mode, int64_t &row, int &hv, int &z)
{
    row = blockIdx.x;
    hv = (int)blockIdx.y;
    z = (int)blockIdx.z;
    if (mode != CHAIN_WHOLE || bp.n_order == 0) return;
    const int64_t per = (int64_t)gridDim.y * gridDim.z; /* CTAs a sequence */
    const int64_t lin = blockIdx.x + (int64_t)gridDim.x * (blockIdx.y + (int64_t)gridDim.y * blockIdx.z);
    const int64_t rank = lin / per, rest = lin % per;
    z = (int)(rest / gridDim.y);
    hv = (int)(rest % gridDim.y);
    row = rank < bp.n_order ? bp.seq_order[rank] : rank;
}
template <typename T, int KD, bool CONVERT, int DIRS, int NWG>
__global__ void __launch_bounds__(128 * NWG, 1)
    bwd_chain_kernel(const fqla_bwd_params bp, int vec, int mode, int zpairs)
{
    extern __shared__ unsigned char smem_raw[];
    /* 1024-aligned by an offset from smem_raw, not a round trip through an
     * integer: the compiler then still knows the pointers below are shared and
     * emits LDS / STS, not generic LD / ST (fwd_chunk_wg.cu's reason) */
    unsigned char *sm = smem_raw + ((1024u - (fqla_smem_u32(smem_raw) & 1023u)) & 1023u);
    int64_t row;
    int hv, z;
    chain_cta(bp, mode, row, hv, z);
    /* the gradient kernel may start beside the chains (bp.chain_done): once
     * every chain CTA has started, so none of them waits for an SM behind a
     * gradient CTA that waits for it */
    fqla_pdl_trigger();
    if constexpr (DIRS == CHAIN_REVERSE_ONLY) {
        chain_run<T, KD, true, CONVERT, NWG>(bp, vec, mode, row, hv, z, sm);
    } else if constexpr (DIRS == CHAIN_STATES_ONLY) {
        chain_run<T, KD, false, CONVERT, NWG>(bp, vec, mode, row, hv, z, sm);
    } else {
        if (z < zpairs)
            chain_run<T, KD, true, CONVERT, NWG>(bp, vec, mode, row, hv, z, sm);
        else
            chain_run<T, KD, false, CONVERT, NWG>(bp, vec, mode, row, hv, z - zpairs, sm);
    }
    if (bp.chain_done && mode == CHAIN_WHOLE) {
        /* this CTA's states are stored (its bulk copies waited for in
         * chain_run): count it for its (sequence, value head), releasing
         * every thread's stores (the barrier orders them before thread 0's
         * fence, which is cumulative) */
        if ((threadIdx.x & 127) == 0) fqla_fence_async_global(); /* the bulk stores' issuers */
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence();
            atomicAdd(&bp.chain_done[row * bp.f.HV + hv], 1);
        }
    }
}

/* Grid: sequences (CHAIN_WHOLE) or segment indices (with CP), value heads,
 * per chain the groups of NWG 64-column slices of V (the pre-pass: and of
 * the K identity columns); the state chain only where its states are
 * stored (bp.S; not with dh0 alone). */
template <typename T, int KD, bool CONVERT, int DIRS, int NWG>
cudaError_t launch_dirs(const fqla_bwd_params &p, int mode, dim3 grid, int zpairs, cudaStream_t stream)
{
    static fqla_smem_cache cache;
    using LR = chain_layout<KD, true, CONVERT, NWG>;
    using LS = chain_layout<KD, false, CONVERT, NWG>;
    static_assert(LR::bytes >= LS::bytes, "the reverse chain's layout is the larger");
    static_assert(LR::bytes >= LS::staged_bytes && LS::staged_bytes >= LS::bytes, "the state chain's staging fits");
    const size_t smem = DIRS == CHAIN_STATES_ONLY ? LS::staged_bytes : LR::bytes;
    cudaError_t e = fqla_smem_limit(cache, bwd_chain_kernel<T, KD, CONVERT, DIRS, NWG>, smem);
    if (e != cudaSuccess) return e;
    return fqla_launch(bwd_chain_kernel<T, KD, CONVERT, DIRS, NWG>, grid, dim3(128 * NWG), smem, stream, 0, p,
                       fqla_bwd_rows16(p, FQLA_BWD_ROWS_ALL), mode, zpairs);
}

/* Without CP (CHAIN_WHOLE) the two chains run as two kernels, one after the
 * other, each compiled with its own body only, where that costs no wave of
 * CTAs (one an SM) against running them side by side in one launch and every
 * sequence has the same length: there the chains took 3-5 % less (hk16_hv32
 * and hk8_hv16, 8 x 1024 tokens, H100), and on hk2_hv4 8k_8seq, where one
 * launch runs both directions in one wave, two took +50 %
 * (docs/history/2026-12-06-bwdprep.md). With unequal lengths each of two
 * launches waits for its longest sequence, where one launch starts the other
 * chain's CTAs as the short sequences' finish: the bench's hk16_hv32 8k_4seq
 * (5809 + 1244 + 406 + 733 tokens) took 1.89 ms against 1.53 in one launch
 * (docs/history/2026-12-06-bwdnext.md). bwd.cu's chain_nwg_of prices this
 * choice beside the CTA's warpgroups. */
template <typename T, int KD, bool CONVERT, int NWG>
cudaError_t launch_nwg(const fqla_bwd_params &p, int mode, cudaStream_t stream)
{
    const int64_t rows = fqla_bwd_chain_rows(p);
    const int64_t slices = (p.f.V + VS - 1) / VS + (mode == CHAIN_PREPASS ? KD / VS : 0);
    const int zpairs = (int)((slices + NWG - 1) / NWG);
    const dim3 one((unsigned)rows, (unsigned)p.f.HV, (unsigned)zpairs);
    const int64_t n = rows * p.f.HV * zpairs, sms = p.sms > 0 ? p.sms : 1;
    if (mode == CHAIN_WHOLE && p.S && p.uniform && fqla_cp_waves(2 * n, sms) >= 2 * fqla_cp_waves(n, sms)) {
        cudaError_t e = launch_dirs<T, KD, CONVERT, CHAIN_REVERSE_ONLY, NWG>(p, mode, one, zpairs, stream);
        if (e != cudaSuccess) return e;
        return launch_dirs<T, KD, CONVERT, CHAIN_STATES_ONLY, NWG>(p, mode, one, zpairs, stream);
    }
    const dim3 both((unsigned)rows, (unsigned)p.f.HV, (unsigned)(zpairs * (p.S ? 2 : 1)));
    return launch_dirs<T, KD, CONVERT, CHAINS_BOTH, NWG>(p, mode, both, zpairs, stream);
}

/* One warpgroup a CTA where bwd.cu chose it (fqla_bwd_params.chain_nwg:
 * for whole sequences where it pays; with CP two, the shape cp_plan.h
 * prices, unless a developer build forces one to time it). */
template <typename T, int KD, bool CONVERT> cudaError_t launch(const fqla_bwd_params &p, int mode, cudaStream_t stream)
{
    if (p.chain_nwg == 1) return launch_nwg<T, KD, CONVERT, 1>(p, mode, stream);
    return launch_nwg<T, KD, CONVERT, 2>(p, mode, stream);
}

/* bf16 io with or without l2norm, or fp16 (always converted) */
template <int KD> cudaError_t launch_io(const fqla_bwd_params &p, int io_bf16, int mode, cudaStream_t stream)
{
    if (!io_bf16) return launch<__half, KD, true>(p, mode, stream);
    return p.f.l2norm ? launch<__nv_bfloat16, KD, true>(p, mode, stream)
                      : launch<__nv_bfloat16, KD, false>(p, mode, stream);
}

cudaError_t launch_chains(const fqla_bwd_params &p, int io_bf16, int mode, cudaStream_t stream)
{
    return p.f.K == 64 ? launch_io<64>(p, io_bf16, mode, stream) : launch_io<128>(p, io_bf16, mode, stream);
}

/* The fp32 forward (bwd_common.cuh, fqla_fwd_launch_chain_f32): the state
 * chain's fp32 instance, p.chain_nwg 64-column slices a CTA, over whole
 * sequences or the CP pass f.cp_mode names (1 the pre-pass, 2 the main pass). */
template <int KD, int NWG> cudaError_t launch_f32(const fqla_bwd_params &p, cudaStream_t stream)
{
    static fqla_smem_cache cache;
    using L = chain_layout<KD, false, true, NWG, true>;
    const int mode = p.f.cp_mode == 1 ? CHAIN_PREPASS : p.f.cp_mode == 2 ? CHAIN_MAIN : CHAIN_WHOLE;
    const int64_t slices = (p.f.V + VS - 1) / VS + (mode == CHAIN_PREPASS ? KD / VS : 0);
    const int zpairs = (int)((slices + NWG - 1) / NWG);
    auto kernel = bwd_chain_kernel<float, KD, true, CHAIN_STATES_ONLY, NWG>;
    cudaError_t e = fqla_smem_limit(cache, kernel, L::bytes);
    if (e != cudaSuccess) return e;
    return fqla_launch(kernel, dim3((unsigned)fqla_bwd_chain_rows(p), (unsigned)p.f.HV, (unsigned)zpairs),
                       dim3(128 * NWG), L::bytes, stream, 0, p, 1, mode, zpairs);
}

#ifdef FQLA_DEV
template <typename T, int KD, bool CONVERT, int NWG>
cudaError_t launch_states(const fqla_bwd_params &p, cudaStream_t stream)
{
    const int zpairs = (int)(((p.f.V + VS - 1) / VS + NWG - 1) / NWG);
    return launch_dirs<T, KD, CONVERT, CHAIN_STATES_ONLY, NWG>(
        p, p.f.cp_mode ? CHAIN_MAIN : CHAIN_WHOLE,
        dim3((unsigned)fqla_bwd_chain_rows(p), (unsigned)p.f.HV, (unsigned)zpairs), zpairs, stream);
}
#endif

} // namespace

#ifdef FQLA_DEV
cudaError_t fqla_bwd_launch_chain_states(const fqla_bwd_params &p, int io_bf16, cudaStream_t stream)
{
    /* the fused reverse pass's coverage: bf16 io, K = 128, no l2norm; with CP
     * the main pass (after both chains' pre-passes and the scan) */
    if (!io_bf16 || p.f.K != 128 || p.f.l2norm) return cudaErrorNotSupported;
    return p.chain_nwg == 1 ? launch_states<__nv_bfloat16, 128, false, 1>(p, stream)
                            : launch_states<__nv_bfloat16, 128, false, 2>(p, stream);
}
#endif

cudaError_t fqla_fwd_launch_chain_f32(const fqla_bwd_params &p, cudaStream_t stream)
{
    if (p.f.K == 64) return p.chain_nwg == 1 ? launch_f32<64, 1>(p, stream) : launch_f32<64, 2>(p, stream);
    return p.chain_nwg == 1 ? launch_f32<128, 1>(p, stream) : launch_f32<128, 2>(p, stream);
}

cudaError_t fqla_bwd_launch_chains(const fqla_bwd_params &p, int io_bf16, cudaStream_t stream)
{
    return launch_chains(p, io_bf16, p.f.cp_mode ? CHAIN_MAIN : CHAIN_WHOLE, stream);
}

cudaError_t fqla_bwd_launch_chains_prepass(const fqla_bwd_params &p, int io_bf16, cudaStream_t stream)
{
    return launch_chains(p, io_bf16, CHAIN_PREPASS, stream);
}
