"""ops.bwd_impl(dh0_only=True): the gradient of the initial state alone, bit
for bit the full backward's, the other outputs None; on both CPU backends,
and on CUDA where there is a device (skipped otherwise). The library's side
is tested in C (tests/test_bwd_dh0_only.c, tests/test_gpu_bwd.c)."""

import pytest
import torch

from conftest import cuda_skip_reason, has_cuda
from flashqla import _lib, ops


def _inputs(B, T, H, HV, K, V, N, dtype, gate, v_first):
    q = torch.randn(B, T, H, K, dtype=dtype)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K), dim=-1).to(dtype)
    v = torch.randn(B, T, HV, V, dtype=dtype)
    g = torch.randn(B, T, HV) if gate else -0.3 * torch.rand(B, T, HV)
    beta = torch.randn(B, T, HV)
    A_log = torch.rand(HV) if gate else None
    dt_bias = torch.randn(HV) if gate else None
    shape = (N, HV, V, K) if v_first else (N, HV, K, V)
    h0 = torch.randn(shape)
    d_o = torch.randn(B, T, HV, V, dtype=dtype)
    dht = torch.randn(shape) / 4
    return q, k, v, g, beta, A_log, dt_bias, h0, d_o, dht


CASES = [
    # name, B, T, H, HV, K, V, cu_seqlens, dtype, options (gate, v_first)
    ("batch", 2, 70, 1, 2, 16, 16, None, torch.float32, (False, False)),
    ("varlen, an empty sequence", 1, 150, 1, 2, 16, 24, [0, 40, 40, 140], torch.float32, (False, False)),
    ("GVA, every option", 1, 130, 2, 4, 32, 32, None, torch.bfloat16, (True, True)),
]


@pytest.mark.parametrize("backend", [_lib.BACKEND_CPU, _lib.BACKEND_CPU_REFERENCE], ids=["cpu", "reference"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_dh0_only_matches_full_backward(case, backend):
    _, B, T, H, HV, K, V, cu, dtype, (gate, v_first) = case
    if backend == _lib.BACKEND_CPU_REFERENCE:
        dtype = torch.float64   # the oracle's own dtype, everywhere
    N = B if cu is None else len(cu) - 1
    q, k, v, g, beta, A_log, dt_bias, h0, d_o, dht = _inputs(B, T, H, HV, K, V, N, dtype, gate, v_first)
    if dtype == torch.float64:
        g, beta, h0, dht = g.double(), beta.double(), h0.double(), dht.double()
        A_log = A_log.double() if gate else None
        dt_bias = dt_bias.double() if gate else None
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32)
    flags = ops.pack_flags(True, gate, gate, gate, v_first)
    args = (q, k, v, g, beta, A_log, dt_bias, h0, cu_t, None, d_o, dht, 0.0, flags, backend)
    full = ops.bwd_impl(*args)
    alone = ops.bwd_impl(*args, dh0_only=True)
    assert all(x is None for i, x in enumerate(alone) if i != 5)
    assert alone[5].shape == h0.shape and alone[5].dtype == full[5].dtype
    assert torch.equal(alone[5], full[5]), "dh0 alone differs from the full backward's"
    if cu is not None:   # the empty sequence's gradient is its d(final state)
        torch.testing.assert_close(alone[5][1], dht[1].to(alone[5].dtype), rtol=0, atol=0)


def test_dh0_only_needs_initial_state():
    q, k, v, g, beta, _, _, _, d_o, _ = _inputs(1, 8, 1, 1, 16, 16, 1, torch.float32, False, False)
    with pytest.raises(ValueError, match="initial_state"):
        ops.bwd_impl(q, k, v, g, beta, None, None, None, None, None, d_o, None, 0.0, 0,
                     _lib.BACKEND_CPU, dh0_only=True)


GPU_CASES = [
    # name, B, T, H, HV, cu_seqlens: few chunks (no CP), and one long sequence on few
    # heads, where the chains run with context parallelism (tests/test_gpu_bwd.c
    # asserts that plan for the same shapes)
    ("batch, no CP", 2, 300, 2, 8, None),
    ("one long sequence, CP", 1, 2048, 2, 4, None),
    ("varlen, an empty sequence, CP", 1, 2048, 1, 4, [0, 1500, 1500, 2048]),
]


@pytest.mark.skipif(not has_cuda(), reason=cuda_skip_reason() or "no CUDA")
@pytest.mark.parametrize("case", GPU_CASES, ids=[c[0] for c in GPU_CASES])
def test_dh0_only_matches_full_backward_cuda(case):
    _, B, T, H, HV, cu = case
    N = B if cu is None else len(cu) - 1
    t = _inputs(B, T, H, HV, 128, 128, N, torch.bfloat16, True, False)
    q, k, v, g, beta, A_log, dt_bias, h0, d_o, dht = (None if x is None else x.cuda() for x in t)
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32, device="cuda")
    cu_cpu = None if cu is None else torch.tensor(cu, dtype=torch.int64)
    flags = ops.pack_flags(True, True, True, False, False)
    args = (q, k, v, g, beta, A_log, dt_bias, h0, cu_t, cu_cpu, d_o, dht, 0.0, flags, _lib.BACKEND_CUDA)
    full = ops.bwd_impl(*args)
    alone = ops.bwd_impl(*args, dh0_only=True)
    assert all(x is None for i, x in enumerate(alone) if i != 5)
    assert torch.equal(alone[5], full[5]), "dh0 alone differs from the full backward's"
