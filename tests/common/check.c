#include "common/check.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <time.h>

static int n_passed, n_failed, n_skipped;
static int case_failures;
static const char *case_name = "";

void check_fail(const char *file, int line, const char *fmt, ...)
{
    va_list ap;
    /* Print only the first few failures of a case: a broken loop must not flood the log. */
    if (case_failures++ < 5) {
        fprintf(stderr, "  FAIL %s (%s:%d): ", case_name, file, line);
        va_start(ap, fmt);
        vfprintf(stderr, fmt, ap);
        va_end(ap);
        fputc('\n', stderr);
    }
}

void check_run(const char *name, void (*fn)(void))
{
    case_name = name;
    case_failures = 0;
    fn();
    if (case_failures) {
        n_failed++;
        printf("FAIL %s (%d checks failed)\n", name, case_failures);
    } else {
        n_passed++;
        printf("ok   %s\n", name);
    }
    fflush(stdout);
}

void check_skip(const char *name, const char *why)
{
    n_skipped++;
    printf("skip %s: %s\n", name, why);
    fflush(stdout);
}

int check_summary(void)
{
    printf("%d passed, %d failed, %d skipped\n", n_passed, n_failed, n_skipped);
    return n_failed ? 1 : 0;
}

int check_quick(void)
{
    const char *q = getenv("FQLA_TEST_QUICK");
    return q && *q && *q != '0';
}

static uint64_t rng_state;
static int rng_seeded;

void check_rng_seed(uint64_t seed)
{
    rng_state = seed ? seed : 0x9e3779b97f4a7c15ull;
    rng_seeded = 1;
}

uint64_t check_seed(void)
{
    static uint64_t seed;
    if (!seed) {
        const char *s = getenv("FQLA_SEED");
        seed = s ? strtoull(s, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 20);
        if (!seed) seed = 1;
        printf("seed %llu (FQLA_SEED to replay)\n", (unsigned long long)seed);
    }
    return seed;
}

static uint64_t next_u64(void)
{
    if (!rng_seeded) check_rng_seed(check_seed());
    /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}

double check_uniform(void) { return (double)(next_u64() >> 11) * (1.0 / 9007199254740992.0); }

double check_normal(void)
{
    double u1 = check_uniform(), u2 = check_uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

double check_rel_error(const double *x, const double *ref, int64_t n)
{
    double num = 0, den = 0, nx = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(x[i]) && isfinite(ref[i])) return INFINITY;
        double d = x[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
        nx += x[i] * x[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(nx);
}
