/*
 * test_transforms.c - the in-kernel input transforms (src/cpu/transforms.c):
 * softplus and sigmoid at their extremes (no overflow, tiny results kept to
 * full relative accuracy), and every derivative against central finite
 * differences in fp64 on fresh random inputs.
 */
#include "common/check.h"
#include "cpu/transforms.h"

#include <math.h>
#include <stdlib.h>

/* Relative difference of two scalars (0 when both are 0). */
static double rel1(double x, double ref)
{
    double d = fabs(x - ref), m = fabs(ref);
    if (!isfinite(x) && isfinite(ref)) return INFINITY;
    return m > 0 ? d / m : d;
}

static void softplus_extremes(void)
{
    /* softplus(x) = e^x - e^2x / 2 + ... for very negative x: the tiny value must survive */
    for (double x = -700; x <= -40; x += 33.3)
        CHECK(rel1(fqla_softplus(x), exp(x)) < 1e-15, "softplus(%g) = %.17g, want %.17g", x, fqla_softplus(x), exp(x));
    CHECK(rel1(fqla_softplus(-30), exp(-30) - exp(-60) / 2) < 1e-15, "softplus(-30)");
    /* large x: x + log1p(e^-x), no overflow */
    CHECK(fqla_softplus(800) == 800, "softplus(800) = %g", fqla_softplus(800));
    CHECK(rel1(fqla_softplus(30), 30 + exp(-30)) < 1e-16, "softplus(30)");
    CHECK(rel1(fqla_softplus(0), log(2.0)) < 1e-16, "softplus(0)");
    CHECK(fqla_softplus(-INFINITY) == 0, "softplus(-inf)");
    CHECK(fqla_softplus(INFINITY) == INFINITY, "softplus(inf)");
    CHECK(isnan(fqla_softplus(NAN)), "softplus(NaN) must be NaN");
    /* random moderate arguments against the textbook formula */
    for (int i = 0; i < 200; i++) {
        double x = 10 * check_normal();
        CHECK(rel1(fqla_softplus(x), log1p(exp(x))) < 1e-14, "softplus(%g)", x);
    }
}

static void sigmoid_extremes(void)
{
    for (double x = -700; x <= -40; x += 33.3)
        CHECK(rel1(fqla_sigmoid(x), exp(x)) < 1e-15, "sigmoid(%g) = %.17g, want %.17g", x, fqla_sigmoid(x), exp(x));
    CHECK(fqla_sigmoid(800) == 1.0, "sigmoid(800)");
    CHECK(fqla_sigmoid(-800) >= 0 && fqla_sigmoid(-800) < 1e-300, "sigmoid(-800) = %g", fqla_sigmoid(-800));
    CHECK(fqla_sigmoid(0) == 0.5, "sigmoid(0)");
    CHECK(fqla_sigmoid(INFINITY) == 1.0 && fqla_sigmoid(-INFINITY) == 0.0, "sigmoid(+-inf)");
    CHECK(isnan(fqla_sigmoid(NAN)), "sigmoid(NaN) must be NaN");
    for (int i = 0; i < 200; i++) {
        double x = 8 * check_normal();
        CHECK(fabs(fqla_sigmoid(x) + fqla_sigmoid(-x) - 1) < 4.5e-16, "sigmoid symmetry at %g", x);
        CHECK(rel1(fqla_sigmoid(x), 1 / (1 + exp(-x))) < 1e-15, "sigmoid(%g)", x);
    }
    /* beta values: in (0, 1), or (0, 2) with allow_neg_eigval */
    CHECK(fqla_beta_value(800, 1) == 2.0 && fqla_beta_value(800, 0) == 1.0, "beta_value(800)");
    CHECK(rel1(fqla_beta_value(-50, 1), 2 * exp(-50)) < 1e-15, "beta_value(-50, neg)");
}

static void gate_value_and_grad(void)
{
    double h = 1e-6, worst = 0;
    for (int it = 0; it < 100; it++) {
        double a = 3 * check_normal(), A_log = check_normal(), dt = check_normal(), dg = check_normal();
        double g = fqla_gate_value(a, A_log, dt);
        CHECK(g <= 0, "gate value %g must be <= 0", g);
        CHECK(rel1(g, -exp(A_log) * log1p(exp(a + dt))) < 1e-14, "gate value");
        /* the helper adds into its outputs */
        double da = 1.5, dA = -0.5, ddt = 0.25;
        fqla_gate_grad(a, A_log, dt, dg, &da, &dA, &ddt);
        double fa = dg * (fqla_gate_value(a + h, A_log, dt) - fqla_gate_value(a - h, A_log, dt)) / (2 * h);
        double fA = dg * (fqla_gate_value(a, A_log + h, dt) - fqla_gate_value(a, A_log - h, dt)) / (2 * h);
        double fd = dg * (fqla_gate_value(a, A_log, dt + h) - fqla_gate_value(a, A_log, dt - h)) / (2 * h);
        double r1 = rel1(da - 1.5, fa), r2 = rel1(dA + 0.5, fA), r3 = rel1(ddt - 0.25, fd);
        CHECK(r1 < 1e-7 && r2 < 1e-7 && r3 < 1e-7, "gate grad vs FD: da %.2e dA_log %.2e ddt_bias %.2e", r1, r2, r3);
        worst = fmax(worst, fmax(r1, fmax(r2, r3)));
        /* NULL outputs are allowed */
        double only = 0;
        fqla_gate_grad(a, A_log, dt, dg, &only, NULL, NULL);
        CHECK(fabs(only - (da - 1.5)) <= 4e-16 * (1.5 + fabs(only)), "gate grad with NULL outputs");
    }
    /* far negative argument: g ~ -e^A e^x and dg/da ~ -e^A e^x, tiny but exact */
    double da = 0;
    fqla_gate_grad(-60, 0.3, -5, 1.0, &da, NULL, NULL);
    CHECK(rel1(da, -exp(0.3) * exp(-65)) < 1e-14, "gate grad at -65: %.17g", da);
    printf("  gate: worst FD rel %.2e\n", worst);
}

/* beta(b) minus a constant for b > 0 (c sigmoid(b) = c - c sigmoid(-b)):
 * a finite difference of values near c would lose the tiny derivative. */
static double beta_shifted(double b, int neg)
{
    return b > 0 ? -(neg ? 2.0 : 1.0) * fqla_sigmoid(-b) : fqla_beta_value(b, neg);
}

static void beta_grad(void)
{
    double h = 1e-6, worst = 0;
    for (int neg = 0; neg <= 1; neg++)
        for (int it = 0; it < 100; it++) {
            double b = 4 * check_normal(), d = check_normal();
            if (fabs(b) < 1e-3) b = 2e-3; /* beta_shifted jumps at 0 */
            double got = fqla_beta_grad(b, neg, d);
            double fd = d * (beta_shifted(b + h, neg) - beta_shifted(b - h, neg)) / (2 * h);
            double r = rel1(got, fd);
            CHECK(r < 1e-7, "beta grad b=%g neg=%d: %.17g vs FD %.17g", b, neg, got, fd);
            worst = fmax(worst, r);
        }
    /* the derivative for large |b| is tiny; 1 - sigmoid would lose it */
    double e = exp(-40);
    CHECK(rel1(fqla_beta_grad(40, 0, 1.0), e / ((1 + e) * (1 + e))) < 1e-14, "beta grad at 40");
    CHECK(rel1(fqla_beta_grad(-40, 1, 1.0), 2 * e / ((1 + e) * (1 + e))) < 1e-14, "beta grad at -40");
    printf("  beta: worst FD rel %.2e\n", worst);
}

/* L(x) = <c, l2norm(x)> */
static double l2_loss(const double *x, const double *c, int64_t n, double *buf)
{
    double L = 0;
    for (int64_t i = 0; i < n; i++) buf[i] = x[i];
    fqla_l2norm(buf, n);
    for (int64_t i = 0; i < n; i++) L += c[i] * buf[i];
    return L;
}

static void l2norm_value_and_grad(void)
{
    enum { n = 9 };
    double x[n], c[n], xh[n], dx[n], fd[n], buf[n], worst = 0;
    /* magnitudes where eps is negligible, comparable (|x|^2 ~ 1e-6) and dominant */
    const double mags[4] = {1.0, 3e-2, 1e-3, 1e-5};
    for (int m = 0; m < 4; m++)
        for (int it = 0; it < 20; it++) {
            double s = 0;
            for (int i = 0; i < n; i++) {
                x[i] = mags[m] * check_normal();
                c[i] = check_normal();
                xh[i] = x[i];
                s += x[i] * x[i];
            }
            double r = fqla_l2norm(xh, n);
            CHECK(rel1(r, 1 / sqrt(s + FQLA_L2NORM_EPS)) < 1e-15, "l2norm factor");
            double nn = 0;
            for (int i = 0; i < n; i++) nn += xh[i] * xh[i];
            CHECK(rel1(nn, s / (s + FQLA_L2NORM_EPS)) < 1e-14, "l2norm |xhat|^2 = %.17g", nn);
            fqla_l2norm_grad(xh, r, c, dx, n);
            double h = 1e-6 * mags[m];
            for (int i = 0; i < n; i++) {
                double x0 = x[i];
                x[i] = x0 + h;
                double lp = l2_loss(x, c, n, buf);
                x[i] = x0 - h;
                double lm = l2_loss(x, c, n, buf);
                x[i] = x0;
                fd[i] = (lp - lm) / (2 * h);
            }
            double rel = check_rel_error(dx, fd, n);
            CHECK(rel < 1e-7, "l2norm grad at |x| ~ %g: rel %.3e", mags[m], rel);
            worst = fmax(worst, rel);
        }
    /* in-place use (dx aliasing xhat) gives the same result */
    for (int i = 0; i < n; i++) { x[i] = check_normal(); xh[i] = x[i]; c[i] = check_normal(); }
    double r = fqla_l2norm(xh, n);
    fqla_l2norm_grad(xh, r, c, dx, n);
    fqla_l2norm_grad(xh, r, c, xh, n);
    CHECK(check_rel_error(xh, dx, n) == 0, "l2norm grad in place differs");
    printf("  l2norm: worst FD rel %.2e\n", worst);
}

int main(void)
{
    check_rng_seed(check_seed());
    CHECK_RUN(softplus_extremes);
    CHECK_RUN(sigmoid_extremes);
    CHECK_RUN(gate_value_and_grad);
    CHECK_RUN(beta_grad);
    CHECK_RUN(l2norm_value_and_grad);
    return check_summary();
}
