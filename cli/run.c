/*
 * run.c - `flashqla run`: one GDN forward layer (by default Qwen3.5-35B-like:
 * B = 1, H = 16, HV = 32, K = V = 128, T = 8192, bf16, docs/benchmarks.md inputs)
 * on the GPU when the CUDA backend can run it, else on the CPU fast path.
 * Prints the time (median of repeats), tokens/s and the relative error of o
 * and the final state against the fp64 reference, computed on a prefix of
 * every sequence (both backends run that same prefix). Exit status 1 when the
 * error exceeds docs/testing.md's threshold for the dtype or anything fails.
 */
#include "layer.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BACKEND_AUTO (-1)

typedef struct run_opts {
    cli_shape s;
    fqla_dtype dtype;
    int backend;          /* fqla_backend or BACKEND_AUTO */
    int threads;          /* CPU worker threads, 0 = all cores */
    int device;
    uint64_t seed;
    int64_t check_tokens; /* -1: default for the backend */
    int repeat;           /* -1: default for the backend */
    double tol;           /* 0: docs/testing.md threshold for the dtype */
    int T_given, B_given;
} run_opts;

static void run_usage(FILE *f)
{
    fprintf(f,
        "usage: flashqla run [options]\n"
        "\n"
        "Runs one Gated DeltaNet forward layer and checks it against the fp64 reference.\n"
        "Default: B=1 T=8192 H=16 HV=32 K=V=128 bf16 (a Qwen3.5-35B linear-attention layer),\n"
        "with h0 and the final state, on the GPU when the CUDA backend can run it, else on the CPU.\n"
        "\n"
        "  --T N            tokens per batch row (with --varlen: at least their sum; default 8192)\n"
        "  --B N            batch rows (default 1)\n"
        "  --H N            q/k heads (default 16)\n"
        "  --HV N           value heads, a multiple of H (default 32)\n"
        "  --K N, --V N     head dims (default 128)\n"
        "  --dtype D        bf16 | fp16 | fp32 for q, k, v, o (default bf16)\n"
        "  --backend B      auto | cuda (or gpu) | cpu | reference (or ref) (default auto)\n"
        "  --device N       CUDA device (default 0)\n"
        "  --threads N      CPU worker threads 0..1024, 0 = all cores (default 0)\n"
        "  --varlen L1,L2   packed sequences of these lengths in one row (B = 1)\n"
        "  --seed N         input seed (default 1)\n"
        "  --check-tokens N prefix of each sequence checked against the fp64 reference\n"
        "                   (default 512 on the CPU, 1024 on the GPU; 0 = no check)\n"
        "  --repeat N       timed runs, the median is reported (default 3 on the CPU, 20 on the GPU)\n"
        "  --tol X          error threshold (default: bf16/fp16 5e-3, fp32 1e-4, as in docs/testing.md)\n"
        "\n"
        "Exit status: 0 pass, 1 error above the threshold or a failed call, 2 bad options.\n");
}

/* "1024,0,3000" -> cu_seqlens offsets. */
static int parse_varlen(const char *text, cli_shape *s)
{
    int64_t n = 1;
    for (const char *c = text; *c; c++) n += *c == ',';
    int64_t *cu = malloc((size_t)(n + 1) * sizeof *cu);
    if (!cu) return -1;
    cu[0] = 0;
    const char *c = text;
    for (int64_t i = 0; i < n; i++) {
        char *end = NULL;
        long long len = strtoll(c, &end, 10);
        if (end == c || len < 0 || len > CLI_MAX_TOKENS || (*end != ',' && *end != '\0')) {
            free(cu);
            return -1;
        }
        cu[i + 1] = cu[i] + len;
        c = *end ? end + 1 : end;
    }
    free(s->cu);
    s->cu = cu;
    s->N = n;
    return 0;
}

static int parse_run_opts(int argc, char **argv, run_opts *o)
{
    memset(o, 0, sizeof *o);
    o->s.B = 1; o->s.T = 8192; o->s.H = 16; o->s.HV = 32; o->s.K = 128; o->s.V = 128;
    o->dtype = FQLA_DTYPE_BF16;
    o->backend = BACKEND_AUTO;
    o->seed = 1;
    o->check_tokens = -1;
    o->repeat = -1;

    const int64_t big = CLI_MAX_TOKENS;
    cli_args a;
    int r;
    int64_t v;
    cli_args_init(&a, "run", argc, argv);
    while ((r = cli_args_next(&a)) > 0) {
        if (cli_args_is(&a, "--help") || cli_args_is(&a, "-h")) {
            run_usage(stdout);
            exit(CLI_EXIT_OK);
        }
#define INT_OPT(flag, lo, hi, dst)                                            \
        else if (cli_args_is(&a, flag)) {                                     \
            if (cli_args_int(&a, lo, hi, &v) != 0) return -1;                 \
            dst = v;                                                          \
        }
        INT_OPT("--T", 1, big, o->s.T)
        INT_OPT("--B", 1, big, o->s.B)
        INT_OPT("--H", 1, 1 << 20, o->s.H)
        INT_OPT("--HV", 1, 1 << 20, o->s.HV)
        INT_OPT("--K", 1, 1 << 16, o->s.K)
        INT_OPT("--V", 1, 1 << 16, o->s.V)
        INT_OPT("--threads", 0, 1024, o->threads) /* the library's range */
        INT_OPT("--device", 0, 1024, o->device)
        INT_OPT("--seed", 0, INT64_MAX, o->seed)
        INT_OPT("--check-tokens", 0, big, o->check_tokens)
        INT_OPT("--repeat", 1, 1000000, o->repeat)
#undef INT_OPT
        else if (cli_args_is(&a, "--tol")) {
            if (cli_args_double(&a, &o->tol) != 0) return -1;
        } else if (cli_args_is(&a, "--dtype")) {
            if (cli_args_dtype(&a, &o->dtype) != 0) return -1;
        } else if (cli_args_is(&a, "--backend")) {
            const char *s;
            if (cli_args_value(&a, &s) != 0) return -1;
            if (!strcmp(s, "auto")) o->backend = BACKEND_AUTO;
            else if (!strcmp(s, "cuda") || !strcmp(s, "gpu")) o->backend = FQLA_BACKEND_CUDA;
            else if (!strcmp(s, "cpu")) o->backend = FQLA_BACKEND_CPU;
            else if (!strcmp(s, "reference") || !strcmp(s, "ref")) o->backend = FQLA_BACKEND_CPU_REFERENCE;
            else {
                fprintf(stderr, "flashqla run: option --backend: expected auto, cuda (or gpu), cpu or reference (or ref), got '%s'\n", s);
                return -1;
            }
        } else if (cli_args_is(&a, "--varlen")) {
            const char *s;
            if (cli_args_value(&a, &s) != 0) return -1;
            if (parse_varlen(s, &o->s) != 0) {
                fprintf(stderr, "flashqla run: option --varlen: expected comma-separated lengths >= 0 "
                                "(e.g. 4096,1024,3072), got '%s'\n", s);
                return -1;
            }
        } else {
            cli_args_unknown(&a);
            return -1;
        }
        if (cli_args_is(&a, "--T")) o->T_given = 1;
        if (cli_args_is(&a, "--B")) o->B_given = 1;
    }
    if (r < 0) return -1;

    cli_shape *s = &o->s;
    if (s->HV % s->H != 0) {
        fprintf(stderr, "flashqla run: option --HV: %lld is not a multiple of --H %lld\n",
                (long long)s->HV, (long long)s->H);
        return -1;
    }
    if (s->cu) {
        int64_t sum = s->cu[s->N];
        if (o->B_given && s->B != 1) {
            fprintf(stderr, "flashqla run: option --B: must be 1 with --varlen (packed sequences share one row)\n");
            return -1;
        }
        s->B = 1;
        if (sum == 0) {
            fprintf(stderr, "flashqla run: option --varlen: the lengths sum to 0 tokens\n");
            return -1;
        }
        if (!o->T_given) s->T = sum;
        else if (s->T < sum) {
            fprintf(stderr, "flashqla run: option --T: %lld is less than the --varlen total %lld\n",
                    (long long)s->T, (long long)sum);
            return -1;
        }
    } else {
        s->N = s->B;
    }
    if (!cli_shape_fits(s)) {
        fprintf(stderr, "flashqla run: options --B %lld --T %lld --H %lld --HV %lld --K %lld --V %lld: "
                        "the tensors' sizes overflow 64 bits\n", (long long)s->B, (long long)s->T,
                (long long)s->H, (long long)s->HV, (long long)s->K, (long long)s->V);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------ */

static double t_start;

/* A progress line on stderr with the seconds since the start, so a long CPU
 * run shows where its time goes. */
static void progress(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
static void progress(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "flashqla run: [%6.1f s] ", (cli_now_ms() - t_start) * 1e-3);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

typedef struct run_state {
    fqla_context *ctx;
    fqla_backend backend;
    cli_layer dev;        /* device copy of the inputs when on CUDA */
    int have_dev;
    char note[512];       /* why auto did not pick CUDA */
} run_state;

static int call_failed(const char *what, fqla_status st, const fqla_context *ctx)
{
    fprintf(stderr, "flashqla run: %s failed: %s: %s\n", what, fqla_status_string(st), fqla_last_error(ctx));
    return CLI_EXIT_FAIL;
}

/* Creates a context for backend b with its options; 0 on success. */
static int open_context(fqla_context **ctx, fqla_backend b, const run_opts *o, char *why, size_t n)
{
    fqla_status st = fqla_backend_available(b, why, n);
    if (st != FQLA_STATUS_SUCCESS) return -1;
    st = fqla_context_create(ctx, b, b == FQLA_BACKEND_CUDA ? o->device : 0);
    if (st != FQLA_STATUS_SUCCESS) {
        snprintf(why, n, "%s: %s", fqla_status_string(st), fqla_last_error(NULL));
        return -1;
    }
    if (b != FQLA_BACKEND_CUDA) {
        st = fqla_context_set_threads(*ctx, o->threads);
        if (st != FQLA_STATUS_SUCCESS) {
            snprintf(why, n, "--threads %d: %s", o->threads, fqla_last_error(*ctx));
            fqla_context_destroy(*ctx);
            *ctx = NULL;
            return -1;
        }
    }
    return 0;
}

/* Tries the CUDA backend on the layer: context, device copies, supported.
 * On failure leaves why filled and nothing allocated. */
static int try_cuda(run_state *rs, const cli_layer *host, const run_opts *o, char *why, size_t n)
{
    fqla_fwd_args a;
    fqla_status st;
    if (open_context(&rs->ctx, FQLA_BACKEND_CUDA, o, why, n) != 0) return -1;
    /* Ask first with the host buffers (same alignment; a CUDA supported()
     * reads no data), so an unsupported case costs no upload; then again
     * below on the real device buffers. */
    cli_layer_args(host, &a);
    if ((st = fqla_fwd_supported(rs->ctx, &a)) != FQLA_STATUS_SUCCESS) {
        snprintf(why, n, "%s: %s", fqla_status_string(st), fqla_last_error(rs->ctx));
        goto fail;
    }
    progress("copying %.1f MB of inputs to the GPU",
            cli_layer_bytes(&host->s, host->io) / 1e6);
    if (cli_layer_to_device(&rs->dev, host, o->device, why, n) != 0) goto fail;
    rs->have_dev = 1;
    cli_layer_args(&rs->dev, &a);
    st = fqla_fwd_supported(rs->ctx, &a);
    if (st != FQLA_STATUS_SUCCESS) {
        snprintf(why, n, "%s: %s", fqla_status_string(st), fqla_last_error(rs->ctx));
        goto fail;
    }
    rs->backend = FQLA_BACKEND_CUDA;
    return 0;
fail:
    if (rs->have_dev) cli_layer_free(&rs->dev);
    rs->have_dev = 0;
    fqla_context_destroy(rs->ctx);
    rs->ctx = NULL;
    return -1;
}

static int choose_backend(run_state *rs, const cli_layer *host, const run_opts *o)
{
    char why[512] = "";
    fqla_fwd_args a;
    if (o->backend == FQLA_BACKEND_CUDA || o->backend == BACKEND_AUTO) {
        if (try_cuda(rs, host, o, why, sizeof why) == 0) return 0;
        if (o->backend == FQLA_BACKEND_CUDA) {
            fprintf(stderr, "flashqla run: --backend cuda: %s\n", why);
            return -1;
        }
        snprintf(rs->note, sizeof rs->note, "cuda not used: %s", why);
    }
    fqla_backend b = o->backend == BACKEND_AUTO ? FQLA_BACKEND_CPU : (fqla_backend)o->backend;
    if (open_context(&rs->ctx, b, o, why, sizeof why) != 0) {
        fprintf(stderr, "flashqla run: backend %s: %s\n", cli_backend_name(b), why);
        return -1;
    }
    cli_layer_args(host, &a);
    fqla_status st = fqla_fwd_supported(rs->ctx, &a);
    if (st != FQLA_STATUS_SUCCESS) {
        call_failed("fqla_fwd_supported", st, rs->ctx);
        return -1;
    }
    rs->backend = b;
    return 0;
}

/* Runs the forward on L once with a workspace of the queried size. */
static fqla_status fwd_once(fqla_context *ctx, const cli_layer *L, void *ws, size_t ws_bytes)
{
    fqla_fwd_args a;
    cli_layer_args(L, &a);
    return fqla_fwd(ctx, &a, ws, ws_bytes, NULL);
}

static int alloc_workspace(fqla_context *ctx, const cli_layer *L, int on_dev, int device,
                           void **ws, size_t *bytes)
{
    fqla_fwd_args a;
    char err[256];
    cli_layer_args(L, &a);
    fqla_status st = fqla_fwd_workspace_size(ctx, &a, bytes);
    if (st != FQLA_STATUS_SUCCESS) return call_failed("fqla_fwd_workspace_size", st, ctx);
    *ws = NULL;
    if (*bytes == 0) return 0;
    if (on_dev) {
        if (cli_dev_alloc(device, ws, *bytes, err, sizeof err) != 0) {
            fprintf(stderr, "flashqla run: workspace of %zu bytes: %s\n", *bytes, err);
            return CLI_EXIT_FAIL;
        }
    } else if (!(*ws = cli_host_alloc(*bytes))) {
        fprintf(stderr, "flashqla run: out of memory for a workspace of %zu bytes\n", *bytes);
        return CLI_EXIT_FAIL;
    }
    return 0;
}

static void free_workspace(void *ws, int on_dev)
{
    if (on_dev) cli_dev_free(ws);
    else cli_host_free(ws);
}

/* Times `repeat` forwards (after warm-up ones on the GPU); fills ms[]. */
static int time_forward(run_state *rs, const cli_layer *L, const run_opts *o, int repeat, double *ms)
{
    int on_dev = L->on_device;
    void *ws;
    size_t ws_bytes;
    char err[256];
    int rc = alloc_workspace(rs->ctx, L, on_dev, o->device, &ws, &ws_bytes);
    if (rc) return rc;
    int warmup = on_dev ? 3 : 0;
    for (int i = 0; i < warmup + repeat; i++) {
        double t0 = cli_now_ms();
        fqla_status st = fwd_once(rs->ctx, L, ws, ws_bytes);
        if (st != FQLA_STATUS_SUCCESS) {
            rc = call_failed("fqla_fwd", st, rs->ctx);
            break;
        }
        if (on_dev && cli_dev_sync(err, sizeof err) != 0) {
            fprintf(stderr, "flashqla run: %s\n", err);
            rc = CLI_EXIT_FAIL;
            break;
        }
        double dt = cli_now_ms() - t0;
        if (i < warmup) continue;
        ms[i - warmup] = dt;
        if (!on_dev || repeat <= 5 || i + 1 == warmup + repeat)
            progress("forward %d/%d: %.3f ms", i - warmup + 1, repeat, dt);
    }
    free_workspace(ws, on_dev);
    return rc;
}

/* The reference check: the fast backend and the fp64 reference on the first
 * `tokens` tokens of every sequence. */
static int check_prefix(run_state *rs, const cli_layer *host, const run_opts *o, int64_t tokens,
                        cli_rel *rel_o, cli_rel *rel_st, char *ref_note, size_t note_size)
{
    cli_layer pre, ref, dev;
    char err[512];
    int rc = CLI_EXIT_FAIL;
    void *ws = NULL;
    size_t ws_bytes = 0;
    fqla_context *rctx = NULL;
    int have_ref = 0, have_dev = 0;
    fqla_status st;

    if (cli_layer_prefix(&pre, host, tokens, host->io) != 0) {
        fprintf(stderr, "flashqla run: out of memory for the check prefix\n");
        return CLI_EXIT_FAIL;
    }
    /* the fast backend on the prefix */
    if (rs->backend == FQLA_BACKEND_CUDA) {
        if (cli_layer_to_device(&dev, &pre, o->device, err, sizeof err) != 0) {
            fprintf(stderr, "flashqla run: check prefix to the GPU: %s\n", err);
            goto done;
        }
        have_dev = 1;
    }
    const cli_layer *run_on = have_dev ? &dev : &pre;
    if ((rc = alloc_workspace(rs->ctx, run_on, have_dev, o->device, &ws, &ws_bytes)) != 0) goto done;
    rc = CLI_EXIT_FAIL;
    if ((st = fwd_once(rs->ctx, run_on, ws, ws_bytes)) != FQLA_STATUS_SUCCESS) {
        call_failed("fqla_fwd on the check prefix", st, rs->ctx);
        goto done;
    }
    if (have_dev && (cli_dev_sync(err, sizeof err) != 0 || cli_layer_outputs_to_host(&pre, &dev, err, sizeof err) != 0)) {
        fprintf(stderr, "flashqla run: check prefix: %s\n", err);
        goto done;
    }
    free_workspace(ws, have_dev);
    ws = NULL;

    /* the fp64 reference on the same values: q, k, v, o in fp64 so that o is
     * not rounded to the input dtype; fall back to the input dtype if the
     * reference does not take fp64. */
    progress("fp64 reference on %lld tokens", (long long)cli_shape_tokens(&pre.s));
    run_opts ro = *o;
    ro.threads = 0;
    if (open_context(&rctx, FQLA_BACKEND_CPU_REFERENCE, &ro, err, sizeof err) != 0) {
        fprintf(stderr, "flashqla run: reference backend: %s\n", err);
        goto done;
    }
    fqla_dtype ref_io = FQLA_DTYPE_F64;
    for (int attempt = 0; attempt < 2; attempt++) {
        if (cli_layer_prefix(&ref, host, tokens, ref_io) != 0) {
            fprintf(stderr, "flashqla run: out of memory for the reference\n");
            goto done;
        }
        have_ref = 1;
        fqla_fwd_args a;
        cli_layer_args(&ref, &a);
        if (fqla_fwd_supported(rctx, &a) == FQLA_STATUS_SUCCESS) break;
        cli_layer_free(&ref);
        have_ref = 0;
        if (ref_io == host->io) break;
        ref_io = host->io;
    }
    if (!have_ref) {
        fqla_fwd_args a;
        cli_layer_args(&pre, &a);
        call_failed("fqla_fwd_supported (reference)", fqla_fwd_supported(rctx, &a), rctx);
        goto done;
    }
    snprintf(ref_note, note_size, "the fp64 reference (same %s-rounded inputs, %s o)", cli_dtype_name(host->io), cli_dtype_name(ref_io));
    if ((rc = alloc_workspace(rctx, &ref, 0, 0, &ws, &ws_bytes)) != 0) goto done;
    rc = CLI_EXIT_FAIL;
    if ((st = fwd_once(rctx, &ref, ws, ws_bytes)) != FQLA_STATUS_SUCCESS) {
        call_failed("fqla_fwd (reference)", st, rctx);
        goto done;
    }
    cli_compare(&pre, &ref, rel_o, rel_st);
    rc = CLI_EXIT_OK;
done:
    free_workspace(ws, rctx ? 0 : have_dev);
    if (have_dev) cli_layer_free(&dev);
    if (have_ref) cli_layer_free(&ref);
    cli_layer_free(&pre);
    fqla_context_destroy(rctx);
    return rc;
}

static void print_backend(const run_state *rs)
{
    fqla_device_info info;
    memset(&info, 0, sizeof info);
    fqla_context_info(rs->ctx, &info);
    if (rs->backend == FQLA_BACKEND_CUDA)
        printf("backend:  cuda, device %d: %s (sm_%d%d, %d SMs)\n", info.device, info.name,
               info.cc_major, info.cc_minor, info.sm_count);
    else
        printf("backend:  %s (%s), %d threads on %d cores\n", cli_backend_name(rs->backend),
               rs->backend == FQLA_BACKEND_CPU ? "fast fp32 chunked path" : "fp64 token recurrence",
               info.threads, info.sm_count);
    if (rs->note[0]) printf("          (%s)\n", rs->note);
}

int cli_run(int argc, char **argv)
{
    run_opts o;
    run_state rs;
    cli_layer host;
    double *ms = NULL;
    int rc = CLI_EXIT_FAIL;

    if (parse_run_opts(argc, argv, &o) != 0) {
        cli_shape_free(&o.s);
        return CLI_EXIT_USAGE;
    }
    memset(&rs, 0, sizeof rs);
    const cli_shape *s = &o.s;
    int64_t tokens = cli_shape_tokens(s);

    t_start = cli_now_ms();
    progress("generating %.1f MB of inputs (seed %llu)",
            cli_layer_bytes(s, o.dtype) / 1e6, (unsigned long long)o.seed);
    if (cli_layer_alloc_host(&host, s, o.dtype) != 0) {
        fprintf(stderr, "flashqla run: out of host memory for %.1f MB of tensors\n", cli_layer_bytes(s, o.dtype) / 1e6);
        cli_shape_free(&o.s);
        return CLI_EXIT_FAIL;
    }
    if (cli_layer_fill(&host, o.seed, o.threads) != 0) {
        fprintf(stderr, "flashqla run: out of host memory while generating the inputs\n");
        goto done;
    }
    if (choose_backend(&rs, &host, &o) != 0) goto done;

    int on_gpu = rs.backend == FQLA_BACKEND_CUDA;
    int repeat = o.repeat > 0 ? o.repeat : (on_gpu ? 20 : 3);
    int64_t check = o.check_tokens >= 0 ? o.check_tokens : (on_gpu ? 1024 : 512);
    double tol = o.tol > 0 ? o.tol : (o.dtype == FQLA_DTYPE_F32 ? 1e-4 : 5e-3);

    printf("flashqla %s (library %d)\n", FQLA_VERSION_STRING, fqla_version());
    printf("config:   B=%lld T=%lld H=%lld HV=%lld K=%lld V=%lld dtype=%s, %lld sequence%s",
           (long long)s->B, (long long)s->T, (long long)s->H, (long long)s->HV, (long long)s->K,
           (long long)s->V, cli_dtype_name(o.dtype), (long long)s->N, s->N == 1 ? "" : "s");
    if (s->cu) {
        printf(" (varlen");
        for (int64_t n = 0; n < s->N && n < 8; n++) printf("%s%lld", n ? "," : " ", (long long)(s->cu[n + 1] - s->cu[n]));
        printf("%s)", s->N > 8 ? ",..." : "");
    }
    printf(", h0 and final state on, seed %llu\n", (unsigned long long)o.seed);
    print_backend(&rs);
    fflush(stdout);

    /* timed runs */
    ms = malloc((size_t)repeat * sizeof *ms);
    if (!ms) goto done;
    const cli_layer *L = rs.have_dev ? &rs.dev : &host;
    if ((rc = time_forward(&rs, L, &o, repeat, ms)) != 0) goto done;
    rc = CLI_EXIT_FAIL;
    double tmin = ms[0], tmax = ms[0];
    for (int i = 0; i < repeat; i++) {
        if (ms[i] < tmin) tmin = ms[i];
        if (ms[i] > tmax) tmax = ms[i];
    }
    double med = cli_median(ms, repeat);
    double tps = tokens / (med * 1e-3);
    printf("time:     %.3f ms per forward (median of %d; min %.3f, max %.3f)\n", med, repeat, tmin, tmax);
    printf("tokens/s: %.0f (%lld tokens)\n", tps, (long long)tokens);

    char err[512];
    if (rs.have_dev && cli_layer_outputs_to_host(&host, &rs.dev, err, sizeof err) != 0) {
        fprintf(stderr, "flashqla run: %s\n", err);
        goto done;
    }
    int finite = cli_layer_outputs_finite(&host);
    printf("outputs:  %s\n", finite ? "all finite" : "NaN or Inf in o or the final state");

    cli_rel ro = { 0, 0, -1, -1 }, rst = { 0, 0, -1, -1 };
    char ref_note[128] = "";
    int checked = 0;
    if (check > 0) {
        int64_t ct = check, checked_tokens = 0;
        for (int64_t n = 0; n < s->N; n++) {
            int64_t b, st, len;
            cli_shape_seq(s, n, &b, &st, &len);
            checked_tokens += len < ct ? len : ct;
        }
        if ((rc = check_prefix(&rs, &host, &o, ct, &ro, &rst, ref_note, sizeof ref_note)) != 0) goto done;
        rc = CLI_EXIT_FAIL;
        checked = 1;
        printf("check:    first %lld tokens of each sequence (%lld tokens), %s vs %s\n", (long long)ct,
               (long long)checked_tokens, cli_backend_name(rs.backend), ref_note);
        printf("  o:           rel %.3e (worst: sequence %lld, head %lld: %.3e)\n", ro.rel,
               (long long)ro.worst_seq, (long long)ro.worst_head, ro.worst);
        printf("  final state: rel %.3e (worst: sequence %lld, head %lld: %.3e)\n", rst.rel,
               (long long)rst.worst_seq, (long long)rst.worst_head, rst.worst);
        printf("  threshold:   %.1e (%s)\n", tol, o.tol > 0 ? "--tol" : cli_dtype_name(o.dtype));
    } else {
        printf("check:    skipped (--check-tokens 0)\n");
    }
    int pass = finite && (!checked || (ro.rel <= tol && rst.rel <= tol));
    printf("summary: %s backend=%s dtype=%s B=%lld T=%lld H=%lld HV=%lld K=%lld V=%lld ms=%.3f tokens_per_s=%.0f",
           pass ? "PASS" : "FAIL", cli_backend_name(rs.backend), cli_dtype_name(o.dtype), (long long)s->B,
           (long long)s->T, (long long)s->H, (long long)s->HV, (long long)s->K, (long long)s->V, med, tps);
    if (checked)
        printf(" check_tokens=%lld rel_o=%.3e rel_state=%.3e tol=%.1e\n", (long long)check, ro.rel, rst.rel, tol);
    else
        printf(" check=none\n");
    rc = pass ? CLI_EXIT_OK : CLI_EXIT_FAIL;
done:
    fflush(stdout);
    free(ms);
    if (rs.have_dev) cli_layer_free(&rs.dev);
    fqla_context_destroy(rs.ctx);
    cli_layer_free(&host);
    cli_shape_free(&o.s);
    return rc;
}
