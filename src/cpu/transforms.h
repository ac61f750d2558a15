/*
 * transforms.h - the scalar and per-vector input transforms of the contract
 * (in-kernel gate, beta sigmoid, q/k l2norm), forward and backward, in fp64.
 * Shared by the fp64 reference and the fast CPU path so that both apply the
 * same definitions (docs/design.md §1).
 */
#ifndef FQLA_CPU_TRANSFORMS_H
#define FQLA_CPU_TRANSFORMS_H

#include <stdint.h>

#define FQLA_L2NORM_EPS 1e-6

/* log(1 + exp(x)) without overflow for large x or loss for very negative x. */
double fqla_softplus(double x);
double fqla_sigmoid(double x);

/* g = -exp(A_log) * softplus(a + dt_bias) */
double fqla_gate_value(double a, double A_log, double dt_bias);
/* Given dL/dg, adds dL/da to *da and the per-head parts to *dA_log, *ddt_bias
 * (any of the three pointers may be NULL). */
void fqla_gate_grad(double a, double A_log, double dt_bias, double dg,
                    double *da, double *dA_log, double *ddt_bias);

/* beta = sigmoid(b), times 2 when allow_neg_eigval */
double fqla_beta_value(double b, int allow_neg_eigval);
/* dL/db from dL/dbeta */
double fqla_beta_grad(double b, int allow_neg_eigval, double dbeta);

/* x <- x / sqrt(sum x^2 + eps), in place; returns r = 1 / sqrt(sum x^2 + eps). */
double fqla_l2norm(double *x, int64_t n);
/* dx = r * (dxhat - xhat * <xhat, dxhat>), where xhat = r x is the vector as
 * fqla_l2norm leaves it and r the factor it returned (with the unit vector
 * x / |x| this is r * (dxhat - x1 <x1, dxhat> * (sum x^2) / (sum x^2 + eps))). */
void fqla_l2norm_grad(const double *xhat, double r, const double *dxhat, double *dx, int64_t n);

#endif
