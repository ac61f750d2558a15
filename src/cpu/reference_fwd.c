/*
 * reference_fwd.c - the fp64 forward of the CPU reference backend: for every
 * sequence n and value head h, the token recurrence of docs/design.md §1
 *     S <- exp(g_t) S;  u_t = beta_t (v_t - S^T k_t);  S <- S + k_t u_t^T;
 *     o_t = S^T (scale q_t)
 * from initial_state[n, h] (or 0), after the in-kernel transforms the options
 * ask for (with the final state alone, fqla_problem.ht_only, o_t is not
 * stored). This is the definition every other path is judged by: it is kept
 * as plain as possible, with all math in double whatever the storage dtype.
 * One task per (sequence, value head); tasks run on p->threads threads (the
 * context's count as the call started).
 */
#include "cpu/reference_common.h"

#include <stdlib.h>
#include <string.h>

typedef struct fwd_job {
    const fqla_problem *p;
    const fqla_fwd_args *a;
    fqla_cpu_inputs in;
} fwd_job;

static fqla_status fwd_task(void *arg, int64_t task)
{
    const fwd_job *job = arg;
    const fqla_problem *p = job->p;
    const fqla_fwd_args *a = job->a;
    int64_t n = task / p->HV, h = task % p->HV;
    int64_t K = p->K, V = p->V, b, start, len;
    int v_first = p->opt.state_v_first;
    fqla_seq_bounds(p, n, &b, &start, &len);

    double *S = malloc((size_t)(K * V + 2 * K + 3 * V) * sizeof *S);
    if (!S)
        return FQLA_STATUS_ALLOC_FAILED;

    int64_t lead[2] = {n, h};
    if (a->initial_state.data)
        fqla_ref_state_load(&a->initial_state, fqla_cpu_state_base(&a->initial_state, lead),
                            K, V, v_first, S);
    else
        memset(S, 0, (size_t)(K * V) * sizeof *S);

    for (int64_t t = start; t < start + len; t++)
        fqla_ref_token(&job->in, p->ht_only ? NULL : &a->o, S, S + K * V, b, t, h);

    if (a->final_state.data)
        fqla_ref_state_store(&a->final_state, fqla_cpu_state_base(&a->final_state, lead),
                             K, V, v_first, S);
    free(S);
    return FQLA_STATUS_SUCCESS;
}

fqla_status fqla_ref_fwd(fqla_context *ctx, const fqla_problem *p, const fqla_fwd_args *a)
{
    fwd_job job;
    job.p = p;
    job.a = a;
    job.in = fqla_cpu_inputs_fwd(p, a);

    if (!p->ht_only) fqla_cpu_zero_uncovered(p, &a->o);
    fqla_status st = fqla_ref_parallel(p->threads, p->N * p->HV, fwd_task, &job);
    if (st == FQLA_STATUS_ALLOC_FAILED)
        return fqla_fail(ctx, st, "CPU reference forward: could not allocate a %lld x %lld state",
                         (long long)p->K, (long long)p->V);
    return st;
}
