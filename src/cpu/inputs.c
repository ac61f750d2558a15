/*
 * inputs.c - the input set of an operation from its arguments, and the
 * transformed gate and beta of one token, shared by both CPU backends (see
 * inputs.h).
 */
#include "cpu/inputs.h"
#include "cpu/transforms.h"

static fqla_cpu_inputs make_inputs(const fqla_problem *p, const fqla_tensor *q, const fqla_tensor *k,
                                   const fqla_tensor *v, const fqla_tensor *g, const fqla_tensor *beta,
                                   const fqla_tensor *A_log, const fqla_tensor *dt_bias)
{
    fqla_cpu_inputs in;
    in.p = p;
    in.q = q;
    in.k = k;
    in.v = v;
    in.g = g;
    in.beta = beta;
    in.A_log = A_log;
    in.dt_bias = dt_bias;
    return in;
}

fqla_cpu_inputs fqla_cpu_inputs_fwd(const fqla_problem *p, const fqla_fwd_args *a)
{
    return make_inputs(p, &a->q, &a->k, &a->v, &a->g, &a->beta, &a->A_log, &a->dt_bias);
}

fqla_cpu_inputs fqla_cpu_inputs_bwd(const fqla_problem *p, const fqla_bwd_args *a)
{
    return make_inputs(p, &a->q, &a->k, &a->v, &a->g, &a->beta, &a->A_log, &a->dt_bias);
}

fqla_cpu_inputs fqla_cpu_inputs_decode(const fqla_problem *p, const fqla_decode_args *a)
{
    return make_inputs(p, &a->q, &a->k, &a->v, &a->g, &a->beta, &a->A_log, &a->dt_bias);
}

double fqla_cpu_gate(const fqla_cpu_inputs *in, int64_t b, int64_t t, int64_t h)
{
    double g = fqla_load(in->g, fqla_cpu_row_offset(in->g, b, t, h));
    if (in->p->opt.use_gate_in_kernel)
        g = fqla_gate_value(g, fqla_load(in->A_log, h * in->A_log->strides[0]),
                            fqla_load(in->dt_bias, h * in->dt_bias->strides[0]));
    return g;
}

double fqla_cpu_beta(const fqla_cpu_inputs *in, int64_t b, int64_t t, int64_t h)
{
    double beta = fqla_load(in->beta, fqla_cpu_row_offset(in->beta, b, t, h));
    if (in->p->opt.use_beta_sigmoid)
        beta = fqla_beta_value(beta, in->p->opt.allow_neg_eigval);
    return beta;
}
