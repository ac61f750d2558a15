/*
 * cp_plan.h - the arithmetic of the CUDA forward's intra-card context
 * parallelism (docs/design.md) that needs no GPU: how sequences are cut into
 * segments and indexed, and the plan that picks the segment length. Plain
 * C99, so the CPU tests check it (tests/test_cp_plan.c); the kernels use the
 * same functions (fwd_common.cuh) and the route planner (route_plan.h) the
 * plan.
 *
 * Segments: sequence n's segment j covers its chunks [j L, j L + L) (64
 * tokens each) and has index sbase(n) + j, with sbase(n) = floor(cu[n] /
 * 64 L) + n for packed varlen input and n * ceil(chunks / L) for a padded
 * batch. A sequence has max(1, ceil(len / 64 L)) segments (an empty one has
 * one, whose pre-pass gives H = 0, M = I). sbase is strictly increasing, a
 * sequence's segments never reach the next one's first index, and every
 * index is below fqla_cp_segs(), which sizes the workspace.
 */
#ifndef FQLA_CUDA_CP_PLAN_H
#define FQLA_CUDA_CP_PLAN_H

#include <stdint.h>

#ifdef __CUDACC__
#define FQLA_CP_HD __host__ __device__ __forceinline__
#else
#define FQLA_CP_HD static inline
#endif

#define FQLA_CP_CHUNK 64

/* Segments of a sequence of len tokens. */
FQLA_CP_HD int64_t fqla_cp_nseg(int64_t len, int64_t L)
{
    const int64_t span = FQLA_CP_CHUNK * L;
    return len <= span ? 1 : (len + span - 1) / span;
}

/* First segment index of sequence n: cu_n = cu[n] (varlen), or the padded
 * batch's chunks per sequence (cps, with varlen = 0). */
FQLA_CP_HD int64_t fqla_cp_sbase(int varlen, int64_t n, int64_t cu_n, int64_t cps, int64_t L)
{
    if (varlen) return cu_n / (FQLA_CP_CHUNK * L) + n;
    return n * ((cps + L - 1) / L);
}

/* cu[i] of a cu_seqlens array of int64 (cu64) or int32 entries. */
FQLA_CP_HD int64_t fqla_cp_cu(const void *cu, int cu64, int64_t i)
{
    return cu64 ? ((const int64_t *)cu)[i] : (int64_t)((const int32_t *)cu)[i];
}

/* The segment with index idx: returns its sequence and sets *j to its number
 * within the sequence, or returns -1 when idx belongs to no segment. cu:
 * packed varlen input (N + 1 entries), or NULL for a padded batch of N
 * sequences of T tokens (cps chunks). A binary search for the last sequence
 * whose first index is <= idx, so no kernel needs a prefix sum. */
FQLA_CP_HD int64_t fqla_cp_segment(const void *cu, int cu64, int64_t N, int64_t T, int64_t cps, int64_t L,
                                   int64_t idx, int64_t *j)
{
    int64_t n, len;
    if (cu) {
        int64_t lo = 0, hi = N - 1;
        while (lo < hi) {
            const int64_t mid = (lo + hi + 1) >> 1;
            if (fqla_cp_sbase(1, mid, fqla_cp_cu(cu, cu64, mid), cps, L) <= idx) lo = mid;
            else hi = mid - 1;
        }
        n = lo;
        len = fqla_cp_cu(cu, cu64, n + 1) - fqla_cp_cu(cu, cu64, n);
    } else {
        n = idx / ((cps + L - 1) / L);
        len = T;
    }
    *j = idx - fqla_cp_sbase(cu != 0, n, cu ? fqla_cp_cu(cu, cu64, n) : 0, cps, L);
    if (n < 0 || n >= N || *j < 0 || *j >= fqla_cp_nseg(len, L)) return -1;
    return n;
}

/* The longest of the N sequences of a host cu_seqlens array. */
FQLA_CP_HD int64_t fqla_cp_longest(const int64_t *cu, int64_t N)
{
    int64_t longest = 0;
    for (int64_t n = 0; n < N; n++)
        if (cu[n + 1] - cu[n] > longest) longest = cu[n + 1] - cu[n];
    return longest;
}

/* The segments that hold tokens (an empty sequence has one) of the N
 * sequences of a host cu_seqlens array: the index range fqla_cp_segs sizes
 * for has up to one spare index per sequence besides these, and more when T
 * has rows after the last sequence. */
static inline int64_t fqla_cp_real_segs(const int64_t *cu, int64_t N, int64_t L)
{
    int64_t segs = 0;
    for (int64_t n = 0; n < N; n++) segs += fqla_cp_nseg(cu[n + 1] - cu[n], L);
    return segs;
}

/* The common length L of N >= 1 sequences that fill all T tokens of a host
 * cu_seqlens array (0, L, 2L, ..., N L = T, L > 0), else 0: such a packed
 * batch is the padded batch [N][L] over the same memory. */
static inline int64_t fqla_cp_uniform_len(const int64_t *cu, int64_t N, int64_t T)
{
    if (N < 1 || cu[0] != 0 || cu[N] != T || cu[1] <= 0) return 0;
    for (int64_t n = 1; n < N; n++)
        if (cu[n + 1] - cu[n] != cu[1]) return 0;
    return cu[1];
}

/* Segment indices to size for: T tokens (varlen: packed, N sequences; else
 * N sequences of T). */
FQLA_CP_HD int64_t fqla_cp_segs(int varlen, int64_t T, int64_t N, int64_t L)
{
    if (varlen) return T / (FQLA_CP_CHUNK * L) + N;
    return N * (((T + FQLA_CP_CHUNK - 1) / FQLA_CP_CHUNK + L - 1) / L);
}

/* The backward's chains (src/cuda/bwd_chain.cu, bwd_chain_cp.cu): value
 * columns per chain warpgroup (a last slice of V may be half full), and
 * chain warpgroups an SM holds (one CTA of two: both chains' launch takes
 * the reverse chain's shared memory and ~230 registers a thread). */
#define FQLA_CP_BWD_COLS 64
#define FQLA_CP_BWD_CTAS_PER_SM 2

/* The shortest segment, in chunks, whose transitions the plans discount (m_skipped, FQLA_CP_BWD_SKIP):
 * 512 tokens, where a gate of mean log-decay -0.033 per token sums to the
 * shortcut's -17 (the benchmark's gated heads, ~-0.05: from 8 chunks on, not
 * at 4). */
#define FQLA_CP_SKIP_MIN_L 8

/* The pre-pass's shortcut as the backward chains' plan prices it (the
 * kernels decide from the gates, which the plan does not see): a share
 * FQLA_CP_BWD_SKIP of the (segment, value head) pairs, from
 * FQLA_CP_SKIP_MIN_L chunks on, walks only a window of FQLA_CP_BWD_WINDOW
 * chunks without M (bwd_chain.cu's chain_window: the benchmark's gated
 * heads, log-decay ~-0.05 a token, pass e^-17 within 6 chunks; a quarter of
 * its heads are ungated, as the forward's route assumes,
 * FQLA_ROUTE_CP_MSKIP). */
#define FQLA_CP_BWD_SKIP 0.75
#define FQLA_CP_BWD_WINDOW 6

/* The backward chains' step model, calibrated on the GPU: the backward's
 * time against a forced segment length on the 32 bench rows
 * (dev/gpu/bwd_cp_sweep.py on a make DEV=1 build, H100,
 * bench/results/bwd-cp-sweep-h100-2026-12-06.csv), fitted as the row's
 * fixed time plus a step time x this model's steps (docs/history/
 * 2026-12-06-bwdcp.md, section 3). Every wave of chain CTAs costs
 * FQLA_CP_BWD_WAVE_STEPS chunk steps beyond its walk (its launch, the
 * inputs' and the state's first loads); the scan FQLA_CP_BWD_SCAN_STEPS
 * per segment of the longest sequence; a pre-pass step
 * FQLA_CP_BWD_PRE_WEIGHT main-pass steps (its CTAs carry the K identity
 * columns' stores). The plan then picks, among the lengths it tried there,
 * one within 1 % of the row's best in the geomean over the rows, 6 % on
 * the worst (the plan before it: 2.8 %, 25 %). */
#define FQLA_CP_BWD_WAVE_STEPS 4
#define FQLA_CP_BWD_SCAN_STEPS 2
#define FQLA_CP_BWD_PRE_WEIGHT 1.25
/* at most this many segments a sequence: the workspace holds a K x (V + K)
 * fp32 state per segment and value head */
#define FQLA_CP_BWD_MAX_SEGS 256

/* The model's cost in chunk steps of segments of L chunks: nseg segments
 * of the longest sequence (`chunks` chunks), segs segments in all (the real
 * ones: fqla_cp_real_segs, or N nseg for N sequences of one length), units
 * chain warpgroups a (sequence or segment) row (chains HV ceil(V / 64)).
 * The main pass walks L chunks a wave; the pre-pass (every segment but the
 * one that ends its sequence) L chunks a wave for the pairs the shortcut
 * does not cut (over V and the K identity columns) and a window of
 * FQLA_CP_BWD_WINDOW chunks for the others (V only), at the longer of the
 * full pairs' waves and all its work spread over the slots. */
static inline double fqla_cp_bwd_cost(int64_t L, int64_t nseg, int64_t segs, int64_t N, int64_t HV, int64_t K,
                                       int64_t slices, int64_t chains, int64_t slots)
{
    const double wave = (double)FQLA_CP_BWD_WAVE_STEPS;
    const int64_t rows = HV * (segs - N);
    const double skip = L >= FQLA_CP_SKIP_MIN_L ? FQLA_CP_BWD_SKIP : 0.0;
    const int64_t full = rows - (int64_t)(skip * (double)rows);
    const int64_t full_units = chains * full * (slices + K / FQLA_CP_BWD_COLS);
    const int64_t short_units = chains * (rows - full) * slices;
    const int64_t w = L < FQLA_CP_BWD_WINDOW ? L : FQLA_CP_BWD_WINDOW;
    double pre = 0.0;
    if (rows > 0) {
        const double waves = ((double)L + wave) * (double)((full_units + slots - 1) / slots);
        const double spread =
            ((double)full_units * ((double)L + wave) + (double)short_units * ((double)w + wave)) / (double)slots;
        pre = FQLA_CP_BWD_PRE_WEIGHT * (waves > spread ? waves : spread);
    }
    const double main = ((double)L + wave) * (double)((chains * HV * slices * segs + slots - 1) / slots);
    return pre + main + (double)FQLA_CP_BWD_SCAN_STEPS * (double)nseg;
}

/* The segment lengths the plan tries (chunks): the ones the calibration
 * timed. */
#define FQLA_CP_BWD_NLADDER 24
static inline int64_t fqla_cp_bwd_ladder(int i)
{
    const int64_t l[FQLA_CP_BWD_NLADDER] = {4,  6,  8,  10, 12, 14, 16,  20,  24,  28,  32,  40,
                                            48, 56, 64, 80, 96, 128, 192, 256, 384, 512, 768, 1024};
    return l[i];
}

/* The plan over the ladder: nseg(L) segments of the longest sequence
 * (`chunks` chunks), segs(L) in all (cu: the real segments of a host
 * cu_seqlens, else N nseg), against `nocp` without CP. */
static inline int64_t fqla_cp_bwd_pick(const int64_t *cu, int64_t N, int64_t chunks, int64_t HV, int64_t K,
                                        int64_t slices, int64_t chains, int64_t slots, double nocp)
{
    double best = nocp;
    int64_t bestL = 0;
    for (int i = 0; i < FQLA_CP_BWD_NLADDER; i++) {
        const int64_t L = fqla_cp_bwd_ladder(i);
        if (L >= chunks) break;
        const int64_t nseg = (chunks + L - 1) / L;
        if (nseg > FQLA_CP_BWD_MAX_SEGS) continue;
        const int64_t segs = cu ? fqla_cp_real_segs(cu, N, L) : N * nseg;
        const double cost = fqla_cp_bwd_cost(L, nseg, segs, N, HV, K, slices, chains, slots);
        if (cost < best) {
            best = cost;
            bestL = L;
        }
    }
    return bestL;
}

/* The backward chains' segment length in chunks, 0 for no CP: N sequences
 * of `longest` tokens each (a padded batch's T; for packed varlen input
 * without a host cu_seqlens the total T, which bounds the longest), HV
 * value heads, K x V states, `chains` chains in each launch (2: the state
 * chain and the reverse chain; 1: the reverse chain alone, for dh0 alone).
 * Without CP the chain warpgroups (chains N HV ceil(V / 64)) walk the
 * whole sequence in as many waves as the SMs' slots take them; CP where
 * the model above prices a segment length lower. Sequences under 8 chunks
 * are not cut. */
static inline int64_t fqla_cp_bwd_seg_chunks(int64_t N, int64_t longest, int64_t HV, int64_t K, int64_t V,
                                              int64_t chains, int64_t sms)
{
    const int64_t chunks = (longest + FQLA_CP_CHUNK - 1) / FQLA_CP_CHUNK;
    const int64_t slots = FQLA_CP_BWD_CTAS_PER_SM * (sms > 0 ? sms : 1);
    const int64_t slices = (V + FQLA_CP_BWD_COLS - 1) / FQLA_CP_BWD_COLS;
    const int64_t ctas = chains * N * HV * slices;
    if (ctas <= 0 || chunks < 8) return 0;
    const int64_t waves = (ctas + slots - 1) / slots;
    const double nocp = (double)waves * (double)(chunks + FQLA_CP_BWD_WAVE_STEPS);
    return fqla_cp_bwd_pick(0, N, chunks, HV, K, slices, chains, slots, nocp);
}

/* The same for packed sequences from their host cu_seqlens (N + 1
 * offsets): segments counted per sequence (fqla_cp_real_segs), so a short
 * sequence adds one segment rather than the longest one's count; without
 * CP the chains take the longer of the longest sequence and all their
 * chunk steps spread over the slots (a CTA of a short sequence frees its
 * slot for the next). Equal lengths: the padded batch's plan. */
static inline int64_t fqla_cp_bwd_seg_chunks_cu(const int64_t *cu, int64_t N, int64_t HV, int64_t K, int64_t V,
                                                int64_t chains, int64_t sms)
{
    if (N < 1) return 0;
    if (fqla_cp_uniform_len(cu, N, cu[N]) > 0) return fqla_cp_bwd_seg_chunks(N, cu[1], HV, K, V, chains, sms);
    const int64_t chunks = (fqla_cp_longest(cu, N) + FQLA_CP_CHUNK - 1) / FQLA_CP_CHUNK;
    const int64_t slots = FQLA_CP_BWD_CTAS_PER_SM * (sms > 0 ? sms : 1);
    const int64_t slices = (V + FQLA_CP_BWD_COLS - 1) / FQLA_CP_BWD_COLS;
    const int64_t units = chains * HV * slices; /* chain warpgroups a sequence or segment */
    if (units <= 0 || chunks < 8) return 0;
    int64_t all = 0; /* chunks of every sequence */
    for (int64_t n = 0; n < N; n++) all += (cu[n + 1] - cu[n] + FQLA_CP_CHUNK - 1) / FQLA_CP_CHUNK;
    const double spread = (double)((units * all + slots - 1) / slots);
    const double nocp = (spread > (double)chunks ? spread : (double)chunks) +
                        (double)FQLA_CP_BWD_WAVE_STEPS * (double)((units * N + slots - 1) / slots);
    return fqla_cp_bwd_pick(cu, N, chunks, HV, K, slices, chains, slots, nocp);
}

/* What the plan needs to know of a forward call. */
typedef struct fqla_cp_problem {
    int64_t N, T, HV, K, V;
    int64_t H;              /* q/k heads */
    int varlen;
    const int64_t *cu_host; /* [N + 1] host cu_seqlens, or NULL */
    int64_t sms;            /* streaming multiprocessors */
    int prep_saving;        /* 1: with CP the prepare kernel runs without Q (the
                               fused main pass), without CP with Q (the two
                               kernels): CP saves that difference */
    double m_skipped;       /* the share (0..1) of transitions M of segments of
                               FQLA_CP_SKIP_MIN_L or more chunks that the
                               pre-pass is expected to leave out as negligible
                               (the route's cp_skip); 0 prices every one.
                               Which are negligible depends on the gates,
                               which the plan does not see; it only decides
                               whether CP runs (fqla_cp_plan). */
} fqla_cp_problem;

/* Measured costs on the H200, us: one chunk
 * step of the chunk kernel with one consumer warpgroup at one CTA per SM,
 * with two (128 columns), of the state-only pre-pass at two CTAs per SM; the
 * fixed cost of one chunk-kernel launch (fill, first chunk, tail: the fit of
 * TP8 1x2048 .. 1x32768 without CP is 1.41 us per chunk + 10 us); one step of
 * the CP scan, and its launch. */
#define FQLA_CP_US_NWG1 1.41
#define FQLA_CP_US_NWG2 2.1
#define FQLA_CP_US_PRE 1.86
#define FQLA_CP_US_CHAIN 10.0
#define FQLA_CP_US_SCAN 2.7
#define FQLA_CP_US_SCAN0 3.0
/* The second model's costs, us (measured on the H200): a pre-pass
 * wave of L chunks costs L US2_PRE + US2_PRE0; a scan step US2_SCAN0 +
 * HV US2_SCAN_HV; the prepare kernel without Q saves US2_PREP per chunk
 * slot and q/k head over the one with Q (0.0096-0.0146 measured). */
#define FQLA_CP_US2_PRE 1.3
#define FQLA_CP_US2_PRE0 7.0
#define FQLA_CP_US2_SCAN0 1.7
#define FQLA_CP_US2_SCAN_HV 0.09
#define FQLA_CP_US2_PREP 0.011

static inline int64_t fqla_cp_waves(int64_t ctas, int64_t slots) { return (ctas + slots - 1) / slots; }

/* The pre-pass's CTAs over segs segments of L chunks: one per 64 columns of
 * H (V / 64) and of the transition M (K / 64) per segment and value head;
 * the M slices the shortcut leaves out (m_skipped) exit at once and are not
 * counted. With m_skipped = 0: segs HV (V + K) / 64. */
/* The share of the shortcut priced at segments of L chunks: q's m_skipped,
 * clamped to [0, 1] (NaN: none), from FQLA_CP_SKIP_MIN_L chunks on. */
static inline double fqla_cp_skip_share(const fqla_cp_problem *q, int64_t L)
{
    const double skip = L >= FQLA_CP_SKIP_MIN_L ? q->m_skipped : 0.0;
    return !(skip > 0.0) ? 0.0 : skip > 1.0 ? 1.0 : skip;
}

static inline int64_t fqla_cp_pre_ctas(const fqla_cp_problem *q, int64_t segs, int64_t L)
{
    const int64_t h = segs * q->HV * (q->V / 64), m = segs * q->HV * (q->K / 64);
    return h + m - (int64_t)(fqla_cp_skip_share(q, L) * (double)m); /* rounds the live slices up */
}

/* The chunk kernel over rows x HV recurrences of `steps` chunks, with the
 * better of one or two consumer warpgroups per CTA (route_plan.h fqla_route_nwg). */
static inline double fqla_cp_chain_us(const fqla_cp_problem *q, int64_t rows, int64_t steps)
{
    const int64_t c64 = rows * q->HV * (q->V / 64);
    double t = (double)(fqla_cp_waves(c64, q->sms) * steps) * FQLA_CP_US_NWG1;
    if (q->V % 128 == 0) {
        const double t2 = (double)(fqla_cp_waves(c64 / 2, q->sms) * steps) * FQLA_CP_US_NWG2;
        if (t2 < t) t = t2;
    }
    return t;
}

/* The second model's time with segments of L chunks (see fqla_cp_plan):
 * the sequences' lengths from cu (host cu_seqlens), or all maxlen. */
static inline double fqla_cp_time2(const fqla_cp_problem *q, const int64_t *cu, int64_t maxlen, int64_t chunks,
                                   int64_t L)
{
    const int64_t segs = cu ? fqla_cp_real_segs(cu, q->N, L) : q->N * fqla_cp_nseg(maxlen, L);
    const int64_t pre = segs - q->N; /* a sequence's last segment is left out of the pre-pass */
    const double tokens = (double)(q->varlen ? q->T : q->N * q->T);
    return fqla_cp_chain_us(q, segs, L) +
           (double)fqla_cp_waves(fqla_cp_pre_ctas(q, pre, L), 2 * q->sms) *
               ((double)L * FQLA_CP_US2_PRE + FQLA_CP_US2_PRE0) +
           2 * FQLA_CP_US_CHAIN + (double)((chunks + L - 1) / L) * (FQLA_CP_US2_SCAN0 + FQLA_CP_US2_SCAN_HV * q->HV) +
           FQLA_CP_US_SCAN0 - (q->prep_saving ? FQLA_CP_US2_PREP * (tokens / FQLA_CP_CHUNK + q->N) * q->H : 0.0);
}

/* Chunks per segment at q's m_skipped, or 0 for no CP (fqla_cp_plan below
 * decides where the share applies), by two latency models, CP only where
 * one saves 10 % and never where the recurrences alone fill the SMs:
 * - the first (fitted on TP8 and TP4 rows):
 *     without CP: chain(N, chunks of the longest sequence) + US_CHAIN
 *     with L:     chain(segs, L) + waves(pre-pass CTAs, 2 per SM) L US_PRE
 *                 + 2 US_CHAIN + ceil(chunks / L) US_SCAN + US_SCAN0
 * - where the first plans no CP, the second: the pre-pass over
 *   each sequence's segments but its last, a scan step that grows with HV,
 *   and the prepare kernel's saving when CP's main pass is the fused kernel
 *   and the path without CP the two kernels (prep_saving). It gained
 *   x0.87-0.97 on 22 of the 24 benchmark rows where it plans CP and the
 *   first does not (x1.004 and x1.008 on the other two); where the first
 *   plans CP, the second's choices measured x1.04-1.17 slower (TP8, TP4,
 *   2B), so it does not overrule it there.
 * L = 4, 8, ..., chunks / 2. Packed varlen input is planned from cu_host
 * when given (the longest sequence, the exact segment count), else as N
 * sequences of T / N tokens. K in {64, 128}, V % 64 = 0 (the TMA kernel's
 * cases; the caller checks). */
static inline int64_t fqla_cp_plan_priced(const fqla_cp_problem *q)
{
    const int64_t C = FQLA_CP_CHUNK;
    if (q->N <= 0 || q->sms <= 0 || q->N * q->HV * (q->V / 64) >= q->sms) return 0;
    const int64_t *cu = q->varlen ? q->cu_host : 0;
    const int64_t maxlen = cu ? fqla_cp_longest(cu, q->N) : q->varlen ? (q->T + q->N - 1) / q->N : q->T;
    const int64_t chunks = (maxlen + C - 1) / C;
    const double base = 0.9 * (fqla_cp_chain_us(q, q->N, chunks) + FQLA_CP_US_CHAIN);
    double best_t = base;
    int64_t best = 0;
    for (int64_t L = 4; 2 * L <= chunks; L *= 2) {
        const int64_t segs = cu ? fqla_cp_real_segs(cu, q->N, L) : q->N * ((chunks + L - 1) / L);
        const double t = fqla_cp_chain_us(q, segs, L) +
                         (double)(fqla_cp_waves(fqla_cp_pre_ctas(q, segs, L), 2 * q->sms) * L) *
                             FQLA_CP_US_PRE +
                         2 * FQLA_CP_US_CHAIN + (double)((chunks + L - 1) / L) * FQLA_CP_US_SCAN + FQLA_CP_US_SCAN0;
        if (t < best_t) {
            best_t = t;
            best = L;
        }
    }
    if (best > 0) return best;
    best_t = base; /* the second model */
    for (int64_t L = 4; 2 * L <= chunks; L *= 2) {
        const double t = fqla_cp_time2(q, cu, maxlen, chunks, L);
        if (t < best_t) {
            best_t = t;
            best = L;
        }
    }
    return best;
}

/* Chunks per segment, or 0 for no CP. The segment length is chosen pricing
 * every transition (fqla_cp_plan_priced with m_skipped 0); only where that
 * plans no CP is m_skipped's discount asked whether CP pays. Measured on
 * the 123 benchmark rows where CP may run: the
 * discount applied everywhere moved rows that already ran CP to shorter
 * segments, x1.14-1.32 slower (more segments and scan steps, which it does
 * not price), while every row it sped up (x0.78-0.98) was one the full
 * price had kept from CP. */
static inline int64_t fqla_cp_plan(const fqla_cp_problem *q)
{
    fqla_cp_problem full = *q;
    full.m_skipped = 0.0;
    const int64_t L = fqla_cp_plan_priced(&full);
    if (L > 0 || !(q->m_skipped > 0.0)) return L;
    return fqla_cp_plan_priced(q);
}

/* ---- CP on the chunked fp32 forward (fwd_chunk_f32.cu) -------------------
 *
 * That kernel walks a chunk in ~15-18 us (one CTA per SM, latency-bound
 * between its four CTA barriers), ten times the bf16 chain's step, so a few
 * long sequences on few heads leave most SMs idle for milliseconds: 397B
 * TP8 1x32768 (8 value heads) ran 7.9 ms on 32 CTAs of 132 SMs (H100),
 * against FLA's fp32 forward at 3.0. The same three launches as the bf16
 * CP (the kernel's state-only pre-pass over V + K columns, fwd_cp.cu's
 * scan, the main pass from the scanned start states) in a model of whole
 * chunk steps: without CP every CTA walks the longest sequence; with
 * segments of L chunks the main pass walks L chunks a wave, the scan costs
 * a step per segment, and the pre-pass runs every segment but a sequence's
 * last. There, on the share m_skipped of its (segment, head) pairs, the
 * shortcut leaves the transition out and starts H WINDOW chunks before the
 * segment's end (the benchmark's gated heads, ~-0.05 a token, reach e^-17
 * in ~5.3 chunks); the other pairs walk all L chunks over V + K columns.
 * The pre-pass takes the longer of those long CTAs' waves and all its work
 * spread over the SMs. Each pass picks its slice width (32 or 64 columns).
 * Step costs measured on the H100 (fwd-fp32-h100-2026-12-05.txt: 32
 * columns 15.3 us a chunk, 1x32768; 64 columns 17.7-18.4, 8192x4 and
 * 4096x8); CP_SCALE is what the CP launches measured over this model on
 * 38 rows of 397B TP8 / TP4 and 27B TP2 (x1.04-1.26; many CTAs at once
 * take longer a step than one wave of few). CP where the model saves 10 %. */
#define FQLA_CP_F32_US32 15.3
#define FQLA_CP_F32_US64 18.0
#define FQLA_CP_F32_US_LAUNCH 10.0
#define FQLA_CP_F32_WINDOW 6
#define FQLA_CP_F32_CP_SCALE 1.15

typedef struct fqla_cp_f32_plan {
    int64_t seg_chunks; /* L, or 0: no CP */
    int bv;             /* the main pass's (or, without CP, the kernel's) value columns per CTA */
    int pre_bv;         /* the pre-pass's (cp) */
} fqla_cp_f32_plan;

/* The faster slice width for rows x HV chains of steps chunks over cols
 * value columns (32 where cols is not a multiple of 64); its time in *us. */
static inline int fqla_cp_f32_width(int64_t rows, int64_t HV, int64_t cols, int64_t steps, int64_t sms, double *us)
{
    const double t32 = (double)(fqla_cp_waves(rows * HV * (cols / 32), sms) * steps) * FQLA_CP_F32_US32;
    if (cols % 64 != 0) {
        *us = t32;
        return 32;
    }
    const double t64 = (double)(fqla_cp_waves(rows * HV * (cols / 64), sms) * steps) * FQLA_CP_F32_US64;
    *us = t64 <= t32 ? t64 : t32;
    return t64 <= t32 ? 64 : 32;
}

/* The pre-pass over `full` (segment, head) rows that walk all L chunks
 * over V + K columns and `short_rows` whose H alone walks WINDOW chunks
 * (HV heads each): the faster slice width, its time in *us. */
static inline int fqla_cp_f32_pre(int64_t full, int64_t short_rows, int64_t HV, int64_t K, int64_t V, int64_t L,
                                  int64_t sms, double *us)
{
    const int64_t w = L < FQLA_CP_F32_WINDOW ? L : FQLA_CP_F32_WINDOW;
    int best = 32;
    *us = -1.0;
    for (int bv = 32; bv <= 64; bv += 32) {
        if ((V + K) % bv != 0 || V % bv != 0) continue;
        const int64_t lc = full * HV * ((V + K) / bv), sc = short_rows * HV * (V / bv);
        const int64_t waves = fqla_cp_waves(lc, sms) * L, spread = fqla_cp_waves(lc * L + sc * w, sms);
        const double t = (double)(waves > spread ? waves : spread) * (bv == 64 ? FQLA_CP_F32_US64 : FQLA_CP_F32_US32);
        if (*us < 0.0 || t < *us) {
            *us = t;
            best = bv;
        }
    }
    return best;
}

/* The plan for q's shape (q->K in {64, 128}, q->V % 32 = 0; prep_saving is
 * not read): m_skipped, the share of the pre-pass's (segment, head) pairs
 * the shortcut shortens, applies to segments of FQLA_CP_SKIP_MIN_L chunks
 * or more. */
static inline fqla_cp_f32_plan fqla_cp_plan_f32(const fqla_cp_problem *q)
{
    const int64_t C = FQLA_CP_CHUNK;
    fqla_cp_f32_plan r = {0, 32, 32};
    if (q->N <= 0 || q->sms <= 0) return r;
    const int64_t *cu = q->varlen ? q->cu_host : 0;
    const int64_t maxlen = cu ? fqla_cp_longest(cu, q->N) : q->varlen ? (q->T + q->N - 1) / q->N : q->T;
    const int64_t chunks = (maxlen + C - 1) / C;
    double base;
    r.bv = fqla_cp_f32_width(q->N, q->HV, q->V, chunks, q->sms, &base);
    base = 0.9 * (base + FQLA_CP_F32_US_LAUNCH);
    for (int64_t L = 2; 2 * L <= chunks; L *= 2) {
        const int64_t segs = cu ? fqla_cp_real_segs(cu, q->N, L) : q->N * ((chunks + L - 1) / L);
        /* the passes' grid rows: segment indices x heads (+ the tail's CTAs) in gridDim.x */
        if ((fqla_cp_segs(q->varlen, q->T, q->N, L) + 1) * q->HV > 0x7fffffffLL) continue;
        double t_main, t_pre;
        const int bv = fqla_cp_f32_width(segs, q->HV, q->V, L, q->sms, &t_main);
        const int64_t full = (int64_t)((1.0 - fqla_cp_skip_share(q, L)) * (double)(segs - q->N) + 0.999);
        const int pre_bv = fqla_cp_f32_pre(full, segs - q->N - full, q->HV, q->K, q->V, L, q->sms, &t_pre);
        const double t = FQLA_CP_F32_CP_SCALE * (t_main + t_pre + (double)((chunks + L - 1) / L) * FQLA_CP_US_SCAN +
                                                 FQLA_CP_US_SCAN0 + 3 * FQLA_CP_F32_US_LAUNCH);
        if (t < base) {
            base = t;
            r.seg_chunks = L;
            r.bv = bv;
            r.pre_bv = pre_bv;
        }
    }
    return r;
}

#endif
