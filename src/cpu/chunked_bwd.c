/*
 * chunked_bwd.c - the backward of the fast CPU backend (work in progress:
 * answers NOT_SUPPORTED until the chunked backward lands).
 */
#include "internal.h"

fqla_status fqla_cpu_bwd(fqla_context *ctx, const fqla_problem *p, const fqla_bwd_args *a)
{
    (void)p;
    (void)a;
    return fqla_fail(ctx, FQLA_STATUS_NOT_SUPPORTED, "CPU backward: not implemented yet");
}
