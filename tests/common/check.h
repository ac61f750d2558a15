/*
 * check.h - the test framework shared by every C test program.
 *
 * A test program runs its cases with CHECK_RUN / CHECK_SKIP and ends with
 * `return check_summary();`, which prints the one closing line
 * "N passed, N failed, N skipped" that tests/run_tests.sh adds up.
 * A case fails when any CHECK inside it fails; a skipped case (no GPU, say)
 * is counted as skipped, never as passed.
 */
#ifndef FQLA_CHECK_H
#define FQLA_CHECK_H

#include <stdint.h>
#include <stdio.h>

/* Records a failure of the running case (with file:line and a message). */
void check_fail(const char *file, int line, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

#define CHECK(cond, ...)                                                 \
    do {                                                                 \
        if (!(cond)) check_fail(__FILE__, __LINE__, __VA_ARGS__);        \
    } while (0)

/* Runs fn as one case named name; counts it passed or failed. */
void check_run(const char *name, void (*fn)(void));
/* Counts a case as skipped and prints why. */
void check_skip(const char *name, const char *why);
#define CHECK_RUN(fn) check_run(#fn, fn)

/* Prints "N passed, N failed, N skipped" and returns the exit code. */
int check_summary(void);

/* 1 when FQLA_TEST_QUICK is set (sanitizer builds): tests shrink their sizes. */
int check_quick(void);

/* Random numbers: a per-run seed (FQLA_SEED, else time), printed once, so a
 * failure can be replayed. */
uint64_t check_seed(void);
void check_rng_seed(uint64_t seed);
double check_uniform(void);        /* [0, 1) */
double check_normal(void);         /* N(0, 1) */

/* ||x - ref|| / ||ref|| in fp64 (returns +inf if any x is NaN/Inf where ref is
 * finite; returns ||x|| when ||ref|| == 0). */
double check_rel_error(const double *x, const double *ref, int64_t n);

#endif
