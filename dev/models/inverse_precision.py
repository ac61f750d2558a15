#!/usr/bin/env python3
"""End-to-end precision of the chunked forward's triangular inverse (numpy, CPU only).

What it is
    A numpy emulation of the CUDA forward's roundings (src/cuda/fwd_prepare.cu,
    fwd_chain.cuh) for one Gated DeltaNet forward (docs/design.md §2, C = 64, K = V = 128),
    run with seven ways of forming the chunk inverse, each measured end to end against
    the fp64 token-by-token recurrence (docs/design.md §1) on the same bf16-rounded inputs.
    The metric is docs/testing.md's: rel(x) = ||x - ref||_2 / ||ref||_2 in fp64 per
    (sequence, value head), worst reported, for o and for the final state.

How to run
    python3 dev/models/inverse_precision.py                 # every case, 3 seeds
    python3 dev/models/inverse_precision.py --seeds 1 --cases default,strong
    python3 dev/models/inverse_precision.py --markdown out.md  # also write the table
    (numpy only; about 2 minutes on 2 cores for the full run.)
    Before the cases run, a self-check runs the variant-1 chunked emulation with every
    rounding switched off and requires it to match the fp64 recurrence to 1e-10
    (it exits with status 1 otherwise).

Roundings emulated (products are formed in float64 from already-rounded operands and
the accumulated result is rounded to fp32: a model of fp32 accumulation; bf16 and fp16
are round-to-nearest-even):
    inputs      q, k, v drawn in float64 and rounded to bf16; g, beta, h0 fp32 (the in-kernel
                gate and beta sigmoid are evaluated in fp64 and rounded to fp32 once, shared
                by the reference and the emulation: their own fp32 rounding is not modelled).
    prepare     gamma = fp32 inclusive cumsum of g per chunk; Gamma = fp32(exp(gamma_i - gamma_j));
                KK = fp32(K K^T) (times rk_i rk_j in fp32 with the in-kernel l2norm);
                M = StrictLower(diag(beta) KK); Ar by the variant; Ag = bf16(Gamma (.) Ar diag(beta));
                Pg = bf16(scale Gamma (.) tril(Q K^T)) (times rq_i rk_j with l2norm).
    chain       per chunk, S fp32: Sb = bf16(S); U = fp32(K Sb); Qs = fp32(Q Sb);
                Vd = fp32(fp32(Ag V) + Ag bf16(-diag(u) U)), u_t = e^gamma_t rk_t;
                P = fp32(Pg bf16(Vd)); o_t = bf16(fo_t Qs_t + P_t), fo_t = scale rq_t e^gamma_t;
                S = fp32(fp32(e^gamma_C S) + K^T bf16(diag(d) Vd)), d_t = e^(gamma_C - gamma_t) rk_t.
                (--chain w_once: Vd = fp32(Ag bf16(V - diag(u) U)), W rounded once, as the
                fused kernel's G1 + G4 experiment of a8c147b and the mma.sync chunk kernel.)
    l2norm      rq, rk = fp32(1 / sqrt(fp32(sum x^2) + 1e-6)) from the stored bf16 rows (the
                reference normalises the same bf16 rows in fp64).

Inverse variants (only Ar changes; the chain above is the same for 1-6 and 8):
    1 exact      Ar in float64 (forward substitution), then the bf16 Ag rounding: the
                 chain's own error floor.
    1b           diagnostic, not a kernel: variant 1 with Ag left in fp32 (no bf16 rounding
                 of Ag; the chain's other roundings kept): the share of the Ag rounding.
    2 ours       fwd_prepare.cu: 16x16 diagonal blocks by fp32 forward substitution (the
                 kernel's right-looking FMA order), then doubling 16 -> 32 -> 64 in the
                 kernel's three levels, every 16x16 block product as m16n8k8 tf32 mma in the
                 3xTF32 split (small*big, big*small, big*big, fp32 accumulate per mma).
                 The split follows the code (fqla_tf32_split3): big = x with its 13 low bits
                 cleared (truncation, not cvt.rna), small = x - big, and the mma reads small's
                 top 10 mantissa bits (truncation assumed).
    3 tf32       the same with plain tf32 merges (one mma per product, operands
                 cvt.rna.tf32: round to nearest, ties away): tuning variant 2.
    4 fp16 free  FlashInfer's algorithm on OUR gate-free matrix: M rounded to fp16, 8x8
                 diagonal blocks by row elimination in fp32 (its FMA order) stored fp16, then
                 doubling 8 -> 16 -> 32 -> 64 as X21 = fp16(fp16(-X22 M21) X11) with fp16
                 operands and fp32 accumulate (the 32 -> 64 step as FlashInfer splits it: two
                 fp16 partial products added in fp16); Ag = bf16(Gamma (.) X diag(beta)).
    5 fp16 gated FlashInfer's actual form: the same algorithm on
                 I + StrictLower(diag(beta) (Gamma (.) KK)) in fp16, which yields Gamma (.) Ar
                 directly; Ag = bf16(X diag(beta)).
    6 3xbf16     our structure (16x16 fp32 diagonal blocks, the same three levels) with the
                 block products as m16n8k16 bf16 mma in a 3xBF16 split (hi = bf16(x),
                 lo = bf16(x - hi); lo*hi, hi*lo, hi*hi, fp32 accumulate).
    7 FLA bf16   the "straightforward same-precision implementation" of docs/testing.md's 2x rule,
                 an FLA-style chunked forward (its own chain, not the one above): fp32 math,
                 intermediates stored bf16. With l2norm q, k are normalised and stored bf16
                 first (FLA's l2norm_fwd). A = bf16((I + StrictLower(diag(beta) Gamma (.) K K^T))^-1
                 diag(beta)) with the inverse itself exact then rounded to fp32 (KK fp32; at
                 least as precise as FLA's solve_tril, whatever its dot precision); w = bf16(A bf16(diag(e^gamma) K)); u = bf16(A V); per chunk the state
                 is stored h = bf16(S); v_new = u - w h in fp32, stored bf16;
                 o = bf16(scale (e^gamma (.) fp32(Q h) + fp32(bf16(Gamma (.) tril(Q K^T)) v_new)));
                 S = fp32(e^gamma_C S + K^T bf16(diag(e^(gamma_C - gamma)) v_new_fp32)) (FLA
                 updates the state from the fp32 v_new, the output reads the bf16 copy).
    8 fp16       issue 42's next split: the 16x16 diagonal blocks as in 2, then the merges as
      block-     four 64x64x64 fp16 products (wgmma, fp32 accumulate per k-step of 16):
      Neumann    N = D StrictBlockLower(M), X = (I - N + N^2 - N^3) D, with N, N^2, N^3 and
                 the sum stored fp16 (inverse_neumann_fp16).
    9 fp16 on    issue 42's mode 17: the whole gate-free inverse on tensor cores in fp16
      tensor     (inverse_wgmma_fp16).
      cores
    10 gated,    issue 42's mode 25 on the gated system (the form a one-kernel forward runs
       mode 25   on every chunk): fp32 diagonal blocks by substitution, fp16 merges as in 9,
                 Ag = bf16(X diag(beta)) (inverse_mode25).

Reported per case and variant (worst over sequences x value heads x seeds): rel(o),
rel(final state), the ratio of each to variant 7's, the inverse's own error (worst over
chunks of ||G - G_exact||_F / ||G_exact||_F, G = Gamma (.) X diag(beta) before the bf16
rounding, G_exact the fp64 one), max |X| over the stored inverse's entries below the
diagonal (the diagonal is 1; X is the gate-free Ar, or Gamma (.) Ar for variant 5 and
for variant 7's A before beta; finite entries only), and the count of non-finite values
in the inverse and in o and the state. Variant 7's "inverse err" is against the same
G_exact, so with l2norm it also contains its bf16 storage of the normalised keys.

Cases (K = V = 128; draws as tests/test_gpu_fwd.c's draw(): unit q/k rows unless l2norm,
v ~ N(0,1), h0 ~ N(0,1) fp32, default gate -log1p(e^-x)/16 (1 + hv % 3) with every fourth
head undecayed, beta sigmoid(N(0,1))): see CASES. After them: a length sweep of the
no-decay case (exact, ours, FLA) and a table of max |Ar| against the key norm (where the
gate-free inverse overflows fp16 and fp32).

Emulation limits: the tensor cores' internal accumulation is modelled as one fp32 rounding
per mma instruction (hardware aligns and truncates differently); exp/ex2 and rsqrt are
exact-then-rounded, not the approximate SFU results; the chain's product order inside a
wgmma is not modelled. These move the chain's floor somewhat and equally for every
inverse variant (for scale: docs/history/perf-log.md reports ~4.4e-3 measured on the H200 for the
no-decay T = 130 GPU test; this model gives ~4.0e-3 for that setting, other seeds).
"""
import argparse
import datetime
import math
import os
import platform
import sys
import time

# small batched products: one BLAS thread is as fast and does not fight other processes
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
import numpy as np  # noqa: E402

C = 64          # chunk length
HEAD_DIM = 128  # K = V

# --------------------------------------------------------------------------- roundings
# Every array below is float64 holding values representable in the named format.


def to_f32(x):
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(x, np.float64).astype(np.float32).astype(np.float64)


def to_bf16(x):
    """fp64 -> fp32 -> bf16, round to nearest even (inf stays inf, overflow rounds to inf)."""
    with np.errstate(over="ignore", invalid="ignore"):
        u = np.asarray(x, np.float64).astype(np.float32).view(np.uint32)
    u = (u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) & np.uint32(0xFFFF0000)
    return u.view(np.float32).astype(np.float64)


def to_fp16(x):
    """fp64 -> fp32 -> fp16, round to nearest even, with subnormals; above 65504 -> inf."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.asarray(x, np.float64).astype(np.float32).astype(np.float16).astype(np.float64)


def tf32_truncate(x):
    """The low 13 bits of the fp32 pattern cleared (fqla_tf32_split3's big part)."""
    with np.errstate(over="ignore", invalid="ignore"):
        u = np.asarray(x, np.float64).astype(np.float32).view(np.uint32)
    return (u & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)


def tf32_round_away(x):
    """cvt.rna.tf32.f32: round to 10 explicit mantissa bits, ties away from zero."""
    with np.errstate(over="ignore", invalid="ignore"):
        u = np.asarray(x, np.float64).astype(np.float32).view(np.uint32)
    return ((u + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64)


class KernelRounding:
    """The GPU kernel's roundings."""
    exact = False
    f32 = staticmethod(to_f32)
    bf16 = staticmethod(to_bf16)

    @staticmethod
    def cumsum(g):
        return np.cumsum(g.astype(np.float32), axis=-1, dtype=np.float32).astype(np.float64)


class NoRounding:
    """Everything in float64: the chunked algorithm's exact arithmetic (self-check)."""
    exact = True

    @staticmethod
    def f32(x):
        return np.asarray(x, np.float64)

    bf16 = f32

    @staticmethod
    def cumsum(g):
        return np.cumsum(g, axis=-1)


def mm(a, b):
    """a @ b in float64 (batched); the inputs are the rounded operands."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.matmul(a, b)


def mma_acc(acc, a, b):
    """One tensor-core instruction: acc + a b, accumulated and rounded to fp32."""
    with np.errstate(over="ignore", invalid="ignore"):
        return to_f32(acc + np.matmul(a, b))


# --------------------------------------------------------------------------- inverses
def block(m, i, j, n):
    return m[..., n * i:n * (i + 1), n * j:n * (j + 1)]


def strict_lower(m):
    return np.tril(m, -1)


def inverse_exact(M):
    """(I + M)^-1 for strictly lower M [..., 64, 64] by row-wise forward substitution in fp64."""
    n = M.shape[-1]
    X = np.broadcast_to(np.eye(n), M.shape).copy()
    with np.errstate(over="ignore", invalid="ignore"):
        for i in range(1, n):
            X[..., i, :i] = -np.einsum("...k,...kj->...j", M[..., i, :i], X[..., :i, :i])
    return X


def diagonal_blocks_fp32(KK, beta):
    """fwd_prepare.cu step 4a: the four 16x16 diagonal blocks of (I + diag(beta) StrictLower(KK))^-1
    by right-looking forward substitution in fp32 (one column per lane):
        x_i = (i == j) - beta_i acc_i;  acc_r += KK_ri x_i for r > i   (each an FMA)."""
    lead = KK.shape[:-2]
    KKb = np.stack([block(KK, b, b, 16) for b in range(4)], axis=-3)          # [..., 4, 16, 16]
    bb = np.stack([beta[..., 16 * b:16 * b + 16] for b in range(4)], axis=-2)  # [..., 4, 16]
    acc = np.zeros(lead + (4, 16, 16))  # [..., blk, row r, column j]
    x = np.zeros(lead + (4, 16, 16))
    eye = np.eye(16)
    with np.errstate(over="ignore", invalid="ignore"):
        for i in range(16):
            x[..., i, :] = to_f32(eye[i] - bb[..., i, None] * acc[..., i, :])
            if i + 1 < 16:
                acc[..., i + 1:, :] = to_f32(acc[..., i + 1:, :] + KKb[..., i + 1:, i, None] * x[..., i, None, :])
    X = np.zeros(lead + (C, C))
    for b in range(4):
        block(X, b, b, 16)[...] = x[..., b, :, :]
    return X


def product_3xtf32(acc, A, B):
    """mm16<3>: two k-steps of 8, each three m16n8k8 tf32 mma (small*big, big*small, big*big)."""
    for ks in range(2):
        a = A[..., :, 8 * ks:8 * ks + 8]
        b = B[..., 8 * ks:8 * ks + 8, :]
        a_big, b_big = tf32_truncate(a), tf32_truncate(b)
        a_small, b_small = tf32_truncate(to_f32(a - a_big)), tf32_truncate(to_f32(b - b_big))
        acc = mma_acc(acc, a_small, b_big)
        acc = mma_acc(acc, a_big, b_small)
        acc = mma_acc(acc, a_big, b_big)
    return acc


def product_tf32(acc, A, B):
    """mm16<1>: two k-steps of 8, one tf32 mma each (operands cvt.rna)."""
    for ks in range(2):
        acc = mma_acc(acc, tf32_round_away(A[..., :, 8 * ks:8 * ks + 8]), tf32_round_away(B[..., 8 * ks:8 * ks + 8, :]))
    return acc


def product_3xbf16(acc, A, B):
    """One k-step of 16 (m16n8k16 bf16 mma) in the 3xBF16 split: lo*hi, hi*lo, hi*hi."""
    a_hi, b_hi = to_bf16(A), to_bf16(B)
    a_lo, b_lo = to_bf16(to_f32(A - a_hi)), to_bf16(to_f32(B - b_hi))
    acc = mma_acc(acc, a_lo, b_hi)
    acc = mma_acc(acc, a_hi, b_lo)
    return mma_acc(acc, a_hi, b_hi)


def doubling_ours(KK, beta, X, product):
    """fwd_prepare.cu step 4b: the off-diagonal 16x16 blocks in three levels (fp32 storage):
        1. X10 = -X11 (beta1 (KK10 X00)), X32 = -X33 (beta3 (KK32 X22));
           P_i1 = KK_i1 X11, P_i0 = KK_i0 X00 (i = 2, 3);
        2. T_i0 = beta_i (P_i0 + KK_i1 X10), T_i1 = beta_i P_i1;
        3. X2j = -X22 T2j, X3j = -(X32 T2j + X33 T3j)."""
    X = X.copy()
    z = np.zeros(X.shape[:-2] + (16, 16))

    def rows_beta(m, i):
        return to_f32(m * beta[..., 16 * i:16 * i + 16, None])

    for i, k in ((1, 0), (3, 2)):
        tmp = rows_beta(product(z, block(KK, i, k, 16), block(X, k, k, 16)), i)
        block(X, i, k, 16)[...] = -product(z, block(X, i, i, 16), tmp)
    T = {}
    for i in (2, 3):
        p1 = product(z, block(KK, i, 1, 16), block(X, 1, 1, 16))
        p0 = product(z, block(KK, i, 0, 16), block(X, 0, 0, 16))
        p0 = product(p0, block(KK, i, 1, 16), block(X, 1, 0, 16))
        T[i, 0], T[i, 1] = rows_beta(p0, i), rows_beta(p1, i)
    for j in (0, 1):
        block(X, 2, j, 16)[...] = -product(z, block(X, 2, 2, 16), T[2, j])
        acc = product(z, block(X, 3, 2, 16), T[2, j])
        block(X, 3, j, 16)[...] = -product(acc, block(X, 3, 3, 16), T[3, j])
    return X


def inverse_ours(KK, beta, product):
    return doubling_ours(KK, beta, diagonal_blocks_fp32(KK, beta), product)


def diagonal_8x8_fp16(L16):
    """FlashInfer compute_diagonal_inverse_NxN<8>: row y (one thread) starts as L[y, :] with 1 on
    the diagonal; for src row s < y: row[i] += (-L[y, s]) X[s, i] (FMA, fp32) for i < s,
    row[s] = -L[y, s]. Stored fp16."""
    lead = L16.shape[:-2]
    R = np.stack([block(L16, b, b, 8) for b in range(8)], axis=-3).copy()  # [..., 8, 8, 8]
    with np.errstate(over="ignore", invalid="ignore"):
        for s in range(7):
            scale = -R[..., s + 1:, s]                                  # rows y > s
            if s > 0:
                R[..., s + 1:, :s] = to_f32(R[..., s + 1:, :s] + scale[..., None] * R[..., s, None, :s])
            R[..., s + 1:, s] = scale
    R = to_fp16(R)
    X = np.zeros(lead + (C, C))
    for b in range(8):
        block(X, b, b, 8)[...] = np.tril(R[..., b, :, :], -1) + np.eye(8)
    return X


def neg_product_fp16(D, Cm, k_steps):
    """fp16(-(D Cm)): fp16 operands, fp32 accumulate per mma k-step (the first half of a merge
    X21 = fp16(fp16(-(X22 M21)) X11))."""
    step = D.shape[-1] // k_steps
    dc = np.zeros(D.shape[:-2] + (D.shape[-2], Cm.shape[-1]))
    for s in range(k_steps):
        dc = mma_acc(dc, D[..., :, step * s:step * (s + 1)], Cm[..., step * s:step * (s + 1), :])
    return to_fp16(-dc)


def inverse_fp16_flashinfer(L):
    """FlashInfer's CollectiveInverse<half> on (I + L)^-1, L strictly lower (fp32 values)."""
    L16 = to_fp16(L)
    X = diagonal_8x8_fp16(L16)
    z = lambda m, n: np.zeros(X.shape[:-2] + (m, n))
    # 8 -> 16: four 16-blocks; m16n8k8 (k = 8, one step per product)
    for b in range(4):
        Xb = X[..., 16 * b:16 * b + 16, 16 * b:16 * b + 16]
        Lb = L16[..., 16 * b:16 * b + 16, 16 * b:16 * b + 16]
        dc = neg_product_fp16(block(Xb, 1, 1, 8), block(Lb, 1, 0, 8), 1)
        block(Xb, 1, 0, 8)[...] = to_fp16(mma_acc(z(8, 8), dc, block(Xb, 0, 0, 8)))
    # 16 -> 32: two 32-blocks; m16n8k16 (k = 16, one step)
    for b in range(2):
        Xb = X[..., 32 * b:32 * b + 32, 32 * b:32 * b + 32]
        Lb = L16[..., 32 * b:32 * b + 32, 32 * b:32 * b + 32]
        dc = neg_product_fp16(block(Xb, 1, 1, 16), block(Lb, 1, 0, 16), 1)
        block(Xb, 1, 0, 16)[...] = to_fp16(mma_acc(z(16, 16), dc, block(Xb, 0, 0, 16)))
    # 32 -> 64: warp (x, y) forms DC_yx = fp16(-D[y rows, :] C[:, x cols]) (k = 32, two steps) and
    # fp16(DC_yx A[x rows, :]) (k = 16); the two x partials are added in fp16.
    D, Cm, A = block(X, 1, 1, 32), block(L16, 1, 0, 32), block(X, 0, 0, 32)
    out = np.zeros(X.shape[:-2] + (32, 32))
    for y in range(2):
        partial = []
        for x in range(2):
            dc = neg_product_fp16(D[..., 16 * y:16 * y + 16, :], Cm[..., :, 16 * x:16 * x + 16], 2)
            partial.append(to_fp16(mma_acc(z(16, 32), dc, A[..., 16 * x:16 * x + 16, :])))
        with np.errstate(over="ignore", invalid="ignore"):
            out[..., 16 * y:16 * y + 16, :] = to_fp16(partial[0] + partial[1])
    block(X, 1, 0, 32)[...] = out
    return X


# --------------------------------------------------------------------------- problem
class Case:
    def __init__(self, key, name, seqs, H, HV, keys="unit", gate="default", beta="sigmoid", neg_eig=False,
                 corr=0.0):
        self.key, self.name, self.seqs, self.H, self.HV = key, name, seqs, H, HV
        self.keys, self.gate, self.beta, self.neg_eig, self.corr = keys, gate, beta, neg_eig, corr

    @property
    def l2norm(self):
        return self.keys == "l2norm"


CASES = [
    Case("default", "default gates, beta sigmoid", [1000, 3096], 2, 4),
    Case("nodecay", "no decay, beta in {0, 1, 1.99}", [4096], 2, 4, gate="none", beta="set"),
    Case("strong", "strong decay g=-20", [1000, 3096], 2, 4, gate="strong"),
    Case("l2norm", "l2norm + gate + beta sigmoid", [4096], 2, 4, keys="l2norm", gate="in_kernel",
         beta="in_kernel"),
    Case("l2neg", "l2norm + gate + beta sigmoid, allow_neg_eigval", [1000, 3096], 2, 4, keys="l2norm",
         gate="in_kernel", beta="in_kernel", neg_eig=True),
    Case("spread", "decay strength spread 0..16 over heads", [4096], 4, 4, gate="spread"),
    Case("nonunit", "keys N(0,1/K), not normalised", [1000, 3096], 2, 4, keys="scaled"),
    Case("corr", "correlated unit keys (0.7), no decay, beta in {0, 1, 1.99}", [4096], 2, 4, gate="none",
         beta="set", corr=0.7),
    Case("raw_strong", "raw N(0,1) keys (unnormalised), strong decay", [1000], 2, 4, keys="raw", gate="strong"),
    Case("raw_g6", "raw N(0,1) keys (unnormalised), decay g=-6", [1000], 2, 4, keys="raw", gate="g6"),
]


def unit_rows(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def draw_inputs(case, rng):
    """Inputs as tests/test_gpu_fwd.c draws them (draw(), base_spec), per case; padded to whole
    chunks with zero rows (g = 0, beta = 0, k = q = v = 0), which leave the state unchanged."""
    B, H, HV, K = len(case.seqs), case.H, case.HV, HEAD_DIM
    Tpad = int(math.ceil(max(case.seqs) / C)) * C
    valid = np.zeros((B, Tpad), bool)
    for b, n in enumerate(case.seqs):
        valid[b, :n] = True
    q = rng.standard_normal((B, H, Tpad, K))
    k = rng.standard_normal((B, H, Tpad, K))
    if case.corr:
        base = rng.standard_normal((B, H, 1, K))
        k = case.corr * base + (1 - case.corr) * k
    if case.keys in ("unit",):
        q, k = unit_rows(q), unit_rows(k)
    elif case.keys == "scaled":
        q, k = q / math.sqrt(K), k / math.sqrt(K)
    # "l2norm" and "raw": N(0, 1) entries as drawn
    q, k = to_bf16(q), to_bf16(k)
    v = to_bf16(rng.standard_normal((B, HV, Tpad, K)))
    x = rng.standard_normal((B, HV, Tpad))
    hv = np.arange(HV)[None, :, None]
    if case.gate == "default":
        g = np.where(hv % 4 == 3, 0.0, -np.log1p(np.exp(-x)) / 16.0 * (1 + hv % 3))
    elif case.gate == "none":
        g = np.zeros_like(x)
    elif case.gate == "strong":
        g = -20.0 + 0.5 * rng.uniform(size=x.shape)
    elif case.gate == "g6":  # tests/test_gpu_fwd.c's "raw keys g=-6"
        g = -6.0 + 0.5 * rng.uniform(size=x.shape)
    elif case.gate == "spread":  # tests/cpu_fast_util.h GATE_SPREAD
        g = -(16.0 * hv / max(HV - 1, 1)) * rng.uniform(size=x.shape)
    elif case.gate == "in_kernel":  # g = -exp(A_log) softplus(a + dt_bias), a = x
        A_log = np.log(0.5 + 8 * rng.uniform(size=HV))[None, :, None]
        dt_bias = 0.5 * rng.standard_normal(HV)[None, :, None]
        z = x + dt_bias
        g = -np.exp(A_log) * np.where(z > 0, z + np.log1p(np.exp(-np.abs(z))), np.log1p(np.exp(z)))
    else:
        raise ValueError(case.gate)
    if case.beta == "sigmoid":
        beta = 1.0 / (1.0 + np.exp(-rng.standard_normal(x.shape)))
    elif case.beta == "set":
        u = rng.uniform(size=x.shape)
        beta = np.where(u < 0.3, 0.0, np.where(u < 0.6, 1.0, 1.99))
    elif case.beta == "in_kernel":
        beta = 1.0 / (1.0 + np.exp(-2.0 * rng.standard_normal(x.shape)))
        if case.neg_eig:
            beta = 2.0 * beta
    else:
        raise ValueError(case.beta)
    # the gate and beta reach the kernel as fp32 (computed here in fp64: the in-kernel gate's own
    # fp32 rounding is not modelled; the reference and the emulation share these values)
    g, beta = to_f32(g), to_f32(beta)
    h0 = to_f32(rng.standard_normal((B, HV, K, K)))
    m = valid[:, None, :]
    q, k = q * m[..., None], k * m[..., None]
    v = v * m[..., None]
    g, beta = g * m, beta * m
    # per value head (GVA: value head i reads q/k head i / (HV / H)); heads flattened to N = B HV
    group = HV // H
    kh = np.repeat(k, group, axis=1).reshape(B * HV, Tpad, K)
    qh = np.repeat(q, group, axis=1).reshape(B * HV, Tpad, K)
    return dict(q=qh, k=kh, v=v.reshape(B * HV, Tpad, K), g=g.reshape(B * HV, Tpad),
                beta=beta.reshape(B * HV, Tpad), h0=h0.reshape(B * HV, K, K), valid=valid,
                seq_of_head=np.repeat(np.arange(B), HV), l2norm=case.l2norm, scale=1.0 / math.sqrt(K))


# --------------------------------------------------------------------------- reference
def l2norm_fp64(x):
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + 1e-6)


def reference_recurrence(inp):
    """docs/design.md §1 token by token in float64: S <- e^g S; S += k beta (v - S^T k)^T; o = scale S^T q."""
    q, k = inp["q"], inp["k"]
    if inp["l2norm"]:
        q, k = l2norm_fp64(q), l2norm_fp64(k)
    v, g, beta = inp["v"], inp["g"], inp["beta"]
    S = inp["h0"].copy()
    N, T, K = k.shape
    o = np.zeros_like(v)
    eg = np.exp(g)
    for t in range(T):
        S *= eg[:, t, None, None]
        kt = k[:, t, :]
        pred = np.einsum("nk,nkv->nv", kt, S)
        u = beta[:, t, None] * (v[:, t, :] - pred)
        S += kt[:, :, None] * u[:, None, :]
        o[:, t, :] = inp["scale"] * np.einsum("nk,nkv->nv", q[:, t, :], S)
    return o, S


# --------------------------------------------------------------------------- prepare
def chunked(x):
    """[N, Tpad, ...] -> [N, NC, C, ...]"""
    return x.reshape(x.shape[0], x.shape[1] // C, C, *x.shape[2:])


def l2norm_factors(x, R):
    """rq / rk: fp32(1 / sqrt(fp32(sum x^2) + 1e-6)) from the stored rows."""
    if R.exact:
        return 1.0 / np.sqrt(np.sum(x * x, axis=-1) + 1e-6)
    ss = to_f32(np.sum(x * x, axis=-1))
    return to_f32(1.0 / np.sqrt(to_f32(ss + 1e-6)))


def prepare(inp, R):
    """Per chunk: gamma, Gamma, KK (the kernel's fp32 M before beta), Pg, and the l2norm factors."""
    qc, kc = chunked(inp["q"]), chunked(inp["k"])
    gc, bc = chunked(inp["g"]), chunked(inp["beta"])
    N, NC = gc.shape[:2]
    if inp["l2norm"]:
        rq, rk = l2norm_factors(qc, R), l2norm_factors(kc, R)
    else:
        rq = rk = np.ones((N, NC, C))
    gamma = R.cumsum(gc)
    causal = np.tril(np.ones((C, C), bool))
    with np.errstate(over="ignore", invalid="ignore"):
        Gamma = np.where(causal, np.exp(R.f32(np.where(causal, gamma[..., :, None] - gamma[..., None, :], 0.0))), 0.0)
    Gamma = R.f32(Gamma)
    kkT = R.f32(mm(kc, np.swapaxes(kc, -1, -2)))
    KK = R.f32(R.f32(kkT * rk[..., :, None]) * rk[..., None, :]) if inp["l2norm"] else kkT
    qkT = R.f32(mm(qc, np.swapaxes(kc, -1, -2)))
    qk_factor = R.f32(R.f32(rq * inp["scale"])[..., :, None] * rk[..., None, :])
    Pg = R.bf16(np.where(causal, R.f32(R.f32(qkT * qk_factor) * Gamma), 0.0))
    return dict(gamma=gamma, Gamma=Gamma, KK=KK, beta=bc, Pg=Pg, rq=rq, rk=rk, q=qc, k=kc, v=chunked(inp["v"]),
                scale=inp["scale"])


def ag_from_gate_free(prep, X, R):
    """Ag = bf16(Gamma (.) X diag(beta)) (the kernel: (Gamma x) beta in fp32)."""
    with np.errstate(over="ignore", invalid="ignore"):
        G = R.f32(R.f32(prep["Gamma"] * X) * prep["beta"][..., None, :])
        G = np.where(np.tril(np.ones((C, C), bool)), G, 0.0)
    return R.bf16(G), G


def product_fp16_k16(A, B):
    """A B as wgmma m64nNk16 in fp16: fp16 operands, fp32 accumulate, rounded per k-step of 16."""
    acc = np.zeros(A.shape[:-1] + (B.shape[-1],))
    for s in range(A.shape[-1] // 16):
        acc = mma_acc(acc, A[..., :, 16 * s:16 * s + 16], B[..., 16 * s:16 * s + 16, :])
    return acc


def inverse_neumann_fp16(KK, beta, M):
    """Issue 42's next split (docs/history/2026-12-07h-fusedfwd-exp.md section 4): the 16 x 16
    diagonal blocks' inverses D in fp32 (step 4a's substitution), then the merges as four
    64 x 64 x 64 fp16 products on tensor cores: with N = D StrictBlockLower(M) (N^4 = 0 on
    16-blocks), (I + M)^-1 = (I - N + N^2 - N^3) D. Every product's operands fp16, fp32
    accumulate; N, N^2, N^3 and the sum I - N + N^2 - N^3 stored fp16 as the next operand."""
    D = diagonal_blocks_fp32(KK, beta)
    off = M.copy()
    for b in range(4):
        block(off, b, b, 16)[...] = 0.0
    D16 = to_fp16(D)
    N = to_fp16(product_fp16_k16(D16, to_fp16(off)))
    N2 = to_fp16(product_fp16_k16(N, N))
    N3 = to_fp16(product_fp16_k16(N2, N))
    with np.errstate(over="ignore", invalid="ignore"):
        S = to_fp16(to_f32(to_f32(to_f32(np.eye(C) - N) + N2) - N3))
    return product_fp16_k16(S, D16)


def inverse_wgmma_fp16(M, r16=to_fp16, r32=to_f32):
    """Issue 42's mode 17 (src/dev/fwd_fused_exp.cu): the whole inverse on the products
    warpgroup's tensor cores in fp16, fp32 accumulate.
    Diagonal blocks, one warp a block, mma.sync m16n8k16 (one k-step a product): X = I - L2
    (L2 the entries of L whose row and column differ in bit 0 only); then for bit b = 1, 2, 3,
    with Lo the entries whose highest differing bit is b: N = X Lo, X <- X + (-N) X, the
    last onto X's fp32 accumulator. Then, with D the four blocks and Lo the block-strictly-
    lower part of L (N^4 = 0): N = D Lo, T = I + N^2, S = T + (-T) N = (I + N^2)(I - N),
    X = S D, each a 64 x 64 x 64 wgmma (four k-steps), its operands rounded by r16.
    r16 = r32 = identity gives the algebra in float64 (the self-check)."""
    n = M.shape[-1]
    hb = np.full((16, 16), -1)
    for i in range(16):
        for j in range(i):
            hb[i, j] = (i ^ j).bit_length() - 1
    mma = (lambda acc, a, b: r32(acc + mm(a, b)))
    D = np.zeros(M.shape)
    for blk_i in range(n // 16):
        L = block(M, blk_i, blk_i, 16)
        Lr = r16(L)
        X = np.eye(16) - np.where(hb == 0, L, 0.0)       # exact in fp32: one product each
        Xr = r16(X)
        for b in (1, 2, 3):
            N = mma(np.zeros(L.shape), Xr, np.where(hb == b, Lr, 0.0))
            X = mma(X, r16(-N), Xr)
            Xr = r16(X)
        block(D, blk_i, blk_i, 16)[...] = Xr
    return merges_fp16(D, M, r16, mma)


def merges_fp16(D, M, r16, mma):
    """Mode 17's merges on the products warpgroup: with D the diagonal blocks' inverses (as
    stored, fp16) and Lo = r16 of M's block-strictly-lower part (N^4 = 0 on 16-blocks):
    N = D Lo, T = I + N^2, S = T + (-T) N = (I + N^2)(I - N), X = S D, each a 64 x 64 x 64
    wgmma of four k-steps accumulated by mma."""
    n = M.shape[-1]
    Lo = M.copy()
    for b in range(n // 16):
        block(Lo, b, b, 16)[...] = 0.0
    Lo = r16(Lo)

    def wg(acc, A, B):
        for s in range(n // 16):
            acc = mma(acc, A[..., :, 16 * s:16 * s + 16], B[..., 16 * s:16 * s + 16, :])
        return acc
    z = np.zeros(M.shape)
    N = r16(wg(z, D, Lo))
    T = wg(z, N, N) + np.eye(n)
    S = wg(T, r16(-T), N)
    return wg(z, r16(S), D)


def inverse_mode25(Lg):
    """Issue 42's mode 25 (src/dev/fwd_fused_exp.cu) on the gated system, the form its correct
    kernel would use on every chunk: Lg = StrictLower(diag(beta) (Gamma (.) KK)) in fp32; the
    16 x 16 diagonal blocks' inverses D by right-looking substitution in fp32 (one FMA a step,
    a column a lane, as two side warps run it), stored fp16; then mode 17's merges on the
    products warpgroup: N = D Lo, T = I + N^2, S = (I + N^2)(I - N), X = S D, each a
    64 x 64 x 64 fp16 wgmma (fp32 accumulate per k-step), Lo = fp16 of Lg's block-strictly-lower
    part. The result is Gamma (.) Ar, so Ag = X diag(beta) needs no exponential."""
    n = Lg.shape[-1]
    D = np.zeros(Lg.shape)
    with np.errstate(over="ignore", invalid="ignore"):
        for b in range(n // 16):
            L = block(Lg, b, b, 16)
            X = np.broadcast_to(np.eye(16), L.shape).copy()
            for i in range(15):
                X[..., i + 1:, :] = to_f32(X[..., i + 1:, :] - L[..., i + 1:, i, None] * X[..., i, None, :])
            block(D, b, b, 16)[...] = X
        return merges_fp16(to_fp16(D), Lg, to_fp16, lambda acc, a, b: to_f32(acc + mm(a, b)))


def inverse_variant(name, prep, R=KernelRounding):
    """Returns (Ag, G before the bf16 rounding, the stored inverse X)."""
    KK, beta, Gamma = prep["KK"], prep["beta"], prep["Gamma"]
    M = strict_lower(beta[..., :, None] * KK)
    if name in ("exact", "exact_ag32"):
        X = inverse_exact(M)
    elif name == "ours":
        X = inverse_ours(KK, beta, product_3xtf32)
    elif name == "tf32":
        X = inverse_ours(KK, beta, product_tf32)
    elif name == "3xbf16":
        X = inverse_ours(KK, beta, product_3xbf16)
    elif name == "fp16_free":
        X = inverse_fp16_flashinfer(to_f32(M))
    elif name == "neumann_fp16":
        X = inverse_neumann_fp16(KK, beta, to_f32(M))
    elif name == "wgmma_fp16":
        X = inverse_wgmma_fp16(to_f32(M))
    elif name in ("fp16_gated", "mode25_gated"):
        Lg = strict_lower(to_f32(to_f32(beta[..., :, None] * Gamma) * KK))
        X = inverse_fp16_flashinfer(Lg) if name == "fp16_gated" else inverse_mode25(Lg)
        with np.errstate(over="ignore", invalid="ignore"):
            G = to_f32(X * beta[..., None, :])
        return to_bf16(G), G, X
    else:
        raise ValueError(name)
    Ag, G = ag_from_gate_free(prep, X, R)
    if name == "exact_ag32":  # diagnostic: Ag left in fp32 (no kernel does this: wgmma takes bf16)
        Ag = G
    return Ag, G, X


# --------------------------------------------------------------------------- chains
CHAIN_FORMS = ("split", "w_once")
CHAIN_FORM = "split"  # set by --chain


def chain_kernel(prep, Ag, h0, R, form=None):
    """fwd_chain.cuh's products and roundings, chunk by chunk (vectorised over heads).
    form "split" (default; G1 then G4): Vd = fp32(fp32(Ag V) + Ag bf16(-diag(u) U));
    form "w_once" (the fused kernel's G1 + G4 experiment, a8c147b, and the mma.sync chunk
    kernel): Vd = fp32(Ag bf16(fma(-u, U, V)))."""
    form = form or CHAIN_FORM
    gamma, q, k, v, Pg = prep["gamma"], prep["q"], prep["k"], prep["v"], prep["Pg"]
    rq, rk, scale = prep["rq"], prep["rk"], prep["scale"]
    N, NC = gamma.shape[:2]
    S = h0.copy()
    o = np.zeros((N, NC, C, v.shape[-1]))
    with np.errstate(over="ignore", invalid="ignore"):
        for c in range(NC):
            gm, gC = gamma[:, c], gamma[:, c, -1:]
            eg = np.exp(gm)
            u = R.f32(R.f32(eg) * rk[:, c])
            d = R.f32(R.f32(np.exp(R.f32(gC - gm))) * rk[:, c])
            fo = R.f32(R.f32(scale * rq[:, c]) * R.f32(eg))
            Kc, Qc, Vc, A = k[:, c], q[:, c], v[:, c], Ag[:, c]
            Sb = R.bf16(S)
            U = R.f32(mm(Kc, Sb))
            Qs = R.f32(mm(Qc, Sb))
            if form == "w_once":
                Vd = R.f32(mm(A, R.bf16(R.f32(Vc - u[..., None] * U))))
            else:
                W = R.bf16(R.f32(-u[..., None] * U))
                Vd = R.f32(R.f32(mm(A, Vc)) + mm(A, W))
            P = R.f32(mm(Pg[:, c], R.bf16(Vd)))
            o[:, c] = R.bf16(R.f32(fo[..., None] * Qs + P))
            Vp = R.bf16(R.f32(d[..., None] * Vd))
            S = R.f32(R.f32(R.f32(np.exp(gC))[..., None] * S) + mm(np.swapaxes(Kc, -1, -2), Vp))
    return o.reshape(N, NC * C, -1), S


def chain_fla_baseline(inp, prep):
    """Variant 7: an FLA-style bf16 chunked forward (see the header)."""
    R = KernelRounding
    scale = inp["scale"]
    q, k = prep["q"], prep["k"]
    if inp["l2norm"]:  # FLA's l2norm_fwd: fp32 math, bf16 output
        q = to_bf16(q * l2norm_factors(q, R)[..., None])
        k = to_bf16(k * l2norm_factors(k, R)[..., None])
    v, beta, gamma, Gamma = prep["v"], prep["beta"], prep["gamma"], prep["Gamma"]
    N, NC = gamma.shape[:2]
    causal = np.tril(np.ones((C, C), bool))
    with np.errstate(over="ignore", invalid="ignore"):
        kkT = to_f32(mm(k, np.swapaxes(k, -1, -2)))
        Lg = strict_lower(to_f32(to_f32(kkT * Gamma) * beta[..., :, None]))
        Ainv = to_f32(inverse_exact(Lg))
        G = to_f32(Ainv * beta[..., None, :])
        A = to_bf16(G)
        eg = to_f32(np.exp(gamma))
        w = to_bf16(to_f32(mm(A, to_bf16(to_f32(k * eg[..., None])))))
        uu = to_bf16(to_f32(mm(A, v)))
        Aqk = to_bf16(np.where(causal, to_f32(to_f32(mm(q, np.swapaxes(k, -1, -2))) * Gamma), 0.0))
        S = inp["h0"].copy()
        o = np.zeros((N, NC, C, v.shape[-1]))
        for c in range(NC):
            h = to_bf16(S)
            vnew32 = to_f32(uu[:, c] - to_f32(mm(w[:, c], h)))
            vnew = to_bf16(vnew32)
            qh = to_f32(to_f32(mm(q[:, c], h)) * eg[:, c, :, None])
            o[:, c] = to_bf16(to_f32(qh * scale + to_f32(mm(Aqk[:, c], vnew)) * scale))
            gC = gamma[:, c, -1:]
            vdec = to_bf16(to_f32(vnew32 * to_f32(np.exp(to_f32(gC - gamma[:, c])))[..., None]))
            S = to_f32(to_f32(S * to_f32(np.exp(gC))[..., None]) + mm(np.swapaxes(k[:, c], -1, -2), vdec))
    return o.reshape(N, NC * C, -1), S, G, Ainv


# --------------------------------------------------------------------------- metrics
def worst_rel(x, ref, inp, per_token):
    """max over (sequence, value head) of ||x - ref|| / ||ref|| (o over the sequence's valid tokens)."""
    with np.errstate(over="ignore", invalid="ignore"):
        if per_token:
            m = inp["valid"][inp["seq_of_head"]][..., None]
            num = np.sum(np.where(m, (x - ref) ** 2, 0.0), axis=(1, 2))
            den = np.sum(np.where(m, ref ** 2, 0.0), axis=(1, 2))
        else:
            num = np.sum((x - ref) ** 2, axis=(1, 2))
            den = np.sum(ref ** 2, axis=(1, 2))
        r = np.sqrt(num / den)
    return float(np.nan) if not np.all(np.isfinite(r)) else float(np.max(r))


def inverse_error(G, G_exact):
    """worst over (head, chunk) of ||G - G_exact||_F / ||G_exact||_F (chunks of padding only,
    where G_exact = 0, are skipped)."""
    with np.errstate(over="ignore", invalid="ignore"):
        den = np.sum(G_exact ** 2, axis=(-2, -1))
        r = np.sqrt(np.sum((G - G_exact) ** 2, axis=(-2, -1))[den > 0] / den[den > 0])
    return float(np.nan) if not np.all(np.isfinite(r)) else float(np.max(r))


def max_abs_finite(x):
    finite = np.abs(x[np.isfinite(x)])
    return float(finite.max()) if finite.size else float("nan")


def nonfinite(*arrays):
    return int(sum(np.count_nonzero(~np.isfinite(a)) for a in arrays))


# --------------------------------------------------------------------------- self-check
def unrounded_errors(case, rng):
    """rel(o), rel(S) of variant 1's chunked emulation with every rounding off
    against the fp64 recurrence, on one draw of case."""
    inp = draw_inputs(case, rng)
    o_ref, S_ref = reference_recurrence(inp)
    prep = prepare(inp, NoRounding)
    M = strict_lower(prep["beta"][..., :, None] * prep["KK"])
    Ag = prep["Gamma"] * inverse_exact(M) * prep["beta"][..., None, :]
    o, S = chain_kernel(prep, Ag, inp["h0"], NoRounding)
    return worst_rel(o, o_ref, inp, True), worst_rel(S, S_ref, inp, False)


def self_check(rng):
    """Variant 1's chunked emulation with every rounding off must match the fp64 recurrence."""
    ro, rs = unrounded_errors(Case("check", "self-check", [200, 333], 2, 4, keys="l2norm", gate="default"), rng)
    # and once more without l2norm and with strong decay (Gamma far from 1)
    ro2, rs2 = unrounded_errors(Case("check2", "self-check 2", [130], 1, 2, gate="strong"), rng)
    print(f"self-check (chunked fp64, no rounding, vs recurrence): rel(o) {ro:.2e} rel(S) {rs:.2e}; "
          f"strong decay: rel(o) {ro2:.2e} rel(S) {rs2:.2e}", flush=True)
    # variant 9's algebra in float64 (no rounding) must be the inverse
    Mt = strict_lower(rng.uniform(-1.0, 1.0, (3, C, C)))
    ident = lambda x: x
    alg = float(np.max(np.abs(inverse_wgmma_fp16(Mt, ident, ident) - inverse_exact(Mt))) / np.max(np.abs(inverse_exact(Mt))))
    print(f"self-check: variant 9's algebra in fp64 vs forward substitution: {alg:.2e}", flush=True)
    worst = max(ro, rs, ro2, rs2, alg)
    if not worst <= 1e-10:
        print(f"SELF-CHECK FAILED: the float64 chunked emulation differs from the recurrence by {worst:.3e} "
              "(expected ~1e-12)", file=sys.stderr, flush=True)
        sys.exit(1)


# --------------------------------------------------------------------------- driver
VARIANTS = [
    ("exact", "1 exact"),
    ("exact_ag32", "1b exact, Ag not rounded to bf16 (diagnostic)"),
    ("ours", "2 ours 3xTF32"),
    ("tf32", "3 tf32"),
    ("fp16_free", "4 fp16 gate-free"),
    ("fp16_gated", "5 fp16 gated"),
    ("3xbf16", "6 3xBF16"),
    ("fla", "7 FLA bf16 baseline"),
    ("neumann_fp16", "8 fp16 block-Neumann"),
    ("wgmma_fp16", "9 fp16 on tensor cores (mode 17)"),
    ("mode25_gated", "10 gated: fp32 diagonal blocks, fp16 merges (mode 25)"),
]


def run_case(case, seed, variants=None):
    rng = np.random.default_rng(seed)
    inp = draw_inputs(case, rng)
    o_ref, S_ref = reference_recurrence(inp)
    prep = prepare(inp, KernelRounding)
    M = strict_lower(prep["beta"][..., :, None] * prep["KK"])
    G_exact = prep["Gamma"] * inverse_exact(M) * prep["beta"][..., None, :]   # fp64 gated inverse
    out = {}
    for key, _ in VARIANTS:
        if variants is not None and key not in variants:
            continue
        if key == "fla":
            o, S, G, X = chain_fla_baseline(inp, prep)
        else:
            Ag, G, X = inverse_variant(key, prep)
            o, S = chain_kernel(prep, Ag, inp["h0"], KernelRounding)
        out[key] = dict(o=worst_rel(o, o_ref, inp, True), S=worst_rel(S, S_ref, inp, False),
                        inv=inverse_error(G, G_exact) if key not in ("exact", "exact_ag32") else 0.0,
                        maxX=max_abs_finite(strict_lower(X)),
                        bad_inv=nonfinite(X), bad_out=nonfinite(o, S))
    maxAr = max_abs_finite(strict_lower(inverse_exact(M)))
    return out, maxAr, float(np.max(np.abs(o_ref))), float(np.max(np.abs(S_ref)))


def merge_worst(acc, new):
    if acc is None:
        return {k: dict(v) for k, v in new.items()}
    for key, r in new.items():
        a = acc[key]
        for f in ("o", "S", "inv", "maxX"):
            a[f] = max(a[f], r[f]) if not (math.isnan(a[f]) or math.isnan(r[f])) else float("nan")
        a["bad_inv"] += r["bad_inv"]
        a["bad_out"] += r["bad_out"]
    return acc


def fmt(x):
    return "nan" if isinstance(x, float) and math.isnan(x) else f"{x:.2e}"


def ratio(a, b):
    return "-" if (math.isnan(a) or math.isnan(b) or b == 0) else f"{a / b:.2f}"


def markdown_table(results):
    lines = ["| case | variant | rel(o) | o / FLA | rel(S) | S / FLA | inverse err | max abs X (below diag) | non-finite inv / out |",
             "|---|---|---|---|---|---|---|---|---|"]
    for case, res, extra in results:
        base = res["fla"]
        for key, label in VARIANTS:
            r = res[key]
            lines.append(f"| {case.name} | {label} | {fmt(r['o'])} | {ratio(r['o'], base['o'])} | {fmt(r['S'])} | "
                         f"{ratio(r['S'], base['S'])} | {fmt(r['inv'])} | {fmt(r['maxX'])} | "
                         f"{r['bad_inv']} / {r['bad_out']} |")
    return "\n".join(lines)


def case_notes(results):
    lines = ["| case | seqs | H, HV | max abs Ar below diag (exact, gate-free) | max abs o_ref | max abs S_ref |",
             "|---|---|---|---|---|---|"]
    for case, res, extra in results:
        lines.append(f"| {case.name} | {'+'.join(map(str, case.seqs))} | {case.H}, {case.HV} | {fmt(extra['maxAr'])} | "
                     f"{fmt(extra['maxo'])} | {fmt(extra['maxS'])} |")
    return "\n".join(lines)


SWEEP_LENGTHS = [130, 512, 1024, 2048, 4096]
SWEEP_VARIANTS = ("exact", "ours", "fla")


def length_sweep(seeds, seed_base):
    """The no-decay, beta in {0, 1, 1.99} case (docs/testing.md's; the GPU test runs it at T = 130) at
    growing T: where the bf16 floor crosses 5e-3, whatever the inverse."""
    rows = []
    for T in SWEEP_LENGTHS:
        case = Case("sweep", f"no decay, beta in {{0, 1, 1.99}}, T = {T}", [T], 2, 4, gate="none", beta="set")
        worst = {v: [0.0, 0.0] for v in SWEEP_VARIANTS}
        for s in range(seeds):
            out, _, _, _ = run_case(case, seed_base + 5000 + T + s, SWEEP_VARIANTS)
            for v in SWEEP_VARIANTS:
                worst[v] = [max(worst[v][0], out[v]["o"]), max(worst[v][1], out[v]["S"])]
        print(f"[sweep] T = {T}: " + " ".join(f"{v}={fmt(w[0])}/{fmt(w[1])}" for v, w in worst.items()), flush=True)
        rows.append((T, worst))
    labels = dict(VARIANTS)
    lines = ["| T | " + " | ".join(f"{labels[v]} rel(o) / rel(S)" for v in SWEEP_VARIANTS) + " |",
             "|---|" + "---|" * len(SWEEP_VARIANTS)]
    for T, worst in rows:
        lines.append(f"| {T} | " + " | ".join(f"{fmt(worst[v][0])} / {fmt(worst[v][1])}" for v in SWEEP_VARIANTS) + " |")
    return "\n".join(lines)


GROWTH_NORMS = [1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 11.3]


def ar_growth_table(seed):
    """max |Ar| of the gate-free inverse (exact, fp64) over 256 chunks of random keys of norm r:
    where the gate-free form overflows fp16 (65504) and fp32 (3.4e38) whatever the decay."""
    rng = np.random.default_rng(seed)
    lines = ["| key norm | beta sigmoid(N(0,1)): max abs Ar | beta in {0, 1, 1.99}: max abs Ar |", "|---|---|---|"]
    for r in GROWTH_NORMS:
        k = unit_rows(rng.standard_normal((256, C, HEAD_DIM))) * r
        KK = mm(k, np.swapaxes(k, -1, -2))
        b_sig = 1.0 / (1.0 + np.exp(-rng.standard_normal((256, C))))
        u = rng.uniform(size=(256, C))
        b_set = np.where(u < 0.3, 0.0, np.where(u < 0.6, 1.0, 1.99))
        cells = []
        for b in (b_sig, b_set):
            m = max_abs_finite(inverse_exact(strict_lower(b[..., :, None] * KK)))
            tag = " (fp32 overflow)" if m > 3.4e38 else " (fp16 overflow)" if m > 65504 else ""
            cells.append(fmt(m) + tag)
        lines.append(f"| {r:g} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=3, help="seeds per case (default 3)")
    ap.add_argument("--seed-base", type=int, default=1000)
    ap.add_argument("--cases", default="", help="comma-separated case keys (default all): "
                    + ",".join(c.key for c in CASES))
    ap.add_argument("--markdown", default="", help="also write the tables to this file")
    ap.add_argument("--no-sweep", action="store_true", help="skip the no-decay length sweep")
    ap.add_argument("--chain", choices=CHAIN_FORMS, default="split",
                    help="the chain's Vd rounding: split (G1 then G4, the default) or w_once "
                    "(W = V - diag(u) U rounded once: the fused kernel's G1 + G4 experiment)")
    args = ap.parse_args()
    global CHAIN_FORM
    CHAIN_FORM = args.chain
    t0 = time.time()
    self_check(np.random.default_rng(7))
    chosen = [c for c in CASES if not args.cases or c.key in args.cases.split(",")]
    results = []
    for ci, case in enumerate(chosen):
        acc, extra = None, dict(maxAr=0.0, maxo=0.0, maxS=0.0)
        seeds = [args.seed_base + 100 * CASES.index(case) + s for s in range(args.seeds)]
        for seed in seeds:
            t1 = time.time()
            out, maxAr, maxo, maxS = run_case(case, seed)
            acc = merge_worst(acc, out)
            extra = dict(maxAr=max(extra["maxAr"], maxAr), maxo=max(extra["maxo"], maxo), maxS=max(extra["maxS"], maxS))
            print(f"[{ci + 1}/{len(chosen)}] {case.name} seed {seed}: "
                  + " ".join(f"{k}={fmt(v['o'])}/{fmt(v['S'])}" for k, v in out.items())
                  + f"  ({time.time() - t1:.1f}s)", flush=True)
        extra["seeds"] = seeds
        results.append((case, acc, extra))
    sweep = "" if args.no_sweep else length_sweep(args.seeds, args.seed_base)
    growth = ar_growth_table(args.seed_base + 9000)
    table, notes = markdown_table(results), case_notes(results)
    elapsed = time.time() - t0
    print()
    print(table)
    print()
    print(notes)
    if sweep:
        print()
        print(sweep)
    print()
    print(growth)
    print(f"\n{elapsed:.0f} s, numpy {np.__version__}, python {platform.python_version()}")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("# Inverse precision: end-to-end results\n\n"
                    "Generated by dev/models/inverse_precision.py (what each variant and column means: "
                    "its header; the reading: docs/history/perf-log.md, session 20). Worst over sequences x value heads x seeds.\n\n")
            f.write(f"command: python3 {' '.join(sys.argv)}\n\n")
            f.write(f"chain form: {CHAIN_FORM}\n\n")
            f.write(f"date: {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')}; numpy {np.__version__}; "
                    f"python {platform.python_version()}; {elapsed:.0f} s\n\n")
            f.write("seeds: " + "; ".join(f"{c.key} {e['seeds']}" for c, _, e in results) + "\n\n")
            f.write(table + "\n\n" + notes + "\n")
            if sweep:
                f.write("\n" + sweep + "\n")
            f.write("\n" + growth + "\n")


if __name__ == "__main__":
    main()
