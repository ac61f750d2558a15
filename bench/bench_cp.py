#!/usr/bin/env python3
"""bench_cp.py - context parallelism across GPUs (flashqla.distributed):
one long sequence split evenly over the ranks, forward and backward.

    for n in 1 2 4 8; do
        torchrun --standalone --nproc_per_node=$n bench/bench_cp.py
    done
    torchrun --standalone --nproc_per_node=2 bench/bench_cp.py --tokens 131072 --iters 3
    torchrun --standalone --nproc_per_node=2 bench/bench_cp.py --cpu --tokens 512 --heads 2,4 \
        --dim 32 --out /tmp/cp.csv        (a smoke run of the script on the CPU, gloo)

Inputs as docs/benchmarks.md: l2-normalised bf16 q/k, bf16 v, fp32
g = logsigmoid(randn)/16 with a random quarter of the value heads ungated
(so no rank's carried state fades: the gate-driven shortcut never applies,
the worst case for the ranks that carry a transition), fp32 beta; one
sequence of --tokens (default 2^20; one H200 runs out of memory in the
backward there, so the 1-GPU baseline needs 2^18 or 2^19) tokens, (H, HV) = --heads (16, 64),
K = V = --dim (128). On one GPU the plain flashqla.chunk_gated_delta_rule
runs (the baseline); on N the distributed one, each rank holding tokens / N.

Times (CUDA events, median of --iters after one untimed step, every rank
starting together after a barrier; a rank's time is the slowest rank's,
the all-reduce of the maxima): fwd_ms, the forward alone; bwd_ms, the
backward alone (after an untimed forward). Communication apart: comm_ms is
the median time of the collectives flashqla.distributed makes in one
forward + backward (one all-gather of the per-rank [kind | H | M] records,
one of the per-rank start-state gradients), each run alone on buffers of the
same sizes, so it excludes waiting for slower ranks. One CSV row per run is
appended to --out (bench/results/cp-multi-h200.csv):
op,tokens,h_qk,h_v,dim,gpus,fwd_ms,bwd_ms,comm_ms,fwd_eff,bwd_eff,gpu,commit,date
with the parallel efficiencies time(1 GPU) / (N x time(N GPUs)) against the
file's 1-GPU row of the same commit and shape (empty when there is none
yet: run 1 GPU first).
"""

import argparse
import csv
import datetime
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import flashqla  # noqa: E402
import flashqla.distributed as fcp  # noqa: E402

FIELDS = ["op", "tokens", "h_qk", "h_v", "dim", "gpus", "fwd_ms", "bwd_ms", "comm_ms",
          "fwd_eff", "bwd_eff", "gpu", "commit", "date"]


def commit():
    try:
        return subprocess.check_output(["git", "-C", HERE, "rev-parse", "--short", "HEAD"],
                                       text=True, stderr=subprocess.DEVNULL).strip()
    except Exception:
        return "unknown"


def inputs(T, H, HV, D, rank, device):
    gen = torch.Generator(device=device).manual_seed(1234 + rank)
    q = torch.randn(1, T, H, D, device=device, generator=gen).to(torch.bfloat16)
    k = torch.nn.functional.normalize(torch.randn(1, T, H, D, device=device, generator=gen),
                                      dim=-1).to(torch.bfloat16)
    v = torch.randn(1, T, HV, D, device=device, generator=gen).to(torch.bfloat16)
    g = torch.nn.functional.logsigmoid(torch.randn(1, T, HV, device=device, generator=gen)) / 16
    ungated = torch.Generator().manual_seed(99)   # the same heads on every rank
    g[:, :, torch.randperm(HV, generator=ungated)[:HV // 4].to(device)] = 0
    beta = torch.rand(1, T, HV, device=device, generator=gen)
    return dict(q=q, k=k, v=v, g=g, beta=beta)


def timed(fn, iters, world, cpu=False):
    """Median over iters of the slowest rank's time of fn() (ms)."""
    times = []
    for _ in range(iters):
        if world > 1:
            dist.barrier()
        if cpu:
            start = time.perf_counter()
            fn()
            t = torch.tensor([1e3 * (time.perf_counter() - start)])
        else:
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            t = torch.tensor([a.elapsed_time(b)], device="cuda")
        if world > 1:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        times.append(t.item())
    return statistics.median(times)


def baseline(out, key):
    """The 1-GPU row of this commit and shape in the CSV, or None."""
    if not os.path.exists(out):
        return None
    with open(out) as f:
        rows = [r for r in csv.DictReader(f) if r["gpus"] == "1"
                and (r["tokens"], r["h_qk"], r["h_v"], r["dim"], r["commit"]) == key]
    return rows[-1] if rows else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=1 << 20)
    ap.add_argument("--heads", default="16,64", help="H,HV")
    ap.add_argument("--dim", type=int, default=128, help="K = V")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "cp-multi-h200.csv"))
    ap.add_argument("--cpu", action="store_true",
                    help="a smoke run of this script on the CPU backend with gloo (small --tokens)")
    args = ap.parse_args()
    cpu = args.cpu
    H, HV = (int(x) for x in args.heads.split(","))
    D = args.dim

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if cpu:
        device = torch.device("cpu")
        flashqla.set_cpu_threads(1)
        if world > 1:
            dist.init_process_group("gloo")
    else:
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
        if world > 1:
            dist.init_process_group("nccl", device_id=device)
    if args.tokens % world:
        sys.exit(f"--tokens {args.tokens} is not a multiple of {world} ranks")
    T = args.tokens // world
    x = inputs(T, H, HV, D, rank, device)
    cu = torch.tensor([0, args.tokens], dtype=torch.int64)
    offsets = [r * T for r in range(world + 1)]

    def forward(**kw):
        if world == 1:
            return flashqla.chunk_gated_delta_rule(**x, **kw, cu_seqlens=cu.to(device),
                                                   cu_seqlens_cpu=cu)[0]
        return fcp.chunk_gated_delta_rule(**x, **kw, cu_seqlens_cpu=cu, offsets=offsets)[0]

    with torch.no_grad():
        forward()
        fwd_ms = timed(forward, args.iters, world, cpu)

    bwd_ms, bwd_why = None, ""
    try:
        for t in x.values():
            t.requires_grad_()
        d_o = torch.randn(1, T, HV, D, device=device).to(torch.bfloat16)
        bwd_times = []
        for i in range(args.iters + 1):
            o = forward()
            ms = timed(lambda: o.backward(d_o), 1, world, cpu)
            if i:
                bwd_times.append(ms)
            for t in x.values():
                t.grad = None
            del o
        bwd_ms = statistics.median(bwd_times)
    except NotImplementedError as e:   # no backward on this backend (raised alike on every rank)
        bwd_why = str(e)
        for t in x.values():
            t.requires_grad_(False)
    except torch.OutOfMemoryError as e:
        # one GPU cannot hold the backward of 2^20 tokens (its workspace): keep the
        # forward's row. With several ranks one rank's failure would leave the
        # others in a collective, so there it stops the run.
        if world > 1:
            raise
        bwd_why = f"out of memory ({str(e).splitlines()[0]})"
        for t in x.values():
            t.grad = None
            t.requires_grad_(False)
        torch.cuda.empty_cache()

    comm_ms = 0.0
    if world > 1:
        rec = torch.zeros(4 + HV * D * D + HV * D * D, device=device)   # [kind | H | M]
        grec = torch.zeros(2 + HV * D * D, device=device)               # [kind | dS]
        bufs = [torch.empty_like(rec) for _ in range(world)]
        gbufs = [torch.empty_like(grec) for _ in range(world)]

        def comm():
            dist.all_gather(bufs, rec)
            dist.all_gather(gbufs, grec)
        comm()
        comm_ms = timed(comm, max(args.iters, 10), world, cpu)

    if rank == 0:
        key = (str(args.tokens), str(H), str(HV), str(D), commit())
        base = baseline(args.out, key) if world > 1 else None
        fwd_eff = bwd_eff = ""
        if world == 1:
            fwd_eff = bwd_eff = "1.000"
        elif base:
            fwd_eff = f"{float(base['fwd_ms']) / (world * fwd_ms):.3f}"
            if bwd_ms and base["bwd_ms"]:
                bwd_eff = f"{float(base['bwd_ms']) / (world * bwd_ms):.3f}"
        row = dict(op="cp", tokens=args.tokens, h_qk=H, h_v=HV, dim=D, gpus=world,
                   fwd_ms=f"{fwd_ms:.3f}", bwd_ms="" if bwd_ms is None else f"{bwd_ms:.3f}",
                   comm_ms=f"{comm_ms:.3f}",
                   fwd_eff=fwd_eff, bwd_eff=bwd_eff,
                   gpu="cpu" if cpu else torch.cuda.get_device_name(device).replace(",", " "),
                   commit=key[4],
                   date=datetime.date.today().isoformat())
        new = not os.path.exists(args.out)
        os.makedirs(os.path.dirname(args.out), exist_ok=True)
        with open(args.out, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=FIELDS)
            if new:
                w.writeheader()
            w.writerow(row)
        step = fwd_ms + (bwd_ms or 0.0)
        print(f"cp gpus={world} tokens={args.tokens} heads={H},{HV} dim={D} fwd_ms={fwd_ms:.3f} "
              f"bwd_ms={'-' if bwd_ms is None else f'{bwd_ms:.3f}'} comm_ms={comm_ms:.3f} "
              f"comm_share={comm_ms / step:.3f} fwd_eff={fwd_eff or '-'} bwd_eff={bwd_eff or '-'}")
        if bwd_why:
            print(f"backward not run: {bwd_why}")
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
