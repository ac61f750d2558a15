"""Where flashqla's chunk_gated_delta_rule could silently differ from FLA's
(found by the session-28 audit), and flashqla.fla's binding of FLA's
positional arguments, which differ between FLA 0.5 and 0.6 past
cu_seqlens_cpu. CPU only; FLA itself is not needed (a stand-in module plays
its chunk.py)."""

import sys
import types

import pytest
import torch

import flashqla
import flashqla.fla as qfla
from conftest import make_inputs, naive, rel


def test_scale_zero_raises_instead_of_the_default():
    # the C API reads 0 as the default 1 / sqrt(K); FLA's 0 gives o = 0
    x = make_inputs(1, 20, 1, 2, 32, 32)
    with pytest.raises(ValueError, match="scale = 0"):
        flashqla.chunk_gated_delta_rule(**x, scale=0.0)
    ok, why = qfla.verify_call(**x, scale=0.0)
    assert not ok and "scale = 0" in why


def test_tensor_scale_is_read_by_value_on_every_call():
    x = make_inputs(1, 20, 1, 2, 32, 32)
    s = torch.tensor(0.5)
    flashqla.chunk_gated_delta_rule(**x, scale=s)  # a fast-path entry for this signature
    s.fill_(2.0)
    for scale in (s, 2.0):
        o, _ = flashqla.chunk_gated_delta_rule(**x, scale=scale)
        no, _ = naive(**x, scale=2.0)
        assert rel(o, no) < 1e-5, scale


def test_neg_eigval_without_the_sigmoid_raises_as_fla():
    x = make_inputs(1, 20, 1, 2, 32, 32)
    with pytest.raises(ValueError, match="allow_neg_eigval"):
        flashqla.chunk_gated_delta_rule(**x, allow_neg_eigval=True)
    ok, _ = qfla.verify_call(**x, allow_neg_eigval=True)
    assert not ok
    o, _ = flashqla.chunk_gated_delta_rule(**x, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True)
    no, _ = naive(**x, use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True)
    assert rel(o, no) < 1e-5


def _stand_in(monkeypatch, fifteenth):
    """A loaded fla.ops.gated_delta_rule.chunk whose chunk_gated_delta_rule has
    FLA 0.5's (cp_context) or 0.6's (chunk_indices) 15th positional parameter."""
    src = ("def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None,\n"
           "        output_final_state=False, use_qk_l2norm_in_kernel=False,\n"
           "        use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False, state_v_first=False,\n"
           "        cu_seqlens=None, cu_seqlens_cpu=None, %s=None, **kwargs):\n"
           "    pass\n" % fifteenth)
    mod = types.ModuleType("fla.ops.gated_delta_rule.chunk")
    exec(src, mod.__dict__)
    monkeypatch.setitem(sys.modules, "fla.ops.gated_delta_rule.chunk", mod)


def _positional(x, fifteenth_value):
    return (x["q"], x["k"], x["v"], x["g"], x["beta"], None, None, False, False, False, False, False,
            None, None, fifteenth_value)


def test_fifteenth_positional_is_bound_by_the_loaded_fla(monkeypatch):
    x = make_inputs(1, 20, 1, 2, 32, 32)
    _stand_in(monkeypatch, "cp_context")  # FLA 0.5: a CP context there must be seen and refused
    ok, why = qfla.verify_call(*_positional(x, object()))
    assert not ok and "cp_context" in why
    _stand_in(monkeypatch, "chunk_indices")  # FLA 0.6: chunk indices are ignored, the call runs
    ok, why = qfla.verify_call(*_positional(x, torch.zeros(1, 2, dtype=torch.int64)))
    assert ok, why


def test_fifteenth_positional_without_fla_loaded_is_refused(monkeypatch):
    monkeypatch.delitem(sys.modules, "fla.ops.gated_delta_rule.chunk", raising=False)
    x = make_inputs(1, 20, 1, 2, 32, 32)
    ok, why = qfla.verify_call(*_positional(x, None))
    assert not ok and "by name" in why
    ok, why = qfla.verify_call(*_positional(x, None)[:14])  # up to cu_seqlens_cpu: the same in both
    assert ok, why


@pytest.mark.parametrize("case", ["v_rank", "cu_int16", "q_uint8", "g_none", "k_list"])
def test_bad_arguments_are_named(case):
    x = make_inputs(1, 20, 1, 2, 32, 32)
    kw = {}
    if case == "v_rank":
        x["v"] = x["v"][0]
        name = "v"
    elif case == "cu_int16":
        kw["cu_seqlens"] = torch.tensor([0, 20], dtype=torch.int16)
        name = "cu_seqlens"
    elif case == "q_uint8":
        x["q"] = x["q"].to(torch.uint8)
        name = "q"
    elif case == "g_none":
        x["g"] = None
        name = "g"
    else:
        x["k"] = x["k"].tolist()
        name = "k"
    with pytest.raises((TypeError, ValueError), match=f"flashqla: {name}"):
        flashqla.chunk_gated_delta_rule(**x, **kw)


def _pool_inputs(B, T, H=1, HV=2, K=16, V=16, P=4):
    q = torch.randn(B, T, H, K)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K), dim=-1)
    v = torch.randn(B, T, HV, V)
    a, b = torch.randn(B, T, HV), torch.randn(B, T, HV)
    pool = torch.randn(P, HV, K, V)
    return q, k, v, a, b, pool


def test_serving_options_raise_as_chunk():
    q, k, v, a, b, pool = _pool_inputs(2, 1)
    slots = torch.tensor([0, 2])
    with pytest.raises(ValueError, match="allow_neg_eigval"):
        flashqla.decode(q, k, v, a, b, None, None, pool, slots, use_beta_sigmoid_in_kernel=False,
                        allow_neg_eigval=True)
    with pytest.raises(ValueError, match="scale = 0"):
        flashqla.decode(q, k, v, a, b, None, None, pool, slots, scale=0.0)
    with pytest.raises(ValueError, match="flashqla: slots"):
        flashqla.decode(q, k, v, a, b, None, None, pool, slots.to(torch.int16))
    with pytest.raises(TypeError, match="flashqla: slots"):
        flashqla.decode(q, k, v, a, b, None, None, pool, [0, 2])


def test_serving_tensor_scale_is_read_by_value():
    q, k, v, a, b, pool = _pool_inputs(2, 1)
    slots = torch.tensor([0, 2])
    s = torch.tensor(0.5)
    flashqla.decode(q, k, v, a, b, None, None, pool.clone(), slots, scale=s)  # a fast-path entry
    s.fill_(2.0)
    o1 = flashqla.decode(q, k, v, a, b, None, None, pool.clone(), slots, scale=s)
    o2 = flashqla.decode(q, k, v, a, b, None, None, pool.clone(), slots, scale=2.0)
    o3 = flashqla.decode(q, k, v, a, b, None, None, pool.clone(), slots, scale=0.5)
    assert torch.equal(o1, o2) and not torch.equal(o1, o3)


def test_serving_empty_calls_are_no_ops():
    q, k, v, a, b, pool = _pool_inputs(0, 1)
    before = pool.clone()
    o = flashqla.decode(q, k, v, a, b, None, None, pool, torch.zeros(0, dtype=torch.int64))
    assert o.shape == v.shape and torch.equal(pool, before)
    q, k, v, a, b, pool = _pool_inputs(2, 0)
    before = pool.clone()
    o = flashqla.verify(q, k, v, a, b, None, None, pool, torch.tensor([0, 1]),
                        step_slots=torch.empty(2, 0, dtype=torch.int64))
    assert o.shape == v.shape and torch.equal(pool, before)
