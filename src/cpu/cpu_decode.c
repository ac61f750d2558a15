/*
 * cpu_decode.c - decode and multi-token verify of the fast CPU backend on a
 * state pool (include/flashqla.h, fqla_decode_args), fp32 math whatever the
 * pool's storage (F32 or BF16, [K, V] or [V, K] per head).
 *
 * One work item per (batch row b, value head h): the state pool[slots[b], h]
 * is loaded into an fp32 [K, Vp] buffer and the T tokens of row b run
 * through the token recurrence of docs/design.md §1 in two passes over S per
 * token (the memory traffic, not the arithmetic, is what a token costs):
 *     w = S^T k;  u = beta (v - a w)              (a = exp(g))
 *     S <- a S + k u^T,  o += q_i S_i             (fused, one pass)
 * Decode stores the state back to the pool; verify leaves pool[slots[b]]
 * alone and stores the state after every token to step_states[b, t, h] or
 * to pool[step_slots[b, t], h] (negative: skipped). A negative slot is
 * padding: that row's o is zeroed and nothing else is read or written.
 * Validation guarantees that no two sequences or steps share a pool entry,
 * so items never touch each other's data and may run in any order.
 */
#include "cpu/cpu_chunk.h"
#include "cpu/gemm.h"
#include "cpu/threads.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct decode_job {
    const fqla_problem *p;
    const fqla_decode_args *a;
    fqla_cpu_inputs in;
    int verify;
    float *scratch;
    int64_t per_worker;
} decode_job;

static int64_t decode_floats(int64_t K, int64_t V)
{
    int64_t Kp = fqla_round8(K), Vp = fqla_round8(V), M = fqla_round8(K > V ? K : V);
    return K * Vp + 2 * Kp + 4 * Vp + 3 * M;
}

/* One token on S [K, Vp]: returns o (scaled) in o[0..Vp). */
static void token_step(float *restrict S, int64_t K, int64_t Vp, const float *k, const float *q,
                       const float *v, float a, float beta, float scale, float *restrict w,
                       float *restrict u, float *restrict o)
{
    memset(w, 0, (size_t)Vp * sizeof(float));
    for (int64_t i = 0; i < K; i++)
        fqla_axpy8(Vp, k[i], S + i * Vp, w);
    for (int64_t j = 0; j < Vp; j += 8)
        for (int c = 0; c < 8; c++)
            u[j + c] = beta * (v[j + c] - a * w[j + c]);
    memset(o, 0, (size_t)Vp * sizeof(float));
    for (int64_t i = 0; i < K; i++) {
        float *Si = S + i * Vp;
        float ki = k[i], qi = q[i];
        for (int64_t j = 0; j < Vp; j += 8)
            for (int c = 0; c < 8; c++) {
                float x = a * Si[j + c] + ki * u[j + c];
                Si[j + c] = x;
                o[j + c] += qi * x;
            }
    }
    fqla_scale8(Vp, scale, o);
}

static void decode_task(void *arg, int64_t item, int worker)
{
    const decode_job *job = arg;
    const fqla_problem *p = job->p;
    const fqla_decode_args *a = job->a;
    int64_t b = item / p->HV, h = item % p->HV, hk = h / p->group;
    int64_t K = p->K, V = p->V, Kp = fqla_round8(K), Vp = fqla_round8(V);
    int64_t M = fqla_round8(K > V ? K : V);
    int v_first = p->opt.state_v_first;
    int64_t slot = fqla_cpu_load_index(&a->slots, b * a->slots.strides[0]);

    if (slot < 0) {
        /* padding: zero this head's o rows only (other heads are other items) */
        for (int64_t t = 0; t < p->T; t++) {
            int64_t off = fqla_cpu_row_offset(&a->o, b, t, h);
            float zero = 0.0f;
            for (int64_t j = 0; j < V; j++)
                fqla_store_row_f32(&a->o, off + j, 1, &zero);
        }
        return;
    }

    float *mem = job->scratch + (int64_t)worker * job->per_worker;
    float *S = mem, *k = S + K * Vp, *q = k + Kp, *v = q + Kp, *w = v + Vp, *u = w + Vp;
    float *o = u + Vp, *tmp = o + Vp;
    double *row = (double *)(void *)(tmp + M);

    int64_t lead[2] = {slot, h};
    memset(S, 0, (size_t)(K * Vp) * sizeof(float));
    fqla_cpu_state_load(&a->state_pool, lead, K, V, v_first, S, Vp, tmp);
    memset(v, 0, (size_t)Vp * sizeof(float));
    for (int64_t t = 0; t < p->T; t++) {
        fqla_cpu_load_qk(&job->in, &a->q, b, t, hk, row, q);
        fqla_cpu_load_qk(&job->in, &a->k, b, t, hk, row, k);
        fqla_load_row_f32(&a->v, fqla_cpu_row_offset(&a->v, b, t, h), V, v);
        float gate = (float)exp(fqla_cpu_gate(&job->in, b, t, h));
        float beta = (float)fqla_cpu_beta(&job->in, b, t, h);
        token_step(S, K, Vp, k, q, v, gate, beta, (float)p->scale, w, u, o);
        fqla_store_row_f32(&a->o, fqla_cpu_row_offset(&a->o, b, t, h), V, o);
        if (!job->verify)
            continue;
        if (a->step_states.data) {
            int64_t sl[3] = {b, t, h};
            fqla_cpu_state_store(&a->step_states, sl, K, V, v_first, S, Vp, tmp);
        } else if (a->step_slots.data) {
            int64_t ss = fqla_cpu_load_index(&a->step_slots, b * a->step_slots.strides[0] + t * a->step_slots.strides[1]);
            if (ss >= 0) {
                int64_t pl[2] = {ss, h};
                fqla_cpu_state_store(&a->state_pool, pl, K, V, v_first, S, Vp, tmp);
            }
        }
    }
    if (!job->verify)
        fqla_cpu_state_store(&a->state_pool, lead, K, V, v_first, S, Vp, tmp);
}

fqla_status fqla_cpu_decode(fqla_context *ctx, const fqla_problem *p, const fqla_decode_args *a)
{
    decode_job job;
    int64_t items = p->B * p->HV;
    int workers = fqla_cpu_workers(p->threads, items);
    job.p = p;
    job.a = a;
    job.verify = p->op == FQLA_OP_VERIFY;
    job.in = fqla_cpu_inputs_decode(p, a);
    job.per_worker = decode_floats(p->K, p->V);
    job.scratch = fqla_cpu_alloc_floats(job.per_worker * workers);
    if (!job.scratch)
        return fqla_fail(ctx, FQLA_STATUS_ALLOC_FAILED,
                         "CPU %s: could not allocate %lld bytes of scratch for %d threads",
                         job.verify ? "verify" : "decode",
                         (long long)(job.per_worker * workers * (int64_t)sizeof(float)), workers);
    fqla_cpu_parallel_for(workers, items, decode_task, &job);
    free(job.scratch);
    return FQLA_STATUS_SUCCESS;
}
