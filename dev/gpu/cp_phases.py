#!/usr/bin/env python3
"""cp_phases.py - the library calls one rank of flashqla.distributed makes,
timed apart on one GPU (CUDA events, median of 3 after a warm-up), on the
inputs of bench/bench_cp.py: where a rank's time goes.

    python3 dev/gpu/cp_phases.py [--tokens 131072] [--heads 16,64]
"""
import argparse
import os
import statistics
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))

import flashqla  # noqa: E402
import flashqla.distributed as fcp  # noqa: E402
from flashqla import ops  # noqa: E402
from flashqla.chunk import prepare  # noqa: E402
from bench_cp import inputs  # noqa: E402


def timed(name, fn, iters=3):
    fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    print(f"{name:48s} {statistics.median(ts):9.3f} ms", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=131072)
    ap.add_argument("--heads", default="16,64")
    args = ap.parse_args()
    H, HV = (int(x) for x in args.heads.split(","))
    T, D = args.tokens, 128
    x = inputs(T, H, HV, D, 0, torch.device("cuda"))
    a = prepare(*x.values(), None, None, False, False, False, None, None, False, False, False,
                None, None, None, None)
    P = fcp._Problem(*a[:7], a[10], a[11], a[13])
    o = torch.empty_like(P.v)
    cu = torch.tensor([0, T], dtype=torch.int64)
    per_head = fcp.carry_prefixes(P.g, P.beta, P.k, P.flags)
    carry = [h for h, p in enumerate(per_head) if p is None]
    fade = [h for h, p in enumerate(per_head) if p is not None]
    print(f"T={T} H={H} HV={HV}: {len(carry)} carry heads, fade prefix "
          f"{max((per_head[h] for h in fade), default=0)}")
    S = torch.randn(1, HV, D, D, device="cuda") * 0.1
    timed("fwd all heads (chunk_gated_delta_rule)",
          lambda: flashqla.chunk_gated_delta_rule(**x, cu_seqlens=cu.cuda(), cu_seqlens_cpu=cu))
    timed("fwd all heads, _fwd out= in place", lambda: fcp._fwd(P, [(0, T)], o, final=True))
    timed("fwd all heads from S", lambda: fcp._fwd(P, [(0, T)], o, h0=S, final=True))
    timed("carry_prefixes", lambda: fcp.carry_prefixes(P.g, P.beta, P.k, P.flags))
    timed("heads(carry) copies", lambda: P.heads(carry))
    timed("heads(carry, values=False) copies", lambda: P.heads(carry, values=False))
    Pc = P.heads(carry)
    oc = torch.empty_like(Pc.v)
    timed("fwd carry heads, zero start", lambda: fcp._fwd(Pc, [(0, T)], oc, final=True))
    timed("fwd carry heads from S", lambda: fcp._fwd(Pc, [(0, T)], oc, h0=S[:, carry].contiguous(), final=True))
    timed("_carried carry heads (K cols, h0 = I)", lambda: fcp._carried(Pc))
    eye = torch.eye(D, device="cuda").expand(1, len(carry), D, D).contiguous()
    z = Pc.v.new_zeros(Pc.v.shape)
    timed("carry heads: zero values, h0 = I, no final",
          lambda: ops.fwd_impl(Pc.q, Pc.k, z, Pc.g, Pc.beta, None, None, eye, None, None, P.scale,
                               P.flags, False, P.backend))
    timed("carry heads: zero values, no h0",
          lambda: ops.fwd_impl(Pc.q, Pc.k, z, Pc.g, Pc.beta, None, None, None, None, None, P.scale,
                               P.flags, True, P.backend))
    timed("carry heads: zero values, h0=I, cu_seqlens",
          lambda: ops.fwd_impl(Pc.q, Pc.k, z, Pc.g, Pc.beta, None, None, eye, cu.cuda().int(), cu,
                               P.scale, P.flags, True, P.backend))
    o_m, _ = fcp._carried(Pc)
    c = fcp._Carry(fade, carry, max((per_head[h] for h in fade), default=0), o_m)
    timed("einsum o_M S", lambda: torch.einsum("bthk,hkv->bthv", o_m.float(), S[0, carry]))
    timed("o[:, :, carry] gather + put", lambda: o.__setitem__((slice(None), slice(None), carry),
                                                             o[:, :, carry]))

    def apply():
        c.o_m = o_m
        fcp._apply_carry(P, o, (0, T), c, S)
    timed("_apply_carry (einsum, put, prefix rerun)", apply)
    do = torch.randn_like(P.v)
    timed("bwd all heads from S", lambda: ops.bwd_impl(P.q, P.k, P.v, P.g, P.beta, None, None, S,
                                                        None, None, do, None, P.scale, P.flags,
                                                        P.backend))
    timed("bwd all heads from S, cu_seqlens host", lambda: ops.bwd_impl(
        P.q, P.k, P.v, P.g, P.beta, None, None, S, cu.cuda().int(), cu, do, None, P.scale,
        P.flags, P.backend))
    doc = do[:, :, carry].contiguous()
    timed("bwd carry heads from S, cu_seqlens host", lambda: ops.bwd_impl(
        Pc.q, Pc.k, Pc.v, Pc.g, Pc.beta, None, None, S[:, carry].contiguous(), cu.cuda().int(), cu,
        doc, None, P.scale, P.flags, P.backend))
    timed("bwd carry heads from S, no cu_seqlens", lambda: ops.bwd_impl(
        Pc.q, Pc.k, Pc.v, Pc.g, Pc.beta, None, None, S[:, carry].contiguous(), None, None,
        doc, None, P.scale, P.flags, P.backend))


if __name__ == "__main__":
    main()
