/*
 * reference_common.c - shared pieces of the fp64 reference (see
 * reference_common.h): token loading with the in-kernel transforms, state
 * layout, the one-token step of docs/design.md §1, and running tasks that may
 * fail on the backends' parallel-for (threads.c).
 */
#include "cpu/reference_common.h"
#include "cpu/threads.h"
#include "cpu/transforms.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

double fqla_ref_load_qk(const fqla_cpu_inputs *in, const fqla_tensor *x,
                        int64_t b, int64_t t, int64_t hk, double *dst)
{
    int64_t K = in->p->K;
    fqla_ref_load_row(x, b, t, hk, K, dst);
    if (in->p->opt.use_qk_l2norm)
        return fqla_l2norm(dst, K);
    return 1.0;
}

void fqla_ref_load_row(const fqla_tensor *x, int64_t b, int64_t t, int64_t h, int64_t n, double *dst)
{
    int64_t base = fqla_cpu_row_offset(x, b, t, h);
    for (int64_t j = 0; j < n; j++)
        dst[j] = fqla_load(x, base + j * x->strides[3]);
}

void fqla_ref_store_row(const fqla_tensor *x, int64_t b, int64_t t, int64_t h, int64_t n, const double *src)
{
    int64_t base = fqla_cpu_row_offset(x, b, t, h);
    for (int64_t j = 0; j < n; j++)
        fqla_store(x, base + j * x->strides[3], src[j]);
}

void fqla_ref_load_v(const fqla_cpu_inputs *in, int64_t b, int64_t t, int64_t h, double *dst)
{
    fqla_ref_load_row(in->v, b, t, h, in->p->V, dst);
}

void fqla_ref_state_load(const fqla_tensor *t, int64_t base, int64_t K, int64_t V,
                         int v_first, double *S)
{
    int64_t s_row = t->strides[t->ndim - 2], s_col = t->strides[t->ndim - 1];
    /* element (i, j) sits at [.., i, j], or at [.., j, i] with state_v_first */
    int64_t si = v_first ? s_col : s_row, sj = v_first ? s_row : s_col;
    for (int64_t i = 0; i < K; i++)
        for (int64_t j = 0; j < V; j++)
            S[i * V + j] = fqla_load(t, base + i * si + j * sj);
}

void fqla_ref_state_store(const fqla_tensor *t, int64_t base, int64_t K, int64_t V,
                          int v_first, const double *S)
{
    int64_t s_row = t->strides[t->ndim - 2], s_col = t->strides[t->ndim - 1];
    int64_t si = v_first ? s_col : s_row, sj = v_first ? s_row : s_col;
    for (int64_t i = 0; i < K; i++)
        for (int64_t j = 0; j < V; j++)
            fqla_store(t, base + i * si + j * sj, S[i * V + j]);
}

void fqla_ref_step(double *S, int64_t K, int64_t V, const double *k, const double *v,
                   double g, double beta, double *r, const double *q, double scale, double *o)
{
    double a = exp(g);
    /* S1^T k = a (S^T k): the decay is applied to the reduction rather than
     * to every element first, which saves a pass over S */
    for (int64_t j = 0; j < V; j++)
        r[j] = 0;
    for (int64_t i = 0; i < K; i++)
        for (int64_t j = 0; j < V; j++)
            r[j] += k[i] * S[i * V + j];
    for (int64_t j = 0; j < V; j++)
        r[j] = v[j] - a * r[j];
    if (o)
        for (int64_t j = 0; j < V; j++)
            o[j] = 0;
    for (int64_t i = 0; i < K; i++) {
        double bk = beta * k[i];
        for (int64_t j = 0; j < V; j++) {
            double s = a * S[i * V + j] + bk * r[j];
            S[i * V + j] = s;
            if (o)
                o[j] += s * q[i];
        }
    }
    if (o)
        for (int64_t j = 0; j < V; j++)
            o[j] *= scale;
}

void fqla_ref_token(const fqla_cpu_inputs *in, const fqla_tensor *o, double *S, double *buf,
                    int64_t b, int64_t t, int64_t h)
{
    const fqla_problem *p = in->p;
    int64_t K = p->K, V = p->V, hk = h / p->group;
    double *q = buf, *k = q + K, *v = k + K, *w = v + V, *ov = w + V;
    fqla_ref_load_qk(in, in->q, b, t, hk, q);
    fqla_ref_load_qk(in, in->k, b, t, hk, k);
    fqla_ref_load_v(in, b, t, h, v);
    double g = fqla_cpu_gate(in, b, t, h);
    double beta = fqla_cpu_beta(in, b, t, h);
    fqla_ref_step(S, K, V, k, v, g, beta, w, q, p->scale, ov);
    if (o) fqla_ref_store_row(o, b, t, h, V, ov);
}

/* ---- tasks on the CPU backends' parallel-for (threads.h) ---- */

/* fqla_cpu_parallel_for's tasks cannot fail; the reference's can (each
 * allocates its own state). Every worker keeps the first failure it meets,
 * which is its lowest failing task since tasks are handed out in increasing
 * order, and the lowest over the workers is returned. */
typedef struct ref_failure {
    int64_t task;
    fqla_status status;
} ref_failure;

typedef struct ref_run {
    fqla_ref_task_fn fn;
    void *arg;
    ref_failure *failed; /* [workers] */
} ref_run;

static void run_task(void *vp, int64_t task, int worker)
{
    const ref_run *run = vp;
    ref_failure *f = &run->failed[worker];
    fqla_status st = run->fn(run->arg, task);
    if (st != FQLA_STATUS_SUCCESS && f->status == FQLA_STATUS_SUCCESS) {
        f->task = task;
        f->status = st;
    }
}

fqla_status fqla_ref_parallel(int threads, int64_t ntasks, fqla_ref_task_fn fn, void *arg)
{
    int workers = fqla_cpu_workers(threads, ntasks);
    ref_run run;
    run.fn = fn;
    run.arg = arg;
    run.failed = malloc((size_t)workers * sizeof *run.failed);
    if (!run.failed)
        return FQLA_STATUS_ALLOC_FAILED;
    for (int w = 0; w < workers; w++) {
        run.failed[w].task = ntasks;
        run.failed[w].status = FQLA_STATUS_SUCCESS;
    }
    fqla_cpu_parallel_for(workers, ntasks, run_task, &run);
    fqla_status st = FQLA_STATUS_SUCCESS;
    int64_t lowest = ntasks;
    for (int w = 0; w < workers; w++)
        if (run.failed[w].status != FQLA_STATUS_SUCCESS && run.failed[w].task < lowest) {
            lowest = run.failed[w].task;
            st = run.failed[w].status;
        }
    free(run.failed);
    return st;
}
