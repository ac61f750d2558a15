/*
 * bwd_common.cuh - what the backward's kernels share: the launch parameters,
 * the workspace layout, and a few device helpers.
 *
 * The backward (docs/design.md, "The backward's kernels") runs over the
 * forward's chunk slots (fwd_common.cuh):
 *   prepare   (bwd_prepare.cu)  chunk-parallel: gamma, beta, the l2norm row
 *             factors, T~ = (I + StrictLower(diag(beta) (Gamma . K K^T)))^-1
 *             and P~ = scale Gamma . tril(Q K^T), per chunk and value head
 *             (these two stored as the hi / lo planes their consumers take);
 *   chains    (bwd_chain.cu)    in one launch, two independent chains:
 *             the forward's state chain again, storing the state entering
 *             every chunk (fp32), and the reverse chain, storing the
 *             gradient with respect to the state leaving every chunk (fp32),
 *             and dh0;
 *   grads     (bwd_grads.cu)    chunk-parallel, on wgmma: every per-token
 *             gradient of a chunk from its two stored states (dq, dk summed
 *             over the GVA group inside the CTA, in order);
 *   finish    (bwd_finish.cu)   dA_log / ddt_bias summed over the chunks in
 *             a fixed order; rows past the last sequence zeroed.
 * Where sequences x value heads leave the SMs idle, the chains run with
 * context parallelism instead (bwd_chain_cp.cu: a pre-pass over segments,
 * a scan, the main pass, each one launch for both chains; the plan is
 * cp_plan.h's fqla_cp_bwd_seg_chunks).
 * Nothing is reduced with atomics, so a rerun gives bit-identical gradients.
 *
 * Precision (the numerics model dev/models/bwd_chunked.py and its results in
 * bench/results/bwd-model.md): the chains' and the gradient kernel's
 * products run on bf16 tensor cores with every operand that is not an
 * exact bf16 input split into hi / lo bf16 planes (kernel/wg_split.cuh:
 * three products, ~16 significant bits per operand), fp32 accumulation;
 * T~ is solved in fp32 on CUDA cores; the per-chunk states are stored in
 * fp32 (as hi / lo planes, <S, dS'> lost a one-token dg: history
 * 2026-12-05-bwdplanes.md); dg is assembled from per-term products, never
 * from differences of cumulative sums. Plain bf16 or tf32 products, or bf16 stored states, held
 * the thresholds on long sequences but not on the short ones of
 * tests/test_gpu_bwd.c, where a gradient of one token is a single sum whose
 * terms cancel (e.g. de_C = <S, dS'> against sum e_i de_i).
 */
#ifndef FQLA_CUDA_BWD_COMMON_CUH
#define FQLA_CUDA_BWD_COMMON_CUH

#include "cuda/fwd_common.cuh"
#if defined(__CUDACC__) || defined(FQLA_EMU) /* FQLA_EMU: dev/emu/cuda_emu.h */
#include "cuda/fwd_prepare_common.cuh" /* find_slot */
#endif
#include "cuda/ptx/misc.cuh"
#include "cuda/ptx/mma_sync.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#define FQLA_BWD_C 64 /* chunk */
#define FQLA_BWD_VS 64 /* value columns per chain CTA (a last slice of V may be half full) */
/* A sequence of at most this many chunks runs every chunk's gradients with
 * split operands, as a partial chunk does (bwd_grads.cu's tails launch,
 * FQLA_BWD_SHORT_CHUNKS CTAs a sequence), and keeps its states fp32: the
 * lean products' dg has a heavy tail on short sequences (the numerics model,
 * bench/results/bwd-model-tail.md: 1 in 4000 (sequence, head) draws of 64
 * tokens over 2e-2, 128 tokens up to 1.6e-2; split ~1e-4). */
#define FQLA_BWD_SHORT_CHUNKS 4

/* Sequences the chains' longest-first order covers (fqla_bwd_params.
 * seq_order): 512 bytes of kernel parameters. Longer batches run in index
 * order. */
#define FQLA_BWD_ORDER_MAX 256

struct fqla_bwd_params {
    fqla_fwd_params f;        /* the forward's inputs, shapes, options, slots; f.rq, f.rk: the
                                 l2norm row factors [slots][H][64] (l2norm only) */
    const void *d_o;          /* [B][T][HV][V] io dtype */
    int64_t do_sb, do_st, do_sh;
    const float *dht;         /* [N][HV][K][V] (or [V][K]) f32, NULL: zero */
    int64_t dht_sn, dht_sh, dht_s2;
    void *dq, *dk, *dv;       /* io dtype */
    int64_t dq_sb, dq_st, dq_sh;
    int64_t dk_sb, dk_st, dk_sh;
    int64_t dv_sb, dv_st, dv_sh;
    float *dg, *dbeta;        /* [B][T][HV] */
    int64_t dg_sb, dg_st, dg_sh;
    int64_t db_sb, db_st, db_sh;
    float *dh0;               /* [N][HV][K][V] (or [V][K]) f32, NULL: not wanted */
    int64_t dh0_sn, dh0_sh, dh0_s2;
    float *dA_log, *ddt_bias; /* [HV] (gate in kernel) */
    int64_t dalog_s, ddtb_s;
    /* workspace */
    float *bet;               /* [slots][HV][64] beta (f.gam: the chunk-local cumsum of the log
                                 decay, where the forward's CP test fqla_cp_m_negligible reads it) */
    float *Tt, *Pt;           /* [slots][HV] T~ and P~, each as its hi / lo bf16 planes (bwd_prepare.cu) */
    uint16_t *qkp;            /* the fp32 forward on these kernels only (fwd_chain_f32): [slots][H] the
                                 chunk's k and q (after the l2norm) as hi / lo bf16 planes, k hi, k lo,
                                 q hi, q lo, each [64][K] in kernel/wg_split.cuh's layout (the prepare
                                 kernel's group-first CTA writes them, the chain copies them) */
    float *S, *dS;            /* [slots][HV][K][V] entering state (NULL with dh0 alone), fp32, or
                                 where bwd_state_bf16 says, a bf16 plane a 64-column slice at the
                                 tile's start; gradient w.r.t. the leaving state, fp32 */
    float *gate_part;         /* [slots][HV][2] per-chunk dA_log, ddt_bias (gate in kernel) */
    float *cp_hm[2];          /* chains' CP (f.cp_mode): [segs][HV][K][V + K] the pre-pass's [H | M],
                                 of the state chain [0] and of the reverse chain [1] (both run at once) */
    /* with CP also f.cp_skip = 1 and the shortcut's flags:
     * f.chunk_ok [slots][HV] (prepare) and f.seg_flag [segs][HV] (pre-pass) */
    int64_t sms;              /* the device's SMs (the chains' launch shape, bwd_chain.cu) */
    int uniform;              /* 1: every sequence has the same length (a padded batch, or packed
                                 sequences whose host cu_seqlens shows it); the chains' launch shape */
    int chain_nwg;            /* chain warpgroups a CTA of the chains' launches, 1 or 2 (bwd.cu's
                                 chain_nwg_of: 2 with CP) */
    /* The chains' whole-sequence launch takes its sequences longest first
     * (bwd_chain.cu, chain_cta): seq_order[r] is the sequence of rank r, for
     * the first n_order ranks (0: in index order). From the host cu_seqlens
     * (bwd.cu's order_of), so at most FQLA_BWD_ORDER_MAX sequences. */
    int n_order;
    uint16_t seq_order[FQLA_BWD_ORDER_MAX];
    /* The gradient kernel beside the chains (bwd.cu's overlapped(): with
     * n_order, no CP, not dh0 alone): chain_done[n HV + hv] counts the chain
     * CTAs of sequence n, value head hv that have stored all their states
     * (zeroed before the chains; n_chain_ctas of them, both chains, every
     * group of chain_nwg slices), and the gradient kernel's launches start during the
     * chains' (PDL), take the sequences shortest first (so in about the
     * order their chains finish: done_cum[r] is the chunk slots of the r
     * shortest, every sequence's ceil(len / 64)), and each CTA waits for its
     * sequence's count before it reads a state. NULL: launches in sequence. */
    int *chain_done;
    int n_chain_ctas;
    int no_tails; /* 1: no chunk for the gradient kernel's tails launch (every sequence empty, or whole
                     chunks and longer than bwd_seq_short), from the host cu_seqlens */
#ifdef FQLA_DEV
    int fused_grads; /* developer build (src/dev/bwd_fused_rev.cu, mode 5): the fused pass formed the
                        gradients of the chunks whose states are bf16 planes (bwd_state_bf16), and the
                        gradient kernel's full-chunk launch leaves them out */
#endif
    int32_t done_cum[FQLA_BWD_ORDER_MAX + 1];
};

struct fqla_bwd_ws_layout {
    size_t gam, bet, rq, rk, Tt, Pt, S, dS, gate_part, cp_hm[2], chunk_ok, seg_flag, chain_done, total;
};

/* segs: the chains' CP segment indices (fqla_cp_segs), 0 without CP.
 * dh0_only: only prepare and the reverse chain run (fqla_problem.dh0_only),
 * so S and gate_part, which only the state chain, grads and finish touch,
 * take no space. */
static inline fqla_bwd_ws_layout fqla_bwd_ws(int64_t slots, int64_t H, int64_t HV, int64_t K, int64_t V, int l2norm,
                                             int gate_in_kernel, int64_t segs, int dh0_only, int64_t done_seqs)
{
    fqla_bwd_ws_layout L;
    size_t off = 0;
    const size_t tiles = (size_t)slots * HV;
    L.gam = off; off += fqla_fwd_align256(tiles * 64 * sizeof(float));
    L.bet = off; off += fqla_fwd_align256(tiles * 64 * sizeof(float));
    L.rq = off;  off += l2norm ? fqla_fwd_align256((size_t)slots * H * 64 * sizeof(float)) : 0;
    L.rk = off;  off += l2norm ? fqla_fwd_align256((size_t)slots * H * 64 * sizeof(float)) : 0;
    L.Tt = off;  off += fqla_fwd_align256(tiles * 64 * 64 * sizeof(float));
    L.Pt = off;  off += fqla_fwd_align256(tiles * 64 * 64 * sizeof(float));
    L.S = off;   off += dh0_only ? 0 : fqla_fwd_align256(tiles * K * V * sizeof(float));
    L.dS = off;  off += fqla_fwd_align256(tiles * K * V * sizeof(float));
    L.gate_part = off; off += gate_in_kernel && !dh0_only ? fqla_fwd_align256(tiles * 2 * sizeof(float)) : 0;
    /* the reverse chain's [H | M] (cp_hm[1]); after it the state chain's (not with dh0 alone) */
    const size_t hm = fqla_fwd_align256((size_t)segs * HV * K * (V + K) * sizeof(float));
    L.cp_hm[1] = off; off += hm;
    L.cp_hm[0] = off; off += dh0_only ? 0 : hm;
    L.chunk_ok = off; off += segs ? fqla_fwd_align256(tiles * sizeof(int)) : 0;
    L.seg_flag = off; off += fqla_fwd_align256((size_t)segs * HV * sizeof(int));
    L.chain_done = off; off += fqla_fwd_align256((size_t)done_seqs * HV * sizeof(int));
    L.total = off;
    return L;
}

/* Whether every row of the 2-byte tensors named by `which` (FQLA_BWD_ROWS_*)
 * starts on a 16-byte boundary, so that the kernels copy them by 16-byte
 * cp.async. (The backward's validation already refuses other rows: this is
 * the kernels' own guard.) */
enum { FQLA_BWD_ROWS_Q = 1, FQLA_BWD_ROWS_K = 2, FQLA_BWD_ROWS_V = 4, FQLA_BWD_ROWS_DO = 8, FQLA_BWD_ROWS_ALL = 15 };
static inline int fqla_bwd_rows16(const fqla_bwd_params &b, int which)
{
    const fqla_fwd_params &p = b.f;
    const struct {
        int bit;
        const void *base;
        int64_t sb, st, sh;
    } t[4] = {{FQLA_BWD_ROWS_Q, p.q, p.q_sb, p.q_st, p.q_sh},
              {FQLA_BWD_ROWS_K, p.k, p.k_sb, p.k_st, p.k_sh},
              {FQLA_BWD_ROWS_V, p.v, p.v_sb, p.v_st, p.v_sh},
              {FQLA_BWD_ROWS_DO, b.d_o, b.do_sb, b.do_st, b.do_sh}};
    for (int i = 0; i < 4; i++)
        if ((which & t[i].bit) && ((uintptr_t)t[i].base % 16 || t[i].sb % 8 || t[i].st % 8 || t[i].sh % 8)) return 0;
    return 1;
}

/* The chains' grid rows: sequences, or with CP (f.cp_mode) segment indices. */
static inline int64_t fqla_bwd_chain_rows(const fqla_bwd_params &b)
{
    return b.f.cp_mode ? fqla_cp_segs(b.f.varlen, b.f.T, b.f.N, b.f.seg_chunks) : b.f.N;
}

/* Launchers (enqueue on stream; return the launch error). */
cudaError_t fqla_bwd_launch_prepare(const fqla_bwd_params &p, int io_bf16, cudaStream_t stream);
/* The two chains (bwd_chain.cu) in one launch, the reverse chain alone
 * where no state is stored (S NULL: dh0 alone): whole sequences, or with CP
 * (f.cp_mode) the main pass. */
cudaError_t fqla_bwd_launch_chains(const fqla_bwd_params &p, int io_bf16, cudaStream_t stream);
cudaError_t fqla_bwd_launch_grads(const fqla_bwd_params &p, int io_bf16, cudaStream_t stream);
cudaError_t fqla_bwd_launch_finish(const fqla_bwd_params &p, int io_bf16, cudaStream_t stream);
/* The chains' CP steps (bwd_chain_cp.cu), for the same chains: the pre-pass
 * of segments into cp_hm, and the scan that writes each segment's starting
 * state. */
cudaError_t fqla_bwd_launch_chains_prepass(const fqla_bwd_params &p, int io_bf16, cudaStream_t stream);
cudaError_t fqla_bwd_launch_chains_scan(const fqla_bwd_params &p, int io_bf16, cudaStream_t stream);
/* The forward of fp32 q/k/v on these kernels (fwd.cu's CHAIN_F32 route,
 * bwd_chain.cu's fp32 instance): p.f holds the forward's inputs and
 * outputs (o, the final state), p.bet / Tt / Pt / qkp the workspace. The
 * prepare kernel in its fp32 form (also the q / k planes), then the state
 * chain storing o: over whole sequences (cp_mode 0), CP's pre-pass of
 * segments into p.cp_hm[0] (cp_mode 1), or its main pass from the scanned
 * start states (cp_mode 2: p.f.h0 = seg_s0, indexed by segment). */
cudaError_t fqla_fwd_launch_chain_f32_prepare(const fqla_bwd_params &p, cudaStream_t stream);
cudaError_t fqla_fwd_launch_chain_f32(const fqla_bwd_params &p, cudaStream_t stream);
#ifdef FQLA_DEV
/* The state chain alone over whole sequences or CP's main pass (the developer build's fused
 * reverse pass, src/dev/bwd_fused_rev.cu, runs the reverse chain's part). */
cudaError_t fqla_bwd_launch_chain_states(const fqla_bwd_params &p, int io_bf16, cudaStream_t stream);
#endif

static_assert(FQLA_BWD_VS == FQLA_CP_BWD_COLS && FQLA_BWD_C == FQLA_CP_CHUNK,
              "cp_plan.h's backward plan counts the chains' CTAs in these units");

/* ------------------------------------------------------------------------ */
/* Device helpers                                                             */

#if defined(__CUDACC__) || defined(FQLA_EMU) /* FQLA_EMU: dev/emu/cuda_emu.h */

/* An io-dtype element (bf16 or fp16) as float. */
template <typename T> __device__ __forceinline__ float bwd_ld(const T *p, int64_t i);
template <> __device__ __forceinline__ float bwd_ld<__nv_bfloat16>(const __nv_bfloat16 *p, int64_t i)
{
    return __bfloat162float(p[i]);
}
template <> __device__ __forceinline__ float bwd_ld<__half>(const __half *p, int64_t i) { return __half2float(p[i]); }
/* A 2-byte io element of dtype T from its raw bits (the low 16 of x), widened. */
template <typename T> __device__ __forceinline__ float bwd_widen(uint32_t x);
template <> __device__ __forceinline__ float bwd_widen<__nv_bfloat16>(uint32_t x) { return __uint_as_float(x << 16); }
template <> __device__ __forceinline__ float bwd_widen<__half>(uint32_t x)
{
    return __half2float(__ushort_as_half((unsigned short)x));
}
/* The raw 2-byte pairs of four k-steps of fqla_wg_load_t (kernel/wg_split.cuh)
 * as floats, in fqla_wg_frags' order. */
template <typename T> __device__ __forceinline__ void bwd_widen_frags(const uint32_t (&x)[4][4], float (&f)[32])
{
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
#pragma unroll
        for (int q = 0; q < 4; q++) {
            f[8 * kk + 2 * q] = bwd_widen<T>(x[kk][q] & 0xffffu);
            f[8 * kk + 2 * q + 1] = bwd_widen<T>(x[kk][q] >> 16);
        }
}
template <typename T> __device__ __forceinline__ T bwd_cvt(float x);
template <> __device__ __forceinline__ __nv_bfloat16 bwd_cvt<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __half bwd_cvt<__half>(float x) { return __float2half_rn(x); }
/* Two floats as an io pair (the first in the low half), and its store at
 * o (one 4-byte store where o allows it). The pack is kernel/io.cuh's
 * fqla_io<T>::pack by integer halves: through that one's reinterpreted
 * bf162 the gradient kernel compiled to other code, with more spills in its
 * lean l2norm instance (56 / 80 -> 60 / 88 bytes), than the code timed. */
template <typename T> __device__ __forceinline__ uint32_t bwd_pack2(float a, float b)
{
    const uint32_t lo = __bfloat16_as_ushort(__float2bfloat16_rn(a)), hi = __bfloat16_as_ushort(__float2bfloat16_rn(b));
    return lo | (hi << 16);
}
template <> __device__ __forceinline__ uint32_t bwd_pack2<__half>(float a, float b)
{
    const uint32_t lo = __half_as_ushort(__float2half_rn(a)), hi = __half_as_ushort(__float2half_rn(b));
    return lo | (hi << 16);
}
template <typename T> __device__ __forceinline__ void bwd_store2(T *o, uint32_t pair)
{
    if (((uintptr_t)o & 3) == 0) {
        *reinterpret_cast<uint32_t *>(o) = pair;
    } else {
        reinterpret_cast<uint16_t *>(o)[0] = (uint16_t)(pair & 0xffffu);
        reinterpret_cast<uint16_t *>(o)[1] = (uint16_t)(pair >> 16);
    }
}

template <int MT, int NT> __device__ __forceinline__ void bwd_zero(float (&acc)[MT][NT][4])
{
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mt][nt][e] = 0.f;
}

/* Calls F(row, col, value) for every accumulator element of the warp's tile. */
template <int MT, int NT, typename F>
__device__ __forceinline__ void bwd_each(float (&acc)[MT][NT][4], int m0, int n0, F f)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                f(m0 + 16 * mt + g + 8 * (e >> 1), n0 + 8 * nt + 2 * t + (e & 1), acc[mt][nt][e]);
}

/* Element (r, v) of a chain's starting state for sequence n, value head
 * hv: h0 (the state chain) or d_final_state (REVERSE), 0 where not given. */
template <bool REVERSE>
__device__ __forceinline__ float bwd_start_state(const fqla_bwd_params &bp, int64_t n, int hv, int r, int v)
{
    const fqla_fwd_params &p = bp.f;
    if (REVERSE)
        return bp.dht ? bp.dht[fqla_fwd_state_off(n, hv, r, v, bp.dht_sn, bp.dht_sh, bp.dht_s2, p.v_first)] : 0.f;
    if (!p.h0) return 0.f;
    const int64_t o = fqla_fwd_state_off(n, hv, r, v, p.h0_sn, p.h0_sh, p.h0_s2, p.v_first);
    return p.h0_bf16 ? __bfloat162float(((const __nv_bfloat16 *)p.h0)[o]) : ((const float *)p.h0)[o];
}

/* Whether a sequence of len tokens is short (FQLA_BWD_SHORT_CHUNKS): all its
 * chunks split, its states fp32. (On the host too: bwd.cu's tails test.) */
__host__ __device__ __forceinline__ bool bwd_seq_short(int64_t len) { return len <= FQLA_BWD_SHORT_CHUNKS * FQLA_BWD_C; }

/* Whether the state chain stores the state entering a chunk (bf16 io only)
 * as bf16 planes instead of fp32: c the chunk's index in its span (the
 * sequence, or with the chains' CP its segment), nvalid its rows, seq_len
 * its sequence's tokens. A plane
 * is what the gradient kernel's lean products read of S (its hi plane),
 * in that kernel's tile layout ([K][64] bf16, kernel/wg_split.cuh's swizzle,
 * one per 64-column slice, KD x 128 bytes each, back to back from the tile's
 * start), so the chains write it with one bulk copy and the gradient kernel
 * copies it as it is, 16 bytes a thread: half the bytes, and no conversion.
 * fp32 stays
 *   - on partial chunks (their gradients split S: the tails' launch);
 *   - on a span's first chunk: a sequence's is h0, whose rounding fails a
 *     one-token sequence's dg (bench/results/bwd-model.md section 6), and a
 *     segment's is written by the CP scan in fp32;
 *   - on every chunk of a short sequence (bwd_seq_short: split products). */
__device__ __forceinline__ bool bwd_state_bf16(int64_t c, int nvalid, int64_t seq_len)
{
    return c > 0 && nvalid == FQLA_BWD_C && !bwd_seq_short(seq_len);
}

/* The bf16 plane of a stored state (bwd_state_bf16) for the 64 value columns
 * from v0: KD x 128 bytes, the slices' planes back to back from the start of
 * the state's [K][V] fp32 tile `tile`. */
template <int KD>
__device__ __forceinline__ unsigned char *bwd_state_plane(float *S, size_t tile, int64_t V, int v0)
{
    return reinterpret_cast<unsigned char *>(S + tile * KD * V) + (size_t)(v0 / FQLA_BWD_VS) * KD * 128;
}

/* The chunk of chunk slot `slot` (fwd_common.cuh): its batch row, first
 * token, valid rows and index c in its sequence; false where the slot holds
 * no chunk. Every thread of a warp calls it (find_slot votes across the warp). */
__device__ __forceinline__ bool bwd_slot_chunk(const fqla_fwd_params &p, int64_t slot, int64_t &batch, int64_t &t0,
                                               int &nvalid, int64_t &c, int64_t &len)
{
    int64_t start;
    if (p.varlen) {
        if (!find_slot(p, slot, c, start, len)) return false;
        batch = 0;
    } else {
        batch = slot / p.cps;
        c = slot % p.cps;
        start = 0;
        len = p.T;
        if (batch >= p.N) return false;
    }
    t0 = start + c * FQLA_BWD_C;
    nvalid = (int)(len - c * FQLA_BWD_C < FQLA_BWD_C ? len - c * FQLA_BWD_C : FQLA_BWD_C);
    return true;
}
/* The same without the chunk's index in its sequence (c) and the sequence's
 * length. */
__device__ __forceinline__ bool bwd_slot_chunk(const fqla_fwd_params &p, int64_t slot, int64_t &batch, int64_t &t0,
                                               int &nvalid)
{
    int64_t c, len;
    return bwd_slot_chunk(p, slot, batch, t0, nvalid, c, len);
}

#endif /* __CUDACC__ */
#endif
