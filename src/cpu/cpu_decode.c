/*
 * cpu_decode.c - decode and multi-token verify of the fast CPU backend on a
 * state pool (include/flashqla.h, fqla_decode_args), fp32 math whatever the
 * pool's storage (F32 or BF16, [K, V] or [V, K] per head).
 *
 * One work item per (batch row b, value head h). The state is worked on in
 * tiles of value columns (a 32-column strip of a [K, V] state, 16 rows of a
 * [V, K] one), each a problem of its own (decode_step.h): a tile is taken
 * into L1 once and every token of the call (in blocks of TOKEN_BLOCK) runs
 * on it there, so the state crosses memory once per token block.
 *
 * Decode on an F32 pool updates pool[slots[b], h] in place; a BF16 pool's
 * tile goes through a local fp32 tile (rounded once, at the store, as the
 * token recurrence of the reference rounds a bf16 pool per call). Verify
 * leaves pool[slots[b]] alone: with an F32 pool and F32 step_states (and an
 * AVX-512 body for the layout) each token reads the previous state and
 * writes its own straight into step_states[b, t, h]; otherwise its tile is a
 * local copy, stored after every token to step_states[b, t, h] or to
 * pool[step_slots[b, t], h] (negative: skipped). A negative slot is padding: that row's o is zeroed and nothing
 * else is read or written. Validation guarantees that no two sequences or
 * steps share a pool entry, so items never touch each other's data and may
 * run in any order. Nothing is allocated: every buffer is on the stack
 * (head dims are at most FQLA_CPU_MAX_HEAD_DIM).
 */
#include "cpu/cpu_chunk.h"
#include "cpu/decode_step.h"
#include "cpu/gemm.h"
#include "cpu/threads.h"

#include <math.h>
#include <string.h>

#define TILE_KV FQLA_DECODE_KV_TILE
#define TILE_VK 16
#define TOKEN_BLOCK 8
#define MAX_DIM FQLA_CPU_MAX_HEAD_DIM

/* Below this many state elements x tokens per worker, waking another thread
 * costs more than it saves (a token costs ~0.1 ns per element; a wake-up
 * several microseconds). */
#define MIN_WORK_PER_WORKER ((int64_t)1 << 17)

typedef struct decode_job {
    const fqla_problem *p;
    const fqla_decode_args *a;
    fqla_cpu_inputs in;
    int verify;
} decode_job;

/* The transformed inputs of up to TOKEN_BLOCK tokens of one (b, h). */
typedef struct token_block {
    float q[TOKEN_BLOCK][MAX_DIM], k[TOKEN_BLOCK][MAX_DIM], v[TOKEN_BLOCK][MAX_DIM];
    fqla_decode_token tok[TOKEN_BLOCK];
    double row[MAX_DIM];
} token_block;

static void load_tokens(token_block *tb, const decode_job *job, int64_t b, int64_t h, int64_t t0,
                        int64_t nt)
{
    const fqla_problem *p = job->p;
    const fqla_decode_args *a = job->a;
    int64_t hk = h / p->group;
    float scale = (float)p->scale;
    for (int64_t i = 0; i < nt; i++) {
        int64_t t = t0 + i;
        fqla_cpu_load_qk(&job->in, &a->q, b, t, hk, tb->row, tb->q[i]);
        fqla_cpu_load_qk(&job->in, &a->k, b, t, hk, tb->row, tb->k[i]);
        fqla_load_row_f32(&a->v, fqla_cpu_row_offset(&a->v, b, t, h), p->V, tb->v[i]);
        fqla_decode_token *tk = &tb->tok[i];
        tk->q = tb->q[i];
        tk->k = tb->k[i];
        tk->v = tb->v[i];
        tk->a = (float)exp(fqla_cpu_gate(&job->in, b, t, h));
        tk->beta = (float)fqla_cpu_beta(&job->in, b, t, h);
        tk->ca = scale * tk->a;
        tk->cu = scale * (float)fqla_dot_f64(p->K, tb->q[i], tb->k[i]);
    }
}

/* A tile (value columns [j0, j0 + w)) of the state at `base` in tensor x,
 * to / from fp32 tile memory: [K, V] strips are K rows of w (ld TILE_KV),
 * [V, K] rows are w rows of K (ld K). */
static void tile_load(const fqla_tensor *x, int64_t base, int64_t rs, int v_first, int64_t K,
                      int64_t j0, int64_t w, float *tile)
{
    if (x->dtype == FQLA_DTYPE_F32) {
        const float *src = (const float *)x->data + base;
        if (v_first)
            fqla_decode_copy_rows(w, K, src + j0 * rs, rs, tile, K);
        else
            fqla_decode_copy_rows(K, w, src + j0, rs, tile, TILE_KV);
        return;
    }
    if (v_first)
        for (int64_t r = 0; r < w; r++)
            fqla_load_row_f32(x, base + (j0 + r) * rs, K, tile + r * K);
    else
        for (int64_t i = 0; i < K; i++)
            fqla_load_row_f32(x, base + i * rs + j0, w, tile + i * TILE_KV);
}

static void tile_store(const fqla_tensor *x, int64_t base, int64_t rs, int v_first, int64_t K,
                       int64_t j0, int64_t w, const float *tile)
{
    if (x->dtype == FQLA_DTYPE_F32) {
        float *dst = (float *)x->data + base;
        if (v_first)
            fqla_decode_copy_rows(w, K, tile, K, dst + j0 * rs, rs);
        else
            fqla_decode_copy_rows(K, w, tile, TILE_KV, dst + j0, rs);
        return;
    }
    if (v_first)
        for (int64_t r = 0; r < w; r++)
            fqla_store_row_f32(x, base + (j0 + r) * rs, K, tile + r * K);
    else
        for (int64_t i = 0; i < K; i++)
            fqla_store_row_f32(x, base + i * rs + j0, w, tile + i * TILE_KV);
}

static void zero_o(const fqla_problem *p, const fqla_decode_args *a, int64_t b, int64_t h)
{
    float zero[MAX_DIM];
    memset(zero, 0, sizeof zero);
    for (int64_t t = 0; t < p->T; t++)
        fqla_store_row_f32(&a->o, fqla_cpu_row_offset(&a->o, b, t, h), p->V, zero);
}

/* After token t of verify: the tile to wherever that step's state goes. */
static void store_step(const decode_job *job, int64_t b, int64_t t, int64_t h, int64_t j0, int64_t w,
                       const float *tile)
{
    const fqla_problem *p = job->p;
    const fqla_decode_args *a = job->a;
    int v_first = p->opt.state_v_first;
    if (a->step_states.data) {
        const fqla_tensor *x = &a->step_states;
        int64_t lead[3] = {b, t, h};
        tile_store(x, fqla_cpu_state_base(x, lead), x->strides[x->ndim - 2], v_first, p->K, j0, w, tile);
    } else if (a->step_slots.data) {
        int64_t ss = fqla_cpu_load_index(&a->step_slots, b * a->step_slots.strides[0] + t * a->step_slots.strides[1]);
        if (ss >= 0) {
            const fqla_tensor *x = &a->state_pool;
            int64_t lead[2] = {ss, h};
            tile_store(x, fqla_cpu_state_base(x, lead), x->strides[x->ndim - 2], v_first, p->K, j0, w, tile);
        }
    }
}

/* Verify of one tile straight into F32 step_states (see decode_task). */
static void verify_direct(const decode_job *job, int64_t b, int64_t h, int64_t base, int64_t rs, int64_t j0,
                          int64_t w, token_block *tb, int one_block)
{
    const fqla_problem *p = job->p;
    const fqla_decode_args *a = job->a;
    const fqla_tensor *steps = &a->step_states;
    int v_first = p->opt.state_v_first;
    int64_t col = v_first ? j0 * rs : j0, srs = steps->strides[steps->ndim - 2];
    int64_t scol = v_first ? j0 * srs : j0;
    const float *S = (const float *)a->state_pool.data + base + col;
    int64_t ld = rs;
    float o[FQLA_DECODE_KV_WIDE];
    for (int64_t t0 = 0; t0 < p->T; t0 += TOKEN_BLOCK) {
        int64_t nt = p->T - t0 < TOKEN_BLOCK ? p->T - t0 : TOKEN_BLOCK;
        if (!one_block)
            load_tokens(tb, job, b, h, t0, nt);
        for (int64_t i = 0; i < nt; i++) {
            int64_t lead[3] = {b, t0 + i, h};
            float *D = (float *)steps->data + fqla_cpu_state_base(steps, lead) + scol;
            fqla_decode_token tk = tb->tok[i];
            tk.v += j0;
            fqla_decode_step_to(v_first, p->K, w, S, ld, D, srs, &tk, o);
            fqla_store_row_f32(&a->o, fqla_cpu_row_offset(&a->o, b, t0 + i, h) + j0, w, o);
            S = D;
            ld = srs;
        }
    }
}

static void decode_task(void *arg, int64_t item, int worker)
{
    const decode_job *job = arg;
    const fqla_problem *p = job->p;
    const fqla_decode_args *a = job->a;
    const fqla_tensor *pool = &a->state_pool;
    int64_t b = item / p->HV, h = item % p->HV, K = p->K, V = p->V, T = p->T;
    int v_first = p->opt.state_v_first;
    int64_t slot = fqla_cpu_load_index(&a->slots, b * a->slots.strides[0]);
    (void)worker;
    if (slot < 0) {
        zero_o(p, a, b, h); /* padding: this head's o rows only (other heads are other items) */
        return;
    }

    token_block tb;
    float local[MAX_DIM * TILE_KV], o[FQLA_DECODE_KV_WIDE];
    int64_t lead[2] = {slot, h};
    int64_t base = fqla_cpu_state_base(pool, lead), rs = pool->strides[pool->ndim - 2];
    int in_place = !job->verify && pool->dtype == FQLA_DTYPE_F32;
    /* verify into F32 step_states from an F32 pool: each token reads the
     * previous state (the pool's, then its own last step's, still in cache)
     * and writes the step's state where it belongs, whole rows in order */
    const fqla_tensor *steps = &a->step_states;
    int direct = job->verify && steps->data && steps->dtype == FQLA_DTYPE_F32 && pool->dtype == FQLA_DTYPE_F32 &&
                 fqla_decode_step_to_ok(K, V, v_first);
    int one_block = T <= TOKEN_BLOCK; /* the common case: load the tokens once for all tiles */
    if (one_block)
        load_tokens(&tb, job, b, h, 0, T);

    int64_t tile = v_first ? TILE_VK : (in_place || direct) ? FQLA_DECODE_KV_WIDE : TILE_KV;
    for (int64_t j0 = 0; j0 < V; j0 += tile) {
        int64_t w = V - j0 < tile ? V - j0 : tile;
        float *S;
        int64_t ld;
        if (direct) {
            verify_direct(job, b, h, base, rs, j0, w, &tb, one_block);
            continue;
        }
        if (in_place) {
            S = (float *)pool->data + base + (v_first ? j0 * rs : j0);
            ld = rs;
        } else {
            tile_load(pool, base, rs, v_first, K, j0, w, local);
            S = local;
            ld = v_first ? K : TILE_KV;
        }
        for (int64_t t0 = 0; t0 < T; t0 += TOKEN_BLOCK) {
            int64_t nt = T - t0 < TOKEN_BLOCK ? T - t0 : TOKEN_BLOCK;
            if (!one_block)
                load_tokens(&tb, job, b, h, t0, nt);
            for (int64_t i = 0; i < nt; i++) {
                fqla_decode_token tk = tb.tok[i];
                tk.v += j0;
                if (v_first)
                    fqla_decode_step_vk(K, w, S, ld, &tk, o);
                else
                    fqla_decode_step_kv(K, w, S, ld, &tk, o);
                fqla_store_row_f32(&a->o, fqla_cpu_row_offset(&a->o, b, t0 + i, h) + j0, w, o);
                if (job->verify)
                    store_step(job, b, t0 + i, h, j0, w, S);
            }
        }
        if (!in_place && !job->verify)
            tile_store(pool, base, rs, v_first, K, j0, w, local);
    }
}

fqla_status fqla_cpu_decode(fqla_context *ctx, const fqla_problem *p, const fqla_decode_args *a)
{
    decode_job job;
    int64_t items = p->B * p->HV;
    int64_t work = items * p->K * p->V * p->T;
    int64_t by_work = work / MIN_WORK_PER_WORKER;
    int threads = p->threads;
    if (by_work < threads)
        threads = by_work < 1 ? 1 : (int)by_work;
    job.p = p;
    job.a = a;
    job.verify = p->op == FQLA_OP_VERIFY;
    job.in = fqla_cpu_inputs_decode(p, a);
    fqla_cpu_run(ctx, fqla_cpu_workers(threads, items), items, decode_task, &job);
    return FQLA_STATUS_SUCCESS;
}
