"""one_fwd.py - one flashqla forward call on a benchmark row's inputs, with a
kernel variant: the command for dev/gpu/ncu_prep.sh's NCU_CMD (ncu then
profiles this call's kernels, not a correctness check's shorter input).

    python3 dev/gpu/one_fwd.py LIB HQ HV SEQLENS [PREP_VARIANT]

e.g. python3 dev/gpu/one_fwd.py .fwdbin/libflashqla.so 32 32 8192x4 4
"""
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
import bench_fwd as B  # noqa: E402

lib_path, hq, hv, label = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
variant = int(sys.argv[5]) if len(sys.argv) > 5 else 0
lib = B.Lib(lib_path)
if lib.tune is not None:
    lib.tune(variant, -1)
q, k, v, g, beta, h0, cu, cu_host = B.make_inputs(hq, hv, B.parse_seqlens(label))
o = torch.empty_like(v)
ht = torch.empty_like(h0)
B.FqlaFwd(lib, q, k, v, g, beta, h0, cu, cu_host, o, ht)()
torch.cuda.synchronize()
print("one_fwd: %s H=%d HV=%d prep variant %d: done" % (label, hq, hv, variant))
