#!/usr/bin/env python3
"""bwd_quick.py - a developer's first look at the CUDA backward: gradients
of a few shapes and options against the fp64 reference backward (relative
L2 error of each gradient, docs/testing.md), then the backward's time on a
few benchmark shapes beside the forward's, in one process.

    PYTHONPATH=python FLASHQLA_LIB=build/libflashqla.so python3 dev/gpu/bwd_quick.py [--no-time]

The tests proper are tests/test_gpu_bwd.c and python/tests/test_gpu.py.
"""
import argparse
import itertools
import math
import os
import re
import sys
import time

import torch

import flashqla

TOL = dict(q=8e-3, k=8e-3, v=8e-3, initial_state=8e-3, g=2e-2, beta=2e-2, A_log=2e-2, dt_bias=2e-2)


def rel(x, ref):
    x, ref = x.detach().double().cpu(), ref.detach().double().cpu()
    if not torch.isfinite(x).all():
        return math.inf
    n = ref.norm().item()
    return (x - ref).norm().item() / n if n > 0 else (x - ref).norm().item()


def inputs(B, T, H, HV, K, V, h0, gate, beta_range=(0.0, 1.0), l2=False, gik=False, bsig=False):
    torch.manual_seed(0)
    q = torch.randn(B, T, H, K)
    k = torch.randn(B, T, H, K)
    if not l2:
        k = torch.nn.functional.normalize(k, dim=-1)
    x = dict(q=q, k=k, v=torch.randn(B, T, HV, V))
    if gik:
        x["g"] = torch.randn(B, T, HV)
        x["A_log"] = torch.rand(HV)
        x["dt_bias"] = torch.randn(HV)
    else:
        x["g"] = gate(B, T, HV)
    lo, hi = beta_range
    x["beta"] = torch.randn(B, T, HV) if bsig else lo + (hi - lo) * torch.rand(B, T, HV)
    if h0:
        x["initial_state"] = torch.randn(B, HV, K, V)
    return x


def run(x, dev, dtype, kw, do, dht):
    t = {}
    for n, v in x.items():
        v = v.to(dev)
        if n in ("q", "k", "v"):
            v = v.to(dtype)
        elif dev == "cpu":
            v = v.double()
        t[n] = v.detach().requires_grad_()
    o, ht = flashqla.chunk_gated_delta_rule(**t, output_final_state=True, **kw)
    loss = (o.double() * do.to(o.device).double()).sum() + (ht.double() * dht.to(ht.device).double()).sum()
    loss.backward()
    return {n: v.grad for n, v in t.items()}


def check(name, B, T, H, HV, K, V, h0=True, gate=None, dtype=torch.bfloat16, cu=None, **opt):
    gate = gate or (lambda *s: torch.nn.functional.logsigmoid(torch.randn(*s)) / 16)
    kwx = {k: opt.pop(k) for k in ("beta_range", "l2", "gik", "bsig") if k in opt}
    x = inputs(B, T, H, HV, K, V, h0, gate, **kwx)
    # both sides see the same (rounded) q, k, v: the input rounding is not the kernels' error
    for n in ("q", "k", "v"):
        x[n] = x[n].to(dtype).float()
    kw = dict(opt)
    if kwx.get("l2"):
        kw["use_qk_l2norm_in_kernel"] = True
    if kwx.get("gik"):
        kw["use_gate_in_kernel"] = True
    if kwx.get("bsig"):
        kw["use_beta_sigmoid_in_kernel"] = True
    if cu is not None:
        kw["cu_seqlens"] = torch.tensor(cu, dtype=torch.int32)
        if h0:
            x["initial_state"] = torch.randn(len(cu) - 1, HV, K, V)
    N = len(cu) - 1 if cu is not None else B
    do = torch.randn(B, T, HV, V)
    dht = torch.randn(N, HV, K, V)
    kwg = dict(kw)
    if cu is not None:
        kwg["cu_seqlens"] = kw["cu_seqlens"].cuda()
    try:
        g = run(x, "cuda", dtype, kwg, do, dht)
    except Exception as e:  # noqa: BLE001 - a report, not a test
        print(f"{name:28s} CUDA failed: {str(e)[:200]}")
        return False
    r = run(x, "cpu", torch.float64, dict(kw, backend="reference"), do, dht)
    ok = True
    parts = []
    for n in g:
        if g[n] is None:
            continue
        e = rel(g[n], r[n])
        bad = e > TOL.get(n, 8e-3)
        ok &= not bad
        parts.append(f"{n}={e:.1e}{'!' if bad else ''}")
    # bit-identical rerun
    g2 = run(x, "cuda", dtype, kwg, do, dht)
    same = all(torch.equal(g[n], g2[n]) for n in g if g[n] is not None)
    print(f"{name:28s} {'ok ' if ok and same else 'BAD'} {' '.join(parts)} rerun={'same' if same else 'DIFF'}")
    return ok and same


def timing(H, HV, T, N, K=128, V=128, reps=10, ungated=0.0, lengths=None):
    """lengths: the sequences' lengths (T and N follow from them), else N of T // N."""
    torch.manual_seed(0)
    if lengths:
        T, N = sum(lengths), len(lengths)
    B = 1
    q = torch.nn.functional.normalize(torch.randn(B, T, H, K), dim=-1).cuda().bfloat16().requires_grad_()
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K), dim=-1).cuda().bfloat16().requires_grad_()
    v = torch.randn(B, T, HV, V).cuda().bfloat16().requires_grad_()
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, HV)) / 16
    if ungated > 0:  # as bench/bench_fwd.py's make_inputs: that share of the value heads without decay
        g[:, :, torch.randperm(HV)[: math.ceil(ungated * HV)]] = 0.0
    g = g.cuda().requires_grad_()
    beta = torch.rand(B, T, HV).cuda().requires_grad_()
    if lengths:
        cu = torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32)
    else:
        cu = torch.arange(0, T + 1, T // N, dtype=torch.int32)
    # the host copy as bench/bench_bwd.py passes it: the chains' CP plan reads
    # the longest sequence from it
    kw = dict(cu_seqlens=cu.cuda(), cu_seqlens_cpu=cu)
    o, _ = flashqla.chunk_gated_delta_rule(q, k, v, g, beta, **kw)
    do = torch.randn_like(o)
    for _ in range(2):
        torch.autograd.grad(o, (q, k, v, g, beta), do, retain_graph=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        torch.autograd.grad(o, (q, k, v, g, beta), do, retain_graph=True)
    torch.cuda.synchronize()
    tb = (time.perf_counter() - t0) / reps * 1e3
    t0 = time.perf_counter()
    for _ in range(reps):
        flashqla.chunk_gated_delta_rule(q.detach(), k.detach(), v.detach(), g.detach(), beta.detach(), **kw)
    torch.cuda.synchronize()
    tf = (time.perf_counter() - t0) / reps * 1e3
    shape = f"lengths {'+'.join(map(str, lengths))}" if lengths else f"T={T} N={N}"
    print(f"timing hk{H}_hv{HV} {shape} ungated {ungated:g}: bwd {tb:.3f} ms  fwd {tf:.3f} ms")
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch.autograd.grad(o, (q, k, v, g, beta), do, retain_graph=True)
        torch.cuda.synchronize()
    per = {}
    evs = sorted((ev for ev in prof.events() if ev.device_type.name == "CUDA"), key=lambda ev: ev.time_range.start)
    # with CP the chains' kernel runs twice: the pre-pass (before the scan) and the main pass
    scan_at = [ev.time_range.start for ev in evs if "bwd_chain_scan_kernel" in ev.name]
    for ev in evs:
        m = re.search(r"(\w+_kernel)", ev.name)
        name = m.group(1) if m else ev.name[:40]
        c = re.search(r"bwd_chain_kernel<([^>]*)>", ev.name)
        if c:
            # <T, KD, CONVERT, DIRS> since b08227a (DIRS 0: both chains in one launch,
            # 1: the reverse chain alone, 2: the state chain alone); builds before both
            # chains ran in one launch had <T, KD, REVERSE, CONVERT>; between them <T, KD, CONVERT>
            args = [x.strip() for x in c.group(1).split(",")]
            last = re.sub(r"^\(\w+\)", "", args[-1]) if args else ""
            if len(args) == 4 and last.isdigit():
                name = {"1": "dstates", "2": "states"}.get(last, "chains")
            elif len(args) == 4:
                name = "dstates" if args[2] in ("true", "1", "(bool)1") else "states"
            else:
                name = "chains"
            if scan_at and ev.time_range.start < scan_at[0]:
                name += ".pre"
        if name == "bwd_grads_kernel" and re.search(r"gw_route\)?2>|gw_route::tails", ev.name):
            name += ".tails"
        per[name] = per.get(name, 0.0) + ev.device_time_total / 1e3
    print("   kernels (ms): " + ", ".join(f"{n}={t:.3f}" for n, t in sorted(per.items(), key=lambda x: -x[1])[:8]))


def parse_row(r):
    """H,HV,T,N or H,HV,SPLIT (a name of bench_bwd.py's BWD_SPLITS) -> (H, HV, T, N, lengths or None)."""
    f = r.split(",")
    if len(f) == 3:
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
        from bench_bwd import BWD_SPLITS
        lens = list(BWD_SPLITS[f[2]])
        return int(f[0]), int(f[1]), sum(lens), len(lens), lens
    H, HV, T, N = (int(x) for x in f)
    return H, HV, T, N, None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-time", action="store_true")
    ap.add_argument("--time-only", action="store_true", help="skip the checks (e.g. timing a base build)")
    ap.add_argument("--ungated", type=float, default=0.0,
                    help="share of the value heads timed without decay (the benchmark's inputs: 0.25)")
    ap.add_argument("--rows", default="16,32,32768,1;2,4,8192,1",
                    help="timed shapes H,HV,T,N, or H,HV,SPLIT with a split of bench/bench_bwd.py's "
                         "BWD_SPLITS (e.g. 4,8,8k_8seq), separated by ';' (default: %(default)s)")
    a = ap.parse_args()
    rows = [parse_row(r) for r in a.rows.split(";") if r]
    if a.time_only:
        for H, HV, T, N, lens in rows:
            timing(H, HV, T, N, ungated=a.ungated, lengths=lens)
        return 0
    strong = lambda *s: torch.full(s, -20.0)
    zero = lambda *s: torch.zeros(s)
    ok = True
    ok &= check("T64 g1", 1, 64, 1, 1, 128, 128)
    ok &= check("T200 g2", 1, 200, 2, 4, 128, 128)
    ok &= check("T1000 g4 fp16", 1, 1000, 1, 4, 128, 128, dtype=torch.float16)
    ok &= check("B2 T129 K64", 2, 129, 2, 2, 64, 64)
    ok &= check("nodecay", 1, 1024, 1, 2, 128, 128, gate=zero)
    ok &= check("strong T3000", 1, 3000, 1, 1, 128, 128, gate=strong, h0=False)
    ok &= check("neg_eig", 1, 1024, 1, 2, 128, 128, gate=zero, beta_range=(1.9, 2.0))
    ok &= check("varlen", 1, 300, 1, 2, 128, 128, cu=[0, 1, 65, 65, 200, 300])
    ok &= check("opts l2 gik bsig", 1, 300, 2, 4, 128, 128, l2=True, gik=True, bsig=True)
    ok &= check("v_first", 1, 150, 1, 1, 128, 128, state_v_first=True)
    ok &= check("g8 V256", 1, 100, 1, 8, 128, 256)
    ok &= check("V96 K64 CP", 1, 2000, 1, 1, 64, 96, gate=strong, h0=False)
    ok &= check("V32 l2 fp16", 1, 700, 1, 2, 128, 32, dtype=torch.float16, l2=True)
    print("ALL OK" if ok else "SOME FAILED")
    if not a.no_time:
        for H, HV, T, N, lens in rows:
            timing(H, HV, T, N, ungated=a.ungated, lengths=lens)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
