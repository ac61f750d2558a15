#!/usr/bin/env python3
"""precision_sweep.py - the forward's error against the fp64 reference, on the
GPU, flashqla beside FLA, on the inputs where the numpy model
(dev/models/inverse_precision.py) says every bf16 implementation leaves
docs/testing.md's 5e-3 bound or where the gate-free inverse overflows:

  - no decay (g = 0), beta in {0, 1, 1.99}, unit q / k rows, over T = 130
    (test_gpu_fwd's length) to 4096;
  - raw N(0, 1) keys (norm ~11, no l2norm) under strong decay (g ~ -20),
    sigmoid beta: the recurrence is stable, the gate-free inverse is not;
  - for scale, default gates with unit rows at T = 4096.

    FLASHQLA_LIB=build/libflashqla.so PYTHONPATH=python:/tmp/site \\
        python3 dev/gpu/precision_sweep.py [--seed N]

Prints, per case and implementation, the worst rel(o) and rel(final state)
over heads (docs/testing.md's metric) and the count of non-finite outputs.
"""
import argparse

import torch


def draw(T, H, nodecay, raw_keys, gen, dev):
    """Inputs as tests/test_gpu_fwd.c draws them (one sequence, H = HV)."""
    q = torch.randn(1, T, H, 128, generator=gen, device=dev, dtype=torch.float64)
    k = torch.randn(1, T, H, 128, generator=gen, device=dev, dtype=torch.float64)
    q = q / q.norm(dim=-1, keepdim=True)
    if not raw_keys:
        k = k / k.norm(dim=-1, keepdim=True)
    v = torch.randn(1, T, H, 128, generator=gen, device=dev, dtype=torch.float64)
    u = torch.rand(1, T, H, generator=gen, device=dev, dtype=torch.float64)
    if nodecay:
        g = torch.zeros_like(u)
        beta = torch.where(u < 0.3, 0.0, torch.where(u < 0.6, 1.0, 1.99))
    elif raw_keys:
        g = -20.0 + 0.5 * u
        beta = torch.sigmoid(torch.randn(1, T, H, generator=gen, device=dev, dtype=torch.float64))
    else:
        x = torch.randn(1, T, H, generator=gen, device=dev, dtype=torch.float64)
        g = -torch.nn.functional.softplus(-x) / 16.0
        beta = torch.sigmoid(torch.randn(1, T, H, generator=gen, device=dev, dtype=torch.float64))
    h0 = torch.randn(1, H, 128, 128, generator=gen, device=dev, dtype=torch.float64)
    bf = lambda x: x.to(torch.bfloat16)
    return bf(q), bf(k), bf(v), g.float(), beta.float(), h0.float()


def reference(q, k, v, g, beta, h0, scale):
    """The library's fp64 reference (docs/design.md §1's recurrence, on the CPU)
    on the same inputs."""
    import flashqla
    x64 = [t.detach().cpu().double() for t in (q, k, v, g, beta, h0)]
    return flashqla.chunk_gated_delta_rule(*x64[:5], scale=scale, initial_state=x64[5], output_final_state=True,
                                           backend="reference")


def worst_rel(x, ref, head_dim):
    x, ref = x.detach().double().cpu(), ref.double()
    diff = (x - ref).transpose(0, head_dim).flatten(1)
    return (diff.norm(dim=1) / ref.transpose(0, head_dim).flatten(1).norm(dim=1)).max().item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke test of the script")
    ap.add_argument("--lengths", default="130,512,1024,4096", help="no-decay lengths")
    a = ap.parse_args()
    from flashqla.chunk import chunk_gated_delta_rule as ours
    impls = [("flashqla", ours)]
    try:  # FLA's Triton kernels need the GPU
        if a.device != "cuda":
            raise ImportError("its kernels run on the GPU only")
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla
        impls.append(("fla", fla))
    except (ImportError, RuntimeError) as e:
        print(f"FLA not used ({e}): flashqla only")
    gen = torch.Generator(device=a.device).manual_seed(a.seed)
    cases = [(f"no decay, beta in {{0, 1, 1.99}}, T = {T}", T, True, False) for T in map(int, a.lengths.split(","))]
    cases += [("raw N(0,1) keys, strong decay, T = 1000", 1000, False, True),
              ("default gates, unit rows, T = 4096", 4096, False, False)]
    H, scale = 4, 128 ** -0.5
    print(f"{'case':48s} {'impl':9s} {'o':>9s} {'state':>9s} non-finite")
    for name, T, nodecay, raw in cases:
        q, k, v, g, beta, h0 = draw(T, H, nodecay, raw, gen, a.device)
        o_ref, s_ref = reference(q, k, v, g, beta, h0, scale)
        for label, fn in impls:
            o, s = fn(q, k, v, g, beta, scale=scale, initial_state=h0, output_final_state=True)
            if a.device == "cuda":
                torch.cuda.synchronize()
            bad = (~torch.isfinite(o)).sum().item() + (~torch.isfinite(s)).sum().item()
            print(f"{name:48s} {label:9s} {worst_rel(o, o_ref, 2):9.2e} {worst_rel(s, s_ref, 1):9.2e} {bad}",
                  flush=True)


if __name__ == "__main__":
    main()
