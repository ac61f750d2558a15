#!/usr/bin/env python3
r"""A numpy model of the chunked GDN backward as a Hopper kernel would compute it (issue 41).

What it is
    The reverse mode of docs/design.md §2's chunked form (C = 64, K = V = 128), written as
    src/cpu/chunked_bwd.c's formulas (its file header), in two passes as the issue's design:
      pass 1  the state pass: the forward chain per chunk (X = V - e K S, U = Ag X,
              S' = e_C S + K^T diag(f) U), storing the state S_c entering every chunk;
      pass 2  the reverse fused pass: chunks in reverse, recomputing the chunk's gates, T~ =
              Gamma (.) Ar, X and U from the stored S_c, carrying dS (fp32 accumulator), forming
              dq, dk, dv, dbeta, dg and finally dh0.
    Everything is float64 with explicit rounding emulation (dev/models/inverse_precision.py's
    helpers): every tensor-core product rounds its operands to its switch's format and its
    result once to fp32 (fp32 accumulate); elementwise work is rounded to fp32. Inputs are as
    the GPU reads them (q, k, v, dO bf16; g, beta, h0, dht fp32) and dq, dk, dv are written in
    bf16. The oracle is the library's fp64 reference backward (FQLA_BACKEND_CPU_REFERENCE,
    called through python/flashqla with float64 tensors of the same rounded values); with every
    rounding switched off the model matches it to ~1e-14 (self-check, run first; exit 1 if not).

Switches (class Config): pass 1's three products (KS, AX, KU), the storage of S_c (fp32 /
bf16 / fp16), X recomputed or stored, T~ fp32 or stored bf16, each pass 2 product's operand
precision (fp32 / tf32 / bf16 / bf16x3 = bf16 hi/lo split, three products, two where the other
operand is a bf16 input), the dg form (per-term products or FLA's difference of cumulative
sums) and the output rounding.

How to run (numpy + torch on the CPU; ~90 s on 2 cores with --seeds 2)
    make CUDA=0 -j2
    PYTHONPATH=python FLASHQLA_LIB=build/libflashqla.so python3 dev/models/bwd_chunked.py \
        [--seeds N] [--only storage,precision,dg,bytes,length,short,fold,mild,xdy,tail,trim,held] [--markdown OUT.md]
        [--tail-lengths 64:1000,128:600,512:100]
    bench/results/bwd-model.md is its output with --seeds 2.

Cases (CASES): bench (docs/benchmarks.md inputs: unit q/k, g = logsigmoid(randn)/16 with one
head of four ungated, beta = sigmoid(randn), T = 1024), strong (g = -20 per token, T = 3000),
nodecay (g = 0, T = 1024), neg_eig (g = 0, beta in [1.9, 2) as allow_neg_eigval gives,
T = 2048); h0 and dht randn, dO randn. Metric: docs/testing.md's rel, worst over heads/seeds.

Conclusions (numbers from bench/results/bwd-model.md, --seeds 2)
1. S_c storage: bf16 (32 KiB per chunk-head). With the recommended products below, fp32
   storage buys nothing measurable, because pass 2 only consumes S_c through bf16-operand
   products (the X recompute and [dO; dX] S^T) that round it to bf16 anyway: bench dq/dk/dg
   3.1e-3 / 3.7e-3 / 6.4e-3 (bf16) vs 3.1e-3 / 3.7e-3 / 6.2e-3 (fp32); strong decay 2.9e-3 /
   3.2e-3 / 4.7e-3 for both; neg_eig T = 2048 3.9e-3 / 5.5e-3 / 8.8e-3 (bf16) vs 9.6e-3 dg (fp32).
   Isolated (pass 2 in fp32), bf16 storage costs dq +0.6e-3, dbeta <= 1.7e-3, dg <= 5.0e-3;
   fp16 is 8x finer (dg <= 4.5e-4 isolated) but equal once the products are bf16, and its
   65504 range is a risk (S depends on the caller's h0 and keys): bf16.
   What matters is the precision that PRODUCES S_c: the forward's bf16 chain (bf16(S), bf16
   Ag, bf16 f U) as pass 1 fails neg_eig at T = 2048 whatever the storage (dq 1.4e-2, dk
   1.5e-2, dg 5.9e-2) and from T = 512 (dk 8.9e-3, dg 2.8e-2). Pass 1 needs all three chain
   products in fp32 accuracy: bf16 hi/lo split (KS and KU: 2 products, K is exact bf16; AX: 3)
   gives 3.9e-3 / 5.5e-3 / 8.8e-3; splitting only KS, KU (dg 2.6e-2) or only AX, KU (dg 2.5e-2)
   fails; tf32 passes (4.3e-3 / 5.8e-3 / 1.2e-2). So the forward cannot hand its bf16-chain
   states to the backward unless it runs split products in training.
2. Pass 2 operand precision (fp32 accumulate). Tolerate plain bf16 operands: X = V - e K S_c,
   U = T~ Y, dU = P~^T dO, dP~ = dO U^T, dT~ = dU Y^T, [dO; dX] S_c^T, diag(f) U dS'^T,
   dL = -T~^T dT~ T~^T, and the dq/dk products (dQ~ K, dQ~^T Q, (M + M^T) K): each alone in
   bf16 stays far inside the thresholds (the worst single ones: U, strong decay dg 4.4e-3;
   dL, neg_eig T = 2048 dk 4.0e-3, dg 8.7e-3). Need fp32-class operands: the reverse state chain dS' -> K dS' -> dU ->
   dY = T~^T dU -> dX -> Z -> dS += [Q; K]^T Z. One of them in plain bf16 fails neg_eig T = 2048:
   dY dk 1.0e-2, dv 1.1e-2, dg 2.7e-2, dh0 1.7e-2; dS dh0 1.2e-2; K dS' dg 2.2e-2, dh0 9.8e-3.
   Use the bf16 hi/lo split (K dS' and the dS update: 2 products, the other operand is a bf16
   input; dY: 3) or tf32 (chain products tf32: dv 2.6e-3, dh0 3.0e-3 vs 1.7e-3 / 8.0e-4 split;
   tf32 runs at half the bf16 rate, so the 2-product split is as cheap and more accurate for K dS'
   and dS; for dY tf32 is cheaper than 3 products). T~ must reach dY in fp32 accuracy: T~ stored
   bf16 fails (dk 8.7e-3, dg 2.6e-2, dh0 1.2e-2), so the forward's bf16 Ag cannot be reused.
   Recommended (pass 1 split, S_c bf16, K dS' / dY / dS split, the rest bf16) holds every case:
   worst dq 4.0e-3, dk 5.5e-3, dv 1.9e-3, dbeta 4.3e-3, dg 8.8e-3 (1.2e-2 for one head at
   T = 130-512, table 5), dh0 1.3e-3, flat in T up to 4096 for neg_eig.
   Plain bf16 everywhere (FLA-like) holds bench, strong decay and g = 0 with sigmoid beta up to
   T = 4096 (dq/dk/dv/dh0 <= 4.9e-3, dg <= 1.0e-2) and fails neg_eig from T = 512 (dk 1.1e-2,
   dv 8.8e-3, dg 3.8e-2, dh0 1.2e-2; T = 4096: 2.5e-2 / 1.8e-2 / 2.9e-2 / 2.6e-2). A cheaper
   variant for calls known to have beta <= 1 (use_beta_sigmoid without allow_neg_eigval) is
   possible: ~16.3 M instead of 23.6 M MAC per chunk-head.
3. dg: per-term products (chunked_bwd.c: suffix sums of de_i e_i, prefix sums of df_j f_j,
   de_C e_C, and the cross term sum_{i>=t>j} R_ij of the strictly lower R = Gamma (.) (dL (.)
   diag(beta) K K^T + scale dP~ (.) Q K^T), as row prefix sums then masked column sums, all in
   fp32) hold under strong decay: 4.7e-3 with the recommended precisions (1.6e-7 with fp32
   products, 5.0e-3 all bf16). FLA's difference of cumulative sums blows up: 4.9 with fp32
   products, 4.8 recommended, 4.8 all bf16 (even in fp64 it loses 9 digits: 3.4e-7). The
   issue measured FLA 1.4e2 and FlashQLA 3.2; this model's cumsum is the optimistic version
   (each O(1) side rounded once in fp32), FLA rounds more. On the bench inputs both forms
   agree (6.4e-3). The diagonal Gamma_ii = 1 and f_C = 1 terms must never enter.
4. Save vs recompute (per chunk-head, K = V = 128, group 2; fixed I/O 105.5 KiB; MAC at
   recommended precisions, bf16-equivalent): S_c bf16 64 KiB w+r -> 170 KiB = 41 ns of the
   whole H200 at 4.2 TB/s vs 23.6 M MAC = 48 ns at dense bf16 peak: bandwidth and tensor time
   are about balanced (hk16_hv32 32k: 0.68 ms bytes / 0.78 ms MAC; FlashQLA 2.515 ms). S_c fp32:
   234 KiB, 0.93 ms bytes at hk16_hv32 32k (bandwidth-bound, 1 GiB workspace). Storing X bf16
   (+32 KiB = +7.8 ns) saves 1.05 M MAC (2.1 ns) and is less accurate (bench dbeta 2.4e-3 vs
   1.4e-3): recompute. Storing T~ fp32 packed (+20 KiB = +4.9 ns) saves ~0.65 M MAC (1.3 ns);
   rereading pass 1's prepare output (+10 KiB) is a tie: recompute (smaller workspace, and a
   bf16 T~ is not allowed). bf16 S_c is also the form pass 2 consumes: TMA loads it straight
   into shared memory as the B operand of the X recompute and of [dO; dX] S_c^T, with no
   conversion pass (fp32 storage would need one). S_c every second chunk halves the workspace (256 MiB) and saves
   7.8 ns of traffic for +2.9 M MAC (5.8 ns) on the reverse chain's critical path: only if
   memory is the constraint. Recommendation: pass 1 writes S_c in bf16 and nothing else; pass 2
   recomputes gates, T~ (fp32, 3xTF32 inverse as the forward's prepare), P~, X and U.

Limits: one fp32 rounding per product (wgmma's internal accumulation order not modelled);
exp exact then rounded; the inverse is the fp64 inverse of the fp32 matrix rounded to fp32
(the forward's 3xTF32 inverse is that accurate: inverse_precision.py); in-kernel l2norm, gate
and beta transforms, GVA groups > 1 (dq/dk group sums are fp32 adds) and varlen are not
modelled; MACs count dense 64-row tiles (triangular products as dense), not the SFU or
CUDA-core work.
6. Few-token sequences (section 6, 20 seeds; the CUDA backward's tests/test_gpu_bwd.c has
   them): a gradient of a one- to five-token sequence is a single sum whose terms cancel, so
   the per-(sequence, head) error is the terms' rounding over the cancelled result. S_c must
   be fp32 (bf16: dg 0.19 at T = 2, 0.05 at T = 5) and X, K dS' and dY must be near-fp32
   (bf16 in X alone: dbeta 0.16 at T = 1; dY 0.12; K dS' 0.065, dg 0.024 at T = 5); every
   other product holds in plain bf16 there (the worst: G2 dg 1.3e-2 at T = 5). All tf32 is
   not enough (dbeta 9.5e-2 at T = 1). So the recommendation above, for a backward that must
   also hold short sequences: S_c fp32, X / K dS' / dY / dS split, the rest bf16.
"""
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

# pass 1's products (the forward chain, state-only): K S_c, Ag X (Ag = T~ diag(beta)), K^T diag(f) U
PASS1 = ["KS", "AX", "KU"]

# pass 2's products (names used by the precision switches; dense_macs() counts their MACs)
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


class Config:
    """One way the GPU could compute the backward.

    exact      every rounding off (fp64 throughout): the chunked algorithm's own arithmetic
    pass1      operand precision of the state pass's chain products (one format, or
               {KS, AX, KU: format}): "bf16" as the forward kernel (bf16(S), bf16 Ag, bf16 f U),
               "bf16x3" (hi/lo split), "tf32", "fp32"
    state      storage of the per-chunk states S_c read by pass 2: fp32 / bf16 / fp16
    x          "recompute" (X = V - e K S_c in pass 2 from the stored S_c) or "store:<fmt>"
               (pass 1's fp32 X stored in <fmt>)
    tt         storage/precision of T~ = Gamma (.) Ar as pass 2 sees it (fp32: recomputed or
               stored fp32; bf16: stored bf16)
    prec       one format or {product: format} (fp32 / tf32 / bf16 / bf16x3 / fp16; missing
               products fp32), fp32 accumulate (one rounding per product)
    dg         "terms" (per-term products, chunked_bwd.c) or "cumsum" (FLA's d(gamma)
               followed by a reverse cumulative sum)
    out        rounding of dq, dk, dv as written (bf16: q's dtype); dg, dbeta, dh0 fp32
    xdy        the operands of dbeta's x . dy: "fp32" (as the products leave them), or
               rounded to bf16 first: "dy", "x" or "both" (a fused kernel that passes them
               between warpgroups as bf16 planes)
    """

    def __init__(self, name, exact=False, pass1="bf16", state="bf16", x="recompute", tt="fp32",
                 prec="bf16", dg="terms", out="bf16", dsform="direct", xdy="fp32", dsq=None, dsheld="fp32"):
        self.name = name
        self.dsheld = dsheld
        self.dsq = dsq
        self.xdy = xdy
        self.dsform = dsform
        self.exact = exact
        if isinstance(pass1, str):
            pass1 = {p: pass1 for p in PASS1}
        self.pass1 = {p: ("fp64" if exact else pass1.get(p, "bf16")) for p in PASS1}
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

    def mm(self, name, a, b, mode=None):
        return product(self.prec[name] if mode is None else mode, a, b, self.exact)


def product(mode, a, b, exact=False):
    """a @ b as the tensor cores form it: operands rounded to `mode`, fp32 accumulate (one
    rounding of the result). "bf16x3": each operand split into bf16 hi + lo, three products
    hi hi + hi lo + lo hi (an operand that is already bf16, e.g. K, Q, dO, has lo = 0: two
    products)."""
    with np.errstate(over="ignore", invalid="ignore"):
        if mode == "bf16x3":
            ah, bh = to_bf16(a), to_bf16(b)
            al, bl = to_bf16(to_f32(a) - ah), to_bf16(to_f32(b) - bh)
            return to_f32(ah @ bh + (ah @ bl + al @ bh))
        r = OPERAND[mode]
        return ident(r(a) @ r(b)) if exact else to_f32(r(a) @ r(b))


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
    "neg_eig": ("g = 0, beta in [1.9, 2) (allow_neg_eigval)", 2048, 2),
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
    for c0 in range(0, T, C):
        sl = slice(c0, min(c0 + C, T))
        Kc, Vc, b = Kh[sl], Vh[sl], beta[sl]
        e, f, eC, Gam = chunk_gates(g[sl], cfg)
        Tt, _ = chunk_inverse(Kc, b, Gam, cfg)
        # "gpu": the CUDA chains' rule (bwd_state_bf16, without the short-sequence split):
        # bf16 past a sequence's first chunk where the chunk is full, else fp32
        store = cfg.state if cfg.state != "gpu" else ("bf16" if c0 > 0 and c0 + C <= T else "fp32")
        states.append(STORE[store](S))
        KS = product(p["KS"], Kc, S, cfg.exact)
        X = cfg.f32(Vc - cfg.f32(e[:, None] * KS))
        xs.append(X)
        U = product(p["AX"], cfg.f32(Tt * b[None, :]), X, cfg.exact)
        S = cfg.f32(cfg.f32(eC * S) + product(p["KU"], Kc.T, cfg.f32(f[:, None] * U), cfg.exact))
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
        bx = STORE["bf16"](X) if cfg.xdy in ("x", "both") else X
        by = STORE["bf16"](dY) if cfg.xdy in ("dy", "both") else dY
        dbeta = (bx * by).sum(1)
        dX = f32(b[:, None] * dY)
        dv[sl] = dX
        G2 = cfg.mm("G2", np.concatenate([dOc, dX]), S.T)
        G2q, G2k = G2[:c], G2[c:]
        de = f32(scale * (Qc * G2q).sum(1) - (Kc * G2k).sum(1))
        dQc = f32(scale * e[:, None] * G2q)
        dKc = f32(-e[:, None] * G2k)
        dKc = f32(dKc + cfg.mm("UdS", f32(f[:, None] * U), dS.T))
        deC = (S * dS).sum()
        if cfg.dsform == "folded":
            # FlashQLA's form of the reverse chain: with A = T~ diag(e beta) K (chunk inputs only),
            # dS <- e_C dS - (diag(f) A)^T (K dS') + (scale diag(e) Q - P~ A)^T dO: two dependent
            # products a chunk (K dS', then W1^T of it) instead of three (K dS', T~^T dU, K^T dY);
            # A and W2 at dS's precision (the chain's split products)
            A = cfg.mm("dS", Tt, f32(f32(e * b)[:, None] * Kc))
            W1 = f32(f[:, None] * A)
            W2 = f32(f32(scale * e[:, None] * Qc) - cfg.mm("dS", P, A))
            dS_new = f32(f32(f32(eC * dS) - cfg.mm("dS", W1.T, KdS)) + cfg.mm("dS", W2.T, dOc))
        elif cfg.dsq is not None:
            # the update's two terms as two products, Q^T (scale e dO) at its own precision
            # (the GPU chain runs them as two wgmma chains into one accumulator)
            tq = cfg.mm("dS", Qc.T, f32(scale * e[:, None] * dOc), cfg.dsq)
            tk = cfg.mm("dS", Kc.T, f32(-e[:, None] * dX))
            dS_new = f32(f32(eC * dS) + f32(tq + tk))
        else:
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
        if cfg.dsheld == "hilo" and not cfg.exact:
            # the chain's state held between chunks as bf16 hi / lo planes (a fused
            # reverse pass keeping dS' in shared memory): 16 significant bits
            hi = to_bf16(dS_new)
            dS_new = to_f32(hi + to_bf16(to_f32(dS_new) - hi))
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


# --------------------------------------------------------------------------- experiments
def run(cases, configs, seeds, T=None, H=None):
    """{(case, config name): {grad: worst rel over heads and seeds}}."""
    res = {}
    for case in cases:
        for seed in seeds:
            inp = draw(case, seed, T, H)
            ref = library_reference(inp)
            for cfg in configs:
                out = model(inp, cfg)
                r = res.setdefault((case, cfg.name), {n: 0.0 for n in GRADS})
                for n in GRADS:
                    r[n] = max(r[n], rel_worst(out[n], ref[n], n))
    return res


def fmt(x, lim=None):
    s = "%.1e" % x if np.isfinite(x) else "inf"
    return s + ("!" if lim is not None and x > lim else "")


def table(res, cases, names, title, notes=None):
    lines = ["", "### " + title, ""]
    if notes:
        lines += [notes, ""]
    for case in cases:
        lines += ["**%s** (%s, T = %d, %d value heads)" % (case, CASES[case][0], CASES[case][1], CASES[case][2]), ""]
        lines.append("| config | " + " | ".join(GRADS) + " |")
        lines.append("|---|" + "---|" * len(GRADS))
        for nm in names:
            r = res[(case, nm)]
            lines.append("| %s | " % nm + " | ".join(fmt(r[n], LIMIT[n]) for n in GRADS) + " |")
        lines.append("")
    return lines


# The recommendation (the docstring says why): pass 1's chain products and pass 2's
# reverse-chain products (K dS', dY = T~^T dU, the dS update) with bf16 hi/lo split operands
# (fp32 accuracy; 2 bf16 products where the other operand is a bf16 input), every other
# pass 2 product with plain bf16 operands; S_c stored bf16.
X3 = "bf16x3"
REC_PASS1 = {p: X3 for p in PASS1}
RECOMMENDED = {p: "bf16" for p in PRODUCTS}
RECOMMENDED.update({"KdS": X3, "dY": X3, "dS": X3})
CHAIN_TF32 = dict(RECOMMENDED, KdS="tf32", dY="tf32", dS="tf32")


def rec(name, **kw):
    args = dict(pass1=REC_PASS1, state="bf16", prec=RECOMMENDED)
    args.update(kw)
    return Config(name, **args)


def storage_configs():
    cs = [rec("S_c %s" % st, state=st) for st in ("fp32", "bf16", "fp16")]
    cs += [rec("S_c %s, pass 2 products fp32" % st, state=st, prec="fp32") for st in ("fp32", "bf16", "fp16")]
    cs += [rec("S_c %s, pass 1 bf16 (the forward's chain)" % st, state=st, pass1="bf16") for st in ("fp32", "bf16")]
    cs.append(Config("floor: fp32 everywhere (bf16 inputs, bf16 dq/dk/dv out)", pass1="fp32", state="fp32",
                     prec="fp32"))
    return cs


def precision_configs():
    cs = [rec("pass 2 all fp32", prec="fp32"), rec("pass 2 all tf32", prec="tf32"),
          rec("pass 2 all bf16x3 (split)", prec=X3), rec("pass 2 all bf16", prec="bf16")]
    for p in PRODUCTS:
        cs.append(rec("bf16 only in %s (rest split)" % p, prec=dict({q: X3 for q in PRODUCTS}, **{p: "bf16"})))
    cs.append(rec("RECOMMENDED (split KdS, dY, dS; rest bf16)"))
    cs.append(rec("recommended, chain products tf32 instead of split", prec=CHAIN_TF32))
    cs.append(rec("recommended, T~ stored bf16", tt="bf16"))
    cs.append(rec("recommended, X stored bf16", x="store:bf16"))
    cs.append(rec("recommended, pass 1 tf32", pass1="tf32"))
    cs.append(rec("recommended, pass 1 bf16 (the forward's chain)", pass1="bf16"))
    cs.append(rec("recommended, pass 1 split KS, KU only", pass1={"KS": X3, "KU": X3, "AX": "bf16"}))
    cs.append(rec("recommended, pass 1 split AX, KU only", pass1={"AX": X3, "KU": X3, "KS": "bf16"}))
    cs.append(Config("all bf16 (FLA-like: bf16 chain, bf16 h, bf16 products)", pass1="bf16", state="bf16",
                     prec="bf16"))
    return cs


def dg_configs():
    cs = []
    for form in ("terms", "cumsum"):
        cs.append(Config("%s, fp64 throughout" % form, exact=True, dg=form))
        cs.append(Config("%s, fp32 (S_c fp32, products fp32)" % form, pass1="fp32", state="fp32", prec="fp32",
                         dg=form))
        cs.append(rec("%s, recommended (S_c bf16)" % form, dg=form))
        cs.append(Config("%s, all bf16" % form, pass1="bf16", state="bf16", prec="bf16", dg=form))
    return cs


def length_configs():
    return [Config("all bf16 (pass 1 = forward chain, plain bf16 products)", pass1="bf16", prec="bf16"),
            rec("pass 1 bf16, pass 2 recommended", pass1="bf16"),
            rec("recommended")]


def length_sweep(seeds):
    cs = length_configs()
    lines = ["", "### 5. Growth with the sequence length (1 value head): which tier each input needs", "",
             "| case | T | config | " + " | ".join(GRADS) + " |", "|---|---|---|" + "---|" * len(GRADS)]
    for case in ("neg_eig", "nodecay"):
        for T in (130, 512, 2048, 4096):
            res = run([case], cs, seeds, T=T, H=1)
            for c in cs:
                r = res[(case, c.name)]
                lines.append("| %s | %d | %s | " % (case, T, c.name) + " | ".join(fmt(r[n], LIMIT[n]) for n in GRADS)
                             + " |")
    return lines


def short_configs():
    """What a few-token sequence needs: its gradients are single sums whose terms cancel
    (e.g. dg_0 = e_0 de_0 + e_C <S, dS'>), so the per-(sequence, head) error is the rounding
    of the terms over their cancelled sum."""
    split = {p: X3 for p in PRODUCTS}
    cs = [Config("fp32 everywhere (S_c fp32, products fp32)", pass1="fp32", state="fp32", prec="fp32"),
          rec("S_c fp32, pass 2 all split", state="fp32", prec=split),
          rec("S_c bf16, pass 2 all split", prec=split),
          rec("S_c fp32, pass 2 all tf32", state="fp32", prec="tf32"),
          rec("S_c fp32, recommended", state="fp32"),
          rec("recommended (S_c bf16)")]
    for p in PRODUCTS:
        cs.append(rec("S_c fp32, bf16 only in %s (rest split)" % p, state="fp32",
                      prec=dict(split, **{p: "bf16"})))
    return cs


def short_sweep(seeds):
    """Sequences of 1, 2, 5 and 64 tokens (benchmark inputs, 4 value heads, h0 and dht
    randn): worst over heads and seeds. More seeds than elsewhere: a single token's error
    depends on how much its terms cancel, which varies from draw to draw."""
    cs = short_configs()
    seeds = list(range(max(len(seeds), 1) * 10))
    lines = ["", "### 6. Few-token sequences (bench inputs, 4 value heads, %d seeds): what a one-token "
             "gradient needs" % len(seeds), "",
             "| T | config | " + " | ".join(GRADS) + " |", "|---|---|" + "---|" * len(GRADS)]
    for T in (1, 2, 5, 64):
        res = run(["bench"], cs, seeds, T=T, H=4)
        for c in cs:
            r = res[("bench", c.name)]
            lines.append("| %d | %s | " % (T, c.name) + " | ".join(fmt(r[n], LIMIT[n]) for n in GRADS) + " |")
    return lines


def tail_sweep(lengths=((64, 1000), (128, 600), (512, 100))):
    """dg's spread over many draws on short sequences, where the lean products run a
    sequence's only (or first) full chunk with S_c in fp32 (the GPU's rule,
    bwd_state_bf16): per (draw, value head) rel, its median, 99th percentile and maximum,
    and how many draws pass dg's threshold. A check near its threshold shows here as a
    tail before it shows as a flaky test (docs/history/2026-12-06-bwdprefetch.md, 6)."""
    split = {p: X3 for p in PRODUCTS}
    cs = [rec("lean (S_c fp32, recommended)", state="fp32"), rec("split (S_c fp32, pass 2 all split)", state="fp32",
                                                                  prec=split),
          rec("lean, S_c bf16 past the first chunk (the GPU's storage)", state="gpu")]
    H = 4
    lines = ["", "### 10. dg's tail on short sequences (bench inputs, 4 value heads, per (draw, head))", "",
             "| T | draws | config | median | p99 | max | over 2e-2 |", "|---|---|---|---|---|---|---|"]
    for T, n in lengths:
        vals = {c.name: [] for c in cs}
        for seed in range(n):
            inp = draw("bench", 10000 + seed, T, H)
            ref = library_reference(inp)
            for c in cs:
                out = model(inp, c)
                for h in range(H):
                    a, b = out["dg"][:, h], ref["dg"][:, h]
                    vals[c.name].append(np.linalg.norm(a - b) / np.linalg.norm(b))
        for c in cs:
            v = np.array(vals[c.name])
            lines.append("| %d | %d | %s | %.1e | %.1e | %s | %d |" % (T, len(v), c.name, np.median(v), np.quantile(v, 0.99),
                                                               fmt(v.max(), LIMIT["dg"]), int((v > LIMIT["dg"]).sum())))
    return lines


def case_table(title, cs, plan):
    """A markdown table of every config of cs on each (case, T, heads, seeds) of plan."""
    lines = ["", title, "", "| case | T | config | " + " | ".join(GRADS) + " |", "|---|---|---|" + "---|" * len(GRADS)]
    for case, T, H, sd in plan:
        res = run([case], cs, sd, T=T, H=H)
        for c in cs:
            r = res[(case, c.name)]
            lines.append("| %s | %d | %s | " % (case, T, c.name) + " | ".join(fmt(r[n], LIMIT[n]) for n in GRADS)
                         + " |")
    return lines


def fold_sweep(seeds):
    """The reverse chain in FlashQLA's folded form (Config dsform) against today's, every pass 2
    product split and the states fp32 (the GPU kernels' precision): few-token sequences on the
    bench inputs, and the long sequences where a chain's rounding is carried furthest
    (g = 0, beta near 2)."""
    split = {p: X3 for p in PRODUCTS}
    cs = [rec("direct (today's chain)", state="fp32", prec=split),
          rec("folded (FlashQLA's form)", state="fp32", prec=split, dsform="folded")]
    many = list(range(max(len(seeds), 1) * 10))
    return case_table("### 7. The reverse chain folded: two dependent products a chunk instead of three", cs,
                      [("bench", 1, 4, many), ("bench", 2, 4, many), ("bench", 5, 4, many),
                       ("bench", 64, 4, many), ("bench", 1024, 4, seeds), ("strong", 3000, 1, seeds),
                       ("neg_eig", 2048, 1, seeds), ("nodecay", 4096, 1, seeds)])


def mild_sweep(seeds):
    """The chains' mild chunks (tried on the GPU, not merged: docs/history/2026-12-06-bwdbytes.md):
    where every row has beta ||k||^2 in [0, 1], the state chain (pass 1) runs plain bf16 and so
    do the reverse chain's dU and dS update; K dS' and dY stay split, and the gradient products
    are the GPU's lean ones. Against today's chains (every chain product split), on the inputs
    the flag admits (sigmoid beta, unit keys): few chunks under the strong decay, where the
    precision matters most, to the longest sequences. Rows "plain ..." show what the flag
    keeps split, and why."""
    def plain(**split):
        d = {p: "bf16" for p in PRODUCTS}
        d.update({k: X3 for k in split})
        return d
    cs = [Config("split chains (S_c fp32; K dS', dU, dY, dS split)", pass1=REC_PASS1, state="fp32",
                 prec=plain(KdS=1, dU=1, dY=1, dS=1)),
          Config("mild (pass 1 bf16, S_c fp32; K dS', dY split)", pass1="bf16", state="fp32",
                 prec=plain(KdS=1, dY=1)),
          Config("plain chains: pass 1 split, every pass 2 product bf16", pass1=REC_PASS1, prec=plain()),
          Config("plain chains + dY split", pass1=REC_PASS1, prec=plain(dY=1)),
          Config("plain chains + K dS' split", pass1=REC_PASS1, prec=plain(KdS=1))]
    many = list(range(max(len(seeds), 1) * 5))
    return case_table("### 8. The chains' mild chunks: plain bf16 where beta ||k||^2 <= 1", cs,
                      [("strong", 64, 4, many), ("strong", 128, 2, many), ("strong", 512, 2, many),
                       ("strong", 3000, 1, seeds), ("bench", 64, 4, many), ("bench", 128, 4, many),
                       ("bench", 1024, 4, seeds), ("bench", 8192, 2, seeds[:1]),
                       ("nodecay", 4096, 1, seeds), ("nodecay", 32768, 1, seeds[:1])])


def gpu_mix_tables(title, configs, short_plan, long_plan):
    """Two case tables of the configs that configs(base) makes from the GPU's product mix:
    short sequences (at most four chunks) with every gradient product split, longer ones
    with the lean mix (K dS', dY split; the chain's dU split too)."""
    split = {p: X3 for p in PRODUCTS}
    lean = dict(RECOMMENDED, dU=X3)
    return (case_table(title + ": short sequences (gradient products split)", configs(split), short_plan)
            + case_table(title + ": longer sequences (lean gradient products)", configs(lean), long_plan))


def gpu_config(name, prec, **kw):
    """The chains' split pass 1 and the GPU's state storage, with the given products."""
    return Config(name, pass1=REC_PASS1, state="gpu", prec=prec, **kw)


def trim_sweep(seeds):
    """The reverse chain's products that need no split: today's GPU chains split every
    operand that is not exact in bf16 (P~ in dU = P~^T dO, and scale e dO in the update's
    Q^T (scale e dO) included). The states as the GPU stores them; the gradient products as
    the GPU runs them: every one split on sequences of at most four chunks, the lean mix
    on longer ones. The model has one dU for both passes, so "dU plain" also takes the
    gradient products' dU plain (on short sequences the GPU keeps that one split): a
    pessimistic stand-in for the chain's alone."""
    def configs(base):
        return [gpu_config("GPU chains (every chain product split)", base),
                gpu_config("dU plain", dict(base, dU="bf16")),
                gpu_config("dU plain, update's dO term plain", dict(base, dU="bf16"), dsq="bf16")]
    many = list(range(max(len(seeds), 1) * 10))
    return gpu_mix_tables("### 10. The reverse chain's products without a split", configs,
                          [("bench", 1, 4, many), ("bench", 2, 4, many), ("bench", 64, 4, many),
                           ("strong", 64, 4, many), ("neg_eig", 130, 1, many[:5])],
                          [("bench", 512, 4, many[:5]), ("strong", 512, 2, many[:5]), ("strong", 3000, 1, seeds),
                           ("bench", 1024, 4, seeds), ("neg_eig", 2048, 2, seeds), ("nodecay", 4096, 1, seeds)])


def held_sweep(seeds):
    """A fused reverse pass whose gradient warpgroups run the chain's update themselves, the
    chain's state dS' held in shared memory between chunks as bf16 hi / lo planes (the form
    the products read) instead of in fp32 registers: rounded to 16 significant bits once a
    chunk. The gradient products as the GPU runs them (split on sequences of at most four
    chunks, the lean mix on longer ones), the states stored as the GPU stores them, every
    chain product split."""
    def configs(base):
        return [gpu_config("dS' fp32 in registers (today)", base),
                gpu_config("dS' held as hi / lo planes", base, dsheld="hilo")]
    many = list(range(max(len(seeds), 1) * 10))
    return gpu_mix_tables("### 11. The reverse chain's state held as bf16 hi / lo planes", configs,
                          [("bench", 2, 4, many), ("bench", 64, 4, many), ("strong", 128, 2, many[:5]),
                           ("neg_eig", 130, 1, many[:5])],
                          [("bench", 1024, 4, seeds), ("strong", 3000, 1, seeds), ("neg_eig", 2048, 2, seeds),
                           ("neg_eig", 8192, 1, seeds), ("nodecay", 8192, 1, seeds),
                           ("nodecay", 32768, 1, seeds[:1])])


def xdy_sweep(seeds):
    """dbeta's x . dy with either operand rounded to bf16 (the recommended products otherwise):
    what a fused reverse pass may pass between its warpgroups as bf16 planes
    (docs/history/2026-12-06-bwdbytes.md, its shared-memory ledger)."""
    cs = [rec("x, dy fp32 (recommended)"), rec("dy bf16", xdy="dy"), rec("x bf16", xdy="x"),
          rec("both bf16", xdy="both")]
    many = list(range(max(len(seeds), 1) * 10))
    return case_table("### 9. dbeta's x . dy from bf16 planes", cs,
                      [("strong", 64, 4, many), ("strong", 128, 2, many), ("strong", 512, 2, many[:5]),
                       ("strong", 3000, 1, seeds), ("bench", 64, 4, many), ("bench", 1024, 4, seeds),
                       ("neg_eig", 2048, 2, seeds), ("nodecay", 4096, 1, seeds)])


# --------------------------------------------------------------------------- bytes and MACs
H200_BW = 4.2e12          # B/s, copy rate
H200_BF16 = 989.5e12 / 2  # MAC/s, dense bf16 tensor peak (tf32: half)
ANCHORS = [("hk16_hv32", 16, 32), ("hk8_hv16", 8, 16), ("hk4_hv8", 4, 8), ("hk2_hv4", 2, 4)]


def dense_macs(group):
    """Dense tensor-core MACs per chunk-head (value head) at C = 64, K = V = 128, of every
    product; q/k-head products shared by the GVA group are divided by it."""
    cc, ck, cv = C * C, C * KD, C * VD
    p1 = {"KS": ck * VD, "AX": cc * VD, "KU": ck * VD, "KK+inverse": cc * KD / group + 3 * 2 * C ** 3 / 4}
    p2 = {"X": ck * VD, "U": cc * VD, "KdS": ck * VD, "dU": cc * VD, "dP": cc * VD, "dT": cc * VD,
          "dY": cc * VD, "G2": 2 * cv * KD, "UdS": cv * KD, "dS": 2 * ck * VD, "dL": 2 * C ** 3,
          "dQK": 3 * cc * KD, "QK+KK+inverse": 2 * cc * KD / group + 3 * 2 * C ** 3 / 4}
    return p1, p2


def split_factor(mode, name):
    """bf16 products a split costs: 2 where one operand is a bf16 input (K, Q), else 3;
    tf32 counts as 2 (half the bf16 rate)."""
    if mode == X3:
        return 2 if name in ("KS", "KU", "KdS", "dS") else 3
    return 2 if mode == "tf32" else 1


def bytes_table():
    """Per chunk-head bytes and MACs of the storage / recompute choices; whole-problem times at
    the anchor shapes (K = V = 128, GVA group 2)."""
    group = 2
    bf, f4 = 2, 4
    io1 = C * KD * bf / group + C * VD * bf + 2 * C * f4                     # pass 1 reads k, v, g, beta
    io2 = (2 * C * KD * bf / group + 2 * C * VD * bf + 2 * C * f4            # pass 2 reads q, k, v, dO, g, beta
           + 2 * C * KD * bf / group + C * VD * bf + 2 * C * f4)             # writes dq, dk, dv, dg, dbeta
    p1, p2 = dense_macs(group)
    base1 = sum(p1.values())
    base2 = sum(p2.values())
    rec1 = sum(m * split_factor(REC_PASS1.get(n, "bf16"), n) for n, m in p1.items())
    rec2 = sum(m * split_factor(RECOMMENDED.get(n, "bf16"), n) for n, m in p2.items())
    SK = KD * VD
    Tp = 5 * C * C // 8  # packed lower strips
    chain1 = sum(p1[n] * split_factor(REC_PASS1[n], n) for n in PASS1)  # pass 1's chain products
    opts = [
        # name, bytes stored by pass 1 and read by pass 2 (w + r), workspace bytes, MAC change
        ("S_c bf16 (recommended)", 2 * SK * bf, SK * bf, 0),
        ("S_c fp16", 2 * SK * bf, SK * bf, 0),
        ("S_c fp32", 2 * SK * f4, SK * f4, 0),
        ("S_c bf16 every 2nd chunk; pass 2 reruns the chain for the other", SK * bf, SK * bf / 2, 0.5 * chain1),
        ("S_c bf16 + X bf16 (skip X = V - e K S in pass 2)", 2 * (SK + C * VD) * bf, (SK + C * VD) * bf,
         -p2["X"]),
        ("S_c bf16 + X fp32", 2 * SK * bf + 2 * C * VD * f4, SK * bf + C * VD * f4, -p2["X"]),
        ("S_c bf16 + T~ fp32 packed (skip KK^T + inverse in pass 2)", 2 * SK * bf + 2 * Tp * f4,
         SK * bf + Tp * f4, -p2["QK+KK+inverse"] + C * C * KD / group),
        ("S_c bf16 + T~ read again from pass 1's prepare output", 2 * SK * bf + Tp * f4, SK * bf + Tp * f4,
         -p2["QK+KK+inverse"] + C * C * KD / group),
        ("forward writes S_c bf16, no pass 1 (bf16 forward chain: fails neg_eig, table 2)", 2 * SK * bf, SK * bf,
         -rec1),
    ]
    lines = ["", "### 4. Bytes and MACs per chunk-head (C = 64, K = V = 128, GVA group 2)", "",
             "Fixed traffic (every option): pass 1 reads k, v, g, beta = %.1f KiB; pass 2 reads q, k, v, dO, g, beta "
             "and writes dq, dk (bf16, group-reduced in the cluster), dv, dg, dbeta = %.1f KiB. Dense tensor MACs "
             "(bf16-equivalent): pass 1 %.2f M plain / %.2f M recommended (split chain), pass 2 %.2f M plain bf16 / "
             "%.2f M recommended (split KdS, dY, dS). H200: %.1f TB/s copy, %.0f TMAC/s dense bf16 (peak); "
             "one chunk-head = %.1f ns of the whole GPU per 100 KiB moved, %.1f ns per 1 M MAC."
             % (io1 / 1024, io2 / 1024, base1 / 1e6, rec1 / 1e6, base2 / 1e6, rec2 / 1e6, H200_BW / 1e12,
                H200_BF16 / 1e12, 102400 / H200_BW * 1e9, 1e6 / H200_BF16 * 1e9), "",
             "| option | stored KiB (w + r) | total KiB moved | M MAC (recommended precisions) | ns at 4.2 TB/s | "
             "ns at bf16 peak | hk16_hv32 32k: ms bytes / ms MAC | hk2_hv4 8k: ms bytes / ms MAC | workspace at "
             "hk16_hv32 32k |",
             "|---|---|---|---|---|---|---|---|---|"]
    KiB = 1024.0
    for name, extra, ws, dmac in opts:
        moved = extra + io2 + (0 if name.startswith("forward") else io1)
        mac = rec1 + rec2 + dmac
        cells = []
        for tag, hk, hv, tok in (("hk16_hv32", 16, 32, 32768), ("hk2_hv4", 2, 4, 8192)):
            ch = tok // C * hv
            cells.append("%.3f / %.3f" % (ch * moved / H200_BW * 1e3, ch * mac / H200_BF16 * 1e3))
        ch = 32768 // C * 32
        lines.append("| %s | %.0f | %.0f | %.2f | %.1f | %.1f | %s | %s | %.0f MiB |" % (
            name, extra / KiB, moved / KiB, mac / 1e6, moved / H200_BW * 1e9, mac / H200_BF16 * 1e9,
            cells[0], cells[1], ch * ws / KiB ** 2))
    lines += ["", "MAC breakdown per chunk-head (dense, bf16-equivalent before splits):", "",
              "| pass | product | M MAC | split factor (recommended) |", "|---|---|---|---|"]
    for nm, d, recd in (("1", p1, REC_PASS1), ("2", p2, RECOMMENDED)):
        for n, m in d.items():
            lines.append("| %s | %s | %.3f | %d |" % (nm, n, m / 1e6, split_factor(recd.get(n, "bf16"), n)))
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--only", default="storage,precision,dg,bytes,length,short")
    ap.add_argument("--markdown", default=None, help="also write the output to this file")
    ap.add_argument("--tail-lengths", default="64:1000,128:600,512:100",
                    help="tail: the sequence lengths T and draws n, as T:n,...")
    a = ap.parse_args()
    seeds = list(range(a.seeds))
    only = a.only.split(",")
    t0 = time.time()
    lines = []

    def emit(ls):
        for x in ls:
            print(x, flush=True)
        lines.extend(ls)

    emit(["# bwd-model: precision and storage of a chunked GDN backward (C = 64, K = V = 128)", "",
          "Generated by `PYTHONPATH=python FLASHQLA_LIB=build/libflashqla.so python3 dev/models/bwd_chunked.py%s`"
          " on %s UTC (numpy %s; seeds %s). Metric: docs/testing.md's rel = ||x - ref|| / ||ref|| against the "
          "library's fp64 reference backward, worst over value heads and seeds; `!` marks a value over the "
          "threshold (dq, dk, dv, dh0 8e-3; dg, dbeta 2e-2)."
          % ("" if len(sys.argv) == 1 else " " + " ".join(sys.argv[1:]),
             datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M"), np.__version__, seeds)])
    # self-check: the exact model is the reference
    inp = draw("bench", 99, 200, 2)
    ref = library_reference(inp)
    out = model(inp, Config("exact", exact=True))
    err = max(rel_worst(out[n], ref[n], n) for n in GRADS)
    emit(["", "Self-check: the model with every rounding off against the library's reference: worst rel %.1e "
          "(T = 200, 2 heads)." % err])
    if err > 1e-10:
        print("self-check failed", file=sys.stderr)
        sys.exit(1)
    cases = list(CASES)
    if "storage" in only:
        cs = storage_configs()
        emit(table(run(cases, cs, seeds), cases, [c.name for c in cs], "1. Storage of the per-chunk states S_c",
                   "Pass 1 and pass 2 at the recommended precisions unless the row says otherwise."))
    if "precision" in only:
        cs = precision_configs()
        emit(table(run(cases, cs, seeds), cases, [c.name for c in cs],
                   "2. Operand precision of the products (S_c bf16, fp32 accumulate)",
                   "Pass 1 split (bf16 hi/lo) unless the row says otherwise. `bf16 only in P (rest split)`: "
                   "product P with plain bf16 operands, every other pass 2 product split. Products: "
                   + "; ".join("%s: %s" % kv for kv in PRODUCT_WHAT.items()) + "."))
    if "dg" in only:
        cs = dg_configs()
        emit(table(run(["strong", "bench"], cs, seeds), ["strong", "bench"], [c.name for c in cs],
                   "3. dg: per-term products vs difference of cumulative sums",
                   "terms: chunked_bwd.c's assembly (every term contains g_t's decay), fp32 on the GPU; "
                   "cumsum: d(gamma_i) = (terms with e^+gamma_i) - (terms with e^-gamma_i), each side an fp32 "
                   "sum holding the O(1) diagonal terms, then a reverse fp32 cumulative sum (FLA's form)."))
    if "bytes" in only:
        emit(bytes_table())
    if "length" in only:
        emit(length_sweep(seeds))
    if "short" in only:
        emit(short_sweep(seeds))
    if "fold" in only:
        emit(fold_sweep(seeds))
    if "mild" in only:
        emit(mild_sweep(seeds))
    if "xdy" in only:
        emit(xdy_sweep(seeds))
    if "trim" in only:
        emit(trim_sweep(seeds))
    if "held" in only:
        emit(held_sweep(seeds))
    if "tail" in only:
        emit(tail_sweep(tuple(tuple(int(x) for x in t.split(":")) for t in a.tail_lengths.split(","))))
    emit(["", "(%.0f s)" % (time.time() - t0)])
    if a.markdown:
        with open(a.markdown, "w") as fh:
            fh.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
