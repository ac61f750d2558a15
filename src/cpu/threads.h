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

typedef void (*fqla_cpu_task_fn)(void *arg, int64_t item, int worker);

/* The number of workers a run of n items on `threads` threads uses
 * (min(threads, n), at least 1): how many scratch blocks to allocate. */
int fqla_cpu_workers(int threads, int64_t n);

/* Runs every item; returns when all are done. A thread that cannot be
 * created is not an error: the remaining workers take its items. */
void fqla_cpu_parallel_for(int threads, int64_t n, fqla_cpu_task_fn fn, void *arg);

#endif
