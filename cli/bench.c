/*
 * bench.c - `flashqla bench`: the forward rows of docs/benchmarks.md, run from C
 * (for users without Python). Reads the rows (op, model, h_qk, h_v, seqlens and
 * the published anchors) from bench/anchors_h200.csv, builds each row's
 * docs/benchmarks.md inputs (one packed varlen row, K = V = 128, bf16 or --dtype's
 * q/k/v, h0 and the final state on), times the whole forward, checks the
 * row's configuration on a prefix of every sequence against the fp64
 * reference, prints one line per row, appends records in the docs/benchmarks.md
 * format and ends with a summary.
 *
 * The GPU and CPU paths share everything except where the buffers live and
 * how a batch of calls is timed (cudaEvents after an L2 flush, or the wall
 * clock): see time_batch().
 */
#include "cpu_edge.h"
#include "layer.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#define BACKEND_AUTO (-1)
#define QUICK_ROWS 6
#define GPU_CALLS 8         /* back-to-back calls per timed GPU batch */
#define FLUSH_BYTES ((size_t)256 << 20)

typedef struct bench_opts {
    int backend;
    const char *rows_path;
    int quick;
    const char *filter;
    int repeat;             /* timed batches; -1: 10 on the GPU, 3 on the CPU */
    const char *out_path;
    int64_t check_tokens;
    double scale;           /* --scale-tokens; 1 = the real rows */
    double tol;             /* 0: docs/testing.md's for the dtype (5e-3 bf16 / fp16, 1e-4 fp32) */
    fqla_dtype io;          /* q, k, v, o */
    int scale_given;
    int threads, device;
    uint64_t seed;
    int edge;               /* --edge: issue 43's CPU rows (cli/cpu_edge.h) instead of the fwd rows */
} bench_opts;

typedef struct bench_row {
    char model[96], seqlens[64];
    int64_t h_qk, h_v;
    double anchor_ms, fla_ms;  /* published; <= 0 when absent */
} bench_row;

static void bench_usage(FILE *f)
{
    fprintf(f,
        "usage: flashqla bench [options]\n"
        "\n"
        "Times the forward rows of docs/benchmarks.md (bench/anchors_h200.csv): packed varlen\n"
        "sequences, K=V=128, bf16 q/k/v, fp32 gate/beta/state, h0 and final state on. Each row\n"
        "is also checked on a prefix of every sequence against the fp64 reference (5e-3).\n"
        "With --dtype fp16 / fp32 the rows are recorded as 'MODEL fp16' / 'MODEL fp32' and not\n"
        "compared with the published (bf16) numbers.\n"
        "\n"
        "  --backend B        auto | cuda (or gpu) | cpu (default auto: cuda when available)\n"
        "  --rows FILE        rows CSV with columns op,model,h_qk,h_v,seqlens[,flashqla_ms,fla_ms]\n"
        "                     (default bench/anchors_h200.csv; only op=fwd rows are run)\n"
        "  --quick            a handful of rows spread over the table\n"
        "  --filter S         only rows whose 'model seqlens' contains S (e.g. 'TP8' or '1x8192')\n"
        "  --scale-tokens F   multiply every sequence length by F (0 < F <= 1; rows are then\n"
        "                     recorded with an '*F' suffix and not compared with the anchors)\n"
        "  --repeat N         timed batches, median reported (default 10 on the GPU, each of %d\n"
        "                     back-to-back calls after a 256 MB L2 flush; 3 single calls on the CPU)\n"
        "  --out CSV          append passing rows here (default build/bench/fwd-<gpu>-cli.csv,\n"
        "                     build/bench/cpu-bench.csv on the CPU, under the current folder;\n"
        "                     give bench/results/... to add them to the checkout's records); the commit field is\n"
        "                     $FQLA_COMMIT, else the commit the program was built from\n"
        "  --check-tokens N   tokens per sequence checked against the reference (default 256, 0 = none)\n"
        "  --dtype D          bf16 | fp16 | fp32 for q, k, v, o (default bf16)\n"
        "  --tol X            error threshold of the check (default docs/testing.md's for the dtype:\n"
        "                     5e-3 for bf16 and fp16, 1e-4 for fp32)\n"
        "  --threads N        CPU worker threads 0..1024, 0 = all cores (default 0)\n"
        "  --device N         CUDA device (default 0)\n"
        "  --seed N           input seed (default 1)\n"
        "\n"
        "The CPU backend is far too slow for the full rows: with --backend cpu (or auto without a\n"
        "GPU) one of --quick, --filter or --scale-tokens is required.\n"
        "\n"
        "  --edge             instead of the forward rows, the CPU backend's decode, verify and\n"
        "                     prefill rows of bench/results/cpu.csv (fp32, H=16, HV=32, K=V=128;\n"
        "                     decode T=1 B=1,16 and verify T=4 in both pool layouts, prefill T=4096\n"
        "                     on 1 and 2 threads) with the machine's FMA peak measured in the same\n"
        "                     run; --repeat (default 5), --out (default build/bench/cpu.csv) and\n"
        "                     --scale-tokens (of the prefill T) apply. The ggml column is filled\n"
        "                     by bench/bench_cpu.c built with ggml (dev/cpu/bench_cpu.sh), not here.\n"
        "Summary ratios are against the published numbers in the rows file, not same-process.\n"
        "Exit status: 0 pass, 1 a failed call or check, 2 bad options.\n", GPU_CALLS);
}

static int parse_bench_opts(int argc, char **argv, bench_opts *o)
{
    memset(o, 0, sizeof *o);
    o->backend = BACKEND_AUTO;
    o->rows_path = "bench/anchors_h200.csv";
    o->repeat = -1;
    o->check_tokens = 256;
    o->scale = 1.0;
    o->io = FQLA_DTYPE_BF16;
    o->seed = 1;
    cli_args a;
    int r;
    int64_t v;
    cli_args_init(&a, "bench", argc, argv);
    while ((r = cli_args_next(&a)) > 0) {
        if (cli_args_is(&a, "--help") || cli_args_is(&a, "-h")) {
            bench_usage(stdout);
            exit(CLI_EXIT_OK);
        } else if (cli_args_is(&a, "--quick")) {
            if (a.inline_value) {
                fprintf(stderr, "flashqla bench: option --quick takes no value\n");
                return -1;
            }
            o->quick = 1;
        } else if (cli_args_is(&a, "--edge")) {
            if (a.inline_value) {
                fprintf(stderr, "flashqla bench: option --edge takes no value\n");
                return -1;
            }
            o->edge = 1;
        } else if (cli_args_is(&a, "--rows")) {
            if (cli_args_value(&a, &o->rows_path) != 0) return -1;
        } else if (cli_args_is(&a, "--filter")) {
            if (cli_args_value(&a, &o->filter) != 0) return -1;
        } else if (cli_args_is(&a, "--out")) {
            if (cli_args_value(&a, &o->out_path) != 0) return -1;
            if (!o->out_path[0]) {
                fprintf(stderr, "flashqla bench: option --out: empty path\n");
                return -1;
            }
        } else if (cli_args_is(&a, "--repeat")) {
            if (cli_args_int(&a, 1, 100000, &v) != 0) return -1;
            o->repeat = (int)v;
        } else if (cli_args_is(&a, "--check-tokens")) {
            if (cli_args_int(&a, 0, (int64_t)1 << 30, &v) != 0) return -1;
            o->check_tokens = v;
        } else if (cli_args_is(&a, "--threads")) {
            if (cli_args_int(&a, 0, 1024, &v) != 0) return -1; /* the library's range */
            o->threads = (int)v;
        } else if (cli_args_is(&a, "--device")) {
            if (cli_args_int(&a, 0, 1024, &v) != 0) return -1;
            o->device = (int)v;
        } else if (cli_args_is(&a, "--seed")) {
            if (cli_args_int(&a, 0, INT64_MAX, &v) != 0) return -1;
            o->seed = (uint64_t)v;
        } else if (cli_args_is(&a, "--tol")) {
            if (cli_args_double(&a, &o->tol) != 0) return -1; /* > 0: 0 below means not given */
        } else if (cli_args_is(&a, "--dtype")) {
            if (cli_args_dtype(&a, &o->io) != 0) return -1;
        } else if (cli_args_is(&a, "--scale-tokens")) {
            if (cli_args_double(&a, &o->scale) != 0) return -1;
            if (o->scale > 1.0) {
                fprintf(stderr, "flashqla bench: option --scale-tokens: expected 0 < F <= 1, got %g\n", o->scale);
                return -1;
            }
            o->scale_given = 1;
        } else if (cli_args_is(&a, "--backend")) {
            const char *s;
            if (cli_args_value(&a, &s) != 0) return -1;
            if (!strcmp(s, "auto")) o->backend = BACKEND_AUTO;
            else if (!strcmp(s, "cuda") || !strcmp(s, "gpu")) o->backend = FQLA_BACKEND_CUDA;
            else if (!strcmp(s, "cpu")) o->backend = FQLA_BACKEND_CPU;
            else {
                fprintf(stderr, "flashqla bench: option --backend: expected auto, cuda (or gpu) or cpu, got '%s'\n", s);
                return -1;
            }
        } else {
            cli_args_unknown(&a);
            return -1;
        }
    }
    if (o->tol == 0) o->tol = o->io == FQLA_DTYPE_F32 ? 1e-4 : 5e-3; /* not given */
    return r < 0 ? -1 : 0;
}

/* ------------------------------------------------------------------------ */
/* Rows                                                                       */

/* Splits one CSV line in place (no quoting: the rows file has none). */
static int split_csv(char *line, char **field, int max)
{
    int n = 0;
    line[strcspn(line, "\r\n")] = '\0';
    for (char *c = line; n < max;) {
        field[n++] = c;
        char *comma = strchr(c, ',');
        if (!comma) break;
        *comma = '\0';
        c = comma + 1;
    }
    return n;
}

static double parse_ms(const char *s)
{
    char *end = NULL;
    double v = s && *s ? strtod(s, &end) : 0.0;
    return (end && *end == '\0' && v > 0 && isfinite(v)) ? v : 0.0;
}

/* Reads the op=fwd rows; *rows malloc'ed. Returns the count, or -1 with a
 * message. */
static int read_rows(const char *path, bench_row **rows)
{
    enum { C_OP, C_MODEL, C_HQK, C_HV, C_SEQ, C_ANCHOR, C_FLA, C_N };
    static const char *names[C_N] = { "op", "model", "h_qk", "h_v", "seqlens", "flashqla_ms", "fla_ms" };
    int col[C_N];
    char line[1024], *f[32];
    FILE *fp = fopen(path, "r");
    if (!fp) {
        fprintf(stderr, "flashqla bench: option --rows: cannot open '%s': %s\n", path, strerror(errno));
        return -1;
    }
    int n = 0, cap = 0, lineno = 1;
    *rows = NULL;
    if (!fgets(line, sizeof line, fp)) goto bad_header;
    int nf = split_csv(line, f, 32);
    for (int c = 0; c < C_N; c++) {
        col[c] = -1;
        for (int i = 0; i < nf; i++)
            if (!strcmp(f[i], names[c])) col[c] = i;
        if (col[c] < 0 && c < C_ANCHOR) goto bad_header;
    }
    while (fgets(line, sizeof line, fp)) {
        lineno++;
        nf = split_csv(line, f, 32);
        if (nf == 1 && f[0][0] == '\0') continue;
        if (nf <= col[C_SEQ] || nf <= col[C_OP] || nf <= col[C_MODEL] || nf <= col[C_HQK] || nf <= col[C_HV]) {
            fprintf(stderr, "flashqla bench: %s:%d: too few fields\n", path, lineno);
            goto fail;
        }
        if (strcmp(f[col[C_OP]], "fwd") != 0) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            bench_row *grown = realloc(*rows, (size_t)cap * sizeof **rows);
            if (!grown) goto fail;
            *rows = grown;
        }
        bench_row *r = &(*rows)[n];
        memset(r, 0, sizeof *r);
        if (strlen(f[col[C_MODEL]]) >= sizeof r->model || strlen(f[col[C_SEQ]]) >= sizeof r->seqlens) {
            fprintf(stderr, "flashqla bench: %s:%d: model or seqlens longer than %d / %d characters\n", path,
                    lineno, (int)sizeof r->model - 1, (int)sizeof r->seqlens - 1);
            goto fail;
        }
        snprintf(r->model, sizeof r->model, "%s", f[col[C_MODEL]]);
        snprintf(r->seqlens, sizeof r->seqlens, "%s", f[col[C_SEQ]]);
        char *e1 = NULL, *e2 = NULL;
        r->h_qk = strtoll(f[col[C_HQK]], &e1, 10);
        r->h_v = strtoll(f[col[C_HV]], &e2, 10);
        if (*e1 || *e2 || r->h_qk < 1 || r->h_v < 1 || r->h_v % r->h_qk) {
            fprintf(stderr, "flashqla bench: %s:%d: bad h_qk/h_v '%s','%s'\n", path, lineno,
                    f[col[C_HQK]], f[col[C_HV]]);
            goto fail;
        }
        if (col[C_ANCHOR] >= 0 && col[C_ANCHOR] < nf) r->anchor_ms = parse_ms(f[col[C_ANCHOR]]);
        if (col[C_FLA] >= 0 && col[C_FLA] < nf) r->fla_ms = parse_ms(f[col[C_FLA]]);
        n++;
    }
    fclose(fp);
    return n;
bad_header:
    fprintf(stderr, "flashqla bench: option --rows: '%s' has no header with op,model,h_qk,h_v,seqlens\n", path);
fail:
    fclose(fp);
    free(*rows);
    *rows = NULL;
    return -1;
}

/* "1x32768", "8192x4" (length x count) or "28672+4096" (lengths), each length scaled
 * by `scale` (at least 1 token) -> cu_seqlens in s. Returns -1 when the label
 * is neither form. */
static int row_shape(const char *label, double scale, cli_shape *s)
{
    int64_t lens[256];
    int n = 0;
    char *end = NULL;
    long long a = strtoll(label, &end, 10);
    if (end != label && *end == 'x') {
        /* as bench/bench_fwd.py reads the labels: "1x32768" is one sequence,
         * "8192x4" four sequences of 8192 */
        const char *c = end + 1;
        long long b = strtoll(c, &end, 10);
        long long len = a == 1 ? b : a, count = a == 1 ? 1 : b;
        if (end == c || *end || count < 1 || count > 256 || len < 1 || len > CLI_MAX_TOKENS) return -1;
        for (; n < count; n++) lens[n] = len;
    } else {
        const char *c = label;
        for (;;) {
            long long len = strtoll(c, &end, 10);
            if (end == c || len < 1 || len > CLI_MAX_TOKENS || n == 256 || (*end != '+' && *end != '\0')) return -1;
            lens[n++] = len;
            if (!*end) break;
            c = end + 1;
        }
    }
    memset(s, 0, sizeof *s);
    s->cu = malloc((size_t)(n + 1) * sizeof *s->cu);
    if (!s->cu) return -1;
    s->cu[0] = 0;
    for (int i = 0; i < n; i++) {
        int64_t len = (int64_t)llround((double)lens[i] * scale);
        s->cu[i + 1] = s->cu[i] + (len < 1 ? 1 : len);
    }
    s->N = n;
    s->B = 1;
    s->T = s->cu[n];
    s->K = s->V = 128;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Timing: the only place where the GPU and CPU paths differ (with memory     */
/* placement in cli_layer_to_device / the workspace).                          */

#ifdef FQLA_HAVE_CUDA
#include "cudart_c.h"
#endif

typedef struct bench_state {
    fqla_context *ctx;
    fqla_backend backend;
    int on_dev;
    void *flush;            /* FLUSH_BYTES of device memory */
    void *ev[2];
    char gpu[128];          /* device name, or "cpu" */
} bench_state;

static int fwd_call(const bench_state *bs, const cli_layer *L, void *ws, size_t ws_bytes)
{
    fqla_fwd_args a;
    cli_layer_args(L, &a);
    fqla_status st = fqla_fwd(bs->ctx, &a, ws, ws_bytes, NULL);
    if (st != FQLA_STATUS_SUCCESS) {
        fprintf(stderr, "flashqla bench: fqla_fwd failed: %s: %s\n", fqla_status_string(st),
                fqla_last_error(bs->ctx));
        return -1;
    }
    return 0;
}

/* ms per call of `calls` back-to-back forwards; on the GPU L2 is flushed
 * first (outside the timed region) so every batch starts cold, as in
 * docs/benchmarks.md. Returns < 0 on failure. */
static double time_batch(bench_state *bs, const cli_layer *L, void *ws, size_t ws_bytes, int calls, int batch)
{
#ifdef FQLA_HAVE_CUDA
    if (bs->on_dev) {
        float ms = 0;
        int e = cudaMemsetAsync(bs->flush, batch & 0xff, FLUSH_BYTES, NULL);
        if (!e) e = cudaEventRecord(bs->ev[0], NULL);
        for (int i = 0; !e && i < calls; i++)
            if (fwd_call(bs, L, ws, ws_bytes) != 0) return -1;
        if (!e) e = cudaEventRecord(bs->ev[1], NULL);
        if (!e) e = cudaEventSynchronize(bs->ev[1]);
        if (!e) e = cudaEventElapsedTime(&ms, bs->ev[0], bs->ev[1]);
        if (e) {
            fprintf(stderr, "flashqla bench: CUDA timing: %s\n", cudaGetErrorString(e));
            return -1;
        }
        return (double)ms / calls;
    }
#endif
    (void)batch;
    double t0 = cli_now_ms();
    for (int i = 0; i < calls; i++)
        if (fwd_call(bs, L, ws, ws_bytes) != 0) return -1;
    return (cli_now_ms() - t0) / calls;
}

static int gpu_timing_init(bench_state *bs, int device)
{
#ifdef FQLA_HAVE_CUDA
    char err[256];
    if (cli_dev_alloc(device, &bs->flush, FLUSH_BYTES, err, sizeof err) != 0) {
        fprintf(stderr, "flashqla bench: L2 flush buffer: %s\n", err);
        return -1;
    }
    if (cudaEventCreate(&bs->ev[0]) || cudaEventCreate(&bs->ev[1])) {
        fprintf(stderr, "flashqla bench: cudaEventCreate failed\n");
        return -1;
    }
    return 0;
#else
    (void)bs;
    (void)device;
    fprintf(stderr, "flashqla bench: built without CUDA\n");
    return -1;
#endif
}

static void gpu_timing_free(bench_state *bs)
{
#ifdef FQLA_HAVE_CUDA
    if (bs->ev[0]) cudaEventDestroy(bs->ev[0]);
    if (bs->ev[1]) cudaEventDestroy(bs->ev[1]);
    if (bs->flush) cli_dev_free(bs->flush);
#else
    (void)bs;
#endif
}

/* ------------------------------------------------------------------------ */

static int open_ctx(fqla_context **ctx, fqla_backend b, int device, int threads, char *why, size_t n)
{
    if (fqla_backend_available(b, why, n) != FQLA_STATUS_SUCCESS) return -1;
    fqla_status st = fqla_context_create(ctx, b, b == FQLA_BACKEND_CUDA ? device : 0);
    if (st != FQLA_STATUS_SUCCESS) {
        snprintf(why, n, "%s: %s", fqla_status_string(st), fqla_last_error(NULL));
        return -1;
    }
    if (b != FQLA_BACKEND_CUDA && fqla_context_set_threads(*ctx, threads) != FQLA_STATUS_SUCCESS) {
        snprintf(why, n, "--threads %d: %s", threads, fqla_last_error(*ctx));
        fqla_context_destroy(*ctx);
        *ctx = NULL;
        return -1;
    }
    return 0;
}

static int alloc_ws(const bench_state *bs, fqla_context *ctx, const cli_layer *L, int on_dev, int device,
                    void **ws, size_t *bytes)
{
    fqla_fwd_args a;
    char err[256];
    (void)bs;
    cli_layer_args(L, &a);
    *ws = NULL;
    fqla_status st = fqla_fwd_workspace_size(ctx, &a, bytes);
    if (st != FQLA_STATUS_SUCCESS) {
        fprintf(stderr, "flashqla bench: fqla_fwd_workspace_size: %s: %s\n", fqla_status_string(st),
                fqla_last_error(ctx));
        return -1;
    }
    if (*bytes == 0) return 0;
    if (on_dev) {
        if (cli_dev_alloc(device, ws, *bytes, err, sizeof err) != 0) {
            fprintf(stderr, "flashqla bench: workspace: %s\n", err);
            return -1;
        }
    } else if (!(*ws = cli_host_alloc(*bytes))) {
        fprintf(stderr, "flashqla bench: out of memory for a %zu-byte workspace\n", *bytes);
        return -1;
    }
    return 0;
}

static void free_ws(void *ws, int on_dev)
{
    if (on_dev) cli_dev_free(ws);
    else cli_host_free(ws);
}

/* Runs L (host or device) with the bench backend; on the device the outputs
 * come back into host. */
static int run_once(bench_state *bs, cli_layer *host, const cli_layer *L, int device)
{
    void *ws;
    size_t bytes;
    char err[256];
    if (alloc_ws(bs, bs->ctx, L, L->on_device, device, &ws, &bytes) != 0) return -1;
    int rc = fwd_call(bs, L, ws, bytes);
    if (!rc && L->on_device &&
        (cli_dev_sync(err, sizeof err) != 0 || cli_layer_outputs_to_host(host, L, err, sizeof err) != 0)) {
        fprintf(stderr, "flashqla bench: %s\n", err);
        rc = -1;
    }
    free_ws(ws, L->on_device);
    return rc;
}

/* The row's configuration on the first `tokens` tokens of every sequence:
 * the bench backend against the fp64 reference. 0, or -1 on a failed call. */
static int check_row(bench_state *bs, const cli_layer *host, int64_t tokens, int device,
                     double *rel_o, double *rel_st)
{
    cli_layer pre, dev, ref;
    int have_dev = 0, have_ref = 0, rc = -1;
    fqla_context *rctx = NULL;
    char err[256];
    void *ws = NULL;
    size_t bytes;
    if (cli_layer_prefix(&pre, host, tokens, host->io) != 0) {
        fprintf(stderr, "flashqla bench: out of memory for the check prefix\n");
        return -1;
    }
    if (bs->on_dev) {
        if (cli_layer_to_device(&dev, &pre, device, err, sizeof err) != 0) {
            fprintf(stderr, "flashqla bench: check prefix to the GPU: %s\n", err);
            goto done;
        }
        have_dev = 1;
    }
    if (run_once(bs, &pre, have_dev ? &dev : &pre, device) != 0) goto done;
    if (open_ctx(&rctx, FQLA_BACKEND_CPU_REFERENCE, 0, 0, err, sizeof err) != 0) {
        fprintf(stderr, "flashqla bench: reference backend: %s\n", err);
        goto done;
    }
    /* o in fp64 so the reference is not rounded to bf16 (the same
     * bf16-rounded inputs either way) */
    if (cli_layer_prefix(&ref, host, tokens, FQLA_DTYPE_F64) != 0) {
        fprintf(stderr, "flashqla bench: out of memory for the reference\n");
        goto done;
    }
    have_ref = 1;
    if (alloc_ws(bs, rctx, &ref, 0, 0, &ws, &bytes) != 0) goto done;
    fqla_fwd_args a;
    cli_layer_args(&ref, &a);
    fqla_status st = fqla_fwd(rctx, &a, ws, bytes, NULL);
    if (st != FQLA_STATUS_SUCCESS) {
        fprintf(stderr, "flashqla bench: reference fqla_fwd: %s: %s\n", fqla_status_string(st), fqla_last_error(rctx));
        goto done;
    }
    cli_rel ro, rs;
    cli_compare(&pre, &ref, &ro, &rs);
    *rel_o = ro.rel;
    *rel_st = rs.rel;
    rc = 0;
done:
    free_ws(ws, 0);
    if (have_ref) cli_layer_free(&ref);
    if (have_dev) cli_layer_free(&dev);
    cli_layer_free(&pre);
    fqla_context_destroy(rctx);
    return rc;
}

/* Times one row: median ms per call over `repeat` batches. */
static int time_row(bench_state *bs, const cli_layer *host, int repeat, int device, double *ms_out)
{
    cli_layer dev;
    const cli_layer *L = host;
    char err[256];
    void *ws = NULL;
    size_t bytes;
    int rc = -1;
    double *ms = malloc((size_t)repeat * sizeof *ms);
    if (!ms) return -1;
    if (bs->on_dev) {
        if (cli_layer_to_device(&dev, host, device, err, sizeof err) != 0) {
            fprintf(stderr, "flashqla bench: inputs to the GPU: %s\n", err);
            free(ms);
            return -1;
        }
        L = &dev;
    }
    if (alloc_ws(bs, bs->ctx, L, bs->on_dev, device, &ws, &bytes) != 0) goto done;
    int calls = bs->on_dev ? GPU_CALLS : 1;
    if (bs->on_dev && time_batch(bs, L, ws, bytes, calls, 0) < 0) goto done; /* warm-up */
    for (int i = 0; i < repeat; i++)
        if ((ms[i] = time_batch(bs, L, ws, bytes, calls, i + 1)) < 0) goto done;
    *ms_out = cli_median(ms, repeat);
    rc = 0;
done:
    free_ws(ws, bs->on_dev);
    if (bs->on_dev) cli_layer_free(&dev);
    free(ms);
    return rc;
}

/* "NVIDIA H200" -> "h200": the last word, lower case, [a-z0-9-] only. */
static void short_gpu_name(const char *name, char *out, size_t n)
{
    const char *w = strrchr(name, ' ');
    w = w ? w + 1 : name;
    size_t j = 0;
    for (; *w && j + 1 < n; w++) {
        char c = *w;
        if (c >= 'A' && c <= 'Z') c = (char)(c - 'A' + 'a');
        if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-') out[j++] = c;
    }
    out[j] = '\0';
    if (!j) snprintf(out, n, "gpu");
}

/* Opens the records file for appending, with the header when it is new. */
static FILE *open_records(const char *path, int make_dir)
{
    if (make_dir) {
        mkdir("build", 0777);
        mkdir("build/bench", 0777);
    }
    FILE *f = fopen(path, "a+");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    if (size == 0) {
        fprintf(f, "op,model,h_qk,h_v,seqlens,flashqla_ms,fla_ms,gpu,commit,date\n");
    } else if (fseek(f, size - 1, SEEK_SET) == 0 && fgetc(f) != '\n') {
        fputc('\n', f); /* a file that does not end its last line: the first record on a line of its own */
    }
    return f;
}

/* A records file opened for appending (its folder made under build/ when
 * make_dir), with no header: the caller writes its own. */
static FILE *open_records_plain(const char *path, int make_dir)
{
    if (make_dir) {
        mkdir("build", 0777);
        mkdir("build/bench", 0777);
    }
    return fopen(path, "a");
}

/* The field without commas (the records file has no quoting). */
static void csv_field(FILE *f, const char *s)
{
    for (; *s; s++) fputc(*s == ',' ? ';' : *s, f);
}

/* The CPU model name and core count, for the records' machine field. */
static void machine_name(char *buf, size_t size)
{
    char line[256], model[160] = "cpu";
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f)) {
        char *c = strchr(line, ':');
        if (!strncmp(line, "model name", 10) && c) {
            snprintf(model, sizeof model, "%s", c + 2);
            model[strcspn(model, "\n")] = 0;
            break;
        }
    }
    if (f) fclose(f);
    fqla_device_info info;
    fqla_context *ctx = NULL;
    memset(&info, 0, sizeof info);
    if (fqla_context_create(&ctx, FQLA_BACKEND_CPU, 0) == FQLA_STATUS_SUCCESS) fqla_context_info(ctx, &info);
    fqla_context_destroy(ctx);
    snprintf(buf, size, "%s x%d", model, info.threads);
}

/* --edge: issue 43's CPU rows (cli/cpu_edge.h). */
static int bench_edge(const bench_opts *bo)
{
    if (bo->backend == FQLA_BACKEND_CUDA) {
        fprintf(stderr, "flashqla bench: --edge times the CPU backend; give --backend cpu (or none)\n");
        return CLI_EXIT_USAGE;
    }
    const char *path = bo->out_path ? bo->out_path : "build/bench/cpu.csv";
    FILE *f = open_records_plain(path, bo->out_path == NULL);
    if (!f) {
        fprintf(stderr, "flashqla bench: option --out: cannot append to '%s': %s\n", path, strerror(errno));
        return CLI_EXIT_USAGE;
    }
    const char *commit = getenv("FQLA_COMMIT");
#ifdef FQLA_BUILD_COMMIT
    if (!commit || !*commit) commit = FQLA_BUILD_COMMIT;
#endif
    if (!commit || !*commit) commit = "unknown";
    char machine[200];
    machine_name(machine, sizeof machine);
    edge_opts o;
    memset(&o, 0, sizeof o);
    o.repeat = bo->repeat > 0 ? bo->repeat : 5;
    o.prefill_T = (int64_t)(4096 * bo->scale + 0.5);
    if (o.prefill_T < 1) o.prefill_T = 1;
    o.decode = o.prefill = 1;
    o.machine = machine;
    o.commit = commit;
    o.csv = f;
    int rc = edge_run(&o);
    fclose(f);
    return rc == 0 ? CLI_EXIT_OK : CLI_EXIT_FAIL;
}

int cli_bench(int argc, char **argv)
{
    bench_opts o;
    bench_state bs;
    bench_row *rows = NULL;
    int rc = CLI_EXIT_FAIL;
    FILE *rec = NULL;
    char why[512] = "";

    if (parse_bench_opts(argc, argv, &o) != 0) return CLI_EXIT_USAGE;
    if (o.edge) return bench_edge(&o);
    memset(&bs, 0, sizeof bs);
    int nrows = read_rows(o.rows_path, &rows);
    if (nrows < 0) return CLI_EXIT_USAGE;

    /* the rows to run */
    int *pick = malloc((size_t)(nrows + 1) * sizeof *pick);
    int npick = 0;
    if (!pick) goto done;
    for (int i = 0; i < nrows; i++) {
        char key[200];
        snprintf(key, sizeof key, "%s %s", rows[i].model, rows[i].seqlens);
        if (!o.filter || strstr(key, o.filter)) pick[npick++] = i;
    }
    if (o.quick && npick > QUICK_ROWS) {
        /* spread over the table, which is ordered by model, then pattern:
         * steps of npick/Q rows plus a drift of npick/Q^2 so that the
         * picked rows differ in pattern as well as in model (increasing and
         * below npick, since (Q-1)(Q+1)/Q^2 < 1) */
        for (int j = 0; j < QUICK_ROWS; j++)
            pick[j] = pick[j * npick / QUICK_ROWS + j * (npick / (QUICK_ROWS * QUICK_ROWS))];
        npick = QUICK_ROWS;
    }
    if (npick == 0) {
        fprintf(stderr, "flashqla bench: no fwd rows in '%s'%s%s\n", o.rows_path,
                o.filter ? " match --filter " : "", o.filter ? o.filter : "");
        rc = CLI_EXIT_USAGE;
        goto done;
    }
    for (int j = 0; j < npick; j++) {
        cli_shape s;
        if (row_shape(rows[pick[j]].seqlens, 1.0, &s) != 0) {
            fprintf(stderr, "flashqla bench: row '%s %s': seqlens is neither 1xLEN, LENxCOUNT nor LEN+LEN... "
                            "(lengths 1..2^40)\n", rows[pick[j]].model, rows[pick[j]].seqlens);
            rc = CLI_EXIT_USAGE;
            goto done;
        }
        s.H = rows[pick[j]].h_qk;
        s.HV = rows[pick[j]].h_v;
        const int fits = cli_shape_fits(&s);
        cli_shape_free(&s);
        if (!fits) {
            fprintf(stderr, "flashqla bench: row '%s %s': the tensors' sizes overflow 64 bits\n",
                    rows[pick[j]].model, rows[pick[j]].seqlens);
            rc = CLI_EXIT_USAGE;
            goto done;
        }
    }

    /* the backend */
    fqla_backend b = FQLA_BACKEND_CPU;
    if (o.backend == FQLA_BACKEND_CUDA || o.backend == BACKEND_AUTO) {
        if (open_ctx(&bs.ctx, FQLA_BACKEND_CUDA, o.device, 0, why, sizeof why) == 0) {
            b = FQLA_BACKEND_CUDA;
        } else if (o.backend == FQLA_BACKEND_CUDA) {
            fprintf(stderr, "flashqla bench: --backend cuda: %s\n", why);
            goto done;
        }
    }
    if (b == FQLA_BACKEND_CPU) {
        if (!o.quick && !o.filter && !o.scale_given) {
            fprintf(stderr, "flashqla bench: --backend cpu%s: the full rows take hours on the CPU; "
                            "give --quick, --filter or --scale-tokens\n",
                    o.backend == BACKEND_AUTO ? " (auto: no usable GPU)" : "");
            rc = CLI_EXIT_USAGE;
            goto done;
        }
        if (open_ctx(&bs.ctx, FQLA_BACKEND_CPU, 0, o.threads, why, sizeof why) != 0) {
            fprintf(stderr, "flashqla bench: cpu backend: %s\n", why);
            goto done;
        }
    }
    bs.backend = b;
    bs.on_dev = b == FQLA_BACKEND_CUDA;
    if (bs.on_dev) {
        fqla_device_info info;
        memset(&info, 0, sizeof info);
        fqla_context_info(bs.ctx, &info);
        snprintf(bs.gpu, sizeof bs.gpu, "%s", info.name[0] ? info.name : "gpu");
        if (gpu_timing_init(&bs, o.device) != 0) goto done;
    } else {
        snprintf(bs.gpu, sizeof bs.gpu, "cpu");
    }
    int repeat = o.repeat > 0 ? o.repeat : (bs.on_dev ? 10 : 3);

    char out_buf[300];
    const char *out_path = o.out_path;
    if (!out_path) {
        char sh[64];
        short_gpu_name(bs.gpu, sh, sizeof sh);
        /* apart from bench_fwd.py's fwd-<gpu>.csv: these rows have no same-process FLA time */
        /* under build/, not into the checkout's bench/results/ (records are added there with --out) */
        if (bs.on_dev) snprintf(out_buf, sizeof out_buf, "build/bench/fwd-%s-cli.csv", sh);
        else snprintf(out_buf, sizeof out_buf, "build/bench/cpu-bench.csv");
        out_path = out_buf;
    }
    if (!(rec = open_records(out_path, o.out_path == NULL))) {
        fprintf(stderr, "flashqla bench: option --out: cannot append to '%s': %s\n", out_path, strerror(errno));
        rc = CLI_EXIT_USAGE;
        goto done;
    }
    /* the record's commit: FQLA_COMMIT, else the one the program was built from */
    const char *commit = getenv("FQLA_COMMIT");
#ifdef FQLA_BUILD_COMMIT
    if (!commit || !*commit) commit = FQLA_BUILD_COMMIT;
#endif
    if (!commit || !*commit) commit = "unknown";
    char date[32];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));

    printf("flashqla %s bench: %d fwd row%s on %s (%s), %s q/k/v, %d timed batch%s of %d call%s, check %lld "
           "tokens/seq (tol %.0e), scale %g\n", FQLA_VERSION_STRING, npick, npick == 1 ? "" : "s",
           cli_backend_name(b), bs.gpu, cli_dtype_name(o.io), repeat, repeat == 1 ? "" : "es",
           bs.on_dev ? GPU_CALLS : 1, bs.on_dev ? "s" : "", (long long)o.check_tokens, o.tol, o.scale);
    /* the published numbers are bf16 rows at full length */
    const int compare = o.scale == 1.0 && o.io == FQLA_DTYPE_BF16;

    int failures = 0, n_anchor = 0, n_fla = 0;
    double log_anchor = 0, log_fla = 0;
    rc = CLI_EXIT_OK;
    for (int j = 0; j < npick; j++) {
        const bench_row *r = &rows[pick[j]];
        cli_layer host;
        cli_shape s;
        double ms = -1, rel_o = -1, rel_st = -1;
        int ok = 0;
        row_shape(r->seqlens, o.scale, &s);   /* validated above */
        s.H = r->h_qk;
        s.HV = r->h_v;
        char label[96], model[112];
        if (o.scale != 1.0) snprintf(label, sizeof label, "%s*%g", r->seqlens, o.scale);
        else snprintf(label, sizeof label, "%s", r->seqlens);
        /* as bench_fwd.py --dtype records them */
        if (o.io != FQLA_DTYPE_BF16) snprintf(model, sizeof model, "%s %s", r->model, cli_dtype_name(o.io));
        else snprintf(model, sizeof model, "%s", r->model);
        if (cli_layer_alloc_host(&host, &s, o.io) != 0) {
            fprintf(stderr, "flashqla bench: out of host memory for row %s %s\n", model, label);
            cli_shape_free(&s);
            failures++;
            rc = CLI_EXIT_FAIL;
            continue;
        }
        if (cli_layer_fill(&host, o.seed + (uint64_t)pick[j], o.threads) == 0 &&
            time_row(&bs, &host, repeat, o.device, &ms) == 0 &&
            (o.check_tokens == 0 || check_row(&bs, &host, o.check_tokens, o.device, &rel_o, &rel_st) == 0))
            ok = o.check_tokens == 0 || (rel_o <= o.tol && rel_st <= o.tol);
        printf("[%d/%d] fwd %-18s h_qk=%-2lld h_v=%-2lld %-16s", j + 1, npick, model, (long long)r->h_qk,
               (long long)r->h_v, label);
        if (ms >= 0) printf(" %9.3f ms", ms);
        else printf(" %9s ms", "-");
        if (compare && r->anchor_ms > 0 && ms > 0)
            printf("  published flashqla %.3f fla %.3f", r->anchor_ms, r->fla_ms);
        if (o.check_tokens == 0) printf("  check skipped");
        else if (rel_o >= 0) printf("  rel_o %.2e rel_state %.2e", rel_o, rel_st);
        printf("  %s\n", ok ? "PASS" : "FAIL");
        if (ok) {   /* only checked rows are recorded or compared */
            fprintf(rec, "fwd,");
            csv_field(rec, model);
            fprintf(rec, ",%lld,%lld,", (long long)r->h_qk, (long long)r->h_v);
            csv_field(rec, label);
            fprintf(rec, ",%.4f,,", ms);
            csv_field(rec, bs.gpu);
            fputc(',', rec);
            csv_field(rec, commit);
            fprintf(rec, ",%s\n", date);
            fflush(rec);
            if (compare && r->anchor_ms > 0) { log_anchor += log(r->anchor_ms / ms); n_anchor++; }
            if (compare && r->fla_ms > 0) { log_fla += log(r->fla_ms / ms); n_fla++; }
        }
        if (!ok) {
            failures++;
            rc = CLI_EXIT_FAIL;
        }
        cli_layer_free(&host);
        cli_shape_free(&s);
    }
    printf("summary: fwd rows=%d failures=%d backend=%s gpu=%s dtype=%s", npick, failures, cli_backend_name(b), bs.gpu,
           cli_dtype_name(o.io));
    if (n_anchor) printf(" geomean_published_flashqla_over_ours=%.4g", exp(log_anchor / n_anchor));
    else printf(" geomean_published_flashqla_over_ours=n/a");
    if (n_fla) printf(" geomean_published_fla_over_ours=%.4g", exp(log_fla / n_fla));
    else printf(" geomean_published_fla_over_ours=n/a");
    printf(" (vs published numbers, not same-process%s) out=%s\n",
           o.scale != 1.0 ? "; scaled rows are not compared" : o.io != FQLA_DTYPE_BF16 ? "; only bf16 rows are compared" : "",
           out_path);
done:
    fflush(stdout);
    if (rec) fclose(rec);
    if (bs.on_dev) gpu_timing_free(&bs);
    fqla_context_destroy(bs.ctx);
    free(pick);
    free(rows);
    return rc;
}
