/*
 * test_example.c - the README's usage example: docs/example.c compiles with
 * the project's strict C99 flags, links against the library and runs to a
 * successful fqla_fwd (it is included here verbatim, its main renamed), and
 * every line of README.md's C excerpt is a line of docs/example.c, so the
 * README cannot show code that does not build.
 */
#define main example_main
#include "../docs/example.c"
#undef main

#include "common/check.h"

#include <string.h>

static void readme_example_runs(void)
{
    CHECK(example_main() == 0, "docs/example.c returned non-zero (see its message above)");
}

/* The whole file in a NUL-terminated buffer, or NULL. */
static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    size_t n = 0, cap = 0, got;
    do {
        if (n + 4096 + 1 > cap) {
            char *nb = realloc(buf, cap = 2 * cap + 8192);
            if (!nb) { free(buf); fclose(f); return NULL; }
            buf = nb;
        }
        got = fread(buf + n, 1, 4096, f);
        n += got;
    } while (got > 0);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

/* Leading whitespace off: indentation may differ between the two files. */
static const char *trim(const char *s)
{
    while (*s == ' ' || *s == '\t') s++;
    return s;
}

static int file_has_line(const char *text, const char *line, size_t len)
{
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        const char *t = trim(p);
        const char *end = strchr(t, '\n');
        size_t n = end ? (size_t)(end - t) : strlen(t);
        if (n == len && memcmp(t, line, len) == 0) return 1;
    }
    return 0;
}

static void readme_excerpt_matches_example(void)
{
    char *readme = slurp("README.md"), *example = slurp("docs/example.c");
    CHECK(readme && example, "README.md or docs/example.c not readable from the repository root");
    const char *block = readme ? strstr(readme, "```c\n") : NULL;
    CHECK(block != NULL, "README.md has no ```c block");
    if (block && example) {
        int lines = 0;
        for (const char *p = block + 5; *p && strncmp(p, "```", 3) != 0;) {
            const char *end = strchr(p, '\n');
            if (!end) break;
            const char *t = trim(p);
            size_t len = (size_t)(end - t);
            if (len > 0) {
                lines++;
                CHECK(file_has_line(example, t, len), "README line not in docs/example.c: %.*s", (int)len, t);
            }
            p = end + 1;
        }
        CHECK(lines >= 10, "README's C block has only %d lines", lines);
    }
    free(readme);
    free(example);
}

int main(void)
{
    CHECK_RUN(readme_example_runs);
    FILE *f = fopen("README.md", "r");
    if (f) {
        fclose(f);
        CHECK_RUN(readme_excerpt_matches_example);
    } else {
        check_skip("readme_excerpt_matches_example", "not run from the repository root");
    }
    return check_summary();
}
