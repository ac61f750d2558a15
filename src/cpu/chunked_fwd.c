/*
 * chunked_fwd.c - the forward of the fast CPU backend: the chunked algorithm
 * of DESIGN.md §2 with C = 64 in fp32, one work item per (sequence, value
 * head), items spread over ctx->threads workers.
 *
 * Per chunk (c tokens, entering state S [K x V], see cpu_chunk.h for the
 * buffers and the gate conventions):
 *     Ar = (I + StrictLower(diag(beta) K K^T))^-1      forward substitution
 *     W  = [Q; K] S                                     one product for both
 *     U  = (Gamma . Ar) diag(beta) (V - diag(e) K S)
 *     O  = scale (diag(e) Q S + (Gamma . tril(Q K^T)) U)
 *     S' = e_C S + K^T diag(f) U
 * The gate never appears with a positive exponent, so strong decay cannot
 * overflow. Work per chunk at K = V = 128: about 4.1 M multiply-adds, all
 * but 0.05 M of them in fqla_gemm.
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
    float *scratch;
    int64_t per_worker; /* floats of scratch per worker */
} fwd_job;

/* The forward's buffers besides the chunk's own. */
typedef struct fwd_bufs {
    fqla_chunk ch;
    float *S;    /* [Kp, Vp] running state */
    float *W;    /* [2 cp, Vp] Q S; K S */
    float *X;    /* [cp, Vp] V - diag(e) K S */
    float *U;    /* [cp, Vp] */
    float *O;    /* [cp, Vp] */
    float *A2;   /* [cp, cp] Gamma . Ar . beta_j */
    float *P;    /* [cp, cp] scale Gamma . tril(Q K^T) */
    float *Kf;   /* [Kp, cp] K^T diag(f) */
    float *tmp;  /* [max(K, V)] */
} fwd_bufs;

static int64_t fwd_floats(int64_t K, int64_t V)
{
    int64_t Kp = fqla_round8(K), Vp = fqla_round8(V), M = fqla_round8(K > V ? K : V);
    return fqla_chunk_floats(K, V) + Kp * Vp + 2 * C64 * Vp + 3 * C64 * Vp + 2 * C64 * C64 +
           Kp * C64 + M;
}

static void fwd_carve(fwd_bufs *s, int64_t K, int64_t V, float *mem)
{
    int64_t Kp = fqla_round8(K), Vp = fqla_round8(V);
    fqla_chunk_carve(&s->ch, K, V, mem);
    mem += fqla_chunk_floats(K, V);
    s->S = mem;
    mem += Kp * Vp;
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

/* One chunk: outputs of its c tokens and, when update_state, S <- S'. */
static void fwd_chunk(fwd_bufs *s, const fqla_problem *p, const fqla_fwd_args *a, int64_t b,
                      int64_t t0, int64_t h, int update_state)
{
    fqla_chunk *ch = &s->ch;
    int64_t cp = ch->cp, K = ch->K, V = ch->V, Kp = ch->Kp, Vp = ch->Vp;
    float scale = (float)p->scale;

    /* A2 = Gamma . Ar . beta_j: the corrected-value operator with diag(beta) folded in */
    for (int64_t i = 0; i < cp; i++) {
        fqla_mul8(cp, ch->G + i * cp, ch->Ar + i * cp, s->A2 + i * cp);
        fqla_mul8(cp, s->A2 + i * cp, ch->beta, s->A2 + i * cp);
    }
    /* W = [Q; K] S */
    fqla_gemm(0, 2 * cp, Vp, K, ch->QK, Kp, s->S, Vp, s->W, Vp);
    /* X = V - diag(e) K S;  U = A2 X */
    for (int64_t i = 0; i < cp; i++) {
        memcpy(s->X + i * Vp, ch->V_ + i * Vp, (size_t)Vp * sizeof(float));
        fqla_axpy8(Vp, -ch->e[i], s->W + (cp + i) * Vp, s->X + i * Vp);
    }
    fqla_gemm(FQLA_GEMM_A_LOWER, cp, Vp, cp, s->A2, cp, s->X, Vp, s->U, Vp);

    /* O = P U + scale diag(e) Q S, P = scale Gamma . tril(Q K^T) */
    for (int64_t i = 0; i < cp; i++) {
        fqla_mul8(cp, ch->G + i * cp, ch->QKm + i * cp, s->P + i * cp);
        fqla_scale8(cp, scale, s->P + i * cp);
    }
    fqla_gemm(FQLA_GEMM_A_LOWER, cp, Vp, cp, s->P, cp, s->U, Vp, s->O, Vp);
    for (int64_t i = 0; i < ch->c; i++) {
        fqla_axpy8(Vp, scale * ch->e[i], s->W + i * Vp, s->O + i * Vp);
        fqla_store_row_f32(&a->o, fqla_cpu_row_offset(&a->o, b, t0 + i, h), V, s->O + i * Vp);
    }

    if (!update_state)
        return;
    /* S' = e_C S + (K^T diag(f)) U */
    for (int64_t r = 0; r < Kp; r++)
        fqla_mul8(cp, ch->QKt + r * 2 * cp + cp, ch->f, s->Kf + r * cp);
    fqla_scale8(Kp * Vp, ch->eC, s->S);
    fqla_gemm(FQLA_GEMM_ACC, Kp, Vp, cp, s->Kf, cp, s->U, Vp, s->S, Vp);
}

static void fwd_task(void *arg, int64_t item, int worker)
{
    const fwd_job *job = arg;
    const fqla_problem *p = job->p;
    const fqla_fwd_args *a = job->a;
    int64_t n = item / p->HV, h = item % p->HV;
    int64_t K = p->K, V = p->V, Vp = fqla_round8(V);
    int64_t b, start, len;
    fwd_bufs s;
    fwd_carve(&s, K, V, job->scratch + (int64_t)worker * job->per_worker);
    fqla_seq_bounds(p, n, &b, &start, &len);

    int64_t lead[2] = {n, h};
    memset(s.S, 0, (size_t)(fqla_round8(K) * Vp) * sizeof(float));
    if (a->initial_state.data)
        fqla_cpu_state_load(&a->initial_state, lead, K, V, p->opt.state_v_first, s.S, Vp, s.tmp);

    int want_final = a->final_state.data != NULL;
    for (int64_t t0 = start; t0 < start + len; t0 += C64) {
        int64_t c = start + len - t0 < C64 ? start + len - t0 : C64;
        int last = t0 + c >= start + len;
        fqla_chunk_load(&s.ch, &job->in, b, t0, c, h, 1);
        fqla_chunk_prepare(&s.ch, 1);
        fwd_chunk(&s, p, a, b, t0, h, !last || want_final);
    }
    if (want_final)
        fqla_cpu_state_store(&a->final_state, lead, K, V, p->opt.state_v_first, s.S, Vp, s.tmp);
}

fqla_status fqla_cpu_fwd(fqla_context *ctx, const fqla_problem *p, const fqla_fwd_args *a)
{
    fwd_job job;
    int64_t items = p->N * p->HV;
    int workers = fqla_cpu_workers(ctx->threads, items);
    job.p = p;
    job.a = a;
    job.in.p = p;
    job.in.q = &a->q;
    job.in.k = &a->k;
    job.in.v = &a->v;
    job.in.g = &a->g;
    job.in.beta = &a->beta;
    job.in.A_log = &a->A_log;
    job.in.dt_bias = &a->dt_bias;
    job.per_worker = fwd_floats(p->K, p->V);
    job.scratch = fqla_cpu_alloc_floats(job.per_worker * workers);
    if (!job.scratch)
        return fqla_fail(ctx, FQLA_STATUS_ALLOC_FAILED,
                         "CPU forward: could not allocate %lld bytes of scratch for %d threads",
                         (long long)(job.per_worker * workers * (int64_t)sizeof(float)), workers);
    fqla_cpu_zero_uncovered(p, &a->o);
    fqla_cpu_parallel_for(workers, items, fwd_task, &job);
    free(job.scratch);
    return FQLA_STATUS_SUCCESS;
}
