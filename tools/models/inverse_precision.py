#!/usr/bin/env python3
"""Precision of the chunk inverse Ar = (I + StrictLower(diag(beta) K K^T))^-1:
its effect on the forward's output o, against an fp64 reference, when Ag and Pg are
rounded to bf16 afterwards (as the kernel does). Variants of Ar: exact (fp64), fp32,
tf32 merges (16x16 diagonal blocks in fp32, merges with tf32 operands), fp16 (FlashInfer:
fp16 operands, fp32 accumulate, 8x8 diagonal blocks).

    python3 tools/models/inverse_precision.py [SEED]     (numpy only, ~1 minute)

Everything but Ar and the bf16 rounding of Ag and Pg is fp64, so the printed errors
isolate what the inverse's precision adds to the unavoidable rounding of Ag
(docs/perf.md, "Precision of the inverse").
"""
import numpy as np, sys
rng = np.random.default_rng(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
C = 64

def rnd_bits(x, mant):  # round fp64 values to a float with `mant` mantissa bits (RNE), fp32 range
    x = np.asarray(x, dtype=np.float64)
    m, e = np.frexp(x)
    m = np.round(m * 2.0**(mant + 1)) / 2.0**(mant + 1)
    return np.ldexp(m, e)
bf16 = lambda x: rnd_bits(x, 7)
tf32 = lambda x: rnd_bits(x, 10)
fp16 = lambda x: np.float64(np.float16(x))
f32 = lambda x: np.float64(np.float32(x))

def inv_blocked(L, blk, diag_round, op_round, store_round):
    """(I + L)^-1 for strictly lower L: diagonal blocks by forward substitution with every
    result rounded by diag_round, merges X_ij = -X_ii sum_k L_ik X_kj with operands rounded by
    op_round, sums in fp32 (rounded per product), results stored with store_round."""
    n = L.shape[0]; nb = n // blk
    X = np.zeros((n, n))
    for b in range(nb):
        s = slice(b*blk, (b+1)*blk)
        Lb = L[s, s]; Xb = np.zeros((blk, blk))
        for j in range(blk):
            x = np.zeros(blk)
            for i in range(blk):
                acc = 0.0
                for k in range(i):
                    acc = diag_round(acc + diag_round(Lb[i, k] * x[k]))
                x[i] = diag_round((1.0 if i == j else 0.0) - acc)
            Xb[:, j] = x
        X[s, s] = store_round(Xb)
    for j in range(nb):
        for i in range(j+1, nb):
            si, sj = slice(i*blk, (i+1)*blk), slice(j*blk, (j+1)*blk)
            T = np.zeros((blk, blk))
            for k in range(j, i):
                sk = slice(k*blk, (k+1)*blk)
                T = f32(T + op_round(L[si, sk]) @ op_round(X[sk, sj]))
            X[si, sj] = store_round(f32(-(op_round(X[si, si]) @ op_round(f32(T)))))
    return X

def variant_inv(KK, beta, v):
    L = np.tril(beta[:, None] * KK, -1)
    if v == 'exact': return np.linalg.inv(np.eye(C) + L)
    if v == 'fp32': return inv_blocked(f32(L), 16, f32, f32, f32)
    if v == 'tf32': return inv_blocked(f32(L), 16, f32, tf32, f32)
    if v == 'fp16': return inv_blocked(fp16(L), 8, f32, fp16, fp16)
    raise ValueError(v)

def forward(q, k, v, g, beta, variant, round_ops):
    T, K = k.shape; V = v.shape[1]
    S = np.zeros((K, V)); o = np.zeros((T, V))
    for c0 in range(0, T, C):
        sl = slice(c0, c0 + C)
        qc, kc, vc, gc, bc = q[sl], k[sl], v[sl], g[sl], beta[sl]
        gam = np.cumsum(gc)
        Gam = np.tril(np.exp(gam[:, None] - gam[None, :]))
        Ar = variant_inv(kc @ kc.T, bc, variant)
        Ag = Gam * Ar * bc[None, :]
        Pg = Gam * np.tril(qc @ kc.T)
        if round_ops: Ag, Pg = bf16(Ag), bf16(Pg)
        Vd = Ag @ (vc - np.exp(gam)[:, None] * (kc @ S))
        o[sl] = np.exp(gam)[:, None] * (qc @ S) + Pg @ Vd
        S = np.exp(gam[-1]) * S + kc.T @ (np.exp(gam[-1] - gam)[:, None] * Vd)
    return o, S

def rel(a, b): return np.linalg.norm(a - b) / np.linalg.norm(b)

T, K, V = 512, 64, 64
cases = {
    'random keys, beta U(0,1), g=-0.05': dict(corr=0.0, beta=lambda n: rng.uniform(0, 1, n), g=-0.05),
    'no decay, beta 1.99': dict(corr=0.0, beta=lambda n: np.full(n, 1.99), g=0.0),
    'correlated keys (0.7), beta 1.99, no decay': dict(corr=0.7, beta=lambda n: np.full(n, 1.99), g=0.0),
    'correlated keys (0.9), beta U(0,2), g=-0.01': dict(corr=0.9, beta=lambda n: rng.uniform(0, 2, n), g=-0.01),
}
for name, cs in cases.items():
    base = rng.standard_normal(K)
    k = cs['corr'] * base[None, :] + (1 - cs['corr']) * rng.standard_normal((T, K))
    k /= np.linalg.norm(k, axis=1, keepdims=True)
    q = rng.standard_normal((T, K)); q /= np.linalg.norm(q, axis=1, keepdims=True); q *= K**-0.5 * 8
    v = rng.standard_normal((T, V))
    g = np.full(T, cs['g']); beta = cs['beta'](T)
    o_ref, S_ref = forward(q, k, v, g, beta, 'exact', False)
    row = []
    for var in ('exact', 'fp32', 'tf32', 'fp16'):
        o, S = forward(q, k, v, g, beta, var, True)
        row.append('%s o %.2e S %.2e' % (var, rel(o, o_ref), rel(S, S_ref)))
    print('%-46s ' % name + ' | '.join(row), flush=True)
