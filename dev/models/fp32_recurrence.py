#!/usr/bin/env python3
"""The fp32 token recurrence in two forms, against fp64: is the lazy decay safe?

fwd_recurrent.cu (c55b804, on main) runs the GDN recurrence token by token in fp32:

    S <- e^g S;  u = beta (v - S^T k^);  S <- S + k^ u^T;  o = scale S^T q^

with both dot products on the state before the token (the "direct" form below).
Branch fp32-v2 (session 28, not yet run on a GPU) keeps S = c St with one decay
scalar c per warp, so that a token's decay costs one multiply instead of one per
state row, and takes o from the updated state (two dot products a row, not three):

    c' = c e^g;  u = beta (v - c' rk (k . St));  St' = St + k (rk u / c');  o = scale rq c' (q . St')

and folds c into St (St *= c, c = 1) when c falls below 2^-32. This model runs
both forms in float32 (numpy) beside the fp64 recurrence on the decay extremes
test_gpu_fwd draws (strong decay, no decay with beta near 2, a g of -inf floored
at -100 as the kernels floor it, per-head strengths, raw keys with the in-kernel
l2norm) and prints the relative errors of o and of the final state. docs/testing.md's
bound for fp32 inputs is 1e-4.

    python3 dev/models/fp32_recurrence.py [SEED]     (numpy only, about a minute)
"""
import sys

import numpy as np

G_FLOOR = -100.0  # FQLA_FWD_G_FLOOR
RENORM = np.float32(2.0 ** -32)  # FQLA_REC_RENORM on branch fp32-v2


def rel(a, b):
    n = np.linalg.norm(b)
    return np.linalg.norm(a - b) / n if n > 0 else np.linalg.norm(a)


def draw(rng, case, T, H, K, V):
    q = rng.standard_normal((T, H, K))
    k = rng.standard_normal((T, H, K))
    l2norm = case == "raw keys, in-kernel l2norm"
    if not l2norm:  # the benchmark's unit keys
        q /= np.linalg.norm(q, axis=-1, keepdims=True)
        k /= np.linalg.norm(k, axis=-1, keepdims=True)
    v = rng.standard_normal((T, H, V))
    g = np.log(1.0 / (1.0 + np.exp(-rng.standard_normal((T, H))))) / 16
    beta = 1.0 / (1.0 + np.exp(-rng.standard_normal((T, H))))
    if case == "strong decay (g = -20)":
        g[:] = -20.0
    elif case == "no decay, beta in {0, 1, 1.99}":
        g[:] = 0.0
        beta = rng.choice([0.0, 1.0, 1.99], size=(T, H))
    elif case == "g = -inf at token 70":
        g[70] = -np.inf
    elif case == "per-head strength 0..16":
        g *= np.linspace(0.0, 16.0 * 16, H)[None, :]
    h0 = rng.standard_normal((H, K, V))
    # the inputs as the fp32 kernels see them
    f32 = lambda x: np.asarray(x, dtype=np.float32)
    return [f32(x) for x in (q, k, v, g, beta, h0)], l2norm


def reference(q, k, v, g, beta, h0, l2norm, scale):
    q, k, v, g, beta, S = (np.asarray(x, dtype=np.float64) for x in (q, k, v, g, beta, h0))
    g = np.maximum(g, G_FLOOR)
    if l2norm:
        q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6)
        k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    o = np.zeros_like(v)
    for t in range(q.shape[0]):
        S = S * np.exp(g[t])[:, None, None]
        u = beta[t][:, None] * (v[t] - np.einsum("hk,hkv->hv", k[t], S))
        S = S + k[t][:, :, None] * u[:, None, :]
        o[t] = scale * np.einsum("hk,hkv->hv", q[t], S)
    return o, S


def token_scalars(qt, kt, gt, l2norm):
    """A token's floored gate and l2norm factors (1 without), in fp32."""
    one = np.float32(1)
    rk = rq = np.ones(qt.shape[0], np.float32)
    if l2norm:
        rk = one / np.sqrt((kt * kt).sum(-1) + np.float32(1e-6))
        rq = one / np.sqrt((qt * qt).sum(-1) + np.float32(1e-6))
    return np.maximum(gt, np.float32(G_FLOOR)), rk, rq


def direct(q, k, v, g, beta, h0, l2norm, scale):
    """c55b804's form: both dots on the state before the token, the decay on every row."""
    S = h0.copy()
    o = np.zeros_like(v)
    for t in range(q.shape[0]):
        gt, rk, rq = token_scalars(q[t], k[t], g[t], l2norm)
        kS = np.einsum("hk,hkv->hv", k[t], S)
        qS = np.einsum("hk,hkv->hv", q[t], S)
        qk = (q[t] * k[t]).sum(-1)
        eg = np.exp(gt)
        u = beta[t][:, None] * (v[t] - (eg * rk)[:, None] * kS)
        S = eg[:, None, None] * S + k[t][:, :, None] * (rk[:, None] * u)[:, None, :]
        o[t] = scale * ((eg * rq)[:, None] * qS + (rq * rk * qk)[:, None] * u)
    return o, S


def lazy(q, k, v, g, beta, h0, l2norm, scale):
    """Branch fp32-v2's form: S = c St, the decay on c, o from the updated state."""
    one, St = np.float32(1), h0.copy()
    c = np.ones(q.shape[1], np.float32)
    o = np.zeros_like(v)
    folds = 0
    for t in range(q.shape[0]):
        gt, rk, rq = token_scalars(q[t], k[t], g[t], l2norm)
        d = np.einsum("hk,hkv->hv", k[t], St)
        c = c * np.exp(gt)
        u = beta[t][:, None] * (v[t] - (c * rk)[:, None] * d)
        low = c < RENORM
        if low.any():  # per warp in the kernel (one value head)
            folds += int(low.sum())
            St[low] *= c[low][:, None, None]
            c[low] = one
        ku = (rk / c)[:, None] * u
        St = St + k[t][:, :, None] * ku[:, None, :]
        o[t] = scale * (rq * c)[:, None] * np.einsum("hk,hkv->hv", q[t], St)
    return o, c[:, None, None] * St, folds


def main():
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    rng = np.random.default_rng(seed)
    T, H, K, V = 1000, 8, 128, 32
    scale = K ** -0.5
    cases = ["default gates, sigmoid beta", "strong decay (g = -20)", "no decay, beta in {0, 1, 1.99}",
             "g = -inf at token 70", "per-head strength 0..16", "raw keys, in-kernel l2norm"]
    print("seed %d, T = %d, %d heads, K = %d, V = %d; relative L2 errors against fp64 (bound 1e-4)" %
          (seed, T, H, K, V))
    print("%-34s %10s %10s %10s %10s %6s" % ("case", "direct o", "state", "lazy o", "state", "folds"))
    worst = 0.0
    for case in cases:
        (q, k, v, g, beta, h0), l2n = draw(rng, case, T, H, K, V)
        o_ref, s_ref = reference(q, k, v, g, beta, h0, l2n, scale)
        o_d, s_d = direct(q, k, v, g, beta, h0, l2n, np.float32(scale))
        o_l, s_l, folds = lazy(q, k, v, g, beta, h0, l2n, np.float32(scale))
        errs = [rel(o_d, o_ref), rel(s_d, s_ref), rel(o_l, o_ref), rel(s_l, s_ref)]
        if not all(np.isfinite(errs)):
            errs = [e if np.isfinite(e) else float("inf") for e in errs]
        worst = max(worst, *errs)
        print("%-34s %10.2e %10.2e %10.2e %10.2e %6d" % (case, *errs, folds))
    print("worst %.2e (%s)" % (worst, "within 1e-4" if worst <= 1e-4 else "OVER 1e-4"))
    return 0 if worst <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
