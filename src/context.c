/*
 * context.c - contexts, the registry of live contexts, error messages,
 * status names and the version.
 *
 * Every public call first asks fqla_context_is_live(): the registry (a small
 * mutex-guarded list of live contexts) lets a destroyed or never-created
 * pointer be rejected with FQLA_STATUS_INVALID_CONTEXT instead of being
 * dereferenced. Messages for calls without a usable context go to a
 * thread-local buffer, read by fqla_last_error(NULL).
 */
#include "internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int fqla_version(void) { return FQLA_VERSION; }

const char *fqla_status_string(fqla_status status)
{
    switch (status) {
    case FQLA_STATUS_SUCCESS: return "FQLA_STATUS_SUCCESS";
    case FQLA_STATUS_INVALID_VALUE: return "FQLA_STATUS_INVALID_VALUE";
    case FQLA_STATUS_INVALID_CONTEXT: return "FQLA_STATUS_INVALID_CONTEXT";
    case FQLA_STATUS_NOT_SUPPORTED: return "FQLA_STATUS_NOT_SUPPORTED";
    case FQLA_STATUS_ARCH_MISMATCH: return "FQLA_STATUS_ARCH_MISMATCH";
    case FQLA_STATUS_MISALIGNED: return "FQLA_STATUS_MISALIGNED";
    case FQLA_STATUS_WORKSPACE_TOO_SMALL: return "FQLA_STATUS_WORKSPACE_TOO_SMALL";
    case FQLA_STATUS_OVERFLOW: return "FQLA_STATUS_OVERFLOW";
    case FQLA_STATUS_ALLOC_FAILED: return "FQLA_STATUS_ALLOC_FAILED";
    case FQLA_STATUS_BACKEND_UNAVAILABLE: return "FQLA_STATUS_BACKEND_UNAVAILABLE";
    case FQLA_STATUS_DEVICE_ERROR: return "FQLA_STATUS_DEVICE_ERROR";
    case FQLA_STATUS_INTERNAL_ERROR: return "FQLA_STATUS_INTERNAL_ERROR";
    }
    return "FQLA_STATUS_UNKNOWN";
}

/* ---- registry of live contexts ---- */

#define MAX_LIVE_CONTEXTS 4096

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static const fqla_context *live[MAX_LIVE_CONTEXTS];
static int n_live;

int fqla_context_is_live(const fqla_context *ctx)
{
    int found = 0;
    if (!ctx) return 0;
    pthread_mutex_lock(&registry_lock);
    for (int i = 0; i < n_live && !found; i++) found = live[i] == ctx;
    pthread_mutex_unlock(&registry_lock);
    return found;
}

static int registry_add(const fqla_context *ctx)
{
    int ok = 0;
    pthread_mutex_lock(&registry_lock);
    if (n_live < MAX_LIVE_CONTEXTS) {
        live[n_live++] = ctx;
        ok = 1;
    }
    pthread_mutex_unlock(&registry_lock);
    return ok;
}

static int registry_remove(const fqla_context *ctx)
{
    int found = 0;
    pthread_mutex_lock(&registry_lock);
    for (int i = 0; i < n_live; i++) {
        if (live[i] == ctx) {
            live[i] = live[--n_live];
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&registry_lock);
    return found;
}

/* ---- errors ---- */

/* C99 has no thread_local keyword; GCC and clang spell it __thread. */
static __thread char thread_error[FQLA_ERROR_LEN];
/* fqla_last_error's copies of a context's message: a ring, so that a few
 * results stay valid together (two contexts' messages in one printf) */
#define ERROR_COPIES 4
static __thread char thread_copy[ERROR_COPIES][FQLA_ERROR_LEN];
static __thread int thread_copy_next;

/* A context's message is written, cleared and read under its lock: calls
 * may run concurrently on one context (include/flashqla.h), and an unlocked
 * vsnprintf into the buffer another thread reads was a data race. */
fqla_status fqla_fail(fqla_context *ctx, fqla_status status, const char *fmt, ...)
{
    char local[FQLA_ERROR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx ? local : thread_error, FQLA_ERROR_LEN, fmt, ap);
    va_end(ap);
    if (ctx) {
        pthread_mutex_lock(&ctx->error_lock);
        memcpy(ctx->error, local, strlen(local) + 1);
        pthread_mutex_unlock(&ctx->error_lock);
    }
    return status;
}

void fqla_clear_error(fqla_context *ctx)
{
    if (ctx) {
        pthread_mutex_lock(&ctx->error_lock);
        ctx->error[0] = '\0';
        pthread_mutex_unlock(&ctx->error_lock);
    }
    thread_error[0] = '\0';
}

const char *fqla_last_error(const fqla_context *ctx)
{
    if (!ctx || !fqla_context_is_live(ctx)) return thread_error;
    char *copy = thread_copy[thread_copy_next];
    thread_copy_next = (thread_copy_next + 1) % ERROR_COPIES;
    fqla_context *c = (fqla_context *)ctx; /* the lock, not the message, changes */
    pthread_mutex_lock(&c->error_lock);
    memcpy(copy, c->error, strlen(c->error) + 1);
    pthread_mutex_unlock(&c->error_lock);
    return copy;
}

/* ---- contexts ---- */

static int online_cores(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

fqla_status fqla_backend_available(fqla_backend backend, char *why, size_t why_size)
{
    char local[256];
    char *msg = why && why_size ? why : local;
    size_t msg_size = why && why_size ? why_size : sizeof local;
    msg[0] = '\0';
    switch (backend) {
    case FQLA_BACKEND_CPU:
    case FQLA_BACKEND_CPU_REFERENCE:
        return FQLA_STATUS_SUCCESS;
    case FQLA_BACKEND_CUDA: {
        fqla_device_info info;
        return fqla_cuda_device_query(0, &info, msg, msg_size);
    }
    }
    snprintf(msg, msg_size, "unknown backend %d", (int)backend);
    return FQLA_STATUS_INVALID_VALUE;
}

fqla_status fqla_context_create(fqla_context **out, fqla_backend backend, int device)
{
    fqla_clear_error(NULL);
    if (!out) return fqla_fail(NULL, FQLA_STATUS_INVALID_VALUE, "ctx: NULL pointer to the context handle");
    *out = NULL;
    if (backend != FQLA_BACKEND_CPU && backend != FQLA_BACKEND_CPU_REFERENCE && backend != FQLA_BACKEND_CUDA)
        return fqla_fail(NULL, FQLA_STATUS_INVALID_VALUE, "backend: unknown value %d", (int)backend);
    if (device < 0)
        return fqla_fail(NULL, FQLA_STATUS_INVALID_VALUE, "device: %d is negative", device);
    if (backend != FQLA_BACKEND_CUDA && device != 0)
        return fqla_fail(NULL, FQLA_STATUS_INVALID_VALUE, "device: %d, but the CPU backends have only device 0", device);

    fqla_device_info info;
    memset(&info, 0, sizeof info);
    info.backend = backend;
    info.device = device;
    if (backend == FQLA_BACKEND_CUDA) {
        char why[256];
        fqla_status st = fqla_cuda_device_query(device, &info, why, sizeof why);
        if (st != FQLA_STATUS_SUCCESS) return fqla_fail(NULL, st, "backend CUDA, device %d: %s", device, why);
    } else {
        snprintf(info.name, sizeof info.name, "cpu");
        info.sm_count = online_cores();
        info.threads = info.sm_count;
    }

    fqla_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return fqla_fail(NULL, FQLA_STATUS_ALLOC_FAILED, "ctx: out of host memory");
    ctx->magic = FQLA_CONTEXT_MAGIC;
    ctx->backend = backend;
    ctx->device = device;
    ctx->threads = info.threads;
    ctx->info = info;
    pthread_mutex_init(&ctx->error_lock, NULL);
    if (!registry_add(ctx)) {
        pthread_mutex_destroy(&ctx->error_lock);
        free(ctx);
        return fqla_fail(NULL, FQLA_STATUS_ALLOC_FAILED, "ctx: more than %d live contexts", MAX_LIVE_CONTEXTS);
    }
    *out = ctx;
    return FQLA_STATUS_SUCCESS;
}

fqla_status fqla_context_destroy(fqla_context *ctx)
{
    if (!ctx) return FQLA_STATUS_SUCCESS;
    if (!registry_remove(ctx))
        return fqla_fail(NULL, FQLA_STATUS_INVALID_CONTEXT, "ctx: not a live context (destroyed twice?)");
    ctx->magic = 0;
    pthread_mutex_destroy(&ctx->error_lock);
    free(ctx);
    return FQLA_STATUS_SUCCESS;
}

fqla_status fqla_context_set_threads(fqla_context *ctx, int threads)
{
    if (!fqla_context_is_live(ctx))
        return fqla_fail(NULL, FQLA_STATUS_INVALID_CONTEXT, "ctx: NULL or destroyed context");
    fqla_clear_error(ctx);
    if (ctx->backend == FQLA_BACKEND_CUDA)
        return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE, "threads: the CUDA backend takes no thread count");
    if (threads < 0 || threads > 1024)
        return fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE, "threads: %d is outside 0..1024", threads);
    ctx->threads = threads ? threads : online_cores();
    ctx->info.threads = ctx->threads;
    return FQLA_STATUS_SUCCESS;
}

fqla_status fqla_context_info(const fqla_context *ctx, fqla_device_info *info)
{
    if (!fqla_context_is_live(ctx))
        return fqla_fail(NULL, FQLA_STATUS_INVALID_CONTEXT, "ctx: NULL or destroyed context");
    if (!info) return fqla_fail((fqla_context *)ctx, FQLA_STATUS_INVALID_VALUE, "info: NULL pointer");
    *info = ctx->info;
    return FQLA_STATUS_SUCCESS;
}
