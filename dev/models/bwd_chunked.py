#!/usr/bin/env python3
"""DOCSTRING_PLACEHOLDER"""
import argparse
import datetime
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from inverse_precision import to_bf16, to_f32, to_fp16, tf32_round_away  # noqa: E402

C = 64
KD = VD = 128


def ident(x):
    return np.asarray(x, np.float64)


OPERAND = {"fp64": ident, "fp32": to_f32, "tf32": tf32_round_away, "bf16": to_bf16, "fp16": to_fp16}
STORE = {"fp64": ident, "fp32": to_f32, "bf16": to_bf16, "fp16": to_fp16}

# pass 2's products (names used by the precision switches); MAC counts per chunk-head at
# C = 64, K = V = 128 are in MACS below.
PRODUCTS = ["X", "U", "KdS", "dU", "dP", "dT", "dY", "G2", "UdS", "dS", "dL", "dQK"]
PRODUCT_WHAT = {
    "X": "X = V - e K S_c (recompute, S_c operand)",
    "U": "U = T~ diag(beta) X",
    "KdS": "K dS' (dS' operand)",
    "dU": "P~^T dO",
    "dP": "dP~ = dO U^T",
    "dT": "dT~ = dU Y^T",
    "dY": "dY = T~^T dU",
    "G2": "[dO; dX] S_c^T (S_c operand)",
    "UdS": "diag(f) U dS'^T (dS' operand)",
    "dS": "dS += [Q; K]^T Z (state chain)",
    "dL": "dL = -T~^T dT~ T~^T",
    "dQK": "dQ~ K, dQ~^T Q, (M + M^T) K",
}
MACS = {"X": C * KD * VD, "U": C * C * VD // 2, "KdS": C * KD * VD, "dU": C * C * VD // 2,
        "dP": C * C * VD, "dT": C * C * VD, "dY": C * C * VD // 2, "G2": 2 * C * VD * KD,
        "UdS": C * VD * KD, "dS": 2 * C * KD * VD, "dL": 2 * C * C * C // 2, "dQK": 3 * C * C * KD,
        "QK/KK + inverse (recompute)": 2 * C * C * KD + C * C * C // 2}


class Config:
    """One way the GPU could compute the backward.

    exact      every rounding off (fp64 throughout): the chunked algorithm's own arithmetic
    pass1      operand precision of the state pass's chain (the forward chain): "bf16" as the
               forward kernel (bf16(S), bf16 Ag, bf16 f U), "fp32", or "fp64"
    state      storage of the per-chunk states S_c read by pass 2: fp32 / bf16 / fp16
    x          "recompute" (X = V - e K S_c in pass 2 from the stored S_c) or "store:<fmt>"
               (pass 1's fp32 X stored in <fmt>)
    tt         storage/precision of T~ = Gamma (.) Ar as pass 2 sees it (fp32: recomputed or
               stored fp32; bf16: stored bf16)
    prec       {product: operand precision}, fp32 accumulate (one rounding per product)
    dg         "terms" (per-term products, chunked_bwd.c) or "cumsum" (FLA's d(gamma)
               followed by a reverse cumulative sum)
    out        rounding of dq, dk, dv as written (bf16: q's dtype); dg, dbeta, dh0 fp32
    """

    def __init__(self, name, exact=False, pass1="bf16", state="bf16", x="recompute", tt="fp32",
                 prec="bf16", dg="terms", out="bf16"):
        self.name = name
        self.exact = exact
        self.pass1 = "fp64" if exact else pass1
        self.state = "fp64" if exact else state
        self.x = x
        self.tt = "fp64" if exact else tt
        if isinstance(prec, str):
            prec = {p: prec for p in PRODUCTS}
        else:
            prec = dict(prec)
        self.prec = {p: ("fp64" if exact else prec.get(p, "fp32")) for p in PRODUCTS}
        self.dg = dg
        self.out = "fp64" if exact else out

    def f32(self, x):
        return ident(x) if self.exact else to_f32(x)

    def mm(self, name, a, b):
        r = OPERAND[self.prec[name]]
        with np.errstate(over="ignore", invalid="ignore"):
            return self.f32(r(a) @ r(b))


# --------------------------------------------------------------------------- inputs
def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


CASES = {
    # key: (description, T, heads)
    "bench": ("benchmark inputs: unit q/k, g = logsigmoid(randn)/16, head 0 of 4 ungated, "
              "beta = sigmoid(randn)", 1024, 4),
    "strong": ("strong decay: g = -20 on every token", 3000, 1),
    "nodecay": ("g = 0 (every head)", 1024, 2),
    "neg_eig": ("g = 0, beta in [1.9, 2) (allow_neg_eigval)", 1024, 2),
}


def draw(case, seed, T=None, H=None):
    """One problem, [T, H, ...] per head (H = HV, group 1), inputs rounded as the GPU reads
    them: q, k, v, dO bf16; g, beta, h0, dht fp32."""
    _, T0, H0 = CASES[case]
    T, H = T or T0, H or H0
    rng = np.random.default_rng(seed)
    q = to_bf16(unit(rng.standard_normal((T, H, KD))))
    k = to_bf16(unit(rng.standard_normal((T, H, KD))))
    v = to_bf16(rng.standard_normal((T, H, VD)))
    do = to_bf16(rng.standard_normal((T, H, VD)))
    g = np.log(sigmoid(rng.standard_normal((T, H)))) / 16
    beta = sigmoid(rng.standard_normal((T, H)))
    if case == "bench":
        g[:, 0] = 0.0
    elif case == "strong":
        g[:] = -20.0
    elif case == "nodecay":
        g[:] = 0.0
    elif case == "neg_eig":
        g[:] = 0.0
        beta = rng.uniform(1.9, 2.0, size=(T, H))
    g, beta = to_f32(g), to_f32(beta)
    h0 = to_f32(rng.standard_normal((H, KD, VD)))
    dht = to_f32(rng.standard_normal((H, KD, VD)))
    return dict(q=q, k=k, v=v, do=do, g=g, beta=beta, h0=h0, dht=dht, scale=KD ** -0.5)


# --------------------------------------------------------------------------- the oracle
def library_reference(inp):
    """The library's fp64 reference backward (FQLA_BACKEND_CPU_REFERENCE) through the Python
    package: {dq, dk, dv, dg, dbeta, dh0} as [T, H, ...] / [H, K, V] float64."""
    import torch
    from flashqla import _lib, ops
    t = lambda x: torch.from_numpy(np.ascontiguousarray(x, np.float64))
    q, k, v, do = (t(inp[n])[None] for n in ("q", "k", "v", "do"))
    g, beta = t(inp["g"])[None], t(inp["beta"])[None]
    h0, dht = t(inp["h0"])[None], t(inp["dht"])[None]
    dq, dk, dv, dg, dbeta, dh0, _, _ = ops.bwd_impl(q, k, v, g, beta, None, None, h0, None, None, do, dht,
                                                    inp["scale"], 0, _lib.BACKEND_CPU_REFERENCE)
    n = lambda x: x.numpy()
    return dict(dq=n(dq[0]), dk=n(dk[0]), dv=n(dv[0]), dg=n(dg[0]), dbeta=n(dbeta[0]), dh0=n(dh0[0]))


# --------------------------------------------------------------------------- the model
def chunk_gates(g, cfg):
    """gamma (chunk-local inclusive cumsum, fp32 on the GPU), e, f, e_C, Gamma (lower)."""
    if cfg.exact:
        gam = np.cumsum(g)
    else:
        gam = np.cumsum(g.astype(np.float32), dtype=np.float32).astype(np.float64)
    c = len(gam)
    d = gam[:, None] - gam[None, :]
    if not cfg.exact:
        d = to_f32(d)
    Gam = np.where(np.tri(c, dtype=bool), np.exp(np.minimum(d, 0.0)), 0.0)
    e = np.exp(gam)
    f = np.exp(gam[-1] - gam if cfg.exact else to_f32(gam[-1] - gam))
    eC = np.exp(gam[-1])
    return [cfg.f32(x) for x in (e, f, eC, Gam)]


def chunk_inverse(Kc, beta, Gam, cfg):
    """T~ = (I + StrictLower(diag(beta) (Gamma (.) K K^T)))^-1: the inverse is formed in
    fp32 accuracy (3xTF32 on the GPU, ~exact; dev/models/inverse_precision.py), modelled as
    the fp64 inverse of the fp32 matrix, rounded to fp32."""
    KK = cfg.f32(Kc @ Kc.T)  # bf16 operands are exact: fp32 accumulate only
    L = np.tril(cfg.f32(beta[:, None] * cfg.f32(Gam * KK)), -1)
    c = len(beta)
    Tt = np.linalg.solve(np.eye(c) + L, np.eye(c))
    Tt = np.tril(Tt)
    return cfg.f32(Tt), KK


def pass1(inp, h, cfg):
    """The state pass: the forward chain per chunk, storing the state entering every chunk
    (rounded to cfg.state) and pass 1's fp32 X (for cfg.x = store)."""
    Q, Kh, Vh, g, beta = (inp[n][:, h] for n in ("q", "k", "v", "g", "beta"))
    T = len(g)
    S = ident(inp["h0"][h])
    states, xs = [], []
    p = cfg.pass1
    op = OPERAND[p]
    for c0 in range(0, T, C):
        sl = slice(c0, min(c0 + C, T))
        Kc, Vc, b = Kh[sl], Vh[sl], beta[sl]
        e, f, eC, Gam = chunk_gates(g[sl], cfg)
        Tt, _ = chunk_inverse(Kc, b, Gam, cfg)
        states.append(STORE[cfg.state](S))
        KS = cfg.f32(Kc @ op(S))
        X = cfg.f32(Vc - cfg.f32(e[:, None] * KS))
        xs.append(X)
        Ag = op(cfg.f32(Tt * b[None, :]))
        U = cfg.f32(Ag @ op(X))
        S = cfg.f32(cfg.f32(eC * S) + cfg.f32(Kc.T @ op(cfg.f32(f[:, None] * U))))
    return states, xs


def dg_terms(de, df, deC, e, f, eC, R, cfg):
    """dg_t = sum_{i>=t} de_i e_i + sum_{j<t} df_j f_j + de_C e_C + sum_{i>=t>j} R_ij
    (chunked_bwd.c): every term contains g_t's decay; on the GPU in fp32."""
    c = len(e)
    a = cfg.f32(de * e)
    b = cfg.f32(df * f)
    suf = np.cumsum(a[::-1])[::-1]
    pre = np.concatenate([[0.0], np.cumsum(b)[:-1]])
    # cross_t = sum_{i>=t} sum_{j<t} R_ij: row prefix sums over j, then column suffix over i
    Rp = np.concatenate([np.zeros((c, 1)), np.cumsum(R, axis=1)[:, :-1]], axis=1)  # [i, t] = sum_{j<t} R_ij
    Rp = cfg.f32(Rp)
    cross = (Rp * np.tri(c)).sum(axis=0)  # sum_{i>=t} Rp[i, t]
    return cfg.f32(cfg.f32(suf) + cfg.f32(pre) + cfg.f32(deC * eC) + cfg.f32(cross))


def dg_cumsum(de, df, deC, e, f, eC, Rfull, cfg):
    """FLA's form: the gradient w.r.t. each cumulative gamma_i as (terms with e^{+gamma_i})
    - (terms with e^{-gamma_i}), each formed in fp32 as FLA forms q.dq and k.dk (so the
    O(1) diagonal terms Gamma_ii = 1 and f_C = 1 enter both), then a reverse cumulative sum
    in fp32. Rfull includes the diagonal R_ii."""
    c = len(e)
    a = de * e
    b = df * f
    P = cfg.f32(a + Rfull.sum(axis=1))          # row i: gamma_i with +
    P[-1] = cfg.f32(P[-1] + cfg.f32(deC * eC + b.sum()))  # gamma_C inside e_C and every f_j
    N = cfg.f32(b + Rfull.sum(axis=0))           # column i: gamma_i with -
    dgam = cfg.f32(P - N)
    out = np.zeros(c)
    acc = 0.0
    for t in range(c - 1, -1, -1):
        acc = cfg.f32(acc + dgam[t])
        out[t] = acc
    return out


def pass2(inp, h, states, xs, cfg):
    """The reverse chunk loop of one value head (chunked_bwd.c's formulas, file header),
    every product through cfg.mm with its switch, elementwise work in fp32."""
    Q, Kh, Vh, g, beta, dO = (inp[n][:, h] for n in ("q", "k", "v", "g", "beta", "do"))
    scale = inp["scale"]
    T = len(g)
    f32 = cfg.f32
    dq, dk, dv = np.zeros_like(Q), np.zeros_like(Kh), np.zeros_like(Vh)
    dgo, dbo = np.zeros(T), np.zeros(T)
    dS = ident(inp["dht"][h])
    starts = list(range(0, T, C))
    for ci in range(len(starts) - 1, -1, -1):
        c0 = starts[ci]
        sl = slice(c0, min(c0 + C, T))
        Qc, Kc, Vc, b, dOc = Q[sl], Kh[sl], Vh[sl], beta[sl], dO[sl]
        c = len(b)
        S = states[ci]
        e, f, eC, Gam = chunk_gates(g[sl], cfg)
        Tt, KK = chunk_inverse(Kc, b, Gam, cfg)
        Tt = STORE[cfg.tt](Tt)
        QKm = np.tril(f32(Qc @ Kc.T))
        P = f32(scale * f32(Gam * QKm))
        if cfg.x == "recompute":
            X = f32(Vc - f32(e[:, None] * cfg.mm("X", Kc, S)))
        else:
            X = STORE[cfg.x.split(":")[1]](xs[ci])
        Y = f32(b[:, None] * X)
        U = cfg.mm("U", Tt, Y)
        # dU = P~^T dO + diag(f) K dS';  df_j = (K dS')_j . u_j
        KdS = cfg.mm("KdS", Kc, dS)
        dU = f32(cfg.mm("dU", P.T, dOc) + f32(f[:, None] * KdS))
        df = f32((KdS * U).sum(1))
        dP = np.tril(cfg.mm("dP", dOc, U.T))
        dT = np.tril(cfg.mm("dT", dU, Y.T), -1)
        dY = cfg.mm("dY", Tt.T, dU)
        dbeta = (X * dY).sum(1)
        dX = f32(b[:, None] * dY)
        dv[sl] = dX
        G2 = cfg.mm("G2", np.concatenate([dOc, dX]), S.T)
        G2q, G2k = G2[:c], G2[c:]
        de = f32(scale * (Qc * G2q).sum(1) - (Kc * G2k).sum(1))
        dQc = f32(scale * e[:, None] * G2q)
        dKc = f32(-e[:, None] * G2k)
        dKc = f32(dKc + cfg.mm("UdS", f32(f[:, None] * U), dS.T))
        deC = (S * dS).sum()
        Z = np.concatenate([f32(scale * e[:, None] * dOc), f32(-e[:, None] * dX)])
        dS_new = f32(f32(eC * dS) + cfg.mm("dS", np.concatenate([Qc, Kc]).T, Z))
        # through the inverse
        M1 = cfg.mm("dL", Tt.T, dT)
        dL = -np.tril(cfg.mm("dL", M1, Tt.T), -1)
        GdL = f32(Gam * dL)
        dbeta = f32(dbeta + (GdL * KK).sum(1))
        Msym = f32(b[:, None] * GdL)
        Msym = Msym + Msym.T
        dQt = f32(scale * f32(Gam * dP))
        dQc = f32(dQc + cfg.mm("dQK", dQt, Kc))
        dKc = f32(dKc + cfg.mm("dQK", dQt.T, Qc))
        dKc = f32(dKc + cfg.mm("dQK", Msym, Kc))
        # gate
        Rl = f32(Gam * f32(dL * f32(b[:, None] * KK)))           # strict lower (L has no diagonal)
        Rp = f32(Gam * f32(scale * f32(dP * QKm)))               # lower incl. diagonal
        if cfg.dg == "terms":
            R = np.tril(Rl + Rp, -1)                              # Gamma_ii = 1: no gate inside
            dgc = dg_terms(de, df, deC, e, f, eC, R, cfg)
        else:
            dgc = dg_cumsum(de, df, deC, e, f, eC, Rl + Rp, cfg)
        dq[sl], dk[sl], dgo[sl], dbo[sl] = dQc, dKc, dgc, f32(dbeta)
        dS = dS_new
    return dq, dk, dv, dgo, dbo, dS


def model(inp, cfg):
    H = inp["q"].shape[1]
    out = {n: [] for n in ("dq", "dk", "dv", "dg", "dbeta", "dh0")}
    for h in range(H):
        states, xs = pass1(inp, h, cfg)
        r = pass2(inp, h, states, xs, cfg)
        for n, x in zip(out, r):
            out[n].append(x)
    res = {n: np.stack(x, axis=1 if n != "dh0" else 0) for n, x in out.items()}
    for n in ("dq", "dk", "dv"):
        res[n] = STORE[cfg.out](res[n])
    return res


GRADS = ["dq", "dk", "dv", "dbeta", "dg", "dh0"]
LIMIT = {"dq": 8e-3, "dk": 8e-3, "dv": 8e-3, "dh0": 8e-3, "dg": 2e-2, "dbeta": 2e-2}


def rel_worst(x, ref, name):
    """docs/testing.md's rel(), worst over value heads."""
    worst = 0.0
    H = ref.shape[0] if name == "dh0" else ref.shape[1]
    for h in range(H):
        a, b = (x[h], ref[h]) if name == "dh0" else (x[:, h], ref[:, h])
        nb = np.linalg.norm(b)
        r = np.linalg.norm(a - b) / nb if nb > 0 else np.linalg.norm(a)
        if not np.all(np.isfinite(a)):
            r = np.inf
        worst = max(worst, r)
    return worst
