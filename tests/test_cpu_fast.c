/*
 * test_cpu_fast.c - the fast fp32 CPU backend (FQLA_BACKEND_CPU: chunked
 * forward and backward) against the fp64 reference
 * (FQLA_BACKEND_CPU_REFERENCE) on the same inputs, through the public API.
 *
 * Thresholds (docs/testing.md): fp32 inputs, chunked CPU vs fp64 reference:
 * rel <= 1e-5 for o, states, dq, dk, dv, dh0 and <= 1e-4 for dg, dbeta,
 * dA_log, ddt_bias; bf16 inputs: 5e-3 (o, states), 8e-3 (dq, dk, dv, dh0),
 * 2e-2 (dg, dbeta), with the reference run on the same bf16-rounded values.
 * Errors are checked per (sequence, head), so one wrong head cannot hide
 * behind the others. Every output is NaN-poisoned before the run; rows after
 * the last cu_seqlens entry must come back as zeros.
 *
 * Shapes mix the lists of docs/testing.md rather than taking full products, to
 * keep the run short; FQLA_TEST_QUICK (sanitizer builds) shrinks them more.
 */
#include "cpu_fast_util.h"

#include "cpu/transforms.h" /* fqla_softplus, fqla_sigmoid: the gate terms of dA_log */
#include "internal.h" /* the bf16 row load / store the CPU backends use, checked below */

#include <stdio.h>
#include <string.h>

static fqla_context *cpu, *ref;

#define QUICK(full, quick) (check_quick() ? (quick) : (full))

#define TOL_F32 1e-5
#define TOL_F32_GATE 1e-4

/* o and final state of c, CPU vs reference, within tol. */
static void run_fwd(const gdn_case *c, double tol)
{
    gdn_data d = gdn_data_make(c);
    gdn_out x = gdn_run_fwd(cpu, c, &d, 0);
    gdn_out r = gdn_run_fwd(ref, c, &d, 1);
    CHECK(x.status == FQLA_STATUS_SUCCESS, "CPU forward: %s: %s", fqla_status_string(x.status), fqla_last_error(cpu));
    CHECK(r.status == FQLA_STATUS_SUCCESS, "reference forward: %s: %s", fqla_status_string(r.status),
          fqla_last_error(ref));
    if (x.status == FQLA_STATUS_SUCCESS && r.status == FQLA_STATUS_SUCCESS) {
        gdn_check_rows(c, "o", x.o, r.o, c->HV, c->V, tol);
        gdn_check_trailing_zero(c, "o", x.o, c->HV, c->V);
        if (c->final)
            gdn_check_flat("final_state", x.fs, r.fs, d.ns, tol);
    }
    gdn_out_free(&x);
    gdn_out_free(&r);
    gdn_data_free(&d);
}

/* Every gradient of c, CPU vs reference: tol for dq, dk, dv, dh0, tol_gate
 * for dg, dbeta, dA_log, ddt_bias. */
/* dA_log and ddt_bias are, per value head, signed sums over every token of
 * that head; where the terms nearly cancel, the sum's relative error says
 * nothing about how well each term was formed (seed 2711502951 put dA_log
 * at 1.5e-4 against 1e-4 while dg, its terms' source, passed). So they are
 * checked as sums: |x - ref| <= tol * sum |term| per head, the terms rebuilt
 * from the reference's da (the raw gate's gradient) as fqla_gate_grad forms
 * them: da itself for ddt_bias, da softplus(x) / sigmoid(x) for dA_log (= dg
 * g), x = a + dt_bias. A wrong term still moves the sum by about its own
 * size, so the check fails on it. */
static void check_gate_param(const gdn_case *c, const gdn_data *d, const char *name, const double *x,
                             const double *ref, const double *da_ref, int alog, double tol)
{
    double *scale = calloc((size_t)c->HV, sizeof *scale), worst = 0.0;
    int64_t at = 0;
    for (int64_t i = 0; scale && i < d->ng; i++) {
        const int64_t h = i % c->HV;
        const double xg = d->g[i] + d->dt_bias[h], sg = fqla_sigmoid(xg);
        scale[h] += fabs(alog ? (sg > 0.0 ? da_ref[i] * fqla_softplus(xg) / sg : 0.0) : da_ref[i]);
    }
    for (int64_t h = 0; scale && h < c->HV; h++) {
        const double e = fabs(x[h] - ref[h]) / (scale[h] > 0.0 ? scale[h] : 1.0);
        if (e > worst) worst = e, at = h;
    }
    CHECK(scale != NULL, "%s: out of memory", name);
    CHECK(worst <= tol, "%s: |error| / sum |terms| %.3g at head %lld (tol %.1g)", name, worst, (long long)at, tol);
    free(scale);
}

static void run_bwd(const gdn_case *c, double tol, double tol_gate)
{
    gdn_data d = gdn_data_make(c);
    gdn_out x = gdn_run_bwd(cpu, c, &d, 0);
    gdn_out r = gdn_run_bwd(ref, c, &d, 1);
    CHECK(x.status == FQLA_STATUS_SUCCESS, "CPU backward: %s: %s", fqla_status_string(x.status),
          fqla_last_error(cpu));
    CHECK(r.status == FQLA_STATUS_SUCCESS, "reference backward: %s: %s", fqla_status_string(r.status),
          fqla_last_error(ref));
    if (x.status == FQLA_STATUS_SUCCESS && r.status == FQLA_STATUS_SUCCESS) {
        gdn_check_rows(c, "dq", x.dq, r.dq, c->H, c->K, tol);
        gdn_check_rows(c, "dk", x.dk, r.dk, c->H, c->K, tol);
        gdn_check_rows(c, "dv", x.dv, r.dv, c->HV, c->V, tol);
        gdn_check_rows(c, "dg", x.dg, r.dg, c->HV, 1, tol_gate);
        gdn_check_rows(c, "dbeta", x.dbeta, r.dbeta, c->HV, 1, tol_gate);
        gdn_check_trailing_zero(c, "dq", x.dq, c->H, c->K);
        gdn_check_trailing_zero(c, "dv", x.dv, c->HV, c->V);
        gdn_check_trailing_zero(c, "dg", x.dg, c->HV, 1);
        if (c->h0)
            gdn_check_flat("dh0", x.dh0, r.dh0, d.ns, tol);
        if (c->opt.use_gate_in_kernel) {
            check_gate_param(c, &d, "dA_log", x.dA_log, r.dA_log, r.dg, 1, tol_gate);
            check_gate_param(c, &d, "ddt_bias", x.ddt_bias, r.ddt_bias, r.dg, 0, tol_gate);
        }
    }
    gdn_out_free(&x);
    gdn_out_free(&r);
    gdn_data_free(&d);
}

/* ---- forward, fp32 ---- */

static void fwd_t1_single_head(void)
{
    /* One token, one head, no initial state: o = scale beta (q.k) v, so the
     * whole check is the relative error of one dot product, unbounded when a
     * random q.k nearly cancels (about 1 seed in 200 failed 1e-5). k drawn
     * near q keeps the check about the code path, not the conditioning. */
    gdn_case c = gdn_case_make(1, 1, 1, 1, 64, 64);
    c.k_near_q = 1;
    run_fwd(&c, TOL_F32);
}

static void fwd_t2_b2_gva4(void)
{
    gdn_case c = gdn_case_make(2, 2, 2, 8, 64, 64);
    c.h0 = c.final = 1;
    run_fwd(&c, TOL_F32);
}

static void fwd_t63_l2norm_sigmoid(void)
{
    gdn_case c = gdn_case_make(1, 63, QUICK(4, 2), QUICK(16, 8), 64, 64);
    c.opt.use_qk_l2norm = c.opt.use_beta_sigmoid = 1;
    c.final = 1;
    run_fwd(&c, TOL_F32);
}

static void fwd_t64_k128_h0(void)
{
    gdn_case c = gdn_case_make(2, 64, 1, 1, 128, 128);
    c.h0 = c.final = 1;
    run_fwd(&c, TOL_F32);
}

static void fwd_t65_gate_in_kernel(void)
{
    gdn_case c = gdn_case_make(1, 65, 2, 8, QUICK(128, 64), QUICK(128, 64));
    c.opt.use_qk_l2norm = c.opt.use_gate_in_kernel = c.opt.use_beta_sigmoid = 1;
    c.h0 = c.final = 1;
    run_fwd(&c, TOL_F32);
}

static void fwd_t127_v_first(void)
{
    gdn_case c = gdn_case_make(2, 127, 1, 1, 64, 64);
    c.opt.state_v_first = 1;
    c.h0 = c.final = 1;
    run_fwd(&c, TOL_F32);
}

static void fwd_t129_h16_hv32(void)
{
    gdn_case c = gdn_case_make(1, QUICK(129, 65), QUICK(16, 4), QUICK(32, 8), 64, 64);
    c.opt.use_qk_l2norm = 1;
    c.final = 1;
    run_fwd(&c, TOL_F32);
}

static void fwd_t1000_long(void)
{
    gdn_case c = gdn_case_make(1, QUICK(1000, 200), 2, QUICK(8, 4), 64, 64);
    c.opt.use_qk_l2norm = 1;
    c.gate_mode = GATE_ZERO; /* no decay: the state carries all 1000 tokens */
    c.h0 = c.final = 1;
    run_fwd(&c, TOL_F32);
}

static void fwd_k256(void)
{
    gdn_case c = gdn_case_make(1, QUICK(70, 20), 1, 2, 256, 256);
    c.opt.use_qk_l2norm = 1;
    c.h0 = c.final = 1;
    run_fwd(&c, TOL_F32);
}

static void fwd_odd_head_dims(void)
{
    /* every head dim 1..256 is covered by padding: K != V, neither a multiple of 8 */
    gdn_case c = gdn_case_make(1, 77, 1, 3, 5, 3);
    c.h0 = c.final = 1;
    run_fwd(&c, TOL_F32);
    gdn_case e = gdn_case_make(1, 70, 2, 4, 48, 100);
    e.opt.use_qk_l2norm = 1;
    e.h0 = e.final = 1;
    run_fwd(&e, TOL_F32);
}

static void fwd_varlen_one_token(void)
{
    static const int64_t cu[] = {0, 1};
    gdn_case c = gdn_case_make(1, 1, 2, 8, 64, 64);
    gdn_set_cu(&c, 2, cu);
    c.h0 = c.final = 1;
    run_fwd(&c, TOL_F32);
}

static void fwd_varlen_15(void)
{
    static const int64_t cu[] = {0, 15};
    gdn_case c = gdn_case_make(1, 15, 1, 1, 128, 128);
    gdn_set_cu(&c, 2, cu);
    c.final = 1;
    run_fwd(&c, TOL_F32);
}

static void fwd_varlen_mixed(void)
{
    static const int64_t cu[] = {0, 1, 100, 300, 1200, 2048};
    static const int64_t cuq[] = {0, 1, 100, 300};
    gdn_case c = gdn_case_make(1, QUICK(2048, 300), 1, 2, 64, 64);
    if (check_quick())
        gdn_set_cu(&c, 4, cuq);
    else
        gdn_set_cu(&c, 6, cu);
    c.opt.use_qk_l2norm = c.opt.use_beta_sigmoid = 1;
    c.h0 = c.final = 1;
    run_fwd(&c, TOL_F32);
}

static void fwd_varlen_zero_length(void)
{
    /* sequence 1 is empty: its final state is its initial state */
    static const int64_t cu[] = {0, 64, 64, 128};
    gdn_case c = gdn_case_make(1, 128, 2, 4, 64, 64);
    gdn_set_cu(&c, 4, cu);
    c.h0 = c.final = 1;
    run_fwd(&c, TOL_F32);
}

static void fwd_trailing_rows(void)
{
    static const int64_t cu[] = {0, 211, 985};
    gdn_case c = gdn_case_make(1, 1000, 1, 2, QUICK(64, 32), QUICK(64, 32));
    gdn_set_cu(&c, 3, cu);
    c.final = 1;
    run_fwd(&c, TOL_F32);
}

static void fwd_gate_zero(void)
{
    gdn_case c = gdn_case_make(1, 200, 2, 4, 64, 64);
    c.gate_mode = GATE_ZERO;
    c.opt.use_qk_l2norm = 1;
    c.h0 = c.final = 1;
    run_fwd(&c, TOL_F32);
}

static void fwd_strong_decay(void)
{
    /* g about -20.5 per token: cumulative about -1300 per chunk */
    gdn_case c = gdn_case_make(1, 300, 2, 4, 64, 64);
    c.gate_mode = GATE_STRONG;
    c.h0 = c.final = 1;
    run_fwd(&c, TOL_F32);
}

/* ||k||^2 ~ 64 with beta = 1: the gate-free inverse grows ~63x a token
 * (past fp32 within a chunk), while a decay of e^-20 a token keeps the
 * recurrence bounded. Both directions invert with Gamma inside (the
 * gate-free inverse gave inf here). */
static gdn_case raw_keys_strong_decay(void)
{
    gdn_case c = gdn_case_make(1, 130, 1, 2, 64, 64);
    c.raw_keys = 1;
    c.gate_mode = GATE_STRONG;
    c.beta_mode = BETA_ONE;
    c.h0 = 1;
    return c;
}

static void fwd_raw_keys_strong_decay(void)
{
    gdn_case c = raw_keys_strong_decay();
    c.final = 1;
    run_fwd(&c, TOL_F32);
}

static void fwd_one_neg_inf_gate(void)
{
    gdn_case c = gdn_case_make(2, 150, 1, 2, 64, 64);
    c.gate_mode = GATE_NEGINF;
    c.h0 = c.final = 1;
    run_fwd(&c, TOL_F32);
}

static void fwd_decay_spread(void)
{
    gdn_case c = gdn_case_make(1, 200, QUICK(4, 2), QUICK(16, 8), 64, 64);
    c.gate_mode = GATE_SPREAD;
    c.opt.use_qk_l2norm = 1;
    c.h0 = c.final = 1;
    run_fwd(&c, TOL_F32);
}

static void fwd_beta_zero_one(void)
{
    gdn_case c = gdn_case_make(1, 100, 1, 2, 64, 64);
    c.opt.use_qk_l2norm = 1;
    c.beta_mode = BETA_ZERO;
    c.h0 = c.final = 1;
    run_fwd(&c, TOL_F32);
    c.beta_mode = BETA_ONE;
    run_fwd(&c, TOL_F32);
}

static void fwd_beta_near_two(void)
{
    gdn_case c = gdn_case_make(1, 150, 2, 4, 64, 64);
    c.opt.use_qk_l2norm = c.opt.use_beta_sigmoid = c.opt.allow_neg_eigval = 1;
    c.beta_mode = BETA_NEAR2;
    c.h0 = c.final = 1;
    run_fwd(&c, TOL_F32);
    c.beta_mode = BETA_RANDOM;
    c.opt.state_v_first = 1;
    run_fwd(&c, TOL_F32);
}

static void fwd_custom_scale(void)
{
    gdn_case c = gdn_case_make(1, 90, 1, 2, 64, 32);
    c.opt.scale = 0.37;
    c.h0 = c.final = 1;
    run_fwd(&c, TOL_F32);
}

/* ---- forward, 16-bit storage ---- */

static void fwd_bf16_default_heads(void)
{
    gdn_case c = gdn_case_make(1, QUICK(129, 65), QUICK(16, 2), QUICK(32, 4), 128, 128);
    c.io = FQLA_DTYPE_BF16;
    c.opt.use_qk_l2norm = c.opt.use_gate_in_kernel = c.opt.use_beta_sigmoid = 1;
    c.final = 1;
    run_fwd(&c, 5e-3);
}

static void fwd_bf16_gates_and_state(void)
{
    gdn_case c = gdn_case_make(2, 100, 1, 2, 64, 64);
    c.io = c.gate = c.state = FQLA_DTYPE_BF16;
    c.opt.use_qk_l2norm = 1;
    c.h0 = c.final = 1;
    run_fwd(&c, 5e-3);
}

static void fwd_f16(void)
{
    gdn_case c = gdn_case_make(1, 80, 2, 4, 64, 64);
    c.io = FQLA_DTYPE_F16;
    c.opt.use_qk_l2norm = 1;
    c.h0 = c.final = 1;
    run_fwd(&c, 5e-3);
}

/* ---- backward ---- */

static void bwd_all_options(void)
{
    gdn_case c = gdn_case_make(1, 65, 2, 8, 64, 64);
    c.opt.use_qk_l2norm = c.opt.use_gate_in_kernel = c.opt.use_beta_sigmoid = 1;
    c.h0 = c.dht = 1;
    run_bwd(&c, TOL_F32, TOL_F32_GATE);
}

static void bwd_plain_k128(void)
{
    gdn_case c = gdn_case_make(2, QUICK(200, 70), 1, 1, 128, 128);
    run_bwd(&c, TOL_F32, TOL_F32_GATE);
}

static void bwd_varlen_trailing(void)
{
    /* the first sequence has two tokens, not one: a one-token sequence's
     * dbeta and dg per head are single dot products of random vectors, whose
     * fp32 relative error is unbounded when they nearly cancel (about 1 seed
     * in 200 failed 1e-4); the one-token forward is fwd_varlen_one_token */
    static const int64_t cu[] = {0, 2, 15, 15, 140, 300};
    gdn_case c = gdn_case_make(1, 320, 1, 2, 64, 64);
    gdn_set_cu(&c, 6, cu);
    c.opt.use_qk_l2norm = c.opt.use_beta_sigmoid = 1;
    c.h0 = c.dht = 1;
    run_bwd(&c, TOL_F32, TOL_F32_GATE);
}

static void bwd_raw_keys_strong_decay(void)
{
    /* dg then comes through L's Gamma (chunked_bwd.c) */
    gdn_case c = raw_keys_strong_decay();
    c.dht = 1;
    run_bwd(&c, TOL_F32, TOL_F32_GATE);
}

static void bwd_strong_decay(void)
{
    /* the true dg is about e^-20 here: it must keep its relative accuracy */
    gdn_case c = gdn_case_make(1, 150, 1, 2, 64, 64);
    c.gate_mode = GATE_STRONG;
    c.h0 = c.dht = 1;
    run_bwd(&c, TOL_F32, TOL_F32_GATE);
}

static void bwd_decay_spread_gva(void)
{
    gdn_case c = gdn_case_make(1, 130, QUICK(4, 2), QUICK(16, 8), 64, 64);
    c.gate_mode = GATE_SPREAD;
    c.opt.use_qk_l2norm = 1;
    c.h0 = c.dht = 1;
    run_bwd(&c, TOL_F32, TOL_F32_GATE);
}

static void bwd_neg_inf_gate_and_zero_gate(void)
{
    gdn_case c = gdn_case_make(1, 140, 1, 2, 32, 32);
    c.gate_mode = GATE_NEGINF;
    c.h0 = c.dht = 1;
    run_bwd(&c, TOL_F32, TOL_F32_GATE);
    c.gate_mode = GATE_ZERO;
    run_bwd(&c, TOL_F32, TOL_F32_GATE);
}

static void bwd_v_first_near_two(void)
{
    gdn_case c = gdn_case_make(1, 100, 2, 4, 64, 64);
    c.opt.use_qk_l2norm = c.opt.use_beta_sigmoid = c.opt.allow_neg_eigval = 1;
    c.opt.state_v_first = 1;
    c.beta_mode = BETA_NEAR2;
    c.h0 = c.dht = 1;
    run_bwd(&c, TOL_F32, TOL_F32_GATE);
}

static void bwd_h16_hv32(void)
{
    gdn_case c = gdn_case_make(1, QUICK(64, 20), QUICK(16, 2), QUICK(32, 4), 64, 64);
    c.opt.use_qk_l2norm = c.opt.use_gate_in_kernel = c.opt.use_beta_sigmoid = 1;
    c.h0 = c.dht = 1;
    run_bwd(&c, TOL_F32, TOL_F32_GATE);
}

static void bwd_k256_and_odd(void)
{
    gdn_case c = gdn_case_make(1, QUICK(70, 10), 1, 1, 256, 256);
    c.opt.use_qk_l2norm = 1;
    c.h0 = c.dht = 1;
    run_bwd(&c, TOL_F32, TOL_F32_GATE);
    gdn_case e = gdn_case_make(2, 67, 1, 2, 7, 13);
    e.h0 = 1;
    run_bwd(&e, TOL_F32, TOL_F32_GATE);
}

static void bwd_bf16(void)
{
    gdn_case c = gdn_case_make(1, 100, 2, 4, 128, 128);
    c.io = FQLA_DTYPE_BF16;
    c.opt.use_qk_l2norm = c.opt.use_gate_in_kernel = c.opt.use_beta_sigmoid = 1;
    c.dht = 1;
    run_bwd(&c, 8e-3, 2e-2);
}

/* ---- what the backend rejects ---- */

static void rejects_unsupported(void)
{
    /* head dims beyond 256 and F64 storage: NOT_SUPPORTED, named */
    static const struct { int64_t K, V; fqla_dtype io, st; const char *needle; } bad[] = {
        {257, 64, FQLA_DTYPE_F32, FQLA_DTYPE_F32, "K = 257"},
        {64, 300, FQLA_DTYPE_F32, FQLA_DTYPE_F32, "V = 300"},
        {64, 64, FQLA_DTYPE_F64, FQLA_DTYPE_F32, "FQLA_BACKEND_CPU_REFERENCE"},
        {64, 64, FQLA_DTYPE_F32, FQLA_DTYPE_F64, "f64"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        gdn_case c = gdn_case_make(1, 4, 1, 1, bad[i].K, bad[i].V);
        c.io = bad[i].io;
        c.state = bad[i].st;
        c.h0 = 1;
        gdn_data d = gdn_data_make(&c);
        gdn_tensors t = gdn_tensors_make(&c, &d, 0);
        fqla_fwd_args a;
        gdn_fwd_inputs(&c, &t, &a);
        tbuf o = tb_make(c.io, d.nv, NULL);
        a.o = tu_tensor(&o, 4, c.B, c.T, c.HV, c.V, 0);
        fqla_status st = fqla_fwd_supported(cpu, &a);
        CHECK(st == FQLA_STATUS_NOT_SUPPORTED, "case %zu: supported() gave %s", i, fqla_status_string(st));
        CHECK(strstr(fqla_last_error(cpu), bad[i].needle) != NULL, "case %zu: message '%s' lacks '%s'", i,
              fqla_last_error(cpu), bad[i].needle);
        if (i < 2)
            CHECK(strstr(fqla_last_error(cpu), "1..256") != NULL, "case %zu: message '%s' lacks the supported range",
                  i, fqla_last_error(cpu));
        st = fqla_fwd(cpu, &a, NULL, 0, NULL);
        CHECK(st == FQLA_STATUS_NOT_SUPPORTED, "case %zu: fwd gave %s", i, fqla_status_string(st));
        int untouched = 1;
        for (int64_t j = 0; j < d.nv; j++)
            untouched &= isnan(tb_get(&o, j));
        CHECK(untouched, "case %zu: a rejected call wrote o", i);
        tb_free(&o);
        gdn_tensors_free(&t);
        gdn_data_free(&d);
    }
}

/* bf16 by definition, for the row I/O check below (not the library's bit
 * trick): the value of a bit pattern in fp64, where exponent 255 reads as
 * 2^128, the first value past the largest finite bf16. */
static double bf16_value(uint16_t h)
{
    int e = (h >> 7) & 0xff, m = h & 0x7f;
    double mag = e == 0 ? ldexp(m, -133) : e == 255 ? ldexp(1.0, 128) : ldexp(128 + m, e - 134);
    return (h & 0x8000) ? -mag : mag;
}

/* The bf16 nearest to x, ties to the even pattern, chosen by comparing the
 * two candidates' distances in fp64; a NaN stays a quiet NaN with its sign
 * and top payload bits. */
static uint16_t bf16_nearest(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if (isnan(x))
        return (uint16_t)((u >> 16) | 0x40u);
    uint16_t lo = (uint16_t)(u >> 16), hi = (uint16_t)(lo + 1); /* toward zero; next away from it */
    if ((u & 0xffffu) == 0)
        return lo; /* exact: zeros and infinities too */
    double a = fabs((double)x), dlo = a - fabs(bf16_value(lo)), dhi = fabs(bf16_value(hi)) - a;
    if (dlo != dhi)
        return dlo < dhi ? lo : hi;
    return (lo & 1u) ? hi : lo;
}

/* The CPU backends widen and round bf16 rows with the inline conversions of
 * internal.h (fqla_load_row_f32 / fqla_store_row_f32); both must be bit for
 * bit the definitions above (every bf16 pattern; fp32 patterns at random
 * plus ties, NaNs, infinities, zeros, subnormals and the overflow edge). */
static void bf16_row_io_exact(void)
{
    enum { NB = 65536, NF = 1 << 18 };
    uint16_t *h = malloc(NB * sizeof *h);
    float *x = malloc(NF * sizeof *x), *fa = malloc(NB * sizeof *fa), *fb = malloc(NB * sizeof *fb);
    uint16_t *ha = malloc(NF * sizeof *ha), *hb = malloc(NF * sizeof *hb);
    for (int i = 0; i < NB; i++)
        h[i] = (uint16_t)i;
    int64_t shape1[1] = {NB}, shape2[1] = {NF};
    fqla_tensor th = fqla_tensor_contiguous(h, FQLA_DTYPE_BF16, 1, shape1);
    fqla_load_row_f32(&th, 0, NB, fa);
    for (int i = 0; i < NB; i++) {
        uint32_t u = (uint32_t)h[i] << 16; /* infinities and NaNs keep their bits */
        if (((h[i] >> 7) & 0xff) != 0xff)
            fb[i] = (float)bf16_value(h[i]);
        else
            memcpy(&fb[i], &u, sizeof u);
    }
    CHECK(memcmp(fa, fb, NB * sizeof *fa) == 0, "bf16 -> f32 widening differs from the definition");

    static const uint32_t special[] = {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u,
                                       0x7f800001u, 0xffc12345u, 0x3f808000u, 0x3f818000u, 0x3f80ffffu,
                                       0x7f7fffffu, 0x7f7f8000u, 0x00008000u, 0x00018000u, 0x807fffffu};
    uint64_t r = check_seed() | 1;
    for (int i = 0; i < NF; i++) {
        uint32_t u;
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        u = (uint32_t)(r >> 16);
        if (i % 4 == 1)
            u = (u & 0xffff0000u) | 0x8000u; /* exact ties */
        if (i < (int)(sizeof special / sizeof special[0]))
            u = special[i];
        memcpy(&x[i], &u, sizeof u);
    }
    fqla_tensor ta = fqla_tensor_contiguous(ha, FQLA_DTYPE_BF16, 1, shape2);
    fqla_store_row_f32(&ta, 0, NF, x);
    int64_t bad = 0;
    for (int i = 0; i < NF; i++) {
        hb[i] = bf16_nearest(x[i]);
        bad += ha[i] != hb[i];
    }
    CHECK(bad == 0, "f32 -> bf16 rounding differs from the definition in %lld of %d values", (long long)bad, (int)NF);
    free(h); free(x); free(fa); free(fb); free(ha); free(hb);
}

/* ---- both matrix-kernel paths (src/cpu/cpu_isa.h) ---- */

#include "cpu/cpu_isa.h"

#if defined(__aarch64__)
#define SIMD_NAME "NEON"
#else
#define SIMD_NAME "AVX2"
#endif

/* Forward and backward on the baseline (SSE) and on the AVX2 + FMA kernels
 * (aarch64: portable C and NEON), each against the reference; head dims 72 and 40 leave an 8-column panel
 * after the 16-column ones. On the AVX2 path, 1 and 2 threads must agree
 * bit for bit. The path in use before the test is restored after it. */
static void isa_paths_fwd_bwd(void)
{
    /* on aarch64 the second path is NEON (the same level, cpu_isa.h) */
    int before = fqla_cpu_isa(), paths[2] = {FQLA_CPU_ISA_BASE, FQLA_CPU_ISA_AVX2};
#if defined(__aarch64__)
    CHECK(fqla_cpu_isa_available() == FQLA_CPU_ISA_NEON, "aarch64 build without its NEON path");
#else
    if (fqla_cpu_isa_available() < FQLA_CPU_ISA_AVX2)
        check_skip("isa_paths_fwd_bwd AVX2", "no AVX2 + FMA kernels on this build or CPU: baseline path only");
#endif
    for (int pi = 0; pi < 2; pi++) {
        if (fqla_cpu_isa_force(paths[pi]) != paths[pi])
            continue;
        gdn_case c = gdn_case_make(2, QUICK(130, 40), 1, 2, 72, 40);
        c.opt.use_qk_l2norm = c.opt.use_gate_in_kernel = c.opt.use_beta_sigmoid = 1;
        c.h0 = c.dht = c.final = 1;
        run_fwd(&c, TOL_F32);
        run_bwd(&c, TOL_F32, TOL_F32_GATE);
        gdn_case b = gdn_case_make(1, QUICK(200, 64), 2, 4, 128, 128);
        b.io = FQLA_DTYPE_BF16;
        b.opt.use_qk_l2norm = 1;
        b.h0 = 1;
        run_fwd(&b, 5e-3);
        run_bwd(&b, 8e-3, 2e-2);
        if (paths[pi] == FQLA_CPU_ISA_AVX2) {
            fqla_context *one = tu_context(FQLA_BACKEND_CPU, 1);
            gdn_data d = gdn_data_make(&c);
            gdn_out x1 = gdn_run_bwd(one, &c, &d, 0), x2 = gdn_run_bwd(cpu, &c, &d, 0);
            CHECK(x1.status == FQLA_STATUS_SUCCESS && x2.status == FQLA_STATUS_SUCCESS, "%s backward failed", SIMD_NAME);
            if (x1.status == FQLA_STATUS_SUCCESS && x2.status == FQLA_STATUS_SUCCESS) {
                CHECK(memcmp(x1.dq, x2.dq, (size_t)d.nq * sizeof *x1.dq) == 0, "%s dq: 1 and 2 threads differ", SIMD_NAME);
                CHECK(memcmp(x1.dv, x2.dv, (size_t)d.nv * sizeof *x1.dv) == 0, "%s dv: 1 and 2 threads differ", SIMD_NAME);
            }
            gdn_out_free(&x1);
            gdn_out_free(&x2);
            gdn_data_free(&d);
            fqla_context_destroy(one);
        }
    }
    fqla_cpu_isa_force(before);
}

int main(void)
{
    check_rng_seed(check_seed());
    cpu = tu_context(FQLA_BACKEND_CPU, 2);
    ref = tu_context(FQLA_BACKEND_CPU_REFERENCE, 2);
    if (!cpu || !ref)
        return check_summary();

    CHECK_RUN(fwd_t1_single_head);
    CHECK_RUN(fwd_t2_b2_gva4);
    CHECK_RUN(fwd_t63_l2norm_sigmoid);
    CHECK_RUN(fwd_t64_k128_h0);
    CHECK_RUN(fwd_t65_gate_in_kernel);
    CHECK_RUN(fwd_t127_v_first);
    CHECK_RUN(fwd_t129_h16_hv32);
    CHECK_RUN(fwd_t1000_long);
    CHECK_RUN(fwd_k256);
    CHECK_RUN(fwd_odd_head_dims);
    CHECK_RUN(fwd_varlen_one_token);
    CHECK_RUN(fwd_varlen_15);
    CHECK_RUN(fwd_varlen_mixed);
    CHECK_RUN(fwd_varlen_zero_length);
    CHECK_RUN(fwd_trailing_rows);
    CHECK_RUN(fwd_gate_zero);
    CHECK_RUN(fwd_strong_decay);
    CHECK_RUN(fwd_raw_keys_strong_decay);
    CHECK_RUN(fwd_one_neg_inf_gate);
    CHECK_RUN(fwd_decay_spread);
    CHECK_RUN(fwd_beta_zero_one);
    CHECK_RUN(fwd_beta_near_two);
    CHECK_RUN(fwd_custom_scale);
    CHECK_RUN(fwd_bf16_default_heads);
    CHECK_RUN(fwd_bf16_gates_and_state);
    CHECK_RUN(fwd_f16);
    CHECK_RUN(bwd_all_options);
    CHECK_RUN(bwd_plain_k128);
    CHECK_RUN(bwd_varlen_trailing);
    CHECK_RUN(bwd_strong_decay);
    CHECK_RUN(bwd_raw_keys_strong_decay);
    CHECK_RUN(bwd_decay_spread_gva);
    CHECK_RUN(bwd_neg_inf_gate_and_zero_gate);
    CHECK_RUN(bwd_v_first_near_two);
    CHECK_RUN(bwd_h16_hv32);
    CHECK_RUN(bwd_k256_and_odd);
    CHECK_RUN(bwd_bf16);
    CHECK_RUN(rejects_unsupported);
    CHECK_RUN(bf16_row_io_exact);
    CHECK_RUN(isa_paths_fwd_bwd);

    fqla_context_destroy(cpu);
    fqla_context_destroy(ref);
    return check_summary();
}
