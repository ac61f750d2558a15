#!/usr/bin/env python3
"""bench_bwd.py - flashqla's CUDA backward against FLA's chunk_gated_delta_rule
backward (and FlashQLA's own, when importable), in the same process, on the
same inputs (docs/benchmarks.md, "The backward benchmark").

The 32 backward rows of the published table (bench/anchors_h200.csv, op bwd):
heads hk16_hv32, hk8_hv16, hk4_hv8, hk2_hv4 x 8k / 32k tokens in 1, 2, 4 or 8
sequences with the lengths of BWD_SPLITS below. For every row: docs/benchmarks.md's
inputs (those of bench_fwd.py, plus dO = randn bf16 and d(final state) = randn / 8),
one forward of each library outside any timing (FLA's and FlashQLA's save what
their backward reads; flashqla's backward reads the forward's inputs), one untimed
backward of each with flashqla's gradients compared with FlashQLA's where it runs,
else FLA's (a loose sanity bound, not the correctness test: that is
tests/test_gpu_bwd.c against the fp64 reference), then each backward alone timed with CUDA-graph replay (several calls
per graph, L2 flushed by a 256 MB write before each replay, median of the replays).
One CSV row per (row, build) in bench/results/bwd-<gpu>.csv with fwd-h200.csv's
columns; what the CSV's columns cannot hold (FLA's backend, whether its guard was
lifted, FlashQLA's own time, the sanity errors) goes to the notes file beside it
(<out>-notes.csv). Last, the summary line.

    python3 bench/bench_bwd.py                      (all 32 rows)
    python3 bench/bench_bwd.py --quick              (four rows on two head configs)
    python3 bench/bench_bwd.py --rows 'hk16_hv32:32k_1seq,hk2_hv4:8k_8seq' --lib build/libflashqla.so
    python3 bench/bench_bwd.py --no-fla --lib 'new=A/libflashqla.so,base=B/libflashqla.so'

FLA's backend. FLA 0.5.2 hands chunk_gated_delta_rule to FlashQLA whenever
flash_qla is importable; the harness calls FLA's own chunk_gated_delta_rule_fwd /
_bwd functions, below that dispatch, and sets FLA_FLASH_QLA=0 anyway. On Hopper
with Triton >= 3.4 FLA also routes one backward kernel (chunk_bwd_dqkwg) to TileLang
when tilelang is importable (FLA_TILELANG); --fla-backend triton (the default) turns
that off (FLA_TILELANG=0) and lifts FLA's refusal of that Triton kernel on Triton <
3.7.1 (fla.ops.common.chunk_o.TRITON_ABOVE_3_7_1 = True, as FLA's own tests do):
the Triton kernel may give wrong gradients there, so FLA's gradients are then no
oracle, and the notes say so. Which backend ran is recorded from a counter on
FLA's TileLang entry point, not from the settings.

Advantage = (our speedup over FLA in this run) / (FlashQLA's published speedup
over FLA): adv_fq = (fla_ms / flashqla_ms) / (fla_pub / flashqla_pub).
"""
import argparse
import csv
import ctypes as C
import datetime
import math
import os
import subprocess
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import bench_fwd as bf  # noqa: E402  (ctypes structs, Lib, time_graph, make_inputs)

# The exact sequence lengths of the published backward rows (made with a CPU
# torch.Generator seeded 42: randperm(total - 1)[:n - 1], sorted, plus 1, as the
# inner cut points).
BWD_SPLITS = {
    "8k_1seq": [8192],
    "8k_2seq": [7053, 1139],
    "8k_4seq": [5809, 1244, 406, 733],
    "8k_8seq": [161, 1928, 3157, 563, 1244, 229, 177, 733],
    "32k_1seq": [32768],
    "32k_2seq": [7212, 25556],
    "32k_4seq": [7212, 7072, 13725, 4759],
    "32k_8seq": [3274, 1029, 2909, 5061, 2011, 3793, 9932, 4759],
}

QUICK_ROWS = ["hk16_hv32:32k_1seq", "hk16_hv32:8k_8seq", "hk2_hv4:32k_4seq", "hk2_hv4:8k_1seq"]

# sanity bounds of flashqla's gradients against FLA's (two bf16 implementations;
# each ~6e-3 (dg ~1.5e-2) from the fp64 reference, so up to ~2x that apart)
SANITY = {"dq": 3e-2, "dk": 3e-2, "dv": 3e-2, "dh0": 3e-2, "dg": 8e-2, "dbeta": 8e-2}


class BwdArgs(C.Structure):
    _fields_ = [("q", bf.Tensor), ("k", bf.Tensor), ("v", bf.Tensor), ("g", bf.Tensor), ("beta", bf.Tensor),
                ("A_log", bf.Tensor), ("dt_bias", bf.Tensor), ("initial_state", bf.Tensor),
                ("cu_seqlens", bf.Tensor), ("cu_seqlens_host", C.POINTER(C.c_int64)),
                ("d_o", bf.Tensor), ("d_final_state", bf.Tensor), ("dq", bf.Tensor), ("dk", bf.Tensor),
                ("dv", bf.Tensor), ("dg", bf.Tensor), ("dbeta", bf.Tensor), ("d_initial_state", bf.Tensor),
                ("dA_log", bf.Tensor), ("ddt_bias", bf.Tensor), ("opt", bf.Options)]


class FqlaBwd:
    """One configured flashqla backward call over fixed tensors: the forward's
    inputs (what autograd saves) in, the gradients out."""

    def __init__(self, lib, q, k, v, g, beta, h0, cu, cu_host, do, dht):
        self.lib = lib
        self.grads = dict(dq=torch.empty_like(q), dk=torch.empty_like(k), dv=torch.empty_like(v),
                          dg=torch.empty_like(g, dtype=torch.float32),
                          dbeta=torch.empty_like(beta, dtype=torch.float32),
                          dh0=torch.empty_like(h0, dtype=torch.float32))
        d = self.grads
        a = BwdArgs()
        a.q, a.k, a.v, a.g, a.beta = bf.desc(q), bf.desc(k), bf.desc(v), bf.desc(g), bf.desc(beta)
        a.initial_state, a.d_o, a.d_final_state = bf.desc(h0), bf.desc(do), bf.desc(dht)
        a.dq, a.dk, a.dv = bf.desc(d["dq"]), bf.desc(d["dk"]), bf.desc(d["dv"])
        a.dg, a.dbeta, a.d_initial_state = bf.desc(d["dg"]), bf.desc(d["dbeta"]), bf.desc(d["dh0"])
        a.cu_seqlens = bf.desc(cu)
        self.cu_host = (C.c_int64 * len(cu_host))(*cu_host)
        a.cu_seqlens_host = C.cast(self.cu_host, C.POINTER(C.c_int64))
        self.args = a
        n = C.c_size_t()
        lib.check(lib.L.fqla_bwd_workspace_size(lib.ctx, C.byref(a), C.byref(n)), "fqla_bwd_workspace_size")
        self.ws = torch.empty(max(int(n.value), 1), dtype=torch.uint8, device="cuda")
        self.ws_bytes = int(n.value)

    def __call__(self):
        s = torch.cuda.current_stream().cuda_stream
        self.lib.check(self.lib.L.fqla_bwd(self.lib.ctx, C.byref(self.args), C.c_void_p(self.ws.data_ptr()),
                                           C.c_size_t(self.ws_bytes), C.c_void_p(s)), "fqla_bwd")


def time_any(fn, flush, calls, replays):
    """(median ms per call, method): CUDA-graph replay (bench_fwd.time_graph),
    or, where the call cannot be captured, back-to-back eager calls between
    events after the same L2 flush."""
    try:
        return bf.time_graph(fn, flush, calls, replays), "graph"
    except Exception as e:  # noqa: BLE001  (capture refused: a sync or an allocation inside)
        print("    (graph capture failed: %s; timed eagerly)" % first_line(e), flush=True)
        torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        flush.zero_()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(calls):
            fn()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) / calls)
    times.sort()
    return times[len(times) // 2], "eager"


def load_anchors():
    out = {}
    with open(os.path.join(HERE, "anchors_h200.csv")) as f:
        for r in csv.DictReader(f):
            if r["op"] == "bwd":
                out[(r["model"], r["seqlens"])] = r
    return out


class FlaBwd:
    """FLA's backward alone over the saved tensors of its forward."""

    def __init__(self, q, k, v, g, beta, h0, cu, cu_host, do, dht, scale):
        from fla.ops.gated_delta_rule.chunk import chunk_gated_delta_rule_fwd, chunk_gated_delta_rule_bwd
        from fla.ops.utils.index import prepare_chunk_indices
        ci = prepare_chunk_indices(cu, 64, cu_seqlens_cpu=torch.tensor(cu_host))
        g_c, _, A, _, h0_, _ = chunk_gated_delta_rule_fwd(q, k, v, g, beta, scale, h0, True, cu_seqlens=cu,
                                                           chunk_indices=ci)
        self.fn = lambda: chunk_gated_delta_rule_bwd(q, k, v, g_c, beta, A, scale, h0_, do, dht, cu_seqlens=cu,
                                                     chunk_indices=ci)

    def grads(self):
        dq, dk, dv, db, dg, dh0 = self.fn()[:6]
        return dict(dq=dq, dk=dk, dv=dv, dg=dg, dbeta=db, dh0=dh0)


class FlashQlaBwd:
    """FlashQLA 0.1.3's backward alone over the saved tensors of its forward
    (its intra-card CP context built once, as its autograd function does)."""

    def __init__(self, q, k, v, g, beta, h0, cu, do, dht, scale):
        import flash_qla
        from flash_qla.ops.gated_delta_rule import chunk as fqc
        ctx = fqc._auto_intra_cp_context(k, v, cu, fqc.CHUNK_SIZE, True, True)
        g_c, A, _, _, _, cache = flash_qla.chunk_gated_delta_rule_fwd(
            q, k, v, g, beta, scale, h0, cu, True, enable_fwd_cp_cache=True, cp_context=ctx, is_train=True)
        self.fn = lambda: flash_qla.chunk_gated_delta_rule_bwd(q, k, v, g_c, beta, A, do, dht, scale, h0, cu,
                                                               cp_cache=cache, cp_context=ctx)

    def grads(self):
        dq, dk, dv, db, dg, dh0 = self.fn()
        return dict(dq=dq, dk=dk, dv=dv, dg=dg, dbeta=db, dh0=dh0)


def fla_setup(backend):
    """Imports FLA for its backward; returns (notes label, tilelang call counter)."""
    os.environ["FLA_FLASH_QLA"] = "0"   # read at dispatch: FLA's FlashQLA backend off
    os.environ["FLA_CACHE_RESULTS"] = "0"  # tune in this process (bench_fwd.py's --fla-tune table)
    if backend == "triton":
        os.environ["FLA_TILELANG"] = "0"
    import triton
    import fla.ops.common.chunk_o as chunk_o
    guard = ""
    if not chunk_o.TRITON_ABOVE_3_7_1:
        # FLA refuses its gated chunk_bwd_dqkwg Triton kernel on Hopper with
        # Triton 3.4 - 3.7.0 (wrong gradients there, FLA issue 640); lifted for
        # timing as FLA's tests do
        chunk_o.TRITON_ABOVE_3_7_1 = True
        guard = "-guard-lifted"
    calls = [0]
    try:
        from fla.ops.common.backends.tilelang import TileLangBackend
        real = TileLangBackend.chunk_bwd_dqkwg

        def counted(self, *a, **kw):
            calls[0] += 1
            return real(self, *a, **kw)
        TileLangBackend.chunk_bwd_dqkwg = counted
    except ImportError:
        pass
    return "triton%s" % guard + ("(triton %s)" % triton.__version__), calls


def table_rows(spec=""):
    """The anchor table's rows as (model, h_qk, h_v, seqlens); with spec
    ('model:seqlens,...') those it names, in its order."""
    rows = [(r["model"], int(r["h_qk"]), int(r["h_v"]), r["seqlens"]) for r in load_anchors().values()]
    if not spec:
        return rows
    byk = {(r[0], r[3]): r for r in rows}
    return [byk[tuple(w.split(":"))] for w in spec.split(",") if tuple(w.split(":")) in byk]


def row_inputs(hq, hv, sl, ri):
    """Row ri's inputs, as every backward benchmark makes them: the forward's
    (bench_fwd.make_inputs with this row's sequence split, seed ri), then dO
    and d_final_state (seed 1000 + ri): q, k, v, g, beta, h0, cu, cu_host, do, dht."""
    q, k, v, g, beta, h0, cu, cu_host = bf.make_inputs(hq, hv, BWD_SPLITS[sl], seed=ri)
    gen = torch.Generator(device="cuda").manual_seed(1000 + ri)
    do = torch.randn(v.shape, device="cuda", generator=gen).to(v.dtype)
    dht = (torch.randn(h0.shape, device="cuda", generator=gen) / 8).float()
    return q, k, v, g, beta, h0, cu, cu_host, do, dht


def first_line(e):
    return (str(e).splitlines() or [repr(e)])[0][:200]


def rel(x, ref):
    """bench_fwd.rel, or NaN where the shapes differ (a library returning
    another layout is reported, not a crash)."""
    if x is None or ref is None or x.shape != ref.shape:
        return float("nan")
    return bf.rel(x.float(), ref.float())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", default=os.path.join(ROOT, "build", "libflashqla.so"),
                    help="comma-separated [label=]path of shared libraries")
    ap.add_argument("--rows", default="", help="comma-separated 'model:seqlens' rows, e.g. hk16_hv32:32k_1seq")
    ap.add_argument("--models", default="", help="comma-separated head configs (default: all four)")
    ap.add_argument("--quick", action="store_true", help="four rows on two head configs: " + ",".join(QUICK_ROWS))
    ap.add_argument("--calls", type=int, default=4, help="calls per captured graph")
    ap.add_argument("--replays", type=int, default=10)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "bwd-h200.csv"))
    ap.add_argument("--no-fla", action="store_true", help="no FLA (and no advantage)")
    ap.add_argument("--no-flash-qla", action="store_true", help="skip FlashQLA's own backward even if importable")
    ap.add_argument("--fla-backend", choices=("triton", "tilelang"), default="triton",
                    help="FLA's chunk_bwd_dqkwg: its Triton kernel (guard lifted where FLA refuses it; the "
                         "default, as the published FLA) or its TileLang port (FLA's default on Hopper when "
                         "tilelang imports)")
    a = ap.parse_args()

    anchors = load_anchors()
    if a.quick and not a.rows:
        a.rows = ",".join(QUICK_ROWS)
    rows = table_rows(a.rows)
    if a.models:
        rows = [r for r in rows if r[0] in a.models.split(",")]
    first_row = {}
    for r in anchors.values():
        first_row.setdefault(r["model"], r["seqlens"])

    fla_label, tl_calls = ("", [0]) if a.no_fla else fla_setup(a.fla_backend)
    have_fq = False
    if not a.no_flash_qla:
        try:
            import flash_qla  # noqa: F401
            have_fq = True
        except Exception as e:  # noqa: BLE001  (not installed, or tilelang failing to start)
            print("FlashQLA not timed: %s" % first_line(e), flush=True)

    libs = []
    for ent in a.lib.split(","):
        label, _, path = ent.rpartition("=")
        libs.append(bf.Lib(path, label))
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
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)

    def opened(path, header):
        new = not os.path.exists(path)
        f = open(path, "a", newline="")
        w = csv.writer(f)
        if new:
            w.writerow(header)
        return f, w

    fout, w = opened(a.out, ["op", "model", "h_qk", "h_v", "seqlens", "flashqla_ms", "fla_ms", "gpu", "commit",
                             "date"])
    notes_path = os.path.splitext(a.out)[0] + "-notes.csv"
    fnotes, wn = opened(notes_path, ["model", "seqlens", "commit", "fla_backend", "fla_timing", "flash_qla_ms",
                                     "flash_qla_timing", "fqla_timing", "sanity_ref", "dq_rel", "dk_rel", "dv_rel",
                                     "dg_rel", "dbeta_rel", "dh0_rel", "sanity", "date"])

    adv, x_fla, adv_pkg = {}, {}, []
    print("%-10s %-9s %9s %9s %9s %7s %7s %7s  %s" % ("model", "seqlens", "fqla_ms", "fla_ms", "fqpkg_ms", "x_fla",
                                                    "adv_fq", "adv_pkg", "grad rel vs the sanity reference"), flush=True)
    tuned = set()
    for ri, (model, hq, hv, sl) in enumerate(rows):
        q, k, v, g, beta, h0, cu, cu_host, do, dht = row_inputs(hq, hv, sl, ri)
        scale = q.shape[-1] ** -0.5
        fla_ms, fla_how, ref, ref_name = float("nan"), "", None, ""
        if not a.no_fla:
            if model not in tuned and first_row.get(model, sl) != sl:
                # FLA autotunes per head config: on the table's first row of it, as bench_fwd.py does
                t = bf.make_inputs(hq, hv, BWD_SPLITS[first_row[model]], seed=99)
                tg = torch.Generator(device="cuda").manual_seed(99)
                FlaBwd(*t[:8], torch.randn(t[2].shape, device="cuda", generator=tg).to(t[2].dtype),
                       t[5] / 8, scale).fn()
                torch.cuda.synchronize()
                del t
                torch.cuda.empty_cache()
            tuned.add(model)
            before = tl_calls[0]
            try:
                fla = FlaBwd(q, k, v, g, beta, h0, cu, cu_host, do, dht, scale)
                ref, ref_name = {n: x.clone() for n, x in fla.grads().items() if x is not None}, "fla"
                torch.cuda.synchronize()
                fla_ms, fla_how = time_any(fla.fn, flush, a.calls, a.replays)
                del fla
            except Exception as e:  # noqa: BLE001  (FLA failing must not end the run)
                print("    FLA failed: %s" % first_line(e), flush=True)
            backend = fla_label if tl_calls[0] == before else "tilelang-dqkwg"
        pkg_ms, pkg_how = float("nan"), ""
        if have_fq:
            try:
                fq = FlashQlaBwd(q, k, v, g, beta, h0, cu, do, dht, scale)
                # FlashQLA's gradients are the sanity reference where it runs: FLA's
                # Triton dqkwg kernel, guard lifted, may be wrong on this Triton
                ref, ref_name = {n: x.clone() for n, x in fq.grads().items() if x is not None}, "flash_qla"
                torch.cuda.synchronize()
                pkg_ms, pkg_how = time_any(fq.fn, flush, a.calls, a.replays)
                del fq
            except Exception as e:  # noqa: BLE001
                print("    FlashQLA failed: %s" % first_line(e), flush=True)
        an = anchors.get((model, sl))
        for lib in (libs if ri % 2 == 0 else libs[::-1]):
            tag = lib.label
            try:
                ours = FqlaBwd(lib, q, k, v, g, beta, h0, cu, cu_host, do, dht)
                ours()
                torch.cuda.synchronize()
                errs = {n: (rel(ours.grads[n], ref[n]) if ref and n in ref else float("nan")) for n in SANITY}
                bad = [n for n, e in errs.items() if not e <= SANITY[n]] if ref else []
                ms, how = time_any(ours, flush, a.calls, a.replays)
                x = fla_ms / ms
                af = ap_ = float("nan")
                if an is not None and not math.isnan(x):
                    af = x / (float(an["fla_ms"]) / float(an["flashqla_ms"]))
                    adv.setdefault(tag, []).append(af)
                    x_fla.setdefault(tag, []).append(x)
                if not math.isnan(pkg_ms):
                    ap_ = pkg_ms / ms  # our speedup over FlashQLA measured in this process
                    adv_pkg.append(ap_)
                print("%-10s %-9s %9.4f %9.4f %9.4f %7.2f %7.2f %7.2f  %s%s %s" % (
                    model, sl, ms, fla_ms, pkg_ms, x, af, ap_,
                    " ".join("%s %.1e" % kv for kv in errs.items()),
                    "  SANITY FAILED: " + ",".join(bad) if bad else "", tag), flush=True)
                ccol = tag if tag else commit
                w.writerow(["bwd", model, hq, hv, sl, "%.4f" % ms, "%.4f" % fla_ms, gpu_tag, ccol, date])
                wn.writerow([model, sl, ccol, backend if not a.no_fla else "", fla_how,
                             "%.4f" % pkg_ms, pkg_how, how, ref_name] + ["%.2e" % errs[n] for n in
                                                               ("dq", "dk", "dv", "dg", "dbeta", "dh0")] +
                            ["failed:" + "+".join(bad) if bad else ("ok" if ref else ""), date])
                fout.flush()
                fnotes.flush()
                del ours
            except Exception as e:  # noqa: BLE001  (one failing build must not end the run)
                print("%-10s %-9s FAILED %s: %s" % (model, sl, tag, first_line(e)), flush=True)
        del q, k, v, g, beta, h0, do, dht, ref
        torch.cuda.empty_cache()
    fout.close()
    fnotes.close()
    gm = lambda xs: math.exp(sum(math.log(x) for x in xs) / len(xs))
    if adv_pkg:
        print("bwd in-process x_flash_qla: rows=%d geomean=%.2f min=%.2f" % (len(adv_pkg), gm(adv_pkg), min(adv_pkg)))
    if not adv:  # no FLA, or no row measured: no advantage
        print("bwd rows=0 of %d with an advantage (FLA not run, or no flashqla row measured)" % len(rows))
    for tag in adv:
        print("bwd rows=%d geomean_adv_flashqla=%.2f min_adv_flashqla=%.2f geomean_x_fla=%.2f %s" %
              (len(adv[tag]), gm(adv[tag]), min(adv[tag]), gm(x_fla[tag]), tag))


if __name__ == "__main__":
    main()
