/*
 * bench_cpu.c - the fast CPU backend (FQLA_BACKEND_CPU) against ggml's
 * ggml_gated_delta_net (the op llama.cpp runs for Qwen3.5's linear attention)
 * on the same fp32 inputs, and both against this machine's FMA peak, all
 * measured in one run (issue 43). H = 16, HV = 32, K = V = 128 by default.
 *
 * Rows (op, threads, T, batch, layout):
 *   decode   T = 1, B = 1 and 16, 1 thread, state pool [K, V] ("kv") and
 *            [V, K] ("vk", ggml's own layout); flashqla updates the pool in
 *            place, ggml reads the state and writes the new one to its output
 *   verify   T = 4 (op "decode", layout kv / vk), B = 1: flashqla's fqla_verify
 *            with step_states, ggml's call with 4 state snapshots
 *   prefill  T = 4096, B = 1, 1 and 2 threads: fqla_fwd (chunked) with an
 *            initial and a final state, ggml's token recurrence
 * Both run the plain recurrence (no in-kernel l2norm / gate / sigmoid: q and k
 * are l2-normalised rows, g = logsigmoid(randn) / 16, beta = sigmoid(randn)),
 * the state stays in cache between calls ("state in cache").
 *
 * Timing: each row runs flashqla and ggml alternately, --repeat rounds of
 * a batch of calls each (sized to ~20 ms), and keeps each side's best batch
 * (the least disturbed on a shared machine); the ratio of the two is what
 * holds from machine to machine. The FMA peak is a loop of independent FMA
 * chains (AVX-512 where the CPU has it, else AVX2 + FMA) on one thread, run
 * in the same process; achieved_gflops counts the useful flops of the
 * algorithm flashqla runs (decode: 7 K V per token and head; prefill: the
 * chunked algorithm's products with triangles counted as half).
 *
 * Output: a Markdown table on stdout and, with --csv FILE, one line per row
 * appended (the header written when the file is new):
 *   op,threads,T,batch,h_qk,h_v,dtype,layout,flashqla_us,ggml_us,peak_gflops,achieved_gflops,machine,commit,date
 * ggml_us is empty when the bench was built without ggml.
 *
 * Build without ggml (repository root):
 *   cc -O2 -march=x86-64-v2 -std=c99 -D_POSIX_C_SOURCE=200809L -Iinclude -Isrc -pthread \
 *      bench/bench_cpu.c build/libflashqla.a -lm -o build/bench_cpu      (after make CUDA=0)
 * With ggml (built outside the repository by dev/cpu/build_ggml.sh SRC BUILD):
 *   dev/cpu/bench_cpu.sh SRC BUILD [bench options]
 * Run: build/bench_cpu [--repeat 5] [--prefill-T 4096] [--csv bench/results/cpu.csv]
 *                      [--machine NAME] [--commit SHA] [--no-prefill] [--no-decode]
 */
#include "flashqla.h"

#ifdef FQLA_BENCH_GGML
#include "ggml.h"
#include "ggml-cpu.h"
#endif

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { H = 16, HV = 32, K = 128, V = 128, C64 = 64 };

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
        fprintf(stderr, "bench_cpu: out of memory (%zu bytes)\n", n);
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

/* ---- the machine's FMA peak ---- */

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
static double fma_peak(int repeat)
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

/* ---- one benchmark case: flashqla and ggml on the same inputs ---- */

typedef struct bcase {
    const char *op;    /* "decode" or "prefill" */
    int threads, verify, v_first;
    int64_t T, B;
} bcase;

typedef struct inputs {
    float *q, *k, *v, *g, *beta, *state; /* q, k [B, T, H, K]; v [B, T, HV, V]; g, beta [B, T, HV]; state [B, HV, K, V] or [.., V, K] */
    float *o, *state_out;                /* flashqla's o [B, T, HV, V]; steps / final state */
    int64_t *slots;
} inputs;

static inputs inputs_make(const bcase *c)
{
    inputs in;
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

static void inputs_free(inputs *in)
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

static fqla_status run_flashqla(fqla_context *ctx, const bcase *c, inputs *in)
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

#ifdef FQLA_BENCH_GGML
typedef struct ggml_side {
    struct ggml_context *ctx;
    struct ggml_cgraph *graph;
    struct ggml_threadpool *pool;
    struct ggml_cplan plan;
    uint8_t *work;
} ggml_side;

/* ggml's tensors over copies of the same inputs (ggml's layout: innermost
 * first, so q [K, H, T, B] is flashqla's [B, T, H, K] memory as is; the
 * state [V(j), K(i), HV, B] with S[i][j] at j * K + i, i.e. the vk pool). */
static int ggml_make(ggml_side *s, const bcase *c, const inputs *in)
{
    int64_t B = c->B, T = c->T;
    size_t bytes = (size_t)(B * T * (2 * H * K + HV * V + 2 * HV) + B * HV * K * V) * sizeof(float);
    size_t out = (size_t)(B * T * HV * V + B * HV * K * V * (c->verify ? T : 1)) * sizeof(float);
    struct ggml_init_params ip = {bytes + out + 64 * 1024 * 1024, NULL, false};
    s->ctx = ggml_init(ip);
    if (!s->ctx)
        return -1;
    struct ggml_tensor *q = ggml_new_tensor_4d(s->ctx, GGML_TYPE_F32, K, H, T, B);
    struct ggml_tensor *k = ggml_new_tensor_4d(s->ctx, GGML_TYPE_F32, K, H, T, B);
    struct ggml_tensor *v = ggml_new_tensor_4d(s->ctx, GGML_TYPE_F32, V, HV, T, B);
    struct ggml_tensor *g = ggml_new_tensor_4d(s->ctx, GGML_TYPE_F32, 1, HV, T, B);
    struct ggml_tensor *be = ggml_new_tensor_4d(s->ctx, GGML_TYPE_F32, 1, HV, T, B);
    struct ggml_tensor *st = ggml_new_tensor_4d(s->ctx, GGML_TYPE_F32, V, V, HV, B);
    memcpy(ggml_get_data(q), in->q, ggml_nbytes(q));
    memcpy(ggml_get_data(k), in->k, ggml_nbytes(k));
    memcpy(ggml_get_data(v), in->v, ggml_nbytes(v));
    memcpy(ggml_get_data(g), in->g, ggml_nbytes(g));
    memcpy(ggml_get_data(be), in->beta, ggml_nbytes(be));
    memcpy(ggml_get_data(st), in->state, ggml_nbytes(st));
    struct ggml_tensor *r = ggml_gated_delta_net(s->ctx, q, k, v, g, be, st, c->verify ? T : 1);
    s->graph = ggml_new_graph(s->ctx);
    ggml_build_forward_expand(s->graph, r);
    struct ggml_threadpool_params tp = ggml_threadpool_params_default(c->threads);
    s->pool = ggml_threadpool_new(&tp);
    s->plan = ggml_graph_plan(s->graph, c->threads, s->pool);
    s->work = xmalloc(s->plan.work_size + 64);
    s->plan.work_data = s->work;
    return 0;
}

static int ggml_run(ggml_side *s) { return ggml_graph_compute(s->graph, &s->plan) == GGML_STATUS_SUCCESS ? 0 : -1; }

static void ggml_drop(ggml_side *s)
{
    ggml_threadpool_free(s->pool);
    free(s->work);
    ggml_free(s->ctx);
}
#endif

/* useful flops of the algorithm flashqla runs */
static double case_flops(const bcase *c)
{
    double kv = (double)K * V, tok = (double)c->B * c->T * HV;
    if (!strcmp(c->op, "decode"))
        return tok * 7 * kv;
    /* per token and value head: W = [Q; K] S (4KV), S update (2KV), U and O
     * (triangles: C V each), Q K^T and K K^T (C K, shared by the group) */
    return tok * (6 * kv + 2.0 * C64 * V + 2.0 * C64 * K * H / HV);
}

typedef struct row_result {
    double fq_us, gg_us; /* best per call; gg_us < 0: not measured */
} row_result;

static row_result bench_case(const bcase *c, int repeat)
{
    row_result res = {-1, -1};
    inputs in = inputs_make(c);
    fqla_context *ctx = NULL;
    if (fqla_context_create(&ctx, FQLA_BACKEND_CPU, 0) != FQLA_STATUS_SUCCESS ||
        fqla_context_set_threads(ctx, c->threads) != FQLA_STATUS_SUCCESS) {
        fprintf(stderr, "bench_cpu: context: %s\n", fqla_last_error(NULL));
        exit(1);
    }
    /* calls per batch: ~20 ms of flashqla */
    if (run_flashqla(ctx, c, &in) != FQLA_STATUS_SUCCESS) {
        fprintf(stderr, "bench_cpu: flashqla %s: %s\n", c->op, fqla_last_error(ctx));
        exit(1);
    }
    double t0 = now();
    run_flashqla(ctx, c, &in);
    double one = now() - t0;
    int calls = one > 0.02 ? 1 : (int)(0.02 / (one > 1e-7 ? one : 1e-7)) + 1;
#ifdef FQLA_BENCH_GGML
    ggml_side gs;
    int have_ggml = ggml_make(&gs, c, &in) == 0 && ggml_run(&gs) == 0;
#endif
    for (int r = 0; r < repeat; r++) {
        t0 = now();
        for (int i = 0; i < calls; i++)
            run_flashqla(ctx, c, &in);
        double us = (now() - t0) / calls * 1e6;
        if (res.fq_us < 0 || us < res.fq_us)
            res.fq_us = us;
#ifdef FQLA_BENCH_GGML
        if (have_ggml) {
            t0 = now();
            for (int i = 0; i < calls; i++)
                ggml_run(&gs);
            us = (now() - t0) / calls * 1e6;
            if (res.gg_us < 0 || us < res.gg_us)
                res.gg_us = us;
        }
#endif
    }
#ifdef FQLA_BENCH_GGML
    if (have_ggml)
        ggml_drop(&gs);
#endif
    fqla_context_destroy(ctx);
    inputs_free(&in);
    return res;
}

int main(int argc, char **argv)
{
    int repeat = 5, do_prefill = 1, do_decode = 1;
    int64_t prefill_T = 4096;
    const char *csv = NULL, *machine = "cpu", *commit = "unknown";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--repeat") && i + 1 < argc) repeat = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--prefill-T") && i + 1 < argc) prefill_T = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--csv") && i + 1 < argc) csv = argv[++i];
        else if (!strcmp(argv[i], "--machine") && i + 1 < argc) machine = argv[++i];
        else if (!strcmp(argv[i], "--commit") && i + 1 < argc) commit = argv[++i];
        else if (!strcmp(argv[i], "--no-prefill")) do_prefill = 0;
        else if (!strcmp(argv[i], "--no-decode")) do_decode = 0;
        else {
            fprintf(stderr, "usage: %s [--repeat N] [--prefill-T T] [--csv FILE] [--machine NAME] [--commit SHA] "
                            "[--no-prefill] [--no-decode]\n", argv[0]);
            return 2;
        }
    }
    if (repeat < 1) repeat = 1;
    bcase cases[] = {
        {"decode", 1, 0, 0, 1, 1},  {"decode", 1, 0, 1, 1, 1},
        {"decode", 1, 0, 0, 1, 16}, {"decode", 1, 0, 1, 1, 16},
        {"decode", 1, 1, 0, 4, 1},  {"decode", 1, 1, 1, 4, 1},
        {"prefill", 1, 0, 0, prefill_T, 1}, {"prefill", 2, 0, 0, prefill_T, 1},
    };
    double peak = fma_peak(repeat);
    char date[32];
    time_t tt = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&tt));
    FILE *f = NULL;
    if (csv) {
        FILE *probe = fopen(csv, "r");
        int fresh = probe == NULL;
        if (probe) fclose(probe);
        f = fopen(csv, "a");
        if (!f) {
            fprintf(stderr, "bench_cpu: cannot append to %s\n", csv);
            return 1;
        }
        if (fresh)
            fprintf(f, "op,threads,T,batch,h_qk,h_v,dtype,layout,flashqla_us,ggml_us,peak_gflops,achieved_gflops,machine,commit,date\n");
    }
    printf("FMA peak (1 thread): %.1f GFLOP/s\n\n", peak);
    printf("| op | threads | T | batch | layout | flashqla us | ggml us | ggml / flashqla | GFLOP/s | of peak |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const bcase *c = &cases[i];
        int prefill = !strcmp(c->op, "prefill");
        if ((prefill && !do_prefill) || (!prefill && !do_decode))
            continue;
        row_result r = bench_case(c, repeat);
        double gf = case_flops(c) / (r.fq_us * 1e-6) * 1e-9;
        char gg[32] = "", ratio[32] = "-";
        if (r.gg_us >= 0) {
            snprintf(gg, sizeof gg, "%.1f", r.gg_us);
            snprintf(ratio, sizeof ratio, "%.2fx", r.gg_us / r.fq_us);
        }
        const char *layout = c->v_first ? "vk" : "kv";
        printf("| %s%s | %d | %lld | %lld | %s | %.1f | %s | %s | %.1f | %.0f %% |\n", c->op,
               c->verify ? " (verify)" : "", c->threads, (long long)c->T, (long long)c->B, layout, r.fq_us,
               gg[0] ? gg : "-", ratio, gf, peak > 0 ? 100 * gf / peak : 0.0);
        fflush(stdout);
        if (f)
            fprintf(f, "%s,%d,%lld,%lld,%d,%d,fp32,%s,%.2f,%s,%.1f,%.1f,%s,%s,%s\n", c->op, c->threads,
                    (long long)c->T, (long long)c->B, H, HV, layout, r.fq_us, gg, peak, gf, machine, commit, date);
    }
    if (f)
        fclose(f);
    return 0;
}
