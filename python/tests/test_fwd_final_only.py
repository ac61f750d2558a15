"""ops.fwd_impl(final_only=True): the final state alone (fqla_fwd with o
absent), bit for bit the full forward's, on both CPU backends; with the
identity as the initial state and zero values it is the tokens' transition
M (docs/distributed.md). On CUDA (skipped without a device) it matches the
full forward's final state within the forward's threshold (another kernel
runs it) and K = 256 is refused by name. The library's side is tested in C
(tests/test_fwd_ht_only.c, tests/test_gpu_fwd.c's fwd_final_only)."""

import pytest
import torch

from conftest import cuda_skip_reason, has_cuda
from flashqla import _lib, ops


def _inputs(B, T, H, HV, K, V, N, dtype, gate, v_first):
    q = torch.randn(B, T, H, K, dtype=dtype)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K), dim=-1).to(dtype)
    v = torch.randn(B, T, HV, V, dtype=dtype)
    g = torch.randn(B, T, HV) if gate else -0.3 * torch.rand(B, T, HV)
    beta = torch.randn(B, T, HV) if gate else torch.rand(B, T, HV)
    A_log = torch.rand(HV) if gate else None
    dt_bias = torch.randn(HV) if gate else None
    h0 = torch.randn((N, HV, V, K) if v_first else (N, HV, K, V))
    return q, k, v, g, beta, A_log, dt_bias, h0


CASES = [
    # name, B, T, H, HV, K, V, cu_seqlens, dtype, options (gate, v_first)
    ("batch", 2, 70, 1, 2, 16, 16, None, torch.float32, (False, False)),
    ("varlen, an empty sequence", 1, 150, 1, 2, 16, 24, [0, 40, 40, 140], torch.float32, (False, False)),
    ("GVA, every option", 1, 130, 2, 4, 32, 32, None, torch.bfloat16, (True, True)),
]


def _args(case, backend):
    _, B, T, H, HV, K, V, cu, dtype, (gate, v_first) = case
    if backend == _lib.BACKEND_CPU_REFERENCE:
        dtype = torch.float64
    N = B if cu is None else len(cu) - 1
    q, k, v, g, beta, A_log, dt_bias, h0 = _inputs(B, T, H, HV, K, V, N, dtype, gate, v_first)
    if dtype == torch.float64:
        g, beta, h0 = g.double(), beta.double(), h0.double()
        A_log = A_log.double() if gate else None
        dt_bias = dt_bias.double() if gate else None
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    flags = ops.pack_flags(True, gate, gate, gate, v_first)
    return (q, k, v, g, beta, A_log, dt_bias, h0, cu_t, None, 0.0, flags)


@pytest.mark.parametrize("backend", [_lib.BACKEND_CPU, _lib.BACKEND_CPU_REFERENCE], ids=["cpu", "reference"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_final_only_matches_full_forward(case, backend):
    args = _args(case, backend)
    o, ht = ops.fwd_impl(*args, True, backend)
    none, alone = ops.fwd_impl(*args, False, backend, final_only=True)
    assert none is None
    assert alone.shape == ht.shape and alone.dtype == ht.dtype
    assert torch.equal(alone, ht), "the final state alone differs from the full forward's"


def test_identity_start_gives_the_transition():
    T, K = 30, 8
    torch.manual_seed(3)
    k = torch.nn.functional.normalize(torch.randn(1, T, 1, K, dtype=torch.float64), dim=-1)
    q = torch.randn(1, T, 1, K, dtype=torch.float64)
    v = torch.zeros(1, T, 1, K, dtype=torch.float64)
    g = -0.2 * torch.rand(1, T, 1, dtype=torch.float64)
    beta = torch.rand(1, T, 1, dtype=torch.float64)
    h0 = torch.eye(K, dtype=torch.float64).reshape(1, 1, K, K)
    _, M = ops.fwd_impl(q, k, v, g, beta, None, None, h0, None, None, 1.0, ops.pack_flags(False, False, False, False, False),
                        False, _lib.BACKEND_CPU_REFERENCE, final_only=True)
    P = torch.eye(K, dtype=torch.float64)
    for t in range(T):
        kt = k[0, t, 0]
        P = torch.exp(g[0, t, 0]) * (torch.eye(K, dtype=torch.float64) - beta[0, t, 0] * torch.outer(kt, kt)) @ P
    torch.testing.assert_close(M[0, 0], P, rtol=1e-12, atol=1e-12)


def _cuda_args(K, V, varlen):
    torch.manual_seed(5)
    T = 200
    q, k, v, g, beta, _, _, h0 = _inputs(1, T, 2, 4, K, V, 3 if varlen else 1, torch.bfloat16, False, False)
    cu = torch.tensor([0, 70, 75, T], dtype=torch.int32, device="cuda") if varlen else None
    dev = [x.cuda() for x in (q, k, v, g, beta, h0)]
    flags = ops.pack_flags(False, False, False, False, False)
    return (dev[0], dev[1], dev[2], dev[3], dev[4], None, None, dev[5], cu, None, K ** -0.5, flags)


@pytest.mark.skipif(not has_cuda(), reason=cuda_skip_reason())
@pytest.mark.parametrize("varlen", [False, True], ids=["one sequence", "varlen"])
def test_cuda_final_only_matches_full_forward(varlen):
    args = _cuda_args(128, 128, varlen)
    none, alone = ops.fwd_impl(*args, False, _lib.BACKEND_CUDA, final_only=True)
    assert none is None
    # another kernel than the full forward's, so not bit identity: the
    # forward's threshold against the fp64 reference on the same values
    ref_args = [x.double().cpu() if torch.is_tensor(x) and x.is_floating_point() else x for x in args]
    ref_args[8] = None if args[8] is None else args[8].cpu()
    _, want = ops.fwd_impl(*ref_args, True, _lib.BACKEND_CPU_REFERENCE)
    for n in range(want.shape[0]):
        for h in range(want.shape[1]):
            w, got = want[n, h], alone[n, h].double().cpu()
            err = ((got - w).norm() / w.norm()).item()
            assert err <= 5e-3, f"final state alone, sequence {n} head {h}: rel error {err:.3g}"


@pytest.mark.skipif(not has_cuda(), reason=cuda_skip_reason())
def test_cuda_refuses_k256_by_name():
    with pytest.raises(Exception, match="final state alone"):
        ops.fwd_impl(*_cuda_args(256, 256, False), False, _lib.BACKEND_CUDA, final_only=True)
