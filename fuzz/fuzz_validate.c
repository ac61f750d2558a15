/*
 * fuzz_validate.c - libFuzzer target over the C API's argument validation.
 *
 * Each input is decoded into one call of fqla_fwd / fqla_bwd / fqla_decode /
 * fqla_verify: small base sizes, then per-tensor mutations (absent, dtype,
 * rank, a size, a stride, a misaligned or aliased data pointer), option
 * values (scale NaN / Inf / negative, flags), cu_seqlens, slots and
 * step_slots values and their host copies. Every tensor points at real host
 * memory that covers its descriptor whenever the descriptor is small; huge
 * descriptors (the overflow paths) get a small buffer and the call is then
 * never run.
 *
 * The target calls the public *_supported and *_workspace_size queries and
 * fqla_validate_* with the CUDA rules (host_readable = 0) and, when the CPU
 * backend accepts the problem, every buffer covers its tensor and the problem
 * is tiny, the real call. It checks only invariants that hold for every
 * input: a status of the enum comes back, a failure carries a message, the
 * run fails exactly as the query did, successful validation gives sequence
 * bounds inside [0, T], and nothing crashes (ASan, UBSan).
 */
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Reading the fuzz bytes                                                     */

typedef struct reader {
    const uint8_t *p;
    size_t n;
} reader;

static unsigned u8(reader *r)
{
    if (!r->n) return 0;
    r->n--;
    return *r->p++;
}

/* Sizes and strides worth trying: edges of the rules and of int64. */
static int64_t interesting(reader *r, int64_t nominal)
{
    static const int64_t table[] = {0, -1, 1, 2, 3, 7, 16, 64, 65,
                                    (int64_t)1 << 31, (int64_t)1 << 32, (int64_t)1 << 40,
                                    (int64_t)1 << 62, INT64_MAX, INT64_MIN, INT64_MAX / 3};
    unsigned c = u8(r);
    if (c < 16) return table[c];
    if (c < 48) return nominal + (int64_t)(c % 5) - 2;
    if (c < 64) return nominal * 2;
    return nominal;
}

/* ------------------------------------------------------------------------ */
/* Buffers                                                                    */

#define MAX_T 24
#define SMALL_BYTES (1 << 20)

typedef struct slot {
    fqla_tensor *t;
    void *base;       /* allocation the data points into */
    size_t bytes;
} slot;

typedef struct arena {
    void *mem[64];
    int n;
    slot s[MAX_T];
    int ns;
    int runnable;     /* every present tensor lies inside its allocation */
} arena;

static void *arena_alloc(arena *a, size_t bytes)
{
    if (a->n >= 64) return NULL;
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes < 64 ? 64 : bytes) != 0) return NULL;
    memset(p, 0, bytes < 64 ? 64 : bytes);
    a->mem[a->n++] = p;
    return p;
}

static void arena_free(arena *a)
{
    for (int i = 0; i < a->n; i++) free(a->mem[i]);
    a->n = 0;
}

static int64_t esize(fqla_dtype d)
{
    switch (d) {
    case FQLA_DTYPE_F16: case FQLA_DTYPE_BF16: return 2;
    case FQLA_DTYPE_F64: case FQLA_DTYPE_I64: return 8;
    default: return 4;
    }
}

/* Bytes a descriptor reaches from its data pointer, or -1 when it is not
 * small (or not well formed enough to say). */
static int64_t span_bytes(const fqla_tensor *t)
{
    int64_t reach = 0;
    if (t->ndim < 1 || t->ndim > FQLA_MAX_DIMS) return -1;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] < 0 || t->shape[d] > SMALL_BYTES || t->strides[d] < 0 ||
            t->strides[d] > SMALL_BYTES)
            return -1;
        if (t->shape[d] == 0) return 0;
        reach += (t->shape[d] - 1) * t->strides[d];
        if (reach > SMALL_BYTES) return -1;
    }
    return (reach + 1) * esize(t->dtype);
}

static void fill_random(reader *r, void *p, size_t bytes, fqla_dtype dt)
{
    /* small values: the numbers themselves are not under test */
    unsigned seed = u8(r) * 2654435761u + 1;
    for (size_t i = 0; i + (size_t)esize(dt) <= bytes; i += (size_t)esize(dt)) {
        seed = seed * 1103515245u + 12345u;
        double x = ((double)((seed >> 8) & 0xffff) / 65536.0 - 0.5);
        int64_t k = (int64_t)(i / (size_t)esize(dt));
        switch (dt) {
        case FQLA_DTYPE_F32: ((float *)p)[k] = (float)x; break;
        case FQLA_DTYPE_F64: ((double *)p)[k] = x; break;
        case FQLA_DTYPE_F16: ((uint16_t *)p)[k] = fqla_f32_to_f16((float)x); break;
        case FQLA_DTYPE_BF16: ((uint16_t *)p)[k] = fqla_f32_to_bf16((float)x); break;
        default: break;
        }
    }
}

/* A contiguous descriptor of the given shape (no data yet). */
static fqla_tensor desc(fqla_dtype dt, int ndim, const int64_t *shape)
{
    fqla_tensor t;
    memset(&t, 0, sizeof t);
    t.dtype = dt;
    t.ndim = ndim;
    for (int d = ndim - 1; d >= 0; d--) {
        t.shape[d] = shape[d];
        t.strides[d] = d == ndim - 1 ? 1 : t.strides[d + 1] * shape[d + 1];
    }
    return t;
}

/* Applies at most one fuzz-chosen mutation to *t, then gives it memory. A
 * required tensor is rarely made absent; an optional one is present when
 * `present`. */
static void materialize(reader *r, arena *a, fqla_tensor *t, int present, int is_float)
{
    unsigned m = u8(r);
    int alias = 0, misalign = 0;
    if (!present) {
        t->data = NULL;
        return;
    }
    if (m >= 224) {
        unsigned d = u8(r) % (unsigned)(t->ndim > 0 ? t->ndim : 1);
        switch (m % 8) {
        case 0: t->ndim = 0; break; /* absent: data stays NULL */
        case 1: t->dtype = (fqla_dtype)(u8(r) % 8); break;
        case 2: t->ndim = (int)(u8(r) % 9) - 1; break; /* -1 .. 7 */
        case 3: t->shape[d] = interesting(r, t->shape[d]); break;
        case 4: t->strides[d] = interesting(r, t->strides[d]); break;
        case 5: misalign = 1 + (int)(u8(r) % 15); break;
        case 6: alias = 1; break;
        case 7: /* a legal padded view: every stride above the last grows */
            for (int i = 0; i + 1 < t->ndim && i < FQLA_MAX_DIMS; i++) t->strides[i] += (int64_t)(u8(r) % 4) * (i + 1);
            break;
        }
        if (m % 8 == 0) {
            t->data = NULL;
            return;
        }
    }
    if (alias && a->ns > 0) {
        const slot *o = &a->s[u8(r) % (unsigned)a->ns];
        size_t off = (size_t)(u8(r) % 8) * 4;
        t->data = off < o->bytes ? (char *)o->base + off : o->base;
        int64_t span = span_bytes(t);
        if (span < 0 || (uint64_t)span + off > o->bytes) a->runnable = 0;
        return;
    }
    int64_t span = span_bytes(t);
    size_t bytes = span < 0 ? 64 : (size_t)span + 16;
    void *base = arena_alloc(a, bytes);
    if (!base) {
        a->runnable = 0;
        t->data = NULL;
        return;
    }
    if (span < 0) a->runnable = 0;
    if (is_float && span > 0) fill_random(r, base, bytes, t->dtype);
    t->data = (char *)base + misalign;
    if (misalign) a->runnable = 0; /* the CPU may not read misaligned elements */
    if (a->ns < MAX_T) {
        a->s[a->ns].t = t;
        a->s[a->ns].base = base;
        a->s[a->ns].bytes = bytes;
        a->ns++;
    }
}

/* An int tensor (cu_seqlens, slots, step_slots) with fuzz-chosen values.
 * Its memory always covers the descriptor, since validation reads it. */
static void int_tensor(reader *r, arena *a, fqla_tensor *t, int ndim, const int64_t *shape,
                       const int64_t *values, int64_t n)
{
    unsigned m = u8(r);
    *t = desc(m & 1 ? FQLA_DTYPE_I64 : FQLA_DTYPE_I32, ndim, shape);
    if (m >= 240) t->dtype = (fqla_dtype)(u8(r) % 8);
    if (m >= 224 && m < 240 && ndim == 1) t->shape[0] = (int64_t)(u8(r) % 6);
    int64_t count = 1;
    for (int d = 0; d < ndim; d++) count *= t->shape[d] > 0 ? t->shape[d] : 1;
    void *p = arena_alloc(a, (size_t)count * 8 + 16);
    if (!p) {
        t->data = NULL;
        return;
    }
    for (int64_t i = 0; i < count; i++) {
        int64_t v = i < n ? values[i] : 0;
        if (t->dtype == FQLA_DTYPE_I64) ((int64_t *)p)[i] = v;
        else ((int32_t *)p)[i] = (int32_t)v;
    }
    t->data = p;
}

/* ------------------------------------------------------------------------ */
/* The problem                                                                */

typedef struct base {
    int64_t B, T, H, HV, K, V, P, N;
    fqla_dtype io, gate, state;
    int varlen;
    int64_t cu[6];
} base;

static fqla_dtype pick_float(reader *r, int io)
{
    static const fqla_dtype io_set[4] = {FQLA_DTYPE_F32, FQLA_DTYPE_BF16, FQLA_DTYPE_F16, FQLA_DTYPE_F64};
    static const fqla_dtype g_set[4] = {FQLA_DTYPE_F32, FQLA_DTYPE_BF16, FQLA_DTYPE_F32, FQLA_DTYPE_F64};
    return (io ? io_set : g_set)[u8(r) % 4];
}

static void read_options(reader *r, fqla_options *o)
{
    unsigned s = u8(r), f = u8(r);
    switch (s % 8) {
    case 0: case 1: case 2: o->scale = FQLA_SCALE_DEFAULT; break;
    case 3: o->scale = (double)(s / 8) / 16.0; break;
    case 4: o->scale = -1.0; break;
    case 5: o->scale = (double)NAN; break;
    case 6: o->scale = (double)INFINITY; break;
    default: o->scale = 1e-300; break;
    }
    o->use_qk_l2norm = f & 1;
    o->use_gate_in_kernel = (f >> 1) & 1;
    o->use_beta_sigmoid = (f >> 2) & 1;
    o->allow_neg_eigval = ((f >> 3) & 1) && (((f >> 2) & 1) || (f & 0x80));
    o->state_v_first = (f >> 4) & 1;
}

static void read_base(reader *r, base *b, int decode, int verify)
{
    b->B = 1 + u8(r) % 3;
    b->T = decode ? (verify ? 1 + u8(r) % 3 : 1) : u8(r) % 7;
    b->H = 1 + u8(r) % 2;
    b->HV = b->H * (1 + u8(r) % 2);
    b->K = 1 + u8(r) % 9;
    b->V = 1 + u8(r) % 9;
    b->P = 1 + u8(r) % 5;
    b->io = pick_float(r, 1);
    b->gate = pick_float(r, 0);
    b->state = pick_float(r, 0);
    b->varlen = !decode && (u8(r) & 1);
    b->N = b->B;
    if (b->varlen) {
        /* N in 1..4: increasing boundaries inside [0, T], sometimes broken */
        int64_t n = 1 + u8(r) % 4, pos = 0;
        b->B = 1;
        b->cu[0] = 0;
        for (int64_t i = 1; i <= n; i++) {
            pos += u8(r) % 3;
            if (pos > b->T) pos = b->T;
            b->cu[i] = pos;
        }
        unsigned brk = u8(r);
        if (brk >= 240) b->cu[brk % (n + 1)] += (int64_t)(brk % 3) - 1 + (brk & 4 ? b->T : 0);
        b->N = n;
    }
}

static void common(reader *r, arena *a, const base *b, const fqla_options *o, fqla_tensor *q,
                   fqla_tensor *k, fqla_tensor *v, fqla_tensor *g, fqla_tensor *beta,
                   fqla_tensor *A_log, fqla_tensor *dt_bias)
{
    const int64_t qs[4] = {b->B, b->T, b->H, b->K}, vs[4] = {b->B, b->T, b->HV, b->V};
    const int64_t gs[3] = {b->B, b->T, b->HV}, hs[1] = {b->HV};
    *q = desc(b->io, 4, qs); materialize(r, a, q, 1, 1);
    *k = desc(b->io, 4, qs); materialize(r, a, k, 1, 1);
    *v = desc(b->io, 4, vs); materialize(r, a, v, 1, 1);
    *g = desc(b->gate, 3, gs); materialize(r, a, g, 1, 1);
    *beta = desc(b->gate, 3, gs); materialize(r, a, beta, 1, 1);
    int gate = o->use_gate_in_kernel ^ (u8(r) >= 250);
    *A_log = desc(FQLA_DTYPE_F32, 1, hs); materialize(r, a, A_log, gate, 1);
    *dt_bias = desc(FQLA_DTYPE_F32, 1, hs); materialize(r, a, dt_bias, gate, 1);
}

static void state_desc(reader *r, arena *a, fqla_tensor *t, const base *b, int64_t lead,
                       fqla_dtype dt, int v_first, int present)
{
    const int64_t kv[4] = {lead, b->HV, b->K, b->V}, vk[4] = {lead, b->HV, b->V, b->K};
    *t = desc(dt, 4, v_first ? vk : kv);
    materialize(r, a, t, present, 1);
}

/* ------------------------------------------------------------------------ */
/* Invariants                                                                 */

static void require(int cond)
{
    if (!cond) __builtin_trap();
}

static void check_status(const fqla_context *ctx, fqla_status st)
{
    require((int)st >= (int)FQLA_STATUS_SUCCESS && (int)st <= (int)FQLA_STATUS_INTERNAL_ERROR);
    if (st != FQLA_STATUS_SUCCESS) require(fqla_last_error(ctx)[0] != '\0');
}

static void check_bounds(const fqla_problem *p)
{
    for (int64_t n = 0; n < p->N; n++) {
        int64_t b, s, l;
        fqla_seq_bounds(p, n, &b, &s, &l);
        require(b >= 0 && b < p->B && s >= 0 && l >= 0 && s + l <= p->T);
    }
}

static fqla_context *g_cpu, *g_ref, *g_dead;

/* fqla_validate_* is internal: api.c calls it only with the live context a
 * handle names (fqla_context_acquire). */
static int live(const fqla_context *ctx) { return ctx && ctx != g_dead; }

static void init_contexts(void)
{
    if (g_cpu) return;
    fqla_context_create(&g_cpu, FQLA_BACKEND_CPU, 0);
    fqla_context_create(&g_ref, FQLA_BACKEND_CPU_REFERENCE, 0);
    fqla_context_set_threads(g_cpu, 1);
    fqla_context_set_threads(g_ref, 1);
    fqla_context_create(&g_dead, FQLA_BACKEND_CPU, 0);
    fqla_context_destroy(g_dead); /* only its address is used: a destroyed context */
}

/* Problems small enough to run on every fuzz input. */
static int tiny(const base *b) { return b->B * b->T * b->HV * b->K * b->V <= 4096; }

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    reader r = {data, size};
    arena a;
    base b;
    fqla_problem p;
    memset(&a, 0, sizeof a);
    a.runnable = 1;
    init_contexts();
    if (!g_cpu || !g_ref) return 0;

    unsigned sel = u8(&r);
    int op = (int)(sel % 4);
    fqla_context *ctx = (sel & 4) ? g_ref : g_cpu;
    if ((sel & 0xf8) == 0xf8) ctx = (sel & 1) ? NULL : g_dead;
    fqla_context *held = live(ctx) ? fqla_context_acquire(ctx) : NULL;
    fqla_options opt;
    memset(&opt, 0, sizeof opt);
    read_options(&r, &opt);
    read_base(&r, &b, op >= 2, op == 3);
    int v_first = opt.state_v_first;

    fqla_status sup, ws, run = FQLA_STATUS_SUCCESS, val;
    size_t bytes = 0;
    int ran = 0;
    if (op == 0) {
        fqla_fwd_args f;
        fqla_fwd_args_init(&f);
        f.opt = opt;
        common(&r, &a, &b, &opt, &f.q, &f.k, &f.v, &f.g, &f.beta, &f.A_log, &f.dt_bias);
        unsigned flags = u8(&r);
        if (b.varlen) {
            int64_t shape[1] = {b.N + 1};
            int_tensor(&r, &a, &f.cu_seqlens, 1, shape, b.cu, b.N + 1);
            if (flags & 8) f.cu_seqlens_host = b.cu; /* same values, or shape mutated: count from cu_seqlens */
            if ((flags & 8) && f.cu_seqlens.shape[0] > b.N + 1) f.cu_seqlens_host = NULL;
        }
        state_desc(&r, &a, &f.initial_state, &b, b.N, b.state, v_first, flags & 1);
        const int64_t os[4] = {b.B, b.T, b.HV, b.V};
        f.o = desc(b.io, 4, os);
        materialize(&r, &a, &f.o, 1, 0);
        state_desc(&r, &a, &f.final_state, &b, b.N, b.state, v_first, flags & 2);
        sup = fqla_fwd_supported(ctx, &f);
        check_status(ctx, sup);
        ws = fqla_fwd_workspace_size(ctx, &f, &bytes);
        require(ws == sup);
        if (held) {
            val = fqla_validate_fwd(held, &f, 0, &p);
            check_status(ctx, val);
            if (val == FQLA_STATUS_SUCCESS && p.cu_host) check_bounds(&p);
            val = fqla_validate_fwd(held, &f, 1, &p);
            if (val == FQLA_STATUS_SUCCESS) check_bounds(&p);
        }
        if (sup != FQLA_STATUS_SUCCESS || (a.runnable && tiny(&b))) {
            run = fqla_fwd(ctx, &f, NULL, 0, NULL);
            ran = 1;
        }
    } else if (op == 1) {
        fqla_bwd_args w;
        fqla_bwd_args_init(&w);
        w.opt = opt;
        common(&r, &a, &b, &opt, &w.q, &w.k, &w.v, &w.g, &w.beta, &w.A_log, &w.dt_bias);
        unsigned flags = u8(&r);
        if (b.varlen) {
            int64_t shape[1] = {b.N + 1};
            int_tensor(&r, &a, &w.cu_seqlens, 1, shape, b.cu, b.N + 1);
            if ((flags & 8) && w.cu_seqlens.shape[0] <= b.N + 1) w.cu_seqlens_host = b.cu;
        }
        int h0 = flags & 1, gate = opt.use_gate_in_kernel;
        const int64_t qs[4] = {b.B, b.T, b.H, b.K}, vs[4] = {b.B, b.T, b.HV, b.V};
        const int64_t gs[3] = {b.B, b.T, b.HV}, hs[1] = {b.HV};
        state_desc(&r, &a, &w.initial_state, &b, b.N, b.state, v_first, h0);
        w.d_o = desc(b.io, 4, vs); materialize(&r, &a, &w.d_o, 1, 1);
        state_desc(&r, &a, &w.d_final_state, &b, b.N, FQLA_DTYPE_F32, v_first, flags & 2);
        w.dq = desc(b.io, 4, qs); materialize(&r, &a, &w.dq, 1, 0);
        w.dk = desc(b.io, 4, qs); materialize(&r, &a, &w.dk, 1, 0);
        w.dv = desc(b.io, 4, vs); materialize(&r, &a, &w.dv, 1, 0);
        w.dg = desc(FQLA_DTYPE_F32, 3, gs); materialize(&r, &a, &w.dg, 1, 0);
        w.dbeta = desc(FQLA_DTYPE_F32, 3, gs); materialize(&r, &a, &w.dbeta, 1, 0);
        if (flags & 4) /* the five absent: d_initial_state alone (dA_log, ddt_bias as drawn) */
            w.dq.data = w.dk.data = w.dv.data = w.dg.data = w.dbeta.data = NULL;
        state_desc(&r, &a, &w.d_initial_state, &b, b.N, FQLA_DTYPE_F32, v_first,
                   h0 ^ ((flags & 0x30) == 0x30));
        w.dA_log = desc(FQLA_DTYPE_F32, 1, hs); materialize(&r, &a, &w.dA_log, gate ^ ((flags & 0xc0) == 0xc0), 0);
        w.ddt_bias = desc(FQLA_DTYPE_F32, 1, hs); materialize(&r, &a, &w.ddt_bias, gate, 0);
        sup = fqla_bwd_supported(ctx, &w);
        check_status(ctx, sup);
        ws = fqla_bwd_workspace_size(ctx, &w, &bytes);
        require(ws == sup);
        if (held) {
            val = fqla_validate_bwd(held, &w, 0, &p);
            check_status(ctx, val);
            if (val == FQLA_STATUS_SUCCESS && p.cu_host) check_bounds(&p);
            val = fqla_validate_bwd(held, &w, 1, &p);
            if (val == FQLA_STATUS_SUCCESS) check_bounds(&p);
        }
        if (sup != FQLA_STATUS_SUCCESS || (a.runnable && tiny(&b))) {
            run = fqla_bwd(ctx, &w, NULL, 0, NULL);
            ran = 1;
        }
    } else {
        int verify = op == 3;
        fqla_decode_args d;
        int64_t slots[8], steps[9], slots_host[8];
        fqla_decode_args_init(&d);
        d.opt = opt;
        common(&r, &a, &b, &opt, &d.q, &d.k, &d.v, &d.g, &d.beta, &d.A_log, &d.dt_bias);
        unsigned flags = u8(&r);
        /* slots in [-1, P]: padding, duplicates and out-of-range values all occur */
        for (int i = 0; i < 8; i++) slots[i] = slots_host[i] = (int64_t)(u8(&r) % (unsigned)(b.P + 2)) - 1;
        for (int i = 0; i < 9; i++) steps[i] = (int64_t)(u8(&r) % (unsigned)(b.P + 2)) - 1;
        state_desc(&r, &a, &d.state_pool, &b, b.P, b.state, v_first, 1);
        const int64_t ss[1] = {b.B}, sts[2] = {b.B, b.T}, os[4] = {b.B, b.T, b.HV, b.V};
        int_tensor(&r, &a, &d.slots, 1, ss, slots, 8);
        /* validation reads B entries of slots_host only once slots has shape [B] (B <= 5) */
        if (flags & 8) d.slots_host = slots_host;
        d.o = desc(b.io, 4, os);
        materialize(&r, &a, &d.o, 1, 0);
        int which = verify ? (int)(flags % 4) : ((flags & 0x30) == 0x30 ? 1 + (int)(flags & 1) : 0);
        if (which & 1) {
            const int64_t kv[5] = {b.B, b.T, b.HV, b.K, b.V}, vk[5] = {b.B, b.T, b.HV, b.V, b.K};
            d.step_states = desc(b.state, 5, v_first ? vk : kv);
            materialize(&r, &a, &d.step_states, 1, 0);
        }
        if (which & 2) int_tensor(&r, &a, &d.step_slots, 2, sts, steps, 9);
        if (verify) {
            sup = fqla_verify_supported(ctx, &d);
            check_status(ctx, sup);
            ws = fqla_verify_workspace_size(ctx, &d, &bytes);
        } else {
            sup = fqla_decode_supported(ctx, &d);
            check_status(ctx, sup);
            ws = fqla_decode_workspace_size(ctx, &d, &bytes);
        }
        require(ws == sup);
        if (held) {
            val = fqla_validate_decode(held, &d, verify, 0, &p);
            check_status(ctx, val);
        }
        if (sup != FQLA_STATUS_SUCCESS || (a.runnable && tiny(&b))) {
            run = verify ? fqla_verify(ctx, &d, NULL, 0, NULL) : fqla_decode(ctx, &d, NULL, 0, NULL);
            ran = 1;
        }
    }
    if (ran) {
        check_status(ctx, run);
        /* a call rejected by its query is rejected the same way when run */
        if (sup != FQLA_STATUS_SUCCESS) require(run == sup);
    }
    if (ctx == NULL || ctx == g_dead) require(sup == FQLA_STATUS_INVALID_CONTEXT);
    fqla_context_release(held);
    arena_free(&a);
    return 0;
}
