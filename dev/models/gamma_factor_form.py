#!/usr/bin/env python3
"""Gamma in factor form: what it does to a chunk's Vd and P against fp64.

Today the prepare kernel rounds Ag = Gamma (.) X diag(beta) and the Pg warpgroup
Pg = scale Gamma (.) tril(Q K^T) to bf16, Gamma_ij = 2^(l_i - l_j) (l = the chunk's
cumulative log2 gate). In factor form (docs/history/perf-log.md, session 18's plan) Gamma_ij =
r_i c_j with r_i = 2^(l_i - m), c_j = 2^(m - l_j), m the midpoint of l; since
c_j r_j = 1,

    Vd = diag(r) Y,  Y = [X diag(c beta)] W,      P = Pg Vd = diag(r) [scale tril(Q K^T)] Y

so the bf16 operands become Ag'' = X diag(c beta) and Pg'' = scale tril(Q K^T) (no
Gamma), and r goes into factors the chain applies anyway. This model rounds exactly
what each form rounds to bf16 (Ag or Ag'', Pg or Pg'', Vd or Y as G6's operand), keeps
the rest in fp64, and prints the relative errors of Vd and P and the largest |Y| per
gate strength: the price in accuracy and the headroom Y needs.

    python3 dev/models/gamma_factor_form.py [SEED]     (numpy only, a few seconds)
"""
import sys

import numpy as np

rng = np.random.default_rng(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
C, K, V, DRAWS = 64, 128, 64, 100
SPREAD_MAX = 200.0  # the factor form only below this spread of l (log2): Y <= ~2^(spread / 2) |W|


def bf16(x):  # round to bf16 (RNE), as fp64
    m, e = np.frexp(np.asarray(x, dtype=np.float64))
    return np.ldexp(np.round(m * 256.0) / 256.0, e)


def rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def unit_rows(n, d):
    x = rng.standard_normal((n, d))
    return bf16(x / np.linalg.norm(x, axis=1, keepdims=True))


print("gate strength: mean |g| per token (natural log); spread: max - min of l (log2) in the chunk")
for strength in (0.05, 0.5, 1.0, 2.0, 3.0):
    err, n_fac = np.zeros(4), 0
    spread = ymax = 0.0
    for _ in range(DRAWS):
        q, k, W = unit_rows(C, K), unit_rows(C, K), bf16(rng.standard_normal((C, V)))
        beta = rng.uniform(0, 2, C)
        l = np.cumsum(-2 * strength * rng.uniform(0, 1, C)) / np.log(2)
        X = np.linalg.inv(np.eye(C) + np.tril(beta[:, None] * (k @ k.T), -1))
        Gam = np.tril(2.0 ** (l[:, None] - l[None, :]))
        S = 0.1 * np.tril(q @ k.T)
        vd_ex = (Gam * X * beta) @ W
        p_ex = (Gam * S) @ vd_ex
        # today: Ag, Pg and Vd (G6's operand) in bf16
        vd = bf16(Gam * X * beta) @ W
        p = bf16(Gam * S) @ bf16(vd)
        err[0] += rel(vd, vd_ex) / DRAWS
        err[2] += rel(p, p_ex) / DRAWS
        spread = max(spread, l.max() - l.min())
        if l.max() - l.min() >= SPREAD_MAX:
            continue  # the per-element form, as today
        # factor form: Ag'', Pg'' and Y in bf16; r and c in fp32
        n_fac += 1
        m = 0.5 * (l.max() + l.min())
        r, c = np.float32(2.0 ** (l - m)).astype(np.float64), np.float32(2.0 ** (m - l)).astype(np.float64)
        y = bf16(np.tril(X) * (c * beta)) @ W
        vd2 = r[:, None] * y
        p2 = r[:, None] * (bf16(S) @ bf16(y))
        err[1] += rel(vd2, vd_ex)
        err[3] += rel(p2, p_ex)
        ymax = max(ymax, np.abs(y).max())
    err[1::2] /= max(n_fac, 1)
    print("strength %.2f  spread <= %5.1f  factor form in %3d of %d   Vd: today %.2e factor %.2e   "
          "P: today %.2e factor %.2e   max|Y| %.1e" % (strength, spread, n_fac, DRAWS, *err, ymax))
