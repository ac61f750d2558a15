#!/usr/bin/env python3
"""bwd_fused_rev.py - the fused reverse pass under construction
(src/dev/bwd_fused_rev.cu) against the reverse chain and gradient kernel it
replaces, on bench/bench_bwd.py's rows and inputs, in one process.

Needs a developer build (make DEV=1): fqla_cuda_bwd_tune_fused_rev(mode)
switches the pass (0 the reverse chain; 1 the whole V a CTA, 3 a CTA per
value half; 2, 4 the same without their dS stores; 5 the half-width pass with
the gradient work of the chunks whose states are bf16 planes, the gradient
kernel for the others; 6 mode 5 with dq / dk unsummed, timing only, dq / dk
wrong by design); every mode runs the planner's CP (the fused pass runs
CP's main pass in place of the reverse chain's), or with --cp-off none. Per
row, timed by CUDA-graph replay with the L2 flushed:
  dh0   the gradient w.r.t. h0 alone: prepare + the reverse chain (or the
        pass), modes 0-4 (5 and 6 leave dh0 alone to the reverse chain)
  full  the whole backward, modes 0, 1, 3, 5, 6: the chains (the state chain
        then the pass, or both chains in their usual launches), the gradient
        kernel, finish
and the largest relative difference of every gradient from mode 0's (both
are split-product bf16, ~1e-3 apart is rounding, >1e-2 is a bug). The
timing prototypes and dq / dk sums of earlier builds (modes 5-14 of 2452c75)
are in docs/history/2026-12-07d-fusedproto.md and 2026-12-07f-fusedred.md.

    python3 dev/gpu/bwd_fused_rev.py --lib build-dev/libflashqla.so [--rows hk16_hv32:32k_1seq,...] [--modes 0,1,3,5]
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


def dh0_only(call):
    """The same call with only d_initial_state asked for."""
    a = call.args
    for name in ("dq", "dk", "dv", "dg", "dbeta"):
        setattr(a, name, bf.Tensor())
    n = C.c_size_t()
    call.lib.check(call.lib.L.fqla_bwd_workspace_size(call.lib.ctx, C.byref(a), C.byref(n)), "workspace")
    call.ws = torch.empty(max(int(n.value), 1), dtype=torch.uint8, device="cuda")
    call.ws_bytes = int(n.value)
    return call


def measure(lib, tune, used, what, inputs, flush, a, modes, res):
    """Times `what` (dh0 / full) in each mode into res[(what, mode)], and the
    largest difference from mode 0 into res[(what, mode, "err")]; False where
    the fused pass does not cover the call."""
    ref = None
    for mode in modes:
        tune(mode)
        call = bb.FqlaBwd(lib, *inputs)
        if what == "dh0":
            call = dh0_only(call)
        call()
        torch.cuda.synchronize()
        if mode and used() != 1:
            return False
        names = ("dh0",) if what == "dh0" else tuple(call.grads)
        got = {n: call.grads[n].clone() for n in names}
        if mode == 0:
            ref = got
        else:
            res[(what, mode, "err")] = max(bb.rel(got[n], ref[n]) for n in names)
        res[(what, mode)] = bf.time_graph(call, flush, a.calls, a.replays)
        del call
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=os.path.join(ROOT, "build-dev", "libflashqla.so"))
    ap.add_argument("--rows", default="", help="comma-separated model:seqlens (default: all 32)")
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--replays", type=int, default=7)
    ap.add_argument("--out", default="bwd-fused-rev.csv")
    ap.add_argument("--cp-off", action="store_true", help="hold the chains' CP off for both")
    ap.add_argument("--modes", default="0,1,2,3,4,5", help="modes to time (0 always: the reference)")
    a = ap.parse_args()

    lib = bf.Lib(a.lib, "dev")
    need = ("fqla_cuda_bwd_tune_fused_rev", "fqla_cuda_bwd_last_fused_rev", "fqla_cuda_bwd_tune_cp")
    if any(getattr(lib.L, n, None) is None for n in need):
        sys.exit("bwd_fused_rev.py: %s is not a developer build with the fused reverse pass" % a.lib)
    tune, used, tune_cp = (getattr(lib.L, n) for n in need)
    tune_cp.argtypes = [C.c_int64]
    tune_cp(0 if a.cp_off else -1)

    rows = bb.table_rows(a.rows)
    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.float32, device="cuda")
    gpu = torch.cuda.get_device_name().replace(" ", "_")
    modes = sorted({0} | {int(m) for m in a.modes.split(",") if m})
    f = open(a.out, "a", newline="")
    w = csv.writer(f)
    if f.tell() == 0:
        w.writerow(["model", "seqlens", "what", "cp", "mode", "chain_ms", "fused_ms", "x", "max_rel", "gpu"])
    cp = "off" if a.cp_off else "plan"
    for ri, (model, hq, hv, sl) in enumerate(rows):
        q, k, v, g, beta, h0, cu, cu_host, do, dht = bb.row_inputs(hq, hv, sl, ri)
        for what in ("dh0", "full"):
            res = {}
            ms = [m for m in modes if m not in (5, 6)] if what == "dh0" else [m for m in modes if m not in (2, 4)]
            if not measure(lib, tune, used, what, (q, k, v, g, beta, h0, cu, cu_host, do, dht), flush, a, ms, res):
                print("%-10s %-9s %s: not covered" % (model, sl, what), flush=True)
                break  # (the gradient kernel beside the chains): dh0 alone only
            line = []
            for m in ms[1:]:
                x = res[(what, m)] / res[(what, 0)]
                err = res[(what, m, "err")]
                w.writerow([model, sl, what, cp, m, "%.4f" % res[(what, 0)], "%.4f" % res[(what, m)], "%.3f" % x,
                            "%.1e" % err, gpu])
                line.append("m%d %.3f x%.3f%s" % (m, res[(what, m)], x, " DIFFERS %.1e" % err if err > 1e-2 else ""))
            f.flush()
            print("%-10s %-9s %-4s chain %.3f | %s" % (model, sl, what, res[(what, 0)], " | ".join(line)), flush=True)
        tune(0)
        torch.cuda.empty_cache()
    tune_cp(-1)
    f.close()


if __name__ == "__main__":
    main()
