/*
 * reference_bwd.c - the exact fp64 reverse-mode gradient of the reference
 * forward (reference_fwd.c), the gradient oracle of the library.
 *
 * Per token, with S0 the state before the token, a = exp(g), S1 = a S0,
 * w = S1^T k, u = beta (v - w), S2 = S1 + k u^T, o = scale S2^T q, and dS
 * the gradient flowing into S2 (from later tokens, or d_final_state):
 *     dS  += scale q do^T            dq  = scale S2 do
 *     du   = dS^T k                  dk  = dS u - beta S1 du
 *     dv   = beta du                 dbeta = <du, v - w>
 *     dS1  = dS - beta k du^T
 *     dg   = a <dS1, S0>             dS (into S0) = a dS1
 * dg is a direct inner product of the decayed quantities, never a difference
 * of O(1) cumulative terms, so it keeps its relative accuracy when it is tiny
 * (strong decay, g = -20: dg ~ e^-20). The transforms (l2norm, gate, beta
 * sigmoid) are then differentiated back to the raw inputs.
 *
 * Memory: the state is checkpointed every REF_BLOCK tokens in a forward
 * pass; the backward walks the blocks in reverse, recomputing the REF_BLOCK
 * + 1 states of one block from its checkpoint. One task per (sequence, q/k
 * head) handles the value heads of its GVA group one after another, so dq
 * and dk are summed over the group without races; dA_log and ddt_bias are
 * summed per task and reduced in a fixed order afterwards (deterministic).
 *
 * With only d_initial_state asked for (fqla_problem.dh0_only) the same walk
 * runs and the per-token gradients are computed but never stored: the
 * oracle stays one code path, and dh0 comes out as the full backward's.
 */
#include "cpu/reference_common.h"
#include "cpu/transforms.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define REF_BLOCK 64

typedef struct bwd_job {
    const fqla_problem *p;
    const fqla_bwd_args *a;
    fqla_cpu_inputs in;
    double *dA_log_part;   /* [N, HV] per-task partial sums, use_gate_in_kernel */
    double *ddt_bias_part; /* [N, HV] */
} bwd_job;

/* Buffers of one task. */
typedef struct bwd_scratch {
    double *ck;      /* [nblk, K, V] state at the start of each block */
    double *st;      /* [REF_BLOCK + 1, K, V] states of the block being walked */
    double *dS;      /* [K, V] gradient flowing into the current state */
    double *qb, *kb; /* [REF_BLOCK, K] transformed q, k of the block */
    double *vb;      /* [REF_BLOCK, V] */
    double *gb, *bb; /* [REF_BLOCK] transformed gate and beta */
    double *dq, *dk; /* [len, K] gradients w.r.t. the transformed q, k, summed over the group */
    double *rb;      /* [REF_BLOCK, V] residuals r = v - S1^T k of the block */
    double *dov, *w, *du, *tmp; /* [V] */
    double *xk;      /* [K] */
} bwd_scratch;

static double *carve(double **cursor, int64_t n)
{
    double *p = *cursor;
    *cursor += n;
    return p;
}

/* Loads the transformed inputs of tokens [t0, t0 + bl) of value head h. */
static void load_block(const bwd_job *job, bwd_scratch *s, int64_t b, int64_t t0, int64_t bl,
                       int64_t h, int with_q)
{
    const fqla_problem *p = job->p;
    int64_t K = p->K, V = p->V, hk = h / p->group;
    for (int64_t j = 0; j < bl; j++) {
        int64_t t = t0 + j;
        if (with_q)
            fqla_ref_load_qk(&job->in, job->in.q, b, t, hk, s->qb + j * K);
        fqla_ref_load_qk(&job->in, job->in.k, b, t, hk, s->kb + j * K);
        fqla_ref_load_v(&job->in, b, t, h, s->vb + j * V);
        s->gb[j] = fqla_cpu_gate(&job->in, b, t, h);
        s->bb[j] = fqla_cpu_beta(&job->in, b, t, h);
    }
}

/* Backward of one token (see the file header), in two passes over the
 * state. S0 / S2: states before and after it; q, k, v, g, beta: its
 * transformed inputs; r = v - S1^T k its residual (u = beta r), kept from the
 * recomputation. dS is updated in place from the gradient into S2 to the
 * gradient into S0. Adds into dq, dk ([K]); writes dv [V], dg and dbeta. */
static void token_backward(const fqla_problem *p, bwd_scratch *s, const double *S0, const double *S2,
                           const double *q, const double *k, const double *r, double g, double beta,
                           const double *dov, double *dq, double *dk, double *dv,
                           double *dg_out, double *dbeta_out)
{
    int64_t K = p->K, V = p->V;
    double a = exp(g), scale = p->scale;
    double *dS = s->dS, *du = s->du;

    /* Pass 1. o = scale S2^T q: dq = scale S2 do, dS += scale q do^T.
     * S2 = S1 + k u^T: du = dS^T k, dk += dS u (with the dS just updated). */
    for (int64_t j = 0; j < V; j++)
        du[j] = 0;
    for (int64_t i = 0; i < K; i++) {
        double acc_q = 0, acc_k = 0, sq = scale * q[i];
        for (int64_t j = 0; j < V; j++) {
            acc_q += S2[i * V + j] * dov[j];
            double d = dS[i * V + j] + sq * dov[j];
            dS[i * V + j] = d;
            du[j] += d * k[i];
            acc_k += d * r[j];
        }
        dq[i] += scale * acc_q;
        dk[i] += beta * acc_k;
    }

    /* u = beta (v - S1^T k): dbeta = <du, r>, dv = beta du, and through
     * S1^T k: dk -= beta S1 du, dS1 = dS - beta k du^T. Then S1 = a S0:
     * dg = a <dS1, S0> as one direct sum, dS0 = a dS1. */
    double dbeta = 0;
    for (int64_t j = 0; j < V; j++) {
        dbeta += du[j] * r[j];
        dv[j] = beta * du[j];
    }
    double dot = 0;
    for (int64_t i = 0; i < K; i++) {
        double acc = 0, bk = beta * k[i];
        for (int64_t j = 0; j < V; j++) {
            double s0 = S0[i * V + j];
            double d1 = dS[i * V + j] - bk * du[j];
            acc += s0 * du[j];
            dot += d1 * s0;
            dS[i * V + j] = a * d1;
        }
        dk[i] -= beta * a * acc;
    }
    *dg_out = a * dot;
    *dbeta_out = dbeta;
}

/* Forward with checkpoints, then the reverse walk, for value head h of
 * sequence n (tokens [start, start + len) of batch row b). */
static void head_backward(const bwd_job *job, bwd_scratch *s, int64_t n, int64_t h,
                          int64_t b, int64_t start, int64_t len)
{
    const fqla_problem *p = job->p;
    const fqla_bwd_args *a = job->a;
    int64_t K = p->K, V = p->V, KV = K * V;
    int64_t nblk = (len + REF_BLOCK - 1) / REF_BLOCK;
    int v_first = p->opt.state_v_first;
    int64_t lead[2] = {n, h};
    double *S = s->st; /* the block buffer doubles as the running state here */

    if (a->initial_state.data)
        fqla_ref_state_load(&a->initial_state, fqla_cpu_state_base(&a->initial_state, lead),
                            K, V, v_first, S);
    else
        memset(S, 0, (size_t)KV * sizeof *S);
    for (int64_t c = 0; c < nblk; c++) {
        int64_t t0 = start + c * REF_BLOCK;
        int64_t bl = len - c * REF_BLOCK < REF_BLOCK ? len - c * REF_BLOCK : REF_BLOCK;
        memcpy(s->ck + c * KV, S, (size_t)KV * sizeof *S);
        load_block(job, s, b, t0, bl, h, 0);
        for (int64_t j = 0; j < bl; j++)
            fqla_ref_step(S, K, V, s->kb + j * K, s->vb + j * V, s->gb[j], s->bb[j], s->w, NULL, 0, NULL);
    }

    if (a->d_final_state.data)
        fqla_ref_state_load(&a->d_final_state, fqla_cpu_state_base(&a->d_final_state, lead),
                            K, V, v_first, s->dS);
    else
        memset(s->dS, 0, (size_t)KV * sizeof *s->dS);

    for (int64_t c = nblk - 1; c >= 0; c--) {
        int64_t t0 = start + c * REF_BLOCK;
        int64_t bl = len - c * REF_BLOCK < REF_BLOCK ? len - c * REF_BLOCK : REF_BLOCK;
        load_block(job, s, b, t0, bl, h, 1);
        memcpy(s->st, s->ck + c * KV, (size_t)KV * sizeof *s->st);
        for (int64_t j = 0; j < bl; j++) {
            memcpy(s->st + (j + 1) * KV, s->st + j * KV, (size_t)KV * sizeof *s->st);
            fqla_ref_step(s->st + (j + 1) * KV, K, V, s->kb + j * K, s->vb + j * V,
                          s->gb[j], s->bb[j], s->rb + j * V, NULL, 0, NULL);
        }
        for (int64_t j = bl - 1; j >= 0; j--) {
            int64_t t = t0 + j, tl = t - start;
            double dg, dbeta;
            fqla_ref_load_row(&a->d_o, b, t, h, V, s->dov);
            token_backward(p, s, s->st + j * KV, s->st + (j + 1) * KV, s->qb + j * K, s->kb + j * K,
                           s->rb + j * V, s->gb[j], s->bb[j], s->dov,
                           s->dq + tl * K, s->dk + tl * K, s->tmp, &dg, &dbeta);
            if (p->dh0_only) continue;
            fqla_ref_store_row(&a->dv, b, t, h, V, s->tmp);
            fqla_cpu_store_gate_grads(p, a, job->dA_log_part, job->ddt_bias_part, n, b, t, h, dg, dbeta);
        }
    }

    if (a->d_initial_state.data)
        fqla_ref_state_store(&a->d_initial_state, fqla_cpu_state_base(&a->d_initial_state, lead),
                             K, V, v_first, s->dS);
}

/* Stores the group-summed gradient of the transformed q or k of every token,
 * taken back through the l2norm when it is on. */
static void store_qk_grad(const bwd_job *job, bwd_scratch *s, const fqla_tensor *x, const fqla_tensor *dx,
                          const double *dacc, int64_t b, int64_t start, int64_t len, int64_t hk)
{
    int64_t K = job->p->K;
    for (int64_t tl = 0; tl < len; tl++) {
        const double *d = dacc + tl * K;
        if (job->p->opt.use_qk_l2norm) {
            double r = fqla_ref_load_qk(&job->in, x, b, start + tl, hk, s->xk);
            fqla_l2norm_grad(s->xk, r, d, s->xk, K);
            d = s->xk;
        }
        fqla_ref_store_row(dx, b, start + tl, hk, K, d);
    }
}

static fqla_status bwd_task(void *arg, int64_t task)
{
    const bwd_job *job = arg;
    const fqla_problem *p = job->p;
    int64_t n = task / p->H, hk = task % p->H;
    int64_t K = p->K, V = p->V, KV = K * V, b, start, len;
    fqla_seq_bounds(p, n, &b, &start, &len);
    int64_t nblk = (len + REF_BLOCK - 1) / REF_BLOCK;

    /* One allocation for everything the task needs. */
    int64_t total = nblk * KV + (REF_BLOCK + 1) * KV + KV + 2 * REF_BLOCK * K
                    + 2 * REF_BLOCK * V + 2 * REF_BLOCK + 2 * len * K + 4 * V + K;
    double *mem = calloc((size_t)total, sizeof *mem);
    if (!mem)
        return FQLA_STATUS_ALLOC_FAILED;
    double *cur = mem;
    bwd_scratch s;
    s.ck = carve(&cur, nblk * KV);
    s.st = carve(&cur, (REF_BLOCK + 1) * KV);
    s.dS = carve(&cur, KV);
    s.qb = carve(&cur, REF_BLOCK * K);
    s.kb = carve(&cur, REF_BLOCK * K);
    s.vb = carve(&cur, REF_BLOCK * V);
    s.rb = carve(&cur, REF_BLOCK * V);
    s.gb = carve(&cur, REF_BLOCK);
    s.bb = carve(&cur, REF_BLOCK);
    s.dq = carve(&cur, len * K);   /* zeroed by calloc */
    s.dk = carve(&cur, len * K);
    s.dov = carve(&cur, V);
    s.w = carve(&cur, V);
    s.du = carve(&cur, V);
    s.tmp = carve(&cur, V);
    s.xk = carve(&cur, K);

    for (int64_t h = hk * p->group; h < (hk + 1) * p->group; h++)
        head_backward(job, &s, n, h, b, start, len);
    if (!p->dh0_only) {
        store_qk_grad(job, &s, &job->a->q, &job->a->dq, s.dq, b, start, len, hk);
        store_qk_grad(job, &s, &job->a->k, &job->a->dk, s.dk, b, start, len, hk);
    }
    free(mem);
    return FQLA_STATUS_SUCCESS;
}

fqla_status fqla_ref_bwd(fqla_context *ctx, const fqla_problem *p, const fqla_bwd_args *a)
{
    bwd_job job;
    job.p = p;
    job.a = a;
    job.in = fqla_cpu_inputs_bwd(p, a);
    job.dA_log_part = job.ddt_bias_part = NULL;
    if (p->opt.use_gate_in_kernel && !p->dh0_only) {
        job.dA_log_part = calloc((size_t)(2 * p->N * p->HV + 1), sizeof(double));
        if (!job.dA_log_part)
            return fqla_fail(ctx, FQLA_STATUS_ALLOC_FAILED, "CPU reference backward: out of memory");
        job.ddt_bias_part = job.dA_log_part + p->N * p->HV;
    }

    const fqla_tensor *rows[5] = {&a->dq, &a->dk, &a->dv, &a->dg, &a->dbeta};
    for (int i = 0; i < 5; i++)
        fqla_cpu_zero_uncovered(p, rows[i]);

    fqla_status st = fqla_ref_parallel(p->threads, p->N * p->H, bwd_task, &job);
    if (st == FQLA_STATUS_SUCCESS && job.dA_log_part)
        fqla_cpu_reduce_gate_params(p, a, job.dA_log_part, job.ddt_bias_part);
    free(job.dA_log_part);
    if (st == FQLA_STATUS_ALLOC_FAILED)
        return fqla_fail(ctx, st, "CPU reference backward: could not allocate the checkpoints "
                                  "of a sequence (K = %lld, V = %lld)", (long long)p->K, (long long)p->V);
    return st;
}
