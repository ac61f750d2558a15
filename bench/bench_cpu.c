/*
 * bench_cpu.c - issue 43's CPU rows (cli/cpu_edge.h) with ggml's
 * ggml_gated_delta_net (the op llama.cpp runs for Qwen3.5's linear
 * attention) timed next to flashqla, interleaved, on the same fp32 inputs,
 * plus this machine's FMA peak, in one run. Without FQLA_BENCH_GGML it is
 * `flashqla bench --backend cpu --edge` on its own (no ggml column).
 *
 * ggml is never part of the repository: dev/cpu/build_ggml.sh builds it from
 * public sources outside it, and dev/cpu/bench_cpu.sh builds and runs this
 * file against that build:
 *   dev/cpu/build_ggml.sh ~/ggml ~/ggml-build
 *   dev/cpu/bench_cpu.sh ~/ggml ~/ggml-build/src --csv bench/results/cpu.csv
 * ggml gets its best case: its own thread pool made once per row (paused
 * between its timed batches so that its polling workers leave flashqla's
 * turn alone), its
 * state layout ([V, K] per head, the vk rows'), no l2norm or gate transforms
 * (as flashqla here), and only the op itself is timed (llama.cpp copies the
 * new state back into its cache with a further op).
 *
 * Options: [--repeat 5] [--prefill-T 4096] [--csv FILE] [--machine NAME]
 *          [--commit SHA] [--no-prefill] [--no-decode]
 */
#include "../cli/cpu_edge.h"

#ifdef FQLA_BENCH_GGML
#include "ggml.h"
#include "ggml-cpu.h"
#endif

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define H EDGE_H
#define HV EDGE_HV
#define K EDGE_K
#define V EDGE_V

#ifdef FQLA_BENCH_GGML
typedef struct ggml_side {
    struct ggml_context *ctx;
    struct ggml_cgraph *graph;
    struct ggml_threadpool *pool;
    struct ggml_cplan plan;
    void *work;
} ggml_side;

/* ggml's tensors over copies of the same inputs (ggml's shapes list the
 * innermost dim first, so q [K, H, T, B] is flashqla's [B, T, H, K] memory
 * as is; the state [V(j), K(i), HV, B] holds S[i][j] at j * K + i, the vk
 * pool's layout). */
static void *ggml_make(const edge_case *c, const edge_inputs *in)
{
    int64_t B = c->B, T = c->T;
    size_t bytes = (size_t)(B * T * (2 * H * K + HV * V + 2 * HV) + B * HV * K * V) * sizeof(float);
    size_t out = (size_t)(B * T * HV * V + B * HV * K * V * (c->verify ? T : 1)) * sizeof(float);
    ggml_side *s = calloc(1, sizeof *s);
    struct ggml_init_params ip = {bytes + out + 64 * 1024 * 1024, NULL, false};
    if (!s || !(s->ctx = ggml_init(ip))) {
        free(s);
        return NULL;
    }
    struct ggml_tensor *q = ggml_new_tensor_4d(s->ctx, GGML_TYPE_F32, K, H, T, B);
    struct ggml_tensor *k = ggml_new_tensor_4d(s->ctx, GGML_TYPE_F32, K, H, T, B);
    struct ggml_tensor *v = ggml_new_tensor_4d(s->ctx, GGML_TYPE_F32, V, HV, T, B);
    struct ggml_tensor *g = ggml_new_tensor_4d(s->ctx, GGML_TYPE_F32, 1, HV, T, B);
    struct ggml_tensor *be = ggml_new_tensor_4d(s->ctx, GGML_TYPE_F32, 1, HV, T, B);
    struct ggml_tensor *st = ggml_new_tensor_4d(s->ctx, GGML_TYPE_F32, V, K, HV, B);
    memcpy(ggml_get_data(q), in->q, ggml_nbytes(q));
    memcpy(ggml_get_data(k), in->k, ggml_nbytes(k));
    memcpy(ggml_get_data(v), in->v, ggml_nbytes(v));
    memcpy(ggml_get_data(g), in->g, ggml_nbytes(g));
    memcpy(ggml_get_data(be), in->beta, ggml_nbytes(be));
    memcpy(ggml_get_data(st), in->state, ggml_nbytes(st));
    /* verify: a snapshot of the state after each token, as flashqla's step_states */
    struct ggml_tensor *r = ggml_gated_delta_net(s->ctx, q, k, v, g, be, st, c->verify ? T : 1);
    s->graph = ggml_new_graph(s->ctx);
    ggml_build_forward_expand(s->graph, r);
    struct ggml_threadpool_params tp = ggml_threadpool_params_default(c->threads);
    s->pool = ggml_threadpool_new(&tp);
    s->plan = ggml_graph_plan(s->graph, c->threads, s->pool);
    s->work = malloc(s->plan.work_size + 64);
    s->plan.work_data = s->work;
    return s;
}

static int ggml_run(void *h)
{
    ggml_side *s = h;
    return ggml_graph_compute(s->graph, &s->plan) == GGML_STATUS_SUCCESS ? 0 : -1;
}

/* ggml's workers poll for work after a graph (for up to ~100 ms at the
 * default polling level), which took the second core from flashqla's
 * 2-thread prefill in the alternating runs; paused, they sleep until the
 * next graph resumes them. */
static void ggml_idle(void *h)
{
    ggml_side *s = h;
    ggml_threadpool_pause(s->pool);
}

static void ggml_drop(void *h)
{
    ggml_side *s = h;
    ggml_threadpool_free(s->pool);
    free(s->work);
    ggml_free(s->ctx);
    free(s);
}

static const edge_other ggml_other = {"ggml", ggml_make, ggml_run, ggml_idle, ggml_drop};
#endif

int main(int argc, char **argv)
{
    edge_opts o;
    memset(&o, 0, sizeof o);
    o.repeat = 5;
    o.prefill_T = 4096;
    o.decode = o.prefill = 1;
    o.machine = "cpu";
    o.commit = "unknown";
    const char *csv = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--repeat") && i + 1 < argc) o.repeat = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--prefill-T") && i + 1 < argc) o.prefill_T = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--csv") && i + 1 < argc) csv = argv[++i];
        else if (!strcmp(argv[i], "--machine") && i + 1 < argc) o.machine = argv[++i];
        else if (!strcmp(argv[i], "--commit") && i + 1 < argc) o.commit = argv[++i];
        else if (!strcmp(argv[i], "--no-prefill")) o.prefill = 0;
        else if (!strcmp(argv[i], "--no-decode")) o.decode = 0;
        else {
            fprintf(stderr, "usage: %s [--repeat N] [--prefill-T T] [--csv FILE] [--machine NAME] [--commit SHA] "
                            "[--no-prefill] [--no-decode]\n", argv[0]);
            return 2;
        }
    }
    if (o.repeat < 1) o.repeat = 1;
    if (o.prefill_T < 1) o.prefill_T = 1;
#ifdef FQLA_BENCH_GGML
    o.other = &ggml_other;
#endif
    if (csv && !(o.csv = fopen(csv, "a"))) {
        fprintf(stderr, "bench_cpu: cannot append to %s\n", csv);
        return 2;
    }
    int rc = edge_run(&o);
    if (o.csv)
        fclose(o.csv);
    return rc;
}
