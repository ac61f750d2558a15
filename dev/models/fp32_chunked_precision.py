#!/usr/bin/env python3
"""A chunked fp32 forward on tensor cores: which split of the products meets 1e-4?

fp32 q/k/v run today on a token-by-token recurrence on CUDA cores (fwd_recurrent.cu),
2-7x slower than FLA's chunked fp32 kernels. The chunked form (docs/design.md §2) on
tensor cores would be the real step, but tensor cores take tf32 or bf16 operands, so
each fp32 product has to be split. This model runs docs/design.md §2's chunked form with
every matrix product in one of these precisions and prints the relative errors of o
and the final state against the fp64 recurrence (docs/testing.md: 1e-4 for fp32 inputs):

    fp32      the products in fp32 (CUDA cores; the bound of any split)
    3xtf32    A = Ah + Al, B = Bh + Bl in tf32: Ah Bh + Ah Bl + Al Bh (CUTLASS's 3xTF32, the CP scan's)
    bf16x3    the same split in bf16: three products at the bf16 rate, 2x tf32's on Hopper
    tf32      one tf32 product (FLA's fp32 path: its o is 1.6e-3 from ours, docs/history/perf-log.md session 28)
    bf16      one bf16 product: what the bf16 path's products round (its inputs are bf16 already)

Elementwise work (gates, Gamma, the token factors, the state's decay) stays in fp32;
the inverse Ar is formed from its products in the same precision, by forward
substitution in fp32. Inputs: fp32 values as test_gpu_fwd draws them.

    python3 dev/models/fp32_chunked_precision.py [SEED]     (numpy only, ~20 s)
"""
import sys

import numpy as np

from fp32_recurrence import reference  # the fp64 recurrence (this folder)

C = 64


def round_mantissa(x, bits):
    """Round fp32 values to `bits` explicit mantissa bits (nearest even), as fp64."""
    m, e = np.frexp(np.asarray(x, dtype=np.float64))
    scale = 2.0 ** (bits + 1)
    return np.ldexp(np.round(m * scale) / scale, e)


def split(x, bits):
    hi = round_mantissa(x, bits)
    return hi, round_mantissa(np.float32(x - hi), bits)


def product(a, b, mode):
    """a @ b (fp32 operands) as the tensor cores would form it; fp32 result."""
    a, b = np.float32(a), np.float32(b)
    if mode == "fp32":
        return a @ b
    if mode in ("tf32", "bf16"):
        bits = 10 if mode == "tf32" else 7
        return np.float32(round_mantissa(a, bits) @ round_mantissa(b, bits))
    bits = 10 if mode == "3xtf32" else 7
    ah, al = split(a, bits)
    bh, bl = split(b, bits)
    return np.float32(ah @ bh + (ah @ bl + al @ bh))


def inverse(L, mode):
    """(I + L)^-1 for strictly lower L by forward substitution, row by row; the row
    products in the model's precision, the rest fp32."""
    n = L.shape[0]
    X = np.eye(n, dtype=np.float32)
    for i in range(1, n):
        X[i, :i] = -product(L[i:i + 1, :i], X[:i, :i], mode)[0]
    return X


def chunked(q, k, v, g, beta, h0, scale, mode):
    T, H, K = q.shape
    S = h0.astype(np.float32).copy()
    o = np.zeros(v.shape, np.float32)
    f32 = np.float32
    for h in range(H):
        for c0 in range(0, T, C):
            sl = slice(c0, min(c0 + C, T))
            Q, Kc, Vc, b = q[sl, h], k[sl, h], v[sl, h], beta[sl, h]
            gam = np.cumsum(g[sl, h], dtype=np.float32)
            n = len(gam)
            Gam = np.tril(np.exp(np.minimum(f32(gam[:, None] - gam[None, :]), 0)))  # above the diagonal: masked
            KK = product(Kc, Kc.T, mode)
            Ar = inverse(np.tril(b[:, None] * KK, -1), mode)
            W = product(np.exp(gam)[:, None] * Kc, S[h], mode)
            U = product(Gam * Ar * b[None, :], Vc - W, mode)
            QK = np.tril(product(Q, Kc.T, mode))
            o[sl, h] = scale * (np.exp(gam)[:, None] * product(Q, S[h], mode) + product(Gam * QK, U, mode))
            d = np.exp(f32(gam[n - 1] - gam))
            S[h] = np.exp(gam[n - 1]) * S[h] + product(Kc.T, d[:, None] * U, mode)
    return o, S


def rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def main():
    seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    rng = np.random.default_rng(seed)
    T, H, K, V = 512, 2, 128, 128
    scale = K ** -0.5
    modes = ["fp32", "3xtf32", "bf16x3", "tf32", "bf16"]
    unit = lambda x: x / np.linalg.norm(x, axis=-1, keepdims=True)
    print("seed %d, T = %d, %d heads, K = V = %d: rel(o) / rel(state) against the fp64 recurrence" % (seed, T, H, K))
    print("%-32s" % "case" + "".join("%20s" % m for m in modes))
    for case in ["default gates, sigmoid beta", "no decay, beta in {0, 1, 1.99}", "strong decay (g = -20)"]:
        q = np.float32(unit(rng.standard_normal((T, H, K))))
        k = np.float32(unit(rng.standard_normal((T, H, K))))
        v = np.float32(rng.standard_normal((T, H, V)))
        g = np.float32(np.log(1 / (1 + np.exp(-rng.standard_normal((T, H))))) / 16)
        beta = np.float32(1 / (1 + np.exp(-rng.standard_normal((T, H)))))
        if case.startswith("no decay"):
            g[:] = 0
            beta = np.float32(rng.choice([0.0, 1.0, 1.99], size=(T, H)))
        elif case.startswith("strong"):
            g[:] = -20
        h0 = np.float32(rng.standard_normal((H, K, V)))
        o_ref, s_ref = reference(q, k, v, g, beta, h0, False, scale)
        row = []
        for m in modes:
            o, s = chunked(q, k, v, g, beta, h0, np.float32(scale), m)
            row.append("%9.2e /%9.2e" % (rel(o, o_ref), rel(s, s_ref)))
        print("%-32s" % case + "".join("%20s" % r for r in row), flush=True)


if __name__ == "__main__":
    main()
