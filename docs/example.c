/*
 * example.c - the README's usage example: one Gated DeltaNet forward on the
 * CPU backend, fp32, with an initial and a final state. tests/test_example.c
 * compiles and runs this very file, so it cannot drift from the API.
 *
 *   cc -std=c99 -Iinclude docs/example.c build/libflashqla.a -lm -pthread
 *   (add the CUDA runtime libraries of the Makefile's LDLIBS to link a CUDA build,
 *    or link build/libflashqla.so instead)
 */
#include "flashqla.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int main(void)
{
    enum { B = 1, T = 200, H = 2, HV = 4, K = 128, V = 128 };
    int64_t qk_shape[4] = { B, T, H, K }, vo_shape[4] = { B, T, HV, V };
    int64_t gate_shape[3] = { B, T, HV }, state_shape[4] = { B, HV, K, V };
    float *q = malloc(sizeof(float) * B * T * H * K), *k = malloc(sizeof(float) * B * T * H * K);
    float *v = malloc(sizeof(float) * B * T * HV * V), *o = malloc(sizeof(float) * B * T * HV * V);
    float *g = malloc(sizeof(float) * B * T * HV), *beta = malloc(sizeof(float) * B * T * HV);
    float *h0 = malloc(sizeof(float) * B * HV * K * V), *ht = malloc(sizeof(float) * B * HV * K * V);
    if (!q || !k || !v || !o || !g || !beta || !h0 || !ht) return 1;

    /* Some inputs: q, k are l2-normalised inside (use_qk_l2norm), g <= 0 is the log decay. */
    uint32_t seed = 1;
    for (int i = 0; i < B * T * H * K; i++) {
        seed = seed * 1664525u + 1013904223u; q[i] = (float)(seed >> 8) / 16777216.0f - 0.5f;
        seed = seed * 1664525u + 1013904223u; k[i] = (float)(seed >> 8) / 16777216.0f - 0.5f;
    }
    for (int i = 0; i < B * T * HV * V; i++) v[i] = (float)(i % 7) - 3.0f;
    for (int i = 0; i < B * T * HV; i++) { g[i] = -0.05f * (float)(i % HV); beta[i] = 0.5f; }
    for (int i = 0; i < B * HV * K * V; i++) h0[i] = 0.01f * (float)(i % 5);

    fqla_context *ctx;
    fqla_status st = fqla_context_create(&ctx, FQLA_BACKEND_CPU, 0);
    if (st != FQLA_STATUS_SUCCESS) {
        fprintf(stderr, "context: %s\n", fqla_last_error(NULL));
        return 1;
    }

    fqla_fwd_args args;
    fqla_fwd_args_init(&args);   /* scale = 1/sqrt(K), every option off */
    args.q = fqla_tensor_contiguous(q, FQLA_DTYPE_F32, 4, qk_shape);
    args.k = fqla_tensor_contiguous(k, FQLA_DTYPE_F32, 4, qk_shape);
    args.v = fqla_tensor_contiguous(v, FQLA_DTYPE_F32, 4, vo_shape);
    args.g = fqla_tensor_contiguous(g, FQLA_DTYPE_F32, 3, gate_shape);
    args.beta = fqla_tensor_contiguous(beta, FQLA_DTYPE_F32, 3, gate_shape);
    args.initial_state = fqla_tensor_contiguous(h0, FQLA_DTYPE_F32, 4, state_shape);
    args.o = fqla_tensor_contiguous(o, FQLA_DTYPE_F32, 4, vo_shape);
    args.final_state = fqla_tensor_contiguous(ht, FQLA_DTYPE_F32, 4, state_shape);
    args.opt.use_qk_l2norm = 1;

    /* The caller owns the workspace: ask its size, give it 256-byte aligned. */
    size_t ws_bytes = 0;
    st = fqla_fwd_workspace_size(ctx, &args, &ws_bytes);
    unsigned char *ws_raw = malloc(ws_bytes + 256);
    void *ws = ws_raw ? (void *)(((uintptr_t)ws_raw + 255) & ~(uintptr_t)255) : NULL;
    if (st == FQLA_STATUS_SUCCESS)
        st = fqla_fwd(ctx, &args, ws, ws_bytes, NULL /* stream: ignored on the CPU */);

    if (st == FQLA_STATUS_SUCCESS)
        printf("o[0, %d, 0, 0] = %.6f, final state[0, 0, 0, 0] = %.6f\n", T - 1,
               o[(T - 1) * HV * V], ht[0]);
    else   /* the message names the offending argument */
        fprintf(stderr, "fqla_fwd: %s: %s\n", fqla_status_string(st), fqla_last_error(ctx));

    fqla_context_destroy(ctx);
    free(ws_raw); free(q); free(k); free(v); free(o); free(g); free(beta); free(h0); free(ht);
    return st == FQLA_STATUS_SUCCESS ? 0 : 1;
}
