/*
 * inputs.h - the raw input tensors of an operation as both CPU backends (the
 * fp64 reference and the fast fp32 path) read them: filled from the public
 * argument structs, which name them alike, plus the row offset and the
 * transformed gate and beta of one token (DESIGN.md §1).
 */
#ifndef FQLA_CPU_INPUTS_H
#define FQLA_CPU_INPUTS_H

#include "internal.h"

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

/* The gate g and beta of (b, t, h) after the in-kernel transforms the
 * options ask for (transforms.h), in fp64. */
double fqla_cpu_gate(const fqla_cpu_inputs *in, int64_t b, int64_t t, int64_t h);
double fqla_cpu_beta(const fqla_cpu_inputs *in, int64_t b, int64_t t, int64_t h);

#endif
