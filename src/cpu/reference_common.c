/*
 * reference_common.c - shared pieces of the fp64 reference (see
 * reference_common.h): token loading with the in-kernel transforms, state
 * layout, the one-token step of DESIGN.md §1, row zeroing, and running tasks
 * that may fail on the backends' parallel-for (threads.c).
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

double fqla_ref_load_bth(const fqla_tensor *x, int64_t b, int64_t t, int64_t h)
{
    return fqla_load(x, fqla_cpu_row_offset(x, b, t, h));
}

void fqla_ref_store_bth(const fqla_tensor *x, int64_t b, int64_t t, int64_t h, double value)
{
    fqla_store(x, fqla_cpu_row_offset(x, b, t, h), value);
}

int64_t fqla_ref_state_base(const fqla_tensor *t, const int64_t *lead)
{
    int64_t off = 0;
    for (int d = 0; d < t->ndim - 2; d++)
        off += lead[d] * t->strides[d];
    return off;
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

/* Zeroes the sub-tensor below the leading indices idx[0..d) (recursive over
 * the remaining dims). */
static void zero_from(const fqla_tensor *x, int d, int64_t off)
{
    if (d == x->ndim) {
        fqla_store(x, off, 0.0);
        return;
    }
    for (int64_t i = 0; i < x->shape[d]; i++)
        zero_from(x, d + 1, off + i * x->strides[d]);
}

void fqla_ref_zero_rows(const fqla_tensor *x, int64_t b, int64_t t0, int64_t t1)
{
    if (!x || !x->data)
        return;
    for (int64_t t = t0; t < t1; t++)
        zero_from(x, 2, b * x->strides[0] + t * x->strides[1]);
}

void fqla_ref_zero_uncovered(const fqla_problem *p, const fqla_tensor *x)
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
        fqla_ref_zero_rows(x, b, end, p->T);
}

int64_t fqla_ref_load_index(const fqla_tensor *t, int64_t offset)
{
    if (t->dtype == FQLA_DTYPE_I32)
        return ((const int32_t *)t->data)[offset];
    if (t->dtype == FQLA_DTYPE_I64)
        return ((const int64_t *)t->data)[offset];
    return (int64_t)fqla_load(t, offset);
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
