#!/usr/bin/env python3
"""bench_decode.py - flashqla's CUDA decode against FLA's fused_recurrent decode.

One token per sequence, K = V = 128, state [B, HV, K, V] read and written once
per call. Both libraries run in this process on the same inputs
(docs/benchmarks.md): q, k l2-normalised randn (bf16), v randn (bf16),
g = logsigmoid(randn) / 16 (fp32), beta = sigmoid(randn) (fp32).

flashqla is called through ctypes on build/libflashqla.so (fqla_decode on a
pool with randomly permuted slots, state written back in place); FLA's
fused_recurrent_gated_delta_rule reads initial_state and writes a new fp32
final_state (the same bytes for fp32 state).

Timing: CUDA-graph replay of `calls` back-to-back calls that cycle through
enough independent input/state sets that no call finds its state in L2; the
L2 is flushed (256 MB written) before each replay; median over 15 replays;
ms per call. bw_fraction = state bytes read + written / time / the
device-to-device copy bandwidth measured in this process.

FLA's kernel is known to fault at B = 1024, H = 2, HV = 8 (an illegal memory
access poisons the CUDA context), so FLA rows run in a child process each.

    python3 bench/bench_decode.py --lib build/libflashqla.so --out bench/results/decode-h200.csv
    python3 bench/bench_decode.py --sweep      # also time every slice width / layout variant
    python3 bench/bench_decode.py --sweep3 --sweep4 --table 0 --no-fla
                                               # the L2 prefetch off / on, small calls and 8-128 MB

The sweeps force variants through the tuning hooks, which only a developer
library has (make DEV=1: build-dev/libflashqla.so); asked of a product
library they stop with a message saying so.
"""
import argparse
import ctypes as C
import datetime
import json
import math
import os
import subprocess
import sys

import torch

BATCHES = [1, 8, 64, 256, 1024]
HEADS = [(16, 32), (16, 64), (2, 8)]
KDIM = 128
FLUSH_BYTES = 256 << 20
FLA_FAULTS = {(1024, 2, 8)}  # docs/benchmarks.md: illegal memory access in FLA's kernel

# ------------------------------------------------------------------ ctypes


class Tensor(C.Structure):
    _fields_ = [("data", C.c_void_p), ("dtype", C.c_int), ("ndim", C.c_int),
                ("shape", C.c_int64 * 6), ("strides", C.c_int64 * 6)]


class Options(C.Structure):
    _fields_ = [("scale", C.c_double), ("use_qk_l2norm", C.c_int), ("use_gate_in_kernel", C.c_int),
                ("use_beta_sigmoid", C.c_int), ("allow_neg_eigval", C.c_int), ("state_v_first", C.c_int)]


class DecodeArgs(C.Structure):
    _fields_ = [("q", Tensor), ("k", Tensor), ("v", Tensor), ("g", Tensor), ("beta", Tensor),
                ("A_log", Tensor), ("dt_bias", Tensor), ("state_pool", Tensor), ("slots", Tensor),
                ("slots_host", C.c_void_p), ("o", Tensor), ("step_states", Tensor), ("step_slots", Tensor),
                ("opt", Options)]


DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.float64: 3, torch.int32: 4, torch.int64: 5}


def tensor(t):
    if t is None:
        return Tensor()
    d = Tensor()
    d.data = t.data_ptr()
    d.dtype = DTYPES[t.dtype]
    d.ndim = t.dim()
    for i in range(t.dim()):
        d.shape[i] = t.shape[i]
        d.strides[i] = t.stride(i)
    return d


class Lib:
    def __init__(self, path):
        self.lib = C.CDLL(path)
        L = self.lib
        L.fqla_context_create.argtypes = [C.POINTER(C.c_void_p), C.c_int, C.c_int]
        L.fqla_last_error.restype = C.c_char_p
        L.fqla_last_error.argtypes = [C.c_void_p]
        L.fqla_decode_args_init.argtypes = [C.POINTER(DecodeArgs)]
        for f in (L.fqla_decode, L.fqla_verify):
            f.argtypes = [C.c_void_p, C.POINTER(DecodeArgs), C.c_void_p, C.c_size_t, C.c_void_p]
        self.ctx = C.c_void_p()
        st = L.fqla_context_create(C.byref(self.ctx), 1, torch.cuda.current_device())
        if st != 0:
            raise RuntimeError("fqla_context_create: " + L.fqla_last_error(None).decode())
        self.tune = getattr(L, "fqla_cuda_decode_tune", None)
        self.tune_warps = getattr(L, "fqla_cuda_decode_tune_warps", None)
        self.tune_ks = getattr(L, "fqla_cuda_decode_tune_ksplit", None)
        self.tune_pdl = getattr(L, "fqla_cuda_decode_tune_pdl", None)
        self.tune_prefetch = getattr(L, "fqla_cuda_decode_tune_prefetch", None)

    def set_tuning(self, wv=0, streaming=-1, warps=0, ks=0, pdl=-1, prefetch=-1):
        if self.tune:
            self.tune(C.c_int(wv), C.c_int(streaming))
        if self.tune_warps:
            self.tune_warps(C.c_int(warps))
        if self.tune_ks:
            self.tune_ks(C.c_int(ks))
        if self.tune_pdl:
            self.tune_pdl(C.c_int(pdl))
        if self.tune_prefetch:
            self.tune_prefetch(C.c_int(prefetch))

    def args(self, q, k, v, g, beta, pool, slots, o, v_first=False, step_states=None, step_slots=None,
             l2norm=False, gate=None, beta_sigmoid=False):
        a = DecodeArgs()
        self.lib.fqla_decode_args_init(C.byref(a))
        a.q, a.k, a.v, a.g, a.beta = tensor(q), tensor(k), tensor(v), tensor(g), tensor(beta)
        a.state_pool, a.slots, a.o = tensor(pool), tensor(slots), tensor(o)
        a.step_states, a.step_slots = tensor(step_states), tensor(step_slots)
        if gate is not None:
            a.A_log, a.dt_bias = tensor(gate[0]), tensor(gate[1])
            a.opt.use_gate_in_kernel = 1
        a.opt.use_qk_l2norm = int(l2norm)
        a.opt.use_beta_sigmoid = int(beta_sigmoid)
        a.opt.state_v_first = int(v_first)
        a._keep = (q, k, v, g, beta, pool, slots, o, step_states, step_slots, gate)
        return a

    def decode(self, a, verify=False):
        s = torch.cuda.current_stream().cuda_stream
        f = self.lib.fqla_verify if verify else self.lib.fqla_decode
        st = f(self.ctx, C.byref(a), None, 0, C.c_void_p(s))
        if st != 0:
            raise RuntimeError("fqla_decode: %d %s" % (st, self.lib.fqla_last_error(self.ctx).decode()))


# ------------------------------------------------------------------ timing

_flush = None


def flush_l2():
    global _flush
    if _flush is None:
        _flush = torch.empty(FLUSH_BYTES // 4, dtype=torch.float32, device="cuda")
    _flush.zero_()


def time_graph(fn, replays=15):
    """Captures fn() (which issues all calls) in a graph; median ms per replay."""
    fn()  # warm-up (compiles Triton kernels, loads modules)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        flush_l2()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    del g
    times.sort()
    return times[len(times) // 2]


def inplace_bandwidth():
    """Elementwise a * c over 2 GiB of fp32, in place (a.mul_) and into a
    second buffer: bytes read + written per second (median of 10 each).
    Tells whether a read-modify-write of the same lines costs bandwidth."""
    n = 1 << 29
    a = torch.empty(n, dtype=torch.float32, device="cuda").normal_()
    b = torch.empty_like(a)
    res = []
    for fn in (lambda: a.mul_(0.999), lambda: torch.mul(a, 0.999, out=b)):
        fn()
        torch.cuda.synchronize()
        ts = []
        for _ in range(10):
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            fn()
            e1.record()
            e1.synchronize()
            ts.append(e0.elapsed_time(e1))
        ts.sort()
        res.append(2 * n * 4 / (ts[len(ts) // 2] * 1e-3))
    del a, b
    torch.cuda.empty_cache()
    return res


def copy_bandwidth():
    """Device-to-device copy, bytes read + written per second (median of 10)."""
    n = 1 << 29  # 2 GiB of fp32 each way
    a = torch.empty(n, dtype=torch.float32, device="cuda").normal_()
    b = torch.empty_like(a)
    b.copy_(a)
    torch.cuda.synchronize()
    ts = []
    for _ in range(10):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        b.copy_(a)
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1))
    ts.sort()
    bw = 2 * n * 4 / (ts[len(ts) // 2] * 1e-3)
    del a, b
    torch.cuda.empty_cache()
    return bw


# ------------------------------------------------------------------ problems

def n_sets_for(state_bytes):
    """Independent sets so that each replay streams >= 512 MB of state."""
    return max(1, min(64, math.ceil((512 << 20) / state_bytes)))


def make_inputs(B, H, HV, T=1, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dev = "cuda"
    q = torch.nn.functional.normalize(torch.randn(B, T, H, KDIM, device=dev, generator=gen), dim=-1).bfloat16()
    k = torch.nn.functional.normalize(torch.randn(B, T, H, KDIM, device=dev, generator=gen), dim=-1).bfloat16()
    v = torch.randn(B, T, HV, KDIM, device=dev, generator=gen).bfloat16()
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, HV, device=dev, generator=gen)) / 16
    beta = torch.sigmoid(torch.randn(B, T, HV, device=dev, generator=gen))
    return q, k, v, g, beta


def make_sets(lib, B, H, HV, sdt, T=1, fresh=False):
    """Independent input / pool sets for flashqla (slots randomly permuted).
    fresh: a step_states buffer even for T = 1 (fqla_verify then reads the
    pool and writes the state to that separate buffer, as FLA does)."""
    es = torch.tensor([], dtype=sdt).element_size()
    nsets = n_sets_for(B * HV * KDIM * KDIM * es)
    sets = []
    # one slots tensor for every set, as one decode step's layers share it
    # (it stays in L2 like in an engine; everything else is cold)
    slots = torch.randperm(B, device="cuda", dtype=torch.int64).to(torch.int32)
    for i in range(nsets):
        q, k, v, g, beta = make_inputs(B, H, HV, T, seed=i)
        pool = (torch.randn(B, HV, KDIM, KDIM, device="cuda") * 0.5).to(sdt)
        o = torch.empty(B, T, HV, KDIM, device="cuda", dtype=torch.bfloat16)
        ss = torch.empty(B, T, HV, KDIM, KDIM, device="cuda", dtype=sdt) if T > 1 or fresh else None
        a = lib.args(q, k, v, g, beta, pool, slots, o, step_states=ss)
        a._ss = ss
        sets.append(a)
    return sets


def time_sets(lib, sets, v_first=False, wv=0, streaming=-1, verify=False, warps=0, ks=0, pdl=-1, prefetch=-1):
    """ms per call of fqla_decode / fqla_verify over the sets."""
    nsets = len(sets)
    calls = max(nsets, 4)
    for a in sets:
        a.opt.state_v_first = int(v_first)
        # decode takes no step_states; verify writes into the set's buffer
        a.step_states = tensor(getattr(a, "_ss", None) if verify else None)
    lib.set_tuning(wv, streaming, warps, ks, pdl, prefetch)

    def run():
        for c in range(calls):
            lib.decode(sets[c % nsets], verify=verify)
    try:
        return time_graph(run) / calls
    finally:
        lib.set_tuning()


def bench_flashqla(lib, B, H, HV, sdt, v_first=False):
    sets = make_sets(lib, B, H, HV, sdt)
    ms = time_sets(lib, sets, v_first=v_first)
    del sets
    torch.cuda.empty_cache()
    return ms


def bench_fla(B, H, HV, sdt, v_first=False):
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    es = torch.tensor([], dtype=sdt).element_size()
    state_bytes = B * HV * KDIM * KDIM * es
    nsets = n_sets_for(state_bytes)
    calls = max(nsets, 4)
    sets = []
    for i in range(nsets):
        q, k, v, g, beta = make_inputs(B, H, HV, 1, seed=i)
        h0 = (torch.randn(B, HV, KDIM, KDIM, device="cuda") * 0.5).to(sdt)
        sets.append((q, k, v, g, beta, h0))
    outs = []

    def run():
        outs.clear()
        for c in range(calls):
            q, k, v, g, beta, h0 = sets[c % nsets]
            outs.append(fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=h0,
                                                         output_final_state=True, state_v_first=v_first))

    ms = time_graph(run) / calls
    outs.clear()
    del sets
    torch.cuda.empty_cache()
    return ms


def fla_child(B, H, HV, sdt_name, v_first=False):
    """FLA in its own process: a fault there cannot poison our context."""
    cmd = [sys.executable, os.path.abspath(__file__), "--fla-only",
           "%d,%d,%d,%s,%d" % (B, H, HV, sdt_name, int(v_first))]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        return None, "timeout"
    for line in r.stdout.splitlines():
        if line.startswith("FLA_MS "):
            return float(line.split()[1]), ""
    return None, (r.stderr.strip().splitlines() or ["exit %d" % r.returncode])[-1][:200]


def check_against_fla(lib, B, H, HV, sdt, v_first=False):
    """One call of each on the same inputs: o and state relative differences."""
    from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule
    q, k, v, g, beta = make_inputs(B, H, HV, 1, seed=123)
    P = B + 3
    pool = (torch.randn(P, HV, KDIM, KDIM, device="cuda") * 0.5).to(sdt)
    if v_first:
        pool = pool.transpose(-1, -2).contiguous()
    slots = torch.randperm(P, device="cuda")[:B].to(torch.int64)
    h0 = pool[slots].clone()
    o = torch.empty(B, 1, HV, KDIM, device="cuda", dtype=torch.bfloat16)
    a = lib.args(q, k, v, g, beta, pool, slots, o, v_first=v_first)
    lib.decode(a)
    o_ref, ht = fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=h0, output_final_state=True,
                                                 state_v_first=v_first)
    torch.cuda.synchronize()

    def rel(x, y):
        x, y = x.double(), y.double()
        return ((x - y).norm() / y.norm()).item()
    return rel(o, o_ref), rel(pool[slots].float(), ht.to(sdt).float())


def sweep2(lib, bw):
    """us per call (and fraction of copy) of the variants behind the default
    choice: [K, V] unsplit wv16 / wv8 (the old choices) against the K splits
    ks2 / ks4 / ks8, programmatic dependent launch off / on, and the state
    written in place (decode) against into a fresh buffer (verify, T = 1)."""
    print("\nsweep2: us per call (fraction of copy); kv = [K, V], vk = [V, K]; pdl0 = no programmatic "
          "dependent launch; fresh = state written to a separate buffer (fqla_verify T = 1)", flush=True)
    cases = ((1, 16, 32, torch.float32), (1, 2, 8, torch.float32), (8, 16, 32, torch.float32),
             (64, 16, 32, torch.float32), (256, 16, 32, torch.float32), (1024, 16, 32, torch.float32),
             (1, 16, 32, torch.bfloat16), (1024, 16, 32, torch.bfloat16))
    for (B, H, HV, sdt) in cases:
        es = 4 if sdt == torch.float32 else 2
        nbytes = 2 * B * HV * KDIM * KDIM * es
        sets = make_sets(lib, B, H, HV, sdt, fresh=True)
        cells = []

        def cell(name, **kw):
            try:
                ms = time_sets(lib, sets, **kw)
            except RuntimeError as e:
                cells.append("%s=ERR(%s)" % (name, str(e)[:80]))
                return
            cells.append("%s=%.2f(%.2f)" % (name, 1e3 * ms, nbytes / (ms * 1e-3) / bw))
        for pdl in (1, 0):
            cell("kv/def/pdl%d" % pdl, pdl=pdl)
        variants = ((16, 1), (8, 1), (0, 2), (0, 4), (0, 8)) if sdt == torch.float32 else ((16, 1), (0, 4), (0, 8))
        for wv, ks in variants:
            cell("kv/%s" % ("wv%d" % wv if ks == 1 else "ks%d" % ks), wv=wv, ks=ks)
        cell("kv/def/fresh", verify=True)
        for pdl in (1, 0):
            cell("vk/def/pdl%d" % pdl, v_first=True, pdl=pdl)
        cell("vk/def/fresh", v_first=True, verify=True)
        if B == 1:
            cell("vk/wv8", v_first=True, wv=8)
        del sets
        torch.cuda.empty_cache()
        print("B=%d H=%d HV=%d %s: %s" % (B, H, HV, "f32" if sdt == torch.float32 else "bf16", " ".join(cells)),
              flush=True)
    print("", flush=True)


# (B, H, HV, state dtype): the latency-bound small calls and two large ones
SWEEP3_CASES = tuple((B, H, HV, sdt) for (B, H, HV) in ((1, 16, 32), (1, 2, 8), (8, 2, 8), (8, 16, 32),
                                                        (64, 16, 32), (256, 2, 8))
                     for sdt in (torch.float32, torch.bfloat16))
# (B, H, HV, state dtype) of 8 to 128 MB of state: where the prefetch turns from gain to loss
SWEEP4_CASES = ((4, 16, 32, torch.float32), (8, 16, 32, torch.float32), (16, 16, 32, torch.float32), (8, 16, 64, torch.float32),
                (64, 2, 8, torch.float32), (32, 16, 32, torch.float32), (128, 2, 8, torch.float32),
                (16, 16, 32, torch.bfloat16), (32, 16, 32, torch.bfloat16), (128, 16, 32, torch.bfloat16))


def sweep3(lib, bw, cases=SWEEP3_CASES,
           variants=(("pf0", dict(prefetch=0)), ("pf1", dict(prefetch=1)), ("def", {}), ("pdl0", dict(pdl=0)))):
    """us per call with the L2 prefetch before the PDL wait off / on / the
    default, both layouts, for each (B, H, HV, state dtype) case."""
    if not lib.tune_prefetch:
        print("sweep3: this library has no fqla_cuda_decode_tune_prefetch", flush=True)
        return
    print("\nsweep3: us per call; pf0 / pf1 = L2 prefetch before the PDL wait off / on, def = the default; "
          "pdl0 = no PDL (so no prefetch)", flush=True)
    for (B, H, HV, sdt) in cases:
        es = 4 if sdt == torch.float32 else 2
        nbytes = 2 * B * HV * KDIM * KDIM * es
        sets = make_sets(lib, B, H, HV, sdt)
        cells = []
        for vf in (False, True):
            lay = "vk" if vf else "kv"
            for name, kw in variants:
                ms = time_sets(lib, sets, v_first=vf, **kw)
                cells.append("%s/%s=%.2f(%.2f)" % (lay, name, 1e3 * ms, nbytes / (ms * 1e-3) / bw))
        del sets
        torch.cuda.empty_cache()
        print("B=%d H=%d HV=%d %s (%d MB of state): %s" % (B, H, HV, "f32" if sdt == torch.float32 else "bf16",
                                                           nbytes >> 21, " ".join(cells)), flush=True)
    print("", flush=True)


# ------------------------------------------------------------------ main

def git_commit():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default="build/libflashqla.so")
    ap.add_argument("--out", default="bench/results/decode-h200.csv")
    ap.add_argument("--sweep", action="store_true", help="also time every variant (slice width, layout, hints)")
    ap.add_argument("--sweep2", action="store_true",
                    help="K-split / PDL / in-place-vs-fresh variants of the fp32 decode (before the table)")
    ap.add_argument("--sweep3", action="store_true",
                    help="L2 prefetch before the PDL wait off / on on the small calls (before the table)")
    ap.add_argument("--sweep4", action="store_true",
                    help="the same, at 8-128 MB of state (where the default rule switches)")
    ap.add_argument("--table", type=int, default=1, help="0: no table (sweeps only)")
    ap.add_argument("--no-fla", action="store_true")
    ap.add_argument("--layouts", default="kv,vk", help="state layouts to time: kv ([K, V]), vk ([V, K])")
    ap.add_argument("--dtypes", default="fp32,bf16", help="state dtypes of the table (and of the FLA checks)")
    ap.add_argument("--commit", default=None)
    ap.add_argument("--fla-only", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.fla_only:
        B, H, HV, s, vf = args.fla_only.split(",")
        ms = bench_fla(int(B), int(H), int(HV), torch.float32 if s == "fp32" else torch.bfloat16, vf == "1")
        print("FLA_MS %.6f" % ms)
        return

    lib = Lib(os.path.abspath(args.lib))
    if (args.sweep or args.sweep2 or args.sweep3 or args.sweep4) and not lib.tune:
        sys.exit("bench_decode.py: --sweep* needs a DEV=1 library (make DEV=1: build-dev/libflashqla.so); "
                 "%s is a product library without tuning hooks" % args.lib)
    gpu = torch.cuda.get_device_name().replace(",", " ")
    bw = copy_bandwidth()
    print("gpu %s, copy bandwidth %.3f TB/s (read + write)" % (gpu, bw / 1e12), flush=True)
    tiny = torch.zeros(32, device="cuda")
    node_us = 1e3 * time_graph(lambda: [tiny.add_(1.0) for _ in range(64)]) / 64
    print("graph node floor (64 tiny kernels back to back): %.2f us per kernel" % node_us, flush=True)

    if args.sweep2:
        ip, oop = inplace_bandwidth()
        print("elementwise x*c 2 GiB fp32: in place %.3f TB/s, into a second buffer %.3f TB/s" % (ip / 1e12, oop / 1e12),
              flush=True)
        sweep2(lib, bw)
    if args.sweep3:
        sweep3(lib, bw)
    if args.sweep4:
        sweep3(lib, bw, SWEEP4_CASES, variants=(("pf0", dict(prefetch=0)), ("pf1", dict(prefetch=1))))
    if not args.table:
        return

    if not args.no_fla:
        checks = ((torch.float32, False), (torch.float32, True), (torch.bfloat16, False))
        for sdt, vf in [c for c in checks if ("fp32" if c[0] == torch.float32 else "bf16") in args.dtypes]:
            for (B, H, HV) in ((4, 2, 8), (33, 16, 32)):
                eo, es = check_against_fla(lib, B, H, HV, sdt, vf)
                print("check vs FLA B=%d H=%d HV=%d %s%s: o rel %.2e, state rel %.2e"
                      % (B, H, HV, sdt, " v_first" if vf else "", eo, es), flush=True)

    if args.sweep:
        print("\nsweep: us per call by layout / slice width wv (0 = heuristic) / cache hint h", flush=True)
        for (B, H, HV) in ((1, 16, 32), (1, 2, 8), (8, 16, 32), (64, 16, 32), (1024, 16, 64)):
            for sdt in (torch.float32, torch.bfloat16):
                sets = make_sets(lib, B, H, HV, sdt)
                cells = []
                for vf in (False, True):
                    for wv in (0, 16, 8, 4):
                        if sdt == torch.bfloat16 and not vf and wv == 4:
                            continue
                        cells.append("%s/wv%d=%.2f" % ("vk" if vf else "kv", wv,
                                                       1e3 * time_sets(lib, sets, v_first=vf, wv=wv)))
                    cells.append("%s/wv0/h1=%.2f" % ("vk" if vf else "kv",
                                                     1e3 * time_sets(lib, sets, v_first=vf, streaming=1)))
                    for nw in (1, 2, 8):
                        cells.append("%s/wv0/w%d=%.2f" % ("vk" if vf else "kv", nw,
                                                          1e3 * time_sets(lib, sets, v_first=vf, warps=nw)))
                del sets
                torch.cuda.empty_cache()
                print("B=%d H=%d HV=%d %s: %s" % (B, H, HV, "f32" if sdt == torch.float32 else "bf16",
                                                  " ".join(cells)), flush=True)
        print("\nverify (step_states, f32), us per call:", flush=True)
        for (B, H, HV) in ((1, 16, 32), (64, 16, 32), (256, 16, 32)):
            cells = []
            for T in (2, 4):
                sets = make_sets(lib, B, H, HV, torch.float32, T=T)
                for wv in (0, 16, 8, 4):
                    cells.append("T%d/wv%d=%.2f" % (T, wv, 1e3 * time_sets(lib, sets, wv=wv, verify=True)))
                del sets
                torch.cuda.empty_cache()
            print("B=%d H=%d HV=%d: %s" % (B, H, HV, " ".join(cells)), flush=True)

    rows = []
    commit = args.commit or git_commit()
    date = datetime.date.today().isoformat()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    csv = open(args.out, "w")  # written row by row: a run cut short keeps what it measured
    csv.write("batch,h_qk,h_v,state_dtype,flashqla_ms,fla_ms,bw_fraction,state_layout,gpu,commit,date\n")
    print("%6s %4s %4s %5s %3s %10s %10s %7s %6s" % ("batch", "h_qk", "h_v", "state", "lay", "flashqla", "fla",
                                                     "speedup", "bw"), flush=True)
    layouts = [lay for lay in args.layouts.split(",") if lay]
    for sname, sdt in [d for d in (("fp32", torch.float32), ("bf16", torch.bfloat16)) if d[0] in args.dtypes]:
        for lay in layouts:
            vf = lay == "vk"
            for (H, HV) in HEADS:
                for B in BATCHES:
                    ms = bench_flashqla(lib, B, H, HV, sdt, v_first=vf)
                    es = 4 if sdt == torch.float32 else 2
                    frac = 2 * B * HV * KDIM * KDIM * es / (ms * 1e-3) / bw
                    if args.no_fla:
                        fla_ms, why = None, "skipped"
                    elif (B, H, HV) in FLA_FAULTS:
                        fla_ms, why = fla_child(B, H, HV, sname, vf)  # known to fault: own process
                    else:
                        try:
                            fla_ms, why = bench_fla(B, H, HV, sdt, vf), ""
                        except Exception as e:  # e.g. grid y = B * HV > 65535: FLA cannot launch
                            fla_ms, why = None, str(e).splitlines()[-1][:120]
                            torch.cuda.synchronize()
                    rows.append(dict(batch=B, h_qk=H, h_v=HV, state_dtype=sname, flashqla_ms=ms, fla_ms=fla_ms,
                                     bw_fraction=frac, layout=lay, gpu=gpu, commit=commit, date=date))
                    r = rows[-1]
                    csv.write("%d,%d,%d,%s,%.5f,%s,%.3f,%s,%s,%s,%s\n" % (
                        r["batch"], r["h_qk"], r["h_v"], r["state_dtype"], r["flashqla_ms"],
                        "%.5f" % r["fla_ms"] if r["fla_ms"] else "", r["bw_fraction"], r["layout"], r["gpu"],
                        r["commit"], r["date"]))
                    csv.flush()
                    print("%6d %4d %4d %5s %3s %10.4f %10s %7s %6.3f %s" % (
                        B, H, HV, sname, lay, ms, "%.4f" % fla_ms if fla_ms else "-",
                        "%.2f" % (fla_ms / ms) if fla_ms else "-", frac, ("FLA: " + why) if why else ""), flush=True)

    csv.close()

    for lay in layouts:
        rs = [r for r in rows if r["layout"] == lay]
        sp = [r["fla_ms"] / r["flashqla_ms"] for r in rs if r["fla_ms"]]
        big = [r["bw_fraction"] for r in rs if r["state_dtype"] == "fp32" and r["batch"] * r["h_v"] >= 2048]
        b1 = [r["flashqla_ms"] * 1e3 for r in rs
              if r["batch"] == 1 and r["h_v"] == 32 and r["state_dtype"] == "fp32"]
        print("decode layout=%s rows=%d geomean_speedup_vs_fla=%.2f min_speedup_vs_fla=%.2f "
              "min_bw_fraction_fp32_BHV>=2048=%.3f B1_HV32_us=%.2f"
              % (lay, len(rs), math.exp(sum(map(math.log, sp)) / len(sp)) if sp else float("nan"),
                 min(sp) if sp else float("nan"), min(big) if big else float("nan"), b1[0] if b1 else float("nan")))

if __name__ == "__main__":
    main()
