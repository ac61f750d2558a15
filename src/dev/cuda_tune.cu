/*
 * cuda_tune.cu - the developer build's tuning, route and debug hooks of the
 * CUDA backend (make DEV=1; never in the shipped library). The benchmarks
 * (bench/bench_fwd.py, bench/bench_decode.py) and the dev-only cases of the
 * GPU tests call the exported fqla_cuda_* functions below; the backend asks
 * fqla_dev_fwd_route / fqla_dev_bwd_seg_chunks / fqla_dev_decode_route
 * (dev_hooks.h) once per call, after its own planner, and they apply the
 * settings. The settings are process globals, set from one thread before
 * the calls they steer; the records of the last call (route, CP flags,
 * the backward's segment length) are written by every call and meant for
 * single-threaded tests.
 */
#include "cuda/cuda_backend.h"
#include "cuda/decode_launch.cuh"
#include "cuda/fwd_common.cuh"
#include "cuda/route_plan.h"
#include "dev/dev_hooks.h"

#include <stdlib.h>

#define FQLA_DEV_API extern "C" __attribute__((visibility("default")))

namespace {

/* forward settings; the defaults leave the planner's route as it is */
int g_hb = 0, g_late = -1;     /* fqla_cuda_fwd_tune */
int g_wg = -1, g_nwg = 0;      /* fqla_cuda_fwd_tune_chunk */
int64_t g_cp = -1;             /* fqla_cuda_fwd_tune_cp */
int g_scan_cb = 0;             /* fqla_cuda_fwd_tune_cp_scan */
int g_cp_skip = 1;             /* fqla_cuda_fwd_tune_cp_skip */
int g_pdl = -1;                /* fqla_cuda_fwd_tune_pdl */
double g_mskip = -1.0;         /* fqla_cuda_fwd_tune_cp_mskip */
int g_rec_rows = 0;            /* fqla_cuda_fwd_tune_recurrent */
int g_f32 = -1, g_f32_bv = 0;  /* fqla_cuda_fwd_tune_f32 */
/* records of the last forward call */
int g_last_route = 0;
const int *g_flags = NULL;
int64_t g_flag_count = 0;

/* backward settings */
int64_t g_bwd_cp = -1;   /* fqla_cuda_bwd_tune_cp */
int64_t g_bwd_last = -1; /* the last backward's segment length (its workspace query's or run's) */
int g_bwd_nwg = -1;       /* fqla_cuda_bwd_tune_nwg */
int g_bwd_last_nwg = -1;  /* the last backward run's chain warpgroups a CTA */
int g_bwd_fused_rev = 0;   /* fqla_cuda_bwd_tune_fused_rev */
int g_bwd_last_fused_rev = 0; /* whether the last backward run took it */

/* decode settings */
int g_wv = 0, g_streaming = -1, g_warps = 0, g_ks = 0, g_dpdl = -1, g_prefetch = -1;

bool fwd_tuned()
{
    return g_hb != 0 || g_late != -1 || g_wg != -1 || g_nwg != 0 || g_cp != -1 || g_scan_cb != 0 || g_cp_skip != 1 ||
           g_pdl != -1 || g_mskip >= 0;
}

/* the planner's warpgroup count, or the forced one */
int nwg_of(const fqla_fwd_shape *s, int64_t rows, int64_t sms)
{
    if (g_nwg == 1 || g_nwg == 2) return (g_nwg == 2 && s->V % 128 == 0) ? 2 : 1;
    return fqla_route_nwg(s, rows, sms);
}

/* route_plan.h's fqla_route_fused with the forced warpgroup count */
int fused_of(const fqla_fwd_shape *s, int64_t sms)
{
    const int nwg = nwg_of(s, s->N, sms);
    if (s->K == 256 || nwg == 2) return nwg;
    const int64_t longest = s->cu_host && s->N > 0 ? fqla_cp_longest(s->cu_host, s->N) : s->T;
    const int64_t tokens = s->varlen ? s->T : s->N * s->T;
    return tokens * s->H >= 12 * longest ? 1 : 0;
}

/* the CP plan under the settings: forced off (g_cp = 0, or the mma.sync
 * kernel forced), a forced segment length, or the plan with the forced
 * main pass and shortcut share */
int64_t cp_of(const fqla_fwd_shape *s, int64_t sms)
{
    if (g_cp == 0 || g_wg == 0 || (s->K != 64 && s->K != 128) || s->V % 64 != 0) return 0;
    if (g_cp > 0) return fqla_route_segs(s, g_cp) * s->HV <= 0x7fffffffLL ? g_cp : 0;
    const int cp_fused = fqla_route_fused_k(s->K) && g_wg != 1;
    const int saving = cp_fused && !(g_wg == 2 || (g_wg == -1 && fused_of(s, sms)));
    const double mskip = !g_cp_skip ? 0.0 : g_mskip < 0 ? FQLA_ROUTE_CP_MSKIP : g_mskip;
    fqla_cp_problem q = fqla_route_cp_problem(s, sms, saving, mskip);
    return fqla_cp_plan(&q);
}

/* The route under the settings: fqla_fwd_plan's ladder where each step may
 * be forced (wg = 0 the mma.sync kernel, 1 the wgmma kernel, 2 the fused
 * kernel, -1 the plan; each only where it covers the call, else the next). */
void fwd_retune(const fqla_fwd_shape *s, fqla_fwd_route *r)
{
    const int64_t sms = r->sms;
    r->prep_variant = g_hb;
    r->late = g_late;
    r->seg_chunks = cp_of(s, sms);
    r->cp_skip = r->seg_chunks > 0 && g_cp_skip;
    r->pdl = g_pdl != 0;
    r->cp = 0;
    r->nwg = 0;
    r->fused_split = 0;
    r->scan_cb = 0;
    const int wg = (s->K == 64 || s->K == 128) && r->tma;
    if (r->seg_chunks > 0 && g_wg != 0 && wg) {
        r->cp = 1;
        r->pdl = 0;
        r->nwg = nwg_of(s, fqla_route_real_segs(s, r->seg_chunks), sms);
        r->path = g_wg != 1 && fqla_route_fused_fits(s->K, s->V, r->tma, r->nwg) ? FQLA_FWD_FUSED : FQLA_FWD_WGMMA;
        r->scan_cb = g_scan_cb ? g_scan_cb : fqla_route_scan_cb(s, sms);
        return;
    }
    const int fused = g_wg == 2 ? (g_nwg == 1 || g_nwg == 2 ? g_nwg : nwg_of(s, s->N, sms))
                      : g_wg == -1 ? fused_of(s, sms)
                                   : 0;
    if (fused && r->seg_chunks == 0 && fqla_route_fused_fits(s->K, s->V, r->tma, fused)) {
        r->path = FQLA_FWD_FUSED;
        r->nwg = fused;
        r->fused_split = fused == 2 ? fqla_route_split(s, sms) : 0;
        return;
    }
    if (g_wg != 0 && wg) {
        r->path = FQLA_FWD_WGMMA;
        r->nwg = nwg_of(s, s->N, sms);
        return;
    }
    r->path = FQLA_FWD_MMA;
}

/* fp32 q/k/v: the recurrence's rows a lane; the chunked fp32 kernel or the
 * chain route forced on (where it covers the shape, whatever the sequence
 * lengths) or off, and its slice width. */
void f32_retune(const fqla_fwd_shape *s, fqla_fwd_route *r)
{
    if (g_f32 == 0 || (g_f32 == 1 && fqla_route_f32_covers(s))) r->path = g_f32 == 1 ? FQLA_FWD_CHUNK_F32 : FQLA_FWD_RECURRENT;
    if (g_f32 == 2 && fqla_route_f32_chain_covers(s) && r->path != FQLA_FWD_CHAIN_F32)
        fqla_route_f32_chain(s, r->sms, r); /* the chain route, its plan */
    /* CP forced off, or on at g_cp chunks a segment */
    const int64_t segs = g_cp > 0 ? fqla_route_segs(s, g_cp) : 0; /* 0 for a padded batch of no tokens */
    const bool cp_forced = g_cp == 0 || (segs > 0 && segs * s->HV <= 0x7fffffffLL);
    if (r->path == FQLA_FWD_CHUNK_F32) {
        if (!r->bv) fqla_route_f32_cp(s, r->sms, r);
        if (cp_forced) {
            r->seg_chunks = g_cp;
            r->cp = g_cp > 0;
            r->bv = fqla_route_bv(s, r->sms);
            r->pre_bv = r->cp ? r->bv : 0;
            r->scan_cb = r->cp ? (g_scan_cb ? g_scan_cb : fqla_route_scan_cb(s, r->sms)) : 0;
        }
        r->cp_skip = r->cp && g_cp_skip;
        if (g_f32_bv == 32 || (g_f32_bv == 64 && s->V % 64 == 0)) r->bv = r->pre_bv = g_f32_bv;
        if (!r->cp) r->pre_bv = 0;
    } else if (r->path == FQLA_FWD_CHAIN_F32) {
        if (g_f32_bv == 64 || g_f32_bv == 128) r->nwg = g_f32_bv / 64; /* slices a CTA */
        if (cp_forced) {
            r->seg_chunks = g_cp;
            r->cp = g_cp > 0;
        }
        r->scan_cb = r->cp ? (g_scan_cb ? g_scan_cb : fqla_route_scan_cb(s, r->sms)) : 0;
        r->cp_skip = r->cp && g_cp_skip;
    } else {
        r->seg_chunks = 0;
        r->cp = r->cp_skip = 0;
    }
    r->rec_rows = r->path == FQLA_FWD_RECURRENT ? g_rec_rows : 0;
}

} // namespace

void fqla_dev_fwd_route(const fqla_route_device *d, const fqla_fwd_shape *s, fqla_fwd_route *r, int run,
                        const void *workspace)
{
    (void)d;
    if (r->path == FQLA_FWD_RECURRENT || r->path == FQLA_FWD_CHUNK_F32 || r->path == FQLA_FWD_CHAIN_F32) f32_retune(s, r);
    else if (fwd_tuned()) fwd_retune(s, r);
    if (!run) return;
    g_last_route = r->path + (r->cp ? 8 : 0);
    g_flags = NULL;
    if (r->cp && r->cp_skip && workspace) {
        const fqla_fwd_ws_layout L = fqla_fwd_route_ws(s, r);
        g_flags = (const int *)((const unsigned char *)workspace + L.seg_flag);
        g_flag_count = fqla_route_segs(s, r->seg_chunks) * s->HV;
    }
}

/* The prepare kernel's variant (2: plain tf32 merges instead of 3xTF32; 0
 * the default; fwd_fused_exp.cuh's FQLA_DEV_FWD_EXP_FIRST..LAST: on the fused
 * route, issue 42's experiment in place of both kernels,
 * src/dev/fwd_fused_exp.cu, its timing modes wrong by design, mode 26 the
 * correct one-kernel forward)
 * and whether the mma.sync chunk kernel issues the next chunk's copies late
 * (0 / 1; -1 the default). */
FQLA_DEV_API void fqla_cuda_fwd_tune(int prep_variant, int late_loads)
{
    g_hb = prep_variant;
    g_late = late_loads;
}

/* The chunk kernel: wg = 0 the mma.sync kernel, 1 the wgmma kernel with nwg
 * = 1 or 2 consumer warpgroups per CTA (0: the planner's), 2 the fused
 * kernel with nwg chain warpgroups (0: the planner's), -1 (the default) the
 * planner's choice. Each runs only where it covers the call, else the
 * next: fused, wgmma, mma.sync. */
FQLA_DEV_API void fqla_cuda_fwd_tune_chunk(int wg, int nwg)
{
    g_wg = wg;
    g_nwg = nwg;
}

/* Context parallelism: -1 the plan (default), 0 never, L > 0 segments of L
 * chunks wherever the TMA kernel runs. It changes the workspace size: set
 * it before the query. */
FQLA_DEV_API void fqla_cuda_fwd_tune_cp(int seg_chunks) { g_cp = seg_chunks; }

/* Value columns per CTA of the CP scan (8, 16 or 32; 0: the planner's). */
FQLA_DEV_API void fqla_cuda_fwd_tune_cp_scan(int columns)
{
    g_scan_cb = columns == 8 || columns == 16 || columns == 32 ? columns : 0;
}

/* 1 (the default): the CP pre-pass leaves out transitions its segment's
 * decay makes negligible and the scan skips them; 0 computes every one. */
FQLA_DEV_API void fqla_cuda_fwd_tune_cp_skip(int on) { g_cp_skip = on != 0; }

/* The share (0..1) of long segments' transitions the CP plan expects the
 * shortcut to leave out (cp_plan.h m_skipped); < 0 the default. It can
 * change the workspace size: set it before the query. */
FQLA_DEV_API void fqla_cuda_fwd_tune_cp_mskip(double share) { g_mskip = share; }

/* PDL for the kernels after the prepare kernel (not CP's): 1 on, 0 off, -1
 * the default (on). */
FQLA_DEV_API void fqla_cuda_fwd_tune_pdl(int on) { g_pdl = on; }

/* The fp32 recurrence's state rows a lane (16 or 32; 0, the default, by the
 * waves). */
FQLA_DEV_API void fqla_cuda_fwd_tune_recurrent(int rows) { g_rec_rows = rows == 16 || rows == 32 ? rows : 0; }

/* fp32 q/k/v: chunked = 1 the chunked fp32 kernel wherever it covers the
 * shape (K = 64 or 128, V a multiple of 32, aligned rows), 2 the chain route
 * there (with its CP plan; fqla_cuda_fwd_tune_cp forces CP on either), 0 the
 * recurrence, -1 (the default) the planner's
 * choice; bv the chunked kernel's value columns per CTA (32, or 64 where V
 * allows; 0 the planner's), or the chain route's (64: one slice a CTA, 128:
 * two). */
FQLA_DEV_API void fqla_cuda_fwd_tune_f32(int chunked, int bv)
{
    g_f32 = chunked;
    g_f32_bv = bv;
}

/* The path the last forward call in this process planned: 1 the fused
 * kernel after the prepare kernel without Q, 2 the wgmma chunk kernel, 3 the
 * mma.sync chunk kernel, 4 the fp32 recurrent kernel, 5 the chunked fp32
 * kernel; + 8 with context
 * parallelism; 0 before any call. (A TMA map that fails to encode at the
 * launch makes the run fall back from the planned path.) */
FQLA_DEV_API int fqla_cuda_fwd_last_route(void) { return g_last_route; }

/* How many (segment, value head) transitions the last CP call left out as
 * negligible, read back from its workspace (synchronises; the workspace
 * must still be live). -1 if the last call ran no CP with the shortcut on,
 * or if this was asked already. */
FQLA_DEV_API int64_t fqla_cuda_fwd_debug_cp_skipped(void)
{
    if (!g_flags || cudaDeviceSynchronize() != cudaSuccess) return -1;
    int *h = (int *)malloc((size_t)g_flag_count * sizeof(int));
    if (!h) return -1;
    int64_t n = -1;
    if (cudaMemcpy(h, g_flags, (size_t)g_flag_count * sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess)
        for (int64_t i = n = 0; i < g_flag_count; i++) n += h[i] != 0;
    free(h);
    g_flags = NULL;
    return n;
}

int64_t fqla_dev_bwd_seg_chunks(const fqla_problem *p, int64_t planned)
{
    int64_t L = planned;
    if (g_bwd_cp == 0) L = 0;
    else if (g_bwd_cp > 0) {
        /* a forced length whose segment index would not fit the grid keeps the plan */
        const int64_t segs = fqla_cp_segs(p->varlen, p->T, p->N, g_bwd_cp);
        if (segs > 0 && segs * p->HV <= 0x7fffffffLL) L = g_bwd_cp;
    }
    g_bwd_last = L;
    return L;
}

int fqla_dev_bwd_chain_nwg(const fqla_problem *p, int planned)
{
    (void)p;
    g_bwd_last_nwg = g_bwd_nwg == 1 || g_bwd_nwg == 2 ? g_bwd_nwg : planned;
    return g_bwd_last_nwg;
}

int fqla_dev_bwd_fused_rev(const fqla_problem *p)
{
    (void)p;
    return g_bwd_fused_rev;
}

void fqla_dev_bwd_fused_rev_used(int used_it) { g_bwd_last_fused_rev = used_it; }

void fqla_dev_decode_route(const fqla_problem *p, int sm_count, fqla_decode_route *r)
{
    const int esize = (int)fqla_dtype_size(p->state_dtype);
    const int K = (int)p->K;
    const int vf = p->opt.state_v_first ? 1 : 0;
    if (!vf && g_ks > 1 && fqla_decode_ksplit_valid(esize, K, g_ks)) {
        r->ks = g_ks;
        r->wv = 128 / esize;
    } else if (g_wv > 0 && fqla_decode_variant_valid(esize, K, g_wv, vf)) {
        r->ks = 1;
        r->wv = g_wv;
    } else if (!vf && g_ks == 1) {
        /* no K split: decode.cu's choice among the unsplit widths */
        const int cand[3] = {2048 / K, 1024 / K, 512 / K};
        const int64_t enough = 8 * fqla_route_sms(sm_count);
        int wv = cand[0];
        for (int i = 0; i < 3; i++) {
            if (!fqla_decode_variant_valid(esize, K, cand[i], vf) || cand[i] * esize < 32) continue;
            wv = cand[i];
            if (p->B * p->HV * (p->V / cand[i]) >= enough) break;
        }
        r->ks = 1;
        r->wv = wv;
    }
    if (g_warps) r->warps = g_warps;
    if (g_dpdl >= 0) r->pdl = g_dpdl;
    if (g_prefetch >= 0) r->prefetch = g_prefetch != 0;
    if (g_streaming >= 0) r->streaming = g_streaming;
}

/* The backward chains' CP segment length in chunks: 0 forces CP off, -1
 * (the default) leaves the planner's choice (cp_plan.h's
 * fqla_cp_bwd_seg_chunks); set before the workspace query, which sizes the
 * segments' states by it. dev/gpu/bwd_cp_sweep.py sweeps it. */
FQLA_DEV_API void fqla_cuda_bwd_tune_cp(int64_t seg_chunks) { g_bwd_cp = seg_chunks < 0 ? -1 : seg_chunks; }

/* The segment length the last backward call (or workspace query) ran with. */
FQLA_DEV_API int64_t fqla_cuda_bwd_last_seg_chunks(void) { return g_bwd_last; }
/* The chains' warpgroups a CTA: 1 or 2 forced (CP's passes too, which the
 * product build runs with 2), else (-1) the planner's. */
FQLA_DEV_API void fqla_cuda_bwd_tune_nwg(int nwg) { g_bwd_nwg = nwg == 1 || nwg == 2 ? nwg : -1; }
FQLA_DEV_API int fqla_cuda_bwd_last_nwg(void) { return g_bwd_last_nwg; }
/* The fused reverse pass under construction (src/dev/bwd_fused_rev.cu) in
 * place of the reverse chain where it covers the call: 1 the whole V a CTA,
 * 3 a CTA per 64-column value half; 2 and 4 the same without its stores of
 * dS (timing only, the gradients then wrong); 5 the half-width pass with the
 * gradient work of the chunks whose states are bf16 planes (the gradient
 * kernel forms the others'); 6 mode 5 with dq / dk unsummed (timing only:
 * the pass as if their sum were free); 0 (the default) not. And whether the last
 * backward run took it. (Modes 5-14 of 2452c75 were the timing prototypes
 * and the forms of the dq / dk sum: docs/history/2026-12-07d-fusedproto.md,
 * 2026-12-07f-fusedred.md.) */
FQLA_DEV_API void fqla_cuda_bwd_tune_fused_rev(int mode) { g_bwd_fused_rev = mode >= 1 && mode <= 6 ? mode : 0; }
FQLA_DEV_API int fqla_cuda_bwd_last_fused_rev(void) { return g_bwd_last_fused_rev; }

/* A fixed V-slice width per warp (0: the default choice) and the streaming
 * cache hints on the state (-1: the default, off). */
FQLA_DEV_API void fqla_cuda_decode_tune(int wv, int streaming)
{
    g_wv = wv;
    g_streaming = streaming;
}

/* [K, V] K split: 2, 4 or 8 warps share a 128-byte-wide V-slice (0: the
 * default; 1: no split, fqla_cuda_decode_tune's width or the choice among
 * the unsplit widths). */
FQLA_DEV_API void fqla_cuda_decode_tune_ksplit(int ks) { g_ks = ks; }

/* Programmatic dependent launch: 1 on, 0 off, -1 the default (on). */
FQLA_DEV_API void fqla_cuda_decode_tune_pdl(int on) { g_dpdl = on; }

/* The L2 prefetch before the PDL wait: 1 on, 0 off, -1 the default. */
FQLA_DEV_API void fqla_cuda_decode_tune_prefetch(int on) { g_prefetch = on; }

/* Warps per CTA, 1..8 (0: the default). */
FQLA_DEV_API void fqla_cuda_decode_tune_warps(int warps) { g_warps = warps; }
