/*
 * test_route_plan.c - the CUDA forward's route planner (src/cuda/route_plan.h)
 * on the CPU: each path on a shape chosen to take it, the head-dim and
 * value-width boundaries, fp32 q/k/v, varlen with and without a host copy of
 * cu_seqlens, CP on and off, the SM count; and, over random shapes, the
 * planner against the routing ladder it replaced (fwd.cu and fwd_fused.cu
 * before the planner, at their default settings), which it must match
 * decision for decision.
 */
#include "common/check.h"
#include "cuda/route_plan.h"

#include <string.h>

/* A padded batch of N sequences of T tokens, bf16, o contiguous [N][T][HV][V]. */
static fqla_fwd_shape shape(int64_t N, int64_t T, int64_t H, int64_t HV, int64_t K, int64_t V)
{
    fqla_fwd_shape s;
    memset(&s, 0, sizeof s);
    s.N = N;
    s.T = T;
    s.H = H;
    s.HV = HV;
    s.K = K;
    s.V = V;
    s.o_base16 = 1;
    s.o_sh = V;
    s.o_st = HV * V;
    s.o_sb = T * HV * V;
    s.tma_encoder = 1;
    return s;
}

/* packed varlen input: N sequences from cu (host copy given or not) */
static fqla_fwd_shape packed(int64_t N, const int64_t *cu, int host_copy, int64_t H, int64_t HV, int64_t K, int64_t V)
{
    fqla_fwd_shape s = shape(N, cu[N], H, HV, K, V);
    s.varlen = 1;
    s.cu_host = host_copy ? cu : NULL;
    s.o_sb = cu[N] * HV * V; /* B = 1 */
    return s;
}

static fqla_fwd_route plan(int sm_count, const fqla_fwd_shape *s)
{
    fqla_route_device d;
    d.sm_count = sm_count;
    d.cc_major = 9;
    d.cc_minor = 0;
    fqla_fwd_route r;
    fqla_fwd_shape ps;
    fqla_fwd_plan(&d, s, &r, &ps);
    return r;
}

static const char *path_name(int path)
{
    switch (path) {
    case FQLA_FWD_FUSED: return "fused";
    case FQLA_FWD_WGMMA: return "wgmma";
    case FQLA_FWD_MMA: return "mma.sync";
    case FQLA_FWD_RECURRENT: return "fp32 recurrence";
    case FQLA_FWD_CHUNK_F32: return "fp32 chunked";
    case FQLA_FWD_CHAIN_F32: return "fp32 chain";
    }
    return "?";
}

#define CHECK_PATH(r, want, what)                                                                             \
    CHECK((r).path == (want), "%s: %s planned, %s expected", what, path_name((r).path), path_name(want))

/* One shape per path, with its variant parameters. */
static void each_path(void)
{
    /* fused, two chain warpgroups: 132 CTAs of 128 columns, one wave of
     * two warpgroups against two of one; no CP (the chains fill the SMs) */
    fqla_fwd_shape s = shape(2, 4096, 66, 66, 128, 128);
    fqla_fwd_route r = plan(132, &s);
    CHECK_PATH(r, FQLA_FWD_FUSED, "2x4096 HV 66 V 128");
    CHECK(r.nwg == 2 && !r.cp && r.seg_chunks == 0 && r.fused_split == 0 && r.pdl == 1,
          "2x4096 HV 66: nwg %d cp %d L %lld split %lld pdl %d", r.nwg, r.cp, (long long)r.seg_chunks,
          (long long)r.fused_split, r.pdl);

    /* the split last wave: 192 chains on 132 SMs run 132 with two
     * warpgroups, the last 60 with one */
    s = shape(4, 4096, 16, 48, 128, 128);
    r = plan(132, &s);
    CHECK_PATH(r, FQLA_FWD_FUSED, "4x4096 HV 48");
    CHECK(r.nwg == 2 && r.fused_split == 132, "4x4096 HV 48: nwg %d split %lld (2, 132 expected)", r.nwg,
          (long long)r.fused_split);

    /* fused, one chain warpgroup: T H >= 12 x the longest sequence */
    s = shape(1, 256, 16, 16, 128, 128);
    r = plan(132, &s);
    CHECK_PATH(r, FQLA_FWD_FUSED, "1x256 H 16");
    CHECK(r.nwg == 1 && r.fused_split == 0, "1x256 H 16: nwg %d split %lld", r.nwg, (long long)r.fused_split);

    /* the two kernels on wgmma: T H < 12 x the longest sequence */
    s = shape(1, 256, 8, 8, 128, 128);
    r = plan(132, &s);
    CHECK_PATH(r, FQLA_FWD_WGMMA, "1x256 H 8");
    CHECK(r.nwg == 1 && r.pdl == 1 && !r.cp, "1x256 H 8: nwg %d pdl %d cp %d", r.nwg, r.pdl, r.cp);

    /* the two kernels on mma.sync: o's rows not 16-byte aligned */
    s = shape(1, 256, 16, 16, 128, 128);
    s.o_st += 4;
    r = plan(132, &s);
    CHECK_PATH(r, FQLA_FWD_MMA, "1x256 misaligned o");
    CHECK(r.bv == 32 && !r.tma, "1x256 misaligned o: bv %d tma %d", r.bv, r.tma);
    s = shape(1, 256, 16, 16, 128, 128);
    s.o_base16 = 0;
    CHECK_PATH(plan(132, &s), FQLA_FWD_MMA, "1x256 o base misaligned");
    s = shape(1, 256, 16, 16, 128, 128);
    s.tma_encoder = 0;
    CHECK_PATH(plan(132, &s), FQLA_FWD_MMA, "1x256 no tensor-map encoder");

    /* the mma.sync kernel's wide slices where the recurrences fill the GPU */
    s = shape(4, 256, 32, 32, 128, 128);
    s.o_base16 = 0;
    r = plan(132, &s);
    CHECK(r.path == FQLA_FWD_MMA && r.bv == 64, "4x256 HV 32 misaligned o: %s bv %d", path_name(r.path), r.bv);

    /* fp32 q/k/v: where the chunked fp32 kernel covers the call (K = 64 or
     * 128, V % 32 = 0, aligned rows, a sequence of more than 8 tokens) the
     * chain route, with CP where the backward chains' model says (cp_plan.h
     * fqla_cp_bwd_seg_chunks at half the SMs; one slice a CTA), else one or
     * two slices a CTA by the waves (two where they save a wave at 1.27x the
     * step); else the recurrence, which has neither CP nor a workspace */
    s = shape(1, 32768, 8, 8, 128, 128);
    s.io_f32 = 1;
    r = plan(132, &s);
    CHECK_PATH(r, FQLA_FWD_RECURRENT, "fp32 1x32768 rows not known aligned");
    CHECK(r.seg_chunks == 0 && !r.cp && r.rec_rows == 0, "fp32: L %lld cp %d rows %d", (long long)r.seg_chunks, r.cp,
          r.rec_rows);
    s.f32_rows16 = 1;
    r = plan(132, &s);
    CHECK(r.path == FQLA_FWD_CHAIN_F32 && r.cp && r.cp_skip && r.seg_chunks > 0 && r.nwg == 1 && r.scan_cb == 8 &&
              r.rec_rows == 0,
          "fp32 1x32768 HV 8: %s nwg %d cp %d L %lld scan %d", path_name(r.path), r.nwg, r.cp,
          (long long)r.seg_chunks, r.scan_cb);
    CHECK(r.seg_chunks == fqla_cp_bwd_seg_chunks(1, 32768, 8, 128, 128, 1, 66), "fp32 1x32768 HV 8: L %lld",
          (long long)r.seg_chunks);
    s = shape(8, 1024, 16, 32, 128, 128);
    s.io_f32 = s.f32_rows16 = 1;
    r = plan(132, &s);
    CHECK(r.path == FQLA_FWD_CHAIN_F32 && r.nwg == 2 && !r.cp && r.seg_chunks == 0,
          "fp32 8x1024 HV 32 (two waves of pairs against four): %s nwg %d cp %d", path_name(r.path), r.nwg, r.cp);
    s.V = 96;
    r = plan(132, &s);
    CHECK(r.path == FQLA_FWD_CHAIN_F32 && r.nwg == 2, "fp32 V = 96: %s nwg %d", path_name(r.path), r.nwg);
    /* 27B TP2 8192x4: one wave of pairs against two of single slices; 4096x2:
     * one wave of single slices */
    s = shape(4, 8192, 8, 24, 128, 128);
    s.io_f32 = s.f32_rows16 = 1;
    r = plan(132, &s);
    CHECK(r.path == FQLA_FWD_CHAIN_F32 && r.nwg == 2 && !r.cp, "fp32 4x8192 HV 24: %s nwg %d cp %d",
          path_name(r.path), r.nwg, r.cp);
    s.N = 2;
    s.T = 4096;
    r = plan(132, &s);
    CHECK(r.path == FQLA_FWD_CHAIN_F32 && r.nwg == 1, "fp32 2x4096 HV 24: %s nwg %d cp %d", path_name(r.path),
          r.nwg, r.cp);
    s = shape(8, 1024, 16, 32, 128, 128);
    s.io_f32 = s.f32_rows16 = 1;
    s.V = 128;
    s.K = 256;
    CHECK_PATH(plan(132, &s), FQLA_FWD_RECURRENT, "fp32 K = 256");
    s.K = 64;
    s.V = 80;
    CHECK_PATH(plan(132, &s), FQLA_FWD_RECURRENT, "fp32 V = 80");
    s = shape(4, 8, 2, 4, 128, 128);
    s.io_f32 = s.f32_rows16 = 1;
    CHECK_PATH(plan(132, &s), FQLA_FWD_RECURRENT, "fp32 4x8 (no sequence past 8 tokens)");
    s.T = 9;
    CHECK_PATH(plan(132, &s), FQLA_FWD_CHAIN_F32, "fp32 4x9");
    static const int64_t cu8[] = {0, 8, 16, 20}, cu9[] = {0, 8, 17, 20};
    s = packed(3, cu8, 1, 2, 4, 64, 64);
    s.io_f32 = s.f32_rows16 = 1;
    CHECK_PATH(plan(132, &s), FQLA_FWD_RECURRENT, "fp32 varlen longest 8, host copy");
    s = packed(3, cu8, 0, 2, 4, 64, 64);
    s.io_f32 = s.f32_rows16 = 1;
    CHECK_PATH(plan(132, &s), FQLA_FWD_CHAIN_F32, "fp32 varlen longest 8, no host copy (T = 20 counts)");
    s = packed(3, cu9, 1, 2, 4, 64, 64);
    s.io_f32 = s.f32_rows16 = 1;
    CHECK_PATH(plan(132, &s), FQLA_FWD_CHAIN_F32, "fp32 varlen longest 9, host copy");
}

/* K = 64, 128, 256 and V around multiples of 64 and 128. */
static void boundaries(void)
{
    /* K = 64 and 128 take every path; K = 256 the fused kernel (one chain
     * warpgroup) or mma.sync, never wgmma or CP */
    for (int k = 0; k < 3; k++) {
        const int64_t K = 64 << k;
        fqla_fwd_shape s = shape(2, 4096, 66, 66, K, 128);
        fqla_fwd_route r = plan(132, &s);
        CHECK_PATH(r, FQLA_FWD_FUSED, K == 256 ? "K 256 HV 66" : "K 64/128 HV 66");
        CHECK(r.nwg == (K == 256 ? 1 : 2), "K %lld HV 66: nwg %d", (long long)K, r.nwg);
        s = shape(1, 256, 8, 8, K, 128);
        r = plan(132, &s);
        CHECK_PATH(r, K == 256 ? FQLA_FWD_FUSED : FQLA_FWD_WGMMA, "1x256 H 8");
        s = shape(1, 65536, 2, 2, K, 128); /* a long sequence over few heads: CP where K allows */
        r = plan(132, &s);
        CHECK(K == 256 ? !r.cp && r.seg_chunks == 0 : r.cp && r.seg_chunks > 0,
              "K %lld 1x65536 HV 2: cp %d L %lld", (long long)K, r.cp, (long long)r.seg_chunks);
        CHECK(r.bv == (K == 256 ? 32 : 32), "K %lld: bv %d", (long long)K, r.bv);
    }
    /* V not a multiple of 64: mma.sync at 32 columns, no CP */
    for (int64_t V = 32; V <= 224; V += 64) {
        fqla_fwd_shape s = shape(1, 65536, 2, 2, 128, V);
        fqla_fwd_route r = plan(132, &s);
        CHECK(r.path == FQLA_FWD_MMA && r.bv == 32 && !r.cp && r.seg_chunks == 0 && !r.tma,
              "V %lld: %s bv %d cp %d L %lld", (long long)V, path_name(r.path), r.bv, r.cp, (long long)r.seg_chunks);
    }
    /* V a multiple of 64, not of 128: one warpgroup */
    fqla_fwd_shape s = shape(2, 4096, 66, 66, 128, 192);
    fqla_fwd_route r = plan(132, &s);
    CHECK(r.path == FQLA_FWD_FUSED && r.nwg == 1, "V 192: %s nwg %d", path_name(r.path), r.nwg);
    s = shape(1, 256, 8, 8, 64, 192);
    r = plan(132, &s);
    CHECK(r.path == FQLA_FWD_WGMMA && r.nwg == 1, "V 192 H 8: %s nwg %d", path_name(r.path), r.nwg);
}

/* Context parallelism: its plan is cp_plan.h's, its main pass the fused
 * kernel where it covers the call, PDL off; a plan without the TMA kernels
 * still sizes the workspace but runs the mma.sync kernel. */
static void context_parallel(void)
{
    fqla_fwd_shape s = shape(1, 32768, 8, 8, 128, 128);
    fqla_fwd_route r = plan(132, &s);
    fqla_cp_problem q = fqla_route_cp_problem(&s, 132, !fqla_route_fused(&s, 132), FQLA_ROUTE_CP_MSKIP);
    const int64_t L = fqla_cp_plan(&q);
    CHECK(L > 0, "1x32768 HV 8: no CP in cp_plan.h");
    CHECK(r.cp && r.seg_chunks == L && r.cp_skip && r.pdl == 0, "1x32768 HV 8: cp %d L %lld (%lld) skip %d pdl %d",
          r.cp, (long long)r.seg_chunks, (long long)L, r.cp_skip, r.pdl);
    CHECK_PATH(r, FQLA_FWD_FUSED, "1x32768 CP main pass");
    CHECK(r.nwg == fqla_route_nwg(&s, fqla_route_real_segs(&s, L), 132), "CP main pass nwg %d", r.nwg);
    CHECK(r.scan_cb == 8 || r.scan_cb == 16 || r.scan_cb == 32, "CP scan columns %d", r.scan_cb);
    /* the scan's columns: the narrowest whose grid fits one wave */
    CHECK(r.scan_cb == (8 * 128 / 8 <= 132 ? 8 : 16), "scan columns %d for 8 heads of 128", r.scan_cb);

    /* CP planned, the TMA kernels unusable: mma.sync with the chunk flags */
    s.o_st += 8 * 0 + 4;
    r = plan(132, &s);
    CHECK(r.path == FQLA_FWD_MMA && !r.cp && r.seg_chunks == L && r.cp_skip,
          "1x32768 misaligned o: %s cp %d L %lld skip %d", path_name(r.path), r.cp, (long long)r.seg_chunks, r.cp_skip);

    /* CP off where the chains fill the SMs: 132 x 64-column CTAs */
    s = shape(1, 32768, 66, 66, 128, 128);
    r = plan(132, &s);
    CHECK(!r.cp && r.seg_chunks == 0, "1x32768 HV 66: cp %d L %lld", r.cp, (long long)r.seg_chunks);

    /* varlen: one long sequence among short ones, planned from the host copy */
    const int64_t cu[] = {0, 30000, 30100, 30300};
    s = packed(3, cu, 1, 8, 8, 128, 128);
    r = plan(132, &s);
    CHECK(r.cp && r.seg_chunks > 0 && r.uniform == 0, "varlen 30000+100+200: cp %d L %lld uniform %lld", r.cp,
          (long long)r.seg_chunks, (long long)r.uniform);
}

/* Packed varlen input: sequences of one length run as the padded batch;
 * without a host copy of cu_seqlens one sequence is taken to hold every
 * token. */
static void varlen(void)
{
    const int64_t cu[] = {0, 1024, 2048, 3072, 4096};
    fqla_fwd_shape v = packed(4, cu, 1, 16, 32, 128, 128);
    fqla_fwd_shape b = shape(4, 1024, 16, 32, 128, 128);
    fqla_fwd_route rv = plan(132, &v), rb = plan(132, &b);
    CHECK(rv.uniform == 1024, "4 x 1024 packed: uniform %lld", (long long)rv.uniform);
    CHECK(rv.path == rb.path && rv.nwg == rb.nwg && rv.bv == rb.bv && rv.seg_chunks == rb.seg_chunks &&
              rv.fused_split == rb.fused_split && rv.cp == rb.cp,
          "4 x 1024 packed vs padded: %s/%s nwg %d/%d L %lld/%lld split %lld/%lld", path_name(rv.path),
          path_name(rb.path), rv.nwg, rb.nwg, (long long)rv.seg_chunks, (long long)rb.seg_chunks,
          (long long)rv.fused_split, (long long)rb.fused_split);
    fqla_fwd_shape ps;
    fqla_route_device d = {132, 9, 0};
    fqla_fwd_route r;
    fqla_fwd_plan(&d, &v, &r, &ps);
    CHECK(!ps.varlen && ps.T == 1024 && ps.cu_host == NULL && ps.o_sb == 1024 * v.o_st,
          "padded view: varlen %d T %lld o_sb %lld", ps.varlen, (long long)ps.T, (long long)ps.o_sb);

    /* unequal lengths stay varlen; the split last wave is for padded batches only */
    const int64_t cu2[] = {0, 4096, 8192, 12288, 16000};
    fqla_fwd_shape u = packed(4, cu2, 1, 16, 48, 128, 128);
    r = plan(132, &u);
    CHECK(r.uniform == 0 && r.path == FQLA_FWD_FUSED && r.nwg == 2 && r.fused_split == 0,
          "varlen 4 x ~4096 HV 48: uniform %lld %s nwg %d split %lld", (long long)r.uniform, path_name(r.path), r.nwg,
          (long long)r.fused_split);

    /* H = 8 over 4 sequences: T H >= 12 x the longest with the host copy
     * (fused, one warpgroup); without it the longest is all T tokens */
    const int64_t cu3[] = {0, 100, 200, 300, 400};
    fqla_fwd_shape w = packed(4, cu3, 1, 8, 8, 128, 128);
    CHECK(plan(132, &w).path == FQLA_FWD_FUSED, "varlen 4 x 100 H 8 with cu_host: %s", path_name(plan(132, &w).path));
    w.cu_host = NULL;
    CHECK(plan(132, &w).path == FQLA_FWD_WGMMA, "varlen 4 x 100 H 8 without cu_host: %s",
          path_name(plan(132, &w).path));
}

/* The SM count: 0 (unknown) plans as 132; a larger GPU picks one warpgroup
 * where 132 SMs pick two, and narrower mma.sync slices. */
static void sm_count(void)
{
    fqla_fwd_shape s = shape(1, 4096, 100, 100, 128, 128); /* 100 CTAs of 128 columns */
    fqla_fwd_route a = plan(132, &s), z = plan(0, &s), b = plan(200, &s);
    CHECK(a.sms == 132 && z.sms == 132 && b.sms == 200, "sms %lld %lld %lld", (long long)a.sms, (long long)z.sms,
          (long long)b.sms);
    CHECK(a.nwg == 2 && z.nwg == 2 && a.path == FQLA_FWD_FUSED, "132 SMs: %s nwg %d", path_name(a.path), a.nwg);
    CHECK(b.nwg == 1, "200 SMs: nwg %d", b.nwg);
    s.o_base16 = 0;
    a = plan(132, &s);
    b = plan(500, &s);
    CHECK(a.path == FQLA_FWD_MMA && a.bv == 64 && b.bv == 32, "mma.sync bv %d at 132 SMs, %d at 500", a.bv, b.bv);
}

/* ---- the ladder the planner replaced, at its default settings ---------- */

typedef struct {
    int route; /* 1 fused, 2 wgmma, 3 mma.sync, 4 recurrence; + 8 with CP */
    int nwg, bv;
    int64_t L, split;
} old_route;

static int64_t old_sms(int sm) { return sm > 0 ? sm : 132; }

static int old_pick_bv(int sm, const fqla_fwd_shape *p)
{
    if (p->K == 256) return 32;
    if (p->V % 64 != 0) return 32;
    int64_t ctas64 = p->N * p->HV * (p->V / 64);
    return ctas64 * 2 <= old_sms(sm) ? 32 : 64;
}

static int old_pick_nwg(int sm, const fqla_fwd_shape *p, int64_t rows)
{
    if (p->V % 128 != 0 || p->K == 256) return 1;
    const int64_t sms = old_sms(sm);
    const int64_t ctas2 = rows * p->HV * (p->V / 128);
    const int64_t waves1 = (2 * ctas2 + sms - 1) / sms, waves2 = (ctas2 + sms - 1) / sms;
    return waves2 * 14 < waves1 * 10 ? 2 : 1;
}

static int old_pick_fused(int sm, const fqla_fwd_shape *p)
{
    if (p->K == 256) return old_pick_nwg(sm, p, p->N);
    const int nwg = old_pick_nwg(sm, p, p->N);
    if (nwg == 2) return 2;
    const int64_t *cu = p->cu_host;
    const int64_t longest = cu && p->N > 0 ? fqla_cp_longest(cu, p->N) : p->T;
    const int64_t tokens = p->varlen ? p->T : p->N * p->T;
    return tokens * p->H >= 12 * longest ? 1 : 0;
}

static int64_t old_split(int sm, const fqla_fwd_shape *p)
{
    if (p->varlen || p->V != 128) return 0;
    const int64_t sms = old_sms(sm);
    const int64_t chains = p->N * p->HV, full = chains / sms, rem = chains % sms;
    return full >= 1 && rem > 0 && 2 * rem <= sms ? full * sms : 0;
}

static int64_t old_plan_cp(int sm, const fqla_fwd_shape *p)
{
    if ((p->K != 64 && p->K != 128) || p->V % 64 != 0) return 0;
    fqla_cp_problem q;
    q.N = p->N;
    q.T = p->T;
    q.HV = p->HV;
    q.K = p->K;
    q.V = p->V;
    q.H = p->H;
    q.varlen = p->varlen;
    q.cu_host = p->cu_host;
    q.sms = old_sms(sm);
    q.prep_saving = !old_pick_fused(sm, p);
    q.m_skipped = 0.75;
    return fqla_cp_plan(&q);
}

static int old_tma_usable(const fqla_fwd_shape *p)
{
    const int64_t slots = p->varlen ? p->T / 64 + p->N : p->N * ((p->T + 63) / 64);
    if (p->K % 64 != 0 || p->V % 64 != 0) return 0;
    if (p->T > 0x7fffffffLL - 2 * 64 || slots * p->HV * 64 > 0x7fffffffLL) return 0;
    if (!p->o_base16 || (p->o_st % 8) || (p->o_sh % 8) || (p->o_sb % 8)) return 0;
    return p->tma_encoder;
}

static int old_fused_usable(const fqla_fwd_shape *p, int nwg)
{
    return (nwg == 1 || (nwg == 2 && p->K != 256)) && (p->K == 64 || p->K == 128 || p->K == 256) &&
           p->V % (64 * nwg) == 0 && old_tma_usable(p);
}

static old_route old_ladder(int sm, const fqla_fwd_shape *p0)
{
    old_route o;
    memset(&o, 0, sizeof o);
    fqla_fwd_shape pp = *p0, *p = &pp;
    const int64_t U = p0->varlen && p0->cu_host ? fqla_cp_uniform_len(p0->cu_host, p0->N, p0->T) : 0;
    if (U) {
        pp.varlen = 0;
        pp.T = U;
        pp.cu_host = NULL;
        pp.o_sb = U * pp.o_st;
    }
    if (p->io_f32) {
        o.route = 4;
        return o;
    }
    o.L = old_plan_cp(sm, p);
    o.bv = old_pick_bv(sm, p);
    const int wg_usable = (p->K == 64 || p->K == 128) && old_tma_usable(p);
    if (o.L > 0 && wg_usable) {
        int64_t segs = p->varlen && p->cu_host ? fqla_cp_real_segs(p->cu_host, p->N, o.L)
                                               : fqla_cp_segs(p->varlen, p->T, p->N, o.L);
        o.nwg = old_pick_nwg(sm, p, segs);
        o.route = 8 + (old_fused_usable(p, o.nwg) ? 1 : 2);
        return o;
    }
    const int fused_nwg = old_pick_fused(sm, p);
    if (fused_nwg && o.L == 0 && old_fused_usable(p, fused_nwg)) {
        o.route = 1;
        o.nwg = fused_nwg;
        o.split = fused_nwg == 2 ? old_split(sm, p) : 0;
        return o;
    }
    if (wg_usable) {
        o.route = 2;
        o.nwg = old_pick_nwg(sm, p, p->N);
        return o;
    }
    o.route = 3;
    return o;
}

static int64_t pick(const int64_t *v, int n) { return v[(int)(check_uniform() * n)]; }

/* Random shapes: the planner decides as the old ladder did. */
static void same_as_before(void)
{
    static const int64_t Ks[] = {64, 128, 256};
    static const int64_t Vs[] = {32, 64, 96, 128, 192, 256, 512};
    static const int64_t Hs[] = {1, 2, 4, 8, 16, 32, 64};
    static const int64_t groups[] = {1, 1, 2, 3, 4, 8};
    static const int sms[] = {0, 132, 132, 78, 114, 200};
    const int trials = check_quick() ? 3000 : 40000;
    int routes[16] = {0};
    for (int trial = 0; trial < trials; trial++) {
        const int64_t K = pick(Ks, 3), V = pick(Vs, 7), H = pick(Hs, 7), HV = H * pick(groups, 6);
        const int sm = sms[(int)(check_uniform() * 6)];
        fqla_fwd_shape s;
        int64_t cu[17];
        const double u = check_uniform();
        if (u < 0.5) { /* a padded batch */
            const int64_t N = 1 + (int64_t)(check_uniform() * 8);
            const int64_t T = check_uniform() < 0.3 ? 1 + (int64_t)(check_uniform() * 512)
                                                    : 1 + (int64_t)(check_uniform() * 65536);
            s = shape(N, T, H, HV, K, V);
        } else { /* packed varlen: equal or random lengths, host copy or not */
            const int N = 1 + (int)(check_uniform() * 16);
            const int equal = check_uniform() < 0.3;
            const int64_t len0 = 1 + (int64_t)(check_uniform() * 8192);
            cu[0] = 0;
            for (int n = 0; n < N; n++)
                cu[n + 1] = cu[n] + (equal ? len0 : (int64_t)(check_uniform() * (check_uniform() < 0.2 ? 60000 : 3000)));
            if (cu[N] == 0) cu[N] = 1;
            s = packed(N, cu, check_uniform() < 0.8, H, HV, K, V);
        }
        s.io_f32 = check_uniform() < 0.05;
        if (check_uniform() < 0.1) s.o_base16 = 0;
        if (check_uniform() < 0.1) s.o_st += 4;
        if (check_uniform() < 0.05) s.o_sb += 4;
        if (check_uniform() < 0.03) s.tma_encoder = 0;
        const old_route o = old_ladder(sm, &s);
        const fqla_fwd_route r = plan(sm, &s);
        const int route = r.path + (r.cp ? 8 : 0);
        routes[o.route]++;
        CHECK(route == o.route, "trial %d (sm %d N %lld T %lld H %lld HV %lld K %lld V %lld varlen %d): route %d, was %d",
              trial, sm, (long long)s.N, (long long)s.T, (long long)H, (long long)HV, (long long)K, (long long)V,
              s.varlen, route, o.route);
        if (o.route == 4) continue;
        CHECK(r.bv == o.bv && r.seg_chunks == o.L && r.cp_skip == (o.L > 0),
              "trial %d: bv %d L %lld skip %d, was bv %d L %lld", trial, r.bv, (long long)r.seg_chunks, r.cp_skip, o.bv,
              (long long)o.L);
        if (o.route != 3)
            CHECK(r.nwg == o.nwg, "trial %d: nwg %d, was %d (route %d)", trial, r.nwg, o.nwg, o.route);
        CHECK(r.fused_split == o.split, "trial %d: split %lld, was %lld", trial, (long long)r.fused_split,
              (long long)o.split);
        CHECK(r.pdl == (o.route < 8), "trial %d: pdl %d on route %d", trial, r.pdl, o.route);
        CHECK(r.prep_variant == 0 && r.late == -1 && r.rec_rows == 0, "trial %d: variants %d %d %d", trial,
              r.prep_variant, r.late, r.rec_rows);
    }
    /* every route was drawn (CP's main pass is always the fused kernel:
     * CP needs the TMA kernels, K = 64 or 128 and V % 64 = 0, and the
     * fused kernel covers all of those at the warpgroups chosen) */
    CHECK(routes[10] == 0, "CP on the wgmma main pass %d times", routes[10]);
    const int want[] = {1, 2, 3, 4, 9};
    for (int i = 0; i < 5; i++)
        CHECK(routes[want[i]] > 0, "route %d never drawn in %d trials", want[i], trials);
}

/* Decode and verify: a [K, V] state always takes 128-byte row segments,
 * split over K (2, 4 or 8 warps) but for fp32 at K = 64 at the smallest
 * batches (the only unsplit [K, V] variant the product build compiles); the
 * least split that gives 8 warps per SM, 8 only where it is the only one;
 * a [V, K] state the widest slice that gives 8 warps per SM; the prefetch
 * off only for fp32 state between 8 and 64 MB. */
static void decode(void)
{
    const fqla_route_device d = {132, 9, 0};
    const int64_t Ks[3] = {64, 128, 256};
    for (int ki = 0; ki < 3; ki++)
        for (int es = 2; es <= 4; es += 2)
            for (int vf = 0; vf < 2; vf++)
                for (int64_t B = 1; B <= 4096; B *= 4) {
                    fqla_decode_shape s = {B, 8, Ks[ki], Ks[ki], es, vf};
                    fqla_decode_route r;
                    fqla_decode_plan(&d, &s, &r);
                    const int K = (int)Ks[ki];
                    CHECK(r.pdl == 1 && r.warps == 0 && r.streaming == 0, "K %d es %d: pdl %d warps %d streaming %d", K,
                          es, r.pdl, r.warps, r.streaming);
                    if (!vf) {
                        CHECK(r.wv == 128 / es, "K %d es %d B %lld [K, V]: wv %d", K, es, (long long)B, r.wv);
                        CHECK(r.ks > 1 ? fqla_decode_ksplit_valid(es, K, r.ks) : es == 4 && K == 64,
                              "K %d es %d B %lld [K, V]: ks %d", K, es, (long long)B, r.ks);
                    } else {
                        CHECK(r.ks == 1 && fqla_decode_variant_valid(es, K, r.wv, 1), "K %d es %d B %lld [V, K]: wv %d ks %d",
                              K, es, (long long)B, r.wv, r.ks);
                    }
                }
    /* fp32 K = 128, HV = 32: B = 1 takes KS = 4 (8 would wait at a barrier
     * for nothing); B = 5 fills 8 warps per SM (1056) with KS = 2 */
    fqla_decode_shape s = {1, 32, 128, 128, 4, 0};
    fqla_decode_route r;
    fqla_decode_plan(&d, &s, &r);
    CHECK(r.wv == 32 && r.ks == 4, "fp32 K 128 B 1: wv %d ks %d (32, 4 expected)", r.wv, r.ks);
    s.B = 5;
    fqla_decode_plan(&d, &s, &r);
    CHECK(r.wv == 32 && r.ks == 2, "fp32 K 128 B 5: wv %d ks %d (32, 2 expected)", r.wv, r.ks);
    /* [V, K] bf16 at K = 128: 2048 / K = 16 columns where 8 x 132 warps fill
     * up, else narrower */
    fqla_decode_shape v = {64, 32, 128, 128, 2, 1};
    fqla_decode_plan(&d, &v, &r);
    CHECK(r.wv == 16 && r.ks == 1, "bf16 [V, K] B 64: wv %d", r.wv);
    v.B = 1;
    fqla_decode_plan(&d, &v, &r);
    CHECK(r.wv == 4, "bf16 [V, K] B 1: wv %d (4 expected)", r.wv);
    /* the prefetch: fp32 16 MB off, bf16 16 MB on, fp32 4 MB and 128 MB on */
    fqla_decode_shape m = {16, 16, 128, 128, 4, 0}; /* 16 x 16 x 64 KB = 16 MB */
    fqla_decode_plan(&d, &m, &r);
    CHECK(!r.prefetch, "fp32 16 MB: prefetch on");
    m.state_esize = 2;
    fqla_decode_plan(&d, &m, &r);
    CHECK(r.prefetch, "bf16 16 MB: prefetch off");
    m.state_esize = 4;
    m.B = 4;
    fqla_decode_plan(&d, &m, &r);
    CHECK(r.prefetch, "fp32 4 MB: prefetch off");
    m.B = 128;
    fqla_decode_plan(&d, &m, &r);
    CHECK(r.prefetch, "fp32 128 MB: prefetch off");
    /* the SM count: 8 warps per SM of the device (0: 132) */
    const fqla_route_device big = {264, 9, 0}, none = {0, 9, 0};
    fqla_decode_plan(&big, &s, &r);
    CHECK(r.ks == 4, "fp32 K 128 B 5 on 264 SMs: ks %d (4 expected)", r.ks);
    fqla_decode_plan(&none, &s, &r);
    CHECK(r.ks == 2, "fp32 K 128 B 5, SM count unknown: ks %d (2 expected)", r.ks);
}

int main(void)
{
    check_rng_seed(check_seed());
    CHECK_RUN(each_path);
    CHECK_RUN(boundaries);
    CHECK_RUN(context_parallel);
    CHECK_RUN(varlen);
    CHECK_RUN(sm_count);
    CHECK_RUN(same_as_before);
    CHECK_RUN(decode);
    return check_summary();
}
