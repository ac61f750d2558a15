/*
 * context.c - contexts and their handles, error messages, status names and
 * the version.
 *
 * Every public call starts with fqla_context_acquire(): the handle is looked
 * up in a table of live contexts (below), so a NULL, destroyed or
 * never-created handle is rejected with FQLA_STATUS_INVALID_CONTEXT instead
 * of being dereferenced. Messages for calls without a usable context go to a
 * thread-local buffer, read by fqla_last_error(NULL).
 */
#include "internal.h"
#include "cpu/threads.h"

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

/* ---- handles: a table of live contexts ----
 *
 * The handle a caller holds is not the context's address: its value is
 * (generation << SLOT_BITS) | slot, where slot indexes the table below and
 * generation is the slot's count of contexts created in it. A destroyed
 * context's handle therefore never matches again, even when its slot or its
 * memory serves a later context (comparing addresses accepted such a handle
 * once malloc handed the same block to a new context). Handles are never
 * dereferenced, so a garbage value is just a lookup that fails.
 *
 * Generations start at 1, so no handle is NULL. With 64-bit pointers they
 * cannot wrap (2^52 contexts per slot); with 32-bit pointers (2^20 per slot)
 * slots are handed out round-robin, so a handle value comes back only after
 * about 2^32 creations.
 *
 * A call holds a reference to the context from its start to its end (refs,
 * raised under the table lock; the handle itself is one reference), so a context
 * destroyed from another thread while a call runs on it is freed after that
 * call, never under it. */

#define SLOT_BITS 12
#define MAX_LIVE_CONTEXTS (1 << SLOT_BITS)
#define MAX_GENERATION (UINTPTR_MAX >> SLOT_BITS)

typedef struct context_slot {
    fqla_context *ctx;    /* NULL when the slot is free */
    uintptr_t generation; /* of the slot's latest context */
} context_slot;

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static context_slot table[MAX_LIVE_CONTEXTS];
static unsigned next_slot; /* where the search for a free slot starts */

static fqla_context *handle_of(unsigned slot, uintptr_t generation)
{
    return (fqla_context *)((generation << SLOT_BITS) | (uintptr_t)slot);
}

/* The slot a handle names when its generation is current, else NULL (under table_lock). */
static context_slot *lookup(const fqla_context *handle)
{
    const uintptr_t h = (uintptr_t)handle;
    context_slot *s = &table[h & (MAX_LIVE_CONTEXTS - 1)];
    if (h >> SLOT_BITS == 0 || !s->ctx || s->generation != h >> SLOT_BITS) return NULL;
    return s;
}

fqla_context *fqla_context_acquire(const fqla_context *handle)
{
    fqla_context *ctx = NULL;
    pthread_mutex_lock(&table_lock);
    context_slot *s = lookup(handle);
    if (s) {
        ctx = s->ctx;
        __atomic_add_fetch(&ctx->refs, 1, __ATOMIC_RELAXED); /* ordered by the lock */
    }
    pthread_mutex_unlock(&table_lock);
    return ctx;
}

static void context_free(fqla_context *ctx)
{
    fqla_cpu_pool_destroy(ctx->cpu_pool);
    pthread_mutex_destroy(&ctx->lock);
    free(ctx);
}

/* Without the table lock: a context whose count reached 0 is out of the
 * table (destroy removes it before dropping the handle's reference), so no
 * acquire can raise it again. */
void fqla_context_release(fqla_context *ctx)
{
    if (ctx && __atomic_sub_fetch(&ctx->refs, 1, __ATOMIC_ACQ_REL) == 0) context_free(ctx);
}

/* Enters ctx into a free slot; its handle, or NULL when the table is full. */
static fqla_context *table_add(fqla_context *ctx)
{
    fqla_context *handle = NULL;
    pthread_mutex_lock(&table_lock);
    for (unsigned n = 0; n < MAX_LIVE_CONTEXTS && !handle; n++) {
        const unsigned i = (next_slot + n) % MAX_LIVE_CONTEXTS;
        context_slot *s = &table[i];
        if (s->ctx) continue;
        s->generation = s->generation == MAX_GENERATION ? 1 : s->generation + 1;
        s->ctx = ctx;
        ctx->refs = 1;
        next_slot = (i + 1) % MAX_LIVE_CONTEXTS;
        handle = handle_of(i, s->generation);
    }
    pthread_mutex_unlock(&table_lock);
    return handle;
}

/* Takes handle's context out of the table; the context, or NULL when handle is not live. */
static fqla_context *table_remove(const fqla_context *handle)
{
    fqla_context *ctx = NULL;
    pthread_mutex_lock(&table_lock);
    context_slot *s = lookup(handle);
    if (s) {
        ctx = s->ctx;
        s->ctx = NULL;
    }
    pthread_mutex_unlock(&table_lock);
    return ctx;
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
 * may run concurrently on one context, and an unlocked vsnprintf into the
 * buffer another thread reads was a data race. */
fqla_status fqla_fail(fqla_context *ctx, fqla_status status, const char *fmt, ...)
{
    char local[FQLA_ERROR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx ? local : thread_error, FQLA_ERROR_LEN, fmt, ap);
    va_end(ap);
    if (ctx) {
        pthread_mutex_lock(&ctx->lock);
        memcpy(ctx->error, local, strlen(local) + 1);
        pthread_mutex_unlock(&ctx->lock);
    }
    return status;
}

void fqla_clear_error(fqla_context *ctx)
{
    if (ctx) {
        pthread_mutex_lock(&ctx->lock);
        ctx->error[0] = '\0';
        pthread_mutex_unlock(&ctx->lock);
    }
    thread_error[0] = '\0';
}

fqla_status fqla_context_enter(const fqla_context *handle, fqla_context **ctx)
{
    *ctx = fqla_context_acquire(handle);
    if (!*ctx) {
        if (!handle) return fqla_fail(NULL, FQLA_STATUS_INVALID_CONTEXT, "ctx: NULL context");
        return fqla_fail(NULL, FQLA_STATUS_INVALID_CONTEXT,
                         "ctx: %p is not a live context (destroyed, or never created)", (const void *)handle);
    }
    fqla_clear_error(*ctx);
    return FQLA_STATUS_SUCCESS;
}

const char *fqla_last_error(const fqla_context *handle)
{
    fqla_context *ctx = fqla_context_acquire(handle);
    if (!ctx) return thread_error;
    char *copy = thread_copy[thread_copy_next];
    thread_copy_next = (thread_copy_next + 1) % ERROR_COPIES;
    pthread_mutex_lock(&ctx->lock);
    memcpy(copy, ctx->error, strlen(ctx->error) + 1);
    pthread_mutex_unlock(&ctx->lock);
    fqla_context_release(ctx);
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
    fqla_status st = FQLA_STATUS_SUCCESS;
    msg[0] = '\0';
    switch (backend) {
    case FQLA_BACKEND_CPU:
    case FQLA_BACKEND_CPU_REFERENCE:
        break;
    case FQLA_BACKEND_CUDA: {
        fqla_device_info info;
        st = fqla_cuda_device_query(0, &info, msg, msg_size);
        break;
    }
    default:
        snprintf(msg, msg_size, "unknown backend %d", (int)backend);
        return fqla_fail(NULL, FQLA_STATUS_INVALID_VALUE, "backend: unknown value %d", (int)backend);
    }
    /* the reason is also the calling thread's message, "" on success */
    if (st != FQLA_STATUS_SUCCESS) return fqla_fail(NULL, st, "backend CUDA: %s", msg);
    fqla_clear_error(NULL);
    return st;
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
    ctx->backend = backend;
    ctx->device = device;
    ctx->info = info;
    pthread_mutex_init(&ctx->lock, NULL);
    fqla_context *handle = table_add(ctx);
    if (!handle) {
        context_free(ctx);
        return fqla_fail(NULL, FQLA_STATUS_ALLOC_FAILED, "ctx: more than %d live contexts", MAX_LIVE_CONTEXTS);
    }
    *out = handle;
    return FQLA_STATUS_SUCCESS;
}

fqla_status fqla_context_destroy(fqla_context *handle)
{
    fqla_clear_error(NULL);
    if (!handle) return FQLA_STATUS_SUCCESS;
    fqla_context *ctx = table_remove(handle);
    if (!ctx)
        return fqla_fail(NULL, FQLA_STATUS_INVALID_CONTEXT,
                         "ctx: %p is not a live context (destroyed twice, or never created)", (const void *)handle);
    fqla_context_release(ctx); /* the handle's reference: frees it unless a call still runs on it */
    return FQLA_STATUS_SUCCESS;
}

fqla_status fqla_context_set_threads(fqla_context *handle, int threads)
{
    fqla_context *ctx;
    fqla_status st = fqla_context_enter(handle, &ctx);
    if (st != FQLA_STATUS_SUCCESS) return st;
    if (ctx->backend == FQLA_BACKEND_CUDA)
        st = fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE, "threads: the CUDA backend takes no thread count");
    else if (threads < 0 || threads > 1024)
        st = fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE, "threads: %d is outside 0..1024", threads);
    else {
        pthread_mutex_lock(&ctx->lock);
        ctx->info.threads = threads ? threads : online_cores();
        pthread_mutex_unlock(&ctx->lock);
    }
    fqla_context_release(ctx);
    return st;
}

int fqla_context_threads(fqla_context *ctx)
{
    pthread_mutex_lock(&ctx->lock);
    const int threads = ctx->info.threads;
    pthread_mutex_unlock(&ctx->lock);
    return threads;
}

fqla_status fqla_context_info(const fqla_context *handle, fqla_device_info *info)
{
    fqla_context *ctx;
    fqla_status st = fqla_context_enter(handle, &ctx);
    if (st != FQLA_STATUS_SUCCESS) return st;
    if (!info)
        st = fqla_fail(ctx, FQLA_STATUS_INVALID_VALUE, "info: NULL pointer");
    else {
        pthread_mutex_lock(&ctx->lock); /* info.threads changes under it */
        *info = ctx->info;
        pthread_mutex_unlock(&ctx->lock);
    }
    fqla_context_release(ctx);
    return st;
}
