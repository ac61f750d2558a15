"""flashqla.fused_sigmoid_gating_delta_rule_update (vLLM's signature) and
flashqla.fused_recurrent_gated_delta_rule (FLA's) against pure-torch
transcriptions of the engines' kernels, call for call: decode with -1
padding, packed cu_seqlens, MTP / EAGLE spec decode with 2-D indices and
num_accepted_tokens, both pool layouts, in-place pool vs returned states,
fp32 and bf16, the argument errors, and docs/serving.md's snippet."""

import os
import re
import sys

import pytest
import torch

import flashqla
from conftest import cuda_skip_reason, has_cuda, rel

F = torch.nn.functional


# --------------------------------------------------------------------------
# Transcriptions (torch, token by token, fp32 math like the Triton kernels).
# Tensors the engines allocate with new_empty and may leave unwritten are
# NaN here, so the tests can tell "unwritten" from any value.

def vllm_fused_sigmoid_gating(A_log, a, b, dt_bias, q, k, v, beta=1.0, threshold=20.0,
                              scale=None, initial_state=None, inplace_final_state=True,
                              cu_seqlens=None, ssm_state_indices=None, num_accepted_tokens=None,
                              use_qk_l2norm_in_kernel=False, state_v_first=True):
    """vLLM's fused_sigmoid_gating_delta_rule_update kernel: one program per
    (sequence, v head); the state [V, K] in fp32; the index of token t of
    sequence n read at flat offset n * stride_seq + t of ssm_state_indices."""
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    scale = K ** -0.5 if scale is None else scale
    qf, kf = q.reshape(B * T, H, K).float(), k.reshape(B * T, H, K).float()
    vf = v.reshape(B * T, HV, V).float()
    af, bf = a.reshape(B * T, HV).float(), b.reshape(B * T, HV).float()
    o = torch.full((B * T, HV, V), float("nan"))
    pool = initial_state
    final = pool if inplace_final_state else torch.full((B * T,) + tuple(pool.shape[1:]),
                                                         float("nan")).to(pool.dtype)
    idx = ssm_state_indices.contiguous().view(-1).tolist()
    stride_seq = 1 if ssm_state_indices.dim() == 1 else ssm_state_indices.shape[1]
    rep = HV // H
    for n in range(N):
        if cu_seqlens is None:
            bos, eos = n * T, n * T + T
        else:
            bos, eos = int(cu_seqlens[n]), int(cu_seqlens[n + 1])
        if eos == bos:
            continue
        i_t = int(num_accepted_tokens[n]) - 1 if num_accepted_tokens is not None else 0
        row = idx[n * stride_seq + i_t]
        if row < 0:
            continue                                   # PAD_SLOT_ID: the program returns
        h = pool[row].float()
        h = h.clone() if state_v_first else h.transpose(-1, -2).clone()   # [HV, V, K]
        for t in range(eos - bos):
            tok = bos + t
            x = af[tok] + dt_bias.float()
            sp = torch.where(beta * x <= threshold, torch.log(1 + torch.exp(beta * x)) / beta, x)
            g = -torch.exp(A_log.float()) * sp                                # [HV]
            bb = torch.sigmoid(bf[tok])
            qq, kk = qf[tok].repeat_interleave(rep, 0), kf[tok].repeat_interleave(rep, 0)
            if use_qk_l2norm_in_kernel:
                qq = qq * torch.rsqrt((qq * qq).sum(-1, keepdim=True) + 1e-6)
                kk = kk * torch.rsqrt((kk * kk).sum(-1, keepdim=True) + 1e-6)
            qq = qq * scale
            h = h * torch.exp(g)[:, None, None]
            vv = (vf[tok] - (h * kk[:, None, :]).sum(-1)) * bb[:, None]
            h = h + vv[:, :, None] * kk[:, None, :]
            o[tok] = (h * qq[:, None, :]).sum(-1)
            stored = h if state_v_first else h.transpose(-1, -2)
            if inplace_final_state:
                dst = idx[n * stride_seq + t]
                if dst >= 0:
                    final[dst] = stored.to(final.dtype)
            else:
                final[tok] = stored.to(final.dtype)
    return o.view(B, T, HV, V), final


def sglang_fused_sigmoid_gating(A_log, a, dt_bias, softplus_beta, softplus_threshold, q, k, v, b,
                                initial_state_source, initial_state_indices, scale=None,
                                use_qk_l2norm_in_kernel=False, cu_seqlens=None,
                                disable_state_update=False):
    """SGLang's fused_sigmoid_gating_delta_rule_update kernel (decode form):
    the state of sequence n from row indices[n] ([V, K] rows), or zeros when
    it is negative; every token's o written; the state after the last token
    written back to row indices[n] when it is >= 0."""
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    N = B if cu_seqlens is None else len(cu_seqlens) - 1
    scale = K ** -0.5 if scale is None else scale
    rep = HV // H
    qf, kf = q.reshape(B * T, H, K).float(), k.reshape(B * T, H, K).float()
    vf = v.reshape(B * T, HV, V).float()
    af, bf = a.reshape(B * T, HV).float(), b.reshape(B * T, HV).float()
    o = torch.full((B * T, HV, V), float("nan"))
    pool = initial_state_source
    for n in range(N):
        bos, eos = (n * T, n * T + T) if cu_seqlens is None else (int(cu_seqlens[n]),
                                                                  int(cu_seqlens[n + 1]))
        row = int(initial_state_indices[n])
        h = pool[row].float().clone() if row >= 0 else torch.zeros(HV, V, K)
        for tok in range(bos, eos):
            x = af[tok] + dt_bias.float()
            bx = softplus_beta * x
            sp = torch.where(bx <= softplus_threshold, torch.log(1 + torch.exp(bx)) / softplus_beta, x)
            g = -torch.exp(A_log.float()) * sp
            bb = 1 / (1 + torch.exp(-bf[tok]))
            qq, kk = qf[tok].repeat_interleave(rep, 0), kf[tok].repeat_interleave(rep, 0)
            if use_qk_l2norm_in_kernel:
                qq = qq / torch.sqrt((qq * qq).sum(-1, keepdim=True) + 1e-6)
                kk = kk / torch.sqrt((kk * kk).sum(-1, keepdim=True) + 1e-6)
            h = h * torch.exp(g)[:, None, None]
            vv = (vf[tok] - (h * kk[:, None, :]).sum(-1)) * bb[:, None]
            h = h + vv[:, :, None] * kk[:, None, :]
            o[tok] = (h * (qq * scale)[:, None, :]).sum(-1)
        if not disable_state_update and row >= 0:
            pool[row] = h.to(pool.dtype)
    return o.view(B, T, HV, V)


def fla_fused_recurrent(q, k, v, g=None, beta=None, scale=None, initial_state=None,
                        output_final_state=False, use_qk_l2norm_in_kernel=False,
                        use_gate_in_kernel=False, A_log=None, dt_bias=None,
                        use_beta_sigmoid_in_kernel=False, allow_neg_eigval=False,
                        state_v_first=False, cu_seqlens=None):
    """FLA's fused_recurrent_gated_delta_rule_fwd_kernel: state [K, V] per
    (sequence, v head) in fp32 (V-first with state_v_first), o in v's dtype,
    final state fp32."""
    B, T, H, K = k.shape
    HV, V = v.shape[2], v.shape[3]
    rep = HV // H
    scale = K ** -0.5 if scale is None else scale
    g = torch.zeros(B, T, HV) if g is None else g.float()
    beta = torch.ones(B, T, HV) if beta is None else beta.float()
    if use_gate_in_kernel:
        dt = torch.zeros(HV) if dt_bias is None else dt_bias.float()
        g = -A_log.float().exp() * F.softplus(g + dt)
    if use_beta_sigmoid_in_kernel:
        beta = beta.sigmoid() * (2.0 if allow_neg_eigval else 1.0)
    if cu_seqlens is None:
        seqs = [(bb, 0, T) for bb in range(B)]
    else:
        cu = [int(c) for c in cu_seqlens]
        seqs = [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]
    o = torch.zeros(B, T, HV, V)
    finals = []
    for n, (bb, s, e) in enumerate(seqs):
        h = torch.zeros(HV, K, V)
        if initial_state is not None:
            h0 = initial_state[n].float()
            h = (h0.transpose(-1, -2) if state_v_first else h0).clone()
        for t in range(s, e):
            qq = q[bb, t].float().repeat_interleave(rep, 0)
            kk = k[bb, t].float().repeat_interleave(rep, 0)
            if use_qk_l2norm_in_kernel:
                qq = qq / torch.sqrt((qq * qq).sum(-1, keepdim=True) + 1e-6)
                kk = kk / torch.sqrt((kk * kk).sum(-1, keepdim=True) + 1e-6)
            h = h * g[bb, t].exp()[:, None, None]
            vv = (v[bb, t].float() - (h * kk[:, :, None]).sum(1)) * beta[bb, t][:, None]
            h = h + kk[:, :, None] * vv[:, None, :]
            o[bb, t] = (h * (qq * scale)[:, :, None]).sum(1)
        finals.append(h.transpose(-1, -2) if state_v_first else h)
    return o.to(v.dtype), (torch.stack(finals) if output_final_state else None)


# --------------------------------------------------------------------------
# Helpers

H, HV, K, V = 2, 4, 32, 16      # K != V, so a pool of the other layout is a shape error


def _tol(dtype):
    return 1e-5 if dtype == torch.float32 else 5e-3


def _inputs(T_total, dtype, B=1, a2d=True):
    q = torch.randn(B, T_total, H, K).to(dtype)
    k = torch.randn(B, T_total, H, K).to(dtype)
    v = torch.randn(B, T_total, HV, V).to(dtype)
    shape = (B * T_total, HV) if a2d else (B, T_total, HV)
    a, b = torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)
    return dict(q=q, k=k, v=v, a=a, b=b, A_log=torch.rand(HV) - 0.5, dt_bias=torch.randn(HV))


def _pool(P, v_first, dtype):
    shape = (P, HV, V, K) if v_first else (P, HV, K, V)
    return (0.5 * torch.randn(shape)).to(dtype)


def _compare_o(o, o_ref, dtype):
    """Rows the engine writes agree; rows it leaves unwritten are zeros."""
    assert o.shape == o_ref.shape and o.dtype == dtype
    written = ~torch.isnan(o_ref)
    assert rel(o.float()[written], o_ref[written]) < _tol(dtype)
    assert torch.all(o.float()[~written] == 0)


def _compare_pool(pool, pool_ref, before, dtype):
    """Rows written agree with the transcription, the others are untouched."""
    changed = (pool_ref != before).flatten(1).any(1)
    assert torch.equal(pool[~changed], before[~changed])
    if changed.any():
        assert rel(pool[changed].float(), pool_ref[changed].float()) < _tol(dtype)


def _both(x, pool, device="cpu", **kw):
    """Calls flashqla (on device) and the transcription (on CPU copies) with
    the same arguments; returns (o, final, o_ref, final_ref)."""
    dev = {n: t.to(device) for n, t in x.items()}
    p = pool.clone().to(device)
    kw_dev = {n: (t.to(device) if isinstance(t, torch.Tensor) else t) for n, t in kw.items()}
    o, final = flashqla.fused_sigmoid_gating_delta_rule_update(
        dev["A_log"], dev["a"], dev["b"], dev["dt_bias"], dev["q"], dev["k"], dev["v"],
        initial_state=p, **kw_dev)
    if kw.get("inplace_final_state", True):
        assert final is p            # the pool itself, updated in place
    else:
        assert torch.equal(p.cpu(), pool)   # untouched
    p_ref = pool.clone()
    o_ref, final_ref = vllm_fused_sigmoid_gating(
        x["A_log"], x["a"], x["b"], x["dt_bias"], x["q"], x["k"], x["v"], initial_state=p_ref, **kw)
    return o.cpu(), final.cpu(), o_ref, final_ref


DTYPES = [pytest.param(torch.float32, id="f32"), pytest.param(torch.bfloat16, id="bf16")]
LAYOUTS = [pytest.param(True, id="VK"), pytest.param(False, id="KV")]


# --------------------------------------------------------------------------
# vLLM / SGLang: fused_sigmoid_gating_delta_rule_update

@pytest.mark.parametrize("v_first", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_packed_with_padding(dtype, v_first, device="cpu"):
    """Non-spec decode as vLLM calls it: packed tokens, 1-D int32 indices,
    CUDA-graph padding (zero-length sequences with index -1, a padded token
    past cu_seqlens[-1], a live sequence whose index is -1)."""
    x = _inputs(7, dtype)
    pool = _pool(10, v_first, dtype)
    cu = torch.tensor([0, 1, 2, 3, 4, 5, 6, 6, 6], dtype=torch.int32)
    idx = torch.tensor([3, 7, -1, 0, 9, 2, 5, -1], dtype=torch.int32)   # row 5: a zero-length sequence
    o, final, o_ref, final_ref = _both(x, pool, device, cu_seqlens=cu, ssm_state_indices=idx,
                                       use_qk_l2norm_in_kernel=True, state_v_first=v_first)
    _compare_o(o, o_ref, dtype)
    _compare_pool(final, final_ref, pool, dtype)
    assert torch.all(o[0, 2] == 0) and torch.all(o[0, 6] == 0)
    assert torch.equal(final[[1, 4, 5, 6, 8]].cpu(), pool[[1, 4, 5, 6, 8]])


@pytest.mark.parametrize("v_first", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_batched_steps(dtype, v_first, device="cpu"):
    """[B, 1, ...] without cu_seqlens, int64 indices, several steps on one
    pool (each step reads what the previous one wrote), scale given,
    l2norm off."""
    pool = _pool(6, v_first, dtype)
    ref = pool.clone()
    p = pool.clone().to(device)
    idx = torch.tensor([4, -1, 1, 5])
    for _ in range(3):
        x = _inputs(1, dtype, B=4, a2d=False)
        for t in ("q", "k"):
            x[t] = (x[t].float() / x[t].float().norm(dim=-1, keepdim=True)).to(dtype)
        d = {n: t.to(device) for n, t in x.items()}
        o, final = flashqla.fused_sigmoid_gating_delta_rule_update(
            d["A_log"], d["a"], d["b"], d["dt_bias"], d["q"], d["k"], d["v"], 1.0, 20.0, 0.3, p,
            True, None, idx.to(device), state_v_first=v_first)
        o_ref, ref = vllm_fused_sigmoid_gating(x["A_log"], x["a"], x["b"], x["dt_bias"], x["q"],
                                               x["k"], x["v"], scale=0.3, initial_state=ref,
                                               ssm_state_indices=idx, state_v_first=v_first)
        _compare_o(o.cpu(), o_ref, dtype)
        assert final is p
    _compare_pool(p.cpu(), ref, pool, dtype)


@pytest.mark.parametrize("v_first", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_spec_decode_num_accepted_tokens(dtype, v_first, device="cpu"):
    """MTP / EAGLE: 2-D indices [N, num_spec + 1], num_accepted_tokens
    choosing the row to start from, each draft token's state to its own row,
    a -1 inside a row (that write skipped), a fully padded request, a shorter
    request and a zero-length one; three steps with changing acceptance, so a
    step reads what an earlier one wrote (the rollback)."""
    W = 3
    pool = _pool(20, v_first, dtype)
    ref = pool.clone()
    p = pool.clone().to(device)
    idx = torch.tensor([[1, 2, 3], [6, -1, 8], [-1, -1, -1], [10, 11, 12], [13, 14, 15],
                        [16, 17, 18]], dtype=torch.int32)
    cu = torch.tensor([0, 3, 6, 9, 11, 11, 14], dtype=torch.int32)
    for nat in ([1, 1, 1, 1, 1, 1], [2, 3, 1, 2, 1, 3], [3, 1, 2, 1, 3, 2]):
        nat = torch.tensor(nat, dtype=torch.int32)
        x = _inputs(15, dtype)          # one padded token past cu_seqlens[-1]
        d = {n: t.to(device) for n, t in x.items()}
        o, _ = flashqla.fused_sigmoid_gating_delta_rule_update(
            A_log=d["A_log"], a=d["a"], b=d["b"], dt_bias=d["dt_bias"], q=d["q"], k=d["k"],
            v=d["v"], initial_state=p, inplace_final_state=True, cu_seqlens=cu.to(device),
            ssm_state_indices=idx.to(device), num_accepted_tokens=nat.to(device),
            use_qk_l2norm_in_kernel=True, state_v_first=v_first)
        o_ref, ref = vllm_fused_sigmoid_gating(
            x["A_log"], x["a"], x["b"], x["dt_bias"], x["q"], x["k"], x["v"], initial_state=ref,
            inplace_final_state=True, cu_seqlens=cu, ssm_state_indices=idx,
            num_accepted_tokens=nat, use_qk_l2norm_in_kernel=True, state_v_first=v_first)
        _compare_o(o.cpu(), o_ref, dtype)
        _compare_pool(p.cpu(), ref, pool, dtype)
    assert torch.equal(p.cpu()[[0, 4, 5, 7, 9, 19]], pool[[0, 4, 5, 7, 9, 19]])


@pytest.mark.parametrize("dtype", DTYPES)
def test_spec_decode_without_cu_seqlens(dtype):
    """[B, T, ...] with 2-D indices [B, T] (and a wider row), with and
    without num_accepted_tokens; a strided (sliced) index tensor."""
    pool = _pool(16, True, dtype)
    wide = torch.tensor([[2, 3, 4, 0], [5, 6, 7, 0], [-1, 9, 11, 0]], dtype=torch.int64)
    for idx, nat in ((wide[:, :3], torch.tensor([2, 1, 3])), (wide[:, :3], None),
                     (torch.tensor([[8, 12, 13, 14], [1, 0, 15, -1], [-1, -1, -1, -1]]),
                      torch.tensor([4, 1, 2]))):
        x = _inputs(3, dtype, B=3, a2d=False)
        o, final, o_ref, final_ref = _both(x, pool, ssm_state_indices=idx, num_accepted_tokens=nat,
                                           use_qk_l2norm_in_kernel=True)
        _compare_o(o, o_ref, dtype)
        _compare_pool(final, final_ref, pool, dtype)


@pytest.mark.parametrize("v_first", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_not_in_place_returns_per_token_states(dtype, v_first):
    """inplace_final_state=False: the pool is untouched, the state after every
    token comes back as [T, HV, ...] in the pool's dtype (rows of skipped
    sequences zero), for packed sequences of several lengths and for [B, T]."""
    pool = _pool(8, v_first, dtype)
    x = _inputs(9, dtype)
    cu = torch.tensor([0, 4, 4, 5, 8], dtype=torch.int64)
    idx = torch.tensor([6, 1, -1, 3], dtype=torch.int32)
    o, final, o_ref, final_ref = _both(x, pool, inplace_final_state=False, cu_seqlens=cu,
                                       ssm_state_indices=idx, use_qk_l2norm_in_kernel=True,
                                       state_v_first=v_first)
    _compare_o(o, o_ref, dtype)
    assert final.shape == (9,) + tuple(pool.shape[1:]) and final.dtype == dtype
    written = ~torch.isnan(final_ref.float()).flatten(1).any(1)
    assert written.tolist() == [True] * 4 + [False] + [True] * 3 + [False]
    assert rel(final[written].float(), final_ref[written].float()) < _tol(dtype)
    assert torch.all(final[~written] == 0)

    x = _inputs(3, dtype, B=2, a2d=False)
    idx2 = torch.tensor([[5, 0], [2, 4]])
    o, final, o_ref, final_ref = _both(x, pool, inplace_final_state=False, ssm_state_indices=idx2,
                                       num_accepted_tokens=torch.tensor([2, 1]),
                                       state_v_first=v_first)
    _compare_o(o, o_ref, dtype)
    assert rel(final.float(), final_ref.float()) < _tol(dtype)


@pytest.mark.parametrize("packed", [True, False], ids=["cu_seqlens", "batched"])
def test_views_of_a_fused_projection(packed):
    """q, k, v split out of one conv output (vLLM's mixed_qkv) and a, b out of
    one projection, read as the strided views they are."""
    T, dtype = 4, torch.bfloat16
    mixed = torch.randn(T, 2 * H * K + HV * V).to(dtype)
    qf, kf, vf = torch.split(mixed, [H * K, H * K, HV * V], dim=-1)
    ba = torch.randn(T, 2 * HV).to(dtype)
    x = dict(q=qf.view(1, T, H, K), k=kf.view(1, T, H, K), v=vf.view(1, T, HV, V),
             b=ba[:, :HV], a=ba[:, HV:], A_log=torch.rand(HV), dt_bias=torch.randn(HV))
    if not packed:
        x.update({n: x[n].view((T, 1) + tuple(x[n].shape[2:])) for n in ("q", "k", "v")})
    assert not x["q"].is_contiguous() and not x["a"].is_contiguous()
    pool = _pool(6, True, torch.float32)
    kw = dict(cu_seqlens=torch.arange(T + 1, dtype=torch.int32)) if packed else {}
    o, final, o_ref, final_ref = _both(x, pool, ssm_state_indices=torch.tensor([5, 0, -1, 2]),
                                       use_qk_l2norm_in_kernel=True, **kw)
    _compare_o(o, o_ref, dtype)
    _compare_pool(final, final_ref, pool, torch.float32)


def test_empty_batches():
    x = _inputs(0, torch.float32)
    pool = _pool(3, True, torch.float32)
    o, final = flashqla.fused_sigmoid_gating_delta_rule_update(
        x["A_log"], x["a"], x["b"], x["dt_bias"], x["q"], x["k"], x["v"], initial_state=pool,
        cu_seqlens=torch.tensor([0, 0], dtype=torch.int32),
        ssm_state_indices=torch.tensor([1], dtype=torch.int32))
    assert o.shape == (1, 0, HV, V) and final is pool
    x = _inputs(2, torch.float32)
    before = pool.clone()
    o, _ = flashqla.fused_sigmoid_gating_delta_rule_update(
        x["A_log"], x["a"], x["b"], x["dt_bias"], x["q"], x["k"], x["v"], initial_state=pool,
        cu_seqlens=torch.tensor([0], dtype=torch.int32),
        ssm_state_indices=torch.zeros(0, dtype=torch.int32))
    assert torch.all(o == 0) and torch.equal(pool, before)


def _call(**over):
    x = _inputs(2, torch.float32)
    args = dict(A_log=x["A_log"], a=x["a"], b=x["b"], dt_bias=x["dt_bias"], q=x["q"], k=x["k"],
                v=x["v"], initial_state=_pool(4, True, torch.float32),
                cu_seqlens=torch.tensor([0, 1, 2], dtype=torch.int32),
                ssm_state_indices=torch.tensor([0, 1], dtype=torch.int32),
                use_qk_l2norm_in_kernel=True)
    args.update(over)
    return flashqla.fused_sigmoid_gating_delta_rule_update(**args)


@pytest.mark.parametrize("over, exc, words", [
    (dict(is_kda=True), NotImplementedError, "is_kda"),
    (dict(beta=2.0), NotImplementedError, "beta"),
    (dict(threshold=10.0), NotImplementedError, "threshold"),
    (dict(scale=-1.0), ValueError, "scale"),
    (dict(initial_state=None), ValueError, "initial_state"),
    (dict(ssm_state_indices=None), ValueError, "ssm_state_indices"),
    (dict(initial_state=torch.zeros(4, HV, K, V)), ValueError, "state_v_first=False"),
    (dict(initial_state=torch.zeros(4, HV, V, K), state_v_first=False), ValueError, "initial_state"),
    (dict(ssm_state_indices=torch.tensor([0.0, 1.0])), ValueError, "ssm_state_indices"),
    (dict(ssm_state_indices=torch.tensor([0], dtype=torch.int32)), ValueError, "ssm_state_indices"),
    (dict(num_accepted_tokens=torch.tensor([1, 1], dtype=torch.int32)), ValueError,
     "num_accepted_tokens needs 2-D"),
    (dict(ssm_state_indices=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
          num_accepted_tokens=torch.tensor([3, 1], dtype=torch.int32)), ValueError,
     "num_accepted_tokens[0] = 3"),
    (dict(ssm_state_indices=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32),
          num_accepted_tokens=torch.tensor([1, 0], dtype=torch.int32)), ValueError,
     "num_accepted_tokens[1] = 0"),
    (dict(cu_seqlens=torch.tensor([0, 2, 2], dtype=torch.int32)), ValueError,
     "sequence 0 has 2 tokens"),
    (dict(cu_seqlens=torch.tensor([0, 2, 1], dtype=torch.int32)), ValueError, "non-decreasing"),
    (dict(cu_seqlens=torch.tensor([0, 1, 3], dtype=torch.int32)), ValueError, "cu_seqlens"),
    (dict(cu_seqlens=torch.tensor([0.0, 1.0, 2.0])), ValueError, "cu_seqlens"),
    (dict(a=torch.randn(3, HV)), ValueError, "a has shape"),
    (dict(b=torch.randn(2, HV + 1)), ValueError, "b has shape"),
    (dict(q=torch.randn(2, H, K)), ValueError, "q, k, v"),
    (dict(A_log="x"), TypeError, "A_log"),
    (dict(ssm_state_indices=torch.tensor([[0, 1], [2, 4]], dtype=torch.int32),
          num_accepted_tokens=torch.tensor([1, 1], dtype=torch.int32)), ValueError,
     "row 4 but initial_state has P = 4"),
])
def test_vllm_bad_arguments(over, exc, words):
    with pytest.raises(exc) as e:
        _call(**over)
    assert words in str(e.value)


def test_vllm_bad_shapes_without_cu_seqlens():
    x = _inputs(2, torch.float32, B=2, a2d=False)
    pool = _pool(4, True, torch.float32)
    f = flashqla.fused_sigmoid_gating_delta_rule_update
    with pytest.raises(ValueError, match="give 2-D indices"):     # 1-D indices, T = 2, in place
        f(x["A_log"], x["a"], x["b"], x["dt_bias"], x["q"], x["k"], x["v"], initial_state=pool,
          ssm_state_indices=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="batch size 2"):
        f(x["A_log"], x["a"], x["b"], x["dt_bias"], x["q"], x["k"], x["v"], initial_state=pool,
          ssm_state_indices=torch.tensor([0, 1]), cu_seqlens=torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="rows for N = 2"):
        f(x["A_log"], x["a"], x["b"], x["dt_bias"], x["q"], x["k"], x["v"], initial_state=pool,
          ssm_state_indices=torch.tensor([[0, 1]]))
    # duplicate rows: the library's own check names them
    with pytest.raises(ValueError, match="ssm_state_indices.*slots"):
        f(x["A_log"], x["a"][:, :1], x["b"][:, :1], x["dt_bias"], x["q"][:, :1], x["k"][:, :1],
          x["v"][:, :1], initial_state=pool, ssm_state_indices=torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="ssm_state_indices.*slots"):   # a row read twice
        f(x["A_log"], x["a"], x["b"], x["dt_bias"], x["q"], x["k"], x["v"], initial_state=pool,
          ssm_state_indices=torch.tensor([[0, 1], [0, 2]]), num_accepted_tokens=torch.tensor([1, 1]))


# --------------------------------------------------------------------------
# SGLang's keyword form of the same function

def _sglang(x, pool, idx, **kw):
    return flashqla.fused_sigmoid_gating_delta_rule_update(
        A_log=x["A_log"], dt_bias=x["dt_bias"], q=x["q"], k=x["k"], v=x["v"], a=x["a"], b=x["b"],
        initial_state_source=pool, initial_state_indices=idx, use_qk_l2norm_in_kernel=True,
        softplus_beta=1.0, softplus_threshold=20.0, **kw)


@pytest.mark.parametrize("pool_dtype", DTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_sglang_decode(dtype, pool_dtype):
    """SGLang's gdn backend decode call: packed one-token sequences, -1
    padding; o alone comes back, the pool is written in place. Padded rows:
    SGLang runs them from a zero state, flashqla writes zeros (documented)."""
    x = _inputs(5, dtype)
    pool = _pool(8, True, pool_dtype)
    idx = torch.tensor([2, -1, 7, 0, -1], dtype=torch.int32)
    cu = torch.arange(6, dtype=torch.int32)
    p = pool.clone()
    o = _sglang(x, p, idx, cu_seqlens=cu)
    assert isinstance(o, torch.Tensor) and o.shape == (1, 5, HV, V)
    ref = pool.clone()
    o_ref = sglang_fused_sigmoid_gating(x["A_log"], x["a"], x["dt_bias"], 1.0, 20.0, x["q"], x["k"],
                                        x["v"], x["b"], ref, idx, use_qk_l2norm_in_kernel=True,
                                        cu_seqlens=cu)
    live = [0, 2, 3]
    assert rel(o[0, live].float(), o_ref[0, live]) < _tol(dtype)
    assert torch.all(o[0, [1, 4]] == 0)
    _compare_pool(p, ref, pool, pool_dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sglang_multi_token_and_disable_state_update(dtype):
    """[B, T] without cu_seqlens: the state after the last token goes to the
    row; disable_state_update leaves the pool as it was."""
    x = _inputs(3, dtype, B=3, a2d=False)
    pool = _pool(6, True, torch.float32)
    idx = torch.tensor([4, 1, 3])
    for disable in (False, True):
        p, ref = pool.clone(), pool.clone()
        o = _sglang(x, p, idx, disable_state_update=disable)
        o_ref = sglang_fused_sigmoid_gating(x["A_log"], x["a"], x["dt_bias"], 1.0, 20.0, x["q"],
                                            x["k"], x["v"], x["b"], ref, idx,
                                            use_qk_l2norm_in_kernel=True,
                                            disable_state_update=disable)
        assert rel(o.float(), o_ref) < _tol(dtype)
        _compare_pool(p, ref, pool, torch.float32)
        assert torch.equal(p, pool) == disable


@pytest.mark.parametrize("over, exc, words", [
    (dict(initial_state_source=_pool(4, False, torch.float32)), ValueError,
     "initial_state_source has shape"),
    (dict(initial_state_indices=torch.tensor([0, 0], dtype=torch.int32)), ValueError,
     "initial_state_indices (the library's slots)"),
    (dict(initial_state_indices=torch.tensor([[0], [1]])), ValueError, "initial_state_indices"),
    (dict(initial_state_indices=None), ValueError, "initial_state_indices is required"),
    (dict(softplus_beta=0.5), NotImplementedError, "softplus_beta = 0.5"),
    (dict(softplus_threshold=5.0), NotImplementedError, "softplus_threshold = 5.0"),
    (dict(intermediate_states_buffer=torch.zeros(2, 1, HV, V, K)), NotImplementedError,
     "intermediate_states_buffer"),
    (dict(retrieve_parent_token=torch.zeros(2, 1)), NotImplementedError, "retrieve_parent_token"),
    (dict(ssm_state_indices=torch.tensor([0, 1])), ValueError, "not both"),
    (dict(cu_seqlens=torch.tensor([0, 2, 2])), ValueError, "one token per sequence"),
])
def test_sglang_bad_arguments(over, exc, words):
    x = _inputs(2, torch.float32)
    args = dict(A_log=x["A_log"], dt_bias=x["dt_bias"], q=x["q"], k=x["k"], v=x["v"], a=x["a"],
                b=x["b"], initial_state_source=_pool(4, True, torch.float32),
                initial_state_indices=torch.tensor([0, 1], dtype=torch.int32),
                cu_seqlens=torch.tensor([0, 1, 2], dtype=torch.int32), use_qk_l2norm_in_kernel=True,
                softplus_beta=1.0, softplus_threshold=20.0)
    args.update(over)
    with pytest.raises(exc) as e:
        flashqla.fused_sigmoid_gating_delta_rule_update(**args)
    assert words in str(e.value)


def test_sglang_arguments_in_vllm_form_raise():
    for name, val in (("softplus_beta", 1.0), ("disable_state_update", True),
                      ("cache_steps", 2)):
        with pytest.raises(ValueError, match=name):
            _call(**{name: val})


# --------------------------------------------------------------------------
# FLA: fused_recurrent_gated_delta_rule

def _fla_inputs(B, T, dtype, h0=None, v_first=False, N=None):
    x = dict(q=torch.randn(B, T, H, K).to(dtype), k=torch.randn(B, T, H, K).to(dtype),
             v=torch.randn(B, T, HV, V).to(dtype), g=-torch.rand(B, T, HV),
             beta=torch.rand(B, T, HV))
    if h0 is not None:
        n = B if N is None else N
        x["initial_state"] = torch.randn((n, HV, V, K) if v_first else (n, HV, K, V)).to(h0)
    return x


@pytest.mark.parametrize("v_first", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(3, 1), (1, 6), (2, 5)], ids=["decode", "T6", "B2T5"])
def test_fla_fused_recurrent(shape, dtype, v_first):
    B, T = shape
    x = _fla_inputs(B, T, dtype, h0=torch.float32, v_first=v_first)
    h0 = x["initial_state"].clone()
    o, ht = flashqla.fused_recurrent_gated_delta_rule(**x, output_final_state=True,
                                                      use_qk_l2norm_in_kernel=True,
                                                      state_v_first=v_first)
    o_ref, ht_ref = fla_fused_recurrent(**x, output_final_state=True, use_qk_l2norm_in_kernel=True,
                                        state_v_first=v_first)
    assert torch.equal(x["initial_state"], h0)          # never modified
    assert o.dtype == dtype and ht.dtype == torch.float32 and ht.shape == ht_ref.shape
    assert rel(o, o_ref) < _tol(dtype)
    assert rel(ht, ht_ref) < _tol(dtype) / 4


@pytest.mark.parametrize("dtype", DTYPES)
def test_fla_fused_recurrent_options(dtype):
    """Gate and beta sigmoid in the kernel, allow_neg_eigval, g / beta
    omitted, no initial state, a bf16 initial state, output_final_state
    False, the deprecated transpose_state_layout."""
    B = 2
    x = _fla_inputs(B, 1, dtype, h0=torch.bfloat16)
    A_log, dt_bias = torch.rand(HV), torch.randn(HV)
    raw = dict(q=x["q"], k=x["k"], v=x["v"], g=torch.randn(B, 1, HV), beta=torch.randn(B, 1, HV),
               initial_state=x["initial_state"])
    kw = dict(use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True,
              allow_neg_eigval=True, output_final_state=True)
    o, ht = flashqla.fused_recurrent_gated_delta_rule(**raw, **kw)
    o_ref, ht_ref = fla_fused_recurrent(**raw, **kw)
    assert rel(o, o_ref) < _tol(dtype) and rel(ht, ht_ref) < 1e-5

    o, ht = flashqla.fused_recurrent_gated_delta_rule(x["q"], x["k"], x["v"])
    o_ref, _ = fla_fused_recurrent(x["q"], x["k"], x["v"])
    assert ht is None and rel(o, o_ref) < _tol(dtype)

    h0 = torch.randn(B, HV, V, K)
    o, ht = flashqla.fused_recurrent_gated_delta_rule(
        x["q"], x["k"], x["v"], x["g"], beta=x["beta"], initial_state=h0,
        output_final_state=True, transpose_state_layout=True)
    o_ref, ht_ref = fla_fused_recurrent(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=h0,
                                        output_final_state=True, state_v_first=True)
    assert rel(o, o_ref) < _tol(dtype) and rel(ht, ht_ref) < 1e-5


@pytest.mark.parametrize("dtype", DTYPES)
def test_fla_fused_recurrent_varlen(dtype):
    cu = torch.tensor([0, 3, 3, 4, 9], dtype=torch.int64)
    x = _fla_inputs(1, 9, dtype, h0=torch.float32, N=4)
    o, ht = flashqla.fused_recurrent_gated_delta_rule(**x, output_final_state=True,
                                                      use_qk_l2norm_in_kernel=True, cu_seqlens=cu)
    o_ref, ht_ref = fla_fused_recurrent(**x, output_final_state=True, use_qk_l2norm_in_kernel=True,
                                        cu_seqlens=cu)
    assert rel(o, o_ref) < _tol(dtype) and rel(ht, ht_ref) < _tol(dtype) / 4


def test_fla_fused_recurrent_grad_goes_through_chunk():
    """A decode-shaped call that needs a gradient takes the differentiable
    chunked path (FLA's recurrent kernel has no backward)."""
    x = _fla_inputs(2, 1, torch.float32, h0=torch.float32)
    q = x.pop("q").requires_grad_()
    o, _ = flashqla.fused_recurrent_gated_delta_rule(q, **x, use_qk_l2norm_in_kernel=True)
    o.sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


@pytest.mark.parametrize("over, exc, words", [
    (dict(gk=torch.zeros(2, 1, HV, K)), NotImplementedError, "gk"),
    (dict(gv=torch.zeros(2, 1, HV, V)), NotImplementedError, "gv"),
    (dict(beta=torch.rand(2, 1, HV, V)), NotImplementedError, "beta per value channel"),
    (dict(head_first=True), TypeError, "head_first"),
    (dict(cu_seqlens=torch.tensor([0, 1, 2])), ValueError, "batch size 2"),
    (dict(allow_neg_eigval=True), ValueError, "use_beta_sigmoid_in_kernel"),
    (dict(use_gate_in_kernel=True), ValueError, "A_log"),
    (dict(initial_state=torch.zeros(3, HV, K, V)), ValueError, "initial_state"),
    (dict(state_v_first=True, transpose_state_layout=True), ValueError, "transpose_state_layout"),
])
def test_fla_bad_arguments(over, exc, words):
    x = _fla_inputs(2, 1, torch.float32)
    x.update(over)
    with pytest.raises(exc) as e:
        flashqla.fused_recurrent_gated_delta_rule(**x)
    assert words in str(e.value)


def test_fla_initial_state_count_with_cu_seqlens():
    x = _fla_inputs(1, 4, torch.float32, h0=torch.float32, N=3)
    with pytest.raises(ValueError, match="3 states for 2 sequences"):
        flashqla.fused_recurrent_gated_delta_rule(**x, cu_seqlens=torch.tensor([0, 2, 4]))


# --------------------------------------------------------------------------
# docs/serving.md: its two code blocks, run as they are (on CPU tensors here)

_DOC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "serving.md")


def test_docs_serving_snippet_runs_and_matches():
    with open(_DOC) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    assert len(blocks) == 2
    setup, step = blocks
    line = 'device = "cuda" if torch.cuda.is_available() and flashqla.backend_available("cuda")[0] else "cpu"'
    assert line in setup
    ns = {}
    exec(compile(setup.replace(line, 'device = "cpu"'), _DOC, "exec"), ns)
    before = ns["ssm_state"].clone()
    exec(compile(step, _DOC, "exec"), ns)
    bf16 = torch.bfloat16

    ref = before.clone()
    i32 = torch.int32
    o_ref, ref = vllm_fused_sigmoid_gating(
        ns["A_log"], ns["a"], ns["b"], ns["dt_bias"], ns["q"], ns["k"], ns["v"], initial_state=ref,
        cu_seqlens=torch.tensor([0, 1, 2, 3, 3], dtype=i32),
        ssm_state_indices=torch.tensor([5, 0, 9, -1], dtype=i32), use_qk_l2norm_in_kernel=True)
    _compare_o(ns["o"], o_ref, bf16)
    o_ref, ref = vllm_fused_sigmoid_gating(
        ns["A_log"], ns["as_"], ns["bs"], ns["dt_bias"], ns["qs"], ns["ks"], ns["vs"],
        initial_state=ref, cu_seqlens=torch.tensor([0, 3, 6], dtype=i32),
        ssm_state_indices=torch.tensor([[1, 2, 3], [6, 7, 8]], dtype=i32),
        num_accepted_tokens=torch.tensor([1, 2], dtype=i32), use_qk_l2norm_in_kernel=True)
    _compare_o(ns["o_spec"], o_ref, bf16)
    o_ref = sglang_fused_sigmoid_gating(
        ns["A_log"], ns["a2"], ns["dt_bias"], 1.0, 20.0, ns["q2"], ns["k2"], ns["v2"], ns["b2"],
        ref, torch.tensor([4, 12]), cu_seqlens=torch.tensor([0, 1, 2]), use_qk_l2norm_in_kernel=True)
    assert rel(ns["o_sgl"], o_ref) < 5e-3
    assert rel(ns["ssm_state"], ref) < 1e-5
    assert torch.equal(ns["ssm_state"][[10, 11, 13, 14, 15]], before[[10, 11, 13, 14, 15]])

    g = -ns["A_log"].exp() * F.softplus(ns["ah"].float() + ns["dt_bias"])
    rep = HV // H
    o_ref, ht_ref = fla_fused_recurrent(
        ns["qh"].repeat_interleave(rep, 2), ns["kh"].repeat_interleave(rep, 2), ns["vh"], g,
        ns["bh"].sigmoid(), initial_state=ns["recurrent_state"], output_final_state=True,
        use_qk_l2norm_in_kernel=True)
    assert rel(ns["o_hf"], o_ref) < 2e-2 and rel(ns["new_state"], ht_ref) < 1e-5


# --------------------------------------------------------------------------
# CUDA: the same calls on CUDA tensors against the CPU transcription

cuda = pytest.mark.skipif(not has_cuda(), reason=cuda_skip_reason() or "no CUDA")


@pytest.fixture
def cuda_dims(monkeypatch):
    """Head dims the CUDA decode kernels cover (K = V in {64, 128, 256})."""
    mod = sys.modules[__name__]
    monkeypatch.setattr(mod, "K", 64)
    monkeypatch.setattr(mod, "V", 64)


@cuda
@pytest.mark.parametrize("v_first", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_decode_packed_with_padding(dtype, v_first, cuda_dims):
    test_decode_packed_with_padding(dtype, v_first, device="cuda")


@cuda
@pytest.mark.parametrize("v_first", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_decode_batched_steps(dtype, v_first, cuda_dims):
    test_decode_batched_steps(dtype, v_first, device="cuda")


@cuda
@pytest.mark.parametrize("v_first", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_spec_decode_num_accepted_tokens(dtype, v_first, cuda_dims):
    test_spec_decode_num_accepted_tokens(dtype, v_first, device="cuda")


@cuda
def test_cuda_graph_capture_spec_decode(cuda_dims):
    """The in-place mode reads nothing on the host: a captured step replays
    with new indices and acceptance counts written into its buffers."""
    dtype, W = torch.bfloat16, 3
    pool = _pool(12, True, torch.float32)
    ref = pool.clone()
    p = pool.cuda()
    x = _inputs(6, dtype)
    d = {n: t.cuda() for n, t in x.items()}
    cu = torch.tensor([0, 3, 6], dtype=torch.int32, device="cuda")
    idx = torch.tensor([[1, 2, 3], [6, 7, 8]], dtype=torch.int32, device="cuda")
    nat = torch.tensor([1, 1], dtype=torch.int32, device="cuda")

    def step():
        return flashqla.fused_sigmoid_gating_delta_rule_update(
            d["A_log"], d["a"], d["b"], d["dt_bias"], d["q"], d["k"], d["v"], initial_state=p,
            cu_seqlens=cu, ssm_state_indices=idx, num_accepted_tokens=nat,
            use_qk_l2norm_in_kernel=True)[0]

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()                                   # warm-up (contexts, allocator)
    torch.cuda.current_stream().wait_stream(s)
    p.copy_(pool.cuda())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_graph = step()
    for new_nat, new_idx in (([1, 2], [[1, 2, 3], [6, 7, 8]]), ([3, 1], [[4, 5, -1], [9, 10, 11]])):
        nat.copy_(torch.tensor(new_nat))
        idx.copy_(torch.tensor(new_idx))
        graph.replay()
        torch.cuda.synchronize()
        o_ref, ref = vllm_fused_sigmoid_gating(
            x["A_log"], x["a"], x["b"], x["dt_bias"], x["q"], x["k"], x["v"], initial_state=ref,
            cu_seqlens=cu.cpu(), ssm_state_indices=idx.cpu(), num_accepted_tokens=nat.cpu(),
            use_qk_l2norm_in_kernel=True)
        _compare_o(o_graph.cpu(), o_ref, dtype)
        _compare_pool(p.cpu(), ref, pool, torch.float32)


@cuda
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_fla_fused_recurrent(dtype, cuda_dims):
    x = _fla_inputs(3, 1, dtype, h0=torch.float32)
    o, ht = flashqla.fused_recurrent_gated_delta_rule(
        **{n: t.cuda() for n, t in x.items()}, output_final_state=True, use_qk_l2norm_in_kernel=True)
    o_ref, ht_ref = fla_fused_recurrent(**x, output_final_state=True, use_qk_l2norm_in_kernel=True)
    assert rel(o, o_ref) < _tol(dtype) and rel(ht, ht_ref) < _tol(dtype) / 4
