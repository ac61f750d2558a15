"""torch.compile(fullgraph=True) on CPU: the custom ops trace without graph
breaks (fake implementations give the shapes), and compiled forward,
backward, decode and verify equal eager."""

import pytest
import torch

import flashqla
from conftest import make_inputs

torch._dynamo.config.cache_size_limit = 64


def _fresh(x, grad):
    return {n: t.detach().clone().requires_grad_(grad) for n, t in x.items()}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["cpu", "reference"])
def test_compiled_forward_backward_equals_eager(dtype):
    x = make_inputs(1, 70, 2, 4, 32, 32, h0=True)
    x = {n: t.to(dtype) for n, t in x.items()}

    def layer(q, k, v, g, beta, initial_state):
        o, ht = flashqla.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=initial_state,
                                                output_final_state=True,
                                                use_qk_l2norm_in_kernel=True)
        return (o * 2).sum() + ht.square().sum(), o

    # aot_eager traces exactly what inductor would (dynamo, fake tensors, the
    # autograd formula) without compiling C++ for the surrounding ops, which
    # takes a minute on two cores; the tests below use inductor
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    xe, xc = _fresh(x, True), _fresh(x, True)
    le, oe = layer(**xe)
    lc, oc = compiled(**xc)
    assert torch.equal(oe, oc)
    le.backward()
    lc.backward()
    for n in x:
        assert torch.allclose(xe[n].grad, xc[n].grad, rtol=1e-6, atol=1e-6), n


def test_compiled_varlen_gate_in_kernel():
    cu = torch.tensor([0, 10, 45, 64])
    x = make_inputs(1, 64, 1, 2, 32, 32, h0=True, N=3)
    A_log, dt_bias = torch.randn(2), torch.randn(2)
    x["g"] = torch.randn(1, 64, 2)

    def f(q, k, v, g, beta, initial_state):
        return flashqla.chunk_gated_delta_rule(
            q, k, v, g, beta, initial_state=initial_state, output_final_state=True,
            use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias, cu_seqlens=cu,
            state_v_first=True)

    c = torch.compile(f, fullgraph=True)
    e = f(**x)
    r = c(**x)
    assert torch.equal(e[0], r[0]) and torch.equal(e[1], r[1])


def test_compiled_decode_and_verify():
    B, H, HV, K, V, P = 3, 2, 4, 32, 32, 8
    A_log, dt_bias = torch.rand(HV), torch.randn(HV)
    pool = torch.randn(P, HV, V, K)
    slots = torch.tensor([5, -1, 2])
    q, k = torch.randn(B, 1, H, K), torch.randn(B, 1, H, K)
    v, a, b = torch.randn(B, 1, HV, V), torch.randn(B, 1, HV), torch.randn(B, 1, HV)

    def step(q, k, v, a, b, pool):
        return flashqla.decode(q, k, v, a, b, A_log, dt_bias, pool, slots, state_v_first=True)

    pe, pc = pool.clone(), pool.clone()
    oe = step(q, k, v, a, b, pe)
    oc = torch.compile(step, fullgraph=True)(q, k, v, a, b, pc)
    assert torch.equal(oe, oc) and torch.equal(pe, pc)

    T = 3
    qv, kv = torch.randn(B, T, H, K), torch.randn(B, T, H, K)
    vv, av, bv = torch.randn(B, T, HV, V), torch.randn(B, T, HV), torch.randn(B, T, HV)

    def ver(q, k, v, a, b, pool, steps):
        return flashqla.verify(q, k, v, a, b, A_log, dt_bias, pool, slots, step_states=steps,
                               state_v_first=True)

    se, sc = torch.zeros(B, T, HV, V, K), torch.zeros(B, T, HV, V, K)
    oe = ver(qv, kv, vv, av, bv, pool, se)
    oc = torch.compile(ver, fullgraph=True)(qv, kv, vv, av, bv, pool, sc)
    assert torch.equal(oe, oc) and torch.equal(se, sc)


def test_opcheck():
    """torch.library's own consistency checks of the registered ops (schema,
    fake implementation, autograd registration)."""
    x = make_inputs(1, 9, 1, 2, 8, 8, dtype=torch.float64, h0=True)
    x = {n: t.double().requires_grad_() for n, t in x.items()}
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"], None, None, x["initial_state"], None, None,
            0.0, 0, True, -1)
    torch.library.opcheck(torch.ops.flashqla.fwd.default, args)
