"""dev/models/bwd_cp_fit.py transcribes the backward chains' CP plan
(src/cuda/cp_plan.h): with the constants cp_plan.h holds, its step model must
choose the segment length the C plan chooses on every bench row, so that a fit
to a new sweep carries over to the library. CPU only: the C side is a small
program compiled against cp_plan.h."""

import importlib.util
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
spec = importlib.util.spec_from_file_location("bwd_cp_fit", os.path.join(ROOT, "dev", "models", "bwd_cp_fit.py"))
fit = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fit)

PROGRAM = r"""
#include <stdio.h>
#include <stdint.h>
#include "cuda/cp_plan.h"
int main(int argc, char **argv)
{
    /* argv: HV then the sequence lengths */
    int64_t HV = 0, cu[64] = {0}, N = 0;
    sscanf(argv[1], "%lld", (long long *)&HV);
    for (int i = 2; i < argc && N < 63; i++, N++) {
        long long len;
        sscanf(argv[i], "%lld", &len);
        cu[N + 1] = cu[N] + len;
    }
    const int64_t L = N == 1 ? fqla_cp_bwd_seg_chunks(1, cu[1], HV, 128, 128, 2, 132)
                             : fqla_cp_bwd_seg_chunks_cu(cu, N, HV, 128, 128, 2, 132);
    printf("%lld %d %d %g\n", (long long)L, FQLA_CP_BWD_WAVE_STEPS, FQLA_CP_BWD_SCAN_STEPS,
           (double)FQLA_CP_BWD_PRE_WEIGHT);
    return 0;
}
"""


def ladder():
    text = open(os.path.join(ROOT, "src", "cuda", "cp_plan.h")).read()
    body = re.search(r"const int64_t l\[FQLA_CP_BWD_NLADDER\] = \{([^}]*)\}", text).group(1)
    return [int(x) for x in body.replace("\n", " ").split(",")]


@pytest.fixture(scope="module")
def plan_program(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    d = tmp_path_factory.mktemp("cp_plan")
    src, exe = d / "plan.c", d / "plan"
    src.write_text(PROGRAM)
    subprocess.run([cc, "-std=c99", "-O1", "-I" + os.path.join(ROOT, "src"), str(src), "-o", str(exe)], check=True)
    return str(exe)


@pytest.mark.parametrize("model", sorted(fit.HV))
@pytest.mark.parametrize("split", sorted(fit.BWD_SPLITS))
def test_the_model_chooses_as_the_c_plan(plan_program, model, split):
    lens, hv = fit.BWD_SPLITS[split], fit.HV[model]
    out = subprocess.run([plan_program, str(hv)] + [str(n) for n in lens], check=True, capture_output=True,
                         text=True).stdout.split()
    c_choice, params = int(out[0]), (float(out[1]), float(out[2]), float(out[3]))
    chunks = (max(lens) + 63) // 64
    cands = [0] + [L for L in ladder() if L < chunks and (chunks + L - 1) // L <= 256] if chunks >= 8 else [0]
    py_choice = min(cands, key=lambda L: fit.steps(L, lens, hv, *params))
    assert py_choice == c_choice, "%s %s: the model %d, cp_plan.h %d" % (model, split, py_choice, c_choice)
