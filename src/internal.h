/*
 * internal.h - what the API layer, the validation and the backends share:
 * the context, the error helper, the validated problem description and the
 * backend entry points. Nothing here is public.
 *
 * Flow of every call (src/api.c):
 *   context check -> validation (src/validate.c, fills an fqla_problem and
 *   checks everything a backend-independent rule can) -> the backend's
 *   "supported" check (head dims, dtypes, options it covers) -> workspace
 *   check -> the backend's run function.
 * A backend run function may assume everything validate.c checked.
 */
#ifndef FQLA_INTERNAL_H
#define FQLA_INTERNAL_H

#include "flashqla.h"

#include <pthread.h>

#include <stdarg.h>
#include <string.h>

#define FQLA_ERROR_LEN 512

/* The context. The public fqla_context * is a handle to it (context.c), not
 * its address: every entry point turns the handle into this struct with
 * fqla_context_enter / fqla_context_acquire, and everything below the entry
 * points (validation, backends, fqla_fail) takes the struct. */
struct fqla_context {
    fqla_backend backend;
    int device;
    fqla_device_info info;   /* info.threads (CPU worker threads) changes: read it under lock */
    int refs;                /* the handle + running calls (atomic; context.c) */
    pthread_mutex_t lock;    /* guards error and info.threads: calls on one context run concurrently */
    char error[FQLA_ERROR_LEN];
    struct fqla_cpu_pool *cpu_pool; /* the fast CPU path's worker threads (src/cpu/threads.h):
                                       created by its first parallel call, under lock */
};

/* The live context a handle names, held until fqla_context_release; NULL
 * for NULL, destroyed or never-created handles. */
fqla_context *fqla_context_acquire(const fqla_context *handle);
void fqla_context_release(fqla_context *ctx);
/* fqla_context_acquire for a public call: on success clears ctx's and the
 * thread's messages; otherwise records the thread's message and returns
 * FQLA_STATUS_INVALID_CONTEXT. Pair a success with fqla_context_release. */
fqla_status fqla_context_enter(const fqla_context *handle, fqla_context **ctx);
/* The CPU worker threads set on ctx, read once per call (fqla_problem.threads). */
int fqla_context_threads(fqla_context *ctx);

/* Records a message for ctx (or the calling thread when ctx is NULL) and
 * returns status, so callers write `return fqla_fail(ctx, STATUS, "...")`. */
fqla_status fqla_fail(fqla_context *ctx, fqla_status status, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Clears ctx's message (when ctx is not NULL) and the calling thread's. */
void fqla_clear_error(fqla_context *ctx);

/* ------------------------------------------------------------------------ */
/* The validated problem                                                      */

typedef enum fqla_op {
    FQLA_OP_FWD = 0,
    FQLA_OP_BWD = 1,
    FQLA_OP_DECODE = 2,
    FQLA_OP_VERIFY = 3
} fqla_op;

typedef struct fqla_problem {
    fqla_op op;
    int64_t B, T, H, HV, K, V;
    int64_t N;               /* sequences (fwd/bwd); = B for decode/verify */
    int64_t group;           /* HV / H */
    int64_t P;               /* decode/verify: pool entries */
    double scale;            /* resolved (never FQLA_SCALE_DEFAULT) */
    int varlen;              /* cu_seqlens given */
    /* Sequence boundaries when readable on the host: cu_host (the caller's
     * host copy) or, on CPU backends, cu (the cu_seqlens tensor itself).
     * Use fqla_seq_bounds() rather than reading these directly. */
    const int64_t *cu_host;
    const fqla_tensor *cu;
    fqla_options opt;
    fqla_dtype io_dtype;     /* dtype of q, k, v, o */
    fqla_dtype gate_dtype;   /* dtype of g, beta */
    fqla_dtype state_dtype;  /* dtype of the states / pool (F32 if none given) */
    int dh0_only;            /* bwd: dq, dk, dv, dg, dbeta, dA_log and ddt_bias are all
                                absent and only d_initial_state is computed (validate.c) */
    int ht_only;             /* fwd: o absent, final_state given: only the final state
                                is computed (validate.c) */
    const char *f64_tensor;  /* the first argument given in F64 (NULL if none): the
                                fp32 backends refuse it by name, whichever it is */
    int threads;             /* CPU backends: worker threads of this call, read from the
                                context once as it starts (set by api.c, not validation) */
} fqla_problem;

/* Sequence n covers tokens [start, start + len) of batch row `batch`.
 * Valid only when the boundaries are readable on the host (always on the CPU). */
void fqla_seq_bounds(const fqla_problem *p, int64_t n, int64_t *batch, int64_t *start, int64_t *len);

/* Validation: backend-independent checks of every rule in docs/testing.md's bad
 * input list (pointers, shapes, dtypes, strides, aliasing, cu_seqlens, scale,
 * overflow). On success fills *p. `host_readable` says whether tensor data is
 * host memory (CPU backends), so cu_seqlens and slots values can be checked. */
fqla_status fqla_validate_fwd(fqla_context *ctx, const fqla_fwd_args *a, int host_readable, fqla_problem *p);
fqla_status fqla_validate_bwd(fqla_context *ctx, const fqla_bwd_args *a, int host_readable, fqla_problem *p);
fqla_status fqla_validate_decode(fqla_context *ctx, const fqla_decode_args *a, int verify, int host_readable, fqla_problem *p);

/* ------------------------------------------------------------------------ */
/* Element access for host tensors (CPU backends)                             */

/* bf16 is the top half of an fp32: widening is a shift (exact); narrowing
 * rounds to nearest even and keeps a NaN a quiet NaN. Inline because the CPU
 * backends convert every bf16 element of q, k, v, o through them. */
static inline float fqla_bf16_to_f32(uint16_t x)
{
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t fqla_f32_to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a (quiet) NaN */
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
float fqla_f16_to_f32(uint16_t x);
uint16_t fqla_f32_to_f16(float x);       /* round to nearest even */

/* Element offset of index i[0..ndim) in t (in elements). */
static inline int64_t fqla_offset(const fqla_tensor *t, const int64_t *i)
{
    int64_t off = 0;
    for (int d = 0; d < t->ndim; d++)
        off += i[d] * t->strides[d];
    return off;
}
double fqla_load(const fqla_tensor *t, int64_t offset);
void fqla_store(const fqla_tensor *t, int64_t offset, double value);
/* Copies n contiguous elements starting at offset into / out of float. */
/* n bf16 values to fp32 and back (round to nearest even, NaN kept quiet):
 * the same bits as fqla_bf16_to_f32 / fqla_f32_to_bf16 element by element. */
void fqla_bf16_row_to_f32(const uint16_t *src, int64_t n, float *dst);
void fqla_f32_row_to_bf16(const float *src, int64_t n, uint16_t *dst);
void fqla_load_row_f32(const fqla_tensor *t, int64_t offset, int64_t n, float *dst);
void fqla_store_row_f32(const fqla_tensor *t, int64_t offset, int64_t n, const float *src);

/* ------------------------------------------------------------------------ */
/* Backends. supported() checks what validate.c does not (head dims, dtypes,
 * options) and names the offending item; workspace() gives exact bytes.     */

/* fp64 token recurrence (src/cpu/reference_*.c) */
fqla_status fqla_ref_supported(fqla_context *ctx, const fqla_problem *p);
fqla_status fqla_ref_fwd(fqla_context *ctx, const fqla_problem *p, const fqla_fwd_args *a);
fqla_status fqla_ref_bwd(fqla_context *ctx, const fqla_problem *p, const fqla_bwd_args *a);
fqla_status fqla_ref_decode(fqla_context *ctx, const fqla_problem *p, const fqla_decode_args *a);

/* fast fp32 CPU path (src/cpu/) */
fqla_status fqla_cpu_supported(fqla_context *ctx, const fqla_problem *p);
fqla_status fqla_cpu_fwd(fqla_context *ctx, const fqla_problem *p, const fqla_fwd_args *a);
fqla_status fqla_cpu_bwd(fqla_context *ctx, const fqla_problem *p, const fqla_bwd_args *a);
fqla_status fqla_cpu_decode(fqla_context *ctx, const fqla_problem *p, const fqla_decode_args *a);

/* CUDA (src/cuda/; src/cuda_stub.c when built without nvcc) */
fqla_status fqla_cuda_device_query(int device, fqla_device_info *info, char *why, size_t why_size);
fqla_status fqla_cuda_supported(fqla_context *ctx, const fqla_problem *p, const void *args);
fqla_status fqla_cuda_workspace(fqla_context *ctx, const fqla_problem *p, const void *args, size_t *bytes);
fqla_status fqla_cuda_run(fqla_context *ctx, const fqla_problem *p, const void *args,
                          void *workspace, size_t workspace_bytes, void *stream);

#endif /* FQLA_INTERNAL_H */
