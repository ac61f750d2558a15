#!/usr/bin/env python3
"""bwd_one.py - one forward + backward call of flashqla's CUDA path on
benchmark inputs (bf16, K = V = 128, unit keys), for profilers (ncu, nsys)
that want a single launch of each backward kernel.

    PYTHONPATH=python FLASHQLA_LIB=build/libflashqla.so python3 dev/gpu/bwd_one.py --H 16 --HV 32 --T 8192

--fused-rev MODE (a developer build): fqla_cuda_bwd_tune_fused_rev(MODE) first
(dev/gpu/bwd_fused_rev.py's modes), to profile the fused reverse pass.
"""
import argparse
import ctypes
import os

import torch

import flashqla

ap = argparse.ArgumentParser()
ap.add_argument("--H", type=int, default=16)
ap.add_argument("--HV", type=int, default=32)
ap.add_argument("--T", type=int, default=8192)
ap.add_argument("--N", type=int, default=1, help="equal sequences (varlen)")
ap.add_argument("--K", type=int, default=128)
ap.add_argument("--fused-rev", type=int, default=0, help="developer build: the fused reverse pass's mode")
a = ap.parse_args()
if a.fused_rev:
    # the library flashqla loads (same path: the same handle and globals)
    ctypes.CDLL(os.environ["FLASHQLA_LIB"]).fqla_cuda_bwd_tune_fused_rev(a.fused_rev)
torch.manual_seed(0)
dev, dt = "cuda", torch.bfloat16
q = torch.randn(1, a.T, a.H, a.K, device=dev, dtype=dt)
k = torch.nn.functional.normalize(torch.randn(1, a.T, a.H, a.K, device=dev), dim=-1).to(dt)
v = torch.randn(1, a.T, a.HV, a.K, device=dev, dtype=dt)
g = torch.nn.functional.logsigmoid(torch.randn(1, a.T, a.HV, device=dev)) / 16
beta = torch.rand(1, a.T, a.HV, device=dev)
cu = torch.arange(0, a.T + 1, a.T // a.N, device=dev, dtype=torch.int32) if a.N > 1 else None
for x in (q, k, v, g, beta):
    x.requires_grad_()
o, _ = flashqla.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu)
o.backward(torch.randn_like(o))
torch.cuda.synchronize()
print("bwd_one: done", [tuple(x.grad.shape) for x in (q, k, v, g, beta)])
