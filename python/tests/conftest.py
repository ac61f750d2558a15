"""Shared helpers of the flashqla Python tests.

Imports the installed flashqla when there is one (CI: `pip install .`), else
the source tree's python/flashqla with the library from FLASHQLA_LIB or
build/. Every run draws fresh random inputs: the seed is printed in the
header and can be fixed with FLASHQLA_TEST_SEED.
"""

import math
import os
import random
import sys
import zlib

import pytest
import torch

try:
    import flashqla  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import flashqla  # noqa: F401

SEED = int(os.environ.get("FLASHQLA_TEST_SEED", random.randrange(1 << 31)))


def pytest_report_header(config):
    return [f"flashqla {flashqla.__version__} from {flashqla.library_path}",
            f"FLASHQLA_TEST_SEED={SEED}"]


@pytest.fixture(autouse=True)
def _seed(request):
    # a per-test seed derived from the run's seed, so tests are independent
    torch.manual_seed(SEED ^ zlib.crc32(request.node.nodeid.encode()))


def has_cuda():
    return torch.cuda.is_available() and flashqla.backend_available("cuda")[0]


def cuda_skip_reason():
    if not torch.cuda.is_available():
        return "torch.cuda is not available (no GPU or CPU-only torch)"
    ok, why = flashqla.backend_available("cuda")
    return why if not ok else ""


def rel(x, ref):
    """||x - ref|| / ||ref|| in fp64; inf when x has a NaN/Inf where ref is finite."""
    x = x.detach().double().cpu()
    ref = ref.detach().double().cpu()
    if not torch.isfinite(x).all():
        return math.inf
    n = ref.norm().item()
    d = (x - ref).norm().item()
    return d / n if n > 0 else d


def make_inputs(B, T, H, HV, K, V, dtype=torch.float32, device="cpu", h0=False,
                v_first=False, N=None, gate_strength=1.0):
    """Random GDN inputs: unit-norm k, g in (-gate_strength, 0), beta in (0, 1)."""
    q = torch.randn(B, T, H, K, dtype=torch.float32)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K), dim=-1)
    v = torch.randn(B, T, HV, V)
    g = -gate_strength * torch.rand(B, T, HV)
    beta = torch.rand(B, T, HV)
    out = dict(q=q.to(dtype), k=k.to(dtype), v=v.to(dtype), g=g, beta=beta)
    if h0:
        n = B if N is None else N
        shape = (n, HV, V, K) if v_first else (n, HV, K, V)
        out["initial_state"] = torch.randn(shape)
    return {n: t.to(device) for n, t in out.items()}


def naive(q, k, v, g, beta, scale=None, initial_state=None, cu_seqlens=None,
          use_qk_l2norm_in_kernel=False, use_gate_in_kernel=False, A_log=None, dt_bias=None,
          use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, state_v_first=False):
    """The definition (docs/design.md §1) in fp64 torch, token by token: an
    oracle independent of the C library, for the Python argument plumbing."""
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    r = HV // H
    scale = K ** -0.5 if scale is None else scale
    if use_qk_l2norm_in_kernel:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    if use_gate_in_kernel:
        dt = torch.zeros(HV, dtype=torch.float64) if dt_bias is None else dt_bias.double()
        g = -A_log.double().exp() * torch.nn.functional.softplus(g + dt)
    if use_beta_sigmoid_in_kernel:
        beta = beta.sigmoid() * (2 if allow_neg_eigval else 1)
    if cu_seqlens is None:
        seqs = [(b, 0, T) for b in range(B)]
    else:
        cu = [int(x) for x in cu_seqlens]
        seqs = [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]
    o = torch.zeros(B, T, HV, V, dtype=torch.float64)
    finals = []
    for n, (b, s, e) in enumerate(seqs):
        S = torch.zeros(HV, K, V, dtype=torch.float64)
        if initial_state is not None:
            h = initial_state[n].double()
            S = h.transpose(-1, -2).clone() if state_v_first else h.clone()
        for t in range(s, e):
            for h in range(HV):
                kk, qq = k[b, t, h // r], q[b, t, h // r]
                S[h] = S[h] * g[b, t, h].exp()
                u = beta[b, t, h] * (v[b, t, h] - S[h].T @ kk)
                S[h] = S[h] + torch.outer(kk, u)
                o[b, t, h] = S[h].T @ (scale * qq)
        finals.append(S.transpose(-1, -2) if state_v_first else S)
    return o, torch.stack(finals)
