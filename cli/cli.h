/*
 * cli.h - what the parts of the `flashqla` command-line program share:
 * option parsing helpers, host and device buffers, the random inputs of
 * docs/benchmarks.md, dtype conversion and timing. The program is a client of the
 * public API (include/flashqla.h) only.
 */
#ifndef FQLA_CLI_H
#define FQLA_CLI_H

#include "flashqla.h"

#include <stddef.h>
#include <stdint.h>

/* Exit statuses of the program. */
#define CLI_EXIT_OK 0
#define CLI_EXIT_FAIL 1   /* a run failed or its error exceeded the threshold */
#define CLI_EXIT_USAGE 2  /* bad command line */
/* The most tokens a sequence (run's --T, --varlen, bench's row lengths) may have. */
#define CLI_MAX_TOKENS ((int64_t)1 << 40)

/* The subcommands (cli/info.c, cli/run.c, cli/bench.c). */
int cli_info(int argc, char **argv);
int cli_run(int argc, char **argv);
int cli_bench(int argc, char **argv);

/* ------------------------------------------------------------------------ */
/* Options (cli/options.c)                                                  */

/* Steps through argv of a subcommand: --name value and --name=value forms. */
typedef struct cli_args {
    int argc;
    char **argv;
    int i;                 /* next argument */
    const char *cmd;       /* "run", for messages */
    const char *name;      /* the current option, without its "=value" */
    char name_buf[64];
    const char *inline_value; /* value after '=', or NULL */
} cli_args;

void cli_args_init(cli_args *a, const char *cmd, int argc, char **argv);
/* Advances to the next option; returns 0 at the end. Positional arguments are
 * reported as a usage error (returns -1 after printing). */
int cli_args_next(cli_args *a);
int cli_args_is(const cli_args *a, const char *name);
/* The option's value as text, an integer in [lo, hi], or a positive double;
 * each prints a message naming the option and returns -1 when it is bad. */
int cli_args_value(cli_args *a, const char **value);
int cli_args_int(cli_args *a, int64_t lo, int64_t hi, int64_t *out);
int cli_args_double(cli_args *a, double *out);
/* The option's value as a q/k/v dtype (cli_parse_dtype), with the message. */
int cli_args_dtype(cli_args *a, fqla_dtype *out);
/* An option the subcommand does not know: prints the message, returns 2. */
int cli_args_unknown(const cli_args *a);

/* "bf16", "fp16"/"f16", "fp32"/"f32"; returns -1 when unknown. */
int cli_parse_dtype(const char *s, fqla_dtype *out);
const char *cli_dtype_name(fqla_dtype d);   /* "bf16", "fp16", "fp32", "fp64" */
const char *cli_backend_name(fqla_backend b); /* "cpu", "cuda", "reference" */

/* ------------------------------------------------------------------------ */
/* Buffers (cli/device.c)                                                   */

/* Host memory aligned to 256 bytes (what any kernel may want). NULL on failure. */
void *cli_host_alloc(size_t bytes);
void cli_host_free(void *p);

/* Device memory through the CUDA runtime; without FQLA_HAVE_CUDA every call
 * fails with "built without CUDA". Return 0 on success, else -1 with a
 * message in err. */
int cli_dev_count(void);
int cli_dev_alloc(int device, void **p, size_t bytes, char *err, size_t err_size);
void cli_dev_free(void *p);
int cli_dev_upload(void *dst, const void *src, size_t bytes, char *err, size_t err_size);
int cli_dev_download(void *dst, const void *src, size_t bytes, char *err, size_t err_size);
int cli_dev_sync(char *err, size_t err_size);

/* ------------------------------------------------------------------------ */
/* Numbers (cli/numbers.c)                                                  */

typedef struct cli_rng { uint64_t s; int have_spare; double spare; } cli_rng;
void cli_rng_seed(cli_rng *r, uint64_t seed);
uint64_t cli_rng_u64(cli_rng *r);
double cli_rng_uniform(cli_rng *r);   /* (0, 1) */
double cli_rng_normal(cli_rng *r);    /* N(0, 1) */

uint16_t cli_f32_to_bf16(float x);
float cli_bf16_to_f32(uint16_t x);
uint16_t cli_f32_to_f16(float x);
float cli_f16_to_f32(uint16_t x);
/* Element i of an array of dtype d, as double; and the reverse store. */
double cli_load(const void *data, fqla_dtype d, size_t i);
void cli_store(void *data, fqla_dtype d, size_t i, double value);

double cli_now_ms(void);              /* monotonic clock */
double cli_median(double *x, int n);  /* sorts x */

#endif /* FQLA_CLI_H */
