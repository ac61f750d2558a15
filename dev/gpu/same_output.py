"""same_output.py - are two builds' forward outputs bit-identical on a
benchmark row's inputs? For kernel changes that should move data, not
arithmetic (a new shared-memory layout, a new schedule).

    python3 dev/gpu/same_output.py LIB_A LIB_B HQ HV SEQLENS [HQ HV SEQLENS ...]

Prints one line per row (o and the final state: identical, or the largest
difference) and exits 1 if any row differs or holds a NaN (the outputs start
as NaN, so an element neither build wrote is not taken as identical).
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import bench_fwd as B  # noqa: E402


def run(lib, inputs):
    q, k, v, g, beta, h0, cu, cu_host = inputs
    o = torch.full_like(v, float("nan"))
    ht = torch.full_like(h0, float("nan"))
    B.FqlaFwd(lib, q, k, v, g, beta, h0, cu, cu_host, o, ht)()
    torch.cuda.synchronize()
    return o, ht


def main():
    a, b, rows = B.Lib(sys.argv[1]), B.Lib(sys.argv[2]), sys.argv[3:]
    if not rows or len(rows) % 3:
        sys.exit(__doc__)
    bad = 0
    for i in range(0, len(rows), 3):
        hq, hv, label = int(rows[i]), int(rows[i + 1]), rows[i + 2]
        inputs = B.make_inputs(hq, hv, B.parse_seqlens(label))
        (oa, ha), (ob, hb) = run(a, inputs), run(b, inputs)
        same = [torch.equal(x.view(torch.int16 if x.dtype != torch.float32 else torch.int32),
                            y.view(torch.int16 if y.dtype != torch.float32 else torch.int32))
                for x, y in ((oa, ob), (ha, hb))]
        diff = [(x.float() - y.float()).abs().max().item() for x, y in ((oa, ob), (ha, hb))]
        print("same_output: HQ=%d HV=%d %s: o %s, state %s" % (
            hq, hv, label, "identical" if same[0] else "max diff %.3g" % diff[0],
            "identical" if same[1] else "max diff %.3g" % diff[1]))
        unwritten = any(torch.isnan(x.float()).any().item() for x in (oa, ha, ob, hb))
        if unwritten:
            print("same_output: HQ=%d HV=%d %s: NaN in an output (unwritten or non-finite)" % (hq, hv, label))
        bad += not all(same) or unwritten
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
