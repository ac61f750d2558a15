/*
 * options.c - command-line option parsing for the flashqla subcommands.
 * Every bad option gets a message that names it and exit status 2, so a
 * typo never silently runs the default case.
 */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void cli_args_init(cli_args *a, const char *cmd, int argc, char **argv)
{
    memset(a, 0, sizeof *a);
    a->cmd = cmd;
    a->argc = argc;
    a->argv = argv;
    a->i = 0;
}

int cli_args_next(cli_args *a)
{
    if (a->i >= a->argc) return 0;
    const char *arg = a->argv[a->i++];
    if (strncmp(arg, "--", 2) != 0 && !(arg[0] == '-' && arg[1] == 'h' && arg[2] == '\0')) {
        fprintf(stderr, "flashqla %s: unexpected argument '%s' (options start with --; see flashqla %s --help)\n",
                a->cmd, arg, a->cmd);
        return -1;
    }
    const char *eq = strchr(arg, '=');
    a->inline_value = NULL;
    a->name = arg;
    if (eq) {
        /* Keep "--name" alone so messages and comparisons see the name only. */
        size_t n = (size_t)(eq - arg);
        if (n >= sizeof a->name_buf) n = sizeof a->name_buf - 1;
        memcpy(a->name_buf, arg, n);
        a->name_buf[n] = '\0';
        a->name = a->name_buf;
        a->inline_value = eq + 1;
    }
    return 1;
}

int cli_args_is(const cli_args *a, const char *name)
{
    return strcmp(a->name, name) == 0;
}

int cli_args_value(cli_args *a, const char **value)
{
    if (a->inline_value) {
        *value = a->inline_value;
        return 0;
    }
    if (a->i >= a->argc) {
        fprintf(stderr, "flashqla %s: option %s needs a value\n", a->cmd, a->name);
        return -1;
    }
    *value = a->argv[a->i++];
    return 0;
}

int cli_args_int(cli_args *a, int64_t lo, int64_t hi, int64_t *out)
{
    const char *s;
    if (cli_args_value(a, &s) != 0) return -1;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) {
        fprintf(stderr, "flashqla %s: option %s: expected an integer in [%lld, %lld], got '%s'\n",
                a->cmd, a->name, (long long)lo, (long long)hi, s);
        return -1;
    }
    *out = (int64_t)v;
    return 0;
}

int cli_args_double(cli_args *a, double *out)
{
    const char *s;
    if (cli_args_value(a, &s) != 0) return -1;
    char *end = NULL;
    errno = 0;
    double v = strtod(s, &end);
    if (errno != 0 || end == s || *end != '\0' || !(v > 0.0) || !isfinite(v)) {
        fprintf(stderr, "flashqla %s: option %s: expected a positive number, got '%s'\n",
                a->cmd, a->name, s);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_args_dtype(cli_args *a, fqla_dtype *out)
{
    const char *s;
    if (cli_args_value(a, &s) != 0) return -1;
    if (cli_parse_dtype(s, out) != 0) {
        fprintf(stderr, "flashqla %s: option %s: expected bf16, fp16 or fp32, got '%s'\n", a->cmd, a->name, s);
        return -1;
    }
    return 0;
}

int cli_args_unknown(const cli_args *a)
{
    fprintf(stderr, "flashqla %s: unknown option '%s' (see flashqla %s --help)\n",
            a->cmd, a->name, a->cmd);
    return CLI_EXIT_USAGE;
}

int cli_parse_dtype(const char *s, fqla_dtype *out)
{
    if (!strcmp(s, "bf16")) *out = FQLA_DTYPE_BF16;
    else if (!strcmp(s, "fp16") || !strcmp(s, "f16")) *out = FQLA_DTYPE_F16;
    else if (!strcmp(s, "fp32") || !strcmp(s, "f32")) *out = FQLA_DTYPE_F32;
    else return -1;
    return 0;
}

const char *cli_dtype_name(fqla_dtype d)
{
    switch (d) {
    case FQLA_DTYPE_F32: return "fp32";
    case FQLA_DTYPE_F16: return "fp16";
    case FQLA_DTYPE_BF16: return "bf16";
    case FQLA_DTYPE_F64: return "fp64";
    case FQLA_DTYPE_I32: return "int32";
    case FQLA_DTYPE_I64: return "int64";
    }
    return "?";
}

const char *cli_backend_name(fqla_backend b)
{
    switch (b) {
    case FQLA_BACKEND_CPU: return "cpu";
    case FQLA_BACKEND_CUDA: return "cuda";
    case FQLA_BACKEND_CPU_REFERENCE: return "reference";
    }
    return "?";
}
