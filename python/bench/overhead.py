"""Python overhead of flashqla per call, against the C call alone.

    python python/bench/overhead.py [--device cpu|cuda] [--T 1,1024] [--seconds S]

Times are per call, the least over thousands of calls (see time_calls). The C
baseline is fqla_fwd / fqla_decode through ctypes on an argument struct
packed once (what any binding must at least pay: the library's validation
and the run); each flashqla line adds the Python wrapper on top (argument
normalisation, output allocation, packing, context lookup, error check).
Heads are tiny (1 head, K = V = 16 on the CPU) so the kernel's own time is
small; the forward runs at each T of --T (issue 5's target is stated at
T = 1024), decode is one token. The calls of a group are interleaved call
by call and each is timed alone; the overhead quoted is the least wrapper
call minus the least C call (see report). Also prints the time of
`import flashqla` (after torch) and of the first call in a fresh process.
"""

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import flashqla  # noqa: E402
from flashqla import _lib, ops  # noqa: E402


def time_calls(fns, sync, seconds, min_rounds=300):
    """Per-call times of each function, in us: rounds of one call of each
    function (in rotating order, so none always follows the same one), every
    call timed alone, for about `seconds`. Wall time (perf_counter_ns): the
    least over many calls is a call nothing interrupted, where this VM's
    per-thread CPU clock now and then stalls for a whole call and reads
    too low. CUDA work is synchronised every 64 rounds outside the timed
    calls, so the launch queue never fills and blocks."""
    tt = time.perf_counter_ns
    n = len(fns)
    for fn in fns:
        for _ in range(20):
            fn()
    sync()
    out = [[] for _ in fns]
    end = time.perf_counter() + seconds
    r = 0
    while r < min_rounds or time.perf_counter() < end:
        for j in range(n):
            j = (j + r) % n
            fn = fns[j]
            t0 = tt()
            fn()
            out[j].append(tt() - t0)
        r += 1
        if r % 64 == 0:
            sync()
    sync()
    return [[x / 1e3 for x in t] for t in out]


def report(rows, fns, sync, seconds):
    """rows: names, the first one the C baseline. Prints each function's
    least and median per call and, for the wrappers, the overhead as least
    minus least (the figure to quote: on a shared machine the least is the
    call that met the least interference) and as the median of the paired
    differences within a round (inflated by load: a slowed machine
    stretches the wrapper's part too)."""
    times = time_calls(fns, sync, seconds)
    base = times[0]
    for name, t in zip(rows, times):
        line = f"  {name:56s} {min(t):7.1f} us (median {statistics.median(t):7.1f})"
        if t is not base:
            paired = statistics.median(a - b for a, b in zip(t, base))
            line += f"  +{min(t) - min(base):.1f} us (paired median +{paired:.1f})"
        print(line)
    print(f"  ({len(base)} rounds)")


def check(st, ctx, what):
    if st:
        raise _lib.error(st, ctx, what)


def fwd_group(dev, dt, T, K, V, sync, seconds):
    B, H, HV = 1, 1, 1
    q = torch.randn(B, T, H, K, device=dev, dtype=dt)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).to(dt)
    v = torch.randn(B, T, HV, V, device=dev, dtype=dt)
    g = -torch.rand(B, T, HV, device=dev)
    beta = torch.rand(B, T, HV, device=dev)
    h0 = torch.randn(B, HV, K, V, device=dev)

    # C baseline: the same forward, packed once
    be, device = ops.resolve(q, ops.AUTO)
    o = torch.empty(B, T, HV, V, device=dev, dtype=dt)
    ht = torch.empty(B, HV, K, V, device=dev)
    buf = _lib.FwdBuffer()
    _lib.FWD_PACK.pack_into(buf, 0, *ops.tv(q), *ops.tv(k), *ops.tv(v), *ops.tv(g),
                            *ops.tv(beta), *ops.tv(None), *ops.tv(None), *ops.tv(h0),
                            *ops.tv(None), 0, *ops.tv(o), *ops.tv(ht), *ops.options(0.0, 0))
    ctx = _lib.context(be, device)
    lib = _lib.lib
    size = ctypes.c_size_t()
    check(lib.fqla_fwd_workspace_size(ctx, buf, ctypes.byref(size)), ctx, "fwd_workspace_size")
    ws = torch.empty(max(size.value, 1), dtype=torch.uint8, device=dev)
    stream = torch.cuda.current_stream().cuda_stream if dev == "cuda" else None
    fsize = size.value
    wsp = ws.data_ptr() if fsize else None

    def c_fwd():
        check(lib.fqla_fwd(ctx, buf, wsp, fsize, stream), ctx, "fwd")

    def py_fwd():
        flashqla.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0,
                                        output_final_state=True)

    qg = q.clone().requires_grad_()

    def py_fwd_grad():
        flashqla.chunk_gated_delta_rule(qg, k, v, g, beta, initial_state=h0,
                                        output_final_state=True)

    def op_fwd():
        torch.ops.flashqla.fwd(q, k, v, g, beta, None, None, h0, None, None, 0.0, 0, True, -1)

    rows = [(f"C fqla_fwd, T = {T} (ctypes, args packed once)", c_fwd),
            ("flashqla.chunk_gated_delta_rule, no grad", py_fwd),
            ("flashqla.chunk_gated_delta_rule, q requires grad", py_fwd_grad),
            ("torch.ops.flashqla.fwd (dispatcher, as under compile)", op_fwd)]
    report([r for r, _ in rows], [f for _, f in rows], sync, seconds)


def decode_group(dev, dt, K, V, sync, seconds):
    B, H, HV, P = 1, 1, 1, 4
    q = torch.randn(B, 1, H, K, device=dev, dtype=dt)
    k = torch.nn.functional.normalize(torch.randn(B, 1, H, K, device=dev), dim=-1).to(dt)
    v = torch.randn(B, 1, HV, V, device=dev, dtype=dt)
    pool = torch.randn(P, HV, K, V, device=dev)
    slots = torch.tensor([1], device=dev)
    a, b = torch.randn(B, 1, HV, device=dev), torch.randn(B, 1, HV, device=dev)
    A_log, dt_bias = torch.rand(HV, device=dev), torch.randn(HV, device=dev)
    out = torch.empty(B, 1, HV, V, device=dev, dtype=dt)
    be, device = ops.resolve(q, ops.AUTO)
    ctx = _lib.context(be, device)
    lib = _lib.lib
    dbuf = _lib.DecodeBuffer()
    _lib.DEC_PACK.pack_into(dbuf, 0, *ops.tv(q), *ops.tv(k), *ops.tv(v), *ops.tv(a), *ops.tv(b),
                            *ops.tv(A_log), *ops.tv(dt_bias), *ops.tv(pool), *ops.tv(slots), 0,
                            *ops.tv(out), *ops.tv(None), *ops.tv(None),
                            *ops.options(0.0, ops.L2NORM | ops.GATE_IN_KERNEL | ops.BETA_SIGMOID))
    size = ctypes.c_size_t()
    check(lib.fqla_decode_workspace_size(ctx, dbuf, ctypes.byref(size)), ctx, "decode_workspace_size")
    dws = torch.empty(max(size.value, 1), dtype=torch.uint8, device=dev)
    dsize = size.value
    dwsp = dws.data_ptr() if dsize else None
    stream = torch.cuda.current_stream().cuda_stream if dev == "cuda" else None

    def c_decode():
        check(lib.fqla_decode(ctx, dbuf, dwsp, dsize, stream), ctx, "decode")

    def py_decode():
        flashqla.decode(q, k, v, a, b, A_log, dt_bias, pool, slots, out=out)

    def py_decode_alloc():
        flashqla.decode(q, k, v, a, b, A_log, dt_bias, pool, slots)

    rows = [("C fqla_decode (ctypes, args packed once)", c_decode),
            ("flashqla.decode (out= given)", py_decode),
            ("flashqla.decode (output allocated)", py_decode_alloc)]
    report([r for r, _ in rows], [f for _, f in rows], sync, seconds)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--T", default="1,1024", help="forward lengths, comma-separated")
    ap.add_argument("--seconds", type=float, default=5.0, help="timing per group of calls")
    args = ap.parse_args()
    dev = args.device
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    if dev == "cpu":
        flashqla.set_cpu_threads(1)   # no thread wake-ups in the numbers
    K = V = 128 if dev == "cuda" else 16
    print(f"device {dev}, torch {torch.__version__}, python {sys.version.split()[0]}, "
          f"load average {os.getloadavg()[0]:.1f}")
    for T in (int(t) for t in args.T.split(",")):
        fwd_group(dev, dt, T, K, V, sync, args.seconds)
    decode_group(dev, dt, K, V, sync, args.seconds)

    code = ("import time, torch; t0 = time.perf_counter(); import flashqla; t1 = time.perf_counter(); "
            f"d = '{dev}'; x = torch.randn(1, 1, 1, {K}, device=d, dtype=torch.{str(dt).split('.')[1]}); "
            "g = -torch.rand(1, 1, 1, device=d); "
            "flashqla.chunk_gated_delta_rule(x, x, x, g, g.neg()); "
            + ("torch.cuda.synchronize(); " if dev == "cuda" else "")
            + "t2 = time.perf_counter(); print(f'{(t1 - t0) * 1e3:.1f} {(t2 - t1) * 1e3:.1f}')")
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    times = [subprocess.check_output([sys.executable, "-c", code], env=env, text=True).split()
             for _ in range(3)]
    imp = statistics.median(float(t[0]) for t in times)
    first = statistics.median(float(t[1]) for t in times)
    print(f"  import flashqla (torch already imported)                   {imp:7.1f} ms")
    print(f"  first call after import                                    {first:7.1f} ms")


if __name__ == "__main__":
    main()
