/*
 * layer.c - the CLI's forward problem: buffers, docs/benchmarks.md inputs, the
 * per-sequence prefix for the reference check, and the error figures.
 */
#include "layer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cli_shape_seq(const cli_shape *s, int64_t n, int64_t *batch, int64_t *start, int64_t *len)
{
    if (s->cu) {
        *batch = 0;
        *start = s->cu[n];
        *len = s->cu[n + 1] - s->cu[n];
    } else {
        *batch = n;
        *start = 0;
        *len = s->T;
    }
}

int64_t cli_shape_tokens(const cli_shape *s)
{
    return s->cu ? s->cu[s->N] : s->B * s->T;
}

int cli_shape_copy(cli_shape *dst, const cli_shape *src)
{
    *dst = *src;
    if (src->cu) {
        dst->cu = malloc((size_t)(src->N + 1) * sizeof *dst->cu);
        if (!dst->cu) return -1;
        memcpy(dst->cu, src->cu, (size_t)(src->N + 1) * sizeof *dst->cu);
    }
    return 0;
}

void cli_shape_free(cli_shape *s)
{
    free(s->cu);
    s->cu = NULL;
}

/* a * b into *r for a, b >= 0; 0 when the product passes INT64_MAX / 8. */
static int mul_fits(int64_t a, int64_t b, int64_t *r)
{
    const int64_t lim = INT64_MAX / 8;
    if (a != 0 && b > lim / a) return 0;
    *r = a * b;
    return *r <= lim;
}

int cli_shape_fits(const cli_shape *s)
{
    int64_t bt, x;
    if (!mul_fits(s->B, s->T, &bt)) return 0;
    const int64_t t_q[2] = {s->H, s->K}, t_v[2] = {s->HV, s->V};
    const int64_t *tensors[2] = {t_q, t_v};
    for (int i = 0; i < 2; i++)
        if (!mul_fits(bt, tensors[i][0], &x) || !mul_fits(x, tensors[i][1], &x)) return 0;
    return mul_fits(s->N, s->HV, &x) && mul_fits(x, s->K, &x) && mul_fits(x, s->V, &x);
}

size_t cli_numel_qk(const cli_shape *s) { return (size_t)(s->B * s->T * s->H * s->K); }
size_t cli_numel_vo(const cli_shape *s) { return (size_t)(s->B * s->T * s->HV * s->V); }
size_t cli_numel_gate(const cli_shape *s) { return (size_t)(s->B * s->T * s->HV); }
size_t cli_numel_state(const cli_shape *s) { return (size_t)(s->N * s->HV * s->K * s->V); }

double cli_layer_bytes(const cli_shape *s, fqla_dtype io)
{
    double e = (double)fqla_dtype_size(io);
    return e * (2.0 * (double)cli_numel_qk(s) + 2.0 * (double)cli_numel_vo(s))
         + 4.0 * (2.0 * (double)cli_numel_gate(s) + 2.0 * (double)cli_numel_state(s));
}

int cli_layer_alloc_host(cli_layer *L, const cli_shape *s, fqla_dtype io)
{
    size_t e = fqla_dtype_size(io);
    memset(L, 0, sizeof *L);
    if (cli_shape_copy(&L->s, s) != 0) return -1;
    L->io = io;
    L->q = cli_host_alloc(cli_numel_qk(s) * e);
    L->k = cli_host_alloc(cli_numel_qk(s) * e);
    L->v = cli_host_alloc(cli_numel_vo(s) * e);
    L->o = cli_host_alloc(cli_numel_vo(s) * e);
    L->g = cli_host_alloc(cli_numel_gate(s) * 4);
    L->beta = cli_host_alloc(cli_numel_gate(s) * 4);
    L->h0 = cli_host_alloc(cli_numel_state(s) * 4);
    L->ht = cli_host_alloc(cli_numel_state(s) * 4);
    if (s->cu) {
        L->cu = cli_host_alloc((size_t)(s->N + 1) * 8);
        if (L->cu) memcpy(L->cu, s->cu, (size_t)(s->N + 1) * 8);
    }
    if (!L->q || !L->k || !L->v || !L->o || !L->g || !L->beta || !L->h0 || !L->ht || (s->cu && !L->cu)) {
        cli_layer_free(L);
        return -1;
    }
    return 0;
}

void cli_layer_free(cli_layer *L)
{
    void **bufs[] = { &L->q, &L->k, &L->v, &L->g, &L->beta, &L->h0, &L->cu, &L->o, &L->ht };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        if (L->on_device) cli_dev_free(*bufs[i]);
        else cli_host_free(*bufs[i]);
        *bufs[i] = NULL;
    }
    cli_shape_free(&L->s);
}

int cli_layer_to_device(cli_layer *dst, const cli_layer *src, int device, char *err, size_t n)
{
    const cli_shape *s = &src->s;
    size_t e = fqla_dtype_size(src->io);
    struct { void **d; const void *h; size_t bytes; } t[] = {
        { &dst->q, src->q, cli_numel_qk(s) * e },       { &dst->k, src->k, cli_numel_qk(s) * e },
        { &dst->v, src->v, cli_numel_vo(s) * e },       { &dst->o, src->o, cli_numel_vo(s) * e },
        { &dst->g, src->g, cli_numel_gate(s) * 4 },     { &dst->beta, src->beta, cli_numel_gate(s) * 4 },
        { &dst->h0, src->h0, cli_numel_state(s) * 4 },  { &dst->ht, src->ht, cli_numel_state(s) * 4 },
        { &dst->cu, src->cu, s->cu ? (size_t)(s->N + 1) * 8 : 0 },
    };
    memset(dst, 0, sizeof *dst);
    dst->on_device = 1;
    dst->io = src->io;
    if (cli_shape_copy(&dst->s, s) != 0) {
        snprintf(err, n, "out of host memory");
        return -1;
    }
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        if (t[i].d == &dst->cu && !s->cu) continue;
        if (cli_dev_alloc(device, t[i].d, t[i].bytes, err, n) != 0) goto fail;
        if (cli_dev_upload(*t[i].d, t[i].h, t[i].bytes, err, n) != 0) goto fail;
    }
    return 0;
fail:
    cli_layer_free(dst);
    return -1;
}

int cli_layer_outputs_to_host(cli_layer *host, const cli_layer *dev, char *err, size_t n)
{
    size_t e = fqla_dtype_size(dev->io);
    if (cli_dev_download(host->o, dev->o, cli_numel_vo(&dev->s) * e, err, n) != 0) return -1;
    return cli_dev_download(host->ht, dev->ht, cli_numel_state(&dev->s) * 4, err, n);
}

int cli_layer_prefix(cli_layer *dst, const cli_layer *src, int64_t tokens, fqla_dtype io)
{
    const cli_shape *s = &src->s;
    cli_shape p = *s;
    p.cu = NULL;
    if (s->cu) {
        p.cu = malloc((size_t)(s->N + 1) * sizeof *p.cu);
        if (!p.cu) return -1;
        p.cu[0] = 0;
        for (int64_t n = 0; n < s->N; n++) {
            int64_t len = s->cu[n + 1] - s->cu[n];
            p.cu[n + 1] = p.cu[n] + (len < tokens ? len : tokens);
        }
        p.B = 1;
        p.T = p.cu[s->N];
    } else {
        p.T = s->T < tokens ? s->T : tokens;
    }
    int rc = cli_layer_alloc_host(dst, &p, io);
    free(p.cu);
    if (rc != 0) return -1;

    const cli_shape *d = &dst->s;
    size_t wq = (size_t)(s->H * s->K), wv = (size_t)(s->HV * s->V), wg = (size_t)s->HV;
    for (int64_t n = 0; n < s->N; n++) {
        int64_t sb, ss, sl, db, ds, dl;
        cli_shape_seq(s, n, &sb, &ss, &sl);
        cli_shape_seq(d, n, &db, &ds, &dl);
        for (int64_t t = 0; t < dl; t++) {
            size_t sr = (size_t)(sb * s->T + ss + t), dr = (size_t)(db * d->T + ds + t);
            for (size_t i = 0; i < wq; i++) {
                cli_store(dst->q, io, dr * wq + i, cli_load(src->q, src->io, sr * wq + i));
                cli_store(dst->k, io, dr * wq + i, cli_load(src->k, src->io, sr * wq + i));
            }
            for (size_t i = 0; i < wv; i++)
                cli_store(dst->v, io, dr * wv + i, cli_load(src->v, src->io, sr * wv + i));
            memcpy((float *)dst->g + dr * wg, (const float *)src->g + sr * wg, wg * 4);
            memcpy((float *)dst->beta + dr * wg, (const float *)src->beta + sr * wg, wg * 4);
        }
    }
    memcpy(dst->h0, src->h0, cli_numel_state(s) * 4);
    for (size_t i = 0; i < cli_numel_vo(d); i++) cli_store(dst->o, io, i, NAN);
    for (size_t i = 0; i < cli_numel_state(d); i++) ((float *)dst->ht)[i] = NAN;
    return 0;
}

void cli_layer_args(const cli_layer *L, fqla_fwd_args *a)
{
    const cli_shape *s = &L->s;
    int64_t qs[4] = { s->B, s->T, s->H, s->K };
    int64_t vs[4] = { s->B, s->T, s->HV, s->V };
    int64_t gs[3] = { s->B, s->T, s->HV };
    int64_t hs[4] = { s->N, s->HV, s->K, s->V };
    int64_t cs[1] = { s->N + 1 };
    fqla_fwd_args_init(a);
    a->q = fqla_tensor_contiguous(L->q, L->io, 4, qs);
    a->k = fqla_tensor_contiguous(L->k, L->io, 4, qs);
    a->v = fqla_tensor_contiguous(L->v, L->io, 4, vs);
    a->o = fqla_tensor_contiguous(L->o, L->io, 4, vs);
    a->g = fqla_tensor_contiguous(L->g, FQLA_DTYPE_F32, 3, gs);
    a->beta = fqla_tensor_contiguous(L->beta, FQLA_DTYPE_F32, 3, gs);
    a->initial_state = fqla_tensor_contiguous(L->h0, FQLA_DTYPE_F32, 4, hs);
    a->final_state = fqla_tensor_contiguous(L->ht, FQLA_DTYPE_F32, 4, hs);
    if (s->cu) {
        a->cu_seqlens = fqla_tensor_contiguous(L->cu, FQLA_DTYPE_I64, 1, cs);
        a->cu_seqlens_host = s->cu;
    }
}

int cli_layer_outputs_finite(const cli_layer *L)
{
    const cli_shape *s = &L->s;
    size_t w = (size_t)(s->HV * s->V);
    for (int64_t n = 0; n < s->N; n++) {
        int64_t b, st, len;
        cli_shape_seq(s, n, &b, &st, &len);
        size_t first = (size_t)(b * s->T + st) * w, count = (size_t)len * w;
        for (size_t i = first; i < first + count; i++)
            if (!isfinite(cli_load(L->o, L->io, i))) return 0;
    }
    for (size_t i = 0; i < cli_numel_state(s); i++)
        if (!isfinite(((const float *)L->ht)[i])) return 0;
    return 1;
}

/* Accumulates one (sequence, head) block into r; err2/ref2 are its sums. */
static void rel_add(cli_rel *r, double err2, double ref2, int bad, int64_t n, int64_t h,
                    double *tot_err2, double *tot_ref2, int *tot_bad)
{
    double rel = bad ? INFINITY : (ref2 > 0 ? sqrt(err2 / ref2) : sqrt(err2));
    if (rel > r->worst || r->worst_seq < 0) {
        r->worst = rel;
        r->worst_seq = n;
        r->worst_head = h;
    }
    *tot_err2 += err2;
    *tot_ref2 += ref2;
    *tot_bad |= bad;
}

static void rel_finish(cli_rel *r, double err2, double ref2, int bad)
{
    r->rel = bad ? INFINITY : (ref2 > 0 ? sqrt(err2 / ref2) : sqrt(err2));
}

void cli_compare(const cli_layer *x, const cli_layer *ref, cli_rel *o, cli_rel *state)
{
    const cli_shape *s = &ref->s;
    double te = 0, tr = 0;
    int tb = 0;
    o->worst = state->worst = 0;
    o->worst_seq = state->worst_seq = -1;
    o->worst_head = state->worst_head = -1;
    for (int64_t n = 0; n < s->N; n++) {
        int64_t b, st, len;
        cli_shape_seq(s, n, &b, &st, &len);
        for (int64_t h = 0; h < s->HV; h++) {
            double e2 = 0, r2 = 0;
            int bad = 0;
            for (int64_t t = 0; t < len; t++) {
                size_t base = ((size_t)(b * s->T + st + t) * (size_t)s->HV + (size_t)h) * (size_t)s->V;
                for (int64_t i = 0; i < s->V; i++) {
                    double xv = cli_load(x->o, x->io, base + (size_t)i);
                    double rv = cli_load(ref->o, ref->io, base + (size_t)i);
                    if (!isfinite(xv) && isfinite(rv)) bad = 1;
                    e2 += (xv - rv) * (xv - rv);
                    r2 += rv * rv;
                }
            }
            rel_add(o, e2, r2, bad, n, h, &te, &tr, &tb);
        }
    }
    rel_finish(o, te, tr, tb);

    te = tr = 0;
    tb = 0;
    size_t kv = (size_t)(s->K * s->V);
    for (int64_t n = 0; n < s->N; n++) {
        for (int64_t h = 0; h < s->HV; h++) {
            const float *xs = (const float *)x->ht + (size_t)(n * s->HV + h) * kv;
            const float *rs = (const float *)ref->ht + (size_t)(n * s->HV + h) * kv;
            double e2 = 0, r2 = 0;
            int bad = 0;
            for (size_t i = 0; i < kv; i++) {
                if (!isfinite(xs[i]) && isfinite(rs[i])) bad = 1;
                e2 += ((double)xs[i] - rs[i]) * ((double)xs[i] - rs[i]);
                r2 += (double)rs[i] * rs[i];
            }
            rel_add(state, e2, r2, bad, n, h, &te, &tr, &tb);
        }
    }
    rel_finish(state, te, tr, tb);
}
