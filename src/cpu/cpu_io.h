/*
 * cpu_io.h - tensor access that both CPU backends (the fp64 reference and the
 * fast fp32 path) share, so that they read inputs and write the simple
 * outputs the same way: the input set of an operation, filled from the
 * public argument structs (which name the inputs alike); row and state
 * offsets; slot indices; the gate and beta of one token after the in-kernel
 * transforms (docs/design.md §1) and the backward through them; and zeroing the
 * rows no sequence covers. Element conversions are internal.h's.
 */
#ifndef FQLA_CPU_IO_H
#define FQLA_CPU_IO_H

#include "internal.h"

/* The largest head dim (K, V) the fast fp32 CPU backend takes
 * (cpu_supported.c); its decode keeps per-token rows on the stack. */
#define FQLA_CPU_MAX_HEAD_DIM 256

/* The raw input tensors of an operation and the problem. */
typedef struct fqla_cpu_inputs {
    const fqla_problem *p;
    const fqla_tensor *q, *k, *v, *g, *beta, *A_log, *dt_bias;
} fqla_cpu_inputs;

/* The input set of the forward, backward and decode / verify arguments. */
fqla_cpu_inputs fqla_cpu_inputs_fwd(const fqla_problem *p, const fqla_fwd_args *a);
fqla_cpu_inputs fqla_cpu_inputs_bwd(const fqla_problem *p, const fqla_bwd_args *a);
fqla_cpu_inputs fqla_cpu_inputs_decode(const fqla_problem *p, const fqla_decode_args *a);

/* Element offset of (b, t, h, 0) in a 4-D row tensor, (b, t, h) in a 3-D
 * one. Inline: the fast path takes it for every row it loads or stores. */
static inline int64_t fqla_cpu_row_offset(const fqla_tensor *x, int64_t b, int64_t t, int64_t h)
{
    return b * x->strides[0] + t * x->strides[1] + h * x->strides[2];
}

/* Offset of state [lead..., 0, 0] in a state tensor whose last two dims are
 * [K, V] (or [V, K]); lead has ndim - 2 entries. */
int64_t fqla_cpu_state_base(const fqla_tensor *t, const int64_t *lead);

/* Element `offset` of an I32 or I64 index tensor (slots, step_slots: the
 * dtypes validation admits). */
int64_t fqla_cpu_load_index(const fqla_tensor *t, int64_t offset);

/* The gate g and beta of (b, t, h) after the in-kernel transforms the
 * options ask for (transforms.h), in fp64. */
double fqla_cpu_gate(const fqla_cpu_inputs *in, int64_t b, int64_t t, int64_t h);
double fqla_cpu_beta(const fqla_cpu_inputs *in, int64_t b, int64_t t, int64_t h);

/* Backward through fqla_cpu_gate and fqla_cpu_beta for token (b, t), value
 * head h of sequence n: given dL/dg and dL/dbeta of the transformed values,
 * stores the gradients of the raw inputs into a->dg, a->dbeta and, with the
 * in-kernel gate, adds the per-head parts to dA_log_part[n * HV + h] and
 * ddt_bias_part[n * HV + h] (partial sums per sequence, NULL without it). */
void fqla_cpu_store_gate_grads(const fqla_problem *p, const fqla_bwd_args *a, double *dA_log_part,
                               double *ddt_bias_part, int64_t n, int64_t b, int64_t t, int64_t h,
                               double dg, double dbeta);
/* Sums those partial sums over the sequences in a fixed order (the same
 * result for any thread count) into a->dA_log and a->ddt_bias. */
void fqla_cpu_reduce_gate_params(const fqla_problem *p, const fqla_bwd_args *a,
                                 const double *dA_log_part, const double *ddt_bias_part);

/* Zeroes rows [t0, t1) of batch row b of a [B, T, ...] tensor (3-D or 4-D;
 * absent tensors ignored), and every row no sequence covers (varlen: the
 * rows after the last cu_seqlens entry). */
void fqla_cpu_zero_rows(const fqla_tensor *x, int64_t b, int64_t t0, int64_t t1);
void fqla_cpu_zero_uncovered(const fqla_problem *p, const fqla_tensor *x);

#endif
