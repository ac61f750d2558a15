/*
 * cpu_edge.c - issue 43's CPU rows (see cpu_edge.h).
 */
#include "cpu_edge.h"

#include "flashqla.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define H EDGE_H
#define HV EDGE_HV
#define K EDGE_K
#define V EDGE_V
#define C64 64

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* 64-byte aligned, as tensors from torch or numpy's large allocations are */
static void *xmalloc(size_t n)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 1) != 0)
        p = NULL;
    if (!p) {
        fprintf(stderr, "cpu rows: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

static uint64_t rng = 0x243f6a8885a308d3ull;
static double uniform(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return ((rng >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
static double normal(void) { return sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform()); }

/* rows x n normal values, each row l2-normalised when asked */
static void fill(float *x, int64_t rows, int64_t n, int normalise)
{
    for (int64_t r = 0; r < rows; r++) {
        double ss = 0;
        for (int64_t i = 0; i < n; i++) {
            x[r * n + i] = (float)normal();
            ss += (double)x[r * n + i] * x[r * n + i];
        }
        if (normalise)
            for (int64_t i = 0; i < n; i++)
                x[r * n + i] = (float)(x[r * n + i] / sqrt(ss));
    }
}

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
/* 12 independent chains (more than latency x throughput on current cores),
 * named one by one so that every chain lives in a register */
#define FMA12(fma)                                                                      \
    do {                                                                               \
        a0 = fma(a0, m, c); a1 = fma(a1, m, c); a2 = fma(a2, m, c); a3 = fma(a3, m, c);     \
        a4 = fma(a4, m, c); a5 = fma(a5, m, c); a6 = fma(a6, m, c); a7 = fma(a7, m, c);     \
        a8 = fma(a8, m, c); a9 = fma(a9, m, c); a10 = fma(a10, m, c); a11 = fma(a11, m, c); \
    } while (0)
__attribute__((target("avx512f"))) static float fma_loop_avx512(int64_t n)
{
    __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    /* distinct starting values: identical chains would be merged into one */
    __m512 a0 = _mm512_set1_ps(1), a1 = _mm512_set1_ps(2), a2 = _mm512_set1_ps(3), a3 = _mm512_set1_ps(4);
    __m512 a4 = _mm512_set1_ps(5), a5 = _mm512_set1_ps(6), a6 = _mm512_set1_ps(7), a7 = _mm512_set1_ps(8);
    __m512 a8 = _mm512_set1_ps(9), a9 = _mm512_set1_ps(10), a10 = _mm512_set1_ps(11), a11 = _mm512_set1_ps(12);
    for (int64_t it = 0; it < n; it++)
        FMA12(_mm512_fmadd_ps);
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                             _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
    s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(a8, a9), _mm512_add_ps(a10, a11)));
    return _mm512_reduce_add_ps(s);
}
__attribute__((target("avx2,fma"))) static float fma_loop_avx2(int64_t n)
{
    __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    /* distinct starting values: identical chains would be merged into one */
    __m256 a0 = _mm256_set1_ps(1), a1 = _mm256_set1_ps(2), a2 = _mm256_set1_ps(3), a3 = _mm256_set1_ps(4);
    __m256 a4 = _mm256_set1_ps(5), a5 = _mm256_set1_ps(6), a6 = _mm256_set1_ps(7), a7 = _mm256_set1_ps(8);
    __m256 a8 = _mm256_set1_ps(9), a9 = _mm256_set1_ps(10), a10 = _mm256_set1_ps(11), a11 = _mm256_set1_ps(12);
    for (int64_t it = 0; it < n; it++)
        FMA12(_mm256_fmadd_ps);
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                             _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
    float o[8];
    _mm256_storeu_ps(o, s);
    return o[0] + o[7];
}
#endif

static volatile float sink;

/* GFLOP/s of one thread's best FMA loop (best of `repeat` 10 ms runs). */
double edge_fma_peak(int repeat)
{
    double best = 0;
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
    __builtin_cpu_init();
    int w512 = __builtin_cpu_supports("avx512f");
    int w256 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    for (int r = 0; r < repeat; r++) {
        int64_t n = 200000;
        if (w512) {
            double t0 = now();
            sink = fma_loop_avx512(n);
            double g = 12.0 * 16 * 2 * n / (now() - t0) * 1e-9;
            best = g > best ? g : best;
        }
        if (w256) {
            double t0 = now();
            sink = fma_loop_avx2(n);
            double g = 12.0 * 8 * 2 * n / (now() - t0) * 1e-9;
            best = g > best ? g : best;
        }
    }
#else
    (void)repeat;
#endif
    return best;
}

static edge_inputs inputs_make(const edge_case *c)
{
    edge_inputs in;
    int64_t B = c->B, T = c->T, ns = HV * K * V;
    in.q = xmalloc((size_t)(B * T * H * K) * sizeof(float));
    in.k = xmalloc((size_t)(B * T * H * K) * sizeof(float));
    in.v = xmalloc((size_t)(B * T * HV * V) * sizeof(float));
    in.g = xmalloc((size_t)(B * T * HV) * sizeof(float));
    in.beta = xmalloc((size_t)(B * T * HV) * sizeof(float));
    in.state = xmalloc((size_t)(B * ns) * sizeof(float));
    in.o = xmalloc((size_t)(B * T * HV * V) * sizeof(float));
    in.state_out = xmalloc((size_t)(B * (c->verify ? T : 1) * ns) * sizeof(float));
    in.slots = xmalloc((size_t)B * sizeof(int64_t));
    fill(in.q, B * T * H, K, 1);
    fill(in.k, B * T * H, K, 1);
    fill(in.v, B * T * HV, V, 0);
    for (int64_t i = 0; i < B * T * HV; i++) {
        double x = normal();
        in.g[i] = (float)(-log1p(exp(-x)) / 16); /* logsigmoid / 16 */
        in.beta[i] = (float)(1 / (1 + exp(-normal())));
    }
    for (int64_t i = 0; i < B * ns; i++)
        in.state[i] = (float)(0.1 * normal());
    for (int64_t b = 0; b < B; b++)
        in.slots[b] = b;
    return in;
}

static void inputs_free(edge_inputs *in)
{
    free(in->q);
    free(in->k);
    free(in->v);
    free(in->g);
    free(in->beta);
    free(in->state);
    free(in->o);
    free(in->state_out);
    free(in->slots);
}

static fqla_tensor t4(void *d, fqla_dtype dt, int64_t a, int64_t b, int64_t c, int64_t e)
{
    int64_t s[4] = {a, b, c, e};
    return fqla_tensor_contiguous(d, dt, 4, s);
}

static fqla_tensor t3(void *d, int64_t a, int64_t b, int64_t c)
{
    int64_t s[3] = {a, b, c};
    return fqla_tensor_contiguous(d, FQLA_DTYPE_F32, 3, s);
}

static fqla_status run_flashqla(fqla_context *ctx, const edge_case *c, edge_inputs *in)
{
    int64_t B = c->B, T = c->T;
    fqla_options opt;
    memset(&opt, 0, sizeof opt);
    if (!strcmp(c->op, "prefill")) {
        fqla_fwd_args a;
        fqla_fwd_args_init(&a);
        a.q = t4(in->q, FQLA_DTYPE_F32, B, T, H, K);
        a.k = t4(in->k, FQLA_DTYPE_F32, B, T, H, K);
        a.v = t4(in->v, FQLA_DTYPE_F32, B, T, HV, V);
        a.g = t3(in->g, B, T, HV);
        a.beta = t3(in->beta, B, T, HV);
        a.o = t4(in->o, FQLA_DTYPE_F32, B, T, HV, V);
        a.initial_state = t4(in->state, FQLA_DTYPE_F32, B, HV, K, V);
        a.final_state = t4(in->state_out, FQLA_DTYPE_F32, B, HV, K, V);
        a.opt.state_v_first = c->v_first;
        return fqla_fwd(ctx, &a, NULL, 0, NULL);
    }
    fqla_decode_args a;
    fqla_decode_args_init(&a);
    a.q = t4(in->q, FQLA_DTYPE_F32, B, T, H, K);
    a.k = t4(in->k, FQLA_DTYPE_F32, B, T, H, K);
    a.v = t4(in->v, FQLA_DTYPE_F32, B, T, HV, V);
    a.g = t3(in->g, B, T, HV);
    a.beta = t3(in->beta, B, T, HV);
    a.o = t4(in->o, FQLA_DTYPE_F32, B, T, HV, V);
    a.state_pool = t4(in->state, FQLA_DTYPE_F32, B, HV, K, V); /* K == V: either layout */
    int64_t one = B;
    a.slots = fqla_tensor_contiguous(in->slots, FQLA_DTYPE_I64, 1, &one);
    a.opt.state_v_first = c->v_first;
    if (c->verify) {
        int64_t s[5] = {B, T, HV, K, V};
        a.step_states = fqla_tensor_contiguous(in->state_out, FQLA_DTYPE_F32, 5, s);
        return fqla_verify(ctx, &a, NULL, 0, NULL);
    }
    return fqla_decode(ctx, &a, NULL, 0, NULL);
}

/* useful flops of the algorithm flashqla runs */
static double case_flops(const edge_case *c)
{
    double kv = (double)K * V, tok = (double)c->B * c->T * HV;
    if (!strcmp(c->op, "decode"))
        return tok * 7 * kv;
    /* per token and value head: W = [Q; K] S (4KV), S update (2KV), U and O
     * (triangles: C V each), Q K^T and K K^T (C K, shared by the group) */
    return tok * (6 * kv + 2.0 * C64 * V + 2.0 * C64 * K * H / HV);
}

typedef struct row_result {
    double fq_us, other_us; /* best per call; other_us < 0: not measured */
} row_result;

static int bench_case(const edge_case *c, const edge_opts *o, row_result *res)
{
    res->fq_us = res->other_us = -1;
    edge_inputs in = inputs_make(c);
    fqla_context *ctx = NULL;
    if (fqla_context_create(&ctx, FQLA_BACKEND_CPU, 0) != FQLA_STATUS_SUCCESS ||
        fqla_context_set_threads(ctx, c->threads) != FQLA_STATUS_SUCCESS) {
        fprintf(stderr, "cpu rows: context: %s\n", fqla_last_error(ctx));
        fqla_context_destroy(ctx);
        inputs_free(&in);
        return 1;
    }
    if (run_flashqla(ctx, c, &in) != FQLA_STATUS_SUCCESS) {
        fprintf(stderr, "cpu rows: flashqla %s: %s\n", c->op, fqla_last_error(ctx));
        fqla_context_destroy(ctx);
        inputs_free(&in);
        return 1;
    }
    /* calls per batch: ~20 ms of flashqla */
    double t0 = now();
    run_flashqla(ctx, c, &in);
    double one = now() - t0;
    int calls = one > 0.02 ? 1 : (int)(0.02 / (one > 1e-7 ? one : 1e-7)) + 1;
    void *other = o->other ? o->other->make(c, &in) : NULL;
    if (other && o->other->run(other) != 0) {
        o->other->drop(other);
        other = NULL;
    }
    if (other && o->other->idle)
        o->other->idle(other);
    for (int r = 0; r < o->repeat; r++) {
        t0 = now();
        for (int i = 0; i < calls; i++)
            run_flashqla(ctx, c, &in);
        double us = (now() - t0) / calls * 1e6;
        if (res->fq_us < 0 || us < res->fq_us)
            res->fq_us = us;
        if (other) {
            t0 = now();
            for (int i = 0; i < calls; i++)
                o->other->run(other);
            us = (now() - t0) / calls * 1e6;
            if (o->other->idle)
                o->other->idle(other);
            if (res->other_us < 0 || us < res->other_us)
                res->other_us = us;
        }
    }
    if (other)
        o->other->drop(other);
    fqla_context_destroy(ctx);
    inputs_free(&in);
    return 0;
}

int edge_run(const edge_opts *o)
{
    edge_case cases[] = {
        {"decode", 1, 0, 0, 1, 1},  {"decode", 1, 0, 1, 1, 1},
        {"decode", 1, 0, 0, 1, 16}, {"decode", 1, 0, 1, 1, 16},
        {"decode", 1, 1, 0, 4, 1},  {"decode", 1, 1, 1, 4, 1},
        {"prefill", 1, 0, 0, o->prefill_T, 1}, {"prefill", 2, 0, 0, o->prefill_T, 1},
    };
    double peak = edge_fma_peak(o->repeat);
    char date[32];
    time_t tt = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&tt));
    if (o->csv) {
        fseek(o->csv, 0, SEEK_END);
        if (ftell(o->csv) == 0)
            fprintf(o->csv, "op,threads,T,batch,h_qk,h_v,dtype,layout,flashqla_us,ggml_us,peak_gflops,"
                            "achieved_gflops,machine,commit,date\n");
    }
    const char *oname = o->other ? o->other->name : "other";
    printf("FMA peak (1 thread): %.1f GFLOP/s; H = %d, HV = %d, K = V = %d, fp32\n\n", peak, H, HV, K);
    printf("| op | threads | T | batch | layout | flashqla us | %s us | %s / flashqla | GFLOP/s | of peak |\n",
           oname, oname);
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const edge_case *c = &cases[i];
        int prefill = !strcmp(c->op, "prefill");
        if ((prefill && !o->prefill) || (!prefill && !o->decode))
            continue;
        row_result r;
        if (bench_case(c, o, &r) != 0)
            return 1;
        double gf = case_flops(c) / (r.fq_us * 1e-6) * 1e-9;
        char other_us[32] = "", ratio[32] = "-";
        if (r.other_us >= 0) {
            snprintf(other_us, sizeof other_us, "%.1f", r.other_us);
            snprintf(ratio, sizeof ratio, "%.2fx", r.other_us / r.fq_us);
        }
        const char *layout = c->v_first ? "vk" : "kv";
        printf("| %s%s | %d | %lld | %lld | %s | %.1f | %s | %s | %.1f | %.0f %% |\n", c->op,
               c->verify ? " (verify)" : "", c->threads, (long long)c->T, (long long)c->B, layout, r.fq_us,
               other_us[0] ? other_us : "-", ratio, gf, peak > 0 ? 100 * gf / peak : 0.0);
        fflush(stdout);
        if (o->csv) {
            fprintf(o->csv, "%s,%d,%lld,%lld,%d,%d,fp32,%s,%.2f,%s,%.1f,%.1f,", c->op, c->threads,
                    (long long)c->T, (long long)c->B, H, HV, layout, r.fq_us, other_us, peak, gf);
            for (const char *s = o->machine; *s; s++) /* no commas inside a field */
                fputc(*s == ',' ? ';' : *s, o->csv);
            fprintf(o->csv, ",%s,%s\n", o->commit, date);
            fflush(o->csv);
        }
    }
    return 0;
}
