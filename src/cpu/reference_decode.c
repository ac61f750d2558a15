/*
 * reference_decode.c - decode and multi-token verify of the fp64 reference on
 * a state pool (include/flashqla.h, fqla_decode_args). For batch row b with
 * slot s = slots[b] >= 0 and each value head h: the state pool[s, h] is
 * loaded, the T tokens of row b run through the recurrence of docs/design.md §1
 * (same step as the forward), and o is written. Decode stores the final
 * state back to pool[s, h]; verify leaves pool[s] alone and stores the state
 * after every token t into step_states[b, t, h] or pool[step_slots[b, t], h]
 * (a negative step slot is skipped). A negative slot is padding: its o rows
 * are zeroed and nothing else is read or written.
 */
#include "cpu/reference_common.h"

#include <stdlib.h>

typedef struct decode_job {
    const fqla_problem *p;
    const fqla_decode_args *a;
    fqla_cpu_inputs in;
    int verify;
} decode_job;

static fqla_status decode_task(void *arg, int64_t task)
{
    const decode_job *job = arg;
    const fqla_problem *p = job->p;
    const fqla_decode_args *a = job->a;
    int64_t b = task / p->HV, h = task % p->HV;
    int64_t K = p->K, V = p->V;
    int v_first = p->opt.state_v_first;
    int64_t slot = fqla_cpu_load_index(&a->slots, b * a->slots.strides[0]);

    if (slot < 0) {
        /* padding: zero this head's o rows only (other heads are other tasks) */
        for (int64_t t = 0; t < p->T; t++) {
            int64_t base = fqla_cpu_row_offset(&a->o, b, t, h);
            for (int64_t j = 0; j < V; j++)
                fqla_store(&a->o, base + j * a->o.strides[3], 0.0);
        }
        return FQLA_STATUS_SUCCESS;
    }

    double *S = malloc((size_t)(K * V + 2 * K + 3 * V) * sizeof *S);
    if (!S)
        return FQLA_STATUS_ALLOC_FAILED;

    int64_t lead[2] = {slot, h};
    fqla_ref_state_load(&a->state_pool, fqla_cpu_state_base(&a->state_pool, lead), K, V, v_first, S);
    for (int64_t t = 0; t < p->T; t++) {
        fqla_ref_token(&job->in, &a->o, S, S + K * V, b, t, h);
        if (!job->verify)
            continue;
        if (a->step_states.data) {
            int64_t sl[3] = {b, t, h};
            fqla_ref_state_store(&a->step_states, fqla_cpu_state_base(&a->step_states, sl),
                                 K, V, v_first, S);
        } else if (a->step_slots.data) {
            int64_t ss = fqla_cpu_load_index(&a->step_slots,
                                             b * a->step_slots.strides[0] + t * a->step_slots.strides[1]);
            if (ss >= 0) {
                int64_t pl[2] = {ss, h};
                fqla_ref_state_store(&a->state_pool, fqla_cpu_state_base(&a->state_pool, pl),
                                     K, V, v_first, S);
            }
        }
    }
    if (!job->verify)
        fqla_ref_state_store(&a->state_pool, fqla_cpu_state_base(&a->state_pool, lead), K, V, v_first, S);
    free(S);
    return FQLA_STATUS_SUCCESS;
}

fqla_status fqla_ref_decode(fqla_context *ctx, const fqla_problem *p, const fqla_decode_args *a)
{
    decode_job job;
    job.p = p;
    job.a = a;
    job.verify = p->op == FQLA_OP_VERIFY;
    job.in = fqla_cpu_inputs_decode(p, a);

    /* Verify with step_slots writes into the pool that other rows read: run
     * in row order on one thread so the result is defined by the order of b. */
    int threads = (job.verify && a->step_slots.data && !a->step_states.data) ? 1 : p->threads;
    fqla_status st = fqla_ref_parallel(threads, p->B * p->HV, decode_task, &job);
    if (st == FQLA_STATUS_ALLOC_FAILED)
        return fqla_fail(ctx, st, "CPU reference decode: could not allocate a %lld x %lld state",
                         (long long)p->K, (long long)p->V);
    return st;
}
