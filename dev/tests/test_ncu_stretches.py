"""dev/gpu/ncu_stretches.py on a small ncu source page: stretches end at CTA
barriers, EXIT and MEMBAR (not at DEPBAR), samples and instructions are summed
per stretch, and code that neither ran nor was sampled is left out. CPU only:
it reads a CSV file in the layout ncu_prep.sh writes."""

import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
TOOL = os.path.join(ROOT, "dev", "gpu", "ncu_stretches.py")

HEAD = ('"Kernel Name","void k<(int)128>(params)",\n'
        '"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)",'
        '"# Samples","Instructions Executed"\n')


def page(tmp_path, rows):
    path = tmp_path / "ncu_sass.csv"
    path.write_text(HEAD + "".join('"0x%x","      %s","%s","0","0","%s"\n' % (0x7f0000 + 16 * i, src, s, e)
                                   for i, (src, s, e) in enumerate(rows)))
    out = subprocess.run([sys.executable, TOOL, str(path)], capture_output=True, text=True, check=True)
    return [l.split() for l in out.stdout.splitlines()[3:]], out.stdout


def test_stretches_end_at_barriers(tmp_path):
    stretches, out = page(tmp_path, [
        ("S2R R0, SR_TID.X", "10", "8"),
        ("WARPGROUP.DEPBAR.LE gsb0, 0x0", "5", "8"),  # not a stretch end
        ("BAR.SYNC.DEFER_BLOCKING 0x0", "15", "8"),
        ("LDS R1, [R0]", "1,200", "1,024"),  # ncu's thousands separators
        ("BAR.RED.OR.DEFER_BLOCKING 0x0, P0", "0", "8"),
        ("FFMA R1, R1, R1, R1", "20", "16"),
        ("EXIT", "0", "8"),
        ("NOP", "0", "0"),  # padding: left out
    ])
    assert "samples 1250, warp instructions 1080" in out, out
    assert len(stretches) == 3, out
    # first stretch: three instructions up to the barrier
    assert stretches[0][:2] == ["0-", "20"] and "BAR.SYNC.DEFER_BLOCKING" in stretches[0], out
    first = " ".join(stretches[0])
    assert "samples 30 ( 2.4 %)" in first and "instructions 24" in first, out
    second = " ".join(stretches[1])
    assert "BAR.RED.OR" in second and "samples 1200 ( 96.0 %)" in second and "instructions 1032" in second, out
    third = " ".join(stretches[2])
    assert "EXIT" in third and "samples 20" in third and "instructions 24" in third, out


def test_not_a_source_page(tmp_path):
    path = tmp_path / "other.csv"
    path.write_text('"ID","Metric Name"\n"0","Duration"\n')
    out = subprocess.run([sys.executable, TOOL, str(path)], capture_output=True, text=True)
    assert out.returncode != 0 and "not an ncu source page" in out.stderr, out
