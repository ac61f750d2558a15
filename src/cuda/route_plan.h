/*
 * route_plan.h - the CUDA forward's route planner: from the device (its SM
 * count) and a validated problem to the kernels that run it, their variant
 * parameters, programmatic dependent launch, and the intra-card context
 * parallelism plan (cp_plan.h). Plain C99 with no CUDA types and no state,
 * so the same function sizes the workspace, picks the launches in fwd.cu,
 * and is unit-tested on the CPU (tests/test_route_plan.c).
 *
 * The paths (fqla_fwd_route.path):
 * - FUSED: the prepare kernel without Q, then the kernel that forms Pg
 *   beside the chain (fwd_fused.cu), nwg chain warpgroups per CTA;
 * - WGMMA: the prepare kernel with Q, then the TMA + wgmma chunk kernel
 *   (fwd_chunk_wg.cu), nwg consumer warpgroups per CTA;
 * - MMA: the prepare kernel with Q, then the mma.sync chunk kernel
 *   (fwd_chunk.cu), bv value columns per CTA;
 * - RECURRENT: fp32 q/k/v, the fp32 recurrence token by token
 *   (fwd_recurrent.cu), where CHUNK_F32 does not cover the call;
 * - CHUNK_F32: fp32 q/k/v, the chunked kernel in fp32 with bf16x3
 *   products (fwd_chunk_f32.cu), bv value columns per CTA, no workspace;
 * - CHAIN_F32: fp32 q/k/v on the backward's prepare kernel and state chain
 *   in their fp32 forms (bwd_prepare.cu, bwd_chain.cu: products on wgmma
 *   with split bf16 operands), nwg 64-column slices a chain CTA.
 * With cp set, FUSED or WGMMA is CP's main pass (after the state-only
 * pre-pass and the scan of fwd_cp.cu). The one decision left to the run is
 * a TMA map that cannot be encoded after all: then fwd.cu falls back to the
 * next path (FUSED, WGMMA, MMA) as the launchers report.
 */
#ifndef FQLA_CUDA_ROUTE_PLAN_H
#define FQLA_CUDA_ROUTE_PLAN_H

#include "cuda/cp_plan.h"

#include <stdint.h>

/* The SM count planned with when the device reports none: the H200's. */
#define FQLA_ROUTE_DEFAULT_SMS 132

static inline int64_t fqla_route_sms(int sm_count) { return sm_count > 0 ? sm_count : FQLA_ROUTE_DEFAULT_SMS; }

/* What the planner knows of the device. The backend refuses every device
 * but compute capability 9.0 before planning; cc is kept for the record. */
typedef struct fqla_route_device {
    int sm_count;
    int cc_major, cc_minor;
} fqla_route_device;

/* What the planner knows of a validated forward call. */
typedef struct fqla_fwd_shape {
    int64_t N, T, H, HV, K, V; /* sequences; tokens (packed when varlen, else per sequence); heads; head dims */
    int varlen;
    const int64_t *cu_host;    /* [N + 1] host cu_seqlens (varlen), or NULL */
    int io_f32;                /* q/k/v/o in fp32 */
    int f32_rows16;            /* fp32: q, k, v bases and strides 16-byte aligned (the chunked fp32 kernel's copies) */
    int l2norm;                /* the in-kernel l2norm of q and k (its factors take workspace) */
    /* o as the TMA kernels see it: its base 16-byte aligned, its element
     * strides (batch, token, head), and whether the driver's tensor-map
     * encoder was found */
    int o_base16;
    int64_t o_sb, o_st, o_sh;
    int tma_encoder;
} fqla_fwd_shape;

enum {
    FQLA_FWD_FUSED = 1,
    FQLA_FWD_WGMMA = 2,
    FQLA_FWD_MMA = 3,
    FQLA_FWD_RECURRENT = 4,
    FQLA_FWD_CHUNK_F32 = 5,
    FQLA_FWD_CHAIN_F32 = 6
};

typedef struct fqla_fwd_route {
    int path;           /* FQLA_FWD_FUSED .. FQLA_FWD_CHAIN_F32 */
    int64_t uniform;    /* > 0: packed varlen input of sequences of this one
                           length that fill the tokens, planned and run as the
                           padded batch [N][uniform] over the same memory */
    int64_t sms;        /* the SM count planned with */
    int tma;            /* the TMA kernels' shape and alignment conditions hold */
    int nwg;            /* FUSED / WGMMA / CHAIN_F32: warpgroups per CTA on the chain (1, 2; with cp, the
                           main pass's) */
    int bv;             /* MMA's and CHUNK_F32's value columns per CTA (32, 64); also MMA's fallback's;
                           with cp, CHUNK_F32's main pass's */
    int pre_bv;         /* CHUNK_F32 with cp: the pre-pass's value columns per CTA (32, 64) */
    int64_t fused_split;/* FUSED without cp: chains run with two warpgroups before the split last wave, else 0 */
    int pdl;            /* the kernels after the prepare kernel launch with PDL */
    int64_t seg_chunks; /* the CP plan, chunks per segment (0: none); it sizes the workspace */
    int cp;             /* CP runs (seg_chunks > 0 on the TMA kernels or CHUNK_F32) */
    int cp_skip;        /* the negligible-transition shortcut: the prepare kernel flags chunks for
                           it (CHUNK_F32: its pre-pass reads the gates and keys itself) */
    int scan_cb;        /* cp: value columns per CTA of the CP scan (8, 16, 32) */
    /* Variants the product build never changes (a developer build's hook may):
     * prep_variant 0 (3xTF32 merges in the prepare kernel), late -1 (the
     * mma.sync kernel's default copy order), rec_rows 0 (the fp32
     * recurrence's state rows a lane, by the waves). */
    int prep_variant, late, rec_rows;
} fqla_fwd_route;

/* ---- decode and verify -------------------------------------------------- */

/* The decode kernels' variants (decode_kernel.cuh, launched by
 * decode_launch.cuh): a V-slice of WV columns per warp, for a state element
 * size esize (bytes), K and layout (vfirst: [V, K]); 1 when it exists. */
static inline int fqla_decode_variant_valid(int esize, int K, int WV, int vfirst)
{
    const int vec = 16 / esize;
    if (WV <= 0 || K <= 0) return 0;
    if (vfirst) return WV % 4 == 0 && K % (8 * vec) == 0;
    if (WV % vec != 0 || WV / vec > 32 || 32 % (WV / vec) != 0) return 0;
    return K % (32 / (WV / vec)) == 0;
}

/* K-split [K, V] variants: WV = 128 bytes of a row, KS in {2, 4, 8}, 16 to 64
 * state values per lane (K / KS rows over 4 lanes, 16 bytes each). 1 when
 * compiled for this element size and K. */
static inline int fqla_decode_ksplit_valid(int esize, int K, int KS)
{
    if (KS != 2 && KS != 4 && KS != 8) return 0;
    if (K != 64 && K != 128 && K != 256) return 0;
    const int vals = K / KS / 4 * (16 / esize);
    return vals >= 16 && vals <= 64;
}

/* What the decode planner knows of a validated decode / verify call. */
typedef struct fqla_decode_shape {
    int64_t B, HV, K, V; /* K = V */
    int state_esize;     /* bytes per state element: 4 (f32) or 2 (bf16) */
    int v_first;         /* the state's layout is [V, K] */
} fqla_decode_shape;

/* The decode / verify launch (decode_launch.cuh launches it). */
typedef struct fqla_decode_route {
    int wv;        /* V-slice width per warp */
    int ks;        /* warps that share one 128-byte-wide slice of a [K, V] state (1: none) */
    int warps;     /* warps per CTA (0: decode_launch.cuh's default) */
    int pdl;       /* programmatic dependent launch */
    int prefetch;  /* the L2 prefetch before the PDL wait (with pdl only) */
    int streaming; /* streaming cache hints on the state */
} fqla_decode_route;

/* The V-slice width per warp, and in *ks the K split. The widest slice (64
 * state values per lane) moves the most bytes per instruction; when the
 * problem has too few warps to keep every SM busy (small batches, where
 * latency rules) narrower slices spread the same bytes over more warps. A
 * [K, V] state is never cut into slices narrower than 32 bytes per row: a
 * warp would then use half of each 32-byte sector it touches (measured on
 * the H200: 1.6x slower at B = 1, 3x at B = 64); a [K, V] state goes to the
 * K-split variants instead (KS warps share one 128-byte-wide slice, see
 * decode_kernel.cuh). Verify follows the same rule (measured: the widest
 * slice that still gives 8 warps per SM is also best for T = 2 and 4). */
static inline int fqla_decode_wv(const fqla_decode_shape *s, int64_t sms, int *ks)
{
    const int esize = s->state_esize, K = (int)s->K, vf = s->v_first ? 1 : 0;
    const int cand[3] = {2048 / K, 1024 / K, 512 / K};
    const int64_t enough = 8 * sms; /* warps: 8 per SM */
    *ks = 1;
    if (!vf) {
        /* [K, V]: 128-byte row segments per warp instruction; the least K
         * split that gives 8 warps per SM (at most 64 state values per
         * lane), else the largest split */
        const int wr = 128 / esize;
        int best = 0;
        for (int k = 1; k <= 8; k *= 2) {
            const int ok = k == 1 ? wr == 2048 / K : fqla_decode_ksplit_valid(esize, K, k);
            if (!ok) continue;
            /* 8 warps meeting at a barrier were slower than 4 at B = 1
             * (H200: fp32 4.41 vs 4.25 us, bf16 5.09 vs 4.27 us at K = 128,
             * HV = 32): KS = 8 only where it is the only split */
            if (k == 8 && best) break;
            best = k;
            if (s->B * s->HV * (s->V / wr) * k >= enough) break;
        }
        if (best) {
            *ks = best;
            return wr;
        }
    }
    int narrowest = cand[0]; /* the widest is valid for every layout and type */
    for (int i = 0; i < 3; i++) {
        if (!fqla_decode_variant_valid(esize, K, cand[i], vf)) continue;
        if (!vf && cand[i] * esize < 32) continue;
        if (s->B * s->HV * (s->V / cand[i]) >= enough) return cand[i];
        narrowest = cand[i];
    }
    return narrowest;
}

/* The decode / verify launch for shape s on device d. */
static inline void fqla_decode_plan(const fqla_route_device *d, const fqla_decode_shape *s, fqla_decode_route *r)
{
    r->wv = fqla_decode_wv(s, fqla_route_sms(d->sm_count), &r->ks);
    r->warps = 0;
    r->pdl = 1;
    r->streaming = 0;
    /* Measured on the H200 (K = V = 128, back-to-back calls): the prefetch
     * gains 20-25 % at <= 8 MB of state (latency-bound calls), 2-3 % (fp32)
     * and 5-8 % (bf16) from 64 MB up, and bf16 gains at every size; fp32
     * loses 8 % at 16 MB and is +-2 % at 32 MB, where the whole grid is
     * resident early and its prefetched lines compete in L2 with the
     * previous call's stream. So: on, except fp32 state between 8 and
     * 64 MB. */
    const int64_t state_bytes = s->B * s->HV * s->K * s->V * (int64_t)s->state_esize;
    const int mid_f32 = s->state_esize == 4 && state_bytes > ((int64_t)8 << 20) && state_bytes < ((int64_t)64 << 20);
    r->prefetch = !mid_f32;
}

/* ---- the forward ----------------------------------------------------------- */

/* The head dims the fused path (and its prepare kernels without Q) is built for. */
static inline int fqla_route_fused_k(int64_t K) { return K == 64 || K == 128 || K == 256; }

/* Chunk slots of the workspace (64-token chunks; fwd_common.cuh). */
static inline int64_t fqla_route_slots(const fqla_fwd_shape *s)
{
    if (s->varlen) return s->T / FQLA_CP_CHUNK + s->N;
    return s->N * ((s->T + FQLA_CP_CHUNK - 1) / FQLA_CP_CHUNK);
}

/* The TMA kernels' conditions (fwd_tma.cu's fqla_fwd_tma_usable is this on
 * the launch parameters): whole 64-column boxes, coordinates in 32 bits,
 * 16-byte rows of o for the maps and the output's vector stores. */
static inline int fqla_route_tma_ok(int64_t K, int64_t V, int64_t T, int64_t slots, int64_t HV, int o_base16,
                                    int64_t o_sb, int64_t o_st, int64_t o_sh, int encoder)
{
    if (K % 64 != 0 || V % 64 != 0) return 0;
    if (T > 0x7fffffffLL - 2 * FQLA_CP_CHUNK || slots * HV * FQLA_CP_CHUNK > 0x7fffffffLL) return 0;
    if (!o_base16 || o_st % 8 || o_sh % 8 || o_sb % 8) return 0;
    return encoder != 0;
}

/* V slice per CTA of the mma.sync kernel: narrow slices when there are too
 * few recurrences to fill the GPU (the recurrence is a latency-bound
 * chain), 64 otherwise. */
static inline int fqla_route_bv(const fqla_fwd_shape *s, int64_t sms)
{
    if (s->K == 256) return 32;
    if (s->V % 64 != 0) return 32;
    const int64_t ctas64 = s->N * s->HV * (s->V / 64);
    return ctas64 * 2 <= sms ? 32 : 64;
}

/* Whether the chunked fp32 kernel (fwd_chunk_f32.cu) covers an fp32 call's
 * shape (fqla_route_f32_covers) and takes it (fqla_route_f32_chunked):
 * K = 64 or 128 (its state slice and K tiles in registers and shared
 * memory; K = 256 keeps the recurrence), V a multiple of 32 (its slices),
 * q/k/v rows 16-byte aligned (16-byte copies), and a longest sequence of
 * more than 8 tokens: below that a chunk's fixed cost (the 64 x 64 K K^T,
 * the substitution's 64 steps) is not repaid against the recurrence's
 * ~8 us for 8 tokens (an estimate, not measured). Without a host copy of
 * cu_seqlens a varlen call counts T as its longest sequence. */
static inline int fqla_route_f32_covers(const fqla_fwd_shape *s)
{
    return (s->K == 64 || s->K == 128) && s->V % 32 == 0 && s->f32_rows16;
}
static inline int fqla_route_f32_chunked(const fqla_fwd_shape *s)
{
    if (!fqla_route_f32_covers(s)) return 0;
    const int64_t longest = s->varlen ? (s->cu_host && s->N > 0 ? fqla_cp_longest(s->cu_host, s->N) : s->T) : s->T;
    return longest > 8;
}

/* The fp32 chain route (FQLA_FWD_CHAIN_F32): where the chunked fp32 kernel
 * covers the shape, and the grids fit (the prepare kernel's slots x HV CTAs
 * and its tail blocks in x, the value heads in y). Without CP its chain CTAs
 * take one 64-column slice or two (fqla_route_f32_chain_nwg): the chain's
 * shared memory (~195 KB) leaves one CTA an SM either way, and a CTA of two
 * steps ~1.27x as long as one (the backward's measure, bwd.cu), so the
 * fewer waves at that price; on the 21 rows timed with both (H100,
 * bench/results/fwd-fp32-chain-h100-2026-12-07.csv) this picks the faster
 * of the two on each. With CP one slice a CTA (the plan's model assumes it). */
static inline int fqla_route_f32_chain_covers(const fqla_fwd_shape *s)
{
    return fqla_route_f32_covers(s) && s->HV <= 65535 &&
           (fqla_route_slots(s) + (s->T + 63) / 64) * s->HV < ((int64_t)1 << 31) && s->N < ((int64_t)1 << 31);
}
static inline int fqla_route_f32_chain_nwg(const fqla_fwd_shape *s, int64_t sms)
{
    const int64_t pairs = s->N * s->HV * ((s->V + 127) / 128), ones = s->N * s->HV * ((s->V + 63) / 64);
    const double two = 1.27 * (double)((pairs + sms - 1) / sms), one = (double)((ones + sms - 1) / sms);
    return two < one ? 2 : 1;
}

/* The chain route's CP plan: the backward chains' model (cp_plan.h,
 * fqla_cp_bwd_seg_chunks, one chain), which counts two 64-column chain
 * warpgroups an SM; the chain route runs one (one CTA of one an SM), so it
 * is asked with half the SMs. */
static inline int64_t fqla_route_f32_chain_cp(const fqla_fwd_shape *s, int64_t sms)
{
    const int64_t half = (sms + 1) / 2;
    if (s->varlen && s->cu_host) return fqla_cp_bwd_seg_chunks_cu(s->cu_host, s->N, s->HV, s->K, s->V, 1, half);
    return fqla_cp_bwd_seg_chunks(s->N, s->T, s->HV, s->K, s->V, 1, half);
}

/* Consumer warpgroups per CTA of the wgmma chunk kernel over `rows`
 * sequences (or CP segments). Two (one CTA per 128 value columns, sharing
 * the K, Q, Ag, Pg tiles) run a CTA ~1.4x longer than one does (measured on
 * the H200) but halve the CTAs; either way one CTA fits on an SM. The one
 * with fewer waves x time. K = 256 has one: the fused kernel's only width
 * there. */
static inline int fqla_route_nwg(const fqla_fwd_shape *s, int64_t rows, int64_t sms)
{
    if (s->V % 128 != 0 || s->K == 256) return 1;
    const int64_t ctas2 = rows * s->HV * (s->V / 128);
    const int64_t waves1 = (2 * ctas2 + sms - 1) / sms, waves2 = (ctas2 + sms - 1) / sms;
    return waves2 * 14 < waves1 * 10 ? 2 : 1;
}

/* The fused kernel's chain warpgroups per CTA (fqla_route_nwg's), or 0 for
 * the two-kernel path, by 171 rows measured on the H200. Its chain runs up
 * to ~10 % longer than the chunk kernel's above a GVA group of 2 (Q K^T
 * formed per value head, one warpgroup per 64 columns), its prepare kernel
 * 30-50 % shorter.
 * - nwg = 2: every row measured gained or held (x0.94-1.01), unequal
 *   sequences at groups 3-4 too.
 * - nwg = 1: the prepare kernel's time grows with tokens x q/k heads, the
 *   chain's with the longest sequence, so it pays where T H >= 12 x the
 *   longest sequence (16 sequence-heads: x0.77-0.99, 8: x0.99-1.08).
 *   Without a host copy of cu_seqlens a varlen call counts one sequence as
 *   holding every token.
 * K = 256: the fused kernel wherever it covers the call; the two-kernel
 * path there is the mma.sync kernel. */
static inline int fqla_route_fused(const fqla_fwd_shape *s, int64_t sms)
{
    const int nwg = fqla_route_nwg(s, s->N, sms);
    if (s->K == 256 || nwg == 2) return nwg;
    const int64_t *cu = s->cu_host; /* varlen only */
    const int64_t longest = cu && s->N > 0 ? fqla_cp_longest(cu, s->N) : s->T;
    const int64_t tokens = s->varlen ? s->T : s->N * s->T;
    return tokens * s->H >= 12 * longest ? 1 : 0;
}

/* Whether the fused path covers the shape with nwg chain warpgroups
 * and the TMA kernels' conditions (tma; fwd_fused.cu's fqla_fwd_fused_usable
 * is this on the launch parameters). */
static inline int fqla_route_fused_fits(int64_t K, int64_t V, int tma, int nwg)
{
    return (nwg == 1 || (nwg == 2 && K != 256)) && fqla_route_fused_k(K) && V % (64 * nwg) == 0 && tma;
}

/* The fused kernel's chains for its first launch where the last wave is
 * split, else 0. With two chain warpgroups a CTA holds an SM (registers)
 * and covers one chain at V = 128, so N x HV chains run in waves of SMs
 * CTAs; where the last wave would hold at most half the SMs, its chains run
 * instead with one chain warpgroup per CTA (two CTAs per chain), all of
 * them at once, in ~0.8 of a full wave's time: 192 chains (27B) ran as 132
 * + 60, x0.93-0.95 end to end with the split. Only for padded batches
 * (equal lengths): in varlen calls the waves overlap. */
static inline int64_t fqla_route_split(const fqla_fwd_shape *s, int64_t sms)
{
    if (s->varlen || s->V != 128) return 0;
    const int64_t chains = s->N * s->HV, full = chains / sms, rem = chains % sms;
    return full >= 1 && rem > 0 && 2 * rem <= sms ? full * sms : 0;
}

/* Segment indices the CP buffers are sized for at L chunks per segment. */
static inline int64_t fqla_route_segs(const fqla_fwd_shape *s, int64_t L)
{
    return fqla_cp_segs(s->varlen, s->T, s->N, L);
}

/* The segments that hold tokens, for sizing CP's main pass: packed varlen
 * input's index range (fqla_route_segs) has up to one spare index per
 * sequence, and counting those chose two warpgroups where one wave of one
 * fits (TP8 1x16384: 9 x 8 x 2 > 132 SMs against 8 x 8 x 2 real CTAs, the
 * main pass 68 us against 51). Exact from the host copy of cu_seqlens;
 * without one the index range. */
static inline int64_t fqla_route_real_segs(const fqla_fwd_shape *s, int64_t L)
{
    return s->varlen && s->cu_host ? fqla_cp_real_segs(s->cu_host, s->N, L) : fqla_route_segs(s, L);
}

/* The CP plan's default m_skipped (cp_plan.h): the benchmark's gates, a
 * quarter of the heads ungated and the rest summing past the shortcut's -17
 * over 8 chunks. With it CP runs on 13 of the 123 benchmark rows where CP
 * may, x0.78-0.98 there, that priced in full had none. Where a model's gates
 * leave no transition negligible those rows pay the pre-pass in full. */
#define FQLA_ROUTE_CP_MSKIP 0.75

/* The CP plan's problem: the shape, the SM count, and what CP saves on the
 * prepare kernel: where CP's main pass is the fused kernel (K = 64 or 128)
 * and the path without CP the two kernels. m_skipped as given. */
static inline fqla_cp_problem fqla_route_cp_problem(const fqla_fwd_shape *s, int64_t sms, int prep_saving,
                                                    double m_skipped)
{
    fqla_cp_problem q;
    q.N = s->N;
    q.T = s->T;
    q.HV = s->HV;
    q.K = s->K;
    q.V = s->V;
    q.H = s->H;
    q.varlen = s->varlen;
    q.cu_host = s->cu_host;
    q.sms = sms;
    q.prep_saving = prep_saving;
    q.m_skipped = m_skipped;
    return q;
}

/* Chunks per segment, or 0 for no CP, where the TMA chunk kernel's head
 * dims and value widths allow it (K = 64 or 128, V % 64 = 0; the
 * alignments are not asked: the workspace does not depend on them). */
static inline int64_t fqla_route_cp(const fqla_fwd_shape *s, int64_t sms)
{
    if ((s->K != 64 && s->K != 128) || s->V % 64 != 0) return 0;
    fqla_cp_problem q = fqla_route_cp_problem(s, sms, fqla_route_fused_k(s->K) && !fqla_route_fused(s, sms),
                                              FQLA_ROUTE_CP_MSKIP);
    return fqla_cp_plan(&q);
}

/* Packed varlen input whose sequences all have one length L and fill the
 * tokens (cu_seqlens_host = 0, L, 2L, ..., T) runs as the padded batch it
 * is, [N][L] over the same memory: the prepare kernel then maps a chunk slot
 * to its sequence by a division instead of searching cu_seqlens (a
 * dependent load before each CTA's first copies: ~5-8 % of that kernel,
 * measured on the H200), and no CTAs zero rows past the last sequence.
 * Returns L, or 0 (the input stays varlen); *out is the shape to plan. */
static inline int64_t fqla_route_uniform(const fqla_fwd_shape *s, fqla_fwd_shape *out)
{
    *out = *s;
    const int64_t L = s->varlen && s->cu_host ? fqla_cp_uniform_len(s->cu_host, s->N, s->T) : 0;
    if (!L) return 0;
    out->varlen = 0;
    out->T = L;
    out->cu_host = 0;
    out->o_sb = L * s->o_st; /* the padded view's batch stride */
    return L;
}

/* Value columns per CTA of the CP scan: the narrowest whose grid fits one
 * wave (one CTA per SM), measured fastest. */
static inline int fqla_route_scan_cb(const fqla_fwd_shape *s, int64_t sms)
{
    const int64_t heads = s->N * s->HV;
    return heads * (s->V / 8) <= sms ? 8 : heads * (s->V / 16) <= sms ? 16 : 32;
}

/* The chunked fp32 kernel's CP plan (cp_plan.h, fqla_cp_plan_f32) with the
 * benchmark's share of (segment, head) pairs whose pre-pass the shortcut
 * shortens (FQLA_ROUTE_CP_MSKIP: a quarter of the heads ungated; on the
 * others it leaves out the transition and starts the end state a few
 * chunks before the segment's end). Where no transition is negligible the
 * pre-pass walks every segment in full: its work does not depend on the
 * segment length, only its waves do, so the plan's guess costs there
 * about the pre-pass's full work (397B TP8 1x32768 at 32-chunk segments,
 * H100: 3.43 ms with the shortcut off, 2.34 on, 7.9 without CP). Without
 * CP the slice width of fqla_route_bv; the scan's width as for the bf16 CP. */
static inline void fqla_route_f32_cp(const fqla_fwd_shape *s, int64_t sms, fqla_fwd_route *r)
{
    const fqla_cp_problem q = fqla_route_cp_problem(s, sms, 0, FQLA_ROUTE_CP_MSKIP);
    const fqla_cp_f32_plan f = fqla_cp_plan_f32(&q);
    r->seg_chunks = f.seg_chunks;
    r->cp = f.seg_chunks > 0;
    r->cp_skip = r->cp;
    r->bv = r->cp ? f.bv : fqla_route_bv(s, sms);
    r->pre_bv = r->cp ? f.pre_bv : 0;
    r->scan_cb = r->cp ? fqla_route_scan_cb(s, sms) : 0;
}

/* fp32 calls the chunked kernel covers: the chain route, with CP where its
 * plan says. On 57 rows of bench_fwd.py --dtype fp32 for three models (H100,
 * bench/results/fwd-fp32-chain-h100-2026-12-07.csv) it ran 1.10-2.95x FLA's
 * fp32 forward, geomean 1.68, against the chunked kernel's 0.63-1.35, 0.90;
 * planned this way, 1.07-3.09x on 152 of the table's 171 rows. The chunked
 * kernel stays for calls the chain route's grids cannot take. */
static inline void fqla_route_f32_chain(const fqla_fwd_shape *s, int64_t sms, fqla_fwd_route *r)
{
    r->path = FQLA_FWD_CHAIN_F32;
    r->seg_chunks = fqla_route_f32_chain_cp(s, sms);
    r->cp = r->seg_chunks > 0;
    r->cp_skip = r->cp;
    r->nwg = r->cp ? 1 : fqla_route_f32_chain_nwg(s, sms);
    r->scan_cb = r->cp ? fqla_route_scan_cb(s, sms) : 0;
    r->bv = r->pre_bv = 0;
}
static inline void fqla_route_f32(const fqla_fwd_shape *s, int64_t sms, fqla_fwd_route *r)
{
    if (fqla_route_f32_chain_covers(s)) {
        fqla_route_f32_chain(s, sms, r);
        return;
    }
    r->path = FQLA_FWD_CHUNK_F32;
    fqla_route_f32_cp(s, sms, r);
}

/* The plan for shape s (as validated) on device d; *ps receives the shape
 * the kernels run (the padded view where r->uniform > 0). */
static inline void fqla_fwd_plan(const fqla_route_device *d, const fqla_fwd_shape *s, fqla_fwd_route *r,
                                 fqla_fwd_shape *ps)
{
    fqla_fwd_shape pad;
    if (!ps) ps = &pad;
    r->uniform = fqla_route_uniform(s, ps);
    s = ps;
    const int64_t sms = fqla_route_sms(d->sm_count);
    r->sms = sms;
    r->tma = 0;
    r->nwg = 0;
    r->bv = 0;
    r->fused_split = 0;
    r->pdl = 0;
    r->seg_chunks = 0;
    r->cp = 0;
    r->cp_skip = 0;
    r->scan_cb = 0;
    r->prep_variant = 0;
    r->late = -1;
    r->rec_rows = 0;
    r->pre_bv = 0;
    if (s->io_f32) {
        if (fqla_route_f32_chunked(s)) fqla_route_f32(s, sms, r);
        else r->path = FQLA_FWD_RECURRENT;
        return;
    }
    r->tma = fqla_route_tma_ok(s->K, s->V, s->T, fqla_route_slots(s), s->HV, s->o_base16, s->o_sb, s->o_st, s->o_sh,
                               s->tma_encoder);
    r->bv = fqla_route_bv(s, sms);
    r->seg_chunks = fqla_route_cp(s, sms);
    r->cp_skip = r->seg_chunks > 0;
    /* programmatic dependent launch of the kernels after the prepare kernel,
     * but not for CP's chain (pre-pass, scan, main pass): ~1 % slower with
     * it on every CP row measured */
    r->pdl = 1;
    const int wg = (s->K == 64 || s->K == 128) && r->tma;
    if (r->seg_chunks > 0 && wg) {
        r->cp = 1;
        r->pdl = 0;
        r->nwg = fqla_route_nwg(s, fqla_route_real_segs(s, r->seg_chunks), sms);
        r->path = fqla_route_fused_fits(s->K, s->V, r->tma, r->nwg) ? FQLA_FWD_FUSED : FQLA_FWD_WGMMA;
        r->scan_cb = fqla_route_scan_cb(s, sms);
        return;
    }
    const int fused = fqla_route_fused(s, sms);
    if (fused && r->seg_chunks == 0 && fqla_route_fused_fits(s->K, s->V, r->tma, fused)) {
        r->path = FQLA_FWD_FUSED;
        r->nwg = fused;
        r->fused_split = fused == 2 ? fqla_route_split(s, sms) : 0;
        return;
    }
    if (wg) {
        r->path = FQLA_FWD_WGMMA;
        r->nwg = fqla_route_nwg(s, s->N, sms);
        return;
    }
    r->path = FQLA_FWD_MMA;
}

#endif
