/*
 * inputs.c - the random inputs of docs/benchmarks.md for `flashqla run`:
 *   q, k  randn, each [K] row l2-normalised, stored in the io dtype;
 *   v     randn;
 *   g     logsigmoid(randn) / 16 (fp32), and 0 on a random quarter of the
 *         value heads (HV - ceil(0.75 HV) heads do not decay);
 *   beta  sigmoid(randn) (fp32);
 *   h0    randn (fp32).
 * The default layer needs about 64 M normal draws, seconds on one core, so
 * the work is cut into fixed blocks of rows, each with its own generator
 * seeded from (seed, tensor, block), and the blocks are spread over threads:
 * the values depend on the seed alone, never on the thread count.
 */
#include "layer.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ROWS_PER_BLOCK 1024

enum { PART_Q, PART_K, PART_V, PART_G, PART_BETA, PART_H0, PARTS };

typedef struct fill_job {
    cli_layer *L;
    uint64_t seed;
    const unsigned char *nogate; /* [HV], 1 = no decay on that value head */
    int64_t rows[PARTS], width[PARTS], blocks[PARTS];
    int64_t total_blocks, next;
    pthread_mutex_t lock;
} fill_job;

/* log(sigmoid(x)) without overflow either way. */
static double logsigmoid(double x)
{
    return x >= 0 ? -log1p(exp(-x)) : x - log1p(exp(x));
}

static void fill_block(fill_job *j, int part, int64_t block, double *tmp)
{
    cli_layer *L = j->L;
    cli_rng r;
    /* one independent stream per (tensor, block): mix the three through
     * the generator's own output function */
    cli_rng_seed(&r, j->seed ^ ((uint64_t)part << 56) ^ ((uint64_t)block * 0x9e3779b97f4a7c15ull));
    cli_rng_u64(&r);
    int64_t w = j->width[part], r0 = block * ROWS_PER_BLOCK;
    int64_t r1 = r0 + ROWS_PER_BLOCK < j->rows[part] ? r0 + ROWS_PER_BLOCK : j->rows[part];
    for (int64_t row = r0; row < r1; row++) {
        size_t base = (size_t)row * (size_t)w;
        if (part == PART_Q || part == PART_K) {
            double ss = 0.0;
            for (int64_t i = 0; i < w; i++) {
                tmp[i] = cli_rng_normal(&r);
                ss += tmp[i] * tmp[i];
            }
            double inv = 1.0 / sqrt(ss + 1e-30);
            void *dst = part == PART_Q ? L->q : L->k;
            for (int64_t i = 0; i < w; i++) cli_store(dst, L->io, base + (size_t)i, tmp[i] * inv);
        } else if (part == PART_V) {
            for (int64_t i = 0; i < w; i++) cli_store(L->v, L->io, base + (size_t)i, cli_rng_normal(&r));
        } else if (part == PART_G) {
            float *g = (float *)L->g + base;
            for (int64_t h = 0; h < w; h++) {
                double x = cli_rng_normal(&r);
                g[h] = j->nogate[h] ? 0.0f : (float)(logsigmoid(x) / 16.0);
            }
        } else if (part == PART_BETA) {
            float *beta = (float *)L->beta + base;
            for (int64_t h = 0; h < w; h++) beta[h] = (float)(1.0 / (1.0 + exp(-cli_rng_normal(&r))));
        } else {
            float *h0 = (float *)L->h0 + base;
            for (int64_t i = 0; i < w; i++) h0[i] = (float)cli_rng_normal(&r);
        }
    }
}

static void *fill_worker(void *arg)
{
    fill_job *j = arg;
    int64_t wmax = 1;
    for (int p = 0; p < PARTS; p++)
        if (j->width[p] > wmax) wmax = j->width[p];
    double *tmp = malloc((size_t)wmax * sizeof *tmp);
    if (!tmp) return NULL; /* the other workers take the blocks */
    for (;;) {
        pthread_mutex_lock(&j->lock);
        int64_t b = j->next++;
        pthread_mutex_unlock(&j->lock);
        if (b >= j->total_blocks) break;
        int part = 0;
        while (b >= j->blocks[part]) b -= j->blocks[part++];
        fill_block(j, part, b, tmp);
    }
    free(tmp);
    return NULL;
}

int cli_layer_fill(cli_layer *L, uint64_t seed, int threads)
{
    const cli_shape *s = &L->s;
    fill_job j;
    memset(&j, 0, sizeof j);
    j.L = L;
    j.seed = seed;

    /* which value heads do not decay: a seeded shuffle of the heads */
    int64_t HV = s->HV, keep = (3 * HV + 3) / 4;
    unsigned char *nogate = calloc((size_t)HV, 1);
    int64_t *perm = malloc((size_t)HV * sizeof *perm);
    if (!nogate || !perm) {
        free(nogate);
        free(perm);
        return -1;
    }
    cli_rng r;
    cli_rng_seed(&r, seed);
    for (int64_t h = 0; h < HV; h++) perm[h] = h;
    for (int64_t h = HV - 1; h > 0; h--) {
        int64_t k = (int64_t)(cli_rng_u64(&r) % (uint64_t)(h + 1)), t = perm[h];
        perm[h] = perm[k];
        perm[k] = t;
    }
    for (int64_t h = keep; h < HV; h++) nogate[perm[h]] = 1;
    free(perm);
    j.nogate = nogate;

    int64_t BT = s->B * s->T;
    j.rows[PART_Q] = j.rows[PART_K] = BT * s->H;
    j.width[PART_Q] = j.width[PART_K] = s->K;
    j.rows[PART_V] = BT * HV;
    j.width[PART_V] = s->V;
    j.rows[PART_G] = j.rows[PART_BETA] = BT;
    j.width[PART_G] = j.width[PART_BETA] = HV;
    j.rows[PART_H0] = s->N * HV;
    j.width[PART_H0] = s->K * s->V;
    for (int p = 0; p < PARTS; p++) {
        j.blocks[p] = (j.rows[p] + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK;
        j.total_blocks += j.blocks[p];
    }
    pthread_mutex_init(&j.lock, NULL);

    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int n = threads > 0 ? threads : (cores > 0 ? (int)cores : 1);
    if (n > 64) n = 64;
    pthread_t tid[64];
    int started = 0;
    for (int i = 1; i < n; i++)
        if (pthread_create(&tid[started], NULL, fill_worker, &j) == 0) started++;
    fill_worker(&j); /* the calling thread is a worker too */
    for (int i = 0; i < started; i++) pthread_join(tid[i], NULL);
    pthread_mutex_destroy(&j.lock);
    free(nogate);
    /* blocks are left only when no worker got its scratch memory */
    if (j.next < j.total_blocks) return -1;

    for (size_t i = 0; i < cli_numel_vo(s); i++) cli_store(L->o, L->io, i, NAN);
    for (size_t i = 0; i < cli_numel_state(s); i++) ((float *)L->ht)[i] = NAN;
    return 0;
}
