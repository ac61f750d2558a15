"""flashqla.fla: the backend in FLA's registry, exercised through FLA's own
public chunk_gated_delta_rule on CPU tensors (FLA's Triton code has no CPU
path, so every call FLA makes here must be flashqla's, or a test double's)."""

import os

import pytest
import torch

import flashqla
import flashqla.fla as qfla
from conftest import make_inputs, naive, rel

fla_gdr = pytest.importorskip("fla.ops.gated_delta_rule", reason="flash-linear-attention not installed")
if os.environ.get("FLA_DISABLE_BACKEND_DISPATCH") == "1":
    pytest.skip("FLA_DISABLE_BACKEND_DISPATCH=1 bypasses FLA's registry", allow_module_level=True)


@pytest.fixture
def enabled(monkeypatch):
    monkeypatch.delenv(qfla.ENV_VAR, raising=False)
    calls = []
    real = qfla.run_call

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(qfla, "run_call", spy)
    qfla.enable()
    yield calls
    qfla.disable()


def _register_recorder(priority=2):
    base, registry = qfla._registry()

    class RecorderBackend(base):
        backend_type = "flashqla_test_recorder"
        package_name = None
        env_var = None
        calls = []

        def chunk_gated_delta_rule(self, *args, **kwargs):
            RecorderBackend.calls.append((args, kwargs))
            return "fallback"

    RecorderBackend.priority = priority
    registry.register(RecorderBackend())
    return RecorderBackend, registry


def test_fla_call_runs_on_flashqla(enabled):
    x = make_inputs(1, 80, 2, 4, 64, 64, h0=True)
    o, ht = fla_gdr.chunk_gated_delta_rule(**x, output_final_state=True)
    assert len(enabled) == 1
    ro, rht = flashqla.chunk_gated_delta_rule(**x, output_final_state=True)
    assert torch.equal(o, ro) and torch.equal(ht, rht)


def test_fla_positional_order(enabled):
    """FLA's positional order (use_beta_sigmoid_in_kernel 10th,
    state_v_first 12th) is bound by name, not by flashqla's order."""
    B, T, H, HV, K, V = 1, 12, 1, 2, 16, 16
    x = make_inputs(B, T, H, HV, K, V, dtype=torch.float64, h0=True, v_first=True)
    x = {n: t.double() for n, t in x.items()}
    x["beta"] = torch.randn(B, T, HV, dtype=torch.float64)
    o, ht = fla_gdr.chunk_gated_delta_rule(
        x["q"], x["k"], x["v"], x["g"], x["beta"], None, x["initial_state"], True,
        False, True, False, True)
    no, nht = naive(**x, use_beta_sigmoid_in_kernel=True, state_v_first=True)
    assert len(enabled) == 1
    assert rel(o, no) < 1e-12 and rel(ht, nht) < 1e-12


def test_fla_gate_in_kernel_kwargs(enabled):
    B, T, H, HV, K, V = 1, 30, 1, 2, 64, 64
    x = make_inputs(B, T, H, HV, K, V)
    x["g"] = torch.randn(B, T, HV)
    A_log, dt_bias = torch.rand(HV), torch.randn(HV)
    o, _ = fla_gdr.chunk_gated_delta_rule(**x, use_gate_in_kernel=True, A_log=A_log,
                                          dt_bias=dt_bias, chunk_size=64)
    ro, _ = flashqla.chunk_gated_delta_rule(**x, use_gate_in_kernel=True, A_log=A_log,
                                            dt_bias=dt_bias)
    assert len(enabled) == 1 and torch.equal(o, ro)


def test_fla_autograd(enabled):
    x = make_inputs(1, 40, 1, 2, 32, 32, h0=True)
    xa = {n: t.clone().requires_grad_() for n, t in x.items()}
    xb = {n: t.clone().requires_grad_() for n, t in x.items()}
    o, ht = fla_gdr.chunk_gated_delta_rule(**xa, output_final_state=True)
    (o.sum() + ht.sum()).backward()
    o2, ht2 = flashqla.chunk_gated_delta_rule(**xb, output_final_state=True)
    (o2.sum() + ht2.sum()).backward()
    for n in x:
        assert torch.equal(xa[n].grad, xb[n].grad), n


@pytest.mark.parametrize("case", ["cp_context", "unknown_kwarg", "head_dim", "dtype_mismatch"])
def test_rejected_calls_fall_back(enabled, case):
    Recorder, registry = _register_recorder()
    try:
        x = make_inputs(1, 10, 1, 1, 64, 64)
        kw = {}
        if case == "cp_context":
            kw["cp_context"] = object()
        elif case == "unknown_kwarg":
            kw["transpose_state_layout"] = True
        elif case == "head_dim":  # the CPU backend covers K <= 256
            x = make_inputs(1, 10, 1, 1, 300, 64)
        elif case == "dtype_mismatch":
            x["k"] = x["k"].double()
        ok, why = qfla.verify_call(**x, **kw)
        assert not ok and why
        assert fla_gdr.chunk_gated_delta_rule(**x, **kw) == "fallback"
        assert len(Recorder.calls) == 1 and len(enabled) == 0
    finally:
        registry._backends.pop(Recorder.backend_type, None)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fp32_cuda_forward_calls_run_on_flashqla(enabled):
    # fp32 CUDA tensors take flashqla's chain route, faster than FLA's fp32
    # forward on every row measured: the verifier accepts a forward call; with
    # grad the CUDA backward (bf16 / fp16 only) declines it by name
    x = make_inputs(1, 130, 2, 4, 64, 64, device="cuda")
    ok, why = qfla.verify_call(**x)
    assert ok, why
    x["q"] = x["q"].requires_grad_()
    ok, why = qfla.verify_call(**x)
    assert not ok and why


def test_backward_support_is_checked_when_grad_is_needed(enabled):
    x = make_inputs(1, 10, 1, 1, 64, 64)
    ok, _ = qfla.verify_call(**x)
    assert ok
    # the reference covers K up to 1024 and the CPU backend up to 256: fp64
    # runs on the reference, both directions
    x64 = make_inputs(1, 4, 1, 1, 512, 8, dtype=torch.float64)
    x64 = {n: t.double() for n, t in x64.items()}
    assert qfla.verify_call(**x64)[0]
    x64["q"].requires_grad_()
    assert qfla.verify_call(**x64)[0]


def test_env_var_and_disable(monkeypatch):
    Recorder, registry = _register_recorder()
    try:
        x = make_inputs(1, 10, 1, 1, 64, 64)
        qfla.enable()
        assert qfla.enabled()
        monkeypatch.setenv(qfla.ENV_VAR, "0")
        assert fla_gdr.chunk_gated_delta_rule(**x) == "fallback"
        monkeypatch.delenv(qfla.ENV_VAR)
        assert fla_gdr.chunk_gated_delta_rule(**x) != "fallback"
        qfla.disable()
        assert not qfla.enabled()
        assert fla_gdr.chunk_gated_delta_rule(**x) == "fallback"
    finally:
        registry._backends.pop(Recorder.backend_type, None)
        qfla.disable()
