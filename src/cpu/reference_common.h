/*
 * reference_common.h - what the fp64 reference files (reference_*.c) share:
 * loading one token's inputs in fp64 with the in-kernel transforms applied,
 * the state layout, the one-token recurrence step, and running independent
 * tasks that may fail on fqla_cpu_parallel_for. What the fast path reads
 * and writes the same way (input set, gate and beta, offsets, uncovered
 * rows) is in cpu_io.h.
 */
#ifndef FQLA_CPU_REFERENCE_COMMON_H
#define FQLA_CPU_REFERENCE_COMMON_H

#include "internal.h"
#include "cpu/cpu_io.h"

/* q or k of row (b, t), q/k head hk: [K] doubles, l2-normalised when the
 * options ask; returns the l2norm factor r (1 when l2norm is off). */
double fqla_ref_load_qk(const fqla_cpu_inputs *in, const fqla_tensor *x,
                        int64_t b, int64_t t, int64_t hk, double *dst);
/* Row (b, t, h) of a 4-D tensor [B, T, heads, n]: load into / store from
 * n doubles. */
void fqla_ref_load_row(const fqla_tensor *x, int64_t b, int64_t t, int64_t h, int64_t n, double *dst);
void fqla_ref_store_row(const fqla_tensor *x, int64_t b, int64_t t, int64_t h, int64_t n, const double *src);
/* v of row (b, t), value head h: [V] doubles. */
void fqla_ref_load_v(const fqla_cpu_inputs *in, int64_t b, int64_t t, int64_t h, double *dst);
/* Loads / stores a state as S[i * V + j] (i over K, j over V), honouring
 * state_v_first. */
void fqla_ref_state_load(const fqla_tensor *t, int64_t base, int64_t K, int64_t V,
                         int v_first, double *S);
void fqla_ref_state_store(const fqla_tensor *t, int64_t base, int64_t K, int64_t V,
                          int v_first, const double *S);

/* One token of the recurrence on S (K x V, row-major), in two passes over S:
 *   S <- exp(g) S;  r = v - S^T k;  S <- S + beta k r^T
 * r [V] receives the residual (u = beta r). When o is not NULL it receives
 * o = scale S^T q of the updated state (q [K]). */
void fqla_ref_step(double *S, int64_t K, int64_t V, const double *k, const double *v,
                   double g, double beta, double *r, const double *q, double scale, double *o);

/* One token of the forward and decode walks: loads the transformed q, k, v,
 * g, beta of row (b, t), value head h, runs fqla_ref_step on S [K, V] and
 * stores the row of o. buf: [2 K + 3 V] doubles of scratch. */
void fqla_ref_token(const fqla_cpu_inputs *in, const fqla_tensor *o, double *S, double *buf,
                    int64_t b, int64_t t, int64_t h);

/* Runs fn(arg, task) for task in [0, ntasks) on up to `threads` threads
 * (fqla_cpu_parallel_for, src/cpu/threads.h). fn returns
 * FQLA_STATUS_SUCCESS or an error; every task runs, and the error of the
 * lowest failing task is returned (deterministic whatever the scheduling). */
typedef fqla_status (*fqla_ref_task_fn)(void *arg, int64_t task);
fqla_status fqla_ref_parallel(int threads, int64_t ntasks, fqla_ref_task_fn fn, void *arg);

#endif
