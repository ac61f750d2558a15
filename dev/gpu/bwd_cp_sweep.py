#!/usr/bin/env python3
"""bwd_cp_sweep.py - the CUDA backward's time against the chains' CP segment
length, on bench/bench_bwd.py's rows and inputs (its sequence splits, a
quarter of the value heads ungated), to calibrate cp_plan.h's backward plan
against the GPU rather than against its own step count.

Needs a developer build (make DEV=1), whose fqla_cuda_bwd_tune_cp forces the
length. Per row: the planner's choice ("plan"), CP off (L = 0) and a ladder of
lengths below the longest sequence's chunk count, each as its own workspace
query and call; every call's gradients are compared with the plan's (CP only
reorders fp32 sums of the state chains, so they agree to ~1e-3; a larger
difference marks the row's summary line DIFFERS at that length). Times by
bench_fwd.py's CUDA-graph replay with the L2 flushed. One CSV line per (row,
L) in --out; per row a summary line: the plan's length and time, the best
length and its time.

    python3 dev/gpu/bwd_cp_sweep.py --lib build-dev/libflashqla.so [--rows hk8_hv16:8k_4seq,...]

With --nwg it sweeps instead the chains' warpgroups a CTA
(fqla_cuda_bwd_tune_nwg; bwd.cu's chain_nwg_of picks, 2 wherever CP runs):
the plan, 1 and 2, at the planned segment length. With --both, every length
of the ladder (and CP off) with one warpgroup a CTA and with two: the data
for pricing the shape and the length together.
"""
import argparse
import ctypes as C
import csv
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import bench_bwd as bb  # noqa: E402  (BWD_SPLITS, FqlaBwd, rel, the anchors' rows)
import bench_fwd as bf  # noqa: E402  (Lib, make_inputs, time_graph)

LADDER = [4, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 128, 192, 256]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=os.path.join(ROOT, "build-dev", "libflashqla.so"))
    ap.add_argument("--rows", default="", help="comma-separated model:seqlens (default: all 32)")
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--replays", type=int, default=7)
    ap.add_argument("--out", default="bwd-cp-sweep.csv")
    ap.add_argument("--nwg", action="store_true", help="sweep the chains' warpgroups a CTA, not the CP length")
    ap.add_argument("--both", action="store_true", help="sweep the CP length with 1 and with 2 warpgroups a CTA")
    a = ap.parse_args()

    lib = bf.Lib(a.lib, "dev")
    tune = getattr(lib.L, "fqla_cuda_bwd_tune_cp", None)
    last = getattr(lib.L, "fqla_cuda_bwd_last_seg_chunks", None)
    if tune is None or last is None:
        sys.exit("bwd_cp_sweep.py: %s is not a developer build (make DEV=1)" % a.lib)
    tune.argtypes = [C.c_int64]
    last.restype = C.c_int64
    tune_nwg = getattr(lib.L, "fqla_cuda_bwd_tune_nwg", None)
    last_nwg = getattr(lib.L, "fqla_cuda_bwd_last_nwg", None)
    if (a.nwg or a.both) and (tune_nwg is None or last_nwg is None):
        sys.exit("bwd_cp_sweep.py: %s has no fqla_cuda_bwd_tune_nwg (a developer build of 9df5713 or later)" % a.lib)
    if tune_nwg is None:  # an older developer build: one shape, recorded as 0
        tune_nwg, last_nwg = (lambda n: None), (lambda: 0)

    rows = bb.table_rows(a.rows)
    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.float32, device="cuda")
    gpu = torch.cuda.get_device_name().replace(" ", "_")
    f = open(a.out, "a", newline="")
    w = csv.writer(f)
    if f.tell() == 0:
        w.writerow(["model", "seqlens", "seg_chunks", "nwg", "planned", "ms", "max_rel_vs_plan", "gpu"])
    for ri, (model, hq, hv, sl) in enumerate(rows):
        lens = bb.BWD_SPLITS[sl]
        q, k, v, g, beta, h0, cu, cu_host, do, dht = bb.row_inputs(hq, hv, sl, ri)
        chunks = (max(lens) + 63) // 64
        lengths = [0] + [x for x in LADDER if x < chunks]
        # (segment length, warpgroups a CTA); -1: the plan's
        if a.nwg:
            sweep = [(-1, -1), (-1, 1), (-1, 2)]
        elif a.both:
            sweep = [(-1, -1)] + [(L, n) for L in lengths for n in (1, 2)]
        else:
            sweep = [(-1, -1)] + [(L, -1) for L in lengths]
        results, ref, seen = [], None, set()
        for L, nwg in sweep:
            tune(L)
            tune_nwg(nwg)
            call = bb.FqlaBwd(lib, q, k, v, g, beta, h0, cu, cu_host, do, dht)
            used = int(last())  # the workspace query recorded the length
            if L > 0 and used != L:
                continue  # refused: a length the workspace or the plan does not take
            call()
            torch.cuda.synchronize()
            used_nwg = int(last_nwg())  # the run records the warpgroups
            if (used, used_nwg) in seen and L != -1:
                continue  # the same launch as one timed already (the plan's)
            seen.add((used, used_nwg))
            grads = {n: x.clone() for n, x in call.grads.items()}
            if ref is None:
                ref, planned = grads, (used, used_nwg)
            err = max(bb.rel(grads[n], ref[n]) for n in grads)
            ms = bf.time_graph(call, flush, a.calls, a.replays)
            results.append((used, used_nwg, ms, err))
            w.writerow([model, sl, used, used_nwg, int(L == -1 and nwg == -1), "%.4f" % ms, "%.1e" % err, gpu])
            f.flush()
            del call
        tune(-1)
        tune_nwg(-1)
        torch.cuda.empty_cache()
        plan_ms = results[0][2]
        best = min(results, key=lambda r: r[2])
        bad = [r for r in results if r[3] > 1e-2]
        print("%-10s %-9s plan L=%3d nwg=%d %.3f ms | best L=%3d nwg=%d %.3f ms (x%.3f) | %s%s" % (
            model, sl, planned[0], planned[1], plan_ms, best[0], best[1], best[2], best[2] / plan_ms,
            " ".join("%d/%d:%.3f" % (r[0], r[1], r[2]) for r in results[1:]),
            "  DIFFERS at %s" % ",".join("%d/%d" % (r[0], r[1]) for r in bad) if bad else ""), flush=True)
    f.close()


if __name__ == "__main__":
    main()
