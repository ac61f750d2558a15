/*
 * test_determinism.c - the fast CPU backend gives bit-identical results run
 * to run and whatever the thread count (1, 2, 3 workers): forward (which
 * splits GVA groups into work items differently for different thread
 * counts), backward (dq, dk summed over the group, dA_log / ddt_bias summed
 * over sequences) and decode. Nothing here needs the reference: the oracle
 * is the first run.
 */
#include "cpu_fast_util.h"

#include <stdio.h>
#include <string.h>

#define QUICK(full, quick) (check_quick() ? (quick) : (full))

/* Bitwise equality of two double arrays (NaN == NaN when the bits agree). */
static int64_t bits_differ(const double *x, const double *y, int64_t n)
{
    int64_t d = 0;
    if (!x || !y)
        return (x != y) ? 1 : 0;
    for (int64_t i = 0; i < n; i++)
        d += memcmp(&x[i], &y[i], sizeof(double)) != 0;
    return d;
}

static const int thread_counts[] = {2, 1, 3, 2};

static gdn_case varlen_case(void)
{
    /* uneven sequences (one empty), a GVA group of 4, every option */
    static const int64_t cu[] = {0, 5, 200, 200, 333, 350};
    gdn_case c = gdn_case_make(1, 360, 1, 4, QUICK(64, 32), QUICK(64, 32));
    gdn_set_cu(&c, 6, cu);
    c.opt.use_qk_l2norm = c.opt.use_gate_in_kernel = c.opt.use_beta_sigmoid = 1;
    c.h0 = c.final = c.dht = 1;
    return c;
}

static void fwd_bit_identical(void)
{
    gdn_case c = varlen_case();
    gdn_data d = gdn_data_make(&c);
    gdn_out first;
    memset(&first, 0, sizeof first);
    for (size_t i = 0; i < sizeof thread_counts / sizeof thread_counts[0]; i++) {
        fqla_context *ctx = tu_context(FQLA_BACKEND_CPU, thread_counts[i]);
        if (!ctx)
            break;
        gdn_out x = gdn_run_fwd(ctx, &c, &d, 0);
        CHECK(x.status == FQLA_STATUS_SUCCESS, "forward (%d threads): %s", thread_counts[i], fqla_last_error(ctx));
        if (i == 0) {
            first = x;
        } else {
            int64_t o = bits_differ(x.o, first.o, d.nv), s = bits_differ(x.fs, first.fs, d.ns);
            CHECK(o == 0 && s == 0, "run %zu (%d threads): %lld o and %lld state values differ from run 0 (2 threads)",
                  i, thread_counts[i], (long long)o, (long long)s);
            gdn_out_free(&x);
        }
        fqla_context_destroy(ctx);
    }
    gdn_out_free(&first);
    gdn_data_free(&d);
}

static void bwd_bit_identical(void)
{
    gdn_case c = varlen_case();
    gdn_data d = gdn_data_make(&c);
    gdn_out first;
    memset(&first, 0, sizeof first);
    for (size_t i = 0; i < sizeof thread_counts / sizeof thread_counts[0]; i++) {
        fqla_context *ctx = tu_context(FQLA_BACKEND_CPU, thread_counts[i]);
        if (!ctx)
            break;
        gdn_out x = gdn_run_bwd(ctx, &c, &d, 0);
        CHECK(x.status == FQLA_STATUS_SUCCESS, "backward (%d threads): %s", thread_counts[i], fqla_last_error(ctx));
        if (i == 0) {
            first = x;
        } else {
            int64_t n = bits_differ(x.dq, first.dq, d.nq) + bits_differ(x.dk, first.dk, d.nq) +
                        bits_differ(x.dv, first.dv, d.nv) + bits_differ(x.dg, first.dg, d.ng) +
                        bits_differ(x.dbeta, first.dbeta, d.ng) + bits_differ(x.dh0, first.dh0, d.ns) +
                        bits_differ(x.dA_log, first.dA_log, c.HV) + bits_differ(x.ddt_bias, first.ddt_bias, c.HV);
            CHECK(n == 0, "run %zu (%d threads): %lld gradient values differ from run 0 (2 threads)", i,
                  thread_counts[i], (long long)n);
            gdn_out_free(&x);
        }
        fqla_context_destroy(ctx);
    }
    gdn_out_free(&first);
    gdn_data_free(&d);
}

static void bwd_many_heads_bit_identical(void)
{
    /* many (sequence, q/k head) items and a batch: the per-item reduction of
     * dA_log / ddt_bias over sequences must not depend on scheduling */
    gdn_case c = gdn_case_make(3, QUICK(130, 40), 4, 8, 32, 32);
    c.opt.use_gate_in_kernel = c.opt.use_beta_sigmoid = 1;
    c.h0 = c.dht = 1;
    gdn_data d = gdn_data_make(&c);
    fqla_context *c1 = tu_context(FQLA_BACKEND_CPU, 1), *c2 = tu_context(FQLA_BACKEND_CPU, 2);
    if (c1 && c2) {
        gdn_out x = gdn_run_bwd(c1, &c, &d, 0), y = gdn_run_bwd(c2, &c, &d, 0);
        CHECK(x.status == FQLA_STATUS_SUCCESS && y.status == FQLA_STATUS_SUCCESS, "backward failed");
        int64_t n = bits_differ(x.dq, y.dq, d.nq) + bits_differ(x.dk, y.dk, d.nq) + bits_differ(x.dv, y.dv, d.nv) +
                    bits_differ(x.dg, y.dg, d.ng) + bits_differ(x.dA_log, y.dA_log, c.HV) +
                    bits_differ(x.ddt_bias, y.ddt_bias, c.HV) + bits_differ(x.dh0, y.dh0, d.ns);
        CHECK(n == 0, "1 vs 2 threads: %lld gradient values differ", (long long)n);
        gdn_out_free(&x);
        gdn_out_free(&y);
    }
    fqla_context_destroy(c1);
    fqla_context_destroy(c2);
    gdn_data_free(&d);
}

/* One decode step on a fresh copy of pool0; returns o and the pool after. */
static void decode_once(fqla_context *ctx, const gdn_case *c, const gdn_data *d, const tbuf *pool0, double **o,
                        double **pool_after)
{
    gdn_tensors t = gdn_tensors_make(c, d, 0);
    tbuf pl = tb_make(FQLA_DTYPE_F32, pool0->n, NULL);
    memcpy(pl.data, pool0->data, (size_t)pool0->n * sizeof(float));
    double sl[4] = {2, 0, -1, 3};
    tbuf slots = tb_make(FQLA_DTYPE_I64, c->B, sl);
    tbuf ob = tb_make(c->io, d->nv, NULL);
    fqla_decode_args a;
    fqla_decode_args_init(&a);
    a.q = tu_tensor(&t.q, 4, c->B, 1, c->H, c->K, 0);
    a.k = tu_tensor(&t.k, 4, c->B, 1, c->H, c->K, 0);
    a.v = tu_tensor(&t.v, 4, c->B, 1, c->HV, c->V, 0);
    a.g = tu_tensor(&t.g, 3, c->B, 1, c->HV, 0, 0);
    a.beta = tu_tensor(&t.beta, 3, c->B, 1, c->HV, 0, 0);
    a.A_log = tu_tensor(&t.A_log, 1, c->HV, 0, 0, 0, 0);
    a.dt_bias = tu_tensor(&t.dt_bias, 1, c->HV, 0, 0, 0, 0);
    a.state_pool = tu_tensor(&pl, 4, 4, c->HV, c->K, c->V, 0);
    a.slots = tu_tensor(&slots, 1, c->B, 0, 0, 0, 0);
    a.o = tu_tensor(&ob, 4, c->B, 1, c->HV, c->V, 0);
    a.opt = c->opt;
    fqla_status st = fqla_decode(ctx, &a, NULL, 0, NULL);
    CHECK(st == FQLA_STATUS_SUCCESS, "decode: %s", fqla_last_error(ctx));
    *o = tb_to_doubles(&ob);
    *pool_after = tb_to_doubles(&pl);
    tb_free(&pl);
    tb_free(&slots);
    tb_free(&ob);
    gdn_tensors_free(&t);
}

static void decode_bit_identical(void)
{
    gdn_case c = gdn_case_make(4, 1, 2, 8, 64, 64);
    c.opt.use_qk_l2norm = c.opt.use_gate_in_kernel = c.opt.use_beta_sigmoid = 1;
    gdn_data d = gdn_data_make(&c);
    int64_t n = 4 * c.HV * c.K * c.V;
    tbuf pool0 = tb_make(FQLA_DTYPE_F32, n, NULL);
    for (int64_t i = 0; i < n; i++)
        tb_put(&pool0, i, 0.3 * check_normal());
    double *o0 = NULL, *p0 = NULL;
    for (size_t i = 0; i < sizeof thread_counts / sizeof thread_counts[0]; i++) {
        fqla_context *ctx = tu_context(FQLA_BACKEND_CPU, thread_counts[i]);
        if (!ctx)
            break;
        double *o, *p;
        decode_once(ctx, &c, &d, &pool0, &o, &p);
        if (i == 0) {
            o0 = o;
            p0 = p;
        } else {
            int64_t a = bits_differ(o, o0, d.nv), b = bits_differ(p, p0, n);
            CHECK(a == 0 && b == 0, "run %zu (%d threads): %lld o and %lld pool values differ", i, thread_counts[i],
                  (long long)a, (long long)b);
            free(o);
            free(p);
        }
        fqla_context_destroy(ctx);
    }
    free(o0);
    free(p0);
    tb_free(&pool0);
    gdn_data_free(&d);
}

int main(void)
{
    check_rng_seed(check_seed());
    CHECK_RUN(fwd_bit_identical);
    CHECK_RUN(bwd_bit_identical);
    CHECK_RUN(bwd_many_heads_bit_identical);
    CHECK_RUN(decode_bit_identical);
    return check_summary();
}
