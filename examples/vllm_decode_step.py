#!/usr/bin/env python3
"""vllm_decode_step.py - how a serving engine (vLLM, SGLang) runs a Gated
DeltaNet layer on flashqla: prefill into a state pool, a decode step padded
with -1, and one step of speculative decoding (MTP / EAGLE), with vLLM's own
call, flashqla.fused_sigmoid_gating_delta_rule_update (docs/serving.md).

Runs on CUDA tensors when the library has its CUDA backend and a GPU, else on
the CPU (`--device cpu|cuda` forces one). Every output and pool row it writes
is checked against a float64 recurrence written out below.

    PYTHONPATH=python python3 examples/vllm_decode_step.py

(`make test` runs it.) Needs torch.
"""
import argparse
import sys

import torch
import torch.nn.functional as F

import flashqla
from flashqla import fused_sigmoid_gating_delta_rule_update   # in vLLM: from vllm...fla.ops import ...

PAD_SLOT_ID = -1                     # vLLM's padding index: that sequence is skipped
H, HV, K, V = 2, 4, 64, 64           # heads of q/k, heads of v, head dims (Qwen3.5: K = V = 128)
P = 16                               # rows in the state pool (one per request, W per spec request)


def reference(A_log, dt_bias, tokens):
    """float64 recurrence over one request's tokens (a list of (q, k, v, a, b),
    one token each) from a zero state: the outputs and the state after each
    token, in the pool's [HV, V, K] layout."""
    S = torch.zeros(HV, K, V, dtype=torch.float64)
    outs, states = [], []
    for q, k, v, a, b in tokens:
        q, k, v, a, b = (x.detach().double().cpu() for x in (q, k, v, a, b))
        q = F.normalize(q, dim=-1, eps=0).repeat_interleave(HV // H, 0) * K ** -0.5
        k = F.normalize(k, dim=-1, eps=0).repeat_interleave(HV // H, 0)
        g = -A_log.double().cpu().exp() * F.softplus(a + dt_bias.double().cpu())
        S = S * g.exp()[:, None, None]
        delta = b.sigmoid()[:, None] * (v - torch.einsum("hk,hkv->hv", k, S))
        S = S + torch.einsum("hk,hv->hkv", k, delta)
        outs.append(torch.einsum("hk,hkv->hv", q, S))
        states.append(S.transpose(-1, -2).clone())               # [HV, V, K]
    return outs, states


def rel(x, ref):
    x, ref = x.double().cpu(), ref.double().cpu()
    return ((x - ref).abs().max() / ref.abs().max()).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", choices=("cpu", "cuda"), default=None)
    args = ap.parse_args()
    cuda_ok = torch.cuda.is_available() and flashqla.backend_available("cuda")[0]
    device = args.device or ("cuda" if cuda_ok else "cpu")
    print("device:", device, "" if device == "cuda" or cuda_ok else
          "(no CUDA backend or GPU here: %s)" % flashqla.backend_available("cuda")[1])
    torch.manual_seed(0)
    dtype = torch.bfloat16           # the engines' activations; the pool stays fp32
    tol = 2e-2                       # bf16 outputs; the fp32 math agrees to ~1e-6

    def ints(*values):
        return torch.tensor(values, dtype=torch.int32, device=device)

    def new_tokens(n):
        """n packed tokens in vLLM's decode layout: q, k [1, n, H, K], v [1, n, HV, V], a, b [n, HV]."""
        return (torch.randn(1, n, H, K, device=device, dtype=dtype),
                torch.randn(1, n, H, K, device=device, dtype=dtype),
                torch.randn(1, n, HV, V, device=device, dtype=dtype),
                torch.randn(n, HV, device=device, dtype=dtype),
                torch.randn(n, HV, device=device, dtype=dtype))

    # The layer's parameters and its state pool, in vLLM's [P, HV, V, K] layout.
    A_log = torch.log(torch.empty(HV, device=device).uniform_(1, 16))
    dt_bias = torch.randn(HV, device=device)
    pool = torch.zeros(P, HV, V, K, device=device, dtype=torch.float32)
    history = {0: [], 1: [], 2: []}  # every token each request has seen, for the reference
    ok = True

    def check(what, err):
        nonlocal ok
        print("  %-46s max rel. diff %.1e" % (what, err))
        ok = ok and err < tol

    def remember(req, toks, i):
        q, k, v, a, b = toks
        history[req].append((q[0, i], k[0, i], v[0, i], a[i], b[i]))

    # 1. Prefill: 3 requests of 5, 9 and 3 tokens packed into one batch
    #    (cu_seqlens), their final states scattered to pool rows 5, 0 and 9.
    rows = [5, 0, 9]
    lengths = [5, 9, 3]
    toks = new_tokens(sum(lengths))
    cu = ints(0, 5, 14, 17)
    q, k, v, a, b = toks
    _, final = flashqla.chunk_gated_delta_rule(
        q, k, v, a[None], b[None], use_qk_l2norm_in_kernel=True,
        use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias, use_beta_sigmoid_in_kernel=True,
        output_final_state=True, state_v_first=True, cu_seqlens=cu,
        cu_seqlens_cpu=cu.cpu())     # a host copy: no device read to plan the call
    pool[rows] = final
    for req in range(3):
        for i in range(cu[req].item(), cu[req + 1].item()):
            remember(req, toks, i)
    print("prefill: 3 requests, %d tokens" % sum(lengths))
    for req in range(3):
        check("request %d: pool row %d" % (req, rows[req]), rel(pool[rows[req]], reference(A_log, dt_bias, history[req])[1][-1]))

    # 2. Decode: one token per request, the batch padded to 4 (a captured CUDA
    #    graph has fixed batch sizes); the padding row has index -1.
    toks = new_tokens(4)
    q, k, v, a, b = toks
    untouched = pool.clone()
    o, _ = fused_sigmoid_gating_delta_rule_update(
        A_log=A_log, a=a, b=b, dt_bias=dt_bias, q=q, k=k, v=v,
        initial_state=pool, inplace_final_state=True,         # reads and writes pool rows in place
        cu_seqlens=ints(0, 1, 2, 3, 4), ssm_state_indices=ints(5, 0, 9, PAD_SLOT_ID),
        use_qk_l2norm_in_kernel=True)
    print("decode: 3 requests + 1 padding row")
    for req in range(3):
        remember(req, toks, req)
        outs, states = reference(A_log, dt_bias, history[req])
        check("request %d: o" % req, rel(o[0, req], outs[-1]))
        check("request %d: pool row %d" % (req, rows[req]), rel(pool[rows[req]], states[-1]))
    other = [r for r in range(P) if r not in rows]
    pad_ok = bool((o[0, 3] == 0).all()) and torch.equal(pool[other], untouched[other])
    print("  padding row: o zero, other pool rows untouched: %s" % ("yes" if pad_ok else "NO"))
    ok = ok and pad_ok

    # 3. Spec decode: requests 0 and 1 each verify 3 tokens (the last sampled
    #    token + 2 drafts). A spec request owns W = 3 pool rows, one per draft
    #    position; the state after token t goes to row indices[n, t].
    #    num_accepted_tokens[n] says which row holds the state to start from:
    #    request 0 accepted 1 token last step (row indices[0, 0] = 5), request 1
    #    accepted 2 (row indices[1, 1] = 0).
    spec_indices = ints(5, 6, 7, 10, 0, 11).view(2, 3)
    num_accepted = ints(1, 2)
    toks = new_tokens(6)
    q, k, v, a, b = toks
    o, _ = fused_sigmoid_gating_delta_rule_update(
        A_log=A_log, a=a, b=b, dt_bias=dt_bias, q=q, k=k, v=v,
        initial_state=pool, inplace_final_state=True,
        cu_seqlens=ints(0, 3, 6), ssm_state_indices=spec_indices,
        num_accepted_tokens=num_accepted, use_qk_l2norm_in_kernel=True)
    print("spec decode: 2 requests x 3 tokens")
    for req in range(2):
        for t in range(3):
            remember(req, toks, 3 * req + t)
            outs, states = reference(A_log, dt_bias, history[req])
            row = spec_indices[req, t].item()
            check("request %d, token %d: o" % (req, t), rel(o[0, 3 * req + t], outs[-1]))
            check("request %d, token %d: pool row %d" % (req, t, row), rel(pool[row], states[-1]))
    # Rolling back is choosing a row: if the model accepts token 0 and draft 1
    # of request 0 (2 tokens), the next step passes num_accepted_tokens[0] = 2
    # and starts from row spec_indices[0, 1] = 6; nothing is recomputed.

    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
