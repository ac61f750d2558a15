"""CUDA tensors: the sm_90a backend against the fp64 CPU reference and FLA's
Triton forward, FLA's dispatch to flashqla, and CUDA-graph capture. Skipped
(with the reason) where torch has no GPU or the library has no CUDA backend."""


import math

import pytest
import torch

import flashqla
from conftest import cuda_skip_reason, has_cuda, make_inputs, rel

pytestmark = pytest.mark.skipif(not has_cuda(), reason=cuda_skip_reason() or "no CUDA")

O_TOL = 5e-3     # bf16 inputs, fp32 state (docs/testing.md)
D_TOL = 8e-3     # dq, dk, dv, dh0
DG_TOL = 2e-2    # dg, dbeta


def _cuda(x, dtype=torch.bfloat16):
    out = {}
    for n, t in x.items():
        t = t.cuda()
        out[n] = t.to(dtype) if n in ("q", "k", "v") else t
    return out


def _ref(x, **kw):
    x64 = {n: t.detach().cpu().double() for n, t in x.items()}
    kw = {n: (v.cpu() if isinstance(v, torch.Tensor) else v) for n, v in kw.items()}
    return flashqla.chunk_gated_delta_rule(**x64, backend="reference", **kw)


CASES = [
    # (B, T, H, HV, K, V)
    (1, 1000, 2, 4, 128, 128),
    (2, 129, 4, 4, 128, 128),
    (1, 300, 2, 8, 64, 64),
]


@pytest.mark.parametrize("shape", CASES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("v_first", [False, True], ids=["KV", "VK"])
def test_forward_vs_reference(shape, v_first):
    B, T, H, HV, K, V = shape
    x = _cuda(make_inputs(B, T, H, HV, K, V, h0=True, v_first=v_first))
    try:
        o, ht = flashqla.chunk_gated_delta_rule(**x, output_final_state=True,
                                                state_v_first=v_first)
    except NotImplementedError as e:
        pytest.skip(f"not covered by the CUDA backend: {e}")
    torch.cuda.synchronize()
    ro, rht = _ref(x, output_final_state=True, state_v_first=v_first)
    assert o.dtype == torch.bfloat16 and ht.dtype == torch.float32
    assert rel(o, ro) < O_TOL
    assert rel(ht, rht) < O_TOL


def test_forward_fp32_vs_reference():
    """fp32 q/k/v run the recurrent kernel: docs/testing.md's 1e-4 for fp32 inputs."""
    x = _cuda(make_inputs(2, 150, 2, 4, 128, 128, h0=True), dtype=torch.float32)
    o, ht = flashqla.chunk_gated_delta_rule(**x, output_final_state=True, use_qk_l2norm_in_kernel=True)
    torch.cuda.synchronize()
    ro, rht = _ref(x, output_final_state=True, use_qk_l2norm_in_kernel=True)
    assert o.dtype == torch.float32
    assert rel(o, ro) < 1e-4
    assert rel(ht, rht) < 1e-4


def test_varlen_with_and_without_host_copy():
    cu = torch.tensor([0, 1, 100, 300, 1200, 2048])
    x = _cuda(make_inputs(1, 2048, 2, 4, 128, 128, h0=True, N=5))
    o1, h1 = flashqla.chunk_gated_delta_rule(**x, output_final_state=True, cu_seqlens=cu.cuda(),
                                             cu_seqlens_cpu=cu)
    o2, h2 = flashqla.chunk_gated_delta_rule(**x, output_final_state=True,
                                             cu_seqlens=cu.cuda().int())
    ro, rht = _ref(x, output_final_state=True, cu_seqlens=cu)
    assert rel(o1, ro) < O_TOL and rel(h1, rht) < O_TOL
    assert rel(o2, ro) < O_TOL and rel(h2, rht) < O_TOL


def test_backward_vs_reference():
    B, T, H, HV, K, V = 1, 200, 2, 4, 128, 128
    x = _cuda(make_inputs(B, T, H, HV, K, V, h0=True))
    x = {n: t.requires_grad_() for n, t in x.items()}
    try:
        o, ht = flashqla.chunk_gated_delta_rule(**x, output_final_state=True)
        do, dht = torch.randn_like(o), torch.randn_like(ht)
        ((o * do).float().sum() + (ht * dht).sum()).backward()
    except NotImplementedError as e:
        pytest.xfail(f"CUDA backward not available: {e}")
    x64 = {n: t.detach().cpu().double().requires_grad_() for n, t in x.items()}
    ro, rht = flashqla.chunk_gated_delta_rule(**x64, output_final_state=True, backend="reference")
    ((ro * do.cpu().double()).sum() + (rht * dht.cpu().double()).sum()).backward()
    for n, tol in (("q", D_TOL), ("k", D_TOL), ("v", D_TOL), ("initial_state", D_TOL),
                   ("g", DG_TOL), ("beta", DG_TOL)):
        assert rel(x[n].grad, x64[n].grad) < tol, n


def test_decode_and_verify_vs_cpu():
    B, H, HV, K, V, P, T = 5, 2, 8, 128, 128, 16, 3
    A_log, dt_bias = torch.rand(HV), torch.randn(HV)
    q, k = torch.randn(B, T, H, K), torch.randn(B, T, H, K)
    v, a, b = torch.randn(B, T, HV, V), torch.randn(B, T, HV), torch.randn(B, T, HV)
    pool = torch.randn(P, HV, V, K)
    slots = torch.tensor([3, -1, 0, 9, 12])
    cpu_pool = pool.clone()
    gpu_pool = pool.cuda()
    args = lambda dev, pl, t: (q[:, t:t + 1].to(dev).bfloat16(), k[:, t:t + 1].to(dev).bfloat16(),
                               v[:, t:t + 1].to(dev).bfloat16(), a[:, t:t + 1].to(dev),
                               b[:, t:t + 1].to(dev), A_log.to(dev), dt_bias.to(dev), pl,
                               slots.to(dev))
    try:
        og = flashqla.decode(*args("cuda", gpu_pool, 0), state_v_first=True)
    except NotImplementedError as e:
        pytest.skip(f"CUDA decode not available: {e}")
    oc = flashqla.decode(*args("cpu", cpu_pool, 0), state_v_first=True)
    assert rel(og, oc) < O_TOL and rel(gpu_pool, cpu_pool) < O_TOL
    assert torch.equal(gpu_pool[1].cpu(), pool[1])  # never-used slot untouched

    steps = torch.zeros(B, T, HV, V, K, device="cuda")
    ov = flashqla.verify(q.cuda().bfloat16(), k.cuda().bfloat16(), v.cuda().bfloat16(), a.cuda(),
                         b.cuda(), A_log.cuda(), dt_bias.cuda(), gpu_pool, slots.cuda(),
                         step_states=steps, state_v_first=True)
    steps_c = torch.zeros(B, T, HV, V, K)
    ovc = flashqla.verify(q.bfloat16(), k.bfloat16(), v.bfloat16(), a, b, A_log, dt_bias,
                          cpu_pool, slots, step_states=steps_c, state_v_first=True)
    assert rel(ov, ovc) < O_TOL and rel(steps, steps_c) < O_TOL


def test_cuda_graph_capture_decode():
    """Fixed-shape decode with -1 padding captured once, replayed on new data
    written into the same buffers: equals eager each time."""
    B, H, HV, K, V, P = 8, 2, 8, 128, 128, 32
    A_log, dt_bias = torch.rand(HV, device="cuda"), torch.randn(HV, device="cuda")
    buf = dict(q=torch.randn(B, 1, H, K, device="cuda", dtype=torch.bfloat16),
               k=torch.randn(B, 1, H, K, device="cuda", dtype=torch.bfloat16),
               v=torch.randn(B, 1, HV, V, device="cuda", dtype=torch.bfloat16),
               a=torch.randn(B, 1, HV, device="cuda"), b=torch.randn(B, 1, HV, device="cuda"))
    slots = torch.full((B,), -1, dtype=torch.int64, device="cuda")
    pool = torch.randn(P, HV, V, K, device="cuda")
    out = torch.empty(B, 1, HV, V, device="cuda", dtype=torch.bfloat16)

    def step():
        flashqla.decode(buf["q"], buf["k"], buf["v"], buf["a"], buf["b"], A_log, dt_bias, pool,
                        slots, state_v_first=True, out=out)

    try:
        step()  # warm-up (contexts, workspace pool) outside capture
    except NotImplementedError as e:
        pytest.skip(f"CUDA decode not available: {e}")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s), torch.cuda.graph(graph):
        step()
    torch.cuda.current_stream().wait_stream(s)
    for rnd in range(3):
        for t in buf.values():
            t.copy_(torch.randn_like(t, dtype=torch.float32))
        slots.copy_(torch.tensor([5, -1, 7, 2 + rnd, -1, 20, 21, 30]))
        pool_eager = pool.clone()
        o_eager = flashqla.decode(buf["q"], buf["k"], buf["v"], buf["a"], buf["b"], A_log,
                                  dt_bias, pool_eager, slots, state_v_first=True)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, o_eager) and torch.equal(pool, pool_eager)


def test_cuda_graph_capture_prefill():
    cu_cpu = torch.tensor([0, 100, 450, 512])
    x = _cuda(make_inputs(1, 512, 2, 4, 128, 128, h0=True, N=3))
    cu = cu_cpu.cuda()
    res = {}

    def run():
        res["o"], res["h"] = flashqla.chunk_gated_delta_rule(**x, output_final_state=True,
                                                             cu_seqlens=cu, cu_seqlens_cpu=cu_cpu)

    try:
        run()
    except NotImplementedError as e:
        pytest.skip(f"CUDA forward not available: {e}")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s), torch.cuda.graph(graph):
        run()
    torch.cuda.current_stream().wait_stream(s)
    for _ in range(2):
        for n, t in x.items():
            new = make_inputs(1, 512, 2, 4, 128, 128, h0=True, N=3)[n]
            t.copy_(new.to(t.dtype))
        o, h = flashqla.chunk_gated_delta_rule(**x, output_final_state=True, cu_seqlens=cu,
                                               cu_seqlens_cpu=cu_cpu)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(res["o"], o) and torch.equal(res["h"], h)


def test_torch_compile_cuda():
    x = _cuda(make_inputs(1, 256, 2, 4, 128, 128, h0=True))
    f = lambda q, k, v, g, beta, initial_state: flashqla.chunk_gated_delta_rule(
        q, k, v, g, beta, initial_state=initial_state, output_final_state=True)
    try:
        e = f(**x)
    except NotImplementedError as err:
        pytest.skip(f"CUDA forward not available: {err}")
    c = torch.compile(f, fullgraph=True)(**x)
    assert torch.equal(e[0], c[0]) and torch.equal(e[1], c[1])


# --------------------------------------------------------------- FLA

def _fla():
    try:
        import fla.ops.gated_delta_rule as m
        return m
    except Exception as e:  # noqa: BLE001  (ImportError, or triton failing to start)
        pytest.skip(f"flash-linear-attention not usable: {e}")


def test_vs_fla_triton_forward(monkeypatch):
    fla_gdr = _fla()
    import flashqla.fla as qfla
    qfla.disable()
    monkeypatch.setenv("FLA_FLASH_QLA", "0")  # FLA's own TileLang FlashQLA backend, if installed
    B, T, H, HV, K, V = 1, 1024, 4, 8, 128, 128
    x = _cuda(make_inputs(B, T, H, HV, K, V, h0=True))
    fo, fh = fla_gdr.chunk_gated_delta_rule(**x, output_final_state=True)
    o, h = flashqla.chunk_gated_delta_rule(**x, output_final_state=True)
    ro, rh = _ref(x, output_final_state=True)
    err_fla, err_ours = rel(fo, ro), rel(o, ro)
    print(f"rel error vs fp64: o flashqla {err_ours:.2e} FLA {err_fla:.2e}; "
          f"state flashqla {rel(h, rh):.2e} FLA {rel(fh, rh):.2e}")
    assert err_ours < O_TOL and rel(h, rh) < O_TOL
    assert rel(o, fo) < 2 * O_TOL


def test_within_twice_fla_error(monkeypatch):
    """docs/testing.md's other bound: at most 2x the error of a straightforward
    same-precision implementation (FLA's Triton forward), on its unforgiving
    input: no decay, beta in {0, 1, 1.99}, unit keys. There the error grows
    with T for every bf16 implementation, past 5e-3 after a few hundred
    tokens (measured on the H200: flashqla 8.6e-3, FLA 8.8e-3 at T = 4096), so
    this input is held to the relative bound only."""
    fla_gdr = _fla()
    import flashqla.fla as qfla
    qfla.disable()
    monkeypatch.setenv("FLA_FLASH_QLA", "0")
    T = 2048
    x = make_inputs(1, T, 4, 4, 128, 128, h0=True)
    u = torch.rand(1, T, 4)
    x["beta"] = torch.where(u < 0.3, 0.0, torch.where(u < 0.6, 1.0, 1.99))
    x["g"] = torch.zeros(1, T, 4)
    x = _cuda(x)
    fo, fh = fla_gdr.chunk_gated_delta_rule(**x, output_final_state=True)
    o, h = flashqla.chunk_gated_delta_rule(**x, output_final_state=True)
    ro, rh = _ref(x, output_final_state=True)
    errs = dict(o=(rel(o, ro), rel(fo, ro)), state=(rel(h, rh), rel(fh, rh)))
    print("rel error vs fp64 (flashqla, FLA): " + ", ".join(f"{n} {a:.2e} {b:.2e}" for n, (a, b) in errs.items()))
    for name, (ours, fla) in errs.items():
        assert math.isfinite(ours) and ours <= 2 * fla, name


def test_reset_gate():
    """A log decay of -inf (a reset) at token 300 of 1000: the state before it
    is forgotten exactly; on the GPU it once gave inf (a regression test)."""
    x = make_inputs(1, 1000, 2, 4, 128, 128, h0=True)
    x["g"][:, 300] = float("-inf")
    x = _cuda(x)
    o, h = flashqla.chunk_gated_delta_rule(**x, output_final_state=True)
    ro, rh = _ref(x, output_final_state=True)
    assert rel(o, ro) < O_TOL and rel(h, rh) < O_TOL


def test_through_fla_dispatch(monkeypatch):
    fla_gdr = _fla()
    import flashqla.fla as qfla
    calls = []
    real = qfla.run_call
    monkeypatch.setattr(qfla, "run_call", lambda *a, **k: calls.append(1) or real(*a, **k))
    qfla.enable()
    try:
        x = _cuda(make_inputs(1, 300, 2, 4, 128, 128, h0=True))
        o, h = fla_gdr.chunk_gated_delta_rule(**x, output_final_state=True,
                                              use_qk_l2norm_in_kernel=True)
        ro, rh = flashqla.chunk_gated_delta_rule(**x, output_final_state=True,
                                                 use_qk_l2norm_in_kernel=True)
        assert calls and torch.equal(o, ro) and torch.equal(h, rh)
    finally:
        qfla.disable()
