"""Python overhead of flashqla per call, against the C call alone.

    python python/bench/overhead.py [--device cpu|cuda] [--iters N]

Times are CPU time of the calling thread per call (see per_call_us). The C
baseline is fqla_fwd / fqla_decode through ctypes on an argument
struct packed once (what any binding must at least pay: the library's
validation and the run); each flashqla line adds the Python wrapper on top
(argument normalisation, output allocation, packing, context lookup, error
check). The shape is tiny (1 token, 1 head, K = V = 16) so the kernel's own
time is small and the difference is the overhead. Also prints the time of
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


def per_call_us(fn, iters, sync, repeats=7):
    """Per-call CPU time of this thread (time.thread_time: time other
    processes take on a shared machine is not counted), the least of
    `repeats` runs. CUDA work is synchronised every 64 calls, so the launch
    queue never fills and blocks."""
    for _ in range(max(10, iters // 20)):
        fn()
    sync()
    runs = []
    for _ in range(repeats):
        t0 = time.thread_time()
        for i in range(iters):
            fn()
            if i % 64 == 63:
                sync()
        sync()
        runs.append((time.thread_time() - t0) / iters * 1e6)
    return min(runs)


def check(st, ctx, what):
    if st:
        raise _lib.error(st, ctx, what)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--iters", type=int, default=2000)
    args = ap.parse_args()
    dev = args.device
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    dt = torch.bfloat16 if dev == "cuda" else torch.float32
    if dev == "cpu":
        flashqla.set_cpu_threads(1)   # no thread wake-ups in the numbers

    B, T, H, HV, K, V = 1, 1, 1, 1, 16, 16
    if dev == "cuda":
        K = V = 128
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

    P = 4
    pool = torch.randn(P, HV, K, V, device=dev)
    slots = torch.tensor([1], device=dev)
    a, b = torch.randn(B, 1, HV, device=dev), torch.randn(B, 1, HV, device=dev)
    A_log, dt_bias = torch.rand(HV, device=dev), torch.randn(HV, device=dev)
    out = torch.empty(B, 1, HV, V, device=dev, dtype=dt)
    dbuf = _lib.DecodeBuffer()
    _lib.DEC_PACK.pack_into(dbuf, 0, *ops.tv(q), *ops.tv(k), *ops.tv(v), *ops.tv(a), *ops.tv(b),
                            *ops.tv(A_log), *ops.tv(dt_bias), *ops.tv(pool), *ops.tv(slots), 0,
                            *ops.tv(out), *ops.tv(None), *ops.tv(None),
                            *ops.options(0.0, ops.L2NORM | ops.GATE_IN_KERNEL | ops.BETA_SIGMOID))
    check(lib.fqla_decode_workspace_size(ctx, dbuf, ctypes.byref(size)), ctx, "decode_workspace_size")
    dws = torch.empty(max(size.value, 1), dtype=torch.uint8, device=dev)
    dsize = size.value
    dwsp = dws.data_ptr() if dsize else None

    def c_decode():
        check(lib.fqla_decode(ctx, dbuf, dwsp, dsize, stream), ctx, "decode")

    def py_decode():
        flashqla.decode(q, k, v, a, b, A_log, dt_bias, pool, slots, out=out)

    rows = []
    for name, fn in (("C fqla_fwd (ctypes, args packed once)", c_fwd),
                     ("flashqla.chunk_gated_delta_rule, no grad", py_fwd),
                     ("flashqla.chunk_gated_delta_rule, q requires grad", py_fwd_grad),
                     ("torch.ops.flashqla.fwd (dispatcher, as under compile)", op_fwd),
                     ("C fqla_decode (ctypes, args packed once)", c_decode),
                     ("flashqla.decode (out= given)", py_decode)):
        t = per_call_us(fn, args.iters, sync)
        rows.append((name, t))
    base_f, base_d = rows[0][1], rows[4][1]
    print(f"device {dev}, torch {torch.__version__}, python {sys.version.split()[0]}")
    for name, t in rows:
        base = base_d if "decode" in name else base_f
        extra = "" if name.startswith("C ") else f"   (+{t - base:.1f} us)"
        print(f"  {name:58s} {t:7.1f} us{extra}")

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
