/*
 * info.c - `flashqla info`: the version, which backends are available (and
 * why not), the GPUs, and which head dims and dtypes each backend supports.
 * The support table is asked of the library (fqla_*_supported on tiny
 * problems), never hard-coded here, so it stays true as kernels land.
 */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const fqla_backend backends[] = { FQLA_BACKEND_CPU, FQLA_BACKEND_CPU_REFERENCE, FQLA_BACKEND_CUDA };
static const int head_dims[] = { 64, 128, 256 };
static const fqla_dtype dtypes[] = { FQLA_DTYPE_F32, FQLA_DTYPE_F16, FQLA_DTYPE_BF16, FQLA_DTYPE_F64 };

#define PROBE_T 64
#define PROBE_SLOT ((size_t)256 * 256 * 8)  /* bytes per tensor: the largest is a 256x256 fp64 state */
#define PROBE_SLOTS 24

/* Distinct, aligned, zeroed buffers for the probes (outputs must not alias
 * inputs or the validation rejects them before the backend is asked). */
typedef struct probe_arena {
    char *base;
    int next;
} probe_arena;

static void *slot(probe_arena *a)
{
    return a->base + (size_t)(a->next++) * PROBE_SLOT;
}

static fqla_tensor tensor(probe_arena *a, fqla_dtype d, int ndim, int64_t s0, int64_t s1, int64_t s2, int64_t s3)
{
    int64_t shape[4] = { s0, s1, s2, s3 };
    return fqla_tensor_contiguous(slot(a), d, ndim, shape);
}

static const int64_t zero_slot = 0;

/* Asks backend ctx whether op (0 fwd, 1 bwd, 2 decode) runs at K = V = hd
 * with q/k/v in dtype d; fp32 gates and states. */
static fqla_status probe(fqla_context *ctx, probe_arena *ar, int op, int64_t hd, fqla_dtype d)
{
    const int64_t B = 1, H = 1, HV = 1, T = op == 2 ? 1 : PROBE_T;
    const fqla_dtype f32 = FQLA_DTYPE_F32;
    ar->next = 0;
    if (op == 0) {
        fqla_fwd_args a;
        fqla_fwd_args_init(&a);
        a.q = tensor(ar, d, 4, B, T, H, hd);
        a.k = tensor(ar, d, 4, B, T, H, hd);
        a.v = tensor(ar, d, 4, B, T, HV, hd);
        a.g = tensor(ar, f32, 3, B, T, HV, 0);
        a.beta = tensor(ar, f32, 3, B, T, HV, 0);
        a.initial_state = tensor(ar, f32, 4, B, HV, hd, hd);
        a.o = tensor(ar, d, 4, B, T, HV, hd);
        a.final_state = tensor(ar, f32, 4, B, HV, hd, hd);
        return fqla_fwd_supported(ctx, &a);
    }
    if (op == 1) {
        fqla_bwd_args a;
        fqla_bwd_args_init(&a);
        a.q = tensor(ar, d, 4, B, T, H, hd);
        a.k = tensor(ar, d, 4, B, T, H, hd);
        a.v = tensor(ar, d, 4, B, T, HV, hd);
        a.g = tensor(ar, f32, 3, B, T, HV, 0);
        a.beta = tensor(ar, f32, 3, B, T, HV, 0);
        a.initial_state = tensor(ar, f32, 4, B, HV, hd, hd);
        a.d_o = tensor(ar, d, 4, B, T, HV, hd);
        a.d_final_state = tensor(ar, f32, 4, B, HV, hd, hd);
        a.dq = tensor(ar, d, 4, B, T, H, hd);
        a.dk = tensor(ar, d, 4, B, T, H, hd);
        a.dv = tensor(ar, d, 4, B, T, HV, hd);
        a.dg = tensor(ar, f32, 3, B, T, HV, 0);
        a.dbeta = tensor(ar, f32, 3, B, T, HV, 0);
        a.d_initial_state = tensor(ar, f32, 4, B, HV, hd, hd);
        return fqla_bwd_supported(ctx, &a);
    }
    fqla_decode_args a;
    fqla_decode_args_init(&a);
    a.q = tensor(ar, d, 4, B, T, H, hd);
    a.k = tensor(ar, d, 4, B, T, H, hd);
    a.v = tensor(ar, d, 4, B, T, HV, hd);
    a.g = tensor(ar, f32, 3, B, T, HV, 0);
    a.beta = tensor(ar, f32, 3, B, T, HV, 0);
    a.state_pool = tensor(ar, f32, 4, 1, HV, hd, hd);
    a.slots = tensor(ar, FQLA_DTYPE_I64, 1, B, 0, 0, 0);
    a.slots_host = &zero_slot;
    a.o = tensor(ar, d, 4, B, T, HV, hd);
    return fqla_decode_supported(ctx, &a);
}

static void print_support(fqla_context *ctx, const char *bname, probe_arena *ar)
{
    static const char *ops[] = { "fwd", "bwd", "decode" };
    for (int op = 0; op < 3; op++) {
        char first_why[300] = "";
        int any = 0;
        printf("  %-10s %-7s", bname, ops[op]);
        for (size_t h = 0; h < sizeof head_dims / sizeof head_dims[0]; h++) {
            printf("  %d:", head_dims[h]);
            int n = 0;
            for (size_t d = 0; d < sizeof dtypes / sizeof dtypes[0]; d++) {
                fqla_status st = probe(ctx, ar, op, head_dims[h], dtypes[d]);
                if (st == FQLA_STATUS_SUCCESS) {
                    printf(" %s", cli_dtype_name(dtypes[d]));
                    n++;
                } else if (!first_why[0] && dtypes[d] != FQLA_DTYPE_F64) {
                    snprintf(first_why, sizeof first_why, "%s: %s", fqla_status_string(st), fqla_last_error(ctx));
                }
            }
            if (!n) printf(" -");
            any += n;
        }
        printf("\n");
        if (!any) printf("  %-10s %-7s  (%s)\n", "", "", first_why);
    }
}

static void info_usage(FILE *f)
{
    fprintf(f, "usage: flashqla info\n\n"
               "Prints the version, the backends available (and why not), the GPUs, and the head dims\n"
               "and dtypes each backend supports for fwd, bwd and decode (asked of the library).\n");
}

int cli_info(int argc, char **argv)
{
    cli_args a;
    int r;
    cli_args_init(&a, "info", argc, argv);
    while ((r = cli_args_next(&a)) > 0) {
        if (cli_args_is(&a, "--help") || cli_args_is(&a, "-h")) {
            info_usage(stdout);
            return CLI_EXIT_OK;
        }
        return cli_args_unknown(&a);
    }
    if (r < 0) return CLI_EXIT_USAGE;

    printf("flashqla %s (library version %d)\n", FQLA_VERSION_STRING, fqla_version());
#ifdef FQLA_HAVE_CUDA
    printf("build:    CUDA backend compiled in (sm_90a)\n");
#else
    printf("build:    CPU only (no nvcc at build time, or make CUDA=0)\n");
#endif
    printf("backends:\n");
    int available[3] = { 0, 0, 0 };
    for (int i = 0; i < 3; i++) {
        char why[256] = "";
        fqla_status st = fqla_backend_available(backends[i], why, sizeof why);
        available[i] = st == FQLA_STATUS_SUCCESS;
        printf("  %-10s %s%s%s\n", cli_backend_name(backends[i]), available[i] ? "available" : "unavailable",
               why[0] ? ": " : "", why);
    }

    /* one context per backend (every GPU for CUDA): device facts, then the probes */
    probe_arena host_ar = { NULL, 0 };
    host_ar.base = cli_host_alloc(PROBE_SLOT * PROBE_SLOTS);
    if (!host_ar.base) {
        fprintf(stderr, "flashqla info: out of memory\n");
        return CLI_EXIT_FAIL;
    }
    memset(host_ar.base, 0, PROBE_SLOT * PROBE_SLOTS);
    int ndev = available[2] ? cli_dev_count() : 0;
    if (available[2] && ndev == 0) ndev = 1; /* the library found one even if we cannot count */
    printf("devices:\n");
    for (int i = 0; i < 2; i++) {
        /* both CPU backends see the same host: report it once */
        fqla_context *ctx = NULL;
        fqla_device_info info;
        if (!available[i] || fqla_context_create(&ctx, backends[i], 0) != FQLA_STATUS_SUCCESS) continue;
        if (fqla_context_info(ctx, &info) == FQLA_STATUS_SUCCESS)
            printf("  host       %d cores online, %d worker threads per call by default\n", info.sm_count, info.threads);
        fqla_context_destroy(ctx);
        break;
    }
    for (int dev = 0; dev < ndev; dev++) {
        fqla_context *ctx = NULL;
        fqla_device_info info;
        fqla_status st = fqla_context_create(&ctx, FQLA_BACKEND_CUDA, dev);
        if (st != FQLA_STATUS_SUCCESS) {
            printf("  cuda:%-5d %s: %s\n", dev, fqla_status_string(st), fqla_last_error(NULL));
            continue;
        }
        if (fqla_context_info(ctx, &info) == FQLA_STATUS_SUCCESS)
            printf("  cuda:%-5d %s, sm_%d%d, %d SMs\n", dev, info.name, info.cc_major, info.cc_minor, info.sm_count);
        fqla_context_destroy(ctx);
    }
    if (!available[2]) printf("  (no GPU)\n");

    printf("supported head dims (K = V) and q/k/v dtypes, asked of fqla_*_supported:\n");
    for (int i = 0; i < 3; i++) {
        fqla_context *ctx = NULL;
        if (!available[i]) {
            printf("  %-10s (backend unavailable)\n", cli_backend_name(backends[i]));
            continue;
        }
        if (fqla_context_create(&ctx, backends[i], 0) != FQLA_STATUS_SUCCESS) {
            printf("  %-10s (context: %s)\n", cli_backend_name(backends[i]), fqla_last_error(NULL));
            continue;
        }
        probe_arena ar = host_ar;
        void *dev_base = NULL;
        if (backends[i] == FQLA_BACKEND_CUDA) {
            char err[256];
            if (cli_dev_alloc(0, &dev_base, PROBE_SLOT * PROBE_SLOTS, err, sizeof err) == 0 &&
                cli_dev_upload(dev_base, host_ar.base, PROBE_SLOT * PROBE_SLOTS, err, sizeof err) == 0) {
                ar.base = dev_base;
            } else {
                printf("  %-10s (device memory for the probe: %s)\n", "cuda", err);
                cli_dev_free(dev_base);
                fqla_context_destroy(ctx);
                continue;
            }
        }
        print_support(ctx, cli_backend_name(backends[i]), &ar);
        cli_dev_free(dev_base);
        fqla_context_destroy(ctx);
    }
    cli_host_free(host_ar.base);
    return CLI_EXIT_OK;
}
