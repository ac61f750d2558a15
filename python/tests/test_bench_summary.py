"""bench/summarize.py on a small results file: the anchor rows' advantages and
the rows without anchors (other head dims, the in-kernel l2norm, other io
dtypes) grouped by their label's tail. CPU only: it reads CSV files."""

import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SUMMARIZE = os.path.join(ROOT, "bench", "summarize.py")

HEADER = "op,model,h_qk,h_v,seqlens,flashqla_ms,fla_ms,gpu,commit,date\n"


def summarize(tmp_path, rows, *args):
    path = tmp_path / "results.csv"
    path.write_text(HEADER + "".join("fwd,%s,h200,c1,2026-12-01\n" % r for r in rows))
    out = subprocess.run([sys.executable, SUMMARIZE, str(path), *args], capture_output=True, text=True, check=True)
    return out.stdout


def test_anchor_row_advantages(tmp_path):
    # bench/anchors_h200.csv: Sym h32 8192x4 fla 1.952, FlashQLA 0.629, FlashInfer 0.442
    out = summarize(tmp_path, ["Sym h32,32,32,8192x4,0.5,2.0"], "--rows")
    x = 2.0 / 0.5
    adv_fq, adv_fi = x / (1.952 / 0.629), x / (1.952 / 0.442)
    want = "x_fla %.2f adv_fq %.2f adv_best %.2f" % (x, adv_fq, min(adv_fq, adv_fi))
    assert want in out, out
    assert "uniform  rows   1" in out and "rows>=1 0" in out, out


def test_rows_without_anchors_grouped_by_label(tmp_path):
    out = summarize(tmp_path, [
        "Sym h32 fp32,32,32,8192x4,10.0,5.0",
        "2B/0.8B TP1 fp32,16,16,1024x8,2.0,0.5",
        "397B/122B TP8 K256 V512 l2norm fp32,2,8,8192x4,1.0,3.0",
        "Sym h32 K64,32,32,8192x4,0.25,1.0",
        "Sym h32 l2norm,32,32,8192x4,0.5,2.0",
        "Sym h32 fp32,32,32,4096x8,1.0,nan",  # no FLA time: not summarised
    ])
    lines = {tuple(line.split()[1:-6]): line for line in out.splitlines()}
    assert "x_fla 0.35  min 0.25" in lines[("fp32",)], out  # geomean of 0.5 and 0.25
    assert "rows   2" in lines[("fp32",)], out
    assert "x_fla 3.00" in lines[("K256", "V512", "l2norm", "fp32")], out
    assert "x_fla 4.00" in lines[("K64",)], out
    assert "x_fla 4.00" in lines[("l2norm",)], out
