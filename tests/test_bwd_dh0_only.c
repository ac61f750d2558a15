/*
 * test_bwd_dh0_only.c - the backward of d_initial_state alone (fqla_bwd with
 * dq, dk, dv, dg, dbeta, dA_log and ddt_bias all absent) on both CPU
 * backends: its d_initial_state must equal the full backward's, bit for bit,
 * on the same context and inputs. d_initial_state sits between guard bands,
 * everything poisoned before the call: the call must write all of it and
 * nothing around it, and leave every input as it was. An empty sequence's
 * d_initial_state is its d_final_state, exactly.
 *
 * Shapes: varlen with an empty sequence and rows after the last one, GVA
 * with every in-kernel option, state_v_first with K != V and bf16 q/k/v,
 * and T = 0. (The argument rules of the mode are test_validation.c's; the
 * CUDA backend's case is in test_gpu_bwd.c.)
 */
#include "cpu_fast_util.h"

#include <stdio.h>

#define GUARD 37          /* elements of poison before and after d_initial_state */
#define POISON_BYTE 0xA5

static fqla_context *cpu, *ref;

/* A poisoned buffer of n elements of dtype between guard bands. */
typedef struct guarded {
    unsigned char *mem;
    size_t es, n;
} guarded;

static guarded guarded_make(fqla_dtype dtype, int64_t n)
{
    guarded g;
    g.es = tu_size(dtype);
    g.n = (size_t)n;
    g.mem = malloc((g.n + 2 * GUARD) * g.es);
    if (g.mem) memset(g.mem, POISON_BYTE, (g.n + 2 * GUARD) * g.es);
    return g;
}

static void *guarded_data(const guarded *g) { return g->mem + GUARD * g->es; }

static int all_poison(const unsigned char *p, size_t bytes)
{
    for (size_t i = 0; i < bytes; i++)
        if (p[i] != POISON_BYTE) return 0;
    return 1;
}

/* Elements of the payload still holding the poison pattern. */
static int64_t poisoned_elements(const guarded *g)
{
    int64_t bad = 0;
    for (size_t i = 0; i < g->n; i++)
        bad += all_poison((const unsigned char *)guarded_data(g) + i * g->es, g->es);
    return bad;
}

/* The bytes of every input tensor of t, concatenated (caller frees). */
static unsigned char *inputs_copy(const gdn_tensors *t, size_t *bytes)
{
    const tbuf *b[11] = {&t->q, &t->k, &t->v, &t->g, &t->beta, &t->A_log, &t->dt_bias, &t->h0, &t->cu, &t->d_o,
                         &t->dht};
    size_t total = 0, off = 0;
    for (int i = 0; i < 11; i++)
        total += (size_t)b[i]->n * tu_size(b[i]->dtype);
    unsigned char *x = malloc(total ? total : 1);
    for (int i = 0; x && i < 11; i++) {
        size_t n = (size_t)b[i]->n * tu_size(b[i]->dtype);
        if (n) memcpy(x + off, b[i]->data, n);
        off += n;
    }
    *bytes = total;
    return x;
}

static fqla_tensor state_view(const gdn_case *c, void *data, fqla_dtype dtype)
{
    int64_t N = gdn_N(c);
    int64_t shape[4] = {N, c->HV, c->opt.state_v_first ? c->V : c->K, c->opt.state_v_first ? c->K : c->V};
    return fqla_tensor_contiguous(data, dtype, 4, shape);
}

/* The backward of c on ctx (ref: F64 tensors), everything or d_initial_state
 * alone; returns d_initial_state's bytes (caller frees), NULL on failure. */
static unsigned char *run_dh0(fqla_context *ctx, const gdn_case *c, const gdn_data *d, int is_ref, int alone,
                              const char *label)
{
    fqla_fwd_args f;
    fqla_bwd_args a;
    fqla_dtype io = is_ref ? FQLA_DTYPE_F64 : c->io, f32 = is_ref ? FQLA_DTYPE_F64 : FQLA_DTYPE_F32;
    gdn_tensors t = gdn_tensors_make(c, d, is_ref);
    gdn_fwd_inputs(c, &t, &f);
    gdn_bwd_inputs(c, &t, &f, &a);
    tbuf dq = tb_make(io, d->nq, NULL), dk = tb_make(io, d->nq, NULL), dv = tb_make(io, d->nv, NULL);
    tbuf dg = tb_make(f32, d->ng, NULL), db = tb_make(f32, d->ng, NULL);
    tbuf dA = tb_make(f32, c->HV, NULL), ddt = tb_make(f32, c->HV, NULL);
    if (!alone) {
        a.dq = tu_tensor(&dq, 4, c->B, c->T, c->H, c->K, 0);
        a.dk = tu_tensor(&dk, 4, c->B, c->T, c->H, c->K, 0);
        a.dv = tu_tensor(&dv, 4, c->B, c->T, c->HV, c->V, 0);
        a.dg = tu_tensor(&dg, 3, c->B, c->T, c->HV, 0, 0);
        a.dbeta = tu_tensor(&db, 3, c->B, c->T, c->HV, 0, 0);
        if (c->opt.use_gate_in_kernel) {
            a.dA_log = tu_tensor(&dA, 1, c->HV, 0, 0, 0, 0);
            a.ddt_bias = tu_tensor(&ddt, 1, c->HV, 0, 0, 0, 0);
        }
    }
    guarded dh0 = guarded_make(f32, d->ns);
    a.d_initial_state = state_view(c, guarded_data(&dh0), f32);
    size_t in_bytes = 0;
    unsigned char *before = inputs_copy(&t, &in_bytes), *after = NULL, *out = NULL;

    fqla_status st = dh0.mem && before ? fqla_bwd(ctx, &a, NULL, 0, NULL) : FQLA_STATUS_ALLOC_FAILED;
    CHECK(st == FQLA_STATUS_SUCCESS, "%s: %s: %s", label, fqla_status_string(st), fqla_last_error(ctx));
    if (st == FQLA_STATUS_SUCCESS) {
        size_t after_bytes = 0;
        after = inputs_copy(&t, &after_bytes);
        CHECK(after && after_bytes == in_bytes && memcmp(before, after, in_bytes) == 0, "%s: an input changed",
              label);
        CHECK(all_poison(dh0.mem, GUARD * dh0.es) && all_poison(dh0.mem + (GUARD + dh0.n) * dh0.es, GUARD * dh0.es),
              "%s: written outside d_initial_state", label);
        int64_t bad = poisoned_elements(&dh0);
        CHECK(bad == 0, "%s: %lld elements of d_initial_state not written", label, (long long)bad);
        out = malloc(dh0.n * dh0.es + 1);
        if (out) memcpy(out, guarded_data(&dh0), dh0.n * dh0.es);
    }
    free(before);
    free(after);
    free(dh0.mem);
    tb_free(&dq); tb_free(&dk); tb_free(&dv); tb_free(&dg); tb_free(&db); tb_free(&dA); tb_free(&ddt);
    gdn_tensors_free(&t);
    return out;
}

/* Value heads' d_initial_state of an empty sequence n must be its d_final_state. */
static void check_empty_sequence(const gdn_case *c, const gdn_data *d, const unsigned char *dh0, int is_ref,
                                 int64_t n, const char *label)
{
    int64_t per = c->HV * c->K * c->V, bad = 0;
    for (int64_t i = 0; i < per; i++) {
        double x = is_ref ? ((const double *)dh0)[n * per + i] : ((const float *)dh0)[n * per + i];
        double want = c->dht ? d->dht[n * per + i] : 0.0;
        bad += x != want;
    }
    CHECK(bad == 0, "%s: empty sequence %lld: %lld values of d_initial_state differ from d_final_state", label,
          (long long)n, (long long)bad);
}

/* Full and alone on both CPU backends; the d_initial_state bytes must agree. */
static void same_dh0(const gdn_case *c, const char *name, int64_t empty_seq)
{
    gdn_data d = gdn_data_make(c);
    for (int is_ref = 0; is_ref < 2; is_ref++) {
        fqla_context *ctx = is_ref ? ref : cpu;
        char lf[128], la[128];
        snprintf(lf, sizeof lf, "%s, %s, full backward", name, is_ref ? "reference" : "CPU");
        snprintf(la, sizeof la, "%s, %s, d_initial_state alone", name, is_ref ? "reference" : "CPU");
        unsigned char *full = run_dh0(ctx, c, &d, is_ref, 0, lf);
        unsigned char *alone = run_dh0(ctx, c, &d, is_ref, 1, la);
        size_t bytes = (size_t)d.ns * (is_ref ? 8 : 4);
        if (full && alone) {
            size_t first = 0;
            while (first < bytes && full[first] == alone[first])
                first++;
            CHECK(first == bytes, "%s: differs from the full backward's from byte %zu (element %zu)", la, first,
                  first / (is_ref ? 8 : 4));
            if (empty_seq >= 0) check_empty_sequence(c, &d, alone, is_ref, empty_seq, la);
        }
        free(full);
        free(alone);
    }
    gdn_data_free(&d);
}

static void varlen_empty_sequence_and_trailing_rows(void)
{
    /* three chunks in the last sequence; rows 200..209 belong to none */
    static const int64_t cu[] = {0, 70, 70, 200};
    gdn_case c = gdn_case_make(1, 210, 1, 2, 32, 32);
    gdn_set_cu(&c, 4, cu);
    c.opt.use_qk_l2norm = 1;
    c.h0 = c.dht = 1;
    same_dh0(&c, "varlen", 1);
    c.dht = 0; /* an empty sequence's gradient is then zero */
    same_dh0(&c, "varlen without d_final_state", 1);
}

static void gva_every_in_kernel_option(void)
{
    gdn_case c = gdn_case_make(2, 130, 2, 8, 32, 32);
    c.opt.use_qk_l2norm = c.opt.use_gate_in_kernel = c.opt.use_beta_sigmoid = c.opt.allow_neg_eigval = 1;
    c.h0 = 1;
    same_dh0(&c, "GVA 4, l2norm, gate, beta sigmoid, allow_neg_eigval", -1);
    c.dht = 1;
    c.opt.scale = 0.3;
    same_dh0(&c, "GVA 4, every option, d_final_state, scale 0.3", -1);
}

static void v_first_odd_dims_bf16(void)
{
    gdn_case c = gdn_case_make(1, 65, 1, 2, 16, 24);
    c.io = FQLA_DTYPE_BF16;
    c.state = FQLA_DTYPE_BF16;
    c.opt.state_v_first = 1;
    c.opt.use_qk_l2norm = 1;
    c.h0 = c.dht = 1;
    same_dh0(&c, "state_v_first, K = 16, V = 24, bf16", -1);
}

static void t0_gives_d_final_state(void)
{
    gdn_case c = gdn_case_make(2, 0, 1, 2, 16, 16);
    c.h0 = c.dht = 1;
    same_dh0(&c, "T = 0", 0);
    same_dh0(&c, "T = 0", 1);
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
        CHECK_RUN(t0_gives_d_final_state);
    }
    fqla_context_destroy(cpu);
    fqla_context_destroy(ref);
    return check_summary();
}
