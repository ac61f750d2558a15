/*
 * validate_tensor.c - per-tensor rules of argument validation (see
 * validate_tensor.h): everything that can be said about one tensor descriptor
 * without knowing the operation, plus the aliasing check across a call.
 *
 * All size arithmetic is done with explicit overflow checks, so a descriptor
 * with absurd sizes or strides gives FQLA_STATUS_OVERFLOW instead of wrapping
 * (the fuzzer feeds such descriptors).
 */
#include "validate_tensor.h"

#include <stdint.h>

int fqla_vt_mul(int64_t a, int64_t b, int64_t *r)
{
    if (a < 0 || b < 0) return 0;
    if (a != 0 && b > INT64_MAX / a) return 0;
    *r = a * b;
    return 1;
}

static int add_i64(int64_t a, int64_t b, int64_t *r)
{
    if (a < 0 || b < 0 || a > INT64_MAX - b) return 0;
    *r = a + b;
    return 1;
}

const char *fqla_vt_dtype_name(fqla_dtype d)
{
    switch (d) {
    case FQLA_DTYPE_F32: return "F32";
    case FQLA_DTYPE_F16: return "F16";
    case FQLA_DTYPE_BF16: return "BF16";
    case FQLA_DTYPE_F64: return "F64";
    case FQLA_DTYPE_I32: return "I32";
    case FQLA_DTYPE_I64: return "I64";
    }
    return "invalid";
}

/* Element size in bytes, 0 for a value outside the enum. Kept local so that a
 * garbage dtype can never index a table. */
static int64_t elem_size(fqla_dtype d)
{
    switch (d) {
    case FQLA_DTYPE_F32: case FQLA_DTYPE_I32: return 4;
    case FQLA_DTYPE_F16: case FQLA_DTYPE_BF16: return 2;
    case FQLA_DTYPE_F64: case FQLA_DTYPE_I64: return 8;
    }
    return 0;
}

fqla_status fqla_vt_required(fqla_context *ctx, const char *name, const fqla_tensor *t,
                             int ndim, int zero_dim)
{
    if (t->data) return FQLA_STATUS_SUCCESS;
    if (zero_dim >= 0 && zero_dim < ndim && t->ndim == ndim && t->shape[zero_dim] == 0)
        return FQLA_STATUS_SUCCESS;
    return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE, "%s: data is NULL (required)", name);
}

/* Whether distinct indices of t (all sizes > 0) can share an element. Sorting
 * the dimensions longer than 1 by stride, each stride must exceed the largest
 * offset reachable through the smaller ones. This accepts every nested layout
 * (contiguous, sliced, permuted, padded) and rejects zero strides and
 * overlapping views; it also rejects exotic interleavings that happen not to
 * collide, which no framework produces. */
static int self_overlaps(const fqla_tensor *t)
{
    int64_t st[FQLA_MAX_DIMS], sh[FQLA_MAX_DIMS];
    int n = 0;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] <= 1) continue;
        int i = n++;
        while (i > 0 && st[i - 1] > t->strides[d]) {
            st[i] = st[i - 1];
            sh[i] = sh[i - 1];
            i--;
        }
        st[i] = t->strides[d];
        sh[i] = t->shape[d];
    }
    int64_t reach = 0; /* largest offset of the inner dimensions; no overflow: checked by the caller */
    for (int i = 0; i < n; i++) {
        if (st[i] <= reach) return 1;
        reach += st[i] * (sh[i] - 1);
    }
    return 0;
}

fqla_status fqla_vt_add(fqla_context *ctx, fqla_vt_list *L, const char *name,
                        const fqla_tensor *t, int ndim, const char *layout,
                        int zero_dim, int output)
{
    if (t->ndim != ndim)
        return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE, "%s: ndim = %d but expected %d (layout %s)",
                         name, t->ndim, ndim, layout);
    int64_t es = elem_size(t->dtype);
    if (es == 0)
        return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE, "%s: dtype %d is not an fqla_dtype",
                         name, (int)t->dtype);
    /* every backend loads whole elements: C needs them aligned to their size */
    if ((uintptr_t)t->data % (uintptr_t)es != 0)
        return fqla_fail(ctx, FQLA_STATUS_MISALIGNED,
                         "%s: data pointer %p is not aligned to its element size (%d bytes for %s)",
                         name, t->data, (int)es, fqla_vt_dtype_name(t->dtype));
    int64_t numel = 1, reach = 0;
    for (int d = 0; d < ndim; d++) {
        int64_t n = t->shape[d];
        if (n < 0 || (n == 0 && d != zero_dim))
            return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE,
                             "%s: shape[%d] = %lld but sizes must be > 0%s (layout %s)", name, d,
                             (long long)n, d == zero_dim ? " (T >= 0)" : "", layout);
        if (t->strides[d] < 0)
            return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE,
                             "%s: stride[%d] = %lld is negative", name, d,
                             (long long)t->strides[d]);
    }
    if (t->strides[ndim - 1] != 1)
        return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE,
                         "%s: stride[%d] = %lld but the last dimension must be contiguous (stride 1)",
                         name, ndim - 1, (long long)t->strides[ndim - 1]);
    for (int d = 0; d < ndim; d++)
        if (!fqla_vt_mul(numel, t->shape[d], &numel))
            return fqla_fail(ctx, FQLA_STATUS_OVERFLOW,
                             "%s: the element count of its shape %s overflows int64", name, layout);
    for (int d = 0; d < ndim; d++) {
        int64_t step;
        if (t->shape[d] == 0) continue;
        if (!fqla_vt_mul(t->shape[d] - 1, t->strides[d], &step))
            return fqla_fail(ctx, FQLA_STATUS_OVERFLOW,
                             "%s: (shape[%d] - 1) * stride[%d] = %lld * %lld overflows int64", name,
                             d, d, (long long)(t->shape[d] - 1), (long long)t->strides[d]);
        if (!add_i64(reach, step, &reach))
            return fqla_fail(ctx, FQLA_STATUS_OVERFLOW,
                             "%s: its largest element offset (sum of (shape[d] - 1) * stride[d]) overflows int64",
                             name);
    }
    int64_t bytes = 0;
    uintptr_t lo = (uintptr_t)t->data, hi = lo;
    if (numel > 0) {
        if (!add_i64(reach, 1, &bytes) || !fqla_vt_mul(bytes, es, &bytes) ||
            (uint64_t)bytes > (uint64_t)(UINTPTR_MAX - lo))
            return fqla_fail(ctx, FQLA_STATUS_OVERFLOW,
                             "%s: the byte span of the tensor overflows the address space", name);
        hi = lo + (uintptr_t)bytes;
    }
    if (output && numel > 0 && self_overlaps(t))
        return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE,
                         "%s: strides make distinct elements overlap (an output must not be an overlapping view)",
                         name);
    if (L->n >= FQLA_VT_MAX)
        return fqla_fail(ctx, FQLA_STATUS_INTERNAL_ERROR, "validation: too many tensors");
    fqla_vt *v = &L->v[L->n++];
    v->name = name;
    v->t = t;
    v->output = output;
    v->lo = lo;
    v->hi = hi;
    return FQLA_STATUS_SUCCESS;
}

fqla_status fqla_vt_dtype(fqla_context *ctx, const char *name, const fqla_tensor *t,
                          unsigned allowed, const char *what)
{
    unsigned d = (unsigned)t->dtype;
    if (d < 32 && (allowed & (1u << d))) return FQLA_STATUS_SUCCESS;
    return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE, "%s: dtype %s but it must be %s", name,
                     fqla_vt_dtype_name(t->dtype), what);
}

fqla_status fqla_vt_same_dtype(fqla_context *ctx, const char *name, const fqla_tensor *t,
                               const char *ref_name, const fqla_tensor *ref)
{
    if (t->dtype == ref->dtype) return FQLA_STATUS_SUCCESS;
    return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE, "%s: dtype %s but %s has %s (they must match)",
                     name, fqla_vt_dtype_name(t->dtype), ref_name,
                     fqla_vt_dtype_name(ref->dtype));
}

fqla_status fqla_vt_dim(fqla_context *ctx, const char *name, const fqla_tensor *t, int d,
                        int64_t want, const char *why)
{
    if (t->shape[d] == want) return FQLA_STATUS_SUCCESS;
    return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE, "%s: shape[%d] = %lld but %s = %lld", name,
                     d, (long long)t->shape[d], why, (long long)want);
}

fqla_status fqla_vt_aligned16(fqla_context *ctx, const char *name, const fqla_tensor *t)
{
    int64_t es = elem_size(t->dtype);
    if ((uintptr_t)t->data % 16 != 0)
        return fqla_fail(ctx, FQLA_STATUS_MISALIGNED,
                         "%s: data pointer %p is not 16-byte aligned (needed by the CUDA kernels' TMA loads)",
                         name, t->data);
    /* innermost first: a padded row is the likely cause and is named first */
    for (int d = t->ndim - 2; d >= 0; d--) {
        if (t->shape[d] <= 1) continue; /* the stride of a length-1 dimension is never used */
        /* unsigned: the product may exceed int64 for an empty tensor, and
         * wrapping modulo 2^64 keeps the remainder modulo 16 */
        if (((uint64_t)t->strides[d] * (uint64_t)es) % 16 != 0)
            return fqla_fail(ctx, FQLA_STATUS_MISALIGNED,
                             "%s: stride[%d] = %lld elements of %d bytes is not a multiple of 16 bytes (CUDA TMA)",
                             name, d, (long long)t->strides[d], (int)es);
    }
    return FQLA_STATUS_SUCCESS;
}

fqla_status fqla_vt_add_host(fqla_context *ctx, fqla_vt_list *L, const char *name, const int64_t *data,
                             int64_t n)
{
    if (L->n >= FQLA_VT_MAX)
        return fqla_fail(ctx, FQLA_STATUS_INTERNAL_ERROR, "validation: too many tensors");
    fqla_vt *v = &L->v[L->n++];
    v->name = name;
    v->t = NULL;
    v->output = 0;
    v->lo = (uintptr_t)data;
    v->hi = v->lo + (uintptr_t)n * sizeof *data; /* n <= a validated shape[0] */
    return FQLA_STATUS_SUCCESS;
}

const char *fqla_vt_first_f64(const fqla_vt_list *L)
{
    for (int i = 0; i < L->n; i++)
        if (L->v[i].t && L->v[i].t->dtype == FQLA_DTYPE_F64) return L->v[i].name;
    return NULL;
}

fqla_status fqla_vt_no_alias(fqla_context *ctx, const fqla_vt_list *L)
{
    for (int i = 0; i < L->n; i++) {
        const fqla_vt *a = &L->v[i];
        if (!a->output || a->lo == a->hi) continue;
        for (int j = 0; j < L->n; j++) {
            const fqla_vt *b = &L->v[j];
            if (j == i || b->lo == b->hi || (b->output && j < i)) continue;
            if (a->lo < b->hi && b->lo < a->hi)
                return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE,
                                 "%s: memory overlaps %s %s (an output must not alias another tensor of the call)",
                                 a->name, b->output ? "output" : "input", b->name);
        }
    }
    return FQLA_STATUS_SUCCESS;
}
