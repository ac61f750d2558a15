/*
 * test_handles.c - context handles, the thread count and messages:
 *
 *   - a destroyed context's handle stays rejected after later contexts are
 *     created (the old registry compared addresses, so a handle came back to
 *     life once malloc gave its memory to a new context), the call launches
 *     and writes nothing, and it never touches the new context;
 *   - fqla_context_set_threads beside running calls on the same context, and
 *     a destroy beside them: the calls finish normally. tests/run_all.sh also
 *     runs this program under ThreadSanitizer, which reported the unlocked
 *     thread count write and read as a data race before;
 *   - fqla_tensor_contiguous with a NULL shape (a crash before) or an ndim
 *     out of range gives a tensor every call rejects, naming the argument;
 *   - a successful call leaves "" as the message, for every call that
 *     returns a status (fqla_context_info and fqla_context_destroy kept the
 *     previous message before).
 */
#include "common/check.h"
#include "flashqla.h"

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* A small CPU forward: B = 1, T = 64, H = HV = 2, K = V = 32. */
enum { T = 64, H = 2, K = 32 };
#define QN (T * H * K)

typedef struct problem {
    float q[QN], k[QN], v[QN], g[T * H], beta[T * H], o[QN];
    fqla_fwd_args a;
} problem;

static void problem_init(problem *pr)
{
    static const int64_t sq[4] = {1, T, H, K}, sg[3] = {1, T, H};
    /* values from a local generator: threads build problems at once, and
     * check.h's generator is one shared state */
    uint32_t x = 12345u;
    for (int i = 0; i < QN; i++) {
        float r[3];
        for (int j = 0; j < 3; j++) {
            x = x * 1664525u + 1013904223u;
            r[j] = (float)(x >> 8) / 16777216.0f - 0.5f;
        }
        pr->q[i] = 0.2f * r[0];
        pr->k[i] = 0.2f * r[1];
        pr->v[i] = 2.0f * r[2];
        pr->o[i] = -7.0f; /* a sentinel: a rejected call must leave it */
    }
    for (int i = 0; i < T * H; i++) {
        pr->g[i] = -0.05f;
        pr->beta[i] = 0.5f;
    }
    fqla_fwd_args_init(&pr->a);
    pr->a.q = fqla_tensor_contiguous(pr->q, FQLA_DTYPE_F32, 4, sq);
    pr->a.k = fqla_tensor_contiguous(pr->k, FQLA_DTYPE_F32, 4, sq);
    pr->a.v = fqla_tensor_contiguous(pr->v, FQLA_DTYPE_F32, 4, sq);
    pr->a.g = fqla_tensor_contiguous(pr->g, FQLA_DTYPE_F32, 3, sg);
    pr->a.beta = fqla_tensor_contiguous(pr->beta, FQLA_DTYPE_F32, 3, sg);
    pr->a.o = fqla_tensor_contiguous(pr->o, FQLA_DTYPE_F32, 4, sq);
}

static int output_untouched(const problem *pr)
{
    for (int i = 0; i < QN; i++)
        if (pr->o[i] != -7.0f) return 0;
    return 1;
}

static fqla_context *create(fqla_backend backend)
{
    fqla_context *ctx = NULL;
    fqla_status st = fqla_context_create(&ctx, backend, 0);
    CHECK(st == FQLA_STATUS_SUCCESS && ctx, "context_create: %s: %s", fqla_status_string(st), fqla_last_error(NULL));
    return ctx;
}

/* Every call on a destroyed handle fails with INVALID_CONTEXT and a message
 * naming ctx, writes nothing and leaves `live` (created after it) alone. */
static void check_stale(fqla_context *stale, fqla_context *live, int round)
{
    problem *pr = malloc(sizeof *pr);
    fqla_device_info info;
    size_t bytes = 1;
    problem_init(pr);
    fqla_context_set_threads(live, 2);
    fqla_context_set_threads(live, 5000); /* leaves a message on live */
    char live_msg[512];
    snprintf(live_msg, sizeof live_msg, "%s", fqla_last_error(live));

    fqla_status st = fqla_fwd(stale, &pr->a, NULL, 0, NULL);
    CHECK(st == FQLA_STATUS_INVALID_CONTEXT, "round %d: fwd(destroyed ctx): %s", round, fqla_status_string(st));
    CHECK(strncmp(fqla_last_error(NULL), "ctx", 3) == 0, "round %d: message \"%s\"", round, fqla_last_error(NULL));
    CHECK(strncmp(fqla_last_error(stale), "ctx", 3) == 0, "round %d: fqla_last_error(destroyed): \"%s\"", round,
          fqla_last_error(stale));
    CHECK(output_untouched(pr), "round %d: fwd(destroyed ctx) wrote o", round);
    st = fqla_fwd_workspace_size(stale, &pr->a, &bytes);
    CHECK(st == FQLA_STATUS_INVALID_CONTEXT && bytes == 0, "round %d: fwd_workspace_size: %s, %zu", round,
          fqla_status_string(st), bytes);
    st = fqla_context_set_threads(stale, 1);
    CHECK(st == FQLA_STATUS_INVALID_CONTEXT, "round %d: set_threads: %s", round, fqla_status_string(st));
    st = fqla_context_info(stale, &info);
    CHECK(st == FQLA_STATUS_INVALID_CONTEXT, "round %d: context_info: %s", round, fqla_status_string(st));
    st = fqla_context_destroy(stale);
    CHECK(st == FQLA_STATUS_INVALID_CONTEXT, "round %d: destroy again: %s", round, fqla_status_string(st));
    CHECK(strncmp(fqla_last_error(NULL), "ctx", 3) == 0, "round %d: message \"%s\"", round, fqla_last_error(NULL));

    /* the live context: still there, its message and thread count untouched */
    CHECK(strcmp(fqla_last_error(live), live_msg) == 0, "round %d: the live context's message changed: \"%s\"",
          round, fqla_last_error(live));
    st = fqla_context_info(live, &info);
    CHECK(st == FQLA_STATUS_SUCCESS, "round %d: the live context is gone: %s", round, fqla_status_string(st));
    CHECK(info.threads == 2, "round %d: set_threads on the destroyed handle reached the live context", round);
    st = fqla_fwd(live, &pr->a, NULL, 0, NULL);
    CHECK(st == FQLA_STATUS_SUCCESS, "round %d: fwd on the live context: %s: %s", round, fqla_status_string(st),
          fqla_last_error(live));
    free(pr);
}

static void destroyed_handle_stays_dead(void)
{
    for (int round = 0; round < 16; round++) {
        /* destroy then create at once: the allocator tends to hand the new
         * context the old one's memory */
        fqla_context *old = create(FQLA_BACKEND_CPU);
        fqla_context_set_threads(old, 2);
        CHECK(fqla_context_destroy(old) == FQLA_STATUS_SUCCESS, "destroy");
        fqla_context *ctx = create(round % 2 ? FQLA_BACKEND_CPU_REFERENCE : FQLA_BACKEND_CPU);
        CHECK(ctx != old, "round %d: the new context has the destroyed one's handle %p", round, (void *)old);
        check_stale(old, ctx, round);
        fqla_context_destroy(ctx);
    }
}

static void garbage_handles_rejected(void)
{
    int local = 0;
    fqla_context *bad[4] = {(fqla_context *)&local, (fqla_context *)(uintptr_t)1,
                            (fqla_context *)(uintptr_t)0xdeadbeef0, (fqla_context *)UINTPTR_MAX};
    fqla_device_info info;
    for (int i = 0; i < 4; i++) {
        fqla_status st = fqla_context_info(bad[i], &info);
        CHECK(st == FQLA_STATUS_INVALID_CONTEXT, "context_info(%p): %s", (void *)bad[i], fqla_status_string(st));
        CHECK(strncmp(fqla_last_error(bad[i]), "ctx", 3) == 0, "message \"%s\"", fqla_last_error(bad[i]));
    }
    CHECK(local == 0, "a call wrote through a garbage handle");
}

/* ---- threads ---- */

#define WORKERS 3

typedef struct shared_job {
    fqla_context *ctx;
    int rounds;              /* calls to make (destroy test: until the context is gone) */
    int until_destroyed;
    int ok, rejected, other;
    fqla_status other_status;
} shared_job;

static void *call_loop(void *arg)
{
    shared_job *j = arg;
    problem *pr = malloc(sizeof *pr);
    problem_init(pr);
    for (int r = 0; j->until_destroyed || r < j->rounds; r++) {
        fqla_status st = fqla_fwd(j->ctx, &pr->a, NULL, 0, NULL);
        if (st == FQLA_STATUS_SUCCESS) j->ok++;
        else if (st == FQLA_STATUS_INVALID_CONTEXT) {
            j->rejected++;
            if (j->until_destroyed) break;
        } else {
            j->other++;
            j->other_status = st;
        }
    }
    free(pr);
    return NULL;
}

typedef struct threads_job {
    fqla_context *ctx;
    int stop;          /* under lock */
    int failed;
    pthread_mutex_t lock;
} threads_job;

static void *set_threads_loop(void *arg)
{
    threads_job *j = arg;
    for (int r = 0;; r++) {
        pthread_mutex_lock(&j->lock);
        const int stop = j->stop;
        pthread_mutex_unlock(&j->lock);
        if (stop) break;
        if (fqla_context_set_threads(j->ctx, 1 + r % 4) != FQLA_STATUS_SUCCESS) j->failed++;
    }
    return NULL;
}

static void set_threads_beside_calls(void)
{
    fqla_context *ctx = create(FQLA_BACKEND_CPU);
    threads_job tj;
    shared_job jobs[WORKERS];
    pthread_t setter, th[WORKERS];
    memset(&tj, 0, sizeof tj);
    pthread_mutex_init(&tj.lock, NULL);
    tj.ctx = ctx;
    pthread_create(&setter, NULL, set_threads_loop, &tj);
    for (int i = 0; i < WORKERS; i++) {
        memset(&jobs[i], 0, sizeof jobs[i]);
        jobs[i].ctx = ctx;
        jobs[i].rounds = check_quick() ? 20 : 100;
        pthread_create(&th[i], NULL, call_loop, &jobs[i]);
    }
    for (int i = 0; i < WORKERS; i++) {
        pthread_join(th[i], NULL);
        CHECK(jobs[i].ok == jobs[i].rounds, "thread %d: %d of %d calls succeeded (last other status %s)", i,
              jobs[i].ok, jobs[i].rounds, fqla_status_string(jobs[i].other_status));
    }
    pthread_mutex_lock(&tj.lock);
    tj.stop = 1;
    pthread_mutex_unlock(&tj.lock);
    pthread_join(setter, NULL);
    CHECK(tj.failed == 0, "set_threads failed %d times", tj.failed);
    fqla_device_info info;
    CHECK(fqla_context_set_threads(ctx, 3) == FQLA_STATUS_SUCCESS && fqla_context_info(ctx, &info) == 0 &&
          info.threads == 3, "the thread count set last is not the context's");
    pthread_mutex_destroy(&tj.lock);
    fqla_context_destroy(ctx);
}

static void destroy_beside_calls(void)
{
    fqla_context *ctx = create(FQLA_BACKEND_CPU);
    shared_job jobs[WORKERS];
    pthread_t th[WORKERS];
    for (int i = 0; i < WORKERS; i++) {
        memset(&jobs[i], 0, sizeof jobs[i]);
        jobs[i].ctx = ctx;
        jobs[i].until_destroyed = 1;
        pthread_create(&th[i], NULL, call_loop, &jobs[i]);
    }
    const struct timespec wait = {0, 20 * 1000 * 1000}; /* let the calls start */
    nanosleep(&wait, NULL);
    CHECK(fqla_context_destroy(ctx) == FQLA_STATUS_SUCCESS, "destroy: %s", fqla_last_error(NULL));
    for (int i = 0; i < WORKERS; i++) {
        pthread_join(th[i], NULL);
        CHECK(jobs[i].rejected == 1 && jobs[i].other == 0, "thread %d: %d rejected, %d other (%s)", i,
              jobs[i].rejected, jobs[i].other, fqla_status_string(jobs[i].other_status));
    }
}

/* Create, query, destroy from several threads at once: every handle is
 * distinct from the others alive and dead ones stay dead. */
#define CHURN_ROUNDS 200

static void *churn_loop(void *arg)
{
    int *bad = arg;
    fqla_context *prev = NULL;
    fqla_device_info info;
    for (int r = 0; r < CHURN_ROUNDS; r++) {
        fqla_context *ctx = NULL;
        if (fqla_context_create(&ctx, FQLA_BACKEND_CPU, 0) != FQLA_STATUS_SUCCESS || ctx == prev) {
            (*bad)++;
            continue;
        }
        if (fqla_context_set_threads(ctx, 1 + r % 3) != FQLA_STATUS_SUCCESS) (*bad)++;
        if (fqla_context_info(ctx, &info) != FQLA_STATUS_SUCCESS || info.threads != 1 + r % 3) (*bad)++;
        if (prev && fqla_context_info(prev, &info) != FQLA_STATUS_INVALID_CONTEXT) (*bad)++;
        if (fqla_context_destroy(ctx) != FQLA_STATUS_SUCCESS) (*bad)++;
        prev = ctx;
    }
    return NULL;
}

static void handles_from_many_threads(void)
{
    pthread_t th[4];
    int bad[4] = {0};
    for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, churn_loop, &bad[i]);
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK(bad[i] == 0, "thread %d: %d wrong results", i, bad[i]);
    }
}

/* ---- tensors ---- */

/* fqla_tensor_contiguous(data, F32, ndim, shape) run in a child process, so
 * that a crash is reported as a failure of this case only. */
static int contiguous_in_child(void *data, int ndim, const int64_t *shape, fqla_tensor *out)
{
    int fd[2];
    if (pipe(fd) != 0) return 0;
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        fqla_tensor t = fqla_tensor_contiguous(data, FQLA_DTYPE_F32, ndim, shape);
        ssize_t n = write(fd[1], &t, sizeof t);
        _exit(n == (ssize_t)sizeof t ? 0 : 1);
    }
    close(fd[1]);
    ssize_t n = pid > 0 ? read(fd[0], out, sizeof *out) : -1;
    close(fd[0]);
    int status = 0;
    if (pid > 0) waitpid(pid, &status, 0);
    CHECK(pid > 0 && !WIFSIGNALED(status), "fqla_tensor_contiguous(ndim %d, shape %s) crashed (signal %d)", ndim,
          shape ? "given" : "NULL", WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    return n == (ssize_t)sizeof *out;
}

static void bad_tensor_descriptors(void)
{
    static const int64_t shape7[7] = {1, T, H, K, 1, 1, 1};
    fqla_context *ctx = create(FQLA_BACKEND_CPU);
    problem *pr = malloc(sizeof *pr);
    problem_init(pr);
    struct {
        int ndim;
        const int64_t *shape;
    } bad[4] = {{4, NULL}, {1, NULL}, {7, shape7}, {-1, shape7}};
    for (int i = 0; i < 4; i++) {
        fqla_tensor t;
        if (!contiguous_in_child(pr->q, bad[i].ndim, bad[i].shape, &t)) continue;
        fqla_fwd_args a = pr->a;
        a.q = t;
        fqla_status st = fqla_fwd(ctx, &a, NULL, 0, NULL);
        CHECK(st == FQLA_STATUS_INVALID_VALUE, "q with ndim %d, shape %s: %s", bad[i].ndim,
              bad[i].shape ? "given" : "NULL", fqla_status_string(st));
        CHECK(strncmp(fqla_last_error(ctx), "q:", 2) == 0, "message \"%s\" does not name q", fqla_last_error(ctx));
        /* an optional tensor with data but no shape is rejected, not taken as absent */
        a = pr->a;
        a.initial_state = t;
        st = fqla_fwd(ctx, &a, NULL, 0, NULL);
        CHECK(st == FQLA_STATUS_INVALID_VALUE, "initial_state with ndim %d, shape %s: %s", bad[i].ndim,
              bad[i].shape ? "given" : "NULL", fqla_status_string(st));
        CHECK(strncmp(fqla_last_error(ctx), "initial_state:", 14) == 0, "message \"%s\" does not name initial_state",
              fqla_last_error(ctx));
        CHECK(output_untouched(pr), "a rejected call wrote o");
    }
    /* a scalar needs no shape */
    fqla_tensor t = fqla_tensor_contiguous(pr->q, FQLA_DTYPE_F32, 0, NULL);
    CHECK(t.ndim == 0 && t.data == pr->q, "0-d tensor: ndim %d", t.ndim);
    free(pr);
    fqla_context_destroy(ctx);
}

/* ---- messages ---- */

#define CLEARED(expr, what) \
    CHECK((expr)[0] == '\0', "%s: message after a successful call: \"%s\"", what, expr)

static void success_clears_the_message(void)
{
    fqla_context *ctx = create(FQLA_BACKEND_CPU), *dead = create(FQLA_BACKEND_CPU);
    problem *pr = malloc(sizeof *pr);
    fqla_device_info info;
    size_t bytes;
    problem_init(pr);
    fqla_context_destroy(dead);

    /* on the context */
    CHECK(fqla_context_info(ctx, NULL) == FQLA_STATUS_INVALID_VALUE, "context_info(NULL info)");
    CHECK(fqla_last_error(ctx)[0] != '\0', "no message for context_info(NULL info)");
    CHECK(fqla_context_info(ctx, &info) == FQLA_STATUS_SUCCESS, "context_info");
    CLEARED(fqla_last_error(ctx), "context_info");

    fqla_context_set_threads(ctx, -1);
    CHECK(fqla_context_set_threads(ctx, 2) == FQLA_STATUS_SUCCESS, "set_threads");
    CLEARED(fqla_last_error(ctx), "set_threads");

    fqla_fwd(ctx, NULL, NULL, 0, NULL);
    CHECK(fqla_fwd_workspace_size(ctx, &pr->a, &bytes) == FQLA_STATUS_SUCCESS, "fwd_workspace_size");
    CLEARED(fqla_last_error(ctx), "fwd_workspace_size");
    fqla_fwd(ctx, NULL, NULL, 0, NULL);
    CHECK(fqla_fwd_supported(ctx, &pr->a) == FQLA_STATUS_SUCCESS, "fwd_supported");
    CLEARED(fqla_last_error(ctx), "fwd_supported");
    fqla_fwd(ctx, NULL, NULL, 0, NULL);
    CHECK(fqla_fwd(ctx, &pr->a, NULL, 0, NULL) == FQLA_STATUS_SUCCESS, "fwd");
    CLEARED(fqla_last_error(ctx), "fwd");

    /* the calling thread's */
    fqla_fwd(NULL, &pr->a, NULL, 0, NULL);
    CHECK(fqla_context_destroy(NULL) == FQLA_STATUS_SUCCESS, "destroy(NULL)");
    CLEARED(fqla_last_error(NULL), "destroy(NULL)");

    fqla_context_destroy(dead);
    CHECK(fqla_last_error(NULL)[0] != '\0', "no message for destroying a destroyed context");
    fqla_context *other = create(FQLA_BACKEND_CPU_REFERENCE);
    CLEARED(fqla_last_error(NULL), "context_create");
    fqla_context_info(dead, &info);
    CHECK(fqla_context_destroy(other) == FQLA_STATUS_SUCCESS, "destroy");
    CLEARED(fqla_last_error(NULL), "destroy");

    fqla_backend_available((fqla_backend)99, NULL, 0);
    CHECK(fqla_backend_available(FQLA_BACKEND_CPU, NULL, 0) == FQLA_STATUS_SUCCESS, "backend_available");
    CLEARED(fqla_last_error(NULL), "backend_available");

    fqla_fwd(dead, &pr->a, NULL, 0, NULL);
    CHECK(fqla_context_info(ctx, &info) == FQLA_STATUS_SUCCESS, "context_info");
    CLEARED(fqla_last_error(NULL), "context_info (the thread's message)");
    fqla_fwd(dead, &pr->a, NULL, 0, NULL);
    CHECK(fqla_fwd(ctx, &pr->a, NULL, 0, NULL) == FQLA_STATUS_SUCCESS, "fwd");
    CLEARED(fqla_last_error(NULL), "fwd (the thread's message)");

    free(pr);
    fqla_context_destroy(ctx);
}

int main(void)
{
    CHECK_RUN(destroyed_handle_stays_dead);
    CHECK_RUN(garbage_handles_rejected);
    CHECK_RUN(set_threads_beside_calls);
    CHECK_RUN(destroy_beside_calls);
    CHECK_RUN(handles_from_many_threads);
    CHECK_RUN(bad_tensor_descriptors);
    CHECK_RUN(success_clears_the_message);
    return check_summary();
}
