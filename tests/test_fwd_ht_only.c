/*
 * test_fwd_ht_only.c - the forward of the final state alone (fqla_fwd with o
 * absent and final_state given) on both CPU backends: its final_state must
 * equal the full forward's, bit for bit, on the same context and inputs, and
 * the call must write all of final_state and leave every input as it was.
 * With the identity as the initial state and zero values the final state is
 * the transition M of the tokens (docs/distributed.md): checked against the
 * token recurrence's product of exp(g) (I - beta k k^T) factors computed
 * here in fp64. The argument rule of the mode: o absent without final_state
 * is refused naming o. (The CUDA backend refuses the mode by name:
 * python/tests/test_fwd_final_only.py checks that on a GPU.)
 */
#include "cpu_fast_util.h"

#include <math.h>
#include <stdio.h>

static fqla_context *cpu, *ref;

/* The forward of c on ctx (ref: F64 tensors), full or final state alone;
 * returns final_state as doubles (caller frees), NULL on failure. */
static double *run_ht(fqla_context *ctx, const gdn_case *c, const gdn_data *d, int is_ref, int alone,
                      const char *label)
{
    fqla_fwd_args a;
    int64_t N = gdn_N(c);
    gdn_tensors t = gdn_tensors_make(c, d, is_ref);
    gdn_fwd_inputs(c, &t, &a);
    tbuf o = tb_make(is_ref ? FQLA_DTYPE_F64 : c->io, d->nv, NULL);
    tbuf fs = tb_make(is_ref ? FQLA_DTYPE_F64 : c->state, d->ns, NULL);
    if (!alone) a.o = tu_tensor(&o, 4, c->B, c->T, c->HV, c->V, 0);
    a.final_state = c->opt.state_v_first ? tu_tensor(&fs, 4, N, c->HV, c->V, c->K, 0)
                                         : tu_tensor(&fs, 4, N, c->HV, c->K, c->V, 0);
    /* poison (all-ones bytes: NaN in every state dtype): every element must be written */
    if (fs.data) memset(fs.data, 0xFF, (size_t)fs.n * tu_size(fs.dtype));
    double *qb = tb_to_doubles(&t.q), *vb = tb_to_doubles(&t.v), *gb = tb_to_doubles(&t.g);
    fqla_status st = fqla_fwd(ctx, &a, NULL, 0, NULL);
    CHECK(st == FQLA_STATUS_SUCCESS, "%s: %s: %s", label, fqla_status_string(st), fqla_last_error(ctx));
    double *out = NULL;
    if (st == FQLA_STATUS_SUCCESS) {
        double *qa = tb_to_doubles(&t.q), *va = tb_to_doubles(&t.v), *ga = tb_to_doubles(&t.g);
        int same = qa && va && ga && qb && vb && gb;
        for (int64_t i = 0; same && i < d->nq; i++) same = qa[i] == qb[i];
        for (int64_t i = 0; same && i < d->nv; i++) same = va[i] == vb[i];
        for (int64_t i = 0; same && i < d->ng; i++) same = ga[i] == gb[i];
        CHECK(same, "%s: an input changed", label);
        free(qa); free(va); free(ga);
        out = tb_to_doubles(&fs);
        int64_t nan = 0;
        for (int64_t i = 0; out && i < d->ns; i++) nan += !isfinite(out[i]);
        CHECK(nan == 0, "%s: %lld elements of final_state not written (or not finite)", label, (long long)nan);
    }
    free(qb); free(vb); free(gb);
    tb_free(&o);
    tb_free(&fs);
    gdn_tensors_free(&t);
    return out;
}

/* Full and alone on both CPU backends; the final states must agree exactly. */
static void same_ht(const gdn_case *c, const char *name)
{
    gdn_data d = gdn_data_make(c);
    for (int is_ref = 0; is_ref < 2; is_ref++) {
        fqla_context *ctx = is_ref ? ref : cpu;
        char lf[128], la[128];
        snprintf(lf, sizeof lf, "%s, %s, full forward", name, is_ref ? "reference" : "CPU");
        snprintf(la, sizeof la, "%s, %s, final state alone", name, is_ref ? "reference" : "CPU");
        double *full = run_ht(ctx, c, &d, is_ref, 0, lf);
        double *alone = run_ht(ctx, c, &d, is_ref, 1, la);
        if (full && alone) {
            int64_t first = 0;
            while (first < d.ns && full[first] == alone[first])
                first++;
            CHECK(first == d.ns, "%s: differs from the full forward's at element %lld (%.17g vs %.17g)", la,
                  (long long)first, first < d.ns ? alone[first] : 0.0, first < d.ns ? full[first] : 0.0);
        }
        free(full);
        free(alone);
    }
    gdn_data_free(&d);
}

static void varlen_empty_sequence_and_trailing_rows(void)
{
    static const int64_t cu[] = {0, 70, 70, 200};
    gdn_case c = gdn_case_make(1, 210, 1, 2, 32, 32);
    gdn_set_cu(&c, 4, cu);
    c.opt.use_qk_l2norm = 1;
    c.h0 = 1;
    same_ht(&c, "varlen with h0");
    c.h0 = 0;
    same_ht(&c, "varlen without h0");
}

static void gva_every_in_kernel_option(void)
{
    gdn_case c = gdn_case_make(2, 130, 2, 8, 32, 32);
    c.opt.use_qk_l2norm = c.opt.use_gate_in_kernel = c.opt.use_beta_sigmoid = c.opt.allow_neg_eigval = 1;
    c.h0 = 1;
    same_ht(&c, "GVA 4, every option");
}

static void v_first_odd_dims_bf16(void)
{
    gdn_case c = gdn_case_make(1, 65, 1, 2, 16, 24);
    c.io = FQLA_DTYPE_BF16;
    c.state = FQLA_DTYPE_BF16;
    c.opt.state_v_first = 1;
    c.h0 = 1;
    same_ht(&c, "state_v_first, K = 16, V = 24, bf16");
}

/* Zero values from the identity: the final state is M = prod_t exp(g_t)
 * (I - beta_t k_t k_t^T), later tokens on the left; checked on the
 * reference backend against that product in fp64. */
static void identity_start_gives_the_transition(void)
{
    const int64_t T = 40, K = 8;
    gdn_case c = gdn_case_make(1, T, 1, 1, K, K);
    c.h0 = 1;
    gdn_data d = gdn_data_make(&c);
    for (int64_t i = 0; i < d.nv; i++) d.v[i] = 0.0;
    for (int64_t i = 0; i < K * K; i++) d.h0[i] = (i / K == i % K) ? 1.0 : 0.0;
    double *M = run_ht(ref, &c, &d, 1, 1, "identity start, zero values");
    double P[64], R[64];
    for (int64_t i = 0; i < K * K; i++) P[i] = (i / K == i % K) ? 1.0 : 0.0;
    for (int64_t t = 0; t < T; t++) { /* P <- exp(g) (I - beta k k^T) P */
        const double *k = d.k + t * K, g = exp(d.g[t]), b = d.beta[t];
        for (int64_t i = 0; i < K; i++)
            for (int64_t j = 0; j < K; j++) {
                double s = 0.0;
                for (int64_t l = 0; l < K; l++) s += ((i == l) - b * k[i] * k[l]) * P[l * K + j];
                R[i * K + j] = g * s;
            }
        for (int64_t i = 0; i < K * K; i++) P[i] = R[i];
    }
    /* with zero values the recurrence is S <- exp(g) (I - beta k k^T) S (S
     * is [K][V], keys as rows), so from S = I the final state is P */
    double err = 0.0, norm = 0.0;
    for (int64_t i = 0; M && i < K * K; i++) {
        err = fmax(err, fabs(M[i] - P[i]));
        norm = fmax(norm, fabs(P[i]));
    }
    CHECK(M && err <= 1e-12 * (norm > 1.0 ? norm : 1.0), "identity start: max |final_state - M| = %.3g", err);
    free(M);
    gdn_data_free(&d);
}

static void argument_rules(void)
{
    gdn_case c = gdn_case_make(1, 20, 1, 1, 16, 16);
    gdn_data d = gdn_data_make(&c);
    gdn_tensors t = gdn_tensors_make(&c, &d, 0);
    fqla_fwd_args a;
    gdn_fwd_inputs(&c, &t, &a);
    fqla_status st = fqla_fwd(cpu, &a, NULL, 0, NULL); /* no o, no final_state */
    CHECK(st == FQLA_STATUS_INVALID_VALUE && strncmp(fqla_last_error(cpu), "o:", 2) == 0,
          "o and final_state absent: %s: %s", fqla_status_string(st), fqla_last_error(cpu));
    gdn_tensors_free(&t);
    gdn_data_free(&d);
}

int main(void)
{
    check_rng_seed(check_seed());
    cpu = tu_context(FQLA_BACKEND_CPU, 2);
    ref = tu_context(FQLA_BACKEND_CPU_REFERENCE, 2);
    if (cpu && ref) {
        CHECK_RUN(varlen_empty_sequence_and_trailing_rows);
        CHECK_RUN(gva_every_in_kernel_option);
        CHECK_RUN(v_first_odd_dims_bf16);
        CHECK_RUN(identity_start_gives_the_transition);
        CHECK_RUN(argument_rules);
    }
    fqla_context_destroy(cpu);
    fqla_context_destroy(ref);
    return check_summary();
}
