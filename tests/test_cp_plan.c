/*
 * test_cp_plan.c - the GPU-free arithmetic of the CUDA context parallelism
 * (src/cuda/cp_plan.h): the segment indexing the kernels and the workspace
 * size rely on, checked on random varlen batches, and the forward's and the
 * backward chains' plans on rows whose outcome was measured on the H200.
 */
#include "common/check.h"
#include "cuda/cp_plan.h"

#include <math.h>
#include <stdlib.h>

/* A random packed batch of 1..16 sequences into cu[0..N]: a length is 0
 * with probability p0, below short_max with p1 - p0, else below long_max.
 * Returns N. */
static int random_batch(int64_t cu[17], double p0, double p1, int64_t short_max, int64_t long_max)
{
    const int N = 1 + (int)(check_uniform() * 16);
    cu[0] = 0;
    for (int n = 0; n < N; n++) {
        const double u = check_uniform();
        cu[n + 1] = cu[n] + (u < p0 ? 0 : u < p1 ? (int64_t)(check_uniform() * short_max)
                                                 : (int64_t)(check_uniform() * long_max));
    }
    return N;
}

/* Random packed batches: every segment index lies inside the workspace bound,
 * sequences' index ranges never overlap, and the segments cover each
 * sequence with no empty one after the first. */
static void varlen_indexing(void)
{
    const int64_t Ls[] = {1, 2, 3, 4, 8, 32};
    const int trials = check_quick() ? 100 : 600;
    for (int trial = 0; trial < trials; trial++) {
        int64_t cu[17];
        /* empty, short, around chunk and segment edges, long */
        const int N = random_batch(cu, 0.15, 0.4, 130, 5000);
        const int64_t T = cu[N] + (int64_t)(check_uniform() * 200); /* rows past the last sequence */
        for (int li = 0; li < (int)(sizeof Ls / sizeof Ls[0]); li++) {
            const int64_t L = Ls[li], span = FQLA_CP_CHUNK * L;
            const int64_t bound = fqla_cp_segs(1, T, N, L);
            for (int n = 0; n < N; n++) {
                const int64_t len = cu[n + 1] - cu[n];
                const int64_t b = fqla_cp_sbase(1, n, cu[n], 0, L), ns = fqla_cp_nseg(len, L);
                CHECK(ns >= 1, "trial %d L=%lld n=%d: %lld segments", trial, (long long)L, n, (long long)ns);
                CHECK(ns * span >= len, "trial %d L=%lld n=%d: %lld segments do not cover %lld tokens", trial,
                      (long long)L, n, (long long)ns, (long long)len);
                CHECK(len == 0 || (ns - 1) * span < len, "trial %d L=%lld n=%d: an empty last segment", trial,
                      (long long)L, n);
                CHECK(b + ns <= bound, "trial %d L=%lld n=%d: index %lld past the workspace bound %lld", trial,
                      (long long)L, n, (long long)(b + ns - 1), (long long)bound);
                if (n + 1 < N) {
                    const int64_t next = fqla_cp_sbase(1, n + 1, cu[n + 1], 0, L);
                    CHECK(b + ns <= next, "trial %d L=%lld n=%d: segments reach the next sequence's (%lld > %lld)",
                          trial, (long long)L, n, (long long)(b + ns - 1), (long long)next);
                }
            }
        }
    }
}

/* The kernels' mapping from a CTA row's segment index back to (sequence,
 * segment), fqla_cp_segment, against the forward mapping on random packed
 * batches with int64 and int32 cu_seqlens: every segment is found, and every
 * other index below the bound maps to none. */
static void segment_lookup(void)
{
    const int trials = check_quick() ? 60 : 300;
    static int64_t want_n[4096], want_j[4096];
    for (int trial = 0; trial < trials; trial++) {
        int64_t cu[17];
        int32_t cu32[17];
        const int N = random_batch(cu, 0.2, 0.5, 200, 3000);
        for (int n = 0; n <= N; n++) cu32[n] = (int32_t)cu[n];
        const int64_t T = cu[N] + (int64_t)(check_uniform() * 100);
        const int64_t L = 1 + (int64_t)(check_uniform() * 5);
        const int64_t bound = fqla_cp_segs(1, T, N, L);
        CHECK(bound <= 4096, "trial %d: bound %lld", trial, (long long)bound);
        if (bound > 4096) continue;
        for (int64_t g = 0; g < bound; g++) want_n[g] = -1;
        for (int n = 0; n < N; n++) {
            const int64_t b = fqla_cp_sbase(1, n, cu[n], 0, L), ns = fqla_cp_nseg(cu[n + 1] - cu[n], L);
            for (int64_t j = 0; j < ns && b + j < bound; j++) {
                want_n[b + j] = n;
                want_j[b + j] = j;
            }
        }
        for (int w = 0; w < 2; w++)
            for (int64_t g = 0; g < bound; g++) {
                int64_t j = -7;
                const int64_t n = fqla_cp_segment(w ? (const void *)cu32 : (const void *)cu, !w, N, T, 0, L, g, &j);
                CHECK(n == want_n[g] && (n < 0 || j == want_j[g]),
                      "trial %d (int%d cu) L=%lld: index %lld -> sequence %lld segment %lld, expected %lld / %lld",
                      trial, w ? 32 : 64, (long long)L, (long long)g, (long long)n, (long long)j,
                      (long long)want_n[g], (long long)(want_n[g] < 0 ? -1 : want_j[g]));
            }
    }
    /* a padded batch: index g is sequence g / segments, segment g % segments */
    for (int64_t L = 1; L <= 5; L++) {
        const int64_t T = 1000, N = 3, cps = (T + 63) / 64, ns = fqla_cp_nseg(T, L);
        for (int64_t g = 0; g < fqla_cp_segs(0, T, N, L); g++) {
            int64_t j = -7;
            const int64_t n = fqla_cp_segment(NULL, 1, N, T, cps, L, g, &j);
            CHECK(n == g / ns && j == g % ns, "padded L=%lld: index %lld -> %lld / %lld", (long long)L, (long long)g,
                  (long long)n, (long long)j);
        }
    }
}

/* The real segment count (which sizes CP's main pass in fwd.cu) is the
 * number of indices that belong to a segment, below the index range by at
 * most one per sequence plus the rows after the last sequence; and the
 * equal-length test behind running a packed batch as a padded one. */
static void real_segments_and_uniform(void)
{
    const int trials = check_quick() ? 60 : 300;
    for (int trial = 0; trial < trials; trial++) {
        int64_t cu[17];
        const int N = random_batch(cu, 0.2, 0.5, 200, 3000);
        const int64_t T = cu[N] + (check_uniform() < 0.5 ? 0 : (int64_t)(check_uniform() * 100));
        const int64_t L = 1 + (int64_t)(check_uniform() * 5);
        const int64_t bound = fqla_cp_segs(1, T, N, L), real = fqla_cp_real_segs(cu, N, L);
        int64_t valid = 0;
        for (int64_t g = 0; g < bound; g++) {
            int64_t j;
            valid += fqla_cp_segment(cu, 1, N, T, 0, L, g, &j) >= 0;
        }
        /* bound - real: up to one spare index per sequence, and the rows
         * after the last sequence, (T - cu[N]) / (64 L) indices */
        CHECK(real == valid && real <= bound && bound - real <= N + (T - cu[N]) / (64 * L),
              "trial %d L=%lld: %lld real segments, %lld valid indices, index range %lld, N = %d", trial,
              (long long)L, (long long)real, (long long)valid, (long long)bound, N);
    }
    const int64_t eq[] = {0, 200, 400, 600}, one[] = {0, 4096}, uneq[] = {0, 200, 450, 600}, empty[] = {0, 0, 0},
                  late[] = {5, 205, 405};
    CHECK(fqla_cp_uniform_len(eq, 3, 600) == 200, "0, 200, 400, 600: %lld", (long long)fqla_cp_uniform_len(eq, 3, 600));
    CHECK(fqla_cp_uniform_len(eq, 3, 640) == 0, "rows after the last sequence are not a padded batch");
    CHECK(fqla_cp_uniform_len(one, 1, 4096) == 4096, "one sequence is a padded batch of one");
    CHECK(fqla_cp_uniform_len(uneq, 3, 600) == 0, "unequal lengths");
    CHECK(fqla_cp_uniform_len(empty, 2, 0) == 0, "empty sequences");
    CHECK(fqla_cp_uniform_len(late, 2, 405) == 0, "cu[0] != 0");
}

/* A padded batch: N sequences of T tokens, ceil(chunks / L) segments each. */
static void padded_indexing(void)
{
    const int64_t Ts[] = {1, 63, 64, 65, 1000, 4096, 4097};
    for (int ti = 0; ti < 7; ti++)
        for (int64_t L = 1; L <= 9; L++) {
            const int64_t T = Ts[ti], N = 3, cps = (T + 63) / 64;
            const int64_t ns = fqla_cp_nseg(T, L);
            CHECK(ns == (cps + L - 1) / L, "T=%lld L=%lld: %lld segments", (long long)T, (long long)L, (long long)ns);
            CHECK(fqla_cp_sbase(0, 2, 0, cps, L) == 2 * ns, "T=%lld L=%lld: sbase(2)", (long long)T, (long long)L);
            CHECK(fqla_cp_segs(0, T, N, L) == N * ns, "T=%lld L=%lld: bound", (long long)T, (long long)L);
        }
}

static fqla_cp_problem problem(int64_t N, int64_t T, int64_t HV, int varlen, const int64_t *cu_host)
{
    fqla_cp_problem q;
    q.N = N;
    q.T = T;
    q.HV = HV;
    q.H = HV;
    q.K = 128;
    q.V = 128;
    q.varlen = varlen;
    q.cu_host = cu_host;
    q.sms = 132;
    q.prep_saving = 0;
    q.m_skipped = 0.0;
    return q;
}

/* Decisions on measured rows (H200, 132 SMs, K = V = 128). */
static void plan_decisions(void)
{
    /* TP8 (2,8) 1x32768: CP took 0.795 -> 0.292 ms */
    fqla_cp_problem q = problem(1, 32768, 8, 0, NULL);
    int64_t L = fqla_cp_plan(&q);
    CHECK(L >= 4 && L <= 256, "TP8 1x32768: L = %lld, CP expected", (long long)L);
    CHECK(fqla_cp_segs(0, q.T, q.N, L > 0 ? L : 1) * q.HV <= 0x7fffffffLL, "TP8 1x32768: grid overflow");
    /* TP4 (4,16) 1x32768: 0.844 -> 0.483 ms */
    q = problem(1, 32768, 16, 0, NULL);
    CHECK(fqla_cp_plan(&q) > 0, "TP4 1x32768: CP expected");
    /* TP8 8192x4: CP lost at every L (0.252 ms without, >= 0.281 with) */
    q = problem(4, 8192, 8, 0, NULL);
    CHECK(fqla_cp_plan(&q) == 0, "TP8 8192x4 (padded): no CP expected, L = %lld", (long long)fqla_cp_plan(&q));
    const int64_t cu4[] = {0, 8192, 16384, 24576, 32768};
    q = problem(4, 32768, 8, 1, cu4);
    CHECK(fqla_cp_plan(&q) == 0, "TP8 8192x4 (varlen, host cu): no CP expected");
    q = problem(4, 32768, 8, 1, NULL);
    CHECK(fqla_cp_plan(&q) == 0, "TP8 8192x4 (varlen, no host cu): no CP expected");
    /* TP8 1x2048: 0.069 ms without, 0.0725 with the first plan's L = 4 */
    q = problem(1, 2048, 8, 0, NULL);
    CHECK(fqla_cp_plan(&q) == 0, "TP8 1x2048: no CP expected");
    /* TP8 1x32768 keeps the first model's L = 32 (the second's 64 measured
     * x1.12 slower on the H200) */
    q = problem(1, 32768, 8, 0, NULL);
    q.H = 2;
    q.prep_saving = 1;
    CHECK(fqla_cp_plan(&q) == 32, "TP8 1x32768 with the prepare saving: L = %lld, 32 expected",
          (long long)fqla_cp_plan(&q));
    /* Sym h32 1x32768: the first model plans no CP; with the fused main
     * pass the second plans L = 128: 0.891 -> 0.841 ms on the H200 */
    q = problem(1, 32768, 32, 0, NULL);
    CHECK(fqla_cp_plan(&q) == 128, "HV=32 1x32768: L = %lld, 128 expected", (long long)fqla_cp_plan(&q));
    /* 27B TP2 (8,24) 12288+4096: CP only through the prepare kernel's
     * saving (the two kernels without CP): 0.328 -> 0.301 ms at L = 64 */
    const int64_t cu3[] = {0, 12288, 16384};
    q = problem(2, 16384, 24, 1, cu3);
    q.H = 8;
    CHECK(fqla_cp_plan(&q) == 0, "27B TP2 12288+4096 without the saving: no CP expected");
    q.prep_saving = 1;
    CHECK(fqla_cp_plan(&q) == 64, "27B TP2 12288+4096 with the saving: L = %lld, 64 expected",
          (long long)fqla_cp_plan(&q));
    /* recurrences that fill the SMs: never */
    q = problem(2, 32768, 64, 0, NULL);
    CHECK(fqla_cp_plan(&q) == 0, "N=2 HV=64: no CP expected");
    /* a skewed pair is planned from its longest sequence when cu is known */
    const int64_t cu2[] = {0, 28672, 32768};
    q = problem(2, 32768, 8, 1, cu2);
    CHECK(fqla_cp_plan(&q) > 0, "TP8 28672+4096 (host cu): CP expected (0.706 -> 0.297 ms)");
}

/* Equal lengths give the same plan however they are passed. */
static void plan_consistency(void)
{
    const int64_t HVs[] = {4, 8, 16, 24};
    const int64_t lens[] = {2048, 4096, 8192, 16384, 32768};
    for (int h = 0; h < 4; h++)
        for (int i = 0; i < 5; i++)
            for (int64_t N = 1; N <= 4; N++) {
                int64_t cu[5];
                for (int n = 0; n <= N; n++) cu[n] = n * lens[i];
                fqla_cp_problem padded = problem(N, lens[i], HVs[h], 0, NULL);
                fqla_cp_problem host = problem(N, N * lens[i], HVs[h], 1, cu);
                fqla_cp_problem nohost = problem(N, N * lens[i], HVs[h], 1, NULL);
                const int64_t a = fqla_cp_plan(&padded), b = fqla_cp_plan(&host), c = fqla_cp_plan(&nohost);
                CHECK(a == b && b == c, "N=%lld x %lld tokens, HV=%lld: padded %lld, varlen %lld, no host cu %lld",
                      (long long)N, (long long)lens[i], (long long)HVs[h], (long long)a, (long long)b, (long long)c);
            }
}

/* The share of transitions the shortcut leaves out (m_skipped): 0 prices
 * every pre-pass slice, as before it existed; it discounts only the M
 * slices of segments of FQLA_CP_SKIP_MIN_L chunks or more; out-of-range
 * shares clamp; and a larger share never turns a CP plan into none (every
 * L's modelled time can only fall, the time without CP stays). */
static void plan_skip_share(void)
{
    fqla_cp_problem q = problem(2, 8192, 16, 0, NULL);
    q.K = 128;
    q.V = 256;
    const int64_t all = 10 * 16 * (256 + 128) / 64, h_only = 10 * 16 * 256 / 64;
    CHECK(fqla_cp_pre_ctas(&q, 10, 16) == all, "m_skipped 0: %lld CTAs, %lld expected",
          (long long)fqla_cp_pre_ctas(&q, 10, 16), (long long)all);
    q.m_skipped = 1.0;
    CHECK(fqla_cp_pre_ctas(&q, 10, 16) == h_only, "m_skipped 1: %lld CTAs, %lld expected",
          (long long)fqla_cp_pre_ctas(&q, 10, 16), (long long)h_only);
    CHECK(fqla_cp_pre_ctas(&q, 10, FQLA_CP_SKIP_MIN_L / 2) == all, "short segments: every slice priced");
    q.m_skipped = 0.75; /* 320 M slices, a quarter live */
    CHECK(fqla_cp_pre_ctas(&q, 10, 16) == h_only + 80, "m_skipped 0.75: %lld CTAs",
          (long long)fqla_cp_pre_ctas(&q, 10, 16));
    q.m_skipped = 7.0;
    CHECK(fqla_cp_pre_ctas(&q, 10, 16) == h_only, "m_skipped > 1 clamps to 1");
    q.m_skipped = -1.0;
    CHECK(fqla_cp_pre_ctas(&q, 10, 16) == all, "m_skipped < 0 clamps to 0");
    q.m_skipped = NAN;
    CHECK(fqla_cp_pre_ctas(&q, 10, 16) == all, "m_skipped NaN prices every slice");

    const int64_t HVs[] = {2, 4, 8, 16, 24, 32, 48};
    const int trials = check_quick() ? 200 : 1000;
    for (int trial = 0; trial < trials; trial++) {
        int64_t cu[17];
        const int N = random_batch(cu, 0.2, 0.5, 512, 40000);
        fqla_cp_problem p = problem(N, cu[N], HVs[(int)(check_uniform() * 7) % 7], 1, cu);
        p.H = p.HV / (1 + (int64_t)(check_uniform() * 2));
        p.prep_saving = check_uniform() < 0.5;
        int64_t prev = 0, at0 = 0;
        for (int s = 0; s <= 4; s++) {
            p.m_skipped = 0.25 * s;
            const int64_t L = fqla_cp_plan(&p);
            CHECK(!(prev > 0 && L == 0), "trial %d: N=%d HV=%lld: CP at m_skipped %.2f (L=%lld), none at %.2f", trial, N,
                  (long long)p.HV, 0.25 * (s - 1), (long long)prev, 0.25 * s);
            /* the share only decides whether CP runs: a length chosen at
             * full price stays (shorter ones measured x1.14-1.32 slower) */
            if (s == 0) at0 = L;
            CHECK(!(at0 > 0 && L != at0), "trial %d: N=%d HV=%lld: L=%lld at full price, %lld at m_skipped %.2f",
                  trial, N, (long long)p.HV, (long long)at0, (long long)L, 0.25 * s);
            prev = L;
        }
    }

    /* Measured on the H200, fwd.cu's default
     * share 0.75: TP8 (2,8) 8192x4 gets CP, 0.213 -> 0.184 ms at L = 32;
     * TP4 (4,16) 28672+4096 keeps the full price's L = 64 (32 measured
     * x1.25 slower) */
    q = problem(4, 8192, 8, 0, NULL);
    q.H = 2;
    q.prep_saving = 1;
    q.m_skipped = 0.75;
    CHECK(fqla_cp_plan(&q) == 32, "TP8 8192x4 at m_skipped 0.75: L = %lld, 32 expected", (long long)fqla_cp_plan(&q));
    const int64_t cu2[] = {0, 28672, 32768};
    q = problem(2, 32768, 16, 1, cu2);
    q.H = 4;
    q.prep_saving = 1;
    q.m_skipped = 0.75;
    CHECK(fqla_cp_plan(&q) == 64, "TP4 28672+4096 at m_skipped 0.75: L = %lld, 64 expected", (long long)fqla_cp_plan(&q));
}

/* The backward chains' plan (fqla_cp_bwd_seg_chunks) on rows measured on
 * the H200 (132 SMs) and on the GPU tests' shapes: CP where few chain CTAs
 * walk long sequences, none where they fill the SMs; segments of at least
 * 4 chunks that cover the sequence. Both chains run in one launch (2), the
 * reverse chain alone for dh0 alone (1). */
static void bwd_chain_plan(void)
{
    /* hk2_hv4 8k_1seq: 16 chain warpgroups; with CP the chains took 1.76 -> 0.52 ms
     * (one launch a chain then) */
    int64_t L = fqla_cp_bwd_seg_chunks(1, 8192, 4, 128, 128, 2, 132);
    CHECK(L >= 4 && L < 128, "hk2_hv4 1x8192: CP expected, L = %lld", (long long)L);
    /* hk16_hv32 32k_1seq: 64 warpgroups a chain, both chains' 128 in 64 CTAs on
     * 132 SMs; with the shortcut's priced share (the gated heads' pre-pass
     * walks a window) CP spreads them. Without the shortcut it would not pay:
     * the 8k row, whose segments are too short for the shortcut's price */
    L = fqla_cp_bwd_seg_chunks(1, 32768, 32, 128, 128, 2, 132);
    CHECK(L >= FQLA_CP_SKIP_MIN_L && L < 512, "hk16_hv32 1x32768: CP expected, L = %lld", (long long)L);
    L = fqla_cp_bwd_seg_chunks(1, 32768, 32, 128, 128, 1, 132);
    CHECK(L >= FQLA_CP_SKIP_MIN_L && L < 512, "hk16_hv32 1x32768, one chain: CP expected, L = %lld", (long long)L);
    L = fqla_cp_bwd_seg_chunks(2, 8192, 32, 128, 128, 2, 132);
    CHECK(L == 0, "hk16_hv32 2x4096: no CP expected (the chains fill the SMs), L = %lld", (long long)L);
    /* hk16_hv32 8k_8seq (packed varlen, the longest from the host copy or bounded by T): 1024 chain CTAs */
    L = fqla_cp_bwd_seg_chunks(8, 1024, 32, 128, 128, 2, 132);
    CHECK(L == 0, "hk16_hv32 8x1024: no CP expected, L = %lld", (long long)L);
    L = fqla_cp_bwd_seg_chunks(8, 8192, 32, 128, 128, 2, 132);
    CHECK(L == 0, "hk16_hv32 8x1024 without a host copy: no CP expected, L = %lld", (long long)L);
    /* hk2_hv4 32k_4seq: 64 chain warpgroups over 128 chunks (1.13 ms without CP, which T's bound
     * had planned as one 512-chunk segment each) */
    L = fqla_cp_bwd_seg_chunks(4, 8192, 4, 128, 128, 2, 132);
    CHECK(L >= 4 && L < 128, "hk2_hv4 4x8192: CP expected, L = %lld", (long long)L);
    /* tests/test_gpu_bwd.c's strong decay case: one head, 3000 tokens */
    L = fqla_cp_bwd_seg_chunks(1, 3000, 1, 128, 128, 2, 132);
    CHECK(L > 0, "1 head x 3000 tokens: CP expected (the GPU test's CP case)");
    /* too short to cut, or nothing to run */
    CHECK(fqla_cp_bwd_seg_chunks(1, 7 * 64, 1, 128, 128, 2, 132) == 0, "7 chunks: no CP");
    CHECK(fqla_cp_bwd_seg_chunks(0, 8192, 4, 128, 128, 2, 132) == 0, "no sequences: no CP");
    CHECK(fqla_cp_bwd_seg_chunks(1, 0, 4, 128, 128, 2, 132) == 0, "T = 0: no CP");
    /* packed sequences of unequal lengths, planned from the host cu_seqlens
     * (fqla_cp_bwd_seg_chunks_cu), against what the GPU measured
     * (bench/results/bwd-cp-sweep-h100-2026-12-06.csv, the backward's time
     * against a forced segment length): the bench's 8k_4seq (5809, 1244,
     * 406, 733 tokens: 91, 20, 7, 12 chunks) at 16 value heads ran best at 20
     * chunks (-10 % against no CP, which pricing every sequence at the
     * longest one's length chose), at 4 value heads at 10 (-20 % against the
     * 23 of that plan); 32k_8seq at 8 value heads best at 40 (-12 % against
     * no CP) */
    const int64_t cu4[] = {0, 5809, 7053, 7459, 8192};
    L = fqla_cp_bwd_seg_chunks_cu(cu4, 4, 16, 128, 128, 2, 132);
    CHECK(L >= 14 && L <= 32, "hk8_hv16 8k_4seq: CP at 14-32 chunks expected, L = %lld", (long long)L);
    CHECK(fqla_cp_bwd_seg_chunks(4, 5809, 16, 128, 128, 2, 132) == 0,
          "hk8_hv16 8k_4seq priced at its longest sequence: no CP (the plan without the lengths)");
    L = fqla_cp_bwd_seg_chunks_cu(cu4, 4, 4, 128, 128, 2, 132);
    CHECK(L >= 8 && L <= 14, "hk2_hv4 8k_4seq: CP at 8-14 chunks expected, L = %lld", (long long)L);
    const int64_t cu32[] = {0, 3274, 4303, 7212, 12273, 14284, 18077, 28009, 32768};
    L = fqla_cp_bwd_seg_chunks_cu(cu32, 8, 8, 128, 128, 2, 132);
    CHECK(L >= 28 && L <= 56, "hk4_hv8 32k_8seq: CP at 28-56 chunks expected, L = %lld", (long long)L);
    const int64_t cu8[] = {0, 161, 2089, 5246, 5809, 7053, 7282, 7459, 8192};
    L = fqla_cp_bwd_seg_chunks_cu(cu8, 8, 32, 128, 128, 2, 132);
    CHECK(L == 0, "hk16_hv32 8k_8seq: no CP expected, L = %lld", (long long)L);
    /* equal lengths: the same plan as the padded batch */
    const int64_t cue[] = {0, 8192, 16384, 24576, 32768};
    CHECK(fqla_cp_bwd_seg_chunks_cu(cue, 4, 4, 128, 128, 2, 132) == fqla_cp_bwd_seg_chunks(4, 8192, 4, 128, 128, 2, 132),
          "4 x 8192 packed: the padded batch's plan");
    /* random packed batches: L at least 4 chunks and under the longest sequence's chunks; equal to
     * the padded plan where the lengths are equal */
    for (int trial = 0; trial < 2000; trial++) {
        const int64_t N = 1 + (int64_t)(check_uniform() * 12), HV = 1 + (int64_t)(check_uniform() * 64);
        const int64_t K = check_uniform() < 0.5 ? 64 : 128, V = 32 * (1 + (int64_t)(check_uniform() * 8));
        const int64_t sms = 1 + (int64_t)(check_uniform() * 200), chains = check_uniform() < 0.5 ? 1 : 2;
        const int equal = check_uniform() < 0.2;
        int64_t cu[13] = {0}, longest = 0;
        const int64_t len0 = (int64_t)(check_uniform() * 20000);
        for (int64_t n = 0; n < N; n++) {
            const int64_t len = equal ? len0 : (int64_t)(check_uniform() * check_uniform() * 40000);
            cu[n + 1] = cu[n] + len;
            if (len > longest) longest = len;
        }
        const int64_t l = fqla_cp_bwd_seg_chunks_cu(cu, N, HV, K, V, chains, sms), chunks = (longest + 63) / 64;
        CHECK(l == 0 || (l >= 4 && l < chunks && (chunks + l - 1) / l <= FQLA_CP_BWD_MAX_SEGS), "packed N=%lld HV=%lld K=%lld V=%lld chains=%lld sms=%lld: L = %lld",
              (long long)N, (long long)HV, (long long)K, (long long)V, (long long)chains, (long long)sms, (long long)l);
        if (equal && len0 > 0)
            CHECK(l == fqla_cp_bwd_seg_chunks(N, len0, HV, K, V, chains, sms), "equal lengths: the padded plan");
    }
    /* random shapes, one chain or two: L at least 4 chunks, at most FQLA_CP_BWD_MAX_SEGS segments */
    for (int trial = 0; trial < 2000; trial++) {
        const int64_t N = 1 + (int64_t)(check_uniform() * 8), T = (int64_t)(check_uniform() * 200000);
        const int64_t HV = 1 + (int64_t)(check_uniform() * 64), K = check_uniform() < 0.5 ? 64 : 128;
        const int64_t V = 32 * (1 + (int64_t)(check_uniform() * 8)), sms = 1 + (int64_t)(check_uniform() * 200);
        const int64_t chains = check_uniform() < 0.5 ? 1 : 2;
        const int64_t l = fqla_cp_bwd_seg_chunks(N, T, HV, K, V, chains, sms), chunks = (T + 63) / 64;
        CHECK(l == 0 || (l >= 4 && l < chunks && (chunks + l - 1) / l <= FQLA_CP_BWD_MAX_SEGS),
              "N=%lld T=%lld HV=%lld K=%lld V=%lld chains=%lld sms=%lld: L = %lld", (long long)N, (long long)T,
              (long long)HV, (long long)K, (long long)V, (long long)chains, (long long)sms, (long long)l);
    }
}

/* The chunked fp32 kernel's plan (fqla_cp_plan_f32; route_plan.h gives it
 * the share FQLA_ROUTE_CP_MSKIP = 0.75): CP on the long rows with few
 * heads that ran 0.37-0.5x FLA's fp32 forward without it (H100,
 * fwd-fp32-h100-2026-12-05.txt), none where the chains fill the SMs;
 * segment lengths that cover the sequence, slice widths the kernel has
 * (64 only where the columns allow), the pre-pass's width for V + K. */
static void plan_f32(void)
{
    fqla_cp_problem q = problem(1, 32768, 8, 0, NULL); /* 397B TP8 1x32768: 7.8 ms on 32 CTAs */
    q.H = 2;
    q.m_skipped = 0.75;
    fqla_cp_f32_plan f = fqla_cp_plan_f32(&q);
    CHECK(f.seg_chunks >= 8 && f.seg_chunks <= 128, "TP8 1x32768: L = %lld, CP expected", (long long)f.seg_chunks);
    q.m_skipped = 0.0;
    CHECK(fqla_cp_plan_f32(&q).seg_chunks > 0, "TP8 1x32768 at full price: CP expected");
    q = problem(4, 8192, 32, 0, NULL); /* Sym h32 8192x4: 256 CTAs of 64 columns */
    q.m_skipped = 0.75;
    f = fqla_cp_plan_f32(&q);
    CHECK(f.seg_chunks == 0 && f.bv == 64, "Sym h32 8192x4: L = %lld bv %d, no CP at 64 columns expected",
          (long long)f.seg_chunks, f.bv);
    q = problem(1, 8192, 32, 0, NULL); /* 35B TP1 1x8192: 128 CTAs of 32 columns fill the SMs */
    q.m_skipped = 0.75;
    CHECK(fqla_cp_plan_f32(&q).seg_chunks == 0, "HV=32 1x8192: no CP expected");
    q = problem(1, 64, 2, 0, NULL);
    q.m_skipped = 0.75;
    CHECK(fqla_cp_plan_f32(&q).seg_chunks == 0, "one chunk: no CP");
    q = problem(0, 0, 2, 0, NULL);
    CHECK(fqla_cp_plan_f32(&q).seg_chunks == 0, "no sequences: no CP");

    const int64_t HVs[] = {1, 2, 4, 8, 16, 32, 64};
    const int trials = check_quick() ? 200 : 1000;
    for (int trial = 0; trial < trials; trial++) {
        int64_t cu[17];
        const int N = random_batch(cu, 0.2, 0.5, 64, 40000);
        fqla_cp_problem p = problem(N, cu[N], HVs[(int)(check_uniform() * 7) % 7], 1, cu);
        p.K = check_uniform() < 0.5 ? 64 : 128;
        p.V = 32 * (1 + (int64_t)(check_uniform() * 8));
        p.m_skipped = check_uniform() < 0.5 ? 0.75 : 0.0;
        f = fqla_cp_plan_f32(&p);
        const int64_t chunks = (fqla_cp_longest(cu, N) + 63) / 64;
        CHECK(f.bv == 32 || (f.bv == 64 && p.V % 64 == 0), "trial %d: V=%lld bv %d", trial, (long long)p.V, f.bv);
        if (f.seg_chunks == 0) continue;
        CHECK(f.seg_chunks >= 2 && 2 * f.seg_chunks <= chunks, "trial %d: L = %lld over %lld chunks", trial,
              (long long)f.seg_chunks, (long long)chunks);
        CHECK(f.pre_bv == 32 || (f.pre_bv == 64 && (p.V + p.K) % 64 == 0), "trial %d: V=%lld pre-pass bv %d", trial,
              (long long)p.V, f.pre_bv);
        CHECK(fqla_cp_segs(1, cu[N], N, f.seg_chunks) * p.HV <= 0x7fffffffLL, "trial %d: grid", trial);
    }
}

int main(void)
{
    check_rng_seed(check_seed());
    CHECK_RUN(varlen_indexing);
    CHECK_RUN(padded_indexing);
    CHECK_RUN(segment_lookup);
    CHECK_RUN(real_segments_and_uniform);
    CHECK_RUN(plan_decisions);
    CHECK_RUN(plan_consistency);
    CHECK_RUN(plan_skip_share);
    CHECK_RUN(bwd_chain_plan);
    CHECK_RUN(plan_f32);
    return check_summary();
}
