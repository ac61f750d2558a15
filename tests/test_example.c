/*
 * test_example.c - the README's usage example (docs/example.c) compiles with
 * the project's strict C99 flags, links against the library and runs to a
 * successful fqla_fwd. The example is included here verbatim, its main
 * renamed, so the README cannot show code that does not build.
 */
#define main example_main
#include "../docs/example.c"
#undef main

#include "common/check.h"

static void readme_example_runs(void)
{
    CHECK(example_main() == 0, "docs/example.c returned non-zero (see its message above)");
}

int main(void)
{
    CHECK_RUN(readme_example_runs);
    return check_summary();
}
