#!/usr/bin/env python3
"""bench_fwd.py - flashqla's CUDA forward against FLA's chunk_gated_delta_rule
forward, in the same process, on the same inputs (docs/benchmarks.md).

For every (head config, sequence pattern) row: build the inputs of
docs/benchmarks.md (l2-normalised bf16 q/k, bf16 v, fp32 g = logsigmoid(randn)/16
with a random quarter of the value heads ungated, fp32 beta, fp32 h0, final
state on), check flashqla's o and final state against FLA's (a sanity check;
correctness proper is tests/test_gpu_fwd.c against the fp64 reference), then
time both with CUDA-graph replay (several calls per graph, L2 flushed by a
256 MB write before each replay, median of the replays), append a row to
bench/results/fwd-<gpu>.csv and print the advantage over the published
FlashQLA / FlashInfer anchors (bench/anchors_h200.csv).

    python3 bench/bench_fwd.py                 (all 171 rows of anchors_h200.csv)
    python3 bench/bench_fwd.py --quick         (six rows, a few minutes)
    python3 bench/bench_fwd.py [--models 'TP8,TP1'] [--seqlens '1x32768,8192x4'] [--lib build/libflashqla.so]
    python3 bench/bench_fwd.py --rows '397B/122B TP1:1x32768,35B/9B/4B TP1:1x8192'
    python3 bench/bench_fwd.py --head-dim 256  (K = V = 256: the same rows against FLA only)
    python3 bench/bench_fwd.py --dtype fp32    (fp32 q/k/v: the chain route or the recurrence against FLA's fp32; FLA only)
    python3 bench/bench_fwd.py --l2norm        (raw q/k normalised in the kernels: use_qk_l2norm
                                                and FLA's use_qk_l2norm_in_kernel; FLA only)

Several builds and kernel variants in one process, on the same inputs and
against the same FLA timing, in reverse order on every other row: --lib 'new=build/libflashqla.so,v2=old/libflashqla.so'
and --variants '2,0;1,1' (the prepare kernel's variant, late chunk copies:
fqla_cuda_fwd_tune). The variants need a developer library (make DEV=1,
build-dev/libflashqla.so): only it has the tuning hooks (src/dev/); a
product library asked for them is reported and runs its own route. A variant of four
numbers 'hb,late,wg,nwg' also picks the chunk kernel: wg 0 = mma.sync, 1 =
wgmma with nwg consumer warpgroups (0 = the default), 2 = Pg formed beside the chain
(fwd_fused.cu), -1 = the default; fqla_cuda_fwd_tune_chunk); a fifth,
'hb,late,wg,nwg,cp', sets context parallelism (-1 = the plan, 0 = off, L = segments of L
chunks; fqla_cuda_fwd_tune_cp), and a sixth the CP scan's columns per CTA (8, 16, 32; 0 = by
the grid; fqla_cuda_fwd_tune_cp_scan), and a seventh the CP shortcut for negligible
transitions (0 off, 1 on; fqla_cuda_fwd_tune_cp_skip; without it each build keeps its
default, on), and an eighth programmatic
dependent launch of the kernels after the prepare kernel (0 off, 1 on, -1 the default;
fqla_cuda_fwd_tune_pdl), and a ninth the per cent of long segments' transitions the CP
plan expects the shortcut to leave out (cp_plan.h m_skipped; without it the build's default,
75; fqla_cuda_fwd_tune_cp_mskip), and a tenth the fp32 recurrence's state rows a lane (16,
32; 0 = by the waves; fqla_cuda_fwd_tune_recurrent), and an eleventh the fp32 path (1 the
chunked fp32 kernel wherever it covers the shape, 2 the chain route there, 0 the recurrence,
-1 the plan) and a twelfth its value columns per CTA (32, 64; the chain route's 64 or 128;
0 = the plan's; fqla_cuda_fwd_tune_f32). Each (library,
variant) is one CSV row; its commit field is the build's commit plus the
variant, or the label of a labelled library run without variants (e.g.
'206cbd8=old/libflashqla.so').
FLA's autotuning (--fla-tune): FLA's Triton kernels autotune once per head
configuration (their keys hold H, HV, K, V, not T or the number of
sequences), so the configs FLA runs on a row are those picked on the first
row of that head configuration the process (or Triton's disk cache, which FLA
fills) saw. A process that tunes on the table's first row of each head
configuration (1x32768) reproduces the anchors' FLA: measured within
0.99-1.06 of the published FLA on all 171 rows, and within 1.01-1.06 of
FLA 0.5.2 timed alone on this H200 with the same method. --fla-tune table (the default) does that: FLA's
disk cache of autotuning results is off (FLA_CACHE_RESULTS=0), and before the
first timed row of a head configuration FLA runs once on that
configuration's first table row. --fla-tune cache keeps whatever the disk
cache holds: its picks then come from whatever rows filled it (a run of the
uniform rows made FLA ~9 % faster on those and 10-17 % slower on the
single-sequence rows than the anchors' FLA).
"""
import argparse
import ctypes as C
import csv
import datetime
import math
import os
import statistics
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

F32, F16, BF16, F64, I32, I64 = range(6)
TORCH_DT = {torch.float32: F32, torch.float16: F16, torch.bfloat16: BF16, torch.float64: F64,
            torch.int32: I32, torch.int64: I64}


class Tensor(C.Structure):
    _fields_ = [("data", C.c_void_p), ("dtype", C.c_int), ("ndim", C.c_int),
                ("shape", C.c_int64 * 6), ("strides", C.c_int64 * 6)]


class Options(C.Structure):
    _fields_ = [("scale", C.c_double), ("use_qk_l2norm", C.c_int), ("use_gate_in_kernel", C.c_int),
                ("use_beta_sigmoid", C.c_int), ("allow_neg_eigval", C.c_int), ("state_v_first", C.c_int)]


class FwdArgs(C.Structure):
    _fields_ = [("q", Tensor), ("k", Tensor), ("v", Tensor), ("g", Tensor), ("beta", Tensor),
                ("A_log", Tensor), ("dt_bias", Tensor), ("initial_state", Tensor), ("cu_seqlens", Tensor),
                ("cu_seqlens_host", C.POINTER(C.c_int64)), ("o", Tensor), ("final_state", Tensor),
                ("opt", Options)]


def desc(t):
    """fqla_tensor over a torch tensor (or an absent one for None)."""
    d = Tensor()
    if t is None:
        return d
    d.data = t.data_ptr()
    d.dtype = TORCH_DT[t.dtype]
    d.ndim = t.dim()
    for i in range(t.dim()):
        d.shape[i] = t.shape[i]
        d.strides[i] = t.stride(i)
    return d


class Lib:
    def __init__(self, path, label=""):
        self.label = label
        self.path = path
        self.L = C.CDLL(path)
        self.tune = getattr(self.L, "fqla_cuda_fwd_tune", None)
        self.tune_chunk = getattr(self.L, "fqla_cuda_fwd_tune_chunk", None)
        self.tune_cp = getattr(self.L, "fqla_cuda_fwd_tune_cp", None)
        self.tune_scan = getattr(self.L, "fqla_cuda_fwd_tune_cp_scan", None)
        self.tune_skip = getattr(self.L, "fqla_cuda_fwd_tune_cp_skip", None)
        self.tune_pdl = getattr(self.L, "fqla_cuda_fwd_tune_pdl", None)
        self.tune_mskip = getattr(self.L, "fqla_cuda_fwd_tune_cp_mskip", None)
        self.tune_rec = getattr(self.L, "fqla_cuda_fwd_tune_recurrent", None)
        self.tune_f32 = getattr(self.L, "fqla_cuda_fwd_tune_f32", None)
        if self.tune_mskip:
            self.tune_mskip.argtypes = [C.c_double]
        self.L.fqla_last_error.restype = C.c_char_p
        self.L.fqla_status_string.restype = C.c_char_p
        self.ctx = C.c_void_p()
        st = self.L.fqla_context_create(C.byref(self.ctx), 1, torch.cuda.current_device())
        if st != 0:
            raise RuntimeError("fqla_context_create: " + self.L.fqla_last_error(None).decode())

    def check(self, st, what):
        if st != 0:
            raise RuntimeError("%s: %s: %s" % (what, self.L.fqla_status_string(st).decode(),
                                               self.L.fqla_last_error(self.ctx).decode()))


class FqlaFwd:
    """One configured flashqla forward call (args, workspace) over fixed tensors."""

    def __init__(self, lib, q, k, v, g, beta, h0, cu, cu_host, o, ht, l2norm=False):
        self.lib = lib
        a = FwdArgs()
        a.opt.use_qk_l2norm = int(l2norm)
        a.q, a.k, a.v, a.g, a.beta = desc(q), desc(k), desc(v), desc(g), desc(beta)
        a.initial_state, a.o, a.final_state = desc(h0), desc(o), desc(ht)
        if cu is not None:
            a.cu_seqlens = desc(cu)
            self.cu_host = (C.c_int64 * len(cu_host))(*cu_host)
            a.cu_seqlens_host = C.cast(self.cu_host, C.POINTER(C.c_int64))
        self.args = a
        n = C.c_size_t()
        lib.check(lib.L.fqla_fwd_workspace_size(lib.ctx, C.byref(a), C.byref(n)), "fqla_fwd_workspace_size")
        self.ws = torch.empty(max(int(n.value), 1), dtype=torch.uint8, device="cuda")
        self.ws_bytes = int(n.value)

    def __call__(self):
        s = torch.cuda.current_stream().cuda_stream
        self.lib.check(self.lib.L.fqla_fwd(self.lib.ctx, C.byref(self.args), C.c_void_p(self.ws.data_ptr()),
                                           C.c_size_t(self.ws_bytes), C.c_void_p(s)), "fqla_fwd")


# --dtype: the q / k / v dtypes a row may be timed in
IO_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def parse_seqlens(label):
    if "+" in label:
        return [int(x) for x in label.split("+")]
    a, b = label.split("x")
    if a == "1":
        return [int(b)]
    return [int(a)] * int(b)


def make_inputs(hq, hv, lens, seed=0, D=128, DV=None, l2norm=False, io=torch.bfloat16):
    """docs/benchmarks.md's inputs (q, k, v in io, bf16 by default); l2norm: q and k left raw (randn), for the kernels
    to normalise."""
    DV = DV or D
    gen = torch.Generator(device="cuda").manual_seed(seed)
    T = sum(lens)
    dev = "cuda"
    unit = (lambda x: x) if l2norm else (lambda x: torch.nn.functional.normalize(x, dim=-1))
    q = unit(torch.randn(1, T, hq, D, device=dev, generator=gen)).to(io)
    k = unit(torch.randn(1, T, hq, D, device=dev, generator=gen)).to(io)
    v = torch.randn(1, T, hv, DV, device=dev, generator=gen).to(io)
    g = torch.nn.functional.logsigmoid(torch.randn(1, T, hv, device=dev, generator=gen)) / 16
    gated = torch.randperm(hv, device=dev, generator=gen)[: math.ceil(0.75 * hv)]
    mask = torch.zeros(hv, device=dev)
    mask[gated] = 1
    g = (g * mask).float().contiguous()
    beta = torch.sigmoid(torch.randn(1, T, hv, device=dev, generator=gen)).float()
    h0 = torch.randn(len(lens), hv, D, DV, device=dev, generator=gen).float()
    cu_host = [0]
    for L in lens:
        cu_host.append(cu_host[-1] + L)
    cu = torch.tensor(cu_host, dtype=torch.int64, device=dev)
    return q, k, v, g, beta, h0, cu, cu_host


def settle(seconds):
    """--settle: the GPU idle for `seconds` once its queued work is done."""
    if seconds > 0:
        torch.cuda.synchronize()
        time.sleep(seconds)


def time_graph(fn, flush, calls, replays):
    """Median ms per call over graph replays of `calls` back-to-back calls."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    torch.cuda.synchronize()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        flush.zero_()
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        graph.replay()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) / calls)
    del graph
    return statistics.median(times)


def kernel_role(key):
    """The forward's kernels by role: prepare, fused (the chain with Pg formed
    in the CTA; with context parallelism its main pass), chunk (the two-kernel
    path's chain), prepass (CP's state-only instantiation, template argument
    OUT = false), scan (CP), recurrent (fp32 inputs)."""
    if "prepare" in key:
        return "prepare"
    if "fused" in key:
        return "fused"
    if "recurrent" in key:
        return "recurrent"
    if "cp_scan" in key:
        return "scan"
    if "chunk" in key:
        return "prepass" if ("(bool)0>" in key or "false>" in key) else "chunk"
    return key[:20]


def kernel_breakdown(fn, n=5):
    """Mean device microseconds per call of each kernel fn launches (torch
    profiler), to 0.1 us: whole microseconds were a 4 % step on the short
    rows' prepare kernel."""
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None)
        if t is None:
            t = getattr(e, "cuda_time_total", 0)
        if t > 0 and "fwd_" in e.key:
            out[kernel_role(e.key)] = out.get(kernel_role(e.key), 0.0) + t / n
    return " ".join("%s=%.1fus" % kv for kv in sorted(out.items()))


def rel(x, ref):
    x, ref = x.double(), ref.double()
    return ((x - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def load_anchors():
    out = {}
    path = os.path.join(HERE, "anchors_h200.csv")
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for r in csv.DictReader(f):
            if r["op"] == "fwd":
                out[(r["model"], r["seqlens"])] = r
    return out


# --quick: one sequence, varlen and uniform batches over small to large head
# counts (the rows `flashqla bench --quick` picks from the same table)
QUICK_ROWS = ["397B/122B TP8:1x32768", "397B/122B TP4:2048+6144", "397B/122B TP1:8192+24576",
              "27B TP2:1x8192", "27B TP1:4096x8", "Sym h32:12288+4096"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=os.path.join(ROOT, "build", "libflashqla.so"),
                    help="comma-separated [label=]path of shared libraries")
    ap.add_argument("--variants", default="", help="';'-separated 'hb,late' kernel variants (default: the build's)")
    ap.add_argument("--models", default="", help="comma-separated substrings of model labels (default: all)")
    ap.add_argument("--seqlens", default="", help="comma-separated seqlens labels (default: all)")
    ap.add_argument("--rows", default="", help="comma-separated 'model label:seqlens' rows, run in this order")
    ap.add_argument("--calls", type=int, default=4, help="calls per captured graph")
    ap.add_argument("--settle", type=float, default=0.0,
                    help="diagnostic: seconds of idle GPU before each timed measurement, FLA's and "
                         "ours alike (default 0, as in every recorded table: a rested GPU flatters the "
                         "HBM-bound group-1 rows by 2-7 %, measured on the H200)")
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "fwd-h200.csv"))
    ap.add_argument("--no-fla", action="store_true", help="time flashqla only")
    ap.add_argument("--profile", action="store_true", help="print flashqla's per-kernel device time")
    ap.add_argument("--fla-tune", choices=("table", "cache"), default="table",
                    help="where FLA's autotuning comes from (see the top of this file): 'table' tunes on each "
                         "head config's first anchor row in this process, 'cache' keeps Triton's disk cache")
    ap.add_argument("--cp-rows", action="store_true",
                    help="only the rows where context parallelism may run (sequences x value heads x V / 64 "
                         "below 132 SMs: cp_plan.h's first test), e.g. for a sweep of --variants' cp")
    ap.add_argument("--head-dim", type=int, default=128, choices=(64, 128, 256),
                    help="K = V of every row (default 128, the anchors'); at 64 or 256 the rows are timed against "
                         "FLA only (no anchors) and recorded as 'MODEL K64' / 'MODEL K256'")
    ap.add_argument("--value-dim", type=int, default=0, choices=(0, 64, 128, 256, 512),
                    help="V of every row where it differs from K (default 0: V = K), e.g. 512 with --head-dim "
                         "256, FLA's default GatedDeltaNet layer; recorded as 'MODEL K256 V512', against FLA only")
    ap.add_argument("--l2norm", action="store_true",
                    help="raw q/k with the in-kernel l2norm (FLA: use_qk_l2norm_in_kernel's l2norm_fwd, timed with it);"
                         " rows labelled 'MODEL l2norm', against FLA only")
    ap.add_argument("--l2norm-compare", action="store_true",
                    help="--l2norm, and the first build also timed on q/k normalised beforehand without the"
                         " in-kernel l2norm (tag -pre) and on the raw q/k without it (tag -raw: wrong outputs, the"
                         " timing of the same code on the same data)")
    ap.add_argument("--dtype", choices=sorted(IO_DTYPES), default="bf16",
                    help="q / k / v dtype (default bf16, the anchors'); other dtypes are timed against FLA only and"
                         " recorded as 'MODEL fp32' / 'MODEL fp16' (after any head-dim tag)")
    ap.add_argument("--quick", action="store_true",
                    help="six rows spread over the table (the same as `flashqla bench --quick`): a few minutes")
    a = ap.parse_args()
    a.l2norm = a.l2norm or a.l2norm_compare
    if a.value_dim == a.head_dim:
        a.value_dim = 0
    # rows away from the anchors' K = V = 128 carry their dims in the label
    dims_label = "" if a.head_dim == 128 else "K%d" % a.head_dim
    if a.value_dim:
        dims_label = "K%d V%d" % (a.head_dim, a.value_dim)
    if a.l2norm:
        dims_label = (dims_label + " l2norm").strip()
    if a.dtype != "bf16":
        dims_label = (dims_label + " " + a.dtype).strip()
    io = IO_DTYPES[a.dtype]
    if a.quick and not a.rows:
        a.rows = ",".join(QUICK_ROWS)

    anchors = load_anchors()
    rows = []
    seen = set()
    for (model, sl), r in anchors.items():
        if (model, sl) not in seen:
            seen.add((model, sl))
            rows.append((model, int(r["h_qk"]), int(r["h_v"]), sl))
    if a.models:
        keys = a.models.split(",")
        match = lambda r: [i for i, k in enumerate(keys) if k == r[0] or r[0].endswith(" " + k)]
        rows = [r for r in rows if match(r)]
        rows.sort(key=lambda r: match(r)[0])  # in the order of --models (stable within a model)
    if a.seqlens:
        keys = a.seqlens.split(",")
        rows = [r for r in rows if r[3] in keys]
    if a.cp_rows:  # the benchmark's q/k/v heads are 128 wide: two 64-column slices per value head
        rows = [r for r in rows if len(parse_seqlens(r[3])) * r[2] * 2 < 132]
    if a.rows:
        want = [tuple(x.rsplit(":", 1)) for x in a.rows.split(",")]
        byk = {(r[0], r[3]): r for r in rows}
        rows = [byk[w] for w in want if w in byk]

    fla_fwd = None
    if not a.no_fla:
        if a.fla_tune == "table":
            os.environ["FLA_CACHE_RESULTS"] = "0"  # read when fla is imported
        from fla.ops.gated_delta_rule.chunk import chunk_gated_delta_rule_fwd as fla_fwd
        if a.l2norm:  # what chunk_gated_delta_rule does with use_qk_l2norm_in_kernel before its forward
            from fla.modules.l2norm import l2norm_fwd
            fla_core = fla_fwd

            def fla_fwd(q, k, *rest, **kw):
                return fla_core(l2norm_fwd(q)[0], l2norm_fwd(k)[0], *rest, **kw)
    # the first anchor row of each head config: where FLA tunes (--fla-tune table)
    first_row = {}
    for (model, sl), r in anchors.items():
        first_row.setdefault(model, (int(r["h_qk"]), int(r["h_v"]), sl))
    fla_tuned = set()

    libs = []
    for ent in a.lib.split(","):
        label, _, path = ent.rpartition("=")
        libs.append(Lib(path, label))
    variants = [tuple(int(x) for x in v.split(",")) for v in a.variants.split(";") if v] if a.variants else []
    configs = []  # (lib, variant or None, tag)
    if variants and not any(lib.tune for lib in libs):
        sys.exit("bench_fwd.py: --variants needs a DEV=1 library (make DEV=1: build-dev/libflashqla.so); "
                 "the product library has no tuning hooks: " + ", ".join(lib.path for lib in libs))
    for lib in libs:
        if variants and not lib.tune:
            print("bench_fwd.py: %s has no tuning hooks (--variants needs a DEV=1 library): it runs its own "
                  "route" % lib.path, flush=True)
        if variants and lib.tune:
            for var in variants:
                name = "hb%d-late%d" % var[:2] + ("-wg%d-nwg%d" % var[2:4] if len(var) >= 4 else "")
                name += "-cp%d" % var[4] if len(var) >= 5 else ""
                name += "-cb%d" % var[5] if len(var) >= 6 else ""
                name += "-skip%d" % var[6] if len(var) >= 7 else ""
                name += "-pdl%d" % var[7] if len(var) >= 8 else ""
                name += "-ms%d" % var[8] if len(var) >= 9 else ""
                name += "-rows%d" % var[9] if len(var) >= 10 else ""
                name += "-f32%d" % var[10] if len(var) >= 11 else ""
                name += "-bv%d" % var[11] if len(var) >= 12 else ""
                configs.append((lib, var, (lib.label + ":" if lib.label else "") + name))
        else:
            configs.append((lib, None, lib.label))
    modes = {}  # tag -> "pre" / "raw" (--l2norm-compare); else the in-kernel l2norm or none
    if a.l2norm_compare:  # for the first build (--lib's first entry)
        for lib, var, tag in [c for c in configs if c[0] is libs[0]]:
            for m in ("pre", "raw"):
                modes[tag + "-" + m] = m
                configs.append((lib, var, tag + "-" + m))
    gpu = torch.cuda.get_device_name().replace(" ", "_")
    gpu_tag = "h200" if "H200" in gpu else gpu
    commit = os.environ.get("FQLA_COMMIT", "")
    try:
        commit = commit or subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip() or "unknown"
    except OSError:
        commit = "unknown"
    date = datetime.date.today().isoformat()
    flush = torch.empty(256 * 1024 * 1024 // 4, dtype=torch.float32, device="cuda")
    os.makedirs(os.path.dirname(a.out), exist_ok=True)
    new = not os.path.exists(a.out)
    fout = open(a.out, "a", newline="")
    w = csv.writer(fout)
    if new:
        w.writerow(["op", "model", "h_qk", "h_v", "seqlens", "flashqla_ms", "fla_ms", "gpu", "commit", "date"])

    adv_fq, adv_best, x_fla = {}, {}, {}  # per config tag
    print("%-22s %-12s %9s %9s %7s %7s %7s %9s %9s" % ("model", "seqlens", "fqla_ms", "fla_ms", "x_fla",
                                                       "adv_fq", "adv_best", "o_rel", "ht_rel"))
    for ri, (model, hq, hv, sl) in enumerate(rows):
        lens = parse_seqlens(sl)
        q, k, v, g, beta, h0, cu, cu_host = make_inputs(hq, hv, lens, D=a.head_dim, DV=a.value_dim, l2norm=a.l2norm,
                                                        io=io)
        o = torch.empty_like(v)
        ht = torch.empty_like(h0)
        qn = kn = None
        if a.l2norm_compare:  # FLA's l2norm (eps inside the square root)
            unit = lambda x: (x.float() * torch.rsqrt((x.float() ** 2).sum(-1, keepdim=True) + 1e-6)).to(io)
            qn, kn = unit(q), unit(k)
        scale = a.head_dim ** -0.5
        label = model if not dims_label else "%s %s" % (model, dims_label)
        fla_ms = float("nan")
        res = None
        if fla_fwd is not None and a.fla_tune == "table" and model not in fla_tuned:
            fla_tuned.add(model)
            fhq, fhv, fsl = first_row.get(model, (hq, hv, sl))
            if fsl != sl:  # else this row's own first call tunes
                t_in = make_inputs(fhq, fhv, parse_seqlens(fsl), D=a.head_dim, DV=a.value_dim, l2norm=a.l2norm,
                                   io=io)
                fla_fwd(*t_in[:5], a.head_dim ** -0.5, t_in[5], True, cu_seqlens=t_in[6])
                torch.cuda.synchronize()
                del t_in
                torch.cuda.empty_cache()
                print("(FLA autotuned on %s %s, the head config's first anchor row)" % (model, fsl), flush=True)
        if fla_fwd is not None:
            def run_fla():
                return fla_fwd(q, k, v, g, beta, scale, h0, True, cu_seqlens=cu)
            res = run_fla()
            torch.cuda.synchronize()
            res = (res[1].clone(), res[3].clone())
            settle(a.settle)
            fla_ms = time_graph(run_fla, flush, a.calls, a.replays)
        # every other row the builds and variants run in reverse order, so that
        # a drift within the process (clocks settling) does not favour one of
        # them on every row (one build run first on every row measured ~2.5 %
        # slower than a build of the same kernels)
        for lib, var, tag in (configs if ri % 2 == 0 else configs[::-1]):
            try:
                if lib.tune:
                    lib.tune(C.c_int(var[0] if var else 0), C.c_int(var[1] if var else -1))
                if lib.tune_chunk:
                    wg = var[2] if var and len(var) >= 4 else -1
                    lib.tune_chunk(C.c_int(wg), C.c_int(var[3] if var and len(var) >= 4 else 0))
                if lib.tune_cp:
                    lib.tune_cp(C.c_int(var[4] if var and len(var) >= 5 else -1))
                if lib.tune_scan:
                    lib.tune_scan(C.c_int(var[5] if var and len(var) >= 6 else 0))
                if lib.tune_skip and var and len(var) >= 7:  # else each build keeps its own default
                    lib.tune_skip(C.c_int(var[6]))
                if lib.tune_pdl:
                    lib.tune_pdl(C.c_int(var[7] if var and len(var) >= 8 else -1))
                if lib.tune_mskip:
                    lib.tune_mskip(var[8] / 100.0 if var and len(var) >= 9 else -1.0)  # < 0: the default
                if lib.tune_rec:
                    lib.tune_rec(C.c_int(var[9] if var and len(var) >= 10 else 0))
                if lib.tune_f32:
                    lib.tune_f32(C.c_int(var[10] if var and len(var) >= 11 else -1),
                                 C.c_int(var[11] if var and len(var) >= 12 else 0))
                mode = modes.get(tag)
                ours = FqlaFwd(lib, qn if mode == "pre" else q, kn if mode == "pre" else k, v, g, beta, h0, cu,
                               cu_host, o, ht, l2norm=a.l2norm and mode is None)
                ours()
                torch.cuda.synchronize()
                o_rel = ht_rel = float("nan")
                if res is not None:
                    o_rel, ht_rel = rel(o, res[0]), rel(ht, res[1])
                settle(a.settle)
                ms = time_graph(ours, flush, a.calls, a.replays)
                x = fla_ms / ms
                if not math.isnan(x):
                    x_fla.setdefault(tag, []).append(x)
                an = anchors.get((model, sl)) if not dims_label else None
                af = ab = float("nan")
                if an is not None and not math.isnan(x):
                    pub = float(an["fla_ms"])
                    af = x / (pub / float(an["flashqla_ms"]))
                    ai = x / (pub / float(an["flashinfer_ms"]))
                    ab = min(af, ai)
                    adv_fq.setdefault(tag, []).append(af)
                    adv_best.setdefault(tag, []).append(ab)
                print("%-22s %-12s %9.4f %9.4f %7.2f %7.2f %7.2f %9.2e %9.2e %s" % (label, sl, ms, fla_ms, x, af, ab,
                                                                                   o_rel, ht_rel, tag), flush=True)
                if a.profile:
                    print("    kernels: " + kernel_breakdown(ours), flush=True)
                # a labelled library without variants is another build: its label is its commit
                ccol = tag if (lib.label and var is None) else commit + ("+" + tag if tag else "")
                w.writerow(["fwd", label, hq, hv, sl, "%.4f" % ms, "%.4f" % fla_ms, gpu_tag, ccol, date])
                fout.flush()
                del ours
                if lib.tune:
                    lib.tune(C.c_int(0), C.c_int(-1))
                if lib.tune_chunk:
                    lib.tune_chunk(C.c_int(-1), C.c_int(0))
            except Exception as e:  # one failing build or variant must not end the run
                print("%-22s %-12s FAILED %s: %s" % (label, sl, tag, e), flush=True)
        del q, k, v, g, beta, h0, o, ht, res, qn, kn
        torch.cuda.empty_cache()
    fout.close()
    gm = lambda xs: math.exp(sum(math.log(x) for x in xs) / len(xs))
    for tag in adv_fq:
        print("fwd rows=%d geomean_adv_flashqla=%.2f geomean_adv_best=%.2f min_adv_best=%.2f geomean_x_fla=%.2f %s" %
              (len(adv_fq[tag]), gm(adv_fq[tag]), gm(adv_best[tag]), min(adv_best[tag]), gm(x_fla[tag]), tag))
    for tag in x_fla:  # rows without anchors (--head-dim 64 / 256, --value-dim): the speedup over FLA only
        if tag not in adv_fq:
            print("fwd rows=%d head_dim=%d value_dim=%d geomean_x_fla=%.2f min_x_fla=%.2f %s" %
                  (len(x_fla[tag]), a.head_dim, a.value_dim or a.head_dim, gm(x_fla[tag]), min(x_fla[tag]), tag))


if __name__ == "__main__":
    main()
