/*
 * test_validation.c - the C API's argument validation (src/validate.c).
 *
 * Table-driven: every bad-input case builds a valid small problem with fresh
 * random data on a CPU context, breaks one thing, and checks that the call
 * returns the exact status, that fqla_last_error names the argument, and that
 * every buffer of the call (outputs pre-filled with a sentinel, inputs, the
 * state pool) is bit-identical afterwards. Alignment rules apply to the CUDA
 * backend only, so those cases call fqla_validate_* with host_readable = 0.
 *
 * The second half checks that legal but unusual inputs are accepted: T = 0,
 * zero-length and trailing varlen sequences, strided views, padding slots,
 * and that the problem description (N, scale, sequence bounds) is right.
 * Those run end to end on the fp64 reference backend, which covers any head
 * dim; the bad-input checks never depend on a backend computing anything.
 */
#include "common/check.h"
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define SHAPE(...) ((const int64_t[]){__VA_ARGS__})

enum { OP_FWD, OP_BWD, OP_DECODE, OP_VERIFY };

typedef struct cfg {
    int64_t B, T, H, HV, K, V, P;
    fqla_dtype io, gate, state;
    int ncu;                 /* varlen when > 0: cu_seqlens = cu[0..ncu) */
    int64_t cu[8];
    int h0, ht, dht;         /* initial / final state (fwd), d_final_state (bwd) */
    int gate_in_kernel, v_first;
    fqla_backend backend;
} cfg;

#define MAXBUF 40

/* A problem with its buffers: every allocation is recorded so the whole call's
 * memory can be snapshotted and compared. */
typedef struct fx {
    cfg c;
    fqla_context *ctx;
    int n;
    void *buf[MAXBUF];
    unsigned char *snap[MAXBUF];
    size_t bytes[MAXBUF];
    fqla_fwd_args fa;
    fqla_bwd_args ba;
    fqla_decode_args da;
    int64_t host[16];        /* cu_seqlens_host / slots_host copies */
} fx;

enum fill { FILL_NORMAL, FILL_GATE, FILL_BETA, FILL_SENTINEL };

#define SENTINEL_BYTE 0xA5

static cfg default_cfg(int op)
{
    cfg c;
    memset(&c, 0, sizeof c);
    /* K != V so a K/V mix-up in a layout rule shows */
    c.B = 2; c.T = 9; c.H = 2; c.HV = 4; c.K = 32; c.V = 16; c.P = 5;
    c.io = FQLA_DTYPE_F32; c.gate = FQLA_DTYPE_F32; c.state = FQLA_DTYPE_F32;
    c.h0 = 1; c.ht = 1; c.dht = 1;
    c.backend = FQLA_BACKEND_CPU;
    if (op == OP_DECODE || op == OP_VERIFY) {
        c.B = 3;
        c.T = op == OP_DECODE ? 1 : 3;
    }
    return c;
}

static size_t dsize(fqla_dtype d)
{
    return (d == FQLA_DTYPE_F16 || d == FQLA_DTYPE_BF16) ? 2 : (d == FQLA_DTYPE_F64 || d == FQLA_DTYPE_I64) ? 8 : 4;
}

static void put(void *p, fqla_dtype dt, int64_t i, double x)
{
    switch (dt) {
    case FQLA_DTYPE_F32: ((float *)p)[i] = (float)x; break;
    case FQLA_DTYPE_F64: ((double *)p)[i] = x; break;
    case FQLA_DTYPE_F16: ((uint16_t *)p)[i] = fqla_f32_to_f16((float)x); break;
    case FQLA_DTYPE_BF16: ((uint16_t *)p)[i] = fqla_f32_to_bf16((float)x); break;
    case FQLA_DTYPE_I32: ((int32_t *)p)[i] = (int32_t)x; break;
    case FQLA_DTYPE_I64: ((int64_t *)p)[i] = (int64_t)x; break;
    }
}

static void *fx_alloc(fx *f, size_t bytes)
{
    void *p = NULL;
    if (bytes < 64) bytes = 64;
    bytes = (bytes + 63) / 64 * 64;
    if (f->n >= MAXBUF || posix_memalign(&p, 64, bytes) != 0) {
        CHECK(0, "test fixture: allocation of %zu bytes failed", bytes);
        return NULL;
    }
    memset(p, SENTINEL_BYTE, bytes);
    f->buf[f->n] = p;
    f->snap[f->n] = NULL;
    f->bytes[f->n] = bytes;
    f->n++;
    return p;
}

/* A new tensor (contiguous when strides is NULL) over fresh memory; every
 * element of its span is filled, padding included. */
static fqla_tensor fx_tensor(fx *f, fqla_dtype dt, int ndim, const int64_t *shape,
                             const int64_t *strides, enum fill fill)
{
    fqla_tensor t;
    int64_t span = 1, numel = 1;
    memset(&t, 0, sizeof t);
    t.dtype = dt;
    t.ndim = ndim;
    for (int d = ndim - 1; d >= 0; d--) {
        t.shape[d] = shape[d];
        t.strides[d] = strides ? strides[d] : (d == ndim - 1 ? 1 : t.strides[d + 1] * t.shape[d + 1]);
        numel *= shape[d];
        if (shape[d] > 0) span += (shape[d] - 1) * t.strides[d];
    }
    if (numel == 0) span = 0;
    t.data = fx_alloc(f, (size_t)span * dsize(dt));
    if (!t.data || fill == FILL_SENTINEL) return t;
    for (int64_t i = 0; i < span; i++) {
        double x = check_normal();
        if (fill == FILL_GATE) x = -0.2 * fabs(x);
        if (fill == FILL_BETA) x = check_uniform();
        put(t.data, dt, i, x);
    }
    return t;
}

static fqla_tensor fx_ints(fx *f, fqla_dtype dt, int n, const int64_t *values)
{
    fqla_tensor t = fx_tensor(f, dt, 1, SHAPE(n), NULL, FILL_SENTINEL);
    for (int i = 0; t.data && i < n; i++) put(t.data, dt, i, (double)values[i]);
    return t;
}

static int64_t n_seqs(const cfg *c) { return c->ncu > 0 ? c->ncu - 1 : c->B; }

static fqla_tensor fx_state(fx *f, const cfg *c, int64_t lead, fqla_dtype dt, enum fill fill)
{
    if (c->v_first) return fx_tensor(f, dt, 4, SHAPE(lead, c->HV, c->V, c->K), NULL, fill);
    return fx_tensor(f, dt, 4, SHAPE(lead, c->HV, c->K, c->V), NULL, fill);
}

/* q, k, v, g, beta, A_log, dt_bias and the options, shared by every op. */
static void common_setup(fx *f, const cfg *c, fqla_tensor *q, fqla_tensor *k, fqla_tensor *v,
                         fqla_tensor *g, fqla_tensor *beta, fqla_tensor *A_log,
                         fqla_tensor *dt_bias, fqla_options *opt)
{
    *q = fx_tensor(f, c->io, 4, SHAPE(c->B, c->T, c->H, c->K), NULL, FILL_NORMAL);
    *k = fx_tensor(f, c->io, 4, SHAPE(c->B, c->T, c->H, c->K), NULL, FILL_NORMAL);
    *v = fx_tensor(f, c->io, 4, SHAPE(c->B, c->T, c->HV, c->V), NULL, FILL_NORMAL);
    *g = fx_tensor(f, c->gate, 3, SHAPE(c->B, c->T, c->HV), NULL, c->gate_in_kernel ? FILL_NORMAL : FILL_GATE);
    *beta = fx_tensor(f, c->gate, 3, SHAPE(c->B, c->T, c->HV), NULL, FILL_BETA);
    if (c->gate_in_kernel) {
        *A_log = fx_tensor(f, FQLA_DTYPE_F32, 1, SHAPE(c->HV), NULL, FILL_NORMAL);
        *dt_bias = fx_tensor(f, FQLA_DTYPE_F32, 1, SHAPE(c->HV), NULL, FILL_NORMAL);
    }
    opt->scale = FQLA_SCALE_DEFAULT;
    opt->use_qk_l2norm = 1;
    opt->use_gate_in_kernel = c->gate_in_kernel;
    opt->state_v_first = c->v_first;
}

static void fwd_setup(fx *f, const cfg *c)
{
    fqla_fwd_args *a = &f->fa;
    fqla_fwd_args_init(a);
    common_setup(f, c, &a->q, &a->k, &a->v, &a->g, &a->beta, &a->A_log, &a->dt_bias, &a->opt);
    if (c->ncu > 0) a->cu_seqlens = fx_ints(f, FQLA_DTYPE_I32, c->ncu, c->cu);
    if (c->h0) a->initial_state = fx_state(f, c, n_seqs(c), c->state, FILL_NORMAL);
    a->o = fx_tensor(f, c->io, 4, SHAPE(c->B, c->T, c->HV, c->V), NULL, FILL_SENTINEL);
    if (c->ht) a->final_state = fx_state(f, c, n_seqs(c), c->state, FILL_SENTINEL);
}

static void bwd_setup(fx *f, const cfg *c)
{
    fqla_bwd_args *a = &f->ba;
    fqla_bwd_args_init(a);
    common_setup(f, c, &a->q, &a->k, &a->v, &a->g, &a->beta, &a->A_log, &a->dt_bias, &a->opt);
    if (c->ncu > 0) a->cu_seqlens = fx_ints(f, FQLA_DTYPE_I32, c->ncu, c->cu);
    if (c->h0) a->initial_state = fx_state(f, c, n_seqs(c), c->state, FILL_NORMAL);
    a->d_o = fx_tensor(f, c->io, 4, SHAPE(c->B, c->T, c->HV, c->V), NULL, FILL_NORMAL);
    if (c->dht) a->d_final_state = fx_state(f, c, n_seqs(c), FQLA_DTYPE_F32, FILL_NORMAL);
    a->dq = fx_tensor(f, c->io, 4, SHAPE(c->B, c->T, c->H, c->K), NULL, FILL_SENTINEL);
    a->dk = fx_tensor(f, c->io, 4, SHAPE(c->B, c->T, c->H, c->K), NULL, FILL_SENTINEL);
    a->dv = fx_tensor(f, c->io, 4, SHAPE(c->B, c->T, c->HV, c->V), NULL, FILL_SENTINEL);
    a->dg = fx_tensor(f, FQLA_DTYPE_F32, 3, SHAPE(c->B, c->T, c->HV), NULL, FILL_SENTINEL);
    a->dbeta = fx_tensor(f, FQLA_DTYPE_F32, 3, SHAPE(c->B, c->T, c->HV), NULL, FILL_SENTINEL);
    if (c->h0) a->d_initial_state = fx_state(f, c, n_seqs(c), FQLA_DTYPE_F32, FILL_SENTINEL);
    if (c->gate_in_kernel) {
        a->dA_log = fx_tensor(f, FQLA_DTYPE_F32, 1, SHAPE(c->HV), NULL, FILL_SENTINEL);
        a->ddt_bias = fx_tensor(f, FQLA_DTYPE_F32, 1, SHAPE(c->HV), NULL, FILL_SENTINEL);
    }
}

/* Slots: distinct entries counted down from P - 1, sequence 1 padding (-1). */
static void dec_setup(fx *f, const cfg *c, int verify)
{
    fqla_decode_args *a = &f->da;
    int64_t slots[16];
    fqla_decode_args_init(a);
    common_setup(f, c, &a->q, &a->k, &a->v, &a->g, &a->beta, &a->A_log, &a->dt_bias, &a->opt);
    a->state_pool = fx_state(f, c, c->P, c->state, FILL_NORMAL);
    for (int64_t b = 0; b < c->B && b < 16; b++) slots[b] = b == 1 ? -1 : c->P - 1 - b;
    a->slots = fx_ints(f, FQLA_DTYPE_I32, (int)c->B, slots);
    a->o = fx_tensor(f, c->io, 4, SHAPE(c->B, c->T, c->HV, c->V), NULL, FILL_SENTINEL);
    if (verify) {
        if (c->v_first)
            a->step_states = fx_tensor(f, c->state, 5, SHAPE(c->B, c->T, c->HV, c->V, c->K), NULL, FILL_SENTINEL);
        else
            a->step_states = fx_tensor(f, c->state, 5, SHAPE(c->B, c->T, c->HV, c->K, c->V), NULL, FILL_SENTINEL);
    }
}

static int fx_setup(fx *f, const cfg *c, int op)
{
    memset(f, 0, sizeof *f);
    f->c = *c;
    fqla_status st = fqla_context_create(&f->ctx, c->backend, 0);
    CHECK(st == FQLA_STATUS_SUCCESS, "context_create: %s (%s)", fqla_status_string(st), fqla_last_error(NULL));
    if (st != FQLA_STATUS_SUCCESS) return 0;
    switch (op) {
    case OP_FWD: fwd_setup(f, c); break;
    case OP_BWD: bwd_setup(f, c); break;
    default: dec_setup(f, c, op == OP_VERIFY); break;
    }
    return 1;
}

static void fx_free(fx *f)
{
    for (int i = 0; i < f->n; i++) {
        free(f->buf[i]);
        free(f->snap[i]);
    }
    f->n = 0;
    fqla_context_destroy(f->ctx);
    f->ctx = NULL;
}

static void fx_snapshot(fx *f)
{
    for (int i = 0; i < f->n; i++) {
        free(f->snap[i]);
        f->snap[i] = malloc(f->bytes[i]);
        if (f->snap[i]) memcpy(f->snap[i], f->buf[i], f->bytes[i]);
    }
}

/* Every buffer of the call bit-identical to the snapshot. */
static void fx_check_untouched(const fx *f)
{
    for (int i = 0; i < f->n; i++)
        CHECK(f->snap[i] && memcmp(f->snap[i], f->buf[i], f->bytes[i]) == 0,
              "buffer %d (%zu bytes) changed by a rejected call", i, f->bytes[i]);
}

/* The buffer that holds ptr, or -1. */
static int fx_index(const fx *f, const void *ptr)
{
    for (int i = 0; i < f->n; i++)
        if (f->buf[i] == ptr) return i;
    return -1;
}

static fqla_status fx_call(fx *f, int op)
{
    switch (op) {
    case OP_FWD: return fqla_fwd(f->ctx, &f->fa, NULL, 0, NULL);
    case OP_BWD: return fqla_bwd(f->ctx, &f->ba, NULL, 0, NULL);
    case OP_DECODE: return fqla_decode(f->ctx, &f->da, NULL, 0, NULL);
    default: return fqla_verify(f->ctx, &f->da, NULL, 0, NULL);
    }
}

static fqla_status fx_validate(fx *f, int op, int host_readable, fqla_problem *p)
{
    /* fqla_validate_* is internal: it takes the context a handle names */
    fqla_context *ctx = fqla_context_acquire(f->ctx);
    fqla_status st;
    fqla_clear_error(ctx);
    switch (op) {
    case OP_FWD: st = fqla_validate_fwd(ctx, &f->fa, host_readable, p); break;
    case OP_BWD: st = fqla_validate_bwd(ctx, &f->ba, host_readable, p); break;
    default: st = fqla_validate_decode(ctx, &f->da, op == OP_VERIFY, host_readable, p); break;
    }
    fqla_context_release(ctx);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Bad inputs                                                                 */

typedef struct bad_case {
    const char *name;
    int op;
    void (*mod)(cfg *);      /* changes the valid problem before it is built (optional) */
    void (*brk)(fx *);       /* breaks one thing */
    int cuda;                /* 1: fqla_validate_* with host_readable = 0 */
    fqla_status status;
    const char *arg;         /* must appear in fqla_last_error */
} bad_case;

static const bad_case *cur_case;

static void run_bad_case(void)
{
    const bad_case *bc = cur_case;
    cfg c = default_cfg(bc->op);
    fx f;
    fqla_problem p;
    if (bc->mod) bc->mod(&c);
    if (!fx_setup(&f, &c, bc->op)) return;
    bc->brk(&f);
    fx_snapshot(&f);
    fqla_status st = bc->cuda ? fx_validate(&f, bc->op, 0, &p) : fx_call(&f, bc->op);
    const char *msg = fqla_last_error(f.ctx);
    CHECK(st == bc->status, "status %s, expected %s (message: \"%s\")", fqla_status_string(st),
          fqla_status_string(bc->status), msg);
    CHECK(strstr(msg, bc->arg) != NULL, "message \"%s\" does not name \"%s\"", msg, bc->arg);
    fx_check_untouched(&f);
    if (getenv("FQLA_TEST_VERBOSE")) printf("     %s -> %s: %s\n", bc->name, fqla_status_string(st), msg);
    fx_free(&f);
}

/* modifiers */
static void m_varlen(cfg *c) { c->B = 1; c->ncu = 4; c->cu[0] = 0; c->cu[1] = 4; c->cu[2] = 4; c->cu[3] = 9; }
static void m_gate(cfg *c) { c->gate_in_kernel = 1; }
static void m_hv3(cfg *c) { c->HV = 3; }
static void m_v_first(cfg *c) { c->v_first = 1; }
static void m_no_h0(cfg *c) { c->h0 = 0; }
static void m_t0(cfg *c) { c->T = 0; }
static void m_t2(cfg *c) { c->T = 2; }

/* fwd breakers */
static void b_fwd_null_q(fx *f) { f->fa.q.data = NULL; }
static void b_fwd_null_k(fx *f) { f->fa.k.data = NULL; }
static void b_fwd_null_v(fx *f) { f->fa.v.data = NULL; }
static void b_fwd_null_g(fx *f) { f->fa.g.data = NULL; }
static void b_fwd_null_beta(fx *f) { f->fa.beta.data = NULL; }
/* o absent with final_state given is the final state alone (ok_fwd_ht_only) */
static void b_fwd_null_o(fx *f) { f->fa.o.data = NULL; f->fa.final_state.data = NULL; }
static void b_fwd_null_A_log(fx *f) { f->fa.A_log.data = NULL; }
static void b_fwd_null_dt_bias(fx *f) { f->fa.dt_bias.data = NULL; }
static void b_fwd_A_log_no_gate(fx *f) { f->fa.A_log = fx_tensor(f, FQLA_DTYPE_F32, 1, SHAPE(f->c.HV), NULL, FILL_NORMAL); }
static void b_fwd_q_ndim(fx *f) { f->fa.q.ndim = 3; }
static void b_fwd_q_ndim7(fx *f) { f->fa.q.ndim = 7; }
static void b_fwd_H0(fx *f) { f->fa.q.shape[2] = 0; f->fa.k.shape[2] = 0; }
static void b_fwd_B_neg(fx *f) { f->fa.q.shape[0] = -2; }
static void b_fwd_V0(fx *f) { f->fa.v.shape[3] = 0; }
static void b_fwd_T0_null_o_data(fx *f)
{
    f->fa.o.data = NULL;
    f->fa.o.shape[1] = 1;
    f->fa.final_state.data = NULL;
}
static void b_nop(fx *f) { (void)f; }
static void b_fwd_k_heads(fx *f) { f->fa.k = fx_tensor(f, f->c.io, 4, SHAPE(f->c.B, f->c.T, 1, f->c.K), NULL, FILL_NORMAL); }
static void b_fwd_k_dim(fx *f) { f->fa.k = fx_tensor(f, f->c.io, 4, SHAPE(f->c.B, f->c.T, f->c.H, f->c.K / 2), NULL, FILL_NORMAL); }
static void b_fwd_v_T(fx *f) { f->fa.v = fx_tensor(f, f->c.io, 4, SHAPE(f->c.B, f->c.T + 1, f->c.HV, f->c.V), NULL, FILL_NORMAL); }
static void b_fwd_o_heads(fx *f) { f->fa.o = fx_tensor(f, f->c.io, 4, SHAPE(f->c.B, f->c.T, f->c.H, f->c.V), NULL, FILL_SENTINEL); }
static void b_fwd_o_V(fx *f) { f->fa.o = fx_tensor(f, f->c.io, 4, SHAPE(f->c.B, f->c.T, f->c.HV, f->c.K), NULL, FILL_SENTINEL); }
static void b_fwd_g_shape(fx *f) { f->fa.g = fx_tensor(f, f->c.gate, 3, SHAPE(f->c.B, f->c.T, f->c.H), NULL, FILL_GATE); }
static void b_fwd_beta_shape(fx *f) { f->fa.beta = fx_tensor(f, f->c.gate, 3, SHAPE(f->c.B + 1, f->c.T, f->c.HV), NULL, FILL_BETA); }
static void b_fwd_g_ndim(fx *f) { f->fa.g = fx_tensor(f, f->c.gate, 4, SHAPE(f->c.B, f->c.T, f->c.HV, 1), NULL, FILL_GATE); }
static void b_fwd_A_log_shape(fx *f) { f->fa.A_log = fx_tensor(f, FQLA_DTYPE_F32, 1, SHAPE(f->c.H), NULL, FILL_NORMAL); }
static void b_fwd_k_dtype(fx *f) { f->fa.k = fx_tensor(f, FQLA_DTYPE_BF16, 4, SHAPE(f->c.B, f->c.T, f->c.H, f->c.K), NULL, FILL_NORMAL); }
static void b_fwd_o_dtype(fx *f) { f->fa.o = fx_tensor(f, FQLA_DTYPE_F16, 4, SHAPE(f->c.B, f->c.T, f->c.HV, f->c.V), NULL, FILL_SENTINEL); }
static void b_fwd_q_int(fx *f) { f->fa.q.dtype = FQLA_DTYPE_I32; f->fa.k.dtype = FQLA_DTYPE_I32; f->fa.v.dtype = FQLA_DTYPE_I32; }
static void b_fwd_dtype_garbage(fx *f) { f->fa.v.dtype = (fqla_dtype)77; }
static void b_fwd_g_f16(fx *f) { f->fa.g = fx_tensor(f, FQLA_DTYPE_F16, 3, SHAPE(f->c.B, f->c.T, f->c.HV), NULL, FILL_GATE); }
static void b_fwd_beta_vs_g(fx *f) { f->fa.beta = fx_tensor(f, FQLA_DTYPE_BF16, 3, SHAPE(f->c.B, f->c.T, f->c.HV), NULL, FILL_BETA); }
static void b_fwd_h0_f16(fx *f) { f->fa.initial_state = fx_state(f, &f->c, f->c.B, FQLA_DTYPE_F16, FILL_NORMAL); }
static void b_fwd_A_log_bf16(fx *f) { f->fa.A_log = fx_tensor(f, FQLA_DTYPE_BF16, 1, SHAPE(f->c.HV), NULL, FILL_NORMAL); }
static void b_fwd_q_last_stride(fx *f)
{
    const cfg *c = &f->c;
    f->fa.q = fx_tensor(f, c->io, 4, SHAPE(c->B, c->T, c->H, c->K),
                        SHAPE(c->T * c->H * c->K * 2, c->H * c->K * 2, c->K * 2, 2), FILL_NORMAL);
}
static void b_fwd_v_neg_stride(fx *f) { f->fa.v.strides[1] = -f->fa.v.strides[1]; }
static void b_fwd_o_zero_stride(fx *f) { f->fa.o.strides[1] = 0; }
static void b_fwd_o_heads_overlap(fx *f) { f->fa.o.strides[2] = f->c.V / 2; }
static void b_fwd_ht_overlap(fx *f) { f->fa.final_state.strides[0] = f->fa.final_state.strides[1]; }
static void b_fwd_o_alias_v(fx *f) { f->fa.o.data = f->fa.v.data; }
static void b_fwd_o_alias_q_tail(fx *f)
{
    /* o's range starts inside q's last row: partial overlap */
    int64_t n = fqla_tensor_numel(&f->fa.q);
    f->fa.o.data = (float *)f->fa.q.data + n - 1;
}
static void b_fwd_ht_alias_h0(fx *f) { f->fa.final_state.data = f->fa.initial_state.data; }
static void b_fwd_ht_alias_o(fx *f) { f->fa.final_state.data = (float *)f->fa.o.data + 3; }
static void b_fwd_g_odd_pointer(fx *f) { f->fa.g.data = (char *)f->fa.g.data + 2; }
static void b_bwd_dht_odd_pointer(fx *f) { f->ba.d_final_state.data = (char *)f->ba.d_final_state.data + 1; }
static void b_fwd_q_misaligned(fx *f) { f->fa.q.data = (float *)f->fa.q.data + 1; }
static void b_fwd_o_misaligned(fx *f) { f->fa.o.data = (float *)f->fa.o.data + 2; }
static void b_fwd_k_stride_misaligned(fx *f)
{
    const cfg *c = &f->c; /* rows of K + 1 floats: 132 bytes */
    f->fa.k = fx_tensor(f, c->io, 4, SHAPE(c->B, c->T, c->H, c->K),
                        SHAPE(c->T * c->H * (c->K + 1), c->H * (c->K + 1), c->K + 1, 1), FILL_NORMAL);
}
static void b_fwd_v_bf16_stride_misaligned(fx *f)
{
    const cfg *c = &f->c; /* everything bf16, v rows padded by 4 elements: 40 bytes */
    f->fa.q = fx_tensor(f, FQLA_DTYPE_BF16, 4, SHAPE(c->B, c->T, c->H, c->K), NULL, FILL_NORMAL);
    f->fa.k = fx_tensor(f, FQLA_DTYPE_BF16, 4, SHAPE(c->B, c->T, c->H, c->K), NULL, FILL_NORMAL);
    f->fa.o = fx_tensor(f, FQLA_DTYPE_BF16, 4, SHAPE(c->B, c->T, c->HV, c->V), NULL, FILL_SENTINEL);
    f->fa.v = fx_tensor(f, FQLA_DTYPE_BF16, 4, SHAPE(c->B, c->T, c->HV, c->V),
                        SHAPE(c->T * c->HV * (c->V + 4), c->HV * (c->V + 4), c->V + 4, 1), FILL_NORMAL);
}
static void b_fwd_cu_dtype(fx *f) { f->fa.cu_seqlens = fx_ints(f, FQLA_DTYPE_I32, 4, f->c.cu); f->fa.cu_seqlens.dtype = FQLA_DTYPE_F32; }
static void b_fwd_cu_short(fx *f) { f->fa.cu_seqlens = fx_ints(f, FQLA_DTYPE_I64, 1, SHAPE(0)); }
static void b_fwd_cu_ndim(fx *f) { f->fa.cu_seqlens.ndim = 2; f->fa.cu_seqlens.shape[1] = 1; f->fa.cu_seqlens.strides[0] = 1; f->fa.cu_seqlens.strides[1] = 1; }
static void b_fwd_cu_start(fx *f) { f->fa.cu_seqlens = fx_ints(f, FQLA_DTYPE_I64, 4, SHAPE(2, 4, 4, 9)); }
static void b_fwd_cu_decreasing(fx *f) { f->fa.cu_seqlens = fx_ints(f, FQLA_DTYPE_I32, 4, SHAPE(0, 5, 3, 9)); }
static void b_fwd_cu_past_T(fx *f) { f->fa.cu_seqlens = fx_ints(f, FQLA_DTYPE_I64, 4, SHAPE(0, 4, 4, 10)); }
static void b_fwd_cu_B2(fx *f) { f->fa.cu_seqlens = fx_ints(f, FQLA_DTYPE_I32, 3, SHAPE(0, 4, 9)); }
static void b_fwd_cu_host_differs(fx *f)
{
    f->host[0] = 0; f->host[1] = 4; f->host[2] = 5; f->host[3] = 9;
    f->fa.cu_seqlens_host = f->host;
}
static void b_fwd_cu_host_inside_o(fx *f)
{
    /* the host copy, with the right values, inside o: o's first rows would
     * overwrite the bounds the backend reads next (a crash before) */
    int64_t *host = (int64_t *)((float *)f->fa.o.data + 8);
    for (int i = 0; i < f->c.ncu; i++) host[i] = f->c.cu[i];
    f->fa.cu_seqlens_host = host;
}
static void b_fwd_q_shape_overflow(fx *f)
{
    /* strides by fqla_tensor_contiguous: 2^62 elements a row overflow int64 */
    f->fa.q = fqla_tensor_contiguous(f->fa.q.data, f->c.io, 4, SHAPE(2, (int64_t)1 << 61, 2, 2));
}
static void b_fwd_cpu_final_state_f64(fx *f) { f->fa.final_state = fx_state(f, &f->c, f->c.B, FQLA_DTYPE_F64, FILL_SENTINEL); }
static void b_fwd_cu_host_past_T(fx *f)
{
    f->host[0] = 0; f->host[1] = 4; f->host[2] = 4; f->host[3] = 12;
    f->fa.cu_seqlens_host = f->host;
}
static void b_fwd_cu_host_alone(fx *f)
{
    f->host[0] = 0; f->host[1] = 9;
    f->fa.cu_seqlens_host = f->host;
}
static void b_fwd_h0_count(fx *f) { f->fa.initial_state = fx_state(f, &f->c, 4, f->c.state, FILL_NORMAL); }
static void b_fwd_ht_count(fx *f) { f->fa.final_state = fx_state(f, &f->c, 1, f->c.state, FILL_SENTINEL); }
static void b_fwd_h0_layout(fx *f)
{
    cfg c = f->c; /* states built [N, HV, K, V] while opt says state_v_first */
    c.v_first = 0;
    f->fa.initial_state = fx_state(f, &c, f->c.B, f->c.state, FILL_NORMAL);
}
static void b_fwd_ht_layout(fx *f)
{
    cfg c = f->c;
    c.v_first = 1;
    f->fa.final_state = fx_state(f, &c, f->c.B, f->c.state, FILL_SENTINEL);
}
static void b_fwd_scale_nan(fx *f) { f->fa.opt.scale = NAN; }
static void b_fwd_scale_inf(fx *f) { f->fa.opt.scale = INFINITY; }
static void b_fwd_scale_neg(fx *f) { f->fa.opt.scale = -0.125; }
static void b_fwd_neg_eig(fx *f) { f->fa.opt.allow_neg_eigval = 1; f->fa.opt.use_beta_sigmoid = 0; }
static void b_fwd_numel_overflow(fx *f)
{
    /* huge sizes over the small buffers: validation must stop before reading */
    fqla_tensor *q = &f->fa.q;
    q->shape[0] = (int64_t)1 << 40; q->shape[1] = (int64_t)1 << 40;
    q->strides[0] = 0; /* element count overflows before any offset would */
    q->strides[1] = 0;
}
static void b_fwd_stride_overflow(fx *f) { f->fa.v.strides[0] = INT64_MAX - 5; }
static void b_fwd_stride_product_overflow(fx *f) { f->fa.k.strides[1] = INT64_MAX / 4; }
static void b_fwd_state_product_overflow(fx *f)
{
    /* K = V = 2^31: every tensor fits, but one state (K * V * 8 bytes) does not */
    int64_t big = (int64_t)1 << 31;
    fqla_fwd_args *a = &f->fa;
    a->q.shape[3] = a->k.shape[3] = big;
    a->v.shape[3] = a->o.shape[3] = big;
    a->q.strides[2] = a->k.strides[2] = big; a->q.strides[1] = a->k.strides[1] = big * f->c.H;
    a->q.strides[0] = a->k.strides[0] = big * f->c.H * f->c.T;
    a->v.strides[2] = a->o.strides[2] = big; a->v.strides[1] = a->o.strides[1] = big * f->c.HV;
    a->v.strides[0] = a->o.strides[0] = big * f->c.HV * f->c.T;
    a->initial_state.data = NULL;
    a->final_state.data = NULL;
}
static void b_fwd_T0_h0_count(fx *f) { f->fa.initial_state = fx_state(f, &f->c, f->c.B + 1, f->c.state, FILL_NORMAL); }

/* bwd breakers */
static void b_bwd_null_d_o(fx *f) { f->ba.d_o.data = NULL; }
static void b_bwd_null_dq(fx *f) { f->ba.dq.data = NULL; }
static void b_bwd_null_dk(fx *f) { f->ba.dk.data = NULL; }
static void b_bwd_null_dv(fx *f) { f->ba.dv.data = NULL; }
static void b_bwd_null_dg(fx *f) { f->ba.dg.data = NULL; }
static void b_bwd_null_dbeta(fx *f) { f->ba.dbeta.data = NULL; }
static void b_bwd_null_dh0(fx *f) { f->ba.d_initial_state.data = NULL; }
static void b_bwd_dh0_without_h0(fx *f) { f->ba.d_initial_state = fx_state(f, &f->c, f->c.B, FQLA_DTYPE_F32, FILL_SENTINEL); }
static void b_bwd_null_dA_log(fx *f) { f->ba.dA_log.data = NULL; }
static void b_bwd_null_ddt_bias(fx *f) { f->ba.ddt_bias.data = NULL; }
/* the backward of d_initial_state alone: all five per-token gradients absent */
static void b_bwd_five_absent(fx *f)
{
    f->ba.dq.data = f->ba.dk.data = f->ba.dv.data = f->ba.dg.data = f->ba.dbeta.data = NULL;
}
static void b_bwd_dh0_only_dA_log(fx *f) { b_bwd_five_absent(f); f->ba.ddt_bias.data = NULL; }
static void b_bwd_dh0_only_ddt_bias(fx *f) { b_bwd_five_absent(f); f->ba.dA_log.data = NULL; }
static void b_bwd_only_dbeta_given(fx *f) { f->ba.dq.data = f->ba.dk.data = f->ba.dv.data = f->ba.dg.data = NULL; }
static void b_bwd_only_dq_given(fx *f) { f->ba.dk.data = f->ba.dv.data = f->ba.dg.data = f->ba.dbeta.data = NULL; }
static void b_bwd_dg_dbeta_absent(fx *f) { f->ba.dg.data = f->ba.dbeta.data = NULL; }
static void b_bwd_dA_log_no_gate(fx *f) { f->ba.dA_log = fx_tensor(f, FQLA_DTYPE_F32, 1, SHAPE(f->c.HV), NULL, FILL_SENTINEL); }
static void b_bwd_dh0_only_dA_log_no_gate(fx *f) { b_bwd_five_absent(f); b_bwd_dA_log_no_gate(f); }
static void b_bwd_dq_heads(fx *f) { f->ba.dq = fx_tensor(f, f->c.io, 4, SHAPE(f->c.B, f->c.T, f->c.HV, f->c.K), NULL, FILL_SENTINEL); }
static void b_bwd_dv_shape(fx *f) { f->ba.dv = fx_tensor(f, f->c.io, 4, SHAPE(f->c.B, f->c.T, f->c.HV, f->c.K), NULL, FILL_SENTINEL); }
static void b_bwd_d_o_dtype(fx *f) { f->ba.d_o = fx_tensor(f, FQLA_DTYPE_BF16, 4, SHAPE(f->c.B, f->c.T, f->c.HV, f->c.V), NULL, FILL_NORMAL); }
static void b_bwd_dg_bf16(fx *f) { f->ba.dg = fx_tensor(f, FQLA_DTYPE_BF16, 3, SHAPE(f->c.B, f->c.T, f->c.HV), NULL, FILL_SENTINEL); }
static void b_bwd_dk_alias_dq(fx *f) { f->ba.dk.data = f->ba.dq.data; }
static void b_bwd_dv_alias_d_o(fx *f) { f->ba.dv.data = f->ba.d_o.data; }
static void b_bwd_dg_alias_g(fx *f) { f->ba.dg.data = f->ba.g.data; }
static void b_bwd_dht_count(fx *f) { f->ba.d_final_state = fx_state(f, &f->c, f->c.B + 1, FQLA_DTYPE_F32, FILL_NORMAL); }
static void b_bwd_dbeta_overlap(fx *f) { f->ba.dbeta.strides[0] = 1; }
static void b_bwd_scale_nan(fx *f) { f->ba.opt.scale = NAN; }
static void b_bwd_d_o_misaligned(fx *f) { f->ba.d_o.data = (float *)f->ba.d_o.data + 1; }
static void b_bwd_dq_misaligned(fx *f) { f->ba.dq.data = (char *)f->ba.dq.data + 8; }

/* decode / verify breakers */
static void b_dec_null_pool(fx *f) { f->da.state_pool.data = NULL; }
static void b_dec_null_slots(fx *f) { f->da.slots.data = NULL; }
static void b_dec_null_o(fx *f) { f->da.o.data = NULL; }
static void b_dec_T2(fx *f)
{
    const cfg *c = &f->c;
    fqla_decode_args *a = &f->da;
    a->q = fx_tensor(f, c->io, 4, SHAPE(c->B, 2, c->H, c->K), NULL, FILL_NORMAL);
    a->k = fx_tensor(f, c->io, 4, SHAPE(c->B, 2, c->H, c->K), NULL, FILL_NORMAL);
}
static void b_dec_slot_ge_P(fx *f) { put(f->da.slots.data, FQLA_DTYPE_I32, 2, (double)f->c.P); }
static void b_dec_slot_dup(fx *f) { put(f->da.slots.data, FQLA_DTYPE_I32, 2, 4.0); }
static void b_dec_slots_dtype(fx *f) { f->da.slots.dtype = FQLA_DTYPE_F32; }
static void b_dec_slots_shape(fx *f) { f->da.slots = fx_ints(f, FQLA_DTYPE_I64, 2, SHAPE(0, 1)); }
static void b_dec_slots_host_ge_P(fx *f)
{
    f->host[0] = 0; f->host[1] = 9; f->host[2] = 1;
    f->da.slots_host = f->host;
}
static void b_dec_slots_host_dup(fx *f)
{
    f->host[0] = 3; f->host[1] = -1; f->host[2] = 3;
    f->da.slots_host = f->host;
}
static void b_dec_slots_host_differs(fx *f)
{
    f->host[0] = 4; f->host[1] = -1; f->host[2] = 1;
    f->da.slots_host = f->host;
}
static void b_dec_pool_layout(fx *f)
{
    cfg c = f->c;
    c.v_first = !c.v_first;
    f->da.state_pool = fx_state(f, &c, c.P, c.state, FILL_NORMAL);
}
static void b_dec_pool_heads(fx *f) { f->da.state_pool = fx_tensor(f, f->c.state, 4, SHAPE(f->c.P, f->c.H, f->c.K, f->c.V), NULL, FILL_NORMAL); }
static void b_dec_pool_f16(fx *f) { f->da.state_pool = fx_state(f, &f->c, f->c.P, FQLA_DTYPE_F16, FILL_NORMAL); }
static void b_dec_o_alias_pool(fx *f) { f->da.o.data = f->da.state_pool.data; }
static void b_dec_pool_alias_q(fx *f) { f->da.q.data = (float *)f->da.state_pool.data + 5; }
static void b_dec_step_states(fx *f)
{
    const cfg *c = &f->c;
    f->da.step_states = fx_tensor(f, c->state, 5, SHAPE(c->B, c->T, c->HV, c->K, c->V), NULL, FILL_SENTINEL);
}
static void b_dec_neg_eig(fx *f) { f->da.opt.allow_neg_eigval = 1; }
static void b_dec_scale_neg(fx *f) { f->da.opt.scale = -1.0; }
static void b_dec_q_misaligned(fx *f) { f->da.q.data = (float *)f->da.q.data + 3; }
static void b_ver_neither(fx *f) { f->da.step_states.data = NULL; }
static void b_ver_both(fx *f)
{
    f->da.step_slots = fx_tensor(f, FQLA_DTYPE_I32, 2, SHAPE(f->c.B, f->c.T), NULL, FILL_SENTINEL);
    for (int64_t i = 0; i < f->c.B * f->c.T; i++) put(f->da.step_slots.data, FQLA_DTYPE_I32, i, -1);
}
/* step slots: P = 12 entries; slots {11, -1, 9}; steps use 0.. */
static void m_ver_pool12(cfg *c) { c->P = 12; }
static void set_steps(fx *f, const int64_t *v)
{
    f->da.step_states.data = NULL;
    f->da.step_slots = fx_tensor(f, FQLA_DTYPE_I64, 2, SHAPE(f->c.B, f->c.T), NULL, FILL_SENTINEL);
    for (int64_t i = 0; i < f->c.B * f->c.T; i++) put(f->da.step_slots.data, FQLA_DTYPE_I64, i, (double)v[i]);
}
static void b_ver_step_ge_P(fx *f) { set_steps(f, SHAPE(0, 1, 2, -1, -1, -1, 3, 12, 5)); }
static void b_ver_step_dup(fx *f) { set_steps(f, SHAPE(0, 1, 2, -1, -1, -1, 3, 1, 5)); }
static void b_ver_step_hits_slot(fx *f) { set_steps(f, SHAPE(0, 1, 2, -1, -1, -1, 3, 11, 5)); }
static void b_ver_step_shape(fx *f)
{
    b_ver_step_dup(f);
    f->da.step_slots.shape[1] = 2;
}
static void b_ver_step_states_shape(fx *f)
{
    const cfg *c = &f->c;
    f->da.step_states = fx_tensor(f, c->state, 5, SHAPE(c->B, c->T + 1, c->HV, c->K, c->V), NULL, FILL_SENTINEL);
}
static void b_ver_step_states_dtype(fx *f)
{
    const cfg *c = &f->c;
    f->da.step_states = fx_tensor(f, FQLA_DTYPE_BF16, 5, SHAPE(c->B, c->T, c->HV, c->K, c->V), NULL, FILL_SENTINEL);
}
static void b_ver_step_states_alias_pool(fx *f) { f->da.step_states.data = f->da.state_pool.data; }

#define INV FQLA_STATUS_INVALID_VALUE
#define MIS FQLA_STATUS_MISALIGNED
#define OVF FQLA_STATUS_OVERFLOW
#define NSUP FQLA_STATUS_NOT_SUPPORTED

static const bad_case bad_cases[] = {
    /* NULL required pointers */
    {"fwd_null_q", OP_FWD, NULL, b_fwd_null_q, 0, INV, "q: data is NULL"},
    {"fwd_null_k", OP_FWD, NULL, b_fwd_null_k, 0, INV, "k: data is NULL"},
    {"fwd_null_v", OP_FWD, NULL, b_fwd_null_v, 0, INV, "v: data is NULL"},
    {"fwd_null_g", OP_FWD, NULL, b_fwd_null_g, 0, INV, "g: data is NULL"},
    {"fwd_null_beta", OP_FWD, NULL, b_fwd_null_beta, 0, INV, "beta: data is NULL"},
    {"fwd_null_o", OP_FWD, NULL, b_fwd_null_o, 0, INV, "o: data is NULL"},
    {"fwd_gate_null_A_log", OP_FWD, m_gate, b_fwd_null_A_log, 0, INV, "A_log"},
    {"fwd_gate_null_dt_bias", OP_FWD, m_gate, b_fwd_null_dt_bias, 0, INV, "dt_bias"},
    {"fwd_A_log_without_gate", OP_FWD, NULL, b_fwd_A_log_no_gate, 0, INV, "A_log"},
    {"fwd_T0_null_o_nonempty", OP_FWD, m_t0, b_fwd_T0_null_o_data, 0, INV, "o: data is NULL"},
    /* rank and sizes */
    {"fwd_q_ndim", OP_FWD, NULL, b_fwd_q_ndim, 0, INV, "q: ndim = 3"},
    {"fwd_q_ndim_7", OP_FWD, NULL, b_fwd_q_ndim7, 0, INV, "q: ndim = 7"},
    {"fwd_g_ndim", OP_FWD, NULL, b_fwd_g_ndim, 0, INV, "g: ndim"},
    {"fwd_H_zero", OP_FWD, NULL, b_fwd_H0, 0, INV, "q: shape[2] = 0"},
    {"fwd_B_negative", OP_FWD, NULL, b_fwd_B_neg, 0, INV, "q: shape[0] = -2"},
    {"fwd_V_zero", OP_FWD, NULL, b_fwd_V0, 0, INV, "v: shape[3] = 0"},
    /* shapes that disagree */
    {"fwd_HV_not_multiple_of_H", OP_FWD, m_hv3, b_nop, 0, INV, "v: HV"},
    {"fwd_k_heads_differ", OP_FWD, NULL, b_fwd_k_heads, 0, INV, "k: shape[2] = 1 but q has H = 2"},
    {"fwd_k_dim_differs", OP_FWD, NULL, b_fwd_k_dim, 0, INV, "k: shape[3]"},
    {"fwd_v_T_differs", OP_FWD, NULL, b_fwd_v_T, 0, INV, "v: shape[1]"},
    {"fwd_o_heads_differ", OP_FWD, NULL, b_fwd_o_heads, 0, INV, "o: shape[2]"},
    {"fwd_o_V_differs", OP_FWD, NULL, b_fwd_o_V, 0, INV, "o: shape[3]"},
    {"fwd_g_shape", OP_FWD, NULL, b_fwd_g_shape, 0, INV, "g: shape[2]"},
    {"fwd_beta_shape", OP_FWD, NULL, b_fwd_beta_shape, 0, INV, "beta: shape[0]"},
    {"fwd_A_log_shape", OP_FWD, m_gate, b_fwd_A_log_shape, 0, INV, "A_log: shape[0]"},
    /* dtypes */
    {"fwd_k_dtype", OP_FWD, NULL, b_fwd_k_dtype, 0, INV, "k: dtype BF16"},
    {"fwd_o_dtype", OP_FWD, NULL, b_fwd_o_dtype, 0, INV, "o: dtype F16"},
    {"fwd_q_int_dtype", OP_FWD, NULL, b_fwd_q_int, 0, INV, "q: dtype I32"},
    {"fwd_dtype_not_an_enum", OP_FWD, NULL, b_fwd_dtype_garbage, 0, INV, "v: dtype"},
    {"fwd_g_f16", OP_FWD, NULL, b_fwd_g_f16, 0, INV, "g: dtype F16"},
    {"fwd_beta_dtype_not_g", OP_FWD, NULL, b_fwd_beta_vs_g, 0, INV, "beta: dtype BF16"},
    {"fwd_state_f16", OP_FWD, NULL, b_fwd_h0_f16, 0, INV, "initial_state: dtype F16"},
    {"fwd_A_log_bf16", OP_FWD, m_gate, b_fwd_A_log_bf16, 0, INV, "A_log: dtype BF16"},
    /* strides, overlap, aliasing */
    {"fwd_last_stride_not_1", OP_FWD, NULL, b_fwd_q_last_stride, 0, INV, "q: stride[3] = 2"},
    {"fwd_negative_stride", OP_FWD, NULL, b_fwd_v_neg_stride, 0, INV, "v: stride[1]"},
    {"fwd_output_zero_stride", OP_FWD, NULL, b_fwd_o_zero_stride, 0, INV, "o: strides"},
    {"fwd_output_heads_overlap", OP_FWD, NULL, b_fwd_o_heads_overlap, 0, INV, "o: strides"},
    {"fwd_final_state_overlap", OP_FWD, NULL, b_fwd_ht_overlap, 0, INV, "final_state: strides"},
    {"fwd_o_aliases_v", OP_FWD, NULL, b_fwd_o_alias_v, 0, INV, "o: memory overlaps input v"},
    {"fwd_o_partly_aliases_q", OP_FWD, NULL, b_fwd_o_alias_q_tail, 0, INV, "o: memory overlaps input q"},
    {"fwd_final_state_aliases_initial", OP_FWD, NULL, b_fwd_ht_alias_h0, 0, INV, "final_state: memory overlaps input initial_state"},
    {"fwd_final_state_aliases_o", OP_FWD, NULL, b_fwd_ht_alias_o, 0, INV, "overlaps output"},
    /* alignment (CUDA rules: host_readable = 0) */
    {"fwd_g_not_element_aligned", OP_FWD, NULL, b_fwd_g_odd_pointer, 0, MIS, "g: data pointer"},
    {"bwd_d_final_state_not_element_aligned", OP_BWD, NULL, b_bwd_dht_odd_pointer, 0, MIS, "d_final_state: data pointer"},
    {"fwd_cuda_q_misaligned", OP_FWD, NULL, b_fwd_q_misaligned, 1, MIS, "q: data pointer"},
    {"fwd_cuda_o_misaligned", OP_FWD, NULL, b_fwd_o_misaligned, 1, MIS, "o: data pointer"},
    {"fwd_cuda_k_stride_misaligned", OP_FWD, NULL, b_fwd_k_stride_misaligned, 1, MIS, "k: stride[2] = 33 elements"},
    {"fwd_cuda_v_bf16_stride_misaligned", OP_FWD, NULL, b_fwd_v_bf16_stride_misaligned, 1, MIS, "v: stride[2] = 20"},
    /* cu_seqlens */
    {"fwd_cu_dtype", OP_FWD, m_varlen, b_fwd_cu_dtype, 0, INV, "cu_seqlens: dtype F32"},
    {"fwd_cu_one_entry", OP_FWD, m_varlen, b_fwd_cu_short, 0, INV, "cu_seqlens: shape[0] = 1"},
    {"fwd_cu_ndim", OP_FWD, m_varlen, b_fwd_cu_ndim, 0, INV, "cu_seqlens: ndim = 2"},
    {"fwd_cu_not_from_0", OP_FWD, m_varlen, b_fwd_cu_start, 0, INV, "cu_seqlens[0] = 2"},
    {"fwd_cu_decreasing", OP_FWD, m_varlen, b_fwd_cu_decreasing, 0, INV, "cu_seqlens[2] = 3"},
    {"fwd_cu_past_T", OP_FWD, m_varlen, b_fwd_cu_past_T, 0, INV, "cu_seqlens[3] = 10 ends past T = 9"},
    {"fwd_cu_with_B_2", OP_FWD, NULL, b_fwd_cu_B2, 0, INV, "cu_seqlens: given with B = 2"},
    {"fwd_cu_host_differs", OP_FWD, m_varlen, b_fwd_cu_host_differs, 0, INV, "cu_seqlens_host[2] = 5"},
    {"fwd_cu_host_inside_o", OP_FWD, m_varlen, b_fwd_cu_host_inside_o, 0, INV, "o: memory overlaps input cu_seqlens_host"},
    {"fwd_q_shape_overflow_contiguous", OP_FWD, NULL, b_fwd_q_shape_overflow, 0, OVF, "q: the element count"},
    {"fwd_cpu_final_state_f64", OP_FWD, NULL, b_fwd_cpu_final_state_f64, 0, NSUP, "final_state: dtype f64"},
    {"fwd_cuda_cu_host_past_T", OP_FWD, m_varlen, b_fwd_cu_host_past_T, 1, INV, "cu_seqlens_host[3] = 12"},
    {"fwd_cu_host_without_tensor", OP_FWD, NULL, b_fwd_cu_host_alone, 0, INV, "cu_seqlens_host"},
    /* states */
    {"fwd_initial_state_count", OP_FWD, m_varlen, b_fwd_h0_count, 0, INV, "initial_state: shape[0] = 4"},
    {"fwd_final_state_count", OP_FWD, NULL, b_fwd_ht_count, 0, INV, "final_state: shape[0] = 1"},
    {"fwd_T0_initial_state_count", OP_FWD, m_t0, b_fwd_T0_h0_count, 0, INV, "initial_state: shape[0] = 3"},
    {"fwd_state_layout_v_first", OP_FWD, m_v_first, b_fwd_h0_layout, 0, INV, "initial_state: shape[2] = 32"},
    {"fwd_state_layout_k_first", OP_FWD, NULL, b_fwd_ht_layout, 0, INV, "final_state: shape[2] = 16"},
    /* options */
    {"fwd_scale_nan", OP_FWD, NULL, b_fwd_scale_nan, 0, INV, "opt.scale"},
    {"fwd_scale_inf", OP_FWD, NULL, b_fwd_scale_inf, 0, INV, "opt.scale"},
    {"fwd_scale_negative", OP_FWD, NULL, b_fwd_scale_neg, 0, INV, "opt.scale = -0.125"},
    {"fwd_neg_eigval_without_sigmoid", OP_FWD, NULL, b_fwd_neg_eig, 0, INV, "opt.allow_neg_eigval"},
    /* overflow */
    {"fwd_numel_overflow", OP_FWD, NULL, b_fwd_numel_overflow, 0, OVF, "q: the element count"},
    {"fwd_stride_overflow", OP_FWD, NULL, b_fwd_stride_overflow, 0, OVF, "v: its largest element offset"},
    {"fwd_stride_product_overflow", OP_FWD, NULL, b_fwd_stride_product_overflow, 0, OVF, "k: (shape[1] - 1) * stride[1]"},
    {"fwd_state_size_overflow", OP_FWD, NULL, b_fwd_state_product_overflow, 0, OVF, "K * V"},

    /* backward */
    {"bwd_null_d_o", OP_BWD, NULL, b_bwd_null_d_o, 0, INV, "d_o: data is NULL"},
    {"bwd_null_dq", OP_BWD, NULL, b_bwd_null_dq, 0, INV, "dq: data is NULL"},
    {"bwd_null_dk", OP_BWD, NULL, b_bwd_null_dk, 0, INV, "dk: data is NULL"},
    {"bwd_null_dv", OP_BWD, NULL, b_bwd_null_dv, 0, INV, "dv: data is NULL"},
    {"bwd_null_dg", OP_BWD, NULL, b_bwd_null_dg, 0, INV, "dg: data is NULL"},
    {"bwd_null_dbeta", OP_BWD, NULL, b_bwd_null_dbeta, 0, INV, "dbeta: data is NULL"},
    {"bwd_h0_without_d_initial_state", OP_BWD, NULL, b_bwd_null_dh0, 0, INV, "d_initial_state"},
    {"bwd_d_initial_state_without_h0", OP_BWD, m_no_h0, b_bwd_dh0_without_h0, 0, INV, "d_initial_state"},
    {"bwd_gate_null_dA_log", OP_BWD, m_gate, b_bwd_null_dA_log, 0, INV, "dA_log: data is NULL"},
    {"bwd_gate_null_ddt_bias", OP_BWD, m_gate, b_bwd_null_ddt_bias, 0, INV, "ddt_bias: data is NULL"},
    {"bwd_dA_log_without_gate", OP_BWD, NULL, b_bwd_dA_log_no_gate, 0, INV, "dA_log"},
    /* some of dq, dk, dv, dg, dbeta absent but not all: the first absent one is named */
    {"bwd_partial_only_dbeta_given", OP_BWD, NULL, b_bwd_only_dbeta_given, 0, INV, "dq: data is NULL"},
    {"bwd_partial_only_dq_given", OP_BWD, NULL, b_bwd_only_dq_given, 0, INV, "dk: data is NULL"},
    {"bwd_partial_dg_dbeta_absent", OP_BWD, NULL, b_bwd_dg_dbeta_absent, 0, INV, "dg: data is NULL"},
    {"bwd_partial_cuda_rules", OP_BWD, NULL, b_bwd_dg_dbeta_absent, 1, INV, "dg: data is NULL"},
    /* all five absent asks for d_initial_state alone: it needs initial_state, and
     * dA_log / ddt_bias must be absent */
    {"bwd_five_absent_without_h0", OP_BWD, m_no_h0, b_bwd_five_absent, 0, INV, "dq: data is NULL"},
    {"bwd_dh0_only_with_dA_log", OP_BWD, m_gate, b_bwd_dh0_only_dA_log, 0, INV, "dA_log: given but dq, dk, dv, dg and dbeta are absent"},
    {"bwd_dh0_only_with_ddt_bias", OP_BWD, m_gate, b_bwd_dh0_only_ddt_bias, 0, INV, "ddt_bias: given but dq, dk, dv, dg and dbeta are absent"},
    {"bwd_dh0_only_dA_log_without_gate", OP_BWD, NULL, b_bwd_dh0_only_dA_log_no_gate, 0, INV, "dA_log: given but opt.use_gate_in_kernel is 0"},
    {"bwd_dq_heads", OP_BWD, NULL, b_bwd_dq_heads, 0, INV, "dq: shape[2] = 4 but q has H = 2"},
    {"bwd_dv_shape", OP_BWD, NULL, b_bwd_dv_shape, 0, INV, "dv: shape[3]"},
    {"bwd_d_o_dtype", OP_BWD, NULL, b_bwd_d_o_dtype, 0, INV, "d_o: dtype BF16"},
    {"bwd_dg_bf16", OP_BWD, NULL, b_bwd_dg_bf16, 0, INV, "dg: dtype BF16"},
    {"bwd_dk_aliases_dq", OP_BWD, NULL, b_bwd_dk_alias_dq, 0, INV, "dk"},
    {"bwd_dv_aliases_d_o", OP_BWD, NULL, b_bwd_dv_alias_d_o, 0, INV, "dv: memory overlaps input d_o"},
    {"bwd_dg_aliases_g", OP_BWD, NULL, b_bwd_dg_alias_g, 0, INV, "dg: memory overlaps input g"},
    {"bwd_d_final_state_count", OP_BWD, NULL, b_bwd_dht_count, 0, INV, "d_final_state: shape[0] = 3"},
    {"bwd_dbeta_overlapping_view", OP_BWD, NULL, b_bwd_dbeta_overlap, 0, INV, "dbeta: strides"},
    {"bwd_cuda_d_o_misaligned", OP_BWD, NULL, b_bwd_d_o_misaligned, 1, MIS, "d_o: data pointer"},
    {"bwd_cuda_dq_misaligned", OP_BWD, NULL, b_bwd_dq_misaligned, 1, MIS, "dq: data pointer"},
    {"bwd_scale_nan", OP_BWD, NULL, b_bwd_scale_nan, 0, INV, "opt.scale"},

    /* decode and verify */
    {"decode_null_state_pool", OP_DECODE, NULL, b_dec_null_pool, 0, INV, "state_pool: data is NULL"},
    {"decode_null_slots", OP_DECODE, NULL, b_dec_null_slots, 0, INV, "slots: data is NULL"},
    {"decode_null_o", OP_DECODE, NULL, b_dec_null_o, 0, INV, "o: data is NULL"},
    {"decode_T_2", OP_DECODE, m_t2, b_nop, 0, INV, "q: shape[1] = T = 2"},
    {"decode_k_T_differs", OP_DECODE, NULL, b_dec_T2, 0, INV, "v: shape[1] = 1 but q has T = 2"},
    {"decode_slot_ge_P", OP_DECODE, NULL, b_dec_slot_ge_P, 0, INV, "slots[2] = 5 but state_pool has P = 5"},
    {"decode_duplicate_slots", OP_DECODE, NULL, b_dec_slot_dup, 0, INV, "slots[0] = slots[2] = 4"},
    {"decode_slots_dtype", OP_DECODE, NULL, b_dec_slots_dtype, 0, INV, "slots: dtype F32"},
    {"decode_slots_shape", OP_DECODE, NULL, b_dec_slots_shape, 0, INV, "slots: shape[0] = 2 but q has B = 3"},
    {"decode_cuda_slots_host_ge_P", OP_DECODE, NULL, b_dec_slots_host_ge_P, 1, INV, "slots_host[1] = 9 but state_pool has P = 5"},
    {"decode_cuda_slots_host_duplicate", OP_DECODE, NULL, b_dec_slots_host_dup, 1, INV, "slots_host"},
    {"decode_slots_host_differs", OP_DECODE, NULL, b_dec_slots_host_differs, 0, INV, "slots_host[2] = 1 but slots[2] = 2"},
    {"decode_pool_layout", OP_DECODE, NULL, b_dec_pool_layout, 0, INV, "state_pool: shape[2]"},
    {"decode_pool_heads", OP_DECODE, NULL, b_dec_pool_heads, 0, INV, "state_pool: shape[1] = 2"},
    {"decode_pool_f16", OP_DECODE, NULL, b_dec_pool_f16, 0, INV, "state_pool: dtype F16"},
    {"decode_o_aliases_pool", OP_DECODE, NULL, b_dec_o_alias_pool, 0, INV, "overlaps"},
    {"decode_q_inside_pool", OP_DECODE, NULL, b_dec_pool_alias_q, 0, INV, "state_pool: memory overlaps input q"},
    {"decode_step_states_given", OP_DECODE, NULL, b_dec_step_states, 0, INV, "step_states"},
    {"decode_neg_eigval_without_sigmoid", OP_DECODE, NULL, b_dec_neg_eig, 0, INV, "opt.allow_neg_eigval"},
    {"verify_scale_negative", OP_VERIFY, NULL, b_dec_scale_neg, 0, INV, "opt.scale = -1"},
    {"decode_cuda_q_misaligned", OP_DECODE, NULL, b_dec_q_misaligned, 1, MIS, "q: data pointer"},
    {"verify_neither_step_output", OP_VERIFY, NULL, b_ver_neither, 0, INV, "step_states and step_slots: neither"},
    {"verify_both_step_outputs", OP_VERIFY, NULL, b_ver_both, 0, INV, "step_states and step_slots: both"},
    {"verify_step_slot_ge_P", OP_VERIFY, m_ver_pool12, b_ver_step_ge_P, 0, INV, "step_slots[2, 1] = 12 but state_pool has P = 12"},
    {"verify_step_slot_duplicate", OP_VERIFY, m_ver_pool12, b_ver_step_dup, 0, INV, "step_slots"},
    {"verify_step_slot_hits_slot", OP_VERIFY, m_ver_pool12, b_ver_step_hits_slot, 0, INV, "slots[0] = step_slots[2, 1] = 11"},
    {"verify_step_slots_shape", OP_VERIFY, m_ver_pool12, b_ver_step_shape, 0, INV, "step_slots: shape[1] = 2"},
    {"verify_step_states_shape", OP_VERIFY, NULL, b_ver_step_states_shape, 0, INV, "step_states: shape[1] = 4"},
    {"verify_step_states_dtype", OP_VERIFY, NULL, b_ver_step_states_dtype, 0, INV, "step_states: dtype BF16"},
    {"verify_step_states_alias_pool", OP_VERIFY, NULL, b_ver_step_states_alias_pool, 0, INV, "overlaps"},
};

/* ------------------------------------------------------------------------ */
/* Context checks                                                             */

static void null_context(void)
{
    cfg c = default_cfg(OP_FWD);
    fx f;
    if (!fx_setup(&f, &c, OP_FWD)) return;
    fx_snapshot(&f);
    fqla_status st = fqla_fwd(NULL, &f.fa, NULL, 0, NULL);
    CHECK(st == FQLA_STATUS_INVALID_CONTEXT, "fwd(NULL ctx): %s", fqla_status_string(st));
    CHECK(strstr(fqla_last_error(NULL), "ctx") != NULL, "message \"%s\"", fqla_last_error(NULL));
    st = fqla_decode_supported(NULL, &f.da);
    CHECK(st == FQLA_STATUS_INVALID_CONTEXT, "decode_supported(NULL ctx): %s", fqla_status_string(st));
    fx_check_untouched(&f);
    fx_free(&f);
}

static void destroyed_context(void)
{
    cfg c = default_cfg(OP_BWD);
    fx f;
    size_t bytes = 1;
    if (!fx_setup(&f, &c, OP_BWD)) return;
    fx_snapshot(&f);
    fqla_context *dead = f.ctx;
    fqla_context_destroy(dead);
    f.ctx = NULL;
    fqla_status st = fqla_bwd(dead, &f.ba, NULL, 0, NULL);
    CHECK(st == FQLA_STATUS_INVALID_CONTEXT, "bwd(destroyed ctx): %s", fqla_status_string(st));
    CHECK(strstr(fqla_last_error(dead), "ctx") != NULL, "message \"%s\"", fqla_last_error(dead));
    st = fqla_bwd_workspace_size(dead, &f.ba, &bytes);
    CHECK(st == FQLA_STATUS_INVALID_CONTEXT && bytes == 0, "bwd_workspace_size(destroyed ctx): %s, %zu",
          fqla_status_string(st), bytes);
    fx_check_untouched(&f);
    fx_free(&f);
}

static void null_args(void)
{
    fqla_context *ctx = NULL;
    size_t bytes = 7;
    if (fqla_context_create(&ctx, FQLA_BACKEND_CPU, 0) != FQLA_STATUS_SUCCESS) {
        CHECK(0, "context_create failed: %s", fqla_last_error(NULL));
        return;
    }
    CHECK(fqla_fwd(ctx, NULL, NULL, 0, NULL) == FQLA_STATUS_INVALID_VALUE, "fwd(NULL args)");
    CHECK(strstr(fqla_last_error(ctx), "args") != NULL, "message \"%s\"", fqla_last_error(ctx));
    CHECK(fqla_verify_workspace_size(ctx, NULL, &bytes) == FQLA_STATUS_INVALID_VALUE && bytes == 0,
          "verify_workspace_size(NULL args)");
    fqla_problem p;
    fqla_context *held = fqla_context_acquire(ctx);
    CHECK(fqla_validate_decode(held, NULL, 0, 1, &p) == FQLA_STATUS_INVALID_VALUE, "validate_decode(NULL args)");
    fqla_context_release(held);
    fqla_context_destroy(ctx);
}

/* A message is a full sentence naming the argument, for every status. */
static void supported_and_workspace_agree(void)
{
    /* the query calls reject exactly like the run: same status, same message */
    cfg c = default_cfg(OP_FWD);
    fx f;
    size_t bytes = 99;
    char first[FQLA_ERROR_LEN];
    if (!fx_setup(&f, &c, OP_FWD)) return;
    f.fa.k.shape[2] = 3;
    fx_snapshot(&f);
    fqla_status s1 = fqla_fwd(f.ctx, &f.fa, NULL, 0, NULL);
    snprintf(first, sizeof first, "%s", fqla_last_error(f.ctx));
    fqla_status s2 = fqla_fwd_supported(f.ctx, &f.fa);
    CHECK(strcmp(first, fqla_last_error(f.ctx)) == 0, "messages differ: \"%s\" / \"%s\"", first,
          fqla_last_error(f.ctx));
    fqla_status s3 = fqla_fwd_workspace_size(f.ctx, &f.fa, &bytes);
    CHECK(s1 == FQLA_STATUS_INVALID_VALUE && s2 == s1 && s3 == s1, "statuses %d %d %d", s1, s2, s3);
    CHECK(bytes == 0, "workspace_size wrote %zu on failure", bytes);
    CHECK(strstr(first, "k: shape[2] = 3 but q has H = 2") != NULL, "message \"%s\"", first);
    fx_check_untouched(&f);
    fx_free(&f);
}

/* ------------------------------------------------------------------------ */
/* Legal but unusual inputs                                                   */

static void expect_valid(fx *f, int op, int host_readable, fqla_problem *p)
{
    fqla_status st = fx_validate(f, op, host_readable, p);
    CHECK(st == FQLA_STATUS_SUCCESS, "validation rejected a legal input: %s: %s",
          fqla_status_string(st), fqla_last_error(f->ctx));
}

/* Runs op on the fp64 reference backend; it covers any head dim, so a
 * failure here is a real one. */
static void expect_run(fx *f, int op)
{
    fqla_status st = fx_call(f, op);
    CHECK(st == FQLA_STATUS_SUCCESS, "legal call failed: %s: %s", fqla_status_string(st),
          fqla_last_error(f->ctx));
    CHECK(fqla_last_error(f->ctx)[0] == '\0', "message after success: \"%s\"", fqla_last_error(f->ctx));
}

/* The fast CPU backend is written alongside these tests: a run it does not
 * implement yet (NOT_SUPPORTED) is noted, anything else must succeed. */
static int expect_cpu_run(fx *f, int op)
{
    fqla_status st = fx_call(f, op);
    if (st == FQLA_STATUS_NOT_SUPPORTED) {
        printf("     note: CPU backend: %s\n", fqla_last_error(f->ctx));
        return 0;
    }
    CHECK(st == FQLA_STATUS_SUCCESS, "legal call failed: %s: %s", fqla_status_string(st),
          fqla_last_error(f->ctx));
    return st == FQLA_STATUS_SUCCESS;
}

static int has_sentinel_f32(const fqla_tensor *t)
{
    int64_t n = fqla_tensor_numel(t);
    uint32_t pat;
    memset(&pat, SENTINEL_BYTE, sizeof pat);
    for (int64_t i = 0; i < n; i++)
        if (memcmp((const uint32_t *)t->data + i, &pat, 4) == 0) return 1;
    return 0;
}

static void ok_fwd_problem(void)
{
    cfg c = default_cfg(OP_FWD);
    fx f;
    fqla_problem p;
    c.backend = FQLA_BACKEND_CPU_REFERENCE;
    c.gate_in_kernel = 1;
    if (!fx_setup(&f, &c, OP_FWD)) return;
    f.fa.opt.use_qk_l2norm = 5; /* any non-zero value means "on" */
    f.fa.opt.use_beta_sigmoid = 2;
    f.fa.opt.allow_neg_eigval = 1;
    expect_valid(&f, OP_FWD, 1, &p);
    CHECK(p.op == FQLA_OP_FWD && p.B == 2 && p.T == 9 && p.H == 2 && p.HV == 4 && p.K == 32 && p.V == 16,
          "shapes B %lld T %lld H %lld HV %lld K %lld V %lld", (long long)p.B, (long long)p.T,
          (long long)p.H, (long long)p.HV, (long long)p.K, (long long)p.V);
    CHECK(p.N == 2 && p.group == 2 && !p.varlen && p.P == 0, "N %lld group %lld", (long long)p.N, (long long)p.group);
    CHECK(fabs(p.scale - 1.0 / sqrt(32.0)) < 1e-15, "default scale %g", p.scale);
    CHECK(p.opt.use_qk_l2norm == 1 && p.opt.use_beta_sigmoid == 1 && p.opt.allow_neg_eigval == 1 &&
          p.opt.use_gate_in_kernel == 1 && p.opt.state_v_first == 0, "flags not normalised");
    CHECK(p.io_dtype == FQLA_DTYPE_F32 && p.gate_dtype == FQLA_DTYPE_F32 && p.state_dtype == FQLA_DTYPE_F32, "dtypes");
    for (int64_t n = 0; n < p.N; n++) {
        int64_t b, s, l;
        fqla_seq_bounds(&p, n, &b, &s, &l);
        CHECK(b == n && s == 0 && l == 9, "seq %lld: %lld %lld %lld", (long long)n, (long long)b, (long long)s, (long long)l);
    }
    f.fa.opt.scale = 0.3;
    expect_valid(&f, OP_FWD, 1, &p);
    CHECK(p.scale == 0.3, "explicit scale %g", p.scale);
    expect_run(&f, OP_FWD);
    CHECK(!has_sentinel_f32(&f.fa.o) && !has_sentinel_f32(&f.fa.final_state), "outputs not fully written");
    fx_free(&f);
}

static void ok_T0_no_op(void)
{
    cfg c = default_cfg(OP_FWD);
    fx f;
    fqla_problem p;
    c.backend = FQLA_BACKEND_CPU_REFERENCE;
    c.T = 0;
    if (!fx_setup(&f, &c, OP_FWD)) return;
    expect_valid(&f, OP_FWD, 1, &p);
    CHECK(p.T == 0 && p.N == 2, "T %lld N %lld", (long long)p.T, (long long)p.N);
    expect_run(&f, OP_FWD);
    /* frameworks hand out NULL data for empty tensors */
    f.fa.q.data = f.fa.k.data = f.fa.v.data = f.fa.g.data = f.fa.beta.data = f.fa.o.data = NULL;
    expect_valid(&f, OP_FWD, 1, &p);
    expect_valid(&f, OP_FWD, 0, &p);
    expect_run(&f, OP_FWD);
    /* an empty tensor's strides may be huge: stride * element size exceeds
     * int64 in the alignment rule (found by the fuzzer) */
    f.fa.q.strides[0] = (int64_t)1 << 62;
    expect_valid(&f, OP_FWD, 0, &p);
    fx_free(&f);

    /* varlen with no tokens at all: cu_seqlens = [0, 0] */
    c = default_cfg(OP_BWD);
    c.backend = FQLA_BACKEND_CPU_REFERENCE;
    c.B = 1; c.T = 0; c.ncu = 2; c.cu[0] = 0; c.cu[1] = 0;
    if (!fx_setup(&f, &c, OP_BWD)) return;
    expect_valid(&f, OP_BWD, 1, &p);
    CHECK(p.N == 1 && p.varlen, "N %lld", (long long)p.N);
    expect_run(&f, OP_BWD);
    fx_free(&f);
}

static void ok_varlen_zero_length_and_trailing(void)
{
    static const int64_t cus[2][4] = {{0, 4, 4, 9}, {0, 0, 3, 7}}; /* zero-length; trailing rows 7, 8 */
    for (int v = 0; v < 2; v++) {
        for (int dt = 0; dt < 2; dt++) {
            cfg c = default_cfg(OP_FWD);
            fx f;
            fqla_problem p;
            c.backend = FQLA_BACKEND_CPU_REFERENCE;
            c.B = 1; c.ncu = 4;
            memcpy(c.cu, cus[v], sizeof cus[v]);
            if (!fx_setup(&f, &c, OP_FWD)) return;
            if (dt) f.fa.cu_seqlens = fx_ints(&f, FQLA_DTYPE_I64, 4, cus[v]);
            expect_valid(&f, OP_FWD, 1, &p);
            CHECK(p.varlen && p.N == 3 && p.cu == &f.fa.cu_seqlens && !p.cu_host, "varlen problem");
            for (int64_t n = 0; n < 3; n++) {
                int64_t b, s, l;
                fqla_seq_bounds(&p, n, &b, &s, &l);
                CHECK(b == 0 && s == cus[v][n] && l == cus[v][n + 1] - cus[v][n], "seq %lld (%s): %lld %lld %lld",
                      (long long)n, dt ? "I64" : "I32", (long long)b, (long long)s, (long long)l);
            }
            /* CUDA rules: values come only from the host copy */
            memcpy(f.host, cus[v], sizeof cus[v]);
            f.fa.cu_seqlens_host = f.host;
            expect_valid(&f, OP_FWD, 0, &p);
            CHECK(p.cu == NULL && p.cu_host == f.host, "CUDA problem reads the host copy");
            for (int64_t n = 0; n < 3; n++) {
                int64_t b, s, l;
                fqla_seq_bounds(&p, n, &b, &s, &l);
                CHECK(s == cus[v][n] && l == cus[v][n + 1] - cus[v][n], "host seq %lld", (long long)n);
            }
            expect_run(&f, OP_FWD);
            fx_free(&f);
        }
    }
}

/* Without a host copy, CUDA validation must not read cu_seqlens or slots
 * values (they are device memory): garbage values pass. */
static void ok_cuda_does_not_read_values(void)
{
    cfg c = default_cfg(OP_FWD);
    fx f;
    fqla_problem p;
    c.B = 1; c.ncu = 4; c.cu[0] = 0; c.cu[1] = 4; c.cu[2] = 4; c.cu[3] = 9;
    if (!fx_setup(&f, &c, OP_FWD)) return;
    put(f.fa.cu_seqlens.data, FQLA_DTYPE_I32, 0, 77);
    put(f.fa.cu_seqlens.data, FQLA_DTYPE_I32, 2, -5);
    expect_valid(&f, OP_FWD, 0, &p);
    CHECK(p.N == 3 && p.cu == NULL, "N %lld", (long long)p.N);
    fx_free(&f);

    c = default_cfg(OP_DECODE);
    if (!fx_setup(&f, &c, OP_DECODE)) return;
    put(f.da.slots.data, FQLA_DTYPE_I32, 0, 1000);
    put(f.da.slots.data, FQLA_DTYPE_I32, 2, 1000);
    expect_valid(&f, OP_DECODE, 0, &p);
    CHECK(p.P == 5 && p.N == 3 && p.op == FQLA_OP_DECODE, "decode problem P %lld", (long long)p.P);
    fx_free(&f);
}

/* Copies t's logical elements into a new tensor with the given strides. */
static fqla_tensor restride(fx *f, const fqla_tensor *t, const int64_t *strides, enum fill fill)
{
    fqla_tensor r = fx_tensor(f, t->dtype, t->ndim, t->shape, strides, fill);
    int64_t idx[FQLA_MAX_DIMS] = {0};
    int64_t n = fqla_tensor_numel(t);
    if (fill == FILL_SENTINEL) return r;
    for (int64_t e = 0; e < n; e++) {
        fqla_store(&r, fqla_offset(&r, idx), fqla_load(t, fqla_offset(t, idx)));
        for (int d = t->ndim - 1; d >= 0 && ++idx[d] == t->shape[d]; d--) idx[d] = 0;
    }
    return r;
}

static int same_values(const fqla_tensor *a, const fqla_tensor *b)
{
    int64_t idx[FQLA_MAX_DIMS] = {0};
    int64_t n = fqla_tensor_numel(a);
    for (int64_t e = 0; e < n; e++) {
        double x = fqla_load(a, fqla_offset(a, idx)), y = fqla_load(b, fqla_offset(b, idx));
        if (memcmp(&x, &y, sizeof x) != 0) return 0;
        for (int d = a->ndim - 1; d >= 0 && ++idx[d] == a->shape[d]; d--) idx[d] = 0;
    }
    return 1;
}

/* Legal non-contiguous views (a head-major q, padded rows, a strided o) are
 * accepted and give bit-identical results to contiguous copies. */
static void ok_strided_views(void)
{
    cfg c = default_cfg(OP_FWD);
    fx f;
    fqla_problem p;
    c.backend = FQLA_BACKEND_CPU_REFERENCE;
    if (!fx_setup(&f, &c, OP_FWD)) return;
    fqla_fwd_args contiguous = f.fa;
    expect_run(&f, OP_FWD);
    int64_t B = c.B, T = c.T, H = c.H, HV = c.HV, K = c.K, V = c.V;
    f.fa.q = restride(&f, &contiguous.q, SHAPE(H * T * K, K, T * K, 1), FILL_NORMAL);        /* [B, H, T, K] storage */
    f.fa.k = restride(&f, &contiguous.k, SHAPE(T * H * (K + 8), H * (K + 8), K + 8, 1), FILL_NORMAL); /* padded rows */
    f.fa.v = restride(&f, &contiguous.v, SHAPE(T * HV * V * 2, HV * V * 2, V * 2, 1), FILL_NORMAL);
    f.fa.g = restride(&f, &contiguous.g, SHAPE(HV, B * HV, 1), FILL_NORMAL);                /* [T, B, HV] storage */
    f.fa.o = restride(&f, &contiguous.o, SHAPE(HV * V, B * HV * V, V, 1), FILL_SENTINEL);   /* [T, B, HV, V] storage */
    f.fa.final_state = restride(&f, &contiguous.final_state, SHAPE(HV * K * (V + 4), K * (V + 4), V + 4, 1), FILL_SENTINEL);
    (void)B;
    expect_valid(&f, OP_FWD, 1, &p);
    expect_run(&f, OP_FWD);
    CHECK(same_values(&f.fa.o, &contiguous.o), "strided o differs from the contiguous run");
    CHECK(same_values(&f.fa.final_state, &contiguous.final_state), "strided final_state differs");
    fx_free(&f);
}

static void ok_state_v_first(void)
{
    cfg c = default_cfg(OP_BWD);
    fx f;
    fqla_problem p;
    c.backend = FQLA_BACKEND_CPU_REFERENCE;
    c.v_first = 1;
    c.gate_in_kernel = 1;
    if (!fx_setup(&f, &c, OP_BWD)) return;
    expect_valid(&f, OP_BWD, 1, &p);
    CHECK(p.opt.state_v_first == 1 && p.state_dtype == FQLA_DTYPE_F32, "v_first problem");
    expect_run(&f, OP_BWD);
    CHECK(!has_sentinel_f32(&f.ba.dq) && !has_sentinel_f32(&f.ba.dg) && !has_sentinel_f32(&f.ba.d_initial_state) &&
          !has_sentinel_f32(&f.ba.dA_log), "gradients not fully written");
    fx_free(&f);
}

static void ok_decode_padding_and_verify_slots(void)
{
    cfg c = default_cfg(OP_DECODE);
    fx f;
    fqla_problem p;
    c.backend = FQLA_BACKEND_CPU_REFERENCE;
    if (!fx_setup(&f, &c, OP_DECODE)) return;
    /* slots {4, -1, 2}: sequence 1 is padding */
    expect_valid(&f, OP_DECODE, 1, &p);
    CHECK(p.N == 3 && p.P == 5 && p.T == 1, "decode problem");
    f.host[0] = 4; f.host[1] = -1; f.host[2] = 2;
    f.da.slots_host = f.host;
    expect_valid(&f, OP_DECODE, 0, &p);
    expect_run(&f, OP_DECODE);
    fx_free(&f);

    c = default_cfg(OP_VERIFY);
    c.backend = FQLA_BACKEND_CPU_REFERENCE;
    c.P = 12;
    if (!fx_setup(&f, &c, OP_VERIFY)) return;
    expect_valid(&f, OP_VERIFY, 1, &p);
    CHECK(p.op == FQLA_OP_VERIFY && p.T == 3, "verify problem");
    expect_run(&f, OP_VERIFY);
    /* steps of the padded sequence skipped (-1); the others distinct and free */
    set_steps(&f, SHAPE(0, 1, 2, -1, -1, -1, 3, 4, 5));
    expect_valid(&f, OP_VERIFY, 1, &p);
    expect_run(&f, OP_VERIFY);
    fx_free(&f);
}

/* CUDA rules with aligned tensors pass; a length-1 dimension's stride is free. */
static void ok_cuda_aligned(void)
{
    cfg c = default_cfg(OP_BWD);
    fx f;
    fqla_problem p;
    c.io = FQLA_DTYPE_BF16;
    c.B = 1;
    if (!fx_setup(&f, &c, OP_BWD)) return;
    f.ba.q.strides[0] = 3; /* B = 1: never used */
    expect_valid(&f, OP_BWD, 0, &p);
    CHECK(p.io_dtype == FQLA_DTYPE_BF16, "io dtype");
    fx_free(&f);
}

/* The fast CPU backend end to end: a plain forward, and the T = 0 /
 * zero-length-sequence no-ops, which must succeed on every backend. */
static void ok_cpu_backend(void)
{
    cfg c = default_cfg(OP_FWD);
    fx f;
    if (!fx_setup(&f, &c, OP_FWD)) return;
    fqla_status st = fqla_fwd_supported(f.ctx, &f.fa);
    if (st == FQLA_STATUS_SUCCESS) {
        if (expect_cpu_run(&f, OP_FWD)) CHECK(!has_sentinel_f32(&f.fa.o), "o not fully written");
    } else {
        CHECK(st != FQLA_STATUS_INVALID_VALUE && st != FQLA_STATUS_OVERFLOW, "validation rejected: %s",
              fqla_last_error(f.ctx));
        printf("     note: CPU backend does not run this yet: %s\n", fqla_last_error(f.ctx));
    }
    fx_free(&f);

    for (int op = OP_FWD; op <= OP_BWD; op++) {
        for (int varlen = 0; varlen < 2; varlen++) {
            c = default_cfg(op);
            c.T = 0;
            if (varlen) {
                c.B = 1; c.ncu = 3; c.cu[0] = c.cu[1] = c.cu[2] = 0;
            }
            if (!fx_setup(&f, &c, op)) return;
            if ((op == OP_FWD ? fqla_fwd_supported(f.ctx, &f.fa) : fqla_bwd_supported(f.ctx, &f.ba)) ==
                FQLA_STATUS_SUCCESS)
                expect_cpu_run(&f, op);
            fx_free(&f);
        }
    }
}

/* A decode batch made only of padding reads and writes no pool entry. */
static void ok_decode_all_padding(void)
{
    for (int backend = 0; backend < 2; backend++) {
        cfg c = default_cfg(OP_DECODE);
        fx f;
        fqla_problem p;
        c.backend = backend ? FQLA_BACKEND_CPU_REFERENCE : FQLA_BACKEND_CPU;
        if (!fx_setup(&f, &c, OP_DECODE)) return;
        for (int64_t b = 0; b < c.B; b++) put(f.da.slots.data, FQLA_DTYPE_I32, b, -1);
        expect_valid(&f, OP_DECODE, 1, &p);
        fx_snapshot(&f);
        if (fqla_decode_supported(f.ctx, &f.da) == FQLA_STATUS_SUCCESS &&
            (backend ? (expect_run(&f, OP_DECODE), 1) : expect_cpu_run(&f, OP_DECODE))) {
            int i = fx_index(&f, f.da.state_pool.data);
            CHECK(i >= 0 && memcmp(f.snap[i], f.buf[i], f.bytes[i]) == 0, "state_pool changed with every slot padded");
        }
        fx_free(&f);
    }
}

/* The forward of the final state alone (o absent, final_state given) is
 * legal on both CPU backends and writes final_state and nothing else; o is
 * not looked at (not its strides either). The values are
 * test_fwd_ht_only.c's. */
static void ok_fwd_ht_only(void)
{
    for (int v = 0; v < 2; v++) {
        cfg c = default_cfg(OP_FWD);
        fx f;
        fqla_problem p;
        c.backend = v ? FQLA_BACKEND_CPU_REFERENCE : FQLA_BACKEND_CPU;
        if (!fx_setup(&f, &c, OP_FWD)) return;
        void *o = f.fa.o.data;
        f.fa.o.data = NULL;
        f.fa.o.strides[0] = 3;
        expect_valid(&f, OP_FWD, 1, &p);
        CHECK(p.ht_only, "%s: not taken as the final state alone", v ? "reference" : "CPU");
        CHECK(fqla_fwd_supported(f.ctx, &f.fa) == FQLA_STATUS_SUCCESS, "supported: %s", fqla_last_error(f.ctx));
        fx_snapshot(&f);
        expect_run(&f, OP_FWD);
        int i = fx_index(&f, f.fa.final_state.data), io = fx_index(&f, o);
        CHECK(!has_sentinel_f32(&f.fa.final_state), "final_state not fully written");
        for (int j = 0; j < f.n; j++)
            CHECK(j == i || memcmp(f.snap[j], f.buf[j], f.bytes[j]) == 0, "buffer %d written besides final_state%s", j,
                  j == io ? " (o's)" : "");
        fx_free(&f);
    }
}

/* The backward of d_initial_state alone (all of dq, dk, dv, dg, dbeta absent)
 * is legal on both CPU backends, with or without the in-kernel gate (dA_log,
 * ddt_bias absent then); it writes all of d_initial_state and nothing else.
 * At T = 0 a given dA_log keeps the full backward (the five may be NULL there
 * as empty tensors). The values are test_bwd_dh0_only.c's. */
static void ok_bwd_dh0_only(void)
{
    for (int v = 0; v < 4; v++) {
        cfg c = default_cfg(OP_BWD);
        fx f;
        fqla_problem p;
        c.backend = v & 1 ? FQLA_BACKEND_CPU_REFERENCE : FQLA_BACKEND_CPU;
        c.gate_in_kernel = v >= 2;
        if (!fx_setup(&f, &c, OP_BWD)) return;
        b_bwd_five_absent(&f);
        f.ba.dA_log.data = f.ba.ddt_bias.data = NULL;
        /* absent tensors are not looked at: not their strides either */
        f.ba.dq.strides[0] = 3;
        expect_valid(&f, OP_BWD, 1, &p);
        CHECK(p.dh0_only, "%s: not taken as the backward of d_initial_state alone", c.backend ? "reference" : "CPU");
        expect_valid(&f, OP_BWD, 0, &p);
        CHECK(fqla_bwd_supported(f.ctx, &f.ba) == FQLA_STATUS_SUCCESS, "supported: %s", fqla_last_error(f.ctx));
        fx_snapshot(&f);
        expect_run(&f, OP_BWD);
        int i = fx_index(&f, f.ba.d_initial_state.data);
        CHECK(!has_sentinel_f32(&f.ba.d_initial_state), "d_initial_state not fully written");
        for (int j = 0; j < f.n; j++)
            CHECK(j == i || memcmp(f.snap[j], f.buf[j], f.bytes[j]) == 0, "buffer %d written besides d_initial_state", j);
        fx_free(&f);
    }

    cfg c = default_cfg(OP_BWD);
    fx f;
    fqla_problem p;
    c.backend = FQLA_BACKEND_CPU_REFERENCE;
    c.T = 0;
    c.gate_in_kernel = 1;
    if (!fx_setup(&f, &c, OP_BWD)) return;
    b_bwd_five_absent(&f);
    expect_valid(&f, OP_BWD, 1, &p);
    CHECK(!p.dh0_only, "T = 0 with dA_log given: not the full backward");
    expect_run(&f, OP_BWD);
    CHECK(!has_sentinel_f32(&f.ba.dA_log) && !has_sentinel_f32(&f.ba.d_initial_state), "T = 0: outputs not written");
    f.ba.dA_log.data = f.ba.ddt_bias.data = NULL;
    expect_valid(&f, OP_BWD, 1, &p);
    CHECK(p.dh0_only, "T = 0 without dA_log: not the backward of d_initial_state alone");
    expect_run(&f, OP_BWD);
    fx_free(&f);
}

int main(void)
{
    check_rng_seed(check_seed());
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        cur_case = &bad_cases[i];
        check_run(bad_cases[i].name, run_bad_case);
    }
    CHECK_RUN(null_context);
    CHECK_RUN(destroyed_context);
    CHECK_RUN(null_args);
    CHECK_RUN(supported_and_workspace_agree);
    CHECK_RUN(ok_fwd_problem);
    CHECK_RUN(ok_T0_no_op);
    CHECK_RUN(ok_varlen_zero_length_and_trailing);
    CHECK_RUN(ok_cuda_does_not_read_values);
    CHECK_RUN(ok_strided_views);
    CHECK_RUN(ok_state_v_first);
    CHECK_RUN(ok_decode_padding_and_verify_slots);
    CHECK_RUN(ok_cuda_aligned);
    CHECK_RUN(ok_cpu_backend);
    CHECK_RUN(ok_decode_all_padding);
    CHECK_RUN(ok_bwd_dh0_only);
    CHECK_RUN(ok_fwd_ht_only);
    return check_summary();
}
