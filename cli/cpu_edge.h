/*
 * cpu_edge.h - issue 43's CPU rows: the fast CPU backend's decode, verify and
 * prefill at H = 16, HV = 32, K = V = 128, fp32, against this machine's FMA
 * peak and, where a caller supplies one, another implementation of the same
 * op timed in the same run (bench/bench_cpu.c: ggml's ggml_gated_delta_net).
 * `flashqla bench --backend cpu --edge` and bench/bench_cpu.c run it; both
 * write the records of bench/results/cpu.csv:
 *   op,threads,T,batch,h_qk,h_v,dtype,layout,flashqla_us,ggml_us,peak_gflops,achieved_gflops,machine,commit,date
 *
 * Rows (op, threads, T, batch, layout):
 *   decode   T = 1, B = 1 and 16, 1 thread, state pool [K, V] ("kv") and
 *            [V, K] ("vk"); flashqla updates the pool in place
 *   verify   recorded as op decode, T = 4, B = 1: fqla_verify with step_states
 *   prefill  T = 4096 (prefill_T), B = 1, 1 and 2 threads: fqla_fwd with an
 *            initial and a final state
 * Inputs: the plain recurrence (no in-kernel l2norm / gate / sigmoid): q and
 * k l2-normalised rows, g = logsigmoid(randn) / 16, beta = sigmoid(randn); the
 * state stays in cache between calls. Timing: flashqla and the other side
 * alternate, `repeat` rounds of a batch of calls (~20 ms) each, and each
 * side's best batch is kept (the least disturbed on a shared machine), so the
 * ratio of the two holds from machine to machine. The FMA peak is a loop of
 * independent FMA chains (AVX-512 where the CPU has it, else AVX2 + FMA) on
 * one thread; achieved_gflops counts the useful flops of the algorithm
 * flashqla runs (decode: 7 K V per token and head; prefill: the chunked
 * algorithm's products, triangles counted as half).
 */
#ifndef FQLA_CLI_CPU_EDGE_H
#define FQLA_CLI_CPU_EDGE_H

#include <stdint.h>
#include <stdio.h>

enum { EDGE_H = 16, EDGE_HV = 32, EDGE_K = 128, EDGE_V = 128 };

typedef struct edge_case {
    const char *op;    /* "decode" or "prefill" */
    int threads, verify, v_first;
    int64_t T, B;
} edge_case;

/* The inputs of a case, fp32, flashqla's layouts: q, k [B, T, H, K];
 * v [B, T, HV, V]; g, beta [B, T, HV]; state [B, HV, K, V] (K == V, so the
 * same memory serves as [B, HV, V, K]); o and state_out are flashqla's. */
typedef struct edge_inputs {
    float *q, *k, *v, *g, *beta, *state;
    float *o, *state_out;
    int64_t *slots;
} edge_inputs;

/* Another implementation of the same case, timed next to flashqla. */
typedef struct edge_other {
    const char *name;
    void *(*make)(const edge_case *c, const edge_inputs *in); /* NULL: cannot run this case */
    int (*run)(void *h);                                        /* 0 on success */
    void (*idle)(void *h); /* after each timed batch, untimed (NULL: nothing): e.g. park
                              threads that would otherwise spin through flashqla's turn */
    void (*drop)(void *h);
} edge_other;

typedef struct edge_opts {
    int repeat;          /* rounds per row (>= 1) */
    int64_t prefill_T;   /* tokens of the prefill rows */
    int decode, prefill; /* which rows */
    const char *machine, *commit;
    FILE *csv;           /* records appended here (NULL: none); header when empty */
    const edge_other *other; /* NULL: flashqla and the peak only (ggml_us empty) */
} edge_opts;

/* Runs the rows, prints a Markdown table on stdout. Returns 0, or 1 when a
 * flashqla call failed (its message on stderr). */
int edge_run(const edge_opts *o);

/* GFLOP/s of one thread's best FMA loop. */
double edge_fma_peak(int repeat);

#endif
