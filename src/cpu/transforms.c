/*
 * transforms.c - the in-kernel input transforms of the contract and their
 * derivatives, in fp64 (see transforms.h):
 *   gate   g    = -exp(A_log) * softplus(a + dt_bias)
 *   beta   beta = sigmoid(b) (times 2 with allow_neg_eigval)
 *   l2norm x^   = x / sqrt(sum x^2 + 1e-6)
 * Every function is written so that it neither overflows nor loses the small
 * results at the extremes (softplus of -800, sigmoid of +-800).
 */
#include "cpu/transforms.h"

#include <math.h>

double fqla_softplus(double x)
{
    /* log(1 + e^x) = x + log(1 + e^-x): for x > 0 use the second form so that
     * e^x cannot overflow; for x <= 0 log1p keeps the tiny e^x exactly. */
    if (x > 0)
        return x + log1p(exp(-x));
    return log1p(exp(x));
}

double fqla_sigmoid(double x)
{
    /* Only ever exponentiate a non-positive number: no overflow, and for very
     * negative x the result e^x / (1 + e^x) keeps full relative accuracy. */
    if (x >= 0)
        return 1.0 / (1.0 + exp(-x));
    double e = exp(x);
    return e / (1.0 + e);
}

double fqla_gate_value(double a, double A_log, double dt_bias)
{
    return -exp(A_log) * fqla_softplus(a + dt_bias);
}

void fqla_gate_grad(double a, double A_log, double dt_bias, double dg,
                    double *da, double *dA_log, double *ddt_bias)
{
    double x = a + dt_bias;
    double A = exp(A_log);
    /* d softplus(x) / dx = sigmoid(x) */
    double dx = -A * fqla_sigmoid(x) * dg;
    if (da) *da += dx;
    if (ddt_bias) *ddt_bias += dx;
    /* dg / dA_log = g itself */
    if (dA_log) *dA_log += -A * fqla_softplus(x) * dg;
}

double fqla_beta_value(double b, int allow_neg_eigval)
{
    double s = fqla_sigmoid(b);
    return allow_neg_eigval ? 2.0 * s : s;
}

double fqla_beta_grad(double b, int allow_neg_eigval, double dbeta)
{
    /* sigmoid'(b) = sigmoid(b) (1 - sigmoid(b)) = sigmoid(b) sigmoid(-b);
     * the product form keeps the tiny derivative for large |b| instead of
     * computing 1 - (a number rounded to 1). */
    double d = fqla_sigmoid(b) * fqla_sigmoid(-b);
    return (allow_neg_eigval ? 2.0 : 1.0) * d * dbeta;
}

double fqla_l2norm(double *x, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += x[i] * x[i];
    double r = 1.0 / sqrt(s + FQLA_L2NORM_EPS);
    for (int64_t i = 0; i < n; i++)
        x[i] *= r;
    return r;
}

void fqla_l2norm_grad(const double *xhat, double r, const double *dxhat, double *dx, int64_t n)
{
    /* With xhat = r x and r = (sum x^2 + eps)^(-1/2):
     *   d xhat_i / d x_j = r delta_ij - r^3 x_i x_j
     * so dx = r (dxhat - xhat <xhat, dxhat>): written with xhat, not x, so
     * it needs no further square root and no subtraction of large terms. */
    double dot = 0;
    for (int64_t i = 0; i < n; i++)
        dot += xhat[i] * dxhat[i];
    for (int64_t i = 0; i < n; i++)
        dx[i] = r * (dxhat[i] - xhat[i] * dot);
}
