/*
 * test_error_threads.c - one context called from several threads at once,
 * as include/flashqla.h allows: every message fqla_last_error returns is whole (one
 * of the messages the calls can leave, or ""), never a torn mix of two,
 * and a thread alone on its own context always reads its own call's
 * message. The context's message is written and read under a lock
 * (context.c); before, an unlocked write beside a read was a data race.
 */
#include "common/check.h"
#include "flashqla.h"

#include <pthread.h>
#include <string.h>

#define THREADS 4

static fqla_context *shared;
static const char *want[2]; /* the two messages the failing calls leave */

typedef struct job {
    int which;       /* 0: q missing, 1: a thread count out of range (a longer message) */
    int rounds;
    fqla_context *own;
    int torn, wrong_own;
} job;

static float buf[4 * 8 * 2 * 16];

/* Call `which` on ctx: a small CPU forward with q missing (0), or a
 * thread count out of range (1); the two messages differ in every
 * position, so a mix of them is never either. */
static void bad_call(fqla_context *ctx, int which);

/* A small valid CPU forward with q (which = 0) or k (which = 1) missing. */
static void bad_args(fqla_fwd_args *a, int which)
{
    static const int64_t sq[4] = {1, 8, 2, 16}, sg[3] = {1, 8, 2};
    fqla_fwd_args_init(a);
    a->q = fqla_tensor_contiguous(buf, FQLA_DTYPE_F32, 4, sq);
    a->k = fqla_tensor_contiguous(buf + 256, FQLA_DTYPE_F32, 4, sq);
    a->v = fqla_tensor_contiguous(buf + 512, FQLA_DTYPE_F32, 4, sq);
    a->g = fqla_tensor_contiguous(buf + 768, FQLA_DTYPE_F32, 3, sg);
    a->beta = fqla_tensor_contiguous(buf + 800, FQLA_DTYPE_F32, 3, sg);
    a->o = fqla_tensor_contiguous(buf + 832, FQLA_DTYPE_F32, 4, sq); /* never written: the call fails first */
    if (which) a->k.data = NULL;
    else a->q.data = NULL;
}

static void bad_call(fqla_context *ctx, int which)
{
    fqla_fwd_args a;
    if (which) {
        fqla_context_set_threads(ctx, 5000);
        return;
    }
    bad_args(&a, 0);
    fqla_fwd(ctx, &a, NULL, 0, NULL);
}

static void *worker(void *arg)
{
    job *j = arg;
    for (int r = 0; r < j->rounds; r++) {
        bad_call(shared, j->which);
        const char *m = fqla_last_error(shared);
        if (m[0] && strcmp(m, want[0]) && strcmp(m, want[1])) j->torn++;
        bad_call(j->own, j->which);
        if (strcmp(fqla_last_error(j->own), want[j->which])) j->wrong_own++;
    }
    return NULL;
}

static void concurrent_messages_are_whole(void)
{
    static char msg[2][512];
    CHECK(fqla_context_create(&shared, FQLA_BACKEND_CPU, 0) == FQLA_STATUS_SUCCESS, "context");
    for (int w = 0; w < 2; w++) { /* the messages, read alone first */
        bad_call(shared, w);
        snprintf(msg[w], sizeof msg[w], "%s", fqla_last_error(shared));
        want[w] = msg[w];
    }
    CHECK(strcmp(want[0], want[1]) != 0 && want[0][0] && want[1][0], "two distinct messages: '%s', '%s'",
          want[0], want[1]);
    job jobs[THREADS];
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++) {
        memset(&jobs[i], 0, sizeof jobs[i]);
        jobs[i].which = i % 2;
        jobs[i].rounds = check_quick() ? 2000 : 20000;
        CHECK(fqla_context_create(&jobs[i].own, FQLA_BACKEND_CPU, 0) == FQLA_STATUS_SUCCESS, "own context");
        pthread_create(&th[i], NULL, worker, &jobs[i]);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        CHECK(jobs[i].torn == 0, "thread %d read %d torn messages on the shared context", i, jobs[i].torn);
        CHECK(jobs[i].wrong_own == 0, "thread %d read another call's message %d times on its own context", i,
              jobs[i].wrong_own);
        fqla_context_destroy(jobs[i].own);
    }
    fqla_context_destroy(shared);
}

static void two_messages_stay_valid_together(void)
{
    /* fqla_last_error's copies: two contexts' messages in one expression */
    fqla_context *c1, *c2;
    fqla_fwd_args a;
    CHECK(fqla_context_create(&c1, FQLA_BACKEND_CPU, 0) == FQLA_STATUS_SUCCESS, "context 1");
    CHECK(fqla_context_create(&c2, FQLA_BACKEND_CPU, 0) == FQLA_STATUS_SUCCESS, "context 2");
    bad_args(&a, 0);
    fqla_fwd(c1, &a, NULL, 0, NULL);
    bad_args(&a, 1);
    fqla_fwd(c2, &a, NULL, 0, NULL);
    const char *m1 = fqla_last_error(c1), *m2 = fqla_last_error(c2);
    CHECK(strstr(m1, "q:") == m1 && strstr(m2, "k:") == m2, "messages: '%s', '%s'", m1, m2);
    fqla_context_destroy(c1);
    fqla_context_destroy(c2);
}

int main(void)
{
    check_rng_seed(check_seed());
    CHECK_RUN(concurrent_messages_are_whole);
    CHECK_RUN(two_messages_stay_valid_together);
    return check_summary();
}
