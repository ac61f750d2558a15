"""The eager fast paths of chunk_gated_delta_rule and decode (a call whose
signature was seen before reuses the cached packing): the same results,
output tensors and errors as the general path, the general path whenever a
conversion or a gradient is needed, and a fresh output per call."""

import pytest
import torch

import flashqla
from flashqla import chunk, ops, serving
from conftest import make_inputs


@pytest.fixture(autouse=True)
def _empty_caches():
    def clear():
        for m in (chunk, serving):
            m._FAST.clear()
            m._LAST[0] = ((), None)
    clear()
    yield
    clear()


@pytest.fixture
def no_general_path(monkeypatch):
    """Makes the general paths raise: a call that still works took the fast path."""
    def fail(*a, **kw):
        raise AssertionError("general path taken")
    def arm():
        monkeypatch.setattr(chunk, "prepare", fail)
        monkeypatch.setattr(serving, "_prepare", fail)
    return arm


def _general_fwd(kw):
    """The general path's result for the same call (prepare + fwd_impl)."""
    args = chunk.prepare(kw["q"], kw["k"], kw["v"], kw["g"], kw["beta"], kw.get("scale"),
                         kw.get("initial_state"), kw.get("output_final_state", False),
                         kw.get("use_qk_l2norm_in_kernel", False),
                         kw.get("use_gate_in_kernel", False), kw.get("A_log"), kw.get("dt_bias"),
                         kw.get("use_beta_sigmoid_in_kernel", False),
                         kw.get("allow_neg_eigval", False), kw.get("state_v_first", False),
                         kw.get("cu_seqlens"), kw.get("cu_seqlens_cpu"), None, kw.get("backend"))
    o, ht = ops.fwd_impl(*args)
    return o, (ht if kw.get("output_final_state") else None)


def _same_tensor(a, b):
    if a is None or b is None:
        return a is None and b is None
    return (a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype
            and a.device == b.device and not a.requires_grad and torch.equal(a, b))


def _fwd_case(name):
    B, T, H, HV, K, V = 2, 37, 2, 4, 32, 16
    x = make_inputs(B, T, H, HV, K, V, h0=name in ("h0", "h0_v_first", "strided"),
                    v_first=name == "h0_v_first")
    x["output_final_state"] = name != "no_state"
    if name == "h0_v_first":
        x["state_v_first"] = True
    if name == "gate":
        x.update(use_gate_in_kernel=True, A_log=torch.rand(HV), dt_bias=torch.randn(HV),
                 use_beta_sigmoid_in_kernel=True, allow_neg_eigval=True, scale=0.25,
                 use_qk_l2norm_in_kernel=True)
    if name == "varlen":
        x = make_inputs(1, 50, H, HV, K, V, h0=True, N=3)
        x.update(cu_seqlens=torch.tensor([0, 7, 7, 50]), output_final_state=True)
    if name == "strided":
        # q, k, v as slices of one fused projection, h0 with a strided batch
        qkv = torch.randn(B, T, 2 * H * K + HV * V)
        x["q"] = qkv[..., :H * K].view(B, T, H, K)
        x["k"] = torch.nn.functional.normalize(qkv[..., H * K:2 * H * K], dim=-1).view(B, T, H, K)
        x["v"] = qkv[..., 2 * H * K:].view(B, T, HV, V)
        x["initial_state"] = torch.randn(2 * B, HV, K, V)[::2]
    if name == "single_token":
        x = make_inputs(1, 1, 1, 1, K, V, h0=True)
        x["output_final_state"] = True
    return x


def _redraw(x):
    """Fresh values, same signature (shapes, strides, dtypes, devices)."""
    y = {}
    for n, t in x.items():
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            u = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype)
            u.copy_(torch.randn(t.shape) if n != "beta" else torch.rand(t.shape))
            if n in ("g",):
                u = u.abs().neg()
            y[n] = u
        else:
            y[n] = t
    return y


FWD_CASES = ["h0", "no_state", "no_h0", "h0_v_first", "gate", "varlen", "strided", "single_token"]


@pytest.fixture(params=["cpu_allocator", "fallback"])
def allocator(request, monkeypatch):
    """The fast paths' CPU outputs come from torch's private
    empty_strided_cpu when it exists, else from empty_like / torch.empty."""
    if request.param == "fallback":
        monkeypatch.setattr(ops, "empty_strided_cpu", None)
    elif ops.empty_strided_cpu is None:
        pytest.skip("this torch has no torch._C._dynamo.guards._empty_strided_cpu")
    return request.param


@pytest.mark.parametrize("case", FWD_CASES)
def test_forward_fast_path_equals_general_path(case, allocator, no_general_path):
    x = _fwd_case(case)
    first = flashqla.chunk_gated_delta_rule(**x)        # general path, fills the cache
    assert len(chunk._FAST) == 1
    y = _redraw(x)
    want = _general_fwd(y)
    no_general_path()
    got = flashqla.chunk_gated_delta_rule(**y)
    for a, b in zip(got, want):
        assert _same_tensor(a, b)
    # and again with the first inputs: nothing carried over between calls
    again = flashqla.chunk_gated_delta_rule(**x)
    for a, b in zip(again, first):
        assert _same_tensor(a, b)
    assert again[0].data_ptr() != first[0].data_ptr()   # a fresh output per call


def test_forward_conversions_are_not_cached():
    x = make_inputs(1, 20, 1, 2, 32, 32, h0=True)
    x["g"] = x["g"].double()                            # cast to fp32 by the wrapper
    x["initial_state"] = x["initial_state"].transpose(-1, -2).contiguous().transpose(-1, -2)
    o1, s1 = flashqla.chunk_gated_delta_rule(**x, output_final_state=True)
    assert len(chunk._FAST) == 0
    x["g"] = x["g"].float()
    o2, s2 = flashqla.chunk_gated_delta_rule(**x, output_final_state=True)
    assert torch.equal(o1, o2) and torch.equal(s1, s2)
    assert len(chunk._FAST) == 0                        # h0 still copied
    # gate in kernel without dt_bias: the wrapper makes the zero bias
    y = make_inputs(1, 20, 1, 2, 32, 32)
    flashqla.chunk_gated_delta_rule(**y, use_gate_in_kernel=True, A_log=torch.rand(2))
    assert len(chunk._FAST) == 0


def test_forward_gradients_after_a_cached_call():
    x = make_inputs(1, 30, 2, 2, 32, 32, h0=True)
    o0, _ = flashqla.chunk_gated_delta_rule(**x, output_final_state=True)
    assert len(chunk._FAST) == 1
    q = x["q"].clone().requires_grad_()
    o, ht = flashqla.chunk_gated_delta_rule(**dict(x, q=q), output_final_state=True)
    assert o.requires_grad and torch.equal(o.detach(), o0)
    o.sum().backward()
    assert q.grad is not None and q.grad.abs().sum() > 0
    with torch.no_grad():                                # no gradient needed: fast path
        o2, _ = flashqla.chunk_gated_delta_rule(**dict(x, q=q), output_final_state=True)
    assert not o2.requires_grad and torch.equal(o2, o0)


def test_forward_errors_on_the_fast_path():
    # same signature, bad values: the library rejects them on every call
    x = make_inputs(1, 40, 1, 1, 32, 32)
    cu = torch.tensor([0, 10, 40])
    flashqla.chunk_gated_delta_rule(**x, cu_seqlens=cu)
    assert len(chunk._FAST) == 1
    with pytest.raises(ValueError):
        flashqla.chunk_gated_delta_rule(**x, cu_seqlens=torch.tensor([0, 30, 20]))
    with pytest.raises(ValueError):
        flashqla.chunk_gated_delta_rule(**x, cu_seqlens=torch.tensor([0, 10, 41]))
    # a different device or dtype is another signature: the general path's errors
    with pytest.raises(ValueError):
        flashqla.chunk_gated_delta_rule(**x, cu_seqlens=cu, backend="cuda")
    with pytest.raises(ValueError):
        flashqla.chunk_gated_delta_rule(**dict(x, q=x["q"].to("meta")), cu_seqlens=cu)
    with pytest.raises(NotImplementedError):
        flashqla.chunk_gated_delta_rule(**{n: t.to("meta") for n, t in x.items()},
                                        cu_seqlens=cu.to("meta"))
    assert len(chunk._FAST) == 1


def test_cache_is_bounded():
    for T in range(1, chunk._FAST_MAX + 5):
        x = make_inputs(1, T, 1, 1, 16, 16)
        flashqla.chunk_gated_delta_rule(**x)
    assert 0 < len(chunk._FAST) <= chunk._FAST_MAX


def _decode_case(name, v_first=False):
    B, H, HV, K, V, P = 3, 2, 4, 32, 16, 8
    x = make_inputs(B, 1, H, HV, K, V)
    q, k, v = x["q"], x["k"], x["v"]
    a, b = torch.randn(B, 1, HV), torch.randn(B, 1, HV)
    pool = torch.randn((P, HV, V, K) if v_first else (P, HV, K, V))
    slots = torch.tensor([5, -1, 2])
    kw = dict(state_v_first=v_first)
    A_log, dt_bias = torch.rand(HV), torch.randn(HV)
    if name == "squeezed":
        q, k, v, a, b = q[:, 0], k[:, 0], v[:, 0], a[:, 0], b[:, 0]
    if name == "squeezed_out":
        q, k, v, a, b = q[:, 0], k[:, 0], v[:, 0], a[:, 0], b[:, 0]
        kw["out"] = torch.empty(B + 2, HV, V)[1:B + 1]
    if name == "out":
        kw["out"] = torch.empty(B, 1, HV, V)
    if name == "precomputed":
        A_log = dt_bias = None
        a = -torch.rand(B, 1, HV)
        b = torch.rand(B, 1, HV)
        kw.update(use_beta_sigmoid_in_kernel=False, use_qk_l2norm_in_kernel=False, scale=0.5)
    return (q, k, v, a, b, A_log, dt_bias, pool, slots), kw


@pytest.mark.parametrize("case", ["plain", "squeezed", "squeezed_out", "out", "precomputed",
                                  "v_first"])
def test_decode_fast_path_equals_general_path(case, allocator, no_general_path):
    args, kw = _decode_case(case, v_first=case == "v_first")
    pool = args[7]
    flashqla.decode(*args, **kw)                     # general path, fills the cache
    assert len(serving._FAST) == 1
    # the same step from the same pool, general and fast
    fresh = [torch.randn_like(t) if t is not None and t.is_floating_point() and i < 5 else t
             for i, t in enumerate(args)]
    pool_general = pool.clone()
    serving._FAST.clear()
    serving._LAST[0] = ((), None)
    want = flashqla.decode(*fresh[:7], pool_general, fresh[8], **kw)
    want = want.clone()
    want_pool = pool_general.clone()
    no_general_path()
    pool_fast = pool.clone()
    fresh[7] = pool_fast
    got = flashqla.decode(*fresh, **kw)
    if "out" in kw:
        assert got is kw["out"]
    assert _same_tensor(got, want)
    assert torch.equal(pool_fast, want_pool)


def test_decode_conversions_are_not_cached():
    args, kw = _decode_case("plain")
    q, k, v, a, b, A_log, dt_bias, pool, slots = args
    flashqla.decode(q, k, v, a.double(), b.double(), A_log, dt_bias, pool, slots)
    flashqla.decode(q, k, v, a, b, A_log, None, pool, slots)        # zero dt_bias made
    flashqla.decode(q, k, v.transpose(-1, -2).contiguous().transpose(-1, -2), a, b, A_log,
                    dt_bias, pool, slots)
    assert len(serving._FAST) == 0


def test_decode_errors_on_the_fast_path():
    args, kw = _decode_case("plain")
    flashqla.decode(*args)
    assert len(serving._FAST) == 1
    bad = list(args)
    bad[8] = torch.tensor([5, 5, 2])                     # duplicate slot, same signature
    with pytest.raises(ValueError):
        flashqla.decode(*bad)
    bad[8] = torch.tensor([5, 8, 2])                     # out of the pool
    with pytest.raises(ValueError):
        flashqla.decode(*bad)


def test_fast_paths_from_several_threads():
    """Per-thread contexts: concurrent fast-path calls give each thread's
    own results."""
    import threading
    xs = [make_inputs(1, 33, 2, 2, 32, 32, h0=True) for _ in range(4)]
    want = [flashqla.chunk_gated_delta_rule(**x, output_final_state=True) for x in xs]
    errors = []

    def work(i):
        try:
            for _ in range(20):
                o, ht = flashqla.chunk_gated_delta_rule(**xs[i], output_final_state=True)
                assert torch.equal(o, want[i][0]) and torch.equal(ht, want[i][1])
        except Exception as e:      # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert len(chunk._FAST) == 1
