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
