/*
 * chunked_fwd.c - the forward of the fast CPU backend: the chunked algorithm
 * of docs/design.md §2 with C = 64 in fp32.
 *
 * Work items: one per (sequence, q/k head, slice of its GVA group) - the
 * whole group unless there are too few (sequence, q/k head) pairs to keep
 * every worker busy (fqla_cpu_heads_per_item). An item walks its sequence
 * chunk by chunk; per chunk it loads q and k once, forms Q K^T and K K^T
 * once, then runs each of its value heads (own state S) through
 *     A  = (I + StrictLower(diag(beta) (Gamma . K K^T)))^-1   forward substitution
 *     W  = [Q; K] S                                     one product for both
 *     U  = A diag(beta) (V - diag(e) K S)
 *     O  = scale (diag(e) Q S + (Gamma . tril(Q K^T)) U)
 *     S' = e_C S + K^T diag(f) U
 * (buffers and gate conventions in cpu_chunk.h). No exponent is positive, so
 * strong decay cannot overflow. A = Gamma . Ar, docs/design.md §2's gate-free
 * inverse Ar, but with Gamma inside the substitution: Ar alone grows like
 * |beta ||k||^2 - 1|^n and overflowed fp32 on raw keys under strong decay
 * (NaN where the reference is finite). Work per chunk and value head at
 * K = V = 128: about 4 M multiply-adds, nearly all in fqla_gemm.
 * Each value head's outputs depend only on its own inputs, never on the
 * item split or the thread count.
 */
#include "cpu/cpu_chunk.h"
#include "cpu/gemm.h"
#include "cpu/threads.h"

#include <stdlib.h>
#include <string.h>

#define C64 FQLA_CHUNK

typedef struct fwd_job {
    const fqla_problem *p;
    const fqla_fwd_args *a;
    fqla_cpu_inputs in;
    int64_t heads_per_item, items_per_pair;
    float *scratch;
    int64_t per_worker; /* floats of scratch per worker */
} fwd_job;

/* One worker's buffers. */
typedef struct fwd_bufs {
    fqla_chunk_qk qk;
    fqla_chunk_head hd;
    float *S;    /* [heads_per_item, Kp, Vp] running states */
    float *W;    /* [2 cp, Vp] Q S; K S */
    float *X;    /* [cp, Vp] V - diag(e) K S */
    float *U;    /* [cp, Vp] */
    float *O;    /* [cp, Vp] */
    float *A2;   /* [cp, cp] A . beta_j (A = Gamma . Ar, formed with Gamma inside) */
    float *P;    /* [cp, cp] scale Gamma . tril(Q K^T) */
    float *Kf;   /* [Kp, cp] K^T diag(f) */
    float *tmp;  /* [max(K, V)] */
} fwd_bufs;

static int64_t fwd_floats(int64_t K, int64_t V, int64_t heads)
{
    int64_t Kp = fqla_round8(K), Vp = fqla_round8(V), M = fqla_round8(K > V ? K : V);
    return fqla_chunk_qk_floats(K) + fqla_chunk_head_floats(V) + heads * Kp * Vp +
           5 * C64 * Vp + 2 * C64 * C64 + Kp * C64 + M;
}

static void fwd_carve(fwd_bufs *s, int64_t K, int64_t V, int64_t heads, float *mem)
{
    int64_t Kp = fqla_round8(K), Vp = fqla_round8(V);
    mem = fqla_chunk_qk_carve(&s->qk, K, mem);
    mem = fqla_chunk_head_carve(&s->hd, V, mem);
    s->S = mem;
    mem += heads * Kp * Vp;
    s->W = mem;
    mem += 2 * C64 * Vp;
    s->X = mem;
    mem += C64 * Vp;
    s->U = mem;
    mem += C64 * Vp;
    s->O = mem;
    mem += C64 * Vp;
    s->A2 = mem;
    mem += C64 * C64;
    s->P = mem;
    mem += C64 * C64;
    s->Kf = mem;
    mem += Kp * C64;
    s->tmp = mem;
}

/* One chunk of one value head h: its outputs and, when update_state,
 * S <- S'. The q/k part is loaded and prepared, the head part loaded. */
static void fwd_chunk(fwd_bufs *s, float *S, const fqla_problem *p, const fqla_fwd_args *a,
                      int64_t b, int64_t t0, int64_t h, int update_state)
{
    const fqla_chunk_qk *qk = &s->qk;
    const fqla_chunk_head *hd = &s->hd;
    int64_t cp = qk->cp, K = qk->K, Kp = qk->Kp, V = hd->V, Vp = hd->Vp;
    float scale = (float)p->scale;

    /* A2 = A . beta_j (hd->A = Gamma . Ar): the corrected-value
     * operator with diag(beta) folded in */
    for (int64_t i = 0; i < cp; i++)
        fqla_mul8(cp, hd->A + i * cp, hd->beta, s->A2 + i * cp);
    /* W = [Q; K] S */
    fqla_gemm(0, 2 * cp, Vp, K, qk->QK, Kp, S, Vp, s->W, Vp);
    /* X = V - diag(e) K S;  U = A2 X */
    for (int64_t i = 0; i < cp; i++)
        fqla_xpay8(Vp, hd->V_ + i * Vp, -hd->e[i], s->W + (cp + i) * Vp, s->X + i * Vp);
    fqla_gemm(FQLA_GEMM_A_LOWER, cp, Vp, cp, s->A2, cp, s->X, Vp, s->U, Vp);

    /* O = P U + scale diag(e) Q S, P = scale Gamma . tril(Q K^T); not
     * with the final state alone */
    if (!p->ht_only) {
        for (int64_t i = 0; i < cp; i++)
            fqla_mul_scale8(cp, hd->G + i * cp, qk->QKm + i * cp, scale, s->P + i * cp);
        fqla_gemm(FQLA_GEMM_A_LOWER, cp, Vp, cp, s->P, cp, s->U, Vp, s->O, Vp);
        for (int64_t i = 0; i < qk->c; i++) {
            fqla_axpy8(Vp, scale * hd->e[i], s->W + i * Vp, s->O + i * Vp);
            fqla_store_row_f32(&a->o, fqla_cpu_row_offset(&a->o, b, t0 + i, h), V, s->O + i * Vp);
        }
    }

    if (!update_state)
        return;
    /* S' = e_C S + (K^T diag(f)) U */
    for (int64_t r = 0; r < Kp; r++)
        fqla_mul8(cp, qk->QKt + r * 2 * cp + cp, hd->f, s->Kf + r * cp);
    fqla_scale8(Kp * Vp, hd->eC, S);
    fqla_gemm(FQLA_GEMM_ACC, Kp, Vp, cp, s->Kf, cp, s->U, Vp, S, Vp);
}

static void fwd_task(void *arg, int64_t item, int worker)
{
    const fwd_job *job = arg;
    const fqla_problem *p = job->p;
    const fqla_fwd_args *a = job->a;
    int64_t pair = item / job->items_per_pair, slice = item % job->items_per_pair;
    int64_t n = pair / p->H, hk = pair % p->H;
    int64_t h0 = hk * p->group + slice * job->heads_per_item;
    int64_t h1 = h0 + job->heads_per_item;
    if (h1 > (hk + 1) * p->group)
        h1 = (hk + 1) * p->group;
    int64_t K = p->K, V = p->V, KV = fqla_round8(K) * fqla_round8(V), Vp = fqla_round8(V);
    int v_first = p->opt.state_v_first;
    int64_t b, start, len;
    fwd_bufs s;
    fwd_carve(&s, K, V, job->heads_per_item, job->scratch + (int64_t)worker * job->per_worker);
    fqla_seq_bounds(p, n, &b, &start, &len);

    for (int64_t h = h0; h < h1; h++) {
        float *S = s.S + (h - h0) * KV;
        int64_t lead[2] = {n, h};
        memset(S, 0, (size_t)KV * sizeof(float));
        if (a->initial_state.data)
            fqla_cpu_state_load(&a->initial_state, lead, K, V, v_first, S, Vp, s.tmp);
    }

    int want_final = a->final_state.data != NULL;
    int64_t end = start + len;
    for (int64_t t0 = start; t0 < end; t0 += C64) {
        int64_t c = end - t0 < C64 ? end - t0 : C64;
        int last = t0 + c >= end;
        fqla_chunk_load_qk(&s.qk, &job->in, b, t0, c, hk, 1);
        fqla_chunk_prepare_qk(&s.qk, 1);
        for (int64_t h = h0; h < h1; h++) {
            fqla_chunk_load_head(&s.hd, &s.qk, &job->in, b, t0, h, 1);
            fwd_chunk(&s, s.S + (h - h0) * KV, p, a, b, t0, h, !last || want_final);
        }
    }
    for (int64_t h = h0; want_final && h < h1; h++) {
        int64_t lead[2] = {n, h};
        fqla_cpu_state_store(&a->final_state, lead, K, V, v_first, s.S + (h - h0) * KV, Vp, s.tmp);
    }
}

fqla_status fqla_cpu_fwd(fqla_context *ctx, const fqla_problem *p, const fqla_fwd_args *a)
{
    fwd_job job;
    job.p = p;
    job.a = a;
    job.in = fqla_cpu_inputs_fwd(p, a);
    job.heads_per_item = fqla_cpu_heads_per_item(p, p->threads);
    job.items_per_pair = (p->group + job.heads_per_item - 1) / job.heads_per_item;
    int64_t items = p->N * p->H * job.items_per_pair;
    int workers = fqla_cpu_workers(p->threads, items);
    job.per_worker = fwd_floats(p->K, p->V, job.heads_per_item);
    job.scratch = fqla_cpu_alloc_floats(job.per_worker * workers);
    if (!job.scratch)
        return fqla_fail(ctx, FQLA_STATUS_ALLOC_FAILED,
                         "CPU forward: could not allocate %lld bytes of scratch for %d threads",
                         (long long)(job.per_worker * workers * (int64_t)sizeof(float)), workers);
    if (!p->ht_only) fqla_cpu_zero_uncovered(p, &a->o);
    fqla_cpu_run(ctx, workers, items, fwd_task, &job);
    free(job.scratch);
    return FQLA_STATUS_SUCCESS;
}
