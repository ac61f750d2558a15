/*
 * fwd.cu - the CUDA forward's entry points (declared in cuda_backend.h):
 * what the kernels cover, the exact workspace, and the launches on the
 * caller's stream. Which kernels run is the route planner's decision
 * (route_plan.h, a pure function of the device's SM count and the problem,
 * so the workspace size is one too):
 * - fused: the prepare kernel without Q (fwd_prepare.cu: gamma, Ag, and rk
 *   with the in-kernel l2norm), then the kernel that forms Pg beside the
 *   chain (fwd_fused.cu), with one or two chain warpgroups per CTA;
 * - the two-kernel paths: the prepare kernel with Q (also Pg), then the
 *   chunk kernel: fwd_chunk_wg.cu on TMA + wgmma where K is 64 or 128, V a
 *   multiple of 64 and the rows 16-byte aligned, else fwd_chunk.cu on
 *   mma.sync;
 * - context parallelism where sequences x heads leave SMs idle: a
 *   state-only pre-pass over segments of the sequences, the scan of
 *   fwd_cp.cu, and a main pass over the segments (on the fused kernel where
 *   it covers the call);
 * - fp32 q/k/v where K is 64 or 128, V a multiple of 32, the rows 16-byte
 *   aligned and a sequence longer than 8 tokens: the backward's prepare
 *   kernel and state chain in their fp32 forms (the chain route: products on
 *   wgmma with split bf16 operands, o stored by the chain; run_chain_f32),
 *   with CP where its plan says, or where the chain route's grids cannot
 *   take the call the chunked fp32 kernel (fwd_chunk_f32.cu: one kernel, no
 *   workspace, bf16x3 products on mma.sync); else the
 *   recurrence token by token in fp32 (fwd_recurrent.cu).
 * Nothing here allocates, synchronises or reads device memory on the host
 * (the TMA maps are encoded on the host and passed as kernel parameters),
 * so a call can be captured in a CUDA graph.
 *
 * Covered: q/k/v/o bf16, fp16 or fp32; K in {64, 128, 256}; V a multiple of
 * 32; g, beta f32 or bf16; initial / final state f32 or bf16, either layout;
 * varlen (int32 / int64 cu_seqlens, read on the device) and padded batches;
 * GVA; the in-kernel l2norm, gate and beta sigmoid. fp64 q/k/v return
 * NOT_SUPPORTED.
 */
#include "cuda/bwd_common.cuh" /* the fp32 chain route runs the backward's prepare kernel and state chain */
#include "cuda/cuda_backend.h"
#include "cuda/fwd_common.cuh"
#include "cuda/route_plan.h"
#ifdef FQLA_DEV
#include "dev/dev_hooks.h" /* the developer build's route override */
#endif

#include <stdint.h>
#include <string.h>

namespace {

const char *dname(fqla_dtype d) { return fqla_dtype_string(d); }

/* A 4-d tensor's base and its three outer strides (elements) 16-byte
 * aligned: every row starts on 16 bytes (the last dim is contiguous). */
bool rows16(const fqla_tensor &t)
{
    const int64_t e = (int64_t)fqla_dtype_size(t.dtype);
    return ((uintptr_t)t.data & 15) == 0 && (t.strides[0] * e) % 16 == 0 && (t.strides[1] * e) % 16 == 0 &&
           (t.strides[2] * e) % 16 == 0;
}

/* What the route planner is told of the call (route_plan.h). */
fqla_fwd_shape shape_of(const fqla_problem *p, const fqla_fwd_args *a)
{
    fqla_fwd_shape s;
    memset(&s, 0, sizeof s);
    s.N = p->N;
    s.T = p->T;
    s.H = p->H;
    s.HV = p->HV;
    s.K = p->K;
    s.V = p->V;
    s.varlen = p->varlen;
    s.cu_host = p->varlen ? p->cu_host : NULL;
    s.io_f32 = p->io_dtype == FQLA_DTYPE_F32;
    s.f32_rows16 = rows16(a->q) && rows16(a->k) && rows16(a->v);
    s.l2norm = p->opt.use_qk_l2norm;
    /* o absent (the final state alone): nothing is stored to it, and the
     * planner sees v's layout, which has o's shape */
    const fqla_tensor &o = a->o.data ? a->o : a->v;
    s.o_base16 = ((uintptr_t)o.data & 15) == 0;
    s.o_sb = o.strides[0];
    s.o_st = o.strides[1];
    s.o_sh = o.strides[2];
    return s;
}

/* The route of the call, and in *ps the shape its kernels run (the padded
 * view of packed sequences of one length). run: 0 for the workspace query,
 * 1 for the run (with its workspace). */
fqla_fwd_route plan(const fqla_context *ctx, const fqla_problem *p, const fqla_fwd_args *a, fqla_fwd_shape *ps,
                    int run, const void *workspace)
{
    fqla_route_device d;
    d.sm_count = ctx->info.sm_count;
    d.cc_major = ctx->info.cc_major;
    d.cc_minor = ctx->info.cc_minor;
    fqla_fwd_shape s = shape_of(p, a);
    s.tma_encoder = !s.io_f32 && fqla_fwd_tma_encoder();
    fqla_fwd_route r;
    fqla_fwd_plan(&d, &s, &r, ps);
#ifdef FQLA_DEV
    fqla_dev_fwd_route(&d, ps, &r, run, workspace);
#else
    (void)run;
    (void)workspace;
#endif
    return r;
}

} // namespace

/* The workspace of route r over shape s: none for the fp32 recurrence, CP's
 * segment states and flags alone for the chunked fp32 kernel (it needs no
 * prepare kernel), else the prepare kernel's outputs and CP's. */
fqla_fwd_ws_layout fqla_fwd_route_ws(const fqla_fwd_shape *s, const fqla_fwd_route *r)
{
    const int64_t L = r->seg_chunks;
    if (r->path == FQLA_FWD_RECURRENT || (r->path == FQLA_FWD_CHUNK_F32 && L == 0)) {
        fqla_fwd_ws_layout none;
        memset(&none, 0, sizeof none);
        return none;
    }
    if (r->path == FQLA_FWD_CHUNK_F32) return fqla_fwd_ws(0, 0, s->HV, 0, 4, fqla_route_segs(s, L), s->K, s->V);
    if (r->path == FQLA_FWD_CHAIN_F32)
        return fqla_fwd_chain_f32_ws(fqla_route_slots(s), s->H, s->HV, s->K, s->V, L > 0 ? fqla_route_segs(s, L) : 0);
    return fqla_fwd_ws(fqla_route_slots(s), s->H, s->HV, s->l2norm, 2, L > 0 ? fqla_route_segs(s, L) : 0, s->K,
                       s->V);
}

/* CP's segments and their workspace into k (route r over shape s), and the
 * parameters of its two passes over them: the pre-pass (cp_mode 1: no h0,
 * H | M of every segment into seg_hm) and the main pass (cp_mode 2: the
 * start states from seg_s0; the final state keeps the caller's layout).
 * The caller sets k's cp_skip and pdl first. */
static void cp_passes(const fqla_fwd_shape *s, const fqla_fwd_route *r, unsigned char *ws, const fqla_fwd_ws_layout &L,
                      fqla_fwd_params &k, fqla_fwd_params &pre, fqla_fwd_params &mp)
{
    k.seg_chunks = r->seg_chunks;
    k.segs = fqla_route_segs(s, r->seg_chunks);
    k.seg_hm = (float *)(ws + L.seg_hm);
    k.seg_s0 = (float *)(ws + L.seg_s0);
    k.seg_flag = (int *)(ws + L.seg_flag);
    const int64_t VX = s->V + s->K;
    pre = k;
    pre.cp_mode = 1;
    pre.h0 = NULL;
    pre.ht = k.seg_hm;
    pre.ht_bf16 = 0;
    pre.ht_sn = s->HV * s->K * VX;
    pre.ht_sh = s->K * VX;
    pre.ht_s2 = VX;
    pre.v_first = 0;
    pre.ht_v_first = 0;
    mp = k;
    mp.cp_mode = 2;
    mp.h0 = k.seg_s0;
    mp.h0_bf16 = 0;
    mp.h0_sn = s->HV * s->K * s->V;
    mp.h0_sh = s->K * s->V;
    mp.h0_s2 = s->V;
    mp.v_first = 0;
}

/* CP on the chunked fp32 kernel (route_plan.h fqla_route_f32_cp): its
 * state-only pre-pass over every segment but each sequence's last, H | M
 * into seg_hm (with the shortcut, cp_skip: a negligible M flagged instead,
 * and H from where the segment's decay leaves earlier chunks negligible);
 * the scan (fwd_cp.cu, 3xTF32: ~fp32) of the start states into seg_s0; the
 * main pass over every segment from its start state, o and (from each
 * sequence's last segment) the final state. Without o, the main pass runs
 * the last segments alone. */
static fqla_status run_cp_f32(fqla_context *ctx, const fqla_fwd_shape *s, const fqla_fwd_route *r,
                              fqla_fwd_params k, unsigned char *ws, const fqla_fwd_ws_layout &L, cudaStream_t stream)
{
    k.cp_skip = r->cp_skip;
    k.pdl = 0;
    fqla_fwd_params pre, mp;
    cp_passes(s, r, ws, L, k, pre, mp);
    fqla_status st = fqla_cuda_check(ctx, fqla_fwd_launch_chunk_f32(pre, r->pre_bv, stream),
                                     "CUDA forward: fp32 CP pre-pass launch");
    if (st != FQLA_STATUS_SUCCESS) return st;
    st = fqla_cuda_check(ctx, fqla_fwd_launch_cp_scan(k, r->scan_cb, (int)r->sms, stream),
                         "CUDA forward: fp32 CP scan launch");
    if (st != FQLA_STATUS_SUCCESS) return st;
    return fqla_cuda_check(ctx, fqla_fwd_launch_chunk_f32(mp, r->bv, stream), "CUDA forward: fp32 CP main pass launch");
}

/* fp32 q/k/v on the backward's kernels (route_plan.h FQLA_FWD_CHAIN_F32,
 * bwd_common.cuh): the prepare kernel in its fp32 form (gamma, beta, T~, P~
 * and the q / k planes into the workspace; with CP also chunk_ok), then the
 * state chain storing o and the final state, r->nwg 64-column slices a CTA.
 * With CP the chain runs three times as the chunked fp32 kernel's CP does
 * (cp_passes): the pre-pass of segments (H | M into seg_hm over the K
 * identity columns, the negligible-transition shortcut), fwd_cp.cu's scan
 * into seg_s0, the main pass from those states. */
static fqla_status run_chain_f32(fqla_context *ctx, const fqla_fwd_shape *s, const fqla_fwd_route *r,
                                 fqla_fwd_params k, unsigned char *ws, const fqla_fwd_ws_layout &L,
                                 cudaStream_t stream)
{
    k.gam = (float *)(ws + L.gam);
    k.rq = k.rk = NULL; /* the prepare kernel normalises the planes themselves */
    k.pdl = 0;
    fqla_fwd_params pre = k, mp = k;
    if (r->cp) {
        k.cp_skip = r->cp_skip;
        k.chunk_ok = (int *)(ws + L.chunk_ok);
        cp_passes(s, r, ws, L, k, pre, mp);
    }
    fqla_bwd_params b;
    memset(&b, 0, sizeof b);
    b.bet = (float *)(ws + L.bet);
    b.Tt = (float *)(ws + L.Tt);
    b.Pt = (float *)(ws + L.Pt);
    b.qkp = (uint16_t *)(ws + L.qkp);
    b.sms = r->sms;
    b.chain_nwg = r->nwg;
    b.f = k;
    fqla_status st = FQLA_STATUS_SUCCESS;
    if (k.slots > 0) /* no chunk at all (T = 0): the chain only writes the final states */
        st = fqla_cuda_check(ctx, fqla_fwd_launch_chain_f32_prepare(b, stream),
                             "CUDA forward: fp32 chain route's prepare kernel launch");
    if (st != FQLA_STATUS_SUCCESS) return st;
    if (!r->cp) return fqla_cuda_check(ctx, fqla_fwd_launch_chain_f32(b, stream), "CUDA forward: fp32 chain launch");
    b.f = pre;
    b.cp_hm[0] = k.seg_hm;
    st = fqla_cuda_check(ctx, fqla_fwd_launch_chain_f32(b, stream), "CUDA forward: fp32 chain CP pre-pass launch");
    if (st != FQLA_STATUS_SUCCESS) return st;
    st = fqla_cuda_check(ctx, fqla_fwd_launch_cp_scan(k, r->scan_cb, (int)r->sms, stream),
                         "CUDA forward: fp32 chain CP scan launch");
    if (st != FQLA_STATUS_SUCCESS) return st;
    b.f = mp;
    return fqla_cuda_check(ctx, fqla_fwd_launch_chain_f32(b, stream), "CUDA forward: fp32 chain CP main pass launch");
}

/* Context parallelism: the prepare kernel, then the pre-pass (the TMA
 * chunk kernel without output: H | M of every segment but each sequence's
 * last into seg_hm), the scan (start states into seg_s0; the final state of
 * empty sequences) and the main pass (o, the final state from each
 * sequence's last segment). The main pass is the kernel that forms Pg
 * beside the chain where the route says (then the prepare kernel runs
 * without Q), else the TMA chunk kernel. Falls back to the mma.sync kernel
 * over whole sequences if the TMA maps cannot be encoded. */
/* The final state alone's kernel could not take the call: its TMA maps did
 * not encode, which fqla_cuda_fwd_supported's shape checks rule out. */
static fqla_status state_only_maps_failed(fqla_context *ctx)
{
    return fqla_fail(ctx, FQLA_STATUS_INTERNAL_ERROR,
                     "CUDA forward: the final state alone's TMA maps of q, k, v failed to encode");
}

/* state_only: the final state alone (run_state_only): the main pass is the
 * state-only variant over each sequence's last segment. */
static fqla_status run_cp(fqla_context *ctx, const fqla_fwd_shape *s, const fqla_fwd_route *r, fqla_fwd_params k,
                          unsigned char *ws, const fqla_fwd_ws_layout &L, int io_bf16, int state_only,
                          cudaStream_t stream)
{
    k.pdl = r->pdl;
    k.cp_skip = k.chunk_ok != NULL;
    fqla_fwd_params pre, mp;
    cp_passes(s, r, ws, L, k, pre, mp);
    const int main_nwg = r->nwg;
    int fused = r->path == FQLA_FWD_FUSED;
    int used = 0;
    cudaError_t err = cudaSuccess;
    if (fused) {
        err = fqla_fwd_launch_fused(k, io_bf16, r->prep_variant, main_nwg, FQLA_FUSED_PREPARE, stream, &used);
        if (err != cudaSuccess) return fqla_cuda_check(ctx, err, "CUDA forward: prepare kernel launch");
        fused = used;
    }
    if (!fused) {
        err = fqla_fwd_launch_prepare(k, io_bf16, r->prep_variant, NULL, NULL, stream);
        if (err != cudaSuccess) return fqla_cuda_check(ctx, err, "CUDA forward: prepare kernel launch");
    }

    err = fqla_fwd_launch_chunk_wg(pre, io_bf16, 1, stream, &used);
    if (err != cudaSuccess) return fqla_cuda_check(ctx, err, "CUDA forward: CP pre-pass launch");
    if (!used && fused) /* the same maps were encoded for the prepare kernel */
        return fqla_fail(ctx, FQLA_STATUS_INTERNAL_ERROR, "CUDA forward: the CP pre-pass's TMA maps failed");
    if (!used && state_only) return state_only_maps_failed(ctx);
    if (!used)
        return fqla_cuda_check(ctx, fqla_fwd_launch_chunk(k, io_bf16, r->bv, r->late, stream),
                               "CUDA forward: chunk kernel launch");
    err = fqla_fwd_launch_cp_scan(k, r->scan_cb, (int)r->sms, stream);
    if (err != cudaSuccess) return fqla_cuda_check(ctx, err, "CUDA forward: CP scan launch");

    if (state_only) { /* each sequence's last segment, state only, from its start state */
        mp.state_only = 1;
        err = fqla_fwd_launch_chunk_wg(mp, io_bf16, 1, stream, &used);
        if (err == cudaSuccess && !used) return state_only_maps_failed(ctx);
    } else if (fused) {
        err = fqla_fwd_launch_fused(mp, io_bf16, r->prep_variant, main_nwg, FQLA_FUSED_CHAIN, stream, &used);
        if (err == cudaSuccess && !used)
            return fqla_fail(ctx, FQLA_STATUS_INTERNAL_ERROR, "CUDA forward: the CP main pass's TMA maps failed");
    } else {
        err = fqla_fwd_launch_chunk_wg(mp, io_bf16, main_nwg, stream, &used);
    }
    return fqla_cuda_check(ctx, err, "CUDA forward: CP main pass launch");
}

/* The final state alone (o absent, p->ht_only; fqla_cuda_fwd_supported
 * checked the shapes): the prepare kernel (without Q where its maps encode,
 * else with Q: Pg is then formed and unread), then the state-only variant of
 * the wgmma chunk kernel over whole sequences; where the route has CP, CP's
 * pre-pass and scan, then that variant over each sequence's last segment. */
static fqla_status run_state_only(fqla_context *ctx, const fqla_fwd_shape *s, const fqla_fwd_route *r,
                                  fqla_fwd_params k, unsigned char *ws, const fqla_fwd_ws_layout &L, int io_bf16,
                                  cudaStream_t stream)
{
    if (r->cp) return run_cp(ctx, s, r, k, ws, L, io_bf16, 1, stream);
    k.state_only = 1;
    int used = 0;
    cudaError_t err = fqla_fwd_launch_fused(k, io_bf16, r->prep_variant, 1, FQLA_FUSED_PREPARE, stream, &used);
    if (err == cudaSuccess && !used) err = fqla_fwd_launch_prepare(k, io_bf16, r->prep_variant, NULL, NULL, stream);
    if (err != cudaSuccess) return fqla_cuda_check(ctx, err, "CUDA forward: prepare kernel launch");
    err = fqla_fwd_launch_chunk_wg(k, io_bf16, 1, stream, &used);
    if (err == cudaSuccess && !used) return state_only_maps_failed(ctx);
    return fqla_cuda_check(ctx, err, "CUDA forward: state-only chunk kernel launch");
}

/* The final state alone (o absent; fp32 q/k/v take the recurrence, which
 * then stores nothing but the state) runs on the state-only variant of the
 * wgmma chunk kernel: K = 64 or 128, V a multiple of 64, TMA-mappable rows. */
static fqla_status state_only_supported(fqla_context *ctx, const fqla_problem *p, const fqla_fwd_shape &s)
{
    if (p->io_dtype == FQLA_DTYPE_F32) return FQLA_STATUS_SUCCESS;
    if ((p->K != 64 && p->K != 128) || p->V % 64 != 0)
        return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED,
                         "o: absent (the final state alone) needs K = 64 or 128 and V a multiple of 64 on the CUDA "
                         "forward (K = %lld, V = %lld; use FQLA_BACKEND_CPU or pass o)",
                         (long long)p->K, (long long)p->V);
    if (!fqla_route_tma_ok(s.K, s.V, s.T, fqla_route_slots(&s), s.HV, s.o_base16, s.o_sb, s.o_st, s.o_sh,
                           fqla_fwd_tma_encoder()))
        return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED,
                         "o: absent (the final state alone) needs the TMA maps of q, k, v (the driver's "
                         "tensor-map encoder, T < 2^31) on the CUDA forward (use FQLA_BACKEND_CPU or pass o)");
    return FQLA_STATUS_SUCCESS;
}

fqla_status fqla_cuda_fwd_supported(fqla_context *ctx, const fqla_problem *p, const fqla_fwd_args *a)
{
    const fqla_fwd_shape s = shape_of(p, a);
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
    if (p->N * p->HV > 0x7fffffffLL || fqla_route_slots(&s) + p->T / FQLA_FWD_CHUNK + 1 > 0x7fffffffLL)
        return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED,
                         "N * HV = %lld or T = %lld is beyond the CUDA forward's grid", (long long)(p->N * p->HV),
                         (long long)p->T);
    if (p->ht_only) {
        const fqla_status st = state_only_supported(ctx, p, s);
        if (st != FQLA_STATUS_SUCCESS) return st;
    }
    if (p->io_dtype == FQLA_DTYPE_F32 || (p->ht_only && p->T == 0)) { /* the recurrent kernel: every K checked above */
        if (fqla_fwd_recurrent_ctas(p->N, p->HV, p->K, p->V, p->varlen) > 0x7fffffffLL)
            return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED,
                             "N * HV * V = %lld * %lld * %lld is beyond the CUDA recurrent kernel's grid", (long long)p->N,
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
    const int bv = fqla_route_bv(&s, fqla_route_sms(ctx->info.sm_count));
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
    fqla_fwd_shape s;
    const fqla_fwd_route r = plan(ctx, p, a, &s, 0, NULL);
    *bytes = fqla_fwd_route_ws(&s, &r).total;
    return FQLA_STATUS_SUCCESS;
}

fqla_status fqla_cuda_fwd_run(fqla_context *ctx, const fqla_problem *p, const fqla_fwd_args *a,
                              void *workspace, size_t workspace_bytes, cudaStream_t stream)
{
    fqla_status st = fqla_cuda_fwd_supported(ctx, p, a);
    if (st != FQLA_STATUS_SUCCESS) return st;
    fqla_fwd_shape s;
    const fqla_fwd_route r = plan(ctx, p, a, &s, 1, workspace);
    const int64_t uniform = r.uniform;
    const fqla_fwd_ws_layout L = fqla_fwd_route_ws(&s, &r);
    if (workspace_bytes < L.total || (L.total > 0 && !workspace))
        return fqla_fail(ctx, FQLA_STATUS_WORKSPACE_TOO_SMALL, "workspace: %zu bytes given, %zu bytes needed",
                         workspace_bytes, L.total);
    if (s.N == 0 || s.HV == 0) return FQLA_STATUS_SUCCESS;

    fqla_fwd_params k;
    memset(&k, 0, sizeof k);
    fqla_fwd_params_inputs(k, p, a->q, a->k, a->v, a->g, a->beta, a->A_log, a->dt_bias, a->initial_state);
    k.o = a->o.data; /* NULL: the final state alone */
    k.o_sb = s.o_sb; k.o_st = s.o_st; k.o_sh = s.o_sh; /* (v's when o is absent: shape_of) */
    if (uniform) { /* the padded view [N][L] of the packed tokens */
        k.q_sb = uniform * k.q_st; k.k_sb = uniform * k.k_st; k.v_sb = uniform * k.v_st;
        k.o_sb = uniform * k.o_st; k.g_sb = uniform * k.g_st; k.b_sb = uniform * k.b_st;
    }
    if (a->final_state.data) {
        k.ht = a->final_state.data;
        k.ht_bf16 = a->final_state.dtype == FQLA_DTYPE_BF16;
        k.ht_sn = a->final_state.strides[0];
        k.ht_sh = a->final_state.strides[1];
        k.ht_s2 = a->final_state.strides[2];
    }
    k.ht_v_first = p->opt.state_v_first;
    k.varlen = s.varlen;
    if (s.varlen) {
        k.cu = a->cu_seqlens.data;
        k.cu64 = a->cu_seqlens.dtype == FQLA_DTYPE_I64;
    }
    k.T = s.T;
    k.N = s.N;
    k.slots = fqla_route_slots(&s);
    k.cps = (s.T + FQLA_FWD_CHUNK - 1) / FQLA_FWD_CHUNK;
    /* The final state alone of no tokens at all is each sequence's initial
     * state (or zeros): the recurrence copies it without reading q/k/v,
     * where the state-only kernel's TMA maps cannot take a zero-length
     * token dimension. */
    if (r.path == FQLA_FWD_RECURRENT || (p->ht_only && s.T == 0))
        return fqla_cuda_check(ctx, fqla_fwd_launch_recurrent(k, (int)r.sms, r.rec_rows, stream),
                               "CUDA forward: fp32 recurrent kernel launch");
    unsigned char *ws = (unsigned char *)workspace;
    if (r.path == FQLA_FWD_CHUNK_F32 && r.cp) return run_cp_f32(ctx, &s, &r, k, ws, L, stream);
    if (r.path == FQLA_FWD_CHAIN_F32) return run_chain_f32(ctx, &s, &r, k, ws, L, stream);
    if (r.path == FQLA_FWD_CHUNK_F32)
        return fqla_cuda_check(ctx, fqla_fwd_launch_chunk_f32(k, r.bv, stream),
                               "CUDA forward: fp32 chunk kernel launch");
    k.gam = (float *)(ws + L.gam);
    k.rq = p->opt.use_qk_l2norm ? (float *)(ws + L.rq) : NULL;
    k.rk = p->opt.use_qk_l2norm ? (float *)(ws + L.rk) : NULL;
    k.Ag = ws + L.Ag;
    k.Pg = ws + L.Pg;
    if (r.cp_skip) k.chunk_ok = (int *)(ws + L.chunk_ok);
    k.pdl = r.pdl;

    const int io_bf16 = p->io_dtype == FQLA_DTYPE_BF16;
    if (p->ht_only) return run_state_only(ctx, &s, &r, k, ws, L, io_bf16, stream);
    if (r.cp) return run_cp(ctx, &s, &r, k, ws, L, io_bf16, 0, stream); /* it launches its own prepare kernel */
    if (r.path == FQLA_FWD_FUSED) {
        /* the prepare kernel without Q (gamma, Ag), then the kernel that
         * forms Pg beside the chain; nothing launched if its maps cannot be
         * encoded (then the two kernels run) */
        int used = 0;
        k.fused_split = r.fused_split;
        cudaError_t err =
            fqla_fwd_launch_fused(k, io_bf16, r.prep_variant, r.nwg, FQLA_FUSED_PREPARE | FQLA_FUSED_CHAIN, stream, &used);
        if (used || err != cudaSuccess) return fqla_cuda_check(ctx, err, "CUDA forward: fused path launch");
    }
    st = fqla_cuda_check(ctx, fqla_fwd_launch_prepare(k, io_bf16, r.prep_variant, NULL, NULL, stream),
                         "CUDA forward: prepare kernel launch");
    if (st != FQLA_STATUS_SUCCESS) return st;
    if (r.path != FQLA_FWD_MMA && fqla_fwd_wg_usable(k)) {
        int used = 0;
        cudaError_t err = fqla_fwd_launch_chunk_wg(k, io_bf16, r.nwg, stream, &used);
        if (used || err != cudaSuccess) return fqla_cuda_check(ctx, err, "CUDA forward: wgmma chunk kernel launch");
    }
    return fqla_cuda_check(ctx, fqla_fwd_launch_chunk(k, io_bf16, r.bv, r.late, stream),
                           "CUDA forward: chunk kernel launch");
}
