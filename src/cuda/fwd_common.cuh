/*
 * fwd_common.cuh - what the forward's two kernels share: the launch
 * parameters (pointers, strides in elements, options), the workspace layout
 * and where each sequence and chunk lives.
 *
 * The forward runs in two launches (DESIGN.md §2):
 *   prepare (fwd_prepare.cu), one CTA per (chunk slot, q/k head), all chunks
 *     in parallel: the in-kernel transforms, gamma = chunk-local cumsum of g,
 *     the q/k l2norm factors, K K^T and Q K^T (shared by the GVA group), the
 *     gate-free inverse Ar (fp32, blocked forward substitution), and per value
 *     head Ag = Gamma (.) Ar diag(beta) and Pg = scale Gamma (.) tril(Q K^T);
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

#include <cuda.h> /* CUtensorMap (a type only) */
#include <cuda_runtime.h>
#include <stdint.h>

#define FQLA_FWD_CHUNK 64
#define FQLA_FWD_THREADS 256

/* Kernel variants, compiled with FQLA_FWD_TUNING and picked at run time by
 * the benchmarking hooks outside the public API (fwd.cu):
 * fqla_cuda_fwd_tune(prep, late) - prep = 2: the prepare kernel's merges in
 * plain tf32 instead of 3xTF32 (fwd_prepare.cu); late: whether the mma.sync
 * chunk kernel issues the next chunk's copies late (after barrier C, from four
 * warps; docs/perf.md v3). fqla_cuda_fwd_tune_chunk picks the chunk kernel.
 * The defaults are the fastest measured on the H200. */
#ifndef FQLA_FWD_LATE_LOADS
#define FQLA_FWD_LATE_LOADS 1
#endif
#ifndef FQLA_FWD_TUNING
#define FQLA_FWD_TUNING 1
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
    int v_first;
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
    void *Ag, *Pg;           /* [slots][HV][64][64] io dtype */
};

/* Workspace carve-up (bytes; every region 256-aligned). */
struct fqla_fwd_ws_layout {
    size_t gam, rq, rk, Ag, Pg, total;
};

static inline size_t fqla_fwd_align256(size_t x) { return (x + 255) & ~(size_t)255; }

static inline fqla_fwd_ws_layout fqla_fwd_ws(int64_t slots, int64_t H, int64_t HV, int l2norm, size_t io_size)
{
    fqla_fwd_ws_layout L;
    size_t off = 0;
    L.gam = off; off += fqla_fwd_align256((size_t)slots * HV * 64 * sizeof(float));
    L.rq = off;  off += l2norm ? fqla_fwd_align256((size_t)slots * H * 64 * sizeof(float)) : 0;
    L.rk = off;  off += l2norm ? fqla_fwd_align256((size_t)slots * H * 64 * sizeof(float)) : 0;
    L.Ag = off;  off += fqla_fwd_align256((size_t)slots * HV * 64 * 64 * io_size);
    L.Pg = off;  off += fqla_fwd_align256((size_t)slots * HV * 64 * 64 * io_size);
    L.total = off;
    return L;
}

__device__ __forceinline__ int64_t fqla_fwd_cu(const fqla_fwd_params &p, int64_t i)
{
    return p.cu64 ? ((const int64_t *)p.cu)[i] : (int64_t)((const int32_t *)p.cu)[i];
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

/* Launchers (fwd_prepare.cu, fwd_chunk.cu): enqueue on stream, return the
 * launch error. kd is K; bv the V slice of the chunk kernel. io_bf16 picks
 * bf16 (else fp16). hb and late pick the variant (0 / -1: the default; hb = 2:
 * plain-tf32 merges). */
cudaError_t fqla_fwd_launch_prepare(const fqla_fwd_params &p, int io_bf16, int hb, cudaStream_t stream);
cudaError_t fqla_fwd_launch_chunk(const fqla_fwd_params &p, int io_bf16, int bv, int late, cudaStream_t stream);
/* The TMA chunk kernels (fwd_tma.cu): 1 when p's shapes and alignments
 * allow them; the maps of q, k, v, Ag, Pg (Pg only when p.Pg is set), 0 when
 * one cannot be encoded. */
int fqla_fwd_wg_usable(const fqla_fwd_params &p);
int fqla_fwd_tma_maps(const fqla_fwd_params &p, int io_bf16, CUtensorMap maps[5]);
/* The warp-specialised chunk kernel (fwd_chunk_wg.cu); sets *used to 0
 * (launching nothing) when the maps cannot be encoded. nwg: consumer
 * warpgroups per CTA (1 or 2, 64 value columns each). */
cudaError_t fqla_fwd_launch_chunk_wg(const fqla_fwd_params &p, int io_bf16, int nwg, cudaStream_t stream, int *used);
/* 1 when the chunk kernel has a variant for (K, bv). */
int fqla_fwd_chunk_has(int kd, int bv);

#endif
