/*
 * reference_common.h - what the fp64 reference files (reference_*.c) share:
 * loading one token's inputs with the in-kernel transforms applied, the
 * state layout, the one-token recurrence step, zeroing uncovered rows, and
 * running independent tasks that may fail on fqla_cpu_parallel_for.
 */
#ifndef FQLA_CPU_REFERENCE_COMMON_H
#define FQLA_CPU_REFERENCE_COMMON_H

#include "internal.h"
#include "cpu/inputs.h" /* the input set, and the transformed gate and beta */

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
/* Element (b, t, h) of a [B, T, HV] tensor, as stored (the raw gate / beta). */
double fqla_ref_load_bth(const fqla_tensor *x, int64_t b, int64_t t, int64_t h);
void fqla_ref_store_bth(const fqla_tensor *x, int64_t b, int64_t t, int64_t h, double value);

/* Offset of state [lead..., 0, 0] in a state tensor whose last two dims are
 * [K, V] (or [V, K]); lead has ndim - 2 entries. */
int64_t fqla_ref_state_base(const fqla_tensor *t, const int64_t *lead);
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

/* Writes zeros into rows [t0, t1) of batch row b of a [B, T, ...] tensor
 * (3-D or 4-D); absent tensors are ignored. */
void fqla_ref_zero_rows(const fqla_tensor *x, int64_t b, int64_t t0, int64_t t1);
/* Zeroes every row of x not covered by a sequence of p (varlen: the rows
 * after the last cu_seqlens entry). */
void fqla_ref_zero_uncovered(const fqla_problem *p, const fqla_tensor *x);

/* Reads an integer (I32 / I64 index tensor, or any other dtype by value). */
int64_t fqla_ref_load_index(const fqla_tensor *t, int64_t offset);

/* Runs fn(arg, task) for task in [0, ntasks) on up to `threads` threads
 * (fqla_cpu_parallel_for, src/cpu/threads.h). fn returns
 * FQLA_STATUS_SUCCESS or an error; every task runs, and the error of the
 * lowest failing task is returned (deterministic whatever the scheduling). */
typedef fqla_status (*fqla_ref_task_fn)(void *arg, int64_t task);
fqla_status fqla_ref_parallel(int threads, int64_t ntasks, fqla_ref_task_fn fn, void *arg);

#endif
