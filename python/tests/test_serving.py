"""flashqla.decode / flashqla.verify on CPU: serving conventions (state pool,
slots with -1 padding, raw gate inputs, [V, K] pools) against the chunked
forward of the same tokens."""

import pytest
import torch

import flashqla
from conftest import rel

H, HV, K, V = 2, 4, 64, 64


def _raw(B, T):
    """Raw serving inputs: q, k un-normalised (l2norm in the kernel), raw a, b."""
    return dict(q=torch.randn(B, T, H, K), k=torch.randn(B, T, H, K), v=torch.randn(B, T, HV, V),
                a=torch.randn(B, T, HV), b=torch.randn(B, T, HV))


def _prefill(x, A_log, dt_bias, h0, v_first):
    return flashqla.chunk_gated_delta_rule(
        x["q"], x["k"], x["v"], x["a"], x["b"], initial_state=h0, output_final_state=True,
        use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias,
        use_beta_sigmoid_in_kernel=True, state_v_first=v_first)


@pytest.mark.parametrize("v_first", [False, True], ids=["KV", "VK"])
@pytest.mark.parametrize("pool_dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_prefill_then_decode_equals_longer_prefill(v_first, pool_dtype):
    """prefill(L) then N decode steps == prefill(L + N), per sequence, with
    padding slots untouched."""
    B, L, N, P = 3, 20, 4, 7
    A_log, dt_bias = torch.rand(HV), torch.randn(HV)
    x = _raw(B, L + N)
    h0 = torch.randn(B, HV, V, K) if v_first else torch.randn(B, HV, K, V)
    o_full, h_full = _prefill(x, A_log, dt_bias, h0, v_first)
    head = {n: t[:, :L] for n, t in x.items()}
    o_head, h_head = _prefill(head, A_log, dt_bias, h0, v_first)

    pool = torch.randn((P,) + h_head.shape[1:]).to(pool_dtype)
    slots = torch.tensor([4, -1, 1, 6, -1])  # rows 0, 2, 3 -> slots 4, 1, 6; two pads
    seqs = [0, None, 1, 2, None]
    for i, s in enumerate(seqs):
        if s is not None:
            pool[slots[i]] = h_head[s].to(pool_dtype)
    untouched = [p for p in range(P) if p not in (4, 1, 6)]
    before = pool.clone()

    outs = []
    for t in range(L, L + N):
        step = {}
        for n, tensor in x.items():
            rows = [tensor[s, t] if s is not None else torch.randn_like(tensor[0, t]) for s in seqs]
            step[n] = torch.stack(rows).unsqueeze(1)
        o = flashqla.decode(step["q"], step["k"], step["v"], step["a"], step["b"], A_log,
                            dt_bias, pool, slots, state_v_first=v_first)
        assert o.shape == (5, 1, HV, V)
        assert torch.all(o[1] == 0) and torch.all(o[4] == 0)  # padding rows are zeros
        outs.append(o[[0, 2, 3], 0])
    o_dec = torch.stack(outs, 1)

    tol = 1e-4 if pool_dtype == torch.float32 else 2e-2
    assert rel(o_dec, o_full[:, L:]) < tol
    for i, s in enumerate(seqs):
        if s is not None:
            assert rel(pool[slots[i]].float(), h_full[s]) < tol
    for p in untouched:
        assert torch.equal(pool[p], before[p])


def test_decode_squeezed_shapes_and_out_buffer():
    B, P = 4, 6
    A_log, dt_bias = torch.rand(HV), torch.randn(HV)
    x = _raw(B, 1)
    pool = torch.randn(P, HV, K, V)
    slots = torch.tensor([3, 0, -1, 5], dtype=torch.int32)
    p1, p2 = pool.clone(), pool.clone()
    o1 = flashqla.decode(x["q"], x["k"], x["v"], x["a"], x["b"], A_log, dt_bias, p1, slots)
    out = torch.full((B, HV, V), float("nan"))
    o2 = flashqla.decode(x["q"][:, 0], x["k"][:, 0], x["v"][:, 0], x["a"][:, 0], x["b"][:, 0],
                         A_log, dt_bias, p2, slots, out=out)
    assert o2 is out and o2.shape == (B, HV, V)
    assert torch.equal(o1[:, 0], o2) and torch.equal(p1, p2)


def test_decode_precomputed_gate_and_beta():
    """A_log=None: `a` is the log decay itself; use_beta_sigmoid_in_kernel=False:
    `b` is beta itself. Same as the chunked forward with no transforms."""
    B, P = 2, 3
    q, k = torch.randn(B, 1, H, K), torch.nn.functional.normalize(torch.randn(B, 1, H, K), dim=-1)
    v, g, beta = torch.randn(B, 1, HV, V), -torch.rand(B, 1, HV), torch.rand(B, 1, HV)
    h0 = torch.randn(B, HV, K, V)
    pool = torch.zeros(P, HV, K, V)
    pool[[2, 0]] = h0
    o = flashqla.decode(q, k, v, g, beta, None, None, pool, torch.tensor([2, 0]),
                        use_qk_l2norm_in_kernel=False, use_beta_sigmoid_in_kernel=False)
    ro, rh = flashqla.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                             output_final_state=True)
    assert rel(o, ro) < 1e-5 and rel(pool[[2, 0]], rh) < 1e-5


@pytest.mark.parametrize("mode", ["step_states", "step_slots"])
def test_verify_matches_sequential_decode(mode):
    B, T, P = 3, 4, 20
    A_log, dt_bias = torch.rand(HV), torch.randn(HV)
    x = _raw(B, T)
    pool = torch.randn(P, HV, V, K)
    slots = torch.tensor([7, -1, 2])
    ref_pool = pool.clone()
    ref_o, ref_states = [], []
    for t in range(T):
        o = flashqla.decode(*(x[n][:, t:t + 1] for n in ("q", "k", "v", "a", "b")), A_log,
                            dt_bias, ref_pool, slots, state_v_first=True)
        ref_o.append(o)
        ref_states.append(ref_pool[[7, 2]].clone())
    ref_o = torch.cat(ref_o, 1)
    ref_states = torch.stack(ref_states, 1)  # [2, T, HV, V, K]

    before = pool.clone()
    if mode == "step_states":
        steps = torch.full((B, T, HV, V, K), float("nan"))
        o = flashqla.verify(x["q"], x["k"], x["v"], x["a"], x["b"], A_log, dt_bias, pool, slots,
                            step_states=steps, state_v_first=True)
        got = steps[[0, 2]]
        assert torch.equal(pool, before)  # verify never writes the pool rows it reads
    else:
        step_slots = torch.tensor([[8, 9, 10, 11], [-1, -1, -1, -1], [12, 13, -1, 15]])
        o = flashqla.verify(x["q"], x["k"], x["v"], x["a"], x["b"], A_log, dt_bias, pool, slots,
                            step_slots=step_slots, state_v_first=True)
        got = torch.stack([pool[8:12], torch.cat([pool[12:14], ref_states[1, 2:3], pool[15:16]])])
        untouched = [p for p in range(P) if p not in (8, 9, 10, 11, 12, 13, 15)]
        assert torch.equal(pool[untouched], before[untouched])
    assert o.shape == (B, T, HV, V) and torch.all(o[1] == 0)
    assert rel(o[[0, 2]], ref_o[[0, 2]]) < 1e-5
    assert rel(got, ref_states) < 1e-5


def test_verify_argument_errors():
    x = _raw(1, 2)
    pool = torch.randn(4, HV, K, V)
    args = (x["q"], x["k"], x["v"], x["a"], x["b"], torch.rand(HV), None, pool, torch.tensor([0]))
    with pytest.raises(ValueError, match="exactly one"):
        flashqla.verify(*args)
    with pytest.raises(ValueError, match="exactly one"):
        flashqla.verify(*args, step_states=torch.zeros(1, 2, HV, K, V),
                        step_slots=torch.tensor([[1, 2]]))
    with pytest.raises(ValueError):  # a step slot equal to the read slot
        flashqla.verify(*args, step_slots=torch.tensor([[0, 2]]))
    with pytest.raises(ValueError, match="slot"):  # slot >= P
        flashqla.verify(*args[:8], torch.tensor([9]), step_slots=torch.tensor([[1, 2]]))


def test_decode_reference_backend_fp64():
    B, P = 2, 4
    A_log, dt_bias = torch.rand(HV, dtype=torch.float64), torch.randn(HV, dtype=torch.float64)
    x = {n: t.double() for n, t in _raw(B, 1).items()}
    pool = torch.randn(P, HV, K, V, dtype=torch.float64)
    p32 = pool.float()
    slots = torch.tensor([1, 3])
    o64 = flashqla.decode(x["q"], x["k"], x["v"], x["a"], x["b"], A_log, dt_bias, pool, slots)
    o32 = flashqla.decode(*(x[n].float() for n in ("q", "k", "v", "a", "b")), A_log.float(),
                          dt_bias.float(), p32, slots)
    assert o64.dtype == torch.float64
    assert rel(o32, o64) < 1e-5 and rel(p32, pool) < 1e-5
