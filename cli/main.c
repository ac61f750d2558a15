/*
 * main.c - the `flashqla` command-line program: dispatches to its
 * subcommands (info, run, bench). Exit status 0 on success, 1 when a run fails or
 * misses its error threshold, 2 on a bad command line.
 */
#include "cli.h"

#include <stdio.h>
#include <string.h>

static void usage(FILE *f)
{
    fprintf(f,
        "usage: flashqla <command> [options]\n"
        "\n"
        "commands:\n"
        "  info    version, backends, GPUs, supported head dims and dtypes\n"
        "  run     one Gated DeltaNet forward layer (Qwen3.5-35B-like by default): time,\n"
        "          tokens/s and the error against the fp64 reference\n"
        "  bench   the forward rows of docs/benchmarks.md (bench/anchors_h200.csv): time, check,\n"
        "          records in build/bench/ (or --out)\n"
        "\n"
        "flashqla <command> --help shows a command's options; flashqla --version the version.\n");
}

int main(int argc, char **argv)
{
    /* line-buffered, so the results and the progress on stderr interleave
     * in order even when both go to one pipe or log file */
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) {
        usage(stderr);
        return CLI_EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        usage(stdout);
        return CLI_EXIT_OK;
    }
    if (!strcmp(cmd, "--version")) {
        printf("flashqla %s\n", FQLA_VERSION_STRING);
        return CLI_EXIT_OK;
    }
    if (!strcmp(cmd, "info")) return cli_info(argc - 2, argv + 2);
    if (!strcmp(cmd, "run")) return cli_run(argc - 2, argv + 2);
    if (!strcmp(cmd, "bench")) return cli_bench(argc - 2, argv + 2);
    fprintf(stderr, "flashqla: unknown command '%s' (commands: info, run, bench; see flashqla --help)\n", cmd);
    return CLI_EXIT_USAGE;
}
