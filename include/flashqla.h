/*
 * flashqla.h - the whole public API of flashqla, a library of Gated DeltaNet
 * (GDN) linear-attention kernels: chunked prefill forward and backward,
 * decode and multi-token verify, on a CPU backend and a CUDA (sm_90a) backend.
 *
 * C99, no CUDA types. Conventions (cuBLAS / ggml style):
 *   - every call returns an fqla_status; fqla_last_error(ctx) holds a message
 *     that names the offending argument; the library never prints or exits;
 *   - tensors are described by fqla_tensor (shape and strides in elements,
 *     outermost first, the last dimension contiguous);
 *   - workspace is owned by the caller (size from the *_workspace_size query);
 *   - the stream (cudaStream_t as void *, NULL = default stream; ignored by
 *     the CPU backend) is the last argument; no hidden allocation or
 *     synchronisation inside a CUDA call.
 *
 * The computation (per sequence n and value head h, state S of K x V, starting
 * at initial_state[n, h] or 0; q/k head of value head h is h / (HV / H)):
 *
 *     S   <- exp(g_t) * S
 *     u_t  = beta_t * (v_t - S^T k_t)
 *     S   <- S + k_t u_t^T
 *     o_t  = S^T (scale * q_t)
 *
 * with the optional in-kernel transforms applied to the raw inputs first:
 *     use_qk_l2norm:      q <- q / sqrt(sum q^2 + 1e-6), same for k
 *     use_gate_in_kernel: g <- -exp(A_log[h]) * softplus(g_raw + dt_bias[h])
 *     use_beta_sigmoid:   beta <- sigmoid(beta_raw), times 2 if allow_neg_eigval
 *
 * Shapes (B batch, T tokens, H q/k heads, HV value heads, K / V head dims,
 * N sequences: N = B, or the number of cu_seqlens intervals with B == 1):
 *     q, k          [B, T, H, K]
 *     v, o          [B, T, HV, V]
 *     g, beta       [B, T, HV]
 *     A_log, dt_bias [HV]
 *     states        [N, HV, K, V]  ([N, HV, V, K] with state_v_first)
 *     cu_seqlens    [N + 1], int32 or int64, requires B == 1
 *
 * NaN or Inf inside tensor values is not validated (as in cuBLAS); it
 * propagates to the outputs.
 *
 * Numerics: the CUDA forward inverts each 64-token chunk's gate-free system
 * I + StrictLower(diag(beta) K K^T) while every row of the chunk has
 * beta ||k||^2 in [0, 2] (unit keys, as with use_qk_l2norm, and beta in
 * [0, 2]); its entries are then bounded. Outside that range the gate-free
 * inverse grows like |beta ||k||^2 - 1|^n over n tokens, so such chunks
 * invert the system with the decay inside (as the CPU backends do for
 * every chunk), which stays bounded whatever the keys.
 */
#ifndef FLASHQLA_H
#define FLASHQLA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks the public functions. The library is compiled with
 * -fvisibility=hidden, so these are the only symbols libflashqla.so exports. */
#if defined(__GNUC__) || defined(__clang__)
#define FQLA_API __attribute__((visibility("default")))
#else
#define FQLA_API
#endif

/* The version's one source is the file VERSION at the top of the source tree:
 * the Makefile compiles the library with -DFQLA_VERSION_MAJOR=... from it,
 * `make install` writes these defaults from it into the installed header, and
 * tests/check_version.sh checks that these defaults, the library, the CLI and
 * the Python package all agree with it. */
#ifndef FQLA_VERSION_MAJOR
#define FQLA_VERSION_MAJOR 0
#define FQLA_VERSION_MINOR 1
#define FQLA_VERSION_PATCH 0
#endif
#define FQLA_VERSION_STR_(x) #x
#define FQLA_VERSION_STR(x) FQLA_VERSION_STR_(x)
#define FQLA_VERSION_STRING \
    FQLA_VERSION_STR(FQLA_VERSION_MAJOR) "." FQLA_VERSION_STR(FQLA_VERSION_MINOR) "." FQLA_VERSION_STR(FQLA_VERSION_PATCH)
/* FQLA_VERSION_MAJOR * 10000 + FQLA_VERSION_MINOR * 100 + FQLA_VERSION_PATCH */
#define FQLA_VERSION (FQLA_VERSION_MAJOR * 10000 + FQLA_VERSION_MINOR * 100 + FQLA_VERSION_PATCH)

/* The version the library was built as (FQLA_VERSION of its headers). */
FQLA_API int fqla_version(void);

/* ------------------------------------------------------------------------ */
/* Status                                                                    */

typedef enum fqla_status {
    FQLA_STATUS_SUCCESS = 0,
    FQLA_STATUS_INVALID_VALUE,       /* a bad argument: pointer, shape, stride, value */
    FQLA_STATUS_INVALID_CONTEXT,     /* NULL or destroyed context */
    FQLA_STATUS_NOT_SUPPORTED,       /* legal, but no kernel of this backend covers it */
    FQLA_STATUS_ARCH_MISMATCH,       /* the GPU is not the architecture the kernels need */
    FQLA_STATUS_MISALIGNED,          /* a pointer or stride not aligned as required */
    FQLA_STATUS_WORKSPACE_TOO_SMALL, /* workspace smaller than the query said */
    FQLA_STATUS_OVERFLOW,            /* a size whose product overflows 64 bits */
    FQLA_STATUS_ALLOC_FAILED,        /* host memory could not be allocated (CPU backend) */
    FQLA_STATUS_BACKEND_UNAVAILABLE, /* backend not compiled in, or no device present */
    FQLA_STATUS_DEVICE_ERROR,        /* the CUDA runtime reported an error */
    FQLA_STATUS_INTERNAL_ERROR
} fqla_status;

/* A static string naming the status ("FQLA_STATUS_INVALID_VALUE"). */
FQLA_API const char *fqla_status_string(fqla_status status);

/* ------------------------------------------------------------------------ */
/* Context                                                                   */

typedef enum fqla_backend {
    FQLA_BACKEND_CPU = 0,           /* fast fp32 path, multi-threaded */
    FQLA_BACKEND_CUDA = 1,          /* sm_90a kernels */
    FQLA_BACKEND_CPU_REFERENCE = 2  /* fp64 token recurrence: the oracle (slow) */
} fqla_backend;

/* A context is named by an opaque handle, never dereferenced by the caller.
 * Handles are unique for the life of the process: the handle of a destroyed
 * context is rejected with FQLA_STATUS_INVALID_CONTEXT (message naming ctx,
 * nothing launched or written) even after later contexts are created, and
 * fqla_last_error of it gives the calling thread's message.
 *
 * Threads: calls on one context may run concurrently. A call reads the
 * context's thread count once as it starts, so fqla_context_set_threads
 * beside running calls is safe and applies to the calls that start after it
 * returns. A context destroyed while a call on it runs in another thread
 * stays valid for that call and is freed when it ends.
 *
 * Messages: every function that returns an fqla_status leaves its message
 * on failure and "" on success: in the context's message when it was given
 * a live context, else in the calling thread's (fqla_last_error(NULL)); a
 * call on a live context also clears the calling thread's message. */
typedef struct fqla_context fqla_context;

/* Creates a context for a backend and device (device is the CUDA ordinal;
 * 0 for the CPU backends). *ctx is set to NULL on failure; the reason is then
 * in fqla_last_error(NULL). */
FQLA_API fqla_status fqla_context_create(fqla_context **ctx, fqla_backend backend, int device);
/* Destroys a context. NULL is a no-op; a destroyed context is rejected by
 * every later call with FQLA_STATUS_INVALID_CONTEXT. */
FQLA_API fqla_status fqla_context_destroy(fqla_context *ctx);
/* CPU backends: worker threads per call (>= 1; 0 = number of online cores). */
FQLA_API fqla_status fqla_context_set_threads(fqla_context *ctx, int threads);

/* The last error message of ctx (of the calling thread when ctx is NULL or
 * not a live context); "" when the last call succeeded. The text is the
 * calling thread's copy, valid until its fourth next fqla_last_error call.
 * With calls on one context from several threads it is the latest message
 * of any of them: give each thread its own context for per-call messages. */
FQLA_API const char *fqla_last_error(const fqla_context *ctx);

typedef struct fqla_device_info {
    fqla_backend backend;
    int device;
    char name[128];      /* GPU name, or "cpu" */
    int cc_major;        /* compute capability (0 on the CPU) */
    int cc_minor;
    int sm_count;        /* SMs, or online CPU cores */
    int threads;         /* CPU worker threads (0 on CUDA) */
} fqla_device_info;

FQLA_API fqla_status fqla_context_info(const fqla_context *ctx, fqla_device_info *info);

/* Whether a backend is compiled in and has a usable device (returns
 * FQLA_STATUS_SUCCESS or FQLA_STATUS_BACKEND_UNAVAILABLE; a reason string is
 * written to why[0..why_size) when why is not NULL). */
FQLA_API fqla_status fqla_backend_available(fqla_backend backend, char *why, size_t why_size);

/* ------------------------------------------------------------------------ */
/* Tensors                                                                   */

typedef enum fqla_dtype {
    FQLA_DTYPE_F32 = 0,
    FQLA_DTYPE_F16 = 1,
    FQLA_DTYPE_BF16 = 2,
    FQLA_DTYPE_F64 = 3,   /* accepted by FQLA_BACKEND_CPU_REFERENCE only */
    FQLA_DTYPE_I32 = 4,   /* cu_seqlens, slots */
    FQLA_DTYPE_I64 = 5
} fqla_dtype;

FQLA_API const char *fqla_dtype_string(fqla_dtype dtype);
FQLA_API size_t fqla_dtype_size(fqla_dtype dtype);

#define FQLA_MAX_DIMS 6

/* A strided view. data == NULL marks an optional tensor as absent. Strides are
 * in elements, outermost first; the last one must be 1.
 * fqla_tensor_contiguous with a NULL shape (and ndim > 0) gives sizes of -1
 * and keeps an ndim outside 0..FQLA_MAX_DIMS as given: every call rejects
 * such a tensor with FQLA_STATUS_INVALID_VALUE, naming the argument. */
typedef struct fqla_tensor {
    void *data;
    fqla_dtype dtype;
    int ndim;
    int64_t shape[FQLA_MAX_DIMS];
    int64_t strides[FQLA_MAX_DIMS];
} fqla_tensor;

/* A contiguous (row-major) tensor over data. shape has ndim entries. */
FQLA_API fqla_tensor fqla_tensor_contiguous(void *data, fqla_dtype dtype, int ndim, const int64_t *shape);
/* Number of elements (product of the shape; 0 for an absent tensor or a
 * size <= 0, -1 when the product overflows int64). */
FQLA_API int64_t fqla_tensor_numel(const fqla_tensor *t);

/* ------------------------------------------------------------------------ */
/* Options shared by every operation                                          */

/* scale == FQLA_SCALE_DEFAULT selects 1 / sqrt(K); otherwise it must be finite
 * and > 0. */
#define FQLA_SCALE_DEFAULT 0.0

typedef struct fqla_options {
    double scale;
    int use_qk_l2norm;        /* q, k <- x / sqrt(sum x^2 + 1e-6) inside */
    int use_gate_in_kernel;   /* g is the raw gate input a; needs A_log, dt_bias */
    int use_beta_sigmoid;     /* beta is the raw input b: beta = sigmoid(b) */
    int allow_neg_eigval;     /* with use_beta_sigmoid: beta = 2 sigmoid(b) */
    int state_v_first;        /* states are [.., V, K] instead of [.., K, V] */
} fqla_options;

/* ------------------------------------------------------------------------ */
/* Forward (chunked prefill)                                                  */

/* The final state alone: leave o absent (data == NULL) and give final_state.
 * The call writes final_state only, the same values a full forward of the
 * same inputs writes there, bit for bit, and skips the output's work. From
 * initial_state = [0 | I] with values [v | 0] (V + K value columns) it gives
 * a run of tokens' affine map S_end = H + M S_start as [H | M] in one call
 * (docs/distributed.md). CPU backends; CUDA at K = 64 or 128 with V a
 * multiple of 64 (a state-only chunk kernel; fp32 q/k/v on the recurrence),
 * elsewhere NOT_SUPPORTED naming the final state alone.
 * o absent without final_state is FQLA_STATUS_INVALID_VALUE naming o. */

typedef struct fqla_fwd_args {
    fqla_tensor q;              /* [B, T, H, K]                           in  */
    fqla_tensor k;              /* [B, T, H, K]                           in  */
    fqla_tensor v;              /* [B, T, HV, V]                          in  */
    fqla_tensor g;              /* [B, T, HV] log decay <= 0 (raw a with use_gate_in_kernel), f32 or bf16 */
    fqla_tensor beta;           /* [B, T, HV] (raw b with use_beta_sigmoid), f32 or bf16 */
    fqla_tensor A_log;          /* [HV] f32, use_gate_in_kernel only          */
    fqla_tensor dt_bias;        /* [HV] f32, use_gate_in_kernel only          */
    fqla_tensor initial_state;  /* [N, HV, K, V] f32 (bf16 on CPU), optional  */
    fqla_tensor cu_seqlens;     /* [N + 1] i32/i64, optional; B must be 1     */
    const int64_t *cu_seqlens_host; /* [N + 1] host copy of cu_seqlens, optional
                                       (CUDA: used for validation and planning
                                       without synchronising; equal lengths
                                       that fill T run as a padded batch, so
                                       it must match cu_seqlens. Without it a
                                       CUDA context trusts the device values:
                                       starting at 0, never decreasing, at
                                       most T; reading them would synchronise) */
    fqla_tensor o;              /* [B, T, HV, V], dtype of q             out
                                   (absent: the final state alone, above)     */
    fqla_tensor final_state;    /* [N, HV, K, V] f32, optional           out  */
    fqla_options opt;
} fqla_fwd_args;

/* Zeroes args and sets the defaults (scale = FQLA_SCALE_DEFAULT). */
FQLA_API void fqla_fwd_args_init(fqla_fwd_args *args);

/* FQLA_STATUS_SUCCESS when this backend can run args as given; otherwise the
 * status the call would return. Nothing runs and no tensor data is read,
 * except the values of cu_seqlens (and, for decode, slots) on CPU contexts,
 * where they are host memory and are validated. */
FQLA_API fqla_status fqla_fwd_supported(fqla_context *ctx, const fqla_fwd_args *args);
/* On CUDA the size follows from the shapes and, for packed varlen input, from
 * cu_seqlens_host's values when it is given (they steer the context-parallel
 * plan): query again when they change. */
FQLA_API fqla_status fqla_fwd_workspace_size(fqla_context *ctx, const fqla_fwd_args *args, size_t *bytes);
/* Rows of o beyond the last cu_seqlens entry are written as zeros. */
FQLA_API fqla_status fqla_fwd(fqla_context *ctx, const fqla_fwd_args *args,
                              void *workspace, size_t workspace_bytes, void *stream);

/* ------------------------------------------------------------------------ */
/* Backward                                                                   */

/* Gradients are with respect to the tensors passed to the forward: with
 * use_gate_in_kernel dg is the gradient of the raw gate input a, with
 * use_beta_sigmoid dbeta that of b, with use_qk_l2norm dq/dk those of the raw
 * q/k. dq and dk are summed over each GVA group.
 *
 * The gradient of the start state alone: leave all of dq, dk, dv, dg and
 * dbeta absent (data == NULL) and give d_initial_state (so initial_state is
 * given too); dA_log and ddt_bias must then be absent as well, even with
 * use_gate_in_kernel. The call writes d_initial_state only, the same values
 * as a full backward of the same inputs writes there, bit for bit, and
 * costs less: the state gradient flows backwards through the sequence
 * without the forward's states, so a backend skips the forward state pass
 * and the per-token gradients.
 * The workspace query of such args gives what this call needs (no more
 * than the full backward's). Some but not all of the five absent is
 * FQLA_STATUS_INVALID_VALUE naming the first absent one. At T = 0, where a
 * full backward's five may have data == NULL as empty tensors, giving
 * dA_log or ddt_bias selects the full backward (dA_log = ddt_bias = 0). */
typedef struct fqla_bwd_args {
    /* the forward's inputs, exactly as given to fqla_fwd */
    fqla_tensor q, k, v, g, beta, A_log, dt_bias, initial_state, cu_seqlens;
    const int64_t *cu_seqlens_host;
    fqla_tensor d_o;            /* [B, T, HV, V], dtype of q              in  */
    fqla_tensor d_final_state;  /* [N, HV, K, V] f32, optional            in  */
    /* dq .. dbeta: all given, or all absent for d_initial_state alone (above) */
    fqla_tensor dq;             /* [B, T, H, K], dtype of q              out  */
    fqla_tensor dk;             /* [B, T, H, K], dtype of q              out  */
    fqla_tensor dv;             /* [B, T, HV, V], dtype of q             out  */
    fqla_tensor dg;             /* [B, T, HV] f32                        out  */
    fqla_tensor dbeta;          /* [B, T, HV] f32                        out  */
    fqla_tensor d_initial_state;/* [N, HV, K, V] f32, required iff initial_state given  out */
    fqla_tensor dA_log;         /* [HV] f32, required iff use_gate_in_kernel  out
                                   (absent with d_initial_state alone)        */
    fqla_tensor ddt_bias;       /* [HV] f32, required iff use_gate_in_kernel  out
                                   (absent with d_initial_state alone)        */
    fqla_options opt;
} fqla_bwd_args;

FQLA_API void fqla_bwd_args_init(fqla_bwd_args *args);
FQLA_API fqla_status fqla_bwd_supported(fqla_context *ctx, const fqla_bwd_args *args);
/* As for the forward: on CUDA the size follows from the shapes and, for packed
 * varlen input, from cu_seqlens_host's values when it is given. */
FQLA_API fqla_status fqla_bwd_workspace_size(fqla_context *ctx, const fqla_bwd_args *args, size_t *bytes);
FQLA_API fqla_status fqla_bwd(fqla_context *ctx, const fqla_bwd_args *args,
                              void *workspace, size_t workspace_bytes, void *stream);

/* ------------------------------------------------------------------------ */
/* Decode (one token) and verify (T draft tokens) on a state pool            */

/* B sequences, each with T new tokens (T = 1 for fqla_decode), reading the
 * state pool entry slots[b]. A negative slot marks padding: its pool entry is
 * never read or written and its o rows are zeroed (its token inputs may be
 * read, so they must be valid memory). A slot >= P is an
 * error (checked on the CPU, and on CUDA when slots_host is given; without it
 * a CUDA kernel skips such a sequence and writes NaN to its o rows).
 * Duplicate non-negative slots are an error when the slots can be read on the
 * host; on CUDA without slots_host the result is undefined, as for a scatter
 * with repeated indices.
 *
 * fqla_decode writes the state after the token back to state_pool[slots[b]].
 * fqla_verify leaves the pool untouched and writes the state after every
 * token t to exactly one of
 *     step_states [B, T, HV, K, V] (dtype of the pool), or
 *     step_slots  [B, T] i32/i64: state_pool[step_slots[b, t]] (negative = skip),
 * so an engine keeps the state at the accepted position. */
typedef struct fqla_decode_args {
    fqla_tensor q;              /* [B, T, H, K]                           in  */
    fqla_tensor k;              /* [B, T, H, K]                           in  */
    fqla_tensor v;              /* [B, T, HV, V]                          in  */
    fqla_tensor g;              /* [B, T, HV] (raw a with use_gate_in_kernel) */
    fqla_tensor beta;           /* [B, T, HV] (raw b with use_beta_sigmoid)  */
    fqla_tensor A_log;          /* [HV] f32, use_gate_in_kernel only          */
    fqla_tensor dt_bias;        /* [HV] f32, use_gate_in_kernel only          */
    fqla_tensor state_pool;     /* [P, HV, K, V] ([P, HV, V, K]), f32 or bf16, in/out */
    fqla_tensor slots;          /* [B] i32/i64                            in  */
    const int64_t *slots_host;  /* [B] host copy of slots, optional           */
    fqla_tensor o;              /* [B, T, HV, V], dtype of q             out  */
    fqla_tensor step_states;    /* verify: [B, T, HV, K, V] (or [.., V, K]) out */
    fqla_tensor step_slots;     /* verify: [B, T] i32/i64                 in  */
    fqla_options opt;
} fqla_decode_args;

FQLA_API void fqla_decode_args_init(fqla_decode_args *args);
FQLA_API fqla_status fqla_decode_supported(fqla_context *ctx, const fqla_decode_args *args);
FQLA_API fqla_status fqla_decode_workspace_size(fqla_context *ctx, const fqla_decode_args *args, size_t *bytes);
FQLA_API fqla_status fqla_decode(fqla_context *ctx, const fqla_decode_args *args,
                                 void *workspace, size_t workspace_bytes, void *stream);

FQLA_API fqla_status fqla_verify_supported(fqla_context *ctx, const fqla_decode_args *args);
FQLA_API fqla_status fqla_verify_workspace_size(fqla_context *ctx, const fqla_decode_args *args, size_t *bytes);
FQLA_API fqla_status fqla_verify(fqla_context *ctx, const fqla_decode_args *args,
                                 void *workspace, size_t workspace_bytes, void *stream);

#ifdef __cplusplus
}
#endif
#endif /* FLASHQLA_H */
