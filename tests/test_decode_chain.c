/*
 * test_decode_chain.c - decode and multi-token verify of the fast CPU
 * backend (FQLA_BACKEND_CPU) on a state pool, through the public API.
 *
 * The property: prefill(L) into the pool, then N decode steps (or one verify
 * of N tokens) gives the outputs and states of one prefill(L + N), computed
 * by the fp64 reference (rel <= 1e-5 with an fp32 pool). With a bf16 pool
 * the state is rounded at every step, so the same chain runs on the
 * reference backend too (same roundings) and the two must agree within
 * 5e-3. Around that: a padded (negative) slot gets zero o rows and touches
 * nothing; pool entries no sequence uses and guard bands before and after
 * the pool stay bit-identical; verify leaves the pool alone (step_states)
 * or writes exactly the entries step_slots names.
 */
#include "cpu_fast_util.h"

#include <stdio.h>
#include <string.h>

static fqla_context *cpu, *ref;

#define QUICK(full, quick) (check_quick() ? (quick) : (full))
#define GUARD 4096 /* bytes of sentinel before and after the pool */

/* A pool of P entries [HV, K, V] (or [HV, V, K]) inside guard bands. */
typedef struct pool {
    unsigned char *mem;   /* GUARD + bytes + GUARD */
    unsigned char *copy;  /* the whole thing at setup, to compare bits */
    size_t bytes, entry_bytes;
    tbuf t;               /* points into mem */
    int64_t P;
} pool;

static pool pool_make(fqla_dtype dtype, int64_t P, int64_t HV, int64_t K, int64_t V)
{
    pool pl;
    pl.P = P;
    pl.entry_bytes = (size_t)(HV * K * V) * tu_size(dtype);
    pl.bytes = (size_t)P * pl.entry_bytes;
    pl.mem = malloc(pl.bytes + 2 * GUARD);
    pl.copy = malloc(pl.bytes + 2 * GUARD);
    /* random bits everywhere: unused entries must keep them exactly */
    for (size_t i = 0; i < pl.bytes + 2 * GUARD; i++)
        pl.mem[i] = (unsigned char)(check_uniform() * 256.0);
    pl.t.data = pl.mem + GUARD;
    pl.t.dtype = dtype;
    pl.t.n = P * HV * K * V;
    return pl;
}

static void pool_snapshot(pool *pl) { memcpy(pl->copy, pl->mem, pl->bytes + 2 * GUARD); }

/* Bytes changed since the snapshot outside the entries marked in used[P]. */
static int64_t pool_changed_outside(const pool *pl, const int *used)
{
    int64_t changed = 0;
    for (size_t i = 0; i < GUARD; i++) {
        changed += pl->mem[i] != pl->copy[i];
        changed += pl->mem[GUARD + pl->bytes + i] != pl->copy[GUARD + pl->bytes + i];
    }
    for (int64_t e = 0; e < pl->P; e++)
        if (!used[e])
            changed += memcmp(pl->mem + GUARD + (size_t)e * pl->entry_bytes,
                              pl->copy + GUARD + (size_t)e * pl->entry_bytes, pl->entry_bytes) != 0;
    return changed;
}

static void pool_free(pool *pl)
{
    free(pl->mem);
    free(pl->copy);
}

/* The tokens [t0, t1) of every batch row of d (a case with T tokens). */
static gdn_data slice(const gdn_case *c, const gdn_data *d, int64_t t0, int64_t t1)
{
    gdn_data s = *d;
    int64_t T = c->T, n = t1 - t0;
    int64_t rq = c->H * c->K, rv = c->HV * c->V, rg = c->HV;
    s.nq = c->B * n * rq;
    s.nv = c->B * n * rv;
    s.ng = c->B * n * rg;
    s.q = tu_doubles(s.nq);
    s.k = tu_doubles(s.nq);
    s.v = tu_doubles(s.nv);
    s.d_o = tu_doubles(s.nv);
    s.g = tu_doubles(s.ng);
    s.beta = tu_doubles(s.ng);
    for (int64_t b = 0; b < c->B; b++)
        for (int64_t t = 0; t < n; t++) {
            int64_t src = b * T + t0 + t, dst = b * n + t;
            memcpy(s.q + dst * rq, d->q + src * rq, (size_t)rq * sizeof(double));
            memcpy(s.k + dst * rq, d->k + src * rq, (size_t)rq * sizeof(double));
            memcpy(s.v + dst * rv, d->v + src * rv, (size_t)rv * sizeof(double));
            memcpy(s.d_o + dst * rv, d->d_o + src * rv, (size_t)rv * sizeof(double));
            memcpy(s.g + dst * rg, d->g + src * rg, (size_t)rg * sizeof(double));
            memcpy(s.beta + dst * rg, d->beta + src * rg, (size_t)rg * sizeof(double));
        }
    s.A_log = tu_doubles(c->HV);
    s.dt_bias = tu_doubles(c->HV);
    s.h0 = tu_doubles(d->ns);
    s.dht = tu_doubles(d->ns);
    memcpy(s.A_log, d->A_log, (size_t)c->HV * sizeof(double));
    memcpy(s.dt_bias, d->dt_bias, (size_t)c->HV * sizeof(double));
    memcpy(s.h0, d->h0, (size_t)d->ns * sizeof(double));
    memcpy(s.dht, d->dht, (size_t)d->ns * sizeof(double));
    return s;
}

/* Copies sequence b's state (a [B, HV, K, V] buffer of doubles) into pool
 * entry e, in the pool's dtype. */
static void pool_put(pool *pl, int64_t e, const double *states, int64_t b, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        tb_put(&pl->t, e * n + i, states[b * n + i]);
}

static double *pool_get(const pool *pl, int64_t e, int64_t n)
{
    double *x = tu_doubles(n);
    for (int64_t i = 0; i < n; i++)
        x[i] = tb_get(&pl->t, e * n + i);
    return x;
}

/* Decode / verify args over the tokens of d (T tokens per row), slots[B]. */
typedef struct dec_bufs {
    gdn_tensors t;
    tbuf slots, o;
} dec_bufs;

static void dec_args(const gdn_case *c, const gdn_data *d, int64_t T, const int64_t *slots, pool *pl,
                     dec_bufs *bufs, fqla_decode_args *a, int ref_dtypes)
{
    gdn_case cc = *c;
    double sl[16];
    cc.T = T;
    cc.ncu = 0;
    for (int64_t b = 0; b < c->B; b++)
        sl[b] = (double)slots[b];
    bufs->t = gdn_tensors_make(&cc, d, ref_dtypes);
    bufs->slots = tb_make(FQLA_DTYPE_I64, c->B, sl);
    bufs->o = tb_make(ref_dtypes ? FQLA_DTYPE_F64 : c->io, c->B * T * c->HV * c->V, NULL);
    fqla_decode_args_init(a);
    a->q = tu_tensor(&bufs->t.q, 4, c->B, T, c->H, c->K, 0);
    a->k = tu_tensor(&bufs->t.k, 4, c->B, T, c->H, c->K, 0);
    a->v = tu_tensor(&bufs->t.v, 4, c->B, T, c->HV, c->V, 0);
    a->g = tu_tensor(&bufs->t.g, 3, c->B, T, c->HV, 0, 0);
    a->beta = tu_tensor(&bufs->t.beta, 3, c->B, T, c->HV, 0, 0);
    if (c->opt.use_gate_in_kernel) {
        a->A_log = tu_tensor(&bufs->t.A_log, 1, c->HV, 0, 0, 0, 0);
        a->dt_bias = tu_tensor(&bufs->t.dt_bias, 1, c->HV, 0, 0, 0, 0);
    }
    a->state_pool = c->opt.state_v_first ? tu_tensor(&pl->t, 4, pl->P, c->HV, c->V, c->K, 0)
                                         : tu_tensor(&pl->t, 4, pl->P, c->HV, c->K, c->V, 0);
    a->slots = tu_tensor(&bufs->slots, 1, c->B, 0, 0, 0, 0);
    a->o = tu_tensor(&bufs->o, 4, c->B, T, c->HV, c->V, 0);
    a->opt = c->opt;
}

static void dec_free(dec_bufs *b)
{
    gdn_tensors_free(&b->t);
    tb_free(&b->slots);
    tb_free(&b->o);
}

/* o rows of batch row b (all T tokens, heads, V) of a [B, T, HV, V] array. */
static double *rows_of(const double *x, int64_t b, int64_t T, int64_t t0, int64_t n, int64_t row)
{
    double *r = tu_doubles(n * row);
    memcpy(r, x + (b * T + t0) * row, (size_t)(n * row) * sizeof(double));
    return r;
}

/* The case every chain test uses: B = 3 rows, row 1 padded (slot -1). */
static gdn_case chain_case_kv(int64_t T, fqla_dtype pool_dtype, int v_first, int64_t K, int64_t V)
{
    gdn_case c = gdn_case_make(3, T, 2, 4, K, V);
    c.opt.use_qk_l2norm = c.opt.use_gate_in_kernel = c.opt.use_beta_sigmoid = 1;
    c.opt.state_v_first = v_first;
    c.state = pool_dtype;
    c.h0 = c.final = 1;
    return c;
}

static gdn_case chain_case(int64_t T, fqla_dtype pool_dtype, int v_first)
{
    return chain_case_kv(T, pool_dtype, v_first, QUICK(128, 32), QUICK(128, 32));
}

static const int64_t chain_slots[3] = {3, -1, 0};
static const int chain_used[5] = {1, 0, 0, 1, 0};

/* prefill(L) on ctx with final states into the pool, then N decode steps on
 * ctx; o of every step into o_steps [B, N, HV, V] (doubles). */
static void run_chain(fqla_context *ctx, const gdn_case *c, const gdn_data *d, int64_t L, int64_t N, pool *pl,
                      double *o_steps, int is_ref)
{
    int64_t ns = c->HV * c->K * c->V, rowv = c->HV * c->V;
    gdn_case pre = *c;
    pre.T = L;
    gdn_data dp = slice(c, d, 0, L);
    gdn_out po = gdn_run_fwd(ctx, &pre, &dp, is_ref);
    CHECK(po.status == FQLA_STATUS_SUCCESS, "prefill: %s", fqla_last_error(ctx));
    for (int64_t b = 0; b < c->B; b++)
        if (chain_slots[b] >= 0 && po.fs)
            pool_put(pl, chain_slots[b], po.fs, b, ns);
    pool_snapshot(pl);
    gdn_out_free(&po);
    gdn_data_free(&dp);

    for (int64_t s = 0; s < N; s++) {
        gdn_data ds = slice(c, d, L + s, L + s + 1);
        dec_bufs bufs;
        fqla_decode_args a;
        dec_args(c, &ds, 1, chain_slots, pl, &bufs, &a, is_ref);
        fqla_status st = fqla_decode(ctx, &a, NULL, 0, NULL);
        CHECK(st == FQLA_STATUS_SUCCESS, "decode step %lld: %s", (long long)s, fqla_last_error(ctx));
        for (int64_t b = 0; b < c->B; b++)
            for (int64_t j = 0; j < rowv; j++)
                o_steps[(b * N + s) * rowv + j] = tb_get(&bufs.o, b * rowv + j);
        dec_free(&bufs);
        gdn_data_free(&ds);
    }
}

/* Checks that row 1 (padded) of a [B, T, HV, V] output is exactly zero. */
static void check_padded_zero(const double *o, int64_t T, int64_t rowv)
{
    int64_t bad = 0;
    for (int64_t i = 0; i < T * rowv; i++)
        bad += o[(1 * T) * rowv + i] != 0.0;
    CHECK(bad == 0, "padded row: %lld o values are not zero", (long long)bad);
}

static void decode_chain_equals_prefill_kv(int v_first, int64_t K, int64_t V)
{
    int64_t L = QUICK(70, 9), N = QUICK(5, 3);
    gdn_case c = chain_case_kv(L + N, FQLA_DTYPE_F32, v_first, K, V);
    int64_t ns = c.HV * c.K * c.V, rowv = c.HV * c.V;
    gdn_data d = gdn_data_make(&c);
    gdn_out full = gdn_run_fwd(ref, &c, &d, 1);
    CHECK(full.status == FQLA_STATUS_SUCCESS, "reference prefill: %s", fqla_last_error(ref));

    pool pl = pool_make(FQLA_DTYPE_F32, 5, c.HV, c.K, c.V);
    double *o_steps = tu_doubles(c.B * N * rowv);
    run_chain(cpu, &c, &d, L, N, &pl, o_steps, 0);

    for (int64_t b = 0; b < c.B; b++) {
        if (chain_slots[b] < 0)
            continue;
        double *x = rows_of(o_steps, b, N, 0, N, rowv), *r = rows_of(full.o, b, c.T, L, N, rowv);
        double e = check_rel_error(x, r, N * rowv);
        CHECK(e <= 1e-5, "row %lld: decode o vs prefill(L + N) o: rel %.3g", (long long)b, e);
        free(x);
        free(r);
        double *st = pool_get(&pl, chain_slots[b], ns);
        e = check_rel_error(st, full.fs + b * ns, ns);
        CHECK(e <= 1e-5, "row %lld: pool state after N steps vs prefill(L + N) final state: rel %.3g",
              (long long)b, e);
        free(st);
    }
    check_padded_zero(o_steps, N, rowv);
    int64_t changed = pool_changed_outside(&pl, chain_used);
    CHECK(changed == 0, "%lld unused pool entries or guard bytes changed", (long long)changed);

    free(o_steps);
    pool_free(&pl);
    gdn_out_free(&full);
    gdn_data_free(&d);
}

static void decode_chain_equals_prefill(int v_first)
{
    decode_chain_equals_prefill_kv(v_first, QUICK(128, 32), QUICK(128, 32));
}

static void decode_chain_f32(void) { decode_chain_equals_prefill(0); }
static void decode_chain_f32_v_first(void) { decode_chain_equals_prefill(1); }

static void decode_chain_bf16_pool(void)
{
    int64_t L = QUICK(70, 9), N = QUICK(5, 3);
    gdn_case c = chain_case(L + N, FQLA_DTYPE_BF16, 1);
    int64_t ns = c.HV * c.K * c.V, rowv = c.HV * c.V;
    gdn_data d = gdn_data_make(&c);
    pool pc = pool_make(FQLA_DTYPE_BF16, 5, c.HV, c.K, c.V);
    pool pr = pool_make(FQLA_DTYPE_BF16, 5, c.HV, c.K, c.V);
    double *oc = tu_doubles(c.B * N * rowv), *orf = tu_doubles(c.B * N * rowv);
    run_chain(cpu, &c, &d, L, N, &pc, oc, 0);
    run_chain(ref, &c, &d, L, N, &pr, orf, 1);
    for (int64_t b = 0; b < c.B; b++) {
        if (chain_slots[b] < 0)
            continue;
        double *x = rows_of(oc, b, N, 0, N, rowv), *r = rows_of(orf, b, N, 0, N, rowv);
        double e = check_rel_error(x, r, N * rowv);
        CHECK(e <= 5e-3, "row %lld: o, CPU vs reference chain: rel %.3g", (long long)b, e);
        free(x);
        free(r);
        double *sc = pool_get(&pc, chain_slots[b], ns), *sr = pool_get(&pr, chain_slots[b], ns);
        e = check_rel_error(sc, sr, ns);
        CHECK(e <= 5e-3, "row %lld: bf16 pool state, CPU vs reference chain: rel %.3g", (long long)b, e);
        free(sc);
        free(sr);
    }
    check_padded_zero(oc, N, rowv);
    int64_t changed = pool_changed_outside(&pc, chain_used);
    CHECK(changed == 0, "%lld unused pool entries or guard bytes changed", (long long)changed);
    free(oc);
    free(orf);
    pool_free(&pc);
    pool_free(&pr);
    gdn_data_free(&d);
}

/* prefill(L) on the CPU into the pool, then one verify of N tokens; returns
 * the verify's o [B, N, HV, V] and step states [B, N, HV, K, V]. */
static void verify_after_prefill(const gdn_case *c, const gdn_data *d, int64_t L, int64_t N, pool *pl,
                                 const int64_t *step_slots, double **o, double **steps, fqla_status *st)
{
    int64_t ns = c->HV * c->K * c->V;
    gdn_case pre = *c;
    pre.T = L;
    gdn_data dp = slice(c, d, 0, L);
    gdn_out po = gdn_run_fwd(cpu, &pre, &dp, 0);
    CHECK(po.status == FQLA_STATUS_SUCCESS, "prefill: %s", fqla_last_error(cpu));
    for (int64_t b = 0; b < c->B; b++)
        if (chain_slots[b] >= 0 && po.fs)
            pool_put(pl, chain_slots[b], po.fs, b, ns);
    pool_snapshot(pl);
    gdn_out_free(&po);
    gdn_data_free(&dp);

    gdn_data dv = slice(c, d, L, L + N);
    dec_bufs bufs;
    fqla_decode_args a;
    dec_args(c, &dv, N, chain_slots, pl, &bufs, &a, 0);
    tbuf ss = tb_make(c->state, c->B * N * ns, NULL);
    double sl[64];
    for (int64_t i = 0; step_slots && i < c->B * N; i++)
        sl[i] = (double)step_slots[i];
    tbuf sst = tb_make(FQLA_DTYPE_I64, step_slots ? c->B * N : 0, step_slots ? sl : NULL);
    if (step_slots)
        a.step_slots = tu_tensor(&sst, 2, c->B, N, 0, 0, 0);
    else
        a.step_states = c->opt.state_v_first ? tu_tensor(&ss, 5, c->B, N, c->HV, c->V, c->K)
                                             : tu_tensor(&ss, 5, c->B, N, c->HV, c->K, c->V);
    *st = fqla_verify(cpu, &a, NULL, 0, NULL);
    *o = tb_to_doubles(&bufs.o);
    *steps = tb_to_doubles(&ss);
    tb_free(&ss);
    tb_free(&sst);
    dec_free(&bufs);
    gdn_data_free(&dv);
}

static void verify_equals_prefill_kv(int v_first, int64_t K, int64_t V, int64_t N)
{
    int64_t L = QUICK(66, 9);
    gdn_case c = chain_case_kv(L + N, FQLA_DTYPE_F32, v_first, K, V);
    int64_t ns = c.HV * c.K * c.V, rowv = c.HV * c.V;
    gdn_data d = gdn_data_make(&c);
    pool pl = pool_make(FQLA_DTYPE_F32, 5, c.HV, c.K, c.V);
    double *o, *steps;
    fqla_status st;
    verify_after_prefill(&c, &d, L, N, &pl, NULL, &o, &steps, &st);
    CHECK(st == FQLA_STATUS_SUCCESS, "verify: %s", fqla_last_error(cpu));

    /* every step state t is the final state of prefill(L + t + 1) */
    for (int64_t t = 0; t < N; t++) {
        gdn_case ct = c;
        ct.T = L + t + 1;
        gdn_data dt = slice(&c, &d, 0, L + t + 1);
        gdn_out r = gdn_run_fwd(ref, &ct, &dt, 1);
        for (int64_t b = 0; b < c.B; b++) {
            if (chain_slots[b] < 0)
                continue;
            double e = check_rel_error(steps + (b * N + t) * ns, r.fs + b * ns, ns);
            CHECK(e <= 1e-5, "row %lld step %lld: step state vs prefill final state: rel %.3g", (long long)b,
                  (long long)t, e);
            double *x = rows_of(o, b, N, t, 1, rowv), *rr = rows_of(r.o, b, ct.T, L + t, 1, rowv);
            e = check_rel_error(x, rr, rowv);
            CHECK(e <= 1e-5, "row %lld step %lld: o vs prefill: rel %.3g", (long long)b, (long long)t, e);
            free(x);
            free(rr);
        }
        gdn_out_free(&r);
        gdn_data_free(&dt);
    }
    check_padded_zero(o, N, rowv);
    /* the padded row's step states are never written (still NaN) */
    int64_t written = 0;
    for (int64_t i = 0; i < N * ns; i++)
        written += !isnan(steps[(1 * N) * ns + i]);
    CHECK(written == 0, "padded row: %lld step-state values written", (long long)written);
    /* verify never writes the pool */
    static const int none[5] = {0, 0, 0, 0, 0};
    int64_t changed = pool_changed_outside(&pl, none);
    CHECK(changed == 0, "verify changed %lld pool entries or guard bytes", (long long)changed);
    free(o);
    free(steps);
    pool_free(&pl);
    gdn_data_free(&d);
}

static void verify_equals_prefill(void) { verify_equals_prefill_kv(0, QUICK(128, 32), QUICK(128, 32), 4); }

/* The decode path's bodies (portable, AVX2 + FMA, AVX-512; src/cpu/decode_step.c)
 * on head dims that take each one and its tails: 16-column tiles with a
 * partial last one (V = 72, 20), [V, K] rows of K = 48 (AVX-512), 40 (AVX2)
 * and 36 (portable), in both layouts; verify of 11 tokens crosses the token
 * block of 8. Every path available on this CPU runs, each against the fp64
 * reference (and V = 128, a whole row per tile in place); the path in use
 * before is restored. */
#include "cpu/cpu_isa.h"

static void decode_paths_and_shapes(void)
{
    static const int64_t kv[5][2] = {{48, 72}, {40, 20}, {36, 48}, {16, 16}, {128, 128}};
    int before = fqla_cpu_isa(), best = fqla_cpu_isa_available();
#if defined(__aarch64__)
    /* the portable and NEON bodies (NEON: 16-column tiles of V = 72, 48, 16,
     * 128; [V, K] rows of every K here, 36 through its 4-float tail) */
    CHECK(best == FQLA_CPU_ISA_NEON, "aarch64 build without its NEON path (best %d)", best);
#else
    if (best < FQLA_CPU_ISA_AVX512)
        check_skip("decode_paths_and_shapes AVX-512", "this CPU (or build) has no AVX-512 path: the others run");
#endif
    for (int isa = FQLA_CPU_ISA_BASE; isa <= best; isa++) {
        fqla_cpu_isa_force(isa);
        for (int s = 0; s < 5; s++)
            for (int v_first = 0; v_first < 2; v_first++) {
                decode_chain_equals_prefill_kv(v_first, kv[s][0], kv[s][1]);
                verify_equals_prefill_kv(v_first, kv[s][0], kv[s][1], 11);
            }
    }
    fqla_cpu_isa_force(before);
}

static void verify_step_slots(void)
{
    /* pool of 12: rows 0 and 2 read entries 3 and 0; steps go to 5..11, some skipped */
    int64_t L = QUICK(40, 9), N = 3;
    gdn_case c = chain_case(L + N, FQLA_DTYPE_BF16, 1);
    int64_t ns = c.HV * c.K * c.V;
    static const int64_t step_slots[9] = {5, -1, 6, 7, 8, 9, 10, 11, -1};
    static const int used[12] = {0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1};
    gdn_data d = gdn_data_make(&c);

    pool with_states = pool_make(FQLA_DTYPE_BF16, 12, c.HV, c.K, c.V);
    double *o1, *steps, *o2, *unused;
    fqla_status st;
    verify_after_prefill(&c, &d, L, N, &with_states, NULL, &o1, &steps, &st);
    CHECK(st == FQLA_STATUS_SUCCESS, "verify (step_states): %s", fqla_last_error(cpu));

    pool pl = pool_make(FQLA_DTYPE_BF16, 12, c.HV, c.K, c.V);
    verify_after_prefill(&c, &d, L, N, &pl, step_slots, &o2, &unused, &st);
    CHECK(st == FQLA_STATUS_SUCCESS, "verify (step_slots): %s", fqla_last_error(cpu));
    /* rows 0 and 2 (row 1 is padded: its step slots 8, 9 and 7 stay untouched) */
    int64_t mismatched = 0;
    for (int64_t b = 0; b < c.B; b++)
        for (int64_t t = 0; t < N; t++) {
            int64_t e = step_slots[b * N + t];
            if (e < 0 || b == 1)
                continue;
            double *x = pool_get(&pl, e, ns);
            for (int64_t i = 0; i < ns; i++)
                mismatched += x[i] != steps[(b * N + t) * ns + i];
            free(x);
        }
    CHECK(mismatched == 0, "%lld pool values differ from the step_states run", (long long)mismatched);
    int64_t bad = 0;
    for (int64_t i = 0; i < c.B * N * c.HV * c.V; i++)
        bad += o1[i] != o2[i] && !(isnan(o1[i]) && isnan(o2[i]));
    CHECK(bad == 0, "o differs between the step_states and step_slots runs in %lld values", (long long)bad);
    int64_t changed = pool_changed_outside(&pl, used);
    CHECK(changed == 0, "%lld pool entries or guard bytes changed that no step slot names", (long long)changed);
    free(o1);
    free(o2);
    free(steps);
    free(unused);
    pool_free(&pl);
    pool_free(&with_states);
    gdn_data_free(&d);
}

static void decode_raw_gate_plain_options(void)
{
    /* decode without in-kernel transforms, K != V, a small odd head dim */
    int64_t L = QUICK(65, 9), N = 3;
    gdn_case c = gdn_case_make(3, L + N, 1, 3, 24, 40);
    c.h0 = c.final = 1;
    int64_t ns = c.HV * c.K * c.V, rowv = c.HV * c.V;
    gdn_data d = gdn_data_make(&c);
    gdn_out full = gdn_run_fwd(ref, &c, &d, 1);
    pool pl = pool_make(FQLA_DTYPE_F32, 5, c.HV, c.K, c.V);
    double *o_steps = tu_doubles(c.B * N * rowv);
    run_chain(cpu, &c, &d, L, N, &pl, o_steps, 0);
    for (int64_t b = 0; b < c.B; b++) {
        if (chain_slots[b] < 0)
            continue;
        double *x = rows_of(o_steps, b, N, 0, N, rowv), *r = rows_of(full.o, b, c.T, L, N, rowv);
        double e = check_rel_error(x, r, N * rowv);
        CHECK(e <= 1e-5, "row %lld: o rel %.3g", (long long)b, e);
        free(x);
        free(r);
        double *st = pool_get(&pl, chain_slots[b], ns);
        e = check_rel_error(st, full.fs + b * ns, ns);
        CHECK(e <= 1e-5, "row %lld: state rel %.3g", (long long)b, e);
        free(st);
    }
    free(o_steps);
    pool_free(&pl);
    gdn_out_free(&full);
    gdn_data_free(&d);
}

int main(void)
{
    check_rng_seed(check_seed());
    cpu = tu_context(FQLA_BACKEND_CPU, 2);
    ref = tu_context(FQLA_BACKEND_CPU_REFERENCE, 2);
    if (!cpu || !ref)
        return check_summary();
    CHECK_RUN(decode_chain_f32);
    CHECK_RUN(decode_chain_f32_v_first);
    CHECK_RUN(decode_chain_bf16_pool);
    CHECK_RUN(verify_equals_prefill);
    CHECK_RUN(verify_step_slots);
    CHECK_RUN(decode_raw_gate_plain_options);
    CHECK_RUN(decode_paths_and_shapes);
    fqla_context_destroy(cpu);
    fqla_context_destroy(ref);
    return check_summary();
}
