/*
 * cpu_io.c - tensor access shared by both CPU backends (see cpu_io.h): the
 * input set, state offsets, slot indices, the gate and beta of a token and
 * their backward, and zeroing uncovered rows.
 */
#include "cpu/cpu_io.h"
#include "cpu/transforms.h"

#include <string.h>

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

int64_t fqla_cpu_state_base(const fqla_tensor *t, const int64_t *lead)
{
    int64_t off = 0;
    for (int d = 0; d < t->ndim - 2; d++)
        off += lead[d] * t->strides[d];
    return off;
}

int64_t fqla_cpu_load_index(const fqla_tensor *t, int64_t offset)
{
    if (t->dtype == FQLA_DTYPE_I32)
        return ((const int32_t *)t->data)[offset];
    return ((const int64_t *)t->data)[offset];
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

void fqla_cpu_store_gate_grads(const fqla_problem *p, const fqla_bwd_args *a, double *dA_log_part,
                               double *ddt_bias_part, int64_t n, int64_t b, int64_t t, int64_t h,
                               double dg, double dbeta)
{
    if (p->opt.use_gate_in_kernel) {
        double raw = fqla_load(&a->g, fqla_cpu_row_offset(&a->g, b, t, h));
        double A_log = fqla_load(&a->A_log, h * a->A_log.strides[0]);
        double dt_bias = fqla_load(&a->dt_bias, h * a->dt_bias.strides[0]);
        double da = 0;
        fqla_gate_grad(raw, A_log, dt_bias, dg, &da, &dA_log_part[n * p->HV + h],
                       &ddt_bias_part[n * p->HV + h]);
        dg = da;
    }
    if (p->opt.use_beta_sigmoid) {
        double raw = fqla_load(&a->beta, fqla_cpu_row_offset(&a->beta, b, t, h));
        dbeta = fqla_beta_grad(raw, p->opt.allow_neg_eigval, dbeta);
    }
    fqla_store(&a->dg, fqla_cpu_row_offset(&a->dg, b, t, h), dg);
    fqla_store(&a->dbeta, fqla_cpu_row_offset(&a->dbeta, b, t, h), dbeta);
}

void fqla_cpu_reduce_gate_params(const fqla_problem *p, const fqla_bwd_args *a,
                                 const double *dA_log_part, const double *ddt_bias_part)
{
    for (int64_t h = 0; h < p->HV; h++) {
        double sa = 0, sd = 0;
        for (int64_t n = 0; n < p->N; n++) {
            sa += dA_log_part[n * p->HV + h];
            sd += ddt_bias_part[n * p->HV + h];
        }
        if (a->dA_log.data)
            fqla_store(&a->dA_log, h * a->dA_log.strides[0], sa);
        if (a->ddt_bias.data)
            fqla_store(&a->ddt_bias, h * a->ddt_bias.strides[0], sd);
    }
}

void fqla_cpu_zero_rows(const fqla_tensor *x, int64_t b, int64_t t0, int64_t t1)
{
    if (!x || !x->data || t1 <= t0)
        return;
    int64_t heads = x->shape[2];
    int64_t n = x->ndim == 4 ? x->shape[3] : 1;
    float zeros[256];
    memset(zeros, 0, sizeof zeros);
    for (int64_t t = t0; t < t1; t++)
        for (int64_t h = 0; h < heads; h++) {
            int64_t off = fqla_cpu_row_offset(x, b, t, h);
            for (int64_t j = 0; j < n; j += 256)
                fqla_store_row_f32(x, off + j, n - j < 256 ? n - j : 256, zeros);
        }
}

void fqla_cpu_zero_uncovered(const fqla_problem *p, const fqla_tensor *x)
{
    if (!p->varlen)
        return; /* without cu_seqlens every row belongs to its batch row's sequence */
    int64_t end = 0;
    if (p->N > 0) {
        int64_t b, start, len;
        fqla_seq_bounds(p, p->N - 1, &b, &start, &len);
        end = start + len;
    }
    for (int64_t b = 0; b < p->B; b++)
        fqla_cpu_zero_rows(x, b, end, p->T);
}
