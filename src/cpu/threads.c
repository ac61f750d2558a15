/*
 * threads.c - the pthread parallel-for of the CPU backends (threads.h):
 * a shared counter behind a mutex hands out items in order; worker 0 is the
 * calling thread, workers 1.. are created per call and joined before return.
 */
#include "cpu/threads.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct pool {
    pthread_mutex_t lock;
    int64_t next, n;
    fqla_cpu_task_fn fn;
    void *arg;
} pool;

typedef struct worker_arg {
    pool *pl;
    int worker;
} worker_arg;

static void run_items(pool *pl, int worker)
{
    for (;;) {
        pthread_mutex_lock(&pl->lock);
        int64_t item = pl->next < pl->n ? pl->next++ : -1;
        pthread_mutex_unlock(&pl->lock);
        if (item < 0)
            return;
        pl->fn(pl->arg, item, worker);
    }
}

static void *worker_main(void *vp)
{
    worker_arg *wa = vp;
    run_items(wa->pl, wa->worker);
    return NULL;
}

int fqla_cpu_workers(int threads, int64_t n)
{
    if (threads < 1 || n < 1)
        return 1;
    return n < threads ? (int)n : threads;
}

void fqla_cpu_parallel_for(int threads, int64_t n, fqla_cpu_task_fn fn, void *arg)
{
    int workers = fqla_cpu_workers(threads, n);
    if (workers <= 1) {
        for (int64_t item = 0; item < n; item++)
            fn(arg, item, 0);
        return;
    }
    pool pl;
    pl.next = 0;
    pl.n = n;
    pl.fn = fn;
    pl.arg = arg;
    pthread_t *tid = malloc((size_t)workers * (sizeof(pthread_t) + sizeof(worker_arg)));
    if (!tid || pthread_mutex_init(&pl.lock, NULL) != 0) {
        free(tid);
        for (int64_t item = 0; item < n; item++)
            fn(arg, item, 0);
        return;
    }
    worker_arg *wa = (worker_arg *)(tid + workers);
    int started = 0;
    for (int w = 1; w < workers; w++) {
        wa[started].pl = &pl;
        wa[started].worker = w;
        if (pthread_create(&tid[started], NULL, worker_main, &wa[started]) != 0)
            break;
        started++;
    }
    run_items(&pl, 0);
    for (int i = 0; i < started; i++)
        pthread_join(tid[i], NULL);
    pthread_mutex_destroy(&pl.lock);
    free(tid);
}

/* ---- the per-context pool ---- */

#include "internal.h"

struct fqla_cpu_pool {
    pthread_mutex_t busy;     /* held by the call that uses the pool */
    pthread_mutex_t lock;     /* guards everything below */
    pthread_cond_t wake, done;
    pthread_t *tid;           /* [started] worker threads 1..started */
    int started, capacity;
    int quit;
    uint64_t generation;      /* bumped for every job */
    int workers;              /* of the current job (including the caller) */
    int finished;             /* pool threads done with the current job */
    pool job;
};

typedef struct pool_thread_arg {
    fqla_cpu_pool *pl;
    int worker;
    uint64_t seen; /* the generation before the thread existed: the job that
                      starts it may be posted before it first takes the lock */
} pool_thread_arg;

static void *pool_thread(void *vp)
{
    pool_thread_arg arg = *(pool_thread_arg *)vp;
    fqla_cpu_pool *pl = arg.pl;
    free(vp);
    uint64_t seen = arg.seen;
    pthread_mutex_lock(&pl->lock);
    for (;;) {
        while (!pl->quit && pl->generation == seen)
            pthread_cond_wait(&pl->wake, &pl->lock);
        if (pl->quit)
            break;
        seen = pl->generation;
        if (arg.worker < pl->workers) {
            pthread_mutex_unlock(&pl->lock);
            run_items(&pl->job, arg.worker);
            pthread_mutex_lock(&pl->lock);
            if (++pl->finished == pl->workers - 1)
                pthread_cond_signal(&pl->done);
        }
    }
    pthread_mutex_unlock(&pl->lock);
    return NULL;
}

static fqla_cpu_pool *pool_create(void)
{
    fqla_cpu_pool *pl = calloc(1, sizeof *pl);
    if (!pl)
        return NULL;
    pthread_mutex_init(&pl->busy, NULL);
    pthread_mutex_init(&pl->lock, NULL);
    pthread_cond_init(&pl->wake, NULL);
    pthread_cond_init(&pl->done, NULL);
    pthread_mutex_init(&pl->job.lock, NULL);
    return pl;
}

/* Starts threads until workers - 1 run (under pl->lock); returns how many
 * workers the pool can serve now (at least 1: the caller). */
static int pool_grow(fqla_cpu_pool *pl, int workers)
{
    if (workers - 1 > pl->capacity) {
        pthread_t *t = realloc(pl->tid, (size_t)(workers - 1) * sizeof *t);
        if (t) {
            pl->tid = t;
            pl->capacity = workers - 1;
        }
    }
    while (pl->started < workers - 1 && pl->started < pl->capacity) {
        pool_thread_arg *arg = malloc(sizeof *arg);
        if (!arg)
            break;
        arg->pl = pl;
        arg->worker = pl->started + 1;
        arg->seen = pl->generation;
        if (pthread_create(&pl->tid[pl->started], NULL, pool_thread, arg) != 0) {
            free(arg);
            break;
        }
        pl->started++;
    }
    return pl->started + 1 < workers ? pl->started + 1 : workers;
}

void fqla_cpu_pool_destroy(fqla_cpu_pool *pl)
{
    if (!pl)
        return;
    pthread_mutex_lock(&pl->lock);
    pl->quit = 1;
    pthread_cond_broadcast(&pl->wake);
    pthread_mutex_unlock(&pl->lock);
    for (int i = 0; i < pl->started; i++)
        pthread_join(pl->tid[i], NULL);
    free(pl->tid);
    pthread_mutex_destroy(&pl->job.lock);
    pthread_cond_destroy(&pl->done);
    pthread_cond_destroy(&pl->wake);
    pthread_mutex_destroy(&pl->lock);
    pthread_mutex_destroy(&pl->busy);
    free(pl);
}

void fqla_cpu_run(struct fqla_context *ctx, int workers, int64_t n, fqla_cpu_task_fn fn, void *arg)
{
    if (workers <= 1 || n <= 1) {
        for (int64_t item = 0; item < n; item++)
            fn(arg, item, 0);
        return;
    }
    pthread_mutex_lock(&ctx->lock);
    if (!ctx->cpu_pool)
        ctx->cpu_pool = pool_create();
    fqla_cpu_pool *pl = ctx->cpu_pool;
    pthread_mutex_unlock(&ctx->lock);
    if (!pl || pthread_mutex_trylock(&pl->busy) != 0) {
        fqla_cpu_parallel_for(workers, n, fn, arg); /* no pool, or another call has it */
        return;
    }
    pthread_mutex_lock(&pl->lock);
    workers = pool_grow(pl, workers);
    pl->job.next = 0;
    pl->job.n = n;
    pl->job.fn = fn;
    pl->job.arg = arg;
    pl->workers = workers;
    pl->finished = 0;
    pl->generation++;
    pthread_cond_broadcast(&pl->wake);
    pthread_mutex_unlock(&pl->lock);
    run_items(&pl->job, 0);
    pthread_mutex_lock(&pl->lock);
    while (pl->finished < pl->workers - 1)
        pthread_cond_wait(&pl->done, &pl->lock);
    pthread_mutex_unlock(&pl->lock);
    pthread_mutex_unlock(&pl->busy);
}
