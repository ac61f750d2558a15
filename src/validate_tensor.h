/*
 * validate_tensor.h - the per-tensor rules of argument validation, shared by
 * the per-operation checks in validate.c: presence, rank, positive sizes,
 * strides (non-negative, last one 1, no self-overlap for outputs), checked
 * size arithmetic, 16-byte alignment, dtype sets and aliasing between the
 * memory ranges of outputs and every other tensor of a call.
 *
 * Every function records a message naming the argument through fqla_fail and
 * returns its status; FQLA_STATUS_SUCCESS otherwise.
 */
#ifndef FQLA_VALIDATE_TENSOR_H
#define FQLA_VALIDATE_TENSOR_H

#include "internal.h"

#define FQLA_VT_TRY(expr)                                      \
    do {                                                       \
        fqla_status fqla_vt_s_ = (expr);                       \
        if (fqla_vt_s_ != FQLA_STATUS_SUCCESS) return fqla_vt_s_; \
    } while (0)

/* dtype sets, as bit masks of (1u << dtype) */
#define FQLA_VT_DT(d) (1u << (unsigned)(d))
#define FQLA_VT_IO (FQLA_VT_DT(FQLA_DTYPE_F32) | FQLA_VT_DT(FQLA_DTYPE_F16) | \
                    FQLA_VT_DT(FQLA_DTYPE_BF16) | FQLA_VT_DT(FQLA_DTYPE_F64))
#define FQLA_VT_GATE (FQLA_VT_DT(FQLA_DTYPE_F32) | FQLA_VT_DT(FQLA_DTYPE_BF16) | \
                      FQLA_VT_DT(FQLA_DTYPE_F64))
#define FQLA_VT_STATE FQLA_VT_GATE
#define FQLA_VT_F32 (FQLA_VT_DT(FQLA_DTYPE_F32) | FQLA_VT_DT(FQLA_DTYPE_F64))
#define FQLA_VT_INT (FQLA_VT_DT(FQLA_DTYPE_I32) | FQLA_VT_DT(FQLA_DTYPE_I64))

/* One checked tensor of a call: its name and the byte range it may touch. */
typedef struct fqla_vt {
    const char *name;
    const fqla_tensor *t;
    int output;              /* written by the call (outputs, in/out pools) */
    uintptr_t lo, hi;        /* bytes [lo, hi); lo == hi when it has no elements */
} fqla_vt;

#define FQLA_VT_MAX 24
typedef struct fqla_vt_list {
    fqla_vt v[FQLA_VT_MAX];
    int n;
} fqla_vt_list;

/* a * b for a, b >= 0; 0 when the product overflows int64. */
int fqla_vt_mul(int64_t a, int64_t b, int64_t *r);

/* A required tensor must have data, except an empty one (shape[zero_dim] == 0,
 * e.g. T = 0, where frameworks hand out NULL data). zero_dim < 0: none. */
fqla_status fqla_vt_required(fqla_context *ctx, const char *name, const fqla_tensor *t,
                             int ndim, int zero_dim);

/* Rank, dtype in the enum, data aligned to the element size (MISALIGNED
 * otherwise, on every backend), sizes (> 0; >= 0 for zero_dim), strides,
 * overflow of the element count
 * and byte span; for outputs also that distinct indices never share memory.
 * Appends the tensor to L for the aliasing check. layout is shown in messages
 * ("[B, T, H, K]"). */
fqla_status fqla_vt_add(fqla_context *ctx, fqla_vt_list *L, const char *name,
                        const fqla_tensor *t, int ndim, const char *layout,
                        int zero_dim, int output);

/* A host array the call reads (cu_seqlens_host, slots_host: n int64
 * values) into L as an input range, so that no output may overlap it: an
 * output written over it would change the bounds the backend reads next. */
fqla_status fqla_vt_add_host(fqla_context *ctx, fqla_vt_list *L, const char *name, const int64_t *data,
                             int64_t n);

/* dtype in the set `allowed` (described by `what` in the message). */
fqla_status fqla_vt_dtype(fqla_context *ctx, const char *name, const fqla_tensor *t,
                          unsigned allowed, const char *what);
/* dtype equal to that of `ref` (named ref_name). */
fqla_status fqla_vt_same_dtype(fqla_context *ctx, const char *name, const fqla_tensor *t,
                               const char *ref_name, const fqla_tensor *ref);

/* shape[d] == want, else "name: shape[d] = x but <why> = want". */
fqla_status fqla_vt_dim(fqla_context *ctx, const char *name, const fqla_tensor *t, int d,
                        int64_t want, const char *why);

/* Data pointer and every stride of a dimension longer than 1 (in bytes) a
 * multiple of 16 (TMA); FQLA_STATUS_MISALIGNED otherwise. The last stride is
 * 1 and its dimension is the contiguous row, so it is not checked. */
fqla_status fqla_vt_aligned16(fqla_context *ctx, const char *name, const fqla_tensor *t);

/* No output's byte range intersects that of any other tensor in L. */
fqla_status fqla_vt_no_alias(fqla_context *ctx, const fqla_vt_list *L);

/* The name of the first tensor of L in F64, or NULL. */
const char *fqla_vt_first_f64(const fqla_vt_list *L);

/* "F32", "BF16", ... or "invalid(n)" for a value outside the enum. */
const char *fqla_vt_dtype_name(fqla_dtype d);

#endif
