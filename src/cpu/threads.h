/*
 * threads.h - a small pthread parallel-for for the CPU backends (the fast
 * path, and the fp64 reference through fqla_ref_parallel).
 *
 * fqla_cpu_parallel_for(threads, n, fn, arg) calls fn(arg, item, worker) for
 * every item in [0, n), on at most `threads` workers (the calling thread is
 * worker 0). Items are handed out one at a time in increasing order, so long
 * items do not leave a worker idle. `worker` is in [0, workers) and no two
 * concurrent calls share a worker index, so fn can use per-worker scratch
 * allocated by the caller beforehand (tasks therefore never fail).
 *
 * Results must not depend on which worker runs an item: every item writes
 * its own outputs, and anything shared is reduced by the caller afterwards in
 * a fixed order. That is what makes the backend bit-identical whatever the
 * thread count.
 */
#ifndef FQLA_CPU_THREADS_H
#define FQLA_CPU_THREADS_H

#include <stdint.h>

struct fqla_context;

typedef void (*fqla_cpu_task_fn)(void *arg, int64_t item, int worker);

/* The number of workers a run of n items on `threads` threads uses
 * (min(threads, n), at least 1): how many scratch blocks to allocate. */
int fqla_cpu_workers(int threads, int64_t n);

/* Runs every item; returns when all are done. A thread that cannot be
 * created is not an error: the remaining workers take its items. */
void fqla_cpu_parallel_for(int threads, int64_t n, fqla_cpu_task_fn fn, void *arg);

/* The worker threads a context keeps for the fast CPU path: started on the
 * first call that wants more than one worker (and grown when a call wants
 * more), parked on a condition variable between calls, joined when the
 * context is freed. One call at a time uses them; a call on the same
 * context that finds them busy runs fqla_cpu_parallel_for instead. */
typedef struct fqla_cpu_pool fqla_cpu_pool;

/* fqla_cpu_parallel_for on ctx's pool: `workers` workers (see
 * fqla_cpu_workers; the calling thread is worker 0), same guarantees. */
void fqla_cpu_run(struct fqla_context *ctx, int workers, int64_t n, fqla_cpu_task_fn fn, void *arg);

/* Stops and joins the pool's threads and frees it (NULL: nothing). Only
 * when no call runs on it. */
void fqla_cpu_pool_destroy(fqla_cpu_pool *pool);

#endif
