/*
 * test_cli.c - the `flashqla` program end to end: runs the built binary on
 * small shapes and checks its exit statuses, its summary line and its error
 * figures against the fp64 reference (fp32 within 1e-4, bf16 within 5e-3 and
 * above the bf16 rounding floor), a bad option naming itself with status 2,
 * and that --tol below the real error makes it fail with status 1; and
 * `flashqla bench --backend cpu` on a tiny scaled rows file: its row and
 * summary lines, the records CSV, and its exit statuses.
 *
 * The binary is found beside the test's build folder (build/tests/test_cli ->
 * build/flashqla; build/asan/tests/test_cli -> build/flashqla) or in
 * FQLA_CLI; when it is not built the cases are skipped, never passed.
 */
#include "common/check.h"
#include "flashqla.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char cli[1024];
static char out[1 << 16];

static int find_cli(const char *argv0)
{
    const char *env = getenv("FQLA_CLI");
    if (env && *env) {
        snprintf(cli, sizeof cli, "%s", env);
        return access(cli, X_OK) == 0;
    }
    char dir[900];
    snprintf(dir, sizeof dir, "%s", argv0);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    else snprintf(dir, sizeof dir, ".");
    const char *rel[] = { "/../flashqla", "/../../flashqla" };
    for (int i = 0; i < 2; i++) {
        snprintf(cli, sizeof cli, "%s%s", dir, rel[i]);
        if (access(cli, X_OK) == 0) return 1;
    }
    snprintf(cli, sizeof cli, "build/flashqla");
    return access(cli, X_OK) == 0;
}

/* Runs `flashqla ARGS` with stdout and stderr captured into out; returns the
 * exit status (or -1 when it did not exit normally). */
static int run_cli(const char *args)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", cli, args);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The value after "key=" on the summary line, or -1. */
static double summary_value(const char *key)
{
    const char *line = strstr(out, "summary: ");
    if (!line) return -1;
    char pat[64];
    snprintf(pat, sizeof pat, " %s=", key);
    const char *at = strstr(line, pat);
    return at ? strtod(at + strlen(pat), NULL) : -1;
}

static const char *small = "--H 2 --HV 4 --K 64 --V 64 --repeat 1";

static void help_and_version(void)
{
    int rc = run_cli("--help");
    CHECK(rc == 0, "--help: exit status %d", rc);
    CHECK(strstr(out, "run") && strstr(out, "info"), "--help does not list the commands:\n%s", out);
    rc = run_cli("run --help");
    CHECK(rc == 0, "run --help: exit status %d", rc);
    CHECK(strstr(out, "--check-tokens") != NULL, "run --help does not list --check-tokens");
    rc = run_cli("--version");
    CHECK(rc == 0 && strstr(out, FQLA_VERSION_STRING) != NULL, "--version: status %d, output %s", rc, out);
}

static void info_lists_backends(void)
{
    int rc = run_cli("info");
    CHECK(rc == 0, "info: exit status %d\n%s", rc, out);
    CHECK(strstr(out, "flashqla " FQLA_VERSION_STRING) != NULL, "info: no version line:\n%s", out);
    CHECK(strstr(out, "  cpu        available") != NULL, "info: the CPU backend is not available:\n%s", out);
    CHECK(strstr(out, "  cuda       ") != NULL, "info: no line for the CUDA backend:\n%s", out);
    /* the CPU fast path must report K = V = 128 fp32 for the forward */
    const char *row = strstr(out, "  cpu        fwd");
    CHECK(row && strstr(row, "128: fp32") != NULL, "info: cpu fwd row lacks 128: fp32:\n%s", out);
}

static void run_fp32_matches_reference(void)
{
    char args[512];
    snprintf(args, sizeof args, "run %s --T 150 --dtype fp32 --backend cpu --check-tokens 150 --seed %llu",
             small, (unsigned long long)(check_seed() % 100000));
    int rc = run_cli(args);
    CHECK(rc == 0, "%s: exit status %d\n%s", args, rc, out);
    CHECK(strstr(out, "summary: PASS") != NULL, "no PASS summary:\n%s", out);
    double ro = summary_value("rel_o"), rs = summary_value("rel_state");
    /* above zero: the two backends really ran (fp32 output rounding alone is ~1e-8) */
    CHECK(ro > 0 && ro <= 1e-4, "rel_o = %g, expected in (0, 1e-4]", ro);
    CHECK(rs >= 0 && rs <= 1e-4, "rel_state = %g, expected <= 1e-4", rs);
    CHECK(summary_value("tokens_per_s") > 0, "no tokens/s in the summary:\n%s", out);
}

static void run_bf16_varlen(void)
{
    char args[512];
    snprintf(args, sizeof args, "run %s --varlen 70,0,130 --backend cpu --check-tokens 100 --seed %llu",
             small, (unsigned long long)(check_seed() % 100000 + 1));
    int rc = run_cli(args);
    CHECK(rc == 0, "%s: exit status %d\n%s", args, rc, out);
    CHECK(strstr(out, "3 sequences") != NULL, "config does not show 3 sequences:\n%s", out);
    CHECK(strstr(out, "(170 tokens)") != NULL, "check should cover 70 + 0 + 100 tokens:\n%s", out);
    double ro = summary_value("rel_o");
    /* bf16 output rounding alone gives ~1e-3; far below it means o was not compared */
    CHECK(ro > 1e-4 && ro <= 5e-3, "rel_o = %g, expected in (1e-4, 5e-3]", ro);
}

static void run_reference_backend(void)
{
    int rc = run_cli("run --H 1 --HV 2 --K 64 --V 64 --T 40 --B 2 --dtype fp16 --backend reference --repeat 1");
    CHECK(rc == 0, "reference backend run: exit status %d\n%s", rc, out);
    CHECK(strstr(out, "backend=reference") != NULL, "summary does not name the reference backend:\n%s", out);
}

static void same_seed_same_figures(void)
{
    char args[512], first[256] = "";
    snprintf(args, sizeof args, "run %s --T 90 --backend cpu --seed 7", small);
    run_cli(args);
    const char *rel = strstr(out, "rel_o=");
    if (rel) snprintf(first, sizeof first, "%.20s", rel);
    run_cli(args);
    rel = strstr(out, "rel_o=");
    CHECK(first[0] && rel && strncmp(first, rel, strlen(first)) == 0,
          "the same seed gave different errors: %s vs %.20s", first, rel ? rel : "(none)");
    snprintf(args, sizeof args, "run %s --T 90 --backend cpu --seed 8", small);
    run_cli(args);
    rel = strstr(out, "rel_o=");
    CHECK(rel && strncmp(first, rel, strlen(first)) != 0, "seeds 7 and 8 gave the same inputs");
}

static void tolerance_failure_exits_1(void)
{
    char args[512];
    snprintf(args, sizeof args, "run %s --T 64 --backend cpu --tol 1e-12", small);
    int rc = run_cli(args);
    CHECK(rc == 1, "--tol 1e-12 on bf16: exit status %d, expected 1\n%s", rc, out);
    CHECK(strstr(out, "summary: FAIL") != NULL, "no FAIL summary:\n%s", out);
}

static void bad_options_exit_2(void)
{
    static const struct { const char *args, *names; } bad[] = {
        { "run --T 0", "--T" },
        { "run --K abc", "--K" },
        { "run --frobnicate 3", "--frobnicate" },
        { "run --HV 5 --H 2", "--HV" },
        { "run --dtype int8", "--dtype" },
        { "run --backend tpu", "--backend" },
        { "run --varlen 3,,4", "--varlen" },
        { "run --varlen 64 --B 2", "--B" },
        { "run --T", "--T" },
        /* sizes within each option's range whose product overflows (it crashed) */
        { "run --backend cpu --dtype fp32 --B 4194304 --T 1099511627776 --H 1 --HV 1 --K 1 --V 1", "--B 4194304" },
        { "run --backend cpu --threads 2000", "--threads" }, /* the library's range: 0..1024 */
        { "info --all", "--all" },
        { "frobnicate", "frobnicate" },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = run_cli(bad[i].args);
        CHECK(rc == 2, "'%s': exit status %d, expected 2", bad[i].args, rc);
        CHECK(strstr(out, bad[i].names) != NULL, "'%s': the message does not name %s:\n%s",
              bad[i].args, bad[i].names, out);
    }
}

static void cuda_request_without_gpu(void)
{
    int rc = run_cli("run --backend cuda --T 8 --H 1 --HV 1 --K 64 --V 64 --repeat 1");
    CHECK(rc == 1, "--backend cuda without a GPU: exit status %d, expected 1\n%s", rc, out);
    CHECK(strstr(out, "cuda") != NULL, "the message does not mention cuda:\n%s", out);
}

/* ------------------------------------------------------------------------ */
/* flashqla bench on the CPU, on a tiny rows file (K = V = 128 as in every    */
/* docs/benchmarks.md row, few heads and tokens).                                  */

static char rows_path[64], recs_path[64];

static double wall_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Lines of a text file (-1 when it cannot be read); the first one into
 * first[512] when first is not NULL. */
static int count_lines(const char *path, char *first)
{
    FILE *f = fopen(path, "r");
    char line[512];
    int n = 0;
    if (first) first[0] = '\0';
    if (!f) return -1;
    while (fgets(line, sizeof line, f)) {
        if (n == 0 && first) memcpy(first, line, sizeof line);
        n++;
    }
    fclose(f);
    return n;
}

static int make_temp(char *path, size_t n, const char *text)
{
    snprintf(path, n, "/tmp/fqla_bench_XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0) return -1;
    size_t len = strlen(text);
    int ok = write(fd, text, len) == (ssize_t)len;
    close(fd);
    return ok ? 0 : -1;
}

/* The header of the published table (op,...,flashqla_ms,flashinfer_ms,fla_ms)
 * with the label forms it uses: 1xLEN, LENxCOUNT, LEN+LEN; a bwd row that
 * must be skipped. */
static const char *tiny_rows =
    "op,model,h_qk,h_v,seqlens,flashqla_ms,flashinfer_ms,fla_ms\n"
    "fwd,tiny TP2,1,2,1x160,0.050,0.300,0.100\n"
    "bwd,tiny TP2,1,2,8k_1seq,0.700,,1.400\n"
    "fwd,tiny TP1,2,4,96+64,0.060,,0.120\n"
    "fwd,tiny sym,2,2,64x3,0.040,,0.090\n";

static void bench_cpu_scaled_rows(void)
{
    char args[512], header[512];
    CHECK(make_temp(rows_path, sizeof rows_path, tiny_rows) == 0, "cannot write a temp rows file");
    CHECK(make_temp(recs_path, sizeof recs_path, "") == 0, "cannot make a temp records file");
    setenv("FQLA_COMMIT", "testcommit", 1);
    double t0 = wall_s();
    snprintf(args, sizeof args, "bench --backend cpu --rows %s --scale-tokens 0.5 --repeat 2 --check-tokens 48 "
             "--out %s --seed %llu", rows_path, recs_path, (unsigned long long)(check_seed() % 100000));
    int rc = run_cli(args);
    CHECK(rc == 0, "%s: exit status %d\n%s", args, rc, out);
    CHECK(strstr(out, "[1/3] fwd tiny TP2") && strstr(out, "[2/3] fwd tiny TP1") && strstr(out, "[3/3] fwd tiny sym"),
          "missing [i/3] row lines:\n%s", out);
    CHECK(strstr(out, "1x160*0.5") && strstr(out, "96+64*0.5") && strstr(out, "64x3*0.5"),
          "scaled rows are not labelled with *0.5:\n%s", out);
    CHECK(strstr(out, "8k_1seq") == NULL, "the bwd row was run:\n%s", out);
    int pass = 0;
    for (const char *c = out; (c = strstr(c, "  PASS\n")); c++) pass++;
    CHECK(pass == 3, "%d PASS row lines, expected 3:\n%s", pass, out);
    /* bf16 output rounding alone gives ~1e-3: the check really compared o */
    const char *rel = strstr(out, "rel_o ");
    double ro = rel ? strtod(rel + 6, NULL) : -1;
    CHECK(ro > 1e-4 && ro <= 5e-3, "rel_o %g, expected in (1e-4, 5e-3]:\n%s", ro, out);
    CHECK(strstr(out, "summary: fwd rows=3 failures=0 backend=cpu") != NULL, "no summary line:\n%s", out);
    CHECK(strstr(out, "vs published numbers, not same-process") != NULL, "summary not labelled:\n%s", out);
    CHECK(strstr(out, "geomean_published_flashqla_over_ours=n/a") != NULL,
          "scaled rows must not be compared with the anchors:\n%s", out);
    int n = count_lines(recs_path, header);
    CHECK(n == 4, "records file has %d lines, expected header + 3", n);
    CHECK(!strcmp(header, "op,model,h_qk,h_v,seqlens,flashqla_ms,fla_ms,gpu,commit,date\n"),
          "records header: %s", header);
    FILE *f = fopen(recs_path, "r");
    char line[512];
    int good = 0;
    while (f && fgets(line, sizeof line, f))
        good += !strncmp(line, "fwd,tiny ", 9) && strstr(line, ",,cpu,testcommit,20") != NULL;
    if (f) fclose(f);
    CHECK(good == 3, "%d well-formed records, expected 3", good);

    /* unscaled, one row by --filter: compared with its anchors, appended */
    snprintf(args, sizeof args, "bench --backend cpu --rows %s --filter 'TP1 96' --repeat 1 --check-tokens 32 --out %s",
             rows_path, recs_path);
    rc = run_cli(args);
    CHECK(rc == 0, "%s: exit status %d\n%s", args, rc, out);
    CHECK(strstr(out, "summary: fwd rows=1 failures=0") != NULL, "--filter: no 1-row summary:\n%s", out);
    const char *g = strstr(out, "geomean_published_flashqla_over_ours=");
    double gm = g ? strtod(g + strlen("geomean_published_flashqla_over_ours="), NULL) : -1;
    CHECK(gm > 0, "unscaled row: no geomean against the anchor:\n%s", out);
    CHECK(count_lines(recs_path, NULL) == 5, "the filtered row was not appended (no header again)");

    /* fp32 q/k/v: docs/testing.md's 1e-4, recorded as 'MODEL fp32', not compared with the bf16 anchors */
    snprintf(args, sizeof args, "bench --backend cpu --rows %s --filter 'TP1 96' --dtype fp32 --repeat 1 "
             "--check-tokens 32 --out %s", rows_path, recs_path);
    rc = run_cli(args);
    CHECK(rc == 0, "%s: exit status %d\n%s", args, rc, out);
    CHECK(strstr(out, "fwd tiny TP1 fp32") && strstr(out, "(tol 1e-04)"), "--dtype fp32: row or threshold:\n%s", out);
    rel = strstr(out, "rel_o ");
    ro = rel ? strtod(rel + 6, NULL) : -1;
    CHECK(ro >= 0 && ro <= 1e-4, "--dtype fp32: rel_o %g, expected <= 1e-4:\n%s", ro, out);
    CHECK(strstr(out, "dtype=fp32 geomean_published_flashqla_over_ours=n/a") != NULL,
          "--dtype fp32 must not be compared with the bf16 anchors:\n%s", out);
    CHECK(count_lines(recs_path, NULL) == 6, "the fp32 row was not appended");
    f = fopen(recs_path, "r");
    good = 0;
    while (f && fgets(line, sizeof line, f)) good += !strncmp(line, "fwd,tiny TP1 fp32,2,4,96+64,", 28);
    if (f) fclose(f);
    CHECK(good == 1, "no 'tiny TP1 fp32' record");
    CHECK(wall_s() - t0 < 10, "bench on tiny rows took %.1f s, over 10 s", wall_s() - t0);
}

static void bench_appends_on_a_line_of_its_own(void)
{
    /* a records file whose last line has no newline (edited by hand) */
    char path[64], args[512];
    CHECK(make_temp(path, sizeof path, "op,model,h_qk,h_v,seqlens,flashqla_ms,fla_ms,gpu,commit,date\nx,y") == 0,
          "cannot write a temp records file");
    snprintf(args, sizeof args, "bench --backend cpu --rows %s --filter 'TP1 96' --repeat 1 --check-tokens 32 --out %s",
             rows_path, path);
    int rc = run_cli(args);
    CHECK(rc == 0, "%s: exit status %d\n%s", args, rc, out);
    FILE *f = fopen(path, "r");
    char line[512];
    int n = 0, rec = 0;
    while (f && fgets(line, sizeof line, f)) {
        n++;
        rec += !strncmp(line, "fwd,tiny TP1,", 13);
    }
    if (f) fclose(f);
    CHECK(n == 3 && rec == 1, "%d lines, %d records starting a line (expected 3 and 1)", n, rec);
    remove(path);
}

static void bench_failed_check_exits_1(void)
{
    char args[512];
    snprintf(args, sizeof args, "bench --backend cpu --rows %s --quick --tol 1e-12 --check-tokens 32 --repeat 1 --out %s",
             rows_path, recs_path);
    int before = count_lines(recs_path, NULL);
    int rc = run_cli(args);
    CHECK(rc == 1, "--tol 1e-12: exit status %d, expected 1\n%s", rc, out);
    CHECK(strstr(out, "failures=3") != NULL && strstr(out, "FAIL") != NULL, "no failures in the output:\n%s", out);
    CHECK(count_lines(recs_path, NULL) == before, "failed rows were recorded");
}

static void bench_bad_options_exit_2(void)
{
    char buf[13][256];
    const char *names[13] = { "--repeat", "--backend", "--frobnicate", "--scale-tokens", "--rows",
                              "--quick", "--filter", "--check-tokens", "--out", "--tol", "--backend cpu", "--rows",
                              "--dtype" };
    snprintf(buf[0], 256, "bench --rows %s --quick --repeat 0", rows_path);
    snprintf(buf[1], 256, "bench --rows %s --quick --backend tpu", rows_path);
    snprintf(buf[2], 256, "bench --rows %s --frobnicate 3", rows_path);
    snprintf(buf[3], 256, "bench --rows %s --backend cpu --scale-tokens 2", rows_path);
    snprintf(buf[4], 256, "bench --rows /nonexistent/rows.csv --backend cpu --quick");
    snprintf(buf[5], 256, "bench --rows %s --backend cpu --quick=yes", rows_path);
    snprintf(buf[6], 256, "bench --rows %s --backend cpu --filter no-such-row", rows_path);
    snprintf(buf[7], 256, "bench --rows %s --backend cpu --quick --check-tokens -1", rows_path);
    snprintf(buf[8], 256, "bench --rows %s --backend cpu --quick --out /nonexistent/dir/x.csv", rows_path);
    snprintf(buf[9], 256, "bench --rows %s --backend cpu --quick --tol abc", rows_path);
    /* the full rows would take hours on the CPU */
    snprintf(buf[10], 256, "bench --rows %s --backend cpu", rows_path);
    /* a rows file without the op,model,h_qk,h_v,seqlens columns (the records
     * file is overwritten: it is not needed any more) */
    FILE *f = fopen(recs_path, "w");
    if (f) { fputs("a,b,c\n1,2,3\n", f); fclose(f); }
    snprintf(buf[11], 256, "bench --rows %s --backend cpu --quick", recs_path);
    snprintf(buf[12], 256, "bench --rows %s --backend cpu --quick --dtype fp64", rows_path);
    /* bad row labels: a length past 2^40 (it crashed), one longer than 63 characters (it was cut) */
    static const char *const rows_bad[2] = {
        "op,model,h_qk,h_v,seqlens\nfwd,tiny,1,1,1x4611686018427387904\n",
        "op,model,h_qk,h_v,seqlens\nfwd,tiny,1,1,1000+1000+1000+1000+1000+1000+1000+1000+1000+1000+"
        "1000+1000+1000\n"};
    static const char *const why[2] = {"lengths 1..2^40", "longer than"};
    for (int r = 0; r < 2; r++) {
        char path[64], cmd[256];
        CHECK(make_temp(path, sizeof path, rows_bad[r]) == 0, "cannot write a temp rows file");
        snprintf(cmd, sizeof cmd, "bench --rows %s --backend cpu --quick --out %s", path, recs_path);
        int rc = run_cli(cmd);
        CHECK(rc == 2 && strstr(out, why[r]) != NULL, "'%s': exit status %d, expected 2 and '%s':\n%s", cmd, rc,
              why[r], out);
        remove(path);
    }
    for (int i = 0; i < 13; i++) {
        int rc = run_cli(buf[i]);
        CHECK(rc == 2, "'%s': exit status %d, expected 2\n%s", buf[i], rc, out);
        CHECK(strstr(out, names[i]) != NULL, "'%s': the message does not name %s:\n%s", buf[i], names[i], out);
    }
    remove(rows_path);
    remove(recs_path);
}

/* --edge: issue 43's CPU rows, eight records of the cpu.csv columns (the
 * ggml field empty: the CLI does not link ggml), a positive FMA peak and
 * times; the prefill rows scaled down to 128 tokens. */
static void bench_cpu_edge_rows(void)
{
    char path[64], args[256], first[512];
    if (make_temp(path, sizeof path, "") != 0) {
        CHECK(0, "cannot make a temporary file");
        return;
    }
    snprintf(args, sizeof args, "bench --backend cpu --edge --repeat 1 --scale-tokens 0.03125 --out %s", path);
    setenv("FQLA_COMMIT", "testcommit", 1);
    int rc = run_cli(args);
    unsetenv("FQLA_COMMIT");
    CHECK(rc == 0, "%s: exit status %d\n%s", args, rc, out);
    CHECK(count_lines(path, first) == 9, "--edge: expected a header and 8 records");
    const char *header = "op,threads,T,batch,h_qk,h_v,dtype,layout,flashqla_us,ggml_us,peak_gflops,"
                         "achieved_gflops,machine,commit,date\n";
    CHECK(!strcmp(first, header), "--edge: header '%s'", first);
    FILE *f = fopen(path, "r");
    char line[512];
    int good = 0;
    while (f && fgets(line, sizeof line, f)) {
        char op[16], layout[8];
        int threads;
        long long T, batch;
        double fq, peak, gf;
        /* op,threads,T,batch,16,32,fp32,layout,flashqla_us,(empty ggml_us),peak,achieved,... */
        if (sscanf(line, "%15[a-z],%d,%lld,%lld,16,32,fp32,%7[a-z],%lf,,%lf,%lf,", op, &threads, &T, &batch,
                   layout, &fq, &peak, &gf) == 8)
            good += fq > 0 && peak > 0 && gf > 0 && strstr(line, ",testcommit,20") != NULL &&
                    (strcmp(op, "prefill") || T == 128);
    }
    if (f) fclose(f);
    CHECK(good == 8, "--edge: %d well-formed records, expected 8", good);
    remove(path);
}

int main(int argc, char **argv)
{
    (void)argc;
    if (!find_cli(argv[0])) {
        check_skip("flashqla CLI", "build/flashqla not built (run `make` first)");
        return check_summary();
    }
    check_seed();
    CHECK_RUN(help_and_version);
    CHECK_RUN(info_lists_backends);
    CHECK_RUN(run_fp32_matches_reference);
    CHECK_RUN(run_bf16_varlen);
    CHECK_RUN(run_reference_backend);
    CHECK_RUN(same_seed_same_figures);
    CHECK_RUN(tolerance_failure_exits_1);
    CHECK_RUN(bad_options_exit_2);
    CHECK_RUN(bench_cpu_scaled_rows);
    CHECK_RUN(bench_appends_on_a_line_of_its_own);
    CHECK_RUN(bench_failed_check_exits_1);
    CHECK_RUN(bench_bad_options_exit_2);
    CHECK_RUN(bench_cpu_edge_rows);
    /* ask the binary, not this test's library: the sanitizer build of the
     * tests has CUDA stubbed out even on a GPU machine */
    run_cli("info");
    if (strstr(out, "  cuda       available"))
        check_skip("cuda_request_without_gpu", "a GPU is present");
    else
        CHECK_RUN(cuda_request_without_gpu);
    return check_summary();
}
