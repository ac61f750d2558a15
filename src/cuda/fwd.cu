/*
 * fwd.cu - the CUDA forward's entry points (declared in cuda_backend.h):
 * what the kernels cover, the exact workspace, and the launches on the
 * caller's stream:
 * - where K is 64, 128 or 256 and the rows suit TMA (the default where
 *   pick_fused says it pays): the prepare kernel without Q (fwd_prepare.cu:
 *   gamma, Ag, and rk with the in-kernel l2norm), then the kernel that forms
 *   Pg beside the chain (fwd_fused.cu), with one or two chain warpgroups per
 *   CTA;
 * - else the two-kernel path: the prepare kernel with Q (also Pg), then the
 *   chunk kernel: fwd_chunk_wg.cu on TMA + wgmma where K is 64 or 128, V a
 *   multiple of 64 and the rows 16-byte aligned, else fwd_chunk.cu on
 *   mma.sync.
 * Where sequences x heads leave SMs idle, the chain runs as intra-card
 * context parallelism instead (DESIGN.md §3): a state-only pre-pass over
 * segments of the sequences, the scan of fwd_cp.cu, and a main pass over
 * the segments, on the fused kernel where it covers the call (plan_cp
 * decides, from the shapes and cu_seqlens_host). Nothing here allocates,
 * synchronises or reads device memory on the host (the TMA maps are encoded
 * on the host and passed as kernel parameters), so a call can be captured
 * in a CUDA graph.
 *
 * - fp32 q/k/v: the recurrence token by token in fp32 (fwd_recurrent.cu), a
 *   slower path at fp32 accuracy.
 *
 * Covered: q/k/v/o bf16, fp16 or fp32; K in {64, 128, 256}; V a multiple of
 * 32; g, beta f32 or bf16; initial / final state f32 or bf16, either layout;
 * varlen (int32 / int64 cu_seqlens, read on the device) and padded batches;
 * GVA; the in-kernel l2norm, gate and beta sigmoid. fp64 q/k/v return
 * NOT_SUPPORTED.
 */
#include "cuda/cuda_backend.h"
#include "cuda/fwd_common.cuh"

#include <stdlib.h>
#include <string.h>

namespace {

int64_t slots_of(const fqla_problem *p)
{
    if (p->varlen) return p->T / FQLA_FWD_CHUNK + p->N;
    return p->N * ((p->T + FQLA_FWD_CHUNK - 1) / FQLA_FWD_CHUNK);
}

/* V slice per CTA: narrow slices when there are too few recurrences to fill
 * the GPU (the recurrence is a latency-bound chain), 64 otherwise. */
int pick_bv(const fqla_context *ctx, const fqla_problem *p)
{
    if (p->K == 256) return 32;
    if (p->V % 64 != 0) return 32;
    int64_t ctas64 = p->N * p->HV * (p->V / 64);
    int sms = ctx->info.sm_count > 0 ? ctx->info.sm_count : 132;
    return ctas64 * 2 <= sms ? 32 : 64;
}

const char *dname(fqla_dtype d) { return fqla_dtype_string(d); }

/* Kernel variants picked by fqla_cuda_fwd_tune (0 / -1: the defaults) and
 * fqla_cuda_fwd_tune_chunk (-1 / 0: the defaults). */
int g_tune_hb = 0, g_tune_late = -1;
int g_tune_wg = -1, g_tune_nwg = 0;
int64_t g_tune_cp = -1;
int g_tune_scan_cb = 0;
int g_tune_cp_skip = 1;
int g_tune_pdl = -1;
double g_tune_cp_mskip = -1.0;

/* The CP plan's default m_skipped (cp_plan.h): the benchmark's gates, a
 * quarter of the heads ungated and the rest summing past the shortcut's -17
 * over 8 chunks. With it CP runs on 13 of the 123 benchmark rows where CP
 * may, that priced in full had none, x0.78-0.98 (docs/perf.md, session 16).
 * Where a model's gates leave no transition negligible those rows pay the
 * pre-pass in full; the same section measures that cost. */
#define CP_MSKIP_DEFAULT 0.75

/* Consumer warpgroups per CTA of the wgmma chunk kernel. Two (one CTA per
 * 128 value columns, sharing the K, Q, Ag, Pg tiles) run a CTA ~1.4x longer
 * than one does (measured on the H200, docs/perf.md v4) but halve the CTAs;
 * either way one CTA fits on an SM. Pick the one with fewer waves x time.
 * K = 256 has one: the fused kernel's only width there. */
int pick_nwg(const fqla_context *ctx, const fqla_problem *p, int64_t rows)
{
    if (g_tune_nwg == 1 || g_tune_nwg == 2) return (g_tune_nwg == 2 && p->V % 128 == 0) ? 2 : 1;
    if (p->V % 128 != 0 || p->K == 256) return 1;
    const int64_t sms = ctx->info.sm_count > 0 ? ctx->info.sm_count : 132;
    const int64_t ctas2 = rows * p->HV * (p->V / 128);
    const int64_t waves1 = (2 * ctas2 + sms - 1) / sms, waves2 = (ctas2 + sms - 1) / sms;
    return waves2 * 14 < waves1 * 10 ? 2 : 1;
}

/* The kernel that forms Pg beside the chain (fwd_fused.cu, after the
 * prepare kernel without Q): its chain warpgroups per CTA (pick_nwg's), or
 * 0 for the two-kernel path, by the 171 rows measured on the H200
 * (docs/perf.md, session 12). Its chain runs up to ~10 % longer than the
 * chunk kernel's above a GVA group of 2 (Q K^T formed per value head, and
 * with one warpgroup per 64 columns), its prepare kernel 30-50 % shorter.
 * - nwg = 2: every row gained or held (x0.94-1.01), unequal sequences at
 *   groups 3-4 too (session 9 had measured those x1.00-1.07 slower, before
 *   the prepare kernel without Q got TMA, wgmma and PAIR in session 10).
 * - nwg = 1: the prepare kernel's time grows with tokens x q/k heads, the
 *   chain's with the longest sequence, so it pays where T H >= 12 x the
 *   longest sequence (16 sequence-heads: x0.77-0.99, 8: x0.99-1.08).
 *   Without a host copy of cu_seqlens a varlen call counts one sequence as
 *   holding every token. */
int pick_fused(const fqla_context *ctx, const fqla_problem *p)
{
    /* K = 256: the fused kernel wherever it covers the call; the two-kernel
     * path there is the mma.sync chunk kernel (docs/perf.md, session 26) */
    if (p->K == 256) return pick_nwg(ctx, p, p->N);
    const int nwg = pick_nwg(ctx, p, p->N);
    if (nwg == 2) return 2;
    const int64_t *cu = p->cu_host; /* the validated host copy (varlen only) */
    /* else a padded batch's sequences, or every token in one */
    const int64_t longest = cu && p->N > 0 ? fqla_cp_longest(cu, p->N) : p->T;
    const int64_t tokens = p->varlen ? p->T : p->N * p->T;
    return tokens * p->H >= 12 * longest ? 1 : 0;
}

/* The fused kernel's chains for its first launch where the last wave is
 * split (fqla_fwd_params.fused_split), else 0. With two chain warpgroups a
 * CTA holds an SM (registers) and covers one chain at V = 128, so N x HV
 * chains run in waves of SMs CTAs; where the last wave would hold at most
 * half the SMs, its chains run instead with one chain warpgroup per CTA
 * (two CTAs per chain), all of them at once, in ~0.8 of a full wave's
 * time: 27B at 192 chains ran 132 + 60, now x0.93-0.95 end to end
 * (docs/perf.md, session 19). Only for padded batches (equal lengths): in
 * varlen calls the waves overlap. */
#ifndef FQLA_FWD_SPLIT_WAVE
#define FQLA_FWD_SPLIT_WAVE 1
#endif
int64_t split_last_wave(const fqla_context *ctx, const fqla_problem *p)
{
    if (!FQLA_FWD_SPLIT_WAVE || p->varlen || p->V != 128) return 0;
    const int64_t sms = ctx->info.sm_count > 0 ? ctx->info.sm_count : 132;
    const int64_t chains = p->N * p->HV, full = chains / sms, rem = chains % sms;
    return full >= 1 && rem > 0 && 2 * rem <= sms ? full * sms : 0;
}

int64_t cp_segs(const fqla_problem *p, int64_t L) { return fqla_cp_segs(p->varlen, p->T, p->N, L); }

/* The segments that hold tokens, for sizing the main pass: packed varlen
 * input's index range (cp_segs) has up to one spare index per sequence, and
 * counting those made pick_nwg choose two warpgroups where one wave of one
 * fits (TP8 1x16384: 9 x 8 x 2 > 132 SMs against 8 x 8 x 2 real CTAs, the
 * main pass 68 us against 51: docs/perf.md, session 14). Exact from the host
 * copy of cu_seqlens; without one the index range. */
int64_t cp_real_segs(const fqla_problem *p, int64_t L)
{
    return p->varlen && p->cu_host ? fqla_cp_real_segs(p->cu_host, p->N, L) : cp_segs(p, L);
}

/* Context parallelism: chunks per segment, or 0 for none (cp_plan.h's
 * model), where the TMA chunk kernel runs; the tuning hook overrides it. */
int64_t plan_cp(const fqla_context *ctx, const fqla_problem *p)
{
    if (g_tune_cp == 0 || g_tune_wg == 0 || (p->K != 64 && p->K != 128) || p->V % 64 != 0) return 0;
    if (g_tune_cp > 0) return cp_segs(p, g_tune_cp) * p->HV <= 0x7fffffffLL ? g_tune_cp : 0;
    fqla_cp_problem q;
    q.N = p->N;
    q.T = p->T;
    q.HV = p->HV;
    q.K = p->K;
    q.V = p->V;
    q.H = p->H;
    q.varlen = p->varlen;
    q.cu_host = p->cu_host;
    q.sms = ctx->info.sm_count > 0 ? ctx->info.sm_count : 132;
    /* CP's main pass is the fused kernel (its prepare kernel without Q)
     * where that covers the call (K = 64 or 128: run_cp and
     * fqla_fwd_fused_usable; the TMA alignments are assumed); without
     * CP, pick_fused's route */
    const int cp_fused = fqla_fwd_fused_k(p->K) && g_tune_wg != 1;
    q.prep_saving = cp_fused && !(g_tune_wg == 2 || (g_tune_wg == -1 && pick_fused(ctx, p)));
    /* The share of transitions the shortcut is expected to leave out
     * (none when it is off); it only decides whether CP runs, not L
     * (fqla_cp_plan) */
    q.m_skipped = !g_tune_cp_skip ? 0.0 : g_tune_cp_mskip < 0 ? CP_MSKIP_DEFAULT : g_tune_cp_mskip;
    return fqla_cp_plan(&q);
}

/* Packed varlen input whose sequences all have one length L and fill the
 * tokens (cu_seqlens_host = 0, L, 2L, ..., T) runs as the padded batch it
 * is, [N][L] over the same memory: the prepare kernel then maps a chunk slot
 * to its sequence by a division instead of searching cu_seqlens (a dependent
 * load before each CTA's first copies: ~5-8 % of that kernel, docs/perf.md,
 * session 14), and no CTAs zero rows past the last sequence. Returns L, or 0
 * (the input stays varlen); *pp is the problem to plan and run. */
int64_t uniform_as_padded(const fqla_problem *p, fqla_problem *pp)
{
    *pp = *p;
    const int64_t L = p->varlen && p->cu_host ? fqla_cp_uniform_len(p->cu_host, p->N, p->T) : 0;
    if (!L) return 0;
    pp->varlen = 0;
    pp->B = p->N;
    pp->T = L;
    pp->cu_host = NULL;
    pp->cu = NULL;
    return L;
}

/* The workspace of the call, and its CP plan in *seg_chunks. */
fqla_fwd_ws_layout ws_layout(const fqla_context *ctx, const fqla_problem *p, int64_t *seg_chunks)
{
    if (p->io_dtype == FQLA_DTYPE_F32) { /* the recurrent kernel: none */
        fqla_fwd_ws_layout none;
        memset(&none, 0, sizeof none);
        *seg_chunks = 0;
        return none;
    }
    const int64_t L = plan_cp(ctx, p);
    *seg_chunks = L;
    return fqla_fwd_ws(slots_of(p), p->H, p->HV, p->opt.use_qk_l2norm, 2, L > 0 ? cp_segs(p, L) : 0, p->K, p->V);
}

} // namespace

/* Context parallelism for benchmarks and tests: -1 the plan (default), 0
 * never, L > 0 segments of L chunks wherever the TMA kernel runs. Like the
 * other hooks it changes the workspace size: set it before the query. */
extern "C" void fqla_cuda_fwd_tune_cp(int seg_chunks)
{
    g_tune_cp = seg_chunks;
}

/* 1 (the default): the CP pre-pass leaves out transitions its segment's
 * decay makes negligible (fwd_chunk_wg.cu m_negligible), and the scan skips
 * them; 0 computes every one. On since session 14, when the fused path got
 * the chunk flags it needs: x0.79-0.90 on the CP rows with 16 or more value
 * heads, where the pre-pass runs several waves (docs/perf.md); flat on TP8
 * (CP v3). */
extern "C" void fqla_cuda_fwd_tune_cp_skip(int on)
{
    g_tune_cp_skip = on != 0;
}

/* The share (0..1) of long segments' transitions the CP plan expects the
 * shortcut to leave out (cp_plan.h m_skipped), where pricing every one plans
 * no CP: 0 prices every one, < 0 the default (CP_MSKIP_DEFAULT). For
 * benchmarks: the plan's picks at other shares, timed beside the forced
 * segment lengths (docs/perf.md, sessions 15-16). Like
 * fqla_cuda_fwd_tune_cp it can change the workspace size: set it before
 * the query. */
extern "C" void fqla_cuda_fwd_tune_cp_mskip(double share)
{
    g_tune_cp_mskip = share;
}

/* Programmatic dependent launch of the kernels after the prepare kernel:
 * 1 on, 0 off, -1 the default (on). Each of them may then launch while its
 * predecessor drains (pdl.cuh). */
extern "C" void fqla_cuda_fwd_tune_pdl(int on)
{
    g_tune_pdl = on;
}

/* Test hook: how many (segment, value head) transitions the last CP call
 * left out as negligible, read back from its workspace (synchronises; the
 * workspace must still be live). -1 if the last call ran no CP with the
 * shortcut on, or if this was asked already. */
static const int *g_debug_flags = NULL;
static int64_t g_debug_flag_count = 0;
extern "C" int64_t fqla_cuda_fwd_debug_cp_skipped(void)
{
    if (!g_debug_flags || cudaDeviceSynchronize() != cudaSuccess) return -1;
    int *h = (int *)malloc((size_t)g_debug_flag_count * sizeof(int));
    if (!h) return -1;
    int64_t n = -1;
    if (cudaMemcpy(h, g_debug_flags, (size_t)g_debug_flag_count * sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess)
        for (int64_t i = n = 0; i < g_debug_flag_count; i++) n += h[i] != 0;
    free(h);
    g_debug_flags = NULL;
    return n;
}

/* Value columns per CTA of the CP scan (8, 16 or 32; 0: by the grid). */
extern "C" void fqla_cuda_fwd_tune_cp_scan(int columns)
{
    g_tune_scan_cb = columns == 8 || columns == 16 || columns == 32 ? columns : 0;
}

extern "C" void fqla_cuda_fwd_tune(int prep_variant, int late_loads)
{
    g_tune_hb = prep_variant;
    g_tune_late = late_loads;
}

/* The same kind of hook for the chunk kernel: wg = 0 forces the mma.sync
 * kernel (fwd_chunk.cu), 1 the wgmma kernel of fwd_chunk_wg.cu with nwg =
 * 1 or 2 consumer warpgroups per CTA (0: pick_nwg), 2 the kernel that forms
 * Pg beside the chain (fwd_fused.cu, after the prepare kernel without Q)
 * with nwg chain warpgroups (0: pick_nwg);
 * -1 (the default) the last where it covers the call, CP is not planned
 * and pick_fused says it is faster, else the second. Each runs only where
 * it can (fwd_fused.cu's and fqla_fwd_wg_usable's conditions), else the
 * next: fused, wgmma, mma.sync. */
extern "C" void fqla_cuda_fwd_tune_chunk(int wg, int nwg)
{
    g_tune_wg = wg;
    g_tune_nwg = nwg;
}

/* The kernels the last forward call in this process enqueued, for the
 * tests (which must know that a forced path ran, not its fallback): 1 the
 * fused kernel after the prepare kernel without Q, 2 the wgmma chunk
 * kernel, 3 the mma.sync chunk kernel, 4 the fp32 recurrent kernel; + 8
 * with context parallelism; 0 before any call. Not synchronised: one calling thread. */
static int g_last_route = 0;
extern "C" int fqla_cuda_fwd_last_route(void) { return g_last_route; }

/* Context parallelism: the prepare kernel, then the pre-pass (the TMA
 * chunk kernel without output: H | M of every segment but each sequence's
 * last into seg_hm), the scan (start states into seg_s0; the final state of
 * empty sequences) and the main pass (o, the final state from each
 * sequence's last segment). The main pass is the kernel that forms Pg
 * beside the chain where it covers the call (then the prepare kernel runs
 * without Q), else the TMA chunk kernel; the tuning hook's wg = 1 or 2
 * forces either. Falls back to the mma.sync kernel over whole sequences if
 * the TMA maps cannot be encoded. */
static fqla_status run_cp(fqla_context *ctx, const fqla_problem *p, fqla_fwd_params k, unsigned char *ws,
                          const fqla_fwd_ws_layout &L, int64_t seg_chunks, int io_bf16, cudaStream_t stream)
{
    k.seg_chunks = seg_chunks;
    k.segs = cp_segs(p, seg_chunks);
    /* CP's chain (pre-pass, scan, main pass) measured ~1% slower with PDL on
     * every CP row tried (docs/perf.md, PDL), so its kernels launch plainly */
    k.pdl = 0;
    k.seg_hm = (float *)(ws + L.seg_hm);
    k.seg_s0 = (float *)(ws + L.seg_s0);
    k.seg_flag = (int *)(ws + L.seg_flag);
    k.cp_skip = k.chunk_ok != NULL;
    g_debug_flags = k.cp_skip ? k.seg_flag : NULL;
    g_debug_flag_count = k.segs * p->HV;
    const int64_t VX = p->V + p->K;

    fqla_fwd_params mp = k;
    mp.cp_mode = 2;
    mp.h0 = k.seg_s0;
    mp.h0_bf16 = 0;
    mp.h0_sn = p->HV * p->K * p->V;
    mp.h0_sh = p->K * p->V;
    mp.h0_s2 = p->V;
    mp.v_first = 0; /* the start states; the final state keeps the caller's layout */
    const int main_nwg = pick_nwg(ctx, p, cp_real_segs(p, seg_chunks));
    int fused = g_tune_wg != 1 && fqla_fwd_fused_usable(mp, main_nwg);
    int used = 0;
    cudaError_t err = cudaSuccess;
    if (fused) {
        err = fqla_fwd_launch_fused(k, io_bf16, g_tune_hb, main_nwg, FQLA_FUSED_PREPARE, stream, &used);
        if (err != cudaSuccess) return fqla_cuda_check(ctx, err, "CUDA forward: prepare kernel launch");
        fused = used;
    }
    if (!fused) {
        err = fqla_fwd_launch_prepare(k, io_bf16, g_tune_hb, NULL, NULL, stream);
        if (err != cudaSuccess) return fqla_cuda_check(ctx, err, "CUDA forward: prepare kernel launch");
    }

    fqla_fwd_params pre = k;
    pre.cp_mode = 1;
    pre.h0 = NULL;
    pre.ht = k.seg_hm;
    pre.ht_bf16 = 0;
    pre.ht_sn = p->HV * p->K * VX;
    pre.ht_sh = p->K * VX;
    pre.ht_s2 = VX;
    pre.v_first = 0;
    pre.ht_v_first = 0;
    err = fqla_fwd_launch_chunk_wg(pre, io_bf16, 1, stream, &used);
    if (err != cudaSuccess) return fqla_cuda_check(ctx, err, "CUDA forward: CP pre-pass launch");
    if (!used && fused) /* the same maps were encoded for the prepare kernel */
        return fqla_fail(ctx, FQLA_STATUS_INTERNAL_ERROR, "CUDA forward: the CP pre-pass's TMA maps failed");
    if (!used) {
        g_last_route = 3;
        return fqla_cuda_check(ctx, fqla_fwd_launch_chunk(k, io_bf16, pick_bv(ctx, p), g_tune_late, stream),
                               "CUDA forward: chunk kernel launch");
    }
    g_last_route = 8 + (fused ? 1 : 2);
    err = fqla_fwd_launch_cp_scan(k, g_tune_scan_cb, ctx->info.sm_count > 0 ? ctx->info.sm_count : 132, stream);
    if (err != cudaSuccess) return fqla_cuda_check(ctx, err, "CUDA forward: CP scan launch");

    if (fused) {
        err = fqla_fwd_launch_fused(mp, io_bf16, g_tune_hb, main_nwg, FQLA_FUSED_CHAIN, stream, &used);
        if (err == cudaSuccess && !used)
            return fqla_fail(ctx, FQLA_STATUS_INTERNAL_ERROR, "CUDA forward: the CP main pass's TMA maps failed");
    } else {
        err = fqla_fwd_launch_chunk_wg(mp, io_bf16, main_nwg, stream, &used);
    }
    return fqla_cuda_check(ctx, err, "CUDA forward: CP main pass launch");
}

fqla_status fqla_cuda_fwd_supported(fqla_context *ctx, const fqla_problem *p, const fqla_fwd_args *a)
{
    if (p->io_dtype != FQLA_DTYPE_BF16 && p->io_dtype != FQLA_DTYPE_F16 && p->io_dtype != FQLA_DTYPE_F32)
        return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED,
                         "q/k/v/o: dtype %s is not supported by the CUDA forward (BF16, F16 or F32)",
                         dname(p->io_dtype));
    if (p->K != 64 && p->K != 128 && p->K != 256)
        return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED,
                         "K = %lld is not supported by the CUDA forward (64, 128 or 256)", (long long)p->K);
    if (p->V % 32 != 0 || p->V > 1024)
        return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED,
                         "V = %lld is not supported by the CUDA forward (a multiple of 32, at most 1024)",
                         (long long)p->V);
    if (a->g.dtype != FQLA_DTYPE_F32 && a->g.dtype != FQLA_DTYPE_BF16)
        return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED, "g: dtype %s is not supported by the CUDA forward (F32 or BF16)",
                         dname(a->g.dtype));
    if (a->beta.dtype != FQLA_DTYPE_F32 && a->beta.dtype != FQLA_DTYPE_BF16)
        return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED,
                         "beta: dtype %s is not supported by the CUDA forward (F32 or BF16)", dname(a->beta.dtype));
    if (a->initial_state.data && a->initial_state.dtype != FQLA_DTYPE_F32 &&
        a->initial_state.dtype != FQLA_DTYPE_BF16)
        return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED,
                         "initial_state: dtype %s is not supported by the CUDA forward (F32 or BF16)",
                         dname(a->initial_state.dtype));
    if (a->final_state.data && a->final_state.dtype != FQLA_DTYPE_F32 && a->final_state.dtype != FQLA_DTYPE_BF16)
        return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED,
                         "final_state: dtype %s is not supported by the CUDA forward (F32 or BF16)",
                         dname(a->final_state.dtype));
    if (p->opt.use_gate_in_kernel &&
        ((a->A_log.data && a->A_log.dtype != FQLA_DTYPE_F32) || (a->dt_bias.data && a->dt_bias.dtype != FQLA_DTYPE_F32)))
        return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED, "A_log / dt_bias: the CUDA forward takes F32");
    if (p->N * p->HV > 0x7fffffffLL || slots_of(p) + p->T / FQLA_FWD_CHUNK + 1 > 0x7fffffffLL)
        return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED,
                         "N * HV = %lld or T = %lld is beyond the CUDA forward's grid", (long long)(p->N * p->HV),
                         (long long)p->T);
    if (p->io_dtype == FQLA_DTYPE_F32) { /* the recurrent kernel: every K checked above */
        if (fqla_fwd_recurrent_ctas(p->N, p->HV, p->K, p->V, p->varlen) > 0x7fffffffLL)
            return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED,
                             "N * HV * V = %lld * %lld * %lld is beyond the CUDA fp32 forward's grid", (long long)p->N,
                             (long long)p->HV, (long long)p->V);
        return FQLA_STATUS_SUCCESS;
    }
    /* the chunked kernels: the prepare kernel's grid has a row per q/k head
     * (gridDim.y), its shared memory a gate row per value head of the
     * group (256 fit at every K), and its zeroing of o's rows past cu[N]
     * counts 64 rows x HV x V / 8 vectors in 32 bits */
    if (p->H > 65535)
        return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED, "H = %lld q/k heads is beyond the CUDA forward's grid (65535)",
                         (long long)p->H);
    if (p->group > 256)
        return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED,
                         "HV / H = %lld value heads per q/k head is beyond the CUDA forward's shared memory (256)",
                         (long long)p->group);
    if (p->HV * p->V > (1LL << 27))
        return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED, "HV * V = %lld is beyond the CUDA forward (2^27)",
                         (long long)(p->HV * p->V));
    int bv = pick_bv(ctx, p);
    if (!fqla_fwd_chunk_has((int)p->K, bv))
        return fqla_fail(ctx, FQLA_STATUS_INTERNAL_ERROR, "CUDA forward: no chunk kernel for K = %lld, BV = %d",
                         (long long)p->K, bv);
    return FQLA_STATUS_SUCCESS;
}

fqla_status fqla_cuda_fwd_workspace(fqla_context *ctx, const fqla_problem *p, const fqla_fwd_args *a, size_t *bytes)
{
    *bytes = 0;
    fqla_status st = fqla_cuda_fwd_supported(ctx, p, a);
    if (st != FQLA_STATUS_SUCCESS) return st;
    fqla_problem pp;
    uniform_as_padded(p, &pp);
    p = &pp;
    int64_t seg_chunks = 0;
    *bytes = ws_layout(ctx, p, &seg_chunks).total;
    return FQLA_STATUS_SUCCESS;
}

fqla_status fqla_cuda_fwd_run(fqla_context *ctx, const fqla_problem *p, const fqla_fwd_args *a,
                              void *workspace, size_t workspace_bytes, cudaStream_t stream)
{
    fqla_status st = fqla_cuda_fwd_supported(ctx, p, a);
    if (st != FQLA_STATUS_SUCCESS) return st;
    fqla_problem pp;
    const int64_t uniform = uniform_as_padded(p, &pp);
    p = &pp;
    const int64_t slots = slots_of(p);
    int64_t seg_chunks = 0;
    const fqla_fwd_ws_layout L = ws_layout(ctx, p, &seg_chunks);
    if (workspace_bytes < L.total || (L.total > 0 && !workspace))
        return fqla_fail(ctx, FQLA_STATUS_WORKSPACE_TOO_SMALL, "workspace: %zu bytes given, %zu bytes needed",
                         workspace_bytes, L.total);
    if (p->N == 0 || p->HV == 0) return FQLA_STATUS_SUCCESS;

    fqla_fwd_params k;
    memset(&k, 0, sizeof k);
    k.q = a->q.data; k.k = a->k.data; k.v = a->v.data; k.o = a->o.data;
    k.q_sb = a->q.strides[0]; k.q_st = a->q.strides[1]; k.q_sh = a->q.strides[2];
    k.k_sb = a->k.strides[0]; k.k_st = a->k.strides[1]; k.k_sh = a->k.strides[2];
    k.v_sb = a->v.strides[0]; k.v_st = a->v.strides[1]; k.v_sh = a->v.strides[2];
    k.o_sb = a->o.strides[0]; k.o_st = a->o.strides[1]; k.o_sh = a->o.strides[2];
    k.g = a->g.data; k.beta = a->beta.data;
    k.g_sb = a->g.strides[0]; k.g_st = a->g.strides[1]; k.g_sh = a->g.strides[2];
    k.b_sb = a->beta.strides[0]; k.b_st = a->beta.strides[1]; k.b_sh = a->beta.strides[2];
    if (uniform) { /* the padded view [N][L] of the packed tokens */
        k.q_sb = uniform * k.q_st; k.k_sb = uniform * k.k_st; k.v_sb = uniform * k.v_st;
        k.o_sb = uniform * k.o_st; k.g_sb = uniform * k.g_st; k.b_sb = uniform * k.b_st;
    }
    k.g_bf16 = a->g.dtype == FQLA_DTYPE_BF16;
    k.beta_bf16 = a->beta.dtype == FQLA_DTYPE_BF16;
    if (p->opt.use_gate_in_kernel) {
        k.A_log = (const float *)a->A_log.data;
        k.dt_bias = (const float *)a->dt_bias.data;
        k.alog_s = a->A_log.strides[0];
        k.dtb_s = a->dt_bias.strides[0];
    }
    if (a->initial_state.data) {
        k.h0 = a->initial_state.data;
        k.h0_bf16 = a->initial_state.dtype == FQLA_DTYPE_BF16;
        k.h0_sn = a->initial_state.strides[0];
        k.h0_sh = a->initial_state.strides[1];
        k.h0_s2 = a->initial_state.strides[2];
    }
    if (a->final_state.data) {
        k.ht = a->final_state.data;
        k.ht_bf16 = a->final_state.dtype == FQLA_DTYPE_BF16;
        k.ht_sn = a->final_state.strides[0];
        k.ht_sh = a->final_state.strides[1];
        k.ht_s2 = a->final_state.strides[2];
    }
    k.v_first = p->opt.state_v_first;
    k.ht_v_first = p->opt.state_v_first;
    k.varlen = p->varlen;
    if (p->varlen) {
        k.cu = a->cu_seqlens.data;
        k.cu64 = a->cu_seqlens.dtype == FQLA_DTYPE_I64;
    }
    k.T = p->T;
    k.N = p->N;
    k.slots = slots;
    k.cps = (p->T + FQLA_FWD_CHUNK - 1) / FQLA_FWD_CHUNK;
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
    if (p->io_dtype == FQLA_DTYPE_F32) {
        g_last_route = 4;
        const int sms = ctx->info.sm_count > 0 ? ctx->info.sm_count : 132;
        return fqla_cuda_check(ctx, fqla_fwd_launch_recurrent(k, sms, stream), "CUDA forward: fp32 recurrent kernel launch");
    }
    unsigned char *ws = (unsigned char *)workspace;
    k.gam = (float *)(ws + L.gam);
    k.rq = p->opt.use_qk_l2norm ? (float *)(ws + L.rq) : NULL;
    k.rk = p->opt.use_qk_l2norm ? (float *)(ws + L.rk) : NULL;
    k.Ag = ws + L.Ag;
    k.Pg = ws + L.Pg;
    if (seg_chunks > 0 && g_tune_cp_skip) k.chunk_ok = (int *)(ws + L.chunk_ok);

    k.pdl = g_tune_pdl != 0;

    const int io_bf16 = p->io_dtype == FQLA_DTYPE_BF16;
    /* CP (it launches its own prepare kernel) */
    if (seg_chunks > 0 && g_tune_wg != 0 && fqla_fwd_wg_usable(k))
        return run_cp(ctx, p, k, ws, L, seg_chunks, io_bf16, stream);
    const int fused_nwg = g_tune_wg == 2 ? (g_tune_nwg == 1 || g_tune_nwg == 2 ? g_tune_nwg : pick_nwg(ctx, p, p->N))
                          : g_tune_wg == -1 ? pick_fused(ctx, p)
                                            : 0;
    if (fused_nwg && seg_chunks == 0 && fqla_fwd_fused_usable(k, fused_nwg)) {
        /* the prepare kernel without Q (gamma, Ag), then the kernel that
         * forms Pg beside the chain; nothing launched if its maps cannot be
         * encoded (then the two kernels run) */
        int used = 0;
        k.fused_split = fused_nwg == 2 ? split_last_wave(ctx, p) : 0;
        cudaError_t err = fqla_fwd_launch_fused(k, io_bf16, g_tune_hb, fused_nwg, FQLA_FUSED_PREPARE | FQLA_FUSED_CHAIN,
                                                stream, &used);
        if (used || err != cudaSuccess) {
            g_last_route = 1;
            return fqla_cuda_check(ctx, err, "CUDA forward: fused path launch");
        }
    }
    st = fqla_cuda_check(ctx, fqla_fwd_launch_prepare(k, io_bf16, g_tune_hb, NULL, NULL, stream),
                         "CUDA forward: prepare kernel launch");
    if (st != FQLA_STATUS_SUCCESS) return st;
    if (g_tune_wg != 0 && fqla_fwd_wg_usable(k)) {
        int used = 0;
        cudaError_t err = fqla_fwd_launch_chunk_wg(k, io_bf16, pick_nwg(ctx, p, p->N), stream, &used);
        if (used || err != cudaSuccess) {
            g_last_route = 2;
            return fqla_cuda_check(ctx, err, "CUDA forward: wgmma chunk kernel launch");
        }
    }
    g_last_route = 3;
    return fqla_cuda_check(ctx, fqla_fwd_launch_chunk(k, io_bf16, pick_bv(ctx, p), g_tune_late, stream),
                           "CUDA forward: chunk kernel launch");
}
