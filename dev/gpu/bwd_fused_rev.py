#!/usr/bin/env python3
"""bwd_fused_rev.py - the fused reverse pass under construction
(src/dev/bwd_fused_rev.cu) against the reverse chain it replaces, on
bench/bench_bwd.py's rows and inputs, in one process.

Needs a developer build (make DEV=1): fqla_cuda_bwd_tune_fused_rev switches
the pass; both run the planner's CP (the fused pass runs CP's main pass in
place of the reverse chain's), or with --cp-off none. Per row, five calls timed by CUDA-graph replay with the L2 flushed:
  dh0   the gradient w.r.t. h0 alone: prepare + the reverse chain (or the
        fused pass) - the two passes compared with nothing else around them
  (and the fused pass without its stores of dS: what a pass that keeps dS'
        in the SM saves here)
  full  the whole backward: the chains (the state chain then the fused pass,
        or both chains in their usual launches), the gradient kernel, finish
and the largest relative difference of every gradient between the two
(both are split-product bf16; ~1e-3 apart is rounding, >1e-2 is a bug).

    python3 dev/gpu/bwd_fused_rev.py --lib build-dev/libflashqla.so [--rows hk16_hv32:32k_1seq,...]
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


def measure(lib, tune, used, what, inputs, flush, a, res):
    """Times `what` (dh0 / full) with the reverse chain (0), the fused pass
    (1) and for dh0 the fused pass without its dS stores (2) into res;
    False where the fused pass does not cover the call."""
    grads = []
    for mode in ((0, 1, 2) if what == "dh0" else (0, 1)):
        tune(mode)
        call = bb.FqlaBwd(lib, *inputs)
        if what == "dh0":
            call = dh0_only(call)
        call()
        torch.cuda.synchronize()
        if mode and used() != 1:
            return False
        if mode < 2:
            grads.append({n: x.clone() for n, x in call.grads.items()} if what == "full"
                         else {"dh0": call.grads["dh0"].clone()})
        res[(what, mode)] = bf.time_graph(call, flush, a.calls, a.replays)
        del call
    res[(what, "err")] = max(bb.rel(grads[1][n], grads[0][n]) for n in grads[0])
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=os.path.join(ROOT, "build-dev", "libflashqla.so"))
    ap.add_argument("--rows", default="", help="comma-separated model:seqlens (default: all 32)")
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--replays", type=int, default=7)
    ap.add_argument("--out", default="bwd-fused-rev.csv")
    ap.add_argument("--cp-off", action="store_true", help="hold the chains' CP off for both")
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
    f = open(a.out, "a", newline="")
    w = csv.writer(f)
    if f.tell() == 0:
        w.writerow(["model", "seqlens", "what", "cp", "chain_ms", "fused_ms", "max_rel", "gpu"])
    print("%-10s %-9s %9s %9s %7s %9s %9s %9s %7s %8s" % ("model", "seqlens", "dh0 rev", "dh0 fused", "x", "no dS st",
                                                      "full rev", "full fus", "x", "max_rel"), flush=True)
    for ri, (model, hq, hv, sl) in enumerate(rows):
        q, k, v, g, beta, h0, cu, cu_host, do, dht = bb.row_inputs(hq, hv, sl, ri)
        res = {("full", 0): float("nan"), ("full", 1): float("nan"), ("full", "err"): float("nan")}
        for what in ("dh0", "full"):
            if not measure(lib, tune, used, what, (q, k, v, g, beta, h0, cu, cu_host, do, dht), flush, a, res):
                break  # not covered (the gradient kernel beside the chains): dh0 alone only
            cp = "off" if a.cp_off else "plan"
            w.writerow([model, sl, what, cp, "%.4f" % res[(what, 0)], "%.4f" % res[(what, 1)],
                        "%.1e" % res[(what, "err")], gpu])
            if what == "dh0":
                w.writerow([model, sl, "dh0_nostore", cp, "%.4f" % res[(what, 0)], "%.4f" % res[(what, 2)], "", gpu])
            f.flush()
        tune(0)
        torch.cuda.empty_cache()
        print("%-10s %-9s %9.3f %9.3f %7.3f %9.3f %9.3f %9.3f %7.3f %8.1e%s" % (
            model, sl, res[("dh0", 0)], res[("dh0", 1)], res[("dh0", 1)] / res[("dh0", 0)], res[("dh0", 2)],
            res[("full", 0)],
            res[("full", 1)], res[("full", 1)] / res[("full", 0)], max(res[("full", "err")], res[("dh0", "err")]),
            "  DIFFERS" if max(res[("full", "err")], res[("dh0", "err")]) > 1e-2 else ""), flush=True)
    tune_cp(-1)
    f.close()


if __name__ == "__main__":
    main()
