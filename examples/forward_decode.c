/*
 * forward_decode.c - prefill, then one decode step, on the CPU backend,
 * through the public C API (include/flashqla.h).
 *
 * Two sequences of T tokens run through the chunked forward (fqla_fwd); their
 * final states go into a state pool, the way a serving engine keeps them; then
 * one more token per sequence runs through fqla_decode, which updates the
 * pool in place. To show the two agree, the program also runs the forward on
 * all T + 1 tokens at once and checks that the decode step gave the same last
 * output and the same state ("prefill then decode == a longer prefill").
 *
 * Build and run from the repository root (`make test` does this too):
 *
 *   make CUDA=0
 *   cc -std=c99 -Iinclude examples/forward_decode.c build/libflashqla.a -lm -pthread
 *   ./a.out
 *
 * (a CUDA build of the library also needs the CUDA runtime libraries of the
 * Makefile's LDLIBS, or link build/libflashqla.so instead.)
 */
#include "flashqla.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Sizes: B sequences, T prefill tokens, H query/key heads, HV value heads
 * (HV a multiple of H: grouped-value attention), head dims K and V, P pool rows. */
enum { B = 2, T = 48, H = 2, HV = 4, K = 64, V = 64, P = 4 };

/* A view of `tokens` tokens, from token `first` on, of a buffer holding T + 1
 * tokens per sequence: [B, T + 1, heads, dim] for q, k, v (ndim 4), or
 * [B, T + 1, heads] for g, beta (ndim 3, dim = 1). Tensors carry strides (in
 * elements), so a slice of a larger buffer needs no copy. */
static fqla_tensor tokens_view(float *data, int64_t first, int64_t tokens, int64_t heads, int64_t dim, int ndim)
{
    int64_t shape[4] = { B, tokens, heads, dim };
    fqla_tensor t = fqla_tensor_contiguous(data + first * heads * (ndim == 4 ? dim : 1), FQLA_DTYPE_F32,
                                           ndim, shape);
    /* the batch stride is that of the full buffer, T + 1 tokens per sequence */
    t.strides[0] = (int64_t)(T + 1) * heads * (ndim == 4 ? dim : 1);
    return t;
}

/* Workspace: ask its size, hand it over 256-byte aligned. Returns the block to free. */
static void *aligned_workspace(size_t bytes, void **aligned)
{
    unsigned char *raw = malloc(bytes + 256);
    *aligned = raw ? (void *)(((uintptr_t)raw + 255) & ~(uintptr_t)255) : NULL;
    return raw;
}

/* Prints the failing call, its status and the library's message (which names
 * the offending argument); returns 1 on failure. */
static int failed(fqla_status st, const char *what, const fqla_context *ctx)
{
    if (st == FQLA_STATUS_SUCCESS) return 0;
    fprintf(stderr, "%s: %s: %s\n", what, fqla_status_string(st), fqla_last_error(ctx));
    return 1;
}

static float uniform(uint32_t *seed) /* in [-0.5, 0.5) */
{
    *seed = *seed * 1664525u + 1013904223u;
    return (float)(*seed >> 8) / 16777216.0f - 0.5f;
}

int main(void)
{
    /* Inputs for T + 1 tokens per sequence; the last one is the decode token. */
    const size_t nqk = (size_t)B * (T + 1) * H * K, nv = (size_t)B * (T + 1) * HV * V;
    const size_t ngate = (size_t)B * (T + 1) * HV, nstate = (size_t)HV * K * V;
    float *q = malloc(nqk * sizeof(float)), *k = malloc(nqk * sizeof(float));
    float *v = malloc(nv * sizeof(float)), *g = malloc(ngate * sizeof(float));
    float *beta = malloc(ngate * sizeof(float));
    float *o_full = calloc(nv, sizeof(float));                    /* forward over T + 1 tokens */
    float *o_prefill = calloc((size_t)B * T * HV * V, sizeof(float));
    float *o_decode = calloc((size_t)B * HV * V, sizeof(float));  /* [B, 1, HV, V] */
    float *state_full = calloc(B * nstate, sizeof(float));        /* [B, HV, K, V] */
    float *state_prefill = calloc(B * nstate, sizeof(float));
    float *pool = calloc(P * nstate, sizeof(float));              /* [P, HV, K, V] */
    void *ws_raw = NULL, *ws = NULL;
    fqla_context *ctx = NULL;
    int rc = 1;
    if (!q || !k || !v || !g || !beta || !o_full || !o_prefill || !o_decode || !state_full ||
        !state_prefill || !pool) {
        fprintf(stderr, "out of memory\n");
        goto done;
    }

    uint32_t seed = 7;
    for (size_t i = 0; i < nqk; i++) { q[i] = uniform(&seed); k[i] = uniform(&seed); }
    for (size_t i = 0; i < nv; i++) v[i] = uniform(&seed);
    for (size_t i = 0; i < ngate; i++) {
        g[i] = -0.1f * (1.0f + uniform(&seed));   /* log decay, <= 0 */
        beta[i] = 0.5f + 0.8f * uniform(&seed);   /* write strength in (0, 1) */
    }

    /* One context per backend (and thread, for per-call messages). */
    if (failed(fqla_context_create(&ctx, FQLA_BACKEND_CPU, 0), "fqla_context_create", NULL)) goto done;

    /* 1. Prefill: the first T tokens of each sequence, from a zero state. */
    fqla_fwd_args fa;
    fqla_fwd_args_init(&fa);            /* scale = 1/sqrt(K), every option off */
    fa.q = tokens_view(q, 0, T, H, K, 4);
    fa.k = tokens_view(k, 0, T, H, K, 4);
    fa.v = tokens_view(v, 0, T, HV, V, 4);
    fa.g = tokens_view(g, 0, T, HV, 1, 3);
    fa.beta = tokens_view(beta, 0, T, HV, 1, 3);
    int64_t o_prefill_shape[4] = { B, T, HV, V }, state_shape[4] = { B, HV, K, V };
    fa.o = fqla_tensor_contiguous(o_prefill, FQLA_DTYPE_F32, 4, o_prefill_shape);
    fa.final_state = fqla_tensor_contiguous(state_prefill, FQLA_DTYPE_F32, 4, state_shape);
    fa.opt.use_qk_l2norm = 1;           /* q, k l2-normalised inside, as Qwen3-Next does */

    size_t ws_bytes = 0;
    if (failed(fqla_fwd_workspace_size(ctx, &fa, &ws_bytes), "fqla_fwd_workspace_size", ctx)) goto done;
    ws_raw = aligned_workspace(ws_bytes, &ws);
    if (!ws_raw) { fprintf(stderr, "out of memory\n"); goto done; }
    if (failed(fqla_fwd(ctx, &fa, ws, ws_bytes, NULL /* stream: ignored on the CPU */), "fqla_fwd (prefill)", ctx))
        goto done;
    free(ws_raw); ws_raw = NULL;

    /* 2. The engine keeps each sequence's state in a pool row of its choosing. */
    const int32_t slots[B] = { 2, 0 };
    for (int b = 0; b < B; b++)
        memcpy(pool + (size_t)slots[b] * nstate, state_prefill + (size_t)b * nstate, nstate * sizeof(float));

    /* 3. Decode: token T of each sequence, reading and updating pool[slots[b]] in place.
     *    (A negative slot, -1, would mark a padding row: skipped, its output zeroed.) */
    fqla_decode_args da;
    fqla_decode_args_init(&da);
    da.q = tokens_view(q, T, 1, H, K, 4);
    da.k = tokens_view(k, T, 1, H, K, 4);
    da.v = tokens_view(v, T, 1, HV, V, 4);
    da.g = tokens_view(g, T, 1, HV, 1, 3);
    da.beta = tokens_view(beta, T, 1, HV, 1, 3);
    int64_t pool_shape[4] = { P, HV, K, V }, slots_shape[1] = { B }, o_decode_shape[4] = { B, 1, HV, V };
    da.state_pool = fqla_tensor_contiguous(pool, FQLA_DTYPE_F32, 4, pool_shape);
    da.slots = fqla_tensor_contiguous((void *)slots, FQLA_DTYPE_I32, 1, slots_shape);
    da.o = fqla_tensor_contiguous(o_decode, FQLA_DTYPE_F32, 4, o_decode_shape);
    da.opt.use_qk_l2norm = 1;

    if (failed(fqla_decode_workspace_size(ctx, &da, &ws_bytes), "fqla_decode_workspace_size", ctx)) goto done;
    ws_raw = aligned_workspace(ws_bytes, &ws);
    if (!ws_raw) { fprintf(stderr, "out of memory\n"); goto done; }
    if (failed(fqla_decode(ctx, &da, ws, ws_bytes, NULL), "fqla_decode", ctx)) goto done;

    /* Errors name the argument: a slot past the pool's end is rejected and nothing
     * is written (the message: "slots[1] = 4 but state_pool has P = 4 entries"). */
    const int32_t bad_slots[B] = { 2, P };
    da.slots.data = (void *)bad_slots;
    fqla_status st = fqla_decode(ctx, &da, ws, ws_bytes, NULL);
    printf("a slot past the pool's end: %s: %s\n", fqla_status_string(st), fqla_last_error(ctx));
    if (st != FQLA_STATUS_INVALID_VALUE) { fprintf(stderr, "expected INVALID_VALUE\n"); goto done; }
    free(ws_raw); ws_raw = NULL;

    /* 4. Check: one forward over all T + 1 tokens gives the same last output and state. */
    fqla_fwd_args ff = fa;
    ff.q = tokens_view(q, 0, T + 1, H, K, 4);
    ff.k = tokens_view(k, 0, T + 1, H, K, 4);
    ff.v = tokens_view(v, 0, T + 1, HV, V, 4);
    ff.g = tokens_view(g, 0, T + 1, HV, 1, 3);
    ff.beta = tokens_view(beta, 0, T + 1, HV, 1, 3);
    int64_t o_full_shape[4] = { B, T + 1, HV, V };
    ff.o = fqla_tensor_contiguous(o_full, FQLA_DTYPE_F32, 4, o_full_shape);
    ff.final_state = fqla_tensor_contiguous(state_full, FQLA_DTYPE_F32, 4, state_shape);
    if (failed(fqla_fwd_workspace_size(ctx, &ff, &ws_bytes), "fqla_fwd_workspace_size", ctx)) goto done;
    ws_raw = aligned_workspace(ws_bytes, &ws);
    if (!ws_raw) { fprintf(stderr, "out of memory\n"); goto done; }
    if (failed(fqla_fwd(ctx, &ff, ws, ws_bytes, NULL), "fqla_fwd (T + 1 tokens)", ctx)) goto done;

    double err_o = 0, err_s = 0;
    for (int b = 0; b < B; b++) {
        for (int i = 0; i < HV * V; i++) {
            double ref = o_full[((size_t)b * (T + 1) + T) * HV * V + i];
            err_o = fmax(err_o, fabs(o_decode[(size_t)b * HV * V + i] - ref) / (fabs(ref) + 1e-3));
        }
        for (size_t i = 0; i < nstate; i++) {
            double ref = state_full[(size_t)b * nstate + i];
            err_s = fmax(err_s, fabs(pool[(size_t)slots[b] * nstate + i] - ref) / (fabs(ref) + 1e-3));
        }
    }
    printf("prefill %d tokens + decode 1 vs forward over %d tokens: max rel. diff o %.2e, state %.2e\n",
           T, T + 1, err_o, err_s);
    rc = (err_o < 1e-3 && err_s < 1e-3) ? 0 : 1;   /* both paths are fp32: ~1e-6 expected */
    if (rc) fprintf(stderr, "decode disagrees with the forward\n");

done:
    fqla_context_destroy(ctx);   /* NULL is a no-op */
    free(ws_raw); free(q); free(k); free(v); free(g); free(beta); free(o_full); free(o_prefill);
    free(o_decode); free(state_full); free(state_prefill); free(pool);
    return rc;
}
