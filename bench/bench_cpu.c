/*
 * bench_cpu.c - tokens/s of the fast CPU backend (FQLA_BACKEND_CPU) on the
 * default layer (B = 1, T = 8192, H = 16, HV = 32, K = V = 128, bf16 q/k/v/o,
 * fp32 g/beta/states, the inputs of `flashqla run`: q, k l2-normalised rows,
 * g = logsigmoid(randn) / 16 with a quarter of the value heads not decaying,
 * beta = sigmoid(randn), h0 = randn), against the baselines it must beat:
 *
 *   chunked fwd / bwd   fqla_fwd / fqla_bwd on FQLA_BACKEND_CPU, 1 and 2 threads
 *   plain recurrence    the token recurrence of docs/design.md §1 in fp32, written
 *                       plainly (below, plain_recurrence), heads over threads
 *   tuned recurrence    the same recurrence through fqla_verify (the backend's
 *                       decode path: two fused, vectorised passes over the
 *                       state per token), T draft tokens, no step states kept
 *   fp64 reference      FQLA_BACKEND_CPU_REFERENCE, on a shorter T and scaled
 *                       linearly to T (its cost is linear in T; marked "est.")
 *
 * Every timed figure is the best of --repeat runs after one untimed run
 * (buffers warm, pages mapped): on a shared machine the fastest run is the
 * one least disturbed by other work. The output is a Markdown table; with --csv
 * FILE one line per row is appended as
 *   op,impl,threads,T_measured,seconds,tokens_per_s,host,commit,date
 *
 * Build (CPU only, no Makefile needed: the library's C sources are compiled
 * in, without CUDA), from the repository root:
 *   mkdir -p build && cc -O2 -march=x86-64-v2 -std=c99 -D_POSIX_C_SOURCE=200809L \
 *      -Iinclude -Isrc -pthread bench/bench_cpu.c $(find src -name '*.c') -lm \
 *      -o build/bench_cpu
 * Run:
 *   build/bench_cpu [--T 8192] [--ref-T 256] [--plain-T 1024] [--repeat 3]
 *                   [--threads 2] [--no-bwd] [--csv bench/results/cpu-local.csv]
 */
#include "flashqla.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum { B = 1, H = 16, HV = 32, K = 128, V = 128 };

typedef struct layer {
    int64_t T;
    uint16_t *q, *k, *v, *o;   /* bf16 */
    float *g, *beta, *h0, *ht;
    /* fp32 copies for the plain recurrence */
    float *qf, *kf, *vf, *of;
} layer;

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

/* ---- inputs ---- */

static uint64_t rng = 0x243f6a8885a308d3ull;
static double uniform(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return ((rng >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
static double normal(void) { return sqrt(-2.0 * log(uniform())) * cos(6.283185307179586 * uniform()); }

static uint16_t to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float from_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

static void fill_rows(uint16_t *dst, float *dstf, int64_t rows, int64_t n, int normalise)
{
    double *tmp = xmalloc((size_t)n * sizeof *tmp);
    for (int64_t r = 0; r < rows; r++) {
        double ss = 0;
        for (int64_t i = 0; i < n; i++) {
            tmp[i] = normal();
            ss += tmp[i] * tmp[i];
        }
        double s = normalise ? 1.0 / sqrt(ss) : 1.0;
        for (int64_t i = 0; i < n; i++) {
            dst[r * n + i] = to_bf16((float)(tmp[i] * s));
            dstf[r * n + i] = from_bf16(dst[r * n + i]);
        }
    }
    free(tmp);
}

static layer layer_make(int64_t T)
{
    layer L;
    size_t nq = (size_t)(B * T * H * K), nv = (size_t)(B * T * HV * V), ng = (size_t)(B * T * HV);
    size_t ns = (size_t)(B * HV * K * V);
    L.T = T;
    L.q = xmalloc(nq * 2);
    L.k = xmalloc(nq * 2);
    L.v = xmalloc(nv * 2);
    L.o = xmalloc(nv * 2);
    L.qf = xmalloc(nq * 4);
    L.kf = xmalloc(nq * 4);
    L.vf = xmalloc(nv * 4);
    L.of = xmalloc(nv * 4);
    L.g = xmalloc(ng * 4);
    L.beta = xmalloc(ng * 4);
    L.h0 = xmalloc(ns * 4);
    L.ht = xmalloc(ns * 4);
    fill_rows(L.q, L.qf, B * T * H, K, 1);
    fill_rows(L.k, L.kf, B * T * H, K, 1);
    fill_rows(L.v, L.vf, B * T * HV, V, 0);
    for (size_t i = 0; i < ng; i++) {
        int64_t h = (int64_t)(i % HV);
        double x = normal();
        double ls = x >= 0 ? -log1p(exp(-x)) : x - log1p(exp(x));
        L.g[i] = h >= (3 * HV + 3) / 4 ? 0.0f : (float)(ls / 16.0); /* a quarter of the heads do not decay */
        L.beta[i] = (float)(1.0 / (1.0 + exp(-normal())));
    }
    for (size_t i = 0; i < ns; i++)
        L.h0[i] = (float)normal();
    return L;
}

static void layer_free(layer *L)
{
    free(L->q); free(L->k); free(L->v); free(L->o); free(L->qf); free(L->kf); free(L->vf);
    free(L->of); free(L->g); free(L->beta); free(L->h0); free(L->ht);
}

/* The forward args of the layer's first T tokens (rows are [B, T, ...] with
 * B = 1, so a prefix of the buffers is a shorter layer). */
static fqla_fwd_args fwd_args(layer *L, int64_t T, fqla_dtype io)
{
    fqla_fwd_args a;
    int64_t sq[4] = {B, T, H, K}, sv[4] = {B, T, HV, V}, sg[3] = {B, T, HV}, ss[4] = {B, HV, K, V};
    fqla_fwd_args_init(&a);
    a.q = fqla_tensor_contiguous(io == FQLA_DTYPE_BF16 ? (void *)L->q : (void *)L->qf, io, 4, sq);
    a.k = fqla_tensor_contiguous(io == FQLA_DTYPE_BF16 ? (void *)L->k : (void *)L->kf, io, 4, sq);
    a.v = fqla_tensor_contiguous(io == FQLA_DTYPE_BF16 ? (void *)L->v : (void *)L->vf, io, 4, sv);
    a.o = fqla_tensor_contiguous(io == FQLA_DTYPE_BF16 ? (void *)L->o : (void *)L->of, io, 4, sv);
    a.g = fqla_tensor_contiguous(L->g, FQLA_DTYPE_F32, 3, sg);
    a.beta = fqla_tensor_contiguous(L->beta, FQLA_DTYPE_F32, 3, sg);
    a.initial_state = fqla_tensor_contiguous(L->h0, FQLA_DTYPE_F32, 4, ss);
    a.final_state = fqla_tensor_contiguous(L->ht, FQLA_DTYPE_F32, 4, ss);
    return a;
}

/* ---- the plain fp32 token recurrence (the baseline to beat) ---- */

typedef struct plain_job {
    layer *L;
    int64_t T;
    int h0, h1;
} plain_job;

static void *plain_recurrence(void *vp)
{
    plain_job *j = vp;
    const layer *L = j->L;
    float *S = xmalloc((size_t)(K * V) * sizeof *S), w[V], u[V];
    float scale = 1.0f / sqrtf((float)K);
    for (int h = j->h0; h < j->h1; h++) {
        int hk = h / (HV / H);
        memcpy(S, L->h0 + (size_t)h * K * V, sizeof(float) * K * V);
        for (int64_t t = 0; t < j->T; t++) {
            const float *q = L->qf + (t * H + hk) * K, *k = L->kf + (t * H + hk) * K;
            const float *v = L->vf + (t * HV + h) * V;
            float a = expf(L->g[t * HV + h]), beta = L->beta[t * HV + h];
            float *o = L->of + (t * HV + h) * V;
            for (int i = 0; i < K * V; i++)
                S[i] *= a;
            for (int j2 = 0; j2 < V; j2++)
                w[j2] = 0;
            for (int i = 0; i < K; i++)
                for (int j2 = 0; j2 < V; j2++)
                    w[j2] += k[i] * S[i * V + j2];
            for (int j2 = 0; j2 < V; j2++)
                u[j2] = beta * (v[j2] - w[j2]);
            for (int i = 0; i < K; i++)
                for (int j2 = 0; j2 < V; j2++)
                    S[i * V + j2] += k[i] * u[j2];
            for (int j2 = 0; j2 < V; j2++) {
                float acc = 0;
                for (int i = 0; i < K; i++)
                    acc += S[i * V + j2] * q[i];
                o[j2] = scale * acc;
            }
        }
    }
    free(S);
    return NULL;
}

static void run_plain(layer *L, int64_t T, int threads)
{
    pthread_t tid[64];
    plain_job jobs[64];
    for (int w = 0; w < threads; w++) {
        jobs[w].L = L;
        jobs[w].T = T;
        jobs[w].h0 = HV * w / threads;
        jobs[w].h1 = HV * (w + 1) / threads;
        if (w > 0)
            pthread_create(&tid[w], NULL, plain_recurrence, &jobs[w]);
    }
    plain_recurrence(&jobs[0]);
    for (int w = 1; w < threads; w++)
        pthread_join(tid[w], NULL);
}

/* ---- timing ---- */

static int repeat = 3;

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

typedef enum { RUN_FWD, RUN_BWD, RUN_VERIFY, RUN_PLAIN } run_kind;

typedef struct bwd_bufs {
    uint16_t *d_o, *dq, *dk, *dv;
    float *dg, *dbeta, *dh0, *dht;
} bwd_bufs;

static fqla_context *make_ctx(fqla_backend be, int threads)
{
    fqla_context *ctx = NULL;
    if (fqla_context_create(&ctx, be, 0) != FQLA_STATUS_SUCCESS) {
        fprintf(stderr, "context: %s\n", fqla_last_error(NULL));
        exit(1);
    }
    fqla_context_set_threads(ctx, threads);
    return ctx;
}

/* One call of the chosen operation; returns seconds. */
static double run_once(run_kind kind, fqla_context *ctx, layer *L, int64_t T, int threads, bwd_bufs *bb)
{
    fqla_status st = FQLA_STATUS_SUCCESS;
    double t0 = now();
    if (kind == RUN_PLAIN) {
        run_plain(L, T, threads);
    } else if (kind == RUN_FWD) {
        fqla_fwd_args a = fwd_args(L, T, FQLA_DTYPE_BF16);
        st = fqla_fwd(ctx, &a, NULL, 0, NULL);
    } else if (kind == RUN_BWD) {
        fqla_fwd_args f = fwd_args(L, T, FQLA_DTYPE_BF16);
        fqla_bwd_args a;
        int64_t sq[4] = {B, T, H, K}, sv[4] = {B, T, HV, V}, sg[3] = {B, T, HV}, ss[4] = {B, HV, K, V};
        fqla_bwd_args_init(&a);
        a.q = f.q; a.k = f.k; a.v = f.v; a.g = f.g; a.beta = f.beta; a.initial_state = f.initial_state;
        a.d_o = fqla_tensor_contiguous(bb->d_o, FQLA_DTYPE_BF16, 4, sv);
        a.d_final_state = fqla_tensor_contiguous(bb->dht, FQLA_DTYPE_F32, 4, ss);
        a.dq = fqla_tensor_contiguous(bb->dq, FQLA_DTYPE_BF16, 4, sq);
        a.dk = fqla_tensor_contiguous(bb->dk, FQLA_DTYPE_BF16, 4, sq);
        a.dv = fqla_tensor_contiguous(bb->dv, FQLA_DTYPE_BF16, 4, sv);
        a.dg = fqla_tensor_contiguous(bb->dg, FQLA_DTYPE_F32, 3, sg);
        a.dbeta = fqla_tensor_contiguous(bb->dbeta, FQLA_DTYPE_F32, 3, sg);
        a.d_initial_state = fqla_tensor_contiguous(bb->dh0, FQLA_DTYPE_F32, 4, ss);
        st = fqla_bwd(ctx, &a, NULL, 0, NULL);
    } else {
        /* the token recurrence of the decode path: verify T tokens of one
         * sequence from pool entry 0 (= h0), keeping no step state */
        fqla_fwd_args f = fwd_args(L, T, FQLA_DTYPE_BF16);
        fqla_decode_args a;
        int64_t sp[4] = {1, HV, K, V}, sl[1] = {1}, sst[2] = {1, T};
        static int64_t slot0 = 0;
        int64_t *steps = xmalloc((size_t)T * sizeof *steps);
        for (int64_t t = 0; t < T; t++)
            steps[t] = -1;
        fqla_decode_args_init(&a);
        a.q = f.q; a.k = f.k; a.v = f.v; a.g = f.g; a.beta = f.beta; a.o = f.o;
        a.state_pool = fqla_tensor_contiguous(L->ht, FQLA_DTYPE_F32, 4, sp);
        memcpy(L->ht, L->h0, sizeof(float) * HV * K * V);
        a.slots = fqla_tensor_contiguous(&slot0, FQLA_DTYPE_I64, 1, sl);
        a.step_slots = fqla_tensor_contiguous(steps, FQLA_DTYPE_I64, 2, sst);
        t0 = now();
        st = fqla_verify(ctx, &a, NULL, 0, NULL);
        double t1 = now();
        free(steps);
        if (st != FQLA_STATUS_SUCCESS) {
            fprintf(stderr, "verify: %s\n", fqla_last_error(ctx));
            exit(1);
        }
        return t1 - t0;
    }
    double t1 = now();
    if (st != FQLA_STATUS_SUCCESS) {
        fprintf(stderr, "run: %s: %s\n", fqla_status_string(st), fqla_last_error(ctx));
        exit(1);
    }
    return t1 - t0;
}

/* Best of `reps` timed runs after one untimed run. */
static double timed(run_kind kind, fqla_context *ctx, layer *L, int64_t T, int threads, bwd_bufs *bb, int reps)
{
    double ts[32];
    if (reps > 32)
        reps = 32;
    run_once(kind, ctx, L, T, threads, bb);
    for (int r = 0; r < reps; r++)
        ts[r] = run_once(kind, ctx, L, T, threads, bb);
    qsort(ts, (size_t)reps, sizeof ts[0], cmp_double);
    return ts[0];
}

/* The 1-minute load average: on a shared machine, how disturbed a run was. */
static double loadavg(void)
{
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1)
            l = -1;
        fclose(f);
    }
    return l;
}

static FILE *csv;
static char host[128] = "unknown";

static void row(const char *op, const char *impl, int threads, int64_t T_meas, int64_t T, double seconds,
                double base_tps)
{
    double total = seconds * (double)T / (double)T_meas; /* linear in T */
    double tps = (double)(B * T) / total;
    char ratio[32] = "-";
    if (base_tps > 0)
        snprintf(ratio, sizeof ratio, "%.2fx", tps / base_tps);
    printf("| %s | %s | %d | %lld | %.3f%s | %.0f | %s |\n", op, impl, threads, (long long)T_meas, total,
           T_meas == T ? "" : " (est.)", tps, ratio);
    fflush(stdout);
    if (csv) {
        time_t tt = time(NULL);
        char date[32];
        strftime(date, sizeof date, "%Y-%m-%d", gmtime(&tt));
        fprintf(csv, "%s,%s,%d,%lld,%.6f,%.1f,%s,%s,%s\n", op, impl, threads, (long long)T_meas, seconds,
                (double)(B * T_meas) / seconds, host, getenv("FQLA_COMMIT") ? getenv("FQLA_COMMIT") : "", date);
        fflush(csv);
    }
}

int main(int argc, char **argv)
{
    int64_t T = 8192, ref_T = 256, plain_T = 1024;
    int max_threads = 2, do_bwd = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--T") && i + 1 < argc) T = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--ref-T") && i + 1 < argc) ref_T = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--plain-T") && i + 1 < argc) plain_T = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--repeat") && i + 1 < argc) repeat = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) max_threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-bwd")) do_bwd = 0;
        else if (!strcmp(argv[i], "--csv") && i + 1 < argc) csv = fopen(argv[++i], "a");
        else {
            fprintf(stderr, "usage: %s [--T N] [--ref-T N] [--plain-T N] [--repeat N] [--threads N] [--no-bwd] [--csv FILE]\n",
                    argv[0]);
            return 2;
        }
    }
    if (ref_T > T) ref_T = T;
    if (plain_T > T) plain_T = T;
    if (max_threads < 1 || max_threads > 64) max_threads = 2;

    FILE *ci = fopen("/proc/cpuinfo", "r");
    if (ci) {
        char line[256];
        while (fgets(line, sizeof line, ci))
            if (!strncmp(line, "model name", 10)) {
                char *c = strchr(line, ':');
                if (c) {
                    snprintf(host, sizeof host, "%s", c + 2);
                    host[strcspn(host, "\n")] = 0;
                    for (char *p = host; *p; p++)
                        if (*p == ',') *p = ';';
                }
                break;
            }
        fclose(ci);
    }
    printf("layer B=%d T=%lld H=%d HV=%d K=V=%d, bf16 q/k/v/o, fp32 g/beta/states; host: %s; best of %d\n\n",
           B, (long long)T, H, HV, K, host, repeat);
    printf("(1-minute load average before: %.2f)\n\n", loadavg());
    printf("| op | implementation | threads | T measured | seconds for T=%lld | tokens/s | vs plain, same threads |\n",
           (long long)T);
    printf("|---|---|---|---|---|---|---|\n");

    layer L = layer_make(T);
    bwd_bufs bb;
    size_t nq = (size_t)(B * T * H * K), nv = (size_t)(B * T * HV * V), ng = (size_t)(B * T * HV);
    size_t ns = (size_t)(B * HV * K * V);
    bb.d_o = xmalloc(nv * 2);
    bb.dq = xmalloc(nq * 2);
    bb.dk = xmalloc(nq * 2);
    bb.dv = xmalloc(nv * 2);
    bb.dg = xmalloc(ng * 4);
    bb.dbeta = xmalloc(ng * 4);
    bb.dh0 = xmalloc(ns * 4);
    bb.dht = xmalloc(ns * 4);
    for (size_t i = 0; i < nv; i++)
        bb.d_o[i] = to_bf16((float)normal());
    for (size_t i = 0; i < ns; i++)
        bb.dht[i] = (float)normal();

    for (int th = 1; th <= max_threads; th++) {
        fqla_context *cpu = make_ctx(FQLA_BACKEND_CPU, th);
        double plain = timed(RUN_PLAIN, NULL, &L, plain_T, th, NULL, 1);
        double plain_tps = (double)(B * plain_T) / plain;
        row("fwd", "plain fp32 token recurrence", th, plain_T, T, plain, plain_tps);
        row("fwd", "tuned fp32 token recurrence (fqla_verify)", th, T, T,
            timed(RUN_VERIFY, cpu, &L, T, th, NULL, repeat), plain_tps);
        row("fwd", "chunked fp32 (FQLA_BACKEND_CPU)", th, T, T, timed(RUN_FWD, cpu, &L, T, th, NULL, repeat),
            plain_tps);
        if (do_bwd)
            row("bwd", "chunked fp32 (FQLA_BACKEND_CPU)", th, T, T, timed(RUN_BWD, cpu, &L, T, th, &bb, repeat),
                plain_tps);
        fqla_context_destroy(cpu);
    }
    fqla_context *ref = make_ctx(FQLA_BACKEND_CPU_REFERENCE, max_threads);
    row("fwd", "fp64 reference (FQLA_BACKEND_CPU_REFERENCE)", max_threads, ref_T, T,
        timed(RUN_FWD, ref, &L, ref_T, max_threads, NULL, 1), 0);
    if (do_bwd)
        row("bwd", "fp64 reference (FQLA_BACKEND_CPU_REFERENCE)", max_threads, ref_T, T,
            timed(RUN_BWD, ref, &L, ref_T, max_threads, &bb, 1), 0);
    fqla_context_destroy(ref);

    printf("\n(1-minute load average after: %.2f)\n", loadavg());
    free(bb.d_o); free(bb.dq); free(bb.dk); free(bb.dv); free(bb.dg); free(bb.dbeta); free(bb.dh0); free(bb.dht);
    layer_free(&L);
    if (csv)
        fclose(csv);
    return 0;
}
