/*
 * bwd.cu - the CUDA backward's entry points (declared in cuda_backend.h):
 * what the kernels cover, the exact workspace, and the four launches (six
 * with the chains' CP; the gradient kernel's are two for bf16 with tails)
 * on the caller's stream (bwd_common.cuh says what each computes; with only
 * d_initial_state asked for, prepare and the reverse chain alone), and two
 * memsets before them where the gradient kernel runs beside the chains.
 * Nothing here allocates, synchronises or reads device memory on the host,
 * so a call can be captured in a CUDA graph; the workspace is a function of
 * the shapes and of cu_seqlens_host where given (the chains' CP plan and
 * order).
 *
 * Covered: q/k/v bf16 or fp16; K in {64, 128}; V a multiple of 32; g, beta
 * f32 or bf16; h0 f32 or bf16, d_final_state / d_initial_state f32, either
 * layout; varlen (device cu_seqlens) and padded batches; GVA; the in-kernel
 * l2norm, gate and beta sigmoid. Everything else returns NOT_SUPPORTED
 * naming what is not covered (the CPU backends cover it).
 */
#include "cuda/bwd_common.cuh"
#include "cuda/cuda_backend.h"
#ifdef FQLA_DEV
#include "dev/dev_hooks.h" /* the developer build's CP override */
#include "dev/bwd_fused_rev.cuh"
#endif

#include <string.h>

namespace {

int64_t slots_of(const fqla_problem *p)
{
    fqla_fwd_shape s;
    memset(&s, 0, sizeof s);
    s.N = p->N;
    s.T = p->T;
    s.varlen = p->varlen;
    return fqla_route_slots(&s);
}

/* The chains' CP segment length (cp_plan.h), 0: none. For packed varlen
 * input the plan counts the sequences' lengths from cu_seqlens_host when
 * given (so the workspace, as the forward's, follows its values), else T
 * bounds the longest. */
int64_t seg_chunks_of(const fqla_context *ctx, const fqla_problem *p)
{
    const int64_t chains = p->dh0_only ? 1 : 2;
    const int64_t L = p->varlen && p->cu_host
                          ? fqla_cp_bwd_seg_chunks_cu(p->cu_host, p->N, p->HV, p->K, p->V, chains, ctx->info.sm_count)
                          : fqla_cp_bwd_seg_chunks(p->N, p->T, p->HV, p->K, p->V, chains, ctx->info.sm_count);
#ifdef FQLA_DEV
    return fqla_dev_bwd_seg_chunks(p, L);
#else
    return L;
#endif
}

/* Whether the chains take the sequences longest first (order_of): packed
 * sequences of unequal lengths, known on the host, not too many, run as
 * whole sequences (L = 0: no CP). */
bool ordered(const fqla_problem *p, int64_t L)
{
    return L == 0 && p->varlen && p->cu_host && p->N >= 2 && p->N <= FQLA_BWD_ORDER_MAX &&
           fqla_cp_uniform_len(p->cu_host, p->N, p->T) <= 0;
}

/* Whether the gradient kernel runs beside the chains (fqla_bwd_params.
 * chain_done): where they take the sequences longest first, the short ones
 * finish early and leave SMs idle while the long ones walk. */
bool overlapped(const fqla_problem *p, int64_t L)
{
    return ordered(p, L) && !p->dh0_only && p->io_dtype == FQLA_DTYPE_BF16; /* bf16: bwd_grads.cu's instances */
}

/* The workspace of problem p with the chains' segment length L (seg_chunks_of). */
fqla_bwd_ws_layout layout_of(const fqla_problem *p, int64_t L)
{
    return fqla_bwd_ws(slots_of(p), p->H, p->HV, p->K, p->V, p->opt.use_qk_l2norm, p->opt.use_gate_in_kernel,
                       L ? fqla_cp_segs(p->varlen, p->T, p->N, L) : 0, p->dh0_only, overlapped(p, L) ? p->N : 0);
}

/* The chains' longest-first order of the sequences (fqla_bwd_params.
 * seq_order), from the host cu_seqlens: only where it changes something
 * (varlen sequences of unequal lengths, whole-sequence chains) and fits
 * the parameters; else n_order = 0, index order. Stable: equal lengths
 * keep their index order. Only the launch order changes, never what a CTA
 * computes, so the gradients are the same either way. */
void order_of(const fqla_problem *p, int64_t L, fqla_bwd_params &b)
{
    b.n_order = 0;
    if (!ordered(p, L)) return;
    const int64_t *cu = p->cu_host;
    const int n = (int)p->N;
    for (int i = 0; i < n; i++) { /* insertion sort, longest first */
        const int64_t len = cu[i + 1] - cu[i];
        int j = i;
        for (; j > 0 && cu[b.seq_order[j - 1] + 1] - cu[b.seq_order[j - 1]] < len; j--) b.seq_order[j] = b.seq_order[j - 1];
        b.seq_order[j] = (uint16_t)i;
    }
    b.n_order = n;
    /* the gradient kernel's order, shortest first: its chunk slots' prefix sums */
    b.done_cum[0] = 0;
    for (int r = 0; r < n; r++) {
        const int i = b.seq_order[n - 1 - r];
        b.done_cum[r + 1] = b.done_cum[r] + (int32_t)((cu[i + 1] - cu[i] + FQLA_BWD_C - 1) / FQLA_BWD_C);
    }
}

/* A chain's CTAs a (sequence or segment, value head) at nwg 64-column
 * slices a CTA (a last slice may be half full). */
int64_t chain_ctas_of(int64_t V, int nwg)
{
    return ((V + FQLA_BWD_VS - 1) / FQLA_BWD_VS + nwg - 1) / nwg;
}

/* A whole-sequence chain step of a CTA of two warpgroups, in steps of a CTA
 * of one: the two share the SM's tensor cores and the CTA's barriers. 1.27
 * measured on long walks (H100, docs/history/2026-12-07-bwdnwg.md; the
 * forward's chunk kernel, whose chain warpgroups run the same kind of RS
 * wgmma chain, 1.42). */
#define FQLA_BWD_NWG2_STEP 1.27

/* Chain warpgroups a CTA of the whole-sequence chains (fqla_bwd_params.
 * chain_nwg; with CP, 2: cp_plan.h prices that shape). One a CTA takes a
 * chunk step faster, two fill the SMs with half the CTAs and 0.64x the SM
 * time (one CTA an SM either way: shared memory). Priced in those steps:
 * taken longest first (bp.n_order), the longer of the longest sequence's
 * walk and all the chains' work spread over the SMs (the gradient kernel
 * that runs beside them starts on a sequence as soon as its chains are
 * done, so the longest walk's end matters more than the chains' last CTA:
 * on the ten bench rows of this kind this picks the faster shape on each,
 * bench/results/bwd-nwg-sweep-h100-2026-12-07.csv); else the waves of CTAs
 * (of the one launch of both chains, or of the two launches bwd_chain.cu's
 * launch_nwg makes for equal lengths where that costs no wave). Ties take
 * two. */
int chain_nwg_of(const fqla_problem *p, int64_t L, const fqla_bwd_params &b)
{
    if (L) return 2;
    const int64_t chains = p->dh0_only ? 1 : 2, sms = b.sms > 0 ? b.sms : 1;
    /* longest first: every sequence's chunks, and the longest one's */
    const int64_t all = b.n_order > 0 ? b.done_cum[b.n_order] : 0;
    const int64_t longest = b.n_order > 0 ? all - b.done_cum[b.n_order - 1] : 0;
    double best = 0.0;
    int pick = 2;
    for (int nwg = 2; nwg >= 1; nwg--) {
        const int64_t per = chain_ctas_of(p->V, nwg);
        const double step = nwg == 2 ? FQLA_BWD_NWG2_STEP : 1.0;
        double cost;
        if (b.n_order > 0) {
            const double spread = (double)(chains * p->HV * per * all) * step / (double)sms;
            cost = spread > (double)longest * step ? spread : (double)longest * step;
        } else {
            const int64_t n = p->N * p->HV * per;
            int64_t w = fqla_cp_waves(chains * n, sms);
            if (chains == 2 && b.uniform && 2 * fqla_cp_waves(n, sms) < w) w = 2 * fqla_cp_waves(n, sms);
            cost = (double)w * step;
        }
        if (nwg == 2 || cost < best) {
            best = cost;
            pick = nwg;
        }
    }
    return pick;
}

/* 1 where the host cu_seqlens shows that the gradient kernel's tails launch
 * (bwd_grads.cu) has no chunk: every sequence empty, or of whole chunks and
 * not short. */
int no_tails_of(const fqla_problem *p)
{
    if (!p->varlen || !p->cu_host) return 0;
    for (int64_t i = 0; i < p->N; i++) {
        const int64_t len = p->cu_host[i + 1] - p->cu_host[i];
        if (len > 0 && (len % FQLA_BWD_C != 0 || bwd_seq_short(len))) return 0;
    }
    return 1;
}

} // namespace

fqla_status fqla_cuda_bwd_supported(fqla_context *ctx, const fqla_problem *p, const fqla_bwd_args *a)
{
    (void)a;
    if (p->io_dtype != FQLA_DTYPE_BF16 && p->io_dtype != FQLA_DTYPE_F16)
        return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED,
                         "backward: q/k/v dtype %s: the CUDA backward covers BF16 and F16 (use FQLA_BACKEND_CPU)",
                         fqla_dtype_string(p->io_dtype));
    if (p->K != 64 && p->K != 128)
        return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED,
                         "backward: K = %lld: the CUDA backward covers K = 64 and 128 (use FQLA_BACKEND_CPU)",
                         (long long)p->K);
    /* the chains and the gradient kernel run V in slices of 64, a last one half full */
    if (p->V % (FQLA_BWD_VS / 2) != 0)
        return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED,
                         "backward: V = %lld: the CUDA backward needs V a multiple of %d (use FQLA_BACKEND_CPU)",
                         (long long)p->V, FQLA_BWD_VS / 2);
    return FQLA_STATUS_SUCCESS;
}

fqla_status fqla_cuda_bwd_workspace(fqla_context *ctx, const fqla_problem *p, const fqla_bwd_args *a, size_t *bytes)
{
    fqla_status st = fqla_cuda_bwd_supported(ctx, p, a);
    if (st != FQLA_STATUS_SUCCESS) return st;
    *bytes = layout_of(p, seg_chunks_of(ctx, p)).total;
    return FQLA_STATUS_SUCCESS;
}

fqla_status fqla_cuda_bwd_run(fqla_context *ctx, const fqla_problem *p, const fqla_bwd_args *a, void *workspace,
                              size_t workspace_bytes, cudaStream_t stream)
{
    fqla_status st = fqla_cuda_bwd_supported(ctx, p, a);
    if (st != FQLA_STATUS_SUCCESS) return st;
    const int64_t seg_chunks = seg_chunks_of(ctx, p);
    const fqla_bwd_ws_layout L = layout_of(p, seg_chunks);
    if (workspace_bytes < L.total || (L.total > 0 && !workspace))
        return fqla_fail(ctx, FQLA_STATUS_WORKSPACE_TOO_SMALL, "workspace: %zu bytes given, %zu bytes needed",
                         workspace_bytes, L.total);
    if (p->N == 0 || p->HV == 0) return FQLA_STATUS_SUCCESS;

    fqla_bwd_params b;
    memset(&b, 0, sizeof b);
    fqla_fwd_params &k = b.f;
    fqla_fwd_params_inputs(k, p, a->q, a->k, a->v, a->g, a->beta, a->A_log, a->dt_bias, a->initial_state);
    k.varlen = p->varlen;
    if (p->varlen) {
        k.cu = a->cu_seqlens.data;
        k.cu64 = a->cu_seqlens.dtype == FQLA_DTYPE_I64;
    }
    k.T = p->T;
    k.N = p->N;
    k.slots = slots_of(p);
    k.cps = (p->T + FQLA_BWD_C - 1) / FQLA_BWD_C;
    k.seg_chunks = seg_chunks;
    k.cp_mode = k.seg_chunks > 0;

    b.d_o = a->d_o.data;
    b.do_sb = a->d_o.strides[0]; b.do_st = a->d_o.strides[1]; b.do_sh = a->d_o.strides[2];
    if (a->d_final_state.data) {
        b.dht = (const float *)a->d_final_state.data;
        b.dht_sn = a->d_final_state.strides[0];
        b.dht_sh = a->d_final_state.strides[1];
        b.dht_s2 = a->d_final_state.strides[2];
    }
    b.dq = a->dq.data; b.dk = a->dk.data; b.dv = a->dv.data;
    b.dq_sb = a->dq.strides[0]; b.dq_st = a->dq.strides[1]; b.dq_sh = a->dq.strides[2];
    b.dk_sb = a->dk.strides[0]; b.dk_st = a->dk.strides[1]; b.dk_sh = a->dk.strides[2];
    b.dv_sb = a->dv.strides[0]; b.dv_st = a->dv.strides[1]; b.dv_sh = a->dv.strides[2];
    b.dg = (float *)a->dg.data;
    b.dbeta = (float *)a->dbeta.data;
    b.dg_sb = a->dg.strides[0]; b.dg_st = a->dg.strides[1]; b.dg_sh = a->dg.strides[2];
    b.db_sb = a->dbeta.strides[0]; b.db_st = a->dbeta.strides[1]; b.db_sh = a->dbeta.strides[2];
    if (a->d_initial_state.data) {
        b.dh0 = (float *)a->d_initial_state.data;
        b.dh0_sn = a->d_initial_state.strides[0];
        b.dh0_sh = a->d_initial_state.strides[1];
        b.dh0_s2 = a->d_initial_state.strides[2];
    }
    if (p->opt.use_gate_in_kernel) {
        b.dA_log = (float *)a->dA_log.data;
        b.ddt_bias = (float *)a->ddt_bias.data;
        b.dalog_s = a->dA_log.strides[0];
        b.ddtb_s = a->ddt_bias.strides[0];
    }
    unsigned char *ws = (unsigned char *)workspace;
    k.gam = (float *)(ws + L.gam);
    b.bet = (float *)(ws + L.bet);
    k.rq = p->opt.use_qk_l2norm ? (float *)(ws + L.rq) : NULL;
    k.rk = p->opt.use_qk_l2norm ? (float *)(ws + L.rk) : NULL;
    b.Tt = (float *)(ws + L.Tt);
    b.Pt = (float *)(ws + L.Pt);
    b.S = p->dh0_only ? NULL : (float *)(ws + L.S);
    b.dS = (float *)(ws + L.dS);
    b.sms = ctx->info.sm_count;
    b.uniform = !p->varlen || (p->cu_host && fqla_cp_uniform_len(p->cu_host, p->N, p->T) > 0);
    order_of(p, seg_chunks, b);
#ifdef FQLA_DEV
    b.chain_nwg = fqla_dev_bwd_chain_nwg(p, chain_nwg_of(p, seg_chunks, b));
#else
    b.chain_nwg = chain_nwg_of(p, seg_chunks, b);
#endif
    b.no_tails = no_tails_of(p);
    b.gate_part = p->opt.use_gate_in_kernel && !p->dh0_only ? (float *)(ws + L.gate_part) : NULL;
    if (k.cp_mode) { /* both chains' pre-passes run in one launch: each its own [H | M];
                        the negligible-transition shortcut (bwd_chain_cp.cu) */
        b.cp_hm[1] = (float *)(ws + L.cp_hm[1]);
        b.cp_hm[0] = p->dh0_only ? NULL : (float *)(ws + L.cp_hm[0]);
        k.cp_skip = 1;
        k.chunk_ok = (int *)(ws + L.chunk_ok);
        k.seg_flag = (int *)(ws + L.seg_flag);
    }

    if (overlapped(p, seg_chunks)) {
        /* the chains count their CTAs per (sequence, value head) from zero; a
         * gradient CTA whose chunk has no sequence does nothing in this mode,
         * so the gate parts of those slots are zeros from here */
        b.chain_done = (int *)(ws + L.chain_done);
        b.n_chain_ctas = 2 * (int)chain_ctas_of(p->V, b.chain_nwg);
        st = fqla_cuda_check(ctx, cudaMemsetAsync(b.chain_done, 0, (size_t)p->N * p->HV * sizeof(int), stream),
                             "CUDA backward: zeroing the chains' counts");
        if (st == FQLA_STATUS_SUCCESS && b.gate_part)
            st = fqla_cuda_check(ctx, cudaMemsetAsync(b.gate_part, 0, (size_t)k.slots * p->HV * 2 * sizeof(float), stream),
                                 "CUDA backward: zeroing the gate parts");
        if (st != FQLA_STATUS_SUCCESS) return st;
    }

    const int io_bf16 = p->io_dtype == FQLA_DTYPE_BF16;
    /* dh0 alone (p->dh0_only) runs only prepare and the reverse chain: the
     * reverse chain reads prepare's gam, bet, rq / rk, T~, P~ and chunk_ok,
     * and its own pre-pass's cp_hm and seg_flag, never a state of the
     * forward chain, and dh0 is written by the reverse chain itself (the
     * chains' launches leave the state chain out where b.S is NULL) */
    static const struct {
        cudaError_t (*launch)(const fqla_bwd_params &, int, cudaStream_t);
        const char *what;
        int cp;   /* 1: only with CP, 0: always */
        int full; /* 1: not for dh0 alone */
    } steps[] = {
        {fqla_bwd_launch_prepare, "CUDA backward: prepare kernel launch", 0, 0},
        {fqla_bwd_launch_chains_prepass, "CUDA backward: chains' CP pre-pass launch", 1, 0},
        {fqla_bwd_launch_chains_scan, "CUDA backward: chains' CP scan launch", 1, 0},
        {fqla_bwd_launch_chains, "CUDA backward: chains launch", 0, 0},
        {fqla_bwd_launch_grads, "CUDA backward: gradient kernel launch", 0, 1},
        {fqla_bwd_launch_finish, "CUDA backward: finishing kernel launch", 0, 1},
    };
#ifdef FQLA_DEV
    /* the fused reverse pass under construction in place of the reverse chain */
    const int fused_rev_mode = fqla_dev_bwd_fused_rev(p);
    const bool fused_rev = fused_rev_mode && fqla_dev_bwd_fused_rev_covers(b, io_bf16, fused_rev_mode);
    fqla_dev_bwd_fused_rev_used(fused_rev);
    b.fused_grads = fused_rev && fqla_dev_bwd_fused_rev_grads(fused_rev_mode);
#endif
    for (const auto &s : steps) {
        if (s.cp && !k.cp_mode) continue;
#ifdef FQLA_DEV
        if (fused_rev && s.launch == fqla_bwd_launch_chains) { /* the state chain, then the pass */
            if (b.S)
                st = fqla_cuda_check(ctx, fqla_bwd_launch_chain_states(b, io_bf16, stream),
                                     "CUDA backward: state chain launch");
            if (st == FQLA_STATUS_SUCCESS)
                st = fqla_cuda_check(ctx, fqla_dev_bwd_launch_fused_rev(b, fused_rev_mode, stream),
                                     "CUDA backward: fused reverse pass launch");
            if (st != FQLA_STATUS_SUCCESS) return st;
            continue;
        }
#endif
        if (s.full && p->dh0_only) continue;
        /* no chunk slots (T = 0 in a padded batch): only the reverse chain, which
         * gives every (empty) sequence dh0 = d_final_state, and the finish
         * (dA_log = ddt_bias = 0) have work (the state chain's CTAs, with
         * no chunk, store nothing) */
        if (k.slots == 0 && s.launch != fqla_bwd_launch_chains && s.launch != fqla_bwd_launch_finish) continue;
        st = fqla_cuda_check(ctx, s.launch(b, io_bf16, stream), s.what);
        if (st != FQLA_STATUS_SUCCESS) return st;
    }
    return FQLA_STATUS_SUCCESS;
}
