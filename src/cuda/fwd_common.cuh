/*
 * fwd_common.cuh - what the forward's two kernels share: the launch
 * parameters (pointers, strides in elements, options), the workspace layout
 * and where each sequence and chunk lives.
 *
 * The forward runs in two launches (docs/design.md §2):
 *   prepare (fwd_prepare.cu), one CTA per (chunk slot, q/k head), all chunks
 *     in parallel: the in-kernel transforms, gamma = chunk-local cumsum of g,
 *     the q/k l2norm factors, K K^T and Q K^T (shared by the GVA group), and
 *     per value head Ag = Gamma (.) Ar diag(beta) (Ar the gate-free inverse,
 *     formed damped: the gated system's inverse, fp32, blocked forward
 *     substitution) and Pg = scale Gamma (.) tril(Q K^T);
 *   chunk (fwd_chunk_wg.cu on TMA + wgmma, or fwd_chunk.cu on mma.sync), one
 *     CTA per (sequence, value head, V slice), the sequential state
 *     recurrence over the sequence's chunks and the output.
 *
 * Chunk slots: chunk c of sequence n (64 tokens from its start) is stored in
 * slot base(n) + c, with base(n) = floor(cu[n] / 64) + n for packed varlen
 * input and n * ceil(T / 64) for a padded batch. base is strictly increasing
 * and slot < floor(T / 64) + N (varlen), so the workspace size follows from
 * the shapes alone and no kernel needs a prefix sum over the sequences.
 */
#ifndef FQLA_CUDA_FWD_COMMON_CUH
#define FQLA_CUDA_FWD_COMMON_CUH

#include "cuda/cp_plan.h"
#include "cuda/ptx/common.cuh" /* FQLA_SHARED */
#include "cuda/launch.cuh"
#include "cuda/route_plan.h"

extern "C" {
#include "internal.h" /* fqla_problem, fqla_tensor (fqla_fwd_params_inputs) */
}

#include <cuda.h> /* CUtensorMap (a type only) */
#include <cuda_runtime.h>
#include <stdint.h>

#define FQLA_FWD_CHUNK 64
#define FQLA_FWD_THREADS 256
static_assert(FQLA_CP_CHUNK == FQLA_FWD_CHUNK, "cp_plan.h and the kernels share the chunk size");

/* Kernel variants compiled only with FQLA_FWD_TUNING (the developer build,
 * make DEV=1, whose hooks in src/dev/ pick them at run time): the prepare
 * kernel's merges in plain tf32 instead of 3xTF32 (fwd_prepare.cu), and the
 * mma.sync chunk kernel's other copy order (FQLA_FWD_LATE_LOADS: the next
 * chunk's copies issued late, after barrier C, from four warps). The
 * product build has the defaults only, the fastest measured on the H200. */
#ifndef FQLA_FWD_LATE_LOADS
#define FQLA_FWD_LATE_LOADS 1
#endif
#ifndef FQLA_FWD_TUNING
#define FQLA_FWD_TUNING 0 /* the developer build (make DEV=1) sets 1 */
#endif

struct fqla_fwd_params {
    const void *q, *k, *v;
    void *o;
    int64_t q_sb, q_st, q_sh;
    int64_t k_sb, k_st, k_sh;
    int64_t v_sb, v_st, v_sh;
    int64_t o_sb, o_st, o_sh;
    const void *g, *beta;
    int64_t g_sb, g_st, g_sh;
    int64_t b_sb, b_st, b_sh;
    int g_bf16, beta_bf16;
    const float *A_log, *dt_bias;
    int64_t alog_s, dtb_s;
    const void *h0;          /* NULL: zero initial state */
    int h0_bf16;
    int64_t h0_sn, h0_sh, h0_s2;
    void *ht;                /* NULL: no final state */
    int ht_bf16;
    int64_t ht_sn, ht_sh, ht_s2;
    int v_first;             /* h0: [V][K] */
    int ht_v_first;          /* ht: [V][K] (differs from v_first in CP's main pass) */
    const void *cu;          /* device cu_seqlens (varlen) */
    int cu64;
    int varlen;
    int64_t T, N;
    int64_t slots;           /* chunk slots in the workspace */
    int64_t cps;             /* chunks per sequence (padded batch) */
    int H, HV, group, K, V;
    float scale;
    int l2norm, gate_in_kernel, beta_sigmoid, neg_eig;
    /* workspace */
    float *gam;              /* [slots][HV][64] chunk-local cumsum of g */
    float *rq, *rk;          /* [slots][H][64] l2norm factors (l2norm only) */
    void *Ag, *Pg;           /* io dtype; Pg [slots][HV][64][64], Ag packed (below) */
    /* context parallelism (fwd_cp.cu, docs/design.md §5.3): with cp_mode != 0 the
     * chunk kernel's CTAs run segments of seg_chunks chunks instead of whole
     * sequences, and the state index (h0 / ht row) is the segment's index.
     * 1: the pre-pass (state only: no output; value columns past V start
     * from the identity and read V as zeros, so they give the segment's
     * transition M); 2: the main pass from the scanned start states. */
    int cp_mode;
    int64_t seg_chunks;      /* L: chunks per segment */
    int64_t segs;            /* segment indices (grid rows) */
    float *seg_hm;           /* [segs][HV][K][V + K] H | M per segment (fp32) */
    float *seg_s0;           /* [segs][HV][K][V] start state per segment (fp32) */
    /* cp_skip: the pre-pass drops a segment's transition where its decay
     * makes it negligible (m_negligible in fwd_chunk_wg.cu) and says so in
     * seg_flag[segs][HV] (1 = M is taken as 0), which the scan reads. The
     * prepare kernel feeds the test: chunk_ok[slots][HV] = 1 where every
     * token of the chunk has 0 <= beta ||k||^2 <= 2 (NULL: not wanted). */
    int cp_skip;
    int *seg_flag;
    int *chunk_ok;
    /* the final state alone (o absent, o == NULL): the wgmma chunk kernel's
     * state-only variant over whole sequences (cp_mode 0) or, after CP's
     * pre-pass and scan, over each sequence's last segment (cp_mode 2);
     * nothing writes o (fwd.cu, run_state_only) */
    int state_only;
    /* host side only: launch the kernels after the prepare kernel with
     * programmatic dependent launch (ptx/pdl.cuh) */
    int pdl;
    /* the fused kernel (fwd_fused.cu): chain0 is the first chain (sequence
     * x value head, blockIdx.x's unit) of a launch; fused_split > 0 (host
     * side, without CP) runs chains [0, fused_split) with two chain
     * warpgroups per CTA and the rest with one, two CTAs per chain, so that
     * a small last wave takes ~0.8 of a full one (route_plan.h, fqla_route_split) */
    int64_t chain0;
    int64_t fused_split;
};

/* The parts of the launch parameters that come from the forward's inputs
 * alone (fqla_fwd_args and fqla_bwd_args both carry them): q, k, v, g, beta
 * with their element strides and dtypes, the in-kernel gate's A_log /
 * dt_bias, the initial state, the head counts and dims, the scale and the
 * options. The caller sets what its plan decides: the sequences' view (T, N,
 * varlen, cu_seqlens, a padded view's batch strides), the slots and the
 * outputs. */
static inline void fqla_fwd_params_inputs(fqla_fwd_params &k, const fqla_problem *p, const fqla_tensor &q,
                                          const fqla_tensor &kt, const fqla_tensor &v, const fqla_tensor &g,
                                          const fqla_tensor &beta, const fqla_tensor &A_log,
                                          const fqla_tensor &dt_bias, const fqla_tensor &h0)
{
    k.q = q.data; k.k = kt.data; k.v = v.data;
    k.q_sb = q.strides[0]; k.q_st = q.strides[1]; k.q_sh = q.strides[2];
    k.k_sb = kt.strides[0]; k.k_st = kt.strides[1]; k.k_sh = kt.strides[2];
    k.v_sb = v.strides[0]; k.v_st = v.strides[1]; k.v_sh = v.strides[2];
    k.g = g.data; k.beta = beta.data;
    k.g_sb = g.strides[0]; k.g_st = g.strides[1]; k.g_sh = g.strides[2];
    k.b_sb = beta.strides[0]; k.b_st = beta.strides[1]; k.b_sh = beta.strides[2];
    k.g_bf16 = g.dtype == FQLA_DTYPE_BF16;
    k.beta_bf16 = beta.dtype == FQLA_DTYPE_BF16;
    if (p->opt.use_gate_in_kernel) {
        k.A_log = (const float *)A_log.data;
        k.dt_bias = (const float *)dt_bias.data;
        k.alog_s = A_log.strides[0];
        k.dtb_s = dt_bias.strides[0];
    }
    if (h0.data) {
        k.h0 = h0.data;
        k.h0_bf16 = h0.dtype == FQLA_DTYPE_BF16;
        k.h0_sn = h0.strides[0];
        k.h0_sh = h0.strides[1];
        k.h0_s2 = h0.strides[2];
    }
    k.v_first = p->opt.state_v_first;
    k.H = (int)p->H;
    k.HV = (int)p->HV;
    k.group = (int)p->group;
    k.K = (int)p->K;
    k.V = (int)p->V;
    k.scale = (float)p->scale;
    k.l2norm = p->opt.use_qk_l2norm;
    k.gate_in_kernel = p->opt.use_gate_in_kernel;
    k.beta_sigmoid = p->opt.use_beta_sigmoid;
    k.neg_eig = p->opt.allow_neg_eigval;
}

/* Ag's packed layout. Ag (64 x 64 per chunk slot and value head: a tile)
 * is lower triangular, so only its blocks at and left of the diagonal are
 * stored: row strip w (rows 16 w .. 16 w + 15) keeps its first 16 (w + 1)
 * columns, and each strip is a region of its own over all tiles, row-major
 * with a pitch of 16 (w + 1) elements. 2560 elements per tile instead of
 * 4096: the prepare kernel writes and the chunk kernels read 5 / 8 of the
 * square's bytes. The chunk kernels load strip
 * w by TMA as a box of 64 columns whose columns past the strip's width
 * fall outside its map and arrive as zeros, so the shared-memory tile is
 * the square one. */
#define FQLA_FWD_AG_ELEMS 2560
/* strip w's width and row pitch (elements): its blocks at and left of the diagonal */
static inline __host__ __device__ int fqla_fwd_ag_width(int w) { return 16 * (w + 1); }
/* first element of strip w's region (tiles: slots x HV) */
static inline __host__ __device__ int64_t fqla_fwd_ag_strip(int64_t tiles, int w)
{
    return tiles * 16 * 16 * (w * (w + 1) / 2);
}
/* first element of row r (0 .. 63) of tile's Ag; its 16 (r / 16 + 1)
 * columns follow */
static inline __host__ __device__ int64_t fqla_fwd_ag_row(int64_t tiles, int64_t tile, int r)
{
    const int w = r >> 4;
    return fqla_fwd_ag_strip(tiles, w) + (tile * 16 + (r & 15)) * fqla_fwd_ag_width(w);
}

/* the TMA maps of Ag's strips (fwd_tma.cu) */
struct fqla_fwd_ag_maps {
    CUtensorMap strip[4];
};

/* Workspace carve-up (bytes; every region 256-aligned). */
struct fqla_fwd_ws_layout {
    size_t gam, rq, rk, Ag, Pg, seg_hm, seg_s0, seg_flag, chunk_ok, total;
    size_t bet, Tt, Pt, qkp; /* the fp32 chain route's (fqla_fwd_chain_f32_ws), else 0 */
};

static inline size_t fqla_fwd_align256(size_t x) { return (x + 255) & ~(size_t)255; }

/* Element (k, v) of a caller's state (h0 / ht: [N][HV][K][V], or [N][HV][V][K]
 * with v_first), from its strides (fwd_cp.cu's scan, fwd_recurrent.cu). */
__device__ __forceinline__ int64_t fqla_fwd_state_off(int64_t n, int hv, int k, int v, int64_t sn, int64_t sh,
                                                      int64_t s2, int v_first)
{
    return n * sn + hv * sh + (v_first ? (int64_t)v * s2 + k : (int64_t)k * s2 + v);
}

/* CP's buffers from offset off (segs > 0: seg_hm, seg_s0, seg_flag for that
 * many segment indices of K x V states, chunk_ok for every chunk slot), and
 * the total. */
static inline void fqla_fwd_ws_cp(fqla_fwd_ws_layout &L, size_t off, int64_t slots, int64_t HV, int64_t segs,
                                  int64_t K, int64_t V)
{
    L.seg_hm = off; off += fqla_fwd_align256((size_t)segs * HV * K * (V + K) * sizeof(float));
    L.seg_s0 = off; off += fqla_fwd_align256((size_t)segs * HV * K * V * sizeof(float));
    L.seg_flag = off; off += fqla_fwd_align256((size_t)segs * HV * sizeof(int));
    L.chunk_ok = off; off += segs > 0 ? fqla_fwd_align256((size_t)slots * HV * sizeof(int)) : 0;
    L.total = off;
}

/* segs > 0: the CP buffers (fqla_fwd_ws_cp). */
static inline fqla_fwd_ws_layout fqla_fwd_ws(int64_t slots, int64_t H, int64_t HV, int l2norm, size_t io_size,
                                             int64_t segs = 0, int64_t K = 0, int64_t V = 0)
{
    fqla_fwd_ws_layout L;
    size_t off = 0;
    L.gam = off; off += fqla_fwd_align256((size_t)slots * HV * 64 * sizeof(float));
    L.rq = off;  off += l2norm ? fqla_fwd_align256((size_t)slots * H * 64 * sizeof(float)) : 0;
    L.rk = off;  off += l2norm ? fqla_fwd_align256((size_t)slots * H * 64 * sizeof(float)) : 0;
    L.Ag = off;  off += fqla_fwd_align256((size_t)slots * HV * FQLA_FWD_AG_ELEMS * io_size);
    L.Pg = off;  off += fqla_fwd_align256((size_t)slots * HV * 64 * 64 * io_size);
    fqla_fwd_ws_cp(L, off, slots, HV, segs, K, V);
    L.bet = L.Tt = L.Pt = L.qkp = 0;
    return L;
}

/* The fp32 chain route's workspace (route_plan.h FQLA_FWD_CHAIN_F32; the
 * backward's prepare kernel and state chain, bwd_common.cuh): gam, beta, T~
 * and P~ (fp32-sized hi / lo planes) per chunk slot and value head, the q / k
 * planes per slot and q/k head, and with segs > 0 CP's buffers as above. */
static inline fqla_fwd_ws_layout fqla_fwd_chain_f32_ws(int64_t slots, int64_t H, int64_t HV, int64_t K, int64_t V,
                                                       int64_t segs)
{
    fqla_fwd_ws_layout L;
    size_t off = 0;
    const size_t tiles = (size_t)slots * HV;
    L.gam = off; off += fqla_fwd_align256(tiles * 64 * sizeof(float));
    L.bet = off; off += fqla_fwd_align256(tiles * 64 * sizeof(float));
    L.Tt = off;  off += fqla_fwd_align256(tiles * 64 * 64 * sizeof(float));
    L.Pt = off;  off += fqla_fwd_align256(tiles * 64 * 64 * sizeof(float));
    L.qkp = off; off += fqla_fwd_align256((size_t)slots * H * 4 * 64 * K * sizeof(uint16_t));
    L.rq = L.rk = L.Ag = L.Pg = off; /* none */
    fqla_fwd_ws_cp(L, off, slots, HV, segs, K, V);
    return L;
}

/* The workspace of route r over the shape its kernels run (fwd.cu). */
fqla_fwd_ws_layout fqla_fwd_route_ws(const fqla_fwd_shape *s, const fqla_fwd_route *r);

__device__ __forceinline__ int64_t fqla_fwd_cu(const fqla_fwd_params &p, int64_t i)
{
    return fqla_cp_cu(p.cu, p.cu64, i);
}

/* Sequence n: batch row, first token, length and first chunk slot. */
__device__ __forceinline__ void fqla_fwd_seq(const fqla_fwd_params &p, int64_t n, int64_t &batch,
                                             int64_t &start, int64_t &len, int64_t &slot0)
{
    if (p.varlen) {
        start = fqla_fwd_cu(p, n);
        len = fqla_fwd_cu(p, n + 1) - start;
        batch = 0;
        slot0 = start / FQLA_FWD_CHUNK + n;
    } else {
        start = 0;
        len = p.T;
        batch = n;
        slot0 = n * p.cps;
    }
}

/* Segments (cp_mode != 0; cp_plan.h says how they are cut and indexed):
 * sequence n's first segment index, and its segment count. */
__device__ __forceinline__ int64_t fqla_fwd_sbase(const fqla_fwd_params &p, int64_t n)
{
    return fqla_cp_sbase(p.varlen, n, p.varlen ? fqla_fwd_cu(p, n) : 0, p.cps, p.seg_chunks);
}

__device__ __forceinline__ int64_t fqla_fwd_nseg(const fqla_fwd_params &p, int64_t n)
{
    return fqla_cp_nseg(p.varlen ? fqla_fwd_cu(p, n + 1) - fqla_fwd_cu(p, n) : p.T, p.seg_chunks);
}

/* The token span one CTA row of the chunk kernel runs: sequence idx, or with
 * cp_mode segment idx. False (the CTA has nothing to do) for a segment index
 * that belongs to no segment. n is the sequence; last: the span ends the
 * sequence (always without cp_mode). */
__device__ __forceinline__ bool fqla_fwd_span(const fqla_fwd_params &p, int64_t idx, int64_t &n, int64_t &batch,
                                              int64_t &start, int64_t &len, int64_t &slot0, bool &last)
{
    last = true;
    if (!p.cp_mode) {
        n = idx;
        fqla_fwd_seq(p, n, batch, start, len, slot0);
        return true;
    }
    int64_t j;
    n = fqla_cp_segment(p.varlen ? p.cu : NULL, p.cu64, p.N, p.T, p.cps, p.seg_chunks, idx, &j);
    if (n < 0) return false;
    fqla_fwd_seq(p, n, batch, start, len, slot0);
    const int64_t off = j * p.seg_chunks * FQLA_FWD_CHUNK, seg = p.seg_chunks * FQLA_FWD_CHUNK;
    last = len - off <= seg;
    start += off;
    len = len - off < seg ? len - off : seg;
    if (len < 0) len = 0;
    slot0 += j * p.seg_chunks;
    return true;
}

/* Whether segment span (len, slot0) of value head hv has a negligible
 * transition M: ||M||_2 <= prod_t e^(g_t) ||I - beta_t k_t k_t^T||_2
 * <= e^(sum g) <= e^-17 ~ 4e-8 (below fp32 rounding, docs/design.md §5.3) when the
 * segment's decay sums to <= -17 and every token has 0 <= beta ||k||^2 <= 2.
 * Both come per chunk from the prepare kernel: the decay as gamma's last
 * entry (the chunk's sum), the second as chunk_ok. O(chunks) reads, so the
 * check costs little beside the chain it saves. A block-wide call (every
 * thread, __syncthreads inside); the same inputs give the same answer.
 * The forward's pre-pass (fwd_chunk_wg.cu) and the backward chains' (bwd_chain.cu)
 * both use it: a chain's transition and its transpose have the same norm. */
__device__ __forceinline__ int fqla_cp_m_negligible(const fqla_fwd_params &p, int64_t len, int64_t slot0, int hv)
{
    FQLA_SHARED float part[32];
    const int tid = threadIdx.x, nthr = blockDim.x;
    const int64_t nch = (len + FQLA_FWD_CHUNK - 1) / FQLA_FWD_CHUNK;
    float s = 0.f;
    int bad = 0;
    for (int64_t c = tid; c < nch; c += nthr) {
        const int64_t i = (slot0 + c) * p.HV + hv;
        s += p.gam[i * FQLA_FWD_CHUNK + FQLA_FWD_CHUNK - 1];
        bad |= !p.chunk_ok[i];
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((tid & 31) == 0) part[tid >> 5] = s;
    bad = __syncthreads_or(bad);
    float tot = 0.f;
    for (int w = 0; w < nthr / 32; w++) tot += part[w]; /* the same order in every thread */
    return !bad && tot <= -17.f;
}

/* Launchers (fwd_prepare.cu, fwd_chunk.cu): enqueue on stream, return the
 * launch error. kd is K; bv the V slice of the chunk kernel. io_bf16 picks
 * bf16 (else fp16). hb and late pick the variant (0 / -1: the default; hb = 2:
 * plain-tf32 merges). tmK: k's TMA map (fqla_fwd_tma_maps) and tmAg: Ag's
 * store map (fqla_fwd_map_ag_store), both required without Pg (the fused
 * path, which loads K and stores Ag by TMA), else unused (NULL). */
cudaError_t fqla_fwd_launch_prepare(const fqla_fwd_params &p, int io_bf16, int hb, const CUtensorMap *tmK,
                                    const fqla_fwd_ag_maps *tmAg, cudaStream_t stream);
cudaError_t fqla_fwd_launch_chunk(const fqla_fwd_params &p, int io_bf16, int bv, int late, cudaStream_t stream);
/* The TMA kernels (fwd_tma.cu): fqla_fwd_tma_usable, 1 when p's shapes and
 * alignments suit their maps (K and V multiples of 64; the callers bound K
 * further: fqla_fwd_fused_k); fqla_fwd_wg_usable, the
 * same for the wgmma chunk kernel (K = 64 or 128); the maps of q, k, v, Ag,
 * Pg (Pg only when p.Pg is set), 0 when one cannot be encoded. */
int fqla_fwd_tma_usable(const fqla_fwd_params &p);
/* 1 when the driver's tensor-map encoder was found */
int fqla_fwd_tma_encoder(void);
int fqla_fwd_wg_usable(const fqla_fwd_params &p);
/* q, k, v, Pg (loads) and o (stores); Ag's four strips (loads: box 16
 * rows x 64 columns, 128-byte swizzle, at column 0 and row 16 x tile) */
#define FQLA_FWD_MAPS 5
int fqla_fwd_tma_maps(const fqla_fwd_params &p, int io_bf16, CUtensorMap maps[FQLA_FWD_MAPS],
                      fqla_fwd_ag_maps *ag);
/* Ag's strips as the prepare kernel stores them: box 16 rows x 32 columns,
 * 64-byte swizzle (a warp's staging tile as stmatrix lays it out; columns
 * past a strip's width are not written). 0 when one cannot be encoded. */
int fqla_fwd_map_ag_store(const fqla_fwd_params &p, int io_bf16, fqla_fwd_ag_maps *m);
/* The warp-specialised chunk kernel (fwd_chunk_wg.cu); sets *used to 0
 * (launching nothing) when the maps cannot be encoded. nwg: consumer
 * warpgroups per CTA (1 or 2, 64 value columns each). */
cudaError_t fqla_fwd_launch_chunk_wg(const fqla_fwd_params &p, int io_bf16, int nwg, cudaStream_t stream, int *used);
/* The path that forms Pg beside the chain (fwd_fused.cu) with nwg chain
 * warpgroups per CTA (1 or 2, 64 value columns each): 1 when it covers p
 * (K = 64 or 128, or 256 at nwg = 1; V a multiple of 64 nwg; the TMA
 * kernels' alignments; with CP the main pass, cp_mode 2). The launcher
 * enqueues the parts asked for: the prepare kernel without Q (gamma and
 * Ag, and rk with the in-kernel l2norm; hb as fqla_fwd_launch_prepare's), then the
 * sequential kernel with its Pg warpgroup; or it sets *used to 0 and
 * launches nothing when p is not covered or the maps cannot be encoded. */
enum { FQLA_FUSED_PREPARE = 1, FQLA_FUSED_CHAIN = 2 };
int fqla_fwd_fused_usable(const fqla_fwd_params &p, int nwg);
/* The head dims the fused path (and its prepare kernels without Q) is
 * built for: the one test fwd.cu, fwd_fused.cu and fwd_prepare.cu share. */
static inline bool fqla_fwd_fused_k(int64_t K) { return K == 64 || K == 128 || K == 256; }
cudaError_t fqla_fwd_launch_fused(const fqla_fwd_params &p, int io_bf16, int hb, int nwg, int parts,
                                  cudaStream_t stream, int *used);
/* fp32 q/k/v (fwd_recurrent.cu): the recurrence token by token in fp32, no
 * workspace; K = 64, 128 or 256 (fqla_cuda_fwd_supported checks K), any V;
 * rows: state rows a lane (16 or 32; 0 picks by the waves on sms SMs). */
cudaError_t fqla_fwd_launch_recurrent(const fqla_fwd_params &p, int sms, int rows, cudaStream_t stream);
/* Its largest grid: CTAs for N sequences x HV value heads x V columns at
 * head dim K (fqla_cuda_fwd_supported keeps it within gridDim.x). */
int64_t fqla_fwd_recurrent_ctas(int64_t N, int64_t HV, int64_t K, int64_t V, int varlen);
/* fp32 q/k/v, chunked (fwd_chunk_f32.cu): the whole forward in one kernel
 * (no prepare kernel; a workspace only for CP), products on mma.sync in
 * bf16x3; K = 64 or 128, V a multiple of 32, q/k/v rows 16-byte aligned
 * (route_plan.h, fqla_route_f32_chunked); bv value columns per CTA (32 or
 * 64; 64 needs V a multiple of 64). With cp_mode, CP's pre-pass (1) or
 * main pass (2), as the wgmma chunk kernel's. */
cudaError_t fqla_fwd_launch_chunk_f32(const fqla_fwd_params &p, int bv, cudaStream_t stream);
/* The CP scan (fwd_cp.cu): p as for the pre-pass and main pass (seg_*,
 * seg_chunks), with the caller's h0 / ht; K = 64 or 128; cb value columns
 * per CTA (8, 16 or 32; 0: the narrowest that fits one wave of sms SMs). */
cudaError_t fqla_fwd_launch_cp_scan(const fqla_fwd_params &p, int cb, int sms, cudaStream_t stream);
/* 1 when the chunk kernel has a variant for (K, bv). */
int fqla_fwd_chunk_has(int kd, int bv);

#endif
